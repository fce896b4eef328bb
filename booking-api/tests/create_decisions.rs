//! A create's capacity answer is the one its model's bookings over its window give
//! (`core::capacity`): created exactly when it fits by count, on slots that no booking
//! over the window holds, through cancels that leave gaps and windows that cross days.
//! (Written for a create that decided from its window's days, an experiment of issue 17
//! that was measured and not kept: docs/performance.md. They hold for any way a create
//! decides.) Real Postgres, every migration.

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
    bookings::cancel_or_end(&pool, gone.id, Utc::now(), "test")
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
            bookings::cancel_or_end(&pool, id, Utc::now(), "test")
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
