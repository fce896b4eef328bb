//! The booking change stream (`GET /api/v1/booking-changes`) and changing a
//! booking's window (`PATCH /api/v1/bookings/{id}`), over real HTTP on the real
//! Postgres (`DATABASE_URL`), each test on a fresh database.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use gpu_booking_api::clock::{ManualClock, SystemClock};
use gpu_booking_api::testing::TestApi;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

/// A policy that lets tests book short windows.
fn short_policy() -> Policy {
    Policy {
        min_duration: TimeDelta::seconds(1),
        ..Policy::default()
    }
}

struct Api {
    api: TestApi,
    http: reqwest::Client,
    admin: String,
    service: String,
}

impl Api {
    async fn start(pool: PgPool, clock: Arc<dyn gpu_booking_api::clock::Clock>) -> Api {
        let api = TestApi::start_with(pool, short_policy(), clock)
            .await
            .unwrap();
        let admin = api.token("root@lab", Some("admin"));
        let service = api.token("controller", Some("service"));
        let a = Api {
            api,
            http: reqwest::Client::new(),
            admin,
            service,
        };
        for (model, units) in [("a100", 1), ("t4", 2)] {
            let r = a
                .send(
                    reqwest::Method::PUT,
                    &format!("/api/v1/models/{model}"),
                    &a.admin.clone(),
                    Some(json!({"units": units})),
                )
                .await;
            assert_eq!(r.0, 200, "{}", r.1);
        }
        a
    }

    fn token(&self, user: &str) -> String {
        self.api.token(user, None)
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.api.url))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn book(&self, user: &str, model: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> i64 {
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                "/api/v1/bookings",
                &self.admin,
                Some(json!({"model": model, "start": start, "end": end, "user": user, "override": true})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_i64().unwrap()
    }

    async fn patch(&self, id: i64, token: &str, body: Value) -> (u16, Value) {
        self.send(
            reqwest::Method::PATCH,
            &format!("/api/v1/bookings/{id}"),
            token,
            Some(body),
        )
        .await
    }

    async fn changes(&self, after: Option<i64>, wait: u64) -> (u16, Value) {
        let path = match after {
            Some(a) => format!("/api/v1/booking-changes?after={a}&wait={wait}"),
            None => "/api/v1/booking-changes".to_owned(),
        };
        self.send(reqwest::Method::GET, &path, &self.service.clone(), None)
            .await
    }

    /// Follows from `after` until `count` changes came (a change is served once
    /// every older transaction of its database has finished, so it may take a poll
    /// or two); the changes and the position.
    async fn follow(&self, mut after: i64, count: usize) -> (Vec<Value>, i64) {
        let mut got = Vec::new();
        for _ in 0..60 {
            let (status, body) = self.changes(Some(after), 5).await;
            assert_eq!(status, 200, "{body}");
            got.extend(body["changes"].as_array().unwrap().iter().cloned());
            after = body["next"].as_i64().unwrap();
            if got.len() >= count {
                break;
            }
        }
        (got, after)
    }
}

fn hour() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap() + TimeDelta::hours(1)
}

#[sqlx::test(migrations = "../migrations")]
async fn the_stream_lists_then_follows_every_change_with_the_current_state(pool: PgPool) {
    let api = Api::start(pool, Arc::new(SystemClock)).await;
    let (status, listed) = api.changes(None, 0).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["changes"], json!([]));
    let start = listed["next"].as_i64().unwrap();

    let t = hour();
    let first = api.book("alice", "a100", t, t + TimeDelta::days(1)).await;
    let r = api
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/bookings/{first}"),
            &api.admin,
            None,
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    let second = api.book("bob", "t4", t, t + TimeDelta::days(2)).await;

    let (changes, next) = api.follow(start, 3).await;
    let seen: Vec<(i64, &str, &str)> = changes
        .iter()
        .map(|c| {
            (
                c["booking"]["id"].as_i64().unwrap(),
                c["kind"].as_str().unwrap(),
                c["booking"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    // Each change carries the booking as it is now: the first is cancelled in both.
    assert_eq!(
        seen,
        [
            (first, "created", "cancelled"),
            (first, "cancelled", "cancelled"),
            (second, "created", "planned"),
        ]
    );
    let b = &changes[2]["booking"];
    assert_eq!(
        (b["user"].as_str(), b["model"].as_str()),
        (Some("bob"), Some("t4"))
    );
    assert!(b["start"].is_string() && b["end"].is_string());
    // Nothing new: an empty answer at once, and the same or a later position.
    let (status, body) = api.changes(Some(next), 0).await;
    assert_eq!((status, &body["changes"]), (200, &json!([])));
    assert!(body["next"].as_i64().unwrap() >= next);
    // A fresh listing holds the current bookings only.
    let (_, listed) = api.changes(None, 0).await;
    let ids: Vec<i64> = listed["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["booking"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [second]);
    assert_eq!(listed["changes"][0]["kind"], "current");
}

/// A listing's bookings: (id, status).
async fn listed(api: &Api) -> Vec<(i64, String)> {
    let (status, body) = api.changes(None, 0).await;
    assert_eq!(status, 200, "{body}");
    body["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["kind"], "current");
            (
                c["booking"]["id"].as_i64().unwrap(),
                c["booking"]["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A listing also holds the bookings that ended in the last `LISTED_AFTER_END`
/// (ended early or on time, as `ended`), so that a follower that lists again after
/// missing their end ends their pods at once; not cancelled ones, nor those that
/// ended longer ago.
#[sqlx::test(migrations = "../migrations")]
async fn a_listing_holds_the_bookings_that_ended_lately(pool: PgPool) {
    let t0 = hour() + TimeDelta::days(1);
    let clock = ManualClock::new(t0 - TimeDelta::hours(1));
    let api = Api::start(pool, Arc::new(clock.clone())).await;
    let alice = api.book("alice", "a100", t0, t0 + TimeDelta::days(1)).await;
    let bob = api.book("bob", "t4", t0, t0 + TimeDelta::days(2)).await;
    let carol = api.book("carol", "t4", t0, t0 + TimeDelta::hours(1)).await;
    let dave = api
        .book(
            "dave",
            "t4",
            t0 + TimeDelta::days(3),
            t0 + TimeDelta::days(4),
        )
        .await;
    clock.set(t0 + TimeDelta::minutes(30));
    for id in [alice, dave] {
        let r = api
            .send(
                reqwest::Method::DELETE,
                &format!("/api/v1/bookings/{id}"),
                &api.admin,
                None,
            )
            .await;
        assert_eq!(r.0, 200, "{}", r.1);
    }
    // Alice's ended early at t0 + 30 min, carol's on time at t0 + 1 h, dave's was
    // cancelled before it started.
    clock.set(t0 + TimeDelta::hours(1) + TimeDelta::minutes(1));
    let ended = "ended".to_owned();
    assert_eq!(
        listed(&api).await,
        [(bob, "active".to_owned()), (carol, ended.clone())]
    );
    clock.set(t0 + TimeDelta::minutes(35));
    assert_eq!(
        listed(&api).await,
        [
            (alice, ended.clone()),
            (bob, "active".to_owned()),
            (carol, "active".to_owned())
        ]
    );
    clock.set(t0 + TimeDelta::hours(1) + gpu_booking_core::booking_end::LISTED_AFTER_END);
    assert_eq!(listed(&api).await, [(bob, "active".to_owned())]);
}

/// A move of a multi-unit booking's later units (what a create's replan writes) is a
/// change: the trigger compared only the first unit (`slot`) before migration
/// 20261202000100, and a follower kept the old `slots`. An update that changes nothing
/// a follower sees writes none.
#[sqlx::test(migrations = "../migrations")]
async fn a_move_of_any_unit_is_a_change(pool: PgPool) {
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let r = api
        .send(
            reqwest::Method::PUT,
            "/api/v1/models/v100",
            &api.admin.clone(),
            Some(json!({"units": 3})),
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    // The position before the create; following from it until the create is served
    // puts `next` after it (a change is served once every older transaction of the
    // database has finished, so a listing right after the create may come before it).
    let (_, listed) = api.changes(None, 0).await;
    let before = listed["next"].as_i64().unwrap();
    let t = hour();
    let (status, body) = api
        .send(
            reqwest::Method::POST,
            "/api/v1/bookings",
            &api.admin,
            Some(json!({"model": "v100", "units": 2, "start": t, "end": t + TimeDelta::days(1), "user": "carol", "override": true})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_i64().unwrap();
    assert_eq!(body["slots"], json!([0, 1]), "{body}");
    let (changes, mut next) = api.follow(before, 1).await;
    let kinds: Vec<&str> = changes
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created"]);
    let created = changes_logged(&pool, id).await;
    for (round, (slots, wire, moved)) in [
        ("{0,2}", json!([0, 2]), true),
        ("{0,2}", json!([0, 2]), false),
        ("{1,2}", json!([1, 2]), true),
    ]
    .into_iter()
    .enumerate()
    {
        let before = changes_logged(&pool, id).await;
        sqlx::query("UPDATE booking SET slots = $2::int[], updated_at = now() WHERE id = $1")
            .bind(id)
            .bind(slots)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(
            changes_logged(&pool, id).await - before,
            i64::from(moved),
            "round {round}: {slots}"
        );
        if moved {
            let (changes, after) = api.follow(next, 1).await;
            let seen: Vec<(&str, &Value)> = changes
                .iter()
                .map(|c| (c["kind"].as_str().unwrap(), &c["booking"]["slots"]))
                .collect();
            assert_eq!(seen, [("updated", &wire)], "round {round}");
            next = after;
        }
    }
    assert_eq!(changes_logged(&pool, id).await, created + 2);
}

/// The change-log rows of booking `id`, read from the table (the trigger writes them
/// in the booking's own transaction).
async fn changes_logged(pool: &PgPool, id: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM booking_change WHERE booking_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn only_services_and_admins_follow_and_bad_input_is_refused(pool: PgPool) {
    let api = Api::start(pool, Arc::new(SystemClock)).await;
    let user = api.token("alice");
    let r = api
        .send(reqwest::Method::GET, "/api/v1/booking-changes", &user, None)
        .await;
    assert_eq!(r.0, 403, "{}", r.1);
    let (_, listed) = api.changes(None, 0).await;
    let next = listed["next"].as_i64().unwrap();
    assert_eq!(api.changes(Some(next), 31).await.0, 422);
    for bad in ["after=x", "wait=-1", "after=1&nope=2"] {
        let r = api
            .send(
                reqwest::Method::GET,
                &format!("/api/v1/booking-changes?{bad}"),
                &api.service,
                None,
            )
            .await;
        assert_eq!(r.0, 400, "{bad}: {}", r.1);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_resume_point_older_than_retention_is_gone_and_a_relist_recovers(pool: PgPool) {
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let (_, listed) = api.changes(None, 0).await;
    let old = listed["next"].as_i64().unwrap();
    let t = hour();
    let id = api.book("alice", "a100", t, t + TimeDelta::days(1)).await;
    api.follow(old, 1).await;

    // Retention passes over the change.
    let deleted = gpu_booking_api::store::changes::prune(&pool, Utc::now() + TimeDelta::hours(1))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let (status, body) = api.changes(Some(old), 0).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["error"], "resume_point_gone");
    assert!(body["pruned_through"].as_i64().unwrap() > old);
    // A position this log never gave is gone too.
    assert_eq!(api.changes(Some(i64::MAX), 0).await.0, 410);

    // The follower lists again and goes on from there.
    let (_, listed) = api.changes(None, 0).await;
    assert_eq!(listed["changes"][0]["booking"]["id"], id);
    let next = listed["next"].as_i64().unwrap();
    let r = api
        .patch(id, &api.admin, json!({"end": t + TimeDelta::days(2)}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    let (changes, _) = api.follow(next, 1).await;
    assert_eq!(changes[0]["kind"], "moved");
    assert_eq!(changes[0]["booking"]["id"], id);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_long_poll_wakes_on_a_change(pool: PgPool) {
    let api = Arc::new(Api::start(pool, Arc::new(SystemClock)).await);
    let (_, listed) = api.changes(None, 0).await;
    let next = listed["next"].as_i64().unwrap();
    let poll = {
        let api = api.clone();
        tokio::spawn(async move { api.changes(Some(next), 30).await })
    };
    // Let the poll wait first (if it has not, it finds the change at once: the
    // assertion below holds either way).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let t = hour();
    let id = api.book("alice", "a100", t, t + TimeDelta::days(1)).await;
    let (status, body) = poll.await.unwrap();
    assert_eq!(status, 200, "{body}");
    // Had nothing woken it, it would have answered empty after 30 s.
    assert_eq!(body["changes"][0]["booking"]["id"], id, "{body}");
}

/// Transaction ids are the Postgres server's, not the database's: a stream that
/// waited for every transaction on the server older than a change would let one long
/// write in another database hold back every booking change for as long as it ran.
/// It passes them (migration 20261203000100); a transaction of this database still
/// holds back the changes after it (when it commits, its own come first).
#[sqlx::test(migrations = "../migrations")]
async fn a_long_transaction_elsewhere_on_the_server_does_not_hold_the_stream_back(pool: PgPool) {
    use sqlx::{Connection, PgConnection};
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let (_, listed) = api.changes(None, 0).await;
    let from = listed["next"].as_i64().unwrap();
    // The database the tests' databases are made from, with a transaction that holds
    // an id and stays open until the end.
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut other = PgConnection::connect(&url).await.unwrap();
    let database = "SELECT current_database()::text";
    let there: String = sqlx::query_scalar(database)
        .fetch_one(&mut other)
        .await
        .unwrap();
    let here: String = sqlx::query_scalar(database).fetch_one(&pool).await.unwrap();
    assert_ne!(there, here);
    let mut elsewhere = other.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *elsewhere)
        .await
        .unwrap();

    let t = hour();
    let first = api.book("alice", "a100", t, t + TimeDelta::days(1)).await;
    let (served, after) = changes_within(&api, from, std::time::Duration::from_secs(20)).await;
    assert_eq!(
        served.first().map(|c| c["booking"]["id"].clone()),
        Some(json!(first)),
        "a booking change waited for a transaction of another database"
    );

    // The same in this database: held back until it ends.
    let mut here_tx = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *here_tx)
        .await
        .unwrap();
    let later = t + TimeDelta::days(2);
    let second = api
        .book("bob", "a100", later, later + TimeDelta::days(1))
        .await;
    let (held, after) = changes_within(&api, after, std::time::Duration::from_secs(2)).await;
    assert!(
        held.is_empty(),
        "served past a transaction in flight: {held:?}"
    );
    here_tx.rollback().await.unwrap();
    let (served, _) = changes_within(&api, after, std::time::Duration::from_secs(20)).await;
    assert_eq!(
        served.first().map(|c| c["booking"]["id"].clone()),
        Some(json!(second))
    );
    elsewhere.rollback().await.unwrap();
}

/// A transaction of the booking database that stays open holds back every change
/// made after it began, and the stream says by how much (`behind_ms`, which the
/// webhook's replica counts as staleness): nothing while no change waits behind it,
/// at least the time a held change has waited, and nothing again once it ends.
#[sqlx::test(migrations = "../migrations")]
async fn the_stream_says_how_far_a_long_transaction_holds_it_back(pool: PgPool) {
    const HELD: std::time::Duration = std::time::Duration::from_millis(1200);
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let (_, listed) = api.changes(None, 0).await;
    assert_eq!(listed["behind_ms"], json!(0), "{listed}");
    let from = listed["next"].as_i64().unwrap();
    let mut open = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *open)
        .await
        .unwrap();
    let (_, idle) = api.changes(Some(from), 0).await;
    assert_eq!(
        idle["behind_ms"],
        json!(0),
        "a transaction with no change behind it holds nothing back: {idle}"
    );

    let t = hour();
    let id = api.book("bob", "a100", t, t + TimeDelta::days(1)).await;
    tokio::time::sleep(HELD).await;
    let (status, held) = api.changes(Some(from), 0).await;
    assert_eq!(status, 200, "{held}");
    assert_eq!(
        held["changes"],
        json!([]),
        "served past a transaction in flight"
    );
    assert_eq!(held["more"], json!(false));
    let behind = held["behind_ms"].as_u64().unwrap();
    // The change's transaction began before `book` returned, the read after the sleep.
    assert!(
        behind >= HELD.as_millis() as u64,
        "the change waited {HELD:?}, the stream says {behind} ms"
    );
    // Meanwhile a long poll answers at its first wake (within about a second), so
    // that a follower sees the lag grow, not after the 30 s it asked to wait.
    let (status, polled) = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        api.changes(Some(from), 30),
    )
    .await
    .expect("a long poll did not answer while the stream was held back");
    assert_eq!(status, 200, "{polled}");
    assert_eq!(polled["changes"], json!([]));
    assert!(polled["behind_ms"].as_u64().unwrap() >= behind, "{polled}");

    open.rollback().await.unwrap();
    let (status, served) = api.changes(Some(from), 0).await;
    assert_eq!(status, 200, "{served}");
    assert_eq!(served["changes"][0]["booking"]["id"], json!(id), "{served}");
    assert_eq!(served["behind_ms"], json!(0), "{served}");
}

/// An answer holds at most 500 transactions' changes and says when more wait
/// (`more`), so that a follower does not take itself for current in the middle of
/// a backlog.
#[sqlx::test(migrations = "../migrations")]
async fn a_full_answer_says_more_changes_wait(pool: PgPool) {
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let t = hour();
    let id = api.book("carol", "a100", t, t + TimeDelta::days(1)).await;
    let (_, listed) = api.changes(None, 0).await;
    let from = listed["next"].as_i64().unwrap();
    // 501 transactions, each with one change of the booking.
    for _ in 0..501 {
        sqlx::query("INSERT INTO booking_change (booking_id, kind) VALUES ($1, 'moved')")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
    let (status, first) = api.changes(Some(from), 0).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["changes"].as_array().unwrap().len(), 500);
    assert_eq!(first["more"], json!(true));
    let (_, rest) = api.changes(first["next"].as_i64(), 0).await;
    assert_eq!(rest["changes"].as_array().unwrap().len(), 1, "{rest}");
    assert_eq!(rest["more"], json!(false), "{rest}");
}

/// The changes served after `after` within `limit` (polls of a second, stopping at
/// the first answer with changes), and the position to go on from.
async fn changes_within(
    api: &Api,
    mut after: i64,
    limit: std::time::Duration,
) -> (Vec<Value>, i64) {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        let (status, body) = api.changes(Some(after), 1).await;
        assert_eq!(status, 200, "{body}");
        after = body["next"].as_i64().unwrap();
        let changes = body["changes"].as_array().unwrap().clone();
        if !changes.is_empty() {
            return (changes, after);
        }
    }
    (Vec::new(), after)
}

/// The watch behind long polls wakes a waiter when a change is committed, with no
/// recheck: a waiter asked to wait an hour returns on the change (the guard only
/// turns a missing wake into a failure instead of a hang).
#[sqlx::test(migrations = "../migrations")]
async fn the_watch_wakes_a_waiter_on_a_commit(pool: PgPool) {
    use gpu_booking_api::store::changes::ChangeFeed;
    const AN_HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
    const GUARD: std::time::Duration = std::time::Duration::from_secs(60);
    let api = Api::start(pool.clone(), Arc::new(SystemClock)).await;
    let feed = ChangeFeed::default();
    let mut waiter = feed.waiter(&pool).expect("a place among the waiters");
    // The watch's first look wakes once (it cannot know what was missed before it).
    tokio::time::timeout(GUARD, waiter.changed(AN_HOUR))
        .await
        .expect("the first look wakes");
    let t = hour();
    api.book("alice", "a100", t, t + TimeDelta::days(1)).await;
    tokio::time::timeout(GUARD, waiter.changed(AN_HOUR))
        .await
        .expect("a committed change wakes the waiter");
}

/// A server shutting down answers its waiting long polls at once (with what there
/// is), so that a graceful shutdown or a rolling update does not wait out the
/// followers' waits; polls that come after answer without waiting. The guard only
/// turns a poll that keeps waiting into a failure instead of a 30-second wait.
#[sqlx::test(migrations = "../migrations")]
async fn a_server_shutting_down_answers_its_long_polls_at_once(pool: PgPool) {
    const GUARD: std::time::Duration = std::time::Duration::from_secs(20);
    let api = Arc::new(Api::start(pool, Arc::new(SystemClock)).await);
    let (_, listed) = api.changes(None, 0).await;
    let next = listed["next"].as_i64().unwrap();
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move { api.changes(Some(next), 30).await })
    };
    // Once the poll waits (it holds a place among the waiters: the watch runs).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    api.api.changes.close();
    let (status, body) = tokio::time::timeout(GUARD, waiting)
        .await
        .expect("the waiting poll answered when the server began to shut down")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changes"], json!([]));
    // The position may move on (it follows the database's transactions, other
    // tests' included), never back.
    assert!(body["next"].as_i64().unwrap() >= next, "{body}");
    let (status, body) = tokio::time::timeout(GUARD, api.changes(Some(next), 30))
        .await
        .expect("a poll after the shutdown began answered without waiting");
    assert_eq!(status, 200, "{body}");
}

/// Many writers commit out of order (each sleeps inside its transaction after its
/// change took a `seq`; some roll back) while a follower polls: it must see every
/// committed change exactly once, and none that rolled back.
#[sqlx::test(migrations = "../migrations")]
async fn a_follower_sees_every_change_exactly_once_under_concurrent_writers(pool: PgPool) {
    const WRITERS: usize = 12;
    const ROUNDS: usize = 25;
    let api = Arc::new(Api::start(pool.clone(), Arc::new(SystemClock)).await);
    let (_, listed) = api.changes(None, 0).await;
    let start = listed["next"].as_i64().unwrap();
    // One model per writer, so that writers never wait on one another's locks.
    let t = hour();
    let mut ids = Vec::new();
    for w in 0..WRITERS {
        let model = format!("m{w}");
        let r = api
            .send(
                reqwest::Method::PUT,
                &format!("/api/v1/models/{model}"),
                &api.admin,
                Some(json!({"units": 1})),
            )
            .await;
        assert_eq!(r.0, 200);
        ids.push(
            api.book(&format!("u{w}"), &model, t, t + TimeDelta::days(1))
                .await,
        );
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = {
        let (api, done) = (api.clone(), done.clone());
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            let mut after = start;
            let mut idle_after_done = 0;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (status, body) = api.changes(Some(after), 1).await;
                assert_eq!(status, 200, "{body}");
                let batch = body["changes"].as_array().unwrap();
                seqs.extend(batch.iter().map(|c| c["seq"].as_i64().unwrap()));
                after = body["next"].as_i64().unwrap();
                if finished && batch.is_empty() {
                    idle_after_done += 1;
                    if idle_after_done >= 3 {
                        return seqs;
                    }
                }
            }
        })
    };
    // A naive follower beside it, by `seq` alone: it shows that the hazard was real.
    let naive = {
        let (pool, done) = (pool.clone(), done.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut after = 0i64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let batch: Vec<i64> = sqlx::query_scalar(
                    "SELECT seq FROM booking_change WHERE seq > $1 ORDER BY seq",
                )
                .bind(after)
                .fetch_all(&pool)
                .await
                .unwrap();
                if let Some(last) = batch.last() {
                    after = *last;
                }
                seen.extend(batch);
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            seen
        })
    };
    let mut writers = Vec::new();
    for (w, id) in ids.iter().copied().enumerate() {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let pause = |k: usize| ((w * 7 + round * 13 + k * 5) % 20) as f64 / 1000.0;
                let mut tx = pool.begin().await.unwrap();
                if round % 2 == 0 {
                    // The transaction id first, the change's seq later: id order
                    // and seq order differ too.
                    sqlx::query("SELECT pg_current_xact_id(), pg_sleep($1)")
                        .bind(pause(1))
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                sqlx::query(
                    "UPDATE booking SET end_at = end_at + interval '1 second',
                       booked_end_at = booked_end_at + interval '1 second' WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(pause(2))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                if round % 5 == 4 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = follower.await.unwrap();
    let committed: Vec<i64> = sqlx::query_scalar(
        "SELECT seq FROM booking_change WHERE booking_id = ANY($1) ORDER BY seq",
    )
    .bind(&ids)
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut counts = BTreeMap::<i64, usize>::new();
    for s in &seen {
        *counts.entry(*s).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "changes served twice: {twice:?}");
    // The creates came after `start` too: everything committed must have been seen.
    let seen_set: Vec<i64> = counts.keys().copied().collect();
    let missed: Vec<_> = committed
        .iter()
        .filter(|s| !counts.contains_key(s))
        .collect();
    assert!(missed.is_empty(), "changes never served: {missed:?}");
    assert_eq!(
        committed.len(),
        WRITERS + WRITERS * ROUNDS * 4 / 5,
        "one change per create and per committed update"
    );
    assert!(
        seen_set.iter().all(|s| committed.contains(s)),
        "a rolled back change was served"
    );
    // The hazard was real: a follower by seq alone missed changes that committed
    // after a later seq had been read.
    let naive = naive.await.unwrap();
    let naive_missed = committed
        .iter()
        .filter(|s| **s > ids.len() as i64 && !naive.contains(s))
        .count();
    println!(
        "naive follower missed {naive_missed} of {} changes",
        committed.len()
    );
    assert!(
        naive_missed > 0,
        "the writers never committed out of seq order"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_running_booking_is_extended_and_shortened_within_the_rules(pool: PgPool) {
    let t0 = hour() + TimeDelta::days(1);
    let clock = ManualClock::new(t0 - TimeDelta::hours(1));
    let api = Api::start(pool.clone(), Arc::new(clock.clone())).await;
    let alice = api.token("alice");
    let id = api.book("alice", "a100", t0, t0 + TimeDelta::days(2)).await;
    // Bob's booking follows alice's on the model's only unit.
    let bob = api
        .book(
            "bob",
            "a100",
            t0 + TimeDelta::days(3),
            t0 + TimeDelta::days(4),
        )
        .await;
    clock.set(t0 + TimeDelta::hours(5));

    // Extended up to bob's start (half-open windows), not one second more.
    let r = api
        .patch(
            id,
            &alice,
            json!({"end": t0 + TimeDelta::days(3) + TimeDelta::seconds(1)}),
        )
        .await;
    assert_eq!(
        (r.0, r.1["error"].as_str()),
        (409, Some("capacity")),
        "{}",
        r.1
    );
    let r = api
        .patch(id, &alice, json!({"end": t0 + TimeDelta::days(3)}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["status"], "active");
    assert_eq!(
        r.1["end"]
            .as_str()
            .map(|s| s.parse::<DateTime<Utc>>().unwrap()),
        Some(t0 + TimeDelta::days(3))
    );
    // Shortened (below the minimum is fine once started, as ending early is).
    let r = api
        .patch(id, &alice, json!({"end": t0 + TimeDelta::hours(6)}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    // Refusals change nothing.
    for (body, status, code) in [
        (json!({"end": t0 + TimeDelta::hours(5)}), 422, "end_in_past"),
        (
            json!({"end": t0 + TimeDelta::days(15)}),
            422,
            "duration_too_long",
        ),
        (
            json!({"start": t0 + TimeDelta::hours(1), "end": t0 + TimeDelta::days(1)}),
            409,
            "booking_started",
        ),
        (
            json!({"end": t0 + TimeDelta::days(1), "override": true}),
            403,
            "forbidden",
        ),
    ] {
        let r = api.patch(id, &alice, body.clone()).await;
        assert_eq!(
            (r.0, r.1["error"].as_str()),
            (status, Some(code)),
            "{body}: {}",
            r.1
        );
    }
    for bad in [
        json!({}),
        json!({"end": "soon"}),
        json!({"end": t0, "extra": 1}),
    ] {
        assert_eq!(api.patch(id, &alice, bad.clone()).await.0, 400, "{bad}");
    }
    let (_, now) = api
        .send(
            reqwest::Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &alice,
            None,
        )
        .await;
    assert_eq!(
        now["end"]
            .as_str()
            .map(|s| s.parse::<DateTime<Utc>>().unwrap()),
        Some(t0 + TimeDelta::hours(6))
    );
    // Another user's booking is not there for alice; an admin may change it.
    assert_eq!(
        api.patch(bob, &alice, json!({"end": t0 + TimeDelta::days(5)}))
            .await
            .0,
        404
    );
    let r = api
        .patch(bob, &api.admin, json!({"end": t0 + TimeDelta::days(5)}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    // The cooldown counts from the new end: alice's booking may not reach within
    // 14 days of bob's... of her own next one. Her planned one (an admin's) is
    // 16 days after her current end.
    let next = api
        .book(
            "alice",
            "t4",
            t0 + TimeDelta::days(16),
            t0 + TimeDelta::days(17),
        )
        .await;
    let r = api
        .patch(
            id,
            &alice,
            json!({"end": t0 + TimeDelta::days(2) + TimeDelta::hours(6)}),
        )
        .await;
    assert_eq!(
        (r.0, r.1["error"].as_str()),
        (409, Some("cooldown")),
        "{}",
        r.1
    );
    // A planned booking may move its start (the rules of a new booking hold).
    let r = api
        .patch(
            next,
            &alice,
            json!({"start": t0 + TimeDelta::days(17), "end": t0 + TimeDelta::days(18)}),
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    // An ended booking cannot change.
    let r = api
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/bookings/{id}"),
            &alice,
            None,
        )
        .await;
    assert_eq!(r.0, 200);
    let r = api
        .patch(id, &alice, json!({"end": t0 + TimeDelta::days(1)}))
        .await;
    assert_eq!(
        (r.0, r.1["error"].as_str()),
        (409, Some("not_changeable")),
        "{}",
        r.1
    );
    // Each change is in the audit log.
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_event WHERE booking_id = $1 AND action LIKE 'booking.%' ORDER BY id",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        actions,
        [
            "booking.create_override",
            "booking.extend",
            "booking.shorten",
            "booking.end_early"
        ]
    );
}

/// A `PATCH` that asks for the window a booking has changes nothing: 200 with the
/// booking as it was, no audit row, no booking change, however often it is sent.
#[sqlx::test(migrations = "../migrations")]
async fn a_change_to_the_same_window_writes_nothing(pool: PgPool) {
    let t0 = hour() + TimeDelta::days(1);
    let clock = ManualClock::new(t0 - TimeDelta::hours(1));
    let api = Api::start(pool.clone(), Arc::new(clock.clone())).await;
    let alice = api.token("alice");
    let id = api.book("alice", "a100", t0, t0 + TimeDelta::days(2)).await;
    let (_, before) = api
        .send(
            reqwest::Method::GET,
            &format!("/api/v1/bookings/{id}"),
            &alice,
            None,
        )
        .await;
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let audit = "SELECT count(*) FROM audit_event WHERE booking_id = $1";
    let (audited, changed) = (count(audit).await, changes_logged(&pool, id).await);
    let updated_at = "SELECT extract(epoch FROM updated_at)::bigint FROM booking WHERE id = $1";
    let stamp = count(updated_at).await;
    clock.set(t0 + TimeDelta::hours(2));
    for body in [
        json!({"end": t0 + TimeDelta::days(2)}),
        json!({"start": t0, "end": t0 + TimeDelta::days(2)}),
    ] {
        let (status, after) = api.patch(id, &alice, body.clone()).await;
        assert_eq!(status, 200, "{body}: {after}");
        for field in [
            "id",
            "start",
            "end",
            "booked_end",
            "slots",
            "units",
            "created_at",
        ] {
            assert_eq!(after[field], before[field], "{field}");
        }
        assert_eq!(after["status"], "active");
    }
    assert_eq!(count(audit).await, audited);
    assert_eq!(changes_logged(&pool, id).await, changed);
    assert_eq!(count(updated_at).await, stamp);
    // Another user's booking is still not there, change or no change.
    assert_eq!(
        api.patch(
            id,
            &api.token("bob"),
            json!({"end": t0 + TimeDelta::days(2)})
        )
        .await
        .0,
        404
    );
}

/// Shortening a running booking that is still within the cooldown of the user's
/// next booking (an admin's, placed closer than the rules allow) is refused in the
/// words of that bound: the end it must keep to, not "your last booking ended".
#[sqlx::test(migrations = "../migrations")]
async fn a_change_too_close_to_a_later_booking_names_the_end_it_must_keep(pool: PgPool) {
    let t0 = hour() + TimeDelta::days(1);
    let clock = ManualClock::new(t0 - TimeDelta::hours(1));
    let api = Api::start(pool.clone(), Arc::new(clock.clone())).await;
    let alice = api.token("alice");
    let id = api.book("alice", "a100", t0, t0 + TimeDelta::days(3)).await;
    let next_start = t0 + TimeDelta::days(16);
    api.book("alice", "t4", next_start, next_start + TimeDelta::days(1))
        .await;
    clock.set(t0 + TimeDelta::hours(1));
    // Shorter, but not short enough: it must end by t0 + 2 days.
    let r = api
        .patch(
            id,
            &alice,
            json!({"end": t0 + TimeDelta::days(2) + TimeDelta::hours(12)}),
        )
        .await;
    assert_eq!(
        (r.0, r.1["error"].as_str()),
        (409, Some("cooldown")),
        "{}",
        r.1
    );
    let message = r.1["message"].as_str().unwrap();
    let rfc = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert_eq!(
        message,
        format!(
            "Your next booking starts {}; bookings keep a cooldown of 14 days between them, \
             so this one must end by {}.",
            rfc(next_start),
            rfc(next_start - TimeDelta::days(14))
        )
    );
    // A started booking keeps its start, so no other start is offered.
    assert!(r.1.get("earliest_start").is_none(), "{}", r.1);
    // Short enough: accepted.
    let r = api
        .patch(id, &alice, json!({"end": t0 + TimeDelta::days(2)}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
}

/// Concurrent extensions of bookings on a 2-unit model: whatever wins, no instant
/// holds more than 2 bookings, no unit two at once, and nothing answers 5xx.
#[sqlx::test(migrations = "../migrations")]
async fn concurrent_extensions_never_breach_capacity(pool: PgPool) {
    let t0 = hour();
    let api = Arc::new(Api::start(pool.clone(), Arc::new(SystemClock)).await);
    let r = api
        .send(
            reqwest::Method::PUT,
            "/api/v1/models/pair",
            &api.admin,
            Some(json!({"units": 2})),
        )
        .await;
    assert_eq!(r.0, 200);
    // Three waves of two one-day bookings, a day apart: every extension into the
    // gap competes with the other wave's bookings and with the same wave's.
    let mut bookings = Vec::new();
    for wave in 0..3i64 {
        for k in 0..2 {
            let user = format!("u{wave}{k}");
            let start = t0 + TimeDelta::days(2 * wave);
            let id = api
                .book(&user, "pair", start, start + TimeDelta::days(1))
                .await;
            bookings.push((id, api.token(&user), start));
        }
    }
    let mut tasks = Vec::new();
    for (i, (id, token, start)) in bookings.into_iter().enumerate() {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for round in 0..12i64 {
                // Between 1 and 3.5 days long: into the gap or over the next wave.
                let hours = 24 + ((i as i64 * 11 + round * 17) % 61);
                let (status, _) = api
                    .patch(id, &token, json!({"end": start + TimeDelta::hours(hours)}))
                    .await;
                answers.push(status);
            }
            answers
        }));
    }
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        for status in t.await.unwrap() {
            match status {
                200 => ok += 1,
                409 => refused += 1,
                other => panic!("an extension answered {other}"),
            }
        }
    }
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
    let overbooked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
           SELECT b.id FROM booking b JOIN booking o
             ON o.model = b.model AND o.cancelled_at IS NULL AND o.period @> b.start_at
           WHERE b.cancelled_at IS NULL AND b.model = 'pair' GROUP BY b.id HAVING count(*) > 2) x",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(overbooked, 0, "an instant with more bookings than units");
    let slot_clash: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM booking a JOIN booking b
           ON a.model = b.model AND a.slot = b.slot AND a.id < b.id AND a.period && b.period
         WHERE a.cancelled_at IS NULL AND b.cancelled_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(slot_clash, 0, "two bookings on one unit at once");
}
