//! The pipeline: secure defaults, whole-plan validation, failures, budgets, rate limit,
//! plan parsing and ids.

use crate::support::*;
use ailab_sandbox_core::ReasonCode;
use serde_json::json;

fn three_actions() -> serde_json::Value {
    json!({"workflow_id": "wf_demo", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "notes/hello.md", "content": "# Hi\n"},
        {"action_id": "a2", "intent": "write_json", "path": "out/data.json", "data": {"k": 1}},
        {"action_id": "a3", "intent": "sandbox_transform", "path": "notes/hello.md", "edits": [{"old": "Hi", "new": "Hello"}]}]})
}

#[test]
fn default_config_only_simulates() {
    let w = World::new();
    let sb = w.open(w.config());
    let r = run(&sb, three_actions());
    assert_eq!(status(&r), "simulated_success");
    assert!(r.simulation_only);
    // A library caller asking whether it wrote is told no (as for a simulated rollback).
    assert!(!r.is_success() && r.is_simulated());
    assert_eq!(
        serde_json::to_value(r.dry_run_reason).unwrap(),
        json!("sandbox_disabled")
    );
    assert!(
        w.tree().is_empty(),
        "nothing written: {:?}",
        w.tree().keys()
    );
    assert_eq!(
        r.actions[0].after_checksum.as_deref(),
        Some(sha(b"# Hi\n").as_str())
    );
    let audit = sb.audit_entries(10, None).unwrap();
    assert_eq!(audit.len(), 3);
    assert!(
        audit
            .iter()
            .all(|e| serde_json::to_value(e.status).unwrap() == json!("simulated"))
    );
    assert_eq!(sb.registry().count_by_workflow("wf_demo").unwrap(), 0);
}

/// A simulation judges each action on what the earlier ones of the plan would leave:
/// an append and an edit after a create report the checksums, sizes and budget a real
/// run of the same plan then reports.
#[test]
fn a_simulation_builds_on_the_earlier_actions_as_a_run_does() {
    let w = World::new();
    let p = json!({"workflow_id": "wf_sim", "actions": [
        {"intent": "create_file", "path": "n.txt", "content": "one\n"},
        {"intent": "append_file", "path": "n.txt", "content": "two\n"},
        {"intent": "sandbox_transform", "path": "n.txt", "edits": [{"old": "one", "new": "uno"}]},
        {"intent": "replace_file", "path": "n.txt", "content": "three\n"},
        {"intent": "append_file", "path": "n.txt", "content": "four\n"}]});
    let sums = |r: &ailab_sandbox_core::executor::RunResult| -> Vec<(Option<String>, Option<u64>)> {
        r.actions
            .iter()
            .map(|a| (a.after_checksum.clone(), a.size_bytes))
            .collect()
    };
    let simulated = run(&w.open(w.config()), p.clone());
    assert_eq!(status(&simulated), "simulated_success");
    let expected: Vec<(Option<String>, Option<u64>)> = [
        &b"one\n"[..],
        b"one\ntwo\n",
        b"uno\ntwo\n",
        b"three\n",
        b"three\nfour\n",
    ]
    .iter()
    .map(|b| (Some(sha(b)), Some(b.len() as u64)))
    .collect();
    assert_eq!(sums(&simulated), expected);
    let real = run(&w.open(w.writable_config()), p);
    assert_eq!(status(&real), "success");
    assert_eq!(sums(&real), expected);
    assert_eq!(w.read("n.txt"), b"three\nfour\n");
}

#[test]
fn write_flag_without_dry_run_off_still_simulates() {
    let w = World::new();
    let mut c = w.config();
    c.enable_write = true;
    let sb = w.open(c);
    let r = run(&sb, three_actions());
    assert_eq!(status(&r), "simulated_success");
    assert_eq!(
        serde_json::to_value(r.dry_run_reason).unwrap(),
        json!("dry_run")
    );
    assert!(w.tree().is_empty());
}

#[test]
fn phase_without_writes_simulates_with_reason() {
    let w = World::new();
    let mut c = w.writable_config();
    c.phase = "28.2".into();
    let sb = w.open(c);
    // Execution is on, in a phase whose executor is read-only.
    assert_eq!(
        sb.state_doc().unwrap().execution_mode,
        ailab_sandbox_core::context::ExecutionMode::Readonly
    );
    let r = run(&sb, three_actions());
    assert_eq!(status(&r), "blocked");
    assert_eq!(code(&r, 0).as_deref(), Some("phase_not_supported"));
    assert_eq!(
        r.dry_run_reason,
        Some(ailab_sandbox_core::context::DryRunReason::PhaseNotSupported)
    );
    assert!(w.tree().is_empty());
    // Blocked for another reason in a phase that writes, the run says governance.
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "x.service", "content": "x"}]}),
    );
    assert_eq!(status(&r), "blocked");
    assert_eq!(
        r.dry_run_reason,
        Some(ailab_sandbox_core::context::DryRunReason::GovernanceBlocked)
    );
}

#[test]
fn simulations_consume_no_rate_limit_tokens() {
    let w = World::new();
    let sim = w.open(w.config());
    for i in 0..15 {
        let r = run(
            &sim,
            json!({"workflow_id": "wf_sim", "actions": [{"intent": "create_file", "path": format!("f{i}.txt"), "content": "x"}]}),
        );
        assert_eq!(status(&r), "simulated_success");
    }
    drop(sim);
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_sim", "actions": (0..10).map(|i| json!({"intent": "create_file", "path": format!("f{i}.txt"), "content": "x"})).collect::<Vec<_>>()}),
    );
    assert_eq!(status(&r), "success");
}

#[test]
fn real_run_writes_and_reports_the_timeline() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(&sb, three_actions());
    assert_eq!(status(&r), "success");
    assert!(!r.simulation_only);
    assert_eq!(r.state.as_str(), "done");
    assert_eq!(w.read("notes/hello.md"), b"# Hello\n");
    let events: Vec<&str> = r.timeline.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(events.first(), Some(&"execution_started"));
    assert_eq!(
        events.iter().filter(|e| **e == "action_succeeded").count(),
        3
    );
}

#[test]
fn blocked_plan_names_every_refused_action_and_writes_nothing() {
    let w = World::new();
    let sb = w.sandbox();
    let before = w.outside_tree();
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "create_file", "path": "ok.txt", "content": "fine"},
        {"intent": "create_file", "path": "../escape.txt", "content": "bad"},
        {"intent": "run_command", "path": "x.sh"},
        {"intent": "create_file", "path": "x.service", "content": "[Unit]"}]}),
    );
    assert_eq!(status(&r), "blocked");
    assert_eq!(code(&r, 0), None);
    assert_eq!(action_status(&r, 0), "skipped");
    assert_eq!(code(&r, 1).as_deref(), Some("path_traversal"));
    assert_eq!(code(&r, 2).as_deref(), Some("forbidden_intent"));
    assert_eq!(code(&r, 3).as_deref(), Some("blocked_extension"));
    assert!(w.tree().is_empty());
    assert_eq!(w.outside_tree(), before);
    let stats = sb.audit_stats().unwrap();
    assert_eq!(stats.blocked, 3);
    assert_eq!(stats.success, 0);
    let metrics = sb.metrics().encode();
    assert!(
        metrics
            .contains("ailab_sandbox_escape_attempts_total{detection_method=\"path_traversal\"} 1"),
        "{metrics}"
    );
}

#[test]
fn blocked_entries_name_their_target_as_written_entries_do() {
    let w = World::new();
    let sb = w.sandbox();
    let note = w.path("n/a.txt").display().to_string();
    let unit = w.path("n/u.service").display().to_string();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_tp", "actions": [
        {"intent": "create_file", "path": "n/a.txt", "content": "x", "description": "chmod +x it"},
        {"intent": "create_file", "path": unit, "content": "[Unit]"},
        {"intent": "create_file", "path": "../escape.txt", "content": "x"},
        {"intent": "create_file", "path": "/elsewhere/f.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "blocked");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_tp", "actions": [
        {"intent": "create_file", "path": "n/a.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success");
    let mut by_target: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for e in sb.audit_entries(20, Some("wf_tp")).unwrap() {
        let status = serde_json::to_value(e.status).unwrap();
        by_target
            .entry(e.target_path)
            .or_default()
            .push(status.as_str().unwrap().to_owned());
    }
    for statuses in by_target.values_mut() {
        statuses.sort();
    }
    let expected: std::collections::BTreeMap<String, Vec<String>> = [
        (note, vec!["blocked".to_owned(), "success".to_owned()]),
        (unit, vec!["blocked".to_owned()]),
        // Paths that name no place in a root keep the string as given.
        ("../escape.txt".to_owned(), vec!["blocked".to_owned()]),
        ("/elsewhere/f.txt".to_owned(), vec!["blocked".to_owned()]),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_target, expected);
}

#[test]
fn chmod_description_blocks_the_action() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "generate_script", "path": "a.sh", "content": "echo", "description": "then chmod +x it"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("chmod_forbidden"));
    assert!(!w.path("a.sh").exists());
}

#[test]
fn mid_run_failure_rolls_back_earlier_actions() {
    let w = World::new();
    w.write("keep.txt", b"original");
    let before = w.tree();
    let sb = w.sandbox();
    sb.failpoints().arm("before_mutate", 3);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_fail", "actions": [
        {"intent": "replace_file", "path": "keep.txt", "content": "changed"},
        {"intent": "create_file", "path": "new/dir/a.txt", "content": "a"},
        {"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "rolled_back");
    assert_eq!(r.state.as_str(), "rolled_back");
    assert_eq!(action_status(&r, 0), "rolled_back");
    assert_eq!(action_status(&r, 1), "rolled_back");
    assert_eq!(action_status(&r, 2), "failed");
    assert_eq!(code(&r, 2).as_deref(), Some("io_error"));
    assert_eq!(w.tree(), before, "tree restored byte for byte");
    assert!(sb.audit_verify().unwrap().ok);
    // The two earlier actions, and the failed action's own immediate restore.
    assert_eq!(sb.audit_stats().unwrap().rolled_back, 3);
    // In the trail's order: the failed action's undo comes before its `failed` line,
    // which says how that undo went; the plan's rollback follows, newest first.
    let mut lines = sb.audit_entries(100, Some("wf_fail")).unwrap();
    lines.sort_by_key(|e| e.seq);
    let told: Vec<_> = lines
        .iter()
        .map(|e| {
            let i = r.actions.iter().position(|a| a.action_id == e.action_id);
            format!("{}:{}", i.unwrap() + 1, json!(e.status).as_str().unwrap())
        })
        .collect();
    assert_eq!(
        told,
        [
            "1:success",
            "2:success",
            "3:rolled_back",
            "3:failed",
            "2:rolled_back",
            "1:rolled_back"
        ]
    );
}

#[test]
fn on_failure_stop_leaves_earlier_actions_and_allows_later_rollback() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    sb.failpoints().arm("before_registry", 2);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_stop", "on_failure": "stop", "actions": [
        {"intent": "create_file", "path": "one.txt", "content": "1"},
        {"intent": "create_file", "path": "two.txt", "content": "2"},
        {"intent": "create_file", "path": "three.txt", "content": "3"}]}),
    );
    assert_eq!(status(&r), "failed");
    assert_eq!(r.state.as_str(), "failed");
    assert_eq!(w.read("one.txt"), b"1");
    assert!(
        !w.path("two.txt").exists(),
        "the failed action undid itself"
    );
    assert_eq!(action_status(&r, 2), "skipped");
    let rb = sb.rollback_workflow("wf_stop", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), before);
}

#[test]
fn failure_at_every_pipeline_point_leaves_tree_unchanged() {
    for point in [
        "snapshot_synced",
        "after_snapshot",
        "before_mutate",
        "after_mutate",
        "before_registry",
        "before_audit",
    ] {
        let w = World::new();
        w.write("f.txt", b"v1");
        let before = w.tree();
        let sb = w.sandbox();
        sb.failpoints().arm(point, 1);
        let r = run(
            &sb,
            json!({"workflow_id": "wf_p", "actions": [{"intent": "replace_file", "path": "f.txt", "content": "v2"}]}),
        );
        assert_ne!(status(&r), "success", "{point}");
        assert_eq!(w.tree(), before, "{point}");
        // A snapshot that could not be taken leaves no folder of its workflow (a full
        // disk would otherwise get one more empty folder at each try).
        if point == "snapshot_synced" {
            assert!(!w.path(".rollback/wf_p").exists(), "{point}");
        }
        assert!(sb.audit_verify().unwrap().ok, "{point}");
        assert_eq!(
            sb.registry().len().unwrap(),
            if point == "before_audit" { 1 } else { 0 },
            "{point}"
        );
    }
}

/// A snapshot whose syncs fail (an I/O error from the disk) is removed with the
/// action's failure: left behind, it stood for a write that never happened, so a later
/// rollback of the workflow expected that write's result (`conflict`) and, forced, put
/// back a file the original tree never had.
#[test]
fn a_snapshot_that_could_not_be_synced_is_not_left_behind() {
    for force in [false, true] {
        let w = World::new();
        let before = w.tree();
        let sb = w.sandbox();
        sb.failpoints().arm("snapshot_synced", 2);
        let r = run(
            &sb,
            json!({"workflow_id": "wf_s", "on_failure": "rollback", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "new.txt", "content": "new file\n"},
                {"action_id": "a2", "intent": "sandbox_transform", "path": "new.txt",
                 "edits": [{"old": "new", "new": "NEW"}]}]}),
        );
        assert_eq!(status(&r), "rolled_back", "{r:?}");
        assert_eq!(w.tree(), before);
        assert!(!w.path(".rollback/wf_s/a2").exists());
        let rb = sb.rollback_workflow(
            "wf_s",
            &ailab_sandbox_core::sandbox::RollbackOptions {
                force,
                ..Default::default()
            },
        );
        assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
        assert_eq!(w.tree(), before, "force {force}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

#[test]
fn budget_allows_100_artifacts_and_refuses_the_101st() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.writes_per_minute = 1000;
    let sb = w.open(c);
    let actions: Vec<_> = (0..100)
        .map(|i| json!({"intent": "create_file", "path": format!("f/{i}.txt"), "content": "x"}))
        .collect();
    let r = run(&sb, json!({"workflow_id": "wf_budget", "actions": actions}));
    assert_eq!(status(&r), "success");
    assert_eq!(sb.registry().count_by_workflow("wf_budget").unwrap(), 100);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_budget", "actions": [{"intent": "create_file", "path": "f/100.txt", "content": "x"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("budget_artifacts_exceeded"));
    assert!(!w.path("f/100.txt").exists());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_other", "actions": [{"intent": "create_file", "path": "f/100.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success", "budgets are per workflow");
}

#[test]
fn byte_budget_counts_the_bytes_each_write_adds() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.max_workflow_bytes = 10;
    let sb = w.open(c);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "a.txt", "content": "123456"}]}),
    );
    assert_eq!(status(&r), "success");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "b.txt", "content": "12345"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("budget_bytes_exceeded"));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "b.txt", "content": "1234"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(sb.registry().total_bytes_by_workflow("wf_b").unwrap(), 10);
}

#[test]
fn budgets_survive_a_restart() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.max_artifacts_per_workflow = 2;
    {
        let sb = w.open(c.clone());
        let r = run(
            &sb,
            json!({"workflow_id": "wf_r", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "a"},
            {"intent": "create_file", "path": "b.txt", "content": "b"}]}),
        );
        assert_eq!(status(&r), "success");
    }
    let sb = w.open(c);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [{"intent": "create_file", "path": "c.txt", "content": "c"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("budget_artifacts_exceeded"));
}

#[test]
fn rate_limit_allows_a_burst_of_ten_then_one_every_six_seconds() {
    let w = World::new();
    let sb = w.sandbox();
    let plan = |i: usize| json!({"workflow_id": "wf_rate", "actions": [{"intent": "create_file", "path": format!("r{i}.txt"), "content": "x"}]});
    for i in 0..10 {
        assert_eq!(status(&run(&sb, plan(i))), "success", "write {i}");
    }
    let r = run(&sb, plan(10));
    assert_eq!(code(&r, 0).as_deref(), Some("rate_limited"));
    assert!(
        r.actions[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("6.0 seconds"),
        "{:?}",
        r.actions[0].reason
    );
    w.clock.advance(chrono::Duration::seconds(5));
    assert_eq!(
        code(&run(&sb, plan(10)), 0).as_deref(),
        Some("rate_limited")
    );
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(status(&run(&sb, plan(10))), "success");
    assert_eq!(
        code(&run(&sb, plan(11)), 0).as_deref(),
        Some("rate_limited")
    );
    let other = json!({"workflow_id": "wf_rate_other", "actions": [{"intent": "create_file", "path": "o.txt", "content": "x"}]});
    assert_eq!(
        status(&run(&sb, other)),
        "success",
        "the limit is per workflow"
    );
}

/// The wait a rate-limited plan is told is for all of its writes: trying again after the
/// longest one lets the whole plan through, and a plan larger than the burst is refused
/// as such, whatever was written before it.
#[test]
fn a_rate_limited_plans_wait_covers_all_its_writes() {
    let w = World::new();
    let sb = w.sandbox();
    let plan = |tag: &str, n: usize| {
        let actions: Vec<_> = (0..n)
            .map(|i| json!({"intent": "create_file", "path": format!("{tag}{i}.txt"), "content": "x"}))
            .collect();
        json!({"workflow_id": "wf_wait", "actions": actions})
    };
    assert_eq!(status(&run(&sb, plan("a", 10))), "success");
    let r = run(&sb, plan("b", 3));
    assert_eq!(status(&r), "blocked");
    let waits: Vec<_> = r.actions.iter().map(|a| a.retry_after_seconds).collect();
    assert_eq!(waits, [Some(6), Some(12), Some(18)], "{:?}", r.actions);
    w.clock.advance(chrono::Duration::seconds(17));
    assert_eq!(status(&run(&sb, plan("b", 3))), "blocked", "too early");
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(status(&run(&sb, plan("b", 3))), "success");

    let r = run(&sb, plan("c", 12));
    assert_eq!(status(&r), "blocked");
    // Every action past the burst names the plan's size, what it is to be split by.
    for past in &r.actions[10..] {
        assert_eq!(past.reason_code, Some(ReasonCode::RateLimited));
        assert_eq!(past.retry_after_seconds, None, "no wait makes it pass");
        assert!(
            past.reason
                .as_deref()
                .unwrap()
                .contains("the plan needs 12 writes"),
            "{:?}",
            past.reason
        );
    }
    // A bucket partly refilled (5 tokens): the actions it has tokens for pass, and each
    // one refused says to split the plan, with no wait (it quoted one that never came).
    w.clock.advance(chrono::Duration::seconds(30));
    let r = run(&sb, plan("d", 11));
    assert_eq!(status(&r), "blocked");
    let refused: Vec<_> = r
        .actions
        .iter()
        .filter(|a| a.reason_code == Some(ReasonCode::RateLimited))
        .collect();
    assert_eq!(refused.len(), 6, "{:?}", r.actions);
    for a in refused {
        assert_eq!(a.retry_after_seconds, None, "{a:?}");
        assert!(
            a.reason
                .as_deref()
                .is_some_and(|r| r.contains("the plan needs 11 writes")),
            "{a:?}"
        );
    }
}

/// An action a limit alone refuses is still judged to leave its file: the actions after it
/// are told what is true of the plan, so a plan that is only throttled is told of the wait
/// alone (and runs once it is over), and one that cannot run is told why now.
#[test]
fn actions_after_a_limited_one_are_judged_on_the_tree_it_would_leave() {
    let w = World::new();
    let sb = w.sandbox();
    let burst: Vec<_> = (0..10)
        .map(|i| json!({"intent": "create_file", "path": format!("a{i}.txt"), "content": "x"}))
        .collect();
    let r = run(&sb, json!({"workflow_id": "wf_tree", "actions": burst}));
    assert_eq!(status(&r), "success");
    let codes = |r: &ailab_sandbox_core::RunResult| -> Vec<Option<String>> {
        (0..r.actions.len()).map(|i| code(r, i)).collect()
    };
    let throttled = json!({"workflow_id": "wf_tree", "actions": [
        {"intent": "create_file", "path": "new/y.txt", "content": "x"},
        {"intent": "replace_file", "path": "new/y.txt", "content": "yy"},
        {"intent": "sandbox_transform", "path": "new/y.txt", "edits": [{"old": "yy", "new": "zz"}]}]});
    let r = run(&sb, throttled.clone());
    assert_eq!(
        codes(&r),
        vec![Some("rate_limited".to_owned()); 3],
        "{:?}",
        r.actions
    );
    let broken = json!({"workflow_id": "wf_tree", "actions": [
        {"intent": "create_file", "path": "q.txt", "content": "x"},
        {"intent": "create_file", "path": "q.txt", "content": "y"}]});
    let r = run(&sb, broken);
    assert_eq!(
        codes(&r),
        vec![
            Some("rate_limited".to_owned()),
            Some("already_exists".to_owned())
        ],
        "{:?}",
        r.actions
    );
    w.clock.advance(chrono::Duration::seconds(18));
    assert_eq!(status(&run(&sb, throttled)), "success");
    assert_eq!(w.read("new/y.txt"), b"zz");

    // The same for the budget.
    let mut c = w.writable_config();
    c.limits.max_artifacts_per_workflow = 1;
    drop(sb);
    let sb = w.open(c);
    let over = json!({"workflow_id": "wf_full", "actions": [
        {"intent": "create_file", "path": "b/one.txt", "content": "1"},
        {"intent": "create_file", "path": "b/two.txt", "content": "2"},
        {"intent": "append_file", "path": "b/two.txt", "content": "3"}]});
    let r = run(&sb, over);
    assert_eq!(
        codes(&r),
        [
            None,
            Some("budget_artifacts_exceeded".to_owned()),
            Some("budget_artifacts_exceeded".to_owned())
        ],
        "{:?}",
        r.actions
    );
}

/// A plan over both the rate limit and the artifact budget is told of the budget too: the
/// writes the rate limit holds back would take the budget's room once sent again.
#[test]
fn a_plan_over_the_rate_limit_and_the_budget_is_told_of_both() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.max_artifacts_per_workflow = 15;
    let sb = w.open(c);
    let actions: Vec<_> = (0..20)
        .map(|i| json!({"intent": "create_file", "path": format!("f{i}.txt"), "content": "x"}))
        .collect();
    let r = run(&sb, json!({"workflow_id": "wf_both", "actions": actions}));
    assert_eq!(status(&r), "blocked");
    let codes: Vec<_> = r.actions.iter().map(|a| a.reason_code).collect();
    assert_eq!(codes[..10], [None; 10], "{:?}", r.actions);
    assert_eq!(codes[10..15], [Some(ReasonCode::RateLimited); 5]);
    assert_eq!(codes[15..], [Some(ReasonCode::BudgetArtifactsExceeded); 5]);
    let reason = r.actions[15].reason.as_deref().unwrap();
    assert!(
        reason.contains("earlier actions of this plan add 15 more"),
        "{reason}"
    );
    assert!(!w.path("f0.txt").exists(), "a blocked plan writes nothing");
}

/// The clock set back after writes: they count as made one interval before the first
/// look that found them ahead, so the bucket holds what they left and one token more
/// (ten writes after one are allowed, not nine), and a refusal's wait is honest:
/// waiting it out lets the write through, however far the clock went back.
#[test]
fn rate_limit_after_the_clock_is_set_back() {
    let w = World::new();
    let sb = w.sandbox();
    let plan = |i: usize| json!({"workflow_id": "wf_back", "actions": [{"intent": "create_file", "path": format!("b{i}.txt"), "content": "x"}]});
    assert_eq!(status(&run(&sb, plan(0))), "success");
    w.clock.advance(chrono::Duration::hours(-1));
    for i in 1..11 {
        assert_eq!(status(&run(&sb, plan(i))), "success", "write {i}");
    }
    let r = run(&sb, plan(11));
    assert_eq!(code(&r, 0).as_deref(), Some("rate_limited"), "{r:?}");
    let wait = r.actions[0].retry_after_seconds.unwrap();
    assert!(wait <= 6, "{wait}");
    w.clock
        .advance(chrono::Duration::seconds(i64::try_from(wait).unwrap()));
    assert_eq!(status(&run(&sb, plan(11))), "success");
}

/// Writes made while the clock was a day ahead, then set right. A process that cannot
/// know when they were made (a new one, as each CLI command is) takes them as made one
/// interval before its first look: one write goes at once, where it stayed refused,
/// with the same quoted wait, until the clock caught up. And the refill that look
/// counts stands once a write is made: a plan of two told to wait runs whole after the
/// wait (its second write was refused, the first write's line taken as the bucket's
/// new start).
#[test]
fn rate_limit_after_writes_made_with_the_clock_ahead() {
    let w = World::new();
    let writes = |wf: &str, n: usize, at: &str| {
        let actions: Vec<_> = (0..n)
            .map(|i| json!({"intent": "create_file", "path": format!("{wf}-{at}{i}.txt"), "content": "x"}))
            .collect();
        json!({"workflow_id": wf, "actions": actions})
    };
    {
        let sb = w.sandbox();
        w.clock.advance(chrono::Duration::days(1));
        for wf in ["wf_one", "wf_two"] {
            let r = run(&sb, writes(wf, 10, "ahead"));
            assert_eq!(status(&r), "success", "{r:?}");
        }
    }
    w.clock.advance(chrono::Duration::days(-1));
    let sb = w.sandbox();
    let r = run(&sb, writes("wf_one", 1, "now"));
    assert_eq!(status(&r), "success", "{r:?}");
    let r = run(&sb, writes("wf_two", 2, "now"));
    assert_eq!(code(&r, 1).as_deref(), Some("rate_limited"), "{r:?}");
    let wait = r.actions[1].retry_after_seconds.unwrap();
    assert!(wait <= 6, "{wait}");
    w.clock
        .advance(chrono::Duration::seconds(i64::try_from(wait).unwrap()));
    let r = run(&sb, writes("wf_two", 2, "later"));
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("wf_two-later1.txt"), b"x");
}

/// After writes dated ahead, a plan refused with a wait by one process (a CLI command)
/// goes through in the next once that wait is over: the next counts the refill from the
/// refused plan's lines, not from its own first look, which told it the same wait again.
#[test]
fn a_wait_told_after_writes_dated_ahead_is_honoured_by_the_next_process() {
    let w = World::new();
    let writes = |n: usize, at: &str| {
        let actions: Vec<_> = (0..n)
            .map(|i| json!({"intent": "create_file", "path": format!("{at}{i}.txt"), "content": "x"}))
            .collect();
        json!({"workflow_id": "wf_ahead", "actions": actions})
    };
    w.clock.advance(chrono::Duration::days(1));
    let r = run(&w.sandbox(), writes(10, "ahead"));
    assert_eq!(status(&r), "success", "{r:?}");
    w.clock.advance(chrono::Duration::days(-1));
    let r = run(&w.sandbox(), writes(2, "now"));
    assert_eq!(code(&r, 1).as_deref(), Some("rate_limited"), "{r:?}");
    let wait = r.actions[1].retry_after_seconds.unwrap();
    // Tried again and again meanwhile (more lines than are read back at once): the
    // wait counts from the first refusal, not the last ones.
    let sb = w.sandbox();
    for _ in 0..100 {
        w.clock.advance(chrono::Duration::milliseconds(40));
        assert_eq!(status(&run(&sb, writes(2, "now"))), "blocked");
    }
    drop(sb);
    w.clock.advance(chrono::Duration::milliseconds(
        i64::try_from(wait).unwrap() * 1000 - 4000,
    ));
    let r = run(&w.sandbox(), writes(2, "later"));
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("later1.txt"), b"x");
}

#[test]
fn rate_limit_holds_across_a_restart() {
    let w = World::new();
    {
        let sb = w.sandbox();
        let actions: Vec<_> = (0..8)
            .map(|i| json!({"intent": "create_file", "path": format!("a{i}.txt"), "content": "x"}))
            .collect();
        assert_eq!(
            status(&run(
                &sb,
                json!({"workflow_id": "wf_rr", "actions": actions})
            )),
            "success"
        );
    }
    let sb = w.sandbox();
    let actions: Vec<_> = (0..3)
        .map(|i| json!({"intent": "create_file", "path": format!("b{i}.txt"), "content": "x"}))
        .collect();
    let r = run(&sb, json!({"workflow_id": "wf_rr", "actions": actions}));
    assert_eq!(status(&r), "blocked");
    assert!(
        r.actions
            .iter()
            .any(|a| a.reason_code == Some(ReasonCode::RateLimited))
    );
    assert!(!w.path("b0.txt").exists());
}

#[test]
fn plan_larger_than_the_burst_is_refused_with_advice() {
    let w = World::new();
    let sb = w.sandbox();
    let actions: Vec<_> = (0..11)
        .map(|i| json!({"intent": "create_file", "path": format!("a{i}.txt"), "content": "x"}))
        .collect();
    let r = run(&sb, json!({"actions": actions}));
    assert_eq!(status(&r), "blocked");
    assert_eq!(code(&r, 10).as_deref(), Some("rate_limited"));
    assert!(w.tree().is_empty());
}

#[test]
fn unknown_fields_are_invalid_plan() {
    let w = World::new();
    let sb = w.sandbox();
    let err = sb
        .run_plan_json(br#"{"actions": [], "extra": 1}"#)
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(err.reason.contains("extra"), "{}", err.reason);
    let err = sb.run_plan_json(br#"{"actions": [{"intent": "create_file", "path": "a.txt", "content": "x", "mode": 493}]}"#).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(err.reason.contains("mode"), "{}", err.reason);
    let err = sb
        .run_plan_json(br#"{"actions": [{"intent": 5, "path": "a.txt"}]}"#)
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    let err = sb.run_plan_json(b"not json").unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    // A tool's name past 1 KiB (governance reads every word of it).
    let long = json!({"actions": [{"intent": "create_file", "path": "a.txt", "content": "x", "tool": "w ".repeat(600)}]});
    let err = sb.run_plan_json(long.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(err.reason.contains("at most 1024 bytes"), "{}", err.reason);
    let err = sb.run_plan_json(br#"{"actions": []}"#).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(w.tree().is_empty());
}

/// A plan refused unread still leaves on the trail what it readably asked that is
/// forbidden (an intent, a tool, a permission change): a broken sibling does not hide a
/// probe for a shell or a delete. A broken plan that asks for nothing forbidden leaves
/// no line.
#[test]
fn a_plan_refused_unread_still_audits_its_forbidden_actions() {
    let w = World::new();
    let sb = w.sandbox();
    let lines = |sb: &ailab_sandbox_core::Sandbox| sb.audit_entries(100, None).unwrap();
    let err = sb
        .run_plan_json(br#"{"actions": [{"intent": "create_file", "path": "a.txt", "content": "x", "mode": 493}]}"#)
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(lines(&sb).is_empty(), "{:?}", lines(&sb));
    let bom = [
        &b"\xEF\xBB\xBF"[..],
        br#"{"workflow_id": "wf_probe", "actions": [{"intent": "delete_file", "path": "x"}]}"#,
    ]
    .concat();
    let not_utf8 = [
        &br#"{"workflow_id": "wf_probe", "x": ""#[..],
        b"\xFF",
        br#"", "actions": [{"intent": "delete_file", "path": "x"}]}"#,
    ]
    .concat();
    for (plan, code) in [
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "delete_file", "path": "x"}, {"intent": "create_file", "path": "b", "content": "b", "bogus": 1}]}"#,
            "forbidden_intent",
        ),
        (std::str::from_utf8(&bom).unwrap(), "forbidden_intent"),
        (&String::from_utf8_lossy(&not_utf8), "forbidden_intent"),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "create_file", "path": "c", "content": "c", "tool": "bash", "tool": null}]}"#,
            "forbidden_intent",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "create_file", "path": "c", "content": "c", "description": "chmod u+s c", "description": 7}]}"#,
            "chmod_forbidden",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "delete_file", "intent": "create_file", "path": "c", "content": "c"}]}"#,
            "forbidden_intent",
        ),
        (
            &format!(
                r#"{{"workflow_id": "wf_probe", "actions": [{{"path": "c", {} "intent": "delete_file"}}]}}"#,
                r#""intent": "create_file","#.repeat(9)
            ),
            "forbidden_intent",
        ),
        (
            &format!(
                r#"{{"workflow_id": "wf_probe", "actions": [{{"intent": "create_file", "path": "c", "content": "c", "tool": "{}bash"}}]}}"#,
                "notes ".repeat(400)
            ),
            "forbidden_intent",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "create_file", "path": "c", "content": "c", "tool": "bash"}, {"action_id": "../x", "intent": "create_file", "path": "d", "content": "d"}]}"#,
            "forbidden_intent",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "create_file", "path": "e", "content": "e", "description": "then chmod +x it"}, {"intent": "create_file", "path": "f", "data": 1e400}]}"#,
            "chmod_forbidden",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [5, "junk", {"intent": "run_command", "path": 5, "description": [1]}]}"#,
            "forbidden_intent",
        ),
        (
            r#"{"workflow_id": "wf_probe", "actions": [{"intent": "create_file", "path": "g", "content": "g"}], "actions": [{"intent": "delete_file", "path": "h"}, {"deep": [[[[1e400]]]]}]}"#,
            "forbidden_intent",
        ),
    ] {
        let before = lines(&sb).len();
        let bytes = if plan.contains('\u{fffd}') {
            not_utf8.clone()
        } else {
            plan.as_bytes().to_vec()
        };
        let err = sb.run_plan_json(&bytes).unwrap_err();
        assert!(
            matches!(
                err.reason_code,
                ReasonCode::InvalidPlan | ReasonCode::InvalidId
            ),
            "{err:?}"
        );
        let new = lines(&sb);
        assert_eq!(new.len(), before + 1, "{plan}: {new:?}");
        let line = new.iter().max_by_key(|e| e.seq).unwrap();
        assert_eq!(line.workflow_id, "wf_probe");
        assert_eq!(line.status, ailab_sandbox_core::audit::AuditStatus::Blocked);
        assert_eq!(line.reason_code.map(|c| c.as_str()), Some(code), "{line:?}");
    }
    // A probe among the first thousand elements (as many as a plan holds) is found
    // however many follow; a workflow id that is not a string leaves the probe in a
    // workflow of its own.
    let mut many: Vec<serde_json::Value> = vec![json!({}); 1500];
    many[999] = json!({"intent": "delete_file", "path": "z"});
    let text = json!({"workflow_id": 7, "actions": many}).to_string();
    let before = lines(&sb).len();
    assert!(sb.run_plan_json(text.as_bytes()).is_err());
    let new = lines(&sb);
    assert_eq!(new.len(), before + 1);
    let line = new.iter().max_by_key(|e| e.seq).unwrap();
    assert_eq!(line.mutation_type, "delete_file");
    assert_ne!(line.workflow_id, "wf_probe");
    // The latest list given under the key is judged first, then the first, a thousand
    // elements in all; a workflow id given twice is no plan's own.
    let padded: Vec<serde_json::Value> = vec![json!({"intent": "create_file"}); 1000];
    let list = serde_json::to_string(&padded).unwrap();
    let text = format!(
        r#"{{"workflow_id": "wf_probe", "workflow_id": "wf_other", "actions": {list}, "actions": [{{"intent": "delete_file", "path": "y"}}]}}"#
    );
    let before = lines(&sb).len();
    assert!(sb.run_plan_json(text.as_bytes()).is_err());
    let new = lines(&sb);
    assert_eq!(new.len(), before + 1, "{new:?}");
    let line = new.iter().max_by_key(|e| e.seq).unwrap();
    assert!(line.target_path.ends_with('y'), "{line:?}");
    assert!(!["wf_probe", "wf_other"].contains(&line.workflow_id.as_str()));
    // And the first list, judged as well when the latest is full.
    let text =
        format!(r#"{{"actions": [{{"intent": "delete_file", "path": "v"}}], "actions": {list}}}"#);
    let before = lines(&sb).len();
    assert!(sb.run_plan_json(text.as_bytes()).is_err());
    let new = lines(&sb);
    assert_eq!(new.len(), before + 1, "{new:?}");
    assert!(
        new.iter()
            .max_by_key(|e| e.seq)
            .unwrap()
            .target_path
            .ends_with('v')
    );
    assert!(w.tree().is_empty());
}

/// Edits cost a scan of their file each: a plan may hold 256 in all, whether in one
/// action or spread over several; one more is refused before any file is read.
#[test]
fn a_plan_holds_at_most_256_edits() {
    let w = World::new();
    w.write("t.md", b"x");
    let sb = w.sandbox();
    let edits = |n: usize| -> Vec<serde_json::Value> {
        (0..n)
            .map(|i| json!({"old": if i % 2 == 0 { "x" } else { "y" }, "new": if i % 2 == 0 { "y" } else { "x" }}))
            .collect()
    };
    let spread = json!({"workflow_id": "wf_ed", "actions": [
        {"action_id": "a1", "intent": "sandbox_transform", "path": "t.md", "edits": edits(128)},
        {"action_id": "a2", "intent": "sandbox_transform", "path": "t.md", "edits": edits(129)}]});
    let err = sb
        .run_plan_json(&serde_json::to_vec(&spread).unwrap())
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(err.reason.contains("more than 256 edits"), "{}", err.reason);
    let fits = json!({"workflow_id": "wf_ed", "actions": [
        {"action_id": "a1", "intent": "sandbox_transform", "path": "t.md", "edits": edits(256)}]});
    let r = sb
        .run_plan_json(&serde_json::to_vec(&fits).unwrap())
        .unwrap();
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    assert_eq!(w.read("t.md"), b"x", "256 flips leave it as it was");
}

#[test]
fn bad_ids_are_invalid_id() {
    let w = World::new();
    let sb = w.sandbox();
    for bad in [
        "../x",
        "a/b",
        "",
        ".hidden",
        "-dash",
        "x".repeat(65).as_str(),
        "a b",
        "wf\n1",
    ] {
        let err = sb
            .run_plan(plan(json!({"workflow_id": bad, "actions": [{"intent": "create_file", "path": "a.txt", "content": "x"}]})))
            .unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::InvalidId,
            "workflow_id {bad:?}"
        );
        let err = sb
            .run_plan(plan(json!({"actions": [{"action_id": bad, "intent": "create_file", "path": "a.txt", "content": "x"}]})))
            .unwrap_err();
        assert_eq!(err.reason_code, ReasonCode::InvalidId, "action_id {bad:?}");
        let err = sb
            .run_plan(plan(json!({"actions": [{"intent": "create_file", "path": "a.txt", "content": "x", "parent_artifact_id": bad}]})))
            .unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::InvalidId,
            "parent_artifact_id {bad:?}"
        );
    }
    assert!(w.tree().is_empty());
    assert!(!w.root.join(".rollback").join("..").join("x").exists());
}

#[test]
fn duplicate_action_ids_are_refused() {
    let w = World::new();
    let sb = w.sandbox();
    let err = sb
        .run_plan(plan(json!({"actions": [
            {"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "x"},
            {"action_id": "a1", "intent": "create_file", "path": "b.txt", "content": "x"}]})))
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_dup", "actions": [{"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_dup", "actions": [{"action_id": "a1", "intent": "create_file", "path": "b.txt", "content": "x"}]}),
    );
    assert_eq!(
        code(&r, 0).as_deref(),
        Some("invalid_id"),
        "an action id is never reused within a workflow"
    );
}

#[test]
fn generated_ids_are_valid_and_unique() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [
        {"intent": "create_file", "path": "a.txt", "content": "x"},
        {"intent": "create_file", "path": "b.txt", "content": "x"}]}),
    );
    assert!(ailab_sandbox_core::plan::is_valid_id(&r.workflow_id));
    assert!(ailab_sandbox_core::plan::is_valid_id(
        &r.actions[0].action_id
    ));
    assert_ne!(r.actions[0].action_id, r.actions[1].action_id);
}

#[test]
fn concurrent_plans_on_one_workflow_never_overshoot_the_budget() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.max_artifacts_per_workflow = 10;
    c.limits.writes_per_minute = 1000;
    let sb = std::sync::Arc::new(w.open(c));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let sb = sb.clone();
            std::thread::spawn(move || {
                let actions: Vec<_> = (0..3).map(|i| json!({"intent": "create_file", "path": format!("t{t}/{i}.txt"), "content": "x"})).collect();
                sb.run_plan(plan(json!({"workflow_id": "wf_conc", "actions": actions}))).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_success()).count();
    assert_eq!(ok, 3, "three plans of three fit in ten");
    assert_eq!(sb.registry().count_by_workflow("wf_conc").unwrap(), 9);
    let files = w.tree().values().filter(|v| v.is_some()).count();
    assert_eq!(files, 9);
    assert!(sb.audit_verify().unwrap().ok);
}

/// An action's status is named alike in the run result and the metrics' `result`.
#[test]
fn action_statuses_are_named_as_the_run_result_names_them() {
    use ailab_sandbox_core::executor::ActionStatus as S;
    for s in [
        S::Success,
        S::Simulated,
        S::Blocked,
        S::Skipped,
        S::Failed,
        S::RolledBack,
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
}

#[test]
fn metrics_expose_the_seven_names() {
    let w = World::new();
    let sb = w.sandbox();
    // Alerts use increase(): the series they watch exist at 0 before the first event.
    let fresh = sb.metrics().encode();
    // OpenMetrics HELP text allows a quote or backslash only escaped: strict parsers
    // refuse the exposition otherwise.
    for help in fresh.lines().filter(|l| l.starts_with("# HELP")) {
        assert!(!help.contains(['"', '\\']), "{help}");
    }
    for name in [
        "ailab_sandbox_escape_attempts_total{detection_method=\"path_traversal\"} 0",
        "ailab_sandbox_escape_attempts_total{detection_method=\"symlink_escape\"} 0",
        "ailab_sandbox_escape_attempts_total{detection_method=\"outside_sandbox\"} 0",
        "ailab_sandbox_rollbacks_total{reason=\"manual\"} 0",
        "ailab_sandbox_rollbacks_total{reason=\"workflow_failed\"} 0",
    ] {
        assert!(fresh.contains(name), "missing {name} in\n{fresh}");
    }
    run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "x"},
            {"intent": "create_file", "path": "c.txt", "content": "x"}]}),
    );
    run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "../b.txt", "content": "x"}]}),
    );
    // Denied intents keep their names when they are the spec's forbidden ones; anything
    // else is `other`, so that callers cannot grow the label set.
    run(
        &sb,
        json!({"actions": [{"intent": "run_command", "path": "r.txt", "content": "x"}]}),
    );
    run(
        &sb,
        json!({"actions": [{"intent": "frobnicate_42", "path": "r.txt", "content": "x"}]}),
    );
    sb.rollback_workflow("wf_m", &Default::default());
    // A write that fails is a failure, not a denial.
    sb.failpoints().arm("after_mutate", 1);
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "f.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
    // Nor is a plan the state directory could not take (a full disk, say): nothing
    // written, but no policy refused it.
    sb.failpoints().arm("after_validate", 1);
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "g.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(r.actions[0].reason_code, Some(ReasonCode::IoError), "{r:?}");
    // Nor is it said to be governance's.
    assert_eq!(r.dry_run_reason, None, "{r:?}");
    let text = sb.metrics().encode();
    assert!(!text.contains("frobnicate"), "{text}");
    assert!(!text.contains("reason=\"io_error\""), "{text}");
    for name in [
        "ailab_sandbox_policy_denied_total{intent=\"run_command\",reason=\"forbidden_intent\"} 1",
        "ailab_sandbox_policy_denied_total{intent=\"other\",reason=\"not_sandbox_write\"} 1",
        "ailab_sandbox_mutations_total{type=\"create_file\",result=\"success\"} 2",
        "ailab_sandbox_mutations_total{type=\"create_file\",result=\"failed\"} 1",
        "ailab_sandbox_rollbacks_total{reason=\"manual\"} 1",
        "ailab_sandbox_mutations_total{type=\"create_file\",result=\"rolled_back\"} 3",
        "ailab_sandbox_policy_denied_total{intent=\"create_file\",reason=\"path_traversal\"} 1",
        "# TYPE ailab_sandbox_artifacts_total gauge",
        "ailab_sandbox_artifacts_total 2",
        "ailab_sandbox_escape_attempts_total{detection_method=\"path_traversal\"} 1",
        "ailab_sandbox_checksum_mismatch_total 0",
        "ailab_sandbox_mutation_duration_seconds_count{type=\"create_file\"} 2",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

/// A target written wrongly (an empty path, `//`, `./`, a control character, the root
/// itself, a folder of a root named as the root) is a denial, not an escape attempt: the
/// alert on escapes must not fire on typos. What aims out still counts.
#[test]
fn a_mistyped_path_is_no_escape_attempt() {
    let w = World::new();
    let sb = w.sandbox();
    let root = sb.roots()[0].display().to_string();
    let escapes = |sb: &ailab_sandbox_core::Sandbox| -> u64 {
        sb.metrics()
            .encode()
            .lines()
            .filter(|l| l.starts_with("ailab_sandbox_escape_attempts_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let mistakes = [
        json!({"intent": "create_file", "path": "", "content": "x"}),
        json!({"intent": "create_file", "path": "notes//a.md", "content": "x"}),
        json!({"intent": "create_file", "path": "b.txt/", "content": "x"}),
        json!({"intent": "create_file", "path": "./b.txt", "content": "x"}),
        json!({"intent": "create_file", "path": "x\u{1}.txt", "content": "x"}),
        json!({"intent": "create_file", "path": "a\\b.txt", "content": "x"}),
        json!({"intent": "create_file", "path": "/", "content": "x"}),
        json!({"intent": "create_file", "path": "//", "content": "x"}),
        json!({"intent": "create_file", "path": format!("{root}/notes/"), "content": "x"}),
        json!({"intent": "create_file", "path": format!("{root}//a.txt"), "content": "x"}),
        json!({"intent": "create_file", "path": format!("{root}/./b.txt"), "content": "x"}),
        json!({"intent": "create_directory", "path": format!("{root}/")}),
        json!({"intent": "create_directory", "path": root}),
        json!({"intent": "create_file", "path": "a.txt", "content": "x", "root": format!("{root}/sub")}),
        json!({"intent": "create_file", "path": "a.txt", "content": "x", "root": ""}),
        json!({"intent": "create_file", "path": "a.txt", "content": "x", "root": "sub"}),
    ];
    for action in mistakes {
        let r = run(&sb, json!({"actions": [action]}));
        assert_eq!(status(&r), "blocked", "{action}: {r:?}");
        assert_eq!(escapes(&sb), 0, "{action}");
    }
    for (i, (path, root_hint)) in [
        ("../b.txt", None),
        ("a//../../b.txt", None),
        ("~/b.txt", None),
        ("/etc/passwd", None),
        ("//etc/passwd", None),
        ("/etc//passwd", None),
        (&format!("{root}/../x.txt"), None),
        (&format!("{root}/..\\..\\etc.md"), None),
        ("x\u{0}.txt", None),
        ("passwd", Some("/etc")),
    ]
    .into_iter()
    .enumerate()
    {
        let mut action = json!({"intent": "create_file", "path": path, "content": "x"});
        if let Some(h) = root_hint {
            action["root"] = json!(h);
        }
        run(&sb, json!({"actions": [action]}));
        assert_eq!(escapes(&sb), i as u64 + 1, "{path}");
    }
}

#[test]
fn a_plan_must_be_a_json_object() {
    let w = World::new();
    let sb = w.sandbox();
    let err = sb
        .run_plan_json(
            br#"[null, null, null, [{"intent": "create_file", "path": "a.txt", "content": "x"}]]"#,
        )
        .unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
    assert!(w.tree().is_empty());
}

#[test]
fn chmod_in_the_intent_name_is_chmod_forbidden() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"actions": [{"intent": "chmod_file", "path": "a.sh"}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("chmod_forbidden"));
}

#[test]
fn the_filesystem_root_is_never_a_sandbox_root() {
    let w = World::new();
    let c = ailab_sandbox_core::Config::with_roots(vec!["/".into()], w.state.clone());
    let err = c.validate().unwrap_err();
    assert!(err.0.contains("filesystem root"), "{}", err.0);
    assert!(
        ailab_sandbox_core::confine::SandboxRoot::open(std::path::Path::new("/"), false).is_err()
    );
}

/// A file too large to snapshot, or one an append or a transform could only take past
/// its limit, is refused from its size, up front: nothing of the plan is written.
#[test]
fn oversized_existing_files_are_refused_before_anything_is_written() {
    let w = World::new();
    let sb = w.sandbox();
    let big = |name: &str, len: u64| {
        let f = std::fs::File::create(w.path(name)).unwrap();
        f.set_len(len).unwrap();
    };
    big("huge.txt", 65 * 1024 * 1024);
    big("large.md", 6 * 1024 * 1024);
    big("almost.txt", 1024 * 1024 - 2);
    for (intent, path, extra, needle) in [
        (
            "replace_file",
            "huge.txt",
            json!({"content": "small\n"}),
            "snapshot holds at most",
        ),
        (
            "append_file",
            "almost.txt",
            json!({"content": "abc"}),
            "would leave 1048577 bytes",
        ),
        (
            "sandbox_transform",
            "large.md",
            json!({"edits": [{"old": "a", "new": "b"}]}),
            "would leave 6291456 bytes",
        ),
    ] {
        let mut action = json!({"action_id": "a2", "intent": intent, "path": path});
        for (k, v) in extra.as_object().unwrap() {
            action[k] = v.clone();
        }
        let r = run(
            &sb,
            json!({"workflow_id": "wf_big", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "first.txt", "content": "1"},
                action]}),
        );
        assert_eq!(status(&r), "blocked", "{intent}: {r:?}");
        assert_eq!(code(&r, 1).as_deref(), Some("size_exceeded"), "{intent}");
        let reason = r.actions[1].reason.clone().unwrap_or_default();
        assert!(reason.contains(needle), "{intent}: {reason}");
        assert!(!w.path("first.txt").exists(), "{intent}: nothing written");
    }
    assert_eq!(
        std::fs::metadata(w.path("huge.txt")).unwrap().len(),
        65 * 1024 * 1024
    );

    // So is a file an earlier action of the plan makes: an append past the limit is
    // refused from the sizes, the file's bytes neither hashed nor copied again.
    let report = "r".repeat(5 * 1024 * 1024 - 2);
    let mut actions = vec![json!({"action_id": "r", "intent": "generate_report",
        "path": "made.md", "content": report})];
    for i in 0..3 {
        actions.push(
            json!({"action_id": format!("a{i}"), "intent": "append_file",
            "path": "made.md", "content": "xyz"}),
        );
    }
    let r = run(&sb, json!({"workflow_id": "wf_made", "actions": actions}));
    assert_eq!(status(&r), "blocked", "{r:?}");
    for i in 1..4 {
        assert_eq!(code(&r, i).as_deref(), Some("size_exceeded"), "{i}");
        let reason = r.actions[i].reason.clone().unwrap_or_default();
        assert!(
            reason.contains("append_file would leave 5242881 bytes in 'made.md'"),
            "{i}: {reason}"
        );
    }
    assert!(!w.path("made.md").exists());

    // A transform is judged by the size it would leave: a file over the limit that its
    // edits bring under it is edited.
    let limit = 5 * 1024 * 1024;
    let mut text = "a".repeat(limit + 200 - 1000).into_bytes();
    text.extend_from_slice("X".repeat(1000).as_bytes());
    w.write("shrink.md", &text);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_shrink", "actions": [{"intent": "sandbox_transform", "path": "shrink.md",
            "edits": [{"old": "X".repeat(1000), "new": ""}]}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions[0].reason);
    assert_eq!(
        std::fs::metadata(w.path("shrink.md")).unwrap().len(),
        (limit - 800) as u64
    );
}

/// A simulation reports a file's checksum only when it read the file (within the
/// operation's limit); it never makes one up.
#[test]
fn a_simulation_reports_no_checksum_it_did_not_compute() {
    let w = World::new();
    let sb = w.open(w.config());
    w.write("big.md", &vec![b'b'; 3 * 1024 * 1024 / 2]);
    w.write("small.md", b"small\n");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_sim", "actions": [
            {"intent": "replace_file", "path": "big.md", "content": "new\n"},
            {"intent": "replace_file", "path": "small.md", "content": "new\n"}]}),
    );
    assert_eq!(status(&r), "simulated_success", "{r:?}");
    assert_eq!(r.actions[0].before_checksum, None);
    assert_eq!(
        r.actions[1].before_checksum.as_deref(),
        Some(sha(b"small\n").as_str())
    );
}

/// A root moved away (or removed, or replaced) while the runtime runs: its handle still
/// leads to the moved folder, where writes would land unseen while every record names
/// the configured path. Actions, rollbacks and reads there are refused (`conflict`,
/// naming the root), nothing is written anywhere, and they go on once the folder is back.
#[test]
fn a_root_moved_away_while_the_runtime_runs_takes_no_writes() {
    let w = World::new();
    let sb = w.sandbox();
    let one = |path: &str| {
        json!({"workflow_id": "wf_moved", "actions": [
            {"intent": "create_file", "path": path, "content": "x"}]})
    };
    assert_eq!(status(&run(&sb, one("a.txt"))), "success");
    let aside = w.tmp.path().join("root.old");
    std::fs::rename(&w.root, &aside).unwrap();
    for replaced in [false, true] {
        if replaced {
            std::fs::create_dir(&w.root).unwrap();
        }
        let r = run(&sb, one("b.txt"));
        assert_eq!(status(&r), "blocked", "{r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{r:?}");
        let why = r.actions[0].reason.clone().unwrap_or_default();
        assert!(
            why.contains(&format!(
                "the sandbox root {} is no longer the directory this process opened at start",
                w.root.display()
            )),
            "{why}"
        );
        // Every action into it is named, as validation names each it refuses.
        let two = run(
            &sb,
            json!({"workflow_id": "wf_moved_2", "actions": [
                {"intent": "create_file", "path": "c.txt", "content": "x"},
                {"intent": "create_file", "path": "d.txt", "content": "x"}]}),
        );
        assert_eq!(status(&two), "blocked", "{two:?}");
        for i in 0..2 {
            assert_eq!(code(&two, i).as_deref(), Some("conflict"), "{two:?}");
        }
        let rb = sb.rollback_workflow(
            "wf_moved",
            &ailab_sandbox_core::sandbox::RollbackOptions::default(),
        );
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
        // The preview says the same.
        let info = sb.rollback_info("wf_moved").unwrap();
        assert!(!info.rollback_available, "{info:?}");
        assert_eq!(info.reason_code, Some(ReasonCode::Conflict), "{info:?}");
        assert!(!aside.join("b.txt").exists() && !w.path("b.txt").exists());
        assert!(aside.join("a.txt").exists(), "nothing restored");
        // Nor is the moved folder read as the root's path: what it holds is not there.
        let moved = |r: Result<(), ailab_sandbox_core::Refusal>| {
            let r = r.unwrap_err();
            assert_eq!(r.reason_code, ReasonCode::Conflict, "{r:?}");
            assert!(r.reason.contains("nothing was read"), "{r:?}");
        };
        moved(sb.read_file("a.txt", None).map(drop));
        moved(sb.get_file_info("a.txt", None).map(drop));
        moved(sb.list_directory("", None).map(drop));
        moved(
            sb.list_directory(&w.root.display().to_string(), None)
                .map(drop),
        );
        // The state document lists it among the roots that take no writes, and why.
        let doc = sb.state_doc().unwrap();
        assert!(doc.sandbox_roots.is_empty(), "{doc:?}");
        assert!(
            doc.skipped_roots[0].starts_with(&format!(
                "the sandbox root {} is no longer the directory this process opened",
                w.root.display()
            )),
            "{doc:?}"
        );
    }
    std::fs::remove_dir(&w.root).unwrap();
    std::fs::rename(&aside, &w.root).unwrap();
    let doc = sb.state_doc().unwrap();
    assert_eq!(doc.sandbox_roots, [w.root.display().to_string()], "{doc:?}");
    assert!(doc.skipped_roots.is_empty(), "{doc:?}");
    assert_eq!(status(&run(&sb, one("b.txt"))), "success");
    assert_eq!(w.read("b.txt"), b"x");
    assert_eq!(sb.read_file("b.txt", None).unwrap().content, "x");
}

/// A root removed while the runtime runs takes its snapshots with it: a rollback then
/// names the root no longer there (`conflict`), what to put right, rather than sending
/// the operator after snapshots said to be missing.
#[test]
fn a_rollback_in_a_root_removed_while_the_runtime_runs_names_the_root() {
    let w = World::new();
    let sb = w.sandbox();
    let plan = json!({"workflow_id": "wf_gone", "actions": [
        {"intent": "create_file", "path": "a.txt", "content": "x"}]});
    assert_eq!(status(&run(&sb, plan)), "success");
    std::fs::remove_dir_all(&w.root).unwrap();
    for replaced in [false, true] {
        if replaced {
            std::fs::create_dir(&w.root).unwrap();
        }
        let rb = sb.rollback_workflow(
            "wf_gone",
            &ailab_sandbox_core::sandbox::RollbackOptions::default(),
        );
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
        let why = rb.reason.unwrap_or_default();
        assert!(
            why.contains(&format!(
                "the sandbox root {} is no longer the directory this process opened at start",
                w.root.display()
            )),
            "{why}"
        );
        let info = sb.rollback_info("wf_gone").unwrap();
        assert_eq!(info.reason_code, Some(ReasonCode::Conflict), "{info:?}");
    }
}

/// A folder swapped for a link out of the root while an earlier action of the plan runs:
/// the later action writing into it is refused by the check made again at write time
/// (`failed`, as the plan has written), and counted as an escape attempt and a denial,
/// as the same refusal of a plan's first action is (only the first was counted).
#[test]
fn a_later_action_refused_at_write_time_counts_as_an_escape_attempt() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    std::fs::create_dir_all(w.outside.join("away")).unwrap();
    let sb = w.sandbox();
    let (d, aside, away) = (w.path("d"), w.path("d.aside"), w.outside.join("away"));
    sb.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            std::fs::rename(&d, &aside).unwrap();
            std::os::unix::fs::symlink(&away, &d).unwrap();
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_later", "on_failure": "rollback", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "first.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "d/second.txt", "content": "2"}]}),
    );
    assert_eq!(action_status(&r, 1), "failed", "{r:?}");
    assert_eq!(code(&r, 1).as_deref(), Some("symlink_escape"), "{r:?}");
    assert!(!w.outside.join("away/second.txt").exists());
    let metrics = sb.metrics().encode();
    for line in [
        "ailab_sandbox_escape_attempts_total{detection_method=\"symlink_escape\"} 1",
        "ailab_sandbox_policy_denied_total{intent=\"create_file\",reason=\"symlink_escape\"} 1",
        "ailab_sandbox_mutations_total{type=\"create_file\",result=\"failed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }
}

/// `create_file p/c.md` run under `durability` in a world with `p/keep.txt`, whose `p`
/// is moved to `p.keep` and `stand_in` put in its place just before the write.
fn create_in_p_swapped(
    (durability, point): (ailab_sandbox_core::config::Durability, &str),
    stand_in: fn(&std::path::Path),
) -> (
    World,
    ailab_sandbox_core::Sandbox,
    ailab_sandbox_core::RunResult,
) {
    let w = World::new();
    w.write("p/keep.txt", b"k");
    let mut config = w.writable_config();
    config.durability = durability;
    let sb = w.open(config);
    let (p, kept) = (w.path("p"), w.path("p.keep"));
    sb.failpoints().interleave(
        point,
        std::sync::Arc::new(move || {
            std::fs::rename(&p, &kept).unwrap();
            stand_in(&p);
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_swap", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "p/c.md", "content": "x"}]}),
    );
    (w, sb, r)
}

/// A folder swapped for something that is not a folder while a create runs: the create
/// fails, and its undo cannot see beneath that place (the folder may have moved with the
/// file in it), so the run ends `failed`, its reason naming what stands in the way rather
/// than "something unreadable" at the target.
#[test]
fn a_create_whose_folder_became_a_file_meanwhile_names_what_stands_in_the_way() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict] {
        let (w, sb, r) = create_in_p_swapped((durability, "before_mutate"), |p| {
            std::fs::write(p, b"not a folder").unwrap();
        });
        assert_eq!(action_status(&r, 0), "failed", "{durability:?} {r:?}");
        let reason = r.actions[0].reason.clone().unwrap_or_default();
        assert!(
            reason.contains("nothing that can be reached ('p' is not a directory")
                && !reason.contains("something unreadable"),
            "{durability:?}: {reason}"
        );
        assert_eq!(w.read("p"), b"not a folder");
        assert_eq!(w.read("p.keep/keep.txt"), b"k");
        assert!(!w.path("p.keep/c.md").exists());
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A folder removed and made again (or swapped) between an action's check and its write
/// is not written in: its snapshot records the first, and a file written in the second
/// would be taken for another's by every rollback. The action fails `conflict`, nothing
/// written, in every durability mode: refused by the very walk the write goes through
/// (no look before it leaves a moment between), and under `batched` by its staging's
/// walk, or after it, before the staged bytes are put in place (they are discarded).
#[test]
fn a_folder_made_again_between_the_check_and_the_write_is_not_written_in() {
    use ailab_sandbox_core::config::Durability;
    // Before the staging (`batched` stages right after the snapshot) or before the write.
    for (durability, point) in [Durability::Relaxed, Durability::Batched, Durability::Strict]
        .into_iter()
        .flat_map(|d| [(d, "after_snapshot"), (d, "before_mutate")])
    {
        let (w, sb, r) =
            create_in_p_swapped((durability, point), |p| std::fs::create_dir(p).unwrap());
        assert_eq!(
            action_status(&r, 0),
            "failed",
            "{durability:?} {point} {r:?}"
        );
        assert_eq!(
            r.actions[0].reason_code,
            Some(ReasonCode::Conflict),
            "{r:?}"
        );
        let reason = r.actions[0].reason.clone().unwrap_or_default();
        assert!(
            reason.starts_with(
                "the directory 'p' is not the one there when the action was checked (removed and made again, or swapped, meanwhile); nothing was written"
            ),
            "{durability:?} {point}: {reason}"
        );
        assert!(!w.path("p/c.md").exists(), "{durability:?} {point}");
        assert!(!w.path("p.keep/c.md").exists(), "{durability:?} {point}");
        assert!(temp_files(&w.root).is_empty(), "{durability:?} {point}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// Runs a `create_file` of `path` in each durability mode, the folders `standing` made
/// first, and `gone` (root-relative) removed at `point` by another writer; checks that
/// the action fails `conflict` with `reason` and leaves no temporary file, then hands the
/// world and the result to `then`.
fn create_while_removed(
    (standing, point, gone): (Option<&str>, &'static str, &str),
    path: &str,
    reason: &str,
    then: impl Fn(&World, &ailab_sandbox_core::RunResult),
) {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Batched, Durability::Relaxed, Durability::Strict] {
        let w = World::new();
        if let Some(dir) = standing {
            std::fs::create_dir_all(w.path(dir)).unwrap();
        }
        let mut config = w.writable_config();
        config.durability = durability;
        let sb = w.open(config);
        let gone = w.path(gone);
        sb.failpoints().interleave(
            point,
            std::sync::Arc::new(move || std::fs::remove_dir(&gone).unwrap()),
        );
        let r = run(
            &sb,
            json!({"workflow_id": "wf_gone", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": path, "content": "x"}]}),
        );
        assert_eq!(action_status(&r, 0), "failed", "{durability:?} {r:?}");
        assert_eq!(
            code(&r, 0).as_deref(),
            Some("conflict"),
            "{durability:?} {r:?}"
        );
        assert_eq!(
            r.actions[0].reason.as_deref(),
            Some(reason),
            "{durability:?}"
        );
        then(&w, &r);
        assert!(temp_files(&w.root).is_empty(), "{durability:?}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A folder the check found that is removed before the write (another workflow's
/// rollback taking it away, emptied) is that race, to try again (`conflict`), in every
/// durability mode: `batched`, which stages the new bytes beside the target right after
/// the snapshot, said "does not exist" (`not_found`), blaming the caller's path.
#[test]
fn a_folder_removed_between_the_check_and_the_staging_is_a_conflict() {
    create_while_removed(
        (Some("p/q"), "after_snapshot", "p/q"),
        "p/q/c.md",
        "the directory 'p/q' was removed while the action ran; nothing was written: try again",
        |w, _| assert!(!w.path("p/q").exists(), "nothing is made again"),
    );
}

/// A folder the action made, removed by another writer before the action's file is in
/// it (another workflow's rollback taking it for its own, emptied), is the same race:
/// `conflict` naming what was made, not an I/O error (HTTP 500, which a client would
/// not retry); the undo removes what is left of what the action made.
#[test]
fn a_folder_the_action_made_removed_before_its_file_is_a_conflict() {
    create_while_removed(
        (None, "folders_made", "n/m"),
        "n/m/c.md",
        "'n', 'n/m' were made for it, then: the directory 'n/m' was removed while the action ran; nothing was written: try again",
        |w, r| {
            assert!(!w.path("n").exists(), "what it made is removed");
            // Its change (the folders) was undone, looking at what stands: not said
            // untouched.
            let restored = r.timeline.iter().find(|e| e.event == "action_restored");
            assert_eq!(
                restored.map(|e| e.detail["untouched"].clone()),
                Some(json!(false))
            );
        },
    );
}

/// Another program that changes a file while an action rewrites it (a line appended to
/// a log between the action's read and its rename) keeps its change: the action fails
/// with `conflict` and leaves the file as that program made it, in every durability
/// (`batched` puts its staged bytes in place by the same check).
#[test]
fn a_change_made_while_an_action_runs_is_never_overwritten() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Relaxed, Durability::Strict, Durability::Batched] {
        let w = World::new();
        w.write("log.md", b"one\n");
        let mut config = w.writable_config();
        config.durability = durability;
        let sb = w.open(config);
        sb.failpoints().interleave(
            "before_mutate",
            another_program_appends(w.path("log.md"), b"theirs\n"),
        );
        let r = run(
            &sb,
            json!({"workflow_id": "wf_app", "actions": [
                {"intent": "append_file", "path": "log.md", "content": "mine\n"}]}),
        );
        assert_eq!(action_status(&r, 0), "failed", "{durability:?} {r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{durability:?}");
        assert_eq!(w.read("log.md"), b"one\ntheirs\n", "{durability:?}");
        assert!(sb.artifacts(10, Some("wf_app")).unwrap().is_empty());
        // The timeline says the action never touched its file (a face then does not
        // say its change was undone).
        let restored = r
            .timeline
            .iter()
            .find(|e| e.event == "action_restored")
            .expect("the undo is on the timeline");
        assert_eq!(restored.detail["untouched"], true, "{durability:?}");
        // The trail says the undo left the file as the other program made it.
        let undo = sb
            .audit_entries(10, Some("wf_app"))
            .unwrap()
            .into_iter()
            .find(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
            .expect("the undo is recorded");
        let now = Some(sha(b"one\ntheirs\n"));
        assert_eq!((&undo.before_checksum, &undo.after_checksum), (&now, &now));
        drop(sb);
        // Nothing for a restart to finish or undo either.
        let sb = w.sandbox();
        assert_eq!(w.read("log.md"), b"one\ntheirs\n", "{durability:?}");
        let r = run(
            &sb,
            json!({"workflow_id": "wf_app", "actions": [
                {"intent": "append_file", "path": "log.md", "content": "mine\n"}]}),
        );
        assert_eq!(status(&r), "success", "{durability:?} {r:?}");
        assert_eq!(w.read("log.md"), b"one\ntheirs\nmine\n", "{durability:?}");
    }
}

/// A directory that was there when an action was checked and is removed before it writes
/// (a rollback taking away a directory it had left empty) is not made again behind the
/// snapshot's back: its record would not know to remove it. The action fails with
/// `conflict` and nothing is made.
#[test]
fn a_parent_removed_while_an_action_runs_is_not_made_again_unrecorded() {
    for action in [
        json!({"intent": "create_file", "path": "d/e/x.txt", "content": "x"}),
        json!({"intent": "create_directory", "path": "d/e"}),
        json!({"intent": "create_directory", "path": "d"}),
    ] {
        let w = World::new();
        let sb = w.sandbox();
        std::fs::create_dir(w.path("d")).unwrap();
        let dir = w.path("d");
        sb.failpoints().interleave(
            "before_mutate",
            std::sync::Arc::new(move || std::fs::remove_dir(&dir).unwrap()),
        );
        let r = run(
            &sb,
            json!({ "workflow_id": "wf_gone", "actions": [action] }),
        );
        assert_eq!(action_status(&r, 0), "failed", "{action} {r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{action}");
        assert!(
            r.actions[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("'d' was removed"),
            "{r:?}"
        );
        assert!(w.tree().is_empty(), "{action}: {:?}", w.tree());
    }
}

/// A parent swapped for a symbolic link while an action runs stops the write before any
/// byte lands, outside the root or in it; the action fails with the link named and its
/// undo has nothing to do, so the failure does not say a change may still be in place.
#[test]
fn a_parent_swapped_for_a_link_while_an_action_runs_stops_it_cleanly() {
    use ailab_sandbox_core::config::Durability;
    // (`batched` stages its bytes beside the target before this point: the swap then
    // carries them away with the folder, as a move right after the write would.)
    for (durability, action) in [Durability::Relaxed, Durability::Strict]
        .into_iter()
        .flat_map(|d| {
            [
                json!({"intent": "create_file", "path": "sub/new.txt", "content": "x"}),
                json!({"intent": "replace_file", "path": "sub/old.txt", "content": "new"}),
                json!({"intent": "create_file", "path": "sub/deeper/new.txt", "content": "x"}),
            ]
            .map(|a| (d, a))
        })
    {
        let w = World::new();
        w.write("sub/old.txt", b"old");
        let mut config = w.writable_config();
        config.durability = durability;
        let sb = w.open(config);
        let (sub, aside, outside) = (
            w.path("sub"),
            w.tmp.path().join("sub-aside"),
            w.tmp.path().join("elsewhere"),
        );
        std::fs::create_dir(&outside).unwrap();
        let target = outside.clone();
        sb.failpoints().interleave(
            "before_mutate",
            std::sync::Arc::new(move || {
                std::fs::rename(&sub, &aside).unwrap();
                std::os::unix::fs::symlink(&target, &sub).unwrap();
            }),
        );
        let r = run(
            &sb,
            json!({ "workflow_id": "wf_swap", "actions": [action] }),
        );
        let case = format!("{durability:?} {action}");
        assert_eq!(action_status(&r, 0), "failed", "{case} {r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("symlink_escape"), "{case}");
        let reason = r.actions[0].reason.as_deref().unwrap();
        assert!(
            reason.contains("'sub'") && !reason.contains("undoing its change failed"),
            "{case}: {reason}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "{action}");
        assert_eq!(
            std::fs::read(w.tmp.path().join("sub-aside/old.txt")).unwrap(),
            b"old",
            "{action}"
        );
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// Two sandboxes on one world, as two processes would be: one that holds locks (its
/// failpoints let a test act while it does), and one that waits a second at most.
fn holder_and_impatient_other(
    w: &World,
) -> (
    ailab_sandbox_core::Sandbox,
    std::sync::Arc<ailab_sandbox_core::Sandbox>,
) {
    let mut impatient = w.writable_config();
    impatient.limits.lock_wait_seconds = 1;
    (w.sandbox(), std::sync::Arc::new(w.open(impatient)))
}

/// A write waits for a file another process is writing only so long
/// (`limits.lock_wait_seconds`): a stopped or hung holder gets it refused with
/// `conflict`, naming the file and the setting, rather than stalling its workflow (and
/// every later call of an MCP session) for good. Once the holder is done, it goes through.
#[test]
fn a_write_waits_for_a_busy_file_only_so_long() {
    let w = World::new();
    w.write("same.md", b"one\n");
    let (holder, other) = holder_and_impatient_other(&w);
    let append = |wf: &str, line: &str| {
        json!({"workflow_id": wf, "actions": [
            {"intent": "append_file", "path": "same.md", "content": line}]})
    };
    let refused = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (o, r) = (other.clone(), refused.clone());
    let plan_b = append("wf_b", "two\n");
    holder.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let started = std::time::Instant::now();
            let res = o.run_plan(plan(plan_b.clone())).unwrap();
            *r.lock().unwrap() = Some((res, started.elapsed()));
        }),
    );
    assert_eq!(status(&run(&holder, append("wf_a", "mine\n"))), "success");
    let (res, waited) = refused.lock().unwrap().take().expect("the other write ran");
    assert_eq!(status(&res), "blocked", "{res:?}");
    assert_eq!(code(&res, 0).as_deref(), Some("conflict"));
    let reason = res.actions[0].reason.as_deref().unwrap();
    assert!(
        reason.contains("same.md") && reason.contains("limits.lock_wait_seconds"),
        "{reason}"
    );
    assert!(waited >= std::time::Duration::from_secs(1), "{waited:?}");
    assert_eq!(w.read("same.md"), b"one\nmine\n");
    assert_eq!(status(&run(&other, append("wf_b", "two\n"))), "success");
    assert_eq!(w.read("same.md"), b"one\nmine\ntwo\n");
}

/// A prune keeps a workflow that another process is running at that moment, without
/// waiting for it (a stopped run would otherwise hold up the prune of every workflow),
/// and prunes the others.
#[test]
fn a_prune_keeps_a_running_workflow_without_waiting() {
    let w = World::new();
    let holder = w.sandbox();
    assert_eq!(
        status(&run(
            &holder,
            json!({"workflow_id": "wf_old", "actions": [
        {"intent": "create_file", "path": "old.txt", "content": "o\n"}]})
        )),
        "success"
    );
    w.clock.advance(chrono::Duration::hours(2));
    let pruner = std::sync::Arc::new(w.sandbox());
    let report = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (p, out) = (pruner.clone(), report.clone());
    holder.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let started = std::time::Instant::now();
            let r = p.prune(std::time::Duration::from_secs(3600)).unwrap();
            *out.lock().unwrap() = Some((r, started.elapsed()));
        }),
    );
    assert_eq!(
        status(&run(
            &holder,
            json!({"workflow_id": "wf_running", "actions": [
        {"intent": "create_file", "path": "new.txt", "content": "n\n"}]})
        )),
        "success"
    );
    let (r, elapsed) = report.lock().unwrap().take().unwrap();
    assert_eq!(r.workflows_pruned, ["wf_old"], "{r:?}");
    assert_eq!(r.workflows_kept, 1, "{r:?}");
    assert!(elapsed < std::time::Duration::from_secs(5), "{elapsed:?}");
}

/// Many writers of one process waiting for the same busy file each wait the bound once,
/// together, not one after the other: six queued behind a stopped holder are all refused
/// within about one wait, not six.
#[test]
fn writers_waiting_together_give_up_together() {
    let w = World::new();
    w.write("same.md", b"one\n");
    let (holder, other) = holder_and_impatient_other(&w);
    let waited = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (o, out) = (other.clone(), waited.clone());
    holder.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let started = std::time::Instant::now();
            let threads: Vec<_> = (0..6)
                .map(|i| {
                    let o = o.clone();
                    std::thread::spawn(move || {
                        o.run_plan(plan(json!({"workflow_id": format!("wf_q{i}"), "actions": [
                            {"intent": "append_file", "path": "same.md", "content": "q\n"}]})))
                            .unwrap()
                    })
                })
                .collect();
            let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            *out.lock().unwrap() = Some((results, started.elapsed()));
        }),
    );
    assert_eq!(
        status(&run(
            &holder,
            json!({"workflow_id": "wf_hold", "actions": [
        {"intent": "append_file", "path": "same.md", "content": "mine\n"}]})
        )),
        "success"
    );
    let (results, elapsed) = waited.lock().unwrap().take().unwrap();
    for r in &results {
        assert_eq!(code(r, 0).as_deref(), Some("conflict"), "{r:?}");
    }
    assert!(elapsed < std::time::Duration::from_secs(4), "{elapsed:?}");
    assert_eq!(w.read("same.md"), b"one\nmine\n");
}

/// The same bound holds for a workflow another process is running or rolling back, and
/// for the audit log another process is appending to: a run, a rollback or a read waits
/// at most `limits.lock_wait_seconds`, then is refused, and nothing is half done.
#[test]
fn a_busy_workflow_or_log_is_waited_for_only_so_long() {
    let w = World::new();
    w.write("f.txt", b"base\n");
    let (holder, other) = holder_and_impatient_other(&w);
    let outcomes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (o, out) = (other.clone(), outcomes.clone());
    holder.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let r = o
                .run_plan(plan(json!({"workflow_id": "wf_same", "actions": [
                    {"intent": "create_file", "path": "g.txt", "content": "g\n"}]})))
                .unwrap();
            let rb = o.rollback_workflow("wf_same", &forced());
            out.lock().unwrap().push((r, rb));
        }),
    );
    let r = run(
        &holder,
        json!({"workflow_id": "wf_same", "actions": [
            {"intent": "replace_file", "path": "f.txt", "content": "mine\n"}]}),
    );
    assert_eq!(status(&r), "success");
    let (r, rb) = outcomes.lock().unwrap().pop().expect("the other calls ran");
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"));
    for why in [
        r.actions[0].reason.clone().unwrap(),
        rb.reason.clone().unwrap(),
    ] {
        assert!(
            why.contains("wf_same") && why.contains("limits.lock_wait_seconds"),
            "{why}"
        );
    }
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict)
    );
    assert!(!w.path("g.txt").exists());
    assert_eq!(w.read("f.txt"), b"mine\n");

    // A log of the state directory, locked as another process appending to it would.
    let hold = |name: &str| {
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(w.state.join(name))
            .unwrap();
        f.lock().unwrap();
        f
    };
    // The audit log, held by another process: the write is undone, reads give up.
    let log = hold("sandbox_audit.jsonl");
    let r = run(
        &other,
        json!({"workflow_id": "wf_log", "actions": [
            {"intent": "replace_file", "path": "f.txt", "content": "theirs\n"}]}),
    );
    assert_ne!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("f.txt"), b"mine\n", "undone");
    let why = r.actions[0].reason.as_deref().unwrap_or_default();
    assert!(why.contains("waited 1 s"), "{why}");
    // A busy peer, not a broken disk.
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{r:?}");
    assert!(other.audit_entries(10, None).is_err());
    log.unlock().unwrap();
    assert!(other.audit_verify().unwrap().ok);
    // Right after, an ordinary short hold is waited for, not taken for the stuck one.
    log.lock().unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        log.unlock().unwrap();
    });
    let r = run(
        &other,
        json!({"workflow_id": "wf_log2", "actions": [
            {"intent": "create_file", "path": "g2.txt", "content": "g\n"}]}),
    );
    release.join().unwrap();
    assert_eq!(status(&r), "success", "{r:?}");
    // The registry, held by another process when the artifact is registered: the file
    // written a moment before is removed again, as the answer says.
    let registry = hold("artifacts.jsonl");
    let r = run(
        &other,
        json!({"workflow_id": "wf_reg", "actions": [
            {"intent": "create_file", "path": "y.md", "content": "z\n"}]}),
    );
    registry.unlock().unwrap();
    assert_eq!(code(&r, 0).as_deref(), Some("conflict"), "{r:?}");
    assert!(!w.path("y.md").exists(), "undone: {r:?}");
    assert!(other.audit_verify().unwrap().ok);
    // A rollback that restores while the trail is held says so as a busy peer.
    let log = hold("sandbox_audit.jsonl");
    let rb = other.rollback_workflow(
        "wf_log2",
        &ailab_sandbox_core::sandbox::RollbackOptions::default(),
    );
    log.unlock().unwrap();
    assert!(!w.path("g2.txt").exists(), "restored: {rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict),
        "{rb:?}"
    );
}

/// A root is one root however its path is spelled (`//`, a trailing `/`): its artifacts
/// are recorded under one path, so a later write to a file finds the file's earlier
/// artifact as its parent.
#[test]
fn a_roots_spelling_does_not_break_lineage() {
    let w = World::new();
    let spelled = format!("{}//{}/", w.tmp.path().display(), "root");
    let mut odd = w.writable_config();
    odd.roots = vec![std::path::PathBuf::from(&spelled)];
    let first = run(
        &w.open(odd),
        json!({"workflow_id": "wf_one", "actions": [
            {"intent": "create_file", "path": "f.txt", "content": "one\n"}]}),
    );
    let sb = w.open(w.writable_config());
    let second = run(
        &sb,
        json!({"workflow_id": "wf_two", "actions": [
            {"intent": "replace_file", "path": "f.txt", "content": "two\n"}]}),
    );
    let (a, b) = (&first.actions[0], &second.actions[0]);
    assert_eq!(a.path, b.path);
    let newest = sb
        .artifacts(10, Some("wf_two"))
        .unwrap()
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(newest.parent_artifact_id, a.artifact_id, "{newest:?}");
    assert_eq!(newest.path, w.root.join("f.txt").display().to_string());
}

/// What another writer changes between validation and execution is found again under the
/// target's lock. Refused before anything of the plan is written, the plan is blocked as
/// validation would have blocked it (audited as blocked, nothing to roll back); refused
/// after an earlier action was written, the run fails and rolls that back.
#[test]
fn a_refusal_found_at_execution_blocks_the_plan_if_nothing_was_written() {
    let w = World::new();
    let sb = w.sandbox();
    let other_writer = |rel: &str| {
        let path = w.path(rel);
        std::sync::Arc::new(move || std::fs::write(&path, b"theirs").unwrap())
    };
    sb.failpoints()
        .interleave("after_validate", other_writer("x.txt"));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_late", "actions": [
            {"intent": "create_file", "path": "x.txt", "content": "mine"},
            {"intent": "create_file", "path": "y.txt", "content": "y"}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(action_status(&r, 0), "blocked");
    assert_eq!(code(&r, 0).as_deref(), Some("already_exists"));
    assert_eq!(action_status(&r, 1), "skipped");
    assert_eq!(w.read("x.txt"), b"theirs");
    assert!(!w.path("y.txt").exists());
    assert_eq!(audit_statuses(&sb, "wf_late"), ["blocked"]);

    sb.failpoints()
        .interleave("after_validate", other_writer("z.txt"));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_late2", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "a"},
            {"intent": "create_file", "path": "z.txt", "content": "mine"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
    assert_eq!(action_status(&r, 1), "failed");
    assert_eq!(code(&r, 1).as_deref(), Some("already_exists"));
    assert!(!w.path("a.txt").exists(), "the first action rolled back");
    assert_eq!(w.read("z.txt"), b"theirs");
}

/// An action whose write fails after the target changed, and whose own undo fails too,
/// leaves its change in place: the run says so (failed, not rolled back), and the
/// workflow can be rolled back later.
#[test]
fn a_failed_undo_is_reported_and_the_workflow_stays_reversible() {
    let w = World::new();
    w.write("t.txt", b"orig\n");
    let sb = w.sandbox();
    sb.failpoints().arm("after_mutate", 1);
    sb.failpoints().arm("during_restore", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_u", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "t.txt", "content": "new\n"}]}),
    );
    assert_eq!(status(&r), "failed", "{r:?}");
    assert_eq!(r.state.as_str(), "failed");
    assert_eq!(action_status(&r, 0), "failed");
    let reason = r.actions[0].reason.as_deref().unwrap();
    assert!(reason.contains("undoing its change failed"), "{reason}");
    assert_eq!(w.read("t.txt"), b"new\n", "the change is still there");
    let rb = sb.rollback_workflow("wf_u", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("t.txt"), b"orig\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A write whose audit line fails and whose undo fails too (a full disk) is left for
/// recovery: its run's record stays active, and the next start judges it against the
/// disk, so that the trail records what is in place (it stood on no line of the trail,
/// `audit verify` failing for good, while the file held the new bytes).
#[test]
fn a_write_neither_audited_nor_undone_is_settled_by_the_next_start() {
    let w = World::new();
    w.write("t.txt", b"orig\n");
    let mut c = w.writable_config();
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c);
    // Every append to the trail fails while it is held, as on a full disk.
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(w.state.join("sandbox_audit.jsonl"))
        .unwrap();
    log.lock().unwrap();
    sb.failpoints().arm("during_restore", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_v", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "t.txt", "content": "new\n"}]}),
    );
    log.unlock().unwrap();
    assert_eq!(status(&r), "failed", "{r:?}");
    // Said once, as it is: it also said "the change was undone".
    let why = r.actions[0].reason.as_deref().unwrap();
    assert!(why.contains("undoing its change failed"), "{why}");
    assert!(!why.contains("the change was undone"), "{why}");
    assert_eq!(w.read("t.txt"), b"new\n", "the change is still there");
    assert_eq!(run_record(&w, "wf_v")["state"], "active");
    assert!(sb.audit_entries(10, Some("wf_v")).unwrap().is_empty());
    drop(sb);
    let sb = w.sandbox();
    assert!(sb.audit_verify().unwrap().ok, "{:?}", sb.notices());
    let lines = sb.audit_entries(10, Some("wf_v")).unwrap();
    assert_eq!(
        lines[0].after_checksum.as_deref(),
        Some(sha(b"new\n").as_str()),
        "{lines:?}"
    );
    let rb = sb.rollback_workflow("wf_v", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("t.txt"), b"orig\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// An agent can read back the largest file an operation writes; one byte more is refused.
#[test]
fn read_file_takes_the_largest_file_an_operation_writes() {
    use ailab_sandbox_core::catalog::LARGEST_WRITE_BYTES;
    let w = World::new();
    let sb = w.sandbox();
    let n = usize::try_from(LARGEST_WRITE_BYTES).unwrap();
    w.write("big.md", &vec![b'x'; n]);
    let f = sb.read_file("big.md", None).unwrap();
    assert_eq!(f.size_bytes, LARGEST_WRITE_BYTES);
    w.write("bigger.md", &vec![b'x'; n + 1]);
    let err = sb.read_file("bigger.md", None).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::SizeExceeded, "{}", err.reason);
}

/// A file swapped for a FIFO between get_file_info's look and its hash is described as
/// what stands there now (`special`), not refused as a file that is not regular.
#[test]
fn get_file_info_looks_again_at_a_file_swapped_for_a_fifo() {
    let w = World::new();
    w.write("race.md", b"x");
    let sb = w.sandbox();
    let path = w.path("race.md");
    sb.failpoints().interleave(
        "info_hash",
        std::sync::Arc::new(move || {
            std::fs::remove_file(&path).unwrap();
            rustix::fs::mkfifoat(rustix::fs::CWD, &path, 0o600.into()).unwrap();
        }),
    );
    let info = sb.get_file_info("race.md", None).unwrap();
    assert_eq!(info.kind.as_str(), "special");
    assert_eq!(info.sha256, None);
}

#[test]
fn get_file_info_describes_a_file_of_any_size_and_hashes_up_to_a_limit() {
    use sha2::{Digest, Sha256};
    let w = World::new();
    let sb = w.sandbox();
    // Odd-sized, so the last chunk is a partial one.
    let bytes: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
    w.write("data.bin", &bytes);
    let info = sb.get_file_info("data.bin", None).unwrap();
    assert_eq!(info.kind.as_str(), "file");
    assert_eq!(info.size_bytes, Some(1_000_003));
    assert_eq!(
        info.sha256.as_deref(),
        Some(ailab_sandbox_core::hash::to_hex(&Sha256::digest(&bytes)).as_str())
    );
    // Larger than anything the runtime reads whole (a sparse file: no disk is used).
    let huge = 65 * 1024 * 1024 + 1;
    std::fs::File::create(w.path("huge.bin"))
        .unwrap()
        .set_len(huge)
        .unwrap();
    let info = sb.get_file_info("huge.bin", None).unwrap();
    assert_eq!(info.size_bytes, Some(huge));
    let zeros = {
        let mut h = Sha256::new();
        let block = vec![0u8; 1024 * 1024];
        for _ in 0..huge / 1024 / 1024 {
            h.update(&block);
        }
        h.update(&block[..usize::try_from(huge % (1024 * 1024)).unwrap()]);
        ailab_sandbox_core::hash::to_hex(&h.finalize())
    };
    assert_eq!(info.sha256, Some(zeros));
    // Beyond 1 GiB it is described unread: hashing must not pin a thread for hours.
    let over = ailab_sandbox_core::sandbox::MAX_INFO_HASH_BYTES + 1;
    std::fs::File::create(w.path("over.bin"))
        .unwrap()
        .set_len(over)
        .unwrap();
    let info = sb.get_file_info("over.bin", None).unwrap();
    assert_eq!(info.size_bytes, Some(over));
    assert_eq!(info.sha256, None);
}

/// What list_directory lists, get_file_info describes: a symlink and a FIFO are named for
/// what they are, never followed or opened (opening a FIFO would block). A symlink among
/// the parents and a file with other hard links stay refused, as for read_file.
/// A root named by its own absolute path lists that root, like `""` lists the first (it
/// was refused as `outside_sandbox`, "the sandbox root itself").
#[test]
fn a_root_is_listed_by_its_own_path() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &w.config());
    std::fs::write(root2.join("two.txt"), b"2").unwrap();
    w.write("one.txt", b"1");
    let sb = w.open(both);
    let names = |path: &str, root: Option<&str>| -> Vec<String> {
        sb.list_directory(path, root)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    let second = root2.display().to_string();
    assert_eq!(names(&second, None), ["two.txt"]);
    assert_eq!(names(&format!("{second}/"), Some(&second)), ["two.txt"]);
    assert_eq!(names(&w.root.display().to_string(), None), ["one.txt"]);
    for named in [second.clone(), format!("{second}/")] {
        let err = sb
            .list_directory(&named, Some(&w.root.display().to_string()))
            .unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::OutsideSandbox,
            "{named}: {}",
            err.reason
        );
    }
    // Taken literally, as every other path: no `.` or empty component.
    for odd in [
        format!("{second}/."),
        format!("{second}//"),
        format!("{second}/./"),
    ] {
        let err = sb.list_directory(&odd, None).unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::PathTraversal,
            "{odd}: {}",
            err.reason
        );
    }
}

/// A folder is listed with one trailing `/` as without, as a root's own path is; the top
/// of a root, named as for a listing, is described as a directory (both were refused,
/// `path_traversal` and a missing path, while the listing took them for the root).
#[test]
fn a_folder_is_listed_with_a_trailing_slash_and_a_roots_top_described() {
    let w = World::new();
    w.write("d/in.txt", b"i");
    let sb = w.sandbox();
    let names = |path: &str| -> Vec<String> {
        sb.list_directory(path, None)
            .unwrap_or_else(|e| panic!("{path}: {}", e.reason))
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert_eq!(names("d/"), ["in.txt"]);
    assert_eq!(names("d"), ["in.txt"]);
    assert_eq!(names("."), ["d"]);
    for odd in ["d//", "d/./", "./d"] {
        let err = sb.list_directory(odd, None).unwrap_err();
        assert_eq!(
            err.reason_code,
            ReasonCode::PathTraversal,
            "{odd}: {}",
            err.reason
        );
    }
    let top = w.root.display().to_string();
    for path in ["", "/", ".", top.as_str(), &format!("{top}/")] {
        let info = sb
            .get_file_info(path, None)
            .unwrap_or_else(|e| panic!("{path}: {}", e.reason));
        assert_eq!(
            (info.kind.as_str(), info.path.as_str()),
            ("directory", path)
        );
        assert_eq!(
            (info.size_bytes, info.sha256, info.artifact_id),
            (None, None, None)
        );
    }
    assert_eq!(
        sb.get_file_info("d/in.txt", None).unwrap().kind.as_str(),
        "file"
    );
    let err = sb.get_file_info("d/in.txt/", None).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::PathTraversal, "{}", err.reason);
}

/// A listing leaves out what no read may name: the snapshot store and the runtime's
/// temporary files (at any depth, in any case, as reads refuse them).
#[test]
fn a_listing_leaves_out_the_runtimes_reserved_names() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_ls", "actions": [
            {"intent": "create_file", "path": "d/kept.txt", "content": "k"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert!(w.path(".rollback").is_dir());
    let temp = ailab_sandbox_core::confine::root::temp_name();
    w.write(&format!("d/{temp}"), b"t");
    std::fs::create_dir(w.path("d/.ROLLBACK")).unwrap();
    let names = |path: &str| -> Vec<String> {
        sb.list_directory(path, None)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert_eq!(names(""), ["d"]);
    assert_eq!(names("d"), ["kept.txt"]);
}

#[test]
fn get_file_info_names_links_and_special_files_without_following_them() {
    let w = World::new();
    let sb = w.sandbox();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), b"s").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), w.path("out.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path(), w.path("outdir")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        w.path("pipe.txt"),
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    for (path, kind) in [
        ("out.txt", "symlink"),
        ("outdir", "symlink"),
        ("pipe.txt", "special"),
    ] {
        let info = sb.get_file_info(path, None).unwrap();
        assert_eq!(info.kind.as_str(), kind, "{path}");
        assert_eq!((info.size_bytes, info.sha256), (None, None), "{path}");
    }
    let listed: Vec<_> = sb
        .list_directory("", None)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind.as_str()))
        .collect();
    assert!(
        listed.contains(&("out.txt".to_owned(), "symlink")),
        "{listed:?}"
    );
    assert!(
        listed.contains(&("pipe.txt".to_owned(), "special")),
        "{listed:?}"
    );
    let err = sb.get_file_info("outdir/secret.txt", None).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::SymlinkEscape, "{}", err.reason);
    w.write("a.txt", b"a");
    std::fs::hard_link(w.path("a.txt"), w.path("b.txt")).unwrap();
    let err = sb.get_file_info("b.txt", None).unwrap_err();
    assert_eq!(
        err.reason_code,
        ReasonCode::HardlinkRefused,
        "{}",
        err.reason
    );
}

/// `get_file_info` names the artifact the file holds, as the next write's lineage does: a
/// rolled-back write's artifact stays registered, but no file is it any more.
#[test]
fn get_file_info_names_the_artifact_the_file_holds() {
    use ailab_sandbox_core::sandbox::RollbackOptions;
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_i", "actions": [
            {"action_id": "l1", "intent": "create_file", "path": "n.txt", "content": "1"},
            {"action_id": "l2", "intent": "replace_file", "path": "n.txt", "content": "2"}]}),
    );
    assert_eq!(status(&r), "success");
    let art = |action: &str| {
        r.actions
            .iter()
            .find(|a| a.action_id == action)
            .unwrap()
            .artifact_id
            .clone()
    };
    let info = || sb.get_file_info("n.txt", None).unwrap();
    assert_eq!(info().artifact_id, art("l2"));
    let one = |action: &str| RollbackOptions {
        action_id: Some(action.to_owned()),
        force: false,
    };
    assert!(sb.rollback_workflow("wf_i", &one("l2")).is_success());
    assert_eq!(w.read("n.txt"), b"1");
    assert_eq!(info().artifact_id, art("l1"), "the file holds l1's bytes");
    w.write("n.txt", b"by hand");
    assert_eq!(info().artifact_id, None, "no registered version");
    w.write("n.txt", b"1");
    assert!(sb.rollback_workflow("wf_i", &one("l1")).is_success());
    assert_eq!(info().kind.as_str(), "missing");
    assert_eq!(info().artifact_id, None);
    // The same bytes put back by hand are no registered version either: every write of
    // them was rolled back (the rolled-back l2 was named).
    w.write("n.txt", b"2");
    assert_eq!(info().artifact_id, None, "written by hand");
}

/// A plan naming a configured root that was skipped at start (it could not be opened) is
/// told so, not that the root is not configured.
#[test]
fn a_skipped_root_is_named_as_skipped() {
    let w = World::new();
    std::fs::write(w.tmp.path().join("a-file"), b"x").unwrap();
    let unusable = w.tmp.path().join("a-file/root");
    let mut c = w.writable_config();
    c.roots.push(unusable.clone());
    let sb = w.open(c);
    assert_eq!(sb.state_doc().unwrap().skipped_roots.len(), 1);
    assert_eq!(sb.skipped_roots(), sb.state_doc().unwrap().skipped_roots);
    let r = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "x.md", "content": "x",
                            "root": unusable.display().to_string()}]}),
    );
    assert_eq!(code(&r, 0).as_deref(), Some("outside_sandbox"), "{r:?}");
    let reason = r.actions[0].reason.as_deref().unwrap();
    assert!(
        reason.contains("skipped_roots") && !reason.contains("not a configured"),
        "{reason}"
    );
}

/// A plan's rollback that cannot undo an earlier write says so on that write: it stays
/// `success` (its bytes stand), with the restore's code and what to do.
#[test]
fn a_write_the_plans_rollback_could_not_undo_says_why() {
    let w = World::new();
    w.write("f.txt", b"orig");
    let sb = w.sandbox();
    sb.failpoints().arm("after_mutate", 2);
    // The first restore undoes a2's own change; the second is the plan's rollback of a1.
    sb.failpoints().arm("during_restore", 2);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_u", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "one"},
            {"action_id": "a2", "intent": "create_file", "path": "g.txt", "content": "g"}]}),
    );
    assert_eq!(status(&r), "failed", "{r:?}");
    let a1 = &r.actions[0];
    assert_eq!(
        a1.status,
        ailab_sandbox_core::executor::ActionStatus::Success,
        "{a1:?}"
    );
    assert_eq!(a1.reason_code, Some(ReasonCode::IoError), "{a1:?}");
    let why = a1.reason.as_deref().unwrap();
    assert!(
        why.contains("not undone") && why.contains("roll the workflow back"),
        "{why}"
    );
    assert_eq!(w.read("f.txt"), b"one");
}

/// A plan's own rollback meets a replaced file whose folder someone swapped for a file:
/// the write is left, and its reason says force would not help (force is refused there).
#[test]
fn a_plan_rollback_blocked_by_a_folder_now_a_file_does_not_advise_force() {
    let w = World::new();
    w.write("d/c0.txt", b"before");
    let sb = w.sandbox();
    let (d, moved) = (w.path("d"), w.path("d.moved"));
    sb.failpoints().interleave(
        "before_audit",
        std::sync::Arc::new(move || {
            std::fs::rename(&d, &moved).unwrap();
            std::fs::write(&d, b"theirs").unwrap();
        }),
    );
    sb.failpoints().arm("before_mutate", 2);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_pf", "actions": [
            {"action_id": "a0", "intent": "replace_file", "path": "d/c0.txt", "content": "ours"},
            {"action_id": "a1", "intent": "create_file", "path": "c2.txt", "content": "c"}]}),
    );
    assert_eq!(action_status(&r, 0), "success", "{r:?}");
    let reason = r.actions[0].reason.clone().unwrap_or_default();
    assert!(reason.contains("force would not help"), "{reason}");
    assert!(!reason.contains("roll back with force"), "{reason}");
    assert_eq!(w.read("d"), b"theirs");
    assert_eq!(w.read("d.moved/c0.txt"), b"ours");
}

/// Refusals are neither budgeted nor rate limited, so what their lines keep of the
/// sender's text is bounded: a 1 MiB path or intent does not put 1 MiB on the trail,
/// which is kept for good.
#[test]
fn a_refused_actions_huge_path_and_intent_are_recorded_cut() {
    let w = World::new();
    let sb = w.sandbox();
    let long_name = "b".repeat(1 << 20);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_big", "actions": [
            {"intent": "create_file", "path": format!("{long_name}.md"), "content": "x"},
            {"intent": format!("delete_{long_name}"), "path": "a.md"},
            {"intent": "delete_file", "path": format!("a/{}x.md", "a/".repeat(1 << 19))}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    let trail = std::fs::read_to_string(w.state.join("sandbox_audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["workflow_id"] == "wf_big")
        .collect();
    assert_eq!(lines.len(), 3, "{trail:.2000}");
    assert!(trail.len() < 64 * 1024, "{} bytes", trail.len());
    let path = lines[0]["target_path"].as_str().unwrap();
    assert!(
        path.starts_with("bbbb") && path.ends_with(&format!("… ({} bytes)", (1 << 20) + 3)),
        "{path:.100}"
    );
    let intent = lines[1]["mutation_type"].as_str().unwrap();
    assert!(
        intent.starts_with("delete_bbb") && intent.len() <= 256,
        "{intent:.100}"
    );
    assert!(sb.audit_verify().unwrap().ok);
    assert!(!w.root.join("a.md").exists());
}

/// A plan refused as a whole (its workflow busy past the wait) refuses each action: each
/// is counted in the metrics as it is audited, so `/metrics` and the trail's
/// statistics agree.
#[test]
fn a_plan_refused_as_a_whole_counts_each_action_in_the_metrics() {
    use rustix::fs::{FlockOperation, flock};
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c);
    // Another process's run of the workflow holds its lock.
    let lock = std::fs::File::create(w.state.join("locks/wf-wf_busy.lock")).unwrap();
    flock(&lock, FlockOperation::LockExclusive).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_busy", "actions": [
            {"intent": "create_file", "path": "a.txt", "content": "a"},
            {"intent": "create_file", "path": "b.txt", "content": "b"},
            {"intent": "write_json", "path": "c.json", "data": {}}]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    for i in 0..3 {
        assert_eq!(code(&r, i).as_deref(), Some("conflict"), "{r:?}");
    }
    assert_eq!(sb.audit_stats().unwrap().blocked, 3);
    let metrics = sb.metrics().encode();
    for (intent, n) in [("create_file", 2), ("write_json", 1)] {
        assert!(
            metrics.contains(&format!(
                "ailab_sandbox_mutations_total{{type=\"{intent}\",result=\"blocked\"}} {n}"
            )),
            "{metrics}"
        );
    }
    assert!(w.tree().is_empty());
}

/// A sandbox's `Debug` says where it writes and how, never its registry (an embedder's
/// `dbg!` or a derived `Debug` must not print, or lock, millions of entries) nor the
/// token.
#[test]
fn a_sandboxs_debug_is_small_and_hides_the_token() {
    let w = World::new();
    let mut c = w.writable_config();
    c.token = Some("a-secret-token-of-many-chars".to_owned());
    let sb = w.open(c);
    let empty = format!("{sb:?}");
    for i in 0..20 {
        let r = run(
            &sb,
            json!({"actions": [{"intent": "create_file", "path": format!("d{i}.txt"), "content": "x"}]}),
        );
        assert_eq!(status(&r), "success");
    }
    let shown = format!("{sb:?}");
    assert_eq!(shown.len(), empty.len(), "{shown}");
    assert!(shown.contains(w.root.to_str().unwrap()), "{shown}");
    assert!(!shown.contains("art_"), "{shown}");
    let config = format!("{:?}", sb.config());
    assert!(!config.contains("a-secret-token"), "{config}");
    assert!(config.contains("token: Some(<redacted>)"), "{config}");
}

/// Past the workflow's byte budget, the bytes an action refused by a limit would have
/// written are not kept; an append or a transform after it on the same file is then
/// refused with that action's code, not judged on a guess (`edit_not_found`).
#[test]
fn an_action_after_a_refused_one_whose_bytes_are_not_kept_is_not_judged_on_a_guess() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.max_workflow_bytes = 1000;
    let sb = w.open(c);
    let plan = |keys: usize| {
        let data: serde_json::Map<String, serde_json::Value> =
            (0..keys).map(|i| (format!("k{i:03}"), json!(i))).collect();
        json!({"workflow_id": format!("wf_{keys}"), "actions": [
            {"action_id": "a1", "intent": "write_json", "path": format!("big{keys}.json"), "data": data},
            {"action_id": "a2", "intent": "sandbox_transform", "path": format!("big{keys}.json"),
             "edits": [{"old": "\"k000\"", "new": "\"kzzz\""}]}]})
    };
    // a1's 1,100 bytes pass the budget alone: a2 is refused as it was.
    let r = run(&sb, plan(80));
    assert_eq!(status(&r), "blocked", "{r:?}");
    for i in 0..2 {
        assert_eq!(
            r.actions[i].reason_code,
            Some(ReasonCode::BudgetBytesExceeded),
            "action {i}: {r:?}"
        );
    }
    assert!(
        r.actions[1]
            .reason
            .as_deref()
            .unwrap()
            .contains("not judged: an earlier action of the plan on 'big80.json' was refused"),
        "{r:?}"
    );
}

/// A target whose kind an earlier action of the plan sets is refused in the words of one
/// found so on disk: by its path relative to the root, even when the plan gave it whole.
#[test]
fn a_kind_set_by_an_earlier_action_is_refused_as_one_found_on_disk() {
    let w = World::new();
    let sb = w.sandbox();
    let abs = format!("{}/sub.txt", w.root.display());
    for (first, second, code_wanted, words) in [
        (
            json!({"intent": "create_directory", "path": abs}),
            json!({"intent": "create_file", "path": abs, "content": "x"}),
            "already_exists",
            "'sub.txt' already exists, as a directory; create_file makes new files only",
        ),
        (
            json!({"intent": "create_file", "path": "f.txt", "content": "x"}),
            json!({"intent": "create_directory", "path": "f.txt"}),
            "already_exists",
            "'f.txt' exists and is a file, so no directory can be created there",
        ),
    ] {
        let r = run(&sb, json!({ "actions": [first, second] }));
        assert_eq!(code(&r, 1).as_deref(), Some(code_wanted), "{r:?}");
        assert_eq!(r.actions[1].reason.as_deref(), Some(words), "{r:?}");
        assert!(w.tree().is_empty(), "{:?}", w.tree());
    }
}

/// The size of content given as it is written is judged with governance, before the
/// operation's preconditions (SPEC §5, §6), in a run and a simulation as by `check`: a
/// file too large is `size_exceeded` whether or not its path exists. What the target is
/// comes before (governance's look at it): a directory is refused for what it is.
#[test]
fn content_too_large_is_size_exceeded_before_the_targets_preconditions() {
    let w = World::new();
    w.write("b.md", b"b\n");
    std::fs::create_dir(w.path("d.md")).unwrap();
    let big = "x".repeat(2 * 1024 * 1024);
    for config in [w.writable_config(), w.config()] {
        let sb = w.open(config);
        for (intent, path, wanted) in [
            ("create_file", "b.md", "size_exceeded"),
            ("replace_file", "missing.md", "size_exceeded"),
            ("create_file", "d.md", "already_exists"),
            ("replace_file", "d.md", "not_regular_file"),
        ] {
            let r = run(
                &sb,
                json!({"actions": [{"intent": intent, "path": path, "content": big}]}),
            );
            assert_eq!(status(&r), "blocked", "{intent}: {r:?}");
            assert_eq!(code(&r, 0).as_deref(), Some(wanted), "{intent} {path}");
        }
    }
    assert_eq!(w.read("b.md"), b"b\n");
    assert!(!w.path("missing.md").exists());
    // Before the target is read: a simulation reads an existing file for its checksum,
    // which a file closed to this process would make a `conflict`.
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o200)
            .open(w.path("closed.md"))
            .unwrap();
        f.write_all(b"c\n").unwrap();
    }
    for config in [w.writable_config(), w.config()] {
        let r = without_dac_override(|| {
            let sb = w.open(config);
            run(
                &sb,
                json!({"actions": [{"intent": "create_file", "path": "closed.md", "content": big}]}),
            )
        });
        assert_eq!(code(&r, 0).as_deref(), Some("size_exceeded"), "{r:?}");
    }
}
