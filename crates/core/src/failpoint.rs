//! Failure injection for crash-consistency tests. A [`FailPoints`] set belongs to one
//! [`crate::Sandbox`]; production code only asks it whether a named point should fail,
//! which is one uncontended lock when nothing is armed.

use std::collections::HashMap;
use std::sync::Mutex;

/// The points of the write pipeline where a failure can be injected.
pub const POINTS: [&str; 6] = [
    "after_snapshot",
    "before_mutate",
    "after_mutate",
    "before_registry",
    "before_audit",
    "during_restore",
];

/// Armed failure points: name → how many more hits pass before one fails.
#[derive(Debug, Default)]
pub struct FailPoints {
    armed: Mutex<HashMap<String, u32>>,
}

impl FailPoints {
    /// Arms `point` to fail on its `nth` hit from now (1 = the next one).
    pub fn arm(&self, point: &str, nth: u32) {
        if let Ok(mut m) = self.armed.lock() {
            m.insert(point.to_owned(), nth.max(1));
        }
    }

    /// Whether `point` fails now (it then disarms).
    pub fn hit(&self, point: &str) -> bool {
        let Ok(mut m) = self.armed.lock() else {
            return false;
        };
        let Some(n) = m.get_mut(point) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            m.remove(point);
            true
        } else {
            false
        }
    }
}
