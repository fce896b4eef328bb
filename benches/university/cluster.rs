//! The university's cluster: its nodes, its models, and what its pods hold, read
//! from the cluster itself (to check the controller's reports against, and to find
//! pods bound beyond what a node has).

use std::collections::BTreeMap;

use chrono::Utc;
use gpu_booking_api::store::models::{self, ModelSpec};
use gpu_booking_core::admission::{budget_resource, is_budget_resource, PRIORITY_LABEL};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_sim::GpuNode;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use sqlx::PgPool;

/// A bookable model of the university.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub name: &'static str,
    pub pattern: &'static str,
    /// Its own extended resource, if it has one (MIG profiles, the second model of
    /// a node with two).
    pub resource: Option<&'static str>,
    /// The VRAM budget of one pod, MiB: a card's (a MIG device's) memory less the
    /// chart's 512 MiB reserve; on a time-sliced T4, a quarter of the card less a
    /// little, so that one lent pod ended leaves room for a booked pod and the
    /// controller's 256 MiB cushion.
    pub gpumem_mib: i32,
    /// Time-slicing replicas per card.
    pub replicas: u64,
}

/// In matching order: the MIG profiles before anything an A100 pattern could name.
pub const MODELS: [Model; 6] = [
    Model {
        name: "mig-small",
        pattern: "*MIG-1g.5gb",
        resource: Some("nvidia.com/mig-1g.5gb"),
        gpumem_mib: 4864 - 512,
        replicas: 1,
    },
    Model {
        name: "mig-big",
        pattern: "*MIG-3g.20gb",
        resource: Some("nvidia.com/mig-3g.20gb"),
        gpumem_mib: 19968 - 512,
        replicas: 1,
    },
    Model {
        name: "a100",
        pattern: "*A100-SXM4-80GB",
        resource: None,
        gpumem_mib: 81920 - 512,
        replicas: 1,
    },
    Model {
        name: "t4",
        pattern: "Tesla T4",
        resource: None,
        gpumem_mib: 3584,
        replicas: 4,
    },
    Model {
        name: "a6000",
        pattern: "*A6000*",
        resource: None,
        gpumem_mib: 49152 - 512,
        replicas: 1,
    },
    Model {
        name: "l40s",
        pattern: "*L40S*",
        resource: Some("nvidia.com/l40s"),
        gpumem_mib: 46068 - 512,
        replicas: 1,
    },
];

pub const GPUMEM: &str = "gpu-booking.io/gpumem";
/// The namespace the notebooks run in (`controller.namespace`).
pub const NOTEBOOKS: &str = "jhub";

/// The chart's `--set`s: the models reached through resources of their own.
pub fn chart_values() -> Vec<String> {
    MODELS
        .iter()
        .filter_map(|m| {
            m.resource
                .map(|r| format!("webhook.modelResources.{}={r}", m.name))
        })
        .collect()
}

/// How many nodes of each kind.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// 8 whole A100 80GB cards each.
    pub a100: usize,
    /// 2 A100 40GB cards each, as MIG: 8 x 1g.5gb and 2 x 3g.20gb.
    pub mig: usize,
    /// 4 T4s each, time-sliced 4 ways.
    pub t4: usize,
    /// 4 RTX A6000s (the generic resource) and 2 L40S (`nvidia.com/l40s`) each.
    pub mixed: usize,
    /// CPU-only nodes.
    pub cpu: usize,
}

impl Shape {
    /// 64 GPU nodes at scale 1 (20 + 12 + 16 + 16), 440 units, and 8 CPU nodes.
    pub fn scaled(scale: f64) -> Shape {
        let n = |full: f64| ((full * scale).round() as usize).max(1);
        Shape {
            a100: n(20.0),
            mig: n(12.0),
            t4: n(16.0),
            mixed: n(16.0),
            cpu: n(8.0),
        }
    }

    pub fn gpu_nodes(&self) -> usize {
        self.a100 + self.mig + self.t4 + self.mixed
    }

    pub fn nodes(&self) -> Vec<GpuNode> {
        let mut nodes = Vec::new();
        for i in 0..self.a100 {
            nodes.push(GpuNode::gpu(
                &format!("a100-{i:02}"),
                "NVIDIA-A100-SXM4-80GB",
                8,
                81920,
            ));
        }
        for i in 0..self.mig {
            nodes.push(
                GpuNode::gpu(&format!("mig-{i:02}"), "NVIDIA-A100-SXM4-40GB", 2, 40960)
                    .mig("1g.5gb", 8, 4864)
                    .with_cards(
                        "nvidia.com/mig-3g.20gb",
                        "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
                        2,
                        19968,
                    ),
            );
        }
        for i in 0..self.t4 {
            nodes.push(GpuNode::gpu(&format!("t4-{i:02}"), "Tesla-T4", 4, 15360).time_sliced(4));
        }
        for i in 0..self.mixed {
            nodes.push(
                GpuNode::gpu(&format!("mixed-{i:02}"), "NVIDIA-RTX-A6000", 4, 49152).with_cards(
                    "nvidia.com/l40s",
                    "NVIDIA-L40S",
                    2,
                    46068,
                ),
            );
        }
        for i in 0..self.cpu {
            let mut node = GpuNode::cpu_only(&format!("cpu-{i:02}"));
            node.pods = 250;
            node.cpu = 128;
            node.memory_gib = 1024;
            nodes.push(node);
        }
        nodes
    }

    /// Cards (MIG devices; a time-sliced card once) of each model, by model index.
    pub fn cards(&self) -> [u64; MODELS.len()] {
        let (a100, mig, t4, mixed) = (
            self.a100 as u64,
            self.mig as u64,
            self.t4 as u64,
            self.mixed as u64,
        );
        [8 * mig, 2 * mig, 8 * a100, 4 * t4, 4 * mixed, 2 * mixed]
    }
}

/// Declares the models as an admin would, with every card bookable.
pub async fn declare(pool: &PgPool, shape: &Shape) -> anyhow::Result<()> {
    let cards = shape.cards();
    for (position, model) in MODELS.iter().enumerate() {
        let patterns = vec![model.pattern.to_owned()];
        let spec = ModelSpec {
            name: model.name,
            units: i32::try_from(cards[position])?,
            patterns: &patterns,
            resource: model.resource,
            gpumem_mib: model.gpumem_mib,
            position: Some(i32::try_from(position)?),
        };
        models::upsert(pool, spec, Utc::now()).await?;
    }
    Ok(())
}

pub fn model_index(name: &str) -> Option<usize> {
    MODELS.iter().position(|m| m.name == name)
}

/// The model a pod holds with `resource` on `node`.
pub fn model_of(node: &str, resource: &str) -> Option<usize> {
    if let Some(i) = MODELS.iter().position(|m| m.resource == Some(resource)) {
        return Some(i);
    }
    if resource != "nvidia.com/gpu" {
        return None;
    }
    let name = if node.starts_with("a100-") {
        "a100"
    } else if node.starts_with("t4-") {
        "t4"
    } else if node.starts_with("mixed-") {
        "a6000"
    } else {
        return None;
    };
    model_index(name)
}

/// A quantity as an integer (extended resources are integers; `1k` and the like
/// are not used here).
fn integer(q: &str) -> u64 {
    q.parse::<f64>().map_or(0, |v| v as u64)
}

/// The extended resources (`nvidia.com/*`, the VRAM budget) a pod asks for: each
/// container's request, else its limit (which is then its request).
pub fn extended_requests(pod: &Pod) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    for c in &spec.containers {
        let Some(res) = c.resources.as_ref() else {
            continue;
        };
        let mut keys: Vec<&String> = Vec::new();
        for map in [&res.requests, &res.limits].into_iter().flatten() {
            keys.extend(map.keys());
        }
        keys.sort();
        keys.dedup();
        for key in keys {
            if !(key.starts_with("nvidia.com/") || is_budget_resource(GPUMEM, key)) {
                continue;
            }
            let q = res
                .requests
                .as_ref()
                .and_then(|m| m.get(key))
                .or_else(|| res.limits.as_ref().and_then(|m| m.get(key)));
            if let Some(q) = q {
                *out.entry(key.clone()).or_default() += integer(&q.0);
            }
        }
    }
    out
}

/// The GPU resource a pod asks for, if any, and how many.
pub fn gpu_request(pod: &Pod) -> Option<(String, u64)> {
    extended_requests(pod)
        .into_iter()
        .find(|(k, n)| k.starts_with("nvidia.com/") && *n > 0)
}

pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod.metadata.deletion_timestamp.is_none()
        && node_of(pod).is_some()
}

pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Cards of each model held, as the controller counts them (a time-sliced card with
/// any pod on it is held): by every bound pod, and by pods that never give way to a
/// booking.
#[derive(Debug, Clone, Default)]
pub struct Held {
    pub all: [u64; MODELS.len()],
    pub others: [u64; MODELS.len()],
    /// Pods (replicas, for the T4s) holding each model.
    pub pods: [u64; MODELS.len()],
    /// Of which lent notebooks.
    pub lent: [u64; MODELS.len()],
}

pub fn held(pods: &[Pod]) -> Held {
    let mut units: BTreeMap<(String, usize), (u64, u64)> = BTreeMap::new();
    let mut out = Held::default();
    for pod in pods.iter().filter(|p| !finished(p)) {
        let (Some(node), Some((resource, n))) = (node_of(pod), gpu_request(pod)) else {
            continue;
        };
        let Some(model) = model_of(node, &resource) else {
            continue;
        };
        // What bookings cannot get, as the controller counts it: anything but booked
        // pods and the lent pods of the namespace it serves (a pod the webhook never
        // marked, whatever its namespace, included).
        let standing = label(pod, PRIORITY_LABEL);
        let other = standing != Some("high")
            && !(standing == Some("low") && pod.metadata.namespace.as_deref() == Some(NOTEBOOKS));
        let entry = units.entry((node.to_owned(), model)).or_default();
        entry.0 += n;
        if other {
            entry.1 += n;
        }
        out.pods[model] += n;
        if standing == Some("low") && !other {
            out.lent[model] += n;
        }
    }
    let per_node = PER_NODE_CARDS;
    for ((_, model), (all, others)) in units {
        let replicas = MODELS[model].replicas;
        let cap = per_node[model];
        out.all[model] += all.div_ceil(replicas).min(cap);
        out.others[model] += others.div_ceil(replicas).min(cap);
    }
    out
}

/// Cards of each model on one node of its kind.
const PER_NODE_CARDS: [u64; MODELS.len()] = [8, 2, 8, 4, 4, 2];

/// What the bound pods that have not finished ask for, per node and extended
/// resource.
fn bound_requests(pods: &[Pod]) -> BTreeMap<(String, String), u64> {
    let mut asked = BTreeMap::new();
    for pod in pods.iter().filter(|p| !finished(p)) {
        let Some(node) = node_of(pod) else {
            continue;
        };
        for (resource, n) in extended_requests(pod) {
            *asked.entry((node.to_owned(), resource)).or_default() += n;
        }
    }
    asked
}

fn allocatable(node: &Node) -> BTreeMap<String, Quantity> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.clone())
        .unwrap_or_default()
}

/// Per node and extended resource, what the bound pods ask for beyond what the node
/// has (none, if the scheduler kept to allocatable).
pub fn beyond_allocatable(nodes: &[Node], pods: &[Pod]) -> Vec<String> {
    let asked = bound_requests(pods);
    let mut out = Vec::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable = allocatable(node);
        for ((n, resource), &want) in asked.range((name.clone(), String::new())..) {
            if *n != name {
                break;
            }
            let has = allocatable.get(resource).map_or(0, |q| integer(&q.0));
            if want > has {
                out.push(format!(
                    "{name}: {resource} {want} bound, {has} allocatable"
                ));
            }
        }
    }
    out
}

/// The model a pod is for: its own resource's, else the model its node selector
/// names ("?" if neither).
pub fn pod_model(pod: &Pod) -> String {
    if let Some((resource, _)) = gpu_request(pod) {
        if let Some(m) = MODELS
            .iter()
            .find(|m| m.resource == Some(resource.as_str()))
        {
            return m.name.to_owned();
        }
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get("gpu-booking.io/model"))
        .cloned()
        .unwrap_or_else(|| "?".into())
}

/// The models a node of the university has, by its name.
fn node_models(node: &str) -> &'static [&'static str] {
    match node.split('-').next() {
        Some("a100") => &["a100"],
        Some("mig") => &["mig-small", "mig-big"],
        Some("t4") => &["t4"],
        Some("mixed") => &["a6000", "l40s"],
        _ => &[],
    }
}

/// Per model, how many more booked pods (one unit and the model's VRAM budget each)
/// the scheduler could place now, with what the bound pods already ask for: the room
/// a burst of booked pods finds without a victim.
pub fn room(nodes: &[Node], pods: &[Pod]) -> [u64; MODELS.len()] {
    let used = bound_requests(pods);
    let mut out = [0; MODELS.len()];
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable = allocatable(node);
        let free = |resource: &str| {
            let has = allocatable.get(resource).map_or(0, |q| integer(&q.0));
            has.saturating_sub(
                used.get(&(name.clone(), resource.to_owned()))
                    .copied()
                    .unwrap_or(0),
            )
        };
        for model in node_models(&name) {
            let Some(i) = model_index(model) else {
                continue;
            };
            let m = &MODELS[i];
            let units = free(m.resource.unwrap_or("nvidia.com/gpu"));
            let budget = u64::try_from(m.gpumem_mib).unwrap_or(0).max(1);
            // A model under its own resource has a budget of its own on the node.
            let budget_key = match m.resource {
                Some(_) => ModelName::parse(m.name)
                    .ok()
                    .and_then(|name| budget_resource(GPUMEM, Some(&name)).ok()),
                None => Some(GPUMEM.to_owned()),
            };
            let vram = match budget_key {
                Some(key) if allocatable.contains_key(&key) => free(&key) / budget,
                _ => u64::MAX,
            };
            out[i] += units.min(vram);
        }
    }
    out
}
