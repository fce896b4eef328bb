//! The warning before an idle reclaim (the PRD's R2: an Event before reclaiming). A pod
//! idle for its whole window is first warned, with a Warning Event that says when its
//! GPU processes end; they end only if it is still idle then. Any GPU activity in
//! between withdraws the warning, and a later idle window warns again. Pure: the agent
//! asks, each round, what is next for each pod idle for its whole window.
//!
//! Kept in memory only: a restarted agent has forgotten its warnings and also counts
//! the idle samples again from zero, so a pod is warned again before any reclaim.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};

/// A warning given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warned {
    /// The pod's last GPU activity when it was warned: the idle period warned of.
    pub idle_since: DateTime<Utc>,
    pub at: DateTime<Utc>,
    /// When its GPU processes end if it stays idle.
    pub ends_at: DateTime<Utc>,
}

/// What is next for a pod idle for its whole window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Warn it now: its processes end at `ends_at` unless it uses the GPU.
    Warn { ends_at: DateTime<Utc> },
    /// Warned; its warning period runs until `ends_at`.
    Wait { ends_at: DateTime<Utc> },
    /// Reclaim it now (`warned`: the warning it had, if any).
    Reclaim { warned: Option<Warned> },
}

/// The warnings given, by pod UID.
#[derive(Debug, Default)]
pub struct Warnings {
    by_uid: HashMap<String, Warned>,
}

impl Warnings {
    /// What is next for pod `uid`, idle since `idle_since` for its whole window, at
    /// `now`, with a warning period of `period` (zero or less: no warning, reclaim).
    pub fn next(
        &self,
        uid: &str,
        idle_since: DateTime<Utc>,
        now: DateTime<Utc>,
        period: TimeDelta,
    ) -> Next {
        if period <= TimeDelta::zero() {
            return Next::Reclaim { warned: None };
        }
        match self.by_uid.get(uid) {
            // A warning of an earlier idle period says nothing of this one.
            Some(w) if w.idle_since == idle_since => {
                if now >= w.ends_at {
                    Next::Reclaim { warned: Some(*w) }
                } else {
                    Next::Wait { ends_at: w.ends_at }
                }
            }
            _ => Next::Warn {
                ends_at: now + period,
            },
        }
    }

    /// Notes that pod `uid` was warned (its Event recorded): the period counts from
    /// now.
    pub fn warned(&mut self, uid: &str, warned: Warned) {
        self.by_uid.insert(uid.to_owned(), warned);
    }

    pub fn get(&self, uid: &str) -> Option<&Warned> {
        self.by_uid.get(uid)
    }

    /// Withdraws the warnings of pods that are no longer idle for their whole window
    /// (they used the GPU, were exempted, or are gone), and returns their UIDs.
    pub fn withdraw_unless(&mut self, still_idle: impl Fn(&str) -> bool) -> Vec<String> {
        let gone: Vec<String> = self
            .by_uid
            .keys()
            .filter(|uid| !still_idle(uid))
            .cloned()
            .collect();
        for uid in &gone {
            self.by_uid.remove(uid);
        }
        gone
    }

    /// Forgets pod `uid`'s warning (it was acted on).
    pub fn forget(&mut self, uid: &str) {
        self.by_uid.remove(uid);
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap() + TimeDelta::minutes(minute)
    }

    const FIVE: TimeDelta = TimeDelta::minutes(5);

    /// One round for pod "a" idle since `idle_since`, acting as the agent does: a
    /// warning is noted when given.
    fn round(w: &mut Warnings, idle_since: i64, now: i64) -> Next {
        let next = w.next("a", at(idle_since), at(now), FIVE);
        if let Next::Warn { ends_at } = next {
            w.warned(
                "a",
                Warned {
                    idle_since: at(idle_since),
                    at: at(now),
                    ends_at,
                },
            );
        }
        next
    }

    #[test]
    fn warned_first_then_reclaimed_when_the_period_is_over() {
        let mut w = Warnings::default();
        assert_eq!(round(&mut w, 0, 30), Next::Warn { ends_at: at(35) });
        for m in 31..35 {
            assert_eq!(round(&mut w, 0, m), Next::Wait { ends_at: at(35) });
        }
        let warned = Warned {
            idle_since: at(0),
            at: at(30),
            ends_at: at(35),
        };
        assert_eq!(
            round(&mut w, 0, 35),
            Next::Reclaim {
                warned: Some(warned)
            }
        );
        w.forget("a");
        assert!(w.is_empty());
    }

    #[test]
    fn activity_withdraws_the_warning_and_a_later_idle_period_warns_again() {
        let mut w = Warnings::default();
        round(&mut w, 0, 30);
        // Minute 32: the pod used the GPU, so it is no longer idle for its window.
        assert_eq!(w.withdraw_unless(|_| false), vec!["a".to_owned()]);
        assert!(w.get("a").is_none());
        // Idle again from minute 32, for a whole window by minute 62: a new warning.
        assert_eq!(round(&mut w, 32, 62), Next::Warn { ends_at: at(67) });
        // A warning of another idle period never reclaims this one.
        w.warned(
            "a",
            Warned {
                idle_since: at(0),
                at: at(30),
                ends_at: at(35),
            },
        );
        assert_eq!(round(&mut w, 32, 70), Next::Warn { ends_at: at(75) });
    }

    #[test]
    fn no_period_no_warning() {
        let w = Warnings::default();
        assert_eq!(
            w.next("a", at(0), at(30), TimeDelta::zero()),
            Next::Reclaim { warned: None }
        );
    }

    #[test]
    fn pods_still_idle_keep_their_warning() {
        let mut w = Warnings::default();
        round(&mut w, 0, 30);
        assert!(w.withdraw_unless(|uid| uid == "a").is_empty());
        assert_eq!(w.len(), 1);
    }
}
