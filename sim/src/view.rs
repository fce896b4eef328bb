//! What the simulated cluster looks like, for people: each GPU node's units and who
//! holds them (booked or lent, whose, until when), the pods still pending and why,
//! and the notebooks running on CPU. Read from the fake API server's objects, as
//! `kubectl get nodes,pods` would.

use std::collections::BTreeMap;

use gpu_booking_core::admission::{
    our_label, DEFAULT_MODEL_NODE_LABEL, DEFAULT_TERMINATE_AT_ANNOTATION, GPU_REMOVED_ANNOTATION,
    MODEL_LABEL, PREEMPT_AT_ANNOTATION, PRIORITY_LABEL,
};
use gpu_booking_core::offers::GPU_WANTED_ANNOTATION;
use gpu_booking_core::wire::Offer;
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

const DEFAULT_PRODUCT_LABEL: &str = gpu_booking_core::inventory::DEFAULT_PRODUCT_LABEL;
/// KubeSpawner's raw username (the annotation of `USERNAME_KEY`).
const USERNAME_ANNOTATION: &str = gpu_booking_core::admission::USERNAME_KEY;
/// Where the node agent reports a pod's last GPU activity (and the controller reads it).
const LAST_GPU_ACTIVITY_ANNOTATION: &str =
    gpu_booking_core::admission::LAST_GPU_ACTIVITY_ANNOTATION;

/// The whole cluster.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    /// Pods the scheduler has not placed, with its reason.
    pub pending: Vec<PodView>,
    /// Pods running without a GPU (CPU-only notebooks, stripped or recreated ones).
    pub cpu: Vec<PodView>,
    /// The GPUs offered back to users on CPU, as the booking service keeps them
    /// ([`ClusterView::with_offers`]); empty where the view was read from the
    /// cluster alone.
    pub offers: Vec<Offer>,
}

/// One GPU node.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// `nvidia.com/gpu.product` as GFD labels it.
    pub product: String,
    /// The bookable model the controller labelled the node with, if any.
    pub model: Option<String>,
    /// Allocatable `nvidia.com/gpu` units; each is held by one pod or free.
    pub units: Vec<Option<String>>,
    /// The pods holding them.
    pub pods: Vec<PodView>,
}

/// One pod, as a person reads it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PodView {
    pub name: String,
    pub namespace: Option<String>,
    /// `hub.jupyter.org/username`, the raw name KubeSpawner writes.
    pub user: Option<String>,
    /// `booked` (high priority), `lent` (low priority), or `other`.
    pub kind: &'static str,
    pub model: Option<String>,
    pub gpus: u64,
    /// `terminate-at`: when a booked pod ends.
    pub until: Option<String>,
    pub node: Option<String>,
    pub phase: String,
    pub terminating: bool,
    /// Why it is not placed (`PodScheduled=False`), or why its GPU was removed.
    pub why: Option<String>,
    /// Its last GPU activity as the node agent reported it
    /// (`gpu-booking.io/last-gpu-activity`): lent pods idle longest give way first.
    pub last_gpu_activity: Option<String>,
    /// When a lent pod marked to give way to a booked user is ended
    /// (`gpu-booking.io/preempt-at`, the controller's grace deadline).
    pub taken_back_at: Option<String>,
    /// What a pod on CPU wanted (`gpu-booking.io/gpu-wanted`): its user waits for a
    /// GPU offered back.
    pub gpu_wanted: Option<String>,
    /// The GPU offered back to its user for this pod, held until the offer's `until`.
    pub offer: Option<Offer>,
}

impl ClusterView {
    /// The view of everything `server` holds.
    pub fn of(server: &FakeApiServer) -> Self {
        Self::from_objects(&server.list::<Node>(None), &server.list::<Pod>(None))
    }

    /// The view of these nodes and pods.
    pub fn from_objects(nodes: &[Node], pods: &[Pod]) -> Self {
        let mut by_node: BTreeMap<String, Vec<PodView>> = BTreeMap::new();
        let mut pending = Vec::new();
        let mut cpu = Vec::new();
        for pod in pods {
            let view = PodView::of(pod);
            if is_finished(&view.phase) {
                continue;
            }
            match (&view.node, view.gpus) {
                (None, _) => pending.push(view),
                (Some(_), 0) => cpu.push(view),
                (Some(node), _) => by_node.entry(node.clone()).or_default().push(view),
            }
        }
        let nodes = nodes
            .iter()
            .filter_map(|node| {
                let labels = node.metadata.labels.clone().unwrap_or_default();
                let product = labels.get(DEFAULT_PRODUCT_LABEL)?.clone();
                let name = node.metadata.name.clone().unwrap_or_default();
                let total = node
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .map(|a| {
                        a.iter()
                            .filter(|(k, _)| k.starts_with(NVIDIA_RESOURCE_PREFIX))
                            .filter_map(|(_, q)| q.0.parse::<usize>().ok())
                            .sum()
                    })
                    .unwrap_or(0);
                let mut pods = by_node.remove(&name).unwrap_or_default();
                pods.sort_by(|a, b| a.name.cmp(&b.name));
                let mut units: Vec<Option<String>> = pods
                    .iter()
                    .flat_map(|p| std::iter::repeat_n(Some(p.name.clone()), p.gpus as usize))
                    .collect();
                units.resize(total.max(units.len()), None);
                Some(NodeView {
                    name,
                    product,
                    model: labels.get(DEFAULT_MODEL_NODE_LABEL).cloned(),
                    units,
                    pods,
                })
            })
            .collect();
        pending.sort_by(|a: &PodView, b| a.name.cmp(&b.name));
        cpu.sort_by(|a: &PodView, b| a.name.cmp(&b.name));
        Self {
            nodes,
            pending,
            cpu,
            offers: Vec::new(),
        }
    }

    /// The view with the booking service's offers: each on the pod it was made for.
    pub fn with_offers(mut self, offers: Vec<Offer>) -> Self {
        let pods = self
            .nodes
            .iter_mut()
            .flat_map(|n| n.pods.iter_mut())
            .chain(self.pending.iter_mut())
            .chain(self.cpu.iter_mut());
        for pod in pods {
            pod.offer = offers
                .iter()
                .find(|o| o.pod == pod.name && pod.namespace.as_deref() == Some(&o.namespace))
                .cloned();
        }
        self.offers = offers;
        self
    }

    /// A pod by name, wherever it is.
    pub fn pod(&self, name: &str) -> Option<&PodView> {
        self.nodes
            .iter()
            .flat_map(|n| n.pods.iter())
            .chain(self.pending.iter())
            .chain(self.cpu.iter())
            .find(|p| p.name == name)
    }
}

fn is_finished(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed")
}

/// GPUs a pod holds: the larger of the sum over containers and the largest init
/// container, each container's request (or its limit when it gives no request).
/// The resources of NVIDIA's device plugin.
const NVIDIA_RESOURCE_PREFIX: &str = "nvidia.com/";

pub fn gpus_of(pod: &Pod) -> u64 {
    let Some(spec) = &pod.spec else { return 0 };
    let main: u64 = spec.containers.iter().map(container_gpus).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(container_gpus)
        .max()
        .unwrap_or(0);
    main.max(init)
}

/// GPUs one container asks for (its request, else its limit), of any NVIDIA GPU
/// resource: the generic one, a MIG profile's, a model's own (`nvidia.com/t4`).
pub fn container_gpus(c: &k8s_openapi::api::core::v1::Container) -> u64 {
    let res = c.resources.as_ref();
    let get =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            let m = m?;
            let gpus = m
                .iter()
                .filter(|(k, _)| k.starts_with(NVIDIA_RESOURCE_PREFIX))
                .filter_map(|(_, q)| q.0.parse::<u64>().ok())
                .collect::<Vec<u64>>();
            (!gpus.is_empty()).then(|| gpus.iter().sum())
        };
    get(res.and_then(|r| r.requests.as_ref()))
        .or_else(|| get(res.and_then(|r| r.limits.as_ref())))
        .unwrap_or(0)
}

impl PodView {
    pub fn of(pod: &Pod) -> Self {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let unschedulable = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| c.message.clone().or(c.reason.clone()).unwrap_or_default());
        let ours = |key: &str| our_label(|k| labels.get(k).map(String::as_str), key);
        let kind = match ours(PRIORITY_LABEL) {
            Some("high") => "booked",
            Some("low") => "lent",
            _ => "other",
        };
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            user: annotations.get(USERNAME_ANNOTATION).cloned(),
            kind,
            model: ours(MODEL_LABEL).map(str::to_owned),
            gpus: gpus_of(pod),
            until: annotations.get(DEFAULT_TERMINATE_AT_ANNOTATION).cloned(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            why: unschedulable.or_else(|| annotations.get(GPU_REMOVED_ANNOTATION).cloned()),
            last_gpu_activity: annotations.get(LAST_GPU_ACTIVITY_ANNOTATION).cloned(),
            taken_back_at: annotations.get(PREEMPT_AT_ANNOTATION).cloned(),
            gpu_wanted: annotations.get(GPU_WANTED_ANNOTATION).cloned(),
            offer: None,
            namespace: pod.metadata.namespace.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, gpus: &str, labels: serde_json::Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "jhub", "labels": labels,
                "annotations": {"hub.jupyter.org/username": "zoë@uni.example", "terminate-at": "2026-03-02T10:00:00Z"}},
            "spec": {"containers": [{"name": "notebook", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"}
        });
        if let Some(node) = node {
            p["spec"]["nodeName"] = json!(node);
        } else {
            p["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]});
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn shows_who_holds_each_unit_and_what_waits() {
        let nodes = crate::lab::demo_lab()
            .iter()
            .map(crate::lab::GpuNode::to_node)
            .collect::<Vec<_>>();
        let pods = [
            pod(
                "booked",
                Some("gpu-a100-0"),
                "1",
                json!({"gpu-booking.io/priority": "high", "gpu-booking.io/model": "a100"}),
            ),
            pod(
                "lent",
                Some("gpu-a100-0"),
                "1",
                // A pod admitted before the upgrade: the legacy key.
                json!({"gpu-booking/priority": "low"}),
            ),
            pod("waiting", None, "1", json!({})),
            pod("cpu", Some("cpu-0"), "0", json!({})),
        ];
        let view = ClusterView::from_objects(&nodes, &pods);
        assert_eq!(view.nodes.len(), 3, "the CPU node is not a GPU node");
        let a100 = &view.nodes[0];
        assert_eq!(a100.units, vec![Some("booked".into()), Some("lent".into())]);
        assert_eq!(view.pod("booked").unwrap().kind, "booked");
        assert_eq!(
            view.pod("booked").unwrap().until.as_deref(),
            Some("2026-03-02T10:00:00Z")
        );
        assert_eq!(view.pod("lent").unwrap().kind, "lent");
        assert_eq!(view.nodes[1].units, vec![None, None]);
        assert_eq!(view.pending.len(), 1);
        assert!(view.pending[0]
            .why
            .as_deref()
            .unwrap()
            .contains("Insufficient nvidia.com/gpu"));
        assert_eq!(view.cpu[0].name, "cpu");
        assert_eq!(view.cpu[0].user.as_deref(), Some("zoë@uni.example"));
    }

    #[test]
    fn shows_the_grace_deadline_and_the_offer_on_its_pod() {
        let nodes = crate::lab::demo_lab()
            .iter()
            .map(crate::lab::GpuNode::to_node)
            .collect::<Vec<_>>();
        let mut lent = pod(
            "lent",
            Some("gpu-a100-0"),
            "1",
            json!({"gpu-booking.io/priority": "low"}),
        );
        let mut cpu = pod("cpu", Some("cpu-0"), "0", json!({}));
        for (p, key, value) in [
            (&mut lent, PREEMPT_AT_ANNOTATION, "2026-03-02T10:32:00Z"),
            (&mut cpu, GPU_WANTED_ANNOTATION, "1 a100"),
        ] {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.into());
        }
        let offer: Offer = serde_json::from_value(json!({
            "user": "zoë@uni.example", "model": "a100", "units": 1, "namespace": "jhub",
            "pod": "cpu", "offered_at": "2026-03-02T10:40:00Z", "until": "2026-03-02T10:45:00Z"
        }))
        .unwrap();
        let view = ClusterView::from_objects(&nodes, &[lent, cpu]).with_offers(vec![offer.clone()]);
        assert_eq!(
            view.pod("lent").unwrap().taken_back_at.as_deref(),
            Some("2026-03-02T10:32:00Z")
        );
        assert_eq!(view.pod("lent").unwrap().offer, None);
        assert_eq!(
            view.pod("cpu").unwrap().gpu_wanted.as_deref(),
            Some("1 a100")
        );
        assert_eq!(view.pod("cpu").unwrap().offer.as_ref(), Some(&offer));
        assert_eq!(view.offers, vec![offer]);
    }
}
