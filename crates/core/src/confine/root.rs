//! A sandbox root and every file operation beneath it.
//!
//! The root directory is opened once, as a capability handle (`cap_std::fs::Dir`); every
//! later lookup is relative to it and resolved by the kernel with `RESOLVE_BENEATH`, so no
//! path string, symlink or rename race can make an operation land outside. Parent
//! directories are walked one component at a time with `open_dir_nofollow`, and the last
//! component is opened with `O_NOFOLLOW` or replaced by `renameat`, so symlinks are never
//! followed for writes. The lexical checks before this produce the reason codes; this
//! module is what holds the line.
// confine/ is where paths are opened. Only the types are allowed module-wide, so that the
// chmod and subprocess bans of clippy.toml (SPEC §12.1-2) still hold in this module.
#![allow(clippy::disallowed_types)]

use super::path::{RelPath, TEMP_MARKER, lexical_normalize, path_strings, shown_path};
use crate::reason::{ReasonCode, Refusal, Verdict};
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt, OpenOptions, OpenOptionsExt};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Mode of every file the runtime creates: never an execute bit.
pub const FILE_MODE: u32 = 0o644;
/// Mode of every directory the runtime creates.
pub const DIR_MODE: u32 = 0o755;

/// How deep a symlink chain is followed (lexically) to tell an escape from an inside link.
const SYMLINK_HOPS: usize = 8;

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

/// A sandbox root: its configured path and the directory handle opened at start-up.
#[derive(Debug)]
pub struct SandboxRoot {
    path: PathBuf,
    dir: Dir,
    /// The root directory's `(st_dev, st_ino)`.
    id: (u64, u64),
    /// The same for every directory the root was reached through, `/` first: where the
    /// root really lies, whatever symlinks its configured path names.
    ancestry: Vec<(u64, u64)>,
    /// Directories never reached through this root (see [`SandboxRoot::reserve`]).
    reserved: Vec<((u64, u64), String)>,
}

/// This process's effective uid, asked once: the runtime never changes it, and it is
/// compared on every write (the snapshot store's owner).
pub(crate) fn euid() -> u32 {
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EUID.get_or_init(|| rustix::process::geteuid().as_raw())
}

/// Why this process may not change the entry `name` of `dir` (shown as `shown`, a
/// quoted root-relative path), whether it exists or is to be made: the folder or the
/// entry marked immutable or append-only (`chattr +i`, `+a`), the entry another
/// user's in a sticky folder another user owns, the entry closed to this process's
/// reading, or the folder closed to its changes (its mode, a read-only mount; its
/// reading too when the change syncs it, `syncs_folder`). `None` when it may.
pub(crate) fn change_refused(
    dir: &Dir,
    name: &str,
    shown: &str,
    syncs_folder: bool,
) -> Option<String> {
    use rustix::fs::{Access, AtFlags, StatxAttributes, StatxFlags, accessat, statx};
    let stat = |name: &str| {
        statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::BASIC_STATS,
        )
    };
    let pinned = |name: &str| {
        stat(name).is_ok_and(|x| {
            x.stx_attributes
                .intersects(StatxAttributes::IMMUTABLE | StatxAttributes::APPEND)
        })
    };
    let me = euid();
    // In a sticky folder only the owner of an entry (or of the folder) may remove or
    // replace it.
    let sticky_held = me != 0
        && stat(".").is_ok_and(|f| u32::from(f.stx_mode) & 0o1000 != 0 && f.stx_uid != me)
        && stat(name).is_ok_and(|x| x.stx_uid != me);
    // The marks first: the access check reports them as "permission denied".
    if pinned(".") {
        Some(format!(
            "the folder holding {shown} is marked immutable or append-only"
        ))
    } else if pinned(name) {
        Some(format!("{shown} is marked immutable or append-only"))
    } else if sticky_held {
        Some(format!(
            "{shown} belongs to another user in a folder where only an entry's owner may remove or replace it (the sticky bit)"
        ))
    } else if shut_to_reading(dir, name) {
        // Its snapshot, or the comparison a rollback makes, needs its bytes: another
        // user's file, unseen, is never overwritten.
        Some(format!(
            "{shown} cannot be read by this process (permission denied: another user owns it or its mode shuts this process out), so what it holds cannot be told"
        ))
    } else {
        let folder = |access| accessat(dir, ".", access, AtFlags::EACCESS).err();
        if let Some(e) = folder(Access::WRITE_OK | Access::EXEC_OK) {
            return Some(format!(
                "the folder holding {shown} cannot be changed by this process ({})",
                crate::error::io_words(&e.into())
            ));
        }
        // Read too when the change syncs the folder (`strict`), which opens it for
        // reading: a folder of mode 0300 took the write, then failed its sync, and the
        // write was reported undone while it stood.
        folder(Access::READ_OK).filter(|_| syncs_folder).map(|e| {
            format!(
                "the folder holding {shown} cannot be read by this process ({}), which strict durability needs to sync it (relaxed and batched durability write there)",
                crate::error::io_words(&e.into())
            )
        })
    }
}

/// Whether this process may not read the entry `name` of `dir` for its permissions
/// (another user's, or its mode shuts this process out); never for root, who reads all.
pub(crate) fn shut_to_reading(dir: &Dir, name: &str) -> bool {
    use rustix::fs::{Access, AtFlags, accessat};
    euid() != 0
        && accessat(
            dir,
            name,
            Access::READ_OK,
            AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_err_and(|e| e == rustix::io::Errno::ACCESS)
}

/// This process's effective gid, asked once (see [`euid`]).
pub(crate) fn egid() -> u32 {
    static EGID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EGID.get_or_init(|| rustix::process::getegid().as_raw())
}

/// Whether users other than this process's could write in the directory `m` describes:
/// it is writable by others, or by a group that is not this process's own (a user
/// private group, as many systems give each user, is fine; another group's members are
/// other users).
pub(crate) fn writable_by_others(m: &cap_std::fs::Metadata) -> bool {
    let egid = egid();
    m.mode() & 0o002 != 0 || (m.mode() & 0o020 != 0 && m.gid() != egid)
}

/// Why a directory meant to be the runtime's alone (the state directory, the snapshot
/// store) is not: another user owns it, or others could write in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotOurs {
    /// Owned by this uid, not the process's.
    Owner(u32),
    /// Writable by others; the directory's group and mode.
    Writable { gid: u32, mode: u32 },
}

/// [`NotOurs`] for the directory `m` describes, if it is not private to this
/// process's user.
pub(crate) fn not_ours(m: &cap_std::fs::Metadata) -> Option<NotOurs> {
    if m.uid() != euid() {
        Some(NotOurs::Owner(m.uid()))
    } else if writable_by_others(m) {
        Some(NotOurs::Writable {
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        })
    } else {
        None
    }
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
    /// Opens (and, with `create`, first creates) a root through `open_checked_dir`,
    /// refusing one owned by another user or writable by others without the sticky bit.
    ///
    /// Whoever controls a directory above the root could swap the root for a directory
    /// of theirs; a symlink on the way is followed only when it is owned by root or by
    /// this user, and what it leads to is checked the same way. Each check is made on
    /// the open handle that the walk then descends from, so nothing can be swapped in
    /// between.
    pub fn open(path: &Path, create: bool) -> Result<Self, String> {
        let shown = path.display();
        let checked = open_checked_dir(path, create, "root", DIR_MODE)?;
        let (dir, opened) = (checked.dir, checked.meta);
        let euid = euid();
        if opened.uid() != euid {
            return Err(format!(
                "root {shown} is owned by uid {}, not by this process's uid {euid}; someone else may control it",
                opened.uid()
            ));
        }
        if writable_by_others(&opened) && opened.mode() & 0o1000 == 0 {
            return Err(format!(
                "root {shown} (group {}, mode {:04o}) is writable by other users and has no sticky bit; a root must be writable only by its owner or this process's group, or carry the sticky bit as /tmp does",
                opened.gid(),
                opened.mode() & 0o7777
            ));
        }
        Ok(Self {
            // One spelling, whatever the configuration wrote (`//`, a trailing `/`): the
            // registry and the audit trail record paths beneath it as text.
            path: path.components().collect(),
            dir,
            id: (opened.dev(), opened.ino()),
            ancestry: checked.ancestry,
            reserved: Vec::new(),
        })
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
        let (entry, existing_parents) = self.entry(rel)?;
        let kind = match entry {
            EntryKind::Missing => TargetKind::Missing,
            EntryKind::Directory => TargetKind::Directory,
            EntryKind::File { links, .. } if links > 1 => {
                return Err(hardlink_refusal(&rel.as_string(), links));
            }
            EntryKind::File { size, mode, .. } => TargetKind::File { size, mode },
            EntryKind::Symlink => return Err(self.symlink_refusal(rel.components())),
            EntryKind::Special => return Err(special_refusal(rel)),
        };
        Ok(TargetInfo {
            kind,
            existing_parents,
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
    /// the operator gives it back (a rollback, which reads it, may still). A store not
    /// made yet is open.
    pub fn store_open(&self) -> Verdict {
        use rustix::fs::{Access, AtFlags, accessat};
        let closed = accessat(
            &self.dir,
            super::path::ROLLBACK_DIR,
            Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK,
            AtFlags::EACCESS | AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_err_and(|e| e == rustix::io::Errno::ACCESS);
        if !closed {
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
        let comps = rel.components();
        let mut dir = ParentDir::Root(&self.dir);
        let parents = rel.parent_components();
        for (i, comp) in parents.iter().enumerate() {
            match dir.symlink_metadata(comp) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.symlink_refusal(&comps[..=i]));
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(not_a_directory(&comps[..=i])),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Ok((EntryKind::Missing, i));
                }
                Err(e) => return Err(io_refusal("inspect", &comps[..=i], &e)),
            }
            dir = match self.descend(&dir, &comps[..=i]) {
                Ok(d) => ParentDir::Owned(d),
                // Moved or removed since it was looked at: missing now, as if not found.
                Err(r) if r.reason_code == ReasonCode::NotFound => {
                    return Ok((EntryKind::Missing, i));
                }
                Err(r) => return Err(r),
            };
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
        Ok((kind, parents.len()))
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
        self.open_parent_making(rel, make, durable)
    }

    /// [`SandboxRoot::open_parent`], making the missing parents `make` allows.
    fn open_parent_making(
        &self,
        rel: &RelPath,
        make: Make,
        durable: bool,
    ) -> Verdict<(ParentDir<'_>, Vec<String>)> {
        let comps = rel.components();
        let mut dir = ParentDir::Root(&self.dir);
        let mut created = Vec::new();
        for (i, comp) in rel.parent_components().iter().enumerate() {
            match dir.symlink_metadata(comp) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.symlink_refusal(&comps[..=i]));
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
                        Err(e) => return Err(io_refusal("create directory", &comps[..=i], &e)),
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
        }
        Ok((dir, created))
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
    /// (`already_exists`), even one created a moment ago by someone else. Missing parents
    /// are created; their components are returned.
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
            durable,
        )
    }

    /// [`SandboxRoot::write_atomic`], saying what the rename may replace and which
    /// missing parents may be made.
    pub fn write_atomic_put(
        &self,
        rel: &RelPath,
        bytes: &[u8],
        mode: u32,
        put: Put,
        make: Make,
        durable: bool,
    ) -> Verdict<Vec<String>> {
        let (dir, created) = self.open_parent_making(rel, make, durable)?;
        write_atomic_flush(&dir, rel.file_name(), bytes, mode, put, flush_for(durable))
            .map_err(|e| self.map_open_error(rel, e))?;
        Ok(created)
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
        make: Make,
        durable: bool,
    ) -> Verdict<Vec<String>> {
        let (dir, mut created) = self.open_parent_making(rel, make, durable)?;
        let name = rel.file_name();
        let may_make = make.may_make(rel.parent_components().len());
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
                    sync_dir(&dir).map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
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
                    return Err(self.symlink_refusal(rel.components()));
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
            Err(e) => return Err(io_refusal("create directory", rel.components(), &e)),
        }
        Ok(created)
    }

    /// Removes a regular file (never following a symlink; a symlink found there is left
    /// alone and refused). A missing file is success.
    pub fn remove_file(&self, rel: &RelPath, durable: bool) -> Verdict {
        self.remove_file_put(rel, Put::Any, durable)
    }

    /// [`SandboxRoot::remove_file`], removing only the file as it was read when `put` is
    /// [`Put::Unchanged`], and none when it is [`Put::New`] (`conflict` otherwise, and
    /// the file stays).
    pub fn remove_file_put(&self, rel: &RelPath, put: Put, durable: bool) -> Verdict {
        let (dir, _) = match self.open_parent(rel, false, false) {
            Ok(d) => d,
            Err(r) if r.reason_code == ReasonCode::NotFound => return Ok(()),
            Err(r) => return Err(r),
        };
        match dir.symlink_metadata(rel.file_name()) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(self.symlink_refusal(rel.components()));
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
                    Put::Unchanged(was) => FileStamp::of(&m) != was,
                    // Judged missing: a file there now is someone else's since.
                    Put::New => true,
                    Put::Any => false,
                };
                if changed {
                    return Err(changed_meanwhile(rel.file_name()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_refusal("inspect", rel.components(), &e)),
        }
        dir.remove_file(rel.file_name())
            .map_err(|e| io_refusal("remove", rel.components(), &e))?;
        if durable {
            sync_dir(&dir).map_err(|e| io_refusal("sync", rel.parent_components(), &e))?;
        }
        Ok(())
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

    /// Lists a directory: `(name, is_dir, size)` for each entry, symlinks and special
    /// files reported as neither.
    pub fn list_dir(&self, rel: Option<&RelPath>) -> Verdict<Vec<DirEntryInfo>> {
        let dir = match rel {
            None => ParentDir::Root(&self.dir),
            Some(rel) => {
                let (parent, _) = self.open_parent(rel, false, false)?;
                let full = rel.components();
                match parent.symlink_metadata(rel.file_name()) {
                    Ok(m) if m.file_type().is_symlink() => return Err(self.symlink_refusal(full)),
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
        };
        let mut out = Vec::new();
        let listed = rel.map_or(&[][..], RelPath::components);
        let entries = dir.entries().map_err(|e| io_refusal("list", listed, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_refusal("list", &[], &e))?;
            let raw = entry.file_name();
            let not_utf8 = raw.to_str().is_none();
            let name = raw.to_string_lossy().into_owned();
            let meta = entry.metadata().map_err(|e| io_refusal("list", &[], &e))?;
            let ft = meta.file_type();
            let kind = if ft.is_symlink() {
                "symlink"
            } else if ft.is_dir() {
                "directory"
            } else if ft.is_file() {
                "file"
            } else {
                "special"
            };
            out.push(DirEntryInfo {
                name,
                not_utf8,
                kind,
                size_bytes: if ft.is_file() { meta.len() } else { 0 },
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
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
                self.symlink_refusal(comps)
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
            _ if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                self.symlink_refusal(rel.components())
            }
            _ if is_escape_error(&e) => self.symlink_refusal(rel.components()),
            _ => match e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<Refusal>())
            {
                Some(r) => r.clone(),
                None => io_refusal(what, rel.components(), &e),
            },
        }
    }

    /// Classifies the symlink at `comps` (root-relative): `symlink_escape` when it, or
    /// the chain it starts, leads outside the root; `symlink_refused` otherwise.
    fn symlink_refusal(&self, comps: &[String]) -> Refusal {
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

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DirEntryInfo {
    /// The entry's name (bytes that are not UTF-8 shown as U+FFFD).
    pub name: String,
    /// Set when the name on disk is not UTF-8: `name` is then only a likeness of it, and
    /// no path given as text can name the entry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub not_utf8: bool,
    /// `file`, `directory`, `symlink` or `special`.
    pub kind: &'static str,
    /// Size of a regular file; 0 otherwise.
    pub size_bytes: u64,
}

/// Makes the modes the runtime asks for the modes it gets, whatever umask the process
/// inherited: new files 0644 and directories 0755 (SPEC §2), a replaced or restored file
/// its own earlier mode (without an execute bit; with read and write for its owner when
/// the runtime is not root, whose file it then is), the state directory's files 0600. The
/// runtime never chmods, so the mask is what would decide otherwise. Programs call it once
/// at start-up, before any thread; a library caller keeps its own mask.
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

/// fsyncs a directory. `Dir` handles are `O_PATH`, so `"."` is opened for reading first.
pub fn sync_dir(dir: &Dir) -> io::Result<()> {
    dir.open(".")?.sync_all()
}

/// Reads a regular file by name in `dir`: `O_NOFOLLOW`, non-blocking (a FIFO never
/// stalls), checked on the open handle to be a regular file with a single link.
pub fn read_regular(dir: &Dir, name: &str, limit: u64) -> io::Result<Vec<u8>> {
    read_file_in(dir, name, limit, true).map(|(bytes, _)| bytes)
}

/// What a regular file was when it was read, to tell whether anyone changed it since:
/// which file (device, inode), its size, and its modification and change times. A rename
/// over it, an append or a truncation always changes one of them; a rewrite in place
/// that keeps the size changes the times only when the filesystem's clock has moved on
/// (timestamps are taken from a coarse kernel clock, a few milliseconds a tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    id: (u64, u64),
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// Owner and group: the file written in its place gets them (see [`write_new_file`]).
    owner: (u32, u32),
}

impl FileStamp {
    fn of(m: &cap_std::fs::Metadata) -> Self {
        Self {
            id: (m.dev(), m.ino()),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            owner: (m.uid(), m.gid()),
        }
    }
}

/// Which missing directories on the way to a path, and the path itself for a directory,
/// may be made: an action makes none its snapshot does not record. (Two actions may
/// each record one that only the faster made; either removes it only once it is empty.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Make {
    /// None: a missing one is `not_found`.
    Nothing,
    /// Those from the component at this index on (0: all of them). One before it that
    /// is missing was there when the action was checked and has gone since: `conflict`,
    /// and nothing is made.
    From(usize),
}

impl Make {
    fn may_make(self, index: usize) -> bool {
        matches!(self, Make::From(from) if index >= from)
    }
}

/// What the rename that puts a write in place may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Nothing: the name must be free (`already_exists` otherwise).
    New,
    /// Whatever is there.
    Any,
    /// Only the file as it was read (`conflict` otherwise), looked at just before the
    /// rename: a change another program made since is kept, unless it lands between
    /// that look and the rename.
    Unchanged(FileStamp),
}

impl Put {
    /// [`Put::New`] when `no_replace`, else [`Put::Any`].
    pub fn new_or_any(no_replace: bool) -> Self {
        if no_replace { Put::New } else { Put::Any }
    }
}

/// [`read_regular`], with `single_link` deciding whether a file with other hard links is
/// refused (it is in a root, where a link may alias a file outside; the state directory,
/// private to the runtime's user, makes its files by linking them into place).
pub(crate) fn read_file_in(
    dir: &Dir,
    name: &str,
    limit: u64,
    single_link: bool,
) -> io::Result<(Vec<u8>, FileStamp)> {
    let (file, meta) = open_regular(dir, name, single_link)?;
    // Taken before the bytes are read: a change made while they are read then shows as
    // a different stamp, never as the same stamp over other bytes.
    let stamp = FileStamp::of(&meta);
    if meta.len() > limit {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "{} is {} bytes; at most {limit} bytes are read",
                shown_path(name),
                meta.len()
            ),
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1)).read_to_end(&mut buf)?;
    // The file may have grown since the size check: one byte past the limit is enough to know.
    if buf.len() as u64 > limit {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::SizeExceeded,
            format!(
                "{} grew past {limit} bytes while being read",
                shown_path(name)
            ),
        )));
    }
    Ok((buf, stamp))
}

/// The size and SHA-256 of a regular file with one link, read in chunks: a file of any
/// size is described in constant memory. Both describe the same bytes, those read.
pub fn hash_regular(dir: &Dir, name: &str, limit: u64) -> io::Result<(u64, Option<String>)> {
    use sha2::Digest as _;
    let (mut file, meta) = open_regular(dir, name, true)?;
    if meta.len() > limit {
        return Ok((meta.len(), None));
    }
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                size += n as u64;
                // A file that grows while it is read is not followed for ever.
                if size > limit {
                    return Ok((size, None));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((size, Some(crate::hash::to_hex(&hasher.finalize()))))
}

/// Opens `name` for reading without following a symlink or blocking on a FIFO, and
/// refuses what is not a regular file (and, with `single_link`, a file with other links).
fn open_regular(
    dir: &Dir,
    name: &str,
    single_link: bool,
) -> io::Result<(cap_std::fs::File, cap_std::fs::Metadata)> {
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No).nonblock(true);
    let file = match dir.open_with(name, &opts) {
        Ok(f) => f,
        // open(2) on a Unix socket fails with ENXIO: it is a special file, not an I/O fault.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            return Err(io::Error::other(Refusal::new(
                ReasonCode::NotRegularFile,
                format!(
                    "{} is a socket or device, not a regular file",
                    shown_path(name)
                ),
            )));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(Refusal::new(
            ReasonCode::NotRegularFile,
            format!("{} is not a regular file", shown_path(name)),
        )));
    }
    if single_link && meta.nlink() > 1 {
        return Err(io::Error::other(hardlink_refusal(name, meta.nlink())));
    }
    Ok((file, meta))
}

/// How far a write is made durable before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Not at all (relaxed durability).
    Nothing,
    /// The file's data; the caller syncs the directory once for several files.
    FileOnly,
    /// The file's data and the directory entry.
    FileAndDir,
}

/// The atomic write behind [`SandboxRoot::write_atomic`], on an already opened directory.
pub fn write_atomic_in(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    no_replace: bool,
    durable: bool,
) -> io::Result<()> {
    write_atomic_flush(
        dir,
        name,
        bytes,
        mode,
        Put::new_or_any(no_replace),
        flush_for(durable),
    )
}

fn flush_for(durable: bool) -> Flush {
    if durable {
        Flush::FileAndDir
    } else {
        Flush::Nothing
    }
}

/// [`write_atomic_in`] with an explicit [`Flush`] and what it may replace.
pub fn write_atomic_flush(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    put: Put,
    flush: Flush,
) -> io::Result<()> {
    let tmp = temp_name();
    let owner = match put {
        Put::Unchanged(was) => Some(was.owner),
        Put::Any => owner_now(dir, name),
        Put::New => None,
    };
    let result = write_new_file(dir, &tmp, bytes, mode, owner, flush != Flush::Nothing)
        .and_then(|()| put_in_place(dir, &tmp, name, put));
    if let Err(e) = result {
        let _ = dir.remove_file(&tmp);
        return Err(e);
    }
    if flush == Flush::FileAndDir {
        sync_dir(dir)?;
    }
    Ok(())
}

/// The owner and group of the regular file `name` in `dir`, if there is one.
fn owner_now(dir: &Dir, name: &str) -> Option<(u32, u32)> {
    dir.symlink_metadata(name)
        .ok()
        .filter(cap_std::fs::Metadata::is_file)
        .map(|m| (m.uid(), m.gid()))
}

/// Creates `name` (which must not exist) with `bytes`, its data synced when `sync`. A
/// file it created but could not fill (the disk is full) is removed again.
///
/// `owner`: the owner and group of the file it is to replace, given to it where this
/// process may (as root, or for a group it is in), so that a replacement, and a
/// restore, leave the file its owner's rather than the runtime's: a file of mode 0600
/// would otherwise be lost to its owner. Where it may not, the file is the runtime's.
fn write_new_file(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    sync: bool,
) -> io::Result<()> {
    // A runtime that is not root keeps every file it writes (it cannot give one away):
    // its owner bits let it read and write it, or a kept mode such as 0044 would shut it
    // out of its own write, never to be rolled back.
    let mode = if euid() == 0 {
        mode & 0o666
    } else {
        mode & 0o666 | 0o600
    };
    let mut opts = OpenOptions::new();
    opts.write(true)
        .create_new(true)
        .follow(FollowSymlinks::No)
        .mode(mode);
    let mut file = dir.open_with(name, &opts)?;
    // Asked even when the owner is the runtime's own: in a setgid folder a new file
    // takes the folder's group, which the replaced file may not have had.
    if let Some((uid, gid)) = owner {
        use rustix::fs::{Gid, Uid, fchown};
        let uid = (uid != euid()).then(|| Uid::from_raw(uid));
        if let Err(e) = fchown(&file, uid, Some(Gid::from_raw(gid))) {
            tracing::debug!(error = %e, ?uid, gid, "the replacement keeps the runtime's owner");
        }
    }
    let filled = file
        .write_all(bytes)
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    if filled.is_err() {
        drop(file);
        let _ = dir.remove_file(name);
    }
    filled
}

/// Moves the temporary file `tmp` to `name` in one step. With [`Put::New`] an existing
/// `name` is never replaced: `renameat2(RENAME_NOREPLACE)` where the filesystem has it,
/// else `linkat` (which fails where `renameat` would overwrite) and then `unlinkat`.
/// With [`Put::Unchanged`] the file there is looked at just before the rename: one
/// changed since it was read (another program appended to it, say) is left as it is.
fn put_in_place(dir: &Dir, tmp: &str, name: &str, put: Put) -> io::Result<()> {
    match put {
        Put::New => {}
        Put::Any => return dir.rename(tmp, dir, name),
        Put::Unchanged(was) => {
            let now = match dir.symlink_metadata(name) {
                Ok(m) => Some(FileStamp::of(&m)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            if now != Some(was) {
                return Err(io::Error::other(changed_meanwhile(name)));
            }
            return dir.rename(tmp, dir, name);
        }
    }
    // Both names are single components of `dir`, so the raw call resolves nothing beyond
    // the handle; anything else goes through cap-std.
    #[cfg(target_os = "linux")]
    if is_single_component(tmp) && is_single_component(name) {
        use rustix::fs::{RenameFlags, renameat_with};
        use rustix::io::Errno;
        match renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(()),
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {}
            Err(e) => return Err(e.into()),
        }
    }
    dir.hard_link(tmp, dir, name)?;
    dir.remove_file(tmp)
}

/// A name that stays in its directory: not empty, no `/`, not `.` or `..`.
fn is_single_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// New bytes for a target, written to a temporary file beside it but not yet in place:
/// the first half of an atomic write, for callers that make the staged file durable
/// together with other records before the target changes.
#[derive(Debug)]
pub struct StagedWrite {
    dir: Dir,
    staged: String,
    name: String,
}

impl StagedWrite {
    /// The temporary file's name (in the target's directory).
    pub fn staged_name(&self) -> &str {
        &self.staged
    }

    /// The target's directory.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Puts the staged bytes in place (see [`Put`] for what it may replace), then syncs
    /// the directory when `sync`.
    pub fn commit(&self, put: Put, sync: bool) -> io::Result<()> {
        put_in_place(&self.dir, &self.staged, &self.name, put)?;
        if sync {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Removes the staged file; the target is left as it is.
    pub fn discard(&self) {
        let _ = self.dir.remove_file(&self.staged);
    }
}

impl SandboxRoot {
    /// Stages `bytes` for `rel` under `staged`, a fresh [`temp_name`] (not synced), owned
    /// like the file it is `replacing` (or, not given, the one there now), where this
    /// process may. The target's parents must exist: directories are only created by
    /// [`SandboxRoot::write_atomic`].
    pub fn stage_write(
        &self,
        rel: &RelPath,
        staged: &str,
        bytes: &[u8],
        mode: u32,
        replacing: Option<FileStamp>,
    ) -> Verdict<StagedWrite> {
        if !is_temp_name(staged) {
            return Err(Refusal::new(
                ReasonCode::InvalidId,
                format!("{} is not a temporary name", shown_path(staged)),
            ));
        }
        let (dir, _) = self.open_parent(rel, false, false)?;
        let staged = staged.to_owned();
        write_new_file(
            &dir,
            &staged,
            bytes,
            mode,
            replacing.map_or_else(|| owner_now(&dir, rel.file_name()), |r| Some(r.owner)),
            false,
        )
        .map_err(|e| self.map_open_error(rel, e))?;
        Ok(StagedWrite {
            dir: dir.into_owned().map_err(|e| self.map_open_error(rel, e))?,
            staged,
            name: rel.file_name().to_owned(),
        })
    }

    /// A file staged earlier under `staged` beside `rel`, when it is still there and is a
    /// regular file holding `limit` bytes at most: returned with its bytes.
    pub fn find_staged(
        &self,
        rel: &RelPath,
        staged: &str,
        limit: u64,
    ) -> Option<(StagedWrite, Vec<u8>)> {
        if !is_temp_name(staged) {
            return None;
        }
        let (dir, _) = self.open_parent(rel, false, false).ok()?;
        let bytes = read_regular(&dir, staged, limit).ok()?;
        Some((
            StagedWrite {
                dir: dir.into_owned().ok()?,
                staged: staged.to_owned(),
                name: rel.file_name().to_owned(),
            },
            bytes,
        ))
    }
}

/// Whether `name` is one file name made by [`temp_name`] (a staged file recorded in a
/// snapshot is only trusted as that).
fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_MARKER) && !name.contains('/')
}

/// A fresh temporary name carrying [`TEMP_MARKER`], so recovery can find leftovers.
pub fn temp_name() -> String {
    format!("{TEMP_MARKER}{}", crate::ids::unique())
}

impl SandboxRoot {
    /// Removes the temporary files of the processes that made `made_by` (run ids, see
    /// [`crate::ids`]) beside `rel` that are hard links to it: what a writer killed
    /// between linking its temporary file into place and unlinking the temporary name
    /// (where the filesystem lacks `RENAME_NOREPLACE`) left. Returns how many.
    pub fn remove_temp_links_of(&self, rel: &RelPath, made_by: &[&str]) -> usize {
        let Ok((dir, _)) = self.open_parent(rel, false, false) else {
            return 0;
        };
        let Ok(target) = dir.symlink_metadata(rel.file_name()) else {
            return 0;
        };
        let Ok(entries) = dir.entries() else {
            return 0;
        };
        let seeds: Vec<&str> = made_by
            .iter()
            .map(|m| crate::ids::process_seed(m))
            .collect();
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with(TEMP_MARKER) || !seeds.contains(&crate::ids::process_seed(name)) {
                continue;
            }
            if dir
                .symlink_metadata(name)
                .is_ok_and(|m| m.is_file() && m.dev() == target.dev() && m.ino() == target.ino())
                && dir.remove_file(name).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}

/// Removes the runtime's leftover temporary files below `dir` (a crash between creating
/// and renaming one), descending at most `depth` levels and never through symlinks.
/// With `made_by` (the id of a run, see [`crate::ids`]), only those made by the process
/// that made that id: another process's may belong to a write under way. Returns how
/// many were removed.
pub fn remove_temp_files(dir: &Dir, depth: usize, made_by: Option<&str>) -> io::Result<usize> {
    let seed = made_by.map(crate::ids::process_seed);
    let mut removed = 0;
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ft = entry.file_type()?;
        if ft.is_file()
            && name.starts_with(TEMP_MARKER)
            && seed.is_none_or(|s| crate::ids::process_seed(name) == s)
        {
            dir.remove_file(name)?;
            removed += 1;
        } else if ft.is_dir()
            && !ft.is_symlink()
            && depth > 0
            && let Ok(sub) = dir.open_dir_nofollow(name)
        {
            removed += remove_temp_files(&sub, depth - 1, made_by)?;
        }
    }
    Ok(removed)
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

/// A directory opened by [`open_checked_dir`].
pub(crate) struct CheckedDir {
    /// Its handle.
    pub dir: Dir,
    /// Its metadata, read from the handle.
    pub meta: cap_std::fs::Metadata,
    /// The `(st_dev, st_ino)` of every directory it was reached through, `/` first.
    pub ancestry: Vec<(u64, u64)>,
}

/// Begins the reason of every refusal of a directory for what lies above it (another
/// user's directory or symbolic link): a setting to correct, which callers tell apart
/// from a failure of the disk by it.
pub(crate) const REFUSED_ABOVE: &str = "is refused: ";

/// What a walk to a directory does about the parts that do not exist yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// They are refused.
    Open,
    /// They are made.
    Create,
    /// The walk stops there, judging only what exists: nothing is made.
    Probe,
}

/// Opens the directory `path` (`what` names it in messages: "root", "state directory")
/// by walking from `/` one handle at a time; with `create`, missing directories are made
/// (the last one with `mode`). Each directory above it must be owned by root or by this
/// process's user and writable only by its owner unless it has the sticky bit; a symlink
/// on the way is followed only when it is owned by root or by this user; the directory
/// itself must not be a symlink. Its own owner and mode are for the caller to judge, on
/// the handle returned, so nothing can be swapped in between.
pub(crate) fn open_checked_dir(
    path: &Path,
    create: bool,
    what: &str,
    mode: u32,
) -> Result<CheckedDir, String> {
    open_dir_checked(path, Walk::made_if(create), what, mode, false)?
        .ok_or_else(|| format!("{what} {} cannot be reached", path.display()))
}

/// [`open_checked_dir`], except that the directory itself may be a symlink, followed
/// under the rules for the directories above it (the link owned by root or this user;
/// what it leads to owned by root or this user and writable only by its owner unless it
/// has the sticky bit): for the state directory, which the runtime only reaches, never
/// hands out.
pub(crate) fn open_checked_dir_through_link(
    path: &Path,
    create: bool,
    what: &str,
    mode: u32,
) -> Result<CheckedDir, String> {
    open_dir_checked(path, Walk::made_if(create), what, mode, true)?
        .ok_or_else(|| format!("{what} {} cannot be reached", path.display()))
}

/// What [`open_checked_dir_through_link`] would refuse in what exists of `path` now,
/// found without making anything: the metadata of the directory when it exists, `None`
/// when some part of it is still to be made. For a start that must not leave folders
/// behind when it is refused.
pub(crate) fn probe_checked_dir_through_link(
    path: &Path,
    what: &str,
) -> Result<Option<cap_std::fs::Metadata>, String> {
    open_dir_checked(path, Walk::Probe, what, 0, true).map(|c| c.map(|c| c.meta))
}

impl Walk {
    fn made_if(create: bool) -> Self {
        if create { Walk::Create } else { Walk::Open }
    }
}

/// The chain of a walk that made or found every part; `None` after a probe that met a
/// part not made yet.
fn open_dir_checked(
    path: &Path,
    walk: Walk,
    what: &str,
    mode: u32,
    follow_last: bool,
) -> Result<Option<CheckedDir>, String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!("{what} {shown} is not an absolute path"));
    }
    let names = path_strings(path);
    if names.iter().any(|c| c == "..") {
        return Err(format!("{what} {shown} contains '..'"));
    }
    let Some((name, above)) = names.split_last() else {
        return Err(format!(
            "{what} {shown} is the filesystem root; a {what} must be a dedicated directory"
        ));
    };
    let euid = euid();
    let Some(chain) = open_ancestors(path, above, walk, euid, what)? else {
        return Ok(None);
    };
    let parent = chain
        .last()
        .ok_or_else(|| format!("{what} {shown} has no parent directory"))?;
    let meta = match parent.dir.symlink_metadata(name) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Probe => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Create => {
            make_dir(&parent.dir, name, mode)
                .map_err(|e| format!("{what} {shown} cannot be created: {e}"))?;
            parent
                .dir
                .symlink_metadata(name)
                .map_err(|e| format!("{what} {shown} cannot be inspected: {e}"))?
        }
        Err(e) => return Err(format!("{what} {shown} cannot be inspected: {e}")),
    };
    if meta.file_type().is_symlink() {
        if !follow_last {
            return Err(format!(
                "{what} {shown} is a symbolic link; a {what} must be a real directory"
            ));
        }
        let through = if walk == Walk::Probe {
            Walk::Probe
        } else {
            Walk::Open
        };
        let Some(mut chain) = open_ancestors(path, &names, through, euid, what)? else {
            return Ok(None);
        };
        let last = chain
            .pop()
            .ok_or_else(|| format!("{what} {shown} cannot be reached"))?;
        let meta = last
            .dir
            .dir_metadata()
            .map_err(|e| format!("{what} {shown} cannot be inspected: {e}"))?;
        return Ok(Some(CheckedDir {
            dir: last.dir,
            meta,
            ancestry: chain.iter().map(|a| a.id).collect(),
        }));
    }
    if !meta.is_dir() {
        return Err(format!("{what} {shown} is not a directory"));
    }
    let dir = parent
        .dir
        .open_dir_nofollow(name)
        .map_err(|e| format!("{what} {shown} cannot be opened: {e}"))?;
    // From here on only the open handle counts: the checks are made on it.
    let opened = dir
        .dir_metadata()
        .map_err(|e| format!("{what} {shown} cannot be inspected: {e}"))?;
    if opened.dev() != meta.dev() || opened.ino() != meta.ino() {
        return Err(format!(
            "{what} {shown} changed while it was being opened; refusing it"
        ));
    }
    Ok(Some(CheckedDir {
        dir,
        meta: opened,
        ancestry: chain.iter().map(|a| a.id).collect(),
    }))
}

/// Walks from `/` to the directory that holds `root` (whose components above it are
/// `names`), checking each directory on the way (see [`SandboxRoot::open`]) and, with
/// `walk`, making the missing ones or stopping at the first. Returns the chain of real
/// directories, `/` first; `None` when a probe stopped.
fn open_ancestors(
    root: &Path,
    names: &[String],
    walk: Walk,
    euid: u32,
    what: &str,
) -> Result<Option<Vec<Ancestor>>, String> {
    let shown = root.display();
    let top = PathBuf::from("/");
    let dir = Dir::open_ambient_dir(&top, ambient_authority())
        .map_err(|e| format!("{what} {shown} cannot be reached: / cannot be opened: {e}"))?;
    let mut chain = vec![checked_ancestor(root, top, dir, euid, what)?];
    let mut pending: std::collections::VecDeque<String> = names.iter().cloned().collect();
    let mut hops = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            // The chain holds real directories only, so its previous entry is the parent.
            if chain.len() > 1 {
                chain.pop();
            }
            continue;
        }
        let parent = chain
            .last()
            .ok_or_else(|| format!("{what} {shown} cannot be reached"))?;
        let here = parent.path.join(&name);
        let meta = match parent.dir.symlink_metadata(&name) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Probe => {
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && walk == Walk::Create => {
                make_dir(&parent.dir, &name, DIR_MODE).map_err(|e| {
                    format!(
                        "{what} {shown} cannot be created: its parent {} cannot be created: {e}",
                        here.display()
                    )
                })?;
                parent.dir.symlink_metadata(&name).map_err(|e| {
                    format!(
                        "{what} {shown} cannot be inspected: its parent {} cannot be inspected: {e}",
                        here.display()
                    )
                })?
            }
            Err(e) => {
                return Err(format!(
                    "{what} {shown} cannot be inspected: its parent {} cannot be inspected: {e}",
                    here.display()
                ));
            }
        };
        if meta.file_type().is_symlink() {
            if meta.uid() != 0 && meta.uid() != euid {
                return Err(format!(
                    "{what} {shown} {REFUSED_ABOVE}{} above it is a symbolic link owned by uid {}; a symbolic link above a {what} must be owned by root (uid 0) or by this process's uid {euid}, or its owner could point it elsewhere",
                    here.display(),
                    meta.uid()
                ));
            }
            hops += 1;
            if hops > ANCESTOR_HOPS {
                return Err(format!(
                    "{what} {shown} cannot be reached: more than {ANCESTOR_HOPS} symbolic links above it (a loop?)"
                ));
            }
            let target = parent.dir.read_link_contents(&name).map_err(|e| {
                format!(
                    "{what} {shown} cannot be inspected: the symbolic link {} above it cannot be read: {e}",
                    here.display()
                )
            })?;
            if target.is_absolute() {
                chain.truncate(1);
            }
            for comp in path_strings(&target).into_iter().rev() {
                pending.push_front(comp);
            }
            continue;
        }
        if !meta.is_dir() {
            return Err(format!(
                "{what} {shown} cannot be used: {} above it is not a directory",
                here.display()
            ));
        }
        let dir = parent.dir.open_dir_nofollow(&name).map_err(|e| {
            format!(
                "{what} {shown} cannot be opened: its parent {} cannot be opened: {e}",
                here.display()
            )
        })?;
        chain.push(checked_ancestor(root, here, dir, euid, what)?);
    }
    Ok(Some(chain))
}

/// Checks a directory above `root` on its open handle: owned by root or by `euid`, and
/// writable only by its owner unless it has the sticky bit.
fn checked_ancestor(
    root: &Path,
    path: PathBuf,
    dir: Dir,
    euid: u32,
    what: &str,
) -> Result<Ancestor, String> {
    let shown = root.display();
    let m = dir.dir_metadata().map_err(|e| {
        format!(
            "{what} {shown} cannot be inspected: its parent {} cannot be inspected: {e}",
            path.display()
        )
    })?;
    let (uid, mode) = (m.uid(), m.mode() & 0o7777);
    if uid != 0 && uid != euid {
        return Err(format!(
            "{what} {shown} {REFUSED_ABOVE}the directory {} above it is owned by uid {uid} (mode {mode:04o}); every directory above a {what} must be owned by root (uid 0) or by this process's uid {euid}, or its owner could swap the {what} for a directory of theirs",
            path.display()
        ));
    }
    // Another group's members could swap the root like any other user.
    let egid = egid();
    if writable_by_others(&m) && mode & 0o1000 == 0 {
        return Err(format!(
            "{what} {shown} {REFUSED_ABOVE}the directory {} above it (owner uid {uid}, group {}, mode {mode:04o}) is writable by other users and has no sticky bit; a directory above a {what} must be writable only by its owner or this process's group {egid}, or carry the sticky bit as /tmp does, or others could swap the {what} for a directory of theirs",
            path.display(),
            m.gid()
        ));
    }
    Ok(Ancestor {
        path,
        dir,
        id: (m.dev(), m.ino()),
    })
}

/// Makes one directory (mode 0755); one that appeared meanwhile is left for the caller
/// to inspect like any existing one.
fn make_dir(parent: &Dir, name: &str, mode: u32) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    builder.mode(mode);
    match parent.create_dir_with(name, &builder) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// The refusal for a file `name` that changed after it was read, just before it would
/// have been replaced or removed.
fn changed_meanwhile(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was changed by another program after it was read; it was left as it is, with that change: read it again, then retry",
            shown_path(name)
        ),
    )
}

/// The refusal for a directory `comps` that was there when the action was checked and
/// is not now: something removed it meanwhile (a rollback taking away a directory it had
/// left empty, another program).
fn removed_meanwhile(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} was removed while the action ran; nothing was written: try again",
            shown_path(&comps.join("/"))
        ),
    )
}

/// The refusal for a path whose parent `comps` (root-relative) is not a directory; plan
/// validation gives the same answer for a parent an earlier action makes a file.
pub(crate) fn not_a_directory(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::NotFound,
        format!(
            "{} is not a directory, so nothing can be placed beneath it",
            shown_path(&comps.join("/"))
        ),
    )
}

/// `path` is the path as the caller should see it (root-relative, or a file name).
fn hardlink_refusal(path: &str, nlink: u64) -> Refusal {
    Refusal::new(
        ReasonCode::HardlinkRefused,
        format!(
            "{} has {nlink} hard links; a file with more than one link may alias a file outside the sandbox, so it is never read or written",
            shown_path(path)
        ),
    )
}

fn special_refusal(rel: &RelPath) -> Refusal {
    Refusal::new(
        ReasonCode::NotRegularFile,
        format!(
            "{} is a FIFO, socket or device; only regular files and directories are handled",
            shown_path(&rel.as_string())
        ),
    )
}

/// An I/O failure as a refusal. The message names only the root-relative path, never
/// anything outside the sandbox.
pub(crate) fn io_refusal(what: &str, comps: &[String], e: &io::Error) -> Refusal {
    let target = if comps.is_empty() {
        "the sandbox root".to_owned()
    } else {
        shown_path(&comps.join("/"))
    };
    let said = format!("could not {what} {target}: {}", crate::error::io_words(e));
    if is_denied(e) {
        // A permission someone set in the tree (another user's file or folder, a mode,
        // a sticky folder, an immutable mark): theirs to put right, not a failing disk,
        // as a rollback meeting one says.
        return Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{said}; it, or a folder on its way, is another user's or closed to this process (its mode, a sticky folder, an immutable mark): give the runtime's user access there, or use another path"
            ),
        );
    }
    Refusal::new(ReasonCode::IoError, said)
}

/// Whether the system refused `e`'s operation on a path for its permissions (EACCES,
/// EPERM), as opposed to cap-std refusing an escape (no OS error number).
pub(crate) fn is_denied(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::ACCESS, Errno::PERM]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, SandboxRoot) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("root");
        let root = SandboxRoot::open(&path, true).unwrap();
        (tmp, root)
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
            "could not write 'locked/f.txt': Input/output error (os error 5)"
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
        let r = root.symlink_refusal(&comps("d"));
        assert_eq!(r.reason_code, ReasonCode::SymlinkEscape, "{}", r.reason);
        assert!(r.reason.contains("swapped"), "{}", r.reason);
        let r = root.symlink_refusal(&comps("gone"));
        assert_eq!(r.reason_code, ReasonCode::SymlinkEscape, "{}", r.reason);
    }

    #[test]
    fn a_link_still_in_place_is_classified_by_where_it_leads() {
        let (tmp, root) = root();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", root.path().join("in")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.path().join("out")).unwrap();
        assert_eq!(
            root.symlink_refusal(&comps("in")).reason_code,
            ReasonCode::SymlinkRefused
        );
        assert_eq!(
            root.symlink_refusal(&comps("out")).reason_code,
            ReasonCode::SymlinkEscape
        );
    }
}
