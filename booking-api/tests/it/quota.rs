//! Group quotas: refused with what is left, an admin's override audited, and a storm
//! of one group's members creating at once never exceeds them (counted in the
//! database afterwards).

use crate::common;
use crate::groups::Api;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, TimeDelta, Utc};
use common::{days, hours, t0};
use gpu_booking_core::booking_policy::Policy;
use serde_json::json;
use sqlx::PgPool;

/// A policy where one user may hold many bookings, so that only quotas limit.
fn loose() -> Policy {
    Policy {
        min_duration: TimeDelta::hours(1),
        cooldown: TimeDelta::zero(),
        max_planned: 100,
        no_booking_while_active: false,
        max_units_per_booking: 4,
        ..Policy::default()
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn quotas_refuse_with_what_is_left_and_an_override_is_audited(pool: PgPool) {
    let api = Api::new(pool.clone(), loose()).await;
    api.group(json!({"name": "ml-lab", "quota": {"gpu_hours": 60, "units": 2}}))
        .await;
    api.member("ml-lab", "ann", "member").await;
    api.member("ml-lab", "bob", "member").await;
    api.member("ml-lab", "cy", "member").await;
    // 24 GPU-hours each of 60 in January (t0 is 2030-01-07).
    let (s, v) = api.book("ann", "a100", days(1), days(2)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = api.book("bob", "a100", days(1), days(2)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // Units: two held at once, a third overlapping is refused.
    let (s, v) = api
        .book("cy", "t4", days(1) + hours(1), days(1) + hours(2))
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("quota_units")),
        "{v}"
    );
    assert!(
        v["message"].as_str().unwrap().contains("so 0 are left"),
        "{v}"
    );
    // Hours: 12 are left in January, 13 are too many; February's are not used.
    let (s, v) = api.book("ann", "a100", days(5), days(5) + hours(13)).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("quota_hours")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("12 of its 60 GPU-hours left in 2030-01"),
        "{v}"
    );
    let (s, v) = api.book("ann", "a100", days(30), days(31)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // The usage against the quota.
    let (s, u) = api
        .call(
            Method::GET,
            "/api/v1/groups/ml-lab/usage",
            "ann",
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    assert_eq!(u["period"], "2030-01");
    assert_eq!(u["used_gpu_hours"], 48.0);
    assert_eq!(u["left_gpu_hours"], 12.0);
    let (_, p) = api
        .call(Method::GET, "/api/v1/policy", "bob", None, None)
        .await;
    assert_eq!(p["quota"]["left_gpu_hours"], 12.0);

    // An admin's override books past it, audited with the refusal.
    let (s, v) = api
        .admin(
            Method::POST,
            "/api/v1/bookings",
            Some(json!({"model": "a100", "user": "bob", "override": true,
                        "start": t0() + days(10), "end": t0() + days(11)})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let audited: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT action, details FROM audit_event WHERE booking_id = $1 ORDER BY id")
            .bind(v["id"].as_i64().unwrap())
            .fetch_all(&pool)
            .await
            .unwrap();
    let actions: Vec<&str> = audited.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        ["booking.create_override", "booking.quota_override"]
    );
    assert_eq!(audited[1].1["rule"], "quota_hours");

    // Extending a booking past the quota is refused too, and changes nothing.
    let id = sqlx::query_scalar::<_, i64>(
        "SELECT id FROM booking WHERE user_name = 'ann' AND start_at = $1",
    )
    .bind(t0() + days(30))
    .fetch_one(&pool)
    .await
    .unwrap();
    let (s, v) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/bookings/{id}"),
            "ann",
            None,
            Some(json!({"end": t0() + days(33)})),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("quota_hours")),
        "{v}"
    );
    let end: DateTime<Utc> = sqlx::query_scalar("SELECT end_at FROM booking WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(end, t0() + days(31));
}

/// The largest number of units the group's bookings hold at one instant, and the
/// most GPU-hours in one calendar month (UTC), counted by Postgres.
async fn counted(pool: &PgPool) -> (i64, f64) {
    let peak: i64 = sqlx::query_scalar(
        "SELECT coalesce(max(held), 0)::bigint FROM (
           SELECT (SELECT sum(b.units) FROM booking b
                   WHERE b.group_id IS NOT NULL AND b.cancelled_at IS NULL
                     AND b.start_at <= e.t AND b.end_at > e.t) AS held
           FROM (SELECT start_at AS t FROM booking WHERE group_id IS NOT NULL) e) x",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let hours: f64 = sqlx::query_scalar(
        "SELECT coalesce(max(h), 0)::float8 FROM (
           SELECT m, sum(b.units * extract(epoch FROM least(b.end_at, m + interval '1 month')
                                                   - greatest(b.start_at, m)) / 3600) AS h
           FROM booking b,
                generate_series(date_trunc('month', b.start_at AT TIME ZONE 'UTC'),
                                date_trunc('month', (b.end_at - interval '1 microsecond') AT TIME ZONE 'UTC'),
                                interval '1 month') AS s(mm),
                LATERAL (SELECT mm AT TIME ZONE 'UTC' AS m) AS x
           WHERE b.group_id IS NOT NULL AND b.cancelled_at IS NULL
           GROUP BY m) y",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (peak, hours)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_storm_of_one_groups_members_never_exceeds_its_quota(pool: PgPool) {
    let api = std::sync::Arc::new(Api::new(pool.clone(), loose()).await);
    api.group(json!({"name": "storm", "quota": {"gpu_hours": 200, "units": 3}}))
        .await;
    let members = 24;
    for i in 0..members {
        api.member("storm", &format!("m{i}"), "member").await;
    }
    let mut tasks = Vec::new();
    for i in 0..members {
        let i = i as i64;
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut created = 0;
            for k in 0..6i64 {
                // Overlapping windows in January and across into February, 1-2 units.
                let start = t0() + hours(((i * 7 + k * 13) % 40) * 12 + 1);
                let end = start + hours(6 + (k * 5) % 30);
                let units = 1 + (i + k) % 2;
                let (s, v) = api
                    .call(
                        Method::POST,
                        "/api/v1/bookings",
                        &format!("m{i}"),
                        None,
                        Some(json!({"model": if k % 2 == 0 { "a100" } else { "t4" },
                                    "units": units, "start": start, "end": end})),
                    )
                    .await;
                match s {
                    StatusCode::CREATED => created += 1,
                    StatusCode::CONFLICT => assert!(
                        [
                            "quota_units",
                            "quota_hours",
                            "capacity",
                            "overlap",
                            "cooldown"
                        ]
                        .contains(&v["error"].as_str().unwrap_or_default()),
                        "{v}"
                    ),
                    other => panic!("{other}: {v}"),
                }
            }
            created
        }));
    }
    let mut created = 0;
    for t in tasks {
        created += t.await.unwrap();
    }
    assert!(created > 0);
    let (peak, hours) = counted(&pool).await;
    assert!(peak <= 3, "{peak} units at once");
    assert!(hours <= 200.0 + 1e-6, "{hours} GPU-hours in a month");
    // Every booking of the storm counts against the group.
    let outside: i64 = sqlx::query_scalar("SELECT count(*) FROM booking WHERE group_id IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(outside, 0);
}
