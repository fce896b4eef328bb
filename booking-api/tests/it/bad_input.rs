//! Bad input of every kind: each gets its clear JSON error (never a 500) and
//! changes nothing in the database.
//!
//! Runs on the real Postgres (`DATABASE_URL`); each test gets a fresh, migrated
//! database from `#[sqlx::test]`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

const SECRET: &[u8] = b"bad-input-test-secret-0123456789abcdef";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 7, 0, 0, 0).unwrap()
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[derive(Clone, Copy, Debug)]
enum Who {
    Alice,
    Admin,
    Service,
}

impl Who {
    fn token(self) -> String {
        match self {
            Who::Alice => token_for(SECRET, "alice", None),
            Who::Admin => token_for(SECRET, "root@lab", Some("admin")),
            Who::Service => token_for(SECRET, "webhook", Some("service")),
        }
    }
}

enum B {
    None,
    Json(Value),
    /// A body with the given content type (None: no Content-Type header).
    Raw(Option<&'static str>, Vec<u8>),
}

struct Case {
    name: String,
    method: Method,
    uri: String,
    who: Who,
    body: B,
    /// Accepted statuses (the first is the one we expect; more than one only
    /// where the HTTP answer is legitimately one of several).
    status: &'static [u16],
    /// The expected `error` code, when there is one to insist on.
    code: Option<&'static str>,
}

fn case(
    name: impl Into<String>,
    method: Method,
    uri: impl Into<String>,
    who: Who,
    body: B,
    status: &'static [u16],
    code: Option<&'static str>,
) -> Case {
    Case {
        name: name.into(),
        method,
        uri: uri.into(),
        who,
        body,
        status,
        code,
    }
}

struct Api {
    app: Router,
    pool: PgPool,
}

struct Resp {
    status: StatusCode,
    text: String,
    json: Option<Value>,
}

impl Api {
    fn new(pool: PgPool) -> Api {
        let clock = Arc::new(ManualClock::new(t0()));
        Api {
            app: gpu_booking_api::app::router(test_state(
                pool.clone(),
                Policy::default(),
                clock,
                SECRET,
            )),
            pool,
        }
    }

    async fn send(&self, method: Method, uri: &str, who: Who, body: &B) -> Resp {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", who.token()));
        let req = match body {
            B::None => req.body(Body::empty()).unwrap(),
            B::Json(v) => req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(v.to_string()))
                .unwrap(),
            B::Raw(Some(ct), bytes) => req
                .header(header::CONTENT_TYPE, *ct)
                .body(Body::from(bytes.clone()))
                .unwrap(),
            B::Raw(None, bytes) => req.body(Body::from(bytes.clone())).unwrap(),
        };
        // Spawned, so that a handler that panics is reported as a failure of its
        // case (a real server would drop the connection) instead of ending the test.
        let resp = match tokio::spawn(self.app.clone().oneshot(req)).await {
            Ok(resp) => resp.expect("the router is infallible"),
            Err(e) => {
                return Resp {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    text: format!("the handler panicked: {e}"),
                    json: None,
                }
            }
        };
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        Resp {
            status,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            json: serde_json::from_slice(&bytes).ok(),
        }
    }

    /// Row counts and a fingerprint of the contents of every table a request could
    /// change.
    async fn snapshot(&self) -> Vec<(String, i64, String)> {
        let mut out = Vec::new();
        for table in ["booking", "audit_event", "gpu_model", "app_user"] {
            let (count, digest): (i64, String) = sqlx::query_as(&format!(
                "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} t"
            ))
            .fetch_one(&self.pool)
            .await
            .unwrap();
            out.push((table.to_string(), count, digest));
        }
        out
    }

    /// Sends every case; collects every way one went wrong.
    async fn run(&self, cases: Vec<Case>) {
        let before = self.snapshot().await;
        let mut failures = Vec::new();
        let total = cases.len();
        for c in cases {
            let r = self.send(c.method.clone(), &c.uri, c.who, &c.body).await;
            let what = format!(
                "{} ({} {} as {:?})",
                c.name,
                c.method,
                shorten(&c.uri),
                c.who
            );
            if r.status.is_server_error() {
                failures.push(format!(
                    "{what}: server error {}: {}",
                    r.status,
                    shorten(&r.text)
                ));
                continue;
            }
            if !c.status.contains(&r.status.as_u16()) {
                failures.push(format!(
                    "{what}: want status {:?}, got {}: {}",
                    c.status,
                    r.status,
                    shorten(&r.text)
                ));
            }
            let body_ok = r.json.as_ref().is_some_and(|j| {
                j["error"].as_str().is_some_and(|e| !e.is_empty())
                    && j["message"].as_str().is_some_and(|m| !m.is_empty())
            });
            if !body_ok {
                failures.push(format!(
                    "{what}: want a JSON body with error and message, got {:?}",
                    shorten(&r.text)
                ));
            } else if let Some(code) = c.code {
                let got = r.json.as_ref().unwrap()["error"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if got != code {
                    failures.push(format!(
                        "{what}: want error {code:?}, got {got:?}: {}",
                        shorten(&r.text)
                    ));
                }
            }
            let after = self.snapshot().await;
            if after != before {
                failures.push(format!(
                    "{what}: the database changed:\n  before {before:?}\n  after  {after:?}"
                ));
                break;
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {total} cases failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

fn shorten(s: &str) -> String {
    if s.len() > 240 {
        format!(
            "{}... ({} bytes)",
            &s[..s
                .char_indices()
                .take_while(|(i, _)| *i < 240)
                .last()
                .map_or(0, |(i, _)| i)],
            s.len()
        )
    } else {
        s.to_string()
    }
}

/// A model `a100` with 2 units and a planned booking of alice: the state every bad
/// request must leave as it found it.
async fn seeded(pool: PgPool) -> (Api, i64) {
    let api = Api::new(pool);
    let r = api
        .send(
            Method::PUT,
            "/api/v1/models/a100",
            Who::Admin,
            &B::Json(json!({"units": 2, "patterns": ["*A100*"]})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let start = t0() + TimeDelta::days(1);
    let r = api
        .send(
            Method::POST,
            "/api/v1/bookings",
            Who::Alice,
            &B::Json(json!({"model": "a100", "start": rfc(start), "end": rfc(start + TimeDelta::days(2))})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let booking = r.json.unwrap()["id"].as_i64().unwrap();
    (api, booking)
}

fn window(start: DateTime<Utc>, days: i64) -> (String, String) {
    (rfc(start), rfc(start + TimeDelta::days(days)))
}

const BAD_REQUEST: &[u16] = &[400];
const UNPROCESSABLE: &[u16] = &[422];
/// A body that is not JSON at all: 400 is what the API promises; 415 would be
/// the HTTP-purist answer to a wrong content type, also clear.
const NOT_JSON: &[u16] = &[400, 415];

#[sqlx::test(migrations = "../migrations")]
async fn bad_booking_bodies(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    let (s, e) = window(t0() + TimeDelta::days(40), 2);
    let valid = json!({"model": "a100", "start": s, "end": e});
    let valid_text = valid.to_string().into_bytes();
    let post = |name: &str, body: B, status: &'static [u16], code: Option<&'static str>| {
        case(
            name,
            Method::POST,
            "/api/v1/bookings",
            Who::Alice,
            body,
            status,
            code,
        )
    };
    let with = |k: &str, v: Value| {
        let mut b = valid.clone();
        b[k] = v;
        B::Json(b)
    };
    let without = |k: &str| {
        let mut b = valid.clone();
        b.as_object_mut().unwrap().remove(k);
        B::Json(b)
    };
    let mut cases = vec![
        // Not JSON, or not the JSON we take.
        post(
            "truncated JSON",
            B::Raw(Some("application/json"), b"{\"model\": \"a100\", ".to_vec()),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "empty body",
            B::Raw(Some("application/json"), vec![]),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "not JSON at all",
            B::Raw(Some("application/json"), b"model=a100".to_vec()),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "trailing garbage",
            B::Raw(
                Some("application/json"),
                [valid_text.clone(), b"}".to_vec()].concat(),
            ),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "invalid UTF-8",
            B::Raw(Some("application/json"), b"{\"model\": \"a\xff\"}".to_vec()),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "JSON null",
            B::Json(Value::Null),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "JSON array",
            B::Json(json!([valid.clone()])),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "JSON string",
            B::Json(json!("a100")),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "JSON number",
            B::Json(json!(42)),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "text/plain content type",
            B::Raw(Some("text/plain"), valid_text.clone()),
            NOT_JSON,
            None,
        ),
        post(
            "form content type",
            B::Raw(
                Some("application/x-www-form-urlencoded"),
                valid_text.clone(),
            ),
            NOT_JSON,
            None,
        ),
        post(
            "no content type",
            B::Raw(None, valid_text.clone()),
            NOT_JSON,
            None,
        ),
        post(
            "a 3 MB body",
            B::Raw(Some("application/json"), {
                let mut b = valid.clone();
                b["pad"] = json!("x".repeat(3 << 20));
                b.to_string().into_bytes()
            }),
            &[400, 413],
            None,
        ),
        // Wrong JSON types.
        post(
            "model is a number",
            with("model", json!(100)),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "model is null",
            with("model", Value::Null),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "model is an object",
            with("model", json!({"name": "a100"})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "start is a number",
            with("start", json!(1_893_456_000)),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "end is an array",
            with("end", json!([e])),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "override is a string",
            with("override", json!("yes")),
            &[400, 403],
            None,
        ),
        post(
            "user is a number",
            with("user", json!(7)),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        // Missing and unknown fields.
        post(
            "missing model",
            without("model"),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "missing start",
            without("start"),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "missing end",
            without("end"),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "empty object",
            B::Json(json!({})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "unknown field",
            with("colour", json!("red")),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "unknown field slot",
            with("slot", json!(0)),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        post(
            "misspelt field",
            {
                let mut b = valid.clone();
                b.as_object_mut().unwrap().remove("end");
                b["ends"] = json!(e);
                B::Json(b)
            },
            BAD_REQUEST,
            Some("bad_request"),
        ),
        // Windows and models.
        post(
            "start equals end",
            with("end", json!(s)),
            UNPROCESSABLE,
            Some("invalid_window"),
        ),
        post(
            "end before start",
            B::Json(json!({"model": "a100", "start": e, "end": s})),
            UNPROCESSABLE,
            Some("invalid_window"),
        ),
        post(
            "unknown model",
            with("model", json!("h100")),
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
        post(
            "empty model",
            with("model", json!("")),
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
        post(
            "model of 10 KB",
            with("model", json!("a".repeat(10_000))),
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
        post(
            "model in other case",
            with("model", json!("A100")),
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
    ];
    // Times that are not RFC 3339.
    for bad in [
        "",
        "tomorrow",
        "2030-02-17",
        "2030-02-17T00:00:00",
        "2030-02-17T00:00",
        "17/02/2030 00:00",
        "2030-13-01T00:00:00Z",
        "2030-02-30T00:00:00Z",
        "2030-02-17T24:00:01Z",
        "2030-02-17T00:60:00Z",
        "2030-02-17T00:00:00+25:00",
        "1893456000",
        "2030-02-17T00:00:00Zjunk",
    ] {
        cases.push(post(
            &format!("start {bad:?}"),
            with("start", json!(bad)),
            BAD_REQUEST,
            Some("bad_request"),
        ));
        cases.push(post(
            &format!("end {bad:?}"),
            with("end", json!(bad)),
            BAD_REQUEST,
            Some("bad_request"),
        ));
    }
    // An admin's booking for a hostile user name.
    let (s2, e2) = window(t0() + TimeDelta::days(60), 2);
    for (name, user) in [
        ("user with a newline", "alice\nroot".to_string()),
        ("user with an ESC", "\u{1b}[31malice".to_string()),
        ("user with DEL", "alice\u{7f}".to_string()),
        ("user with a C1 control", "alice\u{85}".to_string()),
        ("user of 300 bytes", "a".repeat(300)),
        ("user of 257 bytes", "a".repeat(257)),
        ("empty user", String::new()),
        ("user with a leading space", " alice".to_string()),
        ("user with a trailing tab", "alice\t".to_string()),
    ] {
        cases.push(case(
            name,
            Method::POST,
            "/api/v1/bookings",
            Who::Admin,
            B::Json(json!({"model": "a100", "start": s2, "end": e2, "user": user})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ));
        cases.push(case(
            format!("{name}, with override"),
            Method::POST,
            "/api/v1/bookings",
            Who::Admin,
            B::Json(
                json!({"model": "a100", "start": s2, "end": e2, "user": user, "override": true}),
            ),
            UNPROCESSABLE,
            Some("invalid_request"),
        ));
    }
    // A NUL is refused before any field is read (`extract::refuse_nul`).
    cases.push(case(
        "user with a NUL",
        Method::POST,
        "/api/v1/bookings",
        Who::Admin,
        B::Json(json!({"model": "a100", "start": s2, "end": e2, "user": "alice\u{0}"})),
        BAD_REQUEST,
        Some("bad_request"),
    ));
    // Invalid windows stay invalid with an admin override.
    cases.push(case(
        "override with start equal to end",
        Method::POST,
        "/api/v1/bookings",
        Who::Admin,
        B::Json(json!({"model": "a100", "start": s2, "end": s2, "user": "bob", "override": true})),
        UNPROCESSABLE,
        Some("invalid_window"),
    ));
    cases.push(case(
        "override with unknown model",
        Method::POST,
        "/api/v1/bookings",
        Who::Admin,
        B::Json(json!({"model": "nope", "start": s2, "end": e2, "user": "bob", "override": true})),
        UNPROCESSABLE,
        Some("unknown_model"),
    ));
    api.run(cases).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_paths_and_queries(pool: PgPool) {
    let (api, booking) = seeded(pool).await;
    let get =
        |name: &str, uri: String, who: Who, status: &'static [u16], code: Option<&'static str>| {
            case(name, Method::GET, uri, who, B::None, status, code)
        };
    let cases = vec![
        // Non-numeric and out-of-range ids.
        get(
            "booking id abc",
            "/api/v1/bookings/abc".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id 1.5",
            "/api/v1/bookings/1.5".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id -",
            "/api/v1/bookings/-".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id past i64",
            "/api/v1/bookings/99999999999999999999".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id 0x1",
            "/api/v1/bookings/0x1".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id with SQL",
            "/api/v1/bookings/1%20OR%201=1".into(),
            Who::Admin,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "booking id negative",
            "/api/v1/bookings/-1".into(),
            Who::Alice,
            &[404],
            Some("not_found"),
        ),
        get(
            "booking id i64::MIN",
            format!("/api/v1/bookings/{}", i64::MIN),
            Who::Admin,
            &[404],
            Some("not_found"),
        ),
        case(
            "delete booking abc",
            Method::DELETE,
            "/api/v1/bookings/abc",
            Who::Alice,
            B::None,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        case(
            "delete booking 1e3",
            Method::DELETE,
            "/api/v1/bookings/1e3",
            Who::Alice,
            B::None,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        case(
            "delete booking that is not there",
            Method::DELETE,
            "/api/v1/bookings/424242",
            Who::Admin,
            B::None,
            &[404],
            Some("not_found"),
        ),
        // List filters.
        get(
            "limit 0",
            "/api/v1/bookings?limit=0".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "limit -1",
            "/api/v1/bookings?limit=-1".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "limit 1001",
            "/api/v1/bookings?limit=1001".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "limit i64::MAX",
            format!("/api/v1/bookings?limit={}", i64::MAX),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "limit past i64",
            "/api/v1/bookings?limit=99999999999999999999999".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "limit abc",
            "/api/v1/bookings?limit=abc".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "all=maybe",
            "/api/v1/bookings?all=maybe".into(),
            Who::Admin,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "from garbage",
            "/api/v1/bookings?from=yesterday".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "to date only",
            "/api/v1/bookings?to=2030-01-01".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "unknown query parameter",
            "/api/v1/bookings?colour=red".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "audit limit 100000",
            "/api/v1/audit?limit=100000".into(),
            Who::Admin,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "audit limit 0",
            "/api/v1/audit?limit=0".into(),
            Who::Admin,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "audit before abc",
            "/api/v1/audit?before=abc".into(),
            Who::Admin,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        // next-start.
        get(
            "next-start without model",
            "/api/v1/me/next-start".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "next-start unknown model",
            "/api/v1/me/next-start?model=h100".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
        get(
            "next-start days=abc",
            "/api/v1/me/next-start?model=a100&days=abc".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "next-start days=0",
            "/api/v1/me/next-start?model=a100&days=0".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_window"),
        ),
        get(
            "next-start days=1 is fine but days=0.5 is not a number",
            "/api/v1/me/next-start?model=a100&days=0.5".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "next-start days=-3",
            "/api/v1/me/next-start?model=a100&days=-3".into(),
            Who::Alice,
            UNPROCESSABLE,
            None,
        ),
        get(
            "next-start days=15",
            "/api/v1/me/next-start?model=a100&days=15".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("duration_too_long"),
        ),
        get(
            "next-start days=i64::MAX",
            format!("/api/v1/me/next-start?model=a100&days={}", i64::MAX),
            Who::Alice,
            UNPROCESSABLE,
            None,
        ),
        get(
            "next-start days=i64::MIN",
            format!("/api/v1/me/next-start?model=a100&days={}", i64::MIN),
            Who::Alice,
            UNPROCESSABLE,
            None,
        ),
        // availability.
        get(
            "availability from garbage",
            "/api/v1/models/a100/availability?from=soon".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "availability to garbage",
            "/api/v1/models/a100/availability?to=2030-02-30".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "availability to before from",
            "/api/v1/models/a100/availability?from=2030-02-01&to=2030-01-01".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "availability empty span",
            "/api/v1/models/a100/availability?from=2030-02-01&to=2030-02-01".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "availability 367 days",
            "/api/v1/models/a100/availability?from=2030-01-01&to=2031-01-03".into(),
            Who::Alice,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "availability at the end of time",
            "/api/v1/models/a100/availability?from=262142-12-20".into(),
            Who::Alice,
            &[400, 422],
            None,
        ),
        get(
            "availability huge year",
            "/api/v1/models/a100/availability?from=99999999-01-01".into(),
            Who::Alice,
            &[400, 422],
            None,
        ),
        get(
            "availability unknown model",
            "/api/v1/models/h100/availability".into(),
            Who::Alice,
            &[404],
            Some("not_found"),
        ),
        get(
            "availability unknown parameter",
            "/api/v1/models/a100/availability?days=3".into(),
            Who::Alice,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        // schedulability.
        get(
            "schedulability with user and slug",
            "/api/v1/schedulability?user=alice&slug=alice".into(),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        // (Neither user nor slug is a pod without identity: the free units only.)
        get(
            "schedulability with a slug of control characters",
            "/api/v1/schedulability?slug=a%0Ab".into(),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability empty user",
            "/api/v1/schedulability?user=".into(),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability user with newline",
            "/api/v1/schedulability?user=alice%0Aroot".into(),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability user of 300 bytes",
            format!("/api/v1/schedulability?user={}", "a".repeat(300)),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability empty slug",
            "/api/v1/schedulability?slug=".into(),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability slug with NUL",
            "/api/v1/schedulability?slug=a%00b".into(),
            Who::Service,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "schedulability slug of 300 bytes",
            format!("/api/v1/schedulability?slug={}", "a".repeat(300)),
            Who::Service,
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        get(
            "schedulability unknown parameter",
            "/api/v1/schedulability?user=alice&pod=x".into(),
            Who::Service,
            BAD_REQUEST,
            Some("bad_request"),
        ),
        get(
            "schedulability repeated user",
            "/api/v1/schedulability?user=alice&user=bob".into(),
            Who::Service,
            BAD_REQUEST,
            Some("bad_request"),
        ),
    ];
    // Ids that exist, so that the bad ones above are bad for their form only.
    let ok = api
        .send(
            Method::GET,
            &format!("/api/v1/bookings/{booking}"),
            Who::Alice,
            &B::None,
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    api.run(cases).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_model_and_usage_bodies(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    let put = |name: &str, model: &str, body: Value| {
        case(
            name,
            Method::PUT,
            format!("/api/v1/models/{model}"),
            Who::Admin,
            B::Json(body),
            UNPROCESSABLE,
            Some("invalid_request"),
        )
    };
    let mut cases = Vec::new();
    for (name, model) in [
        ("uppercase", "A100"),
        ("leading dash", "-a100"),
        ("trailing dot", "a100."),
        ("underscore", "a_100"),
        ("space", "a%20100"),
        ("slash-escaped", "a%2F100"),
        ("unicode", "%E2%82%AC100"),
        ("newline", "a%0A"),
        ("64 characters", &"a".repeat(64)),
        ("1000 characters", &"a".repeat(1000)),
    ] {
        cases.push(put(
            &format!("model name {name}"),
            model,
            json!({"units": 1}),
        ));
    }
    // A NUL is refused before any field is read (`extract::refuse_nul`).
    cases.push(case(
        "model name NUL",
        Method::PUT,
        "/api/v1/models/a%00",
        Who::Admin,
        B::Json(json!({"units": 1})),
        BAD_REQUEST,
        Some("bad_request"),
    ));
    for (name, patterns) in [
        ("empty pattern", json!([""])),
        ("pattern with a control character", json!(["*A100\u{7}*"])),
        ("pattern with a newline", json!(["A100\n"])),
        ("non-ASCII pattern", json!(["*Ä100*"])),
        ("pattern of 129 characters", json!(["A".repeat(129)])),
        ("65 patterns", json!(vec!["*A100*"; 65])),
    ] {
        cases.push(put(name, "b200", json!({"units": 1, "patterns": patterns})));
    }
    for (name, body) in [
        ("negative units", json!({"units": -1})),
        ("units i32::MIN", json!({"units": i32::MIN})),
        ("units over 100000", json!({"units": 100_001})),
        ("negative gpumem", json!({"units": 1, "gpumem_mib": -1})),
        ("empty resource", json!({"units": 1, "resource": ""})),
        (
            "resource with a space",
            json!({"units": 1, "resource": "nvidia.com/a 100"}),
        ),
        (
            "resource with a newline",
            json!({"units": 1, "resource": "nvidia.com/a100\n"}),
        ),
        (
            "resource of 300 bytes",
            json!({"units": 1, "resource": "r".repeat(300)}),
        ),
    ] {
        cases.push(put(name, "b200", body));
    }
    for (name, body) in [
        ("units is a string", json!({"units": "two"})),
        ("units is a float", json!({"units": 1.5})),
        ("units past i32", json!({"units": 3_000_000_000u64})),
        ("units missing", json!({"patterns": ["*"]})),
        (
            "patterns is a string",
            json!({"units": 1, "patterns": "*A100*"}),
        ),
        (
            "patterns hold a number",
            json!({"units": 1, "patterns": [1]}),
        ),
        ("unknown field", json!({"units": 1, "colour": "red"})),
        (
            "position past i32",
            json!({"units": 1, "position": 1u64 << 40}),
        ),
    ] {
        cases.push(case(
            name,
            Method::PUT,
            "/api/v1/models/b200",
            Who::Admin,
            B::Json(body),
            BAD_REQUEST,
            Some("bad_request"),
        ));
    }
    // Usage reports.
    let usage =
        |name: &str, model: &str, body: B, status: &'static [u16], code: Option<&'static str>| {
            case(
                name,
                Method::PUT,
                format!("/api/v1/models/{model}/usage"),
                Who::Service,
                body,
                status,
                code,
            )
        };
    cases.extend([
        usage(
            "negative in_use",
            "a100",
            B::Json(json!({"in_use": -1})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        usage(
            "negative units",
            "a100",
            B::Json(json!({"in_use": 0, "units": -1})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        usage(
            "units over 100000",
            "a100",
            B::Json(json!({"in_use": 0, "units": 100_001})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        usage(
            "negative cards",
            "a100",
            B::Json(json!({"in_use": 0, "cards": -1})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        usage(
            "negative gpumem per unit",
            "a100",
            B::Json(json!({"in_use": 0, "gpumem_advertised": true, "gpumem_unit_mib": -1})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        usage(
            "in_use a float",
            "a100",
            B::Json(json!({"in_use": 0.5})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        usage(
            "in_use past i32",
            "a100",
            B::Json(json!({"in_use": 1u64 << 33})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        usage(
            "in_use missing",
            "a100",
            B::Json(json!({})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        usage(
            "unknown field",
            "a100",
            B::Json(json!({"in_use": 0, "free": 2})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        usage(
            "malformed JSON",
            "a100",
            B::Raw(Some("application/json"), b"{in_use: 1}".to_vec()),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        usage(
            "unknown model",
            "h100",
            B::Json(json!({"in_use": 1})),
            UNPROCESSABLE,
            Some("unknown_model"),
        ),
    ]);
    api.run(cases).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_audit_bodies(pool: PgPool) {
    let (api, booking) = seeded(pool).await;
    let audit = |name: &str, body: B, status: &'static [u16], code: Option<&'static str>| {
        case(
            name,
            Method::POST,
            "/api/v1/audit",
            Who::Service,
            body,
            status,
            code,
        )
    };
    let big = json!({"samples": "x".repeat(64 * 1024)});
    let many = json!({"samples": vec![123_456_789; 8 * 1024]});
    let cases = vec![
        audit(
            "details over 64 KiB",
            B::Json(json!({"action": "agent.reclaim", "details": big})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "details over 64 KiB as numbers",
            B::Json(json!({"action": "agent.reclaim", "details": many})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "details as an array",
            B::Json(json!({"action": "agent.reclaim", "details": [1, 2]})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "details as a string",
            B::Json(json!({"action": "agent.reclaim", "details": "pid 42"})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "empty action",
            B::Json(json!({"action": ""})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "action of 65 characters",
            B::Json(json!({"action": "a".repeat(65)})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "action with a newline",
            B::Json(json!({"action": "webhook.strip\nforged"})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "subject of 513 characters",
            B::Json(json!({"action": "x", "subject": "s".repeat(513)})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "empty subject",
            B::Json(json!({"action": "x", "subject": ""})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "user with a control character",
            B::Json(json!({"action": "x", "user": "a\u{1b}b"})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "user of 300 bytes",
            B::Json(json!({"action": "x", "user": "u".repeat(300)})),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
        audit(
            "action missing",
            B::Json(json!({"subject": "x"})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        audit(
            "action a number",
            B::Json(json!({"action": 5})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        audit(
            "booking_id a string",
            B::Json(json!({"action": "x", "booking_id": "one"})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        audit(
            "unknown field",
            B::Json(json!({"action": "x", "actor": "root"})),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        audit(
            "malformed JSON",
            B::Raw(Some("application/json"), b"{\"action\": }".to_vec()),
            BAD_REQUEST,
            Some("bad_request"),
        ),
        audit(
            "wrong content type",
            B::Raw(Some("text/plain"), b"{\"action\": \"x\"}".to_vec()),
            NOT_JSON,
            None,
        ),
        case(
            "details of 70 KB about a real booking",
            Method::POST,
            "/api/v1/audit",
            Who::Service,
            B::Json(
                json!({"action": "x", "booking_id": booking, "details": {"a": "x".repeat(70_000)}}),
            ),
            UNPROCESSABLE,
            Some("invalid_request"),
        ),
    ];
    api.run(cases).await;
}

/// Times at the edges of what the types can hold: each answer is a 4xx, never a
/// panic or a 500.
#[sqlx::test(migrations = "../migrations")]
async fn extreme_times(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    let booking = |name: &str, who: Who, body: Value, status: &'static [u16]| {
        case(
            name,
            Method::POST,
            "/api/v1/bookings",
            who,
            B::Json(body),
            status,
            None,
        )
    };
    let cases = vec![
        booking(
            "window in year 9999",
            Who::Alice,
            json!({"model": "a100", "start": "9999-12-20T00:00:00Z", "end": "9999-12-31T23:59:59Z"}),
            // Past the booking horizon (`too_far_ahead`), before the user's own rules.
            &[422],
        ),
        booking(
            "start in year 0",
            Who::Alice,
            json!({"model": "a100", "start": "0000-01-01T00:00:00Z", "end": "0000-01-02T00:00:00Z"}),
            &[422],
        ),
        booking(
            "year 10000",
            Who::Alice,
            json!({"model": "a100", "start": "10000-01-01T00:00:00Z", "end": "10000-01-02T00:00:00Z"}),
            &[400],
        ),
        booking(
            "far-apart override window overlapping alice's",
            Who::Admin,
            json!({"model": "a100", "user": "alice", "override": true,
                       "start": "0001-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"}),
            // Times before 1970 are refused before any rule, override or not.
            &[422],
        ),
        booking(
            "leap second",
            Who::Alice,
            json!({"model": "a100", "start": "2030-06-30T23:59:60Z", "end": "2030-07-02T00:00:00Z"}),
            &[400, 409, 422],
        ),
    ];
    api.run(cases).await;
}

/// A NUL byte in any string that reaches a query. Postgres `text` and `jsonb`
/// cannot hold U+0000, so the query fails; the API must answer 4xx (the name is
/// not a valid model / user / action), not 500.
#[sqlx::test(migrations = "../migrations")]
async fn nul_bytes_are_a_4xx_not_a_500(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    let get = |name: &str, uri: &str, who: Who| {
        case(name, Method::GET, uri, who, B::None, &[400, 404, 422], None)
    };
    let with_body = |name: &str, method: Method, uri: String, who: Who, body: Value| {
        case(
            name,
            method,
            uri,
            who,
            B::Json(body),
            &[400, 404, 422],
            None,
        )
    };
    let (s, e) = window(t0() + TimeDelta::days(40), 2);
    let cases = vec![
        with_body(
            "booking for a model with a NUL",
            Method::POST,
            "/api/v1/bookings".into(),
            Who::Alice,
            json!({"model": "a1\u{0}00", "start": s, "end": e}),
        ),
        with_body(
            "usage of a model with a NUL",
            Method::PUT,
            "/api/v1/models/a%00/usage".into(),
            Who::Service,
            json!({"in_use": 1}),
        ),
        get(
            "list bookings by a model with a NUL",
            "/api/v1/bookings?model=a%00",
            Who::Alice,
        ),
        get(
            "list bookings of a user with a NUL",
            "/api/v1/bookings?user=a%00",
            Who::Admin,
        ),
        get(
            "audit by an action with a NUL",
            "/api/v1/audit?action=a%00",
            Who::Admin,
        ),
        get(
            "audit by a user with a NUL",
            "/api/v1/audit?user=a%00",
            Who::Admin,
        ),
        get(
            "next-start for a model with a NUL",
            "/api/v1/me/next-start?model=a%00",
            Who::Alice,
        ),
        get(
            "availability of a model with a NUL",
            "/api/v1/models/a%00/availability",
            Who::Alice,
        ),
        with_body(
            "audit details holding a NUL",
            Method::POST,
            "/api/v1/audit".into(),
            Who::Service,
            json!({"action": "agent.reclaim", "details": {"cmd": "py\u{0}thon"}}),
        ),
        with_body(
            "audit details key holding a NUL",
            Method::POST,
            "/api/v1/audit".into(),
            Who::Service,
            json!({"action": "agent.reclaim", "details": {"a\u{0}": 1}}),
        ),
    ];
    api.run(cases).await;
}

/// `days` so large that `now + days` leaves chrono's range: the handler must
/// refuse it, not panic (a panic drops the connection on a real server).
#[sqlx::test(migrations = "../migrations")]
async fn next_start_with_absurd_days_is_a_4xx_not_a_panic(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    let cases = ["100000000", "-100000000", "106751991167"]
        .into_iter()
        .map(|d| {
            case(
                format!("next-start days={d}"),
                Method::GET,
                format!("/api/v1/me/next-start?model=a100&days={d}"),
                Who::Alice,
                B::None,
                UNPROCESSABLE,
                None,
            )
        })
        .collect();
    api.run(cases).await;
}

/// Days that parse but that Postgres' `timestamptz` cannot hold (it starts in
/// 4713 BC): a 4xx, not a 500 from the failed query.
#[sqlx::test(migrations = "../migrations")]
async fn availability_outside_postgres_range_is_a_4xx(pool: PgPool) {
    let (api, _) = seeded(pool).await;
    api.run(vec![
        case(
            "availability in 262143 BC",
            Method::GET,
            "/api/v1/models/a100/availability?from=-262143-01-01&to=-262143-01-05",
            Who::Alice,
            B::None,
            &[400, 422],
            None,
        ),
        case(
            "availability in 5000 BC",
            Method::GET,
            "/api/v1/models/a100/availability?from=-5000-01-01&to=-5000-01-05",
            Who::Alice,
            B::None,
            &[400, 422],
            None,
        ),
    ])
    .await;
}
