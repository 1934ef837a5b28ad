//! [`Sandbox`]: the runtime a face holds. It opens the roots and the state directory once,
//! and offers every operation of SPEC §6–10 as a synchronous call.
//!
//! This file opens it (the roots, the state directory, the start's recovery) and answers
//! `state` and `check`. The other files are each an `impl Sandbox` for one concern:
//! `reads`, `locks`, `durability`, `conflicts`, `rollback`, `prune`.

use crate::artifact::ArtifactRegistry;
use crate::audit::AuditLog;
use crate::catalog::{RiskLevel, op_for_intent};
use crate::clock::{Clock, SystemClock, timestamp};
use crate::commit_log::Position;
use crate::config::{Config, DEFAULT_STATE_DIR};
use crate::confine::path::join_display;
use crate::confine::state::{NotPrivate, StateDir};
use crate::confine::{RelPath, SandboxRoot};
use crate::context::{DryRunReason, ExecutionContext, ExecutionMode};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::policy::{
    GovernanceContext, GovernanceRequest, assess_sandbox_risk, check_sandbox_governance,
    phase_supports_sandbox_write,
};
use crate::reason::{ReasonCode, Verdict};
use crate::snapshot::{Claim, OWNER_FILE, Ownership, Settled, StoreOwner, StoredSnapshot};
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod conflicts;
mod durability;
mod locks;
mod prune;
mod reads;
mod rollback;

pub(crate) use conflicts::TargetState;
pub use conflicts::{ChangedBy, Conflict};
use locks::TARGET_LOCK_STRIPES;
pub(crate) use locks::workflow_lock_refusal;
pub use prune::{PruneFailure, PruneReport};
pub use reads::{
    DEFAULT_LIST_LIMIT, FileInfo, FileRead, MAX_INFO_HASH_BYTES, MAX_LIST_LIMIT, READ_LIMIT,
};
pub(crate) use rollback::{RestoreMode, Restorer};
pub use rollback::{
    RollbackInfo, RollbackInfoAction, RollbackOptions, RollbackReport, RollbackStatus, RollbackStep,
};

/// The runtime.
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
    /// Workflows whose restores this process made but the audit trail would not record
    /// (see [`Sandbox::record_held_restores`]).
    pub(crate) held_restores: std::sync::Mutex<crate::recovery::HeldRestores>,
    /// Taken while they are recorded (see [`Sandbox::record_held_restores`]).
    pub(crate) recording_held: crate::timed_lock::Gate,
    /// Runs and rollbacks of this instance whose records it left for a later recovery:
    /// no dead ones, whose temporary files (named by this process) may be removed.
    left_for_later: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The roots (indexes) and processes of an earlier boot (their ids' seeds) whose
    /// temporary files recovery has looked for in the whole root, none of their other
    /// runs then awaiting recovery: not looked for again (see
    /// `Sandbox::remove_power_cut_leftovers`).
    pub(crate) swept_for_dead: std::sync::Mutex<std::collections::HashSet<(usize, String)>>,
    /// This state directory, as the roots' snapshot stores name their owner.
    pub(crate) store_owner: StoreOwner,
}

/// Where it writes and how: not its registry or trail, which may hold millions of
/// entries (their queries are the methods).
impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("roots", &self.root_paths)
            .field("skipped_roots", &self.skipped_roots)
            .field("state_dir", &self.state.path())
            .field("durability", &self.config.durability)
            .field("execution_mode", &self.execution_context().0.mode)
            .finish_non_exhaustive()
    }
}

// The crate documentation promises it: embedders share one instance across threads.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Sandbox>();
};

/// Snapshots with the index of the root they are in.
pub(crate) type RootedSnapshots = Vec<(usize, StoredSnapshot)>;

/// What [`Sandbox::check`] is asked about: one write, as a plan's action gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckRequest<'a> {
    /// An operation's name as a plan writes it (`create_file`, …).
    pub intent: &'a str,
    /// The target as a plan action gives it: relative to a root, or absolute inside one.
    pub path: &'a str,
    /// The text looked at for permission changes, as an action's `description`.
    pub description: Option<&'a str>,
    /// The bytes the file would hold once written (for `append_file`, the whole file
    /// after the append).
    pub size: u64,
    /// The root a relative path is meant for, as an action's `root`.
    pub root: Option<&'a str>,
}

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
    /// `sandbox_write` when writes really happen; `readonly` when writing is on and dry-run
    /// off but the phase allows reads only; else `simulation`.
    pub execution_mode: ExecutionMode,
    /// Why runs are simulated, if they are.
    pub dry_run_reason: Option<DryRunReason>,
    /// The phase.
    pub phase: String,
    /// Whether the write flag is on.
    pub executor_enabled: bool,
    /// Whether dry-run is on.
    pub dry_run: bool,
    /// Usable roots: those whose snapshot store is this state directory's or no one's.
    pub sandbox_roots: Vec<String>,
    /// Roots that could not be used, and why: those skipped at start, and those whose
    /// snapshot store another state directory claimed since (every write refused).
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

impl Sandbox {
    /// Opens the runtime with the system clock: the state directory (made if missing;
    /// it must be the runtime's own, not a folder other programs keep files in), then the
    /// roots (made if missing), then recovery of runs that died. A root that cannot be
    /// used (other users may write in it, say) is skipped, with why in
    /// [`Sandbox::skipped_roots`], and actions into it are refused; none usable is an
    /// error.
    pub fn open(config: Config) -> Result<Self, Error> {
        Self::open_with_clock(config, Arc::new(SystemClock))
    }

    /// Opens the runtime: validates the config, opens (creating) the roots, the state
    /// directory (falling back from an uncreatable default to the user's state
    /// directory), the registry and the audit log, and removes leftover temporary files.
    pub fn open_with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        Self::open_with_failpoints(config, clock, Arc::default())
    }

    /// [`Sandbox::open_with_clock`] with failure points armed before the start-up
    /// recovery runs, for crash tests of recovery itself (built with the `failpoints`
    /// feature only).
    #[cfg(feature = "failpoints")]
    pub fn open_armed(
        config: Config,
        clock: Arc<dyn Clock>,
        failpoints: Arc<crate::failpoint::FailPoints>,
    ) -> Result<Self, Error> {
        Self::open_with_failpoints(config, clock, failpoints)
    }

    fn open_with_failpoints(
        config: Config,
        clock: Arc<dyn Clock>,
        failpoints: Arc<crate::failpoint::FailPoints>,
    ) -> Result<Self, Error> {
        if let Some(feature) = crate::error::serde_json_feature_on() {
            return Err(Error::SerdeJsonFeature(feature));
        }
        config.validate()?;
        let mut notices = Vec::new();
        refuse_layout_before_making(&config)?;
        let found = open_existing_roots(&config)?;
        let (state, note) = open_state_dir(&config)?;
        let (mut roots, mut skipped) = make_missing_roots(&config, &state, found)?;
        let state = state.with_lock_wait(std::time::Duration::from_secs(
            config.limits.lock_wait_seconds,
        ));
        let target_locks = target_lock_set(&state);
        notices.extend(note);
        // A fallback state directory was not checked above.
        if state.path() != config.state_dir {
            state_dir_outside(state.path(), &roots)?;
        }
        reserve_state_dir_in_roots(&state, &mut roots)?;
        refuse_roots_inside_state_dir(&roots, &state)?;
        let batch_sync = open_batch_sync(&config, &roots, &state)?;
        let files = StateFiles::open(&config, &state, batch_sync.is_some(), &failpoints)?;
        let store_owner = StoreOwner {
            state_dir: state.path().display().to_string(),
            state_dir_id: state
                .dir_ids()
                .map_err(Error::io("look at the state directory"))?[0],
        };
        let claim = match context_of(&config).0.writes() {
            true => Claim::IfThere,
            false => Claim::No,
        };
        let durable = config.durability.is_durable() && batch_sync.is_none();
        let roots = confirm_stores(
            roots,
            (&mut skipped, &mut notices),
            &store_owner,
            &files.seal,
            claim,
            durable,
        )?;
        let metrics = Metrics::new();
        metrics.set_artifacts(files.registry.len().unwrap_or(0));
        let root_paths = roots.iter().map(|r| r.path().to_path_buf()).collect();
        let mut sb = Self {
            config,
            roots,
            root_paths,
            skipped_roots: skipped,
            state,
            notices,
            registry: files.registry,
            audit: files.audit,
            left_dirs: files.left_dirs,
            seal: files.seal,
            metrics,
            clock,
            failpoints,
            kernel_confinement: None,
            batch_sync,
            idle_after_sync: std::sync::Mutex::new(Vec::new()),
            logs_after_sync: std::sync::Mutex::new(std::collections::HashMap::new()),
            logged_since_sync: std::sync::atomic::AtomicUsize::new(0),
            target_locks,
            held_restores: std::sync::Mutex::default(),
            recording_held: crate::timed_lock::Gate::default(),
            left_for_later: std::sync::Mutex::default(),
            swept_for_dead: std::sync::Mutex::default(),
            store_owner,
        };
        sb.recover_at_start();
        Ok(sb)
    }

    /// Recovers the runs that died and says what it did, as the last step of a start:
    /// the runtime must be whole to replay or roll back what they left, and the
    /// notices must be in place before the first caller reads them.
    fn recover_at_start(&mut self) {
        let recovered = self.recover();
        // Oldest first, before anything this process writes.
        for r in recovered.iter().filter(|r| r.retry && r.restores_held) {
            self.held_restores()
                .add_kept(&r.workflow_id, &r.execution_id);
        }
        // A rollback that died after its restores, before it removed the directories
        // they emptied, is finished here.
        if recovered
            .iter()
            .any(|r| r.rollback && r.missing_roots.is_empty() && !r.retry)
        {
            self.remove_left_dirs(None);
        }
        for r in &recovered {
            let said = self.recovery_notices(r);
            self.notices.extend(said);
        }
        if let Some(problem) = self.audit.head_problem() {
            self.notices.push(tampered_notice(&problem));
        }
    }

    /// Applies kernel confinement (Landlock) to the calling thread and the threads it
    /// creates from now on: writes only beneath the roots and the state directory, no
    /// execution. Call it before starting any runtime or thread pool. The result is
    /// reported in [`Sandbox::state_doc`].
    pub fn confine_process(&mut self) -> &crate::confine::kernel::KernelConfinement {
        use std::os::fd::AsFd as _;
        let shown: Vec<String> = self
            .root_paths
            .iter()
            .map(PathBuf::as_path)
            .chain([self.state.path()])
            .map(|p| p.display().to_string())
            .collect();
        let dirs = self
            .roots
            .iter()
            .map(|r| r.dir().as_fd())
            .chain([self.state.top().as_fd()]);
        let report = crate::confine::kernel::restrict_to_dirs(
            &shown
                .iter()
                .map(String::as_str)
                .zip(dirs)
                .collect::<Vec<_>>(),
        );
        if !report.is_enforced() {
            tracing::warn!(detail = ?report.detail, "kernel confinement (Landlock) is not in force; the root handles still confine every write");
        }
        self.kernel_confinement.insert(report)
    }

    /// Failure injection, for crash-consistency tests (builds with the `failpoints`
    /// feature only).
    #[cfg(feature = "failpoints")]
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

    /// The metrics in the OpenMetrics text format ([`crate::metrics::classic_text`] gives
    /// Prometheus's classic one), with the artifacts gauge read from the
    /// registry at this moment (other processes register artifacts too), unless a
    /// thread or process is appending to it: then as last read, since a scrape never
    /// waits for a lock.
    pub fn metrics_text(&self) -> String {
        if let Some(n) = self.registry.len_at_once() {
            self.metrics.set_artifacts(n);
        }
        self.metrics.encode()
    }

    /// The artifact registry itself, for the tests (`internals` feature). Embedders read
    /// through [`Sandbox::artifacts`] and [`Sandbox::artifact_with_lineage`]: an entry
    /// registered here would have no snapshot, governance or audit line behind it.
    #[cfg(feature = "internals")]
    pub fn registry(&self) -> &ArtifactRegistry {
        &self.registry
    }

    /// The audit log itself, for the tests (`internals` feature). Embedders read through
    /// [`Sandbox::audit_entries`], [`Sandbox::audit_stats`] and [`Sandbox::audit_verify`]:
    /// a line appended here would stand for no write the runtime made.
    #[cfg(feature = "internals")]
    pub fn audit_log(&self) -> &AuditLog {
        &self.audit
    }

    /// The usable roots' paths, as configured. Their handles stay inside: a write
    /// through one would skip governance, the snapshot and the audit trail.
    pub fn roots(&self) -> Vec<&Path> {
        self.roots.iter().map(SandboxRoot::path).collect()
    }

    /// The state directory in use.
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// Configured roots skipped at start, each with why (see [`Sandbox::open`]).
    pub fn skipped_roots(&self) -> &[String] {
        &self.skipped_roots
    }

    /// Start-up notices (fallbacks taken, leftovers removed).
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    pub(crate) fn now(&self) -> String {
        timestamp(self.clock.now())
    }

    /// The snapshot folders of `workflow_id` (`.rollback/{workflow}`), in the roots
    /// that hold one.
    pub(crate) fn workflow_folders(&self, workflow_id: &str) -> Vec<PathBuf> {
        self.roots
            .iter()
            .zip(&self.root_paths)
            .filter(|(root, _)| workflow_folder_in(root, workflow_id).is_ok())
            .map(|(_, path)| workflow_folder(path, workflow_id))
            .collect()
    }

    /// The execution context and, when simulating, why.
    pub fn execution_context(&self) -> (ExecutionContext, Option<DryRunReason>) {
        context_of(&self.config)
    }

    /// Before a snapshot in `root`: that its store is this state directory's, claimed
    /// when no one's; `conflict` when another's (see [`StoreOwner`]). The owner record is
    /// read again only when it is no longer the file last found naming this one (one
    /// look at it a snapshot): a record removed, or replaced by another runtime's claim,
    /// while this process runs is seen at its next write.
    pub(crate) fn confirm_store(&self, root: &SandboxRoot) -> Verdict {
        if still_ours(root) {
            return Ok(());
        }
        match self
            .store_owner
            .confirm(root, &self.seal, Claim::Make, self.fsync_each())?
        {
            Ownership::Foreign(r) => {
                root.set_store_record(None);
                Err(r)
            }
            Ownership::Ours(stamp, settled) => {
                settled_said(root, stamp, &settled);
                Ok(())
            }
            Ownership::Unsettled => Ok(()),
        }
    }

    /// Why writes into `root` are refused now that another state directory claimed its
    /// snapshot store, if one did since this process last confirmed it: a look, which
    /// writes nothing (a record removed is claimed again by the next write, not here).
    fn store_taken(&self, root: &SandboxRoot) -> Option<String> {
        if still_ours(root) {
            return None;
        }
        match self.store_owner.confirm(root, &self.seal, Claim::No, false) {
            Ok(Ownership::Foreign(r)) => Some(r.reason),
            Ok(_) | Err(_) => None,
        }
    }

    pub(crate) fn governance_context(&self) -> GovernanceContext<'_> {
        GovernanceContext {
            root_paths: &self.root_paths,
            roots: &self.roots,
            state_dir: self.state.path(),
            extensions: &self.config.extensions,
            max_depth: self.config.limits.max_path_depth,
            syncs_folders: self.fsync_each(),
        }
    }

    /// The `state` document. Fails when the registry or the audit trail cannot be read
    /// to count them (another process held one past `limits.lock_wait_seconds`: an
    /// [`Error::Io`] that [`Error::is_busy`] says is busy), rather than counting none.
    pub fn state_doc(&self) -> Result<StateDoc, Error> {
        let (ctx, reason) = self.execution_context();
        let artifacts_total = self
            .registry
            .len()
            .map_err(Error::io("read the artifact registry"))?;
        let audit_entries = self
            .audit
            .get_sandbox_audit_stats()
            .map_err(Error::io("read the audit log"))?
            .total;
        // A root moved, removed or replaced since start, or whose store another state
        // directory claimed since, refuses every write, as one skipped at start does: it
        // is told with those.
        let mut skipped_roots = self.skipped_roots.clone();
        let mut sandbox_roots = Vec::with_capacity(self.roots.len());
        for (i, (root, path)) in self.roots.iter().zip(&self.root_paths).enumerate() {
            let refused = self
                .root_still(i, "this process writes nothing there")
                .err()
                .map(|r| r.reason)
                .or_else(|| self.store_taken(root));
            match refused {
                Some(why) => skipped_roots.push(why),
                None => sandbox_roots.push(path.display().to_string()),
            }
        }
        Ok(StateDoc {
            execution_mode: ctx.mode,
            dry_run_reason: reason,
            phase: self.config.phase.clone(),
            executor_enabled: self.config.enable_write,
            dry_run: self.config.dry_run,
            sandbox_roots,
            skipped_roots,
            state_dir: self.state.path().display().to_string(),
            durability: self.config.durability,
            limits: self.config.limits,
            artifacts_total,
            audit_entries,
            notices: self.notices_now(),
            kernel_confinement: self.kernel_confinement.clone(),
            version: env!("CARGO_PKG_VERSION"),
        })
    }

    /// The start's notices, and the trail found tampered with since (by this process's
    /// appends or reads), which a long-running server would otherwise tell only in its
    /// log.
    fn notices_now(&self) -> Vec<String> {
        let mut notices = self.notices.clone();
        if let Some(problem) = self.audit.head_problem() {
            let notice = tampered_notice(&problem);
            if !notices.contains(&notice) {
                notices.push(notice);
            }
        }
        notices
    }

    /// Governance verdict only (`check`): no write, no audit. The verdict is governance's
    /// (SPEC §5), not the plan's: whether the file is already there, an edit, a budget or
    /// the rate limit are not judged.
    pub fn check(&self, asked: &CheckRequest<'_>) -> CheckVerdict {
        let CheckRequest {
            intent,
            path,
            description,
            size,
            root,
        } = *asked;
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
                self.metrics
                    .denied(intent, r.reason_code, r.is_escape_attempt());
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

    /// Refuses (`conflict`) to change anything in root `i` once its configured path no
    /// longer leads to the directory this process opened (see [`SandboxRoot::in_place`]).
    pub(crate) fn root_in_place(&self, i: usize) -> Verdict {
        self.root_still(i, "nothing was written")
    }

    /// [`Sandbox::root_in_place`] for a read: what the moved directory holds is not what
    /// its path names now.
    fn root_in_place_to_read(&self, i: usize) -> Verdict {
        self.root_still(i, "nothing was read")
    }

    fn root_still(&self, i: usize, so: &str) -> Verdict {
        self.roots[i].in_place().map_err(|now| {
            crate::reason::Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "the sandbox root {} is no longer the directory this process opened at start (it was moved, removed or replaced; the path now holds: {now}); {so}: put the directory back, or restart the runtime to use what is there now",
                    self.root_paths[i].display()
                ),
            )
        })
    }

    /// Execution `execution_id` of this instance left its record for a later recovery.
    pub(crate) fn left_for_later(&self, execution_id: &str) {
        self.left_for_later
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(execution_id.to_owned());
    }

    /// Whether `execution_id` is one of this instance's (see [`Sandbox::left_for_later`]).
    pub(crate) fn is_left_for_later(&self, execution_id: &str) -> bool {
        self.left_for_later
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(execution_id)
    }

    pub(crate) fn abs_path(&self, root_index: usize, rel: &RelPath) -> String {
        join_display(&self.root_paths[root_index], rel)
            .display()
            .to_string()
    }

    /// The changes other runs made to the target of `meta`'s action (in root `root`)
    /// after its snapshot, as the trail records them, earliest first (see
    /// [`AuditLog::changes_since`]).
    pub(crate) fn changes_since_snapshot(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
    ) -> std::io::Result<Vec<crate::audit::SandboxAuditEntry>> {
        let rel = meta.target();
        self.audit.changes_since(
            &rel,
            |recorded| self.names_target(recorded, root, &rel),
            &meta.taken_at,
            &meta.execution_id,
        )
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

    /// Why writes into `target`, which no root of this process holds, cannot be dealt with
    /// here, and what to do, for a `verb` ("rollback", "prune"): a root that was given but
    /// skipped at start is named with why, not called one this process lacks.
    pub(crate) fn absent_root(&self, target: &str, verb: &str) -> (String, String) {
        let path = Path::new(target);
        match self.config.roots.iter().find(|r| path.starts_with(r)) {
            Some(r) => {
                let shown = r.display().to_string();
                let why = self
                    .skipped_roots
                    .iter()
                    .find(|w| w.contains(&shown))
                    .map_or_else(String::new, |w| format!(": {w}"));
                (
                    format!("the root {shown}, which this process skipped at start{why}"),
                    format!("make that root usable, then run the {verb} again"),
                )
            }
            None => (
                "a root this process is not configured with".to_owned(),
                format!(
                    "run the {verb} in a runtime configured with every root the workflow wrote into (roots in the config file, AI_LAB_SANDBOX_ROOTS, or --root once per root)"
                ),
            ),
        }
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
}

pub(super) fn lock_or_recover<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Opens (making it) the configured root `i` at `r` into `opened`; one that cannot be
/// used is skipped, its reason in `skipped`.
fn open_root(
    i: usize,
    r: &Path,
    opened: &mut Vec<(usize, SandboxRoot)>,
    skipped: &mut Vec<String>,
) {
    match SandboxRoot::open_checked(r, true) {
        Ok(root) => opened.push((i, root)),
        Err(why) => {
            tracing::warn!(root = %r.display(), %why, "skipping sandbox root");
            skipped.push(why);
        }
    }
}

/// Refuses roots that are one directory, or one inside another.
fn check_apart(roots: &[SandboxRoot]) -> Result<(), Error> {
    match crate::confine::root::nested_roots(roots) {
        Some((outer, inner)) => Err(Error::RootsOverlap {
            outer: roots[outer].path().to_path_buf(),
            inner: roots[inner].path().to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// Refuses a state directory inside one of `roots` (lexically, or once symbolic links
/// are followed, also for parts of it not made yet).
fn state_dir_outside(state_dir: &Path, roots: &[SandboxRoot]) -> Result<(), Error> {
    // By the directories themselves too: through a mount of a root the path says nothing.
    let through_mount = || {
        let ids = crate::confine::state::ids_along(state_dir);
        roots
            .iter()
            .find(|r| ids.contains(&r.id()))
            .map(|r| (state_dir.to_path_buf(), r))
    };
    match roots
        .iter()
        .find_map(|r| lies_inside(state_dir, r.path()).map(|inside| (inside, r)))
        .or_else(through_mount)
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

/// "1 file", "2 files".
pub(crate) fn counted(n: usize, what: &str) -> String {
    counted_u64(u64::try_from(n).unwrap_or(u64::MAX), what)
}

/// [`counted`] for a count of bytes or artifacts.
pub(crate) fn counted_u64(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn root_inside_state_dir(inside: &Path, state_dir: &Path) -> Error {
    Error::Config(crate::config::ConfigError(format!(
        "root {} lies inside the state directory {} once symbolic links are followed; the runtime's own files are never writable, so give a root outside it",
        inside.display(),
        state_dir.display()
    )))
}

/// Whether a state directory that cannot be made gives way to the user's own: only the
/// default, and only when nothing is there. One that exists and is refused is reported,
/// or another run would quietly use another audit trail.
fn may_fall_back(config: &Config) -> bool {
    !config.state_dir_explicit && default_missing(config)
}

fn default_missing(config: &Config) -> bool {
    config.state_dir == Path::new(DEFAULT_STATE_DIR)
        && !crate::confine::state::exists(&config.state_dir)
}

/// The configured state directory refused for `cause`. The default named explicitly (a
/// config file, `AI_LAB_STATE_DIR`) does not fall back, which its refusal says: the
/// same path left unset would have.
fn state_dir_refused(config: &Config, cause: io::Error) -> Error {
    let refused = |cause| Error::StateDir {
        path: config.state_dir.clone(),
        cause,
    };
    if !config.state_dir_explicit || !default_missing(config) || NotPrivate::is_cause_of(&cause) {
        return refused(cause);
    }
    let kind = cause.kind();
    let words = format!(
        "{}; it was set explicitly, which leaves no fallback: leave the state directory unset to fall back to one of this user's own, or give one this user may create",
        refused(cause)
    );
    refused(io::Error::new(kind, words))
}

fn open_state_dir(config: &Config) -> Result<(StateDir, Option<String>), Error> {
    match StateDir::open_checked(&config.state_dir) {
        Ok(s) => Ok((s, None)),
        Err(e) if may_fall_back(config) => {
            let Some(fallback) = Config::fallback_state_dir(&|k| std::env::var(k).ok()) else {
                // Said, or the operator looks for a fallback that was never tried.
                let more = "nor is there one of this user's own to fall back to: neither XDG_STATE_HOME nor HOME is set to an absolute path; set one, or give a state directory (--state-dir, AI_LAB_STATE_DIR)";
                return Err(state_dir_refused(config, NotPrivate::said_with(e, more)));
            };
            let s = StateDir::open_checked(&fallback).map_err(|cause| Error::StateDir {
                path: fallback.clone(),
                cause,
            })?;
            // The cause goes with the notice: a default refused because someone else
            // could change it is a matter for the operator, not only a missing folder.
            let note = format!(
                "the default state directory {DEFAULT_STATE_DIR} cannot be used ({}); using {} instead",
                state_dir_refused(config, e),
                fallback.display()
            );
            // A notice, which the faces print: logged as well, it was said twice.
            Ok((s, Some(note)))
        }
        Err(cause) => Err(state_dir_refused(config, cause)),
    }
}
/// Refuses, from the configured paths alone, roots and a state directory that would be
/// refused once opened: judged before anything is made, so a refused start leaves
/// nothing behind.
fn refuse_layout_before_making(config: &Config) -> Result<(), Error> {
    // Before any root is made: one that would lie inside the state directory would be
    // made there (and the state directory's own folders after it) only to be refused.
    for r in &config.roots {
        if let Some(inside) = lies_inside(r, &config.state_dir) {
            return Err(root_inside_state_dir(&inside, &config.state_dir));
        }
    }
    // Nor one inside another once symbolic links are followed (also through parts
    // not made yet): it would be made through the link only to be refused below.
    for (i, a) in config.roots.iter().enumerate() {
        for b in config.roots.iter().skip(i + 1) {
            if let Some((outer, inner)) = [(a, b), (b, a)]
                .into_iter()
                .find(|(o, inner)| lies_inside(inner, o).is_some())
            {
                return Err(Error::RootsOverlap {
                    outer: outer.clone(),
                    inner: inner.clone(),
                });
            }
        }
    }
    // Nor when the state directory will be refused below: a refused start leaves
    // nothing behind. Judged on what exists now; the checks on the opened directories
    // stand.
    for r in &config.roots {
        if let Some(inside) = lies_inside(&config.state_dir, r) {
            return Err(Error::StateDirInsideRoot {
                state_dir: inside,
                root: r.clone(),
            });
        }
    }
    if !may_fall_back(config) {
        StateDir::probe(&config.state_dir).map_err(|cause| state_dir_refused(config, cause))?;
    }
    Ok(())
}

/// The configured roots as found before the state directory is opened.
struct RootsFound {
    /// The roots that exist, opened, each with its index in the configuration.
    opened: Vec<(usize, SandboxRoot)>,
    /// The indices of those missing, made (or not) once the state directory is open.
    missing: Vec<usize>,
    /// Why each root that cannot be used was skipped.
    skipped: Vec<String>,
}

/// Opens the roots that exist, leaving the missing ones for [`make_missing_roots`]:
/// whether one may be made depends on the run records in the state directory, not open
/// yet. Refuses a start with nothing to write into, roots one inside another, and a
/// state directory inside a root, before opening it makes folders: through a symlink
/// into a root they would be made inside the sandbox.
fn open_existing_roots(config: &Config) -> Result<RootsFound, Error> {
    // Roots that exist are opened now; those missing are made once the state
    // directory says whether an interrupted run wrote into them (below).
    let mut opened: Vec<(usize, SandboxRoot)> = Vec::new();
    let mut missing = Vec::new();
    let mut skipped = Vec::new();
    for (i, r) in config.roots.iter().enumerate() {
        if !SandboxRoot::exists(r) {
            // Judged now by what stands on its way: a start refused for want of a root
            // must not leave a state directory made for nothing.
            match SandboxRoot::refused_before_made(r) {
                Some(why) => {
                    tracing::warn!(root = %r.display(), %why, "skipping sandbox root");
                    skipped.push(why);
                }
                None => missing.push(i),
            }
            continue;
        }
        open_root(i, r, &mut opened, &mut skipped);
    }
    if opened.is_empty() && missing.is_empty() {
        return Err(Error::NoUsableRoot { problems: skipped });
    }
    let (order, roots): (Vec<usize>, Vec<SandboxRoot>) = opened.into_iter().unzip();
    check_apart(&roots)?;
    // Checked before the state directory is opened, since opening makes folders in
    // it: through a symlink into a root they would be made inside the sandbox.
    state_dir_outside(&config.state_dir, &roots)?;
    Ok(RootsFound {
        opened: order.into_iter().zip(roots).collect(),
        missing,
        skipped,
    })
}

/// Makes the missing roots no interrupted run wrote into, and returns the usable
/// roots in the order configured with why the others were skipped. The roots made just
/// now are checked as the others were, since making them may have gone through a link.
fn make_missing_roots(
    config: &Config,
    state: &StateDir,
    found: RootsFound,
) -> Result<(Vec<SandboxRoot>, Vec<String>), Error> {
    let RootsFound {
        mut opened,
        missing,
        mut skipped,
    } = found;
    // A missing root an interrupted run wrote into (or one inside it, or holding it)
    // is not made: made empty, it would be taken for what the run left there
    // (perhaps only moved away for a moment), every write of the run for never made.
    // It is skipped, and the run left, until it is back (or the operator makes it,
    // giving up what the run left there).
    // Every run record is read for it: only when a root is missing.
    let wrote_into = if missing.is_empty() {
        Vec::new()
    } else {
        crate::recovery::roots_awaiting_recovery(state)
    };
    for i in missing {
        let r = &config.roots[i];
        // Looked at again: a process starting at the same moment may have made it
        // since, and its run ended, leaving a record read as it ran.
        let awaited = wrote_into
            .iter()
            .map(Path::new)
            .any(|w| w.starts_with(r) || r.starts_with(w))
            && !SandboxRoot::exists(r);
        if awaited {
            let why = format!(
                "root {} was missing at start while an interrupted run had written into it, so it was not made: put it back as the run left it (or make it, to give up what the run left there)",
                r.display()
            );
            tracing::warn!(%why, "skipping sandbox root");
            skipped.push(why);
            continue;
        }
        open_root(i, r, &mut opened, &mut skipped);
    }
    // In the order configured: a path without a root goes to the first.
    opened.sort_by_key(|(i, _)| *i);
    let roots: Vec<SandboxRoot> = opened.into_iter().map(|(_, r)| r).collect();
    if roots.is_empty() {
        return Err(Error::NoUsableRoot { problems: skipped });
    }
    // Again, with the roots made just now.
    check_apart(&roots)?;
    state_dir_outside(state.path(), &roots)?;
    Ok((roots, skipped))
}

/// Keeps the roots whose snapshot store is this state directory's, or no one's yet,
/// claiming those there and unclaimed as `claim` allows; a root another state directory claimed is
/// skipped, saying whose it is (see [`StoreOwner`]); one claimed again is said in the
/// start's notices. A store that cannot be read is looked at again before the first
/// snapshot taken in it.
fn confirm_stores(
    roots: Vec<SandboxRoot>,
    (skipped, notices): (&mut Vec<String>, &mut Vec<String>),
    owner: &StoreOwner,
    key: &crate::seal::SealKey,
    claim: Claim,
    durable: bool,
) -> Result<Vec<SandboxRoot>, Error> {
    let mut kept = Vec::with_capacity(roots.len());
    for root in roots {
        match owner.confirm(&root, key, claim, durable) {
            Ok(Ownership::Foreign(r)) => {
                tracing::warn!(why = %r.reason, "skipping sandbox root");
                skipped.push(r.reason);
                continue;
            }
            Ok(Ownership::Unsettled) => {}
            Ok(Ownership::Ours(stamp, settled)) => {
                notices.extend(settled_said(&root, stamp, &settled));
            }
            Err(r) => {
                tracing::warn!(root = %root.path().display(), why = %r.reason, "could not confirm whose the snapshot store is");
            }
        }
        kept.push(root);
    }
    if kept.is_empty() {
        return Err(Error::NoUsableRoot {
            problems: std::mem::take(skipped),
        });
    }
    Ok(kept)
}

/// The execution context `config` sets and, when simulating, why.
fn context_of(config: &Config) -> (ExecutionContext, Option<DryRunReason>) {
    ExecutionContext::from_flags(
        config.enable_write,
        config.dry_run,
        phase_supports_sandbox_write(&config.phase),
    )
}

/// Whether `root`'s owner record is still the file last found naming this state
/// directory, unchanged (one `fstatat`).
fn still_ours(root: &SandboxRoot) -> bool {
    let record = format!("{}/{}", crate::confine::path::ROLLBACK_DIR, OWNER_FILE);
    root.store_record().is_some_and(|was| {
        crate::confine::root::stamp_at(root.dir(), &record).ok() == Some(Some(was))
    })
}

/// Records `root`'s store as this state directory's (its owner record as `stamp`
/// describes it) and, when the record was made to name it again, says so in the log
/// and returns the words for a start's notices.
fn settled_said(
    root: &SandboxRoot,
    stamp: crate::confine::root::FileStamp,
    settled: &Settled,
) -> Option<String> {
    root.set_store_record(Some(stamp));
    let said = settled_words(root, settled);
    if let Some(said) = &said {
        tracing::warn!(%said, "a snapshot store's owner record now names this state directory");
    }
    said
}

/// What is said of a store whose owner record was made to name this state directory,
/// if anything.
fn settled_words(root: &SandboxRoot, settled: &Settled) -> Option<String> {
    let root = root.path().display();
    match settled {
        Settled::Already | Settled::Claimed(0) => None,
        Settled::Claimed(n) => Some(format!(
            "the snapshot store of root {root} held the snapshots of {} and no owner record (made before owner records were, or its record was removed): it is now claimed for this state directory; if another state directory's runtime wrote them, its writes in this root are now refused",
            counted(*n, "workflow")
        )),
        Settled::ClaimedAgain => Some(format!(
            "the snapshot store of root {root} named this state directory under an earlier seal key: it is claimed again with the present one; the snapshots sealed with the earlier key stay refused"
        )),
        // The path it had is not told: an agent reads the notices too.
        Settled::Moved(_) => Some(format!(
            "the snapshot store of root {root} named this state directory at another path (moved since, or put back from a copy): its record now names it as it is, so that a copy left there is refused"
        )),
    }
}

/// The target locks (see [`Sandbox::lock_target`]), made once so that every thread of
/// this runtime takes the same ones, waited for as long as the state directory's.
fn target_lock_set(state: &StateDir) -> crate::confine::state::LockSet {
    crate::confine::state::LockSet::new(
        state,
        (0..TARGET_LOCK_STRIPES)
            .map(|i| format!("target-{i:02}"))
            .collect(),
        state.lock_wait(),
    )
}

/// Refuses a root that is (or lies inside) a folder of the state directory mounted
/// there, and has each root refuse writes into the state directory's folders and the
/// other roots: a bind mount shows them under paths no lexical check sees.
fn reserve_state_dir_in_roots(state: &StateDir, roots: &mut [SandboxRoot]) -> Result<(), Error> {
    let state_ids = state
        .dir_ids()
        .map_err(Error::io("look at the state directory"))?;
    // Every folder of the state directory: a root mounted from any of them lies in it.
    let state_tree = state
        .tree_dir_ids()
        .map_err(Error::io("look at the state directory"))?;
    let root_ids: Vec<((u64, u64), String)> = roots
        .iter()
        .map(|r| (r.id(), format!("the sandbox root {}", r.path().display())))
        .collect();
    for (i, root) in roots.iter_mut().enumerate() {
        // By the directories themselves, which a bind mount shows under another path.
        let what = match state_ids.iter().position(|id| *id == root.id()) {
            Some(0) => Some("is the state directory"),
            Some(_) => Some("is a folder of the state directory"),
            None if state_tree.contains(&root.id())
                || state_tree.iter().any(|id| root.reached_through(*id)) =>
            {
                Some("lies inside the state directory")
            }
            None => None,
        };
        if let Some(what) = what {
            return Err(Error::Config(crate::config::ConfigError(format!(
                "root {} {what} {} (mounted there); the runtime's own files are never writable, so give a root apart from it",
                root.path().display(),
                state.path().display()
            ))));
        }
        // Every folder of the state directory, not only the runtime's own: one mounted
        // into a root would let actions write beside the runtime's files.
        let mut reserved: Vec<((u64, u64), String)> = state_tree
            .iter()
            .map(|id| {
                let what = if *id == state_ids[0] {
                    "the runtime's state directory"
                } else {
                    "a folder of the runtime's state directory"
                };
                (*id, what.to_owned())
            })
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
    Ok(())
}

/// Refuses a root inside the state directory in use once symbolic links are followed,
/// judged on the directories as opened: the check before anything was made saw the
/// configured state directory only, and the roots before they were made.
fn refuse_roots_inside_state_dir(roots: &[SandboxRoot], state: &StateDir) -> Result<(), Error> {
    for root in roots {
        if let Some(inside) = lies_inside(root.path(), state.path()) {
            return Err(root_inside_state_dir(&inside, state.path()));
        }
    }
    Ok(())
}

/// With batched durability on Linux, the handles the sync points sync whole
/// filesystems through (every root's and the state directory's); none otherwise, each
/// file and directory being synced as written.
fn open_batch_sync(
    config: &Config,
    roots: &[SandboxRoot],
    state: &StateDir,
) -> Result<Option<crate::confine::state::FsSync>, Error> {
    if config.durability == crate::config::Durability::Batched && cfg!(target_os = "linux") {
        let mut dirs: Vec<&Path> = roots.iter().map(SandboxRoot::path).collect();
        dirs.push(state.path());
        match crate::confine::state::FsSync::open(&dirs) {
            Ok(s) => Ok(Some(s)),
            // A setting to change, not a failing disk.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                Err(Error::Config(crate::config::ConfigError(e.to_string())))
            }
            Err(e) => Err(Error::io("open the filesystems for syncing")(e)),
        }
    } else {
        Ok(None)
    }
}

/// The runtime's own files in the state directory a start opens.
struct StateFiles {
    registry: ArtifactRegistry,
    audit: AuditLog,
    left_dirs: crate::left_dirs::LeftDirs,
    seal: crate::seal::SealKey,
}

impl StateFiles {
    /// Opens the registry, the audit log and the ledger of directories rollbacks left,
    /// then the seal key, which is made before the trail's first line: a trail with
    /// lines and no key lost its key.
    fn open(
        config: &Config,
        state: &StateDir,
        batched: bool,
        failpoints: &Arc<crate::failpoint::FailPoints>,
    ) -> Result<Self, Error> {
        // With batched syncs the logs are made durable by the executor's sync points.
        let durable = config.durability.is_durable() && !batched;
        let registry = ArtifactRegistry::open(state, durable)
            .map_err(Error::io("open the artifact registry"))?;
        let mut audit =
            AuditLog::open_with(state, durable, config.limits.writes_per_minute, batched)
                .map_err(Error::io("open the audit log"))?;
        let left_dirs = crate::left_dirs::LeftDirs::open(state, durable)
            .map_err(Error::io("open the ledger of directories rollbacks left"))?;
        audit.share_failpoints(failpoints.clone());
        // Every start makes the key before its first trail line: a trail with lines and
        // no key lost its key.
        let entries = audit.last_seq().map_err(Error::io("read the audit log"))?;
        let made_for = (entries > 0).then(|| {
            format!(
                "an audit trail of {}",
                counted(usize::try_from(entries).unwrap_or(usize::MAX), "line")
            )
        });
        let seal = crate::seal::SealKey::new(
            state
                .secret(crate::seal::KEY_FILE, made_for.as_deref())
                .map_err(Error::io("read or create the snapshot seal key"))?,
        );
        Ok(Self {
            registry,
            audit,
            left_dirs,
            seal,
        })
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

/// `.rollback/{workflow}` in the root at `root`.
pub(crate) fn workflow_folder(root: &Path, workflow_id: &str) -> PathBuf {
    root.join(crate::confine::path::ROLLBACK_DIR)
        .join(workflow_id)
}

/// What stands at `.rollback/{workflow}` in `root`, looked at without following a link.
pub(crate) fn workflow_folder_in(
    root: &SandboxRoot,
    workflow_id: &str,
) -> io::Result<cap_std::fs::Metadata> {
    root.dir().symlink_metadata(format!(
        "{}/{workflow_id}",
        crate::confine::path::ROLLBACK_DIR
    ))
}

/// The notice of an audit trail found not to match its head.
fn tampered_notice(problem: &str) -> String {
    format!(
        "the audit trail was tampered with: {problem}; its head is kept as it is so `audit verify` keeps reporting it"
    )
}
