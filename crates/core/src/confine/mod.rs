//! Confinement: the only module that touches the filesystem.
//!
//! [`path`] holds the string-level checks that name a refusal; [`root`] holds the sandbox
//! root handles through which every write goes; [`state`] holds the runtime's own state
//! directory (registry, audit log, locks), which no action can reach.

pub mod kernel;
pub mod path;
pub mod root;
pub mod state;
mod unseen;

pub use path::{
    ExtensionPolicy, MAX_PATH_DEPTH, RelPath, Resolved, check_path_depth, check_reserved,
    detect_path_traversal, is_within_sandbox, normalize_extension, resolve_sandbox_path,
};
pub use root::{
    DirId, EntryKind, PathKind, SandboxRoot, TargetInfo, TargetKind, Walk, WrittenFile,
    read_operator_file,
};
