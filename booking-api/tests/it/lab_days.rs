//! Free units per day of the lab's time zone (`GET /api/v1/models/{name}/availability`)
//! on the real Postgres, for a lab in Pacific/Auckland: a lab day spans parts of two
//! or three UTC days, and daylight saving makes one day 25 hours and another 23. Each
//! day's answer is the model's units less those held at its busiest instant, exactly;
//! the days of another zone when the query names one.

use std::sync::Arc;

use axum::http::Method;
use axum::Router;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use common::{rfc, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::common;
use crate::maintenance::{admin, user, SECRET};

/// The lab's service in Auckland, whose rules let the test book short windows of
/// several units, with `a100` of 3 units.
async fn auckland(pool: PgPool) -> Router {
    let policy = Policy {
        min_duration: TimeDelta::hours(1),
        cooldown: TimeDelta::zero(),
        no_booking_while_active: false,
        max_planned: 100,
        max_units_per_booking: 3,
        zone: chrono_tz::Pacific::Auckland,
        ..Policy::default()
    };
    let app = gpu_booking_api::app::router(test_state(
        pool,
        policy,
        Arc::new(ManualClock::new(t0())),
        SECRET,
    ));
    let r = common::call(
        &app,
        Method::PUT,
        "/api/v1/models/a100",
        Some(&admin()),
        Some(&json!({ "units": 3 })),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    app
}

fn utc(y: i32, mo: u32, d: u32, h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, 0, 0).unwrap()
}

async fn book(app: &Router, who: &str, start: DateTime<Utc>, end: DateTime<Utc>, units: u32) {
    let body = json!({"model": "a100", "start": rfc(start), "end": rfc(end), "units": units});
    let r = common::call(
        app,
        Method::POST,
        "/api/v1/bookings",
        Some(&user(who)),
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// The days asked, as (date, free, booked).
async fn days(app: &Router, from: &str, to: &str) -> Vec<(String, u64, u64)> {
    days_of(app, &format!("from={from}&to={to}")).await
}

async fn days_of(app: &Router, query: &str) -> Vec<(String, u64, u64)> {
    let uri = format!("/api/v1/models/a100/availability?{query}");
    let r = common::call(app, Method::GET, &uri, Some(&user("x")), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = r.json_or_null();
    v["days"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["date"].as_str().unwrap().to_owned(),
                d["free"].as_u64().unwrap(),
                d["booked"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn day(date: &str, free: u64, booked: u64) -> (String, u64, u64) {
    (date.to_owned(), free, booked)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_lab_day_counts_its_own_hours_of_two_utc_days(pool: PgPool) {
    let app = auckland(pool).await;
    // New Zealand summer time (+13): the lab's 2030-01-08 is 2030-01-07 11:00 to
    // 2030-01-08 11:00 UTC.
    // Two units at 02:00-04:00 UTC on the 7th: 15:00-17:00 on the lab's 7th.
    book(&app, "carol", utc(2030, 1, 7, 2), utc(2030, 1, 7, 4), 2).await;
    // One unit at 12:00-14:00 UTC on the 7th (01:00-03:00 on the lab's 8th) and a
    // maintenance window of one unit at 01:00-03:00 UTC on the 8th (14:00-16:00 on
    // the lab's 8th): two UTC days, one lab day, never at once.
    book(&app, "alice", utc(2030, 1, 7, 12), utc(2030, 1, 7, 14), 1).await;
    let r = common::call(
        &app,
        Method::POST,
        "/api/v1/maintenance",
        Some(&admin()),
        Some(&json!({
            "model": "a100", "units": 1, "start": rfc(utc(2030, 1, 8, 1)),
            "end": rfc(utc(2030, 1, 8, 3)), "reason": "driver upgrade",
        })),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // Ends at the lab's midnight: not on the 10th.
    book(&app, "dave", utc(2030, 1, 9, 9), utc(2030, 1, 9, 11), 3).await;
    assert_eq!(
        days(&app, "2030-01-07", "2030-01-11").await,
        [
            day("2030-01-07", 1, 2),
            day("2030-01-08", 2, 1),
            day("2030-01-09", 0, 3),
            day("2030-01-10", 3, 0),
        ],
        "the 8th is free for 2 units: its UTC days' busiest instants (2 units on the 7th) are not in it"
    );
    // A time names its lab day: 2030-01-07 20:00 UTC is the lab's 8th.
    assert_eq!(
        days(&app, "2030-01-07T20:00:00Z", "2030-01-09").await,
        [day("2030-01-08", 2, 1)]
    );
    // Another zone's days when asked for: Los Angeles (-8), whose 6th holds carol's
    // 2 units, its 7th alice's unit and the window's apart, its 9th dave's 3.
    assert_eq!(
        days_of(
            &app,
            "from=2030-01-06&to=2030-01-10&time_zone=America/Los_Angeles"
        )
        .await,
        [
            day("2030-01-06", 1, 2),
            day("2030-01-07", 2, 1),
            day("2030-01-08", 3, 0),
            day("2030-01-09", 0, 3)
        ]
    );
    let r = common::call(
        &app,
        Method::GET,
        "/api/v1/models/a100/availability?time_zone=Mars/Olympus",
        Some(&user("x")),
        None,
    )
    .await;
    assert_eq!(r.status, 422, "{}", r.text());
}

#[sqlx::test(migrations = "../migrations")]
async fn daylight_saving_days_are_25_and_23_hours(pool: PgPool) {
    let app = auckland(pool).await;
    // 2030-04-07: clocks go back (+13 to +12), the lab's day runs 2030-04-06 11:00 to
    // 2030-04-07 12:00 UTC. Its last hour (23:00-24:00 local, 11:00-12:00 UTC) is
    // the 7th's, not the 8th's.
    book(&app, "alice", utc(2030, 4, 7, 11), utc(2030, 4, 7, 12), 2).await;
    assert_eq!(
        days(&app, "2030-04-06", "2030-04-09").await,
        [
            day("2030-04-06", 3, 0),
            day("2030-04-07", 1, 2),
            day("2030-04-08", 3, 0),
        ]
    );
    // 2030-09-29: clocks go forward (+12 to +13), the lab's day runs 2030-09-28 12:00
    // to 2030-09-29 11:00 UTC. 11:00-12:00 UTC on the 28th is the 28th's last hour;
    // 11:00-12:00 UTC on the 29th the 30th's first.
    book(&app, "bob", utc(2030, 9, 28, 11), utc(2030, 9, 28, 12), 1).await;
    book(&app, "carol", utc(2030, 9, 29, 11), utc(2030, 9, 29, 12), 3).await;
    assert_eq!(
        days(&app, "2030-09-28", "2030-10-01").await,
        [
            day("2030-09-28", 2, 1),
            day("2030-09-29", 3, 0),
            day("2030-09-30", 0, 3),
        ]
    );
}
