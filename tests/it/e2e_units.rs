//! End to end, on the simulated lab: a booking is for N GPUs, and only those are
//! high priority.
//!
//! - a 2-unit booking gets two high-priority pods; the user's third pod is lent,
//!   with the warning that says it is beyond the booking;
//! - a 4-GPU pod against a 1-unit booking is not high priority;
//! - two pods admitted before the controller's count caught up (the webhook's cache
//!   answers the second) both get high priority; the controller demotes the newer
//!   to a lent pod, from the cluster's state.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_api::auth::Role;
use gpu_booking_core::admission::{BOOKING_UNITS_ANNOTATION, PRIORITY_LABEL};
use gpu_booking_sim::spawner::{notebook_pod, pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value};
use sqlx::PgPool;

const ALICE: &str = "alice@example.com";

/// KubeSpawner's pod name for `user`'s named server `server`.
fn server_pod(user: &str, server: &str) -> String {
    format!("{}--{server}", pod_name(user))
}

/// Spawns `user`'s named server as JupyterHub does, asking for `gpus` GPUs; the
/// admission's warnings with the pod as stored.
async fn spawn_server(lab: &Lab, user: &str, server: &str, gpus: u32) -> (Pod, Vec<String>) {
    let mut body = notebook_pod(user, gpus);
    body["metadata"]["name"] = json!(server_pod(user, server));
    body["spec"]["terminationGracePeriodSeconds"] = json!(GRACE_SECONDS);
    let raw: DynamicObject = serde_json::from_value(body).unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(
        lab.sim.hub().into_client(),
        NOTEBOOK_NAMESPACE,
        &ApiResource::erase::<Pod>(&()),
    );
    let stored = api
        .create(&PostParams::default(), &raw)
        .await
        .unwrap_or_else(|e| panic!("the API server admits {user}'s server {server}: {e}"));
    let pod: Pod = serde_json::from_value(serde_json::to_value(stored).unwrap()).unwrap();
    let warnings = lab.sim.admission_warnings(&server_pod(user, server));
    (pod, warnings)
}

/// Books `units` GPUs of `model` for `user` from now, for two hours (an admin's
/// booking: the lab's policy allows single-GPU bookings only).
async fn book_units(lab: &Lab, user: &str, model: &str, units: u32) -> i64 {
    let admin = lab
        .api
        .token("admin@example.com", Some(Role::Admin))
        .unwrap();
    let start = Utc::now() - TimeDelta::seconds(1);
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/bookings", lab.api.url))
        .bearer_auth(admin)
        .json(
            &json!({"model": model, "user": user, "units": units, "override": true,
                      "start": start, "end": start + TimeDelta::hours(2)}),
        )
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(
        status.is_success(),
        "booking {units} x {model} for {user}: {status} {body}"
    );
    assert_eq!(body["units"], units);
    let id = body["id"].as_i64().unwrap();
    lab.webhook_sees(id, |b| b.is_some()).await;
    id
}

/// Waits until the booking service has the controller's count of the units `user`'s
/// booking holds (what the webhook decides the next pod from).
async fn wait_held(lab: &Lab, user: &str, held: i64) {
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
        if answer["units_held"] == held {
            return Ok(());
        }
        Err(format!(
            "the controller never reported {held} units held by {user}'s booking: {answer}"
        ))
    })
    .await;
    lab.webhook_refreshed().await;
}

fn get(server: &gpu_booking_fake_apiserver::FakeApiServer, name: &str) -> Option<Pod> {
    server.get::<Pod>(Some(NOTEBOOK_NAMESPACE), name)
}

/// The demo lab's nodes, with the webhook's cache off so that each admission asks
/// the booking service (the cache's own staleness is the third scenario's).
fn uncached() -> gpu_booking_sim::SimBuilder {
    SimCluster::builder().webhook_arg("--cache-ttl=0s")
}

#[sqlx::test(migrations = "./migrations")]
async fn a_two_unit_booking_gets_two_high_pods_and_a_third_is_lent(pool: PgPool) {
    let lab = Lab::start_with(pool, uncached()).await;
    let booking = book_units(&lab, ALICE, "a100", 2).await;
    for (server, held) in [("one", 1), ("two", 2)] {
        let (pod, warnings) = spawn_server(&lab, ALICE, server, 1).await;
        assert_eq!(
            label(&pod, PRIORITY_LABEL),
            Some("high"),
            "pod {server} is within alice's 2-unit booking: labels {:?}, warnings {warnings:?}",
            pod.metadata.labels
        );
        assert_eq!(annotation(&pod, BOOKING_UNITS_ANNOTATION), Some("2"));
        assert_eq!(
            label(&pod, "gpu-booking.io/booking"),
            Some(&*booking.to_string())
        );
        let name = server_pod(ALICE, server);
        lab.expect(
            &format!("alice's booked pod {server} never ran on an A100"),
            |s| get(s, &name).is_some_and(|p| is_running(&p) && node_of(&p) == Some("gpu-a100-0")),
        )
        .await;
        wait_held(&lab, ALICE, held).await;
    }
    // Both A100s are alice's: her third pod is beyond her booking. Another model
    // has free cards, so it is lent one, and told why.
    let (pod, warnings) = spawn_server(&lab, ALICE, "three", 1).await;
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("low"),
        "a third pod of a 2-unit booking got high priority: warnings {warnings:?}"
    );
    assert!(annotation(&pod, BOOKING_UNITS_ANNOTATION).is_none());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("beyond your booking: 2 GPUs, 2 in use") && w.contains("lent")),
        "the webhook did not say the pod is beyond the booking: {warnings:?}"
    );
    let name = server_pod(ALICE, "three");
    lab.expect("alice's lent third pod never ran on a free A6000", |s| {
        get(s, &name).is_some_and(|p| {
            is_running(&p) && node_of(&p).is_some_and(|n| n.starts_with("gpu-a6000"))
        })
    })
    .await;
    // Her two booked pods are untouched.
    for server in ["one", "two"] {
        let pod = get(&lab.sim.server, &server_pod(ALICE, server));
        assert_eq!(
            pod.as_ref().and_then(|p| label(p, PRIORITY_LABEL)),
            Some("high")
        );
    }
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_four_gpu_pod_against_a_one_unit_booking_is_not_high(pool: PgPool) {
    let lab = Lab::start_with(
        pool,
        SimCluster::builder()
            .webhook_arg("--cache-ttl=0s")
            .nodes(vec![
                GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 4, 40960),
                GpuNode::cpu_only("cpu-0"),
            ]),
    )
    .await;
    book_units(&lab, ALICE, "a100", 1).await;
    let pod = lab.sim.spawn(ALICE, 4).await.expect("admitted");
    let warnings = lab.sim.admission_warnings(&pod_name(ALICE));
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("low"),
        "a 4-GPU pod got high priority from a 1-unit booking: warnings {warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("beyond your booking: 1 GPU, 0 in use")),
        "{warnings:?}"
    );
    lab.expect("the lent 4-GPU pod never ran on the free A100s", |s| {
        running(s, ALICE).is_some_and(|p| gpus(&p) == 4)
    })
    .await;
    // It holds no unit of the booking: a 1-GPU server of alice's is still booked.
    wait_held(&lab, ALICE, 0).await;
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn the_controller_demotes_the_newest_pod_beyond_the_booking(pool: PgPool) {
    // A webhook cache that outlives the scenario: the second pod's admission is
    // answered from the first's lookup (no unit held yet), as any admission within
    // the cache's TTL (3 s by default) of another of the same user's is.
    // Decided by lookups (the replica refreshes units held within a fraction of a
    // second, so it could not stage this).
    let lab = Lab::start_with(
        pool,
        SimCluster::builder()
            .webhook_arg("--decide-from=lookup")
            .webhook_arg("--cache-ttl=1h"),
    )
    .await;
    book_units(&lab, ALICE, "a100", 1).await;
    let (first, _) = spawn_server(&lab, ALICE, "first", 1).await;
    let (second, _) = spawn_server(&lab, ALICE, "second", 1).await;
    let first_uid = first.metadata.uid.clone().unwrap();
    assert_eq!(label(&first, PRIORITY_LABEL), Some("high"));
    assert_eq!(
        label(&second, PRIORITY_LABEL),
        Some("high"),
        "the cached answer should have let the second pod in as booked"
    );
    // The controller sees two high-priority pods on a 1-unit booking: the newer
    // becomes a lent pod, the older keeps the booking.
    let second_name = server_pod(ALICE, "second");
    let first_name = server_pod(ALICE, "first");
    lab.expect(
        "alice's 1-unit booking did not end with exactly its oldest pod high and the newer lent",
        |s| {
            let first = get(s, &first_name);
            let second = get(s, &second_name);
            first.as_ref().is_some_and(|p| {
                p.metadata.uid.as_deref() == Some(first_uid.as_str())
                    && label(p, PRIORITY_LABEL) == Some("high")
                    && is_running(p)
            }) && second.as_ref().is_some_and(|p| {
                label(p, PRIORITY_LABEL) == Some("low") && is_running(p) && gpus(p) == 1
            })
        },
    )
    .await;
    wait_held(&lab, ALICE, 1).await;
    // A pod's priority cannot change: the newer was replaced by its lent copy.
    let now = get(&lab.sim.server, &second_name).unwrap();
    assert_ne!(
        now.metadata.uid, second.metadata.uid,
        "demoted by a lent copy"
    );
    assert_eq!(
        now.spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref()),
        Some("gpu-booking-low")
    );
    lab.shutdown().await;
}
