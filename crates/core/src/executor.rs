//! The plan executor behind [`Sandbox::run_plan`](crate::Sandbox::run_plan) (SPEC §6):
//! the whole plan is validated first against the tree as its earlier actions would leave
//! it; then, per action: governance → budget → rate limit → the new bytes rendered and
//! checksummed → snapshot → atomic mutation → artifact registry → audit. A failure
//! restores the action at once and, with `on_failure: rollback`, every earlier action of
//! the run.

use crate::artifact::ArtifactEntry;
use crate::audit::{AuditRecord, AuditStatus};
use crate::budget::{Usage, check_budget, check_rate};
use crate::catalog::{MutationClass, Operation, RiskLevel, op_for_intent};
use crate::commit_log::Position;
use crate::confine::path::{resolve_sandbox_path, shown_path};
use crate::confine::root::{
    FILE_MODE, FileStamp, Make, Put, StagedWrite, not_a_directory, temp_name,
};
use crate::confine::{RelPath, TargetKind};
use crate::context::DryRunReason;
use crate::hash::sha256_hex;
use crate::metrics::RollbackReason;
use crate::plan::{Action, OnFailure, ValidPlan, check_payload, new_execution_id, render};
use crate::policy::{
    Approval, GovernanceRequest, assess_sandbox_risk, check_found_kind, check_size, check_target,
    resolve_target,
};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::Sandbox;
use crate::snapshot::{
    MAX_SNAPSHOT_BYTES, SnapshotCommit, SnapshotKind, SnapshotMeta, Snapshotter, StoredSnapshot,
};
use crate::workflow::{TimelineEvent, WorkflowState};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The words a failed action's reason carries when undoing its own change failed too
/// (faces that summarise the outcome must not say the change was undone).
pub const UNDO_FAILED: &str = "undoing its change failed";

wire_enum! {
    /// Overall outcome of a run.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RunStatus {
        /// Every action was written.
        Success = "success",
        /// Nothing was written (writing off, dry-run on, or a phase that allows reads only),
        /// and every action would have been.
        SimulatedSuccess = "simulated_success",
        /// The plan was refused before anything was written: each refused action says why,
        /// the others are skipped. Whatever refused it (a path, a budget, the rate limit),
        /// nothing changed.
        Blocked = "blocked",
        /// An action failed while writing (its own change undone); under `on_failure:
        /// "stop"` the earlier writes remain.
        Failed = "failed",
        /// An action failed and, under `on_failure: "rollback"` (the default), the plan's
        /// earlier writes were undone too.
        RolledBack = "rolled_back",
    }
}

wire_enum! {
    /// Outcome of one action.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ActionStatus {
        /// Written.
        Success = "success",
        /// Would have been written.
        Simulated = "simulated",
        /// Refused by governance, budget or rate limit; nothing written.
        Blocked = "blocked",
        /// Not run because another action was refused or failed.
        Skipped = "skipped",
        /// Tried and failed; its own change was undone.
        Failed = "failed",
        /// Written, then undone because a later action failed.
        RolledBack = "rolled_back",
    }
}

/// One action's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionResult {
    /// The action's id, as given or made (`act_…`).
    pub action_id: String,
    /// Its intent, as given.
    pub intent: String,
    /// The intent's class (`create`, `append`, `replace`, …); `None` for an intent the catalog does
    /// not know.
    pub mutation_class: Option<MutationClass>,
    /// The path, as given.
    pub path: String,
    /// What became of it.
    pub status: ActionStatus,
    /// Why it was refused or failed (`None` when it was not).
    pub reason_code: Option<ReasonCode>,
    /// The same, in a sentence saying what to do.
    pub reason: Option<String>,
    /// The operation's risk.
    pub risk: RiskLevel,
    /// SHA-256 (hex) of the target before the action; `None` when there was no file.
    pub before_checksum: Option<String>,
    /// SHA-256 (hex) of the target as written (or as it would be, when simulated); `None`
    /// for a directory or an action not run.
    pub after_checksum: Option<String>,
    /// Size of the target as written, in bytes.
    pub size_bytes: Option<u64>,
    /// The artifact registered for the write.
    pub artifact_id: Option<String>,
    /// Where its snapshot is, relative to the action's root (`.rollback/{workflow}/{action}`).
    pub rollback_path: Option<String>,
    /// For a `rate_limited` action: whole seconds until its writes are allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

impl ActionResult {
    /// An action's result before anything is known of its work: no operation class,
    /// reason, checksums, size, artifact or snapshot yet.
    pub fn new(
        action_id: impl Into<String>,
        intent: impl Into<String>,
        path: impl Into<String>,
        status: ActionStatus,
        risk: RiskLevel,
    ) -> Self {
        Self {
            action_id: action_id.into(),
            intent: intent.into(),
            mutation_class: None,
            path: path.into(),
            status,
            reason_code: None,
            reason: None,
            risk,
            before_checksum: None,
            after_checksum: None,
            size_bytes: None,
            artifact_id: None,
            rollback_path: None,
            retry_after_seconds: None,
        }
    }
}

/// The run result (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The workflow, as given or made (`wf_…`).
    pub workflow_id: String,
    /// This run's id (`ex_…`), on each of its audit lines.
    pub execution_id: String,
    /// The outcome.
    pub status: RunStatus,
    /// Whether nothing could have been written (writing off, dry-run on, a read-only
    /// phase): then [`RunResult::dry_run_reason`] says why.
    pub simulation_only: bool,
    /// Why the run only simulated, or why it was refused (`governance_blocked`).
    pub dry_run_reason: Option<DryRunReason>,
    /// Where the run's state machine ended (`done`, `failed`, `rolled_back`).
    pub state: WorkflowState,
    /// One result per action, in the plan's order.
    pub actions: Vec<ActionResult>,
    /// What happened, in order, with times.
    pub timeline: Vec<TimelineEvent>,
}

impl RunResult {
    /// Whether the run wrote everything it was asked to (not a simulation: see
    /// [`RunResult::is_simulated`]), as [`crate::sandbox::RollbackReport::is_success`]
    /// means a rollback that restored.
    pub fn is_success(&self) -> bool {
        self.status == RunStatus::Success
    }

    /// Whether the run only said what it would write, and would have succeeded (writes
    /// off or dry-run on).
    pub fn is_simulated(&self) -> bool {
        self.status == RunStatus::SimulatedSuccess
    }
}

/// What validation found for an action that passed.
#[derive(Debug, Clone)]
struct Prepared {
    approval: Approval,
    /// Bytes that would be on disk (`None` for a directory).
    bytes: Option<Bytes>,
    /// The checksum of what the target holds, when validation read it for a simulation.
    before_checksum: Option<String>,
}

/// What validation carries from one action of the plan to the next.
struct Tally {
    /// The tree as the earlier actions would leave it.
    sketch: Sketch,
    /// What the workflow's earlier runs registered (its budget's use).
    registered: Verdict<Usage>,
    /// What the plan's actions judged so far would register.
    planned: Usage,
    /// Writes only the rate limit held back: they count against the budget of the
    /// actions after them, so a plan over both limits is told of the budget now rather
    /// than once its rate-limited part was sent again and written.
    held_back: Usage,
    /// The plan's writes counted against the rate limit so far, and in all.
    writes: u32,
    plan_writes: u32,
    /// The rate limiter's state, and the time it is judged at.
    tat: Verdict<f64>,
    now: chrono::DateTime<chrono::Utc>,
    /// Roots whose snapshot store was checked.
    stores_checked: std::collections::HashSet<usize>,
}

/// What an action refused by a limit alone would leave: root, path, bytes.
type Left = (usize, RelPath, Option<Bytes>);

/// The virtual tree during validation: what earlier actions of the plan would leave.
#[derive(Debug, Clone)]
enum Virtual {
    /// A file, and its bytes when they were read (only where they matter).
    File(Option<Bytes>),
    Dir,
}

/// What the plan's earlier actions would leave, by root and path below it, as
/// validation goes through them.
#[derive(Debug, Default)]
struct Sketch {
    tree: HashMap<(usize, String), Virtual>,
    /// Bytes made for actions refused by a limit alone, kept for the actions after
    /// them; past the workflow's byte budget they are not kept (the plan is refused
    /// already), so that a plan of a thousand appends to large files never holds a
    /// thousand renderings.
    kept_refused: u64,
    /// The files whose bytes were not kept, and the code that refused the action that
    /// made them.
    unkept: HashMap<(usize, String), ReasonCode>,
}

impl Sketch {
    /// Refuses a target in root `ri` beneath a path an earlier action makes a file, as
    /// the disk would refuse it at run time, before anything of the plan is written; and
    /// an operation `op` that reads the target, of a file whose bytes were not kept: what
    /// it leaves is not judged on a guess, but refused with the earlier action's code.
    /// Gives the target's key.
    fn check(
        &self,
        ri: usize,
        rel: &RelPath,
        op: &Operation,
        path: &str,
    ) -> Result<(usize, String), Refusal> {
        let comps = rel.components();
        for d in 1..comps.len() {
            if let Some(Virtual::File(_)) = self.tree.get(&(ri, comps[..d].join("/"))) {
                return Err(not_a_directory(&comps[..d]));
            }
        }
        let key = (ri, rel.as_string());
        if let Some(code) = self.unkept.get(&key)
            && op.reads_target()
        {
            return Err(Refusal::new(
                *code,
                format!(
                    "not judged: an earlier action of the plan on '{path}' was refused ({code}), and what it would have written there is not kept"
                ),
            ));
        }
        Ok(key)
    }

    /// What an action leaves at `rel` in root `ri`: a file of `bytes`, or a folder when
    /// none; with the folders above it. Bytes made for an action `refused` by a limit
    /// alone are kept within the workflow's byte `budget`.
    fn leave(
        &mut self,
        (ri, rel): (usize, &RelPath),
        bytes: Option<Bytes>,
        refused: Option<ReasonCode>,
        actions: &[Action],
        budget: u64,
    ) {
        let comps = rel.components();
        for d in 1..comps.len() {
            self.tree.insert((ri, comps[..d].join("/")), Virtual::Dir);
        }
        let key = (ri, rel.as_string());
        let v = match (bytes, refused) {
            (None, _) => Virtual::Dir,
            (Some(b @ Bytes::Made(_)), Some(code)) => {
                self.kept_refused += b.of(actions).len() as u64;
                // Past the budget: the file is known to be there, its bytes not kept
                // (see `unkept`).
                if self.kept_refused <= budget {
                    Virtual::File(Some(b))
                } else {
                    self.unkept.insert(key.clone(), code);
                    Virtual::File(None)
                }
            }
            (Some(b), _) => Virtual::File(Some(b)),
        };
        if let Virtual::File(Some(_)) = v {
            self.unkept.remove(&key);
        }
        self.tree.insert(key, v);
    }
}

/// Bytes validation found or made, shared rather than copied (an action's content may be
/// megabytes, and later actions of the plan, or a simulation, look at them again).
#[derive(Debug, Clone)]
enum Bytes {
    /// The content of the plan's action of that index, as given.
    Content(usize),
    /// Read from the disk, or made by the operation.
    Made(Arc<Vec<u8>>),
}

impl Bytes {
    fn of<'a>(&'a self, actions: &'a [Action]) -> &'a [u8] {
        match self {
            Bytes::Content(i) => actions[*i].content.as_deref().unwrap_or("").as_bytes(),
            Bytes::Made(b) => b,
        }
    }
}

/// Runs one plan.
#[derive(Debug)]
pub(crate) struct SandboxWriteExecutor<'a> {
    sb: &'a Sandbox,
    plan: ValidPlan,
    execution_id: String,
    state: WorkflowState,
    timeline: Vec<TimelineEvent>,
    /// The run's record, once it executes (commit log entries carry it).
    record: Option<crate::recovery::InflightRecord>,
    /// The record's file, held open from the check for a dead run to the run's end.
    record_file: Option<crate::confine::state::BlockFile>,
    /// Why a failed action's own change could not be undone, if it could not: the change
    /// is still on disk, so the run is not rolled back, whatever else it undoes.
    undo_failed: Option<String>,
    /// The action whose own change was last undone: its snapshot is restored, so its
    /// failure line offers no rollback.
    undone: Option<String>,
    /// Set when a restore's audit line could not be appended (its mark is on disk): the
    /// run's record then says so, and the next run or start audits the restore from its
    /// mark, as after a crash.
    unrecorded: std::rc::Rc<std::cell::Cell<bool>>,
    /// Set when a failed action's change could not be undone: the run's record then
    /// stays `active`, so that the next run of the workflow or the next start judges
    /// its actions against the disk, as after a crash (a write whose audit line and
    /// undo both failed, on a full disk, stood on no line of the trail).
    unsettled: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Sandbox {
    /// Parses, validates and runs (or simulates) a plan given as JSON. A plan that cannot
    /// be parsed, or whose ids are invalid, is refused before anything happens.
    pub fn run_plan_json(&self, json: &[u8]) -> Verdict<RunResult> {
        let refused = match crate::plan::parse_plan(json) {
            Ok(plan) => match self.run_plan(plan) {
                Err(r) => r,
                done => return done,
            },
            Err(r) => r,
        };
        self.audit_probes_of_unread_plan(json);
        Err(refused)
    }

    /// Puts on the trail, blocked, what a plan refused unread readably asks for that is
    /// forbidden ([`crate::probes`]), as a plan holding it alone would be.
    fn audit_probes_of_unread_plan(&self, json: &[u8]) {
        let Some(plan) = crate::probes::of_unread_plan(json) else {
            return;
        };
        if let Err(r) = self.run_plan(plan) {
            tracing::warn!(reason = %r, "could not audit the forbidden actions of a plan refused unread");
        }
    }

    /// Validates and runs (or simulates) a plan.
    pub fn run_plan(&self, plan: crate::plan::Plan) -> Verdict<RunResult> {
        let plan = plan.validate()?;
        let result = SandboxWriteExecutor::new(self, plan).run();
        self.sync_if_logs_are_long();
        Ok(result)
    }
}

impl<'a> SandboxWriteExecutor<'a> {
    /// A run of `plan` on `sb`.
    pub(crate) fn new(sb: &'a Sandbox, plan: ValidPlan) -> Self {
        Self {
            sb,
            plan,
            execution_id: new_execution_id(),
            state: WorkflowState::Planning,
            timeline: Vec::new(),
            record: None,
            record_file: None,
            undo_failed: None,
            undone: None,
            unrecorded: std::rc::Rc::default(),
            unsettled: std::rc::Rc::default(),
        }
    }

    fn event(&mut self, event: &str, detail: serde_json::Value) {
        self.timeline.push(TimelineEvent {
            at: self.sb.now(),
            event: event.to_owned(),
            detail,
        });
    }

    fn go(&mut self, to: WorkflowState) {
        match crate::workflow::transition(self.state, to) {
            Ok(s) => {
                let from = self.state;
                self.state = s;
                self.event("state_changed", json!({"from": from, "to": to}));
            }
            Err(e) => {
                // A bug of the executor's: tests fail on it, a release build logs it and
                // goes on (the run's outcome is decided by its actions, not its state).
                debug_assert!(false, "workflow state machine refused a transition: {e}");
                tracing::error!(%e, "workflow state machine refused a transition");
            }
        }
    }

    fn request<'b>(&self, a: &'b Action) -> GovernanceRequest<'b>
    where
        'a: 'b,
    {
        GovernanceRequest {
            intent: &a.intent,
            path: &a.path,
            phase: &self.sb.config.phase,
            root: a.root.as_deref(),
            description: a.description.as_deref(),
            tool: a.tool.as_deref(),
        }
    }

    /// Runs the plan.
    pub(crate) fn run(mut self) -> RunResult {
        let wf = self.plan.workflow_id.clone();
        self.event(
            "execution_started",
            json!({"workflow_id": wf, "actions": self.plan.actions.len(), "on_failure": self.plan.on_failure}),
        );
        let (ctx, sim_reason) = self.sb.execution_context();
        let lock = self.sb.state.lock_workflow(&wf);
        if let Err(e) = &lock {
            let r = crate::sandbox::workflow_lock_refusal(&wf, e);
            return self.blocked(vec![Err(r)], !ctx.writes());
        }
        // Before validation, which must see the tree as the dead run's recovery leaves it;
        // after the restores held back before it (its own among them) are recorded.
        if ctx.writes() {
            match self.sb.settle_before_change(&wf) {
                Ok(file) => self.record_file = file,
                Err(r) => return self.blocked(vec![Err(r)], false),
            }
        }
        let checks = self.validate(ctx.writes());
        if let Err(r) = self.sb.fail_at("after_validate") {
            return self.blocked(vec![Err(r)], !ctx.writes());
        }
        if checks.iter().any(Result::is_err) {
            return self.blocked(checks, !ctx.writes());
        }
        let prepared: Vec<Prepared> = checks.into_iter().flatten().collect();
        let roots = self
            .sb
            .root_names(prepared.iter().map(|p| p.approval.resolved.root_index));
        if let Err(r) = self.sb.record_room(&roots, false) {
            let checks = prepared.iter().map(|_| Err(r.clone())).collect();
            return self.blocked(checks, !ctx.writes());
        }
        if !ctx.writes() {
            return self.simulate(prepared, sim_reason);
        }
        self.execute(roots)
    }

    /// Validation of the whole plan against the tree as its earlier actions would leave
    /// it. Budgets and the rate limit are checked in simulation too; only real writes
    /// consume them. A file's current bytes are read only where the result depends on
    /// them (appends, transforms) or a simulation reports their checksum: the execution
    /// reads them again for the snapshot anyway.
    fn validate(&self, executable: bool) -> Vec<Result<Prepared, Refusal>> {
        let sb = self.sb;
        let gctx = sb.governance_context();
        let mut t = Tally {
            sketch: Sketch::default(),
            registered: self.registered_usage(),
            planned: Usage::default(),
            held_back: Usage::default(),
            writes: 0,
            plan_writes: u32::try_from(
                self.plan
                    .actions
                    .iter()
                    .filter(|a| crate::catalog::is_sandbox_write_intent(&a.intent))
                    .count(),
            )
            .unwrap_or(u32::MAX),
            tat: self.rate_tat(),
            now: sb.clock.now(),
            stores_checked: std::collections::HashSet::new(),
        };
        let mut out = Vec::new();
        for (k, a) in self.plan.actions.iter().enumerate() {
            // An action refused by a limit alone (budget, rate) is otherwise sound: the
            // actions after it are judged on the tree as it would leave it, so that what
            // they are told is true of the plan, not of the plan without it (a 429 must
            // mean the plan runs once the wait is over).
            let mut only_limited: Option<Left> = None;
            let r = self.judge(k, a, executable, &gctx, &mut t, &mut only_limited);
            let left = match (&r, only_limited) {
                (Ok(p), _) => {
                    if let Some(b) = &p.bytes {
                        t.planned.artifacts += 1;
                        t.planned.bytes += b.of(&self.plan.actions).len() as u64;
                    }
                    let (ri, rel) = (p.approval.resolved.root_index, &p.approval.resolved.rel);
                    Some((ri, rel.clone(), p.bytes.clone()))
                }
                (Err(_), left) => left,
            };
            if let Some((ri, rel, bytes)) = left {
                let refused = r.as_ref().err().map(|refused| refused.reason_code);
                let (actions, budget) = (&self.plan.actions, sb.config.limits.max_workflow_bytes);
                t.sketch.leave((ri, &rel), bytes, refused, actions, budget);
            }
            out.push(r);
        }
        out
    }

    /// One action `a` (the `k`-th) judged against the tree the earlier ones leave
    /// (`t.sketch`): governance, payload, ids, the target as it would be found, what it
    /// would leave, its size, then the limits. Refused by a limit alone, what it would
    /// leave is set in `only_limited`.
    fn judge(
        &self,
        k: usize,
        a: &Action,
        executable: bool,
        gctx: &crate::policy::GovernanceContext<'_>,
        t: &mut Tally,
        only_limited: &mut Option<Left>,
    ) -> Verdict<Prepared> {
        let sb = self.sb;
        let approval = check_target(&self.request(a), gctx)?;
        check_payload(approval.op, a)?;
        check_parent_artifact(sb, a)?;
        let ri = approval.resolved.root_index;
        self.check_new_id(a, ri)?;
        if t.stores_checked.insert(ri) {
            crate::snapshot::check_store(&sb.roots[ri], Some(&self.plan.workflow_id))?;
        }
        let key = t
            .sketch
            .check(ri, &approval.resolved.rel, approval.op, &a.path)?;
        let current = self.found_at(&t.sketch, &key, &approval, a, executable)?;
        if let Some(found) = &current {
            let is_dir = matches!(found, Virtual::Dir);
            check_found_kind(approval.op, &approval.resolved.rel, is_dir)?;
        }
        let before = match &current {
            // Unread bytes do not change the result (render needs to know only that the
            // file exists).
            Some(Virtual::File(b)) => {
                Some(b.as_ref().map_or(&[][..], |b| b.of(&self.plan.actions)))
            }
            _ => None,
        };
        let bytes = render(approval.op, a, &approval.ext, before)?.map(|b| match b {
            Cow::Borrowed(_) => Bytes::Content(k),
            Cow::Owned(b) => Bytes::Made(Arc::new(b)),
        });
        let size = bytes
            .as_ref()
            .map_or(0, |b| b.of(&self.plan.actions).len() as u64);
        check_size(&approval, size, &sb.config.extensions)?;
        if let Err(r) = self.check_limits(t, bytes.is_some(), size)? {
            *only_limited = Some((ri, approval.resolved.rel.clone(), bytes));
            return Err(r);
        }
        // Hashed last, and for a simulation only, which reports it: an action refused
        // above never needs it, and a real write hashes what it finds under the target's
        // lock.
        let before_checksum = match &current {
            Some(Virtual::File(Some(b))) if !executable => {
                Some(sha256_hex(b.of(&self.plan.actions)))
            }
            _ => None,
        };
        Ok(Prepared {
            approval,
            bytes,
            before_checksum,
        })
    }

    /// What an action finds at its target (`key` in `sketch`): what an earlier action
    /// of the plan leaves there, else what is on disk, its bytes read only where the
    /// result depends on them or a simulation reports their checksum. A file too large
    /// for the action is refused from its size before its bytes are read or hashed.
    fn found_at(
        &self,
        sketch: &Sketch,
        key: &(usize, String),
        approval: &Approval,
        a: &Action,
        executable: bool,
    ) -> Verdict<Option<Virtual>> {
        let rel = &approval.resolved.rel;
        Ok(match sketch.tree.get(key) {
            // As for a file on disk (a thousand appends past the limit of a large file an
            // earlier action makes would each copy and hash it).
            Some(v @ Virtual::File(Some(b))) => {
                check_existing_size(approval.op, a, rel, b.of(&self.plan.actions).len() as u64)?;
                Some(v.clone())
            }
            Some(v) => Some(v.clone()),
            None => match approval.target.as_ref().map(|t| t.kind) {
                Some(TargetKind::File { size, .. }) => {
                    check_existing_size(approval.op, a, rel, size)?;
                    let needed = approval.op.reads_target()
                        || (!executable && size <= approval.op.max_size_bytes.unwrap_or(0));
                    Some(Virtual::File(if needed {
                        let ri = approval.resolved.root_index;
                        let read = self.sb.roots[ri].read_file(rel, MAX_SNAPSHOT_BYTES)?;
                        Some(Bytes::Made(Arc::new(read)))
                    } else {
                        None
                    }))
                }
                Some(TargetKind::Directory) => Some(Virtual::Dir),
                _ => None,
            },
        })
    }

    /// The workflow's budget (for an action that leaves bytes, `makes_file`, of `size`)
    /// and the rate limit, counting what the plan's earlier actions take (`t`): the
    /// inner refusal is a limit's; the outer one, a log that could not be read to count.
    fn check_limits(&self, t: &mut Tally, makes_file: bool, size: u64) -> Verdict<Verdict> {
        let sb = self.sb;
        let wf = &self.plan.workflow_id;
        if makes_file {
            let asked = Usage {
                artifacts: t.planned.artifacts + t.held_back.artifacts,
                bytes: t.planned.bytes + t.held_back.bytes,
            };
            let registered = t.registered.clone()?;
            if let Err(r) = check_budget(wf, &sb.config.limits, registered, asked, size) {
                return Ok(Err(r));
            }
        }
        // Every write of the plan that gets this far counts, refused or not: the wait a
        // refusal names is for all of them, so trying the plan again after it never comes
        // too early, and a plan over the burst is named as such.
        t.writes += 1;
        let per_minute = sb.config.limits.writes_per_minute;
        let limited = check_rate(
            wf,
            per_minute,
            t.tat.clone()?,
            t.now,
            t.writes,
            t.plan_writes,
        );
        if limited.is_err() && makes_file {
            t.held_back.artifacts += 1;
            t.held_back.bytes += size;
        }
        Ok(limited)
    }

    /// Refuses an action id already used in the workflow: recorded on the trail, or with
    /// a snapshot folder in any root (an id whose snapshot was pruned or removed would
    /// let a rollback take the new write's snapshot for the old one's), or with
    /// something other than a folder where its snapshot is to be taken in its root `ri`.
    fn check_new_id(&self, a: &Action, ri: usize) -> Verdict {
        let wf = &self.plan.workflow_id;
        let ran = self.sb.audit.ran_action(wf, a.id()).map_err(|e| {
            let words = || {
                format!(
                    "the audit trail could not be read to check that action_id '{}' is new in workflow '{wf}': {e}",
                    a.id()
                )
            };
            crate::error::busy_or_failed(&e, words, words)
        })?;
        let mut used = false;
        for (i, root) in self.sb.roots.iter().enumerate() {
            match Snapshotter::place(root, wf, a.id()) {
                Ok(u) => used |= u,
                Err(r) if i == ri => return Err(r),
                Err(_) => {}
            }
        }
        if ran || used {
            return Err(crate::plan::action_id_used(a.id(), wf));
        }
        Ok(())
    }

    /// The rate limiter's state from the audit trail.
    fn rate_tat(&self) -> Verdict<f64> {
        let wf = &self.plan.workflow_id;
        let now = crate::budget::epoch_seconds(self.sb.clock.now());
        self.sb
            .audit
            .rate_tat(wf, now)
            .map_err(|e| uncountable("audit log", "recent writes for the rate limit", wf, &e))
    }

    /// The workflow's artifacts and bytes in the registry.
    fn registered_usage(&self) -> Verdict<Usage> {
        let wf = &self.plan.workflow_id;
        self.sb
            .registry
            .usage_by_workflow(wf)
            .map_err(|e| uncountable("artifact registry", "budget", wf, &e))
    }

    fn base_result(
        &self,
        a: &Action,
        op: Option<&'static Operation>,
        status: ActionStatus,
    ) -> ActionResult {
        ActionResult {
            mutation_class: op.map(|o| o.mutation_class),
            ..ActionResult::new(
                a.id(),
                a.intent.clone(),
                a.path.clone(),
                status,
                assess_sandbox_risk(&a.intent, &a.path),
            )
        }
    }

    /// An action's `target_path` for the audit trail when it was refused before its
    /// approval: the absolute path inside its root, the form written entries carry, so
    /// that every entry about one file names it alike; the path as given only when it
    /// names no place in a root (traversal, outside every root, too deep).
    fn target_path(&self, a: &Action) -> String {
        match resolve_sandbox_path(
            &a.path,
            &self.sb.root_paths,
            a.root.as_deref(),
            self.sb.config.limits.max_path_depth,
        ) {
            Ok(r) => self.sb.abs_path(r.root_index, &r.rel),
            Err(_) => a.path.clone(),
        }
    }

    fn record(
        &self,
        a: &Action,
        r: &ActionResult,
        status: AuditStatus,
        target: String,
    ) -> AuditRecord {
        AuditRecord {
            timestamp: self.sb.now(),
            execution_id: self.execution_id.clone(),
            workflow_id: self.plan.workflow_id.clone(),
            action_id: a.id().to_owned(),
            mutation_class: r.mutation_class,
            mutation_type: a.intent.clone(),
            target_path: target,
            before_checksum: r.before_checksum.clone(),
            after_checksum: r.after_checksum.clone(),
            rollback_available: r.rollback_path.is_some(),
            rollback_path: r.rollback_path.clone(),
            status,
            reason_code: r.reason_code,
            error: r.reason.clone(),
        }
    }

    fn finish(
        mut self,
        status: RunStatus,
        simulation_only: bool,
        dry_run_reason: Option<DryRunReason>,
        actions: Vec<ActionResult>,
    ) -> RunResult {
        self.event(
            "execution_finished",
            json!({"status": status, "state": self.state}),
        );
        RunResult {
            workflow_id: self.plan.workflow_id.clone(),
            execution_id: self.execution_id.clone(),
            status,
            simulation_only,
            dry_run_reason,
            state: self.state,
            actions,
            timeline: self.timeline,
        }
    }

    fn blocked(
        mut self,
        checks: Vec<Result<Prepared, Refusal>>,
        simulation_only: bool,
    ) -> RunResult {
        let mut results = Vec::new();
        let mut records = Vec::new();
        let actions = std::mem::take(&mut self.plan.actions);
        for (i, a) in actions.iter().enumerate() {
            let op = op_for_intent(&a.intent);
            // One refusal for the whole plan (its workflow busy, say) refuses each action,
            // counted and audited as each is.
            let check = match checks.as_slice() {
                [whole @ Err(_)] => Some(whole),
                _ => checks.get(i),
            };
            match check {
                Some(Err(r)) => {
                    let mut res = self.base_result(a, op, ActionStatus::Blocked);
                    res.reason_code = Some(r.reason_code);
                    res.reason = Some(r.reason.clone());
                    res.retry_after_seconds = r.retry_after_seconds;
                    self.sb
                        .metrics
                        .denied(&a.intent, r.reason_code, r.is_escape_attempt());
                    self.sb.metrics.mutation(&a.intent, ActionStatus::Blocked);
                    self.event(
                        "action_blocked",
                        json!({"action_id": a.id(), "reason_code": r.reason_code}),
                    );
                    records.push(self.record(a, &res, AuditStatus::Blocked, self.target_path(a)));
                    results.push(res);
                }
                Some(Ok(p)) => {
                    let mut res = self.base_result(a, op, ActionStatus::Skipped);
                    res.risk = p.approval.risk;
                    res.reason = Some("not run: another action of the plan was refused".to_owned());
                    results.push(res);
                }
                None => results.push(self.base_result(a, op, ActionStatus::Skipped)),
            }
        }
        if let Err(e) = self.sb.audit.append(records) {
            tracing::error!(error = %e, "could not audit blocked actions");
        }
        // A phase without sandbox writes refuses every action for that one reason: say so,
        // rather than the generic governance refusal.
        let why = match self.sb.execution_context().1 {
            Some(DryRunReason::PhaseNotSupported) => DryRunReason::PhaseNotSupported,
            _ => DryRunReason::GovernanceBlocked,
        };
        self.event("dry_run_reason", json!({ "reason": why }));
        self.go(WorkflowState::Failed);
        self.finish(RunStatus::Blocked, simulation_only, Some(why), results)
    }

    fn simulate(mut self, prepared: Vec<Prepared>, reason: Option<DryRunReason>) -> RunResult {
        self.event("dry_run_reason", json!({"reason": reason}));
        self.go(WorkflowState::Executing);
        let mut results = Vec::new();
        let mut records = Vec::new();
        let actions = std::mem::take(&mut self.plan.actions);
        for (a, p) in actions.iter().zip(prepared) {
            let mut res = self.base_result(a, Some(p.approval.op), ActionStatus::Simulated);
            res.risk = p.approval.risk;
            res.before_checksum = p.before_checksum.clone();
            let bytes = p.bytes.as_ref().map(|b| b.of(&actions));
            res.after_checksum = bytes.map(sha256_hex);
            res.size_bytes = bytes.map(|b| b.len() as u64);
            let target = self
                .sb
                .abs_path(p.approval.resolved.root_index, &p.approval.resolved.rel);
            records.push(self.record(a, &res, AuditStatus::Simulated, target));
            results.push(res);
        }
        // Simulations are audited (SPEC §4): one the trail cannot take (another process
        // held it past the wait, a failed disk) is refused, not answered as done.
        if let Err(e) = self.sb.audit.append(records) {
            let r = crate::error::log_refusal("audit the simulated run", &e);
            self.plan.actions = actions;
            return self.blocked(vec![Err(r)], true);
        }
        for a in &actions {
            self.sb.metrics.mutation(&a.intent, ActionStatus::Simulated);
            self.event("action_simulated", json!({"action_id": a.id()}));
        }
        self.go(WorkflowState::Done);
        self.finish(RunStatus::SimulatedSuccess, true, reason, results)
    }

    /// `roots`: the roots the plan writes into (see [`Sandbox::root_names`]).
    fn execute(mut self, roots: Vec<String>) -> RunResult {
        self.go(WorkflowState::Executing);
        let record = crate::recovery::InflightRecord {
            state: "active".to_owned(),
            execution_id: self.execution_id.clone(),
            workflow_id: self.plan.workflow_id.clone(),
            started_at: self.sb.now(),
            finished: false,
            boot: crate::confine::state::boot_id().map(str::to_owned),
            recovered_by: Vec::new(),
            roots,
            rollback_recovered_at: None,
            forced: None,
        };
        if let Err(r) = self.sb.begin_record(&record, self.record_file.as_ref()) {
            let checks = self.plan.actions.iter().map(|_| Err(r.clone())).collect();
            return self.blocked(checks, false);
        }
        let sb = self.sb;
        self.record = Some(record.clone());
        let file = self.record_file.take();
        let unrecorded = std::rc::Rc::clone(&self.unrecorded);
        let unsettled = std::rc::Rc::clone(&self.unsettled);
        let result = self.execute_actions();
        // After a failed sync the record stays active instead (`run_finished`): the next
        // start checks the whole run against the disk.
        if unsettled.get() || unrecorded.get() {
            sb.left_for_later(&record.execution_id);
        }
        if unsettled.get() {
            tracing::warn!(workflow = %record.workflow_id, "a failed action of this run could not be undone; its record stays active, for the next run or start to check it against the disk");
        } else if unrecorded.get()
            && sb.sync_failure().is_none()
            // Unless its undo, recording first what its failed action's undo held back,
            // recorded them all.
            && sb.held_restores().holds(&record.execution_id)
        {
            tracing::warn!(workflow = %record.workflow_id, "a restore of this run is not on the audit trail; its record says so, for the next run or start to audit it");
            let rec = crate::recovery::InflightRecord {
                state: crate::recovery::RESTORES_UNAUDITED.to_owned(),
                ..record
            };
            if let Err(e) = sb.write_record(&rec, sb.durable()) {
                tracing::warn!(error = %e, "could not mark a run's restores unaudited");
            }
        } else {
            sb.run_finished(record, file.as_ref());
        }
        result
    }

    fn execute_actions(mut self) -> RunResult {
        let actions = std::mem::take(&mut self.plan.actions);
        let (mut results, done, failed) = self.run_each(&actions);
        let artifacts = self.sb.registry.len().unwrap_or(0);
        self.sb.metrics.set_artifacts(artifacts);
        let Some(blocked) = failed else {
            self.go(WorkflowState::Done);
            return self.finish(RunStatus::Success, false, None, results);
        };
        self.go(WorkflowState::Failed);
        if blocked {
            // Refused before anything was written, as validation refuses.
            let why = DryRunReason::GovernanceBlocked;
            self.event("dry_run_reason", json!({ "reason": why }));
            return self.finish(RunStatus::Blocked, false, Some(why), results);
        }
        if self.plan.on_failure == OnFailure::Stop || done.is_empty() {
            if done.is_empty()
                && self.plan.on_failure == OnFailure::Rollback
                && self.undo_failed.is_none()
            {
                // Nothing of this run remains to undo: the failed action restored itself.
                self.event("rollback_started", json!({"steps": 0}));
                self.event("rollback_finished", json!({"steps_rolled_back": 0}));
                self.go(WorkflowState::RolledBack);
                return self.finish(RunStatus::RolledBack, false, None, results);
            }
            return self.finish(RunStatus::Failed, false, None, results);
        }
        self.event("rollback_started", json!({"steps": done.len()}));
        let steps = self.undo_run(done);
        // As for a failed action's own undo: a restore whose line could not be appended
        // (a full disk) leaves the run's record saying so, for recovery to audit it.
        if steps.iter().any(|s| s.unrecorded.is_some()) {
            self.unrecorded.set(true);
        }
        let all_ok = steps.iter().all(|s| s.restored);
        undone_in(&mut results, &steps);
        self.event(
            "rollback_finished",
            json!({"steps_rolled_back": steps.iter().filter(|s| s.restored).count(), "all_restored": all_ok}),
        );
        if all_ok && self.undo_failed.is_none() {
            self.go(WorkflowState::RolledBack);
            self.finish(RunStatus::RolledBack, false, None, results)
        } else {
            self.finish(RunStatus::Failed, false, None, results)
        }
    }

    /// Runs the actions in order until one fails or is refused; those after it are
    /// skipped. Gives every action's result, the snapshots of those done, and, when one
    /// did not go through, whether it was refused (`Some(true)`) or failed.
    fn run_each(
        &mut self,
        actions: &[Action],
    ) -> (
        Vec<ActionResult>,
        Vec<(usize, StoredSnapshot)>,
        Option<bool>,
    ) {
        let mut results: Vec<ActionResult> = Vec::new();
        let mut done: Vec<(usize, StoredSnapshot)> = Vec::new();
        let mut failed: Option<bool> = None;
        for (i, a) in actions.iter().enumerate() {
            if let Some(blocked) = failed {
                let mut res = self.base_result(a, op_for_intent(&a.intent), ActionStatus::Skipped);
                res.reason = Some(
                    if blocked {
                        "not run: another action of the plan was refused"
                    } else {
                        "not run: an earlier action failed"
                    }
                    .to_owned(),
                );
                results.push(res);
                continue;
            }
            if i == 0 {
                self.go(WorkflowState::Mutating);
            }
            let started = Instant::now();
            match self.execute_action(a, i == 0) {
                Ok((res, snap)) => {
                    self.sb.metrics.mutation(&a.intent, ActionStatus::Success);
                    self.sb
                        .metrics
                        .mutation_duration(&a.intent, started.elapsed().as_secs_f64());
                    self.event(
                        "action_succeeded",
                        json!({"action_id": a.id(), "after_checksum": res.after_checksum}),
                    );
                    done.push(snap);
                    results.push(res);
                }
                Err(res) => {
                    let blocked = res.status == ActionStatus::Blocked;
                    let (result, event) = if blocked {
                        (ActionStatus::Blocked, "action_blocked")
                    } else {
                        (ActionStatus::Failed, "action_failed")
                    };
                    self.sb.metrics.mutation(&a.intent, result);
                    self.event(
                        event,
                        json!({"action_id": a.id(), "reason_code": res.reason_code}),
                    );
                    results.push(*res);
                    failed = Some(blocked);
                }
            }
        }
        (results, done, failed)
    }

    /// The plan's rollback after a failure: the actions `done` restored newest first,
    /// under their targets' locks (a step each that failed when those cannot be had).
    fn undo_run(&self, done: Vec<(usize, StoredSnapshot)>) -> Vec<crate::sandbox::RollbackStep> {
        let wf = &self.plan.workflow_id;
        // An undo goes on while earlier restores wait for the trail: its own lines then
        // wait after them.
        let held = self.sb.lock_targets_for_undo(
            wf,
            done.iter().map(|(i, s)| (*i, s.meta.target())).collect(),
        );
        // As a rollback begins: the workflow's commit log emptied, so that no later
        // replay redoes what this undoes, and the record saying a rollback is under way,
        // so that a start after this process dies records the restores made and says
        // what is left to roll back; unless a failed action's own undo failed: the log
        // is emptied all the same, but the record stays active, for recovery to check
        // that action against the disk.
        let held = held.and_then(|h| match self.undo_failed {
            Some(_) => self.sb.settle_commit_log(wf).map(|_| h),
            None => self
                .sb
                .mark_rolling_back(wf, &self.execution_id, done.iter().map(|(i, _)| *i), false)
                .map(|_| h),
        });
        match held {
            Ok((_held, waiting)) => self.sb.restore_all(
                &self.execution_id,
                wf,
                done.into_iter().rev().collect(),
                RollbackReason::WorkflowFailed,
                crate::sandbox::RestoreMode::Unchanged,
                waiting.map(|r| r.reason),
            ),
            Err(r) => done
                .into_iter()
                .rev()
                .map(|(i, s)| {
                    let path = self.sb.abs_path(i, &s.meta.target());
                    crate::sandbox::RollbackStep::failed(&s.meta, path, r.clone())
                })
                .collect(),
        }
    }

    /// One action, for real. On failure the action's own change is undone and the
    /// failure audited. `first`: nothing of the run is written yet, so a refusal (the
    /// target, budget or rate limit changed since validation) blocks the plan as
    /// validation would have, rather than failing it.
    fn execute_action(
        &mut self,
        a: &Action,
        first: bool,
    ) -> Result<(ActionResult, (usize, StoredSnapshot)), Box<ActionResult>> {
        let sb = self.sb;
        let op = op_for_intent(&a.intent);
        let mut res = self.base_result(a, op, ActionStatus::Failed);

        // governance → payload → current bytes → size → budget → rate limit
        let gctx = sb.governance_context();
        let req = self.request(a);
        // The target's lock first, held to the end of the action: what governance finds
        // there, the bytes read, the snapshot and the write then all belong to one moment
        // of the target. (A path that does not resolve is refused just below.)
        let _target_lock = match resolve_target(&req, &gctx) {
            Ok(r) => match sb
                .lock_targets_after_restores(&self.plan.workflow_id, vec![(r.root_index, r.rel)])
            {
                Ok(l) => Some(l),
                Err(r) => {
                    return Err(self.fail_or_block(a, first, res, r, self.target_path(a), true));
                }
            },
            Err(_) => None,
        };
        let approval = match check_target(&req, &gctx) {
            Ok(ap) => ap,
            Err(r) => {
                return Err(self.fail_or_block(a, first, res, r, self.target_path(a), true));
            }
        };
        res.risk = approval.risk;
        let target = sb.abs_path(approval.resolved.root_index, &approval.resolved.rel);
        let checked = match self.read_and_check(a, &approval) {
            Ok(c) => c,
            Err(r) => return Err(self.fail_or_block(a, first, res, r, target, true)),
        };
        res.before_checksum = checked.before.as_deref().map(sha256_hex);

        // The new bytes and their checksum are known before the snapshot is taken: its
        // record names what the write will leave, so that recovery can tell it happened.
        let w = self.plan_write(a, &approval, checked, &res, &target);
        let rollback_path = match self.take_snapshot(&w) {
            Ok(p) => p,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };
        res.rollback_path = Some(rollback_path);
        let snap = (
            w.ri,
            StoredSnapshot {
                meta: w.meta.clone(),
                restored: false,
            },
        );
        let staged = match self.stage(&w, &snap) {
            Ok(st) => st,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };
        let logged = match self.commit(&w, staged.as_ref(), &snap) {
            Ok(l) => l,
            Err(r) => return Err(self.fail(a, res, r, target)),
        };

        // Mutate → registry → audit; any failure restores the snapshot.
        // Set once the write is made: a refusal after it (the registry busy, say) found a
        // changed target, which only a refusal before it does not.
        let mut written = false;
        let outcome = match self.mutate_and_register(&w, staged.as_ref(), &mut written) {
            Ok(()) => self
                .audit_write(w.done_record, staged.is_some())
                .inspect_err(|_| self.undo(&snap, &w.left)),
            Err(r) => Err(self.undo_failed_write(&w, staged.as_ref(), &snap, written, r)),
        };
        // Once this action's writes are made (or undone), a sync point may empty the log.
        if let Some(at) = logged {
            sb.commit_finished(&self.plan.workflow_id, at);
        }
        match outcome {
            Ok(()) => Ok((w.done, snap)),
            Err(r) => Err(self.fail(a, res, r, target)),
        }
    }

    /// An action's failure or refusal, counted, audited and turned into its result.
    /// `refused`: nothing of the action was written either; refused so while `first`,
    /// it blocks the plan as validation would have.
    fn fail_or_block(
        &self,
        a: &Action,
        first: bool,
        mut res: ActionResult,
        r: Refusal,
        target: String,
        refused: bool,
    ) -> Box<ActionResult> {
        let code = r.reason_code;
        // Refused by a check made again at write time, or by the disk as a way out
        // (a link met mid-write): denied wherever the action stands in the plan.
        // A write that failed (an I/O error) was denied by no policy.
        if (refused && code != ReasonCode::IoError) || code.is_escape_attempt() {
            self.sb
                .metrics
                .denied(&a.intent, code, code.is_escape_attempt());
        }
        let blocked = first && refused && code != ReasonCode::IoError;
        let status = if blocked {
            res.status = ActionStatus::Blocked;
            res.retry_after_seconds = r.retry_after_seconds;
            AuditStatus::Blocked
        } else {
            res.status = ActionStatus::Failed;
            AuditStatus::Failed
        };
        res.reason_code = Some(r.reason_code);
        res.reason = Some(r.reason);
        let rec = self.record(a, &res, status, target);
        if let Err(e) = self.sb.audit.append(vec![rec]) {
            tracing::error!(error = %e, "could not audit a failed action");
        }
        Box::new(res)
    }

    /// The failure of an action that had begun writing (its snapshot taken), its own
    /// change undone or not: its result must say which, for the operator to know what
    /// stands. Such a failure never blocks the plan (`first` counts only for a refusal).
    fn fail(
        &self,
        a: &Action,
        mut res: ActionResult,
        mut r: Refusal,
        target: String,
    ) -> Box<ActionResult> {
        if self.undone.as_deref() == Some(a.id()) {
            res.rollback_path = None;
        }
        if let Some(why) = &self.undo_failed {
            r.reason = format!(
                "{}; {UNDO_FAILED} ({why}), so the change may still be in place: roll the workflow back once that is fixed",
                r.reason.strip_suffix(UNDONE_LATER).unwrap_or(&r.reason)
            );
        }
        self.fail_or_block(a, false, res, r, target, false)
    }

    /// Reads the approved target (under its lock) and renders what the action leaves
    /// there, checking every limit again: the tree, the budget and the rate may have
    /// changed since validation, and nothing is written until all of them pass.
    fn read_and_check<'b>(&self, a: &'b Action, approval: &Approval) -> Verdict<Checked<'b>> {
        let sb = self.sb;
        let wf = &self.plan.workflow_id;
        let ri = approval.resolved.root_index;
        let root = &sb.roots[ri];
        let rel = approval.resolved.rel.clone();
        sb.check_syncs()?;
        sb.root_in_place(ri)?;
        check_payload(approval.op, a)?;
        let kind = approval
            .target
            .as_ref()
            .map_or(TargetKind::Missing, |t| t.kind);
        let (before, stamp) = match kind {
            TargetKind::File { size, .. } => {
                check_existing_size(approval.op, a, &rel, size)?;
                let (bytes, stamp) = root.read_file_stamped(&rel, MAX_SNAPSHOT_BYTES)?;
                (Some(bytes), Some(stamp))
            }
            _ => (None, None),
        };
        let bytes = render(approval.op, a, &approval.ext, before.as_deref())?;
        let size = bytes.as_ref().map_or(0, |b| b.len() as u64);
        check_size(approval, size, &sb.config.extensions)?;
        if bytes.is_some() {
            check_budget(
                wf,
                &sb.config.limits,
                self.registered_usage()?,
                Usage::default(),
                size,
            )?;
        }
        check_rate(
            wf,
            sb.config.limits.writes_per_minute,
            self.rate_tat()?,
            sb.clock.now(),
            1,
            1,
        )?;
        Ok(Checked {
            ri,
            rel,
            kind,
            before,
            stamp,
            bytes,
        })
    }

    /// Works out everything the write leaves before anything is written: the snapshot's
    /// record, the registry entry and the success record, so that a snapshot can carry
    /// the outcome as its commit record, and how the new bytes go in place.
    fn plan_write<'b>(
        &self,
        a: &Action,
        approval: &Approval,
        checked: Checked<'b>,
        res: &ActionResult,
        target: &str,
    ) -> ActionWrite<'b> {
        let sb = self.sb;
        let existing = approval.target.as_ref().map_or(0, |t| t.existing_parents);
        // The directories the write may make: those its snapshot records, no others
        // (for create_directory, the directory itself counts last).
        let make = Make::From(if checked.kind == TargetKind::Missing {
            existing
        } else {
            checked.rel.components().len()
        });
        // The outcome is known before anything is written: the registry entry and the
        // success record are prepared here, so that a snapshot can carry them as its
        // commit record.
        let after = checked.bytes.as_deref().map(sha256_hex);
        let mut meta = self.snapshot_meta(a, approval, &checked, res, existing, after.clone());
        let Checked {
            ri,
            rel,
            kind,
            before,
            stamp,
            bytes,
        } = checked;
        let left = match &after {
            Some(sum) => crate::sandbox::TargetState::File(sum.clone()),
            None => crate::sandbox::TargetState::Directory,
        };
        let entry = match (&bytes, &after) {
            (Some(b), Some(sum)) => Some(self.new_artifact(
                a,
                target,
                b.len() as u64,
                sum,
                res.before_checksum.as_deref(),
            )),
            _ => None,
        };
        let mut done = res.clone();
        done.status = ActionStatus::Success;
        done.after_checksum = after.clone();
        done.size_bytes = bytes.as_ref().map(|b| b.len() as u64);
        done.artifact_id = entry.as_ref().map(|e| e.artifact_id.clone());
        done.rollback_path = Some(meta.rollback_path());
        let done_record = self.record(a, &done, AuditStatus::Success, target.to_owned());
        let mode = match kind {
            TargetKind::File { mode, .. } => mode & 0o666,
            _ => FILE_MODE,
        };
        // A target found missing must still be missing when the new file takes its
        // place: a file another program created meanwhile is never replaced. One found
        // must still be the file that was read: another program's change made meanwhile
        // (a line appended to a log) is never overwritten unseen.
        let no_replace = approval.op.name == "create_file" || matches!(kind, TargetKind::Missing);
        let put = match &stamp {
            Some(was) if !no_replace => Put::Unchanged(*was),
            _ => Put::new_or_any(no_replace),
        };

        // With batched syncs a file write whose directories exist takes one durability
        // point: its new bytes are staged beside the target and the snapshot doubles as
        // the commit record, so one commit point (a sync, or an append to the workflow's
        // commit log) makes the snapshot and the whole outcome durable before the target
        // changes. What follows (the rename, the registry and audit lines) reaches the
        // disk at the next sync point; until then recovery can redo it from the commit
        // record or the log.
        let staged_name = match &bytes {
            Some(_) if sb.stages_writes() && meta.created_dirs.is_empty() => Some(temp_name()),
            _ => None,
        };
        if let (Some(name), Some(sum)) = (&staged_name, &after) {
            meta.commit = Some(SnapshotCommit {
                staged_name: name.clone(),
                after_sha256: sum.clone(),
                no_replace,
                artifact: entry.clone(),
                audit: done_record.clone(),
            });
        }
        ActionWrite {
            op: approval.op,
            ri,
            rel,
            before,
            stamp,
            bytes,
            left,
            entry,
            meta,
            done,
            done_record,
            mode,
            no_replace,
            put,
            make,
            staged_name,
        }
    }

    /// The record of the snapshot [`Self::plan_write`] plans (no commit record yet):
    /// what stands at the target, the `existing` of its parents (those beyond are the
    /// directories the write makes), and `after`, the new bytes' checksum.
    fn snapshot_meta(
        &self,
        a: &Action,
        approval: &Approval,
        checked: &Checked<'_>,
        res: &ActionResult,
        existing: usize,
        after: Option<String>,
    ) -> SnapshotMeta {
        let Checked { ri, rel, kind, .. } = checked;
        let parents = rel.parent_components();
        let mut created_dirs: Vec<String> = (existing..parents.len())
            .map(|d| parents[..=d].join("/"))
            .collect();
        if approval.op.is_directory() && *kind == TargetKind::Missing {
            created_dirs.push(rel.as_string());
        }
        SnapshotMeta {
            format: 1,
            snapshot_id: crate::ids::unique(),
            workflow_id: self.plan.workflow_id.clone(),
            action_id: a.id().to_owned(),
            execution_id: self.execution_id.clone(),
            root: self.sb.root_paths[*ri].display().to_string(),
            original_path: rel.as_string(),
            existed: *kind != TargetKind::Missing,
            kind: match kind {
                TargetKind::File { .. } => SnapshotKind::File,
                TargetKind::Directory => SnapshotKind::Directory,
                TargetKind::Missing => SnapshotKind::Missing,
            },
            size_bytes: checked.before.as_ref().map(|b| b.len() as u64),
            sha256: res.before_checksum.clone(),
            mode: match kind {
                TargetKind::File { mode, .. } => Some(*mode),
                _ => None,
            },
            intent: a.intent.clone(),
            mutation_class: approval.op.mutation_class,
            created_dirs,
            taken_at: self.sb.now(),
            after_sha256: after,
            commit: None,
        }
    }

    /// Takes the action's snapshot before anything is written, so that the write can
    /// be undone and recovery knows of it, returning where it is kept.
    fn take_snapshot(&self, w: &ActionWrite<'_>) -> Verdict<String> {
        let sb = self.sb;
        // The snapshot first, so that recovery knows of the staged file if it survives.
        Snapshotter::take(
            &sb.roots[w.ri],
            &sb.seal,
            &w.meta,
            w.before.as_deref(),
            sb.fsync_each(),
            || sb.fail_at("snapshot_synced"),
        )
    }

    /// With batched syncs, stages the new bytes beside the target, for the commit point
    /// to make them durable with the snapshot before the target changes; none otherwise.
    /// A failure undoes the snapshot as a refusal would.
    fn stage(
        &mut self,
        w: &ActionWrite<'_>,
        snap: &(usize, StoredSnapshot),
    ) -> Verdict<Option<StagedWrite>> {
        let sb = self.sb;
        let root = &sb.roots[w.ri];
        match (&w.staged_name, &w.bytes) {
            (Some(name), Some(b)) => match root
                .stage_write(&w.rel, name, b, w.mode, w.stamp.filter(|_| !w.no_replace))
                .and_then(|st| sb.cover_for_sync(st.dir()).map(|()| st))
            {
                Ok(st) => Ok(Some(st)),
                Err(r) => {
                    self.undo_refused(snap, &w.left, &r);
                    Err(r)
                }
            },
            _ => Ok(None),
        }
    }

    /// Makes the snapshot (and a staged write) durable before the target changes,
    /// returning where the workflow's commit log stands when an append to it did; a
    /// failure discards the staged bytes and undoes the snapshot.
    fn commit(
        &mut self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        snap: &(usize, StoredSnapshot),
    ) -> Verdict<Option<Position>> {
        let sb = self.sb;
        // The commit point: one append to the workflow's commit log for a small staged
        // write, else one sync point.
        let log_entry = match (staged, &w.bytes, &self.record) {
            (Some(_), Some(b), Some(record))
                if sb.logs_commit(w.before.as_ref().map_or(0, Vec::len) + b.len()) =>
            {
                Some(crate::sandbox::LogEntry {
                    record,
                    meta: &w.meta,
                    backup: w.before.as_deref(),
                    bytes: b,
                })
            }
            _ => None,
        };
        let committed = sb
            .fail_at("before_commit")
            .and_then(|()| sb.commit_point(log_entry));
        match committed {
            Ok(l) => Ok(l),
            Err(r) => {
                if let Some(st) = staged {
                    st.discard();
                }
                self.undo(snap, &w.left);
                Err(r)
            }
        }
    }

    /// Puts the new bytes (or directory) in place and registers the artifact, setting
    /// `written` once the target changed: what a failure must undo depends on it.
    fn mutate_and_register(
        &self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        written: &mut bool,
    ) -> Verdict {
        let sb = self.sb;
        let root = &sb.roots[w.ri];
        let durable = sb.fsync_each();
        sb.fail_at("after_snapshot")?;
        sb.fail_at("before_mutate")?;
        match (&w.bytes, staged) {
            (Some(_), Some(st)) => st.commit_in(root, &w.rel, w.put, false)?,
            (Some(b), None) => {
                root.write_atomic_put(&w.rel, b, w.mode, w.put, w.make, durable)?;
            }
            (None, _) => {
                root.create_dir_all_making(&w.rel, w.make, durable)?;
            }
        }
        *written = true;
        if staged.is_none() {
            sb.cover_target(w.ri, &w.rel)?;
        }
        sb.fail_at("after_mutate")?;
        if let Some(entry) = &w.entry {
            sb.fail_at("before_registry")?;
            sb.registry
                .register(entry)
                .map_err(|e| log_failure("register the artifact", &e))?;
        }
        Ok(())
    }

    /// Appends the action's success to the audit trail, then (unless `staged`) makes the
    /// write durable: the action succeeded only once both are done.
    fn audit_write(&self, done_record: AuditRecord, staged: bool) -> Verdict {
        let sb = self.sb;
        let appended = sb
            .fail_at("before_audit")
            .map_err(|r| std::io::Error::other(r.reason))
            .and_then(|()| sb.audit.append(vec![done_record]))
            // The second durability point: the target, the registry and the
            // audit line, all at once. Recovery checks audited targets against
            // their after_checksum, so their order on disk does not matter. A
            // staged write needs none: its commit record is durable already.
            .and_then(|_| {
                if staged {
                    Ok(())
                } else {
                    sb.sync_point().map_err(|r| std::io::Error::other(r.reason))
                }
            });
        appended.map_err(|e| log_failure("append to the audit log", &e))
    }

    /// Undoes a write that failed with `r` (discarding its staged bytes), returning the
    /// refusal to report: a rename refused because the target appeared meanwhile is a
    /// conflict with another program, not this action's fault.
    fn undo_failed_write(
        &mut self,
        w: &ActionWrite<'_>,
        staged: Option<&StagedWrite>,
        snap: &(usize, StoredSnapshot),
        written: bool,
        mut r: Refusal,
    ) -> Refusal {
        if let Some(st) = staged {
            st.discard();
        }
        // Only the no-replace rename (or a directory's creation) refuses with
        // `already_exists`, and only the rename over the file that was read with
        // `conflict`: the target was not touched, and what holds it now is
        // someone else's.
        if written {
            self.undo(snap, &w.left);
        } else {
            self.undo_refused(snap, &w.left, &r);
        }
        if r.reason_code == ReasonCode::AlreadyExists && w.op.name != "create_file" {
            r = Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "{} appeared while the action ran (another program created it); it was left as it is: read it, then try again",
                    shown_path(&w.rel.as_string())
                ),
            );
        }
        r
    }

    /// The registry entry of a file the action is about to write. Its parent defaults to
    /// the artifact whose bytes it replaces: of the path's artifacts whose write was not
    /// rolled back, the newest with the checksum the file holds now, else the newest
    /// (SPEC §8: a file changed by hand, or made again after it was deleted). A
    /// rolled-back write is no version the path still has: a file back to bytes no
    /// standing artifact holds (as before a workflow that was rolled back) has no parent
    /// but an older artifact standing there.
    fn new_artifact(
        &self,
        a: &Action,
        target: &str,
        size: u64,
        sum: &str,
        before: Option<&str>,
    ) -> ArtifactEntry {
        let sb = self.sb;
        ArtifactEntry {
            artifact_id: format!("art_{}", crate::ids::unique()),
            path: target.to_owned(),
            checksum_sha256: sum.to_owned(),
            size_bytes: size,
            mutation_type: a.intent.clone(),
            workflow_id: self.plan.workflow_id.clone(),
            action_id: a.id().to_owned(),
            parent_workflow_id: self.plan.parent_workflow_id.clone(),
            parent_artifact_id: match &a.parent_artifact_id {
                Some(p) => Some(p.clone()),
                None => {
                    // A rolled-back write is no version the path has, even when a standing
                    // one holds the same bytes (a write undone that had put them back).
                    let standing = |e: crate::artifact::ArtifactRef<'_>| !sb.rolled_back(e);
                    before
                        .and_then(|sum| {
                            let holding = sb.registry.version_holding_where(target, sum, standing);
                            holding.ok().flatten()
                        })
                        .or_else(|| sb.registry.newest_at_where(target, standing).ok().flatten())
                        .map(|e| e.artifact_id)
                }
            },
            generated_by_action: format!("{}/{}", self.execution_id, a.id()),
            created_at: sb.now(),
        }
    }

    /// Restores one action's snapshot at once after its mutation failed.
    /// `left`: what the action writes (see [`crate::sandbox::RestoreMode::OwnChange`]).
    fn undo(&mut self, snap: &(usize, StoredSnapshot), left: &crate::sandbox::TargetState) {
        self.undo_with(snap, crate::sandbox::RestoreMode::OwnChange(left.clone()));
    }

    /// Undoes an action whose write failed with `r`. Some refusals come only before the
    /// rename, so the target was not touched and is left as it is, whatever it holds
    /// ([`crate::sandbox::RestoreMode::Untouched`]): `conflict` (the file changed since it
    /// was read: a missing parent stops before any mkdir), `already_exists` (the
    /// no-replace rename kept what appeared), and a symbolic link, hard link or special
    /// file found on the walk to the target or at it (which may not even be looked at now).
    fn undo_refused(
        &mut self,
        snap: &(usize, StoredSnapshot),
        left: &crate::sandbox::TargetState,
        r: &Refusal,
    ) {
        if matches!(
            r.reason_code,
            ReasonCode::Conflict
                | ReasonCode::AlreadyExists
                | ReasonCode::SymlinkEscape
                | ReasonCode::SymlinkRefused
                | ReasonCode::HardlinkRefused
                | ReasonCode::NotRegularFile
        ) {
            self.undo_with(snap, crate::sandbox::RestoreMode::Untouched);
        } else {
            self.undo(snap, left);
        }
    }

    /// [`Self::undo`], as `mode` says.
    fn undo_with(&mut self, snap: &(usize, StoredSnapshot), mode: crate::sandbox::RestoreMode) {
        let wf = self.plan.workflow_id.clone();
        // Said on the timeline: the action never touched its target (a face tells the
        // caller so rather than that its change was undone).
        let untouched = matches!(mode, crate::sandbox::RestoreMode::Untouched);
        let steps = self.sb.restore_all(
            &self.execution_id,
            &wf,
            vec![snap.clone()],
            RollbackReason::ActionFailed,
            mode,
            None,
        );
        let restored = steps.iter().all(|s| s.restored);
        if steps.iter().any(|s| s.unrecorded.is_some()) {
            self.unrecorded.set(true);
        }
        self.event(
            "action_restored",
            json!({"action_id": snap.1.meta.action_id, "restored": restored, "untouched": untouched}),
        );
        if restored {
            self.undone = Some(snap.1.meta.action_id.clone());
        } else {
            self.unsettled.set(true);
            self.undo_failed = Some(
                steps
                    .iter()
                    .find_map(|s| s.reason.clone())
                    .unwrap_or_else(|| "the restore failed".to_owned()),
            );
        }
    }
}
/// An approved action's target as read under its lock, with the bytes the action would
/// leave there, past every check made again at write time.
struct Checked<'b> {
    /// The root's index.
    ri: usize,
    /// The target in that root.
    rel: RelPath,
    /// What stands there.
    kind: TargetKind,
    /// The file's bytes, when it is one.
    before: Option<Vec<u8>>,
    /// The file as read, for the write to replace only it.
    stamp: Option<FileStamp>,
    /// The new bytes; none for a directory.
    bytes: Option<Cow<'b, [u8]>>,
}

/// An action's write, worked out before anything is written.
struct ActionWrite<'b> {
    op: &'static Operation,
    ri: usize,
    rel: RelPath,
    before: Option<Vec<u8>>,
    stamp: Option<FileStamp>,
    bytes: Option<Cow<'b, [u8]>>,
    /// What the write leaves at the target, for its undo.
    left: crate::sandbox::TargetState,
    entry: Option<ArtifactEntry>,
    meta: SnapshotMeta,
    /// The action's result once it succeeded.
    done: ActionResult,
    /// Its success line in the audit trail.
    done_record: AuditRecord,
    mode: u32,
    no_replace: bool,
    put: Put,
    make: Make,
    /// The temporary file's name when the bytes are staged.
    staged_name: Option<String>,
}

/// How a refusal for a held log goes on when the change was undone (see [`log_failure`]);
/// dropped when the undo failed, which is said instead.
const UNDONE_LATER: &str = "; the change was undone, and what the trail still lacks is recorded before this process's next change, when this workflow is next used or at the next start";

/// Why an append to the registry or the audit trail failed: a log another process held
/// past `limits.lock_wait_seconds` is `conflict`, named as such, like a busy file.
fn log_failure(what: &str, e: &std::io::Error) -> Refusal {
    crate::error::busy_or_failed(
        e,
        || {
            format!(
                "could not {what}: another process held the log ({e}: a stopped or hung process, or one far behind){UNDONE_LATER}"
            )
        },
        || format!("could not {what}: {}", crate::error::state_io_words(e)),
    )
}

/// The plan's rollback `steps` told in the `results` of the actions they undid: rolled
/// back, or still `success` (its write stands) with why and what to do.
fn undone_in(results: &mut [ActionResult], steps: &[crate::sandbox::RollbackStep]) {
    for s in steps {
        let Some(r) = results.iter_mut().find(|r| r.action_id == s.action_id) else {
            continue;
        };
        if s.restored {
            r.status = ActionStatus::RolledBack;
        } else {
            r.reason_code = s.reason_code;
            let why = s.reason.as_deref().unwrap_or("its restore failed");
            // A step's reason may say what to do already.
            let advice = if why.contains("roll back again") {
                ""
            } else {
                "; roll the workflow back once that is put right"
            };
            r.reason = Some(format!(
                "written, and not undone by the plan's rollback: {why}{advice}"
            ));
        }
    }
}

/// A log that cannot be read to count a limit refuses the write, rather than counting
/// nothing and letting it through.
fn uncountable(log: &str, what: &str, workflow_id: &str, e: &std::io::Error) -> Refusal {
    let words =
        || format!("the {log} could not be read to count workflow '{workflow_id}''s {what}: {e}");
    crate::error::busy_or_failed(e, words, words)
}

/// Refuses, from its size alone and before reading it, an existing file the action
/// could not handle: one too large to snapshot, or one whose result would exceed the
/// operation's limit (an append adds its content; a transform's result differs from the
/// file by exactly what its edits add and remove, each applying once or not at all).
fn check_existing_size(
    op: &crate::catalog::Operation,
    a: &Action,
    rel: &RelPath,
    size: u64,
) -> Verdict {
    use crate::catalog::human_bytes;
    // By its path in the root, as every refusal names a target.
    let shown = shown_path(&rel.as_string());
    let too_big = |what: String| Err(Refusal::new(ReasonCode::SizeExceeded, what));
    if size > MAX_SNAPSHOT_BYTES {
        return too_big(format!(
            "{shown} holds {} and a snapshot holds at most {}, so it cannot be changed",
            human_bytes(size),
            human_bytes(MAX_SNAPSHOT_BYTES)
        ));
    }
    let Some(max) = op.max_size_bytes else {
        return Ok(());
    };
    match op.name {
        "append_file" => {
            let total = size.saturating_add(a.content.as_ref().map_or(0, |c| c.len() as u64));
            if total > max {
                return too_big(format!(
                    "append_file would leave {total} bytes in {shown}; its limit is {max} bytes ({})",
                    human_bytes(max)
                ));
            }
        }
        "sandbox_transform" => {
            let change: i128 = a
                .edits
                .iter()
                .flatten()
                .map(|e| e.new.len() as i128 - e.old.len() as i128)
                .sum();
            let total = i128::from(size) + change;
            if total > i128::from(max) {
                return too_big(format!(
                    "sandbox_transform would leave {total} bytes in {shown}; its limit is {max} bytes ({})",
                    human_bytes(max)
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_parent_artifact(sb: &Sandbox, a: &Action) -> Verdict {
    if let Some(p) = &a.parent_artifact_id
        && sb.registry.get(p).ok().flatten().is_none()
    {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!("parent_artifact_id '{p}' is not a registered artifact"),
        ));
    }
    Ok(())
}
