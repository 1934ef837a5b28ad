//! [`Sandbox`]: the runtime a face holds. It opens the roots and the state directory once,
//! and offers every operation of SPEC §6–10 as a synchronous call.

use crate::artifact::{ArtifactEntry, ArtifactRegistry};
use crate::audit::{
    AuditLog, AuditRecord, AuditStats, AuditStatus, SandboxAuditEntry, VerifyReport,
};
use crate::catalog::{MutationClass, RiskLevel, op_for_intent};
use crate::clock::{Clock, SystemClock, timestamp};
use crate::commit_log::Position;
use crate::config::{Config, DEFAULT_STATE_DIR};
use crate::confine::path::{join_display, shown_path};
use crate::confine::root::DirEntryInfo;
use crate::confine::root::Put;
use crate::confine::state::StateDir;
use crate::confine::{
    EntryKind, RelPath, SandboxRoot, TargetKind, check_reserved, resolve_sandbox_path,
};
use crate::context::{DryRunReason, ExecutionContext, ExecutionMode};
use crate::error::Error;
use crate::hash::sha256_hex;
use crate::metrics::Metrics;
use crate::policy::{
    GovernanceContext, GovernanceRequest, assess_sandbox_risk, check_sandbox_governance,
    phase_supports_sandbox_write,
};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::snapshot::{
    LeftDir, MAX_SNAPSHOT_BYTES, RollbackEngine, SnapshotKind, SnapshotMeta, Snapshotter,
    StoredSnapshot,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The runtime.
#[derive(Debug)]
pub struct Sandbox {
    pub(crate) config: Config,
    pub(crate) roots: Vec<SandboxRoot>,
    pub(crate) root_paths: Vec<PathBuf>,
    skipped_roots: Vec<String>,
    pub(crate) state: StateDir,
    notices: Vec<String>,
    pub(crate) registry: ArtifactRegistry,
    pub(crate) audit: AuditLog,
    /// Directories restores had to leave, for a later restore to remove once empty.
    left_dirs: crate::left_dirs::LeftDirs,
    /// Seals the snapshot records kept inside the roots.
    pub(crate) seal: crate::seal::SealKey,
    pub(crate) metrics: Metrics,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) failpoints: Arc<crate::failpoint::FailPoints>,
    kernel_confinement: Option<crate::confine::kernel::KernelConfinement>,
    /// Batched durability on Linux: whole-filesystem syncs at the pipeline's durability
    /// points instead of a fsync per file and directory.
    batch_sync: Option<crate::confine::state::FsSync>,
    /// Run records to mark idle once a sync point has made their runs durable.
    idle_after_sync: std::sync::Mutex<Vec<crate::recovery::InflightRecord>>,
    /// Commit logs this sandbox appended to since the last sync point: workflow → the
    /// log's position after its last finished commit. A sync point empties those still
    /// there.
    logs_after_sync: std::sync::Mutex<std::collections::HashMap<String, Position>>,
    /// Entries appended to commit logs since the last sync point.
    logged_since_sync: std::sync::atomic::AtomicUsize,
    /// The target locks (see [`Sandbox::lock_target`]).
    target_locks: crate::confine::state::LockSet,
}

// The crate documentation promises it: embedders share one instance across threads.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Sandbox>();
};

/// Snapshots with the index of the root they are in.
pub(crate) type RootedSnapshots = Vec<(usize, StoredSnapshot)>;

/// Why a rollback is refused before it starts: the code, the sentence, the conflicts.
type RollbackRefusal = (ReasonCode, String, Vec<Conflict>);

/// `check`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckVerdict {
    /// Whether governance allows it.
    pub allowed: bool,
    /// Why not.
    pub reason_code: Option<ReasonCode>,
    /// Why not, for people.
    pub reason: Option<String>,
    /// Assessed risk.
    pub risk: RiskLevel,
    /// The operation, when the intent is one.
    pub operation: Option<&'static str>,
}

/// The `state` document (also `GET /agentic/state`).
#[derive(Debug, Clone, Serialize)]
pub struct StateDoc {
    /// `sandbox_write` when writes really happen, else `simulation`.
    pub execution_mode: ExecutionMode,
    /// Why runs are simulated, if they are.
    pub dry_run_reason: Option<DryRunReason>,
    /// The phase.
    pub phase: String,
    /// Whether the write flag is on.
    pub executor_enabled: bool,
    /// Whether dry-run is on.
    pub dry_run: bool,
    /// Usable roots.
    pub sandbox_roots: Vec<String>,
    /// Roots that could not be used, and why.
    pub skipped_roots: Vec<String>,
    /// The state directory.
    pub state_dir: String,
    /// `strict`, `batched` or `relaxed`.
    pub durability: crate::config::Durability,
    /// Limits in force.
    pub limits: crate::config::Limits,
    /// Artifacts registered.
    pub artifacts_total: u64,
    /// Audit entries.
    pub audit_entries: u64,
    /// Things the operator should know (fallbacks taken at start-up).
    pub notices: Vec<String>,
    /// Kernel confinement in force (Landlock), when the face applied it.
    pub kernel_confinement: Option<crate::confine::kernel::KernelConfinement>,
    /// Crate version.
    pub version: &'static str,
}

/// What a rollback did.
#[derive(Debug, Clone, Serialize)]
pub struct RollbackReport {
    /// The workflow.
    pub workflow_id: String,
    /// `rolled_back`, `simulated` (writing off or dry-run on: nothing was restored),
    /// `refused` or `failed`.
    pub status: &'static str,
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
        self.status == "rolled_back"
    }

    /// Whether it only said what it would restore (writes off or dry-run on).
    pub fn is_simulated(&self) -> bool {
        self.status == "simulated"
    }
}

/// A file changed since the action wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// The action.
    pub action_id: String,
    /// The file (absolute, inside a root).
    pub path: String,
    /// What the action left.
    pub expected_checksum: Option<String>,
    /// What is there now (`None`: missing).
    pub current_checksum: Option<String>,
    /// For a directory the action made: the `create_directory` actions
    /// (`workflow/action`) that found it since and stand, whose result it is now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claimed_by: Vec<String>,
}

/// What a target holds, compared with what an action left there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetState {
    File(String),
    Directory,
    Missing,
    Unreadable,
}

impl TargetState {
    pub(crate) fn checksum(&self) -> Option<String> {
        match self {
            Self::File(sum) => Some(sum.clone()),
            Self::Unreadable => Some("unreadable".to_owned()),
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
            Self::Unreadable => "something unreadable".to_owned(),
        }
    }
}

/// What an action left at its target, as the records say ([`Sandbox::left_by`]).
struct Left {
    state: TargetState,
    /// No artifact records the write: the action may have stopped before it, leaving
    /// what it found.
    maybe_unwritten: bool,
}

impl Left {
    /// Whether `now` is what the action left, for the snapshot `meta` it took.
    fn holds(&self, now: &TargetState, meta: &SnapshotMeta) -> bool {
        *now == self.state || (self.maybe_unwritten && *now == TargetState::found_by(meta))
    }
}

/// Stripes of the target locks (`locks/target-NN.lock`): enough that unrelated writes
/// seldom wait for each other, few enough that the lock files stay a handful.
const TARGET_LOCK_STRIPES: usize = 64;

/// How a rollback step's record says the audit trail was held by another process past
/// `limits.lock_wait_seconds`.
const HELD_TRAIL: &str = "another process held the audit trail";

/// Why a workflow's lock could not be taken: another run or rollback of it holds it too
/// long (`conflict`), or an I/O failure.
pub(crate) fn workflow_lock_refusal(workflow_id: &str, e: &std::io::Error) -> Refusal {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return Refusal::new(
            ReasonCode::Conflict,
            format!(
                "another run or rollback of workflow {} kept it busy ({e}: a long plan or rollback, or a stopped or hung process); nothing was done: try again later, or raise limits.lock_wait_seconds",
                shown_path(workflow_id)
            ),
        );
    }
    Refusal::new(
        ReasonCode::IoError,
        format!(
            "could not lock workflow {}: {}",
            shown_path(workflow_id),
            e.kind()
        ),
    )
}

fn lock_refusal(rel: &RelPath, e: &std::io::Error) -> crate::reason::Refusal {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return crate::reason::Refusal::new(
            ReasonCode::Conflict,
            format!(
                "another writer kept {} busy ({e}: a long write or rollback, heavy contention, or a stopped or hung process); nothing was done: try again later, or raise limits.lock_wait_seconds",
                shown_path(&rel.as_string())
            ),
        );
    }
    crate::reason::Refusal::new(
        ReasonCode::IoError,
        format!(
            "could not lock {}: {}",
            shown_path(&rel.as_string()),
            e.kind()
        ),
    )
}

/// Whether a target is to be restored, and what the restore may replace: what the
/// judgement saw (see [`Put`]).
type Judged = (bool, Put);

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
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct RollbackInfo {
    /// The workflow.
    pub workflow_id: String,
    /// Whether a rollback would have something to do, and would not be refused before
    /// it starts (conflicts aside: those a forced rollback overrides).
    pub rollback_available: bool,
    /// Why a rollback would be refused before it starts (the code `POST` answers with).
    pub reason_code: Option<ReasonCode>,
    /// The same, for a person.
    pub reason: Option<String>,
    /// Snapshots, newest first.
    pub actions: Vec<RollbackInfoAction>,
    /// Conflicts a rollback would meet now.
    pub conflicts: Vec<Conflict>,
}

/// One snapshot in [`RollbackInfo`].
#[derive(Debug, Clone, Serialize)]
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
    /// `file`, `directory`, `symlink`, `special` (a FIFO, socket or device) or `missing`.
    pub kind: &'static str,
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

/// What pruning removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// Workflows whose snapshots were removed (when `simulated`: would be).
    pub workflows_pruned: Vec<String>,
    /// Workflows kept (newer, or running).
    pub workflows_kept: u64,
    /// Workflows whose prune could not be done or finished (an I/O error): each is tried
    /// again by the next prune.
    pub workflows_failed: Vec<PruneFailure>,
    /// Writing is off or dry-run is on: nothing was removed.
    pub simulated: bool,
    /// Why, when `simulated`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run_reason: Option<DryRunReason>,
}

/// A workflow [`Sandbox::prune`] could not prune, and why.
#[derive(Debug, Clone, Serialize)]
pub struct PruneFailure {
    /// The workflow.
    pub workflow_id: String,
    /// Why, as a code.
    pub reason_code: ReasonCode,
    /// Why, for a person.
    pub reason: String,
}

/// The most `read_file` returns.
pub const READ_LIMIT: u64 = crate::catalog::LARGEST_WRITE_BYTES;

impl Sandbox {
    /// Opens the runtime with the system clock.
    pub fn open(config: Config) -> Result<Self, Error> {
        Self::open_with_clock(config, Arc::new(SystemClock))
    }

    /// Opens the runtime: validates the config, opens (creating) the roots, the state
    /// directory (falling back from an uncreatable default to the user's state
    /// directory), the registry and the audit log, and removes leftover temporary files.
    pub fn open_with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        config.validate()?;
        let mut notices = Vec::new();
        // Before any root is made: one that would lie inside the state directory would be
        // made there (and the state directory's own folders after it) only to be refused.
        for r in &config.roots {
            if let Some(inside) = lies_inside(r, &config.state_dir) {
                return Err(root_inside_state_dir(&inside, &config.state_dir));
            }
        }
        let mut roots = Vec::new();
        let mut skipped = Vec::new();
        for r in &config.roots {
            match SandboxRoot::open(r, true) {
                Ok(root) => roots.push(root),
                Err(why) => {
                    tracing::warn!(root = %r.display(), %why, "skipping sandbox root");
                    skipped.push(why);
                }
            }
        }
        if roots.is_empty() {
            return Err(Error::NoUsableRoot { problems: skipped });
        }
        if let Some((outer, inner)) = crate::confine::root::nested_roots(&roots) {
            return Err(Error::RootsOverlap {
                outer: roots[outer].path().to_path_buf(),
                inner: roots[inner].path().to_path_buf(),
            });
        }
        // Checked before the state directory is opened, since opening makes folders in
        // it: through a symlink into a root they would be made inside the sandbox.
        state_dir_outside(&config.state_dir, &roots)?;
        let (state, note) = open_state_dir(&config)?;
        let state = state.with_lock_wait(std::time::Duration::from_secs(
            config.limits.lock_wait_seconds,
        ));
        let target_locks = crate::confine::state::LockSet::new(
            &state,
            (0..TARGET_LOCK_STRIPES)
                .map(|i| format!("target-{i:02}"))
                .collect(),
            state.lock_wait(),
        );
        notices.extend(note);
        // A fallback state directory was not checked above.
        if state.path() != config.state_dir {
            state_dir_outside(state.path(), &roots)?;
        }
        let state_ids = state
            .dir_ids()
            .map_err(Error::io("look at the state directory"))?;
        let root_ids: Vec<((u64, u64), String)> = roots
            .iter()
            .map(|r| (r.id(), format!("the sandbox root {}", r.path().display())))
            .collect();
        for (i, root) in roots.iter_mut().enumerate() {
            if state_ids.contains(&root.id()) {
                return Err(Error::Config(crate::config::ConfigError(format!(
                    "root {} is the state directory {} (mounted there); the runtime's own files are never writable, so give a root apart from it",
                    root.path().display(),
                    state.path().display()
                ))));
            }
            let mut reserved: Vec<((u64, u64), String)> = state_ids
                .iter()
                .map(|id| (*id, "the runtime's state directory".to_owned()))
                .collect();
            reserved.extend(
                root_ids
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, r)| r.clone()),
            );
            root.reserve(reserved);
        }
        for root in &roots {
            if let Some(inside) = lies_inside(root.path(), state.path()) {
                return Err(root_inside_state_dir(&inside, state.path()));
            }
        }
        let batch_sync = if config.durability == crate::config::Durability::Batched
            && cfg!(target_os = "linux")
        {
            let mut dirs: Vec<&Path> = roots.iter().map(SandboxRoot::path).collect();
            dirs.push(state.path());
            Some(
                crate::confine::state::FsSync::open(&dirs)
                    .map_err(Error::io("open the filesystems for syncing"))?,
            )
        } else {
            None
        };
        // With batched syncs the logs are made durable by the executor's sync points.
        let durable = config.durability.is_strict() && batch_sync.is_none();
        let registry = ArtifactRegistry::open(&state, durable)
            .map_err(Error::io("open the artifact registry"))?;
        let mut audit = AuditLog::open_with(
            &state,
            durable,
            config.limits.writes_per_minute,
            batch_sync.is_some(),
        )
        .map_err(Error::io("open the audit log"))?;
        let left_dirs = crate::left_dirs::LeftDirs::open(&state, durable)
            .map_err(Error::io("open the ledger of directories rollbacks left"))?;
        let failpoints = Arc::new(crate::failpoint::FailPoints::default());
        audit.share_failpoints(failpoints.clone());
        let seal = crate::seal::SealKey::new(
            state
                .secret(crate::seal::KEY_FILE)
                .map_err(Error::io("read or create the snapshot seal key"))?,
        );
        let metrics = Metrics::new();
        metrics.set_artifacts(registry.len().unwrap_or(0));
        let root_paths = roots.iter().map(|r| r.path().to_path_buf()).collect();
        let mut sb = Self {
            config,
            roots,
            root_paths,
            skipped_roots: skipped,
            state,
            notices,
            registry,
            audit,
            left_dirs,
            seal,
            metrics,
            clock,
            failpoints,
            kernel_confinement: None,
            batch_sync,
            idle_after_sync: std::sync::Mutex::new(Vec::new()),
            logs_after_sync: std::sync::Mutex::new(std::collections::HashMap::new()),
            logged_since_sync: std::sync::atomic::AtomicUsize::new(0),
            target_locks,
        };
        let recovered = sb.recover();
        // A rollback that died after its restores, before it removed the directories
        // they emptied, is finished here.
        if recovered
            .iter()
            .any(|r| r.rollback && r.missing_roots.is_empty() && !r.retry)
        {
            sb.remove_left_dirs();
        }
        for r in recovered {
            if !r.missing_roots.is_empty() {
                sb.notices.push(format!(
                    "the interrupted {} {} of workflow {} wrote into {}, which this start is not configured with, so it was neither finished nor undone; it is recovered by a start that has {}",
                    r.what(),
                    r.execution_id,
                    r.workflow_id,
                    r.missing_roots.join(", "),
                    if r.missing_roots.len() == 1 { "that root" } else { "those roots" }
                ));
                continue;
            }
            if !r.unjudged.is_empty() {
                sb.notices.push(format!(
                    "the interrupted {} {} of workflow {} was neither finished nor undone: {}; it is recovered at the first start after that second hard link, symbolic link or special file is gone",
                    r.what(),
                    r.execution_id,
                    r.workflow_id,
                    r.unjudged.join("; ")
                ));
                continue;
            }
            if let Some(busy) = &r.busy {
                sb.notices.push(format!(
                    "the interrupted {} {} of workflow {} was neither finished nor undone: {busy}; it is recovered at the next start or the workflow's next run",
                    r.what(),
                    r.execution_id,
                    r.workflow_id
                ));
                continue;
            }
            if r.retry {
                sb.notices.push(format!(
                    "the snapshots of workflow {} could not be read (see the log), so its interrupted run {} was neither finished nor undone; it is recovered at the next start",
                    r.workflow_id, r.execution_id
                ));
                continue;
            }
            sb.notices.push(if r.rollback {
                format!(
                    "recovered interrupted rollback {} of workflow {}: {} restored files recorded",
                    r.execution_id, r.workflow_id, r.restores_recorded
                )
            } else {
                format!(
                    "recovered interrupted run {} of workflow {}: {} unfinished actions rolled back, {} finished, {} left undone under another run's later write, {} temporary files removed, {} restores recorded",
                    r.execution_id, r.workflow_id, r.rolled_back, r.completed, r.superseded, r.temp_files_removed, r.restores_recorded
                )
            });
            if r.untrusted > 0 {
                sb.notices.push(format!(
                    "recovery of {} (workflow {}) left {} snapshot folder(s) alone that could not be read or trusted (see the log); the actions they belong to were neither finished nor undone: inspect .rollback/{}/",
                    r.execution_id, r.workflow_id, r.untrusted, r.workflow_id
                ));
            }
        }
        if let Some(problem) = sb.audit.head_problem() {
            sb.notices.push(format!(
                "the audit trail was tampered with: {problem}; its head is kept as it is so `audit verify` keeps reporting it"
            ));
        }
        Ok(sb)
    }

    /// Applies kernel confinement (Landlock) to the calling thread and the threads it
    /// creates from now on: writes only beneath the roots and the state directory, no
    /// execution. Call it before starting any runtime or thread pool. The result is
    /// reported in [`Sandbox::state_doc`].
    pub fn confine_process(&mut self) -> &crate::confine::kernel::KernelConfinement {
        let mut writable = self.root_paths.clone();
        writable.push(self.state.path().to_path_buf());
        let report = crate::confine::kernel::restrict_to(&writable);
        if !report.is_enforced() {
            tracing::warn!(detail = ?report.detail, "kernel confinement (Landlock) is not in force; the root handles still confine every write");
        }
        self.kernel_confinement.insert(report)
    }

    /// Failure injection, for crash-consistency tests.
    pub fn failpoints(&self) -> &crate::failpoint::FailPoints {
        &self.failpoints
    }

    pub(crate) fn fail_at(&self, point: &str) -> Verdict {
        self.failpoints
            .check(point)
            .map_err(|e| crate::reason::Refusal::new(ReasonCode::IoError, e.to_string()))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics in the Prometheus text format, with the artifacts gauge read from the
    /// registry at this moment: other processes register artifacts too.
    pub fn metrics_text(&self) -> String {
        if let Ok(n) = self.registry.len() {
            self.metrics.set_artifacts(n);
        }
        self.metrics.encode()
    }

    /// The artifact registry.
    pub fn registry(&self) -> &ArtifactRegistry {
        &self.registry
    }

    /// The audit log.
    pub fn audit_log(&self) -> &AuditLog {
        &self.audit
    }

    /// Usable roots.
    pub fn roots(&self) -> &[SandboxRoot] {
        &self.roots
    }

    /// The state directory in use.
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// Start-up notices (fallbacks taken, leftovers removed).
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    pub(crate) fn now(&self) -> String {
        timestamp(self.clock.now())
    }

    /// Whether each write syncs its own file and directory (strict durability without
    /// batched syncs). Paths that are not on the hot path (rollback, recovery) use
    /// [`Sandbox::durable`] instead.
    pub(crate) fn fsync_each(&self) -> bool {
        self.config.durability.is_strict() && self.batch_sync.is_none()
    }

    /// With batched durability, how many whole-filesystem syncs this sandbox has made so
    /// far (concurrent actions share them); `None` otherwise.
    pub fn batched_syncs(&self) -> Option<u64> {
        self.batch_sync.as_ref().map(|s| s.syncs_made())
    }

    /// Why this process writes nothing more, once a sync of its logs or of its
    /// filesystems failed: the kernel may have dropped what it could not write, so no
    /// later write could be promised durable.
    pub fn sync_failure(&self) -> Option<std::io::Error> {
        self.registry
            .sync_failure()
            .or_else(|| self.audit.sync_failure())
            .or_else(|| self.batch_sync.as_ref().and_then(|s| s.failed()))
    }

    /// [`Sandbox::sync_failure`] as the refusal of a write or a restore.
    pub(crate) fn check_syncs(&self) -> Verdict {
        match self.sync_failure() {
            Some(e) => Err(crate::reason::Refusal::new(
                ReasonCode::IoError,
                e.to_string(),
            )),
            None => Ok(()),
        }
    }

    /// Whether file writes are staged and committed with one durability point (batched
    /// syncs).
    pub(crate) fn stages_writes(&self) -> bool {
        self.batch_sync.is_some()
    }

    /// Makes the next sync points cover the filesystem of `dir`, a directory the
    /// pipeline just wrote into (a no-op unless syncs are batched).
    pub(crate) fn cover_for_sync(&self, dir: &cap_std::fs::Dir) -> Verdict {
        match &self.batch_sync {
            Some(s) => s.cover(dir).map_err(|e| {
                crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not open the target's filesystem for syncing: {}",
                        e.kind()
                    ),
                )
            }),
            None => Ok(()),
        }
    }

    /// [`Sandbox::cover_for_sync`] for the nearest existing directory above `rel` (a
    /// restore may have removed the directories an action created).
    pub(crate) fn cover_target(&self, root: usize, rel: &RelPath) -> Verdict {
        if !self.stages_writes() {
            return Ok(());
        }
        let mut comps = rel.components().to_vec();
        while !comps.is_empty() {
            if let Ok((dir, _)) =
                self.roots[root].open_parent(&RelPath::from_components(comps.clone()), false, false)
            {
                return self.cover_for_sync(&dir);
            }
            comps.pop();
        }
        Ok(())
    }

    /// One of the pipeline's durability points: everything written so far reaches
    /// stable storage (a no-op unless syncs are batched).
    pub(crate) fn sync_point(&self) -> Verdict {
        let Some(s) = &self.batch_sync else {
            return Ok(());
        };
        // What waits for this sync is taken first: whatever is queued later may name
        // writes this sync does not cover.
        let idle = std::mem::take(&mut *lock_or_recover(&self.idle_after_sync));
        let head = self.audit.pending_head();
        let logs = std::mem::take(&mut *lock_or_recover(&self.logs_after_sync));
        self.logged_since_sync
            .store(0, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.failpoints.check("batch_sync").and_then(|()| s.sync()) {
            // Back for the next sync point; what registered meanwhile is newer.
            let mut pending = lock_or_recover(&self.logs_after_sync);
            for (wf, at) in logs {
                pending.entry(wf).or_insert(at);
            }
            drop(pending);
            // The kernel may have dropped what it could not write: these runs are no
            // longer finished for a start in this boot, which checks them against the
            // disk and replays their logs.
            for rec in idle {
                self.mark_after_sync(rec, false);
            }
            return Err(crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!("could not sync to stable storage: {}", e.kind()),
            ));
        }
        self.empty_commit_logs(logs);
        if let Err(e) = self.audit.publish_head(head) {
            tracing::warn!(error = %e, "could not move the audit head");
        }
        for rec in idle {
            self.mark_after_sync(rec, true);
        }
        Ok(())
    }

    /// Empties the commit logs whose entries the sync point just made durable elsewhere:
    /// those whose workflow is not running (its lock is free) and that are where their
    /// last finished commit left them. The others stay for a later sync point.
    fn empty_commit_logs(&self, logs: std::collections::HashMap<String, Position>) {
        for (wf, at) in logs {
            let done = match self.state.try_lock(&format!("wf-{wf}")) {
                Ok(Some(_lock)) => match self.state.commit_log_file(&wf) {
                    Ok(Some(f)) => match crate::commit_log::position(&f) {
                        Ok(Some(now)) if now == at => crate::commit_log::clear(&f).is_ok(),
                        // Emptied since by another holder of the lock, or unreadable.
                        Ok(Some(now)) => now.generation != at.generation,
                        Ok(None) => true,
                        Err(_) => false,
                    },
                    Ok(None) => true,
                    Err(_) => false,
                },
                _ => false,
            };
            if !done {
                lock_or_recover(&self.logs_after_sync)
                    .entry(wf)
                    .or_insert(at);
            }
        }
    }

    /// Whether a file write of `logged` bytes (backup and new bytes) may commit through
    /// its workflow's commit log rather than a whole-filesystem sync.
    pub(crate) fn logs_commit(&self, logged: usize) -> bool {
        self.batch_sync.is_some() && logged <= crate::commit_log::MAX_LOGGED_BYTES
    }

    /// The commit point of a write whose snapshot (and staged bytes) are written. With
    /// `entry` (a small staged write under `batched`) it is one append to the workflow's
    /// commit log, synced, and the log's position is returned for
    /// [`Sandbox::commit_finished`]; otherwise, and for a workflow's first commit, a sync
    /// point, which also makes the new log durable. Call with the workflow's lock held.
    pub(crate) fn commit_point(&self, entry: Option<LogEntry<'_>>) -> Verdict<Option<Position>> {
        let io = |e: std::io::Error| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!("could not write the commit log: {}", e.kind()),
            )
        };
        let Some(e) = entry else {
            return self.sync_point().map(|()| None);
        };
        let wf = &e.meta.workflow_id;
        let Some(log) = self.state.commit_log_file(wf).map_err(io)? else {
            let created = match self.state.commit_log_create(wf) {
                Ok(_) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "could not create a commit log; this write syncs instead");
                    false
                }
            };
            let synced = self.sync_point();
            if synced.is_err() && created {
                // Its directory entry may not be durable: no entry may go into it.
                let _ = self.state.commit_log_remove(wf);
            }
            return synced.map(|()| None);
        };
        let at =
            crate::commit_log::append(&log, e.record, e.meta, e.backup, e.bytes).map_err(io)?;
        self.logged_since_sync
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(at))
    }

    /// A logged commit's writes are all made (in memory): the next sync point to begin
    /// makes them durable and may then empty the log if it is still `at`. Registering
    /// only now keeps a sync that began before these writes from emptying the log.
    pub(crate) fn commit_finished(&self, workflow_id: &str, at: Position) {
        lock_or_recover(&self.logs_after_sync).insert(workflow_id.to_owned(), at);
    }

    /// Makes a sync point once enough commits wait in logs, so that logs stay short and
    /// recovery quick. Called between runs, when no workflow lock of this caller is held.
    pub(crate) fn sync_if_logs_are_long(&self) {
        if self
            .logged_since_sync
            .load(std::sync::atomic::Ordering::Relaxed)
            >= LOGGED_PER_SYNC
            && let Err(r) = self.sync_point()
        {
            tracing::warn!(reason = %r.reason, "could not make a sync point");
        }
    }

    /// Before a workflow's snapshots change hands (rollback, prune): what its commit log
    /// holds is made durable in place and the log emptied, so that no later recovery
    /// replays an entry whose action has since been undone. Says whether that took a sync
    /// point (the log held entries). Call with the workflow's lock held.
    pub(crate) fn settle_commit_log(&self, workflow_id: &str) -> Verdict<bool> {
        let io = |e: std::io::Error| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!("could not empty the commit log: {}", e.kind()),
            )
        };
        let Some((f, at)) = self.log_with_entries(workflow_id).map_err(io)? else {
            return Ok(false);
        };
        if self.check_log_entries(workflow_id, &f, &at)? {
            // Another process logged them and may have written beneath a mount inside a
            // root, which this process's syncs do not cover.
            rustix::fs::sync();
        }
        self.sync_logged_writes()?;
        crate::commit_log::clear(&f).map_err(io)?;
        lock_or_recover(&self.logs_after_sync).remove(workflow_id);
        Ok(true)
    }

    /// Refuses (`io_error`) while a workflow's commit log holds entries for a root this
    /// sandbox is not configured with (see [`Self::check_log_entries`]).
    pub(crate) fn refuse_foreign_log_entries(&self, workflow_id: &str) -> Verdict {
        let entries = self.log_with_entries(workflow_id).map_err(|e| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!("could not read the commit log: {}", e.kind()),
            )
        })?;
        match entries {
            Some((f, at)) => self.check_log_entries(workflow_id, &f, &at).map(drop),
            None => Ok(()),
        }
    }

    /// Refuses (`io_error`) a commit log `f`, whose entries end `at`, that holds entries
    /// for a root this sandbox is not configured with: acknowledged writes another
    /// process made, which this one can neither sync nor replay, and which emptying the
    /// log would lose. Entries this process logged itself since its last sync point are
    /// not read again. Returns whether the log holds entries another process logged.
    fn check_log_entries(
        &self,
        workflow_id: &str,
        f: &crate::confine::state::CommitLogFile,
        at: &Position,
    ) -> Verdict<bool> {
        if lock_or_recover(&self.logs_after_sync).get(workflow_id) == Some(at) {
            return Ok(false);
        }
        let foreign = crate::commit_log::read(f)
            .map_err(|e| {
                crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!("could not read the commit log: {}", e.kind()),
                )
            })?
            .into_iter()
            .map(|e| e.meta.root)
            .find(|root| !self.roots.iter().any(|r| r.is_named_by(root)));
        match foreign {
            Some(root) => Err(crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "workflow {workflow_id}'s commit log holds acknowledged writes into {root}, which this process is not configured with; run any command with that root configured to replay them, then retry"
                ),
            )),
            None => Ok(true),
        }
    }

    /// A workflow's commit log and where its entries end, when it holds any.
    fn log_with_entries(
        &self,
        workflow_id: &str,
    ) -> std::io::Result<Option<(crate::confine::state::CommitLogFile, Position)>> {
        let Some(f) = self.state.commit_log_file(workflow_id)? else {
            return Ok(None);
        };
        Ok(crate::commit_log::position(&f)?
            .filter(|p| !p.is_empty())
            .map(|at| (f, at)))
    }

    /// Whether a workflow's commit log holds entries.
    pub(crate) fn commit_log_holds_entries(&self, workflow_id: &str) -> std::io::Result<bool> {
        Ok(self.log_with_entries(workflow_id)?.is_some())
    }

    /// Makes durable whatever a commit log's writes left in memory: a sync point, or one
    /// whole-system sync when this sandbox does not batch its syncs (the logs were
    /// written by another process, or before the durability changed).
    pub(crate) fn sync_logged_writes(&self) -> Verdict {
        if self.batch_sync.is_some() {
            return self.sync_point();
        }
        rustix::fs::sync();
        Ok(())
    }

    /// Marks a finished run's record idle. With batched syncs the last writes of a run
    /// may still be in memory when it returns, and an idle record makes recovery skip the
    /// run, so the mark waits for the next sync point (or the sandbox's drop).
    /// `file`: the record's file, when the run holds it open.
    pub(crate) fn run_finished(
        &self,
        rec: crate::recovery::InflightRecord,
        file: Option<&crate::confine::state::BlockFile>,
    ) {
        if self.sync_failure().is_some() {
            // Left active: the next start's recovery checks this run's actions against
            // what reached the disk.
            tracing::warn!(workflow = %rec.workflow_id, "a sync failed during this run; its record stays active for recovery");
            return;
        }
        let (mark, what) = if self.batch_sync.is_some() {
            // Marked finished at once (not synced): a later run of the workflow in any
            // process then knows this one did not die half way.
            let finished = rec.finished();
            lock_or_recover(&self.idle_after_sync).push(rec);
            (finished, "finished")
        } else {
            // Not synced: after a crash an `active` record of a finished run only makes
            // the next start look for unfinished actions, and find none.
            (rec.idle(), "idle")
        };
        if let Err(e) = self.write_record_to(&mark, false, file) {
            tracing::warn!(error = %e, "could not mark a workflow's run {what}");
        }
    }

    /// After a sync point, marks a finished run's record idle (`synced`: its writes are
    /// durable) or under way again (the sync failed), unless a newer run of the workflow
    /// has taken over the record (its lock is held, or the record names another
    /// execution): that run owns the record now.
    fn mark_after_sync(&self, rec: crate::recovery::InflightRecord, synced: bool) {
        let Ok(Some(_lock)) = self.state.try_lock(&format!("wf-{}", rec.workflow_id)) else {
            return;
        };
        let current = self
            .state
            .inflight_read(&rec.workflow_id)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<crate::recovery::InflightRecord>(&b).ok());
        if current.is_none_or(|c| c.execution_id != rec.execution_id) {
            return;
        }
        if synced {
            self.write_idle(&rec);
        } else if let Err(e) = self.write_record(&rec, false) {
            tracing::warn!(error = %e, "could not mark a run unfinished after a failed sync");
        }
    }

    fn write_idle(&self, rec: &crate::recovery::InflightRecord) {
        self.write_idle_record(rec, false);
    }

    /// Writes `rec` with state `idle`.
    pub(crate) fn write_idle_record(&self, rec: &crate::recovery::InflightRecord, durable: bool) {
        if let Err(e) = self.write_record(&rec.idle(), durable) {
            tracing::warn!(error = %e, "could not mark a workflow's record idle");
        }
    }

    /// The configured roots at `indexes`, each once, as a run record names them.
    pub(crate) fn root_names(&self, indexes: impl Iterator<Item = usize>) -> Vec<String> {
        let mut names: Vec<String> = indexes
            .filter_map(|i| self.root_paths.get(i))
            .map(|p| p.display().to_string())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Writes a workflow's in-flight record (in place; synced when `durable`).
    pub(crate) fn write_record(
        &self,
        rec: &crate::recovery::InflightRecord,
        durable: bool,
    ) -> std::io::Result<()> {
        self.write_record_to(rec, durable, None)
    }

    /// [`Sandbox::write_record`] through `file` when the caller holds the record open.
    fn write_record_to(
        &self,
        rec: &crate::recovery::InflightRecord,
        durable: bool,
        file: Option<&crate::confine::state::BlockFile>,
    ) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        match file {
            Some(f) => {
                f.write(&bytes)?;
                if durable {
                    f.sync_data()?;
                }
                Ok(())
            }
            None => self.state.inflight_write(&rec.workflow_id, &bytes, durable),
        }
    }

    /// Records that `rec`'s run or rollback is under way, before it changes any file
    /// (synced under `strict`; under `batched` the next sync point covers it). `file`:
    /// the record's file, when the caller holds it open.
    pub(crate) fn begin_record(
        &self,
        rec: &crate::recovery::InflightRecord,
        file: Option<&crate::confine::state::BlockFile>,
    ) -> Verdict {
        self.write_record_to(rec, self.fsync_each(), file)
            .map_err(|e| {
                crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not record the {} in the state directory: {}",
                        if rec.state == crate::recovery::ROLLING_BACK {
                            "rollback"
                        } else {
                            "run"
                        },
                        e.kind()
                    ),
                )
            })
    }

    pub(crate) fn durable(&self) -> bool {
        self.config.durability.is_strict()
    }

    /// The execution context and, when simulating, why.
    pub fn execution_context(&self) -> (ExecutionContext, Option<DryRunReason>) {
        ExecutionContext::from_flags(
            self.config.enable_write,
            self.config.dry_run,
            phase_supports_sandbox_write(&self.config.phase),
        )
    }

    pub(crate) fn governance_context(&self) -> GovernanceContext<'_> {
        GovernanceContext {
            root_paths: &self.root_paths,
            roots: Some(&self.roots),
            state_dir: Some(self.state.path()),
            extensions: &self.config.extensions,
            max_depth: self.config.limits.max_path_depth,
        }
    }

    /// The `state` document.
    pub fn state_doc(&self) -> StateDoc {
        let (ctx, reason) = self.execution_context();
        StateDoc {
            execution_mode: ctx.mode,
            dry_run_reason: reason,
            phase: self.config.phase.clone(),
            executor_enabled: self.config.enable_write,
            dry_run: self.config.dry_run,
            sandbox_roots: self
                .root_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            skipped_roots: self.skipped_roots.clone(),
            state_dir: self.state.path().display().to_string(),
            durability: self.config.durability,
            limits: self.config.limits,
            artifacts_total: self.registry.len().unwrap_or(0),
            audit_entries: self.audit.stats().map(|s| s.total).unwrap_or(0),
            notices: self.notices.clone(),
            kernel_confinement: self.kernel_confinement.clone(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// Governance verdict only (`check`): no write, no audit.
    pub fn check(
        &self,
        intent: &str,
        path: &str,
        description: Option<&str>,
        size: u64,
        root: Option<&str>,
    ) -> CheckVerdict {
        let req = GovernanceRequest {
            intent,
            path,
            phase: &self.config.phase,
            root,
            description,
            tool: None,
        };
        let operation = op_for_intent(intent).map(|o| o.name);
        // As a plan would find it: a root whose snapshot store is unusable writes nothing.
        let checked =
            check_sandbox_governance(&req, &self.governance_context(), size).and_then(|a| {
                crate::snapshot::check_store(&self.roots[a.resolved.root_index], None)?;
                Ok(a)
            });
        match checked {
            Ok(a) => CheckVerdict {
                allowed: true,
                reason_code: None,
                reason: None,
                risk: a.risk,
                operation,
            },
            Err(r) => {
                self.metrics.denied(intent, r.reason_code);
                CheckVerdict {
                    allowed: false,
                    reason_code: Some(r.reason_code),
                    reason: Some(r.reason),
                    risk: assess_sandbox_risk(intent, path),
                    operation,
                }
            }
        }
    }

    fn resolve_read(&self, path: &str, root: Option<&str>) -> Verdict<(usize, RelPath)> {
        let r = resolve_sandbox_path(
            path,
            &self.root_paths,
            root,
            self.config.limits.max_path_depth,
        )
        .inspect_err(|r| self.metrics.denied("read_file", r.reason_code))?;
        check_reserved(&r.rel)?;
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

    /// Lists a directory inside a root (`""` or `/` for the first root's top).
    pub fn list_directory(&self, path: &str, root: Option<&str>) -> Verdict<Vec<DirEntryInfo>> {
        if path.is_empty() || path == "/" || path == "." {
            let i = match root {
                Some(_) => resolve_sandbox_path("x", &self.root_paths, root, 8)?.root_index,
                None => 0,
            };
            return self.roots[i].list_dir(None);
        }
        let (i, rel) = self.resolve_read(path, root)?;
        self.roots[i].list_dir(Some(&rel))
    }

    /// Describes a path inside a root. A symlink, FIFO, socket or device at the path is
    /// named for what it is, never followed or opened; a file with other hard links is
    /// refused (`hardlink_refused`) as for `read_file`, since it may be a file outside.
    pub fn get_file_info(&self, path: &str, root: Option<&str>) -> Verdict<FileInfo> {
        let (i, rel) = self.resolve_read(path, root)?;
        let (entry, _) = self.roots[i].entry(&rel)?;
        let abs = join_display(&self.root_paths[i], &rel)
            .display()
            .to_string();
        let (kind, size_bytes, sha256) = match entry {
            EntryKind::File { .. } => {
                let (size, sum) = self.roots[i].hash_file(&rel, MAX_INFO_HASH_BYTES)?;
                ("file", Some(size), sum)
            }
            EntryKind::Directory => ("directory", None, None),
            EntryKind::Missing => ("missing", None, None),
            EntryKind::Symlink => ("symlink", None, None),
            EntryKind::Special => ("special", None, None),
        };
        let artifact_id = match (&sha256, size_bytes) {
            (Some(sum), _) => self.registry.version_holding(&abs, sum),
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

    /// Newest audit entries.
    pub fn audit_entries(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> Result<Vec<SandboxAuditEntry>, Error> {
        self.audit
            .list(limit, workflow_id)
            .map_err(Error::io("read the audit log"))
    }

    /// Audit statistics.
    pub fn audit_stats(&self) -> Result<AuditStats, Error> {
        self.audit.stats().map_err(Error::io("read the audit log"))
    }

    /// Verifies the audit chain, and that the trail records every write the artifact
    /// registry holds an artifact of. The head kept outside the log catches a cut tail,
    /// but not one cut together with the head rewritten to match, nor a trail removed
    /// with its head: the registry, a separate file, still names those writes. Under
    /// `relaxed` durability the registry is not compared: a power cut may lose trail
    /// lines the registry keeps.
    pub fn audit_verify(&self) -> Result<VerifyReport, Error> {
        let (report, logged) = self
            .audit
            .verify_and_writes()
            .map_err(Error::io("read the audit log"))?;
        if !report.ok || !self.durable() {
            return Ok(report);
        }
        let mut missing = self
            .registry
            .find(|a| !crate::audit::records(&logged, a))
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
                    .lock(&format!("wf-{wf}"))
                    .map_err(Error::io("lock a workflow"))?,
            );
        }
        let (report, logged) = self
            .audit
            .verify_and_writes()
            .map_err(Error::io("read the audit log"))?;
        if !report.ok {
            return Ok(report);
        }
        missing.retain(|a| !crate::audit::records(&logged, a));
        Ok(crate::audit::with_unlogged(report, &missing))
    }

    /// Newest artifacts.
    pub fn artifacts(
        &self,
        limit: usize,
        workflow_id: Option<&str>,
    ) -> Result<Vec<ArtifactEntry>, Error> {
        self.registry
            .list(limit, workflow_id)
            .map_err(Error::io("read the artifact registry"))
    }

    /// One artifact and its lineage (nearest ancestor first).
    pub fn artifact_with_lineage(
        &self,
        id: &str,
    ) -> Result<Option<(ArtifactEntry, Vec<ArtifactEntry>)>, Error> {
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

    pub(crate) fn abs_path(&self, root_index: usize, rel: &RelPath) -> String {
        join_display(&self.root_paths[root_index], rel)
            .display()
            .to_string()
    }

    /// Whether a recorded absolute target path names `rel` in this root, whatever
    /// spelling of the root (a symlink to it, say) the recording process was given.
    pub(crate) fn names_target(&self, recorded: &str, root_index: usize, rel: &RelPath) -> bool {
        let path = std::path::Path::new(recorded);
        if path == join_display(&self.root_paths[root_index], rel) {
            return true;
        }
        path.ends_with(rel.to_path_buf())
            && path
                .ancestors()
                .nth(rel.depth())
                .and_then(std::path::Path::to_str)
                .is_some_and(|r| self.roots[root_index].is_named_by(r))
    }

    /// The root (index) a recorded absolute target path lies in, whatever spelling of
    /// the root it was recorded with; `None` when it is in none of this process's roots.
    fn root_of(&self, target: &str) -> Option<usize> {
        let path = std::path::Path::new(target);
        if let Some(i) = self.root_paths.iter().position(|r| path.starts_with(r)) {
            return Some(i);
        }
        path.ancestors().skip(1).find_map(|a| {
            let a = a.to_str()?;
            self.roots.iter().position(|r| r.is_named_by(a))
        })
    }

    /// Every snapshot of a workflow across roots, oldest first, with its root. A record
    /// that cannot be trusted refuses the whole workflow: a rollback that skipped it would
    /// report success with a file left unrestored.
    pub(crate) fn workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<Vec<(usize, StoredSnapshot)>> {
        let (all, mut untrusted) = self.workflow_snapshots_and_untrusted(workflow_id)?;
        match untrusted.pop() {
            Some(r) => Err(r),
            None => Ok(all),
        }
    }

    /// [`Sandbox::workflow_snapshots`] for recovery and pruning, which act on what they
    /// can trust and leave the rest alone (logged) rather than giving up on the whole
    /// workflow. Also returns how many folders were left alone. An error means nothing
    /// could be read at all (a root's `.rollback` unreadable, say).
    pub(crate) fn trusted_workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<(RootedSnapshots, usize)> {
        let (all, untrusted) = self
            .workflow_snapshots_and_untrusted(workflow_id)
            .inspect_err(|r| {
                tracing::error!(workflow = %workflow_id, reason = %r, "the workflow's snapshots could not be read");
            })?;
        for r in &untrusted {
            tracing::error!(workflow = %workflow_id, reason = %r, "an untrusted snapshot folder was left alone");
        }
        Ok((all, untrusted.len()))
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
        Ok((all, untrusted))
    }

    /// Files a rollback would overwrite although they changed since the action.
    /// `snaps` is oldest first.
    pub(crate) fn find_conflicts(
        &self,
        workflow_id: &str,
        snaps: &[(usize, StoredSnapshot)],
    ) -> Vec<Conflict> {
        let mut out = Vec::new();
        let undoing: HashSet<&str> = snaps
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        // What the rollback removes: an entry of a directory the workflow created is
        // no obstacle to removing that directory when it is one of them, unless a
        // create_directory outside the rollback keeps it (`kept`, with its claimers).
        let mut removed: HashSet<(usize, String)> = HashSet::new();
        let mut kept: HashMap<(usize, String), Vec<String>> = HashMap::new();
        for (i, s) in snaps
            .iter()
            .filter(|(_, s)| s.meta.kind == crate::snapshot::SnapshotKind::Missing)
        {
            removed.insert((*i, s.meta.original_path.clone()));
            let maker = crate::left_dirs::Maker::of(&s.meta);
            for d in &s.meta.created_dirs {
                let claims = self.claimers(*i, d, &maker, &undoing);
                if claims.is_empty() {
                    removed.insert((*i, d.clone()));
                } else {
                    kept.insert((*i, d.clone()), claims);
                }
            }
        }
        // Restoring newest first, the newest action on a path is compared with what the
        // path holds now, and each older one with what the newer snapshot will put back:
        // a difference is a change someone else made in between.
        let mut will_hold: HashMap<String, TargetState> = HashMap::new();
        for (i, s) in snaps.iter().rev() {
            let rel = s.meta.target();
            let abs = self.abs_path(*i, &rel);
            let current = will_hold
                .insert(abs.clone(), TargetState::found_by(&s.meta))
                .unwrap_or_else(|| self.target_state(*i, &rel));
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
            // What it holds that the rollback does not remove: another's entry, or a
            // directory the workflow made that a claim keeps (naming its claimers).
            let mut foreign = false;
            if created_dir {
                match self.roots[*i].list_dir(Some(&rel)) {
                    Ok(entries) => {
                        for e in entries {
                            let entry = (*i, format!("{}/{}", s.meta.original_path, e.name));
                            if removed.contains(&entry) {
                                continue;
                            }
                            match kept.get(&entry) {
                                Some(claims) => claimed_by.extend(claims.iter().cloned()),
                                None => foreign = true,
                            }
                        }
                    }
                    Err(_) => foreign = true,
                }
            }
            claimed_by.sort();
            claimed_by.dedup();
            let changed = !left.holds(&current, &s.meta) || !claimed_by.is_empty() || foreign;
            if changed {
                out.push(Conflict {
                    action_id: s.meta.action_id.clone(),
                    path: abs,
                    expected_checksum: left.state.checksum(),
                    current_checksum: current.checksum(),
                    claimed_by,
                });
            }
        }
        out
    }

    /// What an action left at its target, as the records say: a file's checksum (its
    /// artifact), or a directory. An action with no artifact (it failed, or its line was
    /// lost) left the file its snapshot says it was about to write, or nothing at all:
    /// whether it wrote before it stopped is not recorded. `None` when the records say
    /// nothing (snapshots older than that field).
    fn left_by(&self, workflow_id: &str, meta: &SnapshotMeta) -> Option<Left> {
        // The artifact of this very run: an action id may be used again after a prune.
        if let Ok(Some(art)) = self.registry.get_by_action(workflow_id, &meta.action_id)
            && art.generated_by_action == format!("{}/{}", meta.execution_id, meta.action_id)
        {
            return Some(Left {
                state: TargetState::File(art.checksum_sha256),
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
        let rel = RelPath::from_components(dir.split('/').map(str::to_owned).collect());
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
    fn claimed(&self, root: usize, dir: &str, maker: &crate::left_dirs::Maker) -> bool {
        !self.claimers(root, dir, maker, &HashSet::new()).is_empty()
    }

    /// What a target holds now.
    pub(crate) fn target_state(&self, root: usize, rel: &RelPath) -> TargetState {
        self.target_state_judged(root, rel).0
    }

    /// [`Sandbox::target_state`], with what a restore judged by it may replace: the very
    /// file it read, nothing where it found nothing.
    fn target_state_judged(&self, root: usize, rel: &RelPath) -> (TargetState, Put) {
        let r = &self.roots[root];
        match r.inspect(rel).map(|t| t.kind) {
            Ok(TargetKind::File { .. }) => r
                .read_file_stamped(rel, MAX_SNAPSHOT_BYTES)
                .map_or((TargetState::Unreadable, Put::Any), |(b, stamp)| {
                    (TargetState::File(sha256_hex(&b)), Put::Unchanged(stamp))
                }),
            Ok(TargetKind::Directory) => (TargetState::Directory, Put::Any),
            Ok(TargetKind::Missing) => (TargetState::Missing, Put::New),
            Err(_) => (TargetState::Unreadable, Put::Any),
        }
    }

    /// Refuses (`conflict`) to restore a target that no longer holds what its action
    /// left, naming both; else says to restore it, over the file it judged (see
    /// [`Judged`]).
    fn check_unchanged(
        &self,
        workflow_id: &str,
        root: usize,
        meta: &SnapshotMeta,
    ) -> Verdict<Judged> {
        let Some(left) = self.left_by(workflow_id, meta) else {
            return Ok((true, Put::Any));
        };
        let (now, put) = self.target_state_judged(root, &meta.target());
        if left.holds(&now, meta) {
            return Ok((true, put));
        }
        Err(crate::reason::Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{} changed after action {} wrote it: it holds {} instead of {}; it was left as it is (roll back with force to overwrite it)",
                shown_path(&meta.original_path),
                shown_path(&meta.action_id),
                now.describe(),
                left.state.describe()
            ),
        ))
    }

    /// For an action undoing its own change: whether there is one to undo (see
    /// [`RestoreMode::OwnChange`]).
    fn check_own_change(
        &self,
        root: usize,
        meta: &SnapshotMeta,
        left: &TargetState,
    ) -> Verdict<Judged> {
        let (now, put) = self.target_state_judged(root, &meta.target());
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

    /// Takes the lock that serialises every change to `rel` in root `root` across
    /// workflows, threads and processes, from the read of what it holds to the write of
    /// what replaces it (or its restore): otherwise two writers working from the same
    /// bytes would lose one's change, and a restore could undo a change it never saw.
    /// A holder of one takes no other target's lock (holders of several take them at once,
    /// [`Sandbox::lock_targets`]), and a workflow's lock only before, so no two holders
    /// wait for each other.
    pub(crate) fn lock_target(
        &self,
        root: usize,
        rel: &RelPath,
    ) -> Verdict<crate::confine::state::HeldLock<'_>> {
        self.target_locks
            .lock(self.stripe_of(root, rel))
            .map_err(|e| lock_refusal(rel, &e))
    }

    /// The locks of several targets at once, taken in stripe order so that two holders
    /// of several never wait for each other (holders of one never wait while holding it).
    pub(crate) fn lock_targets(
        &self,
        targets: impl Iterator<Item = (usize, RelPath)>,
    ) -> Verdict<Vec<crate::confine::state::HeldLock<'_>>> {
        let mut stripes: Vec<(usize, RelPath)> = targets
            .map(|(root, rel)| (self.stripe_of(root, &rel), rel))
            .collect();
        stripes.sort_by_key(|(i, _)| *i);
        stripes.dedup_by_key(|(i, _)| *i);
        // One wait for them all: each taken after the one before, they would otherwise
        // add up, and holders of several would queue behind each other for minutes.
        let deadline = self.target_locks.deadline();
        stripes
            .iter()
            .map(|(i, rel)| {
                self.target_locks
                    .lock_by(*i, deadline)
                    .map_err(|e| lock_refusal(rel, &e))
            })
            .collect()
    }

    /// Which target lock serves `rel` in root `root`.
    fn stripe_of(&self, root: usize, rel: &RelPath) -> usize {
        let (dev, ino) = self.roots[root].id();
        // FNV-1a, so that every process picks the same stripe.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in dev
            .to_le_bytes()
            .iter()
            .chain(&ino.to_le_bytes())
            .chain(rel.as_string().as_bytes())
        {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        (h % TARGET_LOCK_STRIPES as u64) as usize
    }

    /// What a rollback of the workflow would restore, and the conflicts it would meet.
    pub fn rollback_info(&self, workflow_id: &str) -> Verdict<RollbackInfo> {
        crate::plan::check_id("workflow_id", workflow_id)?;
        let found = self.workflow_snapshots(workflow_id)?;
        let (snaps, refusal) = match self.rollback_selection(
            workflow_id,
            found.clone(),
            &RollbackOptions::default(),
        ) {
            Ok((snaps, _)) => (snaps, None),
            Err(refused) => (found, Some(refused)),
        };
        let pending: Vec<_> = snaps.iter().filter(|(_, s)| !s.restored).cloned().collect();
        let (refusal, conflicts) = match refusal {
            Some((code, reason, conflicts)) => (Some((code, reason)), conflicts),
            None => (None, self.find_conflicts(workflow_id, &pending)),
        };
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
            rollback_available: refusal.is_none() && !pending.is_empty(),
            reason_code: refusal.as_ref().map(|(code, _)| *code),
            reason: refusal.map(|(_, reason)| reason),
            actions,
            conflicts,
        })
    }

    /// Rolls a workflow (or one of its actions) back, newest first, refusing with
    /// `conflict` when a file changed since the workflow wrote it, unless forced. A
    /// refusal is audited as a blocked rollback (SPEC §8: blocked actions are audited
    /// too), so that a snapshot found tampered with, or a conflict, is on the trail.
    pub fn rollback_workflow(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let report = self.rollback_unaudited(workflow_id, opts);
        if report.status == "refused" {
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
        if report.reason_code == Some(ReasonCode::ChecksumMismatch) {
            self.metrics.checksum_mismatch();
        }
        let folder = self
            .root_paths
            .first()
            .map(|r| {
                r.join(crate::confine::path::ROLLBACK_DIR)
                    .join(workflow_id)
                    .display()
                    .to_string()
            })
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
    ) -> Result<(RootedSnapshots, Vec<String>), RollbackRefusal> {
        // The audit trail lives in the state directory, out of reach of whoever can
        // write inside a root: it says which writes happened and which were undone, so a
        // snapshot folder or restore mark removed from `.rollback/` cannot turn into a
        // rollback that reports success with a file left as it was.
        let trail = match self.audit.by_workflow(workflow_id) {
            Ok(t) => t,
            Err(e) => {
                return Err((
                    ReasonCode::IoError,
                    format!("could not read the audit trail: {}", e.kind()),
                    Vec::new(),
                ));
            }
        };
        let (pruned_up_to, pruned_roots) = match self.state.prune_mark(workflow_id) {
            Ok(m) => m.unwrap_or_default(),
            Err(e) => {
                return Err((
                    ReasonCode::IoError,
                    format!("could not read the workflow's prune record: {}", e.kind()),
                    Vec::new(),
                ));
            }
        };
        // Which of this process's roots the last prune went through.
        let pruned_root = |i: usize| pruned_roots.iter().any(|r| self.roots[i].is_named_by(r));
        // Writes that must have a snapshot here, and writes into a root this process is not
        // configured with; those a prune removed need neither.
        let mut written: HashMap<&str, (u64, &str)> = HashMap::new();
        let mut elsewhere_writes: Vec<&SandboxAuditEntry> = Vec::new();
        let mut pruned_writes: Vec<&SandboxAuditEntry> = Vec::new();
        let mut undone: HashMap<&str, u64> = HashMap::new();
        for e in &trail {
            match e.status {
                AuditStatus::Success
                    if e.rollback_available
                        && e.mutation_class != Some(MutationClass::Rollback) =>
                {
                    match self.root_of(&e.target_path) {
                        None => elsewhere_writes.push(e),
                        Some(i) if e.seq > pruned_up_to || !pruned_root(i) => {
                            written.insert(&e.action_id, (e.seq, &e.target_path));
                        }
                        Some(_) => pruned_writes.push(e),
                    }
                }
                AuditStatus::RolledBack => {
                    undone.insert(&e.action_id, e.seq);
                }
                _ => {}
            }
        }
        let is_undone = |action: &str| {
            written
                .get(action)
                .is_some_and(|(w, _)| undone.get(action).is_some_and(|u| u > w))
        };
        // Of the writes kept apart above, those asked for and not undone since.
        let in_place = |e: &SandboxAuditEntry| {
            opts.action_id.as_deref().is_none_or(|a| a == e.action_id)
                && undone.get(e.action_id.as_str()).is_none_or(|u| *u < e.seq)
        };
        let pruned: Vec<String> = pruned_writes
            .into_iter()
            .filter(|e| in_place(e))
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
        let mut elsewhere: Vec<&str> = elsewhere_writes
            .into_iter()
            .filter(|e| in_place(e))
            .map(|e| e.action_id.as_str())
            .collect();
        elsewhere.sort_unstable();
        elsewhere.dedup();
        if !elsewhere.is_empty() {
            let names: Vec<String> = elsewhere.iter().map(|a| shown_path(a)).collect();
            return Err((
                ReasonCode::OutsideSandbox,
                format!(
                    "{} of workflow {} wrote into a root this process is not configured with, so nothing was rolled back; run the rollback with every root the workflow wrote into (--root, once per root), or roll back the other actions one at a time",
                    names.join(", "),
                    shown_path(workflow_id)
                ),
                Vec::new(),
            ));
        }
        let have: HashSet<&str> = snaps
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        let mut missing: Vec<String> = written
            .iter()
            .filter(|(a, _)| opts.action_id.as_deref().is_none_or(|want| want == **a))
            .filter(|(a, _)| !have.contains(**a) && !is_undone(a))
            .map(|(a, (_, path))| format!("{} ({path})", shown_path(a)))
            .collect();
        missing.sort();
        // A prune records itself before it removes anything: a snapshot still there of a
        // write it covered means it stopped half way, and its mark must not excuse the
        // folders it did remove.
        let pruned_but_present = snaps.iter().any(|(i, s)| {
            pruned_root(*i)
                && opts
                    .action_id
                    .as_deref()
                    .is_none_or(|a| a == s.meta.action_id)
                && trail.iter().any(|e| {
                    e.status == AuditStatus::Success
                        && e.seq <= pruned_up_to
                        && e.action_id == s.meta.action_id
                        && e.execution_id == s.meta.execution_id
                })
        });
        if pruned_but_present {
            return Err((
                ReasonCode::NoRollbackData,
                format!(
                    "a prune of workflow {} stopped half way, so some of its snapshots are gone; run prune again to finish it before rolling back",
                    shown_path(workflow_id)
                ),
                Vec::new(),
            ));
        }
        if !missing.is_empty() {
            return Err((
                ReasonCode::NoRollbackData,
                format!(
                    "the snapshots of {} are missing from .rollback/{}/ although the audit trail records their writes (removed, or lost with unsynced data): those files cannot be restored, so nothing was rolled back; restore the folders, or roll back the other actions one at a time",
                    missing.join(", "),
                    workflow_id
                ),
                Vec::new(),
            ));
        }
        // One action undone under a later action of the workflow on the same file (or a
        // path beneath or above it) would leave that later action recorded as in place
        // while its change is gone, and its own rollback would then bring back this
        // one's bytes: the later ones go first, force or not.
        if let Some(a) = opts.action_id.as_deref() {
            let later = later_writers(&snaps, a, |s| s.restored || is_undone(&s.meta.action_id));
            if !later.is_empty() {
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
                            claimed_by: Vec::new(),
                        }
                    })
                    .collect();
                return Err((
                    ReasonCode::Conflict,
                    format!(
                        "later actions of workflow {} changed what action {} wrote: {}; roll those back first (newest first), or roll back the whole workflow",
                        shown_path(workflow_id),
                        shown_path(a),
                        names.join(", ")
                    ),
                    conflicts,
                ));
            }
        }
        let chosen = snaps
            .into_iter()
            .filter(|(_, s)| {
                opts.action_id
                    .as_deref()
                    .is_none_or(|a| a == s.meta.action_id)
            })
            .map(|(i, mut s)| {
                // Undone according to the trail even if its mark was removed.
                s.restored |= is_undone(&s.meta.action_id);
                (i, s)
            })
            .collect::<RootedSnapshots>();
        let what = || match &opts.action_id {
            Some(a) => format!(
                "action {} of workflow {}",
                shown_path(a),
                shown_path(workflow_id)
            ),
            None => format!("workflow {}", shown_path(workflow_id)),
        };
        if chosen.is_empty() {
            return Err((
                ReasonCode::NoRollbackData,
                format!(
                    "there are no snapshots for {}; nothing can be rolled back",
                    what()
                ),
                Vec::new(),
            ));
        }
        if chosen.iter().all(|(_, s)| s.restored) {
            return Err((
                ReasonCode::NoRollbackData,
                format!(
                    "{} was already rolled back (by an earlier rollback, or at once when its action failed); nothing is left to roll back",
                    what()
                ),
                Vec::new(),
            ));
        }
        Ok((chosen, pruned))
    }

    fn rollback_unaudited(&self, workflow_id: &str, opts: &RollbackOptions) -> RollbackReport {
        let refused = |code: ReasonCode, reason: String, conflicts: Vec<Conflict>| RollbackReport {
            workflow_id: workflow_id.to_owned(),
            status: "refused",
            steps_rolled_back: 0,
            reason_code: Some(code),
            reason: Some(reason),
            conflicts,
            steps: Vec::new(),
        };
        if let Err(r) = crate::plan::check_id("workflow_id", workflow_id) {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        if let Some(a) = &opts.action_id
            && let Err(r) = crate::plan::check_id("action_id", a)
        {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        // A restore could not be made durable either, nor recorded.
        if let Err(r) = self.check_syncs() {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        let _lock = match self.state.lock(&format!("wf-{workflow_id}")) {
            Ok(l) => l,
            Err(e) => {
                let r = workflow_lock_refusal(workflow_id, &e);
                return refused(r.reason_code, r.reason, Vec::new());
            }
        };
        // Before the snapshots are read: the dead run's recovery may restore some.
        if self.execution_context().0.is_executable()
            && let Err(r) = self.recover_dead_run(workflow_id)
        {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        let snaps = match self.workflow_snapshots(workflow_id) {
            Ok(s) => s,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let (mut chosen, pruned) = match self.rollback_selection(workflow_id, snaps, opts) {
            Ok(selected) => selected,
            Err((code, reason, conflicts)) => return refused(code, reason, conflicts),
        };
        chosen.retain(|(_, s)| !s.restored);
        // Every target's lock, from the conflict check to the last restore: a writer
        // landing in between would meet the rollback half done.
        let _held = match self.lock_targets(chosen.iter().map(|(i, s)| (*i, s.meta.target()))) {
            Ok(h) => h,
            Err(r) => return refused(r.reason_code, r.reason, Vec::new()),
        };
        let mut conflicts = self.find_conflicts(workflow_id, &chosen);
        if !conflicts.is_empty() && !opts.force {
            let (claimed, changed): (Vec<&Conflict>, Vec<&Conflict>) =
                conflicts.iter().partition(|c| !c.claimed_by.is_empty());
            let mut why = Vec::new();
            if !changed.is_empty() {
                // One entry per action in `conflicts`; each file once for people.
                let mut files: Vec<&str> = Vec::new();
                for c in &changed {
                    if !files.contains(&c.path.as_str()) {
                        files.push(&c.path);
                    }
                }
                why.push(format!(
                    "these files or directories changed after the workflow wrote them: {}; roll back with force to overwrite them (a directory that holds what is not the workflow's is left in place even then)",
                    files.join(", ")
                ));
            }
            for c in claimed {
                why.push(format!(
                    "the directory {}, or one the workflow made in it, is also the result of create_directory {}, which stands: roll that back first (once its workflow is pruned it never can be), or roll back with force to leave the directory in place",
                    c.path,
                    c.claimed_by.join(", ")
                ));
            }
            return refused(ReasonCode::Conflict, why.join("; "), conflicts);
        }
        // Force overwrites a changed file, never a directory someone put where a file
        // was: its contents are not the workflow's to remove.
        let now_dirs: Vec<String> = chosen
            .iter()
            .filter(|(i, s)| {
                !s.meta.is_directory_action()
                    && self.target_state(*i, &s.meta.target()) == TargetState::Directory
            })
            .map(|(_, s)| shown_path(&s.meta.original_path))
            .collect();
        if !now_dirs.is_empty() {
            return refused(
                ReasonCode::NotRegularFile,
                format!(
                    "{} {} now a directory where the workflow wrote a file; a rollback never removes a directory it did not create, even with force: move it away, then roll back",
                    now_dirs.join(", "),
                    if now_dirs.len() == 1 { "is" } else { "are" }
                ),
                conflicts,
            );
        }
        // A rollback writes files like any action: with writes off or dry-run on it only
        // says what it would restore.
        if let (ctx, Some(why)) = self.execution_context()
            && !ctx.is_executable()
        {
            let would: Vec<String> = chosen
                .iter()
                .rev()
                .map(|(_, s)| {
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
            let records: Vec<AuditRecord> = chosen
                .iter()
                .rev()
                .map(|(i, s)| {
                    let current = self.target_checksum(*i, &s.meta.target());
                    let mut r = self.rollback_record(
                        &execution_id,
                        workflow_id,
                        *i,
                        &s.meta,
                        current,
                        s.meta.sha256.clone(),
                    );
                    r.status = AuditStatus::Simulated;
                    r.rollback_path = None;
                    r
                })
                .collect();
            if let Err(e) = self.audit.append(records) {
                return refused(
                    ReasonCode::IoError,
                    format!("could not audit the simulated rollback: {}", e.kind()),
                    Vec::new(),
                );
            }
            return RollbackReport {
                workflow_id: workflow_id.to_owned(),
                status: "simulated",
                steps_rolled_back: 0,
                reason_code: None,
                reason: Some(format!(
                    "{flag}, so nothing was restored; {} action(s) would be rolled back, newest first: {}; {fix}",
                    would.len(),
                    would.join(", ")
                )),
                conflicts,
                steps: Vec::new(),
            };
        }
        let execution_id = crate::plan::new_execution_id();
        // The workflow's record says a rollback is under way, durably, before any target
        // changes: if the process dies between a restore and its record, the next start
        // finds the restored file and records it. Earlier runs of the workflow are made
        // durable first (batched), since the record no longer points recovery at them,
        // and the workflow's commit log is emptied, so no later recovery redoes an
        // action this rollback undoes.
        let record = crate::recovery::InflightRecord {
            state: crate::recovery::ROLLING_BACK.to_owned(),
            execution_id: execution_id.clone(),
            workflow_id: workflow_id.to_owned(),
            started_at: self.now(),
            finished: false,
            boot: crate::confine::state::boot_id().map(str::to_owned),
            recovered_by: Vec::new(),
            roots: self.root_names(chosen.iter().map(|(i, _)| *i)),
        };
        let marked = self
            .settle_commit_log(workflow_id)
            .and_then(|synced| if synced { Ok(()) } else { self.sync_point() })
            .and_then(|()| self.begin_record(&record, None))
            .and_then(|()| self.sync_point());
        if let Err(r) = marked {
            return refused(r.reason_code, r.reason, Vec::new());
        }
        // A step refused as a conflict (a change made without the runtime's locks after
        // the check above) is named among the conflicts like those found before.
        let targets: HashMap<String, (usize, RelPath, Option<String>)> = chosen
            .iter()
            .map(|(i, s)| {
                let after = s.meta.after_sha256.clone();
                (s.meta.action_id.clone(), (*i, s.meta.target(), after))
            })
            .collect();
        let steps = self.restore_all(
            &execution_id,
            workflow_id,
            chosen.into_iter().rev().collect(),
            "manual",
            if opts.force {
                RestoreMode::Force
            } else {
                RestoreMode::Unchanged
            },
        );
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
                    claimed_by: Vec::new(),
                });
            }
        }
        let failed = steps.iter().find(|s| !s.restored);
        let unrecorded = steps.iter().find_map(|s| s.unrecorded.clone());
        if unrecorded.is_none() {
            self.run_finished(record, None);
        }
        // Else the record stays "rolling back": the next start, or the next run or
        // rollback of this workflow in any process, finds it and audits the restores
        // its marks record, as after a crash.
        let n = steps.iter().filter(|s| s.restored).count() as u64;
        let (reason_code, reason) = match (failed, unrecorded) {
            (Some(s), _) => (s.reason_code, s.reason.clone()),
            // A busy peer, not a broken disk.
            (None, Some(e)) if e.starts_with(HELD_TRAIL) => (
                Some(ReasonCode::Conflict),
                Some(format!(
                    "the files were restored, but {e}, so it could not record it; it is recorded when this workflow is next used, or at the next start"
                )),
            ),
            (None, Some(e)) => (
                Some(ReasonCode::IoError),
                Some(format!(
                    "the files were restored, but the audit trail could not record it ({e}); it is recorded when this workflow is next used, or at the next start, once the state directory can be written"
                )),
            ),
            // Done, yet not everything the workflow wrote is back as it was: say so.
            (None, None) if !pruned.is_empty() => (
                None,
                Some(format!(
                    "{} earlier write(s) were pruned (prune --older-than) and cannot be rolled back; those files stay as they are: {}",
                    pruned.len(),
                    pruned.join(", ")
                )),
            ),
            (None, None) => (None, None),
        };
        RollbackReport {
            workflow_id: workflow_id.to_owned(),
            status: if reason_code.is_some() {
                "failed"
            } else {
                "rolled_back"
            },
            steps_rolled_back: n,
            reason_code,
            reason,
            conflicts,
            steps,
        }
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
    /// stays on the ledger.
    fn remove_left_dirs(&self) {
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
                let rel = RelPath::from_components(d.path.split('/').map(str::to_owned).collect());
                // One someone has made the result of a create_directory stays on the
                // ledger until that one is rolled back. (Asked of empty ones only.)
                let empty = root.list_dir(Some(&rel)).is_ok_and(|e| e.is_empty());
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
        why: &str,
        mode: RestoreMode,
    ) -> Vec<RollbackStep> {
        let durable = self.fsync_each();
        let mut steps = Vec::new();
        for (i, s) in snaps {
            let root = &self.roots[i];
            let meta = s.meta;
            let abs = self.abs_path(i, &meta.target());
            let before = self.target_checksum(i, &meta.target());
            let outcome = match &mode {
                RestoreMode::Unchanged => self.check_unchanged(workflow_id, i, &meta),
                RestoreMode::OwnChange(left) => self.check_own_change(i, &meta, left),
                RestoreMode::Force => Ok((true, Put::Any)),
                RestoreMode::Untouched => Ok((false, Put::Any)),
            }
            .and_then(|judged| self.fail_at("during_restore").map(|()| judged))
            .and_then(|(change, put)| {
                if change {
                    let maker = crate::left_dirs::Maker::of(&meta);
                    let keep = |d: &str| self.claimed(i, d, &maker);
                    let forced = mode == RestoreMode::Force;
                    RollbackEngine::restore(root, &meta, durable, put, forced, &keep, || {
                        self.fail_at("restore_verify")
                    })
                } else {
                    // The target is as the action found it (its write failed before
                    // the target changed) or as someone else made it meanwhile, and stays
                    // so, but directories made on the way may be there. What it holds is
                    // what the record says the undo left.
                    let left_dirs = match meta.kind {
                        SnapshotKind::Missing => self.remove_created_dirs_of(i, &meta)?,
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
            .and_then(|o| self.fail_at("after_restore").map(|()| o));
            let mut step = match outcome {
                Ok(o) => {
                    // The ledger before the mark: a death between them leaves a line
                    // about a step that recovery then finishes, never a step done with
                    // its directories on no ledger.
                    self.record_left_dirs(i, &meta, &o.left_dirs);
                    if let Err(r) = self.mark_restored(
                        i,
                        &meta,
                        execution_id,
                        &o.restored_checksum,
                        &o.left_dirs,
                        false,
                    ) {
                        tracing::warn!(reason = %r, "could not mark a snapshot restored");
                    }
                    self.metrics.mutation(&meta.intent, "rolled_back");
                    RollbackStep {
                        action_id: meta.action_id.clone(),
                        intent: meta.intent.clone(),
                        path: abs.clone(),
                        restored: true,
                        checksum_validated: o.checksum_validated,
                        restored_checksum: o.restored_checksum,
                        detail: o.detail,
                        reason_code: None,
                        reason: None,
                        unrecorded: None,
                    }
                }
                Err(r) => {
                    if r.reason_code == ReasonCode::ChecksumMismatch {
                        self.metrics.checksum_mismatch();
                    }
                    RollbackStep::failed(&meta, abs.clone(), r)
                }
            };
            let mut record = self.rollback_record(
                execution_id,
                workflow_id,
                i,
                &meta,
                before,
                step.restored_checksum.clone(),
            );
            if !step.restored {
                record.status = AuditStatus::Failed;
                record.reason_code = step.reason_code;
                record.error = step.reason.clone();
            }
            // A death between the mark and this line is recorded by the next start's
            // recovery (`record_marked_restores`).
            let appended = self
                .fail_at("after_mark")
                .map_err(|r| std::io::Error::other(r.reason))
                .and_then(|()| self.audit.append(vec![record]));
            if let Err(e) = appended {
                tracing::error!(error = %e, "could not append a rollback record to the audit log");
                step.unrecorded = Some(if e.kind() == std::io::ErrorKind::TimedOut {
                    format!("{HELD_TRAIL} ({e})")
                } else {
                    e.to_string()
                });
            }
            steps.push(step);
        }
        if let Err(r) = self.sync_point() {
            tracing::error!(reason = %r.reason, "could not sync the rollback's last record");
        }
        // One rollback, however many steps it restored (those count as mutations).
        if steps.iter().any(|s| s.restored) {
            self.remove_left_dirs();
            self.metrics.rollback(why);
        }
        steps
    }

    /// Marks a snapshot restored, with the restore's checksum and the directories it
    /// had to leave; `recovered` when start-up recovery records a restore a dead
    /// rollback made.
    pub(crate) fn mark_restored(
        &self,
        root: usize,
        meta: &SnapshotMeta,
        execution_id: &str,
        restored_checksum: &Option<String>,
        left_dirs: &[LeftDir],
        recovered: bool,
    ) -> Verdict {
        let mut record = serde_json::json!({
            "restored_at": self.now(),
            "execution_id": execution_id,
            "restored_checksum": restored_checksum,
        });
        if !left_dirs.is_empty() {
            record["left_dirs"] = serde_json::json!(left_dirs);
        }
        if recovered {
            record["recorded_by"] = serde_json::json!("recovery");
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

    /// Removes the snapshots of workflows whose newest snapshot is older than
    /// `older_than` and that no process is running now. Removing snapshots makes writes
    /// irreversible, so like any write it only reports what it would do unless writing
    /// is on and dry-run off.
    pub fn prune(&self, older_than: std::time::Duration) -> Verdict<PruneReport> {
        let (ctx, why) = self.execution_context();
        let simulated = !ctx.is_executable();
        // An age beyond the calendar's range prunes nothing.
        let cutoff = chrono::Duration::from_std(older_than)
            .ok()
            .and_then(|d| self.clock.now().checked_sub_signed(d))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let mut report = PruneReport {
            simulated,
            dry_run_reason: why.filter(|_| simulated),
            ..PruneReport::default()
        };
        let mut ids: Vec<String> = Vec::new();
        for root in &self.roots {
            let names = Snapshotter::list_workflows(root)?;
            if !simulated {
                let swept = Snapshotter::sweep_pruned(root, &names);
                if swept > 0 {
                    tracing::info!(folders = swept, "removed what an earlier prune left");
                }
            }
            ids.extend(names);
        }
        ids.sort();
        ids.dedup();
        for wf in ids {
            if !crate::plan::is_valid_id(&wf) {
                continue;
            }
            // A workflow being run or rolled back now is kept, not waited for: it is not
            // finished, and one stopped process must not hold up the prune of the others.
            let pruned = self
                .state
                .try_lock(&format!("wf-{wf}"))
                .map_err(|e| {
                    crate::Refusal::new(
                        ReasonCode::IoError,
                        format!("could not take the workflow's lock: {e}"),
                    )
                })
                .and_then(|lock| match lock {
                    None => Ok(false),
                    Some(_lock) => {
                        // A run that died holding the lock: its in-doubt writes are judged
                        // from the snapshots about to go.
                        if !simulated {
                            self.recover_dead_run(&wf)?;
                        }
                        self.prune_workflow(&wf, cutoff, simulated)
                    }
                });
            match pruned {
                Ok(true) => report.workflows_pruned.push(wf),
                Ok(false) => report.workflows_kept += 1,
                // One workflow that cannot be pruned does not keep the others.
                Err(r) => {
                    tracing::error!(workflow = %wf, reason = %r, "a workflow could not be pruned");
                    report.workflows_failed.push(PruneFailure {
                        workflow_id: wf,
                        reason_code: r.reason_code,
                        reason: r.reason,
                    });
                }
            }
        }
        Ok(report)
    }
}

impl Sandbox {
    /// Prunes one workflow (its lock held) when what can be trusted — sealed snapshots
    /// and the audit trail — says it is older than `cutoff`. Folders nothing vouches for
    /// (another state directory's, a lost key's, planted) keep the workflow: nothing
    /// proves their age. Returns whether it was pruned.
    fn prune_workflow(
        &self,
        wf: &str,
        cutoff: chrono::DateTime<chrono::Utc>,
        simulated: bool,
    ) -> Verdict<bool> {
        let (snaps, untrusted) = self.trusted_workflow_snapshots(wf)?;
        let trail = self.audit.by_workflow(wf).map_err(|e| {
            crate::Refusal::new(
                ReasonCode::IoError,
                format!("could not read the audit trail: {}", e.kind()),
            )
        })?;
        let newest = snaps
            .iter()
            .map(|(_, s)| s.meta.taken_at.as_str())
            // A simulated rollback or plan is no activity on the workflow's snapshots.
            .chain(
                trail
                    .iter()
                    .filter(|e| e.status != AuditStatus::Simulated)
                    .map(|e| e.timestamp.as_str()),
            )
            .filter_map(crate::clock::parse_timestamp)
            .max();
        if untrusted > 0 || newest.is_some_and(|t| t >= cutoff) {
            return Ok(false);
        }
        if simulated {
            return Ok(true);
        }
        // A commit log entry must not outlive the snapshot it would recreate.
        let _synced = self.settle_commit_log(wf)?;
        // Recorded first: rollback checks snapshots against the audit trail, and writes
        // audited up to here are about to lose theirs by design. A mark without the
        // removal only spares writes that still have snapshots; the other way round,
        // every later rollback of the workflow would be refused.
        self.audit
            .last_seq()
            .and_then(|seq| {
                let roots: Vec<String> = self
                    .root_paths
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect();
                self.state.write_prune_mark(wf, seq, &roots)
            })
            .map_err(|e| {
                crate::Refusal::new(
                    ReasonCode::IoError,
                    format!("could not record the prune: {}", e.kind()),
                )
            })?;
        for root in &self.roots {
            if let Some(aside) = Snapshotter::set_aside(root, wf, self.durable())? {
                self.fail_at("during_prune")?;
                // The workflow has no snapshots here any more: a folder that cannot be
                // removed now is left for the next prune's sweep.
                if let Err(r) = Snapshotter::remove_aside(root, &aside) {
                    tracing::warn!(reason = %r, "a pruned snapshot folder is left for the next prune");
                }
            }
        }
        if let Err(e) = self
            .state
            .inflight_remove(wf)
            .and_then(|()| self.state.commit_log_remove(wf))
        {
            tracing::warn!(error = %e, "could not remove a pruned workflow's run record");
        }
        Ok(true)
    }
}

/// What a commit log entry holds (see [`crate::commit_log::CommitEntry`]).
pub(crate) struct LogEntry<'a> {
    pub record: &'a crate::recovery::InflightRecord,
    pub meta: &'a SnapshotMeta,
    pub backup: Option<&'a [u8]>,
    pub bytes: &'a [u8],
}

/// Commits a sandbox logs between two sync points.
const LOGGED_PER_SYNC: usize = 32;

fn lock_or_recover<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Refuses a state directory inside one of `roots` (lexically, or once symbolic links
/// are followed, also for parts of it not made yet).
fn state_dir_outside(state_dir: &Path, roots: &[SandboxRoot]) -> Result<(), Error> {
    match roots
        .iter()
        .find_map(|r| lies_inside(state_dir, r.path()).map(|inside| (inside, r)))
    {
        Some((inside, root)) => Err(Error::StateDirInsideRoot {
            state_dir: inside,
            root: root.path().to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// `Some(inner)` when `inner` lies inside `outer` (lexically, or after resolving
/// symlinks), or would once made.
fn lies_inside(inner: &Path, outer: &Path) -> Option<PathBuf> {
    if inner.starts_with(outer) {
        return Some(inner.to_path_buf());
    }
    let s = crate::confine::state::canonical_to_be(inner)?;
    let r = crate::confine::state::canonical_to_be(outer)?;
    s.starts_with(&r).then_some(s)
}

fn root_inside_state_dir(inside: &Path, state_dir: &Path) -> Error {
    Error::Config(crate::config::ConfigError(format!(
        "root {} lies inside the state directory {} once symbolic links are followed; the runtime's own files are never writable, so give a root outside it",
        inside.display(),
        state_dir.display()
    )))
}

fn open_state_dir(config: &Config) -> Result<(StateDir, Option<String>), Error> {
    match StateDir::open(&config.state_dir) {
        Ok(s) => Ok((s, None)),
        // Only a default that could not be made: one that exists and was refused is
        // reported, or another run would quietly use another audit trail.
        Err(e)
            if !config.state_dir_explicit
                && config.state_dir == Path::new(DEFAULT_STATE_DIR)
                && !crate::confine::state::exists(&config.state_dir) =>
        {
            let fallback =
                Config::fallback_state_dir(&|k| std::env::var(k).ok()).ok_or(Error::StateDir {
                    path: config.state_dir.clone(),
                    cause: e,
                })?;
            let s = StateDir::open(&fallback).map_err(|cause| Error::StateDir {
                path: fallback.clone(),
                cause,
            })?;
            let note = format!(
                "the default state directory {DEFAULT_STATE_DIR} cannot be created; using {} instead",
                fallback.display()
            );
            tracing::warn!("{note}");
            Ok((s, Some(note)))
        }
        Err(cause) => Err(Error::StateDir {
            path: config.state_dir.clone(),
            cause,
        }),
    }
}

impl Drop for Sandbox {
    /// With batched syncs, one last sync point makes the final runs durable and lets
    /// their records and the audit head catch up.
    fn drop(&mut self) {
        let waiting = !self
            .idle_after_sync
            .get_mut()
            .map_or(true, |v| v.is_empty())
            || !self
                .logs_after_sync
                .get_mut()
                .map_or(true, |v| v.is_empty())
            || self.audit.has_pending_head();
        if self.batch_sync.is_some()
            && waiting
            && let Err(r) = self.sync_point()
        {
            tracing::warn!(reason = %r.reason, "final sync failed");
        }
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
