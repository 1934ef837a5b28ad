//! The snapshot store: `{root}/.rollback` and its folders, opened without following a
//! link, and trusted (written to, read back) only while private to the runtime's user.
//!
//! A store, workflow or action folder another user owns or could write in (by its mode or
//! its access control list) is neither written nor read. A link or special file in a
//! folder's or a record's place is named for what it is (`reserved_path` for the store and
//! a workflow's folder, `checksum_mismatch` for an action's), never taken for the disk
//! failing.

use crate::confine::SandboxRoot;
use crate::confine::path::{ROLLBACK_DIR, shown_path};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::seal::{SealKey, Unsealed};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt as _};
use std::io;

use super::{BACKUP_FILE, MADE_FILE, META_FILE, SNAPSHOT_DIR_MODE, SnapshotMeta};

pub(super) fn snap_io(what: &str, e: &io::Error) -> Refusal {
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
    // Found a moment ago, then gone, a link or a file: another program moved a folder of
    // the store while it was in use (and may have put it back since, so that a second
    // look finds nothing wrong), which is no failing disk (HTTP 500).
    if e.kind() == io::ErrorKind::NotFound
        || crate::confine::root::is_escape_error(e)
        || is_link_or_file(e)
    {
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
pub(super) fn is_passing(e: &io::Error) -> bool {
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
pub(super) fn open_mark(
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
pub(super) fn untrusted(folder: &str, file: &str, why: &Unsealed) -> Refusal {
    let detail = match why {
        Unsealed::Malformed(e) => format!("is damaged ({e})"),
        Unsealed::Forged => {
            "does not carry this runtime's seal: it was changed or written by something else (a runtime with another state directory writing in this root, say: every process that writes in a root must use the same one), or the state directory's seal key was replaced since it was sealed"
                .to_owned()
        }
    };
    untrusted_said(&format!("{folder}/{file}"), &detail)
}

/// What in a sealed record no action could have written, if anything: a target or a
/// folder made that is not a plain relative path, lies in the snapshot store, goes
/// deeper than any depth allowed, or has an extension always blocked. A restore goes only
/// where a write could have gone, even under a record forged with the seal key.
pub(super) fn unwritable_path(meta: &SnapshotMeta) -> Option<String> {
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
pub(super) fn untrusted_said(at: &str, detail: &str) -> Refusal {
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
pub(super) fn sealed_for_another_root(folder: &str, sealed_root: &str) -> Refusal {
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

/// Whether `e` says a link or a file stood where a folder was opened without following
/// links (not `EMLINK`, which `mkdir` also gives for a folder that holds too many).
fn is_link_or_file(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::LOOP, Errno::NOTDIR]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// Whether `e` says a path was not opened for what stands there: a symbolic link (never
/// followed) or a file where a folder was expected.
pub(super) fn stands_in_place(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::LOOP, Errno::NOTDIR, Errno::MLINK]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// Why a snapshot's folder could not be opened (`e`): something in the place of the store
/// or of the workflow's folder (`reserved_path`, as taking a snapshot names it), or of
/// the snapshot's own folder (not the runtime's record), else a failure of the disk.
pub(super) fn open_refusal(
    root: &SandboxRoot,
    workflow_id: &str,
    action_id: &str,
    e: &io::Error,
) -> Refusal {
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

pub(super) fn rollback_dir(root: &SandboxRoot) -> io::Result<Option<Dir>> {
    open_existing(root.dir(), ROLLBACK_DIR)
}

/// Opens the directory `name` in `dir` without following a symlink; `None` if missing.
pub(super) fn open_existing(dir: &Dir, name: &str) -> io::Result<Option<Dir>> {
    match dir.open_dir_nofollow(name) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes the action folder `name` in the workflow's folder `wf` when it holds nothing
/// but a regular backup (see [`Snapshotter::remove_unfinished`]); says whether it did,
/// or, when it could not, under which name the folder stays and why. `may_remove` is
/// asked just before the folder is moved aside (a failure point).
pub(super) fn remove_if_unfinished(
    wf: &Dir,
    name: &str,
    may_remove: &impl Fn() -> io::Result<()>,
) -> Result<bool, (String, io::Error)> {
    let here = |e| (name.to_owned(), e);
    // Not followed: a link or a file in a folder's place is no snapshot of ours.
    let Ok(dir) = wf.open_dir_nofollow(name) else {
        return Ok(false);
    };
    let (mut backup, mut empty_meta, mut made) = (false, false, false);
    for e in dir.entries().map_err(here)? {
        let e = e.map_err(here)?;
        let file = crate::confine::root::entry_type(&e)
            .map_err(here)?
            .is_file();
        match e.file_name().to_str() {
            Some(BACKUP_FILE) if file => backup = true,
            // A mark whose record was lost with it (nothing synced under `relaxed`).
            Some(MADE_FILE) if file => made = true,
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
    may_remove().map_err(here)?;
    wf.rename(name, wf, &aside).map_err(here)?;
    let gone = (|| {
        if backup {
            dir.remove_file(BACKUP_FILE)?;
        }
        if empty_meta {
            dir.remove_file(META_FILE)?;
        }
        if made {
            dir.remove_file(MADE_FILE)?;
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
pub(super) fn open_or_create_tracked(dir: &Dir, name: &str) -> Verdict<(Dir, bool)> {
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
pub(super) fn snapshot_store(root: &SandboxRoot) -> Verdict<(Dir, bool)> {
    let (rb, made) = open_or_create_tracked(root.dir(), ROLLBACK_DIR).map_err(|r| {
        not_a_folder(root, root.dir(), ROLLBACK_DIR, ROLLBACK_DIR, "in this root").unwrap_or(r)
    })?;
    check_private(root, &rb, ROLLBACK_DIR)?;
    Ok((rb, made))
}

/// Opens (or creates) a workflow's folder in the snapshot store, refused like the
/// store itself when another user owns it or could write in it.
pub(super) fn workflow_folder(
    root: &SandboxRoot,
    rb: &Dir,
    workflow_id: &str,
) -> Verdict<(Dir, bool)> {
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
pub(super) fn not_a_folder(
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
pub(super) fn store_refusal(root: &SandboxRoot, e: &io::Error) -> Refusal {
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
pub(super) fn check_private_to_read(root: &SandboxRoot, dir: &Dir, rel: &str) -> Verdict {
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
pub(super) fn unreadable_record(root: &SandboxRoot, rel: &str, e: &io::Error) -> Option<Refusal> {
    (e.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()))
        .then(|| shut_out_of(root, rel))
}

/// The refusal for the snapshot file `rel` this process may not read (see
/// [`unreadable_record`]).
pub(super) fn shut_out_of(root: &SandboxRoot, rel: &str) -> Refusal {
    Refusal::new(
        ReasonCode::ReservedPath,
        format!(
            "the snapshot file {} cannot be read by this process (permission denied: another user owns it or its mode forbids reading), so nothing is rolled back, judged or pruned from its folder until the operator gives it back to the runtime's user (owned by it, readable by it); its snapshot is kept",
            shown_path(&root.path().join(rel).display().to_string())
        ),
    )
}

pub(super) fn snapshot_dir(
    root: &SandboxRoot,
    workflow_id: &str,
    action_id: &str,
) -> io::Result<Option<Dir>> {
    let Some(rb) = rollback_dir(root)? else {
        return Ok(None);
    };
    let Some(wf) = open_existing(&rb, workflow_id)? else {
        return Ok(None);
    };
    open_existing(&wf, action_id)
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
            // A link or a file met where a folder was opened without following links.
            io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error()),
            io::Error::from_raw_os_error(rustix::io::Errno::NOTDIR.raw_os_error()),
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
        // A folder too full for another (`mkdir`'s EMLINK) is no swap to try again.
        let full = snap_io(
            "create",
            &io::Error::from_raw_os_error(rustix::io::Errno::MLINK.raw_os_error()),
        );
        assert_eq!(full.reason_code, ReasonCode::IoError, "{}", full.reason);
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
