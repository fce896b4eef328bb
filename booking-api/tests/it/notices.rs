//! Notices end to end on the real Postgres: audit rows and bookings become notices,
//! sent by e-mail to a local SMTP sink (a small SMTP server in this test, checking
//! the credentials) and to a local HTTP receiver; once each with two senders; retried
//! with backoff, then given up; preferences; the availability endpoint.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use gpu_booking_api::clock::{Clock, ManualClock};
use gpu_booking_api::notices::config::{NoticeArgs, SmtpTls};
use gpu_booking_api::notices::send::{Senders, WebhookSender};
use gpu_booking_api::notices::{self, Channels, NewNotice, Settings, Worker};
use gpu_booking_api::testing::TestApi;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::notice::{Message, NoticeKind, WebhookFormat};
use gpu_booking_core::notice_text::Style;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

const SMTP_USER: &str = "mailer";
const SMTP_PASSWORD: &str = "s3cret-password";

/// One mail the sink took.
#[derive(Debug, Clone)]
struct Mail {
    to: Vec<String>,
    data: String,
}

/// A minimal SMTP server (RFC 5321's commands that lettre sends, AUTH PLAIN and
/// LOGIN) that keeps what it is sent.
#[derive(Clone, Default)]
struct SmtpSink {
    mails: Arc<Mutex<Vec<Mail>>>,
    /// Wrong credentials seen.
    refused_auth: Arc<AtomicUsize>,
}

impl SmtpSink {
    async fn start() -> (SmtpSink, SocketAddr) {
        let sink = SmtpSink::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let s = sink.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.session(tcp).await;
                });
            }
        });
        (sink, addr)
    }

    async fn session(&self, tcp: tokio::net::TcpStream) -> std::io::Result<()> {
        let (r, mut w) = tcp.into_split();
        let mut r = BufReader::new(r);
        w.write_all(b"220 sink ESMTP\r\n").await?;
        let mut to = Vec::new();
        let mut line = String::new();
        let b64 = base64::engine::general_purpose::STANDARD;
        loop {
            line.clear();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let cmd = line.trim_end().to_owned();
            let upper = cmd.to_ascii_uppercase();
            let reply: &[u8] = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
                b"250-sink\r\n250-AUTH PLAIN LOGIN\r\n250-SMTPUTF8\r\n250 8BITMIME\r\n"
            } else if upper.starts_with("AUTH PLAIN") {
                let given = cmd.split_whitespace().nth(2).unwrap_or_default();
                let decoded = b64.decode(given).unwrap_or_default();
                let expected = format!("\0{SMTP_USER}\0{SMTP_PASSWORD}");
                if decoded == expected.as_bytes() {
                    b"235 ok\r\n"
                } else {
                    self.refused_auth.fetch_add(1, Ordering::SeqCst);
                    b"535 no\r\n"
                }
            } else if upper.starts_with("AUTH LOGIN") {
                // lettre prefers PLAIN; LOGIN is answered for completeness.
                w.write_all(b"334 VXNlcm5hbWU6\r\n").await?;
                line.clear();
                r.read_line(&mut line).await?;
                let user = b64.decode(line.trim()).unwrap_or_default();
                w.write_all(b"334 UGFzc3dvcmQ6\r\n").await?;
                line.clear();
                r.read_line(&mut line).await?;
                let pass = b64.decode(line.trim()).unwrap_or_default();
                if user == SMTP_USER.as_bytes() && pass == SMTP_PASSWORD.as_bytes() {
                    b"235 ok\r\n"
                } else {
                    self.refused_auth.fetch_add(1, Ordering::SeqCst);
                    b"535 no\r\n"
                }
            } else if upper.starts_with("MAIL FROM") {
                to.clear();
                b"250 ok\r\n"
            } else if upper.starts_with("RCPT TO") {
                to.push(
                    cmd[8..]
                        .trim()
                        .trim_start_matches('<')
                        .split('>')
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                );
                b"250 ok\r\n"
            } else if upper == "DATA" {
                w.write_all(b"354 go on\r\n").await?;
                let mut data = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).await? == 0 {
                        return Ok(());
                    }
                    if line == ".\r\n" {
                        break;
                    }
                    // RFC 5321, 4.5.2: a line that starts with a dot was sent with
                    // one more.
                    data.push_str(line.strip_prefix('.').unwrap_or(&line));
                }
                self.mails.lock().unwrap().push(Mail {
                    to: std::mem::take(&mut to),
                    data,
                });
                b"250 queued\r\n"
            } else if upper == "RSET" || upper == "NOOP" {
                b"250 ok\r\n"
            } else if upper == "QUIT" {
                w.write_all(b"221 bye\r\n").await?;
                return Ok(());
            } else {
                b"500 what\r\n"
            };
            w.write_all(reply).await?;
        }
    }

    fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

/// An HTTP receiver for the outgoing webhook: keeps each body; answers 500 to the
/// first `fail_first` requests.
#[derive(Clone, Default)]
struct Receiver {
    bodies: Arc<Mutex<Vec<Value>>>,
    calls: Arc<AtomicUsize>,
    fail_first: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start(fail_first: usize) -> (Receiver, String) {
        let rx = Receiver::default();
        rx.fail_first.store(fail_first, Ordering::SeqCst);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/hooks/secret-token",
            listener.local_addr().unwrap()
        );
        let state = rx.clone();
        let app = axum::Router::new().route(
            "/hooks/secret-token",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let state = state.clone();
                async move {
                    let n = state.calls.fetch_add(1, Ordering::SeqCst);
                    if n < state.fail_first.load(Ordering::SeqCst) {
                        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    // A little latency, so that two senders overlap.
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                    state.bodies.lock().unwrap().push(body);
                    axum::http::StatusCode::OK
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (rx, url)
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2031, 3, 3, 9, 0, 0).unwrap()
}

/// Senders for the sink (with credentials from a file) and the receiver.
fn senders(
    smtp: Option<SocketAddr>,
    webhook: Option<(&str, WebhookFormat)>,
) -> (Senders, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("smtp-password");
    std::fs::write(&password, format!("{SMTP_PASSWORD}\n")).unwrap();
    let mut args = NoticeArgs {
        smtp_tls: SmtpTls::None,
        smtp_from: "GPU booking <gpu-booking@lab.example>".into(),
        ..NoticeArgs::default()
    };
    if let Some(addr) = smtp {
        args.smtp_host = Some(addr.ip().to_string());
        args.smtp_port = Some(addr.port());
        args.smtp_username = Some(SMTP_USER.into());
        args.smtp_password_file = Some(password);
    }
    let mut s = Senders::from_args(&args).unwrap();
    if let Some((url, format)) = webhook {
        s.webhook = Some(WebhookSender::new(url, format).unwrap());
    }
    (s, dir)
}

fn worker(pool: &PgPool, clock: &ManualClock, senders: Senders) -> Worker {
    Worker::new(
        pool.clone(),
        Arc::new(clock.clone()),
        senders,
        Settings::default(),
    )
}

async fn report(api: &TestApi, body: Value) {
    let answer = reqwest::Client::new()
        .post(format!("{}/api/v1/audit", api.url))
        .bearer_auth(api.token("controller", Some("service")))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201, "{:?}", answer.text().await);
}

async fn audit_count(pool: &PgPool, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE action = $1")
        .bind(action)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn audit_rows_become_notices_sent_once_by_email_and_webhook(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let (sink, smtp) = SmtpSink::start().await;
    let (rx, url) = Receiver::start(0).await;
    let (s, _dir) = senders(Some(smtp), Some((&url, WebhookFormat::Json)));
    let w = worker(&pool, &clock, s);

    let bob = "bob@lab.example";
    report(
        &api,
        json!({"action": "controller.preempt_warned", "subject": "jhub/jupyter-bob", "user": bob,
        "details": {"model": "a100", "booked_pod": "jhub/jupyter-zoe", "ends_at": "2026-12-01T09:02:00Z"}}),
    )
    .await;
    report(
        &api,
        json!({"action": "controller.preempt", "subject": "jhub/jupyter-bob", "user": bob,
        "details": {"result": "recreated", "model": "a100", "for": "zoe"}}),
    )
    .await;
    report(
        &api,
        json!({"action": "webhook.strip", "subject": "jhub/jupyter-bob", "user": bob,
        "details": {"warning": "no a100 is free"}}),
    )
    .await;
    report(
        &api,
        json!({"action": "agent.reclaim", "subject": "jhub/jupyter-bob", "user": bob,
        "details": {"idle_minutes": 31.0}}),
    )
    .await;
    // None of these make a notice: not an action that does, a dry run, a failed
    // preemption, no user.
    report(&api, json!({"action": "controller.expire", "subject": "jhub/x", "user": bob, "details": {"result": "recreated"}})).await;
    report(
        &api,
        json!({"action": "agent.reclaim_dry_run", "subject": "jhub/x", "user": bob}),
    )
    .await;
    report(&api, json!({"action": "controller.preempt", "subject": "jhub/x", "user": bob, "details": {"result": "error"}})).await;
    report(
        &api,
        json!({"action": "webhook.strip", "subject": "jhub/anonymous"}),
    )
    .await;

    let round = w.round().await.unwrap();
    assert_eq!(
        (round.queued, round.sent, round.failed),
        (4, 8, 0),
        "{round:?}"
    );
    let mails = sink.mails();
    assert_eq!(mails.len(), 4);
    assert!(
        mails.iter().all(|m| m.to == vec![bob.to_owned()]),
        "{mails:?}"
    );
    let all: String = mails.iter().map(|m| m.data.clone()).collect();
    for words in [
        "Subject: Your lent GPU is about to be taken back",
        "Subject: Your lent GPU was taken back",
        "Subject: Your notebook started without a GPU",
        "Subject: Idle GPU processes were ended",
        "From: \"GPU booking\" <gpu-booking@lab.example>",
    ] {
        assert!(all.contains(words), "{words:?} missing in {all}");
    }
    assert_eq!(sink.refused_auth.load(Ordering::SeqCst), 0);
    let kinds: Vec<String> = rx
        .bodies()
        .iter()
        .map(|b| b["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "gpu_taken_back_soon",
            "gpu_taken_back",
            "spawn_stripped",
            "processes_reclaimed"
        ]
    );
    assert_eq!(rx.bodies()[0]["user"], bob);

    // Again, and after a restart (a new worker): nothing is sent twice.
    assert_eq!(w.round().await.unwrap(), notices::Round::default());
    let (s2, _dir2) = senders(Some(smtp), Some((&url, WebhookFormat::Json)));
    assert_eq!(
        worker(&pool, &clock, s2).round().await.unwrap(),
        notices::Round::default()
    );
    assert_eq!(sink.mails().len(), 4);
    assert_eq!(rx.bodies().len(), 4);
    assert_eq!(audit_count(&pool, "notice.sent").await, 8);

    // The user sees them on the page's API, each with its deliveries.
    let mine: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/me/notices", api.url))
        .bearer_auth(api.token(bob, None))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine["recent"].as_array().unwrap().len(), 4, "{mine}");
    assert_eq!(
        mine["recent"][0]["deliveries"],
        json!(["email:sent", "webhook:sent"])
    );
    assert_eq!(mine["address"], bob);
}

#[sqlx::test(migrations = "../migrations")]
async fn wrong_smtp_credentials_are_retried_and_never_logged_as_sent(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let (sink, smtp) = SmtpSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "wrong").unwrap();
    let args = NoticeArgs {
        smtp_tls: SmtpTls::None,
        smtp_host: Some(smtp.ip().to_string()),
        smtp_port: Some(smtp.port()),
        smtp_username: Some(SMTP_USER.into()),
        smtp_password_file: Some(password),
        ..NoticeArgs::default()
    };
    let w = worker(&pool, &clock, Senders::from_args(&args).unwrap());
    let mut conn = pool.acquire().await.unwrap();
    notices::enqueue(
        &mut conn,
        Channels {
            email: true,
            webhook: false,
        },
        new_notice("k1", "carol@lab.example"),
        t0(),
    )
    .await
    .unwrap();
    drop(conn);
    let round = w.round().await.unwrap();
    assert_eq!((round.sent, round.retried), (0, 1));
    assert_eq!(sink.refused_auth.load(Ordering::SeqCst), 1);
    assert!(sink.mails().is_empty());
    let error: String = sqlx::query_scalar("SELECT last_error FROM notice_delivery")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !error.contains("wrong"),
        "the password leaked into {error:?}"
    );
}

fn new_notice<'a>(key: &'a str, user: &'a str) -> NewNotice<'a> {
    NewNotice {
        key,
        user,
        kind: NoticeKind::WaitlistPromoted,
        booking_id: None,
        audit_id: None,
        message: Message {
            title: "Your waitlist entry is a booking".into(),
            text: "One a100 GPU from Monday.".into(),
        },
        details: json!({}),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn enqueue_is_once_per_key_and_follows_preferences(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let both = Channels {
        email: true,
        webhook: true,
    };
    let mut tx = pool.begin().await.unwrap();
    assert!(notices::enqueue(
        &mut tx,
        both,
        new_notice("waitlist:1", "dan@lab.example"),
        t0()
    )
    .await
    .unwrap()
    .is_some());
    assert!(notices::enqueue(
        &mut tx,
        both,
        new_notice("waitlist:1", "dan@lab.example"),
        t0()
    )
    .await
    .unwrap()
    .is_none());
    // Rolled back with the caller's transaction: nothing stays.
    tx.rollback().await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM notice")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 0);

    let put = |token: String, body: Value| {
        let url = format!("{}/api/v1/me/notices", api.url);
        async move {
            reqwest::Client::new()
                .put(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    // Bad input: a clear error, nothing changed.
    for bad in [
        json!({"email": "not an address", "email_enabled": true, "webhook_enabled": true, "muted": []}),
        json!({"email": null, "email_enabled": true, "webhook_enabled": true, "muted": ["nope"]}),
    ] {
        let answer = put(api.token("dan", None), bad).await;
        assert_eq!(answer.status(), 422);
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"], "invalid_request");
    }
    let answer = put(
        api.token("dan", None),
        json!({"email_enabled": true, "webhook_enabled": true, "muted": [], "x": 1}),
    )
    .await;
    assert!(answer.status().is_client_error());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM notice_pref")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);

    // "dan" is no address: e-mail only once he gives one; he mutes the webhook for
    // stripped spawns.
    let answer = put(
        api.token("dan", None),
        json!({"email": "dan@lab.example", "email_enabled": true, "webhook_enabled": false, "muted": ["spawn_stripped"]}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let view: Value = answer.json().await.unwrap();
    assert_eq!(view["address"], "dan@lab.example");
    assert_eq!(view["prefs"]["muted"], json!(["spawn_stripped"]));

    let mut conn = pool.acquire().await.unwrap();
    notices::enqueue(&mut conn, both, new_notice("a", "dan"), t0())
        .await
        .unwrap();
    let mut muted = new_notice("b", "dan");
    muted.kind = NoticeKind::SpawnStripped;
    notices::enqueue(&mut conn, both, muted, t0())
        .await
        .unwrap();
    let deliveries: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT n.key, d.channel, d.address FROM notice n JOIN notice_delivery d ON d.notice_id = n.id ORDER BY n.key",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        deliveries,
        vec![("a".into(), "email".into(), Some("dan@lab.example".into()))]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn reminders_before_a_booking_starts_and_ends(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let admin = api.token("admin", Some("admin"));
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/api/v1/models/a100", api.url))
        .bearer_auth(&admin)
        .json(&json!({"units": 1, "patterns": ["*A100*"], "gpumem_mib": 0}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{:?}", put.text().await);
    let start = t0() + TimeDelta::hours(30);
    let end = start + TimeDelta::days(2);
    let created = client
        .post(format!("{}/api/v1/bookings", api.url))
        .bearer_auth(api.token("eve@lab.example", None))
        .json(&json!({"model": "a100", "start": start, "end": end}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{:?}", created.text().await);
    let (rx, url) = Receiver::start(0).await;
    let (s, _dir) = senders(None, Some((&url, WebhookFormat::Slack)));
    let w = worker(&pool, &clock, s);

    let titles = |rx: &Receiver| -> Vec<String> {
        rx.bodies()
            .iter()
            .map(|b| {
                b["text"]
                    .as_str()
                    .unwrap()
                    .lines()
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    w.round().await.unwrap();
    assert!(rx.bodies().is_empty());
    // 24 h before the start, and each moment after it until the 1 h lead: one notice.
    clock.set(start - TimeDelta::hours(24));
    w.round().await.unwrap();
    clock.set(start - TimeDelta::hours(2));
    w.round().await.unwrap();
    assert_eq!(
        titles(&rx),
        ["*Your a100 booking starts in 1 day* (eve@lab.example)"]
    );
    clock.set(start - TimeDelta::hours(1));
    w.round().await.unwrap();
    clock.set(start);
    w.round().await.unwrap();
    assert_eq!(titles(&rx).len(), 2);
    assert_eq!(
        titles(&rx)[1],
        "*Your a100 booking starts in 1 h* (eve@lab.example)"
    );
    // The end: 24 h and 1 h before it.
    clock.set(end - TimeDelta::hours(24) + TimeDelta::minutes(5));
    w.round().await.unwrap();
    clock.set(end - TimeDelta::minutes(10));
    w.round().await.unwrap();
    clock.set(end);
    w.round().await.unwrap();
    let all = titles(&rx);
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(
        all[2],
        "*Your a100 booking ends in 23 h 55 min* (eve@lab.example)"
    );
    assert_eq!(
        all[3],
        "*Your a100 booking ends in 10 min* (eve@lab.example)"
    );
    // The Slack body is `{"text": ...}` only.
    assert!(rx
        .bodies()
        .iter()
        .all(|b| b.as_object().unwrap().len() == 1));
}

#[sqlx::test(migrations = "../migrations")]
async fn failed_deliveries_are_retried_with_backoff_then_given_up(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let (rx, url) = Receiver::start(2).await;
    let (s, _dir) = senders(None, Some((&url, WebhookFormat::Json)));
    let w = worker(&pool, &clock, s.clone());
    let hook = Channels {
        email: false,
        webhook: true,
    };
    let mut conn = pool.acquire().await.unwrap();
    notices::enqueue(&mut conn, hook, new_notice("w1", "fay"), t0())
        .await
        .unwrap();

    assert_eq!(w.round().await.unwrap().retried, 1);
    // Not due again before the backoff (30 s, then 60 s).
    clock.advance(TimeDelta::seconds(29));
    assert_eq!(w.round().await.unwrap(), notices::Round::default());
    clock.advance(TimeDelta::seconds(1));
    assert_eq!(w.round().await.unwrap().retried, 1);
    clock.advance(TimeDelta::seconds(59));
    assert_eq!(w.round().await.unwrap(), notices::Round::default());
    clock.advance(TimeDelta::seconds(1));
    assert_eq!(w.round().await.unwrap().sent, 1);
    assert_eq!(rx.calls.load(Ordering::SeqCst), 3);
    assert_eq!(rx.bodies().len(), 1);
    let (attempts, state): (i32, String) =
        sqlx::query_as("SELECT attempts, state FROM notice_delivery")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempts, state.as_str()), (3, "sent"));

    // A receiver that always fails: given up after the set number of tries, audited.
    rx.fail_first.store(usize::MAX, Ordering::SeqCst);
    let settings = Settings {
        max_attempts: 3,
        ..Settings::default()
    };
    let w = Worker::new(pool.clone(), Arc::new(clock.clone()), s, settings);
    notices::enqueue(&mut conn, hook, new_notice("w2", "fay"), clock.now())
        .await
        .unwrap();
    let mut failed = 0;
    for _ in 0..10 {
        failed += w.round().await.unwrap().failed;
        clock.advance(TimeDelta::hours(1));
    }
    assert_eq!(failed, 1);
    assert_eq!(rx.calls.load(Ordering::SeqCst), 3 + 3);
    assert_eq!(audit_count(&pool, "notice.failed").await, 1);
    assert_eq!(audit_count(&pool, "notice.sent").await, 1);
    let error: String = sqlx::query_scalar(
        "SELECT details->>'error' FROM audit_event WHERE action = 'notice.failed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(error, "webhook answered HTTP 500");
    assert!(!error.contains("secret-token"));
}

/// Two replicas (two pools, two workers) fill and send from one outbox at once:
/// every notice reaches the receiver exactly once.
#[sqlx::test(migrations = "../migrations")]
async fn two_replicas_send_each_notice_once(pool: PgPool) {
    const USERS: usize = 60;
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    for i in 0..USERS {
        report(
            &api,
            json!({"action": "webhook.strip", "subject": format!("jhub/jupyter-u{i}"),
            "user": format!("u{i}@lab.example")}),
        )
        .await;
    }
    let (rx, url) = Receiver::start(0).await;
    let replica = |pool: PgPool| {
        let (s, dir) = senders(None, Some((&url, WebhookFormat::Json)));
        let settings = Settings {
            // Small batches, so that the two interleave over many rounds.
            batch: 4,
            ..Settings::default()
        };
        (Worker::new(pool, Arc::new(clock.clone()), s, settings), dir)
    };
    let other = PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let (a, _da) = replica(pool.clone());
    let (b, _db) = replica(other);
    let mut sent = 0;
    for _ in 0..100 {
        let (ra, rb) = tokio::join!(a.round(), b.round());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        sent += ra.sent + rb.sent;
        if ra == notices::Round::default() && rb == notices::Round::default() && sent == USERS {
            break;
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for body in rx.bodies() {
        *seen
            .entry(body["user"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(seen.len(), USERS, "every user got a notice");
    assert!(seen.values().all(|&n| n == 1), "duplicates: {seen:?}");
    assert_eq!(sent, USERS);
    assert_eq!(audit_count(&pool, "notice.sent").await, USERS as i64);
}

#[sqlx::test(migrations = "../migrations")]
async fn availability_for_the_spawn_form(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let admin = api.token("admin", Some("admin"));
    for (name, units) in [("a100", 2), ("a6000", 4)] {
        let r = client
            .put(format!("{}/api/v1/models/{name}", api.url))
            .bearer_auth(&admin)
            .json(&json!({"units": units, "patterns": [], "gpumem_mib": 0}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let r = client
        .put(format!("{}/api/v1/models/a100/usage", api.url))
        .bearer_auth(&admin)
        .json(&json!({"in_use": 1}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let book = |user: &str, start: DateTime<Utc>| {
        client
            .post(format!("{}/api/v1/bookings", api.url))
            .bearer_auth(api.token(user, None))
            .json(&json!({"model": "a100", "start": start, "end": start + TimeDelta::days(2)}))
            .send()
    };
    assert_eq!(book("gil", t0()).await.unwrap().status(), 201);
    let next_start = t0() + TimeDelta::days(5);
    assert_eq!(book("hal", next_start).await.unwrap().status(), 201);

    let get = |token: String, query: &'static str| {
        let url = format!("{}/api/v1/availability{query}", api.url);
        let client = client.clone();
        async move { client.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let gil: Value = get(api.token("gil", None), "").await.json().await.unwrap();
    assert_eq!(gil["user"], "gil");
    assert_eq!(
        gil["models"],
        json!([{"name": "a100", "units": 2, "free_now": 1}, {"name": "a6000", "units": 4, "free_now": 4}])
    );
    assert_eq!(gil["active"]["model"], "a100");
    assert_eq!(gil["next"], Value::Null);
    // The hub asks for the user who spawns, with its service token.
    let hal: Value = get(api.token("hub", Some("service")), "?user=HAL")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hal["user"], "hal");
    assert_eq!(hal["active"], Value::Null);
    assert_eq!(hal["next"]["start"], json!(next_start));
    // A user cannot ask about another.
    assert_eq!(get(api.token("gil", None), "?user=hal").await.status(), 403);
    assert_eq!(
        get(api.token("hub", Some("service")), "?user=")
            .await
            .status(),
        422
    );

    // The documented KubeSpawner profile_list callable, against this API.
    // Run beside the API (this test's runtime has one thread): tokio's process.
    let profiles = |user: &'static str| {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/jupyterhub/gpu_booking_profiles.py"
        );
        let mut cmd = tokio::process::Command::new("python3");
        cmd.arg(script)
            .arg("--self-test")
            .env("GPU_BOOKING_URL", &api.url)
            .env("GPU_BOOKING_TOKEN", api.token("hub", Some("service")))
            .env("GPU_BOOKING_PAGE", "https://gpu.lab.example/")
            .env("SELF_TEST_USER", user);
        async move {
            let out = cmd
                .output()
                .await
                .expect("python3 runs the profile_list snippet");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && stderr.is_empty(), "{stderr}");
            serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
        }
    };
    let gil = profiles("gil").await;
    assert_eq!(gil.len(), 2, "{gil:?}");
    assert!(
        gil[0]["display_name"]
            .as_str()
            .unwrap()
            .starts_with("Your booked a100 GPU (until 2031-03-05 09:00 UTC)"),
        "{gil:?}"
    );
    assert_eq!(gil[0]["default"], true);
    assert_eq!(
        gil[0]["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpu"],
        "1"
    );
    let hal = profiles("hal").await;
    assert_eq!(
        hal[0]["display_name"], "One GPU, lent (a100: 1 of 2 free, a6000: 4 of 4 free)",
        "{hal:?}"
    );
    assert!(
        hal[0]["description"]
            .as_str()
            .unwrap()
            .contains("Your next booking: a100 from 2031-03-08 09:00 UTC."),
        "{hal:?}"
    );
    assert_eq!(hal[1], json!({"display_name": "CPU only", "default": true}));
}

/// Claims that a round cannot send well within their lease are handed back untried
/// (never sent late, beside a replica that took them over): with a lease too short
/// for any send, nothing is sent and nothing counts as a try.
#[sqlx::test(migrations = "../migrations")]
async fn claims_past_the_send_budget_are_handed_back(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let (rx, url) = Receiver::start(0).await;
    let (s, _dir) = senders(None, Some((&url, WebhookFormat::Json)));
    let hook = Channels {
        email: false,
        webhook: true,
    };
    let mut conn = pool.acquire().await.unwrap();
    for key in ["h1", "h2"] {
        notices::enqueue(&mut conn, hook, new_notice(key, "gus"), t0())
            .await
            .unwrap();
    }
    let short = Settings {
        lease: TimeDelta::seconds(40),
        ..Settings::default()
    };
    let hasty = Worker::new(pool.clone(), Arc::new(clock.clone()), s.clone(), short);
    assert_eq!(hasty.round().await.unwrap(), notices::Round::default());
    let rows: Vec<(i32, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT attempts, claimed_until FROM notice_delivery")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, vec![(0, None), (0, None)]);
    assert_eq!(rx.calls.load(Ordering::SeqCst), 0);
    // A worker with the usual lease sends both, at once.
    assert_eq!(worker(&pool, &clock, s).round().await.unwrap().sent, 2);
}

/// `notice.details` (a JSON column) holds only plain values taken from an audit row,
/// whatever the reporter put there: huge numbers and deep nesting do not reach it,
/// and the notice is sent and listed.
#[sqlx::test(migrations = "../migrations")]
async fn odd_audit_details_make_plain_notices(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let api = TestApi::start_with(pool.clone(), Policy::default(), Arc::new(clock.clone()))
        .await
        .unwrap();
    let mut deep = json!(1e308);
    for _ in 0..60 {
        deep = json!([deep]);
    }
    report(&api, json!({"action": "controller.preempt", "subject": "jhub/jupyter-ivy", "user": "ivy@lab.example",
        "details": {"result": "deleted", "model": deep, "idle_minutes": 1e308}})).await;
    report(
        &api,
        json!({"action": "agent.reclaim", "subject": "jhub/jupyter-ivy", "user": "ivy@lab.example",
        "details": {"model": 1e308, "idle_minutes": "many"}}),
    )
    .await;
    let (rx, url) = Receiver::start(0).await;
    let (s, _dir) = senders(None, Some((&url, WebhookFormat::Json)));
    assert_eq!(worker(&pool, &clock, s).round().await.unwrap().sent, 2);
    let bodies = rx.bodies();
    assert_eq!(bodies[0]["details"]["model"], Value::Null);
    assert_eq!(bodies[1]["details"]["model"], Value::Null);
    assert!(
        !bodies[1]["text"].as_str().unwrap().contains("for "),
        "{}",
        bodies[1]["text"]
    );
    let stored: Vec<String> = sqlx::query_scalar("SELECT details::text FROM notice ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(stored.iter().all(|d| d.len() < 200), "{stored:?}");
    let mine: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/me/notices", api.url))
        .bearer_auth(api.token("ivy@lab.example", None))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine["recent"].as_array().unwrap().len(), 2);
}

/// Reads each mail as a mail program does: Python's `email` package with its strict
/// policy (a defect is an error), printing per mail its headers, its content type,
/// charset and transfer encoding, and its body decoded to text.
const READ_MAILS: &str = r#"
import email, email.policy, json, sys
out = []
for raw in json.load(sys.stdin):
    msg = email.message_from_string(raw, policy=email.policy.strict)
    out.append({
        "headers": {k: str(v) for k, v in msg.items()},
        "content_type": msg.get_content_type(),
        "charset": msg.get_content_charset(),
        "encoding": msg["Content-Transfer-Encoding"],
        "date_parsed": msg["Date"].datetime is not None,
        "multipart": msg.is_multipart(),
        "body": msg.get_content(),
        "defects": [str(d) for d in msg.defects],
    })
json.dump(out, sys.stdout)
"#;

async fn read_mails(mails: &[Mail]) -> Vec<Value> {
    let raw: Vec<&str> = mails.iter().map(|m| m.data.as_str()).collect();
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(READ_MAILS)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 reads the mails");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(serde_json::to_string(&raw).unwrap().as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every notice's mail as a mail program reads it: MIME 1.0, `text/plain` in UTF-8
/// with a transfer encoding that says how, a Date and the notice's own Message-ID;
/// the body decodes to the words meant, times in the lab's zone in one format, and
/// the page's link last in every notice about a booking.
#[sqlx::test(migrations = "../migrations")]
async fn every_mail_is_mime_that_a_mail_client_reads_as_meant(pool: PgPool) {
    let clock = ManualClock::new(t0());
    let policy = Policy {
        max_units_per_booking: 2,
        ..Policy::default()
    };
    let api = TestApi::start_with(pool.clone(), policy, Arc::new(clock.clone()))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/api/v1/models/a100", api.url))
        .bearer_auth(api.token("admin", Some("admin")))
        .json(&json!({"units": 3, "patterns": [], "gpumem_mib": 0}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{:?}", put.text().await);
    // eve books 2 of the 3 units; fay's waitlist entry takes the third at once.
    let (eve, fay, bob) = ("eve@lab.example", "fay@lab.example", "bob@lab.example");
    let start = t0() + TimeDelta::hours(31);
    let created: Value = client
        .post(format!("{}/api/v1/bookings", api.url))
        .bearer_auth(api.token(eve, None))
        .json(&json!({"model": "a100", "units": 2, "start": start, "end": start + TimeDelta::days(2)}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let eve_booking = created["id"].as_i64().expect("eve's booking");
    let entry: Value = client
        .post(format!("{}/api/v1/waitlist", api.url))
        .bearer_auth(api.token(fay, None))
        .json(&json!({"model": "a100", "from": start, "days": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(entry["state"], "booked", "{entry}");
    let fay_booking = entry["booking_id"].as_i64().unwrap();
    // A notice with words beyond ASCII (the webhook's warning is passed on).
    report(
        &api,
        json!({"action": "webhook.strip", "subject": "jhub/jupyter-bob", "user": bob,
        "details": {"warning": "Kein A100 frei – später wieder."}}),
    )
    .await;

    let (sink, smtp) = SmtpSink::start().await;
    let (s, _dir) = senders(Some(smtp), None);
    let settings = Settings {
        style: Style {
            zone: chrono_tz::Europe::Berlin,
            page_url: Some("https://gpu.lab.example/".into()),
        },
        ..Settings::default()
    };
    let w = Worker::new(pool.clone(), Arc::new(clock.clone()), s, settings);
    // An hour before the bookings start: both reminders, the promotion, the strip.
    clock.set(start - TimeDelta::hours(1));
    let round = w.round().await.unwrap();
    assert_eq!((round.queued, round.sent), (4, 4), "{round:?}");

    let mails = sink.mails();
    let read = read_mails(&mails).await;
    let footer = "\n\n-- \ngpu-booking: change which notices you get on the booking page.";
    let link = "\n\nYour bookings: https://gpu.lab.example/#mine";
    let when = "Tue 4 Mar 2031, 17:00 CET";
    let expected: HashMap<(&str, &str), String> = [
        (
            (eve, "Your a100 booking starts in 1 h"),
            format!(
                "Booking {eve_booking} of 2 a100 GPUs starts {when} (in 1 h). Spawn your \
                 notebook from then on to get the GPUs.{link}"
            ),
        ),
        (
            (fay, "Your a100 booking starts in 1 h"),
            format!(
                "Booking {fay_booking} of one a100 GPU starts {when} (in 1 h). Spawn your \
                 notebook from then on to get the GPU.{link}"
            ),
        ),
        (
            (fay, "Your waitlist entry was booked"),
            format!(
                "One a100 GPU came free: you are booked from {when} to Wed 5 Mar 2031, 17:00 \
                 CET (booking {fay_booking}).{link}"
            ),
        ),
        (
            (bob, "Your notebook started without a GPU"),
            "jhub/jupyter-bob asked for a GPU, but none was free for you, so it runs on CPU \
             only. Kein A100 frei – später wieder."
                .to_owned(),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(read.len(), expected.len());
    let mut ids = std::collections::HashSet::new();
    for (mail, got) in mails.iter().zip(&read) {
        let h = &got["headers"];
        let to = mail.to[0].as_str();
        let subject = h["Subject"].as_str().unwrap();
        let want = expected
            .get(&(to, subject))
            .unwrap_or_else(|| panic!("an unexpected mail: {to} {subject}"));
        assert_eq!(got["defects"], json!([]), "{}", mail.data);
        assert_eq!(got["multipart"], false);
        assert_eq!(h["MIME-Version"], "1.0", "{}", mail.data);
        assert_eq!(got["content_type"], "text/plain");
        assert_eq!(got["charset"], "utf-8");
        let encoding = got["encoding"].as_str().unwrap_or_default();
        assert!(
            ["7bit", "quoted-printable", "base64"].contains(&encoding),
            "{}",
            mail.data
        );
        assert_eq!(got["date_parsed"], true);
        assert_eq!(h["From"], "GPU booking <gpu-booking@lab.example>");
        assert_eq!(h["To"], to);
        let id = h["Message-ID"].as_str().unwrap();
        assert!(
            id.starts_with("<gpu-booking.notice-") && id.ends_with("@lab.example>"),
            "{id}"
        );
        assert!(ids.insert(id.to_owned()), "a Message-ID twice: {id}");
        // The body as a reader sees it: the notice, then the signature (lettre ends
        // a part with a line end of its own, before the one that closes the data).
        let body = got["body"].as_str().unwrap().replace("\r\n", "\n");
        assert_eq!(body.trim_end_matches('\n'), format!("{want}{footer}"));
        // Non-ASCII words travel encoded, never as raw 8-bit bytes.
        assert!(mail.data.is_ascii(), "{}", mail.data);
    }
    // The one with words beyond ASCII is quoted-printable (lettre's choice).
    let stripped = read.iter().find(|m| m["headers"]["To"] == bob).unwrap();
    assert_eq!(stripped["encoding"], "quoted-printable");
}
