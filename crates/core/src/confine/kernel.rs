//! Kernel confinement, as defense in depth under the root handles: where the kernel has
//! Landlock, the calling thread (and every thread it creates afterwards) restricts itself
//! so that files can be written only beneath the given directories, read anywhere, and
//! executed nowhere. Even a bug in the path code could then not write elsewhere, and "no
//! subprocess" becomes a kernel guarantee.
//!
//! Landlock binds only the calling thread and threads created after it (`all_threads`
//! needs ABI 8), so a program calls [`restrict_to`] on its main thread before it starts any
//! runtime or thread pool.

use serde::Serialize;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The soft limit on this process's open files (`u64::MAX`: none).
pub fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Raises the soft limit on open files to the hard one (at most 65,536), as servers
/// do: the runtime holds a descriptor per connection and several per write, and many
/// systems start processes at 1,024 with far more allowed. Never lowers it.
pub fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const MOST: u64 = 65_536;
    let now = getrlimit(Resource::Nofile);
    let want = now.maximum.unwrap_or(MOST).min(MOST);
    if now.current.is_some_and(|c| c < want) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want),
                maximum: now.maximum,
            },
        );
    }
}

/// Descriptors one write (a plan's action, a rollback's step) may hold at once: its
/// locks, the folders on its way, the file, its snapshot's.
pub const FILES_PER_WRITE: usize = 16;

/// Descriptors a tokio runtime opens as it is built: its poller, waker and signal
/// sockets, and their copies, fewer than this.
const FILES_PER_RUNTIME: usize = 8;

/// Whether a server can get the descriptors it needs before it serves anything: its
/// runtime's and one write's. Made and closed here; short of them (a tight `ulimit -n`),
/// tokio's signal set-up panics instead of returning an error, and a server that started
/// would refuse every write. Asked on the thread that then builds the runtime, before any
/// other runs, so what was free here is free for it a moment later.
pub fn room_for_a_runtime() -> std::io::Result<()> {
    (0..(FILES_PER_RUNTIME + FILES_PER_WRITE).div_ceil(2))
        .map(|_| std::os::unix::net::UnixStream::pair())
        .collect::<std::io::Result<Vec<_>>>()
        .map(drop)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "{e}: too few open files are allowed for the runtime and one write (the limit is {}); raise it (ulimit -n)",
                    open_file_limit()
                ),
            )
        })
}

wire_enum! {
    /// How far the kernel confines the process.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ConfinementStatus {
        /// Every requested restriction is in force.
        FullyEnforced = "fully_enforced",
        /// The kernel's Landlock ABI lacks some of the access rights asked for.
        PartiallyEnforced = "partially_enforced",
        /// Landlock exists but restricted nothing.
        NotEnforced = "not_enforced",
        /// Landlock could not be used at all.
        Unavailable = "unavailable",
    }
}

/// What the kernel enforces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelConfinement {
    /// `landlock`.
    pub mechanism: &'static str,
    /// How far.
    pub status: ConfinementStatus,
    /// The Landlock ABI in effect, when there is one.
    pub abi: Option<u32>,
    /// Directories the process may write beneath.
    pub writable: Vec<String>,
    /// Why it is not (fully) enforced.
    pub detail: Option<String>,
}

impl KernelConfinement {
    /// Whether every requested restriction is enforced.
    pub fn is_enforced(&self) -> bool {
        matches!(
            self.status,
            ConfinementStatus::FullyEnforced | ConfinementStatus::PartiallyEnforced
        )
    }
}

/// Restricts the calling thread and its future threads: read anywhere, write beneath
/// `writable` only, execute nothing. Never fails: a kernel without Landlock yields a
/// report saying so. The paths are opened here (a process holding the directories
/// already gives their handles to [`restrict_to_dirs`]).
pub fn restrict_to(writable: &[PathBuf]) -> KernelConfinement {
    let shown: Vec<String> = writable.iter().map(|p| p.display().to_string()).collect();
    let opened = writable
        .iter()
        .map(|p| open_path(p))
        .collect::<Result<Vec<_>, _>>();
    match opened {
        Ok(fds) => restrict_to_dirs(
            &shown
                .iter()
                .zip(&fds)
                .map(|(p, fd)| (p.as_str(), fd.as_fd()))
                .collect::<Vec<_>>(),
        ),
        Err(why) => unrestricted(shown, why),
    }
}

/// [`restrict_to`] for directories this process holds open, each with the path it is
/// shown by: the rules name those very directories, so a path renamed or swapped for a
/// link since they were opened (while the start recovered, say) cannot move the grant.
#[cfg(target_os = "linux")]
pub fn restrict_to_dirs(writable: &[(&str, BorrowedFd<'_>)]) -> KernelConfinement {
    use landlock::{
        ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath,
        Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetError, RulesetStatus,
    };
    let shown: Vec<String> = writable.iter().map(|(p, _)| (*p).to_owned()).collect();
    // Opened here rather than by `path_beneath_rules`, which passes over a path it cannot
    // open: short of descriptors, the ruleset would grant nothing, shutting the process
    // out of its own files while it called itself confined. Nothing is restricted then,
    // as when the ruleset itself cannot be made, and the report says why.
    let top = match open_path(Path::new("/")) {
        Ok(fd) => fd,
        Err(why) => return unrestricted(shown, why),
    };
    // Ask for exactly what the running kernel offers, so that "fully enforced" means
    // every right this kernel knows about: probe from the newest ABI down.
    let abi = [
        ABI::V10,
        ABI::V9,
        ABI::V8,
        ABI::V7,
        ABI::V6,
        ABI::V5,
        ABI::V4,
        ABI::V3,
        ABI::V2,
        ABI::V1,
    ]
    .into_iter()
    .find(|&abi| {
        Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|r| r.create())
            .is_ok()
    })
    .unwrap_or(ABI::V1);
    let all = AccessFs::from_all(abi);
    let no_exec: BitFlags<AccessFs> = all & !AccessFs::Execute;
    let read_only: BitFlags<AccessFs> = AccessFs::from_read(abi) & !AccessFs::Execute;
    let rules = std::iter::once(PathBeneath::new(top.as_fd(), read_only))
        .chain(
            writable
                .iter()
                .map(|(_, fd)| PathBeneath::new(*fd, no_exec)),
        )
        .map(Ok::<_, RulesetError>);
    let result = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(rules))
        .and_then(|r| r.restrict_self());
    match result {
        Ok(status) => {
            let abi_num = match status.landlock {
                LandlockStatus::Available { effective_abi, .. } => Some(effective_abi as u32),
                _ => None,
            };
            let (st, detail) = match status.ruleset {
                RulesetStatus::FullyEnforced => (ConfinementStatus::FullyEnforced, None),
                RulesetStatus::PartiallyEnforced => (
                    ConfinementStatus::PartiallyEnforced,
                    Some("the kernel's Landlock ABI lacks some access rights".to_owned()),
                ),
                RulesetStatus::NotEnforced => (
                    ConfinementStatus::NotEnforced,
                    Some(not_enforced(&status.landlock)),
                ),
            };
            KernelConfinement {
                mechanism: "landlock",
                status: st,
                abi: abi_num,
                writable: shown,
                detail,
            }
        }
        Err(e) => KernelConfinement {
            mechanism: "landlock",
            status: ConfinementStatus::Unavailable,
            abi: None,
            writable: shown,
            detail: Some(e.to_string()),
        },
    }
}

/// Restricts nothing where Landlock does not exist.
#[cfg(not(target_os = "linux"))]
pub fn restrict_to_dirs(writable: &[(&str, BorrowedFd<'_>)]) -> KernelConfinement {
    KernelConfinement {
        mechanism: "landlock",
        status: ConfinementStatus::Unavailable,
        abi: None,
        writable: writable.iter().map(|(p, _)| (*p).to_owned()).collect(),
        detail: Some("Landlock exists only on Linux".to_owned()),
    }
}

/// `path` opened to name it to the kernel (`O_PATH`), or why it could not be.
fn open_path(path: &Path) -> Result<OwnedFd, String> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        format!(
            "{} could not be opened to grant access beneath it: {}",
            path.display(),
            crate::error::io_words(&e.into())
        )
    })
}

/// The report of a process left unrestricted because `why`.
fn unrestricted(writable: Vec<String>, why: String) -> KernelConfinement {
    KernelConfinement {
        mechanism: "landlock",
        status: ConfinementStatus::Unavailable,
        abi: None,
        writable,
        detail: Some(format!("{why}; nothing was restricted")),
    }
}

/// Why Landlock did not confine this process, for operators and agents.
#[cfg(target_os = "linux")]
fn not_enforced(landlock: &landlock::LandlockStatus) -> String {
    use landlock::LandlockStatus;
    let why = match landlock {
        LandlockStatus::NotImplemented => {
            "the kernel has no Landlock (Linux 5.13 or later built with it is needed)"
        }
        LandlockStatus::NotEnabled => {
            "the kernel has Landlock but it is not enabled (add landlock to the lsm= boot parameter)"
        }
        _ => "the kernel refused the ruleset",
    };
    format!("{why}; writes are still confined by the roots' directory handles")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// Said in words, not as a Rust value (it was "NotImplemented").
    #[test]
    fn why_landlock_is_not_enforced_is_said_in_words() {
        let why = super::not_enforced(&landlock::LandlockStatus::NotImplemented);
        assert!(why.starts_with("the kernel has no Landlock"), "{why}");
        assert!(!why.contains("NotImplemented"));
        let why = super::not_enforced(&landlock::LandlockStatus::NotEnabled);
        assert!(why.contains("lsm="), "{why}");
    }
}
