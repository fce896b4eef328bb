//! The waitlist: entries held in order per model, and their promotion into bookings.
//!
//! Where the promotion runs: after the change that frees a unit has committed (a
//! cancellation, an early end, more units), in transactions of its own, and on a timer
//! as a backstop (server's sweep). Not inside the freeing change's transaction: that
//! one holds its own user's lock and then the model's, and booking for the waiting
//! users would take their locks after the model's, the reverse of the order every
//! create takes them in (`booking_lock`), so a create by a waiting user would deadlock
//! with it. No leader is needed either: every replica may run a pass, because a pass
//! holds the model's promotion lock for its whole transaction and an entry is booked
//! only `WHERE state = 'waiting'`, in the transaction that creates its booking.
//!
//! One pass ([`promote`]) is one transaction: the model's promotion lock (a key space
//! of its own, so nothing else waits on it), then the waiting users' locks in one
//! fixed order, then the model's row lock: the order of `booking_lock` for each of them.
//! Entries are then tried in the order they joined, each in a savepoint, so an earlier
//! entry always has the first choice of what is free; a later one is booked only with
//! what the earlier ones cannot use (backfill).

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use gpu_booking_core::waitlist::{self, Chance, Wish};
use gpu_booking_core::window::Window;
use serde::Serialize;
use serde_json::json;
use sqlx::{Connection, PgExecutor, PgPool, Postgres, Transaction};
use utoipa::ToSchema;

use super::audit;
use super::bookings::{self, NewBooking};
use super::error::{Conflict, Record, StoreError};

/// Entries looked at in one pass of a model: the queue is bounded by one waiting
/// entry per user and model anyway; this bounds a pass's transaction.
const PASS_LIMIT: i64 = 500;

/// The actor of the audit rows the promotion writes.
const ACTOR: &str = "waitlist";

#[derive(Debug, Clone)]
struct EntryRow {
    id: i64,
    user_name: String,
    model: String,
    not_before: DateTime<Utc>,
    latest_start: DateTime<Utc>,
    duration_s: i64,
    state: String,
    booking_id: Option<i64>,
    created_at: DateTime<Utc>,
    resolved_at: Option<DateTime<Utc>>,
    position: Option<i64>,
}

// The reads of `EntryRow` each name its columns (sqlx checks only a literal):
// `position` is 1 for the first waiting entry of a model, null for entries not waiting.

/// A waitlist entry as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Entry {
    pub id: i64,
    pub user: String,
    pub model: String,
    /// The booking may start at or after this time.
    pub not_before: DateTime<Utc>,
    /// ... and no later than this.
    pub latest_start: DateTime<Utc>,
    /// The booking's length, in seconds.
    pub duration_seconds: i64,
    /// `waiting`, `booked`, `cancelled` or `expired` (its latest start passed).
    #[schema(example = "waiting")]
    pub state: String,
    /// 1 for the first waiting entry of its model; absent once it is not waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<i64>,
    /// The booking it turned into.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub booking_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<DateTime<Utc>>,
}

impl EntryRow {
    fn view(self) -> Entry {
        Entry {
            id: self.id,
            user: self.user_name,
            model: self.model,
            not_before: self.not_before,
            latest_start: self.latest_start,
            duration_seconds: self.duration_s,
            state: self.state,
            position: self.position,
            booking_id: self.booking_id,
            created_at: self.created_at,
            resolved_at: self.resolved_at,
        }
    }

    fn wish(&self) -> Wish {
        Wish {
            not_before: self.not_before,
            latest_start: self.latest_start,
            duration: TimeDelta::seconds(self.duration_s),
        }
    }
}

/// A request to wait, after authentication.
pub struct NewEntry<'a> {
    pub user: &'a Username,
    pub model: &'a str,
    pub wish: Wish,
    pub created_by: &'a str,
}

/// Puts the user on the model's waitlist, then runs a pass: if a window fits now, the
/// entry comes back already booked (after the entries before it had their turn).
pub async fn join(
    pool: &PgPool,
    policy: &Policy,
    now: DateTime<Utc>,
    req: NewEntry<'_>,
) -> Result<Entry, StoreError> {
    waitlist::check_wish(policy, now, &req.wish)?;
    let mut tx = pool.begin().await?;
    let known: Option<String> =
        sqlx::query_scalar!("SELECT name FROM gpu_model WHERE name = $1", req.model)
            .fetch_optional(&mut *tx)
            .await?;
    if known.is_none() {
        return Err(StoreError::UnknownModel(req.model.to_owned()));
    }
    let id: i64 = sqlx::query_scalar!(
        "INSERT INTO waitlist_entry (user_name, model, not_before, latest_start, duration_s, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        req.user.as_str(),
        req.model,
        req.wish.not_before.max(now),
        req.wish.latest_start,
        req.wish.duration.num_seconds(),
        req.created_by,
        now
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(db) if db.constraint() == Some("waitlist_entry_one_waiting") => {
            StoreError::Conflict(Conflict::AlreadyWaiting {
                model: req.model.to_owned(),
            })
        }
        _ => e.into(),
    })?;
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor: req.created_by,
            action: "waitlist.join",
            subject: Some(req.model),
            user: Some(req.user.as_str()),
            booking_id: None,
            details: json!({
                "entry": id,
                "not_before": req.wish.not_before.max(now),
                "latest_start": req.wish.latest_start,
                "duration_seconds": req.wish.duration.num_seconds(),
            }),
        },
    )
    .await?;
    tx.commit().await?;
    // The entry stands whatever the pass does; a failed pass is retried by the sweep.
    after_freeing(pool, policy, now, req.model).await;
    get(pool, id)
        .await?
        .ok_or(StoreError::NotFound(Record::WaitlistEntry, id))
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<Entry>> {
    let row: Option<EntryRow> = sqlx::query_as!(
        EntryRow,
        "SELECT e.id, e.user_name, e.model, e.not_before, e.latest_start, e.duration_s,
                e.state, e.booking_id, e.created_at, e.resolved_at,
                CASE WHEN e.state = 'waiting' THEN (SELECT count(*) FROM waitlist_entry o
                     WHERE o.model = e.model AND o.state = 'waiting' AND o.id <= e.id) END AS position
         FROM waitlist_entry e WHERE e.id = $1",
        id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(EntryRow::view))
}

/// Entries of `user` (all users: `None`), of `model` if given, waiting ones first in
/// queue order, then the latest others; at most `limit`.
pub async fn list(
    db: impl PgExecutor<'_>,
    user: Option<&str>,
    model: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<Entry>> {
    let rows: Vec<EntryRow> = sqlx::query_as!(
        EntryRow,
        "SELECT e.id, e.user_name, e.model, e.not_before, e.latest_start, e.duration_s,
                e.state, e.booking_id, e.created_at, e.resolved_at,
                CASE WHEN e.state = 'waiting' THEN (SELECT count(*) FROM waitlist_entry o
                     WHERE o.model = e.model AND o.state = 'waiting' AND o.id <= e.id) END AS position
         FROM waitlist_entry e
         WHERE ($1::text IS NULL OR e.user_name = $1) AND ($2::text IS NULL OR e.model = $2)
         ORDER BY (e.state = 'waiting') DESC,
                  CASE WHEN e.state = 'waiting' THEN e.id END ASC,
                  e.id DESC
         LIMIT $3",
        user,
        model,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(EntryRow::view).collect())
}

/// Takes a waiting entry off the waitlist. Only waiting entries can be cancelled
/// (a booked one is cancelled as a booking). Nothing else changes: the entries
/// behind it were already booked with whatever it could not use.
pub async fn cancel(
    pool: &PgPool,
    id: i64,
    now: DateTime<Utc>,
    actor: &str,
) -> Result<Entry, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query!(
        "SELECT user_name, model, state FROM waitlist_entry WHERE id = $1 FOR UPDATE",
        id
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|e| (e.user_name, e.model, e.state));
    let (user, model, state) = row.ok_or(StoreError::NotFound(Record::WaitlistEntry, id))?;
    if state != "waiting" {
        return Err(StoreError::Conflict(
            Conflict::WaitlistEntryNotCancellable { id, state },
        ));
    }
    sqlx::query!(
        "UPDATE waitlist_entry SET state = 'cancelled', resolved_at = $2 WHERE id = $1",
        id,
        now
    )
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor,
            action: "waitlist.cancel",
            subject: Some(&model),
            user: Some(&user),
            booking_id: None,
            details: json!({ "entry": id }),
        },
    )
    .await?;
    tx.commit().await?;
    get(pool, id)
        .await?
        .ok_or(StoreError::NotFound(Record::WaitlistEntry, id))
}

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// (entry, booking) for each entry booked.
    pub booked: Vec<(i64, i64)>,
    pub expired: Vec<i64>,
}

/// One pass over the waiting entries of `model`: each that fits now is booked, each
/// whose latest start has passed expires. See the module's comment for the locks.
pub async fn promote(
    pool: &PgPool,
    policy: &Policy,
    now: DateTime<Utc>,
    model: &str,
) -> Result<Pass, StoreError> {
    let mut pass = Pass::default();
    // Most passes find nobody waiting: answer those without a lock.
    let waiting: bool = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM waitlist_entry WHERE model = $1 AND state = 'waiting') AS "waiting!""#,
        model
    )
    .fetch_one(pool)
    .await?;
    if !waiting {
        return Ok(pass);
    }
    let mut tx = pool.begin().await?;
    // The promotion lock, the waiting users' locks, the model's: one function, so
    // that each step reads what the previous holder of a lock committed (see
    // `booking_lock` in the migrations).
    // A function's columns may be null as far as sqlx can tell; these never are.
    let locked: Vec<(String, i32)> = sqlx::query!(
        r#"SELECT o_user AS "o_user!", o_units AS "o_units!" FROM waitlist_lock($1, $2)"#,
        model,
        PASS_LIMIT as i32
    )
    .map(|l| (l.o_user, l.o_units))
    .fetch_all(&mut *tx)
    .await?;
    let Some(units) = locked
        .first()
        .map(|(_, units)| u32::try_from(*units).unwrap_or(0))
    else {
        return Ok(pass);
    };
    let users: Vec<String> = locked.into_iter().map(|(user, _)| user).collect();
    // Users who joined after the locks were taken are not among them: their own
    // join runs a pass after this one.
    let entries: Vec<EntryRow> = sqlx::query_as!(
        EntryRow,
        "SELECT e.id, e.user_name, e.model, e.not_before, e.latest_start, e.duration_s,
                e.state, e.booking_id, e.created_at, e.resolved_at,
                CASE WHEN e.state = 'waiting' THEN (SELECT count(*) FROM waitlist_entry o
                     WHERE o.model = e.model AND o.state = 'waiting' AND o.id <= e.id) END AS position
         FROM waitlist_entry e
         WHERE e.model = $1 AND e.state = 'waiting' AND e.user_name = ANY($2)
         ORDER BY e.id LIMIT $3",
        model,
        &users,
        PASS_LIMIT
    )
    .fetch_all(&mut *tx)
    .await?;
    // The model's bookings, read once under its lock: only this pass changes them
    // until it commits, and it adds each booking it makes.
    let mut booked =
        super::models::booked_windows(&mut *tx, model, now, DateTime::<Utc>::MAX_UTC).await?;
    for entry in entries {
        let own = bookings::user_windows(&mut *tx, policy, now, &entry.user_name).await?;
        match waitlist::chance(policy, now, &entry.wish(), &own, units, &booked) {
            Chance::Waiting => {}
            Chance::Expired => {
                expire(&mut tx, &entry, now).await?;
                pass.expired.push(entry.id);
            }
            Chance::Fits(window) => {
                if let Some(booking) = book(&mut tx, policy, now, &entry, window).await? {
                    pass.booked.push((entry.id, booking));
                    booked.push(window);
                }
            }
        }
    }
    tx.commit().await.map_err(bookings::constraint_refusal)?;
    Ok(pass)
}

/// Books `entry` for `window` in a savepoint: a refusal by any rule of the create
/// (which checks them all again) leaves the entry waiting and the pass going.
async fn book(
    tx: &mut Transaction<'_, Postgres>,
    policy: &Policy,
    now: DateTime<Utc>,
    entry: &EntryRow,
    window: Window,
) -> Result<Option<i64>, StoreError> {
    let user = match Username::parse(&entry.user_name) {
        Ok(u) => u,
        Err(_) => return Ok(None),
    };
    let mut sp = tx.begin().await?;
    let created = bookings::create_in(
        &mut sp,
        policy,
        now,
        NewBooking {
            user: &user,
            model: &entry.model,
            // A waitlist entry asks for one GPU.
            units: 1,
            start: window.start(),
            end: window.end(),
            override_rules: false,
            created_by: ACTOR,
        },
    )
    .await;
    let row = match created {
        Ok(row) => row,
        Err(
            StoreError::Rule(_)
            | StoreError::Capacity(_)
            | StoreError::UnknownModel(_)
            | StoreError::Conflict(_),
        ) => {
            sp.rollback().await?;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // Exactly once: only a waiting entry turns into a booking.
    let updated = sqlx::query!(
        "UPDATE waitlist_entry SET state = 'booked', booking_id = $2, resolved_at = $3
         WHERE id = $1 AND state = 'waiting'",
        entry.id,
        row.id,
        now
    )
    .execute(&mut *sp)
    .await?;
    if updated.rows_affected() != 1 {
        sp.rollback().await?;
        return Ok(None);
    }
    notify(
        &mut sp,
        Notice::Booked {
            entry: entry.id,
            booking: row.id,
            user: &entry.user_name,
            model: &entry.model,
            window,
        },
        now,
    )
    .await?;
    sp.commit().await?;
    Ok(Some(row.id))
}

async fn expire(
    tx: &mut Transaction<'_, Postgres>,
    entry: &EntryRow,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE waitlist_entry SET state = 'expired', resolved_at = $2 WHERE id = $1 AND state = 'waiting'",
        entry.id,
        now
    )
    .execute(&mut **tx)
    .await?;
    notify(
        tx,
        Notice::Expired {
            entry: entry.id,
            user: &entry.user_name,
            model: &entry.model,
            latest_start: entry.latest_start,
        },
        now,
    )
    .await
}

/// What the waitlist tells its users.
#[derive(Debug, Clone, Copy)]
pub enum Notice<'a> {
    /// The entry turned into this booking.
    Booked {
        entry: i64,
        booking: i64,
        user: &'a str,
        model: &'a str,
        window: Window,
    },
    /// Nothing fitted before its latest start.
    Expired {
        entry: i64,
        user: &'a str,
        model: &'a str,
        latest_start: DateTime<Utc>,
    },
}

/// The one place the waitlist tells a user something: an audit row `waitlist.booked`
/// or `waitlist.expired`, in the transaction of the change, so it is written exactly
/// when the change commits. Notices by e-mail or webhook hook in here (an outbox row
/// written beside the audit row keeps the same once-only guarantee).
pub async fn notify(
    tx: &mut Transaction<'_, Postgres>,
    notice: Notice<'_>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let (action, user, model, booking_id, details) = match notice {
        Notice::Booked {
            entry,
            booking,
            user,
            model,
            window,
        } => (
            "waitlist.booked",
            user,
            model,
            Some(booking),
            json!({ "entry": entry, "start": window.start(), "end": window.end() }),
        ),
        Notice::Expired {
            entry,
            user,
            model,
            latest_start,
        } => (
            "waitlist.expired",
            user,
            model,
            None,
            json!({ "entry": entry, "latest_start": latest_start }),
        ),
    };
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor: ACTOR,
            action,
            subject: Some(model),
            user: Some(user),
            booking_id,
            details,
        },
    )
    .await?;
    Ok(())
}

/// A pass over every model with someone waiting.
pub async fn promote_all(
    pool: &PgPool,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Result<Pass, StoreError> {
    let models: Vec<String> = sqlx::query_scalar!(
        "SELECT DISTINCT model FROM waitlist_entry WHERE state = 'waiting' ORDER BY model"
    )
    .fetch_all(pool)
    .await?;
    let mut all = Pass::default();
    for model in models {
        let pass = promote(pool, policy, now, &model).await?;
        all.booked.extend(pass.booked);
        all.expired.extend(pass.expired);
    }
    Ok(all)
}

/// A pass over `model` after a change that may have freed a unit of it, once that
/// change has committed. Its failure does not undo the change: it is logged, and the
/// sweep serves the entry later.
pub async fn after_freeing(pool: &PgPool, policy: &Policy, now: DateTime<Utc>, model: &str) {
    if let Err(e) = promote(pool, policy, now, model).await {
        tracing::warn!(error = %e, model, "waitlist pass failed; the sweep will retry");
    }
}
