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

/// The lab in `hub-restart` mode as an admin sets it: the chart's values, the hub's
/// Service and the Secret with `secret_token`, which the lab serves and mounts; the
/// fake hub on its own port takes `hub_token`.
async fn hub_restart_lab(
    pool: PgPool,
    secret_token: &str,
    hub_token: &str,
) -> (Lab, FakeHub, tempfile::TempDir) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = FakeHub::api_url_of(&listener).unwrap();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("token"), secret_token).unwrap();
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
    let hub = FakeHub::start_on(listener, &lab.sim, hub_token)
        .await
        .unwrap();
    (lab, hub, secret)
}

#[sqlx::test(migrations = "./migrations")]
async fn restarting_through_the_hub_keeps_the_notebook(pool: PgPool) {
    let token = "hub-service-token";
    let (lab, hub, _secret) = hub_restart_lab(pool, token, token).await;
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
    // How the action began and how it ended, each an Event of its own.
    lab.expect(
        "the pod's Events do not say the restart began and ended",
        |s| {
            let events = s.list::<k8s_openapi::api::events::v1::Event>(Some(NOTEBOOK_NAMESPACE));
            let on_original = |start: &str| {
                events.iter().any(|e| {
                    e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(original.as_str())
                        && e.note.as_deref().is_some_and(|n| n.starts_with(start))
                })
            };
            on_original("Restarting") && on_original("Restarted")
        },
    )
    .await;
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

/// A token the hub refuses (403): the booked pod still leaves its GPU at the
/// booking's end (its CPU-only copy, which the hub's poll may then stop: the risk
/// the mode exists to avoid, taken rather than a GPU held past its booking), and the
/// controller says the hub is unusable (the critical alert reads it).
#[sqlx::test(migrations = "./migrations")]
async fn a_refused_token_falls_back_to_the_cpu_only_copy(pool: PgPool) {
    let (lab, hub, _secret) = hub_restart_lab(pool, "a-stale-token", "hub-service-token").await;
    let original = booked_notebook(&lab, &hub).await;
    lab.expect("the booked pod kept its GPU past its booking", |s| {
        s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(USER))
            .is_none_or(|p| {
                p.metadata.uid.as_deref() != Some(original.as_str()) && common::gpus(&p) == 0
            })
    })
    .await;
    assert_eq!(lab.sim.controller.metrics.hub_usable.get(), 0);
    hub.stop().await;
    lab.shutdown().await;
}

/// A pod whose user the hub does not know (404): not deleted and left for a hub that
/// will never start it again, but recreated CPU-only.
#[sqlx::test(migrations = "./migrations")]
async fn a_user_the_hub_does_not_know_gets_the_cpu_only_copy(pool: PgPool) {
    let token = "hub-service-token";
    let (lab, hub, _secret) = hub_restart_lab(pool, token, token).await;
    lab.book(USER, "a100", TimeDelta::seconds(5)).await;
    // Spawned past the hub (as its ServiceAccount, but the hub never heard of it).
    let pod = lab.sim.spawn(USER, 1).await.expect("admitted");
    assert_eq!(label(&pod, "gpu-booking.io/priority"), Some("high"));
    lab.expect(
        "the unknown user's notebook did not come back CPU-only",
        |s| {
            common::running(s, USER)
                .is_some_and(|p| p.metadata.uid != pod.metadata.uid && common::gpus(&p) == 0)
        },
    )
    .await;
    assert_eq!(lab.sim.controller.metrics.hub_usable.get(), 1);
    hub.stop().await;
    lab.shutdown().await;
}
