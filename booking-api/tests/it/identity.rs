//! Nobody takes another user's booking: names compared as JupyterHub
//! normalises them, a user whose label keys meet another user's refused at booking
//! time, a slug that names several users resolved to nobody (with a bounded number of
//! audit rows), and the strip warning's date equal to `/me/next-start`.
//!
//! Runs on the real Postgres (`DATABASE_URL`), a fresh database per test.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::Router;
use chrono::{DateTime, TimeDelta, Utc};
use common::{rfc_secs as rfc, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::{safe_slug, NameCase};
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"identity-test-secret-0123456789abcdef";

struct Api {
    app: Router,
    pool: PgPool,
}

impl Api {
    async fn new(pool: PgPool, names: NameCase) -> Api {
        let mut state = test_state(
            pool.clone(),
            Policy::default(),
            Arc::new(ManualClock::new(t0())),
            SECRET,
        );
        state.names = names;
        let api = Api {
            app: gpu_booking_api::app::router(state),
            pool,
        };
        for (model, units) in [("a100", 1), ("a6000", 2)] {
            let (status, body) = api
                .call(
                    Method::PUT,
                    &format!("/api/v1/models/{model}"),
                    "root@lab",
                    Some("admin"),
                    Some(json!({"units": units})),
                )
                .await;
            assert!(status.is_success(), "{status}: {body}");
        }
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

    /// `who` books `model` for a day from `start`.
    async fn book(&self, who: &str, model: &str, start: DateTime<Utc>) -> (StatusCode, Value) {
        let body =
            json!({"model": model, "start": rfc(start), "end": rfc(start + TimeDelta::days(1))});
        self.call(Method::POST, "/api/v1/bookings", who, None, Some(body))
            .await
    }

    /// An admin books `[start, end)` for `who`, rules overridden (the past allowed).
    async fn admin_book(&self, who: &str, model: &str, start: DateTime<Utc>, end: DateTime<Utc>) {
        let body = json!({"model": model, "start": rfc(start), "end": rfc(end), "user": who, "override": true});
        let (status, body) = self
            .call(
                Method::POST,
                "/api/v1/bookings",
                "root@lab",
                Some("admin"),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    async fn schedulability(&self, query: &str) -> Value {
        let (status, body) = self
            .call(
                Method::GET,
                &format!("/api/v1/schedulability{query}"),
                "webhook",
                Some("service"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }
}

#[track_caller]
fn assert_collision(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "username_collision", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("another user"),
        "{body}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_name_that_is_another_users_escape_slug_is_refused(pool: PgPool) {
    let api = Api::new(pool, NameCase::Lowercase).await;
    let (status, body) = api.book("alice@example.com", "a100", t0()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // This user's pods would carry the label `alice-40example-2ecom`, Alice's.
    let (status, body) = api.book("alice-40example-2ecom", "a6000", t0()).await;
    assert_collision(status, &body);
    assert_eq!(
        api.count("SELECT count(*) FROM app_user WHERE name = 'alice-40example-2ecom'")
            .await,
        0,
        "the refused user was kept"
    );
    assert_eq!(api.count("SELECT count(*) FROM booking").await, 1);
    // The label still names Alice, and only her.
    let answer = api.schedulability("?slug=alice-40example-2ecom").await;
    assert_eq!(answer["user"], "alice@example.com");
    assert_eq!(answer["schedulable"], true);
    // The other way round: `a-2db` first, then `a-b`, whose 6.x label is `a-2db`.
    let (status, body) = api.book("a-2db", "a6000", t0()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = api.book("a-b", "a6000", t0()).await;
    assert_collision(status, &body);
}

#[sqlx::test(migrations = "../migrations")]
async fn two_names_with_one_safe_slug_are_not_both_users(pool: PgPool) {
    // Found by a birthday search over the suffix (core's username tests hold the
    // same pair): KubeSpawner 7 labels both `collision-test-user-x---a7f36e85`.
    let first = "collision.test.user.x@example.org+80885";
    let second = "collision.test.user.x@example.org+83606";
    assert_eq!(safe_slug(first), safe_slug(second));
    let api = Api::new(pool, NameCase::Lowercase).await;
    let (status, body) = api.book(first, "a100", t0()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = api.book(second, "a6000", t0()).await;
    assert_collision(status, &body);
    let answer = api
        .schedulability(&format!("?slug={}", safe_slug(first)))
        .await;
    assert_eq!(answer["user"], first);
    // A known user books again without tripping over their own keys.
    let (status, body) = api
        .call(Method::GET, "/api/v1/bookings", first, None, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_ambiguous_slug_resolves_to_nobody_with_bounded_audit_rows(pool: PgPool) {
    let api = Api::new(pool, NameCase::Lowercase).await;
    let alice = "alice@example.com";
    api.admin_book(
        alice,
        "a100",
        t0() - TimeDelta::hours(1),
        t0() + TimeDelta::days(2),
    )
    .await;
    // A user known from before collisions were refused, sharing Alice's safe slug
    // (written directly, as the API no longer lets one in).
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('mallory', 'mallory', $1)",
    )
    .bind(safe_slug(alice))
    .execute(&api.pool)
    .await
    .unwrap();
    let answer = api
        .schedulability(&format!("?slug={}", safe_slug(alice)))
        .await;
    assert_eq!(answer["schedulable"], false, "{answer}");
    assert_eq!(answer["user"], Value::Null, "{answer}");
    assert_eq!(answer["earliest_booking"], Value::Null, "{answer}");
    let audited = "SELECT count(*) FROM audit_event WHERE action = 'schedulability.ambiguous_slug'";
    assert_eq!(api.count(audited).await, 1);
    let details: Value = sqlx::query_scalar(
        "SELECT details FROM audit_event WHERE action = 'schedulability.ambiguous_slug'",
    )
    .fetch_one(&api.pool)
    .await
    .unwrap();
    assert_eq!(details["users"], json!([alice, "mallory"]));
    // Asked again and again: the rows stay bounded (a burst of 10, no time passes
    // for the refill that matters here).
    for _ in 0..60 {
        api.schedulability(&format!("?slug={}", safe_slug(alice)))
            .await;
    }
    let rows = api.count(audited).await;
    assert!((1..=11).contains(&rows), "{rows} audit rows");
    // Alice's own name still finds her booking.
    let answer = api.schedulability("?user=alice@example.com").await;
    assert_eq!(answer["schedulable"], true);
}

#[sqlx::test(migrations = "../migrations")]
async fn names_compare_as_jupyterhub_normalises_them(pool: PgPool) {
    let api = Api::new(pool.clone(), NameCase::Lowercase).await;
    let (status, body) = api.book("Alice@Example.COM", "a100", t0()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["user"], "alice@example.com");
    // The pod's annotation (already lowercase from JupyterHub), or any spelling.
    for query in ["?user=alice@example.com", "?user=ALICE@example.com"] {
        let answer = api.schedulability(query).await;
        assert_eq!(answer["schedulable"], true, "{query}: {answer}");
        assert_eq!(answer["user"], "alice@example.com");
    }
    // The same person signing in with another spelling is the same user.
    let (status, body) = api.book("alice@EXAMPLE.com", "a6000", t0()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_ne!(body["error"], "username_collision", "{body}");

    // Case-sensitive: two users.
    let api = Api::new(pool, NameCase::Sensitive).await;
    let (status, body) = api.book("Bob", "a6000", t0() + TimeDelta::days(30)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["user"], "Bob");
    let answer = api.schedulability("?user=bob").await;
    assert_eq!(answer["user"], "bob");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_pod_without_identity_is_answered_free_units_only(pool: PgPool) {
    let api = Api::new(pool, NameCase::Lowercase).await;
    let answer = api.schedulability("").await;
    assert_eq!(answer["schedulable"], false);
    assert_eq!(answer["user"], Value::Null);
    assert_eq!(answer["free"], json!({"a100": 1, "a6000": 2}));
    assert_eq!(answer["earliest_booking"], Value::Null);
    assert_eq!(answer["earliest_booking_by_model"], json!({}));
}

/// The date the webhook's strip warning names is what
/// `/me/next-start` answers, for a user in cooldown and for a full model.
#[sqlx::test(migrations = "../migrations")]
async fn the_strip_date_is_next_start(pool: PgPool) {
    let api = Api::new(pool, NameCase::Lowercase).await;
    // Carol's last booking ended a day ago: cooldown. The one a100 is booked by
    // someone else over the end of her cooldown: capacity pushes her further.
    api.admin_book(
        "carol",
        "a6000",
        t0() - TimeDelta::days(3),
        t0() - TimeDelta::days(1),
    )
    .await;
    api.admin_book(
        "erin",
        "a100",
        t0() + TimeDelta::days(10),
        t0() + TimeDelta::days(20),
    )
    .await;
    // Dave has never booked; the a100 is booked for the next 5 days.
    api.admin_book("frank", "a100", t0(), t0() + TimeDelta::days(5))
        .await;
    for (user, model) in [
        ("carol", "a6000"),
        ("carol", "a100"),
        ("dave", "a100"),
        ("dave", "a6000"),
    ] {
        let answer = api.schedulability(&format!("?user={user}")).await;
        let (status, next) = api
            .call(
                Method::GET,
                &format!("/api/v1/me/next-start?model={model}"),
                user,
                None,
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{next}");
        assert_eq!(
            answer["earliest_booking_by_model"][model], next["earliest_start"],
            "{user} on {model}: {answer} vs {next}"
        );
    }
    let carol = api.schedulability("?user=carol").await;
    assert_eq!(
        carol["earliest_booking_by_model"]["a6000"],
        rfc(t0() + TimeDelta::days(13))
    );
    assert_eq!(
        carol["earliest_booking_by_model"]["a100"],
        rfc(t0() + TimeDelta::days(20))
    );
    assert_eq!(carol["earliest_booking"], rfc(t0() + TimeDelta::days(13)));
    let dave = api.schedulability("?user=dave").await;
    assert_eq!(
        dave["earliest_booking_by_model"]["a100"],
        rfc(t0() + TimeDelta::days(5))
    );
}
