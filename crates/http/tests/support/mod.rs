//! Shared helpers: a sandbox in a temporary directory, requests, raw HTTP/1.1.

use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::{Config, Sandbox};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tower::ServiceExt;

pub const TOKEN: &str = "test-token-0123456789abcdef";

/// A sandbox with one root and a state directory, both in a temporary directory.
pub struct Env {
    pub tmp: TempDir,
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub sandbox: Arc<Sandbox>,
    pub app: Router,
}

pub struct Opts {
    pub write: bool,
    pub token: Option<&'static str>,
    pub body_limit: usize,
    /// `strict` durability (else `relaxed`).
    pub strict: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            write: false,
            token: None,
            body_limit: ailab_sandbox_http::DEFAULT_BODY_LIMIT,
            strict: false,
        }
    }
}

pub fn config(tmp: &TempDir, write: bool) -> Config {
    let root = tmp.path().join("root");
    let state_dir = tmp.path().join("state");
    let mut config = Config::with_roots(vec![root], state_dir);
    config.enable_write = write;
    config.dry_run = !write;
    config.durability = Durability::Relaxed;
    config
}

pub fn env_with(o: Opts) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(&tmp, o.write);
    if o.strict {
        config.durability = Durability::Strict;
    }
    let sandbox = Arc::new(Sandbox::open(config).unwrap());
    let app = ailab_sandbox_http::router(sandbox.clone(), o.token.map(str::to_owned), o.body_limit);
    Env {
        root: tmp.path().join("root"),
        state_dir: tmp.path().join("state"),
        tmp,
        sandbox,
        app,
    }
}

/// Writing enabled, dry-run off, no token.
pub fn writable() -> Env {
    env_with(Opts {
        write: true,
        ..Opts::default()
    })
}

/// Secure defaults (simulation), no token.
pub fn simulating() -> Env {
    env_with(Opts::default())
}

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an error answer: status, JSON content type, the code and a non-empty reason.
    pub fn assert_error(&self, status: StatusCode, code: &str) -> Value {
        assert_eq!(self.status, status, "body: {}", self.text());
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            ct.as_deref(),
            Some("application/json"),
            "body: {}",
            self.text()
        );
        let v = self.json();
        assert_eq!(v["reason_code"], code, "body: {v}");
        assert!(
            v["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "body: {v}"
        );
        v
    }
}

/// Sends `req` as a client would: with `Host: localhost` unless the test names one.
pub async fn send(app: &Router, mut req: Request<Body>) -> Resp {
    if !req.headers().contains_key(axum::http::header::HOST) {
        req.headers_mut().insert(
            axum::http::header::HOST,
            axum::http::HeaderValue::from_static("localhost"),
        );
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap()
        .to_vec();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub fn request(method: Method, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri)
}

pub async fn get(app: &Router, uri: &str) -> Resp {
    send(app, request(Method::GET, uri).body(Body::empty()).unwrap()).await
}

pub async fn get_auth(app: &Router, uri: &str, token: &str) -> Resp {
    let req = request(Method::GET, uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    send(app, req).await
}

pub async fn post(app: &Router, uri: &str, body: impl Into<Body>) -> Resp {
    let req = request(Method::POST, uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap();
    send(app, req).await
}

pub async fn post_json(app: &Router, uri: &str, v: &Value) -> Resp {
    post(app, uri, serde_json::to_vec(v).unwrap()).await
}

/// A one-action plan creating `path` with `content`.
pub fn create_plan(workflow_id: &str, path: &str, content: &str) -> Value {
    serde_json::json!({
        "workflow_id": workflow_id,
        "actions": [ { "action_id": "a1", "intent": "create_file", "path": path, "content": content } ]
    })
}

/// One raw HTTP/1.1 exchange on a new connection (`Connection: close`): status, head, body.
pub fn raw_http(addr: SocketAddr, request: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    parse_response(&out)
}

pub fn parse_response(out: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, head.to_owned(), body.to_owned())
}

/// A writable sandbox waiting `lock_wait_seconds` for a lock, its router, and the lock
/// of workflow `wf_held` taken as another process running it would hold it (until the
/// file is dropped or unlocked).
pub fn workflow_held(lock_wait_seconds: u64) -> (tempfile::TempDir, axum::Router, std::fs::File) {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(&tmp, true);
    config.limits.lock_wait_seconds = lock_wait_seconds;
    let sandbox = std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config).unwrap());
    let app = ailab_sandbox_http::router(sandbox, None, ailab_sandbox_http::DEFAULT_BODY_LIMIT);
    let held = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(tmp.path().join("state/locks/wf-wf_held.lock"))
        .unwrap();
    held.lock().unwrap();
    (tmp, app, held)
}
