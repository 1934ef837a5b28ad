//! The plan executor behind [`Sandbox::run_plan`](crate::Sandbox::run_plan) (SPEC §6):
//! the whole plan is validated first against the tree as its earlier actions would leave
//! it (`validate`); then, per action (`write`): the target locked → governance → the
//! payload, what the target holds now and the new bytes rendered from it → size, budget
//! and rate limit → snapshot → atomic mutation → artifact registry → audit. The checks
//! run twice, at validation and again under the target's lock, since the tree, the
//! budget and the rate may have changed between: `render` must give the same bytes for
//! the same input. A failure restores the action at once and, with
//! `on_failure: rollback`, every earlier action of the run.
//!
//! `SandboxWriteExecutor` is crate-private: `Sandbox::run_plan` is the one public way to
//! run a plan. This file runs it (simulated, blocked or executed) and undoes the run on
//! failure.

use crate::audit::{AuditRecord, AuditStatus};
use crate::catalog::{MutationClass, Operation, RiskLevel, op_for_intent};
use crate::confine::path::resolve_sandbox_path;
use crate::context::DryRunReason;
use crate::hash::sha256_hex;
use crate::metrics::RollbackReason;
use crate::plan::{Action, OnFailure, ValidPlan, new_execution_id};
use crate::policy::{GovernanceRequest, assess_sandbox_risk};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::Sandbox;
use crate::snapshot::StoredSnapshot;
use crate::workflow::{TimelineEvent, WorkflowState};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

mod validate;
mod write;

use validate::Prepared;

/// The words a failed action's reason carries when undoing its own change failed too
/// (the run's timeline says it as `action_restored` with `restored: false`, which is
/// what faces that summarise the outcome look at).
const UNDO_FAILED: &str = "undoing its change failed";

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

/// How a blocked action's reason says that the trail lacks its refusal (the line could
/// not be written or synced), followed by why and a closing parenthesis: faces that
/// word a refusal their own way keep it.
pub const UNAUDITED: &str = " (this refusal's audit line could not be written or made durable: ";

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
    undo_failure: Option<String>,
    /// The action whose own change was last undone: its snapshot is restored, so its
    /// failure line offers no rollback.
    undone: Option<String>,
    /// Set when a restore's audit line could not be appended (its mark is on disk): the
    /// run's record then says so, and the next run or start audits the restore from its
    /// mark, as after a crash.
    unrecorded: bool,
    /// Set when a failed action's change could not be undone: the run's record then
    /// stays `active`, so that the next run of the workflow or the next start judges
    /// its actions against the disk, as after a crash (a write whose audit line and
    /// undo both failed, on a full disk, stood on no line of the trail).
    unsettled: bool,
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
            undo_failure: None,
            undone: None,
            unrecorded: false,
            unsettled: false,
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
        let mut lock = match self.sb.state.lock_workflow(&wf) {
            Ok(l) => l,
            Err(e) => {
                let r = crate::sandbox::workflow_lock_refusal(&wf, &e);
                return self.blocked(vec![Err(r)], !ctx.writes());
            }
        };
        // Before validation, which must see the tree as the dead run's recovery leaves it;
        // after the restores held back before it (its own among them) are recorded.
        if ctx.writes() {
            match self.sb.settle_before_change(&wf) {
                Ok(file) => {
                    if file.is_some() {
                        lock.keep_file();
                    }
                    self.record_file = file;
                }
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

    fn audit_record(
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

    /// The run's result; its timeline is handed over with it.
    fn finish(
        &mut self,
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
            timeline: std::mem::take(&mut self.timeline),
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
                    // A plan the state directory or the disk could not take was
                    // refused by no policy, as a write that fails is not.
                    if r.reason_code != ReasonCode::IoError {
                        self.sb
                            .metrics
                            .denied(&a.intent, r.reason_code, r.is_escape_attempt());
                    }
                    self.sb.metrics.mutation(&a.intent, ActionStatus::Blocked);
                    self.event(
                        "action_blocked",
                        json!({"action_id": a.id(), "reason_code": r.reason_code}),
                    );
                    records.push(self.audit_record(
                        a,
                        &res,
                        AuditStatus::Blocked,
                        self.target_path(a),
                    ));
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
            // Nothing ran, but the caller is told that the trail lacks the refusal
            // (SPEC §8 has every blocked action audited).
            let words = crate::error::io_words(&e);
            for res in results
                .iter_mut()
                .filter(|r| r.status == ActionStatus::Blocked)
            {
                if let Some(reason) = &mut res.reason {
                    reason.push_str(&format!("{UNAUDITED}{words})"));
                }
            }
            self.event("audit_failed", json!({ "error": words }));
        }
        // A phase without sandbox writes refuses every action for that one reason: say so,
        // rather than the generic governance refusal. A plan the state directory or the
        // disk alone refused (`io_error`) was refused by no policy: a simulation says why
        // it was one, a real run gives no such reason.
        let refused = || results.iter().filter(|r| r.status == ActionStatus::Blocked);
        let storage_only = refused().next().is_some()
            && refused().all(|r| r.reason_code == Some(ReasonCode::IoError));
        let why = match self.sb.execution_context().1 {
            Some(DryRunReason::PhaseNotSupported) => Some(DryRunReason::PhaseNotSupported),
            context if storage_only => context,
            _ => Some(DryRunReason::GovernanceBlocked),
        };
        if let Some(why) = why {
            self.event("dry_run_reason", json!({ "reason": why }));
        }
        self.go(WorkflowState::Failed);
        self.finish(RunStatus::Blocked, simulation_only, why, results)
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
            records.push(self.audit_record(a, &res, AuditStatus::Simulated, target));
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
            restoring: Some(String::new()),
        };
        if let Err(r) = self.sb.begin_record(&record, self.record_file.as_ref()) {
            let checks = self.plan.actions.iter().map(|_| Err(r.clone())).collect();
            return self.blocked(checks, false);
        }
        let sb = self.sb;
        self.record = Some(record.clone());
        let file = self.record_file.take();
        let result = self.execute_actions();
        let (unrecorded, unsettled) = (self.unrecorded, self.unsettled);
        // After a failed sync the record stays active instead (`run_finished`): the next
        // start checks the whole run against the disk.
        if unsettled || unrecorded {
            sb.left_for_later(&record.execution_id);
        }
        if unsettled {
            tracing::warn!(workflow = %record.workflow_id, "a failed action of this run could not be undone; its record stays active, for the next run or start to check it against the disk");
        } else if unrecorded
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

    fn execute_actions(&mut self) -> RunResult {
        let actions = std::mem::take(&mut self.plan.actions);
        let (mut results, done, stopped) = self.run_each(&actions);
        let artifacts = self.sb.registry.len().unwrap_or(0);
        self.sb.metrics.set_artifacts(artifacts);
        let Some(stopped) = stopped else {
            self.go(WorkflowState::Done);
            return self.finish(RunStatus::Success, false, None, results);
        };
        self.go(WorkflowState::Failed);
        if stopped == ActionStatus::Blocked {
            // Refused before anything was written, as validation refuses.
            let why = DryRunReason::GovernanceBlocked;
            self.event("dry_run_reason", json!({ "reason": why }));
            return self.finish(RunStatus::Blocked, false, Some(why), results);
        }
        if self.plan.on_failure == OnFailure::Stop || done.is_empty() {
            if done.is_empty()
                && self.plan.on_failure == OnFailure::Rollback
                && self.undo_failure.is_none()
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
            self.unrecorded = true;
        }
        let all_ok = steps.iter().all(|s| s.restored);
        undone_in(&mut results, &steps);
        self.event(
            "rollback_finished",
            json!({"steps_rolled_back": steps.iter().filter(|s| s.restored).count(), "all_restored": all_ok}),
        );
        if all_ok && self.undo_failure.is_none() {
            self.go(WorkflowState::RolledBack);
            self.finish(RunStatus::RolledBack, false, None, results)
        } else {
            self.finish(RunStatus::Failed, false, None, results)
        }
    }

    /// Runs the actions in order until one fails or is refused; those after it are
    /// skipped. Gives every action's result, the snapshots of those done, and, when one
    /// did not go through, its status: `Blocked` (refused before anything of the run was
    /// written) or `Failed`.
    fn run_each(
        &mut self,
        actions: &[Action],
    ) -> (
        Vec<ActionResult>,
        Vec<(usize, StoredSnapshot)>,
        Option<ActionStatus>,
    ) {
        let mut results: Vec<ActionResult> = Vec::new();
        let mut done: Vec<(usize, StoredSnapshot)> = Vec::new();
        let mut stopped: Option<ActionStatus> = None;
        for (i, a) in actions.iter().enumerate() {
            if let Some(status) = stopped {
                let mut res = self.base_result(a, op_for_intent(&a.intent), ActionStatus::Skipped);
                res.reason = Some(
                    if status == ActionStatus::Blocked {
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
                    let (result, event) = if res.status == ActionStatus::Blocked {
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
                    stopped = Some(result);
                }
            }
        }
        (results, done, stopped)
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
        let held = held.and_then(|h| match self.undo_failure {
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

    /// An action's failure or refusal, counted, audited and turned into its result. A
    /// refusal before anything of the action was written, while nothing of the run is
    /// either, blocks the plan as validation would have.
    fn fail_or_block(
        &self,
        a: &Action,
        reached: Reached,
        mut res: ActionResult,
        r: Refusal,
        target: String,
    ) -> Box<ActionResult> {
        let refused = matches!(reached, Reached::Checks { .. });
        let first = matches!(reached, Reached::Checks { first: true });
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
        let rec = self.audit_record(a, &res, status, target);
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
        if let Some(why) = &self.undo_failure {
            r.reason = format!(
                "{}; {UNDO_FAILED} ({why}), so the change may still be in place: roll the workflow back once that is fixed",
                r.reason.strip_suffix(UNDONE_LATER).unwrap_or(&r.reason)
            );
        }
        self.fail_or_block(a, Reached::Writing, res, r, target)
    }
}

/// How a refusal for a held log goes on when the change was undone (see [`log_failure`]);
/// dropped when the undo failed, which is said instead.
const UNDONE_LATER: &str = "; the change was undone, and what the trail still lacks is recorded before this process's next change, when this workflow is next used or at the next start";

/// How far a failed action got, which decides how its failure counts.
#[derive(Debug, Clone, Copy)]
enum Reached {
    /// Its checks at write time: nothing of it was written. `first`: nor anything of
    /// the run.
    Checks { first: bool },
    /// Its snapshot was taken: it had begun writing.
    Writing,
}

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
            let advice = if why.contains(crate::snapshot::ROLL_BACK_AGAIN) {
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
