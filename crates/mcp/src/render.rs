//! Turning runtime answers into tool results an LLM can act on.
//!
//! The one mapping of this face: a refusal or failure is a tool result
//! with `isError: true` whose text gives the reason code, the reason and what to do
//! instead; a simulation is a normal result that says nothing was written and why; a
//! success names the path, checksum, size, artifact, workflow and how to roll back.

use ailab_sandbox_core::catalog::{
    Effect, OPERATIONS, Operation, op_for_intent, writable_extensions,
};
use ailab_sandbox_core::confine::path::ExtensionPolicy;
use ailab_sandbox_core::context::DryRunReason;
use ailab_sandbox_core::executor::{ActionResult, ActionStatus, RunResult, RunStatus};
use ailab_sandbox_core::reason::{ReasonCode, Refusal};
use ailab_sandbox_core::sandbox::{RollbackReport, RollbackStep};
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::Value;

/// How the operator turns real writes on; repeated wherever a simulation is reported.
pub(crate) const PHASE_HINT: &str = "To write, the operator must restart the MCP server with a phase that allows sandbox writes (--phase 28.3, or 28.5 to 28.8). A tool call cannot change this: tell the user if a real write is needed.";
pub(crate) const ENABLE_HINT: &str = "To write for real, the operator must restart the MCP server with both --enable-write and --no-dry-run (or set AI_LAB_ENABLE_SANDBOX_WRITE=true and AI_LAB_SANDBOX_DRY_RUN=false, or enable_write = true and dry_run = false in its config file, with neither variable set the other way: a flag wins over a variable, a variable over the file). A tool call cannot change this: tell the user if a real write is needed.";

/// A successful result: `text` for people and models, `structured` for programs.
pub(crate) fn ok(text: String, structured: Option<Value>) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = structured;
    r
}

/// An `isError` result.
pub(crate) fn error(text: String, structured: Option<Value>) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = structured;
    r
}

/// Serializes a value for `structuredContent` (always an object on the wire).
pub(crate) fn to_value<T: Serialize>(v: &T) -> Option<Value> {
    match serde_json::to_value(v) {
        Ok(v @ Value::Object(_)) => Some(v),
        Ok(other) => Some(serde_json::json!({ "value": other })),
        Err(e) => {
            tracing::warn!(error = %e, "could not serialize a structured tool result");
            None
        }
    }
}

/// A refusal as an `isError` result.
pub(crate) fn refusal(r: &Refusal, op: Option<Writer<'_>>, tail: &str) -> CallToolResult {
    refusal_advising(r, tail, &what_to_do(r.reason_code, op))
}

/// A read tool's refusal: the advice is about reading, where [`what_to_do`] speaks to
/// writers.
pub(crate) fn read_refusal(r: &Refusal, tail: &str) -> CallToolResult {
    let hint = match r.reason_code {
        ReasonCode::SizeExceeded => {
            "the file is larger than this server returns, and cannot be read in parts here: get_file_info gives its size and checksum; ask the user if you need its contents.".to_owned()
        }
        ReasonCode::NotFound => {
            "check the path with list_directory or get_file_info; the reason above says what is (or is not) there.".to_owned()
        }
        ReasonCode::HardlinkRefused => {
            "that file has other hard links, so it may be a file elsewhere, and it is never read here; ask the user for its contents if you need them.".to_owned()
        }
        // A read's conflicts (what_to_do speaks of rollbacks): a permission someone set,
        // a root moved away, a file replaced while it was read.
        ReasonCode::Conflict => {
            "when the reason says the sandbox root is no longer the directory opened at start, calling again will not help: tell the user, so that the operator puts it back or restarts the runtime; when it says the file was moved, removed or replaced while it was being read, call again in a moment; otherwise the file or folder is another user's or closed to this process, and calling again will not help: read another path, or tell the user, so that the operator gives the runtime's user access there.".to_owned()
        }
        code => what_to_do(code, None),
    };
    refusal_advising(r, tail, &hint)
}

/// [`refusal`] with its own advice.
pub(crate) fn refusal_advising(r: &Refusal, tail: &str, hint: &str) -> CallToolResult {
    let text = format!(
        "REFUSED ({code}): {reason}{tail}\nWhat to do instead: {hint}",
        code = r.reason_code,
        reason = clause(&r.reason),
    );
    error(
        text,
        Some(serde_json::json!({"reason_code": r.reason_code, "reason": r.reason})),
    )
}

/// `reason` without a trailing full stop, so that sentences can be appended.
pub(crate) fn clause(reason: &str) -> &str {
    reason.trim_end().trim_end_matches('.')
}

/// Bad arguments (unknown field, wrong type, missing field) as an `isError` result.
pub(crate) fn bad_arguments(tool: &str, problem: &str) -> CallToolResult {
    let r = Refusal::new(
        ReasonCode::InvalidPlan,
        format!("invalid arguments for {tool}: {problem}"),
    );
    let text = format!(
        "REFUSED ({code}): {reason}. Nothing was done.\nWhat to do instead: call {tool} again with the arguments its input schema lists (tools/list), and nothing else.",
        code = r.reason_code,
        reason = clause(&r.reason),
    );
    error(
        text,
        Some(serde_json::json!({"reason_code": r.reason_code, "reason": r.reason})),
    )
}

/// The write tool a refusal is for, with the extension policy it runs under.
#[derive(Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub op: &'a Operation,
    pub policy: &'a ExtensionPolicy,
}

/// A path to give as an example of a file `op` writes: one this server's extension policy
/// lets it write, so that an agent copying it is not refused for its extension (`.md`
/// where allowed, else the first allowed; a directory operation's is a folder's).
pub(crate) fn example_file(op: &Operation, policy: &ExtensionPolicy) -> String {
    if op.is_directory() {
        return "notes/drafts".to_owned();
    }
    let exts = writable_extensions(op, policy);
    let ext = if exts.iter().any(|e| e == ".md") {
        ".md"
    } else {
        exts.first().map_or(".md", String::as_str)
    };
    format!("notes/todo{ext}")
}

/// [`example_file`] of `create_file`: a file this server lets a session write, given as
/// the example of a file to read or describe too.
pub(crate) fn example_written_file(policy: &ExtensionPolicy) -> String {
    ailab_sandbox_core::catalog::op_for_intent("create_file")
        .map_or_else(|| "notes/todo.md".to_owned(), |op| example_file(op, policy))
}

/// What a caller should do after a refusal or failure with `code`. Exhaustive on purpose:
/// a new reason code must be given advice here before the crate compiles.
pub(crate) fn what_to_do(code: ReasonCode, op: Option<Writer<'_>>) -> String {
    use ReasonCode as C;
    let s = match code {
        C::PhaseNotSupported => {
            "the phase in force does not allow sandbox writes; only the operator can change it (--phase 28.3). Tell the user."
        }
        C::NotSandboxWrite | C::ForbiddenIntent | C::UnknownOperation => {
            return use_the_write_tools();
        }
        C::ChmodForbidden => {
            "files written here are never executable and nothing is ever chmod-ed; drop the request for an executable file or chmod from the description (the content is not screened), and tell the user to run scripts with an interpreter (e.g. `python3 file.py`, `sh file.sh`)."
        }
        C::PathTraversal | C::OutsideSandbox | C::DepthExceeded => return advice_on_path(op),
        C::ReservedPath => {
            "when the reason names a path you gave that is reserved ('.rollback/' or the state directory), choose another path; when it says the operator must give a folder or file of the runtime's back (the snapshot store, a snapshot), no path, wait or force helps: tell the user."
        }
        C::SymlinkEscape | C::SymlinkRefused => {
            "symlinks are never followed; use a real file or directory path instead (list_directory shows which entries are symlinks)."
        }
        C::HardlinkRefused => {
            "that file has other hard links, so it may be a file elsewhere and is never read or written here; to write, choose a new file under another name instead."
        }
        C::NotRegularFile => {
            "the target is a directory, FIFO, socket or device; choose a regular file path (check it with get_file_info)."
        }
        C::BlockedExtension | C::ExtensionNotAllowed => return advice_on_extension(op),
        C::SizeExceeded => advice_on_size(op),
        C::AlreadyExists => advice_on_existing(op),
        C::NotFound => {
            "the path does not exist; check it with list_directory or get_file_info, or create the file first with create_file."
        }
        C::EditNotFound => {
            "call read_file and copy the exact current text (whitespace and line breaks included) into 'old'."
        }
        C::EditAmbiguous => {
            "include more surrounding text in 'old' so that it occurs exactly once in the file."
        }
        C::InvalidId => {
            "fix the id the reason names (1-64 letters, digits, '.', '_' or '-'; an action id runs once in its workflow); a workflow_id may also be left out, to use this session's workflow."
        }
        C::InvalidPlan => return advice_on_plan(op),
        C::BudgetArtifactsExceeded | C::BudgetBytesExceeded => {
            "this workflow has used its budget of artifacts or bytes; ask the user whether to continue in a new workflow (pass a new workflow_id) or to have the operator raise the limits. When the reason says the file alone is larger than a workflow's whole budget, no new workflow helps: write less, or ask for the limit to be raised."
        }
        C::RateLimited => {
            "too many writes in the last minute; wait the number of seconds stated above, then retry the same call."
        }
        C::Conflict => advice_on_conflict(op),
        C::NoRollbackData => {
            "there is nothing left to roll back here; when the reason names the workflow whose trail records the action, call rollback_action again with that workflow_id; otherwise check the workflow_id and action_id: each write tool's result names them (list_artifacts lists the files written; a directory made has no artifact)."
        }
        C::ChecksumMismatch => {
            "a snapshot or a restored file did not match its recorded checksum; do not retry blindly. Tell the user; the operator should inspect the snapshot named and the audit trail (`ailab-sandbox audit verify`)."
        }
        C::IoError => {
            "the runtime could not read or write its files; tell the user. The operator should check the state directory and the sandbox roots (get_state)."
        }
    };
    s.to_owned()
}

/// [`what_to_do`] after a request for something no tool of this server does.
fn use_the_write_tools() -> String {
    let tools: Vec<&str> = OPERATIONS.iter().map(|o| o.name).collect();
    format!(
        "use one of the write tools of this server ({}); deleting, moving, running commands or installing packages is never possible here.",
        tools.join(", ")
    )
}

/// [`what_to_do`] after a path refused for its form or depth.
fn advice_on_path(op: Option<Writer<'_>>) -> String {
    format!(
        "use a path relative to the sandbox root, such as \"{}\": no '..', no '~', no control, bidirectional formatting or invisible characters (zero-width ones, except where a script or an emoji needs one), no look-alikes of '/', '\\' or '..', no absolute path outside the roots, no more components than get_state's limits.max_path_depth; a 'root', when given, must be one of the roots get_state lists (leave it out for the first). Call get_state to see the roots and the limit.",
        op.map_or_else(
            || "notes/todo.md".to_owned(),
            |w| example_file(w.op, w.policy)
        )
    )
}

/// [`what_to_do`] after an extension refused.
fn advice_on_extension(op: Option<Writer<'_>>) -> String {
    match op {
        // What this server's policy lets it write, not the catalog's list: the
        // operator's allow-list may take some away.
        Some(w) => {
            let mine = writable_extensions(w.op, w.policy);
            let any = op_for_intent("create_file")
                .map(|c| writable_extensions(c, w.policy))
                .unwrap_or_default();
            match (mine.is_empty(), w.op.extensions.is_empty() || any.is_empty()) {
                (true, _) => format!(
                    "{} can write no file on this server: the operator's extension policy allows none of its extensions. Tell the user.",
                    w.op.name
                ),
                (false, true) => format!(
                    "give the path one of the extensions {} may write here: {}.",
                    w.op.name,
                    mine.join(" ")
                ),
                (false, false) => format!(
                    "give the path one of the extensions {} may write here ({}), or use create_file, which writes {}.",
                    w.op.name,
                    mine.join(" "),
                    any.join(" ")
                ),
            }
        }
        None => "choose an allowed extension (.md, .txt, .json, .yaml, ... as listed in the tool's description); system unit files and binaries are never writable.".to_owned(),
    }
}

/// [`what_to_do`] after a write over its tool's size limit.
fn advice_on_size(op: Option<Writer<'_>>) -> &'static str {
    // The limit is on the whole file: appending in parts meets it all the same.
    match op.map(|w| w.op.effect) {
        Some(Effect::Append) => {
            "the file would grow over the tool's size limit (see its description), which counts the whole file; put what does not fit into a new file with create_file (over several, when it is over the limit by itself)."
        }
        Some(Effect::Serialize(_)) => {
            "the document would be over the tool's size limit (see its description); split the data over several smaller files."
        }
        _ => {
            "the result would be over the tool's size limit (see its description); split the content over several smaller files."
        }
    }
}

/// [`what_to_do`] when something already stands at the path.
fn advice_on_existing(op: Option<Writer<'_>>) -> &'static str {
    if op.is_some_and(|w| w.op.is_directory()) {
        "a file stands where the directory would be made; choose another path for the directory (get_file_info shows what a path holds)."
    } else {
        "the file exists and create_file never overwrites; use replace_file to replace it, sandbox_transform to edit it, or choose a new path."
    }
}

/// [`what_to_do`] after arguments that make no plan.
fn advice_on_plan(op: Option<Writer<'_>>) -> String {
    match op.filter(|w| w.op.effect == Effect::Edit) {
        Some(w) => format!(
            "fix what the reason above names and call again: {} takes 1 to {} edits, each with a non-empty 'old' found in the file, and edits UTF-8 text only (to change a file that is not text, write its new content whole with replace_file).",
            w.op.name,
            ailab_sandbox_core::plan::MAX_EDITS_PER_PLAN
        ),
        None => {
            "check the arguments against the tool's input schema (tools/list) and call it again."
                .to_owned()
        }
    }
}

/// [`what_to_do`] after a conflict, which a write tool (`op`) meets otherwise than the
/// other tools do.
fn advice_on_conflict(op: Option<Writer<'_>>) -> &'static str {
    if op.is_none() {
        "when the reason says a file or folder is another user's, closed to this process or marked (a permission, a sticky folder, an immutable mark), or that the sandbox root is no longer the directory opened at start, neither waiting nor force helps: tell the user, so that the operator puts that right; when the reason says another process held a file or log, call again in a moment (it is busy, nothing is wrong); when it names later actions of the workflow, roll those back first (rollback_action, newest first), or the whole workflow; when it names another workflow's write to a file (written by workflow/action), roll that back first (an action at a time, newest first, where workflows wrote in turn), then this; when it names another workflow's rollback that took this write with it, nothing of this workflow's write is left there: force would bring back what that rollback undid, so ask the user first; otherwise the listed files changed after they were written: check them with read_file, then call again with force: true only if overwriting those changes is intended."
    } else {
        "when the reason says the file or its folder is another user's, closed to this process or marked (a permission, a sticky folder, an immutable mark), calling again will not help: write to another path, or tell the user, so that the operator gives the runtime's user access there; when it says the sandbox root is no longer the directory opened at start, calling again will not help either: tell the user, so that the operator puts it back or restarts the runtime; when it says the root's snapshot store belongs to another runtime's state directory, calling again will not help: write in another root, or tell the user, so that the operator gives each runtime a root of its own; otherwise another writer or process held the file or a log of the runtime (a long write, or a stopped one), or the file changed since it was looked at: call again in a moment, after read_file if you rely on its content."
    }
}

/// Why a run was simulated, in words.
pub(crate) fn dry_run_words(reason: Option<DryRunReason>, phase: &str) -> String {
    match reason {
        Some(DryRunReason::SandboxDisabled) => {
            "sandbox_disabled: the operator has not enabled writing; writing is on only with --enable-write, AI_LAB_ENABLE_SANDBOX_WRITE=true or enable_write = true in the config file (a flag wins over the variable, the variable over the file: AI_LAB_ENABLE_SANDBOX_WRITE=false turns off what the file turns on)".to_owned()
        }
        Some(DryRunReason::DryRun) => {
            "dry_run: dry-run mode is on; it is off only with --no-dry-run, AI_LAB_SANDBOX_DRY_RUN=false or dry_run = false in the config file (a flag wins over the variable, the variable over the file: AI_LAB_SANDBOX_DRY_RUN=true keeps it on whatever the file says)".to_owned()
        }
        Some(DryRunReason::PhaseNotSupported) => {
            format!("phase_not_supported: phase {phase} does not allow sandbox writes")
        }
        Some(DryRunReason::GovernanceBlocked) => "governance_blocked: the action was refused".to_owned(),
        None => "dry run".to_owned(),
    }
}

/// What a one-action write run that went through says: what it wrote, where, and how
/// to undo it (the workflow named when it is not the session's).
fn written_text(
    res: &RunResult,
    a: &ActionResult,
    op: &Operation,
    session_wf: &str,
    root: Option<&str>,
) -> String {
    let wf_arg = if res.workflow_id == session_wf {
        String::new()
    } else {
        format!(", \"workflow_id\": \"{}\"", res.workflow_id)
    };
    let size = a.size_bytes.map_or_else(String::new, bytes);
    let what = if op.is_directory() {
        format!(
            "{} created directory {} (or it already existed).",
            op.name,
            shown_name(&a.path)
        )
    } else {
        format!(
            "{} wrote {}: {size}, sha256 {}.",
            op.name,
            shown_name(&a.path),
            sum(&a.after_checksum)
        )
    };
    format!(
        "{what}\npath: {path}{in_root}\nsha256: {sha}\nsize_bytes: {size_n}\nartifact_id: {art}\nworkflow_id: {wf}\naction_id: {act}\nTo undo this write: call rollback_action with {{\"action_id\": \"{act}\"{wf_arg}}}. To undo every write of the workflow: call rollback_workflow{wf_hint}.",
        path = shown_name(&a.path),
        in_root = root.map_or_else(String::new, |r| format!(
            "\nroot: {r} (the path is in this root: pass it as 'root' to read or change the file)"
        )),
        sha = sum(&a.after_checksum),
        size_n = a
            .size_bytes
            .map_or_else(|| "-".to_owned(), |n| n.to_string()),
        art = sum(&a.artifact_id),
        wf = res.workflow_id,
        act = a.action_id,
        wf_hint = if wf_arg.is_empty() {
            " with no arguments".to_owned()
        } else {
            format!(" with {{\"workflow_id\": \"{}\"}}", res.workflow_id)
        },
    )
}

/// A checksum or id as shown, `-` for none.
fn sum(s: &Option<String>) -> String {
    s.clone().unwrap_or_else(|| "-".to_owned())
}

/// The result of a one-action write run; `root`, the root the call named, is repeated
/// beside the path, which is relative to it (read tools take the first root unless told).
pub(crate) fn write_result(
    res: &RunResult,
    w: Writer<'_>,
    session_wf: &str,
    phase: &str,
    root: Option<&str>,
) -> CallToolResult {
    let op = w.op;
    let mut structured = to_value(res);
    // A refusal's code at the top, where every other refusal carries it.
    if let (Some(Value::Object(m)), Some(code)) = (
        structured.as_mut(),
        res.actions.iter().find_map(|a| a.reason_code),
    ) {
        m.insert("reason_code".to_owned(), serde_json::json!(code));
    }
    let Some(a) = res.actions.first() else {
        return error(
            format!(
                "The run of {} returned no action result (status {:?}); nothing is known to have been written.",
                op.name, res.status
            ),
            structured,
        );
    };
    let size = a.size_bytes.map_or_else(String::new, bytes);
    match res.status {
        RunStatus::Success => ok(written_text(res, a, op, session_wf, root), structured),
        RunStatus::SimulatedSuccess => {
            let would = if op.is_directory() {
                format!("would create directory {}", shown_name(&a.path))
            } else {
                format!("would leave {size} (sha256 {})", sum(&a.after_checksum))
            };
            let text = format!(
                "DRY RUN: nothing was written. {} on {} passed every check (governance, budget, rate limit) and {would}.\nWhy it was only simulated: {}.\n{ENABLE_HINT}\nworkflow_id: {}",
                op.name,
                shown_name(&a.path),
                dry_run_words(res.dry_run_reason, phase),
                res.workflow_id,
            );
            ok(text, structured)
        }
        RunStatus::Blocked => {
            let code = a.reason_code.unwrap_or(ReasonCode::InvalidPlan);
            let reason = a
                .reason
                .clone()
                .unwrap_or_else(|| "the action was refused".to_owned());
            // A blocked run names the phase as its dry-run reason when the phase is what
            // refused it, and governance otherwise (see the core's executor).
            let sim = match (res.simulation_only, res.dry_run_reason) {
                (false, _) | (true, Some(DryRunReason::PhaseNotSupported)) => "",
                (true, _) => {
                    " (This server also only simulates writes — writing is disabled or dry-run is on — so even an allowed call would only be simulated.)"
                }
            };
            let text = format!(
                "REFUSED ({code}): {}. Nothing was written.{sim}\nWhat to do instead: {}",
                clause(&reason),
                what_to_do(code, Some(w))
            );
            error(text, structured)
        }
        RunStatus::Failed | RunStatus::RolledBack => {
            let code = a.reason_code.unwrap_or(ReasonCode::IoError);
            let reason = a
                .reason
                .clone()
                .unwrap_or_else(|| "the action failed".to_owned());
            let undone = if undo_failed(res, &a.action_id) {
                " Undoing the action's own change failed too, so the change may still be in place."
            } else if restored_own(res, &a.action_id) {
                " The action's own change was undone from its snapshot, so its target is as it was before."
            } else if a.status == ActionStatus::Failed {
                // Nothing to undo: it failed before it touched its target (a snapshot
                // it could not take, a target changed meanwhile, which stays changed).
                " It failed before it changed its target: nothing of it remains."
            } else {
                ""
            };
            let text = format!(
                "FAILED ({code}): {}.{undone}\nWhat to do instead: {}",
                clause(&reason),
                what_to_do(code, Some(w))
            );
            error(text, structured)
        }
    }
}

/// Whether the run tried to undo `action`'s own change and could not (the change may
/// still be in place; its reason says so too), as its timeline says.
fn undo_failed(res: &RunResult, action: &str) -> bool {
    res.timeline.iter().any(|e| {
        e.event == "action_restored"
            && e.detail["action_id"] == action
            && e.detail["restored"] == false
    })
}

/// Whether the run undid a change `action` made to its target, from its snapshot (its
/// timeline says so; one that never touched its target is said `untouched` there).
fn restored_own(res: &RunResult, action: &str) -> bool {
    res.timeline.iter().any(|e| {
        e.event == "action_restored"
            && e.detail["action_id"] == action
            && e.detail["restored"] == true
            && e.detail["untouched"] != true
    })
}

/// `name` quoted, whole, with each character that breaks or hides in a line of text
/// escaped (`\u{200b}`), and exactly those: it can be read back character for character.
pub(crate) fn escaped_name(name: &str) -> String {
    let mut out = String::from("'");
    for c in name.chars() {
        if c.is_control() || c == '\'' || c == '\\' {
            out.extend(c.escape_debug());
        } else if ailab_sandbox_core::confine::path::shows_otherwise(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `name` as it is when nothing in it breaks or hides in a line of text, else
/// [`escaped_name`]: a path shown in a result stays one line, read as it is written.
pub(crate) fn shown_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name
        .chars()
        .any(ailab_sandbox_core::confine::path::shows_otherwise)
    {
        std::borrow::Cow::Owned(escaped_name(name))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// One step of a rollback, as a line of its tool result.
fn step_line(s: &RollbackStep) -> String {
    let state = if s.restored {
        let verified = if s.checksum_validated {
            " and verified by checksum"
        } else {
            ""
        };
        match (&s.restored_checksum, &s.detail) {
            (Some(sum), _) => format!("restored{verified}, sha256 {sum}"),
            (None, Some(detail)) => format!(
                "{detail} ({})",
                if s.checksum_validated {
                    "verified"
                } else {
                    "not verified"
                }
            ),
            (None, None) => format!("restored{verified}"),
        }
    } else {
        format!(
            "{} ({}): {}",
            if s.is_unconfirmed() {
                "NOT confirmed"
            } else {
                "NOT restored"
            },
            s.reason_code.map_or("-", |c| c.as_str()),
            s.reason.as_deref().unwrap_or("")
        )
    };
    format!(
        "- {} {} {}: {state}",
        s.action_id,
        s.intent,
        shown_name(&s.path)
    )
}

/// A rollback report as a tool result; `whole_workflow` when no action was named.
pub(crate) fn rollback_result(
    rep: &RollbackReport,
    what: &str,
    whole_workflow: bool,
) -> CallToolResult {
    let structured = to_value(rep);
    let lines: Vec<String> = rep.steps.iter().map(step_line).collect();
    if rep.is_simulated() {
        let text = format!(
            "Simulated rollback of {what}: {}.",
            clause(rep.reason.as_deref().unwrap_or("nothing was restored"))
        );
        return ok(text, structured);
    }
    if rep.is_success() {
        let kept = rep
            .steps
            .iter()
            .filter(|s| {
                s.restored
                    && s.detail
                        .as_deref()
                        .is_some_and(|d| d.starts_with(ailab_sandbox_core::snapshot::LEFT_IN_PLACE))
            })
            .count();
        let kept = match kept {
            0 => String::new(),
            k => format!(" ({k} of them left a directory in place, as its line says)"),
        };
        let mut text = format!(
            "Rolled back {what}: {} step(s) done{kept}.\n{}",
            rep.steps_rolled_back,
            lines.join("\n")
        );
        let overwritten = rep.overwritten_paths();
        if !overwritten.is_empty() {
            text.push_str(&format!(
                "\nForced: it overwrote what had changed since the workflow wrote it: {}.",
                overwritten.join(", ")
            ));
        }
        let removed = rep.found_removed_paths();
        if !removed.is_empty() {
            text.push_str(&format!(
                "\nForced: it found removed since the workflow wrote it (nothing there to overwrite): {}.",
                removed.join(", ")
            ));
        }
        // Done, yet not all of the workflow is back (writes whose snapshots were pruned).
        if let Some(left) = &rep.reason {
            text.push_str(&format!("\nNot everything is back: {}.", clause(left)));
        }
        return ok(text, structured);
    }
    let code = rep.reason_code.unwrap_or(ReasonCode::IoError);
    let reason = rep
        .reason
        .clone()
        .unwrap_or_else(|| "the rollback did not complete".to_owned());
    let head = if rep.status == ailab_sandbox_core::sandbox::RollbackStatus::Refused {
        "REFUSED"
    } else {
        "FAILED"
    };
    let mut text = format!("{head} ({code}): rollback of {what}: {}.", clause(&reason));
    if !lines.is_empty() {
        text.push('\n');
        text.push_str(&lines.join("\n"));
    }
    let advice = match code {
        // A rollback names no path: the workflow wrote into a root this server lacks.
        ReasonCode::OutsideSandbox => {
            "roll back single actions in this server's roots with rollback_action, or ask the operator to start the server with every root the workflow wrote into.".to_owned()
        }
        // The one shape a rollback's arguments cannot fix: roots too long together for
        // its record.
        ReasonCode::InvalidPlan => {
            "roll the workflow's actions back one at a time with rollback_action, newest first (list_artifacts names them).".to_owned()
        }
        // what_to_do's advice speaks of an action's ids.
        ReasonCode::NoRollbackData if whole_workflow => {
            "there is nothing left to roll back in this workflow; check the workflow_id: each write tool's result names it (list_artifacts lists the files each workflow wrote), and leaving it out means this session's workflow.".to_owned()
        }
        _ => what_to_do(code, None),
    };
    text.push_str(&format!("\nWhat to do instead: {advice}"));
    error(text, structured)
}

/// `n` byte(s), in words.
pub(crate) fn bytes(n: u64) -> String {
    format!("{n} byte{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rollback refused for a root this server lacks gets rollback advice, not the
    /// path advice of a write ("use a path relative to the sandbox root").
    #[test]
    fn a_rollback_outside_the_roots_is_advised_as_a_rollback() {
        let rep = RollbackReport {
            workflow_id: "wf_two".to_owned(),
            status: ailab_sandbox_core::sandbox::RollbackStatus::Refused,
            steps_rolled_back: 0,
            reason_code: Some(ReasonCode::OutsideSandbox),
            reason: Some(
                "the workflow wrote into /srv/r2, which this process does not serve".to_owned(),
            ),
            conflicts: Vec::new(),
            steps: Vec::new(),
        };
        let r = rollback_result(&rep, "workflow wf_two", true);
        let text = r.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.contains("rollback_action"), "{text}");
        assert!(!text.contains("relative to the sandbox root"), "{text}");
    }

    /// A rollback into roots too long together for its record is advised to go action by
    /// action, not to check the tool's arguments (which are fine).
    #[test]
    fn a_rollback_too_wide_for_its_record_is_advised_action_by_action() {
        let rep = RollbackReport {
            workflow_id: "wf_wide".to_owned(),
            status: ailab_sandbox_core::sandbox::RollbackStatus::Refused,
            steps_rolled_back: 0,
            reason_code: Some(ReasonCode::InvalidPlan),
            reason: Some("this rollback writes into 20 roots whose paths together take 3921 bytes of the run record, which has room for 3606; roll its actions back one at a time".to_owned()),
            conflicts: Vec::new(),
            steps: Vec::new(),
        };
        let r = rollback_result(&rep, "workflow wf_wide", true);
        let text = r.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.contains("with rollback_action"), "{text}");
        assert!(!text.contains("input schema"), "{text}");
    }

    /// A call refused for its `root` is told what a root may be, not only how a path
    /// is written.
    #[test]
    fn outside_the_roots_advice_names_the_root_argument() {
        let said = what_to_do(ReasonCode::OutsideSandbox, None);
        assert!(
            said.contains("a 'root', when given, must be one of the roots get_state lists"),
            "{said}"
        );
    }

    #[test]
    fn every_reason_code_has_advice() {
        for code in ReasonCode::ALL {
            assert!(!what_to_do(code, None).is_empty(), "{code}");
        }
    }

    /// A failed write says its change was undone from its snapshot only when the run
    /// undid a change it made: one that failed before it touched its target (no
    /// snapshot, or the target changed meanwhile) changed nothing.
    #[test]
    fn a_failure_before_the_snapshot_is_not_said_undone() {
        use ailab_sandbox_core::catalog::RiskLevel;
        use ailab_sandbox_core::executor::ActionResult;
        use ailab_sandbox_core::workflow::WorkflowState;
        let policy = ExtensionPolicy::default();
        // `restored`: the executor's undo of the action, `(undone, untouched)`.
        let text_of = |restored: Option<(bool, bool)>| {
            let action = ActionResult {
                reason_code: Some(ReasonCode::IoError),
                reason: Some("could not write the snapshot: no storage space".to_owned()),
                ..ActionResult::new(
                    "act_1",
                    "create_directory",
                    "d",
                    ActionStatus::Failed,
                    RiskLevel::Low,
                )
            };
            let res = RunResult {
                workflow_id: "wf_f".to_owned(),
                execution_id: "ex_1".to_owned(),
                // A one-action plan that fails ends rolled back (on_failure: rollback).
                status: RunStatus::RolledBack,
                simulation_only: false,
                dry_run_reason: None,
                state: WorkflowState::Failed,
                actions: vec![action],
                // The executor says so when it undid the action's change (and then
                // gives no rollback_path: the snapshot was spent).
                // `Some(untouched)`: the executor undid the action.
                timeline: restored
                    .map(|(undone, untouched)| ailab_sandbox_core::workflow::TimelineEvent {
                        at: String::new(),
                        event: "action_restored".to_owned(),
                        detail: serde_json::json!({"action_id": "act_1", "restored": undone, "untouched": untouched}),
                    })
                    .into_iter()
                    .collect(),
            };
            let Some(op) = op_for_intent("create_directory") else {
                panic!("create_directory is an operation")
            };
            let w = Writer {
                op,
                policy: &policy,
            };
            let r = write_result(&res, w, "wf_f", "28.3", None);
            r.content[0]
                .as_text()
                .map(|t| t.text.clone())
                .unwrap_or_default()
        };
        for (case, restored) in [
            ("no snapshot", None),
            ("target untouched", Some((true, true))),
        ] {
            let said = text_of(restored);
            assert!(
                said.contains("before it changed its target"),
                "{case}: {said}"
            );
            assert!(!said.contains("snapshot, so"), "{case}: {said}");
        }
        let late = text_of(Some((true, false)));
        assert!(late.contains("undone from its snapshot"), "{late}");
        // An undo that failed: the change may still be there.
        let stuck = text_of(Some((false, false)));
        assert!(
            stuck.contains("Undoing the action's own change failed too")
                && !stuck.contains("undone from its snapshot"),
            "{stuck}"
        );
    }

    /// Advice fits the tool refused: a directory or an edit has its own.
    #[test]
    fn advice_follows_the_tool() {
        let policy = ExtensionPolicy::default();
        let writer = |name| {
            let Some(op) = op_for_intent(name) else {
                panic!("{name} is an operation")
            };
            Writer {
                op,
                policy: &policy,
            }
        };
        let dir = what_to_do(ReasonCode::AlreadyExists, Some(writer("create_directory")));
        assert!(
            dir.contains("directory") && !dir.contains("create_file"),
            "{dir}"
        );
        let file = what_to_do(ReasonCode::AlreadyExists, Some(writer("create_file")));
        assert!(file.contains("replace_file"), "{file}");
        // The size limit counts the whole file: appending in parts meets it all the same.
        for name in ["append_file", "write_json", "create_file"] {
            let big = what_to_do(ReasonCode::SizeExceeded, Some(writer(name)));
            assert!(!big.contains("append in parts"), "{name}: {big}");
        }
        let append = what_to_do(ReasonCode::SizeExceeded, Some(writer("append_file")));
        assert!(append.contains("new file with create_file"), "{append}");
        let edit = what_to_do(ReasonCode::InvalidPlan, Some(writer("sandbox_transform")));
        assert!(
            edit.contains("reason above") && edit.contains("non-empty 'old'"),
            "{edit}"
        );
        assert!(
            edit.contains("UTF-8") && edit.contains("replace_file"),
            "{edit}"
        );
    }

    #[test]
    fn dry_run_words_name_the_reason() {
        assert!(
            dry_run_words(Some(DryRunReason::SandboxDisabled), "28.3")
                .starts_with("sandbox_disabled")
        );
        assert!(dry_run_words(Some(DryRunReason::DryRun), "28.3").starts_with("dry_run"));
        assert!(dry_run_words(Some(DryRunReason::PhaseNotSupported), "28.2").contains("28.2"));
    }
}
