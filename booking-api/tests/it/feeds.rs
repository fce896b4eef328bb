//! Calendar feeds on the real Postgres: the feed parses back as RFC 5545 with stable
//! UIDs, DTSTAMP and UTC times; a model's feed names only the viewer's own bookings
//! unless the policy allows; a booking of several GPUs names every unit; a revoked
//! or replaced token answers 404; a feed's size is bounded.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::Router;
use chrono::{DateTime, TimeDelta, Utc};
use common::{rfc, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use icalendar::parser::{read_calendar, unfold};
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"feeds-test-secret-0123456789abcdefgh";

fn user(name: &str) -> String {
    token_for(SECRET, name, None)
}

struct Api {
    app: Router,
}

impl Api {
    async fn new(pool: PgPool, policy: Policy) -> Api {
        let clock = ManualClock::new(t0());
        let app = gpu_booking_api::app::router(test_state(pool, policy, Arc::new(clock), SECRET));
        let api = Api { app };
        let (status, _, _) = api
            .call(
                Method::PUT,
                "/api/v1/models/a100",
                Some(&token_for(SECRET, "root@lab", Some("admin"))),
                Some(json!({"units": 2})),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        api
    }

    /// Status, content type and body text.
    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, String, String) {
        let r = common::call(&self.app, method, uri, token, body.as_ref()).await;
        let text = r.text();
        (r.status, r.content_type, text)
    }

    async fn book(&self, who: &str, start: DateTime<Utc>, days: i64) -> i64 {
        let (status, _, body) = self
            .call(
                Method::POST,
                "/api/v1/bookings",
                Some(&user(who)),
                Some(json!({"model": "a100", "start": rfc(start), "end": rfc(start + TimeDelta::days(days))})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["id"]
            .as_i64()
            .unwrap()
    }

    async fn issue(&self, who: &str) -> Value {
        let (status, _, body) = self
            .call(
                Method::POST,
                "/api/v1/me/feed-token",
                Some(&user(who)),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    async fn feed(&self, path: &str) -> (StatusCode, String, String) {
        self.call(Method::GET, path, None, None).await
    }
}

/// The VEVENTs of a feed, each as its properties (name -> value), parsed by the
/// crate's RFC 5545 parser.
fn events(text: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let unfolded = unfold(text);
    let cal = read_calendar(&unfolded).expect("an RFC 5545 calendar");
    let cal: icalendar::Calendar = cal.into();
    assert_eq!(cal.property_value("VERSION"), Some("2.0"));
    assert!(cal.property_value("PRODID").is_some());
    let parsed = read_calendar(&unfolded).unwrap();
    parsed
        .components
        .iter()
        .filter(|c| c.name == "VEVENT")
        .map(|c| {
            c.properties
                .iter()
                .map(|p| (p.name.to_string(), p.val.to_string()))
                .collect()
        })
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn the_own_feed_parses_back_with_stable_uids_and_utc_times(pool: PgPool) {
    let api = Api::new(pool, Policy::default()).await;
    let start = t0() + TimeDelta::days(2);
    let id = api.book("ann", start, 3).await;
    api.book("bob", start, 3).await;
    let issued = api.issue("ann").await;
    let path = issued["bookings_path"].as_str().unwrap().to_owned();
    let (status, ct, text) = api.feed(&path).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(ct.starts_with("text/calendar"), "{ct}");
    assert!(text.contains("\r\n"), "RFC 5545 lines end in CRLF");
    let evs = events(&text);
    assert_eq!(evs.len(), 1, "only ann's booking: {text}");
    let e = &evs[0];
    assert_eq!(e["UID"], format!("booking-{id}@gpu-booking"));
    assert_eq!(e["DTSTART"], "20300109T000000Z");
    assert_eq!(e["DTEND"], "20300112T000000Z");
    assert_eq!(e["STATUS"], "CONFIRMED");
    // DTSTAMP: when the booking last changed (here: created at t0), so the feed
    // reads the same on every fetch.
    assert_eq!(e["DTSTAMP"], "20300107T000000Z");
    assert!(!text.contains("bob"));
    let (_, _, again) = api.feed(&path).await;
    assert_eq!(again, text);

    // A cancelled booking stays in the feed as cancelled, so calendars drop it.
    let (status, _, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            Some(&user("ann")),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let evs = events(&api.feed(&path).await.2);
    assert_eq!(evs[0]["STATUS"], "CANCELLED");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_models_feed_names_only_the_viewers_bookings_unless_allowed(pool: PgPool) {
    for (show, bob_seen) in [(false, "a100 #2: booked"), (true, "a100 #2: bob")] {
        let db = pool.clone();
        sqlx::query("TRUNCATE booking, feed_token, waitlist_entry CASCADE")
            .execute(&db)
            .await
            .unwrap();
        let policy = Policy {
            feed_show_names: show,
            ..Policy::default()
        };
        let api = Api::new(db, policy).await;
        let start = t0() + TimeDelta::days(2);
        api.book("ann", start, 3).await;
        api.book("bob", start, 3).await;
        let issued = api.issue("ann").await;
        let path = issued["model_path_template"]
            .as_str()
            .unwrap()
            .replace("{model}", "a100");
        let (status, _, text) = api.feed(&path).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let mut summaries: Vec<String> =
            events(&text).iter().map(|e| e["SUMMARY"].clone()).collect();
        summaries.sort();
        assert_eq!(
            summaries,
            ["a100 #1: your booking", bob_seen],
            "show={show}"
        );
        assert_eq!(text.contains("bob"), show);
        let unknown = issued["model_path_template"]
            .as_str()
            .unwrap()
            .replace("{model}", "h200");
        assert_eq!(api.feed(&unknown).await.0, StatusCode::NOT_FOUND);
    }
}

/// A booking of 2 GPUs is one event that names both units, in either feed; each
/// event's units add up to what is booked.
#[sqlx::test(migrations = "../migrations")]
async fn a_booking_of_several_gpus_shows_every_unit(pool: PgPool) {
    let api = Api::new(
        pool,
        Policy {
            max_units_per_booking: 2,
            ..Policy::default()
        },
    )
    .await;
    let start = t0() + TimeDelta::days(2);
    let (status, _, body) = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            Some(&user("ann")),
            Some(json!({"model": "a100", "units": 2, "start": rfc(start), "end": rfc(start + TimeDelta::days(3))})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_i64()
        .unwrap();
    let description = format!("Booking {id}: 2 a100 GPUs, units #1 and #2.");

    let bob = api.issue("bob").await;
    let path = bob["model_path_template"]
        .as_str()
        .unwrap()
        .replace("{model}", "a100");
    let (status, _, text) = api.feed(&path).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let evs = events(&text);
    assert_eq!(evs.len(), 1, "{text}");
    assert_eq!(evs[0]["SUMMARY"], "2 x a100 (#1, #2): booked");
    assert_eq!(evs[0]["DESCRIPTION"], description);
    // The units in use at the booking's start, counted from the feed alone.
    let in_use: usize = evs
        .iter()
        .filter(|e| e["DTSTART"] == "20300109T000000Z")
        .map(|e| e["DESCRIPTION"].matches('#').count())
        .sum();
    assert_eq!(in_use, 2);

    let ann = api.issue("ann").await;
    let (_, _, text) = api.feed(ann["bookings_path"].as_str().unwrap()).await;
    let evs = events(&text);
    assert_eq!(evs[0]["SUMMARY"], "GPU booking: 2 x a100 (#1, #2)");
    assert_eq!(evs[0]["DESCRIPTION"], description);
}

#[sqlx::test(migrations = "../migrations")]
async fn revoked_and_replaced_tokens_answer_404(pool: PgPool) {
    let api = Api::new(pool.clone(), Policy::default()).await;
    let (_, _, status) = api
        .call(
            Method::GET,
            "/api/v1/me/feed-token",
            Some(&user("ann")),
            None,
        )
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&status).unwrap()["active"],
        false
    );
    let first = api.issue("ann").await;
    let first_path = first["bookings_path"].as_str().unwrap().to_owned();
    assert_eq!(api.feed(&first_path).await.0, StatusCode::OK);
    // The table holds the hash, never the token.
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM feed_token WHERE encode(token_sha256, 'hex') = $1",
    )
    .bind(first["token"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, 0);

    // Re-issued: the old URL is dead, the new one works.
    let second = api.issue("ann").await;
    let second_path = second["bookings_path"].as_str().unwrap().to_owned();
    assert_eq!(api.feed(&first_path).await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.feed(&second_path).await.0, StatusCode::OK);

    // Revoked: 404 for the feed, 204 once, then 404 for the revocation.
    let (s, _, _) = api
        .call(
            Method::DELETE,
            "/api/v1/me/feed-token",
            Some(&user("ann")),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(api.feed(&second_path).await.0, StatusCode::NOT_FOUND);
    let model_path = second["model_path_template"]
        .as_str()
        .unwrap()
        .replace("{model}", "a100");
    assert_eq!(api.feed(&model_path).await.0, StatusCode::NOT_FOUND);
    let (s, _, _) = api
        .call(
            Method::DELETE,
            "/api/v1/me/feed-token",
            Some(&user("ann")),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Garbage tokens are 404 too, and the token endpoints need a bearer token.
    for bad in [
        "x",
        "..",
        &"0".repeat(64),
        &"g".repeat(64),
        &"a".repeat(5000),
    ] {
        let (s, _, _) = api.feed(&format!("/api/v1/feeds/{bad}/bookings.ics")).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{bad}");
    }
    let (s, _, _) = api
        .call(Method::POST, "/api/v1/me/feed-token", None, None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let issued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE action IN ('feed_token.issue', 'feed_token.revoke')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(issued, 3);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_feed_holds_at_most_1000_events(pool: PgPool) {
    let api = Api::new(pool.clone(), Policy::default()).await;
    // 1,200 bookings of one model, one per unit, written directly (the API's rules
    // would take 1,200 users and a lot longer).
    sqlx::query("UPDATE gpu_model SET units = 1200 WHERE name = 'a100'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug)
         SELECT 'u' || i, 'u' || i, 'u' || i FROM generate_series(0, 1199) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO booking (user_name, model, slots, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
         SELECT 'u' || i, 'a100', ARRAY[i], $1, $2, $2, 'test', $3, $3 FROM generate_series(0, 1199) AS i",
    )
    .bind(t0() + TimeDelta::days(1))
    .bind(t0() + TimeDelta::days(2))
    .bind(t0())
    .execute(&pool)
    .await
    .unwrap();
    let issued = api.issue("ann").await;
    let path = issued["model_path_template"]
        .as_str()
        .unwrap()
        .replace("{model}", "a100");
    let (status, _, text) = api.feed(&path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events(&text).len(), 1000);
}

/// A user name may hold `;`, `,` and `\`, which end or escape an iCalendar value:
/// each feed that shows it (the calendar's name, an event's title) escapes it as
/// RFC 5545 (3.3.11) asks, so that a parser reads back the name and nothing more
/// (no extra property, no value cut short).
#[sqlx::test(migrations = "../migrations")]
async fn a_hostile_user_name_is_escaped_in_every_feed(pool: PgPool) {
    let policy = Policy {
        feed_show_names: true,
        ..Policy::default()
    };
    let api = Api::new(pool, policy).await;
    // Lowercase: the service compares names lowercased, and shows them so.
    let hostile = r"ev;il,us\er:x;x-injected=1";
    api.book(hostile, t0() + TimeDelta::days(2), 3).await;

    // Their own feed is named after them.
    let own = api.issue(hostile).await["bookings_path"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, text) = api.feed(&own).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let escaped = r"GPU bookings of ev\;il\,us\\er:x\;x-injected=1";
    assert!(text.contains(&format!("\r\nNAME:{escaped}\r\n")), "{text}");
    assert!(
        text.contains(&format!("\r\nX-WR-CALNAME:{escaped}\r\n")),
        "{text}"
    );
    let unfolded = unfold(&text);
    let cal = read_calendar(&unfolded).expect("an RFC 5545 calendar");
    let mut names: Vec<String> = cal.properties.iter().map(|p| p.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "CALSCALE",
            "NAME",
            "PRODID",
            "REFRESH-INTERVAL",
            "VERSION",
            "X-PUBLISHED-TTL",
            "X-WR-CALNAME"
        ],
        "{text}"
    );
    for p in cal
        .properties
        .iter()
        .filter(|p| p.name == "NAME" || p.name == "X-WR-CALNAME")
    {
        assert!(p.params.is_empty(), "{} got parameters: {text}", p.name);
        assert_eq!(
            unescape(p.val.as_ref()),
            format!("GPU bookings of {hostile}")
        );
    }

    // Another user's occupancy feed shows the name (the policy allows it) in a title.
    let model_feed = api.issue("ann").await["model_path_template"]
        .as_str()
        .unwrap()
        .replace("{model}", "a100");
    let (status, _, text) = api.feed(&model_feed).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        text.contains(r"SUMMARY:a100 #1: ev\;il\,us\\er:x\;x-injected=1"),
        "{text}"
    );
    let evs = events(&text);
    assert_eq!(evs.len(), 1, "{text}");
    assert_eq!(evs[0]["SUMMARY"], format!("a100 #1: {hostile}"));
    assert!(
        evs[0].keys().all(|k| !k.eq_ignore_ascii_case("x-injected")),
        "{text}"
    );
}

/// An RFC 5545 TEXT value read back (3.3.11).
fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n' | 'N') => out.push('\n'),
            Some(escaped) => out.push(escaped),
            None => {}
        }
    }
    out
}
