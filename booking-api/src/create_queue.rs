//! Creates that arrive while others are being written go together (issue 17): a
//! create waits in one queue, a worker takes it with whatever else waits (up to
//! [`MAX_BATCH`]) and `store::bookings::create_many` decides them under one
//! transaction's locks and writes them with one statement per table, each still
//! judged alone by `core`, in the order they arrived. A create that finds a worker
//! idle is a batch of one, as before the queue: only load makes batches. What a
//! batch saves is the work paid per transaction and per statement (the round
//! trips, the commit, the executor's start-up): `docs/performance.md`.
//!
//! A create whose request is dropped while it waits in the queue (its client went
//! away, or the server's request timeout ended it) is dropped too: the client was
//! told nothing, or that it failed, so nothing is booked. Once a worker has taken
//! it, it is decided and written whatever happens to the request (as a commit is).

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::metrics::Metrics;
use crate::store::bookings::{self, BookingRow, NewBooking};
use crate::store::StoreError;

/// Workers, each writing one batch at a time (each holds at most one of the pool's
/// connections while it does). Four and batches of up to 16 ran at 0.25 x the bare
/// INSERT rate, eight and batches of up to 8 at 0.24 (`create_rate` bench, 32
/// clients, 2026-11-26): fewer transactions at once meet fewer of each other's locks.
const WORKERS: usize = 4;
/// The most creates in one batch: the longer a batch, the longer each of its
/// creates waits for the others' locks and writing.
pub const MAX_BATCH: usize = 16;
/// Creates that may wait for a worker; beyond that a request waits to be queued.
const QUEUE: usize = 1024;

/// A booking request that owns what it names, so that it can wait in the queue.
pub struct Create {
    pub user: Username,
    pub model: String,
    pub units: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub override_rules: bool,
    pub created_by: String,
}

impl Create {
    fn borrowed(&self) -> NewBooking<'_> {
        NewBooking {
            user: &self.user,
            model: &self.model,
            units: self.units,
            start: self.start,
            end: self.end,
            override_rules: self.override_rules,
            created_by: &self.created_by,
        }
    }
}

struct Job {
    now: DateTime<Utc>,
    create: Create,
    answer: oneshot::Sender<Result<BookingRow, StoreError>>,
}

/// The queue of one API process (`AppState::creates`); cheap to clone.
#[derive(Clone)]
pub struct CreateQueue {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    policy: Arc<Policy>,
    metrics: Arc<Metrics>,
    /// Started by the first create, inside the runtime; the workers end when the
    /// last clone of the queue is dropped (their receiver then closes).
    jobs: OnceLock<mpsc::Sender<Job>>,
}

impl CreateQueue {
    pub fn new(pool: PgPool, policy: Arc<Policy>, metrics: Arc<Metrics>) -> Self {
        CreateQueue {
            inner: Arc::new(Inner {
                pool,
                policy,
                metrics,
                jobs: OnceLock::new(),
            }),
        }
    }

    /// Creates the booking, in a batch with whatever other creates wait meanwhile;
    /// the answer is that of `store::bookings::create`.
    pub async fn create(
        &self,
        now: DateTime<Utc>,
        create: Create,
    ) -> Result<BookingRow, StoreError> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            now,
            create,
            answer,
        };
        let jobs = self.inner.jobs.get_or_init(|| self.start_workers());
        if let Err(mpsc::error::SendError(job)) = jobs.send(job).await {
            // No worker left (the runtime is going down): create it here.
            let Job { now, create, .. } = job;
            return bookings::create(&self.inner.pool, &self.inner.policy, now, create.borrowed())
                .await;
        }
        answered
            .await
            .unwrap_or_else(|_| Err(StoreError::Database(sqlx::Error::WorkerCrashed)))
    }

    fn start_workers(&self) -> mpsc::Sender<Job> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..WORKERS {
            let worker = Worker {
                queue: queue.clone(),
                pool: self.inner.pool.clone(),
                policy: self.inner.policy.clone(),
                metrics: self.inner.metrics.clone(),
            };
            tokio::spawn(worker.run());
        }
        jobs
    }
}

struct Worker {
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    pool: PgPool,
    policy: Arc<Policy>,
    metrics: Arc<Metrics>,
}

impl Worker {
    async fn run(self) {
        while let Some(batch) = self.next_batch().await {
            self.metrics.create_batch_size.observe(batch.len() as f64);
            // On a task of its own, awaited: a panic (a bug) costs its batch's answers
            // (their requests get an error) and not the worker.
            let (pool, policy) = (self.pool.clone(), self.policy.clone());
            let written = tokio::spawn(async move {
                let reqs: Vec<(DateTime<Utc>, NewBooking<'_>)> = batch
                    .iter()
                    .map(|job| (job.now, job.create.borrowed()))
                    .collect();
                let answers = bookings::create_many(&pool, &policy, &reqs).await;
                drop(reqs);
                for (job, answer) in batch.into_iter().zip(answers) {
                    // Its client may have gone: the booking stands all the same.
                    let _ = job.answer.send(answer);
                }
            });
            if let Err(e) = written.await {
                tracing::error!(error = %e, "a batch of booking creates failed");
            }
        }
    }

    /// The first create that waits (waiting for one), with those that wait behind it,
    /// up to [`MAX_BATCH`], leaving out those whose request is gone; `None` once the
    /// queue is closed and empty.
    async fn next_batch(&self) -> Option<Vec<Job>> {
        let mut queue = self.queue.lock().await;
        let mut batch = Vec::new();
        while batch.is_empty() {
            let first = queue.recv().await?;
            batch.extend(wanted(first));
        }
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.extend(wanted(job)),
                Err(_) => break,
            }
        }
        Some(batch)
    }
}

/// The job, unless nobody waits for its answer any more.
fn wanted(job: Job) -> Option<Job> {
    if job.answer.is_closed() {
        tracing::debug!(user = %job.create.user, model = %job.create.model, "a queued create's request is gone: not created");
        return None;
    }
    Some(job)
}
