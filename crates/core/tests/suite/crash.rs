//! Crash consistency: a run that dies at any step of the pipeline leaves every target at
//! its old or new bytes, and the next start recovers: unfinished actions rolled back,
//! no temporary files, audit chain intact, and `rollback --force` gives back the original
//! tree byte for byte.

use crate::support::*;
use ailab_sandbox_core::sandbox::RollbackOptions;
use serde_json::json;
use std::panic::AssertUnwindSafe;

const POINTS: [&str; 5] = [
    "after_snapshot",
    "before_mutate",
    "after_mutate",
    "before_registry",
    "before_audit",
];

fn seed(w: &World) {
    w.write("a.txt", b"alpha\n");
    w.write("d/b.txt", b"beta\n");
}

fn plan_json() -> serde_json::Value {
    json!({"workflow_id": "wf_crash", "actions": [
        {"intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"},
        {"intent": "append_file", "path": "d/b.txt", "content": "more\n"},
        {"intent": "create_file", "path": "new/c.txt", "content": "gamma\n"}]})
}

fn temp_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in walk(dir) {
        if e.contains(".ailab-tmp-") {
            out.push(e);
        }
    }
    out
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn crash_at_every_step_of_every_action_is_recoverable() {
    let mut trials = 0;
    for point in POINTS {
        for nth in 1..=3 {
            let w = World::new();
            seed(&w);
            let original = w.tree();
            let sb = w.sandbox();
            sb.failpoints().arm_crash(point, nth);
            let outcome =
                std::panic::catch_unwind(AssertUnwindSafe(|| sb.run_plan(plan(plan_json()))));
            assert!(outcome.is_err(), "{point}#{nth} should crash");
            drop(sb);
            // Each target is at its old or its new bytes.
            let a = w.read("a.txt");
            assert!(
                a == b"alpha\n" || a == b"ALPHA\n",
                "{point}#{nth}: a.txt torn"
            );
            let b = w.read("d/b.txt");
            assert!(
                b == b"beta\n" || b == b"beta\nmore\n",
                "{point}#{nth}: b.txt torn"
            );
            if let Ok(c) = std::fs::read(w.path("new/c.txt")) {
                assert_eq!(c, b"gamma\n", "{point}#{nth}");
            }
            let sb = w.sandbox();
            assert!(
                sb.notices()
                    .iter()
                    .any(|n| n.contains("recovered interrupted run")),
                "{point}#{nth}: {:?}",
                sb.notices()
            );
            assert!(temp_files(&w.root).is_empty(), "{point}#{nth}");
            let v = sb.audit_verify().unwrap();
            assert!(v.ok, "{point}#{nth}: {v:?}");
            let rb = sb.rollback_workflow(
                "wf_crash",
                &RollbackOptions {
                    action_id: None,
                    force: true,
                },
            );
            assert!(
                rb.status == "rolled_back"
                    || rb.reason_code == Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
                "{point}#{nth}: {rb:?}"
            );
            assert_eq!(w.tree(), original, "{point}#{nth}: original tree restored");
            assert!(sb.audit_verify().unwrap().ok);
            trials += 1;
        }
    }
    assert_eq!(trials, 15);
}

#[test]
fn a_live_run_in_another_process_is_not_recovered() {
    let w = World::new();
    let sb = w.sandbox();
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let rec = json!({"state": "active", "execution_id": "ex_live", "workflow_id": "wf_live", "started_at": "2026-01-01T00:00:00Z"});
    state
        .inflight_write("wf_live", rec.to_string().as_bytes(), false)
        .unwrap();
    let held = state.lock("wf-wf_live").unwrap();
    assert!(
        sb.recover().is_empty(),
        "the workflow lock is held: the run is alive"
    );
    drop(held);
    let r = sb.recover();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].workflow_id, "wf_live");
    assert!(sb.recover().is_empty(), "the record is gone once recovered");
}
