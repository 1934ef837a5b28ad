//! Putting snapshots back ([`RollbackEngine`]): a file's bytes, its absence, the folders
//! an action made, each checked against the snapshot's SHA-256 afterwards.
//!
//! Rollback removes only the directories an action created, and only when they are empty.
//! One that still holds another's file is put on the left-dirs ledger (`left_dirs`),
//! removed by a later restore beneath it once it is empty. A `create_directory` that found
//! a directory makes its existence that action's result (a claim, which the trail's index
//! keeps): the directory stays until that one is rolled back too, and the rollback of the
//! `create_directory` that made it is a `conflict` naming it. Forced, it leaves the
//! directory in place, on the ledger, as it leaves one holding another's file; unforced, a
//! file put in it after the rollback's check is a `conflict`. A `create_directory` that
//! completes between a removal's claim check and its `rmdir` can still lose its directory:
//! the removal takes no lock of the directory's own path.

use crate::confine::path::shown_path;
use crate::confine::root::{DirId, FILE_MODE, Flush, Make, Put};
use crate::confine::{RelPath, SandboxRoot, TargetKind};
use crate::hash::sha256_hex;
use crate::reason::{ReasonCode, Refusal, Verdict};
use serde::Serialize;

use super::{
    LEFT_IN_PLACE_FOUND, LEFT_IN_PLACE_SHARED, LeftDir, MAX_SNAPSHOT_BYTES, ROLL_BACK_AGAIN,
    SnapshotKind, SnapshotMeta, Snapshotter,
};

/// How far a restore takes what it finds as it is ([`RollbackEngine::restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forced {
    /// Not at all.
    No,
    /// A forced rollback: a directory the action made that holds what is not the
    /// workflow's is left in place rather than refused.
    Yes,
    /// Recovery of a dead run: as forced, and a file whose directory goes just as it is
    /// to be removed is taken as gone with it (the undo must come to an end).
    Recovering,
}

/// What a restore found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreOutcome {
    /// Whether the target now matches the snapshot (same SHA-256, or absent as before).
    pub checksum_validated: bool,
    /// SHA-256 of the restored file, when one was restored.
    pub restored_checksum: Option<String>,
    /// Directories the action created that were not empty, so stayed.
    #[serde(skip)]
    pub left_dirs: Vec<LeftDir>,
    /// What became of a target no checksum describes (removed, or a directory left or
    /// made again), for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Restores snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RollbackEngine;

impl RollbackEngine {
    /// Removes the directories the action created to reach its target, deepest first,
    /// those that are empty; returns those that were not.
    ///
    /// `keep` names the directories someone else has come to rely on since (another
    /// workflow's `create_directory` found one and made it its result): those stay, and
    /// are returned as left like one that is not empty.
    pub fn remove_created_dirs(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        durable: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Verdict<Vec<LeftDir>> {
        let mut left_dirs = Vec::new();
        for d in meta.created_dirs.iter().rev() {
            if *d == meta.original_path {
                continue;
            }
            let dir = RelPath::from_recorded(d);
            // Beyond a symbolic link or special file someone put on the way, it is out of
            // the root's reach: nothing there can be removed or recorded through it (and
            // a write refused at that link made nothing beyond it).
            match root.dir_id(&dir) {
                Err(r)
                    if matches!(
                        r.reason_code,
                        ReasonCode::SymlinkEscape
                            | ReasonCode::SymlinkRefused
                            | ReasonCode::NotRegularFile
                    ) =>
                {
                    tracing::warn!(dir = %d, reason = %r.reason, "a directory its action may have made is out of reach");
                    continue;
                }
                Err(r) => return Err(r),
                Ok(_) => {}
            }
            // Whether someone relies on it is only asked of an empty one (it may read the
            // whole trail).
            let empty = root.is_empty_dir(&dir).is_ok_and(|empty| empty);
            // One that cannot be removed now (busy as a mount point, a failing disk) is
            // left on the ledger like one that holds others' files: a later rollback
            // removes it once it can, rather than it staying for good.
            let removed = empty
                && !keep(d)
                && root
                    .remove_empty_dir(&dir, None, durable)
                    .unwrap_or_else(|r| {
                        // The removal may have been made, its folder's sync failing after.
                        tracing::warn!(dir = %d, reason = %r.reason, "a directory its action made could not be removed now, or its removal made durable; if it stands, a later rollback beneath it or the next prune removes it");
                        false
                    });
            if !removed && let Some(id) = root.dir_id(&dir)? {
                left_dirs.push(LeftDir {
                    path: d.clone(),
                    id,
                });
            }
        }
        Ok(left_dirs)
    }

    /// The folder [`SnapshotMeta::folder`] records, when another directory stands at
    /// its path now (another program moved the first away, or removed it, and made one
    /// of the same name): what the action wrote there is not where the path leads.
    /// A folder missing, or one that cannot be looked at, is not named here.
    pub(crate) fn folder_replaced(root: &SandboxRoot, meta: &SnapshotMeta) -> Option<String> {
        // Nothing recorded (a target at the root's top): no look.
        if meta.folder.is_none() && meta.made.is_empty() {
            return None;
        }
        let (_, opened) = root.inspect_walked(&meta.target()).ok()?;
        Self::replaced_as_walked(root, meta, &opened)
    }

    /// [`Self::folder_replaced`], judged by `opened`: the folders a look at the target
    /// walked through, outermost first ([`SandboxRoot::inspect_walked`]), so that what
    /// the look found is judged with the folders it found it in (not ones swapped back
    /// a moment later).
    fn replaced_as_walked(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        opened: &[DirId],
    ) -> Option<String> {
        if !Self::same_root(root, meta) {
            return None;
        }
        let replaced = |was: Option<DirId>, rel: Option<RelPath>| {
            let (was, rel) = (was?, rel?);
            let now = opened.get(rel.components().len().checked_sub(1)?)?;
            was.replaced_by(now).then(|| rel.as_string())
        };
        // Then the folders the action made, when its mark says which they were (the
        // target itself, a directory the action made, is not among those walked).
        replaced(meta.folder, meta.folder_rel()).or_else(|| {
            meta.created_dirs
                .iter()
                .zip(&meta.made)
                .find_map(|(d, id)| replaced(Some(*id), Some(RelPath::from_recorded(d))))
        })
    }

    /// For an action that made its target directory (`create_directory`): that
    /// directory's path, when another stands there now (its mark records which it made).
    pub(crate) fn made_dir_replaced(root: &SandboxRoot, meta: &SnapshotMeta) -> Option<String> {
        let was = meta
            .created_dirs
            .iter()
            .zip(&meta.made)
            .find_map(|(d, id)| (*d == meta.original_path).then_some(*id))
            .filter(|_| Self::same_root(root, meta))?;
        let now = root.dir_id(&meta.target()).ok()??;
        was.replaced_by(&now).then(|| meta.original_path.clone())
    }

    /// Whether `root` is the directory the root was when `meta` was taken: one that is
    /// another directory now (the tree copied back from a backup, say) has every folder
    /// anew, so nothing can be told of one by its record.
    fn same_root(root: &SandboxRoot, meta: &SnapshotMeta) -> bool {
        meta.root_id
            .is_none_or(|was| was.same_as(&root.dir_id_of_root()))
    }

    /// The detail of a restore that left the target absent, as its action found it.
    pub(crate) fn absent_detail(meta: &SnapshotMeta) -> String {
        if meta.is_directory_action() {
            "removed: the action made it".to_owned()
        } else {
            "removed: it did not exist before the action".to_owned()
        }
    }

    /// Puts the original back: rewrites a file from its backup (atomically), or removes
    /// what the action created, then verifies by hashing.
    ///
    /// `changed` runs once the target is changed, before it is verified. From then on a
    /// verification that cannot be made for the runtime's own reasons (`changed` fails,
    /// or reading back fails on a full table of open files, a disk error or a
    /// permission) leaves the
    /// restore done but unverified (`checksum_validated: false`, the detail saying why),
    /// not failed: it must be recorded as what happened. A restored file that is no
    /// longer there to read back (another program moved it away, or put a link or a
    /// folder in its place at that instant) is a mismatch like different bytes: the
    /// snapshot's bytes are not what stands there, and the step is left for a rollback
    /// to do again.
    ///
    /// `put` says what the caller judged the target to be: a file ([`Put::Unchanged`]),
    /// which alone is then replaced or removed, nothing ([`Put::New`]), or anything
    /// (forced), so that a change another program makes after the judgement is not
    /// undone unseen (`conflict`). `forced`: a directory the action made that holds what
    /// is not the workflow's is left in place rather than refused.
    ///
    /// A file the action made whose directory is missing is not called verified gone:
    /// the directory may have been moved away with it (and come back). Nor is one the
    /// caller saw (`put` [`Put::Unchanged`]) and that is gone by the step, its folder
    /// there or not (swapped for another, maybe); unforced, either is a `conflict`:
    /// nothing is removed, and the rollback is left to be run again. One that goes,
    /// or whose directory goes, between the step's look and the removal is a
    /// `conflict` (nothing was removed), except when `recovering`: a dead run's undo
    /// must come to an end.
    ///
    /// `flush`: what is synced. A file's bytes, when anything is, before they take the
    /// target's place; the folders changed only with [`Flush::FileAndDir`] (with
    /// [`Flush::FileOnly`] the caller syncs their filesystem after, which a folder this
    /// process may not read allows where its own sync does not).
    pub fn restore(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        flush: Flush,
        put: Put,
        forced: Forced,
        keep: &dyn Fn(&str) -> bool,
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let rel = meta.target();
        let dirs = flush == Flush::FileAndDir;
        match meta.kind {
            SnapshotKind::File => {
                Self::restore_file(root, meta, &rel, (flush, put, forced), changed)
            }
            SnapshotKind::Missing => {
                Self::restore_absent(root, meta, &rel, (dirs, put, forced), keep, changed)
            }
            SnapshotKind::Directory => Self::restore_directory(root, meta, &rel, dirs),
        }
    }

    /// [`RollbackEngine::restore`] of a file the action found: rewritten from its backup.
    fn restore_file(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        (flush, put, forced): (Flush, Put, Forced),
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let bytes = Snapshotter::read_checked_backup(root, meta)??;
        let expected = meta.sha256.clone().unwrap_or_default();
        let mode = meta.mode.unwrap_or(FILE_MODE) & 0o666;
        // The file's folders were there when it was snapshotted. One missing now was
        // moved or removed since, maybe with the workflow's files in it: a restore into
        // a folder made again would leave those where they went, and a later step take
        // their absence for its own removal. Nothing is made, forced or not.
        let parents = rel.parent_components();
        // What stands at the target itself (a link, say) the write judges, as before.
        let walked = root.inspect_walked(rel);
        if let Ok((info, _)) = &walked
            && info.existing_parents < parents.len()
        {
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "the directory {} on the way to {} is missing: it was moved or removed since the action, maybe with the workflow's files in it; nothing was restored: put it back where it was (or, if it was removed, make it again), then {ROLL_BACK_AGAIN}, with force if the file is then found changed",
                    shown_path(&parents[..=info.existing_parents].join("/")),
                    shown_path(&meta.original_path)
                ),
            ));
        }
        // One there, but not the folder the action wrote in: a forced restore puts the
        // bytes at the path, as asked, and says that what the action wrote may live on
        // where that folder went.
        let replaced = walked
            .ok()
            .and_then(|(_, opened)| Self::replaced_as_walked(root, meta, &opened));
        // Unforced, what stands there is another's: nothing is written over it.
        if let Some(dir) = &replaced
            && forced == Forced::No
        {
            return not_the_actions(meta, dir, forced);
        }
        let tmp = crate::confine::root::action_temp_name(
            &meta.workflow_id,
            &meta.action_id,
            &crate::ids::own_seed(),
        );
        let make = Make::From(parents.len());
        root.write_atomic_put(rel, &bytes, mode, put, make, (flush, Some(&tmp)))?;
        let back = match changed().and_then(|()| root.read_file(rel, MAX_SNAPSHOT_BYTES)) {
            Ok(b) => b,
            // Gone, or something else in its place: not what the restore wrote.
            Err(r) if r.reason_code == ReasonCode::NotFound || is_put_in_the_way(r.reason_code) => {
                return Err(Refusal::new(
                    ReasonCode::ChecksumMismatch,
                    format!(
                        "{} was restored, but what stands there now cannot be read back ({}): another program changed it at that instant; {ROLL_BACK_AGAIN}, with force if it is then a conflict",
                        shown_path(&meta.original_path),
                        r.reason
                    ),
                ));
            }
            // The runtime's own reading failed (a disk error, no descriptor, a
            // permission): the restore is done, unverified; what it wrote is the
            // backup's bytes, checked against their record before the write.
            Err(r) => return Ok(unverified(meta, r, Some(expected))),
        };
        let restored = sha256_hex(&back);
        if restored != expected {
            return Err(Refusal::new(
                ReasonCode::ChecksumMismatch,
                format!(
                    "{} reads back with SHA-256 {restored}, not the snapshot's {expected}: another program changed it as it was restored; {ROLL_BACK_AGAIN}, with force if it is then a conflict",
                    shown_path(&meta.original_path)
                ),
            ));
        }
        Ok(RestoreOutcome {
            checksum_validated: replaced.is_none(),
            restored_checksum: Some(restored),
            left_dirs: Vec::new(),
            detail: replaced.map(|dir| format!(
                "restored into the directory {}, which is not the one the action wrote in: that was moved away (where the action's file would live on) or removed, and another put in its place; what the action left could not be checked",
                shown_path(&dir)
            )),
        })
    }

    /// [`RollbackEngine::restore`] of a path the action found absent: what it made
    /// there removed, with the folders it made on the way that are no one else's.
    fn restore_absent(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        (durable, put, forced): (bool, Put, Forced),
        keep: &dyn Fn(&str) -> bool,
        changed: impl Fn() -> Verdict,
    ) -> Verdict<RestoreOutcome> {
        let (info, opened) = root.inspect_walked(rel)?;
        let found = info.kind;
        // The outermost directory missing on the way to the target, if any: the
        // target may live on where it was moved.
        let parents = rel.parent_components();
        let away = (info.existing_parents < parents.len())
            .then(|| parents[..=info.existing_parents].join("/"));
        // Or there (or some of the folders on the way there), but not the folders the
        // action wrote in: what stands there is another's, what the action made lives
        // on, if anywhere, where those went.
        let replaced = Self::replaced_as_walked(root, meta, &opened);
        if let Some(dir) = &replaced
            && matches!(found, TargetKind::File { .. })
            && !meta.is_directory_action()
        {
            return not_the_actions(meta, dir, forced);
        }
        // Seen by the caller's look (`Put::Unchanged`) and gone by the step, in a
        // forced rollback or recovery: removed, or moved away with its folder (or its
        // folder swapped for another), where it lives on; not called checked.
        let mut vanished = false;
        match found {
            // A directory action made no file: one there now is someone else's.
            TargetKind::File { .. } if meta.is_directory_action() => {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "{} is now a file where the action made a directory; it was left in place",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
            TargetKind::File { .. } => {
                // It, or its directory, gone between the look and the removal: the
                // file was seen, and not removed. A later rollback finds it again, or
                // finds it gone.
                vanished = !root.remove_file_put(rel, put, durable)?;
                if vanished && forced != Forced::Recovering {
                    return Err(Refusal::new(
                        ReasonCode::Conflict,
                        format!(
                            "{}, or the directory holding it, was moved or removed just as it was to be removed; nothing was removed: {ROLL_BACK_AGAIN}",
                            shown_path(&meta.original_path)
                        ),
                    ));
                }
            }
            // A directory where the action made a file is someone else's, put there
            // since the rollback judged the target: never taken for one the action made.
            TargetKind::Directory if !meta.is_directory_action() => {
                return Err(Refusal::new(
                    ReasonCode::NotRegularFile,
                    format!(
                        "{} is now a directory where the action made a file (another program put it there); it was left in place, and nothing was removed: move it away, then {ROLL_BACK_AGAIN}",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
            TargetKind::Directory => {
                // Not the directory the action made (or not in the folder it made it
                // in): another's, never removed as the action's.
                let other = replaced
                    .clone()
                    .or_else(|| Self::made_dir_replaced(root, meta));
                if let Some(dir) = other {
                    return not_the_actions(meta, &dir, forced);
                }
                if let Some(left) =
                    Self::remove_made_directory(root, meta, rel, (durable, forced), keep)?
                {
                    return Ok(left);
                }
            }
            // Unforced, the rollback's check saw the file the action made: gone since,
            // or its folder gone, it was moved away (with its folder, or its folder
            // swapped for another, where it lives on) or removed; nothing tells which,
            // and taken for removed the workflow would be called rolled back with the
            // file standing wherever it went, and at its path again once it is back.
            TargetKind::Missing if forced == Forced::No && matches!(put, Put::Unchanged(_)) => {
                return Err(gone_since_checked(
                    meta,
                    away.as_deref(),
                    replaced.as_deref(),
                ));
            }
            TargetKind::Missing => vanished = matches!(put, Put::Unchanged(_)),
        }
        // Folders made on the way that could be neither removed nor put on the ledger (a
        // descriptor or the disk failing) fail the step, put back but not confirmed:
        // called done, it would leave them for good, where a rollback run again removes
        // them.
        let after = match changed() {
            Ok(()) => {
                // Those beneath a folder that is not the one the action wrote in are
                // not the action's either: left as they are.
                let left_dirs = match replaced {
                    Some(_) => Vec::new(),
                    None => Self::remove_created_dirs(root, meta, durable, keep)?,
                };
                root.inspect(rel)
                    .map(|i| (left_dirs, i.kind == TargetKind::Missing))
            }
            Err(r) => Err(r),
        };
        // Found missing beneath a missing directory: removed with it, or moved
        // away with it (and maybe back since); nothing says which, so the step
        // is not called verified.
        let unseen = away.filter(|_| found == TargetKind::Missing);
        if let Ok((_, false)) = &after {
            // The directory came back, the file in it: nothing was removed.
            if let Some(dir) = &unseen {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "the directory {} on the way to {} was missing, and is back with something in the target's place; nothing was removed: {ROLL_BACK_AGAIN}",
                        shown_path(dir),
                        shown_path(&meta.original_path)
                    ),
                ));
            }
            // Nothing removed (gone by the removal, or not there at the step's look),
            // and something there now: its folder back with it, say.
            if vanished || found == TargetKind::Missing {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "{} was not there as it was to be removed, and something stands in its place again (another program put it there, or moved its folder back); nothing was removed: {ROLL_BACK_AGAIN}",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
        }
        match after {
            Ok((left_dirs, gone)) => Ok(RestoreOutcome {
                checksum_validated: gone && unseen.is_none() && replaced.is_none() && !vanished,
                restored_checksum: None,
                detail: Some(absent_words(
                    meta,
                    (found, vanished),
                    gone,
                    (unseen.as_deref(), replaced.as_deref()),
                    &left_dirs,
                )),
                left_dirs,
            }),
            // A link or a special file on the way as it was looked at afterwards:
            // another program's change at that instant, as something put back there
            // is; the removal is done.
            Err(r) if is_put_in_the_way(r.reason_code) => Ok(RestoreOutcome {
                checksum_validated: false,
                restored_checksum: None,
                left_dirs: Vec::new(),
                detail: Some(format!(
                    "removed, but what stands on its way could not be looked at afterwards ({}): another program changed it at that instant",
                    r.reason
                )),
            }),
            Err(r) => Ok(unverified(meta, r, None)),
        }
    }

    /// [`Self::restore_absent`] of a directory standing where the action made one:
    /// removed when empty and no one's (`None`: the restore goes on with the folders
    /// made on the way); else left in place, as a directory the restore had to leave,
    /// so that a later restore removes it once it is empty and no one's. Unforced,
    /// something put in it since the rollback's check is a change it never saw: a
    /// conflict.
    fn remove_made_directory(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        (durable, forced): (bool, Forced),
        keep: &dyn Fn(&str) -> bool,
    ) -> Verdict<Option<RestoreOutcome>> {
        // Another action's result now, or holding what is not the workflow's in a
        // forced rollback: kept.
        let claimed = keep(&meta.original_path);
        let removed = !claimed && root.remove_empty_dir(rel, None, durable)?;
        if removed {
            return Ok(None);
        }
        if !claimed && forced == Forced::No {
            return Err(Refusal::new(
                ReasonCode::Conflict,
                format!(
                    "{} is a directory that is no longer empty; it was left in place",
                    shown_path(&meta.original_path)
                ),
            ));
        }
        let mut left_dirs = Self::remove_created_dirs(root, meta, durable, keep)?;
        if let Some(id) = root.dir_id(rel)? {
            left_dirs.push(LeftDir {
                path: meta.original_path.clone(),
                id,
            });
        }
        Ok(Some(RestoreOutcome {
            checksum_validated: true,
            restored_checksum: None,
            left_dirs,
            detail: Some(LEFT_IN_PLACE_SHARED.to_owned()),
        }))
    }

    /// [`RollbackEngine::restore`] of a directory the action found: made again if gone.
    fn restore_directory(
        root: &SandboxRoot,
        meta: &SnapshotMeta,
        rel: &RelPath,
        durable: bool,
    ) -> Verdict<RestoreOutcome> {
        // The action found the directory there; if it is gone, it is made again.
        let detail = match root.inspect(rel)?.kind {
            TargetKind::Directory => LEFT_IN_PLACE_FOUND,
            TargetKind::Missing => {
                root.create_dir_all(rel, durable)?;
                "made again: it existed before the action"
            }
            TargetKind::File { .. } => {
                return Err(Refusal::new(
                    ReasonCode::Conflict,
                    format!(
                        "{} was a directory and is now a file; it was left in place",
                        shown_path(&meta.original_path)
                    ),
                ));
            }
        };
        let still = root.inspect(rel)?.kind == TargetKind::Directory;
        Ok(RestoreOutcome {
            checksum_validated: still,
            restored_checksum: None,
            left_dirs: Vec::new(),
            detail: still.then(|| detail.to_owned()),
        })
    }
}

/// What a restore does with what stands at its path when that is not what the action
/// made or wrote: a directory that is not the one a `create_directory` made, or anything
/// in a folder (`dir`) that is not the one the action wrote in. Nothing is removed or
/// written; refused unforced, left and said forced (a restore writing back a file's
/// bytes asks only unforced).
fn not_the_actions(meta: &SnapshotMeta, dir: &str, forced: Forced) -> Verdict<RestoreOutcome> {
    let what = if dir == meta.original_path {
        format!(
            "{} is not the directory the action made",
            shown_path(&meta.original_path)
        )
    } else {
        format!(
            "{} stands in the directory {}, which is not the one the action wrote in",
            shown_path(&meta.original_path),
            shown_path(dir)
        )
    };
    let why = "that was moved away (where what the action made would live on) or removed, and another put in its place";
    if forced == Forced::No {
        return Err(Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{what}: {why}; nothing was changed: if it was moved, put it back, then {ROLL_BACK_AGAIN}; if removed, {ROLL_BACK_AGAIN} with force"
            ),
        ));
    }
    Ok(RestoreOutcome {
        checksum_validated: false,
        restored_checksum: None,
        left_dirs: Vec::new(),
        detail: Some(format!(
            "left in place: {what} ({why}); nothing was removed, and nothing could be checked"
        )),
    })
}

/// The refusal of an unforced restore that found gone the file its action made, which
/// the rollback's check saw (`away`: the missing directory on the way, if any;
/// `replaced`: the folder there that is not the one the action wrote in).
fn gone_since_checked(meta: &SnapshotMeta, away: Option<&str>, replaced: Option<&str>) -> Refusal {
    let what = match (away, replaced) {
        (Some(dir), _) => format!(
            "the directory {} on the way to {} went missing after the rollback's check",
            shown_path(dir),
            shown_path(&meta.original_path)
        ),
        (None, Some(dir)) => format!(
            "{} went missing after the rollback's check saw it, and the directory {} holding it is not the one the action wrote in (another was put in its place)",
            shown_path(&meta.original_path),
            shown_path(dir)
        ),
        (None, None) => format!(
            "{} went missing after the rollback's check saw it (its directory may have been swapped for another)",
            shown_path(&meta.original_path)
        ),
    };
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{what}: moved away, where the file lives on, or removed; nothing was removed: put it back and {ROLL_BACK_AGAIN}, or, if it was removed, {ROLL_BACK_AGAIN} with force"
        ),
    )
}

/// Whether a look refused with `code` met what another program put in the way: a
/// link, a file with another link, a special file.
fn is_put_in_the_way(code: ReasonCode) -> bool {
    matches!(
        code,
        ReasonCode::SymlinkEscape
            | ReasonCode::SymlinkRefused
            | ReasonCode::HardlinkRefused
            | ReasonCode::NotRegularFile
    )
}

/// What a restore that could not be checked afterwards for the runtime's own reasons
/// (`r`) did: done, unverified, having `written` (the checksum of the bytes it wrote;
/// none for a removal), which its audit line names.
fn unverified(meta: &SnapshotMeta, r: Refusal, written: Option<String>) -> RestoreOutcome {
    tracing::warn!(reason = %r, path = %meta.original_path, "a restored target could not be verified");
    RestoreOutcome {
        checksum_validated: false,
        restored_checksum: written,
        left_dirs: Vec::new(),
        detail: Some(format!(
            "restored, but it could not be checked afterwards: {}",
            r.reason
        )),
    }
}

/// What a restore of a target the action created tells of it: `found` before the
/// removal (and whether it `vanished`, seen by the caller's look and gone by the
/// step), `gone` after it, `unseen` beneath the missing directory named, or in the
/// `replaced` folder named, `left_dirs` the folders made on the way that stayed.
fn absent_words(
    meta: &SnapshotMeta,
    (found, vanished): (TargetKind, bool),
    gone: bool,
    (unseen, replaced): (Option<&str>, Option<&str>),
    left_dirs: &[LeftDir],
) -> String {
    let mut d = if !gone {
        "removed, but something stands there again: another program put it there after the removal"
            .to_owned()
    } else if let Some(dir) = unseen {
        format!(
            "not found, nor the directory {} on the way: removed with it, or moved away with it (where it would live on); nothing was removed, and nothing could be checked",
            shown_path(dir)
        )
    } else if vanished {
        "not found, though the rollback's look saw it a moment before: removed, or moved away (with its directory, or its directory swapped for another), where it would live on; nothing was removed, and nothing could be checked"
            .to_owned()
    } else if let Some(dir) = replaced {
        format!(
            "not found in the directory {}, which is not the one the action wrote in: that was moved away (where what the action made would live on) or removed, and another put in its place; nothing was removed, and nothing could be checked",
            shown_path(dir)
        )
    } else if found == TargetKind::Missing {
        // Someone removed it before the rollback: nothing was.
        "already gone before this restore, as before the action".to_owned()
    } else {
        RollbackEngine::absent_detail(meta)
    };
    d.push_str(&left_dirs_words(left_dirs));
    d
}

/// The clause a restore's detail ends with when folders the action made on the way
/// had to stay (empty when none).
fn left_dirs_words(left_dirs: &[LeftDir]) -> String {
    if left_dirs.is_empty() {
        return String::new();
    }
    let names: Vec<String> = left_dirs.iter().map(|l| shown_path(&l.path)).collect();
    format!(
        "; {} it made on the way left in place: other files are in it, it is another action's result, or it could not be removed now (removed by a later rollback beneath it, or the next prune, once empty and no one's)",
        names.join(", ")
    )
}
