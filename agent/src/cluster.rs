//! The Kubernetes calls of the agent, behind [`Cluster`]: list the node's pods,
//! annotate a pod, record an Event on it. [`KubeCluster`] talks to the API server;
//! [`crate::fake_cluster::FakeCluster`] keeps pods in memory for tests.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

use crate::pods::PodInfo;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A Kubernetes call that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(pub String);

/// Severity of a [`PodEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum EventKind {
    Normal,
    Warning,
}

/// An Event about a pod, as `kubectl describe pod` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodEvent {
    pub kind: EventKind,
    /// PascalCase, e.g. `GPUProcessesReclaimed`.
    pub reason: String,
    /// PascalCase, e.g. `Reclaim`.
    pub action: String,
    /// What happened, in words for the pod's owner (at most 1 kB).
    pub note: String,
}

pub trait Cluster: Send + Sync + 'static {
    /// Every pod bound to this node.
    fn node_pods(&self) -> BoxFuture<'_, Result<Vec<Pod>, ClusterError>>;

    /// Sets one annotation on the pod, if it is still the pod with that UID.
    fn annotate_pod<'a>(
        &'a self,
        pod: &'a PodInfo,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), ClusterError>>;

    /// Records an Event on the pod.
    fn pod_event<'a>(
        &'a self,
        pod: &'a PodInfo,
        event: &'a PodEvent,
    ) -> BoxFuture<'a, Result<(), ClusterError>>;
}

/// The API server, through kube.
pub struct KubeCluster {
    client: Client,
    node_name: String,
    recorder: Recorder,
}

impl KubeCluster {
    pub fn new(client: Client, node_name: String) -> Self {
        let reporter = Reporter {
            controller: "gpu-booking-agent".into(),
            instance: Some(node_name.clone()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node_name,
        }
    }
}

fn err(e: kube::Error) -> ClusterError {
    ClusterError(e.to_string())
}

/// Cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl Cluster for KubeCluster {
    fn node_pods(&self) -> BoxFuture<'_, Result<Vec<Pod>, ClusterError>> {
        Box::pin(async move {
            let api: Api<Pod> = Api::all(self.client.clone());
            let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
            Ok(api.list(&params).await.map_err(err)?.items)
        })
    }

    fn annotate_pod<'a>(
        &'a self,
        pod: &'a PodInfo,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
            // The UID makes the patch fail on a pod recreated under the same name.
            let patch = serde_json::json!({
                "metadata": {"uid": pod.uid, "annotations": {key: value}}
            });
            api.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(err)?;
            Ok(())
        })
    }

    fn pod_event<'a>(
        &'a self,
        pod: &'a PodInfo,
        event: &'a PodEvent,
    ) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            };
            let ev = Event {
                type_: match event.kind {
                    EventKind::Normal => EventType::Normal,
                    EventKind::Warning => EventType::Warning,
                },
                reason: cut(&event.reason, 128),
                note: Some(cut(&event.note, 1024)),
                action: cut(&event.action, 128),
                secondary: None,
            };
            self.recorder.publish(&ev, &reference).await.map_err(err)
        })
    }
}
