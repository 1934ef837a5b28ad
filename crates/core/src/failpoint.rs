//! Failure injection for crash-consistency tests. A [`FailPoints`] set belongs to one
//! [`crate::Sandbox`]; production code only asks it whether a named point should fire,
//! which is one uncontended lock when nothing is armed.

use std::collections::HashMap;
use std::sync::Mutex;

/// The points of the write pipeline where a failure can be injected.
pub const POINTS: [&str; 9] = [
    "before_commit",
    "after_snapshot",
    "before_mutate",
    "after_mutate",
    "before_registry",
    "before_audit",
    "during_restore",
    "after_restore",
    "after_mark",
];

/// What an armed point does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// The step returns an I/O error; the pipeline handles it.
    Error,
    /// The thread panics on the spot, skipping every clean-up step: the picture left on
    /// disk is that of a crash (files, logs and in-flight records as they are).
    Crash,
}

/// Armed failure points: name → (hits to let pass, then what to do).
#[derive(Debug, Default)]
pub struct FailPoints {
    armed: Mutex<HashMap<String, (u32, FailMode)>>,
}

impl FailPoints {
    /// Arms `point` to return an error on its `nth` hit from now (1 = the next one).
    pub fn arm(&self, point: &str, nth: u32) {
        self.arm_with(point, nth, FailMode::Error);
    }

    /// Arms `point` to crash on its `nth` hit from now.
    pub fn arm_crash(&self, point: &str, nth: u32) {
        self.arm_with(point, nth, FailMode::Crash);
    }

    fn arm_with(&self, point: &str, nth: u32, mode: FailMode) {
        if let Ok(mut m) = self.armed.lock() {
            m.insert(point.to_owned(), (nth.max(1), mode));
        }
    }

    /// What `point` does now, if it fires (it then disarms).
    pub fn hit(&self, point: &str) -> Option<FailMode> {
        let mut m = self.armed.lock().ok()?;
        let (n, mode) = m.get_mut(point)?;
        *n -= 1;
        if *n == 0 {
            let mode = *mode;
            m.remove(point);
            Some(mode)
        } else {
            None
        }
    }
}
