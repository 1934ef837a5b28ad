//! A sandbox in temporary directories and an rmcp client connected to the server.

use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::{Config, Sandbox};
use ailab_sandbox_mcp::{McpError, SandboxMcp, serve_io};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// A running session: client, server task, and the directories it works in.
pub struct Session {
    pub client: RunningService<RoleClient, ()>,
    pub workflow_id: String,
    pub root: PathBuf,
    server: JoinHandle<Result<(), McpError>>,
    _root_dir: tempfile::TempDir,
    pub state_dir: tempfile::TempDir,
}

/// Whether writes are real.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `enable_write = true`, `dry_run = false`.
    Write,
    /// The secure defaults: writing disabled, dry-run on.
    Default,
}

/// A sandbox over temporary directories: the sandbox, its root, and the directories
/// (removed when dropped).
pub fn open_sandbox(mode: Mode) -> (Arc<Sandbox>, PathBuf, [tempfile::TempDir; 2]) {
    open_sandbox_with(mode, |_| {})
}

/// [`open_sandbox`], with the configuration changed by `tweak` last.
pub fn open_sandbox_with(
    mode: Mode,
    tweak: impl FnOnce(&mut Config),
) -> (Arc<Sandbox>, PathBuf, [tempfile::TempDir; 2]) {
    let root_dir = tempfile::tempdir().unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    let root = root_dir.path().join("sandbox");
    let mut config = Config::with_roots(vec![root.clone()], state_dir.path().join("state"));
    if mode == Mode::Write {
        config.enable_write = true;
        config.dry_run = false;
    }
    // The suite makes more than 10 writes a minute in one workflow.
    config.limits.writes_per_minute = 1000;
    config.durability = Durability::Relaxed;
    tweak(&mut config);
    let sandbox = Arc::new(Sandbox::open(config).unwrap());
    (sandbox, root, [root_dir, state_dir])
}

impl Session {
    pub async fn start(mode: Mode) -> Self {
        Self::start_with(mode, |_| {}).await
    }

    /// A session whose configuration `tweak` changes last.
    pub async fn start_with(mode: Mode, tweak: impl FnOnce(&mut Config)) -> Self {
        let (sandbox, root, [root_dir, state_dir]) = open_sandbox_with(mode, tweak);
        let server = SandboxMcp::new(sandbox);
        let workflow_id = server.workflow_id().to_owned();
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(server_io);
        let server = tokio::spawn(serve_io(server, r, w));
        let client = ().serve(client_io).await.unwrap();
        Self {
            client,
            workflow_id,
            root,
            server,
            _root_dir: root_dir,
            state_dir,
        }
    }

    /// Calls a tool; the protocol call itself must succeed (refusals are results).
    pub async fn call(&self, name: &str, args: Value) -> CallToolResult {
        let Value::Object(map) = args else {
            panic!("arguments must be an object")
        };
        self.call_raw(name, map).await
    }

    pub async fn call_raw(&self, name: &str, args: JsonObject) -> CallToolResult {
        self.client
            .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(args))
            .await
            .unwrap_or_else(|e| panic!("tools/call {name} failed at the protocol level: {e}"))
    }

    /// Calls a tool that must succeed.
    pub async fn ok(&self, name: &str, args: Value) -> CallToolResult {
        let r = self.call(name, args).await;
        assert_eq!(r.is_error, Some(false), "{name} failed: {}", text(&r));
        r
    }

    /// Calls a tool that must come back with `isError: true`.
    pub async fn err(&self, name: &str, args: Value) -> CallToolResult {
        let r = self.call(name, args).await;
        assert_eq!(
            r.is_error,
            Some(true),
            "{name} unexpectedly succeeded: {}",
            text(&r)
        );
        r
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// Closes the client and checks that the server ended cleanly.
    pub async fn finish(self) {
        self.client.cancel().await.unwrap();
        let served = tokio::time::timeout(std::time::Duration::from_secs(10), self.server)
            .await
            .expect("the server did not stop after the client left")
            .unwrap();
        served.unwrap();
    }
}

/// The text of a result's first content block.
pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The structured content.
pub fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

/// SHA-256 hex of a file's bytes.
pub fn sha256_of(path: &Path) -> String {
    ailab_sandbox_core::hash::sha256_hex(&std::fs::read(path).unwrap())
}

/// A session driven by raw JSON lines, for what a client library would not send: the
/// client's end of the pipe, its answers, and the server task.
pub struct RawSession {
    pub input: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    pub answers:
        tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    pub root: PathBuf,
    pub state: PathBuf,
    /// The session's server, to stop it ([`SandboxMcp::stop`]).
    pub server: SandboxMcp,
    served: JoinHandle<Result<(), McpError>>,
    _dirs: [tempfile::TempDir; 2],
}

/// The `initialize` request a raw session opens with.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

impl RawSession {
    /// A server over a fresh sandbox, nothing sent yet.
    pub fn connect(mode: Mode) -> Self {
        use tokio::io::AsyncBufReadExt;
        let (sandbox, root, dirs) = open_sandbox(mode);
        let state = sandbox.state_dir().to_path_buf();
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(server_io);
        let server = SandboxMcp::new(sandbox);
        let served = tokio::spawn(serve_io(server.clone(), r, w));
        let (cr, input) = tokio::io::split(client_io);
        Self {
            input,
            answers: tokio::io::BufReader::new(cr).lines(),
            root,
            state,
            server,
            served,
            _dirs: dirs,
        }
    }

    /// [`RawSession::connect`], then `initialize` answered and `initialized` sent.
    pub async fn start(mode: Mode) -> Self {
        let mut s = Self::connect(mode);
        s.send(INITIALIZE).await;
        assert_eq!(s.answer().await["id"], 0);
        s.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        s
    }

    /// Sends one message (a newline is added).
    pub async fn send(&mut self, line: &str) {
        self.send_bytes(line.as_bytes()).await;
    }

    /// Sends one message as bytes, UTF-8 or not (a newline is added).
    pub async fn send_bytes(&mut self, line: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.input.write_all(line).await.unwrap();
        self.input.write_all(b"\n").await.unwrap();
    }

    /// The next message the server sends (30 s at most).
    pub async fn answer(&mut self) -> Value {
        let line =
            tokio::time::timeout(std::time::Duration::from_secs(30), self.answers.next_line())
                .await
                .expect("the server answers")
                .unwrap()
                .expect("the session is open");
        serde_json::from_str(&line).unwrap()
    }

    /// The session must end cleanly on its own, the client's input still open; then
    /// no more answers come.
    pub async fn ends_while_open(&mut self) {
        tokio::time::timeout(std::time::Duration::from_secs(10), &mut self.served)
            .await
            .expect("the session ends")
            .unwrap()
            .unwrap();
        let more = self.answers.next_line().await.unwrap();
        assert_eq!(more, None, "nothing more is answered");
    }

    /// Closes the client's end; the session must end cleanly.
    pub async fn finish(self) {
        drop((self.input, self.answers));
        tokio::time::timeout(std::time::Duration::from_secs(10), self.served)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
