//! rollback_workflow and rollback_action restore the bytes, verified by checksum.

use super::support::{Mode, Session, structured, text};
use serde_json::json;

#[tokio::test]
async fn rollback_workflow_restores_the_original_bytes() {
    let s = Session::start(Mode::Write).await;
    // A file that existed before the session.
    std::fs::create_dir_all(s.path("docs")).unwrap();
    std::fs::write(s.path("docs/plan.md"), b"# Plan\n\nstatus: draft\n").unwrap();

    s.ok(
        "sandbox_transform",
        json!({"path": "docs/plan.md", "edits": [{"old": "draft", "new": "final"}]}),
    )
    .await;
    s.ok(
        "create_file",
        json!({"path": "docs/new.md", "content": "new\n"}),
    )
    .await;
    assert_eq!(s.read("docs/plan.md"), b"# Plan\n\nstatus: final\n");

    let r = s.ok("rollback_workflow", json!({})).await;
    let st = structured(&r);
    assert_eq!(st["status"], "rolled_back");
    assert_eq!(st["steps_rolled_back"], 2);
    assert!(
        st["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["checksum_validated"] == true)
    );
    assert!(text(&r).contains(&s.workflow_id), "{}", text(&r));
    assert_eq!(s.read("docs/plan.md"), b"# Plan\n\nstatus: draft\n");
    assert!(!s.path("docs/new.md").exists());

    // Nothing is left to roll back; the advice is about the workflow, not an action.
    let r = s.err("rollback_workflow", json!({})).await;
    assert!(text(&r).contains("no_rollback_data"), "{}", text(&r));
    assert!(text(&r).contains("check the workflow_id"), "{}", text(&r));
    assert!(!text(&r).contains("action_id"), "{}", text(&r));

    // The session's workflow goes on after a rollback, and can be rolled back again.
    s.ok(
        "create_file",
        json!({"path": "docs/again.md", "content": "again\n"}),
    )
    .await;
    let r = s.ok("rollback_workflow", json!({})).await;
    assert_eq!(structured(&r)["steps_rolled_back"], 1, "{}", text(&r));
    assert!(!s.path("docs/again.md").exists());
    assert_eq!(s.read("docs/plan.md"), b"# Plan\n\nstatus: draft\n");
    s.finish().await;
}

#[tokio::test]
async fn rollback_action_undoes_one_write() {
    let s = Session::start(Mode::Write).await;
    s.ok(
        "create_file",
        json!({"path": "keep.md", "content": "keep\n"}),
    )
    .await;
    let r = s
        .ok(
            "create_file",
            json!({"path": "undo.md", "content": "undo\n"}),
        )
        .await;
    let action = structured(&r)["actions"][0]["action_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text(&r).contains(&format!("{{\"action_id\": \"{action}\"}}")),
        "{}",
        text(&r)
    );

    s.ok("rollback_action", json!({"action_id": action})).await;
    assert!(!s.path("undo.md").exists());
    assert_eq!(s.read("keep.md"), b"keep\n");
    let r = s
        .err("rollback_action", json!({"action_id": "act_unknown"}))
        .await;
    assert!(text(&r).contains("no_rollback_data"), "{}", text(&r));
    assert!(
        text(&r).contains("check the workflow_id and action_id"),
        "{}",
        text(&r)
    );
    // An action of another workflow, named without it: the refusal names its workflow.
    let r = s
        .ok(
            "create_file",
            json!({"path": "elsewhere.md", "content": "e\n", "workflow_id": "wf_elsewhere"}),
        )
        .await;
    let action = structured(&r)["actions"][0]["action_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s.err("rollback_action", json!({"action_id": action})).await;
    assert!(
        text(&r).contains(&format!(
            "records a write of action '{action}' not rolled back in workflow 'wf_elsewhere': name its workflow"
        )) && text(&r).contains("call rollback_action again with that workflow_id"),
        "{}",
        text(&r)
    );
    assert_eq!(s.read("elsewhere.md"), b"e\n");
    s.finish().await;
}

#[tokio::test]
async fn a_conflicting_rollback_needs_force() {
    let s = Session::start(Mode::Write).await;
    s.ok("create_file", json!({"path": "c.md", "content": "mine\n"}))
        .await;
    s.ok(
        "create_file",
        json!({"path": "d.md", "content": "mine too\n"}),
    )
    .await;
    std::fs::write(s.path("c.md"), b"edited by someone else\n").unwrap();
    std::fs::remove_file(s.path("d.md")).unwrap();

    let r = s.err("rollback_workflow", json!({})).await;
    let t = text(&r);
    assert!(t.contains("conflict") && t.contains("force"), "{t}");
    assert_eq!(s.read("c.md"), b"edited by someone else\n");

    let r = s.ok("rollback_workflow", json!({"force": true})).await;
    assert!(!s.path("c.md").exists());
    // What force overwrote is said, not only carried in the conflicts.
    let said = format!(
        "Forced: it overwrote what had changed since the workflow wrote it: {}.",
        s.path("c.md").display()
    );
    assert!(text(&r).contains(&said), "{}", text(&r));
    // One removed by hand was not overwritten: said apart.
    let removed = format!(
        "Forced: it found removed since the workflow wrote it (nothing there to overwrite): {}.",
        s.path("d.md").display()
    );
    assert!(text(&r).contains(&removed), "{}", text(&r));
    s.finish().await;
}

/// A directory the workflow found is reported left in place, not removed.
#[tokio::test]
async fn a_directory_rollback_says_what_became_of_it() {
    let s = Session::start(Mode::Write).await;
    std::fs::create_dir_all(s.path("shared/sub")).unwrap();
    std::fs::write(s.path("shared/sub/keep.txt"), b"keep\n").unwrap();
    s.ok("create_directory", json!({"path": "shared/sub"}))
        .await;
    s.ok("create_directory", json!({"path": "fresh"})).await;
    let r = s.ok("rollback_workflow", json!({})).await;
    let t = text(&r);
    assert!(
        t.contains("shared/sub: left in place: it existed before the action (verified)"),
        "{t}"
    );
    assert!(
        t.contains("fresh: removed: the action made it (verified)"),
        "{t}"
    );
    assert!(!t.contains("did not exist before"), "{t}");
    // The summary counts both as done, and says one stayed.
    assert!(
        t.contains("2 step(s) done (1 of them left a directory in place"),
        "{t}"
    );
    assert_eq!(s.read("shared/sub/keep.txt"), b"keep\n");
    assert!(!s.path("fresh").exists());
    s.finish().await;
}

/// An artifact whose write was rolled back says so where it is listed or shown: an agent
/// must not take the file for holding its bytes.
#[tokio::test]
async fn artifacts_of_rolled_back_writes_say_so() {
    let s = Session::start(Mode::Write).await;
    let kept = s
        .ok("create_file", json!({"path": "k.txt", "content": "k\n"}))
        .await;
    let undone = s
        .ok("create_file", json!({"path": "u.txt", "content": "u\n"}))
        .await;
    let id = |r: &rmcp::model::CallToolResult, field: &str| {
        structured(r)["actions"][0][field]
            .as_str()
            .unwrap()
            .to_owned()
    };
    s.ok(
        "rollback_action",
        json!({"action_id": id(&undone, "action_id")}),
    )
    .await;
    let (kept_art, undone_art) = (id(&kept, "artifact_id"), id(&undone, "artifact_id"));
    let r = s.ok("list_artifacts", json!({})).await;
    let t = text(&r);
    let line = |art: &str| t.lines().find(|l| l.starts_with(art)).unwrap().to_owned();
    assert!(
        line(&undone_art).ends_with("(rolled back: this write was undone)"),
        "{t}"
    );
    assert!(!line(&kept_art).contains("rolled back"), "{t}");
    assert_eq!(structured(&r)["rolled_back"], json!([undone_art]));
    // Each entry says it too, as the CLI's and HTTP's listings do.
    for a in structured(&r)["artifacts"].as_array().unwrap() {
        assert_eq!(
            a["rolled_back"],
            json!(a["artifact_id"] == undone_art),
            "{a}"
        );
    }
    let r = s
        .ok("get_artifact", json!({"artifact_id": undone_art}))
        .await;
    assert!(
        text(&r).contains("(rolled back: this write was undone)"),
        "{}",
        text(&r)
    );
    assert_eq!(structured(&r)["rolled_back"], json!(true));
    let r = s.ok("get_artifact", json!({"artifact_id": kept_art})).await;
    assert_eq!(structured(&r)["rolled_back"], json!(false));
    assert_eq!(structured(&r)["lineage_rolled_back"], json!([]));
    // The lineage of an artifact marks its rolled-back ancestors as the list does.
    let first = s
        .ok("create_file", json!({"path": "l.txt", "content": "1\n"}))
        .await;
    let second = s
        .ok("replace_file", json!({"path": "l.txt", "content": "2\n"}))
        .await;
    for undo in [&second, &first] {
        s.ok(
            "rollback_action",
            json!({"action_id": id(undo, "action_id")}),
        )
        .await;
    }
    let (first_art, second_art) = (id(&first, "artifact_id"), id(&second, "artifact_id"));
    let r = s
        .ok("get_artifact", json!({"artifact_id": second_art}))
        .await;
    assert_eq!(
        structured(&r)["lineage_rolled_back"],
        json!([first_art]),
        "{}",
        text(&r)
    );
    let t = text(&r);
    let ancestor = t
        .lines()
        .find(|l| l.starts_with(&format!("- {first_art}")))
        .unwrap();
    assert!(
        ancestor.ends_with("(rolled back: this write was undone)"),
        "{t}"
    );
    s.finish().await;
}

/// A rollback that leaves writes whose snapshots were pruned says so in its text, not
/// only in its structured content: an agent reads the text.
#[tokio::test]
async fn a_rollback_says_in_words_what_it_leaves_of_pruned_writes() {
    let s = Session::start(Mode::Write).await;
    s.ok("create_file", json!({"path": "a.md", "content": "a\n"}))
        .await;
    // Another process on the same state prunes the session's finished writes.
    let mut config = ailab_sandbox_core::Config::with_roots(
        vec![s.root.clone()],
        s.state_dir.path().join("state"),
    );
    config.enable_write = true;
    config.dry_run = false;
    let other = ailab_sandbox_core::Sandbox::open(config).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let pruned = other.prune(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(
        pruned.workflows_pruned,
        std::slice::from_ref(&s.workflow_id)
    );
    s.ok("create_file", json!({"path": "b.md", "content": "b\n"}))
        .await;
    let r = s.ok("rollback_workflow", json!({})).await;
    assert_eq!(structured(&r)["steps_rolled_back"], 1, "{}", text(&r));
    assert!(
        text(&r).contains(
            "Not everything is back: 1 earlier write(s) had their snapshots pruned and cannot be rolled back"
        ),
        "{}",
        text(&r)
    );
    assert!(s.path("a.md").exists() && !s.path("b.md").exists());
    s.finish().await;
}

/// A rollback refused for its ids names them as sent: an empty one is seen, a control
/// character escaped.
#[tokio::test]
async fn a_rollback_of_bad_ids_quotes_them() {
    let s = Session::start(Mode::Write).await;
    let r = s.err("rollback_workflow", json!({"workflow_id": ""})).await;
    let t = text(&r);
    assert!(
        t.contains("invalid_id") && t.contains("rollback of workflow '': "),
        "{t}"
    );
    let r = s
        .err(
            "rollback_action",
            json!({"workflow_id": "wf\nx", "action_id": "a1"}),
        )
        .await;
    let t = text(&r);
    assert!(
        t.contains("rollback of action a1 of workflow 'wf\\nx': "),
        "{t}"
    );
    // A long one is cut, as the refusal's own words cut it.
    let r = s
        .err(
            "rollback_workflow",
            json!({"workflow_id": "x".repeat(100_000)}),
        )
        .await;
    let t = text(&r);
    assert!(
        t.len() < 2_000 && t.contains("rollback of workflow 'xxx"),
        "{t}"
    );
    s.finish().await;
}
