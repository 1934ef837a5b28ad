//! Permission scopes and the phase table (SPEC §4).

use crate::catalog::{FORBIDDEN_INTENTS, READ_INTENTS, is_sandbox_write_intent};
use serde::{Deserialize, Serialize};

/// The scope an intent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum PermissionScope {
    Readonly,
    WorkspaceWriteReserved,
    RuntimeWriteReserved,
    PrivilegedReserved,
    Forbidden,
}

/// The default phase: the sandbox write executor.
pub const DEFAULT_PHASE: &str = "28.3";

/// Tools that are shells in disguise: anything routed to them is forbidden.
const SHELL_TOOLS: [&str; 6] = ["shell", "bash", "sh", "exec", "terminal", "run_command"];

/// Classifies an intent (and the tool asked to carry it out, if any). Unknown intents are
/// forbidden: secure by default.
pub fn classify_permission_scope(intent: &str, tool: Option<&str>) -> PermissionScope {
    if tool.is_some_and(|t| SHELL_TOOLS.contains(&t.to_ascii_lowercase().as_str())) {
        return PermissionScope::Forbidden;
    }
    if FORBIDDEN_INTENTS.contains(&intent) {
        PermissionScope::Forbidden
    } else if is_sandbox_write_intent(intent) {
        PermissionScope::WorkspaceWriteReserved
    } else if READ_INTENTS.contains(&intent) {
        PermissionScope::Readonly
    } else {
        PermissionScope::Forbidden
    }
}

/// The scopes a phase allows. An unknown phase allows only `readonly`.
pub fn allowed_scopes(phase: &str) -> &'static [PermissionScope] {
    use PermissionScope::*;
    match phase {
        "28.3" | "28.5" => &[Readonly, WorkspaceWriteReserved],
        "28.6" => &[Readonly, WorkspaceWriteReserved, RuntimeWriteReserved],
        "28.7" | "28.8" => &[
            Readonly,
            WorkspaceWriteReserved,
            RuntimeWriteReserved,
            PrivilegedReserved,
        ],
        _ => &[Readonly],
    }
}

/// Whether `phase` allows sandbox writes.
pub fn phase_supports_sandbox_write(phase: &str) -> bool {
    allowed_scopes(phase).contains(&PermissionScope::WorkspaceWriteReserved)
}

/// Whether `scope` is allowed in `phase`.
pub fn is_scope_allowed(phase: &str, scope: PermissionScope) -> bool {
    allowed_scopes(phase).contains(&scope)
}
