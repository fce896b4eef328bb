//! The GPU inventory of a node, from the labels GPU feature discovery (GFD) writes and
//! the resources the device plugin advertises: how many bookable units of which model
//! it has, and how much VRAM budget (`gpumem`, MiB) it should advertise: one budget for
//! the cards a label selects, and one per model whose cards are under a resource of
//! their own ([`Budgets`]).
//!
//! Units are cards (docs/design.md, "GPU models and units"): a time-sliced card is one unit however
//! many replicas the device plugin advertises; a MIG device is one unit of its profile.
//! What GFD writes, per sharing mode:
//!
//! - whole cards: `nvidia.com/gpu.product`, `.count` (cards), `.memory` (MiB per card);
//! - time-slicing: the same, plus `nvidia.com/gpu.replicas: N`; the product gets a
//!   `-SHARED` suffix (unless the plugin renames the resource instead) and the node's
//!   allocatable `nvidia.com/gpu` is cards x replicas;
//! - MIG, `nvidia.com/mig.strategy: single`: `nvidia.com/gpu` are the MIG devices;
//!   the product reads `A100-SXM4-40GB-MIG-1g.5gb`, `.count` counts the devices and
//!   `.memory` is one device's memory;
//! - MIG, `mixed`: each profile is its own resource `nvidia.com/mig-<profile>` with
//!   labels `nvidia.com/mig-<profile>.count` and `.memory`; `nvidia.com/gpu` counts the
//!   cards without MIG.
//!
//! Every card gets a model (seed 001): the catalog's patterns first, then the
//! implicit fallbacks of NVIDIA's resource-naming proposal, `gpu` for whole cards and
//! single-strategy MIG devices and `mig-<profile>` for mixed-strategy devices (both
//! configurable), so that no card is unreachable because no pattern names it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::gpu_model::{ModelCatalog, ModelName};

/// GFD's label with each GPU node's product name (`--product-label`'s default).
pub const DEFAULT_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GFD's label with the MIG strategy (`none`, `single`, `mixed`).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
/// The default model of cards (and single-strategy MIG devices) that no pattern names.
pub const DEFAULT_FALLBACK_MODEL: &str = "gpu";
/// The product suffix GFD adds to time-sliced cards.
pub const SHARED_SUFFIX: &str = "-SHARED";
/// Per-profile MIG resources of the mixed strategy: `nvidia.com/mig-<profile>`.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// Label prefix of the node facts the inventory reads (all of GFD's labels).
pub const NVIDIA_LABEL_PREFIX: &str = "nvidia.com/";
/// Our node label of NVML's memory per card (defined with every key of ours).
pub use crate::admission::NVML_MEMORY_LABEL;

/// How a node's cards are named and counted; one value for the whole controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryConfig {
    pub catalog: ModelCatalog,
    /// Resources that name one model (`nvidia.com/a100`, `nvidia.com/mig-1g.5gb`).
    pub model_resources: BTreeMap<String, ModelName>,
    /// Generic GPU resources (`nvidia.com/gpu`).
    pub gpu_resources: Vec<String>,
    /// The node label with the product name.
    pub product_label: String,
    /// Model of whole cards (and single-strategy MIG devices) no pattern names;
    /// `None`: such cards belong to no model.
    pub fallback_model: Option<ModelName>,
    /// Whether mixed-strategy MIG devices no pattern names become `mig-<profile>`.
    pub mig_fallback: bool,
    /// VRAM kept out of the budget per unit (driver, CUDA context, exporter), MiB.
    pub reserve_mib: u64,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        Self {
            catalog: ModelCatalog::default(),
            model_resources: BTreeMap::new(),
            gpu_resources: vec![crate::admission::DEFAULT_GPU_RESOURCE.to_owned()],
            product_label: DEFAULT_PRODUCT_LABEL.to_owned(),
            fallback_model: ModelName::parse(DEFAULT_FALLBACK_MODEL).ok(),
            mig_fallback: true,
            reserve_mib: 512,
        }
    }
}

/// What the inventory reads of a node: its labels (GFD's) and its allocatable
/// resources in whole units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, u64>,
}

/// Units of one model on one node, behind one extended resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardGroup {
    pub model: ModelName,
    /// What pods request for these units.
    pub resource: String,
    /// Bookable units: physical cards, or MIG devices.
    pub units: u64,
    /// Resource units per bookable unit (time-slicing replicas; 1 otherwise).
    pub replicas: u64,
    /// VRAM of one unit, MiB, when GFD says.
    pub memory_mib: Option<u64>,
    /// Whether the units are MIG devices.
    pub mig: bool,
}

impl CardGroup {
    /// Whether pods reach these units through a generic resource (and so need the
    /// model's node label to land on the right node).
    fn generic(&self, cfg: &InventoryConfig) -> bool {
        cfg.gpu_resources.contains(&self.resource)
    }

    /// Whose VRAM budget these units are in ([`Budgets`]): the model's own, when
    /// their resource is the model's (pods of the model ask for it, and for its
    /// budget resource); else the node's plain budget, with every card a label
    /// selects.
    pub fn budget_of(&self, cfg: &InventoryConfig) -> Option<ModelName> {
        cfg.model_resources.get(&self.resource).cloned()
    }
}

/// VRAM budgets (MiB) by whose they are: `None`, the cards that a node label selects
/// (the generic ones, and those under a resource no declared model names), advertised
/// as the plain `--gpumem-resource`; a model, the cards under that model's own
/// resource, advertised as `<gpumem-resource>-<model>`
/// ([`crate::admission::budget_resource`]). kube-scheduler fits each on its own, so
/// the pods of one model cannot take what another model's cards hold.
pub type Budgets = BTreeMap<Option<ModelName>, u64>;

/// Which single model a node is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeModel {
    /// No GPU of any model.
    None,
    One(ModelName),
    /// Cards of several models: one model label cannot select them all, so the node
    /// gets none (it is refused, with an Event, rather than mislabelled).
    Several(Vec<ModelName>),
}

impl NodeModel {
    pub fn label(&self) -> Option<&ModelName> {
        match self {
            NodeModel::One(model) => Some(model),
            NodeModel::None | NodeModel::Several(_) => None,
        }
    }
}

/// Node labels, one per model a node has cards of (`model.gpu-booking.io/a100:
/// "true"`): a node with several models carries them all (what a KubeSpawner
/// profile or an admin can select), besides the single model label where there is
/// one model.
pub const MODEL_PRESENT_LABEL_PREFIX: &str = "model.gpu-booking.io/";

/// A node's GPUs, as the inventory sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInventory {
    pub groups: Vec<CardGroup>,
    pub model: NodeModel,
    /// The VRAM budgets to advertise (MiB), each the memory of its units minus the
    /// reserve per unit ([`Budgets`]). A budget is left out when a unit's memory is
    /// unknown (a budget that does not exist is better than a wrong one) or it comes
    /// to nothing; empty on a node without GPUs.
    pub budgets: Budgets,
}

impl NodeInventory {
    /// The model of a pod's generic GPU on this node (a pod that names its model by
    /// resource knows it already).
    /// The node's single model label: its one model, else the one model of the cards
    /// that only a label can select, when every other model's cards are reached
    /// through the model's own resource (pods of those ask for the resource and need
    /// no label). `Err` with the models when the cards only a label can select are of
    /// several: one label cannot select them all. Cards only a label selects are the
    /// generic ones and those under a resource (a MIG profile's) that names no
    /// declared model.
    pub fn model_label<'a>(
        &'a self,
        cfg: &InventoryConfig,
    ) -> Result<Option<&'a ModelName>, Vec<&'a ModelName>> {
        if let NodeModel::One(model) = &self.model {
            return Ok(Some(model));
        }
        let mut generic: Vec<&ModelName> = self
            .groups
            .iter()
            .filter(|g| !cfg.model_resources.contains_key(&g.resource))
            .map(|g| &g.model)
            .collect();
        generic.sort();
        generic.dedup();
        match generic.len() {
            0 => Ok(None),
            1 => Ok(Some(generic[0])),
            _ => Err(generic),
        }
    }

    /// Every model the node has cards of, in order.
    pub fn models(&self) -> Vec<&ModelName> {
        let mut models: Vec<&ModelName> = self.groups.iter().map(|g| &g.model).collect();
        models.sort();
        models.dedup();
        models
    }

    pub fn generic_model(&self, cfg: &InventoryConfig) -> Option<&ModelName> {
        let mut models = self
            .groups
            .iter()
            .filter(|g| g.generic(cfg))
            .map(|g| &g.model);
        let first = models.next()?;
        models.all(|m| m == first).then_some(first)
    }

    /// Bookable units of `model` here.
    pub fn units_of(&self, model: &ModelName) -> u64 {
        self.groups
            .iter()
            .filter(|g| &g.model == model)
            .map(|g| g.units)
            .sum()
    }
}

fn label_u64(facts: &NodeFacts, key: &str) -> Option<u64> {
    facts.labels.get(key).and_then(|v| v.trim().parse().ok())
}

/// The model of a MIG profile (`1g.5gb`) on a card named `product`: patterns over the
/// profile first (as NVIDIA's `resources.mig` entries match), then over GFD's
/// single-strategy product form `<product>-MIG-<profile>` (catalogs written with
/// `*-MIG-1g.*`), with only the patterns that mention MIG: a card pattern such as
/// `*A100*` never claims the card's MIG devices.
fn mig_model<'a>(cfg: &'a InventoryConfig, product: &str, profile: &str) -> Option<&'a ModelName> {
    cfg.catalog.model_name_for(profile).or_else(|| {
        cfg.catalog
            .mig_model_name_for(&format!("{product}-MIG-{profile}"))
    })
}

/// The product with GFD's time-slicing suffix removed: a shared card is the same
/// model as the card unshared.
fn base_product(product: &str) -> &str {
    let n = product.len();
    if n > SHARED_SUFFIX.len()
        && product.is_char_boundary(n - SHARED_SUFFIX.len())
        && product[n - SHARED_SUFFIX.len()..].eq_ignore_ascii_case(SHARED_SUFFIX)
    {
        &product[..n - SHARED_SUFFIX.len()]
    } else {
        product
    }
}

/// The node's GPUs: units per model and the VRAM budget to advertise.
pub fn node_inventory(facts: &NodeFacts, cfg: &InventoryConfig) -> NodeInventory {
    let product = facts.labels.get(&cfg.product_label).map(String::as_str);
    let strategy = facts
        .labels
        .get(MIG_STRATEGY_LABEL)
        .map(|s| s.to_ascii_lowercase());
    let mixed = strategy.as_deref() == Some("mixed");
    let single = strategy.as_deref() == Some("single");
    // Every GPU resource the node has or GFD counts: generic, per-model, MIG profiles.
    let mut resources: BTreeSet<&str> = BTreeSet::new();
    for r in cfg.gpu_resources.iter().chain(cfg.model_resources.keys()) {
        let counted = label_u64(facts, &format!("{r}.count")).is_some_and(|n| n > 0);
        if counted || facts.allocatable.get(r).is_some_and(|&n| n > 0) {
            resources.insert(r);
        }
    }
    for key in facts.labels.keys() {
        if let Some(profile) = key
            .strip_prefix(MIG_RESOURCE_PREFIX)
            .and_then(|k| k.strip_suffix(".count"))
        {
            if mixed && !profile.is_empty() {
                resources.insert(&key[..MIG_RESOURCE_PREFIX.len() + profile.len()]);
            }
        }
    }
    for r in facts.allocatable.keys() {
        if r.starts_with(MIG_RESOURCE_PREFIX) {
            resources.insert(r);
        }
    }
    let mut groups = Vec::new();
    for resource in resources {
        let generic = cfg.gpu_resources.iter().any(|g| g == resource);
        let replicas = label_u64(facts, &format!("{resource}.replicas"))
            .filter(|&n| n > 0)
            .unwrap_or(1);
        let allocated = facts.allocatable.get(resource).copied().unwrap_or(0) / replicas;
        let counted = label_u64(facts, &format!("{resource}.count"));
        // Under the mixed strategy GFD's `nvidia.com/gpu.count` counts every card,
        // MIG-enabled ones too; only the allocatable whole cards are units of it.
        let units = if generic && mixed {
            allocated
        } else {
            counted.unwrap_or(allocated)
        };
        if units == 0 {
            continue;
        }
        let profile = resource.strip_prefix(MIG_RESOURCE_PREFIX);
        let mig = profile.is_some() || (generic && single);
        let model = if let Some(model) = cfg.model_resources.get(resource) {
            Some(model.clone())
        } else if let Some(profile) = profile {
            mig_model(cfg, product.unwrap_or(""), profile)
                .cloned()
                .or_else(|| {
                    cfg.mig_fallback
                        .then(|| {
                            ModelName::parse(&format!("mig-{}", profile.to_ascii_lowercase())).ok()
                        })
                        .flatten()
                })
        } else {
            let named = product.and_then(|p| {
                let base = base_product(p);
                // Single strategy: the product is `<card>-MIG-<profile>`, and its units
                // are MIG devices, named as MIG devices are (never by a card pattern
                // such as `*A100*` that happens to match the card's part).
                match base.rsplit_once("-MIG-").filter(|_| single) {
                    Some((card, profile)) => mig_model(cfg, card, profile),
                    None => cfg.catalog.model_name_for(base),
                }
            });
            named.cloned().or_else(|| cfg.fallback_model.clone())
        };
        let Some(model) = model else {
            continue;
        };
        groups.push(CardGroup {
            model,
            resource: resource.to_owned(),
            units,
            replicas,
            memory_mib: (!mig)
                .then(|| label_u64(facts, NVML_MEMORY_LABEL))
                .flatten()
                .or_else(|| label_u64(facts, &format!("{resource}.memory")))
                .filter(|&m| m > 0),
            mig,
        });
    }
    let mut models: Vec<ModelName> = groups.iter().map(|g| g.model.clone()).collect();
    models.sort();
    models.dedup();
    // NVML's and GFD's node-wide memory describe one kind of card: a model reached
    // through a resource of its own takes it only on a node of one model, else only
    // its resource's own memory label (unknown without: no budget is better than a
    // wrong one).
    if models.len() > 1 {
        for g in groups.iter_mut().filter(|g| !g.mig && !g.generic(cfg)) {
            g.memory_mib = label_u64(facts, &format!("{}.memory", g.resource)).filter(|&m| m > 0);
        }
    }
    let model = match models.len() {
        0 => NodeModel::None,
        1 => NodeModel::One(models.remove(0)),
        _ => NodeModel::Several(models),
    };
    let budgets = node_budgets(&groups, cfg);
    NodeInventory {
        groups,
        model,
        budgets,
    }
}

/// Each budget of `groups`: units x (memory per unit - reserve), summed over the
/// groups in it; none where a unit's memory is unknown.
fn node_budgets(groups: &[CardGroup], cfg: &InventoryConfig) -> Budgets {
    let mut sums: BTreeMap<Option<ModelName>, Option<u64>> = BTreeMap::new();
    for g in groups {
        let per_unit = g.memory_mib.map(|m| m.saturating_sub(cfg.reserve_mib));
        let sum = sums.entry(g.budget_of(cfg)).or_insert(Some(0));
        *sum = sum
            .zip(per_unit)
            .map(|(sum, unit)| sum.saturating_add(g.units.saturating_mul(unit)));
    }
    sums.into_iter()
        .filter_map(|(of, mib)| Some((of, mib.filter(|&m| m > 0)?)))
        .collect()
}

/// A pod's hold on GPUs, as the inventory counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGpus<'a> {
    /// Its node; `None` for a pod admitted with a GPU that waits for the scheduler
    /// (see [`model_inventory`]).
    pub node: Option<&'a str>,
    /// The model its resource names, if it requests a per-model resource; for a pod
    /// without a node, the model it was admitted on (a generic request has no node
    /// to tell it).
    pub model: Option<&'a ModelName>,
    /// Resource units requested (replicas on a time-sliced card).
    pub units: u64,
    /// Bookings cannot get its cards while it runs: not booked, and never giving
    /// way ([`crate::preemption_policy::PreemptionPolicy::held_from_bookings`]).
    pub other: bool,
}

/// One model across the cluster: what the controller reports beside the admin's
/// declared units (never in their place).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInventory {
    /// Physical cards (MIG devices for a MIG profile) the nodes have.
    pub cards: u64,
    /// Cards with at least one pod on them. On a time-sliced card the replicas in use
    /// are rounded up to cards: a card that some pod uses is not free to book. Pods
    /// admitted on the model that wait for the scheduler count too, a card each (at
    /// most the cards): the one they get is not free either.
    pub in_use: u64,
    /// Cards with a pod on them that never gives way to bookings (other workloads,
    /// lent pods where the controller may not act), counted the same way: what
    /// bookings cannot get while those run.
    pub others_in_use: u64,
    /// Whether every node with cards of the model advertises the VRAM budget its
    /// cards are in (a pod budgeted for the model can then always find its resource).
    pub gpumem_advertised: bool,
    /// The VRAM budget one unit can hold (MiB): the least over the model's nodes.
    pub gpumem_unit_mib: Option<u64>,
}

impl ModelInventory {
    /// Cards not in use.
    pub fn free(&self) -> u64 {
        self.cards.saturating_sub(self.in_use)
    }
}

/// Whether the cards counted disagree with the units an admin declared (shown in
/// `GET /models` and alerted). Nothing counted yet is no disagreement.
pub fn units_mismatch(declared_units: i64, cards: Option<i64>) -> bool {
    cards.is_some_and(|cards| cards != declared_units)
}

/// Every model's inventory from the nodes (with the budgets each advertises now, read
/// from its status) and the pods holding GPUs. Every model of `models` appears.
///
/// A pod admitted with a GPU is counted from the moment it exists, not from its
/// binding: the webhook's lend ledger keeps an admission only until a report taken
/// `--lend-settle` after it, and the scheduler may bind later than that (a queue of
/// pods, a busy API server). A pod without a node counts one card per unit of the
/// model it was admitted on (it may take a free card; on a time-sliced card it may
/// share one, so this errs on the side of lending less until it is bound); one
/// without a model (another workload, a generic request nobody decided) counts
/// once bound.
pub fn model_inventory<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a NodeInventory, &'a Budgets)>,
    pods: impl IntoIterator<Item = PodGpus<'a>>,
    models: &[ModelName],
    cfg: &InventoryConfig,
) -> BTreeMap<ModelName, ModelInventory> {
    let mut out: BTreeMap<ModelName, ModelInventory> = models
        .iter()
        .map(|m| {
            let empty = ModelInventory {
                gpumem_advertised: false,
                ..ModelInventory::default()
            };
            (m.clone(), empty)
        })
        .collect();
    let mut advertised: BTreeMap<ModelName, bool> = BTreeMap::new();
    let mut by_name: BTreeMap<&str, &NodeInventory> = BTreeMap::new();
    for (name, inv, now) in nodes {
        by_name.insert(name, inv);
        for g in &inv.groups {
            let entry = out.entry(g.model.clone()).or_default();
            entry.cards += g.units;
            let unit = g.memory_mib.map(|m| m.saturating_sub(cfg.reserve_mib));
            let has =
                now.get(&g.budget_of(cfg)).is_some_and(|&n| n > 0) && unit.is_some_and(|u| u > 0);
            let all = advertised.entry(g.model.clone()).or_insert(true);
            *all &= has;
            if let Some(unit) = unit.filter(|_| has) {
                entry.gpumem_unit_mib = Some(entry.gpumem_unit_mib.map_or(unit, |u| u.min(unit)));
            }
        }
    }
    for (model, all) in advertised {
        if let Some(entry) = out.get_mut(&model) {
            entry.gpumem_advertised = all;
            if !all {
                entry.gpumem_unit_mib = None;
            }
        }
    }
    // Resource units in use per (node, model), then rounded up to cards; those of
    // other workloads apart too.
    let mut used: BTreeMap<(&str, ModelName), u64> = BTreeMap::new();
    let mut used_by_others: BTreeMap<(&str, ModelName), u64> = BTreeMap::new();
    // Units of pods waiting for the scheduler, by model: all, and other workloads'.
    let mut waiting: BTreeMap<ModelName, (u64, u64)> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.node else {
            if let Some(model) = pod.model {
                let entry = waiting.entry(model.clone()).or_default();
                entry.0 = entry.0.saturating_add(pod.units);
                if pod.other {
                    entry.1 = entry.1.saturating_add(pod.units);
                }
            }
            continue;
        };
        let Some(inv) = by_name.get(node) else {
            continue;
        };
        let model = match pod.model {
            Some(m) => Some(m.clone()),
            None => inv.generic_model(cfg).cloned(),
        };
        if let Some(model) = model {
            if pod.other {
                *used_by_others.entry((node, model.clone())).or_default() += pod.units;
            }
            *used.entry((node, model)).or_default() += pod.units;
        }
    }
    let cards_of = |node: &str, model: &ModelName, units: u64| {
        let inv = by_name.get(node)?;
        let replicas = inv
            .groups
            .iter()
            .find(|g| g.model == *model)
            .map_or(1, |g| g.replicas);
        Some(units.div_ceil(replicas).min(inv.units_of(model)))
    };
    for ((node, model), units) in used {
        if let (Some(cards), Some(entry)) = (cards_of(node, &model, units), out.get_mut(&model)) {
            entry.in_use += cards;
        }
    }
    for ((node, model), units) in used_by_others {
        if let (Some(cards), Some(entry)) = (cards_of(node, &model, units), out.get_mut(&model)) {
            entry.others_in_use += cards;
        }
    }
    for (model, (units, others)) in waiting {
        if let Some(entry) = out.get_mut(&model) {
            entry.in_use = entry.in_use.saturating_add(units).min(entry.cards);
            entry.others_in_use = entry.others_in_use.saturating_add(others).min(entry.in_use);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_model::ModelPattern;
    use proptest::prelude::*;

    fn name(s: &str) -> ModelName {
        ModelName::parse(s).expect("valid model name")
    }

    fn cfg(entries: &[(&str, &[&str])]) -> InventoryConfig {
        InventoryConfig {
            catalog: ModelCatalog::new(entries.iter().map(|(n, ps)| {
                (
                    name(n),
                    ps.iter()
                        .map(|p| ModelPattern::parse(p).expect("valid pattern"))
                        .collect(),
                )
            })),
            ..InventoryConfig::default()
        }
    }

    fn facts(labels: &[(&str, &str)], alloc: &[(&str, u64)]) -> NodeFacts {
        NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            allocatable: alloc.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    /// The node's plain budget (the cards a label selects).
    fn plain(inv: &NodeInventory) -> Option<u64> {
        inv.budgets.get(&None).copied()
    }

    /// A node that advertises the plain budget only, `mib` of it.
    fn plain_now(mib: u64) -> Budgets {
        [(None, mib)].into_iter().collect()
    }

    /// On a node with an A100 pair under the generic resource and a T4 under its own,
    /// the T4's budget is its own: a model counts as advertised where its own budget
    /// resource is, not the node's plain one.
    #[test]
    fn a_model_with_its_own_resource_is_advertised_by_its_own_budget() {
        let mut c = cfg(&[("a100", &["*A100*"]), ("t4", &["*T4*"])]);
        c.model_resources.insert("nvidia.com/t4".into(), name("t4"));
        let node = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                    ("nvidia.com/gpu.count", "2"),
                    ("nvidia.com/gpu.memory", "40960"),
                    ("nvidia.com/t4.count", "1"),
                    ("nvidia.com/t4.replicas", "4"),
                    ("nvidia.com/t4.memory", "15360"),
                ],
                &[("nvidia.com/gpu", 2), ("nvidia.com/t4", 4)],
            ),
            &c,
        );
        assert_eq!(units(&node), [("a100", 2), ("t4", 1)]);
        assert_eq!(
            node.budgets,
            [(None, 2 * (40960 - 512)), (Some(name("t4")), 15360 - 512)]
                .into_iter()
                .collect(),
            "the T4's budget is its one card's, not the node's sum"
        );
        let models = [name("a100"), name("t4")];
        let count = |now: &Budgets| model_inventory([("n", &node, now)], [], &models, &c);
        // Only the plain one advertised (the controller has not caught up yet).
        let inv = count(&plain_now(95744));
        assert!(inv[&name("a100")].gpumem_advertised);
        assert!(!inv[&name("t4")].gpumem_advertised);
        assert_eq!(inv[&name("t4")].gpumem_unit_mib, None);
        let inv = count(&node.budgets);
        assert!(inv[&name("t4")].gpumem_advertised);
        assert_eq!(inv[&name("t4")].gpumem_unit_mib, Some(15360 - 512));
        assert_eq!(inv[&name("a100")].gpumem_unit_mib, Some(40960 - 512));
    }

    fn units(inv: &NodeInventory) -> Vec<(&str, u64)> {
        inv.groups
            .iter()
            .map(|g| (g.model.as_str(), g.units))
            .collect()
    }

    /// Seed 001's node: several models, each under its own resource. It needs no
    /// single model label (pods ask for the resource), and carries one presence label
    /// per model; only generic cards of several models are left unlabelled.
    #[test]
    fn several_models_each_with_its_own_resource() {
        let mut c = cfg(&[("a100", &["*A100*"]), ("t4", &["*T4*"])]);
        c.model_resources
            .insert("nvidia.com/a100".into(), name("a100"));
        c.model_resources.insert("nvidia.com/t4".into(), name("t4"));
        let both = node_inventory(
            &facts(
                &[
                    ("nvidia.com/a100.memory", "40960"),
                    ("nvidia.com/t4.memory", "15360"),
                ],
                &[("nvidia.com/a100", 2), ("nvidia.com/t4", 1)],
            ),
            &c,
        );
        assert_eq!(units(&both), [("a100", 2), ("t4", 1)]);
        assert_eq!(both.model_label(&c), Ok(None));
        assert_eq!(both.models(), [&name("a100"), &name("t4")]);
        assert_eq!(
            both.budgets,
            [
                (Some(name("a100")), 2 * (40960 - 512)),
                (Some(name("t4")), 15360 - 512)
            ]
            .into_iter()
            .collect(),
            "each model's budget apart, its memory from its own resource's label"
        );
        // Generic cards of one model beside a model with its own resource: the
        // label selects the generic one.
        let mixed = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                    ("nvidia.com/gpu.count", "2"),
                ],
                &[("nvidia.com/gpu", 2), ("nvidia.com/t4", 1)],
            ),
            &c,
        );
        assert_eq!(mixed.model_label(&c), Ok(Some(&name("a100"))));
        // Two MIG profiles of the mixed strategy, each its own model and resource.
        let mut m = cfg(&[]);
        m.model_resources
            .insert("nvidia.com/mig-1g.10gb".into(), name("mig-small"));
        m.model_resources
            .insert("nvidia.com/mig-3g.40gb".into(), name("mig-big"));
        let mig = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                    ("nvidia.com/mig.strategy", "mixed"),
                    ("nvidia.com/mig-1g.10gb.count", "4"),
                    ("nvidia.com/mig-3g.40gb.count", "1"),
                ],
                &[("nvidia.com/mig-1g.10gb", 4), ("nvidia.com/mig-3g.40gb", 1)],
            ),
            &m,
        );
        assert_eq!(units(&mig), [("mig-small", 4), ("mig-big", 1)]);
        assert_eq!(mig.model_label(&m), Ok(None));
        // The same profiles, named by no declared model's resource (the fallback
        // models): only a label could select them, and one cannot say both.
        let undeclared = cfg(&[]);
        let mig = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                    ("nvidia.com/mig.strategy", "mixed"),
                    ("nvidia.com/mig-1g.10gb.count", "4"),
                    ("nvidia.com/mig-3g.40gb.count", "1"),
                ],
                &[("nvidia.com/mig-1g.10gb", 4), ("nvidia.com/mig-3g.40gb", 1)],
            ),
            &undeclared,
        );
        assert!(mig.model_label(&undeclared).is_err());
    }

    #[test]
    fn whole_cards() {
        let c = cfg(&[("a100", &["*A100*"])]);
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                    ("nvidia.com/gpu.count", "4"),
                    ("nvidia.com/gpu.memory", "40960"),
                ],
                &[("nvidia.com/gpu", 4), ("cpu", 64)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("a100", 4)]);
        assert_eq!(inv.model, NodeModel::One(name("a100")));
        assert_eq!(plain(&inv), Some(4 * (40960 - 512)));
        assert_eq!(
            inv.budgets.len(),
            1,
            "a node of one generic model: one budget"
        );
        // Without GFD's count, the device plugin's allocatable counts the cards.
        let inv = node_inventory(
            &facts(
                &[("nvidia.com/gpu.product", "A100-PCIE-40GB")],
                &[("nvidia.com/gpu", 2)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("a100", 2)]);
        assert_eq!(plain(&inv), None, "memory unknown: nothing advertised");
        // NVML's total, where the node carries it, wins over GFD's label.
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "A100-PCIE-40GB"),
                    ("nvidia.com/gpu.memory", "40960"),
                    (NVML_MEMORY_LABEL, "40326"),
                ],
                &[("nvidia.com/gpu", 2)],
            ),
            &c,
        );
        assert_eq!(plain(&inv), Some(2 * (40326 - 512)));
    }

    #[test]
    fn time_sliced_card_is_one_unit() {
        let c = cfg(&[("t4", &["Tesla-T4"])]);
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
                    ("nvidia.com/gpu.count", "1"),
                    ("nvidia.com/gpu.replicas", "4"),
                    ("nvidia.com/gpu.memory", "15360"),
                ],
                &[("nvidia.com/gpu", 4)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("t4", 1)]);
        assert_eq!(inv.groups[0].replicas, 4);
        assert_eq!(plain(&inv), Some(15360 - 512));
        // No count label: allocatable replicas / replicas.
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
                    ("nvidia.com/gpu.replicas", "4"),
                ],
                &[("nvidia.com/gpu", 8)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("t4", 2)]);
    }

    #[test]
    fn mig_single_counts_the_slices() {
        let c = cfg(&[("mig-small", &["1g.*"]), ("a100", &["*A100*"])]);
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/mig.strategy", "single"),
                    ("nvidia.com/gpu.product", "A100-SXM4-40GB-MIG-1g.5gb"),
                    ("nvidia.com/gpu.count", "14"),
                    ("nvidia.com/gpu.memory", "4864"),
                ],
                &[("nvidia.com/gpu", 14)],
            ),
            &c,
        );
        // MIG devices are named by their profile first: `1g.*` wins over `*A100*`.
        assert_eq!(units(&inv), [("mig-small", 14)]);
        assert!(inv.groups[0].mig);
        // Without a pattern for the product, the profile's pattern names it.
        let c = cfg(&[("mig-small", &["1g.*"])]);
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/mig.strategy", "single"),
                    ("nvidia.com/gpu.product", "A100-SXM4-40GB-MIG-1g.5gb"),
                    ("nvidia.com/gpu.count", "7"),
                    ("nvidia.com/gpu.memory", "4864"),
                ],
                &[("nvidia.com/gpu", 7)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("mig-small", 7)]);
        assert_eq!(plain(&inv), Some(7 * (4864 - 512)));
        // Neither: the single strategy's default name, `gpu`.
        let inv = node_inventory(
            &facts(
                &[
                    ("nvidia.com/mig.strategy", "single"),
                    ("nvidia.com/gpu.product", "A30-MIG-2g.12gb"),
                    ("nvidia.com/gpu.count", "2"),
                ],
                &[],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("gpu", 2)]);
    }

    #[test]
    fn mig_mixed_counts_per_profile() {
        let c = cfg(&[("mig-small", &["1g.*"]), ("a100", &["*A100*"])]);
        let node = facts(
            &[
                ("nvidia.com/mig.strategy", "mixed"),
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/gpu.memory", "40960"),
                ("nvidia.com/mig-1g.5gb.count", "7"),
                ("nvidia.com/mig-1g.5gb.memory", "4864"),
                ("nvidia.com/mig-3g.20gb.count", "2"),
                ("nvidia.com/mig-3g.20gb.memory", "19968"),
            ],
            // One card without MIG, one split into 7 + 2... (as GFD would show it).
            &[
                ("nvidia.com/gpu", 1),
                ("nvidia.com/mig-1g.5gb", 7),
                ("nvidia.com/mig-3g.20gb", 2),
            ],
        );
        let inv = node_inventory(&node, &c);
        assert_eq!(
            units(&inv),
            [("a100", 1), ("mig-small", 7), ("mig-3g.20gb", 2)]
        );
        assert_eq!(
            inv.model,
            NodeModel::Several(vec![name("a100"), name("mig-3g.20gb"), name("mig-small")])
        );
        assert_eq!(inv.model.label(), None, "several models: no single label");
        assert_eq!(inv.generic_model(&c), Some(&name("a100")));
        assert_eq!(
            plain(&inv),
            Some((40960 - 512) + 7 * (4864 - 512) + 2 * (19968 - 512)),
            "no model has a resource of its own: every card a label selects, one budget"
        );
        // A model that declares the profile's resource takes it, whatever the patterns,
        // and its devices' budget apart.
        let mut c2 = c.clone();
        c2.model_resources
            .insert("nvidia.com/mig-3g.20gb".into(), name("mig-large"));
        let inv2 = node_inventory(&node, &c2);
        assert_eq!(
            units(&inv2),
            [("a100", 1), ("mig-small", 7), ("mig-large", 2)]
        );
        assert_eq!(
            inv2.budgets,
            [
                (None, (40960 - 512) + 7 * (4864 - 512)),
                (Some(name("mig-large")), 2 * (19968 - 512))
            ]
            .into_iter()
            .collect()
        );
        // The mig fallback can be turned off: such devices then belong to no model.
        let mut c3 = c.clone();
        c3.mig_fallback = false;
        assert_eq!(
            units(&node_inventory(&node, &c3)),
            [("a100", 1), ("mig-small", 7)]
        );
    }

    #[test]
    fn unknown_product_falls_back_to_gpu() {
        let c = cfg(&[("a6000", &["*A6000*"])]);
        let node = facts(
            &[
                ("nvidia.com/gpu.product", "Tesla-V100-SXM2-16GB"),
                ("nvidia.com/gpu.count", "2"),
            ],
            &[("nvidia.com/gpu", 2)],
        );
        assert_eq!(units(&node_inventory(&node, &c)), [("gpu", 2)]);
        let mut off = c.clone();
        off.fallback_model = None;
        let inv = node_inventory(&node, &off);
        assert!(inv.groups.is_empty());
        assert_eq!(inv.model, NodeModel::None);
        // A node with no GPU at all has no groups and advertises nothing.
        let inv = node_inventory(&facts(&[], &[("cpu", 8)]), &c);
        assert_eq!((inv.model, inv.budgets), (NodeModel::None, Budgets::new()));
    }

    #[test]
    fn two_models_on_one_node_are_reported() {
        // Relabelled: the device plugin exposes a renamed resource beside the generic one.
        let mut c = cfg(&[("a6000", &["*A6000*"])]);
        c.model_resources
            .insert("nvidia.com/a100".into(), name("a100"));
        let inv = node_inventory(
            &facts(
                &[("nvidia.com/gpu.product", "NVIDIA-RTX-A6000")],
                &[("nvidia.com/gpu", 1), ("nvidia.com/a100", 2)],
            ),
            &c,
        );
        assert_eq!(units(&inv), [("a100", 2), ("a6000", 1)]);
        assert_eq!(
            inv.model,
            NodeModel::Several(vec![name("a100"), name("a6000")])
        );
        assert_eq!(inv.budgets, Budgets::new(), "no memory known");
    }

    #[test]
    fn model_inventory_counts_cards_in_use_and_budget() {
        let c = cfg(&[("t4", &["Tesla-T4"]), ("a100", &["*A100*"])]);
        let t4 = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
                    ("nvidia.com/gpu.count", "2"),
                    ("nvidia.com/gpu.replicas", "4"),
                    ("nvidia.com/gpu.memory", "15360"),
                ],
                &[("nvidia.com/gpu", 8)],
            ),
            &c,
        );
        let a1 = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "A100-SXM4-40GB"),
                    ("nvidia.com/gpu.count", "2"),
                    ("nvidia.com/gpu.memory", "40960"),
                ],
                &[("nvidia.com/gpu", 2)],
            ),
            &c,
        );
        let a2 = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "A100-SXM4-80GB"),
                    ("nvidia.com/gpu.count", "1"),
                    ("nvidia.com/gpu.memory", "81920"),
                ],
                &[("nvidia.com/gpu", 1)],
            ),
            &c,
        );
        let models = [name("t4"), name("a100"), name("unused")];
        let pods = |n: &'static str, k: u64| {
            (0..k).map(move |_| PodGpus {
                other: false,
                node: Some(n),
                model: None,
                units: 1,
            })
        };
        let (t4_now, a1_now, none) = (plain_now(29696), plain_now(80896), Budgets::new());
        let inv = model_inventory(
            [
                ("t4", &t4, &t4_now),
                ("a1", &a1, &a1_now),
                ("a2", &a2, &none),
            ],
            pods("t4", 3).chain(pods("a1", 1)).chain(pods("gone", 1)),
            &models,
            &c,
        );
        assert_eq!(
            inv[&name("t4")],
            ModelInventory {
                cards: 2,
                in_use: 1,
                others_in_use: 0,
                gpumem_advertised: true,
                gpumem_unit_mib: Some(15360 - 512)
            },
            "3 replicas fit on one card"
        );
        assert_eq!(
            inv[&name("a100")],
            ModelInventory {
                cards: 3,
                in_use: 1,
                others_in_use: 0,
                gpumem_advertised: false,
                gpumem_unit_mib: None
            },
            "a2 does not advertise: a budgeted pod could land there"
        );
        assert_eq!(inv[&name("unused")], ModelInventory::default());
        let one = plain_now(1);
        let five = model_inventory([("t4", &t4, &one)], pods("t4", 5), &models, &c);
        assert_eq!(five[&name("t4")].in_use, 2);
        let many = model_inventory([("t4", &t4, &one)], pods("t4", 50), &models, &c);
        assert_eq!(many[&name("t4")].in_use, 2, "never more than the cards");
        // Another workload's replicas count apart, rounded up to cards the same way:
        // one of three on a card makes that card one bookings cannot get.
        let other = |n: &'static str, k: u64| {
            (0..k).map(move |_| PodGpus {
                other: true,
                node: Some(n),
                model: None,
                units: 1,
            })
        };
        let mixed = model_inventory(
            [("t4", &t4, &one), ("a1", &a1, &one)],
            pods("t4", 2).chain(other("t4", 1)).chain(other("a1", 2)),
            &models,
            &c,
        );
        assert_eq!(
            (mixed[&name("t4")].in_use, mixed[&name("t4")].others_in_use),
            (1, 1)
        );
        assert_eq!(
            (
                mixed[&name("a100")].in_use,
                mixed[&name("a100")].others_in_use
            ),
            (2, 2)
        );
    }

    /// A pod admitted on a model counts from the moment it exists: the webhook's
    /// ledger lets its unit go at a report taken `--lend-settle` after the admission,
    /// and a report that counted only bound pods then read the unit as free while the
    /// pod waited for the scheduler, so it was lent a second time.
    #[test]
    fn admitted_pods_waiting_for_the_scheduler_count() {
        let mut c = cfg(&[("a6000", &["*A6000*"]), ("l40s", &["*L40S*"])]);
        c.model_resources
            .insert("nvidia.com/l40s".into(), name("l40s"));
        // The university's two-model node: 4 A6000 on the generic resource, 2 L40S
        // on their own.
        let mixed = node_inventory(
            &facts(
                &[
                    ("nvidia.com/gpu.product", "NVIDIA-RTX-A6000"),
                    ("nvidia.com/gpu.memory", "49152"),
                    ("nvidia.com/l40s.memory", "46068"),
                ],
                &[("nvidia.com/gpu", 4), ("nvidia.com/l40s", 2)],
            ),
            &c,
        );
        let (a6000, l40s) = (name("a6000"), name("l40s"));
        let models = [a6000.clone(), l40s.clone()];
        // (node, the model it was admitted on, another workload's)
        let pod = |node: Option<&'static str>, model: Option<&ModelName>, other: bool| {
            (node, model.cloned(), other)
        };
        let count = |pods: &[(Option<&'static str>, Option<ModelName>, bool)]| {
            let pods = pods.iter().map(|(node, model, other)| PodGpus {
                node: *node,
                model: model.as_ref(),
                units: 1,
                other: *other,
            });
            let now = [(None, 1), (Some(l40s.clone()), 1)].into_iter().collect();
            model_inventory([("mixed-00", &mixed, &now)], pods, &models, &c)
        };
        // One l40s bound, one admitted and not bound yet: both cards are taken.
        let inv = count(&[
            pod(Some("mixed-00"), Some(&l40s), false),
            pod(None, Some(&l40s), false),
        ]);
        assert_eq!(
            (inv[&l40s].cards, inv[&l40s].in_use, inv[&l40s].free()),
            (2, 2, 0),
            "an l40s pod waiting for the scheduler left its card free to lend"
        );
        assert_eq!(
            inv[&a6000].in_use, 0,
            "the other model of the node is untouched"
        );
        // A generic request admitted on a6000 counts against a6000; one of another
        // workload is counted apart too; never more than the cards.
        let inv = count(&[
            pod(None, Some(&a6000), false),
            pod(None, Some(&a6000), true),
            pod(None, Some(&l40s), false),
            pod(None, Some(&l40s), false),
            pod(None, Some(&l40s), false),
        ]);
        assert_eq!((inv[&a6000].in_use, inv[&a6000].others_in_use), (2, 1));
        assert_eq!(inv[&l40s].in_use, 2, "never more than the cards");
        // Without a model (nobody decided it), a pod without a node counts nothing.
        let inv = count(&[pod(None, None, true)]);
        assert_eq!((inv[&a6000].in_use, inv[&l40s].in_use), (0, 0));
    }

    #[test]
    fn mismatch_only_when_counted_and_different() {
        assert!(!units_mismatch(4, None));
        assert!(!units_mismatch(4, Some(4)));
        assert!(
            units_mismatch(4, Some(1)),
            "a time-sliced card counted once"
        );
        assert!(units_mismatch(0, Some(2)));
    }

    proptest! {
        /// Whatever GFD writes, the inventory never panics, a time-sliced card counts
        /// once however many replicas it has, and the budget is units x (memory - reserve).
        #[test]
        fn cards_not_replicas(cards in 0u64..16, replicas in 1u64..32, memory in 0u64..100_000,
                              reserve in 0u64..4096, junk in "[ -~]{0,12}") {
            let c = InventoryConfig { reserve_mib: reserve, ..cfg(&[("t4", &["*T4*"])]) };
            let node = facts(
                &[
                    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
                    ("nvidia.com/gpu.replicas", &replicas.to_string()),
                    ("nvidia.com/gpu.memory", &memory.to_string()),
                    ("nvidia.com/mig.strategy", &junk),
                    ("nvidia.com/mig-.count", &junk),
                ],
                &[("nvidia.com/gpu", cards * replicas)],
            );
            let inv = node_inventory(&node, &c);
            prop_assert_eq!(inv.units_of(&name("t4")), cards);
            let expected = (cards * memory.saturating_sub(reserve) > 0 && memory > 0)
                .then(|| cards * memory.saturating_sub(reserve));
            prop_assert_eq!(plain(&inv), expected);
            prop_assert_eq!(inv.budgets.len(), usize::from(expected.is_some()));
        }

        /// However many pods hold however many replicas, a model never has more cards
        /// in use than cards, and pods on nodes that are gone count nothing.
        #[test]
        fn in_use_never_exceeds_cards(cards in 1u64..8, replicas in 1u64..8,
                                      pods in proptest::collection::vec((0usize..3, 1u64..6), 0..24)) {
            let c = cfg(&[("t4", &["*T4*"])]);
            let node = facts(
                &[
                    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
                    ("nvidia.com/gpu.replicas", &replicas.to_string()),
                ],
                &[("nvidia.com/gpu", cards * replicas)],
            );
            let inv = node_inventory(&node, &c);
            let names = ["n1", "n2", "gone"];
            let models = [name("t4")];
            let out = model_inventory(
                [("n1", &inv, &Budgets::new()), ("n2", &inv, &Budgets::new())],
                pods.iter().map(|&(n, units)| PodGpus { node: Some(names[n]), model: None, units, other: false }),
                &models,
                &c,
            );
            let t4 = out[&name("t4")];
            prop_assert_eq!(t4.cards, 2 * cards);
            prop_assert!(t4.in_use <= t4.cards);
            let on = |n: usize| pods.iter().filter(|p| p.0 == n).map(|p| p.1).sum::<u64>();
            let expected = on(0).div_ceil(replicas).min(cards) + on(1).div_ceil(replicas).min(cards);
            prop_assert_eq!(t4.in_use, expected);
        }
    }
}
