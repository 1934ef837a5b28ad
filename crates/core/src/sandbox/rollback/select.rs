//! Which snapshots a rollback restores, in what order, and what refuses it before it
//! starts (conflicts, damaged backups, unwritable folders, later actions).
//!
//! Removal of a snapshot is caught through the audit trail, which lives in the state
//! directory: a workflow whose trail records a write with no snapshot left is refused
//! (`no_rollback_data`, naming the actions) rather than reported rolled back, and an action
//! the trail records as undone is not restored again if its mark is removed.
//!
//! A rollback (and a failed plan undoing its earlier actions) holds the locks of all its
//! targets, taken in stripe order, from its conflict check to its last restore, so no
//! writer lands on a half-restored tree. A restore without force goes ahead only if the
//! target still holds what its action left, so no restore throws away a change it never
//! saw, and one that meets such a change names it among the conflicts. Before anything is
//! restored, with the locks held, a rollback refuses, forced or not, what force cannot
//! override (`beyond_force`: a directory where the workflow wrote a file, a file where it
//! made one, a second hard link, a FIFO, a symbolic link in place of a target or on the
//! way, another root on the way), what this process may not change (`unwritable_folders`: a
//! folder of a target, or of a directory an action made that the rollback removes, without
//! write permission for it, read-only, marked immutable or append-only, or sticky with the
//! entry another user's), and a backup that cannot give its file back (`damaged_backups`),
//! so it never stops half way on one of them. The preview runs the same checks.

use super::{RollbackOptions, RollbackRefusal, named, named_at_most};
use crate::audit::{AuditStatus, SandboxAuditEntry};
use crate::catalog::MutationClass;
use crate::confine::path::shown_path;
use crate::confine::{EntryKind, RelPath};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::conflicts::{ChangedFile, Conflict, TargetState};
use crate::sandbox::{RootedSnapshots, Sandbox};
use crate::snapshot::{SnapshotKind, Snapshotter, StoredSnapshot};
use std::collections::{HashMap, HashSet};

/// The snapshots of `snaps` (oldest first) taken after one of `action`'s, in the same
/// root, on its target or a path beneath or above it, by other actions not yet undone
/// (`undone`).
fn later_writers<'a>(
    snaps: &'a [(usize, StoredSnapshot)],
    action: &str,
    undone: impl Fn(&StoredSnapshot) -> bool,
) -> Vec<&'a (usize, StoredSnapshot)> {
    let overlaps = |a: &str, b: &str| {
        a == b
            || a.strip_prefix(b).is_some_and(|r| r.starts_with('/'))
            || b.strip_prefix(a).is_some_and(|r| r.starts_with('/'))
    };
    let is_mine = |s: &StoredSnapshot| s.meta.action_id == action && !undone(s);
    let Some(first) = snaps.iter().position(|(_, s)| is_mine(s)) else {
        return Vec::new();
    };
    let mine: Vec<_> = snaps[first..].iter().filter(|(_, s)| is_mine(s)).collect();
    snaps[first + 1..]
        .iter()
        .filter(|(i, s)| {
            s.meta.action_id != action
                && !undone(s)
                && mine.iter().any(|(mi, m)| {
                    mi == i && overlaps(&m.meta.original_path, &s.meta.original_path)
                })
        })
        .collect()
}

/// `snaps` without those of writes a prune covered (`pruned_up_to` of its root, in
/// `trail`): a prune makes its mark durable before it moves a workflow's folders aside,
/// so one stopped in between (killed, or the machine cut) leaves them in place. Its
/// decision stands as if it had finished: those writes are pruned, their snapshots left
/// unused for the next prune, and the workflow's later writes roll back as after a
/// prune that finished. Refusing the workflow instead would keep its later writes from
/// a rollback as a whole until that prune ran again and the later writes had aged too.
fn without_pruned(
    snaps: RootedSnapshots,
    trail: &[SandboxAuditEntry],
    pruned_up_to: impl Fn(usize) -> Option<u64>,
) -> RootedSnapshots {
    snaps
        .into_iter()
        .filter(|(i, s)| {
            let up_to = pruned_up_to(*i).unwrap_or(0);
            up_to == 0
                || !trail.iter().any(|e| {
                    e.status == AuditStatus::Success
                        && e.seq <= up_to
                        && e.action_id == s.meta.action_id
                        && e.execution_id == s.meta.execution_id
                })
        })
        .collect()
}

/// The refusal of a workflow whose snapshot folders hold `untrusted` entries: the
/// first, and how many more, which would otherwise be met one refusal at a time.
pub(super) fn untrusted_refusal(
    workflow_id: &str,
    untrusted: &[crate::Refusal],
) -> Option<crate::Refusal> {
    match untrusted {
        [] => None,
        [one] => Some(one.clone()),
        [first, more @ ..] => Some(crate::Refusal::new(
            first.reason_code,
            format!(
                "{}; {} not trusted either: inspect {} in each root",
                first.reason,
                if more.len() == 1 {
                    "1 more of the workflow's snapshot entries is".to_owned()
                } else {
                    format!("{} more of the workflow's snapshot entries are", more.len())
                },
                shown_path(&format!(
                    "{}/{workflow_id}/",
                    crate::confine::path::ROLLBACK_DIR
                ))
            ),
        )),
    }
}

/// What a workflow's trail lines say of its writes, for choosing what to roll back.
pub(super) struct TrailWrites<'t> {
    /// Writes that must have a snapshot here: by action, its latest write's `seq` and
    /// target.
    pub(super) written: HashMap<&'t str, (u64, &'t str)>,
    /// Writes into a root this process is not configured with.
    pub(super) elsewhere: Vec<&'t SandboxAuditEntry>,
    /// Writes whose snapshots a prune removed: they need none.
    pub(super) pruned: Vec<&'t SandboxAuditEntry>,
    /// By action, the `seq` of its latest rollback line.
    pub(super) undone: HashMap<&'t str, u64>,
}

impl<'t> TrailWrites<'t> {
    /// From `trail` (a workflow's lines, in order), the root each target lies in
    /// (`root_of`), and how far in the trail prunes went through each root.
    pub(super) fn of(
        trail: &'t [SandboxAuditEntry],
        root_of: impl Fn(&SandboxAuditEntry) -> Option<usize>,
        pruned_up_to: impl Fn(usize) -> Option<u64>,
    ) -> Self {
        let mut w = Self {
            written: HashMap::new(),
            elsewhere: Vec::new(),
            pruned: Vec::new(),
            undone: HashMap::new(),
        };
        for e in trail {
            match e.status {
                AuditStatus::Success
                    if e.rollback_available
                        && e.mutation_class != Some(MutationClass::Rollback) =>
                {
                    match root_of(e) {
                        None => w.elsewhere.push(e),
                        Some(i) if pruned_up_to(i).is_none_or(|up_to| e.seq > up_to) => {
                            w.written.insert(&e.action_id, (e.seq, &e.target_path));
                        }
                        Some(_) => w.pruned.push(e),
                    }
                }
                AuditStatus::RolledBack => {
                    w.undone.insert(&e.action_id, e.seq);
                }
                _ => {}
            }
        }
        w
    }

    /// Undone after its write; or, never recorded as written (an action that failed,
    /// its own change undone), undone at all: its restore's mark may be missing (the
    /// root was full), and a later rollback would otherwise "restore" it over whatever
    /// stands there now.
    fn is_undone(&self, action: &str) -> bool {
        match self.written.get(action) {
            Some((w, _)) => self.undone.get(action).is_some_and(|u| u > w),
            None => self.undone.contains_key(action),
        }
    }

    /// `snaps`, each marked restored when the trail says it was undone, even if its
    /// restore's mark was removed.
    fn marked_undone(&self, snaps: RootedSnapshots) -> RootedSnapshots {
        snaps
            .into_iter()
            .map(|(i, mut s)| {
                s.restored |= self.is_undone(&s.meta.action_id);
                (i, s)
            })
            .collect()
    }

    /// The writes asked for whose snapshots a prune removed and that are still in
    /// place, as said to people: "action (target)".
    fn pruned_in_place(&self, opts: &RollbackOptions) -> Vec<String> {
        self.pruned
            .iter()
            .filter(|e| self.in_place(e, opts))
            .map(|e| {
                format!(
                    "{} ({})",
                    shown_path(&e.action_id),
                    shown_path(&e.target_path)
                )
            })
            .collect()
    }

    /// Of the writes kept apart (pruned, or into another root), whether `e` is one asked
    /// for and not undone since.
    fn in_place(&self, e: &SandboxAuditEntry, opts: &RollbackOptions) -> bool {
        opts.takes(&e.action_id)
            && self
                .undone
                .get(e.action_id.as_str())
                .is_none_or(|u| *u < e.seq)
    }

    /// The writes asked for that need a snapshot and have none in `snaps`, as said to
    /// people, sorted.
    fn missing(&self, snaps: &RootedSnapshots, opts: &RollbackOptions) -> Vec<String> {
        let have: HashSet<&str> = snaps
            .iter()
            .map(|(_, s)| s.meta.action_id.as_str())
            .collect();
        let mut missing: Vec<String> = self
            .written
            .iter()
            .filter(|(a, _)| opts.takes(a))
            .filter(|(a, _)| !have.contains(**a) && !self.is_undone(a))
            .map(|(a, (_, path))| format!("{} ({path})", shown_path(a)))
            .collect();
        missing.sort();
        missing
    }

    /// The snapshots of `snaps` (oldest first, each marked restored as its mark or the
    /// trail says) whose change an older action of the workflow on the same file took
    /// with it when a rollback restored that one after this one's write: passed over as
    /// spent (its backup damaged or gone) by a forced rollback that then could not
    /// record it undone beneath (it died first, or the trail refused the older
    /// restores' lines). Restoring its backup now would bring the older action's bytes
    /// back over that restore. A write made after the older restore (a later run of the
    /// workflow) stands. By snapshot id, with what the oldest such restore gave the
    /// file (what its action found), which the file holds unless changed since.
    pub(super) fn undone_beneath(&self, snaps: &RootedSnapshots) -> HashMap<String, TargetState> {
        let mut beneath = HashMap::new();
        for (at, (i, s)) in snaps.iter().enumerate() {
            let Some((written, _)) = self.written.get(s.meta.action_id.as_str()) else {
                continue;
            };
            if s.restored || self.is_undone(&s.meta.action_id) {
                continue;
            }
            let older_restore = snaps[..at].iter().find(|(oi, o)| {
                oi == i
                    && o.restored
                    && o.meta.original_path == s.meta.original_path
                    && o.meta.action_id != s.meta.action_id
                    && self
                        .undone
                        .get(o.meta.action_id.as_str())
                        .is_some_and(|u| u > written)
            });
            if let Some((_, o)) = older_restore {
                beneath.insert(s.meta.snapshot_id.clone(), TargetState::found_by(&o.meta));
            }
        }
        beneath
    }
}

/// What a rollback of a workflow (or one of its actions) takes in, judged by
/// [`Sandbox::rollback_selection`].
pub(super) struct Selection {
    /// Its snapshots, oldest first, each marked restored when its mark or the trail
    /// says so.
    pub(super) chosen: RootedSnapshots,
    /// The ids of the snapshots of `chosen` undone beneath an older restore
    /// ([`TrailWrites::undone_beneath`]), with what that restore gave their file:
    /// recorded so, never restored.
    pub(super) beneath: HashMap<String, TargetState>,
    /// The writes whose snapshots a prune removed, as said to people.
    pub(super) pruned: Vec<String>,
}

impl Sandbox {
    /// Every snapshot of a workflow across roots, oldest first, with its root. A record
    /// that cannot be trusted refuses the whole workflow: a rollback that skipped it would
    /// report success with a file left unrestored.
    pub(crate) fn workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<Vec<(usize, StoredSnapshot)>> {
        let (all, untrusted) = self.workflow_snapshots_and_untrusted(workflow_id)?;
        match untrusted_refusal(workflow_id, &untrusted) {
            None => Ok(all),
            Some(r) => Err(r),
        }
    }

    /// [`Sandbox::workflow_snapshots`] for recovery and pruning, which act on what they
    /// can trust and leave the rest alone (logged) rather than giving up on the whole
    /// workflow. Also returns how many folders were left alone. An error means nothing
    /// could be read at all (a root's `.rollback` unreadable, say).
    pub(crate) fn trusted_workflow_snapshots(
        &self,
        workflow_id: &str,
    ) -> Verdict<(RootedSnapshots, Vec<crate::Refusal>)> {
        let (all, untrusted) = self
            .workflow_snapshots_and_untrusted(workflow_id)
            .inspect_err(|r| {
                tracing::error!(workflow = %workflow_id, reason = %r, "the workflow's snapshots could not be read");
            })?;
        for r in &untrusted {
            tracing::error!(workflow = %workflow_id, reason = %r, "an untrusted snapshot folder was left alone");
        }
        Ok((all, untrusted))
    }

    pub(super) fn workflow_snapshots_and_untrusted(
        &self,
        workflow_id: &str,
    ) -> Verdict<(RootedSnapshots, Vec<crate::Refusal>)> {
        let mut all = Vec::new();
        let mut untrusted = Vec::new();
        for (i, root) in self.roots.iter().enumerate() {
            let (snaps, bad) = Snapshotter::load_workflow(root, &self.seal, workflow_id)?;
            all.extend(snaps.into_iter().map(|s| (i, s)));
            untrusted.extend(bad);
        }
        all.sort_by(|a, b| a.1.meta.snapshot_id.cmp(&b.1.meta.snapshot_id));
        self.in_trail_order(workflow_id, &mut all)?;
        Ok((all, untrusted))
    }

    /// Orders the snapshots run by run as the trail recorded the runs (by each run's
    /// first recorded write), each run's in the order it took them: ids follow the clock
    /// of the process that made them, and a clock set back between two runs would
    /// otherwise have the later run's writes restored first. A run's own ids never go
    /// back (see [`crate::ids`]). Runs with no write on the trail (undone at once, or dead
    /// and not yet recovered, which no later run of the workflow can follow) come last.
    /// Refused when the trail cannot be read: in id order they could be restored wrongly.
    fn in_trail_order(&self, workflow_id: &str, all: &mut RootedSnapshots) -> Verdict<()> {
        let entries = self
            .failpoints
            .check("trail_order")
            .and_then(|()| self.audit.by_workflow(workflow_id))
            .map_err(|e| crate::error::log_refusal("read the audit trail", &e))?;
        let mut first: HashMap<&str, u64> = HashMap::new();
        for e in &entries {
            if e.status == AuditStatus::Success {
                let seq = first.entry(e.execution_id.as_str()).or_insert(e.seq);
                *seq = (*seq).min(e.seq);
            }
        }
        all.sort_by_cached_key(|(_, s)| {
            (
                first
                    .get(s.meta.execution_id.as_str())
                    .copied()
                    .unwrap_or(u64::MAX),
                s.meta.snapshot_id.clone(),
            )
        });
        Ok(())
    }

    /// What force cannot override in `chosen`'s targets, as one refusal with the code of
    /// the first: a directory someone put where a file was, or a file where a directory
    /// was made (not the workflow's to remove), a file with another hard link, a FIFO or
    /// device, a symbolic link or another root's mount on the way.
    fn beyond_force(&self, chosen: &[(usize, StoredSnapshot)]) -> Option<Refusal> {
        let mut found: Vec<(ReasonCode, String)> = Vec::new();
        for (i, s) in chosen {
            let (root, rel) = (&self.roots[*i], s.meta.target());
            let path = shown_path(&s.meta.original_path);
            let dir_action = s.meta.is_directory_action();
            let why = match root.entry(&rel) {
                Ok((EntryKind::Directory, _)) if !dir_action => Some((
                    ReasonCode::NotRegularFile,
                    format!("{path} is now a directory where the workflow wrote a file"),
                )),
                Ok((EntryKind::File { .. }, _)) if dir_action => Some((
                    ReasonCode::Conflict,
                    format!("{path} is now a file where the workflow made or found a directory"),
                )),
                Ok((EntryKind::File { links, .. }, _)) if links > 1 => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                Ok((EntryKind::Special, _)) => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                // A link is not the workflow's to remove, wherever it stands: in place of
                // a file it replaced as much as of one it made (force overwrites bytes
                // someone changed, not a different kind of thing someone put there).
                Ok((EntryKind::Symlink, _)) => {
                    root.inspect(&rel).err().map(|r| (r.reason_code, r.reason))
                }
                Err(r)
                    if matches!(
                        r.reason_code,
                        ReasonCode::SymlinkEscape
                            | ReasonCode::SymlinkRefused
                            | ReasonCode::ReservedPath
                    ) =>
                {
                    Some((r.reason_code, r.reason))
                }
                // A folder on the way is now a file or a FIFO: nothing beneath it can be
                // restored, and it is not the workflow's to remove.
                Err(r) if r.reason_code == ReasonCode::NotFound => {
                    Some((ReasonCode::Conflict, r.reason))
                }
                _ => None,
            };
            if let Some(w) = why
                && !found.iter().any(|(_, r)| *r == w.1)
            {
                found.push(w);
            }
        }
        let code = found.first()?.0;
        let linked = found.iter().any(|(c, _)| *c == ReasonCode::HardlinkRefused);
        let reasons: Vec<String> = found.into_iter().map(|(_, r)| r).collect();
        Some(Refusal::new(
            code,
            format!(
                "{}; a rollback never removes what the workflow did not make, nor writes to a file with other links, a special file or through a link, even with force: move it away{}, then roll back",
                reasons.join("; "),
                if linked {
                    " (or remove the extra link)"
                } else {
                    ""
                }
            ),
        ))
    }

    /// What in `chosen` this process may not change, as one refusal: a folder holding a
    /// target, or holding a directory an action made, without write permission for it
    /// (or read-only), and a target or such folder marked immutable or append-only
    /// (`chattr +i`, `+a`). Met at its restore, the rollback stopped half way.
    fn unwritable_folders(&self, chosen: &[(usize, StoredSnapshot)]) -> Option<Refusal> {
        let mut found: Vec<String> = Vec::new();
        let mut note = |why: String| {
            if !found.contains(&why) {
                found.push(why);
            }
        };
        for (i, s) in chosen {
            let root = &self.roots[*i];
            // The target's folder, and the folders holding each directory it made that
            // the rollback removes: one holding more than the way to the target is left.
            let made = s
                .meta
                .created_dirs
                .iter()
                .filter(|d| **d != s.meta.original_path)
                .map(|d| RelPath::from_recorded(d))
                .filter(|d| root.count_entries(d, 2).is_ok_and(|n| n <= 1));
            // A directory action's target changes only when it made it and the folder
            // is empty again (one it found, or holding others' files, is left in place).
            let target_changes = !s.meta.is_directory_action()
                || (!s.meta.existed
                    && root.is_empty_dir(&s.meta.target()).is_ok_and(|empty| empty));
            let target = target_changes.then(|| s.meta.target());
            for rel in target.into_iter().chain(made) {
                let Ok((parent, _)) = root.open_parent(&rel, false, false) else {
                    continue;
                };
                // A file the action made that is gone already: nothing to remove.
                if s.meta.kind == SnapshotKind::Missing
                    && !s.meta.is_directory_action()
                    && rel == s.meta.target()
                    && parent
                        .symlink_metadata(rel.file_name())
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                {
                    continue;
                }
                if let Some(why) = crate::confine::root::change_refused(
                    &parent,
                    rel.file_name(),
                    &shown_path(&rel.as_string()),
                    self.fsync_each(),
                ) {
                    note(why);
                }
            }
        }
        if found.is_empty() {
            return None;
        }
        // Something someone changed about the tree since the workflow wrote (a permission,
        // a mark, a mount): a conflict to put right, not a failure of the disk.
        Some(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{}; nothing was restored, and force would not help: put that right (the permission, the mount, the mark — chattr — or the owner), then roll back",
                found.join("; ")
            ),
        ))
    }

    /// What refuses the rollback of `chosen` before any restore, whatever the conflicts
    /// (the first of: no room for its records, a root moved away, a change no force
    /// overrides, a folder it cannot write, a damaged backup), with how many backups it
    /// found damaged; the preview and the rollback ask the same.
    pub(super) fn standing_refusal(
        &self,
        chosen: &[(usize, StoredSnapshot)],
        forced: bool,
    ) -> Option<(Refusal, usize)> {
        self.record_room(&self.root_names(chosen.iter().map(|(i, _)| *i)), true)
            .err()
            .or_else(|| {
                chosen
                    .iter()
                    .find_map(|(i, _)| self.root_in_place(*i).err())
            })
            .or_else(|| self.beyond_force(chosen))
            .or_else(|| self.unwritable_folders(chosen))
            .map(|r| (r, 0))
            .or_else(|| self.damaged_backups(chosen, forced))
    }

    /// A backup of `chosen` (oldest first) that cannot give its file back (gone,
    /// unreadable, or not the bytes its seal names), as one refusal: met at its restore,
    /// the rollback stopped half way, after restoring the newer actions. An unforced
    /// rollback needs every restore of a file in turn (each goes ahead only over what its
    /// action left), so every backup is looked at. A forced one overwrites, so only the
    /// restore that leaves each file as it ends (its oldest chosen action's) matters
    /// (`forced`): a newer one's damage must not block the rollback that gives the file
    /// back.
    /// Also returns how many backups it found damaged (`checksum_mismatch`), for the
    /// metric a rollback asked for counts.
    fn damaged_backups(
        &self,
        chosen: &[(usize, StoredSnapshot)],
        forced: bool,
    ) -> Option<(Refusal, usize)> {
        // Whether each is the restore that leaves its file as it ends.
        let mut seen = HashSet::new();
        let bad: Vec<(Refusal, bool)> = chosen
            .iter()
            .map(|(i, s)| (i, s, seen.insert((*i, s.meta.original_path.as_str()))))
            .filter(|(_, s, last)| (!forced || *last) && s.meta.kind == SnapshotKind::File)
            .filter_map(|(i, s, last)| {
                match Snapshotter::read_checked_backup(&self.roots[*i], &s.meta) {
                    Err(r) | Ok(Err(r)) => Some((r, last)),
                    Ok(Ok(_)) => None,
                }
            })
            .collect();
        // A backup another user took is whole, and one something else stands in place
        // of may only be moved aside: given back, they restore (their refusals say so);
        // only one damaged or gone calls for other means.
        let put_back = |r: &Refusal| {
            r.reason_code == ReasonCode::ReservedPath
                || r.reason.contains(crate::snapshot::NOT_ITS_BACKUP)
        };
        let damaged: Vec<&(Refusal, bool)> = bad.iter().filter(|(r, _)| !put_back(r)).collect();
        let code = damaged
            .first()
            .copied()
            .unwrap_or(bad.first()?)
            .0
            .reason_code;
        let reasons: Vec<&str> = bad.iter().map(|(r, _)| r.reason.as_str()).collect();
        let what_then = if damaged.is_empty() {
            "roll back again once the runtime's own backup is back in its place, its only link (the operator gives back one another user took; one moved aside is put back; a second link to it is removed)"
        } else if damaged.iter().any(|(_, last)| *last) {
            "a damaged or missing backup cannot give its file back, even with force (that file's earlier bytes must be restored by other means; the workflow's other files can be rolled back one action at a time)"
        } else {
            // Only newer writes' backups: an older write's restore gives the file back.
            "roll back with force: each such file is given back by its oldest write's restore (the damaged step is then recorded undone beneath it)"
        };
        let mismatched = bad
            .iter()
            .filter(|(r, _)| r.reason_code == ReasonCode::ChecksumMismatch)
            .count();
        Some((
            Refusal::new(
                code,
                format!("{}; nothing was restored: {what_then}", reasons.join("; ")),
            ),
            mismatched,
        ))
    }

    /// The snapshots a rollback of the workflow (or of `opts.action_id`) would restore,
    /// each marked restored when its mark or the trail says so, or why the rollback is
    /// refused before restoring anything: judged from the audit trail, the prune record
    /// and the snapshots. The rollback and [`Sandbox::rollback_info`] share it, so that
    /// what `GET /agentic/rollback/{id}` says is what `POST` does.
    pub(super) fn rollback_selection(
        &self,
        workflow_id: &str,
        snaps: RootedSnapshots,
        opts: &RollbackOptions,
    ) -> Result<Selection, RollbackRefusal> {
        // The audit trail lives in the state directory, out of reach of whoever can
        // write inside a root: it says which writes happened and which were undone, so a
        // snapshot folder or restore mark removed from `.rollback/` cannot turn into a
        // rollback that reports success with a file left as it was.
        let unread = |what: &str, e: std::io::Error| -> RollbackRefusal {
            let r = crate::error::log_refusal(&format!("read {what}"), &e);
            (r.reason_code, r.reason, Vec::new())
        };
        let trail = self
            .audit
            .by_workflow(workflow_id)
            .map_err(|e| unread("the audit trail", e))?;
        // What is restored, and what counts as undone already, rests on these lines: one
        // edited since it was written (a write made to read as rolled back) is not acted
        // on.
        if let Some(e) = trail.iter().find(|e| !e.hash_holds()) {
            return Err((
                ReasonCode::ChecksumMismatch,
                format!(
                    "entry {} of the audit trail, a line of workflow {workflow_id}, does not match its hash: it was edited since it was written, and a rollback rests on what the trail says, so nothing is restored; verify the trail (audit verify) and put back a good copy of it",
                    e.seq
                ),
                Vec::new(),
            ));
        }
        // A damaged record of prunes matters only where snapshots are missing: it may
        // be what removed them.
        let (pruned_marks, damaged_marks) = match self.state.prune_mark(workflow_id) {
            Ok(marks) => (marks.unwrap_or_default(), None),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => (Vec::new(), Some(e)),
            Err(e) => return Err(unread("the workflow's prune record", e)),
        };
        let pruned_up_to = |i: usize| self.pruned_up_to(&pruned_marks, i);
        let writes = TrailWrites::of(&trail, |e| self.root_of(&e.target_path), pruned_up_to);
        // Undone before a prune took their snapshots: rolled back, not lost.
        let undone_then_pruned = writes
            .pruned
            .iter()
            .any(|e| opts.takes(&e.action_id) && !writes.in_place(e, opts));
        let pruned = writes.pruned_in_place(opts);
        // Writes into a root this process is not configured with cannot be restored from
        // here: rolling back the rest and saying "rolled back" would leave them unsaid.
        let elsewhere: Vec<&SandboxAuditEntry> = writes
            .elsewhere
            .iter()
            .copied()
            .filter(|e| writes.in_place(e, opts))
            .collect();
        if !elsewhere.is_empty() {
            return Err(self.written_elsewhere(workflow_id, &elsewhere, opts.action_id.is_some()));
        }
        let snaps = without_pruned(snaps, &trail, pruned_up_to);
        let missing = writes.missing(&snaps, opts);
        if let (false, Some(e)) = (missing.is_empty(), damaged_marks) {
            return Err(unread("the workflow's prune record", e));
        }
        if !missing.is_empty() {
            // A root moved, removed or replaced since start: its path no longer leads to
            // the folder this process holds, which is what to put right (missing
            // snapshots would send the operator looking for lost files).
            let moved = writes
                .written
                .values()
                .filter_map(|(_, target)| self.root_of(target))
                .find_map(|i| self.root_in_place(i).err());
            if let Some(r) = moved {
                return Err((r.reason_code, r.reason, Vec::new()));
            }
            return Err(snapshots_missing(workflow_id, &missing));
        }
        // One action undone under a later action of the workflow on the same file (or a
        // path beneath or above it) would leave that later action recorded as in place
        // while its change is gone, and its own rollback would then bring back this
        // one's bytes: the later ones go first, force or not.
        if let Some(a) = opts.action_id.as_deref() {
            let later = later_writers(&snaps, a, |s| {
                s.restored || writes.is_undone(&s.meta.action_id)
            });
            if !later.is_empty() {
                return Err(self.later_actions_refusal(workflow_id, a, &snaps, &later));
            }
        }
        let snaps = writes.marked_undone(snaps);
        let beneath = writes.undone_beneath(&snaps);
        let chosen = snaps
            .into_iter()
            .filter(|(_, s)| opts.takes(&s.meta.action_id))
            .collect::<RootedSnapshots>();
        if let Some(refusal) = self.nothing_left(
            workflow_id,
            opts.action_id.as_deref(),
            &chosen,
            &pruned,
            undone_then_pruned,
        ) {
            return Err(refusal);
        }
        Ok(Selection {
            chosen,
            beneath,
            pruned,
        })
    }

    /// The refusal of a workflow's rollback (of one action's, when `one`) whose writes
    /// `elsewhere` went into a root this process lacks.
    fn written_elsewhere(
        &self,
        workflow_id: &str,
        elsewhere: &[&SandboxAuditEntry],
        one: bool,
    ) -> RollbackRefusal {
        let mut names: Vec<String> = elsewhere.iter().map(|e| shown_path(&e.action_id)).collect();
        names.sort_unstable();
        names.dedup();
        let target = elsewhere.first().map_or("", |e| e.target_path.as_str());
        let (root, advice) = self.absent_root(target, "rollback");
        let (what, instead) = match one {
            true => ("it cannot be rolled back by this process", ""),
            false => (
                "the workflow cannot be rolled back as a whole",
                ", or roll back the other actions one at a time",
            ),
        };
        (
            ReasonCode::OutsideSandbox,
            format!(
                "{} of workflow {} wrote into {root}, so {what} (nothing is restored); {advice}{instead}",
                named(&names),
                shown_path(workflow_id)
            ),
            Vec::new(),
        )
    }

    /// Why a rollback of `action` (or the whole workflow) finds nothing left to roll
    /// back in `chosen`, with the writes `pruned` and whether some were
    /// `undone_then_pruned`; `None` when something is left.
    fn nothing_left(
        &self,
        workflow_id: &str,
        action: Option<&str>,
        chosen: &RootedSnapshots,
        pruned: &[String],
        undone_then_pruned: bool,
    ) -> Option<RollbackRefusal> {
        let what = || match action {
            Some(a) => format!(
                "action {} of workflow {}",
                shown_path(a),
                shown_path(workflow_id)
            ),
            None => format!("workflow {}", shown_path(workflow_id)),
        };
        if chosen.is_empty() && pruned.is_empty() && undone_then_pruned {
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "{} was already rolled back, and its snapshots have since been pruned; nothing is left to roll back",
                    what()
                ),
                Vec::new(),
            ));
        }
        if chosen.is_empty() {
            // Say why, when the trail knows: a prune removed them by design.
            let why = if pruned.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} write(s) had their snapshots pruned and cannot be rolled back; those files stay as they are: {})",
                    pruned.len(),
                    named(pruned)
                )
            };
            let known = match self.ran_elsewhere(workflow_id, action) {
                elsewhere if elsewhere.is_empty() && pruned.is_empty() => {
                    self.never_written(workflow_id, action, &what())
                }
                elsewhere => elsewhere,
            };
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "there are no snapshots for {}{why}; nothing can be rolled back{known}",
                    what(),
                ),
                Vec::new(),
            ));
        }
        if chosen.iter().all(|(_, s)| s.restored) {
            // Not all of it, when a prune took some writes' snapshots first.
            let pruned = if pruned.is_empty() {
                String::new()
            } else {
                format!("; {}", pruned_left(pruned))
            };
            return Some((
                ReasonCode::NoRollbackData,
                format!(
                    "{} was already rolled back (by an earlier rollback, at once when its action failed, or by the recovery of an interrupted run){pruned}; nothing is left to roll back",
                    what()
                ),
                Vec::new(),
            ));
        }
        None
    }

    /// The refusal of a rollback of action `a` of `workflow_id` (its snapshots among
    /// `snaps`) under the `later` actions of the workflow that changed what it wrote (see
    /// [`later_writers`]). Each conflict is one of `a`'s files as a later action left it:
    /// what `a` left there (when it wrote that very path), what is there now, and the
    /// later write that changed it, to be rolled back first.
    fn later_actions_refusal(
        &self,
        workflow_id: &str,
        a: &str,
        snaps: &[(usize, StoredSnapshot)],
        later: &[&(usize, StoredSnapshot)],
    ) -> RollbackRefusal {
        let names: Vec<String> = later
            .iter()
            .map(|(_, s)| {
                format!(
                    "{} ({} {})",
                    shown_path(&s.meta.action_id),
                    s.meta.intent,
                    shown_path(&s.meta.original_path)
                )
            })
            .collect();
        let conflicts = later
            .iter()
            .map(|(i, s)| {
                let rel = s.meta.target();
                let own = snaps.iter().find(|(j, m)| {
                    j == i && m.meta.action_id == a && m.meta.original_path == s.meta.original_path
                });
                Conflict {
                    action_id: a.to_owned(),
                    path: self.abs_path(*i, &rel),
                    expected_checksum: own
                        .and_then(|(_, m)| self.left_by(workflow_id, &m.meta))
                        .and_then(|l| l.state.checksum()),
                    current_checksum: self.target_state(*i, &rel).checksum(),
                    found_by_action: None,
                    changed_by: Some(crate::sandbox::conflicts::ChangedBy {
                        action: format!("{workflow_id}/{}", s.meta.action_id),
                        rollback: false,
                    }),
                    claimed_by: Vec::new(),
                    folder_replaced: None,
                    made_dir_replaced: false,
                }
            })
            .collect();
        (
            ReasonCode::Conflict,
            format!(
                "later actions of workflow {} changed what action {} wrote: {}; roll those back first (newest first), or roll back the whole workflow",
                shown_path(workflow_id),
                shown_path(a),
                named(&names)
            ),
            conflicts,
        )
    }

    /// For an action the trail records no write of in `workflow_id`: the workflows
    /// whose trail records one, as words to add to the refusal (empty when none does).
    /// Asked of the writes only: a refused rollback of the action is on the trail too.
    fn ran_elsewhere(&self, workflow_id: &str, action_id: Option<&str>) -> String {
        let Some(a) = action_id.filter(|a| !self.audit.ran_action(workflow_id, a).unwrap_or(true))
        else {
            return String::new();
        };
        let found = self.audit.workflows_that_ran(a).unwrap_or_default();
        // A workflow a prune took the action's snapshot from cannot roll it back: named
        // apart, not as a way to do it. One whose snapshot is missing otherwise (removed
        // by hand, in a root not configured now) is named as usual: its own rollback
        // says what to do.
        let pruned = |w: &str| {
            !self
                .roots
                .iter()
                .any(|r| crate::snapshot::Snapshotter::place(r, w, a).unwrap_or(true))
                && self.write_pruned(w, a)
        };
        let (gone, kept): (Vec<&String>, Vec<&String>) = found.iter().partition(|w| pruned(w));
        // A few, and how many more: an id as common as `a1` may be every workflow's,
        // and which one was meant is the caller's to know.
        let workflows = |ws: &[&String]| {
            let plural = if ws.len() == 1 { "" } else { "s" };
            let shown = named_at_most(&ws.iter().map(|w| shown_path(w)).collect::<Vec<_>>(), 3);
            format!("workflow{plural} {shown}")
        };
        if !kept.is_empty() {
            format!(
                "; the audit trail records a write of action {} not rolled back in {}: name its workflow to roll it back",
                shown_path(a),
                workflows(&kept)
            )
        } else if !gone.is_empty() {
            format!(
                "; the audit trail records a write of action {} not rolled back in {}, whose snapshot of it is gone (pruned): that write can no longer be rolled back",
                shown_path(a),
                workflows(&gone)
            )
        } else {
            String::new()
        }
    }

    /// How far in the trail the prunes `marks` (root as configured, sequence number)
    /// went through this process's root `i`, if any did.
    fn pruned_up_to(&self, marks: &[(String, u64)], i: usize) -> Option<u64> {
        marks
            .iter()
            .filter(|(r, _)| self.roots[i].is_named_by(r))
            .map(|(_, seq)| *seq)
            .max()
    }

    /// Whether a prune of `workflow_id` took the snapshot of its write by `action`
    /// (not rolled back since), as its rollback would judge it.
    fn write_pruned(&self, workflow_id: &str, action: &str) -> bool {
        let (Ok(trail), Ok(Some(marks))) = (
            self.audit.by_workflow(workflow_id),
            self.state.prune_mark(workflow_id),
        ) else {
            return false;
        };
        let writes = TrailWrites::of(
            &trail,
            |e| self.root_of(&e.target_path),
            |i| self.pruned_up_to(&marks, i),
        );
        writes.pruned.iter().any(|e| e.action_id == action)
    }

    /// For a workflow (or action) with no snapshot, nothing pruned and no write in
    /// another workflow: what the trail says of it, as words to add to the refusal:
    /// nothing at all (an id mistyped, or a workflow of another state directory), only
    /// simulated runs (writing off or dry-run on), or actions refused or failed; nothing
    /// when it records a write (its snapshots went otherwise).
    fn never_written(&self, workflow_id: &str, action_id: Option<&str>, what: &str) -> String {
        let Ok(lines) = self.audit.by_workflow(workflow_id) else {
            return String::new();
        };
        let its: Vec<AuditStatus> = lines
            .iter()
            .filter(|e| {
                e.mutation_class != Some(MutationClass::Rollback)
                    && action_id.is_none_or(|a| a == e.action_id)
            })
            .map(|e| e.status)
            .collect();
        if its.contains(&AuditStatus::Success) {
            String::new()
        } else if its.is_empty() {
            format!(
                "; the audit trail records nothing of {what}: check the ids (each write's result, and its line on the trail, name its workflow and action), unless a run of it stopped before its first write (a start's notice then says it recovered that run)"
            )
        } else if its.iter().all(|s| *s == AuditStatus::Simulated) {
            format!(
                "; the audit trail records {what} only as simulated (the write executor was off or dry-run on), so nothing was written: run the plan again with writing on and dry-run off"
            )
        } else {
            format!(
                "; the audit trail records no write of {what}: its actions were refused, failed or only simulated (its lines on the trail say which and why)"
            )
        }
    }
}

/// Why an unforced rollback is refused for `conflicts`, with what to do: the advice
/// depends on whose change each is, since force would throw some of them away.
pub(super) fn conflicts_said(conflicts: &[Conflict]) -> String {
    let (claimed, changed): (Vec<&Conflict>, Vec<&Conflict>) =
        conflicts.iter().partition(|c| !c.claimed_by.is_empty());
    let mut why = Vec::new();
    if !changed.is_empty() {
        let files = ChangedFile::of(&changed);
        let entries: Vec<String> = files.iter().map(ChangedFile::said).collect();
        // Another workflow's write named is undone by its own rollback, which gives
        // this one back what it left; force would throw that write away. Another
        // workflow's rollback named has taken this workflow's write with it.
        let names = |rollback: bool| {
            files
                .iter()
                .any(|f| f.by.as_ref().is_some_and(|b| b.rollback == rollback))
        };
        let mut advice = String::new();
        // The change between two of its writes is named once the later of the
        // two is rolled back alone: the workflow's refusal then says whose it is.
        if files.iter().any(|f| !f.between.is_empty()) {
            advice.push_str("where a change came between two of the workflow's writes, roll back the later of them alone first (action_id), and this refusal then names that change when the trail records it; ");
        }
        if names(false) {
            advice.push_str("roll back the writes named first (an action at a time, newest first, where workflows wrote in turn), or ");
        }
        advice.push_str("roll back with force to overwrite them");
        // Unreadable: a link, a special file, a file with another link (or one closed
        // to this process), which force never writes over.
        if changed
            .iter()
            .any(|c| c.current_checksum.as_deref() == Some("unreadable"))
        {
            advice.push_str(" (but what reads as unreadable, a link, a special file or a file with another link, force never overwrites: move it away first)");
        }
        if names(true) {
            advice.push_str(" (where a rollback is named, nothing of this workflow's write is left there: force would put back what this workflow found, which that rollback had undone)");
        }
        why.push(format!(
            "these files or directories changed after the workflow wrote them: {}; {advice} (a directory that holds what is not the workflow's is left in place even then)",
            named(&entries)
        ));
        // Not where the trail names a rollback that took the workflow's write with it
        // (its folder, emptied, went too, and another may have been made since).
        let replaced = |made: bool| {
            let mut dirs: Vec<String> = changed
                .iter()
                .filter(|c| !c.changed_by.as_ref().is_some_and(|b| b.rollback))
                .filter(|c| c.made_dir_replaced == made)
                .filter_map(|c| c.folder_replaced.as_deref().map(shown_path))
                .collect();
            dirs.sort();
            dirs.dedup();
            dirs
        };
        let swapped = replaced(false);
        let made = replaced(true);
        if !made.is_empty() {
            why.push(format!(
                "the workflow made {}, and what stands there now is another directory (the one made was moved away, where what the workflow put in it may live on, or removed, and another put in its place): if it was moved, put it back, then roll back; if removed, roll back with force, which leaves what stands there now as it is",
                made.join(", "),
            ));
        }
        if !swapped.is_empty() {
            // One folder, or several: the same words.
            let [dirs, are, one, that, it, its, was] = if swapped.len() == 1 {
                ["directory", "is", "the one", "that was", "it", "its", "was"]
            } else {
                [
                    "directories",
                    "are",
                    "the ones",
                    "those were",
                    "them",
                    "their",
                    "were",
                ]
            };
            why.push(format!(
                "the {dirs} {} holding some of them {are} not {one} the workflow wrote in ({that} moved away, where the workflow's files may live on, or removed, and another put in {its} place): if {it} {was} moved, put {it} back, then roll back; if removed, roll back with force, which leaves what stands there now as it is and writes back into it what the workflow replaced",
                swapped.join(", "),
            ));
        }
    }
    for c in claimed {
        why.push(format!(
            "the directory {}, or one the workflow made in it, is also the result of create_directory {}, which stands: roll that back first (once its workflow is pruned it never can be), or roll back with force to leave the directory in place",
            c.path,
            c.claimed_by.join(", ")
        ));
    }
    why.join("; ")
}

/// What a rollback leaves as it is of a workflow whose earlier writes were pruned.
pub(super) fn pruned_left(pruned: &[String]) -> String {
    format!(
        "{} earlier write(s) had their snapshots pruned and cannot be rolled back; those files stay as they are: {}",
        pruned.len(),
        named(pruned)
    )
}

/// The refusal of a workflow's rollback whose recorded writes have no snapshot
/// (`missing`: action and path, in words).
fn snapshots_missing(workflow_id: &str, missing: &[String]) -> RollbackRefusal {
    (
        ReasonCode::NoRollbackData,
        format!(
            "the snapshots of {} are missing from .rollback/{}/ in their root although the audit trail records their writes (removed, lost with unsynced data, or moved away for the moment: try again first): those files cannot be restored, so the workflow cannot be rolled back as a whole (nothing is restored); restore the folders, or roll back the other actions one at a time",
            named(missing),
            workflow_id
        ),
        Vec::new(),
    )
}
