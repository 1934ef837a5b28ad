//! `ailab-sandbox-core`: a governed filesystem capability runtime.
//!
//! Agents submit a plan of write actions; every action passes governance, budgets and a
//! rate limit, its target is snapshotted (SHA-256) before it is touched, the mutation is
//! plain file I/O through a root directory handle, the result is checksummed, registered
//! as an artifact with lineage and appended to a tamper-evident audit trail. Writing is off
//! and dry-run on until the operator turns both.
//!
//! This crate is synchronous and knows nothing of HTTP, MCP or the command line.
//!
//! ```
//! use ailab_sandbox_core::{Config, RollbackOptions, RollbackStatus, Sandbox};
//!
//! let dir = tempfile::tempdir()?;
//! let mut config = Config::with_roots(vec![dir.path().join("root")], dir.path().join("state"));
//! // Secure by default: without both of these, plans are only simulated.
//! config.enable_write = true;
//! config.dry_run = false;
//! let sandbox = Sandbox::open(config)?;
//!
//! let plan = br##"{"actions": [{"intent": "create_file", "path": "notes/hi.md", "content": "# Hi\n"}]}"##;
//! let result = sandbox.run_plan_json(plan)?;
//! assert!(result.is_success());
//! assert_eq!(std::fs::read(dir.path().join("root/notes/hi.md"))?, b"# Hi\n");
//!
//! // Every action can be undone, verified by checksum.
//! let report = sandbox.rollback_workflow(&result.workflow_id, &RollbackOptions::default());
//! assert_eq!(report.status, RollbackStatus::RolledBack);
//! assert!(!dir.path().join("root/notes/hi.md").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Embedding
//!
//! - A [`Sandbox`] is `Send + Sync`: share one behind an `Arc` across threads. Several
//!   instances, in one process or many, may share a state directory; budgets, the rate
//!   limit, the audit chain and rollbacks hold across them (file locks).
//! - Files are created with the process's umask applied. Call
//!   [`confine::root::use_spec_creation_modes`] once at start-up, before any thread, to
//!   get the modes SPEC §2 names (0644, 0755) whatever the inherited umask. It sets the
//!   whole process's umask to 0: every file the host program itself makes afterwards
//!   gets the mode it asks for (`std::fs` asks 0666 and 0777), so a host that writes
//!   files of its own should leave it uncalled (and set a umask of 022 itself) or create
//!   them with explicit modes.
//! - Read plans with [`plan::parse_plan`] (or [`Sandbox::run_plan_json`]): deserializing
//!   a [`plan::Plan`] with serde directly skips the check of the text's numbers, so a
//!   number a double would change (`-0`, `123456789012345678901234567890`, a decimal of
//!   more digits than a double keeps) reaches the file changed, and the limits on a
//!   plan's `data` values and edits ([`plan::MAX_DATA_VALUES_PER_PLAN`],
//!   [`plan::MAX_EDITS_PER_PLAN`]) are not counted as it is read, so a huge plan is
//!   built whole before anything refuses it.
//! - The structured writers rely on `serde_json`'s default map, which keeps keys sorted,
//!   and on its default numbers: a host build that turns on `serde_json`'s
//!   `preserve_order` feature writes keys in the order sent (other bytes and checksums
//!   than the other faces), and one with `arbitrary_precision` writes TOML numbers as
//!   tables. Leave both off: [`Sandbox::open`] refuses to start with either on
//!   ([`Error::SerdeJsonFeature`]).
//! - A write past the file-size limit (`ulimit -f`) raises `SIGXFSZ`, whose default action
//!   ends the process. Ignore or catch it (the binary catches it) and the write fails with
//!   `EFBIG` instead, which the runtime reports and undoes like any I/O error.
//! - Every method is blocking (file I/O, `fsync`): from async code, call it on a blocking
//!   thread (`tokio::task::spawn_blocking`). A method that writes (a run, a rollback, a
//!   prune) or reads the state directory's logs waits for a log or workflow another
//!   instance holds for at most `limits.lock_wait_seconds` (default 30 s), then answers
//!   busy ([`Error::is_busy`], or `conflict` in a result) rather than block for good.
//! - Leave the `internals` feature off (the `failpoints` feature of the tests brings it,
//!   and the benchmark needs it): with it only, `commit_log`, `failpoint`, `ids`,
//!   `journal`, `left_dirs` and `seal` are public modules, `StateDir::open` and
//!   `SandboxRoot::open` are callable from outside the crate, and `Sandbox::registry()` and
//!   `audit_log()` exist, for the tests to reach into. Without it an embedder cannot open a
//!   root or the state directory by hand: it reads through the `Sandbox`'s read methods,
//!   and no root handle, log or registry it could write through behind governance is within
//!   its reach (its own `std::fs` calls are beyond any library's).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[macro_use]
mod wire_enum;

/// Internals the tests and benchmarks reach into: public only with the `internals`
/// feature, which an embedder leaves off.
macro_rules! internals_public_to_tests {
    ($($module:ident),*) => {$(
        #[cfg(feature = "internals")]
        pub mod $module;
        #[cfg(not(feature = "internals"))]
        mod $module;
    )*};
}
internals_public_to_tests!(commit_log, failpoint, ids, journal, left_dirs, seal);

pub mod artifact;
pub mod audit;
pub mod budget;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod confine;
pub mod context;
mod error;
pub mod executor;
pub(crate) mod group_commit;
pub mod hash;
pub mod metrics;
pub mod plan;
pub mod policy;
mod probes;
pub mod reason;
pub(crate) mod recovery;
pub mod sandbox;
pub mod shape_words;
pub mod snapshot;
mod timed_lock;
pub mod workflow;
pub mod yaml;

pub use config::Config;
pub use error::{Error, INVALID_CONFIG, io_words, is_link_loop};
pub use executor::{ActionResult, ActionStatus, RunResult, RunStatus};
pub use plan::Plan;
pub use reason::{ReasonCode, Refusal, Verdict};
pub use recovery::Recovered;
pub use sandbox::Sandbox;
// What the headline calls take and give, beside the `Sandbox`: reachable from the root
// as the run's types are (they stay in `sandbox::` too).
pub use audit::AuditStatus;
pub use sandbox::{CheckRequest, PruneReport, RollbackOptions, RollbackReport, RollbackStatus};
