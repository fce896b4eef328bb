//! End to end, on the simulated lab with a real JupyterHub in front of it: KubeSpawner
//! (PyPI `jupyterhub-kubespawner`, tests/support/jupyterhub.rs) spawns into namespace
//! `jhub` over the lab's HTTPS API server as the hub's ServiceAccount, the webhook's
//! trusted spawner, as zero-to-jupyterhub runs it; the webhook admits its pods, and
//! both the cluster's view and the hub's (`GET /hub/api/users/X`) are checked: a
//! booked, a lent and a stripped spawn (the reason in the hub's spawn progress), a
//! booking's end under each `--on-expiry` mode, a lent server giving its GPU back to a
//! booked spawn, the spawn form's availability, a named server and a hub restart.
//! Each scenario starts its own lab and hub (a few seconds); docs/simulated-cluster.md
//! lists them.

use std::time::Duration;

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::{GPU_REMOVED_ANNOTATION, PREEMPT_AT_ANNOTATION, PRIORITY_LABEL};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{SimBuilder, SimCluster};
use serde_json::Value;
use sqlx::PgPool;

#[path = "../support/jupyterhub.rs"]
pub(crate) mod jupyterhub;

use jupyterhub::{HubSession, RealHub, ADMIN_TOKEN, CONTROLLER_TOKEN};

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
        Self::start_with(pool, builder, port, |_| Vec::new()).await
    }

    /// [`HubLab::start`] with more of the hub config's environment, from the lab.
    async fn start_with(
        pool: PgPool,
        builder: SimBuilder,
        port: u16,
        env: impl FnOnce(&Lab) -> Vec<(&'static str, String)>,
    ) -> Option<HubLab> {
        let program = jupyterhub::program()?;
        let lab = Lab::start_with(pool, builder).await;
        let dir = tempfile::tempdir().expect("a folder");
        let kubeconfig = dir.path().join("hub-kubeconfig");
        lab.sim
            .write_hub_kubeconfig(&kubeconfig)
            .expect("the hub's kubeconfig is written");
        let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path").to_owned();
        let mut vars = vec![
            ("HUB_SPAWNER", "kube".to_owned()),
            ("KUBECONFIG", kubeconfig),
            ("HUB_POD_GRACE_SECONDS", GRACE_SECONDS.to_string()),
        ];
        vars.extend(env(&lab));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let hub = RealHub::start_on(&program, port, None, &vars).await;
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
        self.wait_server(user, "", "ready", |s| s["ready"] == true)
            .await
    }

    /// Waits until the hub's record of `user`'s server `name` (`""`: the default)
    /// satisfies `condition` (given `Null` when there is none); fails saying the hub
    /// never reported it `what`.
    async fn wait_server(
        &self,
        user: &str,
        name: &str,
        what: &str,
        condition: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let body = self.user(user).await;
            let server = &body["servers"][name];
            if condition(server) {
                return server.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hub never reported {user}'s server {name:?} {what}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts `user`'s (existing) named server `name`.
    async fn spawn_named(&self, user: &str, name: &str) {
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                &format!("/users/{user}/servers/{name}"),
            )
            .await;
        assert!(
            status == 201 || status == 202,
            "starting {user}'s server {name}: {status} {body}"
        );
    }
}

/// The hub's poll interval in the scenarios that watch what the hub makes of a pod
/// changed behind its back (`HUB_POLL_SECONDS`; JupyterHub's default is 30 s).
const POLL_SECONDS: u64 = 1;

/// Lets the hub poll every server a few times (its poll has no outward sign to wait
/// for: a server found gone is only then stopped).
async fn hub_polled() {
    tokio::time::sleep(Duration::from_millis(POLL_SECONDS * 2_500)).await;
}

impl HubApi {
    /// Creates `user`, starts their default server and reads the hub's spawn
    /// progress (`GET /users/<user>/server/progress`, an event stream) while it
    /// starts: the messages of its events, to the last. KubeSpawner makes them of
    /// the pod's Events; once a server is ready the hub's progress says only that,
    /// so the stream is opened as soon as the spawn is pending.
    async fn spawn_watching(&self, user: &str) -> Vec<String> {
        let (status, body) = self
            .send(reqwest::Method::POST, &format!("/users/{user}"))
            .await;
        assert_eq!(status, 201, "creating {user} in the hub: {body}");
        let (http, url) = (self.http.clone(), self.url.clone());
        let path = format!("/users/{user}/server");
        let start = tokio::spawn(async move {
            http.post(format!("{url}{path}"))
                .header("Authorization", format!("token {ADMIN_TOKEN}"))
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let body = loop {
            let r = self
                .http
                .get(format!("{}/users/{user}/server/progress", self.url))
                .header("Authorization", format!("token {ADMIN_TOKEN}"))
                .send()
                .await
                .expect("the hub answers");
            // 400 until the spawn is pending.
            if r.status() == 200 {
                break r.text().await.expect("the stream ends with the spawn");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hub never said {user}'s spawn was pending: {}",
                r.status()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let status = start.await.expect("joined").expect("the hub answers");
        assert!(
            status == 201 || status == 202,
            "starting {user}'s server: {status}"
        );
        let messages: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|e| e["message"].as_str().map(str::to_owned))
            .collect();
        assert!(
            messages.len() > 1,
            "{user}'s spawn was over before its progress could be read: {messages:?}"
        );
        messages
    }
}

/// How long alice's booking lasts in the scenarios of a booking's end: her spawn
/// is admitted and reported ready well within it, on a loaded machine too (at 6 s
/// the booking ended once before the hub saw her server answer, and the hub took
/// the copy's start for her server stopping).
const SHORT_BOOKING: TimeDelta = TimeDelta::seconds(15);

/// The demo lab with `controller.onExpiry=<on_expiry>`, a hub polling its servers
/// every [`POLL_SECONDS`], and alice's server spawned through it on an a100 booked
/// for [`SHORT_BOOKING`], checked booked in the cluster and ready in the hub: the
/// lab, her booked pod's uid and the hub's record of her server.
async fn booked_through_the_hub(pool: PgPool, on_expiry: &str) -> Option<(HubLab, String, Value)> {
    let builder =
        SimCluster::builder().rendered_chart(chart(&[&format!("controller.onExpiry={on_expiry}")]));
    let hub = HubLab::start_with(pool, builder, jupyterhub::free_port(), |_| {
        vec![("HUB_POLL_SECONDS", POLL_SECONDS.to_string())]
    })
    .await?;
    let (lab, api) = (&hub.lab, &hub.api);
    let user = "alice@example.com";
    let booking = lab.book(user, "a100", SHORT_BOOKING).await;
    api.spawn(user).await;
    let server = api.wait_ready(user).await;
    let pod = lab
        .notebook(user)
        .expect("KubeSpawner created alice's pod in jhub");
    assert_eq!(
        pod.metadata.name.as_deref(),
        Some(pod_name(user).as_str()),
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
    let uid = pod.metadata.uid.expect("a uid");
    Some((hub, uid, server))
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booked_hub_spawn_is_booked_and_runs_on_cpu_after_its_booking(pool: PgPool) {
    let Some((hub, booked, first)) = booked_through_the_hub(pool, "recreate-cpu").await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let user = "alice@example.com";
    lab.expect(
        "alice's booked pod was not recreated on CPU at its end",
        |s| {
            running(s, user).is_some_and(|p| {
                p.metadata.uid.as_deref() != Some(booked.as_str())
                    && gpus(&p) == 0
                    && annotation(&p, GPU_REMOVED_ANNOTATION).is_some()
            })
        },
    )
    .await;
    let copy = lab.notebook(user).expect("the copy").metadata.uid;
    // The hub, polling KubeSpawner, finds a pod of that name running: the same server,
    // which it did not stop (stopping it would have deleted the copy).
    hub_polled().await;
    let server = api.wait_ready(user).await;
    assert_eq!(
        server["started"], first["started"],
        "the hub started alice's server again instead of keeping it: {server}"
    );
    assert_eq!(
        lab.notebook(user).and_then(|p| p.metadata.uid),
        copy,
        "the hub stopped (deleted) alice's CPU copy"
    );
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn at_a_bookings_end_delete_stops_the_hubs_server(pool: PgPool) {
    let Some((hub, _, _)) = booked_through_the_hub(pool, "delete").await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let user = "alice@example.com";
    lab.expect("alice's booked pod was not deleted at its end", |s| {
        s.get::<k8s_openapi::api::core::v1::Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
            .is_none()
    })
    .await;
    // The hub's poll finds the pod gone: the server stopped.
    api.wait_server(user, "", "stopped once its pod was deleted", Value::is_null)
        .await;
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn at_a_bookings_end_demote_keeps_the_hubs_server_on_a_lent_gpu(pool: PgPool) {
    let Some((hub, booked, first)) = booked_through_the_hub(pool, "demote").await else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let user = "alice@example.com";
    lab.expect(
        "alice's booked pod was not demoted to a lent one at its end",
        |s| {
            running(s, user).is_some_and(|p| {
                p.metadata.uid.as_deref() != Some(booked.as_str())
                    && label(&p, PRIORITY_LABEL) == Some("low")
                    && on_gpu(&p)
            })
        },
    )
    .await;
    let copy = lab.notebook(user).expect("the lent copy").metadata.uid;
    hub_polled().await;
    let server = api.wait_ready(user).await;
    assert_eq!(
        server["started"], first["started"],
        "the hub started alice's server again instead of keeping it: {server}"
    );
    assert_eq!(
        lab.notebook(user).and_then(|p| p.metadata.uid),
        copy,
        "the hub stopped (deleted) alice's lent copy"
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
    // The server answers 2 s after its pod runs, as a real one does: the hub's
    // progress shows the pod's Events while the spawn lasts.
    let Some(hub) = HubLab::start_with(
        pool,
        crate::e2e_spawn::a100_lab(),
        jupyterhub::free_port(),
        |_| vec![("HUB_START_SECONDS", "2".to_owned())],
    )
    .await
    else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    // Both A100s are booked and held.
    for user in ["alice@example.com", "carol@example.com"] {
        lab.book_and_run(user, "a100").await;
    }
    lab.wait_in_use("a100", 2).await;
    let messages = api.spawn_watching("bob@example.com").await;
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
    // KubeSpawner's progress is made of the pod's Events: the admission warning
    // (the create's `Warning` header, which its client does not read) reaches the
    // user there as the controller's Warning Event.
    assert!(
        messages.iter().any(|m| m
            .contains("[Warning] gpu-booking: GPU removed (no free GPU and no active booking)")),
        "the hub's spawn progress does not show why bob's GPU was removed: {messages:?}"
    );
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

#[sqlx::test(migrations = "./migrations")]
async fn a_lent_hub_server_gives_its_gpu_back_to_a_booked_spawn_after_the_grace(pool: PgPool) {
    // Both a100s lent through the hub; alice, booked, spawns through it too.
    let builder = crate::e2e_spawn::a100_lab()
        .controller(|args| args.preemption_grace = Duration::from_secs(3));
    let Some(hub) = HubLab::start_with(pool, builder, jupyterhub::free_port(), |_| {
        vec![("HUB_POLL_SECONDS", POLL_SECONDS.to_string())]
    })
    .await
    else {
        return;
    };
    let (lab, api) = (&hub.lab, &hub.api);
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        api.spawn(user).await;
        api.wait_ready(user).await;
        let pod = lab.notebook(user).expect("the lent pod");
        assert_eq!(
            label(&pod, PRIORITY_LABEL),
            Some("low"),
            "{user}'s pod is not lent"
        );
        let created = pod.metadata.creation_timestamp.expect("created").0;
        lab.lends_settled("a100", created).await;
    }
    lab.wait_in_use("a100", 2).await;
    let uids: Vec<Option<String>> = lent
        .iter()
        .map(|u| lab.notebook(u).and_then(|p| p.metadata.uid))
        .collect();
    let alice = "alice@example.com";
    lab.book(alice, "a100", TimeDelta::hours(2)).await;
    let (status, body) = api
        .send(reqwest::Method::POST, &format!("/users/{alice}"))
        .await;
    assert_eq!(status, 201, "creating alice in the hub: {body}");
    // The hub holds a start open for 10 s (slow_spawn_timeout): on its own task.
    let (http, url) = (api.http.clone(), api.url.clone());
    let start = tokio::spawn(async move {
        http.post(format!("{url}/users/{alice}/server"))
            .header("Authorization", format!("token {ADMIN_TOKEN}"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // While the lent notebook has its grace, alice's pod waits and so does her spawn.
    lab.expect("no lent pod was marked to give way to alice's", |s| {
        lent.iter()
            .any(|u| running(s, u).is_some_and(|p| annotation(&p, PREEMPT_AT_ANNOTATION).is_some()))
    })
    .await;
    let waiting = api.user(alice).await;
    assert_eq!(
        waiting["servers"][""]["pending"], "spawn",
        "the hub does not show alice's spawn waiting for the lent GPU: {waiting}"
    );
    api.wait_ready(alice).await;
    let pod = lab.notebook(alice).expect("alice's pod");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("high"),
        "alice's pod is not booked"
    );
    assert!(on_gpu(&pod), "alice's booked pod runs without its GPU");
    let status = start.await.expect("joined").expect("the hub answers");
    assert!(status == 201 || status == 202, "alice's start: {status}");
    // Exactly one lent notebook gave way, recreated on CPU; the hub keeps both
    // servers running.
    let replaced: Vec<&str> = lent
        .iter()
        .zip(&uids)
        .filter(|(u, uid)| lab.notebook(u).and_then(|p| p.metadata.uid) != **uid)
        .map(|(u, _)| *u)
        .collect();
    assert_eq!(
        replaced.len(),
        1,
        "not exactly one lent pod gave way: {replaced:?}"
    );
    let victim = replaced[0];
    lab.expect("the lent pod that gave way does not run on CPU", |s| {
        running(s, victim).is_some_and(|p| gpus(&p) == 0)
    })
    .await;
    hub_polled().await;
    for user in lent {
        api.wait_ready(user).await;
        assert!(
            lab.notebook(user).is_some(),
            "the hub stopped {user}'s server (and deleted its pod)"
        );
    }
    hub.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn the_hubs_spawn_form_named_servers_and_restart(pool: PgPool) {
    let page = "http://booking.example/";
    let Some(mut hub) = HubLab::start_with(
        pool,
        SimCluster::builder(),
        jupyterhub::free_port(),
        |lab| {
            let token = lab
                .api
                .token("jupyterhub", Some(gpu_booking_api::auth::Role::Service))
                .expect("a service token");
            vec![
                ("GPU_BOOKING_URL", lab.api.url.clone()),
                ("GPU_BOOKING_TOKEN", token),
                ("GPU_BOOKING_PAGE", page.to_owned()),
                ("HUB_POLL_SECONDS", POLL_SECONDS.to_string()),
            ]
        },
    )
    .await
    else {
        return;
    };
    let alice = "alice@example.com";
    hub.lab.book(alice, "a100", TimeDelta::hours(2)).await;
    // The spawn form: docs/jupyterhub/gpu_booking_profiles.py's profiles, rendered by
    // KubeSpawner from the booking service's availability for each user.
    for (user, shows) in [
        (alice, "Your booked a100 GPU (until"),
        ("bob@example.com", "One GPU, lent ("),
    ] {
        let (status, _) = hub
            .api
            .send(reqwest::Method::POST, &format!("/users/{user}"))
            .await;
        assert_eq!(status, 201, "creating {user}");
        let mut session = HubSession::login(&hub.hub.url, user, jupyterhub::PASSWORD).await;
        let (status, form) = session.get("/hub/spawn").await;
        assert_eq!(status, 200, "{user}'s spawn form: {form}");
        assert!(
            form.contains(shows),
            "{user}'s spawn form does not offer {shows:?}:\n{form}"
        );
        assert!(
            form.contains("CPU only"),
            "{user}'s form has no CPU profile"
        );
    }
    // Alice's default server (her form's default: the booked GPU) and a named one,
    // beyond her booking's one GPU: lent.
    let (lab, api) = (&hub.lab, &hub.api);
    let (status, body) = api
        .send(reqwest::Method::POST, &format!("/users/{alice}/server"))
        .await;
    assert!(
        status == 201 || status == 202,
        "alice's start: {status} {body}"
    );
    api.wait_ready(alice).await;
    api.spawn_named(alice, "second").await;
    let second = api
        .wait_server(alice, "second", "ready", |s| s["ready"] == true)
        .await;
    let names = [
        pod_name(alice),
        second["state"]["pod_name"]
            .as_str()
            .expect("the hub's record names the named server's pod")
            .to_owned(),
    ];
    let pod = |s: &gpu_booking_fake_apiserver::FakeApiServer, name: &str| {
        s.get::<k8s_openapi::api::core::v1::Pod>(Some(NOTEBOOK_NAMESPACE), name)
            .filter(is_running)
    };
    let second_pod = pod(&lab.sim.server, &names[1]).expect("the named server's pod runs");
    assert_eq!(
        annotation(&second_pod, "hub.jupyter.org/servername"),
        Some("second"),
        "KubeSpawner's named-server pod"
    );
    // Her booking is for one GPU: one server keeps it, the other runs on a lent one
    // (the webhook lends beyond a booking; the controller demotes a pod beyond its
    // booking's units that the webhook admitted before it counted the first).
    lab.expect(
        "alice's two servers are not one booked and one lent, both on a GPU",
        |s| {
            let standings: Vec<Option<String>> = names
                .iter()
                .map(|n| {
                    pod(s, n)
                        .filter(on_gpu)
                        .and_then(|p| label(&p, PRIORITY_LABEL).map(str::to_owned))
                })
                .collect();
            standings.contains(&Some("high".into())) && standings.contains(&Some("low".into()))
        },
    )
    .await;
    for name in ["", "second"] {
        api.wait_server(alice, name, "ready", |s| s["ready"] == true)
            .await;
    }
    let pods: Vec<k8s_openapi::api::core::v1::Pod> = names
        .iter()
        .map(|n| pod(&lab.sim.server, n).expect("running"))
        .collect();
    // The hub restarts (a new hub pod): its reflector lists the pods again and it
    // keeps both servers, their pods untouched.
    let uids: Vec<Option<String>> = pods.iter().map(|p| p.metadata.uid.clone()).collect();
    hub.hub.restart().await;
    let (lab, api) = (&hub.lab, &hub.api);
    hub_polled().await;
    for name in ["", "second"] {
        api.wait_server(alice, name, "ready after the hub's restart", |s| {
            s["ready"] == true
        })
        .await;
    }
    let after: Vec<Option<String>> = pods
        .iter()
        .map(|p| {
            lab.sim
                .server
                .get::<k8s_openapi::api::core::v1::Pod>(
                    Some(NOTEBOOK_NAMESPACE),
                    p.metadata.name.as_deref().unwrap_or_default(),
                )
                .and_then(|p| p.metadata.uid)
        })
        .collect();
    assert_eq!(
        after, uids,
        "the hub's restart replaced or deleted alice's pods"
    );
    hub.shutdown().await;
}
