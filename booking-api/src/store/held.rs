//! The units each active booking's high-priority pods hold, as the controller last
//! counted them (it watches the pods; the service does not).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

/// Replaces the whole count with `held` (booking id -> units held). Ids of no
/// booking are dropped: a pod label can name anything.
pub async fn replace(
    pool: &PgPool,
    held: &BTreeMap<i64, i32>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let (ids, units): (Vec<i64>, Vec<i32>) = held.iter().map(|(id, n)| (*id, *n)).unzip();
    let mut tx = pool.begin().await?;
    sqlx::query!("DELETE FROM booking_held WHERE booking_id <> ALL($1)", &ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query!(
        "INSERT INTO booking_held (booking_id, units, reported_at)
         SELECT h.id, h.units, $3 FROM unnest($1::bigint[], $2::integer[]) AS h(id, units)
         JOIN booking b ON b.id = h.id
         ON CONFLICT (booking_id) DO UPDATE SET units = excluded.units, reported_at = excluded.reported_at",
        &ids,
        &units,
        now
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The units `booking`'s pods hold, by the last count (0 when none was counted).
pub async fn units_held(db: impl PgExecutor<'_>, booking: i64) -> sqlx::Result<i32> {
    let n: Option<i32> = sqlx::query_scalar!(
        "SELECT units FROM booking_held WHERE booking_id = $1",
        booking
    )
    .fetch_optional(db)
    .await?;
    Ok(n.unwrap_or(0))
}
