//! The backup and restore of docs/deploy.md ("Backups and restore"), on the real
//! Postgres: a database with bookings dumped with `pg_dump --format=custom` (what the
//! chart's backup CronJob writes), restored with `pg_restore --no-owner` into a new,
//! empty database, and the API started on it (migrating first, as it does) serves the
//! same bookings and models, and takes new bookings under the same rules.
//!
//! Needs `pg_dump`, `pg_restore` and `psql` of the server's major version or newer on
//! the PATH. The database it creates is dropped when the test ends, passed or not.

use std::process::Command;

use chrono::{DurationRound, TimeDelta, Utc};
use gpu_booking_api::testing::TestApi;
use serde_json::{json, Value};
use sqlx::PgPool;

/// A database this test created, dropped (with its connections) when the guard goes.
struct ScratchDatabase {
    server: String,
    name: String,
}

impl ScratchDatabase {
    fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let _ = psql(
            &format!("{}/postgres", self.server),
            &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name),
        );
    }
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn psql(url: &str, sql: &str) -> String {
    run(Command::new("psql")
        .args(["--no-psqlrc", "--quiet", "--tuples-only", "--no-align"])
        .args([
            "--set",
            "ON_ERROR_STOP=1",
            "--dbname",
            url,
            "--command",
            sql,
        ]))
}

/// The server part of the test database's URL (`postgres://user@host:port`).
fn server_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("DATABASE_URL is a URL");
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    format!("{scheme}://{authority}")
}

async fn get(http: &reqwest::Client, api: &TestApi, path: &str, token: &str) -> Value {
    let response = http
        .get(format!("{}{path}", api.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "GET {path}");
    response.json().await.unwrap()
}

async fn book(http: &reqwest::Client, api: &TestApi, user: &str, days_ahead: i64) -> u16 {
    let start =
        Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap() + TimeDelta::days(days_ahead);
    http.post(format!("{}/api/v1/bookings", api.url))
        .bearer_auth(api.token(user, None))
        .json(&json!({"model": "a100", "units": 1, "start": start, "end": start + TimeDelta::days(2)}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_dump_restored_into_a_new_database_serves_the_same_bookings(pool: PgPool) {
    let http = reqwest::Client::new();
    let source = TestApi::start(pool.clone()).await.unwrap();
    let admin = source.token("admin@example.com", Some("admin"));
    let put = http
        .put(format!("{}/api/v1/models/a100", source.url))
        .bearer_auth(&admin)
        .json(&json!({"units": 2, "patterns": ["*A100*"], "gpumem_mib": 40960}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    for (user, days) in [("alice@example.com", 1), ("bob@example.com", 3)] {
        assert_eq!(book(&http, &source, user, days).await, 201, "{user}");
    }
    let bookings = get(&http, &source, "/api/v1/bookings?all=true", &admin).await;
    assert_eq!(bookings.as_array().map(Vec::len), Some(2), "{bookings}");
    let models = get(&http, &source, "/api/v1/models", &admin).await;

    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL names the test server");
    let server = server_of(&url);
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("gpu_booking.dump");
    run(Command::new("pg_dump")
        .args(["--format=custom", "--no-owner", "--dbname"])
        .arg(format!("{server}/{name}"))
        .arg("--file")
        .arg(&dump));

    let restored = ScratchDatabase {
        server: server.clone(),
        name: format!(
            "gpu_booking_restore_{}_{}",
            std::process::id(),
            Utc::now().timestamp_nanos_opt().unwrap_or_default()
        ),
    };
    psql(
        &format!("{server}/postgres"),
        &format!("CREATE DATABASE \"{}\"", restored.name),
    );
    run(Command::new("pg_restore")
        .args(["--no-owner", "--exit-on-error", "--dbname"])
        .arg(restored.url())
        .arg(&dump));

    let restored_pool = PgPool::connect(&restored.url()).await.unwrap();
    // What the API does before it serves: nothing is left to apply.
    gpu_booking_api::server::migrate(&restored_pool)
        .await
        .expect("the restored schema is the migrated one");
    let target = TestApi::start(restored_pool.clone()).await.unwrap();
    let admin = target.token("admin@example.com", Some("admin"));
    assert_eq!(
        get(&http, &target, "/api/v1/bookings?all=true", &admin).await,
        bookings
    );
    assert_eq!(get(&http, &target, "/api/v1/models", &admin).await, models);
    // The rules hold on the restored data: alice's planned booking is her one, and
    // a new user books the next free window.
    let second = book(&http, &target, "alice@example.com", 5).await;
    assert!(
        matches!(second, 409 | 422),
        "a second planned booking of alice's is refused, not {second}"
    );
    assert_eq!(book(&http, &target, "carol@example.com", 1).await, 201);
    restored_pool.close().await;
}
