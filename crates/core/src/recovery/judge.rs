//! What the trail and the disk say about a target a dead run touched: the last recorded
//! change, changes other runs made since, and whether it holds what an action left.

use super::{InflightRecord, dead_makers};
use crate::confine::RelPath;
use crate::reason::ReasonCode;
use crate::sandbox::{Sandbox, TargetState};
use std::collections::HashSet;

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
            .last_change(rel, |t| self.names_target(t, root, rel))
            .ok()
            .flatten()
    }

    /// The changes other runs made to an action's target after its snapshot, earliest
    /// first, as the trail records them. For an action of the run its workflow's record
    /// names (`of_dead_run`: a dead run, or the latest run of a log's), never another run
    /// of its workflow: none can follow that run before its recovery (each first
    /// recovers it, or takes the record over), so such a line, timed after the snapshot,
    /// only says that the clock was set back since. A logged write of an earlier run may
    /// have been followed by any run, its workflow's too.
    fn changes_by_others(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        of_dead_run: bool,
    ) -> Vec<crate::audit::SandboxAuditEntry> {
        let mut changes = self.changes_since_snapshot(root, meta).unwrap_or_default();
        if of_dead_run {
            changes.retain(|c| c.workflow_id != meta.workflow_id);
        }
        changes
    }

    /// Whether another run, after this action's snapshot, changed its target to what it
    /// holds now (`current`): old bytes found there were written back, not left by an
    /// undo of this action. Lines that changed nothing (a recovery recording an action
    /// undone) show no such thing.
    pub(super) fn put_back_by_another(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: &Option<String>,
        of_dead_run: bool,
    ) -> bool {
        self.changes_by_others(root, meta, of_dead_run)
            .iter()
            .any(|c| c.after_checksum == *current && c.before_checksum != c.after_checksum)
    }

    /// The first change another run made to an action's target after its snapshot.
    pub(super) fn first_change_by_another(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        of_dead_run: bool,
    ) -> Option<crate::audit::SandboxAuditEntry> {
        self.changes_by_others(root, meta, of_dead_run)
            .into_iter()
            .next()
    }

    /// Why some of these snapshots' targets cannot be judged now, one sentence each (see
    /// [`Recovered::unjudged`]). A missing target, a file where a folder was, a file too
    /// large for a snapshot is judged (someone else's change); only what the runtime
    /// refuses to look at is not. A second link that is the dead run's own temporary file
    /// (see [`crate::confine::root::SandboxRoot::remove_temp_links_of`]) is removed first.
    /// Also returns how many temporary names it removed.
    ///
    /// [`Recovered::unjudged`]: super::Recovered::unjudged
    pub(super) fn unjudged<'a>(
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

    /// Why recovery leaves a dead run or rollback for a later start: the target of
    /// `meta` (in root `i`) could not be read (`why`).
    pub(super) fn target_unread(
        &self,
        i: usize,
        meta: &crate::snapshot::SnapshotMeta,
        why: &str,
    ) -> String {
        format!(
            "its target {} could not be read ({why})",
            crate::confine::path::shown_path(&self.abs_path(i, &meta.target()))
        )
    }

    /// Whether a target (`current`: its checksum, `None` when it is no file) holds what
    /// it held before the snapshot's action: the same bytes, or still nothing, or still a
    /// directory. `Err` (why) when the disk would not say: a failure is no change by
    /// anyone, and the judgement waits for a start that can read it.
    pub(super) fn back_to_before(
        &self,
        root: usize,
        meta: &crate::snapshot::SnapshotMeta,
        current: Option<&str>,
    ) -> Result<bool, String> {
        match meta.kind {
            crate::snapshot::SnapshotKind::File => {
                Ok(current.is_some() && current == meta.sha256.as_deref())
            }
            _ if current.is_some() => Ok(false),
            _ => match self.target_state(root, &meta.target()) {
                TargetState::Failed(why) | TargetState::Denied(why) => Err(why),
                state => Ok(state == TargetState::found_by(meta)),
            },
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
