//! Unique, time-ordered ids for executions, actions, artifacts, snapshots and temporary
//! files: 32 hex digits, `{unix nanoseconds}{process sequence}{process seed}`. They sort
//! by creation time within a process (the sequence breaks ties), and the seed, drawn once
//! from the OS, keeps processes apart; no system call per id. A clock set back does not
//! make a process's ids go back: their time waits until the clock catches up. Across
//! processes, ids follow each one's clock; what needs the true order of writes (a
//! rollback's) takes it from the audit trail.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

/// The time of the newest id made so far.
static NEWEST: AtomicU64 = AtomicU64::new(0);

#[cfg(feature = "failpoints")]
thread_local! {
    static BEHIND: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Makes this thread's ids those of another process whose clock is `by` behind (none:
/// this process's again). For tests of what a clock set back between runs does.
#[cfg(feature = "failpoints")]
pub fn as_if_clock_behind(by: Option<std::time::Duration>) {
    BEHIND.with(|b| b.set(by.map(|d| d.as_nanos() as u64)));
}

fn seed() -> u32 {
    static SEED: OnceLock<u32> = OnceLock::new();
    *SEED.get_or_init(|| {
        let b = uuid::Uuid::new_v4().into_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ std::process::id().rotate_left(16)
    })
}

/// A fresh id of 32 lowercase hex digits.
pub fn unique() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    #[cfg(feature = "failpoints")]
    if let Some(by) = BEHIND.with(std::cell::Cell::get) {
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        return format!("{:016x}{seq:08x}{:08x}", now.saturating_sub(by), seed());
    }
    let nanos = not_before(&NEWEST, now);
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:016x}{seq:08x}{:08x}", seed())
}

/// `now`, or the newest time handed out when the clock has gone back behind it.
fn not_before(newest: &AtomicU64, now: u64) -> u64 {
    newest.fetch_max(now, Ordering::Relaxed).max(now)
}

/// When an id (or a name ending in one) was made, in Unix nanoseconds.
pub fn nanos(id: &str) -> Option<i64> {
    let tail = id.get(id.len().checked_sub(32)?..)?;
    i64::from_str_radix(tail.get(..16)?, 16).ok()
}

/// The part of an id (or of a name ending in one) that tells which process made it.
pub fn process_seed(id: &str) -> &str {
    id.get(id.len().saturating_sub(8)..).unwrap_or("")
}

/// This process's part of the ids it makes (see [`process_seed`]).
pub fn own_seed() -> String {
    format!("{:08x}", seed())
}

/// Whether an id (or a name ending in one) was made by this process.
pub fn made_here(id: &str) -> bool {
    process_seed(id) == own_seed()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_sorted_and_hex() {
        let ids: Vec<String> = (0..1000).map(|_| unique()).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "time-ordered within a process"
        );
        assert!(
            ids.iter()
                .all(|i| i.len() == 32 && i.bytes().all(|b| b.is_ascii_hexdigit()))
        );
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let made = nanos(&format!("ex_{}", unique())).unwrap();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!((before.as_nanos() as i64..=after.as_nanos() as i64).contains(&made));
        assert_eq!(nanos("short"), None);
    }

    #[test]
    fn a_clock_set_back_does_not_take_ids_back() {
        let newest = AtomicU64::new(0);
        assert_eq!(not_before(&newest, 1_000), 1_000);
        assert_eq!(not_before(&newest, 400), 1_000, "the clock went back");
        assert_eq!(not_before(&newest, 1_500), 1_500, "and caught up");
    }
}
