//! Removing a maintenance window or a course reservation on the real Postgres: the
//! hold and all its rows in one transaction (a failure part way leaves every row as
//! it was), its locks taken in the global order (users, then models), and a removal
//! among creates, bookings and windows on its model never deadlocks.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use chrono::{DateTime, NaiveDate, Utc};
use common::{days, hours, rfc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::common;
use crate::maintenance::{admin, user, Api};

/// Every row of `table` as one JSON text, to compare before and after.
async fn snapshot(pool: &PgPool, table: &str) -> String {
    sqlx::query_scalar(&format!(
        "SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), '[]')::text FROM {table} t"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// What a removal writes: the hold, its rows, their day and unit rows, the change
/// stream, the audit log and the notices.
async fn everything(pool: &PgPool) -> Vec<String> {
    let mut out = Vec::new();
    for table in [
        "unit_hold",
        "booking",
        "booking_day_units",
        "booking_unit",
        "booking_change",
        "audit_event",
        "notice",
    ] {
        out.push(snapshot(pool, table).await);
    }
    out
}

/// A row's `ended_early_at` and `cancelled_at`.
type Ended = Option<DateTime<Utc>>;
type Cancelled = Option<DateTime<Utc>>;

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A course of three daily sessions of 2 units on a100, 09:00-11:00 in UTC from
/// 2030-01-10.
async fn course(api: &Api) -> Value {
    crate::reservations::group(&api.pool, "ml101", "prof").await;
    let start = NaiveDate::from_ymd_opt(2030, 1, 10)
        .unwrap()
        .and_hms_opt(9, 0, 0)
        .unwrap();
    let (status, made) = api
        .call(
            Method::POST,
            "/api/v1/reservations",
            &user("prof"),
            Some(json!({
                "model": "a100", "units": 2, "group": "ml101", "title": "ML101 lab session",
                "start": start, "end": start + hours(2), "rrule": "FREQ=DAILY;COUNT=3",
                "time_zone": "UTC",
            })),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    made
}

fn starts(made: &Value) -> Vec<DateTime<Utc>> {
    made["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| serde_json::from_value(o["start"].clone()).unwrap())
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_removal_that_fails_part_way_leaves_every_row_as_it_was(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let made = course(&api).await;
    let id = made["id"].as_i64().unwrap();
    let starts = starts(&made);
    assert_eq!(starts.len(), 3);
    // The first session runs: removing ends it now and cancels the two to come.
    api.clock.set(starts[0] + hours(1));
    let now = api.now();
    let before = everything(&api.pool).await;

    // The second of the rows' updates fails, after the first went through.
    for sql in [
        "CREATE SEQUENCE booking_updates",
        "CREATE FUNCTION refuse_second_update() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN
              IF nextval('booking_updates') >= 2 THEN RAISE EXCEPTION 'refused by the test'; END IF;
              RETURN NEW;
            END $$",
        "CREATE TRIGGER refuse_second_update BEFORE UPDATE ON booking
         FOR EACH ROW EXECUTE FUNCTION refuse_second_update()",
    ] {
        sqlx::query(sql).execute(&api.pool).await.unwrap();
    }
    let uri = format!("/api/v1/reservations/{id}");
    let r = common::call(&api.app, Method::DELETE, &uri, Some(&admin()), None).await;
    assert!(r.status.is_server_error(), "{}: {}", r.status, r.text());
    assert_eq!(
        count(&api.pool, "SELECT last_value FROM booking_updates").await,
        2,
        "one row was changed before the failure"
    );
    assert_eq!(
        everything(&api.pool).await,
        before,
        "the hold, its rows and what follows from them are as they were"
    );
    api.assert_invariants().await;

    // Once the rows can be written: all of it, as one removal and a change per row.
    sqlx::query("DROP TRIGGER refuse_second_update ON booking")
        .execute(&api.pool)
        .await
        .unwrap();
    let (status, body) = api.call(Method::DELETE, &uri, &admin(), None).await;
    assert_eq!(status, 200, "{body}");
    let removed: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT removed_at FROM unit_hold WHERE id = $1")
            .bind(id)
            .fetch_one(&api.pool)
            .await
            .unwrap();
    assert_eq!(removed, Some(now));
    let rows: Vec<(DateTime<Utc>, Ended, Cancelled)> =
        sqlx::query_as(
            "SELECT end_at, ended_early_at, cancelled_at FROM booking WHERE hold_id = $1 ORDER BY start_at",
        )
        .bind(id)
        .fetch_all(&api.pool)
        .await
        .unwrap();
    assert_eq!(
        rows[0],
        (now, Some(now), None),
        "the running session ends now"
    );
    assert!(rows[1..].iter().all(|r| r.2 == Some(now)), "{rows:?}");
    let audited: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_event WHERE at = $1 ORDER BY id")
            .bind(now)
            .fetch_all(&api.pool)
            .await
            .unwrap();
    assert_eq!(
        audited,
        [
            "reservation.remove",
            "booking.end_early",
            "booking.cancel",
            "booking.cancel"
        ]
    );
    let changes: Vec<String> = sqlx::query_scalar(
        "SELECT c.kind FROM booking_change c JOIN booking b ON b.id = c.booking_id
         WHERE b.hold_id = $1 AND c.kind <> 'created' ORDER BY c.seq",
    )
    .bind(id)
    .fetch_all(&api.pool)
    .await
    .unwrap();
    assert_eq!(changes, ["ended_early", "cancelled", "cancelled"]);
    assert_eq!(count(&api.pool, "SELECT count(*) FROM notice").await, 0);
    api.assert_invariants().await;
}

/// Makes a maintenance window of `units` of t4 over `[start, end)`; its id.
async fn window(api: &Api, start: DateTime<Utc>, end: DateTime<Utc>, units: u32) -> i64 {
    let (status, made) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(json!({
                "model": "t4", "units": units, "start": rfc(start), "end": rfc(end),
                "reason": "driver upgrade", "resolve": "cancel",
            })),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    made["id"].as_i64().unwrap()
}

/// While a removal waits for its hold's user's lock, it holds no lock of the model:
/// it takes the user's first, as a create and a resolving window do (taking the
/// model's first, it and a window resolving its rows could each wait for the other).
#[sqlx::test(migrations = "../migrations")]
async fn a_removal_takes_the_users_lock_before_the_models(pool: PgPool) {
    let api = Arc::new(Api::new(pool, &[("t4", 2)]).await);
    let ws = api.now() + days(1);
    let id = window(&api, ws, ws + hours(6), 1).await;
    let owner: String = sqlx::query_scalar("SELECT user_name FROM unit_hold WHERE id = $1")
        .bind(id)
        .fetch_one(&api.pool)
        .await
        .unwrap();

    let mut holder = api.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(7262, hashtext($1))")
        .bind(&owner)
        .execute(&mut *holder)
        .await
        .unwrap();
    let removal = {
        let api = api.clone();
        tokio::spawn(async move {
            api.call(
                Method::DELETE,
                &format!("/api/v1/maintenance/{id}"),
                &admin(),
                None,
            )
            .await
        })
    };
    // Until the removal waits for the user's lock.
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let mut tries = 0;
    while count(&api.pool, waiting).await == 0 {
        tries += 1;
        assert!(tries < 500, "the removal never waited for the user's lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut probe = api.pool.begin().await.unwrap();
    let model_free: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(7264, hashtext('t4'))")
            .fetch_one(&mut *probe)
            .await
            .unwrap();
    probe.rollback().await.unwrap();
    assert!(
        model_free,
        "the removal holds the model's lock while it waits for the user's"
    );

    holder.commit().await.unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), removal)
        .await
        .expect("the removal finishes once the user's lock is free")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    api.assert_invariants().await;
}

/// Removals of windows and courses among bookings, windows that resolve the rows in
/// their way (the removed hold's among them) and courses, all at once on one model,
/// round after round: none fails (a deadlock is a 500), nothing waits for ever, and
/// no instant holds more units than the model has.
#[sqlx::test(migrations = "../migrations")]
async fn a_removal_among_creates_on_its_model_does_not_deadlock(pool: PgPool) {
    let api = Arc::new(Api::new(pool, &[("t4", 3)]).await);
    crate::reservations::group(&api.pool, "ml101", "prof").await;
    for round in 0..6i64 {
        let ws = api.now() + days(2 + 3 * round);
        let held = window(&api, ws, ws + hours(12), 1).await;
        let mut tasks = Vec::new();
        {
            let api = api.clone();
            tasks.push(tokio::spawn(async move {
                let uri = format!("/api/v1/maintenance/{held}");
                let (status, body) = api.call(Method::DELETE, &uri, &admin(), None).await;
                assert_eq!(status, 200, "{body}");
                status
            }));
        }
        for i in 0..4i64 {
            let api = api.clone();
            tasks.push(tokio::spawn(async move {
                let start = ws + hours(2 * i);
                api.book(&format!("u{round}-{i}"), "t4", start, start + days(1))
                    .await
                    .0
            }));
        }
        {
            // Every unit: the removed window's row is in its way until removed.
            let api = api.clone();
            tasks.push(tokio::spawn(async move {
                let start = ws + hours(3);
                api.call(
                    Method::POST,
                    "/api/v1/maintenance",
                    &admin(),
                    Some(json!({
                        "model": "t4", "start": rfc(start), "end": rfc(start + hours(2)),
                        "reason": "cabling", "resolve": "cancel",
                    })),
                )
                .await
                .0
            }));
        }
        {
            let api = api.clone();
            tasks.push(tokio::spawn(async move {
                let start = (ws + hours(1)).naive_utc();
                api.call(
                    Method::POST,
                    "/api/v1/reservations",
                    &user("prof"),
                    Some(json!({
                        "model": "t4", "units": 1, "group": "ml101", "title": format!("session {round}"),
                        "start": start, "end": start + hours(2), "rrule": "FREQ=DAILY;COUNT=2",
                        "time_zone": "UTC", "skip_conflicts": true,
                    })),
                )
                .await
                .0
            }));
        }
        let mut statuses = Vec::new();
        for t in tasks {
            let status = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("no request waits for ever")
                .unwrap();
            statuses.push(status);
        }
        assert!(
            statuses.iter().all(|s| [200, 201, 409, 422].contains(s)),
            "{statuses:?}"
        );
        api.assert_invariants().await;
    }
}
