//! Start-up recovery of an interrupted rollback: the restores its marks record are
//! audited, and the rollback is left for the operator to run again.
//!
//! A rollback marks the workflow's record `rolling_back` (durably) before it restores
//! anything. If it dies between a restore and that step's record, the next start walks the
//! workflow's unmarked snapshots newest first per target and records each one whose target
//! holds the action's `before` checksum, stopping at the first whose target still holds the
//! action's result, or anything else. Only when the record says the rollback was forced
//! does it pass over a step whose backup is damaged or gone: a forced rollback passes over
//! such a *spent* step, and the older restores beneath it may have been made; an unforced
//! one, a failed run's own among them, holds them back. Since a rollback names the step it
//! is restoring on its record (`restoring`), a start in the boot the record was written in
//! credits no other unmarked step with a restore, whatever its file holds (someone may have
//! changed it by hand while the process was down); after a crash of the machine the record
//! may be older than the last step, and every step is judged by its file.
//!
//! A step's mark is written before its audit line: a process that dies between the two (a
//! rollback, or a run undoing its failure) leaves a marked snapshot the trail does not
//! mention, and recovery audits it from the mark, which names the restoring execution, the
//! restored checksum and, for a rollback, what the target held before the restore, so that
//! the line says what a forced restore overwrote.

use super::{InflightRecord, Recovered, dead_makers, named_temp_files};
use crate::audit::{AuditRecord, AuditStatus, SandboxAuditEntry};
use crate::confine::RelPath;
use crate::reason::ReasonCode;
use crate::sandbox::{Restorer, Sandbox, TargetState};
use crate::snapshot::SnapshotMeta;
use std::collections::{HashMap, HashSet};

impl Sandbox {
    /// A rollback died. It restored targets newest first and recorded each step after
    /// its restore, so at most the step in progress is unrecorded: per target, newest
    /// first, an unmarked snapshot of an action audited as done whose target holds the
    /// action's `before` checksum was restored by it and is recorded now; one whose target
    /// still holds the action's result, or anything else, ends the walk for that target,
    /// as does, when its record is of this boot, one that was not the step under way.
    pub(super) fn recover_rollback(&self, rec: &InflightRecord) -> Recovered {
        let mut report = Recovered {
            execution_id: rec.execution_id.clone(),
            workflow_id: rec.workflow_id.clone(),
            rollback: true,
            ..Recovered::default()
        };
        // Read, or nothing is judged: an empty view would take every step for undone.
        let Some(entries) = report.read(self.audit.by_workflow(&rec.workflow_id)) else {
            return report;
        };
        // Which steps the dead rollback passed over as spent, when its record does not
        // say whether it was forced (an older version wrote it): those whose restore it
        // recorded failed for want of a usable backup.
        let passed_over = match rec.forced {
            None => passed_over_as_spent(&entries, &rec.execution_id),
            Some(_) => HashSet::new(),
        };
        // Made restores: done, or put back but not confirmed (a failed line).
        report.restores_on_trail = entries
            .iter()
            .filter(|e| {
                e.execution_id == rec.execution_id
                    && ((e.mutation_class == Some(crate::catalog::MutationClass::Rollback)
                        && e.status == crate::audit::AuditStatus::RolledBack)
                        || e.is_unconfirmed_restore())
            })
            .count();
        let done = standing_results(entries);
        let Some(mut snaps) = self.dead_run_snapshots(rec, &mut report) else {
            return report;
        };
        // A failed run's own rollback (its record names the run, whose snapshots carry
        // its id) undid that run's actions alone; a rollback's own id names none.
        report.failed_run_rollback = snaps
            .iter()
            .any(|(_, s)| s.meta.execution_id == rec.execution_id);
        if report.failed_run_rollback {
            snaps.retain(|(_, s)| s.meta.execution_id == rec.execution_id);
        }
        let removed;
        (report.unjudged, removed) = self.unjudged(
            rec,
            snaps
                .iter()
                .filter(|(_, s)| !s.restored && done.contains_key(&s.meta.action_id)),
        );
        report.temp_files_removed += removed;
        if !report.unjudged.is_empty() {
            report.retry = true;
            return report;
        }
        // A restore writes its bytes aside first (and its mark): the dead rollback's
        // temporary files may lie beside any of the workflow's targets.
        let makers = dead_makers(rec);
        let named = named_temp_files(snaps.iter().map(|(i, s)| (*i, &s.meta)), &makers);
        self.remove_dead_temp_files(&makers, HashSet::new(), &named, &mut report);
        // The restores marked before the death, whose lines were held or cut off, were
        // made before those the walk finds: recorded first, so that each file's lines
        // follow its restores, and the walk's lines start from what they left.
        let earlier = self
            .failpoints
            .check("recovery_audit")
            .and_then(|()| self.try_record_marked_restores(&rec.workflow_id));
        let records = self.walk_dead_restores(rec, snaps, &done, &passed_over, &mut report);
        // Each restore is marked before its line is written: lines that cannot be written
        // now are written from the marks by a later try, for which the record is kept
        // (closed, nothing would ever write them, and the trail would go on naming the
        // workflow's writes as what the files hold).
        match earlier.and_then(|n| self.audit.append(records).map(|_| n)) {
            Ok(n) => report.restores_recorded += n,
            Err(e) => {
                report.restores_recorded = 0;
                report.restores_unaudited(&e);
            }
        }
        report
    }

    /// The walk of [`Sandbox::recover_rollback`]: per target, newest first, each unmarked
    /// snapshot of an action `done` says stands, judged until one ends the walk for its
    /// target. Returns the trail lines of the restores found made and marked now.
    fn walk_dead_restores(
        &self,
        rec: &InflightRecord,
        snaps: crate::sandbox::RootedSnapshots,
        done: &HashMap<String, Option<String>>,
        passed_over: &HashSet<String>,
        report: &mut Recovered,
    ) -> Vec<AuditRecord> {
        let mut settled: HashSet<(usize, String)> = HashSet::new();
        let mut records = Vec::new();
        for (i, s) in snaps.into_iter().rev() {
            let key = (i, s.meta.original_path.clone());
            if s.restored {
                continue;
            }
            let Some(after) = done.get(&s.meta.action_id) else {
                continue;
            };
            if settled.contains(&key) {
                report.not_rolled_back += 1;
                continue;
            }
            let spent = rec
                .forced
                .unwrap_or_else(|| passed_over.contains(&s.meta.action_id));
            match self.dead_restore(rec, (i, &s.meta), after, spent, report) {
                DeadRestore::NotMade => {
                    settled.insert(key);
                    report.not_rolled_back += 1;
                }
                DeadRestore::Spent => report.not_rolled_back += 1,
                // The record is kept: the start that reads the target, or writes the
                // mark, records the restore (the step under way is named on it).
                DeadRestore::Unmarked => {
                    report.retry_for(
                        "a restore it made could not be marked so (the log says why)".to_owned(),
                    );
                }
                DeadRestore::Unjudged(why) => {
                    settled.insert(key);
                    report.retry_for(why);
                }
                DeadRestore::Marked(line) => {
                    records.push(*line);
                    report.restores_recorded += 1;
                }
            }
        }
        records
    }

    /// One unmarked snapshot of an action the trail says stands (`after`: what it left),
    /// newest first for its target: whether the dead rollback restored it, and if so
    /// its mark, written now, and its trail line to write.
    /// `may_be_spent`: the dead rollback may have passed over this step, were its backup
    /// damaged or gone (it was forced). The folders its action made that are removed
    /// here are counted in `report`.
    fn dead_restore(
        &self,
        rec: &InflightRecord,
        (i, meta): (usize, &SnapshotMeta),
        after: &Option<String>,
        may_be_spent: bool,
        report: &mut Recovered,
    ) -> DeadRestore {
        // Restored: the target is as the action found it and not as it left it.
        // Compared as states, not checksums: a directory has none, and a removed
        // `create_directory` is told from a standing one only by what is there.
        let now = self.target_state(i, &meta.target());
        if let TargetState::Failed(why) | TargetState::Denied(why) = &now {
            return DeadRestore::Unjudged(self.target_unread(i, meta, why));
        }
        let as_left = if meta.is_directory_action() {
            TargetState::Directory
        } else {
            after
                .clone()
                .map_or(TargetState::Missing, TargetState::File)
        };
        if now == as_left {
            return DeadRestore::NotMade;
        }
        if now != TargetState::found_by(meta) {
            // Its backup damaged or gone, a forced rollback passed over it, and the
            // older restores may have given its file back: the walk goes on. (An
            // unforced one, a failed run's own among them, holds them back.)
            if may_be_spent && self.backup_unusable(i, meta) {
                return DeadRestore::Spent;
            }
            return DeadRestore::NotMade;
        }
        // Not the step under way when it died: whatever its file holds now, someone
        // else put it there (the record's step, not synced, is read in the same boot
        // only). Only that one can have been made and left unmarked, unless its mark
        // could not be written.
        if rec.names_another_step(&meta.action_id) {
            return DeadRestore::NotMade;
        }
        let current = now.checksum();
        // The dead rollback put the target back; the directories its action made on
        // the way are finished here as the restore would have (removed, or left on
        // the ledger).
        // Counted by looking, before and after: the ledger's list is empty too when
        // the folders could not be looked at.
        let standing = || {
            meta.created_dirs
                .iter()
                .filter(|d| **d != meta.original_path)
                .filter(|d| {
                    let rel = RelPath::from_recorded(d);
                    self.roots[i].dir_id(&rel).is_ok_and(|id| id.is_some())
                })
                .count()
        };
        let made_standing = standing();
        let left = self.settle_created_dirs(i, meta);
        report.folders_removed += made_standing.saturating_sub(standing());
        // What the restore replaced is on no mark: the trail's last word on the
        // target says what it held (another workflow's change, under a forced
        // rollback), else the action's own result. Kept on the mark, for a start
        // that audits it should this one's line not be written.
        let before = self
            .last_recorded(i, &meta.target())
            .map_or_else(|| after.clone(), |l| l.after_checksum);
        if let Err(r) = self.mark_restored(
            i,
            meta,
            &rec.execution_id,
            &current,
            &left,
            Restorer::Recovery {
                found: Some(&before),
                said: None,
            },
        ) {
            tracing::warn!(reason = %r, "could not mark a snapshot restored");
            return DeadRestore::Unmarked;
        }
        DeadRestore::Marked(Box::new(self.rollback_record(
            &rec.execution_id,
            &rec.workflow_id,
            i,
            meta,
            before,
            current,
        )))
    }

    /// A restore is marked in its snapshot folder, then audited; a process that died
    /// between the two left a marked snapshot the audit trail does not mention. Each is
    /// audited now, from its mark, so that the trail's newest record of a file says what
    /// it holds. Returns how many.
    pub(super) fn record_marked_restores(&self, workflow_id: &str) -> usize {
        self.try_record_marked_restores(workflow_id)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "recovery could not audit marked restores");
                0
            })
    }

    /// [`Sandbox::record_marked_restores`], saying when the audit append failed.
    pub(super) fn try_record_marked_restores(&self, workflow_id: &str) -> std::io::Result<usize> {
        let records: Vec<AuditRecord> = self
            .marked_unrecorded(workflow_id)?
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        let n = records.len();
        if n > 0 {
            self.audit.append(records)?;
        }
        Ok(n)
    }

    /// The audit records of the restores of `workflow_id` that are marked but not on the
    /// trail, in the order they were made.
    /// Each with when it was made (empty when its mark does not say).
    pub(super) fn marked_unrecorded(
        &self,
        workflow_id: &str,
    ) -> std::io::Result<Vec<(String, AuditRecord)>> {
        let entries = self.audit.by_workflow(workflow_id)?;
        let recorded: HashSet<&str> = entries
            .iter()
            .filter(|e| e.status == AuditStatus::RolledBack)
            .map(|e| e.action_id.as_str())
            .collect();
        let mut records = Vec::new();
        // A trail or store that fails now (busy, a disk error) keeps the restores for a
        // later try; a store that cannot be used as it stands leaves none to record.
        let snaps = match self.trusted_workflow_snapshots(workflow_id) {
            Ok((s, _)) => s,
            Err(r) if r.reason_code == crate::ReasonCode::Conflict => {
                return Err(crate::confine::state::LockBusy::error(r.reason));
            }
            Err(r) if r.reason_code == crate::ReasonCode::IoError => {
                return Err(std::io::Error::other(r.reason));
            }
            Err(_) => Vec::new(),
        };
        // In the order the restores were made, as their marks' times say (a run's undo
        // carries the id of the run's start, which another workflow's restore of the
        // same file may follow); marks without a time by their rollbacks' time-ordered
        // ids, each newest first. Read in order, the trail then leaves each target as
        // the restores did.
        for (i, s) in snaps.into_iter().rev() {
            if !s.restored || recorded.contains(s.meta.action_id.as_str()) {
                continue;
            }
            let Some(mark) =
                crate::snapshot::Snapshotter::restored_mark(&self.roots[i], &self.seal, &s.meta)
            else {
                tracing::warn!(action = %s.meta.action_id, "unreadable restored mark left unaudited");
                continue;
            };
            // What the target held before the restore: as its mark says, else (a mark
            // from before marks said it) the action's result, when it was audited as done.
            let before = mark.before_checksum.clone().unwrap_or_else(|| {
                entries
                    .iter()
                    .rev()
                    .find(|e| e.action_id == s.meta.action_id && e.status == AuditStatus::Success)
                    .and_then(|e| e.after_checksum.clone())
            });
            let at = mark.restored_at.clone().unwrap_or_default();
            let mut record = self.rollback_record(
                &mark.execution_id,
                workflow_id,
                i,
                &s.meta,
                before,
                mark.restored_checksum,
            );
            record.error = mark.error;
            records.push((at, record));
        }
        // Stable: ties keep the rollbacks' order.
        records.sort_by(|a, b| a.1.execution_id.cmp(&b.1.execution_id));
        records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(records)
    }
}

/// What the dead rollback did to one target, as [`Sandbox::dead_restore`] finds it.
enum DeadRestore {
    /// Not restored (the target is not as the action found it, or still as it left
    /// it): the walk for that target ends.
    NotMade,
    /// Not restored, its backup damaged or gone, and the target no longer as it left it:
    /// a forced rollback passed over it, and the walk goes on to the older restores.
    Spent,
    /// Restored, but its mark could not be written (logged): left for a later start.
    Unmarked,
    /// Its target could not be read (why): no guess is made, the rollback is left for
    /// a start that can read it.
    Unjudged(String),
    /// Restored and marked: the trail line to write.
    Marked(Box<AuditRecord>),
}

/// The actions whose restore the rollback `execution_id` recorded failed for want of a
/// usable backup (`checksum_mismatch`, `no_rollback_data`).
fn passed_over_as_spent(entries: &[SandboxAuditEntry], execution_id: &str) -> HashSet<String> {
    entries
        .iter()
        .filter(|e| {
            e.execution_id == execution_id
                && e.status == AuditStatus::Failed
                && matches!(
                    e.reason_code,
                    Some(ReasonCode::ChecksumMismatch | ReasonCode::NoRollbackData)
                )
        })
        .map(|e| e.action_id.clone())
        .collect()
}

/// What each action of a workflow's trail `entries` left (its result's checksum), of
/// those not rolled back since.
fn standing_results(entries: Vec<SandboxAuditEntry>) -> HashMap<String, Option<String>> {
    let mut done = HashMap::new();
    for e in entries {
        match e.status {
            AuditStatus::Success => {
                done.insert(e.action_id, e.after_checksum);
            }
            AuditStatus::RolledBack => {
                done.remove(&e.action_id);
            }
            _ => {}
        }
    }
    done
}
