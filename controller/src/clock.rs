//! Where "now" comes from. Timers run on tokio's clock; the wall time that
//! `terminate-at` is compared with comes from a [`Clock`], so tests can pause tokio's
//! clock (`start_paused`) and have the wall time follow it, never sleeping for real.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A wall clock that moves with tokio's (pausable) clock from a given start: under
/// `tokio::time::pause()` it jumps exactly as far as tokio's auto-advance does.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: DateTime<Utc>,
    at: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(start: DateTime<Utc>) -> Self {
        Self {
            start,
            at: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now().duration_since(self.at);
        self.start + TimeDelta::from_std(elapsed).unwrap_or(TimeDelta::MAX)
    }
}

/// How long from `now` until `at` (zero when `at` has passed), for a tokio timer.
pub fn until(now: DateTime<Utc>, at: DateTime<Utc>) -> std::time::Duration {
    (at - now).to_std().unwrap_or_default()
}
