//! The demo's HTTP routes over the simulated cluster (no authentication: the demo
//! serves them on its local address only, next to the booking page):
//!
//! - `GET /demo/cluster`: the [`ClusterView`](crate::view::ClusterView) as JSON, with
//!   the GPUs offered back;
//! - `POST /demo/notebooks` `{"user": "...", "gpus": 1}`: spawn that user's notebook
//!   as JupyterHub would; answers the pod as admitted, with the admission warnings;
//! - `DELETE /demo/notebooks/{user}`: stop it (a graceful delete).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use gpu_booking_core::username::Username;
use serde::Deserialize;
use serde_json::json;

use crate::view::PodView;
use crate::SimCluster;

/// Most GPUs one spawn may ask for (KubeSpawner profiles ask for a few at most).
const MAX_GPUS: u32 = 8;

#[derive(Debug, Deserialize)]
pub struct SpawnRequest {
    pub user: String,
    #[serde(default = "one")]
    pub gpus: u32,
}

fn one() -> u32 {
    1
}

/// The routes, for merging into the demo's router.
pub fn router(sim: Arc<SimCluster>) -> Router {
    Router::new()
        .route("/demo/cluster", get(cluster))
        .route("/demo/notebooks", post(spawn))
        .route("/demo/notebooks/{user}", delete(stop))
        .with_state(sim)
}

async fn cluster(State(sim): State<Arc<SimCluster>>) -> Json<crate::ClusterView> {
    Json(sim.view_with_offers().await)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

/// A refusal or failure of the simulated API server, as the demo's caller sees it.
fn api_error(e: kube::Error) -> Response {
    match e {
        kube::Error::Api(status) => {
            let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::BAD_GATEWAY);
            error(code, "refused_by_cluster", status.message)
        }
        other => error(StatusCode::BAD_GATEWAY, "cluster_error", other.to_string()),
    }
}

async fn spawn(State(sim): State<Arc<SimCluster>>, Json(req): Json<SpawnRequest>) -> Response {
    let user = match Username::parse(&req.user) {
        Ok(user) => user,
        Err(e) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_user",
                e.to_string(),
            )
        }
    };
    if req.gpus > MAX_GPUS {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "too_many_gpus",
            format!("a notebook asks for at most {MAX_GPUS} GPUs"),
        );
    }
    match sim.spawn(user.as_str(), req.gpus).await {
        Ok(pod) => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            (
                StatusCode::CREATED,
                Json(json!({"pod": PodView::of(&pod), "warnings": sim.admission_warnings(&name)})),
            )
                .into_response()
        }
        Err(e) => api_error(e),
    }
}

async fn stop(State(sim): State<Arc<SimCluster>>, Path(user): Path<String>) -> Response {
    if let Err(e) = Username::parse(&user) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_user",
            e.to_string(),
        );
    }
    match sim.stop_notebook(&user).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(e),
    }
}
