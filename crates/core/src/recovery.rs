//! Start-up recovery. A run marks its workflow's record in the state directory's
//! `inflight/` active before it touches a file and idle when it ends. An active record
//! whose workflow lock is free at start-up belongs to a run that died (crash, `kill -9`, power cut): its actions
//! that were snapshotted but never audited as done are rolled back from their snapshots,
//! except those whose snapshot is also a commit record (batched durability) and whose new
//! bytes are durable, and those whose result is in place and registered (the run died
//! before its audit line): those are finished. The temporary files the run left are
//! removed.

use crate::audit::{AuditRecord, AuditStatus};
use crate::confine::RelPath;
use crate::confine::path::ROLLBACK_DIR;
use crate::confine::root::remove_temp_files;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::{Restorer, Sandbox, TargetState};
use cap_fs_ext::DirExt;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The record state of a workflow whose rollback is under way.
pub const ROLLING_BACK: &str = "rolling_back";

/// The record state of a run that ended, in a process that may live on, with a restore
/// whose audit line could not be appended (its mark is on disk): recovery only audits
/// the restores its marks record, touching no file of the run.
pub const RESTORES_UNAUDITED: &str = "restores_unaudited";

/// At most this many recovering processes are named in a run record.
const MAX_RECOVERED_BY: usize = 4;

/// Whether a record's run needs recovery. One that finished in this boot does not: its
/// process may live on until its next sync point, and if it died, nothing it wrote was
/// lost (a kill leaves the page cache whole). Judging its actions against the disk
/// would take another run's later write-back of old bytes for an undo.
fn needs_recovery(rec: &InflightRecord) -> bool {
    (rec.state == "active" || rec.state == ROLLING_BACK || rec.state == RESTORES_UNAUDITED)
        && !rec.finished_this_boot()
}

impl Sandbox {
    /// Whether `workflow_id`'s run record still awaits recovery (a run or rollback that
    /// died, or one that could not write its last lines): what it did is not all on the
    /// trail yet.
    pub(crate) fn awaits_recovery(&self, workflow_id: &str) -> bool {
        self.state
            .inflight_read(workflow_id)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<InflightRecord>(&b).ok())
            .is_some_and(|r| needs_recovery(&r))
    }
}

/// The record a workflow's run keeps while it changes files (`state: active`), set back to
/// `idle` when the run ends. One file per workflow, rewritten in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InflightRecord {
    /// `active` while a run changes files, `idle` after.
    pub state: String,
    /// The run.
    pub execution_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// When it started.
    pub started_at: String,
    /// Set when the run has ended but, with batched syncs, its last writes may still be
    /// in memory: a start after a crash recovers it as if it were under way, a new run of
    /// the workflow in a live process does not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finished: bool,
    /// The boot of the machine in which the run began and, once `finished`, ended (see
    /// [`crate::confine::state::boot_id`]): only a later boot, after a crash of the
    /// machine, may have lost its writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    /// An id made by each process that began recovering this run: recovery writes
    /// temporary files too, and one that died leaves them for the next to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recovered_by: Vec<String>,
    /// The sandbox roots the run writes into, as configured: a start without one of
    /// them cannot judge the run's writes there, and leaves the run to a start that has
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<String>,
}

impl InflightRecord {
    /// The same run's record once it is over and needs no recovery.
    pub fn idle(&self) -> Self {
        Self {
            state: "idle".to_owned(),
            finished: false,
            ..self.clone()
        }
    }

    /// The same run's record once it has ended, its writes perhaps not yet durable.
    pub fn finished(&self) -> Self {
        Self {
            finished: true,
            boot: crate::confine::state::boot_id().map(str::to_owned),
            ..self.clone()
        }
    }

    /// Whether the run finished in this boot of the machine.
    fn finished_this_boot(&self) -> bool {
        self.finished && self.this_boot()
    }

    /// Whether the record was written in this boot of the machine.
    fn this_boot(&self) -> bool {
        self.boot.is_some() && self.boot.as_deref() == crate::confine::state::boot_id()
    }
}

/// What recovery did for one dead run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The dead run.
    pub execution_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// In-doubt actions rolled back.
    pub rolled_back: usize,
    /// Actions finished: written but not yet registered or audited, or (batched
    /// durability) committed, whose new bytes recovery put in place.
    pub completed: usize,
    /// Unaudited actions whose target another run wrote before recovery, and that never
    /// reached it: marked undone (audited as rolled back), the other run's write kept.
    pub superseded: usize,
    /// Temporary files removed.
    pub temp_files_removed: usize,
    /// Folders (absolute, quoted) where the dead process's temporary files could not be
    /// removed, each with why: left for the operator, who is told.
    pub temp_files_left: Vec<String>,
    /// Restores the dead process made without auditing them, now audited: for a dead
    /// rollback, files found restored but unmarked; for either, marked snapshots the
    /// audit trail does not mention.
    pub restores_recorded: usize,
    /// Whether the dead process was rolling the workflow back (not running a plan).
    pub rollback: bool,
    /// Snapshot folders of the workflow left alone because they could not be read or
    /// trusted. The run is recorded as recovered all the same: judging it again at every
    /// start would undo later changes to its targets.
    pub untrusted: usize,
    /// Nothing of the workflow's snapshots could be read, or some lie in roots this
    /// start is not configured with ([`Self::missing_roots`]), so nothing was judged: the
    /// run stays recorded as unfinished and the next start tries again.
    pub retry: bool,
    /// Roots the run writes into that this start is not configured with.
    pub missing_roots: Vec<String>,
    /// Why nothing was judged when the cause was another process holding a log or a
    /// target past `limits.lock_wait_seconds` ([`Self::retry`] is set): a sentence.
    pub busy: Option<String>,
    /// Why nothing was judged for any other cause ([`Self::retry`] is set): a log or the
    /// snapshots that could not be read (a full or failing disk), in a few words.
    pub why: Option<String>,
    /// The code of the refusal behind [`Self::why`] when it is not the disk's failure: a
    /// link, a file or a FIFO in the place of a snapshot folder (`reserved_path`), a
    /// record that is not the runtime's (`checksum_mismatch`).
    pub why_code: Option<ReasonCode>,
    /// Why targets of the run could not be judged (each a sentence naming one): what
    /// stands there is something the runtime never reads — a file with a second hard
    /// link, a symbolic link on its path, a FIFO or device at it. Only
    /// whoever put it there can put it right; until then nothing of the run is judged
    /// ([`Self::retry`]), since any verdict (done, undone, overwritten) would be a guess.
    pub unjudged: Vec<String>,
}

impl Recovered {
    /// What a log read gave, or `None` with the recovery left for a later try (and why,
    /// when another process held the log): judging on an empty view would take audited
    /// actions for unaudited and undo them.
    fn read<T>(&mut self, read: std::io::Result<T>) -> Option<T> {
        read.inspect_err(|e| {
            self.busy = busy_log(e);
            self.why = Some(format!(
                "a log of the state directory could not be read ({})",
                crate::error::io_words(e)
            ));
            self.retry = true;
        })
        .ok()
    }

    /// What died: `rollback` or `run`.
    pub fn what(&self) -> &'static str {
        if self.rollback { "rollback" } else { "run" }
    }

    /// Whether this recovery of `rec` is worth telling: a run that had finished (its
    /// process may live on, waiting for its next sync point) and needed nothing is not.
    fn worth_telling(&self, rec: &InflightRecord) -> bool {
        !rec.finished
            || self.retry
            || self.rolled_back
                + self.completed
                + self.superseded
                + self.temp_files_removed
                + self.restores_recorded
                + self.untrusted
                + self.temp_files_left.len()
                > 0
    }
}

impl Sandbox {
    /// Recovers every run that died while changing files. Runs still alive in another
    /// process (their workflow lock is held) are left alone.
    pub fn recover(&self) -> Vec<Recovered> {
        self.remove_dead_record_temp_files();
        let mut out = self.recover_commit_logs();
        let records = match self.state.inflight_list() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list in-flight runs");
                return Vec::new();
            }
        };
        // Runs that finished in this boot, whose processes left no sync point behind
        // them: made durable and marked idle, so that a later boot, which cannot tell
        // what a crash lost, never judges them.
        let mut finished = Vec::new();
        for (id, bytes) in records {
            let parsed = serde_json::from_slice::<InflightRecord>(&bytes).ok();
            if parsed
                .as_ref()
                .is_some_and(|r| !needs_recovery(r) && !r.finished_this_boot())
            {
                continue;
            }
            // Already left for another start by the replay of its commit log.
            if out.iter().any(|r| r.retry && r.workflow_id == id) {
                continue;
            }
            if !crate::plan::is_valid_id(&id) {
                // No run can hold a workflow of that name.
                tracing::warn!(record = %id, "in-flight record of no workflow removed");
                let _ = self.state.inflight_remove(&id);
                continue;
            }
            let lock = match self.state.try_lock(&format!("wf-{id}")) {
                Ok(Some(l)) => l,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot lock a workflow for recovery");
                    continue;
                }
            };
            // Read again under the lock: what was listed may have been a record its run
            // was writing, or one a run has taken over since.
            let rec = match self.state.inflight_read(&id) {
                Ok(Some(b)) => serde_json::from_slice::<InflightRecord>(&b).ok(),
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, record = %id, "cannot read an in-flight record");
                    continue;
                }
            };
            let Some(rec) = rec.filter(|r| r.workflow_id == id) else {
                tracing::warn!(record = %id, "unreadable in-flight record removed");
                let _ = self.state.inflight_remove(&id);
                continue;
            };
            if rec.finished_this_boot() {
                // A log that could not be emptied (it holds entries for a root this start
                // lacks) keeps the run finished, for a start that can empty it.
                if self.commit_log_holds_entries(&id).is_ok_and(|held| !held) {
                    finished.push((lock, rec));
                }
                continue;
            }
            if !needs_recovery(&rec) {
                continue;
            }
            let report = self.recover_record(&rec);
            let retry = report.retry;
            if report.worth_telling(&rec) {
                out.push(report);
            }
            // What recovery appended must be durable before the record says the run
            // needs no more recovery.
            if let Err(r) = self.conclude_sync() {
                tracing::warn!(reason = %r.reason, "cannot sync after recovery");
                if !retry {
                    self.unclaim(&rec);
                }
                continue;
            }
            if !retry {
                self.write_idle_record(&rec, self.durable());
            }
            drop(lock);
        }
        if !finished.is_empty() {
            match self.sync_logged_writes() {
                Ok(()) => {
                    for (_lock, rec) in &finished {
                        self.write_idle_record(rec, self.durable());
                    }
                }
                Err(r) => {
                    tracing::warn!(reason = %r.reason, "cannot sync the writes of finished runs")
                }
            }
        }
        out
    }

    /// Recovers a run or rollback of `workflow_id` that died while this process was
    /// running, before a new one takes its record over (after which nothing could find
    /// it): its record is still under way, yet the workflow's lock, which the owner holds
    /// until it marks the record finished or idle, is free. Call with that lock held,
    /// and only when about to write. Refused (`io_error`) when the dead run's snapshots
    /// cannot be read, so that its record is kept for a later try.
    /// Returns the record's file, still open, for the new run to write through.
    pub(crate) fn recover_dead_run(
        &self,
        workflow_id: &str,
    ) -> Verdict<Option<crate::confine::state::BlockFile>> {
        let io = |e: std::io::Error| {
            Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not read the run record of workflow {workflow_id}: {}",
                    crate::error::io_words(&e)
                ),
            )
        };
        let Some(file) = self.state.inflight_open(workflow_id).map_err(io)? else {
            return Ok(None);
        };
        // Whatever the record says: entries another process logged for a root this one
        // lacks would be emptied with the log at this run's first sync point.
        self.refuse_foreign_log_entries(workflow_id)?;
        let Ok(rec) = serde_json::from_slice::<InflightRecord>(&file.read().map_err(io)?) else {
            return Ok(Some(file));
        };
        if !needs_recovery(&rec) {
            return Ok(Some(file));
        }
        let what = if rec.state == ROLLING_BACK {
            "rollback"
        } else {
            "run"
        };
        let missing = self.missing_roots(&rec);
        if !missing.is_empty() {
            // A setting to change, not a failure of the disk: as a rollback of a workflow
            // that wrote into another root is refused.
            return Err(Refusal::new(
                ReasonCode::OutsideSandbox,
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) that wrote into {}, which this process is not configured with; run any command with that root configured to recover it, then retry",
                    rec.execution_id,
                    missing.join(", ")
                ),
            ));
        }
        // Logged before the machine last stopped: only a replay brings back what its
        // crash lost, and the start that should have made it did not (see its log).
        if !rec.this_boot() && self.commit_log_holds_entries(workflow_id).map_err(io)? {
            return Err(Refusal::new(
                ReasonCode::IoError,
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) whose commit log, written before the machine restarted, was not replayed (see the log of the last start); restart the runtime to replay it, then retry",
                    rec.execution_id
                ),
            ));
        }
        // Whatever the dead process logged in this boot is in memory or on disk already:
        // made durable and dropped from its log, so that no later replay redoes what
        // this undoes.
        self.settle_commit_log(workflow_id)?;
        let report = self.recover_record(&rec);
        if !report.unjudged.is_empty() {
            // Something someone put in the way, not a failure of the disk (HTTP 500).
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) that cannot be judged yet: {}; remove that second hard link, symbolic link or special file, then retry",
                    rec.execution_id,
                    report.unjudged.join("; ")
                ),
            ));
        }
        if let Some(busy) = &report.busy {
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) that cannot be recovered now: {busy}; nothing was done: try again later, or raise limits.lock_wait_seconds",
                    rec.execution_id
                ),
            ));
        }
        if report.retry {
            let why = report.why.as_deref().map_or_else(
                || "none of its snapshots could be read (see the log); make its sandbox roots readable again".to_owned(),
                |why| format!("{why} (see the log); put that right"),
            );
            return Err(Refusal::new(
                report.why_code.unwrap_or(ReasonCode::IoError),
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) that could not be recovered: {why}, then retry",
                    rec.execution_id
                ),
            ));
        }
        self.conclude_sync().inspect_err(|_| self.unclaim(&rec))?;
        tracing::warn!(
            workflow = %workflow_id,
            execution = %rec.execution_id,
            rolled_back = report.rolled_back,
            completed = report.completed,
            restores_recorded = report.restores_recorded,
            "recovered an interrupted run of the workflow before touching its snapshots"
        );
        self.write_idle_record(&rec, self.durable());
        Ok(Some(file))
    }

    /// The roots a run record names that this sandbox is not configured with.
    fn missing_roots(&self, rec: &InflightRecord) -> Vec<String> {
        rec.roots
            .iter()
            .filter(|r| !self.roots.iter().any(|c| c.is_named_by(r)))
            .cloned()
            .collect()
    }

    fn recover_record(&self, rec: &InflightRecord) -> Recovered {
        let missing_roots = self.missing_roots(rec);
        if !missing_roots.is_empty() {
            return Recovered {
                execution_id: rec.execution_id.clone(),
                workflow_id: rec.workflow_id.clone(),
                rollback: rec.state == ROLLING_BACK,
                retry: true,
                missing_roots,
                ..Recovered::default()
            };
        }
        if rec.state == RESTORES_UNAUDITED {
            let recorded = self
                .try_record_marked_restores(&rec.workflow_id)
                .inspect_err(|e| tracing::error!(error = %e, "could not audit a run's marked restores; the next start tries again"));
            let why = recorded.as_ref().err().map(|e| {
                format!(
                    "its files were restored, but the audit trail could not record it ({}): the state directory must take the lines",
                    crate::error::io_words(e)
                )
            });
            return Recovered {
                execution_id: rec.execution_id.clone(),
                workflow_id: rec.workflow_id.clone(),
                restores_recorded: *recorded.as_ref().unwrap_or(&0),
                retry: recorded.is_err(),
                busy: recorded.err().and_then(|e| busy_log(&e)),
                why,
                ..Recovered::default()
            };
        }
        let claimed = self.claim(rec);
        let report = if rec.state == ROLLING_BACK {
            self.recover_rollback(&claimed)
        } else {
            self.recover_run(&claimed)
        };
        if report.retry {
            self.unclaim(rec);
        }
        report
    }

    /// Names this process in a dead run's record before it writes anything for it: a
    /// recovery that dies too leaves temporary files known only by its process, which the
    /// next recovery then removes with the run's own. Returns the record as written.
    fn claim(&self, rec: &InflightRecord) -> InflightRecord {
        let mut claimed = rec.clone();
        if !rec.recovered_by.iter().any(|id| crate::ids::made_here(id)) {
            // The record is one small block: the oldest names give way.
            if claimed.recovered_by.len() >= MAX_RECOVERED_BY {
                claimed.recovered_by.remove(0);
            }
            claimed.recovered_by.push(crate::ids::unique());
            if let Err(e) = self.write_record(&claimed, self.durable()) {
                tracing::warn!(error = %e, "could not name this process in a run record it recovers");
            }
        }
        claimed
    }

    /// The sync point that makes what a recovery did durable, before the run's record
    /// says it needs no more recovery.
    fn conclude_sync(&self) -> Verdict {
        self.failpoints.check("recovery_sync").map_err(|e| {
            Refusal::new(
                ReasonCode::IoError,
                format!("could not sync to stable storage: {e}"),
            )
        })?;
        self.sync_point()
    }

    /// Puts back a dead run's record, without this process's name, after a recovery of
    /// it that did not conclude (its result could not be audited or made durable): the
    /// next recovery, in another process, removes the temporary files of the processes
    /// the record names, and this one lives on and may have writes under way in the
    /// same folders.
    fn unclaim(&self, rec: &InflightRecord) {
        let mut back = rec.clone();
        back.recovered_by.retain(|id| !crate::ids::made_here(id));
        if let Err(e) = self.write_record(&back, self.durable()) {
            tracing::warn!(error = %e, "could not restore a run record after an unfinished recovery");
        }
    }

    /// Replays the commit logs of workflows no process is running (see
    /// [`crate::commit_log`]), then recovers their runs as usual, makes it all durable
    /// and empties the logs.
    fn recover_commit_logs(&self) -> Vec<Recovered> {
        let workflows = match self.state.commit_logs() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list commit logs");
                return Vec::new();
            }
        };
        let read_log = |wf: &str| {
            self.state.commit_log_file(wf).and_then(|f| match f {
                Some(f) => crate::commit_log::read(&f).map(|e| Some((f, e))),
                None => Ok(None),
            })
        };
        // Most logs are empty: they are told apart without taking the lock (which may
        // mean creating its file), and read again under it. The others are replayed in
        // the order their first writes were made: two workflows may have rewritten one
        // file, and each replay builds on what the earlier ones put back.
        let mut pending: Vec<(String, String)> = workflows
            .into_iter()
            .filter(|wf| crate::plan::is_valid_id(wf))
            .filter_map(|wf| match read_log(&wf) {
                Ok(Some((_, e))) if e.is_empty() => None,
                Ok(Some((_, e))) => Some((e[0].meta.taken_at.clone(), wf)),
                _ => Some((String::new(), wf)),
            })
            .collect();
        pending.sort();
        let mut out = Vec::new();
        for (_, wf) in pending {
            let read_log = || read_log(&wf);
            let Ok(Some(_lock)) = self.state.try_lock(&format!("wf-{wf}")) else {
                continue;
            };
            let record = || {
                self.state
                    .inflight_read(&wf)
                    .ok()
                    .flatten()
                    .and_then(|b| serde_json::from_slice::<InflightRecord>(&b).ok())
            };
            // Its run finished in this boot: nothing the log covers was lost, so it is
            // not replayed, only made durable and emptied (as that process's next sync
            // point would); settling refuses a log that covers a root this start lacks.
            if record().is_some_and(|r| r.finished_this_boot()) {
                if let Err(r) = self.settle_commit_log(&wf) {
                    tracing::warn!(reason = %r.reason, workflow = %wf, "cannot empty a finished run's commit log");
                }
                continue;
            }
            let read = read_log();
            let (file, entries) = match read {
                Ok(Some((f, e))) if !e.is_empty() => (f, e),
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, workflow = %wf, "cannot read a commit log");
                    continue;
                }
            };
            // The replay writes targets through temporary files. What earlier replays or
            // recoveries of this log that died left beside them goes first (the run's
            // own, staged bytes among them, are its recovery's to judge), and this
            // process is named before it writes, for the next start should it die too.
            let before = record().or_else(|| entries.last().map(|e| e.record.clone()));
            let mut swept = Recovered::default();
            if let Some(r) = &before {
                let earlier: Vec<&str> = dead_makers(r).into_iter().skip(1).collect();
                let dirs = entries
                    .iter()
                    .filter_map(|e| {
                        let i = self
                            .roots
                            .iter()
                            .position(|r| r.is_named_by(&e.meta.root))?;
                        Some((i, e.meta.target().parent_components().to_vec()))
                    })
                    .collect();
                self.remove_dead_temp_files(&earlier, dirs, &mut swept);
                self.claim(r);
            }
            let (replayed, complete, kept) = self.replay_commits(&wf, &entries);
            // The record was not synced with the log: if it is gone, the log's last run
            // stands in for it.
            let mut rec = record().or_else(|| entries.last().map(|e| e.record.clone()));
            // Entries kept for a root not configured now hold acknowledged writes: the
            // record names that root, so that until a start that has it replays them,
            // no run, rollback or prune of the workflow here empties the log.
            if !kept.is_empty()
                && let Some(r) = rec.as_mut()
            {
                r.finished = false;
                if !matches!(r.state.as_str(), ROLLING_BACK | RESTORES_UNAUDITED) {
                    r.state = "active".to_owned();
                }
                for &i in &kept {
                    if !r.roots.contains(&entries[i].meta.root) {
                        r.roots.push(entries[i].meta.root.clone());
                    }
                }
                if let Err(e) = self.write_record(r, self.durable()) {
                    tracing::warn!(error = %e, workflow = %wf, "could not name a missing root in a run record");
                }
            }
            let dead = rec.as_ref().filter(|r| needs_recovery(r));
            let mut report = match dead {
                Some(r) => self.recover_record(r),
                None => Recovered {
                    execution_id: rec
                        .as_ref()
                        .map(|r| r.execution_id.clone())
                        .unwrap_or_default(),
                    workflow_id: wf.clone(),
                    ..Recovered::default()
                },
            };
            report.completed += replayed;
            report.temp_files_removed += swept.temp_files_removed;
            report.temp_files_left.append(&mut swept.temp_files_left);
            // Entries for a root not configured now stay, alone, for a start that has it:
            // their writes were acknowledged, and the others must not be replayed again.
            let keep: Vec<_> = kept.iter().map(|&i| entries[i].clone()).collect();
            let concluded = if !complete {
                tracing::error!(workflow = %wf, "a commit log could not be replayed in full; it is kept for the next start");
                false
            } else if let Err(r) = self.sync_logged_writes() {
                tracing::warn!(reason = %r.reason, "cannot sync after replaying a commit log");
                false
            } else if let Err(e) = crate::commit_log::retain(&file, &keep) {
                tracing::warn!(error = %e, workflow = %wf, "cannot empty a commit log");
                false
            } else {
                true
            };
            if let Some(r) = dead
                && !report.retry
            {
                if concluded {
                    self.write_idle_record(r, self.durable());
                } else {
                    self.unclaim(r);
                }
            }
            // No dead run's record: this process was named for the replay only, and
            // lives on.
            if dead.is_none()
                && let Some(r) = &rec
            {
                self.unclaim(r);
            }
            if !complete
                || (concluded && (replayed > 0 || dead.is_some_and(|r| report.worth_telling(r))))
            {
                out.push(report);
            }
        }
        out
    }

    /// Redoes what a commit log's entries committed and the disk lost: each entry's
    /// snapshot, registry entry and audit record, and per target the newest entry's new
    /// bytes. An entry whose snapshot is marked restored was undone (durably) and is
    /// skipped. A target that holds none of the contents the entries knew for it was
    /// changed by someone else since, and is left as it is; each target is judged and
    /// written under its lock. Returns how many entries
    /// needed anything, and whether every write it tried succeeded.
    fn replay_commits(
        &self,
        wf: &str,
        entries: &[crate::commit_log::CommitEntry],
    ) -> (usize, bool, Vec<usize>) {
        use crate::snapshot::Snapshotter;
        let audited: HashSet<(String, String)> = self
            .audit
            .by_workflow(wf)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.status == AuditStatus::Success)
            .map(|e| (e.execution_id, e.action_id))
            .collect();
        let mut live = Vec::new();
        let mut changed: HashSet<String> = HashSet::new();
        let mut complete = true;
        let mut superseded = false;
        let mut kept = Vec::new();
        for (at, e) in entries.iter().enumerate() {
            let (meta, Some(commit)) = (&e.meta, &e.meta.commit) else {
                continue;
            };
            let Some(i) = self.roots.iter().position(|r| r.is_named_by(&meta.root)) else {
                // Its write was acknowledged: the entry is kept for a start that has the
                // root.
                tracing::warn!(root = %meta.root, "a commit log entry names a root not configured now; it is kept");
                kept.push(at);
                continue;
            };
            if meta.workflow_id != wf {
                continue;
            }
            let root = &self.roots[i];
            match Snapshotter::load(root, &self.seal, wf, &meta.action_id) {
                Ok(Some(s)) if s.restored => continue,
                Ok(Some(s)) if s.meta != *meta => {
                    tracing::warn!(action = %meta.action_id, "another snapshot holds a logged action's folder; entry skipped");
                    continue;
                }
                _ => {}
            }
            // The backup and metadata may be missing or torn even when the folder loads.
            let before = e.backup.as_deref().map(crate::hash::sha256_hex);
            let backup_ok = e.backup.is_none() || before == meta.sha256;
            if !backup_ok {
                continue;
            }
            if let Err(r) = Snapshotter::repair(root, &self.seal, meta, e.backup.as_deref()) {
                tracing::error!(reason = %r, "recovery could not rewrite a logged snapshot");
                complete = false;
                continue;
            }
            let was_audited =
                audited.contains(&(meta.execution_id.clone(), meta.action_id.clone()));
            // Never audited, and another run changed the target after this entry was
            // logged without finding its result there (its process died before the
            // rename): that change stands, and this action is recorded undone, never
            // redone over it. An audited action landed: whatever came after is not
            // evidence against it.
            if !was_audited
                && self
                    .first_change_by_another(i, meta)
                    .is_some_and(|first| !found_its_result(meta, &first))
            {
                let current = self.target_checksum(i, &meta.target());
                if let Err(r) = self.mark_restored(
                    i,
                    meta,
                    &e.record.execution_id,
                    &current,
                    &[],
                    Restorer::Recovery { found: None },
                ) {
                    tracing::error!(reason = %r, "recovery could not mark an overtaken logged action undone");
                    complete = false;
                }
                superseded = true;
                continue;
            }
            match self.complete_logs(commit, was_audited) {
                Ok(true) => {
                    changed.insert(meta.snapshot_id.clone());
                }
                Ok(false) => {}
                Err(()) => complete = false,
            }
            live.push((i, e));
        }
        let mut seen: HashSet<(usize, &str)> = HashSet::new();
        for &(i, e) in live.iter().rev() {
            let meta = &e.meta;
            if !seen.insert((i, meta.original_path.as_str())) {
                continue;
            }
            let rel = meta.target();
            // A live process may be writing the target: judge and replace it under the
            // target's lock, as every writer does.
            let _held = match self.lock_target(i, &rel) {
                Ok(h) => h,
                Err(r) => {
                    tracing::error!(reason = %r, "recovery could not lock a logged action's target");
                    complete = false;
                    continue;
                }
            };
            let current = self.target_checksum(i, &rel);
            let after = meta.commit.as_ref().map(|c| c.after_sha256.clone());
            if current == after {
                // In place, perhaps only in memory, maybe beneath a mount inside the
                // root: the sync that concludes the replay must cover it.
                if let Err(r) = self.cover_target(i, &rel) {
                    tracing::error!(reason = %r, "recovery could not cover a logged target for its sync");
                    complete = false;
                }
                continue;
            }
            let known = live
                .iter()
                .filter(|(j, o)| *j == i && o.meta.original_path == meta.original_path)
                .any(|(_, o)| {
                    current == o.meta.sha256
                        || current == o.meta.commit.as_ref().map(|c| c.after_sha256.clone())
                });
            // What the target holds may be older bytes of this log's that a later run
            // of another workflow wrote back.
            if !known || self.put_back_by_another(i, meta, &current) {
                tracing::warn!(path = %meta.original_path, "a logged target changed since; left as it is");
                continue;
            }
            let mode = meta
                .mode
                .map_or(crate::confine::root::FILE_MODE, |m| m & 0o666);
            let put = self.roots[i]
                .stage_write(
                    &rel,
                    &crate::confine::root::temp_name(),
                    &e.bytes,
                    mode,
                    None,
                )
                .and_then(|st| {
                    self.fail_at("replay_staged")?;
                    st.commit(crate::confine::root::Put::Any, false)
                        .map_err(|err| self.roots[i].map_open_error(&rel, err))
                })
                .and_then(|()| self.cover_target(i, &rel));
            match put {
                Ok(()) => {
                    changed.insert(meta.snapshot_id.clone());
                }
                Err(r) => {
                    tracing::error!(reason = %r, "recovery could not put a logged action's bytes in place");
                    complete = false;
                }
            }
        }
        if superseded {
            self.record_marked_restores(wf);
        }
        (changed.len(), complete, kept)
    }

    /// A rollback died. It restored targets newest first and recorded each step after
    /// its restore, so at most the step in progress is unrecorded: per target, newest
    /// first, an unmarked snapshot of an action audited as done whose target holds the
    /// action's `before` checksum was restored by it and is recorded now; one whose target
    /// still holds the action's result, or anything else, ends the walk for that target.
    fn recover_rollback(&self, rec: &InflightRecord) -> Recovered {
        let mut report = Recovered {
            execution_id: rec.execution_id.clone(),
            workflow_id: rec.workflow_id.clone(),
            rollback: true,
            ..Recovered::default()
        };
        let mut done: HashMap<String, Option<String>> = HashMap::new();
        // Read, or nothing is judged: an empty view would take every step for undone.
        let Some(entries) = report.read(self.audit.by_workflow(&rec.workflow_id)) else {
            return report;
        };
        for e in entries {
            match e.status {
                AuditStatus::Success => {
                    done.insert(e.action_id, e.after_checksum);
                }
                AuditStatus::RolledBack => {
                    done.remove(&e.action_id);
                }
                _ => {}
            }
        }
        let Some(snaps) = self.dead_run_snapshots(rec, &mut report) else {
            return report;
        };
        let removed;
        (report.unjudged, removed) = self.unjudged(
            rec,
            snaps
                .iter()
                .filter(|(_, s)| !s.restored && done.contains_key(&s.meta.action_id)),
        );
        report.temp_files_removed += removed;
        if !report.unjudged.is_empty() {
            report.retry = true;
            return report;
        }
        // A restore writes its bytes aside first (and its mark): the dead rollback's
        // temporary files may lie beside any of the workflow's targets.
        let dirs = snaps
            .iter()
            .map(|(i, s)| (*i, s.meta.target().parent_components().to_vec()))
            .collect();
        self.remove_dead_temp_files(&dead_makers(rec), dirs, &mut report);
        let mut settled: HashSet<(usize, String)> = HashSet::new();
        let mut records = Vec::new();
        for (i, s) in snaps.into_iter().rev() {
            let key = (i, s.meta.original_path.clone());
            if s.restored || settled.contains(&key) {
                continue;
            }
            let Some(after) = done.get(&s.meta.action_id) else {
                continue;
            };
            // Restored: the target is as the action found it and not as it left it.
            // Compared as states, not checksums: a directory has none, and a removed
            // `create_directory` is told from a standing one only by what is there.
            let now = self.target_state(i, &s.meta.target());
            let as_left = if s.meta.is_directory_action() {
                TargetState::Directory
            } else {
                after
                    .clone()
                    .map_or(TargetState::Missing, TargetState::File)
            };
            if now != TargetState::found_by(&s.meta) || now == as_left {
                settled.insert(key);
                continue;
            }
            let current = now.checksum();
            // The dead rollback put the target back; the directories its action made on
            // the way are finished here as the restore would have (removed, or left on
            // the ledger).
            let left = match s.meta.kind {
                crate::snapshot::SnapshotKind::Missing => {
                    self.remove_created_dirs_of(i, &s.meta).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            self.record_left_dirs(i, &s.meta, &left);
            // What the restore replaced is on no mark: the trail's last word on the
            // target says what it held (another workflow's change, under a forced
            // rollback), else the action's own result. Kept on the mark, for a start
            // that audits it should this one's line not be written.
            let before = self
                .last_recorded(i, &s.meta.target())
                .map_or_else(|| after.clone(), |l| l.after_checksum);
            if let Err(r) = self.mark_restored(
                i,
                &s.meta,
                &rec.execution_id,
                &current,
                &left,
                Restorer::Recovery {
                    found: Some(&before),
                },
            ) {
                tracing::warn!(reason = %r, "could not mark a snapshot restored");
                continue;
            }
            records.push(self.rollback_record(
                &rec.execution_id,
                &rec.workflow_id,
                i,
                &s.meta,
                before,
                current,
            ));
            report.restores_recorded += 1;
        }
        if let Err(e) = self.audit.append(records) {
            tracing::error!(error = %e, "recovery could not audit a dead rollback's restores");
        }
        report.restores_recorded += self.record_marked_restores(&rec.workflow_id);
        report
    }

    fn recover_run(&self, rec: &InflightRecord) -> Recovered {
        let mut report = Recovered {
            execution_id: rec.execution_id.clone(),
            workflow_id: rec.workflow_id.clone(),
            ..Recovered::default()
        };
        // What the dead run audited: every outcome, and for successes the checksum the
        // target should now have.
        let mut audited: HashMap<String, Option<Option<String>>> = HashMap::new();
        // Read, or nothing is judged: an empty view would take every action for
        // unaudited, and undo finished ones.
        let Some(entries) = report.read(self.audit.by_workflow(&rec.workflow_id)) else {
            return report;
        };
        for e in entries {
            if e.execution_id != rec.execution_id || e.status == AuditStatus::Simulated {
                continue;
            }
            let after = (e.status == AuditStatus::Success).then_some(e.after_checksum);
            audited.insert(e.action_id, after);
        }
        let Some(snaps) = self.dead_run_snapshots(rec, &mut report) else {
            return report;
        };
        let mut dirs: HashSet<(usize, Vec<String>)> = HashSet::new();
        let mut in_doubt = Vec::new();
        // Newest first, one target at a time: an action is judged against what its
        // target holds once the newer in-doubt actions on it are undone, and once one is
        // finished the older ones on the same target are too (their result was its
        // starting point, so the target cannot hold it any more).
        let mut settled: HashSet<(usize, String)> = HashSet::new();
        let mut expected: HashMap<(usize, String), Option<String>> = HashMap::new();
        let Some(registered) = report.read(self.registry.get_by_workflow(&rec.workflow_id)) else {
            return report;
        };
        let mut finish_audits = Vec::new();
        let mine: Vec<_> = snaps
            .into_iter()
            .filter(|(_, s)| s.meta.execution_id == rec.execution_id)
            .collect();
        // Every target of the run stays as judged until it is finished or restored:
        // other workflows may be writing (recovery also runs in a live process, at the
        // next run of the dead one's workflow).
        let _held = match self.lock_targets(mine.iter().map(|(i, s)| (*i, s.meta.target()))) {
            Ok(h) => h,
            Err(r) => {
                report.busy = (r.reason_code == ReasonCode::Conflict).then_some(r.reason);
                report.retry = true;
                return report;
            }
        };
        // Only never-audited actions await a verdict that depends on what their targets
        // hold; an audited one whose target cannot be looked at is judged finished below.
        let removed;
        (report.unjudged, removed) = self.unjudged(
            rec,
            mine.iter()
                .filter(|(_, s)| !s.restored && !audited.contains_key(&s.meta.action_id)),
        );
        report.temp_files_removed += removed;
        if !report.unjudged.is_empty() {
            report.retry = true;
            return report;
        }
        for (i, s) in mine.into_iter().rev() {
            dirs.insert((i, s.meta.target().parent_components().to_vec()));
            let key = (i, s.meta.original_path.clone());
            if s.restored || settled.contains(&key) {
                continue;
            }
            let current = expected
                .entry(key.clone())
                .or_insert_with(|| self.target_checksum(i, &s.meta.target()))
                .clone();
            let outcome = audited.get(&s.meta.action_id);
            // Never audited, and another run changed the target since (the dead run's
            // locks went with it): the trail says so, or the target holds neither what it
            // held before nor what the action writes. That change is theirs to keep;
            // this action is recorded as what it was, done or not, and never redone or
            // restored over it.
            let first_change = outcome
                .is_none()
                .then(|| self.first_change_by_another(i, &s.meta))
                .flatten();
            if outcome.is_none()
                && ((current != s.meta.after_sha256
                    && !self.back_to_before(i, &s.meta, current.as_deref()))
                    || first_change.is_some())
            {
                let landed = self.settle_overwritten(
                    i,
                    &s.meta,
                    rec,
                    current.as_ref(),
                    &registered,
                    first_change.as_ref(),
                );
                match landed {
                    Some(record) => {
                        finish_audits.extend(record);
                        report.completed += 1;
                    }
                    None => report.superseded += 1,
                }
                settled.insert(key);
                continue;
            }
            if let (Some(c), None | Some(Some(_))) = (&s.meta.commit, outcome)
                && let Some(changed) =
                    self.finish_commit(i, &s.meta, c, outcome.is_some(), current.as_deref())
            {
                report.completed += usize::from(changed);
                settled.insert(key);
                continue;
            }
            // Written and registered, not yet audited (the run died between the two
            // appends): finished by auditing it, so the registry never lists an
            // artifact the trail does not.
            let made_by = format!("{}/{}", s.meta.execution_id, s.meta.action_id);
            if outcome.is_none()
                && current.is_some()
                && current == s.meta.after_sha256
                && registered.iter().any(|e| {
                    e.generated_by_action == made_by && Some(&e.checksum_sha256) == current.as_ref()
                })
            {
                finish_audits.push(self.done_record(i, &s.meta));
                report.completed += 1;
                settled.insert(key);
                continue;
            }
            let finished = match outcome {
                // Never audited: undone, unless the target holds neither what it held
                // before nor what the action wrote, which is someone else's later write
                // (the action's lock was released when its run died), theirs to keep.
                None => s.meta.after_sha256.as_ref().is_some_and(|after| {
                    current.as_ref() != Some(after)
                        && !self.back_to_before(i, &s.meta, current.as_deref())
                }),
                // Audited as done: undone only if the target is back to what it held
                // before (with batched syncs the audit line can reach the disk before the
                // target). Anything else is the result, or a later change by someone
                // else, which is theirs to keep.
                // A directory made has no checksum to compare: it is done while it
                // stands, and undone once gone again as the action found it (the dead run
                // was rolling back its failure; the restore finishes and records that).
                Some(Some(_)) if s.meta.is_directory_action() => {
                    !self.back_to_before(i, &s.meta, current.as_deref())
                }
                Some(Some(after)) => {
                    current == *after
                        || !self.back_to_before(i, &s.meta, current.as_deref())
                        || self.put_back_by_another(i, &s.meta, &current)
                }
                Some(None) => true,
            };
            if finished {
                settled.insert(key);
            } else {
                // Undone below: the target will hold what it held before this action.
                expected.insert(key, s.meta.sha256.clone());
                in_doubt.push((i, s));
            }
        }
        // Judged newest first; audited in the order they ran.
        finish_audits.reverse();
        if !finish_audits.is_empty()
            && let Err(e) = self.audit.append(finish_audits)
        {
            tracing::error!(error = %e, "recovery could not audit a dead run's registered writes");
            report.busy = busy_log(&e);
            report.retry = true;
        }
        // Temporary files first: a directory the run created is only empty, and so
        // removable by the restore, once they are gone.
        self.remove_dead_temp_files(&dead_makers(rec), dirs, &mut report);
        let n = in_doubt.len();
        let steps = self.restore_all(
            &crate::plan::new_execution_id(),
            &rec.workflow_id,
            in_doubt,
            "recovery",
            crate::sandbox::RestoreMode::Force,
        );
        report.rolled_back = steps.iter().filter(|s| s.restored).count();
        if report.rolled_back < n {
            tracing::error!(workflow = %rec.workflow_id, "recovery could not restore every in-doubt action; run rollback --force");
        }
        report.restores_recorded += self.record_marked_restores(&rec.workflow_id);
        report
    }

    /// Removes the temporary files dead processes (`makers`, see [`dead_makers`]) left
    /// in `dirs` (root index, components), counting them in `report`, and the folders
    /// where they could not be.
    fn remove_dead_temp_files(
        &self,
        makers: &[&str],
        dirs: HashSet<(usize, Vec<String>)>,
        report: &mut Recovered,
    ) {
        for (i, comps) in dirs {
            let rel = RelPath::from_components(comps.clone());
            let dir = if comps.is_empty() {
                self.roots[i].dir().try_clone().ok()
            } else {
                self.roots[i]
                    .open_parent(&child(&rel), false, false)
                    .ok()
                    .and_then(|(d, _)| d.into_owned().ok())
            };
            if let Some(d) = dir {
                for by in makers {
                    match remove_temp_files(&d, 0, Some(by)) {
                        Ok(n) => report.temp_files_removed += n,
                        // Say where (a folder another user took, say), not only log it.
                        Err(e) => report.temp_files_left.push(format!(
                            "{} ({})",
                            crate::confine::path::shown_path(&self.abs_path(i, &rel)),
                            crate::error::io_words(&e)
                        )),
                    }
                }
            }
        }
    }

    /// Removes the temporary files of run records whose writers died: a record is made
    /// under its workflow's lock, so one whose lock is free has no writer left.
    fn remove_dead_record_temp_files(&self) {
        let Ok(temps) = self.state.inflight_record_temp_files() else {
            return;
        };
        for (name, id) in temps {
            if !crate::plan::is_valid_id(&id) {
                continue;
            }
            if let Ok(Some(_lock)) = self.state.try_lock(&format!("wf-{id}")) {
                match self.state.inflight_remove_file(&name) {
                    Ok(()) => tracing::info!(file = %name, "removed a dead run's temporary record"),
                    Err(e) => {
                        tracing::warn!(file = %name, error = %e, "cannot remove a dead run's temporary record")
                    }
                }
            }
        }
    }

    /// The workflow's trusted snapshots, once the dead run's temporary files among them
    /// are gone; `None` (the recovery left for a later try) when they cannot be read.
    fn dead_run_snapshots(
        &self,
        rec: &InflightRecord,
        report: &mut Recovered,
    ) -> Option<crate::sandbox::RootedSnapshots> {
        report.temp_files_removed += self.remove_dead_snapshot_temp_files(rec);
        let (snaps, untrusted) = match self.trusted_workflow_snapshots(&rec.workflow_id) {
            Ok(s) => s,
            Err(r) => {
                report.why = Some(format!("its snapshots could not be read ({})", r.reason));
                report.why_code = Some(r.reason_code);
                report.retry = true;
                return None;
            }
        };
        report.untrusted += untrusted.len();
        Some(snaps)
    }

    /// Removes the temporary files the dead run's process left in the workflow's snapshot
    /// folders. Before the snapshots are read: one killed between linking its `meta.json`
    /// into place and unlinking the temporary name left the file with a second link, which
    /// would make the snapshot untrusted. Returns how many.
    fn remove_dead_snapshot_temp_files(&self, rec: &InflightRecord) -> usize {
        let makers = dead_makers(rec);
        let mut removed = 0;
        for root in &self.roots {
            if let Ok(rb) = root.dir().open_dir_nofollow(ROLLBACK_DIR)
                && let Ok(wf) = rb.open_dir_nofollow(&rec.workflow_id)
            {
                for by in &makers {
                    removed += remove_temp_files(&wf, 1, Some(by)).unwrap_or(0);
                }
            }
        }
        removed
    }

    /// A restore is marked in its snapshot folder, then audited; a process that died
    /// between the two left a marked snapshot the audit trail does not mention. Each is
    /// audited now, from its mark, so that the trail's newest record of a file says what
    /// it holds. Returns how many.
    fn record_marked_restores(&self, workflow_id: &str) -> usize {
        self.try_record_marked_restores(workflow_id)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "recovery could not audit marked restores");
                0
            })
    }

    /// [`Sandbox::record_marked_restores`], saying when the audit append failed.
    fn try_record_marked_restores(&self, workflow_id: &str) -> std::io::Result<usize> {
        let entries = self.audit.by_workflow(workflow_id)?;
        let recorded: HashSet<&str> = entries
            .iter()
            .filter(|e| e.status == AuditStatus::RolledBack)
            .map(|e| e.action_id.as_str())
            .collect();
        let mut records = Vec::new();
        let snaps = self
            .trusted_workflow_snapshots(workflow_id)
            .map(|(s, _)| s)
            .unwrap_or_default();
        // In the order the restores were made: rollbacks (and runs undoing themselves)
        // one after another, as their time-ordered ids say, each newest first. Read in
        // order, the trail then leaves each target as the restores did.
        for (i, s) in snaps.into_iter().rev() {
            if !s.restored || recorded.contains(s.meta.action_id.as_str()) {
                continue;
            }
            let Some(mark) =
                crate::snapshot::Snapshotter::restored_mark(&self.roots[i], &self.seal, &s.meta)
            else {
                tracing::warn!(action = %s.meta.action_id, "unreadable restored mark left unaudited");
                continue;
            };
            // What the target held before the restore: as its mark says, else (a mark
            // from before marks said it) the action's result, when it was audited as done.
            let before = mark.before_checksum.clone().unwrap_or_else(|| {
                entries
                    .iter()
                    .rev()
                    .find(|e| e.action_id == s.meta.action_id && e.status == AuditStatus::Success)
                    .and_then(|e| e.after_checksum.clone())
            });
            records.push(self.rollback_record(
                &mark.execution_id,
                workflow_id,
                i,
                &s.meta,
                before,
                mark.restored_checksum,
            ));
        }
        records.sort_by(|a, b| a.execution_id.cmp(&b.execution_id));
        let n = records.len();
        if n > 0 {
            self.audit.append(records)?;
        }
        Ok(n)
    }
}

impl Sandbox {
    /// The trail's last change to a target (a write or a restore, any workflow's);
    /// `None` when the trail records none or cannot be read. For a restore a dead
    /// process made and never recorded, its `after_checksum` is what it replaced.
    pub(crate) fn last_recorded(
        &self,
        root: usize,
        rel: &RelPath,
    ) -> Option<crate::audit::SandboxAuditEntry> {
        self.audit
            .changes_since(|t| self.names_target(t, root, rel), "", "")
            .ok()
            .and_then(|mut lines| lines.pop())
    }

    /// A dead run's unaudited action whose target another run has written since
    /// (`first_change`: the first such change the trail records). When its write had
    /// landed (its artifact is registered, or that first change found its result), it is
    /// finished without touching the target: `Some` with the audit record to append
    /// (`None` inside when the commit record's own were appended). Otherwise it never
    /// landed: its staged bytes are discarded and its snapshot marked restored, to be
    /// audited as rolled back; `None`.
    fn settle_overwritten(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        rec: &InflightRecord,
        current: Option<&String>,
        registered: &[crate::artifact::ArtifactEntry],
        first_change: Option<&crate::audit::SandboxAuditEntry>,
    ) -> Option<Option<AuditRecord>> {
        let made_by = format!("{}/{}", meta.execution_id, meta.action_id);
        let staged = meta.commit.as_ref().and_then(|c| {
            self.roots[root].find_staged(
                &meta.target(),
                &c.staged_name,
                crate::snapshot::MAX_SNAPSHOT_BYTES,
            )
        });
        // A commit record's staged file is made after the record: its absence proves
        // nothing, its presence that the rename never happened.
        let landed = staged.is_none()
            && (registered.iter().any(|e| e.generated_by_action == made_by)
                || first_change.is_some_and(|first| found_its_result(meta, first)));
        if landed {
            return Some(match &meta.commit {
                Some(c) => {
                    let _ = self.complete_logs(c, false);
                    None
                }
                None => Some(self.done_record(root, meta)),
            });
        }
        if let Some((staged, _)) = staged {
            staged.discard();
        }
        if let Err(r) = self.mark_restored(
            root,
            meta,
            &rec.execution_id,
            &current.cloned(),
            &[],
            Restorer::Recovery { found: None },
        ) {
            tracing::warn!(reason = %r, "could not mark a dead run's overwritten action undone");
        }
        None
    }

    /// The changes other runs made to an action's target after its snapshot, earliest
    /// first, as the trail records them.
    fn changes_by_others(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
    ) -> Vec<crate::audit::SandboxAuditEntry> {
        let rel = meta.target();
        self.audit
            .changes_since(
                |recorded| self.names_target(recorded, root, &rel),
                &meta.taken_at,
                &meta.execution_id,
            )
            .unwrap_or_default()
    }

    /// Whether another run, after this action's snapshot, changed its target to what it
    /// holds now (`current`): old bytes found there were written back, not left by an
    /// undo of this action. Lines that changed nothing (a recovery recording an action
    /// undone) show no such thing.
    fn put_back_by_another(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: &Option<String>,
    ) -> bool {
        self.changes_by_others(root, meta)
            .iter()
            .any(|c| c.after_checksum == *current && c.before_checksum != c.after_checksum)
    }

    /// The first change another run made to an action's target after its snapshot.
    fn first_change_by_another(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
    ) -> Option<crate::audit::SandboxAuditEntry> {
        self.changes_by_others(root, meta).into_iter().next()
    }

    /// Finishes an action from its commit record: puts the staged bytes in place unless
    /// the target already holds them (`current`: its checksum once newer in-doubt actions
    /// on it are undone), then appends what the registry and the audit log
    /// lack; `Some(true)` when that changed anything. `None` when the new bytes are
    /// neither in place nor staged intact: the action is then rolled back like any
    /// unfinished one.
    fn finish_commit(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        c: &crate::snapshot::SnapshotCommit,
        audited: bool,
        current: Option<&str>,
    ) -> Option<bool> {
        let rel = meta.target();
        let mut changed = false;
        if current != Some(c.after_sha256.as_str()) {
            let (staged, bytes) = self.roots[root].find_staged(
                &rel,
                &c.staged_name,
                crate::snapshot::MAX_SNAPSHOT_BYTES,
            )?;
            if crate::hash::sha256_hex(&bytes) != c.after_sha256
                || staged
                    .commit(
                        crate::confine::root::Put::new_or_any(c.no_replace),
                        self.durable(),
                    )
                    .is_err()
            {
                return None;
            }
            changed = true;
        }
        changed |= self.complete_logs(c, audited).unwrap_or(true);
        Some(changed)
    }

    /// Appends a committed action's registry entry unless the registry has it, and its
    /// audit record unless `audited`; whether anything was appended (`Err` when an append
    /// failed, which is logged).
    fn complete_logs(
        &self,
        c: &crate::snapshot::SnapshotCommit,
        audited: bool,
    ) -> Result<bool, ()> {
        let mut changed = false;
        let mut failed = false;
        if let Some(entry) = &c.artifact
            && self
                .registry
                .get(&entry.artifact_id)
                .ok()
                .flatten()
                .is_none()
        {
            changed = true;
            if let Err(e) = self.registry.register(entry) {
                tracing::error!(error = %e, artifact = %entry.artifact_id, "recovery could not register an artifact");
                failed = true;
            }
        }
        if !audited {
            changed = true;
            if let Err(e) = self.audit.append(vec![c.audit.clone()]) {
                tracing::error!(error = %e, "recovery could not audit a finished action");
                failed = true;
            }
        }
        if failed { Err(()) } else { Ok(changed) }
    }

    /// Why some of these snapshots' targets cannot be judged now, one sentence each (see
    /// [`Recovered::unjudged`]). A missing target, a file where a folder was, a file too
    /// large for a snapshot is judged (someone else's change); only what the runtime
    /// refuses to look at is not. A second link that is the dead run's own temporary file
    /// (see [`crate::confine::root::SandboxRoot::remove_temp_links_of`]) is removed first.
    /// Also returns how many temporary names it removed.
    fn unjudged<'a>(
        &self,
        rec: &InflightRecord,
        snaps: impl Iterator<Item = &'a (usize, crate::snapshot::StoredSnapshot)>,
    ) -> (Vec<String>, usize) {
        let refusal = |i: usize, rel: &RelPath| {
            self.roots[i].inspect(rel).err().filter(|r| {
                matches!(
                    r.reason_code,
                    ReasonCode::SymlinkEscape
                        | ReasonCode::SymlinkRefused
                        | ReasonCode::HardlinkRefused
                        | ReasonCode::NotRegularFile
                )
            })
        };
        let makers = dead_makers(rec);
        let mut seen = HashSet::new();
        let mut removed = 0;
        let reasons = snaps
            .filter(|(i, s)| seen.insert((*i, s.meta.original_path.clone())))
            .filter_map(|(i, s)| {
                let rel = s.meta.target();
                let r = refusal(*i, &rel)?;
                if r.reason_code == ReasonCode::HardlinkRefused {
                    let gone = self.roots[*i].remove_temp_links_of(&rel, &makers);
                    if gone > 0 {
                        removed += gone;
                        return refusal(*i, &rel);
                    }
                }
                Some(r)
            })
            .map(|r| r.reason)
            .collect();
        (reasons, removed)
    }

    /// Whether a target (`current`: its checksum, `None` when it is no file) holds what
    /// it held before the snapshot's action: the same bytes, or still nothing, or still a
    /// directory.
    fn back_to_before(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: Option<&str>,
    ) -> bool {
        match meta.kind {
            crate::snapshot::SnapshotKind::File => {
                current.is_some() && current == meta.sha256.as_deref()
            }
            _ => {
                current.is_none()
                    && self.target_state(root, &meta.target()) == TargetState::found_by(meta)
            }
        }
    }

    /// SHA-256 of a regular file's bytes; `None` for anything else.
    pub(crate) fn target_checksum(&self, root: usize, rel: &RelPath) -> Option<String> {
        match self.target_state(root, rel) {
            TargetState::File(sum) => Some(sum),
            _ => None,
        }
    }
}

/// The sentence for a log another process held past `limits.lock_wait_seconds`, if that
/// is why it could not be read or written.
fn busy_log(e: &std::io::Error) -> Option<String> {
    (e.kind() == std::io::ErrorKind::TimedOut).then(|| {
        format!("another process held the audit trail or the registry ({e}: a stopped or hung process, or one far behind)")
    })
}

/// The ids of the processes whose temporary files a dead run left: its own, and those of
/// earlier recoveries of it that died; never this process's, whose other writes may be
/// under way in the same folders.
fn dead_makers(rec: &InflightRecord) -> Vec<&str> {
    std::iter::once(rec.execution_id.as_str())
        .chain(
            rec.recovered_by
                .iter()
                .map(String::as_str)
                .filter(|id| !crate::ids::made_here(id)),
        )
        .collect()
}

/// A path one level below `dir`, so that `open_parent` opens `dir` itself.
fn child(dir: &RelPath) -> RelPath {
    let mut c = dir.components().to_vec();
    c.push("x".to_owned());
    RelPath::from_components(c)
}

/// Whether `first`, the first change another run made to an action's target after its
/// snapshot, found the action's result there: proof that the action's write landed.
fn found_its_result(
    meta: &crate::snapshot::SnapshotMeta,
    first: &crate::audit::SandboxAuditEntry,
) -> bool {
    meta.after_sha256.as_deref().is_some_and(|after| {
        meta.sha256.as_deref() != Some(after) && first.before_checksum.as_deref() == Some(after)
    })
}
