//! A workflow's commit log (`batched` durability): `inflight/{workflow}.log` in the state
//! directory. A small file write commits by appending one entry — its run record, its
//! snapshot's metadata (with the commit record), the backup and the new bytes — and one
//! `fdatasync` of this one file, instead of syncing the whole filesystem. The snapshot
//! folder, the target and the logs follow in memory; a later sync point (a whole-filesystem
//! sync) makes them durable and empties the log. Start-up recovery replays what a log still
//! holds, so a power cut between the two loses nothing an action reported done.
//!
//! Only a holder of the workflow's lock appends to or empties its log, so processes never
//! interleave entries. An entry is framed and checksummed: a torn or damaged tail ends
//! the log, and what it held was never reported done. The file is allocated ahead (zeros)
//! and a header in its first sector says where the entries end and which generation they
//! belong to, so an append changes neither the file's size nor its blocks.
//!
//! An append needs no directory sync. Emptying the log starts a new generation, so stale
//! entries past the end are never read again. Keeping some entries only (those for a root
//! not configured now, after a replay) writes them after the others as a new generation,
//! syncs, and then switches the header to them in one sector write, so a crash keeps either
//! all the entries or just those. A workflow's first commit creates its log and is a sync
//! point instead, which makes the new file durable with everything else (many workflows
//! commit only once or twice). Entries are synced one at a time, so only the last can be
//! torn. Only small writes (backup and new bytes up to 64 KiB together) are logged: a log
//! would write a larger one's bytes twice.

use crate::confine::state::CommitLogFile as File;
use crate::hash::sha256_hex;
use crate::recovery::InflightRecord;
use crate::snapshot::SnapshotMeta;
use serde::{Deserialize, Serialize};
use std::io;

/// The log's header: `HEAD_MAGIC`, generation (u64), end (u64), start (u64), then the
/// first 8 bytes of the SHA-256 of those 28 bytes. It lies in the first sector, which a
/// device writes whole.
const HEAD_MAGIC: &[u8; 4] = b"ALC3";
/// The first header format, without a start (its entries start after the header).
const HEAD_MAGIC_V1: &[u8; 4] = b"ALCL";
const HEAD_LEN: u64 = 64;
const FRAME_MAGIC: &[u8; 4] = b"ALC2";
/// `FRAME_MAGIC`, generation (u64), header length (u32), backup length (u64, `u64::MAX`
/// for none), new length (u64), SHA-256 of the generation, the lengths and the body.
const PREFIX: usize = 4 + 8 + 4 + 8 + 8 + 32;
const NO_BACKUP: u64 = u64::MAX;
/// The file is written with zeros ahead of use, in steps of this size, so that an append
/// overwrites allocated blocks and leaves the size alone: its `fdatasync` then writes
/// the entry and the header, and no allocation. Sync points empty a log every few dozen
/// commits, so a log rarely grows past one step.
const GROWTH: u64 = 64 * 1024;
/// A new log's size: room for a first small entry only, since many workflows commit
/// once or twice.
const INITIAL: u64 = 8 * 1024;

/// Entries whose backup and new bytes together exceed this go through a whole-filesystem
/// sync instead: appending them would write large files twice.
pub const MAX_LOGGED_BYTES: usize = 64 * 1024;

/// A log never holds entries past this offset: a commit that would take it further
/// syncs instead (as a workflow's first commit does). A header counting more entries
/// than that is not one the runtime wrote, and its entries are not read.
pub const MAX_LOG_BYTES: u64 = 64 << 20;

/// The most bytes an entry's JSON header (its run record and snapshot metadata) takes: an
/// entry whose header would be longer is not logged, and a frame claiming more is no
/// entry (it is not hashed to find out).
const MAX_HEADER: usize = 256 << 10;

/// The longest frame an entry makes.
const MAX_FRAME: u64 = (PREFIX + MAX_HEADER + MAX_LOGGED_BYTES) as u64;

/// How many bytes [`checked_entry_after`] hashes at most: bytes that only look like
/// frames, as many as a hostile file may hold, do not keep a start busy for minutes.
const MAX_SCANNED: usize = 64 << 20;

/// Where a log's entries end, and their generation. Emptying a log starts a new
/// generation: entries of an older one left past the end are never read again, and a
/// position taken before the log was emptied never matches one taken after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The current generation.
    pub generation: u64,
    /// The offset of the first entry.
    pub start: u64,
    /// The offset after the last entry.
    pub end: u64,
}

impl Position {
    /// An empty log of a new generation.
    fn emptied() -> Self {
        Self {
            generation: new_generation(),
            start: HEAD_LEN,
            end: HEAD_LEN,
        }
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// One committed file write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitEntry {
    /// The run that made it (state `active`).
    pub record: InflightRecord,
    /// Its snapshot's metadata, whose `commit` says how to finish it.
    pub meta: SnapshotMeta,
    /// The target's bytes before, for a replaced file.
    pub backup: Option<Vec<u8>>,
    /// The target's new bytes.
    pub bytes: Vec<u8>,
    /// The staged file that took the target's place, as written, when it was known: a
    /// target still that very file, unwritten since, yet holding other bytes lost them to
    /// a power cut (its name reached the disk, its data did not), and gets the entry's
    /// bytes.
    pub staged: Option<crate::confine::WrittenFile>,
}

impl CommitEntry {
    /// The entry as [`append`] takes it.
    pub fn as_new(&self) -> NewEntry<'_> {
        NewEntry {
            record: &self.record,
            meta: &self.meta,
            backup: self.backup.as_deref(),
            bytes: &self.bytes,
            staged: self.staged,
        }
    }
}

/// An entry to append: what a [`CommitEntry`] holds, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct NewEntry<'a> {
    /// The run that makes it.
    pub record: &'a InflightRecord,
    /// Its snapshot's metadata.
    pub meta: &'a SnapshotMeta,
    /// The target's bytes before, for a replaced file.
    pub backup: Option<&'a [u8]>,
    /// The target's new bytes.
    pub bytes: &'a [u8],
    /// The staged file as written (see [`CommitEntry::staged`]).
    pub staged: Option<crate::confine::WrittenFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    record: InflightRecord,
    meta: SnapshotMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    staged: Option<crate::confine::WrittenFile>,
}

fn new_generation() -> u64 {
    let d = sha2_digest(crate::ids::unique().as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

fn encode_head(p: Position) -> [u8; HEAD_LEN as usize] {
    let mut h = [0u8; HEAD_LEN as usize];
    h[..4].copy_from_slice(HEAD_MAGIC);
    h[4..12].copy_from_slice(&p.generation.to_le_bytes());
    h[12..20].copy_from_slice(&p.end.to_le_bytes());
    h[20..28].copy_from_slice(&p.start.to_le_bytes());
    let d = sha2_digest(&h[..28]);
    h[28..36].copy_from_slice(&d[..8]);
    h
}

fn decode_head(h: &[u8]) -> Option<Position> {
    let word = |at: usize| Some(u64::from_le_bytes(h.get(at..at + 8)?.try_into().ok()?));
    let (start, sealed) = match h.get(..4)? {
        m if m == HEAD_MAGIC => (word(20)?, 28),
        m if m == HEAD_MAGIC_V1 => (HEAD_LEN, 20),
        _ => return None,
    };
    if sha2_digest(&h[..sealed])[..8] != *h.get(sealed..sealed + 8)? || start < HEAD_LEN {
        return None;
    }
    Some(Position {
        generation: word(4)?,
        start,
        end: word(12)?,
    })
}

/// Prepares a new, empty log file: header and zeros, not synced (the sync point that
/// follows a workflow's first commit makes it durable, with its directory entry).
pub fn initialize(file: &File) -> io::Result<Position> {
    let p = Position::emptied();
    file.write_all_at(&encode_head(p), 0)?;
    grow(file, INITIAL)?;
    Ok(p)
}

/// Writes zeros up to `size`, so that later appends find their blocks allocated.
fn grow(file: &File, size: u64) -> io::Result<()> {
    let from = file.len()?.max(HEAD_LEN);
    if from < size {
        file.write_all_at(&vec![0; (size - from) as usize], from)?;
    }
    Ok(())
}

/// The log's position; `None` when its header is unreadable (no log written it).
pub fn position(file: &File) -> io::Result<Option<Position>> {
    let mut h = [0u8; 36];
    match file.read_exact_at(&mut h, 0) {
        Ok(()) => Ok(decode_head(&h)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Appends one entry and syncs the log; returns the new position. Call with the
/// workflow's lock held. On failure the header is put back and the frame spoiled, so
/// the entry is not in the log.
/// `None`, with nothing written, when the entry would take the log past
/// [`MAX_LOG_BYTES`] or its header past 256 KiB: the commit syncs instead.
pub fn append(file: &File, entry: &NewEntry<'_>) -> io::Result<Option<Position>> {
    let at = match position(file)? {
        Some(p) => p,
        None => initialize(file)?,
    };
    let frame = encode(at.generation, entry);
    let next = Position {
        end: at.end + frame.len() as u64,
        ..at
    };
    // Nor a frame a reader would not take.
    if next.end > MAX_LOG_BYTES || frame_lens(&frame).is_none() {
        return Ok(None);
    }
    let size = file.len()?;
    if next.end > size {
        grow(file, next.end.div_ceil(GROWTH) * GROWTH)?;
    }
    let written = file
        .write_all_at(&frame, at.end)
        .and_then(|()| file.write_all_at(&encode_head(next), 0))
        .and_then(|()| file.sync_data());
    if let Err(e) = written {
        // Entries are read past the header's end, so the frame itself is spoiled too.
        let _ = file.write_all_at(&[0; 4], at.end);
        let _ = file.write_all_at(&encode_head(at), 0);
        // Tried durably too: the frame may have reached the disk before the sync failed,
        // and a replay after a power cut would do the write its caller was told failed.
        let _ = file.sync_data();
        return Err(e);
    }
    Ok(Some(next))
}

/// Empties the log, durably (a new generation): what it held must be durable elsewhere
/// first. Call with the workflow's lock held.
pub fn clear(file: &File) -> io::Result<()> {
    file.write_all_at(&encode_head(Position::emptied()), 0)?;
    file.sync_data()
}

/// Keeps only `keep` (entries read from this log) and drops the others, so that a crash
/// at any point leaves either all the entries or just those: `keep` is written as a new
/// generation after everything the log holds and synced, then one header write switches
/// to it. Call with the workflow's lock held.
pub fn retain(file: &File, keep: &[CommitEntry]) -> io::Result<()> {
    if keep.is_empty() {
        return clear(file);
    }
    let next = write_retained(file, keep)?;
    file.write_all_at(&encode_head(next), 0)?;
    file.sync_data()
}

/// The first half of [`retain`]: `keep` written, synced, and not yet the log's entries.
fn write_retained(file: &File, keep: &[CommitEntry]) -> io::Result<Position> {
    let (at, _, read_end) = read_span(file)?;
    let generation = new_generation();
    let mut frames = Vec::new();
    for e in keep {
        frames.extend(encode(generation, &e.as_new()));
    }
    // Clear of the entries the header counts and of any it lost count of, which a crash
    // before the switch must still find: before them when there is room (the space the
    // generation before them took), else after them. So a log kept again and again,
    // at every start that lacks one of its roots, takes twice its entries at most.
    let start = match at {
        None => HEAD_LEN,
        Some(p) if frames.len() as u64 <= p.start - HEAD_LEN => HEAD_LEN,
        Some(p) => p.end.max(read_end),
    };
    let next = Position {
        generation,
        start,
        end: start + frames.len() as u64,
    };
    grow(file, next.end.div_ceil(GROWTH) * GROWTH)?;
    file.write_all_at(&frames, start)?;
    file.sync_data()?;
    Ok(next)
}

/// The log's entries of the current generation, oldest first, up to the first torn or
/// damaged one. They are read past the header's end too: a power cut may keep an entry
/// and lose the header write that counted it.
pub fn read(file: &File) -> io::Result<Vec<CommitEntry>> {
    read_span(file).map(|(_, entries, _)| entries)
}

/// The header's position, the entries, and the offset after the last one read.
fn read_span(file: &File) -> io::Result<(Option<Position>, Vec<CommitEntry>, u64)> {
    let Some(at) = position(file)? else {
        return Ok((None, Vec::new(), HEAD_LEN));
    };
    if at.is_empty() {
        // The usual case, checked without reading the file: an entry whose header write
        // was lost would start right here.
        let mut prefix = [0u8; 12];
        let none = Ok((Some(at), Vec::new(), at.end));
        match file.read_exact_at(&mut prefix, at.end) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return none,
            Err(e) => return Err(e),
        }
        if &prefix[..4] != FRAME_MAGIC || prefix[4..12] != at.generation.to_le_bytes() {
            return none;
        }
    }
    // The generation's entries: those its header counts (appends stop at MAX_LOG_BYTES,
    // and a retained generation holds what one held), and one more at most, appended
    // when a power cut lost the header write that counted it. What lies further is
    // zeros written ahead or other generations' entries, never read.
    let counted = at.end.saturating_sub(at.start);
    if counted > MAX_LOG_BYTES + MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "its header counts {counted} bytes of entries, more than a log of the runtime ever holds ({}), so it is not the runtime's own; nothing of it is read, replayed or emptied: put back the runtime's own log, or move it away to go on without the writes it holds",
                MAX_LOG_BYTES + MAX_FRAME
            ),
        ));
    }
    let end = file.len()?.min(at.end.saturating_add(MAX_FRAME));
    let mut buf = vec![0u8; end.saturating_sub(at.start) as usize];
    file.read_exact_at(&mut buf, at.start)?;
    let (entries, used) = decode_all(at.generation, &buf);
    // Appends are synced one at a time, so a crash can only tear the last entry: one
    // that does not check out with an entry that does after it was damaged or changed
    // since. Read as the log's end, the acknowledged writes after it would be dropped
    // without a word.
    if checked_entry_after(at.generation, &buf[used..]) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "its entry at byte {} does not check out while a later one does, so it was damaged or changed by something other than the runtime (a crash only ever tears the last entry); nothing of it is replayed or emptied: put back the runtime's own log, or move it away to go on without the writes it holds",
                at.start + used as u64
            ),
        ));
    }
    Ok((Some(at), entries, at.start + used as u64))
}

/// Whether an entry of `generation` that checks out starts anywhere in `rest` after its
/// first byte.
fn checked_entry_after(generation: u64, rest: &[u8]) -> bool {
    let mut tag = [0u8; 12];
    tag[..4].copy_from_slice(FRAME_MAGIC);
    tag[4..].copy_from_slice(&generation.to_le_bytes());
    let mut scanned = 0usize;
    for i in 1..rest.len().saturating_sub(PREFIX - 1) {
        if !rest[i..].starts_with(&tag) {
            continue;
        }
        if scanned > MAX_SCANNED {
            // Only a hand-made file holds that many look-alikes: a crash tears one entry,
            // and bytes of other generations carry other tags.
            tracing::warn!(
                "a commit log holds more bytes that look like entries after a damaged one than are checked; the entries before it are read as the log"
            );
            return false;
        }
        scanned += claimed_frame_len(&rest[i..]);
        if decode_one(generation, &rest[i..]).is_some() {
            return true;
        }
    }
    false
}

/// The length a frame's prefix claims, as far as [`decode_one`] would hash it (nothing
/// when the frame could not be an entry).
fn claimed_frame_len(log: &[u8]) -> usize {
    frame_lens(log).map_or(0, |(header, backup, bytes)| {
        PREFIX + header + backup.unwrap_or(0) + bytes
    })
}

/// A frame's header length, backup length (`None`: no backup) and new bytes' length,
/// when its prefix is whole and within the bounds an entry keeps.
fn frame_lens(log: &[u8]) -> Option<(usize, Option<usize>, usize)> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(log.get(at..at + 8)?.try_into().ok()?))
    };
    let header_len = u32::from_le_bytes(log.get(12..16)?.try_into().ok()?) as usize;
    let backup = match word(16)? {
        NO_BACKUP => None,
        len => Some(usize::try_from(len).ok()?),
    };
    let bytes = usize::try_from(word(24)?).ok()?;
    let data = backup.unwrap_or(0).checked_add(bytes)?;
    (header_len <= MAX_HEADER && data <= MAX_LOGGED_BYTES).then_some((header_len, backup, bytes))
}

/// The log entry of a commit.
fn encode(generation: u64, e: &NewEntry<'_>) -> Vec<u8> {
    let NewEntry {
        record,
        meta,
        backup,
        bytes,
        staged,
    } = *e;
    #[derive(Serialize)]
    struct HeaderRef<'a> {
        record: &'a InflightRecord,
        meta: &'a SnapshotMeta,
        #[serde(skip_serializing_if = "Option::is_none")]
        staged: Option<crate::confine::WrittenFile>,
    }
    let header = serde_json::to_vec(&HeaderRef {
        record,
        meta,
        staged,
    })
    .unwrap_or_default();
    let backup_bytes = backup.unwrap_or_default();
    let mut out = Vec::with_capacity(PREFIX + header.len() + backup_bytes.len() + bytes.len());
    out.extend_from_slice(FRAME_MAGIC);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    let backup_len = backup.map_or(NO_BACKUP, |b| b.len() as u64);
    out.extend_from_slice(&backup_len.to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(&header);
    out.extend_from_slice(backup_bytes);
    out.extend_from_slice(bytes);
    let digest = checksum(&out);
    out[PREFIX - 32..PREFIX].copy_from_slice(&digest);
    out
}

/// SHA-256 of a frame's generation, lengths and body (everything but the magic and the
/// checksum itself).
fn checksum(frame: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(&frame[4..PREFIX - 32]);
    h.update(&frame[PREFIX..]);
    h.finalize().into()
}

/// The entries, and how many bytes they take.
fn decode_all(generation: u64, log: &[u8]) -> (Vec<CommitEntry>, usize) {
    let mut out = Vec::new();
    let mut rest = log;
    while let Some((entry, after)) = decode_one(generation, rest) {
        out.push(entry);
        rest = after;
    }
    (out, log.len() - rest.len())
}

fn decode_one(generation: u64, log: &[u8]) -> Option<(CommitEntry, &[u8])> {
    if log.len() < PREFIX || &log[..4] != FRAME_MAGIC {
        return None;
    }
    let word =
        |at: usize| -> Option<u64> { Some(u64::from_le_bytes(log[at..at + 8].try_into().ok()?)) };
    if word(4)? != generation {
        return None;
    }
    // Checked before anything is hashed: no entry is longer.
    let (header_len, backup, bytes_len) = frame_lens(log)?;
    let backup_size = backup.unwrap_or(0);
    let frame = log.get(..PREFIX + header_len + backup_size + bytes_len)?;
    if checksum(frame)[..] != frame[PREFIX - 32..PREFIX] {
        return None;
    }
    let body = &frame[PREFIX..];
    let header: Header = serde_json::from_slice(&body[..header_len]).ok()?;
    let entry = CommitEntry {
        record: header.record,
        meta: header.meta,
        backup: backup.map(|_| body[header_len..header_len + backup_size].to_vec()),
        bytes: body[header_len + backup_size..].to_vec(),
        staged: header.staged,
    };
    // An entry must describe a finishable write: a commit record whose checksum the
    // new bytes have.
    let commit = entry.meta.commit.as_ref()?;
    if sha256_hex(&entry.bytes) != commit.after_sha256 {
        return None;
    }
    Some((entry, &log[frame.len()..]))
}

fn sha2_digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(backup: Option<&[u8]>, bytes: &[u8]) -> CommitEntry {
        let parsed = serde_json::from_value::<SnapshotMeta>(serde_json::json!({
            "format": 1, "snapshot_id": "s1", "workflow_id": "wf", "action_id": "a1",
            "execution_id": "ex", "root": "/r", "original_path": "f.txt", "existed": true,
            "kind": "file", "size_bytes": 3, "sha256": null, "mode": 420,
            "intent": "replace_file", "mutation_class": "replace", "created_dirs": [],
            "taken_at": "t",
            "commit": {"staged_name": ".ailab-tmp-x", "after_sha256": sha256_hex(bytes),
                "no_replace": false, "artifact": null, "audit": {
                    "timestamp": "t", "execution_id": "ex", "workflow_id": "wf",
                    "action_id": "a1", "mutation_class": "replace",
                    "mutation_type": "replace_file", "target_path": "/r/f.txt",
                    "before_checksum": null, "after_checksum": null,
                    "rollback_available": true, "rollback_path": null, "status": "success",
                    "reason_code": null, "error": null}}
        }));
        let Ok(meta) = parsed else {
            panic!("test metadata: {parsed:?}")
        };
        CommitEntry {
            record: InflightRecord {
                state: "active".into(),
                execution_id: "ex".into(),
                workflow_id: "wf".into(),
                started_at: "t".into(),
                finished: false,
                boot: None,
                recovered_by: Vec::new(),
                roots: Vec::new(),
                rollback_recovered_at: None,
                forced: None,
                restoring: None,
            },
            meta,
            backup: backup.map(<[u8]>::to_vec),
            bytes: bytes.to_vec(),
            staged: None,
        }
    }

    fn append_entry(f: &File, e: &CommitEntry) -> Position {
        match append(f, &e.as_new()) {
            Ok(Some(p)) => p,
            Ok(None) => panic!("append: no room"),
            Err(err) => panic!("append: {err}"),
        }
    }

    fn entries(f: &File) -> Vec<CommitEntry> {
        read(f).unwrap_or_else(|e| panic!("read: {e}"))
    }

    fn log_file() -> (tempfile::TempDir, File) {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("tempdir")
        };
        let state = crate::confine::state::StateDir::open(dir.path());
        let Ok(f) = state.and_then(|s| s.commit_log_create("wf")) else {
            panic!("open")
        };
        (dir, f)
    }

    #[test]
    fn entries_round_trip_in_place_and_a_new_generation_hides_the_old() {
        let (_dir, f) = log_file();
        assert!(entries(&f).is_empty());
        let (a, b, c) = (
            entry(Some(b"old"), b"new bytes"),
            entry(None, b""),
            entry(Some(b""), b"third"),
        );
        let p1 = append_entry(&f, &a);
        let size = f.len().ok();
        append_entry(&f, &b);
        let p3 = append_entry(&f, &c);
        assert_eq!(entries(&f), vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(f.len().ok(), size, "appends keep the size");
        assert_eq!(p1.generation, p3.generation);
        assert!(!p3.is_empty());

        // Emptied: a new generation; what is appended next is all that is read.
        assert!(clear(&f).is_ok());
        let p = position(&f).ok().flatten();
        assert!(p.is_some_and(|p| p.is_empty() && p.generation != p3.generation));
        assert!(entries(&f).is_empty());
        append_entry(&f, &b);
        assert_eq!(entries(&f), vec![b.clone()]);

        // An entry whose header update was lost is still read.
        let before = position(&f).ok().flatten();
        append_entry(&f, &a);
        if let Some(before) = before {
            assert!(f.write_all_at(&encode_head(before), 0).is_ok());
        }
        assert_eq!(entries(&f), vec![b.clone(), a.clone()]);

        // A damaged byte ends the log at that entry.
        let at = p1.end - 1;
        assert!(clear(&f).is_ok());
        append_entry(&f, &a);
        append_entry(&f, &c);
        let mut byte = [0u8; 1];
        assert!(f.read_exact_at(&mut byte, at + 10).is_ok());
        assert!(f.write_all_at(&[byte[0] ^ 1], at + 10).is_ok());
        assert_eq!(entries(&f), vec![a]);
    }

    /// Only the last entry can be torn by a crash: a damaged one before entries that
    /// check out is refused, not read as the end of the log.
    #[test]
    fn a_damaged_entry_before_sound_ones_is_refused_and_a_torn_last_one_ends_the_log() {
        let flip = |f: &File, at: u64| {
            let mut b = [0u8; 1];
            assert!(f.read_exact_at(&mut b, at).is_ok());
            assert!(f.write_all_at(&[b[0] ^ 1], at).is_ok());
        };
        let (_dir, f) = log_file();
        let p1 = append_entry(&f, &entry(Some(b"old"), b"one"));
        let p2 = append_entry(&f, &entry(Some(b"one"), b"two"));
        let p3 = append_entry(&f, &entry(Some(b"two"), b"three"));
        // The last entry's last byte: the log ends before it.
        flip(&f, p3.end - 1);
        assert_eq!(entries(&f).len(), 2);
        flip(&f, p3.end - 1);
        assert_eq!(entries(&f).len(), 3);
        // The middle one's last byte: two entries would be dropped.
        flip(&f, p2.end - 1);
        match read(&f) {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                assert!(
                    e.to_string().contains(&format!("entry at byte {}", p1.end)),
                    "{e}"
                );
            }
            Ok(got) => panic!("read {} entries", got.len()),
        }
    }

    /// Appends stop where a log must end, so that a reader may refuse a header counting
    /// more without allocating what it claims (terabytes, say); what lies past the
    /// entries (a sparse file of terabytes) is never read.
    #[test]
    fn a_log_stays_within_its_bound_and_a_header_counting_more_is_refused() {
        let (_dir, f) = log_file();
        let e = entry(None, &[b'x'; MAX_LOGGED_BYTES]);
        let mut appended = 0;
        while append(&f, &e.as_new())
            .unwrap_or_else(|err| panic!("append: {err}"))
            .is_some()
        {
            appended += 1;
            assert!(appended < 2000, "the log never filled");
        }
        let Ok(Some(at)) = position(&f) else {
            panic!("no position")
        };
        assert!(at.end <= MAX_LOG_BYTES && at.end + 2 * (MAX_LOGGED_BYTES as u64) > MAX_LOG_BYTES);
        assert_eq!(entries(&f).len(), appended);
        assert!(f.write_all_at(&[0], (1 << 42) - 1).is_ok());
        assert_eq!(entries(&f).len(), appended);
        let forged = Position { end: 1 << 42, ..at };
        assert!(f.write_all_at(&encode_head(forged), 0).is_ok());
        match read(&f) {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                assert!(e.to_string().contains("counts 4398046511040 bytes"), "{e}");
            }
            Ok(got) => panic!("read {} entries", got.len()),
        }
    }

    /// A log kept again and again (each start that lacks one of its roots keeps the
    /// entries for it) reuses the space its generation before last took: it grew by a
    /// copy each time, without bound.
    #[test]
    fn a_log_retained_again_and_again_stays_within_twice_its_entries() {
        let (_dir, f) = log_file();
        let kept = [entry(None, &[b'a'; 4000]), entry(None, &[b'b'; 4000])];
        for e in &kept {
            append_entry(&f, e);
        }
        let last = append_entry(&f, &entry(None, &[b'c'; 4000]));
        for round in 0..12 {
            assert!(retain(&f, &kept).is_ok(), "round {round}");
            assert_eq!(entries(&f), kept, "round {round}");
            let Ok(Some(at)) = position(&f) else {
                panic!("no position")
            };
            assert!(
                at.end <= 2 * last.end,
                "round {round}: {at:?} against {last:?}"
            );
        }
    }

    /// Bytes that look like frames of the generation after a damaged entry, each claiming
    /// a long body, are hashed up to a bound: a sound entry past that bound is not looked
    /// for (a hand-made file; a crash leaves nothing of the kind).
    #[test]
    fn the_search_for_an_entry_after_a_damaged_one_is_bounded() {
        let generation = 7u64;
        let mut tag = Vec::from(&FRAME_MAGIC[..]);
        tag.extend_from_slice(&generation.to_le_bytes());
        let look_alike = |claimed: usize| {
            let mut f = tag.clone();
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend_from_slice(&NO_BACKUP.to_le_bytes());
            f.extend_from_slice(&(claimed as u64).to_le_bytes());
            f.resize(64, 0);
            f
        };
        let e = entry(None, b"sound");
        let sound = encode(generation, &e.as_new());
        let with = |look_alikes: usize| {
            let mut rest = vec![0u8];
            for _ in 0..look_alikes {
                rest.extend(look_alike(MAX_LOGGED_BYTES));
            }
            rest.extend(&sound);
            // Room for the last look-alike's claimed body, so that it is hashed.
            rest.resize(rest.len() + MAX_LOGGED_BYTES + PREFIX, 0);
            rest
        };
        assert!(checked_entry_after(generation, &with(16)));
        let past_bound = MAX_SCANNED / MAX_LOGGED_BYTES + 2;
        assert!(!checked_entry_after(generation, &with(past_bound)));
        // A claim longer than any entry is not hashed at all, so it costs nothing.
        assert_eq!(claimed_frame_len(&look_alike(MAX_LOGGED_BYTES + 1)), 0);
    }

    #[test]
    fn retaining_entries_is_all_or_nothing() {
        let (_dir, f) = log_file();
        let (a, b, c, d) = (
            entry(Some(b"old"), b"a"),
            entry(None, b"b"),
            entry(Some(b""), b"c"),
            entry(None, b"d"),
        );
        append_entry(&f, &a);
        append_entry(&f, &b);
        let counted = position(&f).ok().flatten();
        // One entry whose header write was lost: the log still holds it.
        append_entry(&f, &c);
        if let Some(p) = counted {
            assert!(f.write_all_at(&encode_head(p), 0).is_ok());
        }
        let all = vec![a.clone(), b.clone(), c.clone()];
        assert_eq!(entries(&f), all);

        // A crash after the kept entries are written and before the switch: every entry
        // is still there, the uncounted one too.
        let staged = write_retained(&f, &[b.clone(), c.clone()]);
        assert!(staged.is_ok_and(|p| !p.is_empty()));
        assert_eq!(entries(&f), all);

        assert!(retain(&f, &[b.clone(), c.clone()]).is_ok());
        assert_eq!(entries(&f), vec![b.clone(), c.clone()]);
        append_entry(&f, &d);
        assert_eq!(entries(&f), vec![b.clone(), c, d.clone()]);
        assert!(retain(&f, &[]).is_ok());
        assert!(entries(&f).is_empty());
        assert!(position(&f).is_ok_and(|p| p.is_some_and(|p| p.start == HEAD_LEN)));
        append_entry(&f, &b);
        assert_eq!(entries(&f), vec![b]);
    }

    #[test]
    fn a_log_with_a_first_format_header_is_read() {
        let (_dir, f) = log_file();
        let a = entry(None, b"a");
        let Ok(Some(p)) = position(&f) else {
            panic!("a new log has a header")
        };
        let mut h = [0u8; HEAD_LEN as usize];
        h[..4].copy_from_slice(HEAD_MAGIC_V1);
        h[4..12].copy_from_slice(&p.generation.to_le_bytes());
        h[12..20].copy_from_slice(&HEAD_LEN.to_le_bytes());
        let digest = sha2_digest(&h[..20]);
        h[20..28].copy_from_slice(&digest[..8]);
        assert!(f.write_all_at(&h, 0).is_ok());
        assert_eq!(position(&f).ok().flatten(), Some(p));
        append_entry(&f, &a);
        assert_eq!(entries(&f), vec![a]);
    }

    #[test]
    fn a_file_without_a_header_holds_no_entry() {
        let (_dir, f) = log_file();
        assert!(f.write_all_at(b"garbage that is not a log", 0).is_ok());
        assert_eq!(position(&f).ok(), Some(None));
        assert!(entries(&f).is_empty());
    }
}
