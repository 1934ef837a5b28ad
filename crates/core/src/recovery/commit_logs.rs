//! Start-up recovery of `batched` commit logs: what a log holds is written again where
//! a power cut lost it, and each target gets its newest logged bytes. It runs before any
//! dead run is judged.
//!
//! A non-empty log whose workflow lock is free is replayed: each entry's snapshot (folder,
//! backup, metadata), registry entry and audit record is put back if missing, and per
//! target (under its target lock) the newest entry's bytes are put in place, unless the
//! target holds none of the contents the log knew for it (someone changed it since; it is
//! left alone). An entry whose snapshot is marked restored was undone and is skipped: the
//! undo's mark is durable before a run reports the failure (a full root can refuse the
//! mark: the undo's audit line still says so, and a rollback takes the trail's word that
//! the action is undone). A torn last entry ends the log: that write never committed. Since
//! entries are synced one at a time, an entry that does not check out before one that does
//! was damaged or changed since: the log is not replayed, emptied or judged from, and its
//! run stays unfinished and the workflow refused, naming it, until the log is put back or
//! moved away.
//!
//! After a power cut the logs are replayed in the order their first writes were made. A
//! replay covers every logged target for its closing sync, even one already in place (the
//! writer may have written beneath a filesystem mounted inside a root); it never marks an
//! audited action undone, and never puts a log's older bytes over a later run's audited
//! write that put them back. A log whose replay failed anywhere (a target's bytes not put
//! in place, say) is kept, its run left for the start that can replay it all. Log entries a
//! replay keeps for a root not configured add that root to the run record. A start that
//! replays a log names itself in the run record before it writes, as a recovery does
//! (`recovered_by`), and first removes what earlier replays or recoveries that died left
//! beside the log's targets.
//!
//! The log of a `batched` run that finished in this boot (its record `finished`, left so by
//! a killed process) is made durable and emptied, never replayed. A run record from an
//! earlier boot whose log is still unreplayed refuses a new run rather than having its log
//! settled.

use super::{
    InflightRecord, RESTORES_UNAUDITED, ROLLING_BACK, Recovered, dead_makers, found_its_result,
    needs_recovery,
};
use crate::audit::AuditStatus;
use crate::commit_log::CommitEntry;
use crate::confine::RelPath;
use crate::confine::state::CommitLogFile;
use crate::reason::Verdict;
use crate::sandbox::{Restorer, Sandbox};
use std::collections::HashSet;

impl Sandbox {
    /// Replays the commit logs of workflows no process is running (see
    /// [`crate::commit_log`]), then recovers their runs as usual, makes it all durable
    /// and empties the logs.
    pub(super) fn recover_commit_logs(&self) -> Vec<Recovered> {
        let workflows = match self.state.commit_logs() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list commit logs");
                return Vec::new();
            }
        };
        // Most logs are empty: they are told apart without taking the lock (which may
        // mean creating its file), and read again under it. The others are replayed in
        // the order their first writes were made: two workflows may have rewritten one
        // file, and each replay builds on what the earlier ones put back.
        let mut pending: Vec<(String, String)> = workflows
            .into_iter()
            .filter(|wf| crate::plan::is_valid_id(wf))
            .filter_map(|wf| match self.read_commit_log(&wf) {
                Ok(Some((_, e))) if e.is_empty() => None,
                Ok(Some((_, e))) => Some((e[0].meta.taken_at.clone(), wf)),
                _ => Some((String::new(), wf)),
            })
            .collect();
        pending.sort();
        pending
            .iter()
            .filter_map(|(_, wf)| self.recover_commit_log(wf))
            .collect()
    }

    /// A workflow's commit log and its entries, `None` when it has none.
    fn read_commit_log(
        &self,
        wf: &str,
    ) -> std::io::Result<Option<(CommitLogFile, Vec<CommitEntry>)>> {
        self.state.commit_log_file(wf).and_then(|f| match f {
            Some(f) => crate::commit_log::read(&f).map(|e| Some((f, e))),
            None => Ok(None),
        })
    }

    /// [`Sandbox::recover_commit_logs`] of one workflow's log: what recovering it did,
    /// when worth telling.
    fn recover_commit_log(&self, wf: &str) -> Option<Recovered> {
        let Ok(Some(_lock)) = self.state.try_lock_workflow(wf) else {
            return None;
        };
        let (file, entries) = match self.log_to_replay(wf) {
            Ok(Some(log)) => log,
            Ok(None) => return None,
            Err(unread) => return Some(*unread),
        };
        let record = || self.run_record(wf);
        // The replay writes targets through temporary files. What earlier replays or
        // recoveries of this log that died left beside them goes first (the run's
        // own, staged bytes among them, are its recovery's to judge), and this
        // process is named before it writes, for the next start should it die too.
        let before = record().or_else(|| entries.last().map(|e| e.record.clone()));
        let mut swept = Recovered::default();
        if let Some(r) = &before {
            self.sweep_before_replay(r, &entries, &mut swept);
            self.claim(r);
        }
        let Replayed {
            changed: replayed,
            complete,
            kept,
            log_failure,
            left_changed,
        } = self.replay_commits(wf, &entries);
        // The record was not synced with the log: if it is gone, the log's last run
        // stands in for it.
        let mut rec = record().or_else(|| entries.last().map(|e| e.record.clone()));
        // Entries kept for a root not configured now hold acknowledged writes: the
        // record names that root, so that until a start that has it replays them,
        // no run, rollback or prune of the workflow here empties the log.
        if !kept.is_empty()
            && let Some(r) = rec.as_mut()
        {
            self.name_kept_roots(r, &entries, &kept);
        }
        let dead = rec.as_ref().filter(|r| needs_recovery(r));
        // A replay that could not put every target's bytes in place leaves the run
        // unjudged: judged now, an audited write whose bytes are not back would be
        // taken for undone, and its log entry skipped ever after.
        let mut report = match dead {
            Some(r) if complete => self.recover_record(r),
            _ => Recovered {
                execution_id: rec
                    .as_ref()
                    .map(|r| r.execution_id.clone())
                    .unwrap_or_default(),
                workflow_id: wf.to_owned(),
                ..Recovered::default()
            },
        };
        report.completed += replayed;
        report.logged_left_changed = left_changed;
        // What the sweep could not do is said even when the replay is not.
        let swept_said = swept.retry
            || !swept.temp_files_left.is_empty()
            || !swept.temp_folders_unlisted.is_empty();
        report.take_temp_files_of(swept);
        // Entries for a root not configured now stay, alone, for a start that has it:
        // their writes were acknowledged, and the others must not be replayed again.
        let keep: Vec<_> = kept.iter().map(|&i| entries[i].clone()).collect();
        let concluded = complete && self.empty_replayed_log(wf, &file, &keep);
        if !complete {
            tracing::error!(workflow = %wf, "a commit log could not be replayed in full; it is kept for the next start");
        }
        if let Some(r) = dead
            && !report.retry
        {
            if concluded {
                self.settle_record(r, &mut report);
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
        // The run is judged with its log, by the start that can replay it all, not
        // now by the usual recovery, which would call it recovered.
        if !complete {
            // A log that would not take an entry is said as such (a held trail too).
            match &log_failure {
                Some(e) => report.writes_unaudited(e),
                None => {
                    report.retry_for(format!("its commit log inflight/{wf}.log could not be replayed in full (see the log); it is kept"));
                }
            }
        }
        let told = !complete
            || swept_said
            || !report.logged_left_changed.is_empty()
            || (concluded && (replayed > 0 || dead.is_some_and(|r| report.worth_telling(r))));
        told.then_some(report)
    }

    /// The commit log of `wf` to replay, `None` when there is none to replay (empty, or
    /// its run finished in this boot: then made durable and emptied); the recovery to
    /// report when it cannot be read.
    fn log_to_replay(
        &self,
        wf: &str,
    ) -> Result<Option<(CommitLogFile, Vec<CommitEntry>)>, Box<Recovered>> {
        let record = || self.run_record(wf);
        // Its run finished in this boot: nothing the log covers was lost, so it is
        // not replayed, only made durable and emptied (as that process's next sync
        // point would); settling refuses a log that covers a root this start lacks.
        if record().is_some_and(|r| r.finished_this_boot()) {
            if let Err(r) = self.settle_commit_log(wf) {
                tracing::warn!(reason = %r.reason, workflow = %wf, "cannot empty a finished run's commit log");
            }
            return Ok(None);
        }
        match self.read_commit_log(wf) {
            Ok(Some((f, e))) if !e.is_empty() => Ok(Some((f, e))),
            Ok(_) => Ok(None),
            // Its run is not judged without what the log holds (the acknowledged
            // writes a power cut may have taken from the files): it stays recorded
            // as unfinished, and the workflow refused, until the log can be read.
            Err(e) => {
                tracing::warn!(error = %e, workflow = %wf, "cannot read a commit log");
                Err(Box::new(Recovered {
                    execution_id: record().map(|r| r.execution_id).unwrap_or_default(),
                    workflow_id: wf.to_owned(),
                    why: Some(format!(
                        "its commit log inflight/{wf}.log could not be read ({})",
                        crate::error::io_words(&e)
                    )),
                    retry: true,
                    ..Recovered::default()
                }))
            }
        }
    }

    /// Removes what earlier replays or recoveries of this log that died (every maker
    /// of `r` but the run itself) left beside the logged targets.
    fn sweep_before_replay(
        &self,
        r: &InflightRecord,
        entries: &[CommitEntry],
        swept: &mut Recovered,
    ) {
        let earlier: Vec<&str> = dead_makers(r).into_iter().skip(1).collect();
        // Each entry's bytes as an earlier replay staged them: named from its action and
        // that replay's process.
        let mut named = super::TempNames::new();
        for e in entries {
            let Some(i) = self.roots.iter().position(|r| r.is_named_by(&e.meta.root)) else {
                continue;
            };
            let folder = (i, e.meta.target().parent_components().to_vec());
            named
                .entry(folder)
                .or_default()
                .extend(earlier.iter().map(|by| {
                    crate::confine::root::action_temp_name(
                        &e.meta.workflow_id,
                        &e.meta.action_id,
                        crate::ids::process_seed(by),
                    )
                }));
        }
        self.remove_dead_temp_files(&earlier, std::collections::HashSet::new(), &named, swept);
    }

    /// Names in the run record the roots of the entries `kept` (for roots not
    /// configured now), so that until a start that has them replays those entries, no
    /// run, rollback or prune of the workflow here empties the log.
    fn name_kept_roots(&self, r: &mut InflightRecord, entries: &[CommitEntry], kept: &[usize]) {
        r.finished = false;
        if !matches!(r.state.as_str(), ROLLING_BACK | RESTORES_UNAUDITED) {
            r.state = "active".to_owned();
        }
        for &i in kept {
            if !r.roots.contains(&entries[i].meta.root) {
                r.roots.push(entries[i].meta.root.clone());
            }
        }
        if let Err(e) = self.write_record(r, self.durable()) {
            tracing::warn!(error = %e, workflow = %r.workflow_id, "could not name a missing root in a run record");
        }
    }

    /// After a replay in full: the replayed writes made durable, then the log emptied
    /// but for `keep`. False (logged) when either fails: the log stays for the next
    /// start.
    fn empty_replayed_log(&self, wf: &str, file: &CommitLogFile, keep: &[CommitEntry]) -> bool {
        if let Err(r) = self.sync_logged_writes() {
            tracing::warn!(reason = %r.reason, "cannot sync after replaying a commit log");
            false
        } else if let Err(e) = crate::commit_log::retain(file, keep) {
            tracing::warn!(error = %e, workflow = %wf, "cannot empty a commit log");
            false
        } else {
            true
        }
    }

    /// Redoes what a commit log's entries committed and the disk lost: each entry's
    /// snapshot, per target the newest entry's new bytes, then each entry's registry
    /// entry and audit record, but those of a target not put in place. An entry whose
    /// snapshot is marked restored was undone (durably) and is skipped. A target that
    /// holds none of the contents the entries knew for it was changed by someone else
    /// since, and is left as it is; each target is judged and written under its lock.
    /// Returns what it did ([`Replayed`]).
    fn replay_commits(&self, wf: &str, entries: &[crate::commit_log::CommitEntry]) -> Replayed {
        let audited = self.audited_actions(wf);
        // The run the workflow's record names is its latest: no run of the workflow can
        // have followed its entries (each would have taken the record over), so a line
        // of the workflow timed after them only says that the clock was set back.
        let latest = self.run_record(wf).map(|r| r.execution_id);
        let mut replay = Replay::new(latest);
        self.rewrite_logged_snapshots(wf, entries, &audited, &mut replay);
        self.put_newest_bytes(&mut replay);
        self.tell_logs_of_placed(&mut replay);
        if replay.superseded {
            self.record_marked_restores(wf);
        }
        warn_of_kept_entries(wf, entries, &replay.kept);
        Replayed {
            changed: replay.changed.len(),
            complete: replay.complete,
            kept: replay.kept,
            log_failure: replay.log_failure,
            left_changed: replay.left_changed,
        }
    }

    /// The runs and actions of the workflow the trail records as done: an audited
    /// action landed, and is never taken for one overtaken by another run's write.
    fn audited_actions(&self, wf: &str) -> HashSet<(String, String)> {
        self.audit
            .by_workflow(wf)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.status == AuditStatus::Success)
            .map(|e| (e.execution_id, e.action_id))
            .collect()
    }

    /// Sorts the log's entries: kept for a root not configured now, passed over, marked
    /// undone when overtaken, or live (their snapshots rewritten first): a target's bytes
    /// are only put back where the snapshot that can undo them is whole again.
    fn rewrite_logged_snapshots<'e>(
        &self,
        wf: &str,
        entries: &'e [crate::commit_log::CommitEntry],
        audited: &HashSet<(String, String)>,
        replay: &mut Replay<'e>,
    ) {
        use crate::snapshot::Snapshotter;
        for (at, e) in entries.iter().enumerate() {
            let (meta, Some(_)) = (&e.meta, &e.meta.commit) else {
                continue;
            };
            let Some(i) = self.roots.iter().position(|r| r.is_named_by(&meta.root)) else {
                // Its write was acknowledged: the entry is kept for a start that has the
                // root (said once per log, by `warn_of_kept_entries`).
                replay.kept.push(at);
                continue;
            };
            if meta.workflow_id != wf || !self.snapshot_to_rewrite(i, wf, e) {
                continue;
            }
            if let Err(r) =
                Snapshotter::repair(&self.roots[i], &self.seal, meta, e.backup.as_deref())
            {
                tracing::error!(reason = %r, "recovery could not rewrite a logged snapshot");
                replay.not_settled(i, meta);
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
                    .first_change_by_another(i, meta, replay.of_latest(meta))
                    .is_some_and(|first| !found_its_result(meta, &first))
            {
                if let Err(r) = self.mark_overtaken_undone(i, e) {
                    tracing::error!(reason = %r, "recovery could not mark an overtaken logged action undone");
                    replay.not_settled(i, meta);
                }
                replay.superseded = true;
                continue;
            }
            replay.live.push((i, e, was_audited));
        }
    }

    /// Whether the entry's snapshot is one this replay rewrites: not one marked restored
    /// (undone, durably), nor another's holding the action's folder, and with a backup
    /// whose bytes are the ones the entry says it took.
    fn snapshot_to_rewrite(&self, i: usize, wf: &str, e: &crate::commit_log::CommitEntry) -> bool {
        use crate::snapshot::Snapshotter;
        let meta = &e.meta;
        match Snapshotter::load(&self.roots[i], &self.seal, wf, &meta.action_id) {
            Ok(Some(s)) if s.restored => return false,
            Ok(Some(s)) if s.meta != *meta => {
                tracing::warn!(action = %meta.action_id, "another snapshot holds a logged action's folder; entry skipped");
                return false;
            }
            _ => {}
        }
        // The backup and metadata may be missing or torn even when the folder loads.
        let before = e.backup.as_deref().map(crate::hash::sha256_hex);
        e.backup.is_none() || before == meta.sha256
    }

    /// Marks a logged action another run overtook as undone, without touching its
    /// target: that run's change stands.
    fn mark_overtaken_undone(&self, i: usize, e: &crate::commit_log::CommitEntry) -> Verdict {
        let meta = &e.meta;
        let current = self.target_checksum(i, &meta.target());
        self.mark_restored(
            i,
            meta,
            &e.record.execution_id,
            &current,
            &[],
            // Changed nothing (see `undo_superseded`).
            Restorer::Recovery {
                found: Some(&current),
                said: None,
            },
        )
    }

    /// Puts each target's newest live entry's bytes in place, once a target: the older
    /// entries' bytes were written over by the newer ones when they ran.
    fn put_newest_bytes(&self, replay: &mut Replay<'_>) {
        let mut seen: HashSet<(usize, &str)> = HashSet::new();
        for &(i, e, was_audited) in replay.live.iter().rev() {
            let meta = &e.meta;
            if !seen.insert((i, meta.original_path.as_str()))
                || replay.unplaced.contains(&(i, meta.original_path.as_str()))
            {
                continue;
            }
            match self.put_logged_target(i, e, was_audited, replay) {
                Placing::Overtaken => {
                    if let Err(r) = self.mark_overtaken_undone(i, e) {
                        tracing::error!(reason = %r, "recovery could not mark an overtaken logged action undone");
                        replay.complete = false;
                        replay.unplaced.insert((i, meta.original_path.as_str()));
                    }
                    replay.superseded = true;
                    replay.overtaken.insert(meta.snapshot_id.as_str());
                }
                Placing::Written => {
                    replay.changed.insert(meta.snapshot_id.clone());
                }
                Placing::Untouched => {}
                Placing::LeftChanged => replay
                    .left_changed
                    .push(crate::confine::path::shown_path(&meta.original_path)),
                Placing::Failed => {
                    replay.complete = false;
                    replay.unplaced.insert((i, meta.original_path.as_str()));
                }
            }
        }
    }

    /// Judges one target against its newest live entry and puts the entry's bytes in
    /// place when the target holds other bytes the log knew for it.
    fn put_logged_target(
        &self,
        i: usize,
        e: &crate::commit_log::CommitEntry,
        was_audited: bool,
        replay: &Replay<'_>,
    ) -> Placing {
        let meta = &e.meta;
        let rel = meta.target();
        // A live process may be writing the target: judge and replace it under the
        // target's lock, as every writer does.
        let held = self
            .fail_at("lock_logged_target")
            .and_then(|()| self.lock_target(i, &rel));
        let _held = match held {
            Ok(h) => h,
            Err(r) => {
                tracing::error!(reason = %r, "recovery could not lock a logged action's target");
                return Placing::Failed;
            }
        };
        // A target the disk will not read is judged by no guess: the log is kept for a
        // start that can read it.
        let current = match self.target_state(i, &rel) {
            crate::sandbox::TargetState::File(sum) => Some(sum),
            crate::sandbox::TargetState::Failed(why) | crate::sandbox::TargetState::Denied(why) => {
                tracing::error!(reason = %why, "recovery could not read a logged action's target");
                return Placing::Failed;
            }
            _ => None,
        };
        let after = meta.commit.as_ref().map(|c| c.after_sha256.clone());
        if current == after {
            // In place, perhaps only in memory, maybe beneath a mount inside the
            // root: the sync that concludes the replay must cover it.
            if let Err(r) = self.cover_target(i, &rel) {
                tracing::error!(reason = %r, "recovery could not cover a logged target for its sync");
                return Placing::Failed;
            }
            return Placing::Untouched;
        }
        // The log's live entries for this target, `e` (the newest) among them.
        let of_target = || {
            replay
                .live
                .iter()
                .filter(|(j, o, _)| *j == i && o.meta.original_path == meta.original_path)
        };
        let known = of_target().any(|(_, o, _)| {
            current == o.meta.sha256
                || current == o.meta.commit.as_ref().map(|c| c.after_sha256.clone())
        });
        // The very file one of the log's writes put in place, as it left it but for its
        // bytes: its name reached the disk and its data did not (a power cut before the
        // sync point; a new file's data, say, on a filesystem that delays allocation),
        // and the newer writes' names may not have. Every writer of the runtime puts a
        // new file in place, and a write in place by another program changes the
        // modification time: neither is taken for this.
        let standing = self.roots[i].written_file(&rel);
        let lost = standing.is_some() && of_target().any(|(_, o, _)| o.staged == standing);
        // What the target holds may be older bytes of this log's that a later run
        // of another workflow wrote back.
        if !lost && (!known || self.put_back_by_another(i, meta, &current, replay.of_latest(meta)))
        {
            // Overtaken as `rewrite_logged_snapshots` tells, by a write that was under way
            // when it looked (another process held the target's lock): looked at again
            // under the lock, where no writer of the runtime is.
            if !was_audited
                && self
                    .first_change_by_another(i, meta, replay.of_latest(meta))
                    .is_some_and(|first| !found_its_result(meta, &first))
            {
                return Placing::Overtaken;
            }
            // Said at start (and logged) unless a write the trail records left it so
            // (another workflow's, or one of this one's too large for the log): then the
            // trail names what it holds, and nothing changed unsaid.
            let recorded = self
                .last_recorded(i, &rel)
                .is_some_and(|l| l.after_checksum == current);
            if recorded {
                return Placing::Untouched;
            }
            tracing::warn!(path = %meta.original_path, "a logged target changed since; left as it is");
            return Placing::LeftChanged;
        }
        match self.write_logged_bytes(i, &rel, e) {
            Ok(()) => Placing::Written,
            Err(r) => {
                tracing::error!(reason = %r, "recovery could not put a logged action's bytes in place");
                Placing::Failed
            }
        }
    }

    /// Writes the entry's bytes to its target through a temporary file and covers the
    /// target for the sync that concludes the replay, as a batched write is.
    fn write_logged_bytes(
        &self,
        i: usize,
        rel: &RelPath,
        e: &crate::commit_log::CommitEntry,
    ) -> Verdict {
        let mode = e
            .meta
            .mode
            .map_or(crate::confine::root::FILE_MODE, |m| m & 0o666);
        // Under a name known ahead (its action's, this process's): should this process
        // die, the next start removes it by that name, also from a folder it may not list.
        let staged = crate::confine::root::action_temp_name(
            &e.meta.workflow_id,
            &e.meta.action_id,
            &crate::ids::own_seed(),
        );
        self.roots[i]
            .stage_write(
                rel,
                crate::confine::root::Make::Nothing,
                &staged,
                &e.bytes,
                mode,
                None,
            )
            .and_then(|st| {
                // Staged bytes that are not put in place are not left beside it.
                self.fail_at("replay_staged")
                    .and_then(|()| {
                        st.commit_in(&self.roots[i], rel, crate::confine::root::Put::Any, false)
                    })
                    .inspect_err(|_| st.discard())
            })
            .and_then(|()| self.cover_target(i, rel))
    }

    /// Appends the registry entries and audit records the live entries lack, but those
    /// of a target not put in place.
    fn tell_logs_of_placed(&self, replay: &mut Replay<'_>) {
        // The registry and the trail are told of a write once its target holds its bytes:
        // a line appended before would name bytes the file does not hold until the start
        // that can write them (the log, kept meanwhile, has every line for that start).
        // The writes to targets that are in place are told now, before any later writer
        // of those files is: the trail keeps each file's changes in the order they came.
        for &(i, e, was_audited) in &replay.live {
            let Some(commit) = &e.meta.commit else {
                continue;
            };
            if replay.overtaken.contains(e.meta.snapshot_id.as_str()) {
                continue;
            }
            if replay
                .unplaced
                .contains(&(i, e.meta.original_path.as_str()))
            {
                continue;
            }
            match self.complete_logs(commit, was_audited) {
                Ok(true) => {
                    replay.changed.insert(e.meta.snapshot_id.clone());
                }
                Ok(false) => {}
                Err(e) => {
                    replay.complete = false;
                    replay.log_failure.get_or_insert(e);
                }
            }
        }
    }

    /// Finishes an action from its commit record: puts the staged bytes in place unless
    /// the target already holds them (`current`: its checksum once newer in-doubt actions
    /// on it are undone), then appends what the registry and the audit log
    /// lack; `Some(Ok(true))` when that changed anything, `Some(Err(_))` when an append
    /// failed (the run's record must stay for a later recovery to finish them). `None`
    /// when the new bytes are neither in place nor staged intact: the action is then
    /// rolled back like any unfinished one. `Err` (why) when the disk would not say
    /// what the target holds: nothing is done.
    pub(super) fn finish_commit(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        c: &crate::snapshot::SnapshotCommit,
        audited: bool,
        current: Option<&str>,
    ) -> Result<Option<std::io::Result<bool>>, String> {
        let rel = meta.target();
        let mut changed = false;
        if current != Some(c.after_sha256.as_str()) {
            let Some((staged, bytes)) = self.roots[root].find_staged(
                &rel,
                &c.staged_name,
                crate::snapshot::MAX_SNAPSHOT_BYTES,
            ) else {
                return Ok(None);
            };
            // Not the new bytes (the file an exchange cut short left under that name):
            // nothing to finish from.
            if crate::hash::sha256_hex(&bytes) != c.after_sha256 {
                return Ok(None);
            }
            // Changed since the action found it: by a later run once the dead one's
            // lock was gone, which read the file as it found it and may have told its
            // caller so. That write stands; the staged bytes, older, never go over it
            // (the log's replay has said the logged write was left changed).
            if !self.back_to_before(root, meta, current)? {
                staged.discard();
                return Ok(Some(self.complete_logs(c, audited)));
            }
            // Under `batched` the sync point that concludes recovery makes the rename
            // durable (covering the target's filesystem), as for any batched write: a
            // sync of the folder itself must open it for reading, which a folder this
            // process may only write in (mode 0300) refuses, and the write would be
            // undone.
            if self
                    .cover_target(root, &rel)
                    .inspect_err(|r| tracing::warn!(reason = %r, "recovery cannot cover a committed write's folder for its sync; the write is undone"))
                    .is_err()
                || staged
                    .commit(
                        crate::confine::root::Put::new_or_any(c.no_replace),
                        self.fsync_each(),
                    )
                    .is_err()
            {
                return Ok(None);
            }
            changed = true;
        }
        Ok(Some(
            self.complete_logs(c, audited)
                .map(|logged| changed || logged),
        ))
    }

    /// Appends a committed action's registry entry unless the registry has it, and its
    /// audit record unless `audited`; whether anything was appended (`Err` when an append
    /// failed, which is logged). No audit record follows a failed registration: the trail
    /// would record a write the registry lacks, which `audit verify` takes for a
    /// registry tampered with; both are appended by the recovery that retries.
    pub(super) fn complete_logs(
        &self,
        c: &crate::snapshot::SnapshotCommit,
        audited: bool,
    ) -> std::io::Result<bool> {
        let mut changed = false;
        if let Some(entry) = &c.artifact
            && self
                .registry
                .get(&entry.artifact_id)
                .ok()
                .flatten()
                .is_none()
        {
            changed = true;
            if let Err(e) = self
                .failpoints
                .check("recovery_register")
                .and_then(|()| self.registry.register(entry))
            {
                tracing::error!(error = %e, artifact = %entry.artifact_id, "recovery could not register an artifact");
                return Err(e);
            }
        }
        if !audited {
            changed = true;
            if let Err(e) = self.audit.append(vec![c.audit.clone()]) {
                tracing::error!(error = %e, "recovery could not audit a finished action");
                return Err(e);
            }
        }
        Ok(changed)
    }
}

/// What a commit log's replay did (see `replay_commits`).
struct Replayed {
    /// How many entries needed anything.
    changed: usize,
    /// Whether every write it tried succeeded.
    complete: bool,
    /// The entries kept for a root not configured now.
    kept: Vec<usize>,
    /// Why the registry or the trail would not take an entry, when one would not.
    log_failure: Option<std::io::Error>,
    /// Targets found changed since by someone else and left as they are, as shown.
    left_changed: Vec<String>,
}

/// What a commit log's replay has found and done so far, handed from step to step of
/// `replay_commits`.
struct Replay<'e> {
    /// The run the workflow's record names (see `replay_commits`).
    latest: Option<String>,
    /// The entries whose writes are replayed, in the log's order, each with its root's
    /// index and whether the trail records it.
    live: Vec<(usize, &'e crate::commit_log::CommitEntry, bool)>,
    /// The snapshots of the entries that needed anything.
    changed: HashSet<String>,
    /// Whether every write it tried succeeded.
    complete: bool,
    /// Why the registry or the trail would not take an entry, when one would not.
    log_failure: Option<std::io::Error>,
    /// Whether an entry overtaken by another run was marked undone.
    superseded: bool,
    /// The snapshots of live entries found overtaken once their targets were locked:
    /// marked undone, and never told to the registry or the trail as written.
    overtaken: HashSet<&'e str>,
    /// The entries kept for a root not configured now.
    kept: Vec<usize>,
    /// Targets this replay could not put (or confirm) in place, or settle.
    unplaced: HashSet<(usize, &'e str)>,
    /// Targets found changed since by someone else and left as they are, as shown.
    left_changed: Vec<String>,
}

impl<'e> Replay<'e> {
    fn new(latest: Option<String>) -> Self {
        Replay {
            latest,
            live: Vec::new(),
            changed: HashSet::new(),
            complete: true,
            log_failure: None,
            superseded: false,
            overtaken: HashSet::new(),
            kept: Vec::new(),
            unplaced: HashSet::new(),
            left_changed: Vec::new(),
        }
    }

    /// Whether the entry is of the workflow's latest run: a line of the workflow timed
    /// after it then only says that the clock was set back.
    fn of_latest(&self, meta: &crate::snapshot::SnapshotMeta) -> bool {
        self.latest.as_deref() == Some(meta.execution_id.as_str())
    }

    /// Notes a target with an entry this replay could not settle (its snapshot not
    /// rewritten, or its undo not marked): neither written nor told of now, the next
    /// start judging them with every entry in place.
    fn not_settled(&mut self, i: usize, meta: &'e crate::snapshot::SnapshotMeta) {
        self.complete = false;
        self.unplaced.insert((i, meta.original_path.as_str()));
    }
}

/// What became of a target a replay judged.
enum Placing {
    /// The entry's bytes were put in place.
    Written,
    /// Never in place, and overtaken by another run's write since (see
    /// `rewrite_logged_snapshots`): to be marked undone, its target left as it is.
    Overtaken,
    /// Already in place (and covered for the sync).
    Untouched,
    /// Changed since by a write the trail does not record, and left as it is.
    LeftChanged,
    /// Could not be locked, covered or written: the replay is not complete.
    Failed,
}

/// Says, once per log, which roots not configured now its kept entries name: their
/// writes were acknowledged, and wait for a start that has those roots.
fn warn_of_kept_entries(wf: &str, entries: &[crate::commit_log::CommitEntry], kept: &[usize]) {
    if !kept.is_empty() {
        let mut roots: Vec<&str> = kept
            .iter()
            .map(|&at| entries[at].meta.root.as_str())
            .collect();
        roots.sort_unstable();
        roots.dedup();
        tracing::warn!(
            workflow = %wf,
            entries = kept.len(),
            roots = %roots.join(", "),
            "commit log entries name roots not configured now; they are kept for a start that has them"
        );
    }
}
