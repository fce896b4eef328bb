//! Every booking rule through the API, exactly at its limit and one second past
//! it, with a clock that only moves when told to.
//!
//! Runs on the real Postgres (`DATABASE_URL`); each test gets a fresh, migrated
//! database from `#[sqlx::test]`.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::Router;
use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use common::{days, hours, rfc, secs, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"rules-api-test-secret-0123456789abcdef";

fn admin() -> String {
    token_for(SECRET, "root@lab", Some("admin"))
}
fn service() -> String {
    token_for(SECRET, "webhook", Some("service"))
}
fn user(name: &str) -> String {
    token_for(SECRET, name, None)
}

#[derive(Debug)]
struct Resp {
    status: StatusCode,
    json: Value,
    text: String,
}

impl Resp {
    /// The created booking; fails the test with the refusal otherwise.
    #[track_caller]
    fn created(&self) -> &Value {
        assert_eq!(
            self.status,
            StatusCode::CREATED,
            "want 201, got {}: {}",
            self.status,
            self.text
        );
        &self.json
    }

    #[track_caller]
    fn id(&self) -> i64 {
        self.created()["id"].as_i64().expect("id")
    }

    /// A refusal with this status and code, and this `earliest_start` (None: the
    /// field must be absent).
    #[track_caller]
    fn refused(&self, status: u16, code: &str, earliest: Option<DateTime<Utc>>) {
        assert_eq!(
            (self.status.as_u16(), self.json["error"].as_str()),
            (status, Some(code)),
            "want {status} {code}, got: {}",
            self.text
        );
        assert!(
            self.json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "no message: {}",
            self.text
        );
        assert_eq!(
            time_field(&self.json, "earliest_start"),
            earliest,
            "earliest_start of {}",
            self.text
        );
    }

    #[track_caller]
    fn ok(&self) -> &Value {
        assert_eq!(
            self.status,
            StatusCode::OK,
            "want 200, got {}: {}",
            self.status,
            self.text
        );
        &self.json
    }
}

fn time_field(v: &Value, key: &str) -> Option<DateTime<Utc>> {
    v.get(key).and_then(Value::as_str).map(|s| {
        DateTime::parse_from_rfc3339(s)
            .expect("an RFC 3339 time")
            .with_timezone(&Utc)
    })
}

struct Api {
    app: Router,
    clock: ManualClock,
    pool: PgPool,
}

impl Api {
    /// The API at `t0` with the default policy and these models.
    async fn new(pool: PgPool, models: &[(&str, i32)]) -> Api {
        Api::with_policy(pool, models, Policy::default()).await
    }

    async fn with_policy(pool: PgPool, models: &[(&str, i32)], policy: Policy) -> Api {
        let clock = ManualClock::new(t0());
        let app = gpu_booking_api::app::router(test_state(
            pool.clone(),
            policy,
            Arc::new(clock.clone()),
            SECRET,
        ));
        let api = Api { app, clock, pool };
        for (name, units) in models {
            let r = api
                .call(
                    Method::PUT,
                    &format!("/api/v1/models/{name}"),
                    &admin(),
                    Some(json!({"units": units})),
                )
                .await;
            r.ok();
        }
        api
    }

    fn now(&self) -> DateTime<Utc> {
        use gpu_booking_api::clock::Clock;
        self.clock.now()
    }

    async fn call(&self, method: Method, uri: &str, token: &str, body: Option<Value>) -> Resp {
        let r = common::call(&self.app, method, uri, Some(token), body.as_ref()).await;
        let (status, text) = (r.status, r.text());
        assert!(!status.is_server_error(), "server error {status}: {text}");
        Resp {
            status,
            json: r.json_or_null(),
            text,
        }
    }

    /// `who` books `model` over `[start, end)` for themselves.
    async fn book(&self, who: &str, model: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> Resp {
        self.call(
            Method::POST,
            "/api/v1/bookings",
            &user(who),
            Some(json!({"model": model, "start": rfc(start), "end": rfc(end)})),
        )
        .await
    }

    /// An admin books for `who`, with or without the override.
    async fn admin_book(
        &self,
        who: &str,
        model: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        over: bool,
    ) -> Resp {
        self.call(
            Method::POST,
            "/api/v1/bookings",
            &admin(),
            Some(json!({"model": model, "user": who, "override": over, "start": rfc(start), "end": rfc(end)})),
        )
        .await
    }

    async fn delete(&self, who: &str, id: i64) -> Resp {
        self.call(
            Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            &user(who),
            None,
        )
        .await
    }

    async fn get_booking(&self, id: i64) -> Value {
        self.call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &admin(),
            None,
        )
        .await
        .ok()
        .clone()
    }

    async fn next_start(&self, who: &str, model: &str, days: Option<i64>) -> Value {
        let uri = match days {
            Some(d) => format!("/api/v1/me/next-start?model={model}&days={d}"),
            None => format!("/api/v1/me/next-start?model={model}"),
        };
        self.call(Method::GET, &uri, &user(who), None)
            .await
            .ok()
            .clone()
    }

    async fn sql_count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// The invariants the database must keep whatever the API did.
    async fn assert_invariants(&self) {
        let slot_clash = self
            .sql_count(
                "SELECT count(*) FROM booking a JOIN booking b
                   ON a.id < b.id AND a.model = b.model AND a.slots && b.slots AND a.period && b.period
                 WHERE a.cancelled_at IS NULL AND b.cancelled_at IS NULL",
            )
            .await;
        assert_eq!(
            slot_clash, 0,
            "two live bookings share a slot of a model at the same time"
        );
        let slot_range = self
            .sql_count(
                "SELECT count(*) FROM booking b JOIN gpu_model m ON m.name = b.model
                 WHERE b.cancelled_at IS NULL
                   AND (b.slots[1] < 0 OR b.slots[b.units] >= m.units OR cardinality(b.slots) <> b.units)",
            )
            .await;
        assert_eq!(
            slot_range, 0,
            "a live booking holds a slot the model does not have"
        );
        let user_clash = self
            .sql_count(
                "SELECT count(*) FROM booking a JOIN booking b
                   ON a.id < b.id AND a.user_name = b.user_name AND a.period && b.period
                 WHERE a.cancelled_at IS NULL AND b.cancelled_at IS NULL",
            )
            .await;
        assert_eq!(user_clash, 0, "a user holds two bookings at once");
        // Capacity by count at every instant where a booking starts.
        let over = self
            .sql_count(
                "SELECT count(*) FROM booking s JOIN gpu_model m ON m.name = s.model
                 WHERE s.cancelled_at IS NULL AND (
                   SELECT sum(o.units) FROM booking o
                   WHERE o.model = s.model AND o.cancelled_at IS NULL AND o.period @> s.start_at) > m.units",
            )
            .await;
        assert_eq!(over, 0, "a model is booked past its units");
        let day_units = gpu_booking_api::testing::day_units_mismatches(&self.pool)
            .await
            .unwrap();
        assert_eq!(
            day_units, 0,
            "booking_day_units disagrees with the bookings"
        );
    }
}

fn status_of(v: &Value) -> &str {
    v["status"].as_str().unwrap_or("?")
}

// ---------------------------------------------------------------------------
// Start, duration

#[sqlx::test(migrations = "../migrations")]
async fn start_exactly_now_is_accepted_one_second_earlier_is_not(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    api.book("alice", "a100", now - secs(1), now + days(1))
        .await
        .refused(422, "start_in_past", Some(now));
    let b = api.book("alice", "a100", now, now + days(1)).await;
    let b = b.created();
    assert_eq!(status_of(b), "active");
    assert_eq!(time_field(b, "start"), Some(now));
    assert_eq!(b["user"], "alice");
    assert_eq!(b["model"], "a100");
    // Also a second before now with a sub-second clock: the limit is exact.
    api.clock.advance(TimeDelta::milliseconds(500));
    let now = api.now();
    api.book(
        "bob",
        "a100",
        now - TimeDelta::milliseconds(1),
        now + days(1),
    )
    .await
    .refused(422, "start_in_past", Some(now));
}

#[sqlx::test(migrations = "../migrations")]
async fn duration_at_least_24_hours(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let s = api.now() + hours(5);
    api.book("alice", "a100", s, s + hours(24) - secs(1))
        .await
        .refused(422, "duration_too_short", None);
    let b = api.book("alice", "a100", s, s + hours(24)).await;
    assert_eq!(time_field(b.created(), "end"), Some(s + hours(24)));
    assert_eq!(status_of(b.created()), "planned");
}

#[sqlx::test(migrations = "../migrations")]
async fn duration_at_most_14_days(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let s = api.now() + hours(5);
    api.book("alice", "a100", s, s + days(14) + secs(1))
        .await
        .refused(422, "duration_too_long", None);
    api.book("alice", "a100", s, s + days(14)).await.created();
}

#[sqlx::test(migrations = "../migrations")]
async fn start_at_most_a_year_ahead(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let edge = api.now() + Policy::default().max_ahead;
    api.book("alice", "a100", edge + secs(1), edge + days(1))
        .await
        .refused(422, "too_far_ahead", None);
    // The year 9999, which the database's window accepts, is far past it.
    let far = DateTime::parse_from_rfc3339("9999-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    api.book("alice", "a100", far, far + days(1))
        .await
        .refused(422, "too_far_ahead", None);
    let id = api.book("alice", "a100", edge, edge + days(1)).await.id();
    let policy = api
        .call(Method::GET, "/api/v1/policy", &user("alice"), None)
        .await
        .ok()
        .clone();
    assert_eq!(policy["max_ahead_seconds"], 365 * 86_400);
    // Its start moved past the horizon: refused as a new booking would be.
    api.call(
        Method::PATCH,
        &format!("/api/v1/bookings/{id}"),
        &user("alice"),
        Some(json!({"start": rfc(edge + secs(1)), "end": rfc(edge + days(1) + secs(1))})),
    )
    .await
    .refused(422, "too_far_ahead", None);
    // An admin's override may (a planned course, a maintenance booking).
    api.admin_book("bob", "a100", far, far + days(1), true)
        .await
        .created();
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_model_is_never_lowered_below_what_its_bookings_hold(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 2)]).await;
    let s = api.now() + hours(1);
    let alice = api.book("alice", "t4", s, s + days(1)).await.id();
    let bob = api.book("bob", "t4", s, s + days(1)).await.id();
    let lower = |units: i32| {
        let api = &api;
        async move {
            api.call(
                Method::PUT,
                "/api/v1/models/t4",
                &admin(),
                Some(json!({"units": units})),
            )
            .await
        }
    };
    // Two overlapping bookings: one unit would leave one of them without a card.
    let r = lower(1).await;
    assert_eq!(
        (r.status.as_u16(), r.json["error"].as_str()),
        (409, Some("units_in_use")),
        "{}",
        r.text
    );
    let message = r.json["message"].as_str().unwrap();
    assert!(message.contains(&format!("#{bob} of bob")), "{message}");
    assert!(
        !message.contains(&format!("#{alice} of")),
        "alice holds unit 0: {message}"
    );
    let units: i32 = sqlx::query_scalar("SELECT units FROM gpu_model WHERE name = 't4'")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(units, 2, "nothing changed");
    // Once bob's booking is cancelled, or has ended, the unit may go.
    api.delete("bob", bob).await.ok();
    lower(1).await.ok();
    api.assert_invariants().await;
    // A booking that ended holds nothing.
    api.clock.advance(days(2));
    lower(0).await.ok();
}

// ---------------------------------------------------------------------------
// The user's own bookings

#[sqlx::test(migrations = "../migrations")]
async fn no_second_booking_while_one_is_active(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    let end = now + days(2);
    let first = api.book("alice", "a100", now, end).await.id();
    // Anything, however far away, waits for the active one to end.
    for start in [now + days(3), end + days(14), now + days(100)] {
        api.book("alice", "a100", start, start + days(1))
            .await
            .refused(409, "active_booking_exists", Some(end + days(14)));
    }
    // Still active in its last second.
    api.clock.set(end - secs(1));
    api.book("alice", "a100", end + days(14), end + days(15))
        .await
        .refused(409, "active_booking_exists", Some(end + days(14)));
    assert_eq!(status_of(&api.get_booking(first).await), "active");
    // Another user is not affected.
    api.book("bob", "a100", end + days(1), end + days(2))
        .await
        .created();
}

#[sqlx::test(migrations = "../migrations")]
async fn at_most_one_planned_booking(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    let (s, e) = (now + days(1), now + days(3));
    api.book("alice", "a100", s, e).await.created();
    for start in [e + days(14), now + days(60)] {
        api.book("alice", "a100", start, start + days(1))
            .await
            .refused(409, "future_booking_exists", Some(e + days(14)));
    }
    // A booking before the planned one is also a second planned booking.
    api.book("alice", "a100", now, now + days(1)).await.refused(
        409,
        "future_booking_exists",
        Some(e + days(14)),
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn cooldown_is_exact_to_the_second(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    let end = now + days(1);
    let id = api.book("alice", "a100", now, end).await.id();
    api.clock.set(end);
    assert_eq!(status_of(&api.get_booking(id).await), "ended");
    let ok = end + days(14);
    api.book("alice", "a100", ok - secs(1), ok + days(1))
        .await
        .refused(409, "cooldown", Some(ok));
    // Right after it ended, too.
    api.book("alice", "a100", end, end + days(1))
        .await
        .refused(409, "cooldown", Some(ok));
    let b = api.book("alice", "a100", ok, ok + days(1)).await;
    assert_eq!(time_field(b.created(), "start"), Some(ok));
}

#[sqlx::test(migrations = "../migrations")]
async fn cancelling_a_planned_booking_leaves_no_cooldown(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let now = api.now();
    let id = api
        .book("alice", "a100", now + days(1), now + days(3))
        .await
        .id();
    let r = api.delete("alice", id).await;
    let b = r.ok();
    assert_eq!(status_of(b), "cancelled");
    assert_eq!(time_field(b, "cancelled_at"), Some(now));
    assert_eq!(b["ended_early_at"], Value::Null);
    // The unit is free and no cooldown applies: the same window, and one
    // starting right now, are both bookable at once.
    api.book("bob", "a100", now + days(1), now + days(3))
        .await
        .created();
    let r = api.book("alice", "a100", now, now + days(1)).await;
    assert_eq!(status_of(r.created()), "active");
    assert_eq!(
        api.sql_count("SELECT count(*) FROM audit_event WHERE action = 'booking.cancel'")
            .await,
        1
    );
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn deleting_a_booking_at_its_first_instant_cancels_it(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let now = api.now();
    let id = api.book("alice", "a100", now, now + days(2)).await.id();
    let b = api.delete("alice", id).await;
    assert_eq!(
        status_of(b.ok()),
        "cancelled",
        "ending at its start would leave an empty booking"
    );
    api.book("alice", "a100", now, now + days(1))
        .await
        .created();
}

#[sqlx::test(migrations = "../migrations")]
async fn ending_early_starts_the_cooldown_then(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let now = api.now();
    let booked_end = now + days(5);
    let id = api.book("alice", "a100", now, booked_end).await.id();
    let early = now + days(2) + hours(3) + secs(7);
    api.clock.set(early);
    let r = api.delete("alice", id).await;
    let b = r.ok();
    assert_eq!(status_of(b), "ended");
    assert_eq!(time_field(b, "end"), Some(early));
    assert_eq!(time_field(b, "booked_end"), Some(booked_end));
    assert_eq!(time_field(b, "ended_early_at"), Some(early));
    assert_eq!(b["cancelled_at"], Value::Null);
    assert_eq!(
        api.sql_count("SELECT count(*) FROM audit_event WHERE action = 'booking.end_early'")
            .await,
        1
    );
    // The unit is free from that moment (1 unit).
    api.book("bob", "a100", early, early + days(1))
        .await
        .created();
    // Cooldown from the real end, not the booked one.
    let ok = early + days(14);
    api.book("alice", "a100", ok - secs(1), ok + days(1))
        .await
        .refused(409, "cooldown", Some(ok));
    api.book("alice", "a100", ok, ok + days(1)).await.created();
    assert!(ok < booked_end + days(14));
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn ended_and_cancelled_bookings_cannot_be_deleted(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 3)]).await;
    let now = api.now();
    let ended = api.book("alice", "a100", now, now + days(1)).await.id();
    let cancelled = api
        .book("bob", "a100", now + days(1), now + days(2))
        .await
        .id();
    api.delete("bob", cancelled).await.ok();
    let early = api.book("carol", "a100", now, now + days(3)).await.id();
    api.clock.set(now + days(1));
    api.delete("carol", early).await.ok();
    assert_eq!(status_of(&api.get_booking(ended).await), "ended");
    let audit_before = api.sql_count("SELECT count(*) FROM audit_event").await;
    for (who, id, what) in [
        ("alice", ended, "ended"),
        ("bob", cancelled, "cancelled"),
        ("carol", early, "ended early"),
    ] {
        let r = api.delete(who, id).await;
        assert_eq!(r.status, 409, "{what}: {}", r.text);
        assert_eq!(r.json["error"], "not_cancellable", "{what}: {}", r.text);
        // An admin cannot either.
        let r = api
            .call(
                Method::DELETE,
                &format!("/api/v1/bookings/{id}"),
                &admin(),
                None,
            )
            .await;
        assert_eq!(r.status, 409, "{what} by an admin: {}", r.text);
    }
    assert_eq!(
        api.sql_count("SELECT count(*) FROM audit_event").await,
        audit_before,
        "refusals are not audited as changes"
    );
    // And nothing moved.
    let b = api.get_booking(early).await;
    assert_eq!(time_field(&b, "end"), Some(now + days(1)));
}

// ---------------------------------------------------------------------------
// Capacity

async fn capacity_with_units(pool: PgPool, n: i32) {
    let api = Api::new(pool, &[("gpu", n)]).await;
    let now = api.now();
    let (s, e) = (now + days(1), now + days(3));
    let mut slots = Vec::new();
    for i in 0..n {
        let r = api.book(&format!("user{i}"), "gpu", s, e).await;
        slots.push(r.created()["slot"].as_i64().unwrap());
    }
    slots.sort_unstable();
    assert_eq!(
        slots,
        (0..i64::from(n)).collect::<Vec<_>>(),
        "each booking holds its own unit"
    );
    // The N+1th, fully inside, partly overlapping at either end, or covering.
    let extra = format!("user{n}");
    api.book(&extra, "gpu", s, e)
        .await
        .refused(409, "capacity", Some(e));
    api.book(&extra, "gpu", s + hours(12), e + days(1))
        .await
        .refused(409, "capacity", Some(e));
    api.book(&extra, "gpu", s - days(1) + hours(1), s + hours(1))
        .await
        .refused(409, "capacity", Some(e));
    api.book(&extra, "gpu", e - secs(1), e + days(1))
        .await
        .refused(409, "capacity", Some(e));
    // Touching windows fit: [e, ...) and [..., s).
    let r = api.book(&extra, "gpu", e, e + days(1)).await;
    r.created();
    api.book(&format!("user{}", n + 1), "gpu", s - days(1), s)
        .await
        .created();
    // With one unit, the first free day is after the extra booking; with more,
    // now (only user{n+1} holds a unit on day 0).
    let want = if n == 1 { e + days(1) } else { now };
    assert_eq!(
        time_field(
            &api.next_start("late", "gpu", Some(1)).await,
            "earliest_start"
        ),
        Some(want)
    );
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn capacity_with_1_unit(pool: PgPool) {
    capacity_with_units(pool, 1).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn capacity_with_2_units(pool: PgPool) {
    capacity_with_units(pool, 2).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn capacity_with_3_units(pool: PgPool) {
    capacity_with_units(pool, 3).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn capacity_earliest_start_is_where_it_fits(pool: PgPool) {
    // Staggered bookings on 2 units: the earliest start for 2 days is the first
    // end after which 2 days are free of a second booking.
    let api = Api::new(pool, &[("gpu", 2)]).await;
    let now = api.now();
    api.book("a", "gpu", now, now + days(4)).await.created();
    api.book("b", "gpu", now + days(1), now + days(3))
        .await
        .created();
    api.book("c", "gpu", now + days(4), now + days(6))
        .await
        .created();
    api.book("d", "gpu", now + days(5), now + days(10))
        .await
        .created();
    // [1,3) is full (a, b); from day 3 two days hold one booking at a time
    // (a until 4, c from 4, d from 5 only after).
    api.book("x", "gpu", now + days(1), now + days(3))
        .await
        .refused(409, "capacity", Some(now + days(3)));
    api.book("x", "gpu", now + days(3), now + days(5))
        .await
        .created();
    // Now [3,4) has a,x; [4,5) c,x; [5,6) c,d: full until day 6.
    api.book("y", "gpu", now + days(3), now + days(5))
        .await
        .refused(409, "capacity", Some(now + days(6)));
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cancellation_gap_is_used_by_moving_a_planned_booking(pool: PgPool) {
    let api = Api::new(pool, &[("gpu", 2)]).await;
    let now = api.now();
    let a = api.book("a", "gpu", now + days(1), now + days(5)).await;
    assert_eq!(a.created()["slot"], 0);
    let d = api.book("d", "gpu", now + days(6), now + days(12)).await;
    assert_eq!(d.created()["slot"], 0);
    let c = api.book("c", "gpu", now + days(8), now + days(12)).await;
    assert_eq!(c.created()["slot"], 1, "slot 0 is d's");
    let c_id = c.id();
    api.delete("d", d.id()).await.ok();
    // Slot 0: a [1,5); slot 1: c [8,12). A booking over [3,10) fits by count
    // (never more than 2 at once) but no slot is free all along unless c moves.
    let e = api.book("e", "gpu", now + days(3), now + days(10)).await;
    let e_slot = e.created()["slot"].as_i64().unwrap();
    let c_slot = api.get_booking(c_id).await["slot"].as_i64().unwrap();
    assert_ne!(e_slot, c_slot);
    assert_eq!((e_slot, c_slot), (1, 0), "c moved to slot 0, e took slot 1");
    api.assert_invariants().await;
    // Full now: nothing else fits over [3,5).
    api.book("f", "gpu", now + days(3), now + days(5))
        .await
        .refused(409, "capacity", Some(now + days(5)));
}

#[sqlx::test(migrations = "../migrations")]
async fn started_bookings_keep_their_slot_when_planned_ones_move(pool: PgPool) {
    let api = Api::new(pool, &[("gpu", 2)]).await;
    let now = api.now();
    let z = api.book("z", "gpu", now, now + days(3)).await;
    assert_eq!(z.created()["slot"], 0);
    let a = api.book("a", "gpu", now + days(2), now + days(4)).await;
    assert_eq!(a.created()["slot"], 1, "slot 0 is z's until day 3");
    let c = api.book("c", "gpu", now + days(6), now + days(8)).await;
    assert_eq!(c.created()["slot"], 0);
    // Once a has started it keeps slot 1: e over [3,7) fits by count but slot 0
    // is c's from day 6 and slot 1 a's until day 4, so c moves to slot 1.
    api.clock.set(now + days(2) + hours(12));
    let e = api.book("e", "gpu", now + days(3), now + days(7)).await;
    assert_eq!(e.created()["slot"], 0);
    assert_eq!(
        api.get_booking(a.id()).await["slot"],
        1,
        "an active booking never changes slot"
    );
    assert_eq!(api.get_booking(z.id()).await["slot"], 0);
    assert_eq!(api.get_booking(c.id()).await["slot"], 1);
    api.assert_invariants().await;
}

// ---------------------------------------------------------------------------
// Admins

#[sqlx::test(migrations = "../migrations")]
async fn admin_override_skips_the_rules_but_not_capacity_or_overlap(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2), ("one", 1)]).await;
    let now = api.now();
    // A past booking (an import), ending 9 days ago: alice is in her cooldown.
    let past = api
        .admin_book("alice", "a100", now - days(10), now - days(9), true)
        .await;
    let p = past.created();
    assert_eq!(status_of(p), "ended");
    assert_eq!(p["override"], true);
    assert_eq!(p["user"], "alice");
    // Without the override she is refused (cooldown) ...
    api.book("alice", "a100", now + days(1), now + days(2))
        .await
        .refused(409, "cooldown", Some(now - days(9) + days(14)));
    // ... with it, a 2-hour booking inside the cooldown is accepted,
    let short = api
        .admin_book(
            "alice",
            "a100",
            now + days(1),
            now + days(1) + hours(2),
            true,
        )
        .await;
    assert_eq!(status_of(short.created()), "planned");
    // and a second planned one, and one over 14 days, and one starting in the past.
    api.admin_book(
        "alice",
        "a100",
        now + days(3),
        now + days(3) + secs(1),
        true,
    )
    .await
    .created();
    api.admin_book("alice", "a100", now + days(20), now + days(50), true)
        .await
        .created();
    api.admin_book("alice", "a100", now - hours(1), now + hours(1), true)
        .await
        .created();
    let overrides = api
        .call(
            Method::GET,
            "/api/v1/audit?action=booking.create_override",
            &admin(),
            None,
        )
        .await;
    let overrides = overrides.ok().as_array().unwrap().clone();
    assert_eq!(overrides.len(), 5, "{overrides:?}");
    for e in &overrides {
        assert_eq!(e["actor"], "root@lab");
        assert_eq!(e["user"], "alice");
        assert!(e["booking_id"].as_i64().is_some());
    }
    // The user's own overlap still refuses.
    api.admin_book(
        "alice",
        "a100",
        now + days(1) + hours(1),
        now + days(2),
        true,
    )
    .await
    .refused(409, "overlap", None);
    api.admin_book(
        "alice",
        "a100",
        now - days(9) - secs(1),
        now - days(8),
        true,
    )
    .await
    .refused(409, "overlap", None);
    // Capacity still refuses: "one" has one unit, held by bob.
    api.book("bob", "one", now + days(5), now + days(7))
        .await
        .created();
    let r = api
        .admin_book(
            "carol",
            "one",
            now + days(6),
            now + days(6) + hours(2),
            true,
        )
        .await;
    r.refused(409, "capacity", Some(now + days(7)));
    // And 2 units of a100 are 2 units, override or not.
    api.admin_book(
        "dave",
        "a100",
        now + days(1),
        now + days(1) + hours(1),
        true,
    )
    .await
    .created();
    api.admin_book(
        "erin",
        "a100",
        now + days(1),
        now + days(1) + hours(1),
        true,
    )
    .await
    .refused(409, "capacity", Some(now + days(1) + hours(1)));
    // An empty window is never accepted.
    api.admin_book("erin", "a100", now + days(90), now + days(90), true)
        .await
        .refused(422, "invalid_window", None);
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn admin_booking_for_a_user_obeys_that_users_rules(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    // The admin has an active booking of their own: it does not matter.
    api.call(
        Method::POST,
        "/api/v1/bookings",
        &admin(),
        Some(json!({"model": "a100", "start": rfc(now), "end": rfc(now + days(2))})),
    )
    .await
    .created();
    api.book("alice", "a100", now + days(1), now + days(2))
        .await
        .created();
    api.admin_book("alice", "a100", now + days(30), now + days(31), false)
        .await
        .refused(409, "future_booking_exists", Some(now + days(16)));
    api.admin_book("bob", "a100", now - secs(1), now + days(1), false)
        .await
        .refused(422, "start_in_past", Some(now));
    api.admin_book("bob", "a100", now, now + hours(2), false)
        .await
        .refused(422, "duration_too_short", None);
    let r = api
        .admin_book("bob", "a100", now, now + days(1), false)
        .await;
    let b = r.created();
    assert_eq!(b["user"], "bob");
    assert_eq!(b["override"], false);
    assert_eq!(status_of(b), "active");
    // Bob's rules now apply to bob, whoever books.
    api.book("bob", "a100", now + days(20), now + days(21))
        .await
        .refused(409, "active_booking_exists", Some(now + days(15)));
    let events = api
        .call(
            Method::GET,
            "/api/v1/audit?action=booking.create&user=bob",
            &admin(),
            None,
        )
        .await;
    let events = events.ok().as_array().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["actor"], "root@lab");
    // Bob sees it as his.
    let mine = api
        .call(Method::GET, "/api/v1/bookings", &user("bob"), None)
        .await;
    assert_eq!(mine.ok().as_array().unwrap().len(), 1);
}

// ---------------------------------------------------------------------------
// next-start

#[sqlx::test(migrations = "../migrations")]
async fn next_start_in_each_situation(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2), ("one", 1)]).await;
    let now = api.now();
    let codes = |v: &Value| -> Vec<(String, Option<DateTime<Utc>>)> {
        v["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["code"].as_str().unwrap().to_string(),
                    time_field(r, "until"),
                )
            })
            .collect()
    };

    // Nothing in the way.
    let n = api.next_start("alice", "a100", None).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now));
    assert_eq!(time_field(&n, "earliest_end"), Some(now + days(1)));
    assert_eq!(n["days"], 1);
    assert_eq!(n["reasons"], json!([]));

    // An active booking: its end plus the cooldown, both reasons.
    api.book("alice", "a100", now, now + days(2))
        .await
        .created();
    let n = api.next_start("alice", "a100", Some(3)).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(16)));
    assert_eq!(time_field(&n, "earliest_end"), Some(now + days(19)));
    assert_eq!(
        codes(&n),
        vec![
            ("active_booking_exists".into(), Some(now + days(2))),
            ("cooldown".into(), Some(now + days(16)))
        ]
    );

    // A planned booking: its end plus the cooldown.
    api.book("bob", "a100", now + days(1), now + days(3))
        .await
        .created();
    let n = api.next_start("bob", "a100", None).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(17)));
    assert_eq!(
        codes(&n),
        vec![
            ("future_booking_exists".into(), Some(now + days(3))),
            ("cooldown".into(), Some(now + days(17)))
        ]
    );

    // Capacity: "one" is booked by carol for 10 days, then free.
    api.book("carol", "one", now, now + days(10))
        .await
        .created();
    let n = api.next_start("dave", "one", Some(2)).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(10)));
    assert_eq!(codes(&n), vec![("capacity".into(), Some(now + days(10)))]);

    // A gap of exactly 2 days fits 2 days, not 3.
    api.book("erin", "one", now + days(12), now + days(14))
        .await
        .created();
    let n = api.next_start("dave", "one", Some(2)).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(10)));
    let n = api.next_start("dave", "one", Some(3)).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(14)));
    // What next-start says is bookable, to the second.
    api.book("dave", "one", now + days(14) - secs(1), now + days(17))
        .await
        .refused(409, "capacity", Some(now + days(14)));
    api.book("dave", "one", now + days(14), now + days(17))
        .await
        .created();

    // Cooldown and capacity together: frank's cooldown (after an imported
    // booking that ended yesterday) ends on day 13, when "one" is erin's and then
    // dave's until day 17.
    api.admin_book("frank", "a100", now - days(5), now - days(1), true)
        .await
        .created();
    let n = api.next_start("frank", "one", Some(1)).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(17)));
    assert_eq!(
        codes(&n),
        vec![
            ("cooldown".into(), Some(now + days(13))),
            ("capacity".into(), Some(now + days(17)))
        ]
    );

    // After the active booking has ended: the cooldown only; and it is exact.
    api.clock.set(now + days(2));
    let n = api.next_start("alice", "a100", None).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(now + days(16)));
    assert_eq!(codes(&n), vec![("cooldown".into(), Some(now + days(16)))]);
    api.book("alice", "a100", now + days(16) - secs(1), now + days(17))
        .await
        .refused(409, "cooldown", Some(now + days(16)));
    api.book("alice", "a100", now + days(16), now + days(17))
        .await
        .created();
    api.assert_invariants().await;
}

// ---------------------------------------------------------------------------
// schedulability, usage, availability

#[sqlx::test(migrations = "../migrations")]
async fn usage_reports_cards_beside_declared_units(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 4), ("a100", 2)]).await;
    let model = |api_models: &Value, name: &str| {
        api_models
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    // Before any report: nothing counted, no mismatch, no budget advertised.
    let before = api
        .call(Method::GET, "/api/v1/models", &user("carol"), None)
        .await;
    let t4 = model(before.ok(), "t4");
    assert_eq!(
        (t4["cards"].clone(), t4["mismatch"].clone()),
        (Value::Null, json!(false))
    );
    // The controller counts one time-sliced card of t4 (the admin declared 4 units,
    // one per replica): the declared units stay, the disagreement is shown.
    api.call(
        Method::PUT,
        "/api/v1/models/t4/usage",
        &service(),
        Some(json!({"in_use": 1, "cards": 1, "gpumem_advertised": true, "gpumem_unit_mib": 14848})),
    )
    .await
    .ok();
    api.call(
        Method::PUT,
        "/api/v1/models/a100/usage",
        &service(),
        Some(json!({"in_use": 0, "cards": 2, "gpumem_advertised": false})),
    )
    .await
    .ok();
    let after = api
        .call(Method::GET, "/api/v1/models", &user("carol"), None)
        .await;
    let t4 = model(after.ok(), "t4");
    assert_eq!(
        (
            t4["units"].clone(),
            t4["cards"].clone(),
            t4["in_use"].clone(),
            t4["free"].clone(),
            t4["mismatch"].clone()
        ),
        (json!(4), json!(1), json!(1), json!(3), json!(true))
    );
    let a100 = model(after.ok(), "a100");
    assert_eq!(
        (
            a100["units"].clone(),
            a100["cards"].clone(),
            a100["mismatch"].clone()
        ),
        (json!(2), json!(2), json!(false))
    );
    // Only models whose nodes advertise gpumem get a budget at admission.
    let s = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=carol",
            &service(),
            None,
        )
        .await;
    assert_eq!(s.ok()["gpumem_advertised_mib"], json!({"t4": 14848}));
    // A node away for maintenance: cards drop to 0, bookable units do not.
    api.call(
        Method::PUT,
        "/api/v1/models/a100/usage",
        &service(),
        Some(json!({"in_use": 0, "cards": 0})),
    )
    .await
    .ok();
    let away = api
        .call(Method::GET, "/api/v1/models", &user("carol"), None)
        .await;
    let a100 = model(away.ok(), "a100");
    assert_eq!(
        (
            a100["units"].clone(),
            a100["cards"].clone(),
            a100["mismatch"].clone()
        ),
        (json!(2), json!(0), json!(true))
    );
    let now = api.now();
    api.book("dave", "a100", now, now + days(2)).await.created();
}

#[sqlx::test(migrations = "../migrations")]
async fn schedulability_by_user_and_by_slug(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4), ("a6000", 2)]).await;
    let now = api.now();
    let slugs = gpu_booking_core::username::slugs("alice@example.com");
    assert_eq!(slugs.escape, "alice-40example-2ecom");
    assert_eq!(slugs.safe, "alice-example-com---ff8d9819");

    api.call(
        Method::PUT,
        "/api/v1/models/a100/usage",
        &service(),
        Some(json!({"in_use": 1})),
    )
    .await
    .ok();
    api.call(
        Method::PUT,
        "/api/v1/models/a6000/usage",
        &service(),
        Some(json!({"in_use": 2})),
    )
    .await
    .ok();
    let end = now + days(2);
    let id = api.book("alice@example.com", "a100", now, end).await.id();
    api.book("bob", "a6000", now + days(1), now + days(3))
        .await
        .created();

    let free = json!({"a100": 3, "a6000": 0});
    for q in [
        "user=alice%40example.com",
        "slug=alice-40example-2ecom",
        "slug=alice-example-com---ff8d9819",
        "slug=alice%40example.com",
    ] {
        let r = api
            .call(
                Method::GET,
                &format!("/api/v1/schedulability?{q}"),
                &service(),
                None,
            )
            .await;
        let s = r.ok();
        assert_eq!(s["schedulable"], true, "{q}: {s}");
        assert_eq!(time_field(s, "until"), Some(end), "{q}");
        assert_eq!(s["model"], "a100", "{q}");
        assert_eq!(s["booking_id"], id, "{q}");
        assert_eq!(s["user"], "alice@example.com", "{q}");
        assert_eq!(s["free"], free, "{q}");
    }
    // Planned only: not schedulable; when a new booking could start.
    let r = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=bob",
            &service(),
            None,
        )
        .await;
    let s = r.ok();
    assert_eq!(s["schedulable"], false);
    assert_eq!(s["user"], "bob");
    assert_eq!(s["until"], Value::Null);
    assert_eq!(time_field(s, "earliest_booking"), Some(now + days(17)));
    // A slug nobody has: nobody, free units still told.
    let r = api
        .call(
            Method::GET,
            "/api/v1/schedulability?slug=nobody-2dhere",
            &service(),
            None,
        )
        .await;
    let s = r.ok();
    assert_eq!(
        (s["schedulable"].clone(), s["user"].clone()),
        (json!(false), Value::Null)
    );
    assert_eq!(s["free"], free);
    // Usage is what the controller says; more in use than units is 0 free.
    api.call(
        Method::PUT,
        "/api/v1/models/a100/usage",
        &admin(),
        Some(json!({"in_use": 4})),
    )
    .await
    .ok();
    // A count of cards (here under its old name, units) never replaces the declared
    // units: a6000 still has the 2 units its admin declared.
    api.call(
        Method::PUT,
        "/api/v1/models/a6000/usage",
        &service(),
        Some(json!({"in_use": 0, "units": 5})),
    )
    .await
    .ok();
    let r = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=carol",
            &service(),
            None,
        )
        .await;
    assert_eq!(r.ok()["free"], json!({"a100": 0, "a6000": 2}));
    let models = api
        .call(Method::GET, "/api/v1/models", &user("carol"), None)
        .await;
    let models = models.ok().as_array().unwrap().clone();
    let a100 = models.iter().find(|m| m["name"] == "a100").unwrap();
    assert_eq!(
        (
            a100["units"].clone(),
            a100["in_use"].clone(),
            a100["free"].clone()
        ),
        (json!(4), json!(4), json!(0))
    );
    // At the booking's end it is over.
    api.clock.set(end - secs(1));
    let r = api
        .call(
            Method::GET,
            "/api/v1/schedulability?slug=alice-example-com---ff8d9819",
            &service(),
            None,
        )
        .await;
    assert_eq!(r.ok()["schedulable"], true);
    api.clock.set(end);
    let r = api
        .call(
            Method::GET,
            "/api/v1/schedulability?slug=alice-example-com---ff8d9819",
            &service(),
            None,
        )
        .await;
    let s = r.ok();
    assert_eq!(s["schedulable"], false);
    assert_eq!(s["user"], "alice@example.com");
    assert_eq!(time_field(s, "earliest_booking"), Some(end + days(14)));
}

/// `/schedulability` answers most models from one sum of their overlapping units
/// and reads the bookings of the others (`store::models::earliest_starts`); either
/// way, each model's earliest booking is what `/me/next-start` says for it.
#[sqlx::test(migrations = "../migrations")]
async fn schedulability_earliest_booking_per_model_is_next_start(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1), ("a6000", 2), ("l4", 2)]).await;
    let now = api.now();
    // a100: its one unit taken for 5 days, then again from day 6 to 8 with a one-day
    // gap between: a one-day booking fits at day 5 exactly.
    api.book("alice", "a100", now, now + days(5))
        .await
        .created();
    api.book("bob", "a100", now + days(6), now + days(8))
        .await
        .created();
    // a6000: one of two units taken (the bound leaves a unit); l4: two bookings of
    // one unit each that never overlap, but both touch day 0 (an admin's import
    // since noon yesterday, and one from noon today), so the units booked that day
    // (2) leave none: its bookings are read and the answer is still now.
    api.book("carol", "a6000", now, now + days(3))
        .await
        .created();
    api.admin_book("dave", "l4", now - hours(12), now + hours(12), true)
        .await
        .created();
    api.book("erin", "l4", now + hours(12), now + days(3))
        .await
        .created();
    assert_eq!(
        api.sql_count(&format!(
            "SELECT units::bigint FROM booking_day_units WHERE model = 'l4' AND day = {}",
            now.timestamp().div_euclid(86_400)
        ))
        .await,
        2
    );
    let s = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=frank",
            &service(),
            None,
        )
        .await
        .ok()
        .clone();
    let by_model = &s["earliest_booking_by_model"];
    let expected = [("a100", now + days(5)), ("a6000", now), ("l4", now)];
    for (model, start) in expected {
        assert_eq!(time_field(by_model, model), Some(start), "{model}: {s}");
        let n = api.next_start("frank", model, None).await;
        assert_eq!(
            time_field(&n, "earliest_start"),
            Some(start),
            "{model}: {n}"
        );
    }
    assert_eq!(time_field(&s, "earliest_booking"), Some(now));
}

/// The bound next-start and `/schedulability` read first (`booking_day_units`,
/// migration 20261128000100) keeps a booking's units on each UTC day its window
/// touches, and a booking of more than 31 days (an admin's override) is read from
/// the bookings instead: both stand in the way of what they hold.
#[sqlx::test(migrations = "../migrations")]
async fn the_units_per_day_and_a_booking_too_long_for_them_stand_in_the_way(pool: PgPool) {
    let api = Api::new(pool, &[("one", 1), ("two", 2)]).await;
    let now = api.now(); // midnight of day 0
    let day0 = now.timestamp().div_euclid(86_400);
    // Two days from midnight: days 0 and 1, not day 2 (the end is not in the window).
    api.book("alice", "two", now, now + days(2)).await.created();
    let counted = |model: &'static str| {
        let sql = format!(
            "SELECT coalesce(string_agg((day - {day0})::text, ',' ORDER BY day), '')
             FROM booking_day_units WHERE model = '{model}' AND units > 0"
        );
        let pool = api.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(&sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(counted("two").await, "0,1");

    // 41 days for zed on "one": more than 31, so not counted per day.
    let long = api
        .admin_book("zed", "one", now, now + days(41), true)
        .await
        .id();
    assert_eq!(
        counted("one").await,
        "",
        "a 41-day booking is not kept per day"
    );
    let n = api.next_start("dave", "one", None).await;
    assert_eq!(
        time_field(&n, "earliest_start"),
        Some(now + days(41)),
        "{n}"
    );
    let s = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=dave",
            &service(),
            None,
        )
        .await
        .ok()
        .clone();
    let by_model = &s["earliest_booking_by_model"];
    assert_eq!(time_field(by_model, "one"), Some(now + days(41)), "{s}");
    assert_eq!(time_field(by_model, "two"), Some(now), "{s}");

    // Ended early on day 3 (3 days 6 hours in): free from then.
    let early = now + days(3) + hours(6);
    api.clock.set(early);
    api.call(
        Method::DELETE,
        &format!("/api/v1/bookings/{long}"),
        &admin(),
        None,
    )
    .await
    .ok();
    let n = api.next_start("dave", "one", None).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(early), "{n}");
    // Now 4 days long: kept per day, on days 0 to 3.
    assert_eq!(counted("one").await, "0,1,2,3");
    api.assert_invariants().await;
}

/// The webhook's full read (`/admission-state`) holds each user's last ended booking
/// while its cooldown runs, the only rule an ended booking takes part in, and not
/// after: it read every user's whole history before.
#[sqlx::test(migrations = "../migrations")]
async fn admission_state_holds_an_ended_booking_while_its_cooldown_runs(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let now = api.now();
    let alice = api.book("alice", "a100", now, now + days(1)).await.id();
    let bob = api.book("bob", "a100", now, now + days(2)).await.id();
    let carol = api
        .book("carol", "a100", now + days(20), now + days(21))
        .await
        .id();
    let ids = |api_answer: &Value| -> Vec<i64> {
        let mut ids: Vec<i64> = api_answer["bookings"]
            .as_array()
            .expect("a full answer lists bookings")
            .iter()
            .filter_map(|b| b["id"].as_i64())
            .collect();
        ids.sort_unstable();
        ids
    };
    async fn state(api: &Api) -> Value {
        api.call(Method::GET, "/api/v1/admission-state", &service(), None)
            .await
            .ok()
            .clone()
    }
    api.clock.set(now + days(3));
    assert_eq!(ids(&state(&api).await), vec![alice, bob, carol]);
    // Alice's cooldown ends exactly now; Bob's runs another day.
    api.clock.set(now + days(1) + days(14));
    assert_eq!(ids(&state(&api).await), vec![bob, carol]);
    let n = api.next_start("alice", "a100", None).await;
    assert_eq!(time_field(&n, "earliest_start"), Some(api.now()), "{n}");
    let n = api.next_start("bob", "a100", None).await;
    assert_eq!(
        time_field(&n, "earliest_start"),
        Some(now + days(2) + days(14)),
        "{n}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn availability_per_day(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2)]).await;
    let now = api.now(); // midnight of day 0
    api.book(
        "alice",
        "a100",
        now + days(1) + hours(12),
        now + days(3) + hours(12),
    )
    .await
    .created();
    api.book("bob", "a100", now + days(2), now + days(3))
        .await
        .created();
    let carol = api
        .book("carol", "a100", now + days(4), now + days(5))
        .await
        .id();
    api.delete("carol", carol).await.ok();
    let r = api
        .call(
            Method::GET,
            "/api/v1/models/a100/availability?from=2030-01-07&to=2030-01-13",
            &user("x"),
            None,
        )
        .await;
    let a = r.ok();
    assert_eq!(a["model"], "a100");
    assert_eq!(a["units"], 2);
    let days_seen: Vec<(NaiveDate, u64, u64)> = a["days"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["date"].as_str().unwrap().parse().unwrap(),
                d["free"].as_u64().unwrap(),
                d["booked"].as_u64().unwrap(),
            )
        })
        .collect();
    let d = |n: u32| NaiveDate::from_ymd_opt(2030, 1, 7 + n).unwrap();
    assert_eq!(
        days_seen,
        vec![
            (d(0), 2, 0),
            (d(1), 1, 1),
            (d(2), 0, 2),
            (d(3), 1, 1),
            (d(4), 2, 0),
            (d(5), 2, 0)
        ],
        "the cancelled booking of day 4 does not count"
    );
    // Default span: 28 days from today.
    let r = api
        .call(
            Method::GET,
            "/api/v1/models/a100/availability",
            &user("x"),
            None,
        )
        .await;
    let a = r.ok();
    assert_eq!(a["days"].as_array().unwrap().len(), 28);
    assert_eq!(a["days"][0]["date"], "2030-01-07");
}

// ---------------------------------------------------------------------------
// Audit and the database's own guarantees

#[sqlx::test(migrations = "../migrations")]
async fn every_change_is_audited_and_the_audit_table_is_append_only(pool: PgPool) {
    let api = Api::new(pool.clone(), &[("a100", 2)]).await;
    let now = api.now();
    let id = api
        .book("alice", "a100", now + days(1), now + days(2))
        .await
        .id();
    api.delete("alice", id).await.ok();
    let id = api.book("alice", "a100", now, now + days(2)).await.id();
    api.clock.set(now + days(1));
    api.delete("alice", id).await.ok();
    let actions: Vec<String> = sqlx::query_scalar("SELECT action FROM audit_event ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        actions,
        [
            "model.put",
            "booking.create",
            "booking.cancel",
            "booking.create",
            "booking.end_early"
        ]
    );
    let before = api.sql_count("SELECT count(*) FROM audit_event").await;

    for sql in [
        "UPDATE audit_event SET action = 'nothing' WHERE action = 'booking.cancel'",
        "UPDATE audit_event SET details = '{}'",
        "DELETE FROM audit_event WHERE action = 'booking.create'",
        "DELETE FROM audit_event",
        "TRUNCATE audit_event",
    ] {
        let err = sqlx::query(sql).execute(&pool).await.expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    let actions_after: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_event ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(actions_after, actions);
    assert_eq!(
        api.sql_count("SELECT count(*) FROM audit_event").await,
        before
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_exclusion_constraints_are_a_backstop(pool: PgPool) {
    let api = Api::new(pool.clone(), &[("a100", 2)]).await;
    let now = api.now();
    api.book("alice", "a100", now + days(1), now + days(3))
        .await
        .created();
    let insert = |user: &'static str, slot: i32, from: i64, to: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ($1, $1, $1) ON CONFLICT DO NOTHING",
            )
            .bind(user)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO booking (user_name, model, slots, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
                 VALUES ($1, 'a100', ARRAY[$2::integer], $3, $4, $4, 'sql', $3, $3)",
            )
            .bind(user)
            .bind(slot)
            .bind(t0() + days(from))
            .bind(t0() + days(to))
            .execute(&pool)
            .await
        }
    };
    // Same model and slot at the same time: refused by the database itself.
    let err = insert("bob", 0, 2, 4).await.expect_err("slot clash");
    assert!(err.to_string().contains("booking_slot_excl"), "{err}");
    // The same user twice at once, on different slots.
    let err = insert("alice", 1, 2, 4).await.expect_err("user clash");
    assert!(err.to_string().contains("booking_user_excl"), "{err}");
    // Touching is fine.
    insert("bob", 0, 3, 4).await.expect("touching windows");
    api.assert_invariants().await;
}

/// On the 2-unit model `gpu`: a on slot 0 over days [-10,-5), b on slot 1 over
/// [-4,5) (x held slot 0 over [1,5) when b was booked, then cancelled). Returns a's id.
async fn fragmented_past(api: &Api) -> i64 {
    let now = api.now();
    let a = api
        .admin_book("a", "gpu", now - days(10), now - days(5), true)
        .await;
    assert_eq!(a.created()["slot"], 0);
    let x = api.book("x", "gpu", now + days(1), now + days(5)).await;
    assert_eq!(x.created()["slot"], 0);
    let b = api
        .admin_book("b", "gpu", now - days(4), now + days(5), true)
        .await;
    assert_eq!(b.created()["slot"], 1);
    api.delete("x", x.id()).await.ok();
    a.id()
}

/// docs/design.md ("The booking store"): "any booking that fits by count gets a slot". An
/// admin importing a past booking (override, start before now) that fits by
/// count must get one even when the slots are fragmented by started bookings:
/// moving the slot of a booking that has already ended harms nobody.
#[sqlx::test(migrations = "../migrations")]
async fn override_past_window_that_fits_by_count_gets_a_slot(pool: PgPool) {
    let api = Api::new(pool, &[("gpu", 2)]).await;
    let now = api.now();
    fragmented_past(&api).await;
    // d over [-8,-2): with a on [-10,-5) and b on [-4,5), at most 2 at once.
    let r = api
        .admin_book("d", "gpu", now - days(8), now - days(2), true)
        .await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "fits by count (2 units, never more than 2 at once) but was refused: {}",
        r.text
    );
    api.assert_invariants().await;
}

/// Archived bookings (migration 20261201000100: out of the exclusion constraints'
/// indexes) still count for every rule, are still listed, and an admin's past
/// import may still move their slots, as above.
#[sqlx::test(migrations = "../migrations")]
async fn archived_bookings_still_count(pool: PgPool) {
    let api = Api::new(pool.clone(), &[("gpu", 2), ("t4", 1)]).await;
    let now = api.now();
    let a = fragmented_past(&api).await;
    let alice = api
        .admin_book("alice", "t4", now - days(9), now - days(3), true)
        .await
        .id();
    let archived = gpu_booking_api::store::archive::archive_ended(&pool, now - days(1), 100)
        .await
        .unwrap();
    assert_eq!(archived, 2, "a and alice");
    // The cooldown counts from an archived booking's end ...
    api.book("alice", "t4", now + days(1), now + days(2))
        .await
        .refused(409, "cooldown", Some(now - days(3) + days(14)));
    // ... and an override over it is the user's overlap, not a database error.
    api.admin_book("alice", "t4", now - days(4), now - days(2), true)
        .await
        .refused(409, "overlap", None);
    // Listed as before.
    let listed = api
        .call(Method::GET, "/api/v1/bookings?user=alice", &admin(), None)
        .await;
    assert!(
        listed
            .ok()
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["id"] == alice),
        "{}",
        listed.text
    );
    // d over [-8,-2) fits by count only if a's slot moves (a is archived).
    let d = api
        .admin_book("d", "gpu", now - days(8), now - days(2), true)
        .await;
    assert_eq!(d.status, StatusCode::CREATED, "{}", d.text);
    // A moved booking is back in the constraints (only the job archives).
    let a_row: (Vec<i32>, bool) =
        sqlx::query_as("SELECT slots, archived FROM booking WHERE id = $1")
            .bind(a)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(a_row == (vec![0], true) || !a_row.1, "{a_row:?}");
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn list_filters(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2), ("a6000", 2)]).await;
    let now = api.now();
    let a1 = api.book("alice", "a100", now, now + days(2)).await.id();
    let b1 = api
        .book("bob", "a6000", now + days(3), now + days(5))
        .await
        .id();
    let c1 = api
        .admin_book("carol", "a100", now - days(20), now - days(19), true)
        .await
        .id();
    let ids = |r: Resp| -> Vec<i64> {
        r.ok()
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(
        ids(api
            .call(Method::GET, "/api/v1/bookings", &user("alice"), None)
            .await),
        vec![a1]
    );
    // Newest start first.
    assert_eq!(
        ids(api
            .call(Method::GET, "/api/v1/bookings?all=true", &admin(), None)
            .await),
        vec![b1, a1, c1]
    );
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                "/api/v1/bookings?all=true&model=a100",
                &admin(),
                None
            )
            .await),
        vec![a1, c1]
    );
    assert_eq!(
        ids(api
            .call(Method::GET, "/api/v1/bookings?user=carol", &admin(), None)
            .await),
        vec![c1]
    );
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                "/api/v1/bookings?all=true&limit=1",
                &admin(),
                None
            )
            .await),
        vec![b1]
    );
    let from = rfc(now + days(2)).replace('+', "%2B");
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                &format!("/api/v1/bookings?all=true&from={from}"),
                &admin(),
                None
            )
            .await),
        vec![b1],
        "bookings ending after `from` (a1 ends exactly then)"
    );
    let to = rfc(now);
    assert_eq!(
        ids(api
            .call(
                Method::GET,
                &format!("/api/v1/bookings?all=true&to={to}"),
                &admin(),
                None
            )
            .await),
        vec![c1],
        "bookings starting before `to` (a1 starts exactly then)"
    );
}
