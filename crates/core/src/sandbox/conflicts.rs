//! What a target holds now against what an action left there: the conflicts a
//! rollback meets.

use super::Sandbox;
use crate::confine::path::shown_path;
use crate::confine::root::Put;
use crate::confine::{RelPath, TargetKind};
use crate::hash::sha256_hex;
use crate::reason::{ReasonCode, Verdict};
use crate::snapshot::{MAX_SNAPSHOT_BYTES, SnapshotKind, SnapshotMeta, StoredSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The trail's changes to files of each name and folder (see
/// [`crate::audit::Ending`]), read once for all of a rollback's targets that end so,
/// from the lines that may be dated `after` its earliest snapshot.
struct Named<'a> {
    after: &'a str,
    read: HashMap<(String, Option<String>), Recorded>,
}

impl<'a> Named<'a> {
    /// None read yet, for a rollback of `snaps`: only lines after the earliest snapshot can
    /// name a change since one of them.
    fn after_earliest_of(snaps: &'a [(usize, StoredSnapshot)]) -> Self {
        Self {
            after: snaps
                .iter()
                .map(|(_, s)| s.meta.taken_at.as_str())
                .min()
                .unwrap_or(""),
            read: HashMap::new(),
        }
    }
}

/// The trail's lines of changes to files of one name and folder, by the path they
/// record (in the log's order): a target's lines are those of the paths that
/// [`Sandbox::names_target`] takes for it, under whatever spelling of its root.
#[derive(Default)]
struct Recorded {
    by_path: HashMap<String, Vec<crate::audit::SandboxAuditEntry>>,
}

impl Recorded {
    fn of(lines: Vec<crate::audit::SandboxAuditEntry>) -> Self {
        let mut r = Self::default();
        for line in lines {
            r.by_path
                .entry(line.target_path.clone())
                .or_default()
                .push(line);
        }
        r
    }
}

/// What the trail records of one workflow's own actions, read once for a check.
#[derive(Default)]
struct WorkflowRecord {
    /// The writes made (by run and action: their latest success line's `seq`). No
    /// artifact records a directory: an action that failed, its own undo's mark and
    /// lines lost to a full disk, leaves nothing else to tell that its directory never
    /// stood.
    writes: HashMap<(String, String), u64>,
    /// Actions whose restore was made and then failed
    /// ([`crate::snapshot::PUT_BACK_UNCONFIRMED`]), with the latest such line's `seq`.
    put_back: HashMap<String, u64>,
}

/// What a rollback removes, by root and recorded path: an entry of a directory the
/// workflow created is no obstacle to removing that directory when it is one of them,
/// unless a `create_directory` outside the rollback keeps it.
#[derive(Default)]
struct Removes {
    removed: HashSet<(usize, String)>,
    /// Directories kept, with the actions that claim them.
    kept: HashMap<(usize, String), Vec<String>>,
}

impl Removes {
    /// Whether the directory `meta`'s action created at `rel` in root `i` holds what the
    /// rollback does not remove and no claim keeps (another's entry); directories of the
    /// workflow a claim keeps add their claimers to `claimed_by`. One that cannot be
    /// listed is taken to hold another's, unless what failed says nothing of it (out of
    /// descriptors, a failing disk: `io_error`, which refuses an unforced check, to be
    /// tried again; a forced one leaves the directory in place, as one holding another's).
    fn leaves_in(
        &self,
        sb: &Sandbox,
        (i, rel): (usize, &RelPath),
        meta: &SnapshotMeta,
        claimed_by: &mut Vec<String>,
        forced: bool,
    ) -> Verdict<bool> {
        let listed = sb
            .fail_at("list_made_dir")
            .and_then(|()| sb.roots[i].list_dir(Some(rel)));
        let entries = match listed {
            Ok(entries) => entries,
            Err(r) if r.reason_code == ReasonCode::IoError && !forced => return Err(r),
            Err(_) => return Ok(true),
        };
        let mut foreign = false;
        for e in entries {
            let entry = (i, format!("{}/{}", meta.original_path, e.name));
            if self.removed.contains(&entry) {
                continue;
            }
            match self.kept.get(&entry) {
                Some(claims) => claimed_by.extend(claims.iter().cloned()),
                None => foreign = true,
            }
        }
        Ok(foreign)
    }
}

/// Whether a target is to be restored, and what the restore may replace: what the
/// judgement saw (see [`Put`]).
type Judged = (bool, Put);

/// A file changed since the action wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The action.
    pub action_id: String,
    /// The file (absolute, inside a root).
    pub path: String,
    /// What the action left.
    pub expected_checksum: Option<String>,
    /// What is there now (`None`: missing); with `found_by_action`, what that action
    /// found there, which a rollback puts back before it reaches this one. The same as
    /// `expected_checksum` when the file was written over since and back to those
    /// bytes by another workflow's write that stands, which restoring would undo
    /// (`changed_by` names it when the trail says who left the bytes).
    pub current_checksum: Option<String>,
    /// When the change was made between two writes of the workflow to the same target:
    /// the later action, which found `current_checksum` where this one had left
    /// `expected_checksum`. The target may hold just what the workflow last wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_by_action: Option<String>,
    /// When the trail records who left what the target holds now, since the workflow's
    /// last write there: another workflow's write (`workflow/action`), to be rolled back
    /// first rather than overwritten, or its rollback, which took this workflow's write
    /// with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_by: Option<ChangedBy>,
    /// For a directory the action made: the `create_directory` actions
    /// (`workflow/action`) that found it since and stand, whose result it is now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claimed_by: Vec<String>,
    /// The folder on the way (root-relative) that is not the one the action wrote in,
    /// or the directory the action made (`create_directory`), not the one it made:
    /// that was moved away, where the action's file may live on, or removed, and another
    /// put in its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder_replaced: Option<String>,
    /// Whether `folder_replaced` is the target itself, a directory the action made.
    #[serde(skip)]
    pub(crate) made_dir_replaced: bool,
}

impl Conflict {
    /// Whether the target holds the very bytes the action left, written over and back
    /// since (not when its folder is another: those bytes are a copy there).
    fn came_back(&self) -> bool {
        self.expected_checksum.is_some()
            && self.expected_checksum == self.current_checksum
            && self.folder_replaced.is_none()
    }
}

/// What a rollback's refusal says of one file that changed since the workflow wrote it:
/// each file once for people, saying where the change was made (a change between two of
/// the workflow's own writes leaves the file holding just what the workflow last wrote).
pub(super) struct ChangedFile<'a> {
    path: &'a str,
    /// Changed since the workflow's last write there.
    since: bool,
    /// The changes between two of the workflow's writes, said.
    pub(super) between: Vec<String>,
    /// Who left what it holds, since the workflow's last write.
    pub(super) by: Option<ChangedBy>,
    /// It holds what the workflow last wrote, written over and back since.
    back: bool,
}

impl<'a> ChangedFile<'a> {
    /// The files of `changed` (one conflict per action), in their order.
    pub(super) fn of(changed: &[&'a Conflict]) -> Vec<Self> {
        let mut files: Vec<Self> = Vec::new();
        for c in changed {
            let i = match files.iter().position(|f| f.path == c.path) {
                Some(i) => i,
                None => {
                    files.push(Self {
                        path: &c.path,
                        since: false,
                        between: Vec::new(),
                        by: None,
                        back: false,
                    });
                    files.len() - 1
                }
            };
            let f = &mut files[i];
            match &c.found_by_action {
                Some(newer) => f.between.push(format!(
                    "between actions {} and {}{}",
                    shown_path(&c.action_id),
                    shown_path(newer),
                    if c.came_back() {
                        ", where it was written over and back to the bytes it left"
                    } else {
                        ""
                    }
                )),
                None => {
                    f.since = true;
                    f.by.clone_from(&c.changed_by);
                    f.back = c.came_back();
                }
            }
        }
        files
    }

    /// The file, and what happened to it when the trail says.
    pub(super) fn said(&self) -> String {
        let path = self.path;
        let since = match (&self.by, self.back) {
            (Some(by), _) if by.rollback => format!(
                "since the workflow's last write, the rollback of {} took it with it",
                shown_path(&by.action)
            ),
            (Some(by), true) => format!(
                "since the workflow's last write, written over and back to the bytes it left, last by {}",
                shown_path(&by.action)
            ),
            (Some(by), false) => format!(
                "since the workflow's last write, written by {}",
                shown_path(&by.action)
            ),
            (None, true) => {
                "since the workflow's last write, written over and back to the bytes it left"
                    .to_owned()
            }
            (None, false) => "since the workflow's last write".to_owned(),
        };
        let between = self.between.join("; ");
        match (self.since, self.between.is_empty()) {
            (_, true) if self.by.is_none() && !self.back => path.to_owned(),
            (_, true) => format!("{path} ({since})"),
            (false, false) => {
                format!("{path} ({between}; it holds what the workflow last wrote there)")
            }
            (true, false) => format!("{path} ({since}, and {between})"),
        }
    }
}

/// Another workflow's recorded change that left what a conflicting target holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedBy {
    /// `workflow/action`.
    pub action: String,
    /// Whether the change was that action's rollback (else its write).
    pub rollback: bool,
}

/// What a target holds, compared with what an action left there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetState {
    File(String),
    Directory,
    Missing,
    Unreadable,
    /// Closed to this process by a permission (its mode, a folder's, a security
    /// module's rule): judged as [`TargetState::Unreadable`] by a rollback, but
    /// recovery, which must not take it for another program's change, waits for
    /// access; why.
    Denied(String),
    /// A folder on the way is not a folder; why.
    Unreachable(String),
    /// Reading it failed for a reason not its own (out of descriptors or memory, a disk
    /// error): nothing is known of it, so nothing may be judged from it; why.
    Failed(String),
}

impl TargetState {
    pub(crate) fn checksum(&self) -> Option<String> {
        match self {
            Self::File(sum) => Some(sum.clone()),
            Self::Unreadable | Self::Denied(_) | Self::Unreachable(_) | Self::Failed(_) => {
                Some("unreadable".to_owned())
            }
            _ => None,
        }
    }

    /// What the snapshot's action found at its target.
    pub(crate) fn found_by(meta: &SnapshotMeta) -> Self {
        match meta.kind {
            SnapshotKind::File => Self::File(meta.sha256.clone().unwrap_or_default()),
            SnapshotKind::Directory => Self::Directory,
            SnapshotKind::Missing => Self::Missing,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::File(sum) => format!("a file with SHA-256 {sum}"),
            Self::Directory => "a directory".to_owned(),
            Self::Missing => "nothing".to_owned(),
            Self::Unreadable | Self::Denied(_) => "something unreadable".to_owned(),
            Self::Unreachable(why) => format!("nothing that can be reached ({why})"),
            Self::Failed(why) => format!("something that could not be read ({why})"),
        }
    }

    /// The refusal for a target that could not be read for a reason not its own (see
    /// [`TargetState::Failed`]): `io_error`, to try again, never a conflict to force.
    fn failure(&self, path: &str) -> Option<crate::reason::Refusal> {
        let Self::Failed(why) = self else {
            return None;
        };
        let shown = shown_path(path);
        // The reader's own words name the file already, as a rule.
        let what = if why.contains(&shown) {
            why.clone()
        } else {
            format!("could not read {shown} ({why})")
        };
        Some(crate::reason::Refusal::new(
            ReasonCode::IoError,
            format!(
                "{what}, so it was not compared with what the workflow left there; it was left as it is: try again once that is put right"
            ),
        ))
    }
}

/// What an action left at its target, as the records say ([`Sandbox::left_by`]).
pub(super) struct Left {
    pub(super) state: TargetState,
    /// No artifact records the write: the action may have stopped before it, leaving
    /// what it found.
    maybe_unwritten: bool,
}

impl Left {
    /// Whether `now` is what the action left, for the snapshot `meta` it took, or the
    /// very bytes its restore writes back: a restore made whose end could not be
    /// verified (another program moved the file at that instant, then put it back), or
    /// someone's change back to those bytes. Restoring loses nothing there.
    fn holds(&self, now: &TargetState, meta: &SnapshotMeta) -> bool {
        *now == self.state
            || ((self.maybe_unwritten || meta.kind == crate::snapshot::SnapshotKind::File)
                && *now == TargetState::found_by(meta))
    }
}

/// A rollback's target as its conflict check found it.
struct Found<'s> {
    /// Its root's index.
    root: usize,
    /// The snapshot of the action whose write is judged.
    meta: &'s SnapshotMeta,
    /// What the target holds when that action's restore comes: now, or what a newer
    /// action's restore will put back.
    current: &'s TargetState,
    /// That newer action's snapshot, if any.
    newer: Option<&'s SnapshotMeta>,
    /// Whether the rollback leaves the target holding `current` in the end anyway.
    ends_so: bool,
}

impl Sandbox {
    /// Files a rollback would overwrite although they changed since the action.
    /// `snaps` is oldest first.
    ///
    /// A target that could not be read for a reason not its own (out of descriptors, a
    /// disk error) refuses the lot with `io_error`: it is no change someone made.
    ///
    /// A `forced` rollback overwrites what it finds: a trail it cannot read then only
    /// leaves the writes that came back to a workflow's bytes unlisted.
    pub(crate) fn find_conflicts(
        &self,
        workflow_id: &str,
        snaps: &[(usize, StoredSnapshot)],
        forced: bool,
    ) -> Verdict<Vec<Conflict>> {
        let mut out = Vec::new();
        let mut named = Named::after_earliest_of(snaps);
        let undoing: HashSet<&str> = snaps
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        let removes = self.removes(snaps, &undoing);
        // Read once, when a target is found as a restore leaves it.
        let record = std::cell::OnceCell::new();
        // Restoring newest first, the newest action on a path is compared with what the
        // path holds now, and each older one with what the newer snapshot will put back:
        // a difference is a change someone else made in between.
        let left_at_end = self.left_at_end(snaps);
        let mut will_hold: HashMap<String, (TargetState, &SnapshotMeta)> = HashMap::new();
        for (i, s) in snaps.iter().rev() {
            let rel = s.meta.target();
            let abs = self.abs_path(*i, &rel);
            let (current, newer) =
                match will_hold.insert(abs.clone(), (TargetState::found_by(&s.meta), &s.meta)) {
                    Some((state, newer)) => (state, Some(newer)),
                    None => (self.target_state(*i, &rel), None),
                };
            let found_by_action = newer.map(|n| n.action_id.clone());
            if let Some(r) = current.failure(&s.meta.original_path) {
                return Err(r);
            }
            let Some(left) = self.left_by(workflow_id, &s.meta) else {
                continue;
            };
            // A directory the action created is removed by its restore, so anything in
            // it the rollback does not remove is a conflict, newest action or not, and so
            // is a later create_directory that made it its result.
            let created_dir = left.state == TargetState::Directory
                && s.meta.kind == crate::snapshot::SnapshotKind::Missing;
            let mut claimed_by: Vec<String> = if created_dir {
                let maker = crate::left_dirs::Maker::of(&s.meta);
                self.claimers(*i, &s.meta.original_path, &maker, &undoing)
            } else {
                Vec::new()
            };
            // One that is gone holds nothing of anyone's, and was removed since the
            // action only if the trail records that the action made it.
            let foreign = created_dir
                && current == TargetState::Directory
                && removes.leaves_in(self, (*i, &rel), &s.meta, &mut claimed_by, forced)?;
            let restored = || {
                newer.is_none()
                    && self.left_by_failed_restore(&record, workflow_id, &s.meta, &current)
            };
            let removed = created_dir
                && current == TargetState::Missing
                && !restored()
                && record
                    .get_or_init(|| self.workflow_record(workflow_id))
                    .as_ref()
                    .is_none_or(|r| {
                        r.writes
                            .contains_key(&(s.meta.execution_id.clone(), s.meta.action_id.clone()))
                    });
            claimed_by.sort();
            claimed_by.dedup();
            let unchanged = left.holds(&current, &s.meta) || restored();
            // What stands there now, in a folder that is not the one the action wrote
            // in, is another's, whatever it holds (a copy of the action's file, say).
            let replaced = newer.is_none().then(|| {
                let root = &self.roots[*i];
                crate::snapshot::RollbackEngine::folder_replaced(root, &s.meta).or_else(|| {
                    (created_dir && current == TargetState::Directory)
                        .then(|| crate::snapshot::RollbackEngine::made_dir_replaced(root, &s.meta))
                        .flatten()
                })
            });
            let replaced = replaced.flatten();
            let made_dir_replaced = replaced.as_deref() == Some(s.meta.original_path.as_str());
            let changed_anyhow =
                !unchanged || !claimed_by.is_empty() || foreign || removed || replaced.is_some();
            let found = Found {
                root: *i,
                meta: &s.meta,
                current: &current,
                newer,
                ends_so: left_at_end.get(&abs) == Some(&current),
            };
            let (changed, changed_by) =
                self.changed_since(&mut named, &found, &left, changed_anyhow, forced)?;
            if changed {
                out.push(Conflict {
                    action_id: s.meta.action_id.clone(),
                    path: abs,
                    expected_checksum: left.state.checksum(),
                    current_checksum: current.checksum(),
                    found_by_action,
                    changed_by,
                    claimed_by,
                    folder_replaced: replaced,
                    made_dir_replaced,
                });
            }
        }
        Ok(out)
    }

    /// Whether the target `found` changed since its action left it, and by which write
    /// when the trail tells (`changed_anyhow`: the check found it so already, a
    /// difference or a folder someone else claims). Holding the very bytes the action
    /// left, it may still have been written since and come back to them.
    fn changed_since(
        &self,
        named: &mut Named<'_>,
        found: &Found<'_>,
        left: &Left,
        changed_anyhow: bool,
        forced: bool,
    ) -> Verdict<(bool, Option<ChangedBy>)> {
        let (i, meta, current) = (found.root, found.meta, found.current);
        if changed_anyhow {
            // A newer action of the rollback is what changed it, or the trail may name who.
            let by = found
                .newer
                .is_none()
                .then(|| {
                    let changes = self.changes_since_in(named, i, meta).ok()?;
                    Self::changed_by(&changes, meta, left.state.checksum(), current)
                })
                .flatten();
            return Ok((true, by));
        }
        if *current != left.state || !matches!(current, TargetState::File(_)) || found.ends_so {
            return Ok((false, None));
        }
        // The very bytes the action left, yet other workflows may have written there
        // since and come back to them (X, then Y, then X again): restoring would undo
        // the last of those writes unseen.
        match self.changes_since_in(named, i, meta) {
            Ok(changes) => Ok(Self::written_back(&changes, meta, current, found.newer)),
            Err(_) if forced => Ok((false, None)),
            Err(e) => Err(crate::error::log_refusal("read the audit trail", &e)),
        }
    }

    /// What a rollback of `snaps` (oldest first) leaves at each path in the end: what its
    /// oldest action there found.
    fn left_at_end(&self, snaps: &[(usize, StoredSnapshot)]) -> HashMap<String, TargetState> {
        let mut left: HashMap<String, TargetState> = HashMap::new();
        for (i, s) in snaps {
            left.entry(self.abs_path(*i, &s.meta.target()))
                .or_insert_with(|| TargetState::found_by(&s.meta));
        }
        left
    }

    /// What a rollback of `snaps` (their actions `undoing`) removes: the paths its
    /// actions made, and the directories they made on the way that no
    /// `create_directory` outside the rollback keeps (those kept, with their claimers).
    fn removes(&self, snaps: &[(usize, StoredSnapshot)], undoing: &HashSet<&str>) -> Removes {
        let mut r = Removes::default();
        for (i, s) in snaps
            .iter()
            .filter(|(_, s)| s.meta.kind == crate::snapshot::SnapshotKind::Missing)
        {
            r.removed.insert((*i, s.meta.original_path.clone()));
            let maker = crate::left_dirs::Maker::of(&s.meta);
            for d in &s.meta.created_dirs {
                let claims = self.claimers(*i, d, &maker, undoing);
                if claims.is_empty() {
                    r.removed.insert((*i, d.clone()));
                } else {
                    r.kept.insert((*i, d.clone()), claims);
                }
            }
        }
        r
    }

    /// [`Sandbox::changes_since_snapshot`], from the lines of the target's name in
    /// `named`, read from the trail the first time a name is asked for.
    fn changes_since_in(
        &self,
        named: &mut Named<'_>,
        root: usize,
        meta: &SnapshotMeta,
    ) -> std::io::Result<Vec<crate::audit::SandboxAuditEntry>> {
        let rel = meta.target();
        let ending = crate::audit::Ending::from(&rel);
        let key = (ending.name.to_owned(), ending.folder.map(str::to_owned));
        let recorded = match named.read.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Recorded::of(self.audit.changes_named(ending, named.after)?))
            }
        };
        // In the log's order, as if read from it, for the stable sort by time after.
        let mut lines: Vec<&crate::audit::SandboxAuditEntry> = recorded
            .by_path
            .iter()
            .filter(|(path, _)| self.names_target(path, root, &rel))
            .flat_map(|(_, lines)| lines)
            .collect();
        lines.sort_by_key(|l| l.seq);
        Ok(crate::audit::changes_after(
            lines,
            |_| true,
            &meta.taken_at,
            &meta.execution_id,
        ))
    }

    /// Whether a target holding `current`, the very file `meta`'s action left, was
    /// written back to those bytes by another workflow's write that stands (not rolled
    /// back since), recorded among `changes` (the trail's since the action's snapshot):
    /// then restoring it would undo that write unseen, a conflict, named when the trail
    /// says who left the bytes (see [`Sandbox::changed_by`]). For an older action of the
    /// workflow on the same target, only the changes before the `newer` one's snapshot
    /// count, and none is named: the later action alone is rolled back first.
    fn written_back(
        changes: &[crate::audit::SandboxAuditEntry],
        meta: &SnapshotMeta,
        current: &TargetState,
        newer: Option<&SnapshotMeta>,
    ) -> (bool, Option<ChangedBy>) {
        use crate::audit::AuditStatus;
        let window: Vec<_> = changes
            .iter()
            .filter(|c| newer.is_none_or(|n| c.timestamp < n.taken_at))
            .cloned()
            .collect();
        let undone = |w: &crate::audit::SandboxAuditEntry| {
            changes.iter().any(|r| {
                r.status == AuditStatus::RolledBack
                    && r.seq > w.seq
                    && (&r.workflow_id, &r.action_id) == (&w.workflow_id, &w.action_id)
            })
        };
        // A write that left other bytes (a dead run's, recorded after the fact with a
        // later time) did not bring these back.
        let standing = window.iter().any(|w| {
            w.status == AuditStatus::Success
                && w.workflow_id != meta.workflow_id
                && w.before_checksum != w.after_checksum
                && w.after_checksum == current.checksum()
                && !undone(w)
        });
        if !standing {
            return (false, None);
        }
        let by = newer
            .is_none()
            .then(|| Self::changed_by(&window, meta, current.checksum(), current))
            .flatten();
        (true, by)
    }

    /// Another workflow's change that left `current` at the target of `meta`'s action:
    /// the latest of `changes` (what the trail records since that action's snapshot),
    /// when they follow on from what the action `left` there, one after the other (each
    /// finding what the one before left), up to `current`, a write and its rollback
    /// taken out together. None when someone changed the target without the runtime (the
    /// chain breaks), or when the latest standing is a rollback of a write made since the
    /// action (which left a write of the chain undone, not this action's).
    fn changed_by(
        changes: &[crate::audit::SandboxAuditEntry],
        meta: &SnapshotMeta,
        left: Option<String>,
        current: &TargetState,
    ) -> Option<ChangedBy> {
        // Lines that changed nothing (a recovery recording a dead action undone over a
        // later writer's bytes) left nothing there; the undo of a write that failed put
        // back what the chain held (its write has no line of its own); a rollback of a
        // write of the chain gives back what that write found, as if neither had been.
        let mut held = left;
        let mut standing: Vec<&crate::audit::SandboxAuditEntry> = Vec::new();
        for c in changes
            .iter()
            .filter(|c| c.before_checksum != c.after_checksum)
        {
            let undo = c.status == crate::audit::AuditStatus::RolledBack;
            if c.before_checksum != held {
                if undo && c.after_checksum == held {
                    continue;
                }
                return None;
            }
            held.clone_from(&c.after_checksum);
            match standing.last() {
                Some(w)
                    if undo && (&w.workflow_id, &w.action_id) == (&c.workflow_id, &c.action_id) =>
                {
                    standing.pop();
                }
                _ => standing.push(c),
            }
        }
        let (last, below) = standing.split_last()?;
        let rollback = last.status == crate::audit::AuditStatus::RolledBack;
        // A rollback standing beneath put back what was there before this action's
        // write, or before a write of the chain: rolling back what stands above it would
        // not give this action back what it left.
        if below
            .iter()
            .any(|c| c.status == crate::audit::AuditStatus::RolledBack)
        {
            return None;
        }
        // A rollback of a write of the chain left that write's finding, not this action's.
        let undid_a_later_write = || {
            standing.iter().any(|c| {
                c.status == crate::audit::AuditStatus::Success
                    && (&c.workflow_id, &c.action_id) == (&last.workflow_id, &last.action_id)
            })
        };
        (held == current.checksum()
            && last.workflow_id != meta.workflow_id
            && !(rollback && undid_a_later_write()))
        .then(|| ChangedBy {
            action: format!("{}/{}", last.workflow_id, last.action_id),
            rollback,
        })
    }

    /// What an action left at its target, as the records say: a file's checksum (its
    /// artifact), or a directory. An action with no artifact (it failed, or its line was
    /// lost) left the file its snapshot says it was about to write, or nothing at all:
    /// whether it wrote before it stopped is not recorded. `None` when the records say
    /// nothing (snapshots older than that field).
    pub(super) fn left_by(&self, workflow_id: &str, meta: &SnapshotMeta) -> Option<Left> {
        // The artifact of this very run: an action id may be used again after a prune.
        // It says the write was made; what was written, the sealed snapshot says first
        // (the registry is not chained: a line changed by hand must not make a later
        // edit look like the action's own).
        if let Ok(Some(art)) = self.registry.get_by_action(workflow_id, &meta.action_id)
            && art.generated_by_action == format!("{}/{}", meta.execution_id, meta.action_id)
        {
            return Some(Left {
                state: TargetState::File(meta.after_sha256.clone().unwrap_or(art.checksum_sha256)),
                maybe_unwritten: false,
            });
        }
        let state = if meta.is_directory_action() {
            TargetState::Directory
        } else {
            TargetState::File(meta.after_sha256.clone()?)
        };
        Some(Left {
            state,
            maybe_unwritten: true,
        })
    }

    /// What the trail records of the workflow's own writes and restores, or `None` when
    /// it cannot say.
    fn workflow_record(&self, workflow_id: &str) -> Option<WorkflowRecord> {
        let lines = self.audit.by_workflow(workflow_id).ok()?;
        let mut r = WorkflowRecord::default();
        for e in lines {
            if e.is_unconfirmed_restore() {
                r.put_back.insert(e.action_id, e.seq);
            } else if e.status == crate::audit::AuditStatus::Success
                && e.mutation_class != Some(crate::catalog::MutationClass::Rollback)
            {
                r.writes.insert((e.execution_id, e.action_id), e.seq);
            }
        }
        Some(r)
    }

    /// Whether `now`, found at `meta`'s target, is what the undo leaves there, and the
    /// trail records, after the action's write, a restore of it made whose end failed
    /// (the root's sync, say): the runtime's own doing, not someone's change, and
    /// restoring again loses nothing. `record` is read when first needed.
    fn left_by_failed_restore(
        &self,
        record: &std::cell::OnceCell<Option<WorkflowRecord>>,
        workflow_id: &str,
        meta: &SnapshotMeta,
        now: &TargetState,
    ) -> bool {
        if *now != TargetState::found_by(meta) {
            return false;
        }
        let Some(r) = record
            .get_or_init(|| self.workflow_record(workflow_id))
            .as_ref()
        else {
            return false;
        };
        let written = r
            .writes
            .get(&(meta.execution_id.clone(), meta.action_id.clone()));
        matches!((written, r.put_back.get(&meta.action_id)), (Some(w), Some(p)) if p > w)
    }

    /// The `create_directory` actions (`workflow/action`) that stand for the directory
    /// `dir` of root `root` and were recorded since `maker` made it, other than `maker`
    /// and than those among `undoing` (actions of the maker's workflow a rollback is
    /// about to restore): its existence is their result, so the maker's rollback must
    /// leave it. (One recorded before cannot have found the directory `maker` made: it
    /// named an earlier one, since gone.)
    pub(crate) fn claimers(
        &self,
        root: usize,
        dir: &str,
        maker: &crate::left_dirs::Maker,
        undoing: &HashSet<&str>,
    ) -> Vec<String> {
        let rel = RelPath::from_recorded(dir);
        match self
            .audit
            .directory_claims(|t| self.names_target(t, root, &rel))
        {
            Ok(claims) => claims
                .into_iter()
                .filter(|c| {
                    c.at >= maker.at
                        && (c.workflow_id != maker.workflow_id
                            || (c.action_id != maker.action_id
                                && !undoing.contains(c.action_id.as_str())))
                })
                .map(|c| format!("{}/{}", c.workflow_id, c.action_id))
                .collect(),
            // Unknown: keeping a directory is the harmless answer.
            Err(_) => vec!["(the audit trail could not be read)".to_owned()],
        }
    }

    /// Whether a `create_directory` that stands keeps the directory `dir` of root `root`
    /// from removal by `maker`'s rollback (see [`Sandbox::claimers`]).
    pub(super) fn claimed(&self, root: usize, dir: &str, maker: &crate::left_dirs::Maker) -> bool {
        !self.claimers(root, dir, maker, &HashSet::new()).is_empty()
    }

    /// What a target holds now.
    pub(crate) fn target_state(&self, root: usize, rel: &RelPath) -> TargetState {
        self.target_state_judged(root, rel).0
    }

    /// [`Sandbox::target_state`], with what a restore judged by it may replace: the very
    /// file it read, nothing where it found nothing.
    pub(super) fn target_state_judged(&self, root: usize, rel: &RelPath) -> (TargetState, Put) {
        if let Err(e) = self.fail_at("read_target") {
            return (TargetState::Failed(e.reason), Put::Any);
        }
        // A file gone between the look and the read is looked at again: missing now, or
        // whatever took its place, not "something unreadable" that force would not help.
        // One that keeps changing under every look is.
        (0..3)
            .find_map(|_| self.target_state_once(root, rel))
            .unwrap_or((TargetState::Unreadable, Put::Any))
    }

    /// One look and read of [`Sandbox::target_state_judged`]; `None` when the file the
    /// look saw was gone by the read.
    fn target_state_once(&self, root: usize, rel: &RelPath) -> Option<(TargetState, Put)> {
        let r = &self.roots[root];
        Some(match r.inspect(rel).map(|t| t.kind) {
            Ok(TargetKind::File { .. }) => match self
                .fail_at("target_looked")
                .and_then(|()| r.read_file_stamped(rel, MAX_SNAPSHOT_BYTES))
            {
                Ok((b, stamp)) => (TargetState::File(sha256_hex(&b)), Put::Unchanged(stamp)),
                Err(e) if e.reason_code == ReasonCode::NotFound => return None,
                Err(e) if e.reason_code == ReasonCode::IoError => {
                    (TargetState::Failed(e.reason), Put::Any)
                }
                Err(e) if e.denied => (TargetState::Denied(e.reason), Put::Any),
                Err(_) => (TargetState::Unreadable, Put::Any),
            },
            Ok(TargetKind::Directory) => (TargetState::Directory, Put::Any),
            Ok(TargetKind::Missing) => (TargetState::Missing, Put::New),
            // A folder on the way is not a folder (a file, a FIFO): what is beneath its
            // place cannot be reached (the folder may have been moved, files and all).
            Err(r) if r.reason_code == ReasonCode::NotFound => {
                (TargetState::Unreachable(r.reason), Put::Any)
            }
            Err(r) if r.reason_code == ReasonCode::IoError => {
                (TargetState::Failed(r.reason), Put::Any)
            }
            Err(r) if r.denied => (TargetState::Denied(r.reason), Put::Any),
            Err(_) => (TargetState::Unreadable, Put::Any),
        })
    }

    /// What `meta`'s target holds now, to judge a restore by; refused (`io_error`) when
    /// it could not be read for a reason not its own (see [`TargetState::Failed`]).
    fn state_to_judge(&self, root: usize, meta: &SnapshotMeta) -> Verdict<(TargetState, Put)> {
        let (now, put) = self.target_state_judged(root, &meta.target());
        match now.failure(&meta.original_path) {
            Some(r) => Err(r),
            None => Ok((now, put)),
        }
    }

    /// Refuses (`conflict`) to restore a target that no longer holds what its action
    /// left, naming both; else says to restore it, over the file it judged (see
    /// [`Judged`]).
    pub(super) fn check_unchanged(
        &self,
        workflow_id: &str,
        root: usize,
        meta: &SnapshotMeta,
    ) -> Verdict<Judged> {
        let Some(left) = self.left_by(workflow_id, meta) else {
            return Ok((true, Put::Any));
        };
        let (now, put) = self.state_to_judge(root, meta)?;
        if left.holds(&now, meta)
            || self.left_by_failed_restore(&Default::default(), workflow_id, meta, &now)
        {
            return Ok((true, put));
        }
        // Force overwrites a changed file, never a link, a special file, a file with
        // other links or a folder (nor reaches beneath what stands for a folder).
        let advice = match now {
            TargetState::Unreachable(_) | TargetState::Unreadable | TargetState::Directory => {
                "force would not help: move that away, then roll back"
            }
            _ => "roll back with force to overwrite it",
        };
        Err(crate::reason::Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{} changed after action {} wrote it: it holds {} instead of {}; it was left as it is ({advice})",
                shown_path(&meta.original_path),
                shown_path(&meta.action_id),
                now.describe(),
                left.state.describe()
            ),
        ))
    }

    /// For an action undoing its own change: whether there is one to undo (see
    /// [`RestoreMode::OwnChange`]).
    pub(super) fn check_own_change(
        &self,
        root: usize,
        meta: &SnapshotMeta,
        left: &TargetState,
    ) -> Verdict<Judged> {
        let (now, put) = self.state_to_judge(root, meta)?;
        if now == TargetState::found_by(meta) {
            return Ok((false, Put::Any));
        }
        if now == *left {
            return Ok((true, put));
        }
        Err(crate::reason::Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{} holds {}, which action {} did not write; it was left as it is",
                shown_path(&meta.original_path),
                now.describe(),
                shown_path(&meta.action_id)
            ),
        ))
    }
}
