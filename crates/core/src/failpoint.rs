//! Failure injection for crash-consistency tests. A [`FailPoints`] set belongs to one
//! [`crate::Sandbox`]; production code only asks it whether a named point should fire (an
//! error, or a crash). Points can be armed only in a build with the `failpoints` feature
//! (the tests'); in any other build nothing can arm them and asking costs nothing.
//!
//! The `failpoints` feature, which the tests turn on and the binary never has, brings
//! `internals`, which the benchmark needs too (see the crate's doc).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The points where a failure can be injected: the write pipeline, rollback, recovery,
/// the logs' syncs, prune, and `get_file_info`'s hash. Arming or passing a point not listed is a bug (a test
/// arming a misspelt point would pass for the wrong reason): debug builds panic on it.
pub const POINTS: [&str; 36] = [
    "after_validate",
    "read_target",
    "target_looked",
    "snapshot_synced",
    "after_snapshot",
    "before_commit",
    "before_mutate",
    "folders_made",
    "after_mutate",
    "before_registry",
    "before_audit",
    "audit_sync",
    "audit_head",
    "batch_sync",
    "trail_order",
    "list_made_dir",
    "during_restore",
    "restore_verify",
    "after_restore",
    "after_mark",
    "mark_restored",
    "record_held",
    "lock_logged_target",
    "replay_staged",
    "open_dead_temp_folder",
    "remove_dead_temp",
    "remove_dead_temp_file",
    "remove_dead_snapshot_temp",
    "remove_unfinished_snapshot",
    "recovery_register",
    "recovery_audit",
    "recovery_sync",
    "during_prune",
    "sync_prune_marks",
    "open_rollback_record",
    "info_hash",
];

/// What an armed point does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// The step returns an I/O error; the pipeline handles it.
    Error,
    /// The thread panics on the spot, skipping every clean-up step: the picture left on
    /// disk is that of a crash (files, logs and in-flight records as they are).
    Crash,
    /// The step returns the system's error of this number (`EROFS`, `EIO`…): what the
    /// pipeline does depends on the cause, as for a read-only or failing disk.
    Errno(i32),
}

/// Something another writer does at a point of the pipeline, to put a race in a test.
pub type Interleave = Arc<dyn Fn() + Send + Sync>;

#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
enum Armed {
    Fail(u32, FailMode),
    Call(Interleave),
}

/// Armed failure points: name → (hits to let pass, then what to do), or what to run there.
#[derive(Default)]
pub struct FailPoints {
    armed: Mutex<HashMap<String, Armed>>,
}

impl std::fmt::Debug for FailPoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .armed
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_struct("FailPoints").field("armed", &names).finish()
    }
}

impl FailPoints {
    /// Arms `point` to return an error on its `nth` hit from now (1 = the next one).
    #[cfg(feature = "failpoints")]
    pub fn arm(&self, point: &str, nth: u32) {
        self.arm_with(point, Armed::Fail(nth.max(1), FailMode::Error));
    }

    /// Arms `point` to crash on its `nth` hit from now.
    #[cfg(feature = "failpoints")]
    pub fn arm_crash(&self, point: &str, nth: u32) {
        self.arm_with(point, Armed::Fail(nth.max(1), FailMode::Crash));
    }

    /// Arms `point` to return the system's error `errno` on its `nth` hit from now.
    #[cfg(feature = "failpoints")]
    pub fn arm_errno(&self, point: &str, nth: u32, errno: i32) {
        self.arm_with(point, Armed::Fail(nth.max(1), FailMode::Errno(errno)));
    }

    /// Runs `f` at the next hit of `point`, then goes on as if nothing was armed: what
    /// another writer could do at that moment.
    #[cfg(feature = "failpoints")]
    pub fn interleave(&self, point: &str, f: Interleave) {
        self.arm_with(point, Armed::Call(f));
    }

    #[cfg(feature = "failpoints")]
    fn arm_with(&self, point: &str, armed: Armed) {
        debug_assert!(
            POINTS.contains(&point),
            "no failure point is named {point:?}"
        );
        if let Ok(mut m) = self.armed.lock() {
            m.insert(point.to_owned(), armed);
        }
    }

    /// Fires `point` as an I/O step would: `Err` for an armed error, a panic for an
    /// armed crash.
    pub fn check(&self, point: &str) -> std::io::Result<()> {
        match self.hit(point) {
            None => Ok(()),
            Some(FailMode::Error) => Err(std::io::Error::other(format!(
                "injected failure at {point}"
            ))),
            Some(FailMode::Errno(e)) => Err(std::io::Error::from_raw_os_error(e)),
            Some(FailMode::Crash) => std::panic::panic_any(format!("injected crash at {point}")),
        }
    }

    /// What `point` does now, if it fires (it then disarms).
    pub fn hit(&self, point: &str) -> Option<FailMode> {
        if !cfg!(feature = "failpoints") {
            return None;
        }
        debug_assert!(
            POINTS.contains(&point),
            "no failure point is named {point:?}"
        );
        let call = {
            let mut m = self.armed.lock().ok()?;
            match m.get_mut(point)? {
                Armed::Fail(n, mode) => {
                    *n -= 1;
                    if *n > 0 {
                        return None;
                    }
                    let mode = *mode;
                    m.remove(point);
                    return Some(mode);
                }
                Armed::Call(_) => match m.remove(point) {
                    Some(Armed::Call(f)) => f,
                    _ => return None,
                },
            }
        };
        // Outside the lock: the other writer may pass armed points of its own.
        call();
        None
    }
}
