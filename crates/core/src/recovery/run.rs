//! Start-up recovery of a dead run: each action snapshotted but never audited as done
//! is finished or undone, and the temporary files the run left are removed.
//!
//! The temporary files it removes: the run's own beside its targets (also those of a dead
//! rollback); for a run of an earlier boot (a power cut), its process's anywhere in the
//! run's roots, found by the process's id, since the staged file of a write whose snapshot
//! metadata the cut emptied is named nowhere else once that snapshot is removed as
//! unfinished (the target folders of that process's other runs awaiting recovery are left
//! to them, and a root is walked once per such process); those of the owner claim the
//! run's process was writing at a snapshot store's top; a run record's own when its writer
//! died making it; and, once ten minutes old, those a start killed while making the seal
//! key or the trail's head left at the state directory's top.
//!
//! A dead run's actions are judged newest first, one target at a time: an action is
//! compared with what its target will hold once the newer in-doubt actions on it are
//! undone, and a finished action settles the older ones on the same target. The run is
//! judged once, on the snapshot folders recovery can trust; only when none of the
//! workflow's snapshots can be read at all does it stay unfinished for the next start.
//! Under `batched` an action whose snapshot holds a commit record is finished from it (the
//! staged bytes put in place unless the target already holds them, the missing registry and
//! audit lines appended), and undone when the staged bytes are gone or damaged. A start in
//! the boot the run's record was written in credits no dead run with the undo of an action
//! audited as done whose file is back to what it found, whatever the file holds: someone
//! may have changed it by hand while the process was down, and the trail's line comes after
//! the write.
//!
//! A dead run's locks go with it, so another run may change one of its targets before
//! recovery: an unaudited action whose target another run changed since its snapshot (the
//! trail says so, or the target holds neither its `before` nor its result) is never redone,
//! finished from the commit log, nor restored over that change. It is recorded as done when
//! it had reached the file (its artifact is registered, or the first change made after its
//! snapshot found its result), else marked undone and audited as rolled back. "Another run"
//! is judged by target, not by the text of its path: a process given the root through a
//! symlink records the same file under another path. Nor does recovery take another
//! workflow's write-back of a file's old bytes for the undo of an audited write. A
//! registered write of the dead run that no trusted snapshot stands for (its folder
//! removed, or holding another action's record) landed, since registration follows the
//! write: it is recorded as done with nothing to roll it back, its line saying so.
//!
//! A run one of whose failed actions could not be undone leaves its record `active`, so
//! that the next run of the workflow or the next start judges that action against the disk
//! as after a crash (its change stood on no line of the trail when both its audit line and
//! its undo failed).

use super::{
    InflightRecord, Recovered, TempNames, child, dead_makers, found_its_result, named_temp_files,
    needs_recovery,
};
use crate::audit::{AuditRecord, AuditStatus};
use crate::confine::RelPath;
use crate::confine::path::ROLLBACK_DIR;
use crate::confine::root::{remove_temp_files, remove_temp_named, temp_files_made_by};
use crate::reason::{ReasonCode, Refusal};
use crate::sandbox::{Restorer, Sandbox, TargetState, lock_or_recover};
use cap_fs_ext::DirExt;
use std::collections::{HashMap, HashSet};

/// What the trail and the registry say of a dead run, read before any of its actions
/// is judged.
struct DeadRun<'a> {
    /// Its record.
    rec: &'a InflightRecord,
    /// What the dead run audited: every outcome, and for successes the checksum the
    /// target should now have.
    audited: HashMap<String, Option<Option<String>>>,
    /// What its workflow registered.
    registered: Vec<crate::artifact::ArtifactEntry>,
}

/// What judging a dead run's actions left to do.
struct Judged {
    /// The folders (root index, components) of the run's targets, where its temporary
    /// files may be.
    dirs: HashSet<(usize, Vec<String>)>,
    /// The actions to undo, newest first.
    in_doubt: crate::sandbox::RootedSnapshots,
    /// The success lines of the actions judged finished, newest first.
    finish_audits: Vec<AuditRecord>,
}

impl Sandbox {
    pub(super) fn recover_run(&self, rec: &InflightRecord) -> Recovered {
        let mut report = Recovered {
            execution_id: rec.execution_id.clone(),
            workflow_id: rec.workflow_id.clone(),
            ..Recovered::default()
        };
        let Some(audited) = self.audited_outcomes(rec, &mut report) else {
            return report;
        };
        let Some(snaps) = self.dead_run_snapshots(rec, &mut report) else {
            return report;
        };
        let Some(registered) = report.read(self.registry.get_by_workflow(&rec.workflow_id)) else {
            return report;
        };
        let run = DeadRun {
            rec,
            audited,
            registered,
        };
        let mine: Vec<_> = snaps
            .into_iter()
            .filter(|(_, s)| s.meta.execution_id == rec.execution_id)
            .collect();
        // Every target of the run stays as judged until it is finished or restored:
        // other workflows may be writing (recovery also runs in a live process, at the
        // next run of the dead one's workflow).
        let Some(_held) = self.lock_run_targets(&mine, &mut report) else {
            return report;
        };
        if !self.all_judgeable(&run, &mine, &mut report) {
            return report;
        }
        let orphans = self.registered_without_snapshot(&run, &mine);
        let makers = dead_makers(rec);
        let named = named_temp_files(mine.iter().map(|(i, s)| (*i, &s.meta)), &makers);
        let Some(judged) = self.judge_newest_first(&run, mine, &mut report) else {
            return report;
        };
        self.audit_finished(judged.finish_audits, orphans, &mut report);
        // Temporary files first: a directory the run created is only empty, and so
        // removable by the restore, once they are gone.
        self.remove_dead_temp_files(&makers, judged.dirs, &named, &mut report);
        if !report.retry {
            self.remove_power_cut_leftovers(rec, &mut report);
        }
        self.undo_in_doubt(rec, judged.in_doubt, &mut report);
        match self.try_record_marked_restores(&rec.workflow_id) {
            Ok(n) => report.restores_recorded += n,
            Err(e) => report.restores_unaudited(&e),
        }
        report
    }

    /// What the dead run audited (see [`DeadRun::audited`]); `None` (the recovery left
    /// for a later try) when the trail cannot be read.
    fn audited_outcomes(
        &self,
        rec: &InflightRecord,
        report: &mut Recovered,
    ) -> Option<HashMap<String, Option<Option<String>>>> {
        let mut audited: HashMap<String, Option<Option<String>>> = HashMap::new();
        // Read, or nothing is judged: an empty view would take every action for
        // unaudited, and undo finished ones.
        let entries = report.read(self.audit.by_workflow(&rec.workflow_id))?;
        for e in entries {
            if e.execution_id != rec.execution_id || e.status == AuditStatus::Simulated {
                continue;
            }
            let after = (e.status == AuditStatus::Success).then_some(e.after_checksum);
            audited.insert(e.action_id, after);
        }
        Some(audited)
    }

    /// The locks of the targets of the dead run's snapshots (`mine`), held by the caller
    /// until they are finished or restored; `None` (the recovery left for a later try)
    /// when they cannot be taken.
    fn lock_run_targets(
        &self,
        mine: &[(usize, crate::snapshot::StoredSnapshot)],
        report: &mut Recovered,
    ) -> Option<Vec<crate::confine::state::HeldLock<'_>>> {
        match self.lock_targets(mine.iter().map(|(i, s)| (*i, s.meta.target()))) {
            Ok(h) => Some(h),
            Err(r) => {
                report.busy = (r.reason_code == ReasonCode::Conflict).then_some(r.reason);
                report.retry = true;
                None
            }
        }
    }

    /// Whether every target of the dead run's snapshots (`mine`) that a verdict depends
    /// on can be judged; if not, the recovery is left for a later try, and `report` says
    /// why (see [`Recovered::unjudged`]).
    fn all_judgeable(
        &self,
        run: &DeadRun<'_>,
        mine: &[(usize, crate::snapshot::StoredSnapshot)],
        report: &mut Recovered,
    ) -> bool {
        // Only never-audited actions await a verdict that depends on what their targets
        // hold; an audited one whose target cannot be looked at is judged finished later.
        let removed;
        (report.unjudged, removed) = self.unjudged(
            run.rec,
            mine.iter()
                .filter(|(_, s)| !s.restored && !run.audited.contains_key(&s.meta.action_id)),
        );
        report.temp_files_removed += removed;
        if !report.unjudged.is_empty() {
            report.retry = true;
            return false;
        }
        true
    }

    /// The success lines of the dead run's registered writes that none of its trusted
    /// snapshots (`mine`) stands for.
    fn registered_without_snapshot(
        &self,
        run: &DeadRun<'_>,
        mine: &[(usize, crate::snapshot::StoredSnapshot)],
    ) -> Vec<AuditRecord> {
        // Registered writes of the run that no trusted snapshot stands for (its folder was
        // removed, or left alone as untrusted when the snapshots were read): registered
        // after it landed, so done. Recorded as such, with nothing to roll back, rather
        // than left off the trail for good while the registry lists them.
        let snapshotted: HashSet<&str> = mine
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        run.registered
            .iter()
            .filter(|e| {
                e.generated_by_action == format!("{}/{}", run.rec.execution_id, e.action_id)
                    && !run.audited.contains_key(&e.action_id)
                    && !snapshotted.contains(e.action_id.as_str())
            })
            .map(|e| self.done_without_snapshot(run.rec, e))
            .collect()
    }

    /// Judges the dead run's actions (`mine`, oldest first) newest first: each finished,
    /// recorded as superseded, or left in doubt, to be undone; `None` (the recovery
    /// left for a later try) when a target cannot be read.
    fn judge_newest_first(
        &self,
        run: &DeadRun<'_>,
        mine: crate::sandbox::RootedSnapshots,
        report: &mut Recovered,
    ) -> Option<Judged> {
        let mut judged = Judged {
            dirs: HashSet::new(),
            in_doubt: Vec::new(),
            finish_audits: Vec::new(),
        };
        // Newest first, one target at a time: an action is judged against what its
        // target holds once the newer in-doubt actions on it are undone, and once one is
        // finished the older ones on the same target are too (their result was its
        // starting point, so the target cannot hold it any more).
        let mut settled: HashSet<(usize, String)> = HashSet::new();
        let mut expected: HashMap<(usize, String), Option<String>> = HashMap::new();
        for (i, s) in mine.into_iter().rev() {
            judged
                .dirs
                .insert((i, s.meta.target().parent_components().to_vec()));
            let key = (i, s.meta.original_path.clone());
            if s.restored || settled.contains(&key) {
                continue;
            }
            let current = match expected.get(&key) {
                Some(c) => Ok(c.clone()),
                None => match self.target_state(i, &s.meta.target()) {
                    TargetState::File(sum) => Ok(Some(sum)),
                    TargetState::Failed(why) | TargetState::Denied(why) => Err(why),
                    _ => Ok(None),
                },
            };
            let judgement = current.and_then(|current| {
                expected.insert(key.clone(), current.clone());
                self.judge_action(run, i, &s.meta, current, &mut judged.finish_audits, report)
            });
            let settled_now = match judgement {
                Ok(settled_now) => settled_now,
                // A disk's failure is no change by anyone: judged on it, an action would
                // be called overwritten or undone on a guess. The run is left for a
                // start that can read it (what was settled before stands).
                Err(why) => {
                    report.retry_for(self.target_unread(i, &s.meta, &why));
                    return None;
                }
            };
            if settled_now {
                settled.insert(key);
            } else {
                // Undone once all are judged: the target will hold what it held before
                // this action.
                expected.insert(key, s.meta.sha256.clone());
                judged.in_doubt.push((i, s));
            }
        }
        Some(judged)
    }

    /// Judges one action of the dead run against what its target holds (`current`, once
    /// the newer in-doubt actions on it are undone): whether it is settled (finished,
    /// its success line added to `finish_audits` when it needs one, or recorded as
    /// superseded); if not, it is to be undone. `Err` (why) when the disk would not
    /// say what the target holds.
    fn judge_action(
        &self,
        run: &DeadRun<'_>,
        i: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: Option<String>,
        finish_audits: &mut Vec<AuditRecord>,
        report: &mut Recovered,
    ) -> Result<bool, String> {
        let outcome = run.audited.get(&meta.action_id);
        // Never audited, and another run changed the target since (the dead run's
        // locks went with it): the trail says so, or the target holds neither what it
        // held before nor what the action writes. That change is theirs to keep;
        // this action is recorded as what it was, done or not, and never redone or
        // restored over it.
        let first_change = outcome
            .is_none()
            .then(|| self.first_change_by_another(i, meta, true))
            .flatten();
        if outcome.is_none()
            && ((current != meta.after_sha256
                && !self.back_to_before(i, meta, current.as_deref())?)
                || first_change.is_some())
        {
            finish_audits.extend(self.settle_superseded(
                run,
                i,
                meta,
                current.as_ref(),
                first_change.as_ref(),
                report,
            ));
            return Ok(true);
        }
        if self.finish_from_commit(i, meta, outcome, current.as_deref(), report)? {
            return Ok(true);
        }
        // Written and registered, not yet audited (the run died between the two
        // appends): finished by auditing it, so the registry never lists an
        // artifact the trail does not.
        let made_by = format!("{}/{}", meta.execution_id, meta.action_id);
        if outcome.is_none()
            && current.is_some()
            && current == meta.after_sha256
            && run.registered.iter().any(|e| {
                e.generated_by_action == made_by && Some(&e.checksum_sha256) == current.as_ref()
            })
        {
            finish_audits.push(self.done_record(i, meta));
            report.completed += 1;
            return Ok(true);
        }
        self.stands_finished(run.rec, i, meta, current, outcome)
    }

    /// Settles a never-audited action of the dead run whose target was changed since by
    /// another run (`first_change`: the first such change the trail records) or, with
    /// none recorded, by what the target holds: counted finished when its write landed
    /// (with the success line to append, if it needs one), else superseded, recorded as
    /// undone, the target left as the later writer left it.
    fn settle_superseded(
        &self,
        run: &DeadRun<'_>,
        i: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: Option<&String>,
        first_change: Option<&crate::audit::SandboxAuditEntry>,
        report: &mut Recovered,
    ) -> Option<AuditRecord> {
        let landed = self.settle_overwritten(i, meta, &run.registered, first_change);
        match landed {
            Some(Ok(record)) => {
                report.completed += 1;
                record
            }
            // Logs left incomplete are completed by the recovery that retries.
            Some(Err(e)) => {
                report.completed += 1;
                report.writes_unaudited(&e);
                None
            }
            None => {
                // Its temporary file first: a folder it made that holds only
                // that is empty, and removed rather than put on the ledger.
                let dir = (i, meta.target().parent_components().to_vec());
                let makers = dead_makers(run.rec);
                self.remove_dead_temp_files(
                    &makers,
                    HashSet::from([dir]),
                    &TempNames::new(),
                    report,
                );
                self.undo_superseded(i, meta, run.rec, current);
                report.superseded += 1;
                None
            }
        }
    }

    /// Finishes an action of the dead run from its commit record (see
    /// [`Sandbox::finish_commit`]), unless it was audited as failed; whether the commit
    /// record settled it (also when nothing was left to change).
    fn finish_from_commit(
        &self,
        i: usize,
        meta: &crate::snapshot::SnapshotMeta,
        outcome: Option<&Option<Option<String>>>,
        current: Option<&str>,
        report: &mut Recovered,
    ) -> Result<bool, String> {
        if let (Some(c), None | Some(Some(_))) = (&meta.commit, outcome)
            && let Some(finished) = self.finish_commit(i, meta, c, outcome.is_some(), current)?
        {
            // Logs left incomplete are completed by the recovery that retries.
            match finished {
                Ok(changed) => report.completed += usize::from(changed),
                Err(e) => {
                    report.completed += 1;
                    report.writes_unaudited(&e);
                }
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether an action of the dead run that was neither superseded nor finished from
    /// its commit record or registration stands as finished (`outcome`: what the trail
    /// says of it); if not, it is to be undone.
    fn stands_finished(
        &self,
        rec: &InflightRecord,
        i: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: Option<String>,
        outcome: Option<&Option<Option<String>>>,
    ) -> Result<bool, String> {
        let back = || self.back_to_before(i, meta, current.as_deref());
        Ok(match outcome {
            // Never audited: undone, unless the target holds neither what it held
            // before nor what the action wrote, which is someone else's later write
            // (the action's lock was released when its run died), theirs to keep.
            None => match &meta.after_sha256 {
                Some(after) => current.as_ref() != Some(after) && !back()?,
                None => false,
            },
            // Audited as done: undone only if the target is back to what it held
            // before (with batched syncs the audit line can reach the disk before the
            // target), and, in the boot the run died in, only for the action the run
            // was undoing then (its record names it): the trail's line comes after
            // the write, so the file of another was put back by someone else. Anything
            // else is the result, or a later change by someone else, which is theirs
            // to keep.
            // A directory made has no checksum to compare: it is done while it
            // stands, and undone once gone again as the action found it (the dead run
            // was rolling back its failure; the restore finishes and records that).
            Some(Some(_)) if meta.is_directory_action() => {
                !back()? || rec.names_another_step(&meta.action_id)
            }
            Some(Some(after)) => {
                current == *after
                    || !back()?
                    || rec.names_another_step(&meta.action_id)
                    || self.put_back_by_another(i, meta, &current, true)
            }
            Some(None) => true,
        })
    }

    /// Appends the success lines of the actions judged finished (`finish_audits`, newest
    /// first) and of the registered writes no snapshot stands for (`orphans`).
    fn audit_finished(
        &self,
        mut finish_audits: Vec<AuditRecord>,
        orphans: Vec<AuditRecord>,
        report: &mut Recovered,
    ) {
        // Judged newest first; audited in the order they ran.
        finish_audits.reverse();
        report.completed += orphans.len();
        finish_audits.extend(orphans);
        if !finish_audits.is_empty()
            && let Err(e) = self.audit.append(finish_audits)
        {
            tracing::error!(error = %e, "recovery could not audit a dead run's registered writes");
            report.writes_unaudited(&e);
        }
    }

    /// Undoes the dead run's actions left in doubt (`in_doubt`), counting them in
    /// `report`, with those that could not be undone and, when the disk stopped the
    /// undo, why the recovery is left for a later try.
    fn undo_in_doubt(
        &self,
        rec: &InflightRecord,
        in_doubt: crate::sandbox::RootedSnapshots,
        report: &mut Recovered,
    ) {
        let steps = self.restore_all(
            &crate::plan::new_execution_id(),
            &rec.workflow_id,
            in_doubt,
            crate::metrics::RollbackReason::Recovery,
            crate::sandbox::RestoreMode::Force,
            None,
        );
        report.rolled_back = steps.iter().filter(|s| s.restored).count();
        // What may pass, or the operator put right: the disk (full, read-only, failing),
        // a permission (the target's folder closed to this process, the snapshot store
        // not private), a folder another program moved meanwhile. A damaged backup never
        // comes back.
        let passing = |code: Option<ReasonCode>| {
            matches!(
                code,
                Some(ReasonCode::IoError | ReasonCode::Conflict | ReasonCode::ReservedPath)
            )
        };
        if let Some(stopped) = steps.iter().find(|s| !s.restored && passing(s.reason_code)) {
            // The record is kept for a later try. Closed, the dead run's write would
            // stand for good, its only line saying that its undo failed.
            report.why = Some(format!(
                "an unfinished action could not be undone: {}",
                stopped.reason.as_deref().unwrap_or("the disk refused it")
            ));
            report.retry = true;
        } else {
            report.not_undone = steps
                .iter()
                .filter(|s| !s.restored)
                .map(|s| {
                    format!(
                        "{}: {}",
                        s.action_id,
                        s.reason.as_deref().unwrap_or("not restored")
                    )
                })
                .collect();
        }
    }

    /// Removes the temporary files dead processes (`makers`, see [`dead_makers`]) left
    /// in `dirs` (root index, components), counting them in `report`, and the folders
    /// where they could not be. Once the disk refuses, the rest are left with the record
    /// for the start that finds it taking writes again. Those `named` in a folder (see
    /// [`named_temp_files`]) go by their names first, also from a folder this process
    /// may not list.
    pub(super) fn remove_dead_temp_files(
        &self,
        makers: &[&str],
        mut dirs: HashSet<(usize, Vec<String>)>,
        named: &TempNames,
        report: &mut Recovered,
    ) {
        dirs.extend(named.keys().cloned());
        'dirs: for (i, comps) in dirs {
            let rel = RelPath::from_components(comps.clone());
            let failed =
                |e: std::io::Error| Refusal::new(ReasonCode::IoError, crate::error::io_words(&e));
            let dir = self
                .failpoints
                .check("open_dead_temp_folder")
                .map_err(failed)
                .and_then(|()| {
                    if comps.is_empty() {
                        self.roots[i].dir().try_clone().map_err(failed)
                    } else {
                        self.roots[i]
                            .open_parent(&child(&rel), false, false)
                            .and_then(|(d, _)| d.into_owned().map_err(failed))
                    }
                });
            let d = match dir {
                Ok(d) => d,
                // Gone, and its temporary files with it.
                Err(r) if r.reason_code == ReasonCode::NotFound => continue,
                // The disk refused the look (failing, or out of descriptors): the files
                // are left with the record for a start that can look, not for good.
                Err(r) if r.reason_code == ReasonCode::IoError => {
                    let folder = crate::confine::path::shown_path(&self.abs_path(i, &rel));
                    report.retry_for(format!(
                        "its temporary files in {folder} could not be looked for ({})",
                        r.reason
                    ));
                    break 'dirs;
                }
                // Out of reach for a reason of its own (another user's, or no longer a
                // folder): said where, for the operator.
                Err(r) => {
                    let folder = crate::confine::path::shown_path(&self.abs_path(i, &rel));
                    report.left_in(format!("{folder} ({})", r.reason));
                    continue;
                }
            };
            let folder = self.abs_path(i, &rel);
            // Said once a folder, however many of its files could not be removed.
            let mut left = None;
            let known = named.get(&(i, comps)).into_iter().flatten();
            let remove = |tmp: &str| {
                self.failpoints
                    .check("remove_dead_temp_file")
                    .and_then(|()| remove_temp_named(&d, tmp))
            };
            for tmp in known {
                let removed = remove(tmp);
                if Self::settled(report, &folder, removed, &mut left).is_break() {
                    break 'dirs;
                }
            }
            // A run or rollback of this process that left its record for later is
            // no dead one: its id names this process's writes under way too.
            let seeds: Vec<&str> = makers
                .iter()
                .filter(|m| !self.is_left_for_later(m))
                .map(|m| crate::ids::process_seed(m))
                .collect();
            // No dead maker's: nothing to list for.
            let listed = (!seeds.is_empty()).then(|| {
                self.failpoints
                    .check("remove_dead_temp")
                    .and_then(|()| temp_files_made_by(&d, &seeds))
            });
            match listed.unwrap_or(Ok(Vec::new())) {
                Ok(names) => {
                    for tmp in &names {
                        let removed = remove(tmp);
                        if Self::settled(report, &folder, removed, &mut left).is_break() {
                            break 'dirs;
                        }
                    }
                }
                // A folder this process may write in but not read (a user other than
                // root's): those known by name went above; others (a replay's, an
                // older version's) cannot be looked for, which the operator is told.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()) => {
                    let shown = crate::confine::path::shown_path(&folder);
                    report.unlisted(shown);
                }
                Err(e) => {
                    if Self::settled(report, &folder, Err(e), &mut left).is_break() {
                        break 'dirs;
                    }
                }
            }
            left.into_iter().for_each(|l| report.left_in(l));
        }
    }

    /// Counts in `report` a temporary file of `folder` `removed` (or found gone), or
    /// keeps in `left` why it could not be, for the operator; `Break` once the disk
    /// refuses (mounted read-only, failing): the rest are kept with the record for the
    /// start that finds it taking writes again, as an undo it refused is, rather than
    /// left in the user's tree for good.
    fn settled(
        report: &mut Recovered,
        folder: &str,
        removed: std::io::Result<bool>,
        left: &mut Option<String>,
    ) -> std::ops::ControlFlow<()> {
        match removed {
            Ok(gone) => report.temp_files_removed += usize::from(gone),
            Err(e) => match Self::left_behind(report, folder, "its temporary files in", e) {
                Some(said) => _ = left.get_or_insert(said),
                None => {
                    left.take().into_iter().for_each(|l| report.left_in(l));
                    return std::ops::ControlFlow::Break(());
                }
            },
        }
        std::ops::ControlFlow::Continue(())
    }

    /// Removes the temporary files of run records whose writers died: a record is made
    /// under its workflow's lock, so one whose lock is free has no writer left. Likewise
    /// those a start killed while it made the state directory's key or the trail's head
    /// left at its top, once they are ten minutes old (no lock covers those: another
    /// process may be making them now).
    pub(super) fn remove_dead_record_temp_files(&self) {
        match self
            .state
            .remove_stale_temp_files(std::time::Duration::from_secs(600))
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                files = n,
                "removed temporary files a dead start left in the state directory"
            ),
            Err(e) => {
                // Listing the folder may be what failed: there may be none to remove.
                tracing::warn!(error = %e, "could not look for or remove temporary files a dead start may have left in the state directory")
            }
        }
        let Ok(temps) = self.state.inflight_record_temp_files() else {
            return;
        };
        for (name, id) in temps {
            if !crate::plan::is_valid_id(&id) {
                continue;
            }
            if let Ok(Some(_lock)) = self.state.try_lock_workflow(&id) {
                match self.state.inflight_remove_file(&name) {
                    Ok(()) => tracing::info!(file = %name, "removed a dead run's temporary record"),
                    Err(e) => {
                        tracing::warn!(file = %name, error = %e, "cannot remove a dead run's temporary record")
                    }
                }
            }
        }
    }

    /// The workflow's trusted snapshots, once the dead run's temporary files among them
    /// are gone; `None` (the recovery left for a later try) when they cannot be read.
    pub(super) fn dead_run_snapshots(
        &self,
        rec: &InflightRecord,
        report: &mut Recovered,
    ) -> Option<crate::sandbox::RootedSnapshots> {
        report.temp_files_removed += self.remove_dead_snapshot_temp_files(rec, report);
        self.remove_unfinished_snapshots(&rec.workflow_id, report, true);
        let (snaps, untrusted) = match self.trusted_workflow_snapshots(&rec.workflow_id) {
            Ok(s) => s,
            Err(r) => {
                report.why = Some(format!("its snapshots could not be read ({})", r.reason));
                report.why_code = Some(r.reason_code);
                report.retry = true;
                return None;
            }
        };
        // A folder this process is shut out of (its mode, its owner, an access control
        // list) is kept for the operator to give back, and judged then: the record waits
        // for that. Closed now, no start would judge it, and the dead run's write would
        // stand for good, unrecorded. Damaged or forged records are left alone for good.
        if let Some(r) = untrusted
            .iter()
            .find(|r| r.reason_code == ReasonCode::ReservedPath)
        {
            report.why = Some(format!("a snapshot of it could not be read ({})", r.reason));
            report.why_code = Some(r.reason_code);
            report.retry = true;
            return None;
        }
        report.untrusted += untrusted.len();
        Some(snaps)
    }

    /// Removes the temporary files the dead run's process left anywhere in the run's
    /// roots, when the run was cut short by the end of an earlier boot. A power cut can
    /// empty a snapshot's metadata not yet synced (under `batched`) and keep the staged
    /// file its write had made beside its target: once the snapshot is removed as
    /// unfinished (by this recovery or an earlier try of it), nothing names that file or
    /// its folder. Only then: in this boot the process may be alive (a run that left its
    /// record for later), its files elsewhere writes under way; and only where this
    /// process knows its boot (a process that cannot tell takes every record for an
    /// earlier boot's). The folders of the targets of that process's other runs still
    /// awaiting recovery are left to those recoveries (a staged file there may be the
    /// only copy of a committed write); and nothing is removed when those runs cannot
    /// all be told. A root is walked once per process of an earlier boot once no such
    /// run of it is left, not again for each of its runs. Called once the run's own
    /// actions are settled: its committed writes are finished from their staged files
    /// first.
    fn remove_power_cut_leftovers(&self, rec: &InflightRecord, report: &mut Recovered) {
        if rec.boot.is_none() || crate::confine::state::boot_id().is_none() || rec.this_boot() {
            return;
        }
        let seed = crate::ids::process_seed(&rec.execution_id);
        let Some(kept) = self.folders_of_pending_runs(rec, seed) else {
            tracing::warn!(workflow = %rec.workflow_id, "other runs of a dead process await recovery and cannot all be told: the temporary files it may have left elsewhere are not looked for now");
            return;
        };
        let roots: Vec<usize> = (0..self.roots.len())
            .filter(|&i| {
                rec.roots.is_empty() || rec.roots.iter().any(|r| self.roots[i].is_named_by(r))
            })
            .collect();
        for i in roots {
            let key = (i, seed.to_owned());
            if lock_or_recover(&self.swept_for_dead).contains(&key) {
                continue;
            }
            let keep = |comps: &[String]| kept.contains(&(i, comps.to_vec()));
            let mut stopped = false;
            let mut refused = |comps: &[String], e: std::io::Error| {
                let folder = self.abs_path(i, &RelPath::from_components(comps.to_vec()));
                match Self::left_behind(report, &folder, "its temporary files in", e) {
                    Some(left) => {
                        report.left_in(left);
                        true
                    }
                    // The disk refuses: the rest waits for the start that finds it
                    // taking writes again (the record is kept for it).
                    None => {
                        stopped = true;
                        false
                    }
                }
            };
            let removed = crate::confine::root::remove_temp_files_in_tree(
                self.roots[i].dir(),
                crate::confine::path::MAX_PATH_DEPTH,
                seed,
                &keep,
                &mut refused,
            );
            report.temp_files_removed += removed;
            if stopped {
                return;
            }
            if kept.is_empty() {
                lock_or_recover(&self.swept_for_dead).insert(key);
            }
        }
    }

    /// The folders (root index, components) of the targets of the runs, other than
    /// `rec`'s, that the process of `seed` began and that still await recovery; `None`
    /// when the records cannot be listed, such a run's snapshots cannot all be read, or a
    /// record that does not read is being written now (its workflow's lock held).
    fn folders_of_pending_runs(
        &self,
        rec: &InflightRecord,
        seed: &str,
    ) -> Option<HashSet<(usize, Vec<String>)>> {
        let mut kept = HashSet::new();
        for (id, bytes) in self.state.inflight_list().ok()? {
            if id == rec.workflow_id {
                continue;
            }
            let Ok(other) = serde_json::from_slice::<InflightRecord>(&bytes) else {
                // Torn for good (a power cut), its run is judged by no one and its staged
                // files finished by no one; read half rewritten by a recovery under way,
                // it cannot be told.
                match self.state.try_lock_workflow(&id) {
                    Ok(Some(_)) => continue,
                    _ => return None,
                }
            };
            if !needs_recovery(&other) || crate::ids::process_seed(&other.execution_id) != seed {
                continue;
            }
            let (snaps, untrusted) = self.trusted_workflow_snapshots(&other.workflow_id).ok()?;
            if !untrusted.is_empty() {
                return None;
            }
            kept.extend(
                snaps
                    .iter()
                    .map(|(i, s)| (*i, s.meta.target().parent_components().to_vec())),
            );
        }
        Some(kept)
    }

    /// Removes the temporary files the dead run's process left in the workflow's snapshot
    /// folders. Before the snapshots are read: one killed between linking its `meta.json`
    /// into place and unlinking the temporary name left the file with a second link, which
    /// would make the snapshot untrusted. Returns how many; where they could not be
    /// removed is said in `report` (see [`Self::left_behind`]). Unlike
    /// [`Self::remove_dead_temp_files`] it passes over no maker: the workflow's lock, held
    /// here, keeps any snapshot of this process's from being under way in its folders;
    /// and a disk that refuses in one root's folder stops nothing in the others', which
    /// may lie on other disks.
    ///
    /// Also those of an owner claim the process was making at the store's top (its first
    /// snapshot in a root claims the store), whatever the root: the claim comes before
    /// the snapshot folder, so none may name that root. There no lock covers this
    /// process's own claims, so the makers are only other processes' (its own left no
    /// run dead).
    fn remove_dead_snapshot_temp_files(
        &self,
        rec: &InflightRecord,
        report: &mut Recovered,
    ) -> usize {
        let makers = dead_makers(rec);
        let mut removed = 0;
        for root in &self.roots {
            let Ok(rb) = root.dir().open_dir_nofollow(ROLLBACK_DIR) else {
                continue;
            };
            let store = root.path().join(ROLLBACK_DIR);
            for by in makers.iter().filter(|m| !crate::ids::made_here(m)) {
                let gone = remove_temp_files(&rb, 0, Some(by));
                removed += Self::removed_or_said(gone, &store, report);
            }
            let Ok(wf) = rb.open_dir_nofollow(&rec.workflow_id) else {
                continue;
            };
            let folder = store.join(&rec.workflow_id);
            for by in &makers {
                let gone = self
                    .failpoints
                    .check("remove_dead_snapshot_temp")
                    .and_then(|()| remove_temp_files(&wf, 1, Some(by)));
                removed += Self::removed_or_said(gone, &folder, report);
            }
        }
        removed
    }

    /// How many temporary files a removal in the snapshot store's `folder` took; when it
    /// failed, what it left is said in `report` (see [`Self::left_behind`]).
    fn removed_or_said(
        gone: std::io::Result<usize>,
        folder: &std::path::Path,
        report: &mut Recovered,
    ) -> usize {
        match gone {
            Ok(n) => n,
            Err(e) => {
                let folder = folder.display().to_string();
                if let Some(left) = Self::left_behind(report, &folder, "its temporary files in", e)
                {
                    report.left_in(left);
                }
                0
            }
        }
    }

    /// Says what recovery could not remove of a dead run's (`what` at `path`, in the
    /// user's tree or a workflow's snapshot folder): a disk that refuses writes keeps
    /// the run for a start that finds it taking them again (its next start, or the next
    /// use of its workflow), `None`; any other cause is returned in words for the
    /// operator, told once.
    fn left_behind(
        report: &mut Recovered,
        path: &str,
        what: &str,
        e: std::io::Error,
    ) -> Option<String> {
        if disk_refused(&e) {
            let (path, words) = (
                crate::confine::path::shown_path(path),
                crate::error::io_words(&e),
            );
            report.retry_for(format!("{what} {path} could not be removed ({words})"));
            report.refused_in.get_or_insert(format!("{path} ({words})"));
            return None;
        }
        Some(left_words(path, &e))
    }

    /// Removes the workflow's snapshot folders a dead process never finished (see
    /// [`crate::snapshot::Snapshotter::remove_unfinished`]): left, they would keep their
    /// actions' ids used although the trail records no write of them. Counted in
    /// `report`; a folder that cannot be removed stays whole, as a failed snapshot's
    /// would, and is named there for the operator (the others go), unless the disk
    /// refused it and the run is `retried`; so does one of an action the trail cannot
    /// be read about, unnamed.
    pub(super) fn remove_unfinished_snapshots(
        &self,
        workflow_id: &str,
        report: &mut Recovered,
        retried: bool,
    ) {
        let ran = |action: &str| self.audit.ran_action(workflow_id, action).unwrap_or(true);
        for root in &self.roots {
            let store = root.path().join(ROLLBACK_DIR).join(workflow_id);
            let may_remove = || self.failpoints.check("remove_unfinished_snapshot");
            match crate::snapshot::Snapshotter::remove_unfinished(
                root,
                workflow_id,
                ran,
                may_remove,
            ) {
                Ok((removed, left)) => {
                    report.unfinished_snapshots_removed += removed;
                    for (name, e) in left {
                        let path = store.join(name).display().to_string();
                        let left = if retried {
                            Self::left_behind(report, &path, "its unfinished snapshot folder", e)
                        } else {
                            Some(left_words(&path, &e))
                        };
                        report.unfinished_snapshots_left.extend(left);
                    }
                }
                Err(e) => tracing::warn!(
                    workflow = %workflow_id,
                    error = %e,
                    "cannot list the workflow's snapshot folders"
                ),
            }
        }
    }

    /// The success line of a dead run's registered write whose snapshot is gone or not
    /// trusted (see [`crate::audit::DONE_WITHOUT_SNAPSHOT`]).
    fn done_without_snapshot(
        &self,
        rec: &InflightRecord,
        e: &crate::artifact::ArtifactEntry,
    ) -> AuditRecord {
        AuditRecord {
            timestamp: self.now(),
            execution_id: rec.execution_id.clone(),
            workflow_id: e.workflow_id.clone(),
            action_id: e.action_id.clone(),
            mutation_class: crate::catalog::op_for_intent(&e.mutation_type)
                .map(|op| op.mutation_class),
            mutation_type: e.mutation_type.clone(),
            target_path: e.path.clone(),
            before_checksum: None,
            after_checksum: Some(e.checksum_sha256.clone()),
            rollback_available: false,
            rollback_path: None,
            status: AuditStatus::Success,
            reason_code: None,
            error: Some(crate::audit::DONE_WITHOUT_SNAPSHOT.to_owned()),
        }
    }

    /// A dead run's unaudited action whose target another run has written since
    /// (`first_change`: the first such change the trail records). When its write had
    /// landed (its artifact is registered, or that first change found its result), it is
    /// finished without touching the target: `Some` with the audit record to append
    /// (`Ok(None)` inside when the commit record's own were appended, `Err` when they
    /// could not be, for a later recovery to finish). Otherwise it never
    /// landed: its staged bytes are discarded, and `None` says to
    /// [`undo_superseded`](Self::undo_superseded) it.
    fn settle_overwritten(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        registered: &[crate::artifact::ArtifactEntry],
        first_change: Option<&crate::audit::SandboxAuditEntry>,
    ) -> Option<std::io::Result<Option<AuditRecord>>> {
        let made_by = format!("{}/{}", meta.execution_id, meta.action_id);
        let staged = meta.commit.as_ref().and_then(|c| {
            self.roots[root]
                .find_staged(
                    &meta.target(),
                    &c.staged_name,
                    crate::snapshot::MAX_SNAPSHOT_BYTES,
                )
                .filter(|(_, bytes)| crate::hash::sha256_hex(bytes) == c.after_sha256)
        });
        // A commit record's staged file is made after the record: its absence proves
        // nothing, its presence with the new bytes that the rename never happened (the
        // exchange that puts them in place leaves the replaced file under that name
        // until it is removed, which the dead run's temporary files go with).
        let is_registered = registered.iter().any(|e| e.generated_by_action == made_by);
        let landed = staged.is_none()
            && (is_registered || first_change.is_some_and(|first| found_its_result(meta, first)));
        if landed {
            return Some(match &meta.commit {
                Some(c) => self.complete_logs(c, false).map(|_| None),
                None if is_registered => Ok(Some(self.done_record(root, meta))),
                // Its size went with the later write, so no artifact can be registered
                // for it now; the line says so, and `audit verify` then expects none.
                None => Ok(Some(AuditRecord {
                    error: Some(crate::audit::UNREGISTERED_DONE.to_owned()),
                    ..self.done_record(root, meta)
                })),
            });
        }
        if let Some((staged, _)) = staged {
            staged.discard();
        }
        None
    }

    /// Records a dead run's action that never landed, its target written since by
    /// another, as undone: its snapshot marked restored (to be audited as rolled back),
    /// the target left as the later writer left it.
    fn undo_superseded(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        rec: &InflightRecord,
        current: Option<&String>,
    ) {
        // The folders the action made on the way stay with the later write in them: on
        // the ledger, as a rollback leaves them, for the restore that empties them to
        // remove (not a folder of the later writer's, which found them there).
        let left = self.settle_created_dirs(root, meta);
        // Its line says the undo changed nothing: the bytes are the later writer's, and
        // a reader of the trail (a rollback naming who left a file as it is) must not
        // take this line for their change.
        let current = current.cloned();
        // The change may be another folder put in the one's place the action wrote in,
        // its file living on where that went: the line says so.
        let said = crate::snapshot::RollbackEngine::folder_replaced(&self.roots[root], meta)
            .map(|dir| {
                // Where what it replaced is kept, for a person to put back by hand: no
                // rollback will (this line records the action undone).
                let kept = match meta.kind {
                    crate::snapshot::SnapshotKind::File => format!(
                        "; what the file held before the action is kept in {} until the workflow is pruned",
                        crate::confine::path::shown_path(&format!(
                            "{}/{}",
                            meta.rollback_path(),
                            crate::snapshot::BACKUP_FILE
                        ))
                    ),
                    _ => String::new(),
                };
                format!(
                    "left as it is: the directory {} holding it is not the one the action wrote in (that was moved away, where what the action wrote may live on, or removed, and another put in its place); nothing could be checked{kept}",
                    crate::confine::path::shown_path(&dir)
                )
            });
        if let Err(r) = self.mark_restored(
            root,
            meta,
            &rec.execution_id,
            &current,
            &left,
            Restorer::Recovery {
                found: Some(&current),
                said: said.as_deref(),
            },
        ) {
            tracing::warn!(reason = %r, "could not mark a dead run's overwritten action undone");
        }
    }
}

/// Whether the disk refused `e`'s operation (mounted read-only, failing), which a later
/// start may find put right, as opposed to a refusal that stays (another user's folder).
fn disk_refused(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    use std::io::ErrorKind as K;
    // Full, or a call interrupted, as much as read-only or failing: each may pass; so
    // may a process out of descriptors or memory (a folder's list), as where a folder
    // could not be opened.
    matches!(
        e.kind(),
        K::ReadOnlyFilesystem | K::StorageFull | K::QuotaExceeded | K::Interrupted | K::OutOfMemory
    ) || [Errno::IO, Errno::MFILE, Errno::NFILE, Errno::NOMEM]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// `path` (shown as to people) and why it could not be removed, for the operator.
fn left_words(path: &str, e: &std::io::Error) -> String {
    format!(
        "{} ({})",
        crate::confine::path::shown_path(path),
        crate::error::io_words(e)
    )
}
