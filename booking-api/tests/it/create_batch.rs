//! Creates written in one batch (`store::bookings::create_many`, fed by the create
//! queue) get the answers they would get created one after the other in the same
//! order: each sees the ones before it that were accepted, a refusal is its own, and
//! a create whose writing fails (a database refusal no rule foresaw) fails alone.
//! Real Postgres, every migration.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use gpu_booking_api::store::bookings::{self, BookingRow, NewBooking};
use gpu_booking_api::store::error::Conflict;
use gpu_booking_api::store::StoreError;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::capacity::CapacityRefusal;
use gpu_booking_core::username::Username;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

/// A request of a test, owning what `NewBooking` borrows.
struct Ask {
    user: Username,
    model: &'static str,
    units: u32,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    override_rules: bool,
}

impl Ask {
    fn new(user: &str, model: &'static str, start: DateTime<Utc>, end: DateTime<Utc>) -> Ask {
        Ask {
            user: Username::parse(user).unwrap(),
            model,
            units: 1,
            start,
            end,
            override_rules: false,
        }
    }

    fn borrowed(&self) -> NewBooking<'_> {
        NewBooking {
            user: &self.user,
            model: self.model,
            units: self.units,
            start: self.start,
            end: self.end,
            override_rules: self.override_rules,
            created_by: if self.override_rules {
                "admin@example.com"
            } else {
                self.user.as_str()
            },
        }
    }
}

/// An answer without what differs between two runs: the booking's id, and the
/// `prefix` of the run's users and models.
fn answer(prefix: &str, result: &Result<BookingRow, StoreError>) -> String {
    let text = match result {
        Ok(b) => format!(
            "created {} {} {} {} {:?} override={}",
            b.user_name, b.model, b.start_at, b.end_at, b.slots, b.override_rules
        ),
        Err(e) => format!("refused {e:?}"),
    };
    text.replace(prefix, "")
}

/// Models `{prefix}one` (one unit) and `{prefix}two` (two).
async fn models_named(pool: &PgPool, prefix: &str) {
    sqlx::query(
        "INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
         SELECT $1 || name, (SELECT count(*) FROM gpu_model) + units, units, '{}', 1024, now(), now()
         FROM (VALUES ('one', 1), ('two', 2)) AS m(name, units)",
    )
    .bind(prefix)
    .execute(pool)
    .await
    .unwrap();
}

async fn models(pool: &PgPool) {
    models_named(pool, "").await;
}

fn next_hour() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::hours(1)).unwrap() + TimeDelta::hours(1)
}

/// Each ask with the time it arrives: an hour before `base`.
fn timed(base: DateTime<Utc>, asks: &[Ask]) -> Vec<(DateTime<Utc>, NewBooking<'_>)> {
    asks.iter()
        .map(|a| (base - TimeDelta::hours(1), a.borrowed()))
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_answers_as_creates_one_after_another(pool: PgPool) {
    models(&pool).await;
    let loose = Policy {
        min_duration: TimeDelta::hours(1),
        max_duration: TimeDelta::days(3),
        cooldown: TimeDelta::hours(2),
        no_booking_while_active: false,
        max_planned: 2,
        max_units_per_booking: 2,
        ..Policy::default()
    };
    // Not a whole microsecond: Postgres keeps microseconds, so a booking comes back
    // with another start than the one asked for, and is still matched to its create.
    let base = next_hour() + TimeDelta::nanoseconds(123_456_789);
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for seed in 0..40u64 {
        let policy = if seed % 4 == 3 {
            Policy::default()
        } else {
            loose.clone()
        };
        let mut rng = StdRng::seed_from_u64(seed);
        // Planned bookings to decide against (some of them made by the batch's own
        // users), then a batch; few users, models and hours, so that the creates meet.
        let asks = |rng: &mut StdRng, n: usize| -> Vec<Ask> {
            (0..n)
                .map(|_| {
                    let start = base + TimeDelta::hours(rng.random_range(0..72));
                    let hours = match rng.random_range(0..10) {
                        0 => 24 * 40, // not kept per day: its model's lock exclusive
                        1 => -3,      // ends before it starts
                        _ => rng.random_range(1..60),
                    };
                    Ask {
                        user: Username::parse(&format!(
                            "user{}@example.com",
                            rng.random_range(0..4)
                        ))
                        .unwrap(),
                        model: ["one", "two", "two", "none"][rng.random_range(0..4)],
                        units: rng.random_range(1..=2),
                        start,
                        end: start + TimeDelta::hours(hours),
                        override_rules: rng.random_bool(0.1),
                    }
                })
                .collect()
        };
        let before = asks(&mut rng, 6);
        let batch = asks(&mut rng, 12);
        // Each run with users and models of its own, so that neither sees the other.
        let mut runs = Vec::new();
        for run in ["together", "alone"] {
            let prefix = format!("{run}{seed}-");
            models_named(&pool, &prefix).await;
            let own = |asks: &[Ask]| -> Vec<Ask> {
                asks.iter()
                    .map(|a| Ask {
                        user: Username::parse(&format!("{prefix}{}", a.user)).unwrap(),
                        model: Box::leak(format!("{prefix}{}", a.model).into_boxed_str()),
                        ..*a
                    })
                    .collect()
            };
            let (before, batch) = (own(&before), own(&batch));
            for (now, req) in timed(base, &before) {
                let _ = bookings::create(&pool, &policy, now, req).await;
            }
            let answers = if run == "together" {
                bookings::create_many(&pool, &policy, &timed(base, &batch)).await
            } else {
                let mut answers = Vec::new();
                for (now, req) in timed(base, &batch) {
                    answers.push(bookings::create(&pool, &policy, now, req).await);
                }
                answers
            };
            runs.push(
                answers
                    .iter()
                    .map(|a| answer(&prefix, a))
                    .collect::<Vec<_>>(),
            );
        }
        let (together, alone) = (&runs[0], &runs[1]);
        assert_eq!(together, alone, "seed {seed}");
        for a in together {
            let kind: String = a
                .split([' ', '(', '{'])
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            let kind = if a.starts_with("created") {
                "created".into()
            } else {
                kind
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    // The batches met every kind of answer: created, and refused by a rule, for
    // capacity and for an unknown model.
    println!("{kinds:?}");
    for kind in [
        "created",
        "refused Rule",
        "refused Capacity",
        "refused UnknownModel",
    ] {
        assert!(
            kinds.keys().any(|k| k.starts_with(kind)),
            "no answer {kind}: {kinds:?}"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn creates_of_one_batch_count_each_other(pool: PgPool) {
    models(&pool).await;
    let policy = Policy {
        max_planned: 2,
        ..Policy::default()
    };
    let start = next_hour() + TimeDelta::days(1);
    let end = start + TimeDelta::days(1);
    let asks = [
        // The one unit of `one`: the first has it, the second is refused for it.
        Ask::new("ann@example.com", "one", start, end),
        Ask::new("bob@example.com", "one", start, end),
        // ann again, at the same time on `two`: refused by her own booking.
        Ask::new("ann@example.com", "two", start, end),
        // carl twice on `two`, apart: both, on the unit that is free.
        Ask::new("carl@example.com", "two", start, end),
        Ask::new(
            "carl@example.com",
            "two",
            end + TimeDelta::days(15),
            end + TimeDelta::days(16),
        ),
        // An admin's 40 days for dora: not kept per day, so the batch holds the
        // model's lock exclusive.
        Ask {
            override_rules: true,
            ..Ask::new(
                "dora@example.com",
                "two",
                end + TimeDelta::days(20),
                end + TimeDelta::days(60),
            )
        },
    ];
    let now = Utc::now();
    let reqs: Vec<_> = asks.iter().map(|a| (now, a.borrowed())).collect();
    let answers = bookings::create_many(&pool, &policy, &reqs).await;
    let row = |i: usize| answers[i].as_ref().unwrap();
    assert_eq!(row(0).slots, vec![0]);
    match &answers[1] {
        Err(StoreError::Capacity(CapacityRefusal::Full { earliest_start, .. })) => {
            // The refusal names when the unit is free again: after ann's booking,
            // which is in the database by the time the refusal is worked out.
            assert_eq!(*earliest_start, Some(end), "{:?}", answers[1]);
        }
        other => panic!("bob on the unit ann holds: {other:?}"),
    }
    assert!(
        matches!(&answers[2], Err(StoreError::Rule(_))),
        "{:?}",
        answers[2]
    );
    assert_eq!(row(3).slots, vec![0]);
    assert_eq!(row(4).slots, vec![0]);
    assert_eq!(row(5).slots, vec![0]);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM booking")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 4);
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE action = 'booking.create'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 3, "one audit row per booking created");
    assert_eq!(
        gpu_booking_api::testing::day_units_mismatches(&pool)
            .await
            .unwrap(),
        0
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_create_whose_writing_fails_fails_alone(pool: PgPool) {
    models(&pool).await;
    let policy = Policy::default();
    let start = next_hour() + TimeDelta::days(1);
    let end = start + TimeDelta::days(1);
    let now = Utc::now();
    // alice's escape slug is this name: its label keys collide with hers.
    let alice = Ask::new("alice@example.com", "two", start, end);
    bookings::create(&pool, &policy, now, alice.borrowed())
        .await
        .unwrap();
    let asks = [
        Ask::new("dan@example.com", "two", start, end),
        Ask::new("alice-40example-2ecom", "one", start, end),
        Ask::new("eve@example.com", "one", start, end),
    ];
    let reqs: Vec<_> = asks.iter().map(|a| (now, a.borrowed())).collect();
    let answers = bookings::create_many(&pool, &policy, &reqs).await;
    assert_eq!(answers[0].as_ref().unwrap().slots, vec![1]);
    assert!(
        matches!(
            &answers[1],
            Err(StoreError::Conflict(Conflict::UsernameCollision))
        ),
        "{:?}",
        answers[1]
    );
    assert_eq!(answers[2].as_ref().unwrap().slots, vec![0]);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_create_that_needs_moves_in_a_batch_gets_them(pool: PgPool) {
    models(&pool).await;
    let policy = Policy {
        min_duration: TimeDelta::hours(1),
        max_planned: 3,
        cooldown: TimeDelta::zero(),
        no_booking_while_active: false,
        ..Policy::default()
    };
    let h = |n: i64| next_hour() + TimeDelta::days(1) + TimeDelta::hours(n);
    let now = Utc::now();
    // Unit 0 from h0 to h10 and unit 1 from h20 to h30: h5 to h25 fits by count
    // (one booking at any instant) but on no one unit, unless one of them moves.
    for (user, s, e) in [("p@example.com", 0, 10), ("q@example.com", 20, 30)] {
        let first = bookings::create(
            &pool,
            &policy,
            now,
            Ask::new(user, "two", h(s), h(e)).borrowed(),
        )
        .await
        .unwrap();
        sqlx::query("UPDATE booking SET slots = $2 WHERE id = $1")
            .bind(first.id)
            .bind(vec![if s == 0 { 0 } else { 1 }])
            .execute(&pool)
            .await
            .unwrap();
    }
    let asks = [
        Ask::new("r@example.com", "one", h(0), h(10)),
        Ask::new("s@example.com", "two", h(5), h(25)),
    ];
    let reqs: Vec<_> = asks.iter().map(|a| (now, a.borrowed())).collect();
    let answers = bookings::create_many(&pool, &policy, &reqs).await;
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    assert!(answers[1].is_ok(), "{:?}", answers[1]);
    let clashes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM booking a JOIN booking b
           ON a.model = b.model AND a.slots && b.slots AND a.id < b.id AND a.period && b.period",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(clashes, 0);
}

/// A create whose request is dropped while it waits in the queue (its client went
/// away) is not made; the ones taken by a worker, and one still wanted, are.
#[sqlx::test(migrations = "../migrations")]
async fn a_queued_create_whose_request_is_gone_is_not_made(pool: PgPool) {
    use gpu_booking_api::create_queue::{Create, CreateQueue};
    models(&pool).await;
    // The test's pool is too small for four waiting workers, the lock's holder and
    // the looks at who waits.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let queue = CreateQueue::new(
        pool.clone(),
        std::sync::Arc::new(Policy::default()),
        Default::default(),
    );
    let now = Utc::now();
    let base = next_hour() + TimeDelta::days(1);
    let create = |i: i64| Create {
        user: Username::parse(&format!("q{i}@example.com")).unwrap(),
        model: "two".into(),
        units: 1,
        start: base + TimeDelta::days(2 * i),
        end: base + TimeDelta::days(2 * i + 1),
        override_rules: false,
        created_by: format!("q{i}@example.com"),
    };
    // The model's lock, held exclusive from outside: every worker that takes a create
    // on it waits.
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(7264, hashtext('two'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let waiting = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    // One create per worker, each taken before the next is queued.
    let mut taken = Vec::new();
    for i in 0..4 {
        let (queue, create) = (queue.clone(), create(i));
        taken.push(tokio::spawn(async move { queue.create(now, create).await }));
        for _ in 0..500 {
            if waiting().await > i {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(waiting().await, i + 1, "worker {i} never waited");
    }
    // Every worker waits: the next create waits in the queue, and its request is
    // dropped there; the one after it is still wanted.
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        queue.create(now, create(4)),
    )
    .await;
    assert!(
        gone.is_err(),
        "the create was answered while every worker waited"
    );
    let wanted = tokio::spawn({
        let (queue, create) = (queue.clone(), create(5));
        async move { queue.create(now, create).await }
    });
    sqlx::query("SELECT pg_advisory_unlock(7264, hashtext('two'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    for t in taken {
        t.await.unwrap().expect("taken by a worker: created");
    }
    wanted.await.unwrap().expect("still wanted: created");
    let users: Vec<String> = sqlx::query_scalar("SELECT user_name FROM booking ORDER BY user_name")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        users,
        [
            "q0@example.com",
            "q1@example.com",
            "q2@example.com",
            "q3@example.com",
            "q5@example.com"
        ]
    );
}
