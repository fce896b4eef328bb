//! Users' numbers (migration 20261210000100): the one-booking-at-a-time
//! constraint is keyed by `booking.user_id`, so every booking must carry its own
//! user's number, whoever writes it: the create's one statement (a new user's number
//! from that statement's insert), a batch with one new user twice, creates of one new
//! user racing each other, and inserts that leave the number out. A pair of number
//! and name from two users is refused, so the constraint on the number excludes what
//! one on the name would. Real Postgres, every migration.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use gpu_booking_api::store::bookings::{self, NewBooking};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::username::Username;
use sqlx::PgPool;

async fn setup(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
         VALUES ('a100', 1, 4, '{}', 1024, now(), now())",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Bookings whose number is not their user's.
async fn misnumbered(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM booking b LEFT JOIN app_user u ON u.id = b.user_id
         WHERE u.name IS DISTINCT FROM b.user_name",
    )
    .await
}

fn tomorrow() -> DateTime<Utc> {
    (Utc::now() + TimeDelta::days(1))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap()
}

/// Many planned bookings per user, no cooldown: creates of one user that do not
/// overlap are all accepted.
fn lenient() -> Policy {
    Policy {
        cooldown: TimeDelta::zero(),
        max_planned: 100,
        ..Policy::default()
    }
}

fn ask(user: &Username, start: DateTime<Utc>) -> NewBooking<'_> {
    NewBooking {
        user,
        model: "a100",
        units: 1,
        start,
        end: start + TimeDelta::days(1),
        override_rules: false,
        created_by: user.as_str(),
    }
}

/// Inserts a booking of `user` directly on unit `slot`, from `start_day` days after
/// tomorrow for a day, with `user_id` as given (`None`: left out).
async fn insert(
    pool: &PgPool,
    user: &str,
    user_id: Option<i32>,
    start_day: i64,
    slot: i32,
) -> sqlx::Result<()> {
    let start = tomorrow() + TimeDelta::days(start_day);
    let columns = if user_id.is_some() { ", user_id" } else { "" };
    let value = if user_id.is_some() { ", $4" } else { "" };
    sqlx::query(&format!(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at,
                              created_by, created_at, updated_at{columns})
         VALUES ($1, 'a100', ARRAY[$5::integer], 1, $2, $3, $3, $1, now(), now(){value})"
    ))
    .bind(user)
    .bind(start)
    .bind(start + TimeDelta::days(1))
    .bind(user_id)
    .bind(slot)
    .execute(pool)
    .await
    .map(|_| ())
}

async fn add_user(pool: &PgPool, name: &str) -> i32 {
    sqlx::query_scalar(
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ($1, $1, $1) RETURNING id",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn creates_carry_their_users_numbers_new_returning_and_twice_in_a_batch(pool: PgPool) {
    setup(&pool).await;
    let policy = lenient();
    let old = Username::parse("old@example.com").unwrap();
    let first = bookings::create(&pool, &policy, Utc::now(), ask(&old, tomorrow())).await;
    assert!(first.is_ok(), "{first:?}");
    // One batch: a user met before, and a new one twice (one insert of the user, its
    // number given to both of its bookings).
    let new = Username::parse("new@example.com").unwrap();
    let now = Utc::now();
    let answers = bookings::create_many(
        &pool,
        &policy,
        &[
            (now, ask(&old, tomorrow() + TimeDelta::days(3))),
            (now, ask(&new, tomorrow())),
            (now, ask(&new, tomorrow() + TimeDelta::days(3))),
        ],
    )
    .await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM booking").await, 4);
    assert_eq!(misnumbered(&pool).await, 0);
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT user_id) FROM booking").await,
        2
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_new_users_racing_creates_all_get_its_one_number(pool: PgPool) {
    setup(&pool).await;
    let policy = lenient();
    let user = Username::parse("racer@example.com").unwrap();
    // Each its own transaction at once: the first writes the user, the others wait
    // for its lock and must find the user it wrote, not write it again or fail.
    let creates: Vec<_> = (0..8i64)
        .map(|i| {
            let (pool, policy, user) = (pool.clone(), policy.clone(), user.clone());
            tokio::spawn(async move {
                let start = tomorrow() + TimeDelta::days(2 * i);
                bookings::create(&pool, &policy, Utc::now(), ask(&user, start)).await
            })
        })
        .collect();
    for create in creates {
        let created = create.await.unwrap();
        assert!(created.is_ok(), "{created:?}");
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM booking").await, 8);
    assert_eq!(count(&pool, "SELECT count(*) FROM app_user").await, 1);
    assert_eq!(misnumbered(&pool).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn an_insert_that_leaves_the_number_out_gets_its_users(pool: PgPool) {
    setup(&pool).await;
    add_user(&pool, "a").await;
    let b = add_user(&pool, "b").await;
    insert(&pool, "b", None, 0, 0).await.unwrap();
    assert_eq!(
        count(&pool, "SELECT user_id::bigint FROM booking").await,
        i64::from(b)
    );
    // And the constraint sees it as that user's: an overlapping one is refused.
    let err = insert(&pool, "b", None, 0, 1).await.unwrap_err();
    let constraint = err
        .as_database_error()
        .and_then(|e| e.constraint())
        .map(str::to_owned);
    assert_eq!(constraint.as_deref(), Some("booking_user_excl"), "{err}");
    // A user the database does not know has no number: refused, nothing written.
    assert!(insert(&pool, "nobody", None, 5, 0).await.is_err());
    assert_eq!(count(&pool, "SELECT count(*) FROM booking").await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_number_and_a_name_of_two_users_are_refused(pool: PgPool) {
    setup(&pool).await;
    add_user(&pool, "alice").await;
    let bob = add_user(&pool, "bob").await;
    insert(&pool, "bob", Some(bob), 0, 0).await.unwrap();
    // Alice's booking under Bob's number would escape the constraint for Alice and
    // meet Bob's: the pair's foreign key refuses it.
    let err = insert(&pool, "alice", Some(bob), 3, 0).await.unwrap_err();
    let constraint = err
        .as_database_error()
        .and_then(|e| e.constraint())
        .map(str::to_owned);
    assert_eq!(constraint.as_deref(), Some("booking_user_fkey"), "{err}");
    // Nor can a booking move to another user's name and keep its number.
    let err = sqlx::query("UPDATE booking SET user_name = 'alice'")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("booking_user_fkey"), "{err}");
    // Two users' overlapping bookings are not one user's.
    let alice = count(
        &pool,
        "SELECT id::bigint FROM app_user WHERE name = 'alice'",
    )
    .await;
    insert(&pool, "alice", Some(alice as i32), 0, 1)
        .await
        .unwrap();
    assert_eq!(misnumbered(&pool).await, 0);
}

/// SQLSTATE of a value written into a GENERATED ALWAYS column.
const GENERATED_ALWAYS: &str = "428C9";

fn code(err: &sqlx::Error) -> Option<String> {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

#[sqlx::test(migrations = "../migrations")]
async fn numbers_are_given_not_chosen(pool: PgPool) {
    let err = sqlx::query(
        "INSERT INTO app_user (id, name, escape_slug, safe_slug) VALUES (7, 'x', 'x', 'x')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(code(&err).as_deref(), Some(GENERATED_ALWAYS), "{err}");
    let id = add_user(&pool, "y").await;
    let err = sqlx::query("UPDATE app_user SET id = id + 1000 WHERE name = 'y'")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(code(&err).as_deref(), Some(GENERATED_ALWAYS), "{err}");
    assert_eq!(
        count(&pool, "SELECT id::bigint FROM app_user WHERE name = 'y'").await,
        i64::from(id)
    );
}

#[sqlx::test(migrations = false)]
async fn an_upgrade_numbers_the_users_and_their_bookings(pool: PgPool) {
    // Every migration before this one, then a user with two bookings as they were;
    // then this one, each as the migrator runs it (its own transaction).
    let migrations = &gpu_booking_api::MIGRATOR.migrations;
    let at = migrations
        .iter()
        .position(|m| m.version == 20261210000100)
        .unwrap();
    let apply = |m: &sqlx::migrate::Migration| {
        let (pool, sql) = (pool.clone(), m.sql.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::raw_sql(&sql).execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
        }
    };
    for m in &migrations[..at] {
        apply(m).await;
    }
    setup(&pool).await;
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('a', 'a', 'a'), ('b', 'b', 'b')",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (user, day, slot) in [("a", 0, 0), ("b", 0, 1), ("b", 3, 0)] {
        insert(&pool, user, None, day, slot).await.unwrap();
    }
    apply(&migrations[at]).await;
    assert_eq!(misnumbered(&pool).await, 0);
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT user_id) FROM booking").await,
        2
    );
    // The constraint is there, on the numbers.
    let err = insert(&pool, "b", None, 3, 1).await.unwrap_err();
    assert!(err.to_string().contains("booking_user_excl"), "{err}");
    // New users are numbered after the old ones.
    let c = add_user(&pool, "c").await;
    assert!(c > 2, "{c}");
}
