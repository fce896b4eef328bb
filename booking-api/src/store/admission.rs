//! What the webhook's replica needs (`GET /api/v1/admission-state`): the per-model
//! figures and units held, and in a full read also the bookings that can matter to
//! an admission, the known users with their slugs, and the change stream's position
//! from which to follow, all from one snapshot.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::admission::replica::{BookingState, KnownUser, ModelState};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::holds::{HoldKind, HoldRef, HoldRow};
use gpu_booking_core::wire::admission_state::{GroupMembers, MAX_COURSE_MEMBERS};
use gpu_booking_core::wire::Offer;
use sqlx::{PgConnection, PgPool};

use super::models;

/// A declared model as the replica keeps it and `/schedulability` answers it;
/// `None` for a name the webhook could not read (it could not have read an answer
/// that named it either).
pub fn model_state(m: &models::Model) -> Option<ModelState> {
    Some(ModelState {
        name: ModelName::parse(&m.name).ok()?,
        units: gpu_booking_core::wire::unit(m.units),
        free: gpu_booking_core::wire::count(m.free_now()),
        gpumem_mib: u64::try_from(m.gpumem_mib).ok()?,
        gpumem_advertised_mib: m
            .advertised_unit_mib()
            .and_then(|mib| u64::try_from(mib).ok()),
        usage_reported_at: m.usage_reported_at,
    })
}

/// The offers holding units at `now` (GPUs offered back, held for their users),
/// part of the figures.
pub async fn offers(db: &mut PgConnection, now: DateTime<Utc>) -> sqlx::Result<Vec<Offer>> {
    super::offers::list(&mut *db, None, Some(now)).await
}

/// The units each model's maintenance windows block at `now` (as the replica counts
/// them from the holds' booking rows it follows).
pub async fn maintenance_at(
    db: impl sqlx::PgExecutor<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<BTreeMap<String, u64>> {
    use sqlx::Row;
    let rows = sqlx::query(
        "SELECT user_name, model, units, start_at, end_at FROM booking
          WHERE cancelled_at IS NULL AND period @> $1::timestamptz
            AND start_at <= $1 AND end_at > $1 AND user_name LIKE ' maintenance %'",
    )
    .bind(now)
    .fetch_all(db)
    .await?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok((
                r.try_get::<String, _>("user_name")?,
                r.try_get::<String, _>("model")?,
                r.try_get::<i32, _>("units")?,
                r.try_get::<DateTime<Utc>, _>("start_at")?,
                r.try_get::<DateTime<Utc>, _>("end_at")?,
            ))
        })
        .collect::<sqlx::Result<Vec<_>>>()?;
    Ok(gpu_booking_core::holds::maintenance_at(
        rows.iter().map(|(user, model, units, start, end)| HoldRow {
            user,
            model,
            units: gpu_booking_core::wire::unit(*units),
            start: *start,
            end: *end,
        }),
        now,
    ))
}

/// The members of each group with a course occurrence running at `now` (at most
/// [`MAX_COURSE_MEMBERS`] in all), part of the figures: a membership change reaches
/// the replica with the next round. A group without members is listed with none, so
/// that a reader tells it from one the answer left out (read before its occurrence
/// started, or past the limit), which it reads again soon.
pub async fn course_members(
    db: &mut PgConnection,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<GroupMembers>> {
    use sqlx::Row;
    let users: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT user_name FROM booking
          WHERE cancelled_at IS NULL AND period @> $1::timestamptz
            AND start_at <= $1 AND end_at > $1 AND user_name LIKE ' course %'",
    )
    .bind(now)
    .fetch_all(&mut *db)
    .await?;
    let groups: BTreeSet<i32> = users
        .iter()
        .filter_map(|u| HoldRef::from_user(u)?.group)
        .filter_map(|g| i32::try_from(g).ok())
        .collect();
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let groups: Vec<i32> = groups.into_iter().collect();
    let rows = sqlx::query(
        "SELECT group_id, user_name FROM group_member WHERE group_id = ANY($1)
          ORDER BY group_id, user_name LIMIT $2",
    )
    .bind(&groups)
    .bind(MAX_COURSE_MEMBERS)
    .fetch_all(&mut *db)
    .await?;
    let mut members: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for row in &rows {
        let group = i64::from(row.try_get::<i32, _>("group_id")?);
        members
            .entry(group)
            .or_default()
            .push(row.try_get("user_name")?);
    }
    // Where the limit cut the rows short, the groups after the last one read are left
    // out, not listed as empty.
    let complete = i64::try_from(rows.len()).is_ok_and(|n| n < MAX_COURSE_MEMBERS);
    if complete {
        for g in &groups {
            members.entry(i64::from(*g)).or_default();
        }
    }
    Ok(members
        .into_iter()
        .map(|(group, members)| GroupMembers { group, members })
        .collect())
}

/// A course occurrence as a member's booking: (id, model, units, end).
pub type CourseBooking = (i64, String, i32, DateTime<Utc>);

/// The course occurrence running at `now` (the earliest started) of a group that
/// `user` (normalised) is a member of, as the replica finds it
/// (`core::admission::replica`).
pub async fn course_for(
    db: impl sqlx::PgExecutor<'_>,
    user: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<CourseBooking>> {
    use sqlx::Row;
    let rows = sqlx::query(
        "SELECT b.id, b.user_name, b.model, b.units, b.end_at, m.group_id FROM booking b
           JOIN group_member m ON b.user_name LIKE ' course % group ' || m.group_id::text
          WHERE m.user_name = $2 AND b.cancelled_at IS NULL AND b.period @> $1::timestamptz
            AND b.start_at <= $1 AND b.end_at > $1
          ORDER BY b.start_at, b.id",
    )
    .bind(now)
    .bind(user)
    .fetch_all(db)
    .await?;
    for row in rows {
        let name: String = row.try_get("user_name")?;
        let group = i64::from(row.try_get::<i32, _>("group_id")?);
        let course = HoldRef::from_user(&name)
            .is_some_and(|h| h.kind == HoldKind::Course && h.group == Some(group));
        if course {
            return Ok(Some((
                row.try_get("id")?,
                row.try_get("model")?,
                row.try_get("units")?,
                row.try_get("end_at")?,
            )));
        }
    }
    Ok(None)
}

/// The full part of a read.
pub struct Full {
    pub position: i64,
    pub bookings: Vec<BookingState>,
    pub users: Vec<KnownUser>,
}

/// The figures of every model, in the service's order (models whose name the
/// webhook could not read are left out: it could not have read their answer either),
/// and the units each booking's pods hold.
pub async fn figures(db: &mut PgConnection) -> sqlx::Result<(Vec<ModelState>, BTreeMap<i64, u64>)> {
    let models = models::list(&mut *db)
        .await?
        .iter()
        .filter_map(model_state)
        .collect();
    let held = sqlx::query!("SELECT booking_id, units FROM booking_held")
        .fetch_all(&mut *db)
        .await?;
    let held = held
        .into_iter()
        .map(|h| (h.booking_id, u64::try_from(h.units).unwrap_or(0)))
        .collect();
    Ok((models, held))
}

/// Everything, from one snapshot: the figures, and the bookings not cancelled that
/// end after `now` with each user's last ended one where it ended less than
/// `cooldown` ago, the users, and the position (as a listing of the change stream
/// gives it: every transaction below it is over and visible here).
///
/// An ended booking matters to an admission only through the cooldown after it
/// (`core::rules`), so one that ended `cooldown` or longer ago never will again.
/// Reading only the recent ones keeps this read to the bookings of the last
/// `cooldown` and the future: it read every ended booking of every user (a sort of
/// the whole history) before.
pub async fn full(
    pool: &PgPool,
    now: DateTime<Utc>,
    cooldown: TimeDelta,
) -> sqlx::Result<(Vec<ModelState>, BTreeMap<i64, u64>, Full)> {
    let elsewhere = super::changes::elsewhere(pool).await?;
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let below = sqlx::query_scalar!(
        r#"SELECT booking_change_settled_below($1) AS "below!""#,
        &elsewhere
    )
    .fetch_one(&mut *tx)
    .await?;
    let since = now
        .checked_sub_signed(cooldown.max(TimeDelta::zero()))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    // A union's columns may be null as far as sqlx can tell: each is a booking's
    // column, none of them null. Both parts search by period (an index's), not by
    // `end_at` alone, which no index serves.
    let rows = sqlx::query!(
        r#"(SELECT id AS "id!", user_name AS "user_name!", model AS "model!", units AS "units!",
                   start_at AS "start_at!", end_at AS "end_at!" FROM booking
           WHERE cancelled_at IS NULL AND period && tstzrange($1, NULL))
         UNION ALL
         (SELECT DISTINCT ON (user_name) id, user_name, model, units, start_at, end_at FROM booking
           WHERE cancelled_at IS NULL AND period && tstzrange($2, $1, '[]')
             AND end_at <= $1 AND end_at > $2
           ORDER BY user_name, end_at DESC, id DESC)"#,
        now,
        since
    )
    .fetch_all(&mut *tx)
    .await?;
    let bookings = rows
        .into_iter()
        .map(|b| BookingState {
            id: b.id,
            user: b.user_name,
            model: b.model,
            units: gpu_booking_core::wire::unit(b.units),
            start: b.start_at,
            end: b.end_at,
        })
        .collect();
    let users = sqlx::query_as!(
        KnownUser,
        "SELECT name, escape_slug, safe_slug FROM app_user"
    )
    .fetch_all(&mut *tx)
    .await?;
    let (models, held) = figures(&mut tx).await?;
    tx.commit().await?;
    Ok((
        models,
        held,
        Full {
            position: below - 1,
            bookings,
            users,
        },
    ))
}
