//! Bookings: the create transaction (rules under locks), cancel / end early, reads.

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::cancel::{self, CancelOutcome};
use gpu_booking_core::capacity::{self, CapacityRefusal, Held};
use gpu_booking_core::create_batch::{self, Create, Found, Judged};
use gpu_booking_core::precondition::{booking_etag, IfMatch};
use gpu_booking_core::rules;
use gpu_booking_core::username::Username;
use gpu_booking_core::window::{BookingStatus, Window};
use gpu_booking_core::wire::{self, Booking};
use serde_json::json;
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};

use gpu_booking_core::username::slugs;

use super::error::{Conflict, Record, StoreError};
use super::groups::{self as group_store, Group};
use super::{audit, lock_user_and_model};
use gpu_booking_core::groups;
use gpu_booking_core::quota::{self, Counted, PeriodKind, QuotaCheck, Term};
use gpu_booking_core::rules::{Refusal, RuleCode};
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BookingRow {
    pub id: i64,
    pub user_name: String,
    pub model: String,
    pub slot: i32,
    pub units: i32,
    pub slots: Vec<i32>,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub booked_end_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub ended_early_at: Option<DateTime<Utc>>,
    pub override_rules: bool,
    pub created_at: DateTime<Utc>,
}

pub(crate) const COLUMNS: &str =
    "id, user_name, model, slot, units, slots, start_at, end_at, booked_end_at, cancelled_at, \
                       ended_early_at, override AS override_rules, created_at";

impl BookingRow {
    pub fn window(&self) -> Option<Window> {
        Window::new(self.start_at, self.end_at).ok()
    }

    pub fn status(&self, now: DateTime<Utc>) -> BookingStatus {
        match self.window() {
            Some(w) => BookingStatus::at(now, &w, self.cancelled_at.is_some()),
            None => BookingStatus::Cancelled,
        }
    }

    pub fn view(&self, now: DateTime<Utc>) -> Booking {
        Booking {
            id: self.id,
            user: self.user_name.clone(),
            model: self.model.clone(),
            slot: wire::unit(self.slot),
            units: wire::unit(self.units),
            slots: self.slots.iter().copied().map(wire::unit).collect(),
            start: self.start_at,
            end: self.end_at,
            booked_end: self.booked_end_at,
            status: self.status(now),
            created_at: self.created_at,
            cancelled_at: self.cancelled_at,
            ended_early_at: self.ended_early_at,
            override_rules: self.override_rules,
            // Not the booking's: read beside it where users read bookings
            // (`routes::bookings::with_waiting`), never in the change stream.
            waiting: None,
        }
    }
}

/// A row of `booking_lock_and_read_batch` (migrations): for the batch's create
/// `o_req` (from 1), `m` with the model's units in `o_slot`, `u` a booking of the
/// user, `d` a day of the window (its units in `o_slot`, its slots in `o_slots`), `l`
/// a booking of the model over the window too long to be kept per day, `o` (for a
/// window that long itself) a booking of the model over the window (migration
/// 20261207000100), and (migration 20261213000100) `g` the group the create counts
/// against (its id in `o_id`). Every column of a function may be null as far as
/// sqlx can tell.
#[derive(sqlx::FromRow)]
struct LockedRead {
    o_req: Option<i32>,
    o_kind: Option<String>,
    o_id: Option<i64>,
    o_start: Option<DateTime<Utc>>,
    o_end: Option<DateTime<Utc>>,
    o_slot: Option<i32>,
    o_slots: Option<Vec<i32>>,
}

/// A booking request after authentication.
#[derive(Clone, Copy)]
pub struct NewBooking<'a> {
    pub user: &'a Username,
    pub model: &'a str,
    /// GPUs of the model (checked against the policy's maximum).
    pub units: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub override_rules: bool,
    pub created_by: &'a str,
}

/// Which of the model's locks a create holds (migration 20261125000200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The model's lock shared and the window's days: enough for every rule, and for
    /// taking free units; not for moving other bookings' units.
    Days,
    /// The model's lock exclusive: nothing else changes the model's bookings.
    Model,
}

/// Adds one row of `booking_lock_and_read_batch` to what its create found.
fn add_read(found: &mut Found, mut row: LockedRead) {
    let count = u32::try_from(row.o_slot.unwrap_or(0)).unwrap_or(0);
    match row.o_kind.take().as_deref() {
        Some("m") => found.units = Some(count),
        Some("d") => found.days.get_or_insert_default().add_day(
            row.o_id.unwrap_or_default(),
            count,
            row.o_slots.as_deref().unwrap_or_default(),
        ),
        Some("u") => found.own.extend(row.held().map(|h| h.window)),
        Some("l" | "o") => found.held.extend(row.held()),
        _ => {}
    }
}

impl LockedRead {
    /// The booking a `u`, `l` or `o` row names.
    fn held(self) -> Option<Held> {
        match (self.o_id, self.o_start, self.o_end, self.o_slots) {
            (Some(id), Some(s), Some(e), Some(slots)) => Window::new(s, e)
                .ok()
                .map(|window| Held { id, window, slots }),
            _ => None,
        }
    }
}

/// A create that passed the checks made before any lock (by the lab's policy, or
/// where only its user's group allows it, by the group's).
#[derive(Clone)]
struct Checked<'r, 'a> {
    now: DateTime<Utc>,
    req: &'r NewBooking<'a>,
    window: Window,
    need: u32,
}

/// A create's group as its locks read it: the group, its policy for the create's
/// model (`Err`: the group may not book it), and the quota check's inputs.
struct InGroup {
    id: i32,
    policy: Result<Policy, Refusal>,
}

/// The groups of a batch's creates (only read when one of its users is in a
/// group): their rows, the admin's terms where a quota counts terms, and each
/// group's counted bookings over what the batch's windows can meet.
struct BatchGroups {
    groups: BTreeMap<i32, Group>,
    terms: Vec<Term>,
    counted: BTreeMap<i32, Vec<Counted>>,
    /// The lab's time zone (quota months).
    zone: gpu_booking_core::notice_text::Tz,
}

/// The refusals that depend on the policy (a group's may accept what the lab's
/// refuses): only these make a create look for its user's group before any lock.
fn policy_refusal(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Rule(Refusal {
            code: RuleCode::DurationTooShort
                | RuleCode::DurationTooLong
                | RuleCode::TooFarAhead
                | RuleCode::InvalidUnits,
            ..
        })
    )
}

/// The group whose policy applies to `user` (the first of theirs in the admin's
/// order), if any.
async fn applying_group(db: &mut sqlx::PgConnection, user: &str) -> sqlx::Result<Option<Group>> {
    Ok(group_store::of_user(db, user)
        .await?
        .into_iter()
        .next()
        .map(|(g, _)| g))
}

/// `policy` for `req` as its user's group `group` has it (the lab's without one;
/// an admin's override books a model the group may not).
fn group_policy<'p>(
    lab: &'p Policy,
    group: Option<&Group>,
    req: &NewBooking<'_>,
) -> Result<Cow<'p, Policy>, Refusal> {
    match group {
        None => Ok(Cow::Borrowed(lab)),
        Some(g) => match groups::resolve(lab, Some((&g.row.name, &g.policy())), req.model) {
            Ok(p) => Ok(Cow::Owned(p)),
            Err(_) if req.override_rules => Ok(Cow::Borrowed(lab)),
            Err(e) => Err(e),
        },
    }
}

/// The checks made before any lock, for a create the lab's policy refused with
/// `refused`: by its user's group's policy, if the user is in a group (one read,
/// paid only by such refusals); else the refusal stands.
async fn check_in_group<'r, 'a>(
    pool: &PgPool,
    lab: &Policy,
    now: DateTime<Utc>,
    req: &'r NewBooking<'a>,
    refused: StoreError,
) -> Result<Checked<'r, 'a>, StoreError> {
    if !policy_refusal(&refused) {
        return Err(refused);
    }
    let mut conn = pool.acquire().await?;
    let Some(group) = applying_group(&mut conn, req.user.as_str()).await? else {
        return Err(refused);
    };
    let policy = group_policy(lab, Some(&group), req)?;
    check(&policy, now, req)
}

impl Checked<'_, '_> {
    /// The create as `core` judges it.
    fn create(&self) -> Create<'_> {
        Create {
            user: self.req.user.as_str(),
            model: self.req.model,
            now: self.now,
            window: self.window,
            need: self.need,
            override_rules: self.req.override_rules,
        }
    }
}

/// `core`'s judgement of `c`, an unknown model refused as the store refuses it.
fn judge(policy: &Policy, c: &Checked<'_, '_>, found: &Found) -> Result<Judged, StoreError> {
    match create_batch::judge(policy, &c.create(), found)? {
        Judged::UnknownModel => Err(StoreError::UnknownModel(c.req.model.to_owned())),
        judged => Ok(judged),
    }
}

/// What became of one create of a batch.
enum Outcome {
    Created(BookingRow),
    Refused(StoreError),
    /// Needs planned bookings moved, which its locks do not allow: it starts again
    /// under its model's lock exclusive.
    NeedsModelLock,
}

/// Creates a booking: every rule checked in one transaction under the user's lock
/// and the locks of the model's days that the window touches (docs/design.md, "The
/// booking store"; migration 20261125000200). The exclusion constraints only back this up.
/// A create that needs planned bookings moved to other units starts again under the
/// model's lock exclusive, since the moves reach beyond its days.
pub async fn create(
    pool: &PgPool,
    policy: &Policy,
    now: DateTime<Utc>,
    req: NewBooking<'_>,
) -> Result<BookingRow, StoreError> {
    create_many(pool, policy, &[(now, req)])
        .await
        .pop()
        .unwrap_or_else(|| Err(StoreError::Database(sqlx::Error::RowNotFound)))
}

/// Creates that arrived together (`crate::create_queue`), each with the time it
/// arrived: one transaction takes the locks of all of them (in the global order,
/// migration 20261130000100) and reads for each, `core` judges each alone in the
/// order given, counting the ones before it that it accepted, and one statement per
/// table writes the accepted ones. The answers are those of creating them one after
/// the other in that order. Should the batch's writing fail (a database refusal
/// that no rule foresaw, such as a user whose label keys another user holds), each
/// is created alone instead, so that one create's failure is its own.
pub async fn create_many(
    pool: &PgPool,
    policy: &Policy,
    reqs: &[(DateTime<Utc>, NewBooking<'_>)],
) -> Vec<Result<BookingRow, StoreError>> {
    let mut answers: Vec<Option<Result<BookingRow, StoreError>>> = Vec::new();
    let mut checked = Vec::new();
    for (i, (now, req)) in reqs.iter().enumerate() {
        answers.push(None);
        let c = match check(policy, *now, req) {
            Err(e) => check_in_group(pool, policy, *now, req, e).await,
            ok => ok,
        };
        match c {
            Ok(c) => checked.push((i, c)),
            Err(e) => answers[i] = Some(Err(e)),
        }
    }
    let batch: Vec<Checked<'_, '_>> = checked.iter().map(|(_, c)| c.clone()).collect();
    let outcomes = match in_one_transaction(pool, policy, &batch).await {
        Ok(outcomes) => outcomes,
        Err(e) if batch.len() <= 1 => vec![Outcome::Refused(constraint_refusal(e))],
        Err(e) => {
            tracing::info!(error = %e, creates = batch.len(), "a batch of creates failed; creating each alone");
            let mut alone = Vec::new();
            for c in &batch {
                alone.push(
                    match in_one_transaction(pool, policy, std::slice::from_ref(c)).await {
                        Ok(mut o) => o.pop().unwrap_or(Outcome::NeedsModelLock),
                        Err(e) => Outcome::Refused(constraint_refusal(e)),
                    },
                );
            }
            alone
        }
    };
    for ((i, c), outcome) in checked.iter().zip(outcomes) {
        answers[*i] = Some(match outcome {
            Outcome::Created(row) => Ok(row),
            Outcome::Refused(e) => Err(e),
            Outcome::NeedsModelLock => create_moving(pool, policy, c).await,
        });
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(StoreError::Database(sqlx::Error::RowNotFound))))
        .collect()
}

/// The checks made before any lock.
fn check<'r, 'a>(
    policy: &Policy,
    now: DateTime<Utc>,
    req: &'r NewBooking<'a>,
) -> Result<Checked<'r, 'a>, StoreError> {
    let window = rules::check_request(policy, now, req.start, req.end, req.override_rules)?;
    let need = rules::check_units(policy, req.units, req.override_rules)?;
    Ok(Checked {
        now,
        req,
        window,
        need,
    })
}

/// The batch in a transaction of its own, committed; an error of the database
/// (the transaction's, its writing's or its commit's) undoes all of it.
async fn in_one_transaction(
    pool: &PgPool,
    policy: &Policy,
    batch: &[Checked<'_, '_>],
) -> Result<Vec<Outcome>, sqlx::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    let outcomes = create_locked(&mut tx, policy, batch, Scope::Days).await?;
    tx.commit().await?;
    Ok(outcomes)
}

/// A create that needs other bookings moved: again, under its model's lock
/// exclusive.
async fn create_moving(
    pool: &PgPool,
    policy: &Policy,
    c: &Checked<'_, '_>,
) -> Result<BookingRow, StoreError> {
    let mut tx = pool.begin().await?;
    let row = create_in_locking(&mut tx, policy, c.now, *c.req, GroupLock::Wait).await?;
    tx.commit().await.map_err(constraint_refusal)?;
    Ok(row)
}

/// How [`create_in_locking`] takes its user's group's lock, which comes before
/// every other lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupLock {
    /// The transaction holds no lock yet: wait for it.
    Wait,
    /// The transaction holds others' locks (the waitlist's): take it only if it is
    /// free at once, else refuse (the entry waits for the next pass), so that no
    /// two transactions wait for each other.
    Try,
}

/// [`create`] inside the caller's transaction, which commits it: the waitlist books
/// an entry and marks it booked in one transaction, so that it happens once. It takes
/// the model's lock exclusive (a waitlist pass holds it already: locks are re-entrant),
/// so that it can move planned bookings where that makes room.
pub async fn create_in(
    tx: &mut Transaction<'_, Postgres>,
    policy: &Policy,
    now: DateTime<Utc>,
    req: NewBooking<'_>,
) -> Result<BookingRow, StoreError> {
    create_in_locking(tx, policy, now, req, GroupLock::Try).await
}

/// [`create_in`], taking the user's group's lock as `group_lock` says.
async fn create_in_locking(
    tx: &mut Transaction<'_, Postgres>,
    policy: &Policy,
    now: DateTime<Utc>,
    req: NewBooking<'_>,
    group_lock: GroupLock,
) -> Result<BookingRow, StoreError> {
    let group = applying_group(tx, req.user.as_str()).await?;
    if let Some(g) = &group {
        match group_lock {
            GroupLock::Wait => group_store::lock(tx, g.row.id).await?,
            GroupLock::Try => {
                let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
                    .bind(group_store::GROUP_LOCK_SPACE)
                    .bind(g.row.id)
                    .fetch_one(&mut **tx)
                    .await?;
                if !got {
                    return Err(Refusal::new(
                        RuleCode::QuotaUnits,
                        format!(
                            "Another booking of {} is being decided; try again.",
                            g.row.name
                        ),
                    )
                    .into());
                }
            }
        }
    }
    // Checked before any lock but the group's, as under the day locks.
    let own = group_policy(policy, group.as_ref(), &req)?;
    let c = check(&own, now, &req)?;
    lock_user_and_model(tx, req.user.as_str(), req.model).await?;
    match create_locked(tx, policy, std::slice::from_ref(&c), Scope::Model)
        .await
        .map_err(constraint_refusal)?
        .pop()
    {
        Some(Outcome::Created(row)) => Ok(row),
        Some(Outcome::Refused(e)) => Err(e),
        _ => Err(StoreError::Capacity(CapacityRefusal::NoUnitAssignable)),
    }
}

/// The batch's creates under `scope`'s locks (which it takes with its reads), in
/// order. A create that needs other bookings moved gets them moved under the model's
/// lock (`Scope::Model`, one create) or is answered `NeedsModelLock`.
async fn create_locked(
    tx: &mut Transaction<'_, Postgres>,
    policy: &Policy,
    batch: &[Checked<'_, '_>],
    scope: Scope,
) -> Result<Vec<Outcome>, sqlx::Error> {
    // The locks, then each create's reads: one round trip, so the model stays
    // locked for as little as possible.
    let users: Vec<&str> = batch.iter().map(|c| c.req.user.as_str()).collect();
    let models: Vec<&str> = batch.iter().map(|c| c.req.model).collect();
    let starts: Vec<DateTime<Utc>> = batch.iter().map(|c| c.window.start()).collect();
    let ends: Vec<DateTime<Utc>> = batch.iter().map(|c| c.window.end()).collect();
    // Each create reads only its user's bookings that can matter to its rules.
    let own_from: Vec<DateTime<Utc>> = batch
        .iter()
        .map(|c| rules::own_bookings_from(policy, c.now, c.window.start()))
        .collect();
    // With each create's group, whose lock comes first (migration 20261213000100).
    let rows: Vec<LockedRead> =
        sqlx::query_as("SELECT * FROM booking_lock_and_read_grouped($1, $2, $3, $4, $5)")
            .bind(&users)
            .bind(&models)
            .bind(&starts)
            .bind(&ends)
            .bind(&own_from)
            .fetch_all(&mut **tx)
            .await?;
    let mut found: Vec<Found> = batch.iter().map(|c| Found::for_window(&c.window)).collect();
    let mut group_of: Vec<Option<i32>> = vec![None; batch.len()];
    for row in rows {
        let i = row
            .o_req
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| i.checked_sub(1));
        if row.o_kind.as_deref() == Some("g") {
            if let Some(g) = i.and_then(|i| group_of.get_mut(i)) {
                *g = row.o_id.and_then(|id| i32::try_from(id).ok());
            }
            continue;
        }
        if let Some(f) = i.and_then(|i| found.get_mut(i)) {
            add_read(f, row);
        }
    }
    let creates: Vec<Create<'_>> = batch.iter().map(Checked::create).collect();
    // Users in no group pay nothing more from here on.
    let (batch_groups, in_group) = read_groups(tx, policy, batch, &group_of, &mut found).await?;
    // Per group, the batch's creates accepted so far (not written yet).
    let mut made_in_group: BTreeMap<i32, Vec<Counted>> = BTreeMap::new();
    // Creates an admin made past a quota: their refusal, for the audit.
    let mut past_quota: Vec<(usize, Refusal)> = Vec::new();

    // Each judged alone, in order, with the ones before it that it accepted counted
    // as bookings already made (`made`). A refusal for capacity names the earliest
    // start that would fit from the same bookings: those in the database and those
    // made before it.
    let mut made: Vec<(&str, Held)> = Vec::new();
    // Per create: its units, `None` if it needs other bookings moved; or its refusal.
    let mut verdicts: Vec<Result<Option<Vec<i32>>, StoreError>> = Vec::with_capacity(batch.len());
    for (i, c) in batch.iter().enumerate() {
        let units = found[i].units.unwrap_or(0);
        let group = in_group.get(i).and_then(Option::as_ref);
        let policy: &Policy = match group.map(|g| &g.policy) {
            None => policy,
            Some(Ok(p)) => p,
            Some(Err(refusal)) => {
                verdicts.push(Err(refusal.clone().into()));
                continue;
            }
        };
        let mut judged = match group {
            // The group's policy may refuse what the lab's accepted before the locks.
            Some(_) => check(policy, c.now, c.req).and_then(|_| judge(policy, c, &found[i])),
            None => judge(policy, c, &found[i]),
        };
        if let (Ok(_), Some(g)) = (&judged, group) {
            let mut counted = batch_groups.counted.get(&g.id).cloned().unwrap_or_default();
            counted.extend(made_in_group.get(&g.id).into_iter().flatten().copied());
            if let Some(Err(refusal)) = batch_groups.check(g.id, &counted, &c.window, c.need) {
                if c.req.override_rules {
                    past_quota.push((i, refusal));
                } else {
                    judged = Err(refusal.into());
                }
            }
        }
        if matches!(judged, Ok(Judged::ReadBookings)) {
            // Under the same locks: what the days bounded, exactly.
            let f = &mut found[i];
            f.held = held(&mut **tx, c.req.model, c.window.start(), c.window.end()).await?;
            f.days = None;
            judged = judge(policy, c, f);
        }
        let verdict = match judged {
            Ok(Judged::Slots(slots)) => Ok(Some(slots)),
            Ok(Judged::NeedsMoves) if scope == Scope::Model => {
                reassign_slots(tx, c.req.model, units, c.now, &c.window, c.need, None)
                    .await
                    .map(Some)
            }
            Ok(Judged::NeedsMoves) => Ok(None),
            // Read above: the bookings themselves always decide; an unknown model
            // was refused by `judge`.
            Ok(Judged::ReadBookings | Judged::UnknownModel) => {
                Err(CapacityRefusal::NoUnitAssignable.into())
            }
            Ok(Judged::Full) => {
                let before: Vec<&Held> = made
                    .iter()
                    .filter(|(model, _)| *model == c.req.model)
                    .map(|(_, h)| h)
                    .collect();
                let refusal =
                    capacity_refusal(tx, c.req.model, units, &c.window, c.need, &before).await?;
                Err(refusal.into())
            }
            Err(e) => Err(e),
        };
        if let Ok(Some(slots)) = &verdict {
            // As the database will hold it, which is what a create after it alone
            // would read.
            let pending = Held {
                // Not in the database yet: no id to collide with one that is.
                id: -1 - i as i64,
                window: stored(&c.window),
                slots: slots.clone(),
            };
            if let Some(g) = group {
                made_in_group.entry(g.id).or_default().push(Counted {
                    window: pending.window,
                    units: pending.units(),
                });
            }
            create_batch::accept(&creates, &mut found, i, &pending);
            made.push((c.req.model, pending));
        }
        verdicts.push(verdict);
    }

    let accepted: Vec<(&Checked<'_, '_>, &[i32], Option<i32>)> = batch
        .iter()
        .zip(&verdicts)
        .zip(&in_group)
        .filter_map(|((c, v), g)| match v {
            Ok(Some(slots)) => Some((c, slots.as_slice(), g.as_ref().map(|g| g.id))),
            _ => None,
        })
        .collect();
    let written = insert_created(tx, &accepted).await?;
    if written.len() != accepted.len() {
        return Err(sqlx::Error::RowNotFound);
    }
    // An admin's booking past a group's quota: audited with what it exceeded.
    for (i, refusal) in &past_quota {
        let Some(pos) = accepted
            .iter()
            .position(|(c, _, _)| std::ptr::eq(*c, &batch[*i]))
        else {
            continue;
        };
        let row = &written[pos];
        audit::record(
            &mut **tx,
            audit::NewEvent {
                at: batch[*i].now,
                actor: batch[*i].req.created_by,
                action: "booking.quota_override",
                subject: Some(&row.model),
                user: Some(&row.user_name),
                booking_id: Some(row.id),
                details: json!({ "rule": refusal.code.as_str(), "refusal": refusal.message }),
            },
        )
        .await?;
    }

    let mut written = written.into_iter();
    let mut outcomes = Vec::with_capacity(batch.len());
    for verdict in verdicts {
        outcomes.push(match verdict {
            Ok(Some(_)) => match written.next() {
                Some(row) => Outcome::Created(row),
                None => return Err(sqlx::Error::RowNotFound),
            },
            Ok(None) => Outcome::NeedsModelLock,
            Err(e) => Outcome::Refused(e),
        });
    }
    Ok(outcomes)
}

/// The groups of the batch's creates (`group_of`, from the locked read): each
/// group's rows, terms and counted bookings, and per create its group's policy for
/// its model. A group whose cooldown is longer than the lab's needs more of its
/// user's bookings than the locked read gave: they are read again here, under the
/// same locks. Nothing is read for a batch without a group.
async fn read_groups(
    tx: &mut Transaction<'_, Postgres>,
    lab: &Policy,
    batch: &[Checked<'_, '_>],
    group_of: &[Option<i32>],
    found: &mut [Found],
) -> sqlx::Result<(BatchGroups, Vec<Option<InGroup>>)> {
    let mut ids: Vec<i32> = group_of.iter().flatten().copied().collect();
    let mut bg = BatchGroups {
        groups: BTreeMap::new(),
        terms: Vec::new(),
        counted: BTreeMap::new(),
        zone: lab.zone,
    };
    if ids.is_empty() {
        return Ok((bg, group_of.iter().map(|_| None).collect()));
    }
    ids.sort_unstable();
    ids.dedup();
    bg.groups = group_store::by_ids(tx, &ids)
        .await?
        .into_iter()
        .map(|g| (g.row.id, g))
        .collect();
    if bg
        .groups
        .values()
        .any(|g| g.row.quota().gpu_hours.is_some() && g.row.quota().period == PeriodKind::Term)
    {
        bg.terms = group_store::terms(&mut **tx).await?;
    }
    let mut in_group = Vec::with_capacity(batch.len());
    // Per group, the window its creates' quota checks can meet.
    let mut spans: BTreeMap<i32, Window> = BTreeMap::new();
    for (i, (c, gid)) in batch.iter().zip(group_of).enumerate() {
        let Some(group) = gid.and_then(|id| bg.groups.get(&id)) else {
            in_group.push(None);
            continue;
        };
        let policy = group_policy(lab, Some(group), c.req).map(Cow::into_owned);
        if let Ok(p) = &policy {
            if p.cooldown > lab.cooldown {
                let from = rules::own_bookings_from(p, c.now, c.window.start());
                found[i].own = own_windows(&mut **tx, c.req.user.as_str(), from).await?;
            }
        }
        let quota = group.row.quota();
        if quota.limits() {
            let span = quota::read_window(&quota, lab.zone, &bg.terms, &c.window);
            spans
                .entry(group.row.id)
                .and_modify(|w| {
                    *w = Window::new(w.start().min(span.start()), w.end().max(span.end()))
                        .unwrap_or(*w)
                })
                .or_insert(span);
        }
        in_group.push(Some(InGroup {
            id: group.row.id,
            policy,
        }));
    }
    for (gid, span) in spans {
        let counted = group_store::counted(&mut **tx, gid, &span, None).await?;
        bg.counted.insert(gid, counted);
    }
    Ok((bg, in_group))
}

impl BatchGroups {
    /// The quota check of group `gid` for a booking of `need` units over `window`,
    /// against `counted`; `None` for a group without quotas.
    fn check(
        &self,
        gid: i32,
        counted: &[Counted],
        window: &Window,
        need: u32,
    ) -> Option<Result<(), Refusal>> {
        let group = self.groups.get(&gid)?;
        let quota = group.row.quota();
        if !quota.limits() {
            return None;
        }
        Some(quota::check(
            &QuotaCheck {
                group: &group.row.name,
                quota: &quota,
                zone: self.zone,
                terms: &self.terms,
                held: counted,
            },
            window,
            need,
        ))
    }
}

/// The user's (not cancelled) bookings' windows that end after `from`.
async fn own_windows(
    db: impl PgExecutor<'_>,
    user: &str,
    from: DateTime<Utc>,
) -> sqlx::Result<Vec<Window>> {
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT start_at, end_at FROM booking WHERE user_name = $1 AND cancelled_at IS NULL AND end_at > $2",
    )
    .bind(user)
    .bind(from)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(s, e)| Window::new(s, e).ok())
        .collect())
}

/// `window` as Postgres keeps it: in whole microseconds, cut as sqlx sends them
/// (the microseconds since 2000-01-01, toward zero).
fn stored(window: &Window) -> Window {
    let epoch = DateTime::<Utc>::from_timestamp(946_684_800, 0).unwrap_or_default();
    let cut = |t: DateTime<Utc>| {
        (t - epoch)
            .num_microseconds()
            .map(|us| epoch + TimeDelta::microseconds(us))
            .unwrap_or(t)
    };
    Window::new(cut(window.start()), cut(window.end())).unwrap_or(*window)
}

/// Writes the accepted creates: their users (for slug look-ups) with their label
/// keys, the bookings with their users' numbers (the key of the one-booking-at-a-time
/// constraint, migration 20261210000100: a user written here is not visible to the
/// statement's other parts, so a new user's number is its insert's RETURNING) and
/// their audit rows, in one statement; the bookings come back
/// in the order of `accepted` (a user's accepted creates never start at one instant:
/// their windows do not overlap), each with the group it counts against. A new
/// user's label keys
/// (name and both slugs) go with it; one that another user holds fails
/// `user_key_pkey` (migration 20261123000010): username_collision.
async fn insert_created(
    tx: &mut Transaction<'_, Postgres>,
    accepted: &[(&Checked<'_, '_>, &[i32], Option<i32>)],
) -> Result<Vec<BookingRow>, sqlx::Error> {
    if accepted.is_empty() {
        return Ok(Vec::new());
    }
    let mut users = Vec::new();
    let mut models = Vec::new();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    let mut overrides = Vec::new();
    let mut creators = Vec::new();
    let mut ats = Vec::new();
    let (mut slot_from, mut slot_to, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    let (mut escapes, mut safes) = (Vec::new(), Vec::new());
    let (mut keys, mut key_users) = (Vec::new(), Vec::new());
    let mut group_ids: Vec<Option<i32>> = Vec::new();
    for (c, unit_slots, group) in accepted {
        group_ids.push(*group);
        let user = c.req.user.as_str();
        if !users.contains(&user) {
            for key in c.req.user.lookup_keys() {
                keys.push(key);
                key_users.push(user);
            }
        }
        let user_slugs = slugs(user);
        users.push(user);
        escapes.push(user_slugs.escape);
        safes.push(user_slugs.safe);
        models.push(c.req.model);
        starts.push(c.window.start());
        ends.push(c.window.end());
        overrides.push(c.req.override_rules);
        creators.push(c.req.created_by);
        ats.push(c.now);
        // Postgres arrays of arrays are rectangular: one flat array, with each
        // booking's bounds in it (1-based, inclusive).
        slot_from.push(slots.len() as i32 + 1);
        slots.extend_from_slice(unit_slots);
        slot_to.push(slots.len() as i32);
    }
    sqlx::query_as::<_, BookingRow>(
        r#"WITH r AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::boolean[],
                                 $6::text[], $7::timestamptz[], $8::integer[], $9::integer[], $11::text[], $12::text[],
                                 $15::integer[])
                WITH ORDINALITY AS r(user_name, model, start_at, end_at, override, created_by, at, slot_from, slot_to,
                                     escape_slug, safe_slug, group_id, i)
         ), known AS (
            INSERT INTO app_user (name, escape_slug, safe_slug)
            SELECT DISTINCT ON (user_name) user_name, escape_slug, safe_slug FROM r ORDER BY user_name, i
            ON CONFLICT (name) DO NOTHING
            RETURNING name, id
         ), keys AS (
            INSERT INTO user_key (key, user_name)
            SELECT k.key, k.user_name FROM unnest($13::text[], $14::text[]) AS k(key, user_name)
            JOIN known ON known.name = k.user_name
         ), created AS (
            INSERT INTO booking (user_name, user_id, model, slots, units, start_at, end_at, booked_end_at, override, created_by,
                                 created_at, updated_at, group_id)
            SELECT r.user_name, COALESCE(known.id, (SELECT u.id FROM app_user u WHERE u.name = r.user_name)), model,
                   ($10::integer[])[slot_from:slot_to], slot_to - slot_from + 1, start_at, end_at, end_at,
                   override, created_by, at, at, r.group_id
            FROM r LEFT JOIN known ON known.name = r.user_name ORDER BY i
            RETURNING *
         ), audited AS (
            INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details)
            SELECT created_at, created_by,
                   CASE WHEN override THEN 'booking.create_override' ELSE 'booking.create' END,
                   model, user_name, id,
                   jsonb_build_object('start', start_at, 'end', end_at, 'slot', slot, 'units', units, 'slots', slots)
                   || CASE WHEN group_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('group_id', group_id) END
            FROM created
         )
         SELECT c.id, c.user_name, c.model, c.slot, c.units, c.slots, c.start_at, c.end_at,
                c.booked_end_at, c.cancelled_at, c.ended_early_at, c.override AS override_rules, c.created_at
         FROM created c JOIN r ON r.user_name = c.user_name AND r.start_at = c.start_at
         ORDER BY r.i"#,
    )
    .bind(&users)
    .bind(&models)
    .bind(&starts)
    .bind(&ends)
    .bind(&overrides)
    .bind(&creators)
    .bind(&ats)
    .bind(&slot_from)
    .bind(&slot_to)
    .bind(&slots)
    .bind(&escapes)
    .bind(&safes)
    .bind(&keys)
    .bind(&key_users)
    .bind(&group_ids)
    .fetch_all(&mut **tx)
    .await
}

/// The model's bookings (not cancelled; maintenance windows and course sessions
/// included) overlapping `[from, to)`, with their slots (`to`:
/// `DateTime::<Utc>::MAX_UTC` for all that end after `from`).
pub(crate) async fn held(
    db: impl PgExecutor<'_>,
    model: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<Held>> {
    let rows = sqlx::query!(
        "SELECT id, start_at, end_at, slots FROM booking
         WHERE model = $1 AND cancelled_at IS NULL AND period && tstzrange($2, $3, '[)')",
        model,
        from,
        to
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|b| {
            Window::new(b.start_at, b.end_at).ok().map(|window| Held {
                id: b.id,
                window,
                slots: b.slots,
            })
        })
        .collect())
}

/// Not enough slots are free over the whole window although it fits by count:
/// move planned bookings so that they are (see `capacity::replan`).
async fn reassign_slots(
    tx: &mut Transaction<'_, Postgres>,
    model: &str,
    units: u32,
    now: DateTime<Utc>,
    window: &Window,
    need: u32,
    changing: Option<i64>,
) -> Result<Vec<i32>, StoreError> {
    // Only planned bookings move, unless an admin books the past.
    let keep_before = (now + TimeDelta::microseconds(1)).min(window.start());
    let mut future = held(&mut **tx, model, keep_before, DateTime::<Utc>::MAX_UTC).await?;
    // A booking whose window changes is placed anew: it does not stand in its own way.
    future.retain(|h| Some(h.id) != changing);
    let plan = capacity::replan(units, keep_before, &future, window, need)
        .ok_or(CapacityRefusal::NoUnitAssignable)?;
    sqlx::query!("SET CONSTRAINTS booking_slot_excl, booking_archived_excl DEFERRED")
        .execute(&mut **tx)
        .await?;
    for (id, slots) in &plan.moves {
        sqlx::query!("UPDATE booking SET slots = $2 WHERE id = $1", id, slots)
            .execute(&mut **tx)
            .await?;
    }
    Ok(plan.slots)
}

/// The refusal of a booking that does not fit: with the earliest start from which
/// one of the same length and units would (`capacity::refuse_full`), counting the
/// model's bookings in the database and `made`, those of its batch not written yet.
async fn capacity_refusal(
    tx: &mut Transaction<'_, Postgres>,
    model: &str,
    units: u32,
    window: &Window,
    need: u32,
    made: &[&Held],
) -> sqlx::Result<CapacityRefusal> {
    let later = held(&mut **tx, model, window.start(), DateTime::<Utc>::MAX_UTC).await?;
    let made_later = made
        .iter()
        .copied()
        .filter(|h| h.window.end() > window.start());
    let windows = capacity::unit_windows(
        later
            .iter()
            .chain(made_later)
            .map(|h| (h.window, h.units())),
    );
    Ok(capacity::refuse_full(model, units, need, window, &windows))
}

/// The exclusion constraints are the backstop: if one fires, the answer is still
/// the rule it protects, not a 500.
pub(crate) fn constraint_refusal(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        match db.constraint() {
            Some("booking_slot_excl") => return CapacityRefusal::UnitTaken.into(),
            Some("booking_user_excl") => return rules::overlap_backstop().into(),
            Some("user_key_pkey") => return StoreError::Conflict(Conflict::UsernameCollision),
            _ => {}
        }
    }
    e.into()
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<BookingRow>> {
    sqlx::query_as!(
        BookingRow,
        r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at
         FROM booking WHERE id = $1"#,
        id
    )
    .fetch_optional(db)
    .await
}

pub struct Filter<'a> {
    pub user: Option<&'a str>,
    pub model: Option<&'a str>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub limit: i64,
}

/// Bookings by the filters given, newest start first. Only the filters given go into
/// the statement, so that Postgres plans each shape for its own index (a user's by
/// `booking_user_start_idx`, a model's by `booking_model_start_idx`, both read in the
/// order asked) instead of one generic plan for `($1 IS NULL OR ...)` that reads
/// every booking.
/// Built at run time, so the one read of bookings that sqlx cannot check when it
/// compiles: the tests of `GET /api/v1/bookings` run every filter.
pub async fn list(db: impl PgExecutor<'_>, f: Filter<'_>) -> sqlx::Result<Vec<BookingRow>> {
    let mut q = sqlx::QueryBuilder::<Postgres>::new("SELECT ");
    // People's bookings: maintenance windows and course sessions have their own
    // listings (`/maintenance`, `/reservations`).
    q.push(COLUMNS).push(" FROM booking WHERE hold_id IS NULL");
    if let Some(user) = f.user {
        q.push(" AND user_name = ").push_bind(user);
    }
    if let Some(model) = f.model {
        q.push(" AND model = ").push_bind(model);
    }
    if let Some(from) = f.from {
        q.push(" AND end_at > ").push_bind(from);
    }
    if let Some(to) = f.to {
        q.push(" AND start_at < ").push_bind(to);
    }
    q.push(" ORDER BY start_at DESC, id DESC LIMIT ")
        .push_bind(f.limit);
    q.build_query_as().fetch_all(db).await
}

/// Cancels a planned booking (it frees its unit and leaves no cooldown) or ends an
/// active one now (the cooldown counts from now). Ended and cancelled bookings
/// cannot change.
pub async fn cancel_or_end(
    pool: &PgPool,
    id: i64,
    now: DateTime<Utc>,
    actor: &str,
    if_match: Option<&IfMatch>,
) -> Result<BookingRow, StoreError> {
    let mut tx = pool.begin().await?;
    let updated = cancel_or_end_in(&mut tx, id, now, actor, if_match).await?;
    tx.commit().await?;
    Ok(updated)
}

/// [`cancel_or_end`] inside the caller's transaction, which commits it (with other
/// changes, as a confirmed maintenance window does). A refusal writes nothing and
/// leaves the transaction usable.
pub async fn cancel_or_end_in(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    now: DateTime<Utc>,
    actor: &str,
    if_match: Option<&IfMatch>,
) -> Result<BookingRow, StoreError> {
    let not_found = || StoreError::NotFound(Record::Booking, id);
    let first = get(&mut **tx, id).await?.ok_or_else(not_found)?;
    // Only frees units: the user's lock and the model's shared (migration
    // 20261125000200, booking_lock_release).
    sqlx::query!(
        "SELECT booking_lock_release($1, $2)",
        &first.user_name,
        &first.model
    )
    .execute(&mut **tx)
    .await?;
    let row: BookingRow = sqlx::query_as!(
        BookingRow,
        r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at
         FROM booking WHERE id = $1 FOR UPDATE"#,
        id
    )
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(not_found)?;
    check_precondition(&row, now, if_match)?;
    let (action, sql) = match cancel::cancel_or_end(row.status(now), row.start_at, now) {
        CancelOutcome::Cancel => (
            "booking.cancel",
            "UPDATE booking SET cancelled_at = $2, updated_at = $2 WHERE id = $1",
        ),
        CancelOutcome::EndEarly => (
            "booking.end_early",
            "UPDATE booking SET end_at = $2, ended_early_at = $2, updated_at = $2 WHERE id = $1",
        ),
        CancelOutcome::NotCancellable(status) => {
            return Err(StoreError::Conflict(Conflict::BookingNotCancellable {
                id,
                status,
            }))
        }
    };
    // One of two statements picked at run time: sqlx cannot check it when it compiles
    // (the cancel and end-early tests run both).
    sqlx::query(sql)
        .bind(id)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor,
            action,
            subject: Some(&row.model),
            user: Some(&row.user_name),
            booking_id: Some(id),
            details: json!({ "start": row.start_at, "booked_end": row.booked_end_at }),
        },
    )
    .await?;
    let updated: BookingRow = sqlx::query_as!(
        BookingRow,
        r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at
         FROM booking WHERE id = $1"#,
        id
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(updated)
}

/// A new window for a planned or running booking (`PATCH`), by its owner or an
/// admin: the rules of `core::rules::check_change` against the user's other
/// bookings, and capacity against the model's, all under the user's and the
/// model's locks (as a create), so that concurrent changes never overbook. The
/// booking keeps its unit if that unit is free over the new window, else gets
/// another, moving planned bookings where that makes room (as a create does). A
/// change to the window it has writes nothing.
pub async fn change_window(
    pool: &PgPool,
    policy: &Policy,
    id: i64,
    now: DateTime<Utc>,
    change: WindowRequest,
    actor: &str,
    if_match: Option<&IfMatch>,
) -> Result<BookingRow, StoreError> {
    let mut tx = pool.begin().await?;
    let updated = change_window_in(&mut tx, policy, id, now, change, actor, if_match).await?;
    tx.commit().await.map_err(constraint_refusal)?;
    Ok(updated)
}

/// [`change_window`] inside the caller's transaction, which commits it (with other
/// changes, as a confirmed maintenance window does; the slot constraints are checked
/// at that commit). The locks it takes are re-entrant: a caller that holds them
/// already (in the global order) keeps that order. A refusal for the booking's
/// state, a rule or capacity writes nothing and leaves the transaction usable.
pub async fn change_window_in(
    tx: &mut Transaction<'_, Postgres>,
    policy: &Policy,
    id: i64,
    now: DateTime<Utc>,
    change: WindowRequest,
    actor: &str,
    if_match: Option<&IfMatch>,
) -> Result<BookingRow, StoreError> {
    let not_found = || StoreError::NotFound(Record::Booking, id);
    let first = get(&mut **tx, id).await?.ok_or_else(not_found)?;
    // The group the booking counts against: its lock comes before the user's, its
    // policy for the model is the booking's, its quota is checked below.
    let group_id: Option<i32> = sqlx::query_scalar("SELECT group_id FROM booking WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?
        .flatten();
    let group = match group_id {
        Some(gid) => {
            group_store::lock(tx, gid).await?;
            group_store::by_ids(tx, &[gid]).await?.pop()
        }
        None => None,
    };
    let units = lock_user_and_model(tx, &first.user_name, &first.model)
        .await?
        .ok_or_else(|| StoreError::UnknownModel(first.model.clone()))?;
    let policy: &Policy = &match &group {
        // A group that may no longer book the model still lets its booking change
        // by the lab's policy.
        Some(g) => g
            .policy()
            .for_model(policy, &first.model)
            .unwrap_or_else(|| policy.clone()),
        None => policy.clone(),
    };
    let row: BookingRow = sqlx::query_as!(
        BookingRow,
        r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at
         FROM booking WHERE id = $1 FOR UPDATE"#,
        id
    )
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(not_found)?;
    check_precondition(&row, now, if_match)?;
    let status = row.status(now);
    let current = match (status, row.window()) {
        (BookingStatus::Planned | BookingStatus::Active, Some(w))
            if row.ended_early_at.is_none() =>
        {
            w
        }
        _ => {
            return Err(StoreError::Conflict(Conflict::BookingNotChangeable {
                id,
                status,
            }))
        }
    };
    // The window it has: nothing is checked or written (no audit row, no booking
    // change), and the booking is answered as it is.
    if rules::changes_nothing(
        &current,
        change.start.unwrap_or(current.start()),
        change.end,
    ) {
        return Ok(row);
    }
    // The user's other bookings that can matter to the new window (older ones
    // cannot: `rules::own_bookings_from`).
    let from = rules::own_bookings_from(policy, now, change.start.unwrap_or(current.start()));
    let others: Vec<Window> = sqlx::query!(
        "SELECT id, start_at, end_at FROM booking WHERE user_name = $1 AND cancelled_at IS NULL AND id <> $2 AND end_at > $3",
        &row.user_name,
        id,
        from
    )
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .filter_map(|b| Window::new(b.start_at, b.end_at).ok())
    .collect();
    let window = rules::check_change(
        policy,
        now,
        &rules::WindowChange {
            current,
            started: status == BookingStatus::Active,
            start: change.start.unwrap_or(current.start()),
            end: change.end,
            others: &others,
            override_rules: change.override_rules,
        },
    )?;
    // The booking keeps its GPU count; capacity counts every booking once per unit.
    let need = units_u32(row.units).max(1);
    let past_quota = match &group {
        Some(g) if g.row.quota().limits() => {
            let quota = g.row.quota();
            let terms = if quota.period == PeriodKind::Term {
                group_store::terms(&mut **tx).await?
            } else {
                Vec::new()
            };
            let span = quota::read_window(&quota, policy.zone, &terms, &window);
            let counted = group_store::counted(&mut **tx, g.row.id, &span, Some(id)).await?;
            let checked = quota::check(
                &QuotaCheck {
                    group: &g.row.name,
                    quota: &quota,
                    zone: policy.zone,
                    terms: &terms,
                    held: &counted,
                },
                &window,
                need,
            );
            match checked {
                Err(refusal) if !change.override_rules => return Err(refusal.into()),
                Err(refusal) => Some(refusal),
                Ok(()) => None,
            }
        }
        _ => None,
    };
    let mut overlapping = held(&mut **tx, &row.model, window.start(), window.end()).await?;
    overlapping.retain(|h| h.id != id);
    let windows = capacity::unit_windows(overlapping.iter().map(|h| (h.window, h.units())));
    if !capacity::fits_units(units_u32(units), &windows, &window, need) {
        return Err(
            capacity_refusal(tx, &row.model, units_u32(units), &window, need, &[])
                .await?
                .into(),
        );
    }
    let slots_free = !overlapping
        .iter()
        .any(|h| h.window.overlaps(&window) && h.slots.iter().any(|slot| row.slots.contains(slot)));
    let slots = if slots_free {
        row.slots.clone()
    } else {
        match capacity::free_slots(units_u32(units), &overlapping, &window, need) {
            Some(slots) => slots,
            None => {
                reassign_slots(
                    tx,
                    &row.model,
                    units_u32(units),
                    now,
                    &window,
                    need,
                    Some(id),
                )
                .await?
            }
        }
    };
    let action = if window.end() > current.end() {
        "booking.extend"
    } else if window.end() < current.end() {
        "booking.shorten"
    } else {
        "booking.move"
    };
    let updated: BookingRow = sqlx::query_as!(
        BookingRow,
        r#"UPDATE booking SET start_at = $2, end_at = $3, booked_end_at = $3, slots = $4, updated_at = $5
         WHERE id = $1 RETURNING id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at"#,
        id,
        window.start(),
        window.end(),
        &slots,
        now
    )
    .fetch_one(&mut **tx)
    .await
    .map_err(constraint_refusal)?;
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor,
            action,
            subject: Some(&row.model),
            user: Some(&row.user_name),
            booking_id: Some(id),
            details: json!({
                "from": { "start": current.start(), "end": current.end() },
                "to": { "start": window.start(), "end": window.end() },
                "override": change.override_rules,
                "past_quota": past_quota.as_ref().map(|r| &r.message),
            }),
        },
    )
    .await?;
    Ok(updated)
}

/// `If-Match`'s condition against the booking as it is now, read under its row lock
/// (so that of two writes sent with the same tag, the second sees the first's
/// change and is refused): `Stale` when it names another state.
fn check_precondition(
    row: &BookingRow,
    now: DateTime<Utc>,
    if_match: Option<&IfMatch>,
) -> Result<(), StoreError> {
    match if_match {
        Some(condition) if !condition.matches(&booking_etag(&row.view(now))) => {
            Err(StoreError::Conflict(Conflict::Stale { id: row.id }))
        }
        _ => Ok(()),
    }
}

/// The new window a `PATCH` asks for (the start only for a booking not started).
pub struct WindowRequest {
    pub start: Option<DateTime<Utc>>,
    pub end: DateTime<Utc>,
    pub override_rules: bool,
}

fn units_u32(units: i32) -> u32 {
    u32::try_from(units).unwrap_or(0)
}

/// The user's (not cancelled) bookings' windows that can matter to a window that
/// starts now or later (for `next-start`, `/schedulability` and the waitlist): those
/// that end after `rules::own_bookings_from(policy, now, now)`.
pub async fn user_windows(
    db: impl PgExecutor<'_>,
    policy: &Policy,
    now: DateTime<Utc>,
    user: &str,
) -> sqlx::Result<Vec<Window>> {
    let from = rules::own_bookings_from(policy, now, now);
    let rows = sqlx::query!(
        "SELECT start_at, end_at FROM booking WHERE user_name = $1 AND cancelled_at IS NULL AND end_at > $2",
        user,
        from
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|b| Window::new(b.start_at, b.end_at).ok())
        .collect())
}

/// The active booking of any of `users` at `now`, if one.
pub async fn active_for(
    db: impl PgExecutor<'_>,
    users: &[String],
    now: DateTime<Utc>,
) -> sqlx::Result<Option<BookingRow>> {
    sqlx::query_as!(
        BookingRow,
        r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                cancelled_at, ended_early_at, override AS override_rules, created_at
         FROM booking
         WHERE user_name = ANY($1) AND cancelled_at IS NULL AND start_at <= $2 AND end_at > $2
         ORDER BY start_at LIMIT 1"#,
        users,
        now
    )
    .fetch_optional(db)
    .await
}
