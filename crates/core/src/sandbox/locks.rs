//! The locks that serialise changes to one target, and to one workflow, across
//! threads and processes, and the words for why one could not be taken.
//!
//! An action holds its target's lock from reading the target's bytes to writing the new
//! ones. Two stripes serve each target, both taken: one picked by the root's identity and
//! the path beneath it, the same through every path to the root; one by the file's real
//! path, folded as a filesystem that ignores case reads it, the same through roots that lie
//! one inside another in processes sharing a state directory. Lock order: a workflow's
//! lock, then one target lock, or several in stripe order; a holder takes no other lock it
//! could wait for.

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
            // The lock is a file of the state directory's (`locks/`): a full disk there
            // is said as the workflow's lock says it, with what to free.
            format!(
                "could not lock {} (its lock is kept in the state directory): {}",
                shown_path(&rel.as_string()),
                crate::error::state_io_words(e)
            )
        },
    )
}

impl Sandbox {
    /// Takes the locks that serialise every change to `rel` in root `root` across
    /// workflows, threads and processes (two stripes, [`Sandbox::stripes_of`]), from the
    /// read of what it holds to the write of what replaces it (or its restore):
    /// otherwise two writers working from the same bytes would lose one's change, and a
    /// restore could undo a change it never saw. Holders take all their targets' locks
    /// at once, in stripe order ([`Sandbox::lock_targets`]), and a workflow's lock only
    /// before, so no two holders wait for each other.
    pub(crate) fn lock_target(
        &self,
        root: usize,
        rel: &RelPath,
    ) -> Verdict<Vec<crate::confine::state::HeldLock<'_>>> {
        self.lock_targets(std::iter::once((root, rel.clone())))
    }

    /// The locks of several targets at once, taken in stripe order so that two holders
    /// of several never wait for each other (holders of one never wait while holding it).
    pub(crate) fn lock_targets(
        &self,
        targets: impl Iterator<Item = (usize, RelPath)>,
    ) -> Verdict<Vec<crate::confine::state::HeldLock<'_>>> {
        let mut stripes: Vec<(usize, RelPath)> = targets
            .flat_map(|(root, rel)| self.stripes_of(root, &rel).map(|i| (i, rel.clone())))
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

    /// The target locks that serve `rel` in root `root`, both taken: one named by the
    /// root's identity and the path beneath it, the same through every path to the root
    /// (a bind mount of it, a folder above it renamed); one by the file's real path,
    /// folded, the same through whichever root reaches the file (one may lie inside
    /// another process's) and in whichever case (on a filesystem that ignores it). Two
    /// processes reaching a file either way take a lock in common.
    fn stripes_of(&self, root: usize, rel: &RelPath) -> [usize; 2] {
        let rel = rel.as_string();
        self.roots[root].lock_seeds().map(|seed| {
            (crate::confine::root::lock_hash(seed, &rel) % TARGET_LOCK_STRIPES as u64) as usize
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target's lock refused by a full state directory says where space is missing and
    /// what to do, as the workflow's lock does (it named the target alone).
    #[test]
    fn a_target_lock_refused_for_space_names_the_state_directory() {
        let e = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let r = lock_refusal(&RelPath::from_recorded("r/q6.txt"), &e);
        assert_eq!(r.reason_code, crate::ReasonCode::IoError, "{r:?}");
        assert!(
            r.reason.starts_with(
                "could not lock 'r/q6.txt' (its lock is kept in the state directory): "
            ) && r.reason.contains(
                "the state directory's filesystem is full, of space or of inodes (df -h, df -i)"
            ),
            "{}",
            r.reason
        );
    }
}
