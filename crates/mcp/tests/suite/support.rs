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
    _state_dir: tempfile::TempDir,
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
            _state_dir: state_dir,
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
