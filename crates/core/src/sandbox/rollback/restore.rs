//! The restore pass: each chosen snapshot put back, verified, marked and recorded.
//!
//! A rollback records each step (its restored mark and its audit line) as soon as the
//! step's restore is durable, before the next step starts, so a rollback that dies leaves
//! the tree agreeing with the audit trail. Under `batched` one sync separates a restore
//! from its record (no mark can be durable before the bytes it vouches for), and another
//! comes before a step on a file an earlier step restored: that restore, synced on its own,
//! would otherwise reach the disk ahead of the step's record, and a power cut would leave
//! the file as neither left it, unrecorded. A step's mark is written before its audit line.
//! Before it touches each step's target, a rollback (or a run undoing its own writes) names
//! that step's action on its record (`restoring`, in place, not synced: a killed process
//! leaves it in the page cache). A restore that fails leaves the older restores of that
//! file waiting for it, said as such rather than as someone's change.

use super::beneath::Beneath;
use super::{HELD_TRAIL, RollbackStep};
use crate::audit::{AuditRecord, AuditStatus};
use crate::catalog::MutationClass;
use crate::confine::RelPath;
use crate::confine::path::shown_path;
use crate::confine::root::Put;
use crate::confine::state::LockBusy;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::conflicts::{Conflict, TargetState};
use crate::sandbox::{RootedSnapshots, Sandbox};
use crate::snapshot::{
    Forced, LeftDir, ROLL_BACK_AGAIN, RollbackEngine, SnapshotKind, SnapshotMeta, Snapshotter,
    StoredSnapshot,
};
use std::collections::{HashMap, HashSet};

/// A run or rollback's record, and its file held open to rewrite it in place.
type OpenRecord = (
    crate::recovery::InflightRecord,
    crate::confine::state::BlockFile,
);

/// What holds for every restore of one [`Sandbox::restore_all`].
struct Pass<'a> {
    workflow_id: &'a str,
    mode: &'a RestoreMode,
    /// Recovery finishing a dead run's undo, which differs from a rollback here and there.
    recovering: bool,
    /// A rollback asked for, which a failed sync stops (a failed action's undo goes on:
    /// what it puts back is what the disk held before, as the next start would).
    asked_for: bool,
}

/// A rollback's record, and the files of the steps whose records may not be durable yet.
type StepRecords<'r> = (
    &'r mut Result<Option<OpenRecord>, Refusal>,
    &'r mut HashSet<(usize, String)>,
);

/// How [`Sandbox::restore_all`] treats each target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RestoreMode {
    /// An action undoing its own change after it failed, holding the target's lock: a
    /// target still as the snapshot found it needs nothing, one holding what the action
    /// wrote (this) is restored, and anything else was not written by the action and
    /// is left alone (`conflict`).
    OwnChange(TargetState),
    /// Whatever the target holds now is replaced (a forced rollback; recovery, which
    /// has judged each target).
    Force,
    /// Only a target that still holds what its action left is restored; any other
    /// step fails with `conflict` and its target stays as it is.
    Unchanged,
    /// An action whose write was refused before its target changed (a file appeared
    /// where it found none, and the no-replace rename kept it): the target is left as it
    /// is, whatever it holds; directories made on the way go if empty.
    Untouched,
}

impl Sandbox {
    /// Records the steps undone `beneath` older restores, then restores the chosen
    /// snapshots, newest first, adding to `conflicts` the targets whose restore met a
    /// change the check before it could not see.
    pub(super) fn restore_chosen(
        &self,
        execution_id: &str,
        workflow_id: &str,
        (chosen, beneath): (RootedSnapshots, Vec<Beneath>),
        force: bool,
        conflicts: &mut Vec<Conflict>,
    ) -> Vec<RollbackStep> {
        let (mut steps, hold) = self.record_beneath(execution_id, workflow_id, beneath);
        // A step refused as a conflict (a change made without the runtime's locks after
        // the check above) is named among the conflicts like those found before.
        let targets: HashMap<String, (usize, RelPath, Option<String>)> = chosen
            .iter()
            .map(|(i, s)| {
                let after = s.meta.after_sha256.clone();
                (s.meta.action_id.clone(), (*i, s.meta.target(), after))
            })
            .collect();
        let restored = self.restore_all(
            execution_id,
            workflow_id,
            chosen.into_iter().rev().collect(),
            crate::metrics::RollbackReason::Manual,
            if force {
                RestoreMode::Force
            } else {
                RestoreMode::Unchanged
            },
            hold,
        );
        // One rollback, counted once (by its restores when it made any).
        if steps.iter().any(|s| s.restored) && !restored.iter().any(|s| s.restored) {
            self.metrics
                .rollback(crate::metrics::RollbackReason::Manual);
        }
        steps.extend(restored);
        for s in steps
            .iter()
            .filter(|s| s.reason_code == Some(ReasonCode::Conflict))
        {
            if let Some((i, rel, after)) = targets.get(&s.action_id)
                && !conflicts.iter().any(|c| c.action_id == s.action_id)
            {
                conflicts.push(Conflict {
                    action_id: s.action_id.clone(),
                    path: s.path.clone(),
                    expected_checksum: after.clone(),
                    current_checksum: self.target_checksum(*i, rel),
                    found_by_action: None,
                    changed_by: None,
                    claimed_by: Vec::new(),
                    folder_replaced: None,
                    made_dir_replaced: false,
                });
            }
        }
        steps
    }

    /// Puts on the ledger the directories a restore of `meta`'s action (in root `root`)
    /// had to leave. Only a directory known by its birth time too is told apart from one
    /// made again later in the same inode (a filesystem without birth times reuses inodes
    /// at once): others are left for good, never removed by mistake.
    fn record_left_dirs(&self, root: usize, meta: &SnapshotMeta, left: &[LeftDir]) {
        let known: Vec<LeftDir> = left
            .iter()
            .filter(|d| d.id.born_ns.is_some())
            .cloned()
            .collect();
        if !known.is_empty()
            && let Err(e) = self.left_dirs.record(
                &self.root_names(std::iter::once(root)).concat(),
                &known,
                &crate::left_dirs::Maker::of(meta),
            )
        {
            tracing::warn!(error = %e, "could not record the directories a restore left");
        }
    }

    /// What recovery does with the directories a dead action made on its way, once its
    /// target stands as found or as another left it: removes those a restore would, and
    /// puts those it had to leave on the ledger. Returns those left.
    pub(crate) fn settle_created_dirs(&self, root: usize, meta: &SnapshotMeta) -> Vec<LeftDir> {
        let left = match meta.kind {
            crate::snapshot::SnapshotKind::Missing => {
                self.remove_created_dirs_of(root, meta).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        self.record_left_dirs(root, meta, &left);
        left
    }

    /// The directories a restore of `meta`'s action (which found its target missing)
    /// removes on the way, as [`RollbackEngine::remove_created_dirs`] does for it: those
    /// still there and not claimed by a create_directory that stands, if empty; returns
    /// those it had to leave.
    fn remove_created_dirs_of(&self, root: usize, meta: &SnapshotMeta) -> Verdict<Vec<LeftDir>> {
        let maker = crate::left_dirs::Maker::of(meta);
        RollbackEngine::remove_created_dirs(&self.roots[root], meta, self.fsync_each(), &|d| {
            self.claimed(root, d, &maker)
        })
    }

    /// Removes the directories restores had to leave (of any workflow, see
    /// [`crate::left_dirs`]) that are empty now, deepest first, and settles those
    /// removed or no longer the directory that was left; one that still holds something
    /// stays on the ledger. With `near`, only those on the way to, or beneath, these
    /// places (root index, components): what a rollback restored can empty no other, and
    /// a ledger that grows with every partial rollback is not walked whole each time.
    pub(in crate::sandbox) fn remove_left_dirs(&self, near: Option<&[(usize, Vec<String>)]>) {
        for (i, root) in self.roots.iter().enumerate() {
            let name = self.root_names(std::iter::once(i)).concat();
            let near = Near::of(near, i);
            let left = match self
                .left_dirs
                .in_root(|r, l| near.wants(&l.dir.path) && (r == name || root.is_named_by(r)))
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the ledger of directories rollbacks left");
                    return;
                }
            };
            let mut settled: HashMap<String, Vec<crate::left_dirs::Left>> = HashMap::new();
            for (spelled, l) in left {
                let d = &l.dir;
                let rel = RelPath::from_recorded(&d.path);
                // One someone has made the result of a create_directory stays on the
                // ledger until that one is rolled back. (Asked of empty ones only.)
                let empty = root.is_empty_dir(&rel).is_ok_and(|empty| empty);
                if empty && self.claimed(i, &d.path, &l.made_by) {
                    continue;
                }
                let gone = root
                    .remove_empty_dir(&rel, Some(d.id), self.fsync_each())
                    .and_then(|removed| Ok(removed || root.dir_id(&rel)? != Some(d.id)));
                match gone {
                    Ok(true) => settled.entry(spelled).or_default().push(l),
                    Ok(false) => {}
                    Err(r) => {
                        tracing::warn!(path = %d.path, reason = %r, "could not remove a directory an earlier rollback left");
                    }
                }
            }
            for (spelled, done) in settled {
                if let Err(e) = self.left_dirs.settle(&spelled, &done) {
                    tracing::warn!(error = %e, "could not update the ledger of directories rollbacks left");
                }
            }
        }
    }

    /// Restores snapshots in the order given, recording each step (its "restored" mark
    /// and audit line) before the next one starts, so that a rollback that dies leaves
    /// its finished steps recorded. With per-file syncs each restore, then its record,
    /// is durable as it is written; with batched syncs each restore's bytes are synced
    /// as strict's are, a sync point separates a restore from its record (a mark must
    /// never reach the disk ahead of the bytes it vouches for), and the last record is
    /// made durable by a final one. The caller holds the
    /// lock of every target ([`Sandbox::lock_targets`]) from its judgement of them to the
    /// end, so that no writer lands between two steps.
    pub(crate) fn restore_all(
        &self,
        execution_id: &str,
        workflow_id: &str,
        snaps: Vec<(usize, StoredSnapshot)>,
        why: crate::metrics::RollbackReason,
        mode: RestoreMode,
        hold: Option<String>,
    ) -> Vec<RollbackStep> {
        // Recovery finishing a dead run's undo, which differs from a rollback below.
        let recovering = why == crate::metrics::RollbackReason::Recovery;
        let mut steps = Vec::new();
        let mut touched = Vec::new();
        // Why the trail refused a restore's line, once it did (or, given as `hold`, why
        // earlier restores wait to be recorded: these must not pass them).
        let mut held_back: Option<String> = hold;
        let force = matches!(mode, RestoreMode::Force);
        let mut targets = PassTargets::default();
        let pass = Pass {
            workflow_id,
            mode: &mode,
            recovering,
            asked_for: why == crate::metrics::RollbackReason::Manual,
        };
        // The files of the steps whose records may not be durable yet.
        let mut on_file: HashSet<(usize, String)> = HashSet::new();
        let mut record = self.steps_record(why, workflow_id, execution_id);
        for (i, s) in snaps {
            let meta = s.meta;
            let before = self.found_before(&pass, i, &meta);
            let key = (i, meta.original_path.clone());
            let newer_failed = targets.newer_failed(&key, force);
            let made = self
                .before_step(&pass, (&mut record, &mut on_file), &key, &meta)
                .and_then(|()| self.restore_one(&pass, i, &meta, &before, newer_failed.as_ref()));
            let mut step = match made {
                Ok(o) => self.restored_step(i, &meta, execution_id, &before, o),
                Err(failure) => {
                    let at = steps.len();
                    self.failed_step(i, &meta, failure, (&mut targets, &key, at), force)
                }
            };
            targets.restored(&key, &meta, &step);
            on_file.insert(key.clone());
            let record = self.restore_line(execution_id, workflow_id, i, &meta, before, &step);
            // Recovery stopped by the disk keeps its record and tries again at each start
            // until the undo goes through: a line per try would fill the trail with one
            // failure (the start says it; the undo that goes through is recorded).
            if recovering && !step.restored && step.reason_code == Some(ReasonCode::IoError) {
                steps.push(step);
                continue;
            }
            // A death between the mark and this line is recorded by the next start's
            // recovery (`record_marked_restores`). Once the trail refused a restore's
            // line, the later restores' lines are held back for it too, to be written
            // after that one in order: a shorter line that fitted where the refused one
            // did not would come first, and the trail's newest line of a file restored
            // twice would name the version the restores went past.
            if let (Some(words), true) = (&held_back, step.restored) {
                step.unrecorded = Some(words.clone());
                touched.push((i, meta.target().components().to_vec()));
                steps.push(step);
                continue;
            }
            if let Err(words) = self.append_restore_line(record) {
                if step.restored {
                    held_back = Some(words.clone());
                }
                step.unrecorded = Some(words);
            }
            if step.restored {
                touched.push((i, meta.target().components().to_vec()));
            }
            steps.push(step);
        }
        // Lines held back for an earlier one come from marks later; these wait for the
        // next rollback then (recovery leaves them as they are).
        if !recovering && held_back.is_none() {
            self.record_undone_beneath(execution_id, workflow_id, targets, &mut steps);
        }
        self.sync_last_record(&mut steps);
        // Recorded before this process's next change (`record_held_restores`). Those of
        // a dead run's undo are left with its record, kept for the next start.
        let held = steps
            .iter()
            .filter(|s| s.restored && s.unrecorded.is_some())
            .count();
        if !recovering && held > 0 {
            self.held_restores().add(workflow_id, execution_id, held);
        }
        // One rollback, however many steps it restored (those count as mutations).
        if steps.iter().any(|s| s.restored) {
            self.remove_left_dirs(Some(&touched));
            self.metrics.rollback(why);
        }
        steps
    }

    /// Makes the rollback's last record durable, or says in each restored step that it
    /// could not be.
    fn sync_last_record(&self, steps: &mut [RollbackStep]) {
        if let Err(r) = self.sync_point() {
            tracing::error!(reason = %r.reason, "could not sync the rollback's last record");
            for s in steps.iter_mut().filter(|s| s.restored) {
                s.unsynced = Some(r.reason.clone());
            }
        }
    }

    /// The step of a restore that failed with `r` (`reached`: the restore was made, and
    /// what came after it failed), noted in the pass's `targets` for `key` as the pass's
    /// step `at`: the older steps of its file wait for it.
    fn failed_step(
        &self,
        i: usize,
        meta: &SnapshotMeta,
        (mut r, reached): (Refusal, bool),
        (targets, key, at): (&mut PassTargets, &TargetKey, usize),
        force: bool,
    ) -> RollbackStep {
        if r.reason_code == ReasonCode::ChecksumMismatch {
            self.metrics.checksum_mismatches(1);
        }
        // What stands in the way (put there as the step came to it: the rollback's own
        // look found none) is never forced: the step says what to do, as a refusal does.
        if matches!(
            r.reason_code,
            ReasonCode::SymlinkEscape
                | ReasonCode::SymlinkRefused
                | ReasonCode::HardlinkRefused
                | ReasonCode::NotRegularFile
        ) && !r.reason.contains("move it away")
        {
            r.reason
                .push_str("; nothing is written through it or over it, even with force: move it away, then roll back");
        }
        // Made, then something after it failed (the root's sync, say): the line says so,
        // for a rollback run again to take the target, as the undo leaves it, for its own
        // doing rather than someone's change. A conflict is another program's doing, the
        // restore not made (a file it found gone, or left aside): never so taken; a
        // permission refused (`conflict` too) is the system's, after the restore's own
        // change maybe (the removal of the folders it made).
        if reached
            && (r.reason_code != ReasonCode::Conflict || r.denied)
            && self.target_state(i, &meta.target())
                == crate::sandbox::conflicts::TargetState::found_by(meta)
        {
            r.reason = format!(
                "{}{}; {ROLL_BACK_AGAIN} to finish",
                crate::snapshot::PUT_BACK_UNCONFIRMED,
                r.reason
            );
        }
        let spent = || {
            matches!(
                r.reason_code,
                ReasonCode::ChecksumMismatch | ReasonCode::NoRollbackData
            ) && self.backup_unusable(i, meta)
        };
        targets.failed(key, meta, r.reason_code, spent, force, at);
        RollbackStep::failed(meta, self.abs_path(i, &meta.target()), r)
    }

    /// The record that names a pass's steps (see [`Sandbox::before_step`]): the
    /// rollback's, or the run's for its own undo, held open. A record that cannot be
    /// read refuses the steps, a run's undo of its failed action's too: the run's record
    /// says no step is under way, so a restore made unnamed, were the process to die
    /// before its mark, would be taken by a start in this boot for someone's change and
    /// the action's success line left standing over a file it no longer describes. Its
    /// change stays, said so, for a rollback once the state directory reads again.
    /// Recovery's passes name none.
    fn steps_record(
        &self,
        why: crate::metrics::RollbackReason,
        workflow_id: &str,
        execution_id: &str,
    ) -> Result<Option<OpenRecord>, Refusal> {
        use crate::metrics::RollbackReason as Why;
        match why {
            Why::Manual | Why::WorkflowFailed | Why::ActionFailed => {
                self.rollback_record_open(workflow_id, execution_id)
            }
            Why::Recovery => Ok(None),
        }
    }

    /// What comes before a step touches its file `key`: under batched syncs, a sync
    /// point when an earlier step restored that file (a step's mark and line wait for
    /// the next one, and a restore's own syncs would put this step's restore on the
    /// disk ahead of them: a power cut would leave the file as neither step left it,
    /// unrecorded, which recovery's walk, a file's newest unrecorded step first, cannot
    /// follow); then the step named on `record`. A record that could not be read makes
    /// no step: one made unnamed and left unmarked would be taken for someone's change.
    fn before_step(
        &self,
        pass: &Pass<'_>,
        (record, on_file): StepRecords<'_>,
        key: &(usize, String),
        meta: &SnapshotMeta,
    ) -> Result<(), (Refusal, bool)> {
        // A sync that failed during a rollback asked for stops it, as it would have
        // refused to start: nothing written from then on could be promised durable.
        if pass.asked_for {
            self.check_syncs().map_err(|r| (r, false))?;
        }
        if self.stages_writes() && on_file.contains(key) {
            on_file.clear();
            self.sync_point().map_err(|r| (r, false))?;
        }
        match record {
            Ok(record) => self.begin_step(record.as_mut(), meta),
            Err(r) => Err((r.clone(), false)),
        }
    }

    /// The rollback `execution_id`'s record of `workflow_id`, held open, when it names
    /// its steps (`None`: a failed run's own rollback whose failed action's undo failed
    /// keeps its run record, which names none); a record that cannot be read refuses
    /// the rollback's steps.
    fn rollback_record_open(
        &self,
        workflow_id: &str,
        execution_id: &str,
    ) -> Result<Option<OpenRecord>, Refusal> {
        let unread = |why: String| {
            Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not read the rollback's record in the state directory ({why}), which names each step before its file is touched; nothing is restored"
                ),
            )
        };
        let file = self
            .failpoints
            .check("open_rollback_record")
            .and_then(|()| self.state.inflight_open(workflow_id))
            .map_err(|e| unread(crate::error::state_io_words(&e)))?
            .ok_or_else(|| unread("it is gone".to_owned()))?;
        let bytes = file
            .read()
            .map_err(|e| unread(crate::error::state_io_words(&e)))?;
        let rec: crate::recovery::InflightRecord =
            serde_json::from_slice(&bytes).map_err(|e| unread(e.to_string()))?;
        Ok((rec.execution_id == execution_id && rec.restoring.is_some()).then_some((rec, file)))
    }

    /// Names `meta`'s action on the rollback's `record` as the step under way, before its
    /// target is touched (in place, not synced: a start in this boot reads it from the
    /// page cache; after a crash of the machine every step is judged by its file).
    fn begin_step(
        &self,
        record: Option<&mut OpenRecord>,
        meta: &SnapshotMeta,
    ) -> Result<(), (Refusal, bool)> {
        let Some((record, file)) = record else {
            return Ok(());
        };
        record.restoring = Some(meta.action_id.clone());
        self.write_record_to(record, false, Some(file))
            .map_err(|e| {
                let r = Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not record the restore begun in the state directory: {}",
                        crate::error::state_io_words(&e)
                    ),
                );
                (r, false)
            })
    }

    /// Appends a restore's trail line (after its mark), or says why the trail would not
    /// take it ([`line_refused`]).
    pub(super) fn append_restore_line(&self, line: AuditRecord) -> Result<(), String> {
        self.fail_at("after_mark")
            .map_err(|r| std::io::Error::other(r.reason))
            .and_then(|()| self.audit.append(vec![line]))
            .map(drop)
            .map_err(|e| line_refused(&e))
    }

    /// Whether `meta`'s backup, read again now, is gone or not the bytes its record
    /// names: its step will never restore. A directory has none.
    pub(crate) fn backup_unusable(&self, i: usize, meta: &SnapshotMeta) -> bool {
        meta.kind == SnapshotKind::File
            && match Snapshotter::read_checked_backup(&self.roots[i], meta) {
                Ok(checked) => checked.is_err(),
                Err(r) => r.reason_code == ReasonCode::NoRollbackData,
            }
    }

    /// What `meta`'s target in root `i` holds, as its restore's line records it
    /// replaced. Recovery finishing a dead run's own undo: a target back to what the
    /// action found, whose last recorded change is that action's own write, was put back
    /// by the dead run, whose line never came: that restore replaced the write's result,
    /// not the bytes it left (a line from them to themselves would break the file's
    /// record), and [`Sandbox::restore_one`] restores it again rather than leaving it. A
    /// target never written since its last line (the run died before its write) keeps
    /// what it holds.
    fn found_before(&self, pass: &Pass<'_>, i: usize, meta: &SnapshotMeta) -> Option<String> {
        let before = self.target_checksum(i, &meta.target());
        if pass.recovering
            && meta.kind != SnapshotKind::Directory
            && before == meta.sha256
            && let Some(last) = self.last_recorded(i, &meta.target())
            && last.status == AuditStatus::Success
            && last.workflow_id == pass.workflow_id
            && last.action_id == meta.action_id
        {
            return last.after_checksum;
        }
        before
    }

    /// The step of a restore that went through, once its directories left are on the
    /// ledger and its snapshot is marked restored (as found holding `before`).
    fn restored_step(
        &self,
        i: usize,
        meta: &SnapshotMeta,
        execution_id: &str,
        before: &Option<String>,
        o: crate::snapshot::RestoreOutcome,
    ) -> RollbackStep {
        // The ledger before the mark: a death between them leaves a line about a step
        // that recovery then finishes, never a step done with its directories on no
        // ledger.
        self.record_left_dirs(i, meta, &o.left_dirs);
        if let Err(r) = self.mark_restored(
            i,
            meta,
            execution_id,
            &o.restored_checksum,
            &o.left_dirs,
            Restorer::Rollback { found: before },
        ) {
            // The restore itself stands: its audit line, which a later rollback reads
            // first, is written all the same.
            tracing::warn!(
                reason = %r,
                "the target was restored (its audit line is appended next); only the snapshot's restored mark could not be written"
            );
        }
        self.metrics
            .mutation(&meta.intent, crate::executor::ActionStatus::RolledBack);
        RollbackStep {
            action_id: meta.action_id.clone(),
            intent: meta.intent.clone(),
            path: self.abs_path(i, &meta.target()),
            restored: true,
            checksum_validated: o.checksum_validated,
            restored_checksum: o.restored_checksum,
            detail: o.detail,
            reason_code: None,
            reason: None,
            unrecorded: None,
            unsynced: None,
        }
    }

    /// The audit record of `step`, a restore of `meta`'s target found holding `before`:
    /// a failed one's reason, or what a done one left that the trail keeps for good.
    fn restore_line(
        &self,
        execution_id: &str,
        workflow_id: &str,
        i: usize,
        meta: &SnapshotMeta,
        before: Option<String>,
        step: &RollbackStep,
    ) -> AuditRecord {
        let mut record = self.rollback_record(
            execution_id,
            workflow_id,
            i,
            meta,
            before,
            step.restored_checksum.clone(),
        );
        if !step.restored {
            record.status = AuditStatus::Failed;
            record.reason_code = step.reason_code;
            record.error = step.reason.clone();
        } else if let Some(d) = step
            .detail
            .as_ref()
            .filter(|d| d.starts_with(crate::snapshot::LEFT_IN_PLACE) || !step.checksum_validated)
        {
            // The undo left a folder, or could not check what it left.
            record.error = Some(d.clone());
        }
        record
    }

    /// One step of [`Sandbox::restore_all`]: `meta`'s target in root `i` judged by the
    /// pass's mode (and whether it is recovery finishing a dead run's undo), found
    /// holding `before` ([`Sandbox::found_before`]), then restored (or left as it is
    /// when it holds what the undo leaves), and covered by the sync the mode asks for.
    /// `newer_failed`: the newer action on the same target whose restore failed, and
    /// why. A failure says too whether the restore itself was set going (the target may
    /// have changed).
    fn restore_one(
        &self,
        pass: &Pass<'_>,
        i: usize,
        meta: &SnapshotMeta,
        before: &Option<String>,
        newer_failed: Option<&(String, ReasonCode)>,
    ) -> Result<crate::snapshot::RestoreOutcome, (Refusal, bool)> {
        let root = &self.roots[i];
        // Under `batched` too: a restore is in no commit log, so its bytes reach the
        // disk before they take the target's place, not only at the sync point after it
        // (a power cut between the two could leave the name and lose the bytes).
        let flush = self.unlogged_flush();
        let (workflow_id, mode, recovering) = (pass.workflow_id, pass.mode, pass.recovering);
        let reached = std::cell::Cell::new(false);
        match mode {
            // Forced too (and in recovery): undone beneath the newer action, this one
            // would be recorded rolled back while that one's restore, once it goes
            // through, brought its bytes back.
            _ if let Some((newer, code)) = newer_failed => {
                Err(crate::reason::Refusal::new(
                    *code,
                    format!(
                        "{} was not restored to what it was before action {}: the restore of the newer action {} on it did not go through first (see that step); {ROLL_BACK_AGAIN} once that is put right",
                        shown_path(&meta.original_path),
                        shown_path(&meta.action_id),
                        shown_path(newer)
                    ),
                ))
            }
            RestoreMode::Unchanged => self.check_unchanged(workflow_id, i, meta),
            RestoreMode::OwnChange(left) => self.check_own_change(i, meta, left),
            // Recovery undoing a dead action that never reached its file: the file
            // holds what the action found, and nothing (the backup least of all, which
            // may be damaged) is needed to leave it so.
            // (One the dead run itself put back after its write comes with `before`
            // set to that write's result, and is finished by a restore as ever.) A
            // folder has no checksum, made or not: a `create_directory` is undone
            // by its restore, which removes what it finds.
            // Not so when a folder that stood on the way at the snapshot is missing, or
            // another is in its place: the file may have been written and moved away
            // with it (restored, the step says it could not be checked).
            RestoreMode::Force
                if recovering
                    && meta.kind != SnapshotKind::Directory
                    && !meta.is_directory_action()
                    && *before == meta.sha256
                    && !self.folder_gone_since(i, meta) =>
            {
                Ok((false, Put::Any))
            }
            // Whatever it holds, but only as it holds it now: what another program
            // writes from this look on (an append) is kept, `conflict`.
            RestoreMode::Force => Ok((true, self.target_state_judged(i, &meta.target()).1)),
            RestoreMode::Untouched => Ok((false, Put::Any)),
        }
        .and_then(|judged| self.fail_at("during_restore").map(|()| judged))
        .and_then(|(change, put)| {
            if change {
                reached.set(true);
                let maker = crate::left_dirs::Maker::of(meta);
                let keep = |d: &str| self.claimed(i, d, &maker);
                let forced = match mode {
                    RestoreMode::Force if recovering => Forced::Recovering,
                    RestoreMode::Force => Forced::Yes,
                    _ => Forced::No,
                };
                RollbackEngine::restore(root, meta, flush, put, forced, &keep, || {
                    self.fail_at("restore_verify")
                })
            } else {
                // The target is as the action found it (its write failed before
                // the target changed) or as someone else made it meanwhile, and stays
                // so, but directories made on the way may be there. What it holds is
                // what the record says the undo left.
                let left_dirs = match meta.kind {
                    SnapshotKind::Missing => self.remove_created_dirs_of(i, meta)?,
                    _ => Vec::new(),
                };
                let detail = match meta.kind {
                    SnapshotKind::Missing if before.is_none() => {
                        Some("absent, as before the action: it was not written".to_owned())
                    }
                    _ => None,
                };
                Ok(crate::snapshot::RestoreOutcome {
                    checksum_validated: true,
                    restored_checksum: before.clone(),
                    left_dirs,
                    detail,
                })
            }
        })
        .and_then(|o| self.cover_target(i, &meta.target()).map(|()| o))
        .and_then(|o| self.sync_point().map(|()| o))
        .and_then(|o| self.fail_at("after_restore").map(|()| o))
        .map_err(|r| (r, reached.get()))
    }

    /// Whether a folder on the way to `meta`'s target that stood when it was
    /// snapshotted (one its action was not to make) is missing now, or another stands
    /// in its place: moved or removed by another program, maybe with the action's file
    /// in it.
    fn folder_gone_since(&self, i: usize, meta: &SnapshotMeta) -> bool {
        let rel = meta.target();
        let parents = rel.parent_components();
        let missing = self.roots[i].inspect(&rel).is_ok_and(|info| {
            info.existing_parents < parents.len()
                && !meta
                    .created_dirs
                    .contains(&parents[..=info.existing_parents].join("/"))
        });
        missing || RollbackEngine::folder_replaced(&self.roots[i], meta).is_some()
    }

    /// Marks a snapshot restored, with the restore's checksum and the directories it
    /// had to leave, and who restored it ([`Restorer`]).
    pub(crate) fn mark_restored(
        &self,
        root: usize,
        meta: &SnapshotMeta,
        execution_id: &str,
        restored_checksum: &Option<String>,
        left_dirs: &[LeftDir],
        by: Restorer<'_>,
    ) -> Verdict {
        let mut record = serde_json::json!({
            "restored_at": self.now(),
            "execution_id": execution_id,
            "restored_checksum": restored_checksum,
        });
        self.fail_at("mark_restored")?;
        if !left_dirs.is_empty() {
            record["left_dirs"] = serde_json::json!(left_dirs);
        }
        match by {
            // What the restore replaced, for the audit line recovery writes should this
            // process die before its own: the trail then says what the file held.
            Restorer::Rollback { found } => {
                record["before_checksum"] = serde_json::json!(found);
            }
            Restorer::Recovery { found, said } => {
                record["recorded_by"] = serde_json::json!("recovery");
                if let Some(found) = found {
                    record["before_checksum"] = serde_json::json!(found);
                }
                if let Some(said) = said {
                    record["error"] = serde_json::json!(said);
                }
            }
        }
        Snapshotter::mark_restored(
            &self.roots[root],
            &self.seal,
            meta,
            &record,
            self.fsync_each(),
        )
    }

    /// The audit record of a snapshotted action's write, as its run makes it when done.
    pub(crate) fn done_record(&self, root: usize, meta: &SnapshotMeta) -> AuditRecord {
        AuditRecord {
            timestamp: self.now(),
            execution_id: meta.execution_id.clone(),
            workflow_id: meta.workflow_id.clone(),
            action_id: meta.action_id.clone(),
            mutation_class: Some(meta.mutation_class),
            mutation_type: meta.intent.clone(),
            target_path: self.abs_path(root, &meta.target()),
            before_checksum: meta.sha256.clone(),
            after_checksum: meta.after_sha256.clone(),
            rollback_available: true,
            rollback_path: Some(meta.rollback_path()),
            status: AuditStatus::Success,
            reason_code: None,
            error: None,
        }
    }

    /// The audit record of a restore: the target went from `before` to `restored`.
    pub(crate) fn rollback_record(
        &self,
        execution_id: &str,
        workflow_id: &str,
        root: usize,
        meta: &SnapshotMeta,
        before: Option<String>,
        restored: Option<String>,
    ) -> AuditRecord {
        AuditRecord {
            execution_id: execution_id.to_owned(),
            workflow_id: workflow_id.to_owned(),
            mutation_class: Some(MutationClass::Rollback),
            before_checksum: before,
            after_checksum: restored,
            rollback_available: false,
            status: AuditStatus::RolledBack,
            ..self.done_record(root, meta)
        }
    }
}

/// Who made a restore a mark records: a rollback, with what the target held before it
/// (`None`: nothing), or start-up recovery recording a restore a dead process made
/// (whose audit line it writes itself), with what it replaced when that is known.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Restorer<'a> {
    Rollback {
        found: &'a Option<String>,
    },
    /// `found`: what the restore replaced, when recovery knows it; `said`: what its
    /// audit line's `error` tells of an undo that could not be checked.
    Recovery {
        found: Option<&'a Option<String>>,
        said: Option<&'a str>,
    },
}
/// A restore's trail line the trail would not take: logged, and the words its step
/// keeps (a trail another process held past the wait named so).
fn line_refused(e: &std::io::Error) -> String {
    tracing::error!(error = %e, "could not append a rollback record to the audit log");
    if LockBusy::is_cause_of(e) {
        format!("{HELD_TRAIL} ({e})")
    } else {
        crate::error::state_io_words(e)
    }
}

/// A target of a rollback's pass: its root and its path in it.
type TargetKey = (usize, String);

/// What a pass of [`Sandbox::restore_all`] (newest step first) keeps of each target.
#[derive(Default)]
pub(super) struct PassTargets {
    /// The newest failed restore that holds the older steps back: its action, its code,
    /// and whether it is spent (its backup damaged or gone when read again).
    failed_on: HashMap<TargetKey, (String, ReasonCode, bool)>,
    /// Spent steps a forced pass went past, with where they stand among its steps.
    pub(super) spent_on: HashMap<TargetKey, Vec<(usize, SnapshotMeta)>>,
    /// What the last restore after one of those (an older step's) left, and whether it
    /// was checked.
    pub(super) restored_on: HashMap<TargetKey, (TargetState, bool)>,
}

impl PassTargets {
    /// The newer failed step an older one of `key` waits for. A newer step whose
    /// snapshot will never restore holds back no forced restore: the older ones give
    /// the file what the workflow found. Any other failure (one of the moment, or a
    /// restore made but not confirmed) holds them back, forced or not: undone beneath
    /// it, an older action would be recorded rolled back while that step's restore,
    /// once it went through, brought its bytes back.
    fn newer_failed(&self, key: &TargetKey, force: bool) -> Option<(String, ReasonCode)> {
        self.failed_on
            .get(key)
            .filter(|(_, _, spent)| !(*spent && force))
            .map(|(action, code, _)| (action.clone(), *code))
    }

    /// A failed step of `key`, `at` its place among the pass's steps. The newest failure
    /// on the file holds the older steps back, unless spent; a failure of the moment
    /// after spent ones holds them back too: only a chain of spent steps lets force pass.
    pub(super) fn failed(
        &mut self,
        key: &TargetKey,
        meta: &SnapshotMeta,
        code: ReasonCode,
        spent: impl FnOnce() -> bool,
        force: bool,
        at: usize,
    ) {
        if !self.failed_on.get(key).is_none_or(|(_, _, spent)| *spent) {
            return;
        }
        let spent = spent();
        if spent && force {
            self.spent_on
                .entry(key.clone())
                .or_default()
                .push((at, meta.clone()));
        }
        self.failed_on
            .insert(key.clone(), (meta.action_id.clone(), code, spent));
    }

    /// A step of `key` (`meta`'s) done: a restore after a spent step undoes it beneath,
    /// giving the file what its action found.
    pub(super) fn restored(&mut self, key: &TargetKey, meta: &SnapshotMeta, step: &RollbackStep) {
        if step.restored && self.spent_on.contains_key(key) {
            self.restored_on.insert(
                key.clone(),
                (TargetState::found_by(meta), step.checksum_validated),
            );
        }
    }
}

/// Which folders on the ledger of those left a rollback looks at, in one root: those on
/// the way to the folder of one of its targets (or that folder) and those beneath one;
/// every one for a prune or a start (no targets) or a target at the root's top. Looked
/// up by name, so that a ledger long with others' folders is not compared target by
/// target.
struct Near {
    all: bool,
    on_way: HashSet<String>,
    folders: HashSet<String>,
}

impl Near {
    fn of(near: Option<&[(usize, Vec<String>)]>, root: usize) -> Self {
        let mut n = Near {
            all: near.is_none(),
            on_way: HashSet::new(),
            folders: HashSet::new(),
        };
        for (_, at) in near.unwrap_or_default().iter().filter(|(r, _)| *r == root) {
            n.all |= at.is_empty();
            for k in 1..=at.len() {
                n.on_way.insert(at[..k].join("/"));
            }
            n.folders.insert(at.join("/"));
        }
        n
    }

    fn wants(&self, path: &str) -> bool {
        self.all
            || self.on_way.contains(path)
            || path
                .match_indices('/')
                .any(|(k, _)| self.folders.contains(&path[..k]))
    }
}

#[cfg(test)]
mod tests {
    use super::Near;

    /// The ledger's folders a rollback looks at: on the way to its targets' folders, or
    /// beneath one, in their root (a name that only starts alike is another folder);
    /// all of them with no targets or a target at the root's top.
    #[test]
    fn a_rollback_looks_at_the_left_folders_on_its_targets_way_and_beneath() {
        let at = |p: &str| p.split('/').map(str::to_owned).collect::<Vec<_>>();
        let near = [(0, at("a/b")), (1, at("x"))];
        let n = Near::of(Some(&near), 0);
        for (path, wanted) in [
            ("a", true),
            ("a/b", true),
            ("a/b/c", true),
            ("a/b/c/d", true),
            ("a/bc", false),
            ("ab", false),
            ("a/c", false),
            ("x", false),
        ] {
            assert_eq!(n.wants(path), wanted, "{path}");
        }
        assert!(!Near::of(Some(&near), 2).wants("a"));
        assert!(Near::of(None, 0).wants("anything"));
        assert!(Near::of(Some(&[(0, Vec::new())]), 0).wants("anything"));
    }
}
