//! The audit trail: every action (executed, simulated, blocked, failed, rolled back) as
//! one JSONL line in `sandbox_audit.jsonl`, chained by SHA-256 (`seq`, `prev_hash`,
//! `entry_hash`) so an edited, removed or reordered line is found by [`AuditLog::verify`].
//! The chain's head is also kept in `sandbox_audit.head.json`, outside the log, so a cut
//! tail is found too.

use crate::artifact::{ARTIFACTS_FILE, ArtifactEntry};
use crate::catalog::MutationClass;
use crate::confine::path::shown_path;
use crate::confine::state::{BLOCK, BlockFile, LogFile, StateDir, StateFile};
use crate::failpoint::FailPoints;
use crate::hash::to_hex;
use crate::journal::{Journal, Piece, scan};
use crate::reason::ReasonCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

/// Audit log file name.
pub const AUDIT_FILE: &str = "sandbox_audit.jsonl";
/// Head file name.
pub const HEAD_FILE: &str = "sandbox_audit.head.json";
/// `prev_hash` of the first entry.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Outcome recorded for an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum AuditStatus {
    Success,
    Simulated,
    Blocked,
    Failed,
    RolledBack,
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
    /// SHA-256 over the entry's line as [`crate::journal::write_line`] writes it, without
    /// `entry_hash` and the newline.
    pub fn compute_hash(&self) -> String {
        self.hash_of(Form::Line)
    }

    fn hash_of(&self, form: Form) -> String {
        let mut copy = self.clone();
        copy.entry_hash = String::new();
        to_hex(&Sha256::digest(form.bytes(&copy)))
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

/// `audit verify` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Whether the whole chain and head check out.
    pub ok: bool,
    /// Lines read: the whole trail when it checks out, else up to and including the
    /// first bad one.
    pub entries: u64,
    /// The first sequence number where the chain breaks.
    pub first_bad_seq: Option<u64>,
    /// What is wrong.
    pub reason: Option<String>,
}

/// How the reason of a verdict begins when the only fault is writes a dead run's
/// recovery has yet to record: no tampering, to verify again once recovered.
const NOT_YET_RECORDED: &str = "the audit trail does not record yet";

impl VerifyReport {
    /// Whether the trail only lacks the lines of writes awaiting recovery (no tampering).
    pub fn awaits_recovery(&self) -> bool {
        !self.ok
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(NOT_YET_RECORDED))
    }
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

/// Where a line lies in the log. Lines are read back from the file when asked for (a
/// line, once written, never changes), so an index costs a few dozen bytes per line
/// rather than the line's text.
#[derive(Debug, Clone, Copy)]
struct Slot {
    at: u64,
    /// Without its newline.
    len: u32,
    /// The slot before it of a change (a write or a restore) to a file of the same name
    /// ([`NO_SLOT`] for none), for [`AuditLog::changes_since`].
    same_name: u32,
    /// A keyed hash of the file name of a change ([`NOT_A_CHANGE`] for other lines): the
    /// chains of [`Slot::same_name`] are built from it without reading the log again.
    name: u32,
    seq: u64,
    /// A keyed hash of the line's bytes ([`Index::keys`]): a line read back is the line
    /// indexed, byte for byte.
    print: u64,
    /// Its timestamp's [`time_key`], raised, once the slot is linked into its chain by
    /// name, to the greatest of the chain's earlier lines: a chain walked back from its
    /// newest line ends, for a look-up of the changes since a time, at the first slot
    /// below it, and the lines that cannot be later are neither read back nor walked (a
    /// trail may name one file name many thousand times). A line dated before the lines
    /// around it (a recovery's, after the fact) only has a few more read; one dated
    /// after the lines that follow it (a clock set forward, then back) has every later
    /// line of its chain read until their times pass its own. Free: the slot's padding
    /// held it.
    when: u32,
    /// A keyed hash of the name of the folder holding the file a change names
    /// ([`NO_FOLDER`] when the path has none): a look-up for a target in a folder of its
    /// root reads back only the lines of its name in a folder of that name, whatever
    /// spelling of the root they were written under (see [`Ending`]).
    folder: u32,
}

const NO_SLOT: u32 = u32::MAX;

/// [`Slot::folder`] of a line that is not a change, or whose path names no folder.
const NO_FOLDER: u32 = u32::MAX;

/// [`Slot::name`] of a line that is not a change to a file.
const NOT_A_CHANGE: u32 = u32::MAX;

/// [`Slot::name`] and [`Slot::folder`] of a line: keyed hashes of its file name and of
/// the name of the folder holding it, for a change (a write or a restore) to a file.
/// Names that share a hash share a chain, which [`AuditLog::changes_since`] then sorts
/// out by reading the lines. Paths are taken by their components, as
/// `Path::ends_with` takes them when a line is matched to a target.
fn name_of(keys: &RandomState, status: AuditStatus, target_path: &str) -> (u32, u32) {
    use std::path::Component::Normal;
    if !matches!(status, AuditStatus::Success | AuditStatus::RolledBack) {
        return (NOT_A_CHANGE, NO_FOLDER);
    }
    let mut parts = std::path::Path::new(target_path).components().rev();
    match (parts.next(), parts.next()) {
        (Some(Normal(name)), folder) => (
            name_hash(keys, name.as_encoded_bytes()),
            match folder {
                Some(Normal(f)) => name_hash(keys, f.as_encoded_bytes()),
                _ => NO_FOLDER,
            },
        ),
        _ => (NOT_A_CHANGE, NO_FOLDER),
    }
}

/// What every path the trail may record for a target ends with, whatever spelling of
/// its root the writing process was given: the file's name, and the name of the folder
/// holding it when that folder lies inside the root (`None` for a file at the root's
/// top, whose folder is the root itself, named otherwise under another spelling). A
/// look-up by name alone reads every change to a file of that name. Made only from the
/// target's `RelPath` below its root, or from its file name: a folder taken from an
/// absolute path may be the root's, and miss the lines written under another spelling
/// of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ending<'a> {
    /// The file's name.
    pub(crate) name: &'a str,
    /// The name of the folder holding it, when that folder is inside the root.
    pub(crate) folder: Option<&'a str>,
}

impl<'a> From<&'a str> for Ending<'a> {
    fn from(name: &'a str) -> Self {
        Self { name, folder: None }
    }
}

impl<'a> From<&'a String> for Ending<'a> {
    fn from(name: &'a String) -> Self {
        name.as_str().into()
    }
}

impl<'a> From<&'a crate::confine::RelPath> for Ending<'a> {
    fn from(rel: &'a crate::confine::RelPath) -> Self {
        Self {
            name: rel.file_name(),
            folder: rel.parent_components().last().map(String::as_str),
        }
    }
}

fn name_hash(keys: &RandomState, name: &[u8]) -> u32 {
    (keys.hash_one(name) as u32).min(NOT_A_CHANGE - 1)
}

/// [`time_key`] of a timestamp it cannot place: such a line is always read.
const ANY_TIME: u32 = u32::MAX;

/// A number that orders as the text of a timestamp does, to the second, for those
/// [`crate::clock::timestamp`] writes in the years 2000–2099
/// (`2026-12-04T06:45:44.123456Z`): of two such texts, the greater never has the smaller
/// key. Each field is a digit of its own base, so the key needs no calendar and no
/// field's value is trusted beyond its width. 0 for one of that shape dated before 2000
/// (a clock not yet set at boot), whose text orders below all of them; [`ANY_TIME`] for
/// any other text.
fn time_key(ts: &str) -> u32 {
    let b = ts.as_bytes();
    let shape = b.len() == 27
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            26 => c == b'Z',
            _ => c.is_ascii_digit(),
        });
    if !shape {
        return ANY_TIME;
    }
    let num = |from: usize, to: usize| {
        b[from..to]
            .iter()
            .fold(0u64, |n, &c| n * 10 + u64::from(c - b'0'))
    };
    let year = match num(0, 4) {
        // Its text orders below that of every year placed.
        ..2000 => return 0,
        y @ 2000..2100 => y - 2000,
        _ => return ANY_TIME,
    };
    // (value, base): 100 years × 13 months × 32 days × 24 h × 60 min × 62 s fits 32 bits.
    let fields = [
        (year, 100),
        (num(5, 7), 13),
        (num(8, 10), 32),
        (num(11, 13), 24),
        (num(14, 16), 60),
        (num(17, 19), 62),
    ];
    let mut key = 0u64;
    for (value, base) in fields {
        if value >= base {
            return ANY_TIME;
        }
        key = key * base + value;
    }
    // The greatest key, 3,714,047,999, lies below ANY_TIME.
    u32::try_from(key).unwrap_or(ANY_TIME)
}

/// The fields of a line the index keeps facts from, borrowed from the line; the others
/// only checked to be there with their types. The same fields and types as
/// [`SandboxAuditEntry`], so a line is indexed exactly when it reads as an entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineView<'a> {
    seq: u64,
    #[serde(borrow)]
    timestamp: Cow<'a, str>,
    #[serde(rename = "execution_id")]
    _execution_id: Text,
    #[serde(borrow)]
    workflow_id: Cow<'a, str>,
    #[serde(borrow)]
    action_id: Cow<'a, str>,
    mutation_class: Option<MutationClass>,
    #[serde(borrow)]
    mutation_type: Cow<'a, str>,
    #[serde(borrow)]
    target_path: Cow<'a, str>,
    #[serde(rename = "before_checksum")]
    _before_checksum: Option<Text>,
    #[serde(rename = "after_checksum")]
    _after_checksum: Option<Text>,
    #[serde(rename = "rollback_available")]
    _rollback_available: bool,
    rollback_path: Option<Text>,
    status: AuditStatus,
    reason_code: Option<ReasonCode>,
    #[serde(rename = "error")]
    _error: Option<Text>,
    #[serde(rename = "prev_hash")]
    _prev_hash: Text,
    #[serde(borrow, default)]
    entry_hash: Cow<'a, str>,
}

/// A JSON string, read and let go (no allocation).
struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Text, E> {
                Ok(Text)
            }
        }
        d.deserialize_str(V)
    }
}

impl<'a> LineView<'a> {
    fn of(e: &'a SandboxAuditEntry) -> Self {
        let b = |s: &'a String| Cow::Borrowed(s.as_str());
        let t = |s: &Option<String>| s.as_ref().map(|_| Text);
        Self {
            seq: e.seq,
            timestamp: b(&e.timestamp),
            _execution_id: Text,
            workflow_id: b(&e.workflow_id),
            action_id: b(&e.action_id),
            mutation_class: e.mutation_class,
            mutation_type: b(&e.mutation_type),
            target_path: b(&e.target_path),
            _before_checksum: t(&e.before_checksum),
            _after_checksum: t(&e.after_checksum),
            _rollback_available: e.rollback_available,
            rollback_path: t(&e.rollback_path),
            status: e.status,
            reason_code: e.reason_code,
            _error: t(&e.error),
            _prev_hash: Text,
            entry_hash: b(&e.entry_hash),
        }
    }
}

/// Counts one more under `key`, allocating the key only the first time it is seen.
fn count(map: &mut BTreeMap<String, u64>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

/// What the index knows of one workflow.
#[derive(Debug)]
struct Workflow {
    /// Its lines (indexes into [`Index::slots`]).
    lines: Vec<usize>,
    /// The actions the trail records as having run a write (not a rollback): done, undone,
    /// or failed after their snapshot; asked before every action, so not a scan of the
    /// workflow's lines.
    ran: HashSet<Box<str>>,
    /// The actions the trail records as rolled back: asked for a write's default
    /// parent, so not a scan either.
    undone: HashSet<Box<str>>,
    /// Rate-limiter state (GCRA TAT) and the latest write's time, kept current as lines
    /// arrive.
    tat: (f64, f64),
    /// Once a look at the rate found the latest write dated after its `now` (the clock
    /// set back since): that write's time and when the look took it to be made.
    ahead: Option<(f64, f64)>,
}

/// Hashes a `u32` that is already a keyed hash ([`Index::keys`]), spread over 64 bits
/// (the table reads the top bits as well as the bottom ones).
#[derive(Debug, Default, Clone, Copy)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Debug)]
struct Index {
    slots: Vec<Slot>,
    /// Where the lines read so far end in the file.
    end: u64,
    /// The newest slot of a change to a file of each name (by [`Slot::name`]): the head
    /// of the chain [`Slot::same_name`] links. Built the first time it is asked for
    /// (recovery's doubtful cases only), kept current after.
    by_name: Option<HashMap<u32, u32, std::hash::BuildHasherDefault<Prehashed>>>,
    /// This process's key for hashing names and lines: another cannot make two collide.
    keys: RandomState,
    per_minute: u32,
    workflows: HashMap<String, Workflow>,
    /// The `create_directory` actions that stand (not rolled back) for each directory
    /// they named, as recorded, with when they did: its existence is their result (see
    /// [`AuditLog::directory_claims`]). A rollback's line may spell the root otherwise,
    /// so a claim is withdrawn by its action, wherever it is filed.
    dir_claims: HashMap<String, Vec<DirClaim>>,
    claim_paths: HashMap<(String, String), String>,
    last_seq: u64,
    last_hash: String,
    stats: AuditStats,
}

impl Index {
    fn new(per_minute: u32) -> Self {
        Self {
            slots: Vec::new(),
            end: 0,
            by_name: None,
            keys: RandomState::new(),
            per_minute: per_minute.max(1),
            workflows: HashMap::new(),
            dir_claims: HashMap::new(),
            claim_paths: HashMap::new(),
            last_seq: 0,
            last_hash: GENESIS_HASH.to_owned(),
            stats: AuditStats::default(),
        }
    }

    fn workflow(&self, id: &str) -> Option<&Workflow> {
        self.workflows.get(id)
    }

    /// Indexes whole lines read from the log at offset `at`.
    fn ingest<'a>(&mut self, at: u64, buf: &'a [u8]) {
        // Past where the last buffer ended is a line too long to read, passed over.
        if at < self.end {
            // The log was cut and is read again from the start: what this process read
            // before is not in it any more.
            tracing::warn!(
                read_before = self.end,
                "the audit log is not what this process read: it was cut, or cut and written again (audit verify will report it); its index is built again"
            );
            *self = Self::new(self.per_minute);
        }
        // A large read (the first, of a long trail) is parsed on two threads, the
        // second half while the first is parsed and indexed; lines go in in file order.
        const PARALLEL_FROM: usize = 1 << 20;
        let half = buf.len() / 2;
        let split = match buf[half..].iter().position(|&b| b == b'\n') {
            Some(i) if buf.len() >= PARALLEL_FROM => half + i + 1,
            _ => buf.len(),
        };
        let (first, second) = buf.split_at(split);
        let keys = self.keys.clone();
        // Lines that are not entries: counted, and the first one's error logged once.
        let mut unreadable: (u64, Option<serde_json::Error>) = (0, None);
        let mut index = |this: &mut Self, parsed: ParsedLines<'a>| {
            for p in parsed.entries {
                let offset = at + (p.line.as_ptr() as usize - buf.as_ptr() as usize) as u64;
                this.insert(&p.view, offset, p.line.len(), (p.print, p.names));
            }
            unreadable.0 += parsed.unreadable;
            if unreadable.1.is_none() {
                unreadable.1 = parsed.first_error;
            }
        };
        std::thread::scope(|scope| {
            // Without a second thread (a process limit) this one parses both halves.
            let later = (!second.is_empty())
                .then(|| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, || parse_lines(second, &keys))
                        .ok()
                })
                .flatten();
            index(self, parse_lines(first, &keys));
            let parsed = match later.map(|t| t.join()) {
                Some(Ok(parsed)) => parsed,
                _ => parse_lines(second, &keys),
            };
            index(self, parsed);
        });
        if let (lines, Some(err)) = unreadable {
            tracing::warn!(
                lines,
                first = %err,
                "unreadable audit lines (audit verify will report them)"
            );
        }
        self.end = at + buf.len() as u64;
    }

    /// Indexes the line `e`, found at `at`, `len` bytes long, with its keyed hash, its
    /// [`Slot::name`] and its [`Slot::folder`].
    fn insert(
        &mut self,
        e: &LineView<'_>,
        at: u64,
        len: usize,
        (print, (name, folder)): (u64, (u32, u32)),
    ) {
        let s = &mut self.stats;
        s.total += 1;
        match e.status {
            AuditStatus::Success => s.success += 1,
            AuditStatus::Failed => s.failed += 1,
            AuditStatus::Blocked => s.blocked += 1,
            AuditStatus::Simulated => s.simulated += 1,
            AuditStatus::RolledBack => s.rolled_back += 1,
        }
        if let Some(c) = e.mutation_class {
            count(&mut s.by_mutation_class, c.as_str());
        }
        count(
            &mut s.by_intent,
            crate::catalog::intent_label(&e.mutation_type),
        );
        if let Some(r) = e.reason_code {
            count(&mut s.by_reason_code, r.as_str());
        }
        let wrote =
            e.status == AuditStatus::Success && e.mutation_class != Some(MutationClass::Rollback);
        // A failure may come after the action's artifact was registered (the registry's
        // line is written before the trail's): its id is spent as surely as a success's.
        // Such an action was undone (its undo line stands even when its failure line
        // could not be written: the trail held) or kept its snapshot (the undo failed);
        // one refused before its snapshot wrote nothing, and its id stays free.
        let ran = wrote
            || e.status == AuditStatus::RolledBack
            || (e.status == AuditStatus::Failed
                && e.mutation_class != Some(MutationClass::Rollback)
                && e.rollback_path.is_some());
        if e.mutation_type == "create_directory" {
            let key = (e.workflow_id.to_string(), e.action_id.to_string());
            match e.status {
                AuditStatus::Success => {
                    self.dir_claims
                        .entry(e.target_path.to_string())
                        .or_default()
                        .push(DirClaim {
                            workflow_id: key.0.clone(),
                            action_id: key.1.clone(),
                            at: e.timestamp.to_string(),
                        });
                    self.claim_paths.insert(key, e.target_path.to_string());
                }
                AuditStatus::RolledBack => {
                    if let Some(path) = self.claim_paths.remove(&key)
                        && let Some(claims) = self.dir_claims.get_mut(&path)
                    {
                        claims.retain(|c| (&c.workflow_id, &c.action_id) != (&key.0, &key.1));
                    }
                }
                _ => {}
            }
        }
        self.last_seq = e.seq;
        self.last_hash.clear();
        self.last_hash.push_str(&e.entry_hash);
        let here = self.slots.len();
        if !self.workflows.contains_key(e.workflow_id.as_ref()) {
            self.workflows.insert(
                e.workflow_id.to_string(),
                Workflow {
                    lines: Vec::new(),
                    ran: HashSet::new(),
                    undone: HashSet::new(),
                    tat: (f64::NEG_INFINITY, f64::NEG_INFINITY),
                    ahead: None,
                },
            );
        }
        let per_minute = self.per_minute;
        if let Some(w) = self.workflows.get_mut(e.workflow_id.as_ref()) {
            w.lines.push(here);
            if ran {
                w.ran.insert(e.action_id.as_ref().into());
            }
            if e.status == AuditStatus::RolledBack {
                w.undone.insert(e.action_id.as_ref().into());
            }
            if wrote && let Some(t) = crate::clock::parse_timestamp(&e.timestamp) {
                let made = w.ahead.filter(|(seen, _)| *seen == w.tat.1).map(|(_, m)| m);
                let (tat, latest) = &mut w.tat;
                let at = crate::budget::epoch_seconds(t);
                // Dated before the workflow's latest write: the clock went back. The
                // earlier writes are taken as made just before this one (the bucket as
                // they left it), not as still to come; or when this process's limiter
                // looked at them ahead, as made when that look took them to be (see
                // [`AuditLog::rate_tat`]), so that the refill it counted stands.
                if at < *latest {
                    *tat -= *latest - made.map_or(at, |m| m.min(at));
                    w.ahead = None;
                }
                *tat = crate::budget::advance_tat(*tat, at, per_minute);
                *latest = at;
            }
        }
        self.slots.push(Slot {
            at,
            // A line is at most a few KiB (paths and intents are cut): never near 4 GiB.
            len: u32::try_from(len).unwrap_or(u32::MAX),
            same_name: NO_SLOT,
            name,
            seq: e.seq,
            print,
            when: time_key(&e.timestamp),
            folder,
        });
        self.link(here);
    }

    /// Links slot `i` into the chain of its file name, when it is a change and the
    /// chains are kept.
    fn link(&mut self, i: usize) {
        let name = self.slots[i].name;
        if let (Some(by_name), Ok(here)) = (&mut self.by_name, u32::try_from(i))
            && name != NOT_A_CHANGE
            && here != NO_SLOT
        {
            let before = by_name.insert(name, here).unwrap_or(NO_SLOT);
            self.slots[i].same_name = before;
            if let Some(b) = self.slots.get(before as usize).map(|b| b.when) {
                self.slots[i].when = self.slots[i].when.max(b);
            }
        }
    }

    /// Whether every slot can be linked by name (the log holds fewer than 2³² lines).
    fn names_complete(&self) -> bool {
        self.slots.len() < NO_SLOT as usize
    }

    /// The slots of changes to files of this `ending` (and any whose names share its
    /// hashes) whose timestamps may be later than `after`, in file order, linking every
    /// slot by name the first time.
    fn changes_to(&mut self, ending: Ending<'_>, after: &str) -> Vec<Slot> {
        let after = match time_key(after) {
            // A text it cannot place may be later than any line.
            ANY_TIME => 0,
            key => key,
        };
        if !self.names_complete() {
            return self
                .slots
                .iter()
                .filter(|s| s.when >= after)
                .copied()
                .collect();
        }
        if self.by_name.is_none() {
            self.by_name = Some(HashMap::default());
            (0..self.slots.len()).for_each(|i| self.link(i));
        }
        let mut chain = Vec::new();
        let mut at = self
            .by_name
            .as_ref()
            .and_then(|m| m.get(&name_hash(&self.keys, ending.name.as_bytes())))
            .copied()
            .unwrap_or(NO_SLOT);
        let folder = ending.folder.map(|f| name_hash(&self.keys, f.as_bytes()));
        while let Some(s) = self.slots.get(at as usize)
            && s.when >= after
        {
            if folder.is_none_or(|f| s.folder == f) {
                chain.push(*s);
            }
            at = s.same_name;
        }
        chain.reverse();
        chain
    }

    /// Whether the line `seq` is in the log with this `entry_hash`. A line that no longer
    /// reads as it did counts as not; a failed read, as yes (nothing was found wrong).
    fn holds(&self, file: &LogFile, seq: u64, entry_hash: &str) -> bool {
        let at = usize::try_from(seq)
            .ok()
            .and_then(|s| s.checked_sub(1))
            .filter(|&i| self.slots.get(i).is_some_and(|s| s.seq == seq))
            .or_else(|| self.slots.iter().rposition(|s| s.seq == seq));
        let Some(i) = at else { return false };
        match read_back(&self.keys, file, &self.slots[i..=i]) {
            Ok(lines) => lines.first().is_some_and(|e| e.entry_hash == entry_hash),
            Err(e) => e.kind() != io::ErrorKind::InvalidData,
        }
    }
}

/// A line of the log that reads as an entry (without its newline), its keyed hash, and
/// its view.
struct Parsed<'a> {
    line: &'a [u8],
    print: u64,
    /// Its [`Slot::name`] and [`Slot::folder`].
    names: (u32, u32),
    view: LineView<'a>,
}

type ParsedLines<'a> = crate::journal::ParsedLines<Parsed<'a>>;

/// The non-empty lines of `buf`, parsed.
fn parse_lines<'a>(buf: &'a [u8], keys: &RandomState) -> ParsedLines<'a> {
    ParsedLines::of(buf, |line, view: LineView<'a>| {
        Ok(Parsed {
            line,
            print: keys.hash_one(line),
            names: name_of(keys, view.status, &view.target_path),
            view,
        })
    })
}

/// Of `lines` (changes to files of one name, in the log's order), the changes another
/// run made to one target after `since`, as [`AuditLog::changes_since`] gives them.
/// "After" is by the timestamps' text: the lines were picked by [`time_key`], which
/// orders as the text does, from a bound no later (by text) than `since`.
pub(crate) fn changes_after<'a>(
    lines: impl IntoIterator<Item = &'a SandboxAuditEntry>,
    is_target: impl Fn(&str) -> bool,
    since: &str,
    not_execution: &str,
) -> Vec<SandboxAuditEntry> {
    let mut found: Vec<SandboxAuditEntry> = lines
        .into_iter()
        .filter(|e| is_change_after(e, &is_target, since, not_execution))
        .cloned()
        .collect();
    found.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
    found
}

/// Whether `e` is a change (a write or a restore) to the target `is_target` names,
/// dated after `since`, by a run other than `not_execution`.
fn is_change_after(
    e: &SandboxAuditEntry,
    is_target: impl Fn(&str) -> bool,
    since: &str,
    not_execution: &str,
) -> bool {
    e.timestamp.as_str() > since
        && matches!(e.status, AuditStatus::Success | AuditStatus::RolledBack)
        && e.execution_id != not_execution
        && is_target(&e.target_path)
}

/// What reads lines back from the log without its lock (see [`AuditLog::picked`]).
struct Reader {
    keys: RandomState,
    file: std::sync::Arc<LogFile>,
}

impl Reader {
    fn read(&self, slots: &[Slot]) -> io::Result<Vec<SandboxAuditEntry>> {
        read_back(&self.keys, &self.file, slots)
    }
}

/// Reads the lines at `slots` (in file order) back from the log, a run of nearby
/// lines in one read; each must be, byte for byte, the line indexed there.
fn read_back(
    keys: &RandomState,
    file: &LogFile,
    slots: &[Slot],
) -> io::Result<Vec<SandboxAuditEntry>> {
    /// Bytes between two lines that are read rather than skipped with a new read.
    const GAP: u64 = 16 << 10;
    let mut out = Vec::with_capacity(slots.len());
    let mut rest = slots;
    while let Some(first) = rest.first() {
        let mut end = first.at + u64::from(first.len);
        let mut n = 1;
        while let Some(s) = rest.get(n)
            && s.at >= end
            && s.at - end <= GAP
            && s.at + u64::from(s.len) - first.at <= READ_SPAN
        {
            end = s.at + u64::from(s.len);
            n += 1;
        }
        let buf = read_span(file, first.at, end, first.seq)?;
        for s in &rest[..n] {
            let from = (s.at - first.at) as usize;
            let line = &buf[from..from + s.len as usize];
            if keys.hash_one(line) != s.print {
                return Err(changed_under(s.seq));
            }
            out.push(
                serde_json::from_slice::<SandboxAuditEntry>(line)
                    .map_err(|_| changed_under(s.seq))?,
            );
        }
        rest = &rest[n..];
    }
    Ok(out)
}

/// The most one read of lines back from the log takes (a longer line is read whole).
const READ_SPAN: u64 = 8 << 20;

/// The bytes from `from` to `to` of the log, which held the line `seq` there.
fn read_span(file: &LogFile, from: u64, to: u64, seq: u64) -> io::Result<Vec<u8>> {
    file.read_range(from, to - from).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            changed_under(seq)
        } else {
            e
        }
    })
}

/// A line read before that is no longer there as it was: lines are only ever appended.
fn changed_under(seq: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "audit line {seq} of {AUDIT_FILE} is not the line this process read there: the trail was changed in place; run `audit verify`"
        ),
    )
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
                e.entry_hash = e.compute_hash();
                prev = e.entry_hash.clone();
                let before = bytes.len();
                crate::journal::write_line(&mut bytes, &e)?;
                lens.push((
                    bytes.len() - before,
                    index.keys.hash_one(&bytes[before..bytes.len() - 1]),
                    name_of(&index.keys, e.status, &e.target_path),
                ));
                out.push(e);
            }
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
            (Some(last), Some(copy)) => self.under_log_lock(|_, file| {
                // Under the log's lock, like every head write. The lines were out of the
                // lock while they synced: a head moved over lines cut meanwhile (and
                // replaced by another writer's) would hide the cut, so they are read back.
                let still = match file.read_range(at, len) {
                    Ok(b) => b == copy,
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
            }),
            _ => self.relaxed_progress(&written),
        };
        if let Err(e) = moved {
            tracing::warn!(error = %e, "the audit head could not follow the log; it lags until it next moves");
        }
        Ok(written)
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

    /// `get_sandbox_audit_stats`.
    pub fn stats(&self) -> io::Result<AuditStats> {
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

/// `report` (of a sound chain), failed when the registry holds artifacts, `missing`,
/// whose writes the trail does not record; `pending` are such artifacts of workflows
/// whose run records still await recovery, said as such rather than as tampering.
pub(crate) fn with_unlogged(
    report: VerifyReport,
    missing: &[ArtifactEntry],
    pending: &[ArtifactEntry],
) -> VerifyReport {
    let Some(first) = missing.first() else {
        let Some(first) = pending.first() else {
            return report;
        };
        return VerifyReport {
            ok: false,
            first_bad_seq: None,
            reason: Some(format!(
                "{NOT_YET_RECORDED} the writes of {} registered artifact(s) (the first: {}, action {} of workflow {}): their run stopped before writing its lines (killed, or a full disk) and left its record for recovery, which records them at the workflow's next use or the next start once the state directory can be written; verify again then",
                pending.len(),
                first.artifact_id,
                shown_path(&first.action_id),
                shown_path(&first.workflow_id)
            )),
            ..report
        };
    };
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the artifact registry holds {} artifact(s) whose writes the audit trail does not record (the first: {}, action {} of workflow {}): lines were removed from the trail with its head made to match, the trail was replaced, or lines were added to the registry",
            missing.len(),
            first.artifact_id,
            shown_path(&first.action_id),
            shown_path(&first.workflow_id)
        )),
        ..report
    }
}

/// `report`, failed when the registry holds `unreadable` whole lines that are no
/// artifact: no write of the runtime leaves one (a line a crash cut short is removed when
/// the registry is opened), so they were added there or damaged.
pub(crate) fn with_unreadable_registry(report: VerifyReport, unreadable: u64) -> VerifyReport {
    if unreadable == 0 || !report.ok {
        return report;
    }
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the artifact registry holds {unreadable} line(s) that cannot be read as artifacts: lines were added to or damaged in the registry"
        )),
        ..report
    }
}

/// A file write the trail records as done, as the artifact registry must hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedWrite {
    /// Its line's sequence number.
    pub seq: u64,
    /// The workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// The file written.
    pub target_path: String,
    /// The SHA-256 of the bytes written.
    pub after_checksum: String,
}

/// `report` (of a sound chain), failed when writes the trail records as done,
/// `unregistered` (see [`RecordedWrite`]), are missing from the artifact registry
/// or registered there with other bytes than their lines name.
pub(crate) fn with_unregistered(
    report: VerifyReport,
    unregistered: &[&RecordedWrite],
) -> VerifyReport {
    let Some(first) = unregistered.first() else {
        return report;
    };
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the audit trail records {} write(s) the artifact registry does not hold as recorded, one artifact with the bytes its line names (the first: line {}, action {} of workflow {}, {}): lines were removed from, changed in or added to the registry",
            unregistered.len(),
            first.seq,
            shown_path(&first.action_id),
            shown_path(&first.workflow_id),
            shown_path(&first.target_path)
        )),
        ..report
    }
}

/// The `error` of the success line recovery appends for a dead run's write that landed
/// and was overwritten by a later one before it was registered: no artifact is listed
/// for it (its size went with the later write).
pub const UNREGISTERED_DONE: &str = "written, as the later write's starting point shows, by a run that died before registering it: no artifact is listed for it";

/// The `error` of the success line recovery appends for a dead run's registered write
/// whose snapshot folder was removed or cannot be trusted: it landed (it was registered
/// after), and cannot be rolled back.
pub const DONE_WITHOUT_SNAPSHOT: &str = "written by a run that died before recording it, whose snapshot is missing or not trusted: it cannot be rolled back";

/// The writes of `recorded` the registry (`registered`: its entries for their actions,
/// or more) does not hold as their lines name them: one artifact per action, with the
/// checksum its line names. An action with no entry, with an entry of other bytes, or
/// with a second line beside its own (added, or a copy of it) is listed.
pub fn unregistered<'a>(
    recorded: &'a [RecordedWrite],
    registered: &[ArtifactEntry],
) -> Vec<&'a RecordedWrite> {
    let mut held: std::collections::HashMap<(&str, &str), Vec<&ArtifactEntry>> =
        std::collections::HashMap::new();
    for a in registered {
        held.entry((a.workflow_id.as_str(), a.action_id.as_str()))
            .or_default()
            .push(a);
    }
    recorded
        .iter()
        .filter(|e| {
            let entries = held
                .get(&(e.workflow_id.as_str(), e.action_id.as_str()))
                .map_or(&[][..], Vec::as_slice);
            // Exactly one: a copy of the action's own line, however exact, counts its
            // write twice in the lists and budgets.
            !matches!(entries, [a] if a.checksum_sha256 == e.after_checksum)
        })
        .collect()
}

/// `report` (of a sound chain), failed when the registry (`registered`: its entries for
/// the actions the trail records, or more) holds more than one artifact for one action:
/// an action registers one at most, whatever became of it (a success's copies are
/// [`unregistered`]'s; this finds those of actions that failed or were rolled back).
pub(crate) fn with_doubled(report: VerifyReport, registered: &[ArtifactEntry]) -> VerifyReport {
    let mut seen = std::collections::HashMap::new();
    for a in registered {
        let n = seen
            .entry((a.workflow_id.as_str(), a.action_id.as_str()))
            .or_insert(0usize);
        *n += 1;
        if *n == 2 {
            return VerifyReport {
                ok: false,
                first_bad_seq: None,
                reason: Some(format!(
                    "the artifact registry holds more than one artifact for action {} of workflow {} (the second: {}), which registers one at most: lines were added to the registry",
                    shown_path(&a.action_id),
                    shown_path(&a.workflow_id),
                    a.artifact_id
                )),
                ..report
            };
        }
    }
    report
}

/// The actions, by workflow, that an audit log records as having written.
pub type Writes = std::collections::HashMap<String, std::collections::HashSet<String>>;

/// Whether `logged` records the write that registered `artifact`.
pub fn records(logged: &Writes, workflow_id: &str, action_id: &str) -> bool {
    logged
        .get(workflow_id)
        .is_some_and(|actions| actions.contains(action_id))
}

/// [`AuditLog::verify`] for the state directory at `state_dir`, writing nothing: no
/// recovery, no lock, and a torn last line left out as a crash leaves it. For a state
/// directory this process cannot write (a read-only copy, a read-only mount), where
/// opening the runtime fails.
/// With `registry`, the registry is compared too, as [`crate::Sandbox::audit_verify`]
/// does when the logs were written with durable appends.
pub fn verify_read_only(state_dir: &std::path::Path, registry: bool) -> io::Result<VerifyReport> {
    let mut files =
        StateDir::open_without_opening(state_dir, &[AUDIT_FILE, HEAD_FILE, ARTIFACTS_FILE])?
            .into_iter();
    let (log, head, registered) = (
        files.next().flatten(),
        files.next().flatten(),
        files.next().flatten(),
    );
    let head = match head {
        Some(f) => {
            let len = f.len()?;
            let mut first = vec![0; len.min(BLOCK as u64) as usize];
            f.read_exact_at(&mut first, 0)?;
            head_in(len, &first)
        }
        None => HeadFile::Missing,
    };
    let mut check = TrailCheck::new(head, registry);
    if let Some(log) = &log {
        let read_at = |buf: &mut [u8], at: u64| log.read_exact_at(buf, at);
        scan(&read_at, 0, log.len()?, &mut |piece| Ok(check.piece(piece)))?;
    }
    let (report, logged, recorded) = check.finish();
    if !report.ok || !registry {
        return Ok(report);
    }
    let (entries, unreadable) = match &registered {
        Some(file) => registry_entries(file)?,
        None => (Vec::new(), 0),
    };
    let report = with_unreadable_registry(report, unreadable);
    if !report.ok {
        return Ok(report);
    }
    let missing: Vec<ArtifactEntry> = entries
        .iter()
        .filter(|a| !records(&logged, &a.workflow_id, &a.action_id))
        .cloned()
        .collect();
    let awaiting = awaiting_recovery(state_dir, &missing);
    let (pending, missing): (Vec<_>, Vec<_>) = missing
        .into_iter()
        .partition(|a| awaiting.contains(&a.workflow_id));
    let report = with_unlogged(report, &missing, &pending);
    if !report.ok {
        return Ok(report);
    }
    let report = with_unregistered(report, &unregistered(&recorded, &entries));
    if !report.ok {
        return Ok(report);
    }
    Ok(with_doubled(report, &entries))
}

/// The artifacts a registry file holds, and how many of its whole lines are none. A last
/// line without its newline is one a crash cut short, which opening the registry
/// removes: not counted.
fn registry_entries(file: &StateFile) -> io::Result<(Vec<ArtifactEntry>, u64)> {
    let mut entries = Vec::new();
    let mut unreadable = 0;
    let len = file.len()?;
    let read_at = |buf: &mut [u8], at: u64| file.read_exact_at(buf, at);
    let end = scan(&read_at, 0, len, &mut |piece| {
        match piece {
            Piece::Lines(_, buf) => {
                for (_, line) in crate::journal::json_lines::<ArtifactEntry>(&buf) {
                    match line {
                        Ok(a) => entries.push(a),
                        Err(_) => unreadable += 1,
                    }
                }
            }
            Piece::Overlong(..) => unreadable += 1,
        }
        Ok(ControlFlow::Continue(()))
    })?;
    // A cut line that still reads whole is an entry, as the runtime's reader takes it.
    if len - end < crate::journal::MAX_LINE {
        let mut cut = vec![0; (len - end) as usize];
        file.read_exact_at(&mut cut, end)?;
        entries.extend(serde_json::from_slice::<ArtifactEntry>(&cut).ok());
    }
    Ok((entries, unreadable))
}

/// The workflows of `missing` (artifacts whose writes the trail lacks) whose run record
/// in the state directory at `state_dir` awaits recovery: a run that died between its
/// registry line and its audit line, no tampering. One record at a time, and one that
/// cannot be read is taken as awaiting (it proves no tampering either); with no folder
/// of run records at all, none awaits anything.
fn awaiting_recovery(
    state_dir: &std::path::Path,
    missing: &[ArtifactEntry],
) -> std::collections::HashSet<String> {
    let mut workflows: Vec<&str> = missing.iter().map(|a| a.workflow_id.as_str()).collect();
    workflows.sort_unstable();
    workflows.dedup();
    let inflight = state_dir.join(crate::confine::state::INFLIGHT_DIR);
    let records_kept = !matches!(
        crate::confine::root::probe_checked_dir_through_link(&inflight, "run records"),
        Ok(None)
    );
    workflows
        .into_iter()
        .filter(|w| crate::plan::is_valid_id(w))
        .filter(|w| {
            StateDir::read_without_opening(
                &inflight,
                &[&format!("{w}.json")],
                crate::confine::state::BLOCK as u64,
            )
            .map_or(records_kept, |read| {
                read.into_iter()
                    .flatten()
                    .any(|rec| crate::recovery::record_awaits_recovery(&rec))
            })
        })
        .map(str::to_owned)
        .collect()
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

/// One pass over the trail's whole lines, in file order: the chain checked line by line
/// and against the head file, and, while it holds, the writes the lines record gathered
/// (when asked to). A few MiB of the trail are held at a time, however long it is.
struct TrailCheck {
    head: HeadFile,
    gather: bool,
    prev: String,
    expected_seq: u64,
    /// Lines read so far.
    lines: u64,
    hash_at_head: Option<String>,
    /// The verdict, once a line broke the chain.
    failed: Option<VerifyReport>,
    writes: Writes,
    recorded: Vec<RecordedWrite>,
}

impl TrailCheck {
    /// `head`: what the head file holds. `gather`: whether the writes are gathered too.
    fn new(head: HeadFile, gather: bool) -> Self {
        Self {
            head,
            gather,
            prev: GENESIS_HASH.to_owned(),
            expected_seq: 1,
            lines: 0,
            hash_at_head: None,
            failed: None,
            writes: Writes::new(),
            recorded: Vec::new(),
        }
    }

    /// Reads the next piece of the trail; breaks off once the chain is broken.
    fn piece(&mut self, piece: Piece) -> ControlFlow<()> {
        match piece {
            // Split on every newline: an empty line is a line too (and a broken chain).
            Piece::Lines(_, buf) => buf[..buf.len() - 1]
                .split(|&b| b == b'\n')
                .try_for_each(|line| self.line(line)),
            Piece::Overlong(_, len) => {
                self.lines += 1;
                let n = self.lines;
                self.fail(
                    self.expected_seq,
                    format!(
                        "line {n} is {len} bytes long, longer than any line the runtime writes (at most {}), so it was made or changed by hand",
                        crate::journal::MAX_LINE
                    ),
                )
            }
        }
    }

    fn fail(&mut self, seq: u64, reason: String) -> ControlFlow<()> {
        self.failed = Some(VerifyReport {
            ok: false,
            entries: self.lines,
            first_bad_seq: Some(seq),
            reason: Some(reason),
        });
        ControlFlow::Break(())
    }

    fn line(&mut self, line: &[u8]) -> ControlFlow<()> {
        self.lines += 1;
        let (n, expected) = (self.lines, self.expected_seq);
        if line.is_empty() {
            return self.fail(
                expected,
                format!("line {n} is empty: the runtime never writes one, so it was inserted"),
            );
        }
        let e: SandboxAuditEntry = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(err) => {
                let why = crate::shape_words::worded_in_line::<SandboxAuditEntry>(
                    line,
                    &err,
                    "the entry",
                );
                return self.fail(
                    expected,
                    format!("line {n} is not a valid audit entry: {why}"),
                );
            }
        };
        if e.seq != expected {
            return self.fail(
                expected,
                format!(
                    "line {n} has seq {} where {expected} was expected: a line was removed, inserted or moved",
                    e.seq
                ),
            );
        }
        if e.prev_hash != self.prev {
            return self.fail(
                e.seq,
                format!(
                    "entry {} does not chain to the entry before it: a line was removed or reordered",
                    e.seq
                ),
            );
        }
        // The hash covers the entry's meaning; the line must also be the very bytes the
        // runtime wrote for it, so that no edit at all (spaces, key order, escapes) passes.
        if !e.is_as_written(line) {
            return self.fail(
                e.seq,
                format!(
                    "entry {} does not match its hash: the line was edited",
                    e.seq
                ),
            );
        }
        if matches!(&self.head, HeadFile::At(h) if h.seq == e.seq) {
            self.hash_at_head = Some(e.entry_hash.clone());
        }
        self.prev.clone_from(&e.entry_hash);
        self.expected_seq += 1;
        if self.gather {
            self.gather(e);
        }
        ControlFlow::Continue(())
    }

    /// Keeps what `e` records of a write: the actions that changed a file, or tried to
    /// (succeeded, failed — a failure after the registry line leaves its artifact
    /// behind, see `Sandbox::audit_verify` — or rolled back; blocked and simulated
    /// actions register nothing, nor does a `create_directory`: a folder is no
    /// artifact), and the successful writes that registered an artifact (but those
    /// recovery found done and could not register, [`UNREGISTERED_DONE`]; the registry
    /// line is appended before the audit line, so each of them is registered).
    fn gather(&mut self, e: SandboxAuditEntry) {
        let op = crate::catalog::op_for_intent(&e.mutation_type);
        let of_a_file = !op.is_some_and(|op| op.is_directory());
        if e.status == AuditStatus::Success
            && e.error.as_deref() != Some(UNREGISTERED_DONE)
            && op.is_some()
            && of_a_file
        {
            self.recorded.push(RecordedWrite {
                seq: e.seq,
                workflow_id: e.workflow_id.clone(),
                action_id: e.action_id.clone(),
                target_path: e.target_path,
                after_checksum: e.after_checksum.unwrap_or_default(),
            });
        }
        if matches!(
            e.status,
            AuditStatus::Success | AuditStatus::Failed | AuditStatus::RolledBack
        ) && of_a_file
        {
            self.writes
                .entry(e.workflow_id)
                .or_default()
                .insert(e.action_id);
        }
    }

    /// The verdict (the chain's, then the head's), and the writes gathered.
    fn finish(self) -> (VerifyReport, Writes, Vec<RecordedWrite>) {
        let gathered = |report| (report, self.writes, self.recorded);
        if let Some(failed) = self.failed {
            return gathered(failed);
        }
        let (n, last_seq) = (self.lines, self.expected_seq - 1);
        let bad = |seq: u64, reason: String| VerifyReport {
            ok: false,
            entries: n,
            first_bad_seq: Some(seq),
            reason: Some(reason),
        };
        let problem = match &self.head {
            HeadFile::At(h) if h.seq > last_seq => bad(
                last_seq + 1,
                format!(
                    "the log ends at seq {last_seq} but its head records seq {}: lines were removed from the end",
                    h.seq
                ),
            ),
            HeadFile::At(h)
                if h.seq > 0 && self.hash_at_head.as_deref() != Some(h.entry_hash.as_str()) =>
            {
                bad(
                    h.seq,
                    format!(
                        "entry {} differs from the hash recorded in the head: the log was rewritten",
                        h.seq
                    ),
                )
            }
            HeadFile::Missing if n > 0 => VerifyReport {
                first_bad_seq: None,
                ..bad(
                    0,
                    format!(
                        "the head file {HEAD_FILE} is missing although the log holds {n} entries: it was removed, so lines cut from the end cannot be ruled out"
                    ),
                )
            },
            HeadFile::Damaged(e) => VerifyReport {
                first_bad_seq: None,
                ..bad(0, format!("the head file {HEAD_FILE} is damaged ({e})"))
            },
            _ => VerifyReport {
                ok: true,
                entries: n,
                first_bad_seq: None,
                reason: None,
            },
        };
        gathered(problem)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use chrono::{DateTime, Duration, Utc};

    #[test]
    fn a_later_timestamp_text_never_has_a_smaller_time_key() {
        let mut t = DateTime::parse_from_rfc3339("2000-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut last = (crate::clock::timestamp(t), 0);
        let mut r = 1u64;
        let mut seen = 0;
        // Steps of every scale from a microsecond to about 100 days, so that each field
        // turns over against the others; bounded, and past 2099 whatever the steps.
        for _ in 0..2_000_000 {
            r = r.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let scale = 10i64.pow(((r >> 33) % 13) as u32);
            t += Duration::microseconds(scale * (1 + ((r >> 20) % 9) as i64));
            let text = crate::clock::timestamp(t);
            let key = time_key(&text);
            if text.as_str() >= "2100" {
                assert_eq!(key, ANY_TIME, "{text}");
                break;
            }
            assert_ne!(key, ANY_TIME, "{text}");
            assert!(
                text > last.0 && key >= last.1,
                "{} {} / {text} {key}",
                last.0,
                last.1
            );
            last = (text, key);
            seen += 1;
        }
        assert!(last.0.starts_with("2099"), "{}", last.0);
        assert!(seen > 100, "{seen}");
        assert!(time_key("2026-01-01T00:00:01.000000Z") < time_key("2026-01-01T00:00:02.000000Z"));
        assert_eq!(
            time_key("2026-01-01T00:00:01.000000Z"),
            time_key("2026-01-01T00:00:01.999999Z")
        );
        assert!(time_key("2016-12-31T23:59:60.500000Z") < time_key("2017-01-01T00:00:00.000000Z"));
        // Before 2000 (a clock not yet set): below every key, whatever the other fields.
        for early in ["1970-01-01T00:00:05.000000Z", "1999-13-32T24:60:62.000000Z"] {
            assert_eq!(time_key(early), 0, "{early}");
        }
        for other in [
            "",
            "2100-01-01T00:00:00.000000Z",
            "+10000-01-01T00:00:00.000000Z",
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:01.000000+01:00",
            "2026-13-01T00:00:01.000000Z",
            "2026-01-01T24:00:01.000000Z",
            "2026-01-01 00:00:01.000000Z",
            "2026-01-01T00:00:01.00000٠Z",
        ] {
            assert_eq!(time_key(other), ANY_TIME, "{other}");
        }
    }

    #[test]
    fn a_slot_takes_forty_eight_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
    }
}
