//! Who may call what: every role against every route of `app::router`, and every
//! way a bearer token can be wrong.
//!
//! Runs on the real Postgres (`DATABASE_URL`); each test gets a fresh, migrated
//! database from `#[sqlx::test]`.

use crate::common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use chrono::{DateTime, TimeDelta, Utc};
use common::{rfc_secs as rfc, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"authz-test-secret-0123456789abcdef";

struct Resp {
    status: StatusCode,
    content_type: String,
    text: String,
    json: Option<Value>,
}

struct Api {
    app: Router,
}

impl Api {
    fn new(pool: PgPool) -> Api {
        let clock = Arc::new(ManualClock::new(t0()));
        Api {
            app: gpu_booking_api::app::router(test_state(pool, Policy::default(), clock, SECRET)),
        }
    }

    async fn raw(&self, req: Request<Body>) -> Resp {
        let r = common::send(&self.app, req).await;
        Resp {
            status: r.status,
            text: r.text(),
            json: r.json(),
            content_type: r.content_type,
        }
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Resp {
        self.raw(common::request(method, uri, token, body)).await
    }

    async fn with_auth_header(&self, uri: &str, value: &str) -> Resp {
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(header::AUTHORIZATION, value)
            .body(Body::empty())
            .unwrap();
        self.raw(req).await
    }
}

fn admin() -> String {
    token_for(SECRET, "root@lab", Some("admin"))
}

fn service() -> String {
    token_for(SECRET, "webhook", Some("service"))
}

/// What a case needs to exist before it runs, created fresh for every role so
/// that one role's success (a cancel) cannot change the
/// next role's answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    /// A planned booking owned by the case's "user".
    Booking,
}

struct Case {
    name: &'static str,
    method: Method,
    /// `{owner}`, `{id}` and `{n}` are filled in per role.
    path: &'static str,
    needs: Needs,
    /// `{owner}` and `{n}` in strings are filled in.
    body: Option<Value>,
    /// Expected status for: no token, the owner, another user, an admin, a service.
    expect: [u16; 5],
}

const ROLES: [&str; 5] = ["no token", "user (owner)", "other user", "admin", "service"];

fn fill(s: &str, owner: &str, id: i64, n: usize) -> String {
    s.replace("{owner}", owner)
        .replace("{id}", &id.to_string())
        .replace("{n}", &n.to_string())
}

fn fill_json(v: &Value, owner: &str, id: i64, n: usize) -> Value {
    match v {
        Value::String(s) => Value::String(fill(s, owner, id, n)),
        Value::Array(a) => Value::Array(a.iter().map(|x| fill_json(x, owner, id, n)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), fill_json(x, owner, id, n)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn cases() -> Vec<Case> {
    let start = rfc(t0() + TimeDelta::days(1));
    let end = rfc(t0() + TimeDelta::days(2));
    let own_booking = json!({"model": "a100", "start": start, "end": end});
    let booking_for_owner = json!({"model": "a100", "start": start, "end": end, "user": "{owner}"});
    let c = |name, method, path, needs, body, expect| Case {
        name,
        method,
        path,
        needs,
        body,
        expect,
    };
    vec![
        // name, method, path, needs, body, [none, owner, other, admin, service]
        c(
            "create own booking",
            Method::POST,
            "/api/v1/bookings",
            Needs::Nothing,
            Some(own_booking),
            [401, 201, 201, 201, 201],
        ),
        c(
            "create booking for a user (admin field)",
            Method::POST,
            "/api/v1/bookings",
            Needs::Nothing,
            Some(booking_for_owner),
            [401, 403, 403, 201, 403],
        ),
        c(
            "list own bookings",
            Method::GET,
            "/api/v1/bookings",
            Needs::Booking,
            None,
            [401, 200, 200, 200, 200],
        ),
        c(
            "list all bookings",
            Method::GET,
            "/api/v1/bookings?all=true",
            Needs::Booking,
            None,
            [401, 403, 403, 200, 403],
        ),
        c(
            "list the owner's bookings",
            Method::GET,
            "/api/v1/bookings?user={owner}",
            Needs::Booking,
            None,
            [401, 200, 403, 200, 403],
        ),
        c(
            "get a booking",
            Method::GET,
            "/api/v1/bookings/{id}",
            Needs::Booking,
            None,
            // Another user's booking is 404, like a missing one.
            [401, 200, 404, 200, 404],
        ),
        c(
            "delete a booking",
            Method::DELETE,
            "/api/v1/bookings/{id}",
            Needs::Booking,
            None,
            // Another user's booking is 404, like a missing one.
            [401, 200, 404, 200, 404],
        ),
        c(
            "next start",
            Method::GET,
            "/api/v1/me/next-start?model=a100",
            Needs::Nothing,
            None,
            [401, 200, 200, 200, 200],
        ),
        c(
            "list models",
            Method::GET,
            "/api/v1/models",
            Needs::Nothing,
            None,
            [401, 200, 200, 200, 200],
        ),
        c(
            "put a model",
            Method::PUT,
            "/api/v1/models/m-{n}",
            Needs::Nothing,
            Some(json!({"units": 1, "patterns": ["*A100*"], "gpumem_mib": 1024})),
            [401, 403, 403, 200, 403],
        ),
        c(
            "put model usage",
            Method::PUT,
            "/api/v1/models/a100/usage",
            Needs::Nothing,
            Some(json!({"in_use": 1})),
            [401, 403, 403, 200, 200],
        ),
        c(
            "model availability",
            Method::GET,
            "/api/v1/models/a100/availability",
            Needs::Nothing,
            None,
            [401, 200, 200, 200, 200],
        ),
        c(
            "schedulability",
            Method::GET,
            "/api/v1/schedulability?user={owner}",
            Needs::Nothing,
            None,
            [401, 403, 403, 200, 200],
        ),
        c(
            "report an audit event",
            Method::POST,
            "/api/v1/audit",
            Needs::Nothing,
            Some(
                json!({"action": "webhook.strip", "subject": "jhub/jupyter-x", "details": {"why": "no unit"}}),
            ),
            [401, 403, 403, 201, 201],
        ),
        c(
            "the webhook's admission state",
            Method::GET,
            "/api/v1/admission-state",
            Needs::Nothing,
            None,
            [401, 403, 403, 200, 200],
        ),
        c(
            "report audit events in a batch",
            Method::POST,
            "/api/v1/audit/batch",
            Needs::Nothing,
            Some(
                json!({"reports": [{"action": "webhook.strip", "subject": "jhub/jupyter-x", "details": {"why": "no unit"}}]}),
            ),
            [401, 403, 403, 201, 201],
        ),
        c(
            "list the audit log",
            Method::GET,
            "/api/v1/audit",
            Needs::Nothing,
            None,
            [401, 403, 403, 200, 403],
        ),
        c(
            "healthz",
            Method::GET,
            "/healthz",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "readyz",
            Method::GET,
            "/readyz",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "metrics",
            Method::GET,
            "/metrics",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "openapi.json",
            Method::GET,
            "/api/openapi.json",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "booking page",
            Method::GET,
            "/",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "page script",
            Method::GET,
            "/assets/app.js",
            Needs::Nothing,
            None,
            [200, 200, 200, 200, 200],
        ),
        c(
            "unknown route",
            Method::GET,
            "/api/v1/nope",
            Needs::Nothing,
            None,
            [404, 404, 404, 404, 404],
        ),
    ]
}

/// The whole matrix in one test; every failure names its case and role, and all
/// failures are reported together.
#[sqlx::test(migrations = "../migrations")]
async fn every_role_on_every_route(pool: PgPool) {
    let api = Api::new(pool.clone());
    let r = api
        .call(
            Method::PUT,
            "/api/v1/models/a100",
            Some(&admin()),
            Some(&json!({"units": 1000, "patterns": ["*A100*"]})),
        )
        .await;
    assert_eq!(r.status, 200, "seed model: {}", r.text);

    let mut failures = Vec::new();
    let mut n = 0usize;
    for case in cases() {
        for (role_ix, role) in ROLES.iter().enumerate() {
            n += 1;
            // Fresh users for every row so that no booking rule of an earlier row
            // (one planned booking, cooldown) decides a later one.
            let owner = format!("owner-{n}@lab");
            let other = format!("other-{n}@lab");
            let id = match case.needs {
                Needs::Nothing => 0,
                Needs::Booking => {
                    let start = t0() + TimeDelta::days(30);
                    let r = api
                        .call(
                            Method::POST,
                            "/api/v1/bookings",
                            Some(&admin()),
                            Some(&json!({"model": "a100", "user": owner, "start": rfc(start),
                                         "end": rfc(start + TimeDelta::days(1))})),
                        )
                        .await;
                    assert_eq!(r.status, 201, "{}: fixture booking: {}", case.name, r.text);
                    r.json
                        .as_ref()
                        .and_then(|j| j["id"].as_i64())
                        .expect("booking id")
                }
            };
            let token = match role_ix {
                0 => None,
                1 => Some(token_for(SECRET, &owner, None)),
                2 => Some(token_for(SECRET, &other, None)),
                3 => Some(admin()),
                _ => Some(service()),
            };
            let uri = fill(case.path, &owner, id, n);
            let body = case.body.as_ref().map(|b| fill_json(b, &owner, id, n));
            let r = api
                .call(case.method.clone(), &uri, token.as_deref(), body.as_ref())
                .await;
            let want = case.expect[role_ix];
            if r.status.as_u16() != want {
                failures.push(format!(
                    "{} as {role}: {} {uri}: want {want}, got {} ({})",
                    case.name,
                    case.method,
                    r.status,
                    r.text.chars().take(200).collect::<String>()
                ));
                continue;
            }
            // Every refusal is the JSON error body.
            let code = match want {
                401 => Some("unauthorized"),
                403 => Some("forbidden"),
                404 => Some("not_found"),
                _ => None,
            };
            if let Some(code) = code {
                let ok = r.json.as_ref().is_some_and(|j| {
                    j["error"] == code && j["message"].as_str().is_some_and(|m| !m.is_empty())
                });
                if !ok {
                    failures.push(format!(
                        "{} as {role}: {} {uri}: want a JSON body with error {code:?} and a message, got {:?}",
                        case.name, case.method, r.text
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} authz cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The answers of the open routes are what they claim to be.
#[sqlx::test(migrations = "../migrations")]
async fn open_routes_serve_their_content(pool: PgPool) {
    let api = Api::new(pool);
    let r = api.call(Method::GET, "/healthz", None, None).await;
    assert_eq!((r.status.as_u16(), r.text.as_str()), (200, "ok"));
    let r = api.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(r.status, 200);
    let r = api.call(Method::GET, "/metrics", None, None).await;
    assert!(
        r.content_type.starts_with("application/openmetrics-text"),
        "{}",
        r.content_type
    );
    assert!(r.text.contains("gpu_booking_api_"), "{}", r.text);
    let r = api.call(Method::GET, "/api/openapi.json", None, None).await;
    let doc = r.json.expect("openapi is JSON");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
    for path in [
        "/api/v1/bookings",
        "/api/v1/bookings/{id}",
        "/api/v1/me/next-start",
        "/api/v1/models",
        "/api/v1/models/{name}",
        "/api/v1/models/{name}/usage",
        "/api/v1/models/{name}/availability",
        "/api/v1/schedulability",
        "/api/v1/audit",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "openapi.json lacks {path}"
        );
    }
    // Preemption is the controller's, from the cluster's state: no endpoint asks for it.
    for gone in ["/api/v1/preemptions", "/api/v1/preemptions/{id}"] {
        assert!(doc["paths"].get(gone).is_none(), "{gone} is documented");
    }
    let r = api.call(Method::GET, "/", None, None).await;
    assert!(
        r.content_type.starts_with("text/html"),
        "{}",
        r.content_type
    );
}

fn b64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn hs(alg: jsonwebtoken::Algorithm, secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn unsigned(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}.",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    )
}

/// Every malformed, forged, expired or unusable token is a JSON 401.
#[sqlx::test(migrations = "../migrations")]
async fn bad_tokens_are_401(pool: PgPool) {
    use jsonwebtoken::Algorithm::{HS256, HS384, HS512};
    let api = Api::new(pool.clone());
    let now = Utc::now().timestamp();
    let good = json!({"sub": "alice", "exp": now + 3600});
    let admin_claims = json!({"sub": "mallory", "roles": ["admin"], "exp": now + 3600});
    // The sanity check: a good token works on the route used below.
    let r = api
        .call(
            Method::GET,
            "/api/v1/bookings",
            Some(&hs(HS256, SECRET, &good)),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    let header_cases: Vec<(&str, Option<String>)> = vec![
        ("missing Authorization header", None),
        ("empty header", Some(String::new())),
        ("Bearer without token", Some("Bearer ".into())),
        ("Bearer with spaces only", Some("Bearer    ".into())),
        ("Basic scheme", Some("Basic YWxpY2U6c2VjcmV0".into())),
        ("token without scheme", Some(hs(HS256, SECRET, &good))),
        ("Bearer garbage", Some("Bearer garbage".into())),
        ("Bearer three dots of garbage", Some("Bearer a.b.c".into())),
        ("Bearer non-base64", Some("Bearer !!!.@@@.###".into())),
        (
            "alg none (unsigned)",
            Some(format!(
                "Bearer {}",
                unsigned(&json!({"alg": "none", "typ": "JWT"}), &admin_claims)
            )),
        ),
        (
            "alg None (unsigned, odd case)",
            Some(format!(
                "Bearer {}",
                unsigned(&json!({"alg": "None", "typ": "JWT"}), &admin_claims)
            )),
        ),
        (
            "alg HS256 with the signature stripped",
            Some(format!(
                "Bearer {}",
                unsigned(&json!({"alg": "HS256", "typ": "JWT"}), &admin_claims)
            )),
        ),
        (
            "wrong secret",
            Some(format!(
                "Bearer {}",
                hs(HS256, b"not-the-secret", &admin_claims)
            )),
        ),
        (
            "HS384 with the right secret",
            Some(format!("Bearer {}", hs(HS384, SECRET, &good))),
        ),
        (
            "HS512 with the right secret",
            Some(format!("Bearer {}", hs(HS512, SECRET, &good))),
        ),
        (
            "RS256 header but no JWKS configured",
            Some(format!(
                "Bearer {}",
                unsigned(&json!({"alg": "RS256", "typ": "JWT", "kid": "k1"}), &good) + "c2ln"
            )),
        ),
        (
            "expired 60 s ago (past the 30 s leeway)",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": "alice", "exp": now - 60}))
            )),
        ),
        (
            "expired a day ago",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": "alice", "exp": now - 86_400}))
            )),
        ),
        (
            "missing exp",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": "alice"}))
            )),
        ),
        (
            "exp not a number",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": "alice", "exp": "tomorrow"}))
            )),
        ),
        (
            "no sub and no email",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"exp": now + 3600}))
            )),
        ),
        (
            "sub with a control character",
            Some(format!(
                "Bearer {}",
                hs(
                    HS256,
                    SECRET,
                    &json!({"sub": "ali\u{7}ce", "exp": now + 3600})
                )
            )),
        ),
        (
            "sub with a newline (log forging)",
            Some(format!(
                "Bearer {}",
                hs(
                    HS256,
                    SECRET,
                    &json!({"sub": "alice\nlevel=admin", "exp": now + 3600})
                )
            )),
        ),
        (
            "email with a NUL",
            Some(format!(
                "Bearer {}",
                hs(
                    HS256,
                    SECRET,
                    &json!({"email": "a\u{0}@x", "exp": now + 3600})
                )
            )),
        ),
        (
            "empty sub",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": "", "exp": now + 3600}))
            )),
        ),
        (
            "sub of 300 bytes",
            Some(format!(
                "Bearer {}",
                hs(
                    HS256,
                    SECRET,
                    &json!({"sub": "a".repeat(300), "exp": now + 3600})
                )
            )),
        ),
        (
            "sub with surrounding whitespace",
            Some(format!(
                "Bearer {}",
                hs(HS256, SECRET, &json!({"sub": " alice", "exp": now + 3600}))
            )),
        ),
    ];
    let mut failures = Vec::new();
    for (name, value) in &header_cases {
        for uri in [
            "/api/v1/bookings",
            "/api/v1/audit",
            "/api/v1/schedulability?user=alice",
        ] {
            let r = match value {
                None => api.call(Method::GET, uri, None, None).await,
                Some(v) => api.with_auth_header(uri, v).await,
            };
            let ok = r.status == StatusCode::UNAUTHORIZED
                && r.json.as_ref().is_some_and(|j| {
                    j["error"] == "unauthorized"
                        && j["message"].as_str().is_some_and(|m| !m.is_empty())
                });
            if !ok {
                failures.push(format!(
                    "{name} on {uri}: want JSON 401 unauthorized, got {} {}",
                    r.status, r.text
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing was written by any of them.
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM app_user")
        .fetch_one(&pool)
        .await
        .unwrap();
    let audit: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_event")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((users, audit), (0, 0));
}

/// The edges of a good token: within the expiry leeway, `email` before `sub`,
/// roles from Keycloak's `realm_access`, unknown roles ignored.
#[sqlx::test(migrations = "../migrations")]
async fn good_token_edges(pool: PgPool) {
    use jsonwebtoken::Algorithm::HS256;
    let api = Api::new(pool);
    let now = Utc::now().timestamp();
    let bearer = |c: Value| format!("Bearer {}", hs(HS256, SECRET, &c));

    // Expired 10 s ago: inside the 30 s leeway.
    let r = api
        .with_auth_header(
            "/api/v1/bookings",
            &bearer(json!({"sub": "alice", "exp": now - 10})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // email wins over sub: alice's bookings are listed as the e-mail's.
    let r = api
        .with_auth_header(
            "/api/v1/bookings?user=alice@example.com",
            &bearer(json!({"sub": "1234", "email": "alice@example.com", "exp": now + 60})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = api
        .with_auth_header(
            "/api/v1/bookings?user=1234",
            &bearer(json!({"sub": "1234", "email": "alice@example.com", "exp": now + 60})),
        )
        .await;
    assert_eq!(
        r.status, 403,
        "the sub is not the user when an email is given: {}",
        r.text
    );

    // Keycloak realm roles.
    let r = api
        .with_auth_header(
            "/api/v1/audit",
            &bearer(
                json!({"sub": "kc-admin", "realm_access": {"roles": ["admin"]}, "exp": now + 60}),
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Unknown and look-alike roles give nothing.
    for roles in [
        json!(["Admin"]),
        json!(["administrator"]),
        json!(["admin "]),
        json!(["user", "services"]),
    ] {
        let r = api
            .with_auth_header(
                "/api/v1/audit",
                &bearer(json!({"sub": "x", "roles": roles, "exp": now + 60})),
            )
            .await;
        assert_eq!(r.status, 403, "roles {roles}: {}", r.text);
    }
    // A lowercase scheme is accepted (RFC 7235: the scheme is case-insensitive).
    let r = api
        .with_auth_header(
            "/api/v1/bookings",
            &format!(
                "bearer {}",
                hs(HS256, SECRET, &json!({"sub": "a", "exp": now + 60}))
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A user cannot read, cancel or list another user's booking, and the refused
/// cancel changes nothing; the owner and an admin can.
#[sqlx::test(migrations = "../migrations")]
async fn other_users_booking_is_404_like_a_missing_one(pool: PgPool) {
    let api = Api::new(pool.clone());
    let r = api
        .call(
            Method::PUT,
            "/api/v1/models/a100",
            Some(&admin()),
            Some(&json!({"units": 2})),
        )
        .await;
    assert_eq!(r.status, 200);
    let alice = token_for(SECRET, "alice", None);
    let bob = token_for(SECRET, "bob", None);
    let start = t0() + TimeDelta::days(1);
    let r = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            Some(&alice),
            Some(&json!({"model": "a100", "start": rfc(start), "end": rfc(start + TimeDelta::days(2))})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json.unwrap()["id"].as_i64().unwrap();

    let r = api
        .call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.json.unwrap()["message"], format!("no booking {id}"));
    let r = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let theirs = r.json.unwrap();
    assert_eq!(theirs["message"], format!("no booking {id}"));
    // Exactly the answer for an id nobody has.
    let missing = id + 1000;
    let r = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{missing}"),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(
        r.text.replace(&missing.to_string(), "ID"),
        serde_json::to_string(&theirs)
            .unwrap()
            .replace(&id.to_string(), "ID")
    );
    // A service is not an admin.
    let r = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            Some(&service()),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = api
        .call(Method::GET, "/api/v1/bookings?user=alice", Some(&bob), None)
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    // Bob's own list does not show alice's booking.
    let r = api
        .call(Method::GET, "/api/v1/bookings", Some(&bob), None)
        .await;
    assert_eq!(r.json.unwrap(), json!([]));
    // Bob cannot book for alice, nor override the rules for himself.
    let r = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            Some(&bob),
            Some(
                &json!({"model": "a100", "user": "alice", "start": rfc(start + TimeDelta::days(40)),
                         "end": rfc(start + TimeDelta::days(41))}),
            ),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    let r = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            Some(&bob),
            Some(
                &json!({"model": "a100", "override": true, "start": rfc(t0() - TimeDelta::days(3)),
                         "end": rfc(t0() - TimeDelta::days(2))}),
            ),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);

    // Still planned, untouched, and only one cancel-free audit trail.
    let cancelled: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT cancelled_at FROM booking WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(cancelled, None);
    let bookings: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(bookings, 1);
    let r = api
        .call(
            Method::GET,
            &format!("/api/v1/bookings/{id}"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json.unwrap()["status"], "planned");

    // A booking that does not exist is 404 for everyone.
    let r = api
        .call(Method::GET, "/api/v1/bookings/999999", Some(&bob), None)
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = api
        .call(
            Method::DELETE,
            "/api/v1/bookings/999999",
            Some(&admin()),
            None,
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);

    // The owner cancels.
    let r = api
        .call(
            Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json.unwrap()["status"], "cancelled");
}
