//! Permission scopes, the phase table and the execution context (SPEC §4).

use PermissionScope::{
    Forbidden, PrivilegedReserved, Readonly, RuntimeWriteReserved, WorkspaceWriteReserved,
};
use ailab_sandbox_core::catalog::{FORBIDDEN_INTENTS, OPERATIONS, READ_INTENTS};
use ailab_sandbox_core::context::{DryRunReason, ExecutionContext, ExecutionMode};
use ailab_sandbox_core::policy::{
    DEFAULT_PHASE, PermissionScope, WRITE_PHASES, allowed_scopes, classify_permission_scope,
    is_scope_allowed, phase_supports_sandbox_write, write_phases_listed,
};

/// The list refusals quote is the table's: every phase that allows writes, no other.
#[test]
fn the_write_phases_listed_are_those_the_table_allows() {
    let writing: Vec<String> = (0..=40)
        .flat_map(|major| (0..=12).map(move |minor| format!("{major}.{minor}")))
        .filter(|p| phase_supports_sandbox_write(p))
        .collect();
    assert_eq!(writing, WRITE_PHASES);
    assert_eq!(write_phases_listed("or"), "28.3, 28.5, 28.6, 28.7 or 28.8");
}

#[test]
fn phases_28_1_28_2_and_28_4_are_readonly_only() {
    for phase in ["28.1", "28.2", "28.4"] {
        assert_eq!(allowed_scopes(phase), [Readonly], "{phase}");
        assert!(!phase_supports_sandbox_write(phase), "{phase}");
    }
}

#[test]
fn phases_28_3_and_28_5_add_workspace_write() {
    for phase in ["28.3", "28.5"] {
        assert_eq!(
            allowed_scopes(phase),
            [Readonly, WorkspaceWriteReserved],
            "{phase}"
        );
        assert!(phase_supports_sandbox_write(phase), "{phase}");
        assert!(!is_scope_allowed(phase, RuntimeWriteReserved), "{phase}");
    }
}

#[test]
fn phase_28_6_adds_runtime_write() {
    assert_eq!(
        allowed_scopes("28.6"),
        [Readonly, WorkspaceWriteReserved, RuntimeWriteReserved]
    );
    assert!(!is_scope_allowed("28.6", PrivilegedReserved));
}

#[test]
fn phases_28_7_and_28_8_add_privileged() {
    for phase in ["28.7", "28.8"] {
        assert_eq!(
            allowed_scopes(phase),
            [
                Readonly,
                WorkspaceWriteReserved,
                RuntimeWriteReserved,
                PrivilegedReserved
            ],
            "{phase}"
        );
        assert!(is_scope_allowed(phase, PrivilegedReserved));
    }
}

#[test]
fn unknown_phases_are_readonly_and_forbidden_is_never_allowed() {
    for phase in ["", "28", "28.9", "29.3", "28.3.1", " 28.3", "28.30", "x"] {
        assert_eq!(allowed_scopes(phase), [Readonly], "{phase:?}");
    }
    for phase in ["28.1", "28.3", "28.6", "28.8", "nope"] {
        assert!(!is_scope_allowed(phase, Forbidden), "{phase}");
    }
}

#[test]
fn default_phase_is_the_write_executor() {
    assert_eq!(DEFAULT_PHASE, "28.3");
    assert!(phase_supports_sandbox_write(DEFAULT_PHASE));
}

#[test]
fn classify_write_read_forbidden_and_unknown_intents() {
    for o in OPERATIONS.iter() {
        assert_eq!(
            classify_permission_scope(o.name, None),
            WorkspaceWriteReserved,
            "{}",
            o.name
        );
    }
    for intent in READ_INTENTS {
        assert_eq!(
            classify_permission_scope(intent, None),
            Readonly,
            "{intent}"
        );
    }
    for intent in FORBIDDEN_INTENTS {
        assert_eq!(
            classify_permission_scope(intent, None),
            Forbidden,
            "{intent}"
        );
    }
    for intent in ["", "chmod", "sudo", "Create_File"] {
        assert_eq!(
            classify_permission_scope(intent, None),
            Forbidden,
            "{intent:?}"
        );
    }
}

#[test]
fn shell_tools_make_any_intent_forbidden() {
    for tool in [
        "shell",
        "BASH",
        "sh",
        "exec",
        "Terminal",
        "run_command",
        "/bin/bash",
        "bash ",
        "zsh",
        "dash",
        "fish",
        "pwsh",
        "PowerShell",
        "cmd.exe",
        "C:\\Windows\\System32\\cmd.exe",
        "bash -c",
        "/usr/bin/env bash",
        "sudo",
        "wsl.exe",
        "run-command",
        "execute_command",
        // Agents' shell tools, and a shell next to punctuation.
        "Bash(ls)",
        "run_shell_command",
        "local_shell",
        "run_terminal_cmd",
        "run_in_terminal",
        "developer__shell",
        "builtin_run_terminal_command",
        "functions.shell",
        "mcp__shell__run",
        "bash;",
        "sh|",
        "python3 -c",
        "chmod +x",
        "python3.11 -c",
        "/usr/bin/python3.12",
        "perl5",
        "ruby3.2",
        "nodejs",
        "php",
        "chgrp",
        "ipython",
        "subprocess.run",
        "os.system",
        "child_process.exec",
        "code_interpreter",
        "execute_python",
        "run_cmd",
        "runInTerminal",
        "runShellCommand",
        "executeBash",
        "Run Command",
        "./deploy.sh",
        "scripts/run_all.sh",
        "env -i sh",
        "env FOO=1 sh",
        "nice -n 5 sh",
        "timeout 10 sh",
        "docker exec c sh",
        "kubectl exec pod -- sh",
        "execute_code",
        "run_code",
        "run_script",
        "python_interpreter",
        "python_repl",
        "start_process",
        "C:\\Program Files\\Git\\bin\\sh.exe",
        "mcp__desktop-commander__execute_command",
        "pkexec",
        "sudoedit",
        "runuser",
        "ssh",
        "setfacl",
        "setcap",
        "\u{ff42}\u{ff41}\u{ff53}\u{ff48}",
        "bas\u{200b}h",
        "\u{441}hmod",
        "npx",
        "pnpx",
        "uvx",
        "bunx",
        "bun",
        "bun run deploy",
        "/usr/bin/env julia",
        "julia -e println",
        "/usr/local/bin/julia",
        "functions.python",
        "mcp.sudo",
        "tools.ssh",
        "xargs",
        "nohup",
        "systemd-run",
        "tsx",
        "ts-node",
        "Rscript",
        "julia",
        "osascript",
        "cscript.exe",
        "awk",
        "tmux",
        "xterm",
        "deploy.py",
        "tools/run.pl",
        "functions.exec",
        "mcp.terminal",
        "make",
        "make deploy",
        "/usr/bin/make -C src",
        "docker",
        "docker run --rm alpine",
        "podman",
        "kubectl",
        "kubectl apply -f x.yaml",
        "py",
        "py -3 script",
        "iex",
        "docker_exec",
        "run_container",
        "kubectl-exec",
        "podman_run",
        "run_sh",
        "exec_node",
        "run_ruby",
        "run_deno",
        "execute_applescript",
        "run_typescript",
        "nerdctl_exec",
        "kube_exec",
        "run_python3",
        "run_node18",
        "run_make",
        "run_program",
        "Run Node",
        // Tools that run a notebook's cells, a browser's scripts, keys typed into a
        // terminal, a process, a playbook, a manifest, a chart or a function.
        "execute_cell",
        "mcp__jupyter__execute_cell",
        "Run Cell",
        "runCell",
        "jupyter_execute",
        "evaluate_script",
        "browser_evaluate",
        "mcp__playwright__browser_evaluate",
        "send_keys",
        "create_process",
        "launch_app",
        "run_playbook",
        "ansible-playbook",
        "kubectl_apply",
        "terraform_apply",
        "helm_install",
        "compose_up",
        "gradle_run",
        "invoke_lambda",
        "terraform apply",
        "helm install chart",
        "ansible-playbook site.yml",
        "gradle build",
        "./gradlew test",
        "mvn package",
        "expect deploy.exp",
        "run_terraform",
        // A cloud's command line, a terminal that runs what it is given.
        "aws_cli",
        "mcp__aws__aws_cli",
        "gcloud_cli",
        "Azure CLI",
        "aws s3 rm s3://bucket --recursive",
        "gcloud",
        "gcloud compute ssh vm --command make",
        "screen -dmS job make",
        "screen",
        // A notebook's cells run however the name goes on; a page's script; a run
        // qualified after what names it.
        "execute_cell_with_progress",
        "execute_cell_simple_timeout",
        "execute_cell_streaming",
        "run_all_cells",
        "execute_cells",
        "Execute Cells",
        "puppeteer_evaluate",
        "mcp__puppeteer__puppeteer_evaluate",
        "playwright_evaluate",
        "evaluate_javascript",
        "page_evaluate",
        "lambda_invoke",
        "invoke_function",
        "helm_upgrade",
        "pulumi_up",
        "pulumi up --yes",
        "terraform_apply_auto_approve",
        "kubectl_apply_manifest",
        "send_keys_to_pane",
        // A package installed, a proxy calling any tool, a slash command, a program
        // previewed by running it (Riza, Cline, Claude Code, Pulumi).
        "pip_install_package",
        "npm_install_packages",
        "install_package",
        "execute_tool",
        "use_mcp_tool",
        "SlashCommand",
        "pulumi-cli-preview",
        "Launch-Tool",
        // Real tools of public MCP servers and agents that run code or commands
        // (Kubernetes, Helm, Pulumi, Browserbase, AWS, Azure, Docker, iTerm, Codex, the
        // Anthropic and Gemini APIs, AutoGen, VS Code, JetBrains, Goose, agno, Open
        // Interpreter, LangChain).
        "install_helm_chart",
        "upgrade_helm_chart",
        "kubectl_create",
        "kubectl_generic",
        "mcp__kubernetes__kubectl_generic",
        "helm_template_apply",
        "resources_create_or_update",
        "apply_yaml",
        "apply_terraform",
        "pulumi-cli-up",
        "browserbase_evaluate",
        "call_aws",
        "use_aws",
        "azmcp-extension-az",
        "sam_local_invoke",
        "deploy-compose",
        "recreate_container",
        "write_to_terminal",
        "write_stdin",
        "code_execution",
        "code_execution_tool",
        "CodeExecutor",
        "create_and_run_task",
        "run_task",
        "runTests",
        "execute_run_configuration",
        "computercontroller__automation_script",
        "computercontroller__computer_control",
        "save_to_file_and_run",
        "execute_istioctl",
        "execute_argocd",
        "execute",
        "Run",
        "e2b_data_analysis",
        "deploy_one_off_dyno",
        // Runners where a command line names its program, past what runs it.
        "env -i make",
        "env FOO=1 make all",
        "FOO=1 make",
        "nice make",
        "nice -n 5 make",
        "timeout 10s make test",
        "xargs make",
        "ls && make",
        "ls; make",
        "cat x | make -f -",
        "(make)",
        "$(make)",
        "echo $(make)",
        "echo `make`",
        "docker-compose up",
        "podman-compose up",
        "ctr run img x",
        "nerdctl run img",
        // A run word ending a name after what it runs, or one word before it.
        "ssh_exec",
        "pods_exec",
        "node_run",
        "compose_run",
        "npm_run",
        "dockerExec",
        "Python Run",
        "exec_in_pod",
        "run_on_node",
        "run_inside_docker",
        "julia-1.10",
        "python-3",
        "find . -exec rm {} ;",
        "find -execdir x",
        "ruby_eval",
        "node_eval",
        "NodeEval",
        "python_interact",
        "gmake_run",
        "make_run",
        "make:deploy",
        "docker:build",
        "npm@latest",
        "npm@10 run build",
        "make>log",
        "timeout -s KILL 10 make",
        "env -u HOME make",
        "taskset -c 0-3 make",
        "if true; then make; fi",
        "for f in x; do make; done",
        "yarn run build",
        "pnpm_exec",
        "cargo run",
        "uv_run",
        "remote_exec",
        "sandbox_exec",
        "run_on_host",
        "invoke_command",
        "cd app & npm start",
        "sleep 5 & cargo build",
        "nice -n 5 make",
        "xargs -0 make",
        "run_in_sandbox",
        "container_exec",
        "python_eval",
        "ts_eval",
        "go_eval",
        "poetry run pytest",
        "poetry_run",
        "mvn_exec",
        "lxc_exec",
        "os_exec",
        "run_remote",
        "exec_host",
        "invoke_cmd",
        "InvokeCommand",
        "Invoke Command",
        "invoke_command",
        "Invoke-Expression",
        "taskset 0x3 make",
        "taskset ff make deploy",
        "env FOO=\"a b\" make",
        "env FOO='a b' npm start",
        // Interpreters, runners and permission tools first missed (rev535).
        "java",
        "java -jar app.jar",
        "pypy3",
        "micropython",
        "kotlin",
        "elixir",
        "dotnet run",
        "mono app.exe",
        "wish",
        "eval",
        "popen",
        "psexec",
        "rundll32.exe",
        "schtasks",
        "launchctl",
        "systemctl",
        "crontab",
        "chattr",
        "icacls",
        "takeown",
        "Set-ExecutionPolicy",
        "toybox",
        // A name goes on after what stands in parentheses; only an argument names it.
        "Write(x) bash",
        "(bash)",
        // Shells, interpreters, runners and package managers first missed (rev540).
        "xonsh",
        "elvish",
        "yash",
        "murex",
        "nushell",
        "nu -c ls",
        "sbcl --script x.lisp",
        "guile",
        "racket",
        "pry",
        "zx",
        "socat",
        "ncat -e /bin/x",
        "nc -e x",
        "strace make",
        "go run main.go",
        "parallel make ::: a b",
        "apt-get install x",
        "apt install x",
        "yum install x",
        "dnf install x",
        "brew install x",
        "gem install x",
        "pip install x",
        "conda install x",
        "cpan X",
        "cron",
        "ocaml",
        "mamba install x",
        "micromamba run x",
        "zypper install x",
        "pacman -S x",
        "apk add x",
        "snap install x",
        "emerge x",
        "opam install x",
        "composer run x",
        "nix run",
        "corepack enable",
        "flatpak run x",
        "rake test",
        "ant build",
        "lein run",
        "sbt run",
        "mix run",
        "cabal run",
        "stack run",
    ] {
        assert_eq!(
            classify_permission_scope("create_file", Some(tool)),
            Forbidden,
            "{tool}"
        );
        assert_eq!(
            classify_permission_scope("read_file", Some(tool)),
            Forbidden,
            "{tool}"
        );
    }
    for tool in [
        "fs",
        "system",
        "command",
        "env",
        "my/system",
        "file_writer",
        "ssh_keys_doc",
        "execute_cell_notes",
        "send_keys_doc",
        "app_launch_notes",
        "process_created_log",
        "apply_terraform_notes",
        "Expect Notes",
        "Helm Of The Ship",
        "terraform_docs",
        "aws_cli_notes",
        "run_expect_report",
        "eval_expect_results",
        "run_aws_cost_report",
        "run_screen_reader_check",
        "kubectl_apply_docs",
        "create_process_diagram",
        "install_package_docs",
        "slash_command_help",
        "execute_tool_notes",
        "list_mcp_tools",
        "run_cell_notes",
        "select_all_cells",
        "cell_run_history",
        // A workflow engine's business process, help and analysis, lists and reports.
        "startProcessInstance",
        "start_process_instance",
        "create_process_instance",
        "create_process_definition",
        "run_advanced_code_analysis",
        "aws_cli_help",
        "run_command_history",
        "get_run_configurations",
        "run_task_report",
        "run_tests_summary",
        "Execute Query",
        "get_execution_plan",
        "n8n_get_execution",
        "install_helm_docs",
        "use_aws_docs",
        "AWS Cost Report",
        "gcloud_docs",
        "Screen Reader Notes",
        "take_screenshot",
        "screen_capture",
        "refresh_index",
        "publish.notes",
        "python_formatter",
        // A write tool's argument is not its name.
        "Write(deploy.sh)",
        "Edit(notes/build.sh)",
        "Write(bash_notes.md)",
        "create_sh_file",
        "write_to_terminal_log",
        "run_report",
        "system_notes",
        "markdown.render",
        "get_system_os_info",
        "system_process_list",
        "str_replace_editor",
        "apply_patch",
        "TodoWrite",
        "NotebookEdit",
        "spawn_agent",
        "eval_results",
        "make_directory",
        "Make Report",
        "docker_docs",
        "make_run_report",
        "record_node_start",
        "node_start_time",
        "save_node_eval_results",
        "write_php_start_page",
        "write_sh_run_notes",
        "Docker Compose Notes",
        "kubectl_docs",
        "py_formatter",
        "npm_docs",
        "bundle_notes",
        "publish.markdown",
        // A runner's name that no command line names as its program, a run word that
        // does not end the name, `make` as a verb.
        "Make && Publish",
        "notes; Make Report",
        "build_make_run_notes",
        "write_sh_run_notes",
        "node_start",
        "run_in_order",
        "compose_email",
        "exec_summary_writer",
        "timeout_notes",
        "Read & make notes",
        "Notes & docker tips",
        "Search docs & py snippets",
        "start_compose",
        "run_ctr_report",
        "compose_run_notes",
        "invoke_summary_writer",
        "Time tracker for make targets",
        "Command reference for docker",
        "env notes for docker setup",
        "Do npm audit summary",
        "notes; time to make it",
        "draft_email_to_exec",
        "notebook_interact",
        "invoke_process_payment",
        "invoke_code_review",
        "run_host_inventory_report",
        "start_vm_report",
        "run_remote_backup_report",
        "brief_for_exec",
        "save_binary_eval",
        "program_eval",
        "time to make notes",
        "Watch npm package updates",
        // Words that are also runners' names, in a title; extensions after a dot.
        "Baking Bun Recipes",
        "Julia Plot Saver",
        "Java Formatter",
        "Swift Release Notes",
        "Mono Repo Map",
        "Wish List Writer",
        "eval_metrics_report",
        "App.tsx",
        "config.lua",
        "page.php",
        "graph.node",
        // Accented words are other words (Vietnamese: record event, save history).
        "Ghi s\u{1ef1} ki\u{1ec7}n",
        "L\u{1b0}u l\u{1ecb}ch s\u{1eed}",
        "B\u{fa}n ch\u{1ea3} notes",
        // An accented letter is part of its word (interest rate, sweater, to find).
        "T\u{ed}nh l\u{e3}i su\u{1ea5}t",
        "Guardar su\u{e9}ter",
        "Czech sh\u{e1}n\u{11b}t",
        "perl\u{e9} notes",
        // Words that name runners only on a command line.
        "Go To Line",
        "Parallel Sort Notes",
        "Gem Catalog",
        "Brew Log",
        "Apt Description Writer",
        "Cron Schedule Doc",
        "Nu Notes",
        "go_to_definition",
        "gem_catalog",
        "Stack Overflow Notes",
        "Snap Grid",
        "Mix Colors",
        "Ant Colony Report",
    ] {
        assert_eq!(
            classify_permission_scope("create_file", Some(tool)),
            WorkspaceWriteReserved,
            "{tool}"
        );
    }
}

#[test]
fn scope_wire_names() {
    let names: Vec<String> = [
        Readonly,
        WorkspaceWriteReserved,
        RuntimeWriteReserved,
        PrivilegedReserved,
        Forbidden,
    ]
    .iter()
    .map(|s| serde_json::to_string(s).unwrap())
    .collect();
    assert_eq!(
        names,
        [
            "\"readonly\"",
            "\"workspace_write_reserved\"",
            "\"runtime_write_reserved\"",
            "\"privileged_reserved\"",
            "\"forbidden\""
        ]
    );
}

// ---- execution context -----------------------------------------------------------------

#[test]
fn is_executable_only_for_readonly_and_sandbox_write_without_dry_run() {
    let cases = [
        (ExecutionMode::Simulation, false, false),
        (ExecutionMode::Simulation, true, false),
        (ExecutionMode::Readonly, false, true),
        (ExecutionMode::Readonly, true, false),
        (ExecutionMode::SandboxWrite, false, true),
        (ExecutionMode::SandboxWrite, true, false),
    ];
    for (mode, dry_run, expected) in cases {
        let ctx = ExecutionContext { mode, dry_run };
        assert_eq!(ctx.is_executable(), expected, "{mode:?} dry_run={dry_run}");
    }
}

#[test]
fn from_flags_writes_only_with_write_on_dry_run_off_and_a_write_phase() {
    let (ctx, reason) = ExecutionContext::from_flags(true, false, true);
    assert_eq!(ctx.mode, ExecutionMode::SandboxWrite);
    assert!(ctx.is_executable());
    assert!(ctx.writes());
    assert_eq!(reason, None);
}

#[test]
fn from_flags_secure_defaults_simulate_with_a_reason() {
    let cases = [
        ((false, true, true), DryRunReason::SandboxDisabled),
        ((false, false, true), DryRunReason::SandboxDisabled),
        ((true, true, true), DryRunReason::DryRun),
        ((false, true, false), DryRunReason::PhaseNotSupported),
        ((false, false, false), DryRunReason::PhaseNotSupported),
        ((true, true, false), DryRunReason::PhaseNotSupported),
    ];
    for ((enable, dry, phase_ok), expected) in cases {
        let (ctx, reason) = ExecutionContext::from_flags(enable, dry, phase_ok);
        assert_eq!(
            ctx.mode,
            ExecutionMode::Simulation,
            "{enable} {dry} {phase_ok}"
        );
        assert!(!ctx.is_executable(), "{enable} {dry} {phase_ok}");
        assert!(!ctx.writes(), "{enable} {dry} {phase_ok}");
        assert_eq!(reason, Some(expected), "{enable} {dry} {phase_ok}");
    }
}

#[test]
fn from_flags_execution_on_in_a_read_only_phase_is_readonly_and_writes_nothing() {
    let (ctx, reason) = ExecutionContext::from_flags(true, false, false);
    assert_eq!(ctx.mode, ExecutionMode::Readonly);
    assert!(ctx.is_executable());
    assert!(!ctx.writes());
    assert_eq!(reason, Some(DryRunReason::PhaseNotSupported));
}

#[test]
fn dry_run_reason_wire_names() {
    let names: Vec<String> = [
        DryRunReason::SandboxDisabled,
        DryRunReason::DryRun,
        DryRunReason::PhaseNotSupported,
        DryRunReason::GovernanceBlocked,
    ]
    .iter()
    .map(|r| serde_json::to_string(r).unwrap())
    .collect();
    assert_eq!(
        names,
        [
            "\"sandbox_disabled\"",
            "\"dry_run\"",
            "\"phase_not_supported\"",
            "\"governance_blocked\""
        ]
    );
}
