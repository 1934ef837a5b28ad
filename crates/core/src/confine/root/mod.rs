//! A sandbox root and every file operation beneath it.
//!
//! The root directory is opened once, as a capability handle (`cap_std::fs::Dir`); every
//! later lookup is relative to it and resolved by the kernel with `RESOLVE_BENEATH`, so no
//! path string, symlink or rename race can make an operation land outside. Parent
//! directories are walked one component at a time with `open_dir_nofollow`, and the last
//! component is opened with `O_NOFOLLOW` or replaced by `renameat`, so symlinks are never
//! followed for writes. The lexical checks before this produce the reason codes; this
//! module is what holds the line.
//!
//! `SandboxRoot::open` walks from `/`, checking each directory above the root;
//! `nested_roots` finds roots that lie one inside another; `detect_symlink_escape` words a
//! link met on the way as an escape or not. The file operations (`inspect`, `write_atomic`,
//! `create_dir_all`, the removals, the reads) are here; beside them, `files` (one regular
//! file read, an atomic write, a staged write and its commit, temporary names), `walk`
//! (directories reached one component at a time), `access` (what this process may change)
//! and `refusal` (the refusals these operations end in).
//!
//! A root is reached only through directories no one else controls: its path is walked from
//! `/` one handle at a time; every directory above it belongs to root or to this user and
//! is writable only by its owner (or sticky), every symlink on the way belongs to root or
//! to this user, and each check is made on the handle the walk descends from. The
//! directories it was reached through are kept, so roots are compared as directories, not
//! strings: one inside another is refused at start-up.
// confine/ is where paths are opened. Only the types are allowed module-wide, so that the
// chmod and subprocess bans of clippy.toml (SPEC §12.1-2) still hold in this module.
#![allow(clippy::disallowed_types)]

use super::path::{RelPath, lexical_normalize, path_strings, shown_path};
use crate::reason::{ReasonCode, Refusal, Verdict};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt};
use std::io;
use std::path::{Path, PathBuf};

/// Mode of every file the runtime creates: never an execute bit.
pub const FILE_MODE: u32 = 0o644;
/// Mode of every directory the runtime creates.
pub const DIR_MODE: u32 = 0o755;

/// How deep a symlink chain is followed (lexically) to tell an escape from an inside link:
/// as far as the kernel would follow one (`MAXSYMLINKS`), so that no chain it would take
/// out of the root is called an inside link (and left out of the escape count).
const SYMLINK_HOPS: usize = 40;

/// What is at a target path, found without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// Nothing there.
    Missing,
    /// A regular file with one link.
    File {
        /// Its size in bytes.
        size: u64,
        /// Its permission bits.
        mode: u32,
    },
    /// A directory.
    Directory,
}

wire_enum! {
    /// What a path names, as listings and `get_file_info` tell it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum PathKind {
        /// A regular file.
        File = "file",
        /// A directory.
        Directory = "directory",
        /// A symbolic link (never followed).
        Symlink = "symlink",
        /// A FIFO, socket or device node (never opened).
        Special = "special",
        /// Nothing there.
        Missing = "missing",
    }
}

/// What is at a path, looked at without following or opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Nothing there.
    Missing,
    /// A regular file.
    File {
        /// Its size in bytes.
        size: u64,
        /// Its permission bits.
        mode: u32,
        /// How many names it has.
        links: u64,
    },
    /// A directory.
    Directory,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO, socket or device node (never opened).
    Special,
}

/// The result of inspecting a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// What is at the path.
    pub kind: TargetKind,
    /// How many of the parent components exist (as real directories).
    pub existing_parents: usize,
    /// The deepest of them, as its name held it at the look (none at the root's top):
    /// a snapshot records it, so that a folder another program puts in its place since
    /// is told from the one the action wrote in.
    pub folder: Option<DirId>,
}

/// Which directory a path names, so that one removed and made again under the same name
/// is told apart: device, inode and birth time (a freed inode is reused at once on some
/// filesystems, and the birth time, where the filesystem keeps one, differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DirId {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Birth time, nanoseconds since the epoch.
    #[serde(default)]
    pub born_ns: Option<u64>,
}

impl DirId {
    /// Whether `now`, read at this one's path later, is surely another directory: the
    /// same device, another inode. A folder moved away keeps its inode, so one made in
    /// its place cannot have it; one freed and its inode reused means the first was
    /// removed, which is what the same inode is then taken for. The birth time is not
    /// compared (an overlay copies a lower layer's folder up at the first write in it,
    /// with a new birth time and the same inode), nor are inodes across a change of
    /// device number (a remount may renumber the device): neither says another folder.
    pub fn replaced_by(&self, now: &DirId) -> bool {
        self.dev == now.dev && self.ino != now.ino
    }

    /// Whether `now` is surely this very directory: the same device and inode, and the
    /// same birth time where both know one.
    pub fn same_as(&self, now: &DirId) -> bool {
        (self.dev, self.ino) == (now.dev, now.ino)
            && (self.born_ns.is_none() || now.born_ns.is_none() || self.born_ns == now.born_ns)
    }

    fn of(m: &cap_std::fs::Metadata) -> Self {
        let born_ns = m
            .created()
            .ok()
            .and_then(|t| t.into_std().duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_nanos()).ok());
        Self {
            dev: m.dev(),
            ino: m.ino(),
            born_ns,
        }
    }
}

/// What a write's walk to its folder may make ([`Make`]), and which folder it must find
/// on the way: the one the action's check found there (its depth in components, its
/// identity), so that a folder removed and made again, or swapped, since the check is
/// refused (`conflict`) by the very walk whose handles the write goes through.
#[derive(Debug, Clone, Copy)]
pub struct Walk {
    /// Which missing folders may be made.
    pub make: Make,
    /// The folder to find at that depth, if any.
    pub folder: Option<(usize, DirId)>,
}

impl From<Make> for Walk {
    fn from(make: Make) -> Self {
        Walk { make, folder: None }
    }
}

/// A sandbox root: its configured path and the directory handle opened at start-up.
#[derive(Debug)]
pub struct SandboxRoot {
    path: PathBuf,
    dir: Dir,
    /// The root directory's `(st_dev, st_ino)`.
    id: (u64, u64),
    /// The same with its birth time, where the filesystem keeps one (see
    /// [`SandboxRoot::dir_id_of_root`]).
    root_dir_id: DirId,
    /// The same for every directory the root was reached through, `/` first: where the
    /// root really lies, whatever symlinks its configured path names.
    ancestry: Vec<(u64, u64)>,
    /// Directories never reached through this root (see [`SandboxRoot::reserve`]).
    reserved: Vec<((u64, u64), String)>,
    /// Where the names of the target locks of its files begin (see
    /// [`SandboxRoot::lock_seeds`]).
    lock_seeds: [u64; 2],
    /// The owner record of its snapshot store as last found naming this runtime's state
    /// directory (see [`crate::snapshot::StoreOwner`]): while it is the same file,
    /// unchanged, it is not read again.
    store_record: std::sync::Mutex<Option<FileStamp>>,
}

mod access;
mod files;
#[cfg(test)]
pub(crate) use files::{BEFORE_RENAME, RaceHook};
mod refusal;
mod walk;

pub(crate) use access::{NotOurs, change_refused, euid, not_ours, shut_to_reading};
use files::flush_for;
pub use files::{
    FileStamp, Flush, Make, Put, StagedWrite, WrittenFile, action_temp_name, hash_regular,
    read_regular, remove_temp_files, sync_dir, temp_name, write_atomic_flush, write_atomic_in,
    write_atomic_placed, write_new_in,
};
pub(crate) use files::{
    entry_type, open_file_in, read_file_in, remove_temp_files_in_tree, remove_temp_named, stamp_at,
    temp_files_made_by,
};
use refusal::{
    appeared_meanwhile, changed_meanwhile, hardlink_refusal, mkdir_refusal, moved_meanwhile,
    moved_while_removed, moved_while_written, named_in_full, removed_as_opened, removed_meanwhile,
    special_refusal,
};
pub(crate) use refusal::{io_refusal, is_denied, made_then, not_a_directory, not_as_checked};
pub use walk::read_operator_file;
pub(crate) use walk::{
    REFUSED_ABOVE, list_may_give_write, open_checked_dir, open_checked_dir_through_link,
    others_may_write, probe_checked_dir_through_link,
};

/// Where [`lock_hash`] starts (FNV-1a's offset basis).
pub(crate) const LOCK_HASH_START: u64 = 0xcbf2_9ce4_8422_2325;

/// `h` carried on over `path` folded as a filesystem that ignores case and
/// normalization reads it ([`crate::confine::path::folded`], canonical composition
/// first), each component after a `/`: FNV-1a, so that every process of every build
/// names a file's lock alike.
pub(crate) fn lock_hash(mut h: u64, path: &str) -> u64 {
    use unicode_normalization::UnicodeNormalization as _;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let part: String = part.nfc().collect();
        for b in std::iter::once(b'/').chain(crate::confine::path::folded(&part).bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Symlinks followed among a root's ancestors before giving up (the kernel's own limit).
const ANCESTOR_HOPS: usize = 40;

/// A directory on the way down to a root: the path it was reached by (symlinks
/// resolved), its handle and its identity.
struct Ancestor {
    path: PathBuf,
    dir: Dir,
    id: (u64, u64),
}

impl SandboxRoot {
    /// Whether anything stands at `path` (a link included): a root not there yet is made
    /// when opened.
    #[allow(clippy::disallowed_methods)] // a look only: the root is opened by the walk
    pub fn exists(path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    /// Why a root not there yet could not be made, judged by what stands on its way now
    /// (a file above it, a folder another user may change), without making anything.
    pub(crate) fn refused_before_made(path: &Path) -> Option<String> {
        walk::probe_checked_dir(path, "root").err()
    }

    /// Opens (and, with `create`, first creates) a root through `open_checked_dir`,
    /// refusing one owned by another user or writable by others without the sticky bit.
    ///
    /// Whoever controls a directory above the root could swap the root for a directory
    /// of theirs; a symlink on the way is followed only when it is owned by root or by
    /// this user, and what it leads to is checked the same way. Each check is made on
    /// the open handle that the walk then descends from, so nothing can be swapped in
    /// between. Outside the crate only with the `internals` feature: writes through a
    /// root opened by hand skip governance, the snapshot and the trail.
    #[cfg(feature = "internals")]
    pub fn open(path: &Path, create: bool) -> Result<Self, String> {
        Self::open_checked(path, create)
    }

    /// [`SandboxRoot::open`], for the `Sandbox`.
    pub(crate) fn open_checked(path: &Path, create: bool) -> Result<Self, String> {
        let shown = path.display();
        let checked = open_checked_dir(path, create, "root", DIR_MODE)?;
        let (dir, opened) = (checked.dir, checked.meta);
        let euid = euid();
        if opened.uid() != euid {
            return Err(format!(
                "root {shown} is owned by uid {}, not by this process's uid {euid}; someone else may control it: give a root of this user's own, or run as its owner",
                opened.uid()
            ));
        }
        if opened.mode() & 0o1000 == 0
            && let Some(how) = others_may_write(&opened, &dir)
        {
            return Err(format!(
                "root {shown} (group {}, mode {:04o}) is writable by other users{how} and has no sticky bit; a root must be writable only by its owner or this process's group (and give no other user or group write in an access control list), or carry the sticky bit as /tmp does",
                opened.gid(),
                opened.mode() & 0o7777
            ));
        }
        let root_dir_id = dir
            .dir_metadata()
            .map(|m| DirId::of(&m))
            .map_err(|e| format!("root {shown} cannot be looked at: {e}"))?;
        Ok(Self {
            // One spelling, whatever the configuration wrote (`//`, a trailing `/`): the
            // registry and the audit trail record paths beneath it as text.
            path: path.components().collect(),
            dir,
            id: (opened.dev(), opened.ino()),
            root_dir_id,
            ancestry: checked.ancestry,
            reserved: Vec::new(),
            lock_seeds: [
                lock_hash(
                    LOCK_HASH_START,
                    &format!("{}:{}", opened.dev(), opened.ino()),
                ),
                lock_hash(LOCK_HASH_START, &checked.real.to_string_lossy()),
            ],
            store_record: std::sync::Mutex::new(None),
        })
    }

    /// The owner record of its snapshot store as last found naming this state directory.
    pub(crate) fn store_record(&self) -> Option<FileStamp> {
        *self
            .store_record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the owner record found naming this state directory (`None`: not, or no
    /// longer).
    pub(crate) fn set_store_record(&self, record: Option<FileStamp>) {
        *self
            .store_record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = record;
    }

    /// The starts of the two hashes that name the target locks of a file of this root
    /// ([`lock_hash`]): its identity, the same through every path to it (a bind mount,
    /// a folder above it renamed), and its real path (symbolic links resolved), so that
    /// a file reached through a root nested in another process's root, or in another
    /// case on a filesystem that ignores case, takes the same lock there as here.
    pub(crate) fn lock_seeds(&self) -> [u64; 2] {
        self.lock_seeds
    }

    /// Whether `configured` (a root path as some earlier run configured it) names this
    /// very directory: the same path, or another spelling (a symlink, `//`) that leads to
    /// it.
    #[allow(clippy::disallowed_methods)] // a path from a sealed record, only compared
    pub fn is_named_by(&self, configured: &str) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        Path::new(configured) == self.path
            || std::fs::metadata(configured).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// Whether the configured path still leads to the directory opened at start: one
    /// moved away, removed or replaced since (an operator's `mv sandbox sandbox.old &&
    /// mkdir sandbox`) would take writes through the handle where nobody looks for them,
    /// while every record names the path. `Err` says what the path is now.
    #[allow(clippy::disallowed_methods)] // a look only: nothing is opened by the path
    pub fn in_place(&self) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt as _;
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.id => Ok(()),
            Ok(_) => Err("another directory, or a link to one".to_owned()),
            Err(e) => Err(crate::error::io_words(&e)),
        }
    }

    /// Whether `other` lies inside this root (or is the same directory), judged by the
    /// directories both were really reached through, not by their configured paths.
    pub fn contains(&self, other: &SandboxRoot) -> bool {
        self.id == other.id || other.reached_through(self.id)
    }

    /// Whether the directory `id` (`(st_dev, st_ino)`) is one this root was reached
    /// through when it was opened: the root lies inside it, whatever its path says.
    pub fn reached_through(&self, id: (u64, u64)) -> bool {
        self.ancestry.contains(&id)
    }

    /// The root directory's `(st_dev, st_ino)`: the same for every spelling of its path.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// Which directory the root is, birth time included, as opened: a snapshot records
    /// it, so that a root made anew (a copy put back, its inode maybe reused) is not
    /// taken for the one whose folders the snapshot recorded.
    pub fn dir_id_of_root(&self) -> DirId {
        self.root_dir_id
    }

    /// The configured path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root handle.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Looks at a target without following any symlink: `detect_symlink_escape` plus
    /// the hard-link and special-file checks. Refuses a symlink anywhere in the path
    /// (`symlink_escape` when it points outside the root, `symlink_refused` otherwise),
    /// a regular file with more than one link (`hardlink_refused`) and FIFOs, sockets or
    /// devices (`not_regular_file`).
    pub fn inspect(&self, rel: &RelPath) -> Verdict<TargetInfo> {
        self.inspect_with(rel, None)
    }

    /// [`SandboxRoot::inspect`], with which directory each existing parent was as the
    /// walk opened it, outermost first: what the target was found in, in the same look.
    pub fn inspect_walked(&self, rel: &RelPath) -> Verdict<(TargetInfo, Vec<DirId>)> {
        let mut opened = Vec::new();
        let info = self.inspect_with(rel, Some(&mut opened))?;
        Ok((info, opened))
    }

    fn inspect_with(&self, rel: &RelPath, opened: Option<&mut Vec<DirId>>) -> Verdict<TargetInfo> {
        let (entry, existing_parents, folder) = self.walk_entry(rel, opened)?;
        let kind = match entry {
            EntryKind::Missing => TargetKind::Missing,
            EntryKind::Directory => TargetKind::Directory,
            EntryKind::File { links, .. } if links > 1 => {
                return Err(hardlink_refusal(&rel.as_string()));
            }
            EntryKind::File { size, mode, .. } => TargetKind::File { size, mode },
            EntryKind::Symlink => return Err(self.detect_symlink_escape(rel.components())),
            EntryKind::Special => return Err(special_refusal(rel)),
        };
        Ok(TargetInfo {
            kind,
            existing_parents,
            folder,
        })
    }

    /// Refuses (`conflict`) a change at `rel`, found as `info`, that a permission in the
    /// tree forbids this process (a mark, a sticky folder, a mode, a read-only mount, on
    /// the folder it would change: the target's, or the deepest existing one a missing
    /// folder would be made in), so that a simulation or a check foresees what the write
    /// would meet. A runtime running as root is stopped only by marks and read-only
    /// mounts, met at the write (a `conflict` or an `io_error` there), and is not asked.
    /// `syncs_folder`: the write syncs the folder it changes (`strict`).
    pub fn may_change(&self, rel: &RelPath, info: &TargetInfo, syncs_folder: bool) -> Verdict {
        if euid() == 0 || info.kind == TargetKind::Directory {
            return Ok(());
        }
        // The snapshot store the write's snapshot goes in, closed by its mode: as the
        // snapshot would be refused (a store of the wrong kind or owner is refused by
        // its own check).
        self.store_open()?;
        let comps = rel.components();
        let Some(last) = comps.len().checked_sub(1) else {
            return Ok(());
        };
        let changed = &comps[..=info.existing_parents.min(last)];
        let (dir, _) =
            self.open_parent(&RelPath::from_components(changed.to_vec()), false, false)?;
        let shown = shown_path(&changed.join("/"));
        match change_refused(
            &dir,
            changed.last().map_or("", String::as_str),
            &shown,
            syncs_folder,
        ) {
            None => Ok(()),
            Some(why) => Err(Refusal::new(
                ReasonCode::Conflict,
                format!("{why}: give the runtime's user access there, or use another path"),
            )),
        }
    }

    /// Refuses (`reserved_path`) a snapshot store (`.rollback`) this process may not
    /// read, write and search (its mode): no snapshot can be taken or removed there until
    /// the operator gives it back (a rollback, which reads it, may still); and
    /// (`io_error`) one on a read-only filesystem. A store not made yet is open.
    pub fn store_open(&self) -> Verdict {
        use rustix::fs::{Access, AtFlags, accessat};
        let asked = accessat(
            &self.dir,
            super::path::ROLLBACK_DIR,
            Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK,
            AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW,
        );
        // A read-only mount: foreseen, as a mode is, rather than met half way (a prune
        // would have marked the workflow pruned and removed nothing).
        if asked == Err(rustix::io::Errno::ROFS) {
            return Err(Refusal::new(
                ReasonCode::IoError,
                format!(
                    "the snapshot store {} of root {} is on a read-only filesystem, so no snapshot can be taken or removed there: mount it writable, then try again",
                    shown_path(super::path::ROLLBACK_DIR),
                    shown_path(&self.path().display().to_string())
                ),
            ));
        }
        if asked != Err(rustix::io::Errno::ACCESS) {
            return Ok(());
        }
        Err(Refusal::new(
            ReasonCode::ReservedPath,
            format!(
                "the snapshot store {} of root {} is closed to this process (its mode), so no snapshot can be taken or removed there: the operator gives it back to the runtime's user (owned by it, mode 0700)",
                shown_path(super::path::ROLLBACK_DIR),
                shown_path(&self.path().display().to_string())
            ),
        ))
    }

    /// What is at `rel`, whatever it is, and how many of its parents exist. The parents
    /// are walked as for a write (a symlink among them is refused); the last component
    /// is looked at, never opened or followed, so a symlink or a FIFO there is described.
    pub fn entry(&self, rel: &RelPath) -> Verdict<(EntryKind, usize)> {
        self.walk_entry(rel, None)
            .map(|(kind, existing, _)| (kind, existing))
    }

    /// [`SandboxRoot::entry`], with the deepest existing parent's [`DirId`] (see
    /// [`TargetInfo::folder`]), taken from the look the walk makes anyway, and, into
    /// `opened`, each parent's as it was opened (one `fstat` more a folder).
    fn walk_entry(
        &self,
        rel: &RelPath,
        mut opened: Option<&mut Vec<DirId>>,
    ) -> Verdict<(EntryKind, usize, Option<DirId>)> {
        let comps = rel.components();
        let mut dir = ParentDir::Root(&self.dir);
        let parents = rel.parent_components();
        let mut folder = None;
        for (i, comp) in parents.iter().enumerate() {
            match dir.symlink_metadata(comp) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.detect_symlink_escape(&comps[..=i]));
                }
                Ok(m) if m.is_dir() => {
                    dir = match self.descend(&dir, &comps[..=i]) {
                        Ok(d) => ParentDir::Owned(d),
                        // Moved or removed since it was looked at: missing now, as if
                        // not found.
                        Err(r) if r.reason_code == ReasonCode::NotFound => {
                            return Ok((EntryKind::Missing, i, folder));
                        }
                        Err(r) => return Err(r),
                    };
                    folder = Some(DirId::of(&m));
                    if let Some(ids) = opened.as_deref_mut() {
                        let m = dir
                            .dir_metadata()
                            .map_err(|e| io_refusal("inspect", &comps[..=i], &e))?;
                        ids.push(DirId::of(&m));
                    }
                }
                Ok(_) => return Err(not_a_directory(&comps[..=i])),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Ok((EntryKind::Missing, i, folder));
                }
                Err(e) => return Err(io_refusal("inspect", &comps[..=i], &e)),
            }
        }
        let kind = match dir.symlink_metadata(rel.file_name()) {
            Ok(m) if m.file_type().is_symlink() => EntryKind::Symlink,
            Ok(m) if m.is_dir() => {
                // The target itself too: `create_directory` of a mount point "succeeded".
                self.refuse_reserved(&m, comps)?;
                EntryKind::Directory
            }
            Ok(m) if m.is_file() => EntryKind::File {
                size: m.len(),
                mode: m.mode() & 0o7777,
                links: m.nlink(),
            },
            Ok(_) => EntryKind::Special,
            Err(e) if e.kind() == io::ErrorKind::NotFound => EntryKind::Missing,
            Err(e) => return Err(io_refusal("inspect", comps, &e)),
        };
        Ok((kind, parents.len(), folder))
    }

    /// Opens the directory that holds `rel`, walking each parent without following
    /// symlinks. With `create`, missing parents are made (mode 0755) and their
    /// components returned, outermost first.
    pub fn open_parent(
        &self,
        rel: &RelPath,
        create: bool,
        durable: bool,
    ) -> Verdict<(ParentDir<'_>, Vec<String>)> {
        let make = if create { Make::From(0) } else { Make::Nothing };
        self.open_parent_making(rel, make.into(), durable)
    }

    /// [`SandboxRoot::open_parent`], making the missing parents `walk` allows and
    /// finding there the folder it names.
    fn open_parent_making(
        &self,
        rel: &RelPath,
        walk: Walk,
        durable: bool,
    ) -> Verdict<(ParentDir<'_>, Vec<String>)> {
        let mut created = Vec::new();
        match self.descend_making(rel, walk, durable, &mut created) {
            Ok(dir) => Ok((dir, created)),
            Err(r) => Err(made_then(&created, r)),
        }
    }

    /// The walk of [`SandboxRoot::open_parent_making`], adding to `created` each folder
    /// it makes.
    fn descend_making(
        &self,
        rel: &RelPath,
        Walk { make, folder }: Walk,
        durable: bool,
        created: &mut Vec<String>,
    ) -> Verdict<ParentDir<'_>> {
        let comps = rel.components();
        let mut dir = ParentDir::Root(&self.dir);
        for (i, comp) in rel.parent_components().iter().enumerate() {
            match dir.symlink_metadata(comp) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.detect_symlink_escape(&comps[..=i]));
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(not_a_directory(&comps[..=i])),
                Err(e) if e.kind() == io::ErrorKind::NotFound && make.may_make(i) => {
                    let mut builder = DirBuilder::new();
                    builder.mode(DIR_MODE);
                    match dir.create_dir_with(comp, &builder) {
                        Ok(()) => {
                            created.push(comps[..=i].join("/"));
                            if durable {
                                sync_dir(&dir).map_err(|e| io_refusal("sync", &comps[..i], &e))?;
                            }
                        }
                        // Lost a race with another creator: the descent below decides.
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(mkdir_refusal(&dir, &comps[..=i], &e)),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && make != Make::Nothing => {
                    return Err(removed_meanwhile(&comps[..=i]));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(Refusal::new(
                        ReasonCode::NotFound,
                        format!(
                            "the directory {} does not exist",
                            shown_path(&comps[..=i].join("/"))
                        ),
                    ));
                }
                Err(e) => return Err(io_refusal("inspect", &comps[..=i], &e)),
            }
            dir = match self.descend(&dir, &comps[..=i]) {
                Ok(d) => ParentDir::Owned(d),
                Err(r) if r.reason_code == ReasonCode::NotFound && make != Make::Nothing => {
                    return Err(removed_meanwhile(&comps[..=i]));
                }
                Err(r) => return Err(r),
            };
            if let Some((depth, was)) = folder
                && depth == i + 1
                && dir
                    .dir_metadata()
                    .is_ok_and(|m| was.replaced_by(&DirId::of(&m)))
            {
                return Err(not_as_checked(&comps[..=i]));
            }
        }
        Ok(dir)
    }

    /// Reads a regular file (no symlink, no FIFO; opened non-blocking and checked on the
    /// open handle), refusing more than `limit` bytes.
    pub fn read_file(&self, rel: &RelPath, limit: u64) -> Verdict<Vec<u8>> {
        self.read_file_stamped(rel, limit).map(|(bytes, _)| bytes)
    }

    /// [`SandboxRoot::read_file`], with the file's [`FileStamp`] as it was read.
    pub fn read_file_stamped(&self, rel: &RelPath, limit: u64) -> Verdict<(Vec<u8>, FileStamp)> {
        let (dir, _) = self.open_parent(rel, false, false)?;
        read_file_in(&dir, rel.file_name(), limit, true).map_err(|e| self.map_read_error(rel, e))
    }

    /// The size and SHA-256 of a regular file, however large, read in chunks.
    pub fn hash_file(&self, rel: &RelPath, limit: u64) -> Verdict<(u64, Option<String>)> {
        let (dir, _) = self.open_parent(rel, false, false)?;
        hash_regular(&dir, rel.file_name(), limit).map_err(|e| self.map_read_error(rel, e))
    }

    /// Writes `bytes` to `rel` atomically: a temporary file in the same directory,
    /// flushed (and fsync'd when `durable`), then renamed over the target, then the
    /// directory fsync'd. With `no_replace`, an existing target is never replaced
    /// (`already_exists`), even one created a moment ago by someone else; without it, only
    /// a plain file is (see [`Put::Any`]). Missing parents are created; their components
    /// are returned.
    pub fn write_atomic(
        &self,
        rel: &RelPath,
        bytes: &[u8],
        mode: u32,
        no_replace: bool,
        durable: bool,
    ) -> Verdict<Vec<String>> {
        self.write_atomic_put(
            rel,
            bytes,
            mode,
            Put::new_or_any(no_replace),
            Make::From(0),
            (flush_for(durable), None),
        )
    }

    /// [`SandboxRoot::write_atomic`], saying what the rename may replace, which missing
    /// parents may be made, and what is synced: with [`Flush::FileOnly`] the caller makes
    /// the new name durable otherwise (a sync of the whole filesystem), and the folders
    /// made on the way are not synced either. `tmp`: the temporary name, when the caller
    /// must know it (see [`action_temp_name`]); else a fresh one.
    pub fn write_atomic_put(
        &self,
        rel: &RelPath,
        bytes: &[u8],
        mode: u32,
        put: Put,
        walk: impl Into<Walk>,
        (flush, tmp): (Flush, Option<&str>),
    ) -> Verdict<Vec<String>> {
        let (dir, created) =
            self.open_parent_making(rel, walk.into(), flush == Flush::FileAndDir)?;
        let still = || self.still_in_place(&dir, rel);
        write_atomic_placed(
            &dir,
            (rel.file_name(), tmp),
            bytes,
            mode,
            (put, flush),
            &still,
        )
        .map_err(|e| made_then(&created, self.map_write_error_in(&dir, rel, e)))?;
        Ok(created)
    }

    /// `Ok` while `dir`, opened as `rel`'s parent, is still what the root holds at that
    /// path; else the refusal of a write whose folder another program moved meanwhile
    /// (into another root or the state directory, which Landlock allows, or elsewhere
    /// in this root), to be taken back.
    pub(crate) fn still_in_place(&self, dir: &Dir, rel: &RelPath) -> io::Result<()> {
        if self.moved_from(dir, rel) {
            return Err(io::Error::other(moved_while_written(
                rel.parent_components(),
            )));
        }
        Ok(())
    }

    /// Whether `dir`, opened as `rel`'s parent, is no longer what the root holds at that
    /// path: gone, or a link, a file or another folder in its place. One that cannot be
    /// looked at (out of descriptors, a failing disk) is not judged moved.
    fn moved_from(&self, dir: &Dir, rel: &RelPath) -> bool {
        if rel.parent_components().is_empty() {
            return false;
        }
        let Ok(was) = dir.dir_metadata() else {
            return false;
        };
        match self.open_parent(rel, false, false) {
            Ok((now, _)) => now
                .dir_metadata()
                .is_ok_and(|m| (m.dev(), m.ino()) != (was.dev(), was.ino())),
            Err(r) => r.reason_code != ReasonCode::IoError,
        }
    }

    /// `mkdir -p`: creates the directory and missing parents (mode 0755). Returns the
    /// components it created, outermost first; an existing directory is success.
    pub fn create_dir_all(&self, rel: &RelPath, durable: bool) -> Verdict<Vec<String>> {
        self.create_dir_all_making(rel, Make::From(0), durable)
    }

    /// [`SandboxRoot::create_dir_all`], making only the missing components `make`
    /// allows (the directory itself is the last one, at index depth − 1).
    pub fn create_dir_all_making(
        &self,
        rel: &RelPath,
        walk: impl Into<Walk>,
        durable: bool,
    ) -> Verdict<Vec<String>> {
        let walk = walk.into();
        let make = walk.make;
        let (dir, mut created) = self.open_parent_making(rel, walk, durable)?;
        let may_make = make.may_make(rel.parent_components().len());
        match self.make_last(&dir, rel, may_make, durable, &mut created) {
            Ok(()) => Ok(created),
            Err(r) => Err(made_then(&created, r)),
        }
    }

    /// The last step of [`SandboxRoot::create_dir_all_making`]: the directory itself in
    /// its parent `dir`, made when `may_make` (added to `created`), else found there.
    fn make_last(
        &self,
        dir: &ParentDir<'_>,
        rel: &RelPath,
        may_make: bool,
        durable: bool,
        created: &mut Vec<String>,
    ) -> Verdict {
        let name = rel.file_name();
        let mut builder = DirBuilder::new();
        builder.mode(DIR_MODE);
        let made = if may_make {
            dir.create_dir_with(name, &builder)
        } else {
            Err(io::ErrorKind::AlreadyExists.into())
        };
        match made {
            Ok(()) => {
                created.push(rel.as_string());
                if durable {
                    sync_dir(dir).map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let m = match dir.symlink_metadata(name) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !may_make => {
                        return Err(removed_meanwhile(rel.components()));
                    }
                    found => found.map_err(|e| io_refusal("inspect", rel.components(), &e))?,
                };
                if m.file_type().is_symlink() {
                    return Err(self.detect_symlink_escape(rel.components()));
                }
                if m.is_dir() {
                    self.refuse_reserved(&m, rel.components())?;
                } else {
                    return Err(Refusal::new(
                        ReasonCode::AlreadyExists,
                        format!(
                            "{} exists and is not a directory",
                            shown_path(&rel.as_string())
                        ),
                    ));
                }
            }
            Err(e) => return Err(mkdir_refusal(dir, rel.components(), &e)),
        }
        Ok(())
    }

    /// Removes a regular file (never following a symlink; a symlink found there is left
    /// alone and refused). A missing file is success.
    pub fn remove_file(&self, rel: &RelPath, durable: bool) -> Verdict {
        self.remove_file_put(rel, Put::Any, durable).map(|_| ())
    }

    /// [`SandboxRoot::remove_file`], removing only the file as it was read when `put` is
    /// [`Put::Unchanged`], and none when it is [`Put::New`] (`conflict` otherwise, and
    /// the file stays). Whether it was found: `false` when a directory on the way is
    /// missing, or, for [`Put::Unchanged`], the file itself is gone since it was read
    /// (its folder may have been swapped for another): it may live on where it was
    /// moved, and nothing tells that it was removed.
    pub fn remove_file_put(&self, rel: &RelPath, put: Put, durable: bool) -> Verdict<bool> {
        let (dir, _) = match self.open_parent(rel, false, false) {
            Ok(d) => d,
            Err(r) if r.reason_code == ReasonCode::NotFound => return Ok(false),
            Err(r) => return Err(r),
        };
        match dir.symlink_metadata(rel.file_name()) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(self.detect_symlink_escape(rel.components()));
            }
            Ok(m) if m.is_dir() => {
                return Err(Refusal::new(
                    ReasonCode::NotRegularFile,
                    format!(
                        "{} is a directory, not a file",
                        shown_path(&rel.as_string())
                    ),
                ));
            }
            Ok(m) => {
                let changed = match put {
                    Put::Unchanged(was) if FileStamp::of(&m) == was => {
                        // Its folder moved away meanwhile (into another root, say), the
                        // file is no longer the one at this path: left where it went.
                        let still = || {
                            if self.moved_from(&dir, rel) {
                                return Err(moved_while_removed(rel));
                            }
                            Ok(())
                        };
                        let found = files::remove_unwritten(&dir, rel.file_name(), was, &still)
                            .map_err(|e| self.map_error("remove", rel, e))?;
                        if found && durable {
                            sync_dir(&dir)
                                .map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
                        }
                        return Ok(found);
                    }
                    Put::Unchanged(_) => {
                        refusal::only_plain(&rel.as_string(), &m)?;
                        true
                    }
                    // Judged missing: a file there now is someone else's since, or
                    // came back with its folder.
                    Put::New => return Err(appeared_meanwhile(&rel.as_string())),
                    // Taken as it is (a forced rollback), the target is still only ever
                    // a plain file removed: a special file or another link another
                    // program put there since it was judged stays.
                    Put::Any => {
                        refusal::only_plain(&rel.as_string(), &m)?;
                        false
                    }
                };
                if changed {
                    return Err(changed_meanwhile(&rel.as_string()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(!matches!(put, Put::Unchanged(_)));
            }
            Err(e) => return Err(io_refusal("inspect", rel.components(), &e)),
        }
        dir.remove_file(rel.file_name())
            .map_err(|e| io_refusal("remove", rel.components(), &e))?;
        if durable {
            sync_dir(&dir).map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
        }
        Ok(true)
    }

    /// Removes a directory if it is empty and, with `only`, is that directory. Returns
    /// whether it was removed; a missing, non-empty or other directory is left as it is.
    pub fn remove_empty_dir(
        &self,
        rel: &RelPath,
        only: Option<DirId>,
        durable: bool,
    ) -> Verdict<bool> {
        let (dir, _) = match self.open_parent(rel, false, false) {
            Ok(d) => d,
            Err(r) if r.reason_code == ReasonCode::NotFound => return Ok(false),
            Err(r) => return Err(r),
        };
        match dir.symlink_metadata(rel.file_name()) {
            Ok(m) if m.is_dir() && only.is_none_or(|id| id == DirId::of(&m)) => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_refusal("inspect", rel.components(), &e)),
        }
        match dir.remove_dir(rel.file_name()) {
            Ok(()) => {
                if durable {
                    sync_dir(&dir).map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_refusal("remove directory", rel.components(), &e)),
        }
    }

    /// Which directory `rel` is; `None` when it is missing or not a directory.
    pub fn dir_id(&self, rel: &RelPath) -> Verdict<Option<DirId>> {
        let (dir, _) = match self.open_parent(rel, false, false) {
            Ok(d) => d,
            Err(r) if r.reason_code == ReasonCode::NotFound => return Ok(None),
            Err(r) => return Err(r),
        };
        match dir.symlink_metadata(rel.file_name()) {
            Ok(m) if m.is_dir() => Ok(Some(DirId::of(&m))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_refusal("inspect", rel.components(), &e)),
        }
    }

    /// Lists a directory (the root's top for `None`), each entry described, in name
    /// order.
    pub fn list_dir(&self, rel: Option<&RelPath>) -> Verdict<Vec<DirEntryInfo>> {
        Ok(self.list_dir_page(rel, &|_| true, 0, usize::MAX)?.entries)
    }

    /// A page of a directory's entries in name order: at most `limit` from `offset`
    /// among those whose names `shown` keeps. Only the page's entries are described (a
    /// `stat` each): a folder of a hundred thousand files is paged through at the cost
    /// of reading and sorting its names.
    pub fn list_dir_page(
        &self,
        rel: Option<&RelPath>,
        shown: &dyn Fn(&str) -> bool,
        offset: usize,
        limit: usize,
    ) -> Verdict<DirPage> {
        let dir = self.listed_dir(rel)?;
        let listed = rel.map_or(&[][..], RelPath::components);
        let entries = dir.entries().map_err(|e| io_refusal("list", listed, &e))?;
        let mut names = Vec::new();
        for entry in entries {
            let raw = entry
                .map_err(|e| io_refusal("list", listed, &e))?
                .file_name();
            let name = raw.to_string_lossy().into_owned();
            if shown(&name) {
                names.push((name, raw));
            }
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let total = names.len();
        let mut out = Vec::new();
        let mut next = offset.min(total);
        for (name, raw) in names.into_iter().skip(offset).take(limit) {
            next += 1;
            let meta = match dir.symlink_metadata(&raw) {
                Ok(meta) => meta,
                // Removed or renamed since the directory was read (another program, or
                // a write's temporary file put in place): a listing tells what is there.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_refusal("list", listed, &e)),
            };
            let ft = meta.file_type();
            let kind = if ft.is_symlink() {
                PathKind::Symlink
            } else if ft.is_dir() {
                PathKind::Directory
            } else if ft.is_file() {
                PathKind::File
            } else {
                PathKind::Special
            };
            // A file with other links may be one outside the root: its size is not told,
            // as its bytes are never read.
            let other_links = ft.is_file() && meta.nlink() > 1;
            out.push(DirEntryInfo {
                name,
                not_utf8: raw.to_str().is_none(),
                kind,
                size_bytes: (ft.is_file() && !other_links).then(|| meta.len()),
                other_links,
            });
        }
        Ok(DirPage {
            entries: out,
            total,
            next_offset: (next < total).then_some(next),
        })
    }

    /// Whether the directory `rel` has no entry (its names read, none described).
    pub fn is_empty_dir(&self, rel: &RelPath) -> Verdict<bool> {
        Ok(self.count_entries(rel, 1)? == 0)
    }

    /// How many entries the directory `rel` has, counting no further than `up_to`.
    pub fn count_entries(&self, rel: &RelPath, up_to: usize) -> Verdict<usize> {
        let dir = self.listed_dir(Some(rel))?;
        let entries = dir
            .entries()
            .map_err(|e| io_refusal("list", rel.components(), &e))?;
        let mut n = 0;
        for entry in entries.take(up_to) {
            entry.map_err(|e| io_refusal("list", rel.components(), &e))?;
            n += 1;
        }
        Ok(n)
    }

    /// The directory `rel` names, opened to be listed (the root's for `None`), or why
    /// there is none to list.
    fn listed_dir(&self, rel: Option<&RelPath>) -> Verdict<ParentDir<'_>> {
        Ok(match rel {
            None => ParentDir::Root(&self.dir),
            Some(rel) => {
                let (parent, _) = self.open_parent(rel, false, false)?;
                let full = rel.components();
                match parent.symlink_metadata(rel.file_name()) {
                    Ok(m) if m.file_type().is_symlink() => {
                        return Err(self.detect_symlink_escape(full));
                    }
                    Ok(m) if m.is_dir() => {}
                    Ok(m) => {
                        return Err(Refusal::new(
                            ReasonCode::NotFound,
                            format!(
                                "{} is a {}, not a directory: there is nothing to list; describe it with get_file_info{}",
                                shown_path(&rel.as_string()),
                                if m.is_file() { "file" } else { "special file" },
                                if m.is_file() {
                                    " or read it with read_file"
                                } else {
                                    ""
                                }
                            ),
                        ));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        return Err(Refusal::new(
                            ReasonCode::NotFound,
                            format!(
                                "the directory {} does not exist",
                                shown_path(&rel.as_string())
                            ),
                        ));
                    }
                    Err(e) => return Err(io_refusal("inspect", full, &e)),
                }
                ParentDir::Owned(self.descend(&parent, full)?)
            }
        })
    }

    /// Opens the directory `comps` names in `dir`, which was one a moment ago. One gone
    /// meanwhile (moved or removed by another program) is `not_found`, for the caller to
    /// judge as it judges one never there.
    fn descend(&self, dir: &Dir, comps: &[String]) -> Verdict<Dir> {
        let name = comps.last().map_or("", String::as_str);
        let opened = dir.open_dir_nofollow(name).map_err(|e| {
            // The component was a real directory a moment ago: a failure to open it
            // without following links means it was swapped, most likely for a symlink.
            if e.kind() == io::ErrorKind::NotADirectory || is_escape_error(&e) {
                self.detect_symlink_escape(comps)
            } else if e.kind() == io::ErrorKind::NotFound {
                Refusal::new(
                    ReasonCode::NotFound,
                    format!(
                        "the directory {} does not exist",
                        shown_path(&comps.join("/"))
                    ),
                )
            } else {
                io_refusal("open directory", comps, &e)
            }
        })?;
        if !self.reserved.is_empty() {
            let m = opened
                .dir_metadata()
                .map_err(|e| io_refusal("open directory", comps, &e))?;
            self.refuse_reserved(&m, comps)?;
        }
        Ok(opened)
    }

    /// Refuses a directory (`m`, at `comps`) that is the state directory, one of its
    /// folders or another root, mounted into this root.
    fn refuse_reserved(&self, m: &cap_std::fs::Metadata, comps: &[String]) -> Verdict {
        match self
            .reserved
            .iter()
            .find(|(id, _)| *id == (m.dev(), m.ino()))
        {
            Some((_, what)) => Err(Refusal::new(
                ReasonCode::ReservedPath,
                format!(
                    "{} is {what}, mounted into this root; actions never reach it through another root",
                    shown_path(&comps.join("/"))
                ),
            )),
            None => Ok(()),
        }
    }

    /// Makes the directories `ids` (`(st_dev, st_ino)`, each with what it is: the state
    /// directory and its folders, the other roots) unreachable beneath this root. Paths
    /// tell a directory inside a root from the state directory or another root, but not
    /// a bind mount of one into the other: the identity of every directory an action
    /// passes through does.
    pub fn reserve(&mut self, ids: Vec<((u64, u64), String)>) {
        self.reserved = ids;
    }

    pub(crate) fn map_open_error(&self, rel: &RelPath, e: io::Error) -> Refusal {
        self.map_error("write", rel, e)
    }

    /// [`SandboxRoot::map_open_error`] for a write through `dir`, opened as `rel`'s
    /// parent: one refused for its permissions because `dir` was moved out of the root
    /// meanwhile (Landlock refuses a write outside it) says so, rather than blame a
    /// permission someone set.
    pub(crate) fn map_write_error_in(&self, dir: &Dir, rel: &RelPath, e: io::Error) -> Refusal {
        // One moved out and back before the look cannot be told from a permission; a
        // hint that it might have been would send every real one to try again.
        if is_denied(&e) && self.moved_from(dir, rel) {
            return moved_meanwhile(rel.parent_components());
        }
        // A name made in a folder already removed is refused ENOENT: the race of a
        // rollback taking an emptied folder away, which "does not exist" would blame on
        // the caller's path.
        if e.kind() == io::ErrorKind::NotFound && removed_as_opened(dir) {
            return removed_meanwhile(rel.parent_components());
        }
        self.map_open_error(rel, e)
    }

    /// [`SandboxRoot::map_open_error`] for a read: what failed is named as a read.
    fn map_read_error(&self, rel: &RelPath, e: io::Error) -> Refusal {
        self.map_error("read", rel, e)
    }

    fn map_error(&self, what: &str, rel: &RelPath, e: io::Error) -> Refusal {
        match e.kind() {
            io::ErrorKind::AlreadyExists => Refusal::new(
                ReasonCode::AlreadyExists,
                format!("{} already exists", shown_path(&rel.as_string())),
            ),
            io::ErrorKind::NotFound => Refusal::new(
                ReasonCode::NotFound,
                format!("{} does not exist", shown_path(&rel.as_string())),
            ),
            _ if crate::error::is_link_loop(&e) => self.detect_symlink_escape(rel.components()),
            _ if is_escape_error(&e) => self.detect_symlink_escape(rel.components()),
            _ => match e.get_ref().and_then(|inner| {
                inner
                    .downcast_ref::<Refusal>()
                    .or_else(|| inner.downcast_ref::<files::TempHoldsKept>().map(|k| &k.0))
            }) {
                Some(r) => named_in_full(r.clone(), rel),
                None => io_refusal(what, rel.components(), &e),
            },
        }
    }

    /// SPEC's `detect_symlink_escape`: classifies the symlink at `comps` (root-relative,
    /// met by a walk that follows none): `symlink_escape` when it, or the chain it
    /// starts, leads outside the root by the text of its targets, read through the root
    /// handle; `symlink_refused` otherwise. It words and counts the refusal; the walk
    /// that never follows a link is what confines.
    pub fn detect_symlink_escape(&self, comps: &[String]) -> Refusal {
        let shown = shown_path(&comps.join("/"));
        let escape = Refusal::new(
            ReasonCode::SymlinkEscape,
            format!(
                "{shown} is a symbolic link that leads outside the sandbox root; symlinks are never followed"
            ),
        );
        let inside = Refusal::new(
            ReasonCode::SymlinkRefused,
            format!(
                "{shown} is a symbolic link; symlinks are never followed, even inside the sandbox"
            ),
        );
        let mut current: Vec<String> = comps.to_vec();
        for _ in 0..SYMLINK_HOPS {
            let link: PathBuf = current.iter().collect();
            let target = match self.dir.read_link_contents(&link) {
                Ok(target) => target,
                // Every caller comes here because the name was a symlink, or was refused
                // as one, a moment ago. Gone now, or no longer a link: it was swapped
                // while being checked, and where it led cannot be known any more. A swap
                // back and forth is how an escape is attempted, so it is counted as one.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::InvalidInput
                    ) =>
                {
                    return Refusal::new(
                        ReasonCode::SymlinkEscape,
                        format!(
                            "{} was swapped for a symbolic link and back while it was being checked; symlinks are never followed",
                            shown_path(&link.to_string_lossy())
                        ),
                    );
                }
                Err(e) if is_escape_error(&e) => return escape,
                Err(_) => return inside,
            };
            // Where it leads, spelled from `/` (a relative target from the link's folder
            // under the root's path), then taken back under the root if it lies there: a
            // link that climbs out by `..` and names the root again stays inside.
            let root = path_strings(&self.path);
            let mut parts = Vec::new();
            if !target.is_absolute() {
                parts.extend(root.iter().cloned());
                parts.extend(current[..current.len().saturating_sub(1)].iter().cloned());
            }
            parts.extend(path_strings(&target));
            let next = lexical_normalize(parts)
                .filter(|abs| abs.starts_with(&root))
                .map(|abs| abs[root.len()..].to_vec());
            let Some(next) = next else { return escape };
            if next.is_empty() {
                return inside;
            }
            let next_path: PathBuf = next.iter().collect();
            match self.dir.symlink_metadata(&next_path) {
                Ok(m) if m.file_type().is_symlink() => current = next,
                _ => return inside,
            }
        }
        inside
    }
}

/// A page of a directory listing ([`SandboxRoot::list_dir_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// The page's entries, in name order.
    pub entries: Vec<DirEntryInfo>,
    /// How many entries the listing has in all.
    pub total: usize,
    /// Where the next page starts, when one is left.
    pub next_offset: Option<usize>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DirEntryInfo {
    /// The entry's name (bytes that are not UTF-8 shown as U+FFFD).
    pub name: String,
    /// Set when the name on disk is not UTF-8: `name` is then only a likeness of it, and
    /// no path given as text can name the entry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_utf8: bool,
    /// What the entry is (never [`PathKind::Missing`]).
    pub kind: PathKind,
    /// Size of a regular file with one link; none otherwise (null in JSON, as for
    /// `get_file_info`: a folder has no size, and a 0 would read as an empty file).
    pub size_bytes: Option<u64>,
    /// Set for a regular file with other hard links: it may alias a file outside the
    /// root, so it is never read or written, and its size is not given.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub other_links: bool,
}

/// Makes the modes the runtime asks for the modes it gets, whatever umask the process
/// inherited: new files 0644 and directories 0755 (SPEC §2), a replaced or restored file
/// its own earlier mode (without an execute bit; with read and write for its owner when
/// the runtime is not root, whose file it then is), the state directory's files 0600. The
/// runtime never chmods, so the mask is what would decide otherwise. Programs call it once
/// at start-up, before any thread; a library caller keeps its own mask. The mask is the
/// whole process's: afterwards every file anything in the process makes gets the mode it
/// asks for (0666 and 0777 through `std::fs`).
pub fn use_spec_creation_modes() {
    rustix::process::umask(rustix::fs::Mode::empty());
}

/// A directory handle on the way to a target: the root's own handle for a target at the
/// top (no descriptor duplicated on the common path), else a handle opened beneath it.
#[derive(Debug)]
pub enum ParentDir<'a> {
    /// The root itself.
    Root(&'a Dir),
    /// A directory opened beneath the root.
    Owned(Dir),
}

impl ParentDir<'_> {
    /// An owned handle (a duplicate of the root's when it is the root).
    pub fn into_owned(self) -> io::Result<Dir> {
        match self {
            ParentDir::Root(d) => d.try_clone(),
            ParentDir::Owned(d) => Ok(d),
        }
    }
}

impl std::ops::Deref for ParentDir<'_> {
    type Target = Dir;

    fn deref(&self) -> &Dir {
        match self {
            ParentDir::Root(d) => d,
            ParentDir::Owned(d) => d,
        }
    }
}

/// cap-std reports an escape as `PermissionDenied` with no OS error number.
pub fn is_escape_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

/// The first pair of roots `(outer, inner)` where `inner` is `outer` or lies inside it
/// (see [`SandboxRoot::contains`]). The configuration compares the paths as written; this
/// catches the overlaps that symlinks hide.
pub fn nested_roots(roots: &[SandboxRoot]) -> Option<(usize, usize)> {
    roots.iter().enumerate().find_map(|(i, outer)| {
        roots
            .iter()
            .enumerate()
            .find(|&(j, inner)| i != j && outer.contains(inner))
            .map(|(j, _)| (i, j))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::refusal::swapped_while_read;
    use super::*;

    /// A file's lock is named alike through a root and a root inside it, and in another
    /// case or normalization of its name.
    #[test]
    fn a_files_lock_is_named_by_its_real_path_folded() {
        let through = |root: &str, rel: &str| lock_hash(lock_hash(LOCK_HASH_START, root), rel);
        let name = through("/srv/sandbox", "sub/notes/caf\u{e9}.md");
        assert_eq!(name, through("/srv/sandbox/sub", "notes/caf\u{e9}.md"));
        assert_eq!(name, through("/srv/sandbox/sub/notes/", "caf\u{e9}.md"));
        assert_eq!(name, through("/SRV/Sandbox", "Sub/NOTES/CAF\u{c9}.md"));
        assert_eq!(name, through("/srv/sandbox", "sub/notes/cafe\u{301}.md"));
        assert_ne!(name, through("/srv/sandbox", "sub/notes/cafe.md"));
        assert_ne!(name, through("/srv/sandbox", "subnotes/caf\u{e9}.md"));
    }

    fn root() -> (tempfile::TempDir, SandboxRoot) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("root");
        let root = SandboxRoot::open(&path, true).unwrap();
        (tmp, root)
    }

    /// A root holding the file `at` ("read"), its folders made, read and stamped as a
    /// removal judges it: the root's temporary folder, the root, its path, the file's
    /// and its stamp.
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn read_at(
        at: &str,
    ) -> (
        tempfile::TempDir,
        SandboxRoot,
        std::path::PathBuf,
        RelPath,
        FileStamp,
    ) {
        let (tmp, root) = root();
        let folder = tmp.path().join("root");
        let path = folder.join(at);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"read").unwrap();
        let rel = RelPath::from_components(comps(at));
        let (_, stamp) = root.read_file_stamped(&rel, 1024).unwrap();
        (tmp, root, folder, rel, stamp)
    }

    /// A file stamped as it is read is stamped alike by the one-look `stamp_at` below
    /// its root, and differently once replaced: a store's owner record is not read again
    /// at each snapshot while it stands unchanged.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_is_stamped_alike_by_its_read_and_by_one_look() {
        let (_tmp, root) = root();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"one").unwrap();
        let d = root.dir().open_dir("d").unwrap();
        let (_, read) = read_file_in(&d, "f", 64, true).unwrap();
        assert_eq!(stamp_at(root.dir(), "d/f").unwrap(), Some(read));
        write_atomic_in(&d, "f", b"two", 0o600, false, false).unwrap();
        assert_ne!(stamp_at(root.dir(), "d/f").unwrap(), Some(read));
        std::fs::remove_file(root.path().join("d/f")).unwrap();
        assert_eq!(stamp_at(root.dir(), "d/f").unwrap(), None);
    }

    /// A refusal worded below, where only the file's name in its folder is known, names
    /// the file by its path in the root.
    #[test]
    fn refusals_met_in_a_folder_name_the_whole_path() {
        let (_tmp, root) = root();
        let rel = RelPath::from_components(comps("a/b/x.json"));
        for r in [changed_meanwhile("x.json"), swapped_while_read("x.json")] {
            let said = root.map_error("write", &rel, io::Error::other(r)).reason;
            assert!(said.starts_with("'a/b/x.json' was "), "{said}");
        }
        let top = RelPath::from_components(comps("x.json"));
        let said = root
            .map_error("write", &top, io::Error::other(changed_meanwhile("x.json")))
            .reason;
        assert!(said.starts_with("'x.json' was "), "{said}");
    }

    /// Another program renaming its own file over a write's temporary name just before
    /// the rename (a hard link to a file outside the root, a FIFO) does not have it
    /// reported written: the write is refused as a conflict, the file outside keeps its
    /// bytes, and a file being replaced stays in place rather than being lost to the
    /// planted one. A staged write is checked the same way.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, linking by path
    fn a_temporary_file_replaced_before_its_rename_is_not_taken_for_the_write() {
        let (tmp, root) = root();
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, b"outside").unwrap();
        let rel = RelPath::from_components(comps("t.txt"));
        let folder = tmp.path().join("root");
        let plant = |outside: &std::path::Path, folder: &std::path::Path, name: &str| {
            let planted = folder.join("planted");
            std::fs::hard_link(outside, &planted).unwrap();
            std::fs::rename(&planted, folder.join(name)).unwrap();
        };
        // A write of `bytes` with the other program planting its link over the
        // temporary name just before the rename.
        let raced = |put: Put, bytes: &[u8]| {
            let (o, f) = (outside.clone(), folder.clone());
            files::BEFORE_RENAME.with(|hook| {
                hook.set(Some(Box::new(move |_: &Dir, tmp: &str| plant(&o, &f, tmp))));
            });
            root.write_atomic_put(
                &rel,
                bytes,
                0o644,
                put,
                Make::From(0),
                (Flush::Nothing, None),
            )
            .unwrap_err()
        };
        let r = raced(Put::New, b"new");
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(r.reason.contains("did not take its place"), "{}", r.reason);
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
        // Left alone, the write is made and checked.
        std::fs::remove_file(folder.join("t.txt")).unwrap();
        root.write_atomic_put(
            &rel,
            b"new",
            0o644,
            Put::New,
            Make::From(0),
            (Flush::Nothing, None),
        )
        .unwrap();
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"new");
        // Replacing a file, the file there is kept, not lost to the planted one, and
        // the planted name goes.
        use std::os::unix::fs::MetadataExt as _;
        let before = std::fs::metadata(folder.join("t.txt")).unwrap().ino();
        let r = raced(Put::Any, b"newer");
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"new");
        assert_eq!(
            std::fs::metadata(folder.join("t.txt")).unwrap().ino(),
            before
        );
        assert_eq!(
            std::fs::metadata(&outside).unwrap().nlink(),
            1,
            "planted name gone"
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
        let staged = root
            .stage_write(
                &rel,
                Make::Nothing,
                &files::temp_name(),
                b"newer",
                0o644,
                None,
            )
            .unwrap();
        plant(&outside, &folder, staged.staged_name());
        let e = staged.commit(Put::Any, false).unwrap_err();
        staged.discard();
        let r = root.map_error("write", &rel, e);
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"new");
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
        // The planted file taken away from the target's name before the exchange is
        // undone: the file replaced goes back there, not out with the temporary name.
        files::AFTER_EXCHANGE.with(|hook| {
            hook.set(Some(Box::new(|dir: &Dir, _: &str| {
                dir.remove_file("t.txt").unwrap();
            })));
        });
        let r = raced(Put::Any, b"newest");
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&outside).unwrap().nlink(), 1);
        let names = names_in(&folder);
        assert_eq!(names, ["t.txt"], "no name left beside it");
    }

    /// Writes `new` over `t.txt` (holding `read`, read first) in a fresh root, with
    /// `after_exchange` playing another program just after the exchange (given the root's
    /// folder, a file outside holding `outside`, and the temporary name); the refusal,
    /// the folder and the outside file, and the root's directories.
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn raced_after_exchange(
        after_exchange: fn(&Path, &Path, &str),
    ) -> (Refusal, PathBuf, PathBuf, tempfile::TempDir) {
        let (tmp, root) = root();
        let folder = tmp.path().join("root");
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, b"outside").unwrap();
        std::fs::write(folder.join("t.txt"), b"read").unwrap();
        let rel = RelPath::from_components(comps("t.txt"));
        let (_, stamp) = root.read_file_stamped(&rel, 1024).unwrap();
        let (o, f) = (outside.clone(), folder.clone());
        files::AFTER_EXCHANGE.with(|hook| {
            hook.set(Some(Box::new(move |_: &Dir, tmp: &str| {
                after_exchange(&f, &o, tmp);
            })));
        });
        let r = root
            .write_atomic_put(
                &rel,
                b"new",
                0o644,
                Put::Unchanged(stamp),
                Make::From(0),
                (Flush::Nothing, None),
            )
            .unwrap_err();
        (r, folder, outside, tmp)
    }

    /// After the exchange, another program renames a symbolic link (or a FIFO) over the
    /// temporary name, where the file replaced waits to be removed; nothing tells that
    /// from a link put at the target just before the exchange: either way it goes back
    /// under the target's name, never removed, and the write is refused, nothing of it
    /// left.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn what_is_renamed_over_the_file_replaced_is_never_removed() {
        let (r, folder, outside, _tmp) = raced_after_exchange(|f, o, tmp| {
            let planted = f.join("planted");
            std::os::unix::fs::symlink(o, &planted).unwrap();
            std::fs::rename(&planted, f.join(tmp)).unwrap();
        });
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(
            std::fs::symlink_metadata(folder.join("t.txt"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let names = names_in(&folder);
        assert_eq!(
            names,
            ["t.txt"],
            "the new bytes went with the temporary name"
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    }

    /// A hard link to a file outside, put at the target between the look that finds the
    /// file read there and the exchange, is exchanged back, never removed: the outside
    /// file keeps its link.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_link_put_at_the_target_just_before_the_exchange_goes_back() {
        use std::os::unix::fs::MetadataExt as _;
        // What the exchange then took out: the link (the file read moved away).
        let (r, folder, outside, _tmp) = raced_after_exchange(|f, o, tmp| {
            std::fs::rename(f.join(tmp), f.join("moved.txt")).unwrap();
            std::fs::hard_link(o, f.join(tmp)).unwrap();
        });
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(std::fs::metadata(&outside).unwrap().nlink(), 2);
        assert_eq!(
            std::fs::metadata(folder.join("t.txt")).unwrap().ino(),
            std::fs::metadata(&outside).unwrap().ino()
        );
        assert_eq!(std::fs::read(folder.join("moved.txt")).unwrap(), b"read");
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    }

    /// Another program's append to the file read, landing just before the exchange (here
    /// just after, into the same file, which comes to the same): the file goes back
    /// with those bytes, the write refused, rather than be removed with them.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn an_append_to_the_file_read_just_before_the_exchange_is_kept() {
        let (r, folder, _outside, _tmp) =
            raced_after_exchange(|f, _, tmp| append_as_another_program(&f.join(tmp)));
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(
            std::fs::read(folder.join("t.txt")).unwrap(),
            b"read and more"
        );
        let names = names_in(&folder);
        assert_eq!(
            names,
            ["t.txt"],
            "the new bytes went with the temporary name"
        );
    }

    /// The names in `folder`, sorted.
    #[allow(clippy::disallowed_methods)] // the test looks as a person would, by path
    fn names_in(folder: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// A folder another program moves away (here into another root) while a write puts
    /// its file there takes no write: the file replaced goes back, a new file is taken
    /// back, nothing of the write is left where the folder went, and the write is
    /// refused `conflict` naming the folder.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_folder_moved_away_as_the_write_lands_takes_nothing() {
        for replacing in [true, false] {
            let (tmp, root) = root();
            let (folder, elsewhere) = (tmp.path().join("root/d"), tmp.path().join("other"));
            std::fs::create_dir(&folder).unwrap();
            std::fs::create_dir(&elsewhere).unwrap();
            let rel = RelPath::from_components(comps("d/t.txt"));
            let put = if replacing {
                std::fs::write(folder.join("t.txt"), b"read").unwrap();
                Put::Unchanged(root.read_file_stamped(&rel, 1024).unwrap().1)
            } else {
                Put::New
            };
            let (from, to) = (folder.clone(), elsewhere.join("d"));
            let mover: files::RaceHook = Box::new(move |_: &Dir, _: &str| {
                std::fs::rename(&from, &to).unwrap();
            });
            if replacing {
                files::AFTER_EXCHANGE.with(|hook| hook.set(Some(mover)));
            } else {
                files::BEFORE_RENAME.with(|hook| hook.set(Some(mover)));
            }
            let r = root
                .write_atomic_put(
                    &rel,
                    b"new",
                    0o644,
                    put,
                    Make::Nothing,
                    (Flush::Nothing, None),
                )
                .unwrap_err();
            assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
            assert!(r.reason.contains("'d' was moved away"), "{}", r.reason);
            let moved = elsewhere.join("d");
            if replacing {
                assert_eq!(names_in(&moved), ["t.txt"]);
                assert_eq!(std::fs::read(moved.join("t.txt")).unwrap(), b"read");
            } else {
                assert!(names_in(&moved).is_empty(), "{:?}", names_in(&moved));
            }
        }
    }

    /// A new file that cannot be taken back where its moved folder went (Landlock refuses
    /// it there, outside every root) is said to be there, never "nothing of it left".
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_new_file_not_taken_back_is_said_to_be_where_its_folder_went() {
        let (tmp, root) = root();
        let (folder, elsewhere) = (tmp.path().join("root/d"), tmp.path().join("other"));
        std::fs::create_dir(&folder).unwrap();
        let to = elsewhere.clone();
        files::BEFORE_RENAME.with(|hook| {
            hook.set(Some(Box::new(move |_: &Dir, _: &str| {
                std::fs::rename(&folder, &to).unwrap();
            })))
        });
        files::FAIL_UNDO.set(Some(rustix::io::Errno::ACCESS.raw_os_error()));
        let rel = RelPath::from_components(comps("d/t.txt"));
        let r = root
            .write_atomic_put(
                &rel,
                b"new",
                0o644,
                Put::New,
                Make::Nothing,
                (Flush::Nothing, None),
            )
            .unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(r.reason.contains("could not be taken back"), "{}", r.reason);
        assert!(!r.reason.contains("nothing of it left"), "{}", r.reason);
        assert_eq!(std::fs::read(elsewhere.join("t.txt")).unwrap(), b"new");
    }

    /// Appends " and more" to `path`, as another program would.
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn append_as_another_program(path: &Path) {
        use std::io::Write as _;
        let mut other = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        other.write_all(b" and more").unwrap();
    }

    /// A write given up whose exchange of names cannot be undone (the disk refuses it)
    /// leaves its new bytes in place and says so; the file it took out, appended to by
    /// another program, is kept under a name of its own, which the refusal gives, not
    /// removed with the write's temporary file.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_replaced_that_cannot_be_put_back_is_kept_under_a_name_of_its_own() {
        files::FAIL_UNDO.set(Some(rustix::io::Errno::IO.raw_os_error()));
        let (r, folder, _outside, _tmp) =
            raced_after_exchange(|f, _, tmp| append_as_another_program(&f.join(tmp)));
        assert_eq!(r.reason_code, ReasonCode::IoError, "{}", r.reason);
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"new");
        let kept: Vec<_> = names_in(&folder)
            .into_iter()
            .filter(|n| n != "t.txt")
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        // No temporary name, which a later start would remove as a dead process's.
        assert!(kept[0].starts_with(".ailab-kept-"), "{kept:?}");
        assert_eq!(
            std::fs::read(folder.join(&kept[0])).unwrap(),
            b"read and more"
        );
        assert!(r.reason.contains(&kept[0]), "{}", r.reason);
    }

    /// A removal of the file as read (a rollback taking away a file its action made)
    /// moves it aside first: another program's append landing up to that move puts it
    /// back, bytes and all (`conflict`); should another file have taken its name by
    /// then, both stay, the refusal naming where. Unwritten, it goes, nothing left;
    /// should the disk refuse that, it goes back under its name.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_appended_to_as_it_is_removed_is_kept() {
        for case in [
            "unwritten",
            "appended",
            "appended, name taken",
            "unwritten, removal refused",
        ] {
            if case == "unwritten, removal refused" {
                files::FAIL_UNDO.set(Some(rustix::io::Errno::IO.raw_os_error()));
            }
            let (_tmp, root, folder, rel, stamp) = read_at("t.txt");
            let f = folder.clone();
            files::AFTER_EXCHANGE.with(|hook| {
                hook.set(Some(Box::new(move |_: &Dir, aside: &str| {
                    if case.starts_with("appended") {
                        append_as_another_program(&f.join(aside));
                    }
                    if case == "appended, name taken" {
                        std::fs::write(f.join("t.txt"), b"newcomer").unwrap();
                    }
                })));
            });
            let removed = root.remove_file_put(&rel, Put::Unchanged(stamp), false);
            let names = names_in(&folder);
            match case {
                "unwritten" => {
                    assert_eq!(removed, Ok(true), "{case}");
                    assert!(names.is_empty(), "{case}: {names:?}");
                }
                "unwritten, removal refused" => {
                    let r = removed.unwrap_err();
                    assert_eq!(r.reason_code, ReasonCode::IoError, "{}", r.reason);
                    assert_eq!(names, ["t.txt"], "{case}: back under its name");
                    assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"read");
                }
                "appended" => {
                    let r = removed.unwrap_err();
                    assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
                    assert_eq!(names, ["t.txt"], "{case}");
                    assert_eq!(
                        std::fs::read(folder.join("t.txt")).unwrap(),
                        b"read and more"
                    );
                }
                _ => {
                    let r = removed.unwrap_err();
                    assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
                    assert_eq!(names.len(), 2, "{names:?}");
                    assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"newcomer");
                    let aside = &names[0];
                    assert!(aside.starts_with(".ailab-kept-"), "{names:?}");
                    assert_eq!(std::fs::read(folder.join(aside)).unwrap(), b"read and more");
                    assert!(r.reason.contains(aside.as_str()), "{}", r.reason);
                }
            }
        }
    }

    /// A removal (a rollback taking away a file its action made) whose folder another
    /// program moves away (here out of the root) as the file is moved aside removes
    /// nothing: the file goes back under its name where the folder went, and the
    /// removal is refused `conflict`, naming the folder.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_whose_folder_moves_away_as_it_is_removed_is_kept_there() {
        let (tmp, root, top, rel, stamp) = read_at("d/t.txt");
        let (folder, elsewhere) = (top.join("d"), tmp.path().join("other"));
        let to = elsewhere.clone();
        files::AFTER_EXCHANGE.with(|hook| {
            hook.set(Some(Box::new(move |_: &Dir, _: &str| {
                std::fs::rename(&folder, &to).unwrap();
            })));
        });
        let r = root
            .remove_file_put(&rel, Put::Unchanged(stamp), false)
            .unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(r.reason.contains("'d' was moved away"), "{}", r.reason);
        assert_eq!(names_in(&elsewhere), ["t.txt"]);
        assert_eq!(std::fs::read(elsewhere.join("t.txt")).unwrap(), b"read");
    }

    /// A removal that moved its file aside, then could neither unlink it (the disk
    /// refusing) nor put it back (another file took the name) keeps it under a name of
    /// its own and says where, `conflict`: never taken for a restore made.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_neither_removed_nor_put_back_is_kept_and_said() {
        let (_tmp, root, folder, rel, stamp) = read_at("t.txt");
        let f = folder.clone();
        files::AFTER_EXCHANGE.with(|hook| {
            hook.set(Some(Box::new(move |_: &Dir, _: &str| {
                std::fs::write(f.join("t.txt"), b"newcomer").unwrap();
            })));
        });
        files::FAIL_UNDO.set(Some(rustix::io::Errno::IO.raw_os_error()));
        let r = root
            .remove_file_put(&rel, Put::Unchanged(stamp), false)
            .unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        let names = names_in(&folder);
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with(".ailab-kept-"), "{names:?}");
        assert_eq!(std::fs::read(folder.join(&names[0])).unwrap(), b"read");
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"newcomer");
        assert!(
            r.reason.contains("could be neither removed (")
                && r.reason.contains("nor put back under its name ("),
            "{}",
            r.reason
        );
        assert!(r.reason.contains(names[0].as_str()), "{}", r.reason);
    }

    /// A removal whose move aside the system refuses for a permission because the
    /// folder was just moved out of the root (Landlock refuses every change there) says
    /// the folder moved, not that the runtime's user lacks a permission (which a
    /// rollback would take for its own restore's failure); the file is where the
    /// folder went.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_move_aside_refused_in_a_folder_moved_out_says_it_moved() {
        let (tmp, root, top, rel, stamp) = read_at("d/t.txt");
        let (folder, elsewhere) = (top.join("d"), tmp.path().join("other"));
        let (dir, _) = root.open_parent(&rel, false, false).unwrap();
        std::fs::rename(&folder, &elsewhere).unwrap();
        files::FAIL_ASIDE.set(Some(rustix::io::Errno::ACCESS.raw_os_error()));
        let still = || {
            if root.moved_from(&dir, &rel) {
                return Err(moved_while_removed(&rel));
            }
            Ok(())
        };
        let e = files::remove_unwritten(&dir, "t.txt", stamp, &still).unwrap_err();
        let r = root.map_error("remove", &rel, e);
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(!r.denied, "{}", r.reason);
        assert!(r.reason.contains("'d' was moved away"), "{}", r.reason);
        assert_eq!(std::fs::read(elsewhere.join("t.txt")).unwrap(), b"read");
    }

    /// A folder is said replaced only by another inode on the same device: not by a new
    /// birth time (an overlay's copy-up keeps the inode), nor across a renumbered device.
    #[test]
    fn a_folder_is_said_replaced_only_by_another_inode_on_its_device() {
        let was = DirId {
            dev: 7,
            ino: 100,
            born_ns: Some(1),
        };
        let at = |dev, ino, born_ns| DirId { dev, ino, born_ns };
        assert!(was.replaced_by(&at(7, 101, Some(1))));
        assert!(was.replaced_by(&at(7, 101, None)));
        assert!(!was.replaced_by(&at(7, 100, Some(2))));
        assert!(!was.replaced_by(&at(7, 100, None)));
        assert!(!was.replaced_by(&at(8, 101, Some(1))));
    }

    /// A file read to be removed and gone by the removal is not said removed when it was
    /// to go only as read: removed, or moved away with its folder swapped for another,
    /// nothing tells which. Taken as it is, nothing to remove is done.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn a_file_gone_before_its_removal_is_not_said_found() {
        let (_tmp, root, folder, rel, stamp) = read_at("t.txt");
        std::fs::remove_file(folder.join("t.txt")).unwrap();
        assert_eq!(
            root.remove_file_put(&rel, Put::Unchanged(stamp), false),
            Ok(false)
        );
        assert_eq!(root.remove_file_put(&rel, Put::Any, false), Ok(true));
        // Judged missing, and there again: not taken for a change to what was read.
        std::fs::write(folder.join("t.txt"), b"back").unwrap();
        let r = root.remove_file_put(&rel, Put::New, false).unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert!(
            r.reason.contains("was not there when it was judged"),
            "{}",
            r.reason
        );
        assert_eq!(std::fs::read(folder.join("t.txt")).unwrap(), b"back");
    }

    /// A dead process's temporary name that another program renamed a link or a FIFO
    /// over is removed with its other temporary files (left, it stayed in the tree for
    /// good); what the link names is left as it is.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, by path
    fn what_stands_under_a_dead_temporary_name_is_removed_whatever_it_is() {
        let (tmp, root) = root();
        let folder = tmp.path().join("root");
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, b"outside").unwrap();
        let link = files::temp_name();
        std::os::unix::fs::symlink(&outside, folder.join(&link)).unwrap();
        let fifo = files::temp_name();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            folder.join(&fifo),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let file = files::temp_name();
        std::fs::write(folder.join(&file), b"x").unwrap();
        let removed = remove_temp_files(root.dir(), 0, Some(&crate::ids::unique())).unwrap();
        assert_eq!(removed, 3);
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    }

    /// A look after the rename that fails (here refused, as a security module may) is an
    /// I/O error, not a refusal made before anything was touched: the target may hold
    /// the new bytes, and the write's undo must look at it rather than leave them.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test reads the file as a user would
    fn a_failed_look_after_the_rename_is_no_refusal_before_the_write() {
        let (tmp, root) = root();
        let rel = RelPath::from_components(comps("t.txt"));
        for put in [Put::New, Put::Any] {
            files::FAIL_CHECK.with(|f| f.set(Some(13)));
            let r = root
                .write_atomic_put(
                    &rel,
                    b"new",
                    0o644,
                    put,
                    Make::From(0),
                    (Flush::Nothing, None),
                )
                .unwrap_err();
            assert_eq!(r.reason_code, ReasonCode::IoError, "{put:?}: {}", r.reason);
            assert!(r.reason.contains("were put in its place"), "{}", r.reason);
        }
        // Created, the file stands with the new bytes (the replacement was undone).
        assert_eq!(
            std::fs::read(tmp.path().join("root/t.txt")).unwrap(),
            b"new"
        );
    }

    /// A folder read from its end that the file system refuses (a FUSE daemon taking the
    /// end for an offset it never gave) is read again from its start: a file's read waits
    /// for its folder's changes under way as before, and is not refused for it.
    #[test]
    #[allow(clippy::disallowed_methods)] // the file is put there as a user would
    fn a_folder_read_refused_at_its_end_is_read_from_its_start() {
        let (tmp, root) = root();
        std::fs::write(tmp.path().join("root/t.txt"), b"old").unwrap();
        let rel = RelPath::from_components(comps("t.txt"));
        files::FAIL_READ_AT_END.with(|f| f.set(Some(5)));
        assert_eq!(root.read_file(&rel, 1024).unwrap(), b"old");
        assert!(
            files::FAIL_READ_AT_END.with(|f| f.get()).is_none(),
            "the read never asked for the folder's entries"
        );
    }

    /// A folder's sync refused (EACCES, as a security module may) once the new bytes or
    /// folders are in place is no refusal before the write either: the new file, or
    /// the folders made, stand, and the write's undo must look at them (`conflict` had it
    /// leave them, saying nothing remained).
    #[test]
    #[allow(clippy::disallowed_methods)] // the test looks at the tree as a user would
    fn a_refused_folder_sync_after_the_change_is_no_refusal_before_it() {
        let (tmp, root) = root();
        let file = RelPath::from_components(comps("t.txt"));
        for put in [Put::New, Put::Any] {
            files::FAIL_DIR_SYNC.with(|f| f.set(Some(13)));
            let r = root
                .write_atomic_put(
                    &file,
                    b"new",
                    0o644,
                    put,
                    Make::From(0),
                    (Flush::FileAndDir, None),
                )
                .unwrap_err();
            assert_eq!(r.reason_code, ReasonCode::IoError, "{put:?}: {}", r.reason);
            assert!(
                r.reason
                    .contains("were put in its place, then the sync of its folder failed"),
                "{}",
                r.reason
            );
        }
        // Folders made on the way, then the sync refused: each case names what was made.
        for (rel, dir) in [("a/b.txt", false), ("c/d", true)] {
            let rel = RelPath::from_components(comps(rel));
            files::FAIL_DIR_SYNC.with(|f| f.set(Some(13)));
            let r = match dir {
                true => root.create_dir_all_making(&rel, Make::From(0), true),
                false => root
                    .write_atomic_put(
                        &rel,
                        b"x",
                        0o644,
                        Put::New,
                        Make::From(0),
                        (Flush::FileAndDir, None),
                    )
                    .map(|_| Vec::new()),
            }
            .unwrap_err();
            assert_eq!(r.reason_code, ReasonCode::IoError, "{rel:?}: {}", r.reason);
            let first = &rel.components()[0];
            assert!(
                r.reason
                    .starts_with(&format!("'{first}' was made for it, then: ")),
                "{}",
                r.reason
            );
            assert!(tmp.path().join("root").join(first).is_dir());
        }
        // The last folder itself made, then its parent's sync refused.
        files::FAIL_DIR_SYNC.with(|f| f.set(Some(13)));
        let r = root
            .create_dir_all_making(&RelPath::from_components(comps("e")), Make::From(0), true)
            .unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::IoError, "{}", r.reason);
        assert!(r.reason.starts_with("'e' was made for it"), "{}", r.reason);
    }

    /// The link count of an open file says how many names it has, not where: an outside
    /// file linked into the root, opened there, and its link in the root removed has one
    /// link left, outside. Only the name's own status tells.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, linking by path
    fn a_file_opened_through_a_link_removed_since_is_never_taken_as_the_roots() {
        let (tmp, root) = root();
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, b"outside").unwrap();
        let inside = tmp.path().join("root/t.txt");
        // What the check says: the name names another file, or none (`Swapped`: read
        // again, then `conflict`), or a refusal.
        let code = |r: io::Result<()>| {
            let e = r.unwrap_err();
            let inner = e.get_ref();
            if inner.is_some_and(|e| e.is::<files::Swapped>()) {
                return Some(ReasonCode::Conflict);
            }
            inner
                .and_then(|e| e.downcast_ref::<Refusal>())
                .map(|r| r.reason_code)
        };
        std::fs::hard_link(&outside, &inside).unwrap();
        let file = root.dir.open("t.txt").unwrap();
        std::fs::remove_file(&inside).unwrap();
        let opened = file.metadata().unwrap();
        assert_eq!(opened.nlink(), 1, "one link left, outside the root");
        let alone = |f: &cap_std::fs::File, m: &cap_std::fs::Metadata| {
            files::named_alone(&root.dir, "t.txt", f, m)
        };
        assert_eq!(code(alone(&file, &opened)), Some(ReasonCode::Conflict));
        // Linked in again: the name names the file, which has another link.
        std::fs::hard_link(&outside, &inside).unwrap();
        assert_eq!(
            code(alone(&file, &opened)),
            Some(ReasonCode::HardlinkRefused)
        );
        // Another file at the name.
        std::fs::remove_file(&inside).unwrap();
        std::fs::write(&inside, b"inside").unwrap();
        assert_eq!(code(alone(&file, &opened)), Some(ReasonCode::Conflict));
        // The root's own file, alone at its name.
        let own = root.dir.open("t.txt").unwrap();
        alone(&own, &own.metadata().unwrap()).unwrap();
        // Given a link outside and that link removed while it was open, it is alone at
        // its name again, but its links changed while it was read: it is read again.
        let opened = own.metadata().unwrap();
        let away = tmp.path().join("away.txt");
        std::fs::hard_link(&inside, &away).unwrap();
        std::fs::remove_file(&away).unwrap();
        let now = own.metadata().unwrap();
        assert_eq!(now.nlink(), 1);
        // (A file system without multigrain time stamps may keep the time through
        // changes within one tick of its clock: then nothing can tell them.)
        if (now.ctime(), now.ctime_nsec()) != (opened.ctime(), opened.ctime_nsec()) {
            assert_eq!(code(alone(&own, &opened)), Some(ReasonCode::Conflict));
        }
        // And read whole through the root: an outside file's bytes never are.
        assert_eq!(
            files::read_regular(&root.dir, "t.txt", 1 << 10).unwrap(),
            b"inside"
        );
    }

    /// A link to an outside file planted at a name and removed again, as fast as another
    /// program can, while the name is read: no read ever gives the outside file's bytes
    /// (a look at the name landing inside a removal, the count already lowered and the
    /// name not yet gone, took the outside file for the root's own). Bounded by a count
    /// of reads, not by time.
    #[test]
    fn a_link_to_an_outside_file_planted_and_removed_in_a_loop_is_never_read() {
        reads_racing_a_planted_link(false);
    }

    /// The same in a folder the runtime may not list, where its wait for a removal under
    /// way renames the name to itself instead of reading the folder.
    #[test]
    fn a_link_planted_and_removed_in_a_folder_not_listed_is_never_read() {
        reads_racing_a_planted_link(true);
    }

    #[allow(clippy::disallowed_methods)] // the test plays another program, linking by path
    fn reads_racing_a_planted_link(unlisted: bool) {
        let (tmp, root) = root();
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, b"outside secret").unwrap();
        let inside = tmp.path().join("root/t.txt");
        // The check relies on every change of links giving the file a new status-change
        // time (multigrain time stamps, Linux 6.13 and later); where a change within the
        // clock's tick keeps the time, it is only as fine as that tick.
        for _ in 0..100 {
            let before = std::fs::metadata(&outside).unwrap();
            std::fs::hard_link(&outside, &inside).unwrap();
            let linked = std::fs::metadata(&outside).unwrap();
            std::fs::remove_file(&inside).unwrap();
            let after = std::fs::metadata(&outside).unwrap();
            let time = |m: &std::fs::Metadata| {
                use std::os::unix::fs::MetadataExt as _;
                (m.ctime(), m.ctime_nsec())
            };
            if time(&before) == time(&linked) || time(&linked) == time(&after) {
                eprintln!("this file system keeps a file's time through a change of links");
                return;
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let racer = {
            let stop = stop.clone();
            let (outside, inside) = (outside.clone(), inside.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::hard_link(&outside, &inside);
                    let _ = std::fs::remove_file(&inside);
                }
            })
        };
        files::UNLISTED.set(unlisted);
        let mut read = 0;
        for _ in 0..40_000 {
            if let Ok(bytes) = files::read_regular(&root.dir, "t.txt", 1 << 10) {
                assert_ne!(
                    bytes, b"outside secret",
                    "an outside file's bytes were read"
                );
                read += 1;
            }
        }
        files::UNLISTED.set(false);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        racer.join().unwrap();
        assert_eq!(read, 0, "only the outside file was ever at the name");
    }

    /// A write refused for its permissions because its folder was moved out of the root
    /// meanwhile (Landlock's answer to a write outside) says the folder moved; one whose
    /// folder is still in place blames the permission, as before.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, moving by path
    fn a_write_denied_in_a_folder_moved_away_says_it_moved() {
        let (tmp, root) = root();
        std::fs::create_dir(tmp.path().join("root/r")).unwrap();
        let rel = RelPath::from_components(comps("r/t.txt"));
        let (dir, _) = root.open_parent(&rel, false, false).unwrap();
        let eacces = || io::Error::from_raw_os_error(13);
        let in_place = root.map_write_error_in(&dir, &rel, eacces());
        assert!(
            in_place
                .reason
                .ends_with("give the runtime's user access there, or use another path"),
            "{}",
            in_place.reason
        );
        std::fs::rename(tmp.path().join("root/r"), tmp.path().join("moved")).unwrap();
        for (case, made_again) in [("moved away", false), ("another folder in its place", true)] {
            if made_again {
                std::fs::create_dir(tmp.path().join("root/r")).unwrap();
            }
            let r = root.map_write_error_in(&dir, &rel, eacces());
            assert_eq!(r.reason_code, ReasonCode::Conflict, "{case}");
            assert!(
                r.reason.starts_with(
                    "the directory 'r' was moved out of the root or removed while the action ran"
                ),
                "{case}: {}",
                r.reason
            );
        }
        // Another error than a permission's is said as it is.
        let eio = root.map_write_error_in(&dir, &rel, io::Error::from_raw_os_error(5));
        assert!(
            eio.reason.starts_with("could not write 'r/t.txt'"),
            "{}",
            eio.reason
        );
    }

    /// A write or a `mkdir` in a folder that a rollback (or another program) removed
    /// after the walk opened it is refused `ENOENT` by the kernel: that is the race, to
    /// try again (`conflict`), not a path the caller got wrong (`not_found`) nor a
    /// failing disk (`io_error`, HTTP 500).
    #[test]
    #[allow(clippy::disallowed_methods)] // the test plays another program, removing by path
    fn a_folder_removed_under_a_write_or_mkdir_is_said_removed_meanwhile() {
        let (tmp, root) = root();
        std::fs::create_dir_all(tmp.path().join("root/r/s")).unwrap();
        let file = RelPath::from_components(comps("r/s/t.txt"));
        let made = RelPath::from_components(comps("r/s/n"));
        let (dir, _) = root.open_parent(&file, false, false).unwrap();
        // In place, a name not found is still the caller's.
        let in_place = root.map_write_error_in(&dir, &file, io::ErrorKind::NotFound.into());
        assert_eq!(
            in_place.reason_code,
            ReasonCode::NotFound,
            "{}",
            in_place.reason
        );
        std::fs::remove_dir(tmp.path().join("root/r/s")).unwrap();
        let e = dir.create("t.txt").err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let r = root.map_write_error_in(&dir, &file, e);
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(
            r.reason,
            "the directory 'r/s' was removed while the action ran; nothing was written: try again"
        );
        // Made again by another: the folder held is still the removed one.
        std::fs::create_dir(tmp.path().join("root/r/s")).unwrap();
        let mut created = Vec::new();
        let r = root
            .make_last(&dir, &made, true, false, &mut created)
            .err()
            .unwrap();
        assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
        assert_eq!(
            r.reason,
            "the directory 'r/s' was removed while the action ran; nothing was written: try again"
        );
        assert!(created.is_empty(), "{created:?}");
        // Another failure of a mkdir is said as it is.
        let eio = mkdir_refusal(&dir, made.components(), &io::Error::from_raw_os_error(5));
        assert_eq!(eio.reason_code, ReasonCode::IoError, "{}", eio.reason);
    }

    /// A read that fails says it could not read (it said "write"), naming the file.
    #[test]
    fn a_failed_read_is_named_as_a_read() {
        let (_tmp, root) = root();
        let rel = RelPath::from_components(comps("locked/f.txt"));
        let eacces = || io::Error::from_raw_os_error(13);
        let r = root.map_read_error(&rel, eacces());
        assert!(
            r.reason
                .starts_with("could not read 'locked/f.txt': permission denied; "),
            "{}",
            r.reason
        );
        let w = root.map_open_error(&rel, eacces());
        assert!(
            w.reason
                .starts_with("could not write 'locked/f.txt': permission denied; "),
            "{}",
            w.reason
        );
        // Another user's permission is theirs to put right, not a failing disk (it was
        // io_error, HTTP 500), as for a rollback.
        for r in [
            r,
            w,
            root.map_open_error(&rel, io::Error::from_raw_os_error(1)),
        ] {
            assert_eq!(r.reason_code, ReasonCode::Conflict, "{}", r.reason);
            assert!(
                r.reason
                    .ends_with("give the runtime's user access there, or use another path"),
                "{}",
                r.reason
            );
        }
        // cap-std's refusal of an escape is not a permission.
        let escape = root.map_open_error(&rel, io::Error::from(io::ErrorKind::PermissionDenied));
        assert_ne!(escape.reason_code, ReasonCode::Conflict);
        // An error whose kind says nothing is said in the system's words (an EIO was
        // "uncategorized error").
        let eio = root.map_open_error(&rel, io::Error::from_raw_os_error(5));
        assert_eq!(
            eio.reason,
            "could not write 'locked/f.txt': Input/output error (os error 5) (the disk or its filesystem failed to read or write: see the kernel's log (dmesg) and check the disk before trying again)"
        );
    }

    fn comps(p: &str) -> Vec<String> {
        p.split('/').map(str::to_owned).collect()
    }

    /// A folder seen a moment ago and moved away by another program before it is
    /// opened is not found (a write's caller then says it was removed meanwhile, a
    /// look says missing), never a failure of the disk (it was `io_error`, HTTP 500).
    #[test]
    fn a_folder_gone_before_it_is_opened_is_not_found() {
        let (_tmp, root) = root();
        let r = root.descend(&root.dir, &comps("moved")).err().unwrap();
        assert_eq!(r.reason_code, ReasonCode::NotFound, "{}", r.reason);
        assert_eq!(r.reason, "the directory 'moved' does not exist");
    }

    /// The kernel refused a name as a symlink, and by the time the link is read to tell
    /// where it led, a swapper has put the directory back: still an escape attempt.
    #[test]
    fn a_link_swapped_back_before_it_is_read_is_an_escape_attempt() {
        let (_tmp, root) = root();
        std::fs::create_dir(root.path().join("d")).unwrap();
        let r = root.detect_symlink_escape(&comps("d"));
        assert_eq!(r.reason_code, ReasonCode::SymlinkEscape, "{}", r.reason);
        assert!(r.reason.contains("swapped"), "{}", r.reason);
        let r = root.detect_symlink_escape(&comps("gone"));
        assert_eq!(r.reason_code, ReasonCode::SymlinkEscape, "{}", r.reason);
    }

    #[test]
    fn a_link_still_in_place_is_classified_by_where_it_leads() {
        let (tmp, root) = root();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", root.path().join("in")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.path().join("out")).unwrap();
        assert_eq!(
            root.detect_symlink_escape(&comps("in")).reason_code,
            ReasonCode::SymlinkRefused
        );
        assert_eq!(
            root.detect_symlink_escape(&comps("out")).reason_code,
            ReasonCode::SymlinkEscape
        );
    }
}
