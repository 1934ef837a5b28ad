//! Any bytes in one of the files the runtime keeps (the registry, the trail and its head,
//! a run record, a commit log, the left-dirs ledger, a snapshot's record, a root's owner
//! record), as a crash, a failing disk or a hand edit could leave them: opening the
//! sandbox, recovery, its reads, a run, a rollback and a prune never panic, and nothing
//! outside the root and the state directory changes.
#![no_main]

use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::sandbox::RollbackOptions;
use ailab_sandbox_core::{Config, Sandbox};
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The files the input may stand for, beneath the template's folder.
const FILES: [&str; 9] = [
    "state/artifacts.jsonl",
    "state/sandbox_audit.jsonl",
    "state/sandbox_audit.head.json",
    "state/inflight/wf_dead.json",
    "state/inflight/wf_dead.log",
    "state/left_dirs.jsonl",
    "state/inflight/wf_done.json",
    "root/.rollback/wf_dead/a1/meta.json",
    "root/.rollback/.ailab-owner",
];

const OUTSIDE: &[u8] = b"outside, never to change";

fn config(dir: &Path) -> Config {
    let mut c = Config::with_roots(vec![dir.join("root")], dir.join("state"));
    c.durability = Durability::Batched;
    c.enable_write = true;
    c.dry_run = false;
    c.limits.writes_per_minute = 1_000_000;
    c
}

fn plan(json: serde_json::Value) -> ailab_sandbox_core::Plan {
    serde_json::from_value(json).expect("a plan")
}

/// A state directory and a root holding a finished workflow and one whose process died
/// between its writes and their record, made once.
fn template() -> &'static Path {
    static T: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = T.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("a temporary folder");
        let dir = tmp.path().join("t");
        std::fs::create_dir_all(dir.join("root/d")).expect("the root");
        std::fs::write(dir.join("root/d/old.md"), b"old\n").expect("a file");
        let clock: Arc<dyn ailab_sandbox_core::clock::Clock> =
            Arc::new(ailab_sandbox_core::clock::SystemClock);
        let points = Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
        let sb = Sandbox::open_armed(config(&dir), clock, points).expect("a sandbox");
        let done = sb
            .run_plan(plan(serde_json::json!({"workflow_id": "wf_done", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "d/new.md", "content": "new\n"},
                {"action_id": "a2", "intent": "replace_file", "path": "d/old.md", "content": "older\n"},
                {"action_id": "a3", "intent": "create_directory", "path": "d/sub"},
                {"action_id": "a4", "intent": "write_json", "path": "d/sub/x.json", "data": {"k": [1, 2]}}
            ]})))
            .expect("a run");
        assert!(done.is_success(), "{done:?}");
        // The process dies before the second action's registry line.
        sb.failpoints().arm_crash("before_registry", 2);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sb.run_plan(plan(serde_json::json!({"workflow_id": "wf_dead", "actions": [
                {"action_id": "a1", "intent": "append_file", "path": "d/new.md", "content": "more\n"},
                {"action_id": "a2", "intent": "sandbox_transform", "path": "d/old.md",
                 "edits": [{"old": "older", "new": "oldest"}]},
                {"action_id": "a3", "intent": "create_file", "path": "d/sub/y.md", "content": "y\n"}
            ]})))
        }));
        std::panic::set_hook(hook);
        assert!(died.is_err(), "the run was to die");
        drop(sb);
        std::fs::create_dir_all(tmp.path().join("outside")).expect("outside");
        (tmp, dir)
    });
    path
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder");
    for e in std::fs::read_dir(from).expect("a listing") {
        let e = e.expect("an entry");
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().expect("a type").is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).expect("a copy");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, content)) = data.split_first() else {
        return;
    };
    let template = template();
    let work = tempfile::tempdir().expect("a temporary folder");
    let dir = work.path().join("t");
    copy_tree(template, &dir);
    let outside = work.path().join("outside.md");
    std::fs::write(&outside, OUTSIDE).expect("the outside file");
    let target = dir.join(FILES[usize::from(pick) % FILES.len()]);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).expect("its folder");
    }
    std::fs::write(&target, content).expect("the fuzzed file");

    if let Ok(sb) = Sandbox::open(config(&dir)) {
        let _ = sb.state_doc();
        let _ = sb.audit_verify();
        let _ = sb.audit_entries(50, None);
        let _ = sb.audit_stats();
        let _ = sb.artifacts(50, None);
        if let Ok(list) = sb.artifacts(50, Some("wf_done")) {
            for a in list {
                let _ = sb.artifact_with_lineage(&a.artifact_id);
            }
        }
        let _ = sb.rollback_info("wf_dead");
        let _ = sb.rollback_workflow("wf_dead", &RollbackOptions::default());
        let _ = sb.run_plan(plan(serde_json::json!({"workflow_id": "wf_next", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "d/old.md", "content": "next\n"},
            {"action_id": "a2", "intent": "create_file", "path": "d/sub/z.md", "content": "z\n"}
        ]})));
        let forced = RollbackOptions {
            force: true,
            ..RollbackOptions::default()
        };
        let _ = sb.rollback_workflow("wf_done", &forced);
        let _ = sb.prune(std::time::Duration::ZERO);
    }
    assert_eq!(std::fs::read(&outside).expect("the outside file"), OUTSIDE);
    let left: Vec<_> = std::fs::read_dir(work.path())
        .expect("a listing")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(left.len(), 2, "only the copy and the outside file: {left:?}");
});
