//! Holds: maintenance windows and course reservations (`core::holds`), kept as
//! booking rows of a user of each hold's own (migration 20261213000200), so that
//! capacity, the slot planner and the constraints count them as bookings.
//!
//! A hold is written under its model's lock exclusive, like a create that moves
//! planned bookings: its rows' units are placed by `core::holds::place` among the
//! model's bookings read under that lock, planned bookings moved where that makes
//! room, and the slot constraint checks the result at commit.

use std::collections::BTreeSet;

use chrono::{DateTime, NaiveDateTime, Utc};
use gpu_booking_core::capacity::CapacityRefusal;
use gpu_booking_core::holds::{self, Existing, HoldKind, HoldRef, HoldSeen};
use gpu_booking_core::rules::{rfc3339, Refusal, RuleCode};
use gpu_booking_core::window::Window;
use serde_json::json;
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};

use super::audit;
use super::bookings::constraint_refusal;
use super::error::StoreError;

/// A hold as stored.
#[derive(Debug, Clone)]
pub struct HoldRow {
    pub id: i64,
    pub kind: String,
    pub model: String,
    pub units: i32,
    pub title: String,
    pub group_id: Option<i32>,
    pub rrule: Option<String>,
    pub time_zone: Option<String>,
    pub local_start: Option<NaiveDateTime>,
    pub local_end: Option<NaiveDateTime>,
    pub skipped: Vec<DateTime<Utc>>,
    pub user_name: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
}

impl HoldRow {
    pub fn kind(&self) -> Option<HoldKind> {
        HoldKind::parse(&self.kind)
    }
}

/// One of a hold's rows: the maintenance window, or one occurrence of a course.
#[derive(Debug, Clone)]
pub struct OccurrenceRow {
    pub booking_id: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub slots: Vec<i32>,
}

/// A booking (or another hold's row) in the way of a new maintenance window.
#[derive(Debug, Clone)]
pub struct InTheWayRow {
    pub id: i64,
    pub user_name: String,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub units: i32,
    pub hold_id: Option<i64>,
}

/// A hold to write.
pub struct NewHold<'a> {
    pub kind: HoldKind,
    pub model: &'a str,
    /// Units held by each row; `None`: every unit of the model (at most 64).
    pub units: Option<u32>,
    pub title: &'a str,
    pub group_id: Option<i32>,
    /// The rows' windows, in order, none overlapping another.
    pub windows: Vec<Window>,
    /// A course's schedule as given (stored with it).
    pub schedule: Option<&'a gpu_booking_core::recurrence::Schedule>,
    /// Windows left out before placing (in the past, or skipped by the creator).
    pub skipped: Vec<DateTime<Utc>>,
    /// Occurrences that do not fit are left out instead of refusing the whole.
    pub skip_conflicts: bool,
    pub actor: &'a str,
}

/// What writing a hold came to.
pub enum Made {
    Created(Box<HoldRow>, Vec<OccurrenceRow>),
    /// Bookings hold units the window needs: nothing was written.
    InTheWay(Vec<InTheWayRow>),
}

/// The model's lock exclusive (the key of migration 20261125000200) and its units:
/// nothing else changes the model's bookings until the transaction ends.
async fn lock_model(tx: &mut Transaction<'_, Postgres>, model: &str) -> sqlx::Result<Option<i32>> {
    sqlx::query!("SELECT pg_advisory_xact_lock(7264, hashtext($1))", model)
        .execute(&mut **tx)
        .await?;
    sqlx::query_scalar!("SELECT units FROM gpu_model WHERE name = $1", model)
        .fetch_optional(&mut **tx)
        .await
}

/// The units a hold of `asked` takes of a model of `model_units`: all of them (at
/// most 64, what one row holds) when not given.
fn units_to_hold(asked: Option<u32>, model_units: i32) -> Result<u32, StoreError> {
    let have = u32::try_from(model_units).unwrap_or(0);
    let need = asked.unwrap_or(have.min(64));
    if need == 0 || need > have || need > 64 {
        return Err(Refusal::new(
            RuleCode::InvalidUnits,
            format!(
                "A hold takes 1 to {} units of this model (it has {have}; at most 64 at once).",
                have.min(64)
            ),
        )
        .into());
    }
    Ok(need)
}

/// The model's rows (not cancelled, not over at `now`) over `window`.
async fn rows_over(
    db: impl PgExecutor<'_>,
    model: &str,
    window: &Window,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<InTheWayRow>> {
    sqlx::query_as!(
        InTheWayRow,
        "SELECT id, user_name, start_at, end_at, units, hold_id FROM booking
         WHERE model = $1 AND cancelled_at IS NULL AND end_at > $4
           AND period && tstzrange($2, $3, '[)')
         ORDER BY start_at, id",
        model,
        window.start(),
        window.end(),
        now
    )
    .fetch_all(db)
    .await
}

/// The model's rows over `window` that a hold of `need` units leaves without room
/// (`core::holds::in_the_way`), read under the model's lock, which the caller's
/// transaction holds.
async fn in_the_way_locked(
    tx: &mut Transaction<'_, Postgres>,
    model: &str,
    model_units: i32,
    window: &Window,
    need: u32,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<InTheWayRow>> {
    let rows = rows_over(&mut **tx, model, window, now).await?;
    let existing: Vec<Existing> = rows
        .iter()
        .filter_map(|r| {
            Some(Existing {
                id: r.id,
                window: Window::new(r.start_at, r.end_at).ok()?,
                units: u32::try_from(r.units).ok()?,
            })
        })
        .collect();
    let ids = holds::in_the_way(
        u32::try_from(model_units).unwrap_or(0),
        &existing,
        window,
        need,
    );
    Ok(rows.into_iter().filter(|r| ids.contains(&r.id)).collect())
}

/// The model's lock exclusive and its units, and the units a hold asking for
/// `units` takes.
async fn lock_for_hold(
    tx: &mut Transaction<'_, Postgres>,
    model: &str,
    units: Option<u32>,
) -> Result<(i32, u32), StoreError> {
    let model_units = lock_model(tx, model)
        .await?
        .ok_or_else(|| StoreError::UnknownModel(model.to_owned()))?;
    Ok((model_units, units_to_hold(units, model_units)?))
}

/// The bookings a maintenance window would leave without room, without writing
/// anything.
pub async fn in_the_way(
    pool: &PgPool,
    model: &str,
    window: &Window,
    units: Option<u32>,
    now: DateTime<Utc>,
) -> Result<Vec<InTheWayRow>, StoreError> {
    let mut tx = pool.begin().await?;
    let (model_units, need) = lock_for_hold(&mut tx, model, units).await?;
    let rows = in_the_way_locked(&mut tx, model, model_units, window, need, now).await?;
    tx.rollback().await?;
    Ok(rows)
}

/// A change that rows of a model can be in the way of.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// A maintenance window of `units` (`None`: all of the model's) over `window`.
    Window {
        window: &'a Window,
        units: Option<u32>,
    },
    /// The model going down to this many units from now
    /// (`store::models::bookings_beyond`).
    Units(i32),
}

/// The rows in the way of `change`, read under the model's lock exclusive (taken
/// here; re-entrant).
async fn in_the_way_of(
    tx: &mut Transaction<'_, Postgres>,
    model: &str,
    change: Change<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<InTheWayRow>, StoreError> {
    match change {
        Change::Window { window, units } => {
            let (model_units, need) = lock_for_hold(tx, model, units).await?;
            Ok(in_the_way_locked(tx, model, model_units, window, need, now).await?)
        }
        Change::Units(units) => {
            let beyond = super::models::bookings_beyond(tx, model, units, now).await?;
            let ids: Vec<i64> = beyond.iter().map(|b| b.id).collect();
            Ok(rows_by_ids(&mut **tx, &ids).await?)
        }
    }
}

/// How many times [`begin_resolving`] reads the rows in the way before it gives up
/// on rows of users it has not locked getting in the way.
const RESOLVE_TRIES: usize = 4;

/// Begins the transaction that resolves the rows in the way of `change` and then
/// makes the change, so that both commit or neither does. Its locks come in the
/// global order (groups by id, users by key, then models: migration
/// 20261213000100): the locks of the groups the rows count against, then of the
/// rows' users, then the model's lock exclusive, and the rows in the way are read
/// under them. Whose locks to take is known only from a read, so a read that finds
/// a row of a user or group not locked yet (booked meanwhile) starts again with
/// theirs too. The transaction and the rows in the way; `None` when rows of new
/// users kept getting in the way: nothing was changed.
pub async fn begin_resolving(
    pool: &PgPool,
    model: &str,
    change: Change<'_>,
    now: DateTime<Utc>,
) -> Result<Option<(Transaction<'static, Postgres>, Vec<InTheWayRow>)>, StoreError> {
    let mut users: BTreeSet<String> = BTreeSet::new();
    let mut groups: BTreeSet<i32> = BTreeSet::new();
    for _ in 0..RESOLVE_TRIES {
        let mut tx = pool.begin().await?;
        for g in &groups {
            super::groups::lock(&mut tx, *g).await?;
        }
        let ordered: Vec<String> =
            sqlx::query_scalar("SELECT u FROM unnest($1::text[]) AS u ORDER BY hashtext(u), u")
                .bind(users.iter().cloned().collect::<Vec<_>>())
                .fetch_all(&mut *tx)
                .await?;
        for user in &ordered {
            // The user's lock of `booking_lock` (migration 20261125000200).
            sqlx::query("SELECT pg_advisory_xact_lock(7262, hashtext($1))")
                .bind(user)
                .execute(&mut *tx)
                .await?;
        }
        let rows = in_the_way_of(&mut tx, model, change, now).await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let owners: Vec<(String, Option<i32>)> =
            sqlx::query_as("SELECT user_name, group_id FROM booking WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await?;
        let mut all_locked = true;
        for (user, group) in owners {
            all_locked &= !users.insert(user);
            if let Some(g) = group {
                all_locked &= !groups.insert(g);
            }
        }
        if all_locked {
            return Ok(Some((tx, rows)));
        }
        tx.rollback().await?;
    }
    Ok(None)
}

/// Writes a hold: its user, its rows placed among the model's bookings, the moves of
/// planned bookings that makes room for them, and its audit row, in one transaction
/// under the model's lock. A maintenance window with bookings in its way writes
/// nothing and names them; a course occurrence that does not fit refuses the whole
/// (naming it, and the hold in its way if one is), or is left out with
/// `skip_conflicts`.
pub async fn create(
    pool: &PgPool,
    now: DateTime<Utc>,
    new: NewHold<'_>,
) -> Result<Made, StoreError> {
    let mut tx = pool.begin().await?;
    let made = create_in(&mut tx, now, new).await?;
    match made {
        Made::Created(..) => tx.commit().await.map_err(constraint_refusal)?,
        Made::InTheWay(_) => tx.rollback().await?,
    }
    Ok(made)
}

/// [`create`] inside the caller's transaction, which commits it (the slot
/// constraints are checked at that commit): a confirmed maintenance window resolves
/// the bookings in its way and writes itself in one transaction. `Made::InTheWay`
/// wrote nothing and leaves the transaction usable.
pub async fn create_in(
    tx: &mut Transaction<'_, Postgres>,
    now: DateTime<Utc>,
    new: NewHold<'_>,
) -> Result<Made, StoreError> {
    let (Some(first), Some(last)) = (new.windows.first(), new.windows.last()) else {
        return Err(
            Refusal::new(RuleCode::InvalidWindow, "The hold has no window to hold.").into(),
        );
    };
    let span = Window::new(first.start(), last.end().max(first.end())).map_err(|_| {
        Refusal::new(
            RuleCode::InvalidWindow,
            "The hold's windows are out of order.",
        )
    })?;
    let (model_units, need) = lock_for_hold(tx, new.model, new.units).await?;
    let units = u32::try_from(model_units).unwrap_or(0);
    if new.kind == HoldKind::Maintenance {
        let in_the_way = in_the_way_locked(tx, new.model, model_units, &span, need, now).await?;
        if !in_the_way.is_empty() {
            return Ok(Made::InTheWay(in_the_way));
        }
    }
    let keep_from = now.min(first.start());
    let held =
        crate::store::bookings::held(&mut **tx, new.model, keep_from, DateTime::<Utc>::MAX_UTC)
            .await?;
    let placement = match holds::place(
        new.model,
        units,
        now,
        &held,
        &new.windows,
        need,
        new.skip_conflicts,
    ) {
        Ok(p) => p,
        Err(unplaced) => {
            let w = new.windows[unplaced.index];
            let seen = holds_over(&mut **tx, new.model, &w).await?;
            let named = holds::named_refusal(unplaced.refusal, &seen);
            let message = format!(
                "Occurrence {} ({} to {}) does not fit: {}",
                unplaced.index + 1,
                rfc3339(w.start()),
                rfc3339(w.end()),
                named.message
            );
            return Err(Refusal { message, ..named }.into());
        }
    };
    let mut skipped = new.skipped.clone();
    skipped.extend(placement.skipped.iter().map(|i| new.windows[*i].start()));
    skipped.sort_unstable();
    let schedule = new.schedule;
    let hold_id: i64 = sqlx::query_scalar!(
        "INSERT INTO unit_hold (kind, model, units, title, group_id, rrule, time_zone, local_start, local_end,
                                skipped, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
        new.kind.as_str(),
        new.model,
        need as i32,
        new.title,
        new.group_id,
        schedule.map(|s| s.rule.clone()),
        schedule.map(|s| s.zone.name().to_owned()),
        schedule.map(|s| s.local_start),
        schedule.map(|s| s.local_end),
        &skipped,
        new.actor,
        now
    )
    .fetch_one(&mut **tx)
    .await?;
    let user = HoldRef {
        kind: new.kind,
        id: hold_id,
        group: new.group_id.map(i64::from),
    }
    .user_name();
    // Its slugs are its name: no slug holds a space, so no label finds it.
    sqlx::query!(
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ($1, $1, $1)",
        &user
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "UPDATE unit_hold SET user_name = $2 WHERE id = $1",
        hold_id,
        &user
    )
    .execute(&mut **tx)
    .await?;
    if !placement.moves.is_empty() {
        sqlx::query!("SET CONSTRAINTS booking_slot_excl, booking_archived_excl DEFERRED")
            .execute(&mut **tx)
            .await?;
        for (id, slots) in &placement.moves {
            sqlx::query!("UPDATE booking SET slots = $2 WHERE id = $1", id, slots)
                .execute(&mut **tx)
                .await?;
        }
    }
    let (mut starts, mut ends, mut from, mut to, mut slots) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (i, s) in &placement.placed {
        starts.push(new.windows[*i].start());
        ends.push(new.windows[*i].end());
        from.push(slots.len() as i32 + 1);
        slots.extend_from_slice(s);
        to.push(slots.len() as i32);
    }
    let occurrences: Vec<OccurrenceRow> = sqlx::query_as!(
        OccurrenceRow,
        r#"INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, override,
                              created_by, created_at, updated_at, hold_id)
         SELECT $1, $2, ($5::integer[])[f:t], $3, s, e, e, true, $8, $9, $9, $10
         FROM unnest($4::timestamptz[], $6::timestamptz[], $7::integer[], $11::integer[]) AS r(s, e, f, t)
         RETURNING id AS booking_id, start_at, end_at, cancelled_at, slots"#,
        &user,
        new.model,
        need as i32,
        &starts,
        &slots,
        &ends,
        &from,
        new.actor,
        now,
        hold_id,
        &to
    )
    .fetch_all(&mut **tx)
    .await
    .map_err(constraint_refusal)?;
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor: new.actor,
            action: match new.kind {
                HoldKind::Maintenance => "maintenance.create",
                HoldKind::Course => "reservation.create",
            },
            subject: Some(new.model),
            user: None,
            booking_id: None,
            details: json!({
                "hold": hold_id,
                "title": new.title,
                "units": need,
                "group_id": new.group_id,
                "rows": occurrences.len(),
                "skipped": skipped,
                "moved": placement.moves.len(),
                "start": first.start(),
                "end": last.end(),
            }),
        },
    )
    .await?;
    let hold = get_in(&mut **tx, hold_id)
        .await?
        .ok_or(StoreError::Database(sqlx::Error::RowNotFound))?;
    Ok(Made::Created(Box::new(hold), occurrences))
}

async fn get_in(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<HoldRow>> {
    sqlx::query_as!(
        HoldRow,
        "SELECT id, kind, model, units, title, group_id, rrule, time_zone, local_start, local_end, skipped,
                user_name, created_by, created_at, removed_at
         FROM unit_hold WHERE id = $1",
        id
    )
    .fetch_optional(db)
    .await
}

/// A hold of `kind` (removed ones too).
pub async fn get(pool: &PgPool, kind: HoldKind, id: i64) -> sqlx::Result<Option<HoldRow>> {
    Ok(get_in(pool, id).await?.filter(|h| h.kind() == Some(kind)))
}

/// The holds of `kind` not removed whose rows end after `from`, by first start.
pub async fn list(
    pool: &PgPool,
    kind: HoldKind,
    from: DateTime<Utc>,
) -> sqlx::Result<Vec<HoldRow>> {
    sqlx::query_as!(
        HoldRow,
        "SELECT h.id, h.kind, h.model, h.units, h.title, h.group_id, h.rrule, h.time_zone, h.local_start,
                h.local_end, h.skipped, h.user_name, h.created_by, h.created_at, h.removed_at
         FROM unit_hold h
         WHERE h.kind = $1 AND h.removed_at IS NULL
           AND EXISTS (SELECT 1 FROM booking b WHERE b.hold_id = h.id AND b.end_at > $2)
         ORDER BY (SELECT min(b.start_at) FROM booking b WHERE b.hold_id = h.id), h.id",
        kind.as_str(),
        from
    )
    .fetch_all(pool)
    .await
}

/// A hold's rows, cancelled ones too, in order.
pub async fn occurrences(
    db: impl PgExecutor<'_>,
    hold_id: i64,
) -> sqlx::Result<Vec<OccurrenceRow>> {
    sqlx::query_as!(
        OccurrenceRow,
        "SELECT id AS booking_id, start_at, end_at, cancelled_at, slots FROM booking
         WHERE hold_id = $1 ORDER BY start_at, id",
        hold_id
    )
    .fetch_all(db)
    .await
}

/// The holds' rows (not cancelled) of `model` over `window`, as a refusal names them.
pub async fn holds_over(
    db: impl PgExecutor<'_>,
    model: &str,
    window: &Window,
) -> sqlx::Result<Vec<HoldSeen>> {
    let rows = sqlx::query!(
        "SELECT h.id, h.kind, h.title, b.start_at, b.end_at, b.units FROM booking b
         JOIN unit_hold h ON h.id = b.hold_id
         WHERE b.model = $1 AND b.cancelled_at IS NULL AND b.hold_id IS NOT NULL
           AND b.period && tstzrange($2, $3, '[)')
         ORDER BY b.start_at, h.id",
        model,
        window.start(),
        window.end()
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            Some(HoldSeen {
                id: r.id,
                kind: HoldKind::parse(&r.kind)?,
                title: r.title,
                window: Window::new(r.start_at, r.end_at).ok()?,
                units: u32::try_from(r.units).ok()?,
            })
        })
        .collect())
}

/// A capacity refusal worded to name the maintenance window or course occurrence
/// that takes the units, where one overlaps the refused window
/// (`core::holds::named_refusal`); every other error as it is. For the create and
/// change paths of `store::bookings`, which refuse for capacity without knowing of
/// holds.
pub async fn name_refusal(db: impl PgExecutor<'_>, e: StoreError) -> StoreError {
    let StoreError::Capacity(refused) = e else {
        return e;
    };
    let (model, window) = match &refused {
        CapacityRefusal::Full { model, window, .. } => (model.clone(), *window),
        _ => return StoreError::Capacity(refused),
    };
    match holds_over(db, &model, &window).await {
        Ok(seen) if !seen.is_empty() => holds::named_refusal(refused, &seen).into(),
        // A refusal without a hold's name is still right.
        _ => StoreError::Capacity(refused),
    }
}

/// Removes a hold in one transaction ([`remove_in`]): the hold's model, `None`
/// when there is no such hold of `kind`.
pub async fn remove(
    pool: &PgPool,
    kind: HoldKind,
    id: i64,
    now: DateTime<Utc>,
    actor: &str,
) -> Result<Option<String>, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(model) = remove_in(&mut tx, kind, id, now, actor).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    tx.commit().await?;
    Ok(Some(model))
}

/// Marks a hold removed and cancels or ends each of its rows not yet over
/// (`store::bookings::cancel_or_end_in`: one to come is cancelled, one that runs
/// ends now), audited as before one by one, in the caller's transaction, which
/// commits it: a failure part way leaves the hold and every row as they were. The
/// locks come first and in the global order (users, then models: migration
/// 20261213000100), as a create's and [`begin_resolving`]'s: the hold's user's,
/// then its model's shared (`booking_lock_release`: removing only frees units),
/// which each row's cancel takes again. The hold's model; `None` when there is no
/// such hold of `kind` (nothing written).
pub async fn remove_in(
    tx: &mut Transaction<'_, Postgres>,
    kind: HoldKind,
    id: i64,
    now: DateTime<Utc>,
    actor: &str,
) -> Result<Option<String>, StoreError> {
    let Some(found) = get_in(&mut **tx, id)
        .await?
        .filter(|h| h.kind() == Some(kind))
    else {
        return Ok(None);
    };
    let owner = found.user_name.clone().unwrap_or_else(|| {
        HoldRef {
            kind,
            id,
            group: found.group_id.map(i64::from),
        }
        .user_name()
    });
    sqlx::query("SELECT booking_lock_release($1, $2)")
        .bind(&owner)
        .bind(&found.model)
        .execute(&mut **tx)
        .await?;
    let Some(hold) = sqlx::query!(
        "UPDATE unit_hold SET removed_at = coalesce(removed_at, $3) WHERE id = $1 AND kind = $2
         RETURNING model, title",
        id,
        kind.as_str(),
        now
    )
    .fetch_optional(&mut **tx)
    .await?
    else {
        return Ok(None);
    };
    let rows: Vec<i64> = sqlx::query_scalar!(
        "SELECT id FROM booking WHERE hold_id = $1 AND cancelled_at IS NULL AND end_at > $2 ORDER BY start_at",
        id,
        now
    )
    .fetch_all(&mut **tx)
    .await?;
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor,
            action: match kind {
                HoldKind::Maintenance => "maintenance.remove",
                HoldKind::Course => "reservation.remove",
            },
            subject: Some(&hold.model),
            user: None,
            booking_id: None,
            details: json!({ "hold": id, "title": hold.title, "rows": rows.len() }),
        },
    )
    .await?;
    for row in rows {
        match super::bookings::cancel_or_end_in(tx, row, now, actor, None).await {
            // Over already: out of the way (the refusal wrote nothing).
            Ok(_) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(hold.model))
}

/// The group's id by its name.
pub async fn group_id(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!("SELECT id FROM lab_group WHERE name = $1", name)
        .fetch_optional(db)
        .await
}

/// The group's name by its id.
pub async fn group_name(db: impl PgExecutor<'_>, id: i32) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT name FROM lab_group WHERE id = $1", id)
        .fetch_optional(db)
        .await
}

/// Each hold's title and kind by id, for the model feeds.
pub async fn titles(
    db: impl PgExecutor<'_>,
    ids: &[i64],
) -> sqlx::Result<std::collections::HashMap<i64, (String, String)>> {
    let rows = sqlx::query!(
        "SELECT id, kind, title FROM unit_hold WHERE id = ANY($1)",
        ids
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, (r.kind, r.title)))
        .collect())
}

/// The rows of `ids` as a listing of what is in the way names them, in order.
pub async fn rows_by_ids(db: impl PgExecutor<'_>, ids: &[i64]) -> sqlx::Result<Vec<InTheWayRow>> {
    sqlx::query_as!(
        InTheWayRow,
        "SELECT id, user_name, start_at, end_at, units, hold_id FROM booking
         WHERE id = ANY($1) ORDER BY start_at, id",
        ids
    )
    .fetch_all(db)
    .await
}
