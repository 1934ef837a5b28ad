//! The state directory: the runtime's own files (artifact registry, audit log, its head,
//! lock files). It lies outside every sandbox root and is never reachable by an action.
//!
//! It holds locked append-only logs, lock files, small atomic files, the per-workflow run
//! records (`inflight/`) and the workflow locks (`lock_workflow`). It is opened once, by
//! the walk from `/` a root takes (`root::open_checked_dir_through_link`): unlike a root,
//! the directory itself may be a symlink, followed under the rules for the folders above
//! it, since the runtime only reaches it and never hands it out. It is refused unless
//! private to the runtime's user; every file in it is then opened by a single name under
//! one of its three handles, never following a symlink.
//!
//! Every lock here (the target stripes, the workflow locks, the audit and registry logs) is
//! taken by polling a non-blocking `flock` against a deadline, `limits.lock_wait_seconds`
//! (30 s by default), since `flock` has no timeout: a stopped or hung process holding one
//! gets the others refused, not stalled (`conflict` for targets and workflows; an I/O
//! failure for a log, undone like any other). A process's threads share the bound: a
//! stripe's in-process turn is polled against the same deadline, a rollback takes one
//! deadline for all its stripes, and threads queued behind a log just found stuck give up
//! at once (`timed_lock`). A wait that runs out is a `LockBusy` (busy: `conflict`, to try
//! again), told apart from the system's own time-outs (`io_error`).
// confine/ is where paths are opened. Only the types are allowed module-wide: the path
// functions are allowed one function at a time, so that the chmod and subprocess bans of
// clippy.toml (SPEC §12.1-2) still hold in the rest of this module.
#![allow(clippy::disallowed_types)]

use crate::group_commit::GroupCommit;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, OpenOptions, OpenOptionsExt};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Subdirectory holding one record per run that is changing files right now.
pub const INFLIGHT_DIR: &str = "inflight";

/// The state directory, reached only through the directory handles opened (and vetted)
/// at start-up: every file in it is opened by a single name under one of them, never
/// following a symlink, so nothing planted there can send a write elsewhere.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    dirs: std::sync::Arc<Handles>,
    /// How long a lock another process holds is waited for (see [`lock_within`]).
    lock_wait: std::time::Duration,
}

/// The state directory's handles: its top and its two subdirectories.
#[derive(Debug)]
struct Handles {
    top: Dir,
    locks: Dir,
    inflight: Dir,
}

/// Mode of the state directory and its subdirectories: private to the runtime's user.
const STATE_DIR_MODE: u32 = 0o700;

impl StateDir {
    /// The state directory's own handle, opened at start.
    pub(crate) fn top(&self) -> &Dir {
        &self.dirs.top
    }

    /// Creates (mode 0700) and opens the state directory. It is refused when it or a
    /// directory above it could be controlled by another user (see
    /// `root::open_checked_dir`; a symlink as the directory itself is followed under the
    /// same rules), or when it is owned by another user or writable by others: it holds
    /// the audit trail, the registry and the seal key that decides which snapshots are
    /// trusted. Outside the crate only with the `internals` feature: the logs opened
    /// through it take lines no governance stands behind.
    #[cfg(feature = "internals")]
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_checked(path)
    }

    /// [`StateDir::open`], for the `Sandbox`.
    pub(crate) fn open_checked(path: &Path) -> io::Result<Self> {
        let checked =
            super::root::open_checked_dir_through_link(path, true, STATE_DIR, STATE_DIR_MODE)
                .map_err(walk_refusal)?;
        check_private_dir(&checked.dir, &checked.meta, &path.display().to_string())?;
        let sub = |name: &str| -> io::Result<Dir> {
            let mut b = DirBuilder::new();
            b.mode(STATE_DIR_MODE);
            match checked.dir.create_dir_with(name, &b) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            let shown = path.join(name).display().to_string();
            let d = checked.dir.open_dir_nofollow(name).map_err(|e| {
                let what = kind_at(&checked.dir, name);
                if what == "a folder" {
                    return io::Error::new(
                        e.kind(),
                        format!(
                            "{STATE_DIR} folder {shown} cannot be opened: {}",
                            crate::error::io_words(&e)
                        ),
                    );
                }
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{STATE_DIR} folder {shown} is {what}, not a folder; the state directory's folders are never opened through anything else: put the folder it stands for back in its place (`inflight` holds the records of runs a start must recover; `locks` may be made again once the thing is moved away)"
                    ),
                )
            })?;
            check_private_dir(&d, &d.dir_metadata()?, &shown)?;
            Ok(d)
        };
        let (locks, inflight) = (sub("locks")?, sub(INFLIGHT_DIR)?);
        Ok(Self {
            path: path.to_path_buf(),
            dirs: std::sync::Arc::new(Handles {
                top: checked.dir,
                locks,
                inflight,
            }),
            lock_wait: std::time::Duration::from_secs(crate::config::LOCK_WAIT_SECONDS),
        })
    }

    /// What opening the state directory would refuse in what exists of `path` now (a
    /// file in its place or above it, another user's directory or link on the way, a
    /// directory others may write in), found without making anything.
    pub fn probe(path: &Path) -> io::Result<()> {
        match super::root::probe_checked_dir_through_link(path, STATE_DIR).map_err(walk_refusal)? {
            Some(meta) => check_private(&meta, &path.display().to_string()),
            None => Ok(()),
        }
    }

    /// The same directory, whose locks (and those of the logs it opens from now on) are
    /// waited for at most `wait` when another process holds them.
    pub fn with_lock_wait(mut self, wait: std::time::Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// How long its locks are waited for.
    pub fn lock_wait(&self) -> std::time::Duration {
        self.lock_wait
    }

    /// Reads top-level files of the state directory at `path` without creating or
    /// writing anything (`None` for a missing file): for a state directory this process
    /// cannot write, such as a read-only copy kept for an audit. Each file is read
    /// through the directory's handle without following a link, at most `limit` bytes.
    pub fn read_without_opening(
        path: &Path,
        names: &[&str],
        limit: u64,
    ) -> io::Result<Vec<Option<Vec<u8>>>> {
        let dir = Self::dir_without_opening(path)?;
        names
            .iter()
            .map(|name| read_if_present(&dir, name, name, limit))
            .collect()
    }

    /// [`StateDir::read_without_opening`] for files to be read a part at a time: each
    /// is opened, not read.
    pub fn open_without_opening(path: &Path, names: &[&str]) -> io::Result<Vec<Option<StateFile>>> {
        let dir = Self::dir_without_opening(path)?;
        names
            .iter()
            .map(|name| {
                let file = super::root::open_file_in(&dir, name).map(StateFile);
                if_present(file, &dir, name, name)
            })
            .collect()
    }

    /// The state directory at `path`, checked as opening it checks it, but neither made
    /// nor written.
    fn dir_without_opening(path: &Path) -> io::Result<Dir> {
        super::root::open_checked_dir_through_link(path, false, "state directory", STATE_DIR_MODE)
            .map(|checked| checked.dir)
            .map_err(io::Error::other)
    }

    /// The `(st_dev, st_ino)` of the directory and of its folders.
    pub fn dir_ids(&self) -> io::Result<Vec<(u64, u64)>> {
        use cap_std::fs::MetadataExt as _;
        [&self.dirs.top, &self.dirs.locks, &self.dirs.inflight]
            .into_iter()
            .map(|d| d.dir_metadata().map(|m| (m.dev(), m.ino())))
            .collect()
    }

    /// The `(st_dev, st_ino)` of the state directory and of every folder beneath it
    /// (symbolic links not followed; at most 4096 folders, which a state directory of
    /// three never approaches).
    pub fn tree_dir_ids(&self) -> io::Result<std::collections::HashSet<(u64, u64)>> {
        use cap_std::fs::MetadataExt as _;
        const MAX_DIRS: usize = 4096;
        let mut ids = std::collections::HashSet::new();
        let mut pending = vec![self.dirs.top.try_clone()?];
        while let Some(dir) = pending.pop() {
            let m = dir.dir_metadata()?;
            if !ids.insert((m.dev(), m.ino())) || ids.len() >= MAX_DIRS {
                continue;
            }
            for e in dir.entries()? {
                let e = e?;
                if crate::confine::root::entry_type(&e)?.is_dir()
                    && let Ok(sub) = dir.open_dir_nofollow(e.file_name())
                {
                    pending.push(sub);
                }
            }
        }
        Ok(ids)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory handle and the file name for `rel` (`name`, `locks/name` or
    /// `inflight/name`).
    fn locate<'a>(&'a self, rel: &'a str) -> io::Result<(&'a Dir, &'a str)> {
        let (dir, name) = match rel.split_once('/') {
            None => (&self.dirs.top, rel),
            Some(("locks", n)) => (&self.dirs.locks, n),
            Some((INFLIGHT_DIR, n)) => (&self.dirs.inflight, n),
            Some(_) => (&self.dirs.top, ""),
        };
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{rel:?} is not a file of the state directory"),
            ));
        }
        Ok((dir, name))
    }

    /// Opens `rel` with `opts`, never following a symlink, and only as a regular file:
    /// a FIFO read as an empty log would lose the record without a word, and one opened
    /// for writing alone would wait for a reader for ever.
    fn open_file(&self, rel: &str, opts: &mut OpenOptions) -> io::Result<File> {
        self.open_file_meta(rel, opts).map(|(f, _)| f)
    }

    /// [`StateDir::open_file`], with the file's metadata.
    fn open_file_meta(
        &self,
        rel: &str,
        opts: &mut OpenOptions,
    ) -> io::Result<(File, cap_std::fs::Metadata)> {
        let (dir, name) = self.locate(rel)?;
        opts.follow(FollowSymlinks::No).nonblock(true);
        let file = dir.open_with(name, opts).map_err(|e| {
            match rustix::io::Errno::from_io_error(&e) {
                // A link, a folder, a socket or a FIFO opened for writing with no reader.
                Some(
                    rustix::io::Errno::LOOP | rustix::io::Errno::ISDIR | rustix::io::Errno::NXIO,
                ) => not_regular(dir, name, rel),
                _ => shut_out(e, rel),
            }
        })?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(not_regular(dir, name, rel));
        }
        // Opened, yet another user's (its mode let this process in, or this process is
        // root): its owner could change it at will. Only root or the runtime's user can
        // put one here, the folders being private.
        let (owner, euid) = (cap_std::fs::MetadataExt::uid(&meta), super::root::euid());
        if owner != euid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                TakenFile(format!(
                    "the state directory's {rel}: permission denied: another user owns it (uid {owner}); the state directory's files must be the runtime user's own: give it back to uid {euid}, or move it away"
                )),
            ));
        }
        Ok((file.into_std(), meta))
    }

    /// Opens (creating) an append-only log file.
    pub fn open_log(&self, name: &str) -> io::Result<LogFile> {
        let file = self.open_file(
            name,
            OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .mode(0o600),
        )?;
        let identity = {
            use std::os::unix::fs::MetadataExt as _;
            let m = file.metadata()?;
            (m.dev(), m.ino())
        };
        Ok(LogFile {
            file,
            identity,
            wait: self.lock_wait,
            stalled: std::sync::Mutex::new(None),
        })
    }

    /// Whether `rel` still names the file `log` was opened as: one moved away, or
    /// replaced by another, would take appends out of the state directory unseen.
    pub fn still_names(&self, rel: &str, log: &LogFile) -> io::Result<bool> {
        let (dir, name) = self.locate(rel)?;
        names_file(dir, name, log.identity)
    }

    /// Takes an exclusive lock named `name` (a file under `locks/`), held until the guard
    /// drops. It excludes other threads and other processes alike: each call opens its
    /// own file description.
    pub fn lock(&self, name: &str) -> io::Result<FileLock> {
        let file = self.lock_file(name)?;
        lock_within(&file, false, self.lock_wait)?;
        Ok(FileLock { file })
    }

    fn lock_file(&self, name: &str) -> io::Result<File> {
        self.open_file(
            &lock_path(name),
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600),
        )
    }

    /// Like [`StateDir::lock`] but does not wait: `None` when another holder has it.
    pub fn try_lock(&self, name: &str) -> io::Result<Option<FileLock>> {
        try_holding(self.lock_file(name)?)
    }

    /// [`StateDir::try_lock_workflow`] for a look that must leave nothing behind (a
    /// rollback's preview, which any id may name): `None` as well when no run or
    /// rollback of the workflow holds its lock or left a record, which it then guards
    /// nothing of.
    pub fn try_lock_workflow_if_used(&self, id: &str) -> io::Result<Option<WorkflowLock>> {
        self.workflow_lock_with(id, false, None)
    }

    /// Takes workflow `id`'s lock: a run, rollback, recovery or prune of one workflow at
    /// a time, across threads and processes, waited for as [`StateDir::lock`] does.
    pub fn lock_workflow(&self, id: &str) -> io::Result<WorkflowLock> {
        self.workflow_lock_with(id, true, Some(self.lock_wait))
            .and_then(|l| l.ok_or_else(|| io::Error::other("a workflow lock taken was not held")))
    }

    /// Like [`StateDir::lock_workflow`] but does not wait: `None` when another holder has it.
    pub fn try_lock_workflow(&self, id: &str) -> io::Result<Option<WorkflowLock>> {
        self.workflow_lock_with(id, true, None)
    }

    /// Removes the lock files of workflows that keep no record and that nobody holds
    /// now (left by versions that kept every one, or by a process killed holding one).
    /// Returns how many went.
    pub fn sweep_unused_workflow_locks(&self) -> io::Result<usize> {
        let mut removed = 0;
        for e in self.dirs.locks.entries()? {
            let name = e?.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("wf-"))
                .and_then(|n| n.strip_suffix(".lock"))
                .filter(|id| crate::plan::is_valid_id(id))
            else {
                continue;
            };
            if let Ok(Some(lock)) = self.workflow_lock_with(id, false, None)
                && !lock.keeps_a_record()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Workflow `id`'s lock on the file its name holds now (made when `create`, else
    /// `None` when there is none), waited for up to `wait`, else `None` when another
    /// holder has it. A holder removes the file when it lets go of a workflow that keeps
    /// no record ([`WorkflowLock`]), so a waiter may get the lock of a file no longer
    /// under the name: it checks the name after locking, and on another file lets go and
    /// locks the name's file instead. Two holders of one workflow would otherwise hold
    /// two files.
    fn workflow_lock_with(
        &self,
        id: &str,
        create: bool,
        wait: Option<std::time::Duration>,
    ) -> io::Result<Option<WorkflowLock>> {
        use cap_std::fs::MetadataExt as _;
        let rel = lock_path(&workflow_lock(id));
        let deadline = wait.map(|w| (std::time::Instant::now() + w, w));
        // Each turn follows another holder's removal of the file: a name replaced this
        // many times while one waiter looks is a fault, not contention.
        for _ in 0..LOCK_FILE_TURNS {
            let mut opts = OpenOptions::new();
            opts.read(true).write(true);
            if create {
                opts.create(true).truncate(false).mode(0o600);
            }
            let (file, meta) = match self.open_file_meta(&rel, &mut opts) {
                Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
                r => r?,
            };
            match deadline {
                Some((at, w)) => flock_until(&file, false, at, w)?,
                None => match file.try_lock() {
                    Ok(()) => {}
                    Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                    Err(std::fs::TryLockError::Error(e)) => return Err(e),
                },
            }
            let (dir, name) = self.locate(&rel)?;
            if names_file(dir, name, (meta.dev(), meta.ino()))? {
                return Ok(Some(WorkflowLock {
                    dirs: self.dirs.clone(),
                    id: id.to_owned(),
                    identity: (meta.dev(), meta.ino()),
                    kept: false,
                    _lock: FileLock { file },
                }));
            }
            // Dropping `file` lets its lock go.
        }
        Err(io::Error::other(format!(
            "the state directory's {rel} was removed or replaced {LOCK_FILE_TURNS} times while it was being locked"
        )))
    }

    /// Writes `name`'s run record in place (see [`StateDir::write_block`]).
    pub fn inflight_write(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        self.write_block(&format!("{INFLIGHT_DIR}/{name}.json"), bytes, durable)
    }

    /// Creates the one-block record `rel` with `bytes`, durable, unless it exists: it
    /// appears whole or not at all, and a second creator keeps the first one's. Returns
    /// whether this call made it.
    pub fn create_block(&self, rel: &str, bytes: &[u8]) -> io::Result<bool> {
        self.create_whole(rel, &padded_block(bytes)?, true)
    }

    /// Creates `rel` with `bytes` unless it exists: written aside and linked into place,
    /// so a reader never sees it empty or half written, and a second creator keeps the
    /// first one's. When `durable`, the directory is synced before returning either way:
    /// the caller is about to rely on the entry, which another process may have linked a
    /// moment ago. Returns whether this call made it.
    fn create_whole(&self, rel: &str, bytes: &[u8], durable: bool) -> io::Result<bool> {
        let (dir, name) = self.locate(rel)?;
        let linked = self.write_aside(rel, bytes, durable).and_then(|tmp| {
            let linked = dir.hard_link(&tmp, dir, name);
            let _ = dir.remove_file(&tmp);
            linked
        });
        let made = match linked {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        if durable {
            super::root::sync_dir(dir)?;
        }
        Ok(made)
    }

    /// Replaces `rel` with `bytes` whole: a temporary file beside it, its data synced,
    /// renamed over it. A crash leaves the old file or the new; the new one's name is
    /// durable once its directory is synced ([`StateDir::sync_prune_marks`]).
    fn replace_whole(&self, rel: &str, bytes: &[u8]) -> io::Result<()> {
        let (dir, name) = self.locate(rel)?;
        let tmp = self.write_aside(rel, bytes, true)?;
        if let Err(e) = dir.rename(&tmp, dir, name) {
            let _ = dir.remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// A new temporary file beside `rel` (`.{name}.ailab-tmp-…`, which start-up removes
    /// when its maker died) holding `bytes`, synced when `durable`: its name. Removed
    /// again if it cannot be written.
    fn write_aside(&self, rel: &str, bytes: &[u8], durable: bool) -> io::Result<String> {
        let (dir, name) = self.locate(rel)?;
        let tmp = format!(".{name}{}", super::root::temp_name());
        let mut f = self.open_file(
            &beside(rel, &tmp),
            OpenOptions::new().write(true).create_new(true).mode(0o600),
        )?;
        match f
            .write_all(bytes)
            .and_then(|()| if durable { f.sync_data() } else { Ok(()) })
        {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = dir.remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Opens a one-block record written by [`StateDir::write_block`], to read and rewrite
    /// it without looking it up again; `None` when it does not exist.
    pub fn open_block(&self, rel: &str) -> io::Result<Option<BlockFile>> {
        match self.open_file(rel, OpenOptions::new().read(true).write(true)) {
            Ok(file) => Ok(Some(BlockFile { file })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a small record in place: `bytes` padded to one block, so an
    /// overwrite allocates nothing and changes only the sectors the record covers. The first write creates
    /// the file and syncs its directory; later ones cost one `fdatasync` when `durable`.
    pub fn write_block(&self, rel: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let block = padded_block(bytes)?;
        let rewrite = |f: &File| {
            f.write_all_at(&block, 0)?;
            if durable {
                f.sync_data()?;
            }
            Ok(())
        };
        match self.open_file(rel, OpenOptions::new().write(true)) {
            Ok(f) => rewrite(&f),
            // Made whole: another process listing the folder (a start's recovery) must
            // never find the record empty, which would make it look unreadable.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if self.create_whole(rel, &block, durable)? {
                    Ok(())
                } else {
                    rewrite(&self.open_file(rel, OpenOptions::new().write(true))?)
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Records which of `workflow`'s snapshots prunes removed: for each root (as
    /// configured), the audit seq the last prune there reached; writes audited up to it
    /// into that root have no snapshot any more, by design. Replaced whole (a small JSON
    /// file, however many roots it names), its bytes synced, its name not:
    /// [`StateDir::sync_prune_marks`] makes the names of many workflows' marks durable
    /// at once, before any of their snapshots go.
    pub fn write_prune_mark(&self, workflow: &str, pruned: &[(String, u64)]) -> io::Result<()> {
        let roots: Vec<serde_json::Value> = pruned
            .iter()
            .map(|(root, seq)| serde_json::json!({"root": root, "up_to_seq": seq}))
            .collect();
        let text = serde_json::to_vec(&serde_json::json!({ "pruned": roots }))
            .map_err(io::Error::other)?;
        self.replace_whole(&format!("{INFLIGHT_DIR}/{workflow}.pruned"), &text)
    }

    /// Removes `workflow`'s prune mark (gone already is an error the caller may ignore).
    pub fn remove_prune_mark(&self, workflow: &str) -> io::Result<()> {
        self.remove(&format!("{INFLIGHT_DIR}/{workflow}.pruned"))
    }

    /// Makes the prune marks written so far durable, in every durability mode, with one
    /// sync of their folder however many there are (their bytes were synced as each was
    /// written: a sync per file, unlike a whole filesystem's, holds on every filesystem,
    /// FUSE mounts among them, reports its own write's failure, and waits for no other
    /// writer's data): the removals follow in another directory, often on another
    /// filesystem, and one that reached the disk before its mark would leave the
    /// workflow's writes called missing for good.
    pub fn sync_prune_marks(&self) -> io::Result<()> {
        super::root::sync_dir(&self.dirs.inflight)
    }

    /// The roots the prunes of `workflow` removed snapshots in, each with the audit seq
    /// the last prune there reached, if any prune did. A mark of the first format (one
    /// seq, then the roots, one per line) gives its seq to each of its roots.
    /// A mark that reads as neither format is an `InvalidData` error saying so: taken for
    /// none, the snapshots its prunes removed would be called missing.
    pub fn prune_mark(&self, workflow: &str) -> io::Result<Option<Vec<(String, u64)>>> {
        let rel = format!("{INFLIGHT_DIR}/{workflow}.pruned");
        let Some(bytes) = self.read_optional(&rel)? else {
            return Ok(None);
        };
        let damaged = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the state directory's {rel} is damaged: it reads as no record of prunes, so which of the workflow's snapshots its prunes removed cannot be told; restore it from a backup of the state directory, or remove it (the writes whose snapshots are gone are then said to be missing)"
                ),
            )
        };
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && let Some(roots) = doc.get("pruned").and_then(serde_json::Value::as_array)
        {
            // One entry that does not read damages the whole: taken for no prune, the
            // snapshots it names would be called missing.
            return roots
                .iter()
                .map(|r| {
                    Some((
                        r.get("root")?.as_str()?.to_owned(),
                        r.get("up_to_seq")?.as_u64()?,
                    ))
                })
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(damaged);
        }
        // That format was a block padded with spaces: only its end is padding, so a root
        // whose name ends in a space is read whole unless it is the last.
        let text = String::from_utf8_lossy(&bytes);
        let mut lines = text.trim_end().split('\n').filter(|l| !l.is_empty());
        let Some(seq) = lines.next().and_then(|l| l.trim().parse().ok()) else {
            return Err(damaged());
        };
        Ok(Some(lines.map(|r| (r.to_owned(), seq)).collect()))
    }

    /// `name`'s run record file, held open to read it; `None` when it does not exist.
    pub fn inflight_open(&self, name: &str) -> io::Result<Option<BlockFile>> {
        self.open_block(&format!("{INFLIGHT_DIR}/{name}.json"))
    }

    /// Reads `name`'s run record; `None` when there is none.
    pub fn inflight_read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        self.read_optional(&format!("{INFLIGHT_DIR}/{name}.json"))
    }

    /// Removes `rel`; one that is already gone is fine.
    fn remove(&self, rel: &str) -> io::Result<()> {
        let (dir, name) = self.locate(rel)?;
        match dir.remove_file(name) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes the temporary files that making the state directory's own files (the seal
    /// key, the trail's head: `.{name}.ailab-tmp-…`) left at its top, older than
    /// `older_than`: made and linked into place within milliseconds, one that old was
    /// left by a process that died in between. Returns how many.
    pub fn remove_stale_temp_files(&self, older_than: std::time::Duration) -> io::Result<usize> {
        let mut removed = 0;
        for e in self.dirs.top.entries()? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with('.') && name.contains(super::path::TEMP_MARKER)) {
                continue;
            }
            // Another start may be linking its file into place and removing the name.
            let meta = match e.metadata() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                m => m?,
            };
            let age = meta
                .modified()
                .ok()
                .and_then(|t| t.into_std().elapsed().ok());
            if meta.is_file() && age.is_some_and(|a| a > older_than) {
                self.remove(&name)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes `name`'s run record.
    pub fn inflight_remove(&self, name: &str) -> io::Result<()> {
        self.remove(&format!("{INFLIGHT_DIR}/{name}.json"))
    }

    /// The workflows a prune has marked pruned (`inflight/{id}.pruned`) that still have a
    /// run record or a commit log beside the mark, sorted: one reading of `inflight/`.
    pub fn pruned_ids_with_records(&self) -> io::Result<Vec<String>> {
        let mut marked = std::collections::HashSet::new();
        let mut recorded = std::collections::HashSet::new();
        for e in self.dirs.inflight.entries()? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".pruned") {
                marked.insert(id.to_owned());
            } else if let Some(id) = name
                .strip_suffix(".json")
                .or_else(|| name.strip_suffix(".log"))
            {
                recorded.insert(id.to_owned());
            }
        }
        let mut out: Vec<String> = marked.intersection(&recorded).cloned().collect();
        out.sort();
        Ok(out)
    }

    /// The ids of the files in `inflight/` named `{id}{suffix}`, sorted.
    fn inflight_ids(&self, suffix: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in self.dirs.inflight.entries()? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(suffix) {
                out.push(id.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The temporary files of run records and prune marks being created
    /// (`.{id}.json.ailab-tmp-…`, `.{id}.pruned.ailab-tmp-…`, see `create_whole`):
    /// `(file name, workflow id)`. One outlives its writer only when the
    /// process died between making it and removing it.
    pub fn inflight_record_temp_files(&self) -> io::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for e in self.dirs.inflight.entries()? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name
                .strip_prefix('.')
                // The last marker: a workflow id may hold the marker's text itself.
                .and_then(|n| n.rsplit_once(super::path::TEMP_MARKER))
                // A run record's, or a prune mark's (also written under the lock).
                .and_then(|(record, _)| {
                    record
                        .strip_suffix(".json")
                        .or_else(|| record.strip_suffix(".pruned"))
                });
            if let Some(id) = id
                && crate::confine::root::entry_type(&e)?.is_file()
            {
                out.push((name.clone(), id.to_owned()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes a file of `inflight/` by its name.
    pub fn inflight_remove_file(&self, name: &str) -> io::Result<()> {
        self.remove(&format!("{INFLIGHT_DIR}/{name}"))
    }

    /// Every run record: `(id, contents)`.
    pub fn inflight_list(&self) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for id in self.inflight_ids(".json")? {
            match self.inflight_read(&id) {
                Ok(Some(bytes)) => out.push((id, bytes)),
                Ok(None) => {}
                // One record that cannot be read (of the wrong kind, say) keeps only its
                // own run from recovery, not every other.
                Err(e) => {
                    tracing::warn!(error = %e, record = %id, "cannot read an in-flight record")
                }
            }
        }
        Ok(out)
    }

    fn commit_log_rel(workflow_id: &str) -> String {
        format!("{INFLIGHT_DIR}/{workflow_id}.log")
    }

    /// A workflow's commit log file (`inflight/{workflow}.log`, see
    /// `commit_log`); `None` when it does not exist.
    pub fn commit_log_file(&self, workflow_id: &str) -> io::Result<Option<CommitLogFile>> {
        match self.open_file(
            &Self::commit_log_rel(workflow_id),
            OpenOptions::new().read(true).write(true),
        ) {
            Ok(file) => Ok(Some(CommitLogFile { file })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a workflow's commit log file, initialised but not synced: the caller
    /// makes a sync point before the first append.
    pub fn commit_log_create(&self, workflow_id: &str) -> io::Result<CommitLogFile> {
        let file = self.open_file(
            &Self::commit_log_rel(workflow_id),
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600),
        )?;
        let log = CommitLogFile { file };
        crate::commit_log::initialize(&log)?;
        Ok(log)
    }

    /// Removes a workflow's commit log file (its workflow was pruned).
    pub fn commit_log_remove(&self, workflow_id: &str) -> io::Result<()> {
        self.remove(&Self::commit_log_rel(workflow_id))
    }

    /// The workflows that have a commit log file.
    pub fn commit_logs(&self) -> io::Result<Vec<String>> {
        self.inflight_ids(".log")
    }

    /// Reads a small file (a regular file, not followed if a symlink; it may have a
    /// second link for a moment while [`StateDir::create_block`] puts it in place, or
    /// for good when a crash came between its two steps); `None` when it does not
    /// exist.
    pub fn read_optional(&self, rel: &str) -> io::Result<Option<Vec<u8>>> {
        let (dir, name) = self.locate(rel)?;
        read_if_present(dir, name, rel, MAX_STATE_FILE)
    }

    /// The 32-byte secret kept in `name`, made on first use from the kernel's random
    /// source. It appears whole or not at all, durable before use, and if another process
    /// made it first, theirs is used. `made_for`, when given, names what was made with
    /// the secret already (say, an audit trail's entries): a missing secret was then
    /// removed, and is not made anew, since what it vouched for would silently stop
    /// being trusted.
    pub fn secret(&self, name: &str, made_for: Option<&str>) -> io::Result<[u8; 32]> {
        if let Some(key) = self.read_secret(name)? {
            return Ok(key);
        }
        if let Some(what) = made_for {
            let path = self.path.join(name);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is missing beside {what}: it was removed or lost (it is made before anything it vouches for), and a new one would leave every snapshot sealed so far untrusted, so nothing written so far could be rolled back; put it back from a backup of the state directory, or, to give up those rollbacks, make a new one yourself: (umask 077; head -c 32 /dev/urandom > {})",
                    path.display(),
                    path.display()
                ),
            ));
        }
        let mut key = [0u8; 32];
        let mut filled = 0;
        while filled < key.len() {
            filled +=
                rustix::rand::getrandom(&mut key[filled..], rustix::rand::GetRandomFlags::empty())?;
        }
        if self.create_whole(name, &key, true)? {
            return Ok(key);
        }
        self.read_secret(name)?
            .ok_or_else(|| io::Error::other(format!("{} vanished", self.path.join(name).display())))
    }

    fn read_secret(&self, name: &str) -> io::Result<Option<[u8; 32]>> {
        let damaged = |held: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds {held}, not the 32 of a key; it was damaged (put it back from a backup; a new one, made by hand, leaves every existing snapshot untrusted)",
                    self.path.join(name).display(),
                ),
            )
        };
        let bytes = match self.read_optional(name) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            // Damaged like one of any other wrong length, not a failing disk: what needs
            // no key (verifying the trail) still goes on.
            Err(e)
                if e.get_ref()
                    .and_then(|i| i.downcast_ref::<crate::reason::Refusal>())
                    .is_some_and(|r| r.reason_code == crate::reason::ReasonCode::SizeExceeded) =>
            {
                // One others may have read says so first, as for a key of any size.
                self.check_secret_private(name)?;
                return Err(damaged(&format!("more than {MAX_STATE_FILE} bytes")));
            }
            Err(e) => return Err(e),
        };
        self.check_secret_private(name)?;
        bytes
            .as_slice()
            .try_into()
            .map(Some)
            .map_err(|_| damaged(&format!("{} bytes", bytes.len())))
    }

    /// Refuses the secret `name` when another user owns it or its mode lets others read
    /// or change it: whoever reads it may seal snapshot records the runtime trusts (a
    /// key put back by hand without `umask 077`, say, under a state directory others may
    /// enter).
    fn check_secret_private(&self, name: &str) -> io::Result<()> {
        use cap_std::fs::MetadataExt as _;
        let (dir, file_name) = self.locate(name)?;
        let m = dir.symlink_metadata(file_name)?;
        // Quoted for a shell: the words give commands to paste.
        let shown = format!(
            "'{}'",
            self.path
                .join(name)
                .display()
                .to_string()
                .replace('\'', "'\\''")
        );
        let euid = super::root::euid();
        let fix = if m.uid() != euid {
            format!(
                "is owned by uid {}, not by this process's uid {euid}; whoever owns it can read it and seal snapshot records the runtime trusts: give it to this user (as root: chown {euid} {shown}; chmod 600 {shown})",
                m.uid()
            )
        } else if m.mode() & 0o066 != 0 {
            format!(
                "has mode {:04o}, which lets other users read or change it; whoever reads it can seal snapshot records the runtime trusts: make it readable and writable by this user alone (chmod 600 {shown})",
                m.mode() & 0o7777
            )
        } else {
            return Ok(());
        };
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            NotPrivate(format!(
                "the seal key {shown} {fix}; if others may have read it, give up the rollbacks sealed with it and make a new one in its place: rm {shown}; (umask 077; head -c 32 /dev/urandom > {shown})"
            )),
        ))
    }

    /// Replaces a small file atomically (temporary file, rename; fsync'd when `durable`).
    pub fn write_atomic(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let (dir, file_name) = self.locate(name)?;
        let tmp = format!(".{file_name}.tmp");
        let mut f = self.open_file(
            &beside(name, &tmp),
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600),
        )?;
        f.write_all(bytes)?;
        if durable {
            f.sync_data()?;
        }
        drop(f);
        dir.rename(&tmp, dir, file_name)?;
        if durable {
            super::root::sync_dir(dir)?;
        }
        Ok(())
    }
}

/// Where the lock `name` lies in the state directory.
fn lock_path(name: &str) -> String {
    format!("locks/{name}.lock")
}

/// Whether `name` in `dir` holds the file of `identity` (device, inode) now, looked at
/// without following a link: `false` when nothing does.
fn names_file(dir: &Dir, name: &str, identity: (u64, u64)) -> io::Result<bool> {
    use cap_std::fs::MetadataExt as _;
    match dir.symlink_metadata(name) {
        Ok(m) => Ok((m.dev(), m.ino()) == identity),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The name of workflow `id`'s lock.
fn workflow_lock(id: &str) -> String {
    format!("wf-{id}")
}

/// The lock of `file`, if no other holder has it now.
fn try_holding(file: File) -> io::Result<Option<FileLock>> {
    match file.try_lock() {
        Ok(()) => Ok(Some(FileLock { file })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// The state file `name` in the folder of `rel`.
fn beside(rel: &str, name: &str) -> String {
    match rel.rsplit_once('/') {
        Some((folder, _)) => format!("{folder}/{name}"),
        None => name.to_owned(),
    }
}

/// The largest small state file read whole (run records, marks, the key, the head).
const MAX_STATE_FILE: u64 = 1 << 20;

/// Why a state directory is refused as one other users could change: a setting to
/// correct, not a failure of the disk (see [`crate::Error::is_unsafe_state_dir`]).
#[derive(Debug)]
pub struct NotPrivate(String);

impl std::fmt::Display for NotPrivate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotPrivate {}

impl NotPrivate {
    /// Whether `e` is such a refusal.
    pub fn is_cause_of(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|e| e.is::<Self>())
    }

    /// `e` with `more` said after it, still such a refusal when it was one (its
    /// reason code and exit code go by that).
    pub(crate) fn said_with(e: io::Error, more: &str) -> io::Error {
        let words = format!("{e}; {more}");
        if Self::is_cause_of(&e) {
            io::Error::new(e.kind(), Self(words))
        } else {
            io::Error::new(e.kind(), words)
        }
    }
}

/// A state file this process may not open (another user took it, or its mode shuts
/// this process out), named by its place in the state directory: said in these words
/// wherever it is met (see [`crate::error::io_words`]), never only "permission denied".
#[derive(Debug)]
pub struct TakenFile(String);

impl std::fmt::Display for TakenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TakenFile {}

/// A lock of the state directory (or a log's in-process lock) that another holder kept
/// past the wait: busy, to try again, told apart from a `TimedOut` the system itself
/// gives (a network filesystem's `ETIMEDOUT`), which is a failure of the disk.
#[derive(Debug)]
pub struct LockBusy(String);

impl std::fmt::Display for LockBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LockBusy {}

impl LockBusy {
    /// The error (of kind `TimedOut`) for a wait that ran out, in `words`.
    pub fn error(words: String) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, Self(words))
    }

    /// Whether `e` is such a wait.
    pub fn is_cause_of(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|e| e.is::<Self>())
    }
}

/// Refuses a state directory (or one of its folders) that another user could change:
/// owned by someone else, writable by others (sticky bit or not: they could plant a
/// file under a name the runtime uses), or group-writable by a group not this
/// process's own.
fn check_private(m: &cap_std::fs::Metadata, shown: &str) -> io::Result<()> {
    use super::root::NotOurs as Why;
    let why = match super::root::not_ours(m) {
        None => return Ok(()),
        Some(Why::Owner(uid)) => format!(
            "state directory {shown} is owned by uid {uid}, not by this process's uid {}; someone else may control the audit trail and the seal key there: give a state directory of this user's own, or run as uid {uid}",
            super::root::euid()
        ),
        Some(Why::Writable { gid, mode }) => format!(
            "state directory {shown} (group {gid}, mode {mode:04o}) is writable by other users; it must be writable only by its owner (for example mode 0700), or others could plant files in it"
        ),
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        NotPrivate(why),
    ))
}

/// [`check_private`] for a folder of the state directory open as `dir`, its access
/// control list judged too: one giving another user or group write makes it as open to
/// them as a mode would.
fn check_private_dir(dir: &Dir, m: &cap_std::fs::Metadata, shown: &str) -> io::Result<()> {
    check_private(m, shown)?;
    if let Some(how) = super::root::others_may_write(m, dir) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            NotPrivate(format!(
                "state directory {shown} is writable by other users{how}; it must be writable only by its owner (for example mode 0700, and no access control list giving others write), or others could plant files in it"
            )),
        ));
    }
    Ok(())
}

/// A file of a state directory this process does not open
/// ([`StateDir::open_without_opening`]), read a part at a time.
#[derive(Debug)]
pub struct StateFile(std::fs::File);

impl StateFile {
    /// Current length in bytes.
    pub fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` with the bytes at `from`.
    pub fn read_exact_at(&self, buf: &mut [u8], from: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, from)
    }
}

/// A commit log file: positioned reads and writes, and syncs (the format is
/// `commit_log`'s).
#[derive(Debug)]
pub struct CommitLogFile {
    file: File,
}

impl CommitLogFile {
    /// Reads exactly `buf.len()` bytes at `offset`.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    /// Writes all of `bytes` at `offset`.
    pub fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// The file's size.
    pub fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// `fdatasync`.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// The size of a block file (a run record, the audit head), written whole: one page, so
/// that a run record naming long roots fits. What such a file holds is nearly always
/// shorter than a sector, and the padding after it is the same in every version, so a
/// rewrite changes one sector only.
pub const BLOCK: usize = 4096;

/// The length of `block` without the padding [`padded_block`] adds (spaces, then a
/// newline), found a word at a time: a JSON parser skips it one byte at a time.
fn unpadded_len(block: &[u8]) -> usize {
    let mut n = block.len();
    if n > 0 && block[n - 1] == b'\n' {
        n -= 1;
    }
    while n >= 8 && block[n - 8..n] == [b' '; 8] {
        n -= 8;
    }
    while n > 0 && block[n - 1] == b' ' {
        n -= 1;
    }
    n
}

fn padded_block(bytes: &[u8]) -> io::Result<Vec<u8>> {
    if bytes.len() >= BLOCK {
        return Err(io::Error::other("record longer than one block"));
    }
    let mut block = bytes.to_vec();
    block.resize(BLOCK - 1, b' ');
    block.push(b'\n');
    Ok(block)
}

/// A one-block record file held open (see [`StateDir::open_block`]).
#[derive(Debug)]
pub struct BlockFile {
    file: File,
}

impl BlockFile {
    /// The file's length in bytes: one block, as the runtime writes it.
    pub fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The block's bytes (at most one block).
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; BLOCK];
        let n = self.file.read_at(&mut buf, 0)?;
        buf.truncate(unpadded_len(&buf[..n]));
        Ok(buf)
    }

    /// Rewrites the block in place (not synced).
    pub fn write(&self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(&padded_block(bytes)?, 0)
    }

    /// `fdatasync`.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// A fixed set of named locks whose files stay open between uses: taking one costs a
/// mutex and a `flock`, not an open and a close. The mutex orders this process's
/// threads (a `flock` belongs to the open file description, which they share); the
/// `flock` orders processes, and other `LockSet`s or [`StateDir::lock`] callers.
#[derive(Debug)]
pub struct LockSet {
    state: StateDir,
    names: Vec<String>,
    slots: Vec<std::sync::Mutex<Option<File>>>,
    wait: std::time::Duration,
    keep_open: bool,
}

/// The least soft limit on open files under which a [`LockSet`] keeps its lock files
/// open between uses.
const KEEP_OPEN_FROM: u64 = 1024;

impl LockSet {
    /// `names`, opened on first use; a lock another process holds is waited for at most
    /// `wait`. The files stay open between uses where descriptors are plentiful (a soft
    /// limit of at least 1024 open files); under a tight one (`ulimit -n 64`) a set of
    /// 64 kept open would crowd out every other file and stop writes for good, so each is
    /// closed when its lock is released.
    pub fn new(state: &StateDir, names: Vec<String>, wait: std::time::Duration) -> Self {
        let slots = names.iter().map(|_| std::sync::Mutex::new(None)).collect();
        let keep_open = super::kernel::open_file_limit() >= KEEP_OPEN_FROM;
        Self {
            state: state.clone(),
            names,
            slots,
            wait,
            keep_open,
        }
    }

    /// Takes lock `i` (of the names given), held until the guard drops. Another process
    /// or thread holding it longer than the set's wait (stopped, hung, or a very long
    /// write) is an error of kind `TimedOut`, not a wait without end.
    pub fn lock(&self, i: usize) -> io::Result<HeldLock<'_>> {
        self.lock_by(i, self.deadline())
    }

    /// When a wait that starts now ends.
    pub fn deadline(&self) -> std::time::Instant {
        std::time::Instant::now() + self.wait
    }

    /// [`LockSet::lock`], waiting until `deadline` at the latest, for this process's
    /// other threads and for other processes together: a holder of several locks taken
    /// one after the other waits no longer in all than for one.
    pub fn lock_by(&self, i: usize, deadline: std::time::Instant) -> io::Result<HeldLock<'_>> {
        let (Some(slot), Some(name)) = (self.slots.get(i), self.names.get(i)) else {
            return Err(io::Error::other("no such lock"));
        };
        let mut slot = poll_until(deadline, self.wait, || match slot.try_lock() {
            Ok(g) => Ok(Some(g)),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(Some(p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => Ok(None),
        })?;
        let file = match slot.take() {
            Some(f) => f,
            None => self.state.lock_file(name)?,
        };
        let taken = flock_until(&file, false, deadline, self.wait);
        // The file goes back to its slot either way: the next taker reuses it (or, not
        // kept open, the release closes it).
        *slot = Some(file);
        taken?;
        Ok(HeldLock {
            slot,
            keep_open: self.keep_open,
        })
    }
}

/// Takes `file`'s lock (shared or exclusive), waiting at most `wait` while another
/// process holds it: a stopped or hung holder is an error of kind `TimedOut`, not a wait
/// without end. Polls, since `flock` has no timeout of its own; uncontended, it is one
/// call.
pub fn lock_within(file: &File, shared: bool, wait: std::time::Duration) -> io::Result<()> {
    flock_until(file, shared, std::time::Instant::now() + wait, wait)
}

fn flock_until(
    file: &File,
    shared: bool,
    deadline: std::time::Instant,
    wait: std::time::Duration,
) -> io::Result<()> {
    poll_until(deadline, wait, || {
        let tried = if shared {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        match tried {
            Ok(()) => Ok(Some(())),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    })
}

/// Calls `attempt` until it gives something or `deadline` passes (`TimedOut`, naming
/// `wait`), pausing a little longer each time but never more than 2 ms: short pauses keep
/// a waiter from losing every race to one that happens to try just after a release.
fn poll_until<T>(
    deadline: std::time::Instant,
    wait: std::time::Duration,
    mut attempt: impl FnMut() -> io::Result<Option<T>>,
) -> io::Result<T> {
    let mut pause = std::time::Duration::from_micros(100);
    loop {
        if let Some(got) = attempt()? {
            return Ok(got);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(LockBusy::error(format!("waited {} s", wait.as_secs())));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(2));
    }
}

/// A lock of a [`LockSet`], released on drop.
#[derive(Debug)]
pub struct HeldLock<'a> {
    slot: std::sync::MutexGuard<'a, Option<File>>,
    keep_open: bool,
}

impl Drop for HeldLock<'_> {
    fn drop(&mut self) {
        if self.keep_open {
            if let Some(f) = self.slot.as_ref() {
                let _ = f.unlock();
            }
        } else {
            // Closing the one descriptor of its open file releases the lock.
            *self.slot = None;
        }
    }
}

/// A named lock (a file under `locks/`), released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// How many times a workflow lock's file may be found removed or replaced after locking
/// it before the lock is refused (see `StateDir::workflow_lock_with`).
const LOCK_FILE_TURNS: usize = 64;

/// A workflow's lock ([`StateDir::lock_workflow`]), released on drop. A workflow that keeps
/// no record in `inflight/` then (a run record, a prune's mark, a commit log) has its
/// lock's file removed first: plans only simulated or refused, and rollbacks of ids that
/// never ran, would otherwise leave a file each, and any client may name any id.
pub struct WorkflowLock {
    dirs: std::sync::Arc<Handles>,
    id: String,
    /// Device and inode of the file locked.
    identity: (u64, u64),
    /// Its holder knows the workflow keeps a record: its file stays, unlooked at.
    kept: bool,
    _lock: FileLock,
}

impl std::fmt::Debug for WorkflowLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowLock")
            .field("id", &self.id)
            .finish()
    }
}

impl WorkflowLock {
    /// Keeps the lock's file when let go, without looking for the workflow's records
    /// (its holder has one open).
    pub fn keep_file(&mut self) {
        self.kept = true;
    }

    /// Whether the workflow has a record a later holder must find; an error to look
    /// counts as one.
    fn keeps_a_record(&self) -> bool {
        ["json", "pruned", "log"].iter().any(|ext| {
            !matches!(
                self.dirs.inflight.symlink_metadata(format!("{}.{ext}", self.id)),
                Err(e) if e.kind() == io::ErrorKind::NotFound
            )
        })
    }
}

impl Drop for WorkflowLock {
    fn drop(&mut self) {
        // Removed while still locked, and only while the name still holds the file
        // locked: a waiter on it finds the name gone once it gets the lock, and a file
        // someone else removed meanwhile, whose name a new holder's file took, is not
        // taken from under that holder.
        if self.kept || self.keeps_a_record() {
            return;
        }
        let name = format!("{}.lock", workflow_lock(&self.id));
        if names_file(&self.dirs.locks, &name, self.identity).unwrap_or(false) {
            let _ = self.dirs.locks.remove_file(&name);
        }
    }
}

/// A lock held on a [`LogFile`], released on drop. It borrows the log's own descriptor:
/// a lock belongs to the open file description, which threads share, so the owner
/// serialises its threads with a mutex of its own.
#[derive(Debug)]
pub struct LogLock<'a> {
    file: &'a File,
}

impl Drop for LogLock<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// An append-only JSONL file.
#[derive(Debug)]
pub struct LogFile {
    file: File,
    /// Device and inode of `file`, which an open file keeps for good.
    identity: (u64, u64),
    wait: std::time::Duration,
    /// When a wait for the lock last ran out: this process's threads queue for the file
    /// behind their owner's mutex, and each would otherwise wait its whole time in turn
    /// while one stopped process holds the lock.
    stalled: std::sync::Mutex<Option<std::time::Instant>>,
}

impl LogFile {
    /// Takes the exclusive lock (other processes; threads are serialised by the owner's
    /// mutex, since a lock belongs to the open file description).
    pub fn lock_exclusive(&self) -> io::Result<LogLock<'_>> {
        self.lock(false)
    }

    /// Takes a shared lock for reading.
    pub fn lock_shared(&self) -> io::Result<LogLock<'_>> {
        self.lock(true)
    }

    /// A shared lock for reading when no other process holds the file; `None` when one
    /// does (never waited for).
    pub fn try_lock_shared(&self) -> io::Result<Option<LogLock<'_>>> {
        Self::tried(&self.file, self.file.try_lock_shared())
    }

    /// The exclusive lock when no other process holds the file; `None` when one does
    /// (never waited for).
    pub fn try_lock_exclusive(&self) -> io::Result<Option<LogLock<'_>>> {
        Self::tried(&self.file, self.file.try_lock())
    }

    fn tried(
        file: &File,
        tried: Result<(), std::fs::TryLockError>,
    ) -> io::Result<Option<LogLock<'_>>> {
        match tried {
            Ok(()) => Ok(Some(LogLock { file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// Waits for the lock as [`lock_within`] does, but for at most a second while the
    /// whole wait of another of this process's threads ran out less than a wait ago: the
    /// holder is most likely stuck, and the threads queued behind that one give up about
    /// together rather than each after a whole wait. A second is still far more than an
    /// append holds the lock, and only a whole wait that runs out marks the log stuck.
    fn lock(&self, shared: bool) -> io::Result<LogLock<'_>> {
        let stalled = || {
            self.stalled
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let stuck = stalled().is_some_and(|at| at.elapsed() < self.wait);
        let wait = if stuck {
            self.wait.min(std::time::Duration::from_secs(1))
        } else {
            self.wait
        };
        match flock_until(&self.file, shared, std::time::Instant::now() + wait, wait) {
            Ok(()) => {
                if stuck {
                    *stalled() = None;
                }
                Ok(LogLock { file: &self.file })
            }
            Err(e) if LockBusy::is_cause_of(&e) && wait < self.wait => {
                Err(LockBusy::error(format!(
                    "waited {} s only, since a whole wait of {} s for it ran out less than {} s ago",
                    wait.as_secs(),
                    self.wait.as_secs(),
                    self.wait.as_secs()
                )))
            }
            Err(e) => {
                if LockBusy::is_cause_of(&e) {
                    *stalled() = Some(std::time::Instant::now());
                }
                Err(e)
            }
        }
    }

    /// Current length in bytes.
    pub fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// The bytes of disk the file takes: less than its length where it has holes,
    /// which read as zeros and cost nothing.
    pub fn allocated(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt as _;
        Ok(self.file.metadata()?.blocks().saturating_mul(512))
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Reads up to `n` bytes at `from`.
    pub fn read_range(&self, from: u64, n: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n as usize];
        self.read_exact_at(&mut buf, from)?;
        Ok(buf)
    }

    /// Fills `buf` with the bytes at `from`.
    pub fn read_exact_at(&self, buf: &mut [u8], from: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, from)
    }

    /// `fdatasync`.
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Appends whole lines in one write (flushed; `sync_data` when `durable`). Call with
    /// the exclusive lock held.
    pub fn append(&self, bytes: &[u8], durable: bool) -> io::Result<()> {
        (&self.file).write_all(bytes)?;
        if durable {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Cuts the file to `len` bytes (dropping a torn last line). Call with the lock held.
    pub fn truncate(&self, len: u64, durable: bool) -> io::Result<()> {
        self.file.set_len(len)?;
        if durable {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

/// How the state directory is named in messages.
const STATE_DIR: &str = "state directory";

/// A refusal of the walk to the state directory. One refused for what lies above it is
/// [`NotPrivate`]: others could swap it for theirs, as unsafe as one they could write in.
/// One that is no directory (a file in its place or on its way) is
/// [`io::ErrorKind::NotADirectory`]: a path to correct, as a root's is
/// ([`crate::Error::reason_code`]), not a failing disk.
fn walk_refusal(why: String) -> io::Error {
    if why.contains(super::root::REFUSED_ABOVE) {
        io::Error::new(io::ErrorKind::PermissionDenied, NotPrivate(why))
    } else if why.ends_with(" is not a directory") || why.ends_with(" above it is not a directory")
    {
        io::Error::new(io::ErrorKind::NotADirectory, why)
    } else {
        io::Error::other(why)
    }
}

/// Whether something (a symlink included, not followed) is at `path`.
#[allow(clippy::disallowed_methods)]
pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// This boot of the machine, as the kernel names it (Linux); `None` elsewhere. A run
/// that finished in this boot lost nothing to a power cut: what it wrote is in the page
/// cache or on disk.
#[allow(clippy::disallowed_methods)] // a kernel file, read once
pub fn boot_id() -> Option<&'static str> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// The path with symlinks resolved, when it exists.
#[allow(clippy::disallowed_methods)]
pub fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// The bytes of the state file `name` of `dir` (`rel` in the state directory), `None`
/// when it does not exist; never through a symlink, and a second link is accepted (see
/// [`StateDir::read_optional`]).
fn read_if_present(dir: &Dir, name: &str, rel: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let read = super::root::read_file_in(dir, name, limit, false).map(|(bytes, _)| bytes);
    if_present(read, dir, name, rel)
}

/// What reaching the state file `rel` (`name` in `dir`) gave, `None` when it is missing;
/// something else in its place, or a file this process is refused, is said as such.
fn if_present<T>(got: io::Result<T>, dir: &Dir, name: &str, rel: &str) -> io::Result<Option<T>> {
    match got {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e)
            if crate::error::is_link_loop(&e)
                || e.get_ref()
                    .and_then(|r| r.downcast_ref::<crate::reason::Refusal>())
                    .is_some_and(|r| {
                        r.reason_code == crate::reason::ReasonCode::NotRegularFile
                    }) =>
        {
            Err(not_regular(dir, name, rel))
        }
        Err(e) => Err(shut_out(e, rel)),
    }
}

/// `e`, naming the state file `rel` when the system refused this process access to it
/// ([`TakenFile`]): what failed is said by the caller ("open the audit log"), the file
/// by this, by its place in the state directory (a refusal may be sent to a client,
/// which is not told paths outside the sandbox).
fn shut_out(e: io::Error, rel: &str) -> io::Error {
    if rustix::io::Errno::from_io_error(&e) != Some(rustix::io::Errno::ACCESS) {
        return e;
    }
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        TakenFile(format!(
            "the state directory's {rel}: permission denied: another user owns it or its mode shuts this process out; the state directory's files must be the runtime user's own"
        )),
    )
}

/// Refuses `name` of `dir` (`rel` in the state directory) as a state file that is not a
/// regular file, saying what stands in its place: a FIFO read as an empty log would lose
/// the record without a word, one opened for writing alone would wait for a reader for
/// ever, and a link would send the runtime's records elsewhere. Named within the state
/// directory: the words may reach a client, to whom no path outside the roots is shown.
fn not_regular(dir: &Dir, name: &str, rel: &str) -> io::Error {
    let what = kind_at(dir, name);
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "the state directory's {rel} is {what}, not a regular file; the state directory's files are never opened through anything else: move it away (or put the file it stands for back in its place)"
        ),
    )
}

/// What stands at `name` of `dir`, in words, looked at without following a link.
fn kind_at(dir: &Dir, name: &str) -> &'static str {
    use cap_std::fs::FileTypeExt as _;
    match dir.symlink_metadata(name).map(|m| m.file_type()) {
        Ok(t) if t.is_symlink() => "a symbolic link",
        Ok(t) if t.is_dir() => "a folder",
        Ok(t) if t.is_file() => "a file",
        Ok(t) if t.is_fifo() => "a FIFO",
        Ok(t) if t.is_socket() => "a socket",
        Ok(t) if t.is_block_device() || t.is_char_device() => "a device",
        _ => "something else",
    }
}

/// The `(st_dev, st_ino)` of `path` and of each of its ancestors that exists, links
/// followed: what a path leads through, whatever mount shows it under another name.
#[allow(clippy::disallowed_methods)] // looked at, never opened or written
pub(crate) fn ids_along(path: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    path.ancestors()
        .filter_map(|a| std::fs::metadata(a).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// Where `path` would be once made: its nearest existing ancestor with symbolic links
/// resolved, then the components that do not exist yet. A symbolic link that leads
/// nowhere yet is followed to where it leads (making `path` makes its target). `None`
/// when no ancestor resolves.
pub fn canonical_to_be(path: &Path) -> Option<PathBuf> {
    to_be(path, 0)
}

fn to_be(path: &Path, hops: usize) -> Option<PathBuf> {
    const MAX_HOPS: usize = 40;
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Some(c) = canonical(at) {
            return Some(rest.iter().rev().fold(c, |p: PathBuf, n| p.join(n)));
        }
        if let Ok(target) = std::fs::read_link(at) {
            if hops >= MAX_HOPS {
                return None;
            }
            let target = at.parent()?.join(target);
            let made = to_be(&target, hops + 1)?;
            return Some(rest.iter().rev().fold(made, |p: PathBuf, n| p.join(n)));
        }
        rest.push(at.file_name()?.to_owned());
        at = at.parent()?;
    }
}

/// Makes whole filesystems durable at once with `syncfs(2)`: one call per distinct
/// filesystem among the given directories, in place of a `fsync` per file and directory
/// touched since the last call. Concurrent callers share syncs (a group commit).
#[derive(Debug)]
pub struct FsSync {
    /// One open handle per filesystem, by device.
    handles: std::sync::Mutex<Vec<(u64, File)>>,
    group: GroupCommit,
}

/// `statfs`'s type of a FUSE filesystem, whose kernel side passes no `syncfs` on to the
/// program that stores its files. virtiofs has it too: it passes `syncfs` on since Linux
/// 5.15, but a daemon that does not implement it answers success unsynced, which cannot
/// be told from here.
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// Refuses a filesystem a `syncfs` would not make durable (FUSE), naming `what`.
fn syncfs_reaches(fd: impl std::os::fd::AsFd, what: &dyn std::fmt::Display) -> io::Result<()> {
    let kind = rustix::fs::fstatfs(fd)?.f_type;
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)] // `f_type`'s width varies
    if u64::try_from(kind).is_ok_and(|k| k == FUSE_SUPER_MAGIC) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{what} is on a FUSE filesystem (virtiofs is one), which does not surely pass a whole-filesystem sync (syncfs) on to where it stores its files, so batched durability could not make writes there durable; use durability = \"strict\""
            ),
        ));
    }
    Ok(())
}

impl FsSync {
    /// Opens one handle per distinct filesystem (by device) among `dirs`; refuses one on
    /// a filesystem a `syncfs` does not reach (FUSE).
    pub fn open(dirs: &[&Path]) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let mut handles: Vec<(u64, File)> = Vec::new();
        for d in dirs {
            let f = File::open(d)?;
            let dev = f.metadata()?.dev();
            if !handles.iter().any(|(d, _)| *d == dev) {
                syncfs_reaches(&f, &d.display())?;
                handles.push((dev, f));
            }
        }
        Ok(Self {
            handles: std::sync::Mutex::new(handles),
            group: GroupCommit::default(),
        })
    }

    /// Makes later syncs cover the filesystem that holds `dir` too: a directory inside a
    /// root may be another filesystem mounted there.
    pub fn cover(&self, dir: &cap_std::fs::Dir) -> io::Result<()> {
        use cap_fs_ext::MetadataExt;
        let dev = dir.dir_metadata()?.dev();
        let mut handles = self
            .handles
            .lock()
            .map_err(|_| io::Error::other("sync handles poisoned"))?;
        if !handles.iter().any(|(d, _)| *d == dev) {
            // The runtime's directory handles are `O_PATH`, which `syncfs` refuses: open
            // the directory itself for reading.
            use rustix::fs::{Mode, OFlags};
            let fd = rustix::fs::openat(
                dir,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )?;
            syncfs_reaches(&fd, &"the target's folder")?;
            handles.push((dev, File::from(fd)));
        }
        Ok(())
    }

    /// Returns once everything written before the call is on stable storage.
    pub fn sync(&self) -> io::Result<()> {
        self.group.wait(self.group.ticket(), || self.sync_all())
    }

    /// How many syncs were actually made (each covering one or more requests).
    pub fn syncs_made(&self) -> u64 {
        self.group.syncs_made()
    }

    /// The error every later sync returns, once one has failed.
    pub fn failed(&self) -> Option<io::Error> {
        self.group.failed()
    }

    fn sync_all(&self) -> io::Result<()> {
        let handles = self
            .handles
            .lock()
            .map_err(|_| io::Error::other("sync handles poisoned"))?;
        for (_, h) in handles.iter() {
            rustix::fs::syncfs(h)?;
        }
        Ok(())
    }

    /// How many filesystems one [`FsSync::sync`] flushes.
    pub fn filesystems(&self) -> usize {
        self.handles.lock().map_or(0, |h| h.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block read back is what was written, without the padding (and nothing more is
    /// taken off: a record cut short or spoilt stays so, for its parser to refuse).
    #[test]
    fn a_block_read_back_loses_only_its_padding() {
        for record in [
            &b"{}"[..],
            b"{\"seq\":1}",
            b"{\"a\": \"x       \"}",
            b"{\"cut",
            b"",
        ] {
            let Ok(block) = padded_block(record) else {
                panic!("pad")
            };
            assert_eq!(block.len(), BLOCK);
            assert_eq!(&block[..unpadded_len(&block)], record);
        }
        // Zeros a torn write left are no padding.
        let mut torn = b"{\"seq\":1}".to_vec();
        torn.resize(BLOCK, 0);
        assert_eq!(unpadded_len(&torn), BLOCK);
    }
}
