//! A token bucket: at most `burst` events at once and `per_second` on average.
//!
//! Bounds what anyone who can send us requests can make us write (without it, a
//! burst of forged admission reviews would write two audit rows each). The clock is
//! passed in, so the bucket stays pure and its tests need no sleeps.
//!
//! [`KeyedBuckets`] keeps one bucket per key (a client's address) in bounded memory.

use std::collections::HashMap;
use std::hash::Hash;
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

    /// Whether the bucket has refilled to its burst by `now`: it then remembers
    /// nothing a fresh one would not.
    fn is_full(&self, now: Instant) -> bool {
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |last| now.saturating_duration_since(last));
        self.tokens + elapsed.as_secs_f64() * self.per_second >= self.burst
    }

    /// How long until the next token, from the last call (for logs and tests).
    pub fn refill_time(&self) -> Option<Duration> {
        (self.per_second > 0.0).then(|| Duration::from_secs_f64(1.0 / self.per_second))
    }
}

/// How often, at most, a full [`KeyedBuckets`] looks for buckets it can forget.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One [`TokenBucket`] per key, at most `max_keys` of them. A key seen for the first
/// time gets a full bucket; a bucket that has refilled to its burst is forgotten when
/// room is needed (a fresh one is the same). While every kept bucket is still in use,
/// new keys share one overflow bucket: memory stays bounded, and a flood from more
/// keys than that is limited as one source.
#[derive(Debug, Clone)]
pub struct KeyedBuckets<K> {
    burst: u32,
    per_second: f64,
    max_keys: usize,
    buckets: HashMap<K, TokenBucket>,
    overflow: TokenBucket,
    swept: Option<Instant>,
}

impl<K: Hash + Eq + Clone> KeyedBuckets<K> {
    pub fn new(burst: u32, per_second: f64, max_keys: usize) -> Self {
        Self {
            burst,
            per_second,
            max_keys,
            buckets: HashMap::new(),
            overflow: TokenBucket::new(burst, per_second),
            swept: None,
        }
    }

    /// Takes a token of `key`'s bucket at `now`; `false`: `key` is over the rate.
    pub fn allow(&mut self, key: &K, now: Instant) -> bool {
        if let Some(bucket) = self.buckets.get_mut(key) {
            return bucket.allow(now);
        }
        if self.buckets.len() >= self.max_keys {
            self.sweep(now);
        }
        if self.buckets.len() >= self.max_keys {
            return self.overflow.allow(now);
        }
        let mut bucket = TokenBucket::new(self.burst, self.per_second);
        let allowed = bucket.allow(now);
        self.buckets.insert(key.clone(), bucket);
        allowed
    }

    /// Keys with a bucket of their own.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Forgets the buckets that have refilled, at most once per [`SWEEP_EVERY`] (a
    /// sweep walks them all).
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        self.buckets.retain(|_, bucket| !bucket.is_full(now));
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

    #[test]
    fn each_key_has_its_own_bucket() {
        let now = Instant::now();
        let mut keyed = KeyedBuckets::new(2, 1.0, 16);
        assert_eq!((0..10).filter(|_| keyed.allow(&"flood", now)).count(), 2);
        // Another key is not limited by the first one's use.
        assert!(keyed.allow(&"quiet", now));
        assert!(keyed.allow(&"quiet", now));
        assert!(!keyed.allow(&"quiet", now));
        // A second later, each has one more.
        let later = now + Duration::from_secs(1);
        assert!(keyed.allow(&"flood", later));
        assert!(!keyed.allow(&"flood", later));
        assert_eq!(keyed.len(), 2);
    }

    #[test]
    fn memory_is_bounded_and_refilled_buckets_make_room() {
        let now = Instant::now();
        let mut keyed = KeyedBuckets::new(1, 1.0, 3);
        for key in 0..3 {
            assert!(keyed.allow(&key, now));
        }
        // Full of buckets in use: new keys share the overflow bucket (one token).
        assert!(keyed.allow(&10, now));
        assert!(!keyed.allow(&11, now));
        assert_eq!(keyed.len(), 3);
        // A second later the first three have refilled: forgotten, and the new key
        // gets a bucket of its own.
        let later = now + Duration::from_secs(1);
        assert!(keyed.allow(&12, later));
        assert_eq!(keyed.len(), 1);
        // A key still using its bucket is kept: its limit is not reset by the sweep.
        let mut keyed = KeyedBuckets::new(2, 0.5, 1);
        assert!(keyed.allow(&"busy", now));
        assert!(keyed.allow(&"busy", now));
        // Not swept at half a token: "other" draws on the overflow bucket.
        assert_eq!((0..5).filter(|_| keyed.allow(&"other", later)).count(), 2);
        assert!(!keyed.allow(&"busy", later));
        assert_eq!(keyed.len(), 1);
    }
}
