//! Directories a restore had to leave because they held files it did not write (another
//! workflow's, someone else's). Each is removed by a later restore beneath it, of any
//! workflow, once it is empty: rolling back every workflow that wrote beneath a directory
//! one of them created leaves the tree as it was, in whatever order they are rolled back.
//! One emptied otherwise (by hand), or that could not be removed when it was (busy), is
//! removed by the next prune, which looks at the whole ledger.
//!
//! The ledger (`left_dirs.jsonl` in the state directory) is only a hint: a directory is
//! removed while it is empty and still the very directory that was left (device, inode,
//! birth time; one on a filesystem that keeps no birth time is never put on it), never
//! otherwise, so a lost, stale or planted line can at worst leave an empty directory in
//! place. Nor while a later `create_directory` that found it, and so made its existence
//! its result, stands: it goes once that one is rolled back too.
//!
//! Each folder left and later settled adds two lines; once settled lines make up most
//! of the file (past 64 KiB) it is rewritten in place with only the folders still left,
//! and other processes read it again from the start.

use crate::confine::state::StateDir;
use crate::journal::{self, Journal};
use crate::snapshot::LeftDir;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io;
use std::sync::Mutex;

/// The ledger's file name in the state directory.
pub const LEFT_DIRS_FILE: &str = "left_dirs.jsonl";

/// The action that made a directory: a later `create_directory` of someone else that
/// found the directory makes its existence that one's result, and keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Maker {
    /// Its workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// When it ran (its snapshot's time): only a claim recorded since can be on the
    /// directory it made.
    pub at: String,
}

impl Maker {
    /// The action a snapshot belongs to.
    pub fn of(meta: &crate::snapshot::SnapshotMeta) -> Self {
        Self {
            workflow_id: meta.workflow_id.clone(),
            action_id: meta.action_id.clone(),
            at: meta.taken_at.clone(),
        }
    }
}

/// A directory left, and who made it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Left {
    /// The directory.
    #[serde(flatten)]
    pub dir: LeftDir,
    /// Who made it.
    pub made_by: Maker,
}

/// One line: a directory left (or, with `gone`, no longer to be looked after).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Line {
    /// The root, as configured (see [`crate::sandbox::Sandbox::root_names`]).
    root: String,
    #[serde(flatten)]
    left: Left,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gone: bool,
}

/// The ledger, shared by threads and processes.
#[derive(Debug)]
pub struct LeftDirs {
    inner: Mutex<Ledger>,
}

#[derive(Debug)]
struct Ledger {
    journal: Journal,
    /// What the file says so far: the directories still left, by root.
    left: HashSet<Line>,
    /// How many lines the file holds, as far as read: with `left`, whether settled
    /// lines make up most of it, known without writing out what a rewrite would keep.
    lines: usize,
}

impl Ledger {
    fn catch_up(&mut self) -> io::Result<()> {
        let (left, lines) = (&mut self.left, &mut self.lines);
        self.journal
            .read_new(&mut |at, buf| fold_all((left, lines), at, buf))
    }

    fn append(&mut self, lines: &[Line]) -> io::Result<()> {
        let mut bytes = Vec::new();
        for l in lines {
            crate::journal::write_line(&mut bytes, l)?;
        }
        let (left, count) = (&mut self.left, &mut self.lines);
        let ((), pending) = self.journal.append_with(|new, _| {
            new.iter()
                .for_each(|(at, b)| fold_all((&mut *left, &mut *count), *at, b));
            Ok((bytes, ()))
        })?;
        pending.wait()?;
        lines.iter().for_each(|l| fold_line(left, l.clone()));
        *count += lines.len();
        Ok(())
    }

    /// Rewrites the file with only the directories still left once settled lines make
    /// up most of it: every directory left and settled adds two lines for good
    /// otherwise. A crash or a failed write during the rewrite can lose lines, which
    /// leaves at worst an empty directory in place (the ledger is a hint).
    fn compact(&mut self) -> io::Result<()> {
        let len = self.journal.len()?;
        // Most lines still live: nothing to gain (and every folder left to write out
        // to find that out, at each settle, on a ledger long with others' folders).
        if len < COMPACT_AT || self.left.len() * 4 > self.lines {
            return Ok(());
        }
        let (left, count) = (&mut self.left, &mut self.lines);
        let rewritten = self.journal.rewrite_with(|new| {
            new.iter()
                .for_each(|(at, b)| fold_all((&mut *left, &mut *count), *at, b));
            let mut live: Vec<&Line> = left.iter().collect();
            live.sort_by(|a, b| (&a.root, &a.left.dir.path).cmp(&(&b.root, &b.left.dir.path)));
            let mut bytes = Vec::new();
            for l in live {
                crate::journal::write_line(&mut bytes, l).ok()?;
            }
            (bytes.len() as u64 * 4 <= len).then_some(bytes)
        })?;
        if rewritten {
            // The rewrite's own first line, then those still left.
            self.lines = self.left.len() + 1;
        }
        Ok(())
    }
}

/// The ledger's size from which it is rewritten when settled lines make up most of it.
const COMPACT_AT: u64 = 64 << 10;

/// Applies the lines read at offset `at`. Read again from the start, the file was cut
/// (and maybe written again): what it said before is forgotten.
fn fold_all((left, count): (&mut HashSet<Line>, &mut usize), at: u64, buf: &[u8]) {
    if at == 0 {
        left.clear();
        *count = 0;
    }
    journal::lines(buf).for_each(|l| {
        *count += 1;
        fold(left, l);
    });
}

/// Applies one line of the file; one that does not parse is skipped (a hint only).
fn fold(left: &mut HashSet<Line>, raw: &[u8]) {
    if let Ok(line) = serde_json::from_slice::<Line>(raw) {
        fold_line(left, line);
    }
}

fn fold_line(left: &mut HashSet<Line>, mut line: Line) {
    if line.gone {
        line.gone = false;
        left.remove(&line);
    } else {
        left.insert(line);
    }
}

impl LeftDirs {
    /// Opens the ledger (appends synced when `durable`).
    pub fn open(state: &StateDir, durable: bool) -> io::Result<Self> {
        Ok(Self {
            inner: Mutex::new(Ledger {
                journal: Journal::open_rewritable(state, LEFT_DIRS_FILE, durable)?,
                left: HashSet::new(),
                lines: 0,
            }),
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records directories a restore in `root` had to leave, made by `made_by`.
    pub fn record(&self, root: &str, dirs: &[LeftDir], made_by: &Maker) -> io::Result<()> {
        let left: Vec<Left> = dirs
            .iter()
            .map(|d| Left {
                dir: d.clone(),
                made_by: made_by.clone(),
            })
            .collect();
        self.ledger().append(&lines(root, &left, false))
    }

    /// The directories left and not yet settled that `keep` keeps (given the spelling
    /// of the root each was recorded under and the directory), deepest first, each with
    /// that spelling (for [`LeftDirs::settle`]). Only those kept are copied and sorted:
    /// the ledger holds every folder left that another workflow's files still fill,
    /// which a rollback looking near its own targets has no need to go through.
    pub fn in_root(&self, keep: impl Fn(&str, &Left) -> bool) -> io::Result<Vec<(String, Left)>> {
        let mut ledger = self.ledger();
        ledger.catch_up()?;
        let mut left: Vec<(String, Left)> = ledger
            .left
            .iter()
            .filter(|l| keep(&l.root, &l.left))
            .map(|l| (l.root.clone(), l.left.clone()))
            .collect();
        left.sort_by(|(_, a), (_, b)| {
            let depth = |l: &Left| l.dir.path.matches('/').count();
            depth(b)
                .cmp(&depth(a))
                .then_with(|| a.dir.path.cmp(&b.dir.path))
        });
        Ok(left)
    }

    /// Settles directories of `root`: removed, or no longer the ones that were left.
    pub fn settle(&self, root: &str, left: &[Left]) -> io::Result<()> {
        if left.is_empty() {
            return Ok(());
        }
        let mut ledger = self.ledger();
        ledger.append(&lines(root, left, true))?;
        ledger.compact()
    }
}

fn lines(root: &str, left: &[Left], gone: bool) -> Vec<Line> {
    left.iter()
        .map(|l| Line {
            root: root.to_owned(),
            left: l.clone(),
            gone,
        })
        .collect()
}
