//! Permission scopes and the phase table (SPEC §4), and which tool names a shell, an
//! interpreter or a permission change (an action routed to one is forbidden).

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
const SHELL_TOOLS: [&str; 107] = [
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
    "npx",
    "pnpx",
    "bunx",
    "uvx",
    "pipx",
    "tsx",
    "ts_node",
    "tsnode",
    "rscript",
    "raku",
    "tclsh",
    "irb",
    "jshell",
    "ghci",
    "osascript",
    "cscript",
    "wscript",
    "awk",
    "gawk",
    "nawk",
    "mawk",
    "tmux",
    "xterm",
    "xargs",
    "nohup",
    "nsenter",
    "chroot",
    "systemd_run",
    // Interpreters, Windows' and macOS's runners and permission tools, and the
    // schedulers and service managers that run what they are given.
    "pypy",
    "micropython",
    "runghc",
    "toybox",
    "popen",
    "psexec",
    "mshta",
    "rundll32",
    "schtasks",
    "launchctl",
    "systemctl",
    "crontab",
    "chattr",
    "icacls",
    "cacls",
    "takeown",
    "capsh",
    "set_executionpolicy",
    // Shells and interpreters of fewer users, and tools that run the command or
    // shell they are given (`socat exec:…`, `strace make`).
    "xonsh",
    "elvish",
    "yash",
    "murex",
    "ysh",
    "nushell",
    "sbcl",
    "guile",
    "racket",
    "clisp",
    "pry",
    "zx",
    "socat",
    "ncat",
    "strace",
    "ltrace",
    "ocaml",
];

/// Runners whose names are also common words or parts of them (`Baking Bun Recipes`,
/// `Julia Plot Saver`, `make_directory`, `docker_docs`): a tool's name is one of them
/// only where a command line names its program (see [`programs`]), written in lower
/// case (`bun run deploy`, `/usr/bin/env julia`, `julia1.10`, `make deploy`,
/// `nice make`, `ls && make`, `$(make)`, `docker run img`, `py -3`). Build tools and
/// container runners run what their files or images say, and so do the tools that
/// apply manifests and playbooks (`terraform apply`, `ansible-playbook site.yml`);
/// `expect` runs its scripts, `screen` the command it is given, and the cloud's command
/// lines what they are asked on remote machines (`gcloud compute ssh vm --command x`).
const RUNNERS_ALONE: [&str; 82] = [
    "istioctl",
    "argocd",
    "expect",
    "pulumi",
    "screen",
    "aws",
    "gcloud",
    "terraform",
    "helm",
    "ansible",
    "ansible_playbook",
    "gradle",
    "gradlew",
    "mvn",
    "bun",
    "julia",
    "npm",
    "yarn",
    "pnpm",
    "cargo",
    "poetry",
    "uv",
    "pipenv",
    "make",
    "gmake",
    "docker",
    "docker_compose",
    "podman",
    "podman_compose",
    "nerdctl",
    "ctr",
    "kubectl",
    "py",
    "iex",
    // Interpreters and debuggers whose names are also words (`Java Formatter`, `Swift
    // Notes`, `Mono Repo Map`, `Wish List`): a runner where a command line names them.
    "java",
    "groovy",
    "kotlin",
    "scala",
    "erl",
    "elixir",
    "swift",
    "dotnet",
    "mono",
    "csi",
    "wish",
    "gdb",
    "jupyter",
    "winrm",
    // Shells, runners and package managers (which run what a package's scripts say)
    // whose names are words too (`Go To Line`, `Parallel Sort`, `Gem Catalog`).
    "nu",
    "osh",
    "go",
    "nc",
    "parallel",
    "cron",
    "pip",
    "apt",
    "apt_get",
    "yum",
    "dnf",
    "brew",
    "gem",
    "cpan",
    "conda",
    "mamba",
    "micromamba",
    "zypper",
    "pacman",
    "apk",
    "snap",
    "emerge",
    "opam",
    "composer",
    "nix",
    "corepack",
    "flatpak",
    "rake",
    "ant",
    "lein",
    "sbt",
    "mix",
    "cabal",
    "stack",
];

/// Commands that run the command after them (and their options): `env -i make`,
/// `nice -n 5 make`, `timeout 10 make`, `xargs make`; and the shell's words that do
/// (`if true; then make; fi`).
const RUN_BEFORE: [&str; 25] = [
    "env", "nice", "nohup", "time", "timeout", "command", "builtin", "exec", "stdbuf", "ionice",
    "setsid", "chrt", "taskset", "xargs", "sudo", "doas", "watch", "unbuffer", "if", "then",
    "else", "elif", "do", "while", "until",
];

/// The words of `line` that may name the program a command line runs: the first of
/// each command (after `;`, `&&`, `|`, `(`, `$(`, a backquote, a brace or a new line,
/// and after `&` in a line that begins in lower case, not a title's `Read & Write`),
/// past assignments (`FOO=1 make`), and the first after what [`RUN_BEFORE`] names in
/// lower case, past its options and numbers (`nice -n 5 make`), the word after an
/// option being taken too, as it may be the option's value (`env -u HOME make`), and a
/// quoted value being one word. A word is read up to its first character no program's
/// name holds (`make:deploy`, `npm@10`).
fn programs(line: &str) -> Vec<String> {
    let name_char = |c: char| c.is_alphanumeric() || "_-./\\".contains(c);
    let titled = line.trim_start().starts_with(|c: char| c.is_uppercase());
    // A quoted value is one word (`env FOO="a b" make`).
    let mut quote = None;
    let line: String = line
        .chars()
        .map(|c| match quote {
            Some(q) if c == q => {
                quote = None;
                c
            }
            Some(_) if c.is_whitespace() => '_',
            Some(_) => c,
            None => {
                if matches!(c, '"' | '\'') {
                    quote = Some(c);
                }
                c
            }
        })
        .collect();
    let mut line = line.replace("&&", ";").replace("$(", ";");
    if !titled {
        line = line.replace('&', ";");
    }
    let mut found = Vec::new();
    for command in line.split([';', '|', '(', ')', '`', '{', '}', '\n']) {
        // After a word that runs the next command; after an option of it.
        let (mut runner, mut option) = (false, false);
        for w in command.split_whitespace() {
            let w = w.trim_matches(|c: char| !name_char(c));
            let number = w
                .trim_end_matches(['s', 'm', 'h', 'd'])
                .parse::<f64>()
                .is_ok();
            if w.is_empty() || w.contains('=') || (runner && (number || w.starts_with('-'))) {
                option |= runner && w.starts_with('-');
                continue;
            }
            let name = &w[..w.find(|c: char| !name_char(c)).unwrap_or(w.len())];
            found.push(name.to_owned());
            let base = base_name(name);
            if w.starts_with(|c: char| !c.is_uppercase()) && RUN_BEFORE.contains(&base.as_str()) {
                // These take a value before the command (`taskset 0x3 make`).
                (runner, option) = (
                    true,
                    ["timeout", "taskset", "chrt"].contains(&base.as_str()),
                );
            } else if runner && option {
                option = false;
            } else {
                break;
            }
        }
    }
    found
}

/// A word's last path component in lower case, `-` read as `_`, without `.exe`.
fn base_name(word: &str) -> String {
    let b = word.rsplit(['/', '\\']).next().unwrap_or_default();
    let b = b.to_ascii_lowercase().replace('-', "_");
    b.strip_suffix(".exe").map(str::to_owned).unwrap_or(b)
}

/// A name without the version at its end (`python3.12`, `julia1.10`, `julia-1.10`).
fn unversioned(name: &str) -> &str {
    let bare = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    match bare.strip_suffix(['_', '-']) {
        Some(b) if bare.len() < name.len() => b,
        _ => bare,
    }
}

/// Names of runners that are also the endings of source files a tool may be named
/// after (`App.tsx`, `config.lua`): after a dot they are an extension, not a namespace's
/// member (`functions.python`, `mcp.sudo` are members).
const SOURCE_ENDINGS: [&str; 5] = ["tsx", "lua", "php", "node", "fish"];

/// Words that name a shell or a runner of code wherever they stand in a tool's name,
/// between `_` or `.`: agents' shell tools are called `run_shell_command`,
/// `local_shell`, `developer__shell`, `functions.shell`, `subprocess.run`,
/// `code_interpreter`, `python_repl`.
const SHELL_PARTS: [&str; 8] = [
    "shell",
    "bash",
    "zsh",
    "powershell",
    "subprocess",
    "ipython",
    "interpreter",
    "repl",
];

/// A part that runs something, and one that says what: together they name a runner of
/// commands or code (`run_cmd`, `run_in_terminal`, `execute_code`, `run_script`,
/// `start_process`, `desktop_commander__execute_command`, `docker_exec`,
/// `run_container`, `code_execution`, `CodeExecutor`), where either alone does not
/// (`write_to_terminal_log`, `run_report`, `docker_docs`, `make_run_report`), nor what
/// is written about a run (`run_command_history`).
const RUN_PARTS: [&str; 9] = [
    "run",
    "exec",
    "execute",
    "spawn",
    "eval",
    "start",
    "interact",
    "execution",
    "executor",
];
const RUN_WHAT: [&str; 25] = [
    "command",
    "commands",
    "cmd",
    "terminal",
    "bash",
    "python",
    "code",
    "script",
    "process",
    "shell",
    "js",
    "javascript",
    "typescript",
    "applescript",
    "bun",
    "julia",
    "container",
    "docker",
    "podman",
    "nerdctl",
    "kubectl",
    "kube",
    "k8s",
    "kubernetes",
    "apptainer",
];

/// What a run word right before it runs, besides the shells, interpreters and
/// runners named above (`run_program`, `exec_pod`, `exec_in_pod`), or right after it
/// at a name's end (`pods_exec`).
const RUN_NEXT: [&str; 10] = [
    "pod", "pods", "ts", "go", "java", "dotnet", "exe", "binary", "program", "notebook",
];

/// Where a run word runs what it is given, said after it with a word between
/// (`run_on_host`, `run_in_sandbox`) or before it at a name's end (`remote_exec`,
/// `compose_run`), not right after it (`run_host_inventory_report`, `start_compose`).
const RUN_WHERE: [&str; 6] = ["host", "remote", "vm", "sandbox", "compose", "container"];

/// Words that may stand between a run word and what it runs (`exec_in_pod`).
const RUN_IN: [&str; 6] = ["in", "on", "inside", "via", "with", "using"];

/// Run words that, last in a name, say the word before them is run (`node_run`,
/// `ssh_exec`, `pods_exec`), where `start` does not (`record_node_start`); `eval` and
/// `interact` only after an interpreter's or a runner's name or a language
/// ([`EVAL_LANGUAGES`]: `ruby_eval`, `go_eval`, not `program_eval`).
const RUN_LAST: [&str; 4] = ["run", "exec", "execute", "spawn"];

/// Whole names of runners that the rules above do not catch.
const RUNNERS: [&str; 7] = [
    "e2b_data_analysis",
    "invoke_expression",
    "os.system",
    "child_process.exec",
    "child_process.execsync",
    "code_interpreter",
    "execute_python",
];

/// Pairs of parts that name a tool that runs code, commands or what its files say,
/// which the rules above do not catch: a script in a browser or a page, keys or text
/// typed into a terminal, a new process, a playbook, a manifest or plan applied, a chart
/// installed or upgraded, a function invoked, a cloud's command line, an IDE's task,
/// tests or run configuration, a desktop automated (`browser_evaluate`,
/// `puppeteer_evaluate`, `send_keys`, `write_to_terminal`, `kubectl_apply`,
/// `apply_terraform`, `aws_cli`, `call_aws`, `run_task`), a package installed (its
/// scripts run), a proxy that calls whatever tool it is given (`execute_tool`,
/// `use_mcp_tool`), a slash command (whose lines may run a shell). At the name's end or
/// before what qualifies the run (`kubectl_apply_manifest`, `send_keys_to_pane`,
/// `terraform_apply_auto_approve`), not before a thing written ([`WRITTEN`]:
/// `send_keys_doc`, `aws_cli_notes`). A notebook's cells are [`runs_cells`]'.
const RUNNER_PAIRS: [[&str; 2]; 58] = [
    ["install", "package"],
    ["install", "packages"],
    ["execute", "tool"],
    ["use", "mcp"],
    ["slash", "command"],
    ["pulumi", "preview"],
    ["cli", "preview"],
    ["launch", "tool"],
    ["off", "dyno"],
    ["template", "apply"],
    ["install", "helm"],
    ["upgrade", "helm"],
    ["apply", "terraform"],
    ["cli", "up"],
    ["browserbase", "evaluate"],
    ["kubectl", "create"],
    ["kubectl", "generic"],
    ["local", "invoke"],
    ["to", "terminal"],
    ["write", "stdin"],
    ["resources", "create"],
    ["apply", "yaml"],
    ["deploy", "compose"],
    ["recreate", "container"],
    ["call", "aws"],
    ["use", "aws"],
    ["extension", "az"],
    ["automation", "script"],
    ["computer", "control"],
    ["run", "task"],
    ["run", "tests"],
    ["run", "configuration"],
    ["jupyter", "execute"],
    ["evaluate", "script"],
    ["evaluate", "javascript"],
    ["evaluate", "js"],
    ["browser", "evaluate"],
    ["page", "evaluate"],
    ["puppeteer", "evaluate"],
    ["playwright", "evaluate"],
    ["send", "keys"],
    ["create", "process"],
    ["launch", "app"],
    ["run", "playbook"],
    ["ansible", "playbook"],
    ["kubectl", "apply"],
    ["terraform", "apply"],
    ["helm", "install"],
    ["helm", "upgrade"],
    ["pulumi", "up"],
    ["compose", "up"],
    ["gradle", "run"],
    ["invoke", "lambda"],
    ["lambda", "invoke"],
    ["invoke", "function"],
    ["aws", "cli"],
    ["gcloud", "cli"],
    ["azure", "cli"],
];

/// Things written about a run rather than running it, when they follow what names one
/// (`execute_cell_notes`, `kubectl_apply_docs`, `create_process_diagram`).
const WRITTEN: [&str; 24] = [
    "help",
    "analysis",
    "notes",
    "note",
    "doc",
    "docs",
    "documentation",
    "guide",
    "guides",
    "log",
    "logs",
    "report",
    "reports",
    "summary",
    "readme",
    "history",
    "diagram",
    "template",
    "templates",
    "checklist",
    "tutorial",
    "reference",
    "results",
    "md",
];

/// Whether the parts `seq` of a name run a notebook's cells: `run`, `exec` or `execute`
/// before `cell` or `cells`, one word between at most (`execute_cell`, `run_all_cells`,
/// `execute_cell_with_progress`, `mcp__jupyter__execute_cell`, `Run Cell`), not before
/// a thing written (`execute_cell_notes`).
fn runs_cells(seq: &[String]) -> bool {
    let cells = |p: &String| p == "cell" || p == "cells";
    seq.iter().enumerate().any(|(i, p)| {
        ["run", "exec", "execute"].contains(&p.as_str())
            && (i + 1..=i + 2)
                .find(|&j| seq.get(j).is_some_and(cells))
                .is_some_and(|j| !written_at(seq, j + 1))
    })
}

/// Whether the parts `seq` of a name hold one of [`RUNNER_PAIRS`], not before a thing
/// written.
fn pair_names_runner(seq: &[String]) -> bool {
    seq.windows(2).enumerate().any(|(i, w)| {
        RUNNER_PAIRS.iter().any(|[a, b]| w[0] == *a && w[1] == *b)
            && !written_at(seq, i + 2)
            && !business_process(seq, i + 1)
    })
}

/// Whether the part at `at` of `seq` names a thing written ([`WRITTEN`]).
fn written_at(seq: &[String], at: usize) -> bool {
    seq.get(at).is_some_and(|p| WRITTEN.contains(&p.as_str()))
}

/// Whether the part at `at` of `seq` is a business process, not a program's
/// (`start_process_instance`, `create_process_definition` of a workflow engine).
fn business_process(seq: &[String], at: usize) -> bool {
    seq.get(at).is_some_and(|p| p == "process")
        && seq.get(at + 1).is_some_and(|p| {
            [
                "instance",
                "instances",
                "definition",
                "definitions",
                "model",
                "variables",
            ]
            .contains(&p.as_str())
        })
}

/// What a script is called by: a tool that is a script runs commands.
const SCRIPT_ENDINGS: [&str; 10] = [
    ".sh", ".bash", ".zsh", ".ps1", ".bat", ".cmd", ".py", ".pl", ".rb", ".vbs",
];

/// Whether a tool names a shell, however it is spelled: `/bin/bash`, `BASH `, `bash -c`,
/// `bash;`, `/usr/bin/env bash`, `env -i sh`, `docker exec c sh`, `cmd.exe`,
/// `C:\Windows\System32\cmd.exe`, `run-command`, `runShellCommand`,
/// `run_shell_command`, `mcp__shell__run`, `Bash(ls)`, `./deploy.sh`, `ｂａｓｈ` (read as a
/// person reads it: see [`super::chmod::plain`]). Any word of it counts, so a title that
/// names an interpreter (`Write Python File`) is refused too: a false refusal costs a
/// renamed tool, a missed runner a shell. What stands in parentheses is the tool's
/// argument, not its name (`Write(deploy.sh)` writes a file); what stands after them is
/// the name's again (`Write(x) bash`), and a tool that is only an argument is named by
/// it (`(bash)`).
fn is_shell_tool(tool: &str) -> bool {
    let plain = super::chmod::plain_keeping_accents(tool);
    let outside = outside_parentheses(&plain);
    let name = if outside.trim().is_empty() && !plain.contains('$') {
        plain.as_str()
    } else {
        outside.as_str()
    };
    // A Windows drive letter is part of the path, not a word of its own.
    let name = match name.as_bytes() {
        [d, b':', b'\\' | b'/', ..] if d.is_ascii_alphabetic() => &name[2..],
        _ => name,
    };
    // An accented letter is part of its word (`suất` is not `su`).
    let words: Vec<&str> = name
        .split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '\\')))
        .filter(|w| !w.is_empty())
        .collect();
    // A command substituted or grouped is a command line of its own (`$(make)`), not
    // a tool's argument.
    let line = match name.trim_end().strip_suffix('$') {
        Some(_) => plain.as_str(),
        None if name.trim().is_empty() => plain.as_str(),
        None => name,
    };
    // A tool named only `execute`, `run` (Open Interpreter's) or `eval` runs what it is given;
    // beside another word it may run a query (`Execute Query`).
    words.iter().any(|w| names_runner(w))
        || (words.len() == 1 && ["execute", "run", "eval"].contains(&base_name(words[0]).as_str()))
        || programs(line).iter().any(|w| {
            w.starts_with(|c: char| !c.is_uppercase())
                && RUNNERS_ALONE.contains(&unversioned(&base_name(w)))
        })
        || parts_name_runner(&words)
}

/// `text` without what stands in parentheses (nested ones too); an opening one never
/// closed takes the rest.
fn outside_parentheses(text: &str) -> String {
    let mut depth = 0usize;
    let mut kept = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            c if depth == 0 => kept.push(c),
            _ => {}
        }
    }
    kept
}

/// Whether one word of a tool's name names a shell or runner wherever it stands: its
/// program's name (versioned or not), a namespace's member, a script.
fn names_runner(word: &str) -> bool {
    let b = base_name(word);
    let member = b.rsplit_once('.').map(|(_, m)| m).unwrap_or_default();
    SHELL_TOOLS.contains(&b.as_str())
        || SHELL_TOOLS.contains(&unversioned(&b))
        || (SHELL_TOOLS.contains(&member) && !SOURCE_ENDINGS.contains(&member))
        || RUNNERS.contains(&b.as_str())
        || SCRIPT_ENDINGS.iter().any(|e| b.ends_with(e))
        // `find . -exec rm {} ;` runs what follows.
        || ["-exec", "-execdir"].contains(&word)
}

/// Whether the parts of a tool's words name a runner: the parts of every word, a
/// camelCase one split too (`runInTerminal`), and the words of a title (`Run Command`)
/// taken as the parts of one name.
fn parts_name_runner(words: &[&str]) -> bool {
    // `seq` has the parts in their order, once; `parts` each word's unsplit too.
    let mut parts: Vec<String> = Vec::new();
    let mut seq: Vec<String> = Vec::new();
    for w in words {
        let mut split = String::with_capacity(w.len() + 4);
        let mut lower_before = false;
        for c in w.chars() {
            if c.is_ascii_uppercase() && lower_before {
                split.push('_');
            }
            lower_before = c.is_ascii_lowercase() || c.is_ascii_digit();
            split.push(c.to_ascii_lowercase());
        }
        let of = |s: &str| -> Vec<String> {
            s.split(['_', '-', '.', '/', '\\'])
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let split = of(&split);
        parts.extend(split.iter().cloned());
        seq.extend(split);
        parts.extend(of(&w.to_ascii_lowercase()));
    }
    let has = |set: &[&str]| parts.iter().any(|p| set.contains(&p.as_str()));
    // What a run word runs, not a thing written about it (`run_command_history`) nor a
    // business process (`start_process_instance`).
    let what = seq.iter().enumerate().any(|(i, p)| {
        RUN_WHAT.contains(&p.as_str()) && !written_at(&seq, i + 1) && !business_process(&seq, i)
    }) || parts
        .iter()
        .any(|p| RUN_WHAT.contains(&p.as_str()) && !seq.contains(p));
    has(&SHELL_PARTS)
        || (has(&RUN_PARTS) && what)
        || run_word_names_runner(&seq)
        || pair_names_runner(&seq)
        || runs_cells(&seq)
}

/// Whether a run word stands where it runs a shell, an interpreter or a runner, in the
/// parts `seq` of a name: right before its name, versioned or not, or one word apart
/// (`run_sh`, `exec_node`, `run_python3`, `run_make`, `exec_in_pod`, `run_on_host`);
/// ending the name right after it (`ssh_exec`, `node_run`, `pods_exec`, `ruby_eval`,
/// `ts_eval`), or `exec` after any word but a preposition (`lxc_exec`, not
/// `email_to_exec`); or ending the name with what it runs, or where (`run_remote`,
/// `invoke_cmd`). Beside it elsewhere it does not (`record_node_start`,
/// `write_sh_run_notes`, `run_host_inventory_report`, `invoke_code_review`).
fn run_word_names_runner(seq: &[String]) -> bool {
    let run = |p: &str| RUN_PARTS.contains(&p);
    // An interpreter's or a runner's name (`ctr` beside a run word is more often a
    // click-through rate, `run_ctr_report`; after one, `expect`, `screen`, `aws` and
    // `gcloud` more often say what a report is about: `run_expect_report`,
    // `run_aws_cost_report`).
    let interprets = |p: &str| {
        let p = unversioned(p);
        (SHELL_TOOLS.contains(&p) || RUNNERS_ALONE.contains(&p))
            && !run(p)
            && !["ctr", "expect", "screen", "aws", "gcloud"].contains(&p)
    };
    let runs = |p: &str| interprets(p) || RUN_NEXT.contains(&unversioned(p));
    let runs_where = |p: &str| runs(p) || RUN_WHERE.contains(&p);
    seq.windows(2).any(|w| run(&w[0]) && runs(&w[1]))
        || seq
            .windows(3)
            .any(|w| run(&w[0]) && RUN_IN.contains(&w[1].as_str()) && runs_where(&w[2]))
        || match seq {
            [.., before, last] => match (before.as_str(), last.as_str()) {
                (b, "exec") => {
                    !["to", "for", "the", "an", "each", "my", "our", "your"].contains(&b)
                }
                // (`save_to_file_and_run` runs what it saved.)
                (b, l) if RUN_LAST.contains(&l) => runs_where(b) || b == "and",
                (b, "eval" | "interact") => interprets(b) || EVAL_LANGUAGES.contains(&b),
                // (`start_compose` may write mail.)
                (b, what) if run(b) || b == "invoke" => {
                    RUN_WHAT.contains(&what) || (runs_where(what) && what != "compose")
                }
                _ => false,
            },
            _ => false,
        }
}

/// Languages whose code a name's closing `eval` runs (`ts_eval`, `go_eval`), beside the
/// interpreters.
const EVAL_LANGUAGES: [&str; 7] = ["ts", "js", "go", "java", "dotnet", "wasm", "vm"];

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

/// The phases that allow sandbox writes, in order.
pub const WRITE_PHASES: [&str; 5] = ["28.3", "28.5", "28.6", "28.7", "28.8"];

/// [`WRITE_PHASES`] as a sentence lists them, the last after `last_word` ("and", "or").
pub fn write_phases_listed(last_word: &str) -> String {
    let (last, rest) = WRITE_PHASES.split_last().unwrap_or((&"", &[]));
    format!("{} {last_word} {last}", rest.join(", "))
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
