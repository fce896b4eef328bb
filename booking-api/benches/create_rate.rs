//! Booking creates per second at 32 concurrent HTTP clients, against the same
//! Postgres's rate for a bare one-row INSERT transaction, measured in the same run.
//! Not a pass/fail test: it prints both figures and their ratio.
//!
//!     DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo bench -p gpu-booking-api --bench create_rate
//!
//! GPU_BOOKING_BENCH_SECS sets the length of each phase (default 10).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use gpu_booking_api::testing::TestApi;
use rand::Rng;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

const CLIENTS: usize = 32;
const MODELS: usize = 8;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let secs: u64 = std::env::var("GPU_BOOKING_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let phase = Duration::from_secs(secs);
    let pool = fresh_database(&base, "gpu_booking_bench").await?;
    gpu_booking_api::MIGRATOR.run(&pool).await?;
    sqlx::query("CREATE TABLE bench_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v bigint NOT NULL, at timestamptz NOT NULL)")
        .execute(&pool)
        .await?;

    let baseline = bare_inserts(&pool, phase).await?;
    let creates = booking_creates(&pool, phase).await?;
    println!("clients: {CLIENTS}, phase: {secs} s each, Postgres pool: 32 connections");
    println!("bare one-row INSERT transactions: {baseline:>9.0} /s");
    println!("booking creates over HTTP:        {creates:>9.0} /s");
    println!(
        "ratio creates / inserts:          {:>9.2}",
        creates / baseline
    );
    Ok(())
}

async fn fresh_database(base: &str, name: &str) -> anyhow::Result<PgPool> {
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
    Ok(PgPoolOptions::new()
        .max_connections(32)
        .connect(&url)
        .await?)
}

/// The baseline: what this Postgres does for the smallest write transaction.
async fn bare_inserts(pool: &PgPool, phase: Duration) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (pool, done) = (pool.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < phase {
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO bench_row (v, at) VALUES ($1, $2)")
                    .bind(c as i64)
                    .bind(Utc::now())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Booking creates through the real API: every request a new user, one of 8
/// models with plenty of units, windows spread over five years so that almost
/// every create is accepted (refusals are counted apart and not in the rate).
async fn booking_creates(pool: &PgPool, phase: Duration) -> anyhow::Result<f64> {
    let api = TestApi::start(pool.clone()).await?;
    let admin = api.token("admin@example.com", Some("admin"));
    let http = reqwest::Client::new();
    for m in 0..MODELS {
        http.put(format!("{}/api/v1/models/bench{m}", api.url))
            .bearer_auth(&admin)
            .json(&json!({"units": 1000, "patterns": [], "gpumem_mib": 1024}))
            .send()
            .await?
            .error_for_status()?;
    }
    let created = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    // Tokens are minted before the clock starts: each request is a new user.
    let tokens: Vec<Vec<String>> = (0..CLIENTS)
        .map(|c| {
            (0..4_000)
                .map(|i| api.token(&format!("c{c}u{i}"), None))
                .collect()
        })
        .collect();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for tokens in tokens {
        let (http, url, created, refused) = (
            http.clone(),
            api.url.clone(),
            created.clone(),
            refused.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while started.elapsed() < phase && i < tokens.len() {
                let (model, offset_h, days) = {
                    let mut rng = rand::rng();
                    (rng.random_range(0..MODELS), rng.random_range(1..5 * 365 * 24), rng.random_range(1..=14))
                };
                let start = Utc::now() + TimeDelta::hours(offset_h);
                let r = http
                    .post(format!("{url}/api/v1/bookings"))
                    .bearer_auth(&tokens[i])
                    .json(&json!({"model": format!("bench{model}"), "start": start, "end": start + TimeDelta::days(days)}))
                    .send()
                    .await?;
                if r.status() == 201 {
                    created.fetch_add(1, Ordering::Relaxed);
                } else {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "(booking creates refused: {})",
        refused.load(Ordering::Relaxed)
    );
    Ok(created.load(Ordering::Relaxed) as f64 / elapsed)
}
