//! What the booking-store benchmarks share.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// Drops and creates database `name` next to `base` (a `DATABASE_URL`), and connects
/// a pool of `connections` to it (acquiring may wait long: a loaded phase queues).
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
    Ok(PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(120))
        .connect(&url)
        .await?)
}
