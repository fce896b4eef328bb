//! What the booking-store benchmarks share.

mod rate_search;

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

pub use rate_search::{RateSearch, Trial};

/// The `gpu-booking` binary's allocator (src/main.rs), so that the API is measured as
/// it runs: without it the benches would measure glibc's malloc, which the service
/// does not use, and which is a large share of the bench process's time during
/// creates. The baselines in the same process get it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sets mimalloc's purge delay as the binary does, and prints it.
pub fn print_allocator() {
    println!(
        "allocator: {}",
        gpu_booking_process::allocator::delay_purges()
    );
}

/// Drops and creates database `name` next to `base` (a `DATABASE_URL`), and connects
/// a pool of `connections` to it with the service's settings (acquiring may wait
/// long: a loaded phase queues).
pub async fn fresh_database(base: &str, name: &str, connections: u32) -> anyhow::Result<PgPool> {
    let mut admin = PgConnection::connect(base).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let url = match base.rfind('/') {
        Some(i) => format!("{}/{name}", &base[..i]),
        None => anyhow::bail!("DATABASE_URL has no database part"),
    };
    Ok(gpu_booking_api::server::pool_options(connections)
        .acquire_timeout(Duration::from_secs(120))
        .connect(&url)
        .await?)
}

/// The pool the API under test gets: `pool` itself, or, with
/// `GPU_BOOKING_BENCH_API_POOL=n`, a pool of its own of `n` connections to the same
/// database (the service's `--db-max-connections`, 16 by default), so that creates can
/// be measured with the service's pool size while the baseline keeps its clients.
pub async fn api_pool(pool: &PgPool) -> anyhow::Result<PgPool> {
    match std::env::var("GPU_BOOKING_BENCH_API_POOL")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|&n| n > 0)
    {
        Some(n) => Ok(gpu_booking_api::server::pool_options(n)
            .acquire_timeout(Duration::from_secs(120))
            .connect_with((*pool.connect_options()).clone())
            .await?),
        None => Ok(pool.clone()),
    }
}

/// The baseline's one transaction: what this Postgres does for the smallest write
/// (a row of `bench_row`, which each bench creates, with `v` in it).
pub async fn bare_insert(pool: &PgPool, v: i64) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO bench_row (v, at) VALUES ($1, $2)")
        .bind(v)
        .bind(chrono::Utc::now())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// VACUUM ANALYZE, then [`checkpoint`], before a measure on tables just loaded: a
/// database with years of history has been vacuumed long since, and a phase measured
/// right after a load measures its aftermath instead (autovacuum going over the
/// loaded tables, and the checkpoint the load's WAL asks for stalling commits, miss a
/// 25 ms p99 at rates far below what the store serves). Not for empty tables: ANALYZE
/// records them as empty, and the plans that the service's functions cache while they
/// are (generic plans) scan them whole until autovacuum analyzes them again, up to a
/// minute later, halving the creates' rate.
// Only `history` loads tables.
#[allow(dead_code)]
pub async fn settle(pool: &PgPool) -> anyhow::Result<()> {
    before_measuring(pool, "VACUUM ANALYZE").await?;
    checkpoint(pool).await
}

/// CHECKPOINT before a measure, so that it starts with no dirty pages to write and
/// meets the next checkpoint no sooner than another measure does: a search right
/// after a closed loop would otherwise meet that loop's dirty pages being written and
/// miss a 25 ms p99 at any rate.
pub async fn checkpoint(pool: &PgPool) -> anyhow::Result<()> {
    before_measuring(pool, "CHECKPOINT").await
}

/// Runs `sql`, saying how long it took.
async fn before_measuring(pool: &PgPool, sql: &'static str) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    sqlx::raw_sql(sql).execute(pool).await?;
    println!(
        "({sql} before measuring: {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What one open-loop trial saw (`open_loop`).
pub struct Schedule {
    /// Latency of each operation that succeeded, in ms, from the moment it was due.
    pub latencies_ms: Vec<f64>,
    /// Operations that completed but were refused (a create the rules turned down).
    pub refused: u64,
    /// Operations never started: more than `MAX_IN_FLIGHT` were waiting, so the rate
    /// was beyond what the system serves and the trial stopped there.
    pub dropped: u64,
}

impl Schedule {
    /// The `q` quantile (0..=1) of the latencies; infinite when the trial was cut
    /// short, since the latencies of what it did not start would have been longer.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.dropped > 0 || self.latencies_ms.is_empty() {
            return f64::INFINITY;
        }
        let mut ms = self.latencies_ms.clone();
        ms.sort_by(f64::total_cmp);
        ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)]
    }
}

/// Past this many operations started and not finished, an open-loop trial stops: the
/// system is not keeping up, and waiting on would only grow the queue (and memory).
const MAX_IN_FLIGHT: usize = 2_000;

/// Operations started on a fixed schedule, `rate` per second for `duration` (or as long
/// as `due` says), whether or not the earlier ones have finished (an open loop: users
/// arrive when they arrive), each latency measured from the moment the operation was
/// due, so that a driver that falls behind counts its own delay too. A closed loop of N clients measures something
/// else: its mean latency is N / its rate (Little's law), whatever the system under
/// test, so its p99 says how many clients there were as much as how fast the system is.
/// `op(i)` builds the i-th operation; it answers whether the operation succeeded.
pub async fn open_loop<Op, Fut>(
    rate: f64,
    duration: Duration,
    mut op: Op,
) -> anyhow::Result<Schedule>
where
    Op: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>> + Send + 'static,
{
    let due_count = due(rate, duration);
    let in_flight = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut dropped = 0;
    for i in 0..due_count {
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        if in_flight.load(std::sync::atomic::Ordering::Relaxed) >= MAX_IN_FLIGHT {
            dropped = due_count - i;
            break;
        }
        in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (operation, in_flight) = (op(i), in_flight.clone());
        tasks.spawn(async move {
            let succeeded = operation.await;
            in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            succeeded.map(|ok| (ok, due.elapsed()))
        });
    }
    let mut schedule = Schedule {
        latencies_ms: Vec::with_capacity(due_count),
        refused: 0,
        dropped: dropped as u64,
    };
    while let Some(done) = tasks.join_next().await {
        match done?? {
            (true, took) => schedule.latencies_ms.push(took.as_secs_f64() * 1e3),
            (false, _) => schedule.refused += 1,
        }
    }
    Ok(schedule)
}

/// The middle value (the upper one of an even count); NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// How many operations `open_loop` starts at `rate` per second over `duration`, and
/// at least `MIN_TRIAL_OPS` (the trial then runs longer than `duration`).
pub fn due(rate: f64, duration: Duration) -> usize {
    ((rate * duration.as_secs_f64()).round() as usize).max(MIN_TRIAL_OPS)
}

/// The fewest operations an open-loop trial runs: its p99 is then its 10th slowest
/// operation or later, so one pause of the machine (a checkpoint's writes stall a
/// commit by ~50 ms on a 2-core machine) cannot decide a trial alone. A trial of 2 s
/// at 50 a second would have 100 operations, its p99 the slowest but one, and one
/// stall at the search's first rate would end the search at 0.
const MIN_TRIAL_OPS: usize = 1_000;

/// The rate (per second) a `sustained_rate` search tries first: below what either
/// bench finds on this 2-core machine (creates 1,600-2,600 a second, the bare INSERT
/// 5,000-10,000), so the search doubles from it; halved where even it misses.
pub const FIRST_RATE: f64 = 400.0;

/// Whether a refused create's answer was printed already.
static FIRST_REFUSAL_SHOWN: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// One open-loop trial of booking creates through the API at `api_url`, `rate` per
/// second for `duration`: the i-th by the user of `tokens[i]` (minted beforehand, one
/// for each of `due(rate, duration)`), with the body `body()` gives. A create succeeds
/// when answered 201.
pub async fn open_loop_creates(
    http: &reqwest::Client,
    api_url: &str,
    tokens: &[String],
    rate: f64,
    duration: Duration,
    mut body: impl FnMut() -> serde_json::Value,
) -> anyhow::Result<Schedule> {
    let url = format!("{api_url}/api/v1/bookings");
    open_loop(rate, duration, |i| {
        let (http, url, token, body) = (http.clone(), url.clone(), tokens[i].clone(), body());
        async move {
            let r = http.post(url).bearer_auth(token).json(&body).send().await?;
            let status = r.status();
            let answer = r.bytes().await?;
            let created = status == 201;
            if !created && !FIRST_REFUSAL_SHOWN.swap(true, std::sync::atomic::Ordering::Relaxed) {
                // A refusal is the bench's setup or the rules, never the speed: say
                // which, once.
                eprintln!(
                    "(a create refused: {status} {})",
                    String::from_utf8_lossy(&answer[..answer.len().min(300)])
                );
            }
            Ok(created)
        }
    })
    .await
}

/// The trials of a `sustained_rate` search, for the record: rate, p50, p99.
pub fn trace(tried: &[Trial]) -> String {
    let trials: Vec<String> = tried
        .iter()
        .map(|t| match t.refused {
            0 => format!("{:.0}/s p50 {:.1} p99 {:.1}", t.rate, t.p50, t.p99),
            // Latencies are of the operations that succeeded: say how many did not.
            n => format!(
                "{:.0}/s p50 {:.1} p99 {:.1} refused {n}",
                t.rate, t.p50, t.p99
            ),
        })
        .collect();
    trials.join(", ")
}

/// The highest rate (per second) whose open-loop p99 stays within `p99_ms`
/// ([`RateSearch`]; a rate's p99 is the median of three trials). `trial(rate)` runs
/// one open-loop trial at that rate.
// Each bench compiles this module for itself: `history` searches alone, `create_rate`
// in lockstep.
#[allow(dead_code)]
pub async fn sustained_rate<T, Fut>(
    p99_ms: f64,
    first: f64,
    steps: usize,
    mut trial: T,
) -> anyhow::Result<(Option<Trial>, Vec<Trial>)>
where
    T: FnMut(f64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Schedule>>,
{
    let mut search = RateSearch::new(p99_ms, first, steps);
    while let Some(rate) = search.next_rate() {
        let mut trials = Vec::with_capacity(TRIALS_PER_RATE);
        for _ in 0..TRIALS_PER_RATE {
            trials.push(trial_at(rate, trial(rate).await?));
        }
        search.record(median_trial(trials));
    }
    Ok(search.outcome())
}

/// Two [`sustained_rate`] searches in lockstep, one trial of `a` then one of `b`, so
/// that the machine's pauses (a checkpoint, autovacuum) fall on both alike rather
/// than on whichever search ran in that minute; a search that has ended leaves the
/// other to go on alone.
#[allow(dead_code)]
pub async fn sustained_rates_alternating<A, FA, B, FB>(
    p99_ms: f64,
    first: f64,
    steps: usize,
    mut a: A,
    mut b: B,
) -> anyhow::Result<[(Option<Trial>, Vec<Trial>); 2]>
where
    A: FnMut(f64) -> FA,
    FA: std::future::Future<Output = anyhow::Result<Schedule>>,
    B: FnMut(f64) -> FB,
    FB: std::future::Future<Output = anyhow::Result<Schedule>>,
{
    let mut searches = [
        RateSearch::new(p99_ms, first, steps),
        RateSearch::new(p99_ms, first, steps),
    ];
    loop {
        let rates = [searches[0].next_rate(), searches[1].next_rate()];
        if rates == [None, None] {
            break;
        }
        let (mut trials_a, mut trials_b) = (Vec::new(), Vec::new());
        for _ in 0..TRIALS_PER_RATE {
            if let Some(rate) = rates[0] {
                trials_a.push(trial_at(rate, a(rate).await?));
            }
            if let Some(rate) = rates[1] {
                trials_b.push(trial_at(rate, b(rate).await?));
            }
        }
        for (search, trials) in searches.iter_mut().zip([trials_a, trials_b]) {
            if !trials.is_empty() {
                search.record(median_trial(trials));
            }
        }
    }
    let [a, b] = searches;
    Ok([a.outcome(), b.outcome()])
}

/// Trials of one rate: the p99 of one trial moves with the machine's pauses (a
/// checkpoint, autovacuum), so the rate gets the median p99 of `TRIALS_PER_RATE`.
const TRIALS_PER_RATE: usize = 3;

fn trial_at(rate: f64, schedule: Schedule) -> Trial {
    Trial {
        rate,
        p50: schedule.quantile(0.50),
        p99: schedule.quantile(0.99),
        refused: schedule.refused,
    }
}

/// The trial with the median p99.
fn median_trial(mut trials: Vec<Trial>) -> Trial {
    trials.sort_by(|a, b| a.p99.total_cmp(&b.p99));
    trials[trials.len() / 2]
}

/// CPU time used so far by this process and by the Postgres backends serving this
/// benchmark's database, from /proc (Linux; `None` elsewhere). Only this database's
/// backends count: other databases on the same server (other people's tests) would
/// otherwise be charged to the benchmark. The pool keeps its connections, so each
/// backend lives through the phases; WAL writing done by the server's own background
/// processes is not counted (the backends flush their commits themselves).
pub struct CpuTicks(Option<(u64, std::collections::HashMap<i32, u64>)>);

impl CpuTicks {
    /// Linux's USER_HZ, fixed at 100 on every architecture it exposes to /proc.
    const PER_SEC: f64 = 100.0;

    pub async fn now(pool: &PgPool) -> Self {
        let Some(own) = proc_ticks("self") else {
            return Self(None);
        };
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        let backends = pids
            .into_iter()
            .filter_map(|pid| Some((pid, proc_ticks(&pid.to_string())?)))
            .collect();
        Self(Some((own, backends)))
    }

    /// Microseconds of CPU per operation from `self` to `later`: (this process,
    /// Postgres). A backend that `self` did not see counts from its start.
    pub fn per_op(&self, later: &Self, ops: u64) -> Option<(f64, f64)> {
        let ((own0, pg0), (own1, pg1)) = (self.0.as_ref()?, later.0.as_ref()?);
        let pg: u64 = pg1
            .iter()
            .map(|(pid, t)| t.saturating_sub(pg0.get(pid).copied().unwrap_or(0)))
            .sum();
        let us = |ticks: u64| ticks as f64 / Self::PER_SEC * 1e6 / ops as f64;
        (ops > 0).then(|| (us(own1.saturating_sub(*own0)), us(pg)))
    }
}

/// utime + stime of process `pid` ("self" for this one), in ticks.
fn proc_ticks(pid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5), utime and stime; `rest` starts at field 3.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}
