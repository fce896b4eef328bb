//! The loop's preemption part: the pods the scheduler cannot place, the rounds of
//! preemption for each booked one, lent pods recreated CPU-only when no GPU comes,
//! and booked pods beyond their booking's units. It decides which actions to take;
//! the expiry part ([`super::expiry::Expiry::start`]) runs them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_booking_core::admission::{pending_lent, PendingLent};
use gpu_booking_core::admission::{PREEMPT_AT_ANNOTATION, PREEMPT_FOR_ANNOTATION};
use gpu_booking_core::booking_units::BookedPod;
use gpu_booking_core::preemption_policy::{
    ending_reason, freeing_reason, marked as marked_fate, waiting_reason, Marked, NAMED_NAMESPACES,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::expiry::Expiry;
use super::inventory::Inventory;
use super::{job_for, Msg};
use crate::actions::{self, Annotated, Ctx, Job, Reason};
use crate::config::ControllerArgs;
use crate::metrics::WaitingLabel;
use crate::pods::{PodInfo, Priority, PREEMPTION_ROUNDS_ANNOTATION};
use crate::victims::{self, Round, View};

pub(super) struct Preemption {
    ctx: Arc<Ctx>,
    args: ControllerArgs,
    tx: mpsc::UnboundedSender<Msg>,
    /// High-priority pods the scheduler could not place.
    pending: HashSet<String>,
    /// Preemption rounds per Pending booked pod (uid).
    attempts: HashMap<String, Attempts>,
    /// Pods the scheduler cannot place for want of the VRAM budget.
    pending_gpumem: HashSet<String>,
    /// The booked pods that wait with no pod that may give way, as the last round
    /// found them.
    waiting: Vec<Waiting>,
    /// Bookings whose pod waits for a marked pod's deadline: what they are told.
    freeing: BTreeMap<i64, String>,
    /// Marked pods whose mark is being removed, or moved to another booked pod (not
    /// asked again before the watch shows it done or a while passed).
    unmarking: HashMap<String, Instant>,
    /// Marked pods (uid) the last round's booked pods count on, and the key of the
    /// booked pod counting on each ([`Round::relied`]).
    relied: HashMap<String, String>,
    /// Pods a round chose to give way, since when, until the watch shows them marked
    /// or going: the round is recorded and the mark written after it, and the next
    /// round (2 s on) must not take them for free room and choose them again for
    /// another booked pod, which then lacks a victim of its own.
    chosen: HashMap<String, (Instant, String)>,
    /// Lent pods the scheduler cannot place for want of a GPU, since when.
    pending_lent: HashMap<String, Instant>,
}

impl Preemption {
    pub(super) fn new(ctx: Arc<Ctx>, args: ControllerArgs, tx: mpsc::UnboundedSender<Msg>) -> Self {
        Self {
            ctx,
            args,
            tx,
            pending: HashSet::new(),
            attempts: HashMap::new(),
            pending_gpumem: HashSet::new(),
            pending_lent: HashMap::new(),
            waiting: Vec::new(),
            freeing: BTreeMap::new(),
            unmarking: HashMap::new(),
            relied: HashMap::new(),
            chosen: HashMap::new(),
        }
    }

    /// Whether the scheduler cannot place the pod for want of the VRAM budget (a
    /// gauge, for any pod the watch reads).
    pub(super) fn note_gpumem(&mut self, uid: &str, wants_gpumem: bool) {
        if wants_gpumem {
            self.pending_gpumem.insert(uid.to_owned());
        } else {
            self.pending_gpumem.remove(uid);
        }
        self.publish_gpumem();
    }

    fn publish_gpumem(&self) {
        self.ctx
            .metrics
            .inventory
            .pods_pending_gpumem
            .set(self.pending_gpumem.len() as i64);
    }

    /// A relevant pod changed or came: whether it is a booked pod waiting for room
    /// or a lent pod waiting for a GPU.
    pub(super) fn track(&mut self, info: &PodInfo) {
        let uid = &info.uid;
        if info.served
            && info.priority == Some(Priority::High)
            && info.node.is_none()
            && info.unschedulable
            && !info.deleting
        {
            self.pending.insert(uid.clone());
        } else {
            self.pending.remove(uid);
        }
        if info.served
            && info.priority == Some(Priority::Low)
            && info.node.is_none()
            && info.unschedulable_for_gpu
            && !info.deleting
        {
            self.pending_lent
                .entry(uid.clone())
                .or_insert_with(Instant::now);
        } else {
            self.pending_lent.remove(uid);
        }
        self.publish_lent();
    }

    fn publish_lent(&self) {
        self.ctx
            .metrics
            .lent_pods_pending
            .set(self.pending_lent.len() as i64);
    }

    /// A pod went.
    pub(super) fn forget(&mut self, uid: &str) {
        self.pending.remove(uid);
        if self.pending_lent.remove(uid).is_some() {
            self.publish_lent();
        }
        if self.pending_gpumem.remove(uid) {
            self.publish_gpumem();
        }
    }

    /// Why each booking whose pod waits does (for the held-units report: its page
    /// and the API show it).
    pub(super) fn waiting_by_booking(&self) -> BTreeMap<i64, String> {
        let mut out = self.freeing.clone();
        out.extend(
            self.waiting
                .iter()
                .filter_map(|w| Some((w.booking_id?, w.reason.clone()))),
        );
        out
    }

    /// The waiting booked pods as gauges, by model and the namespaces whose pods
    /// keep them waiting (the alert names them).
    fn publish_waiting(&mut self, waiting: Vec<Waiting>) {
        let gauge = &self.ctx.metrics.booked_pods_waiting;
        gauge.clear();
        for w in &waiting {
            let mut held_by: Vec<&str> = w.held_by.iter().map(String::as_str).collect();
            held_by.truncate(NAMED_NAMESPACES);
            gauge
                .get_or_create(&WaitingLabel {
                    model: w.model.clone(),
                    held_by: held_by.join(","),
                })
                .inc();
        }
        self.waiting = waiting;
    }

    /// A booking covers its units and no more: the pods beyond a booking's units,
    /// newest first, are demoted (two pods admitted before the count caught up both
    /// got high priority). Level-triggered: a demotion that failed or was missed is
    /// found again on the next sync.
    pub(super) fn beyond_units(
        &self,
        booked: &[BookedPod<String>],
        pods: &HashMap<String, PodInfo>,
    ) -> Vec<Job> {
        gpu_booking_core::booking_units::beyond_units(booked)
            .into_iter()
            .filter_map(|uid| {
                let info = pods.get(&uid).filter(|p| p.served)?;
                let (Some(booking_id), Some(units)) = (info.booking_id, info.booking_units) else {
                    return None;
                };
                Some(job_for(info, Reason::BeyondBooking { booking_id, units }))
            })
            .collect()
    }

    /// The backstop of the webhook's lend ledger: lent pods that waited past
    /// `--lent-pending-grace` for a GPU the scheduler has no room for are recreated
    /// CPU-only (core's [`pending_lent`] decides).
    pub(super) fn lent_due_on_cpu(&mut self, pods: &HashMap<String, PodInfo>) -> Vec<Job> {
        let grace = self.args.lent_pending_grace;
        let due: Vec<Job> = self
            .pending_lent
            .iter()
            .filter_map(|(uid, since)| {
                let pod = pods.get(uid)?;
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
        for job in &due {
            // Another look only after another grace, whatever comes of this one.
            self.pending_lent.insert(job.uid.clone(), Instant::now());
            tracing::info!(pod = %format!("{}/{}", job.namespace, job.name), ?grace, "lent pod waits for a GPU that is not there; recreating it CPU-only");
        }
        due
    }

    /// One round: for each booked pod that the scheduler cannot place (oldest
    /// first), core's eviction order decides whether room is free or on its way (a
    /// victim still terminating counts), which lent pods give way, or that none can.
    /// Rounds for one pod are bounded (`--preemption-attempts`) and spaced
    /// (`--preemption-retry`, doubled each time). Nothing but the cluster's state
    /// decides: no request from outside can end a pod. Returns the evictions to
    /// start now (a dry run's); the others start once their round is recorded
    /// ([`Msg::RoundRecorded`]).
    pub(super) fn round(&mut self, expiry: &Expiry, inventory: &Inventory) -> Vec<Job> {
        let Some(models) = inventory.models() else {
            return Vec::new();
        };
        let pods = expiry.pods();
        let pending = &self.pending;
        self.attempts.retain(|uid, _| pending.contains(uid));
        let mut pending_pods: Vec<&PodInfo> = self
            .pending
            .iter()
            .filter_map(|uid| pods.get(uid))
            .collect();
        pending_pods.sort_by(|a, b| {
            (a.started, &a.namespace, &a.name).cmp(&(b.started, &b.namespace, &b.name))
        });
        let cfg = self.ctx.cfg.current();
        // Pods marked to give way are on their way out: their room is counted as
        // coming, so that no second pod is chosen for it.
        let mut going = expiry.in_flight().clone();
        going.extend(pods.values().filter(|p| marked(p)).map(|p| p.uid.clone()));
        self.chosen.retain(|uid, (since, _)| {
            since.elapsed() < CHOSEN_FOR
                && !going.contains(uid)
                && pods.get(uid).is_some_and(|p| !p.deleting && !p.finished)
        });
        let chosen: HashMap<String, String> = self
            .chosen
            .iter()
            .map(|(uid, (_, booked))| (uid.clone(), booked.clone()))
            .collect();
        going.extend(chosen.keys().cloned());
        let waiting: HashSet<String> = pending_pods.iter().map(|p| p.key()).collect();
        let view = View {
            pods,
            nodes: inventory.nodes(),
            node_labels: inventory.node_labels(),
            models,
            generic: &cfg.gpu_resources,
            gpumem_resource: &cfg.gpumem_resource,
            model_node_label: &self.args.admission.model_node_label,
            going: &going,
            chosen: &chosen,
            waiting: &waiting,
            cushion_mib: self.args.preemption_vram_cushion,
            policy: &self.ctx.policy,
        };
        let mut round = Round::new(&view);
        let now = Instant::now();
        let mut jobs = Vec::new();
        let mut notes = Vec::new();
        let mut waiting_now = Vec::new();
        let mut freeing = BTreeMap::new();
        for pod in pending_pods {
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
            if !matches!(
                decision,
                victims::Decision::NoRoom(_) | victims::Decision::Ending { .. }
            ) {
                state.waiting = None;
            }
            match decision {
                victims::Decision::Fits { .. } => {
                    // Its room may be a marked pod's: its user learns when.
                    let key = pod.key();
                    let ends = round
                        .relied()
                        .iter()
                        .filter(|(_, booked)| **booked == key)
                        .filter_map(|(uid, _)| pods.get(uid))
                        .filter_map(|p| p.preempt_at)
                        .max();
                    if let (Some(ends), Some(id)) = (ends, pod.booking_id) {
                        freeing.insert(id, freeing_reason(&model, ends));
                    }
                }
                victims::Decision::Ending { node } => {
                    // Its room is held by a pod on its way out: said on the pod (its
                    // last Event may blame pods that do not give way) and on its
                    // booking.
                    let reason = ending_reason(&model);
                    if state.waiting.as_deref() != Some(reason.as_str()) {
                        tracing::info!(pod = %pod.key(), %model, %node, "booked pod waits for a pod that is ending");
                        notes.push((
                            pod.clone(),
                            "WaitingForGpu",
                            format!("gpu-booking: {reason}"),
                        ));
                        state.waiting = Some(reason.clone());
                    }
                    if let Some(id) = pod.booking_id {
                        freeing.insert(id, reason);
                    }
                }
                victims::Decision::NoRoom(shortfall) => {
                    let reason = waiting_reason(&model, &shortfall);
                    if state.waiting.as_deref() != Some(reason.as_str()) {
                        if state.waiting.is_none() {
                            self.ctx.metrics.action("preempt", "no_victim");
                        }
                        tracing::info!(pod = %pod.key(), %model, %reason, "booked pod waits; no pod that may give way can make room");
                        notes.push((
                            pod.clone(),
                            "WaitingForGpu",
                            format!("gpu-booking: {reason}"),
                        ));
                        state.waiting = Some(reason.clone());
                    }
                    waiting_now.push(Waiting {
                        booking_id: pod.booking_id,
                        model: model.clone(),
                        held_by: shortfall.kept.keys().cloned().collect(),
                        reason,
                    });
                    continue;
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
                    for uid in &victims {
                        self.chosen.insert(uid.clone(), (now, pod.key()));
                    }
                    let names: Vec<String> = victims
                        .iter()
                        .filter_map(|uid| pods.get(uid))
                        .map(|victim| {
                            round_jobs.push(job_for(victim, reason.clone()));
                            victim.key()
                        })
                        .collect();
                    jobs.push((pod.clone(), state.rounds, round_jobs));
                    tracing::info!(pod = %pod.key(), %model, %node, victims = ?names, round = state.rounds, "preempting for a booked pod");
                    let when = if self.args.preemption_grace.is_zero() {
                        "now".to_owned()
                    } else {
                        format!(
                            "at {} UTC, after warning their users",
                            (self.ctx.clock.now() + grace_of(&self.args)).format("%H:%M:%S")
                        )
                    };
                    notes.push((pod.clone(), "PreemptingForBooking", format!(
                        "gpu-booking ends the lent {model} pod(s) {} on node {node} (least recently GPU-active) {when} to make room for this pod (round {} of {})",
                        names.join(", "),
                        state.rounds,
                        self.args.preemption_attempts
                    )));
                }
            }
        }
        self.publish_waiting(waiting_now);
        self.freeing = freeing;
        self.relied = round.relied().clone();
        let mut start_now = Vec::new();
        for (pod, rounds, round_jobs) in jobs {
            start_now.extend(self.record_round(&pod, rounds, round_jobs));
        }
        if self.ctx.dry_run {
            return start_now;
        }
        for (pod, reason, message) in notes {
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let at = actions::PodRef::from(&pod);
                actions::note_pod(&ctx, &at, reason, &message, "Preempt").await;
            });
        }
        start_now
    }

    /// The victims of a round that could not be recorded: free to be chosen again.
    pub(super) fn unchoose(&mut self, jobs: &[Job]) {
        for job in jobs {
            self.chosen.remove(&job.uid);
        }
    }

    /// The victims of a recorded round: with `--preemption-grace`, each is marked
    /// (its deadline and booked pod written on it, a Warning Event, an audit row that
    /// notices its user) and ended at the deadline by [`Self::settle_marked`];
    /// returns those to end now (no grace, a dry run, or a namespace where the
    /// controller may only delete: it cannot mark there).
    pub(super) fn mark(&self, jobs: Vec<Job>, pods: &HashMap<String, PodInfo>) -> Vec<Job> {
        let grace = grace_of(&self.args);
        if grace.is_zero() || self.ctx.dry_run {
            return jobs;
        }
        let deadline = self.ctx.clock.now() + grace;
        let mut now = Vec::new();
        for job in jobs {
            let Reason::Preempted {
                model, for_whom, ..
            } = &job.reason
            else {
                now.push(job);
                continue;
            };
            if !self.ctx.policy.serves(&job.namespace) {
                now.push(job);
                continue;
            }
            let (ctx, model, for_whom) = (self.ctx.clone(), model.clone(), for_whom.clone());
            // Whom the booking service notices: the victim's user.
            let user = pods.get(&job.uid).and_then(|p| p.user.clone());
            tokio::spawn(async move {
                mark_victim(&ctx, &job, user, &model, &for_whom, deadline).await;
            });
        }
        now
    }

    /// The marked pods at each tick: ended once their deadline passed while a booked
    /// pod still waits for their room (the jobs returned), unmarked (and their users
    /// told) once none does; core decides ([`marked_fate`]). The booked pod is the
    /// one named on the pod while it waits, else the one the last round counted on
    /// the pod for ([`Round::relied`]; the name on the pod is moved to it): the card
    /// freed for one booked pod may have gone to another, whose own marked pod then
    /// frees the first one's.
    pub(super) fn settle_marked(&mut self, pods: &HashMap<String, PodInfo>) -> Vec<Job> {
        let now = self.ctx.clock.now();
        let waiting: HashSet<String> = self
            .pending
            .iter()
            .filter_map(|uid| pods.get(uid))
            .map(PodInfo::key)
            .collect();
        let retry = self.args.preemption_interval.max(Duration::from_secs(5));
        self.unmarking
            .retain(|uid, since| pods.get(uid).is_some_and(marked) && since.elapsed() < retry);
        let mut due = Vec::new();
        for pod in pods.values().filter(|p| marked(p)) {
            let (Some(deadline), Some(named)) = (pod.preempt_at, pod.preempt_for.as_ref()) else {
                continue;
            };
            let relier = self.relied.get(&pod.uid);
            let for_whom = if waiting.contains(named) {
                Some(named)
            } else {
                relier.filter(|b| waiting.contains(*b))
            };
            if for_whom.is_none() && relier.is_some() {
                // Counted on by a booked pod that no longer waits: the next round
                // says whether another one does.
                continue;
            }
            if let Some(other) = for_whom.filter(|b| *b != named) {
                if !self.unmarking.contains_key(&pod.uid) && !self.ctx.dry_run {
                    self.unmarking.insert(pod.uid.clone(), Instant::now());
                    let (ctx, pod, other) = (self.ctx.clone(), pod.clone(), other.clone());
                    tokio::spawn(async move { name_booked_pod(&ctx, &pod, &other).await });
                }
            }
            match marked_fate(deadline, now, for_whom.is_some()) {
                Marked::Wait => {}
                Marked::End => {
                    let for_whom = for_whom.unwrap_or(named);
                    let booked = pods.values().find(|b| b.key() == *for_whom);
                    let model = pod
                        .model_label
                        .clone()
                        .or_else(|| pod.gpu.as_ref().and_then(|g| g.model.clone()))
                        .unwrap_or_default();
                    due.push(job_for(
                        pod,
                        Reason::Preempted {
                            model,
                            for_whom: for_whom.clone(),
                            attempt: booked.map_or(0, |b| b.preemption_rounds),
                        },
                    ));
                }
                Marked::Unmark => {
                    if self.unmarking.contains_key(&pod.uid) || self.ctx.dry_run {
                        continue;
                    }
                    self.unmarking.insert(pod.uid.clone(), Instant::now());
                    let (ctx, pod) = (self.ctx.clone(), pod.clone());
                    tokio::spawn(async move { unmark_victim(&ctx, &pod).await });
                }
            }
        }
        due
    }

    /// Writes the round's number on the booked pod ([`PREEMPTION_ROUNDS_ANNOTATION`],
    /// guarded by its uid), then its evictions start ([`Msg::RoundRecorded`]):
    /// whichever replica leads next reads it back, so `--preemption-attempts` bounds
    /// the rounds for a pod however often the leader changes. A dry run writes
    /// nothing and returns the evictions to start at once.
    fn record_round(&self, pod: &PodInfo, rounds: u32, jobs: Vec<Job>) -> Vec<Job> {
        if self.ctx.dry_run {
            return jobs;
        }
        let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), pod.uid.clone());
        tokio::spawn(async move {
            let at = actions::PodRef {
                namespace: &namespace,
                name: &name,
                uid: &uid,
            };
            let annotations = json!({PREEMPTION_ROUNDS_ANNOTATION: rounds.to_string()});
            let written = match actions::annotate(&ctx, &at, annotations).await {
                Annotated::Halted => return,
                Annotated::Written => true,
                Annotated::Failed(e) => {
                    ctx.metrics.action("preempt", "error");
                    ctx.metrics.error("kubernetes");
                    tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "could not record the preemption round on the booked pod; no eviction this round");
                    false
                }
            };
            let _ = tx.send(Msg::RoundRecorded(jobs, written));
        });
        Vec::new()
    }
}

/// A lent pod chosen to give way after a warning, not ended yet: where the
/// controller serves, not terminating.
fn marked(pod: &PodInfo) -> bool {
    pod.preempt_at.is_some() && pod.served && !pod.deleting && pod.priority == Some(Priority::Low)
}

/// How long a pod chosen to give way counts as going without the watch showing it
/// marked or going (a mark or a round not written: the next round may choose again).
const CHOSEN_FOR: Duration = Duration::from_secs(15);

/// `--preemption-grace` as a time span.
fn grace_of(args: &ControllerArgs) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(args.preemption_grace).unwrap_or(chrono::TimeDelta::MAX)
}

/// Marks `job`'s pod to end at `deadline` for the booked pod `for_whom`: the
/// annotations (guarded by its uid), a Warning Event for its user, an audit row
/// naming `user` (the booking service notices them from it, by mail or webhook as
/// they chose).
async fn mark_victim(
    ctx: &Ctx,
    job: &Job,
    user: Option<String>,
    model: &str,
    for_whom: &str,
    deadline: chrono::DateTime<chrono::Utc>,
) {
    let at = deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let key = format!("{}/{}", job.namespace, job.name);
    let at_pod = actions::PodRef {
        namespace: &job.namespace,
        name: &job.name,
        uid: &job.uid,
    };
    let annotations = json!({PREEMPT_AT_ANNOTATION: at, PREEMPT_FOR_ANNOTATION: for_whom});
    match actions::annotate(ctx, &at_pod, annotations).await {
        Annotated::Written => {}
        Annotated::Halted => return,
        Annotated::Failed(e) => {
            ctx.metrics.action("preempt", "error");
            ctx.metrics.error("kubernetes");
            tracing::warn!(pod = %key, error = %e, "could not mark the lent pod; the next round chooses again");
            return;
        }
    }
    ctx.metrics.action("preempt", "marked");
    tracing::info!(pod = %key, %model, booked = %for_whom, %at, "lent pod marked to give way");
    let message = format!(
        "gpu-booking: the {model} GPU lent to this notebook (no booking) is needed by a booked \
         user; the notebook ends at {} UTC unless that user gets a GPU elsewhere first. Save \
         your work now. A booking keeps a GPU.",
        deadline.format("%H:%M:%S")
    );
    actions::warn_pod(ctx, &at_pod, "GpuTakenBackSoon", &message, "Preempt").await;
    let report = gpu_booking_client::AuditReport {
        action: "controller.preempt_warned".into(),
        subject: Some(key),
        user,
        booking_id: None,
        details: json!({"model": model, "booked_pod": for_whom, "ends_at": at}),
    };
    if let Err(e) = ctx.booking.audit(&report).await {
        ctx.metrics.error("booking");
        tracing::warn!(error = %e, "could not record the warning in the audit log");
    }
}

/// Takes the mark off a pod whose booked pod no longer waits, and tells its user.
async fn unmark_victim(ctx: &Ctx, pod: &PodInfo) {
    let at = actions::PodRef::from(pod);
    let annotations = json!({PREEMPT_AT_ANNOTATION: null, PREEMPT_FOR_ANNOTATION: null});
    match actions::annotate(ctx, &at, annotations).await {
        Annotated::Written => {}
        Annotated::Halted => return,
        Annotated::Failed(e) => {
            ctx.metrics.action("preempt", "error");
            ctx.metrics.error("kubernetes");
            tracing::warn!(pod = %pod.key(), error = %e, "could not unmark the lent pod");
            return;
        }
    }
    ctx.metrics.action("preempt", "unmarked");
    tracing::info!(pod = %pod.key(), "lent pod no longer needed; unmarked");
    let message = "gpu-booking: the booked user no longer needs this notebook's GPU; it keeps \
                   running on it (it was lent, so it may be needed again)";
    actions::note_pod(ctx, &at, "GpuKept", message, "Preempt").await;
}

/// Names `for_whom` on a marked pod in place of the booked pod it was marked for,
/// which no longer waits: its deadline (and its user's warning) stand.
async fn name_booked_pod(ctx: &Ctx, pod: &PodInfo, for_whom: &str) {
    let at = actions::PodRef::from(pod);
    let annotations = json!({PREEMPT_FOR_ANNOTATION: for_whom});
    match actions::annotate(ctx, &at, annotations).await {
        Annotated::Written => {
            ctx.metrics.action("preempt", "moved");
            tracing::info!(pod = %pod.key(), booked = %for_whom, "marked pod now gives way to another booked pod");
        }
        Annotated::Halted => {}
        Annotated::Failed(e) => {
            ctx.metrics.action("preempt", "error");
            ctx.metrics.error("kubernetes");
            tracing::warn!(pod = %pod.key(), error = %e, "could not name the booked pod on the marked pod");
        }
    }
}

/// A booked pod that waits with no pod that may give way.
#[derive(Debug, Clone)]
struct Waiting {
    booking_id: Option<i64>,
    model: String,
    /// Namespaces whose pods keep it waiting, in order.
    held_by: Vec<String>,
    reason: String,
}

/// The preemption rounds for one Pending booked pod.
#[derive(Debug, Default)]
struct Attempts {
    rounds: u32,
    /// No round before this.
    next: Option<Instant>,
    gave_up: bool,
    /// Why it waits, as last told (an Event when it changes).
    waiting: Option<String>,
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
