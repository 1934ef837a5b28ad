//! How [`Sandbox`] makes writes durable: targeted syncs under `strict`, sync points
//! and commit logs under `batched`, and the per-workflow run records recovery reads.
//!
//! `strict` (the default) syncs, per action: the snapshot's files and then its folder
//! (before the target is touched), the target's temporary file and its directory (the
//! atomic write), then one `fdatasync` each for the registry and audit appends. Those two
//! are made after the logs' locks are let go, so that readers of the registry or the trail
//! never wait for a disk flush, and appends waiting at the same time share one sync; an
//! action returns only once its lines are durable. A run marks its workflow's record in
//! `inflight/` active before its first write and idle after (rewritten in place), which is
//! how start-up recovery finds runs that died.
//!
//! `batched` replaces the per-file syncs with whole-filesystem ones (`syncfs`), one per
//! file write. The executor prepares the action's outcome first (new bytes, checksum,
//! registry entry, audit record), stages the new bytes in a temporary file beside the
//! target and writes the snapshot with a commit record in its `meta.json` (the staged name,
//! the checksum, the entry and the record). One `syncfs` then makes the run record, the
//! snapshot and the staged bytes durable together, before the target changes; the rename
//! and the two log appends follow unsynced and reach the disk with the next sync point. A
//! small file write commits through its workflow's commit log instead (`commit_log`);
//! larger writes keep the `syncfs` commit point, since a log would write their bytes twice.
//! Because a run's last writes are durable only at the next sync point, its idle mark and
//! the audit head wait for that point too (or for the sandbox's drop, which makes one), so
//! neither can reach the disk ahead of the lines it vouches for. A `batched` run that ends
//! marks its record `finished`, with the kernel's boot id, until its process's next sync
//! point marks it idle, so that an ended run waiting for its sync point is not taken for
//! dead.
//!
//! A logged commit's snapshot, staged file, rename and log lines stay in memory until a
//! sync point: every 32 logged commits (between runs), a write that needs one anyway, a
//! rollback, a prune, or the sandbox's drop. A sync point empties the logs whose workflows
//! are idle and that are still where their last finished commit left them (same generation,
//! same end): a commit registers for emptying only once its writes are made, so no sync
//! that began earlier can empty its entry. A rollback or prune (in any process), and a
//! failed run before its own rollback, first makes the workflow's log's writes durable and
//! empties it, so no later replay can redo an action they undid or recreate a snapshot they
//! removed; that run's record then says a rollback is under way, as a rollback's does, so a
//! start after it dies records the restores made and says what is left to roll back.
//! Emptying another process's log takes a whole-system sync first. Whatever a run record
//! says, a run, rollback or prune of a workflow is refused while its log holds entries for
//! a root this process lacks (another process's acknowledged writes, which its sync point
//! would empty with the log; the log is read only when it holds entries this process did
//! not log). A sync point that fails puts the records of the runs it was to make durable
//! back to under way: the kernel may have dropped their pages, and the next start checks
//! them and replays their logs.
//!
//! A write that creates directories, and `create_directory`, keep two sync points (after
//! the snapshot; after the target and the logs), with recovery checking an audited target
//! against its `after_checksum`. Each sync covers every filesystem the pipeline wrote to,
//! since a directory inside a root may be a mount. A FUSE filesystem, which passes no
//! `syncfs` on, is refused: at start for a root or the state directory, and at a staged
//! write into a mount inside a root; there the writes that are not staged, the directories
//! made and the restores sync their folder themselves. Concurrent actions share syncs
//! (`GroupCommit`). After a failed sync no later ticket is reported durable: the journals
//! append nothing more, the executor refuses every action before its snapshot and every
//! rollback before its first restore (`io_error`, saying to restart), and the run's record
//! stays active, so that the next start's recovery checks the run against what reached the
//! disk.
//!
//! `relaxed` keeps every atomic rename and drops the syncs.

use super::{Sandbox, lock_or_recover};
use crate::commit_log::Position;
use crate::confine::RelPath;
use crate::reason::{ReasonCode, Verdict};

/// Commits a sandbox logs between two sync points.
const LOGGED_PER_SYNC: usize = 32;

impl Sandbox {
    /// Whether writes must survive a power cut once reported done (`strict` or
    /// `batched`), however they are made so.
    pub(crate) fn durable(&self) -> bool {
        self.config.durability.is_durable()
    }

    /// Whether each write syncs its own file and directory (strict durability without
    /// batched syncs). Paths that are not on the hot path (rollback, recovery) use
    /// [`Sandbox::durable`] instead.
    pub(crate) fn fsync_each(&self) -> bool {
        self.config.durability.is_durable() && self.batch_sync.is_none()
    }

    /// How a file write in no commit log (a restore, a write whose folders are made with
    /// it) is flushed: its bytes before they take the target's place whenever writes are
    /// durable; its folder too under `strict` only. Under `batched` the names it changes
    /// are the sync point's that follows, as a staged write's are, so that a folder this
    /// process may write in but not read, which `batched` writes in, never needs its own
    /// sync.
    pub(crate) fn unlogged_flush(&self) -> crate::confine::root::Flush {
        use crate::confine::root::Flush;
        match (self.durable(), self.fsync_each()) {
            (true, true) => Flush::FileAndDir,
            (true, false) => Flush::FileOnly,
            (false, _) => Flush::Nothing,
        }
    }

    /// With batched durability, how many whole-filesystem syncs this sandbox has made so
    /// far (concurrent actions share them); `None` otherwise.
    pub fn batched_syncs(&self) -> Option<u64> {
        self.batch_sync.as_ref().map(|s| s.syncs_made())
    }

    /// Why this process writes nothing more, once a sync of its logs or of its
    /// filesystems failed: the kernel may have dropped what it could not write, so no
    /// later write could be promised durable.
    pub fn sync_failure(&self) -> Option<std::io::Error> {
        self.registry
            .sync_failure()
            .or_else(|| self.audit.sync_failure())
            .or_else(|| self.batch_sync.as_ref().and_then(|s| s.failed()))
    }

    /// Why this process can write nothing more until it is started again: a sync
    /// failed ([`Sandbox::sync_failure`]), or its registry or audit trail was moved away
    /// or replaced while it ran. `None` while it can write. For health checks: every
    /// write of such a process fails, and a restart is the remedy.
    pub fn write_failure(&self) -> Option<String> {
        // Never waits: see `journal::held_failure`.
        self.registry
            .write_failure()
            .or_else(|| self.audit.write_failure())
            .or_else(|| {
                let failed = self.batch_sync.as_ref()?.failed()?;
                Some(crate::error::sync_failed_words("the filesystems", &failed))
            })
    }

    /// [`Sandbox::sync_failure`] as the refusal of a write or a restore.
    pub(crate) fn check_syncs(&self) -> Verdict {
        match self.sync_failure() {
            Some(e) => Err(crate::reason::Refusal::new(
                ReasonCode::IoError,
                e.to_string(),
            )),
            None => Ok(()),
        }
    }

    /// Whether file writes are staged and committed with one durability point (batched
    /// syncs).
    pub(crate) fn stages_writes(&self) -> bool {
        self.batch_sync.is_some()
    }

    /// Makes the next sync points cover the filesystem of `dir`, a directory the
    /// pipeline just wrote into (a no-op unless syncs are batched).
    /// A folder on a filesystem no sync point reaches (a FUSE mount inside a root) is
    /// refused, in words that say so: a write staged there could never be made durable.
    pub(crate) fn cover_for_sync(&self, dir: &cap_std::fs::Dir) -> Verdict {
        match &self.batch_sync {
            Some(s) => s.cover(dir).map_err(|e| cover_refusal(&e)),
            None => Ok(()),
        }
    }

    /// [`Sandbox::cover_for_sync`] for the nearest existing directory above `rel` (a
    /// restore may have removed the directories an action created). A folder no sync
    /// point reaches (FUSE), where a restore, a directory made or a write not staged
    /// has landed, is synced on its own instead, as under `strict`: refused, the change
    /// there could never be made durable.
    pub(crate) fn cover_target(&self, root: usize, rel: &RelPath) -> Verdict {
        let Some(s) = &self.batch_sync else {
            return Ok(());
        };
        let mut comps = rel.components().to_vec();
        while !comps.is_empty() {
            if let Ok((dir, _)) =
                self.roots[root].open_parent(&RelPath::from_components(comps.clone()), false, false)
            {
                return match s.cover(&dir) {
                    Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                        crate::confine::root::sync_dir(&dir).map_err(|e| {
                            crate::reason::Refusal::new(
                                ReasonCode::IoError,
                                format!(
                                    "could not sync the target's folder: {}",
                                    crate::error::io_words(&e)
                                ),
                            )
                        })
                    }
                    r => r.map_err(|e| cover_refusal(&e)),
                };
            }
            comps.pop();
        }
        Ok(())
    }

    /// One of the pipeline's durability points: everything written so far reaches
    /// stable storage (a no-op unless syncs are batched).
    pub(crate) fn sync_point(&self) -> Verdict {
        let Some(s) = &self.batch_sync else {
            return Ok(());
        };
        // What waits for this sync is taken first: whatever is queued later may name
        // writes this sync does not cover.
        let idle = std::mem::take(&mut *lock_or_recover(&self.idle_after_sync));
        let head = self.audit.pending_head();
        let logs = std::mem::take(&mut *lock_or_recover(&self.logs_after_sync));
        self.logged_since_sync
            .store(0, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.failpoints.check("batch_sync").and_then(|()| s.sync()) {
            // Back for the next sync point; what registered meanwhile is newer.
            let mut pending = lock_or_recover(&self.logs_after_sync);
            for (wf, at) in logs {
                pending.entry(wf).or_insert(at);
            }
            drop(pending);
            // The kernel may have dropped what it could not write: these runs are no
            // longer finished for a start in this boot, which checks them against the
            // disk and replays their logs.
            for rec in idle {
                self.mark_after_sync(rec, false);
            }
            return Err(crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not sync to stable storage: {}",
                    crate::error::io_words(&e)
                ),
            ));
        }
        self.empty_commit_logs(logs);
        if let Err(e) = self.audit.publish_head(head) {
            tracing::warn!(error = %e, "could not move the audit head");
        }
        for rec in idle {
            self.mark_after_sync(rec, true);
        }
        Ok(())
    }

    /// Empties the commit logs whose entries the sync point just made durable elsewhere:
    /// those whose workflow is not running (its lock is free) and that are where their
    /// last finished commit left them. The others stay for a later sync point.
    fn empty_commit_logs(&self, logs: std::collections::HashMap<String, Position>) {
        for (wf, at) in logs {
            let done = match self.state.try_lock_workflow(&wf) {
                Ok(Some(_lock)) => match self.state.commit_log_file(&wf) {
                    Ok(Some(f)) => match crate::commit_log::position(&f) {
                        Ok(Some(now)) if now == at => crate::commit_log::clear(&f)
                            .inspect_err(|e| {
                                tracing::warn!(workflow = %wf, error = %e, "could not empty a commit log after a sync point; it is tried again at the next one (what it holds is durable elsewhere already)");
                            })
                            .is_ok(),
                        // Emptied since by another holder of the lock, or unreadable.
                        Ok(Some(now)) => now.generation != at.generation,
                        Ok(None) => true,
                        Err(_) => false,
                    },
                    Ok(None) => true,
                    Err(_) => false,
                },
                _ => false,
            };
            if !done {
                lock_or_recover(&self.logs_after_sync)
                    .entry(wf)
                    .or_insert(at);
            }
        }
    }

    /// Whether a file write of `logged` bytes (backup and new bytes) may commit through
    /// its workflow's commit log rather than a whole-filesystem sync.
    pub(crate) fn logs_commit(&self, logged: usize) -> bool {
        self.batch_sync.is_some() && logged <= crate::commit_log::MAX_LOGGED_BYTES
    }

    /// The commit point of a write whose snapshot (and staged bytes) are written. With
    /// `entry` (a small staged write under `batched`) it is one append to the workflow's
    /// commit log, synced, and the log's position is returned for
    /// [`Sandbox::commit_finished`]; otherwise, and for a workflow's first commit, a sync
    /// point, which also makes the new log durable. Call with the workflow's lock held.
    pub(crate) fn commit_point(
        &self,
        entry: Option<crate::commit_log::NewEntry<'_>>,
    ) -> Verdict<Option<Position>> {
        let io = |e: std::io::Error| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not write the commit log: {}",
                    crate::error::state_io_words(&e)
                ),
            )
        };
        let Some(e) = entry else {
            return self.sync_point().map(|()| None);
        };
        let wf = &e.meta.workflow_id;
        let Some(log) = self.state.commit_log_file(wf).map_err(io)? else {
            let created = match self.state.commit_log_create(wf) {
                Ok(_) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "could not create a commit log; this write syncs instead");
                    false
                }
            };
            let synced = self.sync_point();
            if synced.is_err() && created {
                // Its directory entry may not be durable: no entry may go into it.
                let _ = self.state.commit_log_remove(wf);
            }
            return synced.map(|()| None);
        };
        let Some(at) = crate::commit_log::append(&log, &e).map_err(io)? else {
            // The log is full (many commits since the last sync point): this one syncs.
            return self.sync_point().map(|()| None);
        };
        self.logged_since_sync
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(at))
    }

    /// A logged commit's writes are all made (in memory): the next sync point to begin
    /// makes them durable and may then empty the log if it is still `at`. Registering
    /// only now keeps a sync that began before these writes from emptying the log.
    pub(crate) fn commit_finished(&self, workflow_id: &str, at: Position) {
        lock_or_recover(&self.logs_after_sync).insert(workflow_id.to_owned(), at);
    }

    /// Makes a sync point once enough commits wait in logs, so that logs stay short and
    /// recovery quick. Called between runs, when no workflow lock of this caller is held.
    pub(crate) fn sync_if_logs_are_long(&self) {
        if self
            .logged_since_sync
            .load(std::sync::atomic::Ordering::Relaxed)
            >= LOGGED_PER_SYNC
            && let Err(r) = self.sync_point()
        {
            tracing::warn!(reason = %r.reason, "could not make a sync point");
        }
    }

    /// Before a workflow's snapshots change hands (rollback, prune): what its commit log
    /// holds is made durable in place and the log emptied, so that no later recovery
    /// replays an entry whose action has since been undone. Says whether that took a sync
    /// point (the log held entries). Call with the workflow's lock held.
    pub(crate) fn settle_commit_log(&self, workflow_id: &str) -> Verdict<bool> {
        let io = |e: std::io::Error| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not empty the commit log: {}",
                    crate::error::io_words(&e)
                ),
            )
        };
        let Some((f, at)) = self.log_with_entries(workflow_id).map_err(io)? else {
            return Ok(false);
        };
        if self.check_log_entries(workflow_id, &f, &at)? {
            // Another process logged them and may have written beneath a mount inside a
            // root, which this process's syncs do not cover.
            rustix::fs::sync();
        }
        self.sync_logged_writes()?;
        crate::commit_log::clear(&f).map_err(io)?;
        lock_or_recover(&self.logs_after_sync).remove(workflow_id);
        Ok(true)
    }

    /// Refuses (`io_error`) while a workflow's commit log holds entries for a root this
    /// sandbox is not configured with (see [`Self::check_log_entries`]).
    pub(crate) fn refuse_foreign_log_entries(&self, workflow_id: &str) -> Verdict {
        let entries = self.log_with_entries(workflow_id).map_err(|e| {
            crate::reason::Refusal::new(
                ReasonCode::IoError,
                format!(
                    "could not read the commit log: {}",
                    crate::error::io_words(&e)
                ),
            )
        })?;
        match entries {
            Some((f, at)) => self.check_log_entries(workflow_id, &f, &at).map(drop),
            None => Ok(()),
        }
    }

    /// Refuses (`io_error`) a commit log `f`, whose entries end `at`, that holds entries
    /// for a root this sandbox is not configured with: acknowledged writes another
    /// process made, which this one can neither sync nor replay, and which emptying the
    /// log would lose. Entries this process logged itself since its last sync point are
    /// not read again. Returns whether the log holds entries another process logged.
    fn check_log_entries(
        &self,
        workflow_id: &str,
        f: &crate::confine::state::CommitLogFile,
        at: &Position,
    ) -> Verdict<bool> {
        if lock_or_recover(&self.logs_after_sync).get(workflow_id) == Some(at) {
            return Ok(false);
        }
        let foreign = crate::commit_log::read(f)
            .map_err(|e| {
                crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not read the commit log: {}",
                        crate::error::io_words(&e)
                    ),
                )
            })?
            .into_iter()
            .map(|e| e.meta.root)
            .find(|root| !self.roots.iter().any(|r| r.is_named_by(root)));
        match foreign {
            Some(root) => {
                // Named in the log only: a refusal reaches clients, who learn no path
                // outside the roots.
                tracing::warn!(workflow = workflow_id, %root, "a commit log holds writes into a root this process lacks");
                Err(crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "workflow {workflow_id}'s commit log holds acknowledged writes into a root this process is not configured with (the log names it); run any command with that root configured to replay them, then retry"
                    ),
                ))
            }
            None => Ok(true),
        }
    }

    /// A workflow's commit log and where its entries end, when it holds any.
    fn log_with_entries(
        &self,
        workflow_id: &str,
    ) -> std::io::Result<Option<(crate::confine::state::CommitLogFile, Position)>> {
        let Some(f) = self.state.commit_log_file(workflow_id)? else {
            return Ok(None);
        };
        Ok(crate::commit_log::position(&f)?
            .filter(|p| !p.is_empty())
            .map(|at| (f, at)))
    }

    /// Whether a workflow's commit log holds entries.
    pub(crate) fn commit_log_holds_entries(&self, workflow_id: &str) -> std::io::Result<bool> {
        Ok(self.log_with_entries(workflow_id)?.is_some())
    }

    /// Makes durable whatever a commit log's writes left in memory: a sync point, or one
    /// whole-system sync when this sandbox does not batch its syncs (the logs were
    /// written by another process, or before the durability changed).
    pub(crate) fn sync_logged_writes(&self) -> Verdict {
        if self.batch_sync.is_some() {
            return self.sync_point();
        }
        rustix::fs::sync();
        Ok(())
    }

    /// Marks a finished run's record idle. With batched syncs the last writes of a run
    /// may still be in memory when it returns, and an idle record makes recovery skip the
    /// run, so the mark waits for the next sync point (or the sandbox's drop).
    /// `file`: the record's file, when the run holds it open.
    pub(crate) fn run_finished(
        &self,
        rec: crate::recovery::InflightRecord,
        file: Option<&crate::confine::state::BlockFile>,
    ) {
        if self.sync_failure().is_some() {
            // Left active: the next start's recovery checks this run's actions against
            // what reached the disk.
            tracing::warn!(workflow = %rec.workflow_id, "a sync failed during this run; its record stays active for recovery");
            return;
        }
        let (mark, what) = if self.batch_sync.is_some() {
            // Marked finished at once (not synced): a later run of the workflow in any
            // process then knows this one did not die half way.
            let finished = rec.finished();
            lock_or_recover(&self.idle_after_sync).push(rec);
            (finished, "finished")
        } else {
            // Not synced: after a crash an `active` record of a finished run only makes
            // the next start look for unfinished actions, and find none.
            (rec.idle(), "idle")
        };
        if let Err(e) = self.write_record_to(&mark, false, file) {
            tracing::warn!(error = %e, "could not mark a workflow's run {what}");
        }
    }

    /// After a sync point, marks a finished run's record idle (`synced`: its writes are
    /// durable) or under way again (the sync failed), unless a newer run of the workflow
    /// has taken over the record (its lock is held, or the record names another
    /// execution): that run owns the record now.
    fn mark_after_sync(&self, rec: crate::recovery::InflightRecord, synced: bool) {
        let Ok(Some(_lock)) = self.state.try_lock_workflow(&rec.workflow_id) else {
            return;
        };
        let current = self.run_record(&rec.workflow_id);
        if current.is_none_or(|c| c.execution_id != rec.execution_id) {
            return;
        }
        if synced {
            self.write_idle(&rec);
        } else if let Err(e) = self.write_record(&rec, false) {
            tracing::warn!(error = %e, "could not mark a run unfinished after a failed sync");
        }
    }

    fn write_idle(&self, rec: &crate::recovery::InflightRecord) {
        self.write_idle_record(rec, false);
    }

    /// Writes `rec` with state `idle`.
    pub(crate) fn write_idle_record(&self, rec: &crate::recovery::InflightRecord, durable: bool) {
        if let Err(e) = self.write_record(&rec.idle(), durable) {
            tracing::warn!(error = %e, "could not mark a workflow's record idle");
        }
    }

    /// The configured roots at `indexes`, each once, as a run record names them.
    pub(crate) fn root_names(&self, indexes: impl Iterator<Item = usize>) -> Vec<String> {
        let mut names: Vec<String> = indexes
            .filter_map(|i| self.root_paths.get(i))
            .map(|p| p.display().to_string())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Writes a workflow's in-flight record (in place; synced when `durable`).
    pub(crate) fn write_record(
        &self,
        rec: &crate::recovery::InflightRecord,
        durable: bool,
    ) -> std::io::Result<()> {
        self.write_record_to(rec, durable, None)
    }

    /// [`Sandbox::write_record`] through `file` when the caller holds the record open.
    pub(in crate::sandbox) fn write_record_to(
        &self,
        rec: &crate::recovery::InflightRecord,
        durable: bool,
        file: Option<&crate::confine::state::BlockFile>,
    ) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        match file {
            Some(f) => {
                f.write(&bytes)?;
                if durable {
                    f.sync_data()?;
                }
                Ok(())
            }
            None => self.state.inflight_write(&rec.workflow_id, &bytes, durable),
        }
    }

    /// Refuses a plan (or, `rollback`, a rollback) writing into roots whose paths together
    /// do not fit its run record, with room for what recovery may add later (the
    /// processes that recover it, when). Judged by each before it writes its record (or
    /// simulates), so that [`Sandbox::begin_record`] need not.
    pub(crate) fn record_room(&self, roots: &[String], rollback: bool) -> Verdict {
        let (taken, room) = crate::recovery::InflightRecord::room_for_roots(roots);
        if taken <= room {
            return Ok(());
        }
        let (what, instead) = if rollback {
            ("rollback", "roll its actions back one at a time")
        } else {
            (
                "plan",
                "split it into plans that each write into fewer roots",
            )
        };
        Err(crate::reason::Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "this {what} writes into {} roots whose paths together take {taken} bytes of the run record, which has room for {room}; {instead}",
                roots.len()
            ),
        ))
    }

    /// Records that `rec`'s run or rollback is under way, before it changes any file
    /// (synced under `strict`; under `batched` the next sync point covers it). `file`:
    /// the record's file, when the caller holds it open.
    pub(crate) fn begin_record(
        &self,
        rec: &crate::recovery::InflightRecord,
        file: Option<&crate::confine::state::BlockFile>,
    ) -> Verdict {
        self.write_record_to(rec, self.fsync_each(), file)
            .map_err(|e| {
                crate::reason::Refusal::new(
                    ReasonCode::IoError,
                    format!(
                        "could not record the {} in the state directory: {}",
                        if rec.state == crate::recovery::ROLLING_BACK {
                            "rollback"
                        } else {
                            "run"
                        },
                        crate::error::state_io_words(&e)
                    ),
                )
            })
    }
}

/// Why a folder could not be covered by the sync points: the filesystem's own words
/// when no sync point reaches it (FUSE), else the error's.
fn cover_refusal(e: &std::io::Error) -> crate::reason::Refusal {
    let words = if e.kind() == std::io::ErrorKind::Unsupported {
        e.to_string()
    } else {
        format!(
            "could not open the target's filesystem for syncing: {}",
            crate::error::io_words(e)
        )
    };
    crate::reason::Refusal::new(ReasonCode::IoError, words)
}
