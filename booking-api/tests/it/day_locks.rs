//! Creates lock only what conflicts (migration 20261125000200): a
//! transaction holds one create's locks open while another create runs. Creates on
//! days of the model that the held window does not touch complete; a create whose
//! window shares a day with it, or by the same user, waits until it ends.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use gpu_booking_api::testing::TestApi;
use serde_json::json;
use sqlx::{Connection, PgConnection, PgPool};

/// Midnight UTC, ten days from now: every window below is planned.
fn day0() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::days(1)).unwrap() + TimeDelta::days(10)
}

fn day(n: i64) -> DateTime<Utc> {
    day0() + TimeDelta::days(n)
}

struct Lab {
    api: TestApi,
    http: reqwest::Client,
    pool: PgPool,
}

impl Lab {
    async fn new(pool: PgPool) -> Lab {
        let api = TestApi::start(pool.clone()).await.unwrap();
        let http = reqwest::Client::new();
        let admin = api.token("admin@example.com", Some("admin"));
        let r = http
            .put(format!("{}/api/v1/models/a100", api.url))
            .bearer_auth(&admin)
            .json(&json!({"units": 4, "patterns": ["*A100*"], "gpumem_mib": 40960}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        Lab { api, http, pool }
    }

    /// A connection inside a transaction holding a create's locks for `user` over
    /// `[start, end)`, as `booking_lock_and_read` takes them.
    async fn hold(&self, user: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> PgConnection {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options())
            .await
            .unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        // The user's bookings read from the start less the default cooldown.
        sqlx::query(
            "SELECT * FROM booking_lock_and_read($1, 'a100', $2, $3, $2 - interval '14 days')",
        )
        .bind(user)
        .bind(start)
        .bind(end)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        conn
    }

    /// A create over HTTP: its status.
    async fn create(&self, user: &str, start: DateTime<Utc>, end: DateTime<Utc>) -> u16 {
        create(&self.http, &self.api, user, start, end).await
    }
}

async fn create(
    http: &reqwest::Client,
    api: &TestApi,
    user: &str,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> u16 {
    http.post(format!("{}/api/v1/bookings", api.url))
        .bearer_auth(api.token(user, None))
        .json(&json!({"model": "a100", "start": start, "end": end}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Completes while the locks are held; a create that waited would hang, which the
/// timeout turns into a failure (no assertion on how long anything took).
async fn completes<F: std::future::Future<Output = u16>>(f: F) -> u16 {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the create waited on locks it does not conflict with")
}

/// Waits until a backend of this test's database waits for an advisory lock: a
/// create that blocks on the held locks.
async fn someone_waits_for_an_advisory_lock(pool: &PgPool) {
    let waiting = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            if n > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the create never waited for the held locks");
}

#[sqlx::test(migrations = "../migrations")]
async fn creates_on_days_the_held_window_does_not_touch_do_not_wait(pool: PgPool) {
    let lab = Lab::new(pool).await;
    // Held: days 2, 3 and 4 (ends at midnight: day 5 is not touched).
    let holder = lab.hold("holder", day(2), day(5)).await;
    // Before it, ending at midnight of its first day; after it, from the midnight it
    // ends at; far later; and a short one on day 0.
    assert_eq!(completes(lab.create("a", day(0), day(2))).await, 201);
    assert_eq!(completes(lab.create("b", day(5), day(7))).await, 201);
    assert_eq!(completes(lab.create("c", day(40), day(45))).await, 201);
    assert_eq!(
        completes(lab.create("d", day(1), day(1) + TimeDelta::hours(24))).await,
        201
    );
    // Cancelling takes no day: it completes too.
    let id: i64 = sqlx::query_scalar("SELECT id FROM booking WHERE user_name = 'c'")
        .fetch_one(&lab.pool)
        .await
        .unwrap();
    let r = completes(async {
        lab.http
            .delete(format!("{}/api/v1/bookings/{id}", lab.api.url))
            .bearer_auth(lab.api.token("c", None))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
    .await;
    assert_eq!(r, 200);
    drop(holder);
}

/// Each case: a window that shares at least one day with the held one, or the
/// held user's, waits until the holder ends, then completes.
#[sqlx::test(migrations = "../migrations")]
async fn creates_that_share_a_day_or_the_user_wait_for_the_holder(pool: PgPool) {
    let lab = Lab::new(pool).await;
    let cases = [
        // Overlaps the held window's last day by one hour.
        ("e", day(4) + TimeDelta::hours(23), day(6)),
        // Ends on day 2 before the held window starts (at noon): no instant in
        // common, but the same day (locks are per day, not per instant).
        ("f", day(1), day(2) + TimeDelta::hours(6)),
        // Inside it.
        ("g", day(3), day(4)),
        // The held user, on days far away: the user's lock.
        ("holder", day(60), day(61)),
    ];
    for (user, start, end) in cases {
        let mut holder = lab
            .hold("holder", day(2) + TimeDelta::hours(12), day(5))
            .await;
        let (http, url_api) = (lab.http.clone(), &lab.api);
        let waiter = async { create(&http, url_api, user, start, end).await };
        let check = async {
            someone_waits_for_an_advisory_lock(&lab.pool).await;
            // The holder ends (rolls back): the waiter goes on.
            sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
        };
        let (status, ()) = tokio::join!(waiter, check);
        assert_eq!(status, 201, "{user}: created once the holder ended");
    }
}

/// A whole-model lock (a change of a booking's window, a waitlist pass, new units)
/// waits for the creates on the model's days, and they for it.
#[sqlx::test(migrations = "../migrations")]
async fn a_change_of_units_waits_for_a_create_holding_days(pool: PgPool) {
    let lab = Lab::new(pool).await;
    let mut holder = lab.hold("holder", day(2), day(5)).await;
    let admin = lab.api.token("admin@example.com", Some("admin"));
    let put = async {
        lab.http
            .put(format!("{}/api/v1/models/a100", lab.api.url))
            .bearer_auth(&admin)
            .json(&json!({"units": 2, "patterns": ["*A100*"], "gpumem_mib": 40960}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let check = async {
        someone_waits_for_an_advisory_lock(&lab.pool).await;
        sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    };
    let (status, ()) = tokio::join!(put, check);
    assert_eq!(status, 200);
}
