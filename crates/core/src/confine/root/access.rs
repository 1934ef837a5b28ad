//! Who may change what: this process's identity, and the permissions (modes), immutable and
//! append-only marks, sticky folders and owners that refuse a change before it is tried.

use cap_std::fs::{Dir, MetadataExt};

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
