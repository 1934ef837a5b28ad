//! The locks that serialise changes to one target, and to one workflow, across
//! threads and processes.

use super::Sandbox;
use crate::confine::RelPath;
use crate::confine::path::shown_path;
use crate::reason::{Refusal, Verdict};

/// Stripes of the target locks (`locks/target-NN.lock`): enough that unrelated writes
/// seldom wait for each other, few enough that the lock files stay a handful.
pub(super) const TARGET_LOCK_STRIPES: usize = 64;

/// Why a workflow's lock could not be taken: another run or rollback of it holds it too
/// long (`conflict`), or an I/O failure.
pub(crate) fn workflow_lock_refusal(workflow_id: &str, e: &std::io::Error) -> Refusal {
    crate::error::busy_or_failed(
        e,
        || {
            format!(
                "another run or rollback of workflow {} kept it busy ({e}: a long plan or rollback, or a stopped or hung process); nothing was done: try again later, or raise limits.lock_wait_seconds",
                shown_path(workflow_id)
            )
        },
        || {
            format!(
                "could not lock workflow {}: {}",
                shown_path(workflow_id),
                crate::error::state_io_words(e)
            )
        },
    )
}

/// Why the lock of `rel` could not be taken: another writer held it too long
/// (`conflict`), or an I/O failure.
fn lock_refusal(rel: &RelPath, e: &std::io::Error) -> Refusal {
    crate::error::busy_or_failed(
        e,
        || {
            format!(
                "another writer kept {} busy ({e}: a long write or rollback, heavy contention, or a stopped or hung process); nothing was done: try again later, or raise limits.lock_wait_seconds",
                shown_path(&rel.as_string())
            )
        },
        || {
            format!(
                "could not lock {}: {}",
                shown_path(&rel.as_string()),
                crate::error::io_words(e)
            )
        },
    )
}

impl Sandbox {
    /// Takes the lock that serialises every change to `rel` in root `root` across
    /// workflows, threads and processes, from the read of what it holds to the write of
    /// what replaces it (or its restore): otherwise two writers working from the same
    /// bytes would lose one's change, and a restore could undo a change it never saw.
    /// A holder of one takes no other target's lock (holders of several take them at once,
    /// [`Sandbox::lock_targets`]), and a workflow's lock only before, so no two holders
    /// wait for each other.
    pub(crate) fn lock_target(
        &self,
        root: usize,
        rel: &RelPath,
    ) -> Verdict<crate::confine::state::HeldLock<'_>> {
        self.target_locks
            .lock(self.stripe_of(root, rel))
            .map_err(|e| lock_refusal(rel, &e))
    }

    /// The locks of several targets at once, taken in stripe order so that two holders
    /// of several never wait for each other (holders of one never wait while holding it).
    pub(crate) fn lock_targets(
        &self,
        targets: impl Iterator<Item = (usize, RelPath)>,
    ) -> Verdict<Vec<crate::confine::state::HeldLock<'_>>> {
        let mut stripes: Vec<(usize, RelPath)> = targets
            .map(|(root, rel)| (self.stripe_of(root, &rel), rel))
            .collect();
        stripes.sort_by_key(|(i, _)| *i);
        stripes.dedup_by_key(|(i, _)| *i);
        // One wait for them all: each taken after the one before, they would otherwise
        // add up, and holders of several would queue behind each other for minutes.
        let deadline = self.target_locks.deadline();
        stripes
            .iter()
            .map(|(i, rel)| {
                self.target_locks
                    .lock_by(*i, deadline)
                    .map_err(|e| lock_refusal(rel, &e))
            })
            .collect()
    }

    /// The locks of `targets` ([`Sandbox::lock_targets`]) for a change by
    /// `workflow_id` (whose lock the caller holds), once the restores this process made
    /// but the trail would not record are on it ([`Sandbox::record_held_restores`]):
    /// written later, they would follow this change's line, and the trail's newest line
    /// of a file would name what the file held before it. Looked at again once the locks
    /// are held: a rollback that held one of them meanwhile may have left such restores.
    pub(crate) fn lock_targets_after_restores(
        &self,
        workflow_id: &str,
        targets: Vec<(usize, RelPath)>,
    ) -> Verdict<Vec<crate::confine::state::HeldLock<'_>>> {
        let (held, waiting) = self.lock_targets_recording(workflow_id, targets, true)?;
        match waiting {
            Some(r) => Err(r),
            None => Ok(held),
        }
    }

    /// [`Sandbox::lock_targets_after_restores`] for a run undoing itself, which goes on
    /// whether or not the trail takes the restores held back before it: also returns why
    /// they still wait, if they do (its own lines are then held back after them).
    pub(crate) fn lock_targets_for_undo(
        &self,
        workflow_id: &str,
        targets: Vec<(usize, RelPath)>,
    ) -> Verdict<(Vec<crate::confine::state::HeldLock<'_>>, Option<Refusal>)> {
        self.lock_targets_recording(workflow_id, targets, false)
    }

    /// The locks of `targets` once the held restores are recorded; on a refusal to
    /// record them, at once when `refuse`, else with the locks.
    fn lock_targets_recording(
        &self,
        workflow_id: &str,
        targets: Vec<(usize, RelPath)>,
        refuse: bool,
    ) -> Verdict<(Vec<crate::confine::state::HeldLock<'_>>, Option<Refusal>)> {
        let added = self.held_restores_added();
        let recorded = self.record_held_restores(workflow_id);
        if refuse && let Err(r) = recorded {
            return Err(r);
        }
        let held = self.lock_targets(targets.iter().cloned())?;
        if recorded.is_err() || self.held_restores_added() == added {
            return Ok((held, recorded.err()));
        }
        // Let go while they are recorded, as the first time.
        drop(held);
        let recorded = self.record_held_restores(workflow_id);
        if refuse && let Err(r) = recorded {
            return Err(r);
        }
        Ok((self.lock_targets(targets.into_iter())?, recorded.err()))
    }

    /// Which target lock serves `rel` in root `root`: named by the file's real path,
    /// folded, so that every process whose roots reach the file takes the same lock for
    /// it, through whichever root (one may lie inside another's) and in whichever case
    /// (on a filesystem that ignores it). A bind mount still gives a file two names.
    fn stripe_of(&self, root: usize, rel: &RelPath) -> usize {
        let h = crate::confine::root::lock_hash(self.roots[root].lock_seed(), &rel.as_string());
        (h % TARGET_LOCK_STRIPES as u64) as usize
    }
}
