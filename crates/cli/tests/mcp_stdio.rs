//! `ailab-sandbox mcp` as an agent client runs it: a child process spoken to in
//! newline-delimited JSON-RPC over its standard input and output.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types
)]

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// `mcp` writing in `root`, its state in `state`, spoken to through pipes; no setting
/// from the environment. (The test launches the binary under test; nothing in the
/// runtime spawns processes.)
fn mcp_command(root: &std::path::Path, state: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ailab-sandbox"));
    c.env_remove("AI_LAB_SANDBOX_ROOTS")
        .env_remove("AI_LAB_STATE_DIR")
        .env_remove("AI_LAB_ENABLE_SANDBOX_WRITE")
        .env_remove("AI_LAB_SANDBOX_DRY_RUN")
        .env_remove("AI_LAB_SANDBOX_CONFIG")
        .arg("--root")
        .arg(root)
        .arg("--state-dir")
        .arg(state)
        .args(["--enable-write", "--no-dry-run"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c
}

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Server {
    fn start(root: &std::path::Path, state: &std::path::Path) -> Self {
        let mut child = mcp_command(root, state).arg("mcp").spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and returns its response; every stdout line must be JSON-RPC.
    fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let line = self
                .lines
                .recv_timeout(TIMEOUT)
                .expect("no response from the server");
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            assert_eq!(msg["jsonrpc"], "2.0", "{line}");
            if msg["id"] == json!(id) {
                assert!(msg.get("error").is_none(), "{method} failed: {line}");
                return msg["result"].clone();
            }
        }
    }

    fn call(&mut self, id: u64, tool: &str, args: Value) -> Value {
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))
    }

    /// Closes stdin and waits for a clean exit.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "mcp exited with {status}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "mcp did not exit on stdin EOF"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn mcp_over_stdio_writes_and_rolls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    let mut s = Server::start(&root, &state);

    let init = s.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "mcp-stdio-test", "version": "0"}}),
    );
    assert_eq!(init["serverInfo"]["name"], "ailab-sandbox");
    assert_eq!(init["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let list = s.request(2, "tools/list", json!({}));
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 19, "{names:?}");
    for n in [
        "create_file",
        "sandbox_transform",
        "read_file",
        "rollback_workflow",
        "get_state",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }

    let r = s.call(
        3,
        "create_file",
        json!({"path": "notes/hello.md", "content": "# Hi\n"}),
    );
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        std::fs::read(root.join("notes/hello.md")).unwrap(),
        b"# Hi\n"
    );
    assert!(text(&r).contains("rollback_action"), "{r}");

    let r = s.call(
        4,
        "create_file",
        json!({"path": "../escape.md", "content": "x"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).contains("path_traversal"), "{r}");

    let r = s.call(5, "rollback_workflow", json!({}));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["steps_rolled_back"], 1, "{r}");
    assert!(!root.join("notes/hello.md").exists());

    s.finish();
}

/// The operator's log (standard error, at the default level) says what the server does,
/// not the MCP SDK's Rust values (`peer_info=Some(InitializeRequestParams { ... })`).
#[test]
fn the_default_log_holds_no_sdk_values() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = mcp_command(&tmp.path().join("root"), &tmp.path().join("state"))
        .env_remove("AI_LAB_SANDBOX_LOG")
        .arg("mcp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hello = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{hello}").unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("MCP server listening"), "{log}");
    assert!(
        !log.contains("peer_info") && !log.contains("Some("),
        "{log}"
    );
}

/// A client killed while its calls wait (here on its workflow's lock, which another
/// process holds) is written for no more: the calls not started when its end of the
/// output closed are not run, and the server ends once those under way give up. They
/// were run in turn, each turn waiting out the lock, and wrote once it was free.
#[test]
fn calls_not_started_when_the_client_is_gone_are_not_run() {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let (root, state) = (tmp.path().join("root"), tmp.path().join("state"));
    let config = tmp.path().join("c.toml");
    std::fs::write(
        &config,
        "[limits]\nlock_wait_seconds = 2\nwrites_per_minute = 1000\n",
    )
    .unwrap();
    let mut child = mcp_command(&root, &state)
        .arg("--config")
        .arg(&config)
        .arg("mcp")
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    for msg in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "get_state", "arguments": {}}}),
    ] {
        writeln!(stdin, "{msg}").unwrap();
    }
    let workflow = loop {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "no answer");
        if let Some(at) = line.find("wf_mcp_") {
            break line[at..at + 39].to_owned();
        }
    };
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(state.join(format!("locks/wf-{workflow}.lock")))
        .unwrap();
    lock.lock().unwrap();
    for id in 10..34 {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "create_file", "arguments": {"path": format!("k/f{id}.txt"), "content": "x"}}});
        writeln!(stdin, "{call}").unwrap();
    }
    stdin.flush().unwrap();
    // The server has read the calls; then the client is gone, while the lock is held
    // past the wait of the calls under way.
    std::thread::sleep(Duration::from_millis(500));
    drop(stdout);
    drop(stdin);
    std::thread::sleep(Duration::from_secs(3));
    lock.unlock().unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "mcp did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!root.join("k").exists(), "a call was run for a client gone");
    let trail = std::fs::read_to_string(state.join("sandbox_audit.jsonl")).unwrap();
    assert!(!trail.contains(r#""status":"success""#), "{trail}");
}

/// A client that stops reading standard output but keeps its input open is gone all the
/// same: the session ends by itself (it waited for input that would never come).
#[test]
fn a_client_that_stops_reading_ends_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, stdin, stdout) = initialized(tmp.path());
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    assert!(stdout.read_line(&mut line).unwrap() > 0, "no answer");
    drop(stdout);
    let status = exited(&mut child, "mcp still runs for a client that reads nothing");
    assert!(status.success(), "{status}");
    drop(stdin);
}

/// `mcp` writing in `dir`, sent `initialize` (id 0) and `notifications/initialized`;
/// its input and output.
fn initialized(dir: &std::path::Path) -> (Child, ChildStdin, std::process::ChildStdout) {
    let mut child = mcp_command(&dir.join("root"), &dir.join("state"))
        .arg("mcp")
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(stdin, "{hello}").unwrap();
    let ready = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    writeln!(stdin, "{ready}").unwrap();
    (child, stdin, stdout)
}

/// How `child` exited, within [`TIMEOUT`]; `why` names what it failed to do otherwise.
fn exited(child: &mut Child, why: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client that closes its input and reads its answers only later, after the few
/// seconds the SDK gives answers still on their way once the input ends, gets every one
/// of them, and the process then ends cleanly. Standard output takes each answer at
/// once; only its flush waits for the client.
#[test]
fn a_client_that_reads_late_after_closing_its_input_gets_every_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, stdout) = initialized(tmp.path());
    // Answers of some 25 KB each: far more than a pipe holds.
    let requests = 150;
    for id in 1..=requests {
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
        )
        .unwrap();
    }
    drop(stdin);
    // Longer than it takes requests to be let go of three times over (5 s each), had
    // they not been held back, and than the SDK's drain after them.
    std::thread::sleep(Duration::from_secs(17));
    // In any order: each is answered from a task of its own.
    let mut ids: Vec<u64> = BufReader::new(stdout)
        .lines()
        .map(|l| {
            let v = serde_json::from_str::<Value>(&l.unwrap()).unwrap();
            assert!(v["result"].is_object(), "{v}");
            v["id"].as_u64().unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..=requests).collect::<Vec<u64>>());
    let status = exited(&mut child, "mcp did not end");
    assert!(status.success(), "{status}");
}
