//! Maintenance windows on the real Postgres: bookings in the way listed, then
//! resolved as the admin confirms; lowering a model's units the same way; refusals
//! that name the window; the calendar feed; and a storm of bookings, reservations
//! and windows at once that never holds more units than a model has.

use crate::common;

use std::sync::Arc;

use axum::http::Method;
use axum::Router;
use chrono::{DateTime, Utc};
use common::{days, hours, rfc, t0};
use gpu_booking_api::clock::{Clock, ManualClock};
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::capacity;
use gpu_booking_core::rules::RuleCode;
use gpu_booking_core::window::Window;
use serde_json::{json, Value};
use sqlx::PgPool;

pub const SECRET: &[u8] = b"maintenance-test-secret-0123456789abcdef";

pub fn admin() -> String {
    token_for(SECRET, "root@lab", Some("admin"))
}
pub fn user(name: &str) -> String {
    token_for(SECRET, name, None)
}

pub struct Api {
    pub app: Router,
    pub clock: ManualClock,
    pub pool: PgPool,
}

impl Api {
    pub async fn new(pool: PgPool, models: &[(&str, i32)]) -> Api {
        let clock = ManualClock::new(t0());
        let app = gpu_booking_api::app::router(test_state(
            pool.clone(),
            Policy::default(),
            Arc::new(clock.clone()),
            SECRET,
        ));
        let api = Api { app, clock, pool };
        for (name, units) in models {
            let (s, v) = api
                .call(
                    Method::PUT,
                    &format!("/api/v1/models/{name}"),
                    &admin(),
                    Some(json!({ "units": units })),
                )
                .await;
            assert_eq!(s, 200, "{v}");
        }
        api
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let r = common::call(&self.app, method, uri, Some(token), body.as_ref()).await;
        assert!(!r.status.is_server_error(), "{}: {}", r.status, r.text());
        (r.status.as_u16(), r.json_or_null())
    }

    pub async fn book(
        &self,
        who: &str,
        model: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> (u16, Value) {
        self.call(
            Method::POST,
            "/api/v1/bookings",
            &user(who),
            Some(json!({"model": model, "start": rfc(start), "end": rfc(end)})),
        )
        .await
    }

    pub async fn booking(&self, id: i64) -> Value {
        self.call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &admin(),
            None,
        )
        .await
        .1
    }

    /// No instant holds more units of a model than it has, no unit is held twice at
    /// once, and the day rows agree with the bookings: read from the database.
    pub async fn assert_invariants(&self) {
        let over: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM booking s JOIN gpu_model m ON m.name = s.model
             WHERE s.cancelled_at IS NULL AND (
               SELECT sum(o.units) FROM booking o
               WHERE o.model = s.model AND o.cancelled_at IS NULL AND o.period @> s.start_at) > m.units",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap();
        assert_eq!(
            over, 0,
            "a model holds more units than it has at some instant"
        );
        let clash: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM booking a JOIN booking b
               ON a.id < b.id AND a.model = b.model AND a.slots && b.slots AND a.period && b.period
             WHERE a.cancelled_at IS NULL AND b.cancelled_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap();
        assert_eq!(clash, 0, "two rows hold one unit at once");
        assert_eq!(
            gpu_booking_api::testing::day_units_mismatches(&self.pool)
                .await
                .unwrap(),
            0
        );
    }
}

fn window_body(model: &str, start: DateTime<Utc>, end: DateTime<Utc>, units: Option<u32>) -> Value {
    let mut b =
        json!({"model": model, "start": rfc(start), "end": rfc(end), "reason": "driver upgrade"});
    if let Some(u) = units {
        b["units"] = json!(u);
    }
    b
}

#[sqlx::test(migrations = "../migrations")]
async fn a_window_over_bookings_lists_them_then_resolves_them_as_confirmed(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 2)]).await;
    let s = api.now() + hours(1);
    let (_, a) = api.book("alice", "t4", s, s + days(2)).await;
    let (_, b) = api.book("bob", "t4", s + hours(1), s + days(2)).await;
    let (alice, bob) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    let (ws, we) = (s + days(1), s + days(1) + hours(6));
    // One unit blocked: alice (first) keeps hers, bob's is in the way.
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(window_body("t4", ws, we, Some(1))),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("bookings_in_the_way")),
        "{body}"
    );
    let listed: Vec<i64> = body["bookings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, vec![bob]);
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM unit_hold")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(holds, 0, "nothing written");
    assert_eq!(
        api.booking(bob).await["end"],
        json!(rfc(s + days(2))),
        "bob's booking unchanged"
    );

    // A choice for someone else is no choice for bob: listed again, nothing changed.
    let mut body = window_body("t4", ws, we, Some(1));
    body["resolve"] = json!({ alice.to_string(): "cancel" });
    let (status, again) = api
        .call(Method::POST, "/api/v1/maintenance", &admin(), Some(body))
        .await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(api.booking(alice).await["status"], json!("planned"));

    // Confirmed: bob's booking ends where the window starts, bob is told, the window holds.
    let mut body = window_body("t4", ws, we, Some(1));
    body["resolve"] = json!({ bob.to_string(): "shorten" });
    let (status, made) = api
        .call(Method::POST, "/api/v1/maintenance", &admin(), Some(body))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["units"], json!(1));
    assert_eq!(api.booking(bob).await["end"], json!(rfc(ws)));
    assert_eq!(api.booking(alice).await["end"], json!(rfc(s + days(2))));
    let notices: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notice WHERE user_name = 'bob' AND kind = 'booking_changed_by_admin' AND booking_id = $1",
    )
    .bind(bob)
    .fetch_one(&api.pool)
    .await
    .unwrap();
    assert_eq!(notices, 1);
    // The window's row is the hold user's, which no person can be.
    let hold_user: String =
        sqlx::query_scalar("SELECT user_name FROM booking WHERE hold_id IS NOT NULL")
            .fetch_one(&api.pool)
            .await
            .unwrap();
    assert_eq!(hold_user, format!(" maintenance {}", made["id"]));
    let (_, listed) = api
        .call(Method::GET, "/api/v1/maintenance", &user("carol"), None)
        .await;
    assert_eq!(listed.as_array().unwrap().len(), 1);

    // Nobody books the blocked unit: alice holds the other.
    let (status, refused) = api.book("carol", "t4", ws, ws + days(1)).await;
    assert_eq!(status, 409, "{refused}");
    api.assert_invariants().await;

    // Removed: its unit is free again.
    let id = made["id"].as_i64().unwrap();
    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/maintenance/{id}"),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = api.book("carol", "t4", ws, ws + days(1)).await;
    assert_eq!(status, 201, "{body}");
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_capacity_refusal_names_the_window(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2)]).await;
    let ws = api.now() + days(2);
    let (status, made) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(window_body("a100", ws, ws + days(1), None)),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["units"], json!(2), "every unit by default");
    // The function the create path calls on a capacity refusal.
    let w = Window::new(ws - days(1), ws + hours(2)).unwrap();
    let refused = capacity::refuse_full("a100", 2, 1, &w, &[]);
    let named = gpu_booking_api::store::holds::name_refusal(&api.pool, refused.into()).await;
    let gpu_booking_api::store::StoreError::Rule(r) = named else {
        panic!("not named: {named:?}");
    };
    assert_eq!(r.code, RuleCode::Maintenance);
    assert!(
        r.message
            .contains(&format!("window {}: driver upgrade", made["id"])),
        "{}",
        r.message
    );
    // A refusal over a window without a hold stays the capacity refusal.
    let elsewhere = capacity::refuse_full(
        "a100",
        2,
        1,
        &Window::new(ws + days(5), ws + days(6)).unwrap(),
        &[],
    );
    let plain = gpu_booking_api::store::holds::name_refusal(&api.pool, elsewhere.into()).await;
    assert!(matches!(
        plain,
        gpu_booking_api::store::StoreError::Capacity(_)
    ));
    // Bookings over the window are refused; a window's units must be the model's.
    let (status, _) = api.book("ann", "a100", ws - days(1), ws + hours(1)).await;
    assert_eq!(status, 409);
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(window_body("a100", ws, ws + days(1), Some(3))),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("invalid_units")),
        "{body}"
    );
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &user("ann"),
            Some(window_body("a100", ws, ws + days(1), None)),
        )
        .await;
    assert_eq!(status, 403);
}

#[sqlx::test(migrations = "../migrations")]
async fn lowering_units_lists_the_bookings_in_the_way_then_cancels_them_as_confirmed(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 2)]).await;
    let s = api.now() + hours(1);
    let (_, a) = api.book("alice", "t4", s, s + days(1)).await;
    let (_, b) = api.book("bob", "t4", s, s + days(1)).await;
    let (alice, bob) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/models/t4",
            &admin(),
            Some(json!({"units": 1})),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("units_in_use")),
        "{body}"
    );
    assert_eq!(body["bookings"][0]["id"], json!(bob), "{body}");
    let (status, body) = api
        .call(
            Method::PUT,
            "/api/v1/models/t4",
            &admin(),
            Some(json!({"units": 1, "resolve": "cancel"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["units"], json!(1));
    assert_eq!(api.booking(bob).await["status"], json!("cancelled"));
    assert_eq!(api.booking(alice).await["status"], json!("planned"));
    let told: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notice WHERE user_name = 'bob' AND kind = 'booking_changed_by_admin'",
    )
    .fetch_one(&api.pool)
    .await
    .unwrap();
    assert_eq!(told, 1);
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_model_feed_shows_maintenance_windows(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 2)]).await;
    let ws = api.now() + days(2);
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(window_body("a100", ws, ws + days(1), Some(1))),
        )
        .await;
    assert_eq!(status, 201);
    let (status, token) = api
        .call(Method::POST, "/api/v1/me/feed-token", &user("ann"), None)
        .await;
    assert_eq!(status, 201, "{token}");
    let r = common::call(
        &api.app,
        Method::GET,
        &format!(
            "/api/v1/feeds/{}/models/a100/occupancy.ics",
            token["token"].as_str().unwrap()
        ),
        None,
        None,
    )
    .await;
    let text = r.text();
    let unfolded = icalendar::parser::unfold(&text);
    let cal = icalendar::parser::read_calendar(&unfolded).expect("RFC 5545");
    let summaries: Vec<String> = cal
        .components
        .iter()
        .filter(|c| c.name == "VEVENT")
        .flat_map(|c| {
            c.properties
                .iter()
                .filter(|p| p.name == "SUMMARY")
                .map(|p| p.val.to_string())
        })
        .collect();
    assert_eq!(
        summaries,
        vec!["Maintenance: driver upgrade, 1 unit of a100".to_owned()],
        "{text}"
    );
}

/// Bookings, reservations and maintenance windows created at once: whatever wins,
/// no instant holds more units than the model has (read from the database).
#[sqlx::test(migrations = "../migrations")]
async fn a_storm_of_bookings_reservations_and_windows_never_overbooks(pool: PgPool) {
    let api = Arc::new(Api::new(pool, &[("a100", 3)]).await);
    crate::reservations::group(&api.pool, "ml101", "prof").await;
    let base = api.now() + hours(2);
    let mut tasks = Vec::new();
    for i in 0..18i64 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let start = base + hours(5 * (i % 6));
            api.book(&format!("u{i}"), "a100", start, start + days(1))
                .await
                .0
        }));
    }
    for i in 0..3i64 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let ws = base + hours(7 * i);
            let mut body = window_body("a100", ws, ws + hours(10), Some(1 + i as u32 % 2));
            body["resolve"] = json!("cancel");
            api.call(Method::POST, "/api/v1/maintenance", &admin(), Some(body))
                .await
                .0
        }));
    }
    for i in 0..3i64 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let start = (base + hours(3 * i)).naive_utc();
            api.call(
                Method::POST,
                "/api/v1/reservations",
                &user("prof"),
                Some(json!({
                    "model": "a100", "units": 1 + i % 2, "group": "ml101", "title": format!("session {i}"),
                    "start": start, "end": start + hours(3), "rrule": "FREQ=DAILY;COUNT=3",
                    "skip_conflicts": i == 0,
                })),
            )
            .await
            .0
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| [200, 201, 409, 422].contains(s)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&201), "{statuses:?}");
    api.assert_invariants().await;
}

/// Makes every insert into (or update of) `table` fail, as a write that fails after
/// the bookings in the way were resolved.
async fn refuse_writes_to(pool: &PgPool, table: &str) {
    sqlx::query(
        "CREATE OR REPLACE FUNCTION refuse_write() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "CREATE TRIGGER refuse_write BEFORE INSERT OR UPDATE ON {table}
         FOR EACH ROW EXECUTE FUNCTION refuse_write()"
    ))
    .execute(pool)
    .await
    .unwrap();
}

async fn allow_writes_to(pool: &PgPool, table: &str) {
    sqlx::query(&format!("DROP TRIGGER refuse_write ON {table}"))
        .execute(pool)
        .await
        .unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_confirmed_window_that_fails_to_be_written_leaves_every_booking_as_it_was(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 2)]).await;
    let s = api.now() + hours(1);
    let (_, a) = api.book("alice", "t4", s, s + days(2)).await;
    let (_, b) = api.book("bob", "t4", s + hours(1), s + days(2)).await;
    let (alice, bob) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    let (ws, we) = (s + days(1), s + days(1) + hours(6));
    let mut body = window_body("t4", ws, we, None);
    body["resolve"] = json!({ alice.to_string(): "shorten", bob.to_string(): "cancel" });
    let audits_before = count(&api.pool, "SELECT count(*) FROM audit_event").await;

    // Both bookings are resolved before the window's row is written; that write fails.
    refuse_writes_to(&api.pool, "unit_hold").await;
    let r = common::call(
        &api.app,
        Method::POST,
        "/api/v1/maintenance",
        Some(&admin()),
        Some(&body),
    )
    .await;
    assert!(r.status.is_server_error(), "{}: {}", r.status, r.text());
    assert_eq!(api.booking(alice).await["end"], json!(rfc(s + days(2))));
    assert_eq!(api.booking(bob).await["status"], json!("planned"));
    assert_eq!(count(&api.pool, "SELECT count(*) FROM notice").await, 0);
    assert_eq!(count(&api.pool, "SELECT count(*) FROM unit_hold").await, 0);
    assert_eq!(
        count(&api.pool, "SELECT count(*) FROM audit_event").await,
        audits_before,
        "no change audited"
    );
    api.assert_invariants().await;

    // The same confirmation once the window can be written: all of it.
    allow_writes_to(&api.pool, "unit_hold").await;
    let (status, made) = api
        .call(Method::POST, "/api/v1/maintenance", &admin(), Some(body))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(api.booking(alice).await["end"], json!(rfc(ws)));
    assert_eq!(api.booking(bob).await["status"], json!("cancelled"));
    assert_eq!(
        count(
            &api.pool,
            "SELECT count(*) FROM notice WHERE kind = 'booking_changed_by_admin'"
        )
        .await,
        2
    );
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_confirmed_lowering_that_fails_to_be_written_cancels_nothing(pool: PgPool) {
    let api = Api::new(pool, &[("t4", 2)]).await;
    let s = api.now() + hours(1);
    let (_, a) = api.book("alice", "t4", s, s + days(1)).await;
    let (_, b) = api.book("bob", "t4", s, s + days(1)).await;
    let (alice, bob) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    let body = json!({"units": 0, "resolve": "cancel"});
    refuse_writes_to(&api.pool, "gpu_model").await;
    let r = common::call(
        &api.app,
        Method::PUT,
        "/api/v1/models/t4",
        Some(&admin()),
        Some(&body),
    )
    .await;
    assert!(r.status.is_server_error(), "{}: {}", r.status, r.text());
    assert_eq!(api.booking(alice).await["status"], json!("planned"));
    assert_eq!(api.booking(bob).await["status"], json!("planned"));
    assert_eq!(count(&api.pool, "SELECT count(*) FROM notice").await, 0);

    allow_writes_to(&api.pool, "gpu_model").await;
    let (status, model) = api
        .call(Method::PUT, "/api/v1/models/t4", &admin(), Some(body))
        .await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["units"], json!(0));
    assert_eq!(api.booking(alice).await["status"], json!("cancelled"));
    assert_eq!(api.booking(bob).await["status"], json!("cancelled"));
    api.assert_invariants().await;
}

/// Confirmed windows and a confirmed lowering (each taking the locks of several
/// groups' and users' bookings before the model's) at once with those users' own
/// changes and new bookings: no deadlock (none answers a server error) and no
/// instant holds more units than the model has.
#[sqlx::test(migrations = "../migrations")]
async fn confirmed_windows_and_lowerings_at_once_with_users_changes_never_deadlock(pool: PgPool) {
    let api = Arc::new(Api::new(pool, &[("a100", 8)]).await);
    let g1 = crate::reservations::group(&api.pool, "lab-a", "u0").await;
    let g2 = crate::reservations::group(&api.pool, "lab-b", "u1").await;
    for (g, u) in [(g1, "u2"), (g2, "u3")] {
        sqlx::query("INSERT INTO group_member (group_id, user_name) VALUES ($1, $2)")
            .bind(g)
            .bind(u)
            .execute(&api.pool)
            .await
            .unwrap();
    }
    let base = api.now() + hours(2);
    let mut ids = Vec::new();
    for i in 0..6i64 {
        let (status, b) = api
            .book(
                &format!("u{i}"),
                "a100",
                base + hours(i),
                base + hours(i) + days(1),
            )
            .await;
        assert_eq!(status, 201, "{b}");
        ids.push((i, b["id"].as_i64().unwrap()));
    }
    let mut tasks = Vec::new();
    for (i, id) in ids {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let end = base + hours(i) + days(1) + hours(3);
            api.call(
                Method::PATCH,
                &format!("/api/v1/bookings/{id}"),
                &user(&format!("u{i}")),
                Some(json!({ "end": rfc(end) })),
            )
            .await
            .0
        }));
    }
    for i in 6..10i64 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let start = base + hours(2 * (i - 6));
            api.book(&format!("u{i}"), "a100", start, start + hours(12))
                .await
                .0
        }));
    }
    for i in 0..3i64 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let ws = base + hours(4 * i + 1);
            let mut body = window_body("a100", ws, ws + hours(8), Some(3));
            body["resolve"] = json!(if i % 2 == 0 { "shorten" } else { "cancel" });
            api.call(Method::POST, "/api/v1/maintenance", &admin(), Some(body))
                .await
                .0
        }));
    }
    {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            api.call(
                Method::PUT,
                "/api/v1/models/a100",
                &admin(),
                Some(json!({"units": 5, "resolve": "cancel"})),
            )
            .await
            .0
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| [200, 201, 409, 422].contains(s)),
        "{statuses:?}"
    );
    api.assert_invariants().await;
    // Every person's booking an admin changed was told so.
    let untold = count(
        &api.pool,
        "SELECT count(*) FROM audit_event a JOIN booking b ON b.id = a.booking_id
         WHERE a.actor = 'root@lab' AND b.hold_id IS NULL
           AND a.action IN ('booking.cancel', 'booking.end_early', 'booking.shorten')
           AND NOT EXISTS (SELECT 1 FROM notice n WHERE n.booking_id = a.booking_id
                           AND n.kind = 'booking_changed_by_admin')",
    )
    .await;
    assert_eq!(untold, 0);
}
