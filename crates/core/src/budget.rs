//! Budgets and the rate limit (SPEC §9), as pure functions over durable history: the
//! registry's counts and the audit trail's write times. Nothing lives only in memory, so
//! the limits hold across processes and restarts.

use crate::catalog::human_bytes;
use crate::config::Limits;
use crate::reason::{ReasonCode, Refusal, Verdict};
use chrono::{DateTime, Utc};

/// Artifacts and their bytes, as a workflow's budget counts them: every file version it
/// wrote, at the file's full size (an append counts the whole file it leaves).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Artifacts.
    pub artifacts: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Refuses when one more artifact of `size` bytes would take a workflow past its limits,
/// counting what the registry holds for it (`registered`) and what earlier actions of
/// the same plan would add (`planned`).
pub fn check_budget(
    workflow_id: &str,
    limits: &Limits,
    registered: Usage,
    planned: Usage,
    size: u64,
) -> Verdict {
    let plan_part = |n: u64, added: String| {
        if n > 0 {
            format!(", and earlier actions of this plan add {added}")
        } else {
            String::new()
        }
    };
    let counted = crate::sandbox::counted_u64;
    // What the caller can do: a plan over the limit by itself fits under no workflow id.
    let way_out = |plan_alone_over: bool, limit: &str| {
        let instead = if plan_alone_over {
            "split the plan into plans under different workflow ids"
        } else {
            "write under a new workflow id"
        };
        format!("{instead}, or have the operator raise limits.{limit}")
    };
    let artifacts = registered.artifacts + planned.artifacts;
    if artifacts + 1 > limits.max_artifacts_per_workflow {
        return Err(Refusal::new(
            ReasonCode::BudgetArtifactsExceeded,
            format!(
                "workflow '{workflow_id}' has {}{}; this would make {}, over its limit of {} (artifacts rolled back count too): {}",
                counted(registered.artifacts, "artifact"),
                plan_part(planned.artifacts, format!("{} more", planned.artifacts)),
                artifacts + 1,
                limits.max_artifacts_per_workflow,
                way_out(
                    planned.artifacts + 1 > limits.max_artifacts_per_workflow,
                    "max_artifacts_per_workflow"
                )
            ),
        ));
    }
    let bytes = registered.bytes + planned.bytes;
    let limit_words = match human_bytes(limits.max_workflow_bytes) {
        h if h == counted(limits.max_workflow_bytes, "byte") => h,
        h => format!("{} ({h})", limits.max_workflow_bytes),
    };
    let size_words = counted(size, "byte");
    // No workflow could take it: a new one would be refused alike.
    if size > limits.max_workflow_bytes {
        return Err(Refusal::new(
            ReasonCode::BudgetBytesExceeded,
            format!(
                "a file of {size_words} is larger than a workflow's whole budget of {limit_words}, so no workflow can take it: write less, or have the operator raise limits.max_workflow_bytes"
            ),
        ));
    }
    if bytes + size > limits.max_workflow_bytes {
        return Err(Refusal::new(
            ReasonCode::BudgetBytesExceeded,
            format!(
                "workflow '{workflow_id}' has artifacts of {} in all{}; a file of {size_words} would pass its limit of {limit_words} (every file the workflow writes counts at its full size, rolled back or not): {}",
                counted(registered.bytes, "byte"),
                plan_part(planned.bytes, counted(planned.bytes, "byte")),
                way_out(
                    planned.bytes + size > limits.max_workflow_bytes,
                    "max_workflow_bytes"
                ),
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
/// past one write made at `at` (seconds since the epoch). A bucket is at most empty: a
/// write it could not have let through (made under a higher rate, before the limit was
/// lowered or by a process configured with another) leaves it empty, not in a debt the
/// new rate would take many minutes to pay off.
pub fn advance_tat(tat: f64, at: f64, per_minute: u32) -> f64 {
    // An empty bucket of `per_minute` tokens is a minute's worth of writes ahead.
    (tat.max(at) + 60.0 / f64::from(per_minute.max(1))).min(at + 60.0)
}

/// Replays a history of write times (oldest first) into a TAT.
pub fn replay_tat(history: &[DateTime<Utc>], per_minute: u32) -> f64 {
    history.iter().fold(f64::NEG_INFINITY, |tat, t| {
        advance_tat(tat, epoch_seconds(*t), per_minute)
    })
}

/// A token bucket of `per_minute` tokens a minute with a burst of `per_minute`, whose
/// state `tat` comes from the durable write history. Refuses when `need` tokens are not
/// free at `now`, saying how many seconds until they are; past the burst, the refusal
/// names the plan's `plan_writes` (what it has to be split by; `need` counts up to the
/// action judged).
pub fn check_rate(
    workflow_id: &str,
    per_minute: u32,
    tat: f64,
    now: DateTime<Utc>,
    need: u32,
    plan_writes: u32,
) -> Verdict {
    if need == 0 {
        return Ok(());
    }
    let burst = per_minute.max(1);
    let split = || {
        Refusal::new(
            ReasonCode::RateLimited,
            format!(
                "the plan needs {} writes but workflow '{workflow_id}' may make at most {burst} in a burst ({per_minute} a minute); split it into smaller plans",
                plan_writes.max(need)
            ),
        )
    };
    if need > burst {
        return Err(split());
    }
    let wait = seconds_until_free(per_minute, tat, now, need);
    if wait > 0.0 {
        // No wait lets a plan larger than the burst through: say what does.
        if plan_writes > burst {
            return Err(split());
        }
        // Tenths rounded up, like the whole seconds below: a caller who waits what it
        // reads is never too early.
        let shown = (wait * 10.0).ceil() / 10.0;
        return Err(Refusal::new(
            ReasonCode::RateLimited,
            format!(
                "workflow '{workflow_id}' may make {} a minute; {need} more will be allowed in {shown:.1} seconds",
                crate::sandbox::counted(usize::try_from(per_minute).unwrap_or(usize::MAX), "write")
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
#[allow(clippy::unwrap_used)] // a failed step is a failed test
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0)
            .single()
            .unwrap_or_default()
    }

    /// Writes made under a higher rate (the limit lowered since, or another process's
    /// configuration) leave the bucket empty: the next write waits one interval of the
    /// new rate at most, not one per write made (100 writes at 100 a minute, then 2 a
    /// minute, asked for 49 minutes).
    #[test]
    fn writes_made_under_a_higher_rate_leave_the_bucket_empty_not_in_debt() {
        let hist = vec![t(0); 100];
        let tat = replay_tat(&hist, 2);
        let wait = seconds_until_free(2, tat, t(2), 1);
        assert!((wait - 28.0).abs() < 1e-6, "{wait}");
        assert!(check_rate("w", 2, tat, t(30), 1, 1).is_ok());
        assert!(check_rate("w", 2, tat, t(30), 2, 2).is_err());
        assert!(check_rate("w", 2, tat, t(60), 2, 2).is_ok());
    }

    #[test]
    fn burst_of_ten_then_one_every_six_seconds() {
        let mut hist = Vec::new();
        for _ in 0..10 {
            assert!(check_rate("w", 10, replay_tat(&hist, 10), t(0), 1, 1).is_ok());
            hist.push(t(0));
        }
        let tat = replay_tat(&hist, 10);
        let refused = check_rate("w", 10, tat, t(0), 1, 1)
            .err()
            .map(|r| r.reason_code);
        assert_eq!(refused, Some(ReasonCode::RateLimited));
        assert!((seconds_until_free(10, tat, t(0), 1) - 6.0).abs() < 1e-6);
        assert!(check_rate("w", 10, tat, t(6), 1, 1).is_ok());
        // The wait is shown rounded up: 0.04 s is "0.1", never "0.0".
        let almost = Utc
            .timestamp_micros(1_800_000_000_000_000 + 5_960_000)
            .single()
            .unwrap_or_default();
        let r = check_rate("w", 10, tat, almost, 1, 1).unwrap_err();
        assert!(r.reason.ends_with("allowed in 0.1 seconds"), "{}", r.reason);
        assert_eq!(r.retry_after_seconds, Some(1));
        assert!(check_rate("w", 10, tat, t(59), 10, 10).is_err());
        assert!(check_rate("w", 10, tat, t(60), 10, 10).is_ok());
        assert!(
            r.reason
                .starts_with("workflow 'w' may make 10 writes a minute;")
        );
        let one = replay_tat(&[t(0)], 1);
        let r = check_rate("w", 1, one, t(1), 1, 1).unwrap_err();
        assert!(
            r.reason
                .starts_with("workflow 'w' may make 1 write a minute;"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn budget_edges() {
        let l = Limits::default();
        let used = |artifacts, bytes| Usage { artifacts, bytes };
        let none = Usage::default();
        assert!(check_budget("w", &l, used(98, 0), used(1, 0), 0).is_ok());
        let r = check_budget("w", &l, used(97, 0), used(3, 0), 0).unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::BudgetArtifactsExceeded);
        assert_eq!(
            r.reason,
            "workflow 'w' has 97 artifacts, and earlier actions of this plan add 3 more; this would make 101, over its limit of 100 (artifacts rolled back count too): write under a new workflow id, or have the operator raise limits.max_artifacts_per_workflow"
        );
        // Over the limit by itself: no workflow id takes the plan whole.
        let r = check_budget("w", &l, none, used(100, 0), 0).unwrap_err();
        assert!(
            r.reason.ends_with("(artifacts rolled back count too): split the plan into plans under different workflow ids, or have the operator raise limits.max_artifacts_per_workflow"),
            "{}",
            r.reason
        );
        let max = l.max_workflow_bytes;
        let r = check_budget("w", &l, none, used(1, max - 10), 11).unwrap_err();
        assert!(
            r.reason.ends_with("rolled back or not): split the plan into plans under different workflow ids, or have the operator raise limits.max_workflow_bytes"),
            "{}",
            r.reason
        );
        assert!(check_budget("w", &l, used(0, max - 10), none, 10).is_ok());
        // One of a kind is said so.
        let one = Limits {
            max_artifacts_per_workflow: 1,
            max_workflow_bytes: 1,
            ..Limits::default()
        };
        let r = check_budget("w", &one, used(1, 1), none, 1).unwrap_err();
        assert!(
            r.reason
                .starts_with("workflow 'w' has 1 artifact; this would make 2"),
            "{}",
            r.reason
        );
        let r = check_budget(
            "w",
            &Limits {
                max_artifacts_per_workflow: 9,
                ..one
            },
            used(1, 1),
            none,
            1,
        )
        .unwrap_err();
        assert!(
            r.reason.starts_with("workflow 'w' has artifacts of 1 byte in all; a file of 1 byte would pass its limit of 1 byte ("),
            "{}",
            r.reason
        );
        let r = check_budget("w", &l, used(1, max - 10), none, 11).unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::BudgetBytesExceeded);
        assert_eq!(
            r.reason,
            format!(
                "workflow 'w' has artifacts of {} bytes in all; a file of 11 bytes would pass its limit of {max} (25 MiB) (every file the workflow writes counts at its full size, rolled back or not): write under a new workflow id, or have the operator raise limits.max_workflow_bytes",
                max - 10
            )
        );
        // A file no workflow could take says so, whatever is used; a limit that reads
        // the same in words is given once.
        let small = Limits {
            max_workflow_bytes: 10,
            ..Limits::default()
        };
        let r = check_budget("w", &small, none, none, 11).unwrap_err();
        assert_eq!(r.reason_code, ReasonCode::BudgetBytesExceeded);
        assert_eq!(
            r.reason,
            "a file of 11 bytes is larger than a workflow's whole budget of 10 bytes, so no workflow can take it: write less, or have the operator raise limits.max_workflow_bytes"
        );
        let r = check_budget("w", &small, used(1, 5), none, 6).unwrap_err();
        assert!(
            r.reason.contains("would pass its limit of 10 bytes (every file the workflow writes counts at its full size, rolled back or not): write under a new workflow id"),
            "{}",
            r.reason
        );
    }
}
