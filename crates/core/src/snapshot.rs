//! Snapshots and rollback (SPEC §7).
//!
//! Before an action touches its target, the runtime writes
//! `{root}/.rollback/{workflow_id}/{action_id}/` with `backup` (the file's bytes, when it
//! existed) and `meta.json` (the original-path marker: path, whether it existed, kind,
//! size, SHA-256, mode, intent, time, and the directories the action will create), both
//! durable before the target is touched. A rollback puts the original back (or removes
//! what the action created) atomically and re-hashes the result.

use crate::catalog::MutationClass;
use crate::confine::path::{ROLLBACK_DIR, TEMP_MARKER, shown_path};
use crate::confine::root::{
    FILE_MODE, Flush, Make, Put, read_regular, sync_dir, write_atomic_flush, write_atomic_in,
};
use crate::confine::{RelPath, SandboxRoot, TargetKind};
use crate::hash::sha256_hex;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::seal::{SealKey, Unsealed};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt as _};
use serde::{Deserialize, Serialize};
use std::io;

/// Metadata file of a snapshot.
pub const META_FILE: &str = "meta.json";
/// Backup file of a snapshot.
pub const BACKUP_FILE: &str = "backup";
/// Prefix of a pruned workflow's snapshot folder moved aside for removal (a workflow id
/// never starts with a dot).
pub const PRUNED_MARKER: &str = ".ailab-pruned-";
/// Written once a snapshot has been restored.
pub const RESTORED_FILE: &str = "restored.json";

/// What a refusal says of something standing in a backup's place (a link, a FIFO, a
/// file with other links): the runtime's own may only have been moved aside.
pub const NOT_ITS_BACKUP: &str = "is not one the runtime wrote";

/// How a failed rollback step's reason (and its audit line's `error`) begins when the
/// restore was made, its target left as the undo leaves it, and what came after failed
/// (the root's sync, say): a rollback run again takes the target as its own doing.
/// Part of the trail's format: recovery and later rollbacks read audit lines written by
/// earlier builds by this prefix, so it never changes.
pub const PUT_BACK_UNCONFIRMED: &str = "put back, but not confirmed: ";

/// How a rollback step's `detail` begins when it left a directory in place.
pub const LEFT_IN_PLACE: &str = "left in place: ";
/// A directory left in place that holds what is not the workflow's.
const LEFT_IN_PLACE_SHARED: &str = "left in place: other files are in it, or it is another action's result; it is removed once empty and no one's";
/// A directory left in place that the action found there.
const LEFT_IN_PLACE_FOUND: &str = "left in place: it existed before the action";
/// Largest file the runtime snapshots (and so mutates).
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024;
const SNAPSHOT_DIR_MODE: u32 = 0o700;

/// What was at the target before the action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// A regular file (backed up).
    File,
    /// A directory (left untouched by `mkdir -p`, so nothing to copy).
    Directory,
    /// Nothing: the action creates it.
    Missing,
}

/// The original-path marker. A persisted format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMeta {
    /// Format version.
    pub format: u32,
    /// Time-ordered id: workflow rollback restores in reverse of this order.
    pub snapshot_id: String,
    /// The workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// The run that took it.
    pub execution_id: String,
    /// The root, as configured.
    pub root: String,
    /// The target, relative to the root.
    pub original_path: String,
    /// Whether the target existed.
    pub existed: bool,
    /// What it was.
    pub kind: SnapshotKind,
    /// Its size.
    pub size_bytes: Option<u64>,
    /// Its SHA-256.
    pub sha256: Option<String>,
    /// Its permission bits.
    pub mode: Option<u32>,
    /// The intent about to run.
    pub intent: String,
    /// Its mutation class.
    pub mutation_class: MutationClass,
    /// Directories (root-relative) the action creates, outermost first.
    pub created_dirs: Vec<String>,
    /// When.
    pub taken_at: String,
    /// The SHA-256 of the file the action is about to write (none for a directory, and
    /// in snapshots written before it was recorded): recovery tells the action's own
    /// unaudited write from someone else's later one by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_sha256: Option<String>,
    /// What completes the action, when the snapshot is also its commit record (batched
    /// durability): recovery finishes such an action instead of undoing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<SnapshotCommit>,
}

/// Everything recovery needs to finish a file write whose new bytes were made durable
/// together with its snapshot: the staged file beside the target, the checksum it must
/// have, and the registry entry and audit record the action appends once it is in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCommit {
    /// The temporary file in the target's directory that holds the new bytes.
    pub staged_name: String,
    /// SHA-256 of the new bytes.
    pub after_sha256: String,
    /// Whether the target must not exist when the staged file takes its place.
    pub no_replace: bool,
    /// The artifact the action registers.
    pub artifact: Option<crate::artifact::ArtifactEntry>,
    /// The audit record of its success.
    pub audit: crate::audit::AuditRecord,
}

impl SnapshotMeta {
    /// Whether the action makes a directory (rather than writing a file).
    pub fn is_directory_action(&self) -> bool {
        crate::catalog::op_for_intent(&self.intent).is_some_and(|op| op.is_directory())
    }

    /// The snapshot's folder, relative to its root: `.rollback/{workflow}/{action}`.
    pub fn rollback_path(&self) -> String {
        format!("{ROLLBACK_DIR}/{}/{}", self.workflow_id, self.action_id)
    }

    /// The target as a relative path.
    pub fn target(&self) -> RelPath {
        RelPath::from_recorded(&self.original_path)
    }
}

/// What a snapshot's "restored" mark says.
#[derive(Debug, Clone, Deserialize)]
pub struct RestoredMark {
    /// The rollback (or run undoing itself) that restored it.
    pub execution_id: String,
    /// When (absent from marks written before marks said it).
    #[serde(default)]
    pub restored_at: Option<String>,
    /// SHA-256 of what the restore left, `None` when it removed the target.
    pub restored_checksum: Option<String>,
    /// Directories the action created that the restore had to leave.
    #[serde(default)]
    pub left_dirs: Vec<LeftDir>,
    /// What the target held before a rollback's restore (`Some(None)`: nothing); `None`
    /// when the mark does not say (recovery's, or one written before marks said it).
    #[serde(default, deserialize_with = "present")]
    pub before_checksum: Option<Option<String>>,
}

/// A field that is there, null or not, as `Some` (absent: the default, `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// A directory an action created that its restore had to leave because it was not empty
/// then (a later action of the workflow or another workflow, not rolled back, or
/// someone else had a file in it). Kept by identity as well as by path, so that a later
/// restore removes it once it is empty (see `left_dirs`), and never a
/// directory of the same name someone made since.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeftDir {
    /// Relative to the root.
    pub path: String,
    /// Which directory it was.
    #[serde(flatten)]
    pub id: crate::confine::DirId,
}

/// A stored snapshot and whether it was already restored.
#[derive(Debug, Clone)]
pub struct StoredSnapshot {
    /// Its metadata.
    pub meta: SnapshotMeta,
    /// Whether a rollback already restored it.
    pub restored: bool,
}

/// Takes and reads snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshotter;

fn snap_io(what: &str, e: &io::Error) -> Refusal {
    // Closed to this process (its mode, an immutable mark): the operator's to give
    // back, as for a store folder others could change, not a failing disk (HTTP 500).
    if crate::confine::root::is_denied(e) {
        return Refusal::new(
            ReasonCode::ReservedPath,
            format!(
                "could not {what} the snapshot: permission denied: the snapshot store ({ROLLBACK_DIR}) or a folder or file in it is closed to this process (its mode or an immutable mark), so nothing is written, rolled back or pruned there until the operator gives it back to the runtime's user (owned by it, mode 0700 for folders, 0600 for files)"
            ),
        );
    }
    // Found a moment ago, then gone or a link: another program moved a folder of the
    // store while it was in use, which is no failing disk (HTTP 500).
    if e.kind() == io::ErrorKind::NotFound || crate::confine::root::is_escape_error(e) {
        return Refusal::new(
            ReasonCode::Conflict,
            format!(
                "could not {what} the snapshot: a folder of the snapshot store ({ROLLBACK_DIR}) was moved, removed or swapped by another program while it was in use; try again once it is back in place"
            ),
        );
    }
    Refusal::new(
        ReasonCode::IoError,
        // In the words every other write failure uses ("no storage space"), the OS's
        // own where the kind says nothing ("Too many open files"); none names a path.
        match crate::error::fs_advice(
            e,
            &format!("the snapshot store {ROLLBACK_DIR}'s filesystem"),
        ) {
            Some(advice) => format!(
                "could not {what} the snapshot: {} ({advice})",
                crate::error::io_words(e)
            ),
            None => format!(
                "could not {what} the snapshot: {}",
                crate::error::io_words(e)
            ),
        },
    )
}

/// Whether an I/O error says nothing about the folder (the process is out of
/// descriptors or memory, the disk out of space, the device failed): the same read may
/// succeed later, so no judgement is made on it.
fn is_passing(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [
        Errno::MFILE,
        Errno::NFILE,
        Errno::NOMEM,
        Errno::IO,
        Errno::INTR,
        Errno::AGAIN,
        Errno::NOSPC,
        Errno::DQUOT,
        Errno::NOBUFS,
    ]
    .iter()
    .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// A restore mark sealed by `key` for the snapshot `meta` (not another one's).
fn open_mark(
    key: &SealKey,
    bytes: &[u8],
    meta: &SnapshotMeta,
) -> Result<serde_json::Value, Unsealed> {
    let mark = key.open::<serde_json::Value>(bytes)?;
    if mark.get("snapshot_id").and_then(serde_json::Value::as_str) != Some(&meta.snapshot_id) {
        return Err(Unsealed::Forged);
    }
    Ok(mark)
}

/// A snapshot record that is damaged or was not sealed by this runtime's key.
fn untrusted(folder: &str, file: &str, why: &Unsealed) -> Refusal {
    let detail = match why {
        Unsealed::Malformed(e) => format!("is damaged ({e})"),
        Unsealed::Forged => {
            "does not carry this runtime's seal: it was changed or written by something else, or the state directory's seal key was replaced since it was sealed"
                .to_owned()
        }
    };
    untrusted_said(&format!("{folder}/{file}"), &detail)
}

/// What in a sealed record no action could have written, if anything: a target or a
/// folder made that is not a plain relative path, lies in the snapshot store, goes
/// deeper than any depth allowed, or has an extension always blocked. A restore goes only
/// where a write could have gone, even under a record forged with the seal key.
fn unwritable_path(meta: &SnapshotMeta) -> Option<String> {
    use crate::confine::path::{
        ExtensionPolicy, MAX_PATH_DEPTH, check_path_depth, check_reserved, detect_path_traversal,
        normalize_extension, split_relative,
    };
    let blocked = ExtensionPolicy::new(None, &[]);
    let judge = |path: &str, is_file: bool| -> Verdict {
        if path.starts_with('/') {
            return Err(Refusal::new(ReasonCode::PathTraversal, "an absolute path"));
        }
        detect_path_traversal(path)?;
        let rel = split_relative(path)?;
        check_reserved(&rel)?;
        check_path_depth(&rel, MAX_PATH_DEPTH)?;
        let (dirs, file) = match is_file {
            true => (rel.parent_components(), Some(rel.file_name())),
            false => (rel.components(), None),
        };
        blocked.check_directories(dirs)?;
        match file.map(normalize_extension) {
            Some(ext) if blocked.is_extension_blocked(&ext) => Err(Refusal::new(
                ReasonCode::BlockedExtension,
                "a blocked extension",
            )),
            _ => Ok(()),
        }
    };
    let target = judge(&meta.original_path, !meta.is_directory_action());
    let made = meta.created_dirs.iter().map(|d| (d, judge(d, false)));
    std::iter::once((&meta.original_path, target))
        .chain(made)
        .find_map(|(path, v)| {
            v.err()
                .map(|r| format!("{} ({})", shown_path(path), r.reason))
        })
}

/// A snapshot folder or record (`at`, in its root) that is not trusted, and why (`detail`):
/// as a forged one, `checksum_mismatch` (a conflict with what the runtime recorded), not
/// a failure of the disk.
fn untrusted_said(at: &str, detail: &str) -> Refusal {
    Refusal::new(
        ReasonCode::ChecksumMismatch,
        format!(
            "the snapshot record {} {detail}; it is not trusted for rollback or recovery (inspect the folder: put the runtime's own record back if it was moved aside, remove what stands there only if it is not the runtime's)",
            shown_path(at)
        ),
    )
}

/// A genuine record (its seal holds) made for another root than the one it lies in: a
/// root moved or copied to another path, or a snapshot folder copied from another root.
/// The seal binds a record to its root, so it is refused all the same; the words say
/// where it belongs rather than calling it forged.
fn sealed_for_another_root(folder: &str, sealed_root: &str) -> Refusal {
    Refusal::new(
        ReasonCode::ChecksumMismatch,
        format!(
            "the snapshot record {} was sealed for the root {}, not this one: a root moved or copied to another path keeps its files but not its snapshots, which are not trusted for rollback or recovery here (roll back with the runtime given the root at {} again, or remove the folder if it was copied from there)",
            shown_path(&format!("{folder}/{META_FILE}")),
            shown_path(sealed_root),
            shown_path(sealed_root)
        ),
    )
}

/// Whether `e` says a path was not opened for what stands there: a symbolic link (never
/// followed) or a file where a folder was expected.
fn stands_in_place(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::LOOP, Errno::NOTDIR, Errno::MLINK]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// Why a snapshot's folder could not be opened (`e`): something in the place of the store
/// or of the workflow's folder (`reserved_path`, as taking a snapshot names it), or of
/// the snapshot's own folder (not the runtime's record), else a failure of the disk.
fn open_refusal(root: &SandboxRoot, workflow_id: &str, action_id: &str, e: &io::Error) -> Refusal {
    if is_passing(e) {
        return snap_io("open", e);
    }
    let scope = "in this root, and no workflow is rolled back or pruned,";
    if let Some(r) = not_a_folder(root, root.dir(), ROLLBACK_DIR, ROLLBACK_DIR, scope) {
        return r;
    }
    if let Ok(Some(rb)) = rollback_dir(root) {
        let rel = format!("{ROLLBACK_DIR}/{workflow_id}");
        let scope =
            format!("for workflow {workflow_id} in this root, nor is it rolled back or pruned,");
        if let Some(r) = not_a_folder(root, &rb, workflow_id, &rel, &scope) {
            return r;
        }
        if let Ok(Some(wf)) = open_existing(&rb, workflow_id)
            && wf.symlink_metadata(action_id).is_ok_and(|m| !m.is_dir())
        {
            return untrusted_said(
                &format!("{rel}/{action_id}"),
                "is not a folder (a symbolic link, a file or a special file stands there)",
            );
        }
    }
    snap_io("open", e)
}

fn rollback_dir(root: &SandboxRoot) -> io::Result<Option<Dir>> {
    open_existing(root.dir(), ROLLBACK_DIR)
}

/// Opens the directory `name` in `dir` without following a symlink; `None` if missing.
fn open_existing(dir: &Dir, name: &str) -> io::Result<Option<Dir>> {
    match dir.open_dir_nofollow(name) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes the action folder `name` in the workflow's folder `wf` when it holds nothing
/// but a regular backup (see [`Snapshotter::remove_unfinished`]); says whether it did,
/// or, when it could not, under which name the folder stays and why.
fn remove_if_unfinished(wf: &Dir, name: &str) -> Result<bool, (String, io::Error)> {
    let here = |e| (name.to_owned(), e);
    // Not followed: a link or a file in a folder's place is no snapshot of ours.
    let Ok(dir) = wf.open_dir_nofollow(name) else {
        return Ok(false);
    };
    let (mut backup, mut empty_meta) = (false, false);
    for e in dir.entries().map_err(here)? {
        let e = e.map_err(here)?;
        let file = crate::confine::root::entry_type(&e)
            .map_err(here)?
            .is_file();
        match e.file_name().to_str() {
            Some(BACKUP_FILE) if file => backup = true,
            // Metadata whose name reached the disk and whose bytes did not (a power cut
            // before the sync point that was to make the snapshot durable, which comes
            // before the target is touched): none.
            Some(META_FILE) if file && e.metadata().map_err(here)?.len() == 0 => {
                empty_meta = true;
            }
            _ => return Ok(false),
        }
    }
    // Moved aside first, so that a workflow folder it cannot be removed from stops it
    // before its backup is gone; put back if it cannot be emptied. The name is no
    // action id (ids hold no dot at their start), and no other folder's.
    let aside = format!(".ailab-unfinished-{}-{name}", crate::ids::unique());
    wf.rename(name, wf, &aside).map_err(here)?;
    let gone = (|| {
        if backup {
            dir.remove_file(BACKUP_FILE)?;
        }
        if empty_meta {
            dir.remove_file(META_FILE)?;
        }
        wf.remove_dir(&aside)
    })();
    match gone {
        Ok(()) => Ok(true),
        Err(e) => match wf.rename(&aside, wf, name) {
            Ok(()) => Err((name.to_owned(), e)),
            // Its id is free all the same; a prune removes it.
            Err(_) => Err((aside, e)),
        },
    }
}

/// Opens `name` in `dir`, creating it (mode 0700) if missing; says whether it was made.
/// A concurrent creator may win the creation; opening decides either way.
fn open_or_create_tracked(dir: &Dir, name: &str) -> Verdict<(Dir, bool)> {
    if let Ok(d) = dir.open_dir_nofollow(name) {
        return Ok((d, false));
    }
    let mut b = DirBuilder::new();
    b.mode(SNAPSHOT_DIR_MODE);
    let made = dir.create_dir_with(name, &b);
    let d = dir.open_dir_nofollow(name).map_err(|e| match &made {
        // Not there because it could not be made (no space, no inodes): that is the
        // cause to name, not "No such file or directory".
        Err(cause) if e.kind() == io::ErrorKind::NotFound => snap_io("create", cause),
        _ => snap_io("create", &e),
    })?;
    Ok((d, made.is_ok()))
}

/// Opens a root's snapshot store (`.rollback`), creating it (private) when missing,
/// for writing snapshots into. One that another user owns or could write in is
/// refused: whoever can write there can remove the snapshots, and in a root writable by
/// others (with the sticky bit, as the SPEC allows) anyone may make `.rollback` before
/// the runtime does.
fn snapshot_store(root: &SandboxRoot) -> Verdict<(Dir, bool)> {
    let (rb, made) = open_or_create_tracked(root.dir(), ROLLBACK_DIR).map_err(|r| {
        not_a_folder(root, root.dir(), ROLLBACK_DIR, ROLLBACK_DIR, "in this root").unwrap_or(r)
    })?;
    check_private(root, &rb, ROLLBACK_DIR)?;
    Ok((rb, made))
}

/// Opens (or creates) a workflow's folder in the snapshot store, refused like the
/// store itself when another user owns it or could write in it.
fn workflow_folder(root: &SandboxRoot, rb: &Dir, workflow_id: &str) -> Verdict<(Dir, bool)> {
    let rel = format!("{ROLLBACK_DIR}/{workflow_id}");
    let (wf, made) = open_or_create_tracked(rb, workflow_id).map_err(|r| {
        let scope = format!("for workflow {workflow_id} in this root");
        not_a_folder(root, rb, workflow_id, &rel, &scope).unwrap_or(r)
    })?;
    check_private(root, &wf, &rel)?;
    Ok((wf, made))
}

/// Whether snapshots of `workflow_id` can be kept in `root`, found without making
/// anything: a `.rollback` or workflow folder that is there must be a private folder
/// (taking a snapshot refuses the others). A plan checks this
/// before it writes, so that such a root blocks the plan rather than failing it after
/// its earlier actions were written.
/// Without a workflow (`None`), the store itself only.
pub fn check_store(root: &SandboxRoot, workflow_id: Option<&str>) -> Verdict {
    // Looked at, not opened: one `fstatat` each, on the write path of every plan (a
    // folder is opened only when its mode leaves room for an access control list that
    // gives others write).
    let look = |dir: &Dir, name: &str, rel: &str, scope: &str| match dir.symlink_metadata(name) {
        Ok(m) if m.is_dir() => {
            check_looked_at(root, &m, rel, || dir.open_dir_nofollow(name)).map(|()| true)
        }
        Ok(_) => not_a_folder(root, dir, name, rel, scope).map_or(Ok(false), Err),
        Err(_) => Ok(false),
    };
    if !look(root.dir(), ROLLBACK_DIR, ROLLBACK_DIR, "in this root")? {
        return Ok(());
    }
    let Some(workflow_id) = workflow_id else {
        return Ok(());
    };
    let rel = format!("{ROLLBACK_DIR}/{workflow_id}");
    match root.dir().symlink_metadata(&rel) {
        Ok(m) if m.is_dir() => check_looked_at(root, &m, &rel, || {
            root.dir()
                .open_dir_nofollow(ROLLBACK_DIR)?
                .open_dir_nofollow(workflow_id)
        }),
        Ok(_) => match root.dir().open_dir_nofollow(ROLLBACK_DIR) {
            Ok(rb) => {
                let scope = format!("for workflow {workflow_id} in this root");
                look(&rb, workflow_id, &rel, &scope).map(|_| ())
            }
            Err(_) => Ok(()),
        },
        Err(_) => Ok(()),
    }
}

/// [`check_private`] for a folder of the snapshot store (`rel` in `root`) looked at
/// (`m`) but not opened: `open` opens it (following no link) only when its mode leaves
/// room for an access control list giving others write, which only the folder open can
/// tell.
fn check_looked_at(
    root: &SandboxRoot,
    m: &cap_std::fs::Metadata,
    rel: &str,
    open: impl FnOnce() -> io::Result<Dir>,
) -> Verdict {
    if let Some(problem) = not_private(m) {
        return Err(not_private_refusal(root, rel, &problem, KEPT_FROM_WRITING));
    }
    if !crate::confine::root::list_may_give_write(m.mode()) {
        return Ok(());
    }
    match open() {
        Ok(dir) => check_private(root, &dir, rel),
        // Gone since it was looked at: nothing there to judge (taking a snapshot judges
        // whatever stands there then).
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(snap_io("inspect", &e)),
    }
}

/// The refusal for a folder of the snapshot store (`name` in `dir`, `rel` in `root`)
/// that could not be opened because something else stands in its place (a file, a
/// symbolic link, a FIFO); `None` when nothing does. `scope`: what it stops, as in
/// "nothing is written {scope}".
fn not_a_folder(
    root: &SandboxRoot,
    dir: &Dir,
    name: &str,
    rel: &str,
    scope: &str,
) -> Option<Refusal> {
    let m = dir.symlink_metadata(name).ok()?;
    let ft = m.file_type();
    let what = if ft.is_dir() {
        return None;
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a file"
    } else {
        "a FIFO, socket or device"
    };
    Some(Refusal::new(
        ReasonCode::ReservedPath,
        format!(
            "the snapshot folder {} is {what}, not a folder, so no snapshot can be kept there; nothing is written {scope} until the operator removes it (the runtime then makes its own, private folder)",
            shown_path(&root.path().join(rel).display().to_string())
        ),
    ))
}

/// Why a root's snapshot store could not be opened to be read (`e`): something else in
/// its place is named, as taking a snapshot names it.
fn store_refusal(root: &SandboxRoot, e: &io::Error) -> Refusal {
    let scope = "in this root, and no workflow is rolled back or pruned,";
    not_a_folder(root, root.dir(), ROLLBACK_DIR, ROLLBACK_DIR, scope)
        .unwrap_or_else(|| snap_io("open", e))
}

/// What a refusal of a folder others could write in says it means when writing.
const KEPT_FROM_WRITING: &str = "others could remove the snapshots kept there; nothing is written there until the operator removes that folder (the runtime then makes its own, private one)";

/// Refuses a folder of the snapshot store (`rel` in `root`, open as `dir`) that another
/// user owns or could write in, by its mode or through its access control list.
fn check_private(root: &SandboxRoot, dir: &Dir, rel: &str) -> Verdict {
    refuse_unless_private(root, dir, rel, KEPT_FROM_WRITING)
}

/// [`check_private`] for a folder whose snapshots are about to be read (restored,
/// judged, pruned): one others could change is not used either, and is kept as it is.
fn check_private_to_read(root: &SandboxRoot, dir: &Dir, rel: &str) -> Verdict {
    refuse_unless_private(
        root,
        dir,
        rel,
        "others could have changed the snapshots kept there; nothing is rolled back, judged or pruned from it until the operator makes it private to the runtime's user again (owned by it, writable by no one else, by its mode or an access control list); its snapshots are kept",
    )
}

/// Refuses (`reserved_path`) the snapshot folder open as `dir` when another user owns
/// it or could write in it, saying what that means here (`then`).
fn refuse_unless_private(root: &SandboxRoot, dir: &Dir, rel: &str, then: &str) -> Verdict {
    let m = dir.dir_metadata().map_err(|e| snap_io("inspect", &e))?;
    let problem = not_private(&m).or_else(|| {
        crate::confine::root::others_may_write(&m, dir).map(|how| writable_words(&m, how))
    });
    match problem {
        None => Ok(()),
        Some(problem) => Err(not_private_refusal(root, rel, &problem, then)),
    }
}

/// What makes the snapshot folder `m` describes another user's or open to others by
/// its owner and mode alone (its access control list is the caller's to judge).
fn not_private(m: &cap_std::fs::Metadata) -> Option<String> {
    use crate::confine::root::NotOurs as Why;
    match crate::confine::root::not_ours(m)? {
        Why::Owner(uid) => Some(format!(
            "is owned by uid {uid}, not by this process's uid {}",
            crate::confine::root::euid()
        )),
        Why::Writable { .. } => Some(writable_words(m, "")),
    }
}

/// How a folder others may write in is described; `how`: the words
/// `others_may_write` gives (how they may).
fn writable_words(m: &cap_std::fs::Metadata, how: &str) -> String {
    format!(
        "is writable by other users{how} (group {}, mode {:04o})",
        m.gid(),
        m.mode() & 0o7777
    )
}

/// The refusal (`reserved_path`) of the snapshot folder `rel` in `root`, which
/// `problem` says is not private, and what that means here (`then`).
fn not_private_refusal(root: &SandboxRoot, rel: &str, problem: &str, then: &str) -> Refusal {
    Refusal::new(
        ReasonCode::ReservedPath,
        format!(
            "the snapshot folder {} {problem}, so {then}",
            shown_path(&root.path().join(rel).display().to_string())
        ),
    )
}

/// A file of a snapshot folder (`rel`) this process may not read (EACCES: another user
/// took it, or closed its mode): the operator's to give back, not damage and not a
/// failing disk. Its snapshot is kept, as one in a folder that is not private.
fn unreadable_record(root: &SandboxRoot, rel: &str, e: &io::Error) -> Option<Refusal> {
    (e.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()))
        .then(|| shut_out_of(root, rel))
}

/// The refusal for the snapshot file `rel` this process may not read (see
/// [`unreadable_record`]).
fn shut_out_of(root: &SandboxRoot, rel: &str) -> Refusal {
    Refusal::new(
        ReasonCode::ReservedPath,
        format!(
            "the snapshot file {} cannot be read by this process (permission denied: another user owns it or its mode forbids reading), so nothing is rolled back, judged or pruned from its folder until the operator gives it back to the runtime's user (owned by it, readable by it); its snapshot is kept",
            shown_path(&root.path().join(rel).display().to_string())
        ),
    )
}

fn snapshot_dir(root: &SandboxRoot, workflow_id: &str, action_id: &str) -> io::Result<Option<Dir>> {
    let Some(rb) = rollback_dir(root)? else {
        return Ok(None);
    };
    let Some(wf) = open_existing(&rb, workflow_id)? else {
        return Ok(None);
    };
    open_existing(&wf, action_id)
}

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
            // A snapshot stopped before its record: the folder holds at most its backup
            // and temporary files. Anything else was put there by someone else, and a
            // prune that took the folder for an unfinished snapshot would remove it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let foreign: Vec<String> = dir
                    .entries()
                    .map_err(|e| (snap_io("list", &e), is_passing(&e)))?
                    .filter_map(|entry| {
                        let name = entry.ok()?.file_name().to_string_lossy().into_owned();
                        // A record that appeared since it was looked for is a snapshot
                        // being made, not something foreign.
                        (name != BACKUP_FILE && name != META_FILE && !name.starts_with(TEMP_MARKER))
                            .then_some(name)
                    })
                    .collect();
                if foreign.is_empty() {
                    return Ok(None);
                }
                return Err(trust(untrusted_said(
                    &folder,
                    &format!(
                        "has no {META_FILE} but holds what the runtime did not make there ({})",
                        foreign
                            .iter()
                            .map(|n| shown_path(n))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )));
            }
            Err(e) => return Err(unread(META_FILE, &e)),
        };
        // A backup this process may not read cannot give its file back: its snapshot is
        // neither rolled back nor judged nor pruned, as for its record (root reads all).
        if meta.kind == SnapshotKind::File
            && crate::confine::root::shut_to_reading(&dir, BACKUP_FILE)
        {
            return Err(trust(shut_out_of(root, &format!("{folder}/{BACKUP_FILE}"))));
        }
        // A genuine record copied into another folder or root is still not this one.
        if meta.workflow_id != workflow_id || meta.action_id != action_id {
            return Err(trust(untrusted(&folder, META_FILE, &Unsealed::Forged)));
        }
        if !root.is_named_by(&meta.root) {
            return Err(trust(sealed_for_another_root(&folder, &meta.root)));
        }
        if let Some(why) = unwritable_path(&meta) {
            return Err(trust(untrusted_said(
                &format!("{folder}/{META_FILE}"),
                &format!(
                    "names {why}, which no action may write: it was not written by this runtime"
                ),
            )));
        }
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
    /// could not be removed, each with why: those stay.
    pub fn remove_unfinished(
        root: &SandboxRoot,
        workflow_id: &str,
        ran: impl Fn(&str) -> bool,
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
            match remove_if_unfinished(&wf, &name) {
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
                Err((r, _)) => untrusted.push(Refusal::new(
                    r.reason_code,
                    format!(
                        "{}: {}",
                        // In full: with several roots, each has a store.
                        shown_path(
                            &root
                                .path()
                                .join(ROLLBACK_DIR)
                                .join(workflow_id)
                                .join(&name)
                                .display()
                                .to_string()
                        ),
                        r.reason
                    ),
                )),
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
    pub fn set_aside(root: &SandboxRoot, workflow_id: &str) -> Verdict<Option<String>> {
        let Some(rb) = rollback_dir(root).map_err(|e| snap_io("open", &e))? else {
            return Ok(None);
        };
        let aside = format!("{PRUNED_MARKER}{}", crate::ids::unique());
        match rb.rename(workflow_id, &rb, &aside) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            r => r.map_err(|e| snap_io("remove", &e))?,
        }
        Ok(Some(aside))
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

/// How far a restore takes what it finds as it is ([`RollbackEngine::restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forced {
    /// Not at all.
    No,
    /// A forced rollback: a directory the action made that holds what is not the
    /// workflow's is left in place rather than refused.
    Yes,
    /// Recovery of a dead run: as forced, and a file whose directory goes just as it is
    /// to be removed is taken as gone with it (the undo must come to an end).
    Recovering,
}

/// What a restore found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreOutcome {
    /// Whether the target now matches the snapshot (same SHA-256, or absent as before).
    pub checksum_validated: bool,
    /// SHA-256 of the restored file, when one was restored.
    pub restored_checksum: Option<String>,
    /// Directories the action created that were not empty, so stayed.
    #[serde(skip)]
    pub left_dirs: Vec<LeftDir>,
    /// What became of a target no checksum describes (removed, or a directory left or
    /// made again), for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Restores snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RollbackEngine;

impl RollbackEngine {
    /// Removes the directories the action created to reach its target, deepest first,
    /// those that are empty; returns those that were not.
    ///
    /// `keep` names the directories someone else has come to rely on since (another
    /// workflow's `create_directory` found one and made it its result): those stay, and
    /// are returned as left like one that is not empty.
    pub fn remove_created_dirs(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        durable: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Verdict<Vec<LeftDir>> {
        let mut left_dirs = Vec::new();
        for d in meta.created_dirs.iter().rev() {
            if *d == meta.original_path {
                continue;
            }
            let dir = RelPath::from_recorded(d);
            // Beyond a symbolic link or special file someone put on the way, it is out of
            // the root's reach: nothing there can be removed or recorded through it (and
            // a write refused at that link made nothing beyond it).
            match root.dir_id(&dir) {
                Err(r)
                    if matches!(
                        r.reason_code,
                        ReasonCode::SymlinkEscape
                            | ReasonCode::SymlinkRefused
                            | ReasonCode::NotRegularFile
                    ) =>
                {
                    tracing::warn!(dir = %d, reason = %r.reason, "a directory its action may have made is out of reach");
                    continue;
                }
                Err(r) => return Err(r),
                Ok(_) => {}
            }
            // Whether someone relies on it is only asked of an empty one (it may read the
            // whole trail).
            let empty = root.is_empty_dir(&dir).is_ok_and(|empty| empty);
            // One that cannot be removed now (busy as a mount point, a failing disk) is
            // left on the ledger like one that holds others' files: a later rollback
            // removes it once it can, rather than it staying for good.
            let removed = empty
                && !keep(d)
                && root
                    .remove_empty_dir(&dir, None, durable)
                    .unwrap_or_else(|r| {
                        tracing::warn!(dir = %d, reason = %r.reason, "a directory its action made could not be removed now; left for a later rollback beneath it or the next prune");
                        false
                    });
            if !removed && let Some(id) = root.dir_id(&dir)? {
                left_dirs.push(LeftDir {
                    path: d.clone(),
                    id,
                });
            }
        }
        Ok(left_dirs)
    }

    /// The detail of a restore that left the target absent, as its action found it.
    pub(crate) fn absent_detail(meta: &SnapshotMeta) -> String {
        if meta.is_directory_action() {
            "removed: the action made it".to_owned()
        } else {
            "removed: it did not exist before the action".to_owned()
        }
    }

    /// Puts the original back: rewrites a file from its backup (atomically), or removes
    /// what the action created, then verifies by hashing.
    ///
    /// `changed` runs once the target is changed, before it is verified. From then on a
    /// verification that cannot be made for the runtime's own reasons (`changed` fails,
    /// or reading back fails on a full table of open files, a disk error or a
    /// permission) leaves the
    /// restore done but unverified (`checksum_validated: false`, the detail saying why),
    /// not failed: it must be recorded as what happened. A restored file that is no
    /// longer there to read back (another program moved it away, or put a link or a
    /// folder in its place at that instant) is a mismatch like different bytes: the
    /// snapshot's bytes are not what stands there, and the step is left for a rollback
    /// to do again.
    ///
    /// `put` says what the caller judged the target to be: a file ([`Put::Unchanged`]),
    /// which alone is then replaced or removed, nothing ([`Put::New`]), or anything
    /// (forced), so that a change another program makes after the judgement is not
    /// undone unseen (`conflict`). `forced`: a directory the action made that holds what
    /// is not the workflow's is left in place rather than refused.
    ///
    /// A file the action made whose directory is missing is not called verified gone:
    /// the directory may have been moved away with it (and come back). One whose
    /// directory goes between the look and the removal is a `conflict` (nothing was
    /// removed), except when `recovering`: a dead run's undo must come to an end.
    pub fn restore(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        durable: bool,
        put: Put,
        forced: Forced,
        keep: &dyn Fn(&str) -> bool,
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let rel = meta.target();
        match meta.kind {
            SnapshotKind::File => Self::restore_file(root, meta, &rel, durable, put, changed),
            SnapshotKind::Missing => {
                Self::restore_absent(root, meta, &rel, (durable, put, forced), keep, changed)
            }
            SnapshotKind::Directory => Self::restore_directory(root, meta, &rel, durable),
        }
    }

    /// [`RollbackEngine::restore`] of a file the action found: rewritten from its backup.
    fn restore_file(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        durable: bool,
        put: Put,
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let bytes = Snapshotter::read_checked_backup(root, meta)??;
        let expected = meta.sha256.clone().unwrap_or_default();
        let mode = meta.mode.unwrap_or(FILE_MODE) & 0o666;
        root.write_atomic_put(rel, &bytes, mode, put, Make::From(0), durable)?;
        let back = match changed().and_then(|()| root.read_file(rel, MAX_SNAPSHOT_BYTES)) {
            Ok(b) => b,
            // Gone, or something else in its place: not what the restore wrote.
            Err(r)
                if matches!(
                    r.reason_code,
                    ReasonCode::NotFound
                        | ReasonCode::SymlinkEscape
                        | ReasonCode::SymlinkRefused
                        | ReasonCode::HardlinkRefused
                        | ReasonCode::NotRegularFile
                ) =>
            {
                return Err(Refusal::new(
                    ReasonCode::ChecksumMismatch,
                    format!(
                        "{} was restored, but what stands there now cannot be read back ({}): another program changed it at that instant; roll back again, with force if it is then a conflict",
                        shown_path(&meta.original_path),
                        r.reason
                    ),
                ));
            }
            // The runtime's own reading failed (a disk error, no descriptor, a
            // permission): the restore is done, unverified; what it wrote is the
            // backup's bytes, checked against their record before the write.
            Err(r) => return Ok(unverified(meta, r, Some(expected))),
        };
        let restored = sha256_hex(&back);
        if restored != expected {
            return Err(Refusal::new(
                ReasonCode::ChecksumMismatch,
                format!(
                    "{} reads back with SHA-256 {restored}, not the snapshot's {expected}",
                    shown_path(&meta.original_path)
                ),
            ));
        }
        Ok(RestoreOutcome {
            checksum_validated: true,
            restored_checksum: Some(restored),
            left_dirs: Vec::new(),
            detail: None,
        })
    }

    /// [`RollbackEngine::restore`] of a path the action found absent: what it made
    /// there removed, with the folders it made on the way that are no one else's.
    fn restore_absent(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        (durable, put, forced): (bool, Put, Forced),
        keep: &dyn Fn(&str) -> bool,
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let info = root.inspect(rel)?;
        let found = info.kind;
        // The outermost directory missing on the way to the target, if any: the
        // target may live on where it was moved.
        let parents = rel.parent_components();
        let away = (info.existing_parents < parents.len())
            .then(|| parents[..=info.existing_parents].join("/"));
        match found {
            // A directory action made no file: one there now is someone else's.
            TargetKind::File { .. } if meta.is_directory_action() => {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "{} is now a file where the action made a directory; it was left in place",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
            TargetKind::File { .. } => {
                // Its directory gone between the look and the removal: the file
                // was seen, and not removed. A later rollback finds it again, or
                // finds the directory gone.
                if !root.remove_file_put(rel, put, durable)? && forced != Forced::Recovering {
                    return Err(Refusal::new(
                        ReasonCode::Conflict,
                        format!(
                            "the directory holding {} was moved or removed just as it was to be removed; nothing was removed: roll back again",
                            shown_path(&meta.original_path)
                        ),
                    ));
                }
            }
            TargetKind::Directory => {
                if let Some(left) =
                    Self::remove_made_directory(root, meta, rel, (durable, forced), keep)?
                {
                    return Ok(left);
                }
            }
            TargetKind::Missing => {}
        }
        // Folders made on the way that could be neither removed nor put on the ledger (a
        // descriptor or the disk failing) fail the step, put back but not confirmed:
        // called done, it would leave them for good, where a rollback run again removes
        // them.
        let after = match changed() {
            Ok(()) => {
                let left_dirs = Self::remove_created_dirs(root, meta, durable, keep)?;
                root.inspect(rel)
                    .map(|i| (left_dirs, i.kind == TargetKind::Missing))
            }
            Err(r) => Err(r),
        };
        // Found missing beneath a missing directory: removed with it, or moved
        // away with it (and maybe back since); nothing says which, so the step
        // is not called verified.
        let unseen = away.filter(|_| found == TargetKind::Missing);
        if let (Ok((_, false)), Some(dir)) = (&after, &unseen) {
            // The directory came back, the file in it: nothing was removed.
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "the directory {} on the way to {} was missing, and is back with something in the target's place; nothing was removed: roll back again",
                    shown_path(dir),
                    shown_path(&meta.original_path)
                ),
            ));
        }
        match after {
            Ok((left_dirs, gone)) => Ok(RestoreOutcome {
                checksum_validated: gone && unseen.is_none(),
                restored_checksum: None,
                detail: Some({
                    let mut d = if !gone {
                        "removed, but something stands there again: another program put it there after the removal".to_owned()
                    } else if let Some(dir) = &unseen {
                        format!(
                            "not found, nor the directory {} on the way: removed with it, or moved away with it (where it would live on); nothing was removed, and nothing could be checked",
                            shown_path(dir)
                        )
                    } else if found == TargetKind::Missing {
                        // Someone removed it before the rollback: nothing was.
                        "already gone before this restore, as before the action".to_owned()
                    } else {
                        Self::absent_detail(meta)
                    };
                    d.push_str(&left_dirs_words(&left_dirs));
                    d
                }),
                left_dirs,
            }),
            Err(r) => Ok(unverified(meta, r, None)),
        }
    }

    /// [`Self::restore_absent`] of a directory standing where the action made one:
    /// removed when empty and no one's (`None`: the restore goes on with the folders
    /// made on the way); else left in place, as a directory the restore had to leave,
    /// so that a later restore removes it once it is empty and no one's. Unforced,
    /// something put in it since the rollback's check is a change it never saw: a
    /// conflict.
    fn remove_made_directory(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        (durable, forced): (bool, Forced),
        keep: &dyn Fn(&str) -> bool,
    ) -> Verdict<Option<RestoreOutcome>> {
        // Another action's result now, or holding what is not the workflow's in a
        // forced rollback: kept.
        let claimed = keep(&meta.original_path);
        let removed = !claimed && root.remove_empty_dir(rel, None, durable)?;
        if removed {
            return Ok(None);
        }
        if !claimed && forced == Forced::No {
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "{} is a directory that is no longer empty; it was left in place",
                    shown_path(&meta.original_path)
                ),
            ));
        }
        let mut left_dirs = Self::remove_created_dirs(root, meta, durable, keep)?;
        if let Some(id) = root.dir_id(rel)? {
            left_dirs.push(LeftDir {
                path: meta.original_path.clone(),
                id,
            });
        }
        Ok(Some(RestoreOutcome {
            checksum_validated: true,
            restored_checksum: None,
            left_dirs,
            detail: Some(LEFT_IN_PLACE_SHARED.to_owned()),
        }))
    }

    /// [`RollbackEngine::restore`] of a directory the action found: made again if gone.
    fn restore_directory(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        durable: bool,
    ) -> Verdict<RestoreOutcome> {
        // The action found the directory there; if it is gone, it is made again.
        let detail = match root.inspect(rel)?.kind {
            TargetKind::Directory => LEFT_IN_PLACE_FOUND,
            TargetKind::Missing => {
                root.create_dir_all(rel, durable)?;
                "made again: it existed before the action"
            }
            TargetKind::File { .. } => {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "{} was a directory and is now a file; it was left in place",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
        };
        let still = root.inspect(rel)?.kind == TargetKind::Directory;
        Ok(RestoreOutcome {
            checksum_validated: still,
            restored_checksum: None,
            left_dirs: Vec::new(),
            detail: still.then(|| detail.to_owned()),
        })
    }
}

/// What a restore that could not be checked afterwards for the runtime's own reasons
/// (`r`) did: done, unverified, having `written` (the checksum of the bytes it wrote;
/// none for a removal), which its audit line names.
fn unverified(meta: &SnapshotMeta, r: Refusal, written: Option<String>) -> RestoreOutcome {
    tracing::warn!(reason = %r, path = %meta.original_path, "a restored target could not be verified");
    RestoreOutcome {
        checksum_validated: false,
        restored_checksum: written,
        left_dirs: Vec::new(),
        detail: Some(format!(
            "restored, but it could not be checked afterwards: {}",
            r.reason
        )),
    }
}

/// The clause a restore's detail ends with when folders the action made on the way
/// had to stay (empty when none).
fn left_dirs_words(left_dirs: &[LeftDir]) -> String {
    if left_dirs.is_empty() {
        return String::new();
    }
    let names: Vec<String> = left_dirs.iter().map(|l| shown_path(&l.path)).collect();
    format!(
        "; {} it made on the way left in place: other files are in it, it is another action's result, or it could not be removed now (removed by a later rollback beneath it, or the next prune, once empty and no one's)",
        names.join(", ")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A store folder another program moved, removed or swapped for a link while a
    /// snapshot was taken or read is a conflict to try again (it was `io_error`, which
    /// HTTP answers 500 as a failing disk); a failing disk stays one.
    #[test]
    fn a_store_folder_moved_meanwhile_is_a_conflict() {
        for e in [
            io::Error::from(io::ErrorKind::NotFound),
            io::Error::new(io::ErrorKind::PermissionDenied, "a path led outside"),
        ] {
            let r = snap_io("create", &e);
            assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
            assert!(
                r.reason
                    .contains("moved, removed or swapped by another program")
            );
        }
        let eio = snap_io("create", &io::Error::from_raw_os_error(5));
        assert_eq!(eio.reason_code, ReasonCode::IoError);
        // One closed to this process is the operator's to give back (it was io_error).
        let closed = snap_io("create", &io::Error::from_raw_os_error(13));
        assert_eq!(
            closed.reason_code,
            ReasonCode::ReservedPath,
            "{}",
            closed.reason
        );
    }
}
