//! Test nodes that read like sentences:
//! `NodeBuilder::new("gpu-1").gpus(2).label("nvidia.com/gpu.product", "NVIDIA-A100")`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};

/// A node with `status.allocatable` (and the same `capacity`), labels, taints and a
/// `Ready` condition. By default 16 CPUs, 64 GiB of memory, 110 pods and no GPU.
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    allocatable: BTreeMap<String, String>,
    taints: Vec<Value>,
    unschedulable: bool,
}

impl NodeBuilder {
    pub fn new(name: &str) -> Self {
        let allocatable = [("cpu", "16"), ("memory", "64Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]);
        Self {
            name: name.to_owned(),
            labels,
            allocatable,
            taints: Vec::new(),
            unschedulable: false,
        }
    }

    /// `nvidia.com/gpu` allocatable (what the NVIDIA device plugin advertises).
    pub fn gpus(self, count: u32) -> Self {
        self.allocatable("nvidia.com/gpu", &count.to_string())
    }

    /// Any allocatable resource (`cpu`, `memory`, `pods`, an extended resource such
    /// as `gpu-booking.io/gpumem`), as a quantity.
    pub fn allocatable(mut self, resource: &str, quantity: &str) -> Self {
        self.allocatable
            .insert(resource.to_owned(), quantity.to_owned());
        self
    }

    /// Drops an allocatable resource (a node that does not advertise it).
    pub fn without(mut self, resource: &str) -> Self {
        self.allocatable.remove(resource);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// A taint (`effect`: `NoSchedule`, `PreferNoSchedule` or `NoExecute`).
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints
            .push(json!({"key": key, "value": value, "effect": effect}));
        self
    }

    /// Cordoned (`spec.unschedulable`).
    pub fn unschedulable(mut self) -> Self {
        self.unschedulable = true;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node object.
    pub fn build(&self) -> Node {
        let mut spec = json!({});
        if !self.taints.is_empty() {
            spec["taints"] = json!(self.taints);
        }
        if self.unschedulable {
            spec["unschedulable"] = json!(true);
        }
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": spec,
            "status": {
                "capacity": self.allocatable,
                "allocatable": self.allocatable,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                // What the kubelet reports of itself (`kubectl get nodes -o wide`), the
                // runtime the fake kubelet's container IDs name.
                "nodeInfo": {
                    "kubeletVersion": "v1.30.0", "containerRuntimeVersion": "containerd://1.7.22",
                    "operatingSystem": "linux", "architecture": "amd64",
                    "osImage": "", "kernelVersion": "", "kubeProxyVersion": "",
                    "machineID": "", "systemUUID": "", "bootID": "",
                },
            },
        });
        // Every field above is one Node has; an error here is a bug in this builder.
        serde_json::from_value(node).unwrap_or_else(|e| panic!("fake: NodeBuilder: {e}"))
    }
}
