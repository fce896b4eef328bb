//! End to end, on the simulated lab: holds decide admissions as bookings do.
//!
//! - a maintenance window over all of a model's units: an unbooked user's spawn
//!   during the window is stripped (nothing is lent), though the cards are idle;
//! - a course occurrence of 2 units running: two members' pods get high priority
//!   against it without bookings of their own, the third member's is stripped (both
//!   cards are in use), and the booked pods end at the occurrence's end;
//! - a course's session starting while members run lent pods: as many members as
//!   the session has places are told to restart (an Event and an audit row, the
//!   earliest pod first), a non-member is not, and the told member's place stays
//!   hers while she restarts onto the session;
//! - the controller's leader changing while a session and a booking run: the new
//!   leader tells no one again, and the told member keeps her place.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_api::auth::Role;
use gpu_booking_core::admission::{PRIORITY_LABEL, RESTART_TOLD_ANNOTATION};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::e2e_spawn::a100_lab;

#[sqlx::test(migrations = "./migrations")]
async fn a_maintenance_window_lends_nothing(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab()).await;
    // Both A100s idle: the window blocks them all from a moment from now.
    let start = Utc::now() + TimeDelta::seconds(2);
    let admin = lab
        .api
        .token("admin@example.com", Some(Role::Admin))
        .unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/maintenance", lab.api.url))
        .bearer_auth(admin)
        .json(&json!({"model": "a100", "reason": "driver upgrade",
                      "start": start, "end": start + TimeDelta::hours(1)}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let window: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "the window: {status} {window}");
    let booking = window["booking_id"].as_i64().expect("the window's row");
    lab.webhook_sees(booking, |b| b.is_some()).await;
    let wait = (start - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(200)).await;

    let pod = lab
        .sim
        .spawn("carol@example.com", 1)
        .await
        .expect("admitted, without its GPU");
    let warnings = lab.sim.admission_warnings(&pod_name("carol@example.com"));
    assert_eq!(
        gpus(&pod),
        0,
        "a pod was lent a GPU under maintenance: warnings {warnings:?}"
    );
    assert_ne!(label(&pod, PRIORITY_LABEL), Some("low"));
    assert!(
        !warnings.is_empty(),
        "the user is not told why the notebook runs without a GPU"
    );
    // The service's own answer (the webhook's lookup mode) lends none either.
    let token = lab.api.token("webhook", Some(Role::Service)).unwrap();
    let answer: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/schedulability", lab.api.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["free"]["a100"], 0, "{answer}");
    lab.shutdown().await;
}

/// `method` `uri` with `body` as the lab's admin; the status and the answer.
async fn admin_call(lab: &Lab, method: reqwest::Method, uri: &str, body: Value) -> (u16, Value) {
    let admin = lab
        .api
        .token("admin@example.com", Some(Role::Admin))
        .unwrap();
    let resp = reqwest::Client::new()
        .request(method, format!("{}{uri}", lab.api.url))
        .bearer_auth(admin)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Group `ml101` with `members`, made as an admin makes it over the API.
async fn ml101(lab: &Lab, members: &[&str]) {
    let (status, body) = admin_call(
        lab,
        reqwest::Method::POST,
        "/api/v1/groups",
        json!({"name": "ml101"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    for m in members {
        let uri = format!("/api/v1/groups/ml101/members/{m}");
        let (status, body) = admin_call(lab, reqwest::Method::PUT, &uri, json!({})).await;
        assert!((200..300).contains(&status), "{m}: {status} {body}");
    }
}

/// A reservation of `units` A100s for `ml101`, one occurrence from `start` to `end`
/// (to the second, in UTC): the service's answer.
async fn reserve_once(
    lab: &Lab,
    units: u32,
    title: &str,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Value {
    let at = |t: DateTime<Utc>| t.naive_utc().format("%Y-%m-%dT%H:%M:%S").to_string();
    let (status, made) = admin_call(
        lab,
        reqwest::Method::POST,
        "/api/v1/reservations",
        json!({"model": "a100", "units": units, "group": "ml101", "title": title,
               "start": at(start), "end": at(end),
               "rrule": "FREQ=DAILY;COUNT=1", "time_zone": "UTC"}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    made
}

/// Waits until the booking service has the controller's count of `held` units for
/// booking `id`, as `user` is answered (what the webhook decides the next pod from).
async fn wait_held(lab: &Lab, user: &str, id: i64, held: i64) {
    let token = lab.api.token("webhook", Some(Role::Service)).unwrap();
    eventually(|| async {
        let answer: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/schedulability", lab.api.url))
            .query(&[("user", user)])
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if answer["booking_id"] == id && answer["units_held"] == held {
            return Ok(());
        }
        Err(format!(
            "the controller never reported {held} units held by the occurrence: {answer}"
        ))
    })
    .await;
    lab.webhook_refreshed().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn course_members_share_the_occurrence_s_units_until_it_ends(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab()).await;
    let members = ["ann@example.com", "ben@example.com", "cy@example.com"];
    ml101(&lab, &members).await;
    // One occurrence, running now, of both A100s, ending in 40 s.
    let now = Utc::now();
    let start = now - TimeDelta::minutes(1);
    let end = now + TimeDelta::seconds(40);
    let made = reserve_once(&lab, 2, "ML101 lab", start, end).await;
    let occurrence = &made["occurrences"][0];
    let booking = occurrence["booking_id"]
        .as_i64()
        .expect("the occurrence's row");
    let ends: chrono::DateTime<Utc> = serde_json::from_value(occurrence["end"].clone()).unwrap();
    lab.webhook_sees(booking, |b| b.is_some()).await;
    // The replica reads the members with its next figures.
    lab.webhook_refreshed().await;

    let mut uids = Vec::new();
    for (i, member) in members[..2].iter().enumerate() {
        let pod = lab.sim.spawn(member, 1).await.expect("admitted");
        let warnings = lab.sim.admission_warnings(&pod_name(member));
        assert_eq!(
            label(&pod, PRIORITY_LABEL),
            Some("high"),
            "{member}'s pod is within the course's 2 units: warnings {warnings:?}"
        );
        assert_eq!(
            label(&pod, "gpu-booking.io/booking"),
            Some(&*booking.to_string())
        );
        lab.expect(&format!("{member}'s course pod never ran"), |s| {
            running(s, member).is_some()
        })
        .await;
        uids.push(lab.notebook(member).unwrap().metadata.uid.unwrap());
        wait_held(&lab, member, booking, i as i64 + 1).await;
    }
    // Both units in use by the course: the third member's pod gets no GPU.
    let pod = lab.sim.spawn(members[2], 1).await.expect("admitted");
    let warnings = lab.sim.admission_warnings(&pod_name(members[2]));
    assert_eq!(
        gpus(&pod),
        0,
        "a third member's pod got a GPU beyond the course's units: warnings {warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("the course's 2 GPUs are all in use")),
        "the warning does not say the course's units are in use: {warnings:?}"
    );

    // At the occurrence's end the booked pods are ended as booked pods are.
    let wait = (ends - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    for (member, uid) in members[..2].iter().zip(&uids) {
        let name = pod_name(member);
        lab.expect(
            &format!("{member}'s course pod outlived the occurrence"),
            |s| {
                s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name)
                    .is_none_or(|p| {
                        p.metadata.uid.as_deref() != Some(uid.as_str())
                            || p.metadata.deletion_timestamp.is_some()
                    })
            },
        )
        .await;
    }
    lab.shutdown().await;
}

/// The `BookingStartedRestart` notes on the pod of uid `uid`.
fn restart_notes(lab: &Lab, uid: &str) -> Vec<String> {
    lab.sim
        .server
        .list::<Event>(Some(NOTEBOOK_NAMESPACE))
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("BookingStartedRestart")
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// `user`'s running lent notebook on an A100: its uid.
async fn lent_notebook(lab: &Lab, user: &str) -> String {
    let pod = lab.sim.spawn(user, 1).await.expect("admitted");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("low"),
        "{user} should be lent a free A100"
    );
    lab.expect(&format!("{user}'s lent notebook never ran on a GPU"), |s| {
        running(s, user).is_some_and(|p| gpus(&p) > 0)
    })
    .await;
    lab.notebook(user).unwrap().metadata.uid.unwrap()
}

/// The restart notices `user` was given, one audit row each (the Events of notices
/// alike are one Event, its count raised).
async fn notices_to(lab: &Lab, user: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_event
          WHERE action = 'controller.booking_started_on_lent_pod' AND user_name = $1",
    )
    .bind(user)
    .fetch_one(&lab.api.pool)
    .await
    .unwrap()
}

/// The first audit row of a restart notice for booking `id`: its user and time.
async fn first_notice_row(lab: &Lab, id: i64) -> (Option<String>, chrono::DateTime<Utc>) {
    eventually(|| async {
        let row: Option<(Option<String>, chrono::DateTime<Utc>)> = sqlx::query_as(
            "SELECT user_name, at FROM audit_event
              WHERE action = 'controller.booking_started_on_lent_pod' AND booking_id = $1
              ORDER BY id LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&lab.api.pool)
        .await
        .unwrap();
        row.ok_or_else(|| "the notice left no audit row".to_owned())
    })
    .await
}

#[sqlx::test(migrations = "./migrations")]
async fn a_session_starting_under_members_lent_pods_tells_as_many_as_it_has_places(pool: PgPool) {
    let four = SimCluster::builder().nodes(vec![
        GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 4, 40960),
        GpuNode::cpu_only("cpu-0"),
    ]);
    let lab = Lab::start_with(pool, four).await;
    let (ann, ben, dan) = ("ann@example.com", "ben@example.com", "dan@example.com");
    ml101(&lab, &[ann, ben]).await;
    // Before the session: two members and a non-member run lent notebooks (ann's
    // first).
    let mut uids = Vec::new();
    for user in [ann, ben, dan] {
        uids.push(lent_notebook(&lab, user).await);
    }
    let (ann_uid, ben_uid, dan_uid) = (&uids[0], &uids[1], &uids[2]);
    // A session of one A100 from a moment from now.
    let start = Utc::now() + TimeDelta::seconds(3);
    let end = start + TimeDelta::hours(1);
    let made = reserve_once(&lab, 1, "ML101", start, end).await;
    let booking = made["occurrences"][0]["booking_id"]
        .as_i64()
        .expect("the occurrence's row");
    let starts: chrono::DateTime<Utc> =
        serde_json::from_value(made["occurrences"][0]["start"].clone()).unwrap();

    // The session starts: ann, whose pod came first, is told to restart onto it.
    lab.expect(
        "ann was never told that her course's session started",
        |_| !restart_notes(&lab, ann_uid).is_empty(),
    )
    .await;
    let notes = restart_notes(&lab, ann_uid);
    assert!(
        notes.iter().any(
            |n| n.contains("your course ML101's session on a100 has started")
                && n.contains("run on the course's GPUs until")
                && n.contains("the course's GPU goes to the first member's pod")
        ),
        "the notice is not worded for the course: {notes:?}"
    );
    let (user, told_at) = first_notice_row(&lab, booking).await;
    assert_eq!(user.as_deref(), Some(ann));
    assert!(
        told_at >= starts,
        "told at {told_at}, before the session at {starts}"
    );
    // A few rounds later: the one place is ann's, so ben is not told (yet), and
    // dan, who is not a member, never.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        restart_notes(&lab, ben_uid).is_empty(),
        "ben was told beyond the session's one place"
    );
    assert!(
        restart_notes(&lab, dan_uid).is_empty(),
        "a non-member was told of the course"
    );

    // Ann restarts as told: her new pod is booked on the session. While her lent
    // pod goes and before the new one comes, the place stays hers: ben is not told
    // of a place she takes back a moment later.
    lab.sim
        .stop_notebook(ann)
        .await
        .expect("ann's notebook stops");
    lab.expect("ann's lent notebook never went", |s| {
        s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(ann))
            .is_none_or(|p| p.metadata.uid.as_deref() != Some(ann_uid.as_str()))
    })
    .await;
    let pod = lab.sim.spawn(ann, 1).await.expect("admitted");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("high"),
        "ann's restarted pod is not on the course's session: warnings {:?}",
        lab.sim.admission_warnings(&pod_name(ann))
    );
    assert_eq!(
        label(&pod, "gpu-booking.io/booking"),
        Some(&*booking.to_string())
    );
    lab.expect("ann's restarted notebook never ran", |s| {
        running(s, ann).is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        restart_notes(&lab, ben_uid).is_empty(),
        "ben was told of the place ann took back"
    );
    assert!(
        restart_notes(&lab, dan_uid).is_empty(),
        "a non-member was told of the course"
    );
    assert_eq!(restart_notes(&lab, ann_uid).len(), 1, "ann was told twice");
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_new_leader_tells_no_one_again_and_keeps_the_told_members_place(pool: PgPool) {
    let four = SimCluster::builder()
        .nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 4, 40960),
            GpuNode::cpu_only("cpu-0"),
        ])
        .controller(leader_elected("replica-a"));
    let lab = Lab::start_with(pool, four).await;
    let (ann, ben, dan, eve) = (
        "ann@example.com",
        "ben@example.com",
        "dan@example.com",
        "eve@example.com",
    );
    ml101(&lab, &[ann, ben]).await;
    let mut uids = Vec::new();
    for user in [ann, ben, dan, eve] {
        uids.push(lent_notebook(&lab, user).await);
    }
    let (ann_uid, dan_uid, eve_uid) = (&uids[0], &uids[2], &uids[3]);
    // A session of one A100 (ann's: her pod came first), and a booking of dan's own.
    let start = Utc::now() + TimeDelta::seconds(3);
    let end = start + TimeDelta::hours(1);
    let made = reserve_once(&lab, 1, "ML101", start, end).await;
    lab.book(dan, "a100", TimeDelta::hours(1)).await;
    lab.expect("ann and dan were never told to restart", |_| {
        !restart_notes(&lab, ann_uid).is_empty() && !restart_notes(&lab, dan_uid).is_empty()
    })
    .await;

    // The leader dies; the next one leads and shows that it follows the bookings by
    // telling eve of the booking she makes now.
    lab.sim.controller.kill();
    let successor = lab
        .sim
        .start_replica("replica-b", leader_elected("replica-b"))
        .expect("the second replica starts");
    lab.expect("the second replica never led", |_| {
        successor.leadership.is_leader()
    })
    .await;
    lab.book(eve, "a100", TimeDelta::hours(1)).await;
    lab.expect("the new leader never told eve of her booking", |_| {
        !restart_notes(&lab, eve_uid).is_empty()
    })
    .await;
    // A few of its rounds over the running session (one a second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        notices_to(&lab, ann).await,
        1,
        "ann was told of the session again by the new leader"
    );
    assert_eq!(
        notices_to(&lab, dan).await,
        1,
        "dan was told of his booking again by the new leader"
    );
    assert_eq!(
        notices_to(&lab, ben).await,
        0,
        "ben was told of the place ann still holds"
    );
    let told = lab
        .sim
        .server
        .get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(ann))
        .and_then(|p| p.metadata.annotations)
        .and_then(|a| a.get(RESTART_TOLD_ANNOTATION).cloned());
    let session = made["occurrences"][0]["booking_id"].as_i64().unwrap();
    assert_eq!(told, Some(session.to_string()), "ann's pod's mark");
    assert!(lab.sim.denials().is_empty(), "{:?}", lab.sim.denials());
    drop(successor);
    lab.shutdown().await;
}
