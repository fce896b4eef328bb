//! Carrying out one action on one pod: end a booked pod whose time is up, preempt a
//! low-priority pod, or recreate a pod kube-scheduler preempted. Each action re-reads
//! the pod first (the watch may lag), checks leadership before every write, leaves a
//! Kubernetes Event on the pod and an audit row in the booking service.
//!
//! Two-step actions (end the pod, then put its replacement in its place: the CPU-only
//! copy, the lent copy, or the hub's restart) are recorded as an [`intent`] before the
//! first step and driven by [`finish`], step by step as `core::intent::next_step`
//! says, so that whichever replica leads next finishes one that this replica could not
//! (killed in between): the sweep of intents starts a [`Reason::Resumed`] job for each.
//!
//! Leadership: every write that starts an action (the intent, delete, patch) needs the
//! Lease. The one write done without it is the replacement that completes an action
//! whose first step already happened: skipping it would lose the user's pod, and it
//! cannot clash with a new leader (the same name: a second create fails with
//! AlreadyExists, which counts as done).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_booking_client::AuditReport;
use gpu_booking_core::admission::{named_user, pod_label, BOOKING_LABEL, USERNAME_KEY};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::booking::Booking;
use crate::clock::SharedClock;
use crate::config::OnExpiry;
use crate::hub::{Hub, HubError, ServerState};
use crate::intent::{self, Intent, Replacement};
use crate::leader::Leadership;
use crate::live_config::LiveConfig;
use crate::metrics::Metrics;
use crate::pods::{PodInfo, PodLite};
use crate::recreate::{cpu_only_copy, lent_copy};
use gpu_booking_core::pod_action::{self, Mode, Plan, PodFacts, Trigger};

/// Why a pod is acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A booked pod reached its `terminate-at`.
    Expired { terminate_at: DateTime<Utc> },
    /// A low-priority pod gives its unit of `model` to a booked pod that waits for
    /// one (`for_whom`, `namespace/name`); `attempt` counts the rounds for that pod.
    Preempted {
        model: String,
        for_whom: String,
        attempt: u32,
    },
    /// kube-scheduler is evicting a pod of ours for a pod of higher priority.
    SchedulerPreempted,
    /// A two-step action recorded by this or another replica, to be finished.
    Resumed(Box<Intent>),
    /// A high-priority pod beyond its booking's units (the newest of the booking's
    /// pods go first): it goes on as a lent pod.
    BeyondBooking { booking_id: i64, units: u64 },
    /// A lent pod waited longer than the grace for a GPU that the scheduler has no
    /// room for (it was lent beyond the free units).
    LentPending,
}

impl Reason {
    pub fn metric(&self) -> &'static str {
        match self {
            Reason::Expired { .. } => "expire",
            Reason::Preempted { .. } => "preempt",
            Reason::SchedulerPreempted => "scheduler_preempted",
            Reason::Resumed(_) => "resume",
            Reason::BeyondBooking { .. } => "beyond_booking",
            Reason::LentPending => "lent_pending",
        }
    }

    fn event_reason(&self) -> &'static str {
        match self {
            Reason::Expired { .. } => "BookingEnded",
            Reason::Preempted { .. } => "PreemptedForBooking",
            Reason::SchedulerPreempted => "PreemptedByScheduler",
            Reason::Resumed(_) => "ActionResumed",
            Reason::BeyondBooking { .. } => "BeyondBooking",
            Reason::LentPending => "NoFreeGpu",
        }
    }

    fn text(&self) -> String {
        match self {
            Reason::Expired { terminate_at } => format!(
                "the booking ended at {}",
                terminate_at.to_rfc3339_opts(SecondsFormat::Secs, true)
            ),
            Reason::Preempted {
                model, for_whom, ..
            } => {
                format!(
                    "its {model} GPU was lent and is now needed by a booked pod ({for_whom}); \
                     it was the least recently GPU-active lent pod that makes room"
                )
            }
            Reason::SchedulerPreempted => {
                "kube-scheduler preempted it for a pod of higher priority".into()
            }
            Reason::Resumed(intent) => format!(
                "finishing an action recorded at {} ({})",
                intent.created_text(),
                intent.reason
            ),
            Reason::BeyondBooking { booking_id, units } => format!(
                "booking {booking_id} is for {units} GPU{}, which the user's older pods hold; \
                 this pod goes on as a lent pod (it may be reclaimed for a booked user)",
                if *units == 1 { "" } else { "s" }
            ),
            Reason::LentPending => "it was lent a GPU without a booking, but no GPU was free \
                 for it (more were lent at once than there are); it runs on CPU instead of waiting"
                .into(),
        }
    }
}

/// One action to carry out.
#[derive(Debug, Clone)]
pub struct Job {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub reason: Reason,
}

/// What came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Recreated,
    /// JupyterHub stopped the server and started it again.
    Restarted,
    Deleted,
    Demoted,
    DryRun,
    /// Nothing to do (any more): the pod is gone, changed, or we are not the leader.
    Skipped(&'static str),
    Failed(String),
}

impl Outcome {
    pub fn metric(&self) -> &'static str {
        match self {
            Outcome::Recreated => "recreated",
            Outcome::Restarted => "restarted",
            Outcome::Deleted => "deleted",
            Outcome::Demoted => "demoted",
            Outcome::DryRun => "dry_run",
            Outcome::Skipped(_) => "skipped",
            Outcome::Failed(_) => "error",
        }
    }
}

/// Pods being waited for, by uid: the watch says when each is gone.
#[derive(Default, Clone)]
pub struct GoneSignals(Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>);

impl GoneSignals {
    fn wait(&self, uid: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), tx);
        rx
    }

    /// The pod with `uid` is gone.
    pub fn fire(&self, uid: &str) {
        if let Some(tx) = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid) {
            let _ = tx.send(());
        }
    }

    fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

/// Everything an action needs.
pub struct Ctx {
    pub client: kube::Client,
    pub booking: Arc<dyn Booking>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leadership: Arc<Leadership>,
    pub clock: SharedClock,
    /// The admission configuration, the models' own resources learned
    /// (the event loop's and the actions' one configuration).
    pub cfg: LiveConfig,
    pub on_expiry: OnExpiry,
    pub dry_run: bool,
    pub gone: GoneSignals,
    pub gone_timeout: Duration,
    /// JupyterHub's API (`--on-expiry hub-restart`).
    pub hub: Option<Arc<Hub>>,
    /// Where intents are recorded (the controller's own namespace).
    pub intent_namespace: String,
    /// Where it acts and which pods give way to booked ones.
    pub policy: gpu_booking_core::preemption_policy::PreemptionPolicy,
    /// Cancelled when the controller is killed: actions stop where they are.
    pub halt: tokio_util::sync::CancellationToken,
}

/// Why an action on a pod failed (it is tried again: [`Outcome::Failed`]).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Read(kube::Error),
    #[error("reading the pod: {0}")]
    Reread(kube::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Copy(#[from] crate::recreate::CopyError),
    #[error("deleting: {0}")]
    Delete(kube::Error),
    #[error("creating the pod's copy: {0}")]
    Create(kube::Error),
    #[error("creating the pod's copy: the old pod is still there")]
    OldPodStays,
    #[error("the pod was not gone within {0:?}; not replaced yet")]
    NotGone(Duration),
    #[error("not finished after {0} steps")]
    Unfinished(usize),
    #[error("the pod names no JupyterHub user")]
    NoHubUser,
    #[error("a hub restart was recorded but --hub-api-url is not set")]
    NoHub,
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
    #[error(transparent)]
    Intent(#[from] intent::IntentError),
}

/// Delays between attempts of a write that failed for a passing reason.
const BACKOFF: [u64; 7] = [200, 500, 1_000, 2_000, 5_000, 10_000, 30_000];
/// How often a pod we wait for is re-read, in case its DELETED event was missed.
const GONE_RECHECK: Duration = Duration::from_secs(5);
/// An intent not finished within this is given up (logged, an Event, counted), so
/// that one that can never finish is not retried for ever.
const ABANDON_AFTER: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// Steps [`finish`] takes at most in one go (a whole action takes three).
const MAX_STEPS: usize = 6;

pub(crate) fn pods(ctx: &Ctx, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), ns, &ApiResource::erase::<Pod>(&()))
}

/// A failure worth another try: the server or the connection, not the request.
fn passing(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        _ => true,
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Runs `job` to its end and counts it.
pub async fn run(ctx: &Ctx, job: &Job) -> Outcome {
    let outcome = match carry_out(ctx, job).await {
        Ok(outcome) => outcome,
        Err(e) => {
            ctx.metrics.error("kubernetes");
            Outcome::Failed(e.to_string())
        }
    };
    ctx.metrics.action(job.reason.metric(), outcome.metric());
    if let (Reason::Preempted { model, .. }, Outcome::Recreated | Outcome::Deleted) =
        (&job.reason, &outcome)
    {
        ctx.metrics.eviction(model, "booked_pod_pending");
    }
    match &outcome {
        Outcome::Failed(e) => {
            tracing::warn!(pod = %format!("{}/{}", job.namespace, job.name), action = job.reason.metric(), error = %e, "action failed")
        }
        Outcome::Skipped(why) => {
            tracing::debug!(pod = %format!("{}/{}", job.namespace, job.name), why, "action skipped")
        }
        done => {
            tracing::info!(pod = %format!("{}/{}", job.namespace, job.name), action = job.reason.metric(), outcome = done.metric(), reason = %job.reason.text(), "acted")
        }
    }
    outcome
}

async fn carry_out(ctx: &Ctx, job: &Job) -> Result<Outcome, ActionError> {
    if !ctx.leadership.is_leader() {
        return Ok(Outcome::Skipped("not the leader"));
    }
    if let Reason::Resumed(intent) = &job.reason {
        return resume(ctx, job, intent).await;
    }
    let api = pods(ctx, &job.namespace);
    let Some(obj) = api.get_opt(&job.name).await.map_err(ActionError::Read)? else {
        return Ok(Outcome::Skipped("gone"));
    };
    let pod = serde_json::to_value(&obj)?;
    if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(job.uid.as_str()) {
        return Ok(Outcome::Skipped("replaced by another pod"));
    }
    // Classified as the watch does: a `priority=high` label counts only with our
    // high class (`core::admission::marks`).
    let cfg = ctx.cfg.current();
    let info = serde_json::from_value::<PodLite>(pod.clone())
        .ok()
        .and_then(|lite| PodInfo::from_pod(&lite, &cfg));
    let owned = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| !o.is_empty());
    let facts = PodFacts {
        standing: info.as_ref().and_then(|i| i.priority),
        deleting: pod.pointer("/metadata/deletionTimestamp").is_some(),
        terminate_at: pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(&cfg.terminate_at_annotation))
            .and_then(Value::as_str)
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        booking_id: info.as_ref().and_then(|i| i.booking_id),
        waiting_for_gpu: info
            .as_ref()
            .is_some_and(|i| i.node.is_none() && i.unschedulable_for_gpu),
        owned,
        hub_server: hub_server(&pod).is_some(),
        delete_only: ctx.policy.delete_only(&job.namespace),
    };
    let trigger = match &job.reason {
        Reason::Expired { .. } => Trigger::Expired,
        Reason::Preempted { .. } => Trigger::Preempted,
        Reason::SchedulerPreempted => Trigger::SchedulerPreempted,
        Reason::LentPending => Trigger::LentPending,
        Reason::BeyondBooking { booking_id, .. } => Trigger::BeyondBooking {
            booking_id: *booking_id,
        },
        Reason::Resumed(_) => unreachable!("handled above"),
    };
    let mode = match pod_action::plan(
        trigger,
        &facts,
        ctx.on_expiry,
        ctx.hub.is_some(),
        ctx.clock.now(),
    ) {
        Plan::Act(mode) => mode,
        Plan::Skip(why) => return Ok(Outcome::Skipped(why)),
    };
    if ctx.dry_run {
        tracing::info!(pod = %format!("{}/{}", job.namespace, job.name), mode = ?mode, reason = %job.reason.text(), "dry run: would act");
        return Ok(Outcome::DryRun);
    }
    if let Reason::Expired { terminate_at } = &job.reason {
        let lag = (ctx.clock.now() - *terminate_at)
            .to_std()
            .unwrap_or_default();
        ctx.metrics.expiry_lag.observe(lag.as_secs_f64());
    }
    let outcome = match mode {
        Mode::Demote => recreate(ctx, job, &api, &pod, ReplacementCopy::Lent).await?,
        Mode::Delete => {
            note(
                ctx,
                job,
                &job.uid,
                &format!(
                    "Deleted: {}{}",
                    job.reason.text(),
                    if owned {
                        "; its owner recreates it"
                    } else {
                        ""
                    }
                ),
                "Delete",
            )
            .await;
            delete(ctx, job, &api).await?
        }
        Mode::RecreateCpu => recreate(ctx, job, &api, &pod, ReplacementCopy::CpuOnly).await?,
        Mode::HubRestart => restart(ctx, job, &api, &pod).await?,
    };
    audit(ctx, job, &pod, &outcome).await;
    Ok(outcome)
}

/// Deletes the pod with this uid (never a newer pod of the same name).
async fn delete(ctx: &Ctx, job: &Job, api: &Api<DynamicObject>) -> Result<Outcome, ActionError> {
    delete_if(ctx, job, api, None).await
}

/// [`delete`], and only while the pod is at `version` (its `resourceVersion`) when
/// given: a pod that changed since it was read (e.g. bound to a node) is left alone.
async fn delete_if(
    ctx: &Ctx,
    job: &Job,
    api: &Api<DynamicObject>,
    version: Option<&str>,
) -> Result<Outcome, ActionError> {
    if !ctx.leadership.is_leader() {
        return Ok(Outcome::Skipped("not the leader"));
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(job.uid.clone()),
            resource_version: version.map(str::to_owned),
        }),
        ..DeleteParams::default()
    };
    match with_retries(|| api.delete(&job.name, &params)).await {
        Ok(_) => Ok(Outcome::Deleted),
        Err(e) if version.is_some() && is_code(&e, 409) => Ok(Outcome::Skipped("changed")),
        Err(e) if is_code(&e, 404) || is_code(&e, 409) => Ok(Outcome::Skipped("gone")),
        Err(e) => Err(ActionError::Delete(e)),
    }
}

/// Which copy replaces the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplacementCopy {
    CpuOnly,
    /// Lent (low priority) with its GPU; CPU-only when the pod names no model.
    Lent,
}

async fn recreate(
    ctx: &Ctx,
    job: &Job,
    _api: &Api<DynamicObject>,
    pod: &Value,
    kind: ReplacementCopy,
) -> Result<Outcome, ActionError> {
    let reason = job.reason.text();
    let cfg = ctx.cfg.current();
    let lent = match kind {
        ReplacementCopy::Lent => lent_copy(pod, &cfg)?,
        ReplacementCopy::CpuOnly => None,
    };
    let (copy, demoted) = match lent {
        Some(copy) => (copy, true),
        None => (
            cpu_only_copy(pod, &cfg, &format!("GPU removed: {reason}"))?,
            false,
        ),
    };
    let mut copy = copy;
    // The intent checks that the copy replaces this pod: say so in its metadata.
    copy["metadata"]["namespace"] = json!(job.namespace);
    let intent = new_intent(job, Replacement::Copy { pod: copy, demoted });
    // A lent pod waiting for a GPU is replaced only as it was read: still unbound.
    let version = match job.reason {
        Reason::LentPending => pod
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
        _ => None,
    };
    begin(ctx, job, &intent, version).await
}

/// `--on-expiry hub-restart`: the hub stops the server and starts it again.
async fn restart(
    ctx: &Ctx,
    job: &Job,
    api: &Api<DynamicObject>,
    pod: &Value,
) -> Result<Outcome, ActionError> {
    let Some((user, server)) = hub_server(pod) else {
        return Err(ActionError::NoHubUser);
    };
    let hub = hub(ctx).ok_or(ActionError::NoHub)?;
    // Through the hub only where it can restart the server; else the CPU-only copy,
    // so that a booked pod still leaves its GPU on time.
    let state = if hub.usable() {
        match hub.state(&user, &server).await {
            Ok(state) => Some(state),
            Err(HubError::Forbidden(_)) => {
                refused(ctx, hub);
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    let without_hub = match state {
        None => Some("JupyterHub refused the controller's token (it needs the `servers` scope)"),
        Some(ServerState::NoSuchUser) => Some("JupyterHub knows no such user"),
        Some(_) => None,
    };
    if let Some(why) = without_hub {
        ctx.metrics.action("hub_restart", "fallback");
        tracing::warn!(pod = %format!("{}/{}", job.namespace, job.name), %user, why, "recreating CPU-only instead of restarting through JupyterHub");
        return recreate(ctx, job, api, pod, ReplacementCopy::CpuOnly).await;
    }
    let intent = new_intent(job, Replacement::Hub { user, server });
    begin(ctx, job, &intent, None).await
}

/// The JupyterHub user and server name of a KubeSpawner pod (the raw names in its
/// annotations; "" for the default server). The annotations, not the labels: the
/// hub's API names users and servers by their raw names, and KubeSpawner 7 cleans the
/// label values (`GPU run` -> `gpu-run---64409e31`), which would name no server (or,
/// for a lossy slug, someone else's). The label is read only on a pod without the
/// server annotation (KubeSpawner before 4.0 wrote the label alone, raw).
fn hub_server(pod: &Value) -> Option<(String, String)> {
    let annotation = |key: &str| {
        pod.pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let user = annotation(USERNAME_KEY).filter(|u| !u.is_empty())?;
    let server = annotation(crate::hub::SERVER_NAME_KEY)
        .or_else(|| {
            pod.pointer("/metadata/labels")
                .and_then(|l| l.get(crate::hub::SERVER_NAME_KEY))
                .and_then(Value::as_str)
        })
        .unwrap_or_default();
    Some((user.to_owned(), server.to_owned()))
}

fn new_intent(job: &Job, replacement: Replacement) -> Intent {
    Intent {
        namespace: job.namespace.clone(),
        pod: job.name.clone(),
        uid: job.uid.clone(),
        action: job.reason.metric().to_owned(),
        reason: job.reason.text(),
        replacement,
        created: None,
    }
}

/// Records the intent (before anything changes), then carries it out. With
/// `version`, the original is ended only while it is at that `resourceVersion`; a pod
/// that changed since it was read is left alone and the intent dropped.
async fn begin(
    ctx: &Ctx,
    job: &Job,
    intent: &Intent,
    version: Option<&str>,
) -> Result<Outcome, ActionError> {
    if !ctx.leadership.is_leader() {
        return Ok(Outcome::Skipped("not the leader"));
    }
    intent::record(&ctx.client, &ctx.intent_namespace, intent).await?;
    note(
        ctx,
        job,
        &job.uid,
        &format!(
            "{}: {}",
            how(&intent.replacement, "Recreating", "Restarting"),
            intent.reason
        ),
        "Recreate",
    )
    .await;
    if let Some(version) = version {
        let api = pods(ctx, &job.namespace);
        match delete_if(ctx, job, &api, Some(version)).await? {
            Outcome::Deleted | Outcome::Skipped("gone") => {}
            other => {
                intent::forget(&ctx.client, &ctx.intent_namespace, &job.uid).await?;
                return Ok(other);
            }
        }
    }
    finish(ctx, job, intent).await
}

fn how(replacement: &Replacement, copy_verb: &str, hub_verb: &str) -> String {
    match replacement {
        Replacement::Copy { demoted: true, .. } => {
            format!("{copy_verb} as a lent pod (low priority, GPU kept)")
        }
        Replacement::Copy { demoted: false, .. } => format!("{copy_verb} without GPU"),
        Replacement::Hub { .. } => {
            format!("{hub_verb} through JupyterHub (the webhook admits the new pod)")
        }
    }
}

/// A recorded action found by the sweep: finished, or given up when too old.
async fn resume(ctx: &Ctx, job: &Job, intent: &Intent) -> Result<Outcome, ActionError> {
    if ctx.dry_run {
        tracing::info!(pod = %intent.key(), "dry run: would finish a recorded action");
        return Ok(Outcome::DryRun);
    }
    let too_old = intent
        .created
        .is_some_and(|at| ctx.clock.now() - at > ABANDON_AFTER);
    if too_old {
        ctx.metrics.action("resume", "gave_up");
        tracing::error!(pod = %intent.key(), recorded = %intent.created_text(), "a recorded action could not be finished in time; given up");
        note(
            ctx,
            job,
            &intent.uid,
            &format!(
                "gpu-booking gives up {} (recorded at {}): {}",
                how(&intent.replacement, "recreating it", "restarting it"),
                intent.created_text(),
                intent.reason
            ),
            "Recreate",
        )
        .await;
        intent::forget(&ctx.client, &ctx.intent_namespace, &intent.uid).await?;
        return Ok(Outcome::Skipped("given up"));
    }
    let outcome = finish(ctx, job, intent).await?;
    let shown = match &intent.replacement {
        Replacement::Copy { pod, .. } => pod.clone(),
        Replacement::Hub { user, .. } => {
            json!({"metadata": {"annotations": {USERNAME_KEY: user}}})
        }
    };
    if !matches!(outcome, Outcome::Skipped(_)) {
        audit(ctx, job, &shown, &outcome).await;
    }
    Ok(outcome)
}

/// Drives `intent` to its end from wherever it stands: ends the original if it still
/// runs, waits until it is gone, puts the replacement in its place, and removes the
/// intent. Safe to run again at any point (by this replica or the next leader).
pub async fn finish(ctx: &Ctx, job: &Job, intent: &Intent) -> Result<Outcome, ActionError> {
    use gpu_booking_core::intent::{next_step, PodNow, Step};
    let api = pods(ctx, &intent.namespace);
    let mut gone = ctx.gone.wait(&intent.uid);
    let result = async {
        for _ in 0..MAX_STEPS {
            let current = api
                .get_opt(&intent.pod)
                .await
                .map_err(ActionError::Reread)?;
            let now = match &current {
                None => PodNow::Absent,
                Some(p) => PodNow::Present {
                    uid: p.metadata.uid.as_deref().unwrap_or_default(),
                    terminating: p.metadata.deletion_timestamp.is_some(),
                },
            };
            match next_step(&intent.uid, now) {
                Step::EndOriginal => {
                    if !ctx.leadership.is_leader() {
                        return Ok(Outcome::Skipped("not the leader"));
                    }
                    match &intent.replacement {
                        Replacement::Copy { .. } => match delete(ctx, job, &api).await? {
                            Outcome::Deleted | Outcome::Skipped("gone") => {}
                            other => return Ok(other),
                        },
                        Replacement::Hub { user, server } => {
                            let hub = hub(ctx).ok_or(ActionError::NoHub)?;
                            match hub.stop(user, server).await {
                                Ok(()) => {}
                                Err(e @ (HubError::Forbidden(_) | HubError::UnknownUser)) => {
                                    // The hub cannot restart it: the CPU-only copy
                                    // instead, recorded before anything ends.
                                    if matches!(e, HubError::Forbidden(_)) {
                                        refused(ctx, hub);
                                    }
                                    let Some(pod) = current.as_ref() else {
                                        return Err(e.into());
                                    };
                                    let pod = serde_json::to_value(pod)?;
                                    intent::forget(&ctx.client, &ctx.intent_namespace, &intent.uid)
                                        .await?;
                                    ctx.metrics.action("hub_restart", "fallback");
                                    tracing::warn!(pod = %intent.key(), error = %e, "recreating CPU-only instead of restarting through JupyterHub");
                                    // Boxed: a recreate finishes its own intent here.
                                    return Box::pin(recreate(
                                        ctx,
                                        job,
                                        &api,
                                        &pod,
                                        ReplacementCopy::CpuOnly,
                                    ))
                                    .await;
                                }
                                Err(e) => return Err(e.into()),
                            }
                            // The hub no longer counts the server as running, so its
                            // poll leaves it alone; ending the pod ourselves too (this
                            // uid only) finishes a pod the hub has lost track of.
                            match delete(ctx, job, &api).await? {
                                Outcome::Deleted | Outcome::Skipped("gone") => {}
                                other => return Ok(other),
                            }
                        }
                    }
                }
                Step::AwaitGone => wait_gone(ctx, intent, &api, &mut gone).await?,
                Step::Replace => {
                    let outcome = replace(ctx, job, intent, &api).await?;
                    intent::forget(&ctx.client, &ctx.intent_namespace, &intent.uid).await?;
                    return Ok(outcome);
                }
                Step::Done => {
                    intent::forget(&ctx.client, &ctx.intent_namespace, &intent.uid).await?;
                    return Ok(Outcome::Skipped("already replaced"));
                }
            }
        }
        Err(ActionError::Unfinished(MAX_STEPS))
    }
    .await;
    ctx.gone.forget(&intent.uid);
    result
}

/// The hub refused the token: every restart falls back to the CPU-only copy from now
/// on (the gauge the critical alert reads says so).
pub fn refused(ctx: &Ctx, hub: &Hub) {
    if hub.usable() {
        tracing::error!("JupyterHub refused the controller's token; booked pods are recreated CPU-only instead of restarted until it has the `servers` scope");
    }
    hub.set_unusable();
    ctx.metrics.hub_usable.set(0);
}

/// JupyterHub's API, which a recorded hub restart needs (`None` is
/// [`ActionError::NoHub`] at the caller: a `Result` here would be as large as the
/// error).
fn hub(ctx: &Ctx) -> Option<&Hub> {
    ctx.hub.as_deref()
}

/// The second step: the copy created, or the hub asked to start the server.
async fn replace(
    ctx: &Ctx,
    job: &Job,
    intent: &Intent,
    api: &Api<DynamicObject>,
) -> Result<Outcome, ActionError> {
    let (outcome, created_uid) = match &intent.replacement {
        Replacement::Copy { pod, demoted } => {
            let copy: DynamicObject = serde_json::from_value(pod.clone())?;
            let created = create(api, &copy, &intent.uid).await?;
            let outcome = if *demoted {
                Outcome::Demoted
            } else {
                Outcome::Recreated
            };
            (outcome, created.metadata.uid)
        }
        Replacement::Hub { user, server } => {
            hub(ctx)
                .ok_or(ActionError::NoHub)?
                .start(user, server, ctx.gone_timeout)
                .await?;
            (Outcome::Restarted, None)
        }
    };
    let message = format!(
        "{}: {}",
        how(&intent.replacement, "Recreated", "Restarted"),
        intent.reason
    );
    // An action of its own: Events of one pod, reason and action form one series
    // (kube's recorder), so the hub's restart, noted on the pod that began it, would
    // otherwise only count up "Restarting".
    note(
        ctx,
        job,
        created_uid.as_deref().unwrap_or(&intent.uid),
        &message,
        "Replaced",
    )
    .await;
    Ok(outcome)
}

/// Until the pod with the intent's uid no longer exists: the watch's signal, with a
/// re-read now and then in case the signal was missed.
async fn wait_gone(
    ctx: &Ctx,
    intent: &Intent,
    api: &Api<DynamicObject>,
    gone: &mut oneshot::Receiver<()>,
) -> Result<(), ActionError> {
    let deadline = tokio::time::Instant::now() + ctx.gone_timeout;
    let mut signal_lost = false;
    loop {
        match api.get_opt(&intent.pod).await {
            Ok(None) => return Ok(()),
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(intent.uid.as_str()) => return Ok(()),
            Ok(Some(_)) | Err(_) => {}
        }
        tokio::select! {
            signal = &mut *gone, if !signal_lost => {
                if signal.is_ok() {
                    return Ok(());
                }
                // Another wait took the signal over: rely on the re-reads.
                signal_lost = true;
            }
            _ = tokio::time::sleep(GONE_RECHECK) => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Err(ActionError::NotGone(ctx.gone_timeout));
            }
        }
    }
}

/// Creates the copy, retrying passing failures. AlreadyExists from a pod that is not
/// the old one means someone recreated it already: done.
async fn create(
    api: &Api<DynamicObject>,
    copy: &DynamicObject,
    old_uid: &str,
) -> Result<DynamicObject, ActionError> {
    let name = copy.metadata.name.clone().unwrap_or_default();
    let mut last = ActionError::OldPodStays;
    for attempt in 0..=BACKOFF.len() {
        match api.create(&PostParams::default(), copy).await {
            Ok(created) => return Ok(created),
            Err(e) if is_code(&e, 409) => {
                if let Ok(Some(existing)) = api.get_opt(&name).await {
                    if existing.metadata.uid.as_deref() != Some(old_uid) {
                        return Ok(existing);
                    }
                }
                last = ActionError::OldPodStays;
            }
            Err(e) if !passing(&e) => return Err(ActionError::Create(e)),
            Err(e) => last = ActionError::Create(e),
        }
        if let Some(ms) = BACKOFF.get(attempt) {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
    }
    Err(last)
}

pub(crate) async fn with_retries<T, F, Fut>(mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(e) if passing(&e) && attempt < 3 => {
                tokio::time::sleep(Duration::from_millis(BACKOFF[attempt])).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A Kubernetes Event on the job's pod (or its copy) with `uid`.
async fn note(ctx: &Ctx, job: &Job, uid: &str, message: &str, action: &str) {
    let pod = PodRef {
        namespace: &job.namespace,
        name: &job.name,
        uid,
    };
    note_pod(ctx, &pod, job.reason.event_reason(), message, action).await;
}

/// A pod an Event is about.
pub struct PodRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

impl<'a> From<&'a PodInfo> for PodRef<'a> {
    fn from(pod: &'a PodInfo) -> Self {
        PodRef {
            namespace: &pod.namespace,
            name: &pod.name,
            uid: &pod.uid,
        }
    }
}

/// How [`annotate`] ended.
#[derive(Debug)]
pub enum Annotated {
    Written,
    /// Not tried: the controller is stopping.
    Halted,
    Failed(kube::Error),
}

/// Sets `annotations` on `pod` (a JSON object; `null` removes one), as a merge patch
/// guarded by its uid (a pod of the same name that replaced it is left alone), with
/// the usual retries; given up when the controller stops.
pub async fn annotate(ctx: &Ctx, pod: &PodRef<'_>, annotations: Value) -> Annotated {
    let api = pods(ctx, pod.namespace);
    let patch = json!({"metadata": {"uid": pod.uid, "annotations": annotations}});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    tokio::select! {
        _ = ctx.halt.cancelled() => Annotated::Halted,
        written = with_retries(|| api.patch(pod.name, &params, &patch)) => match written {
            Ok(_) => Annotated::Written,
            Err(e) => Annotated::Failed(e),
        },
    }
}

/// A Kubernetes Event on `pod`; a failure is logged, not fatal.
pub async fn note_pod(ctx: &Ctx, pod: &PodRef<'_>, reason: &str, message: &str, action: &str) {
    record_on_pod(ctx, pod, EventType::Normal, reason, message, action).await;
}

/// A Warning Event on the pod: something its user should act on.
pub async fn warn_pod(ctx: &Ctx, pod: &PodRef<'_>, reason: &str, message: &str, action: &str) {
    record_on_pod(ctx, pod, EventType::Warning, reason, message, action).await;
}

async fn record_on_pod(
    ctx: &Ctx,
    pod: &PodRef<'_>,
    type_: EventType,
    reason: &str,
    message: &str,
    action: &str,
) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.to_owned()),
        namespace: Some(pod.namespace.to_owned()),
        uid: Some(pod.uid.to_owned()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        ctx.metrics.error("kubernetes");
        tracing::warn!(error = %e, "could not record an event");
    }
}

async fn audit(ctx: &Ctx, job: &Job, pod: &Value, outcome: &Outcome) {
    let meta = &pod["metadata"];
    let user = named_user(
        |k| meta["annotations"][k].as_str(),
        |k| meta["labels"][k].as_str(),
    )
    .map(str::to_owned);
    let booking_id = pod_label(pod, BOOKING_LABEL).and_then(|b| b.parse().ok());
    let mut details = json!({
        "result": outcome.metric(),
        "reason": job.reason.text(),
        "node": pod.pointer("/spec/nodeName"),
    });
    match &job.reason {
        Reason::Expired { terminate_at } => {
            details["terminate_at"] =
                json!(terminate_at.to_rfc3339_opts(SecondsFormat::Secs, true));
            details["lag_seconds"] =
                json!((ctx.clock.now() - *terminate_at).num_milliseconds() as f64 / 1000.0);
        }
        Reason::Preempted {
            model,
            for_whom,
            attempt,
        } => {
            details["model"] = json!(model);
            details["for"] = json!(for_whom);
            details["attempt"] = json!(attempt);
            details["order"] = json!("least recently GPU-active lent pod that makes room");
        }
        Reason::SchedulerPreempted | Reason::LentPending => {}
        Reason::Resumed(intent) => {
            details["resumed"] = json!(intent.action);
            details["recorded_at"] = json!(intent.created_text());
        }
        Reason::BeyondBooking { units, .. } => {
            details["booking_units"] = json!(units);
            details["order"] = json!("newest of the booking's pods first");
        }
    }
    let report = AuditReport {
        action: format!("controller.{}", job.reason.metric()),
        subject: Some(format!("{}/{}", job.namespace, job.name)),
        user,
        booking_id,
        details,
    };
    if let Err(e) = ctx.booking.audit(&report).await {
        ctx.metrics.error("booking");
        tracing::warn!(error = %e, "could not record the action in the audit log");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The hub names servers by their raw name: KubeSpawner 7 cleans the label's
    /// value, the annotation of the same key keeps it exact.
    #[test]
    fn the_hub_server_is_named_by_the_annotations() {
        let pod = json!({"metadata": {
            "annotations": {USERNAME_KEY: "Zoë@uni.example", crate::hub::SERVER_NAME_KEY: "GPU run"},
            "labels": {USERNAME_KEY: "zo-uni-example---1f2e", crate::hub::SERVER_NAME_KEY: "gpu-run---64409e31"},
        }});
        assert_eq!(
            hub_server(&pod),
            Some(("Zoë@uni.example".to_owned(), "GPU run".to_owned()))
        );
        // An older KubeSpawner wrote the label alone (raw); the default server has none.
        let old = json!({"metadata": {
            "annotations": {USERNAME_KEY: "bob"},
            "labels": {crate::hub::SERVER_NAME_KEY: "train"},
        }});
        assert_eq!(
            hub_server(&old),
            Some(("bob".to_owned(), "train".to_owned()))
        );
        let default = json!({"metadata": {"annotations": {USERNAME_KEY: "bob"}}});
        assert_eq!(
            hub_server(&default),
            Some(("bob".to_owned(), String::new()))
        );
        // No raw user name: not the hub's to restart.
        let slug_only = json!({"metadata": {"labels": {USERNAME_KEY: "bob"}}});
        assert_eq!(hub_server(&slug_only), None);
    }
}
