//! Expiry that JupyterHub agrees with.
//!
//! The fake hub (`gpu_booking_sim::hub`) polls as KubeSpawner's `poll()` does and at
//! the worst moment: when the running server's pod is missing, between the
//! controller's delete and its re-create, it marks the server stopped, and its
//! `stop()` deletes by name the pod that comes back. Against it, the plain
//! delete-and-re-create loses the notebook; `--on-expiry hub-restart` (stop and start
//! through the hub's REST API with a service token read from a file) keeps it.

use crate::common;

use chrono::TimeDelta;
use common::{chart, label, Lab};
use gpu_booking_sim::hub::{FakeHub, ServerStatus};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::SimCluster;
use k8s_openapi::api::core::v1::Pod;
use sqlx::PgPool;
use tokio::net::TcpListener;

const USER: &str = "zoë@uni.example";

/// A booked notebook spawned from the hub; its pod's uid.
async fn booked_notebook(lab: &Lab, hub: &FakeHub) -> String {
    lab.book(USER, "a100", TimeDelta::seconds(5)).await;
    hub.spawn(USER, 1).await.expect("the hub spawns");
    let pod = lab.notebook(USER).expect("the notebook pod");
    assert_eq!(label(&pod, "gpu-booking.io/priority"), Some("high"));
    pod.metadata.uid.unwrap()
}

#[sqlx::test(migrations = "./migrations")]
async fn recreating_behind_the_hubs_back_loses_the_notebook(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let hub = FakeHub::start(&lab.sim, "hub-service-token").await.unwrap();
    booked_notebook(&lab, &hub).await;
    // The booking ends: the controller deletes the pod; the hub's poll finds none,
    // marks the server stopped, and its stop deletes the CPU-only copy by name.
    lab.expect(
        "the hub's poll deleted the re-created pod and the server is stopped",
        |s| {
            s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(USER))
                .is_none()
                && hub.poll_deletes() == [USER]
                && hub.status(USER) == Some(ServerStatus::Stopped)
        },
    )
    .await;
    hub.stop().await;
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn restarting_through_the_hub_keeps_the_notebook(pool: PgPool) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = FakeHub::api_url_of(&listener).unwrap();
    let token = "hub-service-token";
    // The mode as an admin sets it: the chart's values, the hub's Service and the
    // Secret with the hub's token, which the lab serves and mounts.
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("token"), token).unwrap();
    let hub_service = "http://hub.jhub.svc:8081";
    let hub_address = api_url
        .split_once("/hub/api")
        .map(|(base, _)| base.to_owned())
        .unwrap();
    let builder = SimCluster::builder()
        .rendered_chart(chart(&[
            "controller.onExpiry=hub-restart",
            &format!("controller.hub.apiUrl={hub_service}/hub/api"),
            "controller.hub.tokenSecretName=hub-token",
        ]))
        .lab_service(hub_service, &hub_address)
        .lab_secret("hub-token", secret.path().to_owned());
    let lab = Lab::start_with(pool, builder).await;
    let hub = FakeHub::start_on(listener, &lab.sim, token).await.unwrap();
    let original = booked_notebook(&lab, &hub).await;
    // The booking ends: the hub stops the server and starts it again; the new pod
    // went through the webhook (no booking now: not high priority).
    lab.expect("the hub runs a new notebook pod, no longer booked", |s| {
        hub.status(USER) == Some(ServerStatus::Running)
            && common::running(s, USER).is_some_and(|p| {
                p.metadata.uid.as_deref() != Some(original.as_str())
                    && label(&p, "gpu-booking.io/priority") != Some("high")
            })
    })
    .await;
    assert!(hub.poll_deletes().is_empty(), "the hub never lost the pod");
    // The token is in no Event the controller left.
    let events = lab
        .sim
        .server
        .list::<k8s_openapi::api::events::v1::Event>(Some(NOTEBOOK_NAMESPACE));
    assert!(!events.is_empty());
    for event in events {
        let text = serde_json::to_string(&event).unwrap();
        assert!(!text.contains(token), "{text}");
    }
    hub.stop().await;
    lab.shutdown().await;
}
