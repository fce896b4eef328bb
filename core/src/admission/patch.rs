//! The one JSON Patch planner: a [`Decision`] written into a pod as RFC 6902 operations.
//!
//! Every operation is generated against, and at once applied to, a working copy of the
//! pod, so each one is addressed to what is really there: a missing `annotations`,
//! `labels`, `nodeSelector`, `env` or `resources` map is created by the operation that
//! needs it, a present member is replaced, an absent one is never removed, and keys
//! with `/` or `~` are escaped (`~1`, `~0`) by the pointer type. An operation that would
//! not apply is dropped (a planner bug, caught by `debug_assert!` in the tests), so the
//! returned patch always applies to the pod it was planned for.

use std::collections::BTreeMap;

use chrono::SecondsFormat;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::{json, Map, Value};

use super::budget::{container_budget_mib, is_budget_resource};
use super::detect::{container_gpu_units, detect_gpu, sets_visible_devices, CONTAINER_LISTS};
use super::marks::{is_harmless_key, is_our_key};
use super::quantity::gpu_units;
use super::{
    AdmissionConfig, Decision, StripReason, VisibleDevicesWithoutGpu, BOOKING_LABEL,
    BOOKING_UNITS_ANNOTATION, GPU_REMOVED_ANNOTATION, MODEL_LABEL, NVIDIA_VISIBLE_DEVICES,
    PRIORITY_LABEL,
};
use crate::gpu_model::ModelName;
use crate::offers::{Wanted, GPU_WANTED_ANNOTATION};

/// The patch that carries out `decision` on `pod` (empty when nothing changes). Every
/// key of ours that the pod's creator wrote and the decision does not write goes
/// first (a self-written `priority=high` or `terminate-at` must not survive any
/// path, [`super::marks`]).
pub fn plan(pod: &Value, decision: &Decision, cfg: &AdmissionConfig) -> Patch {
    plan_owned(pod.clone(), decision, cfg)
}

/// [`plan`] on a pod the caller has no further use for (the webhook's, read from the
/// review): the planner's working copy is the pod itself, not a copy of it.
pub fn plan_owned(pod: Value, decision: &Decision, cfg: &AdmissionConfig) -> Patch {
    let mut ed = PodEditor::new(pod);
    if !ed.pod.is_object() {
        return ed.finish();
    }
    let written: Vec<&str> = match decision {
        Decision::Booked { .. } => vec![
            PRIORITY_LABEL,
            BOOKING_LABEL,
            MODEL_LABEL,
            BOOKING_UNITS_ANNOTATION,
            cfg.terminate_at_annotation.as_str(),
        ],
        Decision::LowPriority { .. } => vec![PRIORITY_LABEL, MODEL_LABEL],
        Decision::Strip { .. } | Decision::Unchecked { .. } | Decision::OtherWorkload => Vec::new(),
    };
    ed.unmark(cfg, &written);
    match decision {
        Decision::Booked {
            booking_id,
            model,
            until,
            gpumem_mib,
            booking_units,
            ..
        } => {
            ed.mark(Some("high"), Some(*booking_id), Some(model));
            match booking_units {
                Some(units) => ed.set_annotation(BOOKING_UNITS_ANNOTATION, &units.to_string()),
                None => ed.remove_annotation(BOOKING_UNITS_ANNOTATION),
            }
            ed.set_annotation(
                &cfg.terminate_at_annotation,
                &until.to_rfc3339_opts(SecondsFormat::Secs, true),
            );
            ed.remove_annotation(GPU_REMOVED_ANNOTATION);
            ed.remove_annotation(GPU_WANTED_ANNOTATION);
            ed.place_on(cfg, model);
            match &cfg.high_priority_class {
                Some(class) => ed.set_priority_class(class),
                None => ed.demote_priority_class(cfg),
            }
            ed.apply_budget(cfg, model, *gpumem_mib);
        }
        Decision::LowPriority {
            model, gpumem_mib, ..
        } => {
            ed.mark(Some("low"), None, Some(model));
            ed.remove_annotation(&cfg.terminate_at_annotation);
            ed.remove_annotation(BOOKING_UNITS_ANNOTATION);
            ed.remove_annotation(GPU_REMOVED_ANNOTATION);
            ed.remove_annotation(GPU_WANTED_ANNOTATION);
            ed.place_on(cfg, model);
            match &cfg.low_priority_class {
                Some(class) => ed.set_priority_class(class),
                None => ed.demote_priority_class(cfg),
            }
            ed.apply_budget(cfg, model, *gpumem_mib);
        }
        Decision::Strip { reason, .. } => {
            // What it asked for, read before its GPU goes: a GPU freed later is
            // offered back to it (`crate::offers`). Not for a pod that no unit can
            // satisfy (several models) or that nobody owns.
            // A pod that asks for no GPU any more is this strip planned again over
            // its own result: what it wanted stays as written.
            let wanted = match reason {
                StripReason::SeveralModels | StripReason::NoIdentity => Some(None),
                _ => wanted_by(&ed.pod, cfg).map(Some),
            };
            ed.cpu_only(cfg);
            if let Some(reason) = decision.removal_reason() {
                ed.set_annotation(GPU_REMOVED_ANNOTATION, &reason);
            }
            match wanted {
                Some(Some(w)) => ed.set_annotation(GPU_WANTED_ANNOTATION, &w.annotation()),
                Some(None) => ed.remove_annotation(GPU_WANTED_ANNOTATION),
                None => {}
            }
        }
        // Let through unchecked (the booking service failed, policy allow): no
        // booking is known, so the pod cannot keep our high class.
        Decision::Unchecked { .. } => ed.demote_priority_class(cfg),
        // Another workload's GPU as its creator wrote it: no note of a removed or
        // wanted GPU (it is no user's, and it holds its GPU), and not our high class
        // (it is not booked), nor our low one (nobody could take its card back).
        Decision::OtherWorkload => {
            ed.remove_annotation(GPU_REMOVED_ANNOTATION);
            ed.remove_annotation(GPU_WANTED_ANNOTATION);
            ed.drop_high_priority_class(cfg);
        }
    }
    ed.finish()
}

/// The patch for a pod without a GPU: every key of ours its creator wrote removed,
/// and our high priority class taken away (it is only for booked GPU pods); empty
/// for the usual pod. Where it sets `NVIDIA_VISIBLE_DEVICES` to hand a container
/// cards anyway (`all`, an index, a `valueFrom`) and the configuration says strip,
/// the variable set to `none` in those containers: `none` rather than removed, since
/// an explicit entry also wins over an `envFrom` and over the image's own
/// `ENV NVIDIA_VISIBLE_DEVICES=all` (CUDA base images set it). The second value says
/// whether it did (the pod gets a warning).
///
/// The note of a removed GPU (`gpu-booking.io/gpu-removed`) stays only on the
/// controller's own CPU-only copies (`by_controller`: the requester is the
/// controller): from anyone else it would put a "stripped" notebook of the user it
/// names on that user's page.
pub fn plan_no_gpu(pod: &Value, cfg: &AdmissionConfig, by_controller: bool) -> (Patch, bool) {
    let hide_devices = cfg.visible_devices_without_gpu == VisibleDevicesWithoutGpu::Strip;
    let mut ed = PodEditor::new(pod.clone());
    let mut hidden = false;
    if pod.is_object() {
        ed.unmark(cfg, &[]);
        if !by_controller {
            ed.remove(&["metadata", "annotations", GPU_REMOVED_ANNOTATION]);
            ed.remove(&["metadata", "annotations", GPU_WANTED_ANNOTATION]);
        }
        ed.drop_high_priority_class(cfg);
        if hide_devices {
            for (list, index) in ed.container_slots() {
                if ed.container(list, &index).is_some_and(sets_visible_devices) {
                    ed.hide_devices(list, &index);
                    hidden = true;
                }
            }
        }
    }
    (ed.finish(), hidden)
}

/// The CPU-only step on its own: every GPU resource and every VRAM budget resource
/// (the plain one and each model's, [`super::is_budget_resource`]) removed from
/// every container and init container (requests and limits), `NVIDIA_VISIBLE_DEVICES`
/// set to `none` in each (replacing any value, creating `env` where absent), our labels,
/// `terminate-at`, model node selector and priority class dropped. The controller
/// applies it to recreate a pod without its GPU.
pub fn plan_cpu_only(pod: &Value, cfg: &AdmissionConfig) -> Patch {
    let mut ed = PodEditor::new(pod.clone());
    if pod.is_object() {
        ed.cpu_only(cfg);
    }
    ed.finish()
}

/// [`plan_cpu_only`] plus the `gpu-booking.io/gpu-removed` annotation with `reason`,
/// and, for a pod that was not booked (a lent GPU taken back), what it asked for
/// (`gpu-booking.io/gpu-wanted`): a GPU freed later is offered back to its user
/// ([`crate::offers`]). A booked pod's GPU time is over when its booking ends: it
/// waits for nothing.
pub fn plan_cpu_only_because(pod: &Value, cfg: &AdmissionConfig, reason: &str) -> Patch {
    let mut ed = PodEditor::new(pod.clone());
    if pod.is_object() {
        let booked = super::pod_label(pod, PRIORITY_LABEL) == Some("high");
        let wanted = (!booked).then(|| wanted_by(pod, cfg)).flatten();
        ed.cpu_only(cfg);
        ed.set_annotation(GPU_REMOVED_ANNOTATION, reason);
        match wanted {
            Some(w) => ed.set_annotation(GPU_WANTED_ANNOTATION, &w.annotation()),
            None => ed.remove_annotation(GPU_WANTED_ANNOTATION),
        }
    }
    ed.finish()
}

/// What a GPU pod asks for, as [`GPU_WANTED_ANNOTATION`] says it: its units and its
/// one model (any model when it asks for the generic resource); `None` without a
/// GPU or with several models.
fn wanted_by(pod: &Value, cfg: &AdmissionConfig) -> Option<Wanted> {
    let gpu = detect_gpu(pod, cfg)?;
    if gpu.models.len() > 1 {
        return None;
    }
    Some(Wanted {
        units: gpu.units.max(1),
        model: gpu.model().cloned(),
    })
}

/// The demotion of a booked pod (the controller's `--on-expiry demote`): a pod's
/// priority cannot change once it exists, so its copy is made a lent pod as the
/// webhook admits one ([`plan`] with [`Decision::LowPriority`] for the model its
/// `gpu-booking/model` label names): the low priority class, no booking label, no
/// `terminate-at`, its GPU, VRAM budget and model node selector kept. `None` when the
/// pod names no valid model (the caller then makes it CPU-only instead).
pub fn plan_demoted(pod: &Value, cfg: &AdmissionConfig) -> Option<Patch> {
    // A pod admitted before the upgrade names its model under the legacy key.
    let model = super::pod_label(pod, MODEL_LABEL).and_then(|m| ModelName::parse(m).ok())?;
    let decision = Decision::LowPriority {
        model,
        gpumem_mib: None,
        beyond_booking: None,
    };
    Some(plan(pod, &decision, cfg))
}

/// The JSON Patch of a node's `status` subresource that makes it advertise exactly
/// the VRAM budgets `want` (resource name -> MiB) in `capacity` and `allocatable`, as
/// "Advertise Extended Resources for a Node" does it by hand: each one set, and every
/// other budget resource of `gpumem` there (the plain one, `<gpumem>-<model>` of a
/// model no longer on the node) removed. The same editor as for pods: a missing map is
/// created by the operation that needs it, the `/` in the name is escaped (`~1`), an
/// absent member is never removed, and the patch is empty when the node says so
/// already.
pub fn plan_node_budgets(node: &Value, gpumem: &str, want: &BTreeMap<String, u64>) -> Patch {
    let mut ed = PodEditor::new(node.clone());
    for field in ["capacity", "allocatable"] {
        let stale: Vec<String> = ed
            .pod
            .get("status")
            .and_then(|s| s.get(field))
            .and_then(Value::as_object)
            .map(|m| {
                m.keys()
                    .filter(|k| is_budget_resource(gpumem, k) && !want.contains_key(*k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for key in stale {
            ed.remove(&["status", field, &key]);
        }
        for (resource, mib) in want {
            ed.set(&["status", field, resource], json!(mib.to_string()));
        }
    }
    ed.finish()
}

/// [`plan_node_budgets`] with the one budget `resource`: `amount` of it, or none
/// (`None`, what the uninstall's cleanup asks); either way no budget of a model
/// (`<resource>-<model>`) stays.
pub fn plan_node_resource(node: &Value, resource: &str, amount: Option<u64>) -> Patch {
    let want = amount
        .map(|n| (resource.to_owned(), n))
        .into_iter()
        .collect();
    plan_node_budgets(node, resource, &want)
}

/// A working copy of a pod (or a node's status) and the operations that led to it.
struct PodEditor {
    pod: Value,
    ops: Vec<PatchOperation>,
}

impl PodEditor {
    fn new(pod: Value) -> Self {
        Self {
            pod,
            ops: Vec::new(),
        }
    }

    fn finish(self) -> Patch {
        Patch(self.ops)
    }

    /// Applies `op` to the working copy and records it; drops it if it does not apply.
    fn apply(&mut self, op: PatchOperation) {
        match json_patch::patch(&mut self.pod, std::slice::from_ref(&op)) {
            Ok(()) => self.ops.push(op),
            Err(err) => debug_assert!(false, "planned an operation that does not apply: {err}"),
        }
    }

    /// Sets the value at `path`, whose tokens name object members (or existing array
    /// elements, followed by a member). Missing, null or non-object parents are
    /// created as objects by the same operation. Nothing happens when the value is
    /// already there.
    fn set(&mut self, path: &[&str], value: Value) {
        if let Some(op) = self.set_op(path, value) {
            self.apply(op);
        }
    }

    fn set_op(&self, path: &[&str], value: Value) -> Option<PatchOperation> {
        let mut node = &self.pod;
        for (i, token) in path.iter().enumerate() {
            let here = || PointerBuf::from_tokens(path[..=i].iter().copied());
            let last = i + 1 == path.len();
            match node {
                Value::Object(map) => {
                    let child = map.get(*token);
                    if last {
                        return (child != Some(&value)).then(|| add(here(), value));
                    }
                    let next_is_index = path[i + 1].parse::<usize>().is_ok();
                    match child {
                        Some(c @ Value::Object(_)) => node = c,
                        Some(c @ Value::Array(_)) if next_is_index => node = c,
                        // Absent, null or of the wrong type: put the rest there anew.
                        _ => return Some(add(here(), nest(&path[i + 1..], value))),
                    }
                }
                Value::Array(items) => {
                    let item = token.parse::<usize>().ok().and_then(|n| items.get(n))?;
                    if last {
                        return (item != &value).then(|| {
                            PatchOperation::Replace(ReplaceOperation {
                                path: here(),
                                value,
                            })
                        });
                    }
                    node = item;
                }
                _ => return None,
            }
        }
        None
    }

    /// Removes the value at `path` if it is there.
    fn remove(&mut self, path: &[&str]) {
        let pointer = PointerBuf::from_tokens(path.iter().copied());
        if !path.is_empty() && self.pod.pointer(pointer.as_str()).is_some() {
            self.apply(PatchOperation::Remove(RemoveOperation { path: pointer }));
        }
    }

    /// Removes every label and annotation of ours (but the harmless note of a
    /// removed GPU) except those in `written`, which the decision writes itself.
    fn unmark(&mut self, cfg: &AdmissionConfig, written: &[&str]) {
        for map in ["labels", "annotations"] {
            let keys: Vec<String> = self
                .pod
                .get("metadata")
                .and_then(|m| m.get(map))
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter(|k| is_our_key(k, cfg) && !is_harmless_key(k))
                        .filter(|k| !written.contains(&k.as_str()))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for key in keys {
                self.remove(&["metadata", map, &key]);
            }
        }
    }

    fn set_annotation(&mut self, key: &str, value: &str) {
        self.set(&["metadata", "annotations", key], json!(value));
    }

    fn remove_annotation(&mut self, key: &str) {
        self.remove(&["metadata", "annotations", key]);
    }

    /// Our labels: priority, booking id and model; `None` removes one.
    fn mark(&mut self, priority: Option<&str>, booking: Option<i64>, model: Option<&ModelName>) {
        let labels = [
            (PRIORITY_LABEL, priority.map(str::to_owned)),
            (BOOKING_LABEL, booking.map(|id| id.to_string())),
            (MODEL_LABEL, model.map(|m| m.as_str().to_owned())),
        ];
        for (key, value) in labels {
            match value {
                Some(value) => self.set(&["metadata", "labels", key], json!(value)),
                None => self.remove(&["metadata", "labels", key]),
            }
        }
    }

    /// Where a booked or lent pod runs: on `model`. A model with a resource of its
    /// own (seed 001's `nvidia.com/a100`, a MIG profile's) is that resource, not a
    /// node: the pod's generic GPU requests become the model's resource and no node
    /// selector is written, so nodes with cards of several models take it. Otherwise
    /// the model's node label selects its nodes (the controller labels nodes of one
    /// model).
    fn place_on(&mut self, cfg: &AdmissionConfig, model: &ModelName) {
        match cfg.resource_of(model) {
            Some(resource) => {
                self.request_as(cfg, resource);
                self.select_model(cfg, None);
            }
            None => self.select_model(cfg, Some(model)),
        }
    }

    /// Every generic GPU request and limit of every container and init container
    /// moved to `resource`: a container that asks for any gets, in each of its
    /// requests and limits that named a GPU, the units it asked for in all (each
    /// resource counted once, its limit or request, whichever is more, as
    /// [`container_gpu_units`] counts them), so the count never changes and requests
    /// equal limits as an extended resource needs.
    fn request_as(&mut self, cfg: &AdmissionConfig, resource: &str) {
        for (list, index) in self.container_slots() {
            let Some(resources) = self
                .container(list, &index)
                .and_then(|c| c.get("resources"))
            else {
                continue;
            };
            let section = |name: &str| resources.get(name).and_then(Value::as_object);
            let moved = |key: &String| cfg.gpu_resources.contains(key) || key == resource;
            let mut keys: Vec<String> = ["requests", "limits"]
                .into_iter()
                .filter_map(section)
                .flat_map(|m| m.keys())
                .filter(|k| moved(k))
                .cloned()
                .collect();
            keys.sort();
            keys.dedup();
            if !keys.iter().any(|k| cfg.gpu_resources.contains(k)) {
                continue;
            }
            let units_of =
                |name: &str, key: &str| section(name).and_then(|m| m.get(key)).map_or(0, gpu_units);
            let units = keys
                .iter()
                .map(|k| units_of("requests", k).max(units_of("limits", k)))
                .fold(0u64, u64::saturating_add);
            let named: Vec<&str> = ["requests", "limits"]
                .into_iter()
                .filter(|name| section(name).is_some_and(|m| m.keys().any(moved)))
                .collect();
            for name in named {
                let base = ["spec", list, index.as_str(), "resources", name];
                for key in keys.iter().filter(|k| *k != resource) {
                    self.remove(&[&base[..], &[key.as_str()]].concat());
                }
                self.set(&[&base[..], &[resource]].concat(), json!(units.to_string()));
            }
        }
    }

    /// Node selection of `model` (the controller labels GPU nodes with their model).
    fn select_model(&mut self, cfg: &AdmissionConfig, model: Option<&ModelName>) {
        let path = ["spec", "nodeSelector", cfg.model_node_label.as_str()];
        match model {
            Some(model) => self.set(&path, json!(model.as_str())),
            None => self.remove(&path),
        }
    }

    /// Sets the priority class. The API server's Priority plugin has already resolved
    /// the old class into `spec.priority` (and `spec.preemptionPolicy`) and rejects a
    /// pod whose priority does not match its class, so those go when the class changes.
    fn set_priority_class(&mut self, class: &str) {
        let current = self.pod.pointer("/spec/priorityClassName");
        if current.and_then(Value::as_str) == Some(class) {
            return;
        }
        self.set(&["spec", "priorityClassName"], json!(class));
        self.remove(&["spec", "priority"]);
        self.remove(&["spec", "preemptionPolicy"]);
    }

    /// A pod that is not booked must not run in our high class: the low class, or none.
    fn demote_priority_class(&mut self, cfg: &AdmissionConfig) {
        let current = self.pod.pointer("/spec/priorityClassName");
        let current = current.and_then(Value::as_str);
        if current.is_none() || current != cfg.high_priority_class.as_deref() {
            return;
        }
        match &cfg.low_priority_class {
            Some(low) => self.set_priority_class(low),
            None => self.clear_priority_class(),
        }
    }

    /// Our high class taken away (no class instead): it is for booked pods only.
    fn drop_high_priority_class(&mut self, cfg: &AdmissionConfig) {
        let current = self.pod.pointer("/spec/priorityClassName");
        let current = current.and_then(Value::as_str);
        if current.is_some() && current == cfg.high_priority_class.as_deref() {
            self.clear_priority_class();
        }
    }

    fn clear_priority_class(&mut self) {
        self.remove(&["spec", "priorityClassName"]);
        self.remove(&["spec", "priority"]);
        self.remove(&["spec", "preemptionPolicy"]);
    }

    /// `(list, index)` of every container and init container, as the copy has them.
    fn container_slots(&self) -> Vec<(&'static str, String)> {
        CONTAINER_LISTS
            .into_iter()
            .flat_map(|list| {
                let len = self
                    .pod
                    .get("spec")
                    .and_then(|s| s.get(list))
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                (0..len).map(move |i| (list, i.to_string()))
            })
            .collect()
    }

    fn container(&self, list: &str, index: &str) -> Option<&Value> {
        let index: usize = index.parse().ok()?;
        self.pod.get("spec")?.get(list)?.get(index)
    }

    /// The VRAM budget on every GPU container of a pod on `model`: `per_unit` MiB
    /// times its GPU units, on requests and limits alike (an extended resource needs
    /// both, equal), under the model's budget resource
    /// ([`AdmissionConfig::budget_resource_of`]: `<gpumem>-<model>` for a model with a
    /// resource of its own, else the plain one). A container with a budget of its own
    /// keeps it; one written on one side only is copied to the other, and limits win
    /// when the two differ. A budget of its own under another budget resource (the
    /// plain one on a pod moved to its model's resource, another model's) is moved to
    /// the model's, the amounts of all of them added: a budget left under the plain
    /// resource would be charged against the other models' cards of a node.
    fn apply_budget(&mut self, cfg: &AdmissionConfig, model: &ModelName, per_unit: Option<u64>) {
        // Checked at start-up (`AdmissionConfig::validate`); a model learned since
        // whose budget cannot be named gets none, as the controller advertises none.
        let Ok(res) = cfg.budget_resource_of(model) else {
            return;
        };
        let res = res.as_str();
        let gpumem = cfg.gpumem_resource.as_str();
        for (list, index) in self.container_slots() {
            let Some(container) = self.container(list, &index) else {
                continue;
            };
            let units = container_gpu_units(container, cfg, &mut Default::default());
            if units == 0 {
                continue;
            }
            let resources = container.get("resources").cloned().unwrap_or(Value::Null);
            let section = |name: &str| resources.get(name).and_then(Value::as_object);
            let others: Vec<(&'static str, String)> = ["requests", "limits"]
                .into_iter()
                .flat_map(|name| {
                    section(name)
                        .into_iter()
                        .flat_map(|m| m.keys())
                        .filter(|k| *k != res && is_budget_resource(gpumem, k))
                        .map(move |k| (name, k.clone()))
                })
                .collect();
            let own = |name: &str| {
                section(name)
                    .and_then(|s| s.get(res))
                    .filter(|v| !v.is_null())
            };
            let budget = if !others.is_empty() {
                container_budget_mib(&resources, gpumem).map(|mib| json!(mib.to_string()))
            } else {
                own("limits").or_else(|| own("requests")).cloned()
            };
            let budget = match budget {
                Some(own) => own,
                None => match per_unit.filter(|&mib| mib > 0) {
                    Some(mib) => json!(mib.saturating_mul(units).to_string()),
                    None => continue,
                },
            };
            let base = ["spec", list, index.as_str(), "resources"];
            for (name, key) in &others {
                self.remove(&[&base[..], &[name, key.as_str()]].concat());
            }
            for name in ["requests", "limits"] {
                let path = [&base[..], &[name, res]].concat();
                self.set(&path, budget.clone());
            }
        }
    }

    /// Everything [`plan_cpu_only`] promises.
    fn cpu_only(&mut self, cfg: &AdmissionConfig) {
        for (list, index) in self.container_slots() {
            self.strip_gpu_resources(cfg, list, &index);
            self.hide_devices(list, &index);
        }
        self.mark(None, None, None);
        self.remove_annotation(&cfg.terminate_at_annotation);
        self.remove_annotation(BOOKING_UNITS_ANNOTATION);
        self.select_model(cfg, None);
        let current = self.pod.pointer("/spec/priorityClassName");
        let current = current.and_then(Value::as_str);
        let ours = [&cfg.high_priority_class, &cfg.low_priority_class];
        if current.is_some() && ours.iter().any(|c| c.as_deref() == current) {
            self.clear_priority_class();
        }
    }

    fn strip_gpu_resources(&mut self, cfg: &AdmissionConfig, list: &'static str, index: &str) {
        for section in ["requests", "limits"] {
            let keys: Vec<String> = self
                .container(list, index)
                .and_then(|c| c.get("resources"))
                .and_then(|r| r.get(section))
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter(|k| {
                            cfg.gpu_resource_model(k).is_some()
                                || is_budget_resource(&cfg.gpumem_resource, k)
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for key in keys {
                self.remove(&["spec", list, index, "resources", section, &key]);
            }
        }
    }

    /// `NVIDIA_VISIBLE_DEVICES=none`: every entry of that name is replaced (a
    /// `valueFrom` goes with it); without one, an entry is appended, and `env` created.
    fn hide_devices(&mut self, list: &'static str, index: &str) {
        let entry = json!({"name": NVIDIA_VISIBLE_DEVICES, "value": "none"});
        let env = self.container(list, index).and_then(|c| c.get("env"));
        let Some(items) = env.and_then(Value::as_array) else {
            // Only a container object can get an `env`.
            if self.container(list, index).is_some_and(Value::is_object) {
                self.set(&["spec", list, index, "env"], json!([entry]));
            }
            return;
        };
        let hits: Vec<String> = items
            .iter()
            .enumerate()
            .filter(|(_, e)| e.get("name").and_then(Value::as_str) == Some(NVIDIA_VISIBLE_DEVICES))
            .map(|(i, _)| i.to_string())
            .collect();
        if hits.is_empty() {
            let path = PointerBuf::from_tokens(["spec", list, index, "env", "-"]);
            self.apply(add(path, entry));
        } else {
            for hit in hits {
                self.set(&["spec", list, index, "env", &hit], entry.clone());
            }
        }
    }
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// `value` wrapped in objects, one per token: `["a", "b"], v` -> `{"a": {"b": v}}`.
fn nest(tokens: &[&str], value: Value) -> Value {
    tokens.iter().rev().fold(value, |inner, token| {
        let mut map = Map::new();
        map.insert((*token).to_owned(), inner);
        Value::Object(map)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::StripReason;

    fn apply(pod: &Value, patch: &Patch) -> Value {
        let mut out = pod.clone();
        json_patch::patch(&mut out, &patch.0).expect("the patch applies");
        out
    }

    fn booked() -> Decision {
        Decision::Booked {
            booking_id: 17,
            model: ModelName::parse("a100").unwrap(),
            until: "2026-11-30T00:00:00Z".parse().unwrap(),
            gpumem_mib: Some(40960),
            preempt: false,
            booking_units: Some(2),
        }
    }

    #[test]
    fn bare_pod_gets_every_map_created() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]}});
        let patch = plan(&pod, &booked(), &AdmissionConfig::default());
        let out = apply(&pod, &patch);
        assert_eq!(
            out["metadata"]["annotations"]["terminate-at"],
            "2026-11-30T00:00:00Z"
        );
        assert_eq!(out["metadata"]["labels"]["gpu-booking.io/priority"], "high");
        assert_eq!(out["metadata"]["labels"]["gpu-booking.io/booking"], "17");
        assert_eq!(
            out["metadata"]["annotations"][BOOKING_UNITS_ANNOTATION], "2",
            "the controller reads the booking's units from the pod"
        );
        assert_eq!(out["spec"]["nodeSelector"]["gpu-booking.io/model"], "a100");
        assert_eq!(out["spec"]["priorityClassName"], "gpu-booking-high");
        // Its lent copy (demoted) and its CPU-only copy no longer claim the booking.
        let cfg = AdmissionConfig::default();
        for patch in [
            plan(
                &out,
                &Decision::LowPriority {
                    model: ModelName::parse("a100").unwrap(),
                    gpumem_mib: None,
                    beyond_booking: None,
                },
                &cfg,
            ),
            plan_cpu_only(&out, &cfg),
        ] {
            let copy = apply(&out, &patch);
            assert!(copy["metadata"]["annotations"]
                .get(BOOKING_UNITS_ANNOTATION)
                .is_none());
        }
        let res = &out["spec"]["containers"][0]["resources"];
        assert_eq!(res["requests"]["gpu-booking.io/gpumem"], "40960");
        assert_eq!(res["limits"]["gpu-booking.io/gpumem"], "40960");
        // Keys with '/' are escaped in the pointers.
        let text = serde_json::to_string(&patch).unwrap();
        assert!(
            text.contains("/metadata/labels/gpu-booking.io~1booking"),
            "{text}"
        );
    }

    /// A model with its own resource: the pod asks for it instead of the generic GPU
    /// (requests and limits, containers and init containers), with no node selector,
    /// so that a node with cards of several models takes it.
    #[test]
    fn a_model_with_its_own_resource_is_the_resource_not_the_node() {
        let mut cfg = AdmissionConfig::default();
        cfg.model_resources
            .insert("nvidia.com/a100".into(), ModelName::parse("a100").unwrap());
        let pod = json!({"metadata": {}, "spec": {
        "nodeSelector": {"gpu-booking.io/model": "t4", "zone": "x"},
        "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": 1}}}],
        "containers": [
            {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "1"},
                                         "limits": {"nvidia.com/gpu": "2"}}},
            {"name": "b"},
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/a100": "1"}}}
        ]}});
        let lent = Decision::LowPriority {
            model: ModelName::parse("a100").unwrap(),
            gpumem_mib: None,
            beyond_booking: None,
        };
        for decision in [booked(), lent] {
            let out = apply(&pod, &plan(&pod, &decision, &cfg));
            assert_eq!(
                out["spec"]["nodeSelector"],
                json!({"zone": "x"}),
                "no model selector, the creator's other selectors kept"
            );
            // The GPU resources only (the budget is another test's).
            let res = |list: &str, i: usize| {
                let mut r = out["spec"][list][i]["resources"].clone();
                for section in ["requests", "limits"] {
                    if let Some(map) = r.get_mut(section).and_then(Value::as_object_mut) {
                        map.retain(|k, _| !is_budget_resource("gpu-booking.io/gpumem", k));
                        if map.is_empty() {
                            r.as_object_mut().map(|o| o.remove(section));
                        }
                    }
                }
                r
            };
            assert_eq!(
                res("containers", 0),
                json!({"requests": {"nvidia.com/a100": "2", "cpu": "1"},
                       "limits": {"nvidia.com/a100": "2"}})
            );
            assert_eq!(
                res("initContainers", 0),
                json!({"requests": {"nvidia.com/a100": "1"}})
            );
            assert_eq!(res("containers", 1), Value::Null);
            assert_eq!(
                res("containers", 2),
                json!({"limits": {"nvidia.com/a100": "2"}}),
                "added to what it asked of the model's resource"
            );
            // Admitted again (a copy, a re-review): nothing more changes.
            assert_eq!(
                plan(&out, &decision, &cfg).0.len(),
                0,
                "the plan is not idempotent"
            );
        }
        // A model without a resource of its own keeps the node selector.
        let out = apply(&pod, &plan(&pod, &booked(), &AdmissionConfig::default()));
        assert_eq!(out["spec"]["nodeSelector"]["gpu-booking.io/model"], "a100");
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "2"
        );
    }

    #[test]
    fn a_stripped_or_taken_back_pod_says_what_it_wanted_and_a_creator_cannot() {
        let cfg = AdmissionConfig::default();
        let wanted = |out: &Value| {
            out["metadata"]["annotations"][GPU_WANTED_ANNOTATION]
                .as_str()
                .map(str::to_owned)
        };
        // A creator's own note goes; the webhook's says what the pod asked for.
        let pod = json!({"metadata": {"annotations": {GPU_WANTED_ANNOTATION: "1 h100"}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        let strip = |reason| Decision::Strip {
            reason,
            earliest_booking: None,
        };
        let out = apply(
            &pod,
            &plan(&pod, &strip(StripReason::NothingFree { model: None }), &cfg),
        );
        assert_eq!(wanted(&out).as_deref(), Some("2 any"));
        let out = apply(&pod, &plan(&pod, &strip(StripReason::NoIdentity), &cfg));
        assert_eq!(wanted(&out), None, "nobody's pod waits for nothing");
        let out = apply(&pod, &plan(&pod, &booked(), &cfg));
        assert_eq!(wanted(&out), None, "a pod with its GPU wants none");
        // On a pod without a GPU only the controller's copy keeps it.
        let cpu = json!({"metadata": {"annotations": {GPU_WANTED_ANNOTATION: "1 a100"}},
            "spec": {"containers": [{}]}});
        assert_eq!(
            wanted(&apply(&cpu, &plan_no_gpu(&cpu, &cfg, false).0)),
            None
        );
        assert!(wanted(&apply(&cpu, &plan_no_gpu(&cpu, &cfg, true).0)).is_some());
        // The controller's CPU-only copy of a lent pod wants its model back; a booked
        // pod's, at its booking's end, wants nothing.
        let lent = json!({"metadata": {"labels": {"gpu-booking.io/priority": "low"}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/a100": "1"}}}]}});
        let cfg_a100 = AdmissionConfig {
            model_resources: [(
                "nvidia.com/a100".to_owned(),
                ModelName::parse("a100").unwrap(),
            )]
            .into_iter()
            .collect(),
            ..AdmissionConfig::default()
        };
        let out = apply(
            &lent,
            &plan_cpu_only_because(&lent, &cfg_a100, "taken back"),
        );
        assert_eq!(wanted(&out).as_deref(), Some("1 a100"));
        let mut booked_pod = lent.clone();
        booked_pod["metadata"]["labels"]["gpu-booking.io/priority"] = json!("high");
        let out = apply(
            &booked_pod,
            &plan_cpu_only_because(&booked_pod, &cfg_a100, "ended"),
        );
        assert_eq!(wanted(&out), None);
    }

    #[test]
    fn priority_is_dropped_with_the_class() {
        let pod = json!({"metadata": {}, "spec": {"priority": 0, "preemptionPolicy": "PreemptLowerPriority",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let out = apply(&pod, &plan(&pod, &booked(), &AdmissionConfig::default()));
        assert!(out["spec"].get("priority").is_none());
        assert!(out["spec"].get("preemptionPolicy").is_none());
    }

    #[test]
    fn strip_replaces_the_device_variable_everywhere() {
        let pod = json!({"metadata": {"labels": {"gpu-booking.io/priority": "high"}}, "spec": {
        "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        "containers": [
            {"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
             "resources": {"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "1", "cpu": "1"}}},
            {"name": "b", "env": [{"name": "X", "value": "1"}]}
        ]}});
        let d = Decision::Strip {
            reason: StripReason::NothingFree { model: None },
            earliest_booking: None,
        };
        let out = apply(&pod, &plan(&pod, &d, &AdmissionConfig::default()));
        for c in ["initContainers", "containers"] {
            for container in out["spec"][c].as_array().unwrap() {
                let env = container["env"].as_array().unwrap();
                let hits: Vec<_> = env
                    .iter()
                    .filter(|e| e["name"] == NVIDIA_VISIBLE_DEVICES)
                    .collect();
                assert_eq!(
                    hits,
                    vec![&json!({"name": NVIDIA_VISIBLE_DEVICES, "value": "none"})]
                );
            }
        }
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"],
            json!({"cpu": "1"})
        );
        assert_eq!(
            out["spec"]["initContainers"][0]["resources"]["requests"],
            json!({})
        );
        assert!(out["metadata"]["labels"]
            .get("gpu-booking.io/priority")
            .is_none());
        assert!(out["metadata"]["annotations"][GPU_REMOVED_ANNOTATION].is_string());
    }

    #[test]
    fn unchecked_changes_nothing_and_strip_unmarks() {
        let pod = json!({"metadata": {"labels": {"gpu-booking.io/priority": "high"}},
            "spec": {"priorityClassName": "gpu-booking-high", "priority": 1000000,
                     "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let cfg = AdmissionConfig::default();
        let unchecked = Decision::Unchecked {
            message: "down".into(),
        };
        // Unchecked keeps the GPU but none of the marks the creator wrote: no label
        // of ours, and the low class instead of the high one.
        let out = apply(&pod, &plan(&pod, &unchecked, &cfg));
        assert!(out["metadata"]["labels"]
            .get("gpu-booking.io/priority")
            .is_none());
        assert_eq!(out["spec"]["priorityClassName"], "gpu-booking-low");
        assert!(out["spec"].get("priority").is_none());
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1"
        );
        // A pod without identity that is stripped cannot keep a priority it wrote.
        let strip = Decision::Strip {
            reason: crate::admission::StripReason::NoIdentity,
            earliest_booking: None,
        };
        let out = apply(&pod, &plan(&pod, &strip, &cfg));
        assert!(out["metadata"]["labels"]
            .get("gpu-booking.io/priority")
            .is_none());
        assert!(out["spec"].get("priorityClassName").is_none());
        assert!(out["spec"].get("priority").is_none());
    }

    /// A pod whose creator wrote every mark of ours, under both the current
    /// keys and the legacy ones (`gpu-booking/`), which are stripped alike.
    fn forged() -> Value {
        json!({"metadata": {"name": "p",
            "labels": {"gpu-booking/priority": "high", "gpu-booking/booking": "99",
                "gpu-booking/model": "a100", "gpu-booking/other": "x",
                "gpu-booking.io/priority": "high", "gpu-booking.io/booking": "98",
                "gpu-booking.io/model": "a100", "gpu-booking.io/other": "y", "app": "keep"},
            "annotations": {"terminate-at": "2030-01-01T00:00:00Z",
                "gpu-booking.io/last-gpu-activity": "2030-01-01T00:00:00Z",
                "gpu-booking.io/gpu-removed": "no", "note": "keep"}},
            "spec": {"priorityClassName": "gpu-booking-high", "priority": 1000000,
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    }

    fn ours_left(out: &Value) -> Vec<String> {
        let cfg = AdmissionConfig::default();
        ["labels", "annotations"]
            .iter()
            .flat_map(|m| out["metadata"][m].as_object().cloned().unwrap_or_default())
            .map(|(k, v)| format!("{k}={v}"))
            .filter(|kv| is_our_key(kv.split('=').next().unwrap(), &cfg))
            .collect()
    }

    #[test]
    fn forged_marks_go_on_every_path() {
        let cfg = AdmissionConfig::default();
        let pod = forged();
        let low = Decision::LowPriority {
            model: ModelName::parse("a6000").unwrap(),
            gpumem_mib: None,
            beyond_booking: None,
        };
        let strip = Decision::Strip {
            reason: StripReason::NoIdentity,
            earliest_booking: None,
        };
        let unchecked = Decision::Unchecked {
            message: "down".into(),
        };
        // Booked: only what the booking says.
        let out = apply(&pod, &plan(&pod, &booked(), &cfg));
        let mut left = ours_left(&out);
        left.sort();
        assert_eq!(
            left,
            [
                "gpu-booking.io/booking-units=\"2\"".to_owned(),
                "gpu-booking.io/booking=\"17\"".to_owned(),
                "gpu-booking.io/gpu-removed=\"no\"".to_owned(),
                "gpu-booking.io/model=\"a100\"".to_owned(),
                "gpu-booking.io/priority=\"high\"".to_owned(),
                "terminate-at=\"2026-11-30T00:00:00Z\"".to_owned(),
            ]
            .iter()
            .filter(|k| !k.starts_with("gpu-booking.io/gpu-removed"))
            .cloned()
            .collect::<Vec<_>>()
        );
        // Lent: low and the model, nothing else of ours.
        let out = apply(&pod, &plan(&pod, &low, &cfg));
        let mut left = ours_left(&out);
        left.sort();
        assert_eq!(
            left,
            vec![
                "gpu-booking.io/model=\"a6000\"".to_owned(),
                "gpu-booking.io/priority=\"low\"".to_owned()
            ]
        );
        assert_eq!(out["spec"]["priorityClassName"], "gpu-booking-low");
        // Stripped, unchecked, no GPU at all: none of the creator's marks.
        for out in [
            apply(&pod, &plan(&pod, &strip, &cfg)),
            apply(&pod, &plan(&pod, &unchecked, &cfg)),
            apply(&pod, &plan_no_gpu(&pod, &cfg, true).0),
        ] {
            let left: Vec<_> = ours_left(&out)
                .into_iter()
                .filter(|k| !k.starts_with(GPU_REMOVED_ANNOTATION))
                .collect();
            assert!(left.is_empty(), "{left:?}");
            assert_ne!(out["spec"]["priorityClassName"], "gpu-booking-high");
            assert!(out["spec"].get("priority").is_none());
            assert_eq!(out["metadata"]["labels"]["app"], "keep");
            assert_eq!(out["metadata"]["annotations"]["note"], "keep");
        }
        // A pod without marks of ours gets no patch on the no-GPU path.
        let clean = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"priorityClassName": "gpu-booking-low"}});
        assert!(plan_no_gpu(&clean, &cfg, false).0.is_empty());
        // The note of a removed GPU stays on the controller's copies only.
        let note = |by_controller| {
            apply(&pod, &plan_no_gpu(&pod, &cfg, by_controller).0)["metadata"]["annotations"]
                .get(GPU_REMOVED_ANNOTATION)
                .cloned()
        };
        assert!(note(true).is_some());
        assert_eq!(note(false), None, "anyone else's note is dropped");
    }

    #[test]
    fn a_pod_without_a_gpu_gets_no_devices_through_the_runtime() {
        let cfg = AdmissionConfig::default();
        let env = |value: Value| json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]);
        let pod = json!({"spec": {
        "initContainers": [{"name": "fetch", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "which"}}}]}],
        "containers": [
            {"name": "all", "env": env(json!("all"))},
            {"name": "one", "env": [{"name": "A", "value": "b"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]},
            {"name": "none", "env": env(json!("none"))},
            {"name": "void", "env": env(json!("void"))},
            {"name": "plain"},
        ]}});
        let (patch, hidden) = plan_no_gpu(&pod, &cfg, false);
        assert!(hidden);
        let out = apply(&pod, &patch);
        let visible = |list: &str, i: usize| -> Vec<Value> {
            out["spec"][list][i]["env"]
                .as_array()
                .map(|e| {
                    e.iter()
                        .filter(|e| e["name"] == NVIDIA_VISIBLE_DEVICES)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        };
        let none = json!({"name": NVIDIA_VISIBLE_DEVICES, "value": "none"});
        assert_eq!(
            visible("initContainers", 0),
            std::slice::from_ref(&none),
            "a valueFrom is replaced"
        );
        assert_eq!(visible("containers", 0), std::slice::from_ref(&none));
        assert_eq!(visible("containers", 1), std::slice::from_ref(&none));
        assert_eq!(
            out["spec"]["containers"][1]["env"][0],
            json!({"name": "A", "value": "b"})
        );
        assert_eq!(
            visible("containers", 3),
            [json!({"name": NVIDIA_VISIBLE_DEVICES, "value": "void"})]
        );
        assert!(
            out["spec"]["containers"][4].get("env").is_none(),
            "nothing added where nothing was set"
        );
        // Nothing to hide, or the admin allows it: no change.
        let harmless = json!({"spec": {"containers": [{"name": "a", "env": env(json!("none"))}]}});
        assert_eq!(
            plan_no_gpu(&harmless, &cfg, false),
            (Patch(Vec::new()), false)
        );
        let allow = AdmissionConfig {
            visible_devices_without_gpu: VisibleDevicesWithoutGpu::Allow,
            ..AdmissionConfig::default()
        };
        assert_eq!(plan_no_gpu(&pod, &allow, false), (Patch(Vec::new()), false));
    }

    #[test]
    fn own_budget_is_kept_and_made_equal() {
        let pod = json!({"spec": {"containers": [{"resources": {
            "limits": {"nvidia.com/gpu": "2", "gpu-booking.io/gpumem": "1000"}}}]}});
        let out = apply(&pod, &plan(&pod, &booked(), &AdmissionConfig::default()));
        let res = &out["spec"]["containers"][0]["resources"];
        assert_eq!(res["requests"]["gpu-booking.io/gpumem"], "1000");
        assert_eq!(res["limits"]["gpu-booking.io/gpumem"], "1000");
        let pod =
            json!({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        let out = apply(&pod, &plan(&pod, &booked(), &AdmissionConfig::default()));
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["requests"]["gpu-booking.io/gpumem"],
            "81920"
        );
    }

    #[test]
    fn null_and_odd_maps_are_replaced() {
        let pod = json!({"metadata": {"annotations": null, "labels": []},
            "spec": {"nodeSelector": null, "containers": [null, {"env": null, "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
        for d in [
            booked(),
            Decision::Strip {
                reason: StripReason::SeveralModels,
                earliest_booking: None,
            },
        ] {
            let out = apply(&pod, &plan(&pod, &d, &AdmissionConfig::default()));
            assert!(out["metadata"]["annotations"].is_object());
        }
        // Not a pod at all: nothing to do, nothing that fails.
        assert!(plan(&json!([1, 2]), &booked(), &AdmissionConfig::default())
            .0
            .is_empty());
    }

    #[test]
    fn node_resource_is_added_replaced_removed_and_left_alone() {
        let res = "gpu-booking.io/gpumem";
        let node = json!({"status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}});
        let p = plan_node_resource(&node, res, Some(40448));
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!([
                {"op": "add", "path": "/status/capacity/gpu-booking.io~1gpumem", "value": "40448"},
                {"op": "add", "path": "/status/allocatable/gpu-booking.io~1gpumem", "value": "40448"}
            ])
        );
        let mut out = node.clone();
        json_patch::patch(&mut out, &p).unwrap();
        assert!(
            plan_node_resource(&out, res, Some(40448)).0.is_empty(),
            "already right"
        );
        let p = plan_node_resource(&out, res, Some(1000));
        json_patch::patch(&mut out, &p).unwrap();
        assert_eq!(out["status"]["allocatable"][res], "1000");
        let p = plan_node_resource(&out, res, None);
        json_patch::patch(&mut out, &p).unwrap();
        assert_eq!(out, node);
        assert!(plan_node_resource(&node, res, None).0.is_empty());
        // A status without the maps: they are created.
        let mut bare = json!({"metadata": {"name": "n"}});
        let p = plan_node_resource(&bare, res, Some(7));
        json_patch::patch(&mut bare, &p).unwrap();
        assert_eq!(bare["status"]["capacity"][res], "7");
    }

    /// A pod moved to its model's own resource gets its budget under the model's
    /// budget resource, never the plain one: on a node with cards of several models,
    /// kube-scheduler then charges it against that model's cards only.
    #[test]
    fn a_model_with_its_own_resource_gets_its_own_budget_resource() {
        let mut cfg = AdmissionConfig::default();
        cfg.model_resources
            .insert("nvidia.com/t4".into(), ModelName::parse("t4").unwrap());
        let t4 = Decision::LowPriority {
            model: ModelName::parse("t4").unwrap(),
            gpumem_mib: Some(6000),
            beyond_booking: None,
        };
        let pod = json!({"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            // Its creator's budget under the plain resource: moved, not left there.
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "1000"}}},
            // Under the model's and the plain one: added up.
            {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "1000",
                                                      "gpu-booking.io/gpumem-t4": "500"}}},
            // No GPU: nothing written.
            {"name": "d"}
        ]}});
        let out = apply(&pod, &plan(&pod, &t4, &cfg));
        let res = |i: usize| out["spec"]["containers"][i]["resources"].clone();
        assert_eq!(
            res(0),
            json!({"limits": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": "6000"},
                   "requests": {"gpu-booking.io/gpumem-t4": "6000"}})
        );
        assert_eq!(
            res(1),
            json!({"limits": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": "1000"},
                   "requests": {"gpu-booking.io/gpumem-t4": "1000"}})
        );
        assert_eq!(
            res(2),
            json!({"requests": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": "1500"},
                   "limits": {"gpu-booking.io/gpumem-t4": "1500"}})
        );
        assert_eq!(res(3), Value::Null);
        assert!(plan(&out, &t4, &cfg).0.is_empty(), "not idempotent");
        // A model without a resource of its own: the plain resource, a budget its
        // creator wrote under a model's moved there.
        let pod = json!({"spec": {"containers": [{"resources": {"limits": {
            "nvidia.com/gpu": "1", "gpu-booking.io/gpumem-t4": "700"}}}]}});
        let out = apply(&pod, &plan(&pod, &booked(), &cfg));
        assert_eq!(
            out["spec"]["containers"][0]["resources"],
            json!({"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "700"},
                   "requests": {"gpu-booking.io/gpumem": "700"}})
        );
    }

    #[test]
    fn stripping_the_gpu_strips_every_budget_resource() {
        let mut cfg = AdmissionConfig::default();
        cfg.model_resources
            .insert("nvidia.com/t4".into(), ModelName::parse("t4").unwrap());
        let pod = json!({"spec": {"containers": [{"resources": {
            "limits": {"nvidia.com/t4": "1", "gpu-booking.io/gpumem-t4": "6000", "cpu": "1"},
            "requests": {"gpu-booking.io/gpumem": "1", "gpu-booking.io/gpumem-Odd": "2"}}}]}});
        let out = apply(&pod, &plan_cpu_only(&pod, &cfg));
        assert_eq!(
            out["spec"]["containers"][0]["resources"],
            json!({"limits": {"cpu": "1"}, "requests": {}})
        );
    }

    #[test]
    fn node_budgets_per_model_are_set_and_stale_ones_removed() {
        let gpumem = "gpu-booking.io/gpumem";
        let node = json!({"status": {
            "capacity": {"cpu": "8", "gpu-booking.io/gpumem": "95744", "gpu-booking.io/gpumem-l4": "1"},
            "allocatable": {"cpu": "8", "gpu-booking.io/gpumem": "95744"}}});
        let want: BTreeMap<String, u64> = [
            ("gpu-booking.io/gpumem".to_owned(), 80896),
            ("gpu-booking.io/gpumem-t4".to_owned(), 14848),
        ]
        .into_iter()
        .collect();
        let mut out = node.clone();
        json_patch::patch(&mut out, &plan_node_budgets(&node, gpumem, &want)).unwrap();
        for field in ["capacity", "allocatable"] {
            assert_eq!(
                out["status"][field],
                json!({"cpu": "8", "gpu-booking.io/gpumem": "80896",
                       "gpu-booking.io/gpumem-t4": "14848"}),
                "{field}"
            );
        }
        assert!(plan_node_budgets(&out, gpumem, &want).0.is_empty());
        // A node of one model again: the model's budget goes.
        let p = plan_node_resource(&out, gpumem, Some(40448));
        json_patch::patch(&mut out, &p).unwrap();
        assert_eq!(
            out["status"]["allocatable"],
            json!({"cpu": "8", "gpu-booking.io/gpumem": "40448"})
        );
        // The uninstall's cleanup: none at all.
        let p = plan_node_resource(&out, gpumem, None);
        json_patch::patch(&mut out, &p).unwrap();
        assert_eq!(out["status"]["capacity"], json!({"cpu": "8"}));
    }
}
