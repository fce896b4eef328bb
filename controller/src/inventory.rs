//! The GPU inventory as the controller keeps it: what it reads of nodes, the models
//! from the booking service, and the calls into `core`'s inventory, which decides how
//! a node's cards are named and counted (units are cards: a time-sliced card is one
//! unit, a MIG device one unit of its profile; unnamed cards fall back to `gpu` and
//! unnamed mixed-strategy MIG devices to `mig-<profile>`).
//!
//! - A node's model label: its one model; a node with cards of several models gets
//!   none (refused with an Event: one label value cannot select several models).
//! - In use: cards with a pod on them (replicas of a time-sliced card rounded up).
//! - The VRAM budgets a node advertises: units x (memory per unit - reserve), one for
//!   the cards a label selects (`--gpumem-resource`) and one per model whose cards are
//!   under a resource of its own (`<gpumem-resource>-<model>`, core's
//!   [`gpu_booking_core::inventory::Budgets`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpu_booking_client::{Model, UsageReport};
use gpu_booking_core::admission::{budget_of, is_budget_resource, parse_quantity};
use gpu_booking_core::gpu_model::{ModelCatalog, ModelName, ModelPattern};
use gpu_booking_core::inventory::{
    model_inventory, node_inventory, Budgets, InventoryConfig, ModelInventory, NodeFacts,
    NodeInventory, PodGpus, MODEL_PRESENT_LABEL_PREFIX, NVIDIA_LABEL_PREFIX, NVML_MEMORY_LABEL,
};
use gpu_booking_core::preemption_policy::PreemptionPolicy;
pub use gpu_booking_core::wire::MAX_OTHER_NAMESPACES;
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Map, Value};

use crate::pods::PodInfo;

/// How cards that no pattern names are handled, and the VRAM reserve (from options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryOptions {
    pub product_label: String,
    pub fallback_model: Option<ModelName>,
    pub mig_fallback: bool,
    pub reserve_mib: u64,
}

/// The models as the controller uses them.
#[derive(Debug, Clone, Default)]
pub struct Models {
    /// How core names and counts cards.
    pub inventory: InventoryConfig,
    /// Per-model resources: resource -> model.
    pub resources: BTreeMap<String, String>,
    /// Every model name, in order.
    pub names: Vec<String>,
    /// The units each model's admin declared.
    pub declared: BTreeMap<String, i32>,
}

impl Models {
    /// From the booking service's list; models or patterns that do not parse are
    /// skipped with a warning (one bad entry must not stop the others).
    pub fn from_api(models: &[Model], generic: &[String], opts: &InventoryOptions) -> Self {
        let mut entries = Vec::new();
        let mut resources = BTreeMap::new();
        let mut model_resources = BTreeMap::new();
        let mut names = Vec::new();
        let mut declared = BTreeMap::new();
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
                model_resources.insert(resource.clone(), name.clone());
            }
            names.push(m.name.clone());
            declared.insert(m.name.clone(), i32::try_from(m.units).unwrap_or(i32::MAX));
            entries.push((name, patterns));
        }
        Self {
            inventory: InventoryConfig {
                catalog: ModelCatalog::new(entries),
                model_resources,
                gpu_resources: generic.to_vec(),
                product_label: opts.product_label.clone(),
                fallback_model: opts.fallback_model.clone(),
                mig_fallback: opts.mig_fallback,
                reserve_mib: opts.reserve_mib,
            },
            resources,
            names,
            declared,
        }
    }

    /// Whether a change from `self` to `other` changes what the inventory says.
    pub fn same_inventory(&self, other: &Models) -> bool {
        self.inventory == other.inventory && self.names == other.names
    }
}

/// What the controller keeps of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// GFD's labels (`nvidia.com/*`, the product label) and the allocatable resources.
    pub facts: NodeFacts,
    /// The value of the model label the node carries now.
    pub model_label: Option<String>,
    /// The models whose presence label (`model.gpu-booking.io/<model>`) it carries now.
    pub models_present: BTreeSet<String>,
    /// `status.capacity` and `status.allocatable` as far as the VRAM budgets go:
    /// each map (present or not) with the budget resources only (the plain one and
    /// every `<gpumem-resource>-*`), what the status patch is planned against.
    pub gpumem_status: Value,
    /// The VRAM budgets it advertises now (allocatable), by whose they are.
    pub budgets_now: Budgets,
}

impl NodeInfo {
    pub fn from_node(
        node: &Node,
        product_label: &str,
        model_label: &str,
        gpumem_resource: &str,
    ) -> Option<Self> {
        let labels = node.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        let status = node.status.as_ref();
        let allocatable: BTreeMap<String, u64> = status
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| {
                a.iter()
                    .filter_map(|(k, q)| {
                        let units = parse_quantity(&Value::String(q.0.clone()))?;
                        (units.is_finite() && units >= 1.0)
                            .then(|| (k.clone(), units.floor() as u64))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let gfd_labels = labels
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| {
                        k.starts_with(NVIDIA_LABEL_PREFIX)
                            || *k == product_label
                            || *k == NVML_MEMORY_LABEL
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let mut gpumem_status = Map::new();
        let maps = [
            ("capacity", status.and_then(|s| s.capacity.as_ref())),
            ("allocatable", status.and_then(|s| s.allocatable.as_ref())),
        ];
        for (field, map) in maps {
            if let Some(map) = map {
                let only: Map<String, Value> = map
                    .iter()
                    .filter(|(k, _)| is_budget_resource(gpumem_resource, k))
                    .map(|(k, q)| (k.clone(), json!(q.0)))
                    .collect();
                gpumem_status.insert(field.to_owned(), Value::Object(only));
            }
        }
        let budgets_now = allocatable
            .iter()
            .filter_map(|(k, &n)| Some((budget_of(gpumem_resource, k)?, n)))
            .collect();
        Some(Self {
            name: node.metadata.name.clone()?,
            facts: NodeFacts {
                labels: gfd_labels,
                allocatable,
            },
            model_label: label(model_label),
            models_present: labels
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix(MODEL_PRESENT_LABEL_PREFIX))
                .map(str::to_owned)
                .collect(),
            gpumem_status: json!({ "status": gpumem_status }),
            budgets_now,
        })
    }

    /// Whether GFD describes this node's GPUs (its product label is there); a GPU
    /// node without it has no telemetry to name or size its cards.
    pub fn has_gpu_telemetry(&self, product_label: &str) -> bool {
        self.facts.labels.contains_key(product_label)
    }
}

/// One model as the controller reports it: core's count (units, cards in use, by
/// other workloads too, the VRAM budget) and the namespaces whose other workloads
/// hold its cards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub counted: ModelInventory,
    /// Sorted; at most [`MAX_OTHER_NAMESPACES`].
    pub other_namespaces: Vec<String>,
}

impl Usage {
    /// The report of this count, stamped with the time of the pod view it was
    /// counted from (`counted_at`), not the time it is sent: the webhook's lend
    /// ledger keeps a unit it admitted until a count taken after it, and a report
    /// waits behind the models sent before it (one at a time, on a slow service).
    pub fn report(&self, counted_at: DateTime<Utc>) -> UsageReport {
        let clamp = gpu_booking_core::wire::reported;
        UsageReport {
            in_use: clamp(self.counted.in_use),
            cards: Some(clamp(self.counted.cards)),
            gpumem_advertised: Some(self.counted.gpumem_advertised),
            gpumem_unit_mib: self.counted.gpumem_unit_mib.map(clamp),
            others_in_use: Some(clamp(self.counted.others_in_use)),
            other_namespaces: self.other_namespaces.clone(),
            counted_at: Some(counted_at),
        }
    }
}

/// The node's GPUs as core counts them.
pub fn node_gpus(node: &NodeInfo, models: &Models) -> NodeInventory {
    node_inventory(&node.facts, &models.inventory)
}

/// The model label a node should carry: its one model, or the one model of its
/// generic cards (core's [`NodeInventory::model_label`]); none for several.
pub fn node_model(node: &NodeInfo, models: &Models) -> Option<String> {
    node_gpus(node, models)
        .model_label(&models.inventory)
        .ok()
        .flatten()
        .map(|m| m.as_str().to_owned())
}

/// The model a pod's GPUs are of: its per-model resource's, else its node's.
pub fn pod_model(pod: &PodInfo, node_models: &HashMap<String, Option<String>>) -> Option<String> {
    let gpu = pod.gpu.as_ref()?;
    if let Some(model) = &gpu.model {
        return Some(model.clone());
    }
    node_models.get(pod.node.as_deref()?).cloned().flatten()
}

/// Each node's model for pods that ask for a generic GPU.
pub fn node_models<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
    models: &Models,
) -> HashMap<String, Option<String>> {
    nodes
        .into_iter()
        .map(|n| {
            let inv = node_gpus(n, models);
            let model = inv
                .generic_model(&models.inventory)
                .map(|m| m.as_str().to_owned());
            (n.name.clone(), model)
        })
        .collect()
}

/// Cards, cards in use and the advertised VRAM budget of every model (every model
/// appears, with zeros if need be; models of the fallbacks appear when they have
/// cards).
pub fn usage<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
    pods: impl IntoIterator<Item = &'a PodInfo>,
    models: &Models,
    policy: &PreemptionPolicy,
) -> BTreeMap<String, Usage> {
    let nodes: Vec<(&NodeInfo, NodeInventory)> = nodes
        .into_iter()
        .map(|n| (n, node_gpus(n, models)))
        .collect();
    let names: Vec<ModelName> = models
        .names
        .iter()
        .filter_map(|n| ModelName::parse(n).ok())
        .collect();
    // Pods naming a model by resource carry it as a string; core wants the name. A
    // pod waiting for the scheduler is counted on the model it was admitted on.
    let pods: Vec<(&PodInfo, Option<ModelName>)> = pods
        .into_iter()
        .filter(|p| counts_in_use(p))
        .map(|p| {
            let mut model = p.gpu.as_ref().and_then(|g| g.model.as_deref());
            if p.node.is_none() {
                model = model.or(p.model_label.as_deref());
            }
            (p, model.and_then(|m| ModelName::parse(m).ok()))
        })
        .collect();
    let generic_models = node_models(nodes.iter().map(|(n, _)| *n), models);
    let mut other_namespaces: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (pod, named) in pods.iter().filter(|(p, _)| lost_to_bookings(p, policy)) {
        let model = named
            .as_ref()
            .map(|m| m.as_str().to_owned())
            .or_else(|| pod_model(pod, &generic_models));
        if let Some(model) = model {
            other_namespaces
                .entry(model)
                .or_default()
                .insert(&pod.namespace);
        }
    }
    let counted = model_inventory(
        nodes
            .iter()
            .map(|(n, inv)| (n.name.as_str(), inv, &n.budgets_now)),
        pods.iter().filter_map(|(p, model)| {
            Some(PodGpus {
                node: p.node.as_deref(),
                model: model.as_ref(),
                units: p.gpu.as_ref()?.units,
                other: lost_to_bookings(p, policy),
            })
        }),
        &names,
        &models.inventory,
    );
    counted
        .into_iter()
        .map(|(m, counted)| {
            let name = m.as_str().to_owned();
            let other_namespaces = other_namespaces
                .get(&name)
                .map(|set| {
                    set.iter()
                        .take(MAX_OTHER_NAMESPACES)
                        .map(|ns| (*ns).to_owned())
                        .collect()
                })
                .unwrap_or_default();
            let usage = Usage {
                counted,
                other_namespaces,
            };
            (name, usage)
        })
        .collect()
}

/// Whether a pod counts in its model's cards in use: it holds GPUs on a node, or it
/// was admitted with a GPU (booked or lent: our webhook named its model) and waits
/// for the scheduler, which has not found it unschedulable (core's
/// [`model_inventory`] says why).
pub fn counts_in_use(pod: &PodInfo) -> bool {
    pod.holds_gpu()
        || (pod.node.is_none()
            && pod.gpu.is_some()
            && pod.priority.is_some()
            && !pod.finished
            && !pod.deleting
            && !pod.unschedulable)
}

/// Whether bookings cannot get the pod's cards while it runs (core's policy).
fn lost_to_bookings(pod: &PodInfo, policy: &PreemptionPolicy) -> bool {
    policy.held_from_bookings(pod.priority, &pod.namespace)
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

    #[test]
    fn a_report_is_stamped_with_the_time_it_was_counted() {
        let counted_at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let usage = Usage {
            counted: ModelInventory {
                cards: 4,
                in_use: 3,
                others_in_use: 1,
                gpumem_advertised: true,
                gpumem_unit_mib: Some(u64::MAX),
            },
            other_namespaces: vec!["research".into()],
        };
        let report = usage.report(counted_at);
        assert_eq!(
            report,
            UsageReport {
                in_use: 3,
                cards: Some(4),
                gpumem_advertised: Some(true),
                // Beyond the wire's integers: clamped, never wrapped.
                gpumem_unit_mib: Some(gpu_booking_core::wire::reported(u64::MAX)),
                others_in_use: Some(1),
                other_namespaces: vec!["research".into()],
                counted_at: Some(counted_at),
            }
        );
        // However late it is sent, the service records the count's time.
        let received = counted_at + chrono::TimeDelta::seconds(12);
        assert_eq!(report.reported_at(received), counted_at);
    }

    fn opts() -> InventoryOptions {
        InventoryOptions {
            product_label: "nvidia.com/gpu.product".into(),
            fallback_model: ModelName::parse("gpu").ok(),
            mig_fallback: true,
            reserve_mib: 512,
        }
    }

    fn node(name: &str, product: Option<&str>, alloc: &[(&str, u64)]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            facts: NodeFacts {
                labels: product
                    .map(|p| ("nvidia.com/gpu.product".to_owned(), p.to_owned()))
                    .into_iter()
                    .collect(),
                allocatable: alloc.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            },
            model_label: None,
            models_present: BTreeSet::new(),
            gpumem_status: json!({"status": {}}),
            budgets_now: Budgets::new(),
        }
    }

    fn pod(node: &str, units: u64, model: Option<&str>) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: format!("p-{node}-{units}"),
            uid: format!("u-{node}-{units}"),
            priority: None,
            booking_id: None,
            booking_units: None,
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
            preempt_at: None,
            preempt_for: None,
            preemption_rounds: 0,
            scheduler_preempted: false,
            unschedulable: false,
            unschedulable_for_gpu: false,
            served: true,
            gpu_removed: None,
            restart_told: Vec::new(),
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
            &opts(),
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
        let usage = usage(&nodes, &pods, &models, &PreemptionPolicy::default());
        let pair = |m: &str| (usage[m].counted.cards, usage[m].counted.in_use);
        assert_eq!(pair("a100-40gb"), (6, 3));
        assert_eq!(pair("mig-1g.5gb"), (7, 3));
        assert_eq!(pair("rtx-a6000"), (8, 1));
        assert_eq!(pair("any"), (1, 0));
        let by_node = node_models(&nodes, &models);
        assert_eq!(by_node["r1"].as_deref(), Some("rtx-a6000"));
        assert_eq!(by_node["cpu"], None);
    }

    /// The university's two-model node (A6000s on the generic resource, L40S on
    /// `nvidia.com/l40s`): a lent l40s pod that the scheduler has not bound yet takes
    /// its card in the report, so the webhook's ledger, which lets an admission go at
    /// a report taken `--lend-settle` after it, does not lend that card again.
    #[test]
    fn a_lent_pod_waiting_for_the_scheduler_holds_its_card() {
        let generic = vec!["nvidia.com/gpu".to_owned()];
        let models = Models::from_api(
            &[
                model("a6000", &["*A6000*"], None),
                model("l40s", &["*L40S*"], Some("nvidia.com/l40s")),
            ],
            &generic,
            &opts(),
        );
        let nodes = vec![node(
            "mixed-00",
            Some("NVIDIA-RTX-A6000"),
            &[("nvidia.com/gpu", 4), ("nvidia.com/l40s", 2)],
        )];
        let lent = |name: &str, node: Option<&str>, model: Option<&str>| {
            let mut p = pod("mixed-00", 1, model);
            p.name = name.into();
            p.uid = format!("u-{name}");
            p.node = node.map(str::to_owned);
            p.priority = Some(crate::pods::Priority::Low);
            p
        };
        let mut waiting = lent("waits", None, Some("l40s"));
        let pods = vec![
            lent("bound", Some("mixed-00"), Some("l40s")),
            waiting.clone(),
        ];
        let policy = PreemptionPolicy::new(Some("ns"), Vec::new());
        let u = usage(&nodes, &pods, &models, &policy);
        assert_eq!(
            (u["l40s"].counted.cards, u["l40s"].counted.in_use),
            (2, 2),
            "the l40s card a pod was admitted for reads as free until it is bound"
        );
        assert_eq!(u["a6000"].counted.in_use, 0);
        // A generic request waiting for the scheduler counts on the model the
        // webhook admitted it on (its model label).
        let mut generic_pod = lent("a6000-waits", None, None);
        generic_pod.model_label = Some("a6000".into());
        let u = usage(&nodes, [&generic_pod], &models, &policy);
        assert_eq!(u["a6000"].counted.in_use, 1);
        // Once the scheduler found no room for it, it holds nothing (the controller's
        // backstop runs it on CPU).
        waiting.unschedulable = true;
        let pods = vec![
            lent("bound", Some("mixed-00"), Some("l40s")),
            waiting.clone(),
        ];
        assert_eq!(
            usage(&nodes, &pods, &models, &policy)["l40s"]
                .counted
                .in_use,
            1
        );
        // Nor does a pod nobody admitted (no standing of ours: no model it is for).
        waiting.unschedulable = false;
        waiting.priority = None;
        let pods = vec![lent("bound", Some("mixed-00"), Some("l40s")), waiting];
        assert_eq!(
            usage(&nodes, &pods, &models, &policy)["l40s"]
                .counted
                .in_use,
            1
        );
    }

    #[test]
    fn first_match_wins() {
        let generic = ["nvidia.com/gpu".to_owned()];
        let models = Models::from_api(
            &[
                model("broad", &["*A100*"], None),
                model("narrow", &["A100-*-40GB"], None),
            ],
            &generic,
            &opts(),
        );
        let n = node("x", Some("A100-SXM4-40GB"), &[("nvidia.com/gpu", 1)]);
        assert_eq!(node_model(&n, &models).as_deref(), Some("broad"));
        // A bad model or pattern is skipped, the rest still work.
        let models = Models::from_api(
            &[
                model("Bad Name", &["*"], None),
                model("ok", &["", "*A100*"], None),
            ],
            &generic,
            &opts(),
        );
        assert_eq!(node_model(&n, &models).as_deref(), Some("ok"));
        // No pattern names the card: the fallback model `gpu` does.
        let t4 = node("t4", Some("Tesla-T4-SHARED"), &[("nvidia.com/gpu", 4)]);
        assert_eq!(node_model(&t4, &models).as_deref(), Some("gpu"));
    }

    #[test]
    fn node_status_as_kept_and_gpumem_read() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {
                "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360",
                "kubernetes.io/hostname": "n1"}},
            "status": {"capacity": {"cpu": "8", "gpu-booking.io/gpumem": "14848",
                                    "gpu-booking.io/gpumem-l4": "22000"},
                       "allocatable": {"cpu": "8", "nvidia.com/gpu": "1",
                                       "gpu-booking.io/gpumem": "14848",
                                       "gpu-booking.io/gpumem-l4": "22000"}}
        }))
        .unwrap();
        let info = NodeInfo::from_node(
            &node,
            "nvidia.com/gpu.product",
            "gpu-booking.io/model",
            "gpu-booking.io/gpumem",
        )
        .unwrap();
        assert_eq!(info.facts.labels.len(), 2, "only GFD's labels are kept");
        assert_eq!(
            info.budgets_now,
            [(None, 14848), (ModelName::parse("l4").ok(), 22000)]
                .into_iter()
                .collect()
        );
        let budgets =
            json!({"gpu-booking.io/gpumem": "14848", "gpu-booking.io/gpumem-l4": "22000"});
        assert_eq!(
            info.gpumem_status,
            json!({"status": {"capacity": budgets, "allocatable": budgets}})
        );
        assert!(info.has_gpu_telemetry("nvidia.com/gpu.product"));
    }
}
