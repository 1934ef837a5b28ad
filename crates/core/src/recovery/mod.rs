//! Start-up recovery. A run marks its workflow's record in the state directory's
//! `inflight/` active before it touches a file and idle when it ends. An active record
//! whose workflow lock is free at start-up belongs to a run that died (crash, `kill -9`, power cut): its actions
//! that were snapshotted but never audited as done are rolled back from their snapshots,
//! except those whose snapshot is also a commit record (batched durability) and whose new
//! bytes are durable, and those whose result is in place and registered (the run died
//! before its audit line): those are finished. The temporary files the run left are
//! removed.
//!
//! This file keeps the run records, says which runs are dead and claims one; `commit_logs`
//! replays the commit logs first (`batched`), `run` settles a dead run, `rollback` a dead
//! rollback, `held` the restores the trail would not take, `judge` says what the trail and
//! the disk hold for a target, `notices` words it all for the start.
//!
//! A recovery the disk stops (an undo refused `io_error`, restore lines the trail will not
//! take) keeps the run record for the next start or the workflow's next run; one stopped
//! for good (a damaged backup) closes it and says so.
//!
//! A recovery names its process in the run record before it starts (`recovered_by`, the
//! last four), so that the temporary files of one that died are removed by the next; one
//! that ends unfinished, or cannot sync what it did, takes its name back. A run record
//! names the boot it began in and the roots its run writes into. A start configured without
//! one of those roots leaves the run unjudged (saying so), and refuses a new run of the
//! workflow, until a start that has them recovers it; a root missing at start that a run
//! awaiting recovery wrote into is not made (made empty, it would be taken for what the run
//! left there). A start removes an unreadable run record only under the workflow's lock,
//! after reading it again there; records are created whole (written aside, then linked), so
//! a start racing a run never mistakes the run's record for a damaged one.
//!
//! A `batched` run that ended is `finished` until its process's next sync point marks it
//! idle. A start (any process) leaves such a run alone when the boot is this one: the
//! process may live on, and a kill loses nothing from the page cache, so judging its
//! audited writes against the disk could only take another workflow's later write-back of
//! the old bytes for an undo. It makes the writes of such runs (left so by a killed
//! process) durable and marks their records idle, so no later boot has to judge them,
//! except for a run whose commit log holds entries for a root the process lacks: that one
//! it leaves `finished`, so no process drops an acknowledged write. After a crash of the
//! machine the boot differs, and the run is recovered and its log replayed (`commit_logs`).
//!
//! The next run or rollback of a workflow settles a dead run of it the same way (it finds
//! the record under way and the workflow's lock free) before it takes the record over, so a
//! run that dies while others live on needs no restart. Recovery holds the locks of all of
//! a dead run's targets from judging them to finishing or restoring them. It runs at every
//! start whatever the write flags, since it only finishes or undoes what a dead run left
//! half done. An action whose result is in place and registered is audited, so the registry
//! never lists an artifact the trail does not. An action a dead run audited stays:
//! `rollback --force` restores the original tree.

use crate::confine::RelPath;
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::Sandbox;
use serde::{Deserialize, Serialize};

/// The record state of a workflow whose rollback is under way.
pub const ROLLING_BACK: &str = "rolling_back";

/// The record state of a run that ended, in a process that may live on, with a restore
/// whose audit line could not be appended (its mark is on disk): recovery only audits
/// the restores its marks record, touching no file of the run.
pub const RESTORES_UNAUDITED: &str = "restores_unaudited";

pub(crate) use held::HeldRestores;

/// At most this many recovering processes are named in a run record.
const MAX_RECOVERED_BY: usize = 4;

mod commit_logs;
mod held;
mod judge;
mod notices;
mod rollback;
mod run;

/// The roots the runs awaiting recovery in `state` wrote into (as they named them).
pub(crate) fn roots_awaiting_recovery(state: &crate::confine::state::StateDir) -> Vec<String> {
    state
        .inflight_list()
        .unwrap_or_default()
        .into_iter()
        // A record whose workflow's lock is held is a run under way in another process
        // (started at the same moment, making its roots), not one that died. One whose
        // lock cannot be looked at is taken for dead: its roots are not made.
        .filter(|(id, _)| !matches!(state.try_lock_workflow(id), Ok(None)))
        .filter_map(|(_, b)| serde_json::from_slice::<InflightRecord>(&b).ok())
        .filter(needs_recovery)
        .flat_map(|r| r.roots)
        .collect()
}

/// Whether a record's run needs recovery. One that finished in this boot does not: its
/// process may live on until its next sync point, and if it died, nothing it wrote was
/// lost (a kill leaves the page cache whole). Judging its actions against the disk
/// would take another run's later write-back of old bytes for an undo.
fn needs_recovery(rec: &InflightRecord) -> bool {
    (rec.state == "active" || rec.state == ROLLING_BACK || rec.state == RESTORES_UNAUDITED)
        && !rec.finished_this_boot()
}

impl Sandbox {
    /// `workflow_id`'s run record, when there is one that can be read.
    pub(crate) fn run_record(&self, workflow_id: &str) -> Option<InflightRecord> {
        self.state
            .inflight_read(workflow_id)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<InflightRecord>(&b).ok())
    }

    /// Whether `workflow_id`'s run record still awaits recovery (a run or rollback that
    /// died, or one that could not write its last lines): what it did is not all on the
    /// trail yet.
    pub(crate) fn awaits_recovery(&self, workflow_id: &str) -> bool {
        self.state
            .inflight_read(workflow_id)
            .ok()
            .flatten()
            .is_some_and(|b| record_awaits_recovery(&b))
    }
}

/// Whether the run record `bytes` (a workflow's `inflight/ID.json`) awaits recovery.
pub(crate) fn record_awaits_recovery(bytes: &[u8]) -> bool {
    serde_json::from_slice::<InflightRecord>(bytes).is_ok_and(|r| needs_recovery(&r))
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
    /// When recovery settled the interrupted rollback this record was kept for. The
    /// rollback is left half done for the operator to run again, so prune counts this
    /// as activity on the workflow: the snapshots that run needs stay for at least the
    /// prune's age from the moment the operator was told (a prune that recovers it
    /// itself, right after the kill, would otherwise remove them as old).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_recovered_at: Option<String>,
    /// For a rollback, whether it was forced over later changes: a forced one passes
    /// over a step whose backup is damaged or gone and restores the older ones on its
    /// file, which recovery then looks for beneath such a step. `None` for a run, and in
    /// a record an older version wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<bool>,
    /// The action whose restore a rollback, or a run undoing its own writes, began last
    /// (empty before the first), written on the record before it touches that action's
    /// target, not synced: a start in the same boot credits no other step without its
    /// restore's mark with a restore, whatever its file holds (someone may have changed
    /// it while the process was down). `None` in a record an older version wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoring: Option<String>,
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

    /// How many bytes the roots `names` (as a record names them) take in the longest
    /// record a run writing into all of them can have, and how many that record has
    /// room for: every optional field set, each id of the most characters allowed, its
    /// longest state. A configuration whose roots do not fit is refused at start, not
    /// at every run.
    pub fn room_for_roots(names: &[String]) -> (usize, usize) {
        // The same for every record of this process: ids and times are of fixed width.
        static ROOM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let room = *ROOM.get_or_init(|| {
            let id = crate::ids::unique();
            let stamp = crate::clock::timestamp(chrono::Utc::now());
            let longest = Self {
                state: RESTORES_UNAUDITED.to_owned(),
                execution_id: crate::plan::new_execution_id(),
                workflow_id: "w".repeat(crate::plan::MAX_ID_LEN),
                started_at: stamp.clone(),
                finished: true,
                boot: Some(
                    crate::confine::state::boot_id()
                        .map_or_else(|| "0".repeat(36), |b| format!("{b:0<36}")),
                ),
                recovered_by: vec![id; MAX_RECOVERED_BY],
                roots: vec![String::new()],
                rollback_recovered_at: Some(stamp),
                forced: Some(false),
                restoring: Some("a".repeat(crate::plan::MAX_ID_LEN)),
            };
            let without = serde_json::to_vec(&longest).map_or(usize::MAX, |v| v.len());
            // `[""]` stands in the record for the names' own JSON array.
            (crate::confine::state::BLOCK - 1).saturating_sub(without - "[\"\"]".len())
        });
        let taken = serde_json::to_vec(names).map_or(usize::MAX, |v| v.len());
        (taken, room)
    }

    /// The record once recovery has settled its run at `now`: idle, and for a rollback,
    /// when it was settled.
    fn recovered(&self, now: String) -> Self {
        Self {
            rollback_recovered_at: (self.state == ROLLING_BACK).then_some(now),
            ..self.idle()
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

    /// Whether the record, written in this boot, names a step under way other than
    /// `action_id`'s (see [`InflightRecord::restoring`]): that action's target was not
    /// being restored when the process died, whatever it holds now.
    fn names_another_step(&self, action_id: &str) -> bool {
        self.this_boot()
            && self
                .restoring
                .as_ref()
                .is_some_and(|step| step != action_id)
    }

    /// Whether the record was written in this boot of the machine.
    fn this_boot(&self) -> bool {
        self.boot.is_some() && self.boot.as_deref() == crate::confine::state::boot_id()
    }
}

/// What recovery did for one dead run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Unfinished actions recovery could not undo for a cause that does not pass by
    /// itself (a damaged backup), each with why: the run is recorded as recovered all
    /// the same (trying again could not do better), and the start says so.
    pub not_undone: Vec<String>,
    /// Temporary files removed.
    pub temp_files_removed: usize,
    /// Snapshot folders the dead process began and never finished, removed: their
    /// actions never touched their targets.
    pub unfinished_snapshots_removed: usize,
    /// Such folders (absolute, quoted) that could not be removed, each with why: left
    /// whole, their action ids still used, for the operator, who is told.
    pub unfinished_snapshots_left: Vec<String>,
    /// Folders (absolute, quoted) where the dead process's temporary files could not be
    /// removed, each with why: left for the operator, who is told.
    pub temp_files_left: Vec<String>,
    /// Folders (absolute, quoted) this process may write in but not list: the dead
    /// process's temporary files whose names recovery knew are dealt with, others could
    /// not be looked for there; the operator is told.
    pub temp_folders_unlisted: Vec<String>,
    /// The folder (absolute, quoted, with why) where the disk first refused a removal of
    /// temporary files (the record then kept for a retry).
    pub refused_in: Option<String>,
    /// Restores the dead process made without auditing them, now audited: for a dead
    /// rollback, files found restored but unmarked; for either, marked snapshots the
    /// audit trail does not mention.
    pub restores_recorded: usize,
    /// For a dead rollback: the restores its own lines (or an earlier start's) already
    /// record on the audit trail.
    pub restores_on_trail: usize,
    /// For a dead rollback: the empty folders the actions of the restores it left
    /// unrecorded had made, which it had not yet removed and recovery did, as the restore
    /// would have.
    pub folders_removed: usize,
    /// Targets of writes a commit log held, found changed since by a write the trail does
    /// not record and left as they are (as shown to people): the trail still names the
    /// logged bytes.
    pub logged_left_changed: Vec<String>,
    /// Whether the dead process was rolling the workflow back (not running a plan).
    pub rollback: bool,
    /// Whether that rollback was a failed run's own (`on_failure: rollback`), under
    /// that run's id, which then undid that run's actions alone.
    pub failed_run_rollback: bool,
    /// For a dead rollback: the workflow's actions audited as done that are still not
    /// restored (the rollback had not reached them, or it was of another action).
    pub not_rolled_back: usize,
    /// Restores made (and marked) whose lines the trail would not take: the record is
    /// kept, and this process records them before its first change.
    pub restores_held: bool,
    /// Snapshot folders of the workflow left alone because they could not be read or
    /// trusted. The run is recorded as recovered all the same: judging it again at every
    /// start would undo later changes to its targets.
    pub untrusted: usize,
    /// The recovery is not done: nothing of the workflow's snapshots could be read, some
    /// lie in roots this start is not configured with ([`Self::missing_roots`]), an undo
    /// the disk refused, lines the trail would not take ([`Self::why`] says which). The
    /// run stays recorded as unfinished and the next start (or the workflow's next run)
    /// tries again.
    pub retry: bool,
    /// Roots the run writes into that this start is not configured with.
    pub missing_roots: Vec<String>,
    /// The workflow's run record could not be read (torn by a crash, or changed by hand)
    /// and was removed ([`Self::record_left`] says why not, when it could not be):
    /// nothing of its run was judged.
    pub unreadable_record: bool,
    /// Why an unreadable run record could not be removed (it is tried again at the next
    /// start): words for the operator.
    pub record_left: Option<String>,
    /// Why nothing was judged when the cause was another process holding a log or a
    /// target past `limits.lock_wait_seconds` ([`Self::retry`] is set): a sentence.
    pub busy: Option<String>,
    /// Earlier starts that began recovering the run and did not finish (stopped, or
    /// leaving it for a start with every root): what they finished, undid or recorded,
    /// if anything, is on the audit trail, not counted here.
    pub earlier_tries: usize,
    /// Why the recovery is not done for any other cause ([`Self::retry`] is set): a log
    /// or the snapshots that could not be read (a full or failing disk), an undo the
    /// disk refused, restores the trail would not take; in a few words.
    pub why: Option<String>,
    /// The code of the refusal behind [`Self::why`] when it is not the disk's failure: a
    /// link, a file or a FIFO in the place of a snapshot folder (`reserved_path`), a
    /// record that is not the runtime's (`checksum_mismatch`), the trail held by another
    /// process (`conflict`).
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

    /// Restores made (and marked) whose audit lines could not be written: left for a
    /// later try, which writes them from the marks.
    fn restores_unaudited(&mut self, e: &std::io::Error) {
        tracing::error!(error = %e, "could not audit restores; the next start tries again");
        self.restores_held = true;
        self.unrecorded(
            e,
            "its files were restored, but their restores could not be recorded on the audit trail",
        );
    }

    /// Writes of the dead run judged done whose entries the registry or the trail would
    /// not take (`e`): left for a later try.
    pub(super) fn writes_unaudited(&mut self, e: &std::io::Error) {
        self.unrecorded(
            e,
            "its writes were judged done, but the artifact registry or the audit trail could not record them",
        );
    }

    /// What was done (`said`) that a log would not record (`e`): left for a later try.
    fn unrecorded(&mut self, e: &std::io::Error, said: &str) {
        // Not `busy`, which says nothing was done.
        let busy = busy_log(e);
        let code = busy.is_some().then_some(ReasonCode::Conflict);
        let why = format!(
            "{said} ({})",
            busy.unwrap_or_else(|| crate::error::state_io_words(e))
        );
        if self.retry_for(why) {
            self.why_code = code;
        }
    }

    /// Says `folder` (with why) among those where temporary files were left, once:
    /// several passes of one recovery may look in the same folder.
    pub(super) fn left_in(&mut self, said: String) {
        if !self.temp_files_left.contains(&said) {
            self.temp_files_left.push(said);
        }
    }

    /// Says `folder` among those that could not be listed, once.
    pub(super) fn unlisted(&mut self, folder: String) {
        if !self.temp_folders_unlisted.contains(&folder) {
            self.temp_folders_unlisted.push(folder);
        }
    }

    /// Takes in what a pass of its own (`other`, which nothing repeats) found of
    /// temporary files: removed, left, unlisted; a folder where the disk refused a
    /// removal is named for the operator, as nothing would try it again.
    pub(super) fn take_temp_files_of(&mut self, other: Recovered) {
        self.temp_files_removed += other.temp_files_removed;
        other
            .temp_files_left
            .into_iter()
            .chain(other.refused_in)
            .for_each(|l| self.left_in(l));
        other
            .temp_folders_unlisted
            .into_iter()
            .for_each(|f| self.unlisted(f));
    }

    /// Left for a later try, for `why` unless a cause was said first, which stands (an
    /// undo the disk refused: then not every file is back); whether `why` is said.
    pub(super) fn retry_for(&mut self, why: String) -> bool {
        self.retry = true;
        if self.why.is_some() {
            return false;
        }
        self.why = Some(why);
        true
    }

    /// What died: `rollback` or `run`.
    pub fn what(&self) -> &'static str {
        match (self.rollback, self.failed_run_rollback) {
            (true, true) => "on_failure rollback of run",
            (true, false) => "rollback",
            (false, _) => "run",
        }
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
                + self.unfinished_snapshots_removed
                + self.restores_recorded
                + self.untrusted
                + self.temp_files_left.len()
                + self.temp_folders_unlisted.len()
                + self.unfinished_snapshots_left.len()
                + self.not_undone.len()
                > 0
    }
}

impl Sandbox {
    /// Recovers every run that died while changing files. Runs still alive in another
    /// process (their workflow lock is held) are left alone.
    pub fn recover(&self) -> Vec<Recovered> {
        self.remove_dead_record_temp_files();
        let mut out = self.recover_commit_logs();
        let Some(records) = self.inflight_oldest_first() else {
            return Vec::new();
        };
        // Runs that finished in this boot, whose processes left no sync point behind
        // them: made durable and marked idle, so that a later boot, which cannot tell
        // what a crash lost, never judges them.
        let mut finished = Vec::new();
        for (id, bytes) in records {
            if !self.screen_listed(&id, &bytes, &out) {
                continue;
            }
            let Some((lock, rec)) = self.locked_record(&id, &mut out) else {
                continue;
            };
            self.settle_locked(&id, lock, rec, &mut out, &mut finished);
        }
        self.make_finished_idle(&finished);
        out
    }

    /// The run records of the state directory, in the order recovery takes them; `None`
    /// when they cannot be listed.
    fn inflight_oldest_first(&self) -> Option<Vec<(String, Vec<u8>)>> {
        let mut records = match self.state.inflight_list() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list in-flight runs");
                return None;
            }
        };
        // Oldest first: restores two dead runs or rollbacks left unrecorded on one file
        // are then recorded in the order made.
        records.sort_by_cached_key(|(id, b)| self.recovery_order(id, b));
        Some(records)
    }

    /// Screens the listed record `bytes` of workflow `id` before its workflow's lock is
    /// taken (`out`: what recovery said so far): whether it may need recovery. A record
    /// of no workflow is removed here.
    fn screen_listed(&self, id: &str, bytes: &[u8], out: &[Recovered]) -> bool {
        let parsed = serde_json::from_slice::<InflightRecord>(bytes).ok();
        if parsed
            .as_ref()
            .is_some_and(|r| !needs_recovery(r) && !r.finished_this_boot())
        {
            return false;
        }
        // Already left for another start by the replay of its commit log.
        if out.iter().any(|r| r.retry && r.workflow_id == id) {
            return false;
        }
        if !crate::plan::is_valid_id(id) {
            // No run can hold a workflow of that name.
            tracing::warn!(record = %id, "in-flight record of no workflow removed");
            let _ = self.state.inflight_remove(id);
            return false;
        }
        true
    }

    /// Workflow `id`'s lock and its record, read under it; `None` when the lock is held
    /// (a run alive in another process) or cannot be taken, or there is no record to
    /// read. A record that cannot be read as `id`'s is removed, and said in `out`.
    fn locked_record(
        &self,
        id: &str,
        out: &mut Vec<Recovered>,
    ) -> Option<(crate::confine::state::WorkflowLock, InflightRecord)> {
        let lock = match self.state.try_lock_workflow(id) {
            Ok(Some(l)) => l,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot lock a workflow for recovery");
                return None;
            }
        };
        // Read again under the lock: what was listed may have been a record its run
        // was writing, or one a run has taken over since.
        let rec = match self.state.inflight_read(id) {
            Ok(Some(b)) => serde_json::from_slice::<InflightRecord>(&b).ok(),
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, record = %id, "cannot read an in-flight record");
                return None;
            }
        };
        let Some(rec) = rec.filter(|r| r.workflow_id == id) else {
            let removed = self.state.inflight_remove(id);
            tracing::warn!(record = %id, removed = removed.is_ok(), "unreadable in-flight record");
            let mut report = Recovered {
                workflow_id: id.to_owned(),
                unreadable_record: true,
                record_left: removed.err().map(|e| crate::error::io_words(&e)),
                ..Recovered::default()
            };
            // Its run's snapshots that never got their metadata (a record torn by a
            // power cut before the run's first sync point, with them) are of actions
            // the trail never recorded: they would refuse the workflow's rollbacks. A
            // record removed brings no second try: what the disk refused is the
            // operator's then.
            let retried = report.record_left.is_some();
            self.remove_unfinished_snapshots(id, &mut report, retried);
            out.push(report);
            return None;
        };
        Some((lock, rec))
    }

    /// Settles workflow `id`'s record `rec`, read under its lock (`lock`): a run finished
    /// in this boot goes to `finished`, its lock with it; a dead one is recovered, what
    /// recovery did added to `out` when worth telling, and its record marked recovered
    /// once that is durable. The lock is released on return unless kept in `finished`.
    fn settle_locked(
        &self,
        id: &str,
        lock: crate::confine::state::WorkflowLock,
        rec: InflightRecord,
        out: &mut Vec<Recovered>,
        finished: &mut Vec<(crate::confine::state::WorkflowLock, InflightRecord)>,
    ) {
        if rec.finished_this_boot() {
            // A log that could not be emptied (it holds entries for a root this start
            // lacks) keeps the run finished, for a start that can empty it.
            if self.commit_log_holds_entries(id).is_ok_and(|held| !held) {
                finished.push((lock, rec));
            }
            return;
        }
        if !needs_recovery(&rec) {
            return;
        }
        let mut report = self.recover_record(&rec);
        let retry = report.retry;
        // What recovery appended must be durable before the record says the run
        // needs no more recovery; a record left as it was is said so, not "recovered".
        match self.conclude_sync() {
            Err(r) => {
                tracing::warn!(reason = %r.reason, "cannot sync after recovery");
                if !retry {
                    self.unclaim(&rec);
                    report.retry_for(format!(
                        "what its recovery did could not be made durable: {}",
                        r.reason
                    ));
                }
            }
            Ok(()) if !retry => self.settle_record(&rec, &mut report),
            Ok(()) => {}
        }
        if report.worth_telling(&rec) {
            out.push(report);
        }
        drop(lock);
    }

    /// Makes the writes of the runs in `finished` (finished in this boot, each with its
    /// workflow's lock held) durable, then marks their records idle.
    fn make_finished_idle(
        &self,
        finished: &[(crate::confine::state::WorkflowLock, InflightRecord)],
    ) {
        if !finished.is_empty() {
            match self.sync_logged_writes() {
                Ok(()) => {
                    for (_lock, rec) in finished {
                        self.write_idle_record(rec, self.durable());
                    }
                }
                Err(r) => {
                    tracing::warn!(reason = %r.reason, "cannot sync the writes of finished runs")
                }
            }
        }
    }

    /// When the run or rollback of the record `bytes` of workflow `id` first changed what
    /// recovery is to record: the time on the earliest mark of its unrecorded restores,
    /// else its execution id's. Not the id alone: a run's undo carries the id of the
    /// run's start, which another workflow's restore of the same file may follow.
    fn recovery_order(&self, id: &str, bytes: &[u8]) -> (Option<i64>, String) {
        let rec = serde_json::from_slice::<InflightRecord>(bytes).ok();
        let marked = rec
            .as_ref()
            .filter(|r| needs_recovery(r) && r.workflow_id == id && crate::plan::is_valid_id(id))
            // A run alive in another process (it holds its workflow's lock) is left
            // alone, its snapshots too: they may be half made.
            .filter(|_| !matches!(self.state.try_lock_workflow(id), Ok(None)))
            .and_then(|_| self.marked_unrecorded(id).ok())
            .and_then(|marks| {
                marks
                    .iter()
                    .filter_map(|(at, _)| crate::clock::parse_timestamp(at))
                    .filter_map(|t| t.timestamp_nanos_opt())
                    .min()
            });
        let execution = rec.map(|r| r.execution_id).unwrap_or_default();
        let at = marked.or_else(|| crate::ids::nanos(&execution));
        (at, execution + id)
    }

    /// What comes before a change by `workflow_id` (whose lock the caller holds): the
    /// restores held back before it recorded ([`Sandbox::record_held_restores`]), then
    /// its dead run, if any, recovered ([`Sandbox::recover_dead_run`]).
    pub(crate) fn settle_before_change(
        &self,
        workflow_id: &str,
    ) -> Verdict<Option<crate::confine::state::BlockFile>> {
        self.record_held_restores(workflow_id)?;
        self.recover_dead_run(workflow_id)
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
        let recovered = self.recover_record_of(workflow_id);
        // Whatever restores of it the trail refused are on it now.
        if recovered.is_ok() {
            self.held_restores().forget(workflow_id);
        }
        recovered
    }

    /// What [`Sandbox::recover_dead_run`] does, but for forgetting the workflow's held
    /// restores.
    fn recover_record_of(
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
            // that wrote into another root is refused. The roots are named in the log
            // only: a refusal reaches clients, who learn no path outside the roots from it.
            tracing::warn!(workflow = workflow_id, roots = %missing.join(", "), "an interrupted {what} wrote into roots this process lacks");
            let (roots, them, those) = if missing.len() == 1 {
                ("a root", "it", "that root")
            } else {
                ("roots", "them", "those roots")
            };
            return Err(Refusal::new(
                ReasonCode::OutsideSandbox,
                format!(
                    "workflow {workflow_id} has an interrupted {what} ({}) that wrote into {roots} this process is not configured with or skipped at start (missing, say; the run record and the log name {them}); run any command with {those} configured and in place as the run left {them}, to recover it, then retry",
                    rec.execution_id,
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
        if let Some(refused) = unfinished_recovery(&report, workflow_id, what, &rec.execution_id) {
            return Err(refused);
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
        if !report.not_undone.is_empty() {
            tracing::error!(
                workflow = %workflow_id,
                not_undone = %report.not_undone.join("; "),
                "recovery could not undo some unfinished actions; they stay as the dead run left them"
            );
        }
        self.write_recovered_record(&rec);
        Ok(Some(file))
    }

    /// [`Sandbox::write_recovered_record`], the recovery left for a later try in
    /// `report` when the record could not be written.
    pub(super) fn settle_record(&self, rec: &InflightRecord, report: &mut Recovered) {
        if !self.write_recovered_record(rec) {
            report
                .retry_for("its record could not be marked settled (the log says why)".to_owned());
        }
    }

    /// Marks `rec`'s run settled by recovery (see [`InflightRecord::recovered`]); says
    /// whether it could.
    pub(super) fn write_recovered_record(&self, rec: &InflightRecord) -> bool {
        match self.write_record(&rec.recovered(self.now()), self.durable()) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "could not mark a recovered workflow's record idle");
                false
            }
        }
    }

    /// The roots a run record names that this sandbox is not configured with.
    /// The roots `rec`'s run wrote into that this sandbox lacks (not configured, or
    /// skipped at start, missing among them).
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
            let mut report = Recovered {
                execution_id: rec.execution_id.clone(),
                workflow_id: rec.workflow_id.clone(),
                ..Recovered::default()
            };
            match self.try_record_marked_restores(&rec.workflow_id) {
                Ok(n) => report.restores_recorded = n,
                Err(e) => report.restores_unaudited(&e),
            }
            return report;
        }
        let claimed = self.claim(rec);
        let mut report = if rec.state == ROLLING_BACK {
            self.recover_rollback(&claimed)
        } else {
            self.recover_run(&claimed)
        };
        report.earlier_tries = rec
            .recovered_by
            .iter()
            .filter(|id| !crate::ids::made_here(id))
            .count();
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
}

/// The sentence for a log another process held past `limits.lock_wait_seconds`, if that
/// is why it could not be read or written.
fn busy_log(e: &std::io::Error) -> Option<String> {
    (crate::confine::state::LockBusy::is_cause_of(e)).then(|| {
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

/// Temporary files by folder (root index, components): their names.
type TempNames = std::collections::HashMap<(usize, Vec<String>), Vec<String>>;

/// The temporary files a dead process may have left beside the targets of `snaps` (root
/// index, snapshot record) under names recovery knows without listing their folders,
/// which a folder the runtime may write in but not read refuses: each write's staged
/// bytes (its commit record names them), and the temporary file of a write in no commit
/// log or of a restore by each of `makers` (see
/// [`crate::confine::root::action_temp_name`]).
fn named_temp_files<'a>(
    snaps: impl Iterator<Item = (usize, &'a crate::snapshot::SnapshotMeta)>,
    makers: &[&str],
) -> TempNames {
    let mut named = TempNames::new();
    for (i, meta) in snaps {
        let names = named
            .entry((i, meta.target().parent_components().to_vec()))
            .or_default();
        if let Some(c) = &meta.commit {
            names.push(c.staged_name.clone());
        }
        for by in makers {
            let seed = crate::ids::process_seed(by);
            names.push(crate::confine::root::action_temp_name(
                &meta.workflow_id,
                &meta.action_id,
                seed,
            ));
        }
    }
    named
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

/// Why a recovery that `report` tells of did not finish, for a client: what someone put
/// in the way, a log held past the wait, or what could not be read; `None` when it did.
/// `what` names the dead process's work (`run` or `rollback`), `execution_id` its run.
fn unfinished_recovery(
    report: &Recovered,
    workflow_id: &str,
    what: &str,
    execution_id: &str,
) -> Option<Refusal> {
    if !report.unjudged.is_empty() {
        // Something someone put in the way, not a failure of the disk (HTTP 500).
        return Some(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "workflow {workflow_id} has an interrupted {what} ({execution_id}) that cannot be judged yet: {}; remove that second hard link, symbolic link or special file, then retry",
                report.unjudged.join("; ")
            ),
        ));
    }
    if let Some(busy) = &report.busy {
        return Some(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "workflow {workflow_id} has an interrupted {what} ({execution_id}) that cannot be recovered now: {busy}; nothing was done: try again later, or raise limits.lock_wait_seconds"
            ),
        ));
    }
    report.retry.then(|| {
        let why = report.why.as_deref().map_or_else(
            || "none of its snapshots could be read (see the log); make its sandbox roots readable again".to_owned(),
            |why| format!("{why} (see the log); put that right"),
        );
        Refusal::new(
            report.why_code.unwrap_or(ReasonCode::IoError),
            format!(
                "workflow {workflow_id} has an interrupted {what} ({execution_id}) that could not be recovered: {why}, then retry"
            ),
        )
    })
}
