//! GPU models: declared by admins, counted by the controller.

use chrono::{DateTime, TimeDelta, Utc};
use std::collections::BTreeMap;

use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::capacity::{self, DayLoad};
use gpu_booking_core::next_start::{self, NextStart};
use gpu_booking_core::rules::{self, Refusal};
use gpu_booking_core::window::Window;
use serde::Serialize;
use sqlx::PgExecutor;

/// A model as the store reads it; the API answers with `wire::Model`.
#[derive(Debug, Clone, Serialize)]
pub struct Model {
    pub name: String,
    /// Order among models when matching product names (first match wins).
    pub position: i32,
    /// Units (GPUs) of this model in the cluster.
    pub units: i32,
    /// Ordered wildcard patterns over `nvidia.com/gpu.product` values.
    pub patterns: Vec<String>,
    /// Extended resource naming this model, when the device plugin exposes one
    /// (e.g. `nvidia.com/a100`); `nvidia.com/gpu` otherwise.
    pub resource: Option<String>,
    /// Default VRAM budget of a pod on this model, MiB.
    pub gpumem_mib: i32,
    /// Units in use right now, as last reported by the controller.
    pub in_use: i32,
    pub usage_reported_at: Option<DateTime<Utc>>,
    /// Physical cards (MIG devices for a MIG profile) the controller counts on the
    /// nodes; informational, beside the declared `units` and never in their place.
    pub cards: Option<i32>,
    /// Whether every node with cards of this model advertises the VRAM budget
    /// resource (the webhook budgets pods of the model only then).
    pub gpumem_advertised: bool,
    /// The VRAM budget one unit can hold, MiB, when advertised.
    pub gpumem_unit_mib: Option<i32>,
    /// Cards that pods of other workloads use (which bookings never preempt), NULL
    /// until a report counts them.
    pub others_in_use: Option<i32>,
    /// The namespaces of those pods, sorted.
    pub other_namespaces: Vec<String>,
}

impl Model {
    /// Units an unbooked pod could take right now.
    pub fn free_now(&self) -> i32 {
        (self.units - self.in_use).max(0)
    }

    /// Whether the cards counted disagree with the declared units.
    pub fn mismatch(&self) -> bool {
        gpu_booking_core::inventory::units_mismatch(
            i64::from(self.units),
            self.cards.map(i64::from),
        )
    }

    /// The cards bookings can really get: those counted less those other workloads
    /// use, when both are known.
    pub fn bookable(&self) -> Option<u64> {
        gpu_booking_core::wire::models::bookable(
            self.cards.map(gpu_booking_core::wire::count),
            self.others_in_use.map(gpu_booking_core::wire::count),
        )
    }

    /// Whether the declared units exceed what bookings can really get.
    pub fn over_declared(&self) -> bool {
        gpu_booking_core::wire::models::over_declared(
            gpu_booking_core::wire::count(self.units),
            self.bookable(),
        )
    }

    /// The per-unit VRAM budget the nodes advertise, when they all do.
    pub fn advertised_unit_mib(&self) -> Option<i32> {
        self.gpumem_unit_mib
            .filter(|&mib| self.gpumem_advertised && mib > 0)
    }
}

// Each query names the columns of `Model` itself: sqlx checks only a literal.

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Model>> {
    sqlx::query_as!(
        Model,
        "SELECT name, position, units, patterns, resource, gpumem_mib, in_use,
             usage_reported_at, cards, gpumem_advertised, gpumem_unit_mib,
             others_in_use, other_namespaces
         FROM gpu_model ORDER BY position, name"
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Option<Model>> {
    sqlx::query_as!(
        Model,
        "SELECT name, position, units, patterns, resource, gpumem_mib, in_use,
             usage_reported_at, cards, gpumem_advertised, gpumem_unit_mib,
             others_in_use, other_namespaces
         FROM gpu_model WHERE name = $1",
        name
    )
    .fetch_optional(db)
    .await
}

pub struct ModelSpec<'a> {
    pub name: &'a str,
    pub units: i32,
    pub patterns: &'a [String],
    pub resource: Option<&'a str>,
    pub gpumem_mib: i32,
    pub position: Option<i32>,
}

/// Declares or changes a model and records it in the audit log (`model.put` by
/// `actor`, with `source` when the model came from elsewhere than the caller, such as
/// the chart's values), both in `db`'s transaction: the admin API and the declared
/// models write a model the same way.
pub async fn put(
    db: &mut sqlx::PgConnection,
    m: ModelSpec<'_>,
    at: DateTime<Utc>,
    actor: &str,
    source: Option<&str>,
) -> sqlx::Result<Model> {
    let mut details =
        serde_json::json!({ "units": m.units, "patterns": m.patterns, "gpumem_mib": m.gpumem_mib });
    if let Some(source) = source {
        details["source"] = source.into();
    }
    let name = m.name;
    let model = upsert(&mut *db, m, at).await?;
    super::audit::record(
        &mut *db,
        super::audit::NewEvent {
            at,
            actor,
            action: "model.put",
            subject: Some(name),
            user: None,
            booking_id: None,
            details,
        },
    )
    .await?;
    Ok(model)
}

/// The running and planned bookings of `model` that hold a unit at or beyond
/// `units` (what lowering the model to `units` would leave without a unit), first
/// ending first. Takes the model's lock exclusive first (as [`upsert`] does), so that
/// no create places a booking on those units between this look and the change.
pub async fn bookings_beyond(
    db: &mut sqlx::PgConnection,
    model: &str,
    units: i32,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<gpu_booking_core::model_units::InTheWay>> {
    sqlx::query!("SELECT pg_advisory_xact_lock(7264, hashtext($1))", model)
        .execute(&mut *db)
        .await?;
    let rows = sqlx::query!(
        "SELECT id, user_name, start_at, end_at FROM booking
         WHERE model = $1 AND cancelled_at IS NULL AND end_at > $3 AND slots[units] >= $2
         ORDER BY end_at, id",
        model,
        units,
        now
    )
    .fetch_all(&mut *db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| gpu_booking_core::model_units::InTheWay {
            id: r.id,
            user: r.user_name,
            start: r.start_at,
            end: r.end_at,
        })
        .collect())
}

/// Creates or updates a model; a new model without a position goes last. It takes
/// the model's lock exclusive (migration 20261125000200) until its transaction ends,
/// so that no create decides on the units it changes while it changes them.
pub async fn upsert(
    db: impl PgExecutor<'_>,
    m: ModelSpec<'_>,
    at: DateTime<Utc>,
) -> sqlx::Result<Model> {
    sqlx::query_as!(
        Model,
        "WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(7264, hashtext($1)))
         INSERT INTO gpu_model (name, position, units, patterns, resource, gpumem_mib, created_at, updated_at)
         SELECT $1, COALESCE($2, (SELECT COALESCE(max(position) + 1, 0) FROM gpu_model)), $3, $4, $5, $6, $7, $7
         FROM locked
         ON CONFLICT (name) DO UPDATE SET
            position = COALESCE($2, gpu_model.position), units = $3, patterns = $4, resource = $5,
            gpumem_mib = $6, updated_at = $7
         RETURNING name, position, units, patterns, resource, gpumem_mib, in_use,
             usage_reported_at, cards, gpumem_advertised, gpumem_unit_mib,
             others_in_use, other_namespaces",
        m.name,
        m.position,
        m.units,
        m.patterns,
        m.resource,
        m.gpumem_mib,
        at
    )
    .fetch_one(db)
    .await
}

/// What the controller reports of a model: beside the declared units, never them
/// (`gpumem_advertised: None`: not reported, the last report's values stay).
pub use gpu_booking_core::wire::UsageReport;

/// Records what the controller counted. The declared `units` are the admin's: a
/// report never changes them (a node away for maintenance must not shrink what can
/// be booked), it records `cards` beside them. Other workloads are replaced whole
/// (the count with its namespaces) when the report counts them, kept otherwise.
/// `at` is the report's time, recorded as `usage_reported_at` (and `updated_at`,
/// which nothing reads for models): the controller's count's, capped by the
/// receipt ([`UsageReport::reported_at`]).
pub async fn set_usage(
    db: impl PgExecutor<'_>,
    name: &str,
    report: &UsageReport,
    at: DateTime<Utc>,
) -> sqlx::Result<Option<Model>> {
    sqlx::query_as!(
        Model,
        "UPDATE gpu_model SET in_use = $2, cards = COALESCE($3, cards),
            gpumem_advertised = COALESCE($4, gpumem_advertised),
            gpumem_unit_mib = CASE WHEN $4 IS NULL THEN gpumem_unit_mib ELSE $5 END,
            others_in_use = COALESCE($7, others_in_use),
            other_namespaces = CASE WHEN $7 IS NULL THEN other_namespaces ELSE $8 END,
            usage_reported_at = $6, updated_at = $6
         WHERE name = $1 RETURNING name, position, units, patterns, resource, gpumem_mib, in_use,
             usage_reported_at, cards, gpumem_advertised, gpumem_unit_mib,
             others_in_use, other_namespaces",
        name,
        report.in_use,
        report.cards,
        report.gpumem_advertised,
        report.gpumem_unit_mib,
        at,
        report.others_in_use,
        &report.other_namespaces
    )
    .fetch_optional(db)
    .await
}

/// What a count of the model's busiest instant per UTC day needs for the days
/// `[first, first + count)`: the rows the store keeps per day (`booking_day_units`
/// with where its units begin and end, migration 20261209000100) and the windows of
/// the bookings too long to be kept per day that overlap those days, each once per
/// unit (`core::lab_days::peaks_in_windows`, over the lab's days; or
/// `core::capacity::peaks_of_days`, over the UTC days). One statement, so both parts
/// are of one snapshot: a booking whose window changes between kept per day and not
/// is counted once. A year reads 365 rows where the bookings over it were 2,000-9,500 table
/// pages in the history bench.
pub async fn day_loads(
    db: impl PgExecutor<'_>,
    model: &str,
    first: i64,
    count: usize,
) -> sqlx::Result<(BTreeMap<i64, DayLoad>, Vec<Window>)> {
    let day = |d: i64| i32::try_from(d).unwrap_or(if d < 0 { i32::MIN } else { i32::MAX });
    let (from_day, to_day) = (day(first), day(first.saturating_add(count as i64)));
    let span = |d: i32| capacity::utc_day_window(i64::from(d)).map(|w| w.start());
    let (Some(from), Some(to)) = (span(from_day), span(to_day)) else {
        return Ok(Default::default());
    };
    let rows = sqlx::query!(
        r#"SELECT day AS "day?", units AS "units!", edges AS "edges?",
                  NULL::timestamptz AS "start_at?", NULL::timestamptz AS "end_at?"
           FROM booking_day_units WHERE model = $1 AND day >= $2 AND day < $3
           UNION ALL
           SELECT NULL, units, NULL, start_at, end_at FROM booking
           WHERE model = $1 AND cancelled_at IS NULL AND NOT booking_counted_by_day(start_at, end_at)
             AND period && tstzrange($4, $5, '[)')"#,
        model,
        from_day,
        to_day,
        from,
        to
    )
    .fetch_all(db)
    .await?;
    let (mut loads, mut long) = (BTreeMap::new(), Vec::new());
    for r in rows {
        match (r.day, r.edges, r.start_at, r.end_at) {
            (Some(day), Some(edges), _, _) => {
                let load =
                    DayLoad::from_stored(i64::from(day), r.units, &edges).ok_or_else(|| {
                        sqlx::Error::Decode(
                            format!("booking_day_units ({model}, {day}): an entry outside its day")
                                .into(),
                        )
                    })?;
                loads.insert(i64::from(day), load);
            }
            (_, _, Some(start), Some(end)) => {
                if let Ok(w) = Window::new(start, end) {
                    long.extend(std::iter::repeat_n(
                        w,
                        usize::try_from(r.units).unwrap_or(0),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok((loads, long))
}

/// Windows of the model's bookings (not cancelled) that overlap `[from, to)`, each
/// once per unit it is for (so that peaks count units).
pub async fn booked_windows(
    db: impl PgExecutor<'_>,
    model: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<Window>> {
    // Each window once per unit here, not with `generate_series` in SQL: the planner
    // guesses 1,000 rows per call, and the inflated cost switched JIT compilation on
    // (tens of milliseconds per read with the history loaded).
    let rows = sqlx::query!(
        "SELECT start_at, end_at, units FROM booking
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
            let w = Window::new(b.start_at, b.end_at).ok()?;
            Some(std::iter::repeat_n(
                w,
                usize::try_from(b.units).unwrap_or(0),
            ))
        })
        .flatten()
        .collect())
}

/// A user's "when could I book, and for how long": what every earliest-start read
/// below is asked.
pub struct StartQuestion<'a> {
    pub policy: &'a Policy,
    pub now: DateTime<Utc>,
    /// The user's bookings (not cancelled), by their windows.
    pub own: &'a [Window],
    /// The length of the booking asked about.
    pub duration: TimeDelta,
}

impl StartQuestion<'_> {
    /// The window from the earliest start the user's rules allow, `duration` long.
    fn earliest_window(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        let (from, _) = rules::earliest_start_for_user(self.policy, self.now, self.own);
        let to = from
            .checked_add_signed(self.duration)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        (from, to)
    }

    /// `core::next_start::earliest_start` for `need` units of `model` given its
    /// bookings `booked` (one window per unit).
    fn answer(&self, model: &Model, need: u32, booked: &[Window]) -> Result<NextStart, Refusal> {
        next_start::earliest_start(
            self.policy,
            self.now,
            self.own,
            &model.name,
            u32::try_from(model.units).unwrap_or(0),
            need,
            booked,
            self.duration,
        )
    }
}

/// The earliest start of a booking of `need` units on `model`
/// (`core::next_start::earliest_start`). Most questions are answered by a bound on
/// the units booked at once over the user's earliest window
/// (`next_start::free_throughout`, [`units_held_bound`]); the others read the model's
/// bookings ([`earliest_start_from_bookings`]).
pub async fn earliest_start(
    db: &sqlx::PgPool,
    q: &StartQuestion<'_>,
    model: &Model,
    need: u32,
) -> sqlx::Result<Result<NextStart, Refusal>> {
    let bounds = units_held_bound(db, q, std::slice::from_ref(model)).await?;
    if let Some(next) = answer_from_bound(q, model, need, &bounds) {
        return Ok(next);
    }
    earliest_start_from_bookings(db, q, model, need).await
}

/// [`earliest_start`] of one unit for each of `models`: one statement bounds the units
/// booked at once over the user's earliest window for every model, and only the
/// models where that leaves no unit free read their bookings. (Reading every model's bookings
/// over its horizon, one read per model, sent ~13,000 rows for each question with
/// the history bench's planned bookings on 40 models.)
pub async fn earliest_starts(
    db: &sqlx::PgPool,
    q: &StartQuestion<'_>,
    models: &[Model],
) -> sqlx::Result<std::collections::BTreeMap<String, Result<NextStart, Refusal>>> {
    let bounds = units_held_bound(db, q, models).await?;
    let mut answers = std::collections::BTreeMap::new();
    for m in models {
        let next = match answer_from_bound(q, m, 1, &bounds) {
            Some(next) => next,
            None => earliest_start_from_bookings(db, q, m, 1).await?,
        };
        answers.insert(m.name.clone(), next);
    }
    Ok(answers)
}

/// Per model, a bound on the units its bookings (not cancelled) hold at any instant of
/// the user's earliest window: the most units booked on any UTC day the window touches
/// (`booking_day_units`, kept by a trigger: migration 20261128000100), plus the units
/// of the few bookings too long to be kept per day. Every booking active at an
/// instant touches that instant's day, so no instant holds more. One primary-key
/// range per model, a row per day of the window, whatever the history: the sum of
/// the overlapping bookings' units through the GiST index `(model, period)`, which
/// this replaced, read more of the index the more past bookings it held.
async fn units_held_bound(
    db: &sqlx::PgPool,
    q: &StartQuestion<'_>,
    models: &[Model],
) -> sqlx::Result<std::collections::HashMap<String, i64>> {
    let (from, to) = q.earliest_window();
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    // LATERAL, so that each model is one range of each index. The long bookings'
    // predicate is the partial index's own (booking_long_period_idx).
    let rows = sqlx::query!(
        r#"SELECT m.name AS "name!", COALESCE(d.units, 0) + COALESCE(l.units, 0) AS "units!"
         FROM unnest($1::text[]) AS m(name)
         CROSS JOIN LATERAL (
             SELECT max(units)::bigint AS units FROM booking_day_units
             WHERE model = m.name
               AND day BETWEEN booking_day($2::timestamptz) AND booking_day($3::timestamptz - interval '1 microsecond')
         ) d
         CROSS JOIN LATERAL (
             SELECT sum(units)::bigint AS units FROM booking
             WHERE model = m.name AND cancelled_at IS NULL
               AND NOT booking_counted_by_day(start_at, end_at)
               AND period && tstzrange($2, $3, '[)')
         ) l"#,
        &names,
        from,
        to
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.units)).collect())
}

/// The answer for `model` when the units its bookings can hold at once over the
/// user's earliest window (`bounds`: [`units_held_bound`]) leave `need` free:
/// then no booking is in the way, and the answer is the one from no bookings.
fn answer_from_bound(
    q: &StartQuestion<'_>,
    model: &Model,
    need: u32,
    bounds: &std::collections::HashMap<String, i64>,
) -> Option<Result<NextStart, Refusal>> {
    let units = u32::try_from(model.units).unwrap_or(0);
    let booked = u64::try_from(*bounds.get(&model.name)?).ok()?;
    next_start::free_throughout(units, need, booked).then(|| q.answer(model, need, &[]))
}

/// [`earliest_start`] from the model's bookings, reading them only from the earliest
/// start the user's rules allow (those that end before it are never in the way) and
/// only as far ahead as the answer needs (`next_start::settled_before`): a week past
/// that start, then four times as far, and so on. Without that, every planned
/// booking of the model was read on each question.
async fn earliest_start_from_bookings(
    db: &sqlx::PgPool,
    q: &StartQuestion<'_>,
    model: &Model,
    need: u32,
) -> sqlx::Result<Result<NextStart, Refusal>> {
    let (from, _) = q.earliest_window();
    let mut horizon = next_start::first_horizon(from, q.duration);
    loop {
        // Bookings that end before `from` are never in the way.
        let booked = booked_windows(db, &model.name, from, horizon).await?;
        match q.answer(model, need, &booked) {
            Ok(next) if !next_start::settled_before(&next, q.duration, horizon) => {}
            other => return Ok(other),
        }
        horizon = next_start::wider(from, horizon);
    }
}
