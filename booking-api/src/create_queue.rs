//! Creates that arrive while others are being written go together: a
//! create waits in one queue, a worker takes it with whatever else waits (up to
//! [`MAX_BATCH`]) and `store::bookings::create_many` decides them under one
//! transaction's locks and writes them with one statement per table, each still
//! judged alone by `core`, in the order they arrived. A create that finds every
//! worker idle is a batch of one, at once: at low load nothing waits. While another
//! worker is writing, the one that takes a create waits up to [`GATHER`] for more to
//! join it. What a batch saves is the work paid per transaction and per statement
//! (the round trips, the commit, the executor's start-up): two thirds of a lone
//! create's time (`docs/performance.md`, "What each guarantee of a create costs").
//!
//! A create whose request is dropped while it waits in the queue (its client went
//! away, or the server's request timeout ended it) is dropped too: the client was
//! told nothing, or that it failed, so nothing is booked. Once a worker has taken
//! it, it is decided and written whatever happens to the request (as a commit is).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::metrics::Metrics;
use crate::store::bookings::{self, BookingRow, NewBooking};
use crate::store::StoreError;

/// Workers, each writing one batch at a time (each holds at most one of the pool's
/// connections while it does). Few: fewer transactions at once meet fewer of each
/// other's locks, and more workers with shorter batches did no better in the
/// `create_rate` bench.
const WORKERS: usize = 4;
/// The most creates in one batch: the longer a batch, the longer each of its
/// creates waits for the others' locks and writing.
pub const MAX_BATCH: usize = 16;
/// Creates that may wait for a worker; beyond that a request waits to be queued.
const QUEUE: usize = 1024;
/// How long a worker that takes a create waits for more to join it, when another
/// worker is writing (load is there): a lone create pays its transaction's fixed
/// costs, two thirds of its time, so a batch that a few more creates join is
/// cheaper per create, and a wait this short is not felt while another transaction
/// is being written anyway. At low load no worker is writing and nothing waits.
/// What it saves: `docs/performance.md`, "What each mechanism buys".
const GATHER: Duration = Duration::from_millis(2);

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
        let writing = Arc::new(AtomicUsize::new(0));
        for _ in 0..WORKERS {
            let worker = Worker {
                writing: writing.clone(),
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
    /// How many workers are writing a batch now.
    writing: Arc<AtomicUsize>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    pool: PgPool,
    policy: Arc<Policy>,
    metrics: Arc<Metrics>,
}

impl Worker {
    async fn run(self) {
        loop {
            let batch = {
                let mut queue = self.queue.lock().await;
                next_batch(&mut queue, &self.writing).await
            };
            let Some(batch) = batch else { break };
            self.metrics.create_batch_size.observe(batch.len() as f64);
            self.writing.fetch_add(1, Ordering::SeqCst);
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
            let written = written.await;
            self.writing.fetch_sub(1, Ordering::SeqCst);
            if let Err(e) = written {
                tracing::error!(error = %e, "a batch of booking creates failed");
            }
        }
    }
}

/// The first create that waits (waiting for one), with those that wait behind it, up
/// to [`MAX_BATCH`], leaving out those whose request is gone; while another worker
/// is writing (`writing`), also those that arrive within [`GATHER`]. `None` once the
/// queue is closed and empty.
async fn next_batch(queue: &mut mpsc::Receiver<Job>, writing: &AtomicUsize) -> Option<Vec<Job>> {
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
    if writing.load(Ordering::SeqCst) > 0 {
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, queue.recv()).await {
                Ok(Some(job)) => batch.extend(wanted(job)),
                // The window passed, or the queue closed: what is here goes.
                Ok(None) | Err(_) => break,
            }
        }
    }
    Some(batch)
}

/// The job, unless nobody waits for its answer any more.
fn wanted(job: Job) -> Option<Job> {
    if job.answer.is_closed() {
        tracing::debug!(user = %job.create.user, model = %job.create.model, "a queued create's request is gone: not created");
        return None;
    }
    Some(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str) -> (Job, oneshot::Receiver<Result<BookingRow, StoreError>>) {
        let (answer, answered) = oneshot::channel();
        let now = Utc::now();
        let create = Create {
            user: Username::normalised(name, Default::default()).unwrap(),
            model: "a100".into(),
            units: 1,
            start: now,
            end: now + chrono::TimeDelta::hours(1),
            override_rules: false,
            created_by: name.into(),
        };
        (
            Job {
                now,
                create,
                answer,
            },
            answered,
        )
    }

    /// A create sent just after the first is taken: with another worker writing it
    /// joins the batch; with every worker idle the first goes alone, at once.
    async fn batch_with_a_late_create(writing: usize) -> usize {
        let (jobs, mut queue) = mpsc::channel(8);
        let (first, _first_answer) = job("alice");
        let (late, _late_answer) = job("bob");
        jobs.send(first).await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            jobs.send(late).await.unwrap();
            // The sender stays open until the batch is taken.
            jobs
        });
        let batch = next_batch(&mut queue, &AtomicUsize::new(writing))
            .await
            .unwrap();
        drop(sender.await);
        batch.len()
    }

    #[tokio::test]
    async fn a_worker_gathers_only_while_another_writes() {
        assert_eq!(batch_with_a_late_create(1).await, 2);
        assert_eq!(batch_with_a_late_create(0).await, 1);
    }

    #[tokio::test]
    async fn a_gathering_worker_leaves_out_creates_whose_request_is_gone() {
        let (jobs, mut queue) = mpsc::channel(8);
        let (first, _first_answer) = job("alice");
        let (gone, gone_answer) = job("bob");
        drop(gone_answer);
        jobs.send(first).await.unwrap();
        jobs.send(gone).await.unwrap();
        drop(jobs);
        let batch = next_batch(&mut queue, &AtomicUsize::new(1)).await.unwrap();
        assert_eq!(batch.len(), 1);
        assert!(next_batch(&mut queue, &AtomicUsize::new(1)).await.is_none());
    }
}
