//! One action's write: its checks under the target's lock, its snapshot, its bytes staged
//! and committed, its artifact and audit line, and its undo when a step fails.
//!
//! An action makes no directory its snapshot does not record: one that was there when it
//! was checked and has gone since is a `conflict`, not made again.

use super::validate::{check_existing_size, leaves};
use super::{ActionResult, ActionStatus, Reached, SandboxWriteExecutor, log_failure};
use crate::artifact::ArtifactEntry;
use crate::audit::{AuditRecord, AuditStatus};
use crate::budget::{Usage, check_budget, check_rate};
use crate::catalog::{Effect, Operation, op_for_intent};
use crate::commit_log::Position;
use crate::confine::path::shown_path;
use crate::confine::root::{FILE_MODE, FileStamp, Flush, Make, Put, StagedWrite, Walk, temp_name};
use crate::confine::{RelPath, TargetKind};
use crate::hash::sha256_hex;
use crate::metrics::RollbackReason;
use crate::plan::{Action, check_payload};
use crate::policy::{Approval, check_content_size, check_target, resolve_target};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::snapshot::{
    MAX_SNAPSHOT_BYTES, SnapshotCommit, SnapshotKind, SnapshotMeta, Snapshotter, StoredSnapshot,
};
use serde_json::json;
use std::borrow::Cow;

impl SandboxWriteExecutor<'_> {
    /// One action, for real. On failure the action's own change is undone and the
    /// failure audited. `first`: nothing of the run is written yet, so a refusal (the
    /// target, budget or rate limit changed since validation) blocks the plan as
    /// validation would have, rather than failing it.
    pub(super) fn execute_action(
        &mut self,
        a: &Action,
        first: bool,
    ) -> Result<(ActionResult, (usize, StoredSnapshot)), Box<ActionResult>> {
        let sb = self.sb;
        let op = op_for_intent(&a.intent);
        let mut res = self.base_result(a, op, ActionStatus::Failed);

        // governance → payload → current bytes → size → budget → rate limit
        let gctx = sb.governance_context();
        let req = self.request(a);
        // The target's lock first, held to the end of the action: what governance finds
        // there, the bytes read, the snapshot and the write then all belong to one moment
        // of the target. (A path that does not resolve is refused just below.)
        let _target_lock = match resolve_target(&req, &gctx) {
            Ok(r) => match sb
                .lock_targets_after_restores(&self.plan.workflow_id, vec![(r.root_index, r.rel)])
            {
                Ok(l) => Some(l),
                Err(r) => {
                    return Err(self.fail_or_block(
                        a,
                        Reached::Checks { first },
                        res,
                        r,
                        self.target_path(a),
                    ));
                }
            },
            Err(_) => None,
        };
        let approval = match check_target(&req, &gctx) {
            Ok(ap) => ap,
            Err(r) => {
                return Err(self.fail_or_block(
                    a,
                    Reached::Checks { first },
                    res,
                    r,
                    self.target_path(a),
                ));
            }
        };
        res.risk = approval.risk;
        let target = sb.abs_path(approval.resolved.root_index, &approval.resolved.rel);
        let checked = match self.read_and_check(a, &approval) {
            Ok(c) => c,
            Err(r) => return Err(self.fail_or_block(a, Reached::Checks { first }, res, r, target)),
        };
        res.before_checksum = checked.before.as_deref().map(sha256_hex);

        // The new bytes and their checksum are known before the snapshot is taken: its
        // record names what the write will leave, so that recovery can tell it happened.
        let w = self.plan_write(a, &approval, checked, &res, &target);
        let rollback_path = match self.take_snapshot(&w) {
            Ok(p) => p,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };
        res.rollback_path = Some(rollback_path);
        let snap = (
            w.ri,
            StoredSnapshot {
                meta: w.meta.clone(),
                restored: false,
            },
        );
        let staged = match self.stage(&w, &snap) {
            Ok(st) => st,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };
        let logged = match self.reach_commit_point(&w, staged.as_ref(), &snap) {
            Ok(l) => l,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };

        // Mutate → registry → audit; any failure restores the snapshot.
        // Set once the write is made: a refusal after it (the registry busy, say) found a
        // changed target, which only a refusal before it does not.
        let mut written = false;
        let outcome = match self.mutate_and_register(&w, staged.as_ref(), &mut written) {
            Ok(()) => self
                .audit_write(w.done_record, logged.is_some())
                .inspect_err(|_| self.undo(&snap, &w.left)),
            Err(r) => Err(self.undo_failed_write(&w, staged.as_ref(), &snap, written, r)),
        };
        // Once this action's writes are made (or undone), a sync point may empty the log.
        if let Some(at) = logged {
            sb.commit_finished(&self.plan.workflow_id, at);
        }
        match outcome {
            Ok(()) => Ok((w.done, snap)),
            Err(r) => Err(self.fail(a, res, r, target)),
        }
    }

    /// Reads the approved target (under its lock) and renders what the action leaves
    /// there, checking every limit again: the tree, the budget and the rate may have
    /// changed since validation, and nothing is written until all of them pass.
    fn read_and_check<'b>(&self, a: &'b Action, approval: &Approval) -> Verdict<Checked<'b>> {
        let sb = self.sb;
        let wf = &self.plan.workflow_id;
        let ri = approval.resolved.root_index;
        let root = &sb.roots[ri];
        let rel = approval.resolved.rel.clone();
        sb.check_syncs()?;
        sb.root_in_place(ri)?;
        check_payload(approval.op, a)?;
        check_content_size(approval, a.content.as_deref(), &sb.config.extensions)?;
        let kind = approval.target.kind;
        let (before, stamp) = match kind {
            TargetKind::File { size, .. } => {
                check_existing_size(approval.op, a, &rel, size)?;
                let (bytes, stamp) = root.read_file_stamped(&rel, MAX_SNAPSHOT_BYTES)?;
                (Some(bytes), Some(stamp))
            }
            _ => (None, None),
        };
        let bytes = leaves(approval, a, before.as_deref(), &sb.config.extensions)?;
        let size = bytes.as_ref().map_or(0, |b| b.len() as u64);
        if bytes.is_some() {
            check_budget(
                wf,
                &sb.config.limits,
                self.registered_usage()?,
                Usage::default(),
                size,
            )?;
        }
        check_rate(
            wf,
            sb.config.limits.writes_per_minute,
            self.rate_tat()?,
            sb.clock.now(),
            1,
            1,
        )?;
        Ok(Checked {
            ri,
            rel,
            kind,
            before,
            stamp,
            bytes,
        })
    }

    /// Works out everything the write leaves before anything is written: the snapshot's
    /// record, the registry entry and the success record, so that a snapshot can carry
    /// the outcome as its commit record, and how the new bytes go in place.
    fn plan_write<'b>(
        &self,
        a: &Action,
        approval: &Approval,
        checked: Checked<'b>,
        res: &ActionResult,
        target: &str,
    ) -> ActionWrite<'b> {
        let sb = self.sb;
        let existing = approval.target.existing_parents;
        // The directories the write may make: those its snapshot records, no others
        // (for create_directory, the directory itself counts last).
        let make = Make::From(if checked.kind == TargetKind::Missing {
            existing
        } else {
            checked.rel.components().len()
        });
        let after = checked.bytes.as_deref().map(sha256_hex);
        let mut meta = self.snapshot_meta(a, approval, &checked, res, existing, after.clone());
        let Checked {
            ri,
            rel,
            kind,
            before,
            stamp,
            bytes,
        } = checked;
        let left = match &after {
            Some(sum) => crate::sandbox::TargetState::File(sum.clone()),
            None => crate::sandbox::TargetState::Directory,
        };
        let entry = match (&bytes, &after) {
            (Some(b), Some(sum)) => Some(self.new_artifact(
                a,
                target,
                b.len() as u64,
                sum,
                res.before_checksum.as_deref(),
            )),
            _ => None,
        };
        let mut done = res.clone();
        done.status = ActionStatus::Success;
        done.after_checksum = after.clone();
        done.size_bytes = bytes.as_ref().map(|b| b.len() as u64);
        done.artifact_id = entry.as_ref().map(|e| e.artifact_id.clone());
        done.rollback_path = Some(meta.rollback_path());
        let done_record = self.audit_record(a, &done, AuditStatus::Success, target.to_owned());
        let mode = match kind {
            TargetKind::File { mode, .. } => mode & 0o666,
            _ => FILE_MODE,
        };
        let (no_replace, put) = how_put(approval.op, kind, stamp.as_ref());

        // With batched syncs a file write whose directories exist takes one durability
        // point: its new bytes are staged beside the target and the snapshot doubles as
        // the commit record, so one commit point (a sync, or an append to the workflow's
        // commit log) makes the snapshot and the whole outcome durable before the target
        // changes. What follows (the rename, the registry and audit lines) reaches the
        // disk at the next sync point; until then recovery can redo it from the commit
        // record or the log.
        let staged_name = match &bytes {
            Some(_) if sb.stages_writes() && meta.created_dirs.is_empty() => Some(temp_name()),
            _ => None,
        };
        if let (Some(name), Some(sum)) = (&staged_name, &after) {
            meta.commit = Some(SnapshotCommit {
                staged_name: name.clone(),
                after_sha256: sum.clone(),
                no_replace,
                artifact: entry.clone(),
                audit: done_record.clone(),
            });
        }
        ActionWrite {
            op: approval.op,
            ri,
            rel,
            before,
            stamp,
            bytes,
            left,
            entry,
            meta,
            done,
            done_record,
            mode,
            no_replace,
            put,
            make,
            staged_name,
        }
    }

    /// The record of the snapshot [`Self::plan_write`] plans (no commit record yet):
    /// what stands at the target, the `existing` of its parents (those beyond are the
    /// directories the write makes), and `after`, the new bytes' checksum.
    fn snapshot_meta(
        &self,
        a: &Action,
        approval: &Approval,
        checked: &Checked<'_>,
        res: &ActionResult,
        existing: usize,
        after: Option<String>,
    ) -> SnapshotMeta {
        let Checked { ri, rel, kind, .. } = checked;
        let parents = rel.parent_components();
        let mut created_dirs: Vec<String> = (existing..parents.len())
            .map(|d| parents[..=d].join("/"))
            .collect();
        if approval.op.is_directory() && *kind == TargetKind::Missing {
            created_dirs.push(rel.as_string());
        }
        SnapshotMeta {
            format: 1,
            snapshot_id: crate::ids::unique(),
            workflow_id: self.plan.workflow_id.clone(),
            action_id: a.id().to_owned(),
            execution_id: self.execution_id.clone(),
            root: self.sb.root_paths[*ri].display().to_string(),
            original_path: rel.as_string(),
            existed: *kind != TargetKind::Missing,
            kind: match kind {
                TargetKind::File { .. } => SnapshotKind::File,
                TargetKind::Directory => SnapshotKind::Directory,
                TargetKind::Missing => SnapshotKind::Missing,
            },
            size_bytes: checked.before.as_ref().map(|b| b.len() as u64),
            sha256: res.before_checksum.clone(),
            mode: match kind {
                TargetKind::File { mode, .. } => Some(*mode),
                _ => None,
            },
            intent: a.intent.clone(),
            mutation_class: approval.op.mutation_class,
            created_dirs,
            taken_at: self.sb.now(),
            after_sha256: after,
            commit: None,
            folder: approval.target.folder,
            root_id: Some(self.sb.roots[*ri].dir_id_of_root()),
            made: Vec::new(),
        }
    }

    /// Takes the action's snapshot before anything is written, so that the write can
    /// be undone and recovery knows of it, returning where it is kept.
    fn take_snapshot(&self, w: &ActionWrite<'_>) -> Verdict<String> {
        let sb = self.sb;
        sb.confirm_store(&sb.roots[w.ri])?;
        // The snapshot first, so that recovery knows of the staged file if it survives.
        Snapshotter::take(
            &sb.roots[w.ri],
            &sb.seal,
            &w.meta,
            w.before.as_deref(),
            sb.fsync_each(),
            || sb.fail_at("snapshot_synced"),
        )
    }

    /// Right after the snapshot: with batched syncs, stages the new bytes beside the
    /// target, for the commit point to make them durable with the snapshot before the
    /// target changes; none otherwise. A failure undoes the snapshot as a refusal would.
    fn stage(
        &mut self,
        w: &ActionWrite<'_>,
        snap: &(usize, StoredSnapshot),
    ) -> Verdict<Option<StagedWrite>> {
        let sb = self.sb;
        if let Err(r) = sb.fail_at("after_snapshot") {
            self.undo(snap, &w.left);
            return Err(r);
        }
        let root = &sb.roots[w.ri];
        match (&w.staged_name, &w.bytes) {
            (Some(name), Some(b)) => match root
                .stage_write(
                    &w.rel,
                    // Its folders all stood at the check (none is made for a staged
                    // write, and `make` allows none): one gone since was removed
                    // meanwhile.
                    Self::walk(w, w.make),
                    name,
                    b,
                    w.mode,
                    w.stamp.filter(|_| !w.no_replace),
                )
                .and_then(|st| match sb.cover_for_sync(st.dir()) {
                    Ok(()) => Ok(st),
                    Err(r) => {
                        st.discard();
                        Err(r)
                    }
                }) {
                Ok(st) => Ok(Some(st)),
                Err(r) => {
                    self.undo_refused(snap, &w.left, &r);
                    Err(r)
                }
            },
            _ => Ok(None),
        }
    }

    /// Makes the snapshot (and a staged write) durable before the target changes,
    /// returning where the workflow's commit log stands when an append to it did; a
    /// failure discards the staged bytes and undoes the snapshot.
    fn reach_commit_point(
        &mut self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        snap: &(usize, StoredSnapshot),
    ) -> Verdict<Option<Position>> {
        let sb = self.sb;
        // The commit point: one append to the workflow's commit log for a small staged
        // write, else one sync point.
        let log_entry = match (staged, &w.bytes, &self.record) {
            (Some(st), Some(b), Some(record))
                if sb.logs_commit(w.before.as_ref().map_or(0, Vec::len) + b.len()) =>
            {
                Some(crate::commit_log::NewEntry {
                    record,
                    meta: &w.meta,
                    backup: w.before.as_deref(),
                    bytes: b,
                    staged: st.written().ok(),
                })
            }
            _ => None,
        };
        let committed = sb
            .fail_at("before_commit")
            .and_then(|()| sb.commit_point(log_entry));
        match committed {
            Ok(l) => Ok(l),
            Err(r) => {
                if let Some(st) = staged {
                    st.discard();
                }
                self.undo(snap, &w.left);
                Err(r)
            }
        }
    }

    /// Puts the new bytes (or directory) in place and registers the artifact, setting
    /// `written` once the target changed: what a failure must undo depends on it.
    fn mutate_and_register(
        &self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        written: &mut bool,
    ) -> Verdict {
        let sb = self.sb;
        let root = &sb.roots[w.ri];
        let fsync_each = sb.fsync_each();
        sb.fail_at("before_mutate")?;
        match (&w.bytes, staged) {
            (Some(_), Some(st)) => {
                // Staged through the folder the check found (its walk said so); this
                // refuses, before anything is in place, one swapped for another since.
                self.folder_as_recorded(w)?;
                st.commit_in(root, &w.rel, w.put, false)?;
            }
            // Not staged (its folders are made here): in no commit log, so under
            // `batched` too its bytes reach the disk before they take the target's
            // place, not only at the sync point after it. Its temporary name is known
            // ahead, so that recovery finds it where the folder cannot be listed.
            (Some(b), None) => {
                let tmp = crate::confine::root::action_temp_name(
                    &w.meta.workflow_id,
                    &w.meta.action_id,
                    &crate::ids::own_seed(),
                );
                let flush = sb.unlogged_flush();
                // The folders it makes first, and which they are marked before anything
                // of the action's is in them: a folder swapped after the mark is told
                // from its own, and one swapped before holds nothing of the action's.
                let made = self.make_folders(w, flush == Flush::FileAndDir)?;
                sb.fail_at("folders_made")
                    .map_err(|r| crate::confine::root::made_then(&made, r))?;
                // Those made are not made again: one gone by the write is refused (and
                // the refusal says which were made for it).
                let make = if made.is_empty() {
                    w.make
                } else {
                    Make::From(w.rel.parent_components().len())
                };
                root.write_atomic_put(
                    &w.rel,
                    b,
                    w.mode,
                    w.put,
                    Self::walk(w, make),
                    (flush, Some(tmp.as_str())),
                )
                .map_err(|r| crate::confine::root::made_then(&made, r))?;
            }
            (None, _) => {
                let made = root.create_dir_all_making(&w.rel, Self::walk(w, w.make), fsync_each)?;
                self.mark_made(w, &made);
            }
        }
        *written = true;
        if staged.is_none() {
            sb.cover_target(w.ri, &w.rel)?;
        }
        sb.fail_at("after_mutate")?;
        if let Some(entry) = &w.entry {
            sb.fail_at("before_registry")?;
            sb.registry
                .register(entry)
                .map_err(|e| log_failure("register the artifact", &e))?;
        }
        Ok(())
    }

    /// Records which directory each folder the write made is (`made`, the folders its
    /// snapshot names), in the snapshot's "made" mark: a hint a rollback reads to tell
    /// them from ones another program puts in their place, so a failure to write it is
    /// only logged.
    fn mark_made(&self, w: &ActionWrite<'_>, made: &[String]) {
        // Only when it made each folder its snapshot names (another creator may have
        // made one first: that one is not the action's to record).
        if made.is_empty() || made != w.meta.created_dirs.as_slice() {
            return;
        }
        let root = &self.sb.roots[w.ri];
        let gone = || Refusal::new(ReasonCode::NotFound, "a folder it made is gone already");
        let ids = root.inspect_walked(&w.rel).and_then(|(_, opened)| {
            made.iter()
                .map(|d| {
                    if *d == w.meta.original_path {
                        return root.dir_id(&w.rel)?.ok_or_else(gone);
                    }
                    let depth = RelPath::from_recorded(d).components().len();
                    depth
                        .checked_sub(1)
                        .and_then(|at| opened.get(at).copied())
                        .ok_or_else(gone)
                })
                .collect::<Verdict<Vec<_>>>()
        });
        if let Err(r) =
            ids.and_then(|ids| Snapshotter::mark_made(root, &self.sb.seal, &w.meta, &ids))
        {
            tracing::warn!(reason = %r.reason, "could not record which folders the action made; a rollback will not tell them from ones put in their place");
        }
    }

    /// The walk of `w`'s writes: making what `make` allows, and finding on the way the
    /// folder its snapshot records (taken at the action's check), refusing (`conflict`)
    /// another there: one another workflow's rollback removed and a third made again,
    /// or another program swapped, meanwhile. Written there, the file would stand in a
    /// folder the record does not name, and every later rollback would take it for
    /// another's.
    fn walk(w: &ActionWrite<'_>, make: Make) -> Walk {
        Walk {
            make,
            folder: Self::recorded_folder(w),
        }
    }

    /// The folder `w`'s snapshot records on its way: its depth and identity.
    fn recorded_folder(w: &ActionWrite<'_>) -> Option<(usize, crate::confine::DirId)> {
        w.meta
            .folder
            .zip(w.meta.folder_rel())
            .map(|(id, rel)| (rel.components().len(), id))
    }

    /// For a staged write, whose folder its staging's walk found as recorded: refuses
    /// one swapped since, before its bytes are put in place (where the commit's own
    /// look would take them back).
    fn folder_as_recorded(&self, w: &ActionWrite<'_>) -> Verdict {
        let Some((depth, was)) = Self::recorded_folder(w) else {
            return Ok(());
        };
        let (_, opened) = self.sb.roots[w.ri].inspect_walked(&w.rel)?;
        match depth.checked_sub(1).and_then(|at| opened.get(at)) {
            Some(now) if was.replaced_by(now) => Err(crate::confine::root::not_as_checked(
                &w.rel.components()[..depth],
            )),
            _ => Ok(()),
        }
    }

    /// Makes the folders a file write makes on its way (none when its snapshot names
    /// none), synced when `durable`, and marks which they are ([`Self::mark_made`]).
    fn make_folders(&self, w: &ActionWrite<'_>, durable: bool) -> Verdict<Vec<String>> {
        if w.meta.created_dirs.is_empty() {
            return Ok(Vec::new());
        }
        let parent = RelPath::from_components(w.rel.parent_components().to_vec());
        let made =
            self.sb.roots[w.ri].create_dir_all_making(&parent, Self::walk(w, w.make), durable)?;
        self.mark_made(w, &made);
        Ok(made)
    }

    /// Appends the action's success to the audit trail, then (unless `logged`) makes the
    /// write durable: the action succeeded only once both are done.
    fn audit_write(&self, done_record: AuditRecord, logged: bool) -> Verdict {
        let sb = self.sb;
        sb.fail_at("before_audit")
            .map_err(|r| std::io::Error::other(r.reason))
            .and_then(|()| sb.audit.append(vec![done_record]))
            .map_err(|e| log_failure("append to the audit log", &e))?;
        // Under `batched`, the second durability point: the target, the registry and
        // the audit line, all at once (recovery checks audited targets against their
        // after_checksum, so their order on disk does not matter). A write in the
        // workflow's commit log needs none: a start redoes it from the log. One committed
        // by a sync point (the workflow's first, one too large for the log) needs it as
        // much as a write not staged: the log's later writes to the same file build on
        // its result, and a start that found the file as before it would take them for
        // overtaken by another program, losing all of them. Under `strict` each was
        // synced as it was written, and under `relaxed` nothing is: a no-op.
        if logged { Ok(()) } else { sb.sync_point() }
    }

    /// Undoes a write that failed with `r` (discarding its staged bytes), returning the
    /// refusal to report: a rename refused because the target appeared meanwhile is a
    /// conflict with another program, not this action's fault.
    fn undo_failed_write(
        &mut self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        snap: &(usize, StoredSnapshot),
        written: bool,
        mut r: Refusal,
    ) -> Refusal {
        // Only the no-replace rename (or a directory's creation) refuses with
        // `already_exists`, and only the rename over the file that was read with
        // `conflict`: the target was not touched, and what holds it now is
        // someone else's.
        if written {
            self.undo(snap, &w.left);
        } else {
            self.undo_refused(snap, &w.left, &r);
        }
        // Discarded once the undo is marked: a process that dies before has a start
        // that finds the staged bytes and the commit log entry together, and finishes
        // the write as it finishes any that died after its commit point.
        if let Some(st) = staged {
            st.discard();
        }
        if r.reason_code == ReasonCode::AlreadyExists && w.op.effect != Effect::Create {
            r = Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "{} appeared while the action ran (another program created it); it was left as it is: read it, then try again",
                    shown_path(&w.rel.as_string())
                ),
            );
        }
        r
    }

    /// The registry entry of a file the action is about to write. Its parent defaults to
    /// the artifact whose bytes it replaces: of the path's artifacts whose write was not
    /// rolled back, the newest with the checksum the file holds now, else the newest
    /// (SPEC §8: a file changed by hand, or made again after it was deleted). A
    /// rolled-back write is no version the path still has: a file back to bytes no
    /// standing artifact holds (as before a workflow that was rolled back) has no parent
    /// but an older artifact standing there.
    fn new_artifact(
        &self,
        a: &Action,
        target: &str,
        size: u64,
        sum: &str,
        before: Option<&str>,
    ) -> ArtifactEntry {
        let sb = self.sb;
        ArtifactEntry {
            artifact_id: format!("art_{}", crate::ids::unique()),
            path: target.to_owned(),
            checksum_sha256: sum.to_owned(),
            size_bytes: size,
            mutation_type: a.intent.clone(),
            workflow_id: self.plan.workflow_id.clone(),
            action_id: a.id().to_owned(),
            parent_workflow_id: self.plan.parent_workflow_id.clone(),
            parent_artifact_id: match &a.parent_artifact_id {
                Some(p) => Some(p.clone()),
                None => {
                    // A rolled-back write is no version the path has, even when a standing
                    // one holds the same bytes (a write undone that had put them back).
                    let standing = |e: crate::artifact::ArtifactRef<'_>| !sb.rolled_back(e);
                    before
                        .and_then(|sum| {
                            let holding = sb.registry.version_holding_where(target, sum, standing);
                            holding.ok().flatten()
                        })
                        .or_else(|| sb.registry.newest_at_where(target, standing).ok().flatten())
                        .map(|e| e.artifact_id)
                }
            },
            generated_by_action: format!("{}/{}", self.execution_id, a.id()),
            created_at: sb.now(),
        }
    }

    /// Restores one action's snapshot at once after its mutation failed.
    /// `left`: what the action writes (see [`crate::sandbox::RestoreMode::OwnChange`]).
    fn undo(&mut self, snap: &(usize, StoredSnapshot), left: &crate::sandbox::TargetState) {
        self.undo_with(snap, crate::sandbox::RestoreMode::OwnChange(left.clone()));
    }

    /// Undoes an action whose write failed with `r`. Some refusals come only before the
    /// rename, so the target was not touched and is left as it is, whatever it holds
    /// ([`crate::sandbox::RestoreMode::Untouched`]): `conflict` (the file changed since it
    /// was read: a missing parent stops before any mkdir), `already_exists` (the
    /// no-replace rename kept what appeared), and a symbolic link, hard link or special
    /// file found on the walk to the target or at it (which may not even be looked at now).
    fn undo_refused(
        &mut self,
        snap: &(usize, StoredSnapshot),
        left: &crate::sandbox::TargetState,
        r: &Refusal,
    ) {
        if !r.touched
            && matches!(
                r.reason_code,
                ReasonCode::Conflict
                    | ReasonCode::AlreadyExists
                    | ReasonCode::SymlinkEscape
                    | ReasonCode::SymlinkRefused
                    | ReasonCode::HardlinkRefused
                    | ReasonCode::NotRegularFile
            )
        {
            self.undo_with(snap, crate::sandbox::RestoreMode::Untouched);
        } else {
            self.undo(snap, left);
        }
    }

    /// [`Self::undo`], as `mode` says.
    fn undo_with(&mut self, snap: &(usize, StoredSnapshot), mode: crate::sandbox::RestoreMode) {
        let wf = self.plan.workflow_id.clone();
        // Said on the timeline: the action never touched its target (a face tells the
        // caller so rather than that its change was undone).
        let untouched = matches!(mode, crate::sandbox::RestoreMode::Untouched);
        let steps = self.sb.restore_all(
            &self.execution_id,
            &wf,
            vec![snap.clone()],
            RollbackReason::ActionFailed,
            mode,
            None,
        );
        let restored = steps.iter().all(|s| s.restored);
        if steps.iter().any(|s| s.unrecorded.is_some()) {
            self.unrecorded = true;
        }
        self.event(
            "action_restored",
            json!({"action_id": snap.1.meta.action_id, "restored": restored, "untouched": untouched}),
        );
        if restored {
            self.undone = Some(snap.1.meta.action_id.clone());
        } else {
            self.unsettled = true;
            self.undo_failure = Some(
                steps
                    .iter()
                    .find_map(|s| s.reason.clone())
                    .unwrap_or_else(|| "the restore failed".to_owned()),
            );
        }
    }
}

/// An approved action's target as read under its lock, with the bytes the action would
/// leave there, past every check made again at write time.
struct Checked<'b> {
    /// The root's index.
    ri: usize,
    /// The target in that root.
    rel: RelPath,
    /// What stands there.
    kind: TargetKind,
    /// The file's bytes, when it is one.
    before: Option<Vec<u8>>,
    /// The file as read, for the write to replace only it.
    stamp: Option<FileStamp>,
    /// The new bytes; none for a directory.
    bytes: Option<Cow<'b, [u8]>>,
}

/// An action's write, worked out before anything is written.
struct ActionWrite<'b> {
    op: &'static Operation,
    ri: usize,
    rel: RelPath,
    before: Option<Vec<u8>>,
    stamp: Option<FileStamp>,
    bytes: Option<Cow<'b, [u8]>>,
    /// What the write leaves at the target, for its undo.
    left: crate::sandbox::TargetState,
    entry: Option<ArtifactEntry>,
    meta: SnapshotMeta,
    /// The action's result once it succeeded.
    done: ActionResult,
    /// Its success line in the audit trail.
    done_record: AuditRecord,
    mode: u32,
    no_replace: bool,
    put: Put,
    make: Make,
    /// The temporary file's name when the bytes are staged.
    staged_name: Option<String>,
}

/// Whether the new bytes may only take a missing target's place, and how they are put
/// there. A target found missing must still be missing when the new file takes its place:
/// a file another program created meanwhile is never replaced. One found must still be
/// the file that was read (`stamp`): another program's change made meanwhile (a line
/// appended to a log) is never overwritten unseen.
fn how_put(op: &Operation, kind: TargetKind, stamp: Option<&FileStamp>) -> (bool, Put) {
    let no_replace = op.effect == Effect::Create || matches!(kind, TargetKind::Missing);
    let put = match stamp {
        Some(was) if !no_replace => Put::Unchanged(*was),
        _ => Put::new_or_any(no_replace),
    };
    (no_replace, put)
}
