//! Several processes on one workflow at once: the budget never overshoots, the rate limit
//! is exact, no registry line is lost, the audit chain stays valid, and under `batched`
//! durability they share the workflow's commit log without losing an entry.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};

fn config(dir: &Path, durability: &str, limits: &str) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "roots = [\"{}\"]\nstate_dir = \"{}\"\nenable_write = true\ndry_run = false\ndurability = \"{durability}\"\n[limits]\n{limits}\n",
            dir.join("root").display(),
            dir.join("state").display()
        ),
    )
    .unwrap();
    cfg
}

/// Starts `procs` processes at once, each running a plan of three writes to `wf` (in a
/// directory of its own, or all in the root when `flat`); returns their statuses.
fn race(dir: &Path, cfg: &Path, wf: &str, procs: usize, flat: bool) -> Vec<String> {
    let children: Vec<_> = (0..procs)
        .map(|p| {
            let sep = if flat { '-' } else { '/' };
            let actions: Vec<Value> = (0..3)
                .map(|i| json!({"intent": "create_file", "path": format!("p{p}{sep}f{i}.txt"), "content": format!("{p}/{i}")}))
                .collect();
            let plan = dir.join(format!("{wf}-{p}.json"));
            std::fs::write(&plan, serde_json::to_vec(&json!({"workflow_id": wf, "actions": actions})).unwrap()).unwrap();
            Command::new(env!("CARGO_BIN_EXE_ailab-sandbox"))
                .env_remove("AI_LAB_SANDBOX_CONFIG")
                .arg("--config")
                .arg(cfg)
                .args(["--json", "run"])
                .arg(&plan)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            v["status"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

fn verify(cfg: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_ailab-sandbox"))
        .arg("--config")
        .arg(cfg)
        .args(["--json", "audit", "verify"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn budget_is_never_overshot_by_parallel_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "strict",
        "max_artifacts_per_workflow = 10\nwrites_per_minute = 1000",
    );
    let statuses = race(tmp.path(), &cfg, "wf_budget", 6, false);
    assert_eq!(
        statuses.iter().filter(|s| *s == "success").count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| *s == "blocked").count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        lines(&tmp.path().join("state/artifacts.jsonl")),
        9,
        "no lost or extra registry line"
    );
    let v = verify(&cfg);
    assert_eq!(v["ok"], true, "{v}");
}

#[test]
fn rate_limit_is_exact_across_parallel_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "strict", "writes_per_minute = 10");
    let statuses = race(tmp.path(), &cfg, "wf_rate", 6, false);
    // Burst of ten: three plans of three fit, a fourth would need twelve.
    assert_eq!(
        statuses.iter().filter(|s| *s == "success").count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(lines(&tmp.path().join("state/artifacts.jsonl")), 9);
    let v = verify(&cfg);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        v["entries"].as_u64().unwrap(),
        9 + 3 * 3 - 3,
        "nine writes and each blocked plan's refused actions"
    );
}

/// Six processes commit to one workflow's commit log in turn (`batched`, writes in the
/// root: after the workflow's first commit each one is logged). Every write lands, once,
/// and by the next start at the latest (here `audit verify`'s) the log holds nothing.
#[test]
fn batched_processes_share_a_workflow_commit_log() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "batched", "writes_per_minute = 1000");
    let statuses = race(tmp.path(), &cfg, "wf_shared", 6, true);
    assert!(statuses.iter().all(|s| s == "success"), "{statuses:?}");
    for p in 0..6 {
        for i in 0..3 {
            let path = tmp.path().join(format!("root/p{p}-f{i}.txt"));
            assert_eq!(std::fs::read_to_string(path).unwrap(), format!("{p}/{i}"));
        }
    }
    assert_eq!(lines(&tmp.path().join("state/artifacts.jsonl")), 18);
    let v = verify(&cfg);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["entries"].as_u64().unwrap(), 18);
    let log = ailab_sandbox_core::confine::state::StateDir::open(&tmp.path().join("state"))
        .unwrap()
        .commit_log_file("wf_shared")
        .unwrap()
        .expect("the workflow's commit log");
    assert!(
        ailab_sandbox_core::commit_log::read(&log)
            .unwrap()
            .is_empty(),
        "entries left in the log"
    );
}
