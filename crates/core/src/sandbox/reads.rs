//! Reads: files in the roots, the audit trail and the artifact registry.

use super::Sandbox;
use crate::ReasonCode;
use crate::artifact::{ArtifactEntry, ListedArtifact};
use crate::audit::{AuditStats, SandboxAuditEntry, VerifyReport};
use crate::confine::path::join_display;
use crate::confine::root::{DirEntryInfo, DirPage, PathKind};
use crate::confine::{EntryKind, RelPath, check_reserved, resolve_sandbox_path};
use crate::error::Error;
use crate::hash::sha256_hex;
use crate::reason::Verdict;
use serde::Serialize;

/// `read_file` result.
#[derive(Debug, Clone, Serialize)]
pub struct FileRead {
    /// The file's text; where the bytes are not valid UTF-8, each invalid sequence shows
    /// as U+FFFD (see `invalid_utf8_at`).
    pub content: String,
    /// Size of the bytes on disk.
    pub size_bytes: u64,
    /// SHA-256 of the bytes on disk.
    pub sha256: String,
    /// Offset of the first byte that is not valid UTF-8, if any: `content` is then not the
    /// file's exact bytes.
    pub invalid_utf8_at: Option<u64>,
}

/// `get_file_info` result.
#[derive(Debug, Clone, Serialize)]
pub struct FileInfo {
    /// The path as given.
    pub path: String,
    /// What the path names.
    pub kind: PathKind,
    /// Size of a file.
    pub size_bytes: Option<u64>,
    /// SHA-256 of a file of at most [`MAX_INFO_HASH_BYTES`]; larger files are not read.
    pub sha256: Option<String>,
    /// The artifact the file is: the newest at this path with the file's checksum (for a
    /// file too large to hash, the newest at this path if its size agrees). `None` for a
    /// path that is not a file, or a file that holds no registered version, e.g. one
    /// changed by hand or whose writes were all rolled back.
    pub artifact_id: Option<String>,
}

/// The largest file [`Sandbox::get_file_info`] hashes (1 GiB, about a second of
/// SHA-256): describing a file must not pin a thread for hours.
pub const MAX_INFO_HASH_BYTES: u64 = 1 << 30;

/// How many audit entries or artifacts a list gives when the caller says nothing (every
/// face: `audit`, `artifacts`, the HTTP lists, `list_artifacts`).
pub const DEFAULT_LIST_LIMIT: usize = 50;

/// The most the HTTP and MCP lists give in one call.
pub const MAX_LIST_LIMIT: usize = 1000;

/// The most `read_file` returns.
pub const READ_LIMIT: u64 = crate::catalog::LARGEST_WRITE_BYTES;

impl Sandbox {
    fn resolve_read(&self, path: &str, root: Option<&str>) -> Verdict<(usize, RelPath)> {
        let r = resolve_sandbox_path(
            path,
            &self.root_paths,
            root,
            self.config.limits.max_path_depth,
        )
        .inspect_err(|r| {
            self.metrics
                .denied("read_file", r.reason_code, r.is_escape_attempt());
        })?;
        check_reserved(&r.rel)?;
        self.root_in_place_to_read(r.root_index)?;
        Ok((r.root_index, r.rel))
    }

    /// Reads a file inside a root (confined like writes; at most [`READ_LIMIT`], the
    /// largest file an operation writes).
    pub fn read_file(&self, path: &str, root: Option<&str>) -> Verdict<FileRead> {
        let (i, rel) = self.resolve_read(path, root)?;
        self.roots[i].inspect(&rel)?;
        let bytes = self.roots[i].read_file(&rel, READ_LIMIT)?;
        Ok(FileRead {
            size_bytes: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
            invalid_utf8_at: std::str::from_utf8(&bytes)
                .err()
                .map(|e| e.valid_up_to() as u64),
            content: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// Lists a directory inside a root (`""`, `/` or `.` for the first root's top; a
    /// root's own absolute path for that root's; one trailing `/` taken). Entries no read or write may name (the
    /// snapshot store `.rollback`, the runtime's temporary files) are left out.
    pub fn list_directory(&self, path: &str, root: Option<&str>) -> Verdict<Vec<DirEntryInfo>> {
        Ok(self.list_directory_page(path, root, 0, usize::MAX)?.entries)
    }

    /// [`Sandbox::list_directory`] a page at a time: at most `limit` entries from
    /// `offset`, in name order. Only the page's entries are looked at beyond their names.
    pub fn list_directory_page(
        &self,
        path: &str,
        root: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Verdict<DirPage> {
        let shown =
            |name: &str| check_reserved(&RelPath::from_components(vec![name.to_owned()])).is_ok();
        if let Some(i) = self.root_top_named(path, root)? {
            return self.roots[i].list_dir_page(None, &shown, offset, limit);
        }
        // A directory is often written with a trailing `/`; one is taken, as for a root.
        let (i, rel) = self.resolve_read(path.strip_suffix('/').unwrap_or(path), root)?;
        self.roots[i].list_dir_page(Some(&rel), &shown, offset, limit)
    }

    /// The root whose top `path` names, checked to be in place: `""`, `/` or `.` name the
    /// first root (or the one `root` names), a root's own absolute path (one trailing `/`
    /// aside) that root. `None` for any other path, which is then resolved as usual.
    fn root_top_named(&self, path: &str, root: Option<&str>) -> Verdict<Option<usize>> {
        let hinted = || -> Verdict<usize> {
            Ok(match root {
                Some(_) => resolve_sandbox_path("x", &self.root_paths, root, 8)?.root_index,
                None => 0,
            })
        };
        let i = if path.is_empty() || path == "/" || path == "." {
            hinted()?
        } else {
            // Compared as text, as the other paths an agent gives are taken literally (no
            // `.` or empty component), one trailing `/` aside.
            let bare = path.strip_suffix('/').unwrap_or(path);
            let Some(i) = self
                .root_paths
                .iter()
                .position(|r| r.to_str() == Some(bare))
            else {
                return Ok(None);
            };
            if root.is_some() && hinted()? != i {
                // Another root named alongside: refused as any path of another root is
                // (the trailing `/` is not the fault), unless it lies inside the one named.
                self.resolve_read(bare, root)?;
                return Ok(None);
            }
            i
        };
        self.root_in_place_to_read(i)?;
        Ok(Some(i))
    }

    /// What `rel` in root `i` is, with a regular file's size and SHA-256 (up to
    /// [`MAX_INFO_HASH_BYTES`]). A file put out of the way between the look and the hash
    /// (removed, or a FIFO or link put in its place) is looked at again, once: the
    /// answer says what stands there now rather than refusing it as a file.
    fn described(
        &self,
        i: usize,
        rel: &RelPath,
    ) -> Verdict<(PathKind, Option<u64>, Option<String>)> {
        let mut again = true;
        loop {
            let (entry, _) = self.roots[i].entry(rel)?;
            return Ok(match entry {
                EntryKind::File { .. } => {
                    let hashed = self
                        .fail_at("info_hash")
                        .and_then(|()| self.roots[i].hash_file(rel, MAX_INFO_HASH_BYTES));
                    match hashed {
                        Ok((size, sum)) => (PathKind::File, Some(size), sum),
                        Err(r)
                            if again
                                && matches!(
                                    r.reason_code,
                                    ReasonCode::NotFound
                                        | ReasonCode::NotRegularFile
                                        | ReasonCode::SymlinkRefused
                                        | ReasonCode::SymlinkEscape
                                ) =>
                        {
                            again = false;
                            continue;
                        }
                        // Gone again between the second look and its open: a file that
                        // comes and goes is as often missing as there, and missing is
                        // what a look at it would say now.
                        Err(r) if r.reason_code == ReasonCode::NotFound => {
                            (PathKind::Missing, None, None)
                        }
                        Err(r) => return Err(r),
                    }
                }
                EntryKind::Directory => (PathKind::Directory, None, None),
                EntryKind::Missing => (PathKind::Missing, None, None),
                EntryKind::Symlink => (PathKind::Symlink, None, None),
                EntryKind::Special => (PathKind::Special, None, None),
            });
        }
    }

    /// Describes a path inside a root. A symlink, FIFO, socket or device at the path is
    /// named for what it is, never followed or opened; a file with other hard links is
    /// refused (`hardlink_refused`) as for `read_file`, since it may be a file outside.
    /// A root's top, named as [`Sandbox::list_directory`] names it, is a `directory`.
    pub fn get_file_info(&self, path: &str, root: Option<&str>) -> Verdict<FileInfo> {
        if self.root_top_named(path, root)?.is_some() {
            return Ok(FileInfo {
                path: path.to_owned(),
                kind: PathKind::Directory,
                size_bytes: None,
                sha256: None,
                artifact_id: None,
            });
        }
        let (i, rel) = self.resolve_read(path, root)?;
        let (kind, size_bytes, sha256) = self.described(i, &rel)?;
        let abs = join_display(&self.root_paths[i], &rel)
            .display()
            .to_string();
        let artifact_id = match (&sha256, size_bytes) {
            // A version whose write was rolled back is not what the file holds, even
            // when someone put the same bytes back by hand.
            (Some(sum), _) => self
                .registry
                .version_holding_where(&abs, sum, |a| !self.rolled_back(a)),
            // Too large to hash here: the newest artifact, if the size agrees.
            (None, Some(size)) => self
                .registry
                .latest_for_path(&abs)
                .map(|a| a.filter(|a| a.size_bytes == size)),
            (None, None) => Ok(None),
        }
        .ok()
        .flatten()
        .map(|a| a.artifact_id);
        Ok(FileInfo {
            path: path.to_owned(),
            kind,
            size_bytes,
            sha256,
            artifact_id,
        })
    }

    /// Whether the trail records the write of `artifact` as rolled back.
    pub(crate) fn rolled_back(&self, artifact: crate::artifact::ArtifactRef<'_>) -> bool {
        self.audit
            .is_rolled_back(artifact.workflow_id(), artifact.action_id())
            .unwrap_or(false)
    }

    /// Newest audit entries (of `workflow_id`'s, when given: [`Error::InvalidId`] if it
    /// could not be an id).
    pub fn audit_entries(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> Result<Vec<SandboxAuditEntry>, Error> {
        checked_id("workflow_id", workflow_id)?;
        self.audit
            .list(limit, workflow_id)
            .map_err(Error::io("read the audit log"))
    }

    /// Audit statistics: [`crate::audit::AuditLog::get_sandbox_audit_stats`] of the runtime's trail.
    pub fn audit_stats(&self) -> Result<AuditStats, Error> {
        self.audit
            .get_sandbox_audit_stats()
            .map_err(Error::io("read the audit log"))
    }

    /// Verifies the audit chain, that the trail records every write the artifact
    /// registry holds an artifact of, and that the registry holds every file write the
    /// trail records as done, with the bytes it names. The head kept outside the log
    /// catches a cut tail, but not one cut together with the head rewritten to match,
    /// nor a trail removed with its head: the registry, a separate file, still names
    /// those writes; the trail, chained, names what a registry edited by hand lost or
    /// changed. Not under `relaxed` durability, where a power cut may lose lines of
    /// either file that the other keeps.
    pub fn audit_verify(&self) -> Result<VerifyReport, Error> {
        let (report, logged, recorded) = self
            .audit
            .verify_and_writes()
            .map_err(Error::io("read the audit log"))?;
        if !report.ok || !self.durable() {
            return Ok(report);
        }
        let unreadable = self
            .registry
            .corrupt_lines()
            .map_err(Error::io("read the artifact registry"))?;
        let report = crate::audit::with_unreadable_registry(report, unreadable, || {
            self.registry.first_unreadable_line()
        });
        if !report.ok {
            return Ok(report);
        }
        let report = self.with_registry_on_trail(report, &logged)?;
        if !report.ok {
            return Ok(report);
        }
        // The registry is read after the trail, and a write is registered before its
        // line is appended: every write the trail read records is in it.
        let registered = self
            .registry
            .find(|a| crate::audit::records(&logged, a.workflow_id(), a.generated_by_action()))
            .map_err(Error::io("read the artifact registry"))?;
        let report = crate::audit::with_unregistered(
            report,
            &crate::audit::unregistered(&recorded, &registered),
        );
        if !report.ok {
            return Ok(report);
        }
        Ok(crate::audit::with_doubled(report, &registered))
    }

    /// `report`, failed when the registry holds artifacts whose writes the trail
    /// (`logged`, read before the registry) does not record.
    fn with_registry_on_trail(
        &self,
        report: VerifyReport,
        logged: &crate::audit::Writes,
    ) -> Result<VerifyReport, Error> {
        let mut missing = self
            .registry
            .find(|a| !crate::audit::records(logged, a.workflow_id(), a.generated_by_action()))
            .map_err(Error::io("read the artifact registry"))?;
        if missing.is_empty() {
            return Ok(report);
        }
        // A run registers an artifact, then appends its line, with its workflow's lock
        // held: once each lock has been free for a moment, those lines are written.
        let mut workflows: Vec<&str> = missing.iter().map(|a| a.workflow_id.as_str()).collect();
        workflows.sort_unstable();
        workflows.dedup();
        // An id no run could have (a registry edited by hand) names no lock either.
        for wf in workflows
            .into_iter()
            .filter(|w| crate::plan::is_valid_id(w))
        {
            drop(
                self.state
                    .lock_workflow(wf)
                    .map_err(Error::io("lock a workflow"))?,
            );
        }
        let (report, logged, _) = self
            .audit
            .verify_and_writes()
            .map_err(Error::io("read the audit log"))?;
        if !report.ok {
            return Ok(report);
        }
        missing.retain(|a| !crate::audit::records(&logged, &a.workflow_id, &a.generated_by_action));
        // A run that could not write its lines (a full disk) left its record for
        // recovery: its writes are unrecorded yet, not cut from the trail.
        let (pending, missing): (Vec<_>, Vec<_>) = missing
            .into_iter()
            .partition(|a| self.awaits_recovery(&a.workflow_id));
        Ok(crate::audit::with_unlogged(report, &missing, &pending))
    }

    /// Newest artifacts (of `workflow_id`'s, when given: [`Error::InvalidId`] if it
    /// could not be an id).
    pub fn artifacts(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> Result<Vec<ArtifactEntry>, Error> {
        checked_id("workflow_id", workflow_id)?;
        self.registry
            .list(limit, workflow_id)
            .map_err(Error::io("read the artifact registry"))
    }

    /// Newest artifacts, as [`Sandbox::artifacts`] lists them, of those written in this
    /// process's roots: what a face that shows its caller no path outside the roots
    /// lists (a state directory shared with a runtime of other roots records theirs too).
    pub fn artifacts_in_roots(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> Result<Vec<ArtifactEntry>, Error> {
        checked_id("workflow_id", workflow_id)?;
        // Judged once per folder: a root's other spellings are looked up on disk.
        let mut judged: std::collections::HashMap<String, bool> = Default::default();
        self.registry
            .list_where(limit, workflow_id, |a| {
                let folder = a.path().rsplit_once('/').map_or("", |(f, _)| f);
                if let Some(&shown) = judged.get(folder) {
                    return shown;
                }
                let shown = self.in_roots(a.path());
                judged.insert(folder.to_owned(), shown);
                shown
            })
            .map_err(Error::io("read the artifact registry"))
    }

    /// Whether the recorded absolute path `path` lies in one of this process's roots,
    /// whatever spelling of the root it was recorded with.
    pub fn in_roots(&self, path: &str) -> bool {
        self.root_of(path).is_some()
    }

    /// One artifact and its lineage (nearest ancestor first); `None` when no artifact
    /// has the id, [`Error::InvalidId`] when it could not be one.
    pub fn artifact_with_lineage(
        &self,
        id: &str,
    ) -> Result<Option<(ArtifactEntry, Vec<ArtifactEntry>)>, Error> {
        checked_id("artifact_id", Some(id))?;
        let Some(a) = self
            .registry
            .get(id)
            .map_err(Error::io("read the artifact registry"))?
        else {
            return Ok(None);
        };
        let lineage = self
            .registry
            .get_lineage(id)
            .map_err(Error::io("read the artifact registry"))?;
        Ok(Some((a, lineage)))
    }

    /// `list`, each entry marked with whether the audit trail records its write as
    /// rolled back ([`ListedArtifact`]). A trail that cannot be read is an error, not
    /// entries marked standing.
    pub fn marked(&self, list: Vec<ArtifactEntry>) -> Result<Vec<ListedArtifact>, Error> {
        list.into_iter().map(|entry| self.mark(entry)).collect()
    }

    /// [`Sandbox::artifact_with_lineage`], the artifact and each ancestor marked as
    /// [`Sandbox::marked`] marks a list's: what every face shows of one artifact.
    pub fn marked_with_lineage(
        &self,
        id: &str,
    ) -> Result<Option<(ListedArtifact, Vec<ListedArtifact>)>, Error> {
        self.artifact_with_lineage(id)?
            .map(|(artifact, lineage)| Ok((self.mark(artifact)?, self.marked(lineage)?)))
            .transpose()
    }

    /// One entry marked as [`Sandbox::marked`] marks a list's.
    fn mark(&self, entry: ArtifactEntry) -> Result<ListedArtifact, Error> {
        let rolled_back = self
            .audit
            .is_rolled_back(&entry.workflow_id, &entry.action_id)
            .map_err(Error::io("read the audit trail"))?;
        Ok(ListedArtifact { entry, rolled_back })
    }
}

/// Refuses an id a read is given that could not be one (see [`crate::plan::check_id`]).
fn checked_id(kind: &str, id: Option<&str>) -> Result<(), Error> {
    id.map_or(Ok(()), |id| {
        crate::plan::check_id(kind, id).map_err(Error::InvalidId)
    })
}
