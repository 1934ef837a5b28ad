//! Execution modes and the reasons a run is only simulated (SPEC §4).
//!
//! A rollback asked for by a user is a write, and is only simulated (and audited as such)
//! unless writes are real (`ExecutionContext::writes`: `sandbox_write` with dry-run off;
//! the `readonly` mode of a phase that allows no writes executes reads alone). So is a
//! prune, which makes writes irreversible: it reports the workflows it would prune,
//! `simulated: true`, and removes nothing. Start-up recovery is not: it only finishes or
//! undoes what a dead run left half done.

use serde::{Deserialize, Serialize};

/// How the runtime executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ExecutionMode {
    Simulation,
    Readonly,
    SandboxWrite,
}

/// Why a run was simulated rather than executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DryRunReason {
    /// The write flag (`AI_LAB_ENABLE_SANDBOX_WRITE`) is off.
    SandboxDisabled,
    /// Dry-run (`AI_LAB_SANDBOX_DRY_RUN`) is on.
    DryRun,
    /// The phase does not allow sandbox writes.
    PhaseNotSupported,
    /// Governance refused the plan.
    GovernanceBlocked,
}

impl DryRunReason {
    /// In words, for an operator: what stops writing, and what would let it (to be
    /// followed by what it would let, as in "… to roll back"), in the terms of the flags
    /// and of the configuration file, whichever face asked.
    pub fn explained(self) -> (&'static str, &'static str) {
        match self {
            Self::DryRun => (
                "dry-run is on",
                "turn dry-run off (--no-dry-run, or dry_run = false in the configuration)",
            ),
            Self::PhaseNotSupported => (
                "the phase does not allow sandbox writes",
                "switch to phase 28.3 (or 28.5 to 28.8)",
            ),
            Self::SandboxDisabled => (
                "writing is disabled",
                "turn writing on (--enable-write --no-dry-run, or enable_write = true and dry_run = false in the configuration)",
            ),
            // Turning writing on would not help: the plan is refused either way.
            Self::GovernanceBlocked => (
                "an action was refused",
                "mend or remove the refused actions (each says why)",
            ),
        }
    }
}

/// The execution context of a run: the mode and the dry-run flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExecutionContext {
    /// The mode.
    pub mode: ExecutionMode,
    /// Whether dry-run is on.
    pub dry_run: bool,
}

impl ExecutionContext {
    /// Derives the context from the flags: sandbox writes need the write flag on, dry-run
    /// off and a phase that allows writes; anything else simulates writes, and says why.
    pub fn from_flags(
        enable_write: bool,
        dry_run: bool,
        phase_allows_write: bool,
    ) -> (Self, Option<DryRunReason>) {
        let reason = if !phase_allows_write {
            Some(DryRunReason::PhaseNotSupported)
        } else if !enable_write {
            Some(DryRunReason::SandboxDisabled)
        } else if dry_run {
            Some(DryRunReason::DryRun)
        } else {
            None
        };
        let mode = match reason {
            None => ExecutionMode::SandboxWrite,
            // Execution is turned on but the phase allows only reads (28.2's read-only
            // executor): reads are real, writes are simulated.
            Some(DryRunReason::PhaseNotSupported) if enable_write && !dry_run => {
                ExecutionMode::Readonly
            }
            Some(_) => ExecutionMode::Simulation,
        };
        (Self { mode, dry_run }, reason)
    }

    /// Whether writes (actions, rollbacks, prunes, a dead run's recovery) are real: only
    /// in `sandbox_write` with dry-run off. `readonly` executes reads alone.
    pub fn writes(&self) -> bool {
        self.mode == ExecutionMode::SandboxWrite && !self.dry_run
    }

    /// True only for `readonly` and `sandbox_write` with dry-run off.
    pub fn is_executable(&self) -> bool {
        matches!(
            self.mode,
            ExecutionMode::Readonly | ExecutionMode::SandboxWrite
        ) && !self.dry_run
    }
}
