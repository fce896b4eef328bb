//! The fixture corpus: realistic reviews through `POST /mutate` (the router, no
//! socket), each answer checked by applying its patch to the pod and reading the
//! result as a `k8s_openapi` Pod. One table, each case named after its situation.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use gpu_booking_core::admission::{
    is_harmless_key, is_our_key, AdmissionConfig, BookingErrorPolicy, LendLedger, SpawnerTrust,
    UnidentifiedGpuPods,
};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_webhook::{router, BookingSource, Metrics, ReviewOut, TokenSource, Webhook};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{json, Value};
use tower::ServiceExt;

const UNTIL: &str = "2099-11-30T00:00:00Z";

/// The ServiceAccount that creates JupyterHub's pods in these reviews.
const HUB: &str = "system:serviceaccount:jhub:hub";

fn config(policy: BookingErrorPolicy) -> AdmissionConfig {
    let mut cfg = AdmissionConfig {
        on_booking_error: policy,
        default_gpumem_mib: Some(8192),
        spawners: SpawnerTrust {
            users: vec![HUB.into()],
            groups: vec![],
            namespaces: vec!["jhub".into()],
        },
        ..AdmissionConfig::default()
    };
    for (model, res) in [
        ("a100", "nvidia.com/a100"),
        ("mig-1g.5gb", "nvidia.com/mig-1g.5gb"),
    ] {
        cfg.model_resources
            .insert(res.into(), ModelName::parse(model).unwrap());
    }
    cfg
}

fn webhook(
    url: &str,
    policy: BookingErrorPolicy,
    timeout: Duration,
    ttl: Duration,
) -> Arc<Webhook> {
    webhook_with(url, config(policy), timeout, ttl)
}

fn webhook_with(url: &str, cfg: AdmissionConfig, timeout: Duration, ttl: Duration) -> Arc<Webhook> {
    let metrics = Arc::new(Metrics::new());
    let booking = BookingSource::new(
        url,
        TokenSource::Static(SERVICE_TOKEN.into()),
        timeout,
        ttl,
        metrics.clone(),
    )
    .unwrap()
    // The corpus counts every audit report; the rate bound has its own test.
    .with_audit_rate(100_000, 0.0);
    Arc::new(Webhook::new(cfg, Arc::new(booking), metrics).with_ledger(no_ledger()))
}

/// Each case is decided on its stub's answer alone: the lend ledger (which would
/// carry the units lent by one case into the next) has its own tests, in core and
/// in `tests/it/e2e.rs`.
fn no_ledger() -> LendLedger {
    LendLedger::new(Duration::ZERO, Duration::ZERO)
}

async fn post(app: &axum::Router, body: Vec<u8>) -> (StatusCode, Result<ReviewOut, String>) {
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let parsed = serde_json::from_slice::<ReviewOut>(&bytes)
        .map_err(|e| format!("not a review ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, parsed)
}

// ---- pod variations -------------------------------------------------------------------

fn ks(file: &str) -> Value {
    apiserver_view(kubespawner(file), "jhub")
}

fn without_annotations(mut pod: Value) -> Value {
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    pod
}

fn without_env(mut pod: Value) -> Value {
    pod["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("env");
    pod
}

fn gpu_only_in(mut pod: Value, keep: &str) -> Value {
    let drop = if keep == "limits" {
        "requests"
    } else {
        "limits"
    };
    let res = &mut pod["spec"]["containers"][0]["resources"][drop];
    res.as_object_mut().unwrap().remove("nvidia.com/gpu");
    pod
}

fn with_resource(mut pod: Value, resource: &str) -> Value {
    for section in ["requests", "limits"] {
        let map = pod["spec"]["containers"][0]["resources"][section]
            .as_object_mut()
            .unwrap();
        map.remove("nvidia.com/gpu");
        map.insert(resource.into(), json!("1"));
    }
    pod
}

fn with_env(mut pod: Value, name: &str, value: &str) -> Value {
    let env = pod["spec"]["containers"][0]["env"].as_array_mut().unwrap();
    env.insert(3, json!({"name": name, "value": value}));
    pod
}

fn annotated(mut pod: Value, key: &str, value: &str) -> Value {
    pod["metadata"]["annotations"][key] = json!(value);
    pod
}

fn with_init_and_sidecar(mut pod: Value) -> Value {
    pod["spec"]["initContainers"] = json!([{
        "name": "warm-cache", "image": "busybox", "command": ["sh", "-c", "nvidia-smi"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File"
    }]);
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "name": "sidecar", "image": "busybox", "resources": {"limits": {"cpu": "100m"}},
            "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File"
        }));
    pod
}

fn with_hostile_identity(mut pod: Value) -> Value {
    pod["metadata"]["annotations"]["hub.jupyter.org/username"] = json!("eve\u{0}\r\nX-Injected: 1");
    pod["metadata"]["labels"]["hub.jupyter.org/username"] = json!("eve&slug=alice-40example-2ecom");
    pod
}

// ---- checks on the patched pod --------------------------------------------------------

type Check = Box<dyn Fn(&Value, &Pod) -> Result<(), String>>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn all_containers(pod: &Pod) -> Vec<&Container> {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect()
}

const GPU_KEYS: [&str; 3] = ["nvidia.com/gpu", "nvidia.com/a100", "nvidia.com/mig-1g.5gb"];

fn quantity(c: &Container, section: &str, key: &str) -> Option<String> {
    let res = c.resources.as_ref()?;
    let map = if section == "requests" {
        res.requests.as_ref()
    } else {
        res.limits.as_ref()
    }?;
    map.get(key).map(|q| q.0.clone())
}

fn gpu_units(c: &Container) -> u64 {
    GPU_KEYS
        .iter()
        .map(|k| {
            let q = quantity(c, "limits", k).or_else(|| quantity(c, "requests", k));
            q.and_then(|q| q.parse::<u64>().ok()).unwrap_or(0)
        })
        .sum()
}

/// Every GPU container carries `mib` x units on requests and limits alike, under the
/// budget resource of `model` (`gpu-booking.io/gpumem-<model>` for a model with a
/// resource of its own, else `gpu-booking.io/gpumem`).
fn budget(pod: &Pod, model: &str, mib: u64) -> Result<(), String> {
    let resource = match OWN_RESOURCES.iter().any(|(m, _)| *m == model) {
        true => format!("gpu-booking.io/gpumem-{model}"),
        false => "gpu-booking.io/gpumem".to_owned(),
    };
    let mut gpu_containers = 0;
    for c in all_containers(pod) {
        let units = gpu_units(c);
        let req = quantity(c, "requests", &resource);
        let lim = quantity(c, "limits", &resource);
        if units == 0 {
            ensure!(
                req.is_none() && lim.is_none(),
                "budget on {} without a GPU",
                c.name
            );
            continue;
        }
        gpu_containers += 1;
        let want = (mib * units).to_string();
        ensure!(
            req.as_deref() == Some(&want) && lim.as_deref() == Some(&want),
            "{}: budget {req:?}/{lim:?}, want {want}",
            c.name
        );
    }
    ensure!(gpu_containers > 0, "no GPU container left");
    Ok(())
}

fn booked(model: &'static str, id: &'static str, mib: u64) -> Check {
    Box::new(move |_, pod| {
        ensure!(
            label(pod, "gpu-booking.io/priority") == Some("high"),
            "priority label {:?}",
            label(pod, "gpu-booking.io/priority")
        );
        ensure!(
            label(pod, "gpu-booking.io/booking") == Some(id),
            "booking label"
        );
        ensure!(
            label(pod, "gpu-booking.io/model") == Some(model),
            "model label"
        );
        ensure!(
            annotation(pod, "terminate-at") == Some(UNTIL),
            "terminate-at {:?}",
            annotation(pod, "terminate-at")
        );
        placed_on(pod, model)?;
        let spec = pod.spec.as_ref().unwrap();
        ensure!(
            spec.priority_class_name.as_deref() == Some("gpu-booking-high"),
            "class"
        );
        ensure!(
            spec.priority.is_none() && spec.preemption_policy.is_none(),
            "stale priority kept"
        );
        // KubeSpawner's own labels survive.
        ensure!(
            label(pod, "hub.jupyter.org/username").is_some() || label(pod, "app") == Some("nginx"),
            "labels lost"
        );
        budget(pod, model, mib)
    })
}

/// The models of [`cfg`] with a resource of their own: that resource, not a node.
const OWN_RESOURCES: [(&str, &str); 2] = [
    ("a100", "nvidia.com/a100"),
    ("mig-1g.5gb", "nvidia.com/mig-1g.5gb"),
];

/// Where a booked or lent pod of `model` runs: a model with its own resource asks
/// for it (no generic GPU left) and has no model node selector; any other is selected
/// by the model's node label.
fn placed_on(pod: &Pod, model: &str) -> Result<(), String> {
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get("gpu-booking.io/model"));
    match OWN_RESOURCES.iter().find(|(m, _)| *m == model) {
        Some((_, resource)) => {
            ensure!(selector.is_none(), "node selector {selector:?}");
            let asks = |key: &str| {
                all_containers(pod).iter().any(|c| {
                    ["requests", "limits"]
                        .iter()
                        .any(|s| quantity(c, s, key).is_some())
                })
            };
            ensure!(asks(resource), "no request of {resource}");
            ensure!(!asks("nvidia.com/gpu"), "a generic GPU request is left");
        }
        None => ensure!(
            selector.map(String::as_str) == Some(model),
            "node selector {selector:?}"
        ),
    }
    Ok(())
}

fn low(model: &'static str, mib: u64) -> Check {
    Box::new(move |_, pod| {
        ensure!(
            label(pod, "gpu-booking.io/priority") == Some("low"),
            "priority label"
        );
        ensure!(
            label(pod, "gpu-booking.io/booking").is_none(),
            "booking label on a lent pod"
        );
        ensure!(
            annotation(pod, "terminate-at").is_none(),
            "terminate-at on a lent pod"
        );
        let spec = pod.spec.as_ref().unwrap();
        ensure!(
            spec.priority_class_name.as_deref() == Some("gpu-booking-low"),
            "class"
        );
        ensure!(spec.priority.is_none(), "stale priority kept");
        placed_on(pod, model)?;
        budget(pod, model, mib)
    })
}

fn stripped() -> Check {
    Box::new(|_, pod| {
        for c in all_containers(pod) {
            for key in GPU_KEYS.iter().chain(&[
                "gpu-booking.io/gpumem",
                "gpu-booking.io/gpumem-a100",
                "gpu-booking.io/gpumem-mig-1g.5gb",
            ]) {
                for section in ["requests", "limits"] {
                    ensure!(
                        quantity(c, section, key).is_none(),
                        "{} still has {section} {key}",
                        c.name
                    );
                }
            }
            let env = c.env.as_ref().ok_or(format!("{} has no env", c.name))?;
            let devices: Vec<_> = env
                .iter()
                .filter(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
                .collect();
            ensure!(
                devices.len() == 1,
                "{}: {} NVIDIA_VISIBLE_DEVICES entries",
                c.name,
                devices.len()
            );
            ensure!(
                devices[0].value.as_deref() == Some("none") && devices[0].value_from.is_none(),
                "{}: NVIDIA_VISIBLE_DEVICES={:?}",
                c.name,
                devices[0].value
            );
        }
        ensure!(
            annotation(pod, "gpu-booking.io/gpu-removed").is_some(),
            "no removal annotation"
        );
        ensure!(
            label(pod, "gpu-booking.io/priority").is_none(),
            "priority label on a CPU pod"
        );
        // Everything else of the container is intact.
        let main = &pod.spec.as_ref().unwrap().containers[0];
        ensure!(
            quantity(main, "limits", "cpu").is_some() || main.name != "notebook",
            "cpu limit lost"
        );
        Ok(())
    })
}

// ---- the table --------------------------------------------------------------------------

enum Expect {
    /// `allowed: false` with a 400 status.
    Invalid,
    /// Allowed, no patch.
    Unchanged,
    /// Allowed with a patch that passes the check.
    Patched(Check),
}

#[derive(Clone, Copy, PartialEq)]
enum Hook {
    /// Booking errors: allow; timeout 2 s.
    Allow,
    /// Booking errors: strip; timeout 300 ms.
    Strip,
    /// As Allow, but GPU pods without identity are stripped.
    StripUnidentified,
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    /// The pod the patch applies to (for Patched).
    pod: Option<Value>,
    uid: &'static str,
    hook: Hook,
    expect: Expect,
    /// A substring of the (single) warning, or None for no warning.
    warning: Option<&'static str>,
    /// Schedulability calls this case must make (None: not checked).
    lookups: Option<usize>,
    /// Audit calls started (a review makes no other call but the lookup).
    side_calls: u64,
}

fn case(name: &'static str, uid: &'static str, pod: Value, expect: Expect) -> Case {
    Case {
        name,
        body: serde_json::to_vec(&review(uid, pod.clone())).unwrap(),
        pod: Some(pod),
        uid,
        hook: Hook::Allow,
        expect,
        warning: None,
        lookups: Some(1),
        side_calls: 1,
    }
}

impl Case {
    fn warn(mut self, w: &'static str) -> Self {
        self.warning = Some(w);
        self
    }
    fn lookups(mut self, n: usize) -> Self {
        self.lookups = Some(n);
        self
    }
    fn side_calls(mut self, n: u64) -> Self {
        self.side_calls = n;
        self
    }
    fn hook(mut self, hook: Hook) -> Self {
        self.hook = hook;
        self
    }
    /// The same review, asked by `username` (in `groups`) in `namespace`.
    fn from(mut self, username: &str, groups: &[&str], namespace: &str) -> Self {
        let mut review: Value = serde_json::from_slice(&self.body).unwrap();
        review["request"]["userInfo"] = json!({"username": username, "groups": groups});
        review["request"]["namespace"] = json!(namespace);
        self.body = serde_json::to_vec(&review).unwrap();
        self
    }
    fn dry_run(mut self) -> Self {
        let mut review: Value = serde_json::from_slice(&self.body).unwrap();
        review["request"]["dryRun"] = json!(true);
        self.body = serde_json::to_vec(&review).unwrap();
        self.side_calls = 0;
        self
    }
    /// The same review with `from` written as `to` in its JSON text (an escape).
    fn spelled(mut self, from: &str, to: &str) -> Self {
        let text = String::from_utf8(self.body).unwrap();
        assert!(text.contains(from));
        self.body = text.replace(from, to).into_bytes();
        self
    }
    fn raw(name: &'static str, uid: &'static str, body: Vec<u8>, expect: Expect) -> Case {
        Case {
            name,
            body,
            pod: None,
            uid,
            hook: Hook::Allow,
            expect,
            warning: None,
            lookups: Some(0),
            side_calls: 0,
        }
    }
}

fn corpus() -> Vec<Case> {
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}});
    let mut nginx = plain_pod("nginx", json!({"limits": {"cpu": "1"}}));
    nginx["metadata"]["labels"] = json!({"app": "nginx"});
    let review_of = |pod: Value| review("uid-x", pod);
    let mut cases = vec![
        // KubeSpawner 6.2.0, escape era; the raw annotation is there.
        case(
            "ks6.2 booked user, model full: high priority (the controller preempts if it stays Pending)",
            "u-01",
            ks("6.2.0-alice-at-example.com-gpu.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked a100 GPU until 2099-11-30 00:00 UTC"),
        case(
            "ks6.2 booked user, named server",
            "u-02",
            ks("6.2.0-alice-at-example.com-gpu-named.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked a100"),
        case(
            "ks6.2 no annotation map: escape label decoded, looked up by slug",
            "u-03",
            without_annotations(ks("6.2.0-alice-at-example.com-gpu.json")),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked a100"),
        case(
            "ks6.2 invalid label (-42ob-2e-53mith), annotation used: lent a6000",
            "u-04",
            ks("6.2.0-Bob.Smith-gpu.json"),
            Expect::Patched(low("a6000", 49152)),
        )
        .warn("a6000 GPU lent without a booking"),
        case(
            "ks6.2 escape label only, invalid label value: lent a6000",
            "u-05",
            without_annotations(ks("6.2.0-Bob.Smith-gpu.json")),
            Expect::Patched(low("a6000", 49152)),
        ),
        case(
            "ks6.2 unbooked, nothing free: GPU stripped, env gets NVIDIA_VISIBLE_DEVICES",
            "u-06",
            ks("6.2.0-a-b-gpu.json"),
            Expect::Patched(stripped()),
        )
        .warn("you can book from 2099-12-14 00:00 UTC"),
        case(
            "ks6.2 non-ASCII user booked on a6000, unit free: no preemption",
            "u-07",
            ks("6.2.0-zoe-at-uni.example-gpu.json"),
            Expect::Patched(booked("a6000", "18", 49152)),
        )
        .warn("booked a6000"),
        case(
            "ks6.2 pod without GPU: unchanged, nobody asked",
            "u-08",
            ks("6.2.0-alice-at-example.com-nogpu.json"),
            Expect::Unchanged,
        )
        .lookups(0)
        .side_calls(0),
        // KubeSpawner 7.1.0, safe era.
        case(
            "ks7.1 booked user: high priority",
            "u-11",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked a100"),
        case(
            "ks7.1 no annotation map: safe slug resolved by the service",
            "u-12",
            without_annotations(ks("7.1.0-alice-at-example.com-gpu.json")),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "ks7.1 kept label (Bob.Smith): lent a6000",
            "u-13",
            ks("7.1.0-Bob.Smith-gpu.json"),
            Expect::Patched(low("a6000", 49152)),
        )
        .warn("lent"),
        case(
            "ks7.1 unbooked without env: env created with NVIDIA_VISIBLE_DEVICES=none",
            "u-14",
            without_env(ks("7.1.0-a-b-gpu.json")),
            Expect::Patched(stripped()),
        )
        .warn("GPU removed"),
        case(
            "ks7.1 safe slug of a non-ASCII user, no annotation",
            "u-15",
            without_annotations(ks("7.1.0-zoe-at-uni.example-gpu.json")),
            Expect::Patched(booked("a6000", "18", 49152)),
        )
        .warn("booked"),
        case(
            "ks7.1 named server of a booked user",
            "u-16",
            ks("7.1.0-alice-at-example.com-gpu-named.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "ks7.1 pod without GPU: unchanged",
            "u-17",
            ks("7.1.0-alice-at-example.com-nogpu.json"),
            Expect::Unchanged,
        )
        .lookups(0)
        .side_calls(0),
        // Shapes.
        case(
            "GPU only in limits",
            "u-21",
            gpu_only_in(ks("7.1.0-alice-at-example.com-gpu.json"), "limits"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "GPU only in requests",
            "u-22",
            gpu_only_in(ks("7.1.0-alice-at-example.com-gpu.json"), "requests"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "GPU in an init container, several containers: budget where the GPU is",
            "u-23",
            with_init_and_sidecar(ks("7.1.0-alice-at-example.com-gpu.json")),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "GPU in an init container of an unbooked user: stripped everywhere",
            "u-24",
            with_init_and_sidecar(ks("7.1.0-a-b-gpu.json")),
            Expect::Patched(stripped()),
        )
        .warn("GPU removed"),
        case(
            "per-model resource nvidia.com/a100, a100 full: stripped though a6000 is free",
            "u-25",
            with_resource(ks("7.1.0-Bob.Smith-gpu.json"), "nvidia.com/a100"),
            Expect::Patched(stripped()),
        )
        .warn("no free a100 GPU"),
        case(
            "MIG resource nvidia.com/mig-1g.5gb, one free: lent on the MIG profile",
            "u-26",
            with_resource(ks("7.1.0-Bob.Smith-gpu.json"), "nvidia.com/mig-1g.5gb"),
            Expect::Patched(low("mig-1g.5gb", 5120)),
        )
        .warn("lent"),
        case(
            "per-model resource of the booked model: booked",
            "u-27",
            with_resource(ks("7.1.0-alice-at-example.com-gpu.json"), "nvidia.com/a100"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked"),
        case(
            "existing NVIDIA_VISIBLE_DEVICES=all is replaced on strip",
            "u-28",
            with_env(ks("6.2.0-a-b-gpu.json"), "NVIDIA_VISIBLE_DEVICES", "all"),
            Expect::Patched(stripped()),
        )
        .warn("GPU removed"),
        case(
            "dry run of a booked pod: same patch, no preemption, no audit",
            "u-29",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .warn("booked")
        .dry_run(),
        // Spellings: the fast path must never miss a GPU that the full path sees.
        case(
            "GPU resource key written with \\/ escapes: still a GPU pod",
            "u-34",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .spelled("nvidia.com/gpu", "nvidia.com\\/gpu")
        .warn("booked"),
        case(
            "GPU resource key written with \\u escapes: still a GPU pod",
            "u-35",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(booked("a100", "17", 40960)),
        )
        .spelled("\"nvidia.com/gpu\"", "\"\\u006evidia.com\\u002fgpu\"")
        .warn("booked"),
        case(
            "nvidia.com/gpu named only in an annotation: no GPU",
            "u-36",
            annotated(
                ks("7.1.0-alice-at-example.com-nogpu.json"),
                "note",
                "ask for nvidia.com/gpu: 1",
            ),
            Expect::Unchanged,
        )
        .lookups(0)
        .side_calls(0),
        case(
            "escapes elsewhere in a pod without GPU (\\u0026 in env): no GPU",
            "u-37",
            with_env(ks("7.1.0-alice-at-example.com-nogpu.json"), "Q", "a&b<c>"),
            Expect::Unchanged,
        )
        .spelled("a&b<c>", "a\\u0026b\\u003cc\\u003e")
        .lookups(0)
        .side_calls(0),
        // Pods that are not JupyterHub's.
        case(
            "GPU pod without identity: lent like an unbooked user's (free units asked)",
            "u-31",
            plain_pod("cuda-job", gpu.clone()),
            Expect::Patched(low("a6000", 49152)),
        ),
        case(
            "GPU pod without identity, policy strip: no GPU, nobody asked",
            "u-31s",
            plain_pod("cuda-job", gpu.clone()),
            Expect::Patched(stripped()),
        )
        .hook(Hook::StripUnidentified)
        .warn("not created by JupyterHub")
        .lookups(0),
        // A name in a pod proves nothing unless the spawner wrote it.
        case(
            "Alice's annotation on a pod another ServiceAccount creates: no booking, lent",
            "u-34",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(low("a6000", 49152)),
        )
        .from(
            "system:serviceaccount:jhub:default",
            &["system:serviceaccounts"],
            "jhub",
        ),
        case(
            "Alice's annotation from a person, however grouped: no booking, lent",
            "u-35",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(low("a6000", 49152)),
        )
        .from(
            "mallory@example.com",
            &["system:authenticated", "system:masters"],
            "jhub",
        ),
        case(
            "Alice's annotation from the hub's account in another namespace: no booking",
            "u-36",
            ks("7.1.0-alice-at-example.com-gpu.json"),
            Expect::Patched(low("a6000", 49152)),
        )
        .from(HUB, &[], "research"),
        case(
            "Alice's label from an untrusted creator, policy strip: no GPU",
            "u-38",
            without_annotations(ks("6.2.0-alice-at-example.com-gpu.json")),
            Expect::Patched(stripped()),
        )
        .from("system:serviceaccount:jhub:default", &[], "jhub")
        .hook(Hook::StripUnidentified)
        .warn("not created by JupyterHub")
        .lookups(0),
        case(
            "plain pod without GPU: unchanged",
            "u-32",
            nginx,
            Expect::Unchanged,
        )
        .lookups(0)
        .side_calls(0),
        case(
            "hostile user name (control characters) and label: no identity, lent",
            "u-33",
            with_hostile_identity(ks("7.1.0-alice-at-example.com-gpu.json")),
            Expect::Patched(low("a6000", 49152)),
        ),
        // The booking service failing.
        case(
            "booking service HTTP 500, policy allow: unchanged with a warning",
            "u-41",
            plain_with_user("down@example.com"),
            Expect::Unchanged,
        )
        .warn("booking service unavailable"),
        case(
            "booking service unreadable answer, policy allow: unchanged with a warning",
            "u-42",
            plain_with_user("garbage@example.com"),
            Expect::Unchanged,
        )
        .warn("booking service unavailable"),
        case(
            "booking service too slow, policy strip: stripped within the timeout",
            "u-43",
            plain_with_user("slow@example.com"),
            Expect::Patched(stripped()),
        )
        .hook(Hook::Strip)
        .warn("could not be asked"),
        case(
            "booking service HTTP 500, policy strip: stripped",
            "u-44",
            plain_with_user("down@example.com"),
            Expect::Patched(stripped()),
        )
        .hook(Hook::Strip)
        .warn("GPU removed"),
    ];
    // Malformed and foreign reviews.
    let mut wrong_kind = review_of(ks("7.1.0-alice-at-example.com-gpu.json"));
    wrong_kind["request"]["uid"] = json!("u-53");
    wrong_kind["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Service"});
    let mut update = review_of(ks("7.1.0-alice-at-example.com-gpu.json"));
    update["request"]["uid"] = json!("u-54");
    update["request"]["operation"] = json!("UPDATE");
    let mut no_object = review_of(json!(null));
    no_object["request"]["uid"] = json!("u-55");
    no_object["request"]
        .as_object_mut()
        .unwrap()
        .remove("object");
    let mut odd_object = review_of(json!("a pod"));
    odd_object["request"]["uid"] = json!("u-56");
    let mut not_a_review = review_of(ks("7.1.0-alice-at-example.com-gpu.json"));
    not_a_review["request"]["uid"] = json!("u-57");
    not_a_review["kind"] = json!("ConfigMap");
    let mut beta = review_of(ks("7.1.0-alice-at-example.com-nogpu.json"));
    beta["request"]["uid"] = json!("u-58");
    beta["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut extra = review_of(ks("7.1.0-alice-at-example.com-nogpu.json"));
    extra["request"]["uid"] = json!("u-59");
    extra["request"]["somethingNew"] = json!({"x": [1, 2]});
    extra["request"]["userInfo"] = json!(42);
    let mut huge = review_of(ks("7.1.0-alice-at-example.com-gpu.json"));
    huge["request"]["uid"] = json!("u-60");
    huge["request"]["object"]["metadata"]["annotations"]["big"] = json!("x".repeat(4 << 20));
    let bytes = |v: &Value| serde_json::to_vec(v).unwrap();
    cases.extend([
        Case::raw(
            "garbage bytes: invalid, empty uid",
            "",
            b"\x00\xff{not json".to_vec(),
            Expect::Invalid,
        ),
        Case::raw("empty body: invalid", "", Vec::new(), Expect::Invalid),
        Case::raw(
            "JSON that is not an object: invalid",
            "",
            b"[1,2,3]".to_vec(),
            Expect::Invalid,
        ),
        Case::raw(
            "review without a request: invalid",
            "",
            bytes(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})),
            Expect::Invalid,
        ),
        Case::raw(
            "request of another kind (Service): allowed unchanged",
            "u-53",
            bytes(&wrong_kind),
            Expect::Unchanged,
        ),
        Case::raw(
            "UPDATE of a pod: allowed unchanged",
            "u-54",
            bytes(&update),
            Expect::Unchanged,
        ),
        Case::raw(
            "CREATE without an object: invalid, uid echoed",
            "u-55",
            bytes(&no_object),
            Expect::Invalid,
        ),
        Case::raw(
            "object that is a string: invalid, uid echoed",
            "u-56",
            bytes(&odd_object),
            Expect::Invalid,
        ),
        Case::raw(
            "review kind ConfigMap: invalid, uid echoed",
            "u-57",
            bytes(&not_a_review),
            Expect::Invalid,
        ),
        Case::raw(
            "v1beta1 review: answered in v1beta1",
            "u-58",
            bytes(&beta),
            Expect::Unchanged,
        ),
        Case::raw(
            "unknown and odd fields in the request: ignored",
            "u-59",
            bytes(&extra),
            Expect::Unchanged,
        ),
        Case::raw(
            "body over 3 MiB: invalid",
            "",
            bytes(&huge),
            Expect::Invalid,
        ),
    ]);
    cases
}

/// A JupyterHub-like GPU pod of `user` (annotation only).
fn plain_with_user(user: &str) -> Value {
    let mut pod = plain_pod(
        "jupyter-x",
        json!({"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}),
    );
    pod["metadata"]["annotations"] = json!({"hub.jupyter.org/username": user});
    pod
}

#[tokio::test]
async fn fixture_corpus() {
    let stub = StubBooking::start().await;
    // No answer reuse, so that every case makes its own call.
    let allow = webhook(
        &stub.url,
        BookingErrorPolicy::Allow,
        Duration::from_secs(2),
        Duration::ZERO,
    );
    let strip = webhook(
        &stub.url,
        BookingErrorPolicy::Strip,
        Duration::from_millis(300),
        Duration::ZERO,
    );
    let mut strict = config(BookingErrorPolicy::Allow);
    strict.unidentified_gpu_pods = UnidentifiedGpuPods::Strip;
    let strip_unidentified =
        webhook_with(&stub.url, strict, Duration::from_secs(2), Duration::ZERO);
    let apps = [
        (Hook::Allow, router(allow.clone())),
        (Hook::Strip, router(strip.clone())),
        (Hook::StripUnidentified, router(strip_unidentified.clone())),
    ];
    let mut failures = Vec::new();
    let cases = corpus();
    let count = cases.len();
    for case in cases {
        let (hook, app) = apps.iter().find(|(h, _)| *h == case.hook).unwrap();
        let hook_webhook = match hook {
            Hook::Allow => &allow,
            Hook::Strip => &strip,
            Hook::StripUnidentified => &strip_unidentified,
        };
        let lookups_before = stub.lookups.load(std::sync::atomic::Ordering::SeqCst);
        let side_before = hook_webhook.booking().side_calls_started();
        let started = std::time::Instant::now();
        let (status, out) = post(app, case.body.clone()).await;
        let took = started.elapsed();
        let result = (|| -> Result<(), String> {
            ensure!(status == StatusCode::OK, "HTTP {status}");
            let out = out?;
            ensure!(out.kind == "AdmissionReview", "kind {}", out.kind);
            ensure!(
                out.response.uid == case.uid,
                "uid {:?}, want {:?}",
                out.response.uid,
                case.uid
            );
            let want_version = if case.name.contains("v1beta1") {
                "admission.k8s.io/v1beta1"
            } else {
                "admission.k8s.io/v1"
            };
            ensure!(
                out.api_version == want_version,
                "apiVersion {}",
                out.api_version
            );
            match &case.expect {
                Expect::Invalid => {
                    ensure!(!out.response.allowed, "allowed");
                    let status = out.response.status.as_ref().ok_or("no status")?;
                    ensure!(
                        status.code == 400 && !status.message.is_empty(),
                        "status {status:?}"
                    );
                }
                Expect::Unchanged => {
                    ensure!(out.response.allowed, "refused: {:?}", out.response.status);
                    ensure!(
                        out.response.patch.is_none(),
                        "patched: {:?}",
                        out.decoded_patch()
                    );
                }
                Expect::Patched(check) => {
                    ensure!(out.response.allowed, "refused: {:?}", out.response.status);
                    ensure!(
                        out.response.patch_type.as_deref() == Some("JSONPatch"),
                        "patchType"
                    );
                    let pod = case.pod.as_ref().unwrap();
                    let (value, typed) = patched(pod, &out)?;
                    check(&value, &typed)?;
                }
            }
            match case.warning {
                Some(w) => {
                    ensure!(
                        out.response.warnings.len() == 1 && out.response.warnings[0].contains(w),
                        "warnings {:?}, want one with {w:?}",
                        out.response.warnings
                    );
                    ensure!(
                        out.response.warnings[0].chars().count() <= 120,
                        "warning too long"
                    );
                }
                None => ensure!(
                    out.response.warnings.is_empty() || matches!(case.expect, Expect::Patched(_)),
                    "unexpected warnings {:?}",
                    out.response.warnings
                ),
            }
            if let Some(n) = case.lookups {
                let made = stub.lookups.load(std::sync::atomic::Ordering::SeqCst) - lookups_before;
                ensure!(made == n, "{made} schedulability calls, want {n}");
            }
            let side = hook_webhook.booking().side_calls_started() - side_before;
            ensure!(
                side == case.side_calls,
                "{side} side calls started, want {}",
                case.side_calls
            );
            if case.hook == Hook::Strip {
                ensure!(took < Duration::from_secs(2), "answered after {took:?}");
            }
            Ok(())
        })();
        if let Err(e) = result {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// No review, real or forged, can end a pod. A booked pod on a full
/// model is admitted with high priority and an audit row, and the booking service's
/// preemption endpoint is never called (the controller preempts for booked pods it
/// sees Pending): 20 copies of the review make one lookup (cached), 20 audit reports
/// and nothing else.
#[tokio::test]
async fn a_review_never_asks_for_a_preemption() {
    let mut stub = StubBooking::start().await;
    let hook = webhook(
        &stub.url,
        BookingErrorPolicy::Allow,
        Duration::from_secs(2),
        Duration::from_secs(3),
    );
    let app = router(hook);
    let pod = ks("7.1.0-alice-at-example.com-gpu.json");
    for i in 0..20 {
        let (_, out) = post(
            &app,
            serde_json::to_vec(&review(&format!("u-p{i}"), pod.clone())).unwrap(),
        )
        .await;
        assert!(out.unwrap().response.allowed);
    }
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|s: &&Seen| s.path == "/api/v1/audit/batch")
        .count()
        < 20
    {
        let next = tokio::time::timeout(Duration::from_secs(5), stub.seen.recv()).await;
        seen.push(next.expect("20 audit reports").expect("the stub runs"));
    }
    seen.extend(stub.drain());
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert!(
        paths
            .iter()
            .all(|p| *p == "/api/v1/audit/batch" || *p == "/api/v1/schedulability"),
        "{paths:?}"
    );
    let audit = seen
        .iter()
        .find(|s| s.path == "/api/v1/audit/batch")
        .unwrap();
    assert_eq!(audit.auth.as_deref(), Some(SERVICE_TOKEN));
    assert_eq!(audit.body["action"], "webhook.booked");
    assert_eq!(
        audit.body["subject"],
        "jhub/jupyter-alice-example-com---ff8d9819"
    );
    assert_eq!(audit.body["booking_id"], 17);
    assert_eq!(audit.body["details"]["decision"], "booked");
    assert_eq!(audit.body["details"]["model_full"], true);
}

/// Forged reviews posted to `/mutate` cannot write audit rows without bound: audit
/// reports are bounded per kind (a token bucket; no refill here, so the bound is
/// exact) and the dropped ones are counted.
#[tokio::test]
async fn audit_reports_are_bounded_in_rate() {
    let stub = StubBooking::start().await;
    let metrics = Arc::new(Metrics::new());
    let booking = BookingSource::new(
        &stub.url,
        TokenSource::Static(SERVICE_TOKEN.into()),
        Duration::from_secs(2),
        Duration::from_secs(30),
        metrics.clone(),
    )
    .unwrap()
    .with_audit_rate(5, 0.0);
    let hook = Arc::new(
        Webhook::new(
            config(BookingErrorPolicy::Allow),
            Arc::new(booking),
            metrics,
        )
        .with_ledger(no_ledger()),
    );
    let app = router(hook.clone());
    for i in 0..100 {
        // A lent pod: one audit report each, and nothing else (no preemption).
        let mut review = review("forged", ks("7.1.0-Bob.Smith-gpu.json"));
        review["request"]["uid"] = json!(format!("forged-{i}"));
        let (status, out) = post(&app, serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        assert!(out.unwrap().response.allowed);
    }
    assert_eq!(hook.booking().side_calls_started(), 5);
    let text = hook.metrics().encode();
    assert!(
        text.contains(
            "gpu_booking_webhook_side_calls_total{call=\"audit\",outcome=\"rate_limited\"} 95"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_burst_of_spawns_makes_one_call() {
    let stub = StubBooking::start().await;
    let hook = webhook(
        &stub.url,
        BookingErrorPolicy::Allow,
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    let app = router(hook.clone());
    let body = serde_json::to_vec(&review("u-b", ks("6.2.0-Bob.Smith-gpu.json"))).unwrap();
    let answers = futures_join(&app, body, 20).await;
    for out in answers {
        let out = out.unwrap();
        assert!(out.response.allowed);
        assert!(out.response.patch.is_some());
    }
    assert_eq!(stub.lookups.load(std::sync::atomic::Ordering::SeqCst), 1);
    let metrics = hook.metrics().encode();
    assert!(
        metrics.contains("gpu_booking_webhook_schedulability_cache_total{outcome=\"hit\"} 19"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_booking_webhook_admissions_total{decision=\"low_priority\"} 20"),
        "{metrics}"
    );
}

async fn futures_join(
    app: &axum::Router,
    body: Vec<u8>,
    n: usize,
) -> Vec<Result<ReviewOut, String>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let app = app.clone();
        let body = body.clone();
        tasks.spawn(async move { post(&app, body).await.1 });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.unwrap());
    }
    out
}

#[tokio::test]
async fn a_wrong_service_token_is_a_booking_error_not_unbooked() {
    let stub = StubBooking::start().await;
    let metrics = Arc::new(Metrics::new());
    let booking = BookingSource::new(
        &stub.url,
        TokenSource::Static("wrong".into()),
        Duration::from_secs(2),
        Duration::ZERO,
        metrics.clone(),
    )
    .unwrap();
    let hook = Arc::new(
        Webhook::new(
            config(BookingErrorPolicy::Allow),
            Arc::new(booking),
            metrics,
        )
        .with_ledger(no_ledger()),
    );
    let pod = ks("7.1.0-a-b-gpu.json");
    let (_, out) = post(
        &router(hook),
        serde_json::to_vec(&review("u-t", pod)).unwrap(),
    )
    .await;
    let out = out.unwrap();
    // Not stripped as an unbooked user would be: the policy (allow) applies.
    assert!(out.response.allowed && out.response.patch.is_none());
    assert!(out.response.warnings[0].contains("booking service unavailable"));
}

#[tokio::test]
async fn the_service_token_file_is_reread_when_it_changes() {
    let dir = std::env::temp_dir().join(format!("gpu-booking-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token");
    std::fs::write(&path, "first\n").unwrap();
    let source = TokenSource::file(path.clone()).unwrap();
    assert_eq!(source.token().unwrap(), "first");
    let tmp = dir.join("token.new");
    std::fs::write(&tmp, "second").unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(source.token().unwrap(), "second");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn admin_endpoints_answer() {
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    metrics.admitted("no_gpu", Duration::from_micros(80));
    let app = gpu_booking_webhook::admin_router(metrics, ready.clone());
    let get = |path: &'static str| {
        let app = app.clone();
        async move {
            let r = app
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = r.status();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("/healthz").await.0, StatusCode::OK);
    assert_eq!(get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    ready.store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(get("/readyz").await.0, StatusCode::OK);
    let (status, text) = get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("# TYPE gpu_booking_webhook_admissions counter"),
        "{text}"
    );
    assert!(
        text.contains("gpu_booking_webhook_admissions_total{decision=\"no_gpu\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("gpu_booking_webhook_admission_duration_seconds"),
        "{text}"
    );
}

/// The hand-written examples in `examples/admission/` stay what the docs say they are.
#[tokio::test]
async fn the_examples_are_answered_as_documented() {
    let stub = StubBooking::start().await;
    let hook = webhook(
        &stub.url,
        BookingErrorPolicy::Allow,
        Duration::from_secs(2),
        Duration::ZERO,
    );
    let app = router(hook);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/admission");
    for (file, expect) in [
        ("booked-user-gpu-pod.json", "high"),
        ("unbooked-user-gpu-pod.json", "low"),
        ("no-gpu-pod.json", "unchanged"),
    ] {
        let body = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let review: Value = serde_json::from_slice(&body).unwrap();
        let (_, out) = post(&app, body).await;
        let out = out.unwrap();
        assert!(out.response.allowed, "{file}");
        assert_eq!(
            out.response.uid,
            review["request"]["uid"].as_str().unwrap(),
            "{file}"
        );
        let (_, pod) = patched(&review["request"]["object"], &out).unwrap();
        assert_eq!(
            label(&pod, "gpu-booking.io/priority").unwrap_or("unchanged"),
            expect,
            "{file}"
        );
    }
}

mod fast_path {
    use super::*;
    use gpu_booking_core::admission::detect_gpu;
    use proptest::prelude::*;

    fn resources() -> impl Strategy<Value = Value> {
        let keys = prop::sample::select(
            &[
                "nvidia.com/gpu",
                "nvidia.com/a100",
                "nvidia.com/mig-1g.5gb",
                "cpu",
                "memory",
            ][..],
        );
        let quantities = prop::sample::select(&["0", "1", "2", "500m"][..]);
        let map = prop::collection::btree_map(keys, quantities, 0..3).prop_map(|m| json!(m));
        (prop::option::of(map.clone()), prop::option::of(map)).prop_map(|(requests, limits)| {
            let mut r = serde_json::Map::new();
            if let Some(q) = requests {
                r.insert("requests".into(), q);
            }
            if let Some(q) = limits {
                r.insert("limits".into(), q);
            }
            Value::Object(r)
        })
    }

    fn container() -> impl Strategy<Value = Value> {
        (prop::option::of(resources()), "[a-z]{1,6}").prop_map(|(res, name)| {
            let mut c = json!({"name": name, "image": "busybox"});
            if let Some(res) = res {
                c["resources"] = res;
            }
            c
        })
    }

    fn pod() -> impl Strategy<Value = Value> {
        (
            prop::collection::vec(container(), 1..3),
            prop::collection::vec(container(), 0..2),
            prop::option::of("[ -~]{0,20}"),
        )
            .prop_map(|(containers, init, note)| {
                let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "jhub"},
                    "spec": {"containers": containers, "initContainers": init}});
                if let Some(note) = note {
                    pod["metadata"]["annotations"] = json!({"note": note});
                }
                pod
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever the spelling of the body, the webhook patches exactly the pods that
        /// core's detection calls GPU pods (no identity here, and such pods are stripped:
        /// the CPU-only step is the patch, without asking anyone).
        #[test]
        fn the_fast_path_agrees_with_detection(pod in pod(), escape_slashes in any::<bool>(), escape_n in any::<bool>()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let hook = runtime.block_on(async {
                let mut cfg = config(BookingErrorPolicy::Allow);
                cfg.unidentified_gpu_pods = UnidentifiedGpuPods::Strip;
                webhook_with("http://127.0.0.1:9", cfg, Duration::from_secs(1), Duration::ZERO)
            });
            let mut text = serde_json::to_string(&review("u-prop", pod.clone())).unwrap();
            if escape_slashes {
                text = text.replace('/', "\\/");
            }
            if escape_n {
                text = text.replace("nvidia", "\\u006evidia");
            }
            let out = runtime.block_on(hook.review(text.as_bytes()));
            prop_assert!(out.response.allowed);
            prop_assert_eq!(out.response.uid.as_str(), "u-prop");
            let gpu = detect_gpu(&pod, hook.config()).is_some();
            prop_assert_eq!(out.response.patch.is_some(), gpu, "{}", text);
            if gpu {
                let (_, typed) = patched(&pod, &out).map_err(TestCaseError::fail)?;
                prop_assert!(typed.spec.is_some());
            }
        }
    }
}

/// `pod` with every mark of ours written by its creator: our labels (under
/// the current and the legacy keys), the `terminate-at` annotation, another annotation
/// of ours, and our high class.
fn forged(mut pod: Value) -> Value {
    let meta = &mut pod["metadata"];
    for (key, value) in [
        ("gpu-booking.io/priority", "high"),
        ("gpu-booking.io/booking", "1"),
        ("gpu-booking.io/model", "a100"),
        ("gpu-booking/priority", "high"),
        ("gpu-booking/booking", "1"),
        ("gpu-booking/model", "a100"),
    ] {
        meta["labels"][key] = json!(value);
    }
    meta["annotations"]["terminate-at"] = json!("2099-01-01T00:00:00Z");
    meta["annotations"]["gpu-booking.io/last-gpu-activity"] = json!("2099-01-01T00:00:00Z");
    pod["spec"]["priorityClassName"] = json!("gpu-booking-high");
    pod["spec"]["priority"] = json!(1_000_000);
    pod
}

/// Whatever path a pod takes through the webhook, no mark of ours that
/// its creator wrote survives, and only our keys (and our high class) are touched.
#[tokio::test]
async fn forged_marks_are_removed_on_every_path() {
    // Nobody answers there: the booking service is down.
    let down = "http://127.0.0.1:9";
    let allow = webhook(
        down,
        BookingErrorPolicy::Allow,
        Duration::from_millis(300),
        Duration::ZERO,
    );
    let mut strip_cfg = config(BookingErrorPolicy::Allow);
    strip_cfg.unidentified_gpu_pods = UnidentifiedGpuPods::Strip;
    let strip = webhook_with(down, strip_cfg, Duration::from_millis(300), Duration::ZERO);
    let gpu = forged(ks("7.1.0-alice-at-example.com-gpu.json"));
    let mut stranger = review("p-stranger", gpu.clone());
    stranger["request"]["userInfo"] = json!({"username": "mallory", "groups": []});
    let cases = [
        (
            "no GPU",
            &allow,
            review(
                "p-nogpu",
                forged(ks("7.1.0-alice-at-example.com-nogpu.json")),
            ),
            "no_gpu",
        ),
        (
            "booking service down, allow",
            &allow,
            review("p-down", gpu.clone()),
            "unchecked",
        ),
        (
            "unidentified, service down, allow",
            &allow,
            stranger.clone(),
            "unchecked",
        ),
        ("unidentified, strip", &strip, stranger, "stripped"),
    ];
    for (path, hook, review, what) in cases {
        let pod = review["request"]["object"].clone();
        let (_, out) = post(&router(hook.clone()), serde_json::to_vec(&review).unwrap()).await;
        let out = out.unwrap();
        assert!(out.response.allowed, "{path}");
        let patch = out
            .decoded_patch()
            .unwrap_or_else(|| panic!("{path}: no patch"));
        let mut after = pod.clone();
        json_patch::patch(&mut after, &patch.0).unwrap();
        let cfg = config(BookingErrorPolicy::Allow);
        for map in ["labels", "annotations"] {
            let left: Vec<&String> = after["metadata"][map]
                .as_object()
                .map(|m| {
                    m.keys()
                        .filter(|k| is_our_key(k, &cfg) && !is_harmless_key(k))
                        .collect()
                })
                .unwrap_or_default();
            assert!(left.is_empty(), "{path}: {map} {left:?} survived");
            // The creator's own keys are left alone.
            let theirs = |v: &Value| {
                v["metadata"][map]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter(|(k, _)| !is_our_key(k, &cfg))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            };
            assert_eq!(theirs(&after), theirs(&pod), "{path}: {map}");
        }
        assert_ne!(
            after["spec"]["priorityClassName"], "gpu-booking-high",
            "{path}"
        );
        assert!(after["spec"].get("priority").is_none(), "{path}");
        let gpus = |v: &Value| {
            v["spec"]["containers"][0]["resources"]["limits"]
                .get("nvidia.com/gpu")
                .cloned()
        };
        match what {
            "stripped" => assert_eq!(gpus(&after), None, "{path}"),
            _ => assert_eq!(gpus(&after), gpus(&pod), "{path}: the GPU stays"),
        }
    }
}
