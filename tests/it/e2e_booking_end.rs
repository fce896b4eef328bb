//! End to end, on the simulated lab: a booked notebook ends with its booking and
//! comes back CPU-only, at the booked end and when the booking is ended early or
//! cancelled; when the booking's end moves, the notebook follows (the controller
//! follows the booking service's change stream); and all of it while a transaction
//! left open in the booking database holds that stream back.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::{GPU_REMOVED_ANNOTATION, PRIORITY_LABEL};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::SimCluster;
use k8s_openapi::api::core::v1::Pod;
use sqlx::PgPool;

const ALICE: &str = "alice@example.com";

/// Spawns alice's notebook on her booking and waits until it runs; its uid.
async fn booked_notebook(lab: &Lab) -> String {
    lab.sim.spawn(ALICE, 1).await.expect("admitted");
    lab.expect(
        "alice's booked notebook never ran on a GPU while her booking lasted (see why below)",
        |s| {
            running(s, ALICE)
                .is_some_and(|p| gpus(&p) > 0 && label(&p, PRIORITY_LABEL) == Some("high"))
        },
    )
    .await;
    let pod = lab.notebook(ALICE).unwrap();
    pod.metadata.uid.unwrap()
}

/// Waits until alice's notebook is back as a new, CPU-only pod, recording when the
/// old one was marked for deletion.
async fn comes_back_cpu_only(lab: &Lab, old_uid: &str, wrong: &str) -> Option<DateTime<Utc>> {
    let deleted_at = Arc::new(Mutex::new(None));
    let seen = deleted_at.clone();
    let name = pod_name(ALICE);
    lab.expect(wrong, move |s| {
        let pod = s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name);
        if let Some(p) = pod
            .as_ref()
            .filter(|p| p.metadata.uid.as_deref() == Some(old_uid))
        {
            if let Some(t) = &p.metadata.deletion_timestamp {
                seen.lock().unwrap().get_or_insert(t.0);
            }
        }
        pod.is_some_and(|p| {
            p.metadata.uid.as_deref() != Some(old_uid) && gpus(&p) == 0 && is_running(&p)
        })
    })
    .await;
    let copy = lab.notebook(ALICE).unwrap();
    assert!(
        annotation(&copy, GPU_REMOVED_ANNOTATION).is_some(),
        "the CPU-only copy does not say why its GPU was removed"
    );
    assert_eq!(
        label(&copy, PRIORITY_LABEL),
        None,
        "the CPU-only copy still claims a priority"
    );
    assert!(
        annotation(&copy, "terminate-at").is_none(),
        "the CPU-only copy still carries terminate-at"
    );
    let at = *deleted_at.lock().unwrap();
    at
}

#[sqlx::test(migrations = "./migrations")]
async fn booking_end_ends_the_pod_and_it_comes_back_cpu_only(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let booking = lab.book(ALICE, "a100", TimeDelta::seconds(8)).await;
    let uid = booked_notebook(&lab).await;
    let deleted_at = comes_back_cpu_only(
        &lab,
        &uid,
        "alice's notebook did not end at her booking's end and come back CPU-only",
    )
    .await;
    if let Some(at) = deleted_at {
        // The API server's deletion mark has second precision.
        assert!(
            at >= booking.end - TimeDelta::seconds(1),
            "the pod was ended at {at}, before its booking ended at {}",
            booking.end
        );
    }
    lab.shutdown().await;
}

/// What comes back at a booking's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ComesBack {
    Nothing,
    Lent,
    CpuOnly,
}

/// A booked notebook's end under the chart rendered with `values`, as an admin sets
/// them (`--set`): the controller runs with what the chart then renders.
async fn booking_end_under(pool: PgPool, values: &[&str], comes_back: ComesBack) {
    let builder = SimCluster::builder().rendered_chart(chart(values));
    let lab = Lab::start_with(pool, builder).await;
    lab.book(ALICE, "a100", TimeDelta::seconds(8)).await;
    let uid = booked_notebook(&lab).await;
    let name = pod_name(ALICE);
    let wrong = format!(
        "with {values:?}, alice's notebook did not end as the mode says at her booking's end"
    );
    lab.expect(&wrong, |s| {
        let pod = s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name);
        match comes_back {
            ComesBack::Nothing => pod.is_none(),
            _ => pod
                .is_some_and(|p| p.metadata.uid.as_deref() != Some(uid.as_str()) && is_running(&p)),
        }
    })
    .await;
    let copy = lab.notebook(ALICE);
    match comes_back {
        ComesBack::Nothing => assert!(copy.is_none(), "{values:?}: something came back"),
        ComesBack::Lent => {
            let copy = copy.unwrap();
            assert_eq!(label(&copy, PRIORITY_LABEL), Some("low"), "{values:?}");
            assert!(gpus(&copy) > 0, "{values:?}: the lent copy lost its GPU");
        }
        ComesBack::CpuOnly => assert_eq!(gpus(&copy.unwrap()), 0, "{values:?}"),
    }
    lab.shutdown().await;
}

/// `controller.onExpiry: delete`: the pod ends and nothing comes back.
#[sqlx::test(migrations = "./migrations")]
async fn booking_end_in_delete_mode_ends_the_pod_for_good(pool: PgPool) {
    booking_end_under(pool, &["controller.onExpiry=delete"], ComesBack::Nothing).await;
}

/// `controller.onExpiry: demote`: the pod comes back lent, its GPU kept.
#[sqlx::test(migrations = "./migrations")]
async fn booking_end_in_demote_mode_brings_the_pod_back_lent(pool: PgPool) {
    booking_end_under(pool, &["controller.onExpiry=demote"], ComesBack::Lent).await;
}

/// `controller.namespace: "*"` (a ClusterRole instead of the Role in the hub's
/// namespace): expiry works as when it serves `jhub` alone.
#[sqlx::test(migrations = "./migrations")]
async fn booking_end_with_every_namespace_served(pool: PgPool) {
    booking_end_under(pool, &["controller.namespace=*"], ComesBack::CpuOnly).await;
}

#[sqlx::test(migrations = "./migrations")]
async fn ending_a_booking_early_ends_the_pod(pool: PgPool) {
    ends_early(Lab::start(pool).await).await;
}

/// alice ends her running booking early; her pod follows at once.
async fn ends_early(lab: Lab) {
    let booking = lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let uid = booked_notebook(&lab).await;
    let asked = Utc::now();
    lab.end_early(&booking).await;
    let deleted_at = comes_back_cpu_only(
        &lab,
        &uid,
        "alice ended her booking early, but her notebook kept its GPU (the controller did not follow the booking's change)",
    )
    .await;
    // Reported, not asserted (the <= 10 s promise is a measurement, not a test of
    // the wall clock): the deletion mark has second precision.
    if let Some(at) = deleted_at {
        println!(
            "ended early at {asked}; pod marked for deletion at {at} ({} ms later)",
            (at - asked).num_milliseconds()
        );
    }
    lab.shutdown().await;
}

/// The scenarios run under the chart's RBAC: take `patch` on pods away from the
/// controller's Role and ending a booking early fails, naming the refused request
/// (the controller re-times the booked pod's terminate-at with a patch).
#[sqlx::test(migrations = "./migrations")]
async fn a_verb_the_chart_forgets_fails_the_scenario_naming_the_request(pool: PgPool) {
    let mut chart = common::chart(&[]);
    assert!(chart.remove_verb("Role", "gpu-booking-controller-pods", "patch"));
    let scenario = tokio::spawn(async move {
        let lab = Lab::start_with(pool, SimCluster::builder().rendered_chart(chart)).await;
        ends_early(lab).await;
    });
    let failure = scenario
        .await
        .expect_err("the scenario fails without patch on pods");
    let payload = failure.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    assert!(
        message.contains(
            "User \"system:serviceaccount:gpu-booking:gpu-booking-controller\" cannot patch resource \"pods\" in API group \"\" in the namespace \"jhub\""
        ),
        "the failure does not name the refused patch: {message}"
    );
}

/// `PATCH /api/v1/bookings/{id}` as alice herself: the booking's new end.
async fn move_end(lab: &Lab, booking: &Booking, end: DateTime<Utc>) {
    let token = lab.api.token(ALICE, None).expect("a token for alice");
    let resp = reqwest::Client::new()
        .patch(format!("{}/api/v1/bookings/{}", lab.api.url, booking.id))
        .bearer_auth(token)
        .json(&serde_json::json!({ "end": end }))
        .send()
        .await
        .expect("the booking API answers");
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    assert!(
        status.is_success(),
        "moving the end of booking {}: {status} {body}",
        booking.id
    );
}

/// The `terminate-at` of alice's notebook.
fn terminate_at(pod: &Pod) -> Option<DateTime<Utc>> {
    annotation(pod, "terminate-at").and_then(|t| t.parse().ok())
}

#[sqlx::test(migrations = "./migrations")]
async fn an_admin_cancelling_a_running_booking_ends_the_pod(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let booking = lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let uid = booked_notebook(&lab).await;
    let admin = lab
        .api
        .token("root@example.com", Some(gpu_booking_api::auth::Role::Admin))
        .unwrap();
    let resp = reqwest::Client::new()
        .delete(format!("{}/api/v1/bookings/{}", lab.api.url, booking.id))
        .bearer_auth(admin)
        .send()
        .await
        .expect("the booking API answers");
    assert!(resp.status().is_success(), "{}", resp.status());
    comes_back_cpu_only(
        &lab,
        &uid,
        "an admin ended alice's running booking, but her notebook kept its GPU",
    )
    .await;
    let retimed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_event WHERE action = 'controller.retime' AND booking_id = $1",
    )
    .bind(booking.id)
    .fetch_one(&lab.api.pool)
    .await
    .unwrap();
    assert!(
        retimed >= 1,
        "the controller's re-timing is not in the audit log"
    );
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booking_extended_keeps_its_pod_past_the_old_end(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let booking = lab.book(ALICE, "a100", TimeDelta::seconds(15)).await;
    let uid = booked_notebook(&lab).await;
    let new_end = booking.end + TimeDelta::hours(1);
    move_end(&lab, &booking, new_end).await;
    let name = pod_name(ALICE);
    let want = uid.clone();
    lab.expect(
        "alice extended her booking, but her notebook's terminate-at was not moved to the new end",
        move |s| {
            s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name)
                .is_some_and(|p| {
                    p.metadata.uid.as_deref() == Some(want.as_str())
                        && terminate_at(&p)
                            .is_some_and(|t| (t - new_end).abs() < TimeDelta::seconds(1))
                })
        },
    )
    .await;
    // Past the old end (a wait, not a timing assertion): the same pod still runs on
    // its GPU, booked.
    let past_old_end = (booking.end - Utc::now() + TimeDelta::seconds(3))
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(past_old_end).await;
    let pod = lab.notebook(ALICE).expect("alice's notebook");
    assert_eq!(
        pod.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the notebook was replaced"
    );
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "the notebook is being deleted"
    );
    assert!(
        gpus(&pod) > 0 && is_running(&pod),
        "the notebook lost its GPU"
    );
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("high"));
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booking_shortened_ends_its_pod_at_the_new_end(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let booking = lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let uid = booked_notebook(&lab).await;
    let new_end = Utc::now() + TimeDelta::seconds(6);
    move_end(&lab, &booking, new_end).await;
    let deleted_at = comes_back_cpu_only(
        &lab,
        &uid,
        "alice shortened her booking, but her notebook did not end at the new end",
    )
    .await;
    if let Some(at) = deleted_at {
        // The API server's deletion mark has second precision.
        assert!(
            at >= new_end - TimeDelta::seconds(1),
            "the pod was ended at {at}, before the booking's new end {new_end}"
        );
    }
    lab.shutdown().await;
}

/// A planned booking starts while alice runs a lent notebook of its model: the
/// pod keeps its low priority (a pod's priority cannot change), and she is told
/// to restart it (an Event on the pod and an audit row).
#[sqlx::test(migrations = "./migrations")]
async fn a_booking_starting_under_a_lent_pod_tells_its_user_to_restart(pool: PgPool) {
    let lab = Lab::start(pool).await;
    lab.sim.spawn(ALICE, 1).await.expect("admitted");
    lab.expect("alice's unbooked notebook never ran on a lent GPU", |s| {
        running(s, ALICE).is_some_and(|p| gpus(&p) > 0 && label(&p, PRIORITY_LABEL) == Some("low"))
    })
    .await;
    let admin = lab
        .api
        .token("root@example.com", Some(gpu_booking_api::auth::Role::Admin))
        .unwrap();
    // The model of the node the lent notebook landed on (the lab's nodes are named
    // after their model).
    let pod = lab.notebook(ALICE).expect("alice's notebook");
    let node = node_of(&pod).expect("bound").to_owned();
    let model = if node.contains("a100") {
        "a100"
    } else {
        "a6000"
    };
    let start = Utc::now() + TimeDelta::seconds(3);
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/bookings", lab.api.url))
        .bearer_auth(admin)
        .json(
            &serde_json::json!({"model": model, "user": ALICE, "start": start,
            "end": start + TimeDelta::hours(1), "override": true}),
        )
        .send()
        .await
        .expect("the booking API answers");
    assert!(resp.status().is_success(), "{}", resp.status());
    eventually(|| async {
        let told: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_event WHERE action = 'controller.booking_started_on_lent_pod'",
        )
        .fetch_one(&lab.api.pool)
        .await
        .unwrap();
        if told >= 1 {
            return Ok(());
        }
        Err("alice's booking started under her lent notebook, but nobody told her to restart it"
            .to_owned())
    })
    .await;
    let told_at: DateTime<Utc> = sqlx::query_scalar(
        "SELECT at FROM audit_event WHERE action = 'controller.booking_started_on_lent_pod'",
    )
    .fetch_one(&lab.api.pool)
    .await
    .unwrap();
    assert!(
        told_at >= start,
        "told at {told_at}, before the booking started at {start}"
    );
    lab.shutdown().await;
}

/// The lab with the webhook and the controller listing again after 1 s of a held
/// stream, and a transaction left open in its booking database (with an id: it
/// holds back every booking change made after it).
async fn lab_behind_an_open_transaction(
    pool: &PgPool,
) -> (Lab, sqlx::Transaction<'static, sqlx::Postgres>) {
    let builder = SimCluster::builder()
        .webhook_arg("--replica-relist-after=1s")
        .webhook_arg("--replica-wait=1s")
        .controller(|args| args.booking_relist_after = std::time::Duration::from_secs(1));
    let lab = Lab::start_with(pool.clone(), builder).await;
    let mut open = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *open)
        .await
        .unwrap();
    (lab, open)
}

/// How many of the booking's changes the stream still holds back.
async fn held_changes(pool: &PgPool, booking_id: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM booking_change WHERE booking_id = $1
           AND txid >= booking_change_settled_below(booking_change_elsewhere())",
    )
    .bind(booking_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A transaction left open in the booking database holds back every booking change
/// made after it began (the stream serves changes in transaction order). The
/// webhook and the controller list the bookings again while it lasts (here after 1
/// s; 30 s by default): a booking made behind it still books the notebook, and
/// shortening it still ends the pod at the new end, with the transaction still
/// open.
#[sqlx::test(migrations = "./migrations")]
async fn bookings_reach_pods_while_a_long_transaction_holds_the_stream_back(pool: PgPool) {
    let (lab, open) = lab_behind_an_open_transaction(&pool).await;

    // `book` waits until the webhook's replica holds the booking.
    let booking = lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let uid = booked_notebook(&lab).await;
    move_end(&lab, &booking, Utc::now() + TimeDelta::seconds(3)).await;
    comes_back_cpu_only(
        &lab,
        &uid,
        "alice shortened her booking behind an open transaction, but her notebook kept its GPU past the new end (the controller did not list the bookings again)",
    )
    .await;
    // The stream has served neither change: listings brought them.
    assert_eq!(
        held_changes(&pool, booking.id).await,
        2,
        "the booking's changes are not held back any more"
    );
    open.rollback().await.unwrap();
    lab.shutdown().await;
}

/// Behind the same open transaction, a booking ended early: the controller's next
/// listing holds it, over (a listing holds the bookings that ended in the last
/// `LISTED_AFTER_END`), so the pod ends at once, before it is old enough
/// (`LISTING_MARGIN` older than a listing) to be ended for its booking's absence,
/// which is how it ended before listings held ended bookings.
#[sqlx::test(migrations = "./migrations")]
async fn ending_a_booking_early_behind_a_long_transaction_ends_its_pod_at_once(pool: PgPool) {
    let (lab, open) = lab_behind_an_open_transaction(&pool).await;

    let booking = lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let uid = booked_notebook(&lab).await;
    let created = lab
        .notebook(ALICE)
        .and_then(|p| p.metadata.creation_timestamp)
        .expect("the notebook's creation time")
        .0;
    lab.end_early(&booking).await;
    let deleted_at = comes_back_cpu_only(
        &lab,
        &uid,
        "alice ended her booking early behind an open transaction, but her notebook kept its GPU",
    )
    .await
    // A busy machine may show the wait only the copy: created after the delete, it
    // bounds when the delete was.
    .or_else(|| {
        lab.notebook(ALICE)
            .and_then(|p| p.metadata.creation_timestamp)
            .map(|t| t.0)
    })
    .expect("the copy's creation time");
    // Ended for its absence from a listing, it could not have been marked before
    // it was LISTING_MARGIN old (the deletion mark has second precision).
    assert!(
        deleted_at < created + gpu_booking_core::booking_end::LISTING_MARGIN - TimeDelta::seconds(2),
        "the notebook (created {created}) was ended at {deleted_at}: for its booking's absence from a listing, not for the booking's end the listing held"
    );
    assert_eq!(
        held_changes(&pool, booking.id).await,
        2,
        "the booking's changes are not held back any more"
    );
    open.rollback().await.unwrap();
    lab.shutdown().await;
}
