//! The waitlist through the API on the real Postgres: entries held in order per model,
//! booked the moment one fits (a cancellation, an early end, more units) with every
//! rule applied, the user notified once (an audit row `waitlist.booked`), positions,
//! cancellation, expiry and bad input; and several cancellations racing over two
//! replicas turning one entry into exactly one booking.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::Router;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use common::{days, rfc, t0};
use gpu_booking_api::clock::{Clock, ManualClock, SystemClock};
use gpu_booking_api::testing::{test_state, token_for, TestApi};
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"waitlist-test-secret-0123456789abcdef";

fn admin() -> String {
    token_for(SECRET, "root@lab", Some("admin"))
}
fn user(name: &str) -> String {
    token_for(SECRET, name, None)
}
fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().expect("a time"))
        .expect("RFC 3339")
        .with_timezone(&Utc)
}

struct Api {
    app: Router,
    clock: ManualClock,
    pool: PgPool,
    policy: Policy,
}

impl Api {
    async fn new(pool: PgPool, models: &[(&str, i32)]) -> Api {
        let clock = ManualClock::new(t0());
        let policy = Policy::default();
        let app = gpu_booking_api::app::router(test_state(
            pool.clone(),
            policy.clone(),
            Arc::new(clock.clone()),
            SECRET,
        ));
        let api = Api {
            app,
            clock,
            pool,
            policy,
        };
        for (name, units) in models {
            api.put_units(name, *units).await;
        }
        api
    }

    async fn put_units(&self, name: &str, units: i32) {
        let (status, body) = self
            .call(
                Method::PUT,
                &format!("/api/v1/models/{name}"),
                &admin(),
                Some(json!({ "units": units })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let r = common::call(&self.app, method, uri, Some(token), body.as_ref()).await;
        assert!(!r.status.is_server_error(), "{}: {}", r.status, r.text());
        (r.status, r.json_or_null())
    }

    async fn book(&self, who: &str, model: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> i64 {
        let (status, body) = self
            .call(
                Method::POST,
                "/api/v1/bookings",
                &user(who),
                Some(json!({"model": model, "start": rfc(start), "end": rfc(end)})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    async fn join(&self, who: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/api/v1/waitlist", &user(who), Some(body))
            .await
    }

    async fn mine(&self, who: &str) -> Vec<Value> {
        let (status, body) = self
            .call(Method::GET, "/api/v1/waitlist", &user(who), None)
            .await;
        assert_eq!(status, StatusCode::OK);
        body.as_array().unwrap().clone()
    }

    async fn audits(&self, action: &str, who: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE action = $1 AND user_name = $2")
            .bind(action)
            .bind(who)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn an_entry_that_fits_at_once_is_booked_at_once(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let from = t0() + days(1);
    let (status, entry) = api
        .join(
            "ann",
            json!({"model": "a100", "from": rfc(from), "days": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{entry}");
    assert_eq!(entry["state"], "booked");
    assert!(entry.get("position").is_none());
    let id = entry["booking_id"].as_i64().unwrap();
    let (_, booking) = api
        .call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &user("ann"),
            None,
        )
        .await;
    assert_eq!(time(&booking["start"]), from);
    assert_eq!(time(&booking["end"]), from + days(3));
    assert_eq!(api.audits("waitlist.booked", "ann").await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_cancellation_books_the_first_entry_in_line(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let holder = api
        .book("hal", "a100", t0() + days(1), t0() + days(8))
        .await;
    let wish = |d: i64| json!({"model": "a100", "from": rfc(t0() + days(1)), "latest_start": rfc(t0() + days(3)), "days": d});
    let (status, first) = api.join("ann", wish(3)).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(
        (first["state"].as_str(), first["position"].as_i64()),
        (Some("waiting"), Some(1))
    );
    let (_, second) = api.join("bob", wish(1)).await;
    assert_eq!(second["position"], 2);

    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{holder}"),
            &user("hal"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // ann was first: she gets the unit from day 1; bob waits on, now first in line.
    let ann = api.mine("ann").await;
    assert_eq!(ann[0]["state"], "booked", "{ann:?}");
    let id = ann[0]["booking_id"].as_i64().unwrap();
    let (_, booking) = api
        .call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &user("ann"),
            None,
        )
        .await;
    assert_eq!(time(&booking["start"]), t0() + days(1));
    assert_eq!(booking["user"], "ann");
    let bob = api.mine("bob").await;
    assert_eq!(
        (bob[0]["state"].as_str(), bob[0]["position"].as_i64()),
        (Some("waiting"), Some(1))
    );
    assert_eq!(api.audits("waitlist.booked", "ann").await, 1);
    assert_eq!(api.audits("waitlist.booked", "bob").await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn an_early_end_and_more_units_book_waiting_entries(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    let running = api.book("hal", "a100", t0(), t0() + days(10)).await;
    let soon = json!({"model": "a100", "days": 2, "latest_start": rfc(t0() + days(1))});
    let (_, entry) = api.join("ann", soon.clone()).await;
    assert_eq!(entry["state"], "waiting", "{entry}");
    let (_, other) = api.join("bob", soon).await;
    assert_eq!(other["position"], 2);

    // An early end: ann, first in line, gets the unit from now; bob's first window
    // would then start after hers, past his latest start.
    api.clock.advance(TimeDelta::hours(5));
    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{running}"),
            &user("hal"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let ann = api.mine("ann").await;
    assert_eq!(ann[0]["state"], "booked", "{ann:?}");
    assert_eq!(api.mine("bob").await[0]["state"], "waiting");

    // A second unit: bob's turn.
    api.put_units("a100", 2).await;
    let bob = api.mine("bob").await;
    assert_eq!(bob[0]["state"], "booked", "{bob:?}");
    assert_eq!(api.audits("waitlist.booked", "bob").await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_rules_apply_to_the_booking_made_and_entries_expire(pool: PgPool) {
    let api = Api::new(pool.clone(), &[("a100", 2)]).await;
    // ann's last booking ended at t0: cooldown until t0 + 14 days.
    let ended = api.book("ann", "a100", t0(), t0() + days(2)).await;
    api.clock.advance(TimeDelta::hours(1));
    api.call(
        Method::DELETE,
        &format!("/api/v1/bookings/{ended}"),
        &user("ann"),
        None,
    )
    .await;
    let cooldown_end = t0() + TimeDelta::hours(1) + days(14);
    // The model is free, but not for her before the cooldown ends.
    let (_, early) = api
        .join(
            "ann",
            json!({"model": "a100", "days": 1, "latest_start": rfc(t0() + days(5))}),
        )
        .await;
    assert_eq!(early["state"], "waiting", "{early}");
    // The sweep after the latest start: expired, and told so.
    api.clock.set(t0() + days(5) + TimeDelta::seconds(1));
    gpu_booking_api::store::waitlist::promote_all(&pool, &api.policy, api.clock.now())
        .await
        .unwrap();
    assert_eq!(api.mine("ann").await[0]["state"], "expired");
    assert_eq!(api.audits("waitlist.expired", "ann").await, 1);
    // Waiting past the cooldown: booked at its end, not before.
    let (_, later) = api
        .join(
            "ann",
            json!({"model": "a100", "days": 1, "latest_start": rfc(t0() + days(20))}),
        )
        .await;
    assert_eq!(later["state"], "booked", "{later}");
    let id = later["booking_id"].as_i64().unwrap();
    let (_, booking) = api
        .call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &user("ann"),
            None,
        )
        .await;
    assert_eq!(time(&booking["start"]), cooldown_end);
}

#[sqlx::test(migrations = "../migrations")]
async fn entries_are_cancelled_by_their_owner_only(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 1)]).await;
    api.book("hal", "a100", t0(), t0() + days(10)).await;
    let (_, entry) = api.join("ann", json!({"model": "a100", "days": 1})).await;
    let id = entry["id"].as_i64().unwrap();
    let path = format!("/api/v1/waitlist/{id}");
    let (status, _) = api.call(Method::DELETE, &path, &user("bob"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = api.call(Method::DELETE, &path, &user("ann"), None).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, body) = api.call(Method::DELETE, &path, &user("ann"), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_cancellable"))
    );
    assert_eq!(api.audits("waitlist.cancel", "ann").await, 1);
    // Admins see everyone's entries; users do not.
    let (status, _) = api
        .call(Method::GET, "/api/v1/waitlist?all=true", &user("ann"), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, all) = api
        .call(Method::GET, "/api/v1/waitlist?all=true", &admin(), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all.as_array().map(Vec::len), Some(1));
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_requests_change_nothing(pool: PgPool) {
    let api = Api::new(pool.clone(), &[("a100", 1)]).await;
    api.book("hal", "a100", t0(), t0() + days(10)).await;
    for (body, status, code) in [
        (
            json!({"model": "a100", "days": 1, "hours": 2}),
            422,
            "invalid_request",
        ),
        (json!({"model": "a100"}), 422, "invalid_request"),
        (json!({"model": "a100", "days": 0}), 422, "invalid_request"),
        (
            json!({"model": "a100", "days": 15}),
            422,
            "duration_too_long",
        ),
        (
            json!({"model": "a100", "hours": 3}),
            422,
            "duration_too_short",
        ),
        (json!({"model": "h200", "days": 1}), 422, "unknown_model"),
        (
            json!({"model": "a100", "days": 1, "latest_start": rfc(t0() - days(1))}),
            422,
            "invalid_window",
        ),
        (
            json!({"model": "a100", "days": 1, "latest_start": rfc(t0() + days(400))}),
            422,
            "invalid_window",
        ),
        (
            json!({"model": "a100", "days": 1, "user": "bob"}),
            403,
            "forbidden",
        ),
        (
            json!({"model": "a100", "days": 1, "colour": "red"}),
            400,
            "bad_request",
        ),
    ] {
        let (got, resp) = api.join("ann", body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body} -> {resp}");
        assert_eq!(resp["error"], code, "{body} -> {resp}");
    }
    let entries: i64 = sqlx::query_scalar("SELECT count(*) FROM waitlist_entry")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(entries, 0);
    // One waiting entry per user and model.
    let (status, _) = api.join("ann", json!({"model": "a100", "days": 1})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = api.join("ann", json!({"model": "a100", "days": 2})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_waiting"))
    );
}

/// One entry, six bookings in the way, six cancellations at once over two replicas of
/// the API: exactly one booking for the entry. The policy lets one user hold several
/// short bookings back to back (no cooldown, ten planned), so a second promotion of
/// the same entry would succeed (the hour after the first): only the entry's
/// once-only promotion stands in the way.
#[sqlx::test(migrations = "../migrations")]
async fn racing_cancellations_book_an_entry_exactly_once(pool: PgPool) {
    let policy = Policy {
        min_duration: TimeDelta::hours(1),
        cooldown: TimeDelta::zero(),
        no_booking_while_active: false,
        max_planned: 10,
        ..Policy::default()
    };
    let replicas = [
        TestApi::start_with(pool.clone(), policy.clone(), Arc::new(SystemClock))
            .await
            .unwrap(),
        TestApi::start_with(pool.clone(), policy.clone(), Arc::new(SystemClock))
            .await
            .unwrap(),
    ];
    let http = reqwest::Client::new();
    const HOLDERS: usize = 6;
    const ROUNDS: usize = 4;
    for round in 0..ROUNDS {
        let model = format!("m{round}");
        let r = http
            .put(format!("{}/api/v1/models/{model}", replicas[0].url))
            .bearer_auth(replicas[0].token("root@lab", Some("admin")))
            .json(&json!({"units": HOLDERS}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let start = Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap() + TimeDelta::hours(2);
        let mut ids = Vec::new();
        for h in 0..HOLDERS {
            let r = http
                .post(format!("{}/api/v1/bookings", replicas[0].url))
                .bearer_auth(replicas[0].token(&format!("holder{h}-{round}"), None))
                .json(&json!({"model": model, "start": start, "end": start + TimeDelta::hours(4)}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            ids.push(r.json::<Value>().await.unwrap()["id"].as_i64().unwrap());
        }
        let waiter = format!("waiter-{round}");
        let r = http
            .post(format!("{}/api/v1/waitlist", replicas[1].url))
            .bearer_auth(replicas[1].token(&waiter, None))
            .json(&json!({"model": model, "from": start, "latest_start": start + TimeDelta::hours(1), "hours": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        assert_eq!(r.json::<Value>().await.unwrap()["state"], "waiting");

        let barrier = Arc::new(tokio::sync::Barrier::new(HOLDERS));
        let mut tasks = Vec::new();
        for (h, id) in ids.into_iter().enumerate() {
            let api = &replicas[h % 2];
            let (http, url, token, barrier) = (
                http.clone(),
                api.url.clone(),
                api.token(&format!("holder{h}-{round}"), None),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                http.delete(format!("{url}/api/v1/bookings/{id}"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), 200);
        }
        let booked: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(
            "SELECT id, start_at FROM booking WHERE user_name = $1 AND cancelled_at IS NULL",
        )
        .bind(&waiter)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(booked.len(), 1, "round {round}: {booked:?}");
        assert_eq!(booked[0].1, start);
        let (state, booking): (String, Option<i64>) =
            sqlx::query_as("SELECT state, booking_id FROM waitlist_entry WHERE user_name = $1")
                .bind(&waiter)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!((state.as_str(), booking), ("booked", Some(booked[0].0)));
        let notices: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_event WHERE action = 'waitlist.booked' AND user_name = $1",
        )
        .bind(&waiter)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(notices, 1, "round {round}");
    }
}
