//! Which lent pods give way when booked pods wait: the cluster's state put into the
//! terms of core's eviction module ([`gpu_booking_core::eviction`]), one round at a
//! time. Pure.
//!
//! - **Where the booked pod could run**: the nodes of its model that match its
//!   `nodeSelector` and required node affinity (the webhook selects the model's node
//!   label; the node's model as the controller computes it counts as that label where
//!   the node has none yet). Lent pods elsewhere are never its victims.
//! - **Room**, per node and model, as the scheduler counts it: the allocatable GPU
//!   resource of the model (its own resource, else the generic one on nodes of the
//!   model) and the VRAM budget resource, minus what the pods bound there request.
//!   Pods already terminating, and pods the controller is acting on, count as gone:
//!   the room they free is on its way, so it is not freed a second time.
//! - **Tenants**: lent pods (`gpu-booking.io/priority=low`) holding a GPU of the model,
//!   neither terminating nor being acted on. Booked pods are never tenants.
//! - A round decides for each Pending booked pod in turn and books the room it gets,
//!   so two booked pods never count on the same freed unit.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpu_booking_core::eviction::{self, Need, Plan, Room, Tenant};

use crate::inventory::{self, Models, NodeInfo};
use crate::pods::{PodInfo, Priority};

/// What the round reads.
pub struct View<'a> {
    pub pods: &'a HashMap<String, PodInfo>,
    pub nodes: &'a BTreeMap<String, NodeInfo>,
    pub node_labels: &'a HashMap<String, BTreeMap<String, String>>,
    pub models: &'a Models,
    pub generic: &'a [String],
    pub gpumem_resource: &'a str,
    pub model_node_label: &'a str,
    /// Pods being acted on (uids).
    pub going: &'a HashSet<String>,
    /// VRAM to keep spare beside a booked pod's budget, MiB.
    pub cushion_mib: u64,
}

/// What a round decided for one booked pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Room is free or on its way: nothing to do but wait for the scheduler.
    Fits { node: String },
    /// These lent pods (uids, least recently used first) give way on `node`.
    Evict { node: String, victims: Vec<String> },
    /// No lent pod could make room for it.
    NoRoom,
}

/// Room and tenants for one round of decisions.
pub struct Round {
    node_models: HashMap<String, Option<String>>,
    /// Free GPU units by (model, node).
    units: BTreeMap<(String, String), u64>,
    /// Free VRAM budget by node (`None`: not advertised).
    vram: BTreeMap<String, Option<u64>>,
    /// The VRAM budget one unit holds, by (model, node), where the node advertises it.
    unit_vram: BTreeMap<(String, String), u64>,
    /// Tenants by model; ids are `namespace/name`.
    tenants: BTreeMap<String, Vec<Tenant>>,
    uids: HashMap<String, String>,
}

fn going(pod: &PodInfo, view: &View<'_>) -> bool {
    pod.deleting || view.going.contains(&pod.uid)
}

impl Round {
    pub fn new(view: &View<'_>) -> Self {
        let node_models = inventory::node_models(view.nodes.values(), view.models);
        let mut units = BTreeMap::new();
        let mut vram = BTreeMap::new();
        for node in view.nodes.values() {
            for (resource, model) in &view.models.resources {
                if let Some(&n) = node.facts.allocatable.get(resource).filter(|&&n| n > 0) {
                    units.insert((model.clone(), node.name.clone()), n);
                }
            }
            if let Some(Some(model)) = node_models.get(&node.name) {
                if !view.models.resources.values().any(|m| m == model) {
                    let n: u64 = view
                        .generic
                        .iter()
                        .filter_map(|r| node.facts.allocatable.get(r))
                        .sum();
                    units.insert((model.clone(), node.name.clone()), n);
                }
            }
            vram.insert(
                node.name.clone(),
                node.facts.allocatable.get(view.gpumem_resource).copied(),
            );
        }
        // Before any pod is subtracted: what one unit of each model holds on each node.
        let unit_vram = units
            .iter()
            .filter_map(|(key, &n)| {
                let total = vram.get(&key.1).copied().flatten()?;
                (n > 0).then(|| (key.clone(), total / n))
            })
            .collect();
        let mut tenants: BTreeMap<String, Vec<Tenant>> = BTreeMap::new();
        let mut uids = HashMap::new();
        for pod in view.pods.values() {
            let (Some(node), Some(gpu)) = (&pod.node, &pod.gpu) else {
                continue;
            };
            if !pod.holds_gpu() || going(pod, view) {
                continue;
            }
            let Some(model) = inventory::pod_model(pod, &node_models) else {
                continue;
            };
            if let Some(free) = units.get_mut(&(model.clone(), node.clone())) {
                *free = free.saturating_sub(gpu.units);
            }
            if let Some(Some(free)) = vram.get_mut(node) {
                *free = free.saturating_sub(pod.placement.gpumem_mib);
            }
            if pod.priority == Some(Priority::Low) {
                uids.insert(pod.key(), pod.uid.clone());
                tenants.entry(model).or_default().push(Tenant {
                    id: pod.key(),
                    node: node.clone(),
                    units: gpu.units,
                    vram_mib: pod.placement.gpumem_mib,
                    last_active: pod.last_used(),
                });
            }
        }
        Self {
            node_models,
            units,
            vram,
            unit_vram,
            tenants,
            uids,
        }
    }

    /// Whether the pod may be scheduled on `node`: its `nodeSelector` and required
    /// node affinity ([`NodeConstraints::allows`], core), against the node's labels,
    /// where the node's model as the controller computes it stands for the model
    /// label when the node is not labelled yet.
    fn eligible(&self, view: &View<'_>, pod: &PodInfo, node: &str) -> bool {
        let mut labels = view.node_labels.get(node).cloned().unwrap_or_default();
        if let Some(Some(model)) = self.node_models.get(node) {
            labels
                .entry(view.model_node_label.to_owned())
                .or_insert_with(|| model.clone());
        }
        pod.placement.constraints.allows(node, &labels)
    }

    /// Decides for the booked `pod` that needs `model`, and books the room it gets.
    pub fn decide(&mut self, view: &View<'_>, pod: &PodInfo, model: &str) -> Decision {
        let need = Need {
            units: pod.gpu.as_ref().map_or(1, |g| g.units.max(1)),
            vram_mib: pod.placement.gpumem_mib,
        };
        let rooms: Vec<Room> = self
            .units
            .range((model.to_owned(), String::new())..)
            .take_while(|((m, _), _)| m == model)
            .filter(|((_, node), _)| self.eligible(view, pod, node))
            .map(|((_, node), free)| Room {
                node: node.clone(),
                free_units: *free,
                free_vram_mib: self.vram.get(node).copied().flatten(),
            })
            .collect();
        let tenants = self.tenants.get(model).map(Vec::as_slice).unwrap_or(&[]);
        // The cushion never asks for more VRAM than the pod's units hold: a pod whose
        // budget fills its cards (whole cards) can use nothing beyond them, and asking
        // for it would cost a second victim for one booked unit.
        let cushion = rooms
            .iter()
            .filter_map(|room| self.unit_vram.get(&(model.to_owned(), room.node.clone())))
            .map(|&per_unit| (per_unit.saturating_mul(need.units)).saturating_sub(need.vram_mib))
            .fold(view.cushion_mib, u64::min);
        match eviction::plan(&need, cushion, &rooms, tenants) {
            Plan::Fits { node } => {
                self.reserve(model, &node, &need);
                Decision::Fits { node }
            }
            Plan::Evict { node, victims } => {
                let list = self.tenants.entry(model.to_owned()).or_default();
                let (gone, kept): (Vec<Tenant>, Vec<Tenant>) =
                    list.drain(..).partition(|t| victims.contains(&t.id));
                *list = kept;
                for t in &gone {
                    if let Some(free) = self.units.get_mut(&(model.to_owned(), node.clone())) {
                        *free = free.saturating_add(t.units);
                    }
                    if let Some(Some(free)) = self.vram.get_mut(&node) {
                        *free = free.saturating_add(t.vram_mib);
                    }
                }
                self.reserve(model, &node, &need);
                let victims = victims
                    .iter()
                    .filter_map(|id| self.uids.get(id).cloned())
                    .collect();
                Decision::Evict { node, victims }
            }
            Plan::NoRoom => Decision::NoRoom,
        }
    }

    fn reserve(&mut self, model: &str, node: &str, need: &Need) {
        if let Some(free) = self.units.get_mut(&(model.to_owned(), node.to_owned())) {
            *free = free.saturating_sub(need.units);
        }
        if let Some(Some(free)) = self.vram.get_mut(node) {
            *free = free.saturating_sub(need.vram_mib);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{GpuUse, Placement};
    use chrono::{DateTime, Utc};
    use gpu_booking_client::Model;

    fn t(s: &str) -> Option<DateTime<Utc>> {
        Some(s.parse().unwrap())
    }

    fn pod(name: &str, node: Option<&str>, priority: Priority, started: &str) -> PodInfo {
        PodInfo {
            namespace: "jhub".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            priority: Some(priority),
            booking_id: None,
            booking_units: None,
            model_label: None,
            user: None,
            terminate_at: None,
            owned: false,
            node: node.map(str::to_owned),
            finished: false,
            deleting: false,
            placement: Placement::default(),
            gpu: Some(GpuUse {
                units: 1,
                model: None,
            }),
            started: t(started),
            last_activity: None,
            preemption_rounds: 0,
            scheduler_preempted: false,
            unschedulable: node.is_none(),
            unschedulable_for_gpu: false,
        }
    }

    fn node(name: &str, product: &str, gpus: u64) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            facts: gpu_booking_core::inventory::NodeFacts {
                labels: [("nvidia.com/gpu.product".to_owned(), product.to_owned())].into(),
                allocatable: [("nvidia.com/gpu".to_owned(), gpus)].into(),
            },
            ..NodeInfo::default()
        }
    }

    fn models() -> Models {
        let model = |name: &str, pattern: &str| -> Model {
            serde_json::from_value(serde_json::json!({"name": name, "patterns": [pattern]}))
                .unwrap()
        };
        Models::from_api(
            &[model("a100", "*A100*"), model("a6000", "*A6000*")],
            &["nvidia.com/gpu".to_owned()],
            &crate::inventory::InventoryOptions {
                product_label: "nvidia.com/gpu.product".into(),
                fallback_model: None,
                mig_fallback: true,
                reserve_mib: 0,
            },
        )
    }

    struct World {
        pods: HashMap<String, PodInfo>,
        nodes: BTreeMap<String, NodeInfo>,
        labels: HashMap<String, BTreeMap<String, String>>,
        models: Models,
        generic: Vec<String>,
        going: HashSet<String>,
    }

    impl World {
        fn new(nodes: Vec<NodeInfo>, pods: Vec<PodInfo>) -> Self {
            Self {
                pods: pods.into_iter().map(|p| (p.uid.clone(), p)).collect(),
                nodes: nodes.into_iter().map(|n| (n.name.clone(), n)).collect(),
                labels: HashMap::new(),
                models: models(),
                generic: vec!["nvidia.com/gpu".into()],
                going: HashSet::new(),
            }
        }
        fn view(&self) -> View<'_> {
            View {
                pods: &self.pods,
                nodes: &self.nodes,
                node_labels: &self.labels,
                models: &self.models,
                generic: &self.generic,
                gpumem_resource: "gpu-booking.io/gpumem",
                model_node_label: "gpu-booking.io/model",
                going: &self.going,
                cushion_mib: 256,
            }
        }
        fn decide(&self, booked: &str) -> Decision {
            let view = self.view();
            let pod = &self.pods[&format!("uid-{booked}")];
            Round::new(&view).decide(&view, pod, "a100")
        }
    }

    fn busy() -> World {
        World::new(
            vec![
                node("a", "NVIDIA-A100", 2),
                node("b", "NVIDIA-RTX-A6000", 1),
            ],
            vec![
                pod("high", Some("a"), Priority::High, "2026-01-01T00:00:00Z"),
                pod("low-new", Some("a"), Priority::Low, "2026-01-03T00:00:00Z"),
                pod(
                    "other-model",
                    Some("b"),
                    Priority::Low,
                    "2026-01-01T00:00:00Z",
                ),
                pod("booked", None, Priority::High, "2026-01-04T00:00:00Z"),
            ],
        )
    }

    #[test]
    fn the_lent_pod_of_the_model_never_a_booked_one_or_another_model() {
        let w = busy();
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "a".into(),
                victims: vec!["uid-low-new".into()]
            }
        );
    }

    #[test]
    fn a_victim_on_its_way_out_is_not_replaced() {
        let mut w = busy();
        w.going.insert("uid-low-new".into());
        assert_eq!(w.decide("booked"), Decision::Fits { node: "a".into() });
        let mut w = busy();
        w.pods.get_mut("uid-low-new").unwrap().deleting = true;
        assert_eq!(w.decide("booked"), Decision::Fits { node: "a".into() });
    }

    #[test]
    fn two_booked_pods_do_not_share_one_freed_unit() {
        let mut w = busy();
        w.pods.insert(
            "uid-low-old".into(),
            pod("low-old", Some("a"), Priority::Low, "2026-01-02T00:00:00Z"),
        );
        w.nodes.get_mut("a").unwrap().facts.allocatable = [("nvidia.com/gpu".to_owned(), 3)].into();
        let mut second = pod("booked-2", None, Priority::High, "2026-01-05T00:00:00Z");
        second.uid = "uid-booked-2".into();
        w.pods.insert(second.uid.clone(), second);
        let view = w.view();
        let mut round = Round::new(&view);
        let first = round.decide(&view, &w.pods["uid-booked"], "a100");
        let second = round.decide(&view, &w.pods["uid-booked-2"], "a100");
        assert_eq!(
            (first, second),
            (
                Decision::Evict {
                    node: "a".into(),
                    victims: vec!["uid-low-old".into()]
                },
                Decision::Evict {
                    node: "a".into(),
                    victims: vec!["uid-low-new".into()]
                }
            )
        );
        assert_eq!(
            round.decide(&view, &w.pods["uid-booked"], "a100"),
            Decision::NoRoom
        );
    }

    #[test]
    fn only_nodes_the_booked_pod_selects() {
        let mut w = busy();
        w.nodes.insert("c".into(), node("c", "NVIDIA-A100", 1));
        w.pods.insert(
            "uid-low-c".into(),
            pod("low-c", Some("c"), Priority::Low, "2025-01-01T00:00:00Z"),
        );
        // Unrestricted, the least recently used (on c) goes.
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "c".into(),
                victims: vec!["uid-low-c".into()]
            }
        );
        // Pinned to node a by a label only a has.
        w.labels
            .insert("a".into(), [("zone".to_owned(), "x".to_owned())].into());
        w.pods
            .get_mut("uid-booked")
            .unwrap()
            .placement
            .constraints
            .node_selector = [
            ("zone".to_owned(), "x".to_owned()),
            ("gpu-booking.io/model".to_owned(), "a100".to_owned()),
        ]
        .into();
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "a".into(),
                victims: vec!["uid-low-new".into()]
            }
        );
    }

    #[test]
    fn agent_activity_orders_victims() {
        let mut w = busy();
        w.nodes.get_mut("a").unwrap().facts.allocatable = [("nvidia.com/gpu".to_owned(), 3)].into();
        let mut old_but_active = pod(
            "old-active",
            Some("a"),
            Priority::Low,
            "2026-01-01T00:00:00Z",
        );
        old_but_active.last_activity = t("2026-01-05T00:00:00Z");
        w.pods.insert(old_but_active.uid.clone(), old_but_active);
        w.pods.get_mut("uid-low-new").unwrap().last_activity = t("2026-01-03T01:00:00Z");
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "a".into(),
                victims: vec!["uid-low-new".into()]
            }
        );
    }
}
