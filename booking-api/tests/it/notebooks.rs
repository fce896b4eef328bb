//! "My notebooks" over the API: the controller reports every user's notebooks with
//! the units held; each user reads their own (`GET /api/v1/notebooks`), admins
//! anyone's, and nobody another's.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use common::t0;
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"notebooks-test-secret-0123456789abcdef";

fn app(pool: PgPool) -> axum::Router {
    gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(ManualClock::new(t0())),
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

fn lent(user: &str, pod: &str) -> Value {
    json!({"user": user, "namespace": "jhub", "pod": pod, "standing": "lent",
        "model": "a100", "gpus": 1, "why": "lent without a booking",
        "taken_back_at": "2030-01-07T10:32:00Z",
        "last_activity": "2030-01-07T10:00:00Z", "next": ["book"]})
}

fn stripped(user: &str, pod: &str) -> Value {
    json!({"user": user, "namespace": "jhub", "pod": pod, "standing": "stripped",
        "why": "on CPU: no free a100 GPU and no active booking", "next": ["book"]})
}

async fn report(app: &axum::Router, notebooks: Value) -> StatusCode {
    let body = json!({"bookings": {}, "notebooks": notebooks});
    let (s, _) = call(
        app,
        Method::PUT,
        "/api/v1/held-units",
        ("controller", Some("service")),
        Some(body),
    )
    .await;
    s
}

async fn notebooks_of(
    app: &axum::Router,
    uri: &str,
    who: (&str, Option<&str>),
) -> (StatusCode, Value) {
    call(app, Method::GET, uri, who, None).await
}

fn pods(answer: &Value) -> Vec<&str> {
    answer["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["pod"].as_str().unwrap())
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn each_user_reads_their_own_notebooks_and_only_theirs(pool: PgPool) {
    let app = app(pool);
    // Before any report nothing is known, which is not "none running".
    let (s, none) = notebooks_of(&app, "/api/v1/notebooks", ("alice", None)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        none,
        json!({"user": "alice", "reported_at": null, "notebooks": []})
    );

    let all = json!([
        lent("alice", "jupyter-alice"),
        stripped("Bob", "jupyter-bob"),
        stripped("alice", "jupyter-alice-2")
    ]);
    assert_eq!(report(&app, all).await, StatusCode::OK);
    let (s, alice) = notebooks_of(&app, "/api/v1/notebooks", ("alice", None)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(pods(&alice), ["jupyter-alice", "jupyter-alice-2"]);
    assert_eq!(alice["reported_at"], json!(common::rfc(t0())));
    let first = &alice["notebooks"][0];
    assert_eq!(first["standing"], "lent");
    assert_eq!(first["taken_back_at"], "2030-01-07T10:32:00Z");
    assert_eq!(first["next"], json!(["book"]));
    // Names compare as the service compares them (lowercased by default).
    let (_, bob) = notebooks_of(&app, "/api/v1/notebooks", ("bob", None)).await;
    assert_eq!(pods(&bob), ["jupyter-bob"]);

    // Another user's: refused, for a user, whatever the spelling; an admin reads it.
    for uri in ["/api/v1/notebooks?user=bob", "/api/v1/notebooks?user=BOB"] {
        let (s, body) = notebooks_of(&app, uri, ("alice", None)).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{uri}: {body}");
        assert!(body.get("notebooks").is_none(), "{body}");
    }
    let (s, own) = notebooks_of(&app, "/api/v1/notebooks?user=alice", ("alice", None)).await;
    assert_eq!((s, pods(&own).len()), (StatusCode::OK, 2));
    let (s, by_admin) = notebooks_of(
        &app,
        "/api/v1/notebooks?user=bob",
        ("root@lab", Some("admin")),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(pods(&by_admin), ["jupyter-bob"]);

    // The next report is the whole list: alice's lent notebook is gone.
    assert_eq!(
        report(&app, json!([stripped("alice", "jupyter-alice-2")])).await,
        StatusCode::OK
    );
    let (_, alice) = notebooks_of(&app, "/api/v1/notebooks", ("alice", None)).await;
    assert_eq!(pods(&alice), ["jupyter-alice-2"]);
    let (_, bob) = notebooks_of(&app, "/api/v1/notebooks", ("bob", None)).await;
    assert_eq!(pods(&bob), Vec::<&str>::new());
}

#[sqlx::test(migrations = "../migrations")]
async fn only_the_service_reports_and_a_bad_notebook_changes_nothing(pool: PgPool) {
    let app = app(pool);
    assert_eq!(
        report(&app, json!([lent("alice", "jupyter-alice")])).await,
        StatusCode::OK
    );
    // A user cannot report notebooks, not even their own.
    let (s, _) = call(
        &app,
        Method::PUT,
        "/api/v1/held-units",
        ("alice", None),
        Some(json!({"bookings": {}, "notebooks": [stripped("alice", "fake")]})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let mut two_lines = stripped("alice", "p");
    two_lines["why"] = json!("two\nlines");
    let mut negative = lent("alice", "p");
    negative["gpus"] = json!(-1);
    let mut nameless = lent("", "p");
    nameless["user"] = json!("");
    for bad in [two_lines, negative, nameless] {
        assert_eq!(
            report(&app, json!([bad])).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}"
        );
    }
    let mut unknown = lent("alice", "p");
    unknown["standing"] = json!("borrowed");
    assert_eq!(
        report(&app, json!([unknown])).await,
        StatusCode::BAD_REQUEST
    );
    let (_, alice) = notebooks_of(&app, "/api/v1/notebooks", ("alice", None)).await;
    assert_eq!(
        pods(&alice),
        ["jupyter-alice"],
        "refused reports changed nothing"
    );
    // A query of a name the service refuses is a 422, not a lookup.
    let (s, _) = notebooks_of(
        &app,
        "/api/v1/notebooks?user=%20x",
        ("root@lab", Some("admin")),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}
