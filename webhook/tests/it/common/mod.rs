//! Test helpers shared by the webhook's test files: pods as the API server sends them,
//! reviews around them, a stub booking service, patches applied to typed pods.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpu_booking_webhook::ReviewOut;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

pub const SERVICE_TOKEN: &str = "stub-service-token";

/// The repository's `tests/fixtures/` (the KubeSpawner pod bodies live there).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// A KubeSpawner request body from `tests/fixtures/kubespawner/`.
pub fn kubespawner(file: &str) -> Value {
    let path = data_dir().join("kubespawner").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A canonical quantity string, as the API server re-encodes a number.
fn quantity(v: &Value) -> Value {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() != 0.0 {
                return json!(format!("{}m", (f * 1000.0).round() as i64));
            }
            let i = f as u64;
            for (suffix, unit) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
                if i >= unit && i % unit == 0 {
                    return json!(format!("{}{suffix}", i / unit));
                }
            }
            json!(i.to_string())
        }
        other => other.clone(),
    }
}

fn drop_empty(map: &mut Map<String, Value>) {
    map.retain(|_, v| match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    });
}

/// The pod as a mutating webhook receives it from the API server: namespace filled in,
/// quantities as strings, empty lists and maps dropped, defaulted fields set, the
/// Priority and DefaultTolerationSeconds plugins already run.
pub fn apiserver_view(mut pod: Value, namespace: &str) -> Value {
    let meta = pod["metadata"].as_object_mut().unwrap();
    meta.insert("namespace".into(), json!(namespace));
    meta.insert("creationTimestamp".into(), Value::Null);
    let spec = pod["spec"].as_object_mut().unwrap();
    for list in ["containers", "initContainers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let c = c.as_object_mut().unwrap();
            if let Some(res) = c.get_mut("resources").and_then(Value::as_object_mut) {
                for section in res.values_mut() {
                    if let Some(map) = section.as_object_mut() {
                        for q in map.values_mut() {
                            *q = quantity(q);
                        }
                    }
                }
            }
            for port in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                port["protocol"] = json!("TCP");
            }
            c.entry("imagePullPolicy").or_insert(json!("IfNotPresent"));
            c.insert(
                "terminationMessagePath".into(),
                json!("/dev/termination-log"),
            );
            c.insert("terminationMessagePolicy".into(), json!("File"));
            drop_empty(c);
        }
    }
    spec.insert("dnsPolicy".into(), json!("ClusterFirst"));
    spec.insert("schedulerName".into(), json!("default-scheduler"));
    spec.insert("terminationGracePeriodSeconds".into(), json!(30));
    spec.insert("securityContext".into(), json!({}));
    spec.insert("enableServiceLinks".into(), json!(true));
    spec.insert("serviceAccountName".into(), json!("default"));
    spec.insert("serviceAccount".into(), json!("default"));
    spec.insert("priority".into(), json!(0));
    spec.insert("preemptionPolicy".into(), json!("PreemptLowerPriority"));
    spec.insert(
        "tolerations".into(),
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]),
    );
    drop_empty(spec);
    pod["status"] = json!({});
    pod
}

/// The AdmissionReview the API server sends for creating `pod`.
pub fn review(uid: &str, pod: Value) -> Value {
    review_with(uid, pod, false)
}

pub fn review_with(uid: &str, pod: Value, dry_run: bool) -> Value {
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("jhub")
        .to_owned();
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:jhub:hub",
                "uid": "3c1e3f4e-0b3b-4d4e-9c55-2f4a7e5b8c10",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:jhub", "system:authenticated"]
            },
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// A plain pod (not from JupyterHub), as the API server sends it.
pub fn plain_pod(name: &str, resources: Value) -> Value {
    apiserver_view(
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "resources": resources}]}
        }),
        "jhub",
    )
}

/// Applies the answer's patch to `pod` and reads the result as a typed Pod.
pub fn patched(pod: &Value, out: &ReviewOut) -> Result<(Value, Pod), String> {
    let mut result = pod.clone();
    if let Some(patch) = out.decoded_patch() {
        json_patch::patch(&mut result, &patch.0)
            .map_err(|e| format!("patch does not apply: {e}"))?;
    } else if out.response.patch.is_some() {
        return Err("the patch is not base64 JSON Patch".into());
    }
    let typed =
        serde_json::from_value::<Pod>(result.clone()).map_err(|e| format!("not a Pod: {e}"))?;
    Ok((result, typed))
}

/// What the stub booking service saw: path, query or body, and the bearer token.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub body: Value,
    pub auth: Option<String>,
}

/// A booking service that answers from a table and reports every call on a channel.
pub struct StubBooking {
    pub addr: SocketAddr,
    pub url: String,
    pub lookups: Arc<AtomicUsize>,
    pub seen: mpsc::UnboundedReceiver<Seen>,
}

#[derive(Clone)]
struct StubState {
    lookups: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<Seen>,
}

fn future() -> &'static str {
    "2099-11-30T00:00:00Z"
}

/// The stub's table: who is booked, and what is free.
/// - alice@example.com (and both her slugs): booked a100 (id 17), a100 full.
/// - zoë@uni.example (and slugs): booked a6000 (id 18), a6000 free.
/// - Bob.Smith (or bob.smith, and slugs): not booked; a6000 and the MIG profile free, a100 full.
/// - a-b (and slugs) and anyone else: not booked, nothing free.
/// - no query (a pod without identity): nobody, one a6000 free.
/// - down@example.com: HTTP 500. slow@example.com: answers after 5 s. garbage@example.com: not JSON.
fn answer_for(kind: &str, value: &str) -> Result<Value, (StatusCode, String)> {
    let who = match (kind, value) {
        ("user", "alice@example.com")
        | ("slug", "alice-40example-2ecom")
        | ("slug", "alice-example-com---ff8d9819") => "alice",
        ("user", "zoë@uni.example")
        | ("slug", "zo-c3-ab-40uni-2eexample")
        | ("slug", "zo-uni-example---99eefb17") => "zoe",
        // As the webhook asks by default: lowercased, as JupyterHub normalises names.
        ("user", "Bob.Smith" | "bob.smith")
        | ("slug", "-42ob-2e-53mith")
        | ("slug", "Bob.Smith") => "bob",
        ("user", "down@example.com") => {
            return Err((StatusCode::INTERNAL_SERVER_ERROR, "down".into()))
        }
        ("user", "garbage@example.com") => return Err((StatusCode::OK, "<html>".into())),
        _ => "nobody",
    };
    let free =
        |a100: i64, a6000: i64, mig: i64| json!({"a100": a100, "a6000": a6000, "mig-1g.5gb": mig});
    let gpumem = json!({"a100": 40960, "a6000": 49152, "mig-1g.5gb": 5120});
    Ok(match who {
        "alice" => {
            json!({"schedulable": true, "until": future(), "model": "a100", "booking_id": 17,
            "user": "alice@example.com", "free": free(0, 0, 0), "gpumem_mib": gpumem, "earliest_booking": null})
        }
        "zoe" => json!({"schedulable": true, "until": future(), "model": "a6000", "booking_id": 18,
            "user": "zoë@uni.example", "free": free(0, 2, 0), "gpumem_mib": gpumem, "earliest_booking": null}),
        "bob" => json!({"schedulable": false, "until": null, "model": null, "booking_id": null,
            "user": "Bob.Smith", "free": free(0, 3, 1), "gpumem_mib": gpumem, "earliest_booking": "2099-12-01T09:00:00Z"}),
        _ => json!({"schedulable": false, "until": null, "model": null, "booking_id": null,
            "user": null, "free": free(0, 0, 0), "gpumem_mib": gpumem, "earliest_booking": "2099-12-14T00:00:00Z"}),
    })
}

async fn stub_lookup(
    State(state): State<StubState>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, (StatusCode, String)> {
    state.lookups.fetch_add(1, Ordering::SeqCst);
    let auth = bearer(&headers);
    let _ = state.tx.send(Seen {
        path: "/api/v1/schedulability".into(),
        body: json!(q),
        auth: auth.clone(),
    });
    if auth.as_deref() != Some(SERVICE_TOKEN) {
        return Err((StatusCode::UNAUTHORIZED, "bad token".into()));
    }
    let Some((kind, value)) = q.iter().next() else {
        return Ok(Json(
            json!({"schedulable": false, "until": null, "model": null, "booking_id": null,
            "user": null, "free": {"a100": 0, "a6000": 1, "mig-1g.5gb": 0},
            "gpumem_mib": {"a100": 40960, "a6000": 49152, "mig-1g.5gb": 5120}, "earliest_booking": null}),
        ));
    };
    if value == "slow@example.com" {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    match answer_for(kind, value) {
        Ok(v) => Ok(Json(v)),
        Err((StatusCode::OK, body)) => Err((StatusCode::OK, body)),
        Err(e) => Err(e),
    }
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
}

async fn stub_post(
    State(state): State<StubState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Json(body): Json<Value>,
) -> StatusCode {
    let _ = state.tx.send(Seen {
        path: uri.path().to_owned(),
        body,
        auth: bearer(&headers),
    });
    if uri.path().ends_with("audit") {
        StatusCode::CREATED
    } else {
        StatusCode::ACCEPTED
    }
}

/// A batch of audit reports: each is seen on its own, at the batch's path.
async fn stub_batch(
    State(state): State<StubState>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let reports = body["reports"].as_array().cloned().unwrap_or_default();
    let ids: Vec<usize> = (1..=reports.len()).collect();
    for report in reports {
        let _ = state.tx.send(Seen {
            path: uri.path().to_owned(),
            body: report,
            auth: bearer(&headers),
        });
    }
    (StatusCode::CREATED, Json(serde_json::json!({ "ids": ids })))
}

impl StubBooking {
    pub async fn start() -> Self {
        let (tx, seen) = mpsc::unbounded_channel();
        let lookups = Arc::new(AtomicUsize::new(0));
        let state = StubState {
            lookups: lookups.clone(),
            tx,
        };
        let app = Router::new()
            .route("/api/v1/schedulability", get(stub_lookup))
            // Still served, so that a call to it would be seen (none must come).
            .route("/api/v1/preemptions", post(stub_post))
            .route("/api/v1/audit", post(stub_post))
            .route("/api/v1/audit/batch", post(stub_batch))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StubBooking {
            addr,
            url: format!("http://{addr}"),
            lookups,
            seen,
        }
    }

    /// Everything seen so far, without waiting.
    pub fn drain(&mut self) -> Vec<Seen> {
        let mut out = Vec::new();
        while let Ok(s) = self.seen.try_recv() {
            out.push(s);
        }
        out
    }

    /// Waits (at most 5 s) for a call to `path`, returning it; other calls are dropped.
    pub async fn next_post(&mut self, path: &str) -> Option<Seen> {
        let wait = async {
            while let Some(seen) = self.seen.recv().await {
                if seen.path == path {
                    return Some(seen);
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .ok()
            .flatten()
    }
}
