//! Course reservations on the real Postgres: occurrences in the lab's time zone that
//! hold units like bookings, a conflict refused naming the first occurrence (or
//! skipped), one occurrence cancelled to free its units, owners and admins only, the
//! model feed naming the sessions, and a running session's members in the figures.

use axum::http::Method;
use chrono::{NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};
use common::{hours, rfc};
use gpu_booking_api::testing::token_for;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::common;
use crate::maintenance::{admin, user, Api, SECRET};

/// A group `name` owned by `owner` (the groups' tables, written directly).
pub async fn group(pool: &PgPool, name: &str, owner: &str) -> i32 {
    let id: i32 = sqlx::query_scalar("INSERT INTO lab_group (name) VALUES ($1) RETURNING id")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO group_member (group_id, user_name, role) VALUES ($1, $2, 'owner')")
        .bind(id)
        .bind(owner)
        .execute(pool)
        .await
        .unwrap();
    id
}

fn local(y: i32, m: u32, d: u32, h: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, m, d)
        .unwrap()
        .and_hms_opt(h, 0, 0)
        .unwrap()
}

fn tuesdays(units: u32, count: u32) -> Value {
    // Tuesdays 14:00-16:00 in Berlin from 2030-03-19: summer time starts on 2030-03-31.
    json!({
        "model": "a100", "units": units, "group": "ml101", "title": "ML101 lab session",
        "start": local(2030, 3, 19, 14), "end": local(2030, 3, 19, 16),
        "rrule": format!("FREQ=WEEKLY;BYDAY=TU;COUNT={count}"), "time_zone": "Europe/Berlin",
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn occurrences_hold_units_at_the_same_local_time_and_one_can_be_cancelled(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    group(&api.pool, "ml101", "prof").await;
    let (status, made) = api
        .call(
            Method::POST,
            "/api/v1/reservations",
            &user("prof"),
            Some(tuesdays(3, 4)),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let occ = made["occurrences"].as_array().unwrap();
    assert_eq!(occ.len(), 4);
    let starts: Vec<chrono::DateTime<Utc>> = occ
        .iter()
        .map(|o| serde_json::from_value(o["start"].clone()).unwrap())
        .collect();
    // 14:00 local each week: 13:00 UTC before summer time, 12:00 UTC after.
    assert_eq!(
        starts[0],
        Utc.with_ymd_and_hms(2030, 3, 19, 13, 0, 0).unwrap()
    );
    assert_eq!(
        starts[1],
        Utc.with_ymd_and_hms(2030, 3, 26, 13, 0, 0).unwrap()
    );
    assert_eq!(starts[2].hour(), 12);
    assert_eq!(
        starts[3],
        Utc.with_ymd_and_hms(2030, 4, 9, 12, 0, 0).unwrap()
    );
    let id = made["id"].as_i64().unwrap();
    let (_, got) = api
        .call(
            Method::GET,
            &format!("/api/v1/reservations/{id}"),
            &user("anyone"),
            None,
        )
        .await;
    assert_eq!(got["occurrences"], made["occurrences"]);

    // The third session holds 3 of 4 units: a 2-unit booking over it does not fit.
    let third = starts[2];
    let (status, refused) = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            &admin(),
            Some(
                json!({"model": "a100", "user": "ann", "units": 2, "override": true,
                        "start": rfc(third - hours(12)), "end": rfc(third + hours(12))}),
            ),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    api.assert_invariants().await;

    // A holiday: the third occurrence is cancelled, its units are free.
    let (status, after) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/reservations/{id}/occurrences/{}", rfc(third)),
            &user("prof"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["occurrences"][2]["cancelled"], json!(true));
    assert_eq!(after["occurrences"][1]["cancelled"], json!(false));
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/bookings",
            &admin(),
            Some(
                json!({"model": "a100", "user": "ann", "units": 2, "override": true,
                        "start": rfc(third - hours(12)), "end": rfc(third + hours(12))}),
            ),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    api.assert_invariants().await;

    // The model feed names the sessions.
    let (_, token) = api
        .call(Method::POST, "/api/v1/me/feed-token", &user("ann"), None)
        .await;
    let r = common::call(
        &api.app,
        Method::GET,
        &format!(
            "/api/v1/feeds/{}/models/a100/occupancy.ics",
            token["token"].as_str().unwrap()
        ),
        None,
        None,
    )
    .await;
    let text = r.text();
    let unfolded = icalendar::parser::unfold(&text);
    let cal = icalendar::parser::read_calendar(&unfolded).expect("RFC 5545");
    let sessions = cal
        .components
        .iter()
        .filter(|c| c.name == "VEVENT")
        .filter(|c| {
            c.properties.iter().any(|p| {
                p.name == "SUMMARY" && p.val.as_str() == "ML101 lab session, 3 units of a100"
            })
        })
        .count();
    assert_eq!(sessions, 3, "{text}");

    // Removed: every occurrence to come is cancelled.
    let (status, gone) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/reservations/{id}"),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, 200, "{gone}");
    assert!(gone["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["cancelled"] == json!(true)));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_conflict_names_the_first_occurrence_or_is_skipped(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    group(&api.pool, "ml101", "prof").await;
    // A maintenance window over the second Tuesday blocks 2 units.
    let second = Utc.with_ymd_and_hms(2030, 3, 26, 13, 0, 0).unwrap();
    let (status, window) = api
        .call(
            Method::POST,
            "/api/v1/maintenance",
            &admin(),
            Some(json!({"model": "a100", "units": 2, "start": rfc(second - hours(1)), "end": rfc(second + hours(5)),
                        "reason": "driver upgrade"})),
        )
        .await;
    assert_eq!(status, 201, "{window}");
    let (status, refused) = api
        .call(
            Method::POST,
            "/api/v1/reservations",
            &user("prof"),
            Some(tuesdays(3, 4)),
        )
        .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("maintenance")),
        "{refused}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.starts_with("Occurrence 2 (2030-03-26T13:00:00Z"),
        "{message}"
    );
    assert!(
        message.contains(&format!("window {}: driver upgrade", window["id"])),
        "{message}"
    );
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM unit_hold WHERE kind = 'course'")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(holds, 0, "nothing written");

    // Skipping conflicts: three sessions held, the second recorded as skipped.
    let mut body = tuesdays(3, 4);
    body["skip_conflicts"] = json!(true);
    let (status, made) = api
        .call(
            Method::POST,
            "/api/v1/reservations",
            &user("prof"),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["occurrences"].as_array().unwrap().len(), 3);
    assert_eq!(made["skipped"], json!([rfc(second)]));
    // A session the creator skips ahead (a holiday), by its local start.
    let mut body = tuesdays(1, 2);
    body["skip"] = json!([local(2030, 3, 19, 14)]);
    body["title"] = json!("ML101 office hour");
    let (status, made) = api
        .call(Method::POST, "/api/v1/reservations", &admin(), Some(body))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["occurrences"].as_array().unwrap().len(), 1);
    api.assert_invariants().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn only_admins_and_owners_reserve_and_bad_schedules_are_refused(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    group(&api.pool, "ml101", "prof").await;
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/reservations",
            &user("student"),
            Some(tuesdays(1, 2)),
        )
        .await;
    assert_eq!(status, 403);
    for (key, value, code) in [
        ("rrule", json!("FREQ=WEEKLY;BYDAY=TU"), "invalid_request"),
        ("rrule", json!("FREQ=HOURLY;COUNT=5"), "invalid_request"),
        ("time_zone", json!("Mars/Olympus"), "invalid_request"),
        ("group", json!("nope"), "invalid_request"),
        ("units", json!(5), "invalid_units"),
    ] {
        let mut body = tuesdays(1, 2);
        body[key] = value;
        let (status, refused) = api
            .call(Method::POST, "/api/v1/reservations", &admin(), Some(body))
            .await;
        assert_eq!(
            refused["error"].as_str(),
            Some(code),
            "{key}: {status} {refused}"
        );
    }
    // Beyond the booking horizon (365 days).
    let mut body = tuesdays(1, 2);
    body["start"] = json!(local(2031, 6, 3, 14));
    body["end"] = json!(local(2031, 6, 3, 16));
    let (status, refused) = api
        .call(Method::POST, "/api/v1/reservations", &admin(), Some(body))
        .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (422, Some("too_far_ahead")),
        "{refused}"
    );
}

/// The course members in the webhook's and the controller's figures.
async fn course_members(api: &Api) -> Value {
    let service = token_for(SECRET, "controller", Some("service"));
    let (status, state) = api
        .call(
            Method::GET,
            "/api/v1/admission-state?full=false",
            &service,
            None,
        )
        .await;
    assert_eq!(status, 200, "{state}");
    state["groups"].clone()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_running_sessions_group_is_in_the_figures_even_without_members(pool: PgPool) {
    let api = Api::new(pool, &[("a100", 4)]).await;
    let id = group(&api.pool, "ml101", "prof").await;
    sqlx::query("DELETE FROM group_member WHERE group_id = $1")
        .bind(id)
        .execute(&api.pool)
        .await
        .unwrap();
    // A session of one hour from an hour after the tests' clock.
    let mut body = tuesdays(1, 1);
    body["start"] = json!(local(2030, 1, 7, 1));
    body["end"] = json!(local(2030, 1, 7, 2));
    body["rrule"] = json!("FREQ=DAILY;COUNT=1");
    body["time_zone"] = json!("UTC");
    let (status, made) = api
        .call(Method::POST, "/api/v1/reservations", &admin(), Some(body))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(course_members(&api).await, json!([]), "before the session");

    // While it runs, its group is listed without members (not left out, which the
    // controller reads as not yet known and asks again for within seconds) ...
    api.clock
        .set(Utc.with_ymd_and_hms(2030, 1, 7, 1, 30, 0).unwrap());
    let group_id = i64::from(id);
    assert_eq!(
        course_members(&api).await,
        json!([{"group": group_id, "members": []}])
    );
    // ... and with them once it has some.
    for member in ["ben", "ann"] {
        sqlx::query(
            "INSERT INTO group_member (group_id, user_name, role) VALUES ($1, $2, 'member')",
        )
        .bind(id)
        .bind(member)
        .execute(&api.pool)
        .await
        .unwrap();
    }
    assert_eq!(
        course_members(&api).await,
        json!([{"group": group_id, "members": ["ann", "ben"]}])
    );
}
