//! Stable reason codes: the vocabulary every refusal and failure is reported in.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why an action was refused or failed. The snake_case names are part of the contract
/// (SPEC §5): scripts match on them, so a variant is never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ReasonCode {
    PhaseNotSupported,
    NotSandboxWrite,
    ForbiddenIntent,
    UnknownOperation,
    ChmodForbidden,
    PathTraversal,
    DepthExceeded,
    OutsideSandbox,
    ReservedPath,
    SymlinkEscape,
    SymlinkRefused,
    HardlinkRefused,
    NotRegularFile,
    BlockedExtension,
    ExtensionNotAllowed,
    SizeExceeded,
    AlreadyExists,
    NotFound,
    EditNotFound,
    EditAmbiguous,
    InvalidId,
    InvalidPlan,
    BudgetArtifactsExceeded,
    BudgetBytesExceeded,
    RateLimited,
    Conflict,
    NoRollbackData,
    ChecksumMismatch,
    IoError,
}

impl ReasonCode {
    /// Every code, in the order SPEC §5 lists them.
    pub const ALL: [ReasonCode; 29] = [
        Self::PhaseNotSupported,
        Self::NotSandboxWrite,
        Self::ForbiddenIntent,
        Self::UnknownOperation,
        Self::ChmodForbidden,
        Self::PathTraversal,
        Self::DepthExceeded,
        Self::OutsideSandbox,
        Self::ReservedPath,
        Self::SymlinkEscape,
        Self::SymlinkRefused,
        Self::HardlinkRefused,
        Self::NotRegularFile,
        Self::BlockedExtension,
        Self::ExtensionNotAllowed,
        Self::SizeExceeded,
        Self::AlreadyExists,
        Self::NotFound,
        Self::EditNotFound,
        Self::EditAmbiguous,
        Self::InvalidId,
        Self::InvalidPlan,
        Self::BudgetArtifactsExceeded,
        Self::BudgetBytesExceeded,
        Self::RateLimited,
        Self::Conflict,
        Self::NoRollbackData,
        Self::ChecksumMismatch,
        Self::IoError,
    ];

    /// The wire name, e.g. `path_traversal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PhaseNotSupported => "phase_not_supported",
            Self::NotSandboxWrite => "not_sandbox_write",
            Self::ForbiddenIntent => "forbidden_intent",
            Self::UnknownOperation => "unknown_operation",
            Self::ChmodForbidden => "chmod_forbidden",
            Self::PathTraversal => "path_traversal",
            Self::DepthExceeded => "depth_exceeded",
            Self::OutsideSandbox => "outside_sandbox",
            Self::ReservedPath => "reserved_path",
            Self::SymlinkEscape => "symlink_escape",
            Self::SymlinkRefused => "symlink_refused",
            Self::HardlinkRefused => "hardlink_refused",
            Self::NotRegularFile => "not_regular_file",
            Self::BlockedExtension => "blocked_extension",
            Self::ExtensionNotAllowed => "extension_not_allowed",
            Self::SizeExceeded => "size_exceeded",
            Self::AlreadyExists => "already_exists",
            Self::NotFound => "not_found",
            Self::EditNotFound => "edit_not_found",
            Self::EditAmbiguous => "edit_ambiguous",
            Self::InvalidId => "invalid_id",
            Self::InvalidPlan => "invalid_plan",
            Self::BudgetArtifactsExceeded => "budget_artifacts_exceeded",
            Self::BudgetBytesExceeded => "budget_bytes_exceeded",
            Self::RateLimited => "rate_limited",
            Self::Conflict => "conflict",
            Self::NoRollbackData => "no_rollback_data",
            Self::ChecksumMismatch => "checksum_mismatch",
            Self::IoError => "io_error",
        }
    }

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

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
}

impl Refusal {
    /// Builds a refusal.
    pub fn new(reason_code: ReasonCode, reason: impl Into<String>) -> Self {
        Self {
            reason_code,
            reason: reason.into(),
            retry_after_seconds: None,
            malformed: false,
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
