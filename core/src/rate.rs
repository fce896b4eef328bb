//! A token bucket: at most `burst` events at once and `per_second` on average.
//!
//! Bounds what anyone who can send us requests can make us write (without it, a
//! burst of forged admission reviews would write two audit rows each). The clock is
//! passed in, so the bucket stays pure and its tests need no sleeps.

use std::time::{Duration, Instant};

/// One bucket. Not shared by itself: callers keep it behind their own lock.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens, refilled at `per_second`. A zero burst
    /// allows nothing.
    pub fn new(burst: u32, per_second: f64) -> Self {
        let per_second = if per_second.is_finite() && per_second > 0.0 {
            per_second
        } else {
            0.0
        };
        Self {
            burst: f64::from(burst),
            per_second,
            tokens: f64::from(burst),
            last: None,
        }
    }

    /// Takes a token at `now` if one is left; `false`: over the rate, drop the event.
    pub fn allow(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last);
            self.tokens = (self.tokens + elapsed.as_secs_f64() * self.per_second).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until the next token, from the last call (for logs and tests).
    pub fn refill_time(&self) -> Option<Duration> {
        (self.per_second > 0.0).then(|| Duration::from_secs_f64(1.0 / self.per_second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(3, 2.0);
        let allowed = (0..100).filter(|_| bucket.allow(start)).count();
        assert_eq!(allowed, 3);
        // Half a second later: one more token (2 per second).
        let later = start + Duration::from_millis(500);
        assert!(bucket.allow(later));
        assert!(!bucket.allow(later));
        // A long pause refills up to the burst, not beyond.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| bucket.allow(much_later)).count(), 3);
        assert_eq!(bucket.refill_time(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn odd_settings_allow_at_most_the_burst() {
        let now = Instant::now();
        let mut none = TokenBucket::new(0, 10.0);
        assert!(!none.allow(now));
        for rate in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            let mut bucket = TokenBucket::new(1, rate);
            assert!(bucket.allow(now));
            assert!(!bucket.allow(now + Duration::from_secs(3600)), "{rate}");
            assert_eq!(bucket.refill_time(), None);
        }
        // A clock that goes backwards adds nothing.
        let mut bucket = TokenBucket::new(1, 1.0);
        assert!(bucket.allow(now + Duration::from_secs(10)));
        assert!(!bucket.allow(now));
    }
}
