//! The controller's loop: one task owns the state (pods, nodes, models, timers) and
//! reacts to watch events, timers and finished work. Anything that waits on the
//! network (actions, usage reports, node labels, models) runs
//! on its own task and reports back by message, so a slow booking service never
//! delays an expiry timer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpu_booking_client::{ClientError, HeldReport, Model, UsageReport};
use gpu_booking_core::admission::{pending_lent, AdmissionConfig, PendingLent};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::time::{delay_queue, DelayQueue};

use crate::actions::{self, Ctx, Job, Outcome, Reason};
use crate::booking_units;
use crate::clock::until;
use crate::config::ControllerArgs;
use crate::follow;
use crate::inventory::{self, Models, NodeInfo, Usage};
use crate::metrics::ModelLabel;
use crate::node_capacity;
use crate::pods::{PodInfo, PodLite, Priority, PREEMPTION_ROUNDS_ANNOTATION};
use crate::victims::{self, Round, View};

/// How often usage is pushed and node labels are checked (changes are batched).
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// Every model's usage is reported at least this often, even when nothing changed:
/// the webhook's lend ledger releases what it admitted once a report taken after
/// the admission (plus its settle time) arrives.
const REPORT_AT_LEAST_EVERY: u32 = 5;
/// Before an action that failed is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Before a node label that could not be written is tried again.
const LABEL_RETRY: Duration = Duration::from_secs(10);
/// How often the leader looks for recorded actions left unfinished (besides when it
/// is elected and when it starts).
const INTENT_SWEEP: Duration = Duration::from_secs(30);

enum Msg {
    Done(Job, Outcome),
    Models(Result<Vec<Model>, ClientError>),
    Reported(BTreeMap<String, Usage>, bool),
    /// The units held per booking were reported (true) or not.
    HeldReported(HeldReport, bool),
    Labelled,
    /// A node's status patch ended (true: written).
    Advertised(String, bool),
    /// The recorded actions found by a sweep (`None`: the sweep failed).
    Intents(Option<Vec<crate::intent::Intent>>),
    /// A preemption round was recorded on its booked pod (true) or could not be:
    /// its evictions start only once it is.
    RoundRecorded(Vec<Job>, bool),
}

pub struct Loop {
    ctx: Arc<Ctx>,
    args: ControllerArgs,
    base_cfg: AdmissionConfig,
    cfg: AdmissionConfig,
    models: Option<Models>,
    pods: HashMap<String, PodInfo>,
    nodes: BTreeMap<String, NodeInfo>,
    timers: DelayQueue<String>,
    timer_keys: HashMap<String, (delay_queue::Key, Option<chrono::DateTime<chrono::Utc>>)>,
    in_flight: HashSet<String>,
    /// High-priority pods the scheduler could not place.
    pending: HashSet<String>,
    /// Preemption rounds per Pending booked pod (uid).
    attempts: HashMap<String, Attempts>,
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
    /// Pods the scheduler cannot place for want of the VRAM budget.
    pending_gpumem: HashSet<String>,
    /// Lent pods the scheduler cannot place for want of a GPU, since when.
    pending_lent: HashMap<String, Instant>,
    /// Sync ticks since every model was last reported.
    ticks_since_full_report: u32,
    usage_dirty: bool,
    /// A sweep of recorded actions is running.
    sweeping: bool,
    init_pods: Option<HashSet<String>>,
    pods_synced: bool,
    nodes_synced: bool,
    ready: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    /// Following the booking change stream (the leader only).
    following: Option<(
        tokio::task::JoinHandle<()>,
        mpsc::Receiver<gpu_booking_client::Followed>,
    )>,
    /// The current bookings as the stream last said, once listed (pods are checked
    /// against it as they change too).
    bookings: Option<HashMap<i64, gpu_booking_client::BookingState>>,
    /// A listing that came before the pods were read: applied once they are.
    listed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// (booking, pod) pairs whose user was told to restart a lent pod.
    told: HashSet<(i64, String)>,
    /// Current bookings already seen running (their lent pods looked at).
    started_seen: HashSet<i64>,
    /// Pods whose `terminate-at` is being written, and to what.
    retiming: Arc<std::sync::Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>>,
}

impl Loop {
    pub fn new(ctx: Arc<Ctx>, args: ControllerArgs, ready: Arc<AtomicBool>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = ctx.cfg.clone();
        Self {
            ctx,
            args,
            base_cfg: cfg.clone(),
            cfg,
            models: None,
            pods: HashMap::new(),
            nodes: BTreeMap::new(),
            timers: DelayQueue::new(),
            timer_keys: HashMap::new(),
            in_flight: HashSet::new(),
            pending: HashSet::new(),
            attempts: HashMap::new(),
            node_labels: HashMap::new(),
            reported: BTreeMap::new(),
            reporting: false,
            held_reported: None,
            held_reporting: false,
            labelling: HashMap::new(),
            advertising: HashMap::new(),
            several_models: HashSet::new(),
            pending_gpumem: HashSet::new(),
            pending_lent: HashMap::new(),
            ticks_since_full_report: 0,
            usage_dirty: true,
            sweeping: false,
            init_pods: None,
            pods_synced: false,
            nodes_synced: false,
            ready,
            tx,
            rx,
            following: None,
            bookings: None,
            listed_at: None,
            told: HashSet::new(),
            started_seen: HashSet::new(),
            retiming: Arc::default(),
        }
    }

    fn pod_stream(
        &self,
    ) -> futures::stream::BoxStream<'static, Result<Event<PodLite>, watcher::Error>> {
        let api: Api<PodLite> = match &self.args.namespace {
            Some(ns) => Api::namespaced(self.ctx.client.clone(), ns),
            None => Api::all(self.ctx.client.clone()),
        };
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed()
    }

    /// Runs until the task is dropped.
    pub async fn run(mut self) {
        let mut pods = self.pod_stream();
        let nodes_api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut nodes = watcher::watcher(nodes_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut leader = self.ctx.leadership.subscribe();
        let ticker = |every: Duration| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        };
        let mut preempt_tick = ticker(self.args.preemption_interval);
        let mut models_tick = ticker(self.args.models_refresh);
        let mut sync_tick = ticker(SYNC_EVERY);
        let mut intent_tick = ticker(INTENT_SWEEP);
        if self.leader() {
            self.start_following();
        }
        loop {
            tokio::select! {
                Some(event) = pods.next() => {
                    match event {
                        Ok(event) => self.on_pod_event(event),
                        Err(e) => {
                            self.ctx.metrics.error("kubernetes");
                            tracing::warn!(error = %e, "pod watch failed; retrying");
                        }
                    }
                }
                Some(event) = nodes.next() => {
                    match event {
                        Ok(event) => self.on_node_event(event),
                        Err(e) => {
                            self.ctx.metrics.error("kubernetes");
                            tracing::warn!(error = %e, "node watch failed; retrying");
                        }
                    }
                }
                Some(expired) = self.timers.next(), if !self.timers.is_empty() => {
                    self.on_timer(expired.into_inner());
                }
                Some(msg) = self.rx.recv() => {
                    if self.on_msg(msg) {
                        // The models' resources changed: what counts as a GPU pod did
                        // too, so every pod is read again.
                        pods = self.pod_stream();
                    }
                }
                Some(step) = next_step(&mut self.following) => self.on_followed(step),
                _ = preempt_tick.tick() => self.on_preempt_tick(),
                _ = models_tick.tick() => self.fetch_models(),
                _ = intent_tick.tick() => self.sweep_intents(),
                _ = sync_tick.tick() => {
                    self.ticks_since_full_report += 1;
                    if self.ticks_since_full_report >= REPORT_AT_LEAST_EVERY && !self.reporting {
                        self.ticks_since_full_report = 0;
                        self.reported.clear();
                        self.usage_dirty = true;
                    }
                    self.report_usage();
                    self.enforce_booking_units();
                    self.label_nodes();
                    self.advertise_gpumem();
                    self.notice_started_bookings();
                }
                Ok(()) = leader.changed() => {
                    if *leader.borrow_and_update() {
                        self.on_elected();
                        self.start_following();
                    } else {
                        self.stop_following();
                    }
                }
            }
            self.ctx.metrics.timers.set(self.timers.len() as i64);
        }
    }

    fn leader(&self) -> bool {
        self.ctx.leadership.is_leader()
    }

    // ---- pods -------------------------------------------------------------------

    fn on_pod_event(&mut self, event: Event<PodLite>) {
        match event {
            Event::Init => self.init_pods = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => self.upsert_pod(&pod),
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.remove_pod(uid);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.init_pods.take() {
                    let gone: Vec<String> = self
                        .pods
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        self.remove_pod(&uid);
                    }
                }
                self.pods_synced = true;
                self.update_ready();
                self.reconcile_bookings(Vec::new());
            }
        }
    }

    fn upsert_pod(&mut self, pod: &PodLite) {
        let Some(info) = PodInfo::from_pod(pod, &self.cfg) else {
            return;
        };
        if pod.unschedulable_for(&self.cfg.gpumem_resource) {
            self.pending_gpumem.insert(info.uid.clone());
        } else {
            self.pending_gpumem.remove(&info.uid);
        }
        self.ctx
            .metrics
            .inventory
            .pods_pending_gpumem
            .set(self.pending_gpumem.len() as i64);
        if let Some(seen) = &mut self.init_pods {
            seen.insert(info.uid.clone());
        }
        if !info.relevant() {
            self.remove_pod(&info.uid);
            return;
        }
        let uid = info.uid.clone();
        let changed_usage = self.pods.get(&uid).is_none_or(|old| {
            old.holds_gpu() != info.holds_gpu() || old.node != info.node || old.gpu != info.gpu
        });
        self.usage_dirty |= changed_usage;
        if info.priority == Some(Priority::High)
            && info.node.is_none()
            && info.unschedulable
            && !info.deleting
        {
            self.pending.insert(uid.clone());
        } else {
            self.pending.remove(&uid);
        }
        if info.priority == Some(Priority::Low)
            && info.node.is_none()
            && info.unschedulable_for_gpu
            && !info.deleting
        {
            self.pending_lent
                .entry(uid.clone())
                .or_insert_with(Instant::now);
        } else {
            self.pending_lent.remove(&uid);
        }
        self.schedule(&info);
        self.check_booking_of(&info);
        let scheduler_preempted = info.scheduler_preempted && info.priority.is_some();
        let job = scheduler_preempted.then(|| job_for(&info, Reason::SchedulerPreempted));
        self.pods.insert(uid, info);
        if let Some(job) = job {
            self.start(job);
        }
    }

    fn remove_pod(&mut self, uid: &str) {
        if let Some(info) = self.pods.remove(uid) {
            self.usage_dirty |= info.holds_gpu();
        }
        self.pending.remove(uid);
        self.pending_lent.remove(uid);
        if self.pending_gpumem.remove(uid) {
            self.ctx
                .metrics
                .inventory
                .pods_pending_gpumem
                .set(self.pending_gpumem.len() as i64);
        }
        self.cancel_timer(uid);
        self.ctx.gone.fire(uid);
    }

    // ---- timers -----------------------------------------------------------------

    /// Arms, moves or cancels the pod's expiry timer.
    fn schedule(&mut self, info: &PodInfo) {
        let Some(at) = info.expiry() else {
            if self
                .timer_keys
                .get(&info.uid)
                .is_some_and(|(_, at)| at.is_some())
            {
                self.cancel_timer(&info.uid);
            }
            return;
        };
        if let Some((_, Some(armed))) = self.timer_keys.get(&info.uid) {
            if *armed == at {
                return;
            }
        }
        self.arm(&info.uid, until(self.ctx.clock.now(), at), Some(at));
    }

    fn arm(&mut self, uid: &str, after: Duration, at: Option<chrono::DateTime<chrono::Utc>>) {
        tracing::debug!(%uid, ?after, "timer armed");
        self.cancel_timer(uid);
        let key = self.timers.insert(uid.to_owned(), after);
        self.timer_keys.insert(uid.to_owned(), (key, at));
    }

    fn cancel_timer(&mut self, uid: &str) {
        if let Some((key, _)) = self.timer_keys.remove(uid) {
            self.timers.try_remove(&key);
        }
    }

    /// A pod's timer: its expiry, or another look after a failed action.
    fn on_timer(&mut self, uid: String) {
        tracing::debug!(%uid, leader = self.leader(), "timer fired");
        self.timer_keys.remove(&uid);
        let Some(info) = self.pods.get(&uid) else {
            return;
        };
        if !self.leader() {
            // Re-armed when this replica is elected.
            return;
        }
        if let Some(at) = info.expiry() {
            let now = self.ctx.clock.now();
            if at > now {
                self.arm(&uid, until(now, at), Some(at));
                return;
            }
            let job = job_for(info, Reason::Expired { terminate_at: at });
            self.start(job);
        } else if info.scheduler_preempted && info.priority.is_some() {
            let job = job_for(info, Reason::SchedulerPreempted);
            self.start(job);
        }
    }

    fn on_elected(&mut self) {
        tracing::debug!(pods = self.pods.len(), "elected: re-arming timers");
        self.reported.clear();
        self.held_reported = None;
        self.usage_dirty = true;
        self.sweep_intents();
        let infos: Vec<PodInfo> = self.pods.values().cloned().collect();
        for info in infos {
            if info.expiry().is_some() {
                self.timer_keys.remove(&info.uid);
                self.schedule(&info);
            } else if info.scheduler_preempted && info.priority.is_some() {
                self.start(job_for(&info, Reason::SchedulerPreempted));
            }
        }
    }

    // ---- actions ----------------------------------------------------------------

    fn start(&mut self, job: Job) {
        if !self.leader() || !self.in_flight.insert(job.uid.clone()) {
            return;
        }
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        tokio::spawn(async move {
            // Killed (`Controller::kill`): the action stops where it is, as the
            // process would; its intent tells the next leader how to finish it.
            let outcome = tokio::select! {
                _ = ctx.halt.cancelled() => return,
                outcome = actions::run(&ctx, &job) => outcome,
            };
            let _ = tx.send(Msg::Done(job, outcome));
        });
    }

    /// Looks for recorded two-step actions that no replica is finishing (this
    /// replica's own in-flight ones are skipped by `start`) and finishes them.
    fn sweep_intents(&mut self) {
        if !self.leader() || self.sweeping || self.ctx.dry_run {
            return;
        }
        self.sweeping = true;
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        tokio::spawn(async move {
            let found = match crate::intent::list(&ctx.client, &ctx.intent_namespace).await {
                Ok(found) => found,
                Err(e) => {
                    ctx.metrics.error("kubernetes");
                    tracing::warn!(error = %e, "could not look for unfinished actions");
                    let _ = tx.send(Msg::Intents(None));
                    return;
                }
            };
            let mut intents = Vec::new();
            for entry in found {
                match entry {
                    Ok(intent) => intents.push(intent),
                    Err((name, why)) => {
                        // Nothing can finish it: say so and remove it.
                        ctx.metrics.action("resume", "unreadable");
                        tracing::error!(intent = %name, why, "an unreadable intent is removed");
                        if let Err(e) = crate::intent::drop_unreadable(
                            &ctx.client,
                            &ctx.intent_namespace,
                            &name,
                        )
                        .await
                        {
                            tracing::warn!(error = %e, "could not remove an unreadable intent");
                        }
                    }
                }
            }
            let _ = tx.send(Msg::Intents(Some(intents)));
        });
    }

    /// Handles a message; true when the pod watch must start over.
    fn on_msg(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Done(job, outcome) => {
                self.in_flight.remove(&job.uid);
                if matches!(outcome, Outcome::Failed(_)) && self.pods.contains_key(&job.uid) {
                    self.arm(&job.uid, RETRY_AFTER, None);
                }
            }
            Msg::Models(Ok(models)) => return self.set_models(&models),
            Msg::Models(Err(e)) => {
                self.ctx.metrics.error("booking");
                tracing::warn!(error = %e, "could not read the models");
                if self.models.is_none() {
                    // Without models there is no inventory: ask again soon.
                    let (booking, tx) = (self.ctx.booking.clone(), self.tx.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(RETRY_AFTER).await;
                        let _ = tx.send(Msg::Models(booking.models().await));
                    });
                }
            }
            Msg::Reported(done, ok) => {
                self.reporting = false;
                self.reported.extend(done);
                self.usage_dirty |= !ok;
            }
            Msg::HeldReported(held, ok) => {
                self.held_reporting = false;
                if ok {
                    self.held_reported = Some(held);
                }
            }
            Msg::Labelled => {}
            Msg::RoundRecorded(jobs, recorded) => {
                // Not recorded: the round counts all the same (in this replica's
                // memory) and ends nobody; the next one comes after its spacing.
                if recorded {
                    for job in jobs {
                        self.start(job);
                    }
                }
            }
            Msg::Intents(found) => {
                self.sweeping = false;
                for intent in found.unwrap_or_default() {
                    let job = Job {
                        uid: intent.uid.clone(),
                        namespace: intent.namespace.clone(),
                        name: intent.pod.clone(),
                        reason: Reason::Resumed(Box::new(intent)),
                    };
                    self.start(job);
                }
            }
            Msg::Advertised(node, _written) => {
                // Written or not, look again after LABEL_RETRY, or as soon as the
                // watch shows the node's status changed (`on_node_event`): the watch,
                // not the answer, says what the node advertises.
                if let Some(entry) = self.advertising.get_mut(&node) {
                    *entry = (Instant::now(), false);
                }
            }
        }
        false
    }

    // ---- models, inventory, usage, node labels -------------------------------------

    fn fetch_models(&self) {
        let (booking, tx) = (self.ctx.booking.clone(), self.tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(Msg::Models(booking.models().await));
        });
    }

    fn set_models(&mut self, models: &[Model]) -> bool {
        let opts = match self.args.inventory_options() {
            Ok(opts) => opts,
            Err(e) => {
                // Checked at start-up; kept as an error path rather than a panic.
                tracing::error!(error = %e, "invalid inventory options");
                return false;
            }
        };
        let models = Models::from_api(models, &self.cfg.gpu_resources, &opts);
        let mut cfg = self.base_cfg.clone();
        for (resource, model) in &models.resources {
            if let Ok(name) = gpu_booking_core::gpu_model::ModelName::parse(model) {
                cfg.model_resources.insert(resource.clone(), name);
            }
        }
        let restart = cfg.model_resources != self.cfg.model_resources;
        let changed = self.models.as_ref().is_none_or(|m| {
            !m.same_inventory(&models)
                || m.resources != models.resources
                || m.declared != models.declared
        });
        if changed {
            tracing::info!(models = ?models.names, "models loaded");
        }
        self.cfg = cfg;
        self.models = Some(models);
        self.usage_dirty |= changed;
        if restart {
            self.pods_synced = false;
            self.update_ready();
        }
        restart
    }

    fn on_node_event(&mut self, event: Event<Node>) {
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
                    &self.args.model_node_label,
                    &self.cfg.gpumem_resource,
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
                self.update_ready();
            }
        }
    }

    fn update_ready(&self) {
        self.ready
            .store(self.pods_synced && self.nodes_synced, Ordering::Release);
    }

    fn usage(&self) -> Option<BTreeMap<String, Usage>> {
        let models = self.models.as_ref()?;
        Some(inventory::usage(
            self.nodes.values(),
            self.pods.values(),
            models,
        ))
    }

    /// The inventory gauges, from this replica's own view (followers' too).
    fn publish_inventory(&self, usage: &BTreeMap<String, Usage>) {
        let Some(models) = &self.models else {
            return;
        };
        let g = &self.ctx.metrics.inventory;
        for family in [&g.cards, &g.units, &g.in_use, &g.mismatch] {
            family.clear();
        }
        for (model, u) in usage {
            let label = ModelLabel {
                model: model.clone(),
            };
            let declared = models.declared.get(model).copied();
            g.cards.get_or_create(&label).set(u.cards as i64);
            g.in_use.get_or_create(&label).set(u.in_use as i64);
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
            if matches!(
                inv.model,
                gpu_booking_core::inventory::NodeModel::Several(_)
            ) {
                several += 1;
            }
        }
        g.gpu_nodes.set(gpu_nodes);
        g.gpu_nodes_without_telemetry.set(blind);
        g.nodes_with_several_models.set(several);
    }

    /// Pushes the models whose units or use changed since the last report.
    fn report_usage(&mut self) {
        if !self.usage_dirty || self.reporting || !self.pods_synced || !self.nodes_synced {
            return;
        }
        let Some(usage) = self.usage() else {
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
                    cards = u.cards,
                    in_use = u.in_use,
                    gpumem_advertised = u.gpumem_advertised,
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
                let clamp = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
                let report = UsageReport {
                    in_use: clamp(u.in_use),
                    cards: clamp(u.cards),
                    gpumem_advertised: u.gpumem_advertised,
                    gpumem_unit_mib: u.gpumem_unit_mib.map(clamp),
                };
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

    /// A booking covers its units and no more, from the cluster's state on every
    /// sync: reports the units each booking's pods hold (the webhook decides new pods
    /// from it) and demotes the pods beyond a booking's units, newest first (two pods
    /// admitted before the count caught up both got high priority). Level-triggered:
    /// a demotion that failed or was missed is found again on the next sync.
    fn enforce_booking_units(&mut self) {
        if !self.leader() || !self.pods_synced {
            return;
        }
        let pods = booking_units::booked_pods(&self.pods);
        let held = HeldReport {
            bookings: gpu_booking_core::booking_units::held_by_booking(&pods),
            active: booking_units::last_active_by_booking(&self.pods),
        };
        // Held units on every change; activity when it moved by a step (the usage
        // report's resolution), not on each of the agent's annotation writes.
        let news = match &self.held_reported {
            None => true,
            Some(was) => {
                was.bookings != held.bookings
                    || gpu_booking_core::usage::activity_moved(&was.active, &held.active)
            }
        };
        if !self.held_reporting && news {
            if self.ctx.dry_run {
                tracing::info!(
                    bookings = held.bookings.len(),
                    "dry run: would report the units held"
                );
                self.held_reported = Some(held);
            } else {
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
        }
        for uid in gpu_booking_core::booking_units::beyond_units(&pods) {
            let Some(info) = self.pods.get(&uid) else {
                continue;
            };
            let (Some(booking_id), Some(units)) = (info.booking_id, info.booking_units) else {
                continue;
            };
            let job = job_for(info, Reason::BeyondBooking { booking_id, units });
            self.start(job);
        }
    }

    /// Labels each GPU node with its model (and removes a label that no longer fits).
    fn label_nodes(&mut self) {
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
            if let gpu_booking_core::inventory::NodeModel::Several(several) = &inv.model {
                if !self.several_models.contains(&node.name) {
                    let names: Vec<&str> = several.iter().map(|m| m.as_str()).collect();
                    refused.push((node.name.clone(), names.join(", ")));
                }
            }
            let want = inv.model.label().map(|m| m.as_str().to_owned());
            if want == node.model_label {
                continue;
            }
            if self
                .labelling
                .get(&node.name)
                .is_some_and(|at| now < *at + LABEL_RETRY)
            {
                continue;
            }
            work.push((node.name.clone(), want));
        }
        for (name, several) in refused {
            self.several_models.insert(name.clone());
            let note = format!(
                "cards of several models ({several}) on one node: one model label cannot \
                 select them all, so the node carries none and booked pods of these \
                 models are not placed here; their cards still count"
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
        for (name, want) in work {
            self.labelling.insert(name.clone(), now);
            if self.ctx.dry_run {
                tracing::info!(node = %name, model = ?want, "dry run: would label node");
                self.ctx.metrics.action("label_node", "dry_run");
                continue;
            }
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            let label = self.args.model_node_label.clone();
            tokio::spawn(async move {
                let api: Api<Node> = Api::all(ctx.client.clone());
                let patch = json!({"metadata": {"labels": {label: want}}});
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
    fn advertise_gpumem(&mut self) {
        let Some(models) = &self.models else {
            return;
        };
        if !self.args.advertise_gpumem || !self.leader() || !self.nodes_synced {
            return;
        }
        let now = Instant::now();
        let resource = self.cfg.gpumem_resource.clone();
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

    // ---- preemption ---------------------------------------------------------------

    /// One round: for each booked pod that the scheduler cannot place (oldest
    /// first), core's eviction order decides whether room is free or on its way (a
    /// victim still terminating counts), which lent pods give way, or that none can.
    /// Rounds for one pod are bounded (`--preemption-attempts`) and spaced
    /// (`--preemption-retry`, doubled each time). Nothing but the cluster's state
    /// decides: no request from outside can end a pod.
    fn on_preempt_tick(&mut self) {
        if !self.leader() || !self.pods_synced || !self.nodes_synced {
            return;
        }
        self.run_pending_lent_on_cpu();
        let Some(models) = &self.models else {
            return;
        };
        let pending = &self.pending;
        self.attempts.retain(|uid, _| pending.contains(uid));
        let mut waiting: Vec<&PodInfo> = self
            .pending
            .iter()
            .filter_map(|uid| self.pods.get(uid))
            .collect();
        waiting.sort_by(|a, b| {
            (a.started, &a.namespace, &a.name).cmp(&(b.started, &b.namespace, &b.name))
        });
        let view = View {
            pods: &self.pods,
            nodes: &self.nodes,
            node_labels: &self.node_labels,
            models,
            generic: &self.cfg.gpu_resources,
            gpumem_resource: &self.cfg.gpumem_resource,
            model_node_label: &self.args.model_node_label,
            going: &self.in_flight,
            cushion_mib: self.args.preemption_vram_cushion,
        };
        let mut round = Round::new(&view);
        let now = Instant::now();
        let mut jobs = Vec::new();
        let mut notes = Vec::new();
        for pod in waiting {
            let Some(model) = pod
                .model_label
                .clone()
                .or_else(|| pod.gpu.as_ref().and_then(|g| g.model.clone()))
            else {
                continue;
            };
            // Decided even while waiting, so that the room this pod gets is not
            // counted again for the next one.
            let decision = round.decide(&view, pod, &model);
            // The rounds recorded on the pod count too: a new leader goes on from
            // them (and waits a spacing) instead of starting over.
            let retry = self.args.preemption_retry;
            let state = self
                .attempts
                .entry(pod.uid.clone())
                .or_insert_with(|| Attempts::resumed(pod.preemption_rounds, now, retry));
            state.rounds = state.rounds.max(pod.preemption_rounds);
            match decision {
                victims::Decision::Fits { .. } => {}
                victims::Decision::NoRoom => {
                    if !state.said_no_room {
                        state.said_no_room = true;
                        self.ctx.metrics.action("preempt", "no_victim");
                        tracing::info!(pod = %pod.key(), %model, "booked pod waits; no lent pod can make room");
                    }
                }
                victims::Decision::Evict { node, victims } => {
                    if state.next.is_some_and(|next| now < next) {
                        continue;
                    }
                    if state.rounds >= self.args.preemption_attempts {
                        if !state.gave_up {
                            state.gave_up = true;
                            self.ctx.metrics.action("preempt", "gave_up");
                            tracing::warn!(pod = %pod.key(), %model, rounds = state.rounds, "booked pod still waits; preemption attempts spent");
                            notes.push((pod.clone(), "PreemptionGaveUp", format!(
                                "gpu-booking preempted {} time(s) for this pod and stops; it waits for a {model} unit to come free",
                                state.rounds
                            )));
                        }
                        continue;
                    }
                    state.rounds += 1;
                    state.next = Some(now + spacing(retry, state.rounds));
                    let reason = Reason::Preempted {
                        model: model.clone(),
                        for_whom: pod.key(),
                        attempt: state.rounds,
                    };
                    let mut round_jobs = Vec::new();
                    let names: Vec<String> = victims
                        .iter()
                        .filter_map(|uid| self.pods.get(uid))
                        .map(|victim| {
                            round_jobs.push(job_for(victim, reason.clone()));
                            victim.key()
                        })
                        .collect();
                    jobs.push((pod.clone(), state.rounds, round_jobs));
                    tracing::info!(pod = %pod.key(), %model, %node, victims = ?names, round = state.rounds, "preempting for a booked pod");
                    notes.push((pod.clone(), "PreemptingForBooking", format!(
                        "gpu-booking ends the lent {model} pod(s) {} on node {node} (least recently GPU-active) to make room for this pod (round {} of {})",
                        names.join(", "),
                        state.rounds,
                        self.args.preemption_attempts
                    )));
                }
            }
        }
        for (pod, rounds, round_jobs) in jobs {
            self.record_round(&pod, rounds, round_jobs);
        }
        if self.ctx.dry_run {
            return;
        }
        for (pod, reason, message) in notes {
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let at = actions::PodRef {
                    namespace: &pod.namespace,
                    name: &pod.name,
                    uid: &pod.uid,
                };
                actions::note_pod(&ctx, &at, reason, &message, "Preempt").await;
            });
        }
    }
}

impl Loop {
    /// Writes the round's number on the booked pod ([`PREEMPTION_ROUNDS_ANNOTATION`],
    /// guarded by its uid), then starts its evictions: whichever replica leads next
    /// reads it back, so `--preemption-attempts` bounds the rounds for a pod however
    /// often the leader changes. A dry run writes nothing.
    fn record_round(&mut self, pod: &PodInfo, rounds: u32, jobs: Vec<Job>) {
        if self.ctx.dry_run {
            for job in jobs {
                self.start(job);
            }
            return;
        }
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        tokio::spawn(async move {
            let api = actions::pods(&ctx, &namespace);
            let patch = json!({"metadata": {
                "uid": uid,
                "annotations": {PREEMPTION_ROUNDS_ANNOTATION: rounds.to_string()},
            }});
            let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
            let written = tokio::select! {
                _ = ctx.halt.cancelled() => return,
                written = actions::with_retries(|| api.patch(&name, &params, &patch)) => written,
            };
            if let Err(e) = &written {
                ctx.metrics.action("preempt", "error");
                ctx.metrics.error("kubernetes");
                tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "could not record the preemption round on the booked pod; no eviction this round");
            }
            let _ = tx.send(Msg::RoundRecorded(jobs, written.is_ok()));
        });
    }

    // ---- booking changes ----------------------------------------------------------

    fn start_following(&mut self) {
        if self.following.is_none() {
            self.bookings = None;
            self.following = follow::spawn(self.ctx.clone());
        }
    }

    fn stop_following(&mut self) {
        if let Some((task, _)) = self.following.take() {
            task.abort();
        }
        self.bookings = None;
        self.listed_at = None;
    }

    fn on_followed(&mut self, step: gpu_booking_client::Followed) {
        use gpu_booking_client::Followed;
        let now = self.ctx.clock.now();
        let changed = match step {
            Followed::Listed(bookings) => {
                self.bookings = Some(
                    bookings
                        .into_iter()
                        .filter(|b| !b.is_over())
                        .map(|b| (b.id, b))
                        .collect(),
                );
                self.listed_at = Some(now);
                Vec::new()
            }
            Followed::Changed(changes) => {
                let changed: Vec<_> = changes.into_iter().map(|c| c.booking).collect();
                if let Some(current) = &mut self.bookings {
                    for b in &changed {
                        if b.is_over() {
                            current.remove(&b.id);
                        } else {
                            current.insert(b.id, b.clone());
                        }
                    }
                }
                changed
            }
            Followed::Failed(_) => return,
        };
        self.reconcile_bookings(changed);
    }

    /// Re-times booked pods against the bookings (after a listing, every booked pod;
    /// else those of `changed`), and tells users of lent pods whose booking started.
    fn reconcile_bookings(&mut self, changed: Vec<gpu_booking_client::BookingState>) {
        if !self.leader() || !self.pods_synced {
            return;
        }
        let Some(current) = &self.bookings else {
            return;
        };
        let now = self.ctx.clock.now();
        let (bookings, listed_at): (Vec<_>, _) = match self.listed_at.take() {
            Some(at) => (current.values().cloned().chain(changed).collect(), Some(at)),
            None => (changed, None),
        };
        let retimes = follow::plan(self.pods.values(), &bookings, listed_at, now);
        for r in retimes {
            self.spawn_retime(r);
        }
        self.tell_lent(&bookings, now);
    }

    /// Tells the users of lent pods whose booking of that model runs now, once per
    /// booking and pod.
    fn tell_lent(
        &mut self,
        bookings: &[gpu_booking_client::BookingState],
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let mut notices = Vec::new();
        let (labels, key) = (&self.node_labels, &self.args.model_node_label);
        let node_model = |node: &str| labels.get(node).and_then(|l| l.get(key)).cloned();
        for b in bookings {
            for pod in follow::lent_pods_of(&self.pods, b, now, &node_model) {
                if self.told.len() >= MAX_TOLD {
                    self.told.clear();
                }
                if self.told.insert((b.id, pod.uid.clone())) {
                    notices.push((pod.clone(), b.clone()));
                }
            }
        }
        for (pod, booking) in notices {
            let ctx = self.ctx.clone();
            tokio::spawn(async move { follow::tell_restart(&ctx, &pod, &booking).await });
        }
    }

    /// Planned bookings that have started by the clock since the last look: their
    /// users' lent pods (the stream says nothing when a booking starts).
    fn notice_started_bookings(&mut self) {
        if !self.leader() || !self.pods_synced {
            return;
        }
        let Some(current) = &self.bookings else {
            return;
        };
        let now = self.ctx.clock.now();
        self.started_seen.retain(|id| current.contains_key(id));
        let started: Vec<_> = current
            .values()
            .filter(|b| b.start <= now && now < b.end && !self.started_seen.contains(&b.id))
            .cloned()
            .collect();
        if started.is_empty() {
            return;
        }
        self.started_seen.extend(started.iter().map(|b| b.id));
        self.tell_lent(&started, now);
    }

    /// A booked pod that changed: its end against its booking's, if known (a pod
    /// admitted on a stale answer, or re-timed out of order, is put right).
    fn check_booking_of(&self, info: &PodInfo) {
        if !self.leader() || !self.pods_synced {
            return;
        }
        let (Some(current), Some(id)) = (&self.bookings, info.booking_id) else {
            return;
        };
        let Some(booking) = current.get(&id) else {
            return;
        };
        let now = self.ctx.clock.now();
        for r in follow::plan([info], std::slice::from_ref(booking), None, now) {
            self.spawn_retime(r);
        }
    }

    /// Re-times a pod on its own task, unless the same is on its way already (pod
    /// events keep coming while the patch is written).
    fn spawn_retime(&self, r: follow::Retime) {
        {
            let mut going = self.retiming.lock().unwrap_or_else(|e| e.into_inner());
            if going.get(&r.uid) == Some(&r.to) {
                return;
            }
            going.insert(r.uid.clone(), r.to);
        }
        let (ctx, going) = (self.ctx.clone(), self.retiming.clone());
        tokio::spawn(async move {
            follow::retime(&ctx, &r).await;
            let mut going = going.lock().unwrap_or_else(|e| e.into_inner());
            if going.get(&r.uid) == Some(&r.to) {
                going.remove(&r.uid);
            }
        });
    }
}

/// (booking, pod) notices remembered; past this the memory starts over (an Event
/// may then repeat).
const MAX_TOLD: usize = 10_000;

/// The follower's next step, or never when not following.
async fn next_step(
    following: &mut Option<(
        tokio::task::JoinHandle<()>,
        mpsc::Receiver<gpu_booking_client::Followed>,
    )>,
) -> Option<gpu_booking_client::Followed> {
    match following {
        Some((_, rx)) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Loop {
    /// The backstop of the webhook's lend ledger: lent pods that waited past
    /// `--lent-pending-grace` for a GPU the scheduler has no room for are recreated
    /// CPU-only (core's [`pending_lent`] decides).
    fn run_pending_lent_on_cpu(&mut self) {
        let grace = self.args.lent_pending_grace;
        let due: Vec<Job> = self
            .pending_lent
            .iter()
            .filter_map(|(uid, since)| {
                let pod = self.pods.get(uid)?;
                let verdict = pending_lent(
                    pod.priority,
                    pod.node.is_some(),
                    pod.unschedulable_for_gpu && !pod.deleting,
                    since.elapsed(),
                    grace,
                );
                (verdict == PendingLent::RunOnCpu).then(|| job_for(pod, Reason::LentPending))
            })
            .collect();
        for job in due {
            // Another look only after another grace, whatever comes of this one.
            self.pending_lent.insert(job.uid.clone(), Instant::now());
            tracing::info!(pod = %format!("{}/{}", job.namespace, job.name), ?grace, "lent pod waits for a GPU that is not there; recreating it CPU-only");
            self.start(job);
        }
    }
}

/// The preemption rounds for one Pending booked pod.
#[derive(Debug, Default)]
struct Attempts {
    rounds: u32,
    /// No round before this.
    next: Option<Instant>,
    gave_up: bool,
    said_no_room: bool,
}

impl Attempts {
    /// The state of a pod first seen by this replica with `rounds` already recorded
    /// on it: the next round waits its spacing from `now`.
    fn resumed(rounds: u32, now: Instant, retry: Duration) -> Self {
        Self {
            rounds,
            next: (rounds > 0).then(|| now + spacing(retry, rounds)),
            ..Self::default()
        }
    }
}

/// The wait after round `rounds` (1-based): `retry`, doubled each round (at most 32x).
fn spacing(retry: Duration, rounds: u32) -> Duration {
    retry * (1u32 << rounds.saturating_sub(1).min(5))
}

fn job_for(info: &PodInfo, reason: Reason) -> Job {
    Job {
        uid: info.uid.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        reason,
    }
}
