//! The SQL a create runs, kept cheap (migration 20261129000100): the day
//! functions are inlined by the planner and give the days their first bodies gave,
//! and the create's plpgsql statements run on generic plans that use the indexes.

use sqlx::{PgConnection, PgPool, Row};

/// Instants around the edges that matter: midnights UTC, a microsecond on either
/// side, before 1970, and a window's end at midnight (half-open: it does not touch
/// the next day), and random instants of 1965-2025. All within 1960-2101, where the
/// first bodies were exact (they divided epoch seconds as numeric, whose rounding
/// loses a microsecond in dates far from 1970; see
/// `the_day_functions_hold_at_the_ends_of_postgres_time`).
const EDGES: &str = "
    SELECT s, s + d AS e FROM unnest(ARRAY[
        timestamptz '2026-11-26 00:00:00+00', timestamptz '2026-11-25 23:59:59.999999+00',
        timestamptz '2026-11-26 00:00:00.000001+00', timestamptz '1969-12-31 23:59:59.999999+00',
        timestamptz '1970-01-01 00:00:00+00', timestamptz '1960-02-29 12:00:00+00',
        timestamptz '2026-03-29 01:30:00+00', timestamptz '2099-12-31 23:00:00+00'
    ]) AS s,
    unnest(ARRAY[interval '1 microsecond', interval '1 hour', interval '1 day',
        interval '1 day 1 microsecond', interval '30 days', interval '31 days',
        interval '31 days 1 microsecond', interval '32 days', interval '400 days']) AS d
    UNION ALL
    SELECT timestamptz '1965-01-01 00:00:00+00' + random() * interval '60 years',
           NULL FROM generate_series(1, 20000)";

/// How many of the instants (and windows) above give another day (or another
/// answer to 'kept per day') than the functions' first bodies (migrations
/// 20261125000200 and 20261128000100), in the connection's time zone.
async fn differences(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(&format!(
        "WITH t AS (SELECT s, COALESCE(e, s + random() * interval '40 days' + interval '1 microsecond') AS e FROM ({EDGES}) x)
         SELECT count(*) FROM t
         WHERE booking_day(s) <> floor(extract(epoch FROM s) / 86400)::integer
            OR booking_day(e - interval '1 microsecond') <> floor(extract(epoch FROM e - interval '1 microsecond') / 86400)::integer
            OR booking_counted_by_day(s, e) <> (floor(extract(epoch FROM e - interval '1 microsecond') / 86400)::integer
                                                - floor(extract(epoch FROM s) / 86400)::integer < 31)"
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// The store decides by `booking_counted_by_day` whether a create reads its days, and
/// `core::capacity` by `counted_by_day` whether it decides from them and where a
/// batch's earlier creates count (migration 20261207000100): both must give the same
/// days and the same answer, for the edge windows above (the random ones have no end).
#[sqlx::test(migrations = "../migrations")]
async fn core_and_the_store_count_the_same_days(pool: PgPool) {
    use chrono::{DateTime, Utc};
    use gpu_booking_core::capacity;
    use gpu_booking_core::window::Window;
    let rows = sqlx::query(&format!(
        "SELECT s, e, booking_day(s), booking_day(e - interval '1 microsecond'), booking_counted_by_day(s, e)
         FROM ({EDGES}) x WHERE e IS NOT NULL"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 72);
    for row in rows {
        let (s, e): (DateTime<Utc>, DateTime<Utc>) = (row.get(0), row.get(1));
        let window = Window::new(s, e).unwrap();
        let store = (
            i64::from(row.get::<i32, _>(2)),
            i64::from(row.get::<i32, _>(3)),
            row.get::<bool, _>(4),
        );
        let (first, last) = capacity::window_days(&window);
        assert_eq!(
            (first, last, capacity::counted_by_day(&window)),
            store,
            "{s} - {e}"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn the_day_functions_are_inlined_and_give_the_same_days(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // The first bodies used STABLE operators that read the time zone for other
    // fields; the answers must not depend on it, whatever the session's zone.
    for zone in ["UTC", "America/New_York", "Asia/Kolkata", "Pacific/Chatham"] {
        sqlx::query(&format!("SET TimeZone = '{zone}'"))
            .execute(&mut *conn)
            .await
            .unwrap();
        assert_eq!(differences(&mut conn).await, 0, "time zone {zone}");
    }
    // Inlined: the plan holds the bodies' operators, no call of the functions (a call
    // runs the SQL-function executor, which parses and plans the body each time).
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (VERBOSE, COSTS OFF) SELECT booking_day(x), booking_counted_by_day(x, x + interval '1 day')
         FROM (SELECT now() + random() * interval '1 day' AS x) s",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("booking_day(") && !plan.contains("booking_counted_by_day("),
        "not inlined:\n{plan}"
    );
    assert!(plan.contains("AT TIME ZONE 'UTC'"), "{plan}");
}

/// Where the first bodies were not exact any more, the days are still whole: the
/// first and nearly the last day Postgres holds (the days since 1970 computed apart:
/// Julian day 0, and the civil-calendar algorithm), and windows of exactly 31 days
/// (kept per day) and 31 days and a microsecond (not kept) there.
#[sqlx::test(migrations = "../migrations")]
async fn the_day_functions_hold_at_the_ends_of_postgres_time(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    for zone in ["UTC", "Pacific/Kiritimati"] {
        sqlx::query(&format!("SET TimeZone = '{zone}'"))
            .execute(&mut *conn)
            .await
            .unwrap();
        for (at, day) in [
            ("1970-01-01 00:00:00+00", 0),
            ("1969-12-31 23:59:59.999999+00", -1),
            ("2026-11-26 12:00:00+00", 20_783),
            ("294276-12-31 23:59:59.999999+00", 106_762_939),
            ("4714-11-24 00:00:00+00 BC", -2_440_588),
        ] {
            let got: i32 = sqlx::query_scalar("SELECT booking_day($1::text::timestamptz)")
                .bind(at)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(got, day, "{at} in {zone}");
        }
        for start in ["294276-06-01 00:00:00+00", "4713-12-01 00:00:00+00 BC"] {
            let (exact, over): (bool, bool) = sqlx::query_as(
                "SELECT booking_counted_by_day(s, s + interval '31 days'),
                        booking_counted_by_day(s, s + interval '31 days 1 microsecond')
                 FROM (SELECT $1::text::timestamptz AS s) t",
            )
            .bind(start)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            assert!(exact && !over, "{start} in {zone}: {exact} {over}");
        }
    }
}

/// The generic plan of one of the create's reads, as `booking_lock_and_read` runs it
/// (same statement, same parameters; plpgsql plans it like a prepared statement).
async fn generic_plan(conn: &mut PgConnection, name: &str, statement: &str, args: &str) -> String {
    // Simple protocol throughout: the connection's own prepared statements are sqlx's.
    sqlx::raw_sql(&format!("PREPARE {name} AS {statement}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let rows = sqlx::raw_sql(&format!("EXPLAIN (COSTS OFF) EXECUTE {name}({args})"))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[sqlx::test(migrations = "../migrations")]
async fn the_creates_plpgsql_runs_on_generic_plans_that_use_the_indexes(pool: PgPool) {
    // Planned once per connection, not per create.
    for function in [
        "booking_lock_and_read",
        "booking_day_slots_add",
        "booking_slots_minus",
    ] {
        let config: Option<Vec<String>> =
            sqlx::query_scalar("SELECT proconfig FROM pg_proc WHERE proname = $1")
                .bind(function)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            config,
            Some(vec!["plan_cache_mode=force_generic_plan".to_owned()]),
            "{function}"
        );
    }
    let overlapping = "SELECT b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.model = $1 AND b.cancelled_at IS NULL AND b.period && tstzrange($2, $3, '[)')";
    let args = "'m-07', now(), now() + interval '2 days'";
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    // On a fresh database, whose statistics say the table is empty (where a generic
    // plan once took the user constraint's index for a search by period alone), and
    // with a history of 20,000 bookings on 20 models, analysed.
    let plan = generic_plan(&mut conn, "empty", overlapping, args).await;
    assert!(plan.contains("booking_model_period_idx"), "empty:\n{plan}");
    sqlx::raw_sql(
        "INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
         SELECT 'm-' || lpad(m::text, 2, '0'), m, 100, '{}', 1024, now(), now() FROM generate_series(0, 19) m;
         INSERT INTO app_user (name, escape_slug, safe_slug) SELECT 'u' || u, 'u' || u, 'u' || u FROM generate_series(0, 1999) u;
         INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, created_by, created_at, updated_at)
         SELECT 'u' || (i % 2000), 'm-' || lpad((i % 20)::text, 2, '0'), ARRAY[(i / 20) % 100], 1,
                s, s + interval '1 day', s + interval '1 day', 'test', now(), now()
         FROM generate_series(0, 19999) i,
              LATERAL (SELECT now() - interval '900 days' + (i / 2000) * interval '100 days' + (i % 7) * interval '1 hour' AS s) t;
         ANALYZE booking;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan = generic_plan(&mut conn, "history", overlapping, args).await;
    assert!(
        plan.contains("booking_model_period_idx"),
        "history:\n{plan}"
    );
    // The user's bookings that can matter to the rules (migration 20261204000100):
    // found by the user and the end, not read whole and filtered.
    let own = "SELECT b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.user_name = $1 AND b.cancelled_at IS NULL AND b.end_at > $2";
    let plan = generic_plan(&mut conn, "own", own, "'u7', now() - interval '14 days'").await;
    assert!(
        plan.contains("booking_user_live_idx") && plan.contains("Index Cond"),
        "the user's bookings:\n{plan}"
    );
    assert!(
        plan.lines()
            .filter(|l| l.contains("Index Cond"))
            .any(|l| l.contains("end_at")),
        "the user's bookings are not found by their end:\n{plan}"
    );
    // And the create's read gives those alone: u7 has ten bookings, 100 days apart,
    // of which only the last ends within the cooldown (14 days) before now.
    let (read, all, recent): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM booking_lock_and_read('u7', 'm-07', now(), now() + interval '2 days',
                                                            now() - interval '14 days') r WHERE r.o_kind = 'u'),
                (SELECT count(*) FROM booking WHERE user_name = 'u7'),
                (SELECT count(*) FROM booking WHERE user_name = 'u7' AND end_at > now() - interval '14 days')",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        (read, all, recent),
        (1, 10, 1),
        "the create's read of u7's bookings"
    );
    // The window's days and the bookings too long to be kept per day, which a create
    // reads in place of the bookings over its window (migration 20261207000100).
    // One range of the primary key, model and day: not every day row of the model,
    // which the table keeps for past days too (a join to the window's days planned
    // that, 369 rows a create in the history bench).
    let days = "SELECT d.day, d.units, d.slots FROM booking_day_units d
        WHERE d.model = $1
          AND d.day BETWEEN booking_day($2::timestamptz) AND booking_day($3::timestamptz - interval '1 microsecond')";
    let plan = generic_plan(&mut conn, "days", days, args).await;
    assert!(
        plan.lines()
            .filter(|l| l.contains("Index Cond"))
            .any(|l| l.contains("model") && l.contains("day >=") && l.contains("day <=")),
        "the days:\n{plan}"
    );
    let long = "SELECT b.id, b.start_at, b.end_at, b.slot, b.slots FROM booking b
        WHERE b.model = $1 AND b.cancelled_at IS NULL
          AND NOT booking_counted_by_day(b.start_at, b.end_at)
          AND b.period && tstzrange($2, $3, '[)')";
    let plan = generic_plan(&mut conn, "long", long, args).await;
    assert!(
        plan.contains("booking_long_period_idx"),
        "the long bookings:\n{plan}"
    );
}
