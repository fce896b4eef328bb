//! A university's cluster, measured: the simulated lab (`gpu-booking-sim`) at a
//! university's size, with the real webhook, controller, node agents and booking API,
//! the chart installed as helm renders it, in real time.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo bench --bench university
//! ```
//!
//! 64 GPU nodes of four kinds (whole A100s; A100s split into two MIG profiles;
//! time-sliced T4s; nodes with two models, A6000s on the generic resource and L40S on
//! their own), 440 units in six models. A `research` namespace holds a tenth of the
//! units with training jobs that bookings do not preempt. Then:
//!
//! 1. **Baseline**: 300 booked users spawn together (100 at a time, JupyterHub's
//!    default `concurrent_spawn_limit`) while their cards are free (no preemption):
//!    spawn to Running, the figure the burst is compared with. Their notebooks are
//!    then deleted and their bookings ended.
//! 2. **Fill**: 2,000 unbooked users spawn (20 at a time: the lab's limits, below):
//!    free cards are lent, the rest run on CPU. The webhook lends fewer cards than are free to a storm (its
//!    lend ledger subtracts an admission until a report taken 3 s after it), so late
//!    users spawn in rounds, 4 s apart, until no card is free.
//! 3. **Burst**: 300 bookings start at once (made as an admin, starting now), then
//!    their 300 users spawn together (100 at a time): each booked pod needs a card
//!    that a lent pod holds (the T4s' free replicas aside).
//!
//! Each phase prints what it did and what it cost. The burst's details say where the
//! booked pods' time went (the spawn to the controller's round for the pod, that
//! round to Running, the slowest pods' Events: `timeline.rs`) and what the burst left
//! (`verdict.rs`). Last, **the figures**, each with what it must be:
//!
//! - the booked users' spawn to Running, p50, p99 and max, against the baseline's;
//!   the goal: p99 within the warning + the victims' grace + 5 s;
//! - victims (lent pods of before the burst gone from their card at its end: only
//!   preemption ends a lent pod bound to a card; the count with the controller's
//!   `PreemptedForBooking` Event beside it) against victims needed (booked pods
//!   beyond the room free when the bookings started, per model): equal;
//! - booked pods never Running, with what their pod's Events and their booking say:
//!   none but those told that workloads bookings do not preempt hold the cards;
//! - lent pods beyond the cards (admitted with no card the scheduler could place,
//!   Pending for a GPU, or bound beyond a node's allocatable): none;
//! - the controller's and the webhook's CPU seconds and peak heap over the run;
//! - the webhook calls that failed (the chart's `failurePolicy: Ignore` then admits
//!   the pod unchanged): none, or the figures are the lab's.
//!
//! **The lab's limits.** The fake API server admits and schedules a pod inside the
//! create's request, under its store's lock, and its scheduler reads every pod's
//! requests on every pass; the lab's container runtime reads every pod on every
//! change. Both grow with the pods, so a create's answer grows with them, and 100
//! creates at once outlast the API server's 5 s webhook timeout (the chart's
//! `timeoutSeconds`): those pods go in unchanged, which a real API server (scheduling
//! apart, on cores of its own) would not do. The bench counts them; figures with
//! failed webhook calls are the lab's, not the system's; a smaller university
//! (`UNIVERSITY_SCALE`) or fewer spawns at once (`UNIVERSITY_SPAWNS_AT_ONCE`,
//! `UNIVERSITY_FILL_AT_ONCE`) keeps the creates' answers within it, as does a machine
//! that is not busy besides.
//!
//! **Per component in one process.** The controller and the webhook each run on a
//! tokio runtime of their own (threads `gb-controller`, `gb-webhook`), started
//! here in place of the lab's own (same options: the chart's Deployment's
//! environment); their CPU is their threads' (`/proc/self/task`), their memory the
//! peak of the heap their threads allocated (the bench's allocator tags each block,
//! `alloc.rs`). The fake API server answers the controller on the lab's threads
//! (`hop.rs`), as a real one would on another machine. The rest of the process (the
//! fake API server with its scheduler and kubelet, 64 node agents, the booking API,
//! the bench) is "lab". Postgres is another process, not counted.
//!
//! **Options are the chart's defaults**: preemption rounds every 2 s, the next round
//! for a pod 60 s after its first, lent pods Pending for a GPU recreated CPU-only after
//! 30 s, a lent notebook warned 2 minutes before its GPU is taken back
//! (`controller.preemption.grace`, `UNIVERSITY_WARNING_SECONDS`; the lab's own values
//! set 0 s). Notebooks have Kubernetes' default grace period of 30 s
//! (`UNIVERSITY_GRACE_SECONDS`). The goal: every booked pod Running within the
//! warning + the victims' grace + 5 s, at p99.
//!
//! Smaller: `UNIVERSITY_SCALE=0.25` (nodes, notebooks and bookings scaled together),
//! or `UNIVERSITY_NOTEBOOKS`, `UNIVERSITY_BOOKINGS`, `UNIVERSITY_RESEARCH`;
//! `UNIVERSITY_SPAWNS_AT_ONCE` (100), `UNIVERSITY_FILL_AT_ONCE` (20);
//! `UNIVERSITY_WAIT_SECONDS` bounds the wait for the booked pods (twice the warning
//! and the grace, + 90 s); `RUST_LOG` prints the components' logs (none without). A database of its own, `gpu_booking_bench_university`,
//! created and dropped.
//!
//! The modules: `cluster` the university's nodes and models and what its pods hold;
//! `lab` the lab started with our components; `booking` the booking API's client;
//! `spawns` users spawning notebooks; `verdict` and `timeline` what the burst left
//! and where its time went; `usage`, `alloc` and `hop` each component's CPU and heap;
//! `figures` how figures are written.

mod alloc;
mod booking;
mod cluster;
mod figures;
mod hop;
mod lab;
mod spawns;
mod timeline;
mod usage;
mod verdict;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use futures::stream::{self, StreamExt};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::spawner::pod_name;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use sqlx::PgPool;
use tokio::runtime::Handle;

use alloc::Component;
use booking::{book_all, share, Booked};
use cluster::{label, Shape, MODELS, NOTEBOOKS};
use figures::{mib, per_model, secs, spread, Spread};
use lab::{print_admission_failures, University};
use spawns::{all_running, burst, fill, fill_at_once, spawns_at_once};
use usage::{Meter, Spending, CONTROLLER_THREADS, LAB_THREADS, WEBHOOK_THREADS};
use verdict::{Judged, Verdict};

#[global_allocator]
static ALLOCATOR: alloc::Tagged = alloc::Tagged;

const RESEARCH: &str = "research";
/// The webhook's `--lend-settle` (its default).
const LEND_SETTLE: Duration = Duration::from_secs(3);

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub struct Config {
    scale: f64,
    shape: Shape,
    notebooks: usize,
    bookings: usize,
    research: usize,
    /// The notebooks' termination grace period, seconds.
    grace: i64,
    /// The warning a lent notebook gets before its GPU is taken back
    /// (`controller.preemption.grace`), seconds.
    warning: u64,
    wait: Duration,
}

impl Config {
    fn from_env() -> Config {
        let scale = env_f64("UNIVERSITY_SCALE", 1.0);
        let shape = Shape::scaled(scale);
        let cards: u64 = shape.cards().iter().sum();
        let grace = env_usize("UNIVERSITY_GRACE_SECONDS", 30) as i64;
        // The chart's default.
        let warning = env_usize("UNIVERSITY_WARNING_SECONDS", 120) as u64;
        Config {
            scale,
            shape,
            notebooks: env_usize("UNIVERSITY_NOTEBOOKS", (2000.0 * scale).round() as usize),
            bookings: env_usize("UNIVERSITY_BOOKINGS", (300.0 * scale).round() as usize),
            research: env_usize("UNIVERSITY_RESEARCH", (cards as usize).div_ceil(10)),
            grace,
            warning,
            // Past the goal, a retry round (60 s) and the warning and grace again.
            wait: Duration::from_secs(env_usize(
                "UNIVERSITY_WAIT_SECONDS",
                (2 * (warning + grace as u64) + 90) as usize,
            ) as u64),
        }
    }

    /// The goal for the booked pods' p99 spawn to Running.
    fn goal(&self) -> Duration {
        Duration::from_secs(self.warning + self.grace.unsigned_abs() + 5)
    }
}

fn runtime(
    name: &'static str,
    threads: usize,
    component: Component,
) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        // Blocking threads that end take their CPU time with them: keep them.
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .on_thread_start(move || alloc::set_thread_component(component))
        .enable_all()
        .build()
}

fn main() -> anyhow::Result<()> {
    let config = Config::from_env();
    // The components' logs, on stdout among the figures, only when asked for: a
    // slow pod's story in the controller's own words (`RUST_LOG=gpu_booking_controller=info`).
    if std::env::var_os("RUST_LOG").is_some() {
        gpu_booking_process::init_logging(gpu_booking_process::LogFormat::Plain);
    }
    let lab = runtime(LAB_THREADS, 2, Component::Lab)?;
    let controller = runtime(CONTROLLER_THREADS, 2, Component::Controller)?;
    let webhook = runtime(WEBHOOK_THREADS, 2, Component::Webhook)?;
    let result = lab.block_on(run(
        &config,
        controller.handle().clone(),
        webhook.handle().clone(),
    ));
    controller.shutdown_background();
    webhook.shutdown_background();
    lab.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn run(config: &Config, controller_rt: Handle, webhook_rt: Handle) -> anyhow::Result<()> {
    let base = std::env::var("DATABASE_URL")
        .context("DATABASE_URL: the Postgres the booking API runs on")?;
    let pool = lab::fresh_database(&base).await?;
    let outcome = measure(config, pool.clone(), controller_rt, webhook_rt).await;
    pool.close().await;
    lab::drop_database(&base).await?;
    outcome
}

async fn measure(
    config: &Config,
    pool: PgPool,
    controller_rt: Handle,
    webhook_rt: Handle,
) -> anyhow::Result<()> {
    let whole = Meter::whole_run();
    describe(config);
    let started = Instant::now();
    let u = lab::start(config, pool, controller_rt, webhook_rt).await?;
    println!(
        "lab started in {} (controller and webhook on their own runtimes)",
        secs(started.elapsed())
    );
    let calls_from = u.server().admission_log().len();
    let bookable = research(&u, config).await?;
    let shares = share(config.bookings, &bookable);
    println!(
        "bookings per model: {}",
        per_model(&shares.map(|n| n as u64))
    );
    let baseline = baseline(&u, config, &shares).await?;
    let lent_unplaced = fill_every_card(&u, config).await?;
    let (burst, verdict) = booked_burst(&u, config, &shares, lent_unplaced).await?;
    let failed = print_admission_failures("the whole run", u.server(), calls_from);
    print_figures(config, &baseline, &burst, &verdict, failed, &whole.spent());
    u.shutdown().await;
    Ok(())
}

fn describe(config: &Config) {
    let shape = config.shape;
    let cards = shape.cards();
    println!(
        "university (scale {}): {} GPU nodes ({} x 8 A100 80GB; {} x 2 A100 40GB as MIG, 8 x 1g.5gb + 2 x 3g.20gb; {} x 4 T4 time-sliced 4 ways; {} x 4 RTX A6000 + 2 L40S on nvidia.com/l40s) and {} CPU nodes; {} units: {}",
        config.scale,
        shape.gpu_nodes(),
        shape.a100,
        shape.mig,
        shape.t4,
        shape.mixed,
        shape.cpu,
        cards.iter().sum::<u64>(),
        per_model(&cards),
    );
    println!(
        "{} unbooked notebooks, {} bookings, {} research jobs; notebooks' grace {} s; a lent notebook warned {} s before its GPU is taken back; the chart's defaults (preemption every 2 s, a pod's next round after 60 s, lent pods Pending for a GPU recreated CPU-only after 30 s); booked spawns {} at once, unbooked {}; load average {}",
        config.notebooks,
        config.bookings,
        config.research,
        config.grace,
        config.warning,
        spawns_at_once(),
        fill_at_once(),
        usage::load_average()
    );
}

/// Research: a tenth of the cards, held by jobs bookings do not preempt. The cards
/// bookings can get, per model.
async fn research(u: &University, config: &Config) -> anyhow::Result<[u64; MODELS.len()]> {
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": RESEARCH, "labels": {"kubernetes.io/metadata.name": RESEARCH}}
    }))?;
    u.server().put(&namespace);
    let jobs: Vec<Result<Pod, kube::Error>> =
        stream::iter((0..config.research).map(|i| async move {
            u.sim
                .run_workload(RESEARCH, &format!("train-{i:03}"), 1)
                .await
        }))
        .buffer_unordered(8)
        .collect()
        .await;
    for job in jobs {
        job.context("a research job was refused")?;
    }
    let reported = u.reported(Duration::from_secs(60)).await?;
    let held = cluster::held(&u.pods());
    let cards = config.shape.cards();
    let bookable = std::array::from_fn(|i| cards[i] - held.others[i]);
    println!(
        "research holds {} cards ({} jobs): {}; bookable {}{}",
        held.others.iter().sum::<u64>(),
        config.research,
        per_model(&held.others),
        per_model(&bookable),
        if reported {
            ""
        } else {
            " (the controller's report never agreed)"
        }
    );
    Ok(bookable)
}

/// Users named `prefix`NNNN, as many per model as `shares` says.
fn users(prefix: &str, shares: &[usize; MODELS.len()]) -> Vec<(String, usize)> {
    let mut users = Vec::new();
    for (model, &n) in shares.iter().enumerate() {
        for _ in 0..n {
            users.push((format!("{prefix}{:04}@uni.example", users.len()), model));
        }
    }
    users
}

/// The baseline (phase 1): booked spawns while their cards are free (no
/// preemption); then their notebooks go and their bookings end. Their spawn to
/// Running.
async fn baseline(
    u: &University,
    config: &Config,
    shares: &[usize; MODELS.len()],
) -> anyhow::Result<Spread> {
    let meter = Meter::phase();
    let calls_from = u.server().admission_log().len();
    let base = book_all(u, users("staff", shares), "baseline").await?;
    let baseline = burst(u, &base, config.wait).await;
    let times = spread(&baseline.times);
    println!(
        "baseline, booked spawns with free cards (no preemption): spawn to Running {times}; the create's answer (admission, scheduling) {}; never Running {}; not admitted as booked {}; spawn errors {:?}",
        spread(&baseline.answered),
        baseline.never.len(),
        baseline.not_booked.len(),
        baseline.spawn_errors
    );
    print_admission_failures("baseline", u.server(), calls_from);
    println!("baseline: {}", meter.spent());
    // Its notebooks go (at once) and its bookings end.
    let admin: Api<Pod> = Api::namespaced(u.server().client(), NOTEBOOKS);
    for b in &base {
        let _ = admin
            .delete(&pod_name(&b.user), &DeleteParams::default().grace_period(0))
            .await;
    }
    for b in &base {
        u.booking.end(b.booking).await?;
    }
    let now = Utc::now();
    let ids: Vec<i64> = base.iter().map(|b| b.booking).collect();
    u.webhook_sees(&ids, |b| b.is_none_or(|b| b.end <= now))
        .await?;
    u.reported(Duration::from_secs(60)).await?;
    Ok(times)
}

/// The fill (phase 2): unbooked users spawn until every free card is lent. How many
/// lent pods were admitted that the scheduler could not place (a card lent that was
/// not free).
async fn fill_every_card(u: &University, config: &Config) -> anyhow::Result<usize> {
    let meter = Meter::phase();
    let calls_from = u.server().admission_log().len();
    let cards = config.shape.cards();
    let students: Vec<String> = (0..config.notebooks)
        .map(|i| format!("student{i:04}@uni.example"))
        .collect();
    let filled = fill(u, &students).await?;
    let not_running = all_running(u, &students, Duration::from_secs(120)).await;
    let settled = u.reported(Duration::from_secs(60)).await?;
    let held = cluster::held(&u.pods());
    let free: [u64; MODELS.len()] = std::array::from_fn(|i| cards[i] - held.all[i]);
    println!(
        "fill: {} unbooked spawns in {}: {} lent a card, {} on CPU, {} with their GPU request but unmarked (the webhook call failed); not Running after 2 min {not_running}; lent notebooks (replicas, on the T4s) per model {}; cards free {}{}",
        students.len(),
        secs(filled.took),
        filled.lent,
        filled.on_cpu,
        filled.unmarked,
        per_model(&held.lent),
        per_model(&free),
        if settled {
            ""
        } else {
            " (the controller's report never agreed)"
        }
    );
    let mut unplaced = filled.unplaced.values().sum::<usize>();
    println!("  lent pods the scheduler could not place when their spawn returned: {unplaced}");
    for (why, n) in &filled.unplaced {
        println!("    {n} x {why}");
    }
    print_admission_failures("fill", u.server(), calls_from);
    if let Ok(models) = u.booking.models().await {
        let figures: Vec<String> = models
            .iter()
            .map(|r| {
                format!(
                    "{} units {} in use {} by others {} free {}",
                    r["name"], r["units"], r["in_use"], r["others_in_use"], r["free"]
                )
            })
            .collect();
        println!(
            "  the booking service counts after the fill: {}",
            figures.join("; ")
        );
    }
    // Late spawns, in rounds, until no card is free: what the storm left free is
    // lent before the bookings start. The webhook subtracts each lent admission from
    // the free count until a report taken 3 s after it (`--lend-settle`) counts it,
    // so each round waits that long: a round sooner reads too few cards free.
    let mut late: Vec<String> = Vec::new();
    let mut late_lent = 0;
    let mut rounds_without = 0;
    for _ in 0..40 {
        let held = cluster::held(&u.pods());
        let free: u64 = (0..MODELS.len())
            .map(|i| cards[i].saturating_sub(held.all[i]))
            .sum();
        if free == 0 || rounds_without == 2 {
            break;
        }
        // As many as cards are free (10 to 50): a round that outlasts the settle
        // time reads fewer free than there are.
        let round = (free as usize).clamp(10, 50);
        let users: Vec<String> = (late.len()..late.len() + round)
            .map(|i| format!("late{i:04}@uni.example"))
            .collect();
        let filled = fill(u, &users).await?;
        late.extend(users.iter().cloned());
        late_lent += filled.lent;
        let late_unplaced = filled.unplaced.values().sum::<usize>();
        if late_unplaced > 0 {
            println!("  late lent pods the scheduler could not place: {late_unplaced}");
            for (why, n) in &filled.unplaced {
                println!("    {n} x {why}");
            }
        }
        unplaced += late_unplaced;
        rounds_without = if filled.lent == 0 {
            rounds_without + 1
        } else {
            0
        };
        all_running(u, &users, Duration::from_secs(60)).await;
        tokio::time::sleep(LEND_SETTLE + Duration::from_secs(1)).await;
        u.reported(Duration::from_secs(30)).await?;
    }
    let held = cluster::held(&u.pods());
    let free: [u64; MODELS.len()] = std::array::from_fn(|i| cards[i] - held.all[i]);
    println!(
        "  then {} late spawns, in rounds of 10 to 50 (as many as cards are free) {} s apart, until no card is free (or two rounds are lent none): {late_lent} lent; lent notebooks per model {}; cards free {}",
        late.len(),
        LEND_SETTLE.as_secs() + 1,
        per_model(&held.lent),
        per_model(&free)
    );
    println!("fill: {}", meter.spent());
    Ok(unplaced)
}

/// The burst (phase 3): the bookings start at once, and their users spawn together
/// while every card is lent. Their spawn to Running, and what the burst left.
async fn booked_burst(
    u: &University,
    config: &Config,
    shares: &[usize; MODELS.len()],
    lent_unplaced: usize,
) -> anyhow::Result<(Spread, Verdict)> {
    let meter = Meter::phase();
    let calls_from = u.server().admission_log().len();
    // The lent pods holding a card before the burst, by uid: their model.
    let lent_before: HashMap<String, String> = u
        .server()
        .list::<Pod>(Some(NOTEBOOKS))
        .into_iter()
        .filter(|p| label(p, PRIORITY_LABEL) == Some("low"))
        .filter(|p| cluster::node_of(p).is_some() && cluster::gpu_request(p).is_some())
        .filter_map(|p| Some((p.metadata.uid.clone()?, cluster::pod_model(&p))))
        .collect();
    let room = cluster::room(&u.server().list::<Node>(None), &u.pods());
    let booked: Vec<Booked> = book_all(u, users("booked", shares), "burst").await?;
    let result = burst(u, &booked, config.wait).await;
    let spent = meter.spent();
    settle_evictions(u, config).await;

    let events = u.server().list::<Event>(Some(NOTEBOOKS));
    let times = spread(&result.times);
    println!(
        "burst, booked spawns with every card lent: spawn to Running {times}; the last {} after the first spawn",
        secs(result.span)
    );
    println!(
        "  the create's answer (admission, scheduling: the lab's API server) {}",
        spread(&result.answered)
    );
    println!(
        "  booked pods the scheduler could not place as they were created: {} ({})",
        result.unplaced.iter().sum::<u64>(),
        per_model(&result.unplaced)
    );
    for (why, n) in &result.unplaced_why {
        println!("    {n} x {why}");
    }
    for line in timeline::lines(u, &result, &events) {
        println!("{line}");
    }
    let judged = Judged {
        u,
        booked: &booked,
        result: &result,
        lent_before: &lent_before,
        room,
        lent_unplaced,
    };
    let verdict = verdict::judge(judged, &events).await;
    println!("{verdict}");
    println!(
        "  booked pods Running on a card at the end: {} of {}",
        verdict.booked_running,
        booked.len()
    );
    if !result.not_booked.is_empty() || !result.spawn_errors.is_empty() {
        println!(
            "  not admitted as booked: {:?}; spawn errors: {:?}",
            result.not_booked, result.spawn_errors
        );
    }
    print_admission_failures("burst", u.server(), calls_from);
    println!("burst: {spent}");
    Ok((times, verdict))
}

/// The controller counts an eviction once the victim's CPU-only copy is made: waits
/// until its count stays put for 2 s (at most the warning and the grace, + 15 s).
async fn settle_evictions(u: &University, config: &Config) {
    let deadline = Instant::now() + config.goal() + Duration::from_secs(10);
    let evictions = || {
        MODELS
            .iter()
            .map(|m| {
                u.controller
                    .metrics
                    .eviction_count(m.name, "booked_pod_pending")
            })
            .sum::<u64>()
    };
    let mut count = evictions();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = evictions();
        if now == count {
            break;
        }
        count = now;
    }
}

/// The figures the bench is for, each with what it must be.
fn print_figures(
    config: &Config,
    baseline: &Spread,
    burst: &Spread,
    verdict: &Verdict,
    failed_calls: usize,
    whole: &Spending,
) {
    let verdict_of = |ok: bool| if ok { "met" } else { "NOT MET" };
    let goal = config.goal();
    let never = verdict.never.values().sum::<usize>();
    // A booked pod that never ran is beyond any goal.
    let goal_met = burst.p99 <= goal && never == 0;
    let checks = [
        goal_met,
        verdict.victims == verdict.needed,
        verdict.never_unexcused() == 0,
        verdict.lent_beyond() == 0,
    ];
    println!(
        "\nthe figures (scale {}; load average at the end {}):",
        config.scale,
        usage::load_average()
    );
    println!(
        "  booked users, spawn to Running: {burst}; x the baseline (free cards, {baseline}): {}",
        burst.ratios(baseline)
    );
    println!(
        "  goal, p99 <= the warning {} s + the victims' grace {} s + 5 s = {}: {}",
        config.warning,
        config.grace,
        secs(goal),
        verdict_of(goal_met)
    );
    println!(
        "  victims {} against {} needed: {}",
        verdict.victims_total(),
        verdict.needed_total(),
        if checks[1] {
            "equal, model by model"
        } else {
            "NOT EQUAL"
        }
    );
    println!(
        "  booked pods never Running: {never}, of which told that workloads bookings do not preempt hold the cards {} (must be all): {}",
        verdict.never_excused,
        verdict_of(checks[2])
    );
    println!(
        "  lent pods beyond the cards: {} (must be 0): {}{}",
        verdict.lent_beyond(),
        verdict_of(checks[3]),
        if failed_calls > 0 && verdict.lent_beyond() > 0 {
            " (pods admitted unchanged when a webhook call failed take cards the webhook counts free)"
        } else {
            ""
        }
    );
    println!(
        "  controller: CPU {:.1} s, peak heap {}; webhook: CPU {:.1} s, peak heap {} (the whole run, {:.0} s; the process's CPU {:.1} s)",
        whole.controller.cpu,
        mib(whole.controller.heap),
        whole.webhook.cpu,
        mib(whole.webhook.heap),
        whole.seconds,
        whole.process,
    );
    println!(
        "  webhook calls that failed: {failed_calls}{}",
        if failed_calls == 0 {
            ""
        } else {
            " (admitted unchanged by the chart's failurePolicy Ignore: the figures are the lab's)"
        }
    );
    let (rss, hwm) = usage::rss_mib();
    println!(
        "  the process (lab, components, node agents; the notebooks' fake kernels are other processes): RSS {rss:.0} MiB, peak {hwm:.0} MiB; heap live now: controller {}, webhook {}, lab {}",
        mib(alloc::live(Component::Controller)),
        mib(alloc::live(Component::Webhook)),
        mib(alloc::live(Component::Lab)),
    );
    println!(
        "  {}",
        if checks.iter().all(|c| *c) {
            "all met"
        } else {
            "NOT ALL MET"
        }
    );
}
