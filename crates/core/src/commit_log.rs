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
//! the log, and what it held was never reported done.

use crate::hash::sha256_hex;
use crate::recovery::InflightRecord;
use crate::snapshot::SnapshotMeta;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = b"ALC1";
/// `MAGIC`, header length (u32), backup length (u64, `u64::MAX` for none), new length
/// (u64), SHA-256 of everything after the prefix.
const PREFIX: usize = 4 + 4 + 8 + 8 + 32;
const NO_BACKUP: u64 = u64::MAX;

/// Entries whose backup and new bytes together exceed this go through a whole-filesystem
/// sync instead: appending them would write large files twice.
pub const MAX_LOGGED_BYTES: usize = 64 * 1024;

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
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    record: InflightRecord,
    meta: SnapshotMeta,
}

impl CommitEntry {
    /// The entry as appended to the log.
    pub fn encode(&self) -> Vec<u8> {
        encode(
            &self.record,
            &self.meta,
            self.backup.as_deref(),
            &self.bytes,
        )
    }

    /// The entries of a log, oldest first, up to the first torn or damaged one.
    pub fn decode_all(mut log: &[u8]) -> Vec<CommitEntry> {
        let mut out = Vec::new();
        while let Some((entry, rest)) = Self::decode_one(log) {
            out.push(entry);
            log = rest;
        }
        if !log.is_empty() {
            tracing::warn!(
                bytes = log.len(),
                "a commit log ends with a torn or damaged entry, ignored"
            );
        }
        out
    }

    fn decode_one(log: &[u8]) -> Option<(CommitEntry, &[u8])> {
        if log.len() < PREFIX || &log[..4] != MAGIC {
            return None;
        }
        let header_len = u32::from_le_bytes(log[4..8].try_into().ok()?) as usize;
        let backup_len = u64::from_le_bytes(log[8..16].try_into().ok()?);
        let bytes_len = usize::try_from(u64::from_le_bytes(log[16..24].try_into().ok()?)).ok()?;
        let backup_size = if backup_len == NO_BACKUP {
            0
        } else {
            usize::try_from(backup_len).ok()?
        };
        let body_len = header_len
            .checked_add(backup_size)?
            .checked_add(bytes_len)?;
        let body = log.get(PREFIX..PREFIX.checked_add(body_len)?)?;
        if sha2_digest(body)[..] != log[24..PREFIX] {
            return None;
        }
        let header: Header = serde_json::from_slice(&body[..header_len]).ok()?;
        let backup =
            (backup_len != NO_BACKUP).then(|| body[header_len..header_len + backup_size].to_vec());
        let entry = CommitEntry {
            record: header.record,
            meta: header.meta,
            backup,
            bytes: body[header_len + backup_size..].to_vec(),
        };
        // An entry must describe a finishable write: a commit record whose checksum the
        // new bytes have.
        let commit = entry.meta.commit.as_ref()?;
        if sha256_hex(&entry.bytes) != commit.after_sha256 {
            return None;
        }
        Some((entry, &log[PREFIX + body_len..]))
    }
}

/// The log entry of a commit, from borrowed parts (see [`CommitEntry`]).
pub fn encode(
    record: &InflightRecord,
    meta: &SnapshotMeta,
    backup: Option<&[u8]>,
    bytes: &[u8],
) -> Vec<u8> {
    #[derive(Serialize)]
    struct HeaderRef<'a> {
        record: &'a InflightRecord,
        meta: &'a SnapshotMeta,
    }
    let header = serde_json::to_vec(&HeaderRef { record, meta }).unwrap_or_default();
    let backup_bytes = backup.unwrap_or_default();
    let mut out = Vec::with_capacity(PREFIX + header.len() + backup_bytes.len() + bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    let backup_len = backup.map_or(NO_BACKUP, |b| b.len() as u64);
    out.extend_from_slice(&backup_len.to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(&header);
    out.extend_from_slice(backup_bytes);
    out.extend_from_slice(bytes);
    let digest = sha2_digest(&out[PREFIX..]);
    out[24..PREFIX].copy_from_slice(&digest);
    out
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
            },
            meta,
            backup: backup.map(<[u8]>::to_vec),
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn entries_round_trip_and_a_torn_tail_ends_the_log() {
        let a = entry(Some(b"old"), b"new bytes");
        let b = entry(None, b"");
        let c = entry(Some(b""), b"third");
        let mut log = [a.encode(), b.encode(), c.encode()].concat();
        assert_eq!(CommitEntry::decode_all(&log), vec![a.clone(), b.clone(), c]);
        log.truncate(log.len() - 1);
        assert_eq!(CommitEntry::decode_all(&log), vec![a.clone(), b]);
        // A flipped byte in the middle entry ends the log there.
        let mut log = [a.encode(), entry(None, b"xyz").encode()].concat();
        let n = log.len();
        log[n - 2] ^= 1;
        assert_eq!(CommitEntry::decode_all(&log), vec![a]);
        assert!(CommitEntry::decode_all(b"garbage").is_empty());
    }
}
