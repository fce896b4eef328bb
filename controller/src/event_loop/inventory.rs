//! The loop's inventory part: the models, the nodes and their labels as the watch
//! shows them, and what is pushed from them: usage per model and the units held per
//! booking to the booking service, the model label and the VRAM budget to each node.
//! The counting itself is [`crate::inventory`]'s (and core's).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_booking_client::{ClientError, HeldReport, Model};
use gpu_booking_core::booking_units::BookedPod;
use gpu_booking_core::inventory::MODEL_PRESENT_LABEL_PREFIX;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Msg;
use crate::actions::Ctx;
use crate::booking_units;
use crate::config::ControllerArgs;
use crate::inventory::{self, Models, NodeInfo, Usage};
use crate::metrics::ModelLabel;
use crate::node_capacity;
use crate::pods::PodInfo;

/// Every model's usage is reported at least this often (in sync ticks), even when
/// nothing changed: the webhook's lend ledger releases what it admitted once a
/// report taken after the admission (plus its settle time) arrives.
const REPORT_AT_LEAST_EVERY: u32 = 5;
/// Before a node label that could not be written is tried again.
const LABEL_RETRY: Duration = Duration::from_secs(10);
/// Before the models are asked for again when none could be read.
const MODELS_RETRY: Duration = Duration::from_secs(5);

pub(super) struct Inventory {
    ctx: Arc<Ctx>,
    args: ControllerArgs,
    tx: mpsc::UnboundedSender<Msg>,
    models: Option<Models>,
    nodes: BTreeMap<String, NodeInfo>,
    /// Every node's labels (a booked pod's node selector is matched against them).
    node_labels: HashMap<String, BTreeMap<String, String>>,
    reported: BTreeMap<String, Usage>,
    reporting: bool,
    /// The units held per booking as last reported (`None`: not since elected).
    held_reported: Option<HeldReport>,
    held_reporting: bool,
    labelling: HashMap<String, Instant>,
    /// Nodes whose VRAM budget is being written, or failed to be, and since when.
    advertising: HashMap<String, (Instant, bool)>,
    /// Nodes with cards of several models, already reported by an Event.
    several_models: HashSet<String>,
    /// Sync ticks since every model was last reported.
    ticks_since_full_report: u32,
    usage_dirty: bool,
    /// The node watch has listed every node.
    nodes_synced: bool,
}

impl Inventory {
    pub(super) fn new(ctx: Arc<Ctx>, args: ControllerArgs, tx: mpsc::UnboundedSender<Msg>) -> Self {
        Self {
            ctx,
            args,
            tx,
            models: None,
            nodes: BTreeMap::new(),
            node_labels: HashMap::new(),
            reported: BTreeMap::new(),
            reporting: false,
            held_reported: None,
            held_reporting: false,
            labelling: HashMap::new(),
            advertising: HashMap::new(),
            several_models: HashSet::new(),
            ticks_since_full_report: 0,
            usage_dirty: true,
            nodes_synced: false,
        }
    }

    pub(super) fn models(&self) -> Option<&Models> {
        self.models.as_ref()
    }

    pub(super) fn nodes(&self) -> &BTreeMap<String, NodeInfo> {
        &self.nodes
    }

    pub(super) fn node_labels(&self) -> &HashMap<String, BTreeMap<String, String>> {
        &self.node_labels
    }

    pub(super) fn nodes_synced(&self) -> bool {
        self.nodes_synced
    }

    fn leader(&self) -> bool {
        self.ctx.leadership.is_leader()
    }

    /// Elected: everything is reported again.
    pub(super) fn on_elected(&mut self) {
        self.reported.clear();
        self.held_reported = None;
        self.usage_dirty = true;
    }

    /// A pod changed or came: the usage is reported again if what it holds moved.
    pub(super) fn pod_changed(&mut self, old: Option<&PodInfo>, new: &PodInfo) {
        self.usage_dirty |= old.is_none_or(|old| {
            old.holds_gpu() != new.holds_gpu()
                || inventory::counts_in_use(old) != inventory::counts_in_use(new)
                || old.node != new.node
                || old.gpu != new.gpu
        });
    }

    /// A pod went: the usage is reported again if it held a GPU.
    pub(super) fn pod_gone(&mut self, old: &PodInfo) {
        self.usage_dirty |= inventory::counts_in_use(old);
    }

    // ---- models -------------------------------------------------------------------

    pub(super) fn fetch_models(&self) {
        let (booking, tx) = (self.ctx.booking.clone(), self.tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(Msg::Models(booking.models().await));
        });
    }

    /// The models could not be read: without any there is no inventory, so they are
    /// asked for again soon.
    pub(super) fn models_failed(&self, e: &ClientError) {
        self.ctx.metrics.error("booking");
        tracing::warn!(error = %e, "could not read the models");
        if self.models.is_none() {
            let (booking, tx) = (self.ctx.booking.clone(), self.tx.clone());
            tokio::spawn(async move {
                tokio::time::sleep(MODELS_RETRY).await;
                let _ = tx.send(Msg::Models(booking.models().await));
            });
        }
    }

    /// Keeps the models the booking service listed; `None` when the inventory
    /// options are invalid (checked at start-up, so never).
    pub(super) fn set_models(&mut self, models: &[Model]) -> Option<&Models> {
        let opts = match self.args.inventory_options() {
            Ok(opts) => opts,
            Err(e) => {
                // Checked at start-up; kept as an error path rather than a panic.
                tracing::error!(error = %e, "invalid inventory options");
                return None;
            }
        };
        let models = Models::from_api(models, &self.ctx.cfg.current().gpu_resources, &opts);
        let changed = self.models.as_ref().is_none_or(|m| {
            !m.same_inventory(&models)
                || m.resources != models.resources
                || m.declared != models.declared
        });
        if changed {
            tracing::info!(models = ?models.names, "models loaded");
        }
        self.usage_dirty |= changed;
        self.models = Some(models);
        self.models.as_ref()
    }

    // ---- nodes --------------------------------------------------------------------

    /// A node watch event; true when the node watch has just listed every node.
    pub(super) fn on_node_event(&mut self, event: Event<Node>) -> bool {
        match event {
            Event::Init => {
                self.nodes.clear();
                self.node_labels.clear();
            }
            Event::InitApply(node) | Event::Apply(node) => {
                if let Some(name) = node.metadata.name.clone() {
                    let labels = node.metadata.labels.clone().unwrap_or_default();
                    self.node_labels.insert(name, labels);
                }
                if let Some(info) = NodeInfo::from_node(
                    &node,
                    &self.args.product_label,
                    &self.args.admission.model_node_label,
                    &self.ctx.cfg.current().gpumem_resource,
                ) {
                    if self.nodes.get(&info.name) != Some(&info) {
                        let status_changed = self
                            .nodes
                            .get(&info.name)
                            .is_none_or(|old| old.gpumem_status != info.gpumem_status);
                        if status_changed
                            && self
                                .advertising
                                .get(&info.name)
                                .is_some_and(|(_, busy)| !busy)
                        {
                            self.advertising.remove(&info.name);
                        }
                        self.usage_dirty = true;
                        self.nodes.insert(info.name.clone(), info);
                    }
                }
            }
            Event::Delete(node) => {
                if let Some(name) = node.metadata.name.as_deref() {
                    self.nodes.remove(name);
                    self.advertising.remove(name);
                    self.several_models.remove(name);
                    self.node_labels.remove(name);
                    self.usage_dirty = true;
                }
            }
            Event::InitDone => {
                self.nodes_synced = true;
                self.usage_dirty = true;
                return true;
            }
        }
        false
    }

    // ---- usage --------------------------------------------------------------------

    /// A sync tick: every [`REPORT_AT_LEAST_EVERY`] ticks all models count as changed.
    pub(super) fn tick(&mut self) {
        self.ticks_since_full_report += 1;
        if self.ticks_since_full_report >= REPORT_AT_LEAST_EVERY && !self.reporting {
            self.ticks_since_full_report = 0;
            self.reported.clear();
            self.usage_dirty = true;
        }
    }

    fn usage(&self, pods: &HashMap<String, PodInfo>) -> Option<BTreeMap<String, Usage>> {
        let models = self.models.as_ref()?;
        Some(inventory::usage(
            self.nodes.values(),
            pods.values(),
            models,
            &self.ctx.policy,
        ))
    }

    /// Units of each declared model not in use now (declared less in use, as the
    /// booking service counts them free): what can be offered back.
    pub(super) fn free_units(
        &self,
        pods: &HashMap<String, PodInfo>,
    ) -> Option<BTreeMap<String, u64>> {
        let models = self.models.as_ref()?;
        let usage = self.usage(pods)?;
        Some(
            models
                .declared
                .iter()
                .map(|(model, &units)| {
                    let in_use = usage.get(model).map_or(0, |u| u.counted.in_use);
                    let units = u64::try_from(units).unwrap_or(0);
                    (model.clone(), units.saturating_sub(in_use))
                })
                .collect(),
        )
    }

    /// The inventory gauges, from this replica's own view (followers' too).
    fn publish_inventory(&self, usage: &BTreeMap<String, Usage>) {
        let Some(models) = &self.models else {
            return;
        };
        let g = &self.ctx.metrics.inventory;
        for family in [&g.cards, &g.units, &g.in_use, &g.others_in_use, &g.mismatch] {
            family.clear();
        }
        for (model, u) in usage {
            let label = ModelLabel {
                model: model.clone(),
            };
            let declared = models.declared.get(model).copied();
            let u = &u.counted;
            g.cards.get_or_create(&label).set(u.cards as i64);
            g.in_use.get_or_create(&label).set(u.in_use as i64);
            g.others_in_use
                .get_or_create(&label)
                .set(u.others_in_use as i64);
            if let Some(units) = declared {
                g.units.get_or_create(&label).set(i64::from(units));
                let cards = i64::try_from(u.cards).unwrap_or(i64::MAX);
                let mismatch =
                    gpu_booking_core::inventory::units_mismatch(i64::from(units), Some(cards));
                g.mismatch.get_or_create(&label).set(i64::from(mismatch));
            }
        }
        let (mut gpu_nodes, mut blind, mut several) = (0, 0, 0);
        for node in self.nodes.values() {
            let inv = inventory::node_gpus(node, models);
            if inv.groups.is_empty() {
                continue;
            }
            gpu_nodes += 1;
            let memory_known = inv.groups.iter().all(|g| g.memory_mib.is_some());
            if !memory_known || !node.has_gpu_telemetry(&self.args.product_label) {
                blind += 1;
            }
            // Several models that only a label could tell apart (those with a
            // resource of their own need none).
            if inv.model_label(&models.inventory).is_err() {
                several += 1;
            }
        }
        g.gpu_nodes.set(gpu_nodes);
        g.gpu_nodes_without_telemetry.set(blind);
        g.nodes_with_several_models.set(several);
    }

    /// Pushes the models whose units or use changed since the last report.
    pub(super) fn report_usage(&mut self, pods: &HashMap<String, PodInfo>, pods_synced: bool) {
        if !self.usage_dirty || self.reporting || !pods_synced || !self.nodes_synced {
            return;
        }
        // The round's start is the time of the view counted: the loop applies every
        // watch event it has taken before it counts, and takes none while it does. (The
        // last applied event's time would be no truer: an event says nothing of the
        // pods stored after it; and with nothing happening, it would hold every later
        // admission in the webhook's ledger until its time to live.) What the watch
        // has not yet brought is the ledger's settle time's.
        let counted_at = self.ctx.clock.now();
        let Some(usage) = self.usage(pods) else {
            return;
        };
        self.usage_dirty = false;
        self.publish_inventory(&usage);
        if !self.leader() {
            // Elected later, it reports everything (`on_elected`).
            return;
        }
        // Only declared models are reported: the service knows no other (cards of a
        // fallback model nobody declared show in the metrics instead).
        let declared = self.models.as_ref().map(|m| &m.declared);
        let changed: BTreeMap<String, Usage> = usage
            .into_iter()
            .filter(|(model, _)| declared.is_some_and(|d| d.contains_key(model)))
            .filter(|(model, u)| self.reported.get(model) != Some(u))
            .collect();
        if changed.is_empty() {
            return;
        }
        if self.ctx.dry_run {
            for (model, u) in &changed {
                tracing::info!(
                    model,
                    cards = u.counted.cards,
                    in_use = u.counted.in_use,
                    others_in_use = u.counted.others_in_use,
                    gpumem_advertised = u.counted.gpumem_advertised,
                    "dry run: would report usage"
                );
                self.ctx.metrics.action("report_usage", "dry_run");
            }
            self.reported.extend(changed);
            return;
        }
        self.reporting = true;
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        tokio::spawn(async move {
            let mut done = BTreeMap::new();
            let mut ok = true;
            for (model, u) in changed {
                let report = u.report(counted_at);
                match ctx.booking.put_usage(&model, &report).await {
                    Ok(()) => {
                        ctx.metrics.action("report_usage", "done");
                        done.insert(model, u);
                    }
                    Err(e) => {
                        ok = false;
                        ctx.metrics.action("report_usage", "error");
                        ctx.metrics.error("booking");
                        tracing::warn!(model, error = %e, "could not report usage");
                    }
                }
            }
            let _ = tx.send(Msg::Reported(done, ok));
        });
    }

    /// A usage report ended: what it wrote, and whether all of it was.
    pub(super) fn reported(&mut self, done: BTreeMap<String, Usage>, ok: bool) {
        self.reporting = false;
        self.reported.extend(done);
        self.usage_dirty |= !ok;
    }

    /// Reports the units each booking's pods hold (the webhook decides new pods from
    /// it) and every user's notebooks (their page shows them), on every change; the
    /// activity only when it moved by a step (the usage report's resolution), not on
    /// each of the agent's annotation writes.
    pub(super) fn report_held(
        &mut self,
        booked: &[BookedPod<String>],
        pods: &HashMap<String, PodInfo>,
        waiting: BTreeMap<i64, String>,
    ) {
        let held = HeldReport {
            bookings: gpu_booking_core::booking_units::held_by_booking(booked)
                .into_iter()
                .map(|(id, units)| (id, gpu_booking_core::wire::reported(units)))
                .collect(),
            active: booking_units::last_active_by_booking(pods),
            waiting,
            notebooks: crate::notebooks::of(pods),
        };
        let news = match &self.held_reported {
            None => true,
            Some(was) => {
                was.bookings != held.bookings
                    || was.waiting != held.waiting
                    || gpu_booking_core::usage::activity_moved(&was.active, &held.active)
                    || gpu_booking_core::notebooks::notebooks_moved(&was.notebooks, &held.notebooks)
            }
        };
        if self.held_reporting || !news {
            return;
        }
        if self.ctx.dry_run {
            tracing::info!(
                bookings = held.bookings.len(),
                "dry run: would report the units held"
            );
            self.held_reported = Some(held);
            return;
        }
        self.held_reporting = true;
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        tokio::spawn(async move {
            let ok = match ctx.booking.put_held(&held).await {
                Ok(()) => {
                    ctx.metrics.action("report_held", "done");
                    true
                }
                Err(e) => {
                    ctx.metrics.action("report_held", "error");
                    ctx.metrics.error("booking");
                    tracing::warn!(error = %e, "could not report the units held per booking");
                    false
                }
            };
            let _ = tx.send(Msg::HeldReported(held, ok));
        });
    }

    /// A report of the units held ended (`ok`: written).
    pub(super) fn held_reported(&mut self, held: HeldReport, ok: bool) {
        self.held_reporting = false;
        if ok {
            self.held_reported = Some(held);
        }
    }

    // ---- node labels and capacity ---------------------------------------------------

    /// Labels each GPU node with its model (and removes a label that no longer fits).
    pub(super) fn label_nodes(&mut self) {
        let Some(models) = &self.models else {
            return;
        };
        if !self.leader() || !self.nodes_synced {
            return;
        }
        let now = Instant::now();
        let mut work = Vec::new();
        let mut refused = Vec::new();
        for node in self.nodes.values() {
            let inv = inventory::node_gpus(node, models);
            let want = match inv.model_label(&models.inventory) {
                Ok(model) => model.map(|m| m.as_str().to_owned()),
                Err(several) => {
                    if !self.several_models.contains(&node.name) {
                        let names: Vec<&str> = several.iter().map(|m| m.as_str()).collect();
                        refused.push((node.name.clone(), names.join(", ")));
                    }
                    None
                }
            };
            let present: BTreeSet<String> =
                inv.models().iter().map(|m| m.as_str().to_owned()).collect();
            if want == node.model_label && present == node.models_present {
                continue;
            }
            if self
                .labelling
                .get(&node.name)
                .is_some_and(|at| now < *at + LABEL_RETRY)
            {
                continue;
            }
            // Presence labels to add ("true") and to remove (null, a merge patch's
            // deletion).
            let mut labels = serde_json::Map::new();
            labels.insert(self.args.admission.model_node_label.clone(), json!(want));
            for model in present.symmetric_difference(&node.models_present) {
                let value = present.contains(model).then_some("true");
                labels.insert(format!("{MODEL_PRESENT_LABEL_PREFIX}{model}"), json!(value));
            }
            work.push((node.name.clone(), want, labels));
        }
        for (name, several) in refused {
            self.several_models.insert(name.clone());
            let note = format!(
                "cards of several models ({several}) reached through the generic GPU \
                 resource on one node: one model label cannot select them all, so the \
                 node carries none and booked pods of these models are not placed here \
                 (give each model its own resource); their cards still count"
            );
            tracing::warn!(node = %name, models = %several, "node with several GPU models left unlabelled");
            if self.ctx.dry_run {
                continue;
            }
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                node_capacity::warn_node(&ctx, &name, "SeveralGpuModels", &note).await;
            });
        }
        for (name, want, labels) in work {
            self.labelling.insert(name.clone(), now);
            if self.ctx.dry_run {
                tracing::info!(node = %name, model = ?want, "dry run: would label node");
                self.ctx.metrics.action("label_node", "dry_run");
                continue;
            }
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            tokio::spawn(async move {
                let api: Api<Node> = Api::all(ctx.client.clone());
                let patch = json!({"metadata": {"labels": labels}});
                if !ctx.leadership.is_leader() {
                    return;
                }
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(node = %name, model = ?want, "node labelled");
                        ctx.metrics.action("label_node", "done");
                    }
                    Err(e) => {
                        ctx.metrics.action("label_node", "error");
                        ctx.metrics.error("kubernetes");
                        tracing::warn!(node = %name, error = %e, "could not label the node");
                    }
                }
                let _ = tx.send(Msg::Labelled);
            });
        }
    }

    /// Makes each node advertise the VRAM budget its GPUs hold (and no more, and none
    /// when it has none); nodes that say so already are left alone.
    pub(super) fn advertise_gpumem(&mut self) {
        let Some(models) = &self.models else {
            return;
        };
        if !self.args.advertise_gpumem || !self.leader() || !self.nodes_synced {
            return;
        }
        let now = Instant::now();
        let resource = self.ctx.cfg.current().gpumem_resource.clone();
        let mut work = Vec::new();
        for node in self.nodes.values() {
            let busy = self
                .advertising
                .get(&node.name)
                .is_some_and(|(at, in_flight)| *in_flight || now < *at + LABEL_RETRY);
            if busy {
                continue;
            }
            let patch = node_capacity::plan(node, models, &resource);
            if !patch.0.is_empty() {
                work.push((node.name.clone(), patch));
            }
        }
        for (name, patch) in work {
            if self.ctx.dry_run {
                let what = serde_json::to_string(&patch).unwrap_or_default();
                tracing::info!(node = %name, patch = %what, "dry run: would advertise the VRAM budget");
                self.ctx.metrics.action("advertise_gpumem", "dry_run");
                self.advertising.insert(name, (now, false));
                continue;
            }
            self.advertising.insert(name.clone(), (now, true));
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            tokio::spawn(async move {
                let written = node_capacity::apply(&ctx, &name, patch).await;
                let _ = tx.send(Msg::Advertised(name, written));
            });
        }
    }

    /// A node's status patch ended. Written or not, it is looked at again after
    /// [`LABEL_RETRY`], or as soon as the watch shows the node's status changed
    /// (`on_node_event`): the watch, not the answer, says what the node advertises.
    pub(super) fn advertised(&mut self, node: &str) {
        if let Some(entry) = self.advertising.get_mut(node) {
            *entry = (Instant::now(), false);
        }
    }
}
