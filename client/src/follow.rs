//! Following the booking service's change stream (`GET /api/v1/booking-changes`):
//! a listing first, then the changes after it by long poll, resumed from where the
//! last answer ended; a listing again when the service says the resume point is
//! gone (410, past its retention); a growing pause after failures.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_booking_core::wire::{Booking, BookingChange, BookingChanges};

use crate::{BookingClient, ClientError};

/// Where a [`Follower`] reads the stream (the client, or a test's fake).
pub trait ChangeSource: Send + Sync {
    /// `after: None` lists the current bookings; `wait` is the long poll.
    fn booking_changes(
        &self,
        after: Option<i64>,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<BookingChanges, ClientError>> + Send + '_>>;
}

impl ChangeSource for BookingClient {
    fn booking_changes(
        &self,
        after: Option<i64>,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<BookingChanges, ClientError>> + Send + '_>> {
        Box::pin(BookingClient::booking_changes(self, after, wait))
    }
}

/// What one step of following gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// Every current booking (planned or running) and those that ended lately
    /// (`core::booking_end::LISTED_AFTER_END`): the follower's state starts over
    /// from this (at the start, after a 410, and while the stream is held back).
    Listed(Vec<Booking>),
    /// Changes since the last step, in order.
    Changed(Vec<BookingChange>),
    /// The call failed; the follower paused before returning (see [`Follower::failures`]).
    Failed(ClientError),
}

/// Longest pause after failures in a row.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Told what each answer said the stream lags the database (`behind_ms`; `None`
/// for a full answer, with more to read at once): see [`Follower::on_lag`].
pub type LagReport = Arc<dyn Fn(Option<Duration>) + Send + Sync>;

/// Follows the stream: call [`Follower::next`] in a loop.
#[derive(Clone)]
pub struct Follower {
    after: Option<i64>,
    wait: Duration,
    failures: u32,
    on_lag: Option<LagReport>,
    /// See [`Follower::relist_after`] (zero: never).
    relist_after: Duration,
    /// Up to when what it has followed is current (`BookingChanges::current_as_of`;
    /// a listing: its start).
    current_as_of: Option<Instant>,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("after", &self.after)
            .field("wait", &self.wait)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl Follower {
    /// `wait` is each long poll's (the service caps it at 30 s).
    pub fn new(wait: Duration) -> Self {
        Follower {
            after: None,
            wait,
            failures: 0,
            on_lag: None,
            relist_after: Duration::ZERO,
            current_as_of: None,
        }
    }

    /// Lists again while the stream is held back (a long transaction in the booking
    /// database: the changes after it wait for its end) and what it has followed is
    /// `age` old: the rule of `BookingChanges::calls_for_listing`, which the
    /// webhook's replica follows too. A listing reads the bookings themselves, which
    /// the hold does not delay, so what follows stays at most about `age` behind
    /// them. At most one listing per `age`; zero: never.
    pub fn relist_after(mut self, age: Duration) -> Self {
        self.relist_after = age;
        self
    }

    /// Reports each answer's lag (a long transaction in the booking database holds
    /// the stream back; the answers meanwhile have no changes, so [`Follower::next`]
    /// does not return them): for a gauge.
    pub fn on_lag(mut self, report: LagReport) -> Self {
        self.on_lag = Some(report);
        self
    }

    /// Where the next step resumes (`None`: it lists).
    pub fn position(&self) -> Option<i64> {
        self.after
    }

    /// Failed calls in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The pause after `failures` failures in a row: doubling from 0.5 s, at most
    /// [`MAX_BACKOFF`].
    pub fn backoff(failures: u32) -> Duration {
        let doubled = FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        doubled.min(MAX_BACKOFF)
    }

    /// The next listing or changes; long polls (within `wait`) until there is
    /// something. A 410 lists again at once; another failure pauses, then returns.
    pub async fn next(&mut self, source: &dyn ChangeSource) -> Followed {
        loop {
            let listing = self.after.is_none();
            let wait = if listing { Duration::ZERO } else { self.wait };
            let started = Instant::now();
            match source.booking_changes(self.after, wait).await {
                Ok(page) => {
                    self.failures = 0;
                    if let Some(report) = &self.on_lag {
                        report(page.lag());
                    }
                    self.after = Some(page.next);
                    // A listing is current as of its start; a read, as the stream
                    // says (each read's bound holds, so the newest of them does).
                    let current = if listing {
                        Some(started)
                    } else {
                        page.current_as_of(started)
                    };
                    self.current_as_of = self.current_as_of.max(current);
                    if !listing && page.calls_for_listing(self.current_as_of, self.relist_after) {
                        // This answer's changes first (if any); the next step lists.
                        self.after = None;
                    }
                    if listing {
                        return Followed::Listed(
                            page.changes.into_iter().map(|c| c.booking).collect(),
                        );
                    }
                    if !page.changes.is_empty() {
                        return Followed::Changed(page.changes);
                    }
                }
                Err(ClientError::Status { status: 410, .. }) if self.after.is_some() => {
                    self.after = None;
                }
                Err(e) => {
                    self.failures = self.failures.saturating_add(1);
                    tokio::time::sleep(Self::backoff(self.failures)).await;
                    return Followed::Failed(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_booking_core::window::BookingStatus;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Answers from a script, recording what was asked.
    struct Script {
        answers: Mutex<VecDeque<Result<BookingChanges, ClientError>>>,
        asked: Mutex<Vec<Option<i64>>>,
    }

    impl ChangeSource for Script {
        fn booking_changes(
            &self,
            after: Option<i64>,
            _wait: Duration,
        ) -> Pin<Box<dyn Future<Output = Result<BookingChanges, ClientError>> + Send + '_>>
        {
            self.asked.lock().unwrap().push(after);
            let answer = self.answers.lock().unwrap().pop_front().unwrap();
            Box::pin(async move { answer })
        }
    }

    fn booking(id: i64) -> Booking {
        let start = chrono::DateTime::UNIX_EPOCH;
        let end = start + chrono::TimeDelta::days(1);
        Booking {
            id,
            user: "alice".into(),
            model: "a100".into(),
            slot: 0,
            units: 1,
            slots: vec![0],
            start,
            end,
            booked_end: end,
            status: BookingStatus::Active,
            created_at: start,
            cancelled_at: None,
            ended_early_at: None,
            override_rules: false,
            waiting: None,
        }
    }

    fn page(next: i64, ids: &[i64]) -> Result<BookingChanges, ClientError> {
        Ok(BookingChanges {
            changes: ids
                .iter()
                .map(|id| BookingChange {
                    seq: *id,
                    kind: "moved".into(),
                    at: chrono::DateTime::UNIX_EPOCH,
                    booking: booking(*id),
                })
                .collect(),
            next,
            behind_ms: 0,
            more: false,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn lists_follows_resumes_relists_on_410_and_backs_off() {
        let gone = ClientError::Status {
            status: 410,
            body: "{}".into(),
        };
        let down = ClientError::Transport("refused".into());
        let script = Script {
            answers: Mutex::new(VecDeque::from([
                page(10, &[1]),
                page(12, &[]),
                page(15, &[2, 3]),
                Err(down.clone()),
                Err(down.clone()),
                Err(gone),
                page(40, &[4]),
                page(41, &[5]),
            ])),
            asked: Mutex::new(Vec::new()),
        };
        let mut f = Follower::new(Duration::from_secs(30));
        assert!(matches!(f.next(&script).await, Followed::Listed(b) if b.len() == 1));
        // An empty long poll is not returned: the follower polls again from 12.
        assert!(matches!(f.next(&script).await, Followed::Changed(c) if c.len() == 2));
        assert_eq!(f.next(&script).await, Followed::Failed(down.clone()));
        assert_eq!(f.next(&script).await, Followed::Failed(down));
        assert_eq!(f.failures(), 2);
        // 410: listed again, at once.
        assert!(matches!(f.next(&script).await, Followed::Listed(b) if b[0].id == 4));
        assert_eq!(f.failures(), 0);
        assert!(matches!(f.next(&script).await, Followed::Changed(c) if c[0].booking.id == 5));
        assert_eq!(
            *script.asked.lock().unwrap(),
            [
                None,
                Some(10),
                Some(12),
                Some(15),
                Some(15),
                Some(15),
                None,
                Some(40)
            ]
        );
    }

    /// Every answer's lag is reported, those with no changes too (they are how a
    /// held-back stream shows); a full answer reports none.
    #[tokio::test]
    async fn reports_each_answers_lag() {
        let with = |next: i64, ids: &[i64], behind_ms: u64, more: bool| {
            page(next, ids).map(|mut p| {
                p.behind_ms = behind_ms;
                p.more = more;
                p
            })
        };
        let script = Script {
            answers: Mutex::new(VecDeque::from([
                with(10, &[], 0, false),
                with(10, &[], 2500, false),
                with(12, &[1], 0, true),
            ])),
            asked: Mutex::new(Vec::new()),
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut f = Follower::new(Duration::from_secs(1)).on_lag(Arc::new(move |lag| {
            record.lock().unwrap().push(lag);
        }));
        assert!(matches!(f.next(&script).await, Followed::Listed(_)));
        assert!(matches!(f.next(&script).await, Followed::Changed(c) if c.len() == 1));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                Some(Duration::ZERO),
                Some(Duration::from_millis(2500)),
                None
            ]
        );
    }

    /// Held back for longer than `relist_after`: the answer's changes, then a
    /// listing; not again until the listing is that old.
    #[tokio::test]
    async fn lists_again_when_held_back_too_long() {
        let with = |next: i64, ids: &[i64], behind_ms: u64| {
            page(next, ids).map(|mut p| {
                p.behind_ms = behind_ms;
                p
            })
        };
        let script = Script {
            answers: Mutex::new(VecDeque::from([
                with(10, &[], 0),
                with(10, &[], 500),
                with(11, &[1], 2_000),
                with(11, &[], 3_000),
                with(12, &[3], 0),
            ])),
            asked: Mutex::new(Vec::new()),
        };
        let mut f = Follower::new(Duration::from_secs(1)).relist_after(Duration::from_secs(1));
        assert!(matches!(f.next(&script).await, Followed::Listed(_)));
        // Under the bound: followed on. Over it, but listed less than 1 s ago: too.
        // (The listing above was just now.)
        assert!(matches!(f.next(&script).await, Followed::Changed(c) if c[0].seq == 1));
        assert_eq!(f.position(), Some(11));
        // Once what it followed is old enough, an answer held back lists again.
        f.current_as_of = Instant::now().checked_sub(Duration::from_secs(2));
        assert!(matches!(f.next(&script).await, Followed::Listed(b) if b[0].id == 3));
        assert_eq!(
            *script.asked.lock().unwrap(),
            [None, Some(10), Some(10), Some(11), None]
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        assert_eq!(Follower::backoff(1), Duration::from_millis(500));
        assert_eq!(Follower::backoff(2), Duration::from_secs(1));
        assert_eq!(Follower::backoff(4), Duration::from_secs(4));
        assert_eq!(Follower::backoff(7), MAX_BACKOFF);
        assert_eq!(Follower::backoff(u32::MAX), MAX_BACKOFF);
    }
}
