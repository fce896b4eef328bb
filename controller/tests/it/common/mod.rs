//! Test fixtures: a fake of the booking service (in-process, no socket, so tests can
//! run on tokio's paused clock), pod and node builders that read like sentences, and
//! a harness that starts the controller against the fake API server.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_client::{AuditReport, HeldReport, Model, UsageReport};
use gpu_booking_controller::booking::Answer;
use gpu_booking_controller::{Booking, Controller, ControllerArgs, TokioClock};
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub const NS: &str = "jhub";

/// The start of every test's clock.
pub fn t0() -> DateTime<Utc> {
    "2026-03-02T09:00:00Z".parse().unwrap()
}

pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// What the fake booking service was told.
#[derive(Default)]
pub struct BookingState {
    pub models: Vec<Model>,
    pub usage: BTreeMap<String, UsageReport>,
    pub usage_calls: usize,
    pub audits: Vec<AuditReport>,
    /// Every held-units report, oldest first.
    pub held: Vec<HeldReport>,
}

/// A fake of the booking service: answers from memory and records every call.
#[derive(Default)]
pub struct FakeBooking {
    state: Mutex<BookingState>,
    notify: Notify,
}

impl FakeBooking {
    pub fn with_models(models: Value) -> Arc<Self> {
        let fake = Self::default();
        fake.state().models = serde_json::from_value(models).unwrap();
        Arc::new(fake)
    }

    pub fn state(&self) -> MutexGuard<'_, BookingState> {
        self.state.lock().unwrap()
    }

    pub async fn wait_until(&self, mut condition: impl FnMut(&BookingState) -> bool) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition(&self.state()) {
                return;
            }
            notified.await;
        }
    }

    fn changed<T>(&self, value: T) -> T {
        self.notify.notify_waiters();
        value
    }
}

impl Booking for FakeBooking {
    fn models(&self) -> Answer<'_, Vec<Model>> {
        let models = self.state().models.clone();
        Box::pin(async move { Ok(models) })
    }

    fn put_usage<'a>(&'a self, model: &'a str, report: &'a UsageReport) -> Answer<'a, ()> {
        let mut state = self.state();
        state.usage_calls += 1;
        state.usage.insert(model.to_owned(), report.clone());
        drop(state);
        self.changed(());
        Box::pin(async { Ok(()) })
    }

    fn put_held<'a>(&'a self, held: &'a HeldReport) -> Answer<'a, ()> {
        self.state().held.push(held.clone());
        self.changed(());
        Box::pin(async { Ok(()) })
    }

    fn audit<'a>(&'a self, report: &'a AuditReport) -> Answer<'a, i64> {
        let mut state = self.state();
        state.audits.push(report.clone());
        let id = state.audits.len() as i64;
        drop(state);
        self.changed(());
        Box::pin(async move { Ok(id) })
    }
}

/// The usual models: an A100 by product, an RTX A6000 by product, a MIG profile by
/// its own resource.
pub fn models() -> Value {
    json!([
        {"name": "a100", "patterns": ["*A100*"], "position": 0},
        {"name": "a6000", "patterns": ["*A6000*"], "position": 1},
        {"name": "mig-1g.5gb", "patterns": [], "resource": "nvidia.com/mig-1g.5gb", "position": 2}
    ])
}

/// A pod builder: `pod("a").gpu(1).on("n1").booked_until(t)`.
pub struct PodSpec(pub Value);

pub fn pod(name: &str) -> PodSpec {
    PodSpec(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
            "labels": {"app": "jupyterhub", "hub.jupyter.org/username": "alice"},
            "annotations": {"hub.jupyter.org/username": "alice"}},
        "spec": {"containers": [{"name": "notebook", "image": "jupyter/base",
            "env": [{"name": "JUPYTERHUB_USER", "value": "alice"}],
            "resources": {"limits": {"cpu": "2"}}}]},
        "status": {"phase": "Running"}
    }))
}

impl PodSpec {
    pub fn gpu(mut self, units: u64) -> Self {
        self.0["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
            json!(units.to_string());
        self.0["spec"]["containers"][0]["resources"]["limits"]["gpu-booking.io/gpumem"] =
            json!("40960");
        self
    }
    pub fn resource(mut self, resource: &str, units: u64) -> Self {
        self.0["spec"]["containers"][0]["resources"]["limits"][resource] = json!(units.to_string());
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        self.0["spec"]["nodeName"] = json!(node);
        self
    }
    pub fn booked_until(mut self, at: DateTime<Utc>) -> Self {
        self.0["metadata"]["labels"]["gpu-booking.io/priority"] = json!("high");
        self.0["metadata"]["labels"]["gpu-booking.io/booking"] = json!("7");
        self.0["metadata"]["labels"]["gpu-booking.io/model"] = json!("a100");
        self.0["metadata"]["annotations"]["terminate-at"] = json!(rfc3339(at));
        self.0["spec"]["priorityClassName"] = json!("gpu-booking-high");
        self.0["spec"]["priority"] = json!(1000);
        self.0["spec"]["nodeSelector"] = json!({"gpu-booking.io/model": "a100"});
        self
    }
    pub fn low_priority(mut self, model: &str) -> Self {
        self.0["metadata"]["labels"]["gpu-booking.io/priority"] = json!("low");
        self.0["metadata"]["labels"]["gpu-booking.io/model"] = json!(model);
        self
    }
    /// As the webhook admits a booked pod: the label, our high class, and the
    /// priority the API server resolves from it (the controller believes the label
    /// only with both: anyone can write a label, not our class).
    pub fn high_priority(mut self, model: &str) -> Self {
        self.0["metadata"]["labels"]["gpu-booking.io/priority"] = json!("high");
        self.0["metadata"]["labels"]["gpu-booking.io/model"] = json!(model);
        self.0["spec"]["priorityClassName"] = json!("gpu-booking-high");
        self.0["spec"]["priority"] = json!(1000);
        self
    }
    /// The node agent's report of its last GPU activity.
    pub fn last_gpu_activity(mut self, at: DateTime<Utc>) -> Self {
        self.0["metadata"]["annotations"]["gpu-booking.io/last-gpu-activity"] = json!(rfc3339(at));
        self
    }
    pub fn started(mut self, at: DateTime<Utc>) -> Self {
        self.0["status"]["startTime"] = json!(rfc3339(at));
        self
    }
    pub fn owned_by_statefulset(mut self) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
            "name": "s", "uid": "owner-uid", "controller": true}]);
        self
    }
    pub fn pending_unschedulable(mut self) -> Self {
        if let Some(spec) = self.0["spec"].as_object_mut() {
            spec.remove("nodeName");
        }
        self.0["status"] = json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        self
    }
    pub fn preempted_by_scheduler(mut self) -> Self {
        self.0["status"]["conditions"] = json!([
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]);
        self
    }
    /// A booked pod the scheduler cannot place (as the webhook admits it: the
    /// model's node selector, the high class).
    pub fn booked_pending(self, model: &str) -> Self {
        let mut p = self.high_priority(model).pending_unschedulable();
        p.0["spec"]["nodeSelector"] = json!({"gpu-booking.io/model": model});
        p.0["spec"]["priorityClassName"] = json!("gpu-booking-high");
        p
    }
    pub fn put(self, server: &FakeApiServer) -> Pod {
        server.put(&serde_json::from_value::<Pod>(self.0).unwrap())
    }
}

pub fn node(
    server: &FakeApiServer,
    name: &str,
    product: Option<&str>,
    allocatable: &[(&str, u64)],
) -> Node {
    let labels: Vec<(&str, &str)> = product
        .map(|p| ("nvidia.com/gpu.product", p))
        .into_iter()
        .collect();
    gpu_node(server, name, &labels, allocatable)
}

/// A node with GPU feature discovery's labels, as on a real cluster.
pub fn gpu_node(
    server: &FakeApiServer,
    name: &str,
    gfd_labels: &[(&str, &str)],
    allocatable: &[(&str, u64)],
) -> Node {
    let labels: serde_json::Map<String, Value> = gfd_labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let alloc: serde_json::Map<String, Value> = allocatable
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_string())))
        .collect();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": alloc}});
    server.put(&serde_json::from_value::<Node>(node).unwrap())
}

pub struct Harness {
    pub server: FakeApiServer,
    pub booking: Arc<FakeBooking>,
    pub clock: TokioClock,
    pub args: ControllerArgs,
}

impl Harness {
    pub fn new() -> Self {
        // Logs only when asked for (RUST_LOG=debug cargo test -- --nocapture).
        if std::env::var_os("RUST_LOG").is_some() {
            gpu_booking_process::init_logging(gpu_booking_process::LogFormat::Plain);
        }
        let server = FakeApiServer::new();
        let clock = TokioClock::starting_at(t0());
        let c = clock;
        server.set_clock(move || gpu_booking_controller::Clock::now(&c));
        let mut args = ControllerArgs::with_defaults("http://booking.invalid");
        args.identity = Some("controller-0".into());
        // Victims end at once unless a test gives them a warning period.
        args.preemption_grace = std::time::Duration::ZERO;
        Self {
            server,
            booking: FakeBooking::with_models(models()),
            clock,
            args,
        }
    }

    pub fn start(&self) -> Controller {
        Controller::start(
            self.server.client(),
            self.booking.clone(),
            Arc::new(self.clock),
            &self.args,
        )
        .unwrap()
    }

    pub fn now(&self) -> DateTime<Utc> {
        gpu_booking_controller::Clock::now(&self.clock)
    }

    pub fn after(&self, d: TimeDelta) -> DateTime<Utc> {
        self.now() + d
    }

    pub fn pod(&self, name: &str) -> Option<Pod> {
        self.server.get::<Pod>(Some(NS), name)
    }

    pub fn pod_json(&self, name: &str) -> Option<Value> {
        self.server.get_value("v1", "pods", Some(NS), name)
    }

    /// Waits (in virtual time, at most a virtual day) until `condition` holds.
    pub async fn wait(&self, condition: impl FnMut(&FakeApiServer) -> bool) {
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(86_400),
            self.server.wait_until(condition),
        );
        waited
            .await
            .expect("condition not met within a virtual day");
    }

    pub async fn wait_booking(&self, condition: impl FnMut(&BookingState) -> bool) {
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(86_400),
            self.booking.wait_until(condition),
        );
        waited
            .await
            .expect("booking condition not met within a virtual day");
    }

    /// The events.k8s.io Events on pods of this name, as `reason: note`.
    pub fn events_on(&self, name: &str) -> Vec<String> {
        self.server
            .list::<k8s_openapi::api::events::v1::Event>(Some(NS))
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default()
                )
            })
            .collect()
    }

    /// Pods of the test namespace being deleted (or deleted) so far.
    pub fn deletes(&self) -> u64 {
        self.server
            .count(gpu_booking_fake_apiserver::Verb::Delete, "pods")
    }

    pub async fn until_deleting(&self, name: &str) {
        self.wait(|s| {
            s.get::<Pod>(Some(NS), name)
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await;
    }

    /// Waits until a pod of this name with another uid exists.
    pub async fn until_replaced(&self, name: &str, old_uid: &str) {
        self.wait(|s| {
            s.get::<Pod>(Some(NS), name)
                .is_some_and(|p| p.metadata.uid.as_deref() != Some(old_uid))
        })
        .await;
    }

    /// Lets the controller run for `d` of (paused) time.
    pub async fn run_for(&self, d: std::time::Duration) {
        tokio::time::sleep(d).await;
    }
}
