//! The trail's index in memory: where each line lies (the lines are read back from the
//! file when asked for), the chains of changes to files of each name and folder, each
//! workflow's lines, actions and rate, the directories claimed, and the counts.
//!
//! It holds where each line lies and what each workflow did (actions written and rolled
//! back, rate-limiter state), not the lines: those are read back from the file when asked
//! for, since a line once written never changes. Each slot keeps a keyed hash of its line,
//! and a line read back that is not the one indexed is refused, naming `audit verify`.
//!
//! Look-ups of the changes to one file (recovery's, and a rollback's conflict check) follow
//! a chain of the lines by file name, built the first time it is asked for. Each slot keeps
//! its line's time to the second, so a look-up of the changes since a snapshot reads back
//! only the lines that may be dated after it, and a hash of the name of the folder holding
//! the file, so one for a file in a folder of its root reads back only the lines of that
//! folder's name (`Ending`: what every spelling of the root leaves of the path). Lines are
//! picked under the index's lock and read back after it is let go: an append never waits
//! behind a long look-up.
//!
//! A `create_directory` that found its directory standing claims it: the index keeps, per
//! directory, the claims that stand. One counts against a maker only when recorded after
//! the maker ran, and is withdrawn by its rollback, whatever spelling of the root that
//! used.

#[cfg(doc)]
use super::AuditLog;
use super::{AUDIT_FILE, AuditStats, AuditStatus, DirClaim, GENESIS_HASH, SandboxAuditEntry};
use crate::catalog::MutationClass;
use crate::confine::state::LogFile;
use crate::reason::ReasonCode;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::io;

/// Where a line lies in the log. Lines are read back from the file when asked for (a
/// line, once written, never changes), so an index costs a few dozen bytes per line
/// rather than the line's text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) at: u64,
    /// Without its newline.
    pub(super) len: u32,
    /// The slot before it of a change (a write or a restore) to a file of the same name
    /// ([`NO_SLOT`] for none), for [`AuditLog::changes_since`].
    same_name: u32,
    /// A keyed hash of the file name of a change ([`NOT_A_CHANGE`] for other lines): the
    /// chains of [`Slot::same_name`] are built from it without reading the log again.
    name: u32,
    pub(super) seq: u64,
    /// A keyed hash of the line's bytes ([`Index::keys`]): a line read back is the line
    /// indexed, byte for byte.
    pub(super) print: u64,
    /// Its timestamp's [`time_key`], raised, once the slot is linked into its chain by
    /// name, to the greatest of the chain's earlier lines: a chain walked back from its
    /// newest line ends, for a look-up of the changes since a time, at the first slot
    /// below it, and the lines that cannot be later are neither read back nor walked (a
    /// trail may name one file name many thousand times). A line dated before the lines
    /// around it (a recovery's, after the fact) only has a few more read; one dated
    /// after the lines that follow it (a clock set forward, then back) has every later
    /// line of its chain read until their times pass its own. Free: the slot's padding
    /// held it.
    pub(super) when: u32,
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
pub(super) fn name_of(keys: &RandomState, status: AuditStatus, target_path: &str) -> (u32, u32) {
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
pub(super) const ANY_TIME: u32 = u32::MAX;

/// A number that orders as the text of a timestamp does, to the second, for those
/// [`crate::clock::timestamp`] writes in the years 2000–2099
/// (`2026-12-04T06:45:44.123456Z`): of two such texts, the greater never has the smaller
/// key. Each field is a digit of its own base, so the key needs no calendar and no
/// field's value is trusted beyond its width. 0 for one of that shape dated before 2000
/// (a clock not yet set at boot), whose text orders below all of them; [`ANY_TIME`] for
/// any other text.
pub(super) fn time_key(ts: &str) -> u32 {
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
pub(super) struct LineView<'a> {
    pub(super) seq: u64,
    #[serde(borrow)]
    pub(super) timestamp: Cow<'a, str>,
    #[serde(rename = "execution_id")]
    _execution_id: Text,
    #[serde(borrow)]
    pub(super) workflow_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) action_id: Cow<'a, str>,
    pub(super) mutation_class: Option<MutationClass>,
    #[serde(borrow)]
    pub(super) mutation_type: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) target_path: Cow<'a, str>,
    #[serde(rename = "before_checksum")]
    _before_checksum: Option<Text>,
    #[serde(rename = "after_checksum")]
    _after_checksum: Option<Text>,
    #[serde(rename = "rollback_available")]
    _rollback_available: bool,
    pub(super) rollback_path: Option<Text>,
    pub(super) status: AuditStatus,
    pub(super) reason_code: Option<ReasonCode>,
    #[serde(rename = "error")]
    _error: Option<Text>,
    #[serde(rename = "prev_hash")]
    _prev_hash: Text,
    #[serde(borrow, default)]
    pub(super) entry_hash: Cow<'a, str>,
}

/// A JSON string, read and let go (no allocation).
pub(super) struct Text;

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
    pub(super) fn of(e: &'a SandboxAuditEntry) -> Self {
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

/// Counts the line `e` in the trail's stats.
fn count_line(s: &mut AuditStats, e: &LineView<'_>) {
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
}

/// What the index knows of one workflow.
#[derive(Debug)]
pub(super) struct Workflow {
    /// Its lines (indexes into [`Index::slots`]).
    pub(super) lines: Vec<usize>,
    /// The actions the trail records as having run a write (not a rollback): done, undone,
    /// or failed after their snapshot; asked before every action, so not a scan of the
    /// workflow's lines.
    pub(super) ran: HashSet<Box<str>>,
    /// The actions the trail records as rolled back: asked for a write's default
    /// parent, so not a scan either.
    pub(super) undone: HashSet<Box<str>>,
    /// Whether a line of it is no refusal: a write, a simulated or failed action, a
    /// rollback (a workflow named as a plan's parent must have done something).
    pub(super) acted: bool,
    /// Rate-limiter state (GCRA TAT) and the latest write's time, kept current as lines
    /// arrive.
    pub(super) tat: (f64, f64),
    /// Once a look at the rate found the latest write dated after its `now` (the clock
    /// set back since): that write's time and when the look took it to be made.
    pub(super) ahead: Option<(f64, f64)>,
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
pub(super) struct Index {
    pub(super) slots: Vec<Slot>,
    /// Where the lines read so far end in the file.
    pub(super) end: u64,
    /// The newest slot of a change to a file of each name (by [`Slot::name`]): the head
    /// of the chain [`Slot::same_name`] links. Built the first time it is asked for
    /// (recovery's doubtful cases only), kept current after.
    by_name: Option<HashMap<u32, u32, std::hash::BuildHasherDefault<Prehashed>>>,
    /// This process's key for hashing names and lines: another cannot make two collide.
    pub(super) keys: RandomState,
    pub(super) per_minute: u32,
    pub(super) workflows: HashMap<String, Workflow>,
    /// The `create_directory` actions that stand (not rolled back) for each directory
    /// they named, as recorded, with when they did: its existence is their result (see
    /// [`AuditLog::directory_claims`]). A rollback's line may spell the root otherwise,
    /// so a claim is withdrawn by its action, wherever it is filed.
    pub(super) dir_claims: HashMap<String, Vec<DirClaim>>,
    claim_paths: HashMap<(String, String), String>,
    pub(super) last_seq: u64,
    pub(super) last_hash: String,
    pub(super) stats: AuditStats,
}

impl Index {
    pub(super) fn new(per_minute: u32) -> Self {
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

    pub(super) fn workflow(&self, id: &str) -> Option<&Workflow> {
        self.workflows.get(id)
    }

    /// Indexes whole lines read from the log at offset `at`.
    pub(super) fn ingest<'a>(&mut self, at: u64, buf: &'a [u8]) {
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
                first_within_its_line = %err,
                "unreadable audit lines (audit verify will report them)"
            );
        }
        self.end = at + buf.len() as u64;
    }

    /// Indexes the line `e`, found at `at`, `len` bytes long, with its keyed hash, its
    /// [`Slot::name`] and its [`Slot::folder`].
    pub(super) fn insert(
        &mut self,
        e: &LineView<'_>,
        at: u64,
        len: usize,
        (print, (name, folder)): (u64, (u32, u32)),
    ) {
        count_line(&mut self.stats, e);
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
            self.note_dir_claim(e);
        }
        self.last_seq = e.seq;
        self.last_hash.clear();
        self.last_hash.push_str(&e.entry_hash);
        let here = self.slots.len();
        self.note_in_workflow(e, here, ran, wrote);
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

    /// Keeps the claim of a `create_directory` line on its folder, or drops it when the
    /// line says the action was rolled back.
    fn note_dir_claim(&mut self, e: &LineView<'_>) {
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

    /// Files the line `e`, slot `here`, under its workflow: its place among the
    /// workflow's lines, the action's id spent when it `ran`, undone, and, when it
    /// `wrote`, the workflow's rate-limit bucket advanced.
    fn note_in_workflow(&mut self, e: &LineView<'_>, here: usize, ran: bool, wrote: bool) {
        let per_minute = self.per_minute;
        // Looked up before it is made: most lines' workflows are known, and their ids
        // are not copied for the look.
        if !self.workflows.contains_key(e.workflow_id.as_ref()) {
            self.workflows.insert(
                e.workflow_id.to_string(),
                Workflow {
                    lines: Vec::new(),
                    ran: HashSet::new(),
                    undone: HashSet::new(),
                    acted: false,
                    tat: (f64::NEG_INFINITY, f64::NEG_INFINITY),
                    ahead: None,
                },
            );
        }
        let Some(w) = self.workflows.get_mut(e.workflow_id.as_ref()) else {
            return;
        };
        w.lines.push(here);
        w.acted |= e.status != AuditStatus::Blocked;
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
    pub(super) fn names_complete(&self) -> bool {
        self.slots.len() < NO_SLOT as usize
    }

    /// The slots of changes to files of this `ending` (and any whose names share its
    /// hashes) whose timestamps may be later than `after`, in file order, linking every
    /// slot by name the first time.
    pub(super) fn changes_to(&mut self, ending: Ending<'_>, after: &str) -> Vec<Slot> {
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
    pub(super) fn holds(&self, file: &LogFile, seq: u64, entry_hash: &str) -> bool {
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
    pub(super) line: &'a [u8],
    pub(super) print: u64,
    /// Its [`Slot::name`] and [`Slot::folder`].
    pub(super) names: (u32, u32),
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
pub(super) fn is_change_after(
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
pub(super) struct Reader {
    pub(super) keys: RandomState,
    pub(super) file: std::sync::Arc<LogFile>,
}

impl Reader {
    pub(super) fn read(&self, slots: &[Slot]) -> io::Result<Vec<SandboxAuditEntry>> {
        read_back(&self.keys, &self.file, slots)
    }
}

/// Reads the lines at `slots` (in file order) back from the log, a run of nearby
/// lines in one read; each must be, byte for byte, the line indexed there.
pub(super) fn read_back(
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
