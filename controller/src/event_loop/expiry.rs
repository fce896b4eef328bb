//! The loop's expiry part: the pods it knows, a timer per booked pod, the actions
//! under way, and the sweep that finishes actions another leader left unfinished.
//! Every action on a pod starts here ([`Expiry::start`]), whoever decided it, so
//! that one pod never has two at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::time::{delay_queue, DelayQueue};

use super::{job_for, Msg};
use crate::actions::{self, Ctx, Job, Outcome, Reason};
use crate::clock::until;
use crate::intent::Intent;
use crate::pods::PodInfo;

/// Before an action that failed is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

pub(super) struct Expiry {
    ctx: Arc<Ctx>,
    tx: mpsc::UnboundedSender<Msg>,
    /// The relevant pods (booked, lent, ours), by uid.
    pods: HashMap<String, PodInfo>,
    timers: DelayQueue<String>,
    timer_keys: HashMap<String, (delay_queue::Key, Option<chrono::DateTime<chrono::Utc>>)>,
    /// Pods with an action under way.
    in_flight: HashSet<String>,
    /// A sweep of recorded actions is running.
    sweeping: bool,
    /// The pods listed so far by a watch (re)start: the others are gone at its end.
    init_pods: Option<HashSet<String>>,
    /// The pod watch has listed every pod since it (re)started.
    pods_synced: bool,
}

impl Expiry {
    pub(super) fn new(ctx: Arc<Ctx>, tx: mpsc::UnboundedSender<Msg>) -> Self {
        Self {
            ctx,
            tx,
            pods: HashMap::new(),
            timers: DelayQueue::new(),
            timer_keys: HashMap::new(),
            in_flight: HashSet::new(),
            sweeping: false,
            init_pods: None,
            pods_synced: false,
        }
    }

    pub(super) fn pods(&self) -> &HashMap<String, PodInfo> {
        &self.pods
    }

    /// Pods with an action under way (a victim on its way out counts as going).
    pub(super) fn in_flight(&self) -> &HashSet<String> {
        &self.in_flight
    }

    pub(super) fn pods_synced(&self) -> bool {
        self.pods_synced
    }

    pub(super) fn timer_count(&self) -> usize {
        self.timers.len()
    }

    pub(super) fn has_timers(&self) -> bool {
        !self.timers.is_empty()
    }

    /// The uid of the next timer that fires.
    pub(super) async fn next_expired(&mut self) -> Option<String> {
        self.timers.next().await.map(|expired| expired.into_inner())
    }

    fn leader(&self) -> bool {
        self.ctx.leadership.is_leader()
    }

    // ---- the pod watch ------------------------------------------------------------

    /// The pod watch (re)starts its listing.
    pub(super) fn listing_started(&mut self) {
        self.init_pods = Some(HashSet::new());
    }

    /// A pod read by the watch, relevant or not.
    pub(super) fn listed(&mut self, uid: &str) {
        if let Some(seen) = &mut self.init_pods {
            seen.insert(uid.to_owned());
        }
    }

    /// The listing ended: the pods it did not list are gone (returned, for the loop
    /// to forget everywhere).
    pub(super) fn listing_done(&mut self) -> Vec<String> {
        self.pods_synced = true;
        let Some(seen) = self.init_pods.take() else {
            return Vec::new();
        };
        self.pods
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect()
    }

    /// The models' resources changed: the pods are read again before the loop is
    /// ready.
    pub(super) fn unsync(&mut self) {
        self.pods_synced = false;
    }

    /// Keeps a relevant pod (its timer armed by [`Expiry::schedule`] first).
    pub(super) fn insert(&mut self, info: PodInfo) {
        self.pods.insert(info.uid.clone(), info);
    }

    /// Forgets a pod and its timer, and wakes whoever waits for it to go.
    pub(super) fn remove(&mut self, uid: &str) -> Option<PodInfo> {
        let info = self.pods.remove(uid);
        self.cancel_timer(uid);
        self.ctx.gone.fire(uid);
        info
    }

    // ---- timers -----------------------------------------------------------------

    /// Arms, moves or cancels the pod's expiry timer.
    pub(super) fn schedule(&mut self, info: &PodInfo) {
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
    pub(super) fn on_timer(&mut self, uid: String) {
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

    /// Elected: finishes what other leaders left, re-arms every timer and ends the
    /// pods the scheduler preempted meanwhile.
    pub(super) fn on_elected(&mut self) {
        tracing::debug!(pods = self.pods.len(), "elected: re-arming timers");
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

    /// Runs an action on its own task, unless this replica does not lead or the pod
    /// has one under way; its end comes back as [`Msg::Done`].
    pub(super) fn start(&mut self, job: Job) {
        // Every action starts here: none outside the namespaces it may act in,
        // whatever asked for it.
        if !self.ctx.policy.acts_in(&job.namespace) {
            self.ctx.metrics.action(job.reason.metric(), "skipped");
            tracing::debug!(pod = %format!("{}/{}", job.namespace, job.name), "not acting outside the served namespaces");
            return;
        }
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

    /// An action ended: a failed one is tried again after [`RETRY_AFTER`].
    pub(super) fn done(&mut self, job: &Job, outcome: &Outcome) {
        self.in_flight.remove(&job.uid);
        if matches!(outcome, Outcome::Failed(_)) && self.pods.contains_key(&job.uid) {
            self.arm(&job.uid, RETRY_AFTER, None);
        }
    }

    /// Looks for recorded two-step actions that no replica is finishing (this
    /// replica's own in-flight ones are skipped by `start`) and finishes them.
    pub(super) fn sweep_intents(&mut self) {
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

    /// The sweep ended: finishes each intent it found.
    pub(super) fn swept(&mut self, found: Option<Vec<Intent>>) {
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
}
