//! Stable reason codes: the vocabulary every refusal and failure is reported in.

use serde::{Deserialize, Serialize};
use std::fmt;

wire_enum! {
    /// Why an action was refused or failed. The snake_case names are part of the contract
    /// (SPEC §5): scripts match on them, so a variant is never renamed. Declared in the
    /// order SPEC §5 lists them, which `ALL` keeps.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[allow(missing_docs)]
    pub enum ReasonCode {
        PhaseNotSupported = "phase_not_supported",
        NotSandboxWrite = "not_sandbox_write",
        ForbiddenIntent = "forbidden_intent",
        UnknownOperation = "unknown_operation",
        ChmodForbidden = "chmod_forbidden",
        PathTraversal = "path_traversal",
        DepthExceeded = "depth_exceeded",
        OutsideSandbox = "outside_sandbox",
        ReservedPath = "reserved_path",
        SymlinkEscape = "symlink_escape",
        SymlinkRefused = "symlink_refused",
        HardlinkRefused = "hardlink_refused",
        NotRegularFile = "not_regular_file",
        BlockedExtension = "blocked_extension",
        ExtensionNotAllowed = "extension_not_allowed",
        SizeExceeded = "size_exceeded",
        AlreadyExists = "already_exists",
        NotFound = "not_found",
        EditNotFound = "edit_not_found",
        EditAmbiguous = "edit_ambiguous",
        InvalidId = "invalid_id",
        InvalidPlan = "invalid_plan",
        BudgetArtifactsExceeded = "budget_artifacts_exceeded",
        BudgetBytesExceeded = "budget_bytes_exceeded",
        RateLimited = "rate_limited",
        Conflict = "conflict",
        NoRollbackData = "no_rollback_data",
        ChecksumMismatch = "checksum_mismatch",
        IoError = "io_error",
    }
}

impl ReasonCode {
    /// Whether the code reports an attempt to reach outside a root (counted in
    /// `ailab_sandbox_escape_attempts_total`).
    pub fn is_escape_attempt(self) -> bool {
        matches!(
            self,
            Self::PathTraversal
                | Self::OutsideSandbox
                | Self::SymlinkEscape
                | Self::HardlinkRefused
                | Self::ReservedPath
        )
    }
}

/// A refusal: a stable code plus a sentence a person can act on. A policy denial is a
/// value, not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The stable code.
    pub reason_code: ReasonCode,
    /// What was wrong, naming the offending value and what is allowed.
    pub reason: String,
    /// For `rate_limited`: whole seconds until the writes asked for are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// The target was refused for how it was written (an empty path, `//`, a root named
    /// as the target), not for where it leads: not counted as an escape attempt.
    #[serde(skip)]
    pub malformed: bool,
    /// The system refused the operation for a permission (EACCES, EPERM): something a
    /// later try may pass, once access is given, not what the path holds.
    #[serde(skip)]
    pub denied: bool,
    /// Met after the action had made something (folders on its target's way): its
    /// undo must look at what stands rather than take the target as untouched.
    #[serde(skip)]
    pub touched: bool,
}

impl Refusal {
    /// Builds a refusal.
    pub fn new(reason_code: ReasonCode, reason: impl Into<String>) -> Self {
        Self {
            reason_code,
            reason: reason.into(),
            retry_after_seconds: None,
            malformed: false,
            denied: false,
            touched: false,
        }
    }

    /// The same refusal, for a target written wrongly rather than aimed outside a root.
    #[must_use]
    pub fn malformed(mut self) -> Self {
        self.malformed = true;
        self
    }

    /// Whether it reports an attempt to reach outside a root (counted in
    /// `ailab_sandbox_escape_attempts_total`): its code is one, and the target was not
    /// merely written wrongly.
    pub fn is_escape_attempt(&self) -> bool {
        self.reason_code.is_escape_attempt() && !self.malformed
    }

    /// The same refusal, saying when to try again.
    #[must_use]
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_seconds = Some(seconds);
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason_code, self.reason)
    }
}

impl std::error::Error for Refusal {}

/// Shorthand for a check that either passes or refuses.
pub type Verdict<T = ()> = Result<T, Refusal>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_match_serde() {
        for code in ReasonCode::ALL {
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
