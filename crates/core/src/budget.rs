//! Budgets and the rate limit (SPEC §9), as pure functions over durable history: the
//! registry's counts and the audit trail's write times. Nothing lives only in memory, so
//! the limits hold across processes and restarts.

use crate::catalog::human_bytes;
use crate::config::Limits;
use crate::reason::{ReasonCode, Refusal, Verdict};
use chrono::{DateTime, Utc};

/// Refuses when adding `add_artifacts` artifacts of `add_bytes` bytes would take a
/// workflow past its limits.
pub fn check_budget(
    workflow_id: &str,
    limits: &Limits,
    used_artifacts: u64,
    used_bytes: u64,
    add_artifacts: u64,
    add_bytes: u64,
) -> Verdict {
    if used_artifacts + add_artifacts > limits.max_artifacts_per_workflow {
        return Err(Refusal::new(
            ReasonCode::BudgetArtifactsExceeded,
            format!(
                "workflow '{workflow_id}' has {used_artifacts} artifacts; this would make {}, over its limit of {}",
                used_artifacts + add_artifacts,
                limits.max_artifacts_per_workflow
            ),
        ));
    }
    if used_bytes + add_bytes > limits.max_workflow_bytes {
        return Err(Refusal::new(
            ReasonCode::BudgetBytesExceeded,
            format!(
                "workflow '{workflow_id}' has written {used_bytes} bytes; {add_bytes} more would pass its limit of {} ({})",
                limits.max_workflow_bytes,
                human_bytes(limits.max_workflow_bytes)
            ),
        ));
    }
    Ok(())
}

/// Seconds since the epoch, as the rate limiter counts time.
pub fn epoch_seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

/// The token bucket in GCRA form: its whole state is one number, the theoretical arrival
/// time (TAT), `f64::NEG_INFINITY` for a bucket that never saw a write. This moves it
/// past one write made at `at` (seconds since the epoch).
pub fn advance_tat(tat: f64, at: f64, per_minute: u32) -> f64 {
    tat.max(at) + 60.0 / f64::from(per_minute.max(1))
}

/// Replays a history of write times (oldest first) into a TAT.
pub fn replay_tat(history: &[DateTime<Utc>], per_minute: u32) -> f64 {
    history.iter().fold(f64::NEG_INFINITY, |tat, t| {
        advance_tat(tat, epoch_seconds(*t), per_minute)
    })
}

/// A token bucket of `per_minute` tokens a minute with a burst of `per_minute`, whose
/// state `tat` comes from the durable write history. Refuses when `need` tokens are not
/// free at `now`, saying how many seconds until they are.
pub fn check_rate(
    workflow_id: &str,
    per_minute: u32,
    tat: f64,
    now: DateTime<Utc>,
    need: u32,
) -> Verdict {
    if need == 0 {
        return Ok(());
    }
    let burst = per_minute.max(1);
    if need > burst {
        return Err(Refusal::new(
            ReasonCode::RateLimited,
            format!(
                "the plan needs {need} writes but workflow '{workflow_id}' may make at most {burst} in a burst ({per_minute} a minute); split it into smaller plans"
            ),
        ));
    }
    let wait = seconds_until_free(per_minute, tat, now, need);
    if wait > 0.0 {
        return Err(Refusal::new(
            ReasonCode::RateLimited,
            format!(
                "workflow '{workflow_id}' may make {per_minute} writes a minute; {need} more will be allowed in {wait:.1} seconds"
            ),
        )
        // Whole seconds, rounded up: trying again after them never comes too early.
        .retry_after(wait.ceil() as u64));
    }
    Ok(())
}

/// Seconds until `need` tokens are free (0 when they are now).
pub fn seconds_until_free(per_minute: u32, tat: f64, now: DateTime<Utc>, need: u32) -> f64 {
    let per_minute = per_minute.max(1);
    let interval = 60.0 / f64::from(per_minute);
    let tolerance = interval * f64::from(per_minute);
    let now_s = epoch_seconds(now);
    let wait = tat.max(now_s) + interval * f64::from(need) - tolerance - now_s;
    if wait > 1e-9 { wait } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0)
            .single()
            .unwrap_or_default()
    }

    #[test]
    fn burst_of_ten_then_one_every_six_seconds() {
        let mut hist = Vec::new();
        for _ in 0..10 {
            assert!(check_rate("w", 10, replay_tat(&hist, 10), t(0), 1).is_ok());
            hist.push(t(0));
        }
        let tat = replay_tat(&hist, 10);
        let refused = check_rate("w", 10, tat, t(0), 1)
            .err()
            .map(|r| r.reason_code);
        assert_eq!(refused, Some(ReasonCode::RateLimited));
        assert!((seconds_until_free(10, tat, t(0), 1) - 6.0).abs() < 1e-6);
        assert!(check_rate("w", 10, tat, t(6), 1).is_ok());
        assert!(check_rate("w", 10, tat, t(59), 10).is_err());
        assert!(check_rate("w", 10, tat, t(60), 10).is_ok());
    }

    #[test]
    fn budget_edges() {
        let l = Limits::default();
        assert!(check_budget("w", &l, 99, 0, 1, 0).is_ok());
        assert_eq!(
            check_budget("w", &l, 100, 0, 1, 0)
                .err()
                .map(|r| r.reason_code),
            Some(ReasonCode::BudgetArtifactsExceeded)
        );
        assert!(check_budget("w", &l, 0, l.max_workflow_bytes - 10, 1, 10).is_ok());
        assert_eq!(
            check_budget("w", &l, 0, l.max_workflow_bytes - 10, 1, 11)
                .err()
                .map(|r| r.reason_code),
            Some(ReasonCode::BudgetBytesExceeded)
        );
    }
}
