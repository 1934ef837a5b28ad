//! Unique, time-ordered ids for executions, actions, artifacts, snapshots and temporary
//! files: 32 hex digits, `{unix nanoseconds}{process sequence}{process seed}`. They sort
//! by creation time within a process (the sequence breaks ties), and the seed, drawn once
//! from the OS, keeps processes apart; no system call per id.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

fn seed() -> u32 {
    static SEED: OnceLock<u32> = OnceLock::new();
    *SEED.get_or_init(|| {
        let b = uuid::Uuid::new_v4().into_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ std::process::id().rotate_left(16)
    })
}

/// A fresh id of 32 lowercase hex digits.
pub fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:016x}{seq:08x}{:08x}", seed())
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

/// Whether an id (or a name ending in one) was made by this process.
pub fn made_here(id: &str) -> bool {
    process_seed(id) == format!("{:08x}", seed())
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
}
