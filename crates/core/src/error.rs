//! The library's error type: things that went wrong, as opposed to refusals.

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
    /// followed.
    #[error("roots {} and {} overlap: {} is {} or lies inside it once symbolic links are followed, so the one's '.rollback/' would be writable through the other; give separate directories", .outer.display(), .inner.display(), .inner.display(), .outer.display())]
    RootsOverlap {
        /// The root that holds the other.
        outer: PathBuf,
        /// The root inside it.
        inner: PathBuf,
    },
    /// The state directory cannot be created or opened.
    #[error("{}", state_dir_message(.path, .source))]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The state directory lies inside a sandbox root.
    #[error("state directory {} lies inside the sandbox root {}; it must be outside every root", .state_dir.display(), .root.display())]
    StateDirInsideRoot {
        /// The state directory.
        state_dir: PathBuf,
        /// The root.
        root: PathBuf,
    },
    /// Reading or writing the registry or audit log failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
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
