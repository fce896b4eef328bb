//! Other workloads and waiting bookings on the real Postgres: the controller's usage
//! report counts the cards that pods of other workloads hold (with their
//! namespaces), and the models show what bookings can really get; its held-units
//! report says why a booking's pod waits, which its owner (and admins) read on the
//! booking while it runs, and which the change stream never carries.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use common::{days, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::wire::{MAX_OTHER_NAMESPACES, MAX_WAITING_LEN};
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"other-workloads-test-secret-0123456789abcdef";

const ADMIN: (&str, Option<&str>) = ("root@lab", Some("admin"));
const SERVICE: (&str, Option<&str>) = ("controller", Some("service"));

struct Api {
    app: axum::Router,
}

impl Api {
    /// The service at `t0` with a100 declared at 4 units.
    async fn new(pool: PgPool) -> Api {
        let app = gpu_booking_api::app::router(test_state(
            pool,
            Policy::default(),
            Arc::new(ManualClock::new(t0())),
            SECRET,
        ));
        let api = Api { app };
        let (s, b) = api
            .call(
                Method::PUT,
                "/api/v1/models/a100",
                ADMIN,
                Some(json!({"units": 4})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        api
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        who: (&str, Option<&str>),
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        common::call_as(&self.app, SECRET, method, uri, who, body.as_ref()).await
    }

    async fn a100(&self) -> Value {
        let (s, models) = self
            .call(Method::GET, "/api/v1/models", ("carol", None), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{models}");
        models
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == "a100"))
            .cloned()
            .expect("a100 listed")
    }

    async fn usage(&self, body: Value) -> (StatusCode, Value) {
        self.call(
            Method::PUT,
            "/api/v1/models/a100/usage",
            SERVICE,
            Some(body),
        )
        .await
    }

    async fn held(&self, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, "/api/v1/held-units", SERVICE, Some(body))
            .await
    }

    /// A booking of one a100 for `user` from `from_days` after t0, for two days.
    async fn book(&self, user: &str, from_days: i64) -> i64 {
        let start = t0() + days(from_days);
        let (s, b) = self
            .call(
                Method::POST,
                "/api/v1/bookings",
                (user, None),
                Some(json!({"model": "a100", "start": start, "end": start + days(2)})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        b["id"].as_i64().unwrap()
    }

    /// `GET /bookings/{id}` as `who`.
    async fn booking(&self, id: i64, who: (&str, Option<&str>)) -> Value {
        let (s, b) = self
            .call(Method::GET, &format!("/api/v1/bookings/{id}"), who, None)
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }

    async fn changes(&self, after: Option<i64>, wait: u64) -> Value {
        let uri = match after {
            Some(a) => format!("/api/v1/booking-changes?after={a}&wait={wait}"),
            None => "/api/v1/booking-changes".to_owned(),
        };
        let (s, b) = self.call(Method::GET, &uri, SERVICE, None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }
}

/// The fields of a model that other workloads concern.
fn others(m: &Value) -> Value {
    json!({
        "in_use": m["in_use"], "free": m["free"], "cards": m["cards"],
        "others_in_use": m["others_in_use"], "other_namespaces": m["other_namespaces"],
        "bookable": m["bookable"], "over_declared": m["over_declared"],
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn a_usage_report_counts_other_workloads_and_the_models_show_what_bookings_can_get(
    pool: PgPool,
) {
    let api = Api::new(pool).await;
    // Nothing reported: nothing known, no warning.
    assert_eq!(
        others(&api.a100().await),
        json!({"in_use": 0, "free": 4, "cards": null, "others_in_use": null,
               "other_namespaces": [], "bookable": null, "over_declared": false})
    );
    // Four cards, two in use, one of them by a training Job in `research` (reported
    // twice and out of order: shown once each, sorted).
    let (s, answer) = api
        .usage(json!({"in_use": 2, "cards": 4, "others_in_use": 1,
                      "other_namespaces": ["training", "research", "research"]}))
        .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let shown = json!({"in_use": 2, "free": 2, "cards": 4, "others_in_use": 1,
                       "other_namespaces": ["research", "training"], "bookable": 3,
                       "over_declared": true});
    assert_eq!(others(&answer), shown);
    assert_eq!(others(&api.a100().await), shown);

    // Refused whole, and nothing changes.
    let too_many: Vec<String> = (0..=MAX_OTHER_NAMESPACES)
        .map(|i| format!("ns-{i}"))
        .collect();
    for bad in [
        json!({"in_use": 0, "cards": 4, "others_in_use": -1}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 100_001}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 1, "other_namespaces": ["Research"]}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 1, "other_namespaces": [""]}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 1, "other_namespaces": ["a.b"]}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 1, "other_namespaces": ["n".repeat(64)]}),
        json!({"in_use": 0, "cards": 4, "others_in_use": 1, "other_namespaces": too_many}),
        json!({"in_use": 0, "cards": 4, "other_namespaces": ["research"]}),
    ] {
        let (s, b) = api.usage(bad.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {b}");
        assert_eq!(b["error"], "invalid_request", "{bad}: {b}");
    }
    // Not a count: a parse error, before any rule.
    let (s, _) = api
        .usage(json!({"in_use": 0, "others_in_use": "one"}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(others(&api.a100().await), shown);

    // At the limits: accepted.
    let most: Vec<String> = (0..MAX_OTHER_NAMESPACES)
        .map(|i| format!("{}{i:02}", "n".repeat(61)))
        .collect();
    let (s, b) = api
        .usage(json!({"in_use": 4, "cards": 4, "others_in_use": 4, "other_namespaces": most}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        (b["other_namespaces"].clone(), b["bookable"].clone()),
        (json!(most), json!(0))
    );

    // A report that does not count other workloads (an older controller) keeps the
    // last count; one that counts none clears it.
    let (s, b) = api.usage(json!({"in_use": 1, "cards": 4})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        (b["others_in_use"].clone(), b["in_use"].clone()),
        (json!(4), json!(1))
    );
    let (s, b) = api
        .usage(json!({"in_use": 1, "cards": 4, "others_in_use": 0}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        others(&b),
        json!({"in_use": 1, "free": 3, "cards": 4, "others_in_use": 0,
               "other_namespaces": [], "bookable": 4, "over_declared": false})
    );
    // Fewer cards than declared is over-declared too, whoever holds them.
    let (s, b) = api
        .usage(json!({"in_use": 0, "cards": 3, "others_in_use": 0}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        (b["bookable"].clone(), b["over_declared"].clone()),
        (json!(3), json!(true))
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn why_a_booking_waits_is_shown_on_it_while_it_runs(pool: PgPool) {
    let api = Api::new(pool.clone()).await;
    let ann = api.book("ann", 0).await;
    let bob = api.book("bob", 3).await;
    let why =
        "waiting: 3 of 3 a100 held, 1 by pods in namespace research that bookings do not preempt";
    // The controller names ann's running booking, bob's planned one and an id of no
    // booking (a pod label can name anything).
    let (s, b) = api
        .held(json!({"bookings": {ann.to_string(): 0},
                     "waiting": {ann.to_string(): why, bob.to_string(): "not yet", "999999": "ghost"}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // Its owner reads it on the booking, in the list, and on the spawn form's answer.
    assert_eq!(api.booking(ann, ("ann", None)).await["waiting"], why);
    let (_, mine) = api
        .call(Method::GET, "/api/v1/bookings", ("ann", None), None)
        .await;
    assert_eq!(mine[0]["waiting"], why, "{mine}");
    let (_, spawn) = api
        .call(Method::GET, "/api/v1/availability", ("ann", None), None)
        .await;
    assert_eq!(spawn["active"]["waiting"], why, "{spawn}");
    // Admins too; a booking that is not running never waits.
    let (_, all) = api
        .call(Method::GET, "/api/v1/bookings?all=true", ADMIN, None)
        .await;
    let waiting: Vec<(i64, Value)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["id"].as_i64().unwrap(), b["waiting"].clone()))
        .collect();
    assert_eq!(waiting, [(bob, Value::Null), (ann, json!(why))]);
    assert!(api
        .booking(bob, ("bob", None))
        .await
        .get("waiting")
        .is_none());
    // The id of no booking was dropped; waiting holds no unit.
    let kept: Vec<i64> =
        sqlx::query_scalar("SELECT booking_id FROM booking_held ORDER BY booking_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(kept, [ann, bob]);
    let (_, sched) = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=ann",
            SERVICE,
            None,
        )
        .await;
    assert_eq!(sched["units_held"], 0, "{sched}");

    // Refused whole, and nothing changes: a reason too long, a control character.
    let longest = "é".repeat(MAX_WAITING_LEN);
    for bad in [
        format!("{longest}x"),
        "two\nlines".to_owned(),
        "a bell \u{7}".to_owned(),
        "a C1 control \u{9b}".to_owned(),
    ] {
        let (s, b) = api
            .held(json!({"bookings": {}, "waiting": {ann.to_string(): bad}}))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    }
    assert_eq!(api.booking(ann, ("ann", None)).await["waiting"], why);
    // At the limit: accepted.
    let (s, b) = api
        .held(json!({"bookings": {ann.to_string(): 1}, "waiting": {ann.to_string(): longest}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        api.booking(ann, ("ann", None)).await["waiting"],
        json!(longest)
    );

    // The next report without it: not waiting any more.
    let (s, _) = api.held(json!({"bookings": {ann.to_string(): 1}})).await;
    assert_eq!(s, StatusCode::OK);
    assert!(api
        .booking(ann, ("ann", None))
        .await
        .get("waiting")
        .is_none());
    let (_, sched) = api
        .call(
            Method::GET,
            "/api/v1/schedulability?user=ann",
            SERVICE,
            None,
        )
        .await;
    assert_eq!(sched["units_held"], 1, "{sched}");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_change_stream_does_not_carry_waiting(pool: PgPool) {
    let api = Api::new(pool).await;
    let ann = api.book("ann", 0).await;
    let listed = api.changes(None, 0).await;
    let position = listed["next"].as_i64().unwrap();
    let why = "waiting: 1 of 1 a100 held by pods in namespace research";
    for reason in [why, "waiting: another sentence", why] {
        let (s, b) = api
            .held(json!({"bookings": {}, "waiting": {ann.to_string(): reason}}))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    assert_eq!(api.booking(ann, ("ann", None)).await["waiting"], why);
    // A real change after them: the stream serves changes in commit order, so
    // anything the reports had written would come before it.
    let bob = api.book("bob", 3).await;
    let mut seen = Vec::new();
    let mut after = position;
    for _ in 0..20 {
        let answer = api.changes(Some(after), 1).await;
        seen.extend(answer["changes"].as_array().unwrap().iter().cloned());
        after = answer["next"].as_i64().unwrap();
        if !seen.is_empty() {
            break;
        }
    }
    let kinds: Vec<(i64, &str)> = seen
        .iter()
        .map(|c| {
            (
                c["booking"]["id"].as_i64().unwrap(),
                c["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds, [(bob, "created")], "{seen:?}");
    // Nor does a listing: the stream's bookings are the booking alone.
    let listed = api.changes(None, 0).await;
    let current = listed["changes"].as_array().unwrap();
    assert_eq!(current.len(), 2, "{listed}");
    assert!(
        current
            .iter()
            .all(|c| c["booking"].get("waiting").is_none()),
        "{listed}"
    );
}
