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
const SHELL_TOOLS: [&str; 44] = [
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
    "pkexec",
];

/// Words that name a shell or a runner of code wherever they stand in a tool's name,
/// between `_` or `.`: agents' shell tools are called `run_shell_command`,
/// `local_shell`, `developer__shell`, `functions.shell`, `subprocess.run`.
const SHELL_PARTS: [&str; 6] = [
    "shell",
    "bash",
    "zsh",
    "powershell",
    "subprocess",
    "ipython",
];

/// A part that runs something, and one that says it is a command: together they name a
/// runner of commands (`run_cmd`, `run_in_terminal`, `execute_command`,
/// `desktop_commander__execute_command`), where either alone does not
/// (`write_to_terminal_log`, `run_report`, `run_code_review`).
const RUN_PARTS: [&str; 5] = ["run", "exec", "execute", "spawn", "eval"];
const RUN_WHAT: [&str; 5] = ["command", "cmd", "terminal", "bash", "python"];

/// Whole names of runners that the rules above do not catch.
const RUNNERS: [&str; 5] = [
    "os.system",
    "child_process.exec",
    "child_process.execsync",
    "code_interpreter",
    "execute_python",
];

/// What a script is called by: a tool that is a script runs commands.
const SCRIPT_ENDINGS: [&str; 6] = [".sh", ".bash", ".zsh", ".ps1", ".bat", ".cmd"];

/// Whether a tool names a shell, however it is spelled: `/bin/bash`, `BASH `, `bash -c`,
/// `bash;`, `/usr/bin/env bash`, `cmd.exe`, `C:\Windows\System32\cmd.exe`,
/// `run-command`, `runShellCommand`, `run_shell_command`, `mcp__shell__run`,
/// `Bash(ls)`, `./deploy.sh`, `ｂａｓｈ` (read as a person reads it: see
/// [`super::chmod::plain`]). The command is the name's first word (after `env`, `sudo`
/// and the like, which run the next one); what stands in parentheses is the tool's
/// argument, not its name (`Write(deploy.sh)` writes a file), and later words are its
/// arguments (`Write Python File`).
fn is_shell_tool(tool: &str) -> bool {
    // camelCase names are split as snake_case ones are (`runInTerminal`).
    let mut t = String::with_capacity(tool.len() + 8);
    let mut lower_before = false;
    for c in super::chmod::plain(tool).chars() {
        if c.is_ascii_uppercase() && lower_before {
            t.push('_');
        }
        lower_before = c.is_ascii_lowercase() || c.is_ascii_digit();
        t.push(c.to_ascii_lowercase());
    }
    let t = t.replace('-', "_");
    let name = t.split('(').next().unwrap_or_default();
    // A Windows drive letter is part of the path, not a word of its own.
    let name = match name.as_bytes() {
        [d, b':', b'\\' | b'/', ..] if d.is_ascii_alphabetic() => &name[2..],
        _ => name,
    };
    let all: Vec<&str> = name
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '\\')))
        .filter(|w| !w.is_empty())
        .collect();
    let mut words = all.iter().copied();
    let base = |word: &'_ str| -> String {
        let b = word.rsplit(['/', '\\']).next().unwrap_or_default();
        b.strip_suffix(".exe").unwrap_or(b).to_owned()
    };
    let mut command = words.next().map(base).unwrap_or_default();
    // A wrapper runs the word after it.
    while matches!(command.as_str(), "env" | "nohup" | "time" | "nice") {
        match words.next() {
            Some(w) => command = base(w),
            None => break,
        }
    }
    let unversioned = command.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    // The words of a title (`Run Command`) are the parts of one name.
    let joined = all.iter().map(|w| base(w)).collect::<Vec<_>>().join("_");
    let parts: Vec<&str> = joined.split(['_', '.']).collect();
    let has = |set: &[&str]| parts.iter().any(|p| set.contains(p));
    SHELL_TOOLS.contains(&command.as_str())
        || SHELL_TOOLS.contains(&unversioned)
        || RUNNERS.contains(&command.as_str())
        || SCRIPT_ENDINGS.iter().any(|e| command.ends_with(e))
        || has(&SHELL_PARTS)
        || (has(&RUN_PARTS) && has(&RUN_WHAT))
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
