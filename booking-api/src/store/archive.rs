//! Archiving: bookings that ended long ago leave the exclusion constraints' indexes,
//! so that a create's insert does not grow with history. The rule and its
//! backstop are in migration `20261201000100_booking_archived.sql`; this is the job
//! that moves the horizon.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::PgPool;

/// Bookings archived per transaction: each pass holds off the creates' checks for its
/// length (0.3-0.5 ms a booking, measured with a million in the table), so passes
/// stay short.
pub const ARCHIVE_BATCH: i32 = 500;

/// How often a replica archives (any replica may; passes of two serialise on the
/// archive lock and find nothing left for the second).
pub const ARCHIVE_EVERY: Duration = Duration::from_secs(600);

/// Archives every live booking that ended at or before `before`, in passes of at most
/// about `batch`; returns how many it archived.
pub async fn archive_ended(pool: &PgPool, before: DateTime<Utc>, batch: i32) -> sqlx::Result<u64> {
    let mut archived = 0u64;
    loop {
        let n = sqlx::query_scalar!(
            r#"SELECT booking_archive_pass($1, $2) AS "n!""#,
            before,
            batch
        )
        .fetch_one(pool)
        .await?;
        archived += u64::try_from(n).unwrap_or_default();
        if n < i64::from(batch) {
            return Ok(archived);
        }
    }
}

/// The horizon: every archived booking ended at or before it (`-infinity` before the
/// first pass, read as `None`).
pub async fn horizon(pool: &PgPool) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!(
        r#"SELECT CASE WHEN isfinite(at) THEN at END AS "at" FROM booking_archive_horizon"#
    )
    .fetch_one(pool)
    .await
}

/// Archives every [`ARCHIVE_EVERY`] what ended more than `after` ago, until the pool
/// closes.
pub fn spawn_archiver(pool: PgPool, after: TimeDelta) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(ARCHIVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if pool.is_closed() {
                return;
            }
            // Never past now (a negative setting): a booking that has not ended gains
            // nothing from leaving the constraints.
            let before = Utc::now() - after.max(TimeDelta::zero());
            match archive_ended(&pool, before, ARCHIVE_BATCH).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(archived = n, "ended bookings archived"),
                Err(e) => tracing::warn!(error = %e, "could not archive ended bookings"),
            }
        }
    });
}
