//! Booked versus used: spans of each booking's use, written from
//! the controller's held-units report (`PUT /api/v1/held-units`, which also carries
//! the last GPU activity the node agent annotated on the booking's pods), and the
//! per-booking figures the admin report and the idle nudge read.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::{PgExecutor, PgPool};

pub use gpu_booking_core::usage::ACTIVITY_RESOLUTION;

/// The advisory lock (two-key form) that serialises reports; no other lock of ours
/// uses these keys (the booking locks' first keys are 7262-7265).
const REPORT_LOCK: (i32, i32) = (16, 5);

/// Records one report: `held` (booking id -> units its high-priority pods hold now,
/// the whole count) and `active` (booking id -> the last GPU activity of its pods).
/// Held spans of bookings no longer held (or held with other units) close at `now`
/// and new ones open; each activity observation extends the booking's span that it
/// touches or starts one. Ids of no booking are ignored; activity in the future is
/// taken as now.
pub async fn record(
    pool: &PgPool,
    held: &BTreeMap<i64, i32>,
    active: &BTreeMap<i64, DateTime<Utc>>,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let (ids, units): (Vec<i64>, Vec<i32>) = held
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(id, n)| (*id, *n))
        .unzip();
    let mut tx = pool.begin().await?;
    // One report at a time (two API replicas may each take one): the spans are
    // read and then written.
    sqlx::query!(
        "SELECT pg_advisory_xact_lock($1, $2)",
        REPORT_LOCK.0,
        REPORT_LOCK.1
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE booking_use u SET until = greatest(u.since, $3)
         WHERE u.kind = 'held' AND u.until IS NULL
           AND NOT EXISTS (SELECT 1 FROM unnest($1::bigint[], $2::integer[]) AS h(id, units)
                           WHERE h.id = u.booking_id AND h.units = u.units)",
        &ids,
        &units,
        now
    )
    .execute(&mut *tx)
    .await?;
    // A span closed as it opened (units changed twice at one instant) held nothing.
    sqlx::query!(
        "DELETE FROM booking_use WHERE kind = 'held' AND until = since AND since = $1",
        now
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO booking_use (booking_id, kind, units, since)
         SELECT h.id, 'held', h.units, $3 FROM unnest($1::bigint[], $2::integer[]) AS h(id, units)
         JOIN booking b ON b.id = h.id
         WHERE NOT EXISTS (SELECT 1 FROM booking_use u
                           WHERE u.booking_id = h.id AND u.kind = 'held' AND u.until IS NULL)
         ON CONFLICT DO NOTHING",
        &ids,
        &units,
        now
    )
    .execute(&mut *tx)
    .await?;
    let mut a_ids = Vec::with_capacity(active.len());
    let mut a_at = Vec::with_capacity(active.len());
    let mut a_units = Vec::with_capacity(active.len());
    for (id, at) in active {
        a_ids.push(*id);
        a_at.push((*at).min(now));
        a_units.push(held.get(id).copied().filter(|n| *n > 0).unwrap_or(1));
    }
    // `as _` on the intervals: sqlx's macros map an interval to their own PgInterval,
    // and chrono's TimeDelta (which encodes as one) is bound unchecked.
    let extended: Vec<i64> = sqlx::query_scalar!(
        "UPDATE booking_use u SET until = greatest(u.until, a.at + $4), units = greatest(u.units, a.units)
         FROM unnest($1::bigint[], $2::timestamptz[], $3::integer[]) AS a(id, at, units)
         WHERE u.booking_id = a.id AND u.kind = 'active' AND u.since <= a.at AND u.until >= a.at
         RETURNING u.booking_id",
        &a_ids,
        &a_at,
        &a_units,
        ACTIVITY_RESOLUTION as _
    )
    .fetch_all(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO booking_use (booking_id, kind, units, since, until)
         SELECT a.id, 'active', a.units, a.at, a.at + $4
         FROM unnest($1::bigint[], $2::timestamptz[], $3::integer[]) AS a(id, at, units)
         JOIN booking b ON b.id = a.id
         WHERE a.id <> ALL($5)
         ON CONFLICT (booking_id, kind, since) DO NOTHING",
        &a_ids,
        &a_at,
        &a_units,
        ACTIVITY_RESOLUTION as _,
        &extended
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Deletes spans that ended before `before` (the retention).
pub async fn prune(db: impl PgExecutor<'_>, before: DateTime<Utc>) -> sqlx::Result<u64> {
    Ok(
        sqlx::query!("DELETE FROM booking_use WHERE until < $1", before)
            .execute(db)
            .await?
            .rows_affected(),
    )
}

/// One booking's figures over a period.
#[derive(Debug, Clone, PartialEq)]
pub struct BookingUse {
    pub id: i64,
    pub user_name: String,
    pub model: String,
    pub units: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// GPU-hours booked within the period (the whole window, past or planned).
    pub booked_gpu_hours: f64,
    /// GPU-hours its pods held within the period, up to now.
    pub held_gpu_hours: f64,
    /// GPU-hours its pods' GPUs were active within the period, up to now.
    pub active_gpu_hours: f64,
    /// Whether a pod of it ever held a GPU (any time, not only in the period).
    pub ever_held: bool,
    /// The last GPU activity seen (start of the last observation).
    pub last_active: Option<DateTime<Utc>>,
}

/// The figures of every booking (not cancelled) whose window overlaps [from, to),
/// as of `now`, in id order.
pub async fn bookings(
    db: impl PgExecutor<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<BookingUse>> {
    // Used time is counted up to now only; an empty range past it.
    let past_end = to.min(now).max(from);
    // The computed columns are never null (`!`), except the last activity.
    sqlx::query_as!(
        BookingUse,
        r#"SELECT b.id, b.user_name, b.model, b.units, b.start_at, b.end_at,
                b.units * booking_use_hours(b.period * tstzrange($1, $2)) AS "booked_gpu_hours!",
                coalesce((SELECT sum(u.units * booking_use_hours(
                              tstzrange(u.since, greatest(u.since, coalesce(u.until, $4)))
                              * b.period * tstzrange($1, $3)))
                          FROM booking_use u WHERE u.booking_id = b.id AND u.kind = 'held'), 0)
                    AS "held_gpu_hours!",
                coalesce((SELECT sum(u.units * booking_use_hours(
                              tstzrange(u.since, u.until) * b.period * tstzrange($1, $3)))
                          FROM booking_use u WHERE u.booking_id = b.id AND u.kind = 'active'), 0)
                    AS "active_gpu_hours!",
                EXISTS (SELECT 1 FROM booking_use u WHERE u.booking_id = b.id AND u.kind = 'held')
                    AS "ever_held!",
                (SELECT max(u.until) - $5::interval FROM booking_use u
                 WHERE u.booking_id = b.id AND u.kind = 'active') AS last_active
         FROM booking b
         WHERE b.cancelled_at IS NULL AND b.period && tstzrange($1, $2)
         ORDER BY b.id"#,
        from,
        to,
        past_end,
        now,
        ACTIVITY_RESOLUTION as _
    )
    .fetch_all(db)
    .await
}

/// The group each of the bookings `ids` counts against (`booking.group_id`, set at
/// its creation to the group whose policy applied), by booking id; bookings of no
/// group are not in it.
pub async fn groups_of(
    db: impl PgExecutor<'_>,
    ids: &[i64],
) -> sqlx::Result<BTreeMap<i64, String>> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT b.id, g.name FROM booking b JOIN lab_group g ON g.id = b.group_id
         WHERE b.id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().collect())
}

/// A running booking with no GPU activity for a while.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleBooking {
    pub id: i64,
    pub user_name: String,
    pub model: String,
    pub units: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// The last GPU activity seen; `None`: none since it started.
    pub last_active: Option<DateTime<Utc>>,
    /// Since when it counts as idle: the last activity, or its start.
    pub idle_since: DateTime<Utc>,
}

/// The bookings running at `now` whose pods' GPUs have been idle (or that were not
/// used at all) for `idle_for` or longer, in id order.
pub async fn idle(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    idle_for: TimeDelta,
) -> sqlx::Result<Vec<IdleBooking>> {
    // `idle_since` (the later of the start and the last activity) is never null,
    // which sqlx cannot tell.
    sqlx::query_as!(
        IdleBooking,
        r#"SELECT i.id, i.user_name, i.model, i.units, i.start_at, i.end_at, i.last_active,
                  i.idle_since AS "idle_since!" FROM (
             SELECT b.id, b.user_name, b.model, b.units, b.start_at, b.end_at, a.last_active,
                    greatest(b.start_at, coalesce(a.last_active, b.start_at)) AS idle_since
             FROM booking b
             LEFT JOIN LATERAL (SELECT max(u.until) - $3::interval AS last_active FROM booking_use u
                                WHERE u.booking_id = b.id AND u.kind = 'active') a ON true
             WHERE b.cancelled_at IS NULL AND b.start_at <= $1 AND b.end_at > $1
               AND b.hold_id IS NULL -- a hold has no user to nudge
         ) i
         WHERE i.idle_since <= $1 - $2::interval
         ORDER BY i.id"#,
        now,
        idle_for as _,
        ACTIVITY_RESOLUTION as _
    )
    .fetch_all(db)
    .await
}
