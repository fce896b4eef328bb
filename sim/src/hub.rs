//! A small fake JupyterHub: the part of its REST API the controller's
//! `--on-expiry hub-restart` uses, and the hub's poll of its servers, played at the
//! worst moment for a controller that deletes and re-creates a pod behind its back.
//!
//! What it copies from JupyterHub and KubeSpawner (`kubespawner/spawner.py`):
//!
//! - `poll()` looks the server's pod up by name and answers 1, "pod doesn't exist or
//!   has been deleted", when none is there; the hub then marks the server stopped and
//!   calls `stop()`, which deletes the pod *by name* (no uid precondition) and waits
//!   until it is gone. Here the poll runs as soon as a running server's pod is missing
//!   (the real one runs every 30 s: this is the worst case, deterministic), and the
//!   stop that follows waits for a pod of that name to appear again (the controller's
//!   copy, created a moment later) before it deletes it, as a stop running just after
//!   the copy's create would.
//! - The hub does not poll a server it is stopping or starting itself.
//! - `GET /hub/api/user`: the token's owner with its scopes (`servers`);
//!   `GET /hub/api/users/{name}`: `servers` with `ready`, `pending` and
//!   `last_activity` (when the server last started), 404 for a user it does not know;
//!   `DELETE /hub/api/users/{name}/server`: 202, the stop runs on (KubeSpawner deletes
//!   the pod and waits until it is gone), 204 when not running;
//!   `POST /hub/api/users/{name}/server`: 201 once the pod is created (through the
//!   webhook, with the hub's identity), 400 while running or pending. A token in
//!   `Authorization: token ...` (or `Bearer`), else 403.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tokio::net::TcpListener;

use crate::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use crate::stack::{stopped, Task};
use crate::SimCluster;

/// How long a stop waits for the pod to disappear (KubeSpawner's `start_timeout`
/// is 300 s; the lab's grace periods are a second or two).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the poll's stop waits for a pod to come back under the name.
const WORST_MOMENT_WAIT: Duration = Duration::from_secs(10);

/// A server's state in the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerStatus {
    Spawning,
    Running,
    Stopping,
    Stopped,
}

#[derive(Debug, Clone)]
struct Server {
    gpus: u32,
    status: ServerStatus,
    /// The hub's `last_activity` of the server: here, when it last started (the
    /// stand-in notebook reports no activity of its own).
    last_activity: chrono::DateTime<chrono::Utc>,
}

#[derive(Clone)]
struct Inner {
    servers: Arc<Mutex<HashMap<String, Server>>>,
    /// Pods the hub's poll deleted, by user.
    poll_deletes: Arc<Mutex<Vec<String>>>,
    server: FakeApiServer,
    client: kube::Client,
    grace: Option<i64>,
    token: String,
}

impl Inner {
    fn status(&self, user: &str) -> Option<ServerStatus> {
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .map(|s| s.status)
    }

    fn set(&self, user: &str, status: ServerStatus) {
        if let Some(s) = self
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(user)
        {
            s.status = status;
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NOTEBOOK_NAMESPACE)
    }

    /// Spawner.start(): the pod created with the hub's identity.
    async fn start(&self, user: &str) -> Result<(), String> {
        let gpus = {
            let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
            let Some(s) = servers.get_mut(user) else {
                return Err("no such user".into());
            };
            s.status = ServerStatus::Spawning;
            s.last_activity = chrono::Utc::now();
            s.gpus
        };
        match crate::spawn_notebook(&self.client, user, gpus, self.grace).await {
            Ok(_) => {
                self.set(user, ServerStatus::Running);
                Ok(())
            }
            Err(e) => {
                self.set(user, ServerStatus::Stopped);
                Err(e.to_string())
            }
        }
    }

    /// KubeSpawner's stop(): delete by name, wait until no pod has the name.
    async fn stop_pod(&self, user: &str) {
        let name = pod_name(user);
        let _ = self.pods().delete(&name, &DeleteParams::default()).await;
        let gone = |s: &FakeApiServer| s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name).is_none();
        let _ = tokio::time::timeout(STOP_TIMEOUT, self.server.wait_until(gone)).await;
    }

    /// The hub's poll: a running server whose pod is missing is stopped, and its
    /// stop deletes whatever pod carries the name a moment later.
    async fn poll_forever(self) {
        loop {
            let mut missing = Vec::new();
            let servers = self.servers.clone();
            self.server
                .wait_until(|s| {
                    let servers = servers.lock().unwrap_or_else(|e| e.into_inner());
                    missing = servers
                        .iter()
                        .filter(|(_, srv)| srv.status == ServerStatus::Running)
                        .filter(|(user, _)| {
                            s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
                                .is_none()
                        })
                        .map(|(user, _)| user.clone())
                        .collect();
                    !missing.is_empty()
                })
                .await;
            for user in missing {
                // poll() returned 1: the hub takes the server for stopped.
                self.set(&user, ServerStatus::Stopped);
                tracing::info!(%user, "fake hub: poll found no pod; server stopped");
                let name = pod_name(&user);
                let this = self.clone();
                tokio::spawn(async move {
                    let back =
                        |s: &FakeApiServer| s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &name).is_some();
                    if tokio::time::timeout(WORST_MOMENT_WAIT, this.server.wait_until(back))
                        .await
                        .is_ok()
                    {
                        this.poll_deletes
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(user.clone());
                        tracing::info!(%user, "fake hub: stop() deletes the pod by name");
                        this.stop_pod(&user).await;
                    }
                });
            }
        }
    }
}

/// The fake hub, serving its API on 127.0.0.1.
pub struct FakeHub {
    /// The API URL (`http://127.0.0.1:<port>/hub/api`), as `JUPYTERHUB_API_URL`.
    pub api_url: String,
    /// The service token it accepts.
    pub token: String,
    inner: Inner,
    task: Task,
    poller: tokio::task::JoinHandle<()>,
}

impl FakeHub {
    /// Starts the hub on `sim` on a free port, accepting `token`.
    pub async fn start(sim: &SimCluster, token: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        Self::start_on(listener, sim, token).await
    }

    /// The API URL a hub serving on `listener` has (to configure the controller
    /// before the hub starts).
    pub fn api_url_of(listener: &TcpListener) -> anyhow::Result<String> {
        Ok(format!("http://{}/hub/api", listener.local_addr()?))
    }

    /// Starts the hub on `sim`, serving on `listener`, accepting `token`.
    pub async fn start_on(
        listener: TcpListener,
        sim: &SimCluster,
        token: &str,
    ) -> anyhow::Result<Self> {
        let inner = Inner {
            servers: Arc::default(),
            poll_deletes: Arc::default(),
            server: sim.server.clone(),
            client: sim.hub_client(),
            grace: sim.notebook_grace(),
            token: token.to_owned(),
        };
        let api_url = Self::api_url_of(&listener)?;
        let app = Router::new()
            .route("/hub/api/user", get(token_owner))
            .route("/hub/api/users/{name}", get(user))
            .route(
                "/hub/api/users/{name}/server",
                axum::routing::post(start_server).delete(stop_server),
            )
            .with_state(inner.clone());
        let task = Task::spawn(|rx| async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped(rx))
                .await;
        });
        let poller = tokio::spawn(inner.clone().poll_forever());
        Ok(Self {
            api_url,
            token: token.to_owned(),
            inner,
            task,
            poller,
        })
    }

    /// A user starts their server from the hub's page, asking for `gpus` GPUs.
    pub async fn spawn(&self, user: &str, gpus: u32) -> Result<(), String> {
        self.inner
            .servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                user.to_owned(),
                Server {
                    gpus,
                    status: ServerStatus::Stopped,
                    last_activity: chrono::Utc::now(),
                },
            );
        self.inner.start(user).await
    }

    /// What the hub thinks of `user`'s server.
    pub fn status(&self, user: &str) -> Option<ServerStatus> {
        self.inner.status(user)
    }

    /// Users whose pod the hub's poll deleted.
    pub fn poll_deletes(&self) -> Vec<String> {
        self.inner
            .poll_deletes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub async fn stop(self) {
        self.poller.abort();
        self.task.stop().await;
    }
}

fn authorized(inner: &Inner, headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let token = value
        .strip_prefix("token ")
        .or_else(|| value.strip_prefix("Bearer "));
    token == Some(inner.token.as_str())
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({"status": status.as_u16(), "message": message})),
    )
        .into_response()
}

/// `GET /hub/api/user`: the token's owner, a service whose role grants `servers`
/// (JupyterHub 2+ lists the token's scopes there).
async fn token_owner(State(inner): State<Inner>, headers: HeaderMap) -> Response {
    if !authorized(&inner, &headers) {
        return refuse(StatusCode::FORBIDDEN, "Missing or invalid credentials");
    }
    Json(json!({"kind": "service", "name": "gpu-booking", "scopes": ["servers", "read:users"]}))
        .into_response()
}

async fn user(
    State(inner): State<Inner>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&inner, &headers) {
        return refuse(StatusCode::FORBIDDEN, "Missing or invalid credentials");
    }
    let Some((status, last_activity)) = inner
        .servers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&name)
        .map(|s| (s.status, s.last_activity))
    else {
        return refuse(StatusCode::NOT_FOUND, "No such user");
    };
    let server = |ready: bool, pending: Option<&str>| {
        json!({"": {"name": "", "ready": ready, "pending": pending,
            "last_activity": last_activity.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}})
    };
    let servers = match status {
        ServerStatus::Stopped => json!({}),
        ServerStatus::Running => server(true, None),
        ServerStatus::Spawning => server(false, Some("spawn")),
        ServerStatus::Stopping => server(false, Some("stop")),
    };
    Json(json!({"kind": "user", "name": name, "servers": servers})).into_response()
}

async fn start_server(
    State(inner): State<Inner>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&inner, &headers) {
        return refuse(StatusCode::FORBIDDEN, "Missing or invalid credentials");
    }
    match inner.status(&name) {
        None => refuse(StatusCode::NOT_FOUND, "No such user"),
        Some(ServerStatus::Stopped) => match inner.start(&name).await {
            Ok(()) => StatusCode::CREATED.into_response(),
            Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &e),
        },
        Some(ServerStatus::Stopping) => {
            refuse(StatusCode::BAD_REQUEST, &format!("{name} is pending stop"))
        }
        Some(_) => refuse(
            StatusCode::BAD_REQUEST,
            &format!("{name} is already running"),
        ),
    }
}

async fn stop_server(
    State(inner): State<Inner>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&inner, &headers) {
        return refuse(StatusCode::FORBIDDEN, "Missing or invalid credentials");
    }
    match inner.status(&name) {
        None => refuse(StatusCode::NOT_FOUND, "No such user"),
        Some(ServerStatus::Stopped) => StatusCode::NO_CONTENT.into_response(),
        Some(ServerStatus::Stopping) => StatusCode::ACCEPTED.into_response(),
        Some(_) => {
            inner.set(&name, ServerStatus::Stopping);
            tokio::spawn(async move {
                inner.stop_pod(&name).await;
                inner.set(&name, ServerStatus::Stopped);
            });
            StatusCode::ACCEPTED.into_response()
        }
    }
}
