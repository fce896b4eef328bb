//! End to end, on the simulated lab: with the booking service down and
//! `--on-booking-error allow`, a notebook whose creator wrote our marks itself
//! (`gpu-booking.io/priority=high`, a booking id, `terminate-at`, our high priority
//! class) is let through with its GPU but without any of them, and the controller
//! neither treats it as booked nor ends it at the forged time.

use crate::common;

use std::time::Duration;

use chrono::{SecondsFormat, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::{BOOKING_LABEL, LEGACY_LABELS, MODEL_LABEL, PRIORITY_LABEL};
use gpu_booking_sim::spawner::{notebook_pod, pod_name, HUB_GROUPS, HUB_USER, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::SimCluster;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;
use sqlx::PgPool;

#[sqlx::test(migrations = "./migrations")]
async fn forged_marks_do_not_survive_the_allow_path(pool: PgPool) {
    // The webhook gives the booking service no time to answer: every GPU pod is
    // admitted unchecked (the default policy, allow), as with the service down.
    let builder = SimCluster::builder().webhook_arg("--booking-timeout=1ms");
    let lab = Lab::start_with(pool, builder).await;
    let user = "mallory@example.com";
    let forged_end = Utc::now() + TimeDelta::seconds(3);
    let mut pod = notebook_pod(user, 1);
    pod["spec"]["terminationGracePeriodSeconds"] = json!(GRACE_SECONDS);
    pod["metadata"]["labels"][PRIORITY_LABEL] = json!("high");
    pod["metadata"]["labels"][BOOKING_LABEL] = json!("1");
    pod["metadata"]["labels"][MODEL_LABEL] = json!("a100");
    // The legacy keys (read for one release) are stripped alike.
    for (current, legacy) in LEGACY_LABELS {
        pod["metadata"]["labels"][legacy] = pod["metadata"]["labels"][current].clone();
    }
    pod["metadata"]["annotations"]["terminate-at"] =
        json!(forged_end.to_rfc3339_opts(SecondsFormat::Secs, true));
    pod["metadata"]["annotations"]["gpu-booking.io/last-gpu-activity"] =
        json!(Utc::now().to_rfc3339());
    pod["spec"]["priorityClassName"] = json!("gpu-booking-high");
    // Sent as KubeSpawner sends it (quantities as JSON numbers), by the hub.
    let pod: DynamicObject = serde_json::from_value(pod).unwrap();
    let hub: Api<DynamicObject> = Api::namespaced_with(
        lab.sim.server.client_as(HUB_USER, &HUB_GROUPS),
        NOTEBOOK_NAMESPACE,
        &ApiResource::erase::<Pod>(&()),
    );
    let created = hub
        .create(&PostParams::default(), &pod)
        .await
        .expect("the forged pod is admitted (unchecked)");
    let warnings = lab.sim.admission_warnings(&pod_name(user));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("booking service unavailable")),
        "{warnings:?}"
    );
    lab.expect("the forged notebook does not run", |s| {
        s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
            .is_some_and(|p| is_running(&p))
    })
    .await;
    let stored = lab.notebook(user).unwrap();
    let ours: Vec<String> = ["labels", "annotations"]
        .iter()
        .flat_map(|_| {
            let labels = stored.metadata.labels.clone().unwrap_or_default();
            let annotations = stored.metadata.annotations.clone().unwrap_or_default();
            labels.into_keys().chain(annotations.into_keys())
        })
        .filter(|k| k.starts_with("gpu-booking") || k == "terminate-at")
        .collect();
    assert!(ours.is_empty(), "forged marks survived: {ours:?}");
    let spec = stored.spec.clone().unwrap();
    assert_ne!(
        spec.priority_class_name.as_deref(),
        Some("gpu-booking-high")
    );
    assert_eq!(gpus(&stored), 1, "allow keeps the GPU");

    // Past the forged end (and the controller's reaction time), the same pod runs on.
    tokio::time::sleep(
        (forged_end - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(4),
    )
    .await;
    let still = lab.notebook(user).expect("the notebook is still there");
    assert_eq!(still.metadata.uid, created.metadata.uid, "it was not ended");
    assert!(is_running(&still));
    assert_eq!(gpus(&still), 1);
    lab.shutdown().await;
}
