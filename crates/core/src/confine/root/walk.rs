//! Reaching a directory one component at a time, never through a link another user could
//! have placed: how roots and the state directory are opened, and folders made, and how the
//! operator's config file is reached (`read_operator_file` reads it only if no other user
//! could change it).

use super::access::{egid, euid, writable_by_others};
use super::{ANCESTOR_HOPS, Ancestor, DIR_MODE};
use crate::confine::path::path_strings;
use crate::error::io_words;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt};
use std::io;
use std::path::{Path, PathBuf};

/// A directory opened by [`open_checked_dir`].
pub(crate) struct CheckedDir {
    /// Its handle.
    pub dir: Dir,
    /// Its metadata, read from the handle.
    pub meta: cap_std::fs::Metadata,
    /// The `(st_dev, st_ino)` of every directory it was reached through, `/` first.
    pub ancestry: Vec<(u64, u64)>,
    /// The path it was reached by, symbolic links resolved.
    pub real: PathBuf,
}

/// Begins the reason of every refusal of a directory for what lies above it (another
/// user's directory or symbolic link): a setting to correct, which callers tell apart
/// from a failure of the disk by it.
pub(crate) const REFUSED_ABOVE: &str = "is refused: ";

/// What a walk to a directory does about the parts that do not exist yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// They are refused.
    Open,
    /// They are made.
    Create,
    /// The walk stops there, judging only what exists: nothing is made.
    Probe,
}

/// Opens the directory `path` (`what` names it in messages: "root", "state directory")
/// by walking from `/` one handle at a time; with `create`, missing directories are made
/// (the last one with `mode`). Each directory above it must be owned by root or by this
/// process's user and writable only by its owner unless it has the sticky bit; a symlink
/// on the way is followed only when it is owned by root or by this user; the directory
/// itself must not be a symlink. Its own owner and mode are for the caller to judge, on
/// the handle returned, so nothing can be swapped in between.
pub(crate) fn open_checked_dir(
    path: &Path,
    create: bool,
    what: &str,
    mode: u32,
) -> Result<CheckedDir, String> {
    open_dir_checked(path, Walk::made_if(create), what, mode, false)?
        .ok_or_else(|| format!("{what} {} cannot be reached", path.display()))
}

/// [`open_checked_dir`], except that the directory itself may be a symlink, followed
/// under the rules for the directories above it (the link owned by root or this user;
/// what it leads to owned by root or this user and writable only by its owner unless it
/// has the sticky bit): for the state directory, which the runtime only reaches, never
/// hands out.
pub(crate) fn open_checked_dir_through_link(
    path: &Path,
    create: bool,
    what: &str,
    mode: u32,
) -> Result<CheckedDir, String> {
    open_dir_checked(path, Walk::made_if(create), what, mode, true)?
        .ok_or_else(|| format!("{what} {} cannot be reached", path.display()))
}

/// What [`open_checked_dir_through_link`] would refuse in what exists of `path` now,
/// found without making anything: the metadata of the directory when it exists, `None`
/// when some part of it is still to be made. For a start that must not leave folders
/// behind when it is refused.
pub(crate) fn probe_checked_dir_through_link(
    path: &Path,
    what: &str,
) -> Result<Option<cap_std::fs::Metadata>, String> {
    open_dir_checked(path, Walk::Probe, what, 0, true).map(|c| c.map(|c| c.meta))
}

/// What [`open_checked_dir`] would refuse in what exists of `path` now, found without
/// making anything: for a root still to be made, judged before the state directory is
/// made for it.
pub(crate) fn probe_checked_dir(path: &Path, what: &str) -> Result<(), String> {
    open_dir_checked(path, Walk::Probe, what, 0, false).map(drop)
}

impl Walk {
    fn made_if(create: bool) -> Self {
        if create { Walk::Create } else { Walk::Open }
    }
}

/// The chain of a walk that made or found every part; `None` after a probe that met a
/// part not made yet.
fn open_dir_checked(
    path: &Path,
    walk: Walk,
    what: &str,
    mode: u32,
    follow_last: bool,
) -> Result<Option<CheckedDir>, String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("{what} {shown} is not an absolute path"));
    }
    let names = path_strings(path);
    if names.iter().any(|c| c == "..") {
        return Err(format!("{what} {shown} contains '..'"));
    }
    let Some((name, above)) = names.split_last() else {
        return Err(format!(
            "{what} {shown} is the filesystem root; a {what} must be a dedicated directory"
        ));
    };
    let euid = euid();
    let Some(chain) = open_ancestors(path, above, walk, euid, what)? else {
        return Ok(None);
    };
    let parent = chain
        .last()
        .ok_or_else(|| format!("{what} {shown} has no parent directory"))?;
    let meta = match parent.dir.symlink_metadata(name) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Probe => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Create => {
            make_dir(&parent.dir, name, mode)
                .map_err(|e| format!("{what} {shown} cannot be created: {}", io_words(&e)))?;
            parent
                .dir
                .symlink_metadata(name)
                .map_err(|e| format!("{what} {shown} cannot be inspected: {}", io_words(&e)))?
        }
        Err(e) => {
            return Err(format!(
                "{what} {shown} cannot be inspected: {}",
                io_words(&e)
            ));
        }
    };
    if meta.file_type().is_symlink() {
        if !follow_last {
            return Err(format!(
                "{what} {shown} is a symbolic link; a {what} must be a real directory"
            ));
        }
        let through = if walk == Walk::Probe {
            Walk::Probe
        } else {
            Walk::Open
        };
        let Some(mut chain) = open_ancestors(path, &names, through, euid, what)? else {
            return Ok(None);
        };
        let last = chain
            .pop()
            .ok_or_else(|| format!("{what} {shown} cannot be reached"))?;
        let meta = last
            .dir
            .dir_metadata()
            .map_err(|e| format!("{what} {shown} cannot be inspected: {}", io_words(&e)))?;
        return Ok(Some(CheckedDir {
            dir: last.dir,
            meta,
            ancestry: chain.iter().map(|a| a.id).collect(),
            real: last.path,
        }));
    }
    if !meta.is_dir() {
        return Err(format!("{what} {shown} is not a directory"));
    }
    let dir = parent
        .dir
        .open_dir_nofollow(name)
        .map_err(|e| format!("{what} {shown} cannot be opened: {}", io_words(&e)))?;
    // From here on only the open handle counts: the checks are made on it.
    let opened = dir
        .dir_metadata()
        .map_err(|e| format!("{what} {shown} cannot be inspected: {}", io_words(&e)))?;
    if opened.dev() != meta.dev() || opened.ino() != meta.ino() {
        return Err(format!(
            "{what} {shown} changed while it was being opened; refusing it"
        ));
    }
    Ok(Some(CheckedDir {
        dir,
        meta: opened,
        ancestry: chain.iter().map(|a| a.id).collect(),
        real: parent.path.join(name),
    }))
}

/// Walks from `/` to the directory that holds `root` (whose components above it are
/// `names`), checking each directory on the way (see [`SandboxRoot::open`]) and, with
/// `walk`, making the missing ones or stopping at the first. Returns the chain of real
/// directories, `/` first; `None` when a probe stopped.
fn open_ancestors(
    root: &Path,
    names: &[String],
    walk: Walk,
    euid: u32,
    what: &str,
) -> Result<Option<Vec<Ancestor>>, String> {
    let shown = root.display();
    let top = PathBuf::from("/");
    let dir = Dir::open_ambient_dir(&top, ambient_authority()).map_err(|e| {
        format!(
            "{what} {shown} cannot be reached: / cannot be opened: {}",
            io_words(&e)
        )
    })?;
    let mut chain = vec![checked_ancestor(root, top, dir, euid, what)?];
    let mut pending: std::collections::VecDeque<String> = names.iter().cloned().collect();
    let mut hops = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            // The chain holds real directories only, so its previous entry is the parent.
            if chain.len() > 1 {
                chain.pop();
            }
            continue;
        }
        let parent = chain
            .last()
            .ok_or_else(|| format!("{what} {shown} cannot be reached"))?;
        let here = parent.path.join(&name);
        let Some(meta) = look_making(parent, &name, &here, walk, (what, root))? else {
            return Ok(None);
        };
        if meta.file_type().is_symlink() {
            hops += 1;
            let target = link_above(parent, &name, &here, &meta, hops, (euid, what, root))?;
            if target.is_absolute() {
                chain.truncate(1);
            }
            for comp in path_strings(&target).into_iter().rev() {
                pending.push_front(comp);
            }
            continue;
        }
        if !meta.is_dir() {
            return Err(format!(
                "{what} {shown} cannot be used: {} above it is not a directory",
                here.display()
            ));
        }
        let dir = parent.dir.open_dir_nofollow(&name).map_err(|e| {
            format!(
                "{what} {shown} cannot be opened: its parent {} cannot be opened: {}",
                here.display(),
                io_words(&e)
            )
        })?;
        chain.push(checked_ancestor(root, here, dir, euid, what)?);
    }
    Ok(Some(chain))
}

/// What `name` in `parent` is (`here`), made first when missing and `walk` makes
/// folders; `None` when it is missing and `walk` only probes. `(what, root)`: the
/// folder being reached, for the words.
fn look_making(
    parent: &Ancestor,
    name: &str,
    here: &Path,
    walk: Walk,
    (what, root): (&str, &Path),
) -> Result<Option<cap_std::fs::Metadata>, String> {
    let shown = root.display();
    let not_inspected = |e: &io::Error| {
        format!(
            "{what} {shown} cannot be inspected: its parent {} cannot be inspected: {}",
            here.display(),
            io_words(e)
        )
    };
    match parent.dir.symlink_metadata(name) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Probe => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Create => {
            make_dir(&parent.dir, name, DIR_MODE).map_err(|e| {
                format!(
                    "{what} {shown} cannot be created: its parent {} cannot be created: {}",
                    here.display(),
                    io_words(&e)
                )
            })?;
            parent
                .dir
                .symlink_metadata(name)
                .map(Some)
                .map_err(|e| not_inspected(&e))
        }
        Err(e) => Err(not_inspected(&e)),
    }
}

/// Where the symbolic link `name` in `parent` (`here`, described by `meta`) points, the
/// `hops`-th met on the way: refused when another user could point it elsewhere, or past
/// [`ANCESTOR_HOPS`].
fn link_above(
    parent: &Ancestor,
    name: &str,
    here: &Path,
    meta: &cap_std::fs::Metadata,
    hops: usize,
    (euid, what, root): (u32, &str, &Path),
) -> Result<PathBuf, String> {
    let shown = root.display();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "{what} {shown} {REFUSED_ABOVE}{} above it is a symbolic link owned by uid {}; a symbolic link above a {what} must be owned by root (uid 0) or by this process's uid {euid}, or its owner could point it elsewhere",
            here.display(),
            meta.uid()
        ));
    }
    if hops > ANCESTOR_HOPS {
        return Err(format!(
            "{what} {shown} cannot be reached: more than {ANCESTOR_HOPS} symbolic links above it (a loop?)"
        ));
    }
    parent.dir.read_link_contents(name).map_err(|e| {
        format!(
            "{what} {shown} cannot be inspected: the symbolic link {} above it cannot be read: {}",
            here.display(),
            io_words(&e)
        )
    })
}

/// Reads a file the operator names to configure the runtime (`what`: "config file"), at
/// most `limit` bytes (`Ok(None)` past it). What it says can turn writing on and widen
/// what may be written, so it is refused, as a root or the state directory would be,
/// when another user could change it: each directory on the way must be owned by root or
/// by this process's user and writable only by its owner unless it has the sticky bit, a
/// symbolic link on the way (the file's own name included) must be owned by root or by
/// this user, and the file must be a regular file owned by root or by this user and
/// writable by no other user. The file is opened by its name under its checked folder's
/// handle and judged on that open file, so nothing can be swapped in between. A relative
/// path is taken from the working directory.
pub fn read_operator_file(path: &Path, what: &str, limit: u64) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read as _;
    let euid = euid();
    let given = path.display().to_string();
    // The walk below goes by components, which drop a trailing `/`: the system would
    // take such a path for a directory's, and so does this.
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(format!("{what} {given} names a directory, not a file"));
    }
    if let Some(read) = read_operator_pipe(path, what, limit) {
        return read;
    }
    let mut path = std::path::absolute(path).map_err(|e| {
        format!(
            "{what} {given} cannot be read: its absolute path cannot be made: {}",
            io_words(&e)
        )
    })?;
    for _ in 0..=ANCESTOR_HOPS {
        // Reached through a link, both are named: the operator gave the first.
        let shown = if path.as_os_str() == given.as_str() {
            given.clone()
        } else {
            format!("{given} (at {})", path.display())
        };
        let failed = |e: io::Error| {
            format!(
                "{what} {shown} cannot be read: {}",
                crate::error::io_words(&e)
            )
        };
        let names = path_strings(&path);
        let Some((name, above)) = names.split_last().filter(|(n, _)| n.as_str() != "..") else {
            return Err(format!("{what} {shown} names a directory, not a file"));
        };
        let Some(chain) = open_ancestors(&path, above, Walk::Open, euid, what)? else {
            return Err(format!("{what} {shown} cannot be reached"));
        };
        let parent = chain
            .last()
            .ok_or_else(|| format!("{what} {shown} cannot be reached"))?;
        let meta = parent.dir.symlink_metadata(name).map_err(failed)?;
        if meta.file_type().is_symlink() {
            if meta.uid() != 0 && meta.uid() != euid {
                return Err(format!(
                    "{what} {shown} {REFUSED_ABOVE}it is a symbolic link owned by uid {}; a link to it must be owned by root (uid 0) or by this process's uid {euid}, or its owner could point it at a file of theirs",
                    meta.uid()
                ));
            }
            let target = parent.dir.read_link_contents(name).map_err(failed)?;
            path = parent.path.join(target);
            continue;
        }
        let file = parent
            .dir
            .open_with(
                name,
                cap_std::fs::OpenOptions::new()
                    .read(true)
                    .follow(FollowSymlinks::No)
                    .nonblock(true),
            )
            .map_err(failed)?;
        let m = file.metadata().map_err(failed)?;
        let (uid, mode) = (m.uid(), m.mode() & 0o7777);
        if !m.is_file() {
            return Err(format!("{what} {shown} is not a regular file"));
        }
        if uid != 0 && uid != euid {
            return Err(format!(
                "{what} {shown} {REFUSED_ABOVE}it is owned by uid {uid}; it can turn writing on, so it must be owned by root (uid 0) or by this process's uid {euid}"
            ));
        }
        if let Some(how) = others_may_write(&m, &file) {
            return Err(format!(
                "{what} {shown} {REFUSED_ABOVE}it (group {}, mode {mode:04o}) is writable by other users{how}; it can turn writing on, so it must be writable only by its owner or this process's group {} (mode 0644 or 0600, say, and no access control list giving others write)",
                m.gid(),
                egid()
            ));
        }
        let mut bytes = Vec::new();
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        return Ok(Some(bytes).filter(|b| b.len() as u64 <= limit));
    }
    Err(format!(
        "{what} {given} cannot be read: its path goes through symbolic links that lead back to themselves (a loop) or through too many of them"
    ))
}

/// [`read_operator_file`] for one of this process's descriptors that is a pipe
/// (`--config <(…)`, the shell's process substitution, gives `/dev/fd/N`; `/dev/stdin`):
/// read as it flows, if the pipe is root's or this user's and no other user may write
/// into it (a pipe a shell makes is its user's, mode 0600), judged before it is opened
/// and again on the pipe opened. `None` for any other path.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn read_operator_pipe(
    path: &Path,
    what: &str,
    limit: u64,
) -> Option<Result<Option<Vec<u8>>, String>> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let shown = path.display();
    let judge = |m: &std::fs::Metadata| -> Result<(), String> {
        let (uid, mode) = (m.uid(), m.mode() & 0o7777);
        if !m.file_type().is_fifo() {
            return Err(format!("{what} {shown} was replaced while it was opened"));
        }
        if uid != 0 && uid != euid() {
            return Err(format!(
                "{what} {shown} {REFUSED_ABOVE}it is a pipe owned by uid {uid}; a pipe read for settings must be root's or this process's uid {}",
                euid()
            ));
        }
        if mode & 0o002 != 0 || (mode & 0o020 != 0 && m.gid() != egid()) {
            return Err(format!(
                "{what} {shown} {REFUSED_ABOVE}it is a pipe other users may write into (mode {mode:04o})"
            ));
        }
        Ok(())
    };
    // Only this process's own descriptors: a pipe reached through a path another user
    // could have placed (a link in their folder) is judged as any other file.
    let own = path.to_str().is_some_and(|p| {
        p == "/dev/stdin"
            || ["/dev/fd/", "/proc/self/fd/"].iter().any(|at| {
                p.strip_prefix(at)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
    });
    if !own {
        return None;
    }
    let before = std::fs::metadata(path)
        .ok()
        .filter(|m| m.file_type().is_fifo())?;
    let failed = |e: io::Error| {
        format!(
            "{what} {shown} cannot be read: {}",
            crate::error::io_words(&e)
        )
    };
    let read = || -> Result<Option<Vec<u8>>, String> {
        judge(&before)?;
        // Opened without waiting for a writer (one that has come and gone left its bytes
        // in the pipe, and a blocking open would wait for another for ever), then read
        // blocking, to the writer's end.
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(path)
                .map_err(failed)?
        };
        rustix::fs::fcntl_setfl(&file, rustix::fs::OFlags::empty())
            .map_err(|e| failed(e.into()))?;
        judge(&file.metadata().map_err(failed)?)?;
        let mut bytes = Vec::new();
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(failed)?;
        Ok(Some(bytes).filter(|b| b.len() as u64 <= limit))
    };
    Some(read())
}

/// Checks a directory above `root` on its open handle: owned by root or by `euid`, and
/// writable only by its owner unless it has the sticky bit.
fn checked_ancestor(
    root: &Path,
    path: PathBuf,
    dir: Dir,
    euid: u32,
    what: &str,
) -> Result<Ancestor, String> {
    let shown = root.display();
    let m = dir.dir_metadata().map_err(|e| {
        format!(
            "{what} {shown} cannot be inspected: its parent {} cannot be inspected: {}",
            path.display(),
            io_words(&e)
        )
    })?;
    let (uid, mode) = (m.uid(), m.mode() & 0o7777);
    if uid != 0 && uid != euid {
        return Err(format!(
            "{what} {shown} {REFUSED_ABOVE}the directory {} above it is owned by uid {uid} (mode {mode:04o}); every directory above a {what} must be owned by root (uid 0) or by this process's uid {euid}, or its owner could swap the {what} for one of theirs",
            path.display()
        ));
    }
    // Another group's members could swap the root like any other user.
    let egid = egid();
    if mode & 0o1000 == 0
        && let Some(how) = others_may_write(&m, &dir)
    {
        return Err(format!(
            "{what} {shown} {REFUSED_ABOVE}the directory {} above it (owner uid {uid}, group {}, mode {mode:04o}) is writable by other users{how} and has no sticky bit; a directory above a {what} must be writable only by its owner or this process's group {egid} (and give no other user or group write in an access control list), or carry the sticky bit as /tmp does, or others could swap the {what} for one of theirs",
            path.display(),
            m.gid()
        ));
    }
    Ok(Ancestor {
        path,
        dir,
        id: (m.dev(), m.ino()),
    })
}

/// Whether users other than this process's could write in the file or folder `fd`,
/// whose metadata is `m`: by its mode (`Some("")`) or through an access control list
/// (`Some(" through its access control list")`, the words a refusal adds); `None` if not.
pub(crate) fn others_may_write(
    m: &cap_std::fs::Metadata,
    fd: impl std::os::fd::AsFd,
) -> Option<&'static str> {
    if writable_by_others(m) {
        Some("")
    } else if acl_lets_others_write(fd, m.mode()) {
        Some(" through its access control list")
    } else {
        None
    }
}

/// Whether an access control list could let anyone but the owner write in a file or
/// folder of mode `mode`, so that it must be read to know: only when the mode's group
/// bits allow writing. With a list, those bits are its mask, which caps every named
/// user's and group's permissions (the owning group's too); without one, they are the
/// owning group's, which the mode already judges.
pub(crate) fn list_may_give_write(mode: u32) -> bool {
    mode & 0o020 != 0
}

/// Whether an access control list on `fd` lets a user or group other than this
/// process's write (the mode's group bits are then only the list's mask): a named user
/// other than this one, or a named group other than this process's, with the write
/// permission, the mask allowing it. Not read when `mode` leaves no room for one
/// ([`list_may_give_write`]). No list (or a filesystem without them) says no, the mode
/// bits being judged as they are; a folder this process may not read, or a list that
/// cannot be read for another cause, says yes.
fn acl_lets_others_write(fd: impl std::os::fd::AsFd, mode: u32) -> bool {
    use rustix::fs::{Mode, OFlags};
    use rustix::io::Errno;
    const ACCESS: &str = "system.posix_acl_access";
    if !list_may_give_write(mode) {
        return false;
    }
    let fd = fd.as_fd();
    let mut acl = vec![0u8; 64 << 10];
    let read = match rustix::fs::fgetxattr(fd, ACCESS, &mut acl[..]) {
        // A directory handle is a path handle, which has no attributes to read: the
        // directory is opened for reading through it.
        Err(Errno::BADF) => rustix::fs::openat(
            fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .and_then(|dir| rustix::fs::fgetxattr(&dir, ACCESS, &mut acl[..])),
        other => other,
    };
    let len = match read {
        Ok(len) => len,
        // No list, or a filesystem without them: the mode bits say it all.
        Err(Errno::NODATA | Errno::NOTSUP) => return false,
        // A folder this process may pass through but not read cannot be asked, and its
        // mask allows writing: a list there may give others write, as may one that
        // cannot be read for another cause.
        Err(_) => return true,
    };
    // A version word, then entries of a tag, a permission (both 16 bits) and an id.
    let entries = acl.get(4..len).unwrap_or_default().chunks_exact(8);
    let field = |e: &[u8], at: usize, n: usize| {
        e[at..at + n]
            .iter()
            .rev()
            .fold(0u32, |v, b| v << 8 | u32::from(*b))
    };
    let (mut mask_writes, mut others_write) = (true, false);
    for e in entries {
        let (tag, perm, id) = (field(e, 0, 2), field(e, 2, 2), field(e, 4, 4));
        let writes = perm & 0o2 != 0;
        match tag {
            0x02 if writes && id != euid() => others_write = true,
            0x08 if writes && id != egid() => others_write = true,
            0x10 => mask_writes = writes,
            _ => {}
        }
    }
    others_write && mask_writes
}

/// Makes one directory (mode 0755), its name made durable in its parent: a state
/// directory made at a first start would otherwise go with a power cut, its trail and
/// seal key with it, while the snapshots sealed with that key stay in the roots. One
/// that appeared meanwhile is left for the caller to inspect like any existing one.
fn make_dir(parent: &Dir, name: &str, mode: u32) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    builder.mode(mode);
    match parent.create_dir_with(name, &builder) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
        // A parent this process may write in but not read cannot be synced, nor one on
        // a filesystem that syncs no directory (EINVAL): made as before, not durably.
        Ok(()) => match super::files::sync_dir(parent) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput
                ) =>
            {
                Ok(())
            }
            r => r,
        },
    }
}
