//! The workflow state machine and timeline (SPEC §6), as pure values.
//!
//! The machine is a run's: each plan starts in `planning`, and `rolled_back` ends that run.
//! A workflow id may take further plans after a rollback; its budgets, rate limit and
//! snapshots span all of its runs.

use serde::{Deserialize, Serialize};

wire_enum! {
    /// A workflow run's state.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[allow(missing_docs)]
    pub enum WorkflowState {
        Planning = "planning",
        Executing = "executing",
        Mutating = "mutating",
        Done = "done",
        Failed = "failed",
        RolledBack = "rolled_back",
    }
}

impl WorkflowState {
    /// Whether `self → to` is one of the allowed transitions.
    pub fn can_transition(self, to: WorkflowState) -> bool {
        use WorkflowState::*;
        matches!(
            (self, to),
            (Planning, Executing)
                | (Planning, Failed)
                | (Executing, Mutating)
                | (Executing, Done)
                | (Executing, Failed)
                | (Mutating, Done)
                | (Mutating, Failed)
                | (Done, RolledBack)
                | (Failed, RolledBack)
        )
    }

    /// Whether no transition leaves this state.
    pub fn is_terminal(self) -> bool {
        Self::ALL.iter().all(|&to| !self.can_transition(to))
    }
}

/// An illegal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal workflow transition {from} -> {to}")]
pub struct IllegalTransition {
    /// Where it was.
    pub from: WorkflowState,
    /// Where it was asked to go.
    pub to: WorkflowState,
}

/// Applies a transition, refusing illegal ones.
pub fn transition(
    from: WorkflowState,
    to: WorkflowState,
) -> Result<WorkflowState, IllegalTransition> {
    if from.can_transition(to) {
        Ok(to)
    } else {
        Err(IllegalTransition { from, to })
    }
}

/// One timestamped event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// When (RFC 3339, UTC).
    pub at: String,
    /// What: `execution_started`, `dry_run_reason`, `action_blocked`, `action_succeeded`,
    /// `action_failed`, `rollback_started`, `rollback_finished`, `state_changed`, …
    pub event: String,
    /// Details.
    pub detail: serde_json::Value,
}
