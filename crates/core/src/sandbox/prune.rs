//! Pruning the snapshots of old workflows.
//!
//! A prune keeps a workflow whose lock is held (a run or rollback under way) rather than
//! waiting for it, and recovers a run that died holding it before it judges the workflow's
//! age.
//!
//! A prune is recorded in the state directory before it removes anything: its mark
//! (`inflight/ID.pruned`) says, per root, how far in the trail prunes went there, so the
//! writes it made irreversible are not taken for missing snapshots. It moves the workflow's
//! folder aside in one rename before removing it, so a prune that dies never leaves a
//! half-removed workflow (the next prune sweeps what it left). It takes workflows 32 at a
//! time, each locked from its judgement to its removal: each mark's bytes are synced as it
//! is written, the batch's names by one sync of `inflight/`, and its moves by one sync of
//! each root's store, before any folder is removed (no `syncfs`: a FUSE filesystem does not
//! pass it on, and it waits for every writer). A workflow with snapshot folders it cannot
//! date (unsealed ones, written before seals existed) is kept and listed among
//! `workflows_failed` with why (exit 1): such folders are removed by hand. Prune makes
//! writes irreversible, so unless writes are real it only reports the workflows it would
//! prune (`simulated: true`) and removes nothing.

use super::Sandbox;
use crate::audit::AuditStatus;
use crate::context::DryRunReason;
use crate::reason::{ReasonCode, Verdict};
use crate::snapshot::Snapshotter;
use serde::Serialize;

/// The folder standing as a workflow's in each root (device and inode), as a prune judged
/// it.
type Judged = Vec<Option<(u64, u64)>>;

/// A workflow marked pruned: its lock, held until its folders are gone, the folders
/// judged, and what its record of prunes held before.
type Marked = (crate::confine::state::WorkflowLock, (Judged, Before));

/// What a workflow's record of prunes held before this prune's mark replaced it: put
/// back should the prune then move none of its folders, so that a prune that failed
/// before touching anything leaves the workflow's rollback as it was.
enum Before {
    /// No record: withdrawing this prune's mark removes it.
    Unmarked,
    /// An earlier prune's, written back.
    Marked(Vec<(String, u64)>),
    /// A damaged one, replaced: not withdrawn (which roots it named is unknown).
    Damaged,
}

/// What pruning removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// Workflows whose snapshots were removed (when `simulated`: would be).
    pub workflows_pruned: Vec<String>,
    /// Workflows kept (newer, or running).
    pub workflows_kept: u64,
    /// Workflows whose prune could not be done or finished (an I/O error, or snapshot
    /// folders nothing vouches for, kept until the operator removes or mends them): each
    /// is tried again by the next prune.
    pub workflows_failed: Vec<PruneFailure>,
    /// Writing is off or dry-run is on: nothing was removed.
    pub simulated: bool,
    /// Why, when `simulated`.
    pub dry_run_reason: Option<DryRunReason>,
}

/// A workflow [`Sandbox::prune`] could not prune, and why.
#[derive(Debug, Clone, Serialize)]
pub struct PruneFailure {
    /// The workflow.
    pub workflow_id: String,
    /// Why, as a code.
    pub reason_code: ReasonCode,
    /// Why, for a person.
    pub reason: String,
}

/// Workflows pruned together: their marks' names are made durable by one sync of their
/// folder, then their folders moved aside and each root's store synced once, instead
/// of two directory syncs for each. Each is locked from its judgement to its removal:
/// bounded, so that a prune of many holds few locks and files open, none for long.
const PRUNE_BATCH: usize = 32;

impl PruneReport {
    /// `wf` could not be pruned: one workflow that cannot be does not keep the others.
    fn failed(&mut self, wf: &str, r: crate::Refusal) {
        tracing::error!(workflow = %wf, reason = %r, "a workflow could not be pruned");
        self.workflows_failed.push(PruneFailure {
            workflow_id: wf.to_owned(),
            reason_code: r.reason_code,
            reason: r.reason,
        });
    }
}

impl Sandbox {
    /// Removes the snapshots of workflows whose newest snapshot is older than
    /// `older_than` and that no process is running now. Removing snapshots makes writes
    /// irreversible, so like any write it only reports what it would do unless writing
    /// is on and dry-run off.
    pub fn prune(&self, older_than: std::time::Duration) -> Verdict<PruneReport> {
        let (ctx, why) = self.execution_context();
        let simulated = !ctx.writes();
        // An age beyond the calendar's range prunes nothing.
        let cutoff = chrono::Duration::from_std(older_than)
            .ok()
            .and_then(|d| self.clock.now().checked_sub_signed(d))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let mut report = PruneReport {
            simulated,
            dry_run_reason: why.filter(|_| simulated),
            ..PruneReport::default()
        };
        let mut ids: Vec<String> = Vec::new();
        for root in &self.roots {
            let names = Snapshotter::list_workflows(root)?;
            if !simulated {
                let swept = Snapshotter::sweep_pruned(root, &names);
                if swept > 0 {
                    tracing::info!(folders = swept, "removed what an earlier prune left");
                }
                let claims = crate::snapshot::StoreOwner::sweep_dead_claims(root, &names);
                if claims > 0 {
                    tracing::info!(files = claims, "removed what owner claims that died left");
                }
            }
            ids.extend(names);
        }
        ids.sort();
        ids.dedup();
        if !simulated {
            self.sweep_pruned_records(&ids);
        }
        for batch in ids.chunks(PRUNE_BATCH) {
            // Locks held until the batch is pruned.
            let mut marked = Vec::new();
            for wf in batch {
                if !crate::plan::is_valid_id(wf) {
                    continue;
                }
                match self.judge_for_prune(wf, cutoff, simulated) {
                    Ok(Some(judged)) if !simulated => marked.push((wf.clone(), judged)),
                    Ok(Some(_)) => report.workflows_pruned.push(wf.clone()),
                    Ok(None) => report.workflows_kept += 1,
                    Err(r) => report.failed(wf, r),
                }
            }
            self.remove_marked(marked, &mut report);
        }
        // Rollbacks look only near what they restored: folders on the ledger emptied
        // some other way (by hand, say) are removed here, in the housekeeping.
        if !simulated {
            self.remove_left_dirs(None);
            match self.state.sweep_unused_workflow_locks() {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    files = n,
                    "removed lock files of workflows that keep nothing"
                ),
                Err(e) => tracing::warn!(error = %e, "could not list the workflow locks"),
            }
        }
        Ok(report)
    }

    /// Removes what a prune killed after its mark left beside it: the run record and the
    /// commit log of a marked workflow that has no snapshot folder (`with_snapshots`
    /// lists those that do), when no run holds them and they hold nothing to recover.
    /// No later prune visits such a workflow otherwise.
    fn sweep_pruned_records(&self, with_snapshots: &[String]) {
        // Only those with a record left: a prune that finished left none, and a lock and
        // several reads for each workflow ever pruned would make every prune slower.
        let Ok(marked) = self.state.pruned_ids_with_records() else {
            return;
        };
        for wf in marked {
            if with_snapshots.binary_search(&wf).is_ok() || !crate::plan::is_valid_id(&wf) {
                continue;
            }
            let Ok(Some(_lock)) = self.state.try_lock_workflow(&wf) else {
                continue;
            };
            let settled = !self.awaits_recovery(&wf)
                && self.commit_log_holds_entries(&wf).is_ok_and(|held| !held);
            let left = self.state.inflight_read(&wf).is_ok_and(|r| r.is_some())
                || self.state.commit_log_file(&wf).is_ok_and(|l| l.is_some());
            if !settled || !left {
                continue;
            }
            match self
                .state
                .inflight_remove(&wf)
                .and_then(|()| self.state.commit_log_remove(&wf))
            {
                Ok(()) => {
                    tracing::info!(workflow = %wf, "removed the run record an earlier prune left")
                }
                Err(e) => {
                    tracing::warn!(workflow = %wf, error = %e, "could not remove the run record an earlier prune left")
                }
            }
        }
    }

    /// Judges one workflow for the prune, under its lock: `None` when it is kept (run
    /// or rolled back now, or young), else its lock, held, the folders judged and what
    /// its record of prunes held before, once the workflow is marked pruned (unless
    /// `simulated`) and its snapshots are to go.
    fn judge_for_prune(
        &self,
        wf: &str,
        cutoff: chrono::DateTime<chrono::Utc>,
        simulated: bool,
    ) -> Verdict<Option<Marked>> {
        // A workflow being run or rolled back now is kept, not waited for: it is not
        // finished, and one stopped process must not hold up the prune of the others.
        let lock = self.state.try_lock_workflow(wf).map_err(|e| {
            crate::Refusal::new(
                ReasonCode::IoError,
                format!("could not take the workflow's lock: {e}"),
            )
        })?;
        let Some(lock) = lock else {
            return Ok(None);
        };
        // A run that died holding the lock: its in-doubt writes are judged from the
        // snapshots about to go.
        if !simulated {
            self.recover_dead_run(wf)?;
        }
        Ok(self
            .mark_for_prune(wf, cutoff, simulated)?
            .map(|judged| (lock, judged)))
    }

    /// Which folder stands as workflow `wf`'s in each root (`None` where none does), by
    /// identity: what a prune judged is what it moves aside, not whatever another
    /// program has put under the name since.
    fn judged_folders(&self, wf: &str) -> Judged {
        use cap_std::fs::MetadataExt as _;
        self.roots
            .iter()
            .map(|root| {
                super::workflow_folder_in(root, wf)
                    .ok()
                    .filter(cap_std::fs::Metadata::is_dir)
                    .map(|m| (m.dev(), m.ino()))
            })
            .collect()
    }

    /// Removes the snapshots of the workflows `marked` (each with its lock), once their
    /// marks are durable, and reports each pruned or failed.
    fn remove_marked(&self, marked: Vec<(String, Marked)>, report: &mut PruneReport) {
        if marked.is_empty() {
            return;
        }
        // Recorded first: rollback checks snapshots against the audit trail, and writes
        // audited up to here are about to lose theirs by design. A mark without the
        // removal only spares writes that still have snapshots; the other way round,
        // every later rollback of the workflow would be refused.
        let synced = self
            .failpoints
            .check("sync_prune_marks")
            .and_then(|()| self.state.sync_prune_marks());
        if let Err(e) = synced {
            // The marks stand (removing them could take an earlier prune's with them):
            // the report says what that means for the workflows' rollbacks.
            let r = crate::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not make the prune's mark durable: {}; nothing of the workflow was removed, but the writes the mark covers count as pruned: a rollback leaves them as they are (later writes roll back), and a later prune removes their snapshots with the workflow's",
                    crate::error::state_io_words(&e)
                ),
            );
            for (wf, _) in &marked {
                report.failed(wf, r.clone());
            }
            return;
        }
        let mut moved: Vec<(String, Vec<(usize, String)>)> = Vec::new();
        for (wf, (_, (judged, before))) in &marked {
            let mut aside = Vec::new();
            let set = self.roots.iter().enumerate().try_for_each(|(i, root)| {
                let Some(folder) = judged[i] else {
                    return Ok(());
                };
                if let Some(name) = Snapshotter::set_aside(root, wf, folder)? {
                    aside.push((i, name));
                }
                Ok(())
            });
            match set {
                Ok(()) => moved.push((wf.clone(), aside)),
                Err(r) if aside.is_empty() => report.failed(wf, self.withdraw_mark(wf, before, r)),
                Err(r) => report.failed(wf, r),
            }
        }
        // The moves reach the disk before the folders go: one sync per root.
        let mut unsynced: Vec<(usize, crate::Refusal)> = Vec::new();
        if self.durable() {
            for (i, root) in self.roots.iter().enumerate() {
                if moved.iter().any(|(_, a)| a.iter().any(|(r, _)| *r == i))
                    && let Err(r) = Snapshotter::sync_store(root)
                {
                    unsynced.push((i, r));
                }
            }
        }
        for (wf, aside) in moved {
            // Left for the next prune's sweep, as a folder that could not be removed.
            if let Some((_, r)) = unsynced
                .iter()
                .find(|(i, _)| aside.iter().any(|(r, _)| r == i))
            {
                report.failed(&wf, r.clone());
                continue;
            }
            if let Err(r) = self.remove_pruned(&wf, &aside) {
                report.failed(&wf, r);
                continue;
            }
            report.workflows_pruned.push(wf);
        }
    }

    /// Removes a pruned workflow's folders moved aside (`aside`: root index, name) and
    /// its run record and commit log.
    fn remove_pruned(&self, wf: &str, aside: &[(usize, String)]) -> Verdict {
        for (i, name) in aside {
            self.fail_at("during_prune")?;
            // The workflow has no snapshots here any more: a folder that cannot be
            // removed now is left for the next prune's sweep.
            if let Err(r) = Snapshotter::remove_aside(&self.roots[*i], name) {
                tracing::warn!(reason = %r, "a pruned snapshot folder is left for the next prune");
            }
        }
        if let Err(e) = self
            .state
            .inflight_remove(wf)
            .and_then(|()| self.state.commit_log_remove(wf))
        {
            tracing::warn!(error = %e, "could not remove a pruned workflow's run record");
        }
        Ok(())
    }

    /// Records workflow `wf` pruned in the roots `holding` (their paths): up to the trail's
    /// end now; roots an earlier prune went through keep the seq it reached (a write
    /// audited since in such a root still has its snapshot), as do roots this process is
    /// not configured with. Not yet durable ([`StateDir::sync_prune_marks`]).
    ///
    /// [`StateDir::sync_prune_marks`]: crate::confine::state::StateDir::sync_prune_marks
    fn mark_pruned(&self, wf: &str, holding: Vec<String>) -> Verdict<Before> {
        self.state
            .prune_mark(wf)
            .map(|m| m.map_or(Before::Unmarked, Before::Marked))
            .or_else(|e| match e.kind() {
                // Replaced by this prune's: what it says of the roots pruned now is
                // whole again; the roots only a damaged mark named are not.
                std::io::ErrorKind::InvalidData => {
                    tracing::warn!(error = %e, "replacing a damaged prune record");
                    Ok(Before::Damaged)
                }
                _ => Err(e),
            })
            .and_then(|before| {
                let seq = self.audit.last_seq()?;
                let mut pruned = match &before {
                    Before::Marked(m) => m.clone(),
                    Before::Unmarked | Before::Damaged => Vec::new(),
                };
                pruned.retain(|(r, _)| !holding.contains(r));
                pruned.extend(holding.into_iter().map(|r| (r, seq)));
                self.state.write_prune_mark(wf, &pruned).map(|()| before)
            })
            .map_err(|e| {
                crate::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not record the prune: {}",
                        crate::error::state_io_words(&e)
                    ),
                )
            })
    }

    /// Marks one workflow pruned (its lock held) when what can be trusted — sealed
    /// snapshots and the audit trail — says it is older than `cutoff`. Folders nothing vouches for
    /// (another state directory's, a lost key's, planted) keep the workflow: nothing
    /// proves their age. Returns the folders judged when its snapshots are to go, and
    /// what its record of prunes held before this prune's mark.
    fn mark_for_prune(
        &self,
        wf: &str,
        cutoff: chrono::DateTime<chrono::Utc>,
        simulated: bool,
    ) -> Verdict<Option<(Judged, Before)>> {
        let judged = self.judged_folders(wf);
        let (snaps, untrusted) = self.trusted_workflow_snapshots(wf)?;
        let trail = self
            .audit
            .by_workflow(wf)
            .map_err(|e| crate::error::log_refusal("read the audit trail", &e))?;
        // An interrupted rollback recovery settled is activity as of then: the operator
        // was told to run it again, which needs these snapshots.
        let recovered_at = self.run_record(wf).and_then(|r| r.rollback_recovered_at);
        let recent = snaps
            .iter()
            .map(|(_, s)| s.meta.taken_at.as_str())
            .chain(recovered_at.as_deref())
            // A simulated or refused rollback or plan is no activity on the workflow's
            // snapshots: nothing changed.
            .chain(
                trail
                    .iter()
                    .filter(|e| !matches!(e.status, AuditStatus::Simulated | AuditStatus::Blocked))
                    .map(|e| e.timestamp.as_str()),
            )
            // A date that cannot be read proves no age.
            .any(|t| crate::clock::parse_timestamp(t).is_none_or(|t| t >= cutoff));
        // Kept, and said: a count among the young ones would hide what only the
        // operator can put right.
        if let Some(first) = untrusted.first() {
            let reasons: Vec<&str> = untrusted.iter().map(|r| r.reason.as_str()).collect();
            return Err(crate::Refusal::new(
                first.reason_code,
                format!(
                    "kept: {} of its snapshot folders cannot be used as they stand, so they are neither judged nor removed: {}",
                    untrusted.len(),
                    reasons.join("; ")
                ),
            ));
        }
        // No folder, nothing on the trail: a name met while another program renamed
        // folders in the store. Nothing to prune, and no workflow to say pruned.
        let nowhere = judged.iter().all(Option::is_none) && trail.is_empty();
        if recent || nowhere {
            return Ok(None);
        }
        // Moved or replaced while it was read, what was judged is not what stands there.
        if self.judged_folders(wf) != judged {
            return Err(crate::Refusal::new(
                ReasonCode::Conflict,
                "kept: its snapshot folder was moved or replaced by another program while it was judged; prune again once it is left alone",
            ));
        }
        // A store closed to this process could not be emptied: refused before the mark,
        // which would otherwise call the intact snapshots pruned half way (and so is a
        // simulated prune, which says what the real one would do).
        // Only the stores that hold the workflow's folder (or cannot say): one closed in
        // a root the workflow never wrote in holds nothing of it.
        let mut holding = Vec::new();
        for (root, path) in self.roots.iter().zip(&self.root_paths) {
            let here = super::workflow_folder_in(root, wf);
            if here.is_ok() {
                holding.push(path.display().to_string());
            }
            if here.is_ok() || here.is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
            {
                root.store_open()?;
            }
        }
        if simulated {
            return Ok(Some((judged, Before::Unmarked)));
        }
        // A commit log entry must not outlive the snapshot it would recreate.
        let _synced = self.settle_commit_log(wf)?;
        let before = self.mark_pruned(wf, holding)?;
        Ok(Some((judged, before)))
    }

    /// The refusal `r` of a prune of `wf` that moved none of its folders, once the
    /// prune's mark is withdrawn (`before`: what the record held): its rollback is then
    /// as it was, and said so.
    fn withdraw_mark(&self, wf: &str, before: &Before, r: crate::Refusal) -> crate::Refusal {
        let withdrawn = match before {
            Before::Unmarked => self.state.remove_prune_mark(wf),
            Before::Marked(m) => self.state.write_prune_mark(wf, m),
            Before::Damaged => return r,
        };
        let then = match withdrawn {
            Ok(()) => "nothing of the workflow was moved, and its rollback is as it was".to_owned(),
            Err(e) => format!(
                "nothing of the workflow was moved, but the prune's mark could not be withdrawn ({}), so the writes it covers count as pruned: a rollback leaves them as they are (later writes roll back), and a later prune removes their snapshots with the workflow's",
                crate::error::state_io_words(&e)
            ),
        };
        crate::Refusal::new(r.reason_code, format!("{}; {then}", r.reason))
    }
}
