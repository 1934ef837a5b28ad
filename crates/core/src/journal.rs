//! An append-only JSONL journal shared by threads and processes: whole lines appended
//! under an exclusive file lock, read incrementally (never rescanned), a torn last line
//! from a crashed writer repaired.

use crate::confine::state::{LogFile, StateDir};
use std::io;

/// A JSONL file and how far this process has read it.
#[derive(Debug)]
pub struct Journal {
    file: LogFile,
    offset: u64,
    durable: bool,
    repaired: u64,
}

impl Journal {
    /// Opens `name` in the state directory and repairs a torn tail.
    pub fn open(state: &StateDir, name: &str, durable: bool) -> io::Result<Self> {
        let file = state.open_log(name)?;
        let mut j = Self {
            file,
            offset: 0,
            durable,
            repaired: 0,
        };
        {
            let _lock = j.file.lock_exclusive()?;
            j.repair_tail()?;
        }
        Ok(j)
    }

    /// Bytes dropped by torn-tail repairs since open.
    pub fn repaired_bytes(&self) -> u64 {
        self.repaired
    }

    /// Reads the complete lines appended since the last call (by anyone), under a shared
    /// lock. A partial last line is left for the next repair.
    pub fn read_new(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let _lock = self.file.lock_shared()?;
        self.read_new_locked()
    }

    /// Appends lines (each ending in `\n`) after catching up: `make` receives the lines
    /// other writers appended since this process last read and returns the bytes to
    /// append, built from that up-to-date view; `after` runs once the bytes are written.
    /// All of it under the exclusive lock.
    pub fn append_with<T>(
        &mut self,
        make: impl FnOnce(Vec<Vec<u8>>) -> io::Result<(Vec<u8>, T)>,
        after: impl FnOnce(&T) -> io::Result<()>,
    ) -> io::Result<T> {
        let _lock = self.file.lock_exclusive()?;
        self.repair_tail()?;
        let new = self.read_new_locked()?;
        let (bytes, out) = make(new)?;
        if !bytes.is_empty() {
            if let Err(e) = self.file.append(&bytes, self.durable) {
                // Leave no torn line behind for the next reader.
                let _ = self.file.truncate(self.offset, self.durable);
                return Err(e);
            }
            self.offset += bytes.len() as u64;
        }
        after(&out)?;
        Ok(out)
    }

    /// Reads everything from the start (for verification), under a shared lock.
    pub fn read_all(&self) -> io::Result<Vec<u8>> {
        let _lock = self.file.lock_shared()?;
        self.file.read_from(0)
    }

    fn read_new_locked(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let len = self.file.len()?;
        if len < self.offset {
            // Someone cut the file: read it again from the start.
            self.offset = 0;
        }
        let buf = self.file.read_from(self.offset)?;
        let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let complete = &buf[..=last_nl];
        self.offset += complete.len() as u64;
        Ok(complete
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect())
    }

    /// With the exclusive lock held no writer is mid-line, so bytes after the last
    /// newline are a torn line left by a crash: cut them.
    fn repair_tail(&mut self) -> io::Result<()> {
        let len = self.file.len()?;
        if len == 0 {
            return Ok(());
        }
        // Our offset is always at a line boundary, so the torn part lies after it.
        let from = self.offset.min(len);
        let buf = self.file.read_from(from)?;
        if buf.last() == Some(&b'\n') || buf.is_empty() {
            return Ok(());
        }
        let keep = match buf.iter().rposition(|&b| b == b'\n') {
            Some(i) => from + i as u64 + 1,
            None => from,
        };
        self.repaired += len - keep;
        tracing::warn!(
            dropped_bytes = len - keep,
            "repaired a torn last line in a journal"
        );
        self.file.truncate(keep, self.durable)
    }
}
