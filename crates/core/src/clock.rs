//! Time, injected: the rate limiter, timestamps and pruning read a [`Clock`], so tests
//! can move time without sleeping.

use chrono::{DateTime, SecondsFormat, Utc};
use std::sync::{Arc, Mutex};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// Starts at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves by `d` (back when negative), stopping at the first or last instant the
    /// calendar holds.
    pub fn advance(&self, d: chrono::Duration) {
        if let Ok(mut n) = self.now.lock() {
            *n = n
                .checked_add_signed(d)
                .unwrap_or(if d < chrono::Duration::zero() {
                    DateTime::<Utc>::MIN_UTC
                } else {
                    DateTime::<Utc>::MAX_UTC
                });
        }
    }

    /// Sets the time.
    pub fn set(&self, t: DateTime<Utc>) {
        if let Ok(mut n) = self.now.lock() {
            *n = t;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        self.now
            .lock()
            .map(|n| *n)
            .unwrap_or_else(|p| *p.into_inner())
    }
}

/// RFC 3339 with microseconds, `Z` for UTC: the one timestamp format of every record.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a timestamp written by [`timestamp`], including the signed years beyond
/// 0000–9999 it writes (`+10000-01-01T…`), which RFC 3339 has no room for.
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%#z"))
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_timestamp_written_is_read_back() {
        let far = DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z")
            .unwrap()
            .with_timezone(&Utc);
        for t in [
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::UNIX_EPOCH,
            far,
            far + chrono::Duration::microseconds(1),
            DateTime::<Utc>::UNIX_EPOCH - chrono::Duration::days(720_000),
        ] {
            let written = timestamp(t);
            let back = parse_timestamp(&written);
            assert_eq!(
                back.map(timestamp),
                Some(written.clone()),
                "{written} read back"
            );
        }
        assert_eq!(parse_timestamp("soon"), None);
    }

    #[test]
    fn a_manual_clock_stops_at_the_ends_of_the_calendar() {
        let c = ManualClock::new(Utc::now());
        c.advance(chrono::Duration::MAX);
        assert_eq!(c.now(), DateTime::<Utc>::MAX_UTC);
        c.advance(chrono::Duration::MIN);
        c.advance(chrono::Duration::MIN);
        assert_eq!(c.now(), DateTime::<Utc>::MIN_UTC);
    }
}
