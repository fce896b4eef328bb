//! GPUs offered back over the API: the controller reports the whole list
//! (`PUT /api/v1/offers`, service role), the service keeps it for the webhook's
//! replica (the admission state), tells each offered user once (a notice), shows the
//! offer on the user's notebook card and answers who opted in to be restarted.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use common::{secs, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::notices::config::NoticeArgs;
use gpu_booking_api::notices::send::Senders;
use gpu_booking_api::notices::{Settings, Worker};
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"offers-test-secret-0123456789abcdef";
const CONTROLLER: (&str, Option<&str>) = ("controller", Some("service"));

fn app(pool: PgPool, clock: &ManualClock) -> axum::Router {
    gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(clock.clone()),
        SECRET,
    ))
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    who: (&str, Option<&str>),
    body: Option<Value>,
) -> (StatusCode, Value) {
    common::call_as(app, SECRET, method, uri, who, body.as_ref()).await
}

fn offer(user: &str, offered_at: DateTime<Utc>) -> Value {
    json!({"user": user, "model": "a100", "units": 1, "namespace": "jhub",
        "pod": format!("jupyter-{user}"), "offered_at": offered_at,
        "until": offered_at + secs(300)})
}

async fn put(app: &axum::Router, offers: Value) -> (StatusCode, Value) {
    call(
        app,
        Method::PUT,
        "/api/v1/offers",
        CONTROLLER,
        Some(json!({ "offers": offers })),
    )
    .await
}

fn users(answer: &Value) -> Vec<&str> {
    answer["offers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["user"].as_str().unwrap())
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_reports_are_refused_and_change_nothing(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let app = app(pool, &clock);
    let (s, _) = put(&app, json!([offer("alice", t0())])).await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = put(&app, json!([offer("bob", t0()), offer("bob", t0())])).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("bob has two"),
        "{body}"
    );
    let mut zero = offer("bob", t0());
    zero["units"] = json!(0);
    let mut backwards = offer("bob", t0());
    backwards["until"] = json!(t0() - secs(1));
    let mut control = offer("bob", t0());
    control["pod"] = json!("a\nb");
    let mut unknown = offer("bob", t0());
    unknown["extra"] = json!(1);
    for bad in [zero, backwards, control] {
        let (s, body) = put(&app, json!([bad])).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let (s, _) = put(&app, json!([unknown])).await;
    assert!(s.is_client_error());
    let many: Vec<Value> = (0..=1000).map(|i| offer(&format!("u{i}"), t0())).collect();
    let (s, _) = put(&app, json!(many)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // Only a service reports; a user reads their own.
    let (s, _) = call(
        &app,
        Method::PUT,
        "/api/v1/offers",
        ("alice", None),
        Some(json!({"offers": []})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Nothing changed: alice's offer is there, for her and the controller.
    let (_, all) = call(&app, Method::GET, "/api/v1/offers", CONTROLLER, None).await;
    assert_eq!(users(&all), vec!["alice"]);
    let (_, own) = call(&app, Method::GET, "/api/v1/offers", ("bob", None), None).await;
    assert!(users(&own).is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn the_admission_state_carries_the_offers_still_held(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let app = app(pool, &clock);
    let (s, _) = put(
        &app,
        json!([offer("alice", t0()), offer("bob", t0() - secs(600))]),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    for full in ["true", "false"] {
        let (s, state) = call(
            &app,
            Method::GET,
            &format!("/api/v1/admission-state?full={full}"),
            CONTROLLER,
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        // Bob's hold is over; alice's holds, read back as it was sent (its row's
        // `state` JSON).
        assert_eq!(users(&state), vec!["alice"], "{state}");
        let sent = offer("alice", t0());
        let read = &state["offers"][0];
        for field in ["user", "model", "units", "namespace", "pod"] {
            assert_eq!(read[field], sent[field], "{field}: {state}");
        }
        for time in ["offered_at", "until"] {
            let at = |v: &Value| v.as_str().and_then(|s| s.parse::<DateTime<Utc>>().ok());
            assert_eq!(at(&read[time]), at(&sent[time]), "{time}: {state}");
        }
    }
    clock.advance(secs(300));
    let (_, state) = call(
        &app,
        Method::GET,
        "/api/v1/admission-state?full=false",
        CONTROLLER,
        None,
    )
    .await;
    assert!(users(&state).is_empty(), "{state}");
}

#[sqlx::test(migrations = "../migrations")]
async fn each_offer_is_told_once_and_shown_on_its_notebook(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let app = app(pool.clone(), &clock);
    let worker = Worker::new(
        pool.clone(),
        Arc::new(clock.clone()),
        Senders::from_args(&NoticeArgs::default()).unwrap(),
        Settings::default(),
    );
    let notices = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT user_name, body FROM notice WHERE kind = 'gpu_offered' ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    put(&app, json!([offer("Alice", t0())])).await;
    worker.round().await.unwrap();
    // The same offer reported again, and another round: still one notice.
    put(&app, json!([offer("Alice", t0())])).await;
    worker.round().await.unwrap();
    let told = notices().await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, "alice", "to the user as the service names them");
    assert!(
        told[0]
            .1
            .starts_with("One a100 GPU is free: restart your server to get it."),
        "{}",
        told[0].1
    );
    // A new offer (after the first expired) is told again.
    clock.advance(secs(400));
    put(&app, json!([offer("Alice", t0() + secs(400))])).await;
    worker.round().await.unwrap();
    assert_eq!(notices().await.len(), 2);

    // The notebook it is for shows it, with "restart" first.
    let report = json!({"bookings": {}, "notebooks": [
        {"user": "alice", "namespace": "jhub", "pod": "jupyter-Alice", "standing": "stripped",
         "why": "on CPU: no free a100 GPU and no active booking", "next": ["book"]},
        {"user": "alice", "namespace": "jhub", "pod": "other", "standing": "stripped",
         "why": "on CPU: no free a100 GPU and no active booking", "next": ["book"]}]});
    let (s, _) = call(
        &app,
        Method::PUT,
        "/api/v1/held-units",
        CONTROLLER,
        Some(report),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (_, mine) = call(
        &app,
        Method::GET,
        "/api/v1/notebooks",
        ("alice", None),
        None,
    )
    .await;
    let nbs = mine["notebooks"].as_array().unwrap();
    let with: Vec<&Value> = nbs.iter().filter(|n| n["offer"].is_object()).collect();
    assert_eq!(with.len(), 1, "{mine}");
    assert_eq!(with[0]["pod"], "jupyter-Alice");
    assert_eq!(with[0]["next"], json!(["restart", "book"]));
    assert_eq!(with[0]["offer"]["until"], json!(t0() + secs(700)));
}

#[sqlx::test(migrations = "../migrations")]
async fn an_opted_in_user_is_restarted_and_a_booked_one_not_offered(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let app = app(pool.clone(), &clock);
    let (s, prefs) = call(
        &app,
        Method::PUT,
        "/api/v1/me/notices",
        ("alice", None),
        Some(
            json!({"email": null, "email_enabled": true, "webhook_enabled": true,
            "muted": [], "restart_on_offer": true}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{prefs}");
    assert_eq!(prefs["prefs"]["restart_on_offer"], true);
    // Settings saved without the field keep the choice.
    call(
        &app,
        Method::PUT,
        "/api/v1/me/notices",
        ("alice", None),
        Some(json!({"email": null, "email_enabled": false, "webhook_enabled": true, "muted": []})),
    )
    .await;
    // Carol has a booking now: her spawn is booked anyway.
    for setup in [
        "INSERT INTO gpu_model (name, units) VALUES ('a100', 2)",
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('carol', 'carol', 'carol')",
    ] {
        sqlx::query(setup).execute(&pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at,
                              created_by, created_at, updated_at)
         VALUES ('carol', 'a100', '{0}', 1, $1, $2, $2, 'sql', $1, $1)",
    )
    .bind(t0() - secs(60))
    .bind(t0() + secs(3600))
    .execute(&pool)
    .await
    .unwrap();
    let (s, answer) = put(
        &app,
        json!([
            offer("alice", t0()),
            offer("bob", t0()),
            offer("carol", t0())
        ]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let restart: Vec<(&str, bool)> = answer["offers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["user"].as_str().unwrap(), o["restart"].as_bool().unwrap()))
        .collect();
    assert_eq!(restart, vec![("alice", true), ("bob", false)]);
    assert_eq!(answer["booked"], json!(["carol"]));
    let (_, all) = call(&app, Method::GET, "/api/v1/offers", CONTROLLER, None).await;
    assert_eq!(users(&all), vec!["alice", "bob"]);
}
