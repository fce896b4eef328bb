//! Notebooks that answer: the lab's network plugin gives every pod the kubelet starts
//! an address of its own on loopback (`status.podIP`, a free `127.x.y.z`: the whole
//! of 127.0.0.0/8 is the host's, so nothing needs configuring), and for each notebook
//! (a pod KubeSpawner labels `component=singleuser-server`) a stand-in single-user
//! server listens at that address on the notebook's port (`notebook-port`, else its
//! first container port, else 8888), as the notebook's container would: JupyterHub
//! sees it up and its proxy reaches it. The server stops when the pod goes (marked for
//! deletion, finished, or removed).
//!
//! An address is taken only once its port could be bound (the listener is kept for
//! the server), so labs side by side, in one process or several, never share one.
//!
//! The stand-in answers every request with 200: `GET .../api` with a Jupyter Server's
//! version document (`{"version": ...}`), anything else with a line naming the pod.
//! Every answer carries `X-JupyterHub-Version`, as jupyterhub-singleuser's does, with
//! the version of the hub that spawned the pod (KubeSpawner's annotation): an image
//! whose `jupyterhub` matches the hub's, so the hub logs no version mismatch.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::stack::{stopped, Task};

/// The label KubeSpawner puts on single-user servers.
const COMPONENT_LABEL: &str = "component";
const SINGLEUSER: &str = "singleuser-server";
/// The Jupyter Server version the stand-in reports.
const SERVER_VERSION: &str = "2.14.2";
/// KubeSpawner's annotation with the spawning hub's version.
const HUB_VERSION_ANNOTATION: &str = "hub.jupyter.org/jupyterhub-version";

/// A bound but not yet served notebook port, by pod uid.
type Bound = Arc<Mutex<HashMap<String, std::net::TcpListener>>>;

/// The stand-in servers of the lab's notebooks.
pub struct NotebookServers {
    task: Task,
}

/// The port the notebook's container listens on.
fn notebook_port(pod: &Value) -> u16 {
    let ports: Vec<&Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .collect();
    ports
        .iter()
        .find(|p| p["name"] == "notebook-port")
        .or(ports.first())
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(8888)
}

fn is_notebook(pod: &Value) -> bool {
    pod.pointer(&format!("/metadata/labels/{COMPONENT_LABEL}"))
        .and_then(Value::as_str)
        == Some(SINGLEUSER)
}

/// A random address in 127.0.0.0/8 other than 127.0.0.1 and the network's own.
fn random_loopback() -> Ipv4Addr {
    loop {
        let [a, b, c, _] = random_bytes();
        let ip = Ipv4Addr::new(127, a, b, c);
        if ip != Ipv4Addr::new(127, 0, 0, 1) && c != 0 && c != 255 {
            return ip;
        }
    }
}

/// Four bytes that differ from call to call (a hash of a counter and the time).
fn random_bytes() -> [u8; 4] {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    (hasher.finish() as u32).to_be_bytes()
}

impl NotebookServers {
    /// Becomes `server`'s network plugin and serves each notebook while it runs.
    pub fn start(server: &FakeApiServer) -> Self {
        let bound: Bound = Arc::default();
        let pending = bound.clone();
        server.set_pod_network(move |pod| {
            if !is_notebook(pod) {
                return Some(random_loopback().to_string());
            }
            let uid = pod.pointer("/metadata/uid")?.as_str()?.to_owned();
            let port = notebook_port(pod);
            // A handful of tries: a taken address is rare in 16 million.
            (0..16).find_map(|_| {
                let ip = random_loopback();
                let listener = std::net::TcpListener::bind(SocketAddr::from((ip, port))).ok()?;
                pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(uid.clone(), listener);
                Some(ip.to_string())
            })
        });
        let server = server.clone();
        let task = Task::spawn(|rx| async move {
            let mut serving: HashMap<String, Task> = HashMap::new();
            {
                // Re-checked after every change to the cluster; never done.
                let watch = server.wait_until(|s| {
                    reconcile(s, &bound, &mut serving);
                    false
                });
                tokio::select! {
                    () = watch => {}
                    () = stopped(rx) => {}
                }
            }
            for (_, task) in serving.drain() {
                task.stop().await;
            }
        });
        Self { task }
    }

    pub async fn stop(self) {
        self.task.stop().await;
    }
}

/// Serves each running notebook whose port is bound, and stops serving those whose
/// pod went; a bound port of a pod that is gone is let go.
fn reconcile(server: &FakeApiServer, bound: &Bound, serving: &mut HashMap<String, Task>) {
    let pods = server.list::<Pod>(None);
    let mut bound = bound.lock().unwrap_or_else(|e| e.into_inner());
    if bound.is_empty() && serving.is_empty() {
        return;
    }
    let running: HashMap<&str, &Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    serving.retain(|uid, _| running.contains_key(uid.as_str()));
    let exists: std::collections::HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    bound.retain(|uid, _| exists.contains(uid.as_str()));
    for (uid, pod) in running {
        if serving.contains_key(uid) {
            continue;
        }
        if let Some(listener) = bound.remove(uid) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let hub_version = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HUB_VERSION_ANNOTATION))
                .and_then(|v| axum::http::HeaderValue::from_str(v).ok());
            if let Some(task) = serve(listener, name, hub_version) {
                serving.insert(uid.to_owned(), task);
            }
        }
    }
}

/// Serves the stand-in on `listener` until its task is stopped.
fn serve(
    listener: std::net::TcpListener,
    pod: String,
    hub_version: Option<axum::http::HeaderValue>,
) -> Option<Task> {
    listener.set_nonblocking(true).ok()?;
    let listener = tokio::net::TcpListener::from_std(listener).ok()?;
    let version = serde_json::json!({"version": SERVER_VERSION});
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let version = version.clone();
        let pod = pod.clone();
        let hub_version = hub_version.clone();
        async move {
            use axum::response::IntoResponse;
            let mut response = if uri.path().trim_end_matches('/').ends_with("/api") {
                axum::Json(version).into_response()
            } else {
                format!("the stand-in single-user server of pod {pod}\n").into_response()
            };
            if let Some(hub_version) = hub_version {
                response
                    .headers_mut()
                    .insert("x-jupyterhub-version", hub_version);
            }
            response
        }
    });
    Some(Task::spawn(|rx| async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stopped(rx))
            .await;
    }))
}
