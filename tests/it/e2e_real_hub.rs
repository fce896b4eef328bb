//! End to end, on the simulated lab with a real JupyterHub in front of it: KubeSpawner
//! (PyPI `jupyterhub-kubespawner`, tests/support/jupyterhub.rs) spawns into namespace
//! `jhub` over the lab's HTTPS API server as the hub's ServiceAccount, the webhook's
//! trusted spawner, as zero-to-jupyterhub runs it; the webhook admits its pods, and
//! both the cluster's view and the hub's (`GET /hub/api/users/X`) are checked.

use std::time::Duration;

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::{GPU_REMOVED_ANNOTATION, PRIORITY_LABEL};
use gpu_booking_sim::spawner::{pod_name, HUB_USER, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{SimBuilder, SimCluster};
use serde_json::Value;
use sqlx::PgPool;

#[path = "../support/jupyterhub.rs"]
mod jupyterhub;

use jupyterhub::{RealHub, ADMIN_TOKEN, CONTROLLER_TOKEN};

/// A lab with a real hub in front of it, stopped together.
struct HubLab {
    lab: Lab,
    api: HubApi,
    hub: RealHub,
    _dir: tempfile::TempDir,
}

impl HubLab {
    /// The lab of `builder` and a hub on `port`, or `None` (said why) without the hub.
    /// The hub's KubeSpawner has a kubeconfig for the hub's ServiceAccount
    /// (`jhub/hub`), its token one the lab's API server issued for its own audience.
    async fn start(pool: PgPool, builder: SimBuilder, port: u16) -> Option<HubLab> {
        let program = jupyterhub::program()?;
        let lab = Lab::start_with(pool, builder).await;
        let token = lab.sim.server.service_account_token(
            NOTEBOOK_NAMESPACE,
            "hub",
            &[gpu_booking_fake_apiserver::API_AUDIENCE],
        );
        let dir = tempfile::tempdir().expect("a folder");
        let kubeconfig = dir.path().join("hub-kubeconfig");
        lab.sim
            .https
            .write_kubeconfig(&kubeconfig, HUB_USER, &token)
            .expect("the hub's kubeconfig is written");
        let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path").to_owned();
        let hub = RealHub::start_on(
            &program,
            port,
            None,
            &[("HUB_SPAWNER", "kube"), ("KUBECONFIG", &kubeconfig)],
        )
        .await;
        Some(HubLab {
            lab,
            api: HubApi::new(&hub),
            hub,
            _dir: dir,
        })
    }

    /// The demo lab and a hub on a free port.
    async fn demo(pool: PgPool) -> Option<HubLab> {
        Self::start(pool, SimCluster::builder(), jupyterhub::free_port()).await
    }

    async fn shutdown(self) {
        drop(self.hub);
        self.lab.shutdown().await;
    }
}

/// The hub's API as its admin service.
struct HubApi {
    url: String,
    http: reqwest::Client,
}

impl HubApi {
    fn new(hub: &RealHub) -> Self {
        Self {
            url: hub.api_url(),
            http: reqwest::Client::new(),
        }
    }

    async fn send(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        let r = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .header("Authorization", format!("token {ADMIN_TOKEN}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: the hub did not answer: {e}"));
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Creates `user` and asks for their default server.
    async fn spawn(&self, user: &str) {
        let (status, body) = self
            .send(reqwest::Method::POST, &format!("/users/{user}"))
            .await;
        assert_eq!(status, 201, "creating {user} in the hub: {body}");
        let (status, body) = self
            .send(reqwest::Method::POST, &format!("/users/{user}/server"))
            .await;
        assert!(
            status == 201 || status == 202,
            "starting {user}'s server: {status} {body}"
        );
    }

    /// `GET /users/<user>`.
    async fn user(&self, user: &str) -> Value {
        let (status, body) = self
            .send(reqwest::Method::GET, &format!("/users/{user}"))
            .await;
        assert_eq!(status, 200, "reading {user} from the hub: {body}");
        body
    }

    /// Waits until the hub says `user`'s default server is ready.
    async fn wait_ready(&self, user: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let body = self.user(user).await;
            let server = &body["servers"][""];
            if server["ready"] == true {
                return server.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hub never reported {user}'s server ready: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// What the hub's spawn progress (`GET /users/<user>/server/progress`, an event
/// stream) said about `user`'s last spawn: the messages of its events, once it ended.
async fn progress(api: &HubApi, user: &str) -> Vec<String> {
    let r = api
        .http
        .get(format!("{}/users/{user}/server/progress", api.url))
        .header("Authorization", format!("token {ADMIN_TOKEN}"))
        .send()
        .await
        .expect("the hub answers");
    assert_eq!(r.status(), 200, "{user}'s spawn progress");
    let body = r.text().await.expect("the stream ends with the spawn");
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect()
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booked_users_hub_spawn_is_booked_and_ready(pool: PgPool) {
    let Some(hub) = HubLab::demo(pool).await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let booking = lab
        .book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    api.spawn("alice@example.com").await;
    let server = api.wait_ready("alice@example.com").await;
    let pod = lab
        .notebook("alice@example.com")
        .expect("KubeSpawner created alice's pod in jhub");
    assert_eq!(
        pod.metadata.name.as_deref(),
        Some(pod_name("alice@example.com").as_str()),
        "KubeSpawner's pod name"
    );
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("high"),
        "the webhook did not book alice's hub-spawned pod: {:?}",
        pod.metadata.labels
    );
    assert_eq!(node_of(&pod), Some("gpu-a100-0"), "not on the booked model");
    let until: DateTime<Utc> = annotation(&pod, "terminate-at")
        .expect("a booked pod carries terminate-at")
        .parse()
        .expect("a time");
    assert_eq!(until.timestamp(), booking.end.timestamp());
    assert_eq!(gpus(&pod), 1);
    // The hub's record of the server is that pod.
    assert_eq!(
        server["state"]["pod_name"].as_str(),
        pod.metadata.name.as_deref(),
        "{server}"
    );
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn an_unbooked_users_hub_spawn_is_lent_and_ready(pool: PgPool) {
    let Some(hub) = HubLab::demo(pool).await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    api.spawn("bob@example.com").await;
    api.wait_ready("bob@example.com").await;
    let pod = lab.notebook("bob@example.com").expect("bob's pod");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("low"),
        "bob's hub-spawned pod should be lent a free card: {:?}",
        pod.metadata.labels
    );
    assert!(on_gpu(&pod), "bob's lent pod runs without its GPU");
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn with_nothing_free_the_hub_spawn_runs_on_cpu(pool: PgPool) {
    let Some(hub) =
        HubLab::start(pool, crate::e2e_spawn::a100_lab(), jupyterhub::free_port()).await
    else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    // Both A100s are booked and held.
    for user in ["alice@example.com", "carol@example.com"] {
        lab.book_and_run(user, "a100").await;
    }
    lab.wait_in_use("a100", 2).await;
    api.spawn("bob@example.com").await;
    api.wait_ready("bob@example.com").await;
    let pod = lab.notebook("bob@example.com").expect("bob's pod");
    assert_eq!(gpus(&pod), 0, "bob's pod kept its GPU with nothing free");
    assert!(
        annotation(&pod, GPU_REMOVED_ANNOTATION).is_some(),
        "the stripped pod does not say why: {:?}",
        pod.metadata.annotations
    );
    let warnings = lab.sim.admission_warnings(&pod_name("bob@example.com"));
    assert!(
        !warnings.is_empty(),
        "the API server sent KubeSpawner no warning"
    );
    // KubeSpawner's progress is made of the pod's Events; the admission warning
    // travels as the create's `Warning` response header, which its client does not
    // read, so the hub's progress cannot show it.
    let messages = progress(api, "bob@example.com").await;
    assert!(
        messages.iter().any(|m| m.contains("ready")),
        "the hub's progress never said the server is ready: {messages:?}"
    );
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn at_a_bookings_end_hub_restart_brings_the_hubs_server_back_unbooked(pool: PgPool) {
    // The lab in `hub-restart` mode, the hub's Service pointing at the port the real
    // hub will take, the Secret holding the controller service's token.
    let port = jupyterhub::free_port();
    let secret = tempfile::tempdir().expect("a folder");
    std::fs::write(secret.path().join("token"), CONTROLLER_TOKEN).expect("written");
    let hub_service = "http://hub.jhub.svc:8081";
    let builder = SimCluster::builder()
        .rendered_chart(chart(&[
            "controller.onExpiry=hub-restart",
            &format!("controller.hub.apiUrl={hub_service}/hub/api"),
            "controller.hub.tokenSecretName=hub-token",
        ]))
        .lab_service(hub_service, &format!("http://127.0.0.1:{port}"))
        .lab_secret("hub-token", secret.path().to_owned());
    let Some(hub) = HubLab::start(pool, builder, port).await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let user = "zoë@uni.example";
    lab.book(user, "a100", TimeDelta::seconds(5)).await;
    api.spawn(user).await;
    let first = api.wait_ready(user).await;
    let original = lab.notebook(user).expect("the booked pod");
    assert_eq!(label(&original, PRIORITY_LABEL), Some("high"));
    let original = original.metadata.uid.expect("a uid");
    // The booking ends: the controller stops and starts the server through the hub,
    // and KubeSpawner's new pod goes through the webhook, booked no longer.
    lab.expect("the hub never ran a new, unbooked pod for zoë", |s| {
        running(s, user).is_some_and(|p| {
            p.metadata.uid.as_deref() != Some(original.as_str())
                && label(&p, PRIORITY_LABEL) != Some("high")
        })
    })
    .await;
    let server = api.wait_ready(user).await;
    assert_ne!(
        server["started"], first["started"],
        "the hub did not start the server again: {server}"
    );
    let pod = lab.notebook(user).expect("the new pod");
    assert_eq!(
        server["state"]["pod_name"].as_str(),
        pod.metadata.name.as_deref(),
        "{server}"
    );
    hub.shutdown().await;
}
