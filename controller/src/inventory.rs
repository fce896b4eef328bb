//! The GPU inventory: which model each node's GPUs are, how many units of each model
//! the cluster has, and how many are in use. Pure functions of nodes, models and pods.
//!
//! - A node's model: its product label (`nvidia.com/gpu.product`) matched against the
//!   models' ordered patterns, first match wins ([`ModelCatalog`]).
//! - Units: a model with its own resource (`nvidia.com/a100`, or a MIG profile such as
//!   `nvidia.com/mig-1g.5gb` under the mixed strategy) counts that resource's
//!   allocatable on every node; a model without one counts the generic resource
//!   (`nvidia.com/gpu`) of the nodes whose product matches it.
//! - In use: the GPU units of pods bound to a node and not finished, on the model of
//!   their per-model resource, else the model of their node.

use std::collections::{BTreeMap, HashMap};

use gpu_booking_client::Model;
use gpu_booking_core::admission::parse_quantity;
use gpu_booking_core::gpu_model::{ModelCatalog, ModelName, ModelPattern};
use k8s_openapi::api::core::v1::Node;

use crate::pods::PodInfo;

/// The models as the controller uses them.
#[derive(Debug, Clone, Default)]
pub struct Models {
    pub catalog: ModelCatalog,
    /// Per-model resources: resource -> model.
    pub resources: BTreeMap<String, String>,
    /// Every model name, in order.
    pub names: Vec<String>,
}

impl Models {
    /// From the booking service's list; models or patterns that do not parse are
    /// skipped with a warning (one bad entry must not stop the others).
    pub fn from_api(models: &[Model], generic: &[String]) -> Self {
        let mut entries = Vec::new();
        let mut resources = BTreeMap::new();
        let mut names = Vec::new();
        for m in models {
            let Ok(name) = ModelName::parse(&m.name) else {
                tracing::warn!(model = %m.name, "model name is not valid; skipped");
                continue;
            };
            let patterns: Vec<ModelPattern> = m
                .patterns
                .iter()
                .filter_map(|p| match ModelPattern::parse(p) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::warn!(model = %m.name, pattern = %p, error = %e, "pattern skipped");
                        None
                    }
                })
                .collect();
            if let Some(resource) = m.resource.as_ref().filter(|r| !generic.contains(r)) {
                resources.insert(resource.clone(), m.name.clone());
            }
            names.push(m.name.clone());
            entries.push((name, patterns));
        }
        Self {
            catalog: ModelCatalog::new(entries),
            resources,
            names,
        }
    }
}

/// What the controller keeps of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub product: Option<String>,
    /// The value of the model label the node carries now.
    pub model_label: Option<String>,
    /// Allocatable units of each resource (whole units; GPU resources only matter).
    pub allocatable: BTreeMap<String, u64>,
}

impl NodeInfo {
    pub fn from_node(node: &Node, product_label: &str, model_label: &str) -> Option<Self> {
        let labels = node.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| {
                a.iter()
                    .filter_map(|(k, q)| {
                        let units = parse_quantity(&serde_json::Value::String(q.0.clone()))?;
                        (units.is_finite() && units >= 1.0)
                            .then(|| (k.clone(), units.floor() as u64))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            name: node.metadata.name.clone()?,
            product: label(product_label),
            model_label: label(model_label),
            allocatable,
        })
    }
}

/// Units and units in use of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub units: u64,
    pub in_use: u64,
}

impl Usage {
    pub fn free(&self) -> u64 {
        self.units.saturating_sub(self.in_use)
    }
}

/// The model of a node: its product matched by the catalog; else, when the node
/// offers exactly one model's own resource, that model.
pub fn node_model(node: &NodeInfo, models: &Models) -> Option<String> {
    if let Some(model) = node
        .product
        .as_deref()
        .and_then(|p| models.catalog.model_for(p))
    {
        return Some(model.to_owned());
    }
    let mut own = models
        .resources
        .iter()
        .filter(|(resource, _)| node.allocatable.get(*resource).is_some_and(|&u| u > 0))
        .map(|(_, model)| model);
    match (own.next(), own.next()) {
        (Some(model), None) => Some(model.clone()),
        _ => None,
    }
}

/// The model a pod's GPUs are of: its per-model resource's, else its node's.
pub fn pod_model(pod: &PodInfo, node_models: &HashMap<String, Option<String>>) -> Option<String> {
    let gpu = pod.gpu.as_ref()?;
    if let Some(model) = &gpu.model {
        return Some(model.clone());
    }
    node_models.get(pod.node.as_deref()?).cloned().flatten()
}

/// Each node's model.
pub fn node_models<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
    models: &Models,
) -> HashMap<String, Option<String>> {
    nodes
        .into_iter()
        .map(|n| (n.name.clone(), node_model(n, models)))
        .collect()
}

/// Units and units in use of every model (every model appears, with zeros if need be).
pub fn usage<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInfo> + Clone,
    pods: impl IntoIterator<Item = &'a PodInfo>,
    models: &Models,
    generic: &[String],
) -> BTreeMap<String, Usage> {
    let mut out: BTreeMap<String, Usage> = models
        .names
        .iter()
        .map(|m| (m.clone(), Usage::default()))
        .collect();
    let by_node = node_models(nodes.clone(), models);
    for node in nodes {
        for (resource, model) in &models.resources {
            if let Some(&units) = node.allocatable.get(resource) {
                out.entry(model.clone()).or_default().units += units;
            }
        }
        let Some(Some(model)) = by_node.get(&node.name) else {
            continue;
        };
        // A model with its own resource counted it above; its nodes' generic
        // resource (if any) is not the model's.
        if models.resources.values().any(|m| m == model) {
            continue;
        }
        let units: u64 = generic.iter().filter_map(|r| node.allocatable.get(r)).sum();
        out.entry(model.clone()).or_default().units += units;
    }
    for pod in pods {
        if !pod.holds_gpu() {
            continue;
        }
        if let (Some(model), Some(gpu)) = (pod_model(pod, &by_node), &pod.gpu) {
            if let Some(usage) = out.get_mut(&model) {
                usage.in_use += gpu.units;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::GpuUse;
    use serde_json::json;

    fn model(name: &str, patterns: &[&str], resource: Option<&str>) -> Model {
        serde_json::from_value(json!({"name": name, "patterns": patterns, "resource": resource}))
            .unwrap()
    }

    fn node(name: &str, product: Option<&str>, alloc: &[(&str, u64)]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            product: product.map(str::to_owned),
            model_label: None,
            allocatable: alloc.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn pod(node: &str, units: u64, model: Option<&str>) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: format!("p-{node}-{units}"),
            uid: format!("u-{node}-{units}"),
            priority: None,
            booking_id: None,
            model_label: None,
            user: None,
            terminate_at: None,
            owned: false,
            node: Some(node.into()),
            finished: false,
            deleting: false,
            placement: Default::default(),
            gpu: Some(GpuUse {
                units,
                model: model.map(str::to_owned),
            }),
            started: None,
            last_activity: None,
            scheduler_preempted: false,
            unschedulable: false,
        }
    }

    #[test]
    fn several_models_and_mig() {
        let generic = vec!["nvidia.com/gpu".to_owned()];
        let models = Models::from_api(
            &[
                model("a100-40gb", &["A100-*-40GB", "NVIDIA-A100-*-40GB"], None),
                model("mig-1g.5gb", &[], Some("nvidia.com/mig-1g.5gb")),
                model("rtx-a6000", &["*A6000*"], None),
                model("any", &["*"], None),
            ],
            &generic,
        );
        let nodes = vec![
            node(
                "a1",
                Some("NVIDIA-A100-SXM4-40GB"),
                &[("nvidia.com/gpu", 4), ("cpu", 64)],
            ),
            node("a2", Some("A100-PCIE-40GB"), &[("nvidia.com/gpu", 2)]),
            node("r1", Some("NVIDIA-RTX-A6000"), &[("nvidia.com/gpu", 8)]),
            // MIG, mixed strategy: the GPU is split into profiles, no generic GPUs.
            node(
                "m1",
                Some("NVIDIA-A100-SXM4-40GB"),
                &[("nvidia.com/mig-1g.5gb", 7)],
            ),
            node("t1", Some("Tesla-T4"), &[("nvidia.com/gpu", 1)]),
            node("cpu", None, &[("cpu", 8)]),
        ];
        let pods = vec![
            pod("a1", 1, None),
            pod("a2", 2, None),
            pod("m1", 3, Some("mig-1g.5gb")),
            pod("r1", 1, None),
            {
                let mut done = pod("r1", 5, None);
                done.finished = true;
                done
            },
            {
                let mut pending = pod("r1", 7, None);
                pending.node = None;
                pending
            },
        ];
        let usage = usage(&nodes, &pods, &models, &generic);
        assert_eq!(
            usage["a100-40gb"],
            Usage {
                units: 6,
                in_use: 3
            }
        );
        assert_eq!(
            usage["mig-1g.5gb"],
            Usage {
                units: 7,
                in_use: 3
            }
        );
        assert_eq!(
            usage["rtx-a6000"],
            Usage {
                units: 8,
                in_use: 1
            }
        );
        assert_eq!(
            usage["any"],
            Usage {
                units: 1,
                in_use: 0
            }
        );
        let by_node = node_models(&nodes, &models);
        assert_eq!(by_node["r1"].as_deref(), Some("rtx-a6000"));
        assert_eq!(by_node["cpu"], None);
    }

    #[test]
    fn first_match_wins() {
        let models = Models::from_api(
            &[
                model("broad", &["*A100*"], None),
                model("narrow", &["A100-*-40GB"], None),
            ],
            &[],
        );
        let n = node("x", Some("A100-SXM4-40GB"), &[]);
        assert_eq!(node_model(&n, &models).as_deref(), Some("broad"));
        // A bad model or pattern is skipped, the rest still work.
        let models = Models::from_api(
            &[
                model("Bad Name", &["*"], None),
                model("ok", &["", "*A100*"], None),
            ],
            &[],
        );
        assert_eq!(node_model(&n, &models).as_deref(), Some("ok"));
    }
}
