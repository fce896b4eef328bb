//! A create's capacity answer is the one its model's bookings over its window give
//! (`core::capacity`): created exactly when it fits by count, on slots that no booking
//! over the window holds, through cancels that leave gaps and windows that cross days.
//! A create decides from its window's days where they decide (migration
//! 20261207000100: `booking_day_units` keeps per model and day the units and slots of
//! the bookings that touch the day; `core::capacity::free_slots_by_days`) and reads
//! the bookings over its window only where they do not. Real Postgres, every
//! migration.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use gpu_booking_api::store::bookings::{self, NewBooking};
use gpu_booking_api::store::StoreError;
use gpu_booking_api::testing::day_units_mismatches;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::capacity::{self, CapacityRefusal};
use gpu_booking_core::username::Username;
use gpu_booking_core::window::Window;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

async fn model(pool: &PgPool, name: &str, units: i32) {
    sqlx::query(
        "INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
         VALUES ($1, (SELECT count(*) FROM gpu_model), $2, '{}', 1024, now(), now())",
    )
    .bind(name)
    .bind(units)
    .execute(pool)
    .await
    .unwrap();
}

/// Midnight UTC, two days ahead: every window of these tests lies in the future.
fn day0() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::days(1)).unwrap() + TimeDelta::days(2)
}

fn at(hours: i64) -> DateTime<Utc> {
    day0() + TimeDelta::hours(hours)
}

fn policy() -> Policy {
    Policy {
        min_duration: TimeDelta::hours(1),
        max_duration: TimeDelta::days(3),
        max_planned: 100,
        max_units_per_booking: 3,
        ..Policy::default()
    }
}

async fn book(
    pool: &PgPool,
    user: &str,
    model: &str,
    units: u32,
    from: i64,
    to: i64,
) -> Result<bookings::BookingRow, StoreError> {
    let user = Username::parse(user).unwrap();
    let long = to - from > 24 * 3;
    let req = NewBooking {
        user: &user,
        model,
        units,
        start: at(from),
        end: at(to),
        override_rules: long,
        created_by: if long {
            "admin@example.com"
        } else {
            user.as_str()
        },
    };
    bookings::create(pool, &policy(), Utc::now(), req).await
}

/// A row of `booking_lock_and_read`: its kind, id, slot (or count) and slots.
type ReadRow = (String, Option<i64>, Option<i32>, Option<Vec<i32>>);

/// The rows a create reads for a window: its days, never the bookings, unless the
/// window is too long to be kept per day.
#[sqlx::test(migrations = "../migrations")]
async fn a_create_reads_its_days_not_the_bookings_over_its_window(pool: PgPool) {
    model(&pool, "a", 4).await;
    book(&pool, "u1@example.com", "a", 1, 6, 12).await.unwrap();
    book(&pool, "u2@example.com", "a", 2, 13, 36).await.unwrap();
    book(&pool, "u3@example.com", "a", 1, 0, 24 * 40)
        .await
        .unwrap();
    let kinds = |from: i64, to: i64| {
        let pool = pool.clone();
        async move {
            let rows: Vec<ReadRow> = sqlx::query_as(
                "SELECT o_kind, o_id, o_slot, o_slots FROM booking_lock_and_read('u9', 'a', $1, $2, $1)",
            )
            .bind(at(from))
            .bind(at(to))
            .fetch_all(&pool)
            .await
            .unwrap();
            rows
        }
    };
    let day = |h: i64| capacity::utc_day(at(h));
    let rows = kinds(10, 30).await;
    let days: Vec<_> = rows
        .iter()
        .filter(|r| r.0 == "d")
        .map(|r| (r.1.unwrap(), r.2.unwrap(), r.3.clone().unwrap()))
        .collect();
    // The 40-day booking is not counted per day; it comes as its own row.
    assert_eq!(
        days,
        vec![(day(10), 3, vec![0, 1, 2]), (day(30), 2, vec![1, 2])],
        "{rows:?}"
    );
    let long: Vec<_> = rows.iter().filter(|r| r.0 == "l").collect();
    assert_eq!(long.len(), 1, "{rows:?}");
    assert_eq!(long[0].3.as_deref(), Some(&[3][..]));
    assert!(!rows.iter().any(|r| r.0 == "o"), "{rows:?}");
    // Days nothing touched have no row, and their window reads no booking either
    // (the 40-day booking ended before them).
    let rows = kinds(24 * 50, 24 * 50 + 3).await;
    assert!(rows.iter().all(|r| r.0 == "m" || r.0 == "u"), "{rows:?}");
    // A window too long to be kept per day reads the bookings over it.
    let rows = kinds(0, 24 * 35).await;
    assert_eq!(rows.iter().filter(|r| r.0 == "o").count(), 3, "{rows:?}");
    assert!(!rows.iter().any(|r| r.0 == "d" || r.0 == "l"), "{rows:?}");
}

/// What is free is decided by the instant, not by the day.
#[sqlx::test(migrations = "../migrations")]
async fn a_unit_free_for_part_of_a_day_is_free_then(pool: PgPool) {
    // One unit, held in the morning: in use on that day, but the afternoon is free.
    model(&pool, "one", 1).await;
    book(&pool, "u1@example.com", "one", 1, 6, 12)
        .await
        .unwrap();
    let afternoon = book(&pool, "u2@example.com", "one", 1, 13, 20)
        .await
        .unwrap();
    assert_eq!(afternoon.slots, vec![0]);
    // Still refused where the unit is held.
    let refused = book(&pool, "u3@example.com", "one", 1, 11, 14).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Capacity(CapacityRefusal::Full { .. }))
        ),
        "{refused:?}"
    );

    // Two units: slot 0 held on the morning of day 0 (06:00-12:00), slot 1 from
    // 11:00 on day 1 (its booking took slot 1 while slot 0 was held at 11:00, and the
    // booking that held it was cancelled). Each slot is in use on one of the two days,
    // yet both are free throughout day 0 13:00 to day 1 10:00.
    model(&pool, "two", 2).await;
    let morning = book(&pool, "u4@example.com", "two", 1, 6, 12)
        .await
        .unwrap();
    let gone = book(&pool, "u5@example.com", "two", 1, 24 + 10, 24 + 12)
        .await
        .unwrap();
    let evening = book(&pool, "u6@example.com", "two", 1, 24 + 11, 24 + 20)
        .await
        .unwrap();
    assert_eq!(
        (morning.slots, gone.slots, evening.slots),
        (vec![0], vec![0], vec![1])
    );
    bookings::cancel_or_end(&pool, gone.id, Utc::now(), "test", None)
        .await
        .unwrap();
    let across = book(&pool, "u7@example.com", "two", 1, 13, 24 + 10)
        .await
        .unwrap();
    assert_eq!(across.slots, vec![0]);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);
}

/// Random creates and cancels on small models, each create's answer
/// checked against the decision from every booking of its model over its window
/// (`core::capacity`): created exactly when it fits by count, on slots no booking
/// over the window holds. The units per day stay equal to a count of the bookings.
#[sqlx::test(migrations = "../migrations")]
async fn creates_decide_as_the_bookings_over_their_windows_would(pool: PgPool) {
    let models = [("m1", 1u32), ("m2", 2), ("m3", 3)];
    for (name, units) in models {
        model(&pool, name, units as i32).await;
    }
    let mut rng = StdRng::seed_from_u64(17);
    let mut made: Vec<i64> = Vec::new();
    let (mut by_count, mut created) = (0, 0);
    for i in 0..400 {
        if !made.is_empty() && rng.random_bool(0.2) {
            let id = made.swap_remove(rng.random_range(0..made.len()));
            bookings::cancel_or_end(&pool, id, Utc::now(), "test", None)
                .await
                .unwrap();
            continue;
        }
        let (name, units) = models[rng.random_range(0..models.len())];
        let from = rng.random_range(0..24 * 6);
        let to = from
            + if rng.random_bool(0.05) {
                24 * 40
            } else {
                rng.random_range(1..60)
            };
        let need = rng.random_range(1..=units.min(2));
        let window = Window::new(at(from), at(to)).unwrap();
        // Every booking of the model over the window, before the create.
        let over: Vec<(DateTime<Utc>, DateTime<Utc>, Vec<i32>)> = sqlx::query_as(
            "SELECT start_at, end_at, slots FROM booking
             WHERE model = $1 AND cancelled_at IS NULL AND period && tstzrange($2, $3, '[)')",
        )
        .bind(name)
        .bind(at(from))
        .bind(at(to))
        .fetch_all(&pool)
        .await
        .unwrap();
        let windows = capacity::unit_windows(
            over.iter()
                .map(|(s, e, slots)| (Window::new(*s, *e).unwrap(), slots.len() as u32)),
        );
        let fits = capacity::fits_units(units, &windows, &window, need);
        let answer = book(&pool, &format!("u{i}@example.com"), name, need, from, to).await;
        match &answer {
            Ok(b) => {
                assert!(fits, "created although it does not fit: {b:?}");
                made.push(b.id);
                created += 1;
            }
            Err(StoreError::Capacity(CapacityRefusal::Full { .. })) => {
                assert!(
                    !fits,
                    "refused although it fits by count: {name} {from}..{to} x{need}"
                )
            }
            Err(e) => panic!("{name} {from}..{to} x{need}: {e:?}"),
        }
        by_count += usize::from(fits);
    }
    assert!(created > 50 && by_count > 50, "{created} created");
    let clashes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM booking a JOIN booking b
           ON a.id < b.id AND a.model = b.model AND a.period && b.period AND a.slots && b.slots
         WHERE a.cancelled_at IS NULL AND b.cancelled_at IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(clashes, 0);
    assert_eq!(day_units_mismatches(&pool).await.unwrap(), 0);
}
