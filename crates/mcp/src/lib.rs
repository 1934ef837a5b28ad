//! `ailab-sandbox-mcp`: the MCP stdio face of the governed write runtime (SPEC §10).
//!
//! An agent client (opencode, Claude Code, Codex, …) launches `ailab-sandbox mcp` and
//! speaks MCP over its standard input and output. The server offers:
//!
//! - one tool per write intent of the catalog — the 11 of
//!   [`ailab_sandbox_core::catalog::OPERATIONS`], generated from it so the lists cannot
//!   drift — each running a one-action plan through [`Sandbox::run_plan`];
//! - read tools confined like the writes: `read_file`, `list_directory`, `get_file_info`;
//! - `rollback_workflow`, `rollback_action`, `list_artifacts`, `get_artifact`, `get_state`.
//!
//! One MCP session is one workflow (`wf_mcp_…`, generated when the server is built)
//! unless a call names its own `workflow_id`. A refusal, a failure or a dry-run
//! simulation is a normal tool result (refusals and failures with `isError: true` and
//! the reason code), never a protocol error. Standard output carries protocol frames
//! only; logs go through `tracing` (the binary sends them to standard error).
//!
//! At most [`MAX_CONCURRENT_CALLS`] (8) calls of a session run in the sandbox at once (a
//! semaphore). A call waits for its turn while watching the cancellation rmcp hands it (a
//! task-local token), so a call the client cancels before it starts never runs. The
//! session's input passes through `screen::pump` on its way to rmcp, which screens each
//! message's text and paces the calls (`screen::Flow`) and every request by its answer
//! (`answers::Answers`, told by the session's output, `Watched`, of each answer line it
//! flushes). A request reusing the id of one still unanswered, or of a call still under way
//! (`Flow` keeps the ids of the calls it passed on until they end), is dropped unrun: rmcp
//! keeps one entry per id. A client gone (standard output polled as closed, or an answer
//! that cannot be written) cancels the session's `gone` token: calls not started are
//! dropped unrun, and the session is cancelled once every slot of the semaphore is free
//! again. A session asked to stop ([`SandboxMcp::stop`]; SIGTERM or SIGINT for
//! [`run_stdio`]) reads no more of its input, and so ends as when the client closes it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ailab_sandbox_core::{Config, Sandbox};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::with_roots(vec!["/tmp/sbx".into()], "/tmp/sbx-state".into());
//! let sandbox = Arc::new(Sandbox::open(config)?);
//! ailab_sandbox_mcp::run_stdio(sandbox)?; // serves until the client closes stdin
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(clippy::print_stdout)]

mod answers;
mod render;
mod screen;
mod tools;

#[cfg(feature = "internals")]
#[doc(hidden)]
pub use screen::fuzz_screen;

use ailab_sandbox_core::Sandbox;
use ailab_sandbox_core::catalog::Operation;
use ailab_sandbox_core::confine::path::shown_path;
use ailab_sandbox_core::confine::root::PathKind;
use ailab_sandbox_core::context::DryRunReason;
use ailab_sandbox_core::plan::{self, Plan};
use ailab_sandbox_core::reason::{ReasonCode, Refusal};
use ailab_sandbox_core::sandbox::RollbackOptions;
use render::{error, ok, refusal, to_value};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, InitializeRequestParams,
    InitializeResult, JsonObject, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, SubscribeRequestParams, Tool,
    UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, RoleServer, ServerInitializeError};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tools::{Args, DEFAULT_LIST_LIMIT, ToolKind, ToolSpec};

/// The name the server gives in `serverInfo`.
pub const SERVER_NAME: &str = "ailab-sandbox";

/// Something that stopped the MCP server (as opposed to a refused tool call, which is a
/// normal tool result).
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The async runtime could not be built.
    #[error("could not start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The MCP session could not be initialized (the client did not open with a valid
    /// `initialize`, or the transport failed).
    #[error("the MCP session could not be initialized: {0}")]
    Initialize(Box<ServerInitializeError>),
    /// The session's task ended abnormally.
    #[error("the MCP session ended abnormally: {0}")]
    Session(tokio::task::JoinError),
}

/// The MCP server: an [`rmcp::ServerHandler`] over a shared [`Sandbox`].
///
/// Each value is one session, with its own workflow id; build one per connection.
#[derive(Debug, Clone)]
pub struct SandboxMcp {
    sandbox: Arc<Sandbox>,
    workflow_id: Arc<str>,
    tools: Arc<[ToolSpec]>,
    /// Shared by the clones of one session: see [`MAX_CONCURRENT_CALLS`].
    calls: Arc<tokio::sync::Semaphore>,
    /// The calls the session's input pump passed on, and how far they got.
    flow: Arc<screen::Flow>,
    /// Cancelled once no answer can reach the client (its end of the output is closed):
    /// calls not started by then are not run, since nobody would learn what they did.
    gone: CancellationToken,
    /// Cancelled when the session is asked to stop ([`SandboxMcp::stop`]; SIGTERM or
    /// SIGINT for [`run_stdio`]): its input then reads as ended.
    stopping: CancellationToken,
    /// The session's `initialize` has been answered: a later one is refused.
    initialized: Arc<std::sync::atomic::AtomicBool>,
}

tokio::task_local! {
    /// The token rmcp cancels when the client sends `notifications/cancelled` for the call
    /// being served; absent for calls made through [`SandboxMcp::call`].
    static CANCELLED: CancellationToken;
}

/// How many tool calls run in the sandbox at once; later ones wait their turn. rmcp
/// starts a task per request, so without a cap a client sending thousands of calls at once
/// would hold as many file contents in memory and as many blocking threads.
pub const MAX_CONCURRENT_CALLS: usize = 8;

/// A fresh session workflow id: `wf_mcp_` and 32 hex digits ordered by time.
fn session_workflow_id() -> String {
    let id = plan::new_workflow_id();
    let tail = id.strip_prefix("wf_").unwrap_or(&id);
    format!("wf_mcp_{tail}")
}

impl SandboxMcp {
    /// A session over `sandbox` with a new workflow id (`wf_mcp_…`).
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        Self::with_workflow_id(sandbox, session_workflow_id())
    }

    /// A session whose writes go to `workflow_id` unless a call names another. An invalid
    /// id is not refused here; every write and rollback then refuses with `invalid_id`.
    pub fn with_workflow_id(sandbox: Arc<Sandbox>, workflow_id: impl Into<String>) -> Self {
        let tools = tools::all_tools(&sandbox).into();
        Self {
            sandbox,
            workflow_id: workflow_id.into().into(),
            tools,
            calls: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_CALLS)),
            flow: Arc::default(),
            gone: CancellationToken::new(),
            stopping: CancellationToken::new(),
            initialized: Arc::default(),
        }
    }

    /// Ends the session as if the client had closed its input: nothing more is read
    /// from it, the calls read so far are run and answered, and then the session ends
    /// (what [`run_stdio`] does on SIGTERM or SIGINT, rather than die with a write half
    /// done, its temporary file left for the next start to remove).
    pub fn stop(&self) {
        self.stopping.cancel();
    }

    /// The session's workflow.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }

    /// The tool definitions, as `tools/list` returns them.
    pub fn tools(&self) -> Vec<Tool> {
        self.tools.iter().map(|t| t.tool.clone()).collect()
    }

    /// What `initialize` answers: server info, the tools capability and instructions.
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION"))
                    .with_title("ailab-sandbox: governed, reversible file writes"),
            )
            .with_instructions(self.instructions())
    }

    /// A write tool with the extension policy it runs under, for refusal advice.
    fn writer<'a>(&'a self, op: &'a Operation) -> render::Writer<'a> {
        render::Writer {
            op,
            policy: &self.sandbox.config().extensions,
        }
    }

    fn instructions(&self) -> String {
        let (_, dry_run_reason) = self.sandbox.execution_context();
        let phase = &self.sandbox.config().phase;
        let mode = match dry_run_reason {
            None => {
                "Writing is ENABLED on this server: write tools change files for real.".to_owned()
            }
            // Refused, not simulated: the flags are not what stops it.
            reason @ Some(DryRunReason::PhaseNotSupported) => format!(
                "Writing is NOT allowed on this server. Why: {}. Every write tool is refused (phase_not_supported); nothing is written. {}",
                render::dry_run_words(reason, phase),
                render::PHASE_HINT
            ),
            reason => format!(
                "Writing is NOT enabled on this server. Why: {}. Every write tool only simulates and reports what it would do; nothing is written. {}",
                render::dry_run_words(reason, phase),
                render::ENABLE_HINT
            ),
        };
        format!(
            "ailab-sandbox is a governed filesystem write runtime. Use its tools to create and edit text files, but only inside the sandbox roots: {roots}. \
Give paths relative to the first root (e.g. \"{example}\"), or relative to another root named in the call's 'root' (read and write tools alike); '..', '~' and absolute paths outside the roots are refused. \
There is no shell and no delete, move or chmod: files are never made executable. \
Each write tool checks the extension and size limit named in its description, the workflow's budget and its rate limit of {rate} writes per minute; \
then it snapshots the target, writes atomically, records an artifact (sha256; a folder create_directory makes is none) and an audit entry. \
Every write can be undone with rollback_action (one write) or rollback_workflow (all writes of a workflow). \
All writes of this session belong to workflow {wf} unless a call passes workflow_id. \
A refused or failed call returns isError with a reason_code, the reason and what to do instead; read it and adapt rather than retrying unchanged. \
Use read_file, list_directory and get_file_info to look before you write, sandbox_transform for small exact edits, and get_state to see the mode, roots and limits. \
Calls sent without waiting for their answers run together, in no set order: wait for a call's answer before sending one that depends on it (a write after another to the same file, a rollback after the write it undoes). {mode}",
            roots = self
                .sandbox
                .roots()
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            rate = self.sandbox.config().limits.writes_per_minute,
            wf = self.workflow_id,
            example = render::example_written_file(&self.sandbox.config().extensions),
        )
    }

    /// Runs one tool call. Unknown tools and bad arguments are `isError` results too.
    pub async fn call(&self, name: &str, arguments: Option<JsonObject>) -> CallToolResult {
        self.call_noted(name, arguments, None).await
    }

    /// [`Self::call`], for a call the session's screen refused (`refused`, see
    /// [`screen`]): its arguments did not arrive as sent, or were too many to read.
    async fn call_noted(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        refused: Option<Refusal>,
    ) -> CallToolResult {
        let spec = self.tools.iter().find(|t| t.name() == name);
        // A tool the server lacks is asked for as an intent a plan would hold, and is on
        // the trail as a plan's would be, whatever else is wrong with the call: an agent
        // probing for a shell or a delete leaves a trace. Every write operation is a
        // tool, so such a name is never one the core would run. Answered with what the
        // trail records (a phase that allows no writes is named before the intent, as
        // in a plan). Of a call the screen refused (its name may not be the one sent),
        // only a forbidden intent is taken as a probe; any other is answered with the
        // screen's refusal.
        let forbidden = |name: &str| ailab_sandbox_core::policy::never_allowed(name, None);
        let probed = match spec {
            Some(_) => None,
            None if refused.is_some() && !forbidden(name) => None,
            None => Some(
                self.audit_probe(name, arguments.as_ref())
                    .await
                    .unwrap_or_else(|| ailab_sandbox_core::policy::intent_refusal(name, None)),
            ),
        };
        // A write asking readably for a permission change keeps what its probe's record
        // names (the call's content is not copied for it).
        let asks_chmod = matches!(spec.map(|s| s.kind), Some(ToolKind::Write(_)))
            && arguments
                .as_ref()
                .and_then(|a| a.get("description"))
                .and_then(serde_json::Value::as_str)
                .is_some_and(|d| ailab_sandbox_core::policy::detect_chmod_intent(d).is_some());
        let probe_arguments: Option<JsonObject> = asks_chmod.then(|| {
            arguments
                .iter()
                .flatten()
                .filter(|(k, _)| matches!(k.as_str(), "workflow_id" | "path" | "description"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        });
        // A permission change asked for readably is a probe, whatever else is wrong with
        // the call (the screen's refusal, its arguments): on the trail, as the same
        // action in a plan refused unread.
        let chmod_probe = async |arguments: Option<&JsonObject>| {
            let recorded = self
                .audit_probe(name, arguments)
                .await
                .unwrap_or_else(|| ailab_sandbox_core::policy::intent_refusal(name, None));
            refusal(&recorded, None, ". Nothing was written.")
        };
        // A write would store other values, a read or rollback would act on another target
        // than the caller named, and a name given twice may not be the one it meant.
        // What the trail records is what the caller hears: a probe first.
        if let Some(r) = refused.filter(|_| probed.is_none()) {
            if probe_arguments.is_some() {
                return chmod_probe(probe_arguments.as_ref()).await;
            }
            return match spec.map(|s| s.kind) {
                Some(ToolKind::Write(op)) => {
                    refusal(&r, Some(self.writer(op)), ". Nothing was written.")
                }
                _ => refusal(&r, None, ". Nothing was done."),
            };
        }
        let (Some(spec), None) = (spec, &probed) else {
            let recorded =
                probed.unwrap_or_else(|| ailab_sandbox_core::policy::intent_refusal(name, None));
            return unknown_tool(name, recorded, &self.tools);
        };
        let args = match spec.parse(arguments.unwrap_or_default()) {
            Ok(a) => a,
            Err(_) if probe_arguments.is_some() => {
                return chmod_probe(probe_arguments.as_ref()).await;
            }
            Err(problem) => return render::bad_arguments(name, &problem),
        };
        tracing::debug!(tool = name, "tools/call");
        match spec.kind {
            ToolKind::Write(op) => self.write(op, args).await,
            ToolKind::ReadFile => self.read_file(args).await,
            ToolKind::ListDirectory => self.list_directory(args).await,
            ToolKind::GetFileInfo => self.get_file_info(args).await,
            ToolKind::RollbackWorkflow => self.rollback(args, None).await,
            ToolKind::RollbackAction => {
                let id = args.str("action_id");
                self.rollback(args, id).await
            }
            ToolKind::ListArtifacts => self.list_artifacts(args).await,
            ToolKind::GetArtifact => self.get_artifact(args).await,
            ToolKind::GetState => self.get_state().await,
        }
    }

    /// Runs `f` with the sandbox on the blocking pool (the runtime is synchronous and
    /// fsyncs); a panic there becomes an `isError` result, not a dead server.
    ///
    /// A call the client cancels while it waits for a slot never starts: the client was
    /// told nothing, so nothing may happen. Once started it runs to its end, as a plan
    /// must (a write stopped half way would be undone by recovery anyway).
    async fn blocking<T, F>(&self, f: F) -> Result<T, CallToolResult>
    where
        T: Send + 'static,
        F: FnOnce(&Sandbox) -> T + Send + 'static,
    {
        self.on_pool(f, CANCELLED.try_with(CancellationToken::clone).ok())
            .await
    }

    async fn on_pool<T, F>(
        &self,
        f: F,
        cancel: Option<CancellationToken>,
    ) -> Result<T, CallToolResult>
    where
        T: Send + 'static,
        F: FnOnce(&Sandbox) -> T + Send + 'static,
    {
        let sb = Arc::clone(&self.sandbox);
        let cancel = cancel.unwrap_or_default();
        // The semaphore is never closed, so acquiring only waits.
        let _permit = tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            () = self.gone.cancelled() => None,
            p = self.calls.acquire() => Some(p),
        };
        if self.gone.is_cancelled() {
            tracing::info!("a call the client can no longer be answered for was not run");
            return Err(error(
                "the client is gone (its end of the output is closed); nothing was done".to_owned(),
                None,
            ));
        }
        if cancel.is_cancelled() {
            tracing::info!("a call cancelled by the client before it started was not run");
            return Err(error(
                "the call was cancelled by the client before it started; nothing was done"
                    .to_owned(),
                None,
            ));
        }
        tokio::task::spawn_blocking(move || f(&sb))
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "a sandbox call panicked or was cancelled");
                internal_error("the runtime failed while handling this call")
            })
    }

    /// Puts a tool the server lacks, asked for, on the audit trail as a blocked action
    /// with that name as its intent, as a plan holding it is (SPEC §8): an agent probing
    /// for a shell or a delete leaves a trace. Its workflow is the one it names, if
    /// valid, else the session's; nothing else of its arguments is trusted but its path
    /// and description, as text. Returns the refusal the trail records.
    async fn audit_probe(&self, intent: &str, arguments: Option<&JsonObject>) -> Option<Refusal> {
        let text = |k: &str| {
            arguments
                .and_then(|a| a.get(k))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        let workflow_id = text("workflow_id")
            .filter(|w| plan::is_valid_id(w))
            .unwrap_or_else(|| self.workflow_id.to_string());
        let plan = Plan {
            workflow_id: Some(workflow_id),
            actions: vec![plan::Action {
                intent: intent.to_owned(),
                path: text("path").unwrap_or_default(),
                description: text("description"),
                tool: Some("mcp".to_owned()),
                ..plan::Action::default()
            }],
            ..Plan::default()
        };
        // Cancelling the call must not wipe its trace.
        match self.on_pool(move |sb| sb.run_plan(plan), None).await {
            Ok(Ok(res)) => res
                .actions
                .into_iter()
                .next()
                .and_then(|a| Some(Refusal::new(a.reason_code?, a.reason.unwrap_or_default()))),
            Ok(Err(r)) => {
                tracing::warn!(reason = %r, "could not audit a call of a tool the server lacks");
                None
            }
            Err(_) => None,
        }
    }

    async fn write(&self, op: &'static Operation, mut args: Args) -> CallToolResult {
        let workflow_id = args
            .str("workflow_id")
            .unwrap_or_else(|| self.workflow_id.to_string());
        let root = args.str("root");
        let action = plan::Action {
            intent: op.name.to_owned(),
            path: args.str("path").unwrap_or_default(),
            content: args.str("content"),
            data: args.take_value("data"),
            edits: args.take_edits("edits"),
            description: args.str("description"),
            root: root.clone(),
            tool: Some("mcp".to_owned()),
            ..plan::Action::default()
        };
        let plan = Plan {
            workflow_id: Some(workflow_id),
            actions: vec![action],
            ..Plan::default()
        };
        let phase = self.sandbox.config().phase.clone();
        match self.blocking(move |sb| sb.run_plan(plan)).await {
            Ok(Ok(res)) => render::write_result(
                &res,
                self.writer(op),
                &self.workflow_id,
                &phase,
                root.as_deref(),
            ),
            Ok(Err(r)) => refusal(&r, Some(self.writer(op)), ". Nothing was written."),
            Err(e) => e,
        }
    }

    async fn read_file(&self, args: Args) -> CallToolResult {
        let path = args.str("path").unwrap_or_default();
        let root = args.str("root");
        match self
            .blocking(move |sb| sb.read_file(&path, root.as_deref()))
            .await
        {
            Ok(Ok(f)) => {
                // The text goes into both blocks: moved into one, not copied a third time
                // (a file of some megabytes, and calls may be many).
                let (invalid_at, size) = (f.invalid_utf8_at, f.size_bytes);
                let structured = to_value(&f);
                let mut r = ok(f.content, structured);
                if let Some(at) = invalid_at {
                    // A separate block, so that the first one stays the file's text.
                    r.content.push(rmcp::model::ContentBlock::text(format!(
                        "Note: this file is not valid UTF-8 (first invalid byte at offset {at} of {size}): each invalid sequence is shown as U+FFFD, so the text above is not the file's exact bytes; size_bytes and sha256 are of the bytes on disk."
                    )));
                }
                r
            }
            Ok(Err(r)) => render::read_refusal(&r, ". Nothing was read."),
            Err(e) => e,
        }
    }

    /// Where a read tool says `path` is, with several roots: ` in root R` (the root
    /// given, else the first), or nothing where it is plain (one root, or an absolute
    /// path, which names its root itself).
    fn in_root(&self, path: &str, root: Option<&str>) -> String {
        match self.sandbox.roots().as_slice() {
            [_] | [] => String::new(),
            _ if path.starts_with('/') && !is_top(path) => String::new(),
            [first, ..] => format!(
                " in root {}",
                root.map_or_else(|| first.display().to_string(), str::to_owned)
            ),
        }
    }

    async fn list_directory(&self, args: Args) -> CallToolResult {
        let path = args.str("path").unwrap_or_default();
        let root = args.str("root");
        let offset = args.uint("offset").unwrap_or(0);
        let p = path.clone();
        let in_root = self.in_root(&path, root.as_deref());
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        match self
            .blocking(move |sb| {
                sb.list_directory_page(&p, root.as_deref(), from, tools::MAX_DIR_ENTRIES)
            })
            .await
        {
            Ok(Ok(page)) => {
                let shown = if is_top(&path) {
                    format!("/ (the root){in_root}")
                } else {
                    format!("{path}{in_root}")
                };
                let (entries, total, next_offset) = (page.entries, page.total, page.next_offset);
                let from = from.min(total);
                let to = next_offset.unwrap_or(total);
                let counted = if total == 1 {
                    "1 entry".to_owned()
                } else {
                    format!("{total} entries")
                };
                let mut text = if total == 0 {
                    format!("Directory {shown} is empty.")
                } else if from == 0 && next_offset.is_none() {
                    format!("Directory {shown}: {counted}")
                } else if entries.is_empty() {
                    format!("Directory {shown}: {counted}, none from offset {offset}")
                } else {
                    format!(
                        "Directory {shown}: entries {} to {to} of {total} in name order",
                        from + 1
                    )
                };
                if let Some(next) = next_offset {
                    text.push_str(&format!(
                        "; for the next ones call list_directory again with offset {next}"
                    ));
                }
                for e in &entries {
                    let size = e
                        .size_bytes
                        .map_or_else(String::new, |n| format!("  ({})", render::bytes(n)));
                    let slash = if e.kind == PathKind::Directory {
                        "/"
                    } else {
                        ""
                    };
                    // A name is one line of the list, read as it is written: what would
                    // break it or hide in it is escaped.
                    let shown_otherwise = e
                        .name
                        .chars()
                        .any(ailab_sandbox_core::confine::path::shows_otherwise);
                    let unaddressable = e.name.chars().any(char::is_control)
                        || e.name.contains('\u{FFFD}')
                        || ailab_sandbox_core::confine::path::detect_misleading_name(&e.name)
                            .is_err();
                    let name = if shown_otherwise {
                        render::escaped_name(&e.name)
                    } else {
                        e.name.clone()
                    };
                    let note = if e.name.eq_ignore_ascii_case(".rollback") {
                        "  (reserved: rollback snapshots, never writable)"
                    } else if e.not_utf8 {
                        "  (the name is not UTF-8, shown with U+FFFD where its bytes are not text: no tool can address it)"
                    } else if e.name.contains('\u{FFFD}') {
                        "  (the name holds U+FFFD, which listings show for bytes that are not text, so no path may hold it: no tool can address it)"
                    } else if unaddressable {
                        "  (control, bidirectional, invisible, slash-like or dot-like characters in the name: no tool can address it)"
                    } else if shown_otherwise {
                        "  (shown escaped: the name holds characters readers do not show, or that look like a slash or a dot; give them as they are to address it)"
                    } else if e.other_links {
                        "  (has other hard links, so it may be a file outside the sandbox: never read or written)"
                    } else {
                        ""
                    };
                    text.push_str(&format!("\n{:<9} {name}{slash}{size}{note}", e.kind));
                }
                ok(
                    text,
                    Some(serde_json::json!({
                        "path": path,
                        "total": total,
                        "offset": offset,
                        "next_offset": next_offset,
                        "entries": entries,
                    })),
                )
            }
            Ok(Err(r)) => render::read_refusal(&r, "."),
            Err(e) => e,
        }
    }

    async fn get_file_info(&self, args: Args) -> CallToolResult {
        let path = args.str("path").unwrap_or_default();
        let root = args.str("root");
        let top =
            is_top(&path).then(|| format!("/ (the root){}", self.in_root(&path, root.as_deref())));
        match self
            .blocking(move |sb| sb.get_file_info(&path, root.as_deref()))
            .await
        {
            Ok(Ok(info)) => {
                let shown = top.unwrap_or_else(|| render::shown_name(&info.path).into_owned());
                let mut text = format!("{shown}: {}", info.kind);
                if let Some(n) = info.size_bytes {
                    text.push_str(&format!(", {}", render::bytes(n)));
                }
                match (&info.sha256, info.kind) {
                    (Some(s), _) => text.push_str(&format!(", sha256 {s}")),
                    (None, PathKind::File) => {
                        text.push_str(", not hashed (over 1 GiB)");
                    }
                    _ => {}
                }
                if let Some(a) = &info.artifact_id {
                    text.push_str(&format!(", newest artifact {a}"));
                }
                ok(text, to_value(&info))
            }
            Ok(Err(r)) => render::read_refusal(&r, "."),
            Err(e) => e,
        }
    }

    async fn rollback(&self, args: Args, action_id: Option<String>) -> CallToolResult {
        let workflow_id = args
            .str("workflow_id")
            .unwrap_or_else(|| self.workflow_id.to_string());
        // An id the refusal will call invalid is quoted, so that an empty or odd one is
        // seen as sent.
        let shown = |id: &str| {
            if ailab_sandbox_core::plan::is_valid_id(id) {
                id.to_owned()
            } else {
                shown_path(id)
            }
        };
        let whole_workflow = action_id.is_none();
        let what = match &action_id {
            Some(a) => format!("action {} of workflow {}", shown(a), shown(&workflow_id)),
            None => format!("workflow {}", shown(&workflow_id)),
        };
        let opts = RollbackOptions {
            action_id,
            force: args.flag("force"),
        };
        match self
            .blocking(move |sb| sb.rollback_workflow(&workflow_id, &opts))
            .await
        {
            Ok(rep) => render::rollback_result(&rep, &what, whole_workflow),
            Err(e) => e,
        }
    }

    async fn list_artifacts(&self, args: Args) -> CallToolResult {
        let limit =
            usize::try_from(args.uint("limit").unwrap_or(DEFAULT_LIST_LIMIT)).unwrap_or(usize::MAX);
        let workflow_id = args.str("workflow_id");
        if let Some(Err(r)) = workflow_id
            .as_deref()
            .map(|w| ailab_sandbox_core::plan::check_id("workflow_id", w))
        {
            return refusal(&r, None, "");
        }
        let wf = workflow_id.clone();
        // Whose write was rolled back, so that no listed file is taken for what it holds.
        let listed = move |sb: &Sandbox| {
            // The agent is shown no path outside the roots: a state directory shared
            // with a runtime of other roots records their writes too.
            let list = sb.marked(sb.artifacts_in_roots(limit, wf.as_deref())?)?;
            let undone: Vec<String> = list
                .iter()
                .filter(|l| l.rolled_back)
                .map(|l| l.entry.artifact_id.clone())
                .collect();
            Ok::<_, ailab_sandbox_core::Error>((list, undone))
        };
        match self.blocking(listed).await {
            Ok(Ok((list, undone))) => {
                let scope = workflow_id.map_or_else(String::new, |w| format!(" of workflow {w}"));
                let mut text = if list.is_empty() {
                    format!("No artifacts{scope}.")
                } else {
                    format!("{} artifact(s){scope}, newest first:", list.len())
                };
                for l in &list {
                    let a = &l.entry;
                    text.push_str(&format!(
                        "\n{} {} {} ({}, sha256 {}) workflow {} action {} at {}{}",
                        a.artifact_id,
                        a.mutation_type,
                        render::shown_name(&a.path),
                        render::bytes(a.size_bytes),
                        a.checksum_sha256,
                        a.workflow_id,
                        a.action_id,
                        a.created_at,
                        undone_mark(l.rolled_back)
                    ));
                }
                ok(
                    text,
                    Some(serde_json::json!({"artifacts": list, "rolled_back": undone})),
                )
            }
            Ok(Err(e)) => storage_failure(&e),
            Err(e) => e,
        }
    }

    async fn get_artifact(&self, args: Args) -> CallToolResult {
        const FIND_IT: &str = "check the id: list_artifacts lists the artifacts (newest first, optionally of one workflow), and each write's result names its artifact_id.";
        let id = args.str("artifact_id").unwrap_or_default();
        if let Err(r) = plan::check_id("artifact_id", &id) {
            return render::refusal_advising(&r, ".", FIND_IT);
        }
        let lookup = id.clone();
        let found = move |sb: &Sandbox| {
            // One written in a root this server lacks is not told, as list_artifacts
            // does not list it; each is marked as list_artifacts marks them.
            let found = sb
                .marked_with_lineage(&lookup)?
                .filter(|(a, _)| sb.in_roots(&a.entry.path))
                .map(|(a, mut lineage)| {
                    lineage.retain(|l| sb.in_roots(&l.entry.path));
                    (a, lineage)
                });
            Ok::<_, ailab_sandbox_core::Error>(found)
        };
        match self.blocking(found).await {
            Ok(Ok(Some((shown, lineage)))) => {
                let a = &shown.entry;
                let mut text = format!(
                    "{} {} {} ({}, sha256 {}){}\nworkflow {} action {} at {}\nparent artifact: {}",
                    a.artifact_id,
                    a.mutation_type,
                    render::shown_name(&a.path),
                    render::bytes(a.size_bytes),
                    a.checksum_sha256,
                    undone_mark(shown.rolled_back),
                    a.workflow_id,
                    a.action_id,
                    a.created_at,
                    a.parent_artifact_id.as_deref().unwrap_or("none"),
                );
                if lineage.is_empty() {
                    text.push_str("\nlineage: none (it derives from no earlier artifact)");
                } else {
                    text.push_str("\nlineage, nearest first:");
                    for l in &lineage {
                        text.push_str(&format!(
                            "\n- {} {} {} sha256 {}{}",
                            l.entry.artifact_id,
                            l.entry.mutation_type,
                            render::shown_name(&l.entry.path),
                            l.entry.checksum_sha256,
                            undone_mark(l.rolled_back)
                        ));
                    }
                }
                let lineage_undone: Vec<&str> = lineage
                    .iter()
                    .filter(|l| l.rolled_back)
                    .map(|l| l.entry.artifact_id.as_str())
                    .collect();
                ok(
                    text,
                    Some(serde_json::json!({
                        "artifact": shown,
                        "lineage": lineage,
                        "rolled_back": shown.rolled_back,
                        "lineage_rolled_back": lineage_undone,
                    })),
                )
            }
            Ok(Ok(None)) => render::refusal_advising(
                &Refusal::new(
                    ReasonCode::NotFound,
                    format!("there is no artifact with id {id:?} in this server's roots"),
                ),
                ".",
                FIND_IT,
            ),
            Ok(Err(e)) => storage_failure(&e),
            Err(e) => e,
        }
    }

    async fn get_state(&self) -> CallToolResult {
        let doc = match self.blocking(|sb| sb.state_doc()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return storage_failure(&e),
            Err(e) => return e,
        };
        let mode = match doc.dry_run_reason {
            None => "writes are real (sandbox_write)".to_owned(),
            reason @ Some(DryRunReason::PhaseNotSupported) => format!(
                "writes are refused ({})",
                render::dry_run_words(reason, &doc.phase)
            ),
            reason => format!(
                "writes are only simulated ({})",
                render::dry_run_words(reason, &doc.phase)
            ),
        };
        let text = format!(
            "execution_mode: {} — {mode}\nphase: {}\nexecutor_enabled: {}\ndry_run: {}\nsandbox_roots: {}\nsession workflow_id: {}\nlimits: {} artifacts, {} bytes and {} writes per minute per workflow, path depth {}\nartifacts_total: {}\naudit_entries: {}\nversion: {}",
            serde_json::to_value(doc.execution_mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            doc.phase,
            doc.executor_enabled,
            doc.dry_run,
            doc.sandbox_roots.join(", "),
            self.workflow_id,
            doc.limits.max_artifacts_per_workflow,
            doc.limits.max_workflow_bytes,
            doc.limits.writes_per_minute,
            doc.limits.max_path_depth,
            doc.artifacts_total,
            doc.audit_entries,
            doc.version,
        );
        let mut structured = to_value(&doc);
        if let Some(serde_json::Value::Object(m)) = &mut structured {
            m.insert(
                "session_workflow_id".into(),
                self.workflow_id.to_string().into(),
            );
            // The agent is shown no path outside the roots: the state directory and
            // the roots refused at start (named with the folders above them) are the
            // operator's (`state` and `/agentic/state` give them), and so is a notice
            // naming the state directory (one the default could not be used for).
            m.remove("state_dir");
            m.remove("skipped_roots");
            if let Some(serde_json::Value::Array(notices)) = m.get_mut("notices") {
                notices.retain(|n| n.as_str().is_none_or(|n| !n.contains(&doc.state_dir)));
            }
            if let Some(serde_json::Value::Array(writable)) = m
                .get_mut("kernel_confinement")
                .and_then(|k| k.get_mut("writable"))
            {
                writable.retain(|w| {
                    w.as_str()
                        .is_some_and(|w| doc.sandbox_roots.iter().any(|r| r == w))
                });
            }
        }
        ok(text, structured)
    }
}

/// The answer to a tool name the server lacks, with `recorded`, the refusal a plan asking
/// for it as an intent gets (a forbidden intent, `delete_file`, `run_command`, …, is
/// `forbidden_intent` as on the CLI and HTTP; a name that is no operation
/// `unknown_operation` or `not_sandbox_write`).
fn unknown_tool(name: &str, recorded: Refusal, tools: &[ToolSpec]) -> CallToolResult {
    let names: Vec<&str> = tools.iter().map(ToolSpec::name).collect();
    let code = recorded.reason_code;
    // Cut as the trail cuts it: a name of megabytes is not said back whole, twice.
    let name = ailab_sandbox_core::confine::path::shown_path(name);
    // A trail that could not take the probe's line: said, whatever the words.
    let unaudited = recorded
        .reason
        .find(ailab_sandbox_core::executor::UNAUDITED)
        .map_or("", |at| &recorded.reason[at..]);
    let r = match code {
        // Said here, not in governance's words: those list the write intents, which
        // what to do lists again as this server's tools.
        ReasonCode::ForbiddenIntent => Refusal::new(
            code,
            format!("{name} is a forbidden intent, never executed; no tool offers it{unaudited}"),
        ),
        // A permission change: no tool offers one either.
        ReasonCode::ChmodForbidden => {
            Refusal::new(code, format!("{}; no tool offers it", recorded.reason))
        }
        // Refused first for what the phase allows, as a plan asking for it would be.
        ReasonCode::PhaseNotSupported => Refusal::new(
            code,
            format!(
                "{}; besides, this server has no tool named {name}",
                recorded.reason
            ),
        ),
        _ => Refusal::new(
            code,
            format!(
                "there is no tool named {name}; the tools are: {}{unaudited}",
                names.join(", ")
            ),
        ),
    };
    refusal(&r, None, ". Nothing was done.")
}

/// A log of the state directory that could not be read: held by another process of the
/// runtime past `limits.lock_wait_seconds` (`conflict`, to retry), else a failure.
fn storage_failure(e: &ailab_sandbox_core::Error) -> CallToolResult {
    if let ailab_sandbox_core::Error::InvalidId(r) = e {
        return refusal(r, None, ". Nothing was done.");
    }
    if e.is_busy() {
        let r = Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{e}: another process of the runtime held it (a long write, or a stopped or hung process)"
            ),
        );
        return failed(
            &r,
            ". Nothing was done",
            "the runtime is busy, nothing is wrong: call this tool again in a moment.",
        );
    }
    internal_error(&e.to_string())
}

fn internal_error(what: &str) -> CallToolResult {
    let r = Refusal::new(ReasonCode::IoError, what.to_owned());
    failed(&r, "", &render::what_to_do(r.reason_code, None))
}

/// `FAILED (<code>): <reason><tail>.` and what to do, for a call the runtime could not
/// carry out (rather than one it refused).
fn failed(r: &Refusal, tail: &str, advice: &str) -> CallToolResult {
    error(
        format!(
            "FAILED ({}): {}{tail}.\nWhat to do instead: {advice}",
            r.reason_code,
            render::clause(&r.reason),
        ),
        Some(serde_json::json!({"reason_code": r.reason_code, "reason": r.reason})),
    )
}

impl ServerHandler for SandboxMcp {
    fn get_info(&self) -> ServerConfig {
        self.server_config()
    }

    /// Once per session, as its first request: a second `initialize` would change the
    /// protocol version the answers are written in, mid-session, and speak of
    /// capabilities already agreed. rmcp hands the handler the session's opening
    /// `initialize` before any other request, the client's details already kept; a
    /// session a request opened by naming its version inline keeps none, whatever order
    /// rmcp's tasks then run in.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if context.peer.peer_info().is_none()
            || self
                .initialized
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(ErrorData::invalid_request(
                "this session is already initialized: initialize is sent once, as the first request, and the protocol version agreed then stays; go on with the session, or open a new one to start over",
                None,
            ));
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Every tool comes in one page, with no cursor: any cursor sent was never given.
        if let Some(cursor) = request.and_then(|r| r.cursor) {
            return Err(ErrorData::invalid_params(
                format!(
                    "cursor {} was not given by this server: it lists every tool in one page, with no nextCursor; send tools/list without a cursor",
                    shown_path(&cursor)
                ),
                None,
            ));
        }
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Where rmcp leaves the call's `_meta`: in the request's context.
        let refused = request
            .meta
            .as_ref()
            .and_then(|m| screen::refusal_in(&m.0.0))
            .or_else(|| screen::refusal_in(&context.meta.0.0));
        let serving = self
            .flow
            .serve(serde_json::to_value(&context.id).ok().as_ref());
        // Cancelled while the pump held it: the call sees itself cancelled before it
        // starts (rmcp may begin it before the pump's own cancellation reaches it).
        let cancelled = serving.cancelled_before_start();
        let token = if cancelled {
            let t = CancellationToken::new();
            t.cancel();
            t
        } else {
            context.ct.clone()
        };
        let call = self.call_noted(&request.name, request.arguments, refused);
        let result = CANCELLED.scope(token, call).await;
        if cancelled {
            // The pump's cancellation follows the call: once rmcp has it, it answers
            // nothing, as for any call the client cancelled.
            let _ = tokio::time::timeout(screen::SETTLE, context.ct.cancelled()).await;
        }
        Ok(result.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.tool.clone())
    }

    // The other MCP features, which the capabilities do not advertise: refused with a
    // sentence, as the SDK's own refusal names only the method.

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Err(not_offered("resources/list"))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Err(not_offered("resources/templates/list"))
    }

    async fn read_resource(
        &self,
        _request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Err(not_offered("resources/read"))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Err(not_offered("prompts/list"))
    }

    async fn get_prompt(
        &self,
        _request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Err(not_offered("prompts/get"))
    }

    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        Err(not_offered("completion/complete"))
    }

    async fn subscribe(
        &self,
        _request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Err(not_offered("resources/subscribe"))
    }

    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Err(not_offered("resources/unsubscribe"))
    }
}

/// The refusal of `method`, a feature of MCP this server does not offer.
fn not_offered(method: &str) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!(
            "{method} is not offered: this server has tools only (its capabilities say so); list them with tools/list and use them with tools/call"
        ),
        None,
    )
}

/// The largest message a client may send: the HTTP face's default body limit.
pub const MAX_MESSAGE_BYTES: usize = ailab_sandbox_core::config::DEFAULT_MAX_BODY_BYTES;

/// Serves one MCP session over `reader`/`writer` until the client closes its end.
/// A client that disconnects before `initialize` ends the session cleanly too.
pub async fn serve_io<R, W>(server: SandboxMcp, reader: R, writer: W) -> Result<(), McpError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    // The messages' text passes through `screen::pump` on its way to rmcp, which sees
    // only parsed values (see `screen`).
    let (to_rmcp, rmcp_input) = tokio::io::duplex(64 * 1024);
    let flow = Arc::clone(&server.flow);
    let reader = Stoppable::new(reader, server.stopping.clone());
    tokio::spawn(async move { screen::pump(reader, to_rmcp, MAX_MESSAGE_BYTES, &flow).await });
    // A message must fit whatever the operations accept once JSON-escaped (a content of
    // control characters grows sixfold), as the HTTP body limit does; rmcp's default of
    // 16 MiB would drop such calls without an answer. It counts the newline, and must
    // take every line the screen passes on (which enforces the limit itself).
    let writer = Watched {
        inner: writer,
        gone: server.gone.clone(),
        flow: Arc::clone(&server.flow),
    };
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(rmcp_input, writer)
        .with_max_line_length(MAX_MESSAGE_BYTES + screen::MAX_GROWTH + 2);
    let (calls, gone) = (Arc::clone(&server.calls), server.gone.clone());
    let running = match server.serve(transport).await {
        Ok(r) => r,
        Err(ServerInitializeError::ConnectionClosed(why)) => {
            tracing::info!(%why, "the client closed the connection before initializing");
            return Ok(());
        }
        Err(e) => return Err(McpError::Initialize(Box::new(e))),
    };
    // A client gone for good (it may keep its input open) ends the session once the
    // calls under way are done: none is cut short, and no answer could reach it.
    let stop = running.cancellation_token();
    tokio::spawn(async move {
        gone.cancelled().await;
        let _all = calls.acquire_many_owned(MAX_CONCURRENT_CALLS as u32).await;
        tracing::info!("the client is gone and no call is under way: the session ends");
        stop.cancel();
    });
    match running.waiting().await {
        Ok(rmcp::service::QuitReason::JoinError(e)) | Err(e) => Err(McpError::Session(e)),
        Ok(reason) => {
            tracing::info!(?reason, "MCP session ended");
            Ok(())
        }
    }
}

/// Serves MCP over standard input/output until the client closes standard input (EOF),
/// or SIGTERM or SIGINT asks it to stop, then returns. Builds its own tokio runtime;
/// call it from synchronous code.
///
/// For a program of its own, as the `ailab-sandbox` binary is: it takes SIGINT and
/// SIGTERM over for the rest of the process's life (Tokio's handlers are never removed),
/// so that after it returns neither ends the process any more. A host with signal
/// handling of its own serves with [`serve_io`] and ends the session with
/// [`SandboxMcp::stop`].
pub fn run_stdio(sandbox: Arc<Sandbox>) -> Result<(), McpError> {
    ailab_sandbox_core::confine::kernel::room_for_a_runtime().map_err(McpError::Runtime)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ailab-sandbox-mcp")
        .build()
        .map_err(McpError::Runtime)?;
    let server = SandboxMcp::new(sandbox);
    tracing::info!(
        workflow_id = server.workflow_id(),
        "MCP server listening on stdin/stdout"
    );
    let (gone, stopping) = (server.gone.clone(), server.stopping.clone());
    let result = runtime.block_on(async move {
        tokio::spawn(async move {
            stop_asked().await;
            tracing::info!(
                "asked to stop: the calls read so far are run and answered, then the session ends"
            );
            stopping.cancel();
        });
        // Learnt at once, not at the next answer, which a call waiting on a lock may
        // give only after a while.
        tokio::spawn(async move {
            stdout_closed().await;
            tracing::info!("the client closed its end of standard output");
            gone.cancel();
        });
        serve_io(server, tokio::io::stdin(), tokio::io::stdout()).await
    });
    // A blocking stdin read may still be pending if the session ended for another reason.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Resolves at the first SIGTERM or SIGINT; never, where they cannot be caught.
async fn stop_asked() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// The session's input, which fails once `stop` is cancelled: the screen then ends the
/// session as for a client that closed its input (every call passed on answered first),
/// but drops a message it has only part of, whose sender is still writing it.
struct Stoppable<R> {
    inner: R,
    stop: CancellationToken,
    stopped: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<R> Stoppable<R> {
    fn new(inner: R, stop: CancellationToken) -> Self {
        let stopped = Box::pin(stop.clone().cancelled_owned());
        Self {
            inner,
            stop,
            stopped,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Stoppable<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // Polled to be woken by the stop while the read waits.
        if self.stop.is_cancelled() || self.stopped.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the session was asked to stop",
            )));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// Resolves once nobody reads standard output any more: a pipe or socket whose reading
/// end is closed (the client killed, say) polls as an error or hang-up. Looked at a few
/// times a second; never resolves for a terminal or a file.
async fn stdout_closed() {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let out = std::io::stdout();
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        let mut fds = [PollFd::new(&out, PollFlags::OUT)];
        match poll(&mut fds, Some(&now)) {
            Ok(_) if fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP) => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return std::future::pending().await,
        }
    }
}

/// The session's output, which marks the client gone when a write to it fails, and
/// tells the pump of each answer written (see `answers`).
struct Watched<W> {
    inner: W,
    gone: CancellationToken,
    flow: Arc<screen::Flow>,
}

impl<W: AsyncWrite + Unpin> Watched<W> {
    fn watch<T>(
        &self,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        if let std::task::Poll::Ready(Err(_)) = &polled {
            self.gone.cancel();
        }
        polled
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let inner = &mut this.inner;
        let polled = this
            .flow
            .answers
            .write_noted(buf, || std::pin::Pin::new(inner).poll_write(cx, buf));
        self.watch(polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        match &polled {
            std::task::Poll::Ready(Ok(())) => self.flow.answers.flushed(true),
            std::task::Poll::Pending => self.flow.answers.flushed(false),
            std::task::Poll::Ready(Err(_)) => {}
        }
        self.watch(polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(polled)
    }
}

/// What an artifact's line says after it when its write was rolled back.
fn undone_mark(undone: bool) -> &'static str {
    if undone {
        " (rolled back: this write was undone)"
    } else {
        ""
    }
}

/// Whether a read tool's `path` names a root's top: none, `.`, or `/` (its one trailing
/// slash dropped), said as the root's, not the filesystem's.
fn is_top(path: &str) -> bool {
    matches!(path, "" | "." | "/")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An id the core refused is answered as its refusal, a lock held past the wait as
    /// busy, the system's own time-out as a failure.
    #[test]
    fn a_storage_failure_keeps_the_cores_code() {
        let code = |e: ailab_sandbox_core::Error| {
            let r = storage_failure(&e);
            assert_eq!(r.is_error, Some(true));
            serde_json::to_string(&r.content).unwrap()
        };
        let refused = Refusal::new(ReasonCode::InvalidId, "workflow id 'a b' has a space");
        let said = code(ailab_sandbox_core::Error::InvalidId(refused));
        assert!(
            said.contains("(invalid_id)") && said.contains("a space"),
            "{said}"
        );
        let io = |cause| ailab_sandbox_core::Error::Io {
            what: "read the audit trail",
            cause,
        };
        let busy = ailab_sandbox_core::confine::state::LockBusy::error("waited 5 s".into());
        assert!(code(io(busy)).contains("(conflict)"));
        let said = code(io(std::io::Error::from_raw_os_error(110)));
        assert!(said.contains("(io_error)"), "{said}");
    }

    /// A session over a sandbox of one root in `dir`, writing off.
    fn simulating_server(dir: &std::path::Path) -> SandboxMcp {
        let config =
            ailab_sandbox_core::Config::with_roots(vec![dir.join("root")], dir.join("state"));
        SandboxMcp::new(Arc::new(Sandbox::open(config).unwrap()))
    }

    /// With every slot taken, a call waits; it runs as soon as one is free.
    #[tokio::test]
    async fn calls_beyond_the_cap_wait_for_a_slot() {
        let dir = tempfile::tempdir().unwrap();
        let server = simulating_server(dir.path());
        let held = Arc::clone(&server.calls)
            .acquire_many_owned(u32::try_from(MAX_CONCURRENT_CALLS).unwrap())
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let server = server.clone();
            async move { server.blocking(|_| 7).await.ok() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "a call ran with every slot taken");
        drop(held);
        assert_eq!(waiting.await.unwrap(), Some(7));
    }

    /// An output that takes each write into a buffer of its own at once and waits only
    /// in its flush, as tokio's standard output does.
    struct LikeStdout<W> {
        inner: W,
        buf: Vec<u8>,
    }

    impl<W: AsyncWrite + Unpin> LikeStdout<W> {
        fn drain(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            while !self.buf.is_empty() {
                match std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.buf) {
                    std::task::Poll::Ready(Ok(0)) => {
                        return std::task::Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    std::task::Poll::Ready(Ok(n)) => drop(self.buf.drain(..n)),
                    other => return other.map(|r| r.map(|_| ())),
                }
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for LikeStdout<W> {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::ready!(self.drain(cx))?;
            self.buf.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::ready!(self.drain(cx))?;
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::ready!(self.drain(cx))?;
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A client that sends requests and reads no answer has them held back once enough
    /// answers wait for it (each `tools/list` answer is some 25 KB that rmcp would hold),
    /// for as long as it reads nothing, whether the output waits in its writes or, as
    /// standard output does, in its flushes; it gets every one, in order, once it reads.
    #[tokio::test]
    async fn requests_wait_while_their_answers_are_unread() {
        for like_stdout in [false, true] {
            unread_answers_hold_requests_back(like_stdout).await;
        }
    }

    async fn unread_answers_hold_requests_back(like_stdout: bool) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let mut server = simulating_server(dir.path());
        // Requests that get no answer are let go of quickly, but not while the client
        // reads nothing.
        server.flow = Arc::new(screen::Flow::settling_in(Duration::from_millis(200)));
        let flow = Arc::clone(&server.flow);
        let (client, served) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(served);
        let session = if like_stdout {
            let w = LikeStdout {
                inner: w,
                buf: Vec::new(),
            };
            tokio::spawn(serve_io(server, r, w))
        } else {
            tokio::spawn(serve_io(server, r, w))
        };
        let (answers, mut input) = tokio::io::split(client);
        let mut answers = tokio::io::BufReader::new(answers).lines();
        let requests = 2_000;
        let mut text = String::from(HELLO);
        for id in 1..=requests {
            text.push_str(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\"}}\n"
            ));
        }
        // The input ends before the client reads: the session still answers them all.
        let writer = tokio::spawn(async move {
            input.write_all(text.as_bytes()).await.unwrap();
            input.shutdown().await.unwrap();
        });
        // Read by nobody, the answers fill the output's buffer and the rest wait, well
        // past the time a request with no answer counts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let passed = flow.answers.passed();
        assert!(
            passed <= (answers::MAX_UNANSWERED + 16) as u64,
            "{passed} requests passed on while their answers went unread (like stdout: {like_stdout})"
        );
        // Read slowly, one answer every 50 ms, for 2 s: the output moves, but no faster
        // than the client reads, and as many requests pass on as answers are read.
        let slowly = 40;
        for id in 0..=requests {
            if id <= slowly {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if id == slowly {
                let passed = flow.answers.passed();
                assert!(
                    passed <= (slowly as usize + answers::MAX_UNANSWERED + 16) as u64,
                    "{passed} requests passed on while {slowly} answers were read (like stdout: {like_stdout})"
                );
            }
            let line = tokio::time::timeout(Duration::from_secs(60), answers.next_line())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["id"], id, "{}", &line[..line.len().min(200)]);
            assert!(v["result"].is_object(), "{}", &line[..line.len().min(200)]);
        }
        writer.await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), session)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// A sandbox writing for real in `dir`'s `root`, its state in `state`.
    fn writing_sandbox(dir: &std::path::Path) -> Arc<Sandbox> {
        let mut config =
            ailab_sandbox_core::Config::with_roots(vec![dir.join("root")], dir.join("state"));
        config.enable_write = true;
        config.dry_run = false;
        Arc::new(Sandbox::open(config).unwrap())
    }

    /// A `create_file` call of id `id` writing "x" to `path`.
    fn create_call(id: u32, path: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_file","arguments":{{"path":"{path}","content":"x"}}}}}}"#
        )
    }

    /// A client's `initialize` (id 0) and `notifications/initialized`, as lines.
    const HELLO: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
"#;

    /// The next answer on `answers`, within 30 s.
    async fn next_answer(answers: &mut AnswerLines) -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(30), answers.next_line());
        serde_json::from_str(&line.await.unwrap().unwrap().unwrap()).unwrap()
    }

    type Session = tokio::task::JoinHandle<Result<(), McpError>>;
    type AnswerLines =
        tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>;

    /// A session of `server` over an in-memory pipe: its task, the lines of its answers
    /// and its input.
    fn in_memory(
        server: SandboxMcp,
    ) -> (
        Session,
        AnswerLines,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ) {
        use tokio::io::AsyncBufReadExt;
        let (client, served) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(served);
        let session = tokio::spawn(serve_io(server, r, w));
        let (answers, input) = tokio::io::split(client);
        (session, tokio::io::BufReader::new(answers).lines(), input)
    }

    /// A call cancelled while it waits for a slot is never run: no file, no audit line,
    /// no artifact, no answer; the session goes on.
    #[tokio::test]
    async fn a_call_cancelled_before_it_starts_does_nothing() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let sandbox = writing_sandbox(dir.path());
        let server = SandboxMcp::new(Arc::clone(&sandbox));
        let held = Arc::clone(&server.calls)
            .acquire_many_owned(u32::try_from(MAX_CONCURRENT_CALLS).unwrap())
            .await
            .unwrap();
        let (session, mut answers, mut input) = in_memory(server);
        let call = create_call;
        input.write_all(HELLO.as_bytes()).await.unwrap();
        for line in [
            call(1, "cancelled.txt"),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"gave up"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#.to_owned(),
        ] {
            input.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        }
        let mut next = async || next_answer(&mut answers).await;
        assert_eq!(next().await["id"], 0);
        // Messages are handled in order: the ping's answer means the cancel was seen.
        assert_eq!(next().await["id"], 2);
        drop(held);
        input
            .write_all(format!("{}\n", call(3, "after.txt")).as_bytes())
            .await
            .unwrap();
        let answer = next().await;
        assert_eq!(answer["id"], 3, "{answer}");
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        let root = dir.path().join("root");
        assert!(root.join("after.txt").exists());
        assert!(
            !root.join("cancelled.txt").exists(),
            "a cancelled call wrote"
        );
        let audited = sandbox.audit_entries(100, None).unwrap();
        assert!(
            audited
                .iter()
                .all(|e| !e.target_path.ends_with("cancelled.txt")),
            "{audited:?}"
        );
        assert_eq!(sandbox.artifacts(100, None).unwrap().len(), 1);
        drop((input, answers));
        session.await.unwrap().unwrap();
    }

    /// A call reusing the id of one still unanswered is dropped unrun: rmcp would run
    /// both and answer one, a write the client never hears of. Once the first is
    /// answered, the id may be used again.
    #[tokio::test]
    async fn a_call_reusing_a_pending_id_is_not_run() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let sandbox = writing_sandbox(dir.path());
        let server = SandboxMcp::new(Arc::clone(&sandbox));
        let (session, mut answers, mut input) = in_memory(server);
        let call = create_call;
        input.write_all(HELLO.as_bytes()).await.unwrap();
        let mut next = async || next_answer(&mut answers).await;
        assert_eq!(next().await["id"], 0);
        let rounds = 5;
        for round in 0..rounds {
            // Five calls of one id and a ping in one write, as a client sending a burst:
            // all read before any call runs.
            let id = 10 + round;
            let mut burst: String = (0..5)
                .map(|i| call(id, &format!("r{round}_dup{i}.txt")) + "\n")
                .collect();
            burst.push_str(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}}\n",
                100 + round
            ));
            input.write_all(burst.as_bytes()).await.unwrap();
            let (first, second) = (next().await, next().await);
            let answer = if first["id"] == 100 + round {
                second
            } else {
                first
            };
            assert_eq!(answer["id"], id, "{answer}");
            assert_eq!(answer["result"]["isError"], false, "{answer}");
        }
        // Answered, an id is free again.
        input
            .write_all(format!("{}\n", call(10, "again.txt")).as_bytes())
            .await
            .unwrap();
        let answer = next().await;
        assert_eq!(answer["id"], 10, "{answer}");
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        let root = dir.path().join("root");
        let written: Vec<(u32, u32)> = (0..rounds)
            .flat_map(|r| (0..5).map(move |i| (r, i)))
            .filter(|(r, i)| root.join(format!("r{r}_dup{i}.txt")).exists())
            .collect();
        let firsts: Vec<(u32, u32)> = (0..rounds).map(|r| (r, 0)).collect();
        assert_eq!(written, firsts, "only the first call of each id ran");
        assert!(root.join("again.txt").exists());
        assert_eq!(
            sandbox.artifacts(100, None).unwrap().len(),
            rounds as usize + 1
        );
        drop((input, answers));
        session.await.unwrap().unwrap();
    }
}
