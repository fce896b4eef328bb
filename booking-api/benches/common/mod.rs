//! What the booking-store benchmarks share.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

/// The `gpu-booking` binary's allocator (src/main.rs), so that the API is measured as
/// it runs. Without it the benches measured glibc's malloc, which the service does not
/// use: 16-18 % of the history bench's process during creates (`perf`, 2026-11-27).
/// The baselines in the same process get it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
