//! Where "now" comes from. Every rule is checked against the application's clock,
//! never the database's `now()`, so tests can stand exactly at a limit.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock, truncated to microseconds (Postgres' resolution) so that a time
/// read back from the database equals the one written.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        let now = Utc::now();
        now - TimeDelta::nanoseconds(i64::from(now.timestamp_subsec_nanos() % 1_000))
    }
}

/// A clock that only moves when told to: for tests at the exact edge of a rule.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock(Arc::new(Mutex::new(start)))
    }

    pub fn set(&self, t: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }

    pub fn advance(&self, d: TimeDelta) {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *guard += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
