//! The route handlers. Each one validates its input, then calls the synchronous
//! [`Sandbox`] on the blocking pool, then maps the outcome through [`crate::error`].

use ailab_sandbox_core::plan::check_id;
use ailab_sandbox_core::sandbox::RollbackOptions;
use ailab_sandbox_core::{ReasonCode, Sandbox};
use axum::Json;
use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use crate::error::{ApiError, codes, rate_limited_for, rollback_status, run_status, run_summary};
use crate::wire::{
    ArtifactDoc, DEFAULT_LIST_LIMIT, Health, ListQuery, MAX_LIST_LIMIT, PlanResponse,
    RollbackRequest,
};

/// Content type of `/metrics` for a scraper that asks for OpenMetrics (as Prometheus
/// does), the text `prometheus-client` encodes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of `/metrics` otherwise: Prometheus's classic text format.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const ROLLBACK_BODY_HINT: &str = r#"send no body, or {"force": true|false, "action_id": "..."}"#;

use crate::turns::Stopping;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub sandbox: Arc<Sandbox>,
    pub body_limit: usize,
    /// Room for the data of the plans parsed and run at once (see
    /// [`crate::PLAN_DATA_IN_FLIGHT`]), in values as the core counts them.
    pub data_room: Arc<tokio::sync::Semaphore>,
    /// How long a plan waits for room for its data ([`crate::PLAN_DATA_WAIT`]).
    pub data_wait: std::time::Duration,
    /// Each workflow's turn, and the room for changes, on the blocking pool.
    pub turns: Arc<crate::turns::Turns>,
}

impl AppState {
    /// Room for the data of a plan whose text could hold `values` values: none for a
    /// plan whose data is small, so that it never waits behind large ones; one that
    /// waits too long is told to come back.
    async fn data_room(
        &self,
        values: usize,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
        if values < crate::SMALL_PLAN_DATA {
            return Ok(None);
        }
        let room = Arc::clone(&self.data_room)
            .acquire_many_owned(u32::try_from(values).unwrap_or(u32::MAX));
        match tokio::time::timeout(self.data_wait, room).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            Ok(Err(_)) => Err(ApiError::internal()),
            Err(_) => Err(ApiError::data_busy(self.data_wait)),
        }
    }

    /// How long a call waits for its turn and room: as long as the runtime waits for a
    /// lock.
    fn wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.sandbox.config().limits.lock_wait_seconds)
    }

    /// `workflow_id`'s turn, waited for until `deadline` (none to wait for without one).
    async fn turn(
        &self,
        workflow_id: Option<&str>,
        deadline: tokio::time::Instant,
        stopping: &Stopping,
    ) -> Result<crate::turns::Turn, ApiError> {
        let waited = self.wait();
        self.turns
            .take(workflow_id, deadline, stopping)
            .await
            .map_err(|busy| ApiError::waited_in_vain(busy, waited))
    }

    /// Room for `turn`'s call among the changes running at once, waited for until
    /// `deadline`.
    async fn room(
        &self,
        turn: &mut crate::turns::Turn,
        deadline: tokio::time::Instant,
        stopping: &Stopping,
    ) -> Result<(), ApiError> {
        let waited = self.wait();
        turn.room(deadline, stopping)
            .await
            .map_err(|busy| ApiError::waited_in_vain(busy, waited))
    }

    /// Runs a read of the logs on the blocking pool once it has room among the reads
    /// (see [`crate::turns`]), waited for as long as the runtime waits for a lock.
    async fn read<T, F>(&self, stopping: &Stopping, f: F) -> Result<T, ApiError>
    where
        F: FnOnce(&Sandbox) -> T + Send + 'static,
        T: Send + 'static,
    {
        let waited = self.wait();
        let room = self
            .turns
            .reading(tokio::time::Instant::now() + waited, stopping)
            .await
            .map_err(|busy| ApiError::waited_in_vain(busy, waited))?;
        let sb = Arc::clone(&self.sandbox);
        blocking(move || {
            let read = f(&sb);
            drop(room);
            read
        })
        .await
    }

    /// [`Self::read`] of what a store answers, as JSON; a failure is `storage`'s, with
    /// `what` (the store, "could not be read").
    async fn read_json<T, F>(
        &self,
        stopping: &Stopping,
        what: &'static str,
        f: F,
    ) -> Result<Response, ApiError>
    where
        F: FnOnce(&Sandbox) -> Result<T, ailab_sandbox_core::Error> + Send + 'static,
        T: serde::Serialize + Send + 'static,
    {
        let value = self
            .read(stopping, f)
            .await?
            .map_err(|e| ApiError::storage(what, &e))?;
        Ok(Json(value).into_response())
    }
}

/// The `workflow_id` a plan's text names, when it is a plan; else `None` (the runtime
/// refuses it without waiting for any workflow).
fn named_workflow(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        workflow_id: String,
    }
    serde_json::from_slice::<Named>(bytes)
        .ok()
        .map(|n| n.workflow_id)
}

/// Runs a synchronous sandbox call on the blocking pool. A panic there becomes a bare
/// 500 (logged), never a crash of the server.
async fn blocking<T, F>(f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        tracing::error!(error = %e, "a sandbox call did not complete");
        ApiError::internal()
    })
}

/// The value of `key` in `uri`'s query as sent (still percent-encoded): what a refusal
/// quotes, since the decoded text may hold replacement characters or spaces for `+`.
fn sent<'a>(uri: &'a Uri, key: &str) -> Option<&'a str> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

fn list_params(
    q: Result<Query<ListQuery>, QueryRejection>,
    uri: &Uri,
) -> Result<(usize, Option<String>), ApiError> {
    let allowed = format!(
        "this route takes limit (a whole number from 1 to {MAX_LIST_LIMIT}, default {DEFAULT_LIST_LIMIT}) and workflow_id, each at most once"
    );
    let Query(q) = q.map_err(|e| {
        // The framework's preamble names itself, not the problem.
        let text = e.body_text();
        let what = text
            .strip_prefix("Failed to deserialize query string: ")
            .unwrap_or(&text);
        // "foo: unknown field `foo`, …": the key is said again in the words.
        let bare = what.split_once(": ").map_or(what, |(_, m)| m);
        let what = ailab_sandbox_core::shape_words::message_words(bare, "the query")
            .unwrap_or_else(|| what.to_owned());
        // Words that name the fields taken already say what the route takes.
        if what.contains("; it takes ") {
            return ApiError::bad_request(format!("the query is not valid: {what}"));
        }
        ApiError::bad_request(format!("the query is not valid: {what}; {allowed}"))
    })?;
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIST_LIMIT,
        // Digits only, as the CLI takes it: Rust's parser would also take a sign.
        Some(text) => Some(text)
            .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u32>().ok())
            .filter(|n| (1..=MAX_LIST_LIMIT).contains(n))
            .ok_or_else(|| {
                // Decoded where that reads the same to everyone (`%2B5` is "+5"); as sent
                // where decoding made a space of `+` or replaced a stray byte.
                let plain = text.bytes().all(|b| b.is_ascii_graphic());
                let quoted = if plain {
                    text
                } else {
                    sent(uri, "limit").unwrap_or(text)
                };
                ApiError::bad_request(format!(
                    "limit must be a whole number from 1 to {MAX_LIST_LIMIT}, got {:?}",
                    quoted.chars().take(40).collect::<String>()
                ))
            })?,
    };
    let workflow = q.workflow_id.filter(|w| !w.is_empty());
    if let Some(w) = &workflow {
        check_id("workflow_id", w).map_err(|r| {
            // Named as sent: an id the decoded text fails, the encoded text fails too.
            let as_sent =
                sent(uri, "workflow_id").and_then(|raw| check_id("workflow_id", raw).err());
            ApiError::from_refusal(as_sent.unwrap_or(r))
        })?;
    }
    Ok((limit as usize, workflow))
}

/// A workflow id from the path. One that is not UTF-8 once decoded is a malformed id
/// (`invalid_id`, naming the segment as sent), as in a query or a body.
fn workflow_param(p: Result<Path<String>, PathRejection>, uri: &Uri) -> Result<String, ApiError> {
    match p {
        Ok(Path(s)) => Ok(s),
        Err(e) if not_utf8(&e) => {
            let sent = sent_segment(uri);
            Err(match check_id("workflow_id", sent) {
                Err(r) => ApiError::from_refusal(r),
                Ok(()) => ApiError::bad_request(e.body_text()),
            })
        }
        Err(e) => Err(ApiError::bad_request(e.body_text())),
    }
}

/// Whether the path's parameter is not UTF-8 once decoded.
fn not_utf8(e: &PathRejection) -> bool {
    matches!(e, PathRejection::FailedToDeserializePathParams(e)
        if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }))
}

/// The path's last segment as sent: still percent-encoded, it is printable and names the
/// bytes sent.
fn sent_segment(uri: &Uri) -> &str {
    uri.path().rsplit('/').next().unwrap_or_default()
}

/// Whether `e` or one of its sources is a `T`.
fn caused_by<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn body_bytes(b: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else if caused_by::<tower_http::timeout::TimeoutError>(&e) {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                codes::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            )
        } else if caused_by::<crate::RoomFull>(&e) {
            ApiError::busy()
        } else {
            ApiError::bad_request("the request body could not be read")
        }
    })
}

/// `GET /healthz`: 200 while the process can write; 503 `io_error` once it can write
/// nothing more until it is started again (a sync failed, or its registry or audit
/// trail was moved away or replaced), so that a supervisor restarts it.
pub(crate) async fn healthz(State(s): State<AppState>) -> Result<Json<Health>, ApiError> {
    // Not on the blocking pool, where it would queue behind calls waiting on locks:
    // `write_failure` never waits (one `stat` at most).
    match s.sandbox.write_failure() {
        None => Ok(Json(Health { status: "ok" })),
        Some(why) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ReasonCode::IoError.as_str(),
            why,
        )),
    }
}

/// `GET /agentic/state`.
pub(crate) async fn state(
    State(s): State<AppState>,
    stopping: Stopping,
) -> Result<Response, ApiError> {
    s.read_json(&stopping, "the state could not be read", Sandbox::state_doc)
        .await
}

/// `GET /agentic/executions?limit=&workflow_id=`.
pub(crate) async fn executions(
    State(s): State<AppState>,
    stopping: Stopping,
    uri: Uri,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (limit, wf) = list_params(q, &uri)?;
    s.read_json(&stopping, "the audit log could not be read", move |sb| {
        sb.audit_entries(limit, wf.as_deref())
    })
    .await
}

/// `GET /agentic/executions/stats`.
pub(crate) async fn execution_stats(
    State(s): State<AppState>,
    stopping: Stopping,
) -> Result<Response, ApiError> {
    s.read_json(
        &stopping,
        "the audit log could not be read",
        Sandbox::audit_stats,
    )
    .await
}

/// `GET /agentic/artifacts?limit=&workflow_id=`.
pub(crate) async fn artifacts(
    State(s): State<AppState>,
    stopping: Stopping,
    uri: Uri,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (limit, wf) = list_params(q, &uri)?;
    s.read_json(
        &stopping,
        "the artifact registry could not be read",
        move |sb| sb.marked(sb.artifacts(limit, wf.as_deref())?),
    )
    .await
}

/// `GET /agentic/artifacts/{id}`: the artifact and its lineage, 404 if unknown. An id that
/// no artifact can have (malformed, or not UTF-8 once decoded) is unknown as well: SPEC §10
/// answers this route with 404 whatever makes the id name nothing.
pub(crate) async fn artifact(
    State(s): State<AppState>,
    stopping: Stopping,
    uri: Uri,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = match id {
        Ok(Path(id)) => id,
        // Still percent-encoded, the segment is printable and names the bytes sent.
        Err(PathRejection::FailedToDeserializePathParams(e))
            if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) =>
        {
            uri.path().rsplit('/').next().unwrap_or_default().to_owned()
        }
        Err(e) => return Err(ApiError::bad_request(e.body_text())),
    };
    if let Err(r) = check_id("artifact_id", &id) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!("no artifact has that id: {}", r.reason),
        ));
    }
    let lookup = id.clone();
    let found = s
        .read(&stopping, move |sb| sb.marked_with_lineage(&lookup))
        .await?
        .map_err(|e| ApiError::storage("the artifact registry could not be read", &e))?;
    match found {
        Some((artifact, lineage)) => Ok(Json(ArtifactDoc { artifact, lineage }).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!("no artifact has the id '{id}'"),
        )),
    }
}

/// `GET /agentic/rollback/{workflow_id}`: what a rollback would restore.
pub(crate) async fn rollback_info(
    State(s): State<AppState>,
    stopping: Stopping,
    uri: Uri,
    wf: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let wf = workflow_param(wf, &uri)?;
    let info = s
        .read(&stopping, move |sb| sb.rollback_info(&wf))
        .await?
        .map_err(ApiError::from_refusal)?;
    Ok(Json(info).into_response())
}

/// `POST /agentic/plans`: runs (or simulates) a plan. The body of every answer but a
/// parse/id error is the run result; the status tells the outcome.
pub(crate) async fn run_plan(
    State(s): State<AppState>,
    stopping: Stopping,
    room: Option<axum::Extension<crate::HeldRoom>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body, s.body_limit)?;
    let sb = Arc::clone(&s.sandbox);
    // Held until the plan is parsed and run, even if the client hangs up meanwhile.
    let held = room.and_then(|r| r.take());
    // Its data's room, taken before it is parsed, as the text alone bounds it. Reading
    // the text through is work for the blocking pool, not the event loop.
    let (bytes, values, workflow_id) = blocking(move || {
        let values = ailab_sandbox_core::plan::data_values_bound(&bytes);
        let workflow_id = named_workflow(&bytes);
        (bytes, values, workflow_id)
    })
    .await?;
    // Its turn before its data's room, so that a plan waiting for its workflow holds
    // none; its room among the changes after, so that one waiting for data room holds
    // none of that either. Both within one wait. A plan that names no workflow (the
    // runtime makes one) waits for no turn, but for room as every other.
    let deadline = tokio::time::Instant::now() + s.wait();
    let (mut turn, mut busy) = match s.turn(workflow_id.as_deref(), deadline, &stopping).await {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    };
    let data = s.data_room(values).await?;
    if let Some(t) = turn.as_mut()
        && let Err(e) = s.room(t, deadline, &stopping).await
    {
        (turn, busy) = (None, Some(e));
    }
    if let Some(busy) = busy {
        // Bad input is told as such (4xx), however busy the server.
        let refused = blocking(move || {
            let refused = ailab_sandbox_core::plan::parse_plan(&bytes)
                .and_then(|p| p.validate().map(drop))
                .err();
            drop((bytes, held, data));
            refused
        })
        .await?;
        return Err(refused.map_or(busy, ApiError::from_refusal));
    }
    let result = blocking(move || {
        let result = sb.run_plan_json(&bytes);
        drop((bytes, held, data, turn));
        result
    })
    .await?
    .map_err(ApiError::from_refusal)?;
    let mut status = run_status(result.status);
    let retry_after = rate_limited_for(&result);
    if retry_after.is_some() {
        status = axum::http::StatusCode::TOO_MANY_REQUESTS;
    } else if crate::error::run_stopped_by_storage(&result) {
        status = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
    }
    let (reason_code, reason) = match run_summary(&result) {
        Some((c, r)) => (Some(c), Some(r)),
        None => (None, None),
    };
    let doc = PlanResponse {
        result,
        reason_code,
        reason,
    };
    let mut resp = (status, Json(doc)).into_response();
    if let Some(secs) = retry_after {
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(secs),
        );
    }
    Ok(resp)
}

/// `POST /agentic/rollback/{workflow_id}` with an optional body
/// `{"force": bool, "action_id": "..."}`.
pub(crate) async fn rollback(
    State(s): State<AppState>,
    stopping: Stopping,
    uri: Uri,
    wf: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let wf = match wf {
        // Not UTF-8 once decoded: passed on as sent, which the rollback refuses
        // (`invalid_id`) in its report's form, as every other malformed id.
        Err(e) if not_utf8(&e) => sent_segment(&uri).to_owned(),
        wf => workflow_param(wf, &uri)?,
    };
    let bytes = body_bytes(body, s.body_limit)?;
    let req = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => RollbackRequest::default(),
        // Only an object: serde would also accept a struct written as an array.
        Some(b'{') => serde_json::from_slice::<RollbackRequest>(&bytes).map_err(|e| {
            let said = ailab_sandbox_core::shape_words::worded::<RollbackRequest>(
                &bytes,
                &e,
                "the rollback body",
            );
            ApiError::bad_request(format!(
                "the rollback options are not valid: {said}; {ROLLBACK_BODY_HINT}"
            ))
        })?,
        Some(_) => {
            let bom = if bytes.starts_with(b"\xEF\xBB\xBF") {
                " (it starts with a byte order mark, which JSON does not allow: send it as UTF-8 without one)"
            } else {
                ""
            };
            return Err(ApiError::bad_request(format!(
                "the rollback options must be a JSON object{bom}; {ROLLBACK_BODY_HINT}"
            )));
        }
    };
    let opts = RollbackOptions {
        action_id: req.action_id,
        force: req.force,
    };
    let deadline = tokio::time::Instant::now() + s.wait();
    let mut turn = s.turn(Some(&wf), deadline, &stopping).await?;
    s.room(&mut turn, deadline, &stopping).await?;
    let sb = s.sandbox;
    let report = blocking(move || {
        let report = sb.rollback_workflow(&wf, &opts);
        drop(turn);
        report
    })
    .await?;
    Ok((rollback_status(&report), Json(report)).into_response())
}

/// `GET /metrics`: OpenMetrics text when the `Accept` header prefers it, else
/// Prometheus's classic text format (as Prometheus's own client libraries answer).
pub(crate) async fn metrics(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sb = s.sandbox;
    let text = blocking(move || sb.metrics_text()).await?;
    let (text, kind) = if wants_openmetrics(&headers) {
        (text, OPENMETRICS_CONTENT_TYPE)
    } else {
        (
            ailab_sandbox_core::metrics::classic_text(&text),
            PROMETHEUS_TEXT_CONTENT_TYPE,
        )
    };
    // Caches keep one answer per `Accept`.
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
        (header::VARY, HeaderValue::from_static("accept")),
    ];
    Ok((headers, text).into_response())
}

/// Whether `Accept` names OpenMetrics and weighs it at least as high as plain text
/// (and above 0); plain text weighed by its most specific range (RFC 9110 §12.5.1:
/// `text/plain`, else `text/*`, else `*/*`), so a bare `*/*` keeps the classic format.
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    // OpenMetrics named; plain text as `text/plain`, `text/*`, `*/*`.
    let (mut openmetrics, mut text) = (None::<f32>, [None::<f32>; 3]);
    for range in crate::guard::header_list(headers, header::ACCEPT) {
        let Ok(range) = std::str::from_utf8(range) else {
            continue;
        };
        let mut parts = range.split(';').map(str::trim);
        let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok())
            // RFC 9110's weights lie from 0 to 1: `inf`, `2` or `-1` weigh nothing.
            .filter(|q| (0.0..=1.0).contains(q))
            .unwrap_or(0.0);
        let weigh = |slot: &mut Option<f32>| *slot = Some(slot.map_or(q, |w| w.max(q)));
        match kind.as_str() {
            "application/openmetrics-text" => weigh(&mut openmetrics),
            "text/plain" => weigh(&mut text[0]),
            "text/*" => weigh(&mut text[1]),
            "*/*" => weigh(&mut text[2]),
            _ => {}
        }
    }
    let text = text.into_iter().flatten().next();
    openmetrics.is_some_and(|om| om > 0.0 && text.is_none_or(|t| om >= t))
}

/// Refuses a body in a content coding (RFC 9110 §15.5.16: 415): bodies are read as
/// sent, and a compressed plan read so was refused as text that is not UTF-8. On the
/// routes that read a body only: elsewhere the route's own answer stands.
pub(crate) async fn plain_body(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    const SHOWN: usize = 40;
    let Some(coding) = crate::guard::header_list(req.headers(), header::CONTENT_ENCODING)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
    else {
        return next.run(req).await;
    };
    let coding = String::from_utf8_lossy(coding);
    let mut shown: String = coding.chars().take(SHOWN).collect();
    if coding.chars().count() > SHOWN {
        shown.push('…');
    }
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        codes::INVALID_REQUEST,
        format!(
            "the request's Content-Encoding is {shown:?}; this server reads bodies only as sent: send the JSON uncompressed, without Content-Encoding"
        ),
    )
    .into_response()
}

/// Refuses a query on a route that reads none: ignored, `?action_id=a2` on a rollback would
/// undo the whole workflow, and `?dry_run=true` on a plan would write.
pub(crate) async fn no_query(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let query = req.uri().query().unwrap_or_default();
    if query.is_empty() {
        return next.run(req).await;
    }
    let shown: String = query.chars().take(200).collect();
    let hint = if req.method() == Method::POST && req.uri().path().starts_with("/agentic/rollback/")
    {
        r#"drop the query: a rollback takes its options in the body ({"force": true|false, "action_id": "..."}, or no body)"#
    } else if req.method() == Method::POST {
        "send the plan as the JSON body; whether it writes is the server's configuration (enable_write, dry_run)"
    } else {
        "send the request without one"
    };
    ApiError::bad_request(format!(
        "{} {} takes no query parameters, got '{}'; {hint}",
        req.method(),
        req.uri()
            .path()
            .chars()
            .take(200)
            .collect::<String>()
            .escape_debug(),
        shown.escape_debug()
    ))
    .into_response()
}

/// Any other path.
pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    // A target in authority form (`CONNECT host:port`) has no path: it is shown as sent.
    let target = match uri.path() {
        "" | "/" if uri.authority().is_some() && uri.scheme().is_none() => uri.to_string(),
        p => p.to_owned(),
    };
    let path: String = target.chars().take(200).collect();
    ApiError::new(
        StatusCode::NOT_FOUND,
        codes::NOT_FOUND,
        format!(
            "there is no route {method} {}; the routes are under /agentic/, plus /metrics and /healthz",
            path.escape_debug()
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ailab_sandbox_core::plan::MAX_DATA_VALUES_PER_PLAN;

    fn state(tmp: &tempfile::TempDir) -> AppState {
        let mut config = ailab_sandbox_core::Config::with_roots(
            vec![tmp.path().join("root")],
            tmp.path().join("state"),
        );
        config.enable_write = true;
        config.dry_run = false;
        config.durability = ailab_sandbox_core::config::Durability::Relaxed;
        config.limits.lock_wait_seconds = 2;
        AppState {
            sandbox: Arc::new(Sandbox::open(config).unwrap()),
            body_limit: crate::DEFAULT_BODY_LIMIT,
            data_room: Arc::new(tokio::sync::Semaphore::new(
                crate::PLAN_DATA_IN_FLIGHT * MAX_DATA_VALUES_PER_PLAN,
            )),
            data_wait: std::time::Duration::from_millis(200),
            turns: Arc::new(crate::turns::Turns::for_pool(64)),
        }
    }

    fn plan(name: &str, zeros: usize) -> Bytes {
        let data = vec!["0"; zeros].join(",");
        Bytes::from(format!(
            r#"{{"actions": [{{"intent": "write_json", "path": "{name}.json", "data": [{data}]}}]}}"#
        ))
    }

    /// [`plan`] in workflow `wf_{name}`.
    fn plan_of_workflow(name: &str, zeros: usize) -> Bytes {
        let data = vec!["0"; zeros].join(",");
        Bytes::from(format!(
            r#"{{"workflow_id": "wf_{name}", "actions": [{{"intent": "write_json", "path": "{name}.json", "data": [{data}]}}]}}"#
        ))
    }

    async fn status(s: &AppState, body: Bytes) -> (StatusCode, serde_json::Value) {
        let resp = match run_plan(State(s.clone()), Stopping::default(), None, Ok(body)).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        };
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// While other plans hold the room for data, a plan that could hold many values waits
    /// and is then answered 503 `server_busy`, having written nothing; a small plan never
    /// waits; once the room is free the large plan runs.
    #[tokio::test]
    async fn large_plans_wait_for_room_for_their_data_and_small_ones_do_not() {
        let tmp = tempfile::tempdir().unwrap();
        let s = state(&tmp);
        let held = Arc::clone(&s.data_room)
            .acquire_many_owned(
                u32::try_from(crate::PLAN_DATA_IN_FLIGHT * MAX_DATA_VALUES_PER_PLAN - 1000)
                    .unwrap(),
            )
            .await
            .unwrap();
        let large = || plan("large", 100_000);
        let (code, doc) = status(&s, large()).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{doc}");
        assert_eq!(doc["reason_code"], "server_busy", "{doc}");
        assert!(!tmp.path().join("root/large.json").exists());
        let (code, doc) = status(&s, plan("small", 1000)).await;
        assert_eq!(code, StatusCode::OK, "{doc}");
        assert!(tmp.path().join("root/small.json").exists());
        drop(held);
        let (code, doc) = status(&s, large()).await;
        assert_eq!(code, StatusCode::OK, "{doc}");
        assert!(tmp.path().join("root/large.json").exists());
    }

    /// Large plans waiting for room for their data hold no room among the changes: a
    /// small plan of another workflow runs meanwhile, whatever their number.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plans_waiting_for_data_room_leave_the_room_to_run() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = state(&tmp);
        s.turns = Arc::new(crate::turns::Turns::for_pool(4));
        s.data_wait = std::time::Duration::from_secs(10);
        let held = Arc::clone(&s.data_room)
            .acquire_many_owned(
                u32::try_from(crate::PLAN_DATA_IN_FLIGHT * MAX_DATA_VALUES_PER_PLAN).unwrap(),
            )
            .await
            .unwrap();
        let large: Vec<_> = (0..3)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    status(&s, plan_of_workflow(&format!("large{i}"), 100_000)).await
                })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (code, doc) = status(&s, plan_of_workflow("small", 10)).await;
        assert_eq!(code, StatusCode::OK, "{doc}");
        assert!(large.iter().all(|l| !l.is_finished()));
        drop(held);
        for l in large {
            let (code, doc) = l.await.unwrap();
            assert_eq!(code, StatusCode::OK, "{doc}");
        }
    }
}
