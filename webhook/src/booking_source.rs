//! The booking service, as the webhook uses it: the answer for a GPU pod's owner, and
//! audit reports. Nothing else: an admission review never asks for a pod to be ended
//! (the controller preempts from the cluster's state alone).
//!
//! The answer comes from the live replica ([`crate::replica`], the default: no call
//! on the admission path) or, with `--decide-from lookup`, from one schedulability
//! lookup per GPU pod (shared by concurrent lookups for the same user and reused for a
//! few seconds). Audit reports join a bounded queue that one task sends in batches
//! (`POST /api/v1/audit/batch`); [`BookingSource::flush`] sends what is queued (a
//! clean shutdown calls it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpu_booking_client::{AuditReport, ClientError};
use gpu_booking_core::admission::{Ask, Schedulability};
use gpu_booking_core::rate::TokenBucket;
use gpu_booking_core::wire::{AuditBatch, MAX_AUDIT_BATCH};
use tokio::sync::{mpsc, OnceCell};

use crate::error::BookingError;
use crate::metrics::{CallLabel, Metrics};
use crate::replica::{ReplicaHandle, ReplicaOptions};

/// How long a failed lookup is shared before the next admission tries again.
const ERROR_TTL: Duration = Duration::from_secs(1);
/// Entries kept before expired ones are first swept; later sweeps come when the
/// cache has doubled since the last ([`LookupCache`]).
const CACHE_SWEEP_AT: usize = 4096;
/// Audit reports waiting to be sent at most; beyond, they are dropped (and counted).
const AUDIT_QUEUE: usize = 4096;
/// Audit reports sent in one batch at most: all the service takes.
const AUDIT_BATCH: usize = MAX_AUDIT_BATCH;
/// How long the first report of a batch waits for more before the batch is sent.
/// Without a wait a batch would go out as soon as the previous call returned, so at
/// a high audit rate each call (and booking-service transaction) would carry one or
/// two reports; with it, a second of reports at any rate is about 20 calls. A flush
/// (shutdown) does not wait.
const AUDIT_LINGER: Duration = Duration::from_millis(50);
/// Tries of one batch before its reports are dropped (and counted).
const AUDIT_TRIES: u32 = 3;
/// Audit reports of one kind let through at once, and per second after that, unless
/// [`BookingSource::with_audit_rate`] says otherwise.
const AUDIT_BURST: u32 = 20;
const AUDIT_PER_SECOND: f64 = 2.0;

pub use gpu_booking_client::TokenSource;

type Answer = Result<Arc<Schedulability>, BookingError>;

/// What the audit sender is sent.
enum AuditMessage {
    Report(AuditReport),
    /// Answered once every report queued before it was sent (or given up).
    Flush(tokio::sync::oneshot::Sender<()>),
}

struct Entry {
    created: Instant,
    cell: OnceCell<(Instant, Answer)>,
}

impl Entry {
    /// In flight (asked less than its time to live ago), or answered less than its
    /// time to live ago. A lookup whose caller timed out leaves its cell empty, so an
    /// empty cell counts as in flight only for the time to live: otherwise such
    /// entries would never be swept.
    fn is_fresh(&self, ttl: Duration, now: Instant) -> bool {
        match self.cell.get() {
            None => now.duration_since(self.created) < ttl,
            Some((at, Ok(_))) => now.duration_since(*at) < ttl,
            Some((at, Err(_))) => now.duration_since(*at) < ttl.min(ERROR_TTL),
        }
    }
}

/// The lookups by query (`--decide-from lookup`), shared by the admissions that ask
/// the same. Expired entries are swept when the cache reaches twice its size after
/// the last sweep (at least [`CACHE_SWEEP_AT`]), so that sweeps cost a constant
/// share of the inserts: a sweep on every miss once that many entries are fresh
/// would walk them all each time.
#[derive(Default)]
struct LookupCache {
    entries: HashMap<(&'static str, String), Arc<Entry>>,
    sweep_at: usize,
}

impl LookupCache {
    fn insert(&mut self, key: (&'static str, String), entry: Arc<Entry>, ttl: Duration) {
        if self.entries.len() >= self.sweep_at.max(CACHE_SWEEP_AT) {
            self.entries.retain(|_, e| e.is_fresh(ttl, entry.created));
            self.sweep_at = self.entries.len() * 2;
        }
        self.entries.insert(key, entry);
    }
}

/// The booking service as the webhook uses it: a layer over the one HTTP client
/// ([`gpu_booking_client::BookingClient`]) that adds the replica, the single-flight
/// cache of lookups and the batched, rate-limited audit queue.
pub struct BookingSource {
    timeout: Duration,
    ttl: Duration,
    cache: Mutex<LookupCache>,
    side_calls_started: AtomicU64,
    audit_queue: OnceLock<mpsc::Sender<AuditMessage>>,
    /// The shared client of the booking service (lookups, replica reads, audit
    /// batches).
    client: Arc<gpu_booking_client::BookingClient>,
    /// Where admissions are answered from; `None`: a lookup per GPU pod.
    replica: Option<Arc<ReplicaHandle>>,
    /// One token bucket per audit action: whoever can reach `/mutate` cannot make us
    /// write more than the rate. Actions come from our own code, a closed set.
    audit_rate: Mutex<HashMap<String, TokenBucket>>,
    audit_limits: (u32, f64),
    metrics: Arc<Metrics>,
}

impl BookingSource {
    pub fn new(
        base: &str,
        token: TokenSource,
        timeout: Duration,
        ttl: Duration,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let client = Arc::new(
            gpu_booking_client::BookingClient::new(
                base,
                token,
                timeout,
                concat!("gpu-booking-webhook/", env!("CARGO_PKG_VERSION")),
            )
            .map_err(|e| anyhow::anyhow!("--booking-url: {e}"))?,
        );
        Ok(Self {
            client,
            replica: None,
            timeout,
            ttl,
            cache: Mutex::new(LookupCache::default()),
            side_calls_started: AtomicU64::new(0),
            audit_queue: OnceLock::new(),
            audit_rate: Mutex::new(HashMap::new()),
            audit_limits: (AUDIT_BURST, AUDIT_PER_SECOND),
            metrics,
        })
    }

    /// Answers admissions from a live replica (started here, on the current runtime)
    /// instead of a lookup per GPU pod.
    pub fn with_replica(mut self, options: ReplicaOptions) -> Self {
        let replica = ReplicaHandle::new(options, self.metrics.clone());
        replica.spawn(self.client.clone());
        self.replica = Some(replica);
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The replica, when admissions are answered from one.
    pub fn replica(&self) -> Option<&Arc<ReplicaHandle>> {
        self.replica.as_ref()
    }

    /// Lets through at most `burst` audit reports of one kind at once and
    /// `per_second` on average; the rest are dropped and counted.
    pub fn with_audit_rate(mut self, burst: u32, per_second: f64) -> Self {
        self.audit_limits = (burst, per_second);
        self
    }

    /// The answer to `ask`: from the cache when a fresh answer (or a lookup in flight)
    /// exists, else one call; within the booking timeout either way. For a pod's owner
    /// `?user=` or `?slug=`; for a pod without identity no query (the free units only),
    /// which every such pod shares.
    pub async fn schedulability(&self, ask: Ask<'_>) -> Answer {
        let (kind, value) = match ask {
            Ask::Owner(who) => who.query(),
            Ask::FreeUnits => ("", ""),
        };
        if let Some(replica) = &self.replica {
            let answer = replica.answer(kind, value, self.timeout).await?;
            if let Some(users) = answer.ambiguous {
                // What the service records when it is asked about such a slug.
                tracing::warn!(
                    slug = value,
                    users = users.len(),
                    "a slug names several users; resolved to nobody"
                );
                let action = "webhook.ambiguous_slug";
                self.audit(action, || AuditReport {
                    action: action.to_owned(),
                    subject: Some(value.chars().take(512).collect()),
                    user: None,
                    booking_id: None,
                    details: serde_json::json!({"slug": value, "users": users}),
                });
            }
            return Ok(Arc::new(answer.schedulability));
        }
        let key = (kind, value.to_owned());
        let now = Instant::now();
        let (entry, hit) = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.entries.get(&key) {
                Some(entry) if entry.is_fresh(self.ttl, now) => (entry.clone(), true),
                _ => {
                    let entry = Arc::new(Entry {
                        created: now,
                        cell: OnceCell::new(),
                    });
                    cache.insert(key, entry.clone(), self.ttl);
                    (entry, false)
                }
            }
        };
        Metrics::outcome(
            &self.metrics.cache_lookups,
            if hit { "hit" } else { "miss" },
        );
        let lookup = entry.cell.get_or_init(|| async {
            let answer = self.fetch(ask).await.map(Arc::new);
            (Instant::now(), answer)
        });
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok((_, answer)) => answer.clone(),
            Err(_) => Err(BookingError::Timeout(self.timeout)),
        }
    }

    async fn fetch(&self, ask: Ask<'_>) -> Result<Schedulability, BookingError> {
        let started = Instant::now();
        let result = self
            .client
            .schedulability(ask)
            .await
            .map_err(|e| self.booking_error(e));
        self.metrics
            .booking_duration
            .observe(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        Metrics::outcome(&self.metrics.booking_requests, outcome);
        result
    }

    /// The client's error as the webhook reports it (a timeout names the webhook's
    /// own limit).
    fn booking_error(&self, e: ClientError) -> BookingError {
        match e {
            ClientError::Status { status, .. } => BookingError::Status(status),
            ClientError::Timeout => BookingError::Timeout(self.timeout),
            ClientError::Transport(text) => BookingError::Transport(text),
            ClientError::Body(text) => BookingError::Body(text),
            ClientError::Token(e) => e.into(),
        }
    }

    /// Reports an admission to the audit log. Returns at once: the report joins a
    /// bounded queue that one task sends in batches (one call for the reports of up
    /// to [`AUDIT_LINGER`], at most [`AUDIT_BATCH`]), so that a burst of spawns costs
    /// a few calls and no admission waits for one.
    /// Queues the report of `action` that `report` builds, unless the action's rate
    /// is exceeded: then it is counted and never built (its details are JSON, and
    /// under a storm of reviews almost all of them would be built only to be
    /// dropped).
    pub fn audit(&self, action: &str, report: impl FnOnce() -> AuditReport) {
        if !self.audit_allowed(action) {
            tracing::debug!("audit rate exceeded; report dropped");
            self.count_side_call("audit", "rate_limited");
            return;
        }
        self.side_calls_started.fetch_add(1, Ordering::SeqCst);
        if self
            .queue()
            .try_send(AuditMessage::Report(report()))
            .is_err()
        {
            tracing::warn!("audit queue full; report dropped");
            self.count_side_call("audit", "dropped");
        }
    }

    /// Sends every audit report queued so far; returns when they are sent (or given
    /// up after [`AUDIT_TRIES`]), or after `at_most`.
    pub async fn flush(&self, at_most: Duration) {
        let Some(queue) = self.audit_queue.get() else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = async {
            if queue.send(AuditMessage::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        };
        if tokio::time::timeout(at_most, sent).await.is_err() {
            tracing::warn!("audit reports not all sent before shutdown");
        }
    }

    /// The queue, with its sender task started on first use.
    fn queue(&self) -> &mpsc::Sender<AuditMessage> {
        self.audit_queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(AUDIT_QUEUE);
            tokio::spawn(send_audits(rx, self.client.clone(), self.metrics.clone()));
            tx
        })
    }

    /// Takes a token from the bucket of the report's action.
    fn audit_allowed(&self, action: &str) -> bool {
        let mut buckets = self.audit_rate.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(bucket) = buckets.get_mut(action) {
            return bucket.allow(now);
        }
        let (burst, per_second) = self.audit_limits;
        buckets
            .entry(action.to_owned())
            .or_insert_with(|| TokenBucket::new(burst, per_second))
            .allow(now)
    }

    fn count_side_call(&self, call: &'static str, outcome: &'static str) {
        self.metrics
            .side_calls
            .get_or_create(&CallLabel { call, outcome })
            .inc();
    }

    /// Audit reports started so far (counted before they are
    /// sent, so a test can tell at once that none was started).
    pub fn side_calls_started(&self) -> u64 {
        self.side_calls_started.load(Ordering::SeqCst)
    }
}

/// The reports of one batch, from `first` on: those that arrive within
/// [`AUDIT_LINGER`] of it, at most [`AUDIT_BATCH`]; a flush (shutdown) ends the batch
/// at once, and so does the queue's end. Also the flushes it met, to answer once the
/// batch is sent.
async fn next_batch(
    rx: &mut mpsc::Receiver<AuditMessage>,
    first: AuditMessage,
) -> (Vec<AuditReport>, Vec<tokio::sync::oneshot::Sender<()>>) {
    let mut batch = Vec::new();
    let mut flushes = Vec::new();
    let linger_until = tokio::time::Instant::now() + AUDIT_LINGER;
    let mut next = Some(first);
    while let Some(message) = next.take() {
        match message {
            AuditMessage::Report(report) => batch.push(report),
            AuditMessage::Flush(done) => flushes.push(done),
        }
        if batch.len() >= AUDIT_BATCH || !flushes.is_empty() {
            break;
        }
        next = match rx.try_recv() {
            Ok(message) => Some(message),
            Err(_) => tokio::time::timeout_at(linger_until, rx.recv())
                .await
                .ok()
                .flatten(),
        };
    }
    (batch, flushes)
}

/// Sends the queued reports in batches until every sender is gone.
async fn send_audits(
    mut rx: mpsc::Receiver<AuditMessage>,
    client: Arc<gpu_booking_client::BookingClient>,
    metrics: Arc<Metrics>,
) {
    let count = |outcome: &'static str, n: usize| {
        metrics
            .side_calls
            .get_or_create(&CallLabel {
                call: "audit",
                outcome,
            })
            .inc_by(n as u64);
    };
    while let Some(first) = rx.recv().await {
        let (batch, flushes) = next_batch(&mut rx, first).await;
        if !batch.is_empty() {
            let batch = AuditBatch { reports: batch };
            let mut tries = 0;
            loop {
                tries += 1;
                match client.audit_batch(&batch).await {
                    Ok(_) => {
                        Metrics::outcome(&metrics.audit_batches, "ok");
                        count("ok", batch.reports.len());
                        break;
                    }
                    // Refused as a whole: sending it again would not help.
                    Err(gpu_booking_client::ClientError::Status { status, body })
                        if (400..500).contains(&status) =>
                    {
                        tracing::warn!(
                            status,
                            body,
                            reports = batch.reports.len(),
                            "audit batch refused"
                        );
                        Metrics::outcome(&metrics.audit_batches, "refused");
                        count("error", batch.reports.len());
                        break;
                    }
                    Err(e) if tries >= AUDIT_TRIES => {
                        tracing::warn!(error = %e, reports = batch.reports.len(), "audit batch not sent; dropped");
                        Metrics::outcome(&metrics.audit_batches, "error");
                        count("error", batch.reports.len());
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, tries, "audit batch failed; trying again");
                        tokio::time::sleep(Duration::from_millis(200) * tries).await;
                    }
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(created: Instant) -> Arc<Entry> {
        Arc::new(Entry {
            created,
            cell: OnceCell::new(),
        })
    }

    /// A report over its action's rate is counted and never built; one within it
    /// is built once and queued.
    #[tokio::test]
    async fn a_report_over_the_rate_is_never_built() {
        let source = BookingSource::new(
            "http://127.0.0.1:9",
            gpu_booking_client::TokenSource::Static("t".into()),
            Duration::from_secs(1),
            Duration::from_secs(3),
            Arc::new(Metrics::new()),
        )
        .unwrap()
        .with_audit_rate(2, 0.0);
        let built = std::sync::atomic::AtomicUsize::new(0);
        for n in 0..5 {
            source.audit("webhook.booked", || {
                built.fetch_add(1, Ordering::SeqCst);
                audit_report(n)
            });
        }
        assert_eq!(built.load(Ordering::SeqCst), 2, "the burst, and no more");
        // Another action has a bucket of its own.
        source.audit("webhook.stripped", || {
            built.fetch_add(1, Ordering::SeqCst);
            audit_report(9)
        });
        assert_eq!(built.load(Ordering::SeqCst), 3);
    }

    /// Sweeps come as the cache doubles, not at every miss, and they remove what
    /// expired, lookups that never answered included.
    #[test]
    fn the_lookup_cache_sweeps_as_it_doubles_and_forgets_what_expired() {
        let ttl = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut cache = LookupCache::default();
        let key = |n: usize| ("user", format!("u{n}"));
        for n in 0..CACHE_SWEEP_AT {
            cache.insert(key(n), entry(t0), ttl);
        }
        // All fresh: the first sweep keeps them and sets the next at twice as many.
        cache.insert(key(CACHE_SWEEP_AT), entry(t0), ttl);
        assert_eq!(cache.entries.len(), CACHE_SWEEP_AT + 1);
        assert_eq!(cache.sweep_at, 2 * CACHE_SWEEP_AT);
        // Later, every entry so far has expired unanswered; no sweep before the
        // cache doubles...
        let later = t0 + ttl * 2;
        for n in CACHE_SWEEP_AT + 1..2 * CACHE_SWEEP_AT {
            cache.insert(key(n), entry(later), ttl);
        }
        assert_eq!(cache.entries.len(), 2 * CACHE_SWEEP_AT);
        // ...then one, which keeps only the fresh.
        cache.insert(key(2 * CACHE_SWEEP_AT), entry(later), ttl);
        assert_eq!(cache.entries.len(), CACHE_SWEEP_AT);
        assert!(!cache.entries.contains_key(&key(0)));
        assert_eq!(cache.sweep_at, 2 * (CACHE_SWEEP_AT - 1));
    }

    fn audit_report(n: i64) -> AuditReport {
        AuditReport {
            action: "webhook.booked".into(),
            subject: None,
            user: None,
            booking_id: Some(n),
            details: serde_json::Value::Null,
        }
    }

    fn report(n: i64) -> AuditMessage {
        AuditMessage::Report(audit_report(n))
    }

    fn ids(batch: &[AuditReport]) -> Vec<i64> {
        batch.iter().filter_map(|r| r.booking_id).collect()
    }

    /// A batch holds the reports within 50 ms of its first; a flush sends at once
    /// what came before it; a full batch does not wait.
    #[tokio::test(start_paused = true)]
    async fn a_batch_gathers_its_linger_and_a_flush_or_a_full_batch_ends_it() {
        let (tx, mut rx) = mpsc::channel(AUDIT_BATCH * 2);
        let sender = tokio::spawn(async move {
            // At 0, 10, 20, 30 and 40 ms, then at 65, 75 and 85 ms.
            for n in 0..8 {
                tx.send(report(n)).await.unwrap();
                let gap = if n == 4 { 25 } else { 10 };
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
            let (done, answered) = tokio::sync::oneshot::channel();
            tx.send(report(8)).await.unwrap();
            tx.send(AuditMessage::Flush(done)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            for n in 0..AUDIT_BATCH as i64 + 1 {
                tx.send(report(100 + n)).await.unwrap();
            }
            answered.await.unwrap();
        });
        let first = rx.recv().await.unwrap();
        let started = tokio::time::Instant::now();
        let (batch, flushes) = next_batch(&mut rx, first).await;
        // The one at 65 ms is past the first's linger.
        assert_eq!(ids(&batch), [0, 1, 2, 3, 4]);
        assert!(flushes.is_empty());
        assert_eq!(started.elapsed(), AUDIT_LINGER);
        let first = rx.recv().await.unwrap();
        let (batch, flushes) = next_batch(&mut rx, first).await;
        assert_eq!(ids(&batch), [5, 6, 7, 8], "the flush ends the batch");
        assert_eq!(flushes.len(), 1);
        for done in flushes {
            done.send(()).unwrap();
        }
        let first = rx.recv().await.unwrap();
        let (batch, _) = next_batch(&mut rx, first).await;
        assert_eq!(batch.len(), AUDIT_BATCH, "a full batch goes at once");
        let first = rx.recv().await.unwrap();
        let (batch, _) = next_batch(&mut rx, first).await;
        assert_eq!(ids(&batch), [100 + AUDIT_BATCH as i64]);
        sender.await.unwrap();
    }
}
