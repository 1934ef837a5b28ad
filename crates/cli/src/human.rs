//! Output for people: short tables, colour only on a terminal.

use ailab_sandbox_core::artifact::ListedArtifact;
use ailab_sandbox_core::audit::{AuditStats, SandboxAuditEntry, VerifyReport};
use ailab_sandbox_core::catalog::{OPERATIONS, human_bytes};
use ailab_sandbox_core::context::DryRunReason;
use ailab_sandbox_core::executor::RunResult;
use ailab_sandbox_core::sandbox::{CheckVerdict, RollbackReport, RollbackStatus, StateDoc};
use std::io::IsTerminal;

fn paint(text: &str, good: bool) -> String {
    if std::io::stdout().is_terminal() {
        let code = if good { "32" } else { "31" };
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

fn dash(v: Option<&str>) -> &str {
    v.unwrap_or("-")
}

/// A value a plan's author chose (an intent, a path, a sentence quoting them), with its
/// control characters, line and paragraph separators, text-direction marks and the
/// characters readers do not show escaped (the core's `shows_otherwise`, which MCP's
/// results escape too): it can never move the cursor, colour the terminal, start a line
/// of its own, show its characters in another order (`report\u{202e}dm.jpg`) or hide
/// some of them.
pub(crate) fn safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if ailab_sandbox_core::confine::path::shows_otherwise(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn short(sum: Option<&str>) -> String {
    sum.map_or("-".to_owned(), |s| s.chars().take(12).collect())
}

/// The width of a table's column: its widest cell, at least `min` (the header's room), at
/// most `COLUMN_MAX`, so that one very long value slips only its own row.
fn column<S: AsRef<str>>(min: usize, cells: impl IntoIterator<Item = S>) -> usize {
    const COLUMN_MAX: usize = 48;
    cells
        .into_iter()
        .map(|c| c.as_ref().chars().count())
        .fold(min, usize::max)
        .min(min.max(COLUMN_MAX))
}

/// The width of `ops`' extensions column.
const EXTENSIONS_WIDTH: usize = 28;

pub fn ops(policy: &ailab_sandbox_core::confine::path::ExtensionPolicy) {
    out!(
        "{:<18} {:<10} {:<EXTENSIONS_WIDTH$} {:>9} {:<7} GOVERNED",
        "OPERATION",
        "CLASS",
        "EXTENSIONS",
        "MAX SIZE",
        "RISK"
    );
    for o in &OPERATIONS {
        // The same list `--json` gives: what this policy lets the operation write.
        let ext = if o.is_directory() {
            "-".to_owned()
        } else {
            match ailab_sandbox_core::catalog::writable_extensions(o, policy) {
                list if list.is_empty() => "(none under this policy)".to_owned(),
                // Named when they fit the column: "(all allowed)" beside a short
                // configured list read as "any extension".
                list if o.extensions.is_empty() && list.join(" ").len() > EXTENSIONS_WIDTH => {
                    format!("(all {} allowed)", list.len())
                }
                list => list.join(" "),
            }
        };
        out!(
            "{:<18} {:<10} {:<EXTENSIONS_WIDTH$} {:>9} {:<7} {}",
            o.name,
            o.mutation_class.as_str(),
            ext,
            o.max_size_bytes.map_or("-".to_owned(), human_bytes),
            o.risk_level.as_str(),
            if o.requires_governance { "yes" } else { "" }
        );
    }
}

pub fn check(v: &CheckVerdict) {
    if v.allowed {
        out!(
            "{} (risk {}, operation {})",
            paint("allowed", true),
            v.risk.as_str(),
            dash(v.operation)
        );
    } else {
        out!(
            "{} {}: {}",
            paint("refused", false),
            v.reason_code.map_or("-", |c| c.as_str()),
            safe(dash(v.reason.as_deref()))
        );
    }
}

pub fn run_result(r: &RunResult) {
    let status = r.status.as_str();
    out!(
        "workflow {}  execution {}  status {}  state {}{}",
        r.workflow_id,
        r.execution_id,
        paint(status, r.is_success() || r.is_simulated()),
        r.state,
        match r.dry_run_reason {
            // Refused whatever the flags: what to mend is said under each action.
            Some(DryRunReason::GovernanceBlocked) if r.simulation_only =>
                "  (simulated: governance_blocked: nothing is written until the refused actions below are mended)".to_owned(),
            Some(d) if r.simulation_only => {
                let (flag, fix) = d.explained();
                format!(
                    "  (simulated: {}; {flag}: {fix} to write)",
                    serde_json::to_value(d)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                )
            }
            _ => String::new(),
        }
    );
    let id_w = column(14, r.actions.iter().map(|a| safe(&a.action_id)));
    let intent_w = column(18, r.actions.iter().map(|a| safe(&a.intent)));
    for a in &r.actions {
        let st = a.status.as_str();
        out!(
            "  {:<id_w$} {:<intent_w$} {:<11} {:<12} {}{}",
            safe(&a.action_id),
            safe(&a.intent),
            st,
            short(a.after_checksum.as_deref()),
            safe(&a.path),
            a.reason
                .as_ref()
                .map_or(String::new(), |r| match a.reason_code {
                    Some(c) => format!("\n      {}: {}", c.as_str(), safe(r)),
                    // An action not run for another's refusal has a reason and no code.
                    None => format!("\n      {}", safe(r)),
                })
        );
    }
}

/// A rollback's report; `action`, when only that action was asked for, heads it, so that
/// its status is not read as the whole workflow's.
pub fn rollback(r: &RollbackReport, action: Option<&str>) {
    let what = match action {
        Some(a) => format!("action {} of workflow {}", safe(a), safe(&r.workflow_id)),
        None => format!("workflow {}", safe(&r.workflow_id)),
    };
    out!(
        "{what}  {}  steps rolled back: {}",
        paint(r.status.as_str(), r.is_success() || r.is_simulated()),
        r.steps_rolled_back
    );
    // A simulated rollback's reason has no code: it says why nothing was written.
    match (&r.reason, r.reason_code) {
        (Some(reason), Some(code)) => out!("  {code}: {}", safe(reason)),
        (Some(reason), None) => out!("  {}", safe(reason)),
        (None, _) => {}
    }
    // Conflicts are what force overrides (a refusal force would not help lists none):
    // the flag that does it, spelt out (the command's other options, a root or a
    // configuration, stay as they were given).
    if r.status == RollbackStatus::Refused && !r.conflicts.is_empty() {
        out!("  to overwrite them: run the same rollback with --force");
    }
    let overwritten = r.overwritten_paths();
    if r.is_success() && !overwritten.is_empty() {
        out!(
            "  forced: it overwrote what had changed since the workflow wrote it: {}",
            safe(&overwritten.join(", "))
        );
    }
    let removed = r.found_removed_paths();
    if r.is_success() && !removed.is_empty() {
        out!(
            "  forced: it found removed since the workflow wrote it (nothing there to overwrite): {}",
            safe(&removed.join(", "))
        );
    }
    let id_w = column(14, r.steps.iter().map(|s| safe(&s.action_id)));
    let intent_w = column(18, r.steps.iter().map(|s| safe(&s.intent)));
    for s in &r.steps {
        out!(
            "  {:<id_w$} {:<intent_w$} {:<12} checksum_validated={} {}",
            safe(&s.action_id),
            safe(&s.intent),
            if s.restored {
                "restored"
            } else if s.is_unconfirmed() {
                "unconfirmed"
            } else {
                "NOT restored"
            },
            s.checksum_validated,
            safe(&s.path)
        );
        // What became of a target no checksum describes (removed, or left in place).
        if let Some(detail) = &s.detail {
            out!("    {}", safe(detail));
        }
    }
}

pub fn audit(entries: &[SandboxAuditEntry]) {
    let intent_w = column(18, entries.iter().map(|e| safe(&e.mutation_type)));
    let reason_w = column(
        6,
        entries
            .iter()
            .map(|e| e.reason_code.map_or("-", |c| c.as_str())),
    );
    out!(
        "{:>6} {:<27} {:<11} {:<intent_w$} {:<reason_w$} TARGET",
        "SEQ",
        "TIME",
        "STATUS",
        "INTENT",
        "REASON"
    );
    for e in entries {
        let st = serde_json::to_value(e.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        out!(
            "{:>6} {:<27} {:<11} {:<intent_w$} {:<reason_w$} {}",
            e.seq,
            e.timestamp,
            st,
            safe(&e.mutation_type),
            e.reason_code.map_or("-", |c| c.as_str()),
            safe(&e.target_path)
        );
    }
}

pub fn audit_stats(s: &AuditStats) {
    out!(
        "total {}  success {}  failed {}  blocked {}  simulated {}  rolled_back {}",
        s.total,
        s.success,
        s.failed,
        s.blocked,
        s.simulated,
        s.rolled_back
    );
    let intents: Vec<(String, &u64)> = s
        .by_intent
        .iter()
        .map(|(k, v)| (k.escape_debug().to_string(), v))
        .collect();
    // One column for the counts, however long a reason code (`budget_artifacts_exceeded`).
    let w = s
        .by_mutation_class
        .keys()
        .chain(s.by_reason_code.keys())
        .map(|k| k.chars().count())
        .chain(intents.iter().map(|(k, _)| k.chars().count()))
        .fold(18, usize::max);
    for (k, v) in &s.by_mutation_class {
        out!("  class  {k:<w$} {v}");
    }
    for (k, v) in &intents {
        out!("  intent {k:<w$} {v}");
    }
    for (k, v) in &s.by_reason_code {
        out!("  reason {k:<w$} {v}");
    }
}

pub fn verify(v: &VerifyReport) {
    if v.ok {
        out!(
            "{}: {} entries, chain and head intact",
            paint("ok", true),
            v.entries
        );
    } else if v.awaits_recovery() {
        out!(
            "{}: {}",
            paint("NOT YET RECORDED", false),
            safe(dash(v.reason.as_deref()))
        );
    } else {
        let at = v
            .first_bad_seq
            .map_or(String::new(), |s| format!(" at seq {s}"));
        out!(
            "{}{at}: {}",
            paint("BROKEN", false),
            safe(dash(v.reason.as_deref()))
        );
    }
}

/// Each entry whose write was rolled back is marked, so that no listed version is taken
/// for what its file holds.
pub fn artifacts(list: &[ListedArtifact]) {
    let id_w = column(8, list.iter().map(|a| a.entry.artifact_id.as_str()));
    let intent_w = column(18, list.iter().map(|a| safe(&a.entry.mutation_type)));
    out!(
        "{:<id_w$} {:<intent_w$} {:<12} {:>9} PATH",
        "ARTIFACT",
        "INTENT",
        "SHA256",
        "BYTES"
    );
    for l in list {
        let a = &l.entry;
        out!(
            "{:<id_w$} {:<intent_w$} {:<12} {:>9} {}{}",
            a.artifact_id,
            safe(&a.mutation_type),
            short(Some(&a.checksum_sha256)),
            a.size_bytes,
            safe(&a.path),
            rolled_back_mark(l)
        );
    }
}

pub fn artifact_show(shown: &ListedArtifact, lineage: &[ListedArtifact]) {
    let a = &shown.entry;
    out!(
        "{}  {}  {}  {} bytes  sha256 {}{}",
        a.artifact_id,
        safe(&a.mutation_type),
        safe(&a.path),
        a.size_bytes,
        a.checksum_sha256,
        rolled_back_mark(shown)
    );
    out!(
        "  workflow {}  action {}  created {}",
        a.workflow_id,
        a.action_id,
        a.created_at
    );
    if lineage.is_empty() {
        out!("  lineage: (none)");
    }
    for (i, l) in lineage.iter().enumerate() {
        let p = &l.entry;
        out!(
            "  {}└ {}  {}  {}{}",
            "  ".repeat(i),
            p.artifact_id,
            safe(&p.mutation_type),
            short(Some(&p.checksum_sha256)),
            rolled_back_mark(l)
        );
    }
}

fn rolled_back_mark(a: &ListedArtifact) -> String {
    if a.rolled_back {
        paint("  (rolled back)", false)
    } else {
        String::new()
    }
}

pub fn state(d: &StateDoc) {
    let mode = serde_json::to_value(d.execution_mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    out!(
        "execution_mode  {}",
        paint(&mode, d.dry_run_reason.is_none())
    );
    if let Some(r) = d.dry_run_reason {
        out!(
            "dry_run_reason  {}",
            serde_json::to_value(r)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        );
    }
    out!("phase           {}", d.phase);
    out!("write enabled   {}", d.executor_enabled);
    out!("dry run         {}", d.dry_run);
    out!("roots           {}", safe(&d.sandbox_roots.join(", ")));
    for s in &d.skipped_roots {
        out!("skipped root    {}", safe(s));
    }
    out!("state dir       {}", safe(&d.state_dir));
    let durability = serde_json::to_value(d.durability)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    out!("durability      {durability}");
    out!(
        "limits          {} artifacts and {} bytes per workflow, {} writes a minute, path depth {}, lock wait {} s",
        d.limits.max_artifacts_per_workflow,
        d.limits.max_workflow_bytes,
        d.limits.writes_per_minute,
        d.limits.max_path_depth,
        d.limits.lock_wait_seconds
    );
    if let Some(k) = &d.kernel_confinement {
        let abi = k.abi.map(|a| format!(", ABI {a}")).unwrap_or_default();
        let detail = k
            .detail
            .as_deref()
            .map(|x| format!(" ({x})"))
            .unwrap_or_default();
        out!("confinement     {} {}{abi}{detail}", k.mechanism, k.status);
    }
    out!("artifacts       {}", d.artifacts_total);
    out!("audit entries   {}", d.audit_entries);
    out!("version         {}", d.version);
}
