//! Taking, reading and pruning snapshots ([`Snapshotter`]).
//!
//! A snapshot is durable before its target is touched, and its `meta.json` is written last:
//! a snapshot folder without it belongs to an action that never began. Under `batched` the
//! same sync also makes the new bytes durable (staged beside the target), so an action past
//! that point is finished by recovery, never lost. No operation changes an existing
//! directory (`create_directory` is `mkdir -p`), so a directory's snapshot records that it
//! existed instead of copying its tree.

use crate::confine::SandboxRoot;
use crate::confine::path::{ROLLBACK_DIR, TEMP_MARKER, shown_path};
use crate::confine::root::{
    Flush, Put, read_regular, sync_dir, write_atomic_flush, write_atomic_in,
};
use crate::hash::sha256_hex;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::seal::{SealKey, Unsealed};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt};
use std::io;

use super::store::{
    check_private_to_read, is_passing, not_a_folder, open_existing, open_mark,
    open_or_create_tracked, open_refusal, remove_if_unfinished, rollback_dir,
    sealed_for_another_root, shut_out_of, snap_io, snapshot_dir, snapshot_store, stands_in_place,
    store_refusal, unreadable_record, untrusted, untrusted_said, unwritable_path, workflow_folder,
};
use super::{
    BACKUP_FILE, MADE_FILE, MAX_SNAPSHOT_BYTES, META_FILE, NOT_ITS_BACKUP, PRUNED_MARKER,
    RESTORED_FILE, RestoredMark, SNAPSHOT_DIR_MODE, SnapshotKind, SnapshotMeta, StoredSnapshot,
};

/// Takes and reads snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshotter;

impl Snapshotter {
    /// Whether a snapshot exists for this action (action ids are never reused in a
    /// workflow), refused (`reserved_path`) when something other than a folder stands in
    /// the action's place (`.rollback/{workflow}/{action}`), where no snapshot of it could
    /// be taken: a plan checks it before it writes.
    pub fn place(root: &SandboxRoot, workflow_id: &str, action_id: &str) -> Verdict<bool> {
        let path = format!("{ROLLBACK_DIR}/{workflow_id}/{action_id}");
        // One lookup beneath the root rather than one per folder, following no link
        // anywhere on the way (a planted link could otherwise make fresh ids look used).
        #[cfg(target_os = "linux")]
        {
            use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
            match openat2(
                root.dir(),
                path.as_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
            ) {
                Ok(_) => return Ok(true),
                // Missing: no snapshot.
                Err(rustix::io::Errno::NOENT | rustix::io::Errno::XDEV) => return Ok(false),
                // A link or a non-folder on the way, or in the place itself.
                Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                    return Self::obstruction(root, workflow_id, action_id, &path).map(|()| false);
                }
                // No openat2 here (an old kernel, a seccomp filter): one folder at a time.
                Err(_) => {}
            }
        }
        match snapshot_dir(root, workflow_id, action_id) {
            Ok(Some(_)) => Ok(true),
            _ => Self::obstruction(root, workflow_id, action_id, &path).map(|()| false),
        }
    }

    /// The refusal for a non-folder at `rel`, the action's place.
    fn obstruction(root: &SandboxRoot, workflow_id: &str, action_id: &str, rel: &str) -> Verdict {
        let Ok(m) = root.dir().symlink_metadata(rel) else {
            return Ok(());
        };
        if m.is_dir() {
            return Ok(());
        }
        let folder = root
            .dir()
            .open_dir_nofollow(format!("{ROLLBACK_DIR}/{workflow_id}"))
            .map_err(|e| snap_io("inspect", &e))?;
        let scope = format!("for action {action_id} in this root");
        not_a_folder(root, &folder, action_id, rel, &scope).map_or(Ok(()), Err)
    }

    /// Writes backup and metadata, durable (when `durable`) before returning: each
    /// file's data, then the new folder's entries, then the folder's own entry — the
    /// fewest syncs that make the whole snapshot survive a power cut. `synced` runs
    /// after the syncs; any failure up to there removes the folder (the target was not
    /// touched), so no snapshot stands for a write that never happened.
    pub fn take(
        root: &SandboxRoot,
        key: &SealKey,
        meta: &SnapshotMeta,
        backup: Option<&[u8]>,
        durable: bool,
        synced: impl FnOnce() -> Verdict,
    ) -> Verdict<String> {
        let (rb, rb_new) = snapshot_store(root)?;
        let (wf, wf_new) = workflow_folder(root, &rb, &meta.workflow_id)?;
        let mut b = DirBuilder::new();
        b.mode(SNAPSHOT_DIR_MODE);
        match wf.create_dir_with(&meta.action_id, &b) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let rel = format!("{ROLLBACK_DIR}/{}/{}", meta.workflow_id, meta.action_id);
                let scope = format!("for action {} in this root", meta.action_id);
                if let Some(r) = not_a_folder(root, &wf, &meta.action_id, &rel, &scope) {
                    return Err(r);
                }
                return Err(crate::plan::action_id_used(
                    &meta.action_id,
                    &meta.workflow_id,
                ));
            }
            Err(e) => return Err(snap_io("create", &e)),
        }
        let written = (|| {
            let dir = wf
                .open_dir_nofollow(&meta.action_id)
                .map_err(|e| snap_io("open", &e))?;
            let flush = if durable {
                Flush::FileOnly
            } else {
                Flush::Nothing
            };
            if let Some(bytes) = backup {
                // Straight into the new folder: until `meta.json` is there, recovery
                // removes a folder holding a backup alone, torn or not.
                crate::confine::root::write_new_in(&dir, BACKUP_FILE, bytes, 0o600, durable)
                    .map_err(|e| snap_io("write", &e))?;
            }
            let json = key.seal(meta).map_err(|e| snap_io("encode", &e))?;
            // The metadata is written last: a snapshot folder without it is an incomplete
            // snapshot of an action that never touched its target.
            write_atomic_flush(&dir, META_FILE, &json, 0o600, Put::New, flush)
                .map_err(|e| snap_io("write", &e))?;
            if durable {
                sync_dir(&dir).map_err(|e| snap_io("sync", &e))?;
                sync_dir(&wf).map_err(|e| snap_io("sync", &e))?;
                if wf_new {
                    sync_dir(&rb).map_err(|e| snap_io("sync", &e))?;
                }
                if rb_new {
                    sync_dir(root.dir()).map_err(|e| snap_io("sync", &e))?;
                }
            }
            synced()
        })();
        if let Err(r) = written {
            // The target was not touched: the action never ran, and its id stays free
            // for a retry once the cause (a full disk, say) is gone. A snapshot left
            // behind would stand for a write that never happened: a later rollback would
            // expect its result (`conflict`), and, forced, put back what it found.
            let _ = wf.remove_dir_all(&meta.action_id);
            // So does the workflow's folder once that leaves it empty (its first
            // snapshot failed): nothing but a prune would remove it, and on a full disk
            // each try would leave one more. The run holds the workflow's lock, so no
            // other snapshot of it is being made; one that holds others stays
            // (`ENOTEMPTY`).
            drop(wf);
            let _ = rb.remove_dir(&meta.workflow_id);
            return Err(r);
        }
        Ok(meta.rollback_path())
    }

    /// Puts back what a commit log entry says a snapshot holds, for the parts that are
    /// missing or damaged (a power cut before they reached the disk): the folder, the
    /// backup, the metadata. Nothing is synced; recovery syncs once at the end.
    pub fn repair(
        root: &SandboxRoot,
        key: &SealKey,
        meta: &SnapshotMeta,
        backup: Option<&[u8]>,
    ) -> Verdict {
        let (rb, _) = snapshot_store(root)?;
        let (wf, _) = workflow_folder(root, &rb, &meta.workflow_id)?;
        let (dir, _) = open_or_create_tracked(&wf, &meta.action_id)?;
        if let Some(bytes) = backup
            && read_regular(&dir, BACKUP_FILE, MAX_SNAPSHOT_BYTES)
                .ok()
                .as_deref()
                != Some(bytes)
        {
            write_atomic_flush(&dir, BACKUP_FILE, bytes, 0o600, Put::Any, Flush::Nothing)
                .map_err(|e| snap_io("write", &e))?;
        }
        let intact = read_regular(&dir, META_FILE, 1 << 20)
            .ok()
            .and_then(|b| key.open::<SnapshotMeta>(&b).ok())
            .is_some_and(|m| m == *meta);
        if !intact {
            let json = key.seal(meta).map_err(|e| snap_io("encode", &e))?;
            write_atomic_flush(&dir, META_FILE, &json, 0o600, Put::Any, Flush::Nothing)
                .map_err(|e| snap_io("write", &e))?;
        }
        Ok(())
    }

    /// Loads one snapshot; `None` when it does not exist or is incomplete. Its metadata
    /// and restore mark are trusted only under `key`'s seal, and must name the folder they
    /// are in (`checksum_mismatch` otherwise: damaged, or not written by this runtime).
    pub fn load(
        root: &SandboxRoot,
        key: &SealKey,
        workflow_id: &str,
        action_id: &str,
    ) -> Verdict<Option<StoredSnapshot>> {
        Self::load_judged(root, key, workflow_id, action_id).map_err(|(r, _)| r)
    }

    /// [`Snapshotter::load`], with each refusal saying whether it is passing (out of
    /// descriptors, memory or space, an I/O error): such a folder is not judged now.
    fn load_judged(
        root: &SandboxRoot,
        key: &SealKey,
        workflow_id: &str,
        action_id: &str,
    ) -> Result<Option<StoredSnapshot>, (Refusal, bool)> {
        let trust = |r: Refusal| (r, false);
        let Some(dir) = snapshot_dir(root, workflow_id, action_id).map_err(|e| {
            (
                open_refusal(root, workflow_id, action_id, &e),
                is_passing(&e),
            )
        })?
        else {
            return Ok(None);
        };
        let folder = format!("{ROLLBACK_DIR}/{workflow_id}/{action_id}");
        check_private_to_read(root, &dir, &folder).map_err(trust)?;
        // A link, a special file or a file with other links in a record's place (the
        // reading refused it) is no record of the runtime's; anything else, the disk's.
        let unread = |file: &str, e: &io::Error| {
            let refused = e.get_ref().and_then(|r| r.downcast_ref::<Refusal>());
            let what = match refused {
                Some(r) => Some(r.reason.clone()),
                None if stands_in_place(e) => Some(crate::error::io_words(e)),
                None => None,
            };
            if let Some(r) = unreadable_record(root, &format!("{folder}/{file}"), e) {
                return trust(r);
            }
            match what {
                Some(what) if !is_passing(e) => trust(untrusted_said(
                    &format!("{folder}/{file}"),
                    &format!("is not a record the runtime wrote ({what})"),
                )),
                _ => (snap_io("read", e), is_passing(e)),
            }
        };
        let meta: SnapshotMeta = match read_regular(&dir, META_FILE, 1 << 20) {
            Ok(b) => key
                .open(&b)
                .map_err(|e| trust(untrusted(&folder, META_FILE, &e)))?,
            // No record: a snapshot stopped before it, or someone else's folder.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return unfinished(&dir, &folder).map(|()| None);
            }
            Err(e) => return Err(unread(META_FILE, &e)),
        };
        its_own(root, &dir, &folder, &meta, (workflow_id, action_id)).map_err(trust)?;
        let mut meta = meta;
        meta.made = made_mark(&dir, key, &meta);
        let mark = match read_regular(&dir, RESTORED_FILE, 1 << 16) {
            // Its name reached the disk, its bytes did not (a power cut before the
            // rollback's sync point): no mark, the step is judged by what its file holds.
            Ok(b) if b.is_empty() => None,
            Ok(b) => Some(
                open_mark(key, &b, &meta)
                    .map_err(|e| trust(untrusted(&folder, RESTORED_FILE, &e)))?,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(unread(RESTORED_FILE, &e)),
        };
        Ok(Some(StoredSnapshot {
            meta,
            restored: mark.is_some(),
        }))
    }

    /// Removes the workflow's action folders in one root that hold no metadata (or an
    /// empty file in its place) and nothing but a backup, of actions `ran` says the
    /// trail records no write of:
    /// snapshots a killed process never finished ([`Self::take`] writes the metadata
    /// last), whose actions never touched their targets. Their ids are free again, as
    /// after a snapshot that failed. (An action that ran keeps its folder: its record
    /// lost some other way, the backup is the only copy of what it replaced.) Only for
    /// recovery, holding the workflow's lock (no run of it is taking a snapshot) with the
    /// dead run's temporary files gone; the workflow's folder too when that leaves it
    /// empty. Returns how many, and the folders (names in the workflow's folder) that
    /// could not be removed, each with why: those stay. `may_remove` is asked before
    /// each unfinished folder is moved aside (a failure point): its refusal leaves that
    /// folder as the disk's would.
    pub fn remove_unfinished(
        root: &SandboxRoot,
        workflow_id: &str,
        ran: impl Fn(&str) -> bool,
        may_remove: impl Fn() -> io::Result<()>,
    ) -> io::Result<(usize, Vec<(String, io::Error)>)> {
        let Some(rb) = rollback_dir(root)? else {
            return Ok(Default::default());
        };
        let Some(wf) = open_existing(&rb, workflow_id)? else {
            return Ok(Default::default());
        };
        let mut removed = 0;
        let mut left = Vec::new();
        for entry in wf.entries()? {
            let Some(name) = entry
                .ok()
                .and_then(|e| e.file_name().to_str().map(str::to_owned))
            else {
                continue;
            };
            if ran(&name) {
                continue;
            }
            // One folder that cannot be looked at or removed stays; the others go.
            match remove_if_unfinished(&wf, &name, &may_remove) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(stays) => left.push(stays),
            }
        }
        // The workflow's folder goes too once nothing is in it (its first snapshot was
        // the one never finished, or never begun): it says nothing, and a prune would
        // be the only thing ever to remove it. Not emptied, it stays (`ENOTEMPTY`).
        drop(wf);
        let _ = rb.remove_dir(workflow_id);
        Ok((removed, left))
    }

    /// Every snapshot of a workflow in one root, in the order they were taken, and a
    /// refusal for each folder whose records cannot be trusted (see [`Snapshotter::load`]).
    pub fn load_workflow(
        root: &SandboxRoot,
        key: &SealKey,
        workflow_id: &str,
    ) -> Verdict<(Vec<StoredSnapshot>, Vec<Refusal>)> {
        // Something else in a store folder's place may stand for snapshots moved away:
        // the workflow's rollback is refused, naming it, rather than done in part.
        let rb = match rollback_dir(root) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Default::default()),
            Err(e) => return Err(store_refusal(root, &e)),
        };
        let rel = format!("{ROLLBACK_DIR}/{workflow_id}");
        let wf = match open_existing(&rb, workflow_id) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Default::default()),
            Err(e) => {
                let scope = format!(
                    "for workflow {workflow_id} in this root, nor is it rolled back or pruned,"
                );
                return Err(not_a_folder(root, &rb, workflow_id, &rel, &scope)
                    .unwrap_or_else(|| snap_io("open", &e)));
            }
        };
        // As writing refuses a store others could change, so does reading one.
        check_private_to_read(root, &rb, ROLLBACK_DIR)?;
        check_private_to_read(root, &wf, &rel)?;
        let mut out = Vec::new();
        let mut untrusted = Vec::new();
        for entry in wf.entries().map_err(|e| snap_io("list", &e))? {
            let entry = entry.map_err(|e| snap_io("list", &e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // One bad folder (damaged, forged, or not a folder at all) does not hide the
            // others: the caller decides what to do with the refusals.
            match Self::load_judged(root, key, workflow_id, &name) {
                Ok(Some(s)) => out.push(s),
                Ok(None) => {}
                // Not judged now: recovery and rollback try again later rather than
                // leave the folder alone for good.
                Err((r, true)) => return Err(r),
                Err((r, _)) if r.reason_code == ReasonCode::ChecksumMismatch => untrusted.push(r),
                Err((r, _)) => {
                    // In full: with several roots, each has a store.
                    let folder = shown_path(
                        &root
                            .path()
                            .join(ROLLBACK_DIR)
                            .join(workflow_id)
                            .join(&name)
                            .display()
                            .to_string(),
                    );
                    // Named once: a reason that names the folder already stands as it is.
                    let reason = if r.reason.contains(&folder) {
                        r.reason
                    } else {
                        format!("{folder}: {}", r.reason)
                    };
                    untrusted.push(Refusal::new(r.reason_code, reason));
                }
            }
        }
        out.sort_by(|a, b| a.meta.snapshot_id.cmp(&b.meta.snapshot_id));
        Ok((out, untrusted))
    }

    /// [`Snapshotter::read_backup`], its bytes checked against the checksum the record
    /// names: the outer refusal when it cannot be read, the inner one (`checksum_mismatch`)
    /// when it was read and is damaged.
    pub fn read_checked_backup(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
    ) -> Verdict<Verdict<Vec<u8>>> {
        let bytes = Snapshotter::read_backup(root, meta)?;
        if Some(sha256_hex(&bytes)) == meta.sha256 {
            return Ok(Ok(bytes));
        }
        Ok(Err(Refusal::new(
            ReasonCode::ChecksumMismatch,
            format!(
                "the backup of {} does not match its recorded SHA-256; it was damaged",
                shown_path(&meta.original_path)
            ),
        )))
    }

    /// The backup bytes of a file snapshot.
    pub fn read_backup(root: &SandboxRoot, meta: &SnapshotMeta) -> Verdict<Vec<u8>> {
        let dir = snapshot_dir(root, &meta.workflow_id, &meta.action_id)
            .map_err(|e| open_refusal(root, &meta.workflow_id, &meta.action_id, &e))?
            .ok_or_else(|| {
                Refusal::new(
                    ReasonCode::NoRollbackData,
                    format!("the snapshot of {} is gone", shown_path(&meta.action_id)),
                )
            })?;
        read_regular(&dir, BACKUP_FILE, MAX_SNAPSHOT_BYTES).map_err(|e| {
            let rel = format!(
                "{ROLLBACK_DIR}/{}/{}/{BACKUP_FILE}",
                meta.workflow_id, meta.action_id
            );
            if let Some(r) = unreadable_record(root, &rel, &e) {
                return r;
            }
            // A link, a special file or a file with other links in its place is no
            // backup of the runtime's, as for a record: not lost (the runtime's own may
            // have been moved aside), but not used as it stands.
            let refused = e
                .get_ref()
                .and_then(|r| r.downcast_ref::<Refusal>())
                .map(|r| r.reason.clone())
                .or_else(|| stands_in_place(&e).then(|| crate::error::io_words(&e)));
            if let Some(what) = refused.filter(|_| !is_passing(&e)) {
                return Refusal::new(
                    ReasonCode::ChecksumMismatch,
                    format!(
                        "the backup {} {NOT_ITS_BACKUP} ({what}), so it is not used",
                        shown_path(&rel)
                    ),
                );
            }
            // A failure that passes (a failing disk, a limit of the process) is the
            // disk's, and trying again may do: as for the restore's own writes.
            let code = if is_passing(&e) {
                ReasonCode::IoError
            } else {
                ReasonCode::NoRollbackData
            };
            Refusal::new(
                code,
                format!(
                    "the backup of {} cannot be read: {}",
                    shown_path(&meta.original_path),
                    crate::error::io_words(&e)
                ),
            )
        })
    }

    /// Records that a snapshot was restored, so it is not restored twice.
    pub fn mark_restored(
        root: &SandboxRoot,
        key: &SealKey,
        meta: &SnapshotMeta,
        record: &serde_json::Value,
        durable: bool,
    ) -> Verdict {
        let dir = snapshot_dir(root, &meta.workflow_id, &meta.action_id)
            .map_err(|e| open_refusal(root, &meta.workflow_id, &meta.action_id, &e))?
            .ok_or_else(|| Refusal::new(ReasonCode::NoRollbackData, "the snapshot is gone"))?;
        // The mark names its snapshot, so a genuine mark copied elsewhere proves nothing.
        let mut record = record.clone();
        record["snapshot_id"] = serde_json::Value::String(meta.snapshot_id.clone());
        let bytes = key.seal(&record).map_err(|e| snap_io("encode", &e))?;
        write_atomic_in(&dir, RESTORED_FILE, &bytes, 0o600, false, durable)
            .map_err(|e| snap_io("mark", &e))
    }

    /// Records which directory each folder `meta`'s action made is (`ids`, in the order
    /// of its `created_dirs`), so that a rollback tells them from ones another program
    /// puts in their place. Not synced: a mark lost to a crash leaves the folders
    /// unrecorded, as before marks were written.
    pub fn mark_made(
        root: &SandboxRoot,
        key: &SealKey,
        meta: &SnapshotMeta,
        ids: &[crate::confine::root::DirId],
    ) -> Verdict {
        let dir = snapshot_dir(root, &meta.workflow_id, &meta.action_id)
            .map_err(|e| open_refusal(root, &meta.workflow_id, &meta.action_id, &e))?
            .ok_or_else(|| Refusal::new(ReasonCode::NoRollbackData, "the snapshot is gone"))?;
        let record = serde_json::json!({"made": ids, "snapshot_id": meta.snapshot_id});
        let bytes = key.seal(&record).map_err(|e| snap_io("encode", &e))?;
        write_atomic_in(&dir, MADE_FILE, &bytes, 0o600, false, false)
            .map_err(|e| snap_io("mark", &e))
    }

    /// The "restored" mark of a snapshot (what [`Snapshotter::mark_restored`] wrote);
    /// `None` when there is none, it cannot be read, or its seal is not `key`'s.
    pub fn restored_mark(
        root: &SandboxRoot,
        key: &SealKey,
        meta: &SnapshotMeta,
    ) -> Option<RestoredMark> {
        let dir = snapshot_dir(root, &meta.workflow_id, &meta.action_id).ok()??;
        let bytes = read_regular(&dir, RESTORED_FILE, 1 << 16).ok()?;
        // Sealed as the whole record, which holds more than the mark's fields.
        serde_json::from_value(open_mark(key, &bytes, meta).ok()?).ok()
    }

    /// Workflow ids that have snapshots in a root.
    pub fn list_workflows(root: &SandboxRoot) -> Verdict<Vec<String>> {
        let rb = match rollback_dir(root) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => return Err(store_refusal(root, &e)),
        };
        let mut out = Vec::new();
        for entry in rb.entries().map_err(|e| snap_io("list", &e))? {
            let entry = entry.map_err(|e| snap_io("list", &e))?;
            if let Some(name) = entry.file_name().to_str() {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Moves a workflow's snapshots in this root aside for removal, in one step, under a
    /// name no workflow can have (durable once [`Snapshotter::sync_store`] has run): from
    /// then on the workflow has none here, and a removal that dies half way leaves only
    /// that folder, which [`Snapshotter::sweep_pruned`] removes. Returns the folder's
    /// name, `None` when the workflow wrote nothing in this root.
    pub fn set_aside(
        root: &SandboxRoot,
        workflow_id: &str,
        judged: (u64, u64),
    ) -> Verdict<Option<String>> {
        use cap_std::fs::MetadataExt as _;
        let Some(rb) = rollback_dir(root).map_err(|e| snap_io("open", &e))? else {
            return Ok(None);
        };
        let aside = format!("{PRUNED_MARKER}{}", crate::ids::unique());
        match rb.rename(workflow_id, &rb, &aside) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            r => r.map_err(|e| snap_io("remove", &e))?,
        }
        let moved = rb.symlink_metadata(&aside).map(|m| (m.dev(), m.ino()));
        if moved.is_ok_and(|id| id == judged) {
            return Ok(Some(aside));
        }
        // Another program put another folder under the name since it was judged: it
        // goes back, unless something has taken the name meanwhile (then the next
        // prune's sweep of folders set aside finds it).
        let back = rustix::fs::renameat_with(
            &rb,
            aside.as_str(),
            &rb,
            workflow_id,
            rustix::fs::RenameFlags::NOREPLACE,
        );
        if let Err(e) = back {
            tracing::warn!(error = %e, workflow = %workflow_id, "a folder put in a pruned workflow's place could not be moved back");
        }
        Err(Refusal::new(
            ReasonCode::Conflict,
            "kept: another program put another folder in its snapshot folder's place while it was pruned; nothing of it was removed: prune again once the store is left alone",
        ))
    }

    /// Makes the moves of [`Snapshotter::set_aside`] in this root durable, however many
    /// workflows were moved (one sync of the store's folder).
    pub fn sync_store(root: &SandboxRoot) -> Verdict {
        match rollback_dir(root) {
            Ok(Some(rb)) => sync_dir(&rb).map_err(|e| snap_io("sync", &e)),
            Ok(None) => Ok(()),
            Err(e) => Err(snap_io("open", &e)),
        }
    }

    /// Removes a folder [`Snapshotter::set_aside`] moved aside (gone already is fine).
    pub fn remove_aside(root: &SandboxRoot, name: &str) -> Verdict {
        let Some(rb) = rollback_dir(root).map_err(|e| snap_io("open", &e))? else {
            return Ok(());
        };
        match rb.remove_dir_all(name) {
            // Gone, or going: another prune's sweep may be removing it at the same time.
            Err(_) if rb.symlink_metadata(name).is_err() => Ok(()),
            r => r.map_err(|e| snap_io("remove", &e)),
        }
    }

    /// Removes, of `names` (what [`Snapshotter::list_workflows`] found in this root's
    /// `.rollback`), the folders earlier prunes moved aside and did not finish removing
    /// (a prune that died). One that cannot be removed now (another prune may be
    /// removing it) is left for the next sweep. Returns how many were removed.
    pub fn sweep_pruned(root: &SandboxRoot, names: &[String]) -> usize {
        names
            .iter()
            .filter(|n| n.starts_with(PRUNED_MARKER))
            .filter(|n| match Self::remove_aside(root, n) {
                Ok(()) => true,
                // Said every time, or a folder that never goes holds its space unseen.
                Err(r) => {
                    tracing::warn!(folder = %n, reason = %r, "what an earlier prune set aside cannot be removed yet; each prune tries again");
                    false
                }
            })
            .count()
    }
}

/// What `meta`'s "made" mark in its folder `dir` says (see [`Snapshotter::mark_made`]):
/// none when there is none, or it cannot be read or trusted (a hint, which only makes a
/// rollback say more: without it, nothing is told of the folder).
fn made_mark(dir: &Dir, key: &SealKey, meta: &SnapshotMeta) -> Vec<crate::confine::root::DirId> {
    let read = || {
        let bytes = read_regular(dir, MADE_FILE, 1 << 16).ok()?;
        let mark = open_mark(key, &bytes, meta).ok()?;
        let ids: Vec<crate::confine::root::DirId> =
            serde_json::from_value(mark.get("made")?.clone()).ok()?;
        (ids.len() == meta.created_dirs.len()).then_some(ids)
    };
    if meta.created_dirs.is_empty() {
        return Vec::new();
    }
    read().unwrap_or_default()
}

/// Whether the record `meta`, read in `folder` (`dir`), may be taken as the snapshot of
/// action `action_id` of workflow `workflow_id` in `root`.
fn its_own(
    root: &SandboxRoot,
    dir: &Dir,
    folder: &str,
    meta: &SnapshotMeta,
    (workflow_id, action_id): (&str, &str),
) -> Verdict {
    // A backup this process may not read cannot give its file back: its snapshot is
    // neither rolled back nor judged nor pruned, as for its record (root reads all).
    if meta.kind == SnapshotKind::File && crate::confine::root::shut_to_reading(dir, BACKUP_FILE) {
        return Err(shut_out_of(root, &format!("{folder}/{BACKUP_FILE}")));
    }
    // A genuine record copied into another folder or root is still not this one.
    if meta.workflow_id != workflow_id || meta.action_id != action_id {
        return Err(untrusted(folder, META_FILE, &Unsealed::Forged));
    }
    if !root.is_named_by(&meta.root) {
        return Err(sealed_for_another_root(folder, &meta.root));
    }
    if let Some(why) = unwritable_path(meta) {
        return Err(untrusted_said(
            &format!("{folder}/{META_FILE}"),
            &format!("names {why}, which no action may write: it was not written by this runtime"),
        ));
    }
    Ok(())
}

/// An action's snapshot folder (`dir`, at `folder`) with no record: a snapshot stopped
/// before its record holds at most its backup and temporary files. Anything else was put
/// there by someone else, and a prune that took the folder for an unfinished snapshot
/// would remove it.
fn unfinished(dir: &Dir, folder: &str) -> Result<(), (Refusal, bool)> {
    let foreign: Vec<String> = dir
        .entries()
        .map_err(|e| (snap_io("list", &e), is_passing(&e)))?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().to_string_lossy().into_owned();
            // A record that appeared since it was looked for is a snapshot being made,
            // not something foreign.
            (name != BACKUP_FILE
                && name != META_FILE
                && name != MADE_FILE
                && !name.starts_with(TEMP_MARKER))
            .then_some(name)
        })
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    Err((
        untrusted_said(
            folder,
            &format!(
                "has no {META_FILE} but holds what the runtime did not make there ({})",
                foreign
                    .iter()
                    .map(|n| shown_path(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        false,
    ))
}
