//! Abuse and odd input: writes beyond a user's or an address's rate answer 429 with
//! `Retry-After` and change nothing; a NUL character anywhere is a 400 in our words,
//! never the database's; HS256 tokens live no longer than the configured ceilings;
//! invisible characters in user names are refused; a stale `If-Match` on a booking
//! answers 412 and changes nothing, also when two changes race; the API's
//! `gpu_booking_database_up` follows the database.
//!
//! Runs on the real Postgres (`DATABASE_URL`); each test gets a fresh, migrated
//! database from `#[sqlx::test]`.

use crate::common::{self, rfc, t0, Reply};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use chrono::{TimeDelta, Utc};
use gpu_booking_api::auth::{Authenticator, Lifetimes};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::error::ApiError;
use gpu_booking_api::state::AppState;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_api::write_limits::WriteGate;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::write_limits::{Limit, WriteLimits};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const SECRET: &[u8] = b"abuse-test-secret-0123456789abcdefghij";

fn state(pool: PgPool) -> AppState {
    test_state(
        pool,
        Policy::default(),
        Arc::new(ManualClock::new(t0())),
        SECRET,
    )
}

fn limits(user: (u32, f64), source: (u32, f64)) -> WriteGate {
    let limit = |(burst, per_second)| Limit { burst, per_second };
    WriteGate::new(WriteLimits::new(limit(user), limit(source), 100))
}

fn token(user: &str, role: Option<&str>) -> String {
    token_for(SECRET, user, role)
}

/// A request as `token`, from `peer` when given (as the service's server records
/// each connection's address).
fn request(
    method: Method,
    uri: &str,
    token: &str,
    body: Option<&Value>,
    peer: Option<&str>,
) -> Request<Body> {
    let mut req = common::request(method, uri, Some(token), body);
    if let Some(peer) = peer {
        let addr: SocketAddr = format!("{peer}:40000").parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(addr));
    }
    req
}

/// The answer and its `Retry-After` header, if any.
async fn send(app: &Router, req: Request<Body>) -> (Reply, Option<String>) {
    answer(app, req, header::RETRY_AFTER).await
}

/// The answer and its header `name`, if any.
async fn answer(
    app: &Router,
    req: Request<Body>,
    name: header::HeaderName,
) -> (Reply, Option<String>) {
    use tower::ServiceExt;
    let resp = app.clone().oneshot(req).await.unwrap();
    let value = resp
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned());
    let status = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let reply = Reply {
        status,
        content_type: String::new(),
        bytes,
    };
    (reply, value)
}

async fn declare_a100(app: &Router) {
    let (r, _) = send(
        app,
        request(
            Method::PUT,
            "/api/v1/models/a100",
            &token("root@lab", Some("admin")),
            Some(&json!({"units": 2})),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

fn booking_body(days_from_now: i64, days: i64) -> Value {
    let start = t0() + TimeDelta::days(days_from_now);
    json!({"model": "a100", "start": rfc(start), "end": rfc(start + TimeDelta::days(days))})
}

#[sqlx::test(migrations = "../migrations")]
async fn a_users_writes_beyond_the_burst_answer_429_and_change_nothing(pool: PgPool) {
    let mut state = state(pool.clone());
    // Three writes at once, then one an hour: the fourth is refused.
    state.writes = limits((3, 1.0 / 3600.0), (0, 1.0));
    let app = gpu_booking_api::app::router(state);
    declare_a100(&app).await;
    let alice = token("alice", None);
    for _ in 0..3 {
        let (r, _) = send(
            &app,
            request(Method::DELETE, "/api/v1/bookings/999", &alice, None, None),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    }
    let (r, retry_after) = send(
        &app,
        request(
            Method::POST,
            "/api/v1/bookings",
            &alice,
            Some(&booking_body(2, 3)),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(retry_after.as_deref(), Some("3600"));
    let body = r.json_or_null();
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("this user"),
        "{body}"
    );
    let bookings: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(bookings, 0, "a refused write writes nothing");
    // Reads are not limited; nor is another user, nor the service role.
    let (r, _) = send(
        &app,
        request(Method::GET, "/api/v1/bookings", &alice, None, None),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let (r, _) = send(
        &app,
        request(
            Method::POST,
            "/api/v1/bookings",
            &token("bob", None),
            Some(&booking_body(2, 3)),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let service = token("webhook", Some("service"));
    for _ in 0..10 {
        let (r, _) = send(
            &app,
            request(
                Method::POST,
                "/api/v1/audit",
                &service,
                Some(&json!({"action": "agent.reclaim"})),
                None,
            ),
        )
        .await;
        assert_ne!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn one_address_is_limited_across_its_users(pool: PgPool) {
    let mut state = state(pool);
    state.writes = limits((0, 1.0), (3, 1.0 / 60.0));
    let app = gpu_booking_api::app::router(state);
    let delete = |user: &str, peer: &str| {
        request(
            Method::DELETE,
            "/api/v1/bookings/999",
            &token(user, None),
            None,
            Some(peer),
        )
    };
    for user in ["a", "b", "c"] {
        let (r, _) = send(&app, delete(user, "10.0.0.1")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    }
    let (r, retry_after) = send(&app, delete("d", "10.0.0.1")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(retry_after.as_deref(), Some("60"));
    assert!(r.text().contains("this address"), "{}", r.text());
    // The same user from another address is served.
    let (r, _) = send(&app, delete("d", "10.0.0.2")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
}

/// Through the service's own server, which records each connection's address: the
/// per-source limit holds for writes sent over TCP.
#[sqlx::test(migrations = "../migrations")]
async fn the_served_port_limits_each_address(pool: PgPool) {
    let mut state = state(pool);
    state.writes = limits((0, 1.0), (2, 1.0 / 60.0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let limits = gpu_booking_api::config::ApiLimits::default();
        let changes = state.changes.clone();
        let app = gpu_booking_api::app::router(state);
        gpu_booking_api::server::serve_router(listener, app, &limits, &changes).await
    });
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for user in ["a", "b", "c"] {
        let resp = client
            .delete(format!("http://{addr}/api/v1/bookings/999"))
            .bearer_auth(token(user, None))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    server.abort();
    assert_eq!(statuses, [404, 404, 429]);
}

/// The words of Postgres's refusals of a NUL (its encoding, its byte syntax).
const DATABASE_WORDS: [&str; 5] = [
    "0x00",
    "UTF8",
    "byte sequence",
    "encoding",
    "\\u0000 cannot",
];

#[sqlx::test(migrations = "../migrations")]
async fn a_nul_anywhere_is_a_400_in_our_words(pool: PgPool) {
    let app = gpu_booking_api::app::router(state(pool.clone()));
    declare_a100(&app).await;
    let alice = token("alice", None);
    let admin = token("root@lab", Some("admin"));
    let service = token("webhook", Some("service"));
    let mut nul_model = booking_body(2, 3);
    nul_model["model"] = json!("a1\u{0}00");
    let cases: Vec<(&str, Request<Body>)> = vec![
        (
            "body string",
            request(
                Method::POST,
                "/api/v1/bookings",
                &alice,
                Some(&nul_model),
                None,
            ),
        ),
        (
            "body key",
            request(
                Method::POST,
                "/api/v1/audit",
                &service,
                Some(&json!({"action": "agent.reclaim", "details": {"a\u{0}": 1}})),
                None,
            ),
        ),
        (
            "audit details",
            request(
                Method::POST,
                "/api/v1/audit",
                &service,
                Some(&json!({"action": "agent.reclaim", "details": {"cmd": "py\u{0}thon"}})),
                None,
            ),
        ),
        (
            "query",
            request(
                Method::GET,
                "/api/v1/bookings?model=a%00",
                &alice,
                None,
                None,
            ),
        ),
        (
            "query of an admin",
            request(Method::GET, "/api/v1/audit?user=a%00", &admin, None, None),
        ),
        (
            "path",
            request(
                Method::GET,
                "/api/v1/models/a%00/availability",
                &alice,
                None,
                None,
            ),
        ),
        (
            "path of a write",
            request(
                Method::PUT,
                "/api/v1/models/a%00/usage",
                &service,
                Some(&json!({"in_use": 1})),
                None,
            ),
        ),
    ];
    for (what, req) in cases {
        let (r, _) = send(&app, req).await;
        let body = r.json_or_null();
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert_eq!(body["error"], "bad_request", "{what}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("NUL"), "{what}: {message}");
        for words in DATABASE_WORDS {
            assert!(!message.contains(words), "{what}: {message}");
        }
    }
    let audit_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE actor = 'webhook'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audit_rows, 0);

    // A data exception that gets past every check is worded here too, never
    // passed on: the database's own refusals, answered as the API would.
    for (sql, bind, ours) in [
        ("SELECT $1::text", "a\u{0}b", "cannot be stored"),
        ("SELECT $1::jsonb", r#""a\u0000b""#, "cannot be stored"),
        ("SELECT $1::int", "2147483648", "out of range"),
    ] {
        let e = sqlx::query(sql)
            .bind(bind)
            .execute(&pool)
            .await
            .unwrap_err();
        let database_text = e.to_string();
        let api = ApiError::from(e);
        assert_eq!(
            api.status(),
            StatusCode::BAD_REQUEST,
            "{sql}: {database_text}"
        );
        let message = api.to_string();
        assert!(message.contains(ours), "{sql}: {message}");
        assert!(!database_text.contains(&message), "{sql}");
        for words in DATABASE_WORDS {
            assert!(!message.contains(words), "{sql}: {message}");
        }
    }
}

fn hs256(claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET),
    )
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn hs256_tokens_live_no_longer_than_the_ceilings(pool: PgPool) {
    let app = gpu_booking_api::app::router(state(pool.clone()));
    let now = Utc::now().timestamp();
    let day = 86_400;
    let cases = [
        (
            "a person's day",
            json!({"sub": "alice", "iat": now, "exp": now + day}),
            None,
        ),
        (
            "a person's 100 years",
            json!({"sub": "alice", "iat": now, "exp": now + 36_500 * day}),
            Some("--max-token-lifetime"),
        ),
        (
            "a person's 100 years without iat",
            json!({"sub": "alice", "exp": now + 36_500 * day}),
            Some("--max-token-lifetime"),
        ),
        (
            "an admin's 2 days",
            json!({"sub": "root", "roles": ["admin"], "iat": now, "exp": now + 2 * day}),
            Some("--max-token-lifetime"),
        ),
        (
            "the service token's 300 days",
            json!({"sub": "svc", "roles": ["service"], "iat": now, "exp": now + 300 * day}),
            None,
        ),
        (
            "the service token's 10 years",
            json!({"sub": "svc", "roles": ["service"], "iat": now, "exp": now + 3650 * day}),
            Some("--max-service-token-lifetime"),
        ),
    ];
    for (what, claims, refused) in cases {
        let (r, _) = send(
            &app,
            request(Method::GET, "/api/v1/policy", &hs256(&claims), None, None),
        )
        .await;
        match refused {
            None => assert_eq!(r.status, StatusCode::OK, "{what}: {}", r.text()),
            Some(flag) => {
                assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {}", r.text());
                let message = r.json_or_null()["message"].as_str().unwrap().to_owned();
                assert!(
                    message.contains(flag) && message.contains("lives longer"),
                    "{what}: {message}"
                );
            }
        }
    }
    // The ceilings are the options': one hour for people here.
    let mut short = state(pool);
    short.auth = Authenticator::new(Some(SECRET), None).with_hs256_lifetimes(Lifetimes {
        person: Duration::from_secs(3600),
        service: Duration::from_secs(7200),
    });
    let app = gpu_booking_api::app::router(short);
    let two_hours = json!({"sub": "alice", "iat": now, "exp": now + 7200});
    let (r, _) = send(
        &app,
        request(
            Method::GET,
            "/api/v1/policy",
            &hs256(&two_hours),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(r.text().contains("1 h"), "{}", r.text());
    let service = json!({"sub": "svc", "roles": ["service"], "iat": now, "exp": now + 7200});
    let (r, _) = send(
        &app,
        request(Method::GET, "/api/v1/policy", &hs256(&service), None, None),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[sqlx::test(migrations = "../migrations")]
async fn user_names_with_invisible_characters_are_refused(pool: PgPool) {
    let app = gpu_booking_api::app::router(state(pool.clone()));
    declare_a100(&app).await;
    let admin = token("root@lab", Some("admin"));
    // A token for `alice` + ZERO WIDTH SPACE names nobody.
    let (r, _) = send(
        &app,
        request(
            Method::GET,
            "/api/v1/bookings",
            &token("alice\u{200b}", None),
            None,
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(r.text().contains("U+200B"), "{}", r.text());
    for (what, name) in [
        ("zero width space", "bob\u{200b}"),
        ("byte order mark", "\u{feff}bob"),
        ("right-to-left override", "bob\u{202e}"),
        ("zero width joiner", "b\u{200d}ob"),
    ] {
        let mut body = booking_body(2, 3);
        body["user"] = json!(name);
        let (r, _) = send(
            &app,
            request(Method::POST, "/api/v1/bookings", &admin, Some(&body), None),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            r.text()
        );
        assert!(r.text().contains("invisible"), "{what}: {}", r.text());
        let uri = format!("/api/v1/bookings?user={}", urlencode(name));
        let (r, _) = send(&app, request(Method::GET, &uri, &admin, None, None)).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            r.text()
        );
    }
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM app_user")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(users, 0, "no user was made");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The answer and its `ETag`.
async fn tagged(app: &Router, req: Request<Body>) -> (StatusCode, Value, Option<String>) {
    let (reply, etag) = answer(app, req, header::ETAG).await;
    (reply.status, reply.json_or_null(), etag)
}

fn with_if_match(mut req: Request<Body>, tag: &str) -> Request<Body> {
    req.headers_mut()
        .insert(header::IF_MATCH, tag.parse().unwrap());
    req
}

#[sqlx::test(migrations = "../migrations")]
async fn a_stale_if_match_answers_412_and_changes_nothing(pool: PgPool) {
    let app = gpu_booking_api::app::router(state(pool));
    declare_a100(&app).await;
    let alice = token("alice", None);
    let (status, created, etag) = tagged(
        &app,
        request(
            Method::POST,
            "/api/v1/bookings",
            &alice,
            Some(&booking_body(2, 3)),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(etag.is_none(), "a create answers no ETag of its own");
    let uri = format!("/api/v1/bookings/{}", created["id"]);
    let get = || request(Method::GET, &uri, &alice, None, None);
    let patch = |days: i64| {
        let end = t0() + TimeDelta::days(2 + days);
        request(
            Method::PATCH,
            &uri,
            &alice,
            Some(&json!({"end": rfc(end)})),
            None,
        )
    };
    let (status, read, first) = tagged(&app, get()).await;
    assert_eq!(status, StatusCode::OK);
    let first = first.expect("GET answers an ETag");
    assert_eq!(
        tagged(&app, get()).await.2.as_deref(),
        Some(first.as_str()),
        "stable"
    );

    // With the current tag: changed, and the answer carries the new tag.
    let (status, changed, second) = tagged(&app, with_if_match(patch(4), &first)).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    let second = second.expect("PATCH answers an ETag");
    assert_ne!(second, first);
    assert_eq!(
        tagged(&app, get()).await.2.as_deref(),
        Some(second.as_str())
    );

    // With the old one: 412, and the booking is as the second write left it.
    for req in [
        with_if_match(patch(5), &first),
        with_if_match(request(Method::DELETE, &uri, &alice, None, None), &first),
        with_if_match(patch(5), &format!("W/{second}")),
    ] {
        let (status, body, _) = tagged(&app, req).await;
        assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
        assert_eq!(body["error"], "precondition_failed", "{body}");
    }
    let (_, now, tag) = tagged(&app, get()).await;
    assert_eq!(
        (now["end"].clone(), tag),
        (changed["end"].clone(), Some(second.clone()))
    );
    assert_ne!(now["end"], read["end"]);

    // A malformed If-Match is the caller's mistake.
    let (status, body, _) = tagged(&app, with_if_match(patch(5), "not-a-tag")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    // `*` and no If-Match at all change the booking as it is.
    let (status, _, _) = tagged(&app, with_if_match(patch(5), "*")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, cancelled, _) =
        tagged(&app, request(Method::DELETE, &uri, &alice, None, None)).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
}

/// Two people change one booking at once, each from the state they read: one
/// change is made, the other is refused with 412 (the second sees the first's
/// write under the booking's row lock). Without If-Match, both are made, the last
/// one winning, as before.
#[sqlx::test(migrations = "../migrations")]
async fn of_two_racing_changes_from_one_state_one_wins(pool: PgPool) {
    let app = gpu_booking_api::app::router(state(pool));
    declare_a100(&app).await;
    let alice = token("alice", None);
    let admin = token("root@lab", Some("admin"));
    let (_, created, _) = tagged(
        &app,
        request(
            Method::POST,
            "/api/v1/bookings",
            &alice,
            Some(&booking_body(2, 3)),
            None,
        ),
    )
    .await;
    let uri = format!("/api/v1/bookings/{}", created["id"]);
    let end = |days: i64| rfc(t0() + TimeDelta::days(2 + days));
    for round in 0..5 {
        let (_, _, tag) = tagged(&app, request(Method::GET, &uri, &alice, None, None)).await;
        let tag = tag.unwrap();
        let (a, b) = (end(4 + round % 2), end(6 + round % 2));
        let first = with_if_match(
            request(Method::PATCH, &uri, &alice, Some(&json!({"end": a})), None),
            &tag,
        );
        let second = with_if_match(
            request(Method::PATCH, &uri, &admin, Some(&json!({"end": b})), None),
            &tag,
        );
        let (one, two) = tokio::join!(tagged(&app, first), tagged(&app, second));
        let mut statuses = [one.0, two.0];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::OK, StatusCode::PRECONDITION_FAILED],
            "round {round}: {} / {}",
            one.1,
            two.1
        );
        let winner = if one.0 == StatusCode::OK { &one } else { &two };
        let (_, now, now_tag) = tagged(&app, request(Method::GET, &uri, &alice, None, None)).await;
        assert_eq!(now["end"], winner.1["end"], "round {round}");
        assert_eq!(now_tag, winner.2, "round {round}");
    }
    // Without If-Match both changes are made.
    let (one, two) = tokio::join!(
        tagged(
            &app,
            request(
                Method::PATCH,
                &uri,
                &alice,
                Some(&json!({"end": end(3)})),
                None
            )
        ),
        tagged(
            &app,
            request(
                Method::PATCH,
                &uri,
                &admin,
                Some(&json!({"end": end(9)})),
                None
            )
        ),
    );
    assert_eq!(
        (one.0, two.0),
        (StatusCode::OK, StatusCode::OK),
        "{} / {}",
        one.1,
        two.1
    );
}

fn database_up(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("gpu_booking_database_up "))
}

#[sqlx::test(migrations = "../migrations")]
async fn the_database_gauge_follows_the_database(pool: PgPool) {
    let admin = token("root@lab", Some("admin"));
    let live = state(pool);
    let metrics = live.metrics.clone();
    metrics.probe_database(&live.pool).await;
    assert_eq!(metrics.database_up.get(), 1);
    let app = gpu_booking_api::app::router(live);
    let (r, _) = send(&app, common::request(Method::GET, "/metrics", None, None)).await;
    assert_eq!(database_up(&r.text()), Some("1"), "{}", r.text());

    // Port 1 on loopback: nothing listens.
    let gone = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let down = state(gone);
    let metrics = down.metrics.clone();
    metrics.database_up.set(1);
    let app = gpu_booking_api::app::router(down.clone());
    // A request that finds the database gone sets it to 0 ...
    let (r, _) = send(
        &app,
        request(Method::GET, "/api/v1/bookings", &admin, None, None),
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(metrics.database_up.get(), 0);
    // ... and so does the periodic probe, and a scrape.
    metrics.database_up.set(1);
    metrics.probe_database(&down.pool).await;
    assert_eq!(metrics.database_up.get(), 0);
    metrics.database_up.set(1);
    let (r, _) = send(&app, common::request(Method::GET, "/metrics", None, None)).await;
    assert_eq!(database_up(&r.text()), Some("0"), "{}", r.text());
}
