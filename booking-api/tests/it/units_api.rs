//! Multi-GPU bookings over the API: `units` on create and list,
//! the policy's maximum, capacity counted in units, and what the webhook is told
//! (the booking's units and the units its pods hold, as the controller counted).

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use common::{days, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"units-api-test-secret-0123456789abcdef";

struct Api {
    app: axum::Router,
}

impl Api {
    async fn new(pool: PgPool, units: i32, max_units: u32) -> Api {
        let policy = Policy {
            max_units_per_booking: max_units,
            ..Policy::default()
        };
        let app = gpu_booking_api::app::router(test_state(
            pool,
            policy,
            Arc::new(ManualClock::new(t0())),
            SECRET,
        ));
        let api = Api { app };
        let (s, _) = api
            .call(
                Method::PUT,
                "/api/v1/models/a100",
                "root@lab",
                Some("admin"),
                Some(json!({"units": units})),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        api
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        who: &str,
        role: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        common::call_as(&self.app, SECRET, method, uri, (who, role), body.as_ref()).await
    }

    async fn book(&self, who: &str, units: Option<u32>, from: i64, to: i64) -> (StatusCode, Value) {
        let mut body = json!({"model": "a100", "start": t0() + days(from), "end": t0() + days(to)});
        if let Some(n) = units {
            body["units"] = json!(n);
        }
        self.call(Method::POST, "/api/v1/bookings", who, None, Some(body))
            .await
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_booking_is_for_its_units_and_capacity_counts_them(pool: PgPool) {
    let api = Api::new(pool.clone(), 4, 3).await;
    // The policy says how many a booking may be for.
    let (s, policy) = api
        .call(Method::GET, "/api/v1/policy", "ann", None, None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(policy["max_units_per_booking"], 3);
    // Default 1; more than the maximum, or none, is refused and changes nothing.
    let (s, one) = api.book("ann", None, 1, 3).await;
    assert_eq!(s, StatusCode::CREATED, "{one}");
    assert_eq!(
        (one["units"].clone(), one["slots"].clone()),
        (json!(1), json!([0]))
    );
    for bad in [4, 0] {
        let (s, body) = api.book("bob", Some(bad), 1, 3).await;
        assert_eq!(
            (s.as_u16(), body["error"].as_str()),
            (422, Some("invalid_units")),
            "{body}"
        );
    }
    let (s, body) = api
        .call(Method::POST, "/api/v1/bookings", "bob", None,
              Some(json!({"model": "a100", "units": -1, "start": t0() + days(1), "end": t0() + days(3)})))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    // 3 more units fit beside ann's one; then the model is full for a 1-unit booking.
    let (s, three) = api.book("bob", Some(3), 2, 4).await;
    assert_eq!(s, StatusCode::CREATED, "{three}");
    assert_eq!(
        (three["units"].clone(), three["slots"].clone()),
        (json!(3), json!([1, 2, 3]))
    );
    let (s, body) = api.book("cat", Some(1), 2, 3).await;
    assert_eq!(
        (s.as_u16(), body["error"].as_str()),
        (409, Some("capacity")),
        "{body}"
    );
    // Two units from day 3 (ann's ended): bob's three and two make five of four
    // until day 4, so the earliest start is day 4.
    let (s, body) = api.book("cat", Some(2), 3, 5).await;
    assert_eq!(
        (s.as_u16(), body["error"].as_str()),
        (409, Some("capacity")),
        "{body}"
    );
    assert_eq!(body["earliest_start"], json!(t0() + days(4)), "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("Fewer than 2"),
        "{body}"
    );
    let (s, body) = api.book("cat", Some(2), 4, 6).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    // Listing shows the units; availability counts them.
    let (_, mine) = api
        .call(Method::GET, "/api/v1/bookings", "bob", None, None)
        .await;
    assert_eq!(mine[0]["units"], 3);
    let (_, avail) = api
        .call(
            Method::GET,
            "/api/v1/models/a100/availability?from=2030-01-09&to=2030-01-10",
            "bob",
            None,
            None,
        )
        .await;
    assert_eq!(avail["days"][0]["booked"], 4, "{avail}");
    // An admin's override may go past the policy's maximum (not past capacity).
    let (s, body) = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            "root@lab",
            Some("admin"),
            Some(
                json!({"model": "a100", "user": "dan", "override": true, "units": 4,
                          "start": t0() + days(20), "end": t0() + days(22)}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let live: i64 = sqlx::query_scalar("SELECT sum(units) FROM booking WHERE cancelled_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(live, 1 + 3 + 2 + 4);
}

#[sqlx::test(migrations = "../migrations")]
async fn planned_multi_unit_bookings_move_to_make_room(pool: PgPool) {
    let api = Api::new(pool, 4, 4).await;
    // ann [1,10) on slot 0; bob [12,20) on slots 1 and 2 (y held slot 0 then, and
    // cancelled): slot 3 is the only one free over [5,15).
    let (s, _) = api.book("ann", Some(1), 1, 10).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, y) = api.book("y", Some(1), 12, 20).await;
    assert_eq!(y["slots"], json!([0]), "{s} {y}");
    let (s, bob) = api.book("bob", Some(2), 12, 20).await;
    assert_eq!(bob["slots"], json!([1, 2]), "{s} {bob}");
    let (s, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{}", y["id"]),
            "y",
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // 3 units over [5,15) would make 5 of 4 from day 12: refused by count.
    let (s, body) = api.book("cat", Some(3), 5, 15).await;
    assert_eq!(body["error"], "capacity", "{s} {body}");
    // 2 units over [5,15) fit by count (3 at once until day 10, 4 from day 12), but
    // only slot 3 is free all along: bob's planned booking moves.
    let (s, cat) = api.book("cat", Some(2), 5, 15).await;
    assert_eq!(s, StatusCode::CREATED, "{cat}");
    assert_eq!(cat["slots"], json!([1, 2]));
    let (_, all) = api
        .call(
            Method::GET,
            "/api/v1/bookings?all=true",
            "root@lab",
            Some("admin"),
            None,
        )
        .await;
    let bob = all
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["user"] == "bob")
        .unwrap();
    assert_eq!(bob["slots"], json!([0, 3]), "{bob}");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_webhook_learns_the_units_and_the_units_held(pool: PgPool) {
    let api = Api::new(pool, 4, 2).await;
    let now = t0();
    let (s, b) = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            "ann",
            None,
            Some(json!({"model": "a100", "units": 2, "start": now, "end": now + days(2)})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let id = b["id"].as_i64().unwrap();
    let ask = || {
        api.call(
            Method::GET,
            "/api/v1/schedulability?user=ann",
            "webhook",
            Some("service"),
            None,
        )
    };
    let (_, a) = ask().await;
    assert_eq!(
        (a["units"].clone(), a["units_held"].clone()),
        (json!(2), json!(0)),
        "{a}"
    );
    // The controller's count; ids of no booking are dropped, not an error.
    let put = |body: Value| {
        api.call(
            Method::PUT,
            "/api/v1/held-units",
            "controller",
            Some("service"),
            Some(body),
        )
    };
    let (s, _) = put(json!({"bookings": {id.to_string(): 1, "999999": 3}})).await;
    assert_eq!(s, StatusCode::OK);
    let (_, a) = ask().await;
    assert_eq!(a["units_held"], 1, "{a}");
    // The whole count each time: left out holds none.
    let (s, _) = put(json!({"bookings": {}})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ask().await.1["units_held"], 0);
    // Only the service reports; bad counts change nothing.
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/held-units",
            "ann",
            None,
            Some(json!({"bookings": {id.to_string(): 0}})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = put(json!({"bookings": {id.to_string(): -1}})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = put(json!({"bookings": {"x": 1}})).await;
    assert_eq!(s.as_u16(), 400);
    // Not booked: no units in the answer.
    let (_, a) = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=bob",
            "webhook",
            Some("service"),
            None,
        )
        .await;
    assert_eq!(
        (a["units"].clone(), a["units_held"].clone()),
        (Value::Null, Value::Null)
    );
}

/// `GET /me/next-start?units=N`: the earliest start with N units of the model free
/// over the whole booking (the same core function as the webhook's strip warning),
/// bookable at that instant; N is checked as a booking's units are.
#[sqlx::test(migrations = "../migrations")]
async fn next_start_waits_for_the_units_asked(pool: PgPool) {
    let api = Api::new(pool, 4, 4).await;
    // From now: ann holds 1 unit until day 3, bob 2 units until day 5; one is free.
    let (s, _) = api.book("ann", Some(1), 0, 3).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api.book("bob", Some(2), 0, 5).await;
    assert_eq!(s, StatusCode::CREATED);
    let next = |units: Option<u32>| {
        let uri = match units {
            Some(n) => format!("/api/v1/me/next-start?model=a100&units={n}"),
            None => "/api/v1/me/next-start?model=a100".to_owned(),
        };
        let api = &api;
        async move { api.call(Method::GET, &uri, "cat", None, None).await }
    };
    let start =
        |v: &Value| -> DateTime<Utc> { v["earliest_start"].as_str().unwrap().parse().unwrap() };
    let (s, one) = next(None).await;
    assert_eq!(s, StatusCode::OK, "{one}");
    assert_eq!((start(&one), &one["units"]), (t0(), &json!(1)));
    assert_eq!(one["reasons"], json!([]));
    for (units, day) in [(1, 0), (2, 3), (3, 5), (4, 5)] {
        let (s, v) = next(Some(units)).await;
        assert_eq!(s, StatusCode::OK, "{units}: {v}");
        assert_eq!(start(&v), t0() + days(day), "{units} unit(s): {v}");
        assert_eq!(v["units"], units);
        if day > 0 {
            assert_eq!(v["reasons"][0]["code"], "capacity", "{v}");
        }
    }
    // Beyond the policy's maximum, or none: refused as a booking would be.
    for units in [0, 5] {
        let (s, v) = next(Some(units)).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_units")),
            "{units}: {v}"
        );
    }
    // What it says is bookable, to the day.
    let (s, v) = api.book("cat", Some(3), 4, 6).await;
    assert_eq!(v["error"], "capacity", "{s} {v}");
    let (s, v) = api.book("cat", Some(3), 5, 7).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}
