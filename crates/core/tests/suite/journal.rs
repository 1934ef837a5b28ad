//! Audit chain, tamper detection, torn tails, registry index and lineage.

use crate::support::*;
use ailab_sandbox_core::artifact::{ArtifactEntry, ArtifactRegistry};
use ailab_sandbox_core::audit::AuditLog;
use ailab_sandbox_core::confine::RelPath;
use ailab_sandbox_core::confine::state::StateDir;
use serde_json::json;

/// A world whose audit head follows every append (`strict`): tampering after any line is
/// visible. Under `relaxed` the head moves only every 64 appends and at exit (see
/// `relaxed_heads_name_only_synced_lines`).
fn audited_world(n: usize) -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    let sb = w.open(strict(&w));
    let actions: Vec<_> = (0..n)
        .map(|i| json!({"intent": "create_file", "path": format!("f{i}.txt"), "content": "x"}))
        .collect();
    assert_eq!(
        status(&run(
            &sb,
            json!({"workflow_id": "wf_a", "actions": actions})
        )),
        "success"
    );
    (w, sb)
}

fn strict(w: &World) -> ailab_sandbox_core::Config {
    let mut c = w.writable_config();
    c.durability = ailab_sandbox_core::config::Durability::Strict;
    c
}

/// `audit verify` of the state as it is now, read-only and by a strict runtime opened on
/// it: the two must agree.
fn verified_both_ways(w: &World) -> [ailab_sandbox_core::audit::VerifyReport; 2] {
    [
        ailab_sandbox_core::audit::verify_read_only(&w.state, true).unwrap(),
        w.open(strict(w)).audit_verify().unwrap(),
    ]
}

fn audit_path(w: &World) -> std::path::PathBuf {
    w.state.join("sandbox_audit.jsonl")
}

fn lines(w: &World) -> Vec<String> {
    std::fs::read_to_string(audit_path(w))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(w: &World, lines: &[String]) {
    std::fs::write(
        audit_path(w),
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

#[test]
fn chain_verifies_and_is_sequential() {
    let (w, sb) = audited_world(5);
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 5);
    let entries: Vec<serde_json::Value> = lines(&w)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1);
        if i > 0 {
            assert_eq!(e["prev_hash"], entries[i - 1]["entry_hash"]);
        }
    }
}

#[test]
fn edited_line_is_detected() {
    let (w, sb) = audited_world(4);
    let mut l = lines(&w);
    l[1] = l[1].replace("create_file", "replace_file");
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(2));
    assert!(v.reason.unwrap().contains("edited"));
}

/// A field added to a line would vanish when the line is re-serialised for hashing, so
/// the chain alone would not see it: the line itself is refused.
#[test]
fn added_field_is_detected() {
    let (w, sb) = audited_world(3);
    let mut l = lines(&w);
    l[1] = l[1].replacen('{', r#"{"approved_by":"admin","#, 1);
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok, "{v:?}");
    assert_eq!(v.first_bad_seq, Some(2), "{v:?}");
    // In words, the place being the line's column (the parser's "line 1" is not the
    // log's line 1).
    let reason = v.reason.unwrap();
    assert!(
        reason
            .starts_with("line 2 is not a valid audit entry: the entry has no field 'approved_by'")
            && reason.ends_with("(column 14)")
            && !reason.contains("line 1"),
        "{reason}"
    );
}

/// The hash covers what a line means; the bytes must be as written too, so that no
/// edit passes, not even one that keeps the meaning.
#[test]
fn any_byte_edited_is_detected() {
    let (w, sb) = audited_world(3);
    let original = lines(&w);
    type Edit = fn(&str) -> String;
    let edits: [(&str, Edit); 5] = [
        ("space", |l| l.replacen(':', ": ", 1)),
        ("escape", |l| l.replacen("\"seq\"", "\"\\u0073eq\"", 1)),
        ("carriage return", |l| format!("{l}\r")),
        ("key order", |l| {
            let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(l).unwrap();
            let mut keys: Vec<_> = v.into_iter().collect();
            keys.reverse();
            serde_json::to_string(&keys.into_iter().collect::<serde_json::Map<_, _>>()).unwrap()
        }),
        ("blank line", |l| format!("{l}\n")),
    ];
    for (what, edit) in edits {
        let mut l = original.clone();
        l[1] = edit(&l[1]);
        assert_ne!(l[1], original[1], "{what}");
        write_lines(&w, &l);
        let v = sb.audit_verify().unwrap();
        assert!(!v.ok, "{what}: {v:?}");
        let bad = if what == "blank line" { 3 } else { 2 };
        assert_eq!(v.first_bad_seq, Some(bad), "{what}: {v:?}");
    }
    write_lines(&w, &original);
    assert!(sb.audit_verify().unwrap().ok);
}

#[test]
fn removed_line_is_detected() {
    let (w, sb) = audited_world(4);
    let mut l = lines(&w);
    l.remove(2);
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(3));
}

/// A line edited and given its new hash (but the chain not made again after it) reads
/// as sound by itself: the next line is where the chain breaks, and the report says
/// that the line before it may be the one changed.
#[test]
fn a_line_edited_and_rehashed_is_found_at_the_next() {
    let (w, sb) = audited_world(4);
    let mut l = lines(&w);
    let mut e: ailab_sandbox_core::audit::SandboxAuditEntry = serde_json::from_str(&l[1]).unwrap();
    e.target_path.push_str(".moved");
    e.entry_hash = String::new();
    e.entry_hash = e.compute_hash();
    l[1] = serde_json::to_string(&e).unwrap();
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(3), "{v:?}");
    assert!(
        v.reason
            .unwrap()
            .ends_with("or the line before it was edited and its hash made again"),
    );
}

#[test]
fn reordered_lines_are_detected() {
    let (w, sb) = audited_world(4);
    let mut l = lines(&w);
    l.swap(0, 1);
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(1));
}

#[test]
fn truncated_tail_is_detected_through_the_head() {
    let (w, sb) = audited_world(4);
    let mut l = lines(&w);
    l.truncate(3);
    write_lines(&w, &l);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(4));
    assert!(v.reason.unwrap().contains("removed from the end"));
}

/// The head catches a cut tail, but not one cut with the head rewritten to match (its
/// values are in the log), nor a trail removed with its head: the registry, a separate
/// file, still names the writes those lines recorded.
#[test]
fn writes_the_registry_holds_must_be_on_the_trail() {
    use ailab_sandbox_core::audit::verify_read_only;
    let (w, sb) = audited_world(4);
    let original = lines(&w);
    let head = w.state.join("sandbox_audit.head.json");
    let cut = |keep: usize| {
        write_lines(&w, &original[..keep]);
        let last: serde_json::Value = serde_json::from_str(&original[keep - 1]).unwrap();
        std::fs::write(
            &head,
            json!({"seq": last["seq"], "entry_hash": last["entry_hash"]}).to_string(),
        )
        .unwrap();
    };
    // The last write's line cut, the head pointed at the line before it.
    cut(original.len() - 1);
    for v in [
        sb.audit_verify().unwrap(),
        verify_read_only(&w.state, true).unwrap(),
    ] {
        assert!(!v.ok && !v.awaits_recovery(), "{v:?}");
        let reason = v.reason.unwrap();
        assert!(reason.contains("1 artifact(s)"), "{reason}");
        assert!(reason.contains("'wf_a'"), "{reason}");
    }
    std::fs::remove_file(audit_path(&w)).unwrap();
    std::fs::remove_file(&head).unwrap();
    drop(sb);
    for v in verified_both_ways(&w) {
        assert!(!v.ok, "{v:?}");
        assert!(v.reason.unwrap().contains("4 artifact(s)"));
    }
}

/// A write cut from the trail stays missing from it once a rollback has undone its
/// action: the rollback's line is its own run's, no record of the write, and must not
/// vouch for the artifact the write registered (anyone allowed to roll back could
/// otherwise hide the cut).
#[test]
fn a_rollback_line_does_not_stand_for_a_write_cut_from_the_trail() {
    let (w, sb) = audited_world(2);
    drop(sb);
    let original = lines(&w);
    let last: serde_json::Value = serde_json::from_str(&original[original.len() - 1]).unwrap();
    let kept: serde_json::Value = serde_json::from_str(&original[original.len() - 2]).unwrap();
    assert_eq!(last["status"], "success", "{last}");
    write_lines(&w, &original[..original.len() - 1]);
    std::fs::write(
        w.state.join("sandbox_audit.head.json"),
        json!({"seq": kept["seq"], "entry_hash": kept["entry_hash"]}).to_string(),
    )
    .unwrap();
    let sb = w.open(strict(&w));
    let undone = sb.rollback_workflow(
        "wf_a",
        &ailab_sandbox_core::RollbackOptions {
            action_id: Some(last["action_id"].as_str().unwrap().to_owned()),
            force: false,
        },
    );
    assert_eq!(undone.steps_rolled_back, 1, "{undone:?}");
    assert_eq!(lines(&w).len(), original.len(), "the rollback's line");
    drop(sb);
    for v in verified_both_ways(&w) {
        assert!(!v.ok, "{v:?}");
        let reason = v.reason.unwrap();
        assert!(
            reason.contains("1 artifact(s) whose writes the audit trail does not record"),
            "{reason}"
        );
    }
}

/// A line of a workflow edited in place (a write made to read as rolled back, its hash
/// left as it was) is not acted on: the rollback, which would have left that write's
/// file as it is, restores nothing and says why, and so does its preview.
#[test]
fn a_rollback_resting_on_an_edited_line_restores_nothing() {
    let (w, sb) = audited_world(2);
    drop(sb);
    let original = lines(&w);
    let n = original.len();
    assert!(original[n - 2].contains("\"status\":\"success\""));
    let mut edited = original.clone();
    edited[n - 2] = original[n - 2].replace("\"status\":\"success\"", "\"status\":\"rolled_back\"");
    write_lines(&w, &edited);
    let sb = w.open(strict(&w));
    let rb = sb.rollback_workflow("wf_a", &ailab_sandbox_core::RollbackOptions::default());
    assert_eq!(rb.status.as_str(), "refused", "{rb:?}");
    assert_eq!(
        rb.reason_code,
        Some(ailab_sandbox_core::ReasonCode::ChecksumMismatch),
        "{rb:?}"
    );
    assert!(
        rb.reason.as_deref().unwrap().contains(&format!(
            "entry {} of the audit trail, a line of workflow wf_a, does not match its hash",
            n - 1
        )),
        "{rb:?}"
    );
    assert!(w.root.join("f0.txt").exists() && w.root.join("f1.txt").exists());
    assert_eq!(
        lines(&w)[..n],
        edited[..],
        "nothing appended but the refusal"
    );
    let info = sb.rollback_info("wf_a").unwrap();
    assert!(!info.rollback_available, "{info:?}");
    assert_eq!(
        info.reason_code,
        Some(ailab_sandbox_core::ReasonCode::ChecksumMismatch),
        "{info:?}"
    );
    drop(sb);
    for v in verified_both_ways(&w) {
        assert!(!v.ok, "{v:?}");
    }
}

/// The trail, chained, names every file write it records as done: a registry line
/// removed, or its checksum or path changed, is found by `audit verify` (a folder, which
/// is no artifact, is not looked for).
#[test]
fn writes_the_trail_records_must_be_in_the_registry() {
    use ailab_sandbox_core::audit::verify_read_only;
    let (w, sb) = audited_world(4);
    assert_eq!(
        status(&run(
            &sb,
            json!({"workflow_id": "wf_d", "actions": [{"intent": "create_directory", "path": "d"}]})
        )),
        "success"
    );
    assert!(sb.audit_verify().unwrap().ok);
    drop(sb);
    let registry = w.state.join("artifacts.jsonl");
    let original = std::fs::read_to_string(&registry).unwrap();
    assert_eq!(original.lines().count(), 4);
    let removed: String = original
        .lines()
        .filter(|l| !l.contains("f1.txt"))
        .map(|l| format!("{l}\n"))
        .collect();
    let first: serde_json::Value = serde_json::from_str(original.lines().next().unwrap()).unwrap();
    let changed = original.replacen(
        first["checksum_sha256"].as_str().unwrap(),
        &"0".repeat(64),
        1,
    );
    // A line added beside an action's own, with other bytes or the same.
    let beside = |checksum: &str| {
        let mut extra = first.clone();
        let id = first["artifact_id"].as_str().unwrap();
        extra["artifact_id"] = json!(format!("{}beef", &id[..id.len() - 4]));
        extra["checksum_sha256"] = json!(checksum);
        format!("{original}{extra}\n")
    };
    let added = beside(&"f".repeat(64));
    let doubled = beside(first["checksum_sha256"].as_str().unwrap());
    let copied = format!("{original}{}\n", original.lines().next().unwrap());
    // Pointed at another file of the root: its lineage and listing would name that one.
    let moved = original.replacen("f0.txt", "other.txt", 1);
    for (case, tampered, line) in [
        ("removed", removed, "f1.txt"),
        ("changed", changed, "f0.txt"),
        ("moved", moved, "f0.txt"),
        ("added", added, "f0.txt"),
        ("doubled", doubled, "f0.txt"),
        ("copied", copied, "f0.txt"),
    ] {
        std::fs::write(&registry, &tampered).unwrap();
        for v in verified_both_ways(&w) {
            assert!(!v.ok, "{case}: {v:?}");
            let reason = v.reason.unwrap();
            assert!(
                reason
                    .contains("records 1 write(s) the artifact registry does not hold as recorded"),
                "{case}: {reason}"
            );
            assert!(reason.contains(line), "{case}: {reason}");
        }
        // Under `relaxed` a power cut may lose either file's lines: not compared.
        let mut relaxed = w.writable_config();
        relaxed.durability = ailab_sandbox_core::config::Durability::Relaxed;
        assert!(w.open(relaxed).audit_verify().unwrap().ok, "{case}");
    }
    // A whole line that is no artifact was put there, named by its number (a blank
    // line counted); a last line a crash cut short (no newline) was not.
    let (head, rest) = original.split_once('\n').unwrap();
    std::fs::write(&registry, format!("{head}\n\nnot an artifact\n{rest}")).unwrap();
    for v in verified_both_ways(&w) {
        assert!(!v.ok, "{v:?}");
        let reason = v.reason.unwrap();
        assert!(
            reason.contains(
                "1 line(s) that cannot be read as artifacts (the first: line 3 of artifacts.jsonl)"
            ),
            "garbage: {reason}"
        );
    }
    std::fs::write(&registry, format!("{original}{{\"artifact_id\": \"art_")).unwrap();
    assert!(verify_read_only(&w.state, true).unwrap().ok, "torn tail");
    assert!(w.open(strict(&w)).audit_verify().unwrap().ok, "torn tail");
    std::fs::write(&registry, &original).unwrap();
    assert!(w.open(strict(&w)).audit_verify().unwrap().ok);
    assert!(verify_read_only(&w.state, true).unwrap().ok);
}

/// An artifact credited to an action that registers none (a `create_directory`), or a
/// second one beside the artifact a failed action left, is found: the registry's lines
/// are checked against what each action could have registered, not only against the
/// trail's successful writes.
#[test]
fn artifacts_no_action_could_have_registered_are_found() {
    use ailab_sandbox_core::audit::verify_read_only;
    let (w, sb) = audited_world(1);
    assert_eq!(
        status(&run(
            &sb,
            json!({"workflow_id": "wf_d", "actions": [
                {"action_id": "mkdir", "intent": "create_directory", "path": "d"}]})
        )),
        "success"
    );
    sb.failpoints().arm("before_audit", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_f", "actions": [
            {"action_id": "late", "intent": "create_file", "path": "late.txt", "content": "y"}]}),
    );
    assert_eq!(status(&r), "rolled_back", "{r:?}");
    drop(sb);
    let registry = w.state.join("artifacts.jsonl");
    let original = std::fs::read_to_string(&registry).unwrap();
    let left: serde_json::Value = serde_json::from_str(
        original
            .lines()
            .find(|l| l.contains("\"wf_f\""))
            .expect("the failed action's artifact stays"),
    )
    .unwrap();
    assert!(w.open(strict(&w)).audit_verify().unwrap().ok);
    assert!(verify_read_only(&w.state, true).unwrap().ok);
    let forged = |workflow: &str, action: &str| {
        let mut extra = left.clone();
        let id = left["artifact_id"].as_str().unwrap();
        extra["artifact_id"] = json!(format!("{}beef", &id[..id.len() - 4]));
        extra["workflow_id"] = json!(workflow);
        extra["action_id"] = json!(action);
        format!("{original}{extra}\n")
    };
    for (case, tampered, said) in [
        (
            "a folder's",
            forged("wf_d", "mkdir"),
            "1 artifact(s) whose writes the audit trail does not record",
        ),
        (
            "a failed action's second",
            forged("wf_f", "late"),
            "more than one artifact for action 'late' of workflow 'wf_f'",
        ),
    ] {
        std::fs::write(&registry, &tampered).unwrap();
        for v in verified_both_ways(&w) {
            assert!(!v.ok, "{case}: {v:?}");
            let reason = v.reason.unwrap();
            assert!(reason.contains(said), "{case}: {reason}");
        }
    }
}

/// An action whose run failed after registering its artifact spent its id, as a
/// success does: once its snapshot is pruned, the same id is still refused, and the
/// registry never gets a second artifact for it that `audit verify` would take for
/// an added line.
#[test]
fn a_failed_actions_id_stays_spent_after_its_snapshot_is_pruned() {
    let (w, sb) = audited_world(1);
    let late = || {
        json!({"workflow_id": "wf_f", "actions": [
            {"action_id": "late", "intent": "create_file", "path": "late.txt", "content": "y"}]})
    };
    sb.failpoints().arm("before_audit", 1);
    assert_eq!(status(&run(&sb, late())), "rolled_back");
    w.clock.advance(chrono::Duration::days(2));
    let pruned = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(
        pruned.workflows_pruned.contains(&"wf_f".to_owned()),
        "{pruned:?}"
    );
    let again = run(&sb, late());
    assert_eq!(status(&again), "blocked", "{again:?}");
    assert_eq!(
        again.actions[0].reason_code,
        Some(ailab_sandbox_core::ReasonCode::InvalidId)
    );
    assert!(
        again.actions[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("action_id 'late' was already used in workflow 'wf_f'"),
        "{again:?}"
    );
    assert!(!w.root.join("late.txt").exists());
    drop(sb);
    for v in verified_both_ways(&w) {
        assert!(v.ok, "{v:?}");
    }
}

/// An action whose failure line could not be written (another process held the trail)
/// leaves only its undo line, written later: its id is spent all the same. One refused
/// before its snapshot wrote nothing, and its id stays free (README: a plan sent again
/// needs new ids for the actions that ran).
#[test]
fn an_undone_actions_id_stays_spent_and_a_refused_ones_stays_free() {
    let w = World::new();
    let mut c = strict(&w);
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c.clone());
    let held: std::sync::Arc<std::sync::Mutex<Option<std::fs::File>>> = Default::default();
    sb.failpoints().interleave("before_audit", {
        let (held, trail) = (std::sync::Arc::clone(&held), audit_path(&w));
        std::sync::Arc::new(move || {
            let mut held = held.lock().unwrap();
            if held.is_none() {
                let f = std::fs::File::open(&trail).unwrap();
                f.lock().unwrap();
                *held = Some(f);
            }
        })
    });
    let late = |id: &str| {
        json!({"workflow_id": "wf_h", "actions": [
            {"action_id": id, "intent": "create_file", "path": "late.txt", "content": "y"}]})
    };
    assert_eq!(status(&run(&sb, late("late"))), "rolled_back");
    drop(held.lock().unwrap().take());
    drop(sb);
    // The next start records the undo; the failure line was never written.
    let sb = w.open(c.clone());
    let spent = sb.audit_entries(10, Some("wf_h")).unwrap();
    assert!(
        spent
            .iter()
            .all(|e| e.status != ailab_sandbox_core::audit::AuditStatus::Failed)
            && spent
                .iter()
                .any(|e| e.status == ailab_sandbox_core::audit::AuditStatus::RolledBack),
        "{spent:?}"
    );
    w.clock.advance(chrono::Duration::days(2));
    let pruned = sb.prune(std::time::Duration::from_secs(86_400)).unwrap();
    assert!(
        pruned.workflows_pruned.contains(&"wf_h".to_owned()),
        "{pruned:?}"
    );
    let again = run(&sb, late("late"));
    assert_eq!(
        again.actions[0].reason_code,
        Some(ailab_sandbox_core::ReasonCode::InvalidId),
        "{again:?}"
    );
    // Refused before its snapshot (a file put in its way meanwhile): nothing written,
    // id free.
    let first = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "one.txt", "content": "1"},
            {"action_id": "a2", "intent": "create_file", "path": "two.txt", "content": "2"}]}),
    );
    assert_eq!(status(&first), "success", "{first:?}");
    sb.failpoints().interleave("after_mutate", {
        let free = w.path("free2.txt");
        std::sync::Arc::new(move || {
            if !free.exists() {
                std::fs::write(&free, b"in the way").unwrap();
            }
        })
    });
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "b1", "intent": "create_file", "path": "b1.txt", "content": "1"},
            {"action_id": "b2", "intent": "create_file", "path": "free2.txt", "content": "2"}]}),
    );
    assert_eq!(action_status(&r, 1), "failed", "{r:?}");
    assert_eq!(
        r.actions[1].reason_code,
        Some(ailab_sandbox_core::ReasonCode::AlreadyExists),
        "{r:?}"
    );
    assert!(!w.path(".rollback/wf_r/b2").exists());
    std::fs::remove_file(w.path("free2.txt")).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_r", "actions": [
            {"action_id": "b3", "intent": "create_file", "path": "b1.txt", "content": "1"},
            {"action_id": "b2", "intent": "create_file", "path": "free2.txt", "content": "2"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    drop(sb);
    for v in verified_both_ways(&w) {
        assert!(v.ok, "{v:?}");
    }
}

/// A simulation is audited (SPEC §4): with the trail held past the wait it is refused
/// (`conflict`), not answered as a simulated success that left no line.
#[test]
fn a_simulation_the_trail_cannot_take_is_refused() {
    let w = World::new();
    let mut c = strict(&w);
    c.dry_run = true;
    c.limits.lock_wait_seconds = 1;
    let sb = w.open(c);
    let plan = || {
        json!({"workflow_id": "wf_sim", "actions": [
            {"intent": "create_file", "path": "s.txt", "content": "s"}]})
    };
    let trail = std::fs::File::open(audit_path(&w)).unwrap();
    trail.lock().unwrap();
    let r = run(&sb, plan());
    trail.unlock().unwrap();
    assert_eq!(status(&r), "blocked", "{r:?}");
    assert_eq!(
        r.actions[0].reason_code,
        Some(ailab_sandbox_core::ReasonCode::Conflict),
        "{r:?}"
    );
    assert!(
        r.actions[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("could not audit the simulated run"),
        "{r:?}"
    );
    let r = run(&sb, plan());
    assert_eq!(status(&r), "simulated_success", "{r:?}");
    let lines = sb.audit_entries(10, Some("wf_sim")).unwrap();
    assert!(
        lines.iter().any(|e| e.execution_id == r.execution_id),
        "{lines:?}"
    );
}

/// Writes under way while the trail is verified are not taken for lines removed.
#[test]
fn writes_under_way_do_not_fail_verification() {
    let w = World::new();
    let mut c = strict(&w);
    c.limits.writes_per_minute = 10_000;
    let sb = std::sync::Arc::new(w.open(c));
    let writer = std::thread::spawn({
        let sb = std::sync::Arc::clone(&sb);
        move || {
            for i in 0..40 {
                let r = run(
                    &sb,
                    json!({"workflow_id": format!("wf_{}", i % 4), "actions": [{"intent": "create_file", "path": format!("w{i}.txt"), "content": "x"}]}),
                );
                assert_eq!(status(&r), "success");
            }
        }
    });
    let mut checks = 0;
    while !writer.is_finished() {
        let v = sb.audit_verify().unwrap();
        assert!(v.ok, "{v:?}");
        checks += 1;
    }
    writer.join().unwrap();
    assert!(sb.audit_verify().unwrap().ok);
    assert!(checks > 0);
}

/// A state directory the runtime cannot open for writing can still have its trail
/// verified, with the same verdicts, and nothing is written there.
#[test]
fn the_trail_verifies_read_only_alike() {
    use ailab_sandbox_core::audit::verify_read_only;
    let (w, sb) = audited_world(4);
    drop(sb);
    let tree = |w: &World| {
        let mut names: Vec<_> = std::fs::read_dir(&w.state)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().len())
            })
            .collect();
        names.sort();
        names
    };
    let before = tree(&w);
    let v = verify_read_only(&w.state, true).unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 4);
    let original = lines(&w);
    let mut l = original.clone();
    l.truncate(3);
    write_lines(&w, &l);
    let v = verify_read_only(&w.state, true).unwrap();
    assert_eq!((v.ok, v.first_bad_seq), (false, Some(4)), "{v:?}");
    l[1] = l[1].replace("create_file", "replace_file");
    write_lines(&w, &l);
    let v = verify_read_only(&w.state, true).unwrap();
    assert_eq!((v.ok, v.first_bad_seq), (false, Some(2)), "{v:?}");
    write_lines(&w, &original);
    std::fs::remove_file(w.state.join("sandbox_audit.head.json")).unwrap();
    let v = verify_read_only(&w.state, true).unwrap();
    assert!(!v.ok && v.reason.unwrap().contains("missing"));
    let after = tree(&w);
    assert_eq!(after.len(), before.len() - 1, "nothing made: {after:?}");
    // A state directory that is not there is an error, and is not made.
    let gone = w.state.join("nope");
    assert!(verify_read_only(&gone, true).is_err());
    assert!(!gone.exists());
}

fn one_more_line(sb: &ailab_sandbox_core::Sandbox, path: &str) {
    run(
        sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": path, "content": "x"}]}),
    );
}

/// Later appends, in the process that saw the cut and in the next one, do not move the
/// head back over it: the cut stays visible to `audit verify`.
#[test]
fn a_cut_tail_stays_detected_after_more_appends() {
    let (w, sb) = audited_world(6);
    let mut l = lines(&w);
    l.truncate(3);
    write_lines(&w, &l);
    assert!(sb.state_doc().unwrap().notices.is_empty());
    one_more_line(&sb, "g1.txt");
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok, "{v:?}");
    assert!(sb.audit_log().head_problem().is_some());
    // The process that found it says so in its state, as the next start does.
    let notices = sb.state_doc().unwrap().notices;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].starts_with("the audit trail was tampered with: "),
        "{notices:?}"
    );
    drop(sb);
    let sb = w.sandbox();
    assert_noticed(&sb, "tampered");
    assert_eq!(sb.state_doc().unwrap().notices.len(), 1, "said once");
    for i in 0..4 {
        one_more_line(&sb, &format!("h{i}.txt"));
    }
    assert!(lines(&w).len() > 6, "the log grew past the old head");
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok, "{v:?}");
    assert_eq!(v.first_bad_seq, Some(6));
    assert!(v.reason.unwrap().contains("rewritten"));
}

/// A removed or damaged head is reported by `audit verify` and is not quietly made
/// again by the next append or start.
#[test]
fn a_removed_or_damaged_head_is_reported() {
    let head = |w: &World| w.state.join("sandbox_audit.head.json");
    let (w, sb) = audited_world(3);
    std::fs::remove_file(head(&w)).unwrap();
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert!(v.reason.unwrap().contains("missing"));
    one_more_line(&sb, "g.txt");
    drop(sb);
    let sb = w.sandbox();
    one_more_line(&sb, "h.txt");
    assert!(!head(&w).exists());
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert_eq!(v.entries, 5, "the chain itself is whole");
    assert!(v.reason.unwrap().contains("missing"));
    drop(sb);

    let (w, sb) = audited_world(2);
    std::fs::write(head(&w), b"not json").unwrap();
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok);
    assert!(v.reason.unwrap().contains("damaged"));
    drop(sb);
    let sb = w.sandbox();
    one_more_line(&sb, "g.txt");
    assert_eq!(std::fs::read(head(&w)).unwrap(), b"not json");
    assert!(!sb.audit_verify().unwrap().ok);
}

fn head_seq(w: &World) -> u64 {
    let head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state.join("sandbox_audit.head.json")).unwrap())
            .unwrap();
    head["seq"].as_u64().unwrap()
}

/// A head that cannot be written after the lines are (an I/O error on its block) only
/// lags: the append stands, the action succeeds, and the chain stays whole; the next
/// append brings the head forward.
#[test]
fn a_head_that_cannot_follow_the_log_only_lags() {
    let w = World::new();
    let sb = w.open(strict(&w));
    one_more_line(&sb, "a.txt");
    sb.failpoints().arm("audit_head", 1);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_h", "actions": [{"intent": "create_file", "path": "b.txt", "content": "b"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    assert_eq!(w.read("b.txt"), b"b");
    assert_eq!(head_seq(&w), 1, "lags the log");
    one_more_line(&sb, "c.txt");
    assert_eq!(head_seq(&w), 3);
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 3);
}

/// Under `relaxed` durability appends are not synced, so a power cut may lose the last
/// lines: the head names only lines the log itself has synced — every 64 appends and at
/// exit — and a lost tail of unsynced lines is not taken for tampering.
#[test]
fn relaxed_heads_name_only_synced_lines() {
    let w = World::new();
    let sb = w.sandbox();
    for i in 0..3 {
        one_more_line(&sb, &format!("a{i}.txt"));
    }
    assert_eq!(head_seq(&w), 0, "no head over unsynced lines");
    // A power cut: the process never exits, and the last line never reached the disk.
    std::mem::forget(sb);
    let mut l = lines(&w);
    l.truncate(2);
    write_lines(&w, &l);
    let sb = w.sandbox();
    assert!(
        sb.notices().iter().all(|n| !n.contains("tampered")),
        "{:?}",
        sb.notices()
    );
    assert!(sb.audit_verify().unwrap().ok);
    for i in 0..70 {
        one_more_line(&sb, &format!("b{i}.txt"));
    }
    assert_eq!(head_seq(&w), 2 + 64, "moved after 64 appends");
    drop(sb);
    assert_eq!(head_seq(&w), 2 + 70, "caught up at exit");
    assert!(w.sandbox().audit_verify().unwrap().ok);
}

/// A new state directory gets its head before its first line, so a missing head is
/// never the trace of a crash.
#[test]
fn a_new_log_starts_with_a_head() {
    let w = World::new();
    let sb = w.sandbox();
    let head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state.join("sandbox_audit.head.json")).unwrap())
            .unwrap();
    assert_eq!(head["seq"], 0);
    let v = sb.audit_verify().unwrap();
    assert!(v.ok && v.entries == 0, "{v:?}");
    one_more_line(&sb, "g.txt");
    let v = sb.audit_verify().unwrap();
    assert!(v.ok && v.entries == 1, "{v:?}");
}

#[test]
fn newline_in_a_payload_cannot_forge_a_line() {
    let w = World::new();
    let sb = w.sandbox();
    let forged = "x\n{\"seq\":99}";
    run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": forged, "content": "x"}]}),
    );
    let l = lines(&w);
    assert_eq!(l.len(), 1, "one refused action, one line");
    let e: serde_json::Value = serde_json::from_str(&l[0]).unwrap();
    assert_eq!(e["target_path"], forged);
    assert_eq!(e["reason_code"], "path_traversal");
    assert!(sb.audit_verify().unwrap().ok);
}

#[test]
fn torn_last_line_is_repaired_on_open() {
    let (w, sb) = audited_world(3);
    drop(sb);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(audit_path(&w))
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"seq\":4,\"timest").unwrap();
    drop(f);
    let sb = w.sandbox();
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 3);
    let r = run(
        &sb,
        json!({"workflow_id": "wf_b", "actions": [{"intent": "create_file", "path": "g.txt", "content": "x"}]}),
    );
    assert_eq!(status(&r), "success");
    let v = sb.audit_verify().unwrap();
    assert!(v.ok);
    assert_eq!(v.entries, 4);
    assert!(std::fs::read(audit_path(&w)).unwrap().ends_with(b"\n"));
}

/// A last line that lost only its newline is a whole entry, recorded in the head: it
/// is ended, not dropped, in the audit log and in the registry alike.
#[test]
fn a_last_line_missing_only_its_newline_is_kept() {
    let (w, sb) = audited_world(3);
    drop(sb);
    let registry = w.state.join("artifacts.jsonl");
    for path in [audit_path(&w), registry.clone()] {
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
    }
    let sb = w.sandbox();
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 3);
    assert_eq!(sb.registry().len().unwrap(), 3);
    for path in [audit_path(&w), registry] {
        assert!(
            std::fs::read(&path).unwrap().ends_with(b"}\n"),
            "{}",
            path.display()
        );
    }
}

/// A tail of zeros (a sparse file's hole, which costs no disk) is cut like any torn line,
/// and so is one that looks like a line from its first and last bytes but holds zeros
/// (judged as it is read: a hole of gigabytes is not held in memory to be judged).
#[test]
fn a_tail_of_zeros_is_cut_however_long() {
    let (w, sb) = audited_world(3);
    drop(sb);
    let path = audit_path(&w);
    let whole = std::fs::read(&path).unwrap();
    for (head, end) in [(&b""[..], &b""[..]), (b"{\"seq\":4,\"a\":\"", b"\"}")] {
        std::fs::write(&path, &whole).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, head).unwrap();
        f.set_len(f.metadata().unwrap().len() + (64 << 20)).unwrap();
        std::io::Write::write_all(&mut f, end).unwrap();
        drop(f);
        let sb = w.sandbox();
        let v = sb.audit_verify().unwrap();
        assert!(v.ok, "{v:?}");
        assert_eq!(v.entries, 3);
        drop(sb);
        assert_eq!(std::fs::read(&path).unwrap(), whole);
    }
}

/// A world and an audit log on its state directory, appends not synced.
fn relaxed_log() -> (World, StateDir, AuditLog) {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let log = AuditLog::open(&state, false, 10).unwrap();
    (w, state, log)
}

fn rec(i: usize) -> ailab_sandbox_core::audit::AuditRecord {
    ailab_sandbox_core::audit::AuditRecord {
        timestamp: format!("2026-01-01T00:00:{i:02}Z"),
        execution_id: "ex".into(),
        workflow_id: "wf".into(),
        action_id: format!("a{i}"),
        mutation_class: None,
        mutation_type: "create_file".into(),
        target_path: "p".into(),
        before_checksum: None,
        after_checksum: None,
        rollback_available: false,
        rollback_path: None,
        status: ailab_sandbox_core::audit::AuditStatus::Blocked,
        reason_code: None,
        error: None,
    }
}

#[test]
fn two_logs_on_one_file_keep_one_chain() {
    let (_w, state, a) = relaxed_log();
    let b = AuditLog::open(&state, false, 10).unwrap();
    for i in 0..10 {
        let log = if i % 2 == 0 { &a } else { &b };
        let written = log.append(vec![rec(i)]).unwrap();
        assert_eq!(written[0].seq, i as u64 + 1);
    }
    assert!(a.verify().unwrap().ok);
    assert_eq!(b.get_sandbox_audit_stats().unwrap().total, 10);
}

/// A successful write of `path` by action `a{i}` of workflow `wf`.
fn change(i: usize, path: &str) -> ailab_sandbox_core::audit::AuditRecord {
    ailab_sandbox_core::audit::AuditRecord {
        target_path: path.into(),
        status: ailab_sandbox_core::audit::AuditStatus::Success,
        after_checksum: Some(format!("{i:064x}")),
        ..rec(i)
    }
}

/// A trail line with a byte that is not UTF-8 is not indexed and is what `verify`
/// reports; the lines around it, read in the same chunk, are indexed as ever.
#[test]
fn a_trail_line_that_is_not_utf8_is_skipped_alone() {
    let (w, state, a) = relaxed_log();
    a.append(vec![
        change(0, "a.txt"),
        change(1, "bé.txt"),
        change(2, "c✓.txt"),
    ])
    .unwrap();
    let mut bytes = std::fs::read(audit_path(&w)).unwrap();
    let at = bytes.windows(2).position(|p| p == "é".as_bytes()).unwrap();
    bytes[at] = 0xff;
    std::fs::write(audit_path(&w), &bytes).unwrap();
    let b = AuditLog::open(&state, false, 10).unwrap();
    assert_eq!(b.get_sandbox_audit_stats().unwrap().total, 2);
    let listed: Vec<(String, String)> = b
        .list(10, None)
        .unwrap()
        .into_iter()
        .map(|e| (e.action_id, e.target_path))
        .collect();
    assert_eq!(
        listed,
        [
            ("a2".into(), "c✓.txt".into()),
            ("a0".into(), "a.txt".into())
        ]
    );
    let report = b.verify().unwrap();
    assert!(!report.ok);
    assert_eq!(report.first_bad_seq, Some(2));
}

#[test]
fn a_trail_cut_under_an_open_log_is_indexed_as_it_now_is() {
    let (w, state, a) = relaxed_log();
    a.append((0..3).map(rec).collect()).unwrap();
    assert_eq!(a.get_sandbox_audit_stats().unwrap().total, 3);
    let first = lines(&w).remove(0);
    std::fs::write(audit_path(&w), format!("{first}\n")).unwrap();
    let b = AuditLog::open(&state, false, 10).unwrap();
    assert_eq!(b.append(vec![rec(7)]).unwrap()[0].seq, 2);
    // Not the three lines read before the cut plus the two there now.
    assert_eq!(a.get_sandbox_audit_stats().unwrap().total, 2);
    let listed: Vec<String> = a
        .list(10, None)
        .unwrap()
        .into_iter()
        .map(|e| e.action_id)
        .collect();
    assert_eq!(listed, ["a7", "a0"]);
}

#[test]
fn a_line_changed_in_place_under_an_open_log_is_refused_not_read() {
    let (w, _state, log) = relaxed_log();
    log.append((0..3).map(rec).collect()).unwrap();
    assert_eq!(log.by_workflow("wf").unwrap().len(), 3);
    // Same length, so the log does not look cut: line 2 now says seq 9.
    let mut text = lines(&w);
    text[1] = text[1].replacen("\"seq\":2,", "\"seq\":9,", 1);
    write_lines(&w, &text);
    let err = log.by_workflow("wf").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains("audit line 2") && err.to_string().contains("audit verify"),
        "{err}"
    );
    assert_eq!(
        log.list(10, None).unwrap_err().kind(),
        std::io::ErrorKind::InvalidData
    );
    assert!(!log.verify().unwrap().ok);
    // Line 3 put under another workflow, seq and length kept: not given as the first's.
    let mut text = lines(&w);
    text[1] = text[1].replacen("\"seq\":9,", "\"seq\":2,", 1);
    text[2] = text[2].replacen("\"workflow_id\":\"wf\"", "\"workflow_id\":\"wg\"", 1);
    write_lines(&w, &text);
    let err = log.list(10, Some("wf")).unwrap_err();
    assert!(err.to_string().contains("audit line 3"), "{err}");
    // Any edit, even one that keeps the line's length, seq and workflow.
    text[2] = text[2].replacen("\"workflow_id\":\"wg\"", "\"workflow_id\":\"wf\"", 1);
    text[0] = text[0].replacen("\"status\":\"blocked\"", "\"status\":\"success\"", 1);
    write_lines(&w, &text);
    assert_eq!(log.list(2, None).unwrap().len(), 2);
    let err = log.list(3, None).unwrap_err();
    assert!(err.to_string().contains("audit line 1"), "{err}");
}

#[test]
fn a_trail_cut_and_written_again_under_an_open_log_is_indexed_as_it_now_is() {
    let (w, state, a) = relaxed_log();
    a.append((0..3).map(rec).collect()).unwrap();
    assert_eq!(a.get_sandbox_audit_stats().unwrap().total, 3);
    std::fs::write(audit_path(&w), "").unwrap();
    let b = AuditLog::open(&state, false, 10).unwrap();
    b.append(
        (0..5)
            .map(|i| ailab_sandbox_core::audit::AuditRecord {
                workflow_id: "other".into(),
                ..rec(10 + i)
            })
            .collect(),
    )
    .unwrap();
    // Longer than before the cut: only what was read before says it is not the same.
    assert_eq!(a.get_sandbox_audit_stats().unwrap().total, 5);
    assert!(a.by_workflow("wf").unwrap().is_empty());
    assert_eq!(a.by_workflow("other").unwrap().len(), 5);
    assert_eq!(a.append(vec![rec(20)]).unwrap()[0].seq, 6);
}

#[test]
fn changes_to_a_file_are_found_by_name_before_and_after_the_first_look() {
    let (_w, state, log) = relaxed_log();
    log.append(vec![
        change(0, "/r/d/f.txt"),
        change(1, "/r/g.txt"),
        change(2, "/r/f.txt"),
        rec(3),
    ])
    .unwrap();
    let found = |name: &str| -> Vec<String> {
        log.changes_since(name, |t| t.ends_with(name), "", "")
            .unwrap()
            .into_iter()
            .map(|e| e.action_id)
            .collect()
    };
    assert_eq!(found("f.txt"), ["a0", "a2"]);
    // Lines appended after the first look, by this log and by another.
    log.append(vec![change(4, "/r/f.txt")]).unwrap();
    AuditLog::open(&state, false, 10)
        .unwrap()
        .append(vec![change(5, "/s/f.txt"), change(6, "/s/h.txt")])
        .unwrap();
    assert_eq!(found("f.txt"), ["a0", "a2", "a4", "a5"]);
    assert_eq!(found("h.txt"), ["a6"]);
    assert_eq!(found("g.txt"), ["a1"]);
    assert!(found("p").is_empty(), "refusals are not changes");
}

/// A change to `/r/f.txt` dated `ts`.
fn change_at(i: usize, ts: &str) -> ailab_sandbox_core::audit::AuditRecord {
    ailab_sandbox_core::audit::AuditRecord {
        timestamp: ts.into(),
        ..change(i, "/r/f.txt")
    }
}

/// The actions of the changes to files named `f.txt` since `t`, as `log` finds them.
fn f_changes_since(log: &AuditLog, t: &str) -> std::io::Result<Vec<String>> {
    Ok(log
        .changes_since("f.txt", |_| true, t, "")?
        .into_iter()
        .map(|e| e.action_id)
        .collect())
}

/// Changes the action id `a0` of the trail's first line in place, as an edit under a
/// running process would: a look that reads the line back refuses it.
fn change_the_first_line_in_place(w: &World) {
    let mut bytes = std::fs::read(audit_path(w)).unwrap();
    let first = bytes.iter().position(|&b| b == b'\n').unwrap();
    let at = bytes[..first]
        .windows(4)
        .position(|p| p == b"\"a0\"")
        .unwrap();
    bytes[at + 2] = b'9';
    std::fs::write(audit_path(w), &bytes).unwrap();
}

/// A target's changes since a snapshot are looked for among the lines that can be
/// dated after it only: a trail naming one file name many thousand times is not read
/// back whole for each rollback. Dates in other shapes than the trail's own are read.
#[test]
fn changes_since_a_time_read_no_line_dated_before_its_second() {
    let (w, _state, log) = relaxed_log();
    log.append(vec![
        change_at(0, "2026-01-01T00:00:01.000000Z"),
        change_at(1, "2026-01-01T00:00:03.000000Z"),
        change_at(2, "2026-01-01T00:00:03.500000Z"),
        change_at(3, "2026-01-01T00:00:05.000000Z"),
        change_at(4, "2026-01-01T00:00:09Z"),
        change_at(5, "2026-01-01T00:00:02.000000Z"),
        change_at(6, "2026-01-01T00:00:04.000000+01:00"),
        change_at(7, "2025-12-31T23:59:59.999999Z"),
    ])
    .unwrap();
    let since = |t: &str| f_changes_since(&log, t);
    let after_3 = ["a2", "a6", "a3", "a4"];
    assert_eq!(since("2026-01-01T00:00:03.000000Z").unwrap(), after_3);
    change_the_first_line_in_place(&w);
    assert_eq!(since("2026-01-01T00:00:03.000000Z").unwrap(), after_3);
    assert_eq!(since("2026-01-01T00:00:08.000000Z").unwrap(), ["a4"]);
    let err = since("2026-01-01T00:00:01.500000Z").unwrap_err();
    assert!(err.to_string().contains("audit line 1"), "{err}");
    assert!(since("").is_err());
    assert!(
        since("Jan 1").is_err(),
        "a time in another shape reads every line"
    );
}

/// Lines dated out of order (a recovery records a dead run's write after the fact) do
/// not end the look-up of the changes since a time: an earlier-dated line between two
/// later ones hides neither.
#[test]
fn changes_since_a_time_are_found_past_a_line_dated_out_of_order() {
    let (w, _state, log) = relaxed_log();
    let at = |i: usize, s: &str| change_at(i, &format!("2026-01-01T00:00:{s}.000000Z"));
    let since = |s: &str| f_changes_since(&log, &format!("2026-01-01T00:00:{s}.000000Z"));
    log.append(vec![at(0, "10"), at(1, "20"), at(2, "11"), at(3, "13")])
        .unwrap();
    assert_eq!(since("12").unwrap(), ["a3", "a1"]);
    // Appended after the first look, linked as they come.
    log.append(vec![at(4, "05"), at(5, "30")]).unwrap();
    assert_eq!(since("12").unwrap(), ["a3", "a1", "a5"]);
    // The first line is not walked to for a time after it.
    change_the_first_line_in_place(&w);
    assert_eq!(since("12").unwrap(), ["a3", "a1", "a5"]);
    assert!(since("09").is_err());
}

/// A line dated before 2000 (a clock not yet set at boot) orders below every other:
/// the lines after it are not all read for its sake.
#[test]
fn a_line_dated_before_2000_does_not_make_later_look_ups_read_it() {
    let (w, _state, log) = relaxed_log();
    log.append(vec![
        change_at(0, "1970-01-01T00:00:05.000000Z"),
        change_at(1, "2026-01-01T00:00:10.000000Z"),
        change_at(2, "2026-01-01T00:00:20.000000Z"),
    ])
    .unwrap();
    let since = |t: &str| f_changes_since(&log, t);
    assert_eq!(since("2026-01-01T00:00:15.000000Z").unwrap(), ["a2"]);
    assert_eq!(
        since("1969-12-31T00:00:00.000000Z").unwrap(),
        ["a0", "a1", "a2"]
    );
    change_the_first_line_in_place(&w);
    assert_eq!(since("2026-01-01T00:00:15.000000Z").unwrap(), ["a2"]);
    assert!(since("1969-12-31T00:00:00.000000Z").is_err());
}

/// Recovery's look-up of a target's last recorded change gives what the look-up of all
/// its changes ends with (the latest by timestamp, the later line of two dated alike),
/// over trails dated out of order, in other shapes, before 2000, with refusals and
/// other targets of the same names between, before and after the index by name is built.
#[test]
fn the_last_change_to_a_target_is_the_latest_of_all_its_changes() {
    use ailab_sandbox_core::audit::{AuditRecord, AuditStatus, Ending};
    let (_w, _state, log) = relaxed_log();
    let targets = [
        "/r/a/f.txt",
        "/r/b/f.txt",
        "/r/a/g.txt",
        "/r/c/f.txt",
        "/r/b/a/f.txt",
    ];
    let mut r = 7u64;
    let mut next = |n: u64| {
        r = r
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (r >> 33) % n
    };
    let mut i = 0usize;
    for round in 0..12 {
        let lines: Vec<AuditRecord> = (0..150)
            .map(|_| {
                i += 1;
                // Mostly later than the line before, often alike, sometimes earlier;
                // hundreds of lines dated in each second.
                let second = (i / 100 + next(3) as usize) % 3600;
                let timestamp = match next(60) {
                    0 => format!("2026-01-01T00:{:02}:{:02}Z", second / 60, second % 60),
                    1 => "1970-01-01T00:00:00.000000Z".into(),
                    2 => "2026-01-01T00:00:00.000000Z".into(),
                    _ => format!(
                        "2026-01-01T{:02}:{:02}:{:02}.{:06}Z",
                        second / 3600,
                        second / 60 % 60,
                        second % 60,
                        next(3) * 100
                    ),
                };
                let status = match next(8) {
                    0 => AuditStatus::Blocked,
                    1 => AuditStatus::RolledBack,
                    2 => AuditStatus::Failed,
                    _ => AuditStatus::Success,
                };
                AuditRecord {
                    timestamp,
                    status,
                    execution_id: if next(30) == 0 {
                        String::new()
                    } else {
                        "ex".into()
                    },
                    ..change(i, targets[next(targets.len() as u64) as usize])
                }
            })
            .collect();
        log.append(lines).unwrap();
        for target in targets {
            let mut parts = target.rsplit('/');
            let name = parts.next().unwrap();
            let rel = RelPath::from_components(
                parts
                    .next()
                    .into_iter()
                    .chain([name])
                    .map(String::from)
                    .collect(),
            );
            let seqs = |v: Vec<ailab_sandbox_core::audit::SandboxAuditEntry>| -> Vec<u64> {
                v.into_iter().map(|e| e.seq).collect()
            };
            let all = seqs(log.changes_since(name, |t| t == target, "", "").unwrap());
            let by_folder = seqs(log.changes_since(&rel, |t| t == target, "", "").unwrap());
            assert_eq!(by_folder, all, "round {round}, {target}");
            for e in [Ending::from(&rel), name.into()] {
                let last = log.last_change(e, |t| t == target).unwrap();
                assert_eq!(
                    last.map(|e| e.seq),
                    all.last().copied(),
                    "round {round}, {target}"
                );
            }
        }
    }
    assert!(log.last_change("h.txt", |_| true).unwrap().is_none());
}

/// The look-up of a target's last change reads back only the lines of its name that
/// may be dated after it, and never past the first that cannot: a common name is not
/// read back whole for each target a recovery judges.
#[test]
fn the_last_change_to_a_target_reads_no_line_dated_before_its_second() {
    let (w, _state, log) = relaxed_log();
    let at = |i: usize, path: &str, s: u32, micros: u32| ailab_sandbox_core::audit::AuditRecord {
        timestamp: format!("2026-01-01T00:{:02}:{:02}.{micros:06}Z", s / 60, s % 60),
        ..change(i, path)
    };
    // Of the target: a0 (the first line), then its last change (a1); 300 changes to
    // another file of its name dated before it; two more of the target dated in the
    // same second but earlier, read first (from the newest); then 300 more changes to
    // the other file, a second apart.
    let mut lines = vec![at(0, "/r/f.txt", 1, 0), at(1, "/r/f.txt", 5, 700_000)];
    lines.extend((2..302).map(|i| at(i, "/s/f.txt", 2, 0)));
    lines.push(at(302, "/r/f.txt", 5, 500_000));
    lines.push(at(303, "/r/f.txt", 5, 0));
    lines.extend((304..604).map(|i| at(i, "/s/f.txt", i as u32, 0)));
    log.append(lines).unwrap();
    let last = |path: &str| {
        log.last_change("f.txt", |t| t == path)
            .map(|l| l.map(|e| e.action_id))
    };
    assert_eq!(last("/r/f.txt").unwrap().as_deref(), Some("a1"));
    assert_eq!(last("/s/f.txt").unwrap().as_deref(), Some("a603"));
    change_the_first_line_in_place(&w);
    assert_eq!(last("/r/f.txt").unwrap().as_deref(), Some("a1"));
    assert!(
        f_changes_since(&log, "").is_err(),
        "the look-up of all reads it"
    );
    // A target with no change of its own reads every line of the name.
    assert!(last("/t/f.txt").is_err());
}

/// A target in a folder of its root is looked for among the changes to files of its
/// name in folders of that folder's name only, under any spelling of the root: the
/// trail's lines of the same name elsewhere are not read back. A file at a root's top
/// has no such folder (under another spelling the root is named otherwise): every line
/// of its name is read.
#[test]
fn changes_to_a_target_in_a_folder_are_read_from_the_lines_of_that_folder_only() {
    use ailab_sandbox_core::audit::Ending;
    let (w, _state, log) = relaxed_log();
    log.append(vec![
        change(0, "/elsewhere/f.txt"),
        change(1, "/r/d/f.txt"),
        change(2, "/link/d/f.txt"),
        change(3, "/r/e/f.txt"),
        change(4, "/r/d//f.txt"),
        change(5, "/r/d/./f.txt"),
        change(6, "/r/x/d/f.txt"),
        change(7, "/r/f.txt"),
    ])
    .unwrap();
    let found = |e: Ending, since: &str| -> std::io::Result<Vec<String>> {
        Ok(log
            .changes_since(e, |_| true, since, "")?
            .into_iter()
            .map(|e| e.action_id)
            .collect())
    };
    let rel = |path: &str| RelPath::from_components(path.split('/').map(String::from).collect());
    let d_f = rel("d/f.txt");
    let d = Ending::from(&d_f);
    let in_d = ["a1", "a2", "a4", "a5", "a6"];
    assert_eq!(found(d, "").unwrap(), in_d);
    let last = |e: Ending| log.last_change(e, |_| true).unwrap().unwrap().action_id;
    assert_eq!(last(d), "a6");
    // The first line, of another folder, changed in place: not read for `d`.
    change_the_first_line_in_place(&w);
    assert_eq!(found(d, "").unwrap(), in_d);
    let top = Ending::from("f.txt");
    assert!(
        found(top, "").is_err(),
        "a file at a root's top reads them all"
    );
    assert!(found(Ending::from(&rel("e/f.txt")), "").unwrap() == ["a3"]);
}

#[test]
fn a_long_trail_read_in_one_go_is_indexed_in_file_order() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let n = 3000;
    {
        let log = AuditLog::open(&state, false, 10).unwrap();
        let long = "d/".repeat(300);
        log.append(
            (0..n)
                .map(|i| ailab_sandbox_core::audit::AuditRecord {
                    workflow_id: format!("wf{}", i % 7),
                    ..change(i, &format!("/r/{long}f{}.txt", i % 11))
                })
                .collect(),
        )
        .unwrap();
    }
    assert!(std::fs::metadata(audit_path(&w)).unwrap().len() > 2 << 20);
    // A fresh process reads the whole trail at once (parsed on two threads).
    let log = AuditLog::open(&state, false, 10).unwrap();
    assert_eq!(log.get_sandbox_audit_stats().unwrap().total, n as u64);
    let seqs = |v: Vec<ailab_sandbox_core::audit::SandboxAuditEntry>| -> Vec<u64> {
        v.into_iter().map(|e| e.seq).collect()
    };
    assert_eq!(seqs(log.list(3, None).unwrap()), [3000, 2999, 2998]);
    let wf3 = seqs(log.by_workflow("wf3").unwrap());
    let expected: Vec<u64> = (1..=n as u64).filter(|s| (s - 1) % 7 == 3).collect();
    assert_eq!(wf3, expected);
    let f5: Vec<u64> = seqs(log.changes_since("f5.txt", |_| true, "", "").unwrap());
    assert_eq!(f5.len(), (0..n).filter(|i| i % 11 == 5).count());
    assert!(log.ran_action("wf3", "a2999").unwrap());
    assert!(log.verify().unwrap().ok);
}

#[test]
fn a_log_moved_away_or_replaced_under_an_open_log_takes_no_more_lines() {
    let (w, state, a) = relaxed_log();
    a.append(vec![rec(0)]).unwrap();
    let moved = w.state.join("moved.jsonl");
    std::fs::rename(audit_path(&w), &moved).unwrap();
    let err = a.append(vec![rec(1)]).unwrap_err();
    assert!(
        err.to_string().contains(
            "sandbox_audit.jsonl in the state directory is no longer the file this process opened"
        ),
        "{err}"
    );
    assert!(a.list(10, None).is_err(), "its lines are not read either");
    // Another process starts a trail in its place: still not the file this one opened.
    AuditLog::open(&state, false, 10)
        .unwrap()
        .append(vec![rec(2)])
        .unwrap();
    assert!(a.append(vec![rec(3)]).is_err());
    assert_eq!(std::fs::read_to_string(&moved).unwrap().lines().count(), 1);
    assert_eq!(lines(&w).len(), 1);
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    reg.register(&entry("art_1", None, "wf")).unwrap();
    std::fs::rename(
        w.state.join("artifacts.jsonl"),
        w.state.join("moved-reg.jsonl"),
    )
    .unwrap();
    assert!(reg.register(&entry("art_2", None, "wf")).is_err());
}

#[test]
fn a_registry_cut_and_written_again_under_an_open_registry_is_indexed_as_it_now_is() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    reg.register(&entry("art_1", None, "wf")).unwrap();
    reg.register(&entry("art_2", None, "wf")).unwrap();
    let path = w.state.join("artifacts.jsonl");
    let first = std::fs::read_to_string(&path).unwrap();
    let first = first.lines().next().unwrap();
    // Longer than before, other bytes where this process had read to.
    std::fs::write(&path, format!("{{ {}\n", &first[1..])).unwrap();
    assert_eq!(ids(&reg.list(100, None).unwrap()), ["art_1"]);
    assert_eq!(reg.count_by_workflow("wf").unwrap(), 1);
    std::fs::write(&path, "").unwrap();
    assert!(reg.list(100, None).unwrap().is_empty());
}

#[test]
fn a_log_cut_and_written_again_is_repaired_where_its_new_text_is_torn() {
    let (w, _state, a) = relaxed_log();
    a.append((0..3).map(rec).collect()).unwrap();
    let old = lines(&w);
    // One whole line, then a torn one reaching past where this process had read to.
    let torn = format!("{{\"seq\":2,{}", "x".repeat(old.concat().len()));
    std::fs::write(audit_path(&w), format!("{}\n{torn}", old[0])).unwrap();
    assert_eq!(a.append(vec![rec(7)]).unwrap()[0].seq, 2);
    let now = lines(&w);
    assert_eq!(now.len(), 2, "{now:?}");
    assert_eq!(now[0], old[0]);
    assert!(
        now[1].starts_with("{\"seq\":2,") && now[1].ends_with('}'),
        "{}",
        now[1]
    );
}

#[test]
fn a_long_error_is_recorded_cut() {
    let (w, _state, log) = relaxed_log();
    let error = format!("refused: {}", "'a1' ('/r/f.txt'), ".repeat(5000));
    let written = log
        .append(vec![ailab_sandbox_core::audit::AuditRecord {
            error: Some(error.clone()),
            ..rec(0)
        }])
        .unwrap();
    let kept = written[0].error.clone().unwrap();
    assert!(kept.len() <= 8 * 1024, "{}", kept.len());
    assert!(kept.starts_with("refused: 'a1'"), "{kept:.40}");
    assert!(
        kept.ends_with(&format!("… ({} bytes)", error.len())),
        "{kept}"
    );
    assert!(lines(&w)[0].len() < 9 * 1024);
    assert!(log.verify().unwrap().ok);
}

fn entry(id: &str, parent: Option<&str>, wf: &str) -> ArtifactEntry {
    ArtifactEntry {
        artifact_id: id.into(),
        path: format!("/r/{id}"),
        checksum_sha256: sha(id.as_bytes()),
        size_bytes: 10,
        mutation_type: "create_file".into(),
        workflow_id: wf.into(),
        action_id: format!("act_{id}"),
        parent_workflow_id: None,
        parent_artifact_id: parent.map(str::to_owned),
        // The run of `rec`'s lines: a line of it with this action records the write.
        generated_by_action: format!("ex/act_{id}"),
        created_at: "2026-01-01T00:00:00Z".into(),
    }
}

fn ids(v: &[ArtifactEntry]) -> Vec<&str> {
    v.iter().map(|e| e.artifact_id.as_str()).collect()
}

#[test]
fn lineage_on_a_chain_and_a_diamond() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    reg.register(&entry("A", None, "w1")).unwrap();
    reg.register(&entry("B", Some("A"), "w1")).unwrap();
    reg.register(&entry("C", Some("A"), "w2")).unwrap();
    reg.register(&entry("D", Some("B"), "w2")).unwrap();
    assert_eq!(ids(&reg.get_lineage("D").unwrap()), ["B", "A"]);
    assert_eq!(ids(&reg.get_lineage("C").unwrap()), ["A"]);
    assert!(reg.get_lineage("A").unwrap().is_empty());
    assert!(reg.get_lineage("nope").unwrap().is_empty());
    assert_eq!(reg.count_by_workflow("w1").unwrap(), 2);
    assert_eq!(reg.total_bytes_by_workflow("w2").unwrap(), 20);
    assert_eq!(ids(&reg.get_by_workflow("w2").unwrap()), ["C", "D"]);
    assert_eq!(ids(&reg.list(2, None).unwrap()), ["D", "C"]);
}

#[test]
fn lineage_is_cycle_safe() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    reg.register(&entry("X", Some("Y"), "w")).unwrap();
    reg.register(&entry("Y", Some("X"), "w")).unwrap();
    reg.register(&entry("Z", Some("Z"), "w")).unwrap();
    assert_eq!(ids(&reg.get_lineage("X").unwrap()), ["Y"]);
    assert!(reg.get_lineage("Z").unwrap().is_empty());
}

#[test]
fn registry_sees_appends_from_another_handle_without_reopening() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let a = ArtifactRegistry::open(&state, false).unwrap();
    let b = ArtifactRegistry::open(&state, false).unwrap();
    a.register(&entry("A", None, "w")).unwrap();
    assert_eq!(
        b.get("A").unwrap().map(|e| e.artifact_id),
        Some("A".to_owned())
    );
    b.register(&entry("B", Some("A"), "w")).unwrap();
    assert_eq!(a.count_by_workflow("w").unwrap(), 2);
}

#[test]
fn successive_writes_of_one_path_form_a_lineage_by_default() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_l", "actions": [
        {"intent": "create_file", "path": "l.md", "content": "v1"},
        {"intent": "replace_file", "path": "l.md", "content": "v2"},
        {"intent": "sandbox_transform", "path": "l.md", "edits": [{"old": "v2", "new": "v3"}]}]}),
    );
    let ids_: Vec<String> = r
        .actions
        .iter()
        .map(|a| a.artifact_id.clone().unwrap())
        .collect();
    let (_, lineage) = sb.artifact_with_lineage(&ids_[2]).unwrap().unwrap();
    assert_eq!(
        lineage
            .iter()
            .map(|e| e.artifact_id.clone())
            .collect::<Vec<_>>(),
        vec![ids_[1].clone(), ids_[0].clone()]
    );
    let r2 = run(
        &sb,
        json!({"workflow_id": "wf_l2", "parent_workflow_id": "wf_l", "actions": [
        {"intent": "create_file", "path": "derived.md", "content": "d", "parent_artifact_id": ids_[2]}]}),
    );
    let (art, lineage) = sb
        .artifact_with_lineage(r2.actions[0].artifact_id.as_ref().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(art.parent_workflow_id.as_deref(), Some("wf_l"));
    assert_eq!(lineage.len(), 3);
    let r3 = run(
        &sb,
        json!({"actions": [{"intent": "create_file", "path": "x.md", "content": "d", "parent_artifact_id": "art_missing"}]}),
    );
    assert_eq!(code(&r3, 0).as_deref(), Some("invalid_plan"));
    // Nor a parent workflow the trail records doing nothing: the lineage would lead
    // nowhere. Refused again when sent again (its refusal is no deed of the parent's),
    // as is a workflow named its own parent.
    let orphan = json!({"workflow_id": "wf_l3", "parent_workflow_id": "wf_never", "actions": [
        {"intent": "create_file", "path": "y.md", "content": "d"}]});
    let own = json!({"workflow_id": "wf_l5", "parent_workflow_id": "wf_l5", "actions": [
        {"intent": "create_file", "path": "y.md", "content": "d"}]});
    // Nor one whose only lines are refusals.
    let refused = run(
        &sb,
        json!({"workflow_id": "wf_ref", "actions": [
            {"intent": "create_file", "path": "../out.md", "content": "d"}]}),
    );
    assert_eq!(status(&refused), "blocked", "{refused:?}");
    let child = json!({"workflow_id": "wf_l6", "parent_workflow_id": "wf_ref", "actions": [
        {"intent": "create_file", "path": "y.md", "content": "d"}]});
    let nothing_done = |wf: &str| {
        format!(
            "parent_workflow_id '{wf}' names no workflow the audit trail records doing anything"
        )
    };
    for (plan, said) in [
        (&child, nothing_done("wf_ref")),
        (&orphan, nothing_done("wf_never")),
        (&orphan, nothing_done("wf_never")),
        (
            &own,
            "parent_workflow_id 'wf_l5' is the plan's own workflow_id".to_owned(),
        ),
        (
            &own,
            "parent_workflow_id 'wf_l5' is the plan's own workflow_id".to_owned(),
        ),
    ] {
        let r = run(&sb, plan.clone());
        assert_eq!(status(&r), "blocked", "{r:?}");
        assert_eq!(code(&r, 0).as_deref(), Some("invalid_plan"));
        assert!(
            r.actions[0]
                .reason
                .as_deref()
                .unwrap_or_default()
                .contains(&said),
            "{r:?}"
        );
    }
    assert!(!w.path("y.md").exists());
    // A parent only simulated did something: it may be named.
    let simulating = w.open(w.config());
    let sim = run(
        &simulating,
        json!({"workflow_id": "wf_sim", "actions": [
            {"intent": "create_file", "path": "s.md", "content": "s"}]}),
    );
    assert_eq!(status(&sim), "simulated_success", "{sim:?}");
    drop(simulating);
    let r5 = run(
        &sb,
        json!({"workflow_id": "wf_l4", "parent_workflow_id": "wf_sim", "actions": [
            {"intent": "create_file", "path": "y.md", "content": "d"}]}),
    );
    assert_eq!(status(&r5), "success", "{r5:?}");
}

/// The library's reads refuse an id that could not be one (`invalid_id`), as the faces
/// do, instead of answering as for an unknown id (nothing, an empty list).
#[test]
fn reads_refuse_malformed_ids_instead_of_finding_nothing() {
    let w = World::new();
    let sb = w.sandbox();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_ok", "actions": [
            {"intent": "create_file", "path": "a.md", "content": "a"}]}),
    );
    assert_eq!(status(&r), "success", "{r:?}");
    let invalid = |e: ailab_sandbox_core::Error| match e {
        ailab_sandbox_core::Error::InvalidId(r) => {
            assert_eq!(r.reason_code, ailab_sandbox_core::ReasonCode::InvalidId);
            r.reason
        }
        other => panic!("not invalid_id: {other:?}"),
    };
    let why = invalid(sb.artifact_with_lineage("../x").unwrap_err());
    assert!(why.contains("artifact_id"), "{why}");
    let why = invalid(sb.audit_entries(10, Some("wf/../x")).unwrap_err());
    assert!(why.contains("workflow_id"), "{why}");
    invalid(sb.artifacts(10, Some("")).unwrap_err());
    // Well-formed but unknown ids are nothing found, as before.
    assert!(sb.artifact_with_lineage("art_unknown").unwrap().is_none());
    assert!(sb.audit_entries(10, Some("wf_none")).unwrap().is_empty());
    assert_eq!(sb.artifacts(10, Some("wf_ok")).unwrap().len(), 1);
}

/// A write's parent is the artifact whose bytes it replaced, or else the latest artifact
/// at its path whose write was not rolled back.
#[test]
fn lineage_follows_the_bytes_a_write_replaced() {
    let w = World::new();
    let sb = w.sandbox();
    let art =
        |r: &ailab_sandbox_core::RunResult, i: usize| r.actions[i].artifact_id.clone().unwrap();
    let parent = |id: &str| {
        sb.artifact_with_lineage(id)
            .unwrap()
            .unwrap()
            .0
            .parent_artifact_id
    };
    let r1 = run(
        &sb,
        json!({"workflow_id": "w1", "actions": [
            {"action_id": "a1", "intent": "create_file", "path": "x.txt", "content": "one\n"},
            {"action_id": "a2", "intent": "append_file", "path": "x.txt", "content": "two\n"}]}),
    );
    let one = ailab_sandbox_core::sandbox::RollbackOptions {
        action_id: Some("a2".to_owned()),
        ..Default::default()
    };
    assert_eq!(sb.rollback_workflow("w1", &one).status, "rolled_back");
    let r2 = run(
        &sb,
        json!({"workflow_id": "w2", "actions": [{"action_id": "b1", "intent": "append_file", "path": "x.txt", "content": "three\n"}]}),
    );
    assert_eq!(
        parent(&art(&r2, 0)),
        Some(art(&r1, 0)),
        "from a1's bytes, not a2's"
    );
    for wf in ["w2", "w1"] {
        let rb = sb.rollback_workflow(wf, &Default::default());
        assert_eq!(rb.status, "rolled_back", "{rb:?}");
    }
    let r3 = run(
        &sb,
        json!({"workflow_id": "w3", "actions": [{"action_id": "c1", "intent": "create_file", "path": "x.txt", "content": "fresh\n"}]}),
    );
    assert_eq!(
        parent(&art(&r3, 0)),
        None,
        "made again after every earlier write was rolled back: no version stands"
    );
    w.write("x.txt", b"edited by hand\n");
    let r4 = run(
        &sb,
        json!({"workflow_id": "w4", "actions": [{"action_id": "d1", "intent": "replace_file", "path": "x.txt", "content": "v4\n"}]}),
    );
    assert_eq!(parent(&art(&r4, 0)), Some(art(&r3, 0)), "the path's latest");
    // Back to bytes no artifact holds (the hand edit r4 replaced): the rolled-back r4 is
    // skipped for the artifact that still stands beneath it.
    assert_eq!(
        sb.rollback_workflow("w4", &Default::default()).status,
        "rolled_back"
    );
    let r5 = run(
        &sb,
        json!({"workflow_id": "w5", "actions": [{"action_id": "e1", "intent": "replace_file", "path": "x.txt", "content": "v5\n"}]}),
    );
    assert_eq!(
        r5.actions[0].before_checksum.as_deref(),
        Some(sha(b"edited by hand\n").as_str())
    );
    assert_eq!(
        parent(&art(&r5, 0)),
        Some(art(&r3, 0)),
        "not the rolled-back r4"
    );
}

/// The version a write replaces is found among all of its path's artifacts: neither an
/// explicit parent on another path nor a long run of later writes hides it.
#[test]
fn lineage_finds_a_paths_version_however_far_back() {
    let w = World::new();
    let mut c = w.writable_config();
    c.limits.writes_per_minute = 1000;
    let sb = w.open(c);
    let art = |r: &ailab_sandbox_core::RunResult| r.actions[0].artifact_id.clone().unwrap();
    let parent = |id: &str| {
        sb.artifact_with_lineage(id)
            .unwrap()
            .unwrap()
            .0
            .parent_artifact_id
    };
    let q = run(
        &sb,
        json!({"workflow_id": "wq", "actions": [{"intent": "create_file", "path": "q.txt", "content": "Q"}]}),
    );
    let p1 = run(
        &sb,
        json!({"workflow_id": "wp1", "actions": [{"intent": "create_file", "path": "p.txt", "content": "A"}]}),
    );
    run(
        &sb,
        json!({"workflow_id": "wp2", "actions": [{"intent": "replace_file", "path": "p.txt", "content": "B", "parent_artifact_id": art(&q)}]}),
    );
    assert_eq!(
        sb.rollback_workflow("wp2", &Default::default()).status,
        "rolled_back"
    );
    let p3 = run(
        &sb,
        json!({"workflow_id": "wp3", "actions": [{"intent": "replace_file", "path": "p.txt", "content": "C"}]}),
    );
    assert_eq!(
        parent(&art(&p3)),
        Some(art(&p1)),
        "past a parent on another path"
    );

    let x1 = run(
        &sb,
        json!({"workflow_id": "wx1", "actions": [{"intent": "create_file", "path": "x.txt", "content": "A"}]}),
    );
    let many: Vec<_> = (0..70)
        .map(|i| json!({"intent": "replace_file", "path": "x.txt", "content": format!("B{i}")}))
        .collect();
    assert_eq!(
        status(&run(&sb, json!({"workflow_id": "wx2", "actions": many}))),
        "success"
    );
    assert_eq!(
        sb.rollback_workflow("wx2", &Default::default()).status,
        "rolled_back"
    );
    let x3 = run(
        &sb,
        json!({"workflow_id": "wx3", "actions": [{"intent": "replace_file", "path": "x.txt", "content": "C"}]}),
    );
    assert_eq!(parent(&art(&x3)), Some(art(&x1)), "past 70 later writes");

    // A write undone that had put back the bytes of a standing one is no version.
    let m1 = run(
        &sb,
        json!({"workflow_id": "wm1", "actions": [{"intent": "create_file", "path": "m.txt", "content": "one"}]}),
    );
    let wm2 = json!({"workflow_id": "wm2", "actions": [
        {"intent": "replace_file", "path": "m.txt", "content": "two"},
        {"intent": "replace_file", "path": "m.txt", "content": "one"}]});
    assert_eq!(status(&run(&sb, wm2)), "success");
    assert_eq!(
        sb.rollback_workflow("wm2", &Default::default()).status,
        "rolled_back"
    );
    let m3 = run(
        &sb,
        json!({"workflow_id": "wm3", "actions": [{"intent": "replace_file", "path": "m.txt", "content": "three"}]}),
    );
    assert_eq!(
        parent(&art(&m3)),
        Some(art(&m1)),
        "not the undone write of the same bytes"
    );
}

#[test]
fn stats_count_by_status_class_and_intent() {
    let w = World::new();
    let sb = w.sandbox();
    run(
        &sb,
        json!({"workflow_id": "wf_s", "actions": [
        {"intent": "create_file", "path": "a.txt", "content": "a"},
        {"intent": "create_directory", "path": "d"}]}),
    );
    run(
        &sb,
        json!({"actions": [{"intent": "delete_file", "path": "a.txt"}]}),
    );
    // Intents a client makes up are counted together, whatever their number.
    for i in 0..3 {
        run(
            &sb,
            json!({"actions": [{"intent": format!("made_up_{i}"), "path": "a.txt"}]}),
        );
    }
    sb.rollback_workflow("wf_s", &Default::default());
    let s = sb.audit_stats().unwrap();
    assert_eq!((s.total, s.success, s.blocked, s.rolled_back), (8, 2, 4, 2));
    assert_eq!(s.by_intent.get("create_file"), Some(&2));
    assert_eq!(s.by_intent.get("delete_file"), Some(&1));
    assert_eq!(s.by_intent.get("other"), Some(&3), "{:?}", s.by_intent);
    assert!(!s.by_intent.keys().any(|k| k.starts_with("made_up")));
    assert_eq!(s.by_mutation_class.get("create"), Some(&2));
    assert_eq!(s.by_mutation_class.get("rollback"), Some(&2));
}

/// A registry larger than one 8 MiB read, loaded by the parallel loader: every entry is
/// back, in file order, with lineage across chunk boundaries and the newest entry per path.
#[test]
fn multi_chunk_registry_loads_in_order() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let n = 40_000;
    {
        let reg = ArtifactRegistry::open(&state, false).unwrap();
        let batch: Vec<ArtifactEntry> = (0..n)
            .map(|i| {
                let mut e = entry(
                    &format!("art_{i:06}"),
                    (i > 0).then(|| format!("art_{:06}", i - 1)).as_deref(),
                    &format!("wf_{}", i % 7),
                );
                e.path = format!("/r/p{}", i % 100);
                e.generated_by_action = "x".repeat(200);
                e
            })
            .collect();
        reg.register_many(&batch).unwrap();
    }
    assert!(
        std::fs::metadata(w.state.join("artifacts.jsonl"))
            .unwrap()
            .len()
            > 8 << 20
    );
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    assert_eq!(reg.len().unwrap(), n as u64);
    assert_eq!(
        reg.list(1, None).unwrap()[0].artifact_id,
        format!("art_{:06}", n - 1)
    );
    assert_eq!(
        reg.count_by_workflow("wf_3").unwrap(),
        (0..n).filter(|i| i % 7 == 3).count() as u64
    );
    let lineage = reg.get_lineage(&format!("art_{:06}", n - 1)).unwrap();
    assert_eq!(lineage.len(), n - 1);
    assert!(
        lineage
            .windows(2)
            .all(|w| w[0].artifact_id > w[1].artifact_id),
        "nearest first"
    );
    assert_eq!(
        reg.latest_for_path("/r/p42").unwrap().unwrap().artifact_id,
        format!("art_{:06}", n - 100 + 42)
    );
}

/// What the registry hands back is what was registered, field for field, whether read
/// from the file by a fresh open or caught up with by another handle: strings with
/// escapes and characters beyond ASCII, optional fields present and absent.
#[test]
fn registered_entries_read_back_field_for_field() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let mut odd = entry("art_odd", Some("art_plain"), "wf_x");
    odd.path = "/r/quote\"back\\slash\nnew line\u{2028}é✓.txt".into();
    odd.parent_workflow_id = Some("wf_parent".into());
    odd.size_bytes = u64::MAX;
    odd.created_at = String::new();
    let mut only_workflow = entry("art_wf", None, "wf_x");
    only_workflow.parent_workflow_id = Some("wf_parent".into());
    let written = [entry("art_plain", None, "wf_x"), odd, only_workflow];
    let first = ArtifactRegistry::open(&state, false).unwrap();
    let other = ArtifactRegistry::open(&state, false).unwrap();
    first.register_many(&written).unwrap();
    let reopened = ArtifactRegistry::open(&state, false).unwrap();
    for reg in [&first, &other, &reopened] {
        assert_eq!(reg.get_by_workflow("wf_x").unwrap(), written);
        for e in &written {
            assert_eq!(reg.get(&e.artifact_id).unwrap().as_ref(), Some(e));
            assert_eq!(reg.latest_for_path(&e.path).unwrap().as_ref(), Some(e));
        }
        assert_eq!(reg.get_lineage("art_odd").unwrap(), written[..1]);
        // The sizes' sum stays at the most there is, not wrapped round to a small one.
        assert_eq!(reg.total_bytes_by_workflow("wf_x").unwrap(), u64::MAX);
        assert_eq!(
            reg.find(|a| a.path().ends_with("é✓.txt")).unwrap(),
            written[1..2]
        );
    }
}

/// Lines the registry cannot take are counted and skipped one by one; the lines around
/// them, in the same read, are all indexed (a byte that is not UTF-8 included).
#[test]
fn unreadable_registry_lines_are_skipped_alone() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let good = |id: &str| serde_json::to_string(&entry(id, None, "wf_y")).unwrap();
    let mut unknown: serde_json::Value = serde_json::from_str(&good("art_u")).unwrap();
    unknown["extra"] = json!(1);
    let mut missing: serde_json::Value = serde_json::from_str(&good("art_m")).unwrap();
    missing.as_object_mut().unwrap().remove("path");
    let mut wrong: serde_json::Value = serde_json::from_str(&good("art_t")).unwrap();
    wrong["size_bytes"] = json!("ten");
    let mut no_options: serde_json::Value = serde_json::from_str(&good("art_n")).unwrap();
    no_options
        .as_object_mut()
        .unwrap()
        .remove("parent_workflow_id");
    no_options
        .as_object_mut()
        .unwrap()
        .remove("parent_artifact_id");
    let mut bytes = Vec::new();
    for line in [
        good("art_1"),
        unknown.to_string(),
        missing.to_string(),
        wrong.to_string(),
        no_options.to_string(),
    ] {
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(
        &good("art_bad")
            .replace("/r/art_bad", "/r/\u{1}")
            .into_bytes(),
    );
    let at = bytes.len() - 3;
    bytes[at] = 0xff;
    bytes.push(b'\n');
    bytes.extend_from_slice(good("art_2").as_bytes());
    bytes.push(b'\n');
    std::fs::write(w.state.join("artifacts.jsonl"), &bytes).unwrap();
    let reg = ArtifactRegistry::open(&state, false).unwrap();
    assert_eq!(reg.corrupt_lines().unwrap(), 4);
    assert_eq!(
        ids(&reg.get_by_workflow("wf_y").unwrap()),
        ["art_1", "art_n", "art_2"]
    );
    let n = reg.get("art_n").unwrap().unwrap();
    assert_eq!((n.parent_workflow_id, n.parent_artifact_id), (None, None));
}

/// Several processes (here threads, each with its own handles) starting at once on a new
/// state directory agree on one head and one seal key: none takes the others' first
/// lines for tampering.
#[test]
fn simultaneous_first_starts_agree_on_the_head_and_the_key() {
    for _ in 0..5 {
        let w = World::new();
        let barrier = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            for t in 0..6 {
                let (w, barrier) = (&w, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let sb = w.sandbox();
                    assert!(
                        sb.notices().iter().all(|n| !n.contains("tampered")),
                        "{:?}",
                        sb.notices()
                    );
                    one_more_line(&sb, &format!("t{t}.txt"));
                    assert!(sb.audit_log().head_problem().is_none());
                });
            }
        });
        let sb = w.sandbox();
        let v = sb.audit_verify().unwrap();
        assert!(v.ok, "{v:?}");
        assert_eq!(v.entries, 6);
        assert_eq!(std::fs::read(w.state.join("seal.key")).unwrap().len(), 32);
        let leftovers: Vec<_> = std::fs::read_dir(&w.state)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains("ailab-tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

/// A strict append's lines are synced outside the log's lock. If they are cut meanwhile
/// and another writer appends in their place (and moves the head over its own line),
/// the cut must still show: the head goes to the entry this process made durable.
#[test]
fn a_line_cut_while_it_syncs_stays_detected() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let mut a = AuditLog::open(&state, true, 10).unwrap();
    let b = std::sync::Arc::new(AuditLog::open(&state, true, 10).unwrap());
    let failpoints = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    a.share_failpoints(failpoints.clone());
    a.append(vec![rec(0)]).unwrap();
    let path = audit_path(&w);
    failpoints.interleave(
        "audit_sync",
        std::sync::Arc::new(move || {
            let text = std::fs::read_to_string(&path).unwrap();
            let keep = text.trim_end().rfind('\n').map_or(0, |i| i + 1);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(keep as u64)
                .unwrap();
            b.append(vec![rec(9)]).unwrap();
        }),
    );
    a.append(vec![rec(1)]).unwrap();
    assert!(a.head_problem().is_some());
    let v = a.verify().unwrap();
    assert!(!v.ok, "{v:?}");
    assert_eq!(v.first_bad_seq, Some(2), "{v:?}");
}

/// After a failed sync the append is reported failed; nothing more is written by that
/// process (a later sync could succeed with the failed pages lost), while another
/// process goes on. The failed line stays: another process may have read it already.
#[test]
fn after_a_failed_sync_a_log_writes_nothing_more() {
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let mut a = AuditLog::open(&state, true, 10).unwrap();
    let failpoints = std::sync::Arc::new(ailab_sandbox_core::failpoint::FailPoints::default());
    a.share_failpoints(failpoints.clone());
    a.append(vec![rec(0)]).unwrap();
    failpoints.arm("audit_sync", 1);
    let e = a.append(vec![rec(1)]).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert_eq!(lines(&w).len(), 2);
    let e = a.append(vec![rec(2)]).unwrap_err();
    assert!(e.to_string().contains("an earlier sync failed"), "{e}");
    assert!(a.sync_failure().is_some());
    assert_eq!(lines(&w).len(), 2);
    let b = AuditLog::open(&state, true, 10).unwrap();
    assert_eq!(b.append(vec![rec(3)]).unwrap()[0].seq, 3);
    assert!(b.verify().unwrap().ok);
}

/// The characters that break a line for readers splitting lines the Unicode way.
const UNICODE_BREAKS: [char; 4] = ['\u{85}', '\u{2028}', '\u{2029}', '\u{9b}'];

/// Logs holding the line-breaking characters: a name an earlier version wrote (paths
/// given today may not hold them) in both logs, a refused intent on the trail.
fn unicode_break_world() -> (World, ailab_sandbox_core::Sandbox) {
    let w = World::new();
    let sb = w.open(strict(&w));
    let written = ArtifactEntry {
        path: "/r/a\u{2028}b\u{2029}.txt".into(),
        ..entry("art_u", None, "wf_u")
    };
    sb.audit_log()
        .append(vec![ailab_sandbox_core::audit::AuditRecord {
            workflow_id: written.workflow_id.clone(),
            action_id: written.action_id.clone(),
            target_path: written.path.clone(),
            after_checksum: Some(written.checksum_sha256.clone()),
            status: ailab_sandbox_core::audit::AuditStatus::Success,
            ..rec(1)
        }])
        .unwrap();
    sb.registry().register(&written).unwrap();
    let r = run(
        &sb,
        json!({"workflow_id": "wf_v", "actions": [
            {"action_id": "a1", "intent": "x\u{85}y\u{9b}", "path": "c.txt", "content": "x"},
        ]}),
    );
    assert_eq!(status(&r), "blocked", "{r:?}");
    (w, sb)
}

/// SPEC §8: a payload can never forge a line, also for readers such as Python's
/// `str.splitlines()`, which break lines at C1 controls and U+2028/U+2029 too.
#[test]
fn unicode_line_breaks_in_payloads_are_escaped_in_both_logs() {
    let (w, sb) = unicode_break_world();
    for name in ["sandbox_audit.jsonl", "artifacts.jsonl"] {
        let text = std::fs::read_to_string(w.state.join(name)).unwrap();
        assert!(
            !text.contains(UNICODE_BREAKS),
            "{name} holds a raw line break: {text:?}"
        );
        assert!(text.contains("a\\u2028b\\u2029.txt"), "{name}: {text}");
    }
    let audit = std::fs::read_to_string(audit_path(&w)).unwrap();
    assert!(audit.contains("x\\u0085y\\u009b"), "{audit}");
    let entries = sb.audit_log().list(100, Some("wf_u")).unwrap();
    assert!(entries[0].target_path.ends_with("a\u{2028}b\u{2029}.txt"));
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
}

/// A trail written before those characters were escaped (raw in its lines, hashed so)
/// still verifies, and an edit to such a line is still caught.
#[test]
fn a_trail_holding_raw_unicode_line_breaks_still_verifies() {
    use sha2::{Digest, Sha256};
    let (w, sb) = unicode_break_world();
    let hex = |b: &[u8]| -> String { b.iter().map(|x| format!("{x:02x}")).collect() };
    let field = |line: &str, key: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        v[key].as_str().unwrap().to_owned()
    };
    let mut prev = "0".repeat(64);
    let mut raw = Vec::new();
    for line in lines(&w) {
        let mut l = line
            .replace(&field(&line, "prev_hash"), &prev)
            .replace("\\u2028", "\u{2028}")
            .replace("\\u2029", "\u{2029}")
            .replace("\\u0085", "\u{85}")
            .replace("\\u009b", "\u{9b}");
        let hash_field = format!(",\"entry_hash\":\"{}\"", field(&l, "entry_hash"));
        let unhashed = l.replace(&hash_field, "");
        prev = hex(&Sha256::digest(unhashed.as_bytes()));
        l = l.replace(&hash_field, &format!(",\"entry_hash\":\"{prev}\""));
        raw.push(l);
    }
    assert!(raw.iter().any(|l| l.contains(UNICODE_BREAKS)));
    write_lines(&w, &raw);
    let seq = raw.len();
    std::fs::write(
        w.state.join("sandbox_audit.head.json"),
        json!({"seq": seq, "entry_hash": prev}).to_string(),
    )
    .unwrap();
    let v = sb.audit_verify().unwrap();
    assert!(v.ok, "{v:?}");
    let edited: Vec<String> = raw
        .iter()
        .map(|l| l.replace("a\u{2028}b", "a\u{2029}b"))
        .collect();
    write_lines(&w, &edited);
    let v = sb.audit_verify().unwrap();
    assert!(!v.ok, "{v:?}");
}

/// The folders a ledger holds as left in root `/r`, sorted.
fn ledger_paths(l: &ailab_sandbox_core::left_dirs::LeftDirs) -> Vec<String> {
    let mut p: Vec<String> = l
        .in_root(|r, _| r == "/r")
        .unwrap()
        .into_iter()
        .map(|(_, l)| l.dir.path)
        .collect();
    p.sort();
    p
}

/// The left-folder ledger gains two lines for every folder left and later settled; it
/// is rewritten with only what is still left once settled lines make up most of it, so
/// it stays bounded, and a process that read it before the rewrite reads it again from
/// the start (it neither keeps settled folders nor misses new ones).
#[test]
fn the_left_folder_ledger_is_compacted_and_other_processes_follow() {
    use ailab_sandbox_core::confine::DirId;
    use ailab_sandbox_core::left_dirs::{LEFT_DIRS_FILE, Left, LeftDirs, Maker};
    use ailab_sandbox_core::snapshot::LeftDir;
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let (a, b) = (
        LeftDirs::open(&state, true).unwrap(),
        LeftDirs::open(&state, true).unwrap(),
    );
    let maker = Maker {
        workflow_id: "wf_a".into(),
        action_id: "a1".into(),
        at: "2026-12-02T00:00:00Z".into(),
    };
    let left = |i: u64| Left {
        dir: LeftDir {
            path: format!("deep/folder/number/{i}"),
            id: DirId {
                dev: 1,
                ino: i,
                born_ns: Some(i),
            },
        },
        made_by: maker.clone(),
    };
    let paths = ledger_paths;
    let size = || {
        std::fs::metadata(w.state.join(LEFT_DIRS_FILE))
            .unwrap()
            .len()
    };
    a.record("/r", &[left(0).dir], &maker).unwrap();
    let mut largest = 0;
    for i in 1..=1000 {
        a.record("/r", &[left(i).dir], &maker).unwrap();
        if i == 500 {
            // Read by the other process half-way, with a folder still left.
            assert_eq!(
                paths(&b),
                ["deep/folder/number/0", "deep/folder/number/500"]
            );
        }
        a.settle("/r", &[left(i)]).unwrap();
        largest = largest.max(size());
    }
    assert!(largest < 70 << 10, "the ledger grew to {largest} bytes");
    assert_eq!(paths(&a), ["deep/folder/number/0"]);
    assert_eq!(paths(&b), ["deep/folder/number/0"], "settled since b read");
    // The other process's line, appended after the rewrite, is the first one reads.
    b.record("/r", &[left(2000).dir], &maker).unwrap();
    assert_eq!(
        paths(&a),
        ["deep/folder/number/0", "deep/folder/number/2000"]
    );
    b.settle("/r", &[left(0), left(2000)]).unwrap();
    assert!(paths(&a).is_empty() && paths(&b).is_empty());
    // Reopened (another process's start), the file says the same.
    assert!(paths(&LeftDirs::open(&state, true).unwrap()).is_empty());
}

/// A journal rewritten in place to exactly the length another process had read (two
/// rewrites of one line each), or so that it ends, where that process read to, as it
/// did then, is read again from the start by that process, not taken for a file with
/// nothing new or with only appends; one not opened as rewritable cannot be rewritten.
#[test]
fn a_journal_rewritten_to_the_length_another_process_read_is_read_again() {
    use ailab_sandbox_core::journal::Journal;
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let mut a = Journal::open_rewritable(&state, "hints.jsonl", true).unwrap();
    let mut b = Journal::open_rewritable(&state, "hints.jsonl", true).unwrap();
    let read = |j: &mut Journal| {
        let mut got = Vec::new();
        j.read_new(&mut |at, buf| got.push((at, String::from_utf8_lossy(buf).into_owned())))
            .unwrap();
        got
    };
    let ((), pending) = a
        .append_with(|_, _| Ok((b"{\"n\":1}\n".to_vec(), ())))
        .unwrap();
    pending.wait().unwrap();
    assert!(a.rewrite_with(|_| Some(b"{\"n\":3}\n".to_vec())).unwrap());
    let first = read(&mut b);
    assert!(
        first.len() == 1 && first[0].1.ends_with("{\"n\":3}\n"),
        "{first:?}"
    );
    let len = a.len().unwrap();
    assert!(a.rewrite_with(|_| Some(b"{\"n\":4}\n".to_vec())).unwrap());
    assert_eq!(a.len().unwrap(), len, "as long as b read it");
    let again = read(&mut b);
    assert!(
        again.iter().any(|(at, _)| *at == 0)
            && again.iter().any(|(_, l)| l.ends_with("{\"n\":4}\n")),
        "{again:?}"
    );
    // Rewritten so that the bytes before where b read to are the ones b read there (a
    // long line both files share), with more after: still read again from the start.
    let pad = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(150));
    assert!(
        a.rewrite_with(|_| Some(format!("{{\"n\":5}}\n{pad}").into_bytes()))
            .unwrap()
    );
    assert!(read(&mut b).iter().any(|(_, l)| l.contains("\"n\":5")));
    assert!(
        a.rewrite_with(|_| Some(format!("{{\"n\":6}}\n{pad}{{\"n\":7}}\n").into_bytes()))
            .unwrap()
    );
    let again = read(&mut b);
    assert!(
        again
            .iter()
            .any(|(at, l)| *at == 0 && l.contains("\"n\":6")),
        "{again:?}"
    );
    let mut plain = Journal::open(&state, "hints.jsonl", true).unwrap();
    assert!(plain.rewrite_with(|_| Some(Vec::new())).is_err());
}

/// A rewrite that died right after cutting the file, then appends by another process
/// that bring it back to the length a reader had read, with lines that begin as the
/// reader's first line did (long, shared beginnings): the reader still reads it again,
/// since the first append to an empty rewritable file begins with a line of its own.
#[test]
fn a_rewritable_journal_cut_and_appended_to_the_same_length_is_read_again() {
    use ailab_sandbox_core::journal::Journal;
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let prefix = format!("{{\"root\":\"/{}\",\"path\":\"", "r".repeat(130));
    let line = |tag: &str| format!("{prefix}{tag}\"}}\n").into_bytes();
    let read = |j: &mut Journal| {
        let mut got = Vec::new();
        j.read_new(&mut |at, buf| got.push((at, String::from_utf8_lossy(buf).into_owned())))
            .unwrap();
        got
    };
    let mut a = Journal::open_rewritable(&state, "hints.jsonl", true).unwrap();
    let mut b = Journal::open_rewritable(&state, "hints.jsonl", true).unwrap();
    let ((), p) = a
        .append_with(|_, _| Ok(([line("one"), line("two")].concat(), ())))
        .unwrap();
    p.wait().unwrap();
    assert!(read(&mut b).iter().any(|(_, l)| l.contains("two")));
    let len = a.len().unwrap();
    // The rewrite died right after cutting the file.
    std::fs::OpenOptions::new()
        .write(true)
        .open(w.state.join("hints.jsonl"))
        .unwrap()
        .set_len(0)
        .unwrap();
    drop(a);
    let mut c = Journal::open_rewritable(&state, "hints.jsonl", true).unwrap();
    let ((), p) = c
        .append_with(|_, _| Ok(([line("ONE"), line("TWO")].concat(), ())))
        .unwrap();
    p.wait().unwrap();
    assert_eq!(c.len().unwrap(), len, "as long as b read it");
    let again = read(&mut b);
    assert!(
        again.iter().any(|(at, l)| *at == 0 && l.contains("ONE")),
        "{again:?}"
    );
}

/// Two processes recording and settling folders at once while the ledger is rewritten
/// again and again under them: neither loses a folder still left nor keeps one settled,
/// and the file says the same.
#[test]
fn the_left_folder_ledger_stays_right_under_concurrent_rewrites() {
    use ailab_sandbox_core::confine::DirId;
    use ailab_sandbox_core::left_dirs::{LEFT_DIRS_FILE, Left, LeftDirs, Maker};
    use ailab_sandbox_core::snapshot::LeftDir;
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let left = |t: u64, i: u64| Left {
        dir: LeftDir {
            path: format!("worker{t}/a/rather/deep/folder/number/{i}"),
            id: DirId {
                dev: 1,
                ino: t * 100_000 + i,
                born_ns: Some(i),
            },
        },
        made_by: Maker {
            workflow_id: format!("wf_{t}"),
            action_id: format!("a{i}"),
            at: "2026-12-02T00:00:00Z".into(),
        },
    };
    let paths = ledger_paths;
    let ledgers: Vec<LeftDirs> = (0..2)
        .map(|_| LeftDirs::open(&state, false).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (t, l) in ledgers.iter().enumerate() {
            let t = t as u64;
            s.spawn(move || {
                for i in 0..600 {
                    let this = left(t, i);
                    l.record("/r", std::slice::from_ref(&this.dir), &this.made_by)
                        .unwrap();
                    // Every hundredth stays left.
                    if i % 100 != 0 {
                        l.settle("/r", &[this]).unwrap();
                    }
                }
            });
        }
    });
    let mut want: Vec<String> = (0..2)
        .flat_map(|t| (0..600).step_by(100).map(move |i| left(t, i).dir.path))
        .collect();
    want.sort();
    for l in &ledgers {
        assert_eq!(paths(l), want);
    }
    assert_eq!(paths(&LeftDirs::open(&state, false).unwrap()), want);
    let size = std::fs::metadata(w.state.join(LEFT_DIRS_FILE))
        .unwrap()
        .len();
    assert!(size < 80 << 10, "rewritten on the way: {size} bytes");
}

/// `path` with `n` zero bytes (a sparse hole: no disk) and a newline put after its first
/// `after` lines: a line far longer than any the runtime writes, in the middle.
fn with_long_line(path: &std::path::Path, after: usize, n: u64) -> u64 {
    let whole = std::fs::read(path).unwrap();
    let at = whole
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(after - 1)
        .map(|(i, _)| i + 1)
        .unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut f, &whole[..at]).unwrap();
    f.set_len(at as u64 + n).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap();
    std::io::Write::write_all(&mut f, b"\n").unwrap();
    std::io::Write::write_all(&mut f, &whole[at..]).unwrap();
    at as u64
}

/// A line longer than any the runtime writes (a hole ended by a newline, or a line made
/// by hand) is handed on in its place, never held: each reader's buffers stay a few MiB,
/// and the lines after it keep their offsets, for readers that read, catch up before an
/// append, or read what others appended after it.
#[test]
fn a_long_line_in_a_journal_is_passed_over_not_held() {
    use ailab_sandbox_core::journal::{Journal, MAX_LINE, OVERLONG};
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let path = w.state.join("lines.jsonl");
    std::fs::write(&path, b"{\"n\":1}\n{\"n\":2}\n").unwrap();
    let hole = 5 * MAX_LINE;
    let at = with_long_line(&path, 1, hole);
    let after = at + hole + 1;
    let mut reader = Journal::open(&state, "lines.jsonl", false).unwrap();
    let mut writer = Journal::open(&state, "lines.jsonl", false).unwrap();
    let small = |buf: &[u8]| {
        assert!(
            buf.len() as u64 <= 2 * MAX_LINE,
            "a buffer of {} bytes",
            buf.len()
        );
        String::from_utf8_lossy(buf).into_owned()
    };
    let mut read = Vec::new();
    reader
        .read_new(&mut |at, buf| read.push((at, small(buf))))
        .unwrap();
    let overlong = String::from_utf8_lossy(OVERLONG).into_owned();
    let expected = vec![
        (0, "{\"n\":1}\n".to_owned()),
        (at, overlong.clone()),
        (after, "{\"n\":2}\n".to_owned()),
    ];
    assert_eq!(read, expected);
    let ((), pending) = writer
        .append_with(|new, _| {
            // Joined where they follow on: the stand-in starts where the line does.
            let new: Vec<_> = new.iter().map(|(at, b)| (*at, small(b))).collect();
            let joined = vec![
                (0, format!("{}{overlong}", expected[0].1)),
                expected[2].clone(),
            ];
            assert_eq!(new, joined);
            Ok((b"{\"n\":3}\n".to_vec(), ()))
        })
        .unwrap();
    pending.wait().unwrap();
    let mut more = Vec::new();
    reader
        .read_new(&mut |at, buf| more.push((at, small(buf))))
        .unwrap();
    assert_eq!(more, vec![(after + 8, "{\"n\":3}\n".to_owned())]);
}

/// The trail and the registry with a long line in their middle: `audit verify` names it
/// (both ways), the registry's lines after it are still read at their offsets (listed,
/// looked up, rolled back), and the registry's is counted among its unreadable lines.
#[test]
fn a_long_line_in_the_trail_or_the_registry_is_named_and_passed_over() {
    use ailab_sandbox_core::journal::MAX_LINE;
    let (w, sb) = audited_world(3);
    drop(sb);
    let trail = std::fs::read(audit_path(&w)).unwrap();
    with_long_line(&audit_path(&w), 2, 3 * MAX_LINE);
    for v in verified_both_ways(&w) {
        assert!(!v.ok);
        assert_eq!(v.first_bad_seq, Some(3), "{v:?}");
        let reason = v.reason.unwrap();
        assert!(
            reason.starts_with(&format!("line 3 is {} bytes long", 3 * MAX_LINE + 1)),
            "{reason}"
        );
    }
    let sb = w.open(strict(&w));
    let listed = sb.audit_entries(10, None).unwrap();
    assert_eq!(
        listed.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 2, 1],
        "the lines after the long one are read back where they are"
    );
    drop(sb);
    std::fs::write(audit_path(&w), &trail).unwrap();
    let registry = w.state.join("artifacts.jsonl");
    with_long_line(&registry, 1, 3 * MAX_LINE);
    for v in verified_both_ways(&w) {
        assert!(!v.ok);
        let reason = v.reason.unwrap();
        assert!(
            reason
                .contains("holds 1 line(s) that cannot be read as artifacts (the first: line 2 of"),
            "{reason}"
        );
    }
    let sb = w.open(strict(&w));
    let listed = sb.artifacts(10, Some("wf_a")).unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    let last = listed.iter().find(|a| a.path.ends_with("f2.txt")).unwrap();
    assert_eq!(
        sb.artifact_with_lineage(&last.artifact_id)
            .unwrap()
            .unwrap()
            .0,
        *last
    );
    let rb = sb.rollback_workflow("wf_a", &Default::default());
    assert_eq!(rb.status, "rolled_back", "{rb:?}");
    assert!(!w.root.join("f2.txt").exists());
}

/// A head file longer than the block the runtime writes (its JSON followed by a MiB of
/// spaces, say) is damaged: `audit verify` says so both ways (it failed to read it, exit
/// 2), and a process that appends says so too (it read the first block and went on).
#[test]
fn an_oversized_head_file_is_damaged() {
    let (w, sb) = audited_world(2);
    drop(sb);
    let head = w.state.join("sandbox_audit.head.json");
    let mut bytes = std::fs::read(&head).unwrap();
    bytes.resize(2 << 20, b' ');
    std::fs::write(&head, &bytes).unwrap();
    for v in verified_both_ways(&w) {
        assert!(!v.ok, "{v:?}");
        let reason = v.reason.unwrap();
        assert!(
            reason.contains(
                "is damaged (it is 2097152 bytes long, where the runtime writes one block of 4096)"
            ),
            "{reason}"
        );
    }
    let sb = w.open(strict(&w));
    one_more_line(&sb, "after.txt");
    let problem = sb.audit_log().head_problem().unwrap_or_default();
    assert!(problem.contains("is damaged"), "{problem}");
}

/// A torn last line longer than any line, met by a process that only reads (a server
/// answering reads), is cut by it when no other process holds the log, rather than read
/// again at every call until a writer comes; the lines before it are read as ever.
#[test]
fn a_reader_cuts_a_torn_tail_longer_than_a_line() {
    use ailab_sandbox_core::journal::{Journal, MAX_LINE};
    let w = World::new();
    let state = StateDir::open(&w.state).unwrap();
    let path = w.state.join("lines.jsonl");
    std::fs::write(&path, b"{\"n\":1}\n").unwrap();
    let mut reader = Journal::open(&state, "lines.jsonl", false).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"n\":2}\n{\"torn\":\"").unwrap();
    f.set_len(16 + 2 * MAX_LINE).unwrap();
    drop(f);
    let mut read = Vec::new();
    reader
        .read_new(&mut |at, buf| read.push((at, buf.to_vec())))
        .unwrap();
    assert_eq!(read, vec![(0, b"{\"n\":1}\n{\"n\":2}\n".to_vec())]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16);
    // A short one is left for the next writer to cut, as before: read again, it costs
    // little.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"n\":3"))
        .unwrap();
    reader.read_new(&mut |_, _| {}).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 22);
}
