//! The webhook's live replica of what it decides on: no call on the
//! admission path. Two tasks feed a [`core` replica](gpu_booking_core::admission::Replica):
//!
//! - the follower lists everything (`GET /api/v1/admission-state`, with the change
//!   stream's position from the same snapshot), then follows
//!   `GET /api/v1/booking-changes?after=P&wait=S` from that position, applying each
//!   booking change; a 410 (resume point gone) lists again;
//! - the refresher reads the figures that do not come through the stream (free units
//!   from the controller's usage reports, units held, VRAM budgets, the rules) every
//!   `--replica-refresh`.
//!
//! The replica knows how old its data is ([`ReplicaHandle::staleness`]: since the
//! older of its last confirmed stream read and its last refresh). Past
//! `--replica-max-staleness` the webhook treats the booking service as down
//! (`--on-booking-error`); within it, admissions are decided from memory even while
//! the service is down.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use gpu_booking_client::{BookingClient, ClientError, Follower};
use gpu_booking_core::admission::replica::{self, Answer, Query};
use gpu_booking_core::admission::{Replica, Schedulability};
use gpu_booking_core::window::BookingStatus;
use tokio::sync::watch;

use crate::error::BookingError;
use crate::metrics::{CallLabel, Metrics};

/// How the replica is fed and how old it may grow.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// Each long poll of the change stream (the service caps it at 30 s). While all
    /// is well the replica's staleness stays under about this.
    pub wait: Duration,
    /// How often the figures are read again.
    pub refresh: Duration,
    /// Past this age the replica is not used (the service counts as down).
    pub max_staleness: Duration,
    /// While the stream says it is held back, the bookings are listed again once the
    /// replica's are this old (`--replica-relist-after`; zero: never).
    pub relist_after: Duration,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(5),
            refresh: Duration::from_secs(1),
            max_staleness: Duration::from_secs(300),
            relist_after: Duration::from_secs(30),
        }
    }
}

/// When each part of the replica was last known to be current.
#[derive(Debug, Clone, Copy, Default)]
struct Fresh {
    /// Every booking change committed before this is applied: the start of the
    /// last listing, or of the last stream read less what the stream said it lags
    /// (`behind_ms`: a long transaction in the booking database holds changes
    /// back), or that of an earlier read while the stream has more to send.
    stream: Option<Instant>,
    /// Start of the last figures read that succeeded.
    figures: Option<Instant>,
}

/// The replica, shared by the admissions (readers) and its two feeding tasks.
pub struct ReplicaHandle {
    state: RwLock<Option<Replica>>,
    fresh: Mutex<Fresh>,
    /// Becomes true at the first listing.
    synced: watch::Sender<bool>,
    options: ReplicaOptions,
    metrics: Arc<Metrics>,
}

impl ReplicaHandle {
    pub fn new(options: ReplicaOptions, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            state: RwLock::new(None),
            fresh: Mutex::new(Fresh::default()),
            synced: watch::channel(false).0,
            options,
            metrics,
        })
    }

    pub fn options(&self) -> &ReplicaOptions {
        &self.options
    }

    /// Starts the follower and the refresher on `client`; they stop when the last
    /// other reference to the handle is gone.
    pub fn spawn(self: &Arc<Self>, client: Arc<BookingClient>) {
        tokio::spawn(follow(Arc::downgrade(self), client.clone()));
        tokio::spawn(refresh(Arc::downgrade(self), client));
    }

    /// How old the replica's data is; `None` before its first listing.
    pub fn staleness(&self) -> Option<Duration> {
        let fresh = *self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = fresh.stream?.min(fresh.figures?);
        Some(oldest.elapsed())
    }

    /// Up to when the bookings (as the stream or a listing brought them) are current.
    fn bookings_current_as_of(&self) -> Option<Instant> {
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).stream
    }

    /// Whether it has listed once and is within its bound.
    pub fn is_current(&self) -> bool {
        self.staleness()
            .is_some_and(|age| age <= self.options.max_staleness)
    }

    /// The booking with `id` as the replica holds it (`None`: unknown, cancelled, or
    /// not listed yet); for tests and the simulated lab, which wait for a booking
    /// they made to reach the webhook.
    pub fn booking(&self, id: i64) -> Option<replica::BookingState> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.as_ref()?.booking(id).cloned()
    }

    /// Waits (at most `at_most`) for a refresh of the figures that started after
    /// this call; whether one came. For tests that changed a figure (a usage report)
    /// and spawn next.
    pub async fn refreshed(&self, at_most: Duration) -> bool {
        let since = Instant::now();
        let deadline = since + at_most;
        loop {
            let fresh = *self.fresh.lock().unwrap_or_else(|e| e.into_inner());
            if fresh.figures.is_some_and(|at| at > since) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Publishes the staleness gauge.
    fn publish(&self) {
        let age = self.staleness().map_or(f64::NAN, |d| d.as_secs_f64());
        self.metrics.replica_staleness.set(age);
    }

    /// The answer for `(kind, value)` (see [`Query::of`]) from memory. Before the
    /// first listing it waits for it, at most `first_sync`; past the staleness bound
    /// it fails, so that `--on-booking-error` applies.
    pub async fn answer(
        &self,
        kind: &str,
        value: &str,
        first_sync: Duration,
    ) -> Result<Answer, BookingError> {
        if !*self.synced.borrow() {
            let mut rx = self.synced.subscribe();
            let waited = tokio::time::timeout(first_sync, rx.wait_for(|s| *s)).await;
            if !matches!(waited, Ok(Ok(_))) {
                return Err(BookingError::NotSynced);
            }
        }
        if let Some(age) = self.staleness() {
            if age > self.options.max_staleness {
                return Err(BookingError::Stale(age));
            }
        }
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let Some(replica) = state.as_ref() else {
            return Err(BookingError::NotSynced);
        };
        replica
            .answer(Query::of(kind, value), Utc::now())
            .map_err(|e| BookingError::Invalid(e.0))
    }

    /// The answer as a [`Schedulability`] only (tests, the bench).
    pub async fn schedulability(
        &self,
        kind: &str,
        value: &str,
    ) -> Result<Schedulability, BookingError> {
        self.answer(kind, value, Duration::ZERO)
            .await
            .map(|a| a.schedulability)
    }

    fn read_counted(&self, call: &'static str, outcome: &'static str) {
        self.metrics
            .replica_reads
            .get_or_create(&CallLabel { call, outcome })
            .inc();
    }

    fn mark(&self, stream: Option<Instant>, figures: Option<Instant>) {
        {
            let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
            // Each read's bound holds, so the newest of them does: a later read
            // that errs further on the old side does not make the replica older.
            if stream.is_some() {
                fresh.stream = fresh.stream.max(stream);
            }
            if figures.is_some() {
                fresh.figures = figures;
            }
        }
        self.publish();
    }

    /// Lists everything; the stream position to follow from.
    async fn list(&self, client: &BookingClient) -> Result<i64, ClientError> {
        let started = Instant::now();
        let state = client.admission_state(true).await.inspect_err(|_| {
            self.read_counted("full", "error");
        })?;
        let Some(position) = state.position else {
            self.read_counted("full", "error");
            return Err(ClientError::Body(
                "a full admission state without a position".into(),
            ));
        };
        let Some(mut replica) = Replica::from_state(state) else {
            self.read_counted("full", "error");
            return Err(ClientError::Body(
                "an admission state without bookings".into(),
            ));
        };
        replica.prune(Utc::now());
        let bookings = replica.bookings();
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Some(replica);
        self.mark(Some(started), Some(started));
        self.synced.send_replace(true);
        self.read_counted("full", "ok");
        tracing::info!(bookings, position, "admission replica listed");
        Ok(position)
    }

    /// Applies one answer of the change stream.
    fn apply(&self, changes: Vec<gpu_booking_client::BookingChange>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let Some(replica) = state.as_mut() else {
            return;
        };
        for change in changes {
            let b = change.booking;
            if b.cancelled_at.is_some() || b.status == BookingStatus::Cancelled {
                replica.remove_booking(b.id);
                continue;
            }
            replica.apply_booking(replica::BookingState {
                id: b.id,
                user: b.user,
                model: b.model,
                units: b.units,
                start: b.start,
                end: b.end,
            });
        }
    }
}

/// Lists, then follows the change stream until the handle is dropped.
async fn follow(handle: std::sync::Weak<ReplicaHandle>, client: Arc<BookingClient>) {
    let mut after: Option<i64> = None;
    let mut failures = 0u32;
    loop {
        let Some(this) = handle.upgrade() else {
            return;
        };
        let result = match after {
            None => this.list(&client).await.map(|p| after = Some(p)),
            Some(position) => {
                let started = Instant::now();
                match client
                    .booking_changes(Some(position), this.options.wait)
                    .await
                {
                    Ok(mut page) => {
                        let n = page.changes.len();
                        let current = page.current_as_of(started);
                        after = Some(page.next);
                        this.apply(std::mem::take(&mut page.changes));
                        this.mark(current, None);
                        if page.calls_for_listing(
                            this.bookings_current_as_of(),
                            this.options.relist_after,
                        ) {
                            tracing::info!(
                                behind_ms = page.behind_ms,
                                "a long transaction in the booking database holds the change stream back; listing again"
                            );
                            after = None;
                        }
                        this.read_counted("changes", "ok");
                        if n > 0 {
                            tracing::debug!(
                                changes = n,
                                next = page.next,
                                "booking changes applied"
                            );
                        }
                        Ok(())
                    }
                    Err(ClientError::Status { status: 410, .. }) => {
                        this.read_counted("changes", "gone");
                        tracing::info!("change stream resume point gone; listing again");
                        after = None;
                        Ok(())
                    }
                    Err(e) => {
                        this.read_counted("changes", "error");
                        Err(e)
                    }
                }
            }
        };
        let pause = match result {
            Ok(()) => {
                failures = 0;
                None
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, failures, staleness = ?this.staleness(), "admission replica cannot read the booking service");
                Some(Follower::backoff(failures).min(Duration::from_secs(5)))
            }
        };
        drop(this);
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
    }
}

async fn refresh(handle: std::sync::Weak<ReplicaHandle>, client: Arc<BookingClient>) {
    let every = match handle.upgrade() {
        Some(this) => this.options.refresh.max(Duration::from_millis(10)),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(this) = handle.upgrade() else {
            return;
        };
        if !*this.synced.borrow() {
            this.publish();
            continue;
        }
        let started = Instant::now();
        match client.admission_state(false).await {
            Ok(state) => {
                if let Some(replica) = this
                    .state
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                {
                    replica.apply_figures(&state);
                    replica.prune(Utc::now());
                }
                this.mark(None, Some(started));
                this.read_counted("figures", "ok");
            }
            Err(e) => {
                this.read_counted("figures", "error");
                this.publish();
                tracing::debug!(error = %e, "admission replica cannot refresh its figures");
            }
        }
    }
}
