//! `check_sandbox_governance`: the ordered checks of SPEC §5, stopping at the first failure.

use super::chmod::detect_chmod_intent;
use super::permission::{PermissionScope, classify_permission_scope, phase_supports_sandbox_write};
use crate::catalog::{
    Effect, FORBIDDEN_INTENTS, Operation, READ_INTENTS, RiskLevel, is_allowed_operation,
    op_for_intent,
};
use crate::confine::path::shown_path;
use crate::confine::{
    ExtensionPolicy, RelPath, Resolved, SandboxRoot, TargetInfo, TargetKind, check_reserved,
    is_within_sandbox, normalize_extension, resolve_sandbox_path,
};
use crate::reason::{ReasonCode, Refusal, Verdict};
use std::path::{Path, PathBuf};

/// What is asked.
#[derive(Debug, Clone, Copy)]
pub struct GovernanceRequest<'a> {
    /// The intent, e.g. `create_file`.
    pub intent: &'a str,
    /// The target path (relative to a root, or absolute inside one).
    pub path: &'a str,
    /// The phase in force.
    pub phase: &'a str,
    /// The root asked for, by its configured path.
    pub root: Option<&'a str>,
    /// The action's description, searched for chmod requests.
    pub description: Option<&'a str>,
    /// The tool asked to carry it out, if any.
    pub tool: Option<&'a str>,
}

/// What governance checks against.
#[derive(Debug, Clone, Copy)]
pub struct GovernanceContext<'a> {
    /// Configured root paths, in order.
    pub root_paths: &'a [PathBuf],
    /// Open root handles, parallel to `root_paths`: every target is looked at through
    /// them (links, hard links, special files, what stands in the path's place).
    pub roots: &'a [SandboxRoot],
    /// The state directory, reserved.
    pub state_dir: &'a Path,
    /// Extension lists.
    pub extensions: &'a ExtensionPolicy,
    /// Largest number of path components.
    pub max_depth: usize,
    /// Whether a write syncs the folder it changes (`strict` durability), which needs
    /// that folder readable as well as writable.
    pub syncs_folders: bool,
}

/// A request that passed every check but size.
#[derive(Debug, Clone)]
pub struct Approval {
    /// The operation.
    pub op: &'static Operation,
    /// The root and relative path.
    pub resolved: Resolved,
    /// What is at the target now.
    pub target: TargetInfo,
    /// The normalised extension.
    pub ext: String,
    /// Assessed risk.
    pub risk: RiskLevel,
}

/// Runs every check of SPEC §5 in order, `size` being the bytes the action would leave
/// on disk.
pub fn check_sandbox_governance(
    req: &GovernanceRequest<'_>,
    ctx: &GovernanceContext<'_>,
    size: u64,
) -> Verdict<Approval> {
    let approval = check_target(req, ctx)?;
    check_size(&approval, size, ctx.extensions)?;
    Ok(approval)
}

/// Phase, intent and chmod checks: the ones that need no path.
pub fn check_intent(req: &GovernanceRequest<'_>) -> Verdict<&'static Operation> {
    if !phase_supports_sandbox_write(req.phase) {
        return Err(Refusal::new(
            ReasonCode::PhaseNotSupported,
            format!(
                "phase {} does not allow sandbox writes; writes are allowed in phases {}",
                shown_path(req.phase),
                super::write_phases_listed("and")
            ),
        ));
    }
    let op = match op_for_intent(req.intent) {
        Some(op) => op,
        None => return Err(intent_refusal(req.intent, req.tool)),
    };
    if classify_permission_scope(req.intent, req.tool) == PermissionScope::Forbidden {
        return Err(intent_refusal(req.intent, req.tool));
    }
    for (field, text) in [
        ("intent", Some(req.intent)),
        ("description", req.description),
    ] {
        if let Some(pattern) = text.and_then(detect_chmod_intent) {
            return Err(Refusal::new(
                ReasonCode::ChmodForbidden,
                format!(
                    "the action's {field} asks to change permissions ({pattern}); the sandbox never runs chmod or sets an execute bit, so remove that request from the {field}"
                ),
            ));
        }
    }
    Ok(op)
}

/// Every check but size: intent, path, reserved names, the target on disk, extension.
pub fn check_target(req: &GovernanceRequest<'_>, ctx: &GovernanceContext<'_>) -> Verdict<Approval> {
    let op = check_intent(req)?;
    let resolved = resolve_target(req, ctx)?;
    check_reserved(&resolved.rel)?;
    let abs =
        crate::confine::path::join_display(&ctx.root_paths[resolved.root_index], &resolved.rel);
    if is_within_sandbox(&abs, ctx.state_dir) {
        return Err(Refusal::new(
            ReasonCode::ReservedPath,
            format!(
                "the path {} is inside the runtime's state directory, which is never writable by actions",
                shown_path(req.path)
            ),
        ));
    }
    // A link or special file on the way or in place is governance's (SPEC §5, before the
    // extension); an entry of the wrong kind (a file where the operation needs a folder,
    // a folder where it writes a file) and what this process may change are the
    // operation's own refusals, told once governance has passed the path.
    let root = &ctx.roots[resolved.root_index];
    let found = match root.inspect(&resolved.rel) {
        // A folder where a file would be written, or a file where a folder would be
        // made, is neither a link nor a special file: the operation's own refusal.
        Ok(info) => check_kind(op, &resolved.rel, info.kind).map(|()| info),
        // A file where a parent folder would be.
        Err(r) if r.reason_code == ReasonCode::NotFound => Err(r),
        Err(r) => return Err(r),
    };
    let dirs = if op.is_directory() {
        resolved.rel.components()
    } else {
        resolved.rel.parent_components()
    };
    ctx.extensions.check_directories(dirs)?;
    let ext = normalize_extension(resolved.rel.file_name());
    is_allowed_operation(op, &ext, 0, ctx.extensions).map_err(|r| {
        // The policy judges an extension; the person fixes a file name.
        if matches!(
            r.reason_code,
            ReasonCode::BlockedExtension | ReasonCode::ExtensionNotAllowed
        ) {
            Refusal::new(
                r.reason_code,
                format!("{}: {}", shown_path(&resolved.rel.as_string()), r.reason),
            )
        } else {
            r
        }
    })?;
    let target = found?;
    root.may_change(&resolved.rel, &target, ctx.syncs_folders)?;
    let risk = assess_sandbox_risk(req.intent, &resolved.rel.as_string());
    Ok(Approval {
        op,
        resolved,
        target,
        ext,
        risk,
    })
}

/// Where `req` points, as [`check_target`] resolves it (no I/O): for taking the
/// target's lock before governance looks at it.
pub fn resolve_target(
    req: &GovernanceRequest<'_>,
    ctx: &GovernanceContext<'_>,
) -> Verdict<crate::confine::path::Resolved> {
    resolve_sandbox_path(req.path, ctx.root_paths, req.root, ctx.max_depth)
}

/// The size check, last of all.
pub fn check_size(approval: &Approval, size: u64, extensions: &ExtensionPolicy) -> Verdict {
    is_allowed_operation(approval.op, &approval.ext, size, extensions)
}

/// The size check where the bytes an operation leaves are its `content` as given, made
/// before the target's preconditions are judged, as SPEC §5 orders it with governance:
/// a `create_file` of 2 MiB on an existing file is `size_exceeded`, as `check --size`
/// says, not `already_exists`. What stands at the path is judged first, as by `check`
/// (a folder where a file would be written, a file where a folder is needed). The others
/// are judged once rendered.
pub fn check_content_size(
    approval: &Approval,
    content: Option<&str>,
    extensions: &ExtensionPolicy,
) -> Verdict {
    match approval.op.effect {
        Effect::Create | Effect::Replace | Effect::Write => {
            check_size(approval, content.map_or(0, |c| c.len() as u64), extensions)
        }
        Effect::Append | Effect::Edit | Effect::Serialize(_) | Effect::Directory => Ok(()),
    }
}

fn check_kind(op: &Operation, rel: &RelPath, kind: TargetKind) -> Verdict {
    match kind {
        TargetKind::Directory => check_found_kind(op, rel, true),
        TargetKind::File { .. } => check_found_kind(op, rel, false),
        _ => Ok(()),
    }
}

/// Refuses `op` on a target found to be a directory (`is_dir`) or a regular file, when
/// that is not what it writes. Also asked of the tree a plan's earlier actions leave.
pub(crate) fn check_found_kind(op: &Operation, rel: &RelPath, is_dir: bool) -> Verdict {
    match is_dir {
        // SPEC §3: create_file fails if the target exists, whatever it is.
        true if op.effect == Effect::Create => Err(Refusal::new(
            ReasonCode::AlreadyExists,
            format!(
                "{} already exists, as a directory; {} makes new files only",
                shown_path(&rel.as_string()),
                op.name
            ),
        )),
        true if !op.is_directory() => Err(Refusal::new(
            ReasonCode::NotRegularFile,
            format!(
                "{} is a directory; {} writes regular files only",
                shown_path(&rel.as_string()),
                op.name
            ),
        )),
        false if op.is_directory() => Err(Refusal::new(
            ReasonCode::AlreadyExists,
            format!(
                "{} exists and is a file, so no directory can be created there",
                shown_path(&rel.as_string())
            ),
        )),
        _ => Ok(()),
    }
}

/// `intent` as an operation's name would spell it: read as a person reads it (see
/// [`super::chmod::plain`]: `ｄｅｌｅｔｅ_file` is `delete_file`), lower case, its words
/// joined by `_`. Words are split at white space, control characters, `-`, `_`, `.`, any
/// other dash (`delete‐file`, U+2010), and where a capital follows a small letter or a
/// digit (`deleteFile`): spelt so, a forbidden intent is still a probe for one.
fn fold_intent(intent: &str) -> String {
    let plain = super::chmod::plain(intent);
    let mut words = String::with_capacity(plain.len() + 4);
    let mut after_small = false;
    for c in plain.chars() {
        if c.is_uppercase() && after_small {
            words.push(' ');
        }
        after_small = c.is_lowercase() || c.is_ascii_digit();
        words.push(c);
    }
    let apart = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(
                c,
                '-' | '_' | '.' | '\u{058A}' | '\u{2010}'
                    ..='\u{2015}'
                        | '\u{2212}'
                        | '\u{2E3A}'
                        | '\u{2E3B}'
                        | '\u{FE58}'
                        | '\u{FE63}'
                        | '\u{FF0D}'
            )
    };
    words
        .split(apart)
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join("_")
}

/// Whether `intent` (with `tool`) asks for what is never allowed: a forbidden intent, a
/// permission change, a shell or interpreter as a write's tool ([`intent_refusal`] says
/// `forbidden_intent` or `chmod_forbidden`). Such an ask is audited however the rest of
/// its plan or call is broken: an agent probing for one leaves a trace.
pub fn never_allowed(intent: &str, tool: Option<&str>) -> bool {
    matches!(
        intent_refusal(intent, tool).reason_code,
        ReasonCode::ForbiddenIntent | ReasonCode::ChmodForbidden
    )
}

/// Why `intent` is refused when it names no operation (or asks for one through a shell):
/// `chmod_forbidden`, `forbidden_intent`, `not_sandbox_write` or `unknown_operation`.
/// Faces that offer operations by name (MCP tools) use it to refuse names they lack as a
/// plan would.
pub fn intent_refusal(intent: &str, tool: Option<&str>) -> Refusal {
    let allowed = crate::catalog::OPERATIONS
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ");
    // An intent joins words with `_` or `-`: "make_executable" is "make executable".
    let spelled_out = intent.replace(['_', '-'], " ");
    if detect_chmod_intent(intent).is_some()
        || detect_chmod_intent(&spelled_out).is_some()
        || intent.to_ascii_lowercase().contains("chmod")
    {
        return Refusal::new(
            ReasonCode::ChmodForbidden,
            format!(
                "the intent {} asks to change permissions; the sandbox never runs chmod",
                shown_path(intent)
            ),
        );
    }
    // Spelt otherwise (`DELETE_FILE`, `delete-file`, ` run command`), a forbidden intent
    // is still a probe for one, and counted as such.
    let folded = fold_intent(intent);
    if FORBIDDEN_INTENTS.contains(&folded.as_str()) {
        let read_as = if folded == intent {
            String::new()
        } else {
            format!(" (read as {folded})")
        };
        return Refusal::new(
            ReasonCode::ForbiddenIntent,
            format!(
                "the intent {}{read_as} is forbidden and never executed; sandbox writes are: {allowed}",
                shown_path(intent)
            ),
        );
    }
    if let Some(tool) = tool
        && classify_permission_scope(intent, Some(tool)) == PermissionScope::Forbidden
        && op_for_intent(intent).is_some()
    {
        return Refusal::new(
            ReasonCode::ForbiddenIntent,
            format!(
                "the tool {} runs commands or code, or changes permissions (a shell, an interpreter, chmod); sandbox writes are plain file writes and never go through such a tool (a tool that only writes files may be named without such a word: python, bash, node, exec, run…)",
                shown_path(tool)
            ),
        );
    }
    if READ_INTENTS.contains(&intent) {
        return Refusal::new(
            ReasonCode::NotSandboxWrite,
            format!(
                "the intent {} reads and does not belong in a write plan; sandbox writes are: {allowed}",
                shown_path(intent)
            ),
        );
    }
    let well_formed = !intent.is_empty()
        && intent.len() <= 64
        && intent
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !well_formed {
        let meant = match op_for_intent(&folded) {
            Some(op) => format!(" (names are lower case, words joined by `_`: {})", op.name),
            None => String::new(),
        };
        return Refusal::new(
            ReasonCode::UnknownOperation,
            format!(
                "{} is not an operation name{meant}; sandbox writes are: {allowed}",
                shown_path(intent)
            ),
        );
    }
    Refusal::new(
        ReasonCode::NotSandboxWrite,
        format!(
            "the intent {} is not a sandbox write operation; sandbox writes are: {allowed}",
            shown_path(intent)
        ),
    )
}

/// Risk of writing `path` with `intent`: the operation's baseline, at least medium for
/// scripts (`.py`, `.sh`), high for paths that configure shells, version control or
/// logins, and for anything outside the catalog.
pub fn assess_sandbox_risk(intent: &str, path: &str) -> RiskLevel {
    let Some(op) = op_for_intent(intent) else {
        return RiskLevel::High;
    };
    let lower = path.to_ascii_lowercase();
    let name = lower.rsplit('/').next().unwrap_or("");
    const SENSITIVE_NAMES: [&str; 9] = [
        ".bashrc",
        ".profile",
        ".bash_profile",
        ".zshrc",
        "authorized_keys",
        "crontab",
        ".gitconfig",
        ".npmrc",
        ".pypirc",
    ];
    const SENSITIVE_DIRS: [&str; 3] = [".git/", ".ssh/", ".config/autostart/"];
    // With a trailing '/', so that the directory itself (`create_directory .ssh`) counts.
    let as_dir = format!("{lower}/");
    if SENSITIVE_NAMES.contains(&name) || SENSITIVE_DIRS.iter().any(|d| as_dir.contains(d)) {
        return RiskLevel::High;
    }
    let ext = normalize_extension(name);
    if ext == ".py" || ext == ".sh" {
        return op.risk_level.max(RiskLevel::Medium);
    }
    op.risk_level
}
