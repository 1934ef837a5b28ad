//! `ailab-sandbox-http`: the HTTP face of the governed write runtime (SPEC §10).
//!
//! JSON routes over one shared [`Sandbox`], plus Prometheus `/metrics`:
//!
//! | route | answer |
//! |---|---|
//! | `GET /agentic/state` | the state document |
//! | `GET /agentic/executions?limit=50&workflow_id=` | audit entries, newest first |
//! | `GET /agentic/executions/stats` | audit statistics |
//! | `GET /agentic/artifacts?limit=50&workflow_id=` | artifacts, newest first |
//! | `GET /agentic/artifacts/{id}` | `{"artifact", "lineage"}`; 404 `not_found` if unknown or malformed |
//! | `GET /agentic/rollback/{workflow_id}` | what a rollback would restore |
//! | `POST /agentic/plans` | runs the plan in the body |
//! | `POST /agentic/rollback/{workflow_id}` | rolls back; optional body `{"force", "action_id"}` |
//! | `GET /metrics` | OpenMetrics text when `Accept` prefers it, else the classic text format |
//! | `GET /healthz` | `{"status": "ok"}`; 503 `io_error` once the process can write nothing more until restarted |
//!
//! Statuses: `POST /agentic/plans` answers 200 for `success` and `simulated_success`,
//! 422 for `blocked` (nothing was written; 429 when only the rate limit refused it, 500
//! when only the server's storage did, `io_error`), 409 for `failed` and `rolled_back` (a
//! mutation failed); the body is always the run result, with a top-level `reason_code`
//! and `reason` added when the run did not succeed. A plan that cannot be parsed or has
//! invalid ids is 400. `POST /agentic/rollback/{id}` answers 200 when rolled back (or
//! simulated, with writing off or dry-run on), 409
//! on `conflict`, `checksum_mismatch` (a snapshot record or backup that fails its seal or
//! checksum) or a failed restore step, 404 on `no_rollback_data`, 400 on
//! `invalid_id`, 422 on what no force overrides (`outside_sandbox`: the workflow also
//! wrote into a root this server is not configured with; `reserved_path`; a link or
//! special file in a target's place or on its way), with the rollback report as body. Every other error is a JSON
//! `{"reason_code", "reason"}`: 400 `invalid_request` (bad query, body or parameter, or a query on a route that reads none),
//! 400 `invalid_id` (a malformed workflow id), 401 `unauthorized`, 403
//! `forbidden_origin` / `forbidden_host`, 404 `not_found`, 405 `method_not_allowed`, 408
//! `request_timeout`, 413 `payload_too_large`, 500 `io_error` / `internal_error`
//! whose reason never carries internal detail (that goes to the log), and 503
//! `server_busy` with `Retry-After` when other requests' bodies fill the room kept for
//! bodies in flight (see [`BODIES_IN_FLIGHT`]), other plans' data the room kept for
//! the plans parsed at once past [`PLAN_DATA_WAIT`] (see [`PLAN_DATA_IN_FLIGHT`]), or
//! other plans and rollbacks of the workflow its turn, or the changes or reads running
//! at once their room, past `limits.lock_wait_seconds` (plans and rollbacks of one
//! workflow take turns before they take a thread, and changes and reads have their
//! shares of the blocking pool, see [`router_for_pool`]; such a call was not run, and
//! leaves no audit line; a plan that is not valid is still 400).
//!
//! Who may call: with a token, every route (`/healthz` and `/metrics` too) needs
//! `Authorization: Bearer <token>` (compared in constant time). No CORS headers are ever
//! sent, and requests that carry `Origin` (or a cross-site `Sec-Fetch-Site`) are refused,
//! so a web page cannot drive the runtime; without a token the `Host` must be a loopback
//! name, which defeats DNS rebinding. [`run`] refuses to listen on a non-loopback
//! address without a token.
//!
//! Memory: a semaphore holds room for request bodies ([`BODIES_IN_FLIGHT`] times the body
//! limit in all). A body is charged as its bytes arrive (in 1/1024ths of the limit) and
//! gives the room back when its response is ready, so concurrent uploads cannot take more
//! memory than that whatever their number, and a client holds only as much as it has sent.
//! A body that holds no room waits for room; one that holds some and finds no more is
//! answered 503 `server_busy` with `Retry-After`, so no upload waits while holding room
//! (none waits for another). A second semaphore bounds the plans' `data` parsed and held at
//! once ([`PLAN_DATA_IN_FLIGHT`] times the most one plan may hold, in values as the core
//! counts them): a plan takes room for what its text could hold, outside its strings,
//! before it is parsed.
//!
//! The [`Sandbox`] is synchronous: every call runs on Tokio's blocking pool.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ailab_sandbox_core::{Config, Sandbox};
//!
//! let config = Config::with_roots(vec!["/srv/sandbox".into()], "/var/lib/ailab".into());
//! let sandbox = Arc::new(Sandbox::open(config)?);
//! // In-process (tests): a plain axum Router.
//! let _app = ailab_sandbox_http::router(sandbox.clone(), None, ailab_sandbox_http::DEFAULT_BODY_LIMIT);
//! // As a server, until SIGINT/SIGTERM:
//! ailab_sandbox_http::run(sandbox, ailab_sandbox_http::ServeOptions::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod guard;
mod routes;
mod server;
mod turns;
pub mod wire;

use ailab_sandbox_core::Sandbox;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyDeadlineLayer;

pub use error::codes;
pub use guard::constant_time_eq;
pub use routes::{OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE};
pub use server::{
    ConnLimits, HEADER_READ_TIMEOUT, MAX_BLOCKING_THREADS, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_PEER, MIN_TOKEN_LEN, ServeError, ServeOptions, WRITE_STALL_TIMEOUT, bind,
    check_exposure, resolve_addr, run, run_announcing, run_bound, serve, serve_with,
};

/// Default largest request body: 64 MiB, the configuration's default, so that every plan
/// the catalog and the default workflow budget allow fits once JSON-escaped.
pub const DEFAULT_BODY_LIMIT: usize = ailab_sandbox_core::config::DEFAULT_MAX_BODY_BYTES;

/// How long a client may take to send a request body.
pub const BODY_DEADLINE: Duration = Duration::from_secs(60);

/// Plans whose `data` the server parses and holds at once, in multiples of the most one
/// plan may hold ([`ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN`], some 150 MiB
/// parsed). Parsed, a value takes tens of times its text (`0,` is two bytes, 32 parsed;
/// `{"a":0}` eight, some 700), so room for bodies alone would let a few MiB of text each
/// take gigabytes in all. Before a plan is parsed it takes room for as many values as its
/// text can hold outside its strings ([`ailab_sandbox_core::plan::data_values_bound`]: a
/// plan whose data is small takes none, see [`SMALL_PLAN_DATA`]), waiting in turn while
/// other plans hold it (at most [`PLAN_DATA_WAIT`], then answered 503 `server_busy`), and
/// gives it back once it has run.
pub const PLAN_DATA_IN_FLIGHT: usize = 2;

/// Plans whose data counts fewer values than this (a few MiB parsed) take no room for it:
/// they never wait behind large ones.
pub const SMALL_PLAN_DATA: usize = ailab_sandbox_core::plan::SMALL_DATA_VALUES;

/// How long a plan waits for room for its data before it is answered 503 `server_busy`.
pub const PLAN_DATA_WAIT: Duration = Duration::from_secs(30);

/// Request bodies the server holds at once, in multiples of the largest one allowed.
/// Apart from their `data` (see [`PLAN_DATA_IN_FLIGHT`]) plans parse into a few times
/// their body at most (actions and edits are capped, and refused as they are read), so
/// this bounds what concurrent uploads can hold whatever their number. A request is charged for its body as the bytes arrive (never
/// more than the largest body allowed), until its response is ready or, for a plan,
/// until the plan has run, even if the client hung up meanwhile: a client holds only as
/// much room as it has sent. A request that holds no room waits, in turn,
/// for room for its first bytes, taking none until all of it is free; one that holds
/// some and finds too little free for its next bytes is answered 503 `server_busy` with
/// `Retry-After` instead of waiting, since uploads that wait while holding room could
/// wait for each other until their deadline.
pub const BODIES_IN_FLIGHT: usize = 4;

/// Room for bodies is counted in units of this fraction of the body limit (at least a
/// byte): a request is charged at most one unit more than it has sent, so however small
/// the limit, clients that have sent a byte each cannot fill the room for everyone.
const ROOM_UNITS_PER_BODY: usize = 1024;

/// The first bytes of every body, this many, are not charged to the room for bodies
/// when the body limit is 16 times as large or more (the default's 64 MiB is). Uploads
/// that stall while holding the room make every body that needs some wait up to the
/// 60 s a body has; a rollback's body or a small plan needs none, and goes through.
/// What this lets a request hold is of the order of its connection's own buffers, and
/// connections are bounded ([`MAX_CONNECTIONS`]: 16 MiB in all).
pub const FREE_BODY_BYTES: usize = 64 << 10;

/// [`FREE_BODY_BYTES`] under a body limit of `limit`: none under a small limit, where
/// they would be a large part of every body.
fn free_body_bytes(limit: usize) -> usize {
    if limit >= 16 * FREE_BODY_BYTES {
        FREE_BODY_BYTES
    } else {
        0
    }
}

/// Room for request bodies (see [`BODIES_IN_FLIGHT`]).
#[derive(Clone)]
struct BodyRoom {
    units: Arc<tokio::sync::Semaphore>,
    /// Bytes per unit.
    unit: usize,
    /// The body limit: no request is charged more (beyond it the limit layer answers
    /// 413).
    limit: usize,
    /// Bytes of each body not charged (see [`FREE_BODY_BYTES`]).
    free: usize,
    /// Uploads waiting for room for their first bytes, in turn: only the first waits
    /// for room to be given back.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Told whenever room is given back.
    freed: Arc<tokio::sync::Notify>,
}

/// Room a request holds; dropping it gives the room back and tells the upload waiting
/// for room.
pub(crate) struct Charge {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    freed: Arc<tokio::sync::Notify>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        // Released before the waiter is told, so that it finds the room free.
        drop(self.permit.take());
        self.freed.notify_one();
    }
}

/// The room one request holds, given back when its response is ready. Its handler finds
/// it among the request's extensions: one that parses or runs the body on the blocking
/// pool takes the room along, so that a client that hangs up does not free it while
/// that work goes on.
#[derive(Clone, Default)]
pub(crate) struct HeldRoom(Arc<std::sync::Mutex<Option<Charge>>>);

impl HeldRoom {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Charge>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds room for more of the body.
    fn add(&self, permit: tokio::sync::OwnedSemaphorePermit, room: &BodyRoom) {
        let mut slot = self.slot();
        match slot.as_mut().and_then(|c| c.permit.as_mut()) {
            Some(p) => p.merge(permit),
            None => {
                *slot = Some(Charge {
                    permit: Some(permit),
                    freed: room.freed.clone(),
                });
            }
        }
    }

    /// The room held so far, to be dropped when the work on the body ends.
    pub(crate) fn take(&self) -> Option<Charge> {
        self.slot().take()
    }
}

/// A body that found the room for bodies full after its first bytes (answered 503).
#[derive(Debug)]
pub(crate) struct RoomFull;

impl std::fmt::Display for RoomFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no room for more request body bytes")
    }
}

impl std::error::Error for RoomFull {}

/// Charges a request's body to the room as it arrives (see [`BODIES_IN_FLIGHT`]).
async fn body_room(
    axum::extract::State(room): axum::extract::State<BodyRoom>,
    mut req: Request,
    next: Next,
) -> Response {
    let held = HeldRoom::default();
    req.extensions_mut().insert(held.clone());
    if axum::body::HttpBody::is_end_stream(req.body()) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    // (stream, bytes charged so far, whether the body ended with an error)
    let metered = futures_util::stream::unfold((body.into_data_stream(), 0usize, false), {
        let held = held.clone();
        move |(mut stream, charged, ended)| {
            let (room, held) = (room.clone(), held.clone());
            async move {
                use futures_util::StreamExt;
                if ended {
                    return None;
                }
                let chunk = match stream.next().await? {
                    Ok(c) => c,
                    Err(e) => return Some((Err(e), (stream, charged, true))),
                };
                let now = (charged + chunk.len()).min(room.limit);
                let units = |bytes: usize| bytes.saturating_sub(room.free).div_ceil(room.unit);
                let more = units(now) - units(charged);
                if more == 0 {
                    return Some((Ok(chunk), (stream, now, false)));
                }
                let more = u32::try_from(more).unwrap_or(u32::MAX);
                let permit = if units(charged) == 0 {
                    // Holding nothing, it may wait, in turn, and takes nothing until all
                    // it needs is free: room taken bit by bit while waiting would be
                    // missed by the uploads under way, which cannot wait.
                    let _turn = room.turn.lock().await;
                    loop {
                        let freed = room.freed.notified();
                        if let Ok(p) = room.units.clone().try_acquire_many_owned(more) {
                            break Some(p);
                        }
                        freed.await;
                    }
                } else {
                    room.units.clone().try_acquire_many_owned(more).ok()
                };
                let Some(permit) = permit else {
                    return Some((Err(axum::Error::new(RoomFull)), (stream, now, true)));
                };
                held.add(permit, &room);
                Some((Ok(chunk), (stream, now, false)))
            }
        }
    });
    let req = Request::from_parts(parts, axum::body::Body::from_stream(metered));
    let resp = next.run(req).await;
    held.take();
    resp
}

/// The application: every route of SPEC §10 with its middleware (request log, JSON error
/// bodies, browser refusal and token check, room for bodies in flight, body limit and
/// deadline). `token: None`
/// serves everyone who reaches it; `body_limit_bytes` bounds every request body (413).
/// For a runtime whose blocking pool holds [`MAX_BLOCKING_THREADS`] threads, as
/// [`run`]'s: see [`router_for_pool`].
pub fn router(sandbox: Arc<Sandbox>, token: Option<String>, body_limit_bytes: usize) -> Router {
    router_for_pool(sandbox, token, body_limit_bytes, MAX_BLOCKING_THREADS)
}

/// [`router`] for a Tokio runtime whose blocking pool holds `blocking_threads` threads
/// (`max_blocking_threads`): plans and rollbacks run on three quarters of them at most
/// (one at least), reads of the logs on the rest but a sixteenth (one at least), and
/// the sixteenth is left for `/metrics` (which waits for no lock) and the short work of
/// reading a plan's text, so that calls waiting for locks another process holds never
/// stall the rest. With fewer than 8 threads none is left. A call that finds no room
/// within `limits.lock_wait_seconds` is answered 503 `server_busy`.
pub fn router_for_pool(
    sandbox: Arc<Sandbox>,
    token: Option<String>,
    body_limit_bytes: usize,
    blocking_threads: usize,
) -> Router {
    let state = routes::AppState {
        sandbox,
        body_limit: body_limit_bytes,
        data_room: Arc::new(tokio::sync::Semaphore::new(
            PLAN_DATA_IN_FLIGHT * ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN,
        )),
        data_wait: PLAN_DATA_WAIT,
        turns: Arc::new(turns::Turns::for_pool(blocking_threads)),
    };
    let guard = guard::Guard::new(token.as_deref());
    let limit = body_limit_bytes.max(1);
    let unit = (limit / ROOM_UNITS_PER_BODY).max(1);
    let room = BodyRoom {
        units: Arc::new(tokio::sync::Semaphore::new(
            (BODIES_IN_FLIGHT * limit)
                .div_ceil(unit)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
        unit,
        limit,
        free: free_body_bytes(limit),
        turn: Arc::default(),
        freed: Arc::default(),
    };
    // On each method's handler, not the route: a method the route lacks stays 405.
    let no_query = || middleware::from_fn(routes::no_query);
    // Only the two POST handlers read a body, so only they meter, time and limit one: a
    // body sent anywhere else is dropped unread, whatever its size or framing, and the
    // answer is the route's own (404, 405, or the read).
    let body_layers = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(routes::plain_body))
        .layer(middleware::from_fn_with_state(room, body_room))
        .layer(RequestBodyDeadlineLayer::new(BODY_DEADLINE))
        .layer(RequestBodyLimitLayer::new(body_limit_bytes))
        .layer(DefaultBodyLimit::disable());
    let routes = Router::new()
        .route("/healthz", get(routes::healthz).route_layer(no_query()))
        .route("/metrics", get(routes::metrics).route_layer(no_query()))
        .route("/agentic/state", get(routes::state).route_layer(no_query()))
        .route("/agentic/executions", get(routes::executions))
        .route(
            "/agentic/executions/stats",
            get(routes::execution_stats).route_layer(no_query()),
        )
        .route("/agentic/artifacts", get(routes::artifacts))
        .route(
            "/agentic/artifacts/{id}",
            get(routes::artifact).route_layer(no_query()),
        )
        .route(
            "/agentic/plans",
            post(routes::run_plan)
                .route_layer(body_layers.clone())
                .route_layer(no_query()),
        )
        .route(
            "/agentic/rollback/{workflow_id}",
            get(routes::rollback_info).route_layer(no_query()).merge(
                post(routes::rollback)
                    .route_layer(body_layers)
                    .route_layer(no_query()),
            ),
        )
        .fallback(routes::not_found)
        .with_state(state)
        .layer(middleware::from_fn_with_state(guard, guard::guard))
        .layer(middleware::from_fn(log_request));
    // Around the whole router, not each route (as `Router::layer` puts it): a 405 gets its
    // `Allow` header from the method router only after the route's own layers have run.
    Router::new().fallback_service(
        tower::ServiceBuilder::new()
            .layer(middleware::from_fn_with_state(
                body_limit_bytes,
                json_errors,
            ))
            .service(routes),
    )
}

fn is_json(resp: &Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
}

/// Turns the bare error answers of layers (405 from the method router, 413 from the body
/// limit, …) into JSON `{"reason_code", "reason"}`, and marks every answer uncacheable.
async fn json_errors(State(body_limit): State<usize>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let status = resp.status();
    // The method router adds `Allow` to any answer its route gives for a method it lacks:
    // on a refusal for want of the token it would tell a stranger which routes exist.
    if status != StatusCode::METHOD_NOT_ALLOWED {
        resp.headers_mut().remove(header::ALLOW);
    }
    if (status.is_client_error() || status.is_server_error()) && !is_json(&resp) {
        let allow = resp.headers().get(header::ALLOW).cloned();
        let answer = if status == StatusCode::PAYLOAD_TOO_LARGE {
            error::ApiError::too_large(body_limit)
        } else {
            error::ApiError::for_status(status, allow.as_ref())
        };
        let mut fresh = answer.into_response();
        if let Some(allow) = allow {
            fresh.headers_mut().insert(header::ALLOW, allow);
        }
        resp = fresh;
    }
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// One log line per request: method, route, status, latency.
async fn log_request(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let resp = next.run(req).await;
    let latency = start.elapsed();
    let route = route.as_ref().map_or("(no route)", MatchedPath::as_str);
    let status = resp.status().as_u16();
    if resp.status().is_server_error() {
        tracing::warn!(%method, route, status, ?latency, "request");
    } else {
        tracing::info!(%method, route, status, ?latency, "request");
    }
    resp
}
