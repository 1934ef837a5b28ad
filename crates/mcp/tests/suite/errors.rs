//! Refusals, bad arguments and unknown tools come back as `isError` results.

use super::support::{Mode, Session, structured, text};
use serde_json::json;

#[tokio::test]
async fn a_path_traversal_is_refused_with_its_reason_code() {
    let s = Session::start(Mode::Write).await;
    let r = s
        .err(
            "create_file",
            json!({"path": "../escape.md", "content": "x"}),
        )
        .await;
    let t = text(&r);
    assert!(t.contains("path_traversal"), "{t}");
    assert!(t.contains("What to do instead"), "{t}");
    assert_eq!(
        structured(&r)["actions"][0]["reason_code"],
        "path_traversal"
    );
    assert!(
        !s.root.parent().unwrap().join("escape.md").exists(),
        "the write escaped"
    );
    s.finish().await;
}

/// The extensions an extension refusal suggests are those this server's policy lets the
/// tool write: never one the operator's allow-list refuses in turn.
#[tokio::test]
async fn extension_advice_follows_the_servers_policy() {
    let allowed: Vec<String> = [".txt", ".md", ".yaml"].map(str::to_owned).to_vec();
    let s = Session::start_with(Mode::Write, move |c| {
        c.extensions = ailab_sandbox_core::confine::path::ExtensionPolicy::new(Some(&allowed), &[]);
    })
    .await;
    let advice = |t: String| {
        t.split("What to do instead: ")
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    let t = text(
        &s.err("write_json", json!({"path": "a.json", "data": {}}))
            .await,
    );
    assert!(
        advice(t.clone()).contains("write_json can write no file on this server"),
        "{t}"
    );
    let t = advice(text(
        &s.err("create_file", json!({"path": "a.json", "content": "x"}))
            .await,
    ));
    assert!(t.contains(".txt .md .yaml") && !t.contains(".json"), "{t}");
    let t = advice(text(
        &s.err(
            "generate_config",
            json!({"path": "a.toml", "data": {"k": 1}}),
        )
        .await,
    ));
    assert!(
        t.contains("(.yaml)") && !t.contains(".toml") && !t.contains(".json"),
        "{t}"
    );
    s.finish().await;
}

#[tokio::test]
async fn governance_refusals_name_the_code_and_an_alternative() {
    let s = Session::start(Mode::Write).await;
    let cases = [
        (
            "create_file",
            json!({"path": "unit.service", "content": "x"}),
            "blocked_extension",
        ),
        (
            "write_json",
            json!({"path": "x.yaml", "data": {}}),
            "extension_not_allowed",
        ),
        (
            "generate_script",
            json!({"path": "a.sh", "content": "echo\n", "description": "then chmod +x it"}),
            "chmod_forbidden",
        ),
        (
            "replace_file",
            json!({"path": "missing.md", "content": "x"}),
            "not_found",
        ),
        (
            "sandbox_transform",
            json!({"path": "missing.md", "edits": [{"old": "a", "new": "b"}]}),
            "not_found",
        ),
        (
            "create_file",
            json!({"path": "a/b/c/d/e/f/g/h/i.md", "content": "x"}),
            "depth_exceeded",
        ),
        (
            "create_file",
            json!({"path": ".rollback/x.md", "content": "x"}),
            "reserved_path",
        ),
        (
            "create_file",
            json!({"path": "x.md", "content": "x", "workflow_id": "../bad"}),
            "invalid_id",
        ),
        (
            "list_artifacts",
            json!({"workflow_id": "bad id"}),
            "invalid_id",
        ),
    ];
    for (tool, args, code) in cases {
        let r = s.err(tool, args).await;
        let t = text(&r);
        assert!(t.contains(code), "{tool}: expected {code} in {t}");
        assert!(t.contains("What to do instead"), "{t}");
        assert_eq!(structured(&r)["reason_code"], code, "{tool}: at the top");
    }
    s.ok(
        "create_file",
        json!({"path": "dup.md", "content": "one\ntwo\none\n"}),
    )
    .await;
    let r = s
        .err("create_file", json!({"path": "dup.md", "content": "x"}))
        .await;
    assert!(
        text(&r).contains("already_exists") && text(&r).contains("replace_file"),
        "{}",
        text(&r)
    );
    let r = s
        .err(
            "sandbox_transform",
            json!({"path": "dup.md", "edits": [{"old": "one", "new": "1"}]}),
        )
        .await;
    assert!(text(&r).contains("edit_ambiguous"), "{}", text(&r));
    let r = s
        .err(
            "sandbox_transform",
            json!({"path": "dup.md", "edits": [{"old": "three", "new": "3"}]}),
        )
        .await;
    assert!(text(&r).contains("edit_not_found"), "{}", text(&r));
    assert_eq!(
        s.read("dup.md"),
        b"one\ntwo\none\n",
        "refused edits changed nothing"
    );
    s.finish().await;
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_are_tool_errors() {
    let s = Session::start(Mode::Write).await;
    let cases = [
        (
            "create_file",
            json!({"path": "x.md", "content": "x", "mode": "0755"}),
            "'mode'",
        ),
        (
            "create_file",
            json!({"path": "x.md", "content": 5}),
            "'content' must be a string",
        ),
        ("create_file", json!({"path": "x.md"}), "needs 'content'"),
        ("create_file", json!({"content": "x"}), "needs 'path'"),
        (
            "write_json",
            json!({"path": "x.json", "content": "{}"}),
            "does not take 'content'",
        ),
        (
            "create_directory",
            json!({"path": "d", "content": "x"}),
            "does not take 'content'",
        ),
        (
            "sandbox_transform",
            json!({"path": "x.md", "edits": []}),
            "empty",
        ),
        (
            "sandbox_transform",
            json!({"path": "x.md", "edits": [{"old": "a"}]}),
            "'edits' item 1 must be an object with exactly the strings 'old' and 'new'; 'new' is missing.",
        ),
        (
            "sandbox_transform",
            json!({"path": "x.md", "edits": "a->b"}),
            "'edits' must be",
        ),
        ("list_artifacts", json!({"limit": 0}), "between 1 and 1000"),
        (
            "list_artifacts",
            json!({"limit": -1}),
            "'limit' is -1; it must be a whole number between 1 and 1000",
        ),
        (
            "list_artifacts",
            json!({"limit": 2.5}),
            "'limit' is 2.5; it must be a whole number between 1 and 1000",
        ),
        ("list_artifacts", json!({"limit": "ten"}), "whole number"),
        (
            "list_directory",
            json!({"offset": 18446744073709551616.0}),
            "it must be between 0 and 18446744073709551615",
        ),
        (
            "list_artifacts",
            json!({"limit": 1e20}),
            "'limit' is 1e+20; it must be between 1 and 1000",
        ),
        (
            "list_directory",
            json!({"offset": 1e16}),
            "'offset' is 1e+16; a number this large must be written as digits alone, without a fraction or an exponent",
        ),
        ("list_artifacts", json!({"limit": 2.5}), "whole number"),
        (
            "write_json",
            json!({"path": "n.json", "data": null}),
            "except null",
        ),
        (
            "rollback_workflow",
            json!({"force": "yes"}),
            "'force' must be true or false",
        ),
        ("get_state", json!({"x": 1}), "no arguments"),
        (
            "sandbox_transform",
            json!({"path": "x.md", "edits": [{"old": 1, "new": "b"}]}),
            "'edits' item 1 must be an object with exactly the strings 'old' and 'new'; 'old' is a number.",
        ),
    ];
    for (tool, args, needle) in cases {
        let r = s.err(tool, args).await;
        let t = text(&r);
        assert!(t.contains("invalid_plan"), "{tool}: {t}");
        assert!(t.contains(needle), "{tool}: expected {needle:?} in {t}");
    }
    let audited =
        || async { structured(&s.ok("get_state", json!({})).await)["audit_entries"].clone() };
    let before = audited().await.as_u64().unwrap();
    let r = s.err("delete_file", json!({"path": "x.md"})).await;
    assert!(
        text(&r).contains("(forbidden_intent)")
            && text(&r).contains("'delete_file' is a forbidden intent"),
        "{}",
        text(&r)
    );
    // The write tools are offered once, in what to do.
    assert_eq!(text(&r).matches("create_file").count(), 1, "{}", text(&r));
    // On the trail as a blocked action, as in a plan: an agent probing leaves a trace.
    assert_eq!(audited().await, before + 1);
    // A chmod asked for as a tool: refused and audited as in a plan.
    for (tool, n) in [("chmod", 2), ("make_executable", 3)] {
        let r = s.err(tool, json!({"path": "x.sh"})).await;
        assert!(text(&r).contains("(chmod_forbidden)"), "{}", text(&r));
        assert_eq!(audited().await, before + n, "{tool}");
    }
    // Any other tool the server lacks too, with the code a plan's intent gets (a
    // forbidden intent spelt otherwise is one still).
    for (tool, code, n) in [
        ("make_coffee", "(not_sandbox_write)", 4),
        ("Make-Coffee", "(unknown_operation)", 5),
        ("DELETE_FILE", "(forbidden_intent)", 6),
    ] {
        let r = s.err(tool, json!({"path": "x.md"})).await;
        assert!(
            text(&r).contains(code) && text(&r).contains("create_file"),
            "{}",
            text(&r)
        );
        assert_eq!(audited().await, before + n, "{tool}");
    }
    // A name of megabytes is said back cut, as the trail keeps it.
    let long = "x".repeat(1 << 20);
    let r = s.err(&long, json!({"path": "x.md"})).await;
    assert!(
        text(&r).contains("(unknown_operation)"),
        "{}",
        &text(&r)[..200]
    );
    assert!(
        text(&r).len() < 8192 && text(&r).contains("xxx…xxx"),
        "{} bytes",
        text(&r).len()
    );
    // A write tool whose arguments the schema refuses, asking readably for a chmod, is
    // a probe too: refused and audited as its action in a plan refused unread.
    let before = audited().await.as_u64().unwrap();
    let r = s
        .err(
            "create_file",
            json!({"path": "run.md", "description": "then chmod +x it", "mode": 1}),
        )
        .await;
    assert!(text(&r).contains("(chmod_forbidden)"), "{}", text(&r));
    assert_eq!(audited().await, before + 1);
    let r = s
        .err(
            "create_file",
            json!({"path": "run.md", "description": "notes"}),
        )
        .await;
    assert!(text(&r).contains("(invalid_plan)"), "{}", text(&r));
    assert_eq!(
        audited().await,
        before + 1,
        "a bad call asking nothing forbidden"
    );
    let r = s.err("get_artifact", json!({"artifact_id": "../x"})).await;
    assert!(text(&r).contains("(invalid_id)"), "{}", text(&r));
    // What to do names what the tool takes: it has no workflow_id to omit.
    assert!(
        text(&r).contains("list_artifacts") && !text(&r).contains("workflow_id"),
        "{}",
        text(&r)
    );
    let r = s.call_raw("get_state", serde_json::Map::new()).await;
    assert_eq!(r.is_error, Some(false));
    assert!(
        std::fs::read_dir(&s.root).unwrap().next().is_none(),
        "bad calls wrote nothing"
    );
    // The server survived all of it.
    s.ok(
        "create_file",
        json!({"path": "after.md", "content": "ok\n"}),
    )
    .await;
    s.finish().await;
}

/// A refused write says that the server only simulates writes exactly when it does, and
/// not when the phase is what refused it.
#[tokio::test]
async fn a_refusal_says_writes_are_simulated_only_when_they_are() {
    let s = Session::start_with(Mode::Write, |c| c.phase = "28.2".to_owned()).await;
    let t = text(
        &s.err("create_file", json!({"path": "p.md", "content": "p"}))
            .await,
    );
    assert!(t.contains("phase_not_supported"), "{t}");
    assert!(
        !t.contains("only simulates") && !t.contains("not enabled"),
        "{t}"
    );
    // The session's instructions and get_state say the same: refused, and the fix is the
    // phase, not the write flags (both are on).
    let info = s.client.peer_info().unwrap();
    let instructions = info.instructions.as_deref().unwrap_or_default();
    assert!(
        instructions.contains("is refused (phase_not_supported)")
            && instructions.contains("--phase 28.3")
            && !instructions.contains("only simulates")
            && !instructions.contains("--enable-write"),
        "{instructions}"
    );
    let t = text(&s.ok("get_state", json!({})).await);
    assert!(t.contains("writes are refused (phase_not_supported"), "{t}");
    // The rate limit is a workflow's, as the budget is: both say so.
    assert!(
        t.contains(" bytes and 1000 writes per minute per workflow"),
        "{t}"
    );
    assert!(
        instructions.contains("the workflow's budget and its rate limit of 1000 writes per minute"),
        "{instructions}"
    );
    // A forbidden intent asked for as a tool is answered with what the trail records of
    // it, as a plan holding it is: here the phase, named first.
    for tool in ["delete_file", "chmod"] {
        let t = text(&s.err(tool, json!({"path": "p.md"})).await);
        assert!(t.contains("(phase_not_supported)"), "{tool}: {t}");
        // Two refusals in one sentence each, not "…phases 28.3 …; no tool offers it".
        assert!(
            t.contains(&format!("besides, this server has no tool named '{tool}'"))
                && !t.contains("no tool offers it"),
            "{tool}: {t}"
        );
    }
    let trail =
        std::fs::read_to_string(s.state_dir.path().join("state/sandbox_audit.jsonl")).unwrap();
    let codes: Vec<String> = trail
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| matches!(e["mutation_type"].as_str(), Some("delete_file" | "chmod")))
        .map(|e| e["reason_code"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(codes, ["phase_not_supported"; 2], "{trail}");
    s.finish().await;

    let s = Session::start(Mode::Default).await;
    let t = text(
        &s.err("create_file", json!({"path": "u.service", "content": "u"}))
            .await,
    );
    assert!(t.contains("blocked_extension"), "{t}");
    assert!(t.contains("only simulates writes"), "{t}");
    s.finish().await;
}

/// A tool the server lacks is answered in the server's words, and says when the audit
/// trail could not take its line (here the trail was moved away by another program).
#[tokio::test]
async fn a_probe_the_trail_cannot_take_says_so() {
    let s = Session::start(Mode::Write).await;
    let state = s.state_dir.path().join("state");
    std::fs::rename(
        state.join("sandbox_audit.jsonl"),
        state.join("moved-away.jsonl"),
    )
    .unwrap();
    for tool in ["delete_file", "frobnicate"] {
        let r = s.err(tool, json!({"path": "a.md"})).await;
        let said = text(&r);
        assert!(
            said.contains("this refusal's audit line could not be written or made durable"),
            "{tool}: {said}"
        );
    }
    s.finish().await;
}
