//! The booking service, as the webhook uses it: one schedulability lookup per GPU pod
//! (shared by concurrent lookups for the same user and reused for a few seconds), and
//! fire-and-forget audit reports. Nothing else: an admission review never asks for a
//! pod to be ended (the controller preempts from the cluster's state alone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpu_booking_core::admission::{Ask, Schedulability};
use gpu_booking_core::rate::TokenBucket;
use serde_json::Value;
use tokio::sync::{mpsc, OnceCell};

use crate::metrics::{CallLabel, Metrics};

/// How long a failed lookup is shared before the next admission tries again.
const ERROR_TTL: Duration = Duration::from_secs(1);
/// Entries kept before expired ones are swept.
const CACHE_SWEEP_AT: usize = 4096;
/// Audit reports waiting to be sent at most; beyond, they are dropped (and counted).
const AUDIT_QUEUE: usize = 4096;
/// Audit reports sent at once, each over a kept-alive connection.
const AUDIT_SENDERS: usize = 2;
/// Audit reports of one kind let through at once, and per second after that, unless
/// [`BookingClient::with_audit_rate`] says otherwise.
const AUDIT_BURST: u32 = 20;
const AUDIT_PER_SECOND: f64 = 2.0;

/// Why the booking service gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookingError {
    #[error("booking service answered HTTP {0}")]
    Status(u16),
    #[error("booking service did not answer within {0:?}")]
    Timeout(Duration),
    #[error("booking service unreachable: {0}")]
    Transport(String),
    #[error("booking service sent an unreadable answer: {0}")]
    Body(String),
    #[error("no service token: {0}")]
    Token(String),
}

impl BookingError {
    fn outcome(&self) -> &'static str {
        match self {
            BookingError::Timeout(_) => "timeout",
            _ => "error",
        }
    }
}

pub use gpu_booking_client::TokenSource;

impl From<gpu_booking_client::TokenError> for BookingError {
    fn from(e: gpu_booking_client::TokenError) -> Self {
        BookingError::Token(e.0)
    }
}

type Answer = Result<Arc<Schedulability>, BookingError>;

struct Entry {
    cell: OnceCell<(Instant, Answer)>,
}

impl Entry {
    /// In flight, or answered less than its time to live ago.
    fn is_fresh(&self, ttl: Duration, now: Instant) -> bool {
        match self.cell.get() {
            None => true,
            Some((at, Ok(_))) => now.duration_since(*at) < ttl,
            Some((at, Err(_))) => now.duration_since(*at) < ttl.min(ERROR_TTL),
        }
    }
}

/// The booking service client.
pub struct BookingClient {
    http: reqwest::Client,
    base: String,
    token: TokenSource,
    timeout: Duration,
    ttl: Duration,
    cache: Mutex<HashMap<(&'static str, String), Arc<Entry>>>,
    side_calls_started: AtomicU64,
    audit_queue: OnceLock<mpsc::Sender<Value>>,
    /// One token bucket per audit action: whoever can reach `/mutate` cannot make us
    /// write more than the rate (issue 13). Actions come from our own code, a closed set.
    audit_rate: Mutex<HashMap<String, TokenBucket>>,
    audit_limits: (u32, f64),
    metrics: Arc<Metrics>,
}

impl BookingClient {
    pub fn new(
        base: &str,
        token: TokenSource,
        timeout: Duration,
        ttl: Duration,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(32)
            .tcp_nodelay(true)
            .user_agent(concat!("gpu-booking-webhook/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let base = base.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&base).map_err(|e| anyhow::anyhow!("--booking-url {base:?}: {e}"))?;
        Ok(Self {
            http,
            base,
            token,
            timeout,
            ttl,
            cache: Mutex::new(HashMap::new()),
            side_calls_started: AtomicU64::new(0),
            audit_queue: OnceLock::new(),
            audit_rate: Mutex::new(HashMap::new()),
            audit_limits: (AUDIT_BURST, AUDIT_PER_SECOND),
            metrics,
        })
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
        let key = (kind, value.to_owned());
        let now = Instant::now();
        let (entry, hit) = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.get(&key) {
                Some(entry) if entry.is_fresh(self.ttl, now) => (entry.clone(), true),
                _ => {
                    if cache.len() >= CACHE_SWEEP_AT {
                        cache.retain(|_, e| e.is_fresh(self.ttl, now));
                    }
                    let entry = Arc::new(Entry {
                        cell: OnceCell::new(),
                    });
                    cache.insert(key, entry.clone());
                    (entry, false)
                }
            }
        };
        Metrics::outcome(
            &self.metrics.cache_lookups,
            if hit { "hit" } else { "miss" },
        );
        let lookup = entry.cell.get_or_init(|| async {
            let answer = self.fetch(kind, value).await.map(Arc::new);
            (Instant::now(), answer)
        });
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok((_, answer)) => answer.clone(),
            Err(_) => Err(BookingError::Timeout(self.timeout)),
        }
    }

    async fn fetch(&self, kind: &str, value: &str) -> Result<Schedulability, BookingError> {
        let started = Instant::now();
        let result = self.fetch_uncounted(kind, value).await;
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

    async fn fetch_uncounted(
        &self,
        kind: &str,
        value: &str,
    ) -> Result<Schedulability, BookingError> {
        let token = self.token.token()?;
        let mut request = self
            .http
            .get(format!("{}/api/v1/schedulability", self.base));
        if !kind.is_empty() {
            request = request.query(&[(kind, value)]);
        }
        let response = request
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Err(BookingError::Status(status.as_u16()));
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e))?;
        serde_json::from_slice(&body).map_err(|e| BookingError::Body(e.to_string()))
    }

    fn transport_error(&self, e: reqwest::Error) -> BookingError {
        if e.is_timeout() {
            BookingError::Timeout(self.timeout)
        } else {
            // The chain names the cause (connection refused, reset, ...).
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            BookingError::Transport(text)
        }
    }

    /// Reports an admission to the audit log. Returns at once: the report joins a
    /// bounded queue that [`AUDIT_SENDERS`] tasks send in order over kept-alive
    /// connections (a task and a connection per report would cost more than the
    /// admission itself at a burst of spawns).
    pub fn audit(self: &Arc<Self>, body: Value) {
        if !self.audit_allowed(&body) {
            tracing::debug!("audit rate exceeded; report dropped");
            self.count_side_call("audit", "rate_limited");
            return;
        }
        self.side_calls_started.fetch_add(1, Ordering::SeqCst);
        let queue = self.audit_queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(AUDIT_QUEUE);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            for _ in 0..AUDIT_SENDERS {
                let (this, rx) = (Arc::downgrade(self), rx.clone());
                tokio::spawn(async move {
                    loop {
                        let Some(body) = rx.lock().await.recv().await else {
                            return;
                        };
                        let Some(this) = this.upgrade() else {
                            return;
                        };
                        this.send_counted("audit", "/api/v1/audit", &body).await;
                    }
                });
            }
            tx
        });
        if queue.try_send(body).is_err() {
            tracing::warn!("audit queue full; report dropped");
            self.count_side_call("audit", "dropped");
        }
    }

    /// Takes a token from the bucket of the report's action.
    fn audit_allowed(&self, body: &Value) -> bool {
        let action = body.get("action").and_then(Value::as_str).unwrap_or("");
        let mut buckets = self.audit_rate.lock().unwrap_or_else(|e| e.into_inner());
        let (burst, per_second) = self.audit_limits;
        buckets
            .entry(action.to_owned())
            .or_insert_with(|| TokenBucket::new(burst, per_second))
            .allow(Instant::now())
    }

    fn count_side_call(&self, call: &'static str, outcome: &'static str) {
        self.metrics
            .side_calls
            .get_or_create(&CallLabel { call, outcome })
            .inc();
    }

    async fn send_counted(&self, call: &'static str, path: &'static str, body: &Value) {
        let outcome = match self.post(path, body).await {
            Ok(()) => "ok",
            Err(e) => {
                tracing::warn!(call, error = %e, "booking service call failed");
                "error"
            }
        };
        self.count_side_call(call, outcome);
    }

    /// Audit reports started so far (counted before they are
    /// sent, so a test can tell at once that none was started).
    pub fn side_calls_started(&self) -> u64 {
        self.side_calls_started.load(Ordering::SeqCst)
    }

    async fn post(&self, path: &str, body: &Value) -> Result<(), BookingError> {
        let token = self.token.token()?;
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(BookingError::Status(response.status().as_u16()))
        }
    }
}
