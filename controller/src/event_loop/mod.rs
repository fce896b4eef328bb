//! The controller's loop: one task reads the watch events, timers and finished
//! work, and routes each to the part that owns the state it changes:
//!
//! - [`expiry`]: the pods, a timer per booked pod, the actions under way (every
//!   action starts there), the sweep of unfinished recorded actions;
//! - [`inventory`]: models, nodes, usage and held-unit reports, node labels and
//!   VRAM budgets;
//! - [`preemption`]: pods the scheduler cannot place, preemption rounds, lent pods
//!   recreated CPU-only, pods beyond their booking's units;
//! - [`follower`]: the booking change stream and the re-timing it asks for.
//!
//! A part that needs another's state gets it as an argument (preemption reads the
//! expiry part's pods and the inventory's nodes). Anything that waits on the
//! network runs on its own task and reports back by message ([`Msg`]), so a slow
//! booking service never delays an expiry timer.

mod expiry;
mod follower;
mod inventory;
mod preemption;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpu_booking_client::{ClientError, HeldReport, Model};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::actions::{Ctx, Job, Outcome, Reason};
use crate::booking_units;
use crate::config::ControllerArgs;
use crate::inventory::Usage;
use crate::pods::{PodInfo, PodLite};
use crate::stripped_events::StrippedEvents;
use expiry::Expiry;
use follower::Follower;
use inventory::Inventory;
use preemption::Preemption;

/// The pods that may hold a GPU: those not finished (`status.phase` is one of the
/// fields kube-apiserver selects pods by).
const UNFINISHED_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";
/// How often usage is pushed and node labels are checked (changes are batched).
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// How often the leader looks for recorded actions left unfinished (besides when it
/// is elected and when it starts).
const INTENT_SWEEP: Duration = Duration::from_secs(30);

/// What a task started by the loop reports back.
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
    ready: Arc<AtomicBool>,
    rx: mpsc::UnboundedReceiver<Msg>,
    expiry: Expiry,
    inventory: Inventory,
    preemption: Preemption,
    follower: Follower,
    stripped_events: StrippedEvents,
    offers: crate::offers::OfferPart,
}

impl Loop {
    pub fn new(ctx: Arc<Ctx>, args: ControllerArgs, ready: Arc<AtomicBool>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            expiry: Expiry::new(ctx.clone(), tx.clone()),
            inventory: Inventory::new(ctx.clone(), args.clone(), tx.clone()),
            preemption: Preemption::new(ctx.clone(), args.clone(), tx),
            stripped_events: StrippedEvents::new(ctx.clone()),
            offers: crate::offers::OfferPart::new(ctx.clone(), &args),
            follower: Follower::new(
                ctx.clone(),
                args.admission.model_node_label.clone(),
                args.booking_relist_after,
            ),
            ctx,
            args,
            ready,
            rx,
        }
    }

    /// Every pod that may hold a GPU, in every namespace: a card a pod elsewhere
    /// holds is not free, whoever made the pod (it acts only where the policy lets
    /// it). Pods that finished hold nothing and are left to the API server's
    /// field selector (a pod that finishes leaves the watch as a deletion).
    fn pod_stream(
        &self,
    ) -> futures::stream::BoxStream<'static, Result<Event<PodLite>, watcher::Error>> {
        let api: Api<PodLite> = Api::all(self.ctx.client.clone());
        let config = watcher::Config::default().fields(UNFINISHED_PODS);
        watcher::watcher(api, config).default_backoff().boxed()
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
            self.follower.start_following();
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
                        Ok(event) => {
                            if self.inventory.on_node_event(event) {
                                self.update_ready();
                            }
                        }
                        Err(e) => {
                            self.ctx.metrics.error("kubernetes");
                            tracing::warn!(error = %e, "node watch failed; retrying");
                        }
                    }
                }
                Some(uid) = self.expiry.next_expired(), if self.expiry.has_timers() => {
                    self.expiry.on_timer(uid);
                }
                Some(msg) = self.rx.recv() => {
                    if self.on_msg(msg) {
                        // The models' resources changed: what counts as a GPU pod did
                        // too, so every pod is read again.
                        pods = self.pod_stream();
                    }
                }
                Some(step) = self.follower.next_step() => {
                    let cluster = seen_by_follower(&self.expiry, &self.inventory);
                    self.follower.on_followed(step, &cluster);
                }
                _ = preempt_tick.tick() => self.on_preempt_tick(),
                _ = models_tick.tick() => self.inventory.fetch_models(),
                _ = intent_tick.tick() => self.expiry.sweep_intents(),
                _ = sync_tick.tick() => self.on_sync_tick(),
                Ok(()) = leader.changed() => {
                    let elected = *leader.borrow_and_update();
                    self.offers.on_leadership(elected);
                    if elected {
                        self.inventory.on_elected();
                        self.expiry.on_elected();
                        self.follower.start_following();
                    } else {
                        self.follower.stop_following();
                    }
                }
            }
            self.ctx
                .metrics
                .timers
                .set(self.expiry.timer_count() as i64);
        }
    }

    fn leader(&self) -> bool {
        self.ctx.leadership.is_leader()
    }

    fn update_ready(&self) {
        self.ready.store(
            self.expiry.pods_synced() && self.inventory.nodes_synced(),
            Ordering::Release,
        );
    }

    // ---- pods -------------------------------------------------------------------

    fn on_pod_event(&mut self, event: Event<PodLite>) {
        match event {
            Event::Init => self.expiry.listing_started(),
            Event::InitApply(pod) | Event::Apply(pod) => self.upsert_pod(&pod),
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.remove_pod(uid);
                }
            }
            Event::InitDone => {
                for uid in self.expiry.listing_done() {
                    self.remove_pod(&uid);
                }
                self.update_ready();
                let cluster = seen_by_follower(&self.expiry, &self.inventory);
                self.follower.reconcile_bookings(Vec::new(), &cluster);
            }
        }
    }

    fn upsert_pod(&mut self, pod: &PodLite) {
        let cfg = self.ctx.cfg.current();
        let Some(mut info) = PodInfo::from_pod(pod, &cfg) else {
            return;
        };
        info.served = self.ctx.policy.serves(&info.namespace);
        self.preemption
            .note_gpumem(&info.uid, pod.unschedulable_for(&cfg.gpumem_resource));
        self.expiry.listed(&info.uid);
        if !info.relevant() {
            self.remove_pod(&info.uid);
            return;
        }
        self.inventory
            .pod_changed(self.expiry.pods().get(&info.uid), &info);
        self.preemption.track(&info);
        self.expiry.schedule(&info);
        self.follower
            .check_booking_of(&info, self.expiry.pods_synced());
        let scheduler_preempted =
            info.scheduler_preempted && info.priority.is_some() && info.served;
        let job = scheduler_preempted.then(|| job_for(&info, Reason::SchedulerPreempted));
        self.stripped_events.seen(&info);
        self.offers.seen(pod, &info);
        self.expiry.insert(info);
        if let Some(job) = job {
            self.expiry.start(job);
        }
    }

    fn remove_pod(&mut self, uid: &str) {
        if let Some(info) = self.expiry.remove(uid) {
            self.inventory.pod_gone(&info);
        }
        self.preemption.forget(uid);
        self.stripped_events.forget(uid);
        self.offers.forget(uid);
    }

    // ---- ticks and messages ---------------------------------------------------------

    fn on_sync_tick(&mut self) {
        self.inventory.tick();
        self.inventory
            .report_usage(self.expiry.pods(), self.expiry.pods_synced());
        self.enforce_booking_units();
        self.inventory.label_nodes();
        self.inventory.advertise_gpumem();
        let cluster = seen_by_follower(&self.expiry, &self.inventory);
        self.follower.notice_started_bookings(&cluster);
        self.offer_gpus();
    }

    /// Free units offered back to users on CPU (the leader, every pod and node
    /// listed).
    fn offer_gpus(&mut self) {
        if !self.leader() || !self.expiry.pods_synced() || !self.inventory.nodes_synced() {
            return;
        }
        let free = self.inventory.free_units(self.expiry.pods());
        self.offers.round(self.expiry.pods(), free);
    }

    /// A booking covers its units and no more, from the cluster's state on every
    /// sync: the inventory reports the units each booking's pods hold, preemption
    /// demotes the pods beyond them.
    fn enforce_booking_units(&mut self) {
        if !self.leader() || !self.expiry.pods_synced() {
            return;
        }
        let booked = booking_units::booked_pods(self.expiry.pods());
        let waiting = self.preemption.waiting_by_booking();
        self.inventory
            .report_held(&booked, self.expiry.pods(), waiting);
        for job in self.preemption.beyond_units(&booked, self.expiry.pods()) {
            self.expiry.start(job);
        }
    }

    fn on_preempt_tick(&mut self) {
        if !self.leader() || !self.expiry.pods_synced() || !self.inventory.nodes_synced() {
            return;
        }
        // Started before the round reads what is going: these pods count as going.
        for job in self.preemption.lent_due_on_cpu(self.expiry.pods()) {
            self.expiry.start(job);
        }
        for job in self.preemption.settle_marked(self.expiry.pods()) {
            self.expiry.start(job);
        }
        for job in self.preemption.round(&self.expiry, &self.inventory) {
            self.expiry.start(job);
        }
    }

    /// Handles a message; true when the pod watch must start over.
    fn on_msg(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Done(job, outcome) => self.expiry.done(&job, &outcome),
            Msg::Models(Ok(models)) => return self.set_models(&models),
            Msg::Models(Err(e)) => self.inventory.models_failed(&e),
            Msg::Reported(done, ok) => self.inventory.reported(done, ok),
            Msg::HeldReported(held, ok) => self.inventory.held_reported(held, ok),
            Msg::Labelled => {}
            Msg::RoundRecorded(jobs, recorded) => {
                // Not recorded: the round counts all the same (in this replica's
                // memory) and ends nobody; the next one comes after its spacing.
                if recorded {
                    for job in self.preemption.mark(jobs, self.expiry.pods()) {
                        self.expiry.start(job);
                    }
                } else {
                    self.preemption.unchoose(&jobs);
                }
            }
            Msg::Intents(found) => self.expiry.swept(found),
            Msg::Advertised(node, _written) => self.inventory.advertised(&node),
        }
        false
    }

    /// New models: the admission configuration (the one the actions read too) learns
    /// their resources; when those changed, the pods are read again (true).
    fn set_models(&mut self, models: &[Model]) -> bool {
        let Some(models) = self.inventory.set_models(models) else {
            return false;
        };
        let restart = self.ctx.cfg.learn_model_resources(&models.resources);
        if restart {
            self.expiry.unsync();
            self.update_ready();
        }
        restart
    }
}

/// What the follower reads of the other parts (borrowed field by field, so that
/// the follower itself can change meanwhile).
fn seen_by_follower<'a>(expiry: &'a Expiry, inventory: &'a Inventory) -> follower::Cluster<'a> {
    follower::Cluster {
        pods: expiry.pods(),
        pods_synced: expiry.pods_synced(),
        node_labels: inventory.node_labels(),
    }
}

/// The action `reason` asks for on the pod.
fn job_for(info: &PodInfo, reason: Reason) -> Job {
    Job {
        uid: info.uid.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        reason,
    }
}
