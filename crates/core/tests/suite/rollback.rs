//! Rollback: byte-for-byte restores, conflicts, force, single actions, pruning.

use crate::support::*;
use ailab_sandbox_core::ReasonCode;
use ailab_sandbox_core::sandbox::RollbackOptions;
use serde_json::json;

fn seed(w: &World) {
    w.write("docs/readme.md", b"# Readme\nline\n");
    w.write("data/config.json", b"{\"v\": 1}\n");
    w.write("log.txt", b"start\n");
}

fn five_actions() -> serde_json::Value {
    json!({"workflow_id": "wf_five", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "new/deep/file.txt", "content": "new file\n"},
        {"action_id": "a2", "intent": "append_file", "path": "log.txt", "content": "more\n"},
        {"action_id": "a3", "intent": "replace_file", "path": "data/config.json", "content": "{\"v\": 2}\n"},
        {"action_id": "a4", "intent": "sandbox_transform", "path": "docs/readme.md", "edits": [{"old": "line", "new": "changed line"}]},
        {"action_id": "a5", "intent": "create_directory", "path": "made/here"}]})
}

#[test]
fn workflow_rollback_restores_the_tree_byte_for_byte() {
    let w = World::new();
    seed(&w);
    let before = w.tree();
    let sb = w.sandbox();
    let r = run(&sb, five_actions());
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    assert_ne!(w.tree(), before);
    let rb = sb.rollback_workflow("wf_five", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 5);
    assert!(rb.steps.iter().all(|s| s.checksum_validated));
    let order: Vec<&str> = rb.steps.iter().map(|s| s.action_id.as_str()).collect();
    assert_eq!(order, ["a5", "a4", "a3", "a2", "a1"], "newest first");
    assert_eq!(
        rb.steps[1].restored_checksum.as_deref(),
        Some(sha(b"# Readme\nline\n").as_str())
    );
    assert_eq!(
        w.tree(),
        before,
        "created files and directories removed, changed files restored"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

#[test]
fn second_rollback_has_nothing_to_do() {
    let w = World::new();
    seed(&w);
    let sb = w.sandbox();
    run(&sb, five_actions());
    assert_eq!(
        sb.rollback_workflow("wf_five", &RollbackOptions::default())
            .status,
        "rolled_back"
    );
    let again = sb.rollback_workflow("wf_five", &RollbackOptions::default());
    assert_eq!(again.reason_code, Some(ReasonCode::NoRollbackData));
}

/// A preview of a rollback names any id it is given and leaves nothing behind for one
/// that never ran (a lock file per id would let any client fill the state directory).
#[test]
fn a_preview_of_an_unknown_workflow_leaves_no_file() {
    let w = World::new();
    let sb = w.sandbox();
    let locks = || {
        std::fs::read_dir(w.state.join("locks"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("wf-"))
            .collect::<Vec<_>>()
    };
    let before = locks();
    for i in 0..5 {
        let info = sb.rollback_info(&format!("wf_never_{i}")).unwrap();
        assert!(!info.rollback_available);
    }
    assert_eq!(locks(), before);
    // One that ran is still settled and answered.
    run(
        &sb,
        json!({"workflow_id": "wf_ran", "actions": [
            {"intent": "create_file", "path": "r.txt", "content": "r"}]}),
    );
    let info = sb.rollback_info("wf_ran").unwrap();
    assert!(info.rollback_available);
    assert_eq!(info.actions.len(), 1);
}

#[test]
fn unknown_workflow_is_no_rollback_data() {
    let w = World::new();
    let sb = w.sandbox();
    let rb = sb.rollback_workflow("wf_never", &RollbackOptions::default());
    assert_eq!(rb.status, "refused");
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let rb = sb.rollback_workflow("../etc", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::InvalidId));
}

/// A workflow with nothing to roll back says why when the trail knows: it ran only
/// simulated, or nothing of it was ever recorded (an id to check).
#[test]
fn nothing_to_roll_back_says_whether_it_was_only_simulated_or_never_seen() {
    let w = World::new();
    let dry = w.open(w.config());
    let r = run(&dry, two_fresh_files());
    assert_eq!(status(&r), "simulated_success", "{:?}", r.actions);
    let reason = |rb: ailab_sandbox_core::sandbox::RollbackReport| {
        assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
        rb.reason.unwrap_or_default()
    };
    let whole = reason(dry.rollback_workflow("wf_fresh", &RollbackOptions::default()));
    assert!(whole.contains("only as simulated"), "{whole}");
    let one = reason(dry.rollback_workflow(
        "wf_fresh",
        &RollbackOptions {
            action_id: Some("a2".into()),
            ..Default::default()
        },
    ));
    assert!(one.contains("only as simulated"), "{one}");
    let unknown = reason(dry.rollback_workflow(
        "wf_fresh",
        &RollbackOptions {
            action_id: Some("a9".into()),
            ..Default::default()
        },
    ));
    assert!(
        unknown.contains("records nothing of action 'a9'"),
        "{unknown}"
    );
    drop(dry);
    // Once written for real, the same ids roll back; an unknown workflow is named.
    let sb = w.sandbox();
    assert_eq!(status(&run(&sb, two_fresh_files())), "success");
    let never = reason(sb.rollback_workflow("wf_never", &RollbackOptions::default()));
    assert!(
        never.contains("records nothing of workflow 'wf_never'"),
        "{never}"
    );
    // Simulated, then refused for real: not said to be only simulated.
    let dry = w.open(w.config());
    // f1.txt stands: created again, the action is refused.
    let blocked = json!({"workflow_id": "wf_mixed", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "f1.txt", "content": "again"}]});
    let simulated = json!({"workflow_id": "wf_mixed", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "m1.txt", "content": "m"}]});
    assert_eq!(status(&run(&dry, simulated)), "simulated_success");
    drop(dry);
    assert_eq!(status(&run(&sb, blocked)), "blocked");
    let mixed = reason(sb.rollback_workflow("wf_mixed", &RollbackOptions::default()));
    assert!(
        mixed.contains("records no write of workflow 'wf_mixed': its actions were refused"),
        "{mixed}"
    );
    let rb = sb.rollback_workflow("wf_fresh", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let again = reason(sb.rollback_workflow("wf_fresh", &RollbackOptions::default()));
    assert!(
        !again.contains("simulated") && !again.contains("records no"),
        "{again}"
    );
}

fn two_fresh_files() -> serde_json::Value {
    json!({"workflow_id": "wf_fresh", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "f1.txt", "content": "one\n"},
        {"action_id": "a2", "intent": "create_file", "path": "f2.txt", "content": "two\n"}]})
}

#[test]
fn conflict_is_refused_unless_forced() {
    let w = World::new();
    seed(&w);
    let before = w.tree();
    let sb = w.sandbox();
    run(&sb, five_actions());
    w.write("log.txt", b"someone else wrote this\n");
    let rb = sb.rollback_workflow("wf_five", &RollbackOptions::default());
    assert_eq!(rb.status, "refused");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    assert_eq!(rb.conflicts.len(), 1);
    assert!(rb.conflicts[0].path.ends_with("log.txt"));
    assert!(rb.reason.as_deref().unwrap().contains("log.txt"));
    assert_eq!(
        w.read("log.txt"),
        b"someone else wrote this\n",
        "nothing restored on conflict"
    );
    assert_eq!(w.read("data/config.json"), b"{\"v\": 2}\n");
    // The refusal is on the trail, as a blocked rollback naming the conflict.
    let last = &sb.audit_entries(1, Some("wf_five")).unwrap()[0];
    assert_eq!(
        (last.status, last.reason_code, last.mutation_type.as_str()),
        (
            ailab_sandbox_core::audit::AuditStatus::Blocked,
            Some(ReasonCode::Conflict),
            "rollback_workflow"
        )
    );
    assert!(last.error.as_deref().unwrap().contains("log.txt"));
    let info = sb.rollback_info("wf_five").unwrap();
    assert!(info.rollback_available);
    assert_eq!(info.conflicts.len(), 1);
    let rb = sb.rollback_workflow("wf_five", &forced());
    assert_eq!(rb.status, "rolled_back");
    assert_eq!(w.tree(), before);
    // What GET says agrees with what POST then answers.
    for (wf, says) in [
        ("wf_five", "already rolled back"),
        ("wf_never", "no snapshots"),
    ] {
        let info = sb.rollback_info(wf).unwrap();
        assert!(!info.rollback_available, "{wf}");
        assert_eq!(info.reason_code, Some(ReasonCode::NoRollbackData), "{wf}");
        assert!(
            info.reason.as_deref().unwrap().contains(says),
            "{wf}: {info:?}"
        );
        let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
        assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{wf}");
        assert_eq!(rb.reason, info.reason, "{wf}");
    }
    assert_eq!(sb.rollback_info("wf_five").unwrap().actions.len(), 5);
}

#[test]
fn deleted_file_counts_as_a_conflict() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_del", "actions": [{"intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    std::fs::remove_file(w.path("a.txt")).unwrap();
    let rb = sb.rollback_workflow("wf_del", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    assert_eq!(rb.conflicts[0].current_checksum, None);
}

#[test]
fn single_action_rollback() {
    let w = World::new();
    seed(&w);
    let sb = w.sandbox();
    run(&sb, five_actions());
    let rb = rollback_action(&sb, "wf_five", "a3", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1);
    assert_eq!(w.read("data/config.json"), b"{\"v\": 1}\n");
    assert_eq!(
        w.read("log.txt"),
        b"start\nmore\n",
        "other actions untouched"
    );
    let rb = rollback_action(&sb, "wf_five", "zz", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    assert!(!rb.reason.unwrap().contains("records action"));
}

/// An action named under a workflow that never ran it is refused, naming the workflow
/// whose trail records it, so that the caller can name it (nothing is restored).
#[test]
fn an_action_named_under_another_workflow_is_told_where_it_ran() {
    let w = World::new();
    seed(&w);
    let sb = w.sandbox();
    run(&sb, five_actions());
    let other = json!({"workflow_id": "wf_other", "actions": [
        {"action_id": "a3", "intent": "create_file", "path": "other.txt", "content": "o\n"}]});
    assert_eq!(status(&run(&sb, other)), "success");
    for (wf, action, named) in [
        ("wf_none", "a2", "in workflow 'wf_five':"),
        ("wf_other", "a2", "in workflow 'wf_five':"),
        ("wf_none", "a3", "in workflows 'wf_five', 'wf_other':"),
    ] {
        // Asked again, after its refusal is on the trail, it says so again.
        for _ in 0..2 {
            let rb = rollback_action(&sb, wf, action, false);
            assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
            let reason = rb.reason.unwrap();
            assert!(
                reason.contains(&format!(
                    "records a write of action '{action}' not rolled back {named} name its workflow"
                )),
                "{reason}"
            );
        }
    }
    // Rolled back in one, it is named in the other only.
    assert_eq!(
        rollback_action(&sb, "wf_other", "a3", false).status,
        "rolled_back"
    );
    let rb = rollback_action(&sb, "wf_none", "a3", false);
    let reason = rb.reason.unwrap();
    assert!(
        reason.contains("not rolled back in workflow 'wf_five': name"),
        "{reason}"
    );
    assert_eq!(w.read("log.txt"), b"start\nmore\n");
    assert!(!w.root.join("other.txt").exists());
}

#[test]
fn rolling_back_an_older_action_over_a_newer_one_is_a_conflict() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_chain", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "c.md", "content": "v1"},
        {"action_id": "a2", "intent": "replace_file", "path": "c.md", "content": "v2"}]}),
    );
    let rb = rollback_action(&sb, "wf_chain", "a1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    let rb = sb.rollback_workflow("wf_chain", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back");
    assert!(!w.path("c.md").exists());
}

/// An action of a workflow is not rolled back under a later action of the same workflow
/// on its file, even with force: the later one would stay recorded as in place, and its
/// own rollback would then bring back the earlier action's bytes. Rolled back in order,
/// the file ends as it was.
#[test]
fn a_later_action_on_the_same_file_is_rolled_back_first_even_with_force() {
    let w = World::new();
    w.write("o.md", b"orig\n");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_xy", "actions": [
        {"action_id": "x", "intent": "replace_file", "path": "o.md", "content": "x\n"},
        {"action_id": "y", "intent": "replace_file", "path": "o.md", "content": "y\n"},
        {"action_id": "z", "intent": "create_file", "path": "z.md", "content": "z"}]}),
    );
    for force in [false, true] {
        let rb = rollback_action(&sb, "wf_xy", "x", force);
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
        assert!(
            rb.reason
                .as_deref()
                .unwrap_or("")
                .contains("'y' (replace_file 'o.md')"),
            "{rb:?}"
        );
        // The file of the action asked for, as the later one left it.
        assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
        let c = &rb.conflicts[0];
        assert_eq!(c.action_id, "x");
        assert!(c.path.ends_with("o.md"), "{c:?}");
        assert_eq!(
            c.expected_checksum,
            Some(ailab_sandbox_core::hash::sha256_hex(b"x\n"))
        );
        assert_eq!(
            c.current_checksum,
            Some(ailab_sandbox_core::hash::sha256_hex(b"y\n"))
        );
        assert_eq!(c.changed_by, write_by("wf_xy/y"));
        assert_eq!(w.read("o.md"), b"y\n", "nothing restored");
    }
    assert_eq!(
        rollback_action(&sb, "wf_xy", "y", false).status,
        "rolled_back"
    );
    assert_eq!(w.read("o.md"), b"x\n");
    assert_eq!(
        rollback_action(&sb, "wf_xy", "x", false).status,
        "rolled_back"
    );
    assert_eq!(w.read("o.md"), b"orig\n");
    assert_eq!(w.read("z.md"), b"z", "other files untouched");
    let rb = rollback(&sb, "wf_xy", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1);
    assert!(!w.path("z.md").exists());
    assert_eq!(w.read("o.md"), b"orig\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A snapshot file swapped for a symbolic link is said to be one (it read "filesystem
/// loop or indirection limit"), never followed.
#[test]
fn a_backup_swapped_for_a_link_is_said_to_be_one() {
    let (w, sb) = history(b"original", &[]);
    run(
        &sb,
        json!({"workflow_id": "wf_bl", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "new"}]}),
    );
    let backup = w.root.join(".rollback/wf_bl/a1/backup");
    let copy = w.outside.join("backup-copy");
    std::fs::copy(&backup, &copy).unwrap();
    std::fs::remove_file(&backup).unwrap();
    std::os::unix::fs::symlink(&copy, &backup).unwrap();
    let rb = rollback(&sb, "wf_bl", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    // Not lost (`no_rollback_data`, HTTP 404): what stands in its place is not used.
    assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
    let why = rb.reason.unwrap();
    assert!(
        why.contains("symbolic link")
            && !why.contains("loop")
            && why.contains("backup '.rollback/wf_bl/a1/backup' is not one the runtime wrote")
            && why.contains("once the runtime's own backup is back in its place")
            && !why.contains("other means")
            && !why.contains("remove it"),
        "{why}"
    );
    assert_eq!(w.read("f.txt"), b"new");
    // The runtime's own backup put back, the rollback goes through.
    std::fs::remove_file(&backup).unwrap();
    std::fs::copy(&copy, &backup).unwrap();
    let rb = rollback(&sb, "wf_bl", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"original");
}

#[test]
fn damaged_backup_is_checksum_mismatch() {
    let w = World::new();
    w.write("f.txt", b"original");
    w.write("g.txt", b"original");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_dmg", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "new"},
            {"action_id": "a2", "intent": "create_file", "path": "top.txt", "content": "t"},
            {"action_id": "a3", "intent": "replace_file", "path": "g.txt", "content": "new"}]}),
    );
    let backup = w.root.join(".rollback/wf_dmg/a1/backup");
    std::fs::write(&backup, b"tampered").unwrap();
    std::fs::write(w.root.join(".rollback/wf_dmg/a3/backup"), b"tampered").unwrap();
    // Refused before anything is restored, forced or not: it restored the newer action,
    // then stopped at the damaged one, half way.
    for force in [false, true] {
        let rb = rollback(&sb, "wf_dmg", force);
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch));
        assert_eq!(rb.steps_rolled_back, 0);
        assert!(rb.reason.unwrap().contains("even with force"));
    }
    assert_eq!(w.read("f.txt"), b"new", "a damaged backup is never written");
    assert_eq!(w.read("top.txt"), b"t", "nothing restored");
    // Each damaged backup, each time a rollback is asked for.
    assert!(
        sb.metrics()
            .encode()
            .contains("ailab_sandbox_checksum_mismatch_total 4")
    );
    let info = sb.rollback_info("wf_dmg").unwrap();
    assert!(!info.rollback_available, "{info:?}");
    // A backup gone is said so too.
    std::fs::remove_file(&backup).unwrap();
    let rb = rollback(&sb, "wf_dmg", true);
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 0);
    // In the system's words, not Rust's ("entity not found").
    assert!(rb.reason.unwrap().contains("no such file or directory"));
    assert_eq!(w.read("top.txt"), b"t", "nothing restored");
    // The damaged backup of a newer write on a file an older write of the workflow
    // restores anyway does not block that restore: the file gets its original bytes back
    // (refused up front, the older write could never be rolled back).
    w.write("g.txt", b"ORIGINAL");
    run(
        &sb,
        json!({"workflow_id": "wf_two", "actions": [
            {"action_id": "b1", "intent": "replace_file", "path": "g.txt", "content": "v1"},
            {"action_id": "b2", "intent": "replace_file", "path": "g.txt", "content": "v2"}]}),
    );
    std::fs::write(w.root.join(".rollback/wf_two/b2/backup"), b"garbage").unwrap();
    // Unforced, each restore needs the one before it: refused before anything is restored
    // (checking only the oldest let it restore the newest, stop, and leave a middle version).
    let rb = rollback(&sb, "wf_two", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
    // And it says force gives the file back (it said "even with force").
    let why = rb.reason.unwrap();
    assert!(why.contains("roll back with force"), "{why}");
    assert_eq!(w.read("g.txt"), b"v2");
    assert!(!sb.rollback_info("wf_two").unwrap().rollback_available);
    let rb = rollback(&sb, "wf_two", true);
    assert_eq!(w.read("g.txt"), b"ORIGINAL", "{rb:?}");
}

#[test]
fn rollback_survives_a_restart() {
    let w = World::new();
    seed(&w);
    let before = w.tree();
    {
        let sb = w.sandbox();
        run(&sb, five_actions());
    }
    let sb = w.sandbox();
    let rb = sb.rollback_workflow("wf_five", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back");
    assert_eq!(w.tree(), before);
}

#[test]
fn restore_through_a_parent_swapped_for_a_symlink_stays_inside() {
    let w = World::new();
    w.write("sub/f.txt", b"original");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_swap", "actions": [{"intent": "replace_file", "path": "sub/f.txt", "content": "new"}]}),
    );
    std::fs::rename(w.path("sub"), w.tmp.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&w.outside, w.path("sub")).unwrap();
    let outside_before = w.outside_tree();
    let rb = sb.rollback_workflow("wf_swap", &forced());
    assert_eq!(rb.status, "refused", "before anything is restored: {rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::SymlinkEscape));
    assert_eq!(w.outside_tree(), outside_before, "nothing written outside");
    assert!(!w.outside.join("f.txt").exists());
}

/// A prune moves aside only the folder it judged: another program that puts a young
/// workflow's folder under an old one's name between the judgement and the removal
/// does not have the young one's snapshots removed. The old one is kept and said, and
/// the young one, its folder back under its name, still rolls back.
#[test]
fn a_prune_removes_only_the_folder_it_judged() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_old", "actions": [{"action_id": "a1", "intent": "create_file", "path": "o.txt", "content": "o"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    run(
        &sb,
        json!({"workflow_id": "wf_young", "actions": [{"action_id": "a1", "intent": "create_file", "path": "y.txt", "content": "y"}]}),
    );
    let store = w.root.join(".rollback");
    let swap = store.clone();
    sb.failpoints().interleave(
        "sync_prune_marks",
        std::sync::Arc::new(move || {
            std::fs::rename(swap.join("wf_old"), swap.join("wf_old.x")).unwrap();
            std::fs::rename(swap.join("wf_young"), swap.join("wf_old")).unwrap();
        }),
    );
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(report.workflows_pruned.is_empty(), "{report:?}");
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    assert_eq!(report.workflows_failed[0].workflow_id, "wf_old");
    assert_eq!(report.workflows_failed[0].reason_code, ReasonCode::Conflict);
    std::fs::rename(store.join("wf_old"), store.join("wf_young")).unwrap();
    std::fs::rename(store.join("wf_old.x"), store.join("wf_old")).unwrap();
    let rb = sb.rollback_workflow("wf_young", &RollbackOptions::default());
    assert!(rb.is_success(), "{rb:?}");
    assert!(!w.path("y.txt").exists());
    // Nothing of the old one moved: its prune's mark is withdrawn, and it too rolls
    // back as before (it was refused as pruned half way).
    let failure = &report.workflows_failed[0].reason;
    assert!(failure.contains("its rollback is as it was"), "{failure}");
    assert!(!w.state.join("inflight/wf_old.pruned").exists());
    let rb = sb.rollback_workflow("wf_old", &RollbackOptions::default());
    assert!(rb.is_success(), "{rb:?}");
    assert!(!w.path("o.txt").exists());
}

/// A name found in the store whose folder is gone by the time it is judged, with no
/// line on the trail (another program renaming folders there) is no workflow: not said
/// pruned, and no prune recorded for it.
#[test]
fn a_name_gone_before_its_judgement_is_not_said_pruned() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [{"action_id": "a1", "intent": "create_file", "path": "a.txt", "content": "a"}]}),
    );
    let ghost = w.root.join(".rollback/wf_ghost");
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&ghost)
        .unwrap();
    w.clock.advance(chrono::Duration::days(10));
    let away = w.tmp.path().join("away");
    sb.failpoints().interleave(
        "trail_order",
        std::sync::Arc::new(move || std::fs::rename(&ghost, &away).unwrap()),
    );
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(report.workflows_pruned, ["wf_a"], "{report:?}");
    assert!(report.workflows_failed.is_empty(), "{report:?}");
    assert!(!w.state.join("inflight/wf_ghost.pruned").exists());
}

#[test]
fn prune_removes_old_finished_workflows_only() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_old", "actions": [{"intent": "create_file", "path": "o.txt", "content": "o"}]}),
    );
    w.clock.advance(chrono::Duration::days(10));
    run(
        &sb,
        json!({"workflow_id": "wf_new", "actions": [{"intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    // Ages past what the calendar holds prune nothing (and do not overflow).
    for age in [u64::MAX, 20_000_000 * 604_800] {
        let report = sb.prune(std::time::Duration::from_secs(age)).unwrap();
        assert!(report.workflows_pruned.is_empty(), "{report:?}");
    }
    // Pruning makes writes irreversible: with writing off or dry-run on it only says
    // what it would remove.
    let mut dry = w.writable_config();
    dry.dry_run = true;
    for config in [w.config(), dry] {
        let report = w
            .open(config)
            .prune(std::time::Duration::from_secs(7 * 86_400))
            .unwrap();
        assert!(report.simulated);
        assert_eq!(report.workflows_pruned, ["wf_old"]);
        assert!(w.root.join(".rollback/wf_old/").exists());
    }
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert!(!report.simulated);
    assert_eq!(report.workflows_pruned, ["wf_old"]);
    assert_eq!(report.workflows_kept, 1);
    assert!(!w.root.join(".rollback/wf_old").exists());
    assert!(w.root.join(".rollback/wf_new").exists());
    let rb = sb.rollback_workflow("wf_old", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    // Why there is nothing: the prune, named (it said only "there are no snapshots").
    let why = rb.reason.unwrap();
    assert!(why.contains("had their snapshots pruned"), "{why}");
}

/// A world whose workflow `wf` made 25 files, `{prefix}0.txt` to `{prefix}24.txt`, by
/// actions of the same names.
fn twenty_five_writes(wf: &str, prefix: &str) -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    let mut config = w.writable_config();
    config.limits.writes_per_minute = 1000;
    let sb = w.open(config);
    let actions: Vec<_> = (0..25)
        .map(|i| json!({"action_id": format!("{prefix}{i}"), "intent": "create_file", "path": format!("{prefix}{i}.txt"), "content": "x"}))
        .collect();
    assert_eq!(
        status(&run(&sb, json!({"workflow_id": wf, "actions": actions}))),
        "success"
    );
    (w, sb)
}

/// A prune record damaged by hand is said to be damaged (it was taken for none, and
/// the pruned snapshots called missing without a word of it); removed, the snapshots it
/// recorded are missing.
#[test]
fn a_damaged_prune_record_is_named() {
    let (w, sb) = twenty_five_writes("wf_mark", "m");
    w.clock.advance(chrono::Duration::days(10));
    // A prune replaces a damaged record with its own.
    let mark = w.state.join("inflight/wf_mark.pruned");
    std::fs::write(&mark, b"junk").unwrap();
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(report.workflows_pruned, ["wf_mark"]);
    let rb = sb.rollback_workflow("wf_mark", &RollbackOptions::default());
    let why = rb.reason.unwrap();
    assert!(
        why.contains("25 write(s) had their snapshots pruned"),
        "{why}"
    );
    // An entry that does not read damages the record as a whole.
    let root = w.root.display().to_string();
    let entry = json!({"pruned": [{"root": root, "up_to_seq": "25"}]}).to_string();
    std::fs::write(&mark, entry).unwrap();
    let why = rollback_action(&sb, "wf_mark", "m0", false).reason.unwrap();
    assert!(why.contains("inflight/wf_mark.pruned is damaged"), "{why}");
    std::fs::write(&mark, b"{\"damaged\": true}").unwrap();
    // An action written since, whose snapshot is whole, rolls back whatever the record.
    let later = json!({"workflow_id": "wf_mark", "actions": [
        {"action_id": "later", "intent": "create_file", "path": "later.txt", "content": "l"}]});
    assert_eq!(status(&run(&sb, later)), "success");
    let rb = rollback_action(&sb, "wf_mark", "later", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.root.join("later.txt").exists());
    let rb = sb.rollback_workflow("wf_mark", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::IoError), "{rb:?}");
    let why = rb.reason.unwrap();
    assert!(
        why.contains("inflight/wf_mark.pruned is damaged") && !why.contains("are missing from"),
        "{why}"
    );
    assert!(w.root.join("m0.txt").exists());
    std::fs::remove_file(&mark).unwrap();
    let rb = sb.rollback_workflow("wf_mark", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    let why = rb.reason.unwrap();
    assert!(why.contains("are missing from"), "{why}");
}

/// A refusal about a workflow of many pruned writes names twenty and counts the rest:
/// it is answered, and kept on the trail, as one sentence.
#[test]
fn a_rollback_of_many_pruned_writes_names_twenty_of_them() {
    let (w, sb) = twenty_five_writes("wf_many", "p");
    w.clock.advance(chrono::Duration::days(10));
    let report = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert_eq!(report.workflows_pruned, ["wf_many"]);
    let rb = sb.rollback_workflow("wf_many", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let why = rb.reason.unwrap();
    assert!(
        why.contains("25 write(s) had their snapshots pruned"),
        "{why}"
    );
    assert!(why.contains("'p19' (") && !why.contains("'p20' ("), "{why}");
    assert!(why.contains(" and 5 more)"), "{why}");
    // A new write: the preview says what the rollback will leave, as the rollback does.
    assert_eq!(
        status(&run(
            &sb,
            json!({"workflow_id": "wf_many", "actions": [{"action_id": "n1", "intent": "create_file", "path": "n.txt", "content": "n"}]})
        )),
        "success"
    );
    let info = sb.rollback_info("wf_many").unwrap();
    assert!(
        info.rollback_available && info.reason_code.is_none(),
        "{info:?}"
    );
    let said = info.reason.unwrap_or_default();
    assert!(
        said.contains("25 earlier write(s) had their snapshots pruned")
            && said.ends_with(" and 5 more"),
        "{said}"
    );
    let rb = sb.rollback_workflow("wf_many", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.reason.as_deref(), Some(said.as_str()));
}

#[test]
fn a_rollback_missing_many_snapshots_names_twenty_of_them() {
    let (w, sb) = twenty_five_writes("wf_gone", "m");
    for i in 0..25 {
        std::fs::remove_dir_all(w.root.join(format!(".rollback/wf_gone/m{i}"))).unwrap();
    }
    let rb = sb.rollback_workflow("wf_gone", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let why = rb.reason.unwrap();
    assert!(why.contains(" and 5 more are missing"), "{why}");
}

/// A target that cannot be read for a reason not its own (out of descriptors, a disk
/// error) is no change someone made: the rollback is refused with `io_error`, to try
/// again, not called a conflict to force (which a plan's own rollback also advised), and
/// the next try restores.
#[test]
fn a_target_that_cannot_be_read_now_is_no_conflict() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"intent": "create_file", "path": "r.txt", "content": "r"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("read_target", 1);
    let info = sb.rollback_info("wf_r").unwrap();
    assert_eq!(info.reason_code, Some(ReasonCode::IoError), "{info:?}");
    assert!(info.conflicts.is_empty(), "{info:?}");
    sb.failpoints().arm("read_target", 1);
    let rb = sb.rollback_workflow("wf_r", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::IoError), "{rb:?}");
    assert!(rb.conflicts.is_empty(), "{rb:?}");
    let why = rb.reason.unwrap();
    assert!(
        why.contains("could not read 'r.txt'") && !why.contains("force"),
        "{why}"
    );
    assert!(w.root.join("r.txt").exists());
    let rb = sb.rollback_workflow("wf_r", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.root.join("r.txt").exists());
    // A failed action undoing its own change meets such a target: said so too, not
    // called a file it did not write (its undo makes the run's second read of a target).
    sb.failpoints().arm("after_mutate", 2);
    sb.failpoints().arm("read_target", 2);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "p1.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "p2.txt", "content": "2"}]}),
    );
    let why = r.actions[1].reason.clone().unwrap_or_default();
    assert!(
        why.contains("could not read 'p2.txt'") && !why.contains("did not write"),
        "{why}"
    );
    let rb = sb.rollback_workflow("wf_p", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.root.join("p1.txt").exists());
}

/// A failed action undoes its own change and audits the undo; when the undo's mark could
/// not be written beside the snapshot (a full root), the trail still says it is undone:
/// a later rollback of the workflow neither calls another workflow's write to that file
/// a conflict nor, forced, removes it.
#[test]
fn a_failed_actions_undo_stands_without_its_mark() {
    let w = World::new();
    let sb = w.sandbox();
    sb.failpoints().arm("after_mutate", 2);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_f", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
    std::fs::remove_file(w.root.join(".rollback/wf_f/a2/restored.json")).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
            {"intent": "create_file", "path": "two.txt", "content": "other"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    for force in [false, true] {
        let rb = sb.rollback_workflow(
            "wf_f",
            &RollbackOptions {
                force,
                ..RollbackOptions::default()
            },
        );
        assert_eq!(
            rb.reason_code,
            Some(ReasonCode::NoRollbackData),
            "{force}: {rb:?}"
        );
        assert!(rb.conflicts.is_empty(), "{force}: {rb:?}");
    }
    assert_eq!(std::fs::read(w.root.join("two.txt")).unwrap(), b"other");
    let info = sb.rollback_info("wf_f").unwrap();
    assert!(!info.rollback_available, "{info:?}");
}

/// A workflow written a moment ago is kept whatever the year: past 9999 (or at the end
/// of the calendar) its dates were unreadable, and it was pruned as if old.
#[test]
fn a_prune_keeps_new_workflows_at_any_date() {
    for start in ["+10000-01-01T00:00:00Z", "+262142-12-24T00:00:00Z"] {
        let w = World::new();
        w.clock.set(start.parse().unwrap());
        let sb = w.sandbox();
        let r = run(
            &sb,
            json!({"workflow_id": "wf_far", "actions": [{"intent": "create_file", "path": "f.txt", "content": "f"}]}),
        );
        assert_eq!(status(&r), "success", "{start}");
        let report = sb
            .prune(std::time::Duration::from_secs(7 * 86_400))
            .unwrap();
        assert!(report.workflows_pruned.is_empty(), "{start}: {report:?}");
        let rb = sb.rollback_workflow("wf_far", &RollbackOptions::default());
        assert_eq!(rb.status, "rolled_back", "{start}: {rb:?}");
    }
}

/// A refusal changed nothing: a rollback refused (here for a conflict) does not make an
/// old workflow young again for prune, as a simulated one does not.
#[test]
fn a_refused_rollback_does_not_make_a_workflow_young() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_old", "actions": [{"intent": "create_file", "path": "f.txt", "content": "f"}]}),
    );
    assert_eq!(status(&r), "success");
    w.clock.advance(chrono::Duration::days(10));
    w.write("f.txt", b"changed by hand");
    let rb = sb.rollback_workflow("wf_old", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_old"], "{report:?}");
}

/// Rolled back, then pruned: a second rollback says it was already rolled back, not
/// that there were never snapshots.
#[test]
fn a_rolled_back_workflow_pruned_since_says_it_was_rolled_back() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_done", "actions": [{"intent": "create_file", "path": "d.txt", "content": "d"}]}),
    );
    assert_eq!(
        sb.rollback_workflow("wf_done", &RollbackOptions::default())
            .status,
        "rolled_back"
    );
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_done"]);
    let rb = sb.rollback_workflow("wf_done", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let why = rb.reason.unwrap();
    assert!(why.contains("already rolled back"), "{why}");
}

/// Workflow `wf_p` writes `a1.txt` (action `a1`), is pruned ten days later, then
/// writes `a2.txt` (`a2`).
fn a1_pruned_then_a2_written(w: &World, sb: &ailab_sandbox_core::Sandbox) {
    let write = |a: &str| {
        run(
            sb,
            json!({"workflow_id": "wf_p", "actions": [{"action_id": a, "intent": "create_file", "path": format!("{a}.txt"), "content": a}]}),
        )
    };
    assert_eq!(status(&write("a1")), "success");
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_p"]);
    assert_eq!(status(&write("a2")), "success");
}

/// After a prune took a write's snapshot, a refusal that speaks of that write says so:
/// a workflow rolled back since is "already rolled back" but for that write, and an
/// action named under a workflow that never ran it is not sent to one whose snapshot of
/// it is gone.
#[test]
fn refusals_after_a_prune_name_the_pruned_write() {
    let w = World::new();
    let sb = w.sandbox();
    a1_pruned_then_a2_written(&w, &sb);
    let rb = sb.rollback_workflow("wf_p", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let again = sb.rollback_workflow("wf_p", &RollbackOptions::default());
    assert_eq!(again.reason_code, Some(ReasonCode::NoRollbackData));
    let why = again.reason.unwrap();
    assert!(
        why.contains("was already rolled back")
            && why.contains("1 earlier write(s) had their snapshots pruned and cannot be rolled back; those files stay as they are: 'a1'"),
        "{why}"
    );
    assert_eq!(w.read("a1.txt"), b"a1");
    let rb = rollback_action(&sb, "wf_none", "a1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData));
    let why = rb.reason.unwrap();
    assert!(
        why.contains("records a write of action 'a1' not rolled back in workflow 'wf_p', whose snapshot of it is gone (pruned): that write can no longer be rolled back")
            && !why.contains("name its workflow"),
        "{why}"
    );
    // A snapshot removed by hand, no prune (in a workflow never pruned, or pruned
    // before that write): the workflow is named, its own rollback says what to do.
    for (wf, a) in [("wf_q", "b1"), ("wf_p", "a3")] {
        run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"action_id": a, "intent": "create_file", "path": format!("{a}.txt"), "content": a}]}),
        );
        std::fs::remove_dir_all(w.path(&format!(".rollback/{wf}/{a}"))).unwrap();
        let why = rollback_action(&sb, "wf_none", a, false).reason.unwrap();
        assert!(
            why.contains(&format!("records a write of action '{a}' not rolled back in workflow '{wf}': name its workflow to roll it back")),
            "{why}"
        );
    }
}

/// A simulated rollback of a workflow whose earlier writes were pruned says so, as the
/// real one does (it listed only what it would restore, as if all came back).
#[test]
fn a_simulated_rollback_names_the_pruned_writes() {
    let w = World::new();
    let sb = w.sandbox();
    a1_pruned_then_a2_written(&w, &sb);
    drop(sb);
    let simulating = w.open(w.config());
    let rb = simulating.rollback_workflow("wf_p", &RollbackOptions::default());
    assert_eq!(rb.status, "simulated", "{rb:?}");
    let why = rb.reason.unwrap_or_default();
    assert!(
        why.contains("1 action(s) would be rolled back, newest first: a2")
            && why
                .contains("(1 earlier write(s) had their snapshots pruned and could not be: 'a1'"),
        "{why}"
    );
}

#[test]
fn snapshot_metadata_is_the_original_path_marker() {
    let w = World::new();
    w.write("m.txt", b"mark");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_meta", "actions": [{"action_id": "a1", "intent": "replace_file", "path": "m.txt", "content": "x"}]}),
    );
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(w.root.join(".rollback/wf_meta/a1/meta.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["original_path"], "m.txt");
    assert_eq!(meta["existed"], true);
    assert_eq!(meta["kind"], "file");
    assert_eq!(meta["size_bytes"], 4);
    assert_eq!(meta["sha256"], sha(b"mark"));
    assert_eq!(meta["intent"], "replace_file");
    assert_eq!(
        std::fs::read(w.root.join(".rollback/wf_meta/a1/backup")).unwrap(),
        b"mark"
    );
}

/// A rollback writes files, so with writing off or dry-run on it changes nothing and
/// says what it would restore; turned on, the same rollback restores.
#[test]
fn rollback_with_writing_off_or_dry_run_only_simulates() {
    let w = World::new();
    seed(&w);
    let before = w.tree();
    let sb = w.sandbox();
    assert_eq!(status(&run(&sb, five_actions())), "success");
    drop(sb);
    let after = w.tree();
    let mut dry = w.writable_config();
    dry.dry_run = true;
    // Execution on in a phase that allows reads only (`readonly`): still no write.
    let mut read_only = w.writable_config();
    read_only.phase = "28.4".into();
    for (config, flag) in [
        (w.config(), "writing is disabled"),
        (dry, "dry-run is on"),
        (read_only, "the phase does not allow sandbox writes"),
    ] {
        let sb = w.open(config);
        let rb = sb.rollback_workflow("wf_five", &RollbackOptions::default());
        assert_eq!(rb.status, "simulated", "{rb:?}");
        assert!(rb.is_simulated() && !rb.is_success());
        assert_eq!(rb.steps_rolled_back, 0);
        let reason = rb.reason.unwrap();
        assert!(reason.contains(flag), "{reason}");
        assert!(
            reason.contains("5 action(s) would be rolled back, newest first: a5"),
            "{reason}"
        );
        assert_eq!(w.tree(), after, "nothing restored");
        let stats = sb.audit_stats().unwrap();
        assert_eq!(stats.rolled_back, 0);
        // Audited as simulated restores, newest first, like a plan's simulated actions.
        let trail = sb.audit_log().list(5, Some("wf_five")).unwrap();
        let simulated: Vec<&str> = trail
            .iter()
            .rev()
            .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::Simulated)
            .map(|e| e.action_id.as_str())
            .collect();
        assert_eq!(simulated, ["a5", "a4", "a3", "a2", "a1"]);
    }
    let sb = w.sandbox();
    let rb = sb.rollback_workflow("wf_five", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), before);
}

/// What an action left is what its sealed snapshot says it wrote: a registry line
/// changed by hand to the checksum of a later edit (the registry is not chained) does not
/// make that edit look like the action's, so the rollback is refused, not the edit lost.
#[test]
fn a_registry_line_changed_by_hand_does_not_hide_a_later_edit() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_reg", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "n.txt", "content": "ours\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(sb);
    let edit = b"the user's edit\n";
    w.write("n.txt", edit);
    let registry = w.state.join("artifacts.jsonl");
    let text = std::fs::read_to_string(&registry).unwrap();
    let mut line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    line["checksum_sha256"] = json!(ailab_sandbox_core::hash::sha256_hex(edit));
    std::fs::write(&registry, format!("{text}{line}\n")).unwrap();
    let sb = w.sandbox();
    let rb = rollback(&sb, "wf_reg", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("n.txt"), edit);
}

fn rollback(
    sb: &ailab_sandbox_core::Sandbox,
    wf: &str,
    force: bool,
) -> ailab_sandbox_core::sandbox::RollbackReport {
    sb.rollback_workflow(
        wf,
        &RollbackOptions {
            force,
            ..RollbackOptions::default()
        },
    )
}

fn rollback_action(
    sb: &ailab_sandbox_core::Sandbox,
    wf: &str,
    action: &str,
    force: bool,
) -> ailab_sandbox_core::sandbox::RollbackReport {
    sb.rollback_workflow(
        wf,
        &RollbackOptions {
            action_id: Some(action.to_owned()),
            force,
        },
    )
}

/// Another workflow's change between two writes of this workflow to one file is a
/// conflict for the older write: rolling it back would throw that change away. Refused
/// up front (nothing restored); with force, the file goes back to the original.
/// `wf_a` and `wf_b` each create a file in `dir`, which `wf_a`'s write makes.
fn share_a_new_dir(sb: &ailab_sandbox_core::Sandbox, dir: &str) {
    for (wf, name) in [("wf_a", "a.txt"), ("wf_b", "b.txt")] {
        act(
            sb,
            wf,
            json!({"intent": "create_file", "path": format!("{dir}/{name}"), "content": "x"}),
        );
    }
}

/// A sandbox over the same root, named through a symlink above it (as another process
/// configured otherwise would).
fn aliased_sandbox(w: &World) -> ailab_sandbox_core::Sandbox {
    let alias = w.tmp.path().join("alias");
    std::os::unix::fs::symlink(w.root.parent().unwrap(), &alias).unwrap();
    let mut other = w.writable_config();
    other.roots = vec![alias.join(w.root.file_name().unwrap())];
    w.open(other)
}

/// Runs one action in workflow `wf`, which must succeed.
fn act(sb: &ailab_sandbox_core::Sandbox, wf: &str, action: serde_json::Value) {
    let r = run(sb, json!({"workflow_id": wf, "actions": [action]}));
    assert_eq!(status(&r), "success", "{wf} {r:?}");
}

#[test]
fn a_change_between_two_of_a_workflows_writes_is_a_conflict() {
    let w = World::new();
    w.write("t.txt", b"original\n");
    let sb = w.sandbox();
    let put = |wf: &str, id: &str, text: &str| {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"action_id": id, "intent": "replace_file", "path": "t.txt", "content": text}]}),
        );
        assert_eq!(status(&r), "success");
    };
    put("wf_x", "x1", "A\n");
    put("wf_y", "y1", "OTHER\n");
    put("wf_x", "x2", "B\n");
    let rb = rollback(&sb, "wf_x", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(
        rb.conflicts[0].expected_checksum.as_deref(),
        Some(sha(b"A\n").as_str())
    );
    assert_eq!(
        rb.conflicts[0].current_checksum.as_deref(),
        Some(sha(b"OTHER\n").as_str())
    );
    // What the file holds is the workflow's own last write: the answer says where the
    // change was made, not that the file changed since.
    assert_eq!(rb.conflicts[0].action_id, "x1");
    assert_eq!(rb.conflicts[0].found_by_action.as_deref(), Some("x2"));
    let reason = rb.reason.as_deref().unwrap();
    assert!(
        reason.contains(
            "t.txt (between actions 'x1' and 'x2'; it holds what the workflow last wrote there)"
        ) && reason.contains("roll back the later of them alone first"),
        "{reason}"
    );

    assert_eq!(w.read("t.txt"), b"B\n", "nothing restored");
    let rb = rollback(&sb, "wf_x", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("t.txt"), b"original\n");
}

/// Workflow `wf`'s action `id` appending `line` to `f.txt`, its line timed a second
/// after whatever came before, as it would be.
fn append_later(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
    wf: &str,
    id: &str,
    line: &str,
) -> ailab_sandbox_core::executor::RunResult {
    w.clock.advance(chrono::Duration::seconds(1));
    run(
        sb,
        json!({"workflow_id": wf, "actions": [
            {"action_id": id, "intent": "append_file", "path": "f.txt", "content": line}]}),
    )
}

/// Workflows `wf_v1`, `wf_v2`, `wf_v3` each append a line to `f.txt` (holding `orig`), in
/// turn.
fn three_appends(w: &World, sb: &ailab_sandbox_core::Sandbox) {
    w.write("f.txt", b"orig\n");
    for (wf, line) in [("wf_v1", "w1\n"), ("wf_v2", "w2\n"), ("wf_v3", "w3\n")] {
        let r = append_later(w, sb, wf, "a1", line);
        assert_eq!(status(&r), "success", "{r:?}");
    }
}

/// Rolls the workflows back one after the other, a second apart, each going through.
fn rolled_back_in_turn(w: &World, sb: &ailab_sandbox_core::Sandbox, workflows: &[&str]) {
    for wf in workflows {
        w.clock.advance(chrono::Duration::seconds(1));
        assert_eq!(rollback(sb, wf, false).status, "rolled_back", "{wf}");
    }
}

/// What a conflict's `changed_by` says of the write of `action` (`workflow/action`).
fn write_by(action: &str) -> Option<ailab_sandbox_core::sandbox::ChangedBy> {
    Some(ailab_sandbox_core::sandbox::ChangedBy {
        action: action.to_owned(),
        rollback: false,
    })
}

/// The latest of other workflows' writes after this workflow's last one, which the file
/// holds, is named in the refusal (`changed_by`), with the way out that loses nothing:
/// roll that one back first, then the next, then this one.
#[test]
fn a_conflict_names_the_other_workflows_write_the_file_holds() {
    let w = World::new();
    let sb = w.sandbox();
    three_appends(&w, &sb);
    let rb = rollback(&sb, "wf_v1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_v3/a1"));
    let reason = rb.reason.as_deref().unwrap();
    assert!(
        reason.contains("f.txt (since the workflow's last write, written by 'wf_v3/a1')")
            && reason.contains("roll back the writes named first"),
        "{reason}"
    );
    rolled_back_in_turn(&w, &sb, &["wf_v3", "wf_v2", "wf_v1"]);
    assert_eq!(w.read("f.txt"), b"orig\n");
}

/// After a forced rollback of the first workflow (which took the later lines with it), a
/// later one's refusal names that rollback, says nothing of the workflow's write is left,
/// and does not send the caller to roll back what is already rolled back.
#[test]
fn a_conflict_names_the_other_workflows_rollback_that_took_the_write() {
    use ailab_sandbox_core::sandbox::ChangedBy;
    let w = World::new();
    let sb = w.sandbox();
    three_appends(&w, &sb);
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(rollback(&sb, "wf_v1", true).status, "rolled_back");
    assert_eq!(w.read("f.txt"), b"orig\n");
    let rb = rollback(&sb, "wf_v2", false);
    assert_eq!(
        rb.conflicts[0].changed_by,
        Some(ChangedBy {
            action: "wf_v1/a1".to_owned(),
            rollback: true
        }),
        "{rb:?}"
    );
    let reason = rb.reason.as_deref().unwrap();
    assert!(
        reason.contains("the rollback of 'wf_v1/a1' took it with it")
            && reason.contains("nothing of this workflow's write is left there")
            && !reason.contains("roll back the writes named first"),
        "{reason}"
    );
    // A write made over that rollback is not named: rolling it back would give back
    // what the rollback left, not what this workflow wrote.
    let r = append_later(&w, &sb, "wf_e", "a1", "e\n");
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = rollback(&sb, "wf_v2", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts[0].changed_by, None, "{rb:?}");
}

/// A later workflow's write rolled back since is taken out with its rollback: the write
/// that stands again is the one named. So is a write made after another workflow's write
/// failed and was undone (its undo line has no write line before it).
#[test]
fn a_conflict_names_the_write_that_stands_after_rollbacks_and_undone_failures() {
    let w = World::new();
    let sb = w.sandbox();
    three_appends(&w, &sb);
    rolled_back_in_turn(&w, &sb, &["wf_v3"]);
    let rb = rollback(&sb, "wf_v1", false);
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_v2/a1"), "{rb:?}");
    let (w, sb) = history(b"orig\n", &[]);
    for (wf, fails) in [("wf_v1", false), ("wf_z", true), ("wf_y", false)] {
        if fails {
            sb.failpoints().arm("before_registry", 1);
        }
        let r = append_later(&w, &sb, wf, "a1", "x\n");
        assert_eq!(
            status(&r),
            if fails { "rolled_back" } else { "success" },
            "{r:?}"
        );
    }
    let rb = rollback(&sb, "wf_v1", false);
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_y/a1"), "{rb:?}");
}

/// A change made without the runtime breaks the chain from the workflow's write to what
/// the file holds: no later workflow's write or rollback is named for it, since rolling
/// that back would not give this workflow back what it left.
#[test]
fn a_change_made_without_the_runtime_names_no_workflow() {
    let (w, sb) = history(b"orig\n", &[]);
    for wf in ["wf_v1", "wf_z"] {
        if wf == "wf_z" {
            w.write("f.txt", b"EXTERNAL EDIT\n");
        }
        let r = append_later(&w, &sb, wf, "a1", "x\n");
        assert_eq!(status(&r), "success", "{r:?}");
    }
    for undo_z in [false, true] {
        if undo_z {
            rolled_back_in_turn(&w, &sb, &["wf_z"]);
        }
        let rb = rollback(&sb, "wf_v1", false);
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
        assert_eq!(rb.conflicts[0].changed_by, None, "{rb:?}");
        assert!(
            !rb.reason.as_deref().unwrap().contains("wf_z"),
            "{:?}",
            rb.reason
        );
    }
}

/// The way out of a change between two of a workflow's writes, as the refusal gives it:
/// the later write alone, then the change named, then the workflow; nothing is lost.
#[test]
fn a_change_between_two_writes_is_undone_as_the_refusal_says() {
    let (w, sb) = history(b"orig\n", &[]);
    for (wf, id) in [("wf_a", "a1"), ("wf_b", "b1"), ("wf_a", "a2")] {
        let r = append_later(&w, &sb, wf, id, &format!("{id}\n"));
        assert_eq!(status(&r), "success", "{r:?}");
    }
    let rb = rollback(&sb, "wf_a", false);
    assert!(
        rb.reason
            .as_deref()
            .unwrap()
            .contains("roll back the later of them alone first"),
        "{rb:?}"
    );
    let later = RollbackOptions {
        action_id: Some("a2".to_owned()),
        ..RollbackOptions::default()
    };
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(sb.rollback_workflow("wf_a", &later).status, "rolled_back");
    let rb = rollback(&sb, "wf_a", false);
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_b/b1"), "{rb:?}");
    rolled_back_in_turn(&w, &sb, &["wf_b", "wf_a"]);
    assert_eq!(w.read("f.txt"), b"orig\n");
}

/// Workflow `wf`'s action `id` replacing `f.txt` with `text`, a second after whatever
/// came before; it must succeed.
fn replace_later(w: &World, sb: &ailab_sandbox_core::Sandbox, wf: &str, id: &str, text: &str) {
    write_later(w, sb, (wf, id), "f.txt", text);
}

/// [`replace_later`] at `path`, made when missing.
fn write_later(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
    (wf, id): (&str, &str),
    path: &str,
    text: &str,
) {
    w.clock.advance(chrono::Duration::seconds(1));
    let intent = if w.root.join(path).exists() {
        "replace_file"
    } else {
        "create_file"
    };
    let r = run(
        sb,
        json!({"workflow_id": wf, "actions": [
            {"action_id": id, "intent": intent, "path": path, "content": text}]}),
    );
    assert_eq!(status(&r), "success", "{wf} {r:?}");
}

/// A world whose `f.txt` held `start`, then was replaced by each of `writes` (workflow,
/// action, bytes) in turn, a second apart.
fn history(start: &[u8], writes: &[(&str, &str, &str)]) -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    w.write("f.txt", start);
    let sb = w.sandbox();
    for (wf, id, text) in writes {
        replace_later(&w, &sb, wf, id, text);
    }
    (w, sb)
}

/// Other workflows' writes since that came back to the very bytes the workflow left (X,
/// then Y, then X again) still stand: rolling the workflow back would undo the last of
/// them unseen. A conflict naming it, as for any other change; once they are rolled back
/// in turn, the workflow goes back too.
#[test]
fn writes_since_that_came_back_to_the_same_bytes_are_a_conflict() {
    let (w, sb) = history(b"v0\n", &[]);
    for (wf, text) in [("wf_1", "X\n"), ("wf_2", "Y\n"), ("wf_3", "X\n")] {
        replace_later(&w, &sb, wf, "a1", text);
    }
    let rb = rollback(&sb, "wf_1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    let c = &rb.conflicts[0];
    assert_eq!(c.changed_by, write_by("wf_3/a1"), "{rb:?}");
    assert_eq!(c.expected_checksum.as_deref(), Some(sha(b"X\n").as_str()));
    assert_eq!(c.current_checksum, c.expected_checksum);
    assert!(
        rb.reason.as_deref().unwrap().contains(
            "f.txt (since the workflow's last write, written over and back to the bytes it left, last by 'wf_3/a1')"
        ),
        "{rb:?}"
    );
    assert_eq!(w.read("f.txt"), b"X\n", "nothing restored");
    // The preview says the same.
    let info = sb.rollback_info("wf_1").unwrap();
    assert_eq!(info.conflicts, rb.conflicts);
    rolled_back_in_turn(&w, &sb, &["wf_3", "wf_2", "wf_1"]);
    assert_eq!(w.read("f.txt"), b"v0\n");
}

/// Another workflow's write back to what the action found (v0, X, v0) loses nothing to
/// the restore, which writes those bytes: no conflict, here or between two of the
/// workflow's writes.
#[test]
fn a_write_back_to_what_the_action_found_is_no_conflict() {
    for later_run in [false, true] {
        let (w, sb) = history(b"v0\n", &[("wf_1", "a1", "X\n"), ("wf_2", "b1", "v0\n")]);
        if later_run {
            replace_later(&w, &sb, "wf_1", "a2", "Z\n");
        }
        let rb = rollback(&sb, "wf_1", false);
        assert_eq!(rb.status, "rolled_back", "{later_run} {rb:?}");
        assert_eq!(w.read("f.txt"), b"v0\n");
    }
}

/// An action that wrote the very bytes it found (X over X) loses nothing to its restore,
/// whatever was written over and back since: no conflict, here or between two of the
/// workflow's writes.
#[test]
fn a_write_of_the_bytes_found_is_no_conflict_whatever_came_back() {
    for later_run in [false, true] {
        let (w, sb) = history(
            b"X\n",
            &[
                ("wf_a", "a1", "X\n"),
                ("wf_b", "b1", "Y\n"),
                ("wf_c", "c1", "X\n"),
            ],
        );
        if later_run {
            replace_later(&w, &sb, "wf_a", "a2", "Z\n");
        }
        let rb = rollback(&sb, "wf_a", false);
        assert_eq!(rb.status, "rolled_back", "{later_run} {rb:?}");
        assert_eq!(w.read("f.txt"), b"X\n");
    }
}

/// A newer write of the workflow that wrote the bytes it found (X over X) does not hide
/// what came back since from the older one's restore, which puts back what was there
/// before the workflow (v0): the rollback as a whole would undo the standing write.
#[test]
fn a_newer_write_of_the_bytes_found_does_not_hide_what_came_back() {
    let (w, sb) = history(b"v0\n", &[]);
    for (wf, id, text) in [
        ("wf_a", "a1", "X\n"),
        ("wf_a", "a2", "X\n"),
        ("wf_b", "b1", "Y\n"),
        ("wf_c", "c1", "X\n"),
    ] {
        replace_later(&w, &sb, wf, id, text);
    }
    assert_eq!(sb.rollback_info("wf_a").unwrap().conflicts.len(), 1);
    let rb = rollback(&sb, "wf_a", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_c/c1"), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"X\n", "nothing restored");
}

/// Writes recorded by another process whose root is spelt through a link, outside the
/// root or inside it (`root/up` → the root's parent, the root spelt `root/up/root`), are
/// the target's writes all the same: one that came back is a conflict, one that changed
/// the file is named.
#[test]
fn writes_under_another_spelling_of_the_root_count_wherever_its_link_is() {
    for (inside, came_back) in [(false, true), (true, true), (false, false), (true, false)] {
        let (w, sb) = history(b"v0\n", &[("wf_1", "a1", "X\n")]);
        let link = if inside {
            w.root.join("up")
        } else {
            w.tmp.path().join("up")
        };
        let case = format!("inside {inside}, came back {came_back}");
        conflict_under_another_spelling(&w, &sb, &link, "f.txt", came_back, &[], &case);
    }
}

/// The same for a file in a folder (its changes are looked for among those to files of
/// its name in folders of that folder's name): a write that came back, recorded under
/// another spelling of the root, is a conflict; writes to files of its name in other
/// folders, or in a folder of the same name elsewhere in the root, are not its changes.
#[test]
fn writes_under_another_spelling_of_a_file_in_a_folder_count_and_others_do_not() {
    for came_back in [true, false] {
        let w = World::new();
        let sb = w.sandbox();
        write_later(&w, &sb, ("wf_1", "a1"), "d/f.txt", "X\n");
        let link = w.tmp.path().join("up");
        let decoys = ["e/f.txt", "x/d/f.txt", "f.txt"];
        let case = format!("came back {came_back}");
        conflict_under_another_spelling(&w, &sb, &link, "d/f.txt", came_back, &decoys, &case);
    }
}

/// A write recorded under a spelling of its path the runtime never writes itself
/// (`d//f.txt`, `d/./f.txt`, a trailing `/`: a line from another tool, or edited) is the
/// file's change for a rollback's check as it is for recovery, which reads paths by
/// their components: here a write that came back, a conflict naming it.
#[test]
fn writes_recorded_under_another_spelling_of_the_path_beneath_the_root_count() {
    use ailab_sandbox_core::audit::{AuditLog, AuditRecord, AuditStatus};
    use ailab_sandbox_core::clock::Clock as _;
    use ailab_sandbox_core::hash::sha256_hex;
    for spelling in ["d//f.txt", "d/./f.txt", "d/f.txt/"] {
        let w = World::new();
        let sb = w.sandbox();
        write_later(&w, &sb, ("wf_1", "a1"), "d/f.txt", "X\n");
        let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
        let foreign = AuditLog::open(&state, false, 10).unwrap();
        let write = |(wf, id): (&str, &str), before: &[u8], after: &[u8]| {
            w.clock.advance(chrono::Duration::seconds(1));
            let line = AuditRecord {
                timestamp: ailab_sandbox_core::clock::timestamp(w.clock.now()),
                execution_id: format!("ex_{wf}"),
                workflow_id: wf.into(),
                action_id: id.into(),
                mutation_class: None,
                mutation_type: "replace_file".into(),
                target_path: format!("{}/{spelling}", w.root.display()),
                before_checksum: Some(sha256_hex(before)),
                after_checksum: Some(sha256_hex(after)),
                rollback_available: false,
                rollback_path: None,
                status: AuditStatus::Success,
                reason_code: None,
                error: None,
            };
            foreign.append(vec![line]).unwrap();
        };
        write(("wf_2", "b1"), b"X\n", b"Y\n");
        write(("wf_3", "c1"), b"Y\n", b"X\n");
        let rb = rollback(&sb, "wf_1", false);
        assert_eq!(
            rb.reason_code,
            Some(ReasonCode::Conflict),
            "{spelling}: {rb:?}"
        );
        assert_eq!(
            rb.conflicts[0].changed_by,
            write_by("wf_3/c1"),
            "{spelling}"
        );
        assert_eq!(w.read("d/f.txt"), b"X\n", "{spelling}: nothing restored");
    }
}

/// After `wf_1` wrote X at `path`: another process, its root spelt through `link` (a
/// link to the root's parent), writes Y there, then X again when `came_back`, then X at
/// each of `decoys`; `wf_1`'s rollback is then a conflict naming the last write of
/// `path`, and restores nothing.
fn conflict_under_another_spelling(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
    link: &std::path::Path,
    path: &str,
    came_back: bool,
    decoys: &[&str],
    case: &str,
) {
    std::os::unix::fs::symlink(w.root.parent().unwrap(), link).unwrap();
    let mut other = w.writable_config();
    other.roots = vec![link.join(w.root.file_name().unwrap())];
    let sb2 = w.open(other);
    write_later(w, &sb2, ("wf_2", "b1"), path, "Y\n");
    if came_back {
        write_later(w, &sb2, ("wf_3", "c1"), path, "X\n");
    }
    // Files of its name elsewhere, last of all: none of them is the file's change.
    for (i, decoy) in decoys.iter().enumerate() {
        write_later(w, &sb2, ("wf_4", &format!("o{i}")), decoy, "X\n");
    }
    drop(sb2);
    let rb = rollback(sb, "wf_1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{case}: {rb:?}");
    let by = if came_back { "wf_3/c1" } else { "wf_2/b1" };
    assert_eq!(rb.conflicts[0].changed_by, write_by(by), "{case}: {rb:?}");
    let now: &[u8] = if came_back { b"X\n" } else { b"Y\n" };
    assert_eq!(w.read(path), now, "{case}: nothing restored");
}

/// A recorded write that stands is not undone unseen because the trail cannot say who
/// left the bytes (a change made without the runtime breaks the chain), nor because its
/// line cannot be read: the first is a conflict naming nobody, the second a refusal
/// saying why.
#[test]
fn a_write_back_is_a_conflict_whoever_left_the_bytes_and_refused_when_unreadable() {
    let (w, sb) = history(b"v0\n", &[("wf_1", "a1", "X\n")]);
    w.write("f.txt", b"Y\n");
    replace_later(&w, &sb, "wf_3", "c1", "X\n");
    let rb = rollback(&sb, "wf_1", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts[0].changed_by, None, "{rb:?}");
    assert!(
        rb.reason.as_deref().unwrap().contains(
            "f.txt (since the workflow's last write, written over and back to the bytes it left)"
        ),
        "{rb:?}"
    );
    // wf_3's line changed in place, its length kept: it no longer reads as indexed.
    let trail = w.state.join("sandbox_audit.jsonl");
    let text = std::fs::read_to_string(&trail).unwrap();
    let changed = text.replacen("\"workflow_id\":\"wf_3\"", "\"workflow_id\":\"wf_9\"", 1);
    assert_ne!(changed, text);
    std::fs::write(&trail, changed).unwrap();
    let rb = rollback(&sb, "wf_1", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_ne!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert!(
        rb.reason.as_deref().unwrap().contains("audit verify"),
        "{rb:?}"
    );
    assert_eq!(w.read("f.txt"), b"X\n", "nothing restored");
}

/// The same between two of a workflow's own writes: the older one is a conflict although
/// the later one found its bytes; once the later one is rolled back alone, the refusal
/// names the write that came back to them.
#[test]
fn writes_between_two_of_a_workflows_that_came_back_to_its_bytes_are_a_conflict() {
    let (w, sb) = history(b"v0\n", &[]);
    for (wf, id, text) in [
        ("wf_a", "a1", "X\n"),
        ("wf_b", "b1", "Y\n"),
        ("wf_c", "c1", "X\n"),
        ("wf_a", "a2", "Z\n"),
    ] {
        replace_later(&w, &sb, wf, id, text);
    }
    let rb = rollback(&sb, "wf_a", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(rb.conflicts[0].action_id, "a1");
    assert_eq!(rb.conflicts[0].found_by_action.as_deref(), Some("a2"));
    assert_eq!(w.read("f.txt"), b"Z\n", "nothing restored");
    w.clock.advance(chrono::Duration::seconds(1));
    assert_eq!(
        rollback_action(&sb, "wf_a", "a2", false).status,
        "rolled_back"
    );
    let rb = rollback(&sb, "wf_a", false);
    assert_eq!(rb.conflicts[0].changed_by, write_by("wf_c/c1"), "{rb:?}");
    rolled_back_in_turn(&w, &sb, &["wf_c", "wf_b", "wf_a"]);
    assert_eq!(w.read("f.txt"), b"v0\n");
}

/// A directory an action created is compared like a file: replaced by a file, or
/// holding something the rollback does not remove, it is a conflict found before
/// anything is restored; one the action found and that is gone since is made again.
#[test]
fn directories_are_checked_before_anything_is_restored() {
    let w = World::new();
    w.write("f.txt", b"old\n");
    std::fs::create_dir(w.path("kept")).unwrap();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_d", "actions": [
            {"action_id": "a1", "intent": "create_directory", "path": "k/l"},
            {"action_id": "a2", "intent": "create_file", "path": "k/l/mine.txt", "content": "mine\n"},
            {"action_id": "a3", "intent": "replace_file", "path": "f.txt", "content": "new\n"},
            {"action_id": "a4", "intent": "create_directory", "path": "kept"}]}),
    );
    assert_eq!(status(&r), "success");

    // Someone else's file in the created directory.
    w.write("k/l/user.txt", b"user data\n");
    let rb = rollback(&sb, "wf_d", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(rb.conflicts[0].action_id, "a1");
    assert_eq!(w.read("f.txt"), b"new\n", "nothing restored");
    std::fs::remove_file(w.path("k/l/user.txt")).unwrap();

    // The created directory replaced by a file (moved away, and back after: one made
    // anew is another directory, whatever inode number it happens to get).
    std::fs::rename(w.path("k/l"), w.path("l.away")).unwrap();
    w.write("k/l", b"precious\n");
    let rb = rollback(&sb, "wf_d", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert!(rb.conflicts.iter().any(|c| c.action_id == "a1"), "{rb:?}");
    assert_eq!(w.read("k/l"), b"precious\n");
    std::fs::remove_file(w.path("k/l")).unwrap();
    std::fs::rename(w.path("l.away"), w.path("k/l")).unwrap();

    // A directory the action found, removed since.
    std::fs::remove_dir(w.path("kept")).unwrap();
    let rb = rollback(&sb, "wf_d", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(rb.conflicts[0].action_id, "a4");
    let rb = rollback(&sb, "wf_d", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(w.path("kept").is_dir(), "made again");
    assert!(!w.path("k").exists());
    assert_eq!(w.read("f.txt"), b"old\n");
}

/// Rolling back an action twice names the action, not the whole workflow.
#[test]
fn an_action_rolled_back_twice_is_named() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf1", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "x.txt", "content": "1\n"},
            {"action_id": "a2", "intent": "append_file", "path": "x.txt", "content": "2\n"}]}),
    );
    assert_eq!(
        rollback_action(&sb, "wf1", "a2", false).status,
        "rolled_back"
    );
    let again = rollback_action(&sb, "wf1", "a2", false);
    assert_eq!(again.reason_code, Some(ReasonCode::NoRollbackData));
    assert_eq!(
        again.reason.as_deref(),
        Some(
            "action 'a2' of workflow 'wf1' was already rolled back (by an earlier rollback, at once when its action failed, or by the recovery of an interrupted run); nothing is left to roll back"
        )
    );
    assert_eq!(rollback(&sb, "wf1", false).status, "rolled_back");
    assert!(!w.path("x.txt").exists());
}

/// A rollback removes the directories its actions created only when they are empty: a
/// directory holding someone else's file stays.
#[test]
fn a_directory_holding_someone_elses_file_stays() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "m/n/a.txt", "content": "a"}]}),
    );
    assert_eq!(status(&r), "success");
    w.write("m/user.txt", b"mine\n");
    assert_eq!(rollback(&sb, "wf_m", false).status, "rolled_back");
    assert!(!w.path("m/n").exists());
    assert_eq!(w.read("m/user.txt"), b"mine\n");
}

/// A directory one workflow's write created, left by its rollback because another
/// workflow wrote beneath it, goes once that one is rolled back too, in another process
/// as much as in this one; a directory of the same name made since stays.
#[test]
fn a_directory_left_for_another_workflows_file_goes_with_it() {
    let w = World::new();
    let before = w.tree();
    let write = |sb: &ailab_sandbox_core::Sandbox, wf: &str, path: &str| {
        act(
            sb,
            wf,
            json!({"intent": "create_file", "path": path, "content": "x"}),
        );
    };
    let sb = w.sandbox();
    write(&sb, "wf_a", "fd/deep/x.txt");
    write(&sb, "wf_b", "fd/y.txt");
    assert_eq!(rollback(&sb, "wf_a", false).status, "rolled_back");
    assert!(!w.path("fd/deep").exists());
    assert!(w.path("fd").is_dir(), "wf_b's file keeps it");
    drop(sb);
    let sb = w.sandbox();
    assert_eq!(rollback(&sb, "wf_b", false).status, "rolled_back");
    assert_eq!(
        w.tree(),
        before,
        "every workflow rolled back: the tree as it was"
    );

    // Left again, then removed by someone and made anew: not the directory that was left.
    write(&sb, "wf_c", "gd/x.txt");
    write(&sb, "wf_d", "gd/y.txt");
    assert_eq!(rollback(&sb, "wf_c", false).status, "rolled_back");
    std::fs::remove_file(w.path("gd/y.txt")).unwrap();
    std::fs::remove_dir(w.path("gd")).unwrap();
    std::fs::create_dir(w.path("gd")).unwrap();
    w.write("gd/y.txt", b"x");
    assert_eq!(rollback(&sb, "wf_d", true).status, "rolled_back");
    assert!(w.path("gd").is_dir(), "made by someone else since");
}

/// Another program that changes a file between a rollback's check of it and its
/// restore keeps its change: the step fails with `conflict` and the file stays as that
/// program left it, whether the restore would have rewritten it or removed it.
#[test]
fn a_change_made_while_a_rollback_runs_is_never_undone_unseen() {
    for (existing, action) in [
        (
            true,
            json!({"intent": "append_file", "path": "log.md", "content": "mine\n"}),
        ),
        (
            false,
            json!({"intent": "create_file", "path": "log.md", "content": "mine\n"}),
        ),
    ] {
        let w = World::new();
        let sb = w.sandbox();
        if existing {
            w.write("log.md", b"one\n");
        }
        let r = run(&sb, json!({"workflow_id": "wf_r", "actions": [action]}));
        assert_eq!(status(&r), "success");
        sb.failpoints().interleave(
            "during_restore",
            another_program_appends(w.path("log.md"), b"theirs\n"),
        );
        let rb = rollback(&sb, "wf_r", false);
        assert_eq!(rb.status, "failed", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
        let expected: &[u8] = if existing {
            b"one\nmine\ntheirs\n"
        } else {
            b"mine\ntheirs\n"
        };
        assert_eq!(w.read("log.md"), expected);
        // Forced, the rollback restores over the change it has now seen.
        let rb = rollback(&sb, "wf_r", true);
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert_eq!(w.path("log.md").exists(), existing);
    }
}

/// A directory another workflow's create_directory found, and so made its result, is
/// not removed by the rollback of the workflow that made it (refused as a `conflict`
/// when it is that workflow's own create_directory, kept when it made it as a parent)
/// nor by a later clean-up of left directories; once that create_directory is rolled
/// back too, it goes, and the tree is as it was.
#[test]
fn a_directory_another_create_directory_relies_on_stays_until_that_one_goes() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    // Made as a parent, then left by the rollback for another workflow's file.
    share_a_new_dir(&sb, "d");
    assert_eq!(rollback(&sb, "wf_a", false).status, "rolled_back");
    act(
        &sb,
        "wf_d",
        json!({"intent": "create_directory", "path": "d"}),
    );
    assert_eq!(rollback(&sb, "wf_b", false).status, "rolled_back");
    assert!(w.path("d").is_dir(), "wf_d's result");
    assert_eq!(rollback(&sb, "wf_d", false).status, "rolled_back");
    assert_eq!(w.tree(), before);

    // Made by create_directory, then found by another one.
    act(
        &sb,
        "wf_e",
        json!({"intent": "create_directory", "path": "e"}),
    );
    act(
        &sb,
        "wf_f",
        json!({"intent": "create_directory", "path": "e"}),
    );
    let rb = rollback(&sb, "wf_e", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    let reason = rb.reason.as_deref().unwrap();
    assert!(
        reason.contains("result of create_directory wf_f/")
            && reason.contains("roll that back first"),
        "{reason}"
    );
    assert_eq!(rb.conflicts[0].claimed_by.len(), 1, "{rb:?}");
    assert!(w.path("e").is_dir());
    assert_eq!(rollback(&sb, "wf_f", false).status, "rolled_back");
    assert!(w.path("e").is_dir(), "wf_e's, not wf_f's to remove");
    assert_eq!(rollback(&sb, "wf_e", false).status, "rolled_back");
    assert_eq!(w.tree(), before);

    // Made as a parent, then found: kept by the rollback, gone with the finder's.
    act(
        &sb,
        "wf_g",
        json!({"intent": "create_file", "path": "g/x.txt", "content": "x"}),
    );
    act(
        &sb,
        "wf_h",
        json!({"intent": "create_directory", "path": "g"}),
    );
    assert_eq!(rollback(&sb, "wf_g", false).status, "rolled_back");
    assert!(w.path("g").is_dir(), "wf_h's result");
    assert!(!w.path("g/x.txt").exists());
    assert_eq!(rollback(&sb, "wf_h", false).status, "rolled_back");
    assert_eq!(w.tree(), before);

    // A directory the workflow made as a parent and another found, beneath one it made
    // with create_directory: refused before anything is restored; forced, both stay
    // until the finder is rolled back.
    let r = run(
        &sb,
        json!({"workflow_id": "wf_n", "actions": [
            {"intent": "create_directory", "path": "n"},
            {"intent": "create_file", "path": "n/b/f.txt", "content": "f"}]}),
    );
    assert_eq!(status(&r), "success");
    act(
        &sb,
        "wf_m",
        json!({"intent": "create_directory", "path": "n/b"}),
    );
    let rb = rollback(&sb, "wf_n", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert!(
        rb.reason
            .as_deref()
            .unwrap()
            .contains("result of create_directory wf_m/"),
        "{rb:?}"
    );
    assert!(
        rb.conflicts.iter().any(|c| !c.claimed_by.is_empty()),
        "{rb:?}"
    );
    assert!(w.path("n/b/f.txt").exists(), "nothing restored");
    let rb = rollback(&sb, "wf_n", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("n/b/f.txt").exists());
    assert!(w.path("n/b").is_dir(), "wf_m's result");
    assert_eq!(rollback(&sb, "wf_m", false).status, "rolled_back");
    assert_eq!(w.tree(), before);
}

/// A create_directory recorded by a process that names the root another way (through a
/// symlink above it) keeps the directory all the same.
#[test]
fn a_claim_recorded_under_another_spelling_of_the_root_counts() {
    let w = World::new();
    let sb = w.sandbox();
    act(
        &sb,
        "wf_a",
        json!({"intent": "create_file", "path": "a/f.txt", "content": "f"}),
    );
    let aliased = aliased_sandbox(&w);
    act(
        &aliased,
        "wf_b",
        json!({"intent": "create_directory", "path": "a"}),
    );
    drop(aliased);
    assert_eq!(rollback(&sb, "wf_a", false).status, "rolled_back");
    assert!(!w.path("a/f.txt").exists());
    assert!(w.path("a").is_dir(), "wf_b's result");
    // Rolled back under the other spelling, the claim is withdrawn all the same.
    assert_eq!(rollback(&sb, "wf_b", false).status, "rolled_back");
    assert!(!w.path("a").exists());
}

/// A claim recorded before a directory was made again counts against none of its later
/// makers: it named the earlier directory, since gone.
#[test]
fn a_claim_on_a_directory_since_made_again_does_not_bind_its_new_maker() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    let make = |wf: &str| {
        act(&sb, wf, json!({"intent": "create_directory", "path": "d"}));
        w.clock.advance(chrono::Duration::seconds(1));
    };
    make("wf_1");
    std::fs::remove_dir(w.path("d")).unwrap();
    make("wf_3");
    // wf_1's rollback would remove wf_3's directory: refused, naming it.
    let rb = rollback(&sb, "wf_1", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert!(rb.reason.as_deref().unwrap().contains("wf_3/"), "{rb:?}");
    // wf_3's rollback is not bound by wf_1's older claim.
    assert_eq!(rollback(&sb, "wf_3", false).status, "rolled_back");
    // wf_1's directory is gone (removed by another program): a change, as ever.
    let rb = rollback(&sb, "wf_1", false);
    assert!(
        rb.conflicts.iter().all(|c| c.claimed_by.is_empty()),
        "{rb:?}"
    );
    assert_eq!(rollback(&sb, "wf_1", true).status, "rolled_back");
    assert_eq!(w.tree(), before);
}

/// A file another program puts into a directory a workflow made, between the
/// rollback's check and the directory's removal, is a change the rollback never saw:
/// unforced, a `conflict`, and the file stays.
#[test]
fn a_file_put_into_a_made_directory_while_a_rollback_runs_is_a_conflict() {
    let w = World::new();
    let sb = w.sandbox();
    act(
        &sb,
        "wf_q",
        json!({"intent": "create_directory", "path": "q"}),
    );
    let path = w.path("q/x.txt");
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || std::fs::write(&path, b"theirs").unwrap()),
    );
    let rb = rollback(&sb, "wf_q", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("q/x.txt"), b"theirs");
    // Forced, the directory is left in place with the file, on the ledger, and the
    // trail's line says so.
    let rb = rollback(&sb, "wf_q", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("q/x.txt"), b"theirs");
    let last = &sb.audit_entries(1, Some("wf_q")).unwrap()[0];
    assert_eq!(
        last.status,
        ailab_sandbox_core::audit::AuditStatus::RolledBack,
        "{last:?}"
    );
    assert!(
        last.error
            .as_deref()
            .is_some_and(|e| e.starts_with("left in place: ")),
        "{last:?}"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// Directories left by a process that names the root another way are found by one that
/// names it plainly.
#[test]
fn a_left_directory_recorded_under_another_spelling_of_the_root_goes() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    let aliased = aliased_sandbox(&w);
    share_a_new_dir(&aliased, "d");
    assert_eq!(rollback(&aliased, "wf_a", false).status, "rolled_back");
    drop(aliased);
    assert_eq!(rollback(&sb, "wf_b", false).status, "rolled_back");
    assert_eq!(w.tree(), before);
}

/// A rollback that dies between a restore that had to leave a directory (another
/// workflow's file is in it) and that step's records still gets the directory on the
/// ledger, by the restore itself or by the next start's recovery: rolling back the other
/// workflow then leaves the tree as it was.
#[test]
fn a_directory_left_by_a_rollback_that_died_is_not_forgotten() {
    for point in ["after_restore", "after_mark"] {
        let w = World::new();
        let before = w.tree();
        let sb = w.sandbox();
        share_a_new_dir(&sb, "d/e");
        sb.failpoints().arm_crash(point, 1);
        rollback_dies(
            sb,
            "wf_a",
            false,
            &format!("{point}: the rollback should die"),
        );
        let sb = w.sandbox();
        assert!(!w.path("d/e/a.txt").exists(), "{point}");
        assert_eq!(
            rollback(&sb, "wf_b", false).status,
            "rolled_back",
            "{point}"
        );
        assert_eq!(w.tree(), before, "{point}");
    }
}

/// A rollback that dies after its last restore, before it removed the directories that
/// restore emptied, has them removed by the next start's recovery.
#[test]
fn directories_a_dead_rollback_emptied_go_at_the_next_start() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    share_a_new_dir(&sb, "fd/sub");
    assert_eq!(rollback(&sb, "wf_a", false).status, "rolled_back");
    sb.failpoints().arm_crash("after_mark", 1);
    rollback_dies(sb, "wf_b", false, "the rollback should die");
    assert!(w.path("fd/sub").is_dir(), "left by the dead rollback");
    let _next = w.sandbox();
    assert_eq!(w.tree(), before);
}

/// A directory the workflow created and then named again (its second action found it)
/// is still checked for others' files before anything is restored.
#[test]
fn an_older_directory_creation_is_checked_too() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_dd", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "f1.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_directory", "path": "d"}]}),
    );
    assert_eq!(status(&r), "success");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_dd", "actions": [{"action_id": "a3", "intent": "create_directory", "path": "d"}]}),
    );
    assert_eq!(status(&r), "success");
    w.write("d/user.txt", b"user\n");
    let rb = rollback(&sb, "wf_dd", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert!(rb.conflicts.iter().any(|c| c.action_id == "a2"), "{rb:?}");
    assert!(w.path("f1.txt").exists(), "nothing restored");
}

/// A directory an action created and a single-action rollback removed, made again by
/// someone else since, is not the workflow's to remove.
#[test]
fn a_directory_made_again_by_others_is_kept() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_c", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/x.txt", "content": "x"},
            {"action_id": "a2", "intent": "create_file", "path": "y.txt", "content": "y"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(
        rollback_action(&sb, "wf_c", "a1", false).status,
        "rolled_back"
    );
    assert!(!w.path("d").exists());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_other", "actions": [{"intent": "create_directory", "path": "d"}]}),
    );
    assert_eq!(status(&r), "success");
    assert_eq!(rollback(&sb, "wf_c", false).status, "rolled_back");
    assert!(w.path("d").is_dir(), "wf_other's directory");
    assert_eq!(rollback(&sb, "wf_other", false).status, "rolled_back");
    assert!(!w.path("d").exists());
}

/// The names in the root's snapshot store but its owner record.
fn store_folders(w: &World) -> Vec<String> {
    std::fs::read_dir(w.root.join(".rollback"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".ailab-owner")
        .collect()
}

/// A workflow whose prune fails is reported as such, not counted among those kept, and
/// does not stop the others; the next prune finishes what it left.
#[test]
fn a_prune_that_fails_is_reported_and_finished_later() {
    let w = World::new();
    let sb = w.sandbox();
    ten_days_old(&w, &sb, &["wf_p1", "wf_p2"]);
    sb.failpoints().arm("during_prune", 1);
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_p2"], "{report:?}");
    assert_eq!(report.workflows_kept, 0, "{report:?}");
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    let failed = &report.workflows_failed[0];
    assert_eq!(failed.workflow_id, "wf_p1");
    assert_eq!(failed.reason_code, ReasonCode::IoError);
    assert!(failed.reason.contains("during_prune"), "{}", failed.reason);
    let again = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert!(again.workflows_failed.is_empty(), "{again:?}");
    assert!(store_folders(&w).is_empty(), "{:?}", store_folders(&w));
}

/// A prune of more workflows than it takes at once (32) prunes them all; one whose
/// removal fails in the third batch is reported alone and finished by the next prune;
/// and their locks are let go (a run of a pruned workflow goes through).
#[test]
fn a_prune_of_more_workflows_than_a_batch_prunes_them_all() {
    let w = World::new();
    let sb = w.sandbox();
    let ids: Vec<String> = (0..70).map(|n| format!("wf_{n:02}")).collect();
    ten_days_old(&w, &sb, &ids);
    // The removals of the first two batches pass it 64 times; this is the third's third.
    sb.failpoints().arm("during_prune", 67);
    let week = std::time::Duration::from_secs(7 * 86_400);
    let report = sb.prune(week).unwrap();
    assert_eq!(report.workflows_pruned.len(), 69, "{report:?}");
    assert_eq!(report.workflows_failed.len(), 1, "{report:?}");
    assert_eq!(report.workflows_failed[0].workflow_id, "wf_66");
    let inflight = w.state.join("inflight");
    for wf in &report.workflows_pruned {
        assert!(inflight.join(format!("{wf}.pruned")).exists(), "{wf}");
        assert!(!inflight.join(format!("{wf}.json")).exists(), "{wf}");
    }
    let left = store_folders(&w);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(".ailab-pruned-"), "{left:?}");
    let again = sb.prune(week).unwrap();
    assert!(again.workflows_failed.is_empty(), "{again:?}");
    assert!(store_folders(&w).is_empty(), "{:?}", store_folders(&w));
    let r = run(
        &sb,
        json!({"workflow_id": "wf_00", "actions": [{"intent": "create_file", "path": "after.txt", "content": "a"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Prune marks not made durable remove nothing: every workflow of the batch is reported
/// failed and keeps its snapshots, but the marks stand, so the writes they cover count
/// as pruned (a rollback names them and leaves them), and the next prune removes their
/// snapshots; one written to since is kept young by it, and its later write rolls back
/// with the workflow (the rollback was refused as "a prune stopped half way").
#[test]
fn a_prune_whose_marks_cannot_be_synced_removes_nothing() {
    let w = World::new();
    let sb = w.sandbox();
    ten_days_old(&w, &sb, &["wf_s1", "wf_s2"]);
    sb.failpoints().arm("sync_prune_marks", 1);
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert!(report.workflows_pruned.is_empty(), "{report:?}");
    let failed: Vec<_> = report
        .workflows_failed
        .iter()
        .map(|f| (f.workflow_id.as_str(), f.reason_code))
        .collect();
    assert_eq!(
        failed,
        [
            ("wf_s1", ReasonCode::IoError),
            ("wf_s2", ReasonCode::IoError)
        ]
    );
    let why = &report.workflows_failed[0].reason;
    assert!(
        why.starts_with("could not make the prune's mark durable:")
            && why.contains("the writes the mark covers count as pruned"),
        "{report:?}"
    );
    for wf in ["wf_s1", "wf_s2"] {
        assert!(w.root.join(".rollback").join(wf).is_dir(), "{wf}");
        let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
        assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
        assert!(
            rb.reason
                .as_deref()
                .unwrap_or("")
                .contains("1 write(s) had their snapshots pruned"),
            "{rb:?}"
        );
        assert!(w.path(&format!("{wf}.txt")).exists(), "{wf}");
    }
    let later = json!({"workflow_id": "wf_s2", "actions": [
        {"action_id": "later", "intent": "create_file", "path": "later.txt", "content": "l"}]});
    assert_eq!(status(&run(&sb, later)), "success");
    let again = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(again.workflows_pruned, ["wf_s1"], "{again:?}");
    assert_eq!(again.workflows_kept, 1, "{again:?}");
    assert!(!w.root.join(".rollback/wf_s1").exists());
    let rb = sb.rollback_workflow("wf_s2", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1, "{rb:?}");
    assert!(!w.root.join("later.txt").exists());
    assert!(w.path("wf_s2.txt").exists());
}

/// Workflows `ids`, each having written `{id}.txt`, ten days old.
fn ten_days_old(w: &World, sb: &ailab_sandbox_core::Sandbox, ids: &[impl AsRef<str>]) {
    for wf in ids {
        let wf = wf.as_ref();
        let r = run(
            sb,
            json!({"workflow_id": wf, "actions": [{"intent": "create_file", "path": format!("{wf}.txt"), "content": "p"}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    w.clock.advance(chrono::Duration::days(10));
}

/// An action id stays used once the trail records its write, even after its snapshot is
/// pruned or removed from `.rollback/`: a new write under the same id would give the
/// rollback a snapshot that stands for the old one, and it would report success with the
/// old file left in place.
#[test]
fn an_action_id_stays_used_after_its_snapshot_is_gone() {
    let w = World::new();
    let sb = w.sandbox();
    let create = |wf: &str, id: &str, path: &str| {
        run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"action_id": id, "intent": "create_file", "path": path, "content": "x"}]}),
        )
    };
    // Removed by hand.
    assert_eq!(status(&create("wf_gone", "a1", "m.txt")), "success");
    std::fs::remove_dir_all(w.root.join(".rollback/wf_gone")).unwrap();
    let r = create("wf_gone", "a1", "m2.txt");
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_id"), "{r:?}");
    assert!(!w.path("m2.txt").exists());
    let rb = rollback(&sb, "wf_gone", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    assert!(w.path("m.txt").exists());

    // Pruned: the id stays used; a new id works, and its write rolls back alone.
    assert_eq!(status(&create("wf_r", "a1", "p.txt")), "success");
    w.clock.advance(chrono::Duration::days(10));
    let report = sb
        .prune(std::time::Duration::from_secs(7 * 86_400))
        .unwrap();
    assert_eq!(report.workflows_pruned, ["wf_r"]);
    let r = create("wf_r", "a1", "q.txt");
    assert_eq!(code(&r, 0).as_deref(), Some("invalid_id"), "{r:?}");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [{"action_id": "a2", "intent": "create_directory", "path": "dd"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = rollback(&sb, "wf_r", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("dd").exists());
    assert!(w.path("p.txt").exists(), "pruned: no longer reversible");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A directory an action made that its single-action rollback had to leave, because a
/// later action's file was in it, goes once that action is rolled back too: the tree
/// ends as it was. One made again since by another workflow is not the one left.
#[test]
fn a_directory_an_earlier_rollback_left_goes_with_the_last_file_in_it() {
    let w = World::new();
    let sb = w.sandbox();
    let before = w.tree();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_l", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d1/d2/x.txt", "content": "x"},
            {"action_id": "a2", "intent": "create_file", "path": "d1/y.txt", "content": "y"},
            {"action_id": "a3", "intent": "create_file", "path": "e/z.txt", "content": "z"},
            {"action_id": "a4", "intent": "create_file", "path": "e/w.txt", "content": "w"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let one = |a: &str| rollback_action(&sb, "wf_l", a, false);
    assert_eq!(one("a1").status, "rolled_back");
    assert!(!w.path("d1/d2").exists());
    assert!(w.path("d1/y.txt").exists(), "a2's file keeps d1");
    assert_eq!(one("a2").status, "rolled_back");
    assert!(!w.path("d1").exists(), "left by a1's rollback, empty now");

    // e is left by a3's rollback, then moved away (so that its inode cannot be reused)
    // and made again by someone else.
    assert_eq!(one("a3").status, "rolled_back");
    std::fs::rename(w.path("e"), w.path("e_moved")).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [{"intent": "create_directory", "path": "e"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = rollback_action(&sb, "wf_l", "a4", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(
        w.path("e").is_dir(),
        "wf_m's directory, not the one a3 left"
    );
    assert_eq!(rollback(&sb, "wf_m", false).status, "rolled_back");
    std::fs::remove_file(w.path("e_moved/w.txt")).unwrap();
    std::fs::remove_dir(w.path("e_moved")).unwrap();
    assert_eq!(w.tree(), before);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback whose audit line cannot be written restores the files but says it failed,
/// and leaves its record for recovery: the next use of the workflow audits the restore,
/// so the trail ends up saying what happened.
#[test]
fn a_rollback_the_trail_could_not_record_is_recorded_later() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_n", "actions": [{"action_id": "a1", "intent": "create_file", "path": "n.txt", "content": "n"}]}),
    );
    assert_eq!(status(&r), "success");
    sb.failpoints().arm("after_mark", 1);
    let rb = rollback(&sb, "wf_n", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1);
    assert_eq!(rb.reason_code, Some(ReasonCode::IoError));
    assert!(
        rb.reason.as_deref().unwrap().contains("could not record"),
        "{rb:?}"
    );
    assert!(!w.path("n.txt").exists(), "restored all the same");
    assert_eq!(audit_statuses(&sb, "wf_n"), ["success"]);
    let again = rollback(&sb, "wf_n", false);
    assert_eq!(
        again.reason_code,
        Some(ReasonCode::NoRollbackData),
        "{again:?}"
    );
    let mut seen = audit_statuses(&sb, "wf_n");
    seen.sort();
    // The second rollback, refused, is on the trail as blocked.
    assert_eq!(seen, ["blocked", "rolled_back", "success"]);
    assert!(sb.audit_verify().unwrap().ok);
}

/// Restores the trail could not record then are recorded later in the order they were
/// made (newest action first), so that the trail, read in order, leaves each file as the
/// restores did: recorded oldest first, it said a file created and then changed by the
/// workflow was left holding the created bytes, while it was gone.
#[test]
fn restores_recorded_later_keep_the_order_they_were_made_in() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "n.txt", "content": "one"},
        {"action_id": "a2", "intent": "replace_file", "path": "n.txt", "content": "two"},
        {"action_id": "a3", "intent": "create_file", "path": "m.txt", "content": "m"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(w.state.join("sandbox_audit.jsonl"))
        .unwrap();
    log.lock().unwrap();
    let rb = rollback(&sb, "wf_o", false);
    log.unlock().unwrap();
    assert_eq!(rb.steps_rolled_back, 3, "{rb:?}");
    assert!(w.tree().is_empty(), "restored all the same");
    assert_eq!(audit_statuses(&sb, "wf_o"), ["success"; 3]);
    // The next use of the workflow records them.
    let again = rollback(&sb, "wf_o", false);
    assert_eq!(
        again.reason_code,
        Some(ReasonCode::NoRollbackData),
        "{again:?}"
    );
    // In the trail's order (the list is newest first).
    let undone: Vec<(String, Option<String>)> = sb
        .audit_entries(100, Some("wf_o"))
        .unwrap()
        .into_iter()
        .rev()
        .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
        .map(|e| (e.action_id, e.after_checksum))
        .collect();
    let ids: Vec<&str> = undone.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(ids, ["a3", "a2", "a1"]);
    assert_eq!(undone[2].1, None, "n.txt's last line: removed");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A world where workflow `wf` created f.txt ("A", action a1), then g.txt ("G", a2): its
/// rollback restores g.txt first.
fn f_then_g(wf: &str) -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": wf, "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "f.txt", "content": "A"},
            {"action_id": "a2", "intent": "create_file", "path": "g.txt", "content": "G"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    (w, sb)
}

/// A rollback holds every target's lock from its conflict check to its last restore: a
/// writer of another workflow (here another `Sandbox`, as another process would be) who
/// comes between two restores waits, then writes on the finished rollback's result.
/// Without the locks the writer landed on a file the rollback had still to restore, and
/// the rollback stopped there with a conflict, half done.
#[test]
fn a_writer_waits_for_a_rollback_to_finish() {
    let (w, sb) = f_then_g("wf_rb");
    let other = std::sync::Arc::new(w.sandbox());
    let writer: std::sync::Arc<std::sync::Mutex<Option<std::thread::JoinHandle<_>>>> =
        Default::default();
    // After g.txt's restore, before f.txt's.
    sb.failpoints().interleave("after_restore", {
        let (other, writer) = (other.clone(), writer.clone());
        std::sync::Arc::new(move || {
            let other = other.clone();
            *writer.lock().unwrap() = Some(std::thread::spawn(move || {
                run(
                    &other,
                    json!({"workflow_id": "wf_other", "actions": [
                        {"intent": "append_file", "path": "f.txt", "content": "B"}]}),
                )
            }));
            // Time for the writer to land, if it could.
            std::thread::sleep(std::time::Duration::from_millis(300));
        })
    });
    let rb = rollback(&sb, "wf_rb", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 2);
    let theirs = writer.lock().unwrap().take().unwrap().join().unwrap();
    assert_eq!(status(&theirs), "success", "{theirs:?}");
    assert_eq!(w.read("f.txt"), b"B", "appended to the fully restored tree");
    assert!(!w.path("g.txt").exists());
    assert!(sb.audit_verify().unwrap().ok);
}

/// A change made without the runtime (no lock) between two restores stops the rollback
/// at that file, and the report names it among the conflicts.
#[test]
fn a_conflict_met_during_a_rollback_is_named() {
    let (w, sb) = f_then_g("wf_rc");
    let f = w.path("f.txt");
    sb.failpoints().interleave(
        "after_restore",
        std::sync::Arc::new(move || std::fs::write(&f, b"theirs").unwrap()),
    );
    let rb = rollback(&sb, "wf_rc", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict));
    assert_eq!(rb.steps_rolled_back, 1);
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(rb.conflicts[0].action_id, "a1");
    assert!(rb.conflicts[0].path.ends_with("/f.txt"), "{rb:?}");
    assert_eq!(
        rb.conflicts[0].current_checksum.as_deref(),
        Some(sha(b"theirs").as_str())
    );
    assert_eq!(
        rb.conflicts[0].expected_checksum.as_deref(),
        Some(sha(b"A").as_str())
    );
    assert_eq!(w.read("f.txt"), b"theirs");
}

/// What someone put where the workflow wrote is not removed by a rollback, forced or not:
/// a directory where it wrote a file (`not_regular_file`), a file where a
/// `create_directory` made its directory (`conflict`: it was removed, reported as "the
/// action made it"), a symbolic link where it replaced a file (it was replaced by the
/// file, force or not). Refused up front, saying what to do, nothing restored, and `GET`
/// says so.
#[test]
fn a_rollback_never_removes_what_someone_put_where_the_workflow_wrote() {
    type Put = fn(&World);
    let cases: [(&str, serde_json::Value, Put, ReasonCode); 4] = [
        (
            "y.md",
            json!({"action_id": "a2", "intent": "replace_file", "path": "y.md", "content": "new"}),
            |w| {
                std::fs::remove_file(w.path("y.md")).unwrap();
                w.write("y.md/keep.txt", b"someone's");
            },
            ReasonCode::NotRegularFile,
        ),
        (
            "cd1",
            json!({"action_id": "a2", "intent": "create_directory", "path": "cd1"}),
            |w| {
                std::fs::remove_dir(w.path("cd1")).unwrap();
                w.write("cd1", b"someone's");
            },
            ReasonCode::Conflict,
        ),
        // A link in place of a file the workflow replaced: not replaced by force.
        (
            "y.md",
            json!({"action_id": "a2", "intent": "replace_file", "path": "y.md", "content": "new"}),
            |w| {
                std::fs::remove_file(w.path("y.md")).unwrap();
                std::os::unix::fs::symlink(&w.outside, w.path("y.md")).unwrap();
            },
            ReasonCode::SymlinkEscape,
        ),
        (
            "y.md",
            json!({"action_id": "a2", "intent": "replace_file", "path": "y.md", "content": "new"}),
            |w| {
                std::fs::remove_file(w.path("y.md")).unwrap();
                std::os::unix::fs::symlink("k.md", w.path("y.md")).unwrap();
            },
            ReasonCode::SymlinkRefused,
        ),
    ];
    for (path, action, put, code) in cases {
        let w = World::new();
        w.write("y.md", b"orig");
        let sb = w.sandbox();
        run(
            &sb,
            json!({"workflow_id": "wf_p", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "k.md", "content": "k"},
            action]}),
        );
        put(&w);
        let theirs = w.tree();
        for force in [false, true] {
            let rb = rollback(&sb, "wf_p", force);
            assert_eq!(rb.status, "refused", "{path}: {rb:?}");
            assert_eq!(rb.reason_code, Some(code), "{path}: {rb:?}");
            assert_eq!(rb.steps_rolled_back, 0);
            let why = rb.reason.unwrap();
            assert!(why.contains(path) && why.contains("move it away"), "{why}");
            // Advice for a file with other links only where there is one.
            assert!(!why.contains("extra link"), "{why}");
        }
        let info = sb.rollback_info("wf_p").unwrap();
        assert!(!info.rollback_available, "{info:?}");
        assert_eq!(info.reason_code, Some(code), "{info:?}");
        assert_eq!(w.tree(), theirs, "{path}: nothing restored");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// The same file put there while a forced rollback runs, after its check, stays too.
#[test]
fn a_file_put_where_a_directory_was_made_while_a_forced_rollback_runs_stays() {
    let w = World::new();
    let sb = w.sandbox();
    act(
        &sb,
        "wf_r",
        json!({"intent": "create_directory", "path": "r"}),
    );
    let path = w.path("r");
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || {
            std::fs::remove_dir(&path).unwrap();
            std::fs::write(&path, b"theirs").unwrap();
        }),
    );
    let rb = rollback(&sb, "wf_r", true);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("r"), b"theirs");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Something other than a folder where a workflow's snapshot folder would be, in any
/// root, refuses its rollback as `reserved_path` naming it (it may stand for snapshots
/// moved away); it was `io_error` naming nothing (HTTP 500).
#[test]
fn a_stray_entry_in_a_store_refuses_the_rollback_naming_it() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &w.writable_config());
    let sb = ailab_sandbox_core::Sandbox::open(both).unwrap();
    run(
        &sb,
        json!({"workflow_id": "wf_s", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "s.md", "content": "s"},
        {"action_id": "a2", "intent": "create_file", "path": root2.join("t.md").display().to_string(), "content": "t"}]}),
    );
    run(
        &sb,
        json!({"workflow_id": "wf_o", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "o.md", "content": "o"}]}),
    );
    let stray = root2.join(".rollback/wf_o");
    std::fs::write(&stray, b"stray").unwrap();
    for rb in [rollback(&sb, "wf_o", false), rollback(&sb, "wf_o", true)] {
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::ReservedPath), "{rb:?}");
        let why = rb.reason.unwrap();
        assert!(why.contains(&stray.display().to_string()), "{why}");
    }
    // Described with the refusal inside, as any other (200 over HTTP).
    let info = sb.rollback_info("wf_o").unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(info.reason_code, Some(ReasonCode::ReservedPath), "{info:?}");
    assert_eq!(w.read("o.md"), b"o", "nothing restored");
    std::fs::remove_file(&stray).unwrap();
    // The whole store.
    std::fs::rename(root2.join(".rollback"), w.tmp.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(w.tmp.path().join("moved"), root2.join(".rollback")).unwrap();
    let rb = rollback(&sb, "wf_s", true);
    assert_eq!(rb.reason_code, Some(ReasonCode::ReservedPath), "{rb:?}");
    assert!(rb.reason.unwrap().contains("symbolic link"));
    assert_eq!(std::fs::read(root2.join("t.md")).unwrap(), b"t");
    // A prune says so too (it was `io_error` naming nothing), and removes nothing.
    let err = sb.prune(std::time::Duration::ZERO).unwrap_err();
    assert_eq!(err.reason_code, ReasonCode::ReservedPath, "{err:?}");
    assert!(
        err.reason.contains(".rollback") && err.reason.contains("pruned"),
        "{err:?}"
    );
    assert!(w.path(".rollback/wf_s").exists());
    std::fs::remove_file(root2.join(".rollback")).unwrap();
    std::fs::rename(w.tmp.path().join("moved"), root2.join(".rollback")).unwrap();
    assert!(rollback(&sb, "wf_o", false).is_success());
    assert!(rollback(&sb, "wf_s", false).is_success());
    assert!(!w.path("s.md").exists() && !root2.join("t.md").exists());
}

/// A target force cannot overwrite either (another hard link, a FIFO) refuses the whole
/// rollback before anything is restored, with its own code: it was `conflict` advising
/// force, and force then restored the other actions and failed at that one, leaving the
/// workflow half rolled back.
#[test]
fn a_target_force_cannot_overwrite_refuses_the_rollback_up_front() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_hl", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
        {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"},
        {"action_id": "a3", "intent": "create_file", "path": "three.txt", "content": "3"}]}),
    );
    std::fs::hard_link(w.path("two.txt"), w.tmp.path().join("alias.txt")).unwrap();
    for force in [false, true] {
        let rb = rollback(&sb, "wf_hl", force);
        assert_eq!(rb.status, "refused", "{rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::HardlinkRefused), "{rb:?}");
        assert_eq!(rb.steps_rolled_back, 0);
        let why = rb.reason.unwrap();
        assert!(
            why.contains("two.txt")
                && why.contains("even with force")
                && why.ends_with("move it away (or remove the extra link), then roll back"),
            "{why}"
        );
    }
    for f in ["one.txt", "two.txt", "three.txt"] {
        assert!(w.path(f).exists(), "{f} not restored");
    }
    let info = sb.rollback_info("wf_hl").unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(
        info.reason_code,
        Some(ReasonCode::HardlinkRefused),
        "{info:?}"
    );
    std::fs::remove_file(w.tmp.path().join("alias.txt")).unwrap();
    std::fs::remove_file(w.path("two.txt")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        w.path("two.txt"),
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    let rb = rollback(&sb, "wf_hl", true);
    assert_eq!(rb.reason_code, Some(ReasonCode::NotRegularFile), "{rb:?}");
    assert!(w.path("one.txt").exists() && w.path("three.txt").exists());
    std::fs::remove_file(w.path("two.txt")).unwrap();
    assert!(rollback(&sb, "wf_hl", true).is_success());
    assert!(w.tree().is_empty(), "{:?}", w.tree());
    assert!(sb.audit_verify().unwrap().ok);
}

/// More of what force cannot override, each refused up front, forced or not, with
/// nothing restored (each was `conflict` advising force, and force then stopped half
/// way): a symbolic link where the workflow created a file or a directory, and a file or
/// FIFO where a folder on the way was.
#[test]
fn links_and_files_put_on_the_way_refuse_the_rollback_up_front() {
    type Sabotage = fn(&World);
    let cases: [(serde_json::Value, Sabotage, ReasonCode); 4] = [
        (
            json!({"action_id": "a1", "intent": "create_file", "path": "d/x.txt", "content": "x"}),
            |w| {
                std::fs::remove_file(w.path("d/x.txt")).unwrap();
                std::os::unix::fs::symlink(&w.outside, w.path("d/x.txt")).unwrap();
            },
            ReasonCode::SymlinkEscape,
        ),
        (
            json!({"action_id": "a1", "intent": "create_directory", "path": "newdir"}),
            |w| {
                std::fs::remove_dir(w.path("newdir")).unwrap();
                std::os::unix::fs::symlink("d", w.path("newdir")).unwrap();
            },
            ReasonCode::SymlinkRefused,
        ),
        (
            json!({"action_id": "a1", "intent": "create_directory", "path": "a/b/c"}),
            |w| {
                std::fs::remove_dir_all(w.path("a/b")).unwrap();
                w.write("a/b", b"precious");
            },
            ReasonCode::Conflict,
        ),
        (
            json!({"action_id": "a1", "intent": "replace_file", "path": "d/keep.txt", "content": "new"}),
            |w| {
                std::fs::remove_dir_all(w.path("d")).unwrap();
                rustix::fs::mkfifoat(
                    rustix::fs::CWD,
                    w.path("d"),
                    rustix::fs::Mode::from_raw_mode(0o644),
                )
                .unwrap();
            },
            ReasonCode::Conflict,
        ),
    ];
    for (action, sabotage, code) in cases {
        let w = World::new();
        w.write("d/keep.txt", b"keep");
        let sb = w.sandbox();
        let r = run(
            &sb,
            json!({"workflow_id": "wf_w", "actions": [
            {"action_id": "a0", "intent": "create_file", "path": "z.txt", "content": "z"},
            action.clone()]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
        sabotage(&w);
        for force in [false, true] {
            let rb = rollback(&sb, "wf_w", force);
            assert_eq!(rb.status, "refused", "{action}: {rb:?}");
            assert_eq!(rb.reason_code, Some(code), "{action}: {rb:?}");
            assert!(rb.reason.unwrap().contains("even with force"));
        }
        assert_eq!(w.read("z.txt"), b"z", "{action}: nothing restored");
        let info = sb.rollback_info("wf_w").unwrap();
        assert!(!info.rollback_available, "{action}: {info:?}");
        assert_eq!(info.reason_code, Some(code), "{action}");
    }
}

/// A folder moved away (with the workflow's files in it) is not made again by a forced
/// rollback to give a replaced file back: that would leave the files where they went,
/// let the step of a file the workflow created take its absence from the new folder for
/// its removal, and end the workflow rolled back for good. The step is a conflict, the
/// workflow stays open, and with the folder back the rollback gives the file back. (The
/// created file's step, its folder missing, is done unchecked, as it says.)
#[test]
fn a_forced_rollback_does_not_make_again_a_folder_moved_away() {
    let w = World::new();
    w.write("s/f.txt", b"ORIG-f");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "s/new.txt", "content": "W-new"},
            {"action_id": "a2", "intent": "replace_file", "path": "s/f.txt", "content": "W-f"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::rename(w.path("s"), w.path("s.aside")).unwrap();
    let rb = sb.rollback_workflow("wf_m", &forced());
    assert!(!rb.is_success(), "{rb:?}");
    let a2 = rb.steps.iter().find(|s| s.action_id == "a2").unwrap();
    assert!(!a2.restored, "{a2:?}");
    assert_eq!(a2.reason_code, Some(ReasonCode::Conflict), "{a2:?}");
    assert!(
        a2.reason
            .as_deref()
            .unwrap()
            .contains("the directory 's' on the way"),
        "{a2:?}"
    );
    let a1 = rb.steps.iter().find(|s| s.action_id == "a1").unwrap();
    assert!(!a1.checksum_validated, "{a1:?}");
    assert!(!w.path("s").exists(), "the folder is not made again");
    assert_eq!(w.read("s.aside/f.txt"), b"W-f");
    assert_eq!(w.read("s.aside/new.txt"), b"W-new");
    std::fs::rename(w.path("s.aside"), w.path("s")).unwrap();
    let rb = sb.rollback_workflow("wf_m", &RollbackOptions::default());
    assert!(rb.is_success(), "{rb:?}");
    assert_eq!(w.read("s/f.txt"), b"ORIG-f");
}

/// A replaced file whose folder is now someone else's file cannot be given back, forced
/// or not, and the refusal says so rather than advise force.
#[test]
fn a_replaced_file_beneath_a_folder_now_a_file_is_refused_without_advising_force() {
    let w = World::new();
    w.write("d/keep.txt", b"keep");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "d/keep.txt", "content": "new"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::rename(w.path("d"), w.path("d.moved")).unwrap();
    w.write("d", b"theirs");
    let rb = sb.rollback_workflow(
        "wf_r",
        &RollbackOptions {
            action_id: Some("a1".to_owned()),
            force: false,
        },
    );
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let why = format!("{rb:?}");
    assert!(!why.contains("roll back with force"), "{why}");
    assert_eq!(w.read("d"), b"theirs");
    assert_eq!(w.read("d.moved/keep.txt"), b"new");
}

/// A file another program creates where a write found none, between the write's
/// snapshot and its rename, is never replaced: the write fails (`already_exists` for a
/// creation, `conflict` for the others), its undo leaves the file alone, and a later
/// rollback has nothing of the action's to restore.
#[test]
fn a_file_that_appears_under_a_write_is_kept() {
    for (intent, extra, code) in [
        ("create_file", json!({"content": "mine"}), "already_exists"),
        ("append_file", json!({"content": "mine"}), "conflict"),
        ("write_json", json!({"data": {"k": 1}}), "conflict"),
    ] {
        let w = World::new();
        let sb = w.sandbox();
        let theirs = w.path("d/new.json");
        std::fs::create_dir(w.path("d")).unwrap();
        sb.failpoints().interleave(
            "before_mutate",
            std::sync::Arc::new(move || std::fs::write(&theirs, b"theirs").unwrap()),
        );
        let mut action = json!({"action_id": "a1", "intent": intent, "path": "d/new.json"});
        action
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = run(&sb, json!({"workflow_id": "wf_race", "actions": [action]}));
        assert_eq!(status(&r), "rolled_back", "{intent}: {r:?}");
        assert_eq!(
            r.actions[0].reason_code.map(|c| c.as_str()),
            Some(code),
            "{intent}"
        );
        assert_eq!(w.read("d/new.json"), b"theirs", "{intent}");
        let rb = rollback(&sb, "wf_race", false);
        assert_eq!(
            rb.reason_code,
            Some(ReasonCode::NoRollbackData),
            "{intent}: {rb:?}"
        );
        assert_eq!(w.read("d/new.json"), b"theirs", "{intent}");
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A file another program renames over a write's staged file before it is put in place
/// (under `batched` the bytes are staged before the commit point) never takes the
/// target's place: the action fails `conflict`, the file it was to replace keeps its
/// bytes, nothing is registered, and the trail still verifies. (The check's own test,
/// with the write's other paths, is in the root's unit tests.)
#[test]
fn a_staged_file_replaced_before_its_rename_leaves_the_target_as_it_was() {
    let w = World::new();
    w.write("d/f.txt", b"ORIGINAL");
    let mut c = w.writable_config();
    c.durability = ailab_sandbox_core::config::Durability::Batched;
    let sb = w.open(c);
    let folder = w.path("d");
    sb.failpoints().interleave(
        "before_mutate",
        std::sync::Arc::new(move || {
            let staged = std::fs::read_dir(&folder)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(".ailab-tmp-")
                })
                .expect("the write is staged beside its target");
            let planted = folder.join("planted");
            std::fs::write(&planted, b"INTRUDER").unwrap();
            std::fs::rename(&planted, staged).unwrap();
        }),
    );
    let r = run(
        &sb,
        json!({"workflow_id": "wf_swap", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "d/f.txt", "content": "NEW"}]}),
    );
    assert_eq!(
        r.actions[0].reason_code,
        Some(ReasonCode::Conflict),
        "{r:?}"
    );
    assert_eq!(w.read("d/f.txt"), b"ORIGINAL");
    assert!(sb.artifacts(10, Some("wf_swap")).unwrap().is_empty());
    assert!(sb.audit_verify().unwrap().ok);
    drop(sb);
    let names: Vec<String> = std::fs::read_dir(w.path("d"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["f.txt"], "no temporary file left");
}

/// A failed action whose undo failed too has no artifact; its snapshot still says what it
/// was about to write. A later rollback restores its target only when the target holds
/// that or what the action found, and otherwise refuses with `conflict`: another
/// workflow's change on top of the failed write is never overwritten without force.
#[test]
fn a_failed_action_is_rolled_back_only_over_what_it_wrote() {
    let w = World::new();
    let sb = w.sandbox();
    // A failed append left in place (its undo failed), then another workflow's append.
    w.write("t.txt", b"v0\n");
    sb.failpoints().arm("after_mutate", 1);
    sb.failpoints().arm("during_restore", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [
            {"action_id": "a1", "intent": "append_file", "path": "t.txt", "content": "A\n"}]}),
    );
    assert_eq!(status(&r), "failed", "{r:?}");
    assert_eq!(w.read("t.txt"), b"v0\nA\n");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [
            {"action_id": "b1", "intent": "append_file", "path": "t.txt", "content": "B important\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let rb = rollback(&sb, "wf_a", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("t.txt"), b"v0\nA\nB important\n");
    // In order, both go: wf_b's append, then wf_a's failed one.
    assert_eq!(rollback(&sb, "wf_b", false).status, "rolled_back");
    assert_eq!(rollback(&sb, "wf_a", false).status, "rolled_back");
    assert_eq!(w.read("t.txt"), b"v0\n");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A restore whose change is made but cannot be verified afterwards (the runtime's own
/// read-back fails: a disk error, no descriptor left) is recorded as done, unverified,
/// saying why: the trail, the mark and the disk agree, and the workflow is not rolled
/// back twice.
#[test]
fn a_restore_that_cannot_be_verified_is_still_recorded_as_done() {
    let w = World::new();
    w.write("r.md", b"orig");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_v", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "r.md", "content": "new"},
        {"action_id": "a2", "intent": "create_file", "path": "n.md", "content": "n"}]}),
    );
    // A removal (a2), then a rewrite from the backup (a1).
    for a in ["a2", "a1"] {
        sb.failpoints().arm("restore_verify", 1);
        let rb = rollback_action(&sb, "wf_v", a, false);
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
        assert_eq!(rb.steps_rolled_back, 1);
        assert!(
            rb.steps[0].restored && !rb.steps[0].checksum_validated,
            "{rb:?}"
        );
        // The step says why (it said nothing).
        let detail = rb.steps[0].detail.clone().unwrap_or_default();
        assert!(
            detail.starts_with("restored, but it could not be checked afterwards: "),
            "{rb:?}"
        );
    }
    assert_eq!(w.read("r.md"), b"orig");
    assert!(!w.path("n.md").exists());
    let trail = sb.audit_entries(100, Some("wf_v")).unwrap();
    let undone = trail
        .iter()
        .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
        .count();
    assert_eq!(undone, 2, "{trail:?}");
    // The rewrite's line names the bytes it wrote (the backup's, checked before the
    // write), not none, which reads as an absent file.
    let a1 = trail
        .iter()
        .find(|e| {
            e.action_id == "a1" && e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack
        })
        .unwrap();
    assert_eq!(a1.after_checksum, Some(sha(b"orig")), "{a1:?}");
    let again = rollback(&sb, "wf_v", false);
    assert_eq!(
        again.reason_code,
        Some(ReasonCode::NoRollbackData),
        "{again:?}"
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// A restored file that another program moves away before it is read back is not
/// reported restored and verified-less with no reason (a silent success while its bytes
/// were nowhere in the tree): it is a `checksum_mismatch`, and the step is left for a
/// rollback to do again, which gives the file back.
#[test]
fn a_restored_file_gone_before_it_is_read_back_is_a_mismatch() {
    let w = World::new();
    w.write("d/r.md", b"orig");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_g", "actions": [
        {"action_id": "a1", "intent": "replace_file", "path": "d/r.md", "content": "new"}]}),
    );
    let (file, away) = (w.path("d/r.md"), w.path("away.md"));
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || std::fs::rename(&file, &away).unwrap()),
    );
    let rb = rollback(&sb, "wf_g", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
    assert!(!rb.steps[0].restored, "{rb:?}");
    let reason = rb.steps[0].reason.clone().unwrap();
    assert!(
        reason.contains("'d/r.md' was restored, but what stands there now cannot be read back"),
        "{reason}"
    );
    assert_eq!(w.read("away.md"), b"orig");
    // Missing now: someone else's change, not rolled back over unforced.
    let again = rollback(&sb, "wf_g", false);
    assert_eq!(again.reason_code, Some(ReasonCode::Conflict), "{again:?}");
    // Put back, it holds the bytes the restore wrote: done again without force (it
    // was called a change of someone else's, to force).
    std::fs::rename(w.path("away.md"), w.path("d/r.md")).unwrap();
    let again = rollback(&sb, "wf_g", false);
    assert_eq!(again.status, "rolled_back", "{again:?}");
    assert!(again.steps[0].checksum_validated, "{again:?}");
    assert_eq!(w.read("d/r.md"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A file another program puts back the instant after a rollback removed it: the
/// removal is done, and its step says what stands there.
#[test]
fn a_removal_undone_by_another_program_says_so() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_n", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "n.md", "content": "n"}]}),
    );
    let file = w.path("n.md");
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || std::fs::write(&file, b"theirs").unwrap()),
    );
    let rb = rollback(&sb, "wf_n", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps[0].restored && !rb.steps[0].checksum_validated);
    assert_eq!(
        rb.steps[0].detail.as_deref(),
        Some(
            "removed, but something stands there again: another program put it there after the removal"
        ),
        "{rb:?}"
    );
    assert_eq!(w.read("n.md"), b"theirs");
}

/// A removal whose folder another program swaps for a link out of the root the instant
/// after: the removal is done, through the root's handle, nothing outside is touched,
/// and the step says another program changed the way, not that the runtime failed.
#[test]
fn a_removal_whose_folder_is_swapped_for_a_link_after_says_so() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_l", "actions": [
        {"action_id": "a1", "intent": "create_file", "path": "d/t.md", "content": "t"}]}),
    );
    std::fs::create_dir_all(w.outside.join("away")).unwrap();
    std::fs::write(w.outside.join("away/t.md"), b"bait").unwrap();
    let (d, aside, away) = (w.path("d"), w.path("d.aside"), w.outside.join("away"));
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || {
            std::fs::rename(&d, &aside).unwrap();
            std::os::unix::fs::symlink(&away, &d).unwrap();
        }),
    );
    let rb = rollback(&sb, "wf_l", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps[0].restored && !rb.steps[0].checksum_validated);
    let detail = rb.steps[0].detail.clone().unwrap();
    assert!(
        detail
            .starts_with("removed, but what stands on its way could not be looked at afterwards (")
            && detail.ends_with("): another program changed it at that instant"),
        "{detail}"
    );
    assert!(
        !w.path("d.aside/t.md").exists(),
        "removed through the handle"
    );
    assert_eq!(std::fs::read(w.outside.join("away/t.md")).unwrap(), b"bait");
}

/// Interleaved appends by two workflows: each of the rolled back workflow's actions is a
/// conflict of its own, but the sentence names the file once.
#[test]
fn a_conflict_names_each_file_once() {
    let w = World::new();
    w.write("log.md", b"base\n");
    let sb = w.sandbox();
    for (wf, line) in [
        ("wf_a", "a1"),
        ("wf_b", "b1"),
        ("wf_a", "a2"),
        ("wf_b", "b2"),
        ("wf_a", "a3"),
    ] {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [{"intent": "append_file", "path": "log.md", "content": format!("{line}\n")}]}),
        );
        assert_eq!(status(&r), "success");
    }
    let rb = rollback(&sb, "wf_b", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts.len(), 2, "{rb:?}");
    let reason = rb.reason.unwrap();
    assert_eq!(reason.matches("log.md").count(), 1, "{reason}");
    assert!(
        reason.contains("log.md (since the workflow's last write, and between actions"),
        "{reason}"
    );
}

/// Each step says what became of a target no checksum describes.
#[test]
fn a_step_says_what_became_of_a_target_without_checksum() {
    let w = World::new();
    w.write("kept/old.txt", b"old\n");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_d", "actions": [
            {"action_id": "made", "intent": "create_directory", "path": "made"},
            {"action_id": "kept", "intent": "create_directory", "path": "kept"},
            {"action_id": "file", "intent": "create_file", "path": "new.txt", "content": "n\n"}]}),
    );
    assert_eq!(status(&r), "success");
    let rb = rollback(&sb, "wf_d", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let detail = |id: &str| {
        rb.steps
            .iter()
            .find(|s| s.action_id == id)
            .and_then(|s| s.detail.clone())
            .unwrap_or_default()
    };
    assert_eq!(detail("made"), "removed: the action made it");
    assert_eq!(
        detail("kept"),
        "left in place: it existed before the action"
    );
    assert_eq!(
        detail("file"),
        "removed: it did not exist before the action"
    );
    assert!(!w.path("made").exists());
    assert_eq!(w.read("kept/old.txt"), b"old\n");
    // What someone removed before a forced rollback was not removed by it, and is not
    // said to be (it read "removed: it did not exist before the action").
    let r = run(
        &sb,
        json!({"workflow_id": "wf_g", "actions": [
            {"action_id": "gone", "intent": "create_file", "path": "gone.txt", "content": "g\n"}]}),
    );
    assert_eq!(status(&r), "success");
    std::fs::remove_file(w.path("gone.txt")).unwrap();
    let rb = rollback(&sb, "wf_g", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let d = rb.steps[0].detail.clone().unwrap_or_default();
    assert!(d.starts_with("already gone"), "{d}");
}

/// A world with `own.txt` (`data\n`, mode 0600) owned by uid and gid 65534; `None` when
/// this process may not give a file away.
fn another_users_file() -> Option<World> {
    let w = World::new();
    w.write("own.txt", b"data\n");
    let path = w.path("own.txt");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).ok()?;
    Some(w)
}

/// `own.txt`'s owner, group and permission bits.
fn owned(w: &World) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(w.path("own.txt")).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o777)
}

/// A file of another user's, replaced or appended to (as root), stays that user's, and
/// so does the original a rollback puts back: a file of mode 0600 is not lost to its
/// owner.
#[test]
fn a_replaced_file_and_its_restore_keep_their_owner() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        for intent in ["replace_file", "append_file"] {
            let Some(w) = another_users_file() else {
                // Not privileged: no file of another user's can be made here.
                return;
            };
            let mut c = w.writable_config();
            c.durability = durability;
            let sb = w.open(c);
            let r = run(
                &sb,
                json!({"workflow_id": "wf_own", "actions": [{"intent": intent, "path": "own.txt", "content": "new\n"}]}),
            );
            assert_eq!(status(&r), "success", "{r:?}");
            let case = format!("{intent}, {durability:?}");
            assert_eq!(owned(&w), (65534, 65534, 0o600), "{case}");
            let rb = rollback(&sb, "wf_own", false);
            assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
            assert_eq!(w.read("own.txt"), b"data\n", "{case}");
            assert_eq!(owned(&w), (65534, 65534, 0o600), "{case}");
        }
    }
}

/// The owner is kept by the restores that replace whatever is there: a forced rollback,
/// and the recovery of a run that died before or after its rename.
#[test]
fn a_forced_or_recovered_restore_keeps_the_owner() {
    use ailab_sandbox_core::config::Durability;
    for durability in [Durability::Strict, Durability::Batched, Durability::Relaxed] {
        for how in ["force", "before_mutate", "after_mutate"] {
            let Some(w) = another_users_file() else {
                // Not privileged: no file of another user's can be made here.
                return;
            };
            let mut c = w.writable_config();
            c.durability = durability;
            let sb = w.open(c.clone());
            let plan = json!({"workflow_id": "wf_own", "actions": [{"intent": "replace_file", "path": "own.txt", "content": "new\n"}]});
            let case = format!("{how}, {durability:?}");
            if how == "force" {
                assert_eq!(status(&run(&sb, plan)), "success", "{case}");
                let rb = rollback(&sb, "wf_own", true);
                assert_eq!(rb.status, "rolled_back", "{case}: {rb:?}");
            } else {
                sb.failpoints().arm_crash(how, 1);
                let died =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&sb, plan)));
                assert!(died.is_err(), "{case}: the run dies");
                drop(sb);
                drop(w.open(c));
            }
            // Under `batched` the commit log makes the write whole once it is logged:
            // recovery replays it rather than undoing it.
            let replayed = durability == Durability::Batched && how != "force";
            let expected: &[u8] = if replayed { b"new\n" } else { b"data\n" };
            assert_eq!(w.read("own.txt"), expected, "{case}");
            assert_eq!(owned(&w), (65534, 65534, 0o600), "{case}");
        }
    }
}

/// A rollback that removes what an action made but must leave a directory the action
/// made on the way (someone put a file in it) says so in the step, where it said only
/// that the target was removed.
#[test]
fn a_directory_made_on_the_way_and_left_is_named() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_way", "actions": [
            {"intent": "create_directory", "path": "x1/x2"}]}),
    );
    assert_eq!(status(&r), "success");
    w.write("x1/other.txt", b"theirs\n");
    let rb = sb.rollback_workflow("wf_way", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let detail = rb.steps[0].detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("removed: the action made it")
            && detail.contains("'x1' it made on the way left in place"),
        "{detail}"
    );
    assert!(!w.path("x1/x2").exists());
    assert_eq!(w.read("x1/other.txt"), b"theirs\n");
}

/// A restore that fails leaves its file as the newer action wrote it: the older actions
/// of that file are not called conflicts (someone else's change, to force over) but are
/// said to wait for the newer one's restore, with its code. Forced too: undone beneath
/// the newer action, the older one would be recorded rolled back while the newer one's
/// later restore brought its bytes back.
#[test]
fn an_older_restore_after_a_failed_newer_one_is_not_called_a_conflict() {
    for force in [false, true] {
        let (w, sb) = history(b"orig", &[]);
        three_writes_on_one_file(&sb, "wf_f");
        sb.failpoints().arm("during_restore", 1);
        let rb = rollback(&sb, "wf_f", force);
        assert_eq!(rb.status, "failed", "force {force}: {rb:?}");
        for older in ["a2", "a1"] {
            let step = rb.steps.iter().find(|s| s.action_id == older).unwrap();
            assert!(!step.restored, "force {force}: {step:?}");
            assert_eq!(step.reason_code, Some(ReasonCode::IoError), "{step:?}");
            let why = step.reason.as_deref().unwrap();
            assert!(
                why.contains("newer action 'a3'") && !why.contains("force"),
                "force {force}: {why}"
            );
        }
        assert!(rb.conflicts.is_empty(), "{rb:?}");
        assert_eq!(w.read("f.txt"), b"one+two+three", "force {force}");
        let rolled_back = sb
            .audit_log()
            .by_workflow("wf_f")
            .unwrap()
            .into_iter()
            .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
            .count();
        assert_eq!(rolled_back, 0, "force {force}");
        // Once the failure is gone, a plain rollback finishes.
        let rb = rollback(&sb, "wf_f", false);
        assert_eq!(rb.status, "rolled_back", "force {force}: {rb:?}");
        assert_eq!(w.read("f.txt"), b"orig", "force {force}");
    }
}

/// Force passes over a newer step only when its backup, read again, is damaged or gone:
/// a step that failed otherwise (here its restore was made, then another program removed
/// the file before it was read back) holds the older steps of its file back, forced or
/// not. Undone beneath it, the older action was recorded rolled back, and the newer
/// one's restore, once it went through, brought the older action's bytes back.
#[test]
fn force_passes_over_only_a_newer_backup_found_damaged() {
    let (w, sb) = history(b"orig", &[]);
    run(
        &sb,
        json!({"workflow_id": "wf_p", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "one"},
            {"action_id": "a2", "intent": "append_file", "path": "f.txt", "content": "+two"}]}),
    );
    let target = w.path("f.txt");
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || std::fs::remove_file(&target).unwrap()),
    );
    let rb = rollback(&sb, "wf_p", true);
    assert_eq!(rb.status, "failed", "{rb:?}");
    let step = |id: &str| rb.steps.iter().find(|s| s.action_id == id).unwrap().clone();
    assert_eq!(
        step("a2").reason_code,
        Some(ReasonCode::ChecksumMismatch),
        "{rb:?}"
    );
    assert!(!step("a1").restored, "{rb:?}");
    assert!(
        step("a1").reason.unwrap().contains("newer action 'a2'"),
        "{rb:?}"
    );
    assert!(!w.path("f.txt").exists());
    // Rolled back again (forced: the file is gone), each step in turn, the oldest last.
    let rb = rollback(&sb, "wf_p", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Only a chain of spent steps (backups damaged or gone) lets force pass: a failure of
/// the moment after a spent step holds the older steps of the file back as well, or the
/// failed step's restore, once it went through, would bring its bytes back over them.
#[test]
fn a_passing_failure_after_a_damaged_backup_still_holds_the_older_steps_back() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_c");
    std::fs::write(w.root.join(".rollback/wf_c/a3/backup"), b"garbage").unwrap();
    // a3's restore meets its damaged backup; a2's fails for want of room.
    sb.failpoints().arm_errno("during_restore", 2, 28);
    let rb = rollback(&sb, "wf_c", true);
    assert_eq!(rb.status, "failed", "{rb:?}");
    let step = |id: &str| rb.steps.iter().find(|s| s.action_id == id).unwrap().clone();
    assert_eq!(
        step("a3").reason_code,
        Some(ReasonCode::ChecksumMismatch),
        "{rb:?}"
    );
    assert_eq!(step("a2").reason_code, Some(ReasonCode::IoError), "{rb:?}");
    assert!(!step("a1").restored, "{rb:?}");
    assert!(
        step("a1").reason.unwrap().contains("newer action 'a2'"),
        "{rb:?}"
    );
    assert_eq!(w.read("f.txt"), b"one+two+three");
    // Once there is room, force passes over the damaged backup alone, and the file gets
    // what the workflow found.
    let rb = rollback(&sb, "wf_c", true);
    assert_eq!(w.read("f.txt"), b"orig", "{rb:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Rolls `workflow_id` back (forced or not) with a crash armed in `sb`, which must
/// fire (`why` says where), and drops the sandbox as a dead process leaves it.
fn rollback_dies(sb: ailab_sandbox_core::Sandbox, workflow_id: &str, force: bool, why: &str) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rollback(&sb, workflow_id, force)
    }));
    assert!(outcome.is_err(), "{why}");
    drop(sb);
}

/// Runs [`three_writes_on_one_file`], damages a3's backup, and rolls the workflow back
/// with force while the trail refuses a2's line (a1's held after it): a3, passed over as
/// spent, is left failed, the file given back.
fn leave_a_spent_step_failed(w: &World, sb: &ailab_sandbox_core::Sandbox, workflow_id: &str) {
    three_writes_on_one_file(sb, workflow_id);
    std::fs::write(
        w.root.join(format!(".rollback/{workflow_id}/a3/backup")),
        b"garbage",
    )
    .unwrap();
    sb.failpoints().arm("after_mark", 2);
    let rb = rollback(sb, workflow_id, true);
    assert!(
        !rb.steps
            .iter()
            .find(|s| s.action_id == "a3")
            .unwrap()
            .restored
    );
    assert_eq!(w.read("f.txt"), b"orig");
}

/// Runs `workflow_id`'s a1 (`f.txt` replaced by "one"), a2 (+two) and a3 (+three).
fn three_writes_on_one_file(sb: &ailab_sandbox_core::Sandbox, workflow_id: &str) {
    run(
        sb,
        json!({"workflow_id": workflow_id, "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "one"},
            {"action_id": "a2", "intent": "append_file", "path": "f.txt", "content": "+two"},
            {"action_id": "a3", "intent": "append_file", "path": "f.txt", "content": "+three"}]}),
    );
}

/// A step force passes over as spent (its backup damaged) whose file the older steps
/// then give back is recorded undone beneath them: the rollback finishes, and the backup
/// put back later does not bring that step's bytes back over them.
#[test]
fn a_step_passed_over_as_spent_is_recorded_undone_beneath_the_older_restores() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_s");
    let backup = w.root.join(".rollback/wf_s/a3/backup");
    let good = std::fs::read(&backup).unwrap();
    std::fs::write(&backup, b"garbage").unwrap();
    let rb = rollback(&sb, "wf_s", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 3, "{rb:?}");
    let a3 = rb.steps.iter().find(|s| s.action_id == "a3").unwrap();
    assert!(a3.restored && a3.reason_code.is_none(), "{a3:?}");
    let detail = a3.detail.as_deref().unwrap();
    assert!(
        detail.starts_with("undone beneath it: the backup of 'f.txt' does not match"),
        "{detail}"
    );
    assert_eq!(w.read("f.txt"), b"orig");
    let trail = sb.audit_log().by_workflow("wf_s").unwrap();
    let undone = |id: &str| {
        trail.iter().any(|e| {
            e.action_id == id && e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack
        })
    };
    assert!(undone("a1") && undone("a2") && undone("a3"), "{trail:?}");
    // The good backup put back: nothing is left to roll back, and the file stays.
    std::fs::write(&backup, good).unwrap();
    let rb = rollback(&sb, "wf_s", true);
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 0, "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A step force passed over as spent whose rollback could not record it undone beneath
/// the older restores (the trail refused their lines, or the rollback died before its
/// record) is recorded so by the next rollback, unforced, with no restore: the workflow
/// finishes, and its backup put back later does not bring its bytes back over them.
#[test]
fn a_spent_step_left_failed_is_recorded_undone_beneath_by_the_next_rollback() {
    for died in [false, true] {
        let (w, mut sb) = history(b"orig", &[]);
        three_writes_on_one_file(&sb, "wf_l");
        let backup = w.root.join(".rollback/wf_l/a3/backup");
        let good = std::fs::read(&backup).unwrap();
        std::fs::write(&backup, b"garbage").unwrap();
        // The lines of a3's failed step, a2's restore, then a1's.
        if died {
            sb.failpoints().arm_crash("after_mark", 3);
            rollback_dies(sb, "wf_l", true, "the rollback dies before a1's line");
            sb = w.sandbox();
        } else {
            sb.failpoints().arm("after_mark", 2);
            let rb = rollback(&sb, "wf_l", true);
            let a3 = rb.steps.iter().find(|s| s.action_id == "a3").unwrap();
            assert!(!a3.restored, "{rb:?}");
        }
        assert_eq!(w.read("f.txt"), b"orig", "died {died}");
        let info = sb.rollback_info("wf_l").unwrap();
        assert!(info.rollback_available, "died {died}: {info:?}");
        let rb = rollback(&sb, "wf_l", false);
        assert_eq!(rb.status, "rolled_back", "died {died}: {rb:?}");
        assert_eq!(rb.steps_rolled_back, 1, "died {died}: {rb:?}");
        let a3 = &rb.steps[0];
        assert_eq!(a3.action_id, "a3");
        assert!(a3.checksum_validated, "{a3:?}");
        assert!(
            a3.detail
                .as_deref()
                .unwrap()
                .starts_with("undone beneath an older action's restore"),
            "{a3:?}"
        );
        assert_eq!(w.read("f.txt"), b"orig", "died {died}");
        let trail = sb.audit_log().by_workflow("wf_l").unwrap();
        let last = trail.last().unwrap();
        assert_eq!(
            (last.action_id.as_str(), last.status),
            ("a3", ailab_sandbox_core::audit::AuditStatus::RolledBack),
            "died {died}: {trail:?}"
        );
        assert_eq!(last.before_checksum, last.after_checksum);
        // The good backup put back: nothing is left to roll back, forced or not.
        std::fs::write(&backup, &good).unwrap();
        for force in [false, true] {
            let rb = rollback(&sb, "wf_l", force);
            assert_eq!(
                rb.reason_code,
                Some(ReasonCode::NoRollbackData),
                "died {died}: {rb:?}"
            );
        }
        assert_eq!(w.read("f.txt"), b"orig", "died {died}");
        assert!(sb.audit_verify().unwrap().ok, "died {died}");
    }
}

/// A forced rollback that died after restoring an older step beneath one passed over as
/// spent, before marking it: the start records that restore (its walk goes on past the
/// spent step, whose file is no longer as its action left it), and the next rollback
/// finishes, recording the spent step undone beneath it.
#[test]
fn a_restore_made_beneath_a_spent_step_by_a_rollback_that_died_is_recorded_at_start() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_k");
    std::fs::write(w.root.join(".rollback/wf_k/a3/backup"), b"garbage").unwrap();
    // a3's restore fails on its damaged backup; a2's is made, then the process dies.
    sb.failpoints().arm_crash("after_restore", 1);
    rollback_dies(sb, "wf_k", true, "the rollback dies after a2's restore");
    assert_eq!(w.read("f.txt"), b"one");
    let sb = w.sandbox();
    assert_noticed(&sb, "1 restore it made recorded on the audit trail");
    let trail = sb.audit_log().by_workflow("wf_k").unwrap();
    let last = trail.last().unwrap();
    assert_eq!(
        (last.action_id.as_str(), last.status),
        ("a2", ailab_sandbox_core::audit::AuditStatus::RolledBack),
        "{trail:?}"
    );
    assert_eq!(last.after_checksum, Some(sha(b"one")));
    let rb = rollback(&sb, "wf_k", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A step undone beneath the older restores is recorded with what its file holds when
/// the pass ends: here the oldest restore was made but not confirmed after the middle
/// one, and the spent step's line names the file's bytes, not the middle restore's.
#[test]
fn a_step_undone_beneath_is_recorded_with_what_the_file_holds_at_the_end() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_u");
    std::fs::write(w.root.join(".rollback/wf_u/a3/backup"), b"garbage").unwrap();
    sb.failpoints().arm("after_restore", 2);
    let rb = rollback(&sb, "wf_u", true);
    let a1 = rb.steps.iter().find(|s| s.action_id == "a1").unwrap();
    assert!(a1.is_unconfirmed(), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    let trail = sb.audit_log().by_workflow("wf_u").unwrap();
    let a3 = trail.iter().rfind(|e| e.action_id == "a3").unwrap();
    assert_eq!(
        a3.status,
        ailab_sandbox_core::audit::AuditStatus::RolledBack,
        "{trail:?}"
    );
    assert_eq!(a3.after_checksum, Some(sha(b"orig")), "{trail:?}");
    assert_eq!(a3.before_checksum, a3.after_checksum);
}

/// The same when the trail refused the spent step's failed line before the death: the
/// rollback's record says it was forced, which is what lets the start look beneath a
/// step whose backup is damaged or gone.
#[test]
fn a_restore_beneath_a_spent_step_whose_line_was_refused_is_recorded_at_start() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_k2");
    std::fs::write(w.root.join(".rollback/wf_k2/a3/backup"), b"garbage").unwrap();
    sb.failpoints().arm("after_mark", 1);
    sb.failpoints().arm_crash("after_restore", 1);
    rollback_dies(sb, "wf_k2", true, "the rollback dies after a2's restore");
    let sb = w.sandbox();
    assert_noticed(&sb, "1 restore it made recorded on the audit trail");
    let last = sb.audit_log().by_workflow("wf_k2").unwrap().pop().unwrap();
    assert_eq!(
        (last.action_id.as_str(), last.status),
        ("a2", ailab_sandbox_core::audit::AuditStatus::RolledBack)
    );
    assert_eq!(last.after_checksum, Some(sha(b"one")));
}

/// A record an older version wrote says nothing of force: the start then looks beneath
/// a step only where the dead rollback recorded it failed for its backup.
#[test]
fn a_rollback_record_without_force_said_is_judged_by_the_failed_lines() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_o");
    std::fs::write(w.root.join(".rollback/wf_o/a3/backup"), b"garbage").unwrap();
    sb.failpoints().arm_crash("after_restore", 1);
    rollback_dies(sb, "wf_o", true, "the rollback dies after a2's restore");
    let record = w.state.join("inflight/wf_o.json");
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("\"forced\":true"), "{text}");
    std::fs::write(&record, text.replace("\"forced\":true", "\"forced\":null")).unwrap();
    let sb = w.sandbox();
    assert_noticed(&sb, "1 restore it made recorded on the audit trail");
    let last = sb.audit_log().by_workflow("wf_o").unwrap().pop().unwrap();
    assert_eq!(
        (last.action_id.as_str(), last.status),
        ("a2", ailab_sandbox_core::audit::AuditStatus::RolledBack)
    );
}

/// A start records a dead rollback's restores in the order they were made: one marked
/// before the death whose line the trail refused (a3) before one the start finds made
/// and unmarked (a2), so that the file's newest line names what it holds.
#[test]
fn a_start_records_a_dead_rollbacks_restores_in_the_order_made() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_ord");
    sb.failpoints().arm("after_mark", 1);
    sb.failpoints().arm_crash("after_restore", 2);
    rollback_dies(sb, "wf_ord", false, "the rollback dies after a2's restore");
    assert_eq!(w.read("f.txt"), b"one");
    let sb = w.sandbox();
    let trail = sb.audit_log().by_workflow("wf_ord").unwrap();
    let undone: Vec<&str> = trail
        .iter()
        .filter(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack)
        .map(|e| e.action_id.as_str())
        .collect();
    assert_eq!(undone, ["a3", "a2"], "{trail:?}");
    assert_eq!(trail.last().unwrap().after_checksum, Some(sha(b"one")));
    let rb = rollback(&sb, "wf_ord", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A start after a rollback that died before restoring anything does not take a step
/// whose backup was damaged since (and whose file someone removed) for one the rollback
/// passed over: only a step it recorded failed for its backup lets the walk go on, and
/// the older step, found as its action found it by chance, is no restore it made.
#[test]
fn a_start_does_not_walk_past_a_step_the_dead_rollback_never_reached() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_v", "actions": [
            {"action_id": "p", "intent": "create_file", "path": "d/f.txt", "content": "one"},
            {"action_id": "s", "intent": "replace_file", "path": "d/f.txt", "content": "two"}]}),
    );
    sb.failpoints().arm_crash("during_restore", 1);
    rollback_dies(sb, "wf_v", false, "the rollback dies at its first restore");
    std::fs::remove_file(w.path("d/f.txt")).unwrap();
    std::fs::write(w.root.join(".rollback/wf_v/s/backup"), b"garbage").unwrap();
    let sb = w.sandbox();
    let trail = sb.audit_log().by_workflow("wf_v").unwrap();
    assert!(
        !trail
            .iter()
            .any(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack),
        "{trail:?}"
    );
    assert!(
        w.path("d").is_dir(),
        "the folder p made stays: nothing undid p"
    );
}

/// A step undone beneath an older restore that left its path empty is not called
/// validated when a folder stands there now: its line and step say the file changed.
#[test]
fn a_step_undone_beneath_over_a_folder_put_there_is_not_validated() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "m.txt", "content": "one"},
            {"action_id": "a2", "intent": "append_file", "path": "m.txt", "content": "+two"},
            {"action_id": "a3", "intent": "append_file", "path": "m.txt", "content": "+three"}]}),
    );
    std::fs::write(w.root.join(".rollback/wf_m/a3/backup"), b"garbage").unwrap();
    // The lines of a3's failed step, then a2's restore: refused, a1's held after it.
    sb.failpoints().arm("after_mark", 2);
    let rb = rollback(&sb, "wf_m", true);
    assert!(
        !rb.steps
            .iter()
            .find(|s| s.action_id == "a3")
            .unwrap()
            .restored
    );
    assert!(!w.path("m.txt").exists());
    std::fs::create_dir(w.path("m.txt")).unwrap();
    let rb = rollback(&sb, "wf_m", false);
    let a3 = rb.steps.iter().find(|s| s.action_id == "a3").unwrap();
    assert!(a3.restored && !a3.checksum_validated, "{rb:?}");
    assert!(
        a3.detail
            .as_deref()
            .unwrap()
            .ends_with("(the file has changed since)"),
        "{a3:?}"
    );
}

/// A step undone beneath older restores whose file cannot be read when it is to be
/// recorded so is left failed, saying why, rather than recorded with no checksum (read
/// as an absent file); the rollback run again records it.
#[test]
fn a_step_undone_beneath_whose_file_cannot_be_read_waits_for_the_next_rollback() {
    let (w, sb) = history(b"orig", &[]);
    leave_a_spent_step_failed(&w, &sb, "wf_q");
    sb.failpoints().arm("read_target", 1);
    let rb = rollback(&sb, "wf_q", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.steps[0].reason_code, Some(ReasonCode::IoError), "{rb:?}");
    assert!(
        rb.steps[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("roll back again to record it"),
        "{rb:?}"
    );
    let rb = rollback(&sb, "wf_q", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let trail = sb.audit_log().by_workflow("wf_q").unwrap();
    let last = trail.last().unwrap();
    assert_eq!(last.action_id, "a3");
    assert_eq!(last.after_checksum, Some(sha(b"orig")), "{trail:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A step undone beneath older restores whose mark cannot be written is recorded on the
/// trail all the same, as a restore is: the trail is what later rollbacks read first.
#[test]
fn a_step_undone_beneath_without_its_mark_is_recorded_on_the_trail() {
    let (w, sb) = history(b"orig", &[]);
    leave_a_spent_step_failed(&w, &sb, "wf_z");
    sb.failpoints().arm("mark_restored", 1);
    let rb = rollback(&sb, "wf_z", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let last = sb.audit_log().by_workflow("wf_z").unwrap().pop().unwrap();
    assert_eq!(
        (last.action_id.as_str(), last.status),
        ("a3", ailab_sandbox_core::audit::AuditStatus::RolledBack)
    );
    let rb = rollback(&sb, "wf_z", true);
    assert_eq!(rb.reason_code, Some(ReasonCode::NoRollbackData), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
}

/// A step undone beneath older restores whose mark and audit line both cannot be
/// written is left failed, saying so: nothing would record it later (its held line is
/// written from its mark), and the rollback run again records it.
#[test]
fn a_step_undone_beneath_with_neither_mark_nor_line_stays_failed() {
    let (w, sb) = history(b"orig", &[]);
    leave_a_spent_step_failed(&w, &sb, "wf_n2");
    sb.failpoints().arm("mark_restored", 1);
    sb.failpoints().arm("after_mark", 1);
    let rb = rollback(&sb, "wf_n2", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    let a3 = &rb.steps[0];
    assert!(!a3.restored, "{rb:?}");
    assert!(
        a3.reason.as_deref().unwrap().contains("neither its mark"),
        "{rb:?}"
    );
    let rb = rollback(&sb, "wf_n2", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let last = sb.audit_log().by_workflow("wf_n2").unwrap().pop().unwrap();
    assert_eq!(
        (last.action_id.as_str(), last.status),
        ("a3", ailab_sandbox_core::audit::AuditStatus::RolledBack)
    );
    assert!(sb.audit_verify().unwrap().ok);
}

/// A write made after an older action of its workflow on the same file was rolled back
/// (a later run) stands: it is restored, not taken for one undone beneath that restore.
#[test]
fn a_write_after_an_older_rollback_of_its_file_is_restored() {
    let (w, sb) = history(b"orig", &[]);
    run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "f.txt", "content": "one"}]}),
    );
    assert_eq!(rollback(&sb, "wf_r", false).status, "rolled_back");
    run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "a2", "intent": "replace_file", "path": "f.txt", "content": "two"}]}),
    );
    let rb = rollback(&sb, "wf_r", false);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps[0].detail.is_none(), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Folders a created file's action made on the way that the restore could neither
/// remove nor put on the ledger (here the outer one closed to it just after the file
/// was removed) fail the step, put back but not confirmed: called done, they stayed for
/// good. The rollback run again (forced here) removes them.
#[test]
fn folders_made_on_the_way_that_could_not_be_removed_fail_the_step() {
    use std::os::unix::fs::PermissionsExt as _;
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_d", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "n1/n2/f.txt", "content": "x"}]}),
    );
    let outer = w.path("n1");
    let closed = outer.clone();
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || {
            std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o000)).unwrap()
        }),
    );
    let rb = without_dac_override(|| rollback(&sb, "wf_d", false));
    std::fs::set_permissions(&outer, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert!(!rb.steps[0].restored, "{rb:?}");
    assert!(!w.path("n1/n2/f.txt").exists());
    // Forced: the file's absence, read while its folder was closed, was not confirmed
    // as the undo's, so it is a change to overwrite.
    let rb = rollback(&sb, "wf_d", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!outer.exists(), "{rb:?}");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Only an older step's restore undoes a spent step beneath it: with the newest step
/// restored and the two older ones spent (one backup damaged, the other gone during the
/// rollback), none is recorded undone, and the file keeps their writes.
#[test]
fn a_newer_restore_does_not_undo_a_spent_step_beneath() {
    let (w, sb) = history(b"orig", &[]);
    three_writes_on_one_file(&sb, "wf_n");
    std::fs::write(w.root.join(".rollback/wf_n/a2/backup"), b"garbage").unwrap();
    let a1_backup = w.root.join(".rollback/wf_n/a1/backup");
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || std::fs::remove_file(&a1_backup).unwrap()),
    );
    let rb = rollback(&sb, "wf_n", true);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.steps_rolled_back, 1, "{rb:?}");
    for older in ["a2", "a1"] {
        let step = rb.steps.iter().find(|s| s.action_id == older).unwrap();
        assert!(!step.restored, "{step:?}");
    }
    assert_eq!(w.read("f.txt"), b"one+two");
}

/// A simulated rollback that cannot audit itself because another process holds the trail
/// is busy (`conflict`), not a failure of the disk.
#[test]
fn a_simulated_rollback_meeting_a_held_trail_is_a_conflict() {
    use rustix::fs::{FlockOperation, flock};
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_h", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "h.txt", "content": "h"}]}),
    );
    let mut c = w.config();
    c.limits.lock_wait_seconds = 1;
    let simulating = w.open(c);
    let log = std::fs::File::open(w.state.join("sandbox_audit.jsonl")).unwrap();
    flock(&log, FlockOperation::LockExclusive).unwrap();
    let rb = rollback(&simulating, "wf_h", false);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert!(
        rb.reason
            .unwrap()
            .contains("another process of the runtime held it")
    );
    drop(log);
    assert_eq!(rollback(&simulating, "wf_h", false).status, "simulated");
}

/// A target marked immutable (`chattr +i`) refuses the rollback up front: met at its
/// restore, the rollback stopped half way. Skipped where `chattr` cannot mark files.
#[test]
fn an_immutable_target_refuses_the_rollback_up_front() {
    let w = World::new();
    w.write("a.txt", b"A0");
    w.write("b.txt", b"B0");
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_i", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "a.txt", "content": "A1"},
            {"action_id": "a2", "intent": "replace_file", "path": "b.txt", "content": "B1"}]}),
    );
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .arg(flag)
            .arg(w.path("a.txt"))
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!("chattr +i is not available here: skipped");
        return;
    }
    let rb = rollback(&sb, "wf_i", true);
    let info = sb.rollback_info("wf_i").unwrap();
    assert!(chattr("-i"));
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert!(rb.reason.unwrap().contains("immutable"));
    assert_eq!(w.read("b.txt"), b"B1", "nothing restored");
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(rollback(&sb, "wf_i", false).status, "rolled_back");
}

/// Prunes record how far they went in each root: a prune by a process with only some of
/// the roots leaves what an earlier prune reached in the others as it was, so a write made
/// there since keeps its snapshot and rolls back (it was called a prune stopped half way,
/// the advice to prune again removing that snapshot). A root whose name ends in a space is
/// matched as it is.
#[test]
fn a_prune_through_some_roots_leaves_the_others_as_earlier_prunes_left_them() {
    let w = World::new();
    let (a, b) = (w.tmp.path().join("sp "), w.tmp.path().join("ok"));
    let mut both = w.writable_config();
    both.roots = vec![a.clone(), b.clone()];
    let mut only_b = w.writable_config();
    only_b.roots = vec![b.clone()];
    let day = chrono::Duration::days(1);
    let hour = std::time::Duration::from_secs(3600);
    let write = |sb: &ailab_sandbox_core::Sandbox, action: &str, root: &std::path::Path| {
        let r = run(
            sb,
            json!({"workflow_id": "wf_q", "actions": [{"action_id": action,
                "intent": "create_file", "root": root, "path": format!("{action}.txt"), "content": action}]}),
        );
        assert_eq!(status(&r), "success", "{:?}", r.actions[0].reason);
    };
    let sb = w.open(both.clone());
    write(&sb, "q1", &a);
    w.clock.advance(day);
    assert_eq!(sb.prune(hour).unwrap().workflows_pruned, ["wf_q"]);
    write(&sb, "q2", &a);
    write(&sb, "q3", &b);
    drop(sb);
    w.clock.advance(day);
    let sb = w.open(only_b);
    assert_eq!(sb.prune(hour).unwrap().workflows_pruned, ["wf_q"]);
    drop(sb);
    assert!(a.join(".rollback/wf_q/q2").is_dir(), "untouched");
    let sb = w.open(both);
    let rb = sb.rollback_workflow("wf_q", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{:?}", rb.reason);
    assert_eq!(rb.steps_rolled_back, 1, "{rb:?}");
    assert!(!a.join("q2.txt").exists(), "q2 undone");
    assert!(
        a.join("q1.txt").exists() && b.join("q3.txt").exists(),
        "pruned: left"
    );
    let said = rb.reason.unwrap_or_default();
    assert!(said.contains("q1.txt") && said.contains("q3.txt"), "{said}");
}

/// A workflow that wrote into many roots with long paths, one plan each, is pruned: the
/// mark naming them all is not held to a block's size (every prune of it failed "record
/// longer than one block"). A mark of the first format is read, its seq for each root,
/// a root whose name ends in a space whole (only the block's end is padding).
#[test]
fn a_prune_mark_names_any_number_of_long_roots_and_the_first_format_is_read() {
    let w = World::new();
    // Nine roots of some 480 bytes: a mark naming them all is over 4 KiB.
    let roots: Vec<std::path::PathBuf> = (0..9)
        .map(|i| {
            w.tmp
                .path()
                .join(format!("{i}{}", "r".repeat(230)))
                .join("x".repeat(230))
        })
        .collect();
    let mut c = w.writable_config();
    c.roots = roots.clone();
    let sb = w.open(c);
    for (i, root) in roots.iter().enumerate() {
        let r = run(
            &sb,
            json!({"workflow_id": "wf_many", "actions": [{"intent": "create_file", "root": root,
                "path": format!("f{i}.txt"), "content": "x"}]}),
        );
        assert_eq!(status(&r), "success", "{:?}", r.actions[0].reason);
    }
    w.clock.advance(chrono::Duration::days(1));
    let report = sb.prune(std::time::Duration::from_secs(3600)).unwrap();
    assert_eq!(report.workflows_pruned, ["wf_many"], "{report:?}");
    let state = ailab_sandbox_core::confine::state::StateDir::open(&w.state).unwrap();
    let mark = state.prune_mark("wf_many").unwrap().unwrap();
    assert_eq!(mark.len(), 9, "{mark:?}");
    let size = std::fs::metadata(w.state.join("inflight/wf_many.pruned"))
        .unwrap()
        .len();
    assert!(size > 4096, "{size}");
    std::fs::write(
        w.state.join("inflight/wf_old.pruned"),
        format!(
            "7\n{} \n{}{}\n",
            roots[0].display(),
            roots[1].display(),
            " ".repeat(40)
        ),
    )
    .unwrap();
    let old = state.prune_mark("wf_old").unwrap().unwrap();
    assert_eq!(
        old,
        [
            (format!("{} ", roots[0].display()), 7),
            (roots[1].display().to_string(), 7)
        ]
    );
}

/// A folder a partial rollback had to leave (it held another file) is removed once it
/// is empty: by a rollback that restores something beneath it, or, emptied some other
/// way (by hand), by the next prune. A rollback elsewhere does not walk the whole ledger
/// (it grows with every partial rollback), so it leaves that one alone.
#[test]
fn a_left_folder_emptied_by_hand_is_removed_by_the_next_prune() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_a", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/e/a.txt", "content": "a"},
            {"action_id": "a2", "intent": "create_file", "path": "d/e/b.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "success");
    // a1 made d/e; its rollback leaves them, holding a2's file.
    let one = RollbackOptions {
        action_id: Some("a1".to_owned()),
        force: false,
    };
    let rb = sb.rollback_workflow("wf_a", &one);
    assert!(rb.is_success(), "{rb:?}");
    assert!(w.path("d/e/b.txt").exists(), "the folder holds a2's file");
    std::fs::remove_file(w.path("d/e/b.txt")).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_z", "actions": [
            {"action_id": "z1", "intent": "create_file", "path": "z/z.txt", "content": "z"}]}),
    );
    assert_eq!(status(&r), "success");
    assert!(
        sb.rollback_workflow("wf_z", &RollbackOptions::default())
            .is_success()
    );
    assert!(
        w.path("d/e").is_dir(),
        "not near what that rollback restored"
    );
    let report = sb.prune(std::time::Duration::from_secs(3600)).unwrap();
    assert!(report.workflows_pruned.is_empty(), "{report:?}");
    assert!(!w.path("d").exists(), "removed by the prune's housekeeping");
}

/// Runs workflow `wf`: two files, `d/f1.md` ("one", action a1) and `d/f2.md` ("two",
/// a2), made in a new folder `d`.
fn two_files_made_in_d(sb: &ailab_sandbox_core::Sandbox, wf: &str) {
    let r = run(
        sb,
        json!({"workflow_id": wf, "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/f1.md", "content": "one"},
            {"action_id": "a2", "intent": "create_file", "path": "d/f2.md", "content": "two"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
}

/// Rolls `wf` back unforced: `rolled_back`, every step checked, the tree `before`, the
/// trail sound.
fn rolls_back_to(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
    wf: &str,
    before: &std::collections::BTreeMap<String, Option<Vec<u8>>>,
) {
    let rb = sb.rollback_workflow(wf, &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps.iter().all(|s| s.checksum_validated), "{rb:?}");
    assert_eq!(&w.tree(), before);
    assert!(sb.audit_verify().unwrap().ok);
}

/// Arms the swap of folder `d` for an empty one of that name, the first moved to
/// `d.real`, at the next restore (after its look): `(d, d.real)`.
fn swap_d_for_an_empty_one_at_the_next_restore(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
) -> (std::path::PathBuf, std::path::PathBuf) {
    swap_d_for_an_empty_one_at(w, sb, "during_restore")
}

/// [`swap_d_for_an_empty_one_at_the_next_restore`], at the next hit of `point`.
fn swap_d_for_an_empty_one_at(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
    point: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (d, real) = (w.path("d"), w.path("d.real"));
    let (d2, real2) = (d.clone(), real.clone());
    sb.failpoints().interleave(
        point,
        std::sync::Arc::new(move || {
            std::fs::rename(&d2, &real2).unwrap();
            std::fs::create_dir(&d2).unwrap();
        }),
    );
    (d, real)
}

/// Runs `wf_moved`, two files made in a new folder `d`, and arms its move to `d.away` at
/// the next restore (before the first step's restore; back by the caller after):
/// `(d, d.away)`.
fn two_files_moved_away_at_their_restore(
    w: &World,
    sb: &ailab_sandbox_core::Sandbox,
) -> (std::path::PathBuf, std::path::PathBuf) {
    two_files_made_in_d(sb, "wf_moved");
    let (d, away) = (w.path("d"), w.path("d.away"));
    let (d2, away2) = (d.clone(), away.clone());
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || {
            let _ = std::fs::rename(&d2, &away2);
        }),
    );
    (d, away)
}

/// Unforced, a folder swapped for an empty one of the same name after the rollback's
/// check (the one holding the workflow's files moved aside) is no removal of the files:
/// the steps are refused `conflict`, the stand-in is not taken for the folder the
/// workflow made, and once the folder is back a rollback removes the files.
#[test]
fn a_folder_swapped_for_an_empty_one_after_the_check_refuses_an_unforced_rollback() {
    let w = World::new();
    w.write("keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let before = w.tree();
    two_files_made_in_d(&sb, "wf_swapped");
    let (d, real) = swap_d_for_an_empty_one_at_the_next_restore(&w, &sb);
    let rb = sb.rollback_workflow("wf_swapped", &RollbackOptions::default());
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps.iter().all(|s| !s.restored), "{rb:?}");
    let first = &rb.steps[0];
    assert_eq!(first.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let reason = first.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("'d/f2.md' went missing after the rollback's check saw it, and the directory 'd' holding it is not the one the action wrote in"),
        "{rb:?}"
    );
    assert!(!reason.starts_with("put back"), "{rb:?}");
    assert!(
        w.path("d").is_dir(),
        "the stand-in is not removed as the workflow's"
    );
    std::fs::remove_dir(&d).unwrap();
    std::fs::rename(&real, &d).unwrap();
    assert_eq!(w.read("d/f1.md"), b"one");
    assert_eq!(w.read("d/f2.md"), b"two");
    rolls_back_to(&w, &sb, "wf_swapped", &before);
}

/// A folder swapped for an empty one of the same name before a forced rollback, the
/// action's file living on where the first went, is told from one whose file is gone:
/// the step is not called checked, and its detail and audit line say why.
#[test]
fn a_folder_swapped_before_a_forced_rollback_is_not_taken_for_the_files_removal() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_before", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/f.md", "content": "one"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let (d, real) = (w.path("d"), w.path("d.real"));
    std::fs::rename(&d, &real).unwrap();
    std::fs::create_dir(&d).unwrap();
    // Unforced, the refusal names the folder, and what to do.
    let rb = sb.rollback_workflow("wf_before", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(
        rb.conflicts[0].folder_replaced.as_deref(),
        Some("d"),
        "{rb:?}"
    );
    assert!(
        rb.reason.as_deref().unwrap_or_default().contains(
            "the directory 'd' holding some of them is not the one the workflow wrote in"
        ),
        "{rb:?}"
    );
    let rb = sb.rollback_workflow("wf_before", &forced());
    let step = &rb.steps[0];
    assert!(step.restored, "{rb:?}");
    assert!(!step.checksum_validated, "{rb:?}");
    let said = "not found in the directory 'd', which is not the one the action wrote in";
    assert!(
        step.detail.as_deref().unwrap_or_default().contains(said),
        "{rb:?}"
    );
    let line = rolled_back_line(&sb, "wf_before");
    assert!(
        line.error.as_deref().unwrap_or_default().contains(said),
        "{line:?}"
    );
    assert_eq!(std::fs::read(real.join("f.md")).unwrap(), b"one");
    assert!(d.is_dir(), "the stand-in stays");
    assert!(sb.audit_verify().unwrap().ok);
}

/// And a folder the workflow made, swapped so, is told apart by the mark its action left
/// once it made it: neither of its files is called checked.
#[test]
fn a_made_folder_swapped_before_a_forced_rollback_is_not_taken_for_the_files_removal() {
    let w = World::new();
    w.write("keep.txt", b"k");
    let sb = w.open(w.writable_config());
    two_files_made_in_d(&sb, "wf_made");
    let (d, real) = (w.path("d"), w.path("d.real"));
    std::fs::rename(&d, &real).unwrap();
    std::fs::create_dir(&d).unwrap();
    let rb = sb.rollback_workflow("wf_made", &forced());
    assert_eq!(rb.steps.len(), 2, "{rb:?}");
    for step in &rb.steps {
        assert!(!step.checksum_validated, "{rb:?}");
        assert!(
            step.detail.as_deref().unwrap_or_default().contains(
                "not found in the directory 'd', which is not the one the action wrote in"
            ),
            "{rb:?}"
        );
    }
    assert_eq!(std::fs::read(real.join("f1.md")).unwrap(), b"one");
    assert_eq!(std::fs::read(real.join("f2.md")).unwrap(), b"two");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A folder another workflow's rollback removed (taking this workflow's write with it)
/// and a later write made again is named, with what to do whether it was moved or
/// removed: not only "put it back", which cannot be done.
#[test]
fn a_folder_a_rollback_removed_and_a_write_made_again_is_advised_as_removed_too() {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let step = |wf: &str, intent: &str, path: &str| {
        let r = run(
            &sb,
            json!({"workflow_id": wf, "actions": [
                {"action_id": "a1", "intent": intent, "path": path, "content": "x\n"}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    };
    step("wf_1", "create_file", "d/x.md");
    step("wf_2", "append_file", "d/x.md");
    let rb = sb.rollback_workflow("wf_1", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.path("d").exists());
    step("wf_3", "create_file", "d/y.md");
    let rb = sb.rollback_workflow("wf_2", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(
        rb.conflicts[0].folder_replaced.as_deref(),
        Some("d"),
        "{rb:?}"
    );
    let said = rb.reason.as_deref().unwrap_or_default();
    assert!(
        said.contains(
            "if it was moved, put it back, then roll back; if removed, roll back with force"
        ),
        "{rb:?}"
    );
    let rb = sb.rollback_workflow("wf_2", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("d/y.md"), b"x\n", "another workflow's file stays");
}

/// A directory a `create_directory` made, swapped for another of the same name, is not
/// removed as the action's: unforced, the rollback's check refuses it before any step
/// (the stand-in empty or not) and names it; forced, it is left and said.
#[test]
fn a_made_directory_swapped_for_another_is_not_removed_as_the_actions() {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_dir", "actions": [
            {"action_id": "a1", "intent": "create_directory", "path": "nd"},
            {"action_id": "a2", "intent": "create_file", "path": "top.md", "content": "t"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let (nd, real) = (w.path("nd"), w.path("nd.real"));
    std::fs::rename(&nd, &real).unwrap();
    std::fs::create_dir(&nd).unwrap();
    // Unforced, the check refuses the lot (the later write is not undone first), the
    // stand-in named, empty or not.
    for stand_in_holds in [None, Some("nd/other.md")] {
        if let Some(other) = stand_in_holds {
            w.write(other, b"another's");
        }
        let rb = sb.rollback_workflow("wf_dir", &RollbackOptions::default());
        assert_eq!(rb.status, "refused", "{stand_in_holds:?}: {rb:?}");
        assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
        assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
        assert_eq!(
            rb.conflicts[0].folder_replaced.as_deref(),
            Some("nd"),
            "{rb:?}"
        );
        assert!(
            rb.reason
                .as_deref()
                .unwrap_or_default()
                .contains("the workflow made 'nd', and what stands there now is another directory"),
            "{rb:?}"
        );
        assert_eq!(w.read("top.md"), b"t", "nothing is rolled back");
    }
    let rb = sb.rollback_workflow("wf_dir", &forced());
    let step = rb.steps.iter().find(|s| s.action_id == "a1").unwrap();
    assert!(!step.checksum_validated, "{rb:?}");
    assert!(
        step.detail
            .as_deref()
            .unwrap_or_default()
            .starts_with("left in place: 'nd' is not the directory the action made"),
        "{rb:?}"
    );
    assert!(nd.is_dir() && real.is_dir());
    assert_eq!(w.read("nd/other.md"), b"another's");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Each folder an action makes is told apart, not only the outermost: a deeper one
/// swapped leaves its file unchecked (and the stand-in in place), and a directory a
/// `create_directory` made beneath another it made is not removed as the action's.
#[test]
fn a_deeper_made_folder_swapped_is_told_apart_too() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_deep", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/n/m/f.md", "content": "one"},
            {"action_id": "a2", "intent": "create_directory", "path": "x/y"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    for (dir, away) in [("d/n/m", "d/n/m.real"), ("x/y", "x/y.real")] {
        std::fs::rename(w.path(dir), w.path(away)).unwrap();
        std::fs::create_dir(w.path(dir)).unwrap();
    }
    let rb = sb.rollback_workflow("wf_deep", &forced());
    let step = |a: &str| rb.steps.iter().find(|s| s.action_id == a).unwrap();
    assert!(!step("a1").checksum_validated, "{rb:?}");
    assert!(
        step("a1").detail.as_deref().unwrap_or_default().contains(
            "not found in the directory 'd/n/m', which is not the one the action wrote in"
        ),
        "{rb:?}"
    );
    assert!(!step("a2").checksum_validated, "{rb:?}");
    assert!(
        step("a2")
            .detail
            .as_deref()
            .unwrap_or_default()
            .starts_with("left in place: 'x/y' is not the directory the action made"),
        "{rb:?}"
    );
    assert_eq!(w.read("d/n/m.real/f.md"), b"one");
    assert!(
        w.path("d/n/m").is_dir(),
        "the stand-in is not removed as the action's"
    );
    assert!(w.path("x/y").is_dir() && w.path("x/y.real").is_dir());
    assert!(sb.audit_verify().unwrap().ok);
}

/// What stands in a folder put in the place of one the action made is another's, even
/// a copy of the action's file: never removed as the action's (refused unforced, left
/// and said forced); and an empty stand-in for an outer folder it made stays too.
#[test]
fn a_copy_in_a_stand_in_folder_is_not_removed_as_the_actions() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_copy", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/n/f.md", "content": "one"},
            {"action_id": "a2", "intent": "create_file", "path": "d/p/q/g.md", "content": "two"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::rename(w.path("d/n"), w.path("d/n.real")).unwrap();
    w.write("d/n/f.md", b"one");
    std::fs::rename(w.path("d/p"), w.path("d/p.real")).unwrap();
    std::fs::create_dir(w.path("d/p")).unwrap();
    let said = "'d/n/f.md' stands in the directory 'd/n', which is not the one the action wrote in";
    let rb = sb.rollback_workflow("wf_copy", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let replaced: Vec<_> = rb
        .conflicts
        .iter()
        .map(|c| (c.action_id.as_str(), c.folder_replaced.as_deref()))
        .collect();
    assert_eq!(
        replaced,
        [("a2", Some("d/p")), ("a1", Some("d/n"))],
        "{rb:?}"
    );
    // The copy's bytes are the action's, but it was never written over and back.
    assert!(
        !rb.reason
            .as_deref()
            .unwrap_or_default()
            .contains("written over and back"),
        "{rb:?}"
    );
    let rb = sb.rollback_workflow("wf_copy", &forced());
    let step = |a: &str| rb.steps.iter().find(|s| s.action_id == a).unwrap();
    assert!(!step("a1").checksum_validated, "{rb:?}");
    assert!(
        step("a1")
            .detail
            .as_deref()
            .unwrap_or_default()
            .starts_with(&format!("left in place: {said}")),
        "{rb:?}"
    );
    assert!(!step("a2").checksum_validated, "{rb:?}");
    assert_eq!(w.read("d/n/f.md"), b"one", "the copy stays");
    assert_eq!(w.read("d/n.real/f.md"), b"one");
    assert!(w.path("d/p").is_dir(), "the empty stand-in stays");
    assert_eq!(w.read("d/p.real/q/g.md"), b"two");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A root copied back whole (from a backup, say) has every folder anew: its folders are
/// not taken for swapped ones, and the workflow rolls back as it would have.
#[test]
fn a_root_copied_back_whole_rolls_back_as_before() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    let before = w.tree();
    let sb = w.open(w.writable_config());
    two_files_made_in_d(&sb, "wf_copied");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_copied", "actions": [
            {"action_id": "a3", "intent": "create_file", "path": "d/e/f3.md", "content": "three"},
            {"action_id": "a4", "intent": "create_directory", "path": "k/l"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(sb);
    let copy = w.tmp.path().join("copy");
    copy_tree(&w.root, &copy);
    std::fs::remove_dir_all(&w.root).unwrap();
    copy_tree(&copy, &w.root);
    let sb = w.open(w.writable_config());
    rolls_back_to(&w, &sb, "wf_copied", &before);
}

/// So is one a forced rollback of a replacement finds: the file's bytes are put back at
/// its path, in the stand-in, and the step says the action's file may live on where the
/// first folder went (not checked). A file removed by hand, its folder left, is still
/// "already gone", checked.
#[test]
fn a_replacement_in_a_swapped_folder_is_put_back_unchecked() {
    let w = World::new();
    w.write("d/f.md", b"old");
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_rep", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "d/f.md", "content": "new"},
            {"action_id": "a2", "intent": "create_file", "path": "d/g.md", "content": "g"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::remove_file(w.path("d/g.md")).unwrap();
    let one = RollbackOptions {
        action_id: Some("a2".into()),
        force: true,
    };
    let control = sb.rollback_workflow("wf_rep", &one);
    assert!(control.steps[0].checksum_validated, "{control:?}");
    assert!(
        control.steps[0]
            .detail
            .as_deref()
            .unwrap_or_default()
            .starts_with("already gone"),
        "{control:?}"
    );
    let (d, real) = (w.path("d"), w.path("d.real"));
    std::fs::rename(&d, &real).unwrap();
    std::fs::create_dir(&d).unwrap();
    // Unforced, a copy of what the action left, standing in the stand-in, is another's:
    // nothing is written over it.
    w.write("d/f.md", b"new");
    let rb = sb.rollback_workflow("wf_rep", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(
        rb.conflicts[0].folder_replaced.as_deref(),
        Some("d"),
        "{rb:?}"
    );
    assert_eq!(w.read("d/f.md"), b"new");
    std::fs::remove_file(w.path("d/f.md")).unwrap();
    let rb = sb.rollback_workflow("wf_rep", &forced());
    let step = &rb.steps[0];
    assert!(step.restored, "{rb:?}");
    assert!(!step.checksum_validated, "{rb:?}");
    let said = "restored into the directory 'd', which is not the one the action wrote in";
    assert!(
        step.detail.as_deref().unwrap_or_default().contains(said),
        "{rb:?}"
    );
    assert!(
        rolled_back_line(&sb, "wf_rep")
            .error
            .unwrap_or_default()
            .contains(said)
    );
    assert_eq!(w.read("d/f.md"), b"old");
    assert_eq!(std::fs::read(real.join("f.md")).unwrap(), b"new");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A file the rollback's look saw and that is gone by the time it is read is looked at
/// again: judged missing (a change force overrides), not "something unreadable" that
/// force would not help.
#[test]
fn a_file_gone_between_the_rollbacks_look_and_read_is_judged_missing() {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let before = w.tree();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_gone", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "f.md", "content": "one"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let f = w.path("f.md");
    sb.failpoints().interleave(
        "target_looked",
        std::sync::Arc::new(move || {
            let _ = std::fs::remove_file(&f);
        }),
    );
    let rb = sb.rollback_workflow("wf_gone", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(rb.conflicts.len(), 1, "{rb:?}");
    assert_eq!(rb.conflicts[0].current_checksum, None, "{rb:?}");
    let said = rb.reason.as_deref().unwrap_or_default();
    assert!(
        said.contains("roll back with force to overwrite them"),
        "{rb:?}"
    );
    let rb = sb.rollback_workflow("wf_gone", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.tree(), before);
}

/// Forced, a file its look saw and that is gone by its step (its folder swapped for an
/// empty one of the same name at that instant) is not called checked: it may live on
/// where the folder went, and the step says so.
#[test]
fn a_file_gone_after_a_forced_rollbacks_look_is_not_called_checked() {
    let w = World::new();
    w.write("keep.txt", b"k");
    let sb = w.open(w.writable_config());
    two_files_made_in_d(&sb, "wf_swapped");
    let (_, real) = swap_d_for_an_empty_one_at_the_next_restore(&w, &sb);
    let rb = sb.rollback_workflow("wf_swapped", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    let first = &rb.steps[0];
    assert_eq!(first.action_id, "a2", "{rb:?}");
    assert!(!first.checksum_validated, "{rb:?}");
    assert!(
        first
            .detail
            .as_deref()
            .unwrap_or_default()
            .contains("though the rollback's look saw it a moment before"),
        "{rb:?}"
    );
    // What the report does not call checked lives on where the folder went.
    assert_eq!(std::fs::read(real.join("f2.md")).unwrap(), b"two");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Forced, a file gone by its step or already at the step's look (its folder swapped for
/// an empty one then) and back before the step ends (the folder swapped back): nothing
/// was removed, so the step fails `conflict`, and a later rollback removes the file.
#[test]
fn a_file_gone_and_back_within_a_forced_step_leaves_it_to_a_later_rollback() {
    // At `during_restore`, after the step's look; at `read_target`, before every look
    // of the rollback's (its conflict check's first).
    for point in ["during_restore", "read_target"] {
        let w = World::new();
        w.write("keep.txt", b"k");
        let sb = w.open(w.writable_config());
        let before = w.tree();
        two_files_made_in_d(&sb, "wf_back");
        let (d, real) = swap_d_for_an_empty_one_at(&w, &sb, point);
        sb.failpoints().interleave(
            "restore_verify",
            std::sync::Arc::new(move || {
                std::fs::remove_dir(&d).unwrap();
                std::fs::rename(&real, &d).unwrap();
            }),
        );
        let rb = sb.rollback_workflow("wf_back", &forced());
        assert_ne!(rb.status, "rolled_back", "{point}: {rb:?}");
        let first = &rb.steps[0];
        assert!(!first.restored, "{point}: {rb:?}");
        assert_eq!(
            first.reason_code,
            Some(ReasonCode::Conflict),
            "{point}: {rb:?}"
        );
        assert!(
            first.reason.as_deref().unwrap_or_default().contains(
                "'d/f2.md' was not there as it was to be removed, and something stands in its place again"
            ),
            "{point}: {rb:?}"
        );
        assert_eq!(w.read("d/f2.md"), b"two");
        let rb = sb.rollback_workflow("wf_back", &forced());
        assert_eq!(rb.status, "rolled_back", "{point}: {rb:?}");
        assert_eq!(w.tree(), before);
        assert!(sb.audit_verify().unwrap().ok);
    }
}

/// A file the workflow made beneath a folder that is missing when the rollback comes to
/// it is not called verified gone: the folder may have been moved away with the file in
/// it, for an instant (another program renaming it and back) or for good. The step says
/// so (`checksum_validated: false`, naming the folder) rather than "already gone".
#[test]
fn a_file_beneath_a_folder_missing_at_its_restore_is_never_called_verified_gone() {
    let w = World::new();
    w.write("keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let (d, away) = two_files_moved_away_at_their_restore(&w, &sb);
    let rb = sb.rollback_workflow("wf_moved", &forced());
    std::fs::rename(&away, &d).unwrap();
    assert_eq!(rb.steps.len(), 2, "{rb:?}");
    for step in &rb.steps {
        assert!(!step.checksum_validated, "{step:?}");
        let detail = step.detail.as_deref().unwrap_or_default();
        assert!(
            detail.contains("nor the directory 'd' on the way") && detail.contains("moved away"),
            "{step:?}"
        );
    }
    // What the report does not call checked stands there.
    assert_eq!(w.read("d/f1.md"), b"one");
    assert!(sb.audit_verify().unwrap().ok);
}

/// Unforced, the rollback's check saw the files the workflow made; their folder moved
/// away after it is no removal of theirs: the steps are refused `conflict`, nothing is
/// called rolled back, and once the folder is back a rollback removes the files.
#[test]
fn a_folder_moved_away_after_the_check_refuses_an_unforced_rollback() {
    let w = World::new();
    w.write("keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let before = w.tree();
    let (d, away) = two_files_moved_away_at_their_restore(&w, &sb);
    let rb = sb.rollback_workflow("wf_moved", &RollbackOptions::default());
    std::fs::rename(&away, &d).unwrap();
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    let first = &rb.steps[0];
    assert_eq!(first.action_id, "a2", "{rb:?}");
    assert!(!first.restored, "{rb:?}");
    assert_eq!(first.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let reason = first.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("the directory 'd' on the way to 'd/f2.md' went missing"),
        "{rb:?}"
    );
    // Not taken for a restore made: a rollback run again judges the file anew.
    assert!(!reason.starts_with("put back"), "{rb:?}");
    assert!(rb.steps.iter().all(|s| !s.restored), "{rb:?}");
    assert_eq!(w.read("d/f1.md"), b"one");
    assert_eq!(w.read("d/f2.md"), b"two");
    rolls_back_to(&w, &sb, "wf_moved", &before);
}

/// A folder the workflow made, removed for good by someone else with the workflow's files
/// in it: a forced rollback finishes, removes the folders the workflow made, and says it
/// could not check the files.
#[test]
fn a_folder_removed_for_good_is_said_unchecked_and_the_rollback_finishes() {
    let w = World::new();
    let sb = w.open(w.writable_config());
    let before = w.tree();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_gone", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/e/f.md", "content": "one"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::remove_dir_all(w.path("d/e")).unwrap();
    let rb = sb.rollback_workflow("wf_gone", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!rb.steps[0].checksum_validated, "{rb:?}");
    assert!(
        rb.steps[0]
            .detail
            .as_deref()
            .unwrap_or_default()
            .contains("nor the directory 'd/e' on the way"),
        "{rb:?}"
    );
    // The trail, kept for good, says so too.
    let line = &sb.audit_entries(1, Some("wf_gone")).unwrap()[0];
    assert!(
        line.error
            .as_deref()
            .unwrap_or_default()
            .contains("nor the directory 'd/e' on the way"),
        "{line:?}"
    );
    assert_eq!(w.tree(), before);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A folder missing when the rollback looks, and back (the file in it) before the step
/// ends: nothing was removed, so the step fails `conflict` and a later rollback removes
/// the file.
#[test]
fn a_folder_back_before_the_step_ends_leaves_the_step_to_a_later_rollback() {
    let w = World::new();
    w.write("d/keep.txt", b"k");
    let sb = w.open(w.writable_config());
    let before = w.tree();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_back", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "d/f1.md", "content": "one"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let (d, away) = (w.path("d"), w.path("d.away"));
    let (d1, away1, d2, away2) = (d.clone(), away.clone(), d, away);
    sb.failpoints().interleave(
        "during_restore",
        std::sync::Arc::new(move || std::fs::rename(&d1, &away1).unwrap()),
    );
    sb.failpoints().interleave(
        "restore_verify",
        std::sync::Arc::new(move || std::fs::rename(&away2, &d2).unwrap()),
    );
    let rb = sb.rollback_workflow("wf_back", &forced());
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    assert!(!rb.steps[0].restored, "{rb:?}");
    assert_eq!(
        rb.steps[0].reason_code,
        Some(ReasonCode::Conflict),
        "{rb:?}"
    );
    assert!(
        rb.steps[0].reason.as_deref().unwrap().contains("is back"),
        "{rb:?}"
    );
    assert_eq!(w.read("d/f1.md"), b"one");
    let rb = sb.rollback_workflow("wf_back", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(rb.steps[0].checksum_validated, "{rb:?}");
    assert_eq!(w.tree(), before);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A refused rollback's trail line names the workflow's snapshot folder in the root that
/// holds it, not in the first root.
#[test]
fn a_refused_rollback_names_the_folder_of_the_workflows_root() {
    let w = World::new();
    let (root2, both) = with_second_root(&w, &w.writable_config());
    let sb = w.open(both);
    let target = root2.join("b.txt");
    let r = run(
        &sb,
        json!({"workflow_id": "wf_two", "actions": [
            {"intent": "create_file", "path": target.to_str().unwrap(), "content": "b"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    std::fs::write(&target, b"someone else").unwrap();
    let rb = sb.rollback_workflow("wf_two", &RollbackOptions::default());
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let last = &sb.audit_entries(1, Some("wf_two")).unwrap()[0];
    assert_eq!(last.mutation_type, "rollback_workflow");
    assert_eq!(
        std::path::Path::new(&last.target_path),
        root2.join(".rollback/wf_two")
    );
}

/// A workflow's writes are rolled back newest first in the order the trail recorded
/// them, not by their ids' times: the second run's process had a clock an hour behind
/// (set back between the runs), and its write is still the later one, restored first.
#[test]
fn a_clock_set_back_between_two_runs_does_not_reorder_their_rollback() {
    let (w, sb) = history(b"v0", &[]);
    for (id, content) in [("a1", "v1"), ("a2", "v2")] {
        if id == "a2" {
            ailab_sandbox_core::ids::as_if_clock_behind(Some(std::time::Duration::from_secs(3600)));
        }
        let r = run(
            &sb,
            json!({"workflow_id": "wf_clock", "actions": [
                {"action_id": id, "intent": "replace_file", "path": "f.txt", "content": content}]}),
        );
        ailab_sandbox_core::ids::as_if_clock_behind(None);
        assert_eq!(status(&r), "success", "{r:?}");
    }
    let info = sb.rollback_info("wf_clock").unwrap();
    let order: Vec<_> = info.actions.iter().map(|a| a.action_id.as_str()).collect();
    assert_eq!(order, ["a2", "a1"], "newest first");
    assert!(info.conflicts.is_empty(), "{info:?}");
    let one = RollbackOptions {
        action_id: Some("a1".to_owned()),
        force: true,
    };
    let rb = sb.rollback_workflow("wf_clock", &one);
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"v2", "not rolled back under the later a2");
    let rb = sb.rollback_workflow("wf_clock", &RollbackOptions::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"v0");
    assert!(sb.audit_verify().unwrap().ok);
}

/// A rollback that cannot read the trail to order the workflow's runs (their ids follow
/// each process's clock) is refused and restores nothing: in id order a run made under a
/// clock set back would be undone first. Asked again once it can, it goes through.
#[test]
fn a_rollback_that_cannot_order_its_runs_restores_nothing() {
    let w = World::new();
    let sb = w.sandbox();
    w.write("f.txt", b"orig\n");
    for line in ["one\n", "two\n"] {
        w.clock.advance(chrono::Duration::seconds(1));
        let r = run(
            &sb,
            json!({"workflow_id": "wf_two", "actions": [
                {"intent": "append_file", "path": "f.txt", "content": line}]}),
        );
        assert_eq!(status(&r), "success", "{r:?}");
    }
    sb.failpoints().arm("trail_order", 1);
    let rb = rollback(&sb, "wf_two", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::IoError), "{rb:?}");
    assert!(
        rb.reason.as_deref().unwrap().contains("audit trail"),
        "{rb:?}"
    );
    assert!(rb.steps.iter().all(|s| !s.restored), "{rb:?}");
    assert_eq!(w.read("f.txt"), b"orig\none\ntwo\n");
    assert_eq!(rollback(&sb, "wf_two", false).status, "rolled_back");
    assert_eq!(w.read("f.txt"), b"orig\n");
}

/// What a host reads back from the JSON a face sent: run results, rollback reports
/// (with a conflict naming who changed the file) and rollback previews come back equal
/// to what the runtime returned, and statuses print as they are sent.
#[test]
fn results_and_reports_read_back_from_their_json() {
    use ailab_sandbox_core::executor::{ActionStatus, RunResult, RunStatus};
    use ailab_sandbox_core::sandbox::{RollbackInfo, RollbackReport};
    fn back<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
        serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap()
    }
    let w = World::new();
    let sb = w.sandbox();
    three_appends(&w, &sb);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_v1", "actions": [
            {"intent": "create_file", "path": "new.md", "content": "x"},
            {"intent": "create_file", "path": "bad.exe", "content": "x"}]}),
    );
    assert_eq!(r.status, RunStatus::Blocked);
    let r2: RunResult = back(&r);
    assert_eq!(r2, r);
    let refused = rollback(&sb, "wf_v1", false);
    assert!(refused.conflicts[0].changed_by.is_some(), "{refused:?}");
    assert_eq!(back::<RollbackReport>(&refused), refused);
    let info = sb.rollback_info("wf_v2").unwrap();
    assert_eq!(back::<RollbackInfo>(&info), info);
    let done = rollback(&sb, "wf_v3", false);
    assert!(!done.steps.is_empty(), "{done:?}");
    assert_eq!(back::<RollbackReport>(&done), done);
    for s in [
        RunStatus::Success,
        RunStatus::SimulatedSuccess,
        RunStatus::Blocked,
        RunStatus::Failed,
        RunStatus::RolledBack,
    ] {
        assert_eq!(json!(s), json!(s.to_string()));
    }
    for s in [
        ActionStatus::Success,
        ActionStatus::Simulated,
        ActionStatus::Blocked,
        ActionStatus::Skipped,
        ActionStatus::Failed,
        ActionStatus::RolledBack,
    ] {
        assert_eq!(json!(s), json!(s.to_string()));
    }
}

/// A forced rollback overwrites whatever changed: a trail line of the file that cannot be
/// read (changed in place under the process) cannot change what force does.
#[test]
fn a_forced_rollback_needs_no_readable_trail() {
    let (w, sb) = history(
        b"v0\n",
        &[
            ("wf_1", "a1", "X\n"),
            ("wf_2", "b1", "Y\n"),
            ("wf_3", "c1", "X\n"),
        ],
    );
    let trail = w.state.join("sandbox_audit.jsonl");
    let text = std::fs::read_to_string(&trail).unwrap();
    let changed = text.replacen("\"workflow_id\":\"wf_3\"", "\"workflow_id\":\"wf_9\"", 1);
    assert_ne!(changed, text);
    std::fs::write(&trail, changed).unwrap();
    let rb = rollback(&sb, "wf_1", true);
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("f.txt"), b"v0\n");
}

/// Entries the runtime did not make in a workflow's snapshot folder refuse its rollback
/// (they may stand for snapshots moved away), all of them counted at once rather than
/// met one refusal at a time, with words that fit a file as well as a folder; once they
/// are gone, the rollback runs.
#[test]
fn stray_entries_in_a_workflows_snapshot_folder_are_counted_in_one_refusal() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    act(
        &sb,
        "wf_s",
        json!({"action_id": "a1", "intent": "create_file", "path": "k.txt", "content": "k"}),
    );
    let strays: Vec<_> = (0..3)
        .map(|i| w.path(&format!(".rollback/wf_s/notes{i}.txt")))
        .collect();
    for s in &strays {
        std::fs::write(s, b"mine").unwrap();
    }
    let rb = rollback_action(&sb, "wf_s", "a1", false);
    assert_eq!(rb.status, "refused", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
    let why = rb.reason.as_deref().unwrap();
    assert!(
        why.contains("2 more of the workflow's snapshot entries are not trusted either: inspect '.rollback/wf_s/' in each root"),
        "{why}"
    );
    assert!(why.contains("remove what stands there only if"), "{why}");
    assert_eq!(w.read("k.txt"), b"k");
    std::fs::remove_file(&strays[2]).unwrap();
    let rb = rollback_action(&sb, "wf_s", "a1", false);
    let why = rb.reason.as_deref().unwrap();
    assert!(
        why.contains("; 1 more of the workflow's snapshot entries is not trusted either"),
        "{why}"
    );
    for s in &strays[..2] {
        std::fs::remove_file(s).unwrap();
    }
    assert_eq!(rollback(&sb, "wf_s", false).status, "rolled_back");
    assert_eq!(w.tree(), before);
}

/// A restore made whose end then failed (the root's sync, say) is recorded as failed, for
/// it may not be on disk; a rollback run again finds its target as that restore left it
/// and finishes without force: the runtime's own restore is nobody else's change.
#[test]
fn a_restore_made_whose_end_failed_is_finished_unforced() {
    // Restored newest first: the directory, the replaced file, the created file.
    for k in 1..=3 {
        let w = World::new();
        w.write("rep.txt", b"old\n");
        let before = w.tree();
        let sb = w.sandbox();
        let r = run(
            &sb,
            json!({"workflow_id": "wf_s", "actions": [
                {"action_id": "a1", "intent": "create_file", "path": "new.txt", "content": "n"},
                {"action_id": "a2", "intent": "replace_file", "path": "rep.txt", "content": "new\n"},
                {"action_id": "a3", "intent": "create_directory", "path": "newdir"}]}),
        );
        assert_eq!(status(&r), "success", "{:?}", r.actions);
        sb.failpoints().arm("after_restore", k);
        let first = rollback(&sb, "wf_s", false);
        assert_ne!(first.status, "rolled_back", "{k}: {first:?}");
        let failed: Vec<_> = first.steps.iter().filter(|s| !s.restored).collect();
        assert_eq!(failed.len(), 1, "{k}: {first:?}");
        assert!(failed[0].is_unconfirmed(), "{k}: {first:?}");
        assert!(
            failed[0].reason.as_deref().is_some_and(|r| {
                r.starts_with("put back, but not confirmed: ")
                    && r.ends_with("; roll back again to finish")
            }),
            "{k}: {first:?}"
        );
        let again = rollback(&sb, "wf_s", false);
        assert_eq!(again.status, "rolled_back", "{k}: {again:?}");
        assert!(again.conflicts.is_empty(), "{k}: {again:?}");
        assert_eq!(w.tree(), before, "{k}");
    }
}

/// A directory the workflow made that cannot be listed for a cause that says nothing of
/// it (the process out of descriptors) refuses the rollback with `io_error`, to be tried
/// again: it is no change of someone else's, to be forced over.
#[test]
fn a_made_directory_out_of_descriptors_to_list_is_no_conflict() {
    let w = World::new();
    let before = w.tree();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_l", "actions": [
            {"action_id": "a1", "intent": "create_directory", "path": "made"}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    sb.failpoints()
        .arm_errno("list_made_dir", 1, rustix::io::Errno::MFILE.raw_os_error());
    let refused = rollback(&sb, "wf_l", false);
    assert_eq!(
        refused.reason_code,
        Some(ReasonCode::IoError),
        "{refused:?}"
    );
    assert!(refused.conflicts.is_empty(), "{refused:?}");
    assert!(w.path("made").is_dir());
    let again = rollback(&sb, "wf_l", false);
    assert_eq!(again.status, "rolled_back", "{again:?}");
    assert_eq!(w.tree(), before);
}

/// A restore that failed before it touched its target excuses nothing: a created file
/// found missing afterwards, its folder moved away with it, is someone else's change, as
/// without the failed try.
#[test]
fn a_restore_that_failed_untouched_excuses_no_later_change() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "dir/x.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    sb.failpoints().arm("during_restore", 1);
    let first = rollback(&sb, "wf_m", false);
    assert_eq!(first.status, "failed", "{first:?}");
    assert!(!first.steps[0].is_unconfirmed(), "{first:?}");
    assert!(
        first.steps[0]
            .reason
            .as_deref()
            .is_some_and(|r| !r.starts_with("put back")),
        "{first:?}"
    );
    std::fs::rename(w.path("dir"), w.path("moved")).unwrap();
    let again = rollback(&sb, "wf_m", false);
    assert_eq!(again.reason_code, Some(ReasonCode::Conflict), "{again:?}");
    assert_eq!(w.read("moved/x.txt"), b"x");
}

/// Forced, a made directory that cannot be listed blocks nothing: it is left in place,
/// as one that may hold another's, and the rest of the workflow is rolled back.
#[test]
fn a_forced_rollback_leaves_a_made_directory_it_cannot_list() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_lf", "actions": [
            {"action_id": "a1", "intent": "create_directory", "path": "made"},
            {"action_id": "a2", "intent": "create_file", "path": "other.txt", "content": "o"}]}),
    );
    assert_eq!(status(&r), "success", "{:?}", r.actions);
    sb.failpoints()
        .arm_errno("list_made_dir", 1, rustix::io::Errno::IO.raw_os_error());
    let forced = rollback(&sb, "wf_lf", true);
    assert_ne!(forced.status, "refused", "{forced:?}");
    assert!(!w.path("other.txt").exists(), "{forced:?}");
}

/// A restore mark whose name reached the disk and whose bytes did not (a power cut
/// before a `batched` rollback's sync point) is no mark: the step is judged by what its
/// file holds and the trail says. It was taken for a damaged record and refused every
/// later rollback of the workflow, forced too.
#[test]
fn an_empty_restore_mark_is_no_mark() {
    let w = World::new();
    w.write("a.txt", b"alpha\n");
    let original = w.tree();
    let sb = w.open(w.writable_config());
    let r = run(
        &sb,
        json!({"workflow_id": "wf_m", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "b.txt", "content": "beta\n"},
            {"action_id": "a2", "intent": "replace_file", "path": "a.txt", "content": "ALPHA\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().arm("during_restore", 2);
    let rb = sb.rollback_workflow("wf_m", &RollbackOptions::default());
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(w.read("a.txt"), b"alpha\n", "a2 restored before a1 failed");
    let mark = w.path(".rollback/wf_m/a2/restored.json");
    let file = std::fs::OpenOptions::new().write(true).open(mark).unwrap();
    file.set_len(0).unwrap();
    for opts in [RollbackOptions::default(), forced()] {
        let info = sb.rollback_info("wf_m");
        assert!(info.is_ok(), "{info:?}");
        let rb = sb.rollback_workflow("wf_m", &opts);
        assert_ne!(rb.reason_code, Some(ReasonCode::ChecksumMismatch), "{rb:?}");
        assert!(
            rb.status == "rolled_back" || rb.reason_code == Some(ReasonCode::NoRollbackData),
            "{rb:?}"
        );
    }
    assert_eq!(w.tree(), original);
    assert!(sb.audit_verify().unwrap().ok);
}

/// A forced rollback takes each target as it judged it, but replaces or removes only a
/// plain file: what another program puts at a target between that judgement and the
/// restore (a folder where the workflow made a file, a link to a file outside, a FIFO) is
/// left in place, the step failing with what to do, and nothing outside changes. Once it
/// is moved away, the rollback goes through.
#[test]
fn a_forced_rollback_leaves_what_another_program_puts_at_a_target_meanwhile() {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    type Plant = fn(&std::path::Path, &std::path::Path);
    let cases: [(&str, Plant, ReasonCode); 5] = [
        (
            "create_file",
            |t, _| {
                std::fs::create_dir(t).unwrap();
                std::fs::write(t.join("inner.txt"), b"theirs").unwrap();
            },
            ReasonCode::NotRegularFile,
        ),
        (
            "create_file",
            |t, _| std::fs::create_dir(t).unwrap(),
            ReasonCode::NotRegularFile,
        ),
        (
            "replace_file",
            |t, secret| std::os::unix::fs::symlink(secret, t).unwrap(),
            ReasonCode::Conflict,
        ),
        (
            "replace_file",
            |t, secret| std::fs::hard_link(secret, t).unwrap(),
            ReasonCode::Conflict,
        ),
        (
            "append_file",
            |t, _| {
                let made = std::process::Command::new("mkfifo").arg(t).status();
                assert!(made.unwrap().success());
            },
            ReasonCode::Conflict,
        ),
    ];
    for (n, (intent, plant, code)) in cases.into_iter().enumerate() {
        let w = World::new();
        let replaces = intent != "create_file";
        if replaces {
            w.write("d/t.txt", b"original\n");
        }
        let before = w.tree();
        let outside = w.outside_tree();
        let sb = w.sandbox();
        act(
            &sb,
            "wf_n",
            json!({"intent": intent, "path": "d/t.txt", "content": "workflow's\n"}),
        );
        let (target, secret) = (w.path("d/t.txt"), w.outside.join("secret.txt"));
        sb.failpoints().interleave(
            "during_restore",
            std::sync::Arc::new(move || {
                std::fs::remove_file(&target).unwrap();
                plant(&target, &secret);
            }),
        );
        let rb = rollback(&sb, "wf_n", true);
        assert_eq!(rb.status, "failed", "{n}: {rb:?}");
        assert_eq!(rb.reason_code, Some(code), "{n}: {rb:?}");
        let said = rb.reason.clone().unwrap_or_default();
        assert!(said.contains("move it away"), "{n}: {said}");
        let left = std::fs::symlink_metadata(w.path("d/t.txt")).unwrap();
        match n {
            0 => assert_eq!(w.read("d/t.txt/inner.txt"), b"theirs"),
            1 => assert!(left.is_dir()),
            2 => assert!(left.file_type().is_symlink()),
            3 => assert_eq!(left.nlink(), 2),
            _ => assert!(left.file_type().is_fifo()),
        }
        assert_eq!(w.outside_tree(), outside, "{n}");
        assert!(sb.audit_verify().unwrap().ok, "{n}");
        // Moved away, the rollback puts back what the workflow found.
        match n {
            0 | 1 => std::fs::remove_dir_all(w.path("d/t.txt")).unwrap(),
            _ => std::fs::remove_file(w.path("d/t.txt")).unwrap(),
        }
        let rb = rollback(&sb, "wf_n", true);
        assert_eq!(rb.status, "rolled_back", "{n}: {rb:?}");
        if replaces {
            assert_eq!(w.read("d/t.txt"), b"original\n", "{n}");
        } else {
            assert_eq!(w.tree(), before, "{n}");
        }
    }
}

/// A link put at a target as the rollback comes to it (after its look up front) makes
/// the step a conflict that says force would not help, as the look up front says.
#[test]
fn a_link_put_at_a_target_as_its_step_comes_is_not_for_force() {
    let w = World::new();
    w.write("t.txt", b"original\n");
    let sb = std::sync::Arc::new(w.sandbox());
    act(
        &sb,
        "wf_l",
        json!({"intent": "replace_file", "path": "t.txt", "content": "new\n"}),
    );
    let (target, secret) = (w.path("t.txt"), w.outside.join("secret.txt"));
    // The first look is the one up front; the link comes at the step's own.
    let again = std::sync::Arc::clone(&sb);
    sb.failpoints().interleave(
        "read_target",
        std::sync::Arc::new(move || {
            let (target, secret) = (target.clone(), secret.clone());
            again.failpoints().interleave(
                "read_target",
                std::sync::Arc::new(move || {
                    std::fs::remove_file(&target).unwrap();
                    std::os::unix::fs::symlink(&secret, &target).unwrap();
                }),
            );
        }),
    );
    let rb = rollback(&sb, "wf_l", false);
    assert_eq!(rb.status, "failed", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    let said = rb.reason.unwrap_or_default();
    assert!(
        said.contains("force would not help: move that away"),
        "{said}"
    );
    assert!(
        std::fs::symlink_metadata(w.path("t.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(w.outside_tree().len(), 1);
    assert_eq!(
        std::fs::read(w.outside.join("secret.txt")).unwrap(),
        b"outside-secret"
    );
}

/// A forced rollback restores over whatever the target holds when it looks at it, never
/// over what another program writes from that look on: an append landing then is kept
/// (`conflict`), and the rollback can be made again (recovery undoes a dead run's
/// action the same way).
#[test]
fn a_forced_rollback_keeps_an_append_made_after_its_look() {
    let w = World::new();
    w.write("log.txt", b"one\n");
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_f", "actions": [
            {"action_id": "a1", "intent": "replace_file", "path": "log.txt", "content": "two\n"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    sb.failpoints().interleave(
        "during_restore",
        another_program_appends(w.path("log.txt"), b"three\n"),
    );
    let rb = sb.rollback_workflow("wf_f", &forced());
    assert_ne!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(rb.reason_code, Some(ReasonCode::Conflict), "{rb:?}");
    assert_eq!(w.read("log.txt"), b"two\nthree\n");
    let rb = sb.rollback_workflow("wf_f", &forced());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert_eq!(w.read("log.txt"), b"one\n");
}
