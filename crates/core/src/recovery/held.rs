//! Restores this process made whose audit lines the trail refused (the state directory
//! full, the trail held past the wait). Their workflow's next use, or the next start,
//! records them from their marks; this process also records them before any other
//! change it makes, in the order they were made, so that the trail's lines of a file
//! follow what the file went through.
//!
//! A run whose restore's audit line could not be appended marks its record
//! `restores_unaudited`: the next run or start audits those restores from their marks and
//! touches nothing else. The process that made such restores keeps their runs and rollbacks
//! in memory, oldest first (`HeldRestores`; a start that could not record a dead run's
//! restores adds its record there too). Before any change (a run, a rollback, each action's
//! target locks, and again once those are held if more were held back meanwhile) it records
//! their marked restores, one thread at a time (the others wait their turn,
//! `timed_lock::Gate`, no longer than a lock's wait), in one append ordered by the times
//! the marks record, under their workflows' locks, up to the first workflow whose lock is
//! taken; then it marks those records finished (kept when a mark could not be read). A
//! change is refused while the trail will not take them, so no line of this process
//! overtakes them. A run undoing itself is the exception: its undo goes on, its own lines
//! held back after them. A start takes dead records in the same order: by the time on the
//! earliest mark of their unrecorded restores, else by their execution ids' time.

use super::{RESTORES_UNAUDITED, ROLLING_BACK};
use crate::audit::AuditRecord;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::Sandbox;
use std::collections::HashSet;

/// The runs and rollbacks of this process whose restores the trail refused, oldest first.
#[derive(Debug, Default)]
pub(crate) struct HeldRestores {
    /// Each, in the order its restores were first held back (a run's undo may come
    /// after a later run's: its id, the run's start, says nothing of that).
    held: Vec<Held>,
    /// How many were ever added: a change that took its locks learns whether one came
    /// meanwhile.
    added: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    workflow_id: String,
    execution_id: String,
    /// How many of its restores wait.
    restores: usize,
    /// A dead run or rollback whose restores' lines this process's start could not
    /// write: all the workflow's marked restores are recorded, whatever made them, and a
    /// dead rollback's record (or one whose restores alone were unaudited) is settled as
    /// recovery does; a dead run's stays for its recovery to finish.
    kept: bool,
}

impl HeldRestores {
    /// Execution `execution_id` of `workflow_id` made `restores` restores the trail
    /// refused.
    pub(crate) fn add(&mut self, workflow_id: &str, execution_id: &str, restores: usize) {
        match self
            .held
            .iter_mut()
            .find(|h| h.workflow_id == workflow_id && h.execution_id == execution_id)
        {
            Some(h) => h.restores += restores,
            None => self.held.push(Held {
                workflow_id: workflow_id.to_owned(),
                execution_id: execution_id.to_owned(),
                restores,
                kept: false,
            }),
        }
        self.added += 1;
    }

    /// The start kept the record of `execution_id` of `workflow_id`, a dead run or
    /// rollback, because the trail refused its restores' lines.
    pub(crate) fn add_kept(&mut self, workflow_id: &str, execution_id: &str) {
        self.held.push(Held {
            workflow_id: workflow_id.to_owned(),
            execution_id: execution_id.to_owned(),
            // At least the one the start could not record: none found means its
            // snapshot folder is away, and the record stays.
            restores: 1,
            kept: true,
        });
        self.added += 1;
    }

    /// Whether restores of `execution_id`, a run or rollback of this process, wait to be
    /// recorded.
    pub(crate) fn holds(&self, execution_id: &str) -> bool {
        self.held
            .iter()
            .any(|h| !h.kept && h.execution_id == execution_id)
    }

    /// The workflow's restores are on the trail.
    pub(crate) fn forget(&mut self, workflow_id: &str) {
        self.held.retain(|h| h.workflow_id != workflow_id);
    }
}

impl Sandbox {
    pub(crate) fn held_restores(&self) -> std::sync::MutexGuard<'_, HeldRestores> {
        self.held_restores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many runs or rollbacks of this process have had restores held back so far.
    pub(crate) fn held_restores_added(&self) -> u64 {
        self.held_restores().added
    }

    /// Records the restores this process made and the trail refused, oldest first, before
    /// a change by `own` (whose lock the caller holds), and marks the records of the runs
    /// and rollbacks that made them finished, as they would have been. Stops at the first
    /// held by a workflow whose lock is taken: its holder is its next use, which records
    /// them first, or the run that made them, finishing; later ones wait for it. Refused
    /// when the trail will not take them now: the change would be recorded before them.
    pub(crate) fn record_held_restores(&self, own: &str) -> Verdict {
        if self.held_restores().held.is_empty() {
            return Ok(());
        }
        // One at a time: a change must not pass restores another thread is recording
        // (their workflows' locks, which that thread holds, would make it skip them).
        // Waited for as a lock is: threads in line would otherwise each wait out the
        // trail's refusal in turn, the last many times the wait.
        let Some(_turn) = self.recording_held.enter(self.state.lock_wait()) else {
            return self.held_turn_not_come();
        };
        let held = self.held_restores().held.clone();
        let mut locks = Vec::new();
        let mut workflows: Vec<&str> = Vec::new();
        let mut reached = 0;
        for h in &held {
            let wf = h.workflow_id.as_str();
            if !workflows.contains(&wf) {
                if wf != own {
                    match self.state.try_lock_workflow(wf) {
                        Ok(Some(lock)) => locks.push(lock),
                        _ => break,
                    }
                }
                workflows.push(wf);
            }
            reached += 1;
        }
        let recorded = &held[..reached];
        let executions: HashSet<&str> = recorded.iter().map(|h| h.execution_id.as_str()).collect();
        let kept: HashSet<&str> = recorded
            .iter()
            .filter(|h| h.kept)
            .map(|h| h.workflow_id.as_str())
            .collect();
        let mut records = Vec::new();
        for wf in &workflows {
            match self.marked_unrecorded(wf) {
                Ok(found) => records.extend(found.into_iter().filter(|(_, r)| {
                    kept.contains(r.workflow_id.as_str())
                        || executions.contains(r.execution_id.as_str())
                })),
                // The trail could not be read (held, say): this change would pass them.
                Err(e) => return Err(self.held_restores_refusal(&workflows, &e)),
            }
        }
        // In the order the restores were made, as their marks' times say (stable: ties
        // keep each workflow's order).
        records.sort_by(|a, b| a.0.cmp(&b.0));
        let found = |h: &Held| {
            records
                .iter()
                .filter(|(_, r)| {
                    if h.kept {
                        r.workflow_id == h.workflow_id
                    } else {
                        r.execution_id == h.execution_id
                    }
                })
                .count()
        };
        let complete: Vec<bool> = recorded.iter().map(|h| found(h) >= h.restores).collect();
        let records: Vec<AuditRecord> = records.into_iter().map(|(_, r)| r).collect();
        if !records.is_empty()
            && let Err(e) = self
                .failpoints
                .check("record_held")
                .and_then(|()| self.audit.append(records))
        {
            return Err(self.held_restores_refusal(&workflows, &e));
        }
        for (h, complete) in recorded.iter().zip(complete) {
            if !complete {
                // A mark that could not be read (its snapshot folder moved away, say):
                // the record stays for the next start, or the workflow's next use, which
                // records it if the folder is back by then (one still away is given up).
                tracing::warn!(workflow = %h.workflow_id, execution = %h.execution_id, "some restores the audit trail refused have no readable mark; the run's record is kept for the next start");
                continue;
            }
            self.finish_recorded(h);
        }
        self.held_restores().held.retain(|h| !recorded.contains(h));
        Ok(())
    }

    /// After a whole wait for the turn to record held restores: fine if the thread whose
    /// turn it was recorded them all meanwhile, refused otherwise.
    fn held_turn_not_come(&self) -> Verdict {
        let held = self.held_restores().held.clone();
        let mut workflows: Vec<&str> = Vec::new();
        for h in &held {
            if !workflows.contains(&h.workflow_id.as_str()) {
                workflows.push(&h.workflow_id);
            }
        }
        if workflows.is_empty() {
            return Ok(());
        }
        Err(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{}: another thread of this process was recording them for longer than limits.lock_wait_seconds; nothing was done: try again later",
                held_whose(&workflows)
            ),
        ))
    }

    /// Leaves the run record of `h`, whose restores are on the trail now, as the run or
    /// rollback would have left it had the trail taken its lines; one a later run took
    /// over, or left under way for recovery, stays as it is.
    fn finish_recorded(&self, h: &Held) {
        let Some(rec) = self.run_record(&h.workflow_id).filter(|r| {
            r.execution_id == h.execution_id
                && matches!(r.state.as_str(), ROLLING_BACK | RESTORES_UNAUDITED)
        }) else {
            return;
        };
        if !h.kept {
            self.run_finished(rec, None);
            return;
        }
        // What recovery appended is durable before its record says no more recovery is
        // needed, as at start.
        match self.conclude_sync() {
            Ok(()) => {
                self.write_recovered_record(&rec);
            }
            Err(r) => {
                tracing::warn!(reason = %r.reason, "could not sync the restores recorded for a dead run; its record is kept for the next start");
            }
        }
    }

    fn held_restores_refusal(&self, workflows: &[&str], e: &std::io::Error) -> Refusal {
        let whose = held_whose(workflows);
        if crate::confine::state::LockBusy::is_cause_of(e) {
            Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "{whose}: another process held the trail ({e}); nothing was done: try again later, or raise limits.lock_wait_seconds"
                ),
            )
        } else {
            Refusal::new(
                ReasonCode::IoError,
                format!(
                    "{whose}: {}; nothing was done: try again once the state directory takes writes",
                    crate::error::state_io_words(e)
                ),
            )
        }
    }
}

/// Whose held restores keep a change back.
fn held_whose(workflows: &[&str]) -> String {
    format!(
        "restores made by {} {} could not be recorded on the audit trail first",
        if workflows.len() == 1 {
            "workflow"
        } else {
            "workflows"
        },
        workflows.join(", ")
    )
}
