//! initialize and tools/list.

use super::support::{INITIALIZE, Mode, RawSession, Session};
use ailab_sandbox_core::catalog::{OPERATIONS, Payload};
use serde_json::Value;
use std::collections::BTreeSet;

const OTHER_TOOLS: [&str; 8] = [
    "read_file",
    "list_directory",
    "get_file_info",
    "rollback_workflow",
    "rollback_action",
    "list_artifacts",
    "get_artifact",
    "get_state",
];

#[tokio::test]
async fn initialize_names_the_server_and_advertises_tools() {
    let s = Session::start(Mode::Default).await;
    let info = s.client.peer_info().expect("server info after initialize");
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "ailab-sandbox");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    assert!(info.capabilities.tools.is_some(), "tools capability");
    let instructions = info.instructions.as_deref().unwrap_or_default();
    assert!(instructions.contains(&s.workflow_id), "{instructions}");
    assert!(instructions.contains("NOT enabled"), "{instructions}");
    // Calls pipelined run together: an agent is told before it sends any.
    assert!(
        instructions.contains("wait for a call's answer before sending one that depends on it"),
        "{instructions}"
    );
    assert!(s.workflow_id.starts_with("wf_mcp_"), "{}", s.workflow_id);
    s.finish().await;
}

/// `initialize` opens a session once: sent again mid-session it is refused, and the
/// session goes on in the version agreed first.
#[tokio::test]
async fn a_second_initialize_is_refused_and_the_session_goes_on() {
    let mut s = RawSession::start(Mode::Default).await;
    let again = INITIALIZE
        .replace(r#""id":0"#, r#""id":1"#)
        .replace("2025-06-18", "2025-03-26");
    s.send(&again).await;
    let refused = s.answer().await;
    assert_eq!(refused["id"], 1, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let said = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains("already initialized"), "{said}");
    assert!(refused.get("result").is_none(), "{refused}");
    s.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let listed = s.answer().await;
    assert_eq!(listed["id"], 2, "{listed}");
    assert!(
        listed["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{listed}"
    );
    s.finish().await;
}

/// The MCP features the server does not advertise are refused with a sentence that
/// says what it does offer (the SDK's own refusal names only the method), and the
/// session goes on.
#[tokio::test]
async fn features_not_offered_are_refused_with_what_is() {
    let mut s = RawSession::start(Mode::Default).await;
    let asks = [
        (r#""resources/list""#, "{}"),
        (r#""resources/templates/list""#, "{}"),
        (r#""resources/read""#, r#"{"uri":"file:///etc/passwd"}"#),
        (r#""prompts/list""#, "{}"),
        (r#""prompts/get""#, r#"{"name":"x"}"#),
        (r#""resources/subscribe""#, r#"{"uri":"file:///x"}"#),
        (r#""resources/unsubscribe""#, r#"{"uri":"file:///x"}"#),
        (
            r#""completion/complete""#,
            r#"{"ref":{"type":"ref/prompt","name":"x"},"argument":{"name":"a","value":"b"}}"#,
        ),
    ];
    for (id, (method, params)) in asks.iter().enumerate() {
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{params}}}"#,
            id = id + 1
        ))
        .await;
        let refused = s.answer().await;
        assert_eq!(refused["id"], id + 1, "{refused}");
        assert_eq!(refused["error"]["code"], -32601, "{refused}");
        let said = refused["error"]["message"].as_str().unwrap_or_default();
        let method = method.trim_matches('"');
        assert!(
            said.starts_with(&format!("{method} is not offered"))
                && said.contains("tools/list")
                && said.contains("tools/call"),
            "{said}"
        );
    }
    s.send(r#"{"jsonrpc":"2.0","id":99,"method":"tools/list"}"#)
        .await;
    let listed = s.answer().await;
    assert_eq!(listed["id"], 99, "{listed}");
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    s.finish().await;
}

/// A session opened by a request naming its version inline (any method, even one the
/// server does not serve) takes no `initialize` after it, even one sent right behind it,
/// which the SDK may begin first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initialize_after_an_inline_opening_is_refused() {
    let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    for (round, method) in ["tools/list", "prompts/list", "tools/list", "tools/list"]
        .iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let mut s = RawSession::connect(Mode::Default);
        let opening = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"_meta":{meta}}}}}"#
        );
        let again = INITIALIZE.replace(r#""id":0"#, r#""id":2"#);
        // One write: both lines reach the SDK together.
        s.send(&format!("{opening}\n{again}")).await;
        let answers = [s.answer().await, s.answer().await];
        let init = answers
            .iter()
            .find(|a| a["id"] == 2)
            .unwrap_or_else(|| panic!("round {round}: {answers:?}"));
        assert_eq!(
            init["error"]["code"], -32600,
            "round {round} ({method}): {init}"
        );
        s.finish().await;
    }
}

#[tokio::test]
async fn tools_list_has_the_catalog_and_the_other_tools() {
    let s = Session::start(Mode::Write).await;
    let tools = s.client.list_all_tools().await.unwrap();
    let names: BTreeSet<String> = tools.iter().map(|t| t.name.to_string()).collect();
    let mut expected: BTreeSet<String> = OPERATIONS.iter().map(|o| o.name.to_owned()).collect();
    assert_eq!(expected.len(), 11);
    expected.extend(OTHER_TOOLS.iter().map(|n| (*n).to_owned()));
    assert_eq!(names, expected);
    assert_eq!(tools.len(), 19, "no duplicates");

    for op in &OPERATIONS {
        let t = tools.iter().find(|t| t.name == op.name).unwrap();
        let schema = Value::Object((*t.input_schema).clone());
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false, "{}", op.name);
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let payload = match op.payload() {
            Payload::Content => Some("content"),
            Payload::Data => Some("data"),
            Payload::Edits => Some("edits"),
            Payload::None => None,
        };
        let mut want = vec!["path"];
        want.extend(payload);
        assert_eq!(required, want, "{}", op.name);
        let props = schema["properties"].as_object().unwrap();
        let mut keys: Vec<&str> = props.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want_keys = vec!["path", "workflow_id", "description", "root"];
        want_keys.extend(payload);
        want_keys.sort_unstable();
        assert_eq!(keys, want_keys, "{}", op.name);
        let d = t.description.as_deref().unwrap();
        assert!(d.contains("execute bits"), "{}: {d}", op.name);
        assert!(d.contains("simulated"), "{}: {d}", op.name);
        if let Some(max) = op.max_size_bytes {
            assert!(
                d.contains(&ailab_sandbox_core::catalog::human_bytes(max)),
                "{}: {d}",
                op.name
            );
        }
        for ext in op.extensions {
            assert!(d.contains(ext), "{}: {d}", op.name);
        }
        let ann = t.annotations.as_ref().unwrap();
        assert_eq!(ann.read_only_hint, Some(false));
        if payload == Some("edits") {
            // The cap a call past it is refused for is in the schema.
            assert_eq!(
                props["edits"]["maxItems"],
                ailab_sandbox_core::plan::MAX_EDITS_PER_PLAN,
                "{}",
                op.name
            );
        }
    }
    let read = tools.iter().find(|t| t.name == "read_file").unwrap();
    assert_eq!(read.input_schema["required"], serde_json::json!(["path"]));
    assert_eq!(
        read.annotations.as_ref().unwrap().read_only_hint,
        Some(true)
    );
    let title = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        tool.annotations.as_ref().unwrap().title.clone().unwrap()
    };
    assert_eq!(title("write_json"), "Write JSON");
    assert_eq!(title("write_yaml"), "Write YAML");
    assert_eq!(title("sandbox_transform"), "Sandbox transform");
    for name in ["write_json", "write_yaml"] {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        assert_eq!(
            tool.input_schema["properties"]["data"]["type"],
            serde_json::json!(["object", "array", "string", "number", "boolean"]),
            "{name}: null is refused, so the schema does not offer it"
        );
    }
    let rb = tools.iter().find(|t| t.name == "rollback_action").unwrap();
    assert_eq!(
        rb.input_schema["required"],
        serde_json::json!(["action_id"])
    );
    let state = tools.iter().find(|t| t.name == "get_state").unwrap();
    assert_eq!(state.input_schema["additionalProperties"], false);
    s.finish().await;
}

/// Notifications and responses are never answered, so one sent before the first request
/// is dropped instead of ending the session.
#[tokio::test]
async fn notifications_before_initialize_do_not_end_the_session() {
    let mut s = RawSession::connect(Mode::Default);
    s.send(r#"{"jsonrpc":"2.0","id":77,"result":{}}"#).await;
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#)
        .await;
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    // A request before `initialize` is answered; the notifications after it still wait
    // for `initialize` (rmcp ended the session at one, exit 2).
    s.send(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#).await;
    assert_eq!(s.answer().await["id"], 5);
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    s.send(r#"{"jsonrpc":"2.0","id":78,"result":{}}"#).await;
    s.send(INITIALIZE).await;
    let answer = s.answer().await;
    assert_eq!(answer["id"], 0, "{answer}");
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "ailab-sandbox",
        "{answer}"
    );
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    s.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    let answer = s.answer().await;
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(
        answer["result"]["tools"].as_array().unwrap().len() > 10,
        "{answer}"
    );
    // One page holds every tool and no cursor is ever given: a cursor sent is invalid.
    s.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"nonsense"}}"#)
        .await;
    let answer = s.answer().await;
    assert_eq!(answer["id"], 3, "{answer}");
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'nonsense' was not given by this server"),
        "{answer}"
    );
    s.finish().await;
}

/// Holds the workflow lock of `wf` as another process of the runtime would, until the
/// returned file is dropped.
fn hold_workflow_lock(s: &RawSession, wf: &str) -> std::fs::File {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(s.state.join(format!("locks/wf-{wf}.lock")))
        .unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    lock
}

/// Lets the held calls go, closes the client's input, and checks that the calls 1 to
/// `last` but `cancelled` were each answered once, none with an error, and that the
/// cancelled ones wrote nothing.
async fn release_and_check(s: &mut RawSession, lock: std::fs::File, last: u64, cancelled: &[u64]) {
    use tokio::io::AsyncWriteExt;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(lock);
    s.input.shutdown().await.unwrap();
    let mut ids = Vec::new();
    while let Ok(Some(line)) = s.answers.next_line().await {
        let a: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(a["result"]["isError"], false, "{a}");
        ids.push(a["id"].as_u64().unwrap());
    }
    ids.sort_unstable();
    let expected: Vec<u64> = (1..=last).filter(|id| !cancelled.contains(id)).collect();
    assert_eq!(ids, expected);
    for id in cancelled {
        assert!(!s.root.join(format!("f{id}.txt")).exists(), "f{id}");
    }
}

fn slow_call(id: usize, bytes: usize) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "create_file",
        "arguments": {"path": format!("f{id}.txt"), "content": "x".repeat(bytes), "workflow_id": "wf_slow"}}})
    .to_string()
}

/// A client that sends its calls and closes its end gets every answer, however long the
/// calls wait (here on a workflow lock another process holds past the 5 s rmcp gives
/// calls still running when its input ends): more calls than run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_before_the_input_closes_are_all_answered() {
    use tokio::io::AsyncWriteExt;
    let mut s = RawSession::start(Mode::Write).await;
    let lock = hold_workflow_lock(&s, "wf_slow");
    let calls = ailab_sandbox_mcp::MAX_CONCURRENT_CALLS + 2;
    for id in 1..=calls {
        s.send(&slow_call(id, 10)).await;
    }
    s.input.shutdown().await.unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(6500));
        drop(lock);
    });
    let mut ids = Vec::new();
    for _ in 0..calls {
        let a = s.answer().await;
        assert_eq!(a["result"]["isError"], false, "{a}");
        ids.push(a["id"].as_u64().unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=calls as u64).collect::<Vec<_>>());
    for id in 1..=calls {
        assert!(s.root.join(format!("f{id}.txt")).exists());
    }
    release.join().unwrap();
    s.finish().await;
}

/// While calls wait, the session holds a bounded amount of them (their text, once past
/// those passed on to the SDK) and then reads no further: the client's writes wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_waiting_calls_is_not_read_all_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::AsyncWriteExt;
    let mut s = RawSession::start(Mode::Write).await;
    let lock = hold_workflow_lock(&s, "wf_slow");
    // 70 calls of 512 KiB: more than the calls passed on, those held and the pipes
    // between the client and rmcp take (the last ones are over the workflow's budget of
    // bytes, and answered so).
    let calls = 70;
    let burst: String = (1..=calls)
        .map(|id| slow_call(id, 512 << 10) + "\n")
        .collect();
    let all_sent = AtomicBool::new(false);
    let RawSession { input, answers, .. } = &mut s;
    let send = async {
        input.write_all(burst.as_bytes()).await.unwrap();
        all_sent.store(true, Ordering::SeqCst);
    };
    let serve = async {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert!(
            !all_sent.load(Ordering::SeqCst),
            "the whole burst was read while its calls waited"
        );
        drop(lock);
        for _ in 0..calls {
            let line =
                tokio::time::timeout(std::time::Duration::from_secs(30), answers.next_line())
                    .await
                    .expect("the server answers")
                    .unwrap()
                    .expect("the session is open");
            let a: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert!(a["result"]["isError"].is_boolean(), "{a}");
        }
    };
    tokio::join!(send, serve);
    assert!(all_sent.load(Ordering::SeqCst));
    s.finish().await;
}

/// A call longer than a message may be is answered with its refusal (`size_exceeded`),
/// read no further than its start; the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_too_long_to_read_is_answered() {
    let mut s = RawSession::start(Mode::Write).await;
    let content = "a".repeat(ailab_sandbox_mcp::MAX_MESSAGE_BYTES + 1);
    s.send(&format!(
        r#"{{"jsonrpc":"2.0","id":900,"method":"tools/call","params":{{"name":"create_file","arguments":{{"path":"big.txt","content":"{content}"}}}}}}"#
    ))
    .await;
    drop(content);
    let a = s.answer().await;
    assert_eq!(a["id"], 900, "{a}");
    assert_eq!(a["result"]["isError"], true, "{a}");
    let text = a["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("size_exceeded"), "{text}");
    s.send(r#"{"jsonrpc":"2.0","id":901,"method":"ping"}"#)
        .await;
    assert_eq!(s.answer().await["id"], 901);
    assert!(!s.root.join("big.txt").exists());
    // A forbidden tool named before the cut is on the trail, and answered so.
    let path = "x".repeat(ailab_sandbox_mcp::MAX_MESSAGE_BYTES);
    s.send(&format!(
        r#"{{"jsonrpc":"2.0","id":902,"method":"tools/call","params":{{"name":"delete_file","arguments":{{"path":"{path}"}}}}}}"#
    ))
    .await;
    drop(path);
    let a = s.answer().await;
    assert_eq!(a["id"], 902, "{a}");
    let text = a["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("forbidden_intent"), "{text}");
    let trail = std::fs::read_to_string(s.state.join("sandbox_audit.jsonl")).unwrap();
    assert!(
        trail
            .lines()
            .any(|l| l.contains("\"delete_file\"") && l.contains("forbidden_intent")),
        "{trail}"
    );
    s.finish().await;
}

/// A call rmcp cannot read — not UTF-8, its `params`, `name` or `arguments` of another
/// type — is answered as a refusal (a tool result, `invalid_plan`, naming what is wrong),
/// not dropped unanswered nor answered "method not found"; nothing is written. A request
/// that is not UTF-8 is answered as one without parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_rmcp_cannot_read_are_answered_with_their_refusal() {
    let mut s = RawSession::start(Mode::Write).await;
    let mut not_text =
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_file","arguments":{"path":"u.txt","content":""#
            .to_vec();
    not_text.extend_from_slice(b"\xff\"}}}");
    s.send_bytes(&not_text).await;
    let cases = [
        (
            2,
            r#"{"name":"create_file","arguments":"x"}"#,
            "'arguments' of a tools/call must be an object of the tool's arguments, not a string (\"x\")",
        ),
        (
            3,
            r#"{"name":5}"#,
            "'name' of a tools/call must be a string, the tool's name, not a number (5)",
        ),
        (
            4,
            r#"[1,2]"#,
            "'params' of a tools/call must be an object with the tool's 'name'",
        ),
        (
            5,
            r#"{"arguments":{"path":"v.txt","content":"v"}}"#,
            "has no 'name'",
        ),
        (
            8,
            "null",
            "'params' of a tools/call must be an object with the tool's 'name' (a string) and its 'arguments' (an object), not null",
        ),
        (
            9,
            r#"{"name":null}"#,
            "'name' of a tools/call must be a string, the tool's name, not null",
        ),
        (
            10,
            r#"{"name":"get_state","_meta":5}"#,
            "'_meta' of a request must be an object, not a number (5)",
        ),
        (
            11,
            r#"{"name":"get_state","requestState":5}"#,
            "'requestState' of a tools/call must be a string, not a number (5)",
        ),
        (
            12,
            r#"{"name":"get_state","inputResponses":[1]}"#,
            "'inputResponses' of a tools/call must be an object, not an array ([1])",
        ),
    ];
    for (id, params, _) in &cases {
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#
        ))
        .await;
    }
    s.send(r#"{"jsonrpc":"2.0","id":6,"method":"tools/call"}"#)
        .await;
    s.send_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\",\"params\":{\"x\":\"\xfe\"}}")
        .await;
    // Any request's `_meta` that is not an object: the request goes on without it.
    s.send(r#"{"jsonrpc":"2.0","id":13,"method":"ping","params":{"_meta":5}}"#)
        .await;
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..cases.len() + 4 {
        let a = s.answer().await;
        answers.insert(a["id"].as_u64().unwrap(), a);
    }
    let refused = |a: &serde_json::Value, says: &str| {
        assert!(a.get("error").is_none(), "{a}");
        assert_eq!(a["result"]["isError"], true, "{a}");
        let text = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("invalid_plan") && text.contains(says),
            "{says}: {text}"
        );
    };
    refused(&answers[&1], "the message is not UTF-8 text (byte ");
    for (id, _, says) in &cases {
        refused(&answers[id], says);
    }
    refused(&answers[&6], "a tools/call needs 'params'");
    for id in [7, 13] {
        assert_eq!(
            answers[&id]["result"],
            serde_json::json!({}),
            "{}",
            answers[&id]
        );
    }
    assert!(!s.root.join("u.txt").exists() && !s.root.join("v.txt").exists());
    s.finish().await;
}

/// A call that is not strict JSON (`NaN`, as Python's `json.dumps` writes it, a comma
/// before a closing brace, a raw tab in a string, a line cut short) is answered with its
/// refusal, `invalid_plan` saying how strict JSON differs, where it was dropped
/// unanswered and the client waited for good; nothing is written. A line naming no id
/// before its fault still cannot be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_are_not_strict_json_are_answered_with_their_refusal() {
    let mut s = RawSession::start(Mode::Write).await;
    let call = |id: u32, arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"write_json","arguments":{arguments}}}}}"#
        )
    };
    s.send(&call(1, r#"{"path":"n.json","data":NaN}"#)).await;
    s.send(&call(2, r#"{"path":"n.json","data":[1,2,],}"#))
        .await;
    s.send(&call(3, "{\"path\":\"n.json\",\"data\":\"a\tb\"}"))
        .await;
    s.send(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"write_json","argu"#)
        .await;
    s.send(r#"{"data":NaN,"jsonrpc":"2.0","method":"tools/call"}"#)
        .await;
    // Not UTF-8 either: its id, a byte replaced, would not be the one sent.
    s.send_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\",\"method\":\"tools/call\",\"params\":{\"name\":\"write_json\",\"arguments\":{\"data\":NaN}}}")
        .await;
    s.send(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#).await;
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..5 {
        let a = s.answer().await;
        answers.insert(a["id"].as_u64().unwrap(), a);
    }
    for id in 1..=4 {
        let a = &answers[&id];
        assert_eq!(a["result"]["isError"], true, "{a}");
        let text = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("invalid_plan")
                && text.contains("the message is not valid: ")
                && text.contains("must be strict JSON (RFC 8259): no NaN or Infinity"),
            "{id}: {text}"
        );
    }
    assert_eq!(answers[&5]["result"], serde_json::json!({}));
    assert!(!s.root.join("n.json").exists());
    s.finish().await;
}

/// A forbidden intent or a permission change asked for in a call the screen refuses
/// (arguments of the wrong type, a key given twice: then whichever of its values) is
/// answered with the code its audit line records, as the same plan is over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_tool_in_a_refused_call_is_answered_as_audited() {
    let mut s = RawSession::start(Mode::Write).await;
    let cases = [
        (
            1,
            r#""params":{"name":"delete_file","arguments":[1]}"#,
            "forbidden_intent",
        ),
        (
            2,
            r#""params":{"name":"delete_file","arguments":{"path":"a","path":"b"}}"#,
            "forbidden_intent",
        ),
        (
            3,
            r#""params":{"name":"delete_file","name":"create_file","arguments":{"path":"p3.md","content":"x","workflow_id":"wf_p3"}}"#,
            "forbidden_intent",
        ),
        (
            4,
            r#""params":{"name":"chmod","arguments":{"path":"p4.sh"}},"params":{"name":"create_file","arguments":{"path":"p4.md","content":"x"}}"#,
            "chmod_forbidden",
        ),
        (
            5,
            r#""params":{"name":"create_file","arguments":{"path":"p5.md","content":"x","description":"chmod +x it","description":"fine"}}"#,
            "chmod_forbidden",
        ),
    ];
    // A description past any bound a copy could have (the text is passed on as sent).
    let long = format!(
        r#""params":{{"name":"create_file","arguments":{{"path":"p6.md","content":"x","description":"{} chmod +x it","description":"fine"}}}}"#,
        "x".repeat(200_000)
    );
    let cases = cases
        .into_iter()
        .map(|(id, p, c)| (id, p.to_owned(), c))
        .chain([(6, long, "chmod_forbidden")]);
    for (id, params, code) in cases {
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call",{params}}}"#
        ))
        .await;
        let a = s.answer().await;
        assert_eq!(a["id"], id, "{a}");
        let text = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(code), "{id}: {text}");
    }
    let trail = std::fs::read_to_string(s.state.join("sandbox_audit.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let blocked = |intent: &str, code: &str| {
        lines
            .iter()
            .filter(|l| l["mutation_type"] == intent && l["reason_code"] == code)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        blocked("delete_file", "forbidden_intent").len(),
        3,
        "{trail}"
    );
    // Recorded under the workflow and path the call named.
    assert!(
        blocked("delete_file", "forbidden_intent")
            .iter()
            .any(|l| l["workflow_id"] == "wf_p3" && l.to_string().contains("p3.md")),
        "{trail}"
    );
    assert_eq!(blocked("chmod", "chmod_forbidden").len(), 1, "{trail}");
    assert_eq!(
        blocked("create_file", "chmod_forbidden").len(),
        2,
        "{trail}"
    );
    for f in ["p3.md", "p4.sh", "p4.md", "p5.md", "p6.md"] {
        assert!(!s.root.join(f).exists(), "{f}");
    }
    s.finish().await;
}

/// A call rmcp answers itself (its `jsonrpc` is not "2.0") never reaches the handler: the
/// session does not wait for it for good, neither for more input nor at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_the_handler_never_sees_do_not_hold_the_session() {
    use tokio::io::AsyncWriteExt;
    let mut s = RawSession::start(Mode::Write).await;
    for id in 1..=ailab_sandbox_mcp::MAX_CONCURRENT_CALLS * 3 {
        s.send(&format!(
            r#"{{"jsonrpc":"1.0","id":{id},"method":"tools/call","params":{{"name":"get_state"}}}}"#
        ))
        .await;
        assert!(s.answer().await.get("error").is_some());
    }
    s.send(&slow_call(100, 1)).await;
    let a = s.answer().await;
    assert_eq!(a["id"], 100, "{a}");
    s.input.shutdown().await.unwrap();
    s.finish().await;
}

/// Calls still held by the session (more than it passes on at once) do not hold up other
/// messages, and are cancelled before they run, the cancellation read at once: nothing
/// written, no answer; the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_calls_are_cancelled_before_they_run() {
    let mut s = RawSession::start(Mode::Write).await;
    let lock = hold_workflow_lock(&s, "wf_slow");
    for id in 1..=20 {
        s.send(&slow_call(id, 10)).await;
    }
    // Other messages go through while calls are held: a ping is answered at once.
    s.send(r#"{"jsonrpc":"2.0","id":99,"method":"ping"}"#).await;
    assert_eq!(s.answer().await["id"], 99);
    // 16 were passed on to the SDK (8 of them run, in no set order); 18 and 19 are still
    // held by the session.
    for id in [18, 19] {
        s.send(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
        ))
        .await;
    }
    release_and_check(&mut s, lock, 20, &[18, 19]).await;
    assert!(s.root.join("f20.txt").exists());
}

/// A client of the protocol without `initialize` (each request names the version in its
/// `_meta`, here one over 64 KiB) is paced the same: its held calls are cancelled before
/// they run, and a cancellation the SDK would not take (a `reason` that is not a string)
/// or the screen does not pass on (a number that would change) still keeps a held call
/// from running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_calls_of_a_session_without_initialize_are_cancelled_too() {
    let mut s = RawSession::connect(Mode::Write);
    let lock = hold_workflow_lock(&s, "wf_slow");
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "pad": "p".repeat(70_000)
    });
    for id in 1..=20 {
        let mut call: serde_json::Value = serde_json::from_str(&slow_call(id, 10)).unwrap();
        call["params"]["_meta"] = meta.clone();
        s.send(&call.to_string()).await;
    }
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":17,"_meta":{"t":0.10000000000000000000001}}}"#)
        .await;
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":18}}"#)
        .await;
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":19,"reason":5}}"#)
        .await;
    release_and_check(&mut s, lock, 20, &[17, 18, 19]).await;
}

/// Ids are compared as the SDK reads them: a held call `100` is cancelled by a
/// cancellation naming `100.0`, and an `initialize` whose id is `1.0` is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_number_ids_written_as_floats_name_the_same_request() {
    let mut s = RawSession::connect(Mode::Write);
    s.send(&INITIALIZE.replace(r#""id":0"#, r#""id":1.0"#))
        .await;
    assert_eq!(s.answer().await["id"], 1);
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    let lock = hold_workflow_lock(&s, "wf_slow");
    for id in 1..=16 {
        s.send(&slow_call(id, 10)).await;
    }
    s.send(&slow_call(100, 10)).await;
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":100.0}}"#)
        .await;
    release_and_check(&mut s, lock, 16, &[]).await;
    assert!(!s.root.join("f100.txt").exists());
}

/// A session opened without `initialize` by a call whose `_meta` is too large to copy,
/// and whose arguments the screen refuses, gets that refusal (the version goes along),
/// and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_opening_call_with_a_large_meta_keeps_the_session() {
    let mut s = RawSession::connect(Mode::Write);
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "pad": "p".repeat(70_000)
    });
    let refused = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write_json","arguments":{{"path":"a.json","data":12345678901234567890123}},"_meta":{meta}}}}}"#
    );
    s.send(&refused).await;
    let a = s.answer().await;
    assert_eq!(a["id"], 1, "{a}");
    assert_eq!(a["result"]["isError"], true, "{a}");
    assert!(
        a["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("invalid_plan"),
        "{a}"
    );
    s.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":77}}"#)
        .await;
    let mut call: serde_json::Value = serde_json::from_str(&slow_call(2, 1)).unwrap();
    call["params"]["_meta"] = meta;
    s.send(&call.to_string()).await;
    let a = s.answer().await;
    assert_eq!(a["id"], 2, "{a}");
    assert_eq!(a["result"]["isError"], false, "{a}");
    s.finish().await;
}

/// What the SDK will not take does not open the session for the screen either: an
/// `initialize` with an id past i64, an opening call refused with capabilities too large
/// to copy, an `initialize` refused by the screen; a notification after them is dropped
/// and the session opens as usual afterwards.
#[tokio::test]
async fn what_the_sdk_will_not_open_a_session_with_leaves_it_waiting() {
    let refused_initialize = INITIALIZE
        .replace(
            r#""capabilities":{}"#,
            r#""capabilities":{"experimental":{"x":{"n":0.1000000000000000000001}}}"#,
        )
        .replace(r#""id":0"#, r#""id":9"#);
    let big_caps = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"experimental":{{"x":{{"pad":"{}"}}}}}}}},"name":"read_file","arguments":{{"path":"a.md","path":"b.md"}}}}}}"#,
        "A".repeat(70_000)
    );
    let bad_params = [
        r#""clientInfo":{"name":"raw","version":"0"}"#,
        r#""clientInfo":{"name":"raw"}"#,
        r#""capabilities":null"#,
        r#""protocolVersion":5"#,
    ];
    let mut firsts = vec![
        INITIALIZE.replace(r#""id":0"#, r#""id":9223372036854775808"#),
        big_caps,
        refused_initialize,
        r#"{"jsonrpc":"2.0","id":9,"method":"initialize"}"#.to_owned(),
    ];
    // Parameters the SDK cannot take: without clientInfo, its version, with capabilities
    // null, a version that is no string.
    firsts.extend(bad_params.iter().enumerate().map(|(i, p)| {
        let bad = match i {
            0 => INITIALIZE.replace(&format!(",{p}"), ""),
            1 => INITIALIZE.replace(bad_params[0], p),
            2 => INITIALIZE.replace(r#""capabilities":{}"#, p),
            _ => INITIALIZE.replace(r#""protocolVersion":"2025-06-18""#, p),
        };
        assert_ne!(bad, INITIALIZE);
        bad.replace(r#""id":0"#, r#""id":9"#)
    }));
    for first in firsts {
        let mut s = RawSession::connect(Mode::Default);
        s.send(&first).await;
        s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        s.send(INITIALIZE).await;
        // Whatever the SDK answered the first one, the session opens now.
        loop {
            let a = s.answer().await;
            if a["id"] == 0 {
                assert!(a.get("result").is_some(), "{a}");
                break;
            }
        }
        s.finish().await;
    }
}

/// A session asked to stop (as `mcp` is by SIGTERM or SIGINT, which killed it with a
/// write half done) reads nothing more, and ends cleanly once what it read is answered,
/// the client's input still open: a call sent after the stop is not run, and one only
/// partly read when it came is dropped unanswered (it was answered `invalid_plan`, "the
/// text ends inside a string", as a last line without a newline at the input's end).
#[tokio::test]
async fn a_session_asked_to_stop_answers_what_it_read_and_ends() {
    let mut s = RawSession::start(Mode::Write).await;
    let call = |id: u32, path: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_file","arguments":{{"path":"{path}","content":"x"}}}}}}"#
        )
    };
    s.send(&call(1, "a.txt")).await;
    let a = s.answer().await;
    assert_eq!(a["id"], 1);
    assert_eq!(a["result"]["isError"], false, "{a}");
    let third = call(3, "c.txt");
    let (head, tail) = third.split_at(third.len() - 8);
    tokio::io::AsyncWriteExt::write_all(&mut s.input, head.as_bytes())
        .await
        .unwrap();
    // Read by the session (its input is a pipe in memory) before the stop.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    s.server.stop();
    s.send(tail).await;
    s.send(&call(2, "b.txt")).await;
    s.ends_while_open().await;
    assert_eq!(std::fs::read(s.root.join("a.txt")).unwrap(), b"x");
    assert!(
        !s.root.join("b.txt").exists(),
        "read after the stop: not run"
    );
    assert!(
        !s.root.join("c.txt").exists(),
        "cut off by the stop: not run"
    );
}
