//! Models declared in the chart's values (`--models-file`), reconciled at start-up:
//! the values' version wins with `values`, only seeds with `api`; models the file does
//! not name are never touched; every write is audited. Real Postgres (`DATABASE_URL`).

use chrono::Utc;
use gpu_booking_api::declared;
use gpu_booking_api::store::models::{self, ModelSpec};
use gpu_booking_core::declared_models::{parse, Authority};
use sqlx::PgPool;

const FILE: &str = r#"[
    {"name": "a100", "units": 2, "patterns": ["*A100*"], "gpumemMib": 40960},
    {"name": "a6000", "units": 4, "patterns": ["NVIDIA-RTX-A6000"]}
]"#;

async fn units(pool: &PgPool, name: &str) -> Option<i32> {
    models::get(pool, name).await.unwrap().map(|m| m.units)
}

async fn admin_sets(pool: &PgPool, name: &str, units: i32) {
    let m = models::get(pool, name).await.unwrap().unwrap();
    models::upsert(
        pool,
        ModelSpec {
            name,
            units,
            patterns: &m.patterns,
            resource: m.resource.as_deref(),
            gpumem_mib: m.gpumem_mib,
            position: Some(m.position),
        },
        Utc::now(),
    )
    .await
    .unwrap();
}

async fn audited(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE actor = 'helm-values' AND action = 'model.put'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn values_win_at_every_start(pool: PgPool) {
    let declared = parse(FILE).unwrap();
    let written = declared::reconcile(&pool, &declared, Authority::Values, Utc::now())
        .await
        .unwrap();
    assert_eq!(written, ["a100", "a6000"]);
    let a100 = models::get(&pool, "a100").await.unwrap().unwrap();
    assert_eq!((a100.units, a100.gpumem_mib, a100.position), (2, 40960, 0));
    assert_eq!(a100.patterns, ["*A100*"]);
    assert_eq!(audited(&pool).await, 2);

    // A second start (helm upgrade, a restart) with nothing changed writes nothing.
    assert!(
        declared::reconcile(&pool, &declared, Authority::Values, Utc::now())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(audited(&pool).await, 2);

    // An admin's change to a declared model is undone; an admin's own model stays.
    admin_sets(&pool, "a100", 7).await;
    models::upsert(
        &pool,
        ModelSpec {
            name: "h100",
            units: 1,
            patterns: &[],
            resource: None,
            gpumem_mib: 0,
            position: None,
        },
        Utc::now(),
    )
    .await
    .unwrap();
    let written = declared::reconcile(&pool, &declared, Authority::Values, Utc::now())
        .await
        .unwrap();
    assert_eq!(written, ["a100"]);
    assert_eq!(units(&pool, "a100").await, Some(2));
    assert_eq!(units(&pool, "h100").await, Some(1));
}

#[sqlx::test(migrations = "../migrations")]
async fn with_api_authority_the_values_only_seed(pool: PgPool) {
    let declared = parse(FILE).unwrap();
    declared::reconcile(&pool, &declared, Authority::Api, Utc::now())
        .await
        .unwrap();
    assert_eq!(units(&pool, "a6000").await, Some(4));
    admin_sets(&pool, "a6000", 1).await;
    let written = declared::reconcile(&pool, &declared, Authority::Api, Utc::now())
        .await
        .unwrap();
    assert!(written.is_empty());
    assert_eq!(
        units(&pool, "a6000").await,
        Some(1),
        "the admin's change stays"
    );
}

#[test]
fn a_bad_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("models.json");
    std::fs::write(
        &path,
        r#"[{"name": "a100", "units": 1}, {"name": "a100", "units": 2}]"#,
    )
    .unwrap();
    let err = format!("{:#}", declared::read(&path).unwrap_err());
    assert!(
        err.contains("models.json") && err.contains("declared twice"),
        "{err}"
    );
    assert!(declared::read(&dir.path().join("missing.json")).is_err());
}

#[sqlx::test(migrations = "../migrations")]
async fn values_never_lower_a_model_below_its_bookings(pool: PgPool) {
    let declared = parse(FILE).unwrap();
    declared::reconcile(&pool, &declared, Authority::Values, Utc::now())
        .await
        .unwrap();
    // A planned booking on the second a100.
    let start = Utc::now() + chrono::TimeDelta::days(1);
    let end = start + chrono::TimeDelta::days(1);
    sqlx::query("INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('bob', 'bob', 'bob')")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
         VALUES ('bob', 'a100', '{1}', 1, $1, $2, $2, 'bob', now(), now())",
    )
    .bind(start)
    .bind(end)
    .execute(&pool)
    .await
    .unwrap();
    // New values lower a100 to one unit and a6000 to two: a100 keeps two (bob's
    // booking holds the second, and a start cannot ask what to do with it).
    let lowered = parse(
        &FILE
            .replace("\"units\": 2", "\"units\": 1")
            .replace("\"units\": 4", "\"units\": 2"),
    )
    .unwrap();
    declared::reconcile(&pool, &lowered, Authority::Values, Utc::now())
        .await
        .unwrap();
    assert_eq!(units(&pool, "a100").await, Some(2));
    assert_eq!(units(&pool, "a6000").await, Some(2));
}
