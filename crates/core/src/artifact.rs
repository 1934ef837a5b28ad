//! The artifact registry: every file an action leaves behind, with its checksum and
//! lineage. Append-only JSONL (`artifacts.jsonl`) plus an in-memory index kept current
//! incrementally, so queries never rescan the file.
//!
//! The index finds an entry by id, workflow, path and action, and links each entry to the
//! one before it at its path, so a write's default parent is found among all of the path's
//! versions. An entry is held as its strings in one allocation; queries hand out
//! `ArtifactEntry` copies, and filters see an `ArtifactRef`.

use crate::confine::state::StateDir;
use crate::journal::Journal;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::io;

/// Registry file name in the state directory.
pub const ARTIFACTS_FILE: &str = "artifacts.jsonl";

/// One registered artifact. The field names are a persisted format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactEntry {
    /// `art_…`, unique.
    pub artifact_id: String,
    /// Absolute path inside a sandbox root.
    pub path: String,
    /// SHA-256 of the bytes written.
    pub checksum_sha256: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// The intent that wrote it.
    pub mutation_type: String,
    /// The workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// The workflow's parent, if any.
    pub parent_workflow_id: Option<String>,
    /// The artifact this one derives from (by default the previous one at the same path).
    pub parent_artifact_id: Option<String>,
    /// `{execution_id}/{action_id}`: the exact action execution that produced it.
    pub generated_by_action: String,
    /// When (RFC 3339, UTC).
    pub created_at: String,
}

/// An artifact as the faces list it: the registry's entry, as stored, and whether the
/// audit trail records its write as rolled back since. The registry keeps every version
/// it was given, so an undone write's entry still names bytes its file no longer holds;
/// a listing says so beside the entry rather than leaving a script to read the trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedArtifact {
    /// The registry's entry (its fields are the document's).
    #[serde(flatten)]
    pub entry: ArtifactEntry,
    /// Its write was rolled back: the file no longer holds what `checksum_sha256` names.
    pub rolled_back: bool,
}

/// The string fields of an [`ArtifactEntry`], in the order [`Stored`] keeps them.
const ARTIFACT_ID: usize = 0;
const PATH: usize = 1;
const CHECKSUM: usize = 2;
const MUTATION_TYPE: usize = 3;
const WORKFLOW_ID: usize = 4;
const ACTION_ID: usize = 5;
const PARENT_WORKFLOW_ID: usize = 6;
const PARENT_ARTIFACT_ID: usize = 7;
const GENERATED_BY_ACTION: usize = 8;
const CREATED_AT: usize = 9;
const FIELDS: usize = 10;

/// An entry as the index holds it: its ten strings in one allocation. A million entries
/// then cost a million allocations, not eleven million, and under half the memory; a
/// query hands out [`ArtifactEntry`] copies made from it.
#[derive(Debug)]
struct Stored {
    /// The string fields one after another, in the order of the constants above.
    text: Box<str>,
    /// Where each field ends in `text` (a field absent is empty).
    ends: [u32; FIELDS],
    size_bytes: u64,
    /// Bit 0: `parent_workflow_id` present; bit 1: `parent_artifact_id` present.
    present: u8,
}

/// An artifact line as read, borrowing its strings from the line where it can (a
/// string holding an escape is decoded into one of its own): the registry packs them
/// into a [`Stored`] without an allocation per field. Same fields, same rules as
/// [`ArtifactEntry`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    artifact_id: Cow<'a, str>,
    #[serde(borrow)]
    path: Cow<'a, str>,
    #[serde(borrow)]
    checksum_sha256: Cow<'a, str>,
    size_bytes: u64,
    #[serde(borrow)]
    mutation_type: Cow<'a, str>,
    #[serde(borrow)]
    workflow_id: Cow<'a, str>,
    #[serde(borrow)]
    action_id: Cow<'a, str>,
    #[serde(borrow)]
    parent_workflow_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    parent_artifact_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    generated_by_action: Cow<'a, str>,
    #[serde(borrow)]
    created_at: Cow<'a, str>,
}

impl<'a> Line<'a> {
    fn of(e: &'a ArtifactEntry) -> Self {
        let b = |s: &'a String| Cow::Borrowed(s.as_str());
        Self {
            artifact_id: b(&e.artifact_id),
            path: b(&e.path),
            checksum_sha256: b(&e.checksum_sha256),
            size_bytes: e.size_bytes,
            mutation_type: b(&e.mutation_type),
            workflow_id: b(&e.workflow_id),
            action_id: b(&e.action_id),
            parent_workflow_id: e.parent_workflow_id.as_ref().map(b),
            parent_artifact_id: e.parent_artifact_id.as_ref().map(b),
            generated_by_action: b(&e.generated_by_action),
            created_at: b(&e.created_at),
        }
    }
}

impl Stored {
    /// Packs the fields; `None` when they hold more than 4 GiB in all (no entry the
    /// runtime writes comes near; a line that long is taken for a corrupt one).
    fn pack(fields: [Option<&str>; FIELDS], size_bytes: u64) -> Option<Self> {
        let mut text = String::with_capacity(fields.iter().flatten().map(|f| f.len()).sum());
        let mut ends = [0u32; FIELDS];
        for (end, field) in ends.iter_mut().zip(fields) {
            text.push_str(field.unwrap_or(""));
            *end = u32::try_from(text.len()).ok()?;
        }
        let present = u8::from(fields[PARENT_WORKFLOW_ID].is_some())
            | (u8::from(fields[PARENT_ARTIFACT_ID].is_some()) << 1);
        Some(Self {
            text: text.into_boxed_str(),
            ends,
            size_bytes,
            present,
        })
    }

    fn of_entry(e: &ArtifactEntry) -> Option<Self> {
        Self::of_line(&Line::of(e))
    }

    fn of_line(l: &Line<'_>) -> Option<Self> {
        Self::pack(
            [
                Some(&l.artifact_id),
                Some(&l.path),
                Some(&l.checksum_sha256),
                Some(&l.mutation_type),
                Some(&l.workflow_id),
                Some(&l.action_id),
                l.parent_workflow_id.as_ref(),
                l.parent_artifact_id.as_ref(),
                Some(&l.generated_by_action),
                Some(&l.created_at),
            ]
            .map(|f| f.map(|c| &**c)),
            l.size_bytes,
        )
    }

    fn field(&self, k: usize) -> &str {
        let start = if k == 0 { 0 } else { self.ends[k - 1] as usize };
        &self.text[start..self.ends[k] as usize]
    }

    /// An optional field (`PARENT_WORKFLOW_ID` or `PARENT_ARTIFACT_ID`).
    fn optional(&self, k: usize) -> Option<&str> {
        (self.present & (1 << (k - PARENT_WORKFLOW_ID)) != 0).then(|| self.field(k))
    }

    fn entry(&self) -> ArtifactEntry {
        let s = |k| self.field(k).to_owned();
        ArtifactEntry {
            artifact_id: s(ARTIFACT_ID),
            path: s(PATH),
            checksum_sha256: s(CHECKSUM),
            size_bytes: self.size_bytes,
            mutation_type: s(MUTATION_TYPE),
            workflow_id: s(WORKFLOW_ID),
            action_id: s(ACTION_ID),
            parent_workflow_id: self.optional(PARENT_WORKFLOW_ID).map(str::to_owned),
            parent_artifact_id: self.optional(PARENT_ARTIFACT_ID).map(str::to_owned),
            generated_by_action: s(GENERATED_BY_ACTION),
            created_at: s(CREATED_AT),
        }
    }
}

/// A registered artifact as a query's filter sees it, without a copy of its strings.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactRef<'a>(&'a Stored);

impl<'a> ArtifactRef<'a> {
    /// `art_…`, unique.
    pub fn artifact_id(self) -> &'a str {
        self.0.field(ARTIFACT_ID)
    }

    /// Absolute path inside a sandbox root.
    pub fn path(self) -> &'a str {
        self.0.field(PATH)
    }

    /// SHA-256 of the bytes written.
    pub fn checksum_sha256(self) -> &'a str {
        self.0.field(CHECKSUM)
    }

    /// The workflow.
    pub fn workflow_id(self) -> &'a str {
        self.0.field(WORKFLOW_ID)
    }

    /// The action.
    pub fn action_id(self) -> &'a str {
        self.0.field(ACTION_ID)
    }

    /// `{execution_id}/{action_id}`: the action execution that wrote it.
    pub fn generated_by_action(self) -> &'a str {
        self.0.field(GENERATED_BY_ACTION)
    }

    /// The whole entry, copied.
    pub fn to_entry(self) -> ArtifactEntry {
        self.0.entry()
    }
}

/// A hash over 64 bits from the 32 a slot keeps, spread by an odd multiplier so that
/// both the slot (low bits) and the tag byte (top bits) the table takes from it vary.
fn spread(h: u32) -> u64 {
    u64::from(h).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Indices into `entries`, hashed by one of the entry's own fields: a million entries
/// cost no key copies. Each slot keeps its hash beside the index, so growing the table
/// and probing past other keys never touch the entries themselves (which, scattered over
/// hundreds of megabytes, would each cost a cache miss); a slot is 8 bytes, so a million
/// keys take 16 MiB, and each insert's write to its random slot misses the cache less.
/// The hash is [`hash32`]'s, which the caller gives.
#[derive(Debug, Default)]
struct FieldIndex {
    table: hashbrown::HashTable<(u32, u32)>,
}

/// A key's hash as a slot keeps it. The keys are a client's (paths, workflow ids): they
/// are hashed with this process's own key, so that no client can choose many that fall
/// on one slot and make every insert walk them all.
fn hash32(keys: &RandomState, key: &str) -> u32 {
    (keys.hash_one(key) >> 32) as u32
}

/// An entry with the hashes of the two fields the index finds it by: worked out where
/// the line is parsed, on the parser threads during a load.
struct Hashed {
    entry: Stored,
    id: u32,
    path: u32,
}

impl Hashed {
    fn new(keys: &RandomState, entry: Stored) -> Self {
        Self {
            id: hash32(keys, id_of(&entry)),
            path: hash32(keys, path_of(&entry)),
            entry,
        }
    }
}

impl FieldIndex {
    fn get(
        &self,
        entries: &[Stored],
        field: fn(&Stored) -> &str,
        key: &str,
        hash: u32,
    ) -> Option<u32> {
        self.table
            .find(spread(hash), |&(h, i)| {
                h == hash && field(&entries[i as usize]) == key
            })
            .map(|&(_, i)| i)
    }

    /// Points `key` at entry `i` (the newest entry with that key wins); returns the entry
    /// it pointed at before.
    fn set(
        &mut self,
        entries: &[Stored],
        field: fn(&Stored) -> &str,
        i: u32,
        hash: u32,
    ) -> Option<u32> {
        let key = field(&entries[i as usize]);
        // One probe for both the look-up and the insert.
        match self.table.entry(
            spread(hash),
            |&(h, j)| h == hash && field(&entries[j as usize]) == key,
            |&(h, _)| spread(h),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => {
                Some(std::mem::replace(&mut slot.get_mut().1, i))
            }
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert((hash, i));
                None
            }
        }
    }

    fn reserve(&mut self, n: usize) {
        self.table.reserve(n, |&(h, _)| spread(h));
    }
}

fn id_of(e: &Stored) -> &str {
    e.field(ARTIFACT_ID)
}

fn path_of(e: &Stored) -> &str {
    e.field(PATH)
}

type Parsed = crate::journal::ParsedLines<Hashed>;

/// Fewer bytes than any line the runtime writes (ids, a checksum, a time: well over 200).
const MIN_LINE: usize = 200;

/// No entry, in [`Index`]'s `earlier_at_path`.
const NO_ENTRY: u32 = u32::MAX;

/// Parses a buffer of whole lines, in order.
fn parse_lines(buf: &[u8], keys: &RandomState) -> Parsed {
    Parsed::of(buf, |_, line: Line<'_>| {
        Stored::of_line(&line)
            .map(|e| Hashed::new(keys, e))
            .ok_or_else(|| {
                serde::de::Error::custom("an artifact line whose strings hold over 4 GiB in all")
            })
    })
}

/// The number (from 1, blank lines counted) of the first whole line of the registry
/// read through `read_at` (`len` bytes) that does not read as an artifact, if any.
pub(crate) fn first_unreadable_line(
    read_at: &dyn Fn(&mut [u8], u64) -> io::Result<()>,
    len: u64,
) -> io::Result<Option<u64>> {
    use crate::journal::Piece;
    use std::ops::ControlFlow;
    let mut lines = 0u64;
    let mut first = None;
    crate::journal::scan(read_at, 0, len, &mut |piece| {
        match piece {
            Piece::Lines(_, buf) => {
                for line in buf
                    .strip_suffix(b"\n")
                    .unwrap_or(&buf)
                    .split(|&b| b == b'\n')
                {
                    lines += 1;
                    if !line.is_empty() && serde_json::from_slice::<ArtifactEntry>(line).is_err() {
                        first = Some(lines);
                        return Ok(ControlFlow::Break(()));
                    }
                }
            }
            Piece::Overlong(..) => {
                first = Some(lines + 1);
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(first)
}

/// Loads a whole registry file: the journal's chunks go, in turn, to two parser threads
/// while this thread inserts the parsed chunks in file order. Parsing is most of a load;
/// this keeps both cores busy and overlaps the index inserts with it.
fn load(journal: &mut Journal, index: &mut Index) -> io::Result<()> {
    use std::sync::mpsc::{Receiver, sync_channel};
    // What the lines can take: a hole (a sparse file's, which costs no disk) holds no
    // entry, and must not make room for any.
    let total = journal.len()?.min(journal.allocated()?);
    std::thread::scope(|scope| {
        let mut to_parser = Vec::new();
        let mut from_parser: Vec<Receiver<(usize, Parsed)>> = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = sync_channel::<Vec<u8>>(1);
            let (ptx, prx) = sync_channel::<(usize, Parsed)>(1);
            let keys = index.keys.clone();
            scope.spawn(move || {
                for chunk in rx {
                    if ptx.send((chunk.len(), parse_lines(&chunk, &keys))).is_err() {
                        break;
                    }
                }
            });
            to_parser.push(tx);
            from_parser.push(prx);
        }
        let mut sent = 0usize;
        let mut inserted = 0usize;
        let mut lost = false;
        let insert_next = |index: &mut Index, inserted: &mut usize, lost: &mut bool| {
            match from_parser[*inserted % 2].recv() {
                Ok((bytes, parsed)) => {
                    if *inserted == 0 {
                        // The first chunk's lines per byte tell how many the file holds:
                        // room for them all at once, and no more (a table sized on a
                        // guess is either grown, every slot moved, or too big for the
                        // caches its random writes go through). No entry the runtime
                        // writes is under 200 bytes: a chunk of short junk lines must not
                        // make room for more entries than the file could hold.
                        let lines = parsed.entries.len() + parsed.unreadable as usize;
                        let per_line = (bytes / lines.max(1)).max(MIN_LINE);
                        index.reserve(usize::try_from(total).unwrap_or(0) / per_line);
                    }
                    index.insert_parsed(parsed)
                }
                Err(_) => *lost = true,
            }
            *inserted += 1;
        };
        let result = journal.read_new_owned(&mut |_, chunk| {
            // A parser has at most one chunk queued: before handing it a third, insert
            // the oldest result, which keeps memory bounded and the file order intact.
            if sent >= inserted + 2 {
                insert_next(index, &mut inserted, &mut lost);
            }
            if to_parser[sent % 2].send(chunk).is_err() {
                lost = true;
            }
            sent += 1;
        });
        drop(to_parser);
        while inserted < sent {
            insert_next(index, &mut inserted, &mut lost);
        }
        if lost {
            return Err(io::Error::other(
                "a registry parser thread stopped; the registry was not loaded",
            ));
        }
        result
    })
}

#[derive(Debug, Default)]
struct Index {
    entries: Vec<Stored>,
    by_id: FieldIndex,
    latest_by_path: FieldIndex,
    /// For each entry, the one before it at the same path ([`NO_ENTRY`] for the first):
    /// a path's artifacts, newest first, whatever their parents.
    earlier_at_path: Vec<u32>,
    by_workflow: HashMap<Box<str>, (Vec<u32>, u64)>,
    /// This process's key for [`hash32`].
    keys: RandomState,
    corrupt_lines: u64,
}

impl Index {
    /// Indexes whole lines read at offset `at`. Read again from the start, the file was
    /// cut (and maybe written again): what was read before is not in it any more.
    fn ingest(&mut self, at: u64, buf: &[u8]) {
        if at == 0 && !self.entries.is_empty() {
            tracing::warn!(
                "the artifact registry is not what this process read: it was cut, or cut and written again; its index is built again"
            );
            *self = Self::default();
        }
        self.insert_parsed(parse_lines(buf, &self.keys));
    }

    fn insert_parsed(&mut self, parsed: Parsed) {
        self.reserve(parsed.entries.len());
        for e in parsed.entries {
            self.insert(e);
        }
        self.corrupt_lines += parsed.unreadable;
        if let Some(err) = parsed.first_error {
            tracing::warn!(
                lines = parsed.unreadable,
                first_within_its_line = %err,
                "skipping unreadable lines in the artifact registry (audit verify names the first by its number)"
            );
        }
    }

    fn reserve(&mut self, n: usize) {
        self.entries.reserve(n);
        self.by_id.reserve(n);
        self.latest_by_path.reserve(n);
        self.earlier_at_path.reserve(n);
    }

    fn insert(&mut self, Hashed { entry: e, id, path }: Hashed) {
        let i = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        match self.by_workflow.get_mut(e.field(WORKFLOW_ID)) {
            Some(w) => {
                w.0.push(i);
                // A hand-edited line may claim any size: the sum stays at the most a
                // budget can count rather than wrapping round to a small one.
                w.1 = w.1.saturating_add(e.size_bytes);
            }
            None => {
                self.by_workflow
                    .insert(e.field(WORKFLOW_ID).into(), (vec![i], e.size_bytes));
            }
        }
        self.entries.push(e);
        self.by_id.set(&self.entries, id_of, i, id);
        let earlier = self.latest_by_path.set(&self.entries, path_of, i, path);
        self.earlier_at_path.push(earlier.unwrap_or(NO_ENTRY));
    }

    fn at(&self, i: u32) -> &Stored {
        &self.entries[i as usize]
    }

    fn by_id(&self, id: &str) -> Option<u32> {
        self.by_id
            .get(&self.entries, id_of, id, hash32(&self.keys, id))
    }

    fn latest_at(&self, path: &str) -> Option<u32> {
        self.latest_by_path
            .get(&self.entries, path_of, path, hash32(&self.keys, path))
    }
}

/// The registry.
#[derive(Debug)]
pub struct ArtifactRegistry {
    inner: crate::timed_lock::TimedMutex<(Journal, Index)>,
    /// See [`crate::audit::AuditLog`]'s: a failed sync, asked without `inner`.
    group: Option<std::sync::Arc<crate::group_commit::GroupCommit>>,
}

impl ArtifactRegistry {
    /// Opens (creating) the registry and loads its index.
    pub fn open(state: &StateDir, durable: bool) -> io::Result<Self> {
        let mut journal = Journal::open(state, ARTIFACTS_FILE, durable)?;
        let mut index = Index::default();
        load(&mut journal, &mut index)?;
        Ok(Self {
            group: journal.group(),
            inner: crate::timed_lock::TimedMutex::new(
                (journal, index),
                state.lock_wait(),
                "the artifact registry",
            ),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Index) -> T) -> io::Result<T> {
        let mut g = self.inner.lock()?;
        let (journal, index) = &mut *g;
        journal.read_new(&mut |at, b| index.ingest(at, b))?;
        Ok(f(index))
    }

    /// Appends entries (one durable write for all of them).
    pub fn register_many(&self, entries: &[ArtifactEntry]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        let mut stored = Vec::with_capacity(entries.len());
        for e in entries {
            crate::journal::write_line(&mut bytes, e)?;
            stored.push(Stored::of_entry(e).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "artifact {}: its fields hold over 4 GiB in all; nothing was registered",
                        e.artifact_id
                    ),
                )
            })?);
        }
        let mut g = self.inner.lock()?;
        let (journal, index) = &mut *g;
        let ((), pending) = journal.append_with(|new, _| {
            new.iter().for_each(|(at, b)| index.ingest(*at, b));
            Ok((bytes, ()))
        })?;
        for e in stored {
            let e = Hashed::new(&index.keys, e);
            index.insert(e);
        }
        drop(g);
        pending.wait()
    }

    /// Why this process writes nothing more: an earlier sync of the registry failed.
    pub fn sync_failure(&self) -> Option<io::Error> {
        self.group.as_ref().and_then(|g| g.failed())
    }

    /// Why the registry takes no more lines from this process (a sync failed, or its file
    /// was moved away or replaced), without waiting: a file moved is not seen while an
    /// append holds it.
    pub fn write_failure(&self) -> Option<String> {
        crate::journal::held_failure(&self.inner, self.group.as_deref(), "the artifact registry")
    }

    /// Appends one entry.
    pub fn register(&self, entry: &ArtifactEntry) -> io::Result<()> {
        self.register_many(std::slice::from_ref(entry))
    }

    /// The newest `limit` entries, newest first, optionally of one workflow.
    pub fn list(&self, limit: usize, workflow_id: Option<&str>) -> io::Result<Vec<ArtifactEntry>> {
        self.list_where(limit, workflow_id, |_| true)
    }

    /// The newest `limit` entries `keep` picks, newest first, optionally of one workflow.
    pub fn list_where(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
        mut keep: impl FnMut(ArtifactRef<'_>) -> bool,
    ) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| match workflow_id {
            Some(w) => ix
                .by_workflow
                .get(w)
                .map(|(ids, _)| {
                    ids.iter()
                        .rev()
                        .map(|&i| ix.at(i))
                        .filter(|&e| keep(ArtifactRef(e)))
                        .take(limit)
                        .map(Stored::entry)
                        .collect()
                })
                .unwrap_or_default(),
            None => ix
                .entries
                .iter()
                .rev()
                .filter(|&e| keep(ArtifactRef(e)))
                .take(limit)
                .map(Stored::entry)
                .collect(),
        })
    }

    /// Every entry `pred` picks, oldest first.
    pub fn find(&self, pred: impl Fn(ArtifactRef<'_>) -> bool) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| {
            ix.entries
                .iter()
                .filter(|&e| pred(ArtifactRef(e)))
                .map(Stored::entry)
                .collect()
        })
    }

    /// One entry by id.
    pub fn get(&self, artifact_id: &str) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| ix.by_id(artifact_id).map(|i| ix.at(i).entry()))
    }

    /// Every entry of a workflow, oldest first.
    pub fn get_by_workflow(&self, workflow_id: &str) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| {
            ix.by_workflow
                .get(workflow_id)
                .map(|(ids, _)| ids.iter().map(|&i| ix.at(i).entry()).collect())
                .unwrap_or_default()
        })
    }

    /// The artifact an action produced.
    pub fn get_by_action(
        &self,
        workflow_id: &str,
        action_id: &str,
    ) -> io::Result<Option<ArtifactEntry>> {
        // A workflow holds at most its artifact budget: scanning it is cheap, and saves
        // an index entry per artifact.
        self.with(|ix| {
            ix.by_workflow.get(workflow_id).and_then(|(ids, _)| {
                ids.iter()
                    .rev()
                    .map(|&i| ix.at(i))
                    .find(|e| e.field(ACTION_ID) == action_id)
                    .map(Stored::entry)
            })
        })
    }

    /// The newest artifact at an absolute path.
    pub fn latest_for_path(&self, path: &str) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| ix.latest_at(path).map(|i| ix.at(i).entry()))
    }

    /// Of the artifacts at an absolute path that `keep` accepts, the newest whose bytes
    /// hash to `checksum`: the one a file holding those bytes is, when later writes to
    /// the path were rolled back.
    pub fn version_holding_where(
        &self,
        path: &str,
        checksum: &str,
        keep: impl Fn(ArtifactRef<'_>) -> bool,
    ) -> io::Result<Option<ArtifactEntry>> {
        self.newest_at_where(path, |e| e.checksum_sha256() == checksum && keep(e))
    }

    /// Of the artifacts at an absolute path, the newest that `keep` accepts: looked for
    /// among all of them, newest first, whatever parents they name.
    pub fn newest_at_where(
        &self,
        path: &str,
        keep: impl Fn(ArtifactRef<'_>) -> bool,
    ) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| {
            let mut cur = ix.latest_at(path)?;
            loop {
                let e = ix.at(cur);
                if keep(ArtifactRef(e)) {
                    return Some(e.entry());
                }
                // Each step goes to an older entry, so the walk ends.
                cur = ix.earlier_at_path[cur as usize];
                if cur == NO_ENTRY {
                    return None;
                }
            }
        })
    }

    /// Every ancestor through `parent_artifact_id`, nearest first; cycle-safe; `[]` for
    /// an unknown id.
    pub fn get_lineage(&self, artifact_id: &str) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| {
            let mut out = Vec::new();
            let mut cur = ix.by_id(artifact_id);
            let mut seen: HashSet<u32> = cur.into_iter().collect();
            while let Some(i) = cur {
                let Some(parent) = ix.at(i).optional(PARENT_ARTIFACT_ID) else {
                    break;
                };
                cur = ix.by_id(parent);
                match cur {
                    Some(p) if seen.insert(p) => out.push(ix.at(p).entry()),
                    _ => break,
                }
            }
            out
        })
    }

    /// Number of artifacts of a workflow.
    pub fn count_by_workflow(&self, workflow_id: &str) -> io::Result<u64> {
        self.with(|ix| {
            ix.by_workflow
                .get(workflow_id)
                .map_or(0, |(ids, _)| ids.len() as u64)
        })
    }

    /// Total bytes of a workflow's artifacts.
    pub fn total_bytes_by_workflow(&self, workflow_id: &str) -> io::Result<u64> {
        self.with(|ix| ix.by_workflow.get(workflow_id).map_or(0, |(_, b)| *b))
    }

    /// A workflow's artifacts and their bytes at one moment of the registry, as its
    /// budget counts them.
    pub fn usage_by_workflow(&self, workflow_id: &str) -> io::Result<crate::budget::Usage> {
        self.with(|ix| {
            ix.by_workflow
                .get(workflow_id)
                .map_or_else(Default::default, |(ids, bytes)| crate::budget::Usage {
                    artifacts: ids.len() as u64,
                    bytes: *bytes,
                })
        })
    }

    /// Number of artifacts in all.
    pub fn len(&self) -> io::Result<u64> {
        self.with(|ix| ix.entries.len() as u64)
    }

    /// [`ArtifactRegistry::len`] when it can be told without waiting: `None` while
    /// another thread of this process holds the registry, or another process appends to
    /// it (either may take up to `limits.lock_wait_seconds`).
    pub fn len_at_once(&self) -> Option<u64> {
        let mut g = self.inner.try_lock()?.ok()?;
        let (journal, index) = &mut *g;
        journal
            .read_new_unless_held(&mut |at, b| index.ingest(at, b))
            .ok()?
            .then_some(index.entries.len() as u64)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Lines that could not be read (skipped).
    pub fn corrupt_lines(&self) -> io::Result<u64> {
        self.with(|ix| ix.corrupt_lines)
    }

    /// The number (from 1) of the registry's first line that does not read as an
    /// artifact, read from the file again: the index keeps a count of them only, and a
    /// verification that finds some names where.
    pub fn first_unreadable_line(&self) -> io::Result<Option<u64>> {
        // Read without the registry's lock, which registrations and look-ups take (a
        // whole read of a large registry would hold them all back), under the file's
        // shared lock, so that no append or cut lands during it.
        let file = self.inner.lock()?.0.shared_file();
        let _shared = file.lock_shared()?;
        first_unreadable_line(&|buf, at| file.read_exact_at(buf, at), file.len()?)
    }
}
