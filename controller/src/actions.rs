//! Carrying out one action on one pod: end a booked pod whose time is up, preempt a
//! low-priority pod, or recreate a pod kube-scheduler preempted. Each action re-reads
//! the pod first (the watch may lag), checks leadership before every write, leaves a
//! Kubernetes Event on the pod and an audit row in the booking service.
//!
//! Leadership: every write that starts an action (delete, patch) needs the Lease. The
//! one write done without it is the create that completes a recreate whose delete
//! already happened: skipping it would lose the user's pod, and it cannot clash with
//! a new leader (which sees no pod to act on; a second create of the same name fails
//! with AlreadyExists).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_booking_client::AuditReport;
use gpu_booking_core::admission::{AdmissionConfig, BOOKING_LABEL, USERNAME_KEY};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::booking::Booking;
use crate::clock::SharedClock;
use crate::config::OnExpiry;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::pods::{PodInfo, PodLite, Priority};
use crate::recreate::{cpu_only_copy, lent_copy};

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
            Reason::LentPending => "lent_pending",
        }
    }

    fn event_reason(&self) -> &'static str {
        match self {
            Reason::Expired { .. } => "BookingEnded",
            Reason::Preempted { .. } => "PreemptedForBooking",
            Reason::SchedulerPreempted => "PreemptedByScheduler",
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
    pub cfg: AdmissionConfig,
    pub on_expiry: OnExpiry,
    pub dry_run: bool,
    pub gone: GoneSignals,
    pub gone_timeout: Duration,
}

/// What is done to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    RecreateCpu,
    Delete,
    Demote,
}

/// Delays between attempts of a write that failed for a passing reason.
const BACKOFF: [u64; 7] = [200, 500, 1_000, 2_000, 5_000, 10_000, 30_000];
/// How often a pod we wait for is re-read, in case its DELETED event was missed.
const GONE_RECHECK: Duration = Duration::from_secs(5);

fn pods(ctx: &Ctx, ns: &str) -> Api<DynamicObject> {
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
            Outcome::Failed(e)
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

async fn carry_out(ctx: &Ctx, job: &Job) -> Result<Outcome, String> {
    if !ctx.leadership.is_leader() {
        return Ok(Outcome::Skipped("not the leader"));
    }
    let api = pods(ctx, &job.namespace);
    let Some(obj) = api.get_opt(&job.name).await.map_err(|e| e.to_string())? else {
        return Ok(Outcome::Skipped("gone"));
    };
    let pod = serde_json::to_value(&obj).map_err(|e| e.to_string())?;
    if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(job.uid.as_str()) {
        return Ok(Outcome::Skipped("replaced by another pod"));
    }
    // Classified as the watch does: a `priority=high` label counts only with our
    // high class (issue 13).
    let info = serde_json::from_value::<PodLite>(pod.clone())
        .ok()
        .and_then(|lite| PodInfo::from_pod(&lite, &ctx.cfg));
    let priority = info.as_ref().and_then(|i| i.priority);
    let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
    let mode = match &job.reason {
        Reason::Expired { .. } => {
            let end = pod
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(&ctx.cfg.terminate_at_annotation))
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
            // The booking may have been extended, or the pod demoted, since the timer
            // was set: the watch re-arms it.
            if priority != Some(Priority::High)
                || deleting
                || end.is_none_or(|end| end > ctx.clock.now())
            {
                return Ok(Outcome::Skipped("no longer due"));
            }
            match ctx.on_expiry {
                OnExpiry::RecreateCpu => Mode::RecreateCpu,
                OnExpiry::Delete => Mode::Delete,
                OnExpiry::Demote => Mode::Demote,
            }
        }
        Reason::Preempted { .. } => {
            if priority != Some(Priority::Low) || deleting {
                return Ok(Outcome::Skipped("no longer a low-priority pod"));
            }
            match ctx.on_expiry {
                OnExpiry::Delete => Mode::Delete,
                _ => Mode::RecreateCpu,
            }
        }
        Reason::SchedulerPreempted => Mode::RecreateCpu,
        Reason::LentPending => {
            // Still lent, still unbound and still refused for want of a GPU; the
            // delete below is conditional on this very version of the pod, so a pod
            // bound in the meantime is not touched.
            let waiting = info.as_ref().is_some_and(|i| {
                i.priority == Some(Priority::Low) && i.node.is_none() && i.unschedulable_for_gpu
            });
            if !waiting || deleting {
                return Ok(Outcome::Skipped("no longer a lent pod waiting for a GPU"));
            }
            Mode::RecreateCpu
        }
    };
    let owned = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| !o.is_empty());
    let mode = if owned && mode != Mode::Delete {
        Mode::Delete
    } else {
        mode
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
        Mode::Demote => recreate(ctx, job, &api, &pod, Copy::Lent).await?,
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
        Mode::RecreateCpu => recreate(ctx, job, &api, &pod, Copy::CpuOnly).await?,
    };
    audit(ctx, job, &pod, &outcome).await;
    Ok(outcome)
}

/// Deletes the pod with this uid (never a newer pod of the same name).
async fn delete(ctx: &Ctx, job: &Job, api: &Api<DynamicObject>) -> Result<Outcome, String> {
    delete_if(ctx, job, api, None).await
}

/// [`delete`], and only while the pod is at `version` (its `resourceVersion`) when
/// given: a pod that changed since it was read (e.g. bound to a node) is left alone.
async fn delete_if(
    ctx: &Ctx,
    job: &Job,
    api: &Api<DynamicObject>,
    version: Option<&str>,
) -> Result<Outcome, String> {
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
        Err(e) => Err(format!("deleting: {e}")),
    }
}

/// Which copy replaces the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copy {
    CpuOnly,
    /// Lent (low priority) with its GPU; CPU-only when the pod names no model.
    Lent,
}

async fn recreate(
    ctx: &Ctx,
    job: &Job,
    api: &Api<DynamicObject>,
    pod: &Value,
    kind: Copy,
) -> Result<Outcome, String> {
    let reason = job.reason.text();
    let lent = match kind {
        Copy::Lent => lent_copy(pod, &ctx.cfg).map_err(|e| e.to_string())?,
        Copy::CpuOnly => None,
    };
    let (copy, outcome, how) = match lent {
        Some(copy) => (
            copy,
            Outcome::Demoted,
            "as a lent pod (low priority, GPU kept)",
        ),
        None => (
            cpu_only_copy(pod, &ctx.cfg, &format!("GPU removed: {reason}"))
                .map_err(|e| e.to_string())?,
            Outcome::Recreated,
            "without GPU",
        ),
    };
    let copy: DynamicObject = serde_json::from_value(copy).map_err(|e| e.to_string())?;
    let gone = ctx.gone.wait(&job.uid);
    note(
        ctx,
        job,
        &job.uid,
        &format!("Recreating {how}: {reason}"),
        "Recreate",
    )
    .await;
    // A lent pod waiting for a GPU is replaced only as it was read: still unbound.
    let version = match job.reason {
        Reason::LentPending => pod
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
        _ => None,
    };
    match delete_if(ctx, job, api, version).await {
        Ok(Outcome::Deleted) | Ok(Outcome::Skipped("gone")) => {}
        other => {
            ctx.gone.forget(&job.uid);
            return other;
        }
    }
    // From here on the pod is going: its copy is created whatever happens to the
    // Lease (see the module documentation).
    wait_gone(ctx, job, api, gone).await?;
    let created = create(api, &copy, &job.uid).await?;
    if let Some(uid) = created.metadata.uid.as_deref() {
        note(
            ctx,
            job,
            uid,
            &format!("Recreated {how}: {reason}"),
            "Recreate",
        )
        .await;
    }
    Ok(outcome)
}

/// Until the pod with the job's uid no longer exists: the watch's signal, with a
/// re-read now and then in case the signal was missed.
async fn wait_gone(
    ctx: &Ctx,
    job: &Job,
    api: &Api<DynamicObject>,
    mut gone: oneshot::Receiver<()>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + ctx.gone_timeout;
    loop {
        match api.get_opt(&job.name).await {
            Ok(None) => break,
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(job.uid.as_str()) => break,
            Ok(Some(_)) | Err(_) => {}
        }
        tokio::select! {
            _ = &mut gone => break,
            _ = tokio::time::sleep(GONE_RECHECK) => {}
            _ = tokio::time::sleep_until(deadline) => {
                ctx.gone.forget(&job.uid);
                return Err(format!("the pod was not gone within {:?}; not recreated", ctx.gone_timeout));
            }
        }
    }
    ctx.gone.forget(&job.uid);
    Ok(())
}

/// Creates the copy, retrying passing failures. AlreadyExists from a pod that is not
/// the old one means someone recreated it already: done.
async fn create(
    api: &Api<DynamicObject>,
    copy: &DynamicObject,
    old_uid: &str,
) -> Result<DynamicObject, String> {
    let name = copy.metadata.name.clone().unwrap_or_default();
    let mut last = String::new();
    for attempt in 0..=BACKOFF.len() {
        match api.create(&PostParams::default(), copy).await {
            Ok(created) => return Ok(created),
            Err(e) if is_code(&e, 409) => {
                if let Ok(Some(existing)) = api.get_opt(&name).await {
                    if existing.metadata.uid.as_deref() != Some(old_uid) {
                        return Ok(existing);
                    }
                }
                last = "the old pod is still there".into();
            }
            Err(e) if !passing(&e) => return Err(format!("creating the CPU-only pod: {e}")),
            Err(e) => last = e.to_string(),
        }
        if let Some(ms) = BACKOFF.get(attempt) {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
        }
    }
    Err(format!("creating the CPU-only pod: {last}"))
}

async fn with_retries<T, F, Fut>(mut call: F) -> Result<T, kube::Error>
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

/// A Kubernetes Event on `pod`; a failure is logged, not fatal.
pub async fn note_pod(ctx: &Ctx, pod: &PodRef<'_>, reason: &str, message: &str, action: &str) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.to_owned()),
        namespace: Some(pod.namespace.to_owned()),
        uid: Some(pod.uid.to_owned()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Normal,
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
    let user = meta["annotations"][USERNAME_KEY]
        .as_str()
        .or_else(|| meta["labels"][USERNAME_KEY].as_str())
        .map(str::to_owned);
    let booking_id = meta["labels"][BOOKING_LABEL]
        .as_str()
        .and_then(|b| b.parse().ok());
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
