//! The library's error type: things that went wrong, as opposed to refusals.

use crate::confine::state::LockBusy;
use std::path::PathBuf;

/// An error opening or running the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// No configured root could be used.
    #[error("no sandbox root is usable: {}", .problems.join("; "))]
    NoUsableRoot {
        /// Why each root was skipped.
        problems: Vec<String>,
    },
    /// Two roots are one directory, or one lies inside the other, once symlinks are
    /// followed. Roots that overlap as written are refused earlier, as [`Error::Config`].
    #[error("roots {} and {} overlap: {} is {} or lies inside it once symbolic links are followed, so the one's '.rollback/' would be writable through the other; give separate directories", .outer.display(), .inner.display(), .inner.display(), .outer.display())]
    RootsOverlap {
        /// The root that holds the other.
        outer: PathBuf,
        /// The root inside it.
        inner: PathBuf,
    },
    /// The state directory cannot be created or opened.
    #[error("{}", state_dir_message(.path, .cause))]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why (in the message; not a `source`, so that a printed chain says it once).
        cause: std::io::Error,
    },
    /// The state directory lies inside a sandbox root once symlinks are followed. One
    /// that does as written (or a root inside it) is refused earlier, as
    /// [`Error::Config`].
    #[error("state directory {} lies inside the sandbox root {}; it must be outside every root", .state_dir.display(), .root.display())]
    StateDirInsideRoot {
        /// The state directory.
        state_dir: PathBuf,
        /// The root.
        root: PathBuf,
    },
    /// This build's `serde_json` has a feature on that changes the bytes the structured
    /// writers produce (a host crate's dependency can turn one on: features are shared
    /// across a build).
    #[error(
        "this build's serde_json has its `{0}` feature on, which changes what write_json, write_yaml and generate_config write (keys in the order sent, or numbers kept as text): build the host program without it"
    )]
    SerdeJsonFeature(&'static str),
    /// An id given to a read of the registry or trail could not be one (`invalid_id`):
    /// it names nothing they could hold, and is refused rather than taken for unknown,
    /// as the command line, HTTP and MCP refuse it.
    #[error("{}", .0.reason)]
    InvalidId(crate::reason::Refusal),
    /// Reading or writing the registry or audit log failed.
    #[error("{}", io_message(.what, .cause))]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed (in the message; not a `source`, so that a printed chain says it
        /// once).
        cause: std::io::Error,
    },
}

/// The `serde_json` feature on in this build that would change written bytes, if any:
/// `preserve_order` keeps a map's keys in the order sent (the writers rely on them
/// sorted), `arbitrary_precision` keeps numbers as their text.
pub(crate) fn serde_json_feature_on() -> Option<&'static str> {
    let mut map = serde_json::Map::new();
    map.insert("b".to_owned(), serde_json::Value::Null);
    map.insert("a".to_owned(), serde_json::Value::Null);
    if map.keys().next().map(String::as_str) == Some("b") {
        return Some("preserve_order");
    }
    let kept = serde_json::from_str::<serde_json::Value>("1.00").map(|v| v.to_string());
    if kept.as_deref().is_ok_and(|t| t == "1.00") {
        return Some("arbitrary_precision");
    }
    None
}

/// The code of an [`Error`] that is a setting to correct (flags, variables, the config
/// file, the roots or the state directory given), beside the SPEC's refusal codes.
pub const INVALID_CONFIG: &str = "invalid_config";

impl Error {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |cause| Self::Io { what, cause }
    }

    /// The stable code every face gives this error: [`INVALID_CONFIG`] for a setting to
    /// correct (a state directory others could change, or that is no directory, among
    /// them), `conflict` for a log another process of the runtime held past
    /// `limits.lock_wait_seconds` (busy: try again, see [`Self::is_busy`]), an id's own
    /// refusal code, else `io_error`.
    pub fn reason_code(&self) -> &'static str {
        use crate::reason::ReasonCode;
        match self {
            Self::StateDir { .. } if self.is_unsafe_state_dir() => INVALID_CONFIG,
            // A file where the state directory, or one on its way, should be.
            Self::StateDir { cause, .. } if cause.kind() == std::io::ErrorKind::NotADirectory => {
                INVALID_CONFIG
            }
            // A state file others may read or change (the seal key): a setting too.
            Self::Io { cause, .. } if crate::confine::state::NotPrivate::is_cause_of(cause) => {
                INVALID_CONFIG
            }
            _ if self.is_busy() => ReasonCode::Conflict.as_str(),
            Self::Io { .. } | Self::StateDir { .. } => ReasonCode::IoError.as_str(),
            Self::InvalidId(r) => r.reason_code.as_str(),
            Self::Config(_)
            | Self::NoUsableRoot { .. }
            | Self::RootsOverlap { .. }
            | Self::StateDirInsideRoot { .. }
            | Self::SerdeJsonFeature(_) => INVALID_CONFIG,
        }
    }

    /// Whether a log of the state directory was held by another process of the runtime
    /// past `limits.lock_wait_seconds` (a long write, or a stopped or hung process): busy,
    /// not broken; the same call may go through later.
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Io { cause, .. } if LockBusy::is_cause_of(cause))
    }

    /// Whether the state directory was refused because other users could change it: a
    /// setting to correct (`invalid_config`), not a failure of the disk.
    pub fn is_unsafe_state_dir(&self) -> bool {
        matches!(self, Self::StateDir { cause, .. }
            if crate::confine::state::NotPrivate::is_cause_of(cause))
    }

    /// Whether the runtime could not start because it may not write where it must (a
    /// read-only filesystem, or no permission): what reads only, such as verifying the
    /// audit trail, can still be done without it. Never true for a state directory other
    /// users could change ([`Self::is_unsafe_state_dir`]): nothing read there is to be
    /// trusted.
    pub fn is_unwritable(&self) -> bool {
        if self.is_unsafe_state_dir() {
            return false;
        }
        let cause = match self {
            Self::Io { cause, .. } | Self::StateDir { cause, .. } => cause,
            _ => return false,
        };
        matches!(
            cause.kind(),
            std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
        )
    }

    /// Whether the runtime could not start for a reason that leaves its trail readable
    /// as it is on disk: it may not write ([`Self::is_unwritable`]), a state file is of
    /// the wrong kind (a link, folder or FIFO where the seal key or a log should be),
    /// which a read-only verification names again if it is one it reads, or no root is
    /// usable (the trail lies in the state directory alone).
    pub fn allows_read_only_verify(&self) -> bool {
        self.is_unwritable()
            || matches!(self, Self::NoUsableRoot { .. })
            || matches!(self, Self::Io { cause, .. }
                if cause.kind() == std::io::ErrorKind::InvalidData && cause.get_ref().is_some())
    }
}

/// What failed and why, with what to do when the state directory cannot be written or
/// is full: the system's words alone ("Read-only file system (os error 30)") say neither
/// where nor what follows from it.
fn io_message(what: &str, cause: &std::io::Error) -> String {
    match state_advice(cause).or_else(|| limit_advice(cause)) {
        Some(advice) => format!("{what}: {cause}; {advice}"),
        None => format!("{what}: {cause}"),
    }
}

/// What to do about a state directory whose filesystem is full or cannot be written.
fn state_advice(e: &std::io::Error) -> Option<&'static str> {
    use std::io::ErrorKind as K;
    // A file another user took, or one others may read or change, says what to do in
    // its own words.
    if e.get_ref()
        .is_some_and(|r| r.is::<crate::confine::state::TakenFile>())
        || crate::confine::state::NotPrivate::is_cause_of(e)
    {
        return None;
    }
    match e.kind() {
        K::StorageFull => Some(
            "the state directory's filesystem is full, of space or of inodes (df -h, df -i): free some there, then try again",
        ),
        K::QuotaExceeded => Some(
            "the runtime's user has used up its disk quota on the state directory's filesystem, of space or of inodes (quota -s): free some of its files there, or have its quota raised, then try again",
        ),
        K::ReadOnlyFilesystem | K::PermissionDenied => Some(
            "the runtime records every write in its state directory, so this process must be able to write there; only `audit verify` reads it as it is",
        ),
        _ => None,
    }
}

/// Names the state directory once: the reasons its checks give name it already.
fn state_dir_message(path: &std::path::Path, cause: &std::io::Error) -> String {
    let shown = path.display().to_string();
    let why = cause.to_string();
    if why.contains(&shown) {
        why
    } else {
        format!("state directory {shown} cannot be used: {why}")
    }
}

/// An I/O error in a few words for a sentence: its kind ("permission denied", "no storage
/// space"), or, where the kind says nothing (an `EIO` is "uncategorized error"), the
/// system's own words ("Input/output error (os error 5)").
pub fn io_words(e: &std::io::Error) -> String {
    let words = plain_io_words(e);
    match limit_advice(e) {
        Some(advice) => format!("{words} ({advice})"),
        None => words,
    }
}

/// Why a process writes nothing more once a sync of `what` failed: the kernel may have
/// dropped what it could not write, so no later write could be promised durable.
pub(crate) fn sync_failed_words(what: &str, e: &std::io::Error) -> String {
    format!(
        "a sync of {what} failed ({}), so this process writes nothing more; start it again",
        io_words(e)
    )
}

/// What to do about a limit of the process, or a device that failed, the same wherever
/// it is met.
fn limit_advice(e: &std::io::Error) -> Option<&'static str> {
    use rustix::io::Errno;
    let errno = e.raw_os_error();
    if errno == Some(Errno::MFILE.raw_os_error()) || errno == Some(Errno::NFILE.raw_os_error()) {
        Some(
            "the process ran out of open files: raise its limit, ulimit -n, or wait for other work to end, then try again",
        )
    } else if errno == Some(Errno::FBIG.raw_os_error()) {
        Some(
            "a file reached the largest size allowed: the process's file size limit, ulimit -f, or the filesystem's",
        )
    } else if errno == Some(Errno::IO.raw_os_error()) {
        // The system's words ("Input/output error") say nothing of where to look.
        Some(
            "the disk or its filesystem failed to read or write: see the kernel's log (dmesg) and check the disk before trying again",
        )
    } else {
        None
    }
}

/// What to do when the filesystem `fs` names ("the filesystem holding 'a/b.txt'", "the
/// snapshot store .rollback's filesystem") is full or read-only, for refusals of writes
/// in the sandbox (a state file's say where they are: [`state_io_words`]).
pub(crate) fn fs_advice(e: &std::io::Error, fs: &str) -> Option<String> {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::StorageFull => Some(format!(
            "{fs} is full, of space or of inodes (df -h, df -i): free some there, then try again"
        )),
        // `df` shows free space where a quota refuses: the user's share is what is used up.
        K::QuotaExceeded => Some(format!(
            "the runtime's user has used up its disk quota on {fs}, of space or of inodes (quota -s): free some of its files there, or have its quota raised, then try again"
        )),
        K::ReadOnlyFilesystem => Some(format!(
            "{fs} is mounted read-only: mount it writable, then try again"
        )),
        _ => None,
    }
}

/// Whether `e` is `ELOOP`: an open that follows links met a loop (or too many), or one
/// that follows none (`O_NOFOLLOW`, as every open of the runtime's) met a link.
pub fn is_link_loop(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

fn plain_io_words(e: &std::io::Error) -> String {
    // Every open refuses to follow a link (`O_NOFOLLOW`): the loop it reports is the link.
    if is_link_loop(e) {
        return "it is a symbolic link, which is never followed".to_owned();
    }
    // The runtime's own words for a state file of the wrong kind, not "invalid data", or
    // one another user took, not "permission denied".
    if (e.kind() == std::io::ErrorKind::InvalidData && e.get_ref().is_some())
        || e.get_ref()
            .is_some_and(|r| r.is::<crate::confine::state::TakenFile>())
    {
        return e.to_string();
    }
    let kind = e.kind().to_string();
    match kind.as_str() {
        "uncategorized error" | "other error" => e.to_string(),
        // Rust's words for ENOENT.
        "entity not found" => "no such file or directory".to_owned(),
        _ => kind,
    }
}

/// [`io_words`] for a file of the state directory, with what to do when its filesystem is
/// full or cannot be written: the refusal is often the one place an agent or operator
/// sees, and "no storage space" alone does not say where.
pub(crate) fn state_io_words(e: &std::io::Error) -> String {
    match state_advice(e) {
        Some(advice) => format!("{} ({advice})", io_words(e)),
        None => io_words(e),
    }
}

/// Why a log or record of the state directory could not be read or written (`what`:
/// "read the audit trail", "audit the simulated rollback"): another process of the
/// runtime held it past `limits.lock_wait_seconds` (`conflict`, to try again), or an I/O
/// failure (`io_error`).
pub(crate) fn log_refusal(what: &str, e: &std::io::Error) -> crate::reason::Refusal {
    busy_or_failed(
        e,
        || {
            format!(
                "could not {what}: another process of the runtime held it ({e}: a stopped or hung process, or one far behind); nothing was done: try again later, or raise limits.lock_wait_seconds"
            )
        },
        || format!("could not {what}: {}", state_io_words(e)),
    )
}

/// The refusal for `e`, met taking or using something processes share (a lock, a log):
/// `conflict`, in the words `busy` gives, when another process held it past
/// `limits.lock_wait_seconds` (to try again); else `io_error`, in the words `failed`
/// gives.
pub(crate) fn busy_or_failed(
    e: &std::io::Error,
    busy: impl FnOnce() -> String,
    failed: impl FnOnce() -> String,
) -> crate::reason::Refusal {
    use crate::reason::{ReasonCode, Refusal};
    if LockBusy::is_cause_of(e) {
        Refusal::new(ReasonCode::Conflict, busy())
    } else {
        Refusal::new(ReasonCode::IoError, failed())
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// Each face gives an error the same code: busy is `conflict`, a failing disk
    /// `io_error`, a setting to correct `invalid_config`.
    #[test]
    fn an_errors_code_says_whether_to_retry_or_correct() {
        let io = |kind: std::io::ErrorKind| Error::Io {
            what: "read the audit log",
            cause: std::io::Error::new(kind, "x"),
        };
        let busy = Error::Io {
            what: "read the audit log",
            cause: crate::confine::state::LockBusy::error("waited 30 s".to_owned()),
        };
        assert_eq!(busy.reason_code(), "conflict");
        assert!(busy.is_busy());
        // The system's own time-out (a network filesystem's) is a failure, not a holder.
        let timed_out = Error::Io {
            what: "read the audit log",
            cause: std::io::Error::from_raw_os_error(110),
        };
        assert_eq!(timed_out.reason_code(), "io_error");
        assert!(!timed_out.is_busy());
        let refusal = super::log_refusal(
            "read the audit trail",
            &std::io::Error::from_raw_os_error(110),
        );
        assert_eq!(
            refusal.reason_code,
            crate::reason::ReasonCode::IoError,
            "{}",
            refusal.reason
        );
        assert!(
            !refusal.reason.contains("another process"),
            "{}",
            refusal.reason
        );
        assert_eq!(io(std::io::ErrorKind::Other).reason_code(), "io_error");
        assert!(!io(std::io::ErrorKind::Other).is_busy());
        let roots = Error::NoUsableRoot {
            problems: Vec::new(),
        };
        assert_eq!(roots.reason_code(), super::INVALID_CONFIG);
        let id = Error::InvalidId(crate::reason::Refusal::new(
            crate::reason::ReasonCode::InvalidId,
            "x",
        ));
        assert_eq!(id.reason_code(), "invalid_id");
    }

    /// This build writes sorted keys and numbers as doubles: the runtime opens.
    #[test]
    fn this_build_has_no_serde_json_feature_that_changes_bytes() {
        assert_eq!(super::serde_json_feature_on(), None);
    }

    /// The process's own limits are said with what to do, wherever they are met.
    #[test]
    fn the_process_limits_are_said_with_what_to_do() {
        let said = |errno: rustix::io::Errno| {
            super::io_words(&std::io::Error::from_raw_os_error(errno.raw_os_error()))
        };
        assert!(
            said(rustix::io::Errno::MFILE).ends_with("(the process ran out of open files: raise its limit, ulimit -n, or wait for other work to end, then try again)"),
            "{}",
            said(rustix::io::Errno::MFILE)
        );
        assert!(said(rustix::io::Errno::FBIG).contains("ulimit -f"));
        assert!(
            said(rustix::io::Errno::IO).contains("Input/output error")
                && said(rustix::io::Errno::IO).contains("(dmesg)"),
            "{}",
            said(rustix::io::Errno::IO)
        );
        assert_eq!(said(rustix::io::Errno::NOSPC), "no storage space");
        let start = super::Error::Io {
            what: "open the audit log",
            cause: std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error()),
        };
        assert!(
            start
                .to_string()
                .contains("; the process ran out of open files"),
            "{start}"
        );
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        assert!(super::fs_advice(&full, "the filesystem holding 'a.txt'").is_some_and(
            |a| a == "the filesystem holding 'a.txt' is full, of space or of inodes (df -h, df -i): free some there, then try again"
        ));
        // A quota leaves `df` showing room: the user's share is named instead.
        let quota = std::io::Error::from_raw_os_error(rustix::io::Errno::DQUOT.raw_os_error());
        let said = super::fs_advice(&quota, "the filesystem holding 'a.txt'").unwrap_or_default();
        assert!(
            said.contains("disk quota on the filesystem holding 'a.txt'")
                && !said.contains("df -h"),
            "{said}"
        );
        let state = super::state_advice(&quota).unwrap_or_default();
        assert!(
            state.contains("quota") && !state.contains("df -h"),
            "{state}"
        );
    }

    /// A write refused by a full or read-only filesystem names the filesystem of the path
    /// written, not the root's: a folder mounted inside the root may be the read-only one.
    #[test]
    fn a_refused_write_names_the_filesystem_of_its_path() {
        let ro = std::io::Error::from_raw_os_error(rustix::io::Errno::ROFS.raw_os_error());
        let r =
            crate::confine::root::io_refusal("write", &["mnt".to_owned(), "a.txt".to_owned()], &ro);
        assert!(
            r.reason.contains(
                "(the filesystem holding 'mnt/a.txt' is mounted read-only: mount it writable, then try again)"
            ),
            "{}",
            r.reason
        );
    }

    /// A cause is said once, by the message: error chains printed whole (`{:#}`) would
    /// say it twice if it were also the `source`.
    #[test]
    fn causes_are_said_once() {
        let io = || std::io::Error::from_raw_os_error(30);
        for e in [
            Error::io("open the artifact registry")(io()),
            Error::StateDir {
                path: "/s".into(),
                cause: io(),
            },
        ] {
            let shown = e.to_string();
            assert!(shown.contains("os error 30"), "{shown}");
            assert!(std::error::Error::source(&e).is_none(), "{shown}");
            assert!(e.is_unwritable(), "{shown}");
        }
        let full = Error::io("append")(std::io::Error::from_raw_os_error(28));
        assert!(!full.is_unwritable(), "a full disk is not a read-only one");
        assert!(full.to_string().contains("free some there"), "{full}");
        let read_only = Error::io("open the artifact registry")(io()).to_string();
        assert!(
            read_only.contains("must be able to write there"),
            "{read_only}"
        );
    }
}
