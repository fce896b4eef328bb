//! The answers the OpenAPI document promises for what happens around the handlers:
//! 415 for a body that is not JSON, 413 for one over the limit (both JSON errors,
//! both documented), and every operation listing 401 and 503.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::openapi::ApiDoc;
use gpu_booking_api::testing::{test_state, token_for};
use gpu_booking_core::booking_policy::Policy;
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;
use utoipa::OpenApi;

const SECRET: &[u8] = b"contract-test-secret-0123456789abcdef";

async fn post(pool: PgPool, content_type: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
    let app = gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        SECRET,
    ));
    let mut req = Request::post("/api/v1/bookings").header(
        header::AUTHORIZATION,
        format!("Bearer {}", token_for(SECRET, "alice", None)),
    );
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let resp = app
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).expect("a JSON error body"),
    )
}

#[sqlx::test(migrations = "../migrations")]
async fn a_body_that_is_not_json_is_415(pool: PgPool) {
    let (status, body) = post(pool, Some("text/plain"), b"{}".to_vec()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["error"], "unsupported_media_type");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_body_over_the_limit_is_413(pool: PgPool) {
    // axum's default body limit is 2 MB.
    let mut big = br#"{"model": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 3 * 1024 * 1024));
    big.extend(br#""}"#);
    let (status, body) = post(pool, Some("application/json"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "payload_too_large");
}

#[test]
fn every_operation_documents_what_the_layers_answer() {
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let responses = op["responses"].as_object().unwrap();
            // Operations without a bearer token (the calendar feeds: the token is in
            // the URL) never answer 401.
            let secured = op.get("security").is_some();
            for status in ["401", "503"] {
                assert!(
                    responses.contains_key(status) || (status == "401" && !secured),
                    "{method} {path} lacks {status}"
                );
            }
            assert!(
                responses["503"]["headers"]["Retry-After"].is_object(),
                "{method} {path}: 503 without Retry-After"
            );
            if op.get("requestBody").is_some() {
                for status in ["400", "413", "415", "422"] {
                    assert!(
                        responses.contains_key(status),
                        "{method} {path} lacks {status}"
                    );
                }
            }
        }
    }
    assert!(operations >= 10);
}

/// The Rust types the OpenAPI document is made of, read from the sources of the
/// crates that derive `ToSchema`: each type's schema name (its own, or the one
/// `#[schema(as = ...)]` gives it) with where it is declared.
fn schema_types() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "../core/src"] {
        walk(&root.join(dir), &mut files);
    }
    let mut types = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !(line.contains("derive(") && line.contains("ToSchema")) {
                continue;
            }
            // The attributes up to the item, then the item's name.
            let mut renamed = None;
            for next in &lines[i + 1..] {
                let next = next.trim();
                if let Some(at) = next.find("schema(as = ") {
                    let rest = &next[at + "schema(as = ".len()..];
                    let name = rest.split([')', ',']).next().unwrap_or("");
                    renamed = Some(name.rsplit("::").next().unwrap_or(name).trim().to_owned());
                }
                let item = next
                    .strip_prefix("pub struct ")
                    .or_else(|| next.strip_prefix("pub enum "))
                    .or_else(|| next.strip_prefix("struct "))
                    .or_else(|| next.strip_prefix("enum "));
                if let Some(item) = item {
                    let own: String = item
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let place = format!("{}:{}", file.display(), i + 1);
                    types.push((renamed.unwrap_or(own), place));
                    break;
                }
            }
        }
    }
    types
}

/// utoipa names a schema after its type alone and keeps one schema per name: two
/// types of one name would give clients one of their shapes for both. Every schema
/// name is one Rust type.
#[test]
fn no_two_types_share_a_schema_name() {
    let types = schema_types();
    assert!(
        types.len() > 40,
        "the scan found the API's types: {types:?}"
    );
    let mut seen: std::collections::BTreeMap<&str, &str> = Default::default();
    let mut shared = Vec::new();
    for (name, place) in &types {
        if let Some(first) = seen.insert(name, place) {
            shared.push(format!("{name}: {first} and {place}"));
        }
    }
    assert!(
        shared.is_empty(),
        "types that share a schema name (rename one, or #[schema(as = ...)]): {shared:#?}"
    );
    // Every schema the document holds is one of them.
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    for name in doc["components"]["schemas"].as_object().unwrap().keys() {
        assert!(
            seen.contains_key(name.as_str()),
            "schema {name} comes from no type the scan found"
        );
    }
}

/// `docs/openapi.json` is the document the server serves, so that a reviewer reads
/// the API without running it. After a change to the API, write it again with
/// `GPU_BOOKING_WRITE_OPENAPI=1 cargo test -p gpu-booking-api --test it contract::`.
#[sqlx::test(migrations = "../migrations")]
async fn the_checked_in_document_is_what_the_server_serves(pool: PgPool) {
    let app = gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        SECRET,
    ));
    let response = app
        .oneshot(
            Request::get("/api/openapi.json")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let served: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let text = format!("{}\n", serde_json::to_string_pretty(&served).unwrap());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    if std::env::var_os("GPU_BOOKING_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == text,
        "docs/openapi.json is not what the server serves: write it again with \
         GPU_BOOKING_WRITE_OPENAPI=1 cargo test -p gpu-booking-api --test it contract::"
    );
}

/// The body limit every 413 answer states is the one the service applies: a body of
/// exactly that many bytes is read, one byte more is not.
#[sqlx::test(migrations = "../migrations")]
async fn the_stated_body_limit_is_the_one_applied(pool: PgPool) {
    use gpu_booking_api::openapi::MAX_BODY_BYTES;
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let too_large = &doc["paths"]["/api/v1/bookings"]["post"]["responses"]["413"];
    let stated = too_large["description"].as_str().unwrap();
    assert!(stated.contains(&MAX_BODY_BYTES.to_string()), "{stated}");
    let body = |len: usize| {
        let mut b = br#"{"model": ""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', len - b.len() - 2));
        b.extend(br#""}"#);
        assert_eq!(b.len(), len);
        b
    };
    let (status, _) = post(pool.clone(), Some("application/json"), body(MAX_BODY_BYTES)).await;
    assert_ne!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _) = post(pool, Some("application/json"), body(MAX_BODY_BYTES + 1)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

// The limits each handler enforces on its inputs, in the document with the number the
// handler uses: utoipa's attributes take only literals, so these tests hold each
// literal (and each number a description states) to the handler's constant.

/// A property of a component schema.
fn property<'a>(doc: &'a Value, schema: &str, field: &str) -> &'a Value {
    let p = &doc["components"]["schemas"][schema]["properties"][field];
    assert!(p.is_object(), "the document has no {schema}.{field}");
    p
}

/// A parameter of an operation (its `schema` holds the keywords).
fn parameter<'a>(doc: &'a Value, method: &str, path: &str, name: &str) -> &'a Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
}

/// A description, its lines joined (a number and its unit may be on two lines).
fn description(v: &Value) -> String {
    v["description"]
        .as_str()
        .unwrap_or_default()
        .replace('\n', " ")
}

/// "1970 to 9999": the years a booking's times may fall in, read from the rule that
/// checks them (`rules::in_supported_range` keeps its bounds as literals).
fn booking_years() -> String {
    use chrono::{TimeDelta, TimeZone, Utc};
    use gpu_booking_core::rules::in_supported_range;
    let first = Utc.with_ymd_and_hms(1970, 1, 1, 0, 0, 0).unwrap();
    let after_last = Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap();
    let second = TimeDelta::seconds(1);
    assert!(in_supported_range(first) && !in_supported_range(first - second));
    assert!(in_supported_range(after_last - second) && !in_supported_range(after_last));
    "1970 to 9999".to_owned()
}

/// User names, bookings, the next start, the waitlist, the change stream and
/// schedulability.
#[test]
fn the_booking_inputs_state_their_limits() {
    use gpu_booking_api::routes::{self, MAX_PAGE_LIMIT, NO_CONTROL_PATTERN, USER_NAME_PATTERN};
    use gpu_booking_core::booking_policy::MAX_UNITS_PER_BOOKING_LIMIT;
    use gpu_booking_core::username::MAX_USERNAME_BYTES;
    use serde_json::json;

    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();

    // Every user name a handler reads as one (`Username::normalised`).
    let user_name = |s: &Value, at: &str| {
        assert_eq!(s["minLength"], 1, "{at}");
        assert_eq!(s["maxLength"], json!(MAX_USERNAME_BYTES), "{at}");
        assert_eq!(s["pattern"], USER_NAME_PATTERN, "{at}");
    };
    user_name(
        property(&doc, "CreateBooking", "user"),
        "CreateBooking.user",
    );
    user_name(property(&doc, "JoinWaitlist", "user"), "JoinWaitlist.user");
    for path in [
        "/api/v1/bookings",
        "/api/v1/availability",
        "/api/v1/schedulability",
    ] {
        user_name(&parameter(&doc, "get", path, "user")["schema"], path);
    }

    for path in ["/api/v1/bookings", "/api/v1/waitlist"] {
        let s = &parameter(&doc, "get", path, "limit")["schema"];
        assert_eq!(s["minimum"], 1, "{path}");
        assert_eq!(s["maximum"], json!(MAX_PAGE_LIMIT), "{path}");
    }

    let units = property(&doc, "CreateBooking", "units");
    assert_eq!(units["maximum"], json!(MAX_UNITS_PER_BOOKING_LIMIT));
    let years = booking_years();
    for (schema, field) in [
        ("CreateBooking", "start"),
        ("CreateBooking", "end"),
        ("ChangeBooking", "start"),
        ("ChangeBooking", "end"),
        ("JoinWaitlist", "latest_start"),
    ] {
        let d = description(property(&doc, schema, field));
        assert!(d.contains(&years), "{schema}.{field}: {d}");
    }

    let next = "/api/v1/me/next-start";
    let days = &parameter(&doc, "get", next, "days")["schema"];
    assert_eq!(days["minimum"], json!(-routes::me::MAX_DAYS));
    assert_eq!(days["maximum"], json!(routes::me::MAX_DAYS));
    let units = &parameter(&doc, "get", next, "units")["schema"];
    assert_eq!(units["maximum"], json!(MAX_UNITS_PER_BOOKING_LIMIT));

    assert_eq!(
        property(&doc, "JoinWaitlist", "days")["maximum"],
        json!(routes::waitlist::MAX_DAYS)
    );
    assert_eq!(
        property(&doc, "JoinWaitlist", "hours")["maximum"],
        json!(routes::waitlist::MAX_HOURS)
    );
    let span = format!(
        "at most {} days after it",
        gpu_booking_core::waitlist::MAX_WAIT_SPAN.num_days()
    );
    let latest = description(property(&doc, "JoinWaitlist", "latest_start"));
    assert!(latest.contains(&span), "latest_start: {latest}");

    let wait = &parameter(&doc, "get", "/api/v1/booking-changes", "wait")["schema"];
    assert_eq!(wait["maximum"], json!(routes::changes::MAX_WAIT_SECS));

    let slug = &parameter(&doc, "get", "/api/v1/schedulability", "slug")["schema"];
    assert_eq!(
        slug["maxLength"],
        json!(routes::schedulability::MAX_SLUG_LEN)
    );
    assert_eq!(slug["pattern"], NO_CONTROL_PATTERN);
}

/// What the webhook, the controller and the agent report (audit entries, held units,
/// usage), the audit listing, and the models.
#[test]
fn the_reports_and_models_state_their_limits() {
    use gpu_booking_api::routes::{self, MAX_PAGE_LIMIT, NO_CONTROL_PATTERN};
    use gpu_booking_core::declared_models::{MAX_PATTERNS, MAX_UNITS};
    use gpu_booking_core::gpu_model::{MAX_MODEL_NAME_LEN, MAX_PATTERN_LEN};
    use gpu_booking_core::wire;
    use serde_json::json;

    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();

    for (field, max) in [
        ("action", wire::MAX_ACTION_LEN),
        ("subject", wire::MAX_SUBJECT_LEN),
        ("user", wire::MAX_AUDIT_USER_LEN),
    ] {
        let s = property(&doc, "AuditReport", field);
        assert_eq!(s["maxLength"], json!(max), "AuditReport.{field}");
        assert_eq!(s["pattern"], NO_CONTROL_PATTERN, "AuditReport.{field}");
    }
    let details = description(property(&doc, "AuditReport", "details"));
    for stated in [
        format!("At most {} bytes", wire::MAX_DETAILS_BYTES),
        format!(
            "at most {} arrays or objects deep",
            routes::audit::MAX_DETAILS_DEPTH
        ),
    ] {
        assert!(details.contains(&stated), "details: {details}");
    }
    let reports = property(&doc, "AuditBatch", "reports");
    assert_eq!(reports["maxItems"], json!(wire::MAX_AUDIT_BATCH));
    let limit = &parameter(&doc, "get", "/api/v1/audit", "limit")["schema"];
    assert_eq!(limit["maximum"], json!(MAX_PAGE_LIMIT));

    // Built from the constants; here it is found where clients look.
    let bookings = property(&doc, "HeldReport", "bookings");
    assert_eq!(
        bookings["maxProperties"],
        json!(wire::MAX_REPORTED_BOOKINGS)
    );
    assert_eq!(
        bookings["additionalProperties"]["maximum"],
        json!(wire::MAX_HELD_UNITS)
    );
    let active = property(&doc, "HeldReport", "active");
    assert_eq!(active["maxProperties"], json!(wire::MAX_REPORTED_BOOKINGS));

    let waiting = property(&doc, "HeldReport", "waiting");
    assert_eq!(waiting["maxProperties"], json!(wire::MAX_REPORTED_BOOKINGS));
    assert_eq!(
        waiting["additionalProperties"]["maxLength"],
        json!(wire::MAX_WAITING_LEN)
    );
    assert_eq!(
        waiting["additionalProperties"]["pattern"],
        NO_CONTROL_PATTERN
    );

    let cards = property(&doc, "UsageReport", "cards");
    assert_eq!(cards["maximum"], json!(wire::MAX_REPORTED_CARDS));
    let others = property(&doc, "UsageReport", "others_in_use");
    assert_eq!(others["maximum"], json!(wire::MAX_REPORTED_CARDS));
    let namespaces = property(&doc, "UsageReport", "other_namespaces");
    assert_eq!(namespaces["maxItems"], json!(wire::MAX_OTHER_NAMESPACES));
    assert_eq!(
        namespaces["items"]["maxLength"],
        json!(wire::models::MAX_NAMESPACE_LEN)
    );

    let name = &parameter(&doc, "put", "/api/v1/models/{name}", "name")["schema"];
    assert_eq!(name["maxLength"], json!(MAX_MODEL_NAME_LEN));
    assert_eq!(
        property(&doc, "PutModel", "units")["maximum"],
        json!(MAX_UNITS)
    );
    let patterns = property(&doc, "PutModel", "patterns");
    assert_eq!(patterns["maxItems"], json!(MAX_PATTERNS));
    assert_eq!(patterns["items"]["maxLength"], json!(MAX_PATTERN_LEN));
    // `check_model` keeps the resource's bound as a literal: held to it by behaviour.
    let resource = property(&doc, "PutModel", "resource");
    let longest = resource["maxLength"].as_u64().unwrap() as usize;
    let check = |r: &str| gpu_booking_core::declared_models::check_model("a", 1, &[], 0, Some(r));
    assert!(check(&"r".repeat(longest)).is_ok() && check(&"r".repeat(longest + 1)).is_err());

    let availability = "/api/v1/models/{name}/availability";
    let to = description(parameter(&doc, "get", availability, "to"));
    let span = format!("1 to {} days", routes::models::MAX_SPAN_DAYS);
    assert!(to.contains(&span), "to: {to}");
    let report_years = format!(
        "{} to {}",
        routes::REPORT_YEARS.start(),
        routes::REPORT_YEARS.end()
    );
    for name in ["from", "to"] {
        let d = description(parameter(&doc, "get", availability, name));
        assert!(d.contains(&report_years), "{name}: {d}");
    }
}

/// Notice preferences, the usage report and the calendar feeds.
#[test]
fn the_notices_usage_and_feeds_state_their_limits() {
    use gpu_booking_api::routes;
    use gpu_booking_core::notice::{NoticeKind, MAX_ADDRESS_LEN};
    use serde_json::json;

    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();

    let email = property(&doc, "NoticePrefs", "email");
    assert_eq!(email["maxLength"], json!(MAX_ADDRESS_LEN));
    let muted = property(&doc, "NoticePrefs", "muted");
    assert_eq!(muted["maxItems"], json!(NoticeKind::ALL.len()));
    let kinds: Vec<&str> = NoticeKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(muted["items"]["enum"], json!(kinds));

    let usage = "/api/v1/admin/usage";
    let idle = &parameter(&doc, "get", usage, "idle_hours")["schema"];
    assert_eq!(idle["maximum"], json!(routes::usage::MAX_IDLE_HOURS));
    let to = description(parameter(&doc, "get", usage, "to"));
    let period = format!("at most {} days", routes::usage::MAX_PERIOD_DAYS);
    assert!(to.contains(&period), "to: {to}");
    let report_years = format!(
        "{} to {}",
        routes::REPORT_YEARS.start(),
        routes::REPORT_YEARS.end()
    );
    for name in ["from", "to"] {
        let d = description(parameter(&doc, "get", usage, name));
        assert!(d.contains(&report_years), "{name}: {d}");
    }

    let feed = &doc["paths"]["/api/v1/feeds/{token}/bookings.ics"]["get"];
    let stated = format!(
        "from {} days ago to {} days ahead, at most {} events",
        gpu_booking_api::store::feeds::PAST.num_days(),
        gpu_booking_api::store::feeds::AHEAD.num_days(),
        gpu_booking_api::store::feeds::MAX_EVENTS
    );
    assert!(description(feed).contains(&stated), "{feed}");
}

/// A feed token the service issues is what the feeds' `token` parameter states (the
/// store keeps the token's length to itself).
#[sqlx::test(migrations = "../migrations")]
async fn an_issued_feed_token_is_what_the_feeds_state(pool: PgPool) {
    let app = gpu_booking_api::app::router(test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        SECRET,
    ));
    let resp = app
        .oneshot(
            Request::post("/api/v1/me/feed-token")
                .header(
                    header::AUTHORIZATION,
                    format!("Bearer {}", token_for(SECRET, "alice", None)),
                )
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let issued: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let token = issued["token"].as_str().unwrap();
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    for path in [
        "/api/v1/feeds/{token}/bookings.ics",
        "/api/v1/feeds/{token}/models/{model}/occupancy.ics",
    ] {
        let s = &parameter(&doc, "get", path, "token")["schema"];
        assert_eq!(s["pattern"], "^[0-9a-fA-F]{64}$", "{path}");
        assert_eq!(s["minLength"], serde_json::json!(token.len()), "{path}");
        assert_eq!(s["maxLength"], serde_json::json!(token.len()), "{path}");
    }
}
