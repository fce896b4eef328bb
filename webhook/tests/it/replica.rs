//! The webhook's replica of the booking service against the real booking
//! API on the real Postgres: it answers exactly as `GET /api/v1/schedulability`
//! does, follows booking changes within a second or two, lists again after a lost
//! resume point, keeps deciding while the service is down (within its staleness
//! bound, and not past it), counts a stream held back by a long transaction as
//! staleness, and a clean shutdown sends the queued audit reports.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::testing::{random_secret, test_state, token_for};
use gpu_booking_core::admission::Schedulability;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::wire::AuditReport;
use gpu_booking_webhook::{BookingError, BookingSource, Metrics, ReplicaOptions, TokenSource};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The real API on 127.0.0.1, stoppable.
struct Api {
    url: String,
    secret: Vec<u8>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl Api {
    async fn start(pool: sqlx::PgPool) -> Api {
        let secret = random_secret();
        let state = test_state(pool, Policy::default(), Arc::new(SystemClock), &secret);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = gpu_booking_api::app::router(state);
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Api {
            url,
            secret,
            stop: Some(stop),
            served: Some(served),
        }
    }

    fn token(&self, user: &str, role: Option<&str>) -> String {
        token_for(&self.secret, user, role)
    }

    /// Stops answering (the listener is closed: connections are refused).
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            served.abort();
            let _ = served.await;
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, token: &str, body: Value) -> Value {
        let http = reqwest::Client::new();
        let mut request = http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(token);
        if method != reqwest::Method::GET {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status}: {body}");
        body
    }

    /// What the service answers for `(kind, value)`.
    async fn schedulability(&self, kind: &str, value: &str) -> Schedulability {
        let service = self.token("webhook", Some("service"));
        let path = if kind.is_empty() {
            "/api/v1/schedulability".to_owned()
        } else {
            let q: String = url_encode(value);
            format!("/api/v1/schedulability?{kind}={q}")
        };
        serde_json::from_value(
            self.call(reqwest::Method::GET, &path, &service, Value::Null)
                .await,
        )
        .unwrap()
    }

    async fn book(&self, user: &str, model: &str, from_now: TimeDelta, days: i64) -> i64 {
        let admin = self.token("admin@example.com", Some("admin"));
        let start = Utc::now() + from_now;
        let end = start + TimeDelta::days(days);
        let b = self
            .call(
                reqwest::Method::POST,
                "/api/v1/bookings",
                &admin,
                json!({"model": model, "start": start.to_rfc3339(), "end": end.to_rfc3339(),
                       "user": user, "override": true}),
            )
            .await;
        b["id"].as_i64().unwrap()
    }
}

fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Two models, one full (a100: 2 of 2 in use, budget advertised), one free.
async fn lab(api: &Api) {
    let admin = api.token("admin@example.com", Some("admin"));
    let service = api.token("controller", Some("service"));
    for (model, units, pattern, mib, in_use, unit_mib) in [
        ("a100", 2, "*A100*", 40960, 2, Some(81408)),
        ("a6000", 4, "*A6000*", 49152, 1, None),
    ] {
        let path = format!("/api/v1/models/{model}");
        api.call(
            reqwest::Method::PUT,
            &path,
            &admin,
            json!({"units": units, "patterns": [pattern], "gpumem_mib": mib}),
        )
        .await;
        api.call(
            reqwest::Method::PUT,
            &format!("{path}/usage"),
            &service,
            json!({"in_use": in_use, "cards": units,
                   "gpumem_advertised": unit_mib.is_some(), "gpumem_unit_mib": unit_mib}),
        )
        .await;
    }
}

fn client(api: &Api, options: ReplicaOptions) -> Arc<BookingSource> {
    let booking = BookingSource::new(
        &api.url,
        TokenSource::Static(api.token("webhook", Some("service"))),
        Duration::from_secs(2),
        Duration::from_secs(3),
        Arc::new(Metrics::new()),
    )
    .unwrap()
    .with_replica(options);
    Arc::new(booking)
}

fn fast() -> ReplicaOptions {
    ReplicaOptions {
        wait: Duration::from_secs(1),
        refresh: Duration::from_millis(100),
        max_staleness: Duration::from_secs(300),
        relist_after: Duration::from_secs(30),
    }
}

/// The replica's answer, once it has listed.
async fn answer(booking: &BookingSource, kind: &str, value: &str) -> Schedulability {
    let replica = booking.replica().unwrap();
    replica
        .answer(kind, value, Duration::from_secs(10))
        .await
        .unwrap()
        .schedulability
}

/// Asks until `check` holds, at most 10 s (a stream read, not a sleep, makes it true).
async fn until(
    booking: &BookingSource,
    kind: &str,
    value: &str,
    check: impl Fn(&Schedulability) -> bool,
) -> Schedulability {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = answer(booking, kind, value).await;
        if check(&a) || tokio::time::Instant::now() > deadline {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `a` with every earliest start that is "now" (within a few seconds of the call:
/// the service and the replica each answer at their own instant) written as the
/// epoch, so that two answers compare on everything else exactly.
fn at_now(mut a: Schedulability) -> Schedulability {
    let now = Utc::now();
    let is_now = |t: &chrono::DateTime<Utc>| (*t - now).abs() < TimeDelta::seconds(10);
    let epoch = chrono::DateTime::<Utc>::UNIX_EPOCH;
    if a.earliest_booking.as_ref().is_some_and(is_now) {
        a.earliest_booking = Some(epoch);
    }
    for t in a.earliest_booking_by_model.values_mut() {
        if is_now(t) {
            *t = epoch;
        }
    }
    a
}

/// The queries that cover every path of the service's answer.
const QUERIES: [(&str, &str); 12] = [
    ("user", "alice@example.com"),
    ("user", "Alice@Example.com"),
    ("slug", "alice-40example-2ecom"),
    ("slug", "alice-example-com---ff8d9819"),
    ("user", "Bob.Smith"),
    ("slug", "bob-2esmith"),
    ("user", "carol"),
    ("user", "never-booked"),
    ("slug", "nobody-has-this"),
    ("slug", "a-2db"),
    ("slug", "dave"),
    ("", ""),
];

#[sqlx::test(migrations = "../migrations")]
async fn the_replica_answers_exactly_as_the_service_does(pool: sqlx::PgPool) {
    let api = Api::start(pool.clone()).await;
    lab(&api).await;
    // Alice: booked now on the full a100. Bob: last booking ended yesterday
    // (cooldown). Carol: a planned booking. Dave: booked now for 2 units of a6000.
    api.book("alice@example.com", "a100", -TimeDelta::hours(1), 2)
        .await;
    api.book("Bob.Smith", "a6000", -TimeDelta::days(3), 2).await;
    api.book("carol", "a100", TimeDelta::days(5), 2).await;
    let admin = api.token("admin@example.com", Some("admin"));
    let start = Utc::now() - TimeDelta::hours(2);
    api.call(
        reqwest::Method::POST,
        "/api/v1/bookings",
        &admin,
        json!({"model": "a6000", "units": 2, "start": start.to_rfc3339(),
               "end": (start + TimeDelta::days(1)).to_rfc3339(), "user": "dave", "override": true}),
    )
    .await;
    // "a-b" and "a-2db": the safe slug of one is the escape slug of the other (the
    // service refuses the second user's bookings now, so write the user directly).
    sqlx::query("INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('a-b', 'a-2db', 'a-b'), ('a-2db', 'a-2d2db', 'a-2db') ON CONFLICT DO NOTHING")
        .execute(&pool)
        .await
        .unwrap();

    let booking = client(&api, fast());
    for (kind, value) in QUERIES {
        let ours = at_now(answer(&booking, kind, value).await);
        let theirs = at_now(api.schedulability(kind, value).await);
        assert_eq!(ours, theirs, "{kind}={value}");
    }
    // A booking made after the webhook listed reaches it through the stream; an
    // early end too.
    let id = api.book("erin", "a6000", -TimeDelta::minutes(5), 1).await;
    let got = until(&booking, "user", "erin", |a| a.schedulable).await;
    assert_eq!(got.booking_id, Some(id), "the new booking did not arrive");
    assert_eq!(
        at_now(got),
        at_now(api.schedulability("user", "erin").await)
    );
    let admin = api.token("admin@example.com", Some("admin"));
    let http = reqwest::Client::new();
    let ended = http
        .delete(format!("{}/api/v1/bookings/{id}", api.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{}", ended.status());
    let got = until(&booking, "user", "erin", |a| !a.schedulable).await;
    assert!(!got.schedulable, "the early end did not arrive");
    // The figures come through the refresh: a usage report changes `free`.
    let service = api.token("controller", Some("service"));
    api.call(
        reqwest::Method::PUT,
        "/api/v1/models/a6000/usage",
        &service,
        json!({"in_use": 4, "cards": 4, "gpumem_advertised": false, "gpumem_unit_mib": null}),
    )
    .await;
    let a6000 = gpu_booking_core::gpu_model::ModelName::parse("a6000").unwrap();
    let got = until(&booking, "", "", |a| a.free.get(&a6000) == Some(&0)).await;
    assert_eq!(got.free.get(&a6000), Some(&0));
    for (kind, value) in QUERIES {
        let ours = at_now(answer(&booking, kind, value).await);
        let theirs = at_now(api.schedulability(kind, value).await);
        assert_eq!(ours, theirs, "after changes: {kind}={value}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn decisions_stay_right_while_the_service_is_down_within_the_bound(pool: sqlx::PgPool) {
    let mut api = Api::start(pool.clone()).await;
    lab(&api).await;
    api.book("alice@example.com", "a100", -TimeDelta::hours(1), 2)
        .await;
    api.book("Bob.Smith", "a6000", -TimeDelta::days(3), 2).await;
    let booking = client(&api, fast());
    let mut before = Vec::new();
    for (kind, value) in QUERIES {
        let theirs = at_now(api.schedulability(kind, value).await);
        assert_eq!(at_now(answer(&booking, kind, value).await), theirs);
        before.push(theirs);
    }
    api.stop().await;
    // Down: the stream and the refresh fail; the answers stay those of the service.
    let replica = booking.replica().unwrap();
    let down_since = replica.staleness().unwrap();
    // Reads have failed since: the replica is older than when the service stopped.
    let stale = until_stale(replica, down_since).await;
    assert!(stale > down_since, "the staleness does not grow: {stale:?}");
    for ((kind, value), theirs) in QUERIES.into_iter().zip(&before) {
        let ours = at_now(answer(&booking, kind, value).await);
        assert_eq!(&ours, theirs, "{kind}={value}");
    }
    let text = booking_metrics(&booking);
    assert!(
        text.contains("gpu_booking_webhook_replica_staleness_seconds"),
        "{text}"
    );
}

/// Waits until a failed read has been seen (the staleness then only grows).
async fn until_stale(
    replica: &Arc<gpu_booking_webhook::ReplicaHandle>,
    than: Duration,
) -> Duration {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let age = replica.staleness().unwrap();
        if age > than + Duration::from_millis(300) || tokio::time::Instant::now() > deadline {
            return age;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn booking_metrics(booking: &BookingSource) -> String {
    booking.metrics().encode()
}

#[sqlx::test(migrations = "../migrations")]
async fn past_its_bound_the_replica_counts_as_the_service_down(pool: sqlx::PgPool) {
    let mut api = Api::start(pool.clone()).await;
    lab(&api).await;
    api.book("alice@example.com", "a100", -TimeDelta::hours(1), 2)
        .await;
    let booking = client(
        &api,
        ReplicaOptions {
            max_staleness: Duration::from_millis(1500),
            ..fast()
        },
    );
    assert!(
        answer(&booking, "user", "alice@example.com")
            .await
            .schedulable
    );
    api.stop().await;
    let replica = booking.replica().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let err = loop {
        match replica
            .answer("user", "alice@example.com", Duration::ZERO)
            .await
        {
            Err(e) => break e,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => panic!("still answering past its bound"),
        }
    };
    assert!(matches!(err, BookingError::Stale(_)), "{err}");
    assert!(!replica.is_current());
}

/// Once the replica has listed (frank not booked), a transaction of the booking
/// database that takes an id and stays open: every booking change after it waits.
async fn hold_the_stream(
    booking: &BookingSource,
    pool: &sqlx::PgPool,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    assert!(!answer(booking, "user", "frank").await.schedulable);
    let mut open = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *open)
        .await
        .unwrap();
    open
}

/// A transaction of the booking database that stays open holds back every booking
/// change after it (the stream serves changes in transaction order), while the
/// service answers every call: the replica counts what the stream says it lags as
/// staleness, so past its bound (relisting off) it counts the service as down
/// instead of answering "not booked" for a user who booked; once the transaction
/// ends, the booking arrives and the replica is current again.
#[sqlx::test(migrations = "../migrations")]
async fn a_transaction_holding_back_the_stream_counts_as_staleness(pool: sqlx::PgPool) {
    let api = Api::start(pool.clone()).await;
    lab(&api).await;
    // Well above a read's own age (a long poll of 1 s), which alone would pass a
    // bound of 1.5 s now and then.
    let booking = client(
        &api,
        ReplicaOptions {
            max_staleness: Duration::from_secs(4),
            relist_after: Duration::ZERO,
            ..fast()
        },
    );
    let open = hold_the_stream(&booking, &pool).await;
    let id = api.book("frank", "a6000", -TimeDelta::minutes(1), 1).await;
    let replica = booking.replica().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let err = loop {
        match replica.schedulability("user", "frank").await {
            Err(e) => break e,
            Ok(a) if tokio::time::Instant::now() < deadline => {
                assert!(!a.schedulable, "the held change arrived: {a:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => panic!("still answering \"not booked\" with the booking held back"),
        }
    };
    assert!(matches!(err, BookingError::Stale(_)), "{err}");

    open.rollback().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let got = loop {
        match replica.schedulability("user", "frank").await {
            Ok(a) if a.schedulable => break a,
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("the booking did not arrive: {other:?}"),
        }
    };
    assert_eq!(got.booking_id, Some(id));
    assert!(replica.is_current());
}

/// The same hold with relisting on: once the replica's bookings are
/// `relist_after` old while the stream is held back, it lists them again (a listing
/// reads the bookings themselves), so the booking arrives while the transaction
/// is still open and the replica stays current.
#[sqlx::test(migrations = "../migrations")]
async fn a_held_back_stream_is_caught_up_by_listing_again(pool: sqlx::PgPool) {
    let api = Api::start(pool.clone()).await;
    lab(&api).await;
    let booking = client(
        &api,
        ReplicaOptions {
            max_staleness: Duration::from_secs(60),
            relist_after: Duration::from_secs(2),
            ..fast()
        },
    );
    let open = hold_the_stream(&booking, &pool).await;
    let id = api.book("frank", "a6000", -TimeDelta::minutes(1), 1).await;
    let got = until(&booking, "user", "frank", |a| a.schedulable).await;
    assert_eq!(got.booking_id, Some(id), "the held booking did not arrive");
    assert!(booking.replica().unwrap().is_current());
    // Still held: the stream has not served it, a listing brought it.
    let served: Option<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM booking_change c WHERE c.booking_id = $1
           AND c.txid >= booking_change_settled_below(booking_change_elsewhere())",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(served, Some(1), "the change is not held back any more");
    open.rollback().await.unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn a_lost_resume_point_lists_again(pool: sqlx::PgPool) {
    let api = Api::start(pool.clone()).await;
    lab(&api).await;
    let booking = client(&api, fast());
    assert!(!answer(&booking, "user", "frank").await.schedulable);
    // Changes exist, then retention prunes them all: the follower's position is
    // older than what is kept.
    api.book("gina", "a6000", TimeDelta::days(3), 2).await;
    until(&booking, "slug", "gina", |a| a.user.is_some()).await;
    gpu_booking_api::store::changes::prune(&pool, Utc::now() + TimeDelta::days(1))
        .await
        .unwrap();
    let id = api.book("frank", "a6000", -TimeDelta::minutes(1), 1).await;
    let got = until(&booking, "user", "frank", |a| a.schedulable).await;
    assert_eq!(got.booking_id, Some(id));
    let text = booking_metrics(&booking);
    assert!(
        text.contains("gpu_booking_webhook_replica_reads_total{call=\"full\",outcome=\"ok\"}"),
        "{text}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_clean_shutdown_sends_the_queued_audit_reports(pool: sqlx::PgPool) {
    let api = Api::start(pool.clone()).await;
    let booking = BookingSource::new(
        &api.url,
        TokenSource::Static(api.token("webhook", Some("service"))),
        Duration::from_secs(2),
        Duration::from_secs(3),
        Arc::new(Metrics::new()),
    )
    .unwrap()
    .with_audit_rate(10_000, 0.0);
    for i in 0..1200 {
        booking.audit("webhook.low_priority", || AuditReport {
            action: "webhook.low_priority".into(),
            subject: Some(format!("jhub/pod-{i}")),
            user: Some("bob".into()),
            booking_id: None,
            details: json!({"i": i}),
        });
    }
    booking.flush(Duration::from_secs(30)).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE action = 'webhook.low_priority' AND actor = 'webhook'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(n, 1200);
    let text = booking.metrics().encode();
    assert!(
        text.contains("gpu_booking_webhook_side_calls_total{call=\"audit\",outcome=\"ok\"} 1200"),
        "{text}"
    );
}
