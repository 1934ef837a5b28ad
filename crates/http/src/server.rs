//! Listening: address checks, the Tokio runtime, graceful shutdown.
//!
//! `serve` runs its own accept loop over hyper's HTTP/1 connection builder, since axum's
//! `serve` has no time-outs: at most `MAX_CONNECTIONS` (256) connections at once, each
//! closed when its request headers take more than 30 s, when it idles that long, or when an
//! answer makes no progress for 30 s (`StallGuard`: the client reads nothing), so silent or
//! deaf clients cannot hold the server's descriptors.

use ailab_sandbox_core::Sandbox;
use ailab_sandbox_core::config::DEFAULT_ADDR;
use axum::Router;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

use crate::DEFAULT_BODY_LIMIT;

/// How long in-flight requests may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Most threads the blocking pool (the synchronous sandbox calls) may use; plans and
/// rollbacks run on 48 of them at most, reads of the logs on 12 (see
/// [`crate::router_for_pool`]).
pub const MAX_BLOCKING_THREADS: usize = 64;

/// Most connections served at once; further clients wait in the listen backlog until one
/// closes. Each holds a descriptor, and the runtime needs its own for its logs and locks.
pub const MAX_CONNECTIONS: usize = 256;

/// Most connections one remote address may hold at once, so that one host cannot take
/// every place of a server that serves others (a server bound beyond loopback, with a
/// token). Loopback callers are not counted apart: they all share one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = MAX_CONNECTIONS / 4;

/// How long a connection may take to send a request's headers, and how long a kept-alive
/// connection may stay idle between requests, before it is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an answer may wait for the client to read any of it before the connection
/// is closed: a client that sends requests and never reads the answers would otherwise
/// hold its connection, and its place among [`MAX_CONNECTIONS`], for good.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a client's connections may hold: without these bounds, a local client that opens
/// connections and sends nothing, or reads nothing, would hold the server's descriptors
/// for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections served at once (at least 1; default [`MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Connections one remote, non-loopback address may hold at once (at least 1;
    /// default [`MAX_CONNECTIONS_PER_PEER`]); one more is closed at once.
    pub max_per_peer: usize,
    /// See [`HEADER_READ_TIMEOUT`] (the default).
    pub header_read_timeout: Duration,
    /// See [`WRITE_STALL_TIMEOUT`] (the default).
    pub write_stall_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            max_per_peer: MAX_CONNECTIONS_PER_PEER,
            header_read_timeout: HEADER_READ_TIMEOUT,
            write_stall_timeout: WRITE_STALL_TIMEOUT,
        }
    }
}

/// A connection whose writes fail once they have made no progress for `limit`: the
/// client has stopped reading. Any progress starts the wait anew, so a slow reader is
/// served.
struct StallGuard<S> {
    io: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> StallGuard<S> {
    fn new(io: S, limit: Duration) -> Self {
        Self {
            io,
            limit,
            stalled: None,
        }
    }

    /// Passes a write's outcome on, failing it when it has waited too long.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing of the answer for {limit:?}"),
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

/// How to serve.
#[derive(Clone)]
pub struct ServeOptions {
    /// `host:port` to listen on (default `127.0.0.1:8787`).
    pub addr: String,
    /// Bearer token every route then needs.
    pub token: Option<String>,
    /// Largest request body, in bytes (default 64 MiB).
    pub body_limit_bytes: usize,
    /// Bounds on connections.
    pub limits: ConnLimits,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            addr: DEFAULT_ADDR.to_owned(),
            token: None,
            body_limit_bytes: DEFAULT_BODY_LIMIT,
            limits: ConnLimits::default(),
        }
    }
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("body_limit_bytes", &self.body_limit_bytes)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is not `host:port` or does not resolve.
    #[error("invalid listen address '{addr}': {reason}")]
    InvalidAddr {
        /// The address given.
        addr: String,
        /// Why.
        reason: String,
    },
    /// A non-loopback address without a token.
    #[error(
        "refusing to listen on {addr}: {} is not a loopback address and no token is set; \
         set a token (AI_LAB_SANDBOX_TOKEN, [server] token in the config file, or --token) or listen on 127.0.0.1",
        .resolved.ip()
    )]
    PublicWithoutToken {
        /// The address given.
        addr: String,
        /// The non-loopback address it resolved to.
        resolved: SocketAddr,
    },
    /// The token is empty.
    #[error("the token is empty{TOKEN_SOURCES}; set a long random token or none")]
    EmptyToken,
    /// The token is too short to resist guessing.
    #[error(
        "the token is shorter than {MIN_TOKEN_LEN} bytes{TOKEN_SOURCES}; use a long \
         random token (for example 32 hexadecimal digits)"
    )]
    ShortToken,
    /// The token could never match: HTTP drops white space at the ends of a header
    /// value, and a header cannot carry a control character.
    #[error(
        "the token begins or ends with white space, or holds a control character, which an \
         Authorization header cannot carry{TOKEN_SOURCES}; no request could ever match it: \
         give it without them"
    )]
    UnsendableToken,
    /// The body limit is outside what the config allows.
    #[error(
        "the request body limit of {0} bytes is out of range; allowed {min} to {max} bytes",
        min = ailab_sandbox_core::config::MIN_BODY_BYTES_LIMIT,
        max = ailab_sandbox_core::config::MAX_BODY_BYTES_LIMIT
    )]
    BodyLimitOutOfRange(usize),
    /// Tokio could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Binding failed.
    #[error("cannot listen on {addr}: {error}{}", bind_advice(error))]
    Bind {
        /// The address given.
        addr: String,
        /// Why.
        error: std::io::Error,
    },
}

impl ServeError {
    /// The stable code every face gives it: `invalid_config` for a setting to correct,
    /// `io_error` for a failure of the machine.
    pub fn reason_code(&self) -> &'static str {
        match self {
            Self::InvalidAddr { .. }
            | Self::PublicWithoutToken { .. }
            | Self::EmptyToken
            | Self::ShortToken
            | Self::UnsendableToken
            | Self::BodyLimitOutOfRange(_) => ailab_sandbox_core::INVALID_CONFIG,
            Self::Runtime(_) | Self::Bind { .. } => {
                ailab_sandbox_core::ReasonCode::IoError.as_str()
            }
        }
    }
}

fn bind_advice(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another program holds this port: stop it or give another address (--addr)"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "; no interface of this machine has that address: give one of its own (--addr)"
        }
        _ => "",
    }
}

/// Where a token comes from, for the refusals of a bad one: an empty
/// `AI_LAB_SANDBOX_TOKEN` left in the environment is the usual surprise.
const TOKEN_SOURCES: &str = " (it is taken from --token, else AI_LAB_SANDBOX_TOKEN, else [server] token in the config file: check each)";

/// The shortest token `serve` accepts, in bytes (a random token is ASCII).
pub const MIN_TOKEN_LEN: usize = 16;

/// Resolves `host:port` (an IP literal or a name such as `localhost`).
pub fn resolve_addr(addr: &str) -> Result<Vec<SocketAddr>, ServeError> {
    let invalid = |reason: String| ServeError::InvalidAddr {
        addr: addr.to_owned(),
        reason,
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| invalid(format!("{e}; use host:port such as 127.0.0.1:8787")))?
        .collect();
    if addrs.is_empty() {
        return Err(invalid("it resolves to no address".to_owned()));
    }
    Ok(addrs)
}

/// Refuses to expose the runtime beyond loopback without a token (SPEC §12.6), and an
/// empty token.
pub fn check_exposure(
    addr: &str,
    resolved: &[SocketAddr],
    token: Option<&str>,
) -> Result<(), ServeError> {
    match token {
        Some("") => Err(ServeError::EmptyToken),
        Some(t) if t.len() < MIN_TOKEN_LEN => Err(ServeError::ShortToken),
        Some(t) if t.trim() != t || t.chars().any(char::is_control) => {
            Err(ServeError::UnsendableToken)
        }
        Some(_) => Ok(()),
        None => match resolved
            .iter()
            .find(|a| !a.ip().to_canonical().is_loopback())
        {
            Some(public) => Err(ServeError::PublicWithoutToken {
                addr: addr.to_owned(),
                resolved: *public,
            }),
            None => Ok(()),
        },
    }
}

/// Serves until SIGINT or SIGTERM, then lets in-flight requests finish (for at most 30 s)
/// and returns. Builds its own multi-thread Tokio runtime; refuses a non-loopback address
/// without a token. Logs one line per request with `tracing`.
///
/// For a program of its own, as the `ailab-sandbox` binary is: it takes SIGINT and
/// SIGTERM over for the rest of the process's life (Tokio's handlers are never removed),
/// so that after it returns neither ends the process any more. A host that stops the
/// server itself, or keeps its own signal handling, serves with [`serve`] or
/// [`serve_with`] and a shutdown future of its own.
pub fn run(sandbox: Arc<Sandbox>, opts: ServeOptions) -> Result<(), ServeError> {
    run_announcing(sandbox, opts, |_| {})
}

/// [`run`], calling `listening` with the bound address (the real port when `addr` asks
/// for port 0) once the socket listens and before the first connection is accepted: a
/// supervisor waiting for that announcement never sees it for a server that failed to
/// bind.
pub fn run_announcing(
    sandbox: Arc<Sandbox>,
    opts: ServeOptions,
    listening: impl FnOnce(SocketAddr) + Send,
) -> Result<(), ServeError> {
    let listener = bind(&opts)?;
    run_bound(sandbox, opts, listener, listening)
}

/// Checks `opts` as [`run`] does and binds its address: called before the runtime is
/// opened, a port another program holds, or an address that cannot be served, is
/// refused before any root or state directory is made.
pub fn bind(opts: &ServeOptions) -> Result<std::net::TcpListener, ServeError> {
    use ailab_sandbox_core::config::{MAX_BODY_BYTES_LIMIT, MIN_BODY_BYTES_LIMIT};
    if !(MIN_BODY_BYTES_LIMIT..=MAX_BODY_BYTES_LIMIT).contains(&opts.body_limit_bytes) {
        return Err(ServeError::BodyLimitOutOfRange(opts.body_limit_bytes));
    }
    let addrs = resolve_addr(&opts.addr)?;
    check_exposure(&opts.addr, &addrs, opts.token.as_deref())?;
    let failed = |error| ServeError::Bind {
        addr: opts.addr.clone(),
        error,
    };
    let listener = std::net::TcpListener::bind(&addrs[..]).map_err(failed)?;
    listener.set_nonblocking(true).map_err(failed)?;
    Ok(listener)
}

/// [`run_announcing`] on a `listener` [`bind`] gave for `opts`.
pub fn run_bound(
    sandbox: Arc<Sandbox>,
    opts: ServeOptions,
    listener: std::net::TcpListener,
    listening: impl FnOnce(SocketAddr) + Send,
) -> Result<(), ServeError> {
    ailab_sandbox_core::confine::kernel::room_for_a_runtime().map_err(ServeError::Runtime)?;
    let (limits, calls) = within_open_files(
        opts.limits,
        ailab_sandbox_core::confine::kernel::open_file_limit(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ailab-http")
        .max_blocking_threads(calls)
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(async move {
        let failed = |error| ServeError::Bind {
            addr: opts.addr.clone(),
            error,
        };
        let listener = TcpListener::from_std(listener).map_err(failed)?;
        let local = listener.local_addr().map_err(failed)?;
        tracing::info!(addr = %local, auth = opts.token.is_some(), "HTTP server listening");
        listening(local);
        let app = crate::router_for_pool(sandbox, opts.token, opts.body_limit_bytes, calls);
        serve_with(listener, app, limits, shutdown_signal()).await
    })
    // Dropping the runtime waits for sandbox calls still running on the blocking pool,
    // so a plan that was executing finishes its writes and audit records.
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, answers
/// the calls still waiting for their turn or room 503 `server_busy` (see `turns.rs`),
/// lets in-flight requests finish (for at most 30 s) and returns. Requests still waiting
/// then are dropped; a sandbox call already running on the blocking pool goes on until
/// it ends, which may include its wait
/// for a workflow another process holds (`lock_wait_seconds`): [`run`] waits for it
/// before it returns, so that its writes and records are whole. The caller is responsible
/// for the exposure check ([`check_exposure`]); [`run`] does it. Connections are bounded
/// by the default [`ConnLimits`].
pub async fn serve<F>(listener: TcpListener, app: Router, shutdown: F) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with(listener, app, ConnLimits::default(), shutdown).await
}

/// [`serve`] with explicit connection bounds.
pub async fn serve_with<F>(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let room = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let peers = Peers::new(limits.max_per_peer);
    // Told to every request: calls still waiting for their turn or room once the stop
    // begins give up at once (see `turns.rs`), those under way run to their end.
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let app = app.layer(axum::Extension(crate::turns::Stopping(Some(stopping_rx))));
    // Each connection holds a receiver: the sender learns of shutdown's end when the
    // last one is dropped, and tells them all to finish when it changes.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = accept(&listener, &room) => a,
        };
        let (stream, permit) = accepted;
        let addr = stream.peer_addr().ok();
        let Some(peer) = addr.and_then(|a| peers.admit(a.ip())) else {
            tracing::debug!(peer = ?addr, "a remote address holding its share of connections opened another: closed");
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = (permit, peer);
            let mut builder = hyper::server::conn::http1::Builder::new();
            // A client may shut its sending side once the request is out (`nc -N`,
            // scripts): it is still answered, rather than dropped unanswered with its
            // plan never run.
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .half_close(true);
            let io = StallGuard::new(stream, limits.write_stall_timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            let finished = tokio::select! {
                r = conn.as_mut() => Some(r),
                _ = stop.wait_for(|s| *s) => None,
            };
            let ended = match finished {
                Some(r) => r,
                None => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down: no new connections; in-flight requests finish");
    let _ = stopping_tx.send(true);
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    match tokio::time::timeout(SHUTDOWN_GRACE, stop_tx.closed()).await {
        Ok(()) => {}
        Err(_) => tracing::warn!(
            "in-flight requests did not finish within {SHUTDOWN_GRACE:?}; stopping anyway"
        ),
    }
    Ok(())
}

/// The connections each remote address holds (see [`ConnLimits::max_per_peer`]).
#[derive(Debug, Clone)]
struct Peers {
    most: usize,
    held: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// A connection counted to its address until dropped (`None` for a loopback one).
struct PeerPermit(Option<(Peers, std::net::IpAddr)>);

impl Peers {
    fn new(most: usize) -> Self {
        Self {
            most: most.max(1),
            held: Arc::default(),
        }
    }

    /// The connection's place among its address's, or `None` when the address holds
    /// its share already.
    fn admit(&self, ip: std::net::IpAddr) -> Option<PeerPermit> {
        let ip = ip.to_canonical();
        if ip.is_loopback() {
            return Some(PeerPermit(None));
        }
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = held.entry(ip).or_insert(0);
        if *n >= self.most {
            return None;
        }
        *n += 1;
        Some(PeerPermit(Some((self.clone(), ip))))
    }
}

impl Drop for PeerPermit {
    fn drop(&mut self) {
        let Some((peers, ip)) = self.0.take() else {
            return;
        };
        let mut held = peers
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Occupied(mut e) = held.entry(ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// The next connection once there is room for it. An accept error (out of descriptors,
/// a connection reset before it was taken) is logged and retried after a pause, so a
/// passing shortage does not spin or stop the server.
async fn accept(
    listener: &TcpListener,
    room: &Arc<tokio::sync::Semaphore>,
) -> (tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit) {
    loop {
        let Ok(permit) = room.clone().acquire_owned().await else {
            // The semaphore is never closed.
            std::future::pending::<()>().await;
            continue;
        };
        match listener.accept().await {
            Ok((stream, _)) => return (stream, permit),
            Err(e) => {
                drop(permit);
                tracing::warn!(error = %e, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Descriptors the runtime keeps whatever it serves: its logs, roots, state folders,
/// runtime and listener.
const FILES_KEPT: u64 = 32;

/// `limits` and the most sandbox calls run at once, fitted to `files` open files: a
/// quarter of what the runtime does not keep for connections, the rest for calls (a
/// rollback holds a lock per file it restores). With too few, a burst of clients made
/// writes and rollbacks fail with "Too many open files"; fitted, further clients wait in
/// the listen backlog and further calls for a thread.
fn within_open_files(limits: ConnLimits, files: u64) -> (ConnLimits, usize) {
    let spare = files.saturating_sub(FILES_KEPT);
    let fit = |n: u64, most: usize| usize::try_from(n).unwrap_or(most).clamp(1, most);
    let connections = fit(spare / 4, limits.max_connections.max(1));
    let per_call = ailab_sandbox_core::confine::kernel::FILES_PER_WRITE as u64;
    let calls = fit((spare - spare / 4) / per_call, MAX_BLOCKING_THREADS);
    if connections < limits.max_connections || calls < MAX_BLOCKING_THREADS {
        tracing::warn!(
            open_files = files,
            connections,
            calls,
            "few open files allowed (ulimit -n): connections and sandbox calls served at once are fewer"
        );
    }
    (
        ConnLimits {
            max_connections: connections,
            ..limits
        },
        calls,
    )
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Connections and calls fit the open files allowed; plenty leaves the defaults.
    #[test]
    fn connections_and_calls_fit_the_open_files_allowed() {
        let fitted = |files| {
            let (limits, calls) = within_open_files(ConnLimits::default(), files);
            (limits.max_connections, calls)
        };
        assert_eq!(fitted(u64::MAX), (MAX_CONNECTIONS, MAX_BLOCKING_THREADS));
        assert_eq!(fitted(65_536), (MAX_CONNECTIONS, MAX_BLOCKING_THREADS));
        assert_eq!(fitted(1024), (248, 46));
        assert_eq!(fitted(64), (8, 1));
        assert_eq!(fitted(16), (1, 1));
    }

    /// A remote address holds its share of connections at most, each given back when
    /// dropped; others are not held back by it, nor is loopback counted.
    #[test]
    fn a_remote_address_holds_its_share_of_connections() {
        let peers = Peers::new(2);
        let one: std::net::IpAddr = "203.0.113.7".parse().unwrap();
        let other: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        // The same address written as IPv4 mapped into IPv6 is the same peer.
        let mapped: std::net::IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        let first = peers.admit(one).unwrap();
        let _second = peers.admit(mapped).unwrap();
        assert!(peers.admit(one).is_none());
        let _others: Vec<_> = (0..2).map(|_| peers.admit(other).unwrap()).collect();
        assert!(peers.admit(other).is_none());
        drop(first);
        assert!(peers.admit(one).is_some());
        let local: Vec<_> = (0..10)
            .map(|_| peers.admit("127.0.0.1".parse().unwrap()))
            .collect();
        assert!(local.iter().all(Option::is_some));
        assert!(peers.admit("::1".parse().unwrap()).is_some());
    }
}
