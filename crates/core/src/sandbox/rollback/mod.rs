//! Rollback (SPEC §7): the reports, and the entry points — a rollback, its preview
//! (`rollback_info`), its simulation, the record a rollback keeps while it restores.
//! `select` chooses what a rollback restores and refuses what it cannot; `restore` puts
//! each chosen snapshot back; `beneath` records the steps undone beneath older restores.
//!
//! A rollback restores newest first, in the order the audit trail recorded the writes: ids
//! follow each process's clock, which may have been set back between runs.

use super::conflicts::Conflict;
use super::locks::workflow_lock_refusal;
use super::{RootedSnapshots, Sandbox, workflow_folder};
use crate::audit::{AuditRecord, AuditStatus};
use crate::catalog::MutationClass;
use crate::confine::path::shown_path;
use crate::confine::state::LockBusy;
use crate::context::DryRunReason;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::snapshot::{SnapshotMeta, StoredSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

mod beneath;
mod restore;
mod select;

use beneath::{Beneath, split_beneath};
pub(crate) use restore::{RestoreMode, Restorer};
use select::{Selection, conflicts_said, pruned_left, untrusted_refusal};

/// Why a rollback is refused before it starts: the code, the sentence, the conflicts.
type RollbackRefusal = (ReasonCode, String, Vec<Conflict>);

wire_enum! {
    /// What became of a rollback, as its report's `status` says it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RollbackStatus {
        /// Every step asked for was restored (and recorded).
        RolledBack = "rolled_back",
        /// Writing off or dry-run on: it said what it would restore, and restored nothing.
        Simulated = "simulated",
        /// Refused before it started: nothing was restored.
        Refused = "refused",
        /// It started, and a step failed, or the trail could not record the steps.
        Failed = "failed",
    }
}

/// Compared with its name, as the faces print it.
impl PartialEq<&str> for RollbackStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackReport {
    /// The workflow.
    pub workflow_id: String,
    /// What became of it.
    pub status: RollbackStatus,
    /// How many actions were restored.
    pub steps_rolled_back: u64,
    /// Why it was refused or failed.
    pub reason_code: Option<ReasonCode>,
    /// Why, for people.
    pub reason: Option<String>,
    /// Files changed since the workflow wrote them.
    pub conflicts: Vec<Conflict>,
    /// Each restore.
    pub steps: Vec<RollbackStep>,
}

impl RollbackReport {
    /// Whether everything asked for was restored.
    pub fn is_success(&self) -> bool {
        self.status == RollbackStatus::RolledBack
    }

    /// Whether it only said what it would restore (writes off or dry-run on).
    pub fn is_simulated(&self) -> bool {
        self.status == RollbackStatus::Simulated
    }

    /// What a forced rollback overwrote: the files and directories its conflicts name
    /// that held something else, each once, in order, but for a directory its step left
    /// in place (it holds what is not the workflow's, which force never removes).
    pub fn overwritten_paths(&self) -> Vec<&str> {
        self.forced_paths(false)
    }

    /// What a forced rollback found removed since the workflow wrote it (nothing there
    /// to overwrite: a file the workflow made stays gone, one it replaced is put back).
    pub fn found_removed_paths(&self) -> Vec<&str> {
        self.forced_paths(true)
    }

    fn forced_paths(&self, removed: bool) -> Vec<&str> {
        let mut paths: Vec<&str> = Vec::new();
        for c in &self.conflicts {
            let left = self.steps.iter().any(|s| {
                s.path == c.path
                    && s.detail
                        .as_deref()
                        .is_some_and(|d| d.starts_with(crate::snapshot::LEFT_IN_PLACE))
            });
            // With `found_by_action`, the checksum is what a later action of the
            // workflow found, not what stands there now.
            let gone = c.current_checksum.is_none() && c.found_by_action.is_none();
            if !left && gone == removed && !paths.contains(&c.path.as_str()) {
                paths.push(&c.path);
            }
        }
        paths
    }
}

/// How a rollback step's record says the audit trail was held by another process past
/// `limits.lock_wait_seconds`.
const HELD_TRAIL: &str = "another process held the audit trail";

/// One restore of a rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackStep {
    /// The action undone.
    pub action_id: String,
    /// Its intent.
    pub intent: String,
    /// The target (absolute, inside a root).
    pub path: String,
    /// Whether it was restored.
    pub restored: bool,
    /// Whether the result matches the snapshot.
    pub checksum_validated: bool,
    /// SHA-256 after the restore.
    pub restored_checksum: Option<String>,
    /// What became of a target no checksum describes: removed, or a directory left in
    /// place or made again, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Why it failed.
    pub reason_code: Option<ReasonCode>,
    /// Why, for people.
    pub reason: Option<String>,
    /// Why its audit line could not be written, if it could not.
    #[serde(skip)]
    pub unrecorded: Option<String>,
    /// Why the rollback's last sync failed, if it did: restored and recorded, neither
    /// durable.
    #[serde(skip)]
    pub unsynced: Option<String>,
}

impl RollbackStep {
    /// Whether the step failed after its restore was made (the target holds what the
    /// undo leaves; what came after, such as the root's sync, failed): its reason
    /// begins [`crate::snapshot::PUT_BACK_UNCONFIRMED`], and a rollback run again
    /// finishes it.
    pub fn is_unconfirmed(&self) -> bool {
        !self.restored
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(crate::snapshot::PUT_BACK_UNCONFIRMED))
    }

    /// A step that restored nothing, and why.
    pub(crate) fn failed(meta: &SnapshotMeta, path: String, r: Refusal) -> Self {
        Self {
            action_id: meta.action_id.clone(),
            intent: meta.intent.clone(),
            path,
            restored: false,
            checksum_validated: false,
            restored_checksum: None,
            detail: None,
            reason_code: Some(r.reason_code),
            reason: Some(r.reason),
            unrecorded: None,
            unsynced: None,
        }
    }
}

/// What can be rolled back (`GET /agentic/rollback/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackInfo {
    /// The workflow.
    pub workflow_id: String,
    /// Whether a rollback would have something to do, and would not be refused before
    /// it starts (conflicts aside: those a forced rollback overrides).
    pub rollback_available: bool,
    /// Why a rollback would be refused before it starts (the code `POST` answers with).
    pub reason_code: Option<ReasonCode>,
    /// The same, for a person; without a code, what a rollback would leave as it is
    /// (writes whose snapshots were pruned).
    pub reason: Option<String>,
    /// Snapshots, newest first.
    pub actions: Vec<RollbackInfoAction>,
    /// Conflicts a rollback would meet now.
    pub conflicts: Vec<Conflict>,
}

/// One snapshot in [`RollbackInfo`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackInfoAction {
    /// The action.
    pub action_id: String,
    /// Its intent.
    pub intent: String,
    /// The target.
    pub path: String,
    /// Whether it existed before.
    pub existed: bool,
    /// The snapshot folder, relative to its root.
    pub rollback_path: String,
    /// When taken.
    pub taken_at: String,
    /// Whether already restored.
    pub restored: bool,
}

/// Options of [`Sandbox::rollback_workflow`].
#[derive(Debug, Clone, Default)]
pub struct RollbackOptions {
    /// Only this action.
    pub action_id: Option<String>,
    /// Restore even over later changes.
    pub force: bool,
}

impl RollbackOptions {
    /// Whether the rollback asked for takes in `action`'s writes.
    fn takes(&self, action: &str) -> bool {
        self.action_id.as_deref().is_none_or(|a| a == action)
    }
}

impl Sandbox {
    /// What a rollback of the workflow would restore, and the conflicts it would meet.
    pub fn rollback_info(&self, workflow_id: &str) -> Verdict<RollbackInfo> {
        crate::plan::check_id("workflow_id", workflow_id)?;
        // A trail another process holds says nothing of the rollback: the answer is that
        // it is busy (`conflict`, to ask again), not a document saying none is available.
        // (Catching up with the log is the read that waits; nothing is copied out.)
        if let Err(e) = self.audit.last_seq()
            && LockBusy::is_cause_of(&e)
        {
            return Err(crate::error::log_refusal("read the audit trail", &e));
        }
        // A run of the workflow that died is recovered first, as a rollback would do
        // (it may undo some of what is listed below): otherwise the answer would list
        // its unfinished actions as a rollback's, which the rollback then finds undone.
        // Not waited for: a run or rollback under way holds the lock, and is no dead run.
        // Not tried by a process that writes nothing more (a sync failed), as a rollback
        // would not; a recovery that cannot be done is the answer's refusal, as it would
        // be the rollback's.
        let mut recovery = None;
        if let Err(r) = self.check_syncs() {
            // Refused in every mode, as the rollback is (a simulated one writes its lines).
            recovery = Some((r.reason_code, r.reason));
        } else if self.execution_context().0.writes()
            && let Ok(Some(_lock)) = self.state.try_lock_workflow_if_used(workflow_id)
            && let Err(r) = self.settle_before_change(workflow_id)
        {
            recovery = Some((r.reason_code, r.reason));
        }
        let found = match self.workflow_snapshots(workflow_id) {
            Ok(found) => found,
            // What stands in the way of reading them (a planted link, a folder others
            // could change) is described like any other refusal; a failing disk or a
            // busy peer is the answer's own error, as it would be the rollback's.
            Err(r) if !matches!(r.reason_code, ReasonCode::IoError | ReasonCode::Conflict) => {
                let (code, reason) = recovery.unwrap_or((r.reason_code, r.reason));
                return Ok(RollbackInfo {
                    workflow_id: workflow_id.to_owned(),
                    rollback_available: false,
                    reason_code: Some(code),
                    reason: Some(reason),
                    actions: Vec::new(),
                    conflicts: Vec::new(),
                });
            }
            Err(r) => return Err(r),
        };
        let (snaps, refusal, pruned, beneath) = match self.rollback_selection(
            workflow_id,
            found.clone(),
            &RollbackOptions::default(),
        ) {
            Ok(sel) => (sel.chosen, None, sel.pruned, sel.beneath),
            Err(refused) => (found, Some(refused), Vec::new(), HashMap::new()),
        };
        // Those undone beneath an older restore are recorded, not restored: nothing to
        // check of their files.
        let pending: Vec<_> = snaps
            .iter()
            .filter(|(_, s)| !s.restored && !beneath.contains_key(&s.meta.snapshot_id))
            .cloned()
            .collect();
        let (refusal, conflicts) = match refusal {
            Some((code, reason, conflicts)) => (Some((code, reason)), conflicts),
            None => match self.find_conflicts(workflow_id, &pending, false) {
                Ok(conflicts) => (
                    self.standing_refusal(&pending, false)
                        .map(|(r, _)| (r.reason_code, r.reason)),
                    conflicts,
                ),
                Err(r) => (Some((r.reason_code, r.reason)), Vec::new()),
            },
        };
        let refusal = recovery.or(refusal);
        let actions = snaps
            .iter()
            .rev()
            .map(|(i, s)| RollbackInfoAction {
                action_id: s.meta.action_id.clone(),
                intent: s.meta.intent.clone(),
                path: self.abs_path(*i, &s.meta.target()),
                existed: s.meta.existed,
                rollback_path: s.meta.rollback_path(),
                taken_at: s.meta.taken_at.clone(),
                restored: s.restored,
            })
            .collect();
        Ok(RollbackInfo {
            workflow_id: workflow_id.to_owned(),
            rollback_available: refusal.is_none() && (!pending.is_empty() || !beneath.is_empty()),
            reason_code: refusal.as_ref().map(|(code, _)| *code),
            // Not refused, yet not all of the workflow would come back: said as the
            // rollback would say it.
            reason: refusal
                .map(|(_, reason)| reason)
                .or_else(|| (!pruned.is_empty()).then(|| pruned_left(&pruned))),
            actions,
            conflicts,
        })
    }

    /// Rolls a workflow (or one of its actions) back, newest first, refusing with
    /// `conflict` when a file changed since the workflow wrote it, unless forced. A
    /// refusal is audited as a blocked rollback (SPEC §8: blocked actions are audited
    /// too), so that a snapshot found tampered with, or a conflict, is on the trail.
    pub fn rollback_workflow(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let report = self.rollback_unaudited(workflow_id, opts);
        if report.status == RollbackStatus::Refused {
            self.audit_refused_rollback(workflow_id, opts, &report);
        }
        report
    }

    fn audit_refused_rollback(
        &self,
        workflow_id: &str,
        opts: &RollbackOptions,
        report: &RollbackReport,
    ) {
        // An id that is not one names nothing the trail could hold.
        if report.reason_code == Some(ReasonCode::InvalidId) {
            return;
        }
        // The workflow's snapshot folder: in the root that holds it (the first root's
        // when none does), so that a workflow of another root is not named by the first's.
        let folder = self
            .workflow_folders(workflow_id)
            .into_iter()
            .next()
            .or_else(|| {
                self.root_paths
                    .first()
                    .map(|r| workflow_folder(r, workflow_id))
            })
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        let record = AuditRecord {
            timestamp: self.now(),
            execution_id: crate::plan::new_execution_id(),
            workflow_id: workflow_id.to_owned(),
            action_id: opts.action_id.clone().unwrap_or_default(),
            mutation_class: Some(MutationClass::Rollback),
            mutation_type: if opts.action_id.is_some() {
                "rollback_action"
            } else {
                "rollback_workflow"
            }
            .to_owned(),
            target_path: folder,
            before_checksum: None,
            after_checksum: None,
            rollback_available: false,
            rollback_path: None,
            status: AuditStatus::Blocked,
            reason_code: report.reason_code,
            error: report.reason.clone(),
        };
        if let Err(e) = self.audit.append(vec![record]) {
            tracing::error!(error = %e, "could not audit a refused rollback");
        }
    }

    /// The first steps of a rollback: the request checked, the workflow's lock taken (and
    /// returned, held), its dead run settled, its snapshots read and chosen.
    fn lock_and_select(
        &self,
        workflow_id: &str,
        opts: &RollbackOptions,
    ) -> Result<(crate::confine::state::WorkflowLock, Selection), RollbackRefusal> {
        let refused = |r: Refusal| (r.reason_code, r.reason, Vec::new());
        self.check_rollback_request(workflow_id, opts)
            .map_err(refused)?;
        let wf_lock = self
            .state
            .lock_workflow(workflow_id)
            .map_err(|e| refused(workflow_lock_refusal(workflow_id, &e)))?;
        // Before the snapshots are read: the dead run's recovery may restore some. After
        // the restores held back before it (its own among them) are recorded.
        if self.execution_context().0.writes() {
            self.settle_before_change(workflow_id).map_err(refused)?;
        }
        let snaps = self.snapshots_to_roll_back(workflow_id).map_err(refused)?;
        let selected = self.rollback_selection(workflow_id, snaps, opts)?;
        Ok((wf_lock, selected))
    }

    fn rollback_unaudited(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let refused = |code: ReasonCode, reason: String, conflicts: Vec<Conflict>| {
            refused_rollback(workflow_id, code, reason, conflicts)
        };
        let (
            wf_lock,
            Selection {
                chosen,
                beneath,
                pruned,
            },
        ) = match self.lock_and_select(workflow_id, opts) {
            Ok(selected) => selected,
            Err((code, reason, conflicts)) => return refused(code, reason, conflicts),
        };
        let (chosen, beneath) = split_beneath(chosen, &beneath);
        // Every target's lock, from the conflict check to the last restore: a writer
        // landing in between would meet the rollback half done.
        let held = self.lock_targets_after_restores(
            workflow_id,
            chosen
                .iter()
                .map(|(i, s)| (*i, s.meta.target()))
                .chain(beneath.iter().map(|(i, s, _)| (*i, s.meta.target())))
                .collect(),
        );
        let _held = match held {
            Ok(h) => h,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let mut conflicts = match self.find_conflicts(workflow_id, &chosen, opts.force) {
            Ok(c) => c,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        // What force cannot overwrite is refused before anything is restored, with its
        // own code, forced or not: advising force would not help, and met at its restore
        // it left the workflow half rolled back. First, as the preview says it, a
        // rollback into roots too long together for its record (simulated or done).
        if let Some((r, mismatched)) = self.standing_refusal(&chosen, opts.force) {
            self.metrics.checksum_mismatches(mismatched);
            return refused(r.reason_code, r.reason, conflicts);
        }
        if !conflicts.is_empty() && !opts.force {
            return refused(ReasonCode::Conflict, conflicts_said(&conflicts), conflicts);
        }
        // A rollback writes files like any action: with writes off or dry-run on it only
        // says what it would restore.
        if let (ctx, Some(why)) = self.execution_context()
            && !ctx.writes()
        {
            return self.simulate_rollback(
                workflow_id,
                (&chosen, &beneath),
                &pruned,
                why,
                conflicts,
            );
        }
        let execution_id = crate::plan::new_execution_id();
        let roots = chosen
            .iter()
            .map(|(i, _)| *i)
            .chain(beneath.iter().map(|(i, _, _)| *i));
        let record = match self.mark_rolling_back(workflow_id, &execution_id, roots, opts.force) {
            Ok(record) => record,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let steps = self.restore_chosen(
            &execution_id,
            workflow_id,
            (chosen, beneath),
            opts.force,
            &mut conflicts,
        );
        let unrecorded = steps.iter().find_map(|s| s.unrecorded.clone());
        if unrecorded.is_none() {
            self.run_finished(record, None);
        } else {
            self.left_for_later(&execution_id);
        }
        // Else the record stays "rolling back": the next start, or the next run or
        // rollback of this workflow in any process, finds it and audits the restores
        // its marks record, as after a crash; this process's next change records them
        // first (`record_held_restores`). A writer waiting for one of the targets' locks
        // must then find the workflow's free: it is let go first.
        drop(wf_lock);
        rolled_back_report(workflow_id, steps, unrecorded, &pruned, conflicts)
    }

    /// The ids must be ones, and a restore must be possible to make durable and record,
    /// before the workflow's lock is even waited for.
    fn check_rollback_request(&self, workflow_id: &str, opts: &RollbackOptions) -> Verdict {
        crate::plan::check_id("workflow_id", workflow_id)?;
        if let Some(a) = &opts.action_id {
            crate::plan::check_id("action_id", a)?;
        }
        // A restore could not be made durable either, nor recorded.
        self.check_syncs()
    }

    /// The workflow's snapshots, refused whole when one is damaged (the refusal names
    /// the last found): a rollback never restores from a backup it cannot trust, and
    /// leaving some files out would leave the workflow half rolled back.
    fn snapshots_to_roll_back(&self, workflow_id: &str) -> Verdict<RootedSnapshots> {
        // Each snapshot found damaged counts, each time a rollback is asked for.
        let (snaps, untrusted) = self.workflow_snapshots_and_untrusted(workflow_id)?;
        match untrusted_refusal(workflow_id, &untrusted) {
            None => Ok(snaps),
            Some(r) => {
                let mismatched = untrusted
                    .iter()
                    .filter(|r| r.reason_code == ReasonCode::ChecksumMismatch)
                    .count();
                self.metrics.checksum_mismatches(mismatched);
                Err(r)
            }
        }
    }

    /// What a rollback with writes off or dry-run on says, audited like a simulated
    /// plan's actions (SPEC §8): the restores that would happen (`chosen`) and the steps
    /// that would be recorded undone beneath older restores (`beneath`, newest on their
    /// files: said first), and the flag to change for them to.
    fn simulate_rollback(
        &self,
        workflow_id: &str,
        (chosen, beneath): (&[(usize, StoredSnapshot)], &[Beneath]),
        pruned: &[String],
        why: DryRunReason,
        conflicts: Vec<Conflict>,
    ) -> RollbackReport {
        // Each with whether it is undone beneath (its file left as it is).
        let in_turn = || {
            let under = beneath.iter().rev().map(|(i, s, _)| (i, s, true));
            under.chain(chosen.iter().rev().map(|(i, s)| (i, s, false)))
        };
        let would: Vec<String> = in_turn()
            .map(|(_, s, _)| {
                format!(
                    "{} ({} {})",
                    s.meta.action_id,
                    s.meta.intent,
                    shown_path(&s.meta.original_path)
                )
            })
            .collect();
        let (flag, fix) = why.explained();
        let fix = format!("{fix} to roll back");
        // Simulated like a plan's actions, and audited like them (SPEC §8): one line
        // per restore that would happen.
        let execution_id = crate::plan::new_execution_id();
        let records: Vec<AuditRecord> = in_turn()
            .map(|(i, s, under)| {
                let current = self.target_checksum(*i, &s.meta.target());
                let after = if under {
                    current.clone()
                } else {
                    s.meta.sha256.clone()
                };
                let mut r =
                    self.rollback_record(&execution_id, workflow_id, *i, &s.meta, current, after);
                r.status = AuditStatus::Simulated;
                r.rollback_path = None;
                r
            })
            .collect();
        if let Err(e) = self.audit.append(records) {
            let r = crate::error::log_refusal("audit the simulated rollback", &e);
            return refused_rollback(workflow_id, r.reason_code, r.reason, Vec::new());
        }
        RollbackReport {
            workflow_id: workflow_id.to_owned(),
            status: RollbackStatus::Simulated,
            steps_rolled_back: 0,
            reason_code: None,
            reason: Some(format!(
                "{flag}, so nothing was restored; {} action(s) would be rolled back, newest first: {}{}; {fix}",
                would.len(),
                named(&would),
                // As the real rollback would say: not all of the workflow comes back.
                if pruned.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} earlier write(s) had their snapshots pruned and could not be: {})",
                        pruned.len(),
                        named(pruned)
                    )
                }
            )),
            conflicts,
            steps: Vec::new(),
        }
    }

    /// Writes the workflow's record saying the rollback `execution_id` (or a failed
    /// run's own) is under way, returning it for the rollback to finish.
    pub(crate) fn mark_rolling_back(
        &self,
        workflow_id: &str,
        execution_id: &str,
        roots: impl Iterator<Item = usize>,
        forced: bool,
    ) -> Verdict<crate::recovery::InflightRecord> {
        // The workflow's record says a rollback is under way, durably, before any target
        // changes: if the process dies between a restore and its record, the next start
        // finds the restored file and records it. Earlier runs of the workflow are made
        // durable first (batched), since the record no longer points recovery at them,
        // and the workflow's commit log is emptied, so no later recovery redoes an
        // action this rollback undoes.
        let record = crate::recovery::InflightRecord {
            state: crate::recovery::ROLLING_BACK.to_owned(),
            execution_id: execution_id.to_owned(),
            workflow_id: workflow_id.to_owned(),
            started_at: self.now(),
            finished: false,
            boot: crate::confine::state::boot_id().map(str::to_owned),
            recovered_by: Vec::new(),
            roots: self.root_names(roots),
            rollback_recovered_at: None,
            forced: Some(forced),
            restoring: Some(String::new()),
        };
        self.settle_commit_log(workflow_id)
            .and_then(|synced| if synced { Ok(()) } else { self.sync_point() })
            .and_then(|()| self.begin_record(&record, None))
            .and_then(|()| self.sync_point())?;
        Ok(record)
    }
}

/// A rollback refused before anything was restored.
fn refused_rollback(
    workflow_id: &str,
    code: ReasonCode,
    reason: String,
    conflicts: Vec<Conflict>,
) -> RollbackReport {
    RollbackReport {
        workflow_id: workflow_id.to_owned(),
        status: RollbackStatus::Refused,
        steps_rolled_back: 0,
        reason_code: Some(code),
        reason: Some(reason),
        conflicts,
        steps: Vec::new(),
    }
}

/// What a rollback that went ahead says: failed when a restore failed or could not be
/// recorded (a held trail being a busy peer, not a broken disk), and, done, whether
/// pruned snapshots kept part of the workflow from coming back.
fn rolled_back_report(
    workflow_id: &str,
    steps: Vec<RollbackStep>,
    unrecorded: Option<String>,
    pruned: &[String],
    conflicts: Vec<Conflict>,
) -> RollbackReport {
    let failed = steps.iter().find(|s| !s.restored);
    let n = steps.iter().filter(|s| s.restored).count() as u64;
    let (reason_code, reason) = match (failed, unrecorded) {
        (Some(s), _) => (s.reason_code, s.reason.clone()),
        // A busy peer, not a broken disk.
        (None, Some(e)) if e.starts_with(HELD_TRAIL) => (
            Some(ReasonCode::Conflict),
            Some(format!(
                "the files were restored, but {e}, so it could not record it; it is recorded before this process's next change, when this workflow is next used, or at the next start"
            )),
        ),
        (None, Some(e)) => (
            Some(ReasonCode::IoError),
            Some(format!(
                "the files were restored, but the audit trail could not record it: {e}; it is recorded before this process's next change, when this workflow is next used, or at the next start, once the state directory can be written"
            )),
        ),
        // Done and recorded, not durable: this process takes no more changes.
        (None, None) if let Some(e) = steps.iter().find_map(|s| s.unsynced.as_deref()) => (
            Some(ReasonCode::IoError),
            Some(format!(
                "the files were restored and the rollback recorded, but neither could be made durable: {e}"
            )),
        ),
        // Done, yet not everything the workflow wrote is back as it was: say so.
        (None, None) if !pruned.is_empty() => (None, Some(pruned_left(pruned))),
        (None, None) => (None, None),
    };
    RollbackReport {
        workflow_id: workflow_id.to_owned(),
        status: if reason_code.is_some() {
            RollbackStatus::Failed
        } else {
            RollbackStatus::RolledBack
        },
        steps_rolled_back: n,
        reason_code,
        reason,
        conflicts,
        steps,
    }
}

/// At most twenty of `items`, joined, then how many more there are: a refusal or report
/// about a workflow of thousands of writes does not name each in one sentence (the
/// audit trail keeps such sentences for good).
fn named(items: &[String]) -> String {
    named_at_most(items, 20)
}

/// At most `n` of `items`, joined, then how many more there are.
fn named_at_most(items: &[String], n: usize) -> String {
    let shown = items
        .iter()
        .take(n)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match items.len().saturating_sub(n) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}
