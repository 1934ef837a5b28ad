//! Rollback (SPEC §7): what can be restored, and restoring it.

use super::conflicts::{ChangedFile, Conflict, TargetState};
use super::locks::workflow_lock_refusal;
use super::{RootedSnapshots, Sandbox, workflow_folder};
use crate::audit::{AuditRecord, AuditStatus, SandboxAuditEntry};
use crate::catalog::MutationClass;
use crate::confine::path::shown_path;
use crate::confine::root::Put;
use crate::confine::state::LockBusy;
use crate::confine::{EntryKind, RelPath};
use crate::context::DryRunReason;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::snapshot::{
    Forced, LeftDir, RollbackEngine, SnapshotKind, SnapshotMeta, Snapshotter, StoredSnapshot,
};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// Why a rollback is refused before it starts: the code, the sentence, the conflicts.
type RollbackRefusal = (ReasonCode, String, Vec<Conflict>);

wire_enum! {
    /// What became of a rollback, as its report's `status` says it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RollbackStatus {
        /// Every step asked for was restored (and recorded).
        RolledBack = "rolled_back",
        /// Writing off or dry-run on: it said what it would restore, and restored nothing.
        Simulated = "simulated",
        /// Refused before it started: nothing was restored.
        Refused = "refused",
        /// It started, and a step failed, or the trail could not record the steps.
        Failed = "failed",
    }
}

/// Compared with its name, as the faces print it.
impl PartialEq<&str> for RollbackStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackReport {
    /// The workflow.
    pub workflow_id: String,
    /// What became of it.
    pub status: RollbackStatus,
    /// How many actions were restored.
    pub steps_rolled_back: u64,
    /// Why it was refused or failed.
    pub reason_code: Option<ReasonCode>,
    /// Why, for people.
    pub reason: Option<String>,
    /// Files changed since the workflow wrote them.
    pub conflicts: Vec<Conflict>,
    /// Each restore.
    pub steps: Vec<RollbackStep>,
}

impl RollbackReport {
    /// Whether everything asked for was restored.
    pub fn is_success(&self) -> bool {
        self.status == RollbackStatus::RolledBack
    }

    /// Whether it only said what it would restore (writes off or dry-run on).
    pub fn is_simulated(&self) -> bool {
        self.status == RollbackStatus::Simulated
    }

    /// What a forced rollback overwrote: the files and directories its conflicts name
    /// that held something else, each once, in order, but for a directory its step left
    /// in place (it holds what is not the workflow's, which force never removes).
    pub fn overwritten_paths(&self) -> Vec<&str> {
        self.forced_paths(false)
    }

    /// What a forced rollback found removed since the workflow wrote it (nothing there
    /// to overwrite: a file the workflow made stays gone, one it replaced is put back).
    pub fn found_removed_paths(&self) -> Vec<&str> {
        self.forced_paths(true)
    }

    fn forced_paths(&self, removed: bool) -> Vec<&str> {
        let mut paths: Vec<&str> = Vec::new();
        for c in &self.conflicts {
            let left = self.steps.iter().any(|s| {
                s.path == c.path
                    && s.detail
                        .as_deref()
                        .is_some_and(|d| d.starts_with(crate::snapshot::LEFT_IN_PLACE))
            });
            // With `found_by_action`, the checksum is what a later action of the
            // workflow found, not what stands there now.
            let gone = c.current_checksum.is_none() && c.found_by_action.is_none();
            if !left && gone == removed && !paths.contains(&c.path.as_str()) {
                paths.push(&c.path);
            }
        }
        paths
    }
}

/// How a rollback step's record says the audit trail was held by another process past
/// `limits.lock_wait_seconds`.
const HELD_TRAIL: &str = "another process held the audit trail";

/// What holds for every restore of one [`Sandbox::restore_all`].
struct Pass<'a> {
    workflow_id: &'a str,
    mode: &'a RestoreMode,
    /// Recovery finishing a dead run's undo, which differs from a rollback here and there.
    recovering: bool,
}

/// How [`Sandbox::restore_all`] treats each target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RestoreMode {
    /// An action undoing its own change after it failed, holding the target's lock: a
    /// target still as the snapshot found it needs nothing, one holding what the action
    /// wrote (this) is restored, and anything else was not written by the action and
    /// is left alone (`conflict`).
    OwnChange(TargetState),
    /// Whatever the target holds now is replaced (a forced rollback; recovery, which
    /// has judged each target).
    Force,
    /// Only a target that still holds what its action left is restored; any other
    /// step fails with `conflict` and its target stays as it is.
    Unchanged,
    /// An action whose write was refused before its target changed (a file appeared
    /// where it found none, and the no-replace rename kept it): the target is left as it
    /// is, whatever it holds; directories made on the way go if empty.
    Untouched,
}

/// One restore of a rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackStep {
    /// The action undone.
    pub action_id: String,
    /// Its intent.
    pub intent: String,
    /// The target (absolute, inside a root).
    pub path: String,
    /// Whether it was restored.
    pub restored: bool,
    /// Whether the result matches the snapshot.
    pub checksum_validated: bool,
    /// SHA-256 after the restore.
    pub restored_checksum: Option<String>,
    /// What became of a target no checksum describes: removed, or a directory left in
    /// place or made again, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Why it failed.
    pub reason_code: Option<ReasonCode>,
    /// Why, for people.
    pub reason: Option<String>,
    /// Why its audit line could not be written, if it could not.
    #[serde(skip)]
    pub unrecorded: Option<String>,
}

impl RollbackStep {
    /// Whether the step failed after its restore was made (the target holds what the
    /// undo leaves; what came after, such as the root's sync, failed): its reason
    /// begins [`crate::snapshot::PUT_BACK_UNCONFIRMED`], and a rollback run again
    /// finishes it.
    pub fn is_unconfirmed(&self) -> bool {
        !self.restored
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(crate::snapshot::PUT_BACK_UNCONFIRMED))
    }

    /// A step that restored nothing, and why.
    pub(crate) fn failed(meta: &SnapshotMeta, path: String, r: Refusal) -> Self {
        Self {
            action_id: meta.action_id.clone(),
            intent: meta.intent.clone(),
            path,
            restored: false,
            checksum_validated: false,
            restored_checksum: None,
            detail: None,
            reason_code: Some(r.reason_code),
            reason: Some(r.reason),
            unrecorded: None,
        }
    }
}

/// What can be rolled back (`GET /agentic/rollback/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackInfo {
    /// The workflow.
    pub workflow_id: String,
    /// Whether a rollback would have something to do, and would not be refused before
    /// it starts (conflicts aside: those a forced rollback overrides).
    pub rollback_available: bool,
    /// Why a rollback would be refused before it starts (the code `POST` answers with).
    pub reason_code: Option<ReasonCode>,
    /// The same, for a person; without a code, what a rollback would leave as it is
    /// (writes whose snapshots were pruned).
    pub reason: Option<String>,
    /// Snapshots, newest first.
    pub actions: Vec<RollbackInfoAction>,
    /// Conflicts a rollback would meet now.
    pub conflicts: Vec<Conflict>,
}

/// One snapshot in [`RollbackInfo`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RollbackInfoAction {
    /// The action.
    pub action_id: String,
    /// Its intent.
    pub intent: String,
    /// The target.
    pub path: String,
    /// Whether it existed before.
    pub existed: bool,
    /// The snapshot folder, relative to its root.
    pub rollback_path: String,
    /// When taken.
    pub taken_at: String,
    /// Whether already restored.
    pub restored: bool,
}

/// Options of [`Sandbox::rollback_workflow`].
#[derive(Debug, Clone, Default)]
pub struct RollbackOptions {
    /// Only this action.
    pub action_id: Option<String>,
    /// Restore even over later changes.
    pub force: bool,
}

impl RollbackOptions {
    /// Whether the rollback asked for takes in `action`'s writes.
    fn takes(&self, action: &str) -> bool {
        self.action_id.as_deref().is_none_or(|a| a == action)
    }
}

/// The snapshots of `snaps` (oldest first) taken after one of `action`'s, in the same
/// root, on its target or a path beneath or above it, by other actions not yet undone
/// (`undone`).
fn later_writers<'a>(
    snaps: &'a [(usize, StoredSnapshot)],
    action: &str,
    undone: impl Fn(&StoredSnapshot) -> bool,
) -> Vec<&'a (usize, StoredSnapshot)> {
    let overlaps = |a: &str, b: &str| {
        a == b
            || a.strip_prefix(b).is_some_and(|r| r.starts_with('/'))
            || b.strip_prefix(a).is_some_and(|r| r.starts_with('/'))
    };
    let is_mine = |s: &StoredSnapshot| s.meta.action_id == action && !undone(s);
    let Some(first) = snaps.iter().position(|(_, s)| is_mine(s)) else {
        return Vec::new();
    };
    let mine: Vec<_> = snaps[first..].iter().filter(|(_, s)| is_mine(s)).collect();
    snaps[first + 1..]
        .iter()
        .filter(|(i, s)| {
            s.meta.action_id != action
                && !undone(s)
                && mine.iter().any(|(mi, m)| {
                    mi == i && overlaps(&m.meta.original_path, &s.meta.original_path)
                })
        })
        .collect()
}

/// Whether a snapshot of `snaps` asked for by `opts` is still there of a write a prune
/// covered (`pruned_up_to` of its root, in `trail`): a prune records itself before it
/// removes anything, so it stopped half way, and its mark must not excuse the folders it
/// did remove.
fn pruned_but_present(
    snaps: &RootedSnapshots,
    trail: &[SandboxAuditEntry],
    opts: &RollbackOptions,
    pruned_up_to: impl Fn(usize) -> Option<u64>,
) -> bool {
    snaps.iter().any(|(i, s)| {
        let up_to = pruned_up_to(*i).unwrap_or(0);
        up_to > 0
            && opts.takes(&s.meta.action_id)
            && trail.iter().any(|e| {
                e.status == AuditStatus::Success
                    && e.seq <= up_to
                    && e.action_id == s.meta.action_id
                    && e.execution_id == s.meta.execution_id
            })
    })
}

/// The refusal of a workflow whose snapshot folders hold `untrusted` entries: the
/// first, and how many more, which would otherwise be met one refusal at a time.
fn untrusted_refusal(workflow_id: &str, untrusted: &[crate::Refusal]) -> Option<crate::Refusal> {
    match untrusted {
        [] => None,
        [one] => Some(one.clone()),
        [first, more @ ..] => Some(crate::Refusal::new(
            first.reason_code,
            format!(
                "{}; {} not trusted either: inspect {} in each root",
                first.reason,
                if more.len() == 1 {
                    "1 more of the workflow's snapshot entries is".to_owned()
                } else {
                    format!("{} more of the workflow's snapshot entries are", more.len())
                },
                shown_path(&format!(
                    "{}/{workflow_id}/",
                    crate::confine::path::ROLLBACK_DIR
                ))
            ),
        )),
    }
}

/// What a workflow's trail lines say of its writes, for choosing what to roll back.
struct TrailWrites<'t> {
    /// Writes that must have a snapshot here: by action, its latest write's `seq` and
    /// target.
    written: HashMap<&'t str, (u64, &'t str)>,
    /// Writes into a root this process is not configured with.
    elsewhere: Vec<&'t SandboxAuditEntry>,
    /// Writes whose snapshots a prune removed: they need none.
    pruned: Vec<&'t SandboxAuditEntry>,
    /// By action, the `seq` of its latest rollback line.
    undone: HashMap<&'t str, u64>,
}

impl<'t> TrailWrites<'t> {
    /// From `trail` (a workflow's lines, in order), the root each target lies in
    /// (`root_of`), and how far in the trail prunes went through each root.
    fn of(
        trail: &'t [SandboxAuditEntry],
        root_of: impl Fn(&SandboxAuditEntry) -> Option<usize>,
        pruned_up_to: impl Fn(usize) -> Option<u64>,
    ) -> Self {
        let mut w = Self {
            written: HashMap::new(),
            elsewhere: Vec::new(),
            pruned: Vec::new(),
            undone: HashMap::new(),
        };
        for e in trail {
            match e.status {
                AuditStatus::Success
                    if e.rollback_available
                        && e.mutation_class != Some(MutationClass::Rollback) =>
                {
                    match root_of(e) {
                        None => w.elsewhere.push(e),
                        Some(i) if pruned_up_to(i).is_none_or(|up_to| e.seq > up_to) => {
                            w.written.insert(&e.action_id, (e.seq, &e.target_path));
                        }
                        Some(_) => w.pruned.push(e),
                    }
                }
                AuditStatus::RolledBack => {
                    w.undone.insert(&e.action_id, e.seq);
                }
                _ => {}
            }
        }
        w
    }

    /// Undone after its write; or, never recorded as written (an action that failed,
    /// its own change undone), undone at all: its restore's mark may be missing (the
    /// root was full), and a later rollback would otherwise "restore" it over whatever
    /// stands there now.
    fn is_undone(&self, action: &str) -> bool {
        match self.written.get(action) {
            Some((w, _)) => self.undone.get(action).is_some_and(|u| u > w),
            None => self.undone.contains_key(action),
        }
    }

    /// Of the writes kept apart (pruned, or into another root), whether `e` is one asked
    /// for and not undone since.
    fn in_place(&self, e: &SandboxAuditEntry, opts: &RollbackOptions) -> bool {
        opts.takes(&e.action_id)
            && self
                .undone
                .get(e.action_id.as_str())
                .is_none_or(|u| *u < e.seq)
    }

    /// The writes asked for that need a snapshot and have none in `snaps`, as said to
    /// people, sorted.
    fn missing(&self, snaps: &RootedSnapshots, opts: &RollbackOptions) -> Vec<String> {
        let have: HashSet<&str> = snaps
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        let mut missing: Vec<String> = self
            .written
            .iter()
            .filter(|(a, _)| opts.takes(a))
            .filter(|(a, _)| !have.contains(**a) && !self.is_undone(a))
            .map(|(a, (_, path))| format!("{} ({path})", shown_path(a)))
            .collect();
        missing.sort();
        missing
    }

    /// The snapshots of `snaps` (oldest first, each marked restored as its mark or the
    /// trail says) whose change an older action of the workflow on the same file took
    /// with it when a rollback restored that one after this one's write: passed over as
    /// spent (its backup damaged or gone) by a forced rollback that then could not
    /// record it undone beneath (it died first, or the trail refused the older
    /// restores' lines). Restoring its backup now would bring the older action's bytes
    /// back over that restore. A write made after the older restore (a later run of the
    /// workflow) stands. By snapshot id, with what the oldest such restore gave the
    /// file (what its action found), which the file holds unless changed since.
    fn undone_beneath(&self, snaps: &RootedSnapshots) -> HashMap<String, TargetState> {
        let mut beneath = HashMap::new();
        for (at, (i, s)) in snaps.iter().enumerate() {
            let Some((written, _)) = self.written.get(s.meta.action_id.as_str()) else {
                continue;
            };
            if s.restored || self.is_undone(&s.meta.action_id) {
                continue;
            }
            let older_restore = snaps[..at].iter().find(|(oi, o)| {
                oi == i
                    && o.restored
                    && o.meta.original_path == s.meta.original_path
                    && o.meta.action_id != s.meta.action_id
                    && self
                        .undone
                        .get(o.meta.action_id.as_str())
                        .is_some_and(|u| u > written)
            });
            if let Some((_, o)) = older_restore {
                beneath.insert(s.meta.snapshot_id.clone(), TargetState::found_by(&o.meta));
            }
        }
        beneath
    }
}

/// A snapshot undone beneath an older restore, with what that restore gave its file.
type Beneath = (usize, StoredSnapshot, TargetState);

/// The snapshots of `chosen` not yet restored, apart from those undone `beneath` an
/// older restore (each with what that restore gave its file).
fn split_beneath(
    chosen: RootedSnapshots,
    beneath: &HashMap<String, TargetState>,
) -> (RootedSnapshots, Vec<Beneath>) {
    let (mut rest, mut under) = (Vec::new(), Vec::new());
    for (i, s) in chosen.into_iter().filter(|(_, s)| !s.restored) {
        match beneath.get(&s.meta.snapshot_id) {
            Some(gave) => under.push((i, s, gave.clone())),
            None => rest.push((i, s)),
        }
    }
    (rest, under)
}

/// What a rollback of a workflow (or one of its actions) takes in, judged by
/// [`Sandbox::rollback_selection`].
struct Selection {
    /// Its snapshots, oldest first, each marked restored when its mark or the trail
    /// says so.
    chosen: RootedSnapshots,
    /// The ids of the snapshots of `chosen` undone beneath an older restore
    /// ([`TrailWrites::undone_beneath`]), with what that restore gave their file:
    /// recorded so, never restored.
    beneath: HashMap<String, TargetState>,
    /// The writes whose snapshots a prune removed, as said to people.
    pruned: Vec<String>,
}

impl Sandbox {
    /// Every snapshot of a workflow across roots, oldest first, with its root. A record
    /// that cannot be trusted refuses the whole workflow: a rollback that skipped it would
    /// report success with a file left unrestored.
    pub(crate) fn workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<Vec<(usize, StoredSnapshot)>> {
        let (all, untrusted) = self.workflow_snapshots_and_untrusted(workflow_id)?;
        match untrusted_refusal(workflow_id, &untrusted) {
            None => Ok(all),
            Some(r) => Err(r),
        }
    }

    /// [`Sandbox::workflow_snapshots`] for recovery and pruning, which act on what they
    /// can trust and leave the rest alone (logged) rather than giving up on the whole
    /// workflow. Also returns how many folders were left alone. An error means nothing
    /// could be read at all (a root's `.rollback` unreadable, say).
    pub(crate) fn trusted_workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<(RootedSnapshots, Vec<crate::Refusal>)> {
        let (all, untrusted) = self
            .workflow_snapshots_and_untrusted(workflow_id)
            .inspect_err(|r| {
                tracing::error!(workflow = %workflow_id, reason = %r, "the workflow's snapshots could not be read");
            })?;
        for r in &untrusted {
            tracing::error!(workflow = %workflow_id, reason = %r, "an untrusted snapshot folder was left alone");
        }
        Ok((all, untrusted))
    }

    fn workflow_snapshots_and_untrusted(
        &self,
        workflow_id: &str,
    ) -> Verdict<(RootedSnapshots, Vec<crate::Refusal>)> {
        let mut all = Vec::new();
        let mut untrusted = Vec::new();
        for (i, root) in self.roots.iter().enumerate() {
            let (snaps, bad) = Snapshotter::load_workflow(root, &self.seal, workflow_id)?;
            all.extend(snaps.into_iter().map(|s| (i, s)));
            untrusted.extend(bad);
        }
        all.sort_by(|a, b| a.1.meta.snapshot_id.cmp(&b.1.meta.snapshot_id));
        self.in_trail_order(workflow_id, &mut all)?;
        Ok((all, untrusted))
    }

    /// Orders the snapshots run by run as the trail recorded the runs (by each run's
    /// first recorded write), each run's in the order it took them: ids follow the clock
    /// of the process that made them, and a clock set back between two runs would
    /// otherwise have the later run's writes restored first. A run's own ids never go
    /// back (see [`crate::ids`]). Runs with no write on the trail (undone at once, or dead
    /// and not yet recovered, which no later run of the workflow can follow) come last.
    /// Refused when the trail cannot be read: in id order they could be restored wrongly.
    fn in_trail_order(&self, workflow_id: &str, all: &mut RootedSnapshots) -> Verdict<()> {
        let entries = self
            .failpoints
            .check("trail_order")
            .and_then(|()| self.audit.by_workflow(workflow_id))
            .map_err(|e| crate::error::log_refusal("read the audit trail", &e))?;
        let mut first: HashMap<&str, u64> = HashMap::new();
        for e in &entries {
            if e.status == AuditStatus::Success {
                let seq = first.entry(e.execution_id.as_str()).or_insert(e.seq);
                *seq = (*seq).min(e.seq);
            }
        }
        all.sort_by_cached_key(|(_, s)| {
            (
                first
                    .get(s.meta.execution_id.as_str())
                    .copied()
                    .unwrap_or(u64::MAX),
                s.meta.snapshot_id.clone(),
            )
        });
        Ok(())
    }

    /// What a rollback of the workflow would restore, and the conflicts it would meet.
    pub fn rollback_info(&self, workflow_id: &str) -> Verdict<RollbackInfo> {
        crate::plan::check_id("workflow_id", workflow_id)?;
        // A trail another process holds says nothing of the rollback: the answer is that
        // it is busy (`conflict`, to ask again), not a document saying none is available.
        // (Catching up with the log is the read that waits; nothing is copied out.)
        if let Err(e) = self.audit.last_seq()
            && LockBusy::is_cause_of(&e)
        {
            return Err(crate::error::log_refusal("read the audit trail", &e));
        }
        // A run of the workflow that died is recovered first, as a rollback would do
        // (it may undo some of what is listed below): otherwise the answer would list
        // its unfinished actions as a rollback's, which the rollback then finds undone.
        // Not waited for: a run or rollback under way holds the lock, and is no dead run.
        // Not tried by a process that writes nothing more (a sync failed), as a rollback
        // would not; a recovery that cannot be done is the answer's refusal, as it would
        // be the rollback's.
        let mut recovery = None;
        if let Err(r) = self.check_syncs() {
            // Refused in every mode, as the rollback is (a simulated one writes its lines).
            recovery = Some((r.reason_code, r.reason));
        } else if self.execution_context().0.writes()
            && let Ok(Some(_lock)) = self.state.try_lock_workflow_if_used(workflow_id)
            && let Err(r) = self.settle_before_change(workflow_id)
        {
            recovery = Some((r.reason_code, r.reason));
        }
        let found = match self.workflow_snapshots(workflow_id) {
            Ok(found) => found,
            // What stands in the way of reading them (a planted link, a folder others
            // could change) is described like any other refusal; a failing disk or a
            // busy peer is the answer's own error, as it would be the rollback's.
            Err(r) if !matches!(r.reason_code, ReasonCode::IoError | ReasonCode::Conflict) => {
                let (code, reason) = recovery.unwrap_or((r.reason_code, r.reason));
                return Ok(RollbackInfo {
                    workflow_id: workflow_id.to_owned(),
                    rollback_available: false,
                    reason_code: Some(code),
                    reason: Some(reason),
                    actions: Vec::new(),
                    conflicts: Vec::new(),
                });
            }
            Err(r) => return Err(r),
        };
        let (snaps, refusal, pruned, beneath) = match self.rollback_selection(
            workflow_id,
            found.clone(),
            &RollbackOptions::default(),
        ) {
            Ok(sel) => (sel.chosen, None, sel.pruned, sel.beneath),
            Err(refused) => (found, Some(refused), Vec::new(), HashMap::new()),
        };
        // Those undone beneath an older restore are recorded, not restored: nothing to
        // check of their files.
        let pending: Vec<_> = snaps
            .iter()
            .filter(|(_, s)| !s.restored && !beneath.contains_key(&s.meta.snapshot_id))
            .cloned()
            .collect();
        let (refusal, conflicts) = match refusal {
            Some((code, reason, conflicts)) => (Some((code, reason)), conflicts),
            None => match self.find_conflicts(workflow_id, &pending, false) {
                Ok(conflicts) => (
                    self.standing_refusal(&pending, false)
                        .map(|(r, _)| (r.reason_code, r.reason)),
                    conflicts,
                ),
                Err(r) => (Some((r.reason_code, r.reason)), Vec::new()),
            },
        };
        let refusal = recovery.or(refusal);
        let actions = snaps
            .iter()
            .rev()
            .map(|(i, s)| RollbackInfoAction {
                action_id: s.meta.action_id.clone(),
                intent: s.meta.intent.clone(),
                path: self.abs_path(*i, &s.meta.target()),
                existed: s.meta.existed,
                rollback_path: s.meta.rollback_path(),
                taken_at: s.meta.taken_at.clone(),
                restored: s.restored,
            })
            .collect();
        Ok(RollbackInfo {
            workflow_id: workflow_id.to_owned(),
            rollback_available: refusal.is_none() && (!pending.is_empty() || !beneath.is_empty()),
            reason_code: refusal.as_ref().map(|(code, _)| *code),
            // Not refused, yet not all of the workflow would come back: said as the
            // rollback would say it.
            reason: refusal
                .map(|(_, reason)| reason)
                .or_else(|| (!pruned.is_empty()).then(|| pruned_left(&pruned))),
            actions,
            conflicts,
        })
    }

    /// What force cannot override in `chosen`'s targets, as one refusal with the code of
    /// the first: a directory someone put where a file was, or a file where a directory
    /// was made (not the workflow's to remove), a file with another hard link, a FIFO or
    /// device, a symbolic link or another root's mount on the way.
    fn beyond_force(&self, chosen: &[(usize, StoredSnapshot)]) -> Option<Refusal> {
        let mut found: Vec<(ReasonCode, String)> = Vec::new();
        for (i, s) in chosen {
            let (root, rel) = (&self.roots[*i], s.meta.target());
            let path = shown_path(&s.meta.original_path);
            let dir_action = s.meta.is_directory_action();
            let why = match root.entry(&rel) {
                Ok((EntryKind::Directory, _)) if !dir_action => Some((
                    ReasonCode::NotRegularFile,
                    format!("{path} is now a directory where the workflow wrote a file"),
                )),
                Ok((EntryKind::File { .. }, _)) if dir_action => Some((
                    ReasonCode::Conflict,
                    format!("{path} is now a file where the workflow made or found a directory"),
                )),
                Ok((EntryKind::File { links, .. }, _)) if links > 1 => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                Ok((EntryKind::Special, _)) => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                // A link is not the workflow's to remove, wherever it stands: in place of
                // a file it replaced as much as of one it made (force overwrites bytes
                // someone changed, not a different kind of thing someone put there).
                Ok((EntryKind::Symlink, _)) => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                Err(r)
                    if matches!(
                        r.reason_code,
                        ReasonCode::SymlinkEscape
                            | ReasonCode::SymlinkRefused
                            | ReasonCode::ReservedPath
                    ) =>
                {
                    Some((r.reason_code, r.reason))
                }
                // A folder on the way is now a file or a FIFO: nothing beneath it can be
                // restored, and it is not the workflow's to remove.
                Err(r) if r.reason_code == ReasonCode::NotFound => {
                    Some((ReasonCode::Conflict, r.reason))
                }
                _ => None,
            };
            if let Some(w) = why
                && !found.iter().any(|(_, r)| *r == w.1)
            {
                found.push(w);
            }
        }
        let code = found.first()?.0;
        let linked = found.iter().any(|(c, _)| *c == ReasonCode::HardlinkRefused);
        let reasons: Vec<String> = found.into_iter().map(|(_, r)| r).collect();
        Some(Refusal::new(
            code,
            format!(
                "{}; a rollback never removes what the workflow did not make, nor writes to a file with other links, a special file or through a link, even with force: move it away{}, then roll back",
                reasons.join("; "),
                if linked {
                    " (or remove the extra link)"
                } else {
                    ""
                }
            ),
        ))
    }

    /// What in `chosen` this process may not change, as one refusal: a folder holding a
    /// target, or holding a directory an action made, without write permission for it
    /// (or read-only), and a target or such folder marked immutable or append-only
    /// (`chattr +i`, `+a`). Met at its restore, the rollback stopped half way.
    fn unwritable_folders(&self, chosen: &[(usize, StoredSnapshot)]) -> Option<Refusal> {
        let mut found: Vec<String> = Vec::new();
        let mut note = |why: String| {
            if !found.contains(&why) {
                found.push(why);
            }
        };
        for (i, s) in chosen {
            let root = &self.roots[*i];
            // The target's folder, and the folders holding each directory it made that
            // the rollback removes: one holding more than the way to the target is left.
            let made = s
                .meta
                .created_dirs
                .iter()
                .filter(|d| **d != s.meta.original_path)
                .map(|d| RelPath::from_components(d.split('/').map(str::to_owned).collect()))
                .filter(|d| root.count_entries(d, 2).is_ok_and(|n| n <= 1));
            // A directory action's target changes only when it made it and the folder
            // is empty again (one it found, or holding others' files, is left in place).
            let target_changes = !s.meta.is_directory_action()
                || (!s.meta.existed
                    && root.is_empty_dir(&s.meta.target()).is_ok_and(|empty| empty));
            let target = target_changes.then(|| s.meta.target());
            for rel in target.into_iter().chain(made) {
                let Ok((parent, _)) = root.open_parent(&rel, false, false) else {
                    continue;
                };
                // A file the action made that is gone already: nothing to remove.
                if s.meta.kind == SnapshotKind::Missing
                    && !s.meta.is_directory_action()
                    && rel == s.meta.target()
                    && parent
                        .symlink_metadata(rel.file_name())
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                {
                    continue;
                }
                if let Some(why) = crate::confine::root::change_refused(
                    &parent,
                    rel.file_name(),
                    &shown_path(&rel.as_string()),
                    self.fsync_each(),
                ) {
                    note(why);
                }
            }
        }
        if found.is_empty() {
            return None;
        }
        // Something someone changed about the tree since the workflow wrote (a permission,
        // a mark, a mount): a conflict to put right, not a failure of the disk.
        Some(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{}; nothing was restored, and force would not help: put that right (the permission, the mount, the mark — chattr — or the owner), then roll back",
                found.join("; ")
            ),
        ))
    }

    /// What refuses the rollback of `chosen` before any restore, whatever the conflicts
    /// (the first of: no room for its records, a root moved away, a change no force
    /// overrides, a folder it cannot write, a damaged backup), with how many backups it
    /// found damaged; the preview and the rollback ask the same.
    fn standing_refusal(
        &self,
        chosen: &[(usize, StoredSnapshot)],
        forced: bool,
    ) -> Option<(Refusal, usize)> {
        self.record_room(&self.root_names(chosen.iter().map(|(i, _)| *i)), true)
            .err()
            .or_else(|| {
                chosen
                    .iter()
                    .find_map(|(i, _)| self.root_in_place(*i).err())
            })
            .or_else(|| self.beyond_force(chosen))
            .or_else(|| self.unwritable_folders(chosen))
            .map(|r| (r, 0))
            .or_else(|| self.damaged_backups(chosen, forced))
    }

    /// A backup of `chosen` (oldest first) that cannot give its file back (gone,
    /// unreadable, or not the bytes its seal names), as one refusal: met at its restore,
    /// the rollback stopped half way, after restoring the newer actions. An unforced
    /// rollback needs every restore of a file in turn (each goes ahead only over what its
    /// action left), so every backup is looked at. A forced one overwrites, so only the
    /// restore that leaves each file as it ends (its oldest chosen action's) matters
    /// (`forced`): a newer one's damage must not block the rollback that gives the file
    /// back.
    /// Also returns how many backups it found damaged (`checksum_mismatch`), for the
    /// metric a rollback asked for counts.
    fn damaged_backups(
        &self,
        chosen: &[(usize, StoredSnapshot)],
        forced: bool,
    ) -> Option<(Refusal, usize)> {
        // Whether each is the restore that leaves its file as it ends.
        let mut seen = HashSet::new();
        let bad: Vec<(Refusal, bool)> = chosen
            .iter()
            .map(|(i, s)| (i, s, seen.insert((*i, s.meta.original_path.as_str()))))
            .filter(|(_, s, last)| (!forced || *last) && s.meta.kind == SnapshotKind::File)
            .filter_map(|(i, s, last)| {
                match Snapshotter::read_checked_backup(&self.roots[*i], &s.meta) {
                    Err(r) | Ok(Err(r)) => Some((r, last)),
                    Ok(Ok(_)) => None,
                }
            })
            .collect();
        // A backup another user took is whole, and one something else stands in place
        // of may only be moved aside: given back, they restore (their refusals say so);
        // only one damaged or gone calls for other means.
        let put_back = |r: &Refusal| {
            r.reason_code == ReasonCode::ReservedPath
                || r.reason.contains(crate::snapshot::NOT_ITS_BACKUP)
        };
        let damaged: Vec<&(Refusal, bool)> = bad.iter().filter(|(r, _)| !put_back(r)).collect();
        let code = damaged
            .first()
            .copied()
            .unwrap_or(bad.first()?)
            .0
            .reason_code;
        let reasons: Vec<&str> = bad.iter().map(|(r, _)| r.reason.as_str()).collect();
        let what_then = if damaged.is_empty() {
            "roll back again once the runtime's own backup is back in its place, its only link (the operator gives back one another user took; one moved aside is put back; a second link to it is removed)"
        } else if damaged.iter().any(|(_, last)| *last) {
            "a damaged or missing backup cannot give its file back, even with force (that file's earlier bytes must be restored by other means; the workflow's other files can be rolled back one action at a time)"
        } else {
            // Only newer writes' backups: an older write's restore gives the file back.
            "roll back with force: each such file is given back by its oldest write's restore (the damaged step is then recorded undone beneath it)"
        };
        let mismatched = bad
            .iter()
            .filter(|(r, _)| r.reason_code == ReasonCode::ChecksumMismatch)
            .count();
        Some((
            Refusal::new(
                code,
                format!("{}; nothing was restored: {what_then}", reasons.join("; ")),
            ),
            mismatched,
        ))
    }

    /// Rolls a workflow (or one of its actions) back, newest first, refusing with
    /// `conflict` when a file changed since the workflow wrote it, unless forced. A
    /// refusal is audited as a blocked rollback (SPEC §8: blocked actions are audited
    /// too), so that a snapshot found tampered with, or a conflict, is on the trail.
    pub fn rollback_workflow(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let report = self.rollback_unaudited(workflow_id, opts);
        if report.status == RollbackStatus::Refused {
            self.audit_refused_rollback(workflow_id, opts, &report);
        }
        report
    }

    fn audit_refused_rollback(
        &self,
        workflow_id: &str,
        opts: &RollbackOptions,
        report: &RollbackReport,
    ) {
        // An id that is not one names nothing the trail could hold.
        if report.reason_code == Some(ReasonCode::InvalidId) {
            return;
        }
        // The workflow's snapshot folder: in the root that holds it (the first root's
        // when none does), so that a workflow of another root is not named by the first's.
        let folder = self
            .workflow_folders(workflow_id)
            .into_iter()
            .next()
            .or_else(|| {
                self.root_paths
                    .first()
                    .map(|r| workflow_folder(r, workflow_id))
            })
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        let record = AuditRecord {
            timestamp: self.now(),
            execution_id: crate::plan::new_execution_id(),
            workflow_id: workflow_id.to_owned(),
            action_id: opts.action_id.clone().unwrap_or_default(),
            mutation_class: Some(MutationClass::Rollback),
            mutation_type: if opts.action_id.is_some() {
                "rollback_action"
            } else {
                "rollback_workflow"
            }
            .to_owned(),
            target_path: folder,
            before_checksum: None,
            after_checksum: None,
            rollback_available: false,
            rollback_path: None,
            status: AuditStatus::Blocked,
            reason_code: report.reason_code,
            error: report.reason.clone(),
        };
        if let Err(e) = self.audit.append(vec![record]) {
            tracing::error!(error = %e, "could not audit a refused rollback");
        }
    }

    /// The snapshots a rollback of the workflow (or of `opts.action_id`) would restore,
    /// each marked restored when its mark or the trail says so, or why the rollback is
    /// refused before restoring anything: judged from the audit trail, the prune record
    /// and the snapshots. The rollback and [`Sandbox::rollback_info`] share it, so that
    /// what `GET /agentic/rollback/{id}` says is what `POST` does.
    fn rollback_selection(
        &self,
        workflow_id: &str,
        snaps: RootedSnapshots,
        opts: &RollbackOptions,
    ) -> Result<Selection, RollbackRefusal> {
        // The audit trail lives in the state directory, out of reach of whoever can
        // write inside a root: it says which writes happened and which were undone, so a
        // snapshot folder or restore mark removed from `.rollback/` cannot turn into a
        // rollback that reports success with a file left as it was.
        let unread = |what: &str, e: std::io::Error| -> RollbackRefusal {
            let r = crate::error::log_refusal(&format!("read {what}"), &e);
            (r.reason_code, r.reason, Vec::new())
        };
        let trail = self
            .audit
            .by_workflow(workflow_id)
            .map_err(|e| unread("the audit trail", e))?;
        // A damaged record of prunes matters only where snapshots are missing: it may
        // be what removed them.
        let (pruned_marks, damaged_marks) = match self.state.prune_mark(workflow_id) {
            Ok(marks) => (marks.unwrap_or_default(), None),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => (Vec::new(), Some(e)),
            Err(e) => return Err(unread("the workflow's prune record", e)),
        };
        // How far in the trail prunes went through this process's root `i`, if any did.
        let pruned_up_to = |i: usize| {
            pruned_marks
                .iter()
                .filter(|(r, _)| self.roots[i].is_named_by(r))
                .map(|(_, seq)| *seq)
                .max()
        };
        let writes = TrailWrites::of(&trail, |e| self.root_of(&e.target_path), pruned_up_to);
        // Undone before a prune took their snapshots: rolled back, not lost.
        let undone_then_pruned = writes
            .pruned
            .iter()
            .any(|e| opts.takes(&e.action_id) && !writes.in_place(e, opts));
        let pruned: Vec<String> = writes
            .pruned
            .iter()
            .filter(|e| writes.in_place(e, opts))
            .map(|e| {
                format!(
                    "{} ({})",
                    shown_path(&e.action_id),
                    shown_path(&e.target_path)
                )
            })
            .collect();
        // Writes into a root this process is not configured with cannot be restored from
        // here: rolling back the rest and saying "rolled back" would leave them unsaid.
        let elsewhere: Vec<&SandboxAuditEntry> = writes
            .elsewhere
            .iter()
            .copied()
            .filter(|e| writes.in_place(e, opts))
            .collect();
        if !elsewhere.is_empty() {
            return Err(self.written_elsewhere(workflow_id, &elsewhere));
        }
        let missing = writes.missing(&snaps, opts);
        if pruned_but_present(&snaps, &trail, opts, pruned_up_to) {
            return Err(half_pruned(workflow_id));
        }
        if let (false, Some(e)) = (missing.is_empty(), damaged_marks) {
            return Err(unread("the workflow's prune record", e));
        }
        if !missing.is_empty() {
            return Err(snapshots_missing(workflow_id, &missing));
        }
        // One action undone under a later action of the workflow on the same file (or a
        // path beneath or above it) would leave that later action recorded as in place
        // while its change is gone, and its own rollback would then bring back this
        // one's bytes: the later ones go first, force or not.
        if let Some(a) = opts.action_id.as_deref() {
            let later = later_writers(&snaps, a, |s| {
                s.restored || writes.is_undone(&s.meta.action_id)
            });
            if !later.is_empty() {
                return Err(self.later_actions_refusal(workflow_id, a, &later));
            }
        }
        let snaps = snaps
            .into_iter()
            .map(|(i, mut s)| {
                // Undone according to the trail even if its mark was removed.
                s.restored |= writes.is_undone(&s.meta.action_id);
                (i, s)
            })
            .collect::<RootedSnapshots>();
        let beneath = writes.undone_beneath(&snaps);
        let chosen = snaps
            .into_iter()
            .filter(|(_, s)| opts.takes(&s.meta.action_id))
            .collect::<RootedSnapshots>();
        if let Some(refusal) = self.nothing_left(
            workflow_id,
            opts.action_id.as_deref(),
            &chosen,
            &pruned,
            undone_then_pruned,
        ) {
            return Err(refusal);
        }
        Ok(Selection {
            chosen,
            beneath,
            pruned,
        })
    }

    /// The refusal of a workflow's rollback whose writes `elsewhere` went into a root
    /// this process lacks.
    fn written_elsewhere(
        &self,
        workflow_id: &str,
        elsewhere: &[&SandboxAuditEntry],
    ) -> RollbackRefusal {
        let mut names: Vec<String> = elsewhere.iter().map(|e| shown_path(&e.action_id)).collect();
        names.sort_unstable();
        names.dedup();
        let target = elsewhere.first().map_or("", |e| e.target_path.as_str());
        let (root, advice) = self.absent_root(target, "rollback");
        (
            ReasonCode::OutsideSandbox,
            format!(
                "{} of workflow {} wrote into {root}, so the workflow cannot be rolled back as a whole (nothing is restored); {advice}, or roll back the other actions one at a time",
                named(&names),
                shown_path(workflow_id)
            ),
            Vec::new(),
        )
    }

    /// Why a rollback of `action` (or the whole workflow) finds nothing left to roll
    /// back in `chosen`, with the writes `pruned` and whether some were
    /// `undone_then_pruned`; `None` when something is left.
    fn nothing_left(
        &self,
        workflow_id: &str,
        action: Option<&str>,
        chosen: &RootedSnapshots,
        pruned: &[String],
        undone_then_pruned: bool,
    ) -> Option<RollbackRefusal> {
        let what = || match action {
            Some(a) => format!(
                "action {} of workflow {}",
                shown_path(a),
                shown_path(workflow_id)
            ),
            None => format!("workflow {}", shown_path(workflow_id)),
        };
        if chosen.is_empty() && pruned.is_empty() && undone_then_pruned {
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "{} was already rolled back, and its snapshots have since been pruned; nothing is left to roll back",
                    what()
                ),
                Vec::new(),
            ));
        }
        if chosen.is_empty() {
            // Say why, when the trail knows: a prune removed them by design.
            let why = if pruned.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} write(s) had their snapshots pruned and cannot be rolled back; those files stay as they are: {})",
                    pruned.len(),
                    named(pruned)
                )
            };
            let known = match self.ran_elsewhere(workflow_id, action) {
                elsewhere if elsewhere.is_empty() && pruned.is_empty() => {
                    self.never_written(workflow_id, action, &what())
                }
                elsewhere => elsewhere,
            };
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "there are no snapshots for {}{why}; nothing can be rolled back{known}",
                    what(),
                ),
                Vec::new(),
            ));
        }
        if chosen.iter().all(|(_, s)| s.restored) {
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "{} was already rolled back (by an earlier rollback, at once when its action failed, or by the recovery of an interrupted run); nothing is left to roll back",
                    what()
                ),
                Vec::new(),
            ));
        }
        None
    }

    /// The refusal of a rollback of action `a` of `workflow_id` under the `later`
    /// actions of the workflow that changed what it wrote (see [`later_writers`]).
    fn later_actions_refusal(
        &self,
        workflow_id: &str,
        a: &str,
        later: &[&(usize, StoredSnapshot)],
    ) -> RollbackRefusal {
        let names: Vec<String> = later
            .iter()
            .map(|(_, s)| {
                format!(
                    "{} ({} {})",
                    shown_path(&s.meta.action_id),
                    s.meta.intent,
                    shown_path(&s.meta.original_path)
                )
            })
            .collect();
        let conflicts = later
            .iter()
            .map(|(i, s)| {
                let rel = s.meta.target();
                Conflict {
                    action_id: s.meta.action_id.clone(),
                    path: self.abs_path(*i, &rel),
                    expected_checksum: self
                        .left_by(workflow_id, &s.meta)
                        .and_then(|l| l.state.checksum()),
                    current_checksum: self.target_state(*i, &rel).checksum(),
                    found_by_action: None,
                    changed_by: None,
                    claimed_by: Vec::new(),
                }
            })
            .collect();
        (
            ReasonCode::Conflict,
            format!(
                "later actions of workflow {} changed what action {} wrote: {}; roll those back first (newest first), or roll back the whole workflow",
                shown_path(workflow_id),
                shown_path(a),
                named(&names)
            ),
            conflicts,
        )
    }

    /// For an action the trail records no write of in `workflow_id`: the workflows
    /// whose trail records one, as words to add to the refusal (empty when none does).
    /// Asked of the writes only: a refused rollback of the action is on the trail too.
    fn ran_elsewhere(&self, workflow_id: &str, action_id: Option<&str>) -> String {
        let Some(a) = action_id.filter(|a| !self.audit.ran_action(workflow_id, a).unwrap_or(true))
        else {
            return String::new();
        };
        let found = self.audit.workflows_that_ran(a).unwrap_or_default();
        if found.is_empty() {
            return String::new();
        }
        // A few, and how many more: an id as common as `a1` may be every workflow's,
        // and which one was meant is the caller's to know.
        let shown = named_at_most(&found.iter().map(|w| shown_path(w)).collect::<Vec<_>>(), 3);
        let plural = if found.len() == 1 { "" } else { "s" };
        format!(
            "; the audit trail records a write of action {} not rolled back in workflow{plural} {shown}: name its workflow to roll it back",
            shown_path(a),
        )
    }

    /// For a workflow (or action) with no snapshot, nothing pruned and no write in
    /// another workflow: what the trail says of it, as words to add to the refusal:
    /// nothing at all (an id mistyped, or a workflow of another state directory), only
    /// simulated runs (writing off or dry-run on), or actions refused or failed; nothing
    /// when it records a write (its snapshots went otherwise).
    fn never_written(&self, workflow_id: &str, action_id: Option<&str>, what: &str) -> String {
        let Ok(lines) = self.audit.by_workflow(workflow_id) else {
            return String::new();
        };
        let its: Vec<AuditStatus> = lines
            .iter()
            .filter(|e| {
                e.mutation_class != Some(MutationClass::Rollback)
                    && action_id.is_none_or(|a| a == e.action_id)
            })
            .map(|e| e.status)
            .collect();
        if its.contains(&AuditStatus::Success) {
            String::new()
        } else if its.is_empty() {
            format!(
                "; the audit trail records nothing of {what}: check the ids (each write's result, and its line on the trail, name its workflow and action), unless a run of it stopped before its first write (a start's notice then says it recovered that run)"
            )
        } else if its.iter().all(|s| *s == AuditStatus::Simulated) {
            format!(
                "; the audit trail records {what} only as simulated (the write executor was off or dry-run on), so nothing was written: run the plan again with writing on and dry-run off"
            )
        } else {
            format!(
                "; the audit trail records no write of {what}: its actions were refused, failed or only simulated (its lines on the trail say which and why)"
            )
        }
    }

    fn rollback_unaudited(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let refused = |code: ReasonCode, reason: String, conflicts: Vec<Conflict>| {
            refused_rollback(workflow_id, code, reason, conflicts)
        };
        if let Err(r) = self.check_rollback_request(workflow_id, opts) {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        let wf_lock = match self.state.lock_workflow(workflow_id) {
            Ok(l) => l,
            Err(e) => {
                let r = workflow_lock_refusal(workflow_id, &e);
                return refused(r.reason_code, r.reason, Vec::new());
            }
        };
        // Before the snapshots are read: the dead run's recovery may restore some. After
        // the restores held back before it (its own among them) are recorded.
        if self.execution_context().0.writes()
            && let Err(r) = self.settle_before_change(workflow_id)
        {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        let snaps = match self.snapshots_to_roll_back(workflow_id) {
            Ok(snaps) => snaps,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let Selection {
            chosen,
            beneath,
            pruned,
        } = match self.rollback_selection(workflow_id, snaps, opts) {
            Ok(selected) => selected,
            Err((code, reason, conflicts)) => return refused(code, reason, conflicts),
        };
        let (chosen, beneath) = split_beneath(chosen, &beneath);
        // Every target's lock, from the conflict check to the last restore: a writer
        // landing in between would meet the rollback half done.
        let held = self.lock_targets_after_restores(
            workflow_id,
            chosen
                .iter()
                .map(|(i, s)| (*i, s.meta.target()))
                .chain(beneath.iter().map(|(i, s, _)| (*i, s.meta.target())))
                .collect(),
        );
        let _held = match held {
            Ok(h) => h,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let mut conflicts = match self.find_conflicts(workflow_id, &chosen, opts.force) {
            Ok(c) => c,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        // What force cannot overwrite is refused before anything is restored, with its
        // own code, forced or not: advising force would not help, and met at its restore
        // it left the workflow half rolled back. First, as the preview says it, a
        // rollback into roots too long together for its record (simulated or done).
        if let Some((r, mismatched)) = self.standing_refusal(&chosen, opts.force) {
            self.metrics.checksum_mismatches(mismatched);
            return refused(r.reason_code, r.reason, conflicts);
        }
        if !conflicts.is_empty() && !opts.force {
            return refused(ReasonCode::Conflict, conflicts_said(&conflicts), conflicts);
        }
        // A rollback writes files like any action: with writes off or dry-run on it only
        // says what it would restore.
        if let (ctx, Some(why)) = self.execution_context()
            && !ctx.writes()
        {
            return self.simulate_rollback(
                workflow_id,
                (&chosen, &beneath),
                &pruned,
                why,
                conflicts,
            );
        }
        let execution_id = crate::plan::new_execution_id();
        let roots = chosen
            .iter()
            .map(|(i, _)| *i)
            .chain(beneath.iter().map(|(i, _, _)| *i));
        let record = match self.mark_rolling_back(workflow_id, &execution_id, roots, opts.force) {
            Ok(record) => record,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let steps = self.restore_chosen(
            &execution_id,
            workflow_id,
            (chosen, beneath),
            opts.force,
            &mut conflicts,
        );
        let unrecorded = steps.iter().find_map(|s| s.unrecorded.clone());
        if unrecorded.is_none() {
            self.run_finished(record, None);
        } else {
            self.left_for_later(&execution_id);
        }
        // Else the record stays "rolling back": the next start, or the next run or
        // rollback of this workflow in any process, finds it and audits the restores
        // its marks record, as after a crash; this process's next change records them
        // first (`record_held_restores`). A writer waiting for one of the targets' locks
        // must then find the workflow's free: it is let go first.
        drop(wf_lock);
        rolled_back_report(workflow_id, steps, unrecorded, &pruned, conflicts)
    }

    /// The ids must be ones, and a restore must be possible to make durable and record,
    /// before the workflow's lock is even waited for.
    fn check_rollback_request(&self, workflow_id: &str, opts: &RollbackOptions) -> Verdict {
        crate::plan::check_id("workflow_id", workflow_id)?;
        if let Some(a) = &opts.action_id {
            crate::plan::check_id("action_id", a)?;
        }
        // A restore could not be made durable either, nor recorded.
        self.check_syncs()
    }

    /// The workflow's snapshots, refused whole when one is damaged (the refusal names
    /// the last found): a rollback never restores from a backup it cannot trust, and
    /// leaving some files out would leave the workflow half rolled back.
    fn snapshots_to_roll_back(&self, workflow_id: &str) -> Verdict<RootedSnapshots> {
        // Each snapshot found damaged counts, each time a rollback is asked for.
        let (snaps, untrusted) = self.workflow_snapshots_and_untrusted(workflow_id)?;
        match untrusted_refusal(workflow_id, &untrusted) {
            None => Ok(snaps),
            Some(r) => {
                let mismatched = untrusted
                    .iter()
                    .filter(|r| r.reason_code == ReasonCode::ChecksumMismatch)
                    .count();
                self.metrics.checksum_mismatches(mismatched);
                Err(r)
            }
        }
    }

    /// What a rollback with writes off or dry-run on says, audited like a simulated
    /// plan's actions (SPEC §8): the restores that would happen (`chosen`) and the steps
    /// that would be recorded undone beneath older restores (`beneath`, newest on their
    /// files: said first), and the flag to change for them to.
    fn simulate_rollback(
        &self,
        workflow_id: &str,
        (chosen, beneath): (&[(usize, StoredSnapshot)], &[Beneath]),
        pruned: &[String],
        why: DryRunReason,
        conflicts: Vec<Conflict>,
    ) -> RollbackReport {
        // Each with whether it is undone beneath (its file left as it is).
        let in_turn = || {
            let under = beneath.iter().rev().map(|(i, s, _)| (i, s, true));
            under.chain(chosen.iter().rev().map(|(i, s)| (i, s, false)))
        };
        let would: Vec<String> = in_turn()
            .map(|(_, s, _)| {
                format!(
                    "{} ({} {})",
                    s.meta.action_id,
                    s.meta.intent,
                    shown_path(&s.meta.original_path)
                )
            })
            .collect();
        let (flag, fix) = why.explained();
        let fix = format!("{fix} to roll back");
        // Simulated like a plan's actions, and audited like them (SPEC §8): one line
        // per restore that would happen.
        let execution_id = crate::plan::new_execution_id();
        let records: Vec<AuditRecord> = in_turn()
            .map(|(i, s, under)| {
                let current = self.target_checksum(*i, &s.meta.target());
                let after = if under {
                    current.clone()
                } else {
                    s.meta.sha256.clone()
                };
                let mut r =
                    self.rollback_record(&execution_id, workflow_id, *i, &s.meta, current, after);
                r.status = AuditStatus::Simulated;
                r.rollback_path = None;
                r
            })
            .collect();
        if let Err(e) = self.audit.append(records) {
            let r = crate::error::log_refusal("audit the simulated rollback", &e);
            return refused_rollback(workflow_id, r.reason_code, r.reason, Vec::new());
        }
        RollbackReport {
            workflow_id: workflow_id.to_owned(),
            status: RollbackStatus::Simulated,
            steps_rolled_back: 0,
            reason_code: None,
            reason: Some(format!(
                "{flag}, so nothing was restored; {} action(s) would be rolled back, newest first: {}{}; {fix}",
                would.len(),
                named(&would),
                // As the real rollback would say: not all of the workflow comes back.
                if pruned.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} earlier write(s) had their snapshots pruned and could not be: {})",
                        pruned.len(),
                        named(pruned)
                    )
                }
            )),
            conflicts,
            steps: Vec::new(),
        }
    }

    /// Writes the workflow's record saying the rollback `execution_id` (or a failed
    /// run's own) is under way, returning it for the rollback to finish.
    pub(crate) fn mark_rolling_back(
        &self,
        workflow_id: &str,
        execution_id: &str,
        roots: impl Iterator<Item = usize>,
        forced: bool,
    ) -> Verdict<crate::recovery::InflightRecord> {
        // The workflow's record says a rollback is under way, durably, before any target
        // changes: if the process dies between a restore and its record, the next start
        // finds the restored file and records it. Earlier runs of the workflow are made
        // durable first (batched), since the record no longer points recovery at them,
        // and the workflow's commit log is emptied, so no later recovery redoes an
        // action this rollback undoes.
        let record = crate::recovery::InflightRecord {
            state: crate::recovery::ROLLING_BACK.to_owned(),
            execution_id: execution_id.to_owned(),
            workflow_id: workflow_id.to_owned(),
            started_at: self.now(),
            finished: false,
            boot: crate::confine::state::boot_id().map(str::to_owned),
            recovered_by: Vec::new(),
            roots: self.root_names(roots),
            rollback_recovered_at: None,
            forced: Some(forced),
        };
        self.settle_commit_log(workflow_id)
            .and_then(|synced| if synced { Ok(()) } else { self.sync_point() })
            .and_then(|()| self.begin_record(&record, None))
            .and_then(|()| self.sync_point())?;
        Ok(record)
    }

    /// Records the steps undone `beneath` older restores, then restores the chosen
    /// snapshots, newest first, adding to `conflicts` the targets whose restore met a
    /// change the check before it could not see.
    fn restore_chosen(
        &self,
        execution_id: &str,
        workflow_id: &str,
        (chosen, beneath): (RootedSnapshots, Vec<Beneath>),
        force: bool,
        conflicts: &mut Vec<Conflict>,
    ) -> Vec<RollbackStep> {
        let (mut steps, hold) = self.record_beneath(execution_id, workflow_id, beneath);
        // A step refused as a conflict (a change made without the runtime's locks after
        // the check above) is named among the conflicts like those found before.
        let targets: HashMap<String, (usize, RelPath, Option<String>)> = chosen
            .iter()
            .map(|(i, s)| {
                let after = s.meta.after_sha256.clone();
                (s.meta.action_id.clone(), (*i, s.meta.target(), after))
            })
            .collect();
        let restored = self.restore_all(
            execution_id,
            workflow_id,
            chosen.into_iter().rev().collect(),
            crate::metrics::RollbackReason::Manual,
            if force {
                RestoreMode::Force
            } else {
                RestoreMode::Unchanged
            },
            hold,
        );
        // One rollback, counted once (by its restores when it made any).
        if steps.iter().any(|s| s.restored) && !restored.iter().any(|s| s.restored) {
            self.metrics
                .rollback(crate::metrics::RollbackReason::Manual);
        }
        steps.extend(restored);
        for s in steps
            .iter()
            .filter(|s| s.reason_code == Some(ReasonCode::Conflict))
        {
            if let Some((i, rel, after)) = targets.get(&s.action_id)
                && !conflicts.iter().any(|c| c.action_id == s.action_id)
            {
                conflicts.push(Conflict {
                    action_id: s.action_id.clone(),
                    path: s.path.clone(),
                    expected_checksum: after.clone(),
                    current_checksum: self.target_checksum(*i, rel),
                    found_by_action: None,
                    changed_by: None,
                    claimed_by: Vec::new(),
                });
            }
        }
        steps
    }

    /// Puts on the ledger the directories a restore of `meta`'s action (in root `root`)
    /// had to leave. Only a directory known by its birth time too is told apart from one
    /// made again later in the same inode (a filesystem without birth times reuses inodes
    /// at once): others are left for good, never removed by mistake.
    pub(crate) fn record_left_dirs(&self, root: usize, meta: &SnapshotMeta, left: &[LeftDir]) {
        let known: Vec<LeftDir> = left
            .iter()
            .filter(|d| d.id.born_ns.is_some())
            .cloned()
            .collect();
        if !known.is_empty()
            && let Err(e) = self.left_dirs.record(
                &self.root_names(std::iter::once(root)).concat(),
                &known,
                &crate::left_dirs::Maker::of(meta),
            )
        {
            tracing::warn!(error = %e, "could not record the directories a restore left");
        }
    }

    /// What recovery does with the directories a dead action made on its way, once its
    /// target stands as found or as another left it: removes those a restore would, and
    /// puts those it had to leave on the ledger. Returns those left.
    pub(crate) fn settle_created_dirs(&self, root: usize, meta: &SnapshotMeta) -> Vec<LeftDir> {
        let left = match meta.kind {
            crate::snapshot::SnapshotKind::Missing => {
                self.remove_created_dirs_of(root, meta).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        self.record_left_dirs(root, meta, &left);
        left
    }

    /// The directories a restore of `meta`'s action (which found its target missing)
    /// removes on the way, as [`RollbackEngine::remove_created_dirs`] does for it: those
    /// still there and not claimed by a create_directory that stands, if empty; returns
    /// those it had to leave.
    pub(crate) fn remove_created_dirs_of(
        &self,
        root: usize,
        meta: &SnapshotMeta,
    ) -> Verdict<Vec<LeftDir>> {
        let maker = crate::left_dirs::Maker::of(meta);
        RollbackEngine::remove_created_dirs(&self.roots[root], meta, self.fsync_each(), &|d| {
            self.claimed(root, d, &maker)
        })
    }

    /// Removes the directories restores had to leave (of any workflow, see
    /// [`crate::left_dirs`]) that are empty now, deepest first, and settles those
    /// removed or no longer the directory that was left; one that still holds something
    /// stays on the ledger. With `near`, only those on the way to, or beneath, these
    /// places (root index, components): what a rollback restored can empty no other, and
    /// a ledger that grows with every partial rollback is not walked whole each time.
    pub(super) fn remove_left_dirs(&self, near: Option<&[(usize, Vec<String>)]>) {
        let wanted = |i: usize, path: &str| {
            let Some(near) = near else { return true };
            let dir: Vec<&str> = path.split('/').collect();
            near.iter()
                .any(|(r, at)| *r == i && dir.iter().zip(at).all(|(d, a)| *d == a.as_str()))
        };
        for (i, root) in self.roots.iter().enumerate() {
            let name = self.root_names(std::iter::once(i)).concat();
            let left = match self.left_dirs.in_root(|r| r == name || root.is_named_by(r)) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the ledger of directories rollbacks left");
                    return;
                }
            };
            let mut settled: HashMap<String, Vec<crate::left_dirs::Left>> = HashMap::new();
            for (spelled, l) in left {
                let d = &l.dir;
                if !wanted(i, &d.path) {
                    continue;
                }
                let rel = RelPath::from_components(d.path.split('/').map(str::to_owned).collect());
                // One someone has made the result of a create_directory stays on the
                // ledger until that one is rolled back. (Asked of empty ones only.)
                let empty = root.is_empty_dir(&rel).is_ok_and(|empty| empty);
                if empty && self.claimed(i, &d.path, &l.made_by) {
                    continue;
                }
                let gone = root
                    .remove_empty_dir(&rel, Some(d.id), self.fsync_each())
                    .and_then(|removed| Ok(removed || root.dir_id(&rel)? != Some(d.id)));
                match gone {
                    Ok(true) => settled.entry(spelled).or_default().push(l),
                    Ok(false) => {}
                    Err(r) => {
                        tracing::warn!(path = %d.path, reason = %r, "could not remove a directory an earlier rollback left");
                    }
                }
            }
            for (spelled, done) in settled {
                if let Err(e) = self.left_dirs.settle(&spelled, &done) {
                    tracing::warn!(error = %e, "could not update the ledger of directories rollbacks left");
                }
            }
        }
    }

    /// Restores snapshots in the order given, recording each step (its "restored" mark
    /// and audit line) before the next one starts, so that a rollback that dies leaves
    /// its finished steps recorded. With per-file syncs each restore, then its record,
    /// is durable as it is written; with batched syncs a sync point separates a restore
    /// from its record (a mark must never reach the disk ahead of the bytes it vouches
    /// for), and the last record is made durable by a final one. The caller holds the
    /// lock of every target ([`Sandbox::lock_targets`]) from its judgement of them to the
    /// end, so that no writer lands between two steps.
    pub(crate) fn restore_all(
        &self,
        execution_id: &str,
        workflow_id: &str,
        snaps: Vec<(usize, StoredSnapshot)>,
        why: crate::metrics::RollbackReason,
        mode: RestoreMode,
        hold: Option<String>,
    ) -> Vec<RollbackStep> {
        // Recovery finishing a dead run's undo, which differs from a rollback below.
        let recovering = why == crate::metrics::RollbackReason::Recovery;
        let mut steps = Vec::new();
        let mut touched = Vec::new();
        // Why the trail refused a restore's line, once it did (or, given as `hold`, why
        // earlier restores wait to be recorded: these must not pass them).
        let mut held_back: Option<String> = hold;
        let force = matches!(mode, RestoreMode::Force);
        let mut targets = PassTargets::default();
        let pass = Pass {
            workflow_id,
            mode: &mode,
            recovering,
        };
        for (i, s) in snaps {
            let meta = s.meta;
            let before = self.found_before(&pass, i, &meta);
            let key = (i, meta.original_path.clone());
            let newer_failed = targets.newer_failed(&key, force);
            let mut step = match self.restore_one(&pass, i, &meta, &before, newer_failed.as_ref()) {
                Ok(o) => self.restored_step(i, &meta, execution_id, &before, o),
                Err((mut r, reached)) => {
                    if r.reason_code == ReasonCode::ChecksumMismatch {
                        self.metrics.checksum_mismatches(1);
                    }
                    // Made, then something after it failed (the root's sync, say): the
                    // line says so, for a rollback run again to take the target, as the
                    // undo leaves it, for its own doing rather than someone's change.
                    if reached
                        && self.target_state(i, &meta.target())
                            == super::conflicts::TargetState::found_by(&meta)
                    {
                        r.reason = format!(
                            "{}{}; roll back again to finish",
                            crate::snapshot::PUT_BACK_UNCONFIRMED,
                            r.reason
                        );
                    }
                    let spent = || {
                        matches!(
                            r.reason_code,
                            ReasonCode::ChecksumMismatch | ReasonCode::NoRollbackData
                        ) && self.backup_unusable(i, &meta)
                    };
                    targets.failed(&key, &meta, r.reason_code, spent, force, steps.len());
                    RollbackStep::failed(&meta, self.abs_path(i, &meta.target()), r)
                }
            };
            targets.restored(&key, &meta, &step);
            let record = self.restore_line(execution_id, workflow_id, i, &meta, before, &step);
            // Recovery stopped by the disk keeps its record and tries again at each start
            // until the undo goes through: a line per try would fill the trail with one
            // failure (the start says it; the undo that goes through is recorded).
            if recovering && !step.restored && step.reason_code == Some(ReasonCode::IoError) {
                steps.push(step);
                continue;
            }
            // A death between the mark and this line is recorded by the next start's
            // recovery (`record_marked_restores`). Once the trail refused a restore's
            // line, the later restores' lines are held back for it too, to be written
            // after that one in order: a shorter line that fitted where the refused one
            // did not would come first, and the trail's newest line of a file restored
            // twice would name the version the restores went past.
            if let (Some(words), true) = (&held_back, step.restored) {
                step.unrecorded = Some(words.clone());
                touched.push((i, meta.target().components().to_vec()));
                steps.push(step);
                continue;
            }
            if let Err(words) = self.append_restore_line(record) {
                if step.restored {
                    held_back = Some(words.clone());
                }
                step.unrecorded = Some(words);
            }
            if step.restored {
                touched.push((i, meta.target().components().to_vec()));
            }
            steps.push(step);
        }
        // Lines held back for an earlier one come from marks later; these wait for the
        // next rollback then (recovery leaves them as they are).
        if !recovering && held_back.is_none() {
            self.record_undone_beneath(execution_id, workflow_id, targets, &mut steps);
        }
        if let Err(r) = self.sync_point() {
            tracing::error!(reason = %r.reason, "could not sync the rollback's last record");
        }
        // Recorded before this process's next change (`record_held_restores`). Those of
        // a dead run's undo are left with its record, kept for the next start.
        let held = steps
            .iter()
            .filter(|s| s.restored && s.unrecorded.is_some())
            .count();
        if !recovering && held > 0 {
            self.held_restores().add(workflow_id, execution_id, held);
        }
        // One rollback, however many steps it restored (those count as mutations).
        if steps.iter().any(|s| s.restored) {
            self.remove_left_dirs(Some(&touched));
            self.metrics.rollback(why);
        }
        steps
    }

    /// Steps force passed over as spent (`spent_on`: their backup damaged or gone) whose
    /// target an older step of the pass then gave back (`restored_on`): their change is
    /// undone beneath them, and recorded so, as a restore is (the mark, then the line,
    /// from and to what the file holds now), lest their backup, put back later, restore
    /// their bytes over the older restores. A step whose mark cannot be written stays
    /// failed; one whose line cannot be written is held, as a restore's.
    fn record_undone_beneath(
        &self,
        execution_id: &str,
        workflow_id: &str,
        targets: PassTargets,
        steps: &mut [RollbackStep],
    ) {
        let PassTargets {
            spent_on,
            restored_on,
            ..
        } = targets;
        let mut held = None;
        for (key, spent) in spent_on {
            let Some((gave, validated)) = restored_on.get(&key) else {
                continue;
            };
            for (at, meta) in spent {
                // What the file holds now: a restore after the one that gave it back
                // may have failed having changed it. Left failed, for a rollback run
                // again to record, when it cannot be read or recorded now.
                let Ok((now, same)) = self.held_since(key.0, &meta, gave) else {
                    continue;
                };
                let ids = (execution_id, workflow_id);
                let Ok(unrecorded) = self.mark_undone_beneath(ids, key.0, &meta, &now, &mut held)
                else {
                    continue;
                };
                let step = &mut steps[at];
                step.detail = Some(format!(
                    "undone beneath it: {}; {}",
                    step.reason.take().unwrap_or_default(),
                    if same {
                        "the older actions' restores gave the file what the workflow found"
                    } else {
                        "the older actions' restores undid its change (the file changed after them: see their steps)"
                    }
                ));
                step.restored = true;
                step.checksum_validated = *validated && same;
                step.restored_checksum = now;
                step.reason_code = None;
                step.unrecorded = unrecorded;
            }
        }
    }

    /// Records the steps undone beneath restores an earlier rollback made
    /// ([`TrailWrites::undone_beneath`]), newest first, as [`Sandbox::record_undone_beneath`]
    /// does those of this pass. Returns their steps, and why the trail refused their
    /// lines, if it did: the restores after them wait for those.
    fn record_beneath(
        &self,
        execution_id: &str,
        workflow_id: &str,
        beneath: Vec<Beneath>,
    ) -> (Vec<RollbackStep>, Option<String>) {
        let mut held = None;
        let steps: Vec<RollbackStep> = beneath
            .into_iter()
            .rev()
            .map(|(i, s, gave)| {
                let path = self.abs_path(i, &s.meta.target());
                let meta = s.meta;
                let (now, same) = match self.held_since(i, &meta, &gave) {
                    Ok(judged) => judged,
                    Err(r) => return RollbackStep::failed(&meta, path, r),
                };
                let ids = (execution_id, workflow_id);
                let unrecorded = match self.mark_undone_beneath(ids, i, &meta, &now, &mut held) {
                    Ok(unrecorded) => unrecorded,
                    Err(r) => return RollbackStep::failed(&meta, path, r),
                };
                let detail = format!(
                    "undone beneath an older action's restore, made by an earlier rollback: its change went with that restore, so its backup was not restored over it{}",
                    if same {
                        ""
                    } else {
                        " (the file has changed since)"
                    }
                );
                RollbackStep {
                    action_id: meta.action_id.clone(),
                    intent: meta.intent.clone(),
                    path,
                    restored: true,
                    checksum_validated: same,
                    detail: Some(detail),
                    restored_checksum: now,
                    reason_code: None,
                    reason: None,
                    unrecorded,
                }
            })
            .collect();
        let waiting = steps
            .iter()
            .filter(|s| s.restored && s.unrecorded.is_some())
            .count();
        if waiting > 0 {
            self.held_restores().add(workflow_id, execution_id, waiting);
        }
        (steps, held)
    }

    /// What `meta`'s target in root `i` holds now, as a restore's line records it, and
    /// whether it is what an older restore gave it (`gave`: a folder where that restore
    /// left none is not); why not, when that cannot be told (the file could not be
    /// read): a line then would call it absent.
    fn held_since(
        &self,
        i: usize,
        meta: &SnapshotMeta,
        gave: &TargetState,
    ) -> Result<(Option<String>, bool), Refusal> {
        let state = self.target_state(i, &meta.target());
        let now = match &state {
            TargetState::File(sum) => Some(sum.clone()),
            TargetState::Missing | TargetState::Directory => None,
            TargetState::Failed(why) | TargetState::Unreachable(why) => {
                return Err(unjudged_beneath(meta, ReasonCode::IoError, why));
            }
            TargetState::Unreadable => {
                return Err(unjudged_beneath(
                    meta,
                    ReasonCode::Conflict,
                    "it is not a regular file this process can read: its kind or its permissions",
                ));
            }
        };
        Ok((now, state == *gave))
    }

    /// Records `meta`'s step (root `i`) undone beneath an older restore, its file
    /// holding `now`: its mark, then its line from and to `now`, as a restore is
    /// recorded (a mark that cannot be written is logged, and the line, which later
    /// rollbacks read first, written all the same). Returns why its line was not
    /// written, if it was not: the trail refused it, or an earlier line of the pass
    /// (`held`, set on the first refusal), which it must not pass. Refused when neither
    /// could be written: nothing would record it later, and the step stays failed for
    /// a rollback run again.
    fn mark_undone_beneath(
        &self,
        (execution_id, workflow_id): (&str, &str),
        i: usize,
        meta: &SnapshotMeta,
        now: &Option<String>,
        held: &mut Option<String>,
    ) -> Verdict<Option<String>> {
        let by = Restorer::Rollback { found: now };
        let unmarked = self
            .mark_restored(i, meta, execution_id, now, &[], by)
            .inspect_err(|r| {
                tracing::warn!(reason = %r, "a step undone beneath older restores is recorded on the audit trail next; only its snapshot's restored mark could not be written");
            })
            .err();
        let unrecorded = match held {
            Some(words) => Some(words.clone()),
            None => {
                let line = self.rollback_record(
                    execution_id,
                    workflow_id,
                    i,
                    meta,
                    now.clone(),
                    now.clone(),
                );
                *held = self.append_restore_line(line).err();
                held.clone()
            }
        };
        if let (Some(r), Some(words)) = (unmarked, &unrecorded) {
            return Err(Refusal::new(
                r.reason_code,
                format!(
                    "its change was undone beneath older restores, but neither its mark ({}) nor its audit line ({words}) could be written; roll back again to record it",
                    r.reason
                ),
            ));
        }
        self.metrics
            .mutation(&meta.intent, crate::executor::ActionStatus::RolledBack);
        Ok(unrecorded)
    }

    /// Appends a restore's trail line (after its mark), or says why the trail would not
    /// take it ([`line_refused`]).
    fn append_restore_line(&self, line: AuditRecord) -> Result<(), String> {
        self.fail_at("after_mark")
            .map_err(|r| std::io::Error::other(r.reason))
            .and_then(|()| self.audit.append(vec![line]))
            .map(drop)
            .map_err(|e| line_refused(&e))
    }

    /// Whether `meta`'s backup, read again now, is gone or not the bytes its record
    /// names: its step will never restore. A directory has none.
    pub(crate) fn backup_unusable(&self, i: usize, meta: &SnapshotMeta) -> bool {
        meta.kind == SnapshotKind::File
            && match Snapshotter::read_checked_backup(&self.roots[i], meta) {
                Ok(checked) => checked.is_err(),
                Err(r) => r.reason_code == ReasonCode::NoRollbackData,
            }
    }

    /// What `meta`'s target in root `i` holds, as its restore's line records it
    /// replaced. Recovery finishing a dead run's own undo: a target back to what the
    /// action found, whose last recorded change is that action's own write, was put back
    /// by the dead run, whose line never came: that restore replaced the write's result,
    /// not the bytes it left (a line from them to themselves would break the file's
    /// record), and [`Sandbox::restore_one`] restores it again rather than leaving it. A
    /// target never written since its last line (the run died before its write) keeps
    /// what it holds.
    fn found_before(&self, pass: &Pass<'_>, i: usize, meta: &SnapshotMeta) -> Option<String> {
        let before = self.target_checksum(i, &meta.target());
        if pass.recovering
            && meta.kind != SnapshotKind::Directory
            && before == meta.sha256
            && let Some(last) = self.last_recorded(i, &meta.target())
            && last.status == AuditStatus::Success
            && last.workflow_id == pass.workflow_id
            && last.action_id == meta.action_id
        {
            return last.after_checksum;
        }
        before
    }

    /// The step of a restore that went through, once its directories left are on the
    /// ledger and its snapshot is marked restored (as found holding `before`).
    fn restored_step(
        &self,
        i: usize,
        meta: &SnapshotMeta,
        execution_id: &str,
        before: &Option<String>,
        o: crate::snapshot::RestoreOutcome,
    ) -> RollbackStep {
        // The ledger before the mark: a death between them leaves a line about a step
        // that recovery then finishes, never a step done with its directories on no
        // ledger.
        self.record_left_dirs(i, meta, &o.left_dirs);
        if let Err(r) = self.mark_restored(
            i,
            meta,
            execution_id,
            &o.restored_checksum,
            &o.left_dirs,
            Restorer::Rollback { found: before },
        ) {
            // The restore itself stands: its audit line, which a later rollback reads
            // first, is written all the same.
            tracing::warn!(
                reason = %r,
                "the target was restored (its audit line is appended next); only the snapshot's restored mark could not be written"
            );
        }
        self.metrics
            .mutation(&meta.intent, crate::executor::ActionStatus::RolledBack);
        RollbackStep {
            action_id: meta.action_id.clone(),
            intent: meta.intent.clone(),
            path: self.abs_path(i, &meta.target()),
            restored: true,
            checksum_validated: o.checksum_validated,
            restored_checksum: o.restored_checksum,
            detail: o.detail,
            reason_code: None,
            reason: None,
            unrecorded: None,
        }
    }

    /// The audit record of `step`, a restore of `meta`'s target found holding `before`:
    /// a failed one's reason, or what a done one left that the trail keeps for good.
    fn restore_line(
        &self,
        execution_id: &str,
        workflow_id: &str,
        i: usize,
        meta: &SnapshotMeta,
        before: Option<String>,
        step: &RollbackStep,
    ) -> AuditRecord {
        let mut record = self.rollback_record(
            execution_id,
            workflow_id,
            i,
            meta,
            before,
            step.restored_checksum.clone(),
        );
        if !step.restored {
            record.status = AuditStatus::Failed;
            record.reason_code = step.reason_code;
            record.error = step.reason.clone();
        } else if let Some(d) = step
            .detail
            .as_ref()
            .filter(|d| d.starts_with(crate::snapshot::LEFT_IN_PLACE) || !step.checksum_validated)
        {
            // The undo left a folder, or could not check what it left.
            record.error = Some(d.clone());
        }
        record
    }

    /// One step of [`Sandbox::restore_all`]: `meta`'s target in root `i` judged by the
    /// pass's mode (and whether it is recovery finishing a dead run's undo), found
    /// holding `before` ([`Sandbox::found_before`]), then restored (or left as it is
    /// when it holds what the undo leaves), and covered by the sync the mode asks for.
    /// `newer_failed`: the newer action on the same target whose restore failed, and
    /// why. A failure says too whether the restore itself was set going (the target may
    /// have changed).
    fn restore_one(
        &self,
        pass: &Pass<'_>,
        i: usize,
        meta: &SnapshotMeta,
        before: &Option<String>,
        newer_failed: Option<&(String, ReasonCode)>,
    ) -> Result<crate::snapshot::RestoreOutcome, (Refusal, bool)> {
        let root = &self.roots[i];
        let durable = self.fsync_each();
        let (workflow_id, mode, recovering) = (pass.workflow_id, pass.mode, pass.recovering);
        let reached = std::cell::Cell::new(false);
        match mode {
            // Forced too (and in recovery): undone beneath the newer action, this one
            // would be recorded rolled back while that one's restore, once it goes
            // through, brought its bytes back.
            _ if let Some((newer, code)) = newer_failed => {
                Err(crate::reason::Refusal::new(
                    *code,
                    format!(
                        "{} was not restored to what it was before action {}: the restore of the newer action {} on it did not go through first (see that step); roll back again once that is put right",
                        shown_path(&meta.original_path),
                        shown_path(&meta.action_id),
                        shown_path(newer)
                    ),
                ))
            }
            RestoreMode::Unchanged => self.check_unchanged(workflow_id, i, meta),
            RestoreMode::OwnChange(left) => self.check_own_change(i, meta, left),
            // Recovery undoing a dead action that never reached its file: the file
            // holds what the action found, and nothing (the backup least of all, which
            // may be damaged) is needed to leave it so.
            // (One the dead run itself put back after its write comes with `before`
            // set to that write's result, and is finished by a restore as ever.) A
            // folder has no checksum, made or not: a `create_directory` is undone
            // by its restore, which removes what it finds.
            RestoreMode::Force
                if recovering
                    && meta.kind != SnapshotKind::Directory
                    && !meta.is_directory_action()
                    && *before == meta.sha256 =>
            {
                Ok((false, Put::Any))
            }
            RestoreMode::Force => Ok((true, Put::Any)),
            RestoreMode::Untouched => Ok((false, Put::Any)),
        }
        .and_then(|judged| self.fail_at("during_restore").map(|()| judged))
        .and_then(|(change, put)| {
            if change {
                reached.set(true);
                let maker = crate::left_dirs::Maker::of(meta);
                let keep = |d: &str| self.claimed(i, d, &maker);
                let forced = match mode {
                    RestoreMode::Force if recovering => Forced::Recovering,
                    RestoreMode::Force => Forced::Yes,
                    _ => Forced::No,
                };
                RollbackEngine::restore(root, meta, durable, put, forced, &keep, || {
                    self.fail_at("restore_verify")
                })
            } else {
                // The target is as the action found it (its write failed before
                // the target changed) or as someone else made it meanwhile, and stays
                // so, but directories made on the way may be there. What it holds is
                // what the record says the undo left.
                let left_dirs = match meta.kind {
                    SnapshotKind::Missing => self.remove_created_dirs_of(i, meta)?,
                    _ => Vec::new(),
                };
                let detail = match meta.kind {
                    SnapshotKind::Missing if before.is_none() => {
                        Some("absent, as before the action: it was not written".to_owned())
                    }
                    _ => None,
                };
                Ok(crate::snapshot::RestoreOutcome {
                    checksum_validated: true,
                    restored_checksum: before.clone(),
                    left_dirs,
                    detail,
                })
            }
        })
        .and_then(|o| self.cover_target(i, &meta.target()).map(|()| o))
        .and_then(|o| self.sync_point().map(|()| o))
        .and_then(|o| self.fail_at("after_restore").map(|()| o))
        .map_err(|r| (r, reached.get()))
    }

    /// Marks a snapshot restored, with the restore's checksum and the directories it
    /// had to leave, and who restored it ([`Restorer`]).
    pub(crate) fn mark_restored(
        &self,
        root: usize,
        meta: &SnapshotMeta,
        execution_id: &str,
        restored_checksum: &Option<String>,
        left_dirs: &[LeftDir],
        by: Restorer<'_>,
    ) -> Verdict {
        let mut record = serde_json::json!({
            "restored_at": self.now(),
            "execution_id": execution_id,
            "restored_checksum": restored_checksum,
        });
        self.fail_at("mark_restored")?;
        if !left_dirs.is_empty() {
            record["left_dirs"] = serde_json::json!(left_dirs);
        }
        match by {
            // What the restore replaced, for the audit line recovery writes should this
            // process die before its own: the trail then says what the file held.
            Restorer::Rollback { found } => {
                record["before_checksum"] = serde_json::json!(found);
            }
            Restorer::Recovery { found } => {
                record["recorded_by"] = serde_json::json!("recovery");
                if let Some(found) = found {
                    record["before_checksum"] = serde_json::json!(found);
                }
            }
        }
        Snapshotter::mark_restored(
            &self.roots[root],
            &self.seal,
            meta,
            &record,
            self.fsync_each(),
        )
    }

    /// The audit record of a snapshotted action's write, as its run makes it when done.
    pub(crate) fn done_record(&self, root: usize, meta: &SnapshotMeta) -> AuditRecord {
        AuditRecord {
            timestamp: self.now(),
            execution_id: meta.execution_id.clone(),
            workflow_id: meta.workflow_id.clone(),
            action_id: meta.action_id.clone(),
            mutation_class: Some(meta.mutation_class),
            mutation_type: meta.intent.clone(),
            target_path: self.abs_path(root, &meta.target()),
            before_checksum: meta.sha256.clone(),
            after_checksum: meta.after_sha256.clone(),
            rollback_available: true,
            rollback_path: Some(meta.rollback_path()),
            status: AuditStatus::Success,
            reason_code: None,
            error: None,
        }
    }

    /// The audit record of a restore: the target went from `before` to `restored`.
    pub(crate) fn rollback_record(
        &self,
        execution_id: &str,
        workflow_id: &str,
        root: usize,
        meta: &SnapshotMeta,
        before: Option<String>,
        restored: Option<String>,
    ) -> AuditRecord {
        AuditRecord {
            execution_id: execution_id.to_owned(),
            workflow_id: workflow_id.to_owned(),
            mutation_class: Some(MutationClass::Rollback),
            before_checksum: before,
            after_checksum: restored,
            rollback_available: false,
            status: AuditStatus::RolledBack,
            ..self.done_record(root, meta)
        }
    }
}

/// Who made a restore a mark records: a rollback, with what the target held before it
/// (`None`: nothing), or start-up recovery recording a restore a dead process made
/// (whose audit line it writes itself), with what it replaced when that is known.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Restorer<'a> {
    Rollback {
        found: &'a Option<String>,
    },
    /// `found`: what the restore replaced, when recovery knows it.
    Recovery {
        found: Option<&'a Option<String>>,
    },
}
/// Why a step undone beneath older restores is not recorded so now: what its file holds
/// could not be told (`why`); a rollback run again records it.
fn unjudged_beneath(meta: &SnapshotMeta, code: ReasonCode, why: &str) -> Refusal {
    Refusal::new(
        code,
        format!(
            "its change was undone beneath older restores, but what {} holds could not be read to record it so ({why}); roll back again to record it",
            shown_path(&meta.original_path)
        ),
    )
}

/// A restore's trail line the trail would not take: logged, and the words its step
/// keeps (a trail another process held past the wait named so).
fn line_refused(e: &std::io::Error) -> String {
    tracing::error!(error = %e, "could not append a rollback record to the audit log");
    if LockBusy::is_cause_of(e) {
        format!("{HELD_TRAIL} ({e})")
    } else {
        crate::error::state_io_words(e)
    }
}

/// A target of a rollback's pass: its root and its path in it.
type TargetKey = (usize, String);

/// What a pass of [`Sandbox::restore_all`] (newest step first) keeps of each target.
#[derive(Default)]
struct PassTargets {
    /// The newest failed restore that holds the older steps back: its action, its code,
    /// and whether it is spent (its backup damaged or gone when read again).
    failed_on: HashMap<TargetKey, (String, ReasonCode, bool)>,
    /// Spent steps a forced pass went past, with where they stand among its steps.
    spent_on: HashMap<TargetKey, Vec<(usize, SnapshotMeta)>>,
    /// What the last restore after one of those (an older step's) left, and whether it
    /// was checked.
    restored_on: HashMap<TargetKey, (TargetState, bool)>,
}

impl PassTargets {
    /// The newer failed step an older one of `key` waits for. A newer step whose
    /// snapshot will never restore holds back no forced restore: the older ones give
    /// the file what the workflow found. Any other failure (one of the moment, or a
    /// restore made but not confirmed) holds them back, forced or not: undone beneath
    /// it, an older action would be recorded rolled back while that step's restore,
    /// once it went through, brought its bytes back.
    fn newer_failed(&self, key: &TargetKey, force: bool) -> Option<(String, ReasonCode)> {
        self.failed_on
            .get(key)
            .filter(|(_, _, spent)| !(*spent && force))
            .map(|(action, code, _)| (action.clone(), *code))
    }

    /// A failed step of `key`, `at` its place among the pass's steps. The newest failure
    /// on the file holds the older steps back, unless spent; a failure of the moment
    /// after spent ones holds them back too: only a chain of spent steps lets force pass.
    fn failed(
        &mut self,
        key: &TargetKey,
        meta: &SnapshotMeta,
        code: ReasonCode,
        spent: impl FnOnce() -> bool,
        force: bool,
        at: usize,
    ) {
        if !self.failed_on.get(key).is_none_or(|(_, _, spent)| *spent) {
            return;
        }
        let spent = spent();
        if spent && force {
            self.spent_on
                .entry(key.clone())
                .or_default()
                .push((at, meta.clone()));
        }
        self.failed_on
            .insert(key.clone(), (meta.action_id.clone(), code, spent));
    }

    /// A step of `key` (`meta`'s) done: a restore after a spent step undoes it beneath,
    /// giving the file what its action found.
    fn restored(&mut self, key: &TargetKey, meta: &SnapshotMeta, step: &RollbackStep) {
        if step.restored && self.spent_on.contains_key(key) {
            self.restored_on.insert(
                key.clone(),
                (TargetState::found_by(meta), step.checksum_validated),
            );
        }
    }
}

/// A rollback refused before anything was restored.
fn refused_rollback(
    workflow_id: &str,
    code: ReasonCode,
    reason: String,
    conflicts: Vec<Conflict>,
) -> RollbackReport {
    RollbackReport {
        workflow_id: workflow_id.to_owned(),
        status: RollbackStatus::Refused,
        steps_rolled_back: 0,
        reason_code: Some(code),
        reason: Some(reason),
        conflicts,
        steps: Vec::new(),
    }
}

/// Why an unforced rollback is refused for `conflicts`, with what to do: the advice
/// depends on whose change each is, since force would throw some of them away.
fn conflicts_said(conflicts: &[Conflict]) -> String {
    let (claimed, changed): (Vec<&Conflict>, Vec<&Conflict>) =
        conflicts.iter().partition(|c| !c.claimed_by.is_empty());
    let mut why = Vec::new();
    if !changed.is_empty() {
        let files = ChangedFile::of(&changed);
        let entries: Vec<String> = files.iter().map(ChangedFile::said).collect();
        // Another workflow's write named is undone by its own rollback, which gives
        // this one back what it left; force would throw that write away. Another
        // workflow's rollback named has taken this workflow's write with it.
        let names = |rollback: bool| {
            files
                .iter()
                .any(|f| f.by.as_ref().is_some_and(|b| b.rollback == rollback))
        };
        let mut advice = String::new();
        // The change between two of its writes is named once the later of the
        // two is rolled back alone: the workflow's refusal then says whose it is.
        if files.iter().any(|f| !f.between.is_empty()) {
            advice.push_str("where a change came between two of the workflow's writes, roll back the later of them alone first (action_id), and this refusal then names that change when the trail records it; ");
        }
        if names(false) {
            advice.push_str("roll back the writes named first (an action at a time, newest first, where workflows wrote in turn), or ");
        }
        advice.push_str("roll back with force to overwrite them");
        if names(true) {
            advice.push_str(" (where a rollback is named, nothing of this workflow's write is left there: force would put back what this workflow found, which that rollback had undone)");
        }
        why.push(format!(
            "these files or directories changed after the workflow wrote them: {}; {advice} (a directory that holds what is not the workflow's is left in place even then)",
            named(&entries)
        ));
    }
    for c in claimed {
        why.push(format!(
            "the directory {}, or one the workflow made in it, is also the result of create_directory {}, which stands: roll that back first (once its workflow is pruned it never can be), or roll back with force to leave the directory in place",
            c.path,
            c.claimed_by.join(", ")
        ));
    }
    why.join("; ")
}

/// What a rollback that went ahead says: failed when a restore failed or could not be
/// recorded (a held trail being a busy peer, not a broken disk), and, done, whether
/// pruned snapshots kept part of the workflow from coming back.
fn rolled_back_report(
    workflow_id: &str,
    steps: Vec<RollbackStep>,
    unrecorded: Option<String>,
    pruned: &[String],
    conflicts: Vec<Conflict>,
) -> RollbackReport {
    let failed = steps.iter().find(|s| !s.restored);
    let n = steps.iter().filter(|s| s.restored).count() as u64;
    let (reason_code, reason) = match (failed, unrecorded) {
        (Some(s), _) => (s.reason_code, s.reason.clone()),
        // A busy peer, not a broken disk.
        (None, Some(e)) if e.starts_with(HELD_TRAIL) => (
            Some(ReasonCode::Conflict),
            Some(format!(
                "the files were restored, but {e}, so it could not record it; it is recorded before this process's next change, when this workflow is next used, or at the next start"
            )),
        ),
        (None, Some(e)) => (
            Some(ReasonCode::IoError),
            Some(format!(
                "the files were restored, but the audit trail could not record it: {e}; it is recorded before this process's next change, when this workflow is next used, or at the next start, once the state directory can be written"
            )),
        ),
        // Done, yet not everything the workflow wrote is back as it was: say so.
        (None, None) if !pruned.is_empty() => (None, Some(pruned_left(pruned))),
        (None, None) => (None, None),
    };
    RollbackReport {
        workflow_id: workflow_id.to_owned(),
        status: if reason_code.is_some() {
            RollbackStatus::Failed
        } else {
            RollbackStatus::RolledBack
        },
        steps_rolled_back: n,
        reason_code,
        reason,
        conflicts,
        steps,
    }
}

/// What a rollback leaves as it is of a workflow whose earlier writes were pruned.
fn pruned_left(pruned: &[String]) -> String {
    format!(
        "{} earlier write(s) had their snapshots pruned and cannot be rolled back; those files stay as they are: {}",
        pruned.len(),
        named(pruned)
    )
}

/// At most twenty of `items`, joined, then how many more there are: a refusal or report
/// about a workflow of thousands of writes does not name each in one sentence (the
/// audit trail keeps such sentences for good).
fn named(items: &[String]) -> String {
    named_at_most(items, 20)
}

/// At most `n` of `items`, joined, then how many more there are.
fn named_at_most(items: &[String], n: usize) -> String {
    let shown = items
        .iter()
        .take(n)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match items.len().saturating_sub(n) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// The refusal of a rollback of a workflow a prune left half done.
fn half_pruned(workflow_id: &str) -> RollbackRefusal {
    (
        ReasonCode::NoRollbackData,
        format!(
            "a prune of workflow {} stopped half way, so its snapshots may be gone or going; run prune again to finish it: the writes it covered can no longer be rolled back (later ones can)",
            shown_path(workflow_id)
        ),
        Vec::new(),
    )
}

/// The refusal of a workflow's rollback whose recorded writes have no snapshot
/// (`missing`: action and path, in words).
fn snapshots_missing(workflow_id: &str, missing: &[String]) -> RollbackRefusal {
    (
        ReasonCode::NoRollbackData,
        format!(
            "the snapshots of {} are missing from .rollback/{}/ in their root although the audit trail records their writes (removed, lost with unsynced data, or moved away for the moment: try again first): those files cannot be restored, so the workflow cannot be rolled back as a whole (nothing is restored); restore the folders, or roll back the other actions one at a time",
            named(missing),
            workflow_id
        ),
        Vec::new(),
    )
}
