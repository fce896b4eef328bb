//! One admission review in, one out: parse leniently, detect, ask, decide, plan, report.

use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use gpu_booking_client::AuditReport;
use gpu_booking_core::admission::{
    controller_copy, decide, detect_gpu, plan_no_gpu, plan_owned, requested_by_controller,
    trusted_identity, what_to_ask, AdmissionConfig, Decision, GpuRequest, Identity, LendLedger,
    Lookup, Schedulability, VisibleDevicesWithoutGpu, NVIDIA_VISIBLE_DEVICES, OUR_KEY_STEM,
    VISIBLE_DEVICES_STRIPPED,
};
use gpu_booking_core::rate::{KeyedBuckets, TokenBucket};
use serde::de::IgnoredAny;
use serde_json::{json, Value};
use tracing::Instrument;

use crate::booking_source::BookingSource;
use crate::error::BookingError;
use crate::metrics::Metrics;
use crate::review::{read_lenient, read_typed, Envelope, RequestIn, ReviewOut, API_VERSION_V1};

/// The admission logic with its booking client and metrics; shared by all connections.
pub struct Webhook {
    cfg: AdmissionConfig,
    /// Every configured GPU resource name (and `NVIDIA_VISIBLE_DEVICES` where pods
    /// that set it are looked at), for [`Webhook::surely_no_gpu`].
    gpu_names: Vec<memchr::memmem::Finder<'static>>,
    /// What our marks on a pod can be spelled with (our key prefixes, the
    /// `terminate-at` annotation, our priority classes), for [`Webhook::surely_unmarked`].
    mark_names: Vec<memchr::memmem::Finder<'static>>,
    booking: Arc<BookingSource>,
    /// GPU units admitted that the booking service's free count cannot count yet.
    ledger: Mutex<LendLedger>,
    /// Reviews per source that may reach the ledger, the booking service or the
    /// audit log (`--source-review-burst`); `None`: no limit.
    sources: Option<Mutex<SourceLimit>>,
    metrics: Arc<Metrics>,
}

/// The per-source limit and the warnings it logs.
struct SourceLimit {
    buckets: KeyedBuckets<IpAddr>,
    /// A refusal is logged at most this often, so that a flood does not flood the log.
    warnings: TokenBucket,
}

/// Sources with a bucket of their own at most (about 100 bytes each); more at once
/// share one (`KeyedBuckets`).
pub const MAX_SOURCES: usize = 4096;

/// The ledger's defaults (`--lend-settle`, `--lend-ttl`).
const LEND_SETTLE: Duration = Duration::from_secs(3);
const LEND_TTL: Duration = Duration::from_secs(60);

impl Webhook {
    pub fn new(cfg: AdmissionConfig, booking: Arc<BookingSource>, metrics: Arc<Metrics>) -> Self {
        // A pod that names no GPU resource is still looked at when it could set the
        // runtime's variable (`--visible-devices-without-gpu strip`).
        let hidden = (cfg.visible_devices_without_gpu == VisibleDevicesWithoutGpu::Strip)
            .then_some(NVIDIA_VISIBLE_DEVICES);
        let gpu_names = cfg
            .gpu_resource_names()
            .map(String::as_str)
            .chain(hidden)
            .map(|name| memchr::memmem::Finder::new(name.as_bytes()).into_owned())
            .collect();
        // The stem covers both prefixes of our keys (current and legacy) and the
        // default classes.
        let mark_names = [
            Some(OUR_KEY_STEM),
            Some(cfg.terminate_at_annotation.as_str()),
        ]
        .into_iter()
        .chain([
            cfg.high_priority_class.as_deref(),
            cfg.low_priority_class.as_deref(),
        ])
        .flatten()
        .map(|name| memchr::memmem::Finder::new(name.as_bytes()).into_owned())
        .collect();
        Self {
            cfg,
            gpu_names,
            mark_names,
            booking,
            ledger: Mutex::new(LendLedger::new(LEND_SETTLE, LEND_TTL)),
            sources: None,
            metrics,
        }
    }

    /// Limits the reviews of pods that may get a GPU or carry our marks to `burst`
    /// at once and `per_second` on average per source (`--source-review-burst`,
    /// `--source-reviews-per-second`); a zero rate: no limit.
    pub fn with_source_limit(self, burst: u32, per_second: f64) -> Self {
        let sources = (per_second > 0.0).then(|| {
            Mutex::new(SourceLimit {
                buckets: KeyedBuckets::new(burst, per_second, MAX_SOURCES),
                warnings: TokenBucket::new(1, 0.1),
            })
        });
        Self { sources, ..self }
    }

    /// Replaces the ledger (`--lend-settle`, `--lend-ttl`).
    pub fn with_ledger(self, ledger: LendLedger) -> Self {
        Self {
            ledger: Mutex::new(ledger),
            ..self
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.cfg
    }

    pub fn booking(&self) -> &Arc<BookingSource> {
        &self.booking
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The answer to the review in `body`. Never fails: a malformed review gets an
    /// `invalid` answer (with the request's uid when it has one), anything that is not
    /// a pod creation an unchanged `allowed`.
    pub async fn review(&self, body: &[u8]) -> ReviewOut {
        self.review_from(body, None).await
    }

    /// [`Webhook::review`] of a review sent from `source` (the client's address),
    /// within its source's limit ([`Webhook::with_source_limit`]).
    pub async fn review_from(&self, body: &[u8], source: Option<IpAddr>) -> ReviewOut {
        let started = Instant::now();
        let (out, kind) = self.review_counted(body, source).await;
        self.metrics.admitted(kind, started.elapsed());
        out
    }

    async fn review_counted(&self, body: &[u8], source: Option<IpAddr>) -> Answer {
        // The common case, a pod without a GPU that carries no mark of ours: when no
        // GPU resource name and no mark can be spelled anywhere in the body (byte
        // searches), the pod is skipped unbuilt. A mark goes the full way, which
        // removes it.
        if self.surely_unmarked(body) && self.surely_no_gpu(body) {
            if let Some(review) = read_typed::<IgnoredAny>(body) {
                return match pod_creation(review) {
                    Ok((version, request, _)) => {
                        (ReviewOut::allow(version, &request.uid), "no_gpu")
                    }
                    Err(answer) => *answer,
                };
            }
        }
        // Everything past here may take a lent unit, ask the booking service or
        // write an audit row: at most so many per source.
        if let Some(source) = source.filter(|&s| !self.within_limit(s)) {
            return refuse_over_limit(body, source);
        }
        // One typed pass builds the pod; only a review it cannot read is read again,
        // leniently, for its uid.
        let review = match read_typed::<Value>(body) {
            Some(review) => review,
            None => match read_lenient(body) {
                Ok(review) => review,
                Err(message) => {
                    return (ReviewOut::invalid(API_VERSION_V1, "", message), "invalid");
                }
            },
        };
        let (version, request, pod) = match pod_creation(review) {
            Ok(parts) => parts,
            Err(answer) => return *answer,
        };
        let span = tracing::info_span!(
            "admission",
            uid = %request.uid,
            namespace = request.namespace.as_deref().unwrap_or(""),
            pod = %pod_name(&request, &pod),
        );
        self.admit_pod(version, &request, pod)
            .instrument(span)
            .await
    }

    /// Takes a token of `source`'s bucket; `false`: over its limit (logged now and
    /// then).
    fn within_limit(&self, source: IpAddr) -> bool {
        let Some(sources) = &self.sources else {
            return true;
        };
        let now = Instant::now();
        let mut sources = sources.lock().unwrap_or_else(|e| e.into_inner());
        if sources.buckets.allow(&source.to_canonical(), now) {
            return true;
        }
        if sources.warnings.allow(now) {
            tracing::warn!(%source, "admission reviews over --source-reviews-per-second refused");
        }
        false
    }

    /// True when no mark of ours can be written in `body` (see `mark_names`); a
    /// byte search, like [`Webhook::surely_no_gpu`].
    fn surely_unmarked(&self, body: &[u8]) -> bool {
        !has_escapes(body) && self.mark_names.iter().all(|name| name.find(body).is_none())
    }

    /// True when no GPU resource can be named anywhere in `body`: none of their names
    /// occurs literally, and there is no escape (`\u`, `\/`) that could spell one. A
    /// byte search, far cheaper than reading the pod; `false` only means "look".
    fn surely_no_gpu(&self, body: &[u8]) -> bool {
        !has_escapes(body) && self.gpu_names.iter().all(|name| name.find(body).is_none())
    }

    async fn admit_pod(&self, version: &str, req: &RequestIn, pod: Value) -> Answer {
        let allow = || ReviewOut::allow(version, &req.uid);
        let gpu = match guarded(|| detect_gpu(&pod, &self.cfg)) {
            Ok(Some(gpu)) => gpu,
            Ok(None) => {
                // No GPU: nothing to decide, but no mark of ours its creator wrote
                // survives either (`core::admission::marks`; the note of a removed GPU
                // only on the controller's copies), nor a GPU through the runtime's
                // variable.
                let by_controller = requested_by_controller(&req.user_info, &self.cfg);
                return match guarded(|| plan_no_gpu(&pod, &self.cfg, by_controller)) {
                    Ok((patch, true)) => {
                        tracing::info!(
                            "NVIDIA_VISIBLE_DEVICES set to none on a pod that asks for no GPU"
                        );
                        let warning = Some(VISIBLE_DEVICES_STRIPPED.to_owned());
                        (
                            allow().with_patch(&patch).with_warning(warning),
                            "devices_hidden",
                        )
                    }
                    Ok((patch, false)) => (allow().with_patch(&patch), "no_gpu"),
                    Err(()) => (allow().with_warning(Some(INTERNAL.into())), "no_gpu"),
                };
            }
            Err(()) => {
                return (
                    allow().with_warning(Some(INTERNAL.into())),
                    "internal_error",
                )
            }
        };
        // The controller's own lent copy of a pod it ended: admitted as it decided
        // (the free count may still count the original), and kept in the ledger.
        if let Ok(Some(decision)) =
            guarded(|| controller_copy(&req.user_info, &pod, &gpu, &self.cfg))
        {
            return self.admit_controller_copy(version, req, pod, &gpu, decision);
        }
        // Only the spawner's word counts (a pod's creator can write any name into it).
        let identity = trusted_identity(
            &self.cfg.spawners,
            &req.user_info,
            req.namespace.as_deref(),
            &pod,
            self.cfg.name_case,
        );
        // Nobody is asked about a pod decided at once (`unasked`: stripped without
        // identity, or another workload).
        let (answer, unasked) =
            match what_to_ask(identity.as_ref(), req.namespace.as_deref(), &self.cfg) {
                Ok(ask) => (Some(self.booking.schedulability(ask).await), None),
                Err(lookup) => (None, Some(lookup)),
            };
        let failure = match &answer {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        let lookup = match (&answer, &failure, unasked) {
            (Some(Ok(a)), _, _) => Lookup::Answer(a),
            (_, Some(message), _) => Lookup::Failed(message),
            (_, _, Some(lookup)) => lookup,
            (_, None, None) => Lookup::NoIdentity,
        };
        // Taken before the pod goes to the planner, which edits it in place.
        let subject = subject(req, &pod);
        let planned = guarded(|| {
            let now = Utc::now();
            let decision = match lookup {
                // The free count less what was admitted since its report, and this
                // admission recorded, under one lock (see `LendLedger`).
                Lookup::Answer(answer) => self
                    .ledger
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .decide(&gpu, answer, &self.cfg, now, !req.dry_run),
                _ => decide(&gpu, lookup, &self.cfg, now),
            };
            let patch = plan_owned(pod, &decision, &self.cfg);
            (decision, patch)
        });
        let Ok((decision, patch)) = planned else {
            return (
                allow().with_warning(Some(INTERNAL.into())),
                "internal_error",
            );
        };
        if let (Lookup::Answer(a), Some(model)) = (lookup, decision.model()) {
            if a.budget_withheld(model, &self.cfg) {
                self.metrics.budgets_withheld.inc();
                tracing::info!(%model, "no VRAM budget: the model's nodes do not advertise it");
            }
        }
        let facts = Facts {
            req,
            subject,
            gpu: &gpu,
            identity: identity.as_ref(),
            answer: answer.as_ref().and_then(|a| a.as_ref().ok()).map(|a| &**a),
            failure: answer.as_ref().and_then(|a| a.as_ref().err()),
        };
        self.report(&facts, &decision, patch.0.len());
        let out = allow().with_patch(&patch).with_warning(decision.warning());
        (out, decision.kind())
    }

    /// See [`controller_copy`]: the patch of its decision, and its units in the
    /// ledger (unless a dry run).
    fn admit_controller_copy(
        &self,
        version: &str,
        req: &RequestIn,
        pod: Value,
        gpu: &GpuRequest,
        decision: Decision,
    ) -> Answer {
        let allow = || ReviewOut::allow(version, &req.uid);
        let subject = subject(req, &pod);
        let Ok(patch) = guarded(|| plan_owned(pod, &decision, &self.cfg)) else {
            return (
                allow().with_warning(Some(INTERNAL.into())),
                "internal_error",
            );
        };
        if let (false, Some(model)) = (req.dry_run, decision.model()) {
            self.ledger
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(model, gpu.units, Utc::now());
        }
        tracing::info!(
            model = decision.model().map(|m| m.as_str()).unwrap_or(""),
            "the controller's lent copy is admitted as it decided"
        );
        let facts = Facts {
            req,
            subject,
            gpu,
            identity: None,
            answer: None,
            failure: None,
        };
        self.report(&facts, &decision, patch.0.len());
        (allow().with_patch(&patch), "controller_copy")
    }

    /// Logs the decision and, unless this is a dry run, reports it to the audit log (on
    /// its own task: the answer does not wait). A review never asks for a preemption:
    /// the controller preempts for booked pods it sees Pending, so that no review, real
    /// or forged, can end a pod.
    fn report(&self, facts: &Facts<'_>, decision: &Decision, ops: usize) {
        let user = facts.user();
        tracing::info!(
            decision = decision.kind(),
            who = facts.identity.map(Identity::describe).unwrap_or_default(),
            user = user.as_deref().unwrap_or(""),
            dry_run = facts.req.dry_run,
            ops,
            error = facts
                .failure
                .map(BookingError::to_string)
                .unwrap_or_default(),
            "GPU pod admitted"
        );
        if facts.req.dry_run {
            return;
        }
        let booking_id = match decision {
            Decision::Booked { booking_id, .. } => Some(*booking_id),
            _ => None,
        };
        if let Some(action) = decision.audit_action() {
            let model = match decision {
                Decision::Booked { model, .. } | Decision::LowPriority { model, .. } => {
                    Some(model.as_str())
                }
                _ => None,
            };
            self.booking.audit(action, || AuditReport {
                action: action.to_owned(),
                subject: Some(facts.subject.clone()),
                user,
                booking_id,
                // Evidence, free-form by the audit contract.
                details: json!({
                    "uid": facts.req.uid,
                    "decision": decision.kind(),
                    "model": model,
                    "gpu_units": facts.gpu.units,
                    "identity": facts.identity.map(Identity::describe),
                    "model_full": decision.preemption().is_some(),
                    "reason": decision.removal_reason(),
                    "warning": decision.warning(),
                    "booking_error": facts.failure.map(BookingError::to_string),
                }),
            });
        }
    }
}

/// Whether `body` has an escape (`\u`, `\/`) that could spell a name in a way a
/// byte search does not see.
fn has_escapes(body: &[u8]) -> bool {
    memchr::memchr_iter(b'\\', body).any(|i| matches!(body.get(i + 1), Some(b'u' | b'/')))
}

/// A pod creation's answer version, request and pod; or the answer to a review that
/// is not one (malformed, or not ours to judge: the webhook configuration should not
/// even send those).
fn pod_creation<O>(review: Envelope<O>) -> Result<(&'static str, RequestIn<O>, O), Box<Answer>> {
    let Envelope {
        version,
        is_review,
        mut request,
    } = review;
    let invalid =
        |uid: &str, message: &str| Box::new((ReviewOut::invalid(version, uid, message), "invalid"));
    if !is_review {
        return Err(invalid(&request.uid, "kind must be AdmissionReview"));
    }
    if request.uid.is_empty() {
        return Err(invalid("", "the review has no request with a uid"));
    }
    if !request.is_pod_creation() {
        return Err(Box::new((
            ReviewOut::allow(version, &request.uid),
            "ignored",
        )));
    }
    match request.object.take() {
        Some(pod) => Ok((version, request, pod)),
        None => Err(invalid(&request.uid, "a pod creation without a pod object")),
    }
}

const INTERNAL: &str = "gpu-booking: internal error in the webhook; pod admitted unchanged";

/// The answer to a review from a source over its limit: a pod creation is refused
/// (code 429), which takes nothing (no lent unit, no lookup, no audit row). Not an
/// HTTP error: that would hand the pod to the API server's `failurePolicy`, and with
/// `Ignore` a GPU pod would run unchanged, outside every booking and not preemptible.
/// Not the pod without its GPU either: a booked user's notebook would start without
/// the card, silently, where a refusal is shown and retried. Anything else is
/// answered as always (nothing to take).
fn refuse_over_limit(body: &[u8], source: IpAddr) -> Answer {
    let creation = match read_typed::<IgnoredAny>(body) {
        Some(review) => pod_creation(review).map(|(version, request, _)| (version, request.uid)),
        None => match read_lenient(body) {
            Ok(review) => pod_creation(review).map(|(version, request, _)| (version, request.uid)),
            Err(message) => return (ReviewOut::invalid(API_VERSION_V1, "", message), "invalid"),
        },
    };
    match creation {
        Ok((version, uid)) => (
            ReviewOut::too_many(
                version,
                &uid,
                format!(
                    "gpu-booking: too many admission reviews from {source}; \
                     the pod is not created, try again shortly"
                ),
            ),
            "rate_limited",
        ),
        Err(answer) => *answer,
    }
}

/// An answer and the kind of admission it counts as (the metrics' label).
type Answer = (ReviewOut, &'static str);

/// Runs pure code, turning a panic (a bug) into an error instead of a dropped connection.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, ()> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| {
        tracing::error!("admission logic panicked; answering without a patch");
    })
}

/// What is known about one admission, for logs and reports.
struct Facts<'a> {
    req: &'a RequestIn,
    /// `namespace/name` of the pod ([`subject`]).
    subject: String,
    gpu: &'a GpuRequest,
    identity: Option<&'a Identity>,
    answer: Option<&'a Schedulability>,
    failure: Option<&'a BookingError>,
}

/// The audit log's subject for a pod: `namespace/name`, at most 512 characters.
fn subject(req: &RequestIn, pod: &Value) -> String {
    let namespace = req
        .namespace
        .as_deref()
        .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str));
    let subject = format!("{}/{}", namespace.unwrap_or(""), pod_name(req, pod));
    subject.chars().take(512).collect()
}

impl Facts<'_> {
    /// The user the booking service resolved, else the one we know from the pod.
    fn user(&self) -> Option<String> {
        self.answer.and_then(|a| a.user.clone()).or_else(|| {
            self.identity
                .and_then(Identity::username)
                .map(|u| u.as_str().to_owned())
        })
    }
}

/// The pod's name: from the request, the object, or its `generateName` prefix.
fn pod_name(req: &RequestIn, pod: &Value) -> String {
    let meta = pod.get("metadata");
    let text = |key| meta.and_then(|m| m.get(key)).and_then(Value::as_str);
    match (req.name.as_deref().filter(|n| !n.is_empty()), text("name")) {
        (Some(name), _) | (None, Some(name)) => name.to_owned(),
        (None, None) => text("generateName")
            .map(|g| format!("{g}*"))
            .unwrap_or_default(),
    }
}
