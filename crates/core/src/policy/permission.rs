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

/// Tools that are shells, run a command as another user or system, run code given to
/// them, or change permissions: anything routed to them is forbidden.
const SHELL_TOOLS: [&str; 34] = [
    "shell",
    "sh",
    "bash",
    "zsh",
    "dash",
    "ash",
    "ksh",
    "mksh",
    "csh",
    "tcsh",
    "fish",
    "busybox",
    "pwsh",
    "powershell",
    "cmd",
    "wsl",
    "sudo",
    "doas",
    "su",
    "exec",
    "terminal",
    "run_command",
    "exec_command",
    "execute_command",
    "shell_exec",
    "subprocess",
    "spawn",
    "python",
    "python3",
    "node",
    "perl",
    "ruby",
    "chmod",
    "chown",
];

/// Words that name a shell wherever they stand in a tool's name, between `_` or `.`:
/// agents' shell tools are called `run_shell_command`, `local_shell`,
/// `run_in_terminal`, `developer__shell`, `functions.shell`.
const SHELL_PARTS: [&str; 6] = ["shell", "sh", "bash", "zsh", "terminal", "powershell"];

/// Whether a tool names a shell anywhere in it, however it is spelled: `/bin/bash`,
/// `BASH `, `bash -c`, `Bash(ls)`, `bash;`, `/usr/bin/env bash`, `cmd.exe`,
/// `C:\Windows\System32\cmd.exe`, `run-command`, `run_shell_command`, `mcp__shell__run`.
fn is_shell_tool(tool: &str) -> bool {
    let t = tool.to_ascii_lowercase().replace('-', "_");
    t.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '\\')))
        .any(|word| {
            let name = word.rsplit(['/', '\\']).next().unwrap_or_default();
            let name = name.strip_suffix(".exe").unwrap_or(name);
            SHELL_TOOLS.contains(&name)
                || name
                    .split(['_', '.'])
                    .any(|part| SHELL_PARTS.contains(&part))
        })
}

/// Classifies an intent (and the tool asked to carry it out, if any). Unknown intents are
/// forbidden: secure by default.
pub fn classify_permission_scope(intent: &str, tool: Option<&str>) -> PermissionScope {
    if tool.is_some_and(is_shell_tool) {
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
