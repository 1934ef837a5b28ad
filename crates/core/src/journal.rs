//! An append-only JSONL journal shared by threads and processes: whole lines appended
//! under an exclusive file lock, read incrementally (never rescanned), a torn last line
//! from a crashed writer repaired. Durable appends are synced after the lock is let go,
//! so that appenders waiting at the same time share one `fdatasync` (group commit) and
//! readers never wait for a disk flush.
//!
//! A torn tail is repaired at open, before each append, and by a reader that meets one
//! longer than a line. `write_line` is the one way a line is made (C1 controls and
//! U+2028/U+2029 escaped too), and `json_lines` parses the whole lines of a large read (the
//! registry, the trail) with the buffer checked for UTF-8 once. Every read goes through
//! `scan`, a few MiB at a time: a line longer than any the runtime writes (`MAX_LINE`, 8
//! MiB: a hole ended by a newline, a line made by hand) is passed over unread and handed on
//! as a stand-in (`OVERLONG`) that no reader parses, the next buffer's offset after it.
//!
//! A journal keeps the last bytes it read: found otherwise, the file was cut (and maybe
//! written again), and it is read again from offset 0, which its reader takes as the sign
//! to start its index again. Before an append it checks that the state directory still
//! names the file it holds open: one moved away or replaced would take the lines out of
//! sight. One opened as rewritable (the left-dirs ledger) may be rewritten in place
//! (`rewrite_with`): each rewrite begins with a line of its own (`{"rewrite":"<id>"}`), and
//! readers compare the file's first line at every read, since a rewrite can leave the file
//! as long as, and ending like, what they read.
//!
//! After a failed sync the journal appends nothing more: the kernel may have dropped the
//! pages it could not write, so no later line could be promised durable. The failed
//! append's lines stay in the file (other processes may have read them; cutting them would
//! break their cursors): an action audited as done whose sync failed was undone, and
//! recovery records its undoing after them.

use crate::confine::state::{LogFile, LogLock, StateDir};
use crate::group_commit::GroupCommit;
use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;

/// A JSONL file and how far this process has read it.
#[derive(Debug)]
pub struct Journal {
    file: Arc<LogFile>,
    /// Where the file was opened, to check it is still there before each append.
    state: StateDir,
    name: String,
    cursor: Cursor,
    /// `None` when appends are not synced.
    group: Option<Arc<GroupCommit>>,
}

/// What an append has to wait for before its lines are durable.
#[must_use = "an append's lines are durable only once wait() has returned"]
#[derive(Debug)]
pub struct Pending {
    sync: Option<(Arc<LogFile>, Arc<GroupCommit>, u64)>,
    /// Where the appended bytes start in the file.
    at: u64,
    len: u64,
}

impl Pending {
    /// Where the appended bytes start in the file, and how many there are.
    pub fn range(&self) -> (u64, u64) {
        (self.at, self.len)
    }

    /// Returns once the append's lines are durable: at once when a sync that started
    /// after they were written has finished, else after a sync of its own, which covers
    /// every append written by then.
    pub fn wait(self) -> io::Result<()> {
        self.wait_checked(|| Ok(()))
    }

    /// [`Pending::wait`], running `before_sync` first when this caller makes the sync
    /// (failure injection in tests).
    pub fn wait_checked(self, before_sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        match self.sync {
            Some((file, group, ticket)) => group.wait(ticket, || {
                before_sync()?;
                file.sync_data()
            }),
            None => Ok(()),
        }
    }
}

/// How far this process has read, kept apart from the file so a lock guard can borrow
/// the file while the cursor moves.
#[derive(Debug, Default)]
struct Cursor {
    /// Always at a line boundary.
    offset: u64,
    /// The last bytes before `offset` as this process read or wrote them (at most
    /// [`TAIL`]): found otherwise, the file was cut and written again since.
    tail: Vec<u8>,
    /// Whether the file may be rewritten in place ([`Journal::rewrite_with`]): its first
    /// line is then compared at every read, since a rewrite may leave the file as long
    /// as, and ending like, what this process read.
    rewritable: bool,
    /// The file's first line as this process read or wrote it (at most [`TAIL`] bytes;
    /// kept for a rewritable file only). Every rewrite begins with a line of its own.
    head: Vec<u8>,
}

/// How many of the last bytes read a cursor keeps (the end of a line: its hash or time).
const TAIL: usize = 128;

impl Cursor {
    fn passed(&mut self, bytes: &[u8]) {
        if self.rewritable && self.offset == 0 {
            let first = bytes
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| i + 1);
            self.head = bytes[..first.min(TAIL)].to_vec();
        }
        self.offset += bytes.len() as u64;
        let keep = bytes.len().min(TAIL);
        self.tail.extend_from_slice(&bytes[bytes.len() - keep..]);
        let over = self.tail.len().saturating_sub(TAIL);
        self.tail.drain(..over);
    }
}

impl Journal {
    /// Opens `name` in the state directory and repairs a torn tail.
    pub fn open(state: &StateDir, name: &str, durable: bool) -> io::Result<Self> {
        Self::open_as(state, name, durable, false)
    }

    /// [`Journal::open`] for a log that [`Journal::rewrite_with`] may rewrite in place.
    pub fn open_rewritable(state: &StateDir, name: &str, durable: bool) -> io::Result<Self> {
        Self::open_as(state, name, durable, true)
    }

    fn open_as(state: &StateDir, name: &str, durable: bool, rewritable: bool) -> io::Result<Self> {
        let file = Arc::new(state.open_log(name)?);
        let mut cursor = Cursor {
            rewritable,
            ..Cursor::default()
        };
        {
            let _lock = file.lock_exclusive()?;
            let len = file.len()?;
            cursor.repair_tail(&file, len, durable)?;
        }
        Ok(Self {
            file,
            state: state.clone(),
            name: name.to_owned(),
            cursor,
            group: durable.then(Arc::default),
        })
    }

    fn durable(&self) -> bool {
        self.group.is_some()
    }

    /// The file's current length in bytes.
    pub fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    /// The bytes of disk the file takes (see [`LogFile::allocated`]).
    pub fn allocated(&self) -> io::Result<u64> {
        self.file.allocated()
    }

    /// Whether the file is empty.
    #[cfg_attr(
        not(any(feature = "failpoints", feature = "internals")),
        expect(dead_code, reason = "the pair of `len`, for the tests and embedders of the internals")
    )]
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Makes every line appended so far durable (`fdatasync`).
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Reads the complete lines appended since the last call (by anyone), under a shared
    /// lock, handing them to `sink` in buffers of whole lines (iterate with [`lines`]),
    /// each with its offset in the file. Offsets follow on from one buffer to the next,
    /// except after the file was cut (it is then read again from offset 0) and after a
    /// line longer than [`MAX_LINE`], which is handed alone as [`OVERLONG`].
    /// A partial last line is left for the next repair.
    pub fn read_new(&mut self, sink: &mut dyn FnMut(u64, &[u8])) -> io::Result<()> {
        self.read_new_owned(&mut |at, buf| sink(at, &buf))
    }

    /// [`Journal::read_new`] unless another process holds the file: `false` then, and
    /// nothing read (never waited for).
    pub fn read_new_unless_held(&mut self, sink: &mut dyn FnMut(u64, &[u8])) -> io::Result<bool> {
        self.read_new_under(LogFile::try_lock_shared, false, &mut |at, buf| {
            sink(at, &buf)
        })
    }

    /// [`Journal::read_new`], handing over each buffer (for a reader that sends it on).
    pub fn read_new_owned(&mut self, sink: &mut dyn FnMut(u64, Vec<u8>)) -> io::Result<()> {
        self.read_new_under(|f| f.lock_shared().map(Some), true, sink)
            .map(drop)
    }

    /// The new lines under the shared lock `lock` takes; `false` when it gives none.
    /// `repair`: whether a long torn tail found is cut (never waiting for the lock).
    fn read_new_under(
        &mut self,
        lock: impl for<'f> FnOnce(&'f LogFile) -> io::Result<Option<LogLock<'f>>>,
        repair: bool,
        sink: &mut dyn FnMut(u64, Vec<u8>),
    ) -> io::Result<bool> {
        // Nothing new is the common case: one fstat instead of a lock round trip. An append
        // that lands just after this check is simply read by the next call. (A file
        // rewritten in place may be as long as before: it is always looked at.)
        if !self.cursor.rewritable && self.file.len()? == self.cursor.offset {
            return Ok(true);
        }
        let Some(shared) = lock(&self.file)? else {
            return Ok(false);
        };
        let len = self.file.len()?;
        self.cursor.read_new_locked(&self.file, len, sink)?;
        drop(shared);
        // Under the shared lock no one appends, so bytes past the last line are a torn
        // one. One longer than any line (a hole, a line made by hand) would be read again
        // at every call until a writer cut it: cut here when no one holds the log.
        if repair
            && len - self.cursor.offset >= MAX_LINE
            && let Some(_lock) = self.file.try_lock_exclusive()?
        {
            let len = self.file.len()?;
            let durable = self.durable();
            for (at, buf) in self.cursor.catch_up(&self.file, len, durable)? {
                sink(at, buf);
            }
        }
        Ok(true)
    }

    /// Appends lines (each ending in `\n`) after catching up: `make` receives the lines
    /// other writers appended since this process last read, in buffers with their
    /// offsets as [`Journal::read_new`] gives them (buffers that follow on joined), and
    /// returns the bytes to append, built from that up-to-date view. All of it under the exclusive lock; the
    /// lines are durable once the returned [`Pending`] has been waited for, which the
    /// caller does after letting go of whatever serialises its appends, so that the
    /// appends made meanwhile share the sync.
    /// `make` also gets the file, to read back what it needs under the same lock.
    pub fn append_with<T>(
        &mut self,
        make: impl FnOnce(&[(u64, Vec<u8>)], &LogFile) -> io::Result<(Vec<u8>, T)>,
    ) -> io::Result<(T, Pending)> {
        let durable = self.durable();
        let _lock = self.file.lock_exclusive()?;
        // One length serves the repair and the catch-up: with the lock held, nobody else
        // changes the file in between.
        let len = self.file.len()?;
        let new = self.cursor.catch_up(&self.file, len, durable)?;
        let (mut bytes, out) = make(&new, &self.file)?;
        // A rewritable file always begins with a line of a rewrite's own, even one a
        // rewrite cut and died before writing, or a new one: its first line then tells
        // every reader which file it read.
        if self.cursor.rewritable && self.cursor.offset == 0 && !bytes.is_empty() {
            let mut first = rewrite_line()?;
            first.append(&mut bytes);
            bytes = first;
        }
        // The repaired file ends where the cursor is: at a line boundary.
        let mut pending = Pending {
            sync: None,
            at: self.cursor.offset,
            len: bytes.len() as u64,
        };
        if !bytes.is_empty() {
            // After a failed sync nothing more is written: it could not be made durable.
            if let Some(e) = self.sync_failure() {
                return Err(e);
            }
            self.check_in_place()?;
            if let Err(e) = self.file.append(&bytes, false) {
                // Leave no torn line behind for the next reader.
                let _ = self.file.truncate(self.cursor.offset, durable);
                return Err(e);
            }
            self.cursor.passed(&bytes);
            if let Some(g) = &self.group {
                pending.sync = Some((self.file.clone(), g.clone(), g.ticket()));
            }
        }
        Ok((out, pending))
    }

    /// Rewrites the file in place (for a log whose lines cancel out, such as a ledger;
    /// opened with [`Journal::open_rewritable`]): after catching up as
    /// [`Journal::append_with`] does, `make` receives the lines other writers appended
    /// since and returns the file's new lines, or `None` to leave it as it is. They are
    /// written after a first line of the rewrite's own (`{"rewrite":"<unique id>"}`,
    /// which readers skip as a line of no kind of theirs; the first append to an empty
    /// rewritable file writes one too), so that every other process sees a file it has
    /// not read, and reads it from the start. Not atomic: a crash between the cut and the
    /// write leaves the file empty or torn, so only a log whose lines are hints may be
    /// rewritten.
    pub fn rewrite_with(
        &mut self,
        make: impl FnOnce(&[(u64, Vec<u8>)]) -> Option<Vec<u8>>,
    ) -> io::Result<bool> {
        if !self.cursor.rewritable {
            return Err(io::Error::other(
                "a journal not opened as rewritable was to be rewritten",
            ));
        }
        let durable = self.durable();
        let _lock = self.file.lock_exclusive()?;
        let len = self.file.len()?;
        let new = self.cursor.catch_up(&self.file, len, durable)?;
        let Some(lines) = make(&new) else {
            return Ok(false);
        };
        let mut bytes = rewrite_line()?;
        bytes.extend_from_slice(&lines);
        if let Some(e) = self.sync_failure() {
            return Err(e);
        }
        self.check_in_place()?;
        // From here on the file is not what this process read: whatever happens, the
        // next read starts again from the beginning.
        self.cursor.restart();
        self.file.truncate(0, false)?;
        self.file.append(&bytes, durable)?;
        self.cursor.passed(&bytes);
        Ok(true)
    }

    /// Refuses a file that its name in the state directory no longer names: one moved
    /// away, or replaced by another, would take this process's lines, and give it
    /// answers, out of sight of every other process.
    pub fn check_in_place(&self) -> io::Result<()> {
        if self.state.still_names(&self.name, &self.file)? {
            return Ok(());
        }
        // Named within the state directory: the words may reach a client, to whom no
        // path outside the roots is shown.
        Err(io::Error::other(format!(
            "{} in the state directory is no longer the file this process opened: it was moved away or replaced while the process ran, so this process refuses it from now on; start the process again",
            self.name
        )))
    }

    /// Why appends are refused: an earlier sync failed.
    pub fn sync_failure(&self) -> Option<io::Error> {
        self.group.as_ref().and_then(|g| g.failed())
    }

    /// The group commit its durable appends share (`None` when appends are not synced):
    /// where a failed sync is kept, to be asked without the journal's owner's lock.
    pub fn group(&self) -> Option<Arc<GroupCommit>> {
        self.group.clone()
    }

    /// The file, for reading back lines already read (they never change).
    pub fn file(&self) -> &LogFile {
        &self.file
    }

    /// [`file`](Self::file), to read lines back without the journal's owner's lock.
    pub fn shared_file(&self) -> Arc<LogFile> {
        self.file.clone()
    }

    /// Runs `also`, then [`scan`]s the whole file into `sink` (given what `also` returned),
    /// under one shared lock, so that no append lands between the two (for verification:
    /// however long the file, a few MiB of it are held at a time).
    pub fn scan_all_with<T>(
        &self,
        also: impl FnOnce() -> io::Result<T>,
        mut sink: impl FnMut(&mut T, Piece) -> io::Result<ControlFlow<()>>,
    ) -> io::Result<T> {
        let _lock = self.file.lock_shared()?;
        let mut out = also()?;
        let read_at = |buf: &mut [u8], at: u64| self.file.read_exact_at(buf, at);
        scan(&read_at, 0, self.file.len()?, &mut |piece| {
            sink(&mut out, piece)
        })?;
        Ok(out)
    }
}

impl Cursor {
    /// With the exclusive lock held and the file `len` bytes long: repairs a torn tail
    /// and reads what other writers appended since, returning it and its offset (0 when
    /// the file was cut and written again).
    fn catch_up(
        &mut self,
        file: &LogFile,
        len: u64,
        durable: bool,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let before = (self.offset, self.tail.clone(), self.head.clone());
        let mut new: Vec<(u64, Vec<u8>)> = Vec::new();
        // A log cut and written again is read from the start, and only then repaired:
        // its torn part is looked for after what is read, not after where this process
        // had read to.
        let caught_up = self.restart_if_moved(file, len).and_then(|restarted| {
            if restarted {
                new.push((0, Vec::new()));
            }
            let len = self.repair_tail(file, len, durable)?;
            self.read_new_locked(file, len, &mut |at, b| match new.last_mut() {
                // Buffers that follow on are joined; the stand-in for a line passed over
                // starts where the line does, but the next buffer where the line ends.
                Some((last, lines)) if *last + lines.len() as u64 == at => {
                    lines.extend_from_slice(&b);
                }
                _ => new.push((at, b)),
            })
        });
        if let Err(e) = caught_up {
            // Nothing read reached the caller: the next call reads it again.
            (self.offset, self.tail, self.head) = before;
            return Err(e);
        }
        Ok(new)
    }

    /// Reads the complete lines between the cursor and `len` (the file's length, taken
    /// under a lock).
    /// When the file is no longer what this process read up to the cursor (someone cut
    /// it, and maybe wrote it again), moves the cursor back to its start and says so.
    /// `len` is the file's length, taken under a lock.
    fn restart_if_moved(&mut self, file: &LogFile, len: u64) -> io::Result<bool> {
        // With `len >= offset`, the head and the tail lie within the file.
        let moved = len < self.offset
            || (self.rewritable
                && self.offset > 0
                && file.read_range(0, self.head.len() as u64)? != self.head)
            || (len > self.offset
                && self.offset > 0
                && file
                    .read_range(self.offset - self.tail.len() as u64, self.tail.len() as u64)?
                    != self.tail);
        if moved {
            self.restart();
        }
        Ok(moved)
    }

    /// Forgets what was read: the next read starts from the beginning.
    fn restart(&mut self) {
        self.offset = 0;
        self.tail.clear();
        self.head.clear();
    }

    fn read_new_locked(
        &mut self,
        file: &LogFile,
        len: u64,
        sink: &mut dyn FnMut(u64, Vec<u8>),
    ) -> io::Result<()> {
        if self.restart_if_moved(file, len)? {
            // Said to the sink even when nothing is left to read.
            sink(0, Vec::new());
        }
        let read_at = |buf: &mut [u8], at: u64| file.read_exact_at(buf, at);
        scan(&read_at, self.offset, len, &mut |piece| {
            match piece {
                Piece::Lines(at, buf) => {
                    self.passed(&buf);
                    sink(at, buf);
                }
                Piece::Overlong(at, n) => {
                    self.skipped(file, at, n)?;
                    sink(at, OVERLONG.to_vec());
                }
            }
            Ok(ControlFlow::Continue(()))
        })
        .map(drop)
    }

    /// Moves the cursor past a line of `n` bytes at `at` that was not read into memory,
    /// keeping its first and last bytes as [`Cursor::passed`] would.
    fn skipped(&mut self, file: &LogFile, at: u64, n: u64) -> io::Result<()> {
        let keep = n.min(TAIL as u64);
        if self.rewritable && at == 0 {
            self.head = file.read_range(0, keep)?;
        }
        self.offset = at + n;
        self.tail = file.read_range(self.offset - keep, keep)?;
        Ok(())
    }

    /// With the exclusive lock held no writer is mid-line, so bytes after the last
    /// newline are a torn line left by a crash: cut them, unless they are a whole entry
    /// that lost only its newline. Returns the length after.
    fn repair_tail(&mut self, file: &LogFile, len: u64, durable: bool) -> io::Result<u64> {
        // The cursor sits at a line boundary: a file that ends there ends in a newline.
        if len == 0 || (len == self.offset && self.offset > 0) {
            return Ok(len);
        }
        if file.read_range(len - 1, 1)? == b"\n" {
            return Ok(len);
        }
        // The torn part lies after the cursor: look backwards from the end, a block at a
        // time, for the last newline.
        const BLOCK: u64 = 64 << 10;
        let floor = self.offset.min(len);
        let mut end = len;
        let mut keep = floor;
        while end > floor {
            let start = end.saturating_sub(BLOCK).max(floor);
            let buf = file.read_range(start, end - start)?;
            if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
                keep = start + i as u64 + 1;
                break;
            }
            end = start;
        }
        // A line that lost only its newline is whole: no proper prefix of a JSON object
        // is one. It is ended, not dropped. Judged as it is read, never held: a tail of
        // gigabytes (a sparse file's hole costs no disk) must not cost as much memory.
        if is_one_object(file, keep, len)? {
            tracing::warn!("ended a journal's last line, which had lost its newline");
            file.append(b"\n", durable)?;
            return Ok(len + 1);
        }
        tracing::warn!(
            dropped_bytes = len - keep,
            "repaired a torn last line in a journal"
        );
        file.truncate(keep, durable)?;
        Ok(keep)
    }
}

/// The longest line a reader holds. Every line the runtime writes is far shorter (an
/// audit line's free text is cut to a few KiB, see [`crate::audit::MAX_RECORDED_PATH`]);
/// a longer one was made by hand or is a hole ended by a newline (a sparse file's hole
/// costs no disk), and is passed over without being read into memory.
pub const MAX_LINE: u64 = 8 << 20;

/// What the readers of [`Journal::read_new`] are handed in place of a line longer than
/// [`MAX_LINE`] (it is handed alone, at the line's offset; the next buffer starts after
/// the line). Not JSON: every reader counts it among the lines that do not read.
pub const OVERLONG: &[u8] = b"\0a line longer than any the runtime writes\n";

/// What [`scan`] hands on, in file order.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Whole lines, each ending in a newline, and the offset of the first.
    Lines(u64, Vec<u8>),
    /// A line longer than [`MAX_LINE`] (its offset, and its length with its newline):
    /// not read into memory.
    Overlong(u64, u64),
}

/// Reads the whole lines between `from` (a line boundary) and `to` through `read_at`
/// (a positional read that fills its buffer), handing them to `sink` in order, a few
/// MiB at a time, until it breaks off. A line longer than [`MAX_LINE`] (its newline
/// counted) is handed on as [`Piece::Overlong`] wherever it stands, and never held
/// whole: at most `MAX_LINE` plus a chunk is held at once. Returns where the last whole
/// line read ends: bytes after it are a torn line or one being written.
pub fn scan(
    read_at: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    from: u64,
    to: u64,
    sink: &mut dyn FnMut(Piece) -> io::Result<ControlFlow<()>>,
) -> io::Result<u64> {
    // A line that begins and ends in one chunk is never too long: only the first line of
    // a read, begun before its chunk, needs measuring.
    const CHUNK: u64 = MAX_LINE;
    let mut pos = from;
    // The start of a line not yet ended, read before `pos` (shorter than `MAX_LINE`).
    let mut carry: Vec<u8> = Vec::new();
    // Where a line known to be too long began, while its end is looked for.
    let mut overlong: Option<u64> = None;
    while pos < to {
        let n = (to - pos).min(CHUNK);
        let base = pos - carry.len() as u64;
        // Read straight after the carried part: each chunk is read into the buffer
        // handed out, not copied there.
        let mut buf = std::mem::take(&mut carry);
        let kept = buf.len();
        buf.resize(kept + n as usize, 0);
        read_at(&mut buf[kept..], pos)?;
        pos += n;
        let start = overlong.unwrap_or(base);
        let mut begin = 0;
        match memchr::memchr(b'\n', &buf) {
            None if overlong.is_some() || buf.len() as u64 >= MAX_LINE => {
                overlong = Some(start);
                continue;
            }
            None => {
                carry = buf;
                continue;
            }
            Some(i) if base + i as u64 + 1 - start > MAX_LINE => {
                overlong = None;
                begin = i + 1;
                let len = base + begin as u64 - start;
                if sink(Piece::Overlong(start, len))?.is_break() {
                    return Ok(base + begin as u64);
                }
            }
            Some(_) => {}
        }
        let end = memchr::memrchr(b'\n', &buf[begin..]).map_or(begin, |i| begin + i + 1);
        carry = buf.split_off(end);
        if end > begin {
            buf.drain(..begin);
            if sink(Piece::Lines(base + begin as u64, buf))?.is_break() {
                return Ok(base + end as u64);
            }
        }
    }
    Ok(overlong.unwrap_or(pos - carry.len() as u64))
}

/// Whether `file`'s bytes from `from` to `to` are one JSON object and nothing else (its
/// first and last bytes looked at first: a torn line seldom ends in `}`). A span of the
/// size of a line is read and parsed whole, as any line is; a longer one (a hole of
/// gigabytes costs no disk) is checked as it is read, never held, its strings then
/// taken for text unchecked. A read that fails is an error, never a verdict.
fn is_one_object(file: &LogFile, from: u64, to: u64) -> io::Result<bool> {
    use serde::Deserialize as _;
    const WHOLE: u64 = 8 << 20;
    if to < from + 2 || file.read_range(from, 1)? != b"{" || file.read_range(to - 1, 1)? != b"}" {
        return Ok(false);
    }
    if to - from <= WHOLE {
        let text = file.read_range(from, to - from)?;
        return Ok(
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&text).is_ok(),
        );
    }
    let mut span = Span {
        file,
        at: from,
        to,
        failed: None,
    };
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(
        64 << 10,
        &mut span,
    ));
    let whole = serde::de::IgnoredAny::deserialize(&mut de).is_ok() && de.end().is_ok();
    drop(de);
    match span.failed {
        Some(e) => Err(e),
        None => Ok(whole),
    }
}

/// A span of a log file, read as a stream; the first read that fails is kept.
struct Span<'a> {
    file: &'a LogFile,
    at: u64,
    to: u64,
    failed: Option<io::Error>,
}

impl std::io::Read for Span<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.to - self.at).min(buf.len() as u64) as usize;
        if let Err(e) = self.file.read_exact_at(&mut buf[..n], self.at) {
            let kept = io::Error::new(e.kind(), e.to_string());
            self.failed.get_or_insert(e);
            return Err(kept);
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// The first line of a rewritable journal's file, unique to each rewrite.
fn rewrite_line() -> io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(64);
    write_line(
        &mut line,
        &serde_json::json!({ "rewrite": crate::ids::unique() }),
    )?;
    Ok(line)
}

/// The non-empty lines of a buffer handed out by [`Journal::read_new`].
pub fn lines(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    // memchr finds each newline many bytes at a time: a million-line registry is split
    // in milliseconds instead of a byte-by-byte tenth of a second.
    let mut start = 0;
    memchr::memchr_iter(b'\n', buf)
        .chain(std::iter::once(buf.len()))
        .map(move |end| {
            let line = &buf[start..end];
            start = end + 1;
            line
        })
        .filter(|l| !l.is_empty())
}

/// [`lines`], each with what it reads as in JSON. The whole buffer is checked for UTF-8
/// at once, which is much faster than the JSON reader checking every string of every
/// line (`serde_json::from_str` checks nothing again); only a buffer that fails is
/// checked line by line, a line that is not UTF-8 read from its bytes (the reader then
/// says where it fails).
pub fn json_lines<'a, T: serde::Deserialize<'a>>(
    buf: &'a [u8],
) -> impl Iterator<Item = (&'a [u8], serde_json::Result<T>)> {
    text_lines(buf).map(|line| match line {
        Ok(text) => (text.as_bytes(), serde_json::from_str(text)),
        Err(bytes) => (bytes, serde_json::from_slice(bytes)),
    })
}

/// A buffer's whole lines as read: what each line that reads became, in order, and how
/// many did not (the first one's error kept for one warning, not one a line: a log of
/// junk lines costs a count).
#[derive(Debug)]
pub struct ParsedLines<U> {
    /// What the lines that read became.
    pub entries: Vec<U>,
    /// Lines that did not read.
    pub unreadable: u64,
    /// The first of those lines' error.
    pub first_error: Option<serde_json::Error>,
}

impl<U> ParsedLines<U> {
    /// `buf`'s lines through [`json_lines`], each that reads as a `T` made into a `U` by
    /// `make` (given the line's bytes too), which may refuse it as well.
    pub fn of<'a, T: serde::Deserialize<'a>>(
        buf: &'a [u8],
        mut make: impl FnMut(&'a [u8], T) -> serde_json::Result<U>,
    ) -> Self {
        let mut out = Self {
            entries: Vec::new(),
            unreadable: 0,
            first_error: None,
        };
        for (line, read) in json_lines::<T>(buf) {
            match read.and_then(|t| make(line, t)) {
                Ok(u) => out.entries.push(u),
                Err(err) => {
                    out.unreadable += 1;
                    out.first_error.get_or_insert(err);
                }
            }
        }
        out
    }
}

/// [`lines`], each as text when it is UTF-8 (`Err` with its bytes when not).
fn text_lines(buf: &[u8]) -> impl Iterator<Item = Result<&str, &[u8]>> {
    let text = std::str::from_utf8(buf).ok();
    let whole = text
        .into_iter()
        .flat_map(|t| t.split('\n').filter(|l| !l.is_empty()).map(Ok));
    let by_line = text
        .is_none()
        .then_some(buf)
        .into_iter()
        .flat_map(|b| lines(b).map(|l| std::str::from_utf8(l).map_err(|_| l)));
    whole.chain(by_line)
}

/// Appends `value` to `out` as one JSON line. Besides what JSON itself escapes, the C1
/// control characters (U+0080–U+009F) and the Unicode line and paragraph separators
/// (U+2028, U+2029) are written as `\uXXXX`: readers that split lines the Unicode way
/// (`str.splitlines()` and the like) would otherwise see a payload holding one as two lines.
pub fn write_line<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> io::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, LineFormatter);
    value.serialize(&mut ser).map_err(io::Error::other)?;
    out.push(b'\n');
    Ok(())
}

/// Compact JSON that escapes the characters [`write_line`] names.
struct LineFormatter;

fn breaks_lines(c: char) -> bool {
    matches!(c, '\u{80}'..='\u{9f}' | '\u{2028}' | '\u{2029}')
}

impl serde_json::ser::Formatter for LineFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // None of the characters escaped here is ASCII; most text is (checked a word at
        // a time).
        if fragment.is_ascii() {
            return writer.write_all(fragment.as_bytes());
        }
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| breaks_lines(c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

/// Why a journal shared behind its owner's lock (`what` names it) takes no more lines
/// for good: a failed sync ([`Journal::sync_failure`]) or its file moved away or
/// replaced ([`Journal::check_in_place`]). Not waited for: an append under way (which
/// checks both) may wait on another process for long, and a health check must answer
/// at once; a journal busy appending is taken as taking lines.
pub(crate) fn held_failure<T>(
    held: &crate::timed_lock::TimedMutex<(Journal, T)>,
    group: Option<&GroupCommit>,
    what: &str,
) -> Option<String> {
    // A failed sync is kept apart from the journal: seen even while an append holds it.
    if let Some(e) = group.and_then(GroupCommit::failed) {
        return Some(crate::error::sync_failed_words(what, &e));
    }
    match held.try_lock()? {
        Ok(g) => g.0.check_in_place().err().map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    }
}

#[cfg(test)]
mod line_tests {
    use super::write_line;

    fn line(s: &str) -> String {
        let mut out = Vec::new();
        assert!(write_line(&mut out, &serde_json::json!({ "s": s })).is_ok());
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn unicode_line_breaks_and_c1_controls_are_escaped() {
        let l = line("a\u{2028}b\u{85}c\u{2029}d\u{9f}\u{a0}é\n\"");
        assert_eq!(
            l,
            "{\"s\":\"a\\u2028b\\u0085c\\u2029d\\u009f\u{a0}é\\n\\\"\"}\n"
        );
        assert_eq!(l.lines().count(), 1);
        let back: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
        assert_eq!(back["s"], "a\u{2028}b\u{85}c\u{2029}d\u{9f}\u{a0}é\n\"");
    }

    #[test]
    fn ordinary_text_is_written_as_compact_json() {
        assert_eq!(line("plain ü 日本"), "{\"s\":\"plain ü 日本\"}\n");
    }
}

#[cfg(test)]
mod scan_tests {
    use super::{MAX_LINE, Piece, scan};
    use std::ops::ControlFlow;

    /// What `scan` hands on for `bytes`, whole lines joined where they follow on (the
    /// chunk boundaries are the scanner's own), and where it says the whole lines end.
    fn scanned(bytes: &[u8]) -> (Vec<Piece>, u64) {
        let read_at = |buf: &mut [u8], at: u64| {
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        };
        let mut out: Vec<Piece> = Vec::new();
        let end = scan(&read_at, 0, bytes.len() as u64, &mut |piece| {
            if let (Piece::Lines(at, more), Some(Piece::Lines(last, lines))) =
                (&piece, out.last_mut())
                && *last + lines.len() as u64 == *at
            {
                lines.extend_from_slice(more);
            } else {
                out.push(piece);
            }
            Ok(ControlFlow::Continue(()))
        });
        (out, end.unwrap_or(u64::MAX))
    }

    #[test]
    fn long_lines_are_passed_over_wherever_they_fall() {
        let long = MAX_LINE as usize * 2 + 3;
        let mut middle = b"{}\n".to_vec();
        middle.resize(3 + long, b'x');
        middle.extend_from_slice(b"\n{\"a\":1}\n");
        let (pieces, end) = scanned(&middle);
        assert_eq!(
            pieces,
            [
                Piece::Lines(0, b"{}\n".to_vec()),
                Piece::Overlong(3, long as u64 + 1),
                Piece::Lines(4 + long as u64, b"{\"a\":1}\n".to_vec()),
            ]
        );
        assert_eq!(end, middle.len() as u64);
        // At the start, and last without its newline (a torn line: not handed on).
        let mut first = vec![b'y'; long];
        first.extend_from_slice(b"\n{}\n");
        first.resize(first.len() + long, b'z');
        let (pieces, end) = scanned(&first);
        assert_eq!(
            pieces,
            [
                Piece::Overlong(0, long as u64 + 1),
                Piece::Lines(long as u64 + 1, b"{}\n".to_vec()),
            ]
        );
        assert_eq!(end, long as u64 + 4);
        // Lines of every length up to the limit, across chunk boundaries, are whole.
        let mut many = Vec::new();
        let mut n = 1;
        while many.len() < 3 * MAX_LINE as usize {
            many.resize(many.len() + n, b'l');
            many.push(b'\n');
            n = (n * 3 + 1) % MAX_LINE as usize;
        }
        let (pieces, end) = scanned(&many);
        assert_eq!(pieces, [Piece::Lines(0, many.clone())]);
        assert_eq!(end, many.len() as u64);
    }

    /// The limit is the same wherever a line falls against the chunks: a line of
    /// `MAX_LINE` bytes, its newline counted, is whole; one byte more is passed over.
    #[test]
    fn the_limit_does_not_depend_on_where_a_line_falls() {
        let m = MAX_LINE as usize;
        for before in [0, 1, 2, 1000, m / 2, m - 3, m - 2, m - 1] {
            for (len, whole) in [(m, true), (m + 1, false)] {
                let mut bytes = Vec::new();
                if before > 0 {
                    bytes.resize(before - 1, b'a');
                    bytes.push(b'\n');
                }
                let at = bytes.len() as u64;
                bytes.resize(bytes.len() + len - 1, b'b');
                bytes.extend_from_slice(b"\n{}\n");
                let (pieces, end) = scanned(&bytes);
                assert_eq!(end, bytes.len() as u64);
                let long = pieces.iter().find(|p| match p {
                    Piece::Overlong(start, _) => *start == at,
                    Piece::Lines(start, lines) => *start <= at && *start + lines.len() as u64 > at,
                });
                match long {
                    Some(Piece::Overlong(_, n)) => {
                        assert!(!whole, "{before} {len}");
                        assert_eq!(*n, len as u64);
                    }
                    Some(Piece::Lines(..)) => assert!(whole, "{before} {len}"),
                    None => panic!("{before} {len}: no piece holds the line"),
                }
            }
        }
    }

    #[test]
    fn a_scan_stops_where_its_reader_breaks_off() {
        let bytes = vec![b'\n'; 3 * MAX_LINE as usize];
        let read_at = |buf: &mut [u8], at: u64| {
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        };
        let mut calls = 0;
        let end = scan(&read_at, 0, bytes.len() as u64, &mut |_| {
            calls += 1;
            Ok(ControlFlow::Break(()))
        });
        assert_eq!(calls, 1);
        assert!(end.is_ok_and(|end| end > 0 && end < bytes.len() as u64));
    }
}
