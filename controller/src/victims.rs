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
//!   model) and the VRAM budget resource the model's pods ask for (a model with a
//!   resource of its own has its own, `<gpumem-resource>-<model>`; the others share
//!   the plain one: core's `admission::budget_resource`), minus what the pods bound
//!   there request.
//!   Pods already terminating, and pods the controller is acting on, count as gone:
//!   the room they free is on its way, so it is not freed a second time.
//! - **Tenants**: the pods core's preemption policy lets give way
//!   ([`PreemptionPolicy`]): lent pods (`gpu-booking.io/priority=low` with our class)
//!   where the controller acts, then, only where those cannot make room, other
//!   workloads in the namespaces an admin made preemptible; neither terminating nor
//!   being acted on. Booked pods are never tenants. Every pod counts for room,
//!   whatever its namespace.
//! - **Why a pod waits** when no tenant can make room: the units on its nodes, and
//!   who holds them ([`Shortfall`], for core's sentence).
//! - A round decides for each Pending booked pod in turn and books the room it gets,
//!   so two booked pods never count on the same freed unit.
//! - **Which marked pod a booked pod counts on** ([`Round::relied`]): the pods
//!   marked (or chosen) for it, while it waits, are its own room, which no other
//!   booked pod of the round takes; else room free now first, then the units of pods
//!   marked for booked pods that no longer wait (the earliest deadline first), then
//!   those of pods on their way out. The scheduler places booked pods in its queue's
//!   order (arrival, within a second), not the round's (creation, then name), so the
//!   card a marked pod frees can go to another booked pod than the one it was marked
//!   for; that one's marked pod then stays marked for the first, which still counts
//!   on it, and is named for it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use chrono::{DateTime, Utc};

use gpu_booking_core::admission::budget_of;
use gpu_booking_core::eviction::{self, Need, Plan, Room, Tenant};
use gpu_booking_core::preemption_policy::{Holder, PreemptionPolicy, Shortfall, Verdict};

use crate::inventory::{self, Models, NodeInfo};
use crate::pods::PodInfo;

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
    /// Pods chosen to give way whose mark the watch has not shown yet (uid -> the
    /// booked pod's key; in `going` too): their room comes at a deadline, as a marked
    /// pod's.
    pub chosen: &'a HashMap<String, String>,
    /// The Pending booked pods (keys): a marked pod named for one of them keeps its
    /// room for it.
    pub waiting: &'a HashSet<String>,
    /// VRAM to keep spare beside a booked pod's budget, MiB.
    pub cushion_mib: u64,
    /// Which pods may give way.
    pub policy: &'a PreemptionPolicy,
}

/// What a round decided for one booked pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Room is free (or a pod marked to give way frees it at its deadline): nothing
    /// to do but wait for the scheduler.
    Fits { node: String },
    /// Room comes once pods already on their way out (terminating, or being ended
    /// or re-created by the controller) are gone: nothing to do but wait for them.
    Ending { node: String },
    /// These pods (uids, least recently used first) give way on `node`.
    Evict { node: String, victims: Vec<String> },
    /// No pod that may give way could make room for it: why, on the nodes it may
    /// run on.
    NoRoom(Shortfall),
}

/// Room and tenants for one round of decisions.
pub struct Round {
    node_models: HashMap<String, Option<String>>,
    /// Free GPU units by (model, node).
    units: BTreeMap<(String, String), u64>,
    /// Free VRAM budget by [`VramKey`]; absent: not advertised.
    vram: BTreeMap<VramKey, u64>,
    /// The models with a budget resource of their own (their own GPU resource).
    own_budget: BTreeSet<String>,
    /// The VRAM budget one unit holds, by (model, node), where the node advertises it.
    unit_vram: BTreeMap<(String, String), u64>,
    /// (model, node) whose units are replicas of time-sliced cards: the only units
    /// that share a card's memory with other pods, so the only ones the VRAM cushion
    /// is for (a whole card or a MIG device is the booked pod's alone).
    shared: BTreeSet<(String, String)>,
    /// Tenants by model, lent pods first and other workloads an admin made
    /// preemptible second; ids are `namespace/name`.
    tenants: [BTreeMap<String, Vec<Tenant>>; 2],
    uids: HashMap<String, String>,
    /// Units held by (model, node): every pod, and how many by whom.
    held: BTreeMap<(String, String), Held>,
    /// GPU units by (model, node) before any pod.
    capacity: BTreeMap<(String, String), u64>,
    /// Units by (model, node) and VRAM budget by node that pods on their way out
    /// (terminating or being acted on, not merely marked) still hold: counted as
    /// free above, but the scheduler gives them out only once those pods are gone.
    ending_units: BTreeMap<(String, String), u64>,
    ending_vram: BTreeMap<VramKey, u64>,
    /// Pods marked to give way by (model, node), the earliest deadline first: (uid,
    /// units) not counted on yet by a booked pod of this round.
    marked: BTreeMap<(String, String), VecDeque<(String, u64)>>,
    /// Marked pods (uid) a booked pod of this round counts on: that pod's key.
    relied: HashMap<String, String>,
    /// The room of pods marked for booked pods that wait, by booked pod (key): not
    /// in `units` and `vram` until that pod decides.
    own: HashMap<String, Vec<OwnRoom>>,
}

/// A marked pod's room kept for the booked pod it is named for.
#[derive(Debug, Clone)]
struct OwnRoom {
    model: String,
    node: String,
    uid: String,
    units: u64,
    vram_mib: u64,
}

/// One VRAM budget of one node: (node, the model whose own budget it is; `None` for
/// the plain budget of the cards a label selects).
type VramKey = (String, Option<String>);

/// The budget the pods of `model` on `node` ask for.
fn vram_key(own_budget: &BTreeSet<String>, node: &str, model: &str) -> VramKey {
    let of = own_budget.contains(model).then(|| model.to_owned());
    (node.to_owned(), of)
}

/// Who holds a model's units on one node.
#[derive(Debug, Clone, Default)]
struct Held {
    booked: u64,
    /// Pods that may not give way, by namespace.
    kept: BTreeMap<String, u64>,
}

fn going(pod: &PodInfo, view: &View<'_>) -> bool {
    pod.deleting || view.going.contains(&pod.uid)
}

/// A pod marked to give way at a deadline and not terminating: it keeps its card
/// until then, and its booked pod is told when (a marked pod being ended right now
/// reads the same until the watch shows it terminating).
fn marked_only(pod: &PodInfo) -> bool {
    pod.preempt_at.is_some() && !pod.deleting
}

impl Round {
    pub fn new(view: &View<'_>) -> Self {
        let node_models = inventory::node_models(view.nodes.values(), view.models);
        let mut units = BTreeMap::new();
        let mut shared = BTreeSet::new();
        let mut vram = BTreeMap::new();
        let own_budget: BTreeSet<String> = view.models.resources.values().cloned().collect();
        for node in view.nodes.values() {
            for (resource, model) in &view.models.resources {
                if let Some(&n) = node.facts.allocatable.get(resource).filter(|&&n| n > 0) {
                    units.insert((model.clone(), node.name.clone()), n);
                    if time_sliced(node, resource) {
                        shared.insert((model.clone(), node.name.clone()));
                    }
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
                    if view.generic.iter().any(|r| time_sliced(node, r)) {
                        shared.insert((model.clone(), node.name.clone()));
                    }
                }
            }
            for (resource, &mib) in &node.facts.allocatable {
                if let Some(of) = budget_of(view.gpumem_resource, resource) {
                    let of = of.map(|m| m.as_str().to_owned());
                    vram.insert((node.name.clone(), of), mib);
                }
            }
        }
        // Before any pod is subtracted: what one unit of each model holds on each node.
        let unit_vram = units
            .iter()
            .filter_map(|((model, node), &n)| {
                let total = vram.get(&vram_key(&own_budget, node, model)).copied()?;
                (n > 0).then(|| ((model.clone(), node.clone()), total / n))
            })
            .collect();
        let capacity = units.clone();
        let mut tenants: [BTreeMap<String, Vec<Tenant>>; 2] = Default::default();
        let mut uids = HashMap::new();
        let mut held: BTreeMap<(String, String), Held> = BTreeMap::new();
        let mut ending_units: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut ending_vram: BTreeMap<VramKey, u64> = BTreeMap::new();
        let mut marked: BTreeMap<(String, String), Vec<(Option<DateTime<Utc>>, String, u64)>> =
            BTreeMap::new();
        let mut own: HashMap<String, Vec<OwnRoom>> = HashMap::new();
        for pod in view.pods.values() {
            let (Some(node), Some(gpu)) = (&pod.node, &pod.gpu) else {
                continue;
            };
            if !pod.holds_gpu() {
                continue;
            }
            let Some(model) = inventory::pod_model(pod, &node_models) else {
                continue;
            };
            let budget = vram_key(&own_budget, node, &model);
            // A pod marked (or chosen) to give way for a booked pod that still waits
            // holds its room for that pod: not free room for another.
            let at_deadline =
                going(pod, view) && (marked_only(pod) || view.chosen.contains_key(&pod.uid));
            let kept_for = at_deadline
                .then(|| view.chosen.get(&pod.uid).or(pod.preempt_for.as_ref()))
                .flatten()
                .filter(|b| view.waiting.contains(*b));
            if going(pod, view) && kept_for.is_none() {
                // Other marked pods are in `going` too, but hold their card until
                // their deadline by design: their booked pod is told when.
                if at_deadline {
                    marked.entry((model, node.clone())).or_default().push((
                        pod.preempt_at,
                        pod.uid.clone(),
                        gpu.units,
                    ));
                } else {
                    *ending_units.entry((model, node.clone())).or_default() += gpu.units;
                    *ending_vram.entry(budget).or_default() += pod.placement.gpumem_mib;
                }
                continue;
            }
            if let Some(free) = units.get_mut(&(model.clone(), node.clone())) {
                *free = free.saturating_sub(gpu.units);
            }
            if let Some(free) = vram.get_mut(&budget) {
                *free = free.saturating_sub(pod.placement.gpumem_mib);
            }
            if let Some(booked) = kept_for {
                own.entry(booked.clone()).or_default().push(OwnRoom {
                    model,
                    node: node.clone(),
                    uid: pod.uid.clone(),
                    units: gpu.units,
                    vram_mib: pod.placement.gpumem_mib,
                });
                continue;
            }
            let holders = held.entry((model.clone(), node.clone())).or_default();
            let tier = match view.policy.verdict(pod.priority, &pod.namespace) {
                Verdict::Lent => 0,
                Verdict::OptedIn => 1,
                Verdict::Kept => {
                    if Holder::of(pod.priority) == Holder::Booked {
                        holders.booked += gpu.units;
                    } else {
                        *holders.kept.entry(pod.namespace.clone()).or_default() += gpu.units;
                    }
                    continue;
                }
            };
            uids.insert(pod.key(), pod.uid.clone());
            tenants[tier].entry(model).or_default().push(Tenant {
                id: pod.key(),
                node: node.clone(),
                units: gpu.units,
                vram_mib: pod.placement.gpumem_mib,
                last_active: pod.last_used(),
            });
        }
        let marked = marked
            .into_iter()
            .map(|(key, mut pods)| {
                // The earliest deadline first; pods chosen but not marked yet last.
                pods.sort_by(|a, b| (a.0.is_none(), a).cmp(&(b.0.is_none(), b)));
                let queue = pods.into_iter().map(|(_, uid, units)| (uid, units));
                (key, queue.collect())
            })
            .collect();
        Self {
            node_models,
            units,
            vram,
            own_budget,
            unit_vram,
            shared,
            tenants,
            uids,
            held,
            capacity,
            ending_units,
            ending_vram,
            marked,
            relied: HashMap::new(),
            own,
        }
    }

    /// The room of the pods marked for the booked `pod` goes back to the round's
    /// room; where it holds the pod's need on a node it may run on, the pod fits
    /// there, counting on those pods. Else (its need grew, or those pods are on
    /// several nodes) it is free room for the pod like any other.
    fn own_room(
        &mut self,
        view: &View<'_>,
        pod: &PodInfo,
        model: &str,
        need: &Need,
    ) -> Option<String> {
        let own = self.own.remove(&pod.key())?;
        let mut on_node: BTreeMap<&str, u64> = BTreeMap::new();
        for room in &own {
            if let Some(free) = self.units.get_mut(&(room.model.clone(), room.node.clone())) {
                *free = free.saturating_add(room.units);
            }
            let budget = self.vram_key(&room.node, &room.model);
            if let Some(free) = self.vram.get_mut(&budget) {
                *free = free.saturating_add(room.vram_mib);
            }
            if room.model == model {
                *on_node.entry(room.node.as_str()).or_default() += room.units;
            }
        }
        let node = on_node
            .iter()
            .filter(|(node, &units)| units >= need.units && self.eligible(view, pod, node))
            .map(|(node, _)| node.to_string())
            .find(|node| {
                let key = (model.to_owned(), node.clone());
                let vram = self.vram.get(&self.vram_key(node, model)).copied();
                self.units.get(&key).copied().unwrap_or(0) >= need.units
                    && vram.is_none_or(|v| v >= need.vram_mib)
            });
        for room in own {
            let key = (room.model.clone(), room.node.clone());
            if node.as_deref() == Some(room.node.as_str()) && room.model == model {
                self.relied.insert(room.uid, pod.key());
            } else {
                // Back among the marked pods of its node, for whoever needs it.
                self.marked
                    .entry(key)
                    .or_default()
                    .push_back((room.uid, room.units));
            }
        }
        let node = node?;
        self.reserve(model, &node, need);
        Some(node)
    }

    /// The marked pods (uid) that the booked pods decided so far count on, and the
    /// key of the booked pod that counts on each.
    pub fn relied(&self) -> &HashMap<String, String> {
        &self.relied
    }

    /// Books `units` of a booked pod (`key`) on (model, node), from room free now
    /// first, then marked pods' (noted as relied on), then pods on their way out.
    /// Returns the units taken from pods on their way out.
    fn take_room(&mut self, key: &(String, String), booked: &str, units: u64) -> u64 {
        let free = self.units.get(key).copied().unwrap_or(0);
        let ending = self.ending_units.get(key).copied().unwrap_or(0);
        let queue = self.marked.entry(key.clone()).or_default();
        let marked: u64 = queue.iter().map(|(_, n)| n).sum();
        let free_now = free.saturating_sub(ending).saturating_sub(marked);
        let mut rest = units.saturating_sub(free_now);
        while rest > 0 {
            let Some((uid, n)) = queue.pop_front() else {
                break;
            };
            rest = rest.saturating_sub(n);
            self.relied.insert(uid, booked.to_owned());
        }
        rest.min(ending)
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
        if let Some(node) = self.own_room(view, pod, model, &need) {
            return Decision::Fits { node };
        }
        let rooms: Vec<Room> = self
            .units
            .range((model.to_owned(), String::new())..)
            .take_while(|((m, _), _)| m == model)
            .filter(|((_, node), _)| self.eligible(view, pod, node))
            .map(|((_, node), free)| Room {
                node: node.clone(),
                free_units: *free,
                free_vram_mib: self.vram.get(&self.vram_key(node, model)).copied(),
            })
            .collect();
        // The cushion is for co-tenants of a time-sliced card: on whole cards and MIG
        // devices there are none, and asking for it would cost a second victim for one
        // booked unit (or no room at all). Nor does it ask for more VRAM than the
        // pod's units hold: a pod whose budget fills its cards can use nothing beyond.
        let cushion = rooms
            .iter()
            .map(|room| {
                let key = (model.to_owned(), room.node.clone());
                if !self.shared.contains(&key) {
                    return 0;
                }
                self.unit_vram
                    .get(&key)
                    .map_or(view.cushion_mib, |&per_unit| {
                        per_unit
                            .saturating_mul(need.units)
                            .saturating_sub(need.vram_mib)
                    })
            })
            .fold(view.cushion_mib, u64::min);
        // Lent pods first; other workloads only where lent pods cannot make room.
        let lent = self.tenants[0].get(model).cloned().unwrap_or_default();
        let mut plan = eviction::plan(&need, cushion, &rooms, &lent);
        if plan == Plan::NoRoom && self.tenants[1].contains_key(model) {
            let mut both = lent;
            both.extend(self.tenants[1][model].iter().cloned());
            plan = eviction::plan(&need, cushion, &rooms, &both);
        }
        match plan {
            Plan::Fits { node } => {
                // Would it fit without the room of pods still on their way out?
                let key = (model.to_owned(), node.clone());
                let units = self.units.get(&key).copied().unwrap_or(0);
                let ending = self.ending_units.get(&key).copied().unwrap_or(0);
                let budget = self.vram_key(&node, model);
                let vram = self.vram.get(&budget).copied();
                let ending_vram = self.ending_vram.get(&budget).copied().unwrap_or(0);
                let now = units.saturating_sub(ending) >= need.units
                    && vram.is_none_or(|v| v.saturating_sub(ending_vram) >= need.vram_mib);
                let from_ending = self.take_room(&key, &pod.key(), need.units);
                self.reserve(model, &node, &need);
                if now {
                    Decision::Fits { node }
                } else {
                    // What this pod waits for is no longer there for the next one.
                    self.ending_units
                        .entry(key)
                        .and_modify(|n| *n = n.saturating_sub(from_ending));
                    self.ending_vram
                        .entry(budget)
                        .and_modify(|n| *n = n.saturating_sub(need.vram_mib));
                    Decision::Ending { node }
                }
            }
            Plan::Evict { node, victims } => {
                let mut gone = Vec::new();
                for tier in &mut self.tenants {
                    let list = tier.entry(model.to_owned()).or_default();
                    let (out, kept): (Vec<Tenant>, Vec<Tenant>) =
                        list.drain(..).partition(|t| victims.contains(&t.id));
                    *list = kept;
                    gone.extend(out);
                }
                let budget = self.vram_key(&node, model);
                for t in &gone {
                    if let Some(free) = self.units.get_mut(&(model.to_owned(), node.clone())) {
                        *free = free.saturating_add(t.units);
                    }
                    if let Some(free) = self.vram.get_mut(&budget) {
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
            Plan::NoRoom => Decision::NoRoom(self.shortfall(model, &rooms)),
        }
    }

    /// Who holds the units of `model` on the nodes of `rooms`.
    fn shortfall(&self, model: &str, rooms: &[Room]) -> Shortfall {
        let mut out = Shortfall::default();
        for room in rooms {
            let key = (model.to_owned(), room.node.clone());
            let held = self.held.get(&key).cloned().unwrap_or_default();
            let capacity = self.capacity.get(&key).copied().unwrap_or(0);
            out.units += capacity;
            // Taken: held by pods, on its way back, or given to an earlier booked
            // pod of this round.
            out.held += capacity.saturating_sub(room.free_units);
            out.booked += held.booked;
            for (ns, n) in held.kept {
                *out.kept.entry(ns).or_default() += n;
            }
        }
        out
    }

    fn reserve(&mut self, model: &str, node: &str, need: &Need) {
        if let Some(free) = self.units.get_mut(&(model.to_owned(), node.to_owned())) {
            *free = free.saturating_sub(need.units);
        }
        let budget = self.vram_key(node, model);
        if let Some(free) = self.vram.get_mut(&budget) {
            *free = free.saturating_sub(need.vram_mib);
        }
    }

    /// The VRAM budget the pods of `model` on `node` ask for.
    fn vram_key(&self, node: &str, model: &str) -> VramKey {
        vram_key(&self.own_budget, node, model)
    }
}

/// Whether `node`'s `resource` is a time-sliced card's replicas (GFD's
/// `<resource>.replicas` above 1).
fn time_sliced(node: &NodeInfo, resource: &str) -> bool {
    node.facts
        .labels
        .get(&format!("{resource}.replicas"))
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{GpuUse, Placement, Priority};
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
            preempt_at: None,
            preempt_for: None,
            preemption_rounds: 0,
            scheduler_preempted: false,
            unschedulable: node.is_none(),
            unschedulable_for_gpu: false,
            served: true,
            gpu_removed: None,
            restart_told: Vec::new(),
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
        chosen: HashMap<String, String>,
        waiting: HashSet<String>,
        policy: PreemptionPolicy,
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
                chosen: HashMap::new(),
                waiting: HashSet::new(),
                policy: PreemptionPolicy::new(Some("jhub"), Vec::new()),
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
                chosen: &self.chosen,
                waiting: &self.waiting,
                cushion_mib: 256,
                policy: &self.policy,
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
        // Being ended by the controller, or terminating: the booked pod waits for it.
        let mut w = busy();
        w.going.insert("uid-low-new".into());
        assert_eq!(w.decide("booked"), Decision::Ending { node: "a".into() });
        let mut w = busy();
        w.pods.get_mut("uid-low-new").unwrap().deleting = true;
        assert_eq!(w.decide("booked"), Decision::Ending { node: "a".into() });
        // Marked to give way at its deadline: its booked pod is told when instead.
        let mut w = busy();
        w.going.insert("uid-low-new".into());
        w.pods.get_mut("uid-low-new").unwrap().preempt_at = t("2026-01-05T00:00:00Z");
        assert_eq!(w.decide("booked"), Decision::Fits { node: "a".into() });
    }

    /// Two lent pods marked to give way on a node of three cards, one free: the
    /// first booked pod of the round takes the free card and counts on no marked
    /// pod; the next ones count on the marked pods, the earliest deadline first,
    /// whoever they were marked for; a fourth has no room.
    #[test]
    fn booked_pods_count_on_free_room_then_marked_pods_earliest_first() {
        let mut w = World::new(vec![node("a", "NVIDIA-A100", 3)], Vec::new());
        for (name, deadline, named) in [
            ("late", "2026-01-05T00:02:00Z", "jhub/booked-1"),
            ("soon", "2026-01-05T00:01:00Z", "jhub/booked-2"),
        ] {
            let mut lent = pod(name, Some("a"), Priority::Low, "2026-01-01T00:00:00Z");
            lent.preempt_at = t(deadline);
            lent.preempt_for = Some(named.into());
            w.going.insert(lent.uid.clone());
            w.pods.insert(lent.uid.clone(), lent);
        }
        let booked: Vec<PodInfo> = (0..4)
            .map(|i| {
                pod(
                    &format!("booked-{i}"),
                    None,
                    Priority::High,
                    "2026-01-04T00:00:00Z",
                )
            })
            .collect();
        let view = w.view();
        let mut round = Round::new(&view);
        let decisions: Vec<Decision> = booked
            .iter()
            .map(|b| round.decide(&view, b, "a100"))
            .collect();
        let fits = Decision::Fits { node: "a".into() };
        assert_eq!(decisions[..3], [fits.clone(), fits.clone(), fits]);
        assert!(
            matches!(decisions[3], Decision::NoRoom(_)),
            "{:?}",
            decisions[3]
        );
        let relied: BTreeMap<&str, &str> = round
            .relied()
            .iter()
            .map(|(uid, b)| (uid.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            relied,
            BTreeMap::from([("uid-soon", "jhub/booked-1"), ("uid-late", "jhub/booked-2")])
        );
    }

    /// A lent pod marked (or only chosen, its mark not seen yet) for a booked pod
    /// that still waits is that pod's room: a booked pod deciding before it does not
    /// take it, but gets a victim of its own; once its booked pod no longer waits,
    /// it is room for whoever does.
    #[test]
    fn a_pod_marked_for_a_waiting_booked_pod_is_kept_for_it() {
        for chosen in [false, true] {
            let mut w = busy();
            let mine = "jhub/booked".to_owned();
            if chosen {
                w.chosen.insert("uid-low-new".into(), mine.clone());
            } else {
                let lent = w.pods.get_mut("uid-low-new").unwrap();
                lent.preempt_at = t("2026-01-05T00:00:00Z");
                lent.preempt_for = Some(mine.clone());
            }
            w.going.insert("uid-low-new".into());
            let mut lent = pod("low-2", Some("a"), Priority::Low, "2026-01-02T00:00:00Z");
            lent.uid = "uid-low-2".into();
            w.pods.insert(lent.uid.clone(), lent);
            w.nodes.insert("a".into(), node("a", "NVIDIA-A100", 3));
            let early = pod("early", None, Priority::High, "2026-01-01T00:00:00Z");
            w.waiting.insert(mine.clone());
            w.waiting.insert(early.key());
            let view = w.view();
            let mut round = Round::new(&view);
            assert_eq!(
                round.decide(&view, &early, "a100"),
                Decision::Evict {
                    node: "a".into(),
                    victims: vec!["uid-low-2".into()]
                },
                "chosen: {chosen}"
            );
            let booked = &w.pods["uid-booked"];
            assert_eq!(
                round.decide(&view, booked, "a100"),
                Decision::Fits { node: "a".into() }
            );
            assert_eq!(round.relied().get("uid-low-new"), Some(&mine));
            // Its booked pod gone: free room for the next.
            w.waiting.remove(&mine);
            let view = w.view();
            let mut round = Round::new(&view);
            assert_eq!(
                round.decide(&view, &early, "a100"),
                Decision::Fits { node: "a".into() }
            );
            assert_eq!(round.relied().get("uid-low-new"), Some(&early.key()));
        }
    }

    /// The cards of a booked pod's model held by a research job and by a lent pod
    /// that is ending (its user stopped it, or it gives way): the booked pod waits
    /// for the lent pod to be gone, which is what it is told, not that workloads
    /// bookings do not preempt hold the cards; a second booked pod has no such room.
    #[test]
    fn a_lent_pod_ending_is_what_the_booked_pod_waits_for() {
        let mut w = busy();
        w.pods.remove("uid-high");
        w.pods.insert(
            "uid-train".into(),
            research_job("train", "a", "2025-01-01T00:00:00Z"),
        );
        w.pods.get_mut("uid-low-new").unwrap().deleting = true;
        let mut second = pod("booked-2", None, Priority::High, "2026-01-05T00:00:00Z");
        second.uid = "uid-booked-2".into();
        w.pods.insert(second.uid.clone(), second);
        let view = w.view();
        let mut round = Round::new(&view);
        assert_eq!(
            round.decide(&view, &w.pods["uid-booked"], "a100"),
            Decision::Ending { node: "a".into() }
        );
        assert_eq!(
            round.decide(&view, &w.pods["uid-booked-2"], "a100"),
            Decision::NoRoom(Shortfall {
                units: 2,
                held: 2,
                booked: 0,
                kept: [("research".to_owned(), 1)].into(),
            })
        );
        // Once it is gone, the card is free: nothing to wait for.
        w.pods.remove("uid-low-new");
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
        // Room for neither now: the first booked pod of the round holds one unit
        // (counted with bookings), the other two are on their way.
        assert_eq!(
            round.decide(&view, &w.pods["uid-booked"], "a100"),
            Decision::NoRoom(Shortfall {
                units: 3,
                held: 3,
                booked: 1,
                kept: BTreeMap::new(),
            })
        );
    }

    /// A pod of another namespace holding a card: counted, never a victim, named
    /// when it is what keeps the booked pod waiting.
    fn research_job(name: &str, node: &str, started: &str) -> PodInfo {
        let mut job = pod(name, Some(node), Priority::Low, started);
        job.priority = None;
        job.namespace = "research".into();
        job.served = false;
        job
    }

    #[test]
    fn no_cushion_on_whole_cards() {
        // a: 2 whole cards and 100,000 MiB of VRAM budget; the booked pod on one
        // holds 60,000, the lent pod on the other 40,000. The booked pod needs one
        // card and 40,000: the lent pod's card is exactly that, and nobody shares it.
        let mut w = busy();
        let budget = |w: &mut World, uid: &str, mib: u64| {
            w.pods.get_mut(uid).unwrap().placement.gpumem_mib = mib;
        };
        w.nodes.get_mut("a").unwrap().facts.allocatable = [
            ("nvidia.com/gpu".to_owned(), 2),
            ("gpu-booking.io/gpumem".to_owned(), 100_000),
        ]
        .into();
        budget(&mut w, "uid-high", 60_000);
        budget(&mut w, "uid-low-new", 40_000);
        budget(&mut w, "uid-booked", 40_000);
        let one = Decision::Evict {
            node: "a".into(),
            victims: vec!["uid-low-new".into()],
        };
        assert_eq!(w.decide("booked"), one);
        // Time-sliced (two replicas of one card): co-tenants share its memory, and
        // the cushion keeps room for them; 40,000 is then not enough.
        w.nodes
            .get_mut("a")
            .unwrap()
            .facts
            .labels
            .insert("nvidia.com/gpu.replicas".into(), "2".into());
        assert_ne!(w.decide("booked"), one);
    }

    #[test]
    fn other_workloads_count_and_stay() {
        // a: 2 cards, a booked pod and a research job on them.
        let mut w = busy();
        w.pods.remove("uid-low-new");
        w.pods.insert(
            "uid-train".into(),
            research_job("train", "a", "2025-01-01T00:00:00Z"),
        );
        assert_eq!(
            w.decide("booked"),
            Decision::NoRoom(Shortfall {
                units: 2,
                held: 2,
                booked: 1,
                kept: [("research".to_owned(), 1)].into(),
            })
        );
        // A lent pod of our webhook in a namespace the controller does not act in
        // is kept too.
        let mut w = busy();
        w.pods.get_mut("uid-low-new").unwrap().namespace = "elsewhere".into();
        assert!(matches!(w.decide("booked"), Decision::NoRoom(s) if s.kept["elsewhere"] == 1));
    }

    #[test]
    fn lent_pods_give_way_before_opted_in_workloads() {
        // a: 3 cards: a research job (least recently active), a lent pod, free none
        // once the booked pod and ... hold the third.
        let mut w = busy();
        w.nodes.get_mut("a").unwrap().facts.allocatable = [("nvidia.com/gpu".to_owned(), 3)].into();
        w.pods.insert(
            "uid-train".into(),
            research_job("train", "a", "2024-01-01T00:00:00Z"),
        );
        w.policy = PreemptionPolicy::new(Some("jhub"), ["research".to_owned()]);
        // The lent pod goes although the research job was idle longer.
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "a".into(),
                victims: vec!["uid-low-new".into()]
            }
        );
        // Without the lent pod, the opted-in job gives way.
        w.pods.remove("uid-low-new");
        w.pods
            .get_mut("uid-high")
            .unwrap()
            .gpu
            .as_mut()
            .unwrap()
            .units = 2;
        assert_eq!(
            w.decide("booked"),
            Decision::Evict {
                node: "a".into(),
                victims: vec!["uid-train".into()]
            }
        );
        // Not opted in: it stays, and says so.
        w.policy = PreemptionPolicy::new(Some("jhub"), Vec::new());
        assert!(
            matches!(w.decide("booked"), Decision::NoRoom(s) if s.kept["research"] == 1 && s.booked == 2)
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

    /// A node with two A100s (generic) and a T4 time-sliced four ways under its own
    /// resource: the T4's pods ask for the T4's budget resource, so their room is the
    /// T4's budget, not the node's, however idle the A100s are.
    #[test]
    fn the_room_of_a_model_with_its_own_resource_is_its_own_budget() {
        let mut w = busy();
        let t4: Model = serde_json::from_value(serde_json::json!(
            {"name": "t4", "patterns": ["*T4*"], "resource": "nvidia.com/t4"}))
        .unwrap();
        let a100: Model =
            serde_json::from_value(serde_json::json!({"name": "a100", "patterns": ["*A100*"]}))
                .unwrap();
        w.models = Models::from_api(
            &[a100, t4],
            &w.generic,
            &crate::inventory::InventoryOptions {
                product_label: "nvidia.com/gpu.product".into(),
                fallback_model: None,
                mig_fallback: true,
                reserve_mib: 0,
            },
        );
        let mut mixed = node("m", "NVIDIA-A100", 2);
        mixed.facts.labels.extend([
            ("nvidia.com/t4.count".to_owned(), "1".to_owned()),
            ("nvidia.com/t4.replicas".to_owned(), "4".to_owned()),
        ]);
        mixed.facts.allocatable.extend([
            ("nvidia.com/t4".to_owned(), 4),
            ("gpu-booking.io/gpumem".to_owned(), 80_896),
            ("gpu-booking.io/gpumem-t4".to_owned(), 14_848),
        ]);
        let on_t4 = |mut p: PodInfo, mib: u64| {
            p.gpu = Some(GpuUse {
                units: 1,
                model: Some("t4".into()),
            });
            p.placement.gpumem_mib = mib;
            p
        };
        let pods = vec![
            on_t4(
                pod("lent-1", Some("m"), Priority::Low, "2026-01-01T00:00:00Z"),
                6000,
            ),
            on_t4(
                pod("lent-2", Some("m"), Priority::Low, "2026-01-02T00:00:00Z"),
                6000,
            ),
            on_t4(
                pod("booked", None, Priority::High, "2026-01-04T00:00:00Z"),
                6000,
            ),
        ];
        w.nodes = [("m".to_owned(), mixed)].into();
        w.pods = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        let view = w.view();
        // Two replicas are free, but 2,848 MiB of the T4's 14,848: one lent pod goes.
        assert_eq!(
            Round::new(&view).decide(&view, &w.pods["uid-booked"], "t4"),
            Decision::Evict {
                node: "m".into(),
                victims: vec!["uid-lent-1".into()]
            }
        );
    }
}
