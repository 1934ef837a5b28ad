//! The one mapping from everything that can go wrong to an HTTP status and a JSON body
//! `{"reason_code", "reason"}`. Internal details (I/O errors, paths of the
//! state directory) are logged, never sent.

use ailab_sandbox_core::executor::{ActionStatus, RunResult, RunStatus};
use ailab_sandbox_core::sandbox::RollbackReport;
use ailab_sandbox_core::{ReasonCode, Refusal};
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::wire::ErrorBody;

/// Reason codes of the HTTP face itself, besides the core's [`ReasonCode`]s.
pub mod codes {
    /// No or wrong bearer token.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// The request came from a web page (it carries `Origin` or a cross-site
    /// `Sec-Fetch-Site`): browsers may not drive the runtime.
    pub const FORBIDDEN_ORIGIN: &str = "forbidden_origin";
    /// Without a token, only loopback `Host` names are served (DNS-rebinding guard).
    pub const FORBIDDEN_HOST: &str = "forbidden_host";
    /// No such route, or no such artifact.
    pub const NOT_FOUND: &str = "not_found";
    /// The route exists but not with this method.
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    /// The body is larger than the configured limit.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// Malformed query, path parameter or request body.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// The body did not arrive in time.
    pub const REQUEST_TIMEOUT: &str = "request_timeout";
    /// Something went wrong inside the server; details are in its log.
    pub const INTERNAL_ERROR: &str = "internal_error";
    /// The bodies of other requests fill the room the server keeps for bodies in flight
    /// (see [`crate::BODIES_IN_FLIGHT`]), or other calls the room for plans' data, their
    /// workflow's turn or the room for changes running at once; retry after
    /// `Retry-After` seconds.
    pub const SERVER_BUSY: &str = "server_busy";
}

/// What a `server_busy` answer's `Retry-After` asks for.
const BUSY_RETRY_SECONDS: u32 = 1;

/// An error answer: status, stable code and a readable sentence.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub reason_code: &'static str,
    pub reason: String,
}

impl ApiError {
    pub fn new(status: StatusCode, reason_code: &'static str, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason_code,
            reason: reason.into(),
        }
    }

    pub fn bad_request(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, reason)
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            codes::INTERNAL_ERROR,
            "the server could not complete the request; see the server log",
        )
    }

    /// A storage failure in the core (registry or audit log): logged with detail, answered
    /// without it (the detail could name the state directory, which lies outside every root).
    /// An id the core refused is answered as its refusal, as the command line does.
    pub fn storage(what: &'static str, err: &ailab_sandbox_core::Error) -> Self {
        if let ailab_sandbox_core::Error::InvalidId(r) = err {
            return Self::from_refusal(r.clone());
        }
        if let ailab_sandbox_core::Error::Io { cause, .. } = err
            && err.is_busy()
        {
            // Held by another process of the runtime (a long write, or a stopped one):
            // busy, not broken, as the command line says.
            tracing::warn!(error = %err, "{what}");
            return Self::new(
                StatusCode::CONFLICT,
                ReasonCode::Conflict.as_str(),
                format!(
                    "{what}: another process of the runtime held it past the wait ({cause}; limits.lock_wait_seconds sets it), a long write or a stopped or hung process; try again later"
                ),
            );
        }
        tracing::error!(error = %err, "{what}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ReasonCode::IoError.as_str(),
            format!("{what}; see the server log"),
        )
    }

    pub fn from_refusal(r: Refusal) -> Self {
        Self::new(
            refusal_status(r.reason_code),
            r.reason_code.as_str(),
            r.reason,
        )
    }

    /// The answer for a bare error status produced by a layer (405, 413, …) rather than
    /// by a handler.
    pub fn for_status(status: StatusCode, allow: Option<&HeaderValue>) -> Self {
        let (code, reason) = match status {
            StatusCode::BAD_REQUEST => (
                codes::INVALID_REQUEST,
                "the request is malformed".to_owned(),
            ),
            StatusCode::UNAUTHORIZED => (
                codes::UNAUTHORIZED,
                "a valid bearer token is required".to_owned(),
            ),
            StatusCode::FORBIDDEN => (
                codes::FORBIDDEN_ORIGIN,
                "this request is not allowed".to_owned(),
            ),
            StatusCode::NOT_FOUND => (codes::NOT_FOUND, "no such route".to_owned()),
            StatusCode::METHOD_NOT_ALLOWED => {
                let allowed = allow.and_then(|v| v.to_str().ok()).unwrap_or("");
                let reason = if allowed.is_empty() {
                    "this method is not allowed on this route; the Allow header lists those that are".to_owned()
                } else {
                    format!("this method is not allowed on this route; allowed: {allowed}")
                };
                (codes::METHOD_NOT_ALLOWED, reason)
            }
            StatusCode::REQUEST_TIMEOUT => (
                codes::REQUEST_TIMEOUT,
                "the request did not arrive in time".to_owned(),
            ),
            StatusCode::PAYLOAD_TOO_LARGE => (
                codes::PAYLOAD_TOO_LARGE,
                "the request body is larger than the server accepts".to_owned(),
            ),
            s if s.is_server_error() => return Self::internal(),
            _ => (
                codes::INVALID_REQUEST,
                "the request cannot be served".to_owned(),
            ),
        };
        Self::new(status, code, reason)
    }

    /// `503`: other requests' bodies fill the room for bodies in flight.
    pub fn busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::SERVER_BUSY,
            format!(
                "other requests' bodies fill the room the server keeps for bodies in flight; send the request again in {BUSY_RETRY_SECONDS} second(s)"
            ),
        )
    }

    /// `503`: other plans' data filled the room for plans parsed at once (see
    /// [`crate::PLAN_DATA_IN_FLIGHT`]) for as long as a plan may wait for it.
    pub fn data_busy(waited: std::time::Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::SERVER_BUSY,
            format!(
                "other plans with large data filled the room the server keeps for the plans it parses at once for {} s; nothing was done: send the plan again in {BUSY_RETRY_SECONDS} second(s)",
                waited.as_secs()
            ),
        )
    }

    /// `503`: what a plan, rollback or read waited for in vain (see [`crate::turns`])
    /// for as long as a call may wait for it.
    pub fn waited_in_vain(busy: crate::turns::Busy, waited: std::time::Duration) -> Self {
        let secs = waited.as_secs();
        let (why, then) = match busy {
            crate::turns::Busy::Workflow(workflow_id) => (
                format!(
                    "other calls on workflow {} kept it busy for {secs} s (a long plan or rollback, or one waiting for a run or rollback of another process; limits.lock_wait_seconds); nothing was done",
                    ailab_sandbox_core::confine::path::shown_path(&workflow_id)
                ),
                "send it again later",
            ),
            crate::turns::Busy::Writing(at_once) => (
                format!(
                    "the {at_once} plans and rollbacks this server runs at once kept their room for {secs} s (long ones, or ones waiting for locks another process holds; limits.lock_wait_seconds); nothing was done"
                ),
                "send it again later",
            ),
            crate::turns::Busy::Reading(at_once) => (
                format!(
                    "the {at_once} reads this server runs at once kept their room for {secs} s (reads waiting for the audit trail or the registry another process holds, as a rule; limits.lock_wait_seconds)"
                ),
                "send it again later",
            ),
            crate::turns::Busy::Stopping => (
                "the server is stopping; nothing was done".to_owned(),
                "send it again once the server is back",
            ),
        };
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::SERVER_BUSY,
            format!("{why}: {then}"),
        )
    }

    /// `413` naming the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than the limit of {limit} bytes (the server's max_body_bytes, or --max-body-bytes): split the plan into smaller ones, or raise that limit"
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            Json(ErrorBody {
                reason_code: self.reason_code.to_owned(),
                reason: self.reason,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.reason_code == codes::SERVER_BUSY {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(BUSY_RETRY_SECONDS));
        }
        resp
    }
}

/// The status of a refusal by its code. Exhaustive on purpose: a new code in the core must
/// be given a status here.
pub(crate) fn refusal_status(code: ReasonCode) -> StatusCode {
    use ReasonCode as C;
    match code {
        C::InvalidPlan | C::InvalidId => StatusCode::BAD_REQUEST,
        C::NotFound | C::NoRollbackData => StatusCode::NOT_FOUND,
        // A snapshot or file that no longer matches its checksum is a conflict with what
        // the runtime recorded, not a server fault.
        C::Conflict | C::AlreadyExists | C::ChecksumMismatch => StatusCode::CONFLICT,
        C::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        C::IoError => StatusCode::INTERNAL_SERVER_ERROR,
        C::PhaseNotSupported
        | C::NotSandboxWrite
        | C::ForbiddenIntent
        | C::UnknownOperation
        | C::ChmodForbidden
        | C::PathTraversal
        | C::DepthExceeded
        | C::OutsideSandbox
        | C::ReservedPath
        | C::SymlinkEscape
        | C::SymlinkRefused
        | C::HardlinkRefused
        | C::NotRegularFile
        | C::BlockedExtension
        | C::ExtensionNotAllowed
        | C::SizeExceeded
        | C::EditNotFound
        | C::EditAmbiguous
        | C::BudgetArtifactsExceeded
        | C::BudgetBytesExceeded => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// The status of a run result: 200 for success and simulated success, 422 when the plan
/// was refused (nothing written), 409 when a mutation failed (`failed`, `rolled_back`).
pub(crate) fn run_status(status: RunStatus) -> StatusCode {
    match status {
        RunStatus::Success | RunStatus::SimulatedSuccess => StatusCode::OK,
        RunStatus::Blocked => StatusCode::UNPROCESSABLE_ENTITY,
        RunStatus::Failed | RunStatus::RolledBack => StatusCode::CONFLICT,
    }
}

/// When a plan was refused only by the rate limit: the seconds until all its refused
/// writes are allowed (the run is answered 429 with `Retry-After`).
pub(crate) fn rate_limited_for(r: &RunResult) -> Option<u64> {
    if r.status != RunStatus::Blocked {
        return None;
    }
    let mut wait = None;
    for a in r
        .actions
        .iter()
        .filter(|a| a.status == ActionStatus::Blocked && a.reason_code.is_some())
    {
        if a.reason_code != Some(ReasonCode::RateLimited) {
            return None;
        }
        wait = Some(wait.unwrap_or(0).max(a.retry_after_seconds?));
    }
    wait
}

/// For an unsuccessful run: the first refused or failed action's code and a sentence
/// summing up the run, so that every error answer has `reason_code` and `reason`.
pub(crate) fn run_summary(r: &RunResult) -> Option<(ReasonCode, String)> {
    let wanted = match r.status {
        RunStatus::Success | RunStatus::SimulatedSuccess => return None,
        RunStatus::Blocked => ActionStatus::Blocked,
        RunStatus::Failed | RunStatus::RolledBack => ActionStatus::Failed,
    };
    let bad: Vec<_> = r
        .actions
        .iter()
        .filter(|a| a.status == wanted && a.reason_code.is_some())
        .collect();
    let first = bad.first()?;
    let code = first.reason_code?;
    let why = first.reason.as_deref().unwrap_or(code.as_str());
    let more = match bad.len() {
        1 => String::new(),
        n => format!(" (and {} more refused)", n - 1),
    };
    let any = |s: ActionStatus| r.actions.iter().any(|a| a.status == s);
    let reason = match r.status {
        // The first action's wait is its own; the plan passes once every write of it may.
        RunStatus::Blocked
            if bad.len() > 1
                && let Some(secs) = rate_limited_for(r) =>
        {
            format!(
                "the plan was refused and nothing was written: action {}: {why}{more}; the whole plan can be sent again in {secs} seconds",
                first.action_id
            )
        }
        RunStatus::Blocked => format!(
            "the plan was refused and nothing was written: action {}: {why}{more}",
            first.action_id
        ),
        // A write its plan's rollback could not undo (another program changed the file
        // meanwhile) keeps the restore's reason.
        _ if r
            .actions
            .iter()
            .any(|a| a.status == ActionStatus::Success && a.reason_code.is_some()) =>
        {
            format!(
                "action {} failed: {why}; some of the run's earlier writes could not be undone (see each action's reason)",
                first.action_id
            )
        }
        _ if any(ActionStatus::Success) => format!(
            "action {} failed: {why}; the run's earlier writes remain (see each action): roll the workflow back to undo them",
            first.action_id
        ),
        _ if any(ActionStatus::RolledBack) => format!(
            "action {} failed: {why}; the run's earlier changes were rolled back",
            first.action_id
        ),
        _ => format!(
            "action {} failed: {why}; the run had changed nothing else, so nothing of it remains",
            first.action_id
        ),
    };
    Some((code, reason))
}

/// The status of a rollback report: 200 when rolled back or simulated, the refusal's status when
/// refused (409 conflict, 404 no_rollback_data, 400 invalid_id, 422 for what no force
/// overrides: outside_sandbox, reserved_path, links and special files in the way), 500
/// when only the server's storage failed its steps (`io_error`, as for a plan), else 409
/// when a restore step failed.
pub(crate) fn rollback_status(r: &RollbackReport) -> StatusCode {
    if r.is_success() || r.is_simulated() {
        return StatusCode::OK;
    }
    // The reasons: the failed steps', and the report's own (every step went through and
    // only the trail could not record it).
    let reasons = r
        .steps
        .iter()
        .filter(|s| !s.restored)
        .map(|s| s.reason_code)
        .chain(r.reason_code.map(Some));
    match (r.status, r.reason_code) {
        (ailab_sandbox_core::sandbox::RollbackStatus::Refused, Some(code)) => refusal_status(code),
        _ if storage_only(reasons) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::CONFLICT,
    }
}

/// Whether a plan was refused or failed by the server's storage alone (see
/// [`storage_only`]), its reasons being those of its refused and failed actions and of
/// writes its rollback could not undo.
pub(crate) fn run_stopped_by_storage(r: &RunResult) -> bool {
    !matches!(r.status, RunStatus::Success | RunStatus::SimulatedSuccess)
        && storage_only(r.actions.iter().filter_map(|a| a.reason_code).map(Some))
}

/// Whether the server's own storage (a full disk, say) is all that stopped a plan or a
/// rollback: there is a reason, and each is `io_error`. That is 500: 422 would tell the
/// client to change a request that is fine, 409 that someone else got in the way.
fn storage_only(reasons: impl IntoIterator<Item = Option<ReasonCode>>) -> bool {
    let mut reasons = reasons.into_iter().peekable();
    reasons.peek().is_some() && reasons.all(|c| c == Some(ReasonCode::IoError))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ailab_sandbox_core::catalog::{MutationClass, RiskLevel};
    use ailab_sandbox_core::executor::ActionResult;
    use ailab_sandbox_core::workflow::WorkflowState;

    fn action(id: &str, status: ActionStatus, code: Option<ReasonCode>) -> ActionResult {
        ActionResult {
            mutation_class: Some(MutationClass::Create),
            reason_code: code,
            reason: code.map(|c| format!("because {c}")),
            ..ActionResult::new(id, "create_file", "a.md", status, RiskLevel::Medium)
        }
    }

    fn run(status: RunStatus, actions: Vec<ActionResult>) -> RunResult {
        RunResult {
            workflow_id: "wf".to_owned(),
            execution_id: "ex".to_owned(),
            status,
            simulation_only: false,
            dry_run_reason: None,
            state: WorkflowState::Failed,
            actions,
            timeline: Vec::new(),
        }
    }

    #[test]
    fn run_statuses() {
        assert_eq!(run_status(RunStatus::Success), StatusCode::OK);
        assert_eq!(run_status(RunStatus::SimulatedSuccess), StatusCode::OK);
        assert_eq!(
            run_status(RunStatus::Blocked),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(run_status(RunStatus::Failed), StatusCode::CONFLICT);
        assert_eq!(run_status(RunStatus::RolledBack), StatusCode::CONFLICT);
    }

    /// What the core says of an id is what the client hears, whichever check met it
    /// first; a lock held past the wait is busy (409), the system's own time-out a failure.
    #[test]
    fn a_storage_failure_keeps_the_cores_code() {
        let refused = Refusal::new(ReasonCode::InvalidId, "workflow id 'a b' has a space");
        let e = ApiError::storage(
            "read the trail",
            &ailab_sandbox_core::Error::InvalidId(refused),
        );
        assert_eq!(
            (e.status, e.reason_code),
            (StatusCode::BAD_REQUEST, "invalid_id")
        );
        assert!(e.reason.contains("a space"), "{}", e.reason);
        let io = |cause| ailab_sandbox_core::Error::Io {
            what: "read the audit trail",
            cause,
        };
        let busy = ailab_sandbox_core::confine::state::LockBusy::error("waited 5 s".into());
        let e = ApiError::storage("read the trail", &io(busy));
        assert_eq!(
            (e.status, e.reason_code),
            (StatusCode::CONFLICT, "conflict")
        );
        let e = ApiError::storage(
            "read the trail",
            &io(std::io::Error::from_raw_os_error(110)),
        );
        assert_eq!(
            (e.status, e.reason_code),
            (StatusCode::INTERNAL_SERVER_ERROR, "io_error")
        );
    }

    #[test]
    fn refusal_statuses() {
        assert_eq!(
            refusal_status(ReasonCode::InvalidPlan),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            refusal_status(ReasonCode::InvalidId),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            refusal_status(ReasonCode::NoRollbackData),
            StatusCode::NOT_FOUND
        );
        assert_eq!(refusal_status(ReasonCode::Conflict), StatusCode::CONFLICT);
        assert_eq!(
            refusal_status(ReasonCode::ChecksumMismatch),
            StatusCode::CONFLICT
        );
        assert_eq!(
            refusal_status(ReasonCode::RateLimited),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            refusal_status(ReasonCode::PathTraversal),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        for code in ReasonCode::ALL {
            let s = refusal_status(code);
            assert!(s.is_client_error() || code == ReasonCode::IoError, "{code}");
        }
    }

    #[test]
    fn summaries_name_the_first_bad_action() {
        let ok = run(
            RunStatus::Success,
            vec![action("a1", ActionStatus::Success, None)],
        );
        assert!(run_summary(&ok).is_none());
        let blocked = run(
            RunStatus::Blocked,
            vec![
                action("a1", ActionStatus::Skipped, None),
                action("a2", ActionStatus::Blocked, Some(ReasonCode::PathTraversal)),
                action(
                    "a3",
                    ActionStatus::Blocked,
                    Some(ReasonCode::BlockedExtension),
                ),
            ],
        );
        let (code, reason) = run_summary(&blocked).unwrap_or((ReasonCode::IoError, String::new()));
        assert_eq!(code, ReasonCode::PathTraversal);
        assert!(
            reason.contains("a2") && reason.contains("1 more"),
            "{reason}"
        );
        let failed = run(
            RunStatus::RolledBack,
            vec![
                action("a1", ActionStatus::RolledBack, None),
                action("a2", ActionStatus::Failed, Some(ReasonCode::IoError)),
            ],
        );
        let (code, reason) =
            run_summary(&failed).unwrap_or((ReasonCode::PathTraversal, String::new()));
        assert_eq!(code, ReasonCode::IoError);
        assert!(reason.contains("rolled back"), "{reason}");
        // on_failure "stop": what the run wrote before stays, or there is nothing; a
        // write the plan's rollback could not undo is no longer simply the run's.
        for (earlier, says) in [
            (vec![action("a1", ActionStatus::Success, None)], "remain"),
            (Vec::new(), "nothing of it remains"),
            (
                vec![action(
                    "a1",
                    ActionStatus::Success,
                    Some(ReasonCode::Conflict),
                )],
                "could not be undone",
            ),
        ] {
            let mut actions = earlier;
            actions.push(action(
                "a2",
                ActionStatus::Failed,
                Some(ReasonCode::IoError),
            ));
            actions.push(action("a3", ActionStatus::Skipped, None));
            let (_, reason) = run_summary(&run(RunStatus::Failed, actions))
                .unwrap_or((ReasonCode::PathTraversal, String::new()));
            assert!(reason.contains(says), "{reason}");
            assert!(!reason.contains("can be rolled back"), "{reason}");
        }
    }

    #[test]
    fn layer_statuses_become_json_codes() {
        let allow = HeaderValue::from_static("GET,HEAD");
        let e = ApiError::for_status(StatusCode::METHOD_NOT_ALLOWED, Some(&allow));
        assert_eq!(e.reason_code, codes::METHOD_NOT_ALLOWED);
        assert!(e.reason.contains("GET,HEAD"));
        assert_eq!(
            ApiError::for_status(StatusCode::PAYLOAD_TOO_LARGE, None).reason_code,
            codes::PAYLOAD_TOO_LARGE
        );
        let e = ApiError::for_status(StatusCode::BAD_GATEWAY, None);
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.reason_code, codes::INTERNAL_ERROR);
    }
}
