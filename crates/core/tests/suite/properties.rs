//! Properties over generated inputs: any path string is refused or lands inside the
//! root; the workflow machine only moves along its nine edges.

use crate::support::*;
use ailab_sandbox_core::confine::resolve_sandbox_path;
use ailab_sandbox_core::workflow::{WorkflowState, transition};
use proptest::prelude::*;
use serde_json::json;
use std::path::PathBuf;

fn path_token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just(String::new()),
        Just("~".to_owned()),
        Just("a".to_owned()),
        Just("b.txt".to_owned()),
        Just(".rollback".to_owned()),
        Just("lnk".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\\".to_owned()),
        Just("%2e%2e".to_owned()),
        "[a-z.]{1,6}",
        any::<String>(),
    ]
}

fn path_string() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        proptest::collection::vec(path_token(), 1..12),
    )
        .prop_map(|(abs, parts)| format!("{}{}", if abs { "/" } else { "" }, parts.join("/")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn lexical_resolution_is_refused_or_inside(path in path_string()) {
        let roots = vec![PathBuf::from("/srv/sandbox")];
        if let Ok(r) = resolve_sandbox_path(&path, &roots, None, 8) {
            let joined = ailab_sandbox_core::confine::path::join_display(&roots[0], &r.rel);
            prop_assert!(ailab_sandbox_core::confine::is_within_sandbox(&joined, &roots[0]));
            prop_assert!(r.rel.components().iter().all(|c| !c.is_empty() && c != ".." && c != "." && !c.contains('/')));
            prop_assert!(r.rel.depth() <= 8);
        }
    }

    #[test]
    fn transitions_follow_the_nine_edges(from in 0usize..6, to in 0usize..6) {
        let (f, t) = (WorkflowState::ALL[from], WorkflowState::ALL[to]);
        let legal = [
            ("planning", "executing"), ("planning", "failed"), ("executing", "mutating"),
            ("executing", "done"), ("executing", "failed"), ("mutating", "done"),
            ("mutating", "failed"), ("done", "rolled_back"), ("failed", "rolled_back"),
        ];
        let expected = legal.contains(&(f.as_str(), t.as_str()));
        prop_assert_eq!(transition(f, t).is_ok(), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Real writes through the root handle, with a symlink to outside and a hard link to
    /// an outside file planted in the root: whatever the path, nothing outside changes and
    /// every written file is inside.
    #[test]
    fn real_writes_stay_inside(paths in proptest::collection::vec(path_string(), 1..4)) {
        let w = World::new();
        std::fs::create_dir_all(w.path("a")).unwrap();
        std::os::unix::fs::symlink(&w.outside, w.path("lnk")).unwrap();
        std::fs::hard_link(w.outside.join("secret.txt"), w.path("b.txt")).unwrap();
        let before = w.outside_tree();
        let sb = w.sandbox();
        for p in paths {
            let _ = sb.run_plan(plan(json!({"actions": [
                {"intent": "append_file", "path": p, "content": "pwned"}]})));
        }
        prop_assert_eq!(w.outside_tree(), before);
    }
}

/// One generated action: which intent, on which of three paths, with which content.
fn crash_action() -> impl Strategy<Value = (u8, u8, u8)> {
    (0u8..4, 0u8..3, 0u8..200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// A run of generated actions over a few shared files fails at a generated step of a
    /// generated action (a crash, or an I/O error the pipeline handles, stopping or
    /// rolling back), in each durability; then, maybe, a rollback dies before or after
    /// one of its restores, or between a restore's mark and its audit line. A crash in
    /// `batched` mode before any sync point of the run is a power cut that keeps only the
    /// commit log. After the next start every file holds what the newest audited change to
    /// it left, every success is registered, the audit chain verifies, and a forced
    /// rollback gives back the original tree.
    #[test]
    fn recovery_after_a_crash_anywhere_is_consistent(
        actions in proptest::collection::vec(crash_action(), 1..7),
        point in 0usize..6,
        nth in 1u32..7,
        mode in 0u8..3,
        crash in any::<bool>(),
        undo_on_failure in any::<bool>(),
        rollback_crash in proptest::option::of((1u32..5, 0usize..3)),
        flat in any::<bool>(),
    ) {
        use ailab_sandbox_core::audit::AuditStatus;
        use ailab_sandbox_core::config::Durability;
        use std::collections::BTreeMap;
        let points = ["before_commit", "after_snapshot", "before_mutate", "after_mutate", "before_registry", "before_audit"];
        let w = World::new();
        w.write("p0.txt", b"original 0\n");
        w.write("d/p1.txt", b"original 1\n");
        let original = w.tree();
        let mut c = w.writable_config();
        c.durability = [Durability::Relaxed, Durability::Strict, Durability::Batched][mode as usize];
        c.limits.writes_per_minute = 1000;
        // The third file is created in a new directory (a write with sync points), or
        // beside the first (every write of the run commits through the log).
        let paths = ["p0.txt", "d/p1.txt", if flat { "p2.txt" } else { "new/p2.txt" }];
        // Every generated plan is valid: a missing file is created first, an existing
        // one is never created again, and a transform replaces the file's whole text
        // (known here by following the plan), which occurs exactly once.
        let mut text: [Option<String>; 3] =
            [Some("original 0\n".into()), Some("original 1\n".into()), None];
        let plan_actions: Vec<serde_json::Value> = actions
            .iter()
            .enumerate()
            .map(|(i, (intent, p, n))| {
                let p = *p as usize;
                let line = format!("line {i} {n}\n");
                let mut a = json!({"action_id": format!("a{i}"), "path": paths[p]});
                let (intent, next) = match (&text[p], *intent) {
                    (None, _) => ("create_file", line.clone()),
                    (Some(_), 0 | 3) => ("replace_file", line.clone()),
                    (Some(t), 1) => ("append_file", format!("{t}{line}")),
                    (Some(t), _) => {
                        a["edits"] = json!([{"old": t, "new": line}]);
                        ("sandbox_transform", line.clone())
                    }
                };
                a["intent"] = json!(intent);
                if intent != "sandbox_transform" {
                    a["content"] = json!(line);
                }
                text[p] = Some(next);
                a
            })
            .collect();
        // What is on disk at the last sync point, for a power cut in `batched` mode.
        // The workflow's first commit (it creates the commit log) is a sync point: it
        // comes first, on a file of its own.
        let durable = (c.durability == Durability::Batched).then(|| {
            let sb = w.open(c.clone());
            let r = sb.run_plan(plan(json!({"workflow_id": "wf_prop", "actions": [
                {"intent": "create_file", "path": "seed.txt", "content": "seed\n"}]})));
            assert!(r.is_ok_and(|r| r.is_success()));
            drop(sb);
            Durable::take(&w)
        });
        let sb = w.open(c.clone());
        let syncs = sb.batched_syncs();
        // The failure is a crash or an I/O error the pipeline handles itself.
        if crash {
            sb.failpoints().arm_crash(points[point], nth);
        } else {
            sb.failpoints().arm(points[point], nth);
        }
        let on_failure = if undo_on_failure { "rollback" } else { "stop" };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sb.run_plan(plan(json!({"workflow_id": "wf_prop", "on_failure": on_failure, "actions": plan_actions})))
        }));
        let sb = match outcome {
            Ok(r) => {
                let r = r.unwrap();
                prop_assert!(!r.simulation_only && r.status != ailab_sandbox_core::executor::RunStatus::Blocked,
                    "the generated plan must run: {:?}", r.actions);
                sb
            }
            // A crash ends the process: the next thing to happen is a start, which recovers.
            // In `batched` mode with no sync point since the run began it is a power cut:
            // everything but the commit log goes back to that sync point.
            Err(_) => {
                match &durable {
                    Some(d) if sb.batched_syncs() == syncs => {
                        std::mem::forget(sb);
                        d.restore_except_commit_logs(&w);
                    }
                    _ => drop(sb),
                }
                w.open(c.clone())
            }
        };
        // Then, maybe, a rollback of the workflow that dies at one of its restores.
        if let Some((k, at)) = rollback_crash {
            sb.failpoints().arm_crash(["during_restore", "after_restore", "after_mark"][at], k);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                sb.rollback_workflow("wf_prop", &ailab_sandbox_core::sandbox::RollbackOptions::default())
            }));
        }
        drop(sb);

        let sb = w.open(c);
        prop_assert!(sb.audit_verify().unwrap().ok);
        let entries = sb.audit_entries(1000, Some("wf_prop")).unwrap();
        // What each target must hold after the newest audited change to it (entries
        // come newest first): a success's bytes, or what a rollback restored (`None`:
        // the file is gone).
        let mut newest: BTreeMap<String, Option<String>> = BTreeMap::new();
        let registered = sb.registry().get_by_workflow("wf_prop").unwrap();
        for e in entries.iter().rev() {
            match e.status {
                AuditStatus::Success => {
                    // Registered too (the registry also keeps what a rollback undid).
                    prop_assert!(registered.iter().any(|r| r.action_id == e.action_id
                        && Some(&r.checksum_sha256) == e.after_checksum.as_ref()), "{}", e.action_id);
                    newest.insert(e.target_path.clone(), e.after_checksum.clone());
                }
                AuditStatus::RolledBack => {
                    newest.insert(e.target_path.clone(), e.after_checksum.clone());
                }
                _ => {}
            }
        }
        for (target, sum) in &newest {
            let now = std::fs::read(target).ok().map(|b| sha(&b));
            prop_assert_eq!(&now, sum, "{}", target);
        }
        let rb = sb.rollback_workflow("wf_prop", &forced());
        prop_assert!(
            rb.status == "rolled_back"
                || rb.reason_code == Some(ailab_sandbox_core::ReasonCode::NoRollbackData),
            "{:?}", rb
        );
        prop_assert_eq!(w.tree(), original);
    }
}
