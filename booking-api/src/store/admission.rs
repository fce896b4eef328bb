//! What the webhook's replica needs (`GET /api/v1/admission-state`): the per-model
//! figures and units held, and in a full read also the bookings that can matter to
//! an admission, the known users with their slugs, and the change stream's position
//! from which to follow, all from one snapshot.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::admission::replica::{BookingState, KnownUser, ModelState};
use gpu_booking_core::gpu_model::ModelName;
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

/// The full part of a read.
pub struct Full {
    pub position: i64,
    pub bookings: Vec<BookingState>,
    pub users: Vec<KnownUser>,
}

/// The figures of every model, in the service's order (models whose name the
/// webhook could not read are left out: it could not have read their answer either).
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
