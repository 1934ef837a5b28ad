//! `audit verify`: one pass over the whole trail checking its chain and head, and the
//! report it gives, with the registry's artifacts whose writes the trail does not
//! record.
//!
//! Each line must be the very bytes the runtime wrote. The trail is read in one streamed
//! pass (`TrailCheck`): the chain, the head and the writes the lines record, without
//! holding the file. `Sandbox::audit_verify` then reads the registry against it
//! (`Sandbox::with_registry_on_trail`); when artifacts lack their writes' lines, it waits
//! for each of their workflows' locks to be free for a moment and reads the trail again: a
//! write is registered, then audited, under its workflow's lock, so a registered artifact
//! the trail still lacks then is no run under way but a forgery (or a run awaiting
//! recovery, which is said apart). Recovery of a dead run keeps the same order (it audits
//! what was registered); changing the order would make verify report false unlogged
//! entries.

#[cfg(doc)]
use super::AuditLog;
use super::{
    AUDIT_FILE, AuditStatus, GENESIS_HASH, HEAD_FILE, HeadFile, SandboxAuditEntry, head_in,
};
use crate::artifact::{ARTIFACTS_FILE, ArtifactEntry};
use crate::confine::path::shown_path;
use crate::confine::state::{BLOCK, StateDir, StateFile};
use crate::journal::{Piece, scan};
use serde::Serialize;
use std::io;
use std::ops::ControlFlow;

/// `audit verify` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Whether the whole chain and head check out.
    pub ok: bool,
    /// Lines read: the whole trail when it checks out, else up to and including the
    /// first bad one.
    pub entries: u64,
    /// The first sequence number where the chain breaks.
    pub first_bad_seq: Option<u64>,
    /// What is wrong.
    pub reason: Option<String>,
}

/// How the reason of a verdict begins when the only fault is writes a dead run's
/// recovery has yet to record: no tampering, to verify again once recovered.
const NOT_YET_RECORDED: &str = "the audit trail does not record yet";

impl VerifyReport {
    /// Whether the trail only lacks the lines of writes awaiting recovery (no tampering).
    pub fn awaits_recovery(&self) -> bool {
        !self.ok
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(NOT_YET_RECORDED))
    }
}

/// `report` (of a sound chain), failed when the registry holds artifacts, `missing`,
/// whose writes the trail does not record; `pending` are such artifacts of workflows
/// whose run records still await recovery, said as such rather than as tampering.
pub(crate) fn with_unlogged(
    report: VerifyReport,
    missing: &[ArtifactEntry],
    pending: &[ArtifactEntry],
) -> VerifyReport {
    let Some(first) = missing.first() else {
        let Some(first) = pending.first() else {
            return report;
        };
        return VerifyReport {
            ok: false,
            first_bad_seq: None,
            reason: Some(format!(
                "{NOT_YET_RECORDED} the writes of {} registered artifact(s) (the first: {}, action {} of workflow {}): their run stopped before writing its lines (killed, or a full disk) and left its record for recovery, which records them at the workflow's next use or the next start once the state directory can be written; verify again then",
                pending.len(),
                first.artifact_id,
                shown_path(&first.action_id),
                shown_path(&first.workflow_id)
            )),
            ..report
        };
    };
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the artifact registry holds {} artifact(s) whose writes the audit trail does not record (the first: {}, action {} of workflow {}): lines were removed from the trail with its head made to match, the trail was replaced, or lines were added to the registry",
            missing.len(),
            first.artifact_id,
            shown_path(&first.action_id),
            shown_path(&first.workflow_id)
        )),
        ..report
    }
}

/// `report`, failed when the registry holds `unreadable` whole lines that are no
/// artifact: no write of the runtime leaves one (a line a crash cut short is removed when
/// the registry is opened), so they were added there or damaged.
/// `first_line` names where (see [`crate::artifact::first_unreadable_line`]), asked for
/// only when there are some; the report stands without it when the registry cannot be
/// read again.
pub(crate) fn with_unreadable_registry(
    report: VerifyReport,
    unreadable: u64,
    first_line: impl FnOnce() -> io::Result<Option<u64>>,
) -> VerifyReport {
    if unreadable == 0 || !report.ok {
        return report;
    }
    let first = match first_line() {
        Ok(Some(n)) => format!(" (the first: line {n} of {ARTIFACTS_FILE})"),
        Ok(None) => String::new(),
        Err(e) => {
            tracing::warn!(error = %e, "the artifact registry could not be read again to name its first unreadable line");
            String::new()
        }
    };
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the artifact registry holds {unreadable} line(s) that cannot be read as artifacts{first}: lines were added to or damaged in the registry"
        )),
        ..report
    }
}

/// A file write the trail records as done, as the artifact registry must hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedWrite {
    /// Its line's sequence number.
    pub seq: u64,
    /// The workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// The file written.
    pub target_path: String,
    /// The SHA-256 of the bytes written.
    pub after_checksum: String,
}

/// `report` (of a sound chain), failed when writes the trail records as done,
/// `unregistered` (see [`RecordedWrite`]), are missing from the artifact registry
/// or registered there with another path or other bytes than their lines name.
pub(crate) fn with_unregistered(
    report: VerifyReport,
    unregistered: &[&RecordedWrite],
) -> VerifyReport {
    let Some(first) = unregistered.first() else {
        return report;
    };
    VerifyReport {
        ok: false,
        first_bad_seq: None,
        reason: Some(format!(
            "the audit trail records {} write(s) the artifact registry does not hold as recorded, one artifact of the path and bytes its line names (the first: line {}, action {} of workflow {}, {}): lines were removed from, changed in or added to the registry, or that trail line was changed and the chain recomputed after it",
            unregistered.len(),
            first.seq,
            shown_path(&first.action_id),
            shown_path(&first.workflow_id),
            shown_path(&first.target_path)
        )),
        ..report
    }
}

/// The `error` of the success line recovery appends for a dead run's write that landed
/// and was overwritten by a later one before it was registered: no artifact is listed
/// for it (its size went with the later write).
pub const UNREGISTERED_DONE: &str = "written, as the later write's starting point shows, by a run that died before registering it: no artifact is listed for it";

/// The `error` of the success line recovery appends for a dead run's registered write
/// whose snapshot folder was removed or cannot be trusted: it landed (it was registered
/// after), and cannot be rolled back.
pub const DONE_WITHOUT_SNAPSHOT: &str = "written by a run that died before recording it, whose snapshot is missing or not trusted: it cannot be rolled back";

/// The writes of `recorded` the registry (`registered`: its entries for their actions,
/// or more) does not hold as their lines name them: one artifact per action, with the
/// path and checksum its line names. An action with no entry, with an entry of another
/// path or other bytes, or with a second line beside its own (added, or a copy of it)
/// is listed.
pub fn unregistered<'a>(
    recorded: &'a [RecordedWrite],
    registered: &[ArtifactEntry],
) -> Vec<&'a RecordedWrite> {
    let mut held: std::collections::HashMap<(&str, &str), Vec<&ArtifactEntry>> =
        std::collections::HashMap::new();
    for a in registered {
        held.entry((a.workflow_id.as_str(), a.action_id.as_str()))
            .or_default()
            .push(a);
    }
    recorded
        .iter()
        .filter(|e| {
            let entries = held
                .get(&(e.workflow_id.as_str(), e.action_id.as_str()))
                .map_or(&[][..], Vec::as_slice);
            // Exactly one: a copy of the action's own line, however exact, counts its
            // write twice in the lists and budgets.
            !matches!(
                entries,
                [a] if a.checksum_sha256 == e.after_checksum && a.path == e.target_path
            )
        })
        .collect()
}

/// `report` (of a sound chain), failed when the registry (`registered`: its entries for
/// the actions the trail records, or more) holds more than one artifact for one action:
/// an action registers one at most, whatever became of it (a success's copies are
/// [`unregistered`]'s; this finds those of actions that failed or were rolled back).
pub(crate) fn with_doubled(report: VerifyReport, registered: &[ArtifactEntry]) -> VerifyReport {
    let mut seen = std::collections::HashMap::new();
    for a in registered {
        let n = seen
            .entry((a.workflow_id.as_str(), a.action_id.as_str()))
            .or_insert(0usize);
        *n += 1;
        if *n == 2 {
            return VerifyReport {
                ok: false,
                first_bad_seq: None,
                reason: Some(format!(
                    "the artifact registry holds more than one artifact for action {} of workflow {} (the second: {}), which registers one at most: lines were added to the registry",
                    shown_path(&a.action_id),
                    shown_path(&a.workflow_id),
                    a.artifact_id
                )),
                ..report
            };
        }
    }
    report
}

/// The action executions, by workflow, that an audit log records as having written (or
/// tried to): each as `{execution_id}/{action_id}`, the form an artifact's
/// `generated_by_action` names its write by.
pub type Writes = std::collections::HashMap<String, std::collections::HashSet<String>>;

/// Whether `logged` records the write that registered an artifact of workflow
/// `workflow_id` (its `generated_by_action`): a line of that very run, not merely one of
/// the action's. A later rollback's line is its own run's: were it to count, undoing an
/// action would hide a write cut from the trail.
pub fn records(logged: &Writes, workflow_id: &str, generated_by_action: &str) -> bool {
    logged
        .get(workflow_id)
        .is_some_and(|runs| runs.contains(generated_by_action))
}

/// [`AuditLog::verify`] for the state directory at `state_dir`, writing nothing: no
/// recovery, no lock, and a torn last line left out as a crash leaves it. For a state
/// directory this process cannot write (a read-only copy, a read-only mount), where
/// opening the runtime fails.
/// With `registry`, the registry is compared too, as [`crate::Sandbox::audit_verify`]
/// does when the logs were written with durable appends.
pub fn verify_read_only(state_dir: &std::path::Path, registry: bool) -> io::Result<VerifyReport> {
    let mut files =
        StateDir::open_without_opening(state_dir, &[AUDIT_FILE, HEAD_FILE, ARTIFACTS_FILE])?
            .into_iter();
    let (log, head, registered) = (
        files.next().flatten(),
        files.next().flatten(),
        files.next().flatten(),
    );
    let head = match head {
        Some(f) => {
            let len = f.len()?;
            let mut first = vec![0; len.min(BLOCK as u64) as usize];
            f.read_exact_at(&mut first, 0)?;
            head_in(len, &first)
        }
        None => HeadFile::Missing,
    };
    let mut check = TrailCheck::new(head, registry);
    if let Some(log) = &log {
        let read_at = |buf: &mut [u8], at: u64| log.read_exact_at(buf, at);
        scan(&read_at, 0, log.len()?, &mut |piece| Ok(check.piece(piece)))?;
    }
    let (report, logged, recorded) = check.finish();
    if !report.ok || !registry {
        return Ok(report);
    }
    let (entries, unreadable) = match &registered {
        Some(file) => registry_entries(file)?,
        None => (Vec::new(), 0),
    };
    let report = with_unreadable_registry(report, unreadable, || match &registered {
        Some(file) => crate::artifact::first_unreadable_line(
            &|buf, at| file.read_exact_at(buf, at),
            file.len()?,
        ),
        None => Ok(None),
    });
    if !report.ok {
        return Ok(report);
    }
    let missing: Vec<ArtifactEntry> = entries
        .iter()
        .filter(|a| !records(&logged, &a.workflow_id, &a.generated_by_action))
        .cloned()
        .collect();
    let awaiting = awaiting_recovery(state_dir, &missing);
    let (pending, missing): (Vec<_>, Vec<_>) = missing
        .into_iter()
        .partition(|a| awaiting.contains(&a.workflow_id));
    let report = with_unlogged(report, &missing, &pending);
    if !report.ok {
        return Ok(report);
    }
    let report = with_unregistered(report, &unregistered(&recorded, &entries));
    if !report.ok {
        return Ok(report);
    }
    Ok(with_doubled(report, &entries))
}

/// The artifacts a registry file holds, and how many of its whole lines are none. A last
/// line without its newline is one a crash cut short, which opening the registry
/// removes: not counted.
fn registry_entries(file: &StateFile) -> io::Result<(Vec<ArtifactEntry>, u64)> {
    let mut entries = Vec::new();
    let mut unreadable = 0;
    let len = file.len()?;
    let read_at = |buf: &mut [u8], at: u64| file.read_exact_at(buf, at);
    let end = scan(&read_at, 0, len, &mut |piece| {
        match piece {
            Piece::Lines(_, buf) => {
                for (_, line) in crate::journal::json_lines::<ArtifactEntry>(&buf) {
                    match line {
                        Ok(a) => entries.push(a),
                        Err(_) => unreadable += 1,
                    }
                }
            }
            Piece::Overlong(..) => unreadable += 1,
        }
        Ok(ControlFlow::Continue(()))
    })?;
    // A cut line that still reads whole is an entry, as the runtime's reader takes it.
    if len - end < crate::journal::MAX_LINE {
        let mut cut = vec![0; (len - end) as usize];
        file.read_exact_at(&mut cut, end)?;
        entries.extend(serde_json::from_slice::<ArtifactEntry>(&cut).ok());
    }
    Ok((entries, unreadable))
}

/// The workflows of `missing` (artifacts whose writes the trail lacks) whose run record
/// in the state directory at `state_dir` awaits recovery: a run that died between its
/// registry line and its audit line, no tampering. One record at a time, and one that
/// cannot be read is taken as awaiting (it proves no tampering either); with no folder
/// of run records at all, none awaits anything.
fn awaiting_recovery(
    state_dir: &std::path::Path,
    missing: &[ArtifactEntry],
) -> std::collections::HashSet<String> {
    let mut workflows: Vec<&str> = missing.iter().map(|a| a.workflow_id.as_str()).collect();
    workflows.sort_unstable();
    workflows.dedup();
    let inflight = state_dir.join(crate::confine::state::INFLIGHT_DIR);
    let records_kept = !matches!(
        crate::confine::root::probe_checked_dir_through_link(&inflight, "run records"),
        Ok(None)
    );
    workflows
        .into_iter()
        .filter(|w| crate::plan::is_valid_id(w))
        .filter(|w| {
            StateDir::read_without_opening(
                &inflight,
                &[&format!("{w}.json")],
                crate::confine::state::BLOCK as u64,
            )
            .map_or(records_kept, |read| {
                read.into_iter()
                    .flatten()
                    .any(|rec| crate::recovery::record_awaits_recovery(&rec))
            })
        })
        .map(str::to_owned)
        .collect()
}

/// One pass over the trail's whole lines, in file order: the chain checked line by line
/// and against the head file, and, while it holds, the writes the lines record gathered
/// (when asked to). A few MiB of the trail are held at a time, however long it is.
pub(super) struct TrailCheck {
    pub(super) head: HeadFile,
    pub(super) gather: bool,
    pub(super) prev: String,
    expected_seq: u64,
    /// Lines read so far.
    pub(super) lines: u64,
    hash_at_head: Option<String>,
    /// The verdict, once a line broke the chain.
    pub(super) failed: Option<VerifyReport>,
    pub(super) writes: Writes,
    pub(super) recorded: Vec<RecordedWrite>,
}

impl TrailCheck {
    /// `head`: what the head file holds. `gather`: whether the writes are gathered too.
    pub(super) fn new(head: HeadFile, gather: bool) -> Self {
        Self {
            head,
            gather,
            prev: GENESIS_HASH.to_owned(),
            expected_seq: 1,
            lines: 0,
            hash_at_head: None,
            failed: None,
            writes: Writes::new(),
            recorded: Vec::new(),
        }
    }

    /// Reads the next piece of the trail; breaks off once the chain is broken.
    pub(super) fn piece(&mut self, piece: Piece) -> ControlFlow<()> {
        match piece {
            // Split on every newline: an empty line is a line too (and a broken chain).
            Piece::Lines(_, buf) => buf[..buf.len() - 1]
                .split(|&b| b == b'\n')
                .try_for_each(|line| self.line(line)),
            Piece::Overlong(_, len) => {
                self.lines += 1;
                let n = self.lines;
                self.fail(
                    self.expected_seq,
                    format!(
                        "line {n} is {len} bytes long, longer than any line the runtime writes (at most {}), so it was made or changed by hand",
                        crate::journal::MAX_LINE
                    ),
                )
            }
        }
    }

    fn fail(&mut self, seq: u64, reason: String) -> ControlFlow<()> {
        self.failed = Some(VerifyReport {
            ok: false,
            entries: self.lines,
            first_bad_seq: Some(seq),
            reason: Some(reason),
        });
        ControlFlow::Break(())
    }

    pub(super) fn line(&mut self, line: &[u8]) -> ControlFlow<()> {
        self.lines += 1;
        let (n, expected) = (self.lines, self.expected_seq);
        if line.is_empty() {
            return self.fail(
                expected,
                format!("line {n} is empty: the runtime never writes one, so it was inserted"),
            );
        }
        let e: SandboxAuditEntry = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(err) => {
                let why = crate::shape_words::worded_in_line::<SandboxAuditEntry>(
                    line,
                    &err,
                    "the entry",
                );
                return self.fail(
                    expected,
                    format!("line {n} is not a valid audit entry: {why}"),
                );
            }
        };
        if e.seq != expected {
            return self.fail(
                expected,
                format!(
                    "line {n} has seq {} where {expected} was expected: a line was removed, inserted or moved",
                    e.seq
                ),
            );
        }
        if e.prev_hash != self.prev {
            return self.fail(
                e.seq,
                format!(
                    "entry {} does not chain to the entry before it: a line was removed or reordered, or the line before it was edited and its hash made again",
                    e.seq
                ),
            );
        }
        // The hash covers the entry's meaning; the line must also be the very bytes the
        // runtime wrote for it, so that no edit at all (spaces, key order, escapes) passes.
        if !e.is_as_written(line) {
            return self.fail(
                e.seq,
                format!(
                    "entry {} does not match its hash: the line was edited",
                    e.seq
                ),
            );
        }
        if matches!(&self.head, HeadFile::At(h) if h.seq == e.seq) {
            self.hash_at_head = Some(e.entry_hash.clone());
        }
        self.prev.clone_from(&e.entry_hash);
        self.expected_seq += 1;
        if self.gather {
            self.gather(e);
        }
        ControlFlow::Continue(())
    }

    /// Keeps what `e` records of a write: the actions that changed a file, or tried to
    /// (succeeded, failed — a failure after the registry line leaves its artifact
    /// behind, see `Sandbox::audit_verify` — or rolled back; blocked and simulated
    /// actions register nothing, nor does a `create_directory`: a folder is no
    /// artifact), and the successful writes that registered an artifact (but those
    /// recovery found done and could not register, [`UNREGISTERED_DONE`]; the registry
    /// line is appended before the audit line, so each of them is registered).
    pub(super) fn gather(&mut self, e: SandboxAuditEntry) {
        let op = crate::catalog::op_for_intent(&e.mutation_type);
        let of_a_file = !op.is_some_and(|op| op.is_directory());
        if e.status == AuditStatus::Success
            && e.error.as_deref() != Some(UNREGISTERED_DONE)
            && op.is_some()
            && of_a_file
        {
            self.recorded.push(RecordedWrite {
                seq: e.seq,
                workflow_id: e.workflow_id.clone(),
                action_id: e.action_id.clone(),
                target_path: e.target_path,
                after_checksum: e.after_checksum.unwrap_or_default(),
            });
        }
        if matches!(
            e.status,
            AuditStatus::Success | AuditStatus::Failed | AuditStatus::RolledBack
        ) && of_a_file
        {
            // The run's own lines (its write, its failure, its undo) and recovery's,
            // which speaks for the run it recovers under that run's id.
            self.writes
                .entry(e.workflow_id)
                .or_default()
                .insert(format!("{}/{}", e.execution_id, e.action_id));
        }
    }

    /// The verdict (the chain's, then the head's), and the writes gathered.
    pub(super) fn finish(self) -> (VerifyReport, Writes, Vec<RecordedWrite>) {
        let gathered = |report| (report, self.writes, self.recorded);
        if let Some(failed) = self.failed {
            return gathered(failed);
        }
        let (n, last_seq) = (self.lines, self.expected_seq - 1);
        let bad = |seq: u64, reason: String| VerifyReport {
            ok: false,
            entries: n,
            first_bad_seq: Some(seq),
            reason: Some(reason),
        };
        let problem = match &self.head {
            HeadFile::At(h) if h.seq > last_seq => bad(
                last_seq + 1,
                format!(
                    "the log ends at seq {last_seq} but its head records seq {}: lines were removed from the end",
                    h.seq
                ),
            ),
            HeadFile::At(h)
                if h.seq > 0 && self.hash_at_head.as_deref() != Some(h.entry_hash.as_str()) =>
            {
                bad(
                    h.seq,
                    format!(
                        "entry {} differs from the hash recorded in the head: the log was rewritten",
                        h.seq
                    ),
                )
            }
            HeadFile::Missing if n > 0 => VerifyReport {
                first_bad_seq: None,
                ..bad(
                    0,
                    format!(
                        "the head file {HEAD_FILE} is missing although the log holds {n} entries: it was removed, so lines cut from the end cannot be ruled out"
                    ),
                )
            },
            HeadFile::Damaged(e) => VerifyReport {
                first_bad_seq: None,
                ..bad(0, format!("the head file {HEAD_FILE} is damaged ({e})"))
            },
            _ => VerifyReport {
                ok: true,
                entries: n,
                first_bad_seq: None,
                reason: None,
            },
        };
        gathered(problem)
    }
}
