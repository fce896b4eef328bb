//! The booking store at a large university's scale: booking creates and
//! the hot reads in three phases, each against the same run's bare one-row INSERT
//! rate, on models of their own:
//! - `empty`: no bookings, in a database of its own (`gpu_booking_bench_history_first`:
//!   the creates of a phase stay, and in the others' database they would add to the
//!   history's table what the history does not hold);
//! - `plan`: only the planned part of the history below (its last 6 cycles of 15
//!   days: 82,320 bookings with the defaults), loaded by `scripts/load-history.sql`
//!   with `cycles = planned_cycles`, in a database of its own as well
//!   (`gpu_booking_bench_history_plan`);
//! - `hist`: the whole history (`scripts/load-history.sql`: by default 1,000,000
//!   bookings of 100,000 users on 40 models over 3 years, the same planned part and
//!   2 years 9 months past), loaded beside the same planned part on models and
//!   users of its own (`plan-00` ..., `p000000` ..., which the paired measures read), and
//!   after the API's archiving job has run over it (`--archive-after`, a day: the
//!   bookings that ended before then leave the exclusion constraints' indexes) and
//!   VACUUM after it. Creates are measured once with the constraints' indexes as the
//!   job leaves them (emptied pages not given back), then with the indexes rebuilt,
//!   as a deployment has them (see `main`).
//!
//! A read's answer grows with the bookings in its window (a year's availability of a
//! model reads its ~2,000 planned bookings; the empty table has none), so
//! `history / planned` is the figure that says whether history costs anything: the
//! `plan` models and users and the `hist` ones differ only by the past. Once the
//! history is loaded, each read is measured on both in alternating rounds, in the
//! same database at the same moments. Measured minutes apart, before and after the load, the ratio
//! moved by up to 0.5 between runs of one build on this 2-core machine
//! (`/schedulability` 0.46-0.96 history / planned). Not a pass/fail test:
//! it prints the figures and their ratios.
//!
//!     DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p gpu-booking-api --bench history
//!
//! Settings (environment): GPU_BOOKING_BENCH_SECS, seconds per create or INSERT
//! measure (default 6); GPU_BOOKING_BENCH_READS, requests per read measure (default
//! 2000); GPU_BOOKING_HISTORY_BOOKINGS and GPU_BOOKING_HISTORY_USERS, the history's
//! size (default 1,000,000 and 100,000); GPU_BOOKING_HISTORY_PLANNED_ONLY=1 stops after
//! the `plan` phase and prints its ratios to the empty phase, then measures creates in
//! alternating rounds on models without bookings, on the planned models and in a
//! second database whose booking table is empty: what the bookings over a create's
//! window cost it and what the table's size does, at the same moments, in about 3
//! minutes instead of about 20.
//!
//! Each phase starts after a `CHECKPOINT`, the loaded ones after `VACUUM ANALYZE`
//! too (`common::settle`), so that they measure the store and not what a load leaves
//! behind.
//!
//! Once the history is loaded, archived and its indexes rebuilt, before the `hist`
//! phase adds its own creates, creates on its models are measured against the same
//! models in a second database whose booking table is empty (an API of its own in
//! this process), in alternating rounds: loaded / empty at the same moments of the
//! machine, where the phases' own ratios compare measures minutes
//! apart, across a load, an archive and a VACUUM. It prints what the table holds
//! then: the history, the planned part's twin beside it and the creates measured on
//! them since (every create stays, each by a new user; the phases before ran in
//! databases of their own). Then the paired reads, and creates on the history's
//! models against the planned-only models in alternating rounds in one database:
//! what the past alone costs a create at the same moments. The `hist` phase comes
//! after them, then the returning users' rounds.
//!
//! Each phase also finds the highest rate of creates arriving on a schedule (an
//! open loop, as users arrive when a booking window opens) whose p99 stays within 25
//! ms (`common::sustained_rate`; the rate's p99 the median of three trials of 2 s
//! and at least 1,000 creates each).
//!
//! Creates: each request a new user (in the last phase also, in alternating rounds
//! with those, one of the history's users who holds no booking now or ahead, each
//! once: `creates_by`), one of the 40 models, a window of 1 to 3 days
//! starting at a random hour of the next year (refusals are counted apart). The API
//! runs in this process with a pool of 32 Postgres connections, as one replica would;
//! at 300 clients requests queue for them, and the latencies include that wait.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_api::testing::TestApi;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;

const MODELS: usize = 40;
const POOL: u32 = 32;
const READ_CLIENTS: usize = 8;
/// Rounds of the paired read measures (`Bench::paired_reads`).
const PAIRED_ROUNDS: usize = 8;
/// The p99 bound of the open-loop measure (`Bench::phase`), ms.
const P99_MS: f64 = 25.0;
/// The unmeasured creates on each side before alternating rounds
/// (`alternating_creates`).
const WARM_UP: Duration = Duration::from_secs(3);
/// Each open-loop trial's length.
const OPEN_LOOP_TRIAL: Duration = Duration::from_secs(2);
const LOADER: &str = include_str!("../../scripts/load-history.sql");

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    common::print_allocator();
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(default)
    };
    let secs = Duration::from_secs(env("GPU_BOOKING_BENCH_SECS", 6));
    let reads = env("GPU_BOOKING_BENCH_READS", 2000);
    let bookings = env("GPU_BOOKING_HISTORY_BOOKINGS", 1_000_000);
    let users = env("GPU_BOOKING_HISTORY_USERS", 100_000);

    let pool = common::fresh_database(&base, "gpu_booking_bench_history", POOL).await?;
    gpu_booking_api::server::migrate(&pool).await?;
    create_bench_row(&pool).await?;
    let api = Arc::new(TestApi::start(common::api_pool(&pool).await?).await?);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(400)
        .build()?;
    // The loader's models (`plan-00` ..., `hist-00` ..., declared here with the same
    // units; the loader keeps the larger count) hold only what it loads.
    declare_models(&http, &api, &["plan", "hist"]).await?;
    let bench = Bench {
        api,
        http,
        secs,
        reads,
        next_user: Arc::new(AtomicU64::new(0)),
    };

    // The empty phase in a database of its own, on models of its own (`empty-00`
    // ...): every create a phase makes stays, each by a new user, and in this one
    // they would add to the history's table what the history does not hold.
    println!("== empty booking table (a database of its own)");
    let (first_pool, first) =
        database_of_its_own(&base, &bench, "gpu_booking_bench_history_first", &["empty"]).await?;
    common::checkpoint(&first_pool).await?;
    let empty = first.phase(&first_pool, "empty").await?;
    let empty_reads = first.reads("empty", "h").await?;
    close(first_pool, first).await;
    // The planned part alone: as many lanes per model as the whole history has
    // (bookings / (models x cycles)), over its planned cycles only. In a database of
    // its own too, for the same reason (its phase's creates by new users, about
    // 200,000 here, would stay in the history's table); its models without bookings
    // (`empty-00` ...) serve the planned-only mode's rounds.
    let lanes = bookings.div_ceil(MODELS as u64 * HISTORY_CYCLES);
    let planned = lanes * MODELS as u64 * PLANNED_CYCLES;
    let (plan_pool, plan_bench) = database_of_its_own(
        &base,
        &bench,
        "gpu_booking_bench_history_plan",
        &["empty", "plan"],
    )
    .await?;
    load(&plan_pool, planned, users, PLANNED_CYCLES, "plan", "p").await?;
    println!("== planned bookings only (a database of its own)");
    let plan = plan_bench.phase(&plan_pool, "plan").await?;
    let plan_reads = plan_bench.reads("plan", "p").await?;
    if env("GPU_BOOKING_HISTORY_PLANNED_ONLY", 0) == 1 {
        println!("\n== summary (ratios first)");
        println!(
            "creates, 32 clients: {:.2} x bare INSERT empty, {:.2} x planned only; planned / empty {:.2}; p99 {:.1} ms empty, {:.1} ms planned",
            empty.c32.rate / empty.bare.rate,
            plan.c32.rate / plan.bare.rate,
            (plan.c32.rate / plan.bare.rate) / (empty.c32.rate / empty.bare.rate),
            empty.c32.p99,
            plan.c32.p99
        );
        // The same creates side by side, in alternating rounds: on models without
        // bookings (`empty-00` ... of the planned part's database), on the planned
        // models, and in a database whose booking table is empty. Planned / empty
        // models says what the bookings over a create's window cost; planned / empty
        // database adds what the table's size costs, at the same moments.
        let other = empty_database(&base, &bench, &["plan"]).await?;
        let rounds = alternating_creates(&[
            (&plan_bench, "empty"),
            (&plan_bench, "plan"),
            (&other, "plan"),
        ])
        .await?;
        for (round, sides) in rounds.iter().enumerate() {
            let [e, p, d] = sides[..] else { continue };
            println!(
                "alternating round {round}: creates on planned models / on empty models {:.2}, / in an empty database {:.2} ({:.0} / {:.0} / {:.0} per s), p99 {:.1} / {:.1} / {:.1} ms, CPU per create {} / {} / {}",
                p.rate / e.rate,
                p.rate / d.rate,
                p.rate,
                e.rate,
                d.rate,
                p.p99,
                e.p99,
                d.p99,
                cpu_split(p.cpu),
                cpu_split(e.cpu),
                cpu_split(d.cpu)
            );
        }
        return Ok(());
    }
    close(plan_pool, plan_bench).await;
    // The history's database: the same planned part on its own models and users
    // (the paired reads and rounds below compare the two), then the whole history
    // beside it.
    load(&pool, planned, users, PLANNED_CYCLES, "plan", "p").await?;
    load(&pool, bookings, users, HISTORY_CYCLES, "hist", "h").await?;
    // What the API's archiving job (`--archive-after`, default a day) does within 10
    // minutes of the load, and what autovacuum does after it: the bookings that ended
    // more than a day ago leave the exclusion constraints' indexes.
    let started = Instant::now();
    let archived = gpu_booking_api::store::archive::archive_ended(
        &pool,
        Utc::now() - TimeDelta::days(1),
        gpu_booking_api::store::archive::ARCHIVE_BATCH,
    )
    .await?;
    let archiving = started.elapsed();
    sqlx::raw_sql("VACUUM ANALYZE booking")
        .execute(&pool)
        .await?;
    println!(
        "== archived {archived} bookings that ended more than a day ago in {:.1} s (then VACUUM: {:.1} s)",
        archiving.as_secs_f64(),
        (started.elapsed() - archiving).as_secs_f64()
    );
    // The indexes as the job leaves them after archiving a whole history at once:
    // emptied pages, not given back ...
    let bare = bare_inserts(&pool, POOL as usize, secs).await?;
    let unrebuilt = bench.creates(32, "hist").await?;
    println!(
        "booking creates, 32 clients, indexes not rebuilt: {:.2} x bare INSERT ({:.0}/s), {:.2} x the empty table's ratio; p99 {:.1} ms",
        unrebuilt.rate / bare.rate,
        bare.rate,
        (unrebuilt.rate / bare.rate) / (empty.c32.rate / empty.bare.rate),
        unrebuilt.p99
    );
    // The planned-only models take as many seconds of creates, so that both sets of
    // models hold the same creates when the paired reads below compare them.
    let unrebuilt_plan = bench.creates(32, "plan").await?;
    println!(
        "booking creates on the planned-only models beside them, 32 clients: {:.2} x bare INSERT; p99 {:.1} ms",
        unrebuilt_plan.rate / bare.rate,
        unrebuilt_plan.p99
    );
    // ... and rebuilt, as a deployment's are: the migration that brought archiving
    // archives an existing history before it builds them, and from then on they hold
    // what is planned or recent (each booking leaves a day after it ends).
    let started = Instant::now();
    sqlx::raw_sql("REINDEX INDEX booking_slot_excl; REINDEX INDEX booking_user_excl")
        .execute(&pool)
        .await?;
    println!(
        "== the exclusion constraints' indexes rebuilt in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    common::settle(&pool).await?;
    // Loaded / empty, measured at the same moments: the history's models against the
    // same models in a database whose booking table is empty, in alternating rounds.
    // The phases' own ratios compare measures minutes apart, across a load, an
    // archive and a VACUUM. Before the `hist` phase's creates: every create the bench
    // makes stays in the table, each by a new user, so after that phase the table
    // would hold up to twice the history's bookings and ten times its users, and the
    // `hist` models' next year several times the planned part's bookings: a load
    // heavier than the history it is meant to measure.
    println!("== creates with the history and in an empty database, in alternating rounds");
    print_table_state(&pool).await?;
    let other = empty_database(&base, &bench, &["hist"]).await?;
    // The `plan` models take creates in the same rounds (a third side, not part of
    // the ratio), so that their next year stays as full as the `hist` models' for
    // the reads below, which compare the two.
    let against_empty =
        alternating_creates(&[(&bench, "hist"), (&other, "hist"), (&bench, "plan")]).await?;
    // The reads while the `hist` models hold what the `plan` models do (their
    // planned part and the same seconds of creates): the phase below adds tens of
    // thousands to the `hist` models' next year alone, which a year's availability
    // reads (with creates on one side only, history / planned would measure those
    // creates, not the past).
    println!("== the hot reads, planned only and with history, in alternating rounds");
    let paired = bench.paired_reads(("plan", "p"), ("hist", "h")).await?;
    // What the past alone costs a create at the same moments: the history's models
    // against the planned-only ones, in one database (each holds the same planned
    // part and the same creates; the history's also 2 years 9 months of the past).
    println!("== creates with the history and planned only, one database, in alternating rounds");
    let against_planned = alternating_creates(&[(&bench, "hist"), (&bench, "plan")]).await?;
    println!("== planned bookings and the past");
    common::settle(&pool).await?;
    let loaded = bench.phase(&pool, "hist").await?;
    // Creates by the history's own users (about ten bookings each over the three
    // years) against creates by new users, on the same models, in alternating rounds:
    // what a user's past costs a create. Only users who hold no booking now or ahead
    // (about a fifth of them), each once: the default policy's one planned booking
    // would refuse the others, and a refusal is not the create being measured.
    let returning: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM app_user u WHERE name LIKE 'h%' AND NOT EXISTS \
         (SELECT 1 FROM booking b WHERE b.user_name = u.name AND b.cancelled_at IS NULL AND b.end_at > now()) \
         ORDER BY random()",
    )
    .fetch_all(&pool)
    .await?;
    println!(
        "== creates by {} of the history's users with nothing booked ahead, and by new users",
        returning.len()
    );
    let returning = Arc::new(std::sync::Mutex::new(returning));
    // Rounds of 2 s, so that the users last (about 2,000 creates a round here).
    let short = bench.lasting(Duration::from_secs(2));
    let (mut by_new, mut by_returning) = (Vec::new(), Vec::new());
    for round in 0..PAIRED_ROUNDS / 2 {
        for is_returning in [round % 2 == 1, round % 2 == 0] {
            if is_returning {
                by_returning.push(
                    short
                        .creates_by(32, "hist", Some(returning.clone()))
                        .await?,
                );
            } else {
                by_new.push(short.creates(32, "hist").await?);
            }
        }
    }
    println!("\n== summary (ratios first)");
    // What the past costs a create (history / planned), apart from what the planned
    // bookings over its window cost (planned / empty: a create reads them all).
    println!(
        "creates, 32 clients, planned only: {:.2} x bare INSERT, p99 {:.1} ms; history / planned {:.2}, planned / empty {:.2}",
        plan.c32.rate / plan.bare.rate,
        plan.c32.p99,
        (loaded.c32.rate / loaded.bare.rate) / (plan.c32.rate / plan.bare.rate),
        (plan.c32.rate / plan.bare.rate) / (empty.c32.rate / empty.bare.rate)
    );
    for (what, rounds) in [
        ("with history / in an empty database", &against_empty),
        (
            "with history / planned only (one database)",
            &against_planned,
        ),
    ] {
        let ratios: Vec<f64> = rounds
            .iter()
            .filter_map(|sides| match sides[..] {
                [h, e, ..] => Some(h.rate / e.rate),
                _ => None,
            })
            .collect();
        println!(
            "creates, 32 clients, {what} at the same moments (alternating rounds): {}; median {:.2}",
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            common::median(ratios.clone())
        );
    }
    for (what, rounds) in [
        ("history / empty", &against_empty),
        ("history / planned", &against_planned),
    ] {
        for (round, sides) in rounds.iter().enumerate() {
            if let [h, e, ..] = sides[..] {
                println!(
                    "  {what}, round {round}: {:.0} / {:.0} per s (refused {} / {}), p99 {:.1} / {:.1} ms, CPU per create {} / {}",
                    h.rate,
                    e.rate,
                    h.refused,
                    e.refused,
                    h.p99,
                    e.p99,
                    cpu_split(h.cpu),
                    cpu_split(e.cpu)
                );
            }
        }
    }
    let open = |p: &Phase| p.open.map_or(0.0, |t| t.rate);
    println!(
        "creates arriving on a schedule, the most per s with p99 within {P99_MS} ms: {:.0} empty, {:.0} planned only, {:.0} with history; loaded / empty {:.2}",
        open(&empty),
        open(&plan),
        open(&loaded),
        open(&loaded) / open(&empty)
    );
    for (name, e, l) in [
        ("creates, 32 clients", &empty.c32, &loaded.c32),
        ("creates, 300 clients", &empty.c300, &loaded.c300),
    ] {
        println!(
            "{name}: {:.2} x bare INSERT empty, {:.2} x loaded; loaded / empty rate {:.2}; p99 {:.1} ms empty, {:.1} ms loaded",
            e.rate / empty.bare.rate,
            l.rate / loaded.bare.rate,
            (l.rate / loaded.bare.rate) / (e.rate / empty.bare.rate),
            e.p99,
            l.p99
        );
    }
    for (round, (n, r)) in by_new.iter().zip(&by_returning).enumerate() {
        if r.n == 0 {
            println!("creates, 32 clients, alternating round {round}: no returning user left (a smaller GPU_BOOKING_HISTORY_USERS than four rounds need)");
            continue;
        }
        println!(
            "creates, 32 clients, alternating round {round}: by returning users / by new users {:.2} ({:.0} / {:.0} per s; refused {} / {}), p99 {:.1} / {:.1} ms",
            r.rate / n.rate,
            r.rate,
            n.rate,
            r.refused,
            n.refused,
            r.p99,
            n.p99
        );
    }
    for (((name, e), (_, p)), (_, pb, h)) in empty_reads.iter().zip(&plan_reads).zip(&paired) {
        println!(
            "{name}: history / planned only rate {:.2} (alternating rounds, one database), loaded / empty {:.2}; p50 {:.2} / {:.2} / {:.2} / {:.2} ms, p99 {:.2} / {:.2} / {:.2} / {:.2} ms (empty / planned alone / planned beside history / history)",
            h.rate / pb.rate,
            h.rate / e.rate,
            e.p50,
            p.p50,
            pb.p50,
            h.p50,
            e.p99,
            p.p99,
            pb.p99,
            h.p99
        );
    }
    Ok(())
}

/// "µs (this process + Postgres)" of a CPU split, or "?" where not measured.
fn cpu_split(cpu: Option<(f64, f64)>) -> String {
    match cpu {
        Some((own, pg)) => format!("{:.0} µs ({own:.0} + {pg:.0})", own + pg),
        None => "?".into(),
    }
}

/// What the table holds when the loaded / empty rounds start: the history's
/// bookings and users and what the bench's phases before them added.
async fn print_table_state(pool: &PgPool) -> anyhow::Result<()> {
    let (bookings, live_hist, users): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM booking), \
                (SELECT count(*) FROM booking WHERE model LIKE 'hist-%' AND NOT archived \
                   AND cancelled_at IS NULL AND end_at > now()), \
                (SELECT count(*) FROM app_user)",
    )
    .fetch_one(pool)
    .await?;
    println!(
        "(the table: {bookings} bookings, {live_hist} of them ahead on the history's models; {users} users)"
    );
    Ok(())
}

/// The second database of the same-moment rounds: the models `{prefix}-00` ... of
/// each of `prefixes` and an empty booking table, served by an API of its own in this
/// process, with `bench`'s HTTP client and user numbering: creates measured on it and
/// on `bench` in alternating rounds meet the same moments of the machine.
async fn empty_database(base: &str, bench: &Bench, prefixes: &[&str]) -> anyhow::Result<Bench> {
    let (_, other) =
        database_of_its_own(base, bench, "gpu_booking_bench_history_empty", prefixes).await?;
    Ok(other)
}

/// Database `name`, made afresh and migrated, with the bare INSERT's table and the
/// models `{prefix}-00` ..., and an API of its own on it in this process: its pool
/// for the bench's own statements, and the bench on that API (the same clients and
/// user counter as `bench`).
async fn database_of_its_own(
    base: &str,
    bench: &Bench,
    name: &str,
    prefixes: &[&str],
) -> anyhow::Result<(PgPool, Bench)> {
    let pool = common::fresh_database(base, name, POOL).await?;
    gpu_booking_api::server::migrate(&pool).await?;
    create_bench_row(&pool).await?;
    let other = Bench {
        api: Arc::new(TestApi::start(common::api_pool(&pool).await?).await?),
        ..bench.lasting(bench.secs)
    };
    declare_models(&other.http, &other.api, prefixes).await?;
    Ok((pool, other))
}

/// Closes the connections of a database whose phase is over: Postgres serves 100 by
/// default, and the history's database and the empty one of the rounds take 32 each,
/// so with the phases' pools left open the rounds' connections would be refused
/// ("too many clients already").
async fn close(pool: PgPool, bench: Bench) {
    bench.api.pool.close().await;
    pool.close().await;
}

/// The table the bare one-row INSERTs write.
async fn create_bench_row(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("CREATE TABLE bench_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v bigint NOT NULL, at timestamptz NOT NULL)")
        .execute(pool)
        .await?;
    Ok(())
}

/// Creates at 32 clients on each side (a bench and its models' prefix), in
/// `PAIRED_ROUNDS / 2` rounds, the order reversed every other round; per round, each
/// side's figures in the order given, with the CPU per create of this process (the
/// HTTP clients and the side's API: only one side runs at a time) and of the side's
/// database's backends. Each side first takes `WARM_UP` of creates, not measured: the
/// rounds measure the sides as they serve, and the first side of the first round
/// would otherwise meet what the bench's set-up left (a rebuilt index, a fresh
/// database's connections, a checkpoint's writes) and measure that, not a create.
async fn alternating_creates(sides: &[(&Bench, &'static str)]) -> anyhow::Result<Vec<Vec<Stats>>> {
    for (bench, prefix) in sides {
        bench.lasting(WARM_UP).creates(32, prefix).await?;
    }
    let mut rounds = Vec::new();
    for round in 0..PAIRED_ROUNDS / 2 {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = vec![None; sides.len()];
        for i in order {
            let (bench, prefix) = sides[i];
            let cpu = common::CpuTicks::now(&bench.api.pool).await;
            let mut stats = bench.creates(32, prefix).await?;
            stats.cpu = cpu.per_op(
                &common::CpuTicks::now(&bench.api.pool).await,
                stats.n as u64,
            );
            got[i] = Some(stats);
        }
        rounds.push(got.into_iter().flatten().collect());
    }
    Ok(rounds)
}

/// Declares models `{prefix}-00` ... of 1,000 units each on `api`.
async fn declare_models(
    http: &reqwest::Client,
    api: &TestApi,
    prefixes: &[&str],
) -> anyhow::Result<()> {
    let admin = api.token("admin@example.com", Some("admin"));
    for m in (0..MODELS).flat_map(|m| {
        prefixes
            .iter()
            .map(move |prefix| format!("{prefix}-{m:02}"))
    }) {
        http.put(format!("{}/api/v1/models/{m}", api.url))
            .bearer_auth(&admin)
            .json(&json!({"units": 1000, "patterns": [], "gpumem_mib": 1024}))
            .send()
            .await?
            .error_for_status()?;
    }
    Ok(())
}

/// 15-day cycles of the whole history (3 years) and of its planned part
/// (`scripts/load-history.sql`'s defaults).
const HISTORY_CYCLES: u64 = 73;
const PLANNED_CYCLES: u64 = 6;

/// Loads `bookings` bookings of `users` users over `cycles` cycles, the last
/// [`PLANNED_CYCLES`] of them planned, on models `{model_prefix}-NN` and users
/// `{user_prefix}NNNNNN`.
async fn load(
    pool: &PgPool,
    bookings: u64,
    users: u64,
    cycles: u64,
    model_prefix: &str,
    user_prefix: &str,
) -> anyhow::Result<()> {
    println!(
        "== loading {bookings} bookings of {users} users over {cycles} cycles (scripts/load-history.sql)"
    );
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let settings = [
        ("bookings", bookings.to_string()),
        ("users", users.to_string()),
        ("cycles", cycles.to_string()),
        ("planned_cycles", PLANNED_CYCLES.to_string()),
        ("model_prefix", model_prefix.to_owned()),
        ("user_prefix", user_prefix.to_owned()),
    ];
    for (name, value) in &settings {
        sqlx::query("SELECT set_config($1, $2, false)")
            .bind(format!("gpu_booking_load.{name}"))
            .bind(value)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::raw_sql(LOADER).execute(&mut *conn).await?;
    for (name, _) in &settings {
        sqlx::raw_sql(&format!("RESET gpu_booking_load.{name}"))
            .execute(&mut *conn)
            .await?;
    }
    drop(conn);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(pool)
        .await?;
    println!(
        "loaded in {:.1} s; bookings in the table: {count}",
        started.elapsed().as_secs_f64()
    );
    common::settle(pool).await
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    rate: f64,
    p50: f64,
    p99: f64,
    n: usize,
    refused: u64,
    /// CPU per operation, µs: (this process, the database's Postgres backends), where
    /// measured (`alternating_creates`).
    cpu: Option<(f64, f64)>,
}

impl Stats {
    fn of(mut ms: Vec<f64>, elapsed: Duration, refused: u64) -> Self {
        ms.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if ms.is_empty() {
                f64::NAN
            } else {
                ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)]
            }
        };
        Stats {
            rate: ms.len() as f64 / elapsed.as_secs_f64(),
            p50: q(0.50),
            p99: q(0.99),
            n: ms.len(),
            refused,
            cpu: None,
        }
    }

    fn print(&self, name: &str) {
        println!(
            "{name:<44} {:>8.0} /s  p50 {:>7.2} ms  p99 {:>7.2} ms  (n {}, refused {})",
            self.rate, self.p50, self.p99, self.n, self.refused
        );
    }
}

struct Phase {
    bare: Stats,
    c32: Stats,
    c300: Stats,
    /// The highest rate of creates arriving on a schedule (an open loop) whose p99
    /// stays within `P99_MS`, if any.
    open: Option<common::Trial>,
}

struct Bench {
    api: Arc<TestApi>,
    http: reqwest::Client,
    secs: Duration,
    reads: u64,
    next_user: Arc<AtomicU64>,
}

impl Bench {
    /// The same bench (API, clients, user numbering) with creates measured for `secs`.
    fn lasting(&self, secs: Duration) -> Bench {
        Bench {
            api: self.api.clone(),
            http: self.http.clone(),
            secs,
            reads: self.reads,
            next_user: self.next_user.clone(),
        }
    }

    /// The bare INSERTs and the creates on the models `{prefix}-00` ...
    async fn phase(&self, pool: &PgPool, prefix: &'static str) -> anyhow::Result<Phase> {
        let bare = bare_inserts(pool, POOL as usize, self.secs).await?;
        bare.print("bare one-row INSERT transactions, 32 clients");
        let c32 = self.creates(32, prefix).await?;
        c32.print("booking creates, 32 clients");
        let c300 = self.creates(300, prefix).await?;
        c300.print("booking creates, 300 clients");
        let (open, tried) = common::sustained_rate(P99_MS, common::FIRST_RATE, 4, |rate| {
            self.open_loop(rate, prefix)
        })
        .await?;
        println!(
            "booking creates arriving on a schedule: {:.0} /s with p99 within {P99_MS} ms [{}]",
            open.map_or(0.0, |t| t.rate),
            common::trace(&tried)
        );
        Ok(Phase {
            bare,
            c32,
            c300,
            open,
        })
    }

    /// One open-loop trial (`common::open_loop`) of creates by new users at `rate`
    /// per second, for `OPEN_LOOP_TRIAL`, on the models `{prefix}-00` ...
    async fn open_loop(&self, rate: f64, prefix: &'static str) -> anyhow::Result<common::Schedule> {
        let due = common::due(rate, OPEN_LOOP_TRIAL) as u64;
        let first = self.next_user.fetch_add(due, Ordering::Relaxed);
        let tokens: Vec<String> = (first..first + due)
            .map(|u| self.api.token(&new_user(u), None))
            .collect();
        common::open_loop_creates(
            &self.http,
            &self.api.url,
            &tokens,
            rate,
            OPEN_LOOP_TRIAL,
            || new_window(prefix),
        )
        .await
    }

    /// Each hot read, once, on the models `{prefix}-00` ... and the users
    /// `{users}000000` ...
    async fn reads(
        &self,
        prefix: &'static str,
        users: &'static str,
    ) -> anyhow::Result<Vec<(&'static str, Stats)>> {
        let mut reads = Vec::new();
        for (name, requests) in self.read_requests(prefix, users) {
            let s = self.read(requests).await?;
            s.print(name);
            reads.push((name, s));
        }
        Ok(reads)
    }

    /// Each read measured on the models and users of `a` and of `b` (model prefix,
    /// user prefix) in [`PAIRED_ROUNDS`] alternating rounds, `a` first in even rounds
    /// and `b` first in odd ones: both sides meet the same moments of the machine, so
    /// their ratio is not the drift between two measures minutes apart.
    async fn paired_reads(
        &self,
        a: (&'static str, &'static str),
        b: (&'static str, &'static str),
    ) -> anyhow::Result<Vec<(&'static str, Stats, Stats)>> {
        let mut out = Vec::new();
        for ((name, ra), (_, rb)) in self
            .read_requests(a.0, a.1)
            .into_iter()
            .zip(self.read_requests(b.0, b.1))
        {
            let (mut ms_a, mut ms_b) = (Vec::new(), Vec::new());
            let (mut t_a, mut t_b) = (Duration::ZERO, Duration::ZERO);
            let chunk = ra.len().div_ceil(PAIRED_ROUNDS);
            for (round, (ca, cb)) in ra.chunks(chunk).zip(rb.chunks(chunk)).enumerate() {
                for side in [round % 2, 1 - round % 2] {
                    let (requests, ms, t) = if side == 0 {
                        (ca, &mut ms_a, &mut t_a)
                    } else {
                        (cb, &mut ms_b, &mut t_b)
                    };
                    let started = Instant::now();
                    ms.extend(self.latencies(requests.to_vec()).await?);
                    *t += started.elapsed();
                }
            }
            let refused = |n: usize, ms: &Vec<f64>| (n - ms.len()) as u64;
            let (refused_a, refused_b) = (refused(ra.len(), &ms_a), refused(rb.len(), &ms_b));
            let (sa, sb) = (
                Stats::of(ms_a, t_a, refused_a),
                Stats::of(ms_b, t_b, refused_b),
            );
            sa.print(&format!("{name} [{}]", a.0));
            sb.print(&format!("{name} [{}]", b.0));
            out.push((name, sa, sb));
        }
        Ok(out)
    }

    /// The hot reads' requests (token, url), `self.reads` of each, on the models
    /// `{prefix}-00` ... and the users `{users}000000` ...
    fn read_requests(
        &self,
        prefix: &str,
        users: &str,
    ) -> Vec<(&'static str, Vec<(String, String)>)> {
        let now = Utc::now();
        let today = now.date_naive();
        let url = &self.api.url;
        let admin = self.api.token("admin@example.com", Some("admin"));
        let service = self.api.token("webhook", Some("service"));
        let year = format!("from={today}&to={}", today + TimeDelta::days(365));
        let week_ago = rfc3339(now - TimeDelta::days(7));
        let in_a_month = rfc3339(now + TimeDelta::days(30));
        // Users of the history (h000000 ...), who hold bookings in it once it is loaded.
        let user = |i: usize| format!("{users}{:06}", (i * 7919) % 100_000);
        let n = self.reads as usize;
        let each = |f: &dyn Fn(usize) -> (String, String)| (0..n).map(f).collect::<Vec<_>>();
        vec![
            (
                "GET /models/{m}/availability (a year)",
                each(&|i| {
                    (
                        admin.clone(),
                        format!(
                            "{url}/api/v1/models/{prefix}-{:02}/availability?{year}",
                            i % MODELS
                        ),
                    )
                }),
            ),
            (
                "GET /me/next-start",
                each(&|i| {
                    (
                        self.api.token(&user(i), None),
                        format!(
                            "{url}/api/v1/me/next-start?model={prefix}-{:02}",
                            i % MODELS
                        ),
                    )
                }),
            ),
            (
                "GET /bookings (admin, model and window)",
                each(&|i| {
                    (
                        admin.clone(),
                        format!(
                            "{url}/api/v1/bookings?all=true&model={prefix}-{:02}&from={week_ago}&to={in_a_month}&limit=100",
                            i % MODELS
                        ),
                    )
                }),
            ),
            (
                "GET /bookings (admin, one user)",
                each(&|i| {
                    (
                        admin.clone(),
                        format!("{url}/api/v1/bookings?user={}&limit=100", user(i)),
                    )
                }),
            ),
            // The same user's newest booking alone: an answer of one booking whatever
            // the user's history, where the read above answers ten with history and
            // one without.
            (
                "GET /bookings (admin, one user, newest)",
                each(&|i| {
                    (
                        admin.clone(),
                        format!("{url}/api/v1/bookings?user={}&limit=1", user(i)),
                    )
                }),
            ),
            (
                "GET /schedulability",
                each(&|i| {
                    (
                        service.clone(),
                        format!("{url}/api/v1/schedulability?user={}", user(i)),
                    )
                }),
            ),
        ]
    }

    /// Booking creates by `clients` concurrent HTTP clients for `self.secs`, each by
    /// a new user.
    async fn creates(&self, clients: usize, prefix: &'static str) -> anyhow::Result<Stats> {
        self.creates_by(clients, prefix, None).await
    }

    /// Booking creates as `creates`, by a new user each, or with `returning` by the
    /// users it holds, each taken once (a client stops when none is left).
    async fn creates_by(
        &self,
        clients: usize,
        prefix: &'static str,
        returning: Option<Arc<std::sync::Mutex<Vec<String>>>>,
    ) -> anyhow::Result<Stats> {
        let refused = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (api, http, refused, next_user, secs, returning) = (
                self.api.clone(),
                self.http.clone(),
                refused.clone(),
                self.next_user.clone(),
                self.secs,
                returning.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut ms = Vec::new();
                while started.elapsed() < secs {
                    let user = match &returning {
                        Some(users) => {
                            let next = users.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop();
                            match next {
                                Some(user) => user,
                                None => break,
                            }
                        }
                        None => new_user(next_user.fetch_add(1, Ordering::Relaxed)),
                    };
                    let token = api.token(&user, None);
                    let t = Instant::now();
                    let r = http
                        .post(format!("{}/api/v1/bookings", api.url))
                        .bearer_auth(&token)
                        .json(&new_window(prefix))
                        .send()
                        .await?;
                    let status = r.status();
                    let _ = r.bytes().await?;
                    if status == 201 {
                        ms.push(t.elapsed().as_secs_f64() * 1e3);
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                anyhow::Ok(ms)
            }));
        }
        let mut ms = Vec::new();
        for t in tasks {
            ms.extend(t.await??);
        }
        Ok(Stats::of(
            ms,
            started.elapsed(),
            refused.load(Ordering::Relaxed),
        ))
    }

    /// `requests` (token, url) sent by READ_CLIENTS concurrent clients. Anything but
    /// 200 counts as refused.
    async fn read(&self, requests: Vec<(String, String)>) -> anyhow::Result<Stats> {
        let n = requests.len();
        let started = Instant::now();
        let ms = self.latencies(requests).await?;
        let refused = (n - ms.len()) as u64;
        Ok(Stats::of(ms, started.elapsed(), refused))
    }

    /// The latencies (ms) of the `requests` answered 200, sent by READ_CLIENTS
    /// concurrent clients.
    async fn latencies(&self, requests: Vec<(String, String)>) -> anyhow::Result<Vec<f64>> {
        let requests = Arc::new(std::sync::Mutex::new(requests));
        let mut tasks = Vec::new();
        for _ in 0..READ_CLIENTS {
            let (http, requests) = (self.http.clone(), requests.clone());
            tasks.push(tokio::spawn(async move {
                let mut ms = Vec::new();
                loop {
                    let next = requests
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .pop();
                    let Some((token, url)) = next else { break };
                    let t = Instant::now();
                    let r = http.get(&url).bearer_auth(&token).send().await?;
                    let status = r.status();
                    let _ = r.bytes().await?;
                    if status == 200 {
                        ms.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                anyhow::Ok(ms)
            }));
        }
        let mut ms = Vec::new();
        for t in tasks {
            ms.extend(t.await??);
        }
        Ok(ms)
    }
}

/// The name of the bench's `n`th new user. A lab's new users arrive in no order of
/// their names, and the indexes on names (B-trees and, before migration
/// `20261210000100`, the one-booking-at-a-time constraint's GiST) cost more for names
/// that arrive scattered than for `new1`, `new2`, ...: multiplying by an odd constant
/// is a bijection on `u64`, so the names are distinct and scattered.
fn new_user(n: u64) -> String {
    format!("new{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A create's body: one of the models `{prefix}-00` ..., a window of 1 to 3 days
/// starting at a random hour of the next year.
fn new_window(prefix: &str) -> serde_json::Value {
    let (model, offset_h, days) = {
        let mut rng = rand::rng();
        (
            rng.random_range(0..MODELS),
            rng.random_range(1..365 * 24),
            rng.random_range(1..=3),
        )
    };
    let start = Utc::now() + TimeDelta::hours(offset_h);
    json!({"model": format!("{prefix}-{model:02}"), "start": start, "end": start + TimeDelta::days(days)})
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The baseline: what this Postgres does for the smallest write transaction.
async fn bare_inserts(pool: &PgPool, clients: usize, secs: Duration) -> anyhow::Result<Stats> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut ms = Vec::new();
            while started.elapsed() < secs {
                let t = Instant::now();
                common::bare_insert(&pool, c as i64).await?;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::Ok(ms)
        }));
    }
    let mut ms = Vec::new();
    for t in tasks {
        ms.extend(t.await??);
    }
    Ok(Stats::of(ms, started.elapsed(), 0))
}
