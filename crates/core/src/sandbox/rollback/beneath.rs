//! Steps undone beneath: a spent step still standing over an older restore of its file,
//! recorded as undone by that restore rather than restored.
//!
//! A spent step (its backup damaged or gone, passed over by a forced rollback) whose file
//! an older restore then gave back is recorded undone beneath it (its mark, then a line
//! from and to what the file holds) by that rollback, or, when it could not (it died first,
//! its trail lines were held, the file could not be read), by the next rollback
//! (`TrailWrites::undone_beneath`: a step still standing over an older step of its workflow
//! on the same file restored after its write). It is never restored, which would bring the
//! older actions' bytes back over their restores.

use super::RollbackStep;
use super::restore::{PassTargets, Restorer};
use crate::confine::path::shown_path;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::conflicts::TargetState;
use crate::sandbox::{RootedSnapshots, Sandbox};
use crate::snapshot::{ROLL_BACK_AGAIN, SnapshotMeta, StoredSnapshot};
use std::collections::HashMap;

/// A snapshot undone beneath an older restore, with what that restore gave its file.
pub(super) type Beneath = (usize, StoredSnapshot, TargetState);

/// The snapshots of `chosen` not yet restored, apart from those undone `beneath` an
/// older restore (each with what that restore gave its file).
pub(super) fn split_beneath(
    chosen: RootedSnapshots,
    beneath: &HashMap<String, TargetState>,
) -> (RootedSnapshots, Vec<Beneath>) {
    let (mut rest, mut under) = (Vec::new(), Vec::new());
    for (i, s) in chosen.into_iter().filter(|(_, s)| !s.restored) {
        match beneath.get(&s.meta.snapshot_id) {
            Some(gave) => under.push((i, s, gave.clone())),
            None => rest.push((i, s)),
        }
    }
    (rest, under)
}

impl Sandbox {
    /// Steps force passed over as spent (`spent_on`: their backup damaged or gone) whose
    /// target an older step of the pass then gave back (`restored_on`): their change is
    /// undone beneath them, and recorded so, as a restore is (the mark, then the line,
    /// from and to what the file holds now), lest their backup, put back later, restore
    /// their bytes over the older restores. A step whose mark cannot be written stays
    /// failed; one whose line cannot be written is held, as a restore's.
    pub(super) fn record_undone_beneath(
        &self,
        execution_id: &str,
        workflow_id: &str,
        targets: PassTargets,
        steps: &mut [RollbackStep],
    ) {
        let PassTargets {
            spent_on,
            restored_on,
            ..
        } = targets;
        let mut held = None;
        for (key, spent) in spent_on {
            let Some((gave, validated)) = restored_on.get(&key) else {
                continue;
            };
            for (at, meta) in spent {
                // What the file holds now: a restore after the one that gave it back
                // may have failed having changed it. Left failed, for a rollback run
                // again to record, when it cannot be read or recorded now.
                let Ok((now, same)) = self.held_since(key.0, &meta, gave) else {
                    continue;
                };
                let ids = (execution_id, workflow_id);
                let Ok(unrecorded) = self.mark_undone_beneath(ids, key.0, &meta, &now, &mut held)
                else {
                    continue;
                };
                let step = &mut steps[at];
                step.detail = Some(format!(
                    "undone beneath it: {}; {}",
                    step.reason.take().unwrap_or_default(),
                    if same {
                        "the older actions' restores gave the file what the workflow found"
                    } else {
                        "the older actions' restores undid its change (the file changed after them: see their steps)"
                    }
                ));
                step.restored = true;
                step.checksum_validated = *validated && same;
                step.restored_checksum = now;
                step.reason_code = None;
                step.unrecorded = unrecorded;
            }
        }
    }

    /// Records the steps undone beneath restores an earlier rollback made
    /// ([`TrailWrites::undone_beneath`]), newest first, as [`Sandbox::record_undone_beneath`]
    /// does those of this pass. Returns their steps, and why the trail refused their
    /// lines, if it did: the restores after them wait for those.
    pub(super) fn record_beneath(
        &self,
        execution_id: &str,
        workflow_id: &str,
        beneath: Vec<Beneath>,
    ) -> (Vec<RollbackStep>, Option<String>) {
        let mut held = None;
        let steps: Vec<RollbackStep> = beneath
            .into_iter()
            .rev()
            .map(|(i, s, gave)| {
                let path = self.abs_path(i, &s.meta.target());
                let meta = s.meta;
                let (now, same) = match self.held_since(i, &meta, &gave) {
                    Ok(judged) => judged,
                    Err(r) => return RollbackStep::failed(&meta, path, r),
                };
                let ids = (execution_id, workflow_id);
                let unrecorded = match self.mark_undone_beneath(ids, i, &meta, &now, &mut held) {
                    Ok(unrecorded) => unrecorded,
                    Err(r) => return RollbackStep::failed(&meta, path, r),
                };
                let detail = format!(
                    "undone beneath an older action's restore, made by an earlier rollback: its change went with that restore, so its backup was not restored over it{}",
                    if same {
                        ""
                    } else {
                        " (the file has changed since)"
                    }
                );
                RollbackStep {
                    action_id: meta.action_id.clone(),
                    intent: meta.intent.clone(),
                    path,
                    restored: true,
                    checksum_validated: same,
                    detail: Some(detail),
                    restored_checksum: now,
                    reason_code: None,
                    reason: None,
                    unrecorded,
                    unsynced: None,
                }
            })
            .collect();
        let waiting = steps
            .iter()
            .filter(|s| s.restored && s.unrecorded.is_some())
            .count();
        if waiting > 0 {
            self.held_restores().add(workflow_id, execution_id, waiting);
        }
        (steps, held)
    }

    /// What `meta`'s target in root `i` holds now, as a restore's line records it, and
    /// whether it is what an older restore gave it (`gave`: a folder where that restore
    /// left none is not); why not, when that cannot be told (the file could not be
    /// read): a line then would call it absent.
    fn held_since(
        &self,
        i: usize,
        meta: &SnapshotMeta,
        gave: &TargetState,
    ) -> Result<(Option<String>, bool), Refusal> {
        let state = self.target_state(i, &meta.target());
        let now = match &state {
            TargetState::File(sum) => Some(sum.clone()),
            TargetState::Missing | TargetState::Directory => None,
            TargetState::Failed(why) | TargetState::Unreachable(why) => {
                return Err(unjudged_beneath(meta, ReasonCode::IoError, why));
            }
            TargetState::Unreadable | TargetState::Denied(_) => {
                return Err(unjudged_beneath(
                    meta,
                    ReasonCode::Conflict,
                    "it is not a regular file this process can read: its kind or its permissions",
                ));
            }
        };
        Ok((now, state == *gave))
    }

    /// Records `meta`'s step (root `i`) undone beneath an older restore, its file
    /// holding `now`: its mark, then its line from and to `now`, as a restore is
    /// recorded (a mark that cannot be written is logged, and the line, which later
    /// rollbacks read first, written all the same). Returns why its line was not
    /// written, if it was not: the trail refused it, or an earlier line of the pass
    /// (`held`, set on the first refusal), which it must not pass. Refused when neither
    /// could be written: nothing would record it later, and the step stays failed for
    /// a rollback run again.
    fn mark_undone_beneath(
        &self,
        (execution_id, workflow_id): (&str, &str),
        i: usize,
        meta: &SnapshotMeta,
        now: &Option<String>,
        held: &mut Option<String>,
    ) -> Verdict<Option<String>> {
        let by = Restorer::Rollback { found: now };
        let unmarked = self
            .mark_restored(i, meta, execution_id, now, &[], by)
            .inspect_err(|r| {
                tracing::warn!(reason = %r, "a step undone beneath older restores is recorded on the audit trail next; only its snapshot's restored mark could not be written");
            })
            .err();
        let unrecorded = match held {
            Some(words) => Some(words.clone()),
            None => {
                let line = self.rollback_record(
                    execution_id,
                    workflow_id,
                    i,
                    meta,
                    now.clone(),
                    now.clone(),
                );
                *held = self.append_restore_line(line).err();
                held.clone()
            }
        };
        if let (Some(r), Some(words)) = (unmarked, &unrecorded) {
            return Err(Refusal::new(
                r.reason_code,
                format!(
                    "its change was undone beneath older restores, but neither its mark ({}) nor its audit line ({words}) could be written; {ROLL_BACK_AGAIN} to record it",
                    r.reason
                ),
            ));
        }
        self.metrics
            .mutation(&meta.intent, crate::executor::ActionStatus::RolledBack);
        Ok(unrecorded)
    }
}

/// Why a step undone beneath older restores is not recorded so now: what its file holds
/// could not be told (`why`); a rollback run again records it.
fn unjudged_beneath(meta: &SnapshotMeta, code: ReasonCode, why: &str) -> Refusal {
    Refusal::new(
        code,
        format!(
            "its change was undone beneath older restores, but what {} holds could not be read to record it so ({why}); {ROLL_BACK_AGAIN} to record it",
            shown_path(&meta.original_path)
        ),
    )
}
