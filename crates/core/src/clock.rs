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

    /// Moves forward by `d`.
    pub fn advance(&self, d: chrono::Duration) {
        if let Ok(mut n) = self.now.lock() {
            *n += d;
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

/// Parses a timestamp written by [`timestamp`].
pub fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
