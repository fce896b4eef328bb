//! Booked versus used on the real Postgres: the controller's
//! held-units reports (with the agent's activity) become spans of use; the admin
//! report per user, model, group and booking, as JSON and CSV (a hostile user name
//! stays text; per group with each group's use against its quota, a user in two
//! groups counted for the one whose policy applies); no-shows and idle bookings; the
//! idle nudge, once per booking; retention.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use chrono::{DateTime, SecondsFormat, TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::{Clock, ManualClock};
use gpu_booking_api::notices::send::Senders;
use gpu_booking_api::notices::{Settings, Worker};
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::notice_text::Style;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"usage-api-test-secret-0123456789abcdef";

/// A user name that a spreadsheet would run as a formula, with commas and quotes.
const HOSTILE: &str = "=hyperlink(\"http://evil.example\",\"x\"),y";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 7, 0, 0, 0).unwrap()
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

struct Api {
    app: axum::Router,
    clock: ManualClock,
}

impl Api {
    async fn new(pool: PgPool) -> Api {
        let clock = ManualClock::new(t0());
        let app = gpu_booking_api::app::router(test_state(
            pool,
            Policy::default(),
            Arc::new(clock.clone()),
            SECRET,
        ));
        let api = Api { app, clock };
        let (s, _) = api
            .call(
                Method::PUT,
                "/api/v1/models/a100",
                "root@lab",
                Some("admin"),
                Some(json!({"units": 4})),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        api
    }

    async fn raw(
        &self,
        method: Method,
        uri: &str,
        who: &str,
        role: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Option<String>, String) {
        let req = Request::builder().method(method).uri(uri).header(
            header::AUTHORIZATION,
            format!("Bearer {}", token_for(SECRET, who, role)),
        );
        let req = match body {
            Some(b) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let ctype = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(!status.is_server_error(), "{status}: {text}");
        (status, ctype, text)
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        who: &str,
        role: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (s, _, text) = self.raw(method, uri, who, role, body).await;
        (s, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A booking for `user` (by an admin, so that any name can book) of `days` days
    /// from `start`; its id.
    async fn book(&self, user: &str, start: DateTime<Utc>, days: i64) -> i64 {
        let (s, b) = self
            .call(
                Method::POST,
                "/api/v1/bookings",
                "root@lab",
                Some("admin"),
                Some(json!({"model": "a100", "start": rfc(start),
                    "end": rfc(start + TimeDelta::days(days)), "user": user})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        b["id"].as_i64().unwrap()
    }

    /// The controller's report, at the clock's now.
    async fn held(&self, body: Value) {
        let (s, b) = self
            .call(
                Method::PUT,
                "/api/v1/held-units",
                "controller",
                Some("service"),
                Some(body),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }

    async fn report(&self, query: &str) -> Value {
        let (s, b) = self
            .call(
                Method::GET,
                &format!("/api/v1/admin/usage?{query}"),
                "root@lab",
                Some("admin"),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }
}

fn row<'a>(report: &'a Value, key: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key} in {report}"))
}

/// A minimal RFC 4180 reader (quoted fields, doubled quotes, CRLF records), to read
/// back what the report wrote.
fn read_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(
        field.is_empty() && record.is_empty(),
        "CRLF ends every record"
    );
    records
}

#[sqlx::test(migrations = "../migrations")]
async fn booked_held_active_per_user_model_and_booking(pool: PgPool) {
    let api = Api::new(pool).await;
    let start = t0() + TimeDelta::days(1);
    let ann = api.book("ann", start, 2).await;
    let evil = api.book(HOSTILE, start, 2).await;
    let bob = api.book("bob", start, 2).await;
    // A planned booking, later on.
    let cat = api.book("cat", start + TimeDelta::days(3), 1).await;

    // From the start: ann's and the hostile user's pods hold their GPUs; ann's is
    // busy for two hours (the controller passes the agent's activity on about every
    // five minutes), then idle.
    api.clock.set(start);
    for step in 0..=24 {
        let now = api.clock.now();
        api.held(json!({
            "bookings": {ann.to_string(): 1, evil.to_string(): 1},
            "active": {ann.to_string(): rfc(now)},
        }))
        .await;
        if step < 24 {
            api.clock.advance(TimeDelta::minutes(5));
        }
    }
    // An old report again (a controller's retry) changes nothing.
    api.held(
        json!({"bookings": {ann.to_string(): 1, evil.to_string(): 1},
        "active": {ann.to_string(): rfc(start)}}),
    )
    .await;
    // Six hours in: the hostile user's pod has gone.
    api.clock.set(start + TimeDelta::hours(6));
    api.held(json!({"bookings": {ann.to_string(): 1}})).await;

    let from = rfc(t0());
    let to = rfc(t0() + TimeDelta::days(10));
    let r = api.report(&format!("from={from}&to={to}&by=user")).await;
    let a = row(&r, "ann");
    assert_eq!(a["bookings"], 1);
    assert_eq!(a["booked_gpu_hours"], 48.0);
    assert_eq!(a["held_gpu_hours"], 6.0, "{a}");
    // Two hours of observations, the last one counted for ten minutes.
    assert_eq!(a["active_gpu_hours"], 2.167, "{a}");
    let e = row(&r, HOSTILE);
    assert_eq!(
        (e["held_gpu_hours"].clone(), e["active_gpu_hours"].clone()),
        (json!(6.0), json!(0.0)),
        "{e}"
    );
    let b = row(&r, "bob");
    assert_eq!(
        (b["held_gpu_hours"].clone(), b["no_shows"].clone()),
        (json!(0.0), json!(1))
    );
    assert_eq!(row(&r, "cat")["booked_gpu_hours"], 24.0);
    assert_eq!(r["total"]["booked_gpu_hours"], 48.0 * 3.0 + 24.0);
    assert_eq!(r["total"]["held_gpu_hours"], 12.0);

    // Statuses: bob never came; ann idle since her last activity; the hostile
    // user's booking idle since it started (held, never active); cat planned.
    let status = |id: i64| -> Value {
        r["bookings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["id"] == id)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status(bob), "no_show");
    assert_eq!(status(ann), "idle");
    assert_eq!(status(evil), "idle");
    assert_eq!(status(cat), "planned");
    let ids = |list: &str| -> Vec<i64> {
        r[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids("no_shows"), vec![bob]);
    assert_eq!(ids("idle"), vec![ann, evil]);
    let idle_ann = &r["idle"][0];
    assert_eq!(idle_ann["last_active"], rfc(start + TimeDelta::hours(2)));
    // A longer threshold: nobody idle yet (bob is not a no-show yet either).
    let r8 = api
        .report(&format!("from={from}&to={to}&idle_hours=8"))
        .await;
    assert_eq!(r8["idle"], json!([]));
    assert_eq!(r8["no_shows"], json!([]));

    // Per model: one row with every booking.
    let m = api.report(&format!("from={from}&to={to}&by=model")).await;
    assert_eq!(m["rows"].as_array().unwrap().len(), 1);
    assert_eq!(row(&m, "a100")["bookings"], 4);
    assert_eq!(row(&m, "a100")["held_gpu_hours"], 12.0);

    // A period of the first three hours only.
    let p = api
        .report(&format!(
            "from={}&to={}",
            rfc(start),
            rfc(start + TimeDelta::hours(3))
        ))
        .await;
    assert_eq!(row(&p, "ann")["booked_gpu_hours"], 3.0);
    assert_eq!(row(&p, "ann")["held_gpu_hours"], 3.0);
    assert_eq!(row(&p, "ann")["active_gpu_hours"], 2.167);

    // CSV per user: a header, RFC 4180 quoting, the formula defused.
    let (s, ctype, text) = api
        .raw(
            Method::GET,
            &format!("/api/v1/admin/usage?from={from}&to={to}&by=user&format=csv"),
            "root@lab",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(ctype.unwrap().starts_with("text/csv"));
    assert!(text.starts_with(
        "user,bookings,booked_gpu_hours,held_gpu_hours,active_gpu_hours,no_shows,idle\r\n"
    ));
    assert!(
        text.contains("\"'=hyperlink(\"\"http://evil.example\"\",\"\"x\"\"),y\",1,48,6,0,0,1\r\n"),
        "{text}"
    );
    let records = read_csv(&text);
    assert_eq!(records.len(), 1 + 4);
    assert!(records.iter().all(|r| r.len() == 7), "{records:?}");
    let hostile = records.iter().find(|r| r[0].contains("hyperlink")).unwrap();
    assert_eq!(hostile[0], format!("'{HOSTILE}"), "read back as text");
    assert!(records
        .iter()
        .skip(1)
        .all(|r| !r[0].starts_with(['=', '+', '-', '@'])));

    // CSV per booking.
    let (_, _, text) = api
        .raw(
            Method::GET,
            &format!("/api/v1/admin/usage?from={from}&to={to}&by=booking&format=csv"),
            "root@lab",
            Some("admin"),
            None,
        )
        .await;
    let records = read_csv(&text);
    assert_eq!(records[0][0], "id");
    assert_eq!(records[0][10], "status");
    assert_eq!(records.len(), 1 + 4);
    let bob_row = records.iter().find(|r| r[0] == bob.to_string()).unwrap();
    assert_eq!(
        (bob_row[1].as_str(), bob_row[10].as_str()),
        ("bob", "no_show")
    );
}

impl Api {
    async fn admin(&self, method: Method, uri: &str, body: Option<Value>) -> Value {
        let (s, b) = self
            .call(method, uri, "root@lab", Some("admin"), body)
            .await;
        assert!(s.is_success(), "{uri}: {s} {b}");
        b
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn per_group_with_quota_use_a_user_in_two_groups_counted_once(pool: PgPool) {
    let api = Api::new(pool).await;
    let groups = [
        json!({"name": "vision", "position": 1, "quota": {"gpu_hours": 100}}),
        json!({"name": "ml-lab", "position": 0, "quota": {"gpu_hours": 500, "units": 3}}),
        json!({"name": "empty", "position": 2}),
    ];
    for g in groups {
        api.admin(Method::POST, "/api/v1/groups", Some(g)).await;
    }
    // dan is in both ml-lab and vision: ml-lab comes first in the admin's order,
    // so its policy applies to him and his bookings count against it.
    for (group, user) in [("ml-lab", "dan"), ("vision", "dan"), ("vision", "eve")] {
        api.admin(
            Method::PUT,
            &format!("/api/v1/groups/{group}/members/{user}"),
            Some(json!({})),
        )
        .await;
    }
    let start = t0() + TimeDelta::days(1);
    api.book("dan", start, 2).await;
    api.book("eve", start, 2).await;
    // fay is in no group.
    api.book("fay", start, 1).await;

    let from = rfc(t0());
    let to = rfc(t0() + TimeDelta::days(10));
    let r = api.report(&format!("from={from}&to={to}&by=group")).await;
    assert_eq!(r["by"], "group");
    let keys: Vec<&str> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    // Every group in the admin's order (one without bookings too), then no group.
    assert_eq!(keys, ["ml-lab", "vision", "empty", ""]);
    let ml = row(&r, "ml-lab");
    assert_eq!(
        (ml["bookings"].clone(), ml["booked_gpu_hours"].clone()),
        (json!(1), json!(48.0)),
        "{ml}"
    );
    let vision = row(&r, "vision");
    assert_eq!(
        (
            vision["bookings"].clone(),
            vision["booked_gpu_hours"].clone()
        ),
        (json!(1), json!(48.0)),
        "{vision}"
    );
    assert_eq!(row(&r, "empty")["bookings"], 0);
    assert_eq!(row(&r, "")["booked_gpu_hours"], 24.0);
    assert_eq!(r["total"]["bookings"], 3);
    assert!(r["total"].get("quota_use").is_none());

    // The quota period holding the report's last instant (16 January): January.
    let q = &ml["quota_use"];
    assert_eq!(q["group"], "ml-lab");
    assert_eq!(q["period"], "2030-01");
    assert_eq!(q["period_start"], "2030-01-01T00:00:00Z");
    assert_eq!(q["period_end"], "2030-02-01T00:00:00Z");
    assert_eq!(
        q["quota"],
        json!({"gpu_hours": 500, "period": "month", "units": 3})
    );
    assert_eq!(q["used_gpu_hours"], 48.0);
    assert_eq!(q["left_gpu_hours"], 452.0);
    assert_eq!(q["units_now"], 0, "nothing is held on 16 January");
    assert_eq!(q["by_user"], json!({"dan": 48.0}));
    // dan's hours count for ml-lab only: vision has eve's.
    let qv = &vision["quota_use"];
    assert_eq!(
        (qv["used_gpu_hours"].clone(), qv["left_gpu_hours"].clone()),
        (json!(48.0), json!(52.0))
    );
    assert_eq!(qv["by_user"], json!({"eve": 48.0}));
    // No quota: nothing is left of one.
    let qe = &row(&r, "empty")["quota_use"];
    assert_eq!(
        (qe["used_gpu_hours"].clone(), qe["left_gpu_hours"].clone()),
        (json!(0.0), Value::Null),
        "{qe}"
    );
    assert!(row(&r, "").get("quota_use").is_none());

    // A report to 1 February's midnight is about January, and so is its quota.
    let feb = rfc(Utc.with_ymd_and_hms(2030, 2, 1, 0, 0, 0).unwrap());
    let jan = api.report(&format!("from={from}&to={feb}&by=group")).await;
    assert_eq!(row(&jan, "ml-lab")["quota_use"]["period"], "2030-01");

    // During the bookings, a report to now holds what the group's usage says.
    api.clock.set(start + TimeDelta::hours(1));
    let now_report = api.report("by=group").await;
    let usage = api
        .admin(Method::GET, "/api/v1/groups/ml-lab/usage", None)
        .await;
    assert_eq!(row(&now_report, "ml-lab")["quota_use"], usage);
    assert_eq!(usage["units_now"], 1);
    api.clock.set(t0());

    // CSV per group: the header, a group's quota columns, empty ones for no group.
    let (s, _, text) = api
        .raw(
            Method::GET,
            &format!("/api/v1/admin/usage?from={from}&to={to}&by=group&format=csv"),
            "root@lab",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        text.starts_with(
            "group,bookings,booked_gpu_hours,held_gpu_hours,active_gpu_hours,no_shows,idle,\
             quota_period,quota_period_start,quota_period_end,quota_gpu_hours,quota_used_gpu_hours,\
             quota_left_gpu_hours,quota_units,quota_units_now\r\n"
        ),
        "{text}"
    );
    let records = read_csv(&text);
    assert_eq!(records.len(), 1 + 4);
    assert!(records.iter().all(|r| r.len() == 15), "{records:?}");
    assert_eq!(
        records[1],
        [
            "ml-lab",
            "1",
            "48",
            "0",
            "0",
            "0",
            "0",
            "2030-01",
            "2030-01-01T00:00:00Z",
            "2030-02-01T00:00:00Z",
            "500",
            "48",
            "452",
            "3",
            "0"
        ]
    );
    assert_eq!(records[3][..7], ["empty", "0", "0", "0", "0", "0", "0"]);
    assert_eq!(records[3][10..], ["", "0", "", "", "0"]);
    assert_eq!(records[4][0], "");
    assert!(
        records[4][7..].iter().all(String::is_empty),
        "{:?}",
        records[4]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn only_admins_and_sane_periods(pool: PgPool) {
    let api = Api::new(pool).await;
    let (s, _) = api
        .call(Method::GET, "/api/v1/admin/usage", "ann", None, None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = api
        .call(
            Method::GET,
            "/api/v1/admin/usage",
            "webhook",
            Some("service"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let api = &api;
    let admin = |q: &str| {
        let uri = format!("/api/v1/admin/usage?{q}");
        async move {
            api.call(Method::GET, &uri, "root@lab", Some("admin"), None)
                .await
        }
    };
    // The defaults: the last 30 days, per user, JSON.
    let (s, r) = admin("").await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["by"], "user");
    assert_eq!(r["rows"], json!([]));
    let (s, _) = admin(&format!("from={}&to={}", rfc(t0()), rfc(t0()))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = admin(&format!(
        "from={}&to={}",
        rfc(t0()),
        rfc(t0() + TimeDelta::days(401))
    ))
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = admin("idle_hours=0").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = admin("by=team").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = admin("format=xlsx").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = admin("from=yesterday").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrations = "../migrations")]
async fn idle_nudge_once_per_booking_and_retention(pool: PgPool) {
    let api = Api::new(pool.clone()).await;
    let start = t0() + TimeDelta::days(1);
    let idle = api.book("ann", start, 3).await;
    let busy = api.book("bob", start, 3).await;
    let short = api.book("cat", start, 1).await;
    let settings = Settings {
        // No reminders: only nudges in this outbox.
        leads: Vec::new(),
        idle_nudge_after: Some(TimeDelta::hours(4)),
        style: Style {
            page_url: Some("https://gpu.lab.example/".into()),
            ..Style::default()
        },
        usage_retention: TimeDelta::days(30),
        ..Settings::default()
    };
    let w = Worker::new(
        pool.clone(),
        Arc::new(api.clock.clone()),
        Senders::default(),
        settings,
    );
    // Every 30 minutes for a day: bob's pod is busy all along, ann's was busy for
    // the first hour only, cat's booking ends the same day.
    api.clock.set(start);
    let mut queued = Vec::new();
    for half_hours in 0..48 {
        let now = api.clock.now();
        let mut active = serde_json::Map::new();
        active.insert(busy.to_string(), json!(rfc(now)));
        if half_hours <= 2 {
            active.insert(idle.to_string(), json!(rfc(now)));
        }
        api.held(
            json!({"bookings": {idle.to_string(): 1, busy.to_string(): 1, short.to_string(): 1},
            "active": active}),
        )
        .await;
        queued.push(w.round().await.unwrap().queued);
        api.clock.advance(TimeDelta::minutes(30));
    }
    // ann: last active at 1 h, idle for 4 h at 5 h (round 10).
    assert_eq!(queued.iter().sum::<usize>(), 2, "{queued:?}");
    let notices: Vec<(String, String, Option<i64>, String, String)> =
        sqlx::query_as("SELECT user_name, kind, booking_id, title, body FROM notice ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    // cat's one-day booking: idle since its start, nudged at 4 h (20 h still to go).
    let (user, kind, booking, title, body) = &notices[0];
    assert_eq!(
        (user.as_str(), kind.as_str(), *booking),
        ("cat", "booking_idle", Some(short))
    );
    assert_eq!(title, "Your booking of a100 has been idle for 4 hours");
    let (user, kind, booking, _, body2) = &notices[1];
    assert_eq!(
        (user.as_str(), kind.as_str(), *booking),
        ("ann", "booking_idle", Some(idle))
    );
    assert!(
        body2.contains("Your booking of a100 (booking")
            && body2.contains("has been idle for 4 hours; release it early?"),
        "{body2}"
    );
    assert!(
        body2.ends_with("\n\nYour bookings: https://gpu.lab.example/#mine"),
        "{body2}"
    );
    assert!(body.contains("release it early?"));
    assert_eq!(queued[8], 1, "cat at 4 h: {queued:?}");
    assert_eq!(queued[10], 1, "ann at 5 h: {queued:?}");

    // Retention: spans that ended 30 days ago go in the next round.
    let spans = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM booking_use")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert!(spans(pool.clone()).await > 0);
    api.held(json!({"bookings": {}})).await;
    api.clock.advance(TimeDelta::days(35));
    w.round().await.unwrap();
    assert_eq!(spans(pool.clone()).await, 0);
}
