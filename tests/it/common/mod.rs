//! The end-to-end harness: the real booking API on the test's Postgres database and
//! the simulated lab cluster (`gpu-booking-sim`: fake API server scheduling and
//! admitting as Kubernetes does, the real webhook over HTTPS, the real controller).
//! Scenarios book through the REST API, spawn as JupyterHub does and assert on the
//! cluster's final state; a wait that times out names what the cluster got wrong and
//! shows the cluster as it was.
#![allow(dead_code)]

#[path = "../../support/ports.rs"]
pub mod ports;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_api::auth::Role;
use gpu_booking_controller::ControllerArgs;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_fake_apiserver::FakeApiServer;
use gpu_booking_sim::models::{declare, DEMO_MODELS};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{ApiServer, BookingService, RenderedChart, SimBuilder, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use sqlx::PgPool;

/// How long a scenario waits for the cluster to settle before it fails (a bound on
/// liveness, not a timing assertion: the controller acts within a second or two).
pub const SETTLE: Duration = Duration::from_secs(30);
/// Grace period of the notebooks in tests (KubeSpawner's `extra_pod_config`): short,
/// so that preempted and expired pods are gone quickly.
pub const GRACE_SECONDS: i64 = 1;

/// A controller replica that elects a leader (`identity`), with a short Lease: the
/// successor of one killed leads within seconds.
pub fn leader_elected(identity: &'static str) -> impl FnOnce(&mut ControllerArgs) + Send + 'static {
    move |args| {
        args.leader_elect = true;
        args.identity = Some(identity.into());
        args.lease_duration = Duration::from_secs(3);
        args.lease_renew = Duration::from_millis(500);
    }
}

pub struct Lab {
    pub api: ApiServer,
    pub sim: SimCluster,
    admin: String,
    http: reqwest::Client,
    /// Fails the scenario, at its end, if the API server refused any request.
    _no_denials: NoDenials,
}

/// At the end of a scenario (its `Lab` dropped or shut down): every request the
/// components made was one the chart's RBAC allows, else the scenario fails naming
/// the refused requests.
struct NoDenials(FakeApiServer);

impl Drop for NoDenials {
    fn drop(&mut self) {
        if let Some(denied) = denied(&self.0) {
            if !std::thread::panicking() {
                panic!("{denied}");
            }
        }
    }
}

/// What the API server refused, as a scenario's failure names it; `None` when it
/// refused nothing.
fn denied(server: &FakeApiServer) -> Option<String> {
    let denials = server.denials();
    if denials.is_empty() {
        return None;
    }
    let list: Vec<String> = denials.iter().map(|d| format!("  - {d}")).collect();
    Some(format!(
        "the API server refused {} request(s) that the chart's RBAC does not grant:\n{}",
        denials.len(),
        list.join("\n")
    ))
}

/// The chart as `helm template` renders it for the lab, with `set_values`
/// (`key=value`), for [`SimBuilder::rendered_chart`].
pub fn chart(set_values: &[&str]) -> RenderedChart {
    RenderedChart::render(set_values).expect("the chart renders (helm: scripts/chart-tools.sh)")
}

/// Polls `probe` every 100 ms until it answers `Ok`, and returns that; after
/// [`SETTLE`] fails with its last `Err` (what was wrong, and the state that shows it).
/// For state with no change feed to wait on: the booking service, the database, the
/// nodes' processes.
pub async fn eventually<T, F, Fut>(mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        match probe().await {
            Ok(found) => return found,
            Err(wrong) if tokio::time::Instant::now() >= deadline => panic!("{wrong}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A booking as the API returns it.
#[derive(Debug, Clone)]
pub struct Booking {
    pub id: i64,
    pub end: DateTime<Utc>,
}

impl Lab {
    /// The demo lab (2 x A100 on one node, 2 x 2 RTX A6000, a CPU node).
    pub async fn start(pool: PgPool) -> Lab {
        Lab::start_with(pool, SimCluster::builder()).await
    }

    /// The lab of `builder`, installed as the chart renders it with the lab's values,
    /// unless the builder was given a chart already.
    pub async fn start_with(pool: PgPool, builder: SimBuilder) -> Lab {
        let builder = if builder.has_rendered_chart() {
            builder
        } else {
            builder.rendered_chart(chart(&[]))
        };
        if std::env::var_os("RUST_LOG").is_some() {
            gpu_booking_api::config::init_logging(gpu_booking_api::config::LogFormat::Plain);
        }
        // The lab's components authenticate with their ServiceAccount tokens, which
        // the API verifies by TokenReview against the lab's API server.
        let api = ApiServer::start(
            pool.clone(),
            Policy::default(),
            Arc::new(gpu_booking_api::clock::SystemClock),
            Some(
                builder
                    .service_accounts()
                    .expect("the chart configures the API for ServiceAccount tokens"),
            ),
        )
        .await
        .expect("the booking API starts");
        let grace = builder.grace_period().unwrap_or(GRACE_SECONDS);
        let builder = builder.notebook_grace_period(grace).controller(|args| {
            args.preemption_interval = Duration::from_millis(200);
            // A successor replica takes over within seconds of its leader's end.
            args.lease_duration = Duration::from_secs(3);
            args.lease_renew = Duration::from_millis(500);
            // The backstop of the webhook's lend ledger acts within a test's wait.
            args.lent_pending_grace = Duration::from_secs(3);
        });
        declare(&pool, &DEMO_MODELS, builder.lab_nodes())
            .await
            .expect("the lab's models are declared");
        let sim = builder
            .start(BookingService {
                url: api.url.clone(),
            })
            .await
            .expect("the simulated cluster starts");
        sim.controller_ready(SETTLE)
            .await
            .expect("the controller is ready");
        let lab = Lab {
            api,
            _no_denials: NoDenials(sim.server.clone()),
            sim,
            admin: String::new(),
            http: reqwest::Client::new(),
        };
        let admin = lab
            .api
            .token("admin@example.com", Some(Role::Admin))
            .unwrap();
        let lab = Lab { admin, ..lab };
        lab.wait_reported().await;
        // ... and until the webhook's replica has read those reports (it refreshes
        // its figures on its own clock): a first spawn would find no budget otherwise.
        // Not asserted: a scenario may give the webhook no time to read anything
        // (`--booking-timeout=1ms`), and it then waits this long for nothing.
        if let Some(replica) = lab.sim.webhook_replica().await {
            replica.refreshed(Duration::from_secs(5)).await;
        }
        lab
    }

    /// `GET /api/v1/models` as the admin.
    pub async fn models(&self) -> Vec<Value> {
        let models: Value = self
            .http
            .get(format!("{}/api/v1/models", self.api.url))
            .bearer_auth(&self.admin)
            .send()
            .await
            .expect("the booking API answers")
            .json()
            .await
            .expect("models as JSON");
        models.as_array().cloned().unwrap_or_default()
    }

    /// Waits until the controller has reported every model's usage with the VRAM
    /// budget advertised, as a cluster that has run for a while has: the webhook gives
    /// budgets only for models whose nodes advertise it.
    async fn wait_reported(&self) {
        eventually(|| async {
            let models = self.models().await;
            let reported = |m: &Value| {
                !m["usage_reported_at"].is_null()
                    && (m["cards"] == 0 || m["gpumem_advertised"] == true)
            };
            if models.iter().all(reported) {
                return Ok(());
            }
            Err(format!(
                "the controller never reported the lab's models with their VRAM budget advertised: {models:?}"
            ))
        })
        .await
    }

    /// Books `model` for `user` from now for `length` (as an admin, overriding the
    /// minimum duration so that tests can watch a booking end).
    pub async fn book(&self, user: &str, model: &str, length: TimeDelta) -> Booking {
        let start = Utc::now() - TimeDelta::seconds(1);
        let resp = self
            .http
            .post(format!("{}/api/v1/bookings", self.api.url))
            .bearer_auth(&self.admin)
            .json(&json!({"model": model, "user": user, "start": start,
                "end": start + length + TimeDelta::seconds(1), "override": true}))
            .send()
            .await
            .expect("the booking API answers");
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(
            status.is_success(),
            "booking {model} for {user}: {status} {body}"
        );
        let booking = Booking {
            id: body["id"].as_i64().expect("a booking id"),
            end: body["end"].as_str().unwrap().parse().unwrap(),
        };
        // The webhook decides from its replica, which the change stream feeds within
        // a moment: a user who spawns right after booking waits for it, as here.
        self.webhook_sees(booking.id, |b| b.is_some()).await;
        booking
    }

    /// Waits until the webhook's replica has read the booking service's figures
    /// (free units, units held) again; at once when it runs without one.
    pub async fn webhook_refreshed(&self) {
        if let Some(replica) = self.sim.webhook_replica().await {
            assert!(
                replica.refreshed(Duration::from_secs(10)).await,
                "the webhook's replica did not refresh within 10 s"
            );
        }
    }

    /// Waits (at most 10 s) until the webhook's replica holds booking `id` as
    /// `holds` says; at once when the webhook runs without one.
    pub async fn webhook_sees(
        &self,
        id: i64,
        holds: impl Fn(Option<&gpu_booking_core::admission::replica::BookingState>) -> bool,
    ) {
        let Some(replica) = self.sim.webhook_replica().await else {
            return;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !holds(replica.booking(id).as_ref()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "booking {id} did not reach the webhook's replica within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends a running booking now (`DELETE /api/v1/bookings/{id}`).
    pub async fn end_early(&self, booking: &Booking) {
        let resp = self
            .http
            .delete(format!("{}/api/v1/bookings/{}", self.api.url, booking.id))
            .bearer_auth(&self.admin)
            .send()
            .await
            .expect("the booking API answers");
        assert!(
            resp.status().is_success(),
            "ending booking {}: {}",
            booking.id,
            resp.status()
        );
        let now = Utc::now();
        self.webhook_sees(booking.id, |b| b.is_none_or(|b| b.end <= now))
            .await;
    }

    /// Model `name` as the booking service lists it, if declared.
    pub async fn model(&self, name: &str) -> Option<Value> {
        self.models().await.into_iter().find(|m| m["name"] == name)
    }

    /// Waits until the controller has told the booking service how many units of
    /// `model` are in use (the webhook's "free" count comes from there).
    pub async fn wait_in_use(&self, model: &str, in_use: i64) {
        eventually(|| async {
            let found = self.model(model).await.map(|m| m["in_use"].clone());
            if found.as_ref().and_then(Value::as_i64) == Some(in_use) {
                return Ok(());
            }
            Err(format!(
                "the controller never reported {in_use} units of {model} in use (the booking service says {found:?})"
            ))
        })
        .await;
        self.webhook_refreshed().await;
    }

    /// Waits until the webhook's lend ledger has let go of every GPU admission on
    /// `model` up to `admitted` (a pod's creation): a usage report counted the
    /// webhook's `--lend-settle` (3 s) after it has reached the webhook's replica.
    /// Until then a report that already counts such a pod is read with the
    /// admission still subtracted, and a spawn can be refused the model's last card
    /// (the ledger errs on the side of no GPU): scenarios that lend cards one after
    /// another wait for this in between.
    pub async fn lends_settled(&self, model: &str, admitted: DateTime<Utc>) {
        let settled = admitted + TimeDelta::seconds(3);
        eventually(|| async {
            let reported = self.model(model).await.and_then(|m| {
                serde_json::from_value::<DateTime<Utc>>(m["usage_reported_at"].clone()).ok()
            });
            if reported.is_some_and(|at| at >= settled) {
                return Ok(());
            }
            Err(format!(
                "no usage report of {model} counted after {settled} (the last: {reported:?})"
            ))
        })
        .await;
        self.webhook_refreshed().await;
    }

    /// Waits until `condition` holds; otherwise fails with `wrong` (what the cluster
    /// got wrong) and the cluster as it was.
    /// A refused request ends the wait at once and fails with the refusals.
    pub async fn expect(&self, wrong: &str, mut condition: impl FnMut(&FakeApiServer) -> bool) {
        let mut held = false;
        let settled = self
            .sim
            .wait_until(SETTLE, |s| {
                held = condition(s);
                held || !s.denials().is_empty()
            })
            .await;
        if let Some(denied) = denied(&self.sim.server) {
            panic!("{wrong}: {denied}");
        }
        if !(settled && held) {
            panic!(
                "{wrong}\ncluster after {SETTLE:?}:\n{}",
                serde_json::to_string_pretty(&self.sim.view()).unwrap_or_default()
            );
        }
    }

    pub fn notebook(&self, user: &str) -> Option<Pod> {
        self.sim.notebook(user)
    }

    /// `user` spawns, is lent a card, and the notebook runs on it: the pod.
    pub async fn lent_and_running(&self, user: &str) -> Pod {
        let pod = self.sim.spawn(user, 1).await.expect("admitted");
        assert_eq!(
            label(&pod, gpu_booking_core::admission::PRIORITY_LABEL),
            Some("low"),
            "{user} should be lent a free card"
        );
        self.expect(&format!("{user}'s lent notebook never ran on a GPU"), |s| {
            running(s, user).is_some_and(|p| on_gpu(&p))
        })
        .await;
        self.notebook(user).expect("the lent notebook runs")
    }

    /// Books `model` for `user` (two hours from now), spawns their notebook and waits
    /// until it runs on a GPU.
    pub async fn book_and_run(&self, user: &str, model: &str) -> Booking {
        let booking = self.book(user, model, TimeDelta::hours(2)).await;
        self.sim.spawn(user, 1).await.expect("admitted");
        self.expect(
            &format!("{user}'s booked notebook never ran on a GPU"),
            |s| running(s, user).is_some_and(|p| on_gpu(&p)),
        )
        .await;
        booking
    }

    pub async fn shutdown(self) {
        self.sim.shutdown().await;
        self.api.stop().await;
    }
}

/// The pod's node, if bound.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

pub fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod.metadata.deletion_timestamp.is_none()
}

pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// GPUs the pod asks for.
pub fn gpus(pod: &Pod) -> u64 {
    gpu_booking_sim::view::gpus_of(pod)
}

/// Whether the pod asks for a GPU and is bound to a GPU node of the lab.
pub fn on_gpu(pod: &Pod) -> bool {
    gpus(pod) > 0 && node_of(pod).is_some_and(|n| n.starts_with("gpu-"))
}

/// `user`'s notebook, running (bound, started, not terminating).
pub fn running(server: &FakeApiServer, user: &str) -> Option<Pod> {
    server
        .get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
        .filter(is_running)
}
