//! The command line as a user drives it: exit codes, JSON documents, and limits that hold
//! across separate processes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

use assert_cmd::Command;
use serde_json::{Value, json};
use std::path::PathBuf;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
    dir: PathBuf,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    Env {
        root: dir.join("root"),
        state: dir.join("state"),
        dir,
        _tmp: tmp,
    }
}

impl Env {
    fn cmd(&self) -> Command {
        Command::from_std(self.std_cmd())
    }

    /// [`Self::cmd`] as the standard library's, for what `assert_cmd` does not set (where
    /// standard error goes).
    fn std_cmd(&self) -> std::process::Command {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("ailab-sandbox"));
        c.env_remove("AI_LAB_SANDBOX_ROOTS")
            .env_remove("AI_LAB_STATE_DIR")
            .env_remove("AI_LAB_ENABLE_SANDBOX_WRITE")
            .env_remove("AI_LAB_SANDBOX_DRY_RUN")
            .env_remove("AI_LAB_SANDBOX_CONFIG")
            .env_remove("AI_LAB_SANDBOX_TOKEN")
            .env_remove("AI_LAB_SANDBOX_LOG")
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state);
        c
    }

    /// The binary on this root and state directory under a limit of `limit` open files
    /// (soft and hard, as `ulimit -n` sets them).
    fn limited(&self, limit: u32) -> std::process::Command {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", &format!("ulimit -n {limit} && exec \"$0\" \"$@\"")])
            .arg(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
            .env_remove("AI_LAB_SANDBOX_TOKEN")
            .env_remove("AI_LAB_SANDBOX_CONFIG")
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state);
        c
    }

    /// Runs `ARGS`; its standard output must contain `says`.
    fn stdout_says(&self, args: &[&str], says: &str) {
        let out = self.cmd().args(args).output().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(says),
            "{args:?}: {out:?}"
        );
    }

    /// `--json` `ARGS` with writing on and dry-run off; its output.
    fn live(&self, args: &[&str]) -> std::process::Output {
        self.cmd()
            .args(["--json", "--enable-write", "--no-dry-run"])
            .args(args)
            .output()
            .unwrap()
    }

    fn write_plan(&self, name: &str, plan: &Value) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, serde_json::to_vec(plan).unwrap()).unwrap();
        p
    }

    /// `rollback ARGS` for real, with the root's folder `ro` mounted read-only and its
    /// folder `rw` inside it writable, in a private mount namespace; its JSON document, or
    /// `None` (the test is skipped) where no such namespace can be made.
    fn rollback_with_read_only(&self, ro: &str, rw: &str, args: &[&str]) -> Option<Value> {
        let (ro, rw) = (self.root.join(ro), self.root.join(rw));
        let mut c = with_private_mount(
            "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\" && mount --bind \"$2\" \"$2\" && mount -o remount,bind,rw \"$2\"",
            &[ro.as_os_str(), rw.as_os_str()],
        );
        c.arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--json", "--enable-write", "--no-dry-run", "rollback"])
            .args(args);
        output_unless_unshared(c).map(|out| json_out(&out))
    }

    /// Writes `files` (root-relative) into the root, then runs `plan` for real; it must
    /// succeed.
    fn seed_and_run(&self, files: &[(&str, &str)], plan: &Value) {
        for (path, bytes) in files {
            let p = self.root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        let plan = self.write_plan("seeded.json", plan);
        let ran = self
            .cmd()
            .args(["--json", "--enable-write", "--no-dry-run", "run"])
            .arg(&plan)
            .output()
            .unwrap();
        assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    }
}

/// The address a `serve` child (its standard error piped) announces once it listens;
/// its standard error is then drained, so it never blocks on a full pipe.
fn announced(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map(Result::unwrap)
        .find_map(|l| l.strip_prefix("listening on http://").map(str::to_owned));
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("no announcement: {:?}", child.wait());
    };
    std::thread::spawn(move || lines.for_each(drop));
    addr
}

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn plan_of(wf: &str, n: usize, prefix: &str) -> Value {
    let actions: Vec<Value> = (0..n)
        .map(|i| json!({"intent": "create_file", "path": format!("{prefix}{i}.txt"), "content": format!("{i}\n")}))
        .collect();
    json!({"workflow_id": wf, "actions": actions})
}

#[test]
fn ops_lists_the_eleven_operations() {
    let e = env();
    let out = e.cmd().args(["--json", "ops"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 11);
    assert_eq!(names[0], "create_file");
    let script = v
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "generate_script")
        .unwrap();
    assert_eq!(script["requires_governance"], true);
    assert_eq!(script["extensions"], json!([".py", ".sh"]));
    assert_eq!(script["max_size_bytes"], 1048576);
    let op = |v: &Value, name: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name)
            .unwrap()["extensions"]
            .clone()
    };
    // What each may write under the lists in force: the allow-list for a file operation
    // without a list of its own, nothing for a directory operation.
    let all = op(&v, "create_file");
    assert_eq!(all.as_array().unwrap().len(), 25, "{all}");
    assert_eq!(op(&v, "create_directory"), json!([]));
    let config = e.dir.join("c.toml");
    std::fs::write(
        &config,
        "[extensions]\nallowed = [\".md\", \".json\", \".sh\"]\nblocked = [\".sh\"]\n",
    )
    .unwrap();
    let out = e
        .cmd()
        .arg("--config")
        .arg(&config)
        .args(["--json", "ops"])
        .output()
        .unwrap();
    let v = json_out(&out);
    assert_eq!(op(&v, "create_file"), json!([".md", ".json"]));
    // .py is not on the allow-list, .sh is blocked: nothing left.
    assert_eq!(op(&v, "generate_script"), json!([]));
    assert_eq!(op(&v, "write_json"), json!([".json"]));
    // For people, the same lists, and a word where nothing is left.
    let out = e
        .cmd()
        .arg("--config")
        .arg(&config)
        .arg("ops")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("generate_script").contains("(none under this policy)"),
        "{text}"
    );
    assert!(line("write_json").contains(".json"), "{text}");
    // A short allow-list is named, not called "all allowed" (read as "any extension").
    assert!(line("create_file").contains(".md .json"), "{text}");
    let out = e.cmd().arg("ops").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("create_file ") && l.contains(" allowed)")),
        "{text}"
    );
}

#[test]
fn check_exit_codes_follow_the_verdict() {
    let e = env();
    let out = e
        .cmd()
        .args([
            "--json",
            "check",
            "--intent",
            "create_file",
            "--path",
            "notes/a.md",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["operation"], "create_file");
    let out = e
        .cmd()
        .args([
            "--json",
            "check",
            "--intent",
            "create_file",
            "--path",
            "../x.md",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_out(&out)["reason_code"], "path_traversal");
    let out = e
        .cmd()
        .args([
            "--json",
            "check",
            "--intent",
            "write_json",
            "--path",
            "a.json",
            "--size",
            "3000000",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_out(&out)["reason_code"], "size_exceeded");
    let out = e
        .cmd()
        .args(["check", "--intent", "create_file"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "missing --path is a usage error"
    );
}

#[test]
fn state_reports_secure_defaults() {
    let e = env();
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    assert_eq!(v["execution_mode"], "simulation");
    assert_eq!(v["executor_enabled"], false);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["phase"], "28.3");
    assert_eq!(v["sandbox_roots"], json!([e.root.display().to_string()]));
}

#[test]
fn run_simulates_by_default_and_writes_when_enabled() {
    let e = env();
    let plan = e.write_plan("p.json", &plan_of("wf_cli", 2, "n"));
    let out = e
        .cmd()
        .arg("--json")
        .arg("run")
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_out(&out)["status"], "simulated_success");
    assert!(!e.root.join("n0.txt").exists());
    // In words, the run says what would let it write.
    let out = e.cmd().arg("run").arg(&plan).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(simulated: sandbox_disabled; writing is disabled: turn writing on (--enable-write --no-dry-run"),
        "{text}"
    );
    // A plan refused is refused with writing on too: what to mend is the action.
    let refused = e.write_plan(
        "refused.json",
        &json!({"workflow_id": "wf_r", "actions": [
            {"intent": "create_file", "path": "../out.txt", "content": "x"}]}),
    );
    let out = e.cmd().arg("run").arg(&refused).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(simulated: governance_blocked: nothing is written until the refused actions below are mended)"),
        "{text}"
    );
    assert!(!text.contains("turn writing on"), "{text}");
    let out = e
        .cmd()
        .args(["--enable-write", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(simulated: dry_run; dry-run is on: turn dry-run off (--no-dry-run"),
        "{text}"
    );
    let out = e
        .cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_out(&out)["status"], "success");
    assert_eq!(std::fs::read(e.root.join("n1.txt")).unwrap(), b"1\n");
    // A rollback writes too: without the flags it only says what it would do.
    let out = e
        .cmd()
        .args(["--json", "rollback", "wf_cli"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_out(&out)["status"], "simulated");
    assert!(e.root.join("n1.txt").exists());
    let out = e.live(&["rollback", "wf_cli"]);
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    assert_eq!(v["status"], "rolled_back");
    assert_eq!(v["steps_rolled_back"], 2);
    assert!(!e.root.join("n1.txt").exists());
}

/// The registry keeps every version, an undone one too: the listings mark the artifacts
/// whose write was rolled back, for people and in the documents `--json` prints, lest
/// one be taken for what its file holds.
#[test]
fn artifacts_mark_rolled_back_writes() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "m.txt", "content": "v1"},
            {"action_id": "a2", "intent": "sandbox_transform", "path": "m.txt",
             "edits": [{"old": "v1", "new": "v2"}]}]}),
    );
    assert_eq!(
        e.live(&["run", plan.to_str().unwrap()]).status.code(),
        Some(0)
    );
    let out = e.live(&["rollback", "wf_m", "--action", "a2"]);
    assert_eq!(json_out(&out)["status"], "rolled_back");
    assert_eq!(std::fs::read(e.root.join("m.txt")).unwrap(), b"v1");
    let list = json_out(&e.cmd().args(["--json", "artifacts"]).output().unwrap());
    let (undone, standing) = (&list[0], &list[1]);
    assert_eq!(undone["action_id"], "a2");
    assert_eq!(undone["rolled_back"], true, "{list}");
    assert_eq!(standing["rolled_back"], false, "{list}");
    let table = e.cmd().arg("artifacts").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let line_of = |a: &Value| {
        let id = a["artifact_id"].as_str().unwrap().to_owned();
        table
            .lines()
            .find(|l| l.starts_with(&id))
            .unwrap()
            .to_owned()
    };
    assert!(line_of(undone).ends_with("m.txt  (rolled back)"), "{table}");
    assert!(line_of(standing).ends_with("/m.txt"), "{table}");
    // One artifact and its lineage, each marked for itself.
    let id = undone["artifact_id"].as_str().unwrap();
    let shown = e.cmd().args(["artifacts", "show", id]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    let lines: Vec<&str> = shown.lines().collect();
    assert!(lines[0].ends_with("(rolled back)"), "{shown}");
    assert!(
        lines[2].contains(standing["artifact_id"].as_str().unwrap()),
        "{shown}"
    );
    assert!(!lines[2].contains("rolled back"), "{shown}");
    // The documents `--json` prints keep the SPEC's shape.
    let out = e
        .cmd()
        .args(["--json", "artifacts", "show", id])
        .output()
        .unwrap();
    let doc = json_out(&out);
    assert_eq!(doc.as_object().unwrap().len(), 2, "{doc}");
    assert_eq!(doc["artifact"]["rolled_back"], true, "{doc}");
    assert_eq!(doc["lineage"][0]["artifact_id"], standing["artifact_id"]);
    assert_eq!(doc["lineage"][0]["rolled_back"], false, "{doc}");
    // Its fields in the order `artifacts --json` gives them (the SPEC's).
    let text = String::from_utf8_lossy(&out.stdout);
    let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap();
    assert!(
        at("artifact") < at("lineage")
            && at("artifact_id") < at("path")
            && at("path") < at("checksum_sha256")
            && at("checksum_sha256") < at("created_at")
            && at("created_at") < at("rolled_back"),
        "{text}"
    );
}

#[test]
fn plan_from_stdin_and_bad_plans() {
    let e = env();
    let out = e
        .cmd()
        .args(["--json", "run", "-"])
        .write_stdin(serde_json::to_vec(&plan_of("wf_in", 1, "s")).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = e
        .cmd()
        .args(["--json", "run", "-"])
        .write_stdin("{ not json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["reason_code"], "invalid_plan");
    let out = e.cmd().args(["--json", "run", "-"]).write_stdin(r#"{"workflow_id":"../x","actions":[{"intent":"create_file","path":"a.txt","content":""}]}"#).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["reason_code"], "invalid_id");
    let out = e
        .cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run", "-"])
        .write_stdin(r#"{"actions":[{"intent":"delete_file","path":"a.txt"}]}"#)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a blocked plan exits 1");
    assert_eq!(
        json_out(&out)["actions"][0]["reason_code"],
        "forbidden_intent"
    );
}

#[test]
fn rate_limit_is_shared_by_two_processes() {
    let e = env();
    let first = e.write_plan("a.json", &plan_of("wf_rate", 8, "a"));
    let second = e.write_plan("b.json", &plan_of("wf_rate", 3, "b"));
    let out = e
        .cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&first)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = e
        .cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&second)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v = json_out(&out);
    assert_eq!(v["status"], "blocked");
    assert!(
        v["actions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["reason_code"] == "rate_limited"),
        "{v}"
    );
    assert!(!e.root.join("b0.txt").exists());
}

#[test]
fn audit_verify_exits_1_on_tampering() {
    let e = env();
    let plan = e.write_plan("p.json", &plan_of("wf_audit", 3, "t"));
    e.cmd()
        .args(["--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .assert()
        .success();
    let out = e
        .cmd()
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_out(&out)["entries"], 3);
    let log = e.state.join("sandbox_audit.jsonl");
    let text = std::fs::read_to_string(&log)
        .unwrap()
        .replace("t1.txt", "t9.txt");
    std::fs::write(&log, text).unwrap();
    let out = e
        .cmd()
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v = json_out(&out);
    assert_eq!(v["ok"], false);
    assert_eq!(v["first_bad_seq"], 2);
    // In words: where, without a placeholder.
    let out = e.cmd().args(["audit", "verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.starts_with("BROKEN at seq 2: "), "{said}");
}

#[test]
fn audit_and_artifacts_print_arrays_and_lineage() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_l", "actions": [
            {"intent": "create_file", "path": "l.md", "content": "v1"},
            {"intent": "sandbox_transform", "path": "l.md", "edits": [{"old": "v1", "new": "v2"}]}]}),
    );
    e.cmd()
        .args(["--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .assert()
        .success();
    let out = e
        .cmd()
        .args(["--json", "artifacts", "--workflow", "wf_l"])
        .output()
        .unwrap();
    let list = json_out(&out);
    assert_eq!(list.as_array().unwrap().len(), 2);
    let newest = list[0]["artifact_id"].as_str().unwrap().to_owned();
    let out = e
        .cmd()
        .args(["--json", "artifacts", "show", &newest])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    assert_eq!(v["artifact"]["mutation_type"], "sandbox_transform");
    assert_eq!(v["lineage"][0]["mutation_type"], "create_file");
    let out = e
        .cmd()
        .args(["--json", "artifacts", "show", "art_unknown"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = e
        .cmd()
        .args(["--json", "audit", "--limit", "1"])
        .output()
        .unwrap();
    assert_eq!(json_out(&out).as_array().unwrap().len(), 1);
    let out = e.cmd().args(["--json", "audit", "stats"]).output().unwrap();
    assert_eq!(json_out(&out)["success"], 2);
    // A list's filter given with a subcommand would be silently ignored: refused instead,
    // naming the flag.
    for args in [
        &["audit", "--workflow", "wf_l", "stats"][..],
        &["artifacts", "--limit", "1", "show", newest.as_str()],
    ] {
        let out = e.cmd().arg("--json").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(args[1]), "{args:?}: {err}");
        let doc = json_out(&out);
        assert_eq!(doc["reason_code"], json!("invalid_usage"), "{args:?}");
        assert!(doc["reason"].as_str().unwrap().contains(args[1]), "{doc}");
        // Printed like every other document `--json` prints.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{}\n", serde_json::to_string_pretty(&doc).unwrap()),
            "{args:?}"
        );
    }
    // So is a configuration that cannot be used.
    let out = e
        .cmd()
        .args(["--json", "--phase", "x", "state"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc = json_out(&out);
    assert_eq!(doc["reason_code"], json!("invalid_config"), "{doc}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", serde_json::to_string_pretty(&doc).unwrap())
    );
}

/// `mcp`'s standard output carries protocol messages only: a usage error there is said on
/// standard error, `--json` or not, wherever the bad argument stands; other commands
/// still print their JSON refusal.
#[test]
fn a_usage_error_of_mcp_keeps_off_its_protocol_channel() {
    let e = env();
    for args in [
        &["--json", "mcp", "--bogus"][..],
        &["--json", "--bogus", "mcp"],
        &["--phase", "28.3", "--json", "mcp", "extra"],
        &["--json", "--phase=28.3", "mcp", "--bogus"],
    ] {
        let out = e.std_cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let bad = args
            .iter()
            .find(|a| ["--bogus", "extra"].contains(a))
            .unwrap();
        assert!(err.contains(bad), "{args:?}: {err}");
    }
    // A plan file named `mcp` is not the subcommand.
    let out = e
        .std_cmd()
        .args(["--json", "run", "mcp", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(json_out(&out)["reason_code"], "invalid_usage", "{out:?}");
}

#[test]
fn config_file_unknown_key_names_it() {
    let e = env();
    let cfg = e.dir.join("c.toml");
    // Exit 2 and what is said on standard error, for a config file holding `text`.
    let refused = |text: &[u8], args: &[&str]| {
        std::fs::write(&cfg, text).unwrap();
        let out = e
            .cmd()
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused(b"enable_write = true\nmystery = 1\n", &["state"]).contains("mystery"));
    // A file that is not text, a phase that is no number: said as such.
    let said = refused(b"\xff\xfe = 1\n", &["state"]);
    assert!(said.contains("is not UTF-8 text"), "{said}");
    let said = refused(b"", &["--phase", "28", "state"]);
    assert!(
        said.contains("sandbox writes need 28.3, 28.5, 28.6, 28.7 or 28.8"),
        "{said}"
    );
    // The form is what is wrong, so it is what the sentence says, and it does not call
    // the refused value a number that would allow reads.
    assert!(
        said.contains("two numbers of at most four digits without leading zeros joined by a dot")
            && !said.contains("any other number"),
        "{said}"
    );
    // A file that never ends is refused at a bound, not read until memory runs out; a
    // link loop is named as a loop (a config file's links are followed); a file named by
    // the variable says so, as the operator may not know it is set.
    let refused_at = |c: &mut Command| {
        let out = c.arg("state").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let big = e.dir.join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let said = refused_at(e.cmd().arg("--config").arg(&big));
    assert!(
        said.contains(&format!(
            "config file {}: it is larger than 1048576 bytes",
            big.display()
        )),
        "{said}"
    );
    // Nor is anything but a regular file read (a device never ends).
    let said = refused_at(e.cmd().args(["--config", "/dev/zero"]));
    assert!(
        said.contains("config file /dev/zero is not a regular file"),
        "{said}"
    );
    // One other users could change is refused: it can turn writing on.
    let open = e.dir.join("open.toml");
    std::fs::write(&open, "enable_write = true\ndry_run = false\n").unwrap();
    std::fs::set_permissions(
        &open,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o666),
    )
    .unwrap();
    let said = refused_at(e.cmd().arg("--config").arg(&open));
    assert!(
        said.contains(&format!("config file {} is refused: ", open.display()))
            && said.contains("writable by other users"),
        "{said}"
    );
    let looped = e.dir.join("loop.toml");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let said = refused_at(e.cmd().arg("--config").arg(&looped));
    assert!(said.contains("lead back to themselves (a loop)"), "{said}");
    std::fs::write(&cfg, "mystery = 1\n").unwrap();
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env("AI_LAB_SANDBOX_CONFIG", &cfg)
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state);
    let said = refused_at(&mut c);
    assert!(
        said.contains(&format!(
            "config file {} (named by AI_LAB_SANDBOX_CONFIG)",
            cfg.display()
        )) && said.contains("mystery"),
        "{said}"
    );
}

/// A config file given as this process's pipe (`--config <(…)`, `--config /dev/stdin`)
/// is read as it flows.
#[test]
fn a_config_given_as_a_pipe_is_read() {
    let e = env();
    let mut c = e.std_cmd();
    c.args(["--config", "/dev/stdin", "--json", "state"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        b"enable_write = true\ndry_run = false\n",
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json_out(&out)["execution_mode"], "sandbox_write", "{out:?}");
    // A named pipe whose writer has come and gone: its bytes are read, no writer is
    // waited for (opening it again would wait for ever).
    let fifo = e.dir.join("settings.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg("-m")
        .arg("600")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(0o4000)
            .open(&fifo)
            .unwrap()
    };
    std::fs::write(&fifo, "enable_write = true\ndry_run = false\n").unwrap();
    let out = e
        .std_cmd()
        .args(["--config", "/dev/stdin", "--json", "state"])
        .stdin(reader)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json_out(&out)["execution_mode"], "sandbox_write", "{out:?}");
}

#[test]
fn environment_flags_turn_writing_on() {
    let e = env();
    let plan = e.write_plan("p.json", &plan_of("wf_env", 1, "e"));
    let out = e
        .cmd()
        .env("AI_LAB_ENABLE_SANDBOX_WRITE", "true")
        .env("AI_LAB_SANDBOX_DRY_RUN", "false")
        .args(["--json", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(json_out(&out)["status"], "success");
    let out = e
        .cmd()
        .env("AI_LAB_ENABLE_SANDBOX_WRITE", "maybe")
        .arg("state")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("AI_LAB_ENABLE_SANDBOX_WRITE"));
}

/// `AI_LAB_SANDBOX_LOG` sets how much is logged, in any case: a server's INFO lines
/// (`mcp` says it listens) go at `Error`, and are there by default.
#[test]
fn the_log_level_variable_sets_what_is_logged() {
    let e = env();
    for (level, said) in [(Some("Error"), false), (None, true)] {
        let mut c = e.std_cmd();
        if let Some(level) = level {
            c.env("AI_LAB_SANDBOX_LOG", level);
        }
        let out = c
            .arg("mcp")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{level:?}: {err}");
        assert_eq!(err.contains("listening"), said, "{level:?}: {err}");
    }
}

/// A variable set but empty, or not UTF-8, is an error that names it, never read as
/// unset; a root or state directory that is not UTF-8 is refused, not opened under a
/// lossy copy of its name.
#[test]
fn unusable_settings_are_named_not_ignored() {
    use std::os::unix::ffi::OsStrExt;
    let e = env();
    let refused = |c: &mut Command, name: &str| {
        let out = c.arg("state").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(name), "{name}: {err}");
    };
    refused(
        e.cmd().env("AI_LAB_SANDBOX_CONFIG", ""),
        "AI_LAB_SANDBOX_CONFIG",
    );
    let bad = std::ffi::OsStr::from_bytes(b"/x\xff");
    refused(
        e.cmd().env("AI_LAB_SANDBOX_CONFIG", bad),
        "AI_LAB_SANDBOX_CONFIG",
    );
    refused(
        e.cmd().env("AI_LAB_SANDBOX_TOKEN", bad),
        "AI_LAB_SANDBOX_TOKEN",
    );
    for level in ["", "bogus", "warning"] {
        refused(
            e.cmd().env("AI_LAB_SANDBOX_LOG", level),
            "AI_LAB_SANDBOX_LOG",
        );
    }
    refused(e.cmd().env("AI_LAB_SANDBOX_LOG", bad), "AI_LAB_SANDBOX_LOG");
    let root = e.dir.join(std::ffi::OsStr::from_bytes(b"r\xff"));
    refused(e.cmd().arg("--root").arg(&root), "not valid UTF-8");
    let state = e.dir.join(std::ffi::OsStr::from_bytes(b"s\xff"));
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&state);
    refused(&mut c, "not valid UTF-8");
    // Nor a control character, which would forge lines of `state`'s listing.
    refused(
        e.cmd()
            .arg("--root")
            .arg(e.dir.join("nl\nroots           /etc")),
        "contains a control character",
    );
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env_remove("AI_LAB_SANDBOX_CONFIG")
        .env("AI_LAB_SANDBOX_ROOTS", e.dir.join("tab\there"))
        .arg("--state-dir")
        .arg(&e.state);
    refused(&mut c, "contains a control character");
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(e.dir.join("st\nate"));
    refused(&mut c, "contains a control character");
    let made: Vec<_> = std::fs::read_dir(&e.dir)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert!(made.is_empty(), "nothing created: {made:?}");
    // A variable a flag overrides is not read, whatever it holds: as the config file's
    // under `--config`, the state directory's and the roots' under theirs.
    let cfg = e.dir.join("c.toml");
    std::fs::write(&cfg, "").unwrap();
    for (name, value) in [
        ("AI_LAB_SANDBOX_CONFIG", bad),
        ("AI_LAB_STATE_DIR", bad),
        ("AI_LAB_SANDBOX_ROOTS", std::ffi::OsStr::new("")),
        ("AI_LAB_SANDBOX_DRY_RUN", std::ffi::OsStr::new("perhaps")),
    ] {
        let out = e
            .cmd()
            .env(name, value)
            .arg("--config")
            .arg(&cfg)
            .args(["--no-dry-run", "state"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
    }
    refused(
        e.cmd().env("AI_LAB_SANDBOX_DRY_RUN", "perhaps"),
        "AI_LAB_SANDBOX_DRY_RUN",
    );
}

#[test]
fn with_json_a_command_that_cannot_run_says_why_in_json() {
    let e = env();
    std::fs::write(e.dir.join("file"), "").unwrap();
    let says = |c: &mut Command, code: &str| {
        let out = c.current_dir(&e.dir).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{code}");
        let doc = json_out(&out);
        assert_eq!(doc["reason_code"], json!(code), "{doc}");
        let reason = doc["reason"].as_str().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(reason), "stderr says it too: {err}");
    };
    says(
        e.cmd().args(["--json", "--bogus", "state"]),
        "invalid_usage",
    );
    says(
        e.cmd().args(["--json", "audit", "--limit", "0"]),
        "invalid_usage",
    );
    let out = e.cmd().args(["--json", "run"]).output().unwrap();
    let reason = json_out(&out)["reason"].as_str().unwrap().to_owned();
    assert!(reason.ends_with("were not provided: <PLAN>"), "{reason}");
    says(
        e.cmd().args(["--json", "run", "missing.json"]),
        "invalid_plan",
    );
    // In words, not the system's error format.
    let out = e
        .cmd()
        .args(["--json", "run", "missing.json"])
        .output()
        .unwrap();
    let reason = json_out(&out)["reason"].as_str().unwrap().to_owned();
    assert_eq!(
        reason,
        "cannot read plan file missing.json: no such file or directory"
    );
    assert!(
        !e.root.exists() && !e.state.exists(),
        "an unreadable plan leaves nothing behind"
    );
    // A plan larger than the body limit is not read to its end.
    let cfg = e.dir.join("small.toml");
    std::fs::write(&cfg, "[server]\nmax_body_bytes = 1024\n").unwrap();
    let mut c = e.cmd();
    c.arg("--config")
        .arg(&cfg)
        .args(["--json", "run", "/dev/zero"]);
    says(&mut c, "invalid_plan");
    let out = c.output().unwrap();
    let reason = json_out(&out)["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("larger than 1024 bytes"), "{reason}");
    says(
        e.cmd().args(["--json", "--phase", "", "state"]),
        "invalid_config",
    );
    says(
        e.cmd().args(["--json", "serve", "--addr", "0.0.0.0:1"]),
        "invalid_config",
    );
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(e.dir.join("file/state"))
        .args(["--json", "state"]);
    // A path to correct, as a root below a file is (it was `io_error`, a failing disk's).
    says(&mut c, "invalid_config");
    // A state directory other users could write is a setting to correct.
    use std::os::unix::fs::PermissionsExt;
    let shared = e.dir.join("shared-state");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    for command in [&["state"][..], &["audit", "verify"]] {
        let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
        c.env_remove("AI_LAB_SANDBOX_CONFIG")
            .arg("--root")
            .arg(&e.root)
            .arg("--state-dir")
            .arg(&shared)
            .arg("--json")
            .args(command);
        // Verifying reads a trail that others could have rewritten, head and all: no
        // verdict on it is to be trusted, so it is refused like everything else.
        says(&mut c, "invalid_config");
    }
    // So is one beneath a directory others could write in: they could swap it.
    let mut c = Command::cargo_bin("ailab-sandbox").unwrap();
    c.env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(shared.join("state"))
        .args(["--json", "state"]);
    says(&mut c, "invalid_config");
    // Refused input, not a command that could not run: the reason is on both too.
    says(
        e.cmd().args(["--json", "artifacts", "show", "a/b"]),
        "invalid_id",
    );
    says(
        e.cmd().args(["--json", "audit", "--workflow", "a.b/"]),
        "invalid_id",
    );
    says(e.cmd().args(["--json", "rollback", "../x"]), "invalid_id");
    let not_a_plan = e.dir.join("not-a-plan.json");
    std::fs::write(&not_a_plan, r#"{"actions": [], "extra": 1}"#).unwrap();
    says(
        e.cmd().args(["--json", "run"]).arg(&not_a_plan),
        "invalid_plan",
    );
    let out = e.cmd().args(["--bogus", "state"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "without --json nothing on stdout");
}

/// A standard error that cannot be written (a log on a full disk) does not stop a
/// command: its result and exit code are as ever (a panic's 101 left them unsaid).
#[test]
fn an_unwritable_standard_error_does_not_stop_a_command() {
    let e = env();
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let out = e
        .std_cmd()
        .args(["--json", "rollback", "wf_nope"])
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(json_out(&out)["reason_code"], "no_rollback_data", "{out:?}");
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_err", "actions": [{"intent": "create_file", "path": "a.md", "content": "a"}]}),
    );
    let out = e
        .std_cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(std::fs::read(e.root.join("a.md")).unwrap(), b"a");
    // Log lines too: `mcp` logs as it starts, and answers all the same.
    let mut child = e
        .std_cmd()
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(full())
        .spawn()
        .unwrap();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, format!("{init}\n").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned);
    let answer: Value =
        serde_json::from_str(&first.unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// A prune of a root mounted read-only is refused before it marks anything pruned: the
/// snapshots stay usable and the workflow rolls back once the root is writable again.
#[test]
fn a_prune_of_a_read_only_root_marks_nothing_pruned() {
    let e = env();
    e.seed_and_run(
        &[("k.txt", "original\n")],
        &json!({"workflow_id": "wf_ro", "actions": [{"intent": "replace_file", "path": "k.txt", "content": "new\n"}]}),
    );
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\"",
        &[e.root.as_os_str()],
    );
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args([
            "--json",
            "--enable-write",
            "--no-dry-run",
            "prune",
            "--older-than",
            "0s",
        ]);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc = json_out(&out);
    assert_eq!(doc["workflows_pruned"], json!([]), "{doc}");
    assert_eq!(
        doc["workflows_failed"][0]["reason_code"], "io_error",
        "{doc}"
    );
    assert!(
        doc["workflows_failed"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("is on a read-only filesystem, so no snapshot can be taken or removed there: mount it writable"),
        "{doc}"
    );
    assert!(!e.state.join("inflight/wf_ro.pruned").exists());
    let out = e.live(&["rollback", "wf_ro"]);
    assert_eq!(json_out(&out)["status"], "rolled_back", "{out:?}");
    assert_eq!(std::fs::read(e.root.join("k.txt")).unwrap(), b"original\n");
}

/// In words, a simulated rollback says why nothing was written (no code placeholder),
/// one refused over conflicts how to force it, and a forced one what it overwrote.
#[test]
fn a_rollback_in_words_says_why_simulated_and_what_force_overwrote() {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"workflow_id": "wf_f", "actions": [
            {"intent": "create_file", "path": "f.txt", "content": "mine\n"},
            {"intent": "create_file", "path": "g.txt", "content": "mine too\n"},
            {"intent": "create_directory", "path": "gd"}]}),
    );
    let out = e.cmd().args(["rollback", "wf_f"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("\n  writing is disabled"), "{said}");
    assert!(!said.contains("-:"), "{said}");
    std::fs::write(e.root.join("f.txt"), b"theirs\n").unwrap();
    // Removed by hand: nothing there to overwrite, and said so apart.
    std::fs::remove_file(e.root.join("g.txt")).unwrap();
    // A directory holding what is not the workflow's is left in place: not overwritten.
    std::fs::write(e.root.join("gd/theirs.txt"), b"theirs\n").unwrap();
    // Unforced, the refusal spells out the command that overrides its conflicts.
    let out = e.live(&["rollback", "wf_f"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = e
        .cmd()
        .args(["--enable-write", "--no-dry-run", "rollback", "wf_f"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("\n  to overwrite them: run the same rollback with --force\n"),
        "{said}"
    );
    let out = e
        .cmd()
        .args([
            "--enable-write",
            "--no-dry-run",
            "rollback",
            "wf_f",
            "--force",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let overwrote = format!(
        "forced: it overwrote what had changed since the workflow wrote it: {}\n",
        e.root.join("f.txt").display()
    );
    assert!(said.contains(&overwrote), "{said}");
    let removed = format!(
        "forced: it found removed since the workflow wrote it (nothing there to overwrite): {}\n",
        e.root.join("g.txt").display()
    );
    assert!(said.contains(&removed), "{said}");
    assert!(!e.root.join("g.txt").exists());
    assert!(e.root.join("gd/theirs.txt").exists());
}

/// The prune's sentence counts workflows in words: one workflow, two workflows.
#[test]
fn prune_counts_workflows_in_words() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_one", "actions": [{"intent": "create_file", "path": "a.md", "content": "a"}]}),
    );
    let out = e
        .cmd()
        .args(["--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for (args, says) in [
        (
            &["prune", "--older-than", "0s"][..],
            "would prune 1 workflow (wf_one), keep 0",
        ),
        (
            &[
                "--enable-write",
                "--no-dry-run",
                "prune",
                "--older-than",
                "0s",
            ][..],
            "pruned 1 workflow (wf_one), kept 0",
        ),
    ] {
        e.stdout_says(args, says);
    }
    // Past twenty, the sentence names the first twenty and counts the others.
    let actions: Vec<Value> = (0..22)
        .map(|i| json!({"intent": "create_file", "path": format!("m{i}.md"), "content": "m"}))
        .collect();
    for (i, a) in actions.into_iter().enumerate() {
        let plan = e.write_plan(
            "m.json",
            &json!({"workflow_id": format!("wf_m{i:02}"), "actions": [a]}),
        );
        let out = e
            .cmd()
            .args(["--enable-write", "--no-dry-run", "run"])
            .arg(&plan)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let out = e
        .cmd()
        .args(["prune", "--older-than", "0s"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("would prune 22 workflows (wf_m00, ")
            && said.contains("wf_m19, and 2 more: --json lists them all)"),
        "{said}"
    );
}

#[test]
fn prune_parses_durations() {
    let e = env();
    let out = e
        .cmd()
        .args(["--json", "prune", "--older-than", "7d"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_out(&out)["workflows_pruned"], json!([]));
    assert_eq!(json_out(&out)["simulated"], json!(true), "writing is off");
    assert_eq!(json_out(&out)["dry_run_reason"], json!("sandbox_disabled"));
    // A real prune's document has the same fields, the reason null as in a run result.
    let out = e.live(&["prune", "--older-than", "7d"]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json_out(&out);
    let fields: Vec<&String> = doc.as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        [
            "dry_run_reason",
            "simulated",
            "workflows_failed",
            "workflows_kept",
            "workflows_pruned"
        ],
        "{doc}"
    );
    assert_eq!(doc["dry_run_reason"], json!(null));
    for (args, says) in [
        (
            &["prune", "--older-than", "0s"][..],
            "would prune 0 workflows",
        ),
        (
            &[
                "--enable-write",
                "--no-dry-run",
                "prune",
                "--older-than",
                "0s",
            ][..],
            "pruned 0 workflows",
        ),
        // Simulated for another reason than the flags: the reason named is that one.
        (
            &[
                "--enable-write",
                "--no-dry-run",
                "--phase",
                "28.4",
                "prune",
                "--older-than",
                "0s",
            ][..],
            "nothing was removed: the phase does not allow sandbox writes",
        ),
    ] {
        e.stdout_says(args, says);
    }
    let out = e
        .cmd()
        .args(["prune", "--older-than", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Numbers too large to count are taken as the largest (an age that prunes nothing, a
/// list of everything, a size refused by the limit); negative ones are refused saying
/// so (they were "not a duration" for a number and a unit, and clap's "unexpected
/// argument '-5'").
#[test]
fn huge_and_negative_numbers_on_the_command_line() {
    let e = env();
    for args in [
        &["prune", "--older-than", "99999999999999999999999d"][..],
        &["audit", "--limit", "99999999999999999999"][..],
    ] {
        let out = e.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    }
    let out = e
        .cmd()
        .args([
            "--json",
            "check",
            "--intent",
            "create_file",
            "--path",
            "a.txt",
        ])
        .args(["--size", "99999999999999999999999"])
        .output()
        .unwrap();
    // Refused as given, not judged (and quoted) as the largest count.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let doc = json_out(&out);
    assert_eq!(doc["reason_code"], "invalid_usage", "{out:?}");
    assert!(
        doc["reason"]
            .as_str()
            .unwrap()
            .contains("'99999999999999999999999' is more bytes than can be counted"),
        "{doc}"
    );
    for (args, says) in [
        (&["prune", "--older-than", "-1d"][..], "(no sign)"),
        (&["audit", "--limit", "-5"][..], "(no sign)"),
        (
            &["serve", "--max-body-bytes", "abc"][..],
            "'abc' is not a number of bytes; give a whole number from 1024 to 268435456",
        ),
        (
            &["serve", "--max-body-bytes", "99999999999999999999999"][..],
            "'99999999999999999999999' is more bytes than can be counted; give a whole number from 1024 to 268435456",
        ),
        (
            &[
                "check",
                "--intent",
                "create_file",
                "--path",
                "a.txt",
                "--size",
                "-5",
            ][..],
            "(no sign or unit)",
        ),
    ] {
        let out = e.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(says) && !err.contains("unexpected argument"),
            "{err}"
        );
    }
}

#[test]
fn malformed_ids_are_input_errors_exit_2() {
    let e = env();
    let cases: [&[&str]; 5] = [
        &["rollback", "../etc"],
        &["rollback", "wf_ok", "--action", "../x"],
        &["artifacts", "show", "../x"],
        &["artifacts", "--workflow", "a/b"],
        &["audit", "--workflow", "has space"],
    ];
    for args in cases {
        let out = e.cmd().arg("--json").args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_out(&out);
        assert_eq!(v["reason_code"], "invalid_id", "{args:?}: {v}");
        let out = e.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("invalid_id"), "{args:?}: {said}");
    }
    // A well-formed id that names nothing is a refusal, not an input error.
    let out = e
        .cmd()
        .args(["--json", "rollback", "wf_unknown"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_out(&out)["reason_code"], "no_rollback_data");
}

/// Files come out 0644 and directories 0755 even when the caller's umask would make them
/// private (SPEC §2); the runtime sets the mask rather than chmod anything.
#[test]
fn created_modes_do_not_depend_on_the_callers_umask() {
    use std::os::unix::fs::PermissionsExt;
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_mask", "actions": [
            {"intent": "create_file", "path": "d/e/f.txt", "content": "x"}]}),
    );
    let bin = assert_cmd::cargo::cargo_bin("ailab-sandbox");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 077; exec \"$0\" \"$@\"")
        .arg(&bin)
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .env_remove("AI_LAB_SANDBOX_CONFIG")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&e.root.join("d/e/f.txt")), 0o644);
    assert_eq!(mode(&e.root.join("d")), 0o755);
    assert_eq!(mode(&e.root.join("d/e")), 0o755);

    // A group-writable file keeps its mode through a replacement and a rollback, whatever
    // the caller's umask.
    let shared = e.root.join("shared.md");
    std::fs::write(&shared, b"v1\n").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o664)).unwrap();
    let plan = e.write_plan(
        "r.json",
        &json!({"workflow_id": "wf_mode", "actions": [
            {"intent": "replace_file", "path": "shared.md", "content": "v2\n"}]}),
    );
    let with_umask = |args: &[&str], plan: Option<&std::path::Path>| {
        let mut c = std::process::Command::new("sh");
        c.arg("-c")
            .arg("umask 077; exec \"$0\" \"$@\"")
            .arg(&bin)
            .arg("--root")
            .arg(&e.root)
            .arg("--state-dir")
            .arg(&e.state)
            .args(["--json", "--enable-write", "--no-dry-run"])
            .args(args)
            .env_remove("AI_LAB_SANDBOX_CONFIG");
        if let Some(p) = plan {
            c.arg(p);
        }
        let out = c.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    with_umask(&["run"], Some(&plan));
    assert_eq!(std::fs::read(&shared).unwrap(), b"v2\n");
    assert_eq!(mode(&shared), 0o664, "replaced");
    with_umask(&["rollback", "wf_mode"], None);
    assert_eq!(std::fs::read(&shared).unwrap(), b"v1\n");
    assert_eq!(mode(&shared), 0o664, "restored");
}

/// A token on the command line can be read by every local user; the server says so.
#[test]
fn a_token_on_the_command_line_is_warned_about() {
    let e = env();
    let out = e
        .cmd()
        .args([
            "serve",
            "--addr",
            "not-an-address",
            "--token",
            "s3cret-token",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AI_LAB_SANDBOX_TOKEN"), "{err}");
    assert!(
        !err.contains("s3cret-token"),
        "the warning does not repeat it: {err}"
    );
}

/// A token too short for the server stops `serve` only: the other commands never use it.
#[test]
fn a_short_token_stops_the_server_only() {
    let e = env();
    let out = e
        .cmd()
        .env("AI_LAB_SANDBOX_TOKEN", "short")
        .args(["state"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = e
        .cmd()
        .env("AI_LAB_SANDBOX_TOKEN", "short")
        .args(["serve", "--addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shorter than 16 bytes"), "{err}");
    assert!(
        err.contains("this one came from the environment's AI_LAB_SANDBOX_TOKEN"),
        "names where this token came from: {err}"
    );
}

/// A bad token's refusal names which of its three places gave it: a variable left set in
/// the environment wins over the config file unseen.
#[test]
fn a_refused_token_names_where_it_came_from() {
    let e = env();
    let cfg = e.dir.join("server.toml");
    std::fs::write(&cfg, "[server]\ntoken = \"short\"\n").unwrap();
    // `serve` with the config file, the token in the environment (when given) and the
    // flags `extra`: its refusal's sentence.
    let refused = |env_token: Option<&str>, extra: &[&str]| {
        let mut c = e.cmd();
        if let Some(t) = env_token {
            c.env("AI_LAB_SANDBOX_TOKEN", t);
        }
        c.args([
            "--config",
            cfg.to_str().unwrap(),
            "--json",
            "serve",
            "--addr",
            "127.0.0.1:0",
        ])
        .args(extra);
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["reason_code"], "invalid_config", "{v}");
        v["reason"].as_str().unwrap().to_owned()
    };
    let from_file = refused(None, &[]);
    assert!(from_file.contains("shorter than 16 bytes"), "{from_file}");
    assert!(
        from_file.ends_with("this one came from [server] token in the config file"),
        "{from_file}"
    );
    let from_env = refused(Some(""), &[]);
    assert!(from_env.contains("the token is empty"), "{from_env}");
    assert!(
        from_env.ends_with("this one came from the environment's AI_LAB_SANDBOX_TOKEN"),
        "{from_env}"
    );
    let from_flag = refused(
        Some("a-long-enough-token-0123"),
        &["--token", " padded-token-0123456789 "],
    );
    assert!(from_flag.contains("white space"), "{from_flag}");
    assert!(
        from_flag.ends_with("this one came from --token"),
        "{from_flag}"
    );
}

/// `serve` announces the address it listens on only once bound, with the real port for
/// port 0, so a supervisor waiting for the line is never told of a server that failed.
/// A port another program holds is refused before the roots and the state directory are
/// made (they were, and stayed).
#[test]
fn serve_announces_the_bound_address_only_after_binding() {
    use std::io::{Read, Write};
    let e = env();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let out = e.cmd().args(["serve", "--addr", &busy]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {busy}")), "{err}");
    assert!(err.contains("another program holds this port"), "{err}");
    assert!(!err.contains("listening on"), "{err}");
    assert!(!e.root.exists() && !e.state.exists(), "made for nothing");

    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
        .env("AI_LAB_SANDBOX_LOG", "error")
        .env_remove("AI_LAB_SANDBOX_TOKEN")
        .env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr = announced(&mut child);
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!addr.ends_with(":0"), "the real port: {addr}");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A server allowed few open files fits the connections and writes it serves at once to
/// them: eight clients writing and rolling back plans of ten files each all succeed
/// (under a limit of 64, most of their writes and rollbacks failed with "Too many open
/// files").
#[test]
fn a_server_allowed_few_open_files_serves_a_burst_of_clients() {
    use std::io::{Read, Write};
    let e = env();
    let cfg = e.dir.join("c.toml");
    std::fs::write(
        &cfg,
        "[limits]\nwrites_per_minute = 100000\nmax_artifacts_per_workflow = 1000\n",
    )
    .unwrap();
    let mut child = e
        .limited(64)
        .arg("--config")
        .arg(&cfg)
        .args([
            "--enable-write",
            "--no-dry-run",
            "serve",
            "--addr",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let addr = announced(&mut child);
    let status = |request: String| {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer.split(' ').nth(1).unwrap_or_default().to_owned()
    };
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let answers: Vec<String> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..8)
            .map(|k| {
                let (status, post) = (&status, &post);
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    for n in 0..2 {
                        let wf = format!("wf_{k}_{n}");
                        let plan = json!({"workflow_id": wf, "actions": (0..10).map(|i| json!(
                            {"intent": "create_file", "path": format!("{wf}/f{i}.md"), "content": "x"}
                        )).collect::<Vec<_>>()});
                        seen.push(status(post("/agentic/plans", &plan.to_string())));
                        seen.push(status(post(&format!("/agentic/rollback/{wf}"), "")));
                    }
                    seen
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(answers.iter().all(|s| s == "200"), "{answers:?}");
    assert_eq!(answers.len(), 32);
}

/// Runs a command without `--json` (`run` gets `plan`): its exit code and standard output.
fn human_output(e: &Env, args: &[&str], plan: &std::path::Path) -> (Option<i32>, String) {
    let mut c = e.cmd();
    c.args(args);
    if args.last() == Some(&"run") {
        c.arg(plan);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What a plan's author wrote is printed with its control characters escaped: an intent
/// or a path can neither drive the terminal nor forge a line of the listing.
#[test]
fn human_output_escapes_control_characters() {
    let e = env();
    let plan = json!({"workflow_id": "wf_esc", "actions": [
        {"intent": "x\u{1b}[2J\u{1b}[31mFAKE\nline", "path": "a\u{1b}[1m.txt\nforged", "content": "x"}]});
    let p = e.write_plan("esc.json", &plan);
    for args in [vec!["--enable-write", "--no-dry-run", "run"], vec!["audit"]] {
        let (_, text) = human_output(&e, &args, &p);
        assert!(!text.contains('\u{1b}'), "{args:?}: {text}");
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("line") || l.starts_with("forged")),
            "{args:?}: {text}"
        );
        assert!(text.contains("\\u{1b}"), "{args:?}: {text}");
    }
}

/// Refusals and errors on standard error escape what the caller sent too: an unknown
/// field's name in a plan, a workflow id given to `rollback`.
#[test]
fn refusals_escape_control_characters() {
    let e = env();
    let p = e.write_plan(
        "field.json",
        &json!({"actions": [{"intent": "create_file", "path": "a.txt", "content": "x",
            "\u{1b}[31mRED\u{1b}]0;title\u{7}\nFAKE LINE": 1}]}),
    );
    let mut run = e.cmd();
    run.args(["--enable-write", "--no-dry-run", "run"]).arg(&p);
    let mut rollback = e.cmd();
    rollback.args(["rollback", "\u{1b}[31mRED\u{1b}[0m"]);
    // Refused by the command-line parser: a value of its own parsers, an argument it
    // does not take, with and without --json.
    let mut duration = e.cmd();
    duration.args(["prune", "--older-than", "\u{1b}]0;title\u{7}\u{1b}[2J"]);
    let mut extra = e.cmd();
    extra.args(["--json", "run", "p.json", "\u{1b}]0;title\u{7}\u{1b}[2J"]);
    for mut c in [run, rollback, duration, extra] {
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!said.contains(['\u{1b}', '\u{7}']), "{said}");
        assert!(!said.lines().any(|l| l.starts_with("FAKE")), "{said}");
        assert!(said.contains("\\u{1b}"), "{said}");
    }
}

/// A joiner in a path (allowed where an emoji needs it) is shown escaped, so a name
/// holding one cannot pass for another in a listing.
#[test]
fn human_output_escapes_what_readers_do_not_see() {
    let e = env();
    let p = e.write_plan(
        "zwj.json",
        &json!({"workflow_id": "wf_zwj", "actions": [
            {"intent": "create_file", "path": "report\u{1F468}\u{200d}\u{1F469}.txt", "content": "x"}]}),
    );
    for args in [
        vec!["--enable-write", "--no-dry-run", "run"],
        vec!["artifacts"],
    ] {
        let (code, text) = human_output(&e, &args, &p);
        assert_eq!(code, Some(0), "{args:?}");
        assert!(!text.contains('\u{200d}'), "{args:?}: {text}");
        assert!(text.contains("\\u{200d}"), "{args:?}: {text}");
    }
    // An override (it would make the name read otherwise), a paragraph separator (a
    // line break to some terminals) and a zero-width space are refused, and escaped in
    // the refusal and on the trail's listing.
    for (n, c) in ['\u{202e}', '\u{2029}', '\u{200b}'].into_iter().enumerate() {
        let path = format!("report{c}dm.txt");
        let p = e.write_plan(
            "hidden.json",
            &json!({"workflow_id": format!("wf_hidden_{n}"), "actions": [
                {"intent": "create_file", "path": path, "content": "x"}]}),
        );
        for args in [vec!["--enable-write", "--no-dry-run", "run"], vec!["audit"]] {
            let (_, text) = human_output(&e, &args, &p);
            assert!(!text.contains(c), "{args:?}: {text}");
            assert!(
                text.contains(&c.escape_default().to_string()),
                "{args:?}: {text}"
            );
        }
        assert!(!e.root.join(&path).exists());
    }
    // A root whose name holds a joiner is shown escaped in the state's table.
    let joined = e.dir.join("team\u{1F468}\u{200d}\u{1F469}");
    std::fs::create_dir(&joined).unwrap();
    let out = e
        .cmd()
        .arg("--root")
        .arg(&joined)
        .arg("state")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let roots = text.lines().find(|l| l.starts_with("roots")).unwrap();
    assert!(
        !roots.contains('\u{200d}') && roots.contains("team\u{1F468}\\u{200d}\u{1F469}"),
        "{text}"
    );
}

/// A write past the file-size limit (`ulimit -f`) fails like any I/O error: the process
/// is not killed by SIGXFSZ, reports the failure, and leaves nothing of the write.
#[test]
fn a_write_past_the_file_size_limit_fails_cleanly() {
    let e = env();
    let plan = e.write_plan(
        "big.json",
        &json!({"workflow_id": "wf_fsize", "actions": [
            {"intent": "create_file", "path": "big.txt", "content": "x".repeat(256 * 1024)}]}),
    );
    let args = [
        "--root",
        e.root.to_str().unwrap(),
        "--state-dir",
        e.state.to_str().unwrap(),
        "--enable-write",
        "--no-dry-run",
        "--json",
        "run",
        plan.to_str().unwrap(),
    ];
    // 128 blocks: 64 KiB in 512-byte blocks (POSIX sh), 128 KiB in 1 KiB ones (bash).
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 128 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_ailab-sandbox"))
        .args(args)
        .env_remove("AI_LAB_SANDBOX_CONFIG")
        .env_remove("AI_LAB_SANDBOX_ROOTS")
        .env_remove("AI_LAB_STATE_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some(),
        "ended by a signal: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_out(&out);
    assert_ne!(v["status"], "success", "{v}");
    assert_eq!(v["actions"][0]["reason_code"], "io_error", "{v}");
    assert!(!e.root.join("big.txt").exists());
    let leftovers: Vec<_> = std::fs::read_dir(&e.root)
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".rollback")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A state directory that is a bind mount of a folder inside a root (two volume mounts
/// of one host directory, say) is apart from the root by every path, yet the same
/// directory: actions are refused there (`reserved_path`, `create_directory` of the
/// mount point too: it was audited as a success), and nothing is written.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_state_directory_mounted_inside_a_root_is_never_written() {
    let e = env();
    let sub = e.root.join("sub");
    std::fs::create_dir_all(&e.root).unwrap();
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&sub)
        .unwrap();
    let state = e.dir.join("mounted-state");
    std::fs::create_dir(&state).unwrap();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_mount", "actions": [
            {"intent": "create_file", "path": "sub/x.txt", "content": "x"},
            {"intent": "replace_file", "path": "sub/artifacts.jsonl", "content": ""},
            {"intent": "create_directory", "path": "sub"}]}),
    );
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$2\"",
        &[sub.as_os_str(), state.as_os_str()],
    );
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&state)
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = json_out(&out);
    assert_eq!(run["status"], "blocked", "{run}");
    for a in run["actions"].as_array().unwrap() {
        assert_eq!(a["reason_code"], "reserved_path", "{a}");
    }
    assert!(!sub.join("x.txt").exists());
    // The runtime's files were made in the folder, through the mount, and left alone.
    let registry = std::fs::read(sub.join("artifacts.jsonl")).unwrap_or_default();
    assert!(registry.is_empty());
    assert!(sub.join("sandbox_audit.jsonl").exists());
}

/// A root inside the state directory, reached through a bind mount of it (so apart from it
/// by every path), is refused at start as the plain spelling is: agents would write among
/// the runtime's files. A root that is one of its folders is said to be that.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_root_inside_the_state_directory_through_a_mount_is_refused() {
    let e = env();
    let mnt = e.dir.join("mnt");
    std::fs::create_dir_all(e.state.join("agent")).unwrap();
    std::fs::create_dir_all(e.state.join("notes/inner")).unwrap();
    std::fs::create_dir_all(e.state.join("locks")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    // The state directory mounted, or only a folder of it.
    for (mounted, root, said) in [
        ("", "agent", "lies inside the state directory"),
        ("", "locks", "is a folder of the state directory"),
        ("notes", "inner", "lies inside the state directory"),
        ("notes", "", "lies inside the state directory"),
    ] {
        let source = e.state.join(mounted);
        let mut c = with_private_mount(
            "mount --bind \"$1\" \"$2\"",
            &[source.as_os_str(), mnt.as_os_str()],
        );
        c.arg("--root")
            .arg(mnt.join(root))
            .arg("--state-dir")
            .arg(&e.state)
            .args(["--json", "state"]);
        let Some(out) = output_unless_unshared(c) else {
            return;
        };
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let refusal = json_out(&out);
        assert_eq!(refusal["reason_code"], "invalid_config", "{refusal}");
        let why = refusal["reason"].as_str().unwrap();
        assert!(why.contains(said), "{root}: {why}");
    }
    assert!(!e.state.join("agent/.rollback").exists());
    assert!(!e.state.join("notes/inner/.rollback").exists());
}

/// Any folder of the state directory mounted into a root, not only the runtime's own, is
/// refused to actions: nothing is written beside the runtime's files.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_folder_of_the_state_directory_mounted_into_a_root_is_never_written() {
    let e = env();
    let notes = e.state.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    let m = e.root.join("m");
    std::fs::create_dir_all(&m).unwrap();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_fold", "actions": [
            {"intent": "create_file", "path": "m/w.md", "content": "x"}]}),
    );
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$2\"",
        &[notes.as_os_str(), m.as_os_str()],
    );
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let run = json_out(&out);
    assert_eq!(run["status"], "blocked", "{run}");
    let a = &run["actions"][0];
    assert_eq!(a["reason_code"], "reserved_path", "{a}");
    assert!(
        a["reason"]
            .as_str()
            .unwrap()
            .contains("a folder of the runtime's state directory"),
        "{a}"
    );
    assert!(!notes.join("w.md").exists());
}

/// A read-only mount does not make a config file safe: the folder or file it shows stays
/// writable where it comes from, so one that others could change is refused there too.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_config_file_on_a_read_only_mount_is_judged_as_any_other() {
    let e = env();
    let volume = e.dir.join("volume");
    std::fs::create_dir_all(&volume).unwrap();
    let cfg = volume.join("config.toml");
    std::fs::write(&cfg, "enable_write = true\ndry_run = false\n").unwrap();
    for (p, m) in [(&volume, 0o777), (&cfg, 0o666)] {
        std::fs::set_permissions(
            p,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(m),
        )
        .unwrap();
    }
    let state = |c: &mut std::process::Command| {
        c.arg("--root")
            .arg(&e.root)
            .arg("--state-dir")
            .arg(&e.state)
            .arg("--config")
            .arg(&cfg)
            .args(["--json", "state"]);
    };
    let mut writable = e.std_cmd();
    writable.arg("--config").arg(&cfg).args(["--json", "state"]);
    let out = writable.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\"",
        &[volume.as_os_str()],
    );
    state(&mut c);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writable by other users"),
        "{out:?}"
    );
}

/// A rollback that fails midway (its root full) says so on standard error under its
/// status, `failed`, not as a refusal: some of its steps may have been restored.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_rollback_failed_midway_is_not_called_refused() {
    let e = env();
    let tiny = e.dir.join("tiny");
    std::fs::create_dir_all(&tiny).unwrap();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_full", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "1"}]}),
    );
    // The file replaced by one byte, then the root filled: its bytes cannot come back.
    let script = r#"mount -t tmpfs -o size=2m tmpfs "$D" || exit 97
mkdir "$D/root" && head -c 300000 /dev/urandom > "$D/root/a.txt" || exit 98
"$B" --root "$D/root" --state-dir "$S" --enable-write --no-dry-run --json run "$P" > /dev/null || exit 99
head -c 10000000 /dev/zero > "$D/fill" 2> /dev/null
exec "$B" --root "$D/root" --state-dir "$S" --enable-write --no-dry-run --json rollback wf_full"#;
    let mut c = std::process::Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", script])
        .env("D", &tiny)
        .env("S", &e.state)
        .env("P", &plan)
        .env("B", assert_cmd::cargo::cargo_bin("ailab-sandbox"))
        .env_remove("AI_LAB_SANDBOX_CONFIG");
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let rb = json_out(&out);
    assert_eq!(rb["status"], "failed", "{rb}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("failed (io_error): "), "{err}");
    assert!(!err.contains("refused ("), "{err}");
}

/// A root out of inodes: the snapshot folder that could not be made is named as such, with
/// the reason in the words of every other write failure (it said "No such file or
/// directory", the open that followed, then the system's "No space left on device").
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_root_out_of_inodes_says_no_space() {
    let e = env();
    let tiny = e.dir.join("tiny");
    std::fs::create_dir_all(&tiny).unwrap();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_i", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    // Filled with files until no inode is left, then one freed: `.rollback` takes it.
    let mut c = with_private_mount(
        "mount -t tmpfs -o size=1m,nr_inodes=16 tmpfs \"$1\" && i=0 && while touch \"$1/f$i\" 2>/dev/null; do i=$((i+1)); done && rm \"$1/f0\"",
        &[tiny.as_os_str()],
    );
    c.arg("--root")
        .arg(&tiny)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let run = json_out(&out);
    let a = &run["actions"][0];
    assert_eq!(a["reason_code"], "io_error", "{run}");
    let why = a["reason"].as_str().unwrap();
    assert!(
        why.contains("snapshot: no storage space (the snapshot store .rollback's filesystem is full, of space or of inodes (df -h, df -i): free some there, then try again)"),
        "{why}"
    );
}

/// A full state directory: the run is refused saying where space is missing and what to
/// do (it said "could not record the run in the state directory: no storage space").
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_full_state_directory_says_where_to_free_space() {
    let Some(why) = refusal_on_a_filled_state_dir(
        "mount -t tmpfs -o size=256k tmpfs \"$1\" && cp -a \"$2\" \"$1/s\" && (dd if=/dev/zero of=\"$1/fill\" bs=4k 2>/dev/null; true)",
    ) else {
        return;
    };
    assert!(
        why.contains("no storage space (the state directory's filesystem is full, of space or of inodes (df -h, df -i): free some there, then try again)"),
        "{why}"
    );
}

/// A state directory out of inodes (space to spare) refuses a new workflow's lock in
/// the state directory's words, saying where and that inodes count too.
#[test]
fn a_state_directory_out_of_inodes_says_so_at_the_workflow_lock() {
    let Some(why) = refusal_on_a_filled_state_dir(
        "mount -t tmpfs -o size=4m,nr_inodes=64 tmpfs \"$1\" && cp -a \"$2\" \"$1/s\" && i=0 && while [ $i -lt 64 ] && touch \"$1/f$i\" 2>/dev/null; do i=$((i+1)); done",
    ) else {
        return;
    };
    assert!(
        why.starts_with("could not lock workflow 'wf_full': no storage space (the state directory's filesystem is full, of space or of inodes"),
        "{why}"
    );
}

/// The reason of a one-action plan (new workflow `wf_full`) refused `io_error` by a state
/// directory copied onto a small filesystem that `fill` (a shell command: `$1` the
/// mount point, the copy to go in `$1/s`, `$2` the state directory) mounts and fills;
/// `None` where no private mount namespace can be made.
fn refusal_on_a_filled_state_dir(fill: &str) -> Option<String> {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    let tiny = e.dir.join("tiny");
    std::fs::create_dir_all(&tiny).unwrap();
    // The copy takes the state directory's place, as a copy refused the root is told:
    // the root's owner record, naming the original, goes.
    std::fs::remove_file(e.root.join(".rollback/.ailab-owner")).unwrap();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_full", "actions": [
            {"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    let mut c = with_private_mount(fill, &[tiny.as_os_str(), e.state.as_os_str()]);
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(tiny.join("s"))
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan);
    let out = output_unless_unshared(c)?;
    let run = json_out(&out);
    let a = &run["actions"][0];
    assert_eq!(a["reason_code"], "io_error", "{run}");
    assert!(!e.root.join("b.txt").exists());
    Some(a["reason"].as_str().unwrap().to_owned())
}

/// Under a tight limit on open files, a plan touching many files still runs: the lock
/// files of its targets are closed as they are released, not kept open (64 of them
/// filled a limit of 64, and every write after failed with "Too many open files").
#[test]
fn a_plan_of_many_files_runs_under_a_tight_open_file_limit() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_fd", "actions": (0..80).map(|i| json!(
            {"intent": "create_file", "path": format!("d{i}/f{i}.txt"), "content": format!("{i}\n")}
        )).collect::<Vec<_>>()}),
    );
    let cfg = e.dir.join("c.toml");
    std::fs::write(&cfg, "[limits]\nwrites_per_minute = 1000\n").unwrap();
    let out = e
        .limited(32)
        .arg("--config")
        .arg(&cfg)
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    let run = json_out(&out);
    assert_eq!(run["status"], "success", "{run}");
    assert_eq!(std::fs::read(e.root.join("d79/f79.txt")).unwrap(), b"79\n");
}

/// Short of open files at any point of its start, a command says so: it is never shut
/// out of its own state directory by a kernel confinement that granted nothing (one
/// limit left Landlock no descriptor to name the roots and state directory with, and
/// every read was refused as another user's file while `state` said "fully_enforced").
#[test]
fn a_command_short_of_open_files_says_so_at_every_limit() {
    let e = env();
    let out = e.cmd().arg("state").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut verified = 0;
    for limit in 6..=24 {
        let out = e.limited(limit).args(["audit", "verify"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("permission denied"), "at {limit}: {out:?}");
        if out.status.code() == Some(0) {
            verified += 1;
            continue;
        }
        assert!(err.contains("ran out of open files"), "at {limit}: {out:?}");
        let out = e.limited(limit).args(["--json", "state"]).output().unwrap();
        if out.status.code() == Some(0) {
            let k = &json_out(&out)["kernel_confinement"];
            assert_ne!(k["status"], "fully_enforced", "at {limit}: {k}");
        }
    }
    assert!(verified > 0, "audit verify never ran under 25 open files");
}

/// Short of open files, `serve` and `mcp` refuse to start with a sentence, at any limit,
/// never panicking (tokio's signal set-up panicked at a limit of 15 or 16). The server's
/// port is taken, so one that starts fails to listen and ends.
#[test]
fn servers_short_of_open_files_refuse_without_panicking() {
    let e = env();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for face in [&["serve", "--addr", addr.as_str()][..], &["mcp"][..]] {
        for limit in 8..=40 {
            let out = e
                .limited(limit)
                .args(face)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.code().is_some_and(|c| c != 101) && !err.contains("panicked"),
                "{face:?} at {limit}: {out:?}"
            );
        }
    }
    // One that starts can write: below what a write needs it refuses to start instead of
    // refusing every write.
    let session = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"n/a.md","content":"x"}}}"#,
    ]
    .join("\n")
        + "\n";
    let input = e.dir.join("session.jsonl");
    std::fs::write(&input, session).unwrap();
    let mut started = 0;
    for limit in 8..=60 {
        let _ = std::fs::remove_dir_all(e.root.join("n"));
        let out = e
            .limited(limit)
            .args(["--enable-write", "--no-dry-run", "mcp"])
            .stdin(std::fs::File::open(&input).unwrap())
            .output()
            .unwrap();
        if out.status.code() == Some(2) {
            continue;
        }
        started += 1;
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("create_file wrote n/a.md"),
            "at {limit}: {out:?}"
        );
    }
    assert!(started > 0, "mcp never started under 61 open files");
}

/// A command that finds the audit trail held by another process past the wait is refused
/// like a busy peer (exit 1, `conflict`, with what to do), not as one that cannot run.
#[test]
fn a_trail_held_by_another_process_is_a_conflict() {
    let e = env();
    let out = e.cmd().arg("state").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let config = e.dir.join("quick.toml");
    std::fs::write(&config, "[limits]\nlock_wait_seconds = 1\n").unwrap();
    // The wait the refusal below names is one `state` shows.
    let out = e
        .cmd()
        .arg("--config")
        .arg(&config)
        .arg("state")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(", lock wait 1 s\n"), "{shown}");
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(e.state.join("sandbox_audit.jsonl"))
        .unwrap();
    log.lock().unwrap();
    let out = e
        .cmd()
        .arg("--config")
        .arg(&config)
        .args(["--json", "audit"])
        .output()
        .unwrap();
    log.unlock().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc = json_out(&out);
    assert_eq!(doc["reason_code"], "conflict", "{doc}");
    assert!(
        doc["reason"]
            .as_str()
            .unwrap()
            .contains("limits.lock_wait_seconds"),
        "{doc}"
    );
}

/// `audit verify` on a state directory mounted read-only checks the trail as it is and
/// says so on standard error, with `--json` too (the report alone is on standard output).
#[test]
fn a_read_only_trail_is_verified_and_said_to_be() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_ro", "actions": [
            {"intent": "create_file", "path": "x.txt", "content": "x"}]}),
    );
    let out = e
        .cmd()
        .args(["--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\"",
        &[e.state.as_os_str()],
    );
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["--json", "audit", "verify"]);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(json_out(&out)["ok"], json!(true));
    assert!(
        err.contains("verified read-only, without recovery"),
        "{err}"
    );
}

/// `audit verify --json` on a state the runtime cannot start on: the trail is intact,
/// verified read-only, with a note saying why (`said`).
fn verified_read_only(e: &Env, said: &str) {
    let out = e
        .cmd()
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(json_out(&out)["ok"], json!(true));
    assert!(
        err.contains(said) && err.contains("verified read-only, without recovery"),
        "{err}"
    );
}

/// A runtime given a root whose snapshot store another state directory claimed stops
/// (exit 2), naming the owner and what to do, and writes nothing; its own trail is still
/// verified, read-only.
#[test]
fn a_root_of_another_state_directory_stops_the_runtime_not_its_verify() {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"workflow_id": "wf_o", "actions": [
            {"intent": "create_file", "path": "x.txt", "content": "x"}]}),
    );
    let mut other = env();
    other.root = e.root.clone();
    let plan = other.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_t", "actions": [
            {"intent": "replace_file", "path": "x.txt", "content": "theirs"}]}),
    );
    let out = other.live(&["run", plan.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("belongs to another runtime's state directory, the one its record names"),
        "{err}"
    );
    // Its record, in the root, names it; the refusal names no path outside the roots.
    assert!(!err.contains(&e.state.display().to_string()), "{err}");
    assert_eq!(std::fs::read(e.root.join("x.txt")).unwrap(), b"x");
    assert!(!e.root.join(".rollback/wf_t").exists());
    verified_read_only(&other, "no sandbox root is usable");
}

/// A seal key of the wrong kind stops the runtime, not the verification of the trail,
/// which does not read it: verified read-only, saying why; a log of the wrong kind is
/// named by the verification too.
#[test]
fn a_damaged_seal_key_leaves_the_trail_verifiable() {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"actions": [{"intent": "create_file", "path": "x.txt", "content": "x"}]}),
    );
    let key = e.state.join("seal.key");
    std::fs::remove_file(&key).unwrap();
    std::fs::create_dir(&key).unwrap();
    verified_read_only(&e, "seal.key is a folder, not a regular file");
    // Anything else refuses as before, naming the key.
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // A key of the wrong length is damaged too, not a failure of the disk.
    std::fs::remove_dir(&key).unwrap();
    write_private(&key, b"abc");
    let out = e.cmd().args(["audit", "verify"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("holds 3 bytes, not the 32 of a key") && err.contains("verified read-only"),
        "{err}"
    );
    // Past what is read of a state file, too (it was a failure of the disk, and the
    // trail went unverified).
    std::fs::remove_file(&key).unwrap();
    write_private(&key, &vec![7u8; 2 << 20]);
    let out = e.cmd().args(["audit", "verify"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("holds more than 1048576 bytes, not the 32 of a key")
            && err.contains("verified read-only"),
        "{err}"
    );
    let log = e.state.join("sandbox_audit.jsonl");
    std::fs::rename(&log, e.dir.join("kept.jsonl")).unwrap();
    std::fs::create_dir(&log).unwrap();
    let out = e.cmd().args(["audit", "verify"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("sandbox_audit.jsonl is a folder"), "{err}");
}

/// A global option given both before and after the command is refused: the parser
/// would keep only the values after it, and a plan meant for one root land in another.
#[test]
fn a_global_option_on_both_sides_of_the_command_is_refused() {
    let e = env();
    let other = e.dir.join("other-root");
    let out = e
        .cmd()
        .args(["--json", "state", "--root"])
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json_out(&out);
    assert_eq!(v["reason_code"], "invalid_usage", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("--root is given both before and after the command")),
        "{v}"
    );
    assert!(!other.exists(), "nothing is made");
    // Each option is told what it would lose, not the root's risk.
    let out = e
        .cmd()
        .args(["--phase", "28.3", "--json", "state", "--phase", "28.3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let reason = json_out(&out)["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.contains("--phase is given both before and after the command")
            && reason.contains("the value before it would be ignored")
            && !reason.contains("root"),
        "{reason}"
    );
    // On one side only, as before.
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Writes `bytes` to a new file `path` that only its owner may read or change, as a
/// seal key must be.
fn write_private(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
        .unwrap();
}

/// A seal key removed beside a trail with entries is not made again (that would leave
/// every snapshot sealed so far untrusted, unsaid): the runtime stops, naming the key and
/// the ways on; the trail is still verified, read-only.
#[test]
fn a_removed_seal_key_is_not_made_again_beside_a_trail() {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"workflow_id": "wf_k", "actions": [
            {"intent": "create_file", "path": "x.txt", "content": "x"}]}),
    );
    let key = e.state.join("seal.key");
    std::fs::remove_file(&key).unwrap();
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{} is missing beside an audit trail of 1 line",
            key.display()
        )) && err.contains("put it back from a backup")
            && err.contains("head -c 32 /dev/urandom"),
        "{err}"
    );
    assert!(!key.exists(), "no new key is made");
    verified_read_only(&e, "is missing beside an audit trail");
    assert!(!key.exists());
    // A key others may read is refused (whoever reads it can seal records), naming
    // its mode and what to do.
    std::fs::write(&key, [7u8; 32]).unwrap();
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "the seal key '{}' has mode 0644, which lets other users read or change it",
            key.display()
        )) && err.contains(&format!("chmod 600 '{}'", key.display())),
        "{err}"
    );
    // A setting to correct, not a disk that cannot be written.
    assert_eq!(json_out(&out)["reason_code"], "invalid_config", "{out:?}");
    assert!(!err.contains("must be able to write there"), "{err}");
    verified_read_only(&e, "has mode 0644");
    // A key the operator makes private is taken: the snapshots sealed with the lost one
    // are not.
    std::fs::remove_file(&key).unwrap();
    write_private(&key, &[7u8; 32]);
    let out = e.cmd().args(["--json", "state"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = e.live(&["rollback", "wf_k"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        json_out(&out)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("seal key was replaced")),
        "{out:?}"
    );
    assert_eq!(std::fs::read(e.root.join("x.txt")).unwrap(), b"x");
}

/// When the default state directory cannot be created, the runtime uses the user's
/// (`$XDG_STATE_HOME/ailab-sandbox`) and says so. The default's parent is hidden under a
/// read-only tmpfs in a private mount namespace, so the real one is never touched.
#[test]
fn an_uncreatable_default_state_directory_falls_back_to_the_users() {
    let e = env();
    let xdg = e.dir.join("xdg");
    let mut c = with_private_mount("mount -t tmpfs -o ro,size=64k tmpfs /opt", &[]);
    c.arg("--root")
        .arg(&e.root)
        .args(["--json", "state"])
        .env_remove("AI_LAB_STATE_DIR")
        .env("XDG_STATE_HOME", &xdg);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_out(&out);
    let used = xdg.join("ailab-sandbox");
    assert_eq!(doc["state_dir"], json!(used.to_str().unwrap()), "{doc}");
    let notices = doc["notices"].to_string();
    assert!(
        notices.contains("/opt/ai-lab/runtime/state cannot be used (state directory /opt/ai-lab/runtime/state cannot be created"),
        "{notices}"
    );
    assert!(
        notices.contains("read-only filesystem or storage medium"),
        "{notices}"
    );
    assert!(used.join("sandbox_audit.jsonl").exists());
    // Said once on standard error.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("/opt/ai-lab/runtime/state cannot be used")
            .count(),
        1,
        "{err}"
    );
}

/// The default state directory named explicitly (as a config file or a client's
/// `AI_LAB_STATE_DIR` may) does not fall back, and its refusal says so and what to do.
#[test]
fn the_default_state_directory_set_explicitly_does_not_fall_back_and_says_so() {
    let e = env();
    let xdg = e.dir.join("xdg");
    let mut c = with_private_mount("mount -t tmpfs -o ro,size=64k tmpfs /opt", &[]);
    c.arg("--root")
        .arg(&e.root)
        .args(["--json", "state"])
        .env("AI_LAB_STATE_DIR", "/opt/ai-lab/runtime/state")
        .env("XDG_STATE_HOME", &xdg);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/opt/ai-lab/runtime/state cannot be created"),
        "{err}"
    );
    assert!(
        err.contains(
            "it was set explicitly, which leaves no fallback: leave the state directory unset"
        ),
        "{err}"
    );
    assert_eq!(json_out(&out)["reason_code"], "io_error");
    assert!(!xdg.exists());
}

/// With no home of the user's own to fall back to (neither `XDG_STATE_HOME` nor `HOME`
/// set), the refusal of the default says that no fallback was there, and what to set:
/// whether the default cannot be made (a read-only `/opt`) or others could swap it
/// (`/opt` writable by all), which keeps its reason code.
#[test]
fn no_fallback_for_the_default_state_directory_is_said() {
    for (mount, refused, code) in [
        (
            "mount -t tmpfs -o ro,size=64k tmpfs /opt",
            "/opt/ai-lab/runtime/state cannot be created",
            "io_error",
        ),
        (
            "mount -t tmpfs -o size=64k,mode=0777 tmpfs /opt",
            "the directory /opt above it (owner uid 0, group 0, mode 0777) is writable by other users",
            "invalid_config",
        ),
    ] {
        let e = env();
        let mut c = with_private_mount(mount, &[]);
        c.arg("--root")
            .arg(&e.root)
            .args(["--json", "state"])
            .env_remove("AI_LAB_STATE_DIR")
            .env_remove("XDG_STATE_HOME")
            .env_remove("HOME");
        let Some(out) = output_unless_unshared(c) else {
            return;
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(refused)
                && err.contains("nor is there one of this user's own to fall back to: neither XDG_STATE_HOME nor HOME is set to an absolute path"),
            "{err}"
        );
        assert_eq!(json_out(&out)["reason_code"], code, "{err}");
    }
}

/// The binary, run in a private mount namespace once `mount` (a shell command, given
/// `args` as `$1`, `$2`, …) has succeeded; never without it.
fn with_private_mount(mount: &str, args: &[&std::ffi::OsStr]) -> std::process::Command {
    let mut c = std::process::Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "{mount} || exit 97; shift {}; exec \"$@\"",
            args.len()
        ))
        .arg("sh")
        .args(args)
        .arg(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
        .env_remove("AI_LAB_SANDBOX_CONFIG");
    c
}

/// `c`'s output, or `None` (the test is skipped) where no private mount namespace can be
/// made: no `unshare`, or no privilege to mount.
fn output_unless_unshared(mut c: std::process::Command) -> Option<std::process::Output> {
    match c.output() {
        Ok(o)
            if o.status.code().is_some_and(|c| c != 97)
                && !String::from_utf8_lossy(&o.stderr).contains("unshare:") =>
        {
            Some(o)
        }
        _ => {
            eprintln!("no private mount namespace here: skipped");
            None
        }
    }
}

/// A result that cannot be written to standard output (a full disk) is an error, exit 2,
/// saying where to look, never a silent exit 0; a reader that went away (`| head`) is not.
#[test]
fn a_result_lost_on_a_full_disk_is_not_a_success() {
    let e = env();
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("no /dev/full here: skipped");
        return;
    };
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
        .env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args(["--json", "ops"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    // `ops` writes no line: no pointer to the trail.
    assert!(
        err.contains("could not be written to standard output") && !err.contains("audit trail"),
        "{err}"
    );
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_full", "actions": [{"intent": "create_file", "path": "a.md", "content": "a"}]}),
    );
    let out = e
        .std_cmd()
        .args(["--json", "--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .stdout(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("what the command did is on the audit trail"),
        "{err}"
    );
    let ok = e.cmd().args(["--json", "ops"]).output().unwrap();
    assert_eq!(ok.status.code(), Some(0));
    for args in [["--help"], ["--version"]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
            .args(args)
            .stdout(full)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let ok = e.cmd().args(args).output().unwrap();
        assert_eq!(ok.status.code(), Some(0), "{args:?}");
    }
}

/// A folder of a target the rollback cannot change (read-only here; a permission taken
/// away alike) refuses the rollback before anything is restored, and the preview says
/// so: met at its restore, it stopped half way, the other files restored.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_folder_the_rollback_cannot_change_refuses_it_up_front() {
    let e = env();
    e.seed_and_run(
        &[("pa/a.txt", "A0"), ("pb/b.txt", "B0")],
        &json!({"workflow_id": "wf_ro", "actions": [
            {"intent": "replace_file", "path": "pa/a.txt", "content": "A1"},
            {"intent": "replace_file", "path": "pb/b.txt", "content": "B1"}]}),
    );
    let pa = e.root.join("pa");
    for preview in [true, false] {
        let mut c = with_private_mount(
            "mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\"",
            &[pa.as_os_str()],
        );
        c.arg("--root")
            .arg(&e.root)
            .arg("--state-dir")
            .arg(&e.state);
        if !preview {
            c.args(["--enable-write", "--no-dry-run"]);
        }
        c.args(["--json", "rollback", "wf_ro"]);
        let Some(out) = output_unless_unshared(c) else {
            return;
        };
        let rb = json_out(&out);
        assert_eq!(rb["reason_code"], "conflict", "preview {preview}: {rb}");
        let why = rb["reason"].as_str().unwrap();
        assert!(
            why.contains("pa/a.txt") && why.contains("nothing was restored"),
            "{why}"
        );
        assert_eq!(std::fs::read(e.root.join("pb/b.txt")).unwrap(), b"B1");
    }
    let rb = e.live(&["rollback", "wf_ro"]);
    assert_eq!(json_out(&rb)["status"], "rolled_back", "{rb:?}");
    assert_eq!(std::fs::read(e.root.join("pa/a.txt")).unwrap(), b"A0");
}

/// A state directory inside a root reached through a mount of the root (apart from it by
/// every path) is refused before anything is made in it, as the plain spelling is: its
/// key and logs would lie where other programs of the root can reach them.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_state_directory_inside_a_root_through_a_mount_is_refused() {
    let e = env();
    std::fs::create_dir_all(e.root.join("inner")).unwrap();
    let mnt = e.dir.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let mut c = with_private_mount(
        "mount --bind \"$1\" \"$2\"",
        &[e.root.as_os_str(), mnt.as_os_str()],
    );
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(mnt.join("inner/st"))
        .args(["--json", "state"]);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let refusal = json_out(&out);
    assert_eq!(refusal["reason_code"], "invalid_config", "{refusal}");
    assert!(!e.root.join("inner/st").exists(), "made inside the root");
}

/// A directory an action made, in a folder the rollback cannot change, refuses the
/// rollback up front too: it removed the file, then could not remove the directory, and
/// said the rollback was done.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_made_directory_the_rollback_cannot_remove_refuses_it_up_front() {
    let e = env();
    std::fs::create_dir_all(e.root.join("pc")).unwrap();
    e.seed_and_run(
        &[("pb/b.txt", "B0")],
        &json!({"workflow_id": "wf_md", "actions": [
            {"intent": "create_file", "path": "pc/sub/c.txt", "content": "C"},
            {"intent": "replace_file", "path": "pb/b.txt", "content": "B1"}]}),
    );
    // `pc` read-only, the directory the action made in it writable.
    let Some(rb) = e.rollback_with_read_only("pc", "pc/sub", &["wf_md"]) else {
        return;
    };
    assert_eq!(rb["reason_code"], "conflict", "{rb}");
    assert!(rb["reason"].as_str().unwrap().contains("'pc/sub'"), "{rb}");
    assert!(e.root.join("pc/sub/c.txt").exists(), "nothing restored");
    assert_eq!(std::fs::read(e.root.join("pb/b.txt")).unwrap(), b"B1");
    // Once the directory holds someone else's file, the rollback leaves it in place and
    // needs nothing of the read-only folder: it goes ahead.
    std::fs::write(e.root.join("pc/sub/other.txt"), "theirs").unwrap();
    let rb = e
        .rollback_with_read_only("pc", "pc/sub", &["wf_md"])
        .unwrap();
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert!(!e.root.join("pc/sub/c.txt").exists());
    assert!(e.root.join("pc/sub/other.txt").exists());
}

/// What a rollback leaves in place needs nothing of its folder: a `create_directory` that
/// found its folder, in a read-only folder, rolls back (the files written in it removed).
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_folder_the_rollback_leaves_needs_nothing_of_its_parent() {
    let e = env();
    std::fs::create_dir_all(e.root.join("docs/existing")).unwrap();
    e.seed_and_run(
        &[],
        &json!({"workflow_id": "wf_ex", "actions": [
            {"intent": "create_directory", "path": "docs/existing"},
            {"intent": "create_file", "path": "docs/existing/n.md", "content": "n"},
            {"intent": "create_file", "path": "docs/gone.md", "content": "g"}]}),
    );
    // A file it made that someone removed since (a change: forced, it is "already gone"):
    // nothing left to remove there either.
    std::fs::remove_file(e.root.join("docs/gone.md")).unwrap();
    let Some(rb) = e.rollback_with_read_only("docs", "docs/existing", &["wf_ex", "--force"]) else {
        return;
    };
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert!(!e.root.join("docs/existing/n.md").exists());
    assert!(e.root.join("docs/existing").is_dir());
}

/// A directory an action made that cannot be removed when the rollback runs (busy: a
/// mount point here) is left on the ledger, and the next prune removes it (a rollback
/// looks only near what it restores); it stayed for good, the rollback saying it was
/// done.
/// Needs a private mount namespace (`unshare -m`, as root); skipped where there is none.
#[test]
fn a_made_directory_that_cannot_be_removed_now_is_removed_by_the_next_prune() {
    let e = env();
    e.seed_and_run(
        &[],
        &json!({"workflow_id": "wf_busy", "actions": [
            {"intent": "create_file", "path": "made/c.txt", "content": "C"}]}),
    );
    let made = e.root.join("made");
    let mut c = with_private_mount("mount --bind \"$1\" \"$1\"", &[made.as_os_str()]);
    c.arg("--root")
        .arg(&e.root)
        .arg("--state-dir")
        .arg(&e.state)
        .args([
            "--json",
            "--enable-write",
            "--no-dry-run",
            "rollback",
            "wf_busy",
        ]);
    let Some(out) = output_unless_unshared(c) else {
        return;
    };
    let rb = json_out(&out);
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert!(!made.join("c.txt").exists());
    assert!(made.is_dir(), "busy while the rollback ran");
    // The next prune, with no mount in the way, removes it, though it prunes nothing.
    let out = e.live(&["prune", "--older-than", "1h"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json_out(&out)["workflows_pruned"], json!([]), "{out:?}");
    assert!(!made.exists(), "left for good");
}

/// The binary on `e`'s root and state directory as user nobody (uid and gid 65534), with
/// both handed to that user; `None` (the test is skipped) unless this test runs as root
/// and nobody can run the binary there (a checkout in a private home, no `setpriv`).
fn as_nobody(e: &Env) -> Option<impl Fn(&[&str]) -> std::process::Output> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let probe = e.dir.join("probe");
    std::fs::write(&probe, b"").unwrap();
    if std::fs::metadata(&probe).unwrap().uid() != 0 {
        eprintln!("not root: skipped");
        return None;
    }
    // The test's own folder, opened to others so that nobody can reach into it.
    std::fs::set_permissions(&e.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (d, mode) in [(&e.root, 0o755), (&e.state, 0o700)] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let (root, state) = (e.root.clone(), e.state.clone());
    let run = move |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(assert_cmd::cargo::cargo_bin("ailab-sandbox"))
            .env_remove("AI_LAB_SANDBOX_CONFIG")
            .env_remove("AI_LAB_SANDBOX_TOKEN")
            .arg("--root")
            .arg(&root)
            .arg("--state-dir")
            .arg(&state)
            .args(["--json", "--enable-write", "--no-dry-run"])
            .args(args)
            .output()
            .unwrap()
    };
    match run(&["ops"]) {
        out if out.status.success() => Some(run),
        out => {
            eprintln!(
                "nobody cannot run the binary here: skipped ({})",
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
    }
}

/// Run as an unprivileged user: a write another user's folder forbids is a `conflict`
/// saying whose it is to put right, foreseen by the checks (it was `io_error` at the
/// write, which HTTP answers 500 as a failing disk), and a snapshot backup another user took is `reserved_path`, to give
/// back, then roll back (it was called damaged or missing, to restore by other means).
#[test]
fn as_another_user_permissions_are_theirs_to_put_right() {
    use std::os::unix::fs::PermissionsExt;
    let e = env();
    let Some(nobody) = as_nobody(&e) else {
        return;
    };
    // A plan written under `name`, run as nobody: its result document.
    let run_nobody = |name: &str, plan: &serde_json::Value| {
        let plan = e.write_plan(name, plan);
        json_out(&nobody(&["run", plan.to_str().unwrap()]))
    };
    std::fs::create_dir(e.root.join("roots")).unwrap();
    // Foreseen by the checks (a simulation, `check`), before anything is written, for a
    // file and for a folder to be made on the way.
    for (path, changed) in [
        ("roots/x.txt", "roots/x.txt"),
        ("roots/new/x.txt", "roots/new"),
    ] {
        let plan = e.write_plan(
            "p.json",
            &json!({"workflow_id": "wf_perm", "actions": [
                {"intent": "create_file", "path": path, "content": "x"}]}),
        );
        let out = nobody(&["run", plan.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let run = json_out(&out);
        assert_eq!(run["status"], "blocked", "{run}");
        let action = &run["actions"][0];
        assert_eq!(action["reason_code"], "conflict", "{action}");
        assert_eq!(
            action["reason"],
            format!(
                "the folder holding '{changed}' cannot be changed by this process (permission denied): give the runtime's user access there, or use another path"
            ),
        );
        let out = nobody(&["check", "--intent", "create_file", "--path", path]);
        assert_eq!(json_out(&out)["reason_code"], "conflict");
    }
    assert!(!e.root.join("roots/x.txt").exists() && !e.root.join("roots/new").exists());
    // In a sticky folder another user owns, only an entry's owner may replace it: a
    // write and a rollback alike are refused before anything changes.
    let sticky = e.root.join("st");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(sticky.join("theirs.txt"), b"theirs").unwrap();
    std::fs::set_permissions(
        sticky.join("theirs.txt"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let out = nobody(&[
        "check",
        "--intent",
        "append_file",
        "--path",
        "st/theirs.txt",
    ]);
    let check = json_out(&out);
    assert_eq!(check["reason_code"], "conflict", "{check}");
    assert!(
        check["reason"].as_str().unwrap().starts_with(
            "'st/theirs.txt' belongs to another user in a folder where only an entry's owner may remove or replace it (the sticky bit)"
        ),
        "{check}"
    );
    assert_eq!(
        run_nobody(
            "st.json",
            &json!({"workflow_id": "wf_st", "actions": [
            {"intent": "create_file", "path": "st/mine.txt", "content": "m"}]})
        )["status"],
        "success"
    );
    std::os::unix::fs::chown(sticky.join("mine.txt"), Some(0), Some(0)).unwrap();
    let rb = json_out(&nobody(&["rollback", "--force", "wf_st"]));
    assert_eq!(rb["reason_code"], "conflict", "{rb}");
    assert!(
        rb["reason"]
            .as_str()
            .unwrap()
            .contains("'st/mine.txt' belongs to another user"),
        "{rb}"
    );
    assert!(sticky.join("mine.txt").exists());
    for (wf, intent, content) in [
        ("wf_a", "create_file", "v1"),
        ("wf_b", "replace_file", "v2"),
    ] {
        let plan = e.write_plan(
            &format!("{wf}.json"),
            &json!({"workflow_id": wf, "actions": [
                {"action_id": "a1", "intent": intent, "path": "f.txt", "content": content}]}),
        );
        let out = nobody(&["run", plan.to_str().unwrap()]);
        assert_eq!(json_out(&out)["status"], "success");
    }
    // A file another user took and closed is neither replaced nor rolled back, forced
    // or not: what it holds cannot be told (it was called changed, to force).
    assert_eq!(
        run_nobody(
            "u.json",
            &json!({"workflow_id": "wf_u", "actions": [
            {"intent": "create_file", "path": "u.txt", "content": "u"}]})
        )["status"],
        "success"
    );
    std::os::unix::fs::chown(e.root.join("u.txt"), Some(0), Some(0)).unwrap();
    std::fs::set_permissions(e.root.join("u.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    for args in [
        &["rollback", "wf_u"][..],
        &["rollback", "--force", "wf_u"],
        &["check", "--intent", "replace_file", "--path", "u.txt"],
    ] {
        let out = json_out(&nobody(args));
        assert_eq!(out["reason_code"], "conflict", "{args:?} {out}");
        assert!(
            out["reason"]
                .as_str()
                .unwrap()
                .contains("'u.txt' cannot be read by this process (permission denied"),
            "{out}"
        );
    }
    assert!(e.root.join("u.txt").exists());
    // A file of another user's whose mode shuts its owner out (0044) is written as the
    // runtime's own, readable and writable by it, so its write can be rolled back (it shut the
    // runtime out of its own write for good).
    std::fs::write(e.root.join("shut.txt"), b"hello").unwrap();
    std::fs::set_permissions(
        e.root.join("shut.txt"),
        std::fs::Permissions::from_mode(0o044),
    )
    .unwrap();
    assert_eq!(
        run_nobody(
            "shut.json",
            &json!({"workflow_id": "wf_shut", "actions": [{"intent": "sandbox_transform", "path": "shut.txt",
            "edits": [{"old": "hello", "new": "bye"}]}]})
        )["status"],
        "success"
    );
    let mode = |p: &str| {
        std::fs::metadata(e.root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("shut.txt"), 0o644);
    let rb = json_out(&nobody(&["rollback", "wf_shut"]));
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert_eq!(rb["steps"][0]["checksum_validated"], true, "{rb}");
    assert_eq!(std::fs::read(e.root.join("shut.txt")).unwrap(), b"hello");
    // A folder the runtime may write in but not read (0300) is refused by the checks:
    // its sync would fail after the write (which was then reported undone while it
    // stood).
    let wx = e.root.join("wx");
    std::fs::create_dir(&wx).unwrap();
    std::fs::write(wx.join("x.txt"), b"orig").unwrap();
    for p in [&wx, &wx.join("x.txt")] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&wx, std::fs::Permissions::from_mode(0o300)).unwrap();
    let plan = e.write_plan(
        "wx.json",
        &json!({"workflow_id": "wf_wx", "actions": [{"intent": "replace_file", "path": "wx/x.txt", "content": "new"}]}),
    );
    let run = json_out(&nobody(&["run", plan.to_str().unwrap()]));
    assert_eq!(run["status"], "blocked", "{run}");
    assert_eq!(
        run["actions"][0]["reason"],
        "the folder holding 'wx/x.txt' cannot be read by this process (permission denied), which strict durability needs to sync it (relaxed and batched durability write there): give the runtime's user access there, or use another path"
    );
    assert_eq!(std::fs::read(wx.join("x.txt")).unwrap(), b"orig");
    // Without per-folder syncs (`relaxed`) such a folder takes the write, and its
    // rollback.
    let relaxed = e.dir.join("relaxed.toml");
    std::fs::write(&relaxed, "durability = \"relaxed\"\n").unwrap();
    let relaxed = relaxed.to_str().unwrap();
    let run = json_out(&nobody(&[
        "--config",
        relaxed,
        "run",
        plan.to_str().unwrap(),
    ]));
    assert_eq!(run["status"], "success", "{run}");
    let rb = json_out(&nobody(&["--config", relaxed, "rollback", "wf_wx"]));
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert_eq!(std::fs::read(wx.join("x.txt")).unwrap(), b"orig");
    // Nor with whole-filesystem syncs (`batched`), which make the names a write or a
    // restore changed there durable: its rollback too (its restores synced the folder,
    // failing `io_error` for good, "roll back again"), and a file whose folder is made
    // with it (its write synced the folder it made that folder in, failing `io_error`).
    let batched = e.dir.join("batched.toml");
    std::fs::write(&batched, "durability = \"batched\"\n").unwrap();
    let batched = batched.to_str().unwrap();
    let plan = e.write_plan(
        "wxb.json",
        &json!({"workflow_id": "wf_wxb", "actions": [
            {"intent": "replace_file", "path": "wx/x.txt", "content": "newer"},
            {"intent": "create_file", "path": "wx/y.txt", "content": "made"},
            {"intent": "create_file", "path": "wx/sub/z.txt", "content": "made in a folder made"}]}),
    );
    let run = json_out(&nobody(&[
        "--config",
        batched,
        "run",
        plan.to_str().unwrap(),
    ]));
    assert_eq!(run["status"], "success", "{run}");
    assert_eq!(std::fs::read(wx.join("x.txt")).unwrap(), b"newer");
    let rb = json_out(&nobody(&["--config", batched, "rollback", "wf_wxb"]));
    assert_eq!(rb["status"], "rolled_back", "{rb}");
    assert_eq!(rb["steps_rolled_back"], 3, "{rb}");
    assert_eq!(std::fs::read(wx.join("x.txt")).unwrap(), b"orig");
    assert!(!wx.join("y.txt").exists());
    assert!(!wx.join("sub").exists());
    let verify = json_out(&nobody(&["--config", batched, "audit", "verify"]));
    assert_eq!(verify["ok"], true, "{verify}");
    std::fs::set_permissions(&wx, std::fs::Permissions::from_mode(0o755)).unwrap();
    // In a setgid folder a replaced file keeps its group (it took the folder's), and so
    // does its restore.
    use std::os::unix::fs::MetadataExt;
    let sg = e.root.join("sg");
    std::fs::create_dir(&sg).unwrap();
    std::os::unix::fs::chown(&sg, Some(65534), Some(100)).unwrap();
    std::fs::set_permissions(&sg, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::write(sg.join("k.txt"), b"k").unwrap();
    std::os::unix::fs::chown(sg.join("k.txt"), Some(65534), Some(65534)).unwrap();
    assert_eq!(
        run_nobody(
            "sg.json",
            &json!({"workflow_id": "wf_sg", "actions": [{"intent": "replace_file", "path": "sg/k.txt", "content": "new"}]})
        )["status"],
        "success"
    );
    let gid = || std::fs::metadata(sg.join("k.txt")).unwrap().gid();
    assert_eq!(gid(), 65534);
    assert_eq!(
        json_out(&nobody(&["rollback", "wf_sg"]))["status"],
        "rolled_back"
    );
    assert_eq!(gid(), 65534);
    // The snapshot store closed to the runtime (0500) is the operator's to give back,
    // foreseen by the checks (it was io_error at the write, HTTP 500, "could not create
    // the snapshot").
    let store = e.root.join(".rollback");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o500)).unwrap();
    let run = run_nobody(
        "store.json",
        &json!({"workflow_id": "wf_store", "actions": [{"intent": "create_file", "path": "store.txt", "content": "s"}]}),
    );
    assert_eq!(run["actions"][0]["reason_code"], "reserved_path", "{run}");
    // Foreseen by the checks, before anything is written.
    assert_eq!(run["status"], "blocked", "{run}");
    assert!(!e.root.join("store.txt").exists());
    // Nor pruned: refused before its mark, which called the intact snapshots pruned half
    // way and kept them from every rollback.
    let out = nobody(&["prune", "--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(1));
    let pruned = json_out(&out);
    assert_eq!(pruned["workflows_pruned"], json!([]), "{pruned}");
    assert_eq!(
        pruned["workflows_failed"][0]["reason_code"],
        "reserved_path"
    );
    assert!(!e.state.join("inflight/wf_b.pruned").exists());
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A lock file another user took is named by its place (it blamed the target).
    let lock = e.state.join("locks/wf-wf_b.lock");
    std::os::unix::fs::chown(&lock, Some(0), Some(0)).unwrap();
    let rb = json_out(&nobody(&["rollback", "wf_b"]));
    assert!(
        rb["reason"].as_str().unwrap().contains(
            "could not lock workflow 'wf_b': the state directory's locks/wf-wf_b.lock: permission denied: another user owns it"
        ),
        "{rb}"
    );
    std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
    let backup = e.root.join(".rollback/wf_b/a1/backup");
    std::os::unix::fs::chown(&backup, Some(0), Some(0)).unwrap();
    let out = nobody(&["rollback", "wf_b"]);
    assert_eq!(out.status.code(), Some(1));
    let rb = json_out(&out);
    assert_eq!(rb["reason_code"], "reserved_path", "{rb}");
    let reason = rb["reason"].as_str().unwrap();
    assert!(
        reason.contains("cannot be read by this process (permission denied"),
        "{rb}"
    );
    assert!(reason.contains("its snapshot is kept"), "{rb}");
    assert_eq!(std::fs::read(e.root.join("f.txt")).unwrap(), b"v2");
    // Nor pruned: kept and listed, saying why (a prune removed it, the only copy of
    // the file's earlier bytes).
    let out = nobody(&["prune", "--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(1));
    let pruned = json_out(&out);
    assert_eq!(
        pruned["workflows_failed"][0]["workflow_id"], "wf_b",
        "{pruned}"
    );
    assert_eq!(
        pruned["workflows_failed"][0]["reason_code"],
        "reserved_path"
    );
    assert!(backup.exists());
    std::os::unix::fs::chown(&backup, Some(65534), Some(65534)).unwrap();
    let out = nobody(&["rollback", "wf_b"]);
    assert_eq!(json_out(&out)["status"], "rolled_back");
    assert_eq!(std::fs::read(e.root.join("f.txt")).unwrap(), b"v1");
    let verify = json_out(&nobody(&["audit", "verify"]));
    assert_eq!(verify["ok"], true, "{verify}");
    // A state file another user took is named (the audit log was blamed for the head
    // and the registry alike).
    for (file, cmd) in [
        ("sandbox_audit.head.json", "state"),
        ("artifacts.jsonl", "artifacts"),
    ] {
        std::os::unix::fs::chown(e.state.join(file), Some(0), Some(0)).unwrap();
        let out = nobody(&[cmd]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{file}: permission denied: another user owns it")),
            "{err}"
        );
        std::os::unix::fs::chown(e.state.join(file), Some(65534), Some(65534)).unwrap();
    }
}

/// The human forms say what the JSON says: a rollback of one action is headed by that
/// action, not read as the whole workflow's; audit statistics count reason codes; a
/// long intent keeps the artifact table's columns.
#[test]
fn human_output_says_what_the_json_says() {
    let e = env();
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_h", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "t.txt", "content": "one\n"},
            {"action_id": "a2", "intent": "sandbox_transform", "path": "t.txt",
             "edits": [{"old": "one", "new": "two"}]}]}),
    );
    let out = e
        .cmd()
        .args(["--enable-write", "--no-dry-run", "run"])
        .arg(&plan)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let refused = e.write_plan(
        "r.json",
        &json!({"workflow_id": "wf_r", "actions": [
            {"intent": "create_file", "path": "../x.txt", "content": "x"}]}),
    );
    let out = e.cmd().arg("run").arg(&refused).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = e.cmd().args(["artifacts"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(rows[1].contains(" sandbox_transform "), "{table}");
    // Every row's checksum starts under the header's SHA256.
    for row in &rows[1..] {
        let sha = row.split_whitespace().nth(2).unwrap();
        assert_eq!(row.find(sha), rows[0].find("SHA256"), "{table}");
    }
    let wrong_kind = e.write_plan(
        "k.json",
        &json!({"workflow_id": "wf_k", "actions": [
            {"intent": "write_json", "path": "k.txt", "data": {}}]}),
    );
    let out = e.cmd().arg("run").arg(&wrong_kind).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = e.cmd().args(["audit", "stats"]).output().unwrap();
    let stats = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stats
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["reason", "path_traversal", "1"]),
        "{stats}"
    );
    // The counts stand in one column, a reason code longer than the others included.
    assert!(stats.contains("extension_not_allowed"), "{stats}");
    let counts: Vec<usize> = stats
        .lines()
        .skip(1)
        .map(|l| l.trim_end().rfind(' ').unwrap())
        .collect();
    assert!(
        counts.len() > 3 && counts.windows(2).all(|w| w[0] == w[1]),
        "{stats}"
    );
    let out = e
        .cmd()
        .args([
            "--enable-write",
            "--no-dry-run",
            "rollback",
            "wf_h",
            "--action",
            "a2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.starts_with("action a2 of workflow wf_h  "), "{said}");
    assert_eq!(std::fs::read(e.root.join("t.txt")).unwrap(), b"one\n");
}

/// Tables keep their columns when a value is longer than the usual: an action id of 36
/// characters in a run and its rollback, an intent no operation has on the trail.
#[test]
fn human_tables_make_room_for_long_ids_and_intents() {
    let e = env();
    let long_id = "step-0123456789abcdef0123456789abcdef";
    let long_intent = "summarise_everything_into_a_file";
    let plan = e.write_plan(
        "p.json",
        &json!({"workflow_id": "wf_cols", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": long_id, "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    // The column of a row's `word` starts where the same column of the other rows does.
    let aligned = |text: &str, rows: &[String], word: &str| {
        let at: Vec<usize> = rows
            .iter()
            .map(|r| {
                r.find(word)
                    .unwrap_or_else(|| panic!("{word} in {r:?}: {text}"))
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] == w[1]),
            "{word} at {at:?}:\n{text}"
        );
    };
    // The rows of a command's table that name `create_file`, one for each action.
    let rows_of = |args: &[&str]| {
        let (code, text) = human_output(&e, args, &plan);
        assert_eq!(code, Some(0), "{text}");
        let rows: Vec<String> = text
            .lines()
            .filter(|l| l.contains(" create_file "))
            .map(str::to_owned)
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        (text, rows)
    };
    let (text, rows) = rows_of(&["--enable-write", "--no-dry-run", "run"]);
    aligned(&text, &rows, " create_file ");
    aligned(&text, &rows, " success ");
    let (text, rows) = rows_of(&["--enable-write", "--no-dry-run", "rollback", "wf_cols"]);
    aligned(&text, &rows, " restored ");
    aligned(&text, &rows, "checksum_validated=");

    let blocked = e.write_plan(
        "b.json",
        &json!({"workflow_id": "wf_blk", "actions": [
            {"intent": long_intent, "path": "three.txt", "content": "3"},
            {"intent": "create_file", "path": "four.txt", "content": "4"}]}),
    );
    let (code, text) = human_output(&e, &["run"], &blocked);
    assert_eq!(code, Some(1));
    // The action not run has a reason and no code: no placeholder stands for one.
    assert!(
        text.lines()
            .any(|l| l == "      not run: another action of the plan was refused"),
        "{text}"
    );
    let (code, text) = human_output(&e, &["audit"], &plan);
    assert_eq!(code, Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].ends_with(" TARGET"), "{text}");
    let target_at = lines[0].find(" TARGET").unwrap();
    for row in &lines[1..] {
        let path = row.split_whitespace().last().unwrap();
        assert_eq!(row.rfind(path), Some(target_at + 1), "{text}");
    }
    assert!(lines.iter().any(|l| l.contains(long_intent)), "{text}");
}

/// `audit verify` of a state directory that does not exist (a mistyped path) neither makes
/// it nor calls its trail intact: exit 2, a command that could not run, saying so (exit 1,
/// a trail found broken, told a script of tampering).
#[test]
fn verifying_a_state_directory_that_is_not_there_says_so() {
    let e = env();
    let out = e
        .cmd()
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // The document of a command that could not run, as for any setting to correct: a
    // script reading `reason_code` first finds one.
    let v = json_out(&out);
    assert_eq!(v["reason_code"], "invalid_config", "{v}");
    assert!(v.get("ok").is_none(), "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("does not exist"),
        "{v}"
    );
    let out = e.cmd().args(["audit", "verify"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.starts_with("error: the state directory "), "{said}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("BROKEN"),
        "{out:?}"
    );
    // Nor do the other reads of the records list nothing as if it held nothing.
    for read in [
        &["audit"][..],
        &["audit", "stats"],
        &["artifacts"],
        &["artifacts", "show", "art_x"],
    ] {
        let out = e.cmd().arg("--json").args(read).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{read:?}: {out:?}");
        assert_eq!(json_out(&out)["reason_code"], "invalid_config", "{read:?}");
    }
    assert!(!e.state.exists() && !e.root.exists());
    // Once the runtime has used it, an empty trail is intact.
    e.cmd().arg("state").assert().success();
    let out = e
        .cmd()
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json_out(&out)["ok"], true);
}

/// `mcp` stops on SIGTERM or SIGINT as on a closed input: what it read is answered, and
/// it exits 0 (the signal killed it, a write half done, its temporary file left in the
/// root for the next start).
#[test]
fn mcp_stops_cleanly_on_sigterm_and_sigint() {
    use std::io::{BufRead, Write};
    for signal in ["-TERM", "-INT"] {
        let e = env();
        let mut child = e
            .std_cmd()
            .args(["--enable-write", "--no-dry-run", "mcp"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"s.md","content":"s"}}}"#,
        ] {
            writeln!(stdin, "{line}").unwrap();
        }
        let mut answers = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let second: Value = serde_json::from_str(&answers.nth(1).unwrap().unwrap()).unwrap();
        assert_eq!(second["id"], 2, "{second}");
        assert_eq!(second["result"]["isError"], false, "{second}");
        let killed = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{signal}: mcp did not stop");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "{signal}: {status:?}");
        assert_eq!(std::fs::read(e.root.join("s.md")).unwrap(), b"s");
        drop(stdin);
    }
}

/// A malformed id is refused before the runtime opens: exit 2, `invalid_id`, and no root
/// or state directory made for a command that could not run (all three were made).
#[test]
fn a_malformed_id_is_refused_before_anything_is_made() {
    for args in [
        &["rollback", "../x"][..],
        &["rollback", "wf_ok", "--action", "a b"],
        &["audit", "--workflow", "../x"],
        &["artifacts", "show", "../x"],
        &["artifacts", "--workflow", "x/y"],
    ] {
        let e = env();
        let out = e.cmd().arg("--json").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let v = json_out(&out);
        assert_eq!(v["reason_code"], "invalid_id", "{args:?}: {v}");
        assert!(
            v["reason"].as_str().unwrap().contains("is not a valid id"),
            "{args:?}: {v}"
        );
        if args[0] == "rollback" {
            assert_eq!(v["status"], "refused", "{v}");
            assert_eq!(v["workflow_id"], args[1], "{v}");
        }
        assert!(!e.root.exists(), "{args:?}: a root was made");
        assert!(!e.state.exists(), "{args:?}: a state directory was made");
    }
}
