//! Which state directory a root's snapshot store belongs to.
//!
//! Two runtimes writing in one root with different state directories (which the README
//! forbids) cannot trust each other's snapshots, and each one's recovery and rollbacks take
//! the other's writes for changes by another program: an undo by one can put old bytes
//! back over the other's acknowledged write. So the first runtime to use a store claims
//! it: `.rollback/.ailab-owner` names its state directory and carries its seal. A runtime
//! whose key did not make that seal leaves the root alone (skipped at start, its writes
//! refused), unless the record names this very state directory, by path and by the
//! directory itself: then it is this one's with its key replaced since, and it is
//! claimed again. A copy of the state directory has the key but is another runtime (its
//! own trail and locks): a record under this key must also name this directory, by what
//! it is (moved) or where it is (put back from a copy), and is then made to name it as
//! it is now. Each snapshot looks at the record first (one `fstatat`), so a claim removed
//! or taken over while a process runs is seen at its next write.

use crate::confine::SandboxRoot;
use crate::confine::path::{ROLLBACK_DIR, shown_path};
use crate::confine::root::{FileStamp, Flush, Put, read_file_in, sync_dir, write_atomic_placed};
use crate::reason::{ReasonCode, Refusal};
use crate::seal::{SealKey, Unsealed};
use serde::{Deserialize, Serialize};
use std::io;

use super::store::{
    check_private_to_read, is_passing, rollback_dir, snap_io, snapshot_store, store_refusal,
};

/// The owner record's name in the store: no workflow id starts with a dot.
pub const OWNER_FILE: &str = ".ailab-owner";

/// How old a temporary file in the store's top must be for a prune to take it for a
/// dead claim's.
pub const DEAD_CLAIM_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// A state directory, as its owner record names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreOwner {
    /// Its path, as configured.
    pub state_dir: String,
    /// Its `(st_dev, st_ino)`: with the path, what tells this state directory with a
    /// replaced key from another one.
    pub state_dir_id: (u64, u64),
}

/// What confirming a store may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Nothing: a start that may not write.
    No,
    /// The owner record of a store that is there: a start that may write.
    IfThere,
    /// The store and its owner record: before a snapshot.
    Make,
}

/// What confirming a store found.
#[derive(Debug)]
pub enum Ownership {
    /// The store is this state directory's: its owner record as it stands (while the
    /// same file, unchanged, stands there, the store is still this one's), and how it
    /// came to name it.
    Ours(FileStamp, Settled),
    /// Not confirmed, and nothing was written: no store yet, or it is unclaimed or under
    /// an earlier key while this process may not write.
    Unsettled,
    /// Another state directory's, or its record is damaged: nothing is written here.
    Foreign(Refusal),
}

/// How a store's owner record came to name this state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// It did already.
    Already,
    /// No one had claimed the store: this state directory now has. How many workflows'
    /// snapshots it held then (made before owner records were, or by a runtime whose
    /// record was removed: perhaps another state directory's).
    Claimed(usize),
    /// It named this state directory under an earlier seal key: it is claimed again.
    ClaimedAgain,
    /// Under this key, it named this very directory at another path (moved), or another
    /// directory at this path (put back from a copy): it names this one as it is now,
    /// so that a copy left at the other place is not taken for it. The place it named.
    Moved(String),
}

impl StoreOwner {
    /// Confirms that `root`'s snapshot store is this state directory's, claiming it when
    /// no one has (or this one under an earlier key) and `how` allows writing.
    /// [`Claim::Make`] makes a missing store first (synced into the root when
    /// `durable`, as the snapshot that follows will not know it was new).
    pub fn confirm(
        &self,
        root: &SandboxRoot,
        key: &SealKey,
        how: Claim,
        durable: bool,
    ) -> Result<Ownership, Refusal> {
        let claim = how != Claim::No;
        let rb = if how == Claim::Make {
            let (rb, made) = snapshot_store(root)?;
            if made && durable {
                sync_dir(root.dir()).map_err(|e| snap_io("sync", &e))?;
            }
            rb
        } else {
            match rollback_dir(root) {
                Ok(Some(rb)) => {
                    check_private_to_read(root, &rb, ROLLBACK_DIR)?;
                    rb
                }
                Ok(None) => return Ok(Ownership::Unsettled),
                Err(e) => return Err(store_refusal(root, &e)),
            }
        };
        let at = format!("{ROLLBACK_DIR}/{OWNER_FILE}");
        // What this process wrote, once it did: read back, to know the file as it stands.
        let mut wrote = None;
        // Three reads at most: a claim lost to another process is read as that one's.
        for _ in 0..3 {
            let (bytes, read) = match read_file_in(&rb, OWNER_FILE, 1 << 12, true) {
                Ok((b, stamp)) => (b, Some(stamp)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), None),
                // The disk, or this process, not the record: the same read may pass later.
                Err(e) if is_passing(&e) || crate::confine::root::is_denied(&e) => {
                    return Err(snap_io(&format!("read {at} of"), &e));
                }
                // A link, a folder, a FIFO, a file with other links, one too large.
                Err(e) => {
                    let whose = format!(
                        "an owner this runtime cannot tell ({} is not a record the runtime wrote: {})",
                        shown_path(&at),
                        crate::error::io_words(&e)
                    );
                    return Ok(Ownership::Foreign(self.foreign(root, &whose)));
                }
            };
            // Empty: never claimed, or a claim a power cut left without its bytes
            // (`relaxed` syncs nothing), which is replaced as it was read.
            let settled = match (read, bytes.is_empty()) {
                (Some(stamp), false) => match key.open::<StoreOwner>(&bytes) {
                    Ok(named) if named == *self => {
                        return Ok(Ownership::Ours(stamp, wrote.unwrap_or(Settled::Already)));
                    }
                    // A copy of the state directory has its key too: the record must name
                    // this directory, by what it is or where it is.
                    Ok(named)
                        if named.state_dir_id != self.state_dir_id
                            && named.state_dir != self.state_dir =>
                    {
                        return Ok(Ownership::Foreign(self.copy_refusal(root)));
                    }
                    Ok(_) if !claim => return Ok(Ownership::Ours(stamp, Settled::Already)),
                    Ok(named) => Settled::Moved(named.state_dir),
                    Err(why) => match serde_json::from_slice::<StoreOwner>(&bytes) {
                        Ok(named) if named == *self => Settled::ClaimedAgain,
                        named => {
                            let whose = self.owner_named(named.ok(), &why);
                            return Ok(Ownership::Foreign(self.foreign(root, &whose)));
                        }
                    },
                },
                // Counted before the claim: once it stands, other threads and processes
                // make their snapshot folders under it, which are no one else's.
                _ => Settled::Claimed(if claim { workflows_in(&rb) } else { 0 }),
            };
            if !claim {
                return Ok(Ownership::Unsettled);
            }
            let sealed = key.seal(self).map_err(|e| snap_io("encode", &e))?;
            // A record replaced only as it was read (names exchanged, then the one
            // replaced checked): of two claims at once, one loses and reads the other's.
            let put = read.map_or(Put::New, Put::Unchanged);
            let flush = if durable {
                Flush::FileAndDir
            } else {
                Flush::Nothing
            };
            let here = || Ok(());
            match write_atomic_placed(&rb, (OWNER_FILE, None), &sealed, 0o600, (put, flush), &here)
            {
                Ok(()) => wrote = Some(settled),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists || is_changed(&e) => {}
                Err(e) => return Err(snap_io(&format!("write {at} of"), &e)),
            }
        }
        Err(snap_io(
            &format!("claim {at} of"),
            &io::Error::other("it kept changing while it was read"),
        ))
    }

    /// Removes, of `names` (what `Snapshotter::list_workflows` found in this
    /// root's store), the temporary files of owner claims whose process died before
    /// their rename: those older than ten minutes, as a claim's lives for an
    /// instant (a younger one may be another process's claim under way). Nothing else
    /// in the store's top is a file the runtime writes. Returns how many were removed.
    pub fn sweep_dead_claims(root: &SandboxRoot, names: &[String]) -> usize {
        let Ok(Some(rb)) = rollback_dir(root) else {
            return 0;
        };
        let now = std::time::SystemTime::now();
        names
            .iter()
            .filter(|n| n.starts_with(crate::confine::path::TEMP_MARKER))
            .filter(|n| {
                rb.symlink_metadata(n.as_str()).is_ok_and(|m| {
                    !m.is_dir()
                        && m.modified().is_ok_and(|t| {
                            now.duration_since(t.into_std())
                                .is_ok_and(|age| age > DEAD_CLAIM_AGE)
                        })
                })
            })
            .filter(|n| rb.remove_file(n.as_str()).is_ok())
            .count()
    }

    /// Whose a store is, in words, by an owner record this key did not seal (`named`,
    /// when it could be read as one).
    fn owner_named(&self, named: Option<StoreOwner>, why: &Unsealed) -> String {
        match (&named, why) {
            (Some(o), _) if o.state_dir == self.state_dir => "a runtime whose state directory was at this one's path too, but another directory there (or this one under a key that is not its present one)".to_owned(),
            (Some(_), _) => "another runtime's state directory, the one its record names".to_owned(),
            (None, Unsealed::Malformed(e)) => {
                format!("an owner this runtime cannot tell (its record is damaged: {e})")
            }
            (None, Unsealed::Forged) => "another runtime".to_owned(),
        }
    }

    // The refusals below name no state directory, this one's or another's: a plan's
    // caller (an agent over MCP, a client over HTTP) reads them, and no path outside
    // the roots is told to it. The owner record, in the root, names the other; the
    // operator reads it there.

    /// The refusal for a store whose record, sealed with this state directory's key,
    /// names another directory at another path: a copy of this one, or this one a copy
    /// of it, each with its own trail and locks.
    fn copy_refusal(&self, root: &SandboxRoot) -> Refusal {
        let at = format!("{}/{ROLLBACK_DIR}/{OWNER_FILE}", root.path().display());
        Refusal::new(
            ReasonCode::Conflict,
            format!(
                "the snapshot store of root {} belongs to a copy of this runtime's state directory at another path (it has this runtime's seal key; {} names it): two runtimes with copies of one state directory keep separate trails and locks, and take each other's writes for changes to undo, so nothing is written here; start this runtime with the state directory that record names, or, if that one is gone for good (this one was copied from it), remove {}: this runtime then claims the root, and the snapshots stay valid (the key is the same)",
                root.path().display(),
                shown_path(&at),
                shown_path(&at)
            ),
        )
    }

    /// The refusal for a store claimed by another state directory (`whose`, in words).
    fn foreign(&self, root: &SandboxRoot, whose: &str) -> Refusal {
        let at = format!("{}/{ROLLBACK_DIR}/{OWNER_FILE}", root.path().display());
        Refusal::new(
            ReasonCode::Conflict,
            format!(
                "the snapshot store of root {} belongs to {whose}, not to this runtime's state directory (so says {}, which this state directory's seal key did not seal): two runtimes writing in one root with different state directories take each other's writes for changes to undo, so nothing is written here; give each runtime a root of its own, or start this one with the state directory that record names; if that one is gone for good and this one is to take its place, remove {} (the snapshots it sealed stay refused)",
                root.path().display(),
                shown_path(&at),
                shown_path(&at)
            ),
        )
    }
}

/// How many workflows' snapshot folders the store `rb` holds (what cannot be listed
/// counts none: it is only said).
fn workflows_in(rb: &cap_std::fs::Dir) -> usize {
    rb.entries().map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| e.file_name().to_str().is_some_and(crate::plan::is_valid_id))
            .count()
    })
}

/// Whether a write refused because its file was no longer as it was read.
fn is_changed(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|r| r.downcast_ref::<Refusal>())
        .is_some_and(|r| r.reason_code == ReasonCode::Conflict)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A fresh store claimed while another thread of the process makes its snapshot
    /// folder under the new claim holds no one else's snapshots: the claim says none.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another thread, by path
    fn folders_made_under_a_new_claim_are_not_counted_as_found() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("root");
        let root = SandboxRoot::open(&path, true).unwrap();
        let owner = StoreOwner {
            state_dir: tmp.path().join("state").display().to_string(),
            state_dir_id: (1, 2),
        };
        let store = path.join(ROLLBACK_DIR);
        let hook: crate::confine::root::RaceHook =
            Box::new(move |_: &cap_std::fs::Dir, _: &str| {
                std::fs::create_dir(store.join("wf_other")).unwrap();
            });
        crate::confine::root::BEFORE_RENAME.with(|h| h.set(Some(hook)));
        let key = SealKey::new([7; 32]);
        match owner.confirm(&root, &key, Claim::Make, false).unwrap() {
            Ownership::Ours(_, settled) => assert_eq!(settled, Settled::Claimed(0)),
            other => panic!("{other:?}"),
        }
    }
}
