//! Each of the 11 write tools, for real and as a dry run.

use super::support::{Mode, RawSession, Session, sha256_of, structured, text};
use ailab_sandbox_core::catalog::OPERATIONS;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;

/// Checks a successful write result against the file on disk.
fn assert_written(s: &Session, tool: &str, rel: &str, r: &rmcp::model::CallToolResult) {
    let t = text(r);
    let st = structured(r);
    assert_eq!(st["status"], "success", "{tool}: {t}");
    assert_eq!(st["workflow_id"], s.workflow_id.as_str());
    let a = &st["actions"][0];
    assert_eq!(a["intent"], tool);
    let sha = sha256_of(&s.path(rel));
    assert_eq!(a["after_checksum"], sha.as_str(), "{tool}");
    assert_eq!(a["size_bytes"], s.read(rel).len() as u64, "{tool}");
    let art = a["artifact_id"].as_str().unwrap();
    for needle in [
        sha.as_str(),
        art,
        s.workflow_id.as_str(),
        "rollback_action",
        rel,
    ] {
        assert!(t.contains(needle), "{tool}: {needle:?} missing from {t}");
    }
    let mode = std::fs::metadata(s.path(rel)).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0, "{tool} left an execute bit: {mode:o}");
}

#[tokio::test]
async fn every_write_tool_writes_what_it_says() {
    let s = Session::start(Mode::Write).await;
    let mut used = Vec::new();

    let r = s
        .ok(
            "create_file",
            json!({"path": "notes/a.md", "content": "hello\n"}),
        )
        .await;
    assert_eq!(s.read("notes/a.md"), b"hello\n");
    assert_written(&s, "create_file", "notes/a.md", &r);
    used.push("create_file");

    let r = s
        .ok(
            "append_file",
            json!({"path": "notes/a.md", "content": "more\n"}),
        )
        .await;
    assert_eq!(s.read("notes/a.md"), b"hello\nmore\n");
    assert_written(&s, "append_file", "notes/a.md", &r);
    used.push("append_file");

    let r = s
        .ok(
            "replace_file",
            json!({"path": "notes/a.md", "content": "replaced text\n"}),
        )
        .await;
    assert_eq!(s.read("notes/a.md"), b"replaced text\n");
    assert_written(&s, "replace_file", "notes/a.md", &r);
    used.push("replace_file");

    let r = s.ok("create_directory", json!({"path": "dir/sub"})).await;
    assert!(s.path("dir/sub").is_dir());
    assert_eq!(structured(&r)["status"], "success");
    assert!(text(&r).contains("dir/sub"));
    used.push("create_directory");

    let data = json!({"k": 1, "list": [1, 2], "s": "x"});
    let r = s
        .ok("write_json", json!({"path": "data/x.json", "data": data}))
        .await;
    let mut want = serde_json::to_vec_pretty(&data).unwrap();
    want.push(b'\n');
    assert_eq!(s.read("data/x.json"), want);
    assert_written(&s, "write_json", "data/x.json", &r);
    used.push("write_json");

    let r = s
        .ok(
            "write_yaml",
            json!({"path": "data/x.yaml", "data": {"k": 1}}),
        )
        .await;
    assert_eq!(s.read("data/x.yaml"), b"k: 1\n");
    assert_written(&s, "write_yaml", "data/x.yaml", &r);
    used.push("write_yaml");

    let r = s
        .ok(
            "write_markdown",
            json!({"path": "doc/readme.md", "content": "# Title\n"}),
        )
        .await;
    assert_eq!(s.read("doc/readme.md"), b"# Title\n");
    assert_written(&s, "write_markdown", "doc/readme.md", &r);
    used.push("write_markdown");

    let r = s
        .ok(
            "generate_report",
            json!({"path": "reports/r.md", "content": "# Report\n\nAll good.\n"}),
        )
        .await;
    assert_eq!(s.read("reports/r.md"), b"# Report\n\nAll good.\n");
    assert_written(&s, "generate_report", "reports/r.md", &r);
    used.push("generate_report");

    let r = s
        .ok(
            "generate_config",
            json!({"path": "cfg/app.toml", "data": {"name": "x", "port": 8}}),
        )
        .await;
    assert_eq!(
        String::from_utf8(s.read("cfg/app.toml")).unwrap(),
        "name = \"x\"\nport = 8\n"
    );
    assert_written(&s, "generate_config", "cfg/app.toml", &r);
    used.push("generate_config");

    let r = s.ok("generate_script", json!({"path": "scripts/run.sh", "content": "#!/bin/sh\necho hi\n", "description": "a greeting"})).await;
    assert_eq!(s.read("scripts/run.sh"), b"#!/bin/sh\necho hi\n");
    assert_written(&s, "generate_script", "scripts/run.sh", &r);
    used.push("generate_script");

    let r = s
        .ok(
            "sandbox_transform",
            json!({"path": "notes/a.md", "edits": [{"old": "replaced", "new": "transformed"}]}),
        )
        .await;
    assert_eq!(s.read("notes/a.md"), b"transformed text\n");
    assert_written(&s, "sandbox_transform", "notes/a.md", &r);
    used.push("sandbox_transform");

    let mut all: Vec<&str> = OPERATIONS.iter().map(|o| o.name).collect();
    all.sort_unstable();
    used.sort_unstable();
    assert_eq!(used, all, "every catalog operation is exercised");

    // Every write landed in the session's workflow, as artifacts.
    let r = s
        .ok("list_artifacts", json!({"workflow_id": s.workflow_id}))
        .await;
    assert_eq!(
        structured(&r)["artifacts"].as_array().unwrap().len(),
        10,
        "{}",
        text(&r)
    );
    s.finish().await;
}

#[tokio::test]
async fn a_dry_run_is_not_an_error_and_writes_nothing() {
    let s = Session::start(Mode::Default).await;
    let r = s
        .ok(
            "create_file",
            json!({"path": "notes/dry.md", "content": "hello\n"}),
        )
        .await;
    assert!(
        !s.path("notes/dry.md").exists(),
        "a dry run created the file"
    );
    let t = text(&r);
    let lower = t.to_lowercase();
    assert!(lower.contains("dry run"), "{t}");
    assert!(lower.contains("nothing was written"), "{t}");
    assert!(t.contains("sandbox_disabled"), "{t}");
    assert!(
        t.contains("--enable-write") && t.contains("--no-dry-run"),
        "{t}"
    );
    // All three ways the operator can turn writing on, the config file's too, and which
    // wins (a variable set the other way undoes the file's).
    assert!(
        t.contains("enable_write = true in the config file")
            && t.contains("dry_run = false in its config file")
            && t.contains("a flag wins over the variable, the variable over the file"),
        "{t}"
    );
    let st = structured(&r);
    assert_eq!(st["status"], "simulated_success");
    assert_eq!(st["simulation_only"], true);
    assert_eq!(st["dry_run_reason"], "sandbox_disabled");
    // A refusal in simulation mode is still an error.
    let r = s
        .err(
            "create_file",
            json!({"path": "../escape.md", "content": "x"}),
        )
        .await;
    assert!(text(&r).contains("path_traversal"), "{}", text(&r));
    s.finish().await;
}

#[tokio::test]
async fn a_call_may_name_its_own_workflow() {
    let s = Session::start(Mode::Write).await;
    let r = s
        .ok(
            "create_file",
            json!({"path": "w.txt", "content": "w\n", "workflow_id": "wf_custom"}),
        )
        .await;
    assert_eq!(structured(&r)["workflow_id"], "wf_custom");
    assert!(
        text(&r).contains("\"workflow_id\": \"wf_custom\""),
        "{}",
        text(&r)
    );
    let r = s
        .ok("list_artifacts", json!({"workflow_id": s.workflow_id}))
        .await;
    assert_eq!(structured(&r)["artifacts"], Value::Array(Vec::new()));
    s.ok("rollback_workflow", json!({"workflow_id": "wf_custom"}))
        .await;
    assert!(!s.path("w.txt").exists());
    s.finish().await;
}

/// A call the operation accepts is answered even when JSON escaping makes its message
/// larger than rmcp's default line limit (16 MiB): 3 MiB of control characters, each
/// sent as a six-byte escape, is an 18 MiB line.
#[tokio::test]
async fn a_call_grown_by_escaping_is_still_answered() {
    let s = Session::start(Mode::Write).await;
    let content = "\u{1}".repeat(3 << 20);
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.call(
            "generate_report",
            json!({"path": "reports/escaped.md", "content": content}),
        ),
    )
    .await
    .expect("the server answers");
    assert_eq!(structured(&r)["status"], "success", "{}", text(&r));
    assert_eq!(s.read("reports/escaped.md").len(), 3 << 20);
    s.finish().await;
}

/// A number that would reach the file changed (more digits than a 64-bit integer or a
/// double holds), or a key given twice, is refused as `invalid_plan`, as over HTTP,
/// instead of being written rounded or dropped; a number that is kept is written as sent. The client is raw JSON lines: a
/// client library would round the number before sending it.
#[tokio::test]
async fn numbers_that_would_change_are_refused_not_rounded() {
    let mut s = RawSession::start(Mode::Write).await;
    let string = Some("send it as a string");
    let cases = [
        (r#""big""#, "big.json", "12345678901234567890123", string),
        (
            "2",
            "fine.json",
            r#"{"p": 0.1000000000000000000001}"#,
            string,
        ),
        (
            "3",
            "kept.json",
            "[1.5, 18446744073709551615, -0.25e-3]",
            None,
        ),
        (
            "4",
            "twice.json",
            r#"{"a": [{"limit": 1, "limit": 1000}]}"#,
            Some("'limit' appears twice"),
        ),
    ];
    for (id, file, data, refused) in cases {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"{file}","data":{data}}}}}}}"#
        );
        s.send(&call).await;
        let answer = s.answer().await;
        assert_eq!(answer["id"].to_string(), id, "{answer}");
        let result = &answer["result"];
        if let Some(says) = refused {
            assert_eq!(result["isError"], json!(true), "{answer}");
            assert_eq!(
                result["structuredContent"]["reason_code"], "invalid_plan",
                "{answer}"
            );
            assert!(
                result["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .contains(says),
                "{answer}"
            );
            assert!(!s.root.join(file).exists(), "{file} was written");
        } else {
            assert_eq!(result["isError"], json!(false), "{answer}");
            let written = std::fs::read_to_string(s.root.join(file)).unwrap();
            for n in ["1.5", "18446744073709551615", "-0.00025"] {
                assert!(written.contains(n), "{n} missing from {written}");
            }
        }
    }
    // Neither an escaped method name nor a tool other than a write gets past the check.
    for (id, call) in [
        (
            "5",
            r#"{"jsonrpc":"2.0","id":5,"method":"tools\/call","params":{"name":"write_json","arguments":{"path":"esc.json","data":{"k":1,"k":2}}}}"#,
        ),
        (
            "6",
            r#"{"jsonrpc":"2.0","id":6,"method":"tools\u002fcall","params":{"name":"write_json","arguments":{"path":"esc.json","data":12345678901234567890123}}}"#,
        ),
        (
            "7",
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"rollback_workflow","arguments":{"workflow_id":"wf_a","workflow_id":"wf_b"}}}"#,
        ),
    ] {
        s.send(call).await;
        let answer = s.answer().await;
        assert_eq!(answer["id"].to_string(), id, "{answer}");
        assert_eq!(answer["result"]["isError"], json!(true), "{answer}");
        assert_eq!(
            answer["result"]["structuredContent"]["reason_code"], "invalid_plan",
            "{answer}"
        );
    }
    // A name given twice is refused whichever comes last; a forbidden one, first or last,
    // is still on the trail, as a probe, and answered as the trail records it.
    let trail = |s: &RawSession| {
        std::fs::read_to_string(s.state.join("sandbox_audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"delete_file\""))
            .count()
    };
    for (id, names, traced, code, says) in [
        (
            "9",
            r#""name":"get_state","name":"delete_file""#,
            1,
            "forbidden_intent",
            "'delete_file' is a forbidden intent",
        ),
        (
            "10",
            r#""name":"delete_file","name":"get_state""#,
            2,
            "forbidden_intent",
            "'delete_file' is a forbidden intent",
        ),
        (
            "11",
            r#""name":"create_file","name":"get_state""#,
            2,
            "invalid_plan",
            "'name' appears twice",
        ),
    ] {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{{names},"arguments":{{"path":"keep.md"}}}}}}"#
        );
        s.send(&call).await;
        let answer = s.answer().await;
        assert_eq!(answer["id"].to_string(), id, "{answer}");
        assert_eq!(
            answer["result"]["structuredContent"]["reason_code"], code,
            "{answer}"
        );
        assert!(
            answer["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains(says),
            "{answer}"
        );
        assert_eq!(trail(&s), traced, "{names}");
    }
    // A second `arguments` is refused by the SDK itself.
    let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"write_json","arguments":{"path":"esc.json","data":1},"arguments":{"path":"esc.json","data":{"k":1,"k":2}}}}"#;
    s.send(call).await;
    let answer = s.answer().await;
    assert!(
        answer["error"].is_object() || answer["result"]["isError"] == json!(true),
        "{answer}"
    );
    assert!(!s.root.join("esc.json").exists());
    s.finish().await;
}

/// Calls sent all at once, before any is answered, are each refused with their own
/// reason: a burst cannot push a refusal out and get its call through.
#[tokio::test]
async fn a_burst_of_calls_not_kept_as_sent_is_refused_call_by_call() {
    let mut s = RawSession::start(Mode::Write).await;
    let n = 300;
    let burst: String = (0..n)
        .map(|i| {
            let args = if i % 2 == 0 {
                format!(r#"{{"path":"seen/f{i}.json","path":"hidden/f{i}.json","data":1}}"#)
            } else {
                format!(r#"{{"path":"big/f{i}.json","data":12345678901234567890123}}"#)
            };
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"tools/call\",\"params\":{{\"name\":\"write_json\",\"arguments\":{args}}}}}\n"
            )
        })
        .collect();
    // Written from its own task: the answers must be read meanwhile.
    let mut input = s.input;
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        input.write_all(burst.as_bytes()).await.unwrap();
        input
    });
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..n {
        let line = tokio::time::timeout(std::time::Duration::from_secs(60), s.answers.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap();
        let result = &answer["result"];
        assert_eq!(result["isError"], json!(true), "{answer}");
        assert_eq!(
            result["structuredContent"]["reason_code"], "invalid_plan",
            "{answer}"
        );
        answered.insert(answer["id"].as_u64().unwrap());
    }
    assert_eq!(answered.len(), n);
    for dir in ["seen", "hidden", "big"] {
        assert!(!s.root.join(dir).exists(), "{dir} was written");
    }
    s.input = writer.await.unwrap();
    s.finish().await;
}

/// Arguments past what a plan may hold are refused before they are built.
#[tokio::test]
async fn a_call_past_the_plan_value_limit_is_refused() {
    let mut s = RawSession::start(Mode::Write).await;
    let zeros = vec!["0"; ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN + 1].join(",");
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"big.json","data":[{zeros}]}}}}}}"#
    );
    // Sent from its own task: the line is larger than the pipe.
    let mut input = s.input;
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        input
            .write_all(format!("{call}\n").as_bytes())
            .await
            .unwrap();
        input
    });
    s.input = writer.await.unwrap();
    let answer = s.answer().await;
    assert_eq!(answer["id"], 1);
    assert_eq!(
        answer["result"]["structuredContent"]["reason_code"], "invalid_plan",
        "{answer}"
    );
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("holds more than 2097152 values"), "{text}");
    assert!(!s.root.join("big.json").exists());
    s.finish().await;
}

/// A byte order mark before a call, which rmcp reads past, does not take the call past
/// the check either.
#[tokio::test]
async fn a_byte_order_mark_does_not_hide_a_call_from_the_check() {
    let mut s = RawSession::start(Mode::Write).await;
    s.send(concat!(
        "\u{feff}",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"seen.txt","path":"hidden.txt","content":"x"}}}"#
    ))
    .await;
    let answer = s.answer().await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["reason_code"], "invalid_plan",
        "{answer}"
    );
    assert!(!s.root.join("hidden.txt").exists());
    assert!(!s.root.join("seen.txt").exists());
    s.finish().await;
}

/// A client that skips `initialize` sends what rmcp needs in each request's `_meta`; a
/// refused call keeps it, so it is answered with its refusal, not a protocol error.
#[tokio::test]
async fn a_refused_call_keeps_the_clients_meta() {
    let mut s = RawSession::connect(Mode::Write);
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    s.send(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"a.json","data":{{"x":1}}}},{meta}}}}}"#
    ))
    .await;
    let answer = s.answer().await;
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    s.send(&format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"b.json","data":{{"x":1,"x":2}}}},{meta}}}}}"#
    ))
    .await;
    let answer = s.answer().await;
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["reason_code"], "invalid_plan",
        "{answer}"
    );
    assert!(!s.root.join("b.json").exists());
    s.finish().await;
}

/// A last message the client sends without a newline before closing is still run.
#[tokio::test]
async fn a_last_message_without_a_newline_is_answered() {
    use tokio::io::AsyncWriteExt;
    let mut s = RawSession::start(Mode::Write).await;
    s.input
        .write_all(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"last.txt","content":"x"}}}"#)
        .await
        .unwrap();
    s.input.shutdown().await.unwrap();
    let answer = s.answer().await;
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    assert_eq!(std::fs::read(s.root.join("last.txt")).unwrap(), b"x");
    s.finish().await;
}

/// A write into another root than the first says which root its path is in: a read or
/// an edit of the same path without it would reach the first root's file.
#[tokio::test]
async fn a_write_into_another_root_names_the_root() {
    let other = tempfile::tempdir().unwrap();
    let second = other.path().join("second");
    let s = Session::start_with(Mode::Write, |c| c.roots.push(second.clone())).await;
    let named = second.display().to_string();
    let r = s
        .ok(
            "write_markdown",
            json!({"path": "v.md", "content": "two\n", "root": named}),
        )
        .await;
    let t = text(&r);
    assert!(
        t.contains(&format!(
            "\nroot: {named} (the path is in this root: pass it as 'root'"
        )),
        "{t}"
    );
    assert_eq!(std::fs::read(second.join("v.md")).unwrap(), b"two\n");
    let r = s
        .ok("read_file", json!({"path": "v.md", "root": named}))
        .await;
    assert!(text(&r).contains("two"), "{}", text(&r));
    // A write into the first root names none.
    let r = s
        .ok(
            "write_markdown",
            json!({"path": "w.md", "content": "one\n"}),
        )
        .await;
    assert!(!text(&r).contains("\nroot: "), "{}", text(&r));
    s.finish().await;
}
