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
/// them, or change permissions: anything routed to them is forbidden. Names are compared
/// without a version at their end (`python3.12`, `perl5`, `ruby3.2` are `python`,
/// `perl`, `ruby`).
const SHELL_TOOLS: [&str; 43] = [
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
    "node",
    "nodejs",
    "deno",
    "perl",
    "ruby",
    "php",
    "lua",
    "chmod",
    "chown",
    "chgrp",
    "setfacl",
    "setcap",
    "sudoedit",
    "runuser",
    "ssh",
];

/// Words that name a shell or a runner of code wherever they stand in a tool's name,
/// between `_` or `.`: agents' shell tools are called `run_shell_command`,
/// `local_shell`, `developer__shell`, `functions.shell`, `code_interpreter`,
/// `subprocess.run`.
const SHELL_PARTS: [&str; 8] = [
    "shell",
    "bash",
    "zsh",
    "powershell",
    "subprocess",
    "interpreter",
    "ipython",
    "pkexec",
];

/// A part that runs something, and one that says what: together they name a runner of
/// commands or code (`run_cmd`, `execute_python`, `run_in_terminal`, `os.system`,
/// `child_process.exec`, `desktop_commander__execute_command`), where either alone does
/// not (`write_to_terminal_log`, `run_report`).
const RUN_PARTS: [&str; 6] = ["run", "exec", "execute", "spawn", "system", "eval"];
const RUN_WHAT: [&str; 9] = [
    "command", "cmd", "terminal", "code", "python", "script", "process", "os", "shell",
];

/// Whether a tool names a shell, however it is spelled: `/bin/bash`, `BASH `, `bash -c`,
/// `bash;`, `/usr/bin/env bash`, `cmd.exe`, `C:\Windows\System32\cmd.exe`,
/// `run-command`, `run_shell_command`, `mcp__shell__run`, `Bash(ls)`, `ｂａｓｈ` (read as a
/// person reads it: see [`super::chmod::plain`]). What stands in parentheses is the
/// tool's argument, not its name (`Write(deploy.sh)` writes a file).
fn is_shell_tool(tool: &str) -> bool {
    let t = super::chmod::plain(tool)
        .to_ascii_lowercase()
        .replace('-', "_");
    let name = t.split('(').next().unwrap_or_default();
    name.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '\\')))
        .any(|word| {
            let base = word.rsplit(['/', '\\']).next().unwrap_or_default();
            let base = base.strip_suffix(".exe").unwrap_or(base);
            let unversioned = base.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
            let parts: Vec<&str> = base.split(['_', '.']).collect();
            let has = |set: &[&str]| parts.iter().any(|p| set.contains(p));
            SHELL_TOOLS.contains(&base)
                || SHELL_TOOLS.contains(&unversioned)
                || has(&SHELL_PARTS)
                || (has(&RUN_PARTS) && has(&RUN_WHAT))
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
