//! The audit trail: every action (executed, simulated, blocked, failed, rolled back) as
//! one JSONL line in `sandbox_audit.jsonl`, chained by SHA-256 (`seq`, `prev_hash`,
//! `entry_hash`) so an edited, removed or reordered line is found by [`AuditLog::verify`].
//! The chain's head is also kept in `sandbox_audit.head.json`, outside the log, so a cut
//! tail is found too.
//!
//! The head is rewritten in place but never synced, and moves only over lines that are
//! durable: it can only lag the log, never lead it. It is read and written only under the
//! log's file lock (`audit verify` reads it under the same lock as the log), and each
//! append checks the log against it under that lock first. Under `strict` it moves as soon
//! as the append's sync has finished, after reading the lines back: lines cut while they
//! synced (and replaced by another writer's) set the head to the entry that was cut, so the
//! cut stays visible to every check. Under `batched` it moves at sync points; under
//! `relaxed`, after the log's own `fdatasync` every 64 appends and at exit, so that a power
//! cut that loses unsynced lines is not mistaken for tampering. A new log gets its head
//! (seq 0, durable) before its first line, so a missing head always means a removed one.
//! Once the log no longer matches its head (a cut tail, a rewritten entry, a head removed
//! or damaged) the head is never written again, so `audit verify` keeps reporting it
//! however many lines follow, and the next start says so in its notices.

use crate::catalog::MutationClass;
use crate::confine::state::{BLOCK, BlockFile, LogFile, StateDir};
use crate::failpoint::FailPoints;
use crate::hash::to_hex;
use crate::journal::Journal;
use crate::reason::ReasonCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::io;
use std::sync::{Arc, Mutex};

mod index;
mod verify;

pub use index::Ending;
pub(crate) use index::changes_after;
use index::{
    ANY_TIME, Index, LineView, Reader, Slot, is_change_after, name_of, read_back, time_key,
};
use verify::TrailCheck;
pub use verify::{
    DONE_WITHOUT_SNAPSHOT, RecordedWrite, UNREGISTERED_DONE, VerifyReport, Writes, records,
    unregistered, verify_read_only,
};
pub(crate) use verify::{with_doubled, with_unlogged, with_unreadable_registry, with_unregistered};

/// Audit log file name.
pub const AUDIT_FILE: &str = "sandbox_audit.jsonl";
/// Head file name.
pub const HEAD_FILE: &str = "sandbox_audit.head.json";
/// `prev_hash` of the first entry.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

wire_enum! {
    /// Outcome recorded for an action, as its line's `status` says it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum AuditStatus {
        /// Written (or rolled back, for a rollback's own line).
        Success = "success",
        /// Writing off or dry-run on: said, not done.
        Simulated = "simulated",
        /// Refused before anything was written.
        Blocked = "blocked",
        /// Tried, and failed; its own change undone.
        Failed = "failed",
        /// Undone: by a rollback, or by its plan when a later action failed.
        RolledBack = "rolled_back",
    }
}

/// One audit line. Field order is the hashing order: a persisted format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct SandboxAuditEntry {
    pub seq: u64,
    pub timestamp: String,
    pub execution_id: String,
    pub workflow_id: String,
    pub action_id: String,
    pub mutation_class: Option<MutationClass>,
    pub mutation_type: String,
    pub target_path: String,
    pub before_checksum: Option<String>,
    pub after_checksum: Option<String>,
    pub rollback_available: bool,
    pub rollback_path: Option<String>,
    pub status: AuditStatus,
    pub reason_code: Option<ReasonCode>,
    pub error: Option<String>,
    pub prev_hash: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub entry_hash: String,
}

/// A `create_directory` that stands: its directory's existence is its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirClaim {
    /// Its workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// When it was recorded.
    pub at: String,
}

/// The longest target path a line records: longer than any a write can have (a root
/// the kernel can open, up to 4,096 bytes, and eight components of 255), so only a
/// refused action's path text is ever cut. Refusals are not budgeted: what they put on
/// the trail, which is kept for good, must be bounded by the runtime, not the sender.
pub const MAX_RECORDED_PATH: usize = 8 * 1024;

/// The longest error a line records: the runtime's sentences are far shorter, but one
/// naming files of the sender's (a refusal listing a workflow's writes) is not.
pub const MAX_RECORDED_ERROR: usize = 8 * 1024;

/// The longest intent a line records (the catalog's are under 32 bytes).
pub const MAX_RECORDED_INTENT: usize = 256;

/// `text`, cut at a character boundary to at most `max` bytes, ending `…` and its
/// length in bytes when cut.
fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mark = format!("… ({} bytes)", text.len());
    let mut end = max.saturating_sub(mark.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &text[..end])
}

/// What a caller records; the log assigns `seq`, `prev_hash` and `entry_hash`.
///
/// Its fields repeat the entry's rather than being `#[serde(flatten)]`ed into it: serde
/// cannot deny unknown fields through a flatten, and the entry must, since a field added
/// to a line would otherwise be dropped when the line is re-serialised for hashing, and
/// the edit would go undetected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct AuditRecord {
    pub timestamp: String,
    pub execution_id: String,
    pub workflow_id: String,
    pub action_id: String,
    pub mutation_class: Option<MutationClass>,
    pub mutation_type: String,
    pub target_path: String,
    pub before_checksum: Option<String>,
    pub after_checksum: Option<String>,
    pub rollback_available: bool,
    pub rollback_path: Option<String>,
    pub status: AuditStatus,
    pub reason_code: Option<ReasonCode>,
    pub error: Option<String>,
}

impl SandboxAuditEntry {
    /// Whether the line records a rollback's restore that was made but not confirmed:
    /// failed, its error beginning [`crate::snapshot::PUT_BACK_UNCONFIRMED`].
    pub(crate) fn is_unconfirmed_restore(&self) -> bool {
        self.mutation_class == Some(MutationClass::Rollback)
            && self.status == AuditStatus::Failed
            && self
                .error
                .as_deref()
                .is_some_and(|t| t.starts_with(crate::snapshot::PUT_BACK_UNCONFIRMED))
    }

    /// SHA-256 over the entry's line as `journal::write_line` writes it, without
    /// `entry_hash` and the newline.
    pub fn compute_hash(&self) -> String {
        self.hash_of(Form::Line)
    }

    fn hash_of(&self, form: Form) -> String {
        let mut copy = self.clone();
        copy.entry_hash = String::new();
        to_hex(&Sha256::digest(form.bytes(&copy)))
    }

    /// Whether the entry's `entry_hash` is the hash of what it says (in either form of
    /// [`Self::is_as_written`]): a line edited without its hash made again fails. The
    /// chain is `audit verify`'s to check; this is for what acts on a few lines.
    pub(crate) fn hash_holds(&self) -> bool {
        [Form::Line, Form::Plain]
            .into_iter()
            .any(|form| self.hash_of(form) == self.entry_hash)
    }

    /// Whether `line` (without its newline) is exactly what the runtime writes for this
    /// entry, and the entry's hash is right: in the current form, or in the form of
    /// trails written before C1 controls and U+2028/U+2029 were escaped.
    fn is_as_written(&self, line: &[u8]) -> bool {
        [Form::Line, Form::Plain]
            .into_iter()
            .any(|form| form.bytes(self) == line && self.hash_of(form) == self.entry_hash)
    }
}

/// A new line's length (with its newline), keyed hash and name keys, as the index keeps
/// them ([`Index::insert`]).
type LineKeys = (usize, u64, (u32, u32));

/// The entries of `records` chained after the last line `index` holds, numbered on from
/// it, with their lines' bytes and each line's [`LineKeys`].
fn chained(
    index: &Index,
    records: Vec<AuditRecord>,
) -> io::Result<(Vec<u8>, Vec<SandboxAuditEntry>, Vec<LineKeys>)> {
    let mut prev = index.last_hash.clone();
    let mut bytes = Vec::new();
    let mut out = Vec::new();
    let mut lens = Vec::new();
    for (seq, r) in (index.last_seq + 1..).zip(records) {
        let mut e = SandboxAuditEntry {
            seq,
            timestamp: r.timestamp,
            execution_id: r.execution_id,
            workflow_id: r.workflow_id,
            action_id: r.action_id,
            mutation_class: r.mutation_class,
            mutation_type: bounded(r.mutation_type, MAX_RECORDED_INTENT),
            target_path: bounded(r.target_path, MAX_RECORDED_PATH),
            before_checksum: r.before_checksum,
            after_checksum: r.after_checksum,
            rollback_available: r.rollback_available,
            rollback_path: r.rollback_path,
            status: r.status,
            reason_code: r.reason_code,
            error: r.error.map(|e| bounded(e, MAX_RECORDED_ERROR)),
            prev_hash: prev.clone(),
            entry_hash: String::new(),
        };
        let before = bytes.len();
        write_hashed_line(&mut bytes, &mut e)?;
        prev = e.entry_hash.clone();
        lens.push((
            bytes.len() - before,
            index.keys.hash_one(&bytes[before..bytes.len() - 1]),
            name_of(&index.keys, e.status, &e.target_path),
        ));
        out.push(e);
    }
    Ok((bytes, out, lens))
}

/// Writes `e`'s line (with its newline) to `out` and sets its `entry_hash`, serialising
/// it once: the hash is over the line without the hash field, which goes last.
fn write_hashed_line(out: &mut Vec<u8>, e: &mut SandboxAuditEntry) -> io::Result<()> {
    e.entry_hash.clear();
    let start = out.len();
    crate::journal::write_line(out, e)?;
    let Some(body) = out
        .len()
        .checked_sub(2)
        .filter(|&end| out[end..] == *b"}\n")
    else {
        return Err(io::Error::other("an audit line did not end as an object"));
    };
    e.entry_hash = to_hex(&Sha256::digest(&out[start..=body]));
    out.truncate(body);
    out.extend_from_slice(b",\"entry_hash\":\"");
    out.extend_from_slice(e.entry_hash.as_bytes());
    out.extend_from_slice(b"\"}\n");
    debug_assert!(e.is_as_written(&out[start..out.len() - 1]));
    Ok(())
}

/// How an entry is turned into the bytes of its line (newline left out).
#[derive(Clone, Copy)]
enum Form {
    /// [`crate::journal::write_line`].
    Line,
    /// Plain compact `serde_json` (earlier trails).
    Plain,
}

impl Form {
    fn bytes(self, e: &SandboxAuditEntry) -> Vec<u8> {
        let mut out = Vec::new();
        let written = match self {
            Form::Line => crate::journal::write_line(&mut out, e).map(|()| {
                out.pop();
            }),
            Form::Plain => serde_json::to_writer(&mut out, e).map_err(io::Error::other),
        };
        if written.is_err() {
            out.clear();
        }
        out
    }
}

/// Stored head of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Head {
    seq: u64,
    entry_hash: String,
}

/// Audit statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct AuditStats {
    pub total: u64,
    pub success: u64,
    pub failed: u64,
    pub blocked: u64,
    pub simulated: u64,
    pub rolled_back: u64,
    pub by_mutation_class: BTreeMap<String, u64>,
    pub by_intent: BTreeMap<String, u64>,
    pub by_reason_code: BTreeMap<String, u64>,
}

/// The audit log.
#[derive(Debug)]
pub struct AuditLog {
    state: StateDir,
    inner: crate::timed_lock::TimedMutex<(Journal, Index)>,
    /// With batched syncs the head may only name lines that are durable, so it waits
    /// here for the next sync point ([`AuditLog::pending_head`], [`AuditLog::publish_head`]).
    deferred_head: Option<Mutex<DeferredHead>>,
    /// The head file, held open, and why it stopped moving.
    head: Mutex<HeadKeeper>,
    /// Without durable appends or sync points (relaxed durability) the head may only name
    /// lines made durable by this log's own `fdatasync`: it moves every
    /// [`RELAXED_HEAD_EVERY`] appends and when the log is dropped.
    relaxed_head: Option<Mutex<RelaxedHead>>,
    /// Failure injection for tests (point `audit_head`).
    failpoints: Arc<FailPoints>,
    /// The journal's group commit, where a failed sync is kept: asked without `inner`,
    /// which a thread waiting for another process may hold.
    group: Option<Arc<crate::group_commit::GroupCommit>>,
}

/// Appends between two head moves under relaxed durability.
pub const RELAXED_HEAD_EVERY: u32 = 64;

/// The newest entry appended since the head last moved, and how many came since.
#[derive(Debug, Default)]
struct RelaxedHead {
    newest: Option<(u64, String)>,
    since: u32,
}

/// The head file and whether it may still move. Once the log is found not to match it
/// (lines cut from the end, a rewritten entry, a head removed or damaged), the head is
/// never written again, so the evidence stays for `audit verify`.
#[derive(Debug, Default)]
struct HeadKeeper {
    file: Option<BlockFile>,
    frozen: Option<String>,
}

/// What the head file holds.
#[derive(Debug)]
enum HeadFile {
    Missing,
    Damaged(String),
    At(Head),
}

/// The head file `len` bytes long, whose first block is `first`: the one block the
/// runtime writes, or damaged.
fn head_in(len: u64, first: &[u8]) -> HeadFile {
    if len > BLOCK as u64 {
        return HeadFile::Damaged(format!(
            "it is {len} bytes long, where the runtime writes one block of {BLOCK}"
        ));
    }
    parse_head(first)
}

fn parse_head(bytes: &[u8]) -> HeadFile {
    match serde_json::from_slice::<Head>(bytes) {
        Ok(h) => HeadFile::At(h),
        Err(e) => HeadFile::Damaged(e.to_string()),
    }
}

fn head_bytes(seq: u64, entry_hash: &str) -> io::Result<Vec<u8>> {
    serde_json::to_vec(&Head {
        seq,
        entry_hash: entry_hash.to_owned(),
    })
    .map_err(io::Error::other)
}

/// How the log fails to match its head, if it does. Called with the log's lock held and
/// the index caught up. Every writer makes the head before its first line, so a head
/// missing beside lines was removed.
fn head_mismatch(ix: &Index, file: &LogFile, head: &HeadFile) -> Option<String> {
    match head {
        HeadFile::Missing if ix.last_seq > 0 => Some(format!(
            "the head file {HEAD_FILE} is missing although the log holds {} entries: it was removed",
            ix.last_seq
        )),
        HeadFile::Missing => None,
        HeadFile::Damaged(e) => Some(format!("the head file {HEAD_FILE} is damaged ({e})")),
        HeadFile::At(h) if h.seq > ix.last_seq => Some(format!(
            "the log's last line has seq {} but its head records seq {}: lines were removed from the end, or an older line was copied after the last",
            ix.last_seq, h.seq
        )),
        HeadFile::At(h) if h.seq > 0 && !ix.holds(file, h.seq, &h.entry_hash) => Some(format!(
            "entry {} differs from the hash recorded in the head: the log was rewritten",
            h.seq
        )),
        HeadFile::At(_) => None,
    }
}

/// The head waiting for a sync point, and the last one written by this process.
#[derive(Debug, Default)]
struct DeferredHead {
    pending: Option<(u64, String)>,
    published: u64,
}

impl AuditLog {
    /// Opens (creating) the log, repairs a torn tail and loads the index. A head that
    /// lags the log (a crash between the append and the head update) is brought forward.
    /// `writes_per_minute` is the rate the limiter state is kept for.
    pub fn open(state: &StateDir, durable: bool, writes_per_minute: u32) -> io::Result<Self> {
        Self::open_with(state, durable, writes_per_minute, false)
    }

    /// [`AuditLog::open`]; with `defer_head`, the head moves only when the caller
    /// publishes it after making the log durable.
    pub fn open_with(
        state: &StateDir,
        durable: bool,
        writes_per_minute: u32,
        defer_head: bool,
    ) -> io::Result<Self> {
        let mut journal = Journal::open(state, AUDIT_FILE, durable)?;
        let mut index = Index::new(writes_per_minute);
        journal.read_new(&mut |at, b| index.ingest(at, b))?;
        let group = journal.group();
        let log = Self {
            group,
            state: state.clone(),
            inner: crate::timed_lock::TimedMutex::new(
                (journal, index),
                state.lock_wait(),
                "the audit trail",
            ),
            deferred_head: defer_head.then(|| Mutex::new(DeferredHead::default())),
            head: Mutex::new(HeadKeeper {
                file: state.open_block(HEAD_FILE)?,
                frozen: None,
            }),
            relaxed_head: (!durable && !defer_head).then(|| Mutex::new(RelaxedHead::default())),
            failpoints: Arc::default(),
        };
        // Judged under the log's lock, like every head write: no other process appends or
        // moves the head meanwhile, so the log and the head are seen at one moment.
        let behind = log.under_log_lock(|ix, file| {
            let on_disk = log.head_on_disk()?;
            if let Some(why) = head_mismatch(ix, file, &on_disk) {
                log.freeze(why);
                return Ok(None);
            }
            Ok(match on_disk {
                HeadFile::Missing => {
                    // Made whole and durable before this process can append its first
                    // line, so a missing head always means a removed one, never a crash.
                    log.state
                        .create_block(HEAD_FILE, &head_bytes(0, GENESIS_HASH)?)?;
                    log.keeper()?.file = log.state.open_block(HEAD_FILE)?;
                    None
                }
                HeadFile::At(h) if h.seq < ix.last_seq => Some((ix.last_seq, ix.last_hash.clone())),
                _ => None,
            })
        })?;
        if let Some((seq, hash)) = behind {
            match &log.deferred_head {
                Some(_) => log.keep_head(seq, &hash),
                None => log.publish_synced(seq, &hash)?,
            }
        }
        Ok(log)
    }

    /// Runs `f` on the caught-up index and the file with the log's exclusive file lock
    /// held.
    fn under_log_lock<T>(
        &self,
        f: impl FnOnce(&Index, &LogFile) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut g = self.inner.lock()?;
        let (journal, index) = &mut *g;
        // Nothing is appended, so nothing waits for a sync.
        let (out, _nothing_written) = journal.append_with(|new, file| {
            new.iter().for_each(|(at, b)| index.ingest(*at, b));
            Ok((Vec::new(), f(index, file)?))
        })?;
        Ok(out)
    }

    /// Makes the log durable, then moves the head to `seq` (never backwards).
    fn publish_synced(&self, seq: u64, entry_hash: &str) -> io::Result<()> {
        {
            let g = self.inner.lock()?;
            g.0.sync_data()?;
        }
        self.under_log_lock(|_, _| self.write_head(seq, entry_hash))
    }

    fn keeper(&self) -> io::Result<std::sync::MutexGuard<'_, HeadKeeper>> {
        self.head
            .lock()
            .map_err(|_| io::Error::other("audit head lock poisoned"))
    }

    /// The head as this process's open handle reads it. Without a handle yet, the file is
    /// looked for again (another process may have made it since this one looked).
    fn head_on_disk(&self) -> io::Result<HeadFile> {
        let mut k = self.keeper()?;
        if k.file.is_none() {
            k.file = self.state.open_block(HEAD_FILE)?;
        }
        Ok(match &k.file {
            Some(f) => head_in(f.len()?, &f.read()?),
            None => HeadFile::Missing,
        })
    }

    fn freeze(&self, why: String) {
        if let Ok(mut k) = self.keeper()
            && k.frozen.is_none()
        {
            tracing::error!(problem = %why, "the audit log does not match its head; the head stays as it is");
            k.frozen = Some(why);
        }
    }

    /// The seq of the newest entry (0 for an empty log).
    pub fn last_seq(&self) -> io::Result<u64> {
        self.with(|ix| ix.last_seq)
    }

    /// Why the head no longer moves (the log was found not to match it), if it does not.
    pub fn head_problem(&self) -> Option<String> {
        self.keeper().ok()?.frozen.clone()
    }

    /// The log's lock, the index caught up with the file.
    fn caught_up(&self) -> io::Result<crate::timed_lock::TimedGuard<'_, (Journal, Index)>> {
        let mut g = self.inner.lock()?;
        let (journal, index) = &mut *g;
        journal.read_new(&mut |at, b| index.ingest(at, b))?;
        Ok(g)
    }

    /// Runs `f` on the caught-up index (the facts asked before every action).
    fn with<T>(&self, f: impl FnOnce(&Index) -> T) -> io::Result<T> {
        Ok(f(&self.caught_up()?.1))
    }

    /// The slots `pick` chooses from the caught-up index, with what reads them back
    /// (only from the file the state directory names). They are read after the log's
    /// lock is let go: a line never changes once written (each read is checked against
    /// its keyed hash), and a look-up reading thousands of lines would otherwise hold
    /// every append of this process behind it.
    fn picked<T>(&self, pick: impl FnOnce(&mut Index) -> T) -> io::Result<(T, Reader)> {
        let mut g = self.caught_up()?;
        let (journal, index) = &mut *g;
        journal.check_in_place()?;
        Ok((
            pick(index),
            Reader {
                keys: index.keys.clone(),
                file: journal.shared_file(),
            },
        ))
    }

    /// The lines at the slots `pick` chooses, read back (see [`picked`](Self::picked)).
    fn read_picked(
        &self,
        pick: impl FnOnce(&mut Index) -> Vec<Slot>,
    ) -> io::Result<Vec<SandboxAuditEntry>> {
        let (slots, reader) = self.picked(pick)?;
        reader.read(&slots)
    }

    /// Appends records as one write, chaining each to the previous entry, then moves
    /// the head. Returns the entries as written.
    pub fn append(&self, records: Vec<AuditRecord>) -> io::Result<Vec<SandboxAuditEntry>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let mut g = self.inner.lock()?;
        let (journal, index) = &mut *g;
        // Under strict durability the head moves after the sync, once the lines are
        // checked to be still in the log as written.
        let moves_after_sync = self.deferred_head.is_none() && self.relaxed_head.is_none();
        let ((written, copy, lens), pending) = journal.append_with(|new, file| {
            new.iter().for_each(|(at, b)| index.ingest(*at, b));
            // Checked under the lock, before this append could hide a cut tail.
            if let Some(why) = head_mismatch(index, file, &self.head_on_disk()?) {
                self.freeze(why);
            }
            let (bytes, out, lens) = chained(index, records)?;
            let copy = moves_after_sync.then(|| bytes.clone());
            Ok((bytes, (out, copy, lens)))
        })?;
        let mut at = pending.range().0;
        for (e, &(len, print, names)) in written.iter().zip(&lens) {
            index.insert(&LineView::of(e), at, len - 1, (print, names));
            at += len as u64;
        }
        index.end = at;
        // A head kept for a sync point is handed over in append order, under the lock.
        if self.deferred_head.is_some()
            && let Some(last) = written.last()
        {
            self.keep_head(last.seq, &last.entry_hash);
        }
        drop(g);
        let (at, len) = pending.range();
        // After a failed sync the lines stay: other processes may have read them already
        // (taking them out would break their cursors). The run's record stays active, and
        // the next start's recovery records the action's undoing after them.
        pending.wait_checked(|| self.failpoints.check("audit_sync"))?;
        // The lines are durable (or, under relaxed durability, written): a head that
        // cannot follow them only lags until it next moves, so this append still stands.
        let moved = match (written.last(), copy) {
            (Some(last), Some(copy)) => self.head_to_synced(last, (at, len), &copy),
            _ => self.relaxed_progress(&written),
        };
        if let Err(e) = moved {
            tracing::warn!(error = %e, "the audit head could not follow the log; it lags until it next moves");
        }
        Ok(written)
    }

    /// Moves the head (strict durability) to `last`, the last of the lines an append
    /// wrote (at `at`, `len` bytes: `written`) and synced out of the log's lock, once
    /// they are read back as written: a head moved over lines cut meanwhile (and replaced
    /// by another writer's) would hide the cut.
    fn head_to_synced(
        &self,
        last: &SandboxAuditEntry,
        (at, len): (u64, u64),
        written: &[u8],
    ) -> io::Result<()> {
        // Under the log's lock, like every head write.
        self.under_log_lock(|_, file| {
            let still = match file.read_range(at, len) {
                Ok(b) => b == written,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
                Err(e) => return Err(e),
            };
            if !still {
                // The head is set to the entry this process made durable, so that
                // every later check finds the log no longer holds it.
                return self.record_cut(
                    last.seq,
                    &last.entry_hash,
                    format!(
                        "entry {} was cut from the log or rewritten while it was being synced",
                        last.seq
                    ),
                );
            }
            // Appends of other threads may finish their syncs first: the head only
            // moves forward.
            self.write_head(last.seq, &last.entry_hash)
        })
    }

    /// Writes the head at an entry this process made durable and the log no longer
    /// holds, then freezes it there: the evidence stays for `audit verify` and for every
    /// other process, whatever is appended after.
    fn record_cut(&self, seq: u64, entry_hash: &str, why: String) -> io::Result<()> {
        let bytes = head_bytes(seq, entry_hash)?;
        let mut k = self.keeper()?;
        if k.frozen.is_some() {
            return Ok(());
        }
        self.pin_head(&mut k, &bytes, why)
    }

    /// Writes `bytes` as the head and freezes it ([`AuditLog::record_cut`]).
    fn pin_head(&self, k: &mut HeadKeeper, bytes: &[u8], why: String) -> io::Result<()> {
        tracing::error!(problem = %why, "the audit log does not match its head; the head stays as it is");
        k.frozen = Some(why);
        match &k.file {
            Some(f) => f.write(bytes),
            None => self.state.write_block(HEAD_FILE, bytes, false),
        }
    }

    /// Why this process writes nothing more: an earlier sync of the log failed.
    pub fn sync_failure(&self) -> Option<io::Error> {
        self.group.as_ref().and_then(|g| g.failed())
    }

    /// Why the log takes no more lines from this process (a sync failed, or its file
    /// was moved away or replaced), without waiting: a file moved is not seen while an
    /// append holds it.
    pub fn write_failure(&self) -> Option<String> {
        crate::journal::held_failure(&self.inner, self.group.as_deref(), "the audit log")
    }

    /// Under relaxed durability, counts appends and moves the head, after syncing the
    /// log, every [`RELAXED_HEAD_EVERY`] of them.
    fn relaxed_progress(&self, written: &[SandboxAuditEntry]) -> io::Result<()> {
        let (Some(r), Some(last)) = (&self.relaxed_head, written.last()) else {
            return Ok(());
        };
        let due = {
            let mut r = r
                .lock()
                .map_err(|_| io::Error::other("audit head lock poisoned"))?;
            r.newest = Some((last.seq, last.entry_hash.clone()));
            r.since += 1;
            if r.since >= RELAXED_HEAD_EVERY {
                r.since = 0;
                r.newest.take()
            } else {
                None
            }
        };
        match due {
            Some((seq, hash)) => self.publish_synced(seq, &hash),
            None => Ok(()),
        }
    }

    /// Keeps the head for the next sync point (batched syncs).
    fn keep_head(&self, seq: u64, entry_hash: &str) {
        if let Some(d) = &self.deferred_head
            && let Ok(mut d) = d.lock()
        {
            d.pending = Some((seq, entry_hash.to_owned()));
        }
    }

    /// Shares the sandbox's failure points (tests).
    pub fn share_failpoints(&mut self, failpoints: Arc<FailPoints>) {
        self.failpoints = failpoints;
    }

    /// Whether a head waits for a sync point.
    pub fn has_pending_head(&self) -> bool {
        self.deferred_head
            .as_ref()
            .and_then(|d| d.lock().ok().map(|d| d.pending.is_some()))
            .unwrap_or(false)
    }

    /// The head waiting for a sync point; take it before syncing.
    pub fn pending_head(&self) -> Option<(u64, String)> {
        let d = self.deferred_head.as_ref()?;
        d.lock().ok()?.pending.take()
    }

    /// Writes a head taken with [`AuditLog::pending_head`] once the sync it waited for is
    /// done. A head older than one this process already wrote is dropped.
    pub fn publish_head(&self, head: Option<(u64, String)>) -> io::Result<()> {
        let (Some((seq, hash)), Some(d)) = (head, &self.deferred_head) else {
            return Ok(());
        };
        // Under the log's lock, like every head write, so that no process reads a head
        // block another is writing. Locks are taken in the order append takes them.
        self.under_log_lock(|_, _| {
            let mut d = d
                .lock()
                .map_err(|_| io::Error::other("audit head lock poisoned"))?;
            if seq <= d.published {
                return Ok(());
            }
            self.write_head(seq, &hash)?;
            d.published = seq;
            Ok(())
        })
    }

    fn write_head(&self, seq: u64, entry_hash: &str) -> io::Result<()> {
        if self.failpoints.hit("audit_head").is_some() {
            return Err(io::Error::other("injected failure at audit_head"));
        }
        let bytes = head_bytes(seq, entry_hash)?;
        let mut k = self.keeper()?;
        if k.frozen.is_some() {
            return Ok(());
        }
        // Never fsync'd: the head only has to be no further than the durable log, which
        // it never is (it moves after the log's durable append, sync point or own sync).
        // A crash may leave an older head, which only weakens the cut-tail check for the
        // last entries until the head moves again, and costs no consistency.
        // Heads published after syncs may arrive out of order between threads and
        // processes: the head never goes backwards.
        if let Some(f) = &k.file
            && let HeadFile::At(h) = parse_head(&f.read()?)
            && h.seq >= seq
        {
            if h.seq == seq && h.entry_hash != entry_hash {
                // Two entries under one seq: the log was cut and written again. The head
                // keeps this process's entry as evidence.
                let why = format!(
                    "the head records another entry {seq} than the one this process appended: the log was cut and written again"
                );
                return self.pin_head(&mut k, &bytes, why);
            }
            return Ok(());
        }
        match &k.file {
            Some(f) => f.write(&bytes),
            None => {
                self.state.write_block(HEAD_FILE, &bytes, false)?;
                k.file = self.state.open_block(HEAD_FILE)?;
                Ok(())
            }
        }
    }

    /// The newest `limit` entries, newest first, optionally of one workflow.
    pub fn list(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> io::Result<Vec<SandboxAuditEntry>> {
        let mut out = self.read_picked(|ix| match workflow_id {
            Some(w) => ix.workflow(w).map_or_else(Vec::new, |w| {
                let from = w.lines.len().saturating_sub(limit);
                w.lines[from..].iter().map(|&i| ix.slots[i]).collect()
            }),
            None => ix.slots[ix.slots.len().saturating_sub(limit)..].to_vec(),
        })?;
        out.reverse();
        Ok(out)
    }

    /// Every entry of a workflow, oldest first.
    pub fn by_workflow(&self, workflow_id: &str) -> io::Result<Vec<SandboxAuditEntry>> {
        self.read_picked(|ix| {
            ix.workflow(workflow_id)
                .map_or_else(Vec::new, |w| w.lines.iter().map(|&i| ix.slots[i]).collect())
        })
    }

    /// Whether the trail records an action of a workflow as rolled back.
    pub fn is_rolled_back(&self, workflow_id: &str, action_id: &str) -> io::Result<bool> {
        self.with(|ix| {
            ix.workflow(workflow_id)
                .is_some_and(|w| w.undone.contains(action_id))
        })
    }

    /// The changes another run made to a target after `since` (writes and restores;
    /// each `before_checksum` is what it found there), as the trail records them:
    /// earliest first by timestamp, since recovery appends lines after the fact.
    /// `is_target` tells whether a recorded `target_path` names the target, whose
    /// paths end as `ending` says (its file name, or a `&RelPath` beneath its root):
    /// another process may have spelled its root differently (through a symlink), so
    /// the text alone does not say. Only the lines of changes to files of that ending
    /// are read.
    pub fn changes_since<'a>(
        &self,
        ending: impl Into<Ending<'a>>,
        is_target: impl Fn(&str) -> bool,
        since: &str,
        not_execution: &str,
    ) -> io::Result<Vec<SandboxAuditEntry>> {
        Ok(changes_after(
            &self.changes_named(ending.into(), since)?,
            is_target,
            since,
            not_execution,
        ))
    }

    /// Every line of a change (a write or a restore, any run's, whatever its status) to
    /// a file of this `ending` that may be dated after `after` (a line dated later is
    /// never left out; some dated no later may be in), in the log's order: for a caller
    /// that looks at several targets of one ending, read once ([`changes_after`] picks
    /// each target's).
    pub(crate) fn changes_named(
        &self,
        ending: Ending<'_>,
        after: &str,
    ) -> io::Result<Vec<SandboxAuditEntry>> {
        self.read_picked(|ix| ix.changes_to(ending, after))
    }

    /// The trail's last change to the target `is_target` names, whose paths end as
    /// `ending` says: the one [`changes_since`](Self::changes_since) with no time and no
    /// run left out would end with (the latest by timestamp; of two dated alike, the
    /// later line). The lines of that ending are read back from the newest, and only
    /// until none before can be dated later than the change found: recovery asks this
    /// of each target it judges, and a common name (`notes.md`) may have been written
    /// many thousand times before.
    pub fn last_change<'a>(
        &self,
        ending: impl Into<Ending<'a>>,
        is_target: impl Fn(&str) -> bool,
    ) -> io::Result<Option<SandboxAuditEntry>> {
        // Each slot's time is the latest of its chain by name up to it (see
        // [`Slot::when`]), and only when every slot is linked by name; a chain's slots
        // of one folder keep that order.
        let ending = ending.into();
        let ((chain, bounded), reader) =
            self.picked(|ix| (ix.changes_to(ending, ""), ix.names_complete()))?;
        let mut last: Option<SandboxAuditEntry> = None;
        let mut end = chain.len();
        // Lines read back at a time, from the newest: most targets' last change is among
        // the newest lines of their name, and the lines read past it (the bound is known
        // only once it is found) are never more than those read before.
        let mut step = 16;
        while end > 0 {
            let below = match &last {
                Some(l) if bounded => match time_key(&l.timestamp) {
                    ANY_TIME => 0,
                    key => key,
                },
                _ => 0,
            };
            let from = end.saturating_sub(step);
            let start = chain[from..end]
                .iter()
                .rposition(|s| s.when < below)
                .map_or(from, |i| from + i + 1);
            if start == end {
                break;
            }
            for e in reader.read(&chain[start..end])?.into_iter().rev() {
                if is_change_after(&e, &is_target, "", "")
                    && last.as_ref().is_none_or(|l| e.timestamp > l.timestamp)
                {
                    last = Some(e);
                }
            }
            end = start;
            step = (step * 2).min(4096);
        }
        Ok(last)
    }

    /// The `create_directory` actions (workflow, action) that stand, not rolled back,
    /// for the directory `is_target` names (recorded under any spelling of its root):
    /// the directory's existence is their result.
    pub fn directory_claims(&self, is_target: impl Fn(&str) -> bool) -> io::Result<Vec<DirClaim>> {
        self.with(|ix| {
            ix.dir_claims
                .iter()
                .filter(|(path, claims)| !claims.is_empty() && is_target(path))
                .flat_map(|(_, claims)| claims.iter().cloned())
                .collect()
        })
    }

    /// Whether the trail records the workflow doing something: a line of it that is no
    /// refusal (a write, a simulated or failed action, a rollback).
    pub fn workflow_acted(&self, workflow_id: &str) -> io::Result<bool> {
        self.with(|ix| ix.workflow(workflow_id).is_some_and(|w| w.acted))
    }

    /// Whether the trail records a write (not a rollback) by this action of the
    /// workflow: done, undone, or failed after its snapshot was taken. Its snapshot may
    /// be gone since (pruned, removed): the id stays used all the same. An action refused
    /// before its snapshot wrote nothing: its id is free.
    pub fn ran_action(&self, workflow_id: &str, action_id: &str) -> io::Result<bool> {
        self.with(|ix| {
            ix.workflow(workflow_id)
                .is_some_and(|w| w.ran.contains(action_id))
        })
    }

    /// The workflows whose trail records a write by an action of this id (an action id
    /// is unique in its workflow only) that is not rolled back, sorted: for a rollback
    /// that named the action under another workflow.
    pub fn workflows_that_ran(&self, action_id: &str) -> io::Result<Vec<String>> {
        self.with(|ix| {
            let mut found: Vec<String> = ix
                .workflows
                .iter()
                .filter(|(_, w)| w.ran.contains(action_id) && !w.undone.contains(action_id))
                .map(|(id, _)| id.clone())
                .collect();
            found.sort_unstable();
            found
        })
    }

    /// The rate limiter's state for a workflow at `now` (epoch seconds): the GCRA
    /// theoretical arrival time of its executed writes (successful, not rollbacks),
    /// replayed from the durable log. Writes dated after `now` (the clock was set back
    /// since) are taken as made one write's interval before the first look that found
    /// them ahead: the bucket holds one token more than they left it (a process that
    /// cannot know when they were made, a CLI command say, is never kept waiting until
    /// the clock catches up with them) and refills from then on. That look is this
    /// process's, or, when the trail holds a line of the workflow after those writes and
    /// dated before them, the earliest such line's (another process's refused plan, say):
    /// every process then counts the refill from the same moment, and a wait told by one
    /// is honoured by the next. The first write after lets the index take them so too.
    pub fn rate_tat(&self, workflow_id: &str, now: f64) -> io::Result<f64> {
        let mut g = self.caught_up()?;
        let (journal, ix) = &mut *g;
        let interval = 60.0 / f64::from(ix.per_minute);
        let Some(w) = ix.workflows.get(workflow_id) else {
            return Ok(f64::NEG_INFINITY);
        };
        let (tat, latest) = w.tat;
        if latest <= now {
            return Ok(tat);
        }
        let seen = match w.ahead.filter(|(seen, _)| *seen == latest) {
            Some((_, made)) => Some(made),
            // Read once per process and such write: the clock set back is rare.
            None => {
                journal.check_in_place()?;
                first_look_behind(&since_last_write(ix, journal.file(), &w.lines)?, latest)
                    .map(|at| at - interval)
            }
        };
        let made = seen.map_or(now - interval, |made| made.min(now - interval));
        if let Some(w) = ix.workflows.get_mut(workflow_id) {
            w.ahead = Some((latest, made));
        }
        Ok(tat - (latest - made))
    }

    /// Counts by status, mutation class and intent (SPEC §8).
    pub fn get_sandbox_audit_stats(&self) -> io::Result<AuditStats> {
        self.with(|ix| ix.stats.clone())
    }

    /// Reads the whole log and checks every line, the chain and the head.
    pub fn verify(&self) -> io::Result<VerifyReport> {
        Ok(self.check_trail(false)?.finish().0)
    }

    /// [`verify`](Self::verify), the actions the same lines record as having written
    /// (see [`Writes`]) and their successful writes that registered an artifact (see
    /// [`RecordedWrite`]); gathered only while the chain holds (they mean nothing once it
    /// breaks).
    pub fn verify_and_writes(&self) -> io::Result<(VerifyReport, Writes, Vec<RecordedWrite>)> {
        Ok(self.check_trail(true)?.finish())
    }

    /// The log read through a [`TrailCheck`]. The head is read under the log's lock, like
    /// every head write: read apart, an append landing in between would show a head
    /// ahead of the log read before it. The file as it is now, not this process's handle
    /// on it, which outlives a removal.
    fn check_trail(&self, gather: bool) -> io::Result<TrailCheck> {
        let g = self.inner.lock()?;
        g.0.scan_all_with(
            || {
                let head = match self.state.open_block(HEAD_FILE)? {
                    Some(f) => head_in(f.len()?, &f.read()?),
                    None => HeadFile::Missing,
                };
                Ok(TrailCheck::new(head, gather))
            },
            |check, piece| Ok(check.piece(piece)),
        )
    }
}

/// Whether `e` records a write (the rate limit's unit).
fn is_write(e: &SandboxAuditEntry) -> bool {
    e.status == AuditStatus::Success && e.mutation_class != Some(MutationClass::Rollback)
}

/// A workflow's lines (`lines`, indexes of its slots) from its last write on, read back
/// from the end a few at a time: a workflow refused many plans since holds many lines.
fn since_last_write(
    ix: &Index,
    file: &LogFile,
    lines: &[usize],
) -> io::Result<Vec<SandboxAuditEntry>> {
    const STEP: usize = 64;
    let mut tail: Vec<SandboxAuditEntry> = Vec::new();
    let mut end = lines.len();
    while end > 0 {
        let start = end.saturating_sub(STEP);
        let slots: Vec<Slot> = lines[start..end].iter().map(|&i| ix.slots[i]).collect();
        let mut read = read_back(&ix.keys, file, &slots)?;
        if let Some(w) = read.iter().rposition(is_write) {
            read.drain(..w);
            read.append(&mut tail);
            return Ok(read);
        }
        read.append(&mut tail);
        tail = read;
        end = start;
    }
    Ok(tail)
}

/// When the earliest of a workflow's `lines` after its last write, and dated before
/// that write (`latest`, epoch seconds), was made: the clock was behind the write then.
fn first_look_behind(lines: &[SandboxAuditEntry], latest: f64) -> Option<f64> {
    let after = lines.iter().rposition(is_write).map_or(0, |i| i + 1);
    lines[after..].iter().find_map(|e| {
        let at = crate::budget::epoch_seconds(crate::clock::parse_timestamp(&e.timestamp)?);
        (at < latest).then_some(at)
    })
}

impl Drop for AuditLog {
    /// Under relaxed durability, the head catches up with the last appends on the way
    /// out (after syncing the log).
    fn drop(&mut self) {
        let newest = self
            .relaxed_head
            .as_ref()
            .and_then(|r| r.lock().ok()?.newest.take());
        if let Some((seq, hash)) = newest
            && let Err(e) = self.publish_synced(seq, &hash)
        {
            tracing::warn!(error = %e, "the audit head could not catch up at exit");
        }
    }
}
