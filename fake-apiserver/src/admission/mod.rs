//! The admission chain of a create, in kube-apiserver's order ("Admission Controllers"
//! and "Dynamic Admission Control" pages), switched on per test with
//! [`crate::FakeApiServer::enable_admission`]:
//!
//! 1. the built-in mutating plugin that matters here, `Priority`;
//! 2. the mutating webhooks of every stored `MutatingWebhookConfiguration`, the
//!    configurations sorted by name and each one's webhooks in order;
//! 3. if a webhook changed the object, one reinvocation round: the built-in plugins
//!    again (so `Priority` re-checks a pod whose class a webhook changed, and refuses it
//!    when the webhook left a `spec.priority` or `spec.preemptionPolicy` that disagrees
//!    with the new class), then the `reinvocationPolicy: IfNeeded` webhooks that ran
//!    before a later change (the API server's `reinvoker`).

mod call;
mod identity;
mod matching;
mod policy;
mod priority;
mod quantity;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use serde_json::{json, Value};

pub use identity::UserInfo;

use crate::fields::meta_str;
use crate::path::{ResourceKey, Target};
use crate::status::ApiError;
use crate::store::Store;
use crate::Shared;
use matching::Conditions;
use priority::PriorityClass;

const WEBHOOK_CONFIGS: (&str, &str) = (
    "/apis/admissionregistration.k8s.io/v1",
    "mutatingwebhookconfigurations",
);
const PRIORITY_CLASSES: (&str, &str) = ("/apis/scheduling.k8s.io/v1", "priorityclasses");
/// The label every namespace carries (Kubernetes 1.22+), whether or not the fake
/// stores a Namespace object.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// One webhook call, as [`crate::FakeApiServer::admission_log`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionRecord {
    /// The `MutatingWebhookConfiguration` and the webhook's name in it.
    pub configuration: String,
    pub webhook: String,
    /// 0: the first round; 1: the reinvocation round.
    pub round: u8,
    /// Who made the request (the review's `userInfo.username`).
    pub user: String,
    pub namespace: Option<String>,
    pub name: String,
    pub dry_run: bool,
    /// The webhook's answer; false also when the call failed.
    pub allowed: bool,
    /// The JSON Patch the webhook returned, decoded.
    pub patch: Option<Value>,
    pub warnings: Vec<String>,
    /// Why the call failed (unreachable, TLS, timeout, bad answer), if it did; the
    /// failurePolicy then decided.
    pub error: Option<String>,
}

#[derive(Default)]
struct Inner {
    enabled: bool,
    services: call::Services,
    log: Vec<AdmissionRecord>,
}

/// Admission state of one fake API server.
#[derive(Default)]
pub(crate) struct State {
    inner: Mutex<Inner>,
    clients: call::Clients,
    programs: matching::Programs,
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    pub fn enabled(&self) -> bool {
        self.lock().enabled
    }

    pub fn register_service(&self, namespace: &str, name: &str, port: u16, addr: SocketAddr) {
        self.lock()
            .services
            .insert((namespace.to_owned(), name.to_owned(), port), addr);
    }

    pub fn log(&self) -> Vec<AdmissionRecord> {
        self.lock().log.clone()
    }

    fn record(&self, record: AdmissionRecord) {
        self.lock().log.push(record);
    }
}

/// What a request is about, as the admission plugins see it.
#[derive(Debug, Clone)]
pub(crate) struct Attributes {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub kind: String,
    pub operation: String,
    pub dry_run: bool,
    pub user: UserInfo,
}

impl Attributes {
    fn is_pod(&self) -> bool {
        self.group.is_empty() && self.resource == "pods" && self.subresource.is_none()
    }

    /// `pods`, or `deployments.apps`: how error messages name a resource.
    fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// The AdmissionRequest without its objects (also CEL's `request`).
    fn request(&self, uid: &str) -> Value {
        let mut req = json!({
            "uid": uid,
            "kind": {"group": self.group, "version": self.version, "kind": self.kind},
            "resource": {"group": self.group, "version": self.version, "resource": self.resource},
            "requestKind": {"group": self.group, "version": self.version, "kind": self.kind},
            "requestResource": {"group": self.group, "version": self.version, "resource": self.resource},
            "name": self.name,
            "operation": self.operation,
            "userInfo": self.user,
            "dryRun": self.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        });
        if let Some(ns) = &self.namespace {
            req["namespace"] = json!(ns);
        }
        if let Some(sub) = &self.subresource {
            req["subResource"] = json!(sub);
            req["requestSubResource"] = json!(sub);
        }
        if self.dry_run {
            req["options"]["dryRun"] = json!(["All"]);
        }
        req
    }
}

/// A unique AdmissionReview uid.
fn review_uid() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("a0000000-0000-4000-8000-{n:012x}")
}

/// What the chain made of a create.
pub(crate) struct Outcome {
    pub result: Result<Value, ApiError>,
    /// Webhook warnings, for `Warning:` headers (sent with a refusal too).
    pub warnings: Vec<String>,
}

/// What the chain reads from the store, copied out so that no lock is held across a
/// webhook call.
struct Snapshot {
    classes: Vec<PriorityClass>,
    hooks: Vec<(String, MutatingWebhook)>,
    namespace_labels: Value,
}

fn snapshot(store: &Store, attrs: &Attributes, object: &Value) -> Snapshot {
    let key = |(prefix, plural): (&str, &str)| ResourceKey::new(prefix, plural);
    let classes = store
        .list(&key(PRIORITY_CLASSES), None, &Default::default())
        .iter()
        .filter_map(|c| PriorityClass::from_value(c))
        .collect();
    let mut configs: Vec<MutatingWebhookConfiguration> = store
        .list(&key(WEBHOOK_CONFIGS), None, &Default::default())
        .iter()
        .filter_map(|c| serde_json::from_value((**c).clone()).ok())
        .collect();
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let hooks = configs
        .into_iter()
        .flat_map(|c| {
            let name = c.metadata.name.unwrap_or_default();
            c.webhooks
                .unwrap_or_default()
                .into_iter()
                .map(move |h| (name.clone(), h))
        })
        .collect();
    // A namespace's labels; a Namespace being created is matched on its own labels.
    let namespace_labels = match &attrs.namespace {
        Some(ns) => {
            let stored = store.get(&ResourceKey::new("/api/v1", "namespaces"), "", ns);
            let mut labels = stored
                .and_then(|n| n.pointer("/metadata/labels").cloned())
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            labels[NAMESPACE_NAME_LABEL] = json!(ns);
            labels
        }
        None if attrs.group.is_empty() && attrs.resource == "namespaces" => {
            let mut labels = object
                .pointer("/metadata/labels")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            labels[NAMESPACE_NAME_LABEL] = json!(attrs.name);
            labels
        }
        None => Value::Null,
    };
    Snapshot {
        classes: priority::with_system_classes(classes),
        hooks,
        namespace_labels,
    }
}

/// The API server's reinvocation bookkeeping of one request.
#[derive(Default)]
struct Reinvocation {
    /// IfNeeded webhooks called since the object last changed.
    previously_invoked: Vec<String>,
    /// IfNeeded webhooks to call again in the second round.
    reinvoke: Vec<String>,
    /// A webhook changed the object: run the second round.
    should_reinvoke: bool,
}

impl Reinvocation {
    fn changed(&mut self) {
        self.reinvoke.append(&mut self.previously_invoked);
        self.should_reinvoke = true;
    }
}

fn hook_key(config: &str, hook: &MutatingWebhook) -> String {
    format!("{config}/{}", hook.name)
}

fn ignores_failures(hook: &MutatingWebhook) -> bool {
    hook.failure_policy.as_deref() == Some("Ignore")
}

/// Whether `hook` is to be called for this request: rules, namespaceSelector,
/// objectSelector, then matchConditions (Err: the request ends).
fn should_call(
    programs: &matching::Programs,
    hook: &MutatingWebhook,
    attrs: &Attributes,
    object: &Value,
    namespace_labels: &Value,
) -> Result<bool, ApiError> {
    if !matching::rules_match(hook, attrs) {
        return Ok(false);
    }
    // Cluster-scoped objects other than namespaces never skip a webhook by namespace.
    if !namespace_labels.is_null() {
        let ns_ok = matching::selector_matches(hook.namespace_selector.as_ref(), namespace_labels)
            .map_err(|e| ApiError::internal(&e))?;
        if !ns_ok {
            return Ok(false);
        }
    }
    let labels = object
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let obj_ok = matching::selector_matches(hook.object_selector.as_ref(), &labels)
        .map_err(|e| ApiError::internal(&e))?;
    if !obj_ok {
        return Ok(false);
    }
    match matching::evaluate_conditions(programs, hook, object, &attrs.request("")) {
        Conditions::Call => Ok(true),
        Conditions::Skip => Ok(false),
        Conditions::Error(_) if ignores_failures(hook) => Ok(false),
        Conditions::Error(e) => Err(ApiError::forbidden(
            &attrs.group_resource(),
            &attrs.name,
            &e,
        )),
    }
}

/// One pass over the webhooks (round 0, or the reinvocation round 1).
async fn run_webhooks(
    state: &State,
    snap: &Snapshot,
    attrs: &Attributes,
    object: &mut Value,
    round: u8,
    reinvocation: &mut Reinvocation,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let services = state.lock().services.clone();
    for (config, hook) in &snap.hooks {
        let key = hook_key(config, hook);
        if !should_call(&state.programs, hook, attrs, object, &snap.namespace_labels)? {
            continue;
        }
        if round == 1 && !reinvocation.reinvoke.contains(&key) {
            continue;
        }
        if attrs.dry_run && !matches!(hook.side_effects.as_str(), "None" | "NoneOnDryRun") {
            // "Side effects": a dry run never reaches a webhook that may have some.
            return Err(ApiError::bad_request(format!(
                "admission webhook \"{}\" does not support dry run",
                hook.name
            )));
        }
        let uid = review_uid();
        let mut request = attrs.request(&uid);
        request["object"] = object.clone();
        request["oldObject"] = Value::Null;
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        });
        let outcome = call::call(&state.clients, &services, hook, &review).await;
        let mut record = AdmissionRecord {
            configuration: config.clone(),
            webhook: hook.name.clone(),
            round,
            user: attrs.user.username.clone(),
            namespace: attrs.namespace.clone(),
            name: attrs.name.clone(),
            dry_run: attrs.dry_run,
            allowed: false,
            patch: None,
            warnings: Vec::new(),
            error: None,
        };
        let answer = match outcome {
            Ok(answer) => answer,
            Err(why) => {
                let message = format!("failed calling webhook \"{}\": {why}", hook.name);
                record.error = Some(message.clone());
                state.record(record);
                if ignores_failures(hook) {
                    tracing::warn!(webhook = %hook.name, %message, "fake API server: failing open");
                    continue;
                }
                return Err(ApiError::internal(&message));
            }
        };
        record.allowed = answer.allowed;
        record.warnings = answer.warnings.clone();
        record.patch = answer
            .patch
            .as_ref()
            .and_then(|p| serde_json::to_value(p).ok());
        warnings.extend(answer.warnings.iter().cloned());
        state.record(record);
        if !answer.allowed {
            return Err(call::refusal(&hook.name, &answer.status));
        }
        if let Some(patch) = &answer.patch {
            let mut patched = object.clone();
            // A patch that does not apply is the server's internal error, whatever the
            // failurePolicy (as the real dispatcher treats it).
            json_patch::patch(&mut patched, patch)
                .map_err(|e| ApiError::internal(&e.to_string()))?;
            if patched != *object {
                *object = patched;
                reinvocation.changed();
            }
        }
        if hook.reinvocation_policy.as_deref() == Some("IfNeeded") {
            reinvocation.previously_invoked.push(key);
        }
    }
    Ok(())
}

/// The built-in mutating plugins the fake has.
fn run_builtin(snap: &Snapshot, attrs: &Attributes, object: &mut Value) -> Result<(), ApiError> {
    if attrs.is_pod() {
        priority::admit(object, &snap.classes)?;
    }
    Ok(())
}

/// `v1` -> ("", "v1"); `apps/v1` -> ("apps", "v1").
fn group_version(resource: &ResourceKey) -> (String, String) {
    let api_version = resource.api_version();
    match api_version.split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), api_version),
    }
}

/// What an update (`PUT` or `PATCH`) by `user` of `target` must pass before it is
/// stored, with the stored object and the one that would replace it: the
/// ValidatingAdmissionPolicies, when admission is on (see `policy.rs`).
pub(crate) fn check_update<'a>(
    shared: &'a Shared,
    target: &'a Target,
    user: UserInfo,
    dry_run: bool,
) -> impl Fn(&Store, &Value, &Value) -> Result<(), ApiError> + 'a {
    let (group, version) = group_version(&target.resource);
    let enabled = shared.admission.enabled() && group != "admissionregistration.k8s.io";
    move |store: &Store, old: &Value, new: &Value| {
        if !enabled {
            return Ok(());
        }
        let policies = policy::Policies::of(store);
        let attrs = Attributes {
            group: group.clone(),
            version: version.clone(),
            resource: target.resource.plural.clone(),
            subresource: target.subresource.clone(),
            namespace: target.namespace.clone(),
            name: target.name.clone().unwrap_or_default(),
            kind: new["kind"].as_str().unwrap_or("").to_owned(),
            operation: "UPDATE".into(),
            dry_run,
            user: user.clone(),
        };
        policies
            .validate(&shared.admission.programs, &attrs, Some(old), new)
            .map(|_| ())
    }
}

/// What happens to the object of a create before it is stored: its numeric pod
/// quantities become canonical strings (always, as the API server's decoding does),
/// then the admission chain runs (when the test switched it on).
pub(crate) async fn admit_create(
    shared: &Shared,
    target: &Target,
    mut object: Value,
    user: UserInfo,
    dry_run: bool,
) -> Outcome {
    let (group, version) = group_version(&target.resource);
    if group.is_empty() && target.resource.plural == "pods" && target.subresource.is_none() {
        quantity::canonicalize_pod(&mut object);
    }
    let state = &shared.admission;
    // Webhooks are never called for webhook configurations themselves (so that a bad
    // webhook cannot lock its own configuration).
    if !state.enabled() || group == "admissionregistration.k8s.io" {
        return Outcome {
            result: Ok(object),
            warnings: Vec::new(),
        };
    }
    if let (Some(ns), Some(meta)) = (&target.namespace, object.get_mut("metadata")) {
        if meta.is_object() && meta.get("namespace").is_none() {
            meta["namespace"] = json!(ns);
        }
    }
    let (snap, attrs) = {
        let store = shared.lock();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| store.kinds.get(&target.resource).cloned())
            .unwrap_or_default();
        // A subresource (pods/binding) is named by the URL; an object by itself.
        let name = match &target.subresource {
            Some(_) => target.name.clone().unwrap_or_default(),
            None => meta_str(&object, "name").unwrap_or("").to_owned(),
        };
        let attrs = Attributes {
            group,
            version,
            resource: target.resource.plural.clone(),
            subresource: target.subresource.clone(),
            namespace: target.namespace.clone(),
            name,
            kind,
            operation: "CREATE".into(),
            dry_run,
            user,
        };
        (snapshot(&store, &attrs, &object), attrs)
    };
    let mut warnings = Vec::new();
    let result = chain(state, &snap, &attrs, &mut object, &mut warnings)
        .await
        .and_then(|()| {
            // Validating admission follows mutation.
            let policies = policy::Policies::of(&shared.lock());
            warnings.extend(policies.validate(&state.programs, &attrs, None, &object)?);
            Ok(object)
        });
    Outcome { result, warnings }
}

async fn chain(
    state: &State,
    snap: &Snapshot,
    attrs: &Attributes,
    object: &mut Value,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let mut reinvocation = Reinvocation::default();
    run_builtin(snap, attrs, object)?;
    run_webhooks(state, snap, attrs, object, 0, &mut reinvocation, warnings).await?;
    if !reinvocation.should_reinvoke {
        return Ok(());
    }
    let before = object.clone();
    run_builtin(snap, attrs, object)?;
    if *object != before {
        // The built-in plugins changed the object again: every IfNeeded webhook that
        // ran is called again.
        reinvocation.changed();
    }
    run_webhooks(state, snap, attrs, object, 1, &mut reinvocation, warnings).await
}

/// A dry-run create: checked and filled in as a create would be, stored nowhere, and
/// no watch sees it ("dryRun=All"). Simplification: no resourceVersion.
pub(crate) fn dry_run_create(
    store: &mut Store,
    resource: &ResourceKey,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<Value, ApiError> {
    let name = store.name_for_create(&resource.plural, &mut obj)?;
    if store.get(resource, ns.unwrap_or(""), &name).is_some() {
        return Err(ApiError::already_exists(&resource.plural, &name));
    }
    store.serial += 1;
    let now = store
        .now()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let meta = &mut obj["metadata"];
    meta["name"] = json!(name);
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    meta["uid"] = json!(format!("00000000-0000-4000-9000-{:012x}", store.serial));
    meta["creationTimestamp"] = json!(now);
    obj["apiVersion"] = json!(resource.api_version());
    if resource.plural == "pods"
        && resource.prefix == "/api/v1"
        && obj.pointer("/status/phase").is_none()
    {
        obj["status"] = json!({"phase": "Pending"});
    }
    Ok(obj)
}
