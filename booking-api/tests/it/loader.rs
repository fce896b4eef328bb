//! The history loader (`scripts/load-history.sql`), small: it switches the
//! triggers that keep the derived tables off for the load and writes those tables
//! itself afterwards, so what it leaves must be what the triggers would have written.
//! Real Postgres, every migration.

use chrono::{TimeDelta, Utc};
use gpu_booking_api::store::bookings::{self, NewBooking};
use gpu_booking_api::testing::{day_units_mismatches, unit_rows_mismatches};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use sqlx::PgPool;

const LOADER: &str = include_str!("../../../scripts/load-history.sql");

/// Loads `bookings` bookings of 200 users on 3 models, 8 cycles of which 2 planned,
/// on the given prefixes, as `PGOPTIONS` would set them.
async fn load(pool: &PgPool, bookings: u32, model_prefix: &str, user_prefix: &str) {
    let mut conn = pool.acquire().await.unwrap();
    for (name, value) in [
        ("bookings", bookings.to_string()),
        ("users", "200".to_owned()),
        ("models", "3".to_owned()),
        ("cycles", "8".to_owned()),
        ("planned_cycles", "2".to_owned()),
        ("model_prefix", model_prefix.to_owned()),
        ("user_prefix", user_prefix.to_owned()),
    ] {
        sqlx::query("SELECT set_config($1, $2, false)")
            .bind(format!("gpu_booking_load.{name}"))
            .bind(value)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    sqlx::raw_sql(LOADER).execute(&mut *conn).await.unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_load_leaves_the_derived_tables_as_the_triggers_would(pool: PgPool) {
    load(&pool, 1_200, "ld", "l").await;
    assert_eq!(count(&pool, "SELECT count(*) FROM booking").await, 1_200);
    assert!(count(&pool, "SELECT count(*) FROM booking WHERE start_at > now()").await > 0);
    assert!(count(&pool, "SELECT count(*) FROM booking_unit").await > 0);
    assert_eq!(unit_rows_mismatches(&pool).await.unwrap(), 0);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);
    // A second load beside the first (the history bench loads the planned part on
    // other prefixes first) adds only its own rows.
    load(&pool, 600, "le", "k").await;
    assert_eq!(count(&pool, "SELECT count(*) FROM booking").await, 1_800);
    assert_eq!(unit_rows_mismatches(&pool).await.unwrap(), 0);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);
    // The triggers are on again: a create on a loaded model, through the store, keeps
    // both tables true.
    let user = Username::parse("new@example.com").unwrap();
    let start = Utc::now() + TimeDelta::days(3);
    let created = bookings::create(
        &pool,
        &Policy::default(),
        Utc::now(),
        NewBooking {
            user: &user,
            model: "ld-01",
            units: 1,
            start,
            end: start + TimeDelta::days(1),
            override_rules: false,
            created_by: user.as_str(),
        },
    )
    .await;
    assert!(created.is_ok(), "{created:?}");
    assert_eq!(unit_rows_mismatches(&pool).await.unwrap(), 0);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);
}
