//! The artifact registry: every file an action leaves behind, with its checksum and
//! lineage. Append-only JSONL (`artifacts.jsonl`) plus an in-memory index kept current
//! incrementally, so queries never rescan the file.

use crate::confine::state::StateDir;
use crate::journal::Journal;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Mutex;

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

/// Maps keyed by workflow: Fx hashing, since the keys are the runtime's own strings.
type FastMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

fn fx(s: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(s)
}

/// Indices into `entries`, hashed by one of the entry's own fields: a million entries
/// cost no key copies. Each slot keeps its hash beside the index, so growing the table
/// and probing past other keys never touch the entries themselves (which, scattered over
/// hundreds of megabytes, would each cost a cache miss).
#[derive(Debug, Default)]
struct FieldIndex {
    table: hashbrown::HashTable<(u64, u32)>,
}

impl FieldIndex {
    fn get(
        &self,
        entries: &[ArtifactEntry],
        field: fn(&ArtifactEntry) -> &str,
        key: &str,
    ) -> Option<u32> {
        let hash = fx(key);
        self.table
            .find(hash, |&(h, i)| {
                h == hash && field(&entries[i as usize]) == key
            })
            .map(|&(_, i)| i)
    }

    /// Points `key` at entry `i` (the newest entry with that key wins); returns the entry
    /// it pointed at before.
    fn set(
        &mut self,
        entries: &[ArtifactEntry],
        field: fn(&ArtifactEntry) -> &str,
        i: u32,
    ) -> Option<u32> {
        let key = field(&entries[i as usize]);
        let hash = fx(key);
        match self.table.find_mut(hash, |&(h, j)| {
            h == hash && field(&entries[j as usize]) == key
        }) {
            Some(slot) => Some(std::mem::replace(&mut slot.1, i)),
            None => {
                self.table.insert_unique(hash, (hash, i), |&(h, _)| h);
                None
            }
        }
    }

    fn reserve(&mut self, n: usize) {
        self.table.reserve(n, |&(h, _)| h);
    }
}

fn id_of(e: &ArtifactEntry) -> &str {
    &e.artifact_id
}

fn path_of(e: &ArtifactEntry) -> &str {
    &e.path
}

type Parsed = Vec<Result<ArtifactEntry, serde_json::Error>>;

/// No entry, in [`Index`]'s `earlier_at_path`.
const NO_ENTRY: u32 = u32::MAX;

/// Parses a buffer of whole lines, in order.
fn parse_lines(buf: &[u8]) -> Parsed {
    crate::journal::lines(buf)
        .map(serde_json::from_slice::<ArtifactEntry>)
        .collect()
}

/// Loads a whole registry file: the journal's chunks go, in turn, to two parser threads
/// while this thread inserts the parsed chunks in file order. Parsing is most of a load;
/// this keeps both cores busy and overlaps the index inserts with it.
fn load(journal: &mut Journal, index: &mut Index) -> io::Result<()> {
    use std::sync::mpsc::{Receiver, sync_channel};
    std::thread::scope(|scope| {
        let mut to_parser = Vec::new();
        let mut from_parser: Vec<Receiver<Parsed>> = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = sync_channel::<Vec<u8>>(1);
            let (ptx, prx) = sync_channel::<Parsed>(1);
            scope.spawn(move || {
                for chunk in rx {
                    if ptx.send(parse_lines(&chunk)).is_err() {
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
                Ok(parsed) => index.insert_parsed(parsed),
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
    entries: Vec<ArtifactEntry>,
    by_id: FieldIndex,
    latest_by_path: FieldIndex,
    /// For each entry, the one before it at the same path ([`NO_ENTRY`] for the first):
    /// a path's artifacts, newest first, whatever their parents.
    earlier_at_path: Vec<u32>,
    by_workflow: FastMap<Box<str>, (Vec<u32>, u64)>,
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
        self.insert_parsed(parse_lines(buf));
    }

    fn insert_parsed(&mut self, parsed: Parsed) {
        let n = parsed.len();
        self.entries.reserve(n);
        self.by_id.reserve(n);
        self.latest_by_path.reserve(n);
        self.earlier_at_path.reserve(n);
        for parsed in parsed {
            match parsed {
                Ok(e) => self.insert(e),
                Err(err) => {
                    self.corrupt_lines += 1;
                    tracing::warn!(%err, "skipping an unreadable line in the artifact registry");
                }
            }
        }
    }

    fn insert(&mut self, e: ArtifactEntry) {
        let i = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        match self.by_workflow.get_mut(e.workflow_id.as_str()) {
            Some(w) => {
                w.0.push(i);
                w.1 += e.size_bytes;
            }
            None => {
                self.by_workflow
                    .insert(e.workflow_id.as_str().into(), (vec![i], e.size_bytes));
            }
        }
        self.entries.push(e);
        self.by_id.set(&self.entries, id_of, i);
        let earlier = self.latest_by_path.set(&self.entries, path_of, i);
        self.earlier_at_path.push(earlier.unwrap_or(NO_ENTRY));
    }

    fn at(&self, i: u32) -> &ArtifactEntry {
        &self.entries[i as usize]
    }

    fn by_id(&self, id: &str) -> Option<u32> {
        self.by_id.get(&self.entries, id_of, id)
    }
}

/// The registry.
#[derive(Debug)]
pub struct ArtifactRegistry {
    inner: Mutex<(Journal, Index)>,
}

impl ArtifactRegistry {
    /// Opens (creating) the registry and loads its index.
    pub fn open(state: &StateDir, durable: bool) -> io::Result<Self> {
        let mut journal = Journal::open(state, ARTIFACTS_FILE, durable)?;
        let mut index = Index::default();
        // Room for every line at once (an entry's line is well over 200 bytes): growing a
        // vector of a million entries step by step copies it several times over. Pages
        // not yet used cost address space only.
        let expected = usize::try_from(journal.len()? / 200).unwrap_or(0);
        index.entries.reserve(expected);
        index.by_id.reserve(expected);
        index.latest_by_path.reserve(expected);
        index.earlier_at_path.reserve(expected);
        load(&mut journal, &mut index)?;
        Ok(Self {
            inner: Mutex::new((journal, index)),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Index) -> T) -> io::Result<T> {
        let mut g = self
            .inner
            .lock()
            .map_err(|_| io::Error::other("registry lock poisoned"))?;
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
        for e in entries {
            crate::journal::write_line(&mut bytes, e)?;
        }
        let mut g = self
            .inner
            .lock()
            .map_err(|_| io::Error::other("registry lock poisoned"))?;
        let (journal, index) = &mut *g;
        let ((), pending) = journal.append_with(|at, new, _| {
            index.ingest(at, new);
            Ok((bytes, ()))
        })?;
        for e in entries {
            index.insert(e.clone());
        }
        drop(g);
        pending.wait()
    }

    /// Why this process writes nothing more: an earlier sync of the registry failed.
    pub fn sync_failure(&self) -> Option<io::Error> {
        self.inner.lock().ok()?.0.sync_failure()
    }

    /// Why the registry takes no more lines from this process (a sync failed, or its file
    /// was moved away or replaced), without waiting: `None` while an append holds it.
    pub fn write_failure(&self) -> Option<String> {
        crate::journal::held_failure(&self.inner, "the artifact registry")
    }

    /// Appends one entry.
    pub fn register(&self, entry: &ArtifactEntry) -> io::Result<()> {
        self.register_many(std::slice::from_ref(entry))
    }

    /// The newest `limit` entries, newest first, optionally of one workflow.
    pub fn list(&self, limit: usize, workflow_id: Option<&str>) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| match workflow_id {
            Some(w) => ix
                .by_workflow
                .get(w)
                .map(|(ids, _)| {
                    ids.iter()
                        .rev()
                        .take(limit)
                        .map(|&i| ix.at(i).clone())
                        .collect()
                })
                .unwrap_or_default(),
            None => ix.entries.iter().rev().take(limit).cloned().collect(),
        })
    }

    /// Every entry `pred` picks, oldest first.
    pub fn find(&self, pred: impl Fn(&ArtifactEntry) -> bool) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| ix.entries.iter().filter(|e| pred(e)).cloned().collect())
    }

    /// One entry by id.
    pub fn get(&self, artifact_id: &str) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| ix.by_id(artifact_id).map(|i| ix.at(i).clone()))
    }

    /// Every entry of a workflow, oldest first.
    pub fn get_by_workflow(&self, workflow_id: &str) -> io::Result<Vec<ArtifactEntry>> {
        self.with(|ix| {
            ix.by_workflow
                .get(workflow_id)
                .map(|(ids, _)| ids.iter().map(|&i| ix.at(i).clone()).collect())
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
                    .find(|e| e.action_id == action_id)
                    .cloned()
            })
        })
    }

    /// The newest artifact at an absolute path.
    pub fn latest_for_path(&self, path: &str) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| {
            ix.latest_by_path
                .get(&ix.entries, path_of, path)
                .map(|i| ix.at(i).clone())
        })
    }

    /// Of the artifacts at an absolute path that `keep` accepts, the newest whose bytes
    /// hash to `checksum`: the one a file holding those bytes is, when later writes to
    /// the path were rolled back.
    pub fn version_holding_where(
        &self,
        path: &str,
        checksum: &str,
        keep: impl Fn(&ArtifactEntry) -> bool,
    ) -> io::Result<Option<ArtifactEntry>> {
        self.newest_at_where(path, |e| e.checksum_sha256 == checksum && keep(e))
    }

    /// Of the artifacts at an absolute path, the newest that `keep` accepts: looked for
    /// among all of them, newest first, whatever parents they name.
    pub fn newest_at_where(
        &self,
        path: &str,
        keep: impl Fn(&ArtifactEntry) -> bool,
    ) -> io::Result<Option<ArtifactEntry>> {
        self.with(|ix| {
            let mut cur = ix.latest_by_path.get(&ix.entries, path_of, path)?;
            loop {
                let e = ix.at(cur);
                if keep(e) {
                    return Some(e.clone());
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
                let Some(parent) = ix.at(i).parent_artifact_id.as_deref() else {
                    break;
                };
                cur = ix.by_id(parent);
                match cur {
                    Some(p) if seen.insert(p) => out.push(ix.at(p).clone()),
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

    /// Whether there are none.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Lines that could not be read (skipped).
    pub fn corrupt_lines(&self) -> io::Result<u64> {
        self.with(|ix| ix.corrupt_lines)
    }
}
