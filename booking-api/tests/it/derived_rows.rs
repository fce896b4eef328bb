//! What an INSERT into `booking` derives (migration 20261208000100: the change log,
//! the days' units and slots, the slot constraint's rows), written once per statement
//! from the statement's new rows: the same rows as one booking at a time, whatever
//! the statement holds, and nothing when the statement fails. Real Postgres, every
//! migration; the oracle is a recount from the bookings themselves.

use gpu_booking_api::store::models::{booked_windows, day_loads};
use gpu_booking_api::testing::{day_units_mismatches, unit_rows_mismatches};
use gpu_booking_core::capacity::{peaks_in_each, peaks_of_days, utc_day, utc_day_window};
use gpu_booking_core::window::Window;
use sqlx::PgPool;

const MODELS: [&str; 3] = ["m-a", "m-b", "m-c"];

async fn setup(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
         SELECT name, ord::integer, 4096, '{}', 1024, now(), now()
         FROM unnest($1::text[]) WITH ORDINALITY AS m(name, ord)",
    )
    .bind(MODELS)
    .execute(pool)
    .await
    .unwrap();
}

/// One booking to insert: (user, model, slots, start hour, length in hours, cancelled).
type Row = (String, &'static str, Vec<i32>, i64, i64, bool);

/// Inserts `rows` (and their users) in one statement.
async fn insert(pool: &PgPool, rows: &[Row]) -> sqlx::Result<()> {
    let users: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug)
         SELECT DISTINCT u, u, u FROM unnest($1::text[]) AS u ON CONFLICT (name) DO NOTHING",
    )
    .bind(&users)
    .execute(pool)
    .await?;
    // Slots as one flat array with each row's bounds (Postgres arrays are rectangular).
    let mut slots = Vec::new();
    let (mut from, mut to) = (Vec::new(), Vec::new());
    for r in rows {
        from.push(slots.len() as i32 + 1);
        slots.extend_from_slice(&r.2);
        to.push(slots.len() as i32);
    }
    let models: Vec<&str> = rows.iter().map(|r| r.1).collect();
    let starts: Vec<i64> = rows.iter().map(|r| r.3).collect();
    let lengths: Vec<i64> = rows.iter().map(|r| r.4).collect();
    let cancelled: Vec<bool> = rows.iter().map(|r| r.5).collect();
    sqlx::query(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at,
                              cancelled_at, created_by, created_at, updated_at)
         SELECT r.u, r.m, ($3::integer[])[r.f:r.t], r.t - r.f + 1, w.s, w.e, w.e,
                CASE WHEN r.c THEN now() END, 'test', now(), now()
         FROM unnest($1::text[], $2::text[], $4::integer[], $5::integer[], $6::bigint[], $7::bigint[], $8::boolean[])
              WITH ORDINALITY AS r(u, m, f, t, h, len, c, i),
              LATERAL (SELECT timestamptz '2030-01-01 00:00:00+00' + r.h * interval '1 hour' AS s,
                              timestamptz '2030-01-01 00:00:00+00' + (r.h + r.len) * interval '1 hour' AS e) AS w
         ORDER BY r.i",
    )
    .bind(&users)
    .bind(&models)
    .bind(&slots)
    .bind(&from)
    .bind(&to)
    .bind(&starts)
    .bind(&lengths)
    .bind(&cancelled)
    .execute(pool)
    .await?;
    Ok(())
}

/// Bookings whose change-log rows are not exactly one `created` each, in id order.
async fn change_rows_off(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "WITH c AS (SELECT booking_id, kind, row_number() OVER (ORDER BY seq) AS n FROM booking_change),
              b AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM booking)
         SELECT count(*) FROM c FULL JOIN b ON c.n = b.n AND c.booking_id = b.id AND c.kind = 'created'
         WHERE c.n IS NULL OR b.n IS NULL",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn assert_derived(pool: &PgPool) {
    assert_eq!(unit_rows_mismatches(pool).await.unwrap(), 0, "booking_unit");
    assert_eq!(
        day_units_mismatches(pool).await.unwrap(),
        0,
        "booking_day_units"
    );
    assert_eq!(change_rows_off(pool).await, 0, "booking_change");
}

/// A small deterministic generator (the same statements every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn statements_of_many_bookings_derive_what_one_at_a_time_would(pool: PgPool) {
    setup(&pool).await;
    let mut rng = Lcg(17);
    let mut user = 0;
    // Each model's units are split into lanes by a statement's index so that no two
    // bookings share a unit at once; within a statement, bookings share models and
    // days (several on one day row), some hold several slots, some start cancelled,
    // some are too long to be kept per day, some end on a midnight.
    for statement in 0..40 {
        let size = 1 + rng.below(9) as usize;
        let rows: Vec<Row> = (0..size)
            .map(|k| {
                user += 1;
                let units = 1 + rng.below(3) as i32;
                let lane = (statement * 9 + k) as i32 * 3;
                let length = match rng.below(4) {
                    0 => 24 * 40,
                    1 => 24,
                    _ => 1 + rng.below(24 * 5) as i64,
                };
                let start = if rng.below(3) == 0 {
                    24 * rng.below(20) as i64
                } else {
                    rng.below(24 * 20) as i64
                };
                (
                    format!("user-{user}"),
                    MODELS[rng.below(3) as usize],
                    (lane..lane + units).collect(),
                    start,
                    length,
                    rng.below(6) == 0,
                )
            })
            .collect();
        insert(&pool, &rows).await.unwrap();
    }
    let bookings: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(bookings > 100, "{bookings}");
    let shared_days: i64 =
        sqlx::query_scalar("SELECT count(*) FROM booking_day_units WHERE units > 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(shared_days > 10, "{shared_days}");
    assert_derived(&pool).await;

    // Cancels, moves and slot changes (the row triggers) keep what the statements wrote true.
    sqlx::query(
        "UPDATE booking SET cancelled_at = now() WHERE id % 5 = 0 AND cancelled_at IS NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE booking SET end_at = end_at + interval '1 day', booked_end_at = booked_end_at + interval '1 day' WHERE id % 7 = 0")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM booking WHERE id % 11 = 0")
        .execute(&pool)
        .await
        .unwrap();
    // Early ends and later starts off the hour, to the microsecond (the days' entries
    // of where units begin and end move with them).
    sqlx::query(
        "UPDATE booking SET end_at = end_at - interval '90 minutes 0.000501 seconds'
         WHERE id % 13 = 0 AND end_at - start_at > interval '2 hours'",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE booking SET start_at = start_at + interval '30 minutes 0.25 seconds'
         WHERE id % 17 = 0 AND end_at - start_at > interval '1 hour'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(unit_rows_mismatches(&pool).await.unwrap(), 0);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);

    // The availability's count from the days (what the store keeps per day and the
    // long bookings) is the count from every booking over the days.
    let first = utc_day(start_of_2030()) - 2;
    let days: Vec<Window> = (0..70)
        .map(|d| utc_day_window(first + d).unwrap())
        .collect();
    let mut busy_days = 0;
    for model in MODELS {
        let (loads, long) = day_loads(&pool, model, first, days.len()).await.unwrap();
        let windows = booked_windows(&pool, model, days[0].start(), days[69].end())
            .await
            .unwrap();
        let from_bookings = peaks_in_each(&windows, &days);
        assert_eq!(
            peaks_of_days(first, days.len(), &loads, &long),
            from_bookings,
            "{model}"
        );
        busy_days += from_bookings.iter().filter(|&&p| p > 1).count();
    }
    assert!(busy_days > 20, "{busy_days}");
}

fn start_of_2030() -> chrono::DateTime<chrono::Utc> {
    "2030-01-01T00:00:00Z".parse().unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_statement_refused_by_a_constraint_derives_nothing(pool: PgPool) {
    setup(&pool).await;
    insert(&pool, &[("a".into(), "m-a", vec![0], 0, 48, false)])
        .await
        .unwrap();
    // The second booking's unit 0 overlaps the first's: the whole statement goes,
    // the third booking (alone on its model) with it.
    let refused = insert(
        &pool,
        &[
            ("b".into(), "m-b", vec![0, 1], 0, 24, false),
            ("c".into(), "m-a", vec![0], 24, 24, false),
            ("d".into(), "m-c", vec![5], 0, 24, false),
        ],
    )
    .await;
    let err = refused.unwrap_err();
    let constraint = err
        .as_database_error()
        .and_then(|e| e.constraint())
        .map(str::to_owned);
    assert_eq!(constraint.as_deref(), Some("booking_slot_excl"), "{err}");
    for (table, want) in [
        ("booking", 1),
        ("booking_unit", 1),
        ("booking_change", 1),
        ("booking_day_units", 2),
    ] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, want, "{table}");
    }
    assert_derived(&pool).await;
}
