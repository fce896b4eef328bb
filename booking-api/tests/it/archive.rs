//! Archiving (migration 20261201000100): bookings that ended long ago leave the
//! exclusion constraints' indexes, and the database still refuses a booking that
//! would overlap one of them, also when the archiving job runs at the same moment.
//! What the API does with archived bookings (rules, slot moves) is in rules_api.rs.
//!
//! Runs on the real Postgres (`DATABASE_URL`); each test gets a fresh, migrated
//! database from `#[sqlx::test]`.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{days, t0};
use gpu_booking_api::store::archive::{archive_ended, horizon};
use sqlx::PgPool;

/// A model `gpu` of 4 units and the users a to z.
async fn setup(pool: &PgPool) {
    sqlx::query("INSERT INTO gpu_model (name, units) VALUES ('gpu', 4)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug)
         SELECT c, c, c FROM unnest(string_to_array('abcdefghijklmnopqrstuvwxyz', NULL)) AS c",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Inserts a booking of `user` on `slots` of `gpu` over [start, end) as the service
/// would store it, bypassing the service's rules: only the database's own checks
/// stand in the way.
async fn insert(
    db: impl sqlx::PgExecutor<'_>,
    user: &str,
    slots: &[i32],
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
         VALUES ($1, 'gpu', $2, cardinality($2), $3, $4, $4, 'sql', $3, $3) RETURNING id",
    )
    .bind(user)
    .bind(slots)
    .bind(start)
    .bind(end)
    .fetch_one(db)
    .await
}

fn constraint(r: sqlx::Result<i64>) -> String {
    match r {
        Err(sqlx::Error::Database(db)) => db.constraint().unwrap_or("none").to_owned(),
        other => panic!("want a constraint violation, got {other:?}"),
    }
}

async fn archived(pool: &PgPool, id: i64) -> bool {
    sqlx::query_scalar("SELECT archived FROM booking WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Runs `sql` with `id` as its one parameter (a change of one booking).
async fn update(pool: &PgPool, sql: &str, id: i64) {
    sqlx::query(sql).bind(id).execute(pool).await.unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn the_constraints_leave_archived_bookings_out(pool: PgPool) {
    let def: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'booking_user_excl'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(def.contains("(NOT archived)"), "booking_user_excl: {def}");
    // The slot constraint is on `booking_unit` (migration 20261205000100): a row per
    // unit of each booking that is neither cancelled nor archived, kept by a trigger
    // through inserts, slot moves, cancelling, archiving and back.
    setup(&pool).await;
    let now = t0();
    let units = |id: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM booking_unit WHERE booking_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let old = insert(&pool, "a", &[0, 1], now - days(20), now - days(10))
        .await
        .unwrap();
    let planned = insert(&pool, "b", &[2], now + days(1), now + days(2))
        .await
        .unwrap();
    assert_eq!((units(old).await, units(planned).await), (2, 1));
    update(
        &pool,
        "UPDATE booking SET slots = '{1,2,3}', units = 3 WHERE id = $1",
        old,
    )
    .await;
    assert_eq!(units(old).await, 3);
    assert_eq!(archive_ended(&pool, now - days(5), 100).await.unwrap(), 1);
    assert_eq!(units(old).await, 0);
    // Moved back into the constraints by a change of its window.
    update(
        &pool,
        "UPDATE booking SET start_at = start_at + interval '1 hour' WHERE id = $1",
        old,
    )
    .await;
    assert!(!archived(&pool, old).await);
    assert_eq!(units(old).await, 3);
    update(
        &pool,
        "UPDATE booking SET cancelled_at = created_at WHERE id = $1",
        planned,
    )
    .await;
    assert_eq!(units(planned).await, 0);
    // A model renamed keeps its id: the rename cascades to the bookings, whose rows
    // are written again with the same keys, and still refuse a clash.
    sqlx::query("UPDATE gpu_model SET name = 'gpu-renamed' WHERE name = 'gpu'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(units(old).await, 3);
    let clash = sqlx::query_scalar::<_, i64>(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
         SELECT 'c', 'gpu-renamed', '{3}', 1, start_at, end_at, end_at, 'sql', start_at, start_at
         FROM booking WHERE id = $1 RETURNING id",
    )
    .bind(old)
    .fetch_one(&pool)
    .await;
    assert_eq!(constraint(clash), "booking_slot_excl");
    // Each row as the booking holds it: its model's id and unit, its window.
    let mismatched = count(
        &pool,
        "SELECT count(*) FROM booking_unit u JOIN booking b ON b.id = u.booking_id
         JOIN gpu_model m ON m.name = b.model
         WHERE u.period <> b.period OR NOT (u.unit_key - (m.id::bigint << 32))::integer = ANY (b.slots)",
    )
    .await;
    assert_eq!(mismatched, 0);
    sqlx::query("TRUNCATE booking CASCADE")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM booking_unit").await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_job_archives_what_ended_by_its_time_in_batches(pool: PgPool) {
    setup(&pool).await;
    let now = t0();
    assert_eq!(horizon(&pool).await.unwrap(), None);
    // Ten bookings on slot 0, one after another, the last three ending at the same
    // instant on other slots: a batch cannot stop between them.
    let mut ids = Vec::new();
    for (i, user) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
        let start = now - days(40) + days(4 * i as i64);
        ids.push(
            insert(&pool, user, &[0], start, start + days(2))
                .await
                .unwrap(),
        );
    }
    let tie = now - days(10);
    for (user, slot) in [("h", 1), ("i", 2), ("j", 3)] {
        ids.push(
            insert(&pool, user, &[slot], tie - days(1), tie)
                .await
                .unwrap(),
        );
    }
    // A cancelled one and a planned one are left alone.
    let cancelled = insert(&pool, "k", &[1], now - days(30), now - days(29))
        .await
        .unwrap();
    update(
        &pool,
        "UPDATE booking SET cancelled_at = created_at WHERE id = $1",
        cancelled,
    )
    .await;
    let planned = insert(&pool, "l", &[0], now + days(1), now + days(2))
        .await
        .unwrap();
    let changes = count(&pool, "SELECT count(*) FROM booking_change").await;

    // Everything that ended by `tie`: the seven on slot 0 end on days -38 .. -14,
    // then the three tied; in passes of 2.
    let n = archive_ended(&pool, tie, 2).await.unwrap();
    assert_eq!(n, 10);
    for id in &ids {
        assert!(archived(&pool, *id).await, "booking {id}");
    }
    assert!(!archived(&pool, cancelled).await);
    assert!(!archived(&pool, planned).await);
    assert_eq!(horizon(&pool).await.unwrap(), Some(tie));
    // Archiving is not a change any follower sees.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM booking_change").await,
        changes
    );
    // Nothing left: a second run archives nothing and keeps the horizon.
    assert_eq!(archive_ended(&pool, tie - days(5), 2).await.unwrap(), 0);
    assert_eq!(horizon(&pool).await.unwrap(), Some(tie));
}

#[sqlx::test(migrations = "../migrations")]
async fn overlapping_an_archived_booking_is_still_refused(pool: PgPool) {
    setup(&pool).await;
    let now = t0();
    let old = insert(&pool, "a", &[0, 1], now - days(20), now - days(10))
        .await
        .unwrap();
    assert_eq!(archive_ended(&pool, now - days(5), 100).await.unwrap(), 1);
    assert!(archived(&pool, old).await);
    // The same slot at the same time, by someone else: the slot constraint's refusal.
    let clash = insert(&pool, "b", &[1], now - days(12), now - days(11)).await;
    assert_eq!(constraint(clash), "booking_slot_excl");
    // The same user at the same time on another slot: the user constraint's.
    let clash = insert(&pool, "a", &[3], now - days(15), now - days(14)).await;
    assert_eq!(constraint(clash), "booking_user_excl");
    // Touching, other slots, or after the horizon: fine.
    insert(&pool, "b", &[0], now - days(10), now - days(9))
        .await
        .unwrap();
    insert(&pool, "c", &[2, 3], now - days(12), now - days(11))
        .await
        .unwrap();
    insert(&pool, "a", &[2], now - days(4), now - days(3))
        .await
        .unwrap();
    // A booking moved onto the archived one's slot is refused the same way, and one
    // whose window is moved over it too.
    let moved = insert(&pool, "d", &[2], now - days(19), now - days(18))
        .await
        .unwrap();
    let err = sqlx::query("UPDATE booking SET slots = '{1}' WHERE id = $1")
        .bind(moved)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("booking_slot_excl"), "{err}");
    let mine = insert(&pool, "a", &[2], now - days(30), now - days(25))
        .await
        .unwrap();
    let err = sqlx::query("UPDATE booking SET end_at = $2, booked_end_at = $2 WHERE id = $1")
        .bind(mine)
        .bind(now - days(19))
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("booking_user_excl"), "{err}");
}

#[sqlx::test(migrations = "../migrations")]
async fn only_the_job_archives_and_a_changed_booking_comes_back(pool: PgPool) {
    setup(&pool).await;
    let now = t0();
    let old = insert(&pool, "a", &[0], now - days(20), now - days(10))
        .await
        .unwrap();
    let recent = insert(&pool, "b", &[0], now - days(3), now - days(1))
        .await
        .unwrap();
    archive_ended(&pool, now - days(5), 100).await.unwrap();
    // By hand, past the horizon: not archived.
    update(
        &pool,
        "UPDATE booking SET archived = true WHERE id = $1",
        recent,
    )
    .await;
    assert!(!archived(&pool, recent).await);
    // An insert never arrives archived.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at, archived)
         VALUES ('c', 'gpu', '{1}', 1, $1, $2, $2, 'sql', $1, $1, true) RETURNING id",
    )
    .bind(now - days(30))
    .bind(now - days(29))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!archived(&pool, id).await);
    // Touching only bookkeeping keeps it archived; moving its slot brings it back into
    // the constraints, checked there.
    update(
        &pool,
        "UPDATE booking SET updated_at = now() WHERE id = $1",
        old,
    )
    .await;
    assert!(archived(&pool, old).await);
    update(&pool, "UPDATE booking SET slots = '{2}' WHERE id = $1", old).await;
    assert!(!archived(&pool, old).await);
    let clash = insert(&pool, "d", &[2], now - days(12), now - days(11)).await;
    assert_eq!(constraint(clash), "booking_slot_excl");
}

/// A transaction whose slot checks wait for its commit, as the service's slot moves.
async fn deferred(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET CONSTRAINTS booking_slot_excl, booking_archived_excl DEFERRED")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

#[sqlx::test(migrations = "../migrations")]
async fn slot_swaps_with_archived_bookings_are_checked_at_commit(pool: PgPool) {
    setup(&pool).await;
    let now = t0();
    let a = insert(&pool, "a", &[0], now - days(20), now - days(10))
        .await
        .unwrap();
    let b = insert(&pool, "b", &[1], now - days(20), now - days(10))
        .await
        .unwrap();
    archive_ended(&pool, now - days(5), 100).await.unwrap();
    // Swapped in one transaction, deferred as the service defers slot moves: only
    // the end state counts.
    let mut tx = deferred(&pool).await;
    for (id, slot) in [(a, 1), (b, 0)] {
        sqlx::query("UPDATE booking SET slots = ARRAY[$2::integer] WHERE id = $1")
            .bind(id)
            .bind(slot)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.expect("a swap ends with no clash");
    // The same deferred, ending in a clash with a booking still archived: refused at
    // commit.
    let c = insert(&pool, "c", &[2], now - days(30), now - days(25))
        .await
        .unwrap();
    archive_ended(&pool, now - days(5), 100).await.unwrap();
    assert!(archived(&pool, c).await);
    let d = insert(&pool, "d", &[3], now - days(28), now - days(26))
        .await
        .unwrap();
    let mut tx = deferred(&pool).await;
    sqlx::query("UPDATE booking SET slots = '{2}' WHERE id = $1")
        .bind(d)
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(err.to_string().contains("booking_slot_excl"), "{err}");
}

/// The race: a booking inserted while the job is archiving the one it overlaps.
/// The insert's constraint check waits for the job's transaction, then finds the
/// old version of the booking gone and the new one outside the index; the trigger
/// must still refuse it.
#[sqlx::test(migrations = "../migrations")]
async fn a_booking_inserted_while_the_job_archives_is_checked(pool: PgPool) {
    setup(&pool).await;
    let now = t0();
    let old = insert(&pool, "a", &[0], now - days(20), now - days(10))
        .await
        .unwrap();
    let mut job = pool.begin().await.unwrap();
    sqlx::query("SELECT booking_archive_pass($1, 100)")
        .bind(now - days(5))
        .execute(&mut *job)
        .await
        .unwrap();
    let clash = tokio::spawn({
        let pool = pool.clone();
        async move { insert(&pool, "b", &[0], now - days(12), now - days(11)).await }
    });
    // Until the insert waits on the job's transaction (its constraint check).
    let mut waited = false;
    for _ in 0..500 {
        let waiting = count(
            &pool,
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO booking%'",
        )
        .await;
        if waiting > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waited, "the insert never waited for the job");
    job.commit().await.unwrap();
    assert!(archived(&pool, old).await);
    assert_eq!(constraint(clash.await.unwrap()), "booking_slot_excl");
}
