//! `kill -9` of a real `ailab-sandbox run` at many moments of a long plan. After each
//! kill: every target holds its old or its new bytes, the next start recovers (no
//! temporary files left, every target agreeing with the audit trail), `audit verify`
//! passes, and `rollback --force` restores the original tree byte for byte.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ACTIONS: usize = 40;
const TRIALS: u64 = 24;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ailab-sandbox"))
}

fn tree(dir: &Path, base: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let rel = p.strip_prefix(base).unwrap().display().to_string();
        if rel == ".rollback" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            out.insert(rel, None);
            tree(&p, base, out);
        } else {
            out.insert(rel, Some(std::fs::read(&p).unwrap()));
        }
    }
}

fn snapshot(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    tree(root, root, &mut out);
    out
}

fn has_temp_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.contains(".ailab-tmp-")
            || (e.file_type().unwrap().is_dir() && has_temp_files(&e.path()))
    })
}

fn cli(cfg: &Path) -> Command {
    let mut c = Command::new(bin());
    for v in [
        "AI_LAB_SANDBOX_ROOTS",
        "AI_LAB_STATE_DIR",
        "AI_LAB_ENABLE_SANDBOX_WRITE",
        "AI_LAB_SANDBOX_DRY_RUN",
        "AI_LAB_SANDBOX_CONFIG",
    ] {
        c.env_remove(v);
    }
    c.arg("--config").arg(cfg).arg("--json");
    c
}

/// `ailab-sandbox run PLAN`, started, its output dropped.
fn spawn_run(cfg: &Path, plan: &Path) -> std::process::Child {
    cli(cfg)
        .arg("run")
        .arg(plan)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn kill_9_at_random_moments_is_always_recoverable() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(root.join("docs")).unwrap();
    for i in 0..ACTIONS {
        if i % 2 == 0 {
            std::fs::write(
                root.join(format!("docs/f{i}.txt")),
                format!("original {i}\n"),
            )
            .unwrap();
        }
    }
    // Half the trials with per-file fsyncs, half with batched whole-filesystem syncs.
    let configs: Vec<PathBuf> = ["strict", "batched"]
        .iter()
        .map(|durability| {
            let cfg = tmp.path().join(format!("{durability}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "roots = [\"{}\"]\nstate_dir = \"{}\"\nenable_write = true\ndry_run = false\ndurability = \"{durability}\"\n[limits]\nwrites_per_minute = 100000\n",
                    root.display(),
                    state.display()
                ),
            )
            .unwrap();
            cfg
        })
        .collect();
    let original = snapshot(&root);
    // Even actions replace existing files; odd ones create new files in new directories.
    let new_bytes = |i: usize| format!("new content {i}\n").repeat(50);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut killed_mid_run = 0;
    let mut noticed = 0;
    for trial in 0..TRIALS {
        let cfg = &configs[trial as usize % 2];
        let wf = format!("wf_kill{trial}");
        let actions: Vec<Value> = (0..ACTIONS)
            .map(|i| {
                if i % 2 == 0 {
                    json!({"intent": "replace_file", "path": format!("docs/f{i}.txt"), "content": new_bytes(i)})
                } else {
                    json!({"intent": "create_file", "path": format!("n{i}/deep/g{i}.txt"), "content": new_bytes(i)})
                }
            })
            .collect();
        let plan = tmp.path().join(format!("{wf}.json"));
        std::fs::write(
            &plan,
            serde_json::to_vec(&json!({"workflow_id": wf, "actions": actions})).unwrap(),
        )
        .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(2_000 + seed % 60_000);
        let mut child = spawn_run(cfg, &plan);
        std::thread::sleep(delay);
        let finished = child.try_wait().unwrap().is_some();
        child.kill().ok();
        child.wait().unwrap();
        if !finished {
            killed_mid_run += 1;
        }

        for i in 0..ACTIONS {
            let p = if i % 2 == 0 {
                root.join(format!("docs/f{i}.txt"))
            } else {
                root.join(format!("n{i}/deep/g{i}.txt"))
            };
            match std::fs::read(&p) {
                Ok(b) => {
                    let old = if i % 2 == 0 {
                        Some(format!("original {i}\n").into_bytes())
                    } else {
                        None
                    };
                    assert!(
                        b == new_bytes(i).into_bytes() || Some(&b) == old.as_ref(),
                        "trial {trial}: {} is torn",
                        p.display()
                    );
                }
                Err(_) => assert!(
                    i % 2 == 1,
                    "trial {trial}: existing file {} vanished",
                    p.display()
                ),
            }
        }
        // The next start recovers the dead run.
        let out = cli(cfg).arg("state").output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        // What the start says is on standard error with --json too, not only in `state`.
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        for n in doc["notices"].as_array().unwrap() {
            noticed += 1;
            assert!(
                err.contains(&format!("note: {}", n.as_str().unwrap())),
                "trial {trial}: {n} not on stderr: {err}"
            );
        }
        assert!(
            !has_temp_files(&root),
            "trial {trial}: temporary files left after recovery"
        );
        // After recovery the tree agrees with the audit trail: a target holds its new
        // bytes exactly when its action is audited as done and not rolled back.
        let out = cli(cfg)
            .args(["audit", "--workflow", &wf, "--limit", "1000"])
            .output()
            .unwrap();
        let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let mut done = std::collections::HashSet::new();
        for e in entries.iter().rev() {
            let target = e["target_path"].as_str().unwrap().to_owned();
            match e["status"].as_str().unwrap() {
                "success" => {
                    done.insert(target);
                }
                "rolled_back" => {
                    done.remove(&target);
                }
                _ => {}
            }
        }
        for i in 0..ACTIONS {
            let p = if i % 2 == 0 {
                root.join(format!("docs/f{i}.txt"))
            } else {
                root.join(format!("n{i}/deep/g{i}.txt"))
            };
            let holds_new = std::fs::read(&p).ok() == Some(new_bytes(i).into_bytes());
            assert_eq!(
                holds_new,
                done.contains(&p.display().to_string()),
                "trial {trial}: {} disagrees with the audit trail",
                p.display()
            );
        }
        let out = cli(cfg).args(["audit", "verify"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["ok"], true, "trial {trial}: {v}");
        let out = cli(cfg)
            .args(["rollback", &wf, "--force"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            v["status"] == "rolled_back" || v["reason_code"] == "no_rollback_data",
            "trial {trial}: {v}"
        );
        assert_eq!(
            snapshot(&root),
            original,
            "trial {trial}: original tree restored"
        );
    }
    assert!(
        killed_mid_run >= TRIALS / 3,
        "only {killed_mid_run} of {TRIALS} kills landed mid-run"
    );
    assert!(noticed > 0, "no start said it recovered a run");
}

/// A run's first snapshot in a root claims the root's snapshot store (`.rollback/.ailab-owner`),
/// written beside it first under a temporary name. A run killed before that name's rename
/// left the file in the store's top, where no snapshot folder of the run names it: the next
/// start removes it with the dead run's other temporary files. Another process's (a claim
/// that may be under way) stays.
#[test]
fn a_claim_a_killed_run_was_writing_is_removed_at_the_next_start() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&root).unwrap();
    let cfg = tmp.path().join("strict.toml");
    std::fs::write(
        &cfg,
        format!(
            "roots = [\"{}\"]\nstate_dir = \"{}\"\nenable_write = true\ndry_run = false\ndurability = \"strict\"\n[limits]\nwrites_per_minute = 100000\nmax_workflow_bytes = 1000000000\n",
            root.display(),
            state.display()
        ),
    )
    .unwrap();
    // Long enough to be killed mid-run once its claim is made.
    let actions: Vec<Value> = (0..100)
        .map(|i| json!({"intent": "create_file", "path": format!("d{i}/f.txt"), "content": "x".repeat(1 << 18)}))
        .collect();
    let plan = tmp.path().join("plan.json");
    std::fs::write(
        &plan,
        serde_json::to_vec(&json!({"workflow_id": "wf_claim", "actions": actions})).unwrap(),
    )
    .unwrap();
    let mut child = spawn_run(&cfg, &plan);
    let record = state.join("inflight/wf_claim.json");
    let owner = root.join(".rollback/.ailab-owner");
    let mut execution = None;
    for _ in 0..20_000 {
        if owner.exists()
            && let Ok(bytes) = std::fs::read(&record)
            && let Ok(rec) = serde_json::from_slice::<Value>(&bytes)
        {
            execution = rec["execution_id"].as_str().map(str::to_owned);
            break;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let running = child.try_wait().unwrap().is_none();
    child.kill().ok();
    child.wait().unwrap();
    let execution = execution.expect("the run wrote its record and claimed the store");
    assert!(running, "the run finished before it could be killed");
    let seed = &execution[execution.len() - 8..];
    let dead = root.join(format!(
        ".rollback/.ailab-tmp-18ee7552ab2419fd00000030{seed}"
    ));
    let other = root.join(".rollback/.ailab-tmp-18ee7552ab2419fd000000300badcafe");
    std::fs::write(&dead, b"claim").unwrap();
    std::fs::write(&other, b"claim").unwrap();
    let out = cli(&cfg).arg("state").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        doc["notices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("recovered interrupted run")),
        "{doc}"
    );
    assert!(!dead.exists(), "the killed run's claim was left: {doc}");
    assert!(other.exists(), "another process's claim may be under way");
    assert!(
        !std::fs::read(&owner).unwrap().is_empty(),
        "the claim the run made stays"
    );
}
