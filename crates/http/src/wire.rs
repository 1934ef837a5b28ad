//! Wire types owned by the HTTP face: request bodies and query strings it accepts, and
//! the documents it answers with besides the core's own serializable types.

use ailab_sandbox_core::RunResult;
use ailab_sandbox_core::artifact::ListedArtifact;
use serde::{Deserialize, Serialize};

/// Default `limit` of the list routes (the core's, as every face's).
pub const DEFAULT_LIST_LIMIT: u32 = ailab_sandbox_core::sandbox::DEFAULT_LIST_LIMIT as u32;
/// Largest `limit` the list routes accept.
pub const MAX_LIST_LIMIT: u32 = ailab_sandbox_core::sandbox::MAX_LIST_LIMIT as u32;

/// Every error answer: a stable code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable snake_case code (the core's reason codes, or one of
    /// [`crate::codes`]).
    pub reason_code: String,
    /// What was wrong, for people.
    pub reason: String,
}

/// Query of `GET /agentic/executions` and `GET /agentic/artifacts`. Unknown parameters
/// are refused, so a misspelt filter never silently returns everything.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// How many entries, newest first: 1 to [`MAX_LIST_LIMIT`], default
    /// [`DEFAULT_LIST_LIMIT`].
    /// (Taken as text, so that a bad value is named in the refusal.)
    #[serde(default)]
    pub limit: Option<String>,
    /// Only this workflow's entries (empty means no filter).
    #[serde(default)]
    pub workflow_id: Option<String>,
}

/// Optional body of `POST /agentic/rollback/{workflow_id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// Restore even over files changed since the workflow wrote them.
    #[serde(default)]
    pub force: bool,
    /// Roll back only this action. Left out, the whole workflow; `null` is refused (like
    /// a `null` force), since a client meaning one action and sending an unset variable
    /// would otherwise undo them all.
    #[serde(default, deserialize_with = "some_string")]
    pub action_id: Option<String>,
}

fn some_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// `GET /agentic/artifacts/{id}`.
#[derive(Debug, Clone, Serialize)]
pub struct ArtifactDoc {
    /// The artifact, marked whether its write was rolled back.
    pub artifact: ListedArtifact,
    /// Its ancestors, nearest first, marked the same way.
    pub lineage: Vec<ListedArtifact>,
}

/// `POST /agentic/plans`: the run result of SPEC §6, plus, when the run did not
/// succeed, the first refused or failed action's `reason_code` and a `reason` summing
/// the run up (so that every error answer carries both).
#[derive(Debug, Clone, Serialize)]
pub struct PlanResponse {
    /// The run result, field for field.
    #[serde(flatten)]
    pub result: RunResult,
    /// Present when the run was blocked, failed or rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<ailab_sandbox_core::ReasonCode>,
    /// Present when the run was blocked, failed or rolled back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    /// `ok` (a process that can no longer write answers 503 instead).
    pub status: &'static str,
}
