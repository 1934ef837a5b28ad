//! The state directory: the runtime's own files (artifact registry, audit log, its head,
//! lock files). It lies outside every sandbox root and is never reachable by an action.
// confine/ is where paths are opened. Only the types are allowed module-wide: the path
// functions are allowed one function at a time, so that the chmod and subprocess bans of
// clippy.toml (SPEC §12.1-2) still hold in the rest of this module.
#![allow(clippy::disallowed_types)]

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Subdirectory holding one record per run that is changing files right now.
pub const INFLIGHT_DIR: &str = "inflight";

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Creates (mode 0700) and opens the state directory.
    pub fn open(path: &Path) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
        for sub in ["locks", INFLIGHT_DIR] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path.join(sub))?;
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (creating) an append-only log file.
    pub fn open_log(&self, name: &str) -> io::Result<LogFile> {
        let path = self.path.join(name);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        Ok(LogFile { file })
    }

    /// Takes an exclusive lock named `name` (a file under `locks/`), held until the guard
    /// drops. It excludes other threads and other processes alike: each call opens its
    /// own file description.
    pub fn lock(&self, name: &str) -> io::Result<FileLock> {
        let file = self.lock_file(name)?;
        file.lock()?;
        Ok(FileLock { file })
    }

    fn lock_file(&self, name: &str) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path.join("locks").join(format!("{name}.lock")))
    }

    /// Like [`StateDir::lock`] but does not wait: `None` when another holder has it.
    pub fn try_lock(&self, name: &str) -> io::Result<Option<FileLock>> {
        let file = self.lock_file(name)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// Writes `name`'s run record in place (see [`StateDir::write_block`]).
    pub fn inflight_write(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        self.write_block(&format!("{INFLIGHT_DIR}/{name}.json"), bytes, durable)
    }

    /// Creates the one-block record `rel` with `bytes`, durable, unless it exists: it
    /// appears whole or not at all, and a second creator keeps the first one's. Returns
    /// whether this call made it.
    pub fn create_block(&self, rel: &str, bytes: &[u8]) -> io::Result<bool> {
        self.create_whole(rel, &padded_block(bytes)?)
    }

    /// Creates `rel` with `bytes`, durable, unless it exists: written aside and linked into
    /// place, so a reader never sees it empty or half written, and a second creator keeps
    /// the first one's. Either way the directory is synced before returning: the caller is
    /// about to rely on the entry, which another process may have linked a moment ago.
    /// Returns whether this call made it.
    #[allow(clippy::disallowed_methods)]
    fn create_whole(&self, rel: &str, bytes: &[u8]) -> io::Result<bool> {
        let path = self.path.join(rel);
        let tmp = self
            .path
            .join(format!(".{rel}{}", super::root::temp_name()));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let linked = f
            .write_all(bytes)
            .and_then(|()| f.sync_data())
            .and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        let made = match linked {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        File::open(&self.path)?.sync_all()?;
        Ok(made)
    }

    /// Opens a one-block record written by [`StateDir::write_block`], to read and rewrite
    /// it without looking it up again; `None` when it does not exist.
    pub fn open_block(&self, rel: &str) -> io::Result<Option<BlockFile>> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path.join(rel))
        {
            Ok(file) => Ok(Some(BlockFile { file })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a small record in place: `bytes` padded to one 512-byte block, so an
    /// overwrite is a single sector write and allocates nothing. The first write creates
    /// the file and syncs its directory; later ones cost one `fdatasync` when `durable`.
    pub fn write_block(&self, rel: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let block = padded_block(bytes)?;
        let path = self.path.join(rel);
        match OpenOptions::new().write(true).open(&path) {
            Ok(f) => {
                f.write_all_at(&block, 0)?;
                if durable {
                    f.sync_data()?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                f.write_all(&block)?;
                if durable {
                    f.sync_data()?;
                    if let Some(dir) = path.parent() {
                        File::open(dir)?.sync_all()?;
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Records that `workflow`'s snapshots in `roots` (as configured) were pruned when the
    /// audit trail ended at `audit_seq` (durable): writes audited before it into those
    /// roots have no snapshot any more, by design.
    pub fn write_prune_mark(
        &self,
        workflow: &str,
        audit_seq: u64,
        roots: &[String],
    ) -> io::Result<()> {
        let mut text = audit_seq.to_string();
        for r in roots {
            text.push('\n');
            text.push_str(r);
        }
        self.write_block(
            &format!("{INFLIGHT_DIR}/{workflow}.pruned"),
            text.as_bytes(),
            true,
        )
    }

    /// The audit seq and the roots recorded by the last prune of `workflow`, if any.
    pub fn prune_mark(&self, workflow: &str) -> io::Result<Option<(u64, Vec<String>)>> {
        let Some(bytes) = self.read_optional(&format!("{INFLIGHT_DIR}/{workflow}.pruned"))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let Some(seq) = lines.next().and_then(|l| l.parse().ok()) else {
            return Ok(None);
        };
        Ok(Some((seq, lines.map(str::to_owned).collect())))
    }

    /// `name`'s run record file, held open to read it; `None` when it does not exist.
    pub fn inflight_open(&self, name: &str) -> io::Result<Option<BlockFile>> {
        self.open_block(&format!("{INFLIGHT_DIR}/{name}.json"))
    }

    /// Reads `name`'s run record; `None` when there is none.
    pub fn inflight_read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        self.read_optional(&format!("{INFLIGHT_DIR}/{name}.json"))
    }

    /// Removes `name`'s run record.
    #[allow(clippy::disallowed_methods)]
    pub fn inflight_remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path.join(INFLIGHT_DIR).join(format!("{name}.json"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every run record: `(id, contents)`.
    #[allow(clippy::disallowed_methods)]
    pub fn inflight_list(&self) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.path.join(INFLIGHT_DIR))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            out.push((id.to_owned(), std::fs::read(e.path())?));
        }
        out.sort();
        Ok(out)
    }

    fn commit_log_path(&self, workflow_id: &str) -> PathBuf {
        self.path
            .join(INFLIGHT_DIR)
            .join(format!("{workflow_id}.log"))
    }

    /// A workflow's commit log file (`inflight/{workflow}.log`, see
    /// [`crate::commit_log`]); `None` when it does not exist.
    pub fn commit_log_file(&self, workflow_id: &str) -> io::Result<Option<CommitLogFile>> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.commit_log_path(workflow_id))
        {
            Ok(file) => Ok(Some(CommitLogFile { file })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a workflow's commit log file, initialised but not synced: the caller
    /// makes a sync point before the first append.
    pub fn commit_log_create(&self, workflow_id: &str) -> io::Result<CommitLogFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(self.commit_log_path(workflow_id))?;
        let log = CommitLogFile { file };
        crate::commit_log::initialize(&log)?;
        Ok(log)
    }

    /// Removes a workflow's commit log file (its workflow was pruned).
    #[allow(clippy::disallowed_methods)]
    pub fn commit_log_remove(&self, workflow_id: &str) -> io::Result<()> {
        match std::fs::remove_file(self.commit_log_path(workflow_id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The workflows that have a commit log file.
    #[allow(clippy::disallowed_methods)]
    pub fn commit_logs(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.path.join(INFLIGHT_DIR))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".log") {
                out.push(id.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Reads a small file; `None` when it does not exist.
    #[allow(clippy::disallowed_methods)]
    pub fn read_optional(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path.join(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The 32-byte secret kept in `name`, made on first use from the kernel's random
    /// source. It appears whole or not at all, durable before use, and if another process
    /// made it first, theirs is used.
    pub fn secret(&self, name: &str) -> io::Result<[u8; 32]> {
        let path = self.path.join(name);
        if let Some(key) = read_secret(&path)? {
            return Ok(key);
        }
        let mut key = [0u8; 32];
        let mut filled = 0;
        while filled < key.len() {
            filled +=
                rustix::rand::getrandom(&mut key[filled..], rustix::rand::GetRandomFlags::empty())?;
        }
        if self.create_whole(name, &key)? {
            return Ok(key);
        }
        read_secret(&path)?.ok_or_else(|| io::Error::other(format!("{} vanished", path.display())))
    }

    /// Replaces a small file atomically (temporary file, rename; fsync'd when `durable`).
    pub fn write_atomic(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let tmp = self.path.join(format!(".{name}.tmp"));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_data()?;
        }
        drop(f);
        #[allow(clippy::disallowed_methods)]
        std::fs::rename(&tmp, self.path.join(name))?;
        if durable {
            File::open(&self.path)?.sync_all()?;
        }
        Ok(())
    }
}

/// A commit log file: positioned reads and writes, and syncs (the format is
/// [`crate::commit_log`]'s).
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

const BLOCK: usize = 512;

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
    /// The block's bytes (at most one block).
    pub fn read(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; BLOCK];
        let n = self.file.read_at(&mut buf, 0)?;
        buf.truncate(n);
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
}

impl LockSet {
    /// `names`, opened on first use.
    pub fn new(state: &StateDir, names: Vec<String>) -> Self {
        let slots = names.iter().map(|_| std::sync::Mutex::new(None)).collect();
        Self {
            state: state.clone(),
            names,
            slots,
        }
    }

    /// Takes lock `i` (of the names given), held until the guard drops.
    pub fn lock(&self, i: usize) -> io::Result<HeldLock<'_>> {
        let (Some(slot), Some(name)) = (self.slots.get(i), self.names.get(i)) else {
            return Err(io::Error::other("no such lock"));
        };
        let mut slot = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let file = match slot.take() {
            Some(f) => f,
            None => self.state.lock_file(name)?,
        };
        file.lock()?;
        *slot = Some(file);
        Ok(HeldLock { slot })
    }
}

/// A lock of a [`LockSet`], released on drop.
#[derive(Debug)]
pub struct HeldLock<'a> {
    slot: std::sync::MutexGuard<'a, Option<File>>,
}

impl Drop for HeldLock<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.slot.as_ref() {
            let _ = f.unlock();
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
}

impl LogFile {
    /// Takes the exclusive lock (other processes; threads are serialised by the owner's
    /// mutex, since a lock belongs to the open file description).
    pub fn lock_exclusive(&self) -> io::Result<LogLock<'_>> {
        self.file.lock()?;
        Ok(LogLock { file: &self.file })
    }

    /// Takes a shared lock for reading.
    pub fn lock_shared(&self) -> io::Result<LogLock<'_>> {
        self.file.lock_shared()?;
        Ok(LogLock { file: &self.file })
    }

    /// Current length in bytes.
    pub fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Reads bytes from `from` to the current end.
    pub fn read_from(&self, from: u64) -> io::Result<Vec<u8>> {
        let len = self.len()?;
        if len <= from {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (len - from) as usize];
        self.file.read_exact_at(&mut buf, from)?;
        Ok(buf)
    }

    /// Reads up to `n` bytes at `from`.
    pub fn read_range(&self, from: u64, n: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n as usize];
        self.file.read_exact_at(&mut buf, from)?;
        Ok(buf)
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

/// Whether a directory can be created (or exists) at `path`, without keeping it.
pub fn ensure_dir(path: &Path, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
}

/// The path with symlinks resolved, when it exists.
#[allow(clippy::disallowed_methods)]
pub fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// Makes whole filesystems durable at once with `syncfs(2)`: one call per distinct
/// filesystem among the given directories, in place of a `fsync` per file and directory
/// touched since the last call. Concurrent callers share syncs (group commit): a sync
/// that started after a caller's writes covers them, so a caller waits for one to start
/// after it asked and finish, and makes it itself only when none is running.
#[derive(Debug)]
pub struct FsSync {
    /// One open handle per filesystem, by device.
    handles: std::sync::Mutex<Vec<(u64, File)>>,
    group: std::sync::Mutex<SyncGroup>,
    done: std::sync::Condvar,
}

/// Tickets of the group commit: callers number their requests; a sync started when
/// `requested` was N covers every request up to N.
#[derive(Debug, Default)]
struct SyncGroup {
    requested: u64,
    covered: u64,
    running: bool,
    /// Syncs actually made (for tests and benchmarks).
    made: u64,
}

impl FsSync {
    /// Opens one handle per distinct filesystem (by device) among `dirs`.
    pub fn open(dirs: &[&Path]) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let mut handles: Vec<(u64, File)> = Vec::new();
        for d in dirs {
            let f = File::open(d)?;
            let dev = f.metadata()?.dev();
            if !handles.iter().any(|(d, _)| *d == dev) {
                handles.push((dev, f));
            }
        }
        Ok(Self {
            handles: std::sync::Mutex::new(handles),
            group: std::sync::Mutex::new(SyncGroup::default()),
            done: std::sync::Condvar::new(),
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
            handles.push((dev, File::from(fd)));
        }
        Ok(())
    }

    /// Returns once everything written before the call is on stable storage.
    pub fn sync(&self) -> io::Result<()> {
        let poisoned = || io::Error::other("sync group poisoned");
        let mut g = self.group.lock().map_err(|_| poisoned())?;
        g.requested += 1;
        let ticket = g.requested;
        loop {
            if g.covered >= ticket {
                return Ok(());
            }
            if !g.running {
                g.running = true;
                let target = g.requested;
                drop(g);
                let result = self.sync_all();
                g = self.group.lock().map_err(|_| poisoned())?;
                g.running = false;
                g.made += 1;
                if result.is_ok() {
                    g.covered = g.covered.max(target);
                }
                self.done.notify_all();
                // On failure the waiters try again themselves; this caller reports it.
                result?;
                continue;
            }
            g = self.done.wait(g).map_err(|_| poisoned())?;
        }
    }

    /// How many syncs were actually made (each covering one or more requests).
    pub fn syncs_made(&self) -> u64 {
        self.group.lock().map_or(0, |g| g.made)
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

#[allow(clippy::disallowed_methods)]
fn read_secret(path: &Path) -> io::Result<Option<[u8; 32]>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    bytes.as_slice().try_into().map(Some).map_err(|_| {
        io::Error::other(format!(
            "{} holds {} bytes, not the 32 of a key; it was damaged (removing it makes every existing snapshot untrusted)",
            path.display(),
            bytes.len()
        ))
    })
}
