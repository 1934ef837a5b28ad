//! Files beneath a root: reading one regular file without following links, writing
//! one atomically (a temporary file, then a rename), staging a write for a later commit,
//! and the runtime's temporary names.
//!
//! Nothing is written in place: every write is a temporary file in the target's directory,
//! flushed, then renamed, so a hard link can never carry a write outside. A write to a
//! target found missing (every `create_file`) never replaces what appeared meanwhile
//! (`renameat2(RENAME_NOREPLACE)`, or `linkat` then `unlinkat` where the filesystem lacks
//! it). The temporary file's name is out in the target's folder, where whoever may write
//! there can rename another file over it first: a target (or a restore's) is written by
//! `write_atomic_placed`, which reports it written only once it holds the very file
//! written, and replaces a file by exchanging the two names, undone otherwise, so that
//! the file replaced is never lost to another's.
//!
//! A file is read only while its name names it alone. A link count read from the open file
//! says how many names it has, not where: a hard link to an outside file, planted and
//! removed around the open, would pass it. So after the open and again after the read, the
//! directory is read (which waits for a link or unlink under way in it to end) and the
//! name's own status must be the opened file with one link; a file replaced meanwhile by a
//! rename is read again.

use super::access::euid;
use super::refusal::{changed_meanwhile, hardlink_refusal, swapped_while_read};
use super::{DirId, SandboxRoot};
use crate::confine::path::{RelPath, TEMP_MARKER, shown_path};
use crate::reason::{ReasonCode, Refusal, Verdict};
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::fs::{Dir, File, MetadataExt, OpenOptions, OpenOptionsExt};
use std::io::{self, Read, Write};

/// fsyncs a directory. `Dir` handles are `O_PATH`, so `"."` is opened for reading first.
pub fn sync_dir(dir: &Dir) -> io::Result<()> {
    #[cfg(test)]
    if let Some(errno) = FAIL_DIR_SYNC.take() {
        return Err(io::Error::from_raw_os_error(errno));
    }
    dir.open(".")?.sync_all()
}

/// Reads a regular file by name in `dir`: `O_NOFOLLOW`, non-blocking (a FIFO never
/// stalls), checked on the open handle to be a regular file with a single link.
pub fn read_regular(dir: &Dir, name: &str, limit: u64) -> io::Result<Vec<u8>> {
    read_file_in(dir, name, limit, true).map(|(bytes, _)| bytes)
}

/// What a regular file was when it was read, to tell whether anyone changed it since:
/// which file (device, inode), its size, and its modification and change times. A rename
/// over it, an append or a truncation always changes one of them; a rewrite in place
/// that keeps the size changes the times only when the filesystem's clock has moved on
/// (timestamps are taken from a coarse kernel clock, a few milliseconds a tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    id: (u64, u64),
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// Owner and group: the file written in its place gets them (see [`write_new_file`]).
    owner: (u32, u32),
}

impl FileStamp {
    pub(super) fn of(m: &cap_std::fs::Metadata) -> Self {
        Self {
            id: (m.dev(), m.ino()),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            owner: (m.uid(), m.gid()),
        }
    }

    /// Whether `now` is this very file with nothing written to it since, the change
    /// time aside: a rename of the file itself moves that (ext4, XFS, btrfs).
    fn unwritten_since(self, now: Self) -> bool {
        Self {
            ctime: now.ctime,
            ..self
        } == now
    }
}

/// Which missing directories on the way to a path, and the path itself for a directory,
/// may be made: an action makes none its snapshot does not record. (Two actions may
/// each record one that only the faster made; either removes it only once it is empty.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Make {
    /// None: a missing one is `not_found`.
    Nothing,
    /// Those from the component at this index on (0: all of them). One before it that
    /// is missing was there when the action was checked and has gone since: `conflict`,
    /// and nothing is made.
    From(usize),
}

impl Make {
    pub(super) fn may_make(self, index: usize) -> bool {
        matches!(self, Make::From(from) if index >= from)
    }
}

/// What the rename that puts a write in place may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Nothing: the name must be free (`already_exists` otherwise).
    New,
    /// Whatever plain file is there (one with no other link), or nothing. Where the
    /// write is checked in place (in a root), a link, a folder, a special file or a file
    /// with other links found there (another program's, put there since the target was
    /// judged) is left in place (`conflict`): the runtime replaces or removes nothing
    /// else.
    Any,
    /// Only the file as it was read (`conflict` otherwise), looked at just before the
    /// rename and, where names are exchanged, once more when taken out: a change another
    /// program made since is kept, unless it lands after that last look (through a
    /// descriptor it opened before), or, where names cannot be exchanged, between the
    /// look and the rename.
    Unchanged(FileStamp),
}

impl Put {
    /// [`Put::New`] when `no_replace`, else [`Put::Any`].
    pub fn new_or_any(no_replace: bool) -> Self {
        if no_replace { Put::New } else { Put::Any }
    }
}

/// [`read_regular`], with `single_link` deciding whether a file with other hard links is
/// refused (it is in a root, where a link may alias a file outside; the state directory,
/// private to the runtime's user, makes its files by linking them into place).
pub(crate) fn read_file_in(
    dir: &Dir,
    name: &str,
    limit: u64,
    single_link: bool,
) -> io::Result<(Vec<u8>, FileStamp)> {
    retrying_swaps(name, || {
        read_once(dir, name, limit, single_link).map(|(bytes, stamp, _)| (bytes, stamp))
    })
}

/// [`read_regular`], the file given back open with its bytes.
fn read_regular_open(dir: &Dir, name: &str, limit: u64) -> io::Result<(Vec<u8>, File)> {
    retrying_swaps(name, || {
        read_once(dir, name, limit, true).map(|(bytes, _, file)| (bytes, file))
    })
}

fn read_once(
    dir: &Dir,
    name: &str,
    limit: u64,
    single_link: bool,
) -> io::Result<(Vec<u8>, FileStamp, File)> {
    let (file, meta) = open_regular(dir, name, single_link)?;
    // Taken before the bytes are read: a change made while they are read then shows as
    // a different stamp, never as the same stamp over other bytes.
    let stamp = FileStamp::of(&meta);
    if meta.len() > limit {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "{} is {} bytes; at most {limit} bytes are read",
                shown_path(name),
                meta.len()
            ),
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    (&file)
        .take(limit.saturating_add(1))
        .read_to_end(&mut buf)?;
    // The file may have grown since the size check: one byte past the limit is enough to know.
    if buf.len() as u64 > limit {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "{} grew past {limit} bytes while being read",
                shown_path(name)
            ),
        )));
    }
    if single_link {
        named_alone(dir, name, &file, &meta)?;
    }
    Ok((buf, stamp, file))
}

/// The size and SHA-256 of a regular file with one link, read in chunks: a file of any
/// size is described in constant memory. Both describe the same bytes, those read.
pub fn hash_regular(dir: &Dir, name: &str, limit: u64) -> io::Result<(u64, Option<String>)> {
    retrying_swaps(name, || hash_once(dir, name, limit))
}

fn hash_once(dir: &Dir, name: &str, limit: u64) -> io::Result<(u64, Option<String>)> {
    use sha2::Digest as _;
    let (mut file, meta) = open_regular(dir, name, true)?;
    if meta.len() > limit {
        return Ok((meta.len(), None));
    }
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                size += n as u64;
                // A file that grows while it is read is not followed for ever.
                if size > limit {
                    return Ok((size, None));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    named_alone(dir, name, &file, &meta)?;
    Ok((size, Some(crate::hash::to_hex(&hasher.finalize()))))
}

/// Opens `name` for reading without following a symlink or blocking on a FIFO, and
/// refuses what is not a regular file (and, with `single_link`, a file with other links).
/// `name` in `dir` opened to be read a part at a time: a regular file, reached without
/// following a link.
pub(crate) fn open_file_in(dir: &Dir, name: &str) -> io::Result<std::fs::File> {
    open_regular(dir, name, false).map(|(file, _)| file.into_std())
}

fn open_regular(
    dir: &Dir,
    name: &str,
    single_link: bool,
) -> io::Result<(cap_std::fs::File, cap_std::fs::Metadata)> {
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No).nonblock(true);
    let file = match dir.open_with(name, &opts) {
        Ok(f) => f,
        // open(2) on a Unix socket fails with ENXIO: it is a special file, not an I/O fault.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            return Err(io::Error::other(Refusal::new(
                ReasonCode::NotRegularFile,
                format!(
                    "{} is a socket or device, not a regular file",
                    shown_path(name)
                ),
            )));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::NotRegularFile,
            format!("{} is not a regular file", shown_path(name)),
        )));
    }
    if single_link {
        named_alone(dir, name, &file, &meta)?;
    }
    Ok((file, meta))
}

/// Refuses `file`, opened as `name` (its status `opened`, taken just after the open),
/// unless `name` still names it and it has no other link. The open file's link count
/// says how many names it has, not where they are: a link to a file outside the root,
/// planted at `name` and removed between the open and that look, would leave an outside
/// file with one link open. The name's own status says in one call which file it names
/// and how many names that file has; one, and the file opened, means that the file was
/// wholly in the root then, unless that look landed inside the removal of a planted
/// link (the count already lowered, the name not yet gone). Every link made or removed
/// changes the file's status-change time, and since Linux 6.13 (multigrain time stamps
/// on ext4, XFS, btrfs and tmpfs) a change after that time was looked at always gives a
/// new one: a file whose time moved since the open has had its links changed (or been
/// changed otherwise) while it was read, and is read again ([`Swapped`]). Called once the
/// file is opened and again once it is read, each time after the directory is read
/// ([`settle`]).
pub(super) fn named_alone(
    dir: &Dir,
    name: &str,
    file: &File,
    opened: &cap_std::fs::Metadata,
) -> io::Result<()> {
    // A link being removed is still found by its name, its count already lowered, until
    // the removal ends; reading the directory waits for changes to it under way to end.
    settle(dir, name)?;
    let named = match dir.symlink_metadata(name) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match named {
        Some(m) if (m.dev(), m.ino()) == (opened.dev(), opened.ino()) => {
            let links = m.nlink().max(opened.nlink());
            if links > 1 {
                return Err(io::Error::other(hardlink_refusal(name)));
            }
            // Looked at after the name: a removal the look at the name landed in has
            // changed the time by now, or is still under way and the next look waits
            // for it (the removal that made the count one was under way at the open,
            // or a link made since moved the time).
            let now = file.metadata()?;
            if (now.ctime(), now.ctime_nsec()) != (opened.ctime(), opened.ctime_nsec()) {
                return Err(io::Error::other(Swapped));
            }
            Ok(())
        }
        _ => Err(io::Error::other(Swapped)),
    }
}

/// The name a file was opened by names another file, or none, since: replaced by a
/// rename (as every write of the runtime's own does), moved or removed.
#[derive(Debug, thiserror::Error)]
#[error("the file was replaced while it was read")]
pub(super) struct Swapped;

/// Runs a read of `name` again while the file is replaced under it (a writer's rename
/// lands between the open and the look at the name), a few times: the new file is the
/// one to read. One replaced every time is refused (`conflict`).
fn retrying_swaps<T>(name: &str, mut read: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    const TRIES: usize = 8;
    let swapped = |e: &io::Error| e.get_ref().is_some_and(|e| e.is::<Swapped>());
    for _ in 1..TRIES {
        match read() {
            Err(e) if swapped(&e) => continue,
            done => return done,
        }
    }
    read().map_err(|e| {
        if swapped(&e) {
            io::Error::other(swapped_while_read(name))
        } else {
            e
        }
    })
}

/// Waits for changes under way to the names in `dir` to end: reading a directory takes
/// the lock that removing, linking or renaming in it holds throughout. A directory this
/// process may pass through but not list is waited for by renaming `name` to itself
/// without replacing (see [`settle_unlisted`]).
///
/// The lock is taken before the file system is asked for entries, wherever the read
/// starts, so the read starts at the end where the file system lets it: ext4 otherwise
/// sorts a whole block of a hashed directory's entries for each read (a tenth of a
/// replacement's time in a folder of a thousand files). Where it does not (tmpfs), the
/// read starts at the first entry.
fn settle(dir: &Dir, name: &str) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags, SeekFrom};
    let opened = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    );
    #[cfg(test)]
    let opened = if UNLISTED.get() {
        Err(rustix::io::Errno::ACCESS)
    } else {
        opened
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(rustix::io::Errno::ACCESS) => {
            settle_unlisted(dir, name);
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    // Any answer will do: the read that follows waits for the lock wherever it starts.
    let at_end = rustix::fs::seek(&fd, SeekFrom::End(0)).is_ok();
    let mut entries = rustix::fs::Dir::new(fd)?;
    let first = entries.read();
    #[cfg(test)]
    let (at_end, first) = match FAIL_READ_AT_END.take() {
        Some(errno) => (true, Some(Err(rustix::io::Errno::from_raw_os_error(errno)))),
        None => (at_end, first),
    };
    match first {
        // A file system that takes the end for a position it cannot read from (a FUSE
        // daemon's own offsets) is read from the start, as any other: an error there
        // may also come before the lock was taken.
        Some(Err(_)) if at_end => {
            entries.rewind();
            if let Some(entry) = entries.read() {
                entry?;
            }
        }
        Some(entry) => {
            entry?;
        }
        None => {}
    }
    Ok(())
}

/// [`settle`] in a directory this process may not list: `name` renamed to itself
/// without replacing. The kernel takes the directory's lock before it looks the names
/// up, then answers that the name exists (or that it is gone) without changing anything,
/// before any permission to write is asked for. Where even that cannot be done (a
/// read-only mount), nothing is waited for, and only the file's status-change time tells
/// a removal under way ([`named_alone`]).
fn settle_unlisted(dir: &Dir, name: &str) {
    let _ = rustix::fs::renameat_with(dir, name, dir, name, rustix::fs::RenameFlags::NOREPLACE);
}

/// How far a write is made durable before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Not at all (relaxed durability).
    Nothing,
    /// The file's data; the caller syncs the directory once for several files.
    FileOnly,
    /// The file's data and the directory entry.
    FileAndDir,
}

/// The atomic write behind [`SandboxRoot::write_atomic`], on an already opened directory.
pub fn write_atomic_in(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    no_replace: bool,
    durable: bool,
) -> io::Result<()> {
    write_atomic_flush(
        dir,
        name,
        bytes,
        mode,
        Put::new_or_any(no_replace),
        flush_for(durable),
    )
}

pub(super) fn flush_for(durable: bool) -> Flush {
    if durable {
        Flush::FileAndDir
    } else {
        Flush::Nothing
    }
}

/// [`write_atomic_in`] with an explicit [`Flush`] and what it may replace.
pub fn write_atomic_flush(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    put: Put,
    flush: Flush,
) -> io::Result<()> {
    write_atomic_then(dir, name, (bytes, mode), put, flush, (None, None))
}

/// [`write_atomic_flush`] of a target in a root, which whoever may write in the root can
/// race: the temporary file's name, out in the target's folder, may have another file
/// renamed over it (a hard link to a file outside the root, a FIFO) just before it is
/// moved. Put in place by `put_in_place_checked`: refused (`conflict`) when the target
/// would not be the file written, the file there before kept, rather than reported
/// written with bytes the target does not hold. Written through the temporary name
/// `tmp` when given (see [`action_temp_name`]), else a fresh one. `still` says, once the
/// file is in place, whether `dir` is still where the write was meant: when it is not,
/// the write is taken back (the file replaced put back, a new file removed).
pub fn write_atomic_placed(
    dir: &Dir,
    (name, tmp): (&str, Option<&str>),
    bytes: &[u8],
    mode: u32,
    (put, flush): (Put, Flush),
    still: &dyn Fn() -> io::Result<()>,
) -> io::Result<()> {
    write_atomic_then(dir, name, (bytes, mode), put, flush, (tmp, Some(still)))
}

/// The atomic write, its file put in place by [`put_in_place_checked`] when `checked`
/// (given what says the folder is still in place; the file held open until then, so
/// that its inode cannot be freed and given to another). Its temporary name is `known`
/// (see [`action_temp_name`]) or a fresh one.
fn write_atomic_then(
    dir: &Dir,
    name: &str,
    (bytes, mode): (&[u8], u32),
    put: Put,
    flush: Flush,
    (known, checked): (Option<&str>, Option<&dyn Fn() -> io::Result<()>>),
) -> io::Result<()> {
    let tmp = known.map_or_else(temp_name, str::to_owned);
    let owner = match put {
        Put::Unchanged(was) => Some(was.owner),
        Put::Any => owner_now(dir, name),
        Put::New => None,
    };
    let sync = flush != Flush::Nothing;
    let made = match write_new_file(dir, &tmp, bytes, mode, owner, sync) {
        // A name known ahead may hold what a write under it that this process could not
        // clean up left, or what another program put there: the runtime's name either
        // way (no action may write it), taken back once. Never opened: removed.
        Err(e) if known.is_some() && e.kind() == io::ErrorKind::AlreadyExists => {
            dir.remove_file(&tmp)?;
            write_new_file(dir, &tmp, bytes, mode, owner, sync)
        }
        made => made,
    };
    let result = made.and_then(|file| {
        #[cfg(test)]
        BEFORE_RENAME.with(|hook| hook.take().map(|f| f(dir, &tmp)));
        match checked {
            Some(still) => put_in_place_checked(dir, (&tmp, name), put, &file, still),
            None => put_in_place(dir, &tmp, name, put),
        }
    });
    if let Err(e) = result {
        if !temp_holds_kept(&e) {
            let _ = dir.remove_file(&tmp);
        }
        return Err(e);
    }
    if flush == Flush::FileAndDir {
        sync_dir(dir).map_err(|e| match checked.is_some() {
            // In place: never taken for a refusal before anything was touched.
            true => io::Error::other(super::refusal::failed_once_placed(
                name,
                "the sync of its folder",
                &e,
            )),
            false => e,
        })?;
    }
    Ok(())
}

/// What a test runs between a temporary file's making and its rename.
#[cfg(test)]
pub(crate) type RaceHook = Box<dyn FnOnce(&Dir, &str)>;

#[cfg(test)]
thread_local! {
    /// Run once, on this thread's next atomic write, between the temporary file's making
    /// and its rename (given the folder and the temporary name): a test plays there the
    /// program that races the write.
    pub(crate) static BEFORE_RENAME: std::cell::Cell<Option<RaceHook>> =
        const { std::cell::Cell::new(None) };
    /// Run once, on this thread's next exchange of names (or move aside of a file
    /// being removed), just after it (given the folder and the temporary name, which
    /// now names the file replaced or being removed).
    pub(super) static AFTER_EXCHANGE: std::cell::Cell<Option<RaceHook>> =
        const { std::cell::Cell::new(None) };
    /// The error (its number) the next look after a rename on this thread meets, as if
    /// the system had refused it.
    pub(super) static FAIL_CHECK: std::cell::Cell<Option<i32>> =
        const { std::cell::Cell::new(None) };
    /// The error (its number) the next undoing of an exchange of names, taking back of a
    /// new file, or removal of a file moved aside to be removed, on this thread meets,
    /// as if the system had refused it.
    pub(super) static FAIL_UNDO: std::cell::Cell<Option<i32>> =
        const { std::cell::Cell::new(None) };
    /// The error (its number) the next move aside of a file to be removed on this thread
    /// meets, as if the system had refused it.
    pub(super) static FAIL_ASIDE: std::cell::Cell<Option<i32>> =
        const { std::cell::Cell::new(None) };
    /// The error (its number) the next sync of a folder on this thread meets.
    pub(super) static FAIL_DIR_SYNC: std::cell::Cell<Option<i32>> =
        const { std::cell::Cell::new(None) };
    /// Whether folders are taken, on this thread, for folders this process may not list
    /// (as for a runtime not running as root in a folder of mode 0311).
    pub(super) static UNLISTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The error (its number) the next read of a folder from its end on this thread
    /// meets, as a file system that took the seek and then refused the read may answer
    /// (whether or not this one can seek a folder to its end).
    pub(super) static FAIL_READ_AT_END: std::cell::Cell<Option<i32>> =
        const { std::cell::Cell::new(None) };
}

/// Whether `name` in `dir` names `file`, the file just renamed there.
fn placed(dir: &Dir, name: &str, file: &File) -> io::Result<()> {
    let unchecked = |e: io::Error| {
        io::Error::other(super::refusal::failed_once_placed(
            name,
            "the look at what holds its name",
            &e,
        ))
    };
    let ours = file.metadata().map_err(unchecked)?;
    let looked = dir.symlink_metadata(name);
    #[cfg(test)]
    let looked = match FAIL_CHECK.take() {
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
        None => looked,
    };
    match looked {
        Ok(m) if m.dev() == ours.dev() && m.ino() == ours.ino() => Ok(()),
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(unchecked(e)),
        // Another file there, or none.
        _ => Err(io::Error::other(super::refusal::replaced_before_placed(
            name,
        ))),
    }
}

/// Creates `name` (which must not exist) in `dir` with `bytes` directly, no temporary
/// file: for a file in a folder just made, whose completeness another file vouches for.
pub fn write_new_in(dir: &Dir, name: &str, bytes: &[u8], mode: u32, sync: bool) -> io::Result<()> {
    write_new_file(dir, name, bytes, mode, None, sync).map(drop)
}

/// The owner and group of the regular file `name` in `dir`, if there is one.
fn owner_now(dir: &Dir, name: &str) -> Option<(u32, u32)> {
    dir.symlink_metadata(name)
        .ok()
        .filter(cap_std::fs::Metadata::is_file)
        .map(|m| (m.uid(), m.gid()))
}

/// Creates `name` (which must not exist) with `bytes`, its data synced when `sync`, and
/// gives the file back open. A file it created but could not fill (the disk is full) is
/// removed again.
///
/// `owner`: the owner and group of the file it is to replace, given to it where this
/// process may (as root, or for a group it is in), so that a replacement, and a
/// restore, leave the file its owner's rather than the runtime's: a file of mode 0600
/// would otherwise be lost to its owner. Where it may not, the file is the runtime's.
fn write_new_file(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    sync: bool,
) -> io::Result<File> {
    // A runtime that is not root keeps every file it writes (it cannot give one away):
    // its owner bits let it read and write it, or a kept mode such as 0044 would shut it
    // out of its own write, never to be rolled back.
    let mode = if euid() == 0 {
        mode & 0o666
    } else {
        mode & 0o666 | 0o600
    };
    let mut opts = OpenOptions::new();
    opts.write(true)
        .create_new(true)
        .follow(FollowSymlinks::No)
        .mode(mode);
    let mut file = dir.open_with(name, &opts)?;
    // Asked even when the owner is the runtime's own: in a setgid folder a new file
    // takes the folder's group, which the replaced file may not have had.
    if let Some((uid, gid)) = owner {
        use rustix::fs::{Gid, Uid, fchown};
        let uid = (uid != euid()).then(|| Uid::from_raw(uid));
        if let Err(e) = fchown(&file, uid, Some(Gid::from_raw(gid))) {
            tracing::debug!(error = %e, ?uid, gid, "the replacement keeps the runtime's owner");
        }
    }
    let filled = file
        .write_all(bytes)
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    if let Err(e) = filled {
        drop(file);
        let _ = dir.remove_file(name);
        return Err(e);
    }
    Ok(file)
}

/// Moves the temporary file `tmp` to `name` in one step. With [`Put::New`] an existing
/// `name` is never replaced: `renameat2(RENAME_NOREPLACE)` where the filesystem has it,
/// else `linkat` (which fails where `renameat` would overwrite) and then `unlinkat`.
/// With [`Put::Unchanged`] the file there is looked at just before the rename: one
/// changed since it was read (another program appended to it, say) is left as it is.
fn put_in_place(dir: &Dir, tmp: &str, name: &str, put: Put) -> io::Result<()> {
    match put {
        Put::New => {}
        Put::Any => return dir.rename(tmp, dir, name),
        Put::Unchanged(was) => {
            unchanged(dir, name, was)?;
            return dir.rename(tmp, dir, name);
        }
    }
    // Both names are single components of `dir`, so the raw call resolves nothing beyond
    // the handle; anything else goes through cap-std.
    #[cfg(target_os = "linux")]
    if is_single_component(tmp) && is_single_component(name) {
        use rustix::fs::{RenameFlags, renameat_with};
        use rustix::io::Errno;
        match renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(()),
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {}
            Err(e) => return Err(e.into()),
        }
    }
    dir.hard_link(tmp, dir, name)?;
    dir.remove_file(tmp).map_err(|e| {
        io::Error::other(super::refusal::failed_once_placed(
            name,
            "the removal of its temporary name",
            &e,
        ))
    })
}

/// [`put_in_place`] of `file`, the open file written at `tmp`, for a target others may
/// race: `name` is checked to hold `file` once it is put there ([`placed`]). Replacing a
/// file, the two names are exchanged (`renameat2(RENAME_EXCHANGE)`), and the file
/// replaced, now at `tmp`, is removed only once `name` is seen to hold `file` (and, for
/// [`Put::Unchanged`], the file replaced is seen to be the one read; for [`Put::Any`], a
/// plain file); otherwise the exchange is undone and the write refused: what the
/// exchange took out goes back under the target's name, whether it stood there or
/// another program renamed it over `tmp` since (nothing tells which). Where the
/// filesystem cannot exchange names, a plain rename, checked after it.
fn put_in_place_checked(
    dir: &Dir,
    (tmp, name): (&str, &str),
    put: Put,
    file: &File,
    still: &dyn Fn() -> io::Result<()>,
) -> io::Result<()> {
    if put == Put::New {
        put_in_place(dir, tmp, name, put)?;
        placed(dir, name, file)?;
        // The folder moved meanwhile (into another root, say): the new file goes back
        // under its temporary name, which the caller removes.
        let Err(moved) = still() else {
            return Ok(());
        };
        #[cfg(test)]
        let refused = FAIL_UNDO.take();
        #[cfg(not(test))]
        let refused: Option<i32> = None;
        let back = match refused {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => {
                rustix::fs::renameat_with(dir, name, dir, tmp, rustix::fs::RenameFlags::NOREPLACE)
                    .map_err(io::Error::from)
            }
        };
        // Where the folder went may refuse it (Landlock, outside every root): said.
        return Err(match back {
            Ok(()) => moved,
            Err(e) => io::Error::other(super::refusal::not_taken_back(name, &e)),
        });
    }
    if let Put::Unchanged(was) = put {
        unchanged(dir, name, was)?;
    }
    #[cfg(target_os = "linux")]
    if is_single_component(tmp) && is_single_component(name) {
        use rustix::fs::{RenameFlags, renameat_with};
        use rustix::io::Errno;
        let exchange = || renameat_with(dir, tmp, dir, name, RenameFlags::EXCHANGE);
        match exchange() {
            Ok(()) => {
                #[cfg(test)]
                AFTER_EXCHANGE.with(|hook| hook.take().map(|f| f(dir, tmp)));
                let ours = placed(dir, name, file);
                let replaced = match put {
                    // Written to since the look before the exchange (an append by
                    // another program in between): it goes back, bytes and all.
                    Put::Unchanged(was) => dir.symlink_metadata(tmp).and_then(|m| {
                        if was.unwritten_since(FileStamp::of(&m)) {
                            Ok(())
                        } else {
                            Err(io::Error::other(changed_meanwhile(name)))
                        }
                    }),
                    // Taken as it is (a forced rollback), the target is still only ever
                    // a plain file replaced: a link, a folder or a special file another
                    // program put there since it was judged goes back.
                    _ => dir.symlink_metadata(tmp).and_then(|m| {
                        super::refusal::only_plain(name, &m).map_err(io::Error::other)
                    }),
                };
                // What the exchange took out is not the file judged: another program put
                // it at the target just before the exchange, or renamed it over `tmp`
                // since; nothing tells which. It goes back under the target's name
                // either way (below), not removed with the temporary name. (What stands
                // under that name when the write gives up is removed as the runtime's:
                // a program that renames something over it, or swaps names again within
                // the microseconds between two calls, loses that name, never what a link
                // names.)
                let done = ours
                    .and(replaced)
                    .and_then(|()| still())
                    .and_then(|()| dir.remove_file(tmp));
                if done.is_err() {
                    // What stood at `name` goes back; what stood at `tmp` is the
                    // caller's to remove. Should `name` have been taken away meanwhile,
                    // the file replaced goes back under it all the same (never over
                    // another), rather than be removed with the temporary name.
                    #[cfg(test)]
                    let refused = FAIL_UNDO.take();
                    #[cfg(not(test))]
                    let refused: Option<i32> = None;
                    let back = match refused.map(Errno::from_raw_os_error) {
                        Some(e) => Err(e),
                        None => match exchange() {
                            Err(Errno::NOENT) => {
                                renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE)
                            }
                            back => back,
                        },
                    };
                    if let Err(e) = back {
                        return Err(not_put_back(dir, tmp, name, e.into()));
                    }
                }
                return done;
            }
            // Nothing at `name`: nothing there to keep.
            Err(Errno::NOENT | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {}
            Err(e) => return Err(e.into()),
        }
    }
    dir.rename(tmp, dir, name)?;
    placed(dir, name, file)
}

/// The refusal of a write given up whose exchange of names could not be undone (`e`):
/// the new bytes stand at `name`, and what the exchange took out, under `tmp`, is moved
/// to a [`kept_name`] (a temporary name is one a later start removes). Where the disk
/// refuses that too, it stays under `tmp`, and the refusal tells the caller not to
/// remove that name ([`TempHoldsKept`]).
fn not_put_back(dir: &Dir, tmp: &str, name: &str, e: io::Error) -> io::Error {
    use rustix::fs::{RenameFlags, renameat_with};
    let (name, why) = (shown_path(name), crate::error::io_words(&e));
    let kept = kept_name();
    if renameat_with(dir, tmp, dir, &kept, RenameFlags::NOREPLACE).is_ok() {
        return io::Error::other(Refusal::new(
            ReasonCode::IoError,
            format!(
                "{name} could not be put back as it was after the write was given up ({why}): the new bytes stand there, and the file that stood there is kept beside it as {}; put it back by hand once the disk is put right",
                shown_path(&kept)
            ),
        ));
    }
    io::Error::other(TempHoldsKept(Refusal::new(
        ReasonCode::IoError,
        format!(
            "{name} could not be put back as it was after the write was given up ({why}): the new bytes stand there, and the file that stood there is beside it under the temporary name {}, which the runtime may remove as a leftover of a process that died: move it back by hand now",
            shown_path(tmp)
        ),
    )))
}

/// A name for a file the runtime keeps for a person (one it could not put back): no
/// temporary name, which recovery would remove as a dead process's.
fn kept_name() -> String {
    format!("{KEPT_MARKER}{}", crate::ids::unique())
}

/// What names of [`kept_name`] begin with.
const KEPT_MARKER: &str = ".ailab-kept-";

/// A write's refusal after which its temporary name holds a file to keep (see
/// [`not_put_back`]): the caller does not remove that name.
#[derive(Debug)]
pub(crate) struct TempHoldsKept(pub(crate) Refusal);

impl std::fmt::Display for TempHoldsKept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.reason)
    }
}

impl std::error::Error for TempHoldsKept {}

/// Whether `e` says the write's temporary name holds a file to keep.
fn temp_holds_kept(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|e| e.is::<TempHoldsKept>())
}

/// Removes `name` in `dir`, found a moment ago to be the file `was` describes, only if
/// nothing was written to it since: moved aside under a fresh temporary name first, so
/// that what another program appends up to that move is seen there and the file put
/// back (never over another file), `conflict`. So too when `still` refuses: the folder
/// is no longer at its path. Whether it was found: gone meanwhile (removed, or its
/// folder swapped for another), `false`, nothing removed.
pub(super) fn remove_unwritten(
    dir: &Dir,
    name: &str,
    was: FileStamp,
    still: &dyn Fn() -> Result<(), Refusal>,
) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    if is_single_component(name) {
        use rustix::fs::{RenameFlags, renameat_with};
        use rustix::io::Errno;
        let aside = temp_name();
        #[cfg(test)]
        let moved_aside = match FAIL_ASIDE.take() {
            Some(e) => Err(Errno::from_raw_os_error(e)),
            None => renameat_with(dir, name, dir, &aside, RenameFlags::NOREPLACE),
        };
        #[cfg(not(test))]
        let moved_aside = renameat_with(dir, name, dir, &aside, RenameFlags::NOREPLACE);
        match moved_aside {
            Ok(()) => {
                #[cfg(test)]
                AFTER_EXCHANGE.with(|hook| hook.take().map(|f| f(dir, &aside)));
                let now = dir.symlink_metadata(&aside).map(|m| FileStamp::of(&m));
                let (why, moved) = if !now.as_ref().is_ok_and(|now| was.unwritten_since(*now)) {
                    (changed_meanwhile(name), false)
                } else if let Err(moved) = still() {
                    (moved, true)
                } else {
                    #[cfg(test)]
                    let removed = match FAIL_UNDO.take() {
                        Some(e) => Err(io::Error::from_raw_os_error(e)),
                        None => dir.remove_file(&aside),
                    };
                    #[cfg(not(test))]
                    let removed = dir.remove_file(&aside);
                    let Err(e) = removed else {
                        return Ok(true);
                    };
                    // Not removed (the disk refusing it, or the folder moved where the
                    // runtime may change nothing): back under its name, else said
                    // where it stays.
                    return Err(
                        match renameat_with(dir, &aside, dir, name, RenameFlags::NOREPLACE) {
                            // Refused for the folder's move out of the root (Landlock),
                            // not for its permissions: said so.
                            Ok(()) => still().err().map_or(e, io::Error::other),
                            Err(back) => io::Error::other(left_aside(
                                dir,
                                (name, aside),
                                (Some(&e), back),
                                still().is_err(),
                            )),
                        },
                    );
                };
                // Back under its name, with what was written to it; should another
                // file have taken the name meanwhile, it is kept beside it, named.
                return Err(io::Error::other(
                    match renameat_with(dir, &aside, dir, name, RenameFlags::NOREPLACE) {
                        Ok(()) => why,
                        Err(back) => left_aside(dir, (name, aside), (None, back), moved),
                    },
                ));
            }
            Err(Errno::NOENT) => return Ok(false),
            // No such rename here: the look just made is the last.
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {}
            Err(e) => return Err(moved_or(e.into(), still)),
        }
    }
    still().map_err(io::Error::other)?;
    match dir.remove_file(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        r => r.map(|()| true).map_err(|e| moved_or(e, still)),
    }
}

/// `e`, a removal's refusal; or, where it is a permission and `still` finds the folder
/// moved (out of the root, where Landlock refuses every change), that move's.
fn moved_or(e: io::Error, still: &dyn Fn() -> Result<(), Refusal>) -> io::Error {
    if super::refusal::is_denied(&e)
        && let Err(moved) = still()
    {
        return io::Error::other(moved);
    }
    e
}

/// The refusal of a removal whose file, moved aside as `aside`, could not go back under
/// `name` (`back`), after its unlink failed (`unlink`) or it was found changed or its
/// folder `moved`: kept beside another file that took the name, gone (another program
/// took it from there), or staying where it is, named.
#[cfg(target_os = "linux")]
fn left_aside(
    dir: &Dir,
    (name, aside): (&str, String),
    (unlink, back): (Option<&io::Error>, rustix::io::Errno),
    moved: bool,
) -> Refusal {
    use rustix::io::Errno;
    match back {
        Errno::EXIST if unlink.is_none() => {
            super::refusal::kept_aside(name, &keep_aside(dir, aside), moved)
        }
        Errno::NOENT => super::refusal::taken_from_aside(name),
        back => super::refusal::stays_aside(
            name,
            &keep_aside(dir, aside),
            (unlink, &io::Error::from(back)),
            moved,
        ),
    }
}

/// Moves the file at `aside`, a temporary name, to a name of its own that no start of
/// the runtime removes ([`kept_name`]), for a person to put back: that name, or `aside`
/// where the move fails too.
fn keep_aside(dir: &Dir, aside: String) -> String {
    use rustix::fs::{RenameFlags, renameat_with};
    let kept = kept_name();
    match renameat_with(dir, &aside, dir, &kept, RenameFlags::NOREPLACE) {
        Ok(()) => kept,
        Err(_) => aside,
    }
}

/// What stands at `path` below `dir` now, as [`read_file_in`] stamps a file (`None`:
/// nothing), in one look (`fstatat`, its last name not followed: a link is described):
/// to tell whether a file read before is still the one standing there, which a link on
/// the way cannot fake (it would have to lead to that very file, unchanged).
pub(crate) fn stamp_at(dir: &Dir, path: &str) -> io::Result<Option<FileStamp>> {
    use rustix::fs::{AtFlags, statat};
    match statat(dir, path, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileStamp {
            id: (st.st_dev, st.st_ino),
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: (st.st_mtime, i64::try_from(st.st_mtime_nsec).unwrap_or(-1)),
            ctime: (st.st_ctime, i64::try_from(st.st_ctime_nsec).unwrap_or(-1)),
            owner: (st.st_uid, st.st_gid),
        })),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Refuses (`conflict`) when `name` is no longer the file `was` describes.
fn unchanged(dir: &Dir, name: &str, was: FileStamp) -> io::Result<()> {
    // Through the handle (cap-std), whatever `name` holds: only the look at the owner
    // record, a fixed path, takes the one-call `stamp_at`.
    match dir.symlink_metadata(name) {
        Ok(m) if FileStamp::of(&m) == was => return Ok(()),
        // What is no plain file is said for what it is (a link, a folder: to be moved
        // away, not merely looked at again).
        Ok(m) => super::refusal::only_plain(name, &m).map_err(io::Error::other)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Err(io::Error::other(changed_meanwhile(name)))
}

/// A name that stays in its directory: not empty, no `/`, not `.` or `..`.
fn is_single_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// New bytes for a target, written to a temporary file beside it but not yet in place:
/// the first half of an atomic write, for callers that make the staged file durable
/// together with other records before the target changes.
#[derive(Debug)]
pub struct StagedWrite {
    dir: Dir,
    staged: String,
    name: String,
    /// The staged file, held open until it is in place (see [`write_atomic_placed`]).
    file: File,
    /// Whether the staged name came to hold a file to keep (see [`TempHoldsKept`]).
    keep: std::cell::Cell<bool>,
}

impl StagedWrite {
    /// The temporary file's name (in the target's directory).
    pub fn staged_name(&self) -> &str {
        &self.staged
    }

    /// The target's directory.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The staged file as written: the target's once the file takes its place.
    pub fn written(&self) -> io::Result<WrittenFile> {
        // From the file held open, not its name, which another program may have taken.
        self.file.metadata().map(|m| WrittenFile::of(&m))
    }

    /// Puts the staged bytes in place (see [`Put`] for what it may replace), then syncs
    /// the directory when `sync`.
    pub fn commit(&self, put: Put, sync: bool) -> io::Result<()> {
        self.commit_checked(put, sync, &|| Ok(()))
    }

    /// [`StagedWrite::commit`], `still` saying once the file is in place whether its
    /// folder is still where the write was meant (see [`put_in_place_checked`]).
    fn commit_checked(
        &self,
        put: Put,
        sync: bool,
        still: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<()> {
        put_in_place_checked(
            &self.dir,
            (&self.staged, &self.name),
            put,
            &self.file,
            still,
        )
        .inspect_err(|e| self.keep.set(temp_holds_kept(e)))?;
        if sync {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// [`StagedWrite::commit`], its failure a refusal naming `rel`, the target, in
    /// `root`, as a write's: one refused because the folder was moved out of the root
    /// meanwhile says so.
    pub fn commit_in(&self, root: &SandboxRoot, rel: &RelPath, put: Put, sync: bool) -> Verdict {
        self.commit_checked(put, sync, &|| root.still_in_place(&self.dir, rel))
            .map_err(|e| root.map_write_error_in(&self.dir, rel, e))
    }

    /// Removes the staged file; the target is left as it is. A name that came to hold
    /// a file to keep stays.
    pub fn discard(&self) {
        if !self.keep.get() {
            let _ = self.dir.remove_file(&self.staged);
        }
    }
}

impl SandboxRoot {
    /// Stages `bytes` for `rel` under `staged`, a fresh [`temp_name`] (not synced), owned
    /// like the file it is `replacing` (or, not given, the one there now), where this
    /// process may. The target's parents must exist: directories are only created by
    /// [`SandboxRoot::write_atomic`]; `walk` says whether a missing one was there when
    /// the action was checked, and which folder must be found on the way.
    pub fn stage_write(
        &self,
        rel: &RelPath,
        walk: impl Into<super::Walk>,
        staged: &str,
        bytes: &[u8],
        mode: u32,
        replacing: Option<FileStamp>,
    ) -> Verdict<StagedWrite> {
        if !is_temp_name(staged) {
            return Err(Refusal::new(
                ReasonCode::InvalidId,
                format!("{} is not a temporary name", shown_path(staged)),
            ));
        }
        let (dir, _) = self.open_parent_making(rel, walk.into(), false)?;
        let staged = staged.to_owned();
        let file = write_new_file(
            &dir,
            &staged,
            bytes,
            mode,
            replacing.map_or_else(|| owner_now(&dir, rel.file_name()), |r| Some(r.owner)),
            false,
        )
        .map_err(|e| self.map_write_error_in(&dir, rel, e))?;
        Ok(StagedWrite {
            dir: dir.into_owned().map_err(|e| self.map_open_error(rel, e))?,
            staged,
            name: rel.file_name().to_owned(),
            file,
            keep: std::cell::Cell::new(false),
        })
    }

    /// The regular file standing at `rel` (never followed), if one does, as
    /// [`WrittenFile`] describes it.
    pub fn written_file(&self, rel: &RelPath) -> Option<WrittenFile> {
        let (dir, _) = self.open_parent(rel, false, false).ok()?;
        dir.symlink_metadata(rel.file_name())
            .ok()
            .filter(cap_std::fs::Metadata::is_file)
            .map(|m| WrittenFile::of(&m))
    }

    /// A file staged earlier under `staged` beside `rel`, when it is still there and is a
    /// regular file holding `limit` bytes at most: returned with its bytes.
    pub fn find_staged(
        &self,
        rel: &RelPath,
        staged: &str,
        limit: u64,
    ) -> Option<(StagedWrite, Vec<u8>)> {
        if !is_temp_name(staged) {
            return None;
        }
        let (dir, _) = self.open_parent(rel, false, false).ok()?;
        let (bytes, file) = read_regular_open(&dir, staged, limit).ok()?;
        Some((
            StagedWrite {
                dir: dir.into_owned().ok()?,
                staged: staged.to_owned(),
                name: rel.file_name().to_owned(),
                file,
                keep: std::cell::Cell::new(false),
            },
            bytes,
        ))
    }
}

/// Whether `name` is one file name made by [`temp_name`] (a staged file recorded in a
/// snapshot is only trusted as that).
fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_MARKER) && !name.contains('/')
}

/// Removes what stands under the temporary name `tmp` in `dir` (not a folder): a write's
/// bytes that never took their place, or the file a rename exchanged out of it. Found by
/// its name (a staged write's, or one [`action_temp_name`] gives), not by listing the
/// folder, which a folder this process may write in but not read refuses. Says whether
/// something went.
pub(crate) fn remove_temp_named(dir: &Dir, tmp: &str) -> io::Result<bool> {
    if !is_temp_name(tmp) {
        return Ok(false);
    }
    match dir.remove_file(tmp) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ISDIR.raw_os_error()) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The temporary files in `dir` (not below it) made by the processes whose ids end in
/// one of `seeds` (see [`crate::ids::process_seed`]): a list, for
/// [`remove_temp_named`] to take them by name.
pub(crate) fn temp_files_made_by(dir: &Dir, seeds: &[&str]) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    if seeds.is_empty() {
        return Ok(names);
    }
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(TEMP_MARKER)
            && seeds.contains(&crate::ids::process_seed(name))
            && !entry_type(&entry)?.is_dir()
        {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// The temporary name a write or a restore of action `action_id` of workflow
/// `workflow_id` by the process whose ids end in `seed` writes its bytes under. Known
/// without listing the folder, which a folder the runtime may write in but not read
/// refuses: the recovery of a dead run or rollback removes it by this name. One write or
/// restore of an action at a time: its workflow and its target are locked.
pub fn action_temp_name(workflow_id: &str, action_id: &str, seed: &str) -> String {
    let of = crate::hash::sha256_hex(format!("{workflow_id}/{action_id}").as_bytes());
    format!("{TEMP_MARKER}a{}{seed}", &of[..24])
}

/// A fresh temporary name carrying [`TEMP_MARKER`], so recovery can find leftovers.
pub fn temp_name() -> String {
    format!("{TEMP_MARKER}{}", crate::ids::unique())
}

impl SandboxRoot {
    /// Removes the temporary files of the processes that made `made_by` (run ids, see
    /// `ids`) beside `rel` that are hard links to it: what a writer killed
    /// between linking its temporary file into place and unlinking the temporary name
    /// (where the filesystem lacks `RENAME_NOREPLACE`) left. Returns how many.
    pub fn remove_temp_links_of(&self, rel: &RelPath, made_by: &[&str]) -> usize {
        let Ok((dir, _)) = self.open_parent(rel, false, false) else {
            return 0;
        };
        let Ok(target) = dir.symlink_metadata(rel.file_name()) else {
            return 0;
        };
        let Ok(entries) = dir.entries() else {
            return 0;
        };
        let seeds: Vec<&str> = made_by
            .iter()
            .map(|m| crate::ids::process_seed(m))
            .collect();
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with(TEMP_MARKER) || !seeds.contains(&crate::ids::process_seed(name)) {
                continue;
            }
            if dir
                .symlink_metadata(name)
                .is_ok_and(|m| m.is_file() && m.dev() == target.dev() && m.ino() == target.ino())
                && dir.remove_file(name).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}

/// A file as its last write left it: the inode and birth time that name it, and the
/// modification time that write gave it. A later write in place changes the time; a
/// power cut that loses the write's data keeps it (it is the inode's, journaled with
/// its name). No device number: it may change when the filesystem is mounted again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WrittenFile {
    /// Inode.
    pub ino: u64,
    /// Birth time, nanoseconds since the epoch, where the filesystem keeps one.
    #[serde(default)]
    pub born_ns: Option<u64>,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl WrittenFile {
    fn of(m: &cap_std::fs::Metadata) -> Self {
        let id = DirId::of(m);
        Self {
            ino: id.ino,
            born_ns: id.born_ns,
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}

/// What a directory entry is, looked up without following it when the directory does
/// not say (`DT_UNKNOWN`, which some filesystems give for every entry: FUSE ones, older
/// XFS).
pub(crate) fn entry_type(entry: &cap_std::fs::DirEntry) -> io::Result<cap_std::fs::FileType> {
    let ft = entry.file_type()?;
    if ft.is_file() || ft.is_dir() || ft.is_symlink() {
        return Ok(ft);
    }
    entry.metadata().map(|m| m.file_type())
}

/// Removes the temporary files made by the process of `seed` (see `ids::process_seed`)
/// anywhere in a root's tree (`dir`), at most `depth` levels down, never through
/// symlinks nor into the snapshot store, and leaving those in the folders `keep` names
/// (by their components). A folder that cannot be opened or listed is passed over: what
/// it holds stays as it would without the walk. A file that cannot be removed is given
/// to `refused` with its folder's components, and the rest of that folder passed over;
/// the walk goes on while `refused` says so. Returns how many were removed.
pub(crate) fn remove_temp_files_in_tree(
    dir: &Dir,
    depth: usize,
    seed: &str,
    keep: &dyn Fn(&[String]) -> bool,
    refused: &mut dyn FnMut(&[String], io::Error) -> bool,
) -> usize {
    struct Walk<'a> {
        seed: &'a str,
        keep: &'a dyn Fn(&[String]) -> bool,
        refused: &'a mut dyn FnMut(&[String], io::Error) -> bool,
        removed: usize,
        stopped: bool,
    }
    fn walk(w: &mut Walk<'_>, dir: &Dir, comps: &mut Vec<String>, depth: usize) {
        let Ok(entries) = dir.entries() else {
            return;
        };
        let mut kept = (w.keep)(comps);
        for entry in entries.flatten() {
            if w.stopped {
                return;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(ft) = entry_type(&entry) else { continue };
            if ft.is_file()
                && !kept
                && name.starts_with(TEMP_MARKER)
                && crate::ids::process_seed(name) == w.seed
            {
                match dir.remove_file(name) {
                    Ok(()) => w.removed += 1,
                    Err(e) => {
                        w.stopped = !(w.refused)(comps, e);
                        kept = true;
                    }
                }
            } else if ft.is_dir()
                && depth > 0
                && !(comps.is_empty() && name == crate::confine::path::ROLLBACK_DIR)
                && let Ok(sub) = dir.open_dir_nofollow(name)
            {
                comps.push(name.to_owned());
                walk(w, &sub, comps, depth - 1);
                comps.pop();
            }
        }
    }
    let mut w = Walk {
        seed,
        keep,
        refused,
        removed: 0,
        stopped: false,
    };
    walk(&mut w, dir, &mut Vec::new(), depth);
    w.removed
}

/// Removes the runtime's leftover temporary files below `dir` (a crash between creating
/// and renaming one), descending at most `depth` levels and never through symlinks.
/// What another program renamed over such a name (a link, a FIFO) goes too: the name
/// is the runtime's, and removing it follows nothing.
/// With `made_by` (the id of a run, see `ids`), only those made by the process
/// that made that id: another process's may belong to a write under way. Returns how
/// many were removed.
pub fn remove_temp_files(dir: &Dir, depth: usize, made_by: Option<&str>) -> io::Result<usize> {
    let seed = made_by.map(crate::ids::process_seed);
    let mut removed = 0;
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ft = entry_type(&entry)?;
        if !ft.is_dir()
            && name.starts_with(TEMP_MARKER)
            && seed.is_none_or(|s| crate::ids::process_seed(name) == s)
        {
            dir.remove_file(name)?;
            removed += 1;
        } else if ft.is_dir()
            && !ft.is_symlink()
            && depth > 0
            && let Ok(sub) = dir.open_dir_nofollow(name)
        {
            removed += remove_temp_files(&sub, depth - 1, made_by)?;
        }
    }
    Ok(removed)
}
