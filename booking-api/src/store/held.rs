//! The units each active booking's high-priority pods hold, as the controller last
//! counted them (it watches the pods; the service does not).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

/// Replaces the whole count with `held` (booking id -> units held) and why bookings
/// wait (`waiting`: booking id -> the controller's sentence; a booking left out is
/// not waiting). A booking only waiting holds 0 units. Ids of no booking are
/// dropped: a pod label can name anything. Written here, not on `booking`, so that
/// the change stream does not carry what changes with the cluster.
pub async fn replace(
    pool: &PgPool,
    held: &BTreeMap<i64, i32>,
    waiting: &BTreeMap<i64, String>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let ids: BTreeSet<i64> = held.keys().chain(waiting.keys()).copied().collect();
    let ids: Vec<i64> = ids.into_iter().collect();
    let units: Vec<i32> = ids
        .iter()
        .map(|id| held.get(id).copied().unwrap_or(0))
        .collect();
    let why: Vec<Option<String>> = ids.iter().map(|id| waiting.get(id).cloned()).collect();
    let mut tx = pool.begin().await?;
    sqlx::query!("DELETE FROM booking_held WHERE booking_id <> ALL($1)", &ids)
        .execute(&mut *tx)
        .await?;
    sqlx::query!(
        "INSERT INTO booking_held (booking_id, units, waiting, reported_at)
         SELECT h.id, h.units, h.waiting, $4
         FROM unnest($1::bigint[], $2::integer[], $3::text[]) AS h(id, units, waiting)
         JOIN booking b ON b.id = h.id
         ON CONFLICT (booking_id) DO UPDATE SET units = excluded.units,
             waiting = excluded.waiting, reported_at = excluded.reported_at",
        &ids,
        &units,
        &why as &[Option<String>],
        now
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Why each of `bookings` waits for a card, by the last report: only those that
/// wait.
pub async fn waiting(
    db: impl PgExecutor<'_>,
    bookings: &[i64],
) -> sqlx::Result<HashMap<i64, String>> {
    if bookings.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sqlx::query!(
        r#"SELECT booking_id, waiting AS "waiting!" FROM booking_held
           WHERE booking_id = ANY($1) AND waiting IS NOT NULL"#,
        bookings
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.booking_id, r.waiting))
        .collect())
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
