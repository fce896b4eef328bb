//! One admission review in, one out: parse leniently, detect, ask, decide, plan, report.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use gpu_booking_client::AuditReport;
use gpu_booking_core::admission::{
    controller_copy, decide, detect_gpu, plan, plan_unmarked, trusted_identity, what_to_ask,
    AdmissionConfig, Decision, GpuRequest, Identity, LendLedger, Lookup, Schedulability,
    OUR_KEY_STEM,
};
use serde_json::{json, Value};
use tracing::Instrument;

use crate::booking_source::BookingSource;
use crate::error::BookingError;
use crate::metrics::Metrics;
use crate::review::{answer_version, RequestIn, ReviewIn, ReviewOut, API_VERSION_V1};

/// The admission logic with its booking client and metrics; shared by all connections.
pub struct Webhook {
    cfg: AdmissionConfig,
    /// Every configured GPU resource name, for [`Webhook::surely_no_gpu`].
    gpu_names: Vec<memchr::memmem::Finder<'static>>,
    /// What our marks on a pod can be spelled with (our key prefixes, the
    /// `terminate-at` annotation, our priority classes), for [`Webhook::surely_unmarked`].
    mark_names: Vec<memchr::memmem::Finder<'static>>,
    booking: Arc<BookingSource>,
    /// GPU units admitted that the booking service's free count cannot count yet.
    ledger: Mutex<LendLedger>,
    metrics: Arc<Metrics>,
}

/// The ledger's defaults (`--lend-settle`, `--lend-ttl`).
const LEND_SETTLE: Duration = Duration::from_secs(3);
const LEND_TTL: Duration = Duration::from_secs(60);

impl Webhook {
    pub fn new(cfg: AdmissionConfig, booking: Arc<BookingSource>, metrics: Arc<Metrics>) -> Self {
        let gpu_names = cfg
            .gpu_resource_names()
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
            metrics,
        }
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
        let started = Instant::now();
        let (out, kind) = self.review_counted(body).await;
        self.metrics.admitted(kind, started.elapsed());
        out
    }

    async fn review_counted(&self, body: &[u8]) -> (ReviewOut, &'static str) {
        if let Some(answer) = self.skim(body) {
            return answer;
        }
        let review: ReviewIn = match serde_json::from_slice(body) {
            Ok(review) => review,
            Err(e) => {
                let out =
                    ReviewOut::invalid(API_VERSION_V1, "", format!("not an AdmissionReview: {e}"));
                return (out, "invalid");
            }
        };
        let version = answer_version(&review);
        let request = RequestIn::from_value(review.request.unwrap_or(Value::Null));
        let uid = request.uid.clone();
        let invalid = |message: &str| (ReviewOut::invalid(version, &uid, message), "invalid");
        let kind = review.kind.as_ref();
        if kind.is_some_and(|k| k.as_str() != Some("AdmissionReview")) {
            return invalid("kind must be AdmissionReview");
        }
        if uid.is_empty() {
            return invalid("the review has no request with a uid");
        }
        let is_pod = request.kind.as_deref() == Some("Pod")
            && request.group.as_deref().unwrap_or("").is_empty();
        if !is_pod || request.operation.as_deref() != Some("CREATE") {
            // Not ours to judge (the webhook configuration should not even send these).
            return (ReviewOut::allow(version, &uid), "ignored");
        }
        let Some(pod) = request.object.as_ref().filter(|o| o.is_object()) else {
            return invalid("a pod creation without a pod object");
        };
        let span = tracing::info_span!(
            "admission",
            uid = %uid,
            namespace = request.namespace.as_deref().unwrap_or(""),
            pod = %pod_name(&request, pod),
        );
        self.admit_pod(version, &request, pod)
            .instrument(span)
            .await
    }

    /// The fast path for the common case, a pod without a GPU (or a review that is not
    /// a pod creation). When no GPU resource name can occur in the body at all
    /// ([`Webhook::surely_no_gpu`]), a skim that builds only the uid and kind answers
    /// it; otherwise a skim that also builds the containers' resources, on which the
    /// same [`detect_gpu`] as the full path decides. `None` sends the review through
    /// the full path (GPU pods, and anything a skim cannot read).
    fn skim(&self, body: &[u8]) -> Option<(ReviewOut, &'static str)> {
        // A pod that may carry marks of ours goes the full way, which removes them.
        let unmarked = self.surely_unmarked(body);
        if unmarked && self.surely_no_gpu(body) {
            let review: skim::Review<'_, serde::de::IgnoredAny> =
                serde_json::from_slice(body).ok()?;
            let (version, uid, creation, object) = review.parts()?;
            if !creation {
                return Some((ReviewOut::allow(version, &uid), "ignored"));
            }
            object?;
            return Some((ReviewOut::allow(version, &uid), "no_gpu"));
        }
        let review: skim::Review<'_, skim::Pod> = serde_json::from_slice(body).ok()?;
        let (version, uid, creation, pod) = review.parts()?;
        if !creation {
            return Some((ReviewOut::allow(version, &uid), "ignored"));
        }
        let spec = pod?.spec.unwrap_or_default();
        let list = |containers: Option<Vec<skim::Container>>| {
            let containers = containers.unwrap_or_default().into_iter().map(|c| {
                let mut map = serde_json::Map::new();
                map.insert("resources".into(), c.resources.unwrap_or(Value::Null));
                Value::Object(map)
            });
            Value::Array(containers.collect())
        };
        let mut spec_map = serde_json::Map::new();
        spec_map.insert("containers".into(), list(spec.containers));
        spec_map.insert("initContainers".into(), list(spec.init_containers));
        let mut pod_map = serde_json::Map::new();
        pod_map.insert("spec".into(), Value::Object(spec_map));
        let resources = Value::Object(pod_map);
        match guarded(|| detect_gpu(&resources, &self.cfg)) {
            Ok(None) if unmarked => Some((ReviewOut::allow(version, &uid), "no_gpu")),
            _ => None,
        }
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

    async fn admit_pod(
        &self,
        version: &str,
        req: &RequestIn,
        pod: &Value,
    ) -> (ReviewOut, &'static str) {
        let allow = || ReviewOut::allow(version, &req.uid);
        let gpu = match guarded(|| detect_gpu(pod, &self.cfg)) {
            Ok(Some(gpu)) => gpu,
            Ok(None) => {
                // No GPU: nothing to decide, but no mark of ours its creator wrote
                // survives either (issue 13).
                let out = match guarded(|| plan_unmarked(pod, &self.cfg)) {
                    Ok(patch) => allow().with_patch(&patch),
                    Err(()) => allow().with_warning(Some(INTERNAL.into())),
                };
                return (out, "no_gpu");
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
            guarded(|| controller_copy(&req.user_info, pod, &gpu, &self.cfg))
        {
            return self.admit_controller_copy(version, req, pod, &gpu, decision);
        }
        // Only the spawner's word counts (a pod's creator can write any name into it).
        let identity = trusted_identity(
            &self.cfg.spawners,
            &req.user_info,
            req.namespace.as_deref(),
            pod,
            self.cfg.name_case,
        );
        let answer = match what_to_ask(identity.as_ref(), &self.cfg) {
            Some(ask) => Some(self.booking.schedulability(ask).await),
            None => None,
        };
        let failure = match &answer {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        let lookup = match (&answer, &failure) {
            (Some(Ok(a)), _) => Lookup::Answer(a),
            (_, Some(message)) => Lookup::Failed(message),
            _ => Lookup::NoIdentity,
        };
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
            let patch = plan(pod, &decision, &self.cfg);
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
            pod,
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
        pod: &Value,
        gpu: &GpuRequest,
        decision: Decision,
    ) -> (ReviewOut, &'static str) {
        let allow = || ReviewOut::allow(version, &req.uid);
        let Ok(patch) = guarded(|| plan(pod, &decision, &self.cfg)) else {
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
            pod,
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
        let subject = facts.subject();
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
            self.booking.audit(AuditReport {
                action: action.to_owned(),
                subject: Some(subject),
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

const INTERNAL: &str = "gpu-booking: internal error in the webhook; pod admitted unchanged";

/// Runs pure code, turning a panic (a bug) into an error instead of a dropped connection.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, ()> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| {
        tracing::error!("admission logic panicked; answering without a patch");
    })
}

/// What is known about one admission, for logs and reports.
struct Facts<'a> {
    req: &'a RequestIn,
    pod: &'a Value,
    gpu: &'a GpuRequest,
    identity: Option<&'a Identity>,
    answer: Option<&'a Schedulability>,
    failure: Option<&'a BookingError>,
}

impl Facts<'_> {
    fn namespace(&self) -> Option<&str> {
        self.req.namespace.as_deref().or_else(|| {
            self.pod
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
        })
    }

    fn name(&self) -> String {
        pod_name(self.req, self.pod)
    }

    fn subject(&self) -> String {
        let subject = format!("{}/{}", self.namespace().unwrap_or(""), self.name());
        subject.chars().take(512).collect()
    }

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

/// Borrowed, partial views of a review: only the fields the fast path reads; serde
/// skips everything else without building it.
mod skim {
    use std::borrow::Cow;

    use serde::Deserialize;
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[serde(bound(deserialize = "O: Deserialize<'de>"))]
    pub struct Review<'a, O> {
        #[serde(borrow, default)]
        pub api_version: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        pub request: Option<Request<'a, O>>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[serde(bound(deserialize = "O: Deserialize<'de>"))]
    pub struct Request<'a, O> {
        #[serde(default)]
        pub uid: Option<String>,
        #[serde(default)]
        pub kind: Option<Kind>,
        #[serde(borrow, default)]
        pub operation: Option<Cow<'a, str>>,
        #[serde(default)]
        pub object: Option<MapOnly<O>>,
    }

    impl<O> Review<'_, O> {
        /// (answer version, uid, is a pod creation, the object) when the review is
        /// well-formed as far as the fast path can tell; `None` sends it the full way.
        pub fn parts(self) -> Option<(&'static str, String, bool, Option<O>)> {
            if self.kind.as_deref().is_some_and(|k| k != "AdmissionReview") {
                return None;
            }
            let version = match self.api_version.as_deref() {
                Some(crate::review::API_VERSION_V1BETA1) => crate::review::API_VERSION_V1BETA1,
                _ => crate::review::API_VERSION_V1,
            };
            let request = self.request?;
            let uid = request.uid.filter(|u| !u.is_empty())?;
            let kind = request.kind.unwrap_or_default();
            let is_pod = kind.kind.as_deref() == Some("Pod")
                && kind.group.as_deref().unwrap_or("").is_empty();
            let creation = is_pod && request.operation.as_deref() == Some("CREATE");
            let object = request.object.map(|MapOnly(o)| o);
            Some((version, uid, creation, object))
        }
    }

    /// `T` read from a JSON object only (serde would also read a struct from an
    /// array, which the full path refuses).
    pub struct MapOnly<T>(pub T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for MapOnly<T> {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Visit<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
                type Value = MapOnly<T>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    map: A,
                ) -> Result<Self::Value, A::Error> {
                    T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(MapOnly)
                }
            }
            deserializer.deserialize_map(Visit(std::marker::PhantomData))
        }
    }

    #[derive(Deserialize, Default)]
    pub struct Kind {
        #[serde(default)]
        pub group: Option<String>,
        #[serde(default)]
        pub kind: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct Pod {
        #[serde(default)]
        pub spec: Option<Spec>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct Spec {
        #[serde(default)]
        pub containers: Option<Vec<Container>>,
        #[serde(default)]
        pub init_containers: Option<Vec<Container>>,
    }

    #[derive(Deserialize)]
    pub struct Container {
        #[serde(default)]
        pub resources: Option<Value>,
    }
}
