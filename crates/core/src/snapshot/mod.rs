//! Snapshots and rollback (SPEC §7).
//!
//! Before an action touches its target, the runtime writes
//! `{root}/.rollback/{workflow_id}/{action_id}/` with `backup` (the file's bytes, when it
//! existed) and `meta.json` (the original-path marker: path, whether it existed, kind,
//! size, SHA-256, mode, intent, time, and the directories the action will create), both
//! durable before the target is touched. A rollback puts the original back (or removes
//! what the action created) atomically and re-hashes the result.
//!
//! This file holds the records (`SnapshotMeta`, the restored mark); `store` the store's
//! folders and their trust checks, `owner` which state directory a store belongs to,
//! `take` the `Snapshotter` (taking, reading, pruning),
//! `restore` the `RollbackEngine` (putting back).

use crate::catalog::MutationClass;
use crate::confine::RelPath;
use crate::confine::path::ROLLBACK_DIR;
use serde::{Deserialize, Serialize};

mod owner;
mod restore;
mod store;
mod take;

pub use owner::{Claim, OWNER_FILE, Ownership, Settled, StoreOwner};
pub use restore::RestoreOutcome;
pub(crate) use restore::{Forced, RollbackEngine};
pub use store::check_store;
pub(crate) use take::Snapshotter;

/// Metadata file of a snapshot.
pub const META_FILE: &str = "meta.json";
/// Backup file of a snapshot.
pub const BACKUP_FILE: &str = "backup";
/// Prefix of a pruned workflow's snapshot folder moved aside for removal (a workflow id
/// never starts with a dot).
pub const PRUNED_MARKER: &str = ".ailab-pruned-";
/// Written once a snapshot has been restored.
pub const RESTORED_FILE: &str = "restored.json";
/// Written once the action has made the folders its snapshot records it makes: which
/// directory each is ([`SnapshotMeta::made`]).
pub const MADE_FILE: &str = "made.json";

/// What a refusal says of something standing in a backup's place (a link, a FIFO, a
/// file with other links): the runtime's own may only have been moved aside.
pub const NOT_ITS_BACKUP: &str = "is not one the runtime wrote";

/// How a failed rollback step's reason (and its audit line's `error`) begins when the
/// restore was made, its target left as the undo leaves it, and what came after failed
/// (the root's sync, say): a rollback run again takes the target as its own doing.
/// Part of the trail's format: recovery and later rollbacks read audit lines written by
/// earlier builds by this prefix, so it never changes.
pub const PUT_BACK_UNCONFIRMED: &str = "put back, but not confirmed: ";

/// The words with which a rollback step's reason says itself what to do next: a run's
/// result that tells of the step adds no advice of its own after them.
pub(crate) const ROLL_BACK_AGAIN: &str = "roll back again";

/// How a rollback step's `detail` begins when it left a directory in place.
pub const LEFT_IN_PLACE: &str = "left in place: ";
/// A directory left in place that holds what is not the workflow's.
const LEFT_IN_PLACE_SHARED: &str = "left in place: other files are in it, or it is another action's result; it is removed once empty and no one's";
/// A directory left in place that the action found there.
const LEFT_IN_PLACE_FOUND: &str = "left in place: it existed before the action";
/// Largest file the runtime snapshots (and so mutates).
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024;
const SNAPSHOT_DIR_MODE: u32 = 0o700;

/// What was at the target before the action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// A regular file (backed up).
    File,
    /// A directory (left untouched by `mkdir -p`, so nothing to copy).
    Directory,
    /// Nothing: the action creates it.
    Missing,
}

/// The original-path marker. A persisted format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMeta {
    /// Format version.
    pub format: u32,
    /// Time-ordered id: workflow rollback restores in reverse of this order.
    pub snapshot_id: String,
    /// The workflow.
    pub workflow_id: String,
    /// The action.
    pub action_id: String,
    /// The run that took it.
    pub execution_id: String,
    /// The root, as configured.
    pub root: String,
    /// The target, relative to the root.
    pub original_path: String,
    /// Whether the target existed.
    pub existed: bool,
    /// What it was.
    pub kind: SnapshotKind,
    /// Its size.
    pub size_bytes: Option<u64>,
    /// Its SHA-256.
    pub sha256: Option<String>,
    /// Its permission bits.
    pub mode: Option<u32>,
    /// The intent about to run.
    pub intent: String,
    /// Its mutation class.
    pub mutation_class: MutationClass,
    /// Directories (root-relative) the action creates, outermost first.
    pub created_dirs: Vec<String>,
    /// When.
    pub taken_at: String,
    /// The SHA-256 of the file the action is about to write (none for a directory, and
    /// in snapshots written before it was recorded): recovery tells the action's own
    /// unaudited write from someone else's later one by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_sha256: Option<String>,
    /// What completes the action, when the snapshot is also its commit record (batched
    /// durability): recovery finishes such an action instead of undoing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<SnapshotCommit>,
    /// Which directory the deepest folder on the way to the target that stood at the
    /// action's check was (the write refuses to go on in another) ([`SnapshotMeta::folder_rel`]; none at the root's top, and in
    /// snapshots written before it was recorded): a folder another program put in its
    /// place since, the action's file living on where the first went, is not taken for
    /// one where the file is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<crate::confine::root::DirId>,
    /// Which directory the root was when the snapshot was taken: folders are compared
    /// with their records only in that same root, not in a copy of it put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_id: Option<crate::confine::root::DirId>,
    /// Which directory each of `created_dirs` was once the action made it, in their
    /// order, as its own mark (`made.json`, written once they are made, before anything
    /// is written in them) says, read with the snapshot; empty when the action made no
    /// folder, or stopped before the mark. Not part of the sealed record.
    #[serde(skip)]
    pub made: Vec<crate::confine::root::DirId>,
}

/// Everything recovery needs to finish a file write whose new bytes were made durable
/// together with its snapshot: the staged file beside the target, the checksum it must
/// have, and the registry entry and audit record the action appends once it is in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCommit {
    /// The temporary file in the target's directory that holds the new bytes.
    pub staged_name: String,
    /// SHA-256 of the new bytes.
    pub after_sha256: String,
    /// Whether the target must not exist when the staged file takes its place.
    pub no_replace: bool,
    /// The artifact the action registers.
    pub artifact: Option<crate::artifact::ArtifactEntry>,
    /// The audit record of its success.
    pub audit: crate::audit::AuditRecord,
}

impl SnapshotMeta {
    /// Whether the action makes a directory (rather than writing a file).
    pub fn is_directory_action(&self) -> bool {
        crate::catalog::op_for_intent(&self.intent).is_some_and(|op| op.is_directory())
    }

    /// The snapshot's folder, relative to its root: `.rollback/{workflow}/{action}`.
    pub fn rollback_path(&self) -> String {
        format!("{ROLLBACK_DIR}/{}/{}", self.workflow_id, self.action_id)
    }

    /// The target as a relative path.
    pub fn target(&self) -> RelPath {
        RelPath::from_recorded(&self.original_path)
    }

    /// Where [`SnapshotMeta::folder`] is: the target's parent, or the one the outermost
    /// directory the action makes is made in; none at the root's top.
    pub fn folder_rel(&self) -> Option<RelPath> {
        let first = match self.created_dirs.first() {
            Some(d) => RelPath::from_recorded(d),
            None => self.target(),
        };
        let parents = first.parent_components();
        (!parents.is_empty()).then(|| RelPath::from_components(parents.to_vec()))
    }
}

/// What a snapshot's "restored" mark says.
#[derive(Debug, Clone, Deserialize)]
pub struct RestoredMark {
    /// The rollback (or run undoing itself) that restored it.
    pub execution_id: String,
    /// When (absent from marks written before marks said it).
    #[serde(default)]
    pub restored_at: Option<String>,
    /// SHA-256 of what the restore left, `None` when it removed the target.
    pub restored_checksum: Option<String>,
    /// Directories the action created that the restore had to leave.
    #[serde(default)]
    pub left_dirs: Vec<LeftDir>,
    /// What the target held before a rollback's restore (`Some(None)`: nothing); `None`
    /// when the mark does not say (recovery's, or one written before marks said it).
    #[serde(default, deserialize_with = "present")]
    pub before_checksum: Option<Option<String>>,
    /// What the undo could not check, for its audit line's `error` (recovery's, of an
    /// action it left as another program left its target).
    #[serde(default)]
    pub error: Option<String>,
}

/// A field that is there, null or not, as `Some` (absent: the default, `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// A directory an action created that its restore had to leave because it was not empty
/// then (a later action of the workflow or another workflow, not rolled back, or
/// someone else had a file in it). Kept by identity as well as by path, so that a later
/// restore removes it once it is empty (see `left_dirs`), and never a
/// directory of the same name someone made since.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeftDir {
    /// Relative to the root.
    pub path: String,
    /// Which directory it was.
    #[serde(flatten)]
    pub id: crate::confine::DirId,
}

/// A stored snapshot and whether it was already restored.
#[derive(Debug, Clone)]
pub struct StoredSnapshot {
    /// Its metadata.
    pub meta: SnapshotMeta,
    /// Whether a rollback already restored it.
    pub restored: bool,
}
