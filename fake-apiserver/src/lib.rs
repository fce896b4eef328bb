//! An in-process **fake** Kubernetes API server for tests.
//!
//! [`FakeApiServer`] holds objects in memory and answers a real [`kube::Client`] (built
//! with [`FakeApiServer::client`], which passes a `tower::Service` to
//! `kube::Client::new`) with the JSON the real API server would send. No socket, no
//! cluster, no sleeps: everything happens on the test's tokio runtime, so tests can run
//! with `#[tokio::test(start_paused = true)]`.
//!
//! # What it speaks
//!
//! Any resource, by URL shape alone (no discovery, no schema): the core group under
//! `/api/v1/...` and every other group under `/apis/<group>/<version>/...`, namespaced
//! (`.../namespaces/<ns>/<plural>/<name>`) and cluster scoped (`.../<plural>/<name>`),
//! with subresources (`/status`, `/approval`, ...: a write to a subresource changes only
//! the object's `status`; a write to the main resource keeps the stored `status`).
//!
//! - **list**: `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`),
//!   `fieldSelector` (`=`, `==`, `!=`, with `\`-escaped `,` and `=` in values, on the
//!   field labels kube-apiserver supports for the resource: `metadata.name`, and
//!   `metadata.namespace` where namespaced, plus e.g. a pod's `spec.nodeName` and
//!   `status.phase`, a node's `spec.unschedulable`, an event's `involvedObject.*`;
//!   any other label is a 400 BadRequest worded as the server words it, mostly
//!   `field label not supported: <label>`; a missing field reads as the API server's
//!   selectable fields give it, `""` for `spec.nodeName`),
//!   `limit`/`continue` paging (the token is an offset: pages are not a consistent
//!   snapshot), and the list's `resourceVersion`. Watch and deletecollection take the
//!   same selectors.
//! - **watch** (`?watch=true`, or any value but `0` and `false`, as the API server
//!   reads a boolean parameter: Python's client sends `True`): newline-delimited
//!   `WatchEvent`s, resumable from a `resourceVersion` (changes are replayed from a
//!   history of the last 10,000; an older version gets an `ERROR` event with a 410
//!   `Expired` status, as the real server sends); without one, or with `0`, it begins
//!   with a synthetic `ADDED` for each object that matches now. A modification that makes an object leave (enter) a watch's selection is
//!   sent as `DELETED` (`ADDED`). `timeoutSeconds` ends the stream. No bookmarks.
//! - **get**, **create** (`409 AlreadyExists`, `generateName`, `uid`,
//!   `creationTimestamp`, `resourceVersion`; new pods get `status.phase: Pending`;
//!   `?dryRun=All` answers what would be stored and stores nothing; a pod's numeric
//!   resource quantities, as KubeSpawner sends them, are stored as canonical strings:
//!   `4.0` -> `"4"`, `0.5` -> `"500m"`; other objects' quantities are left alone),
//!   **replace** (`409 Conflict` on a stale `metadata.resourceVersion`), **patch**
//!   (`application/json-patch+json` as RFC 6902; merge, strategic-merge and apply
//!   patches all as RFC 7386 merge patches, so lists are replaced whole; an apply patch
//!   of an absent object creates it), **delete** and **deletecollection**.
//! - **Graceful deletion**: an object with finalizers is marked (`deletionTimestamp`)
//!   and removed when an update empties its finalizers. A pod bound to a node
//!   (`spec.nodeName`) and not finished is marked and stays until the test says the
//!   kubelet is done ([`FakeApiServer::pod_gone`], [`FakeApiServer::finish_deletions`]),
//!   unless the delete asks for `gracePeriodSeconds=0` or [`PodDeletion::Immediate`] is
//!   set. Everything else is removed at once. Delete preconditions (`uid`,
//!   `resourceVersion`) are checked.
//! - Unchanged writes do not bump the resource version nor send events.
//! - Errors are `Status` objects with the real `reason`s and codes (`NotFound` 404,
//!   `AlreadyExists` 409, `Conflict` 409, `Invalid` 422, `BadRequest` 400, `Expired`
//!   410). `/version` answers v1.30.
//! - **Discovery** (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`): the
//!   unaggregated documents, naming the resources the lab uses (`discovery.rs`); an
//!   empty list is still of its kind (`PodList`).
//! - **Tables**: a get, list or watch asked for as `Table` (`Accept:
//!   application/json;as=Table;v=v1;g=meta.k8s.io`, what `kubectl get` sends) answers
//!   kube-apiserver's printer columns for pods, nodes, namespaces and Events, `Name`
//!   and `Created At` for the rest (`table.rs`); a watch's events carry one-row
//!   Tables (`kubectl get -w`).
//! - **Events** are one resource under two APIs: a get or list of core `v1` Events
//!   also returns the `events.k8s.io/v1` ones converted, and the other way round
//!   (`event_views.rs`); watches too.
//!
//! # Over HTTP
//!
//! [`FakeApiServer::http_service`] is the fake for a socket (the lab serves it over
//! HTTPS for `kubectl`): unlike the in-process client, every request authenticates
//! with a bearer token, a static one ([`FakeApiServer::user_token`]) or a
//! ServiceAccount token issued for [`API_AUDIENCE`]; none or any other is a 401.
//! Impersonation headers need RBAC's `impersonate` verb, and RBAC (when on) decides
//! for whoever authenticated, discovery paths included (`nonResourceURLs`).
//!
//! # Scheduler and kubelet (opt-in)
//!
//! A test that calls [`FakeApiServer::enable_scheduler`] gets kube-scheduler's
//! behaviour; one that does not sees pods stay unbound, as before. After every change to
//! pods or nodes (a request or a test hook), before the request is answered, pending
//! pods are scheduled, so when a pod create returns it is bound or marked unschedulable.
//!
//! - Queue order: higher `spec.priority` first, then arrival ("Pod Priority and
//!   Preemption"); pods of another `schedulerName` are left alone.
//! - Filters in kube-scheduler's order: cordon, `NoSchedule`/`NoExecute` taints against
//!   tolerations, `nodeSelector` and required node affinity (`In`, `NotIn`, `Exists`,
//!   `DoesNotExist`, `Gt`, `Lt`, `matchFields` on `metadata.name`), then every requested
//!   resource against `status.allocatable` minus what the node's unfinished pods hold,
//!   terminating ones included ("Resource Management for Pods and Containers"): the
//!   request is the sum over containers or the largest init container, sidecars and
//!   `overhead` counted, a limit without a request counts as the request, and a resource
//!   the node does not advertise is insufficient.
//! - Bound: `spec.nodeName` and `PodScheduled=True`, as the binding subresource writes
//!   them. Not: `PodScheduled=False`, reason `Unschedulable`, and kube-scheduler's message
//!   (`0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2
//!   Insufficient gpu-booking.io/gpumem. preemption: 0/3 nodes are available: ...`).
//! - Preemption as DefaultPreemption does it: not for `preemptionPolicy: Never`; victims of
//!   strictly lower priority on one node, the most important reprieved first; victims get
//!   `DisruptionTarget` (reason `PreemptionByScheduler`) then a graceful delete, the
//!   preemptor `status.nominatedNodeName`, and no second round while its nominated node
//!   still has victims terminating. PodDisruptionBudgets are ignored.
//! - An unschedulable pod is retried when a node changes, a pod on a node goes away or
//!   finishes, or its own spec changes (kube-scheduler's cluster events), not on a timer.
//! - Simplified: nodes are scored by free CPU and memory only (ties: first by name); no
//!   inter-pod affinity, topology spread, ports or volumes; no backoff; no Events.
//!
//! [`FakeApiServer::enable_kubelet`] adds a kubelet on every node: a bound pod starts at
//! once (`Running`, `startTime`, ready containers, `Ready`, its own `podIP`: the lowest
//! free `127.0.0.N`, or what [`FakeApiServer::set_pod_network`] picks), and a graceful deletion ends
//! after the grace period (the delete's `gracePeriodSeconds`, else the pod's
//! `terminationGracePeriodSeconds`, else 30 s) on the tokio clock, freeing its resources.
//! Simplified: containers always start and always use their whole grace period; no
//! kubelet admission of pods bound straight to a full node.
//! # Admission (opt-in: [`FakeApiServer::enable_admission`])
//!
//! A create then runs kube-apiserver's mutating admission before it is stored
//! ("Admission Controllers", "Dynamic Admission Control"): the `Priority` plugin
//! (`priorityClassName`, else the lowest `globalDefault` class, else 0, resolved to
//! `spec.priority` and `spec.preemptionPolicy`; 403 `Forbidden` for an unknown class or
//! a disagreeing priority or policy; `system-node-critical` and
//! `system-cluster-critical` always exist), then every webhook of the stored
//! `admissionregistration.k8s.io/v1` `MutatingWebhookConfiguration`s, configurations by
//! name, webhooks in order; if a webhook changed the object, a second round re-runs
//! `Priority` (so a webhook that sets a class must remove the priority it found) and
//! the `IfNeeded` webhooks that ran before the change.
//!
//! - Matching: `rules` (operations, groups, versions, resources with `*`, `*/*`,
//!   `pods/*`, `*/status`, scope), `namespaceSelector` (the namespace's stored labels
//!   plus `kubernetes.io/metadata.name`; a Namespace being created is matched on its
//!   own labels; other cluster-scoped objects always match), `objectSelector`, and
//!   `matchConditions` in CEL (the `cel` crate) over `object`, `oldObject`, `request`;
//!   a false condition skips the webhook, an error skips it (`Ignore`) or refuses the
//!   request with 403 (`Fail`).
//! - The call: an HTTPS POST of an `admission.k8s.io/v1` AdmissionReview (uid, kind,
//!   resource, name, namespace, operation, `userInfo`, object, dryRun, options) to
//!   `https://<service>.<namespace>.svc:<port><path>?timeout=<n>s`, the certificate
//!   checked against `caBundle` for that name, or to `clientConfig.url`;
//!   `timeoutSeconds` (default 10) enforced. Services are found through
//!   [`FakeApiServer::register_service`].
//! - Failures to call (unregistered service, TLS, timeout, HTTP error, an answer of the
//!   wrong version, kind or uid, a bad patch type or undecodable patch): `Ignore` goes
//!   on unchanged; `Fail` answers 500 `Internal error occurred: failed calling webhook
//!   "<name>": ...`. A patch that does not apply is a 500 whatever the policy, as in
//!   the real dispatcher.
//! - `allowed: false`: the webhook's status, `admission webhook "<name>" denied the
//!   request: <message>`, code 400 or more. `warnings` become `Warning: 299 - "<text>"`
//!   headers (also on a refusal). Every call is in [`FakeApiServer::admission_log`].
//! - `?dryRun=All`: the review says `dryRun: true`, and a webhook whose `sideEffects` is
//!   not `None`/`NoneOnDryRun` refuses the request (400 `does not support dry run`).
//! - Identity: the review's `userInfo` is whoever the request's impersonation headers
//!   name ([`FakeApiServer::client_as`]), else `system:admin` in `system:masters`.
//!
//! Simplifications, each a line:
//! - Mutating webhooks see only creates through the API; updates and patches run the
//!   ValidatingAdmissionPolicies alone (`admission/policy.rs`); deletes and the test
//!   hooks ([`FakeApiServer::put`] and the like) skip admission.
//! - Reviews are always `admission.k8s.io/v1`, whatever `admissionReviewVersions` lists.
//! - No built-in plugin but `Priority` (no defaulting, no ServiceAccount, no
//!   DefaultTolerationSeconds, no LimitRanger), and no validating webhooks.
//! - `matchPolicy` is ignored: only the exact group/version/resource matches.
//! - CEL has no `authorizer` variable, and expressions are compiled at each call, not
//!   checked when the configuration is stored.
//! - Webhooks are never called for `admissionregistration.k8s.io` objects (as in the
//!   real server), and the reinvocation round runs at most once (the real one too).
//! - A dry-run create answers without `resourceVersion`.
//! - Webhook calls use real sockets and tokio timers: under a paused clock
//!   (`start_paused`) the timeout fires as soon as the runtime idles, so admission tests
//!   run on the real clock.
//!
//! # Authorization and validation
//!
//! - [`FakeApiServer::enable_rbac`]: every request is authorized as kube-apiserver's
//!   RBAC authorizer does ("Using RBAC Authorization"), from the stored Roles,
//!   ClusterRoles and bindings, the requester named by the impersonation headers;
//!   refusals are 403s in the API server's words, kept in
//!   [`FakeApiServer::denials`] (`rbac.rs`). Without it, every request is allowed.
//! - ValidatingAdmissionPolicies and their bindings, with admission on: creates and
//!   updates are checked after mutation, with the same CEL interpreter; a false
//!   validation is the 422 kube-apiserver answers (`admission/policy.rs`).
//! - A pod update that changes its spec beyond images, `activeDeadlineSeconds`,
//!   added tolerations and a negative grace period set to 1 is refused (422) as
//!   `ValidatePodUpdate` refuses it ("Pod Lifecycle"; `validation.rs`).
//!
//! # Test hooks
//!
//! - Objects directly, without a request: [`FakeApiServer::put`] (create or replace a
//!   typed object), [`FakeApiServer::put_value`], [`FakeApiServer::get`],
//!   [`FakeApiServer::get_value`], [`FakeApiServer::list`], [`FakeApiServer::modify`]
//!   (what a kubelet or scheduler would change, e.g. a pod's status),
//!   [`FakeApiServer::remove`] (gone for good).
//! - "Pod gone": [`FakeApiServer::pod_gone`], [`FakeApiServer::finish_deletions`].
//! - Failures: [`FakeApiServer::fail`] with a [`Failure`] (verb, resource, name, HTTP
//!   code, how many times).
//! - Counting: [`FakeApiServer::count`] by [`Verb`] (and resource), and the request log
//!   [`FakeApiServer::requests`] (switch it off for big benchmarks with
//!   [`FakeApiServer::keep_request_log`]).
//! - Waiting without sleeping: [`FakeApiServer::wait_until`] re-checks a condition after
//!   every request or change.
//! - Time: [`FakeApiServer::set_clock`] for `creationTimestamp` and deletion marks.
//! - Nodes and placement: [`FakeApiServer::add_node`] with a [`NodeBuilder`] (GPUs,
//!   allocatable resources, labels, taints, cordon), [`FakeApiServer::pod_node`],
//!   [`FakeApiServer::unschedulable_reason`], [`FakeApiServer::schedule_now`] (one
//!   pass, opted in or not).
//!
//! ```
//! # async fn demo() {
//! use gpu_booking_fake_apiserver::{FakeApiServer, Verb};
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::api::{Api, PostParams};
//!
//! let server = FakeApiServer::new();
//! let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
//! let mut pod = Pod::default();
//! pod.metadata.name = Some("jupyter-alice".into());
//! pods.create(&PostParams::default(), &pod).await.unwrap();
//! assert!(server.get::<Pod>(Some("jhub"), "jupyter-alice").is_some());
//! assert_eq!(server.count(Verb::Create, "pods"), 1);
//! # }
//! ```
#![forbid(unsafe_code)]

mod admission;
mod authn;
mod change;
mod discovery;
mod event_convert;
mod event_views;
mod field_labels;
mod fields;
mod filters;
mod kubelet;
mod node_builder;
mod over_http;
mod path;
mod preemption;
mod rbac;
mod resources;
mod scheduler;
mod select;
mod service;
mod settle;
mod sim;
mod snapshot;
mod status;
mod store;
mod table;
mod tokenreview;
mod validation;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Notify;

pub use admission::{AdmissionRecord, UserInfo};
pub use authn::API_AUDIENCE;
pub use node_builder::NodeBuilder;
pub use over_http::HttpService;
pub use path::ResourceKey;
pub use rbac::Denial;
pub use service::ResponseBody;
pub use status::ApiError;

/// What a request does, as RBAC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

/// One request, as the fake saw it.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub verb: Verb,
    pub method: String,
    pub path: String,
    pub query: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The JSON body, when there was one.
    pub body: Option<Value>,
}

/// How pods bound to a node end when deleted with a grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodDeletion {
    /// Marked terminating; removed when the test calls [`FakeApiServer::pod_gone`] or
    /// [`FakeApiServer::finish_deletions`] (the kubelet's confirmation).
    #[default]
    WaitForKubelet,
    /// Marked terminating and removed at once (a MODIFIED then a DELETED event).
    Immediate,
}

/// An injected failure: requests that match get `code` and a `Status` body instead of
/// being carried out. Unset fields match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub verb: Option<Verb>,
    pub plural: Option<String>,
    pub name: Option<String>,
    pub code: u16,
    /// How many requests fail; `None`: until [`FakeApiServer::clear_failures`].
    pub times: Option<u32>,
}

impl Failure {
    /// Every `verb` request to resource `plural` fails with HTTP 500, once.
    pub fn on(verb: Verb, plural: &str) -> Self {
        Self {
            verb: Some(verb),
            plural: Some(plural.to_owned()),
            name: None,
            code: 500,
            times: Some(1),
        }
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    pub fn code(mut self, code: u16) -> Self {
        self.code = code;
        self
    }

    pub fn times(mut self, times: u32) -> Self {
        self.times = Some(times.max(1));
        self
    }

    pub fn always(mut self) -> Self {
        self.times = None;
        self
    }

    fn matches(&self, verb: Verb, plural: &str, name: Option<&str>) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.plural.as_deref().is_none_or(|p| p == plural)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

pub(crate) struct Shared {
    store: Mutex<store::Store>,
    notify: Notify,
    /// Itself, for the kubelet's timers (which outlive the request that set them).
    me: Weak<Shared>,
    admission: admission::State,
    /// ServiceAccount tokens issued by the test, for TokenReviews.
    tokens: Mutex<tokenreview::Tokens>,
    /// The static token file of callers over HTTP ([`FakeApiServer::user_token`]).
    users: Mutex<authn::StaticTokens>,
    /// Whether requests are authorized ([`FakeApiServer::enable_rbac`]).
    rbac: std::sync::atomic::AtomicBool,
    /// The requests RBAC refused, in order.
    denials: Mutex<Vec<Denial>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, store::Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a request or a test hook: the opt-in scheduler and kubelet act on what
    /// changed, then waiters re-check.
    fn changed(&self) {
        settle::settle(self, false);
        self.notify.notify_waiters();
    }
}

/// The fake API server. Cheap to clone; clones share the same objects.
#[derive(Clone)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

/// The resource key of a typed object (`/api/v1` + `pods`).
fn key_of<K: kube::Resource<DynamicType = ()>>() -> ResourceKey {
    let prefix = if K::group(&()).is_empty() {
        format!("/api/{}", K::version(&()))
    } else {
        format!("/apis/{}/{}", K::group(&()), K::version(&()))
    };
    ResourceKey::new(prefix, K::plural(&()))
}

/// The resource key of an `apiVersion` and plural.
fn key_for(api_version: &str, plural: &str) -> ResourceKey {
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    ResourceKey::new(prefix, plural)
}

impl FakeApiServer {
    pub fn new() -> Self {
        Self {
            shared: Arc::new_cyclic(|me| Shared {
                store: Mutex::new(store::Store::new()),
                notify: Notify::new(),
                me: me.clone(),
                admission: admission::State::default(),
                tokens: Mutex::default(),
                users: Mutex::default(),
                rbac: std::sync::atomic::AtomicBool::new(false),
                denials: Mutex::default(),
            }),
        }
    }

    /// A `kube::Client` talking to this fake; `default` is its default namespace.
    /// Needs a tokio runtime (the client spawns its request buffer).
    pub fn client_in(&self, default: &str) -> kube::Client {
        kube::Client::new(self.service(), default)
    }

    /// Issues a ServiceAccount token for `namespace/name`, bound to `audiences`, as
    /// the kubelet projects one; TokenReviews authenticate it until the fake drops.
    /// JWT-shaped (RS256 header) like the real ones, but only this fake accepts it.
    pub fn service_account_token(&self, namespace: &str, name: &str, audiences: &[&str]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(br#"{"alg":"RS256","kid":"fake"}"#);
        let claims = serde_json::json!({
            "iss": "https://kubernetes.default.svc.cluster.local",
            "sub": format!("system:serviceaccount:{namespace}:{name}"),
            "aud": audiences,
            "jti": uuid_like(),
        });
        let token = format!(
            "{header}.{}.{}",
            b64.encode(claims.to_string()),
            b64.encode(uuid_like())
        );
        let issued = tokenreview::Issued {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        };
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .issued
            .insert(token.clone(), issued);
        token
    }

    /// A bearer token that authenticates `username` in `groups` (plus
    /// `system:authenticated`) to [`Self::http_service`], as a line of kube-apiserver's
    /// static token file (`--token-auth-file`) would.
    pub fn user_token(&self, username: &str, groups: &[&str]) -> String {
        use base64::Engine;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{username}:{}", uuid_like()));
        self.shared
            .users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .insert(token.clone(), UserInfo::new(username, groups));
        token
    }

    /// The fake as a server over HTTP (see [`HttpService`]): every request
    /// authenticates with a bearer token ([`Self::user_token`], or a
    /// [`Self::service_account_token`] for [`API_AUDIENCE`]).
    pub fn http_service(&self) -> HttpService {
        HttpService {
            shared: self.shared.clone(),
        }
    }

    /// [`Self::client_in`] the `default` namespace.
    pub fn client(&self) -> kube::Client {
        self.client_in("default")
    }

    /// The `tower::Service` itself, for building a client some other way.
    pub fn service(&self) -> FakeService {
        FakeService {
            shared: self.shared.clone(),
            user: None,
        }
    }

    /// A client whose requests are made as `username` in `groups` (plus
    /// `system:authenticated`): it sends the impersonation headers
    /// (`Impersonate-User`, `Impersonate-Group`), and admission webhooks see that user in
    /// the review's `userInfo`. [`Self::client`] acts as `system:admin`.
    pub fn client_as(&self, username: &str, groups: &[&str]) -> kube::Client {
        let service = FakeService {
            shared: self.shared.clone(),
            user: Some(Arc::new(UserInfo::new(username, groups))),
        };
        kube::Client::new(service, "default")
    }

    /// From now on a create runs the admission chain as kube-apiserver does before it
    /// is stored: the `Priority` plugin, then the webhooks of the stored
    /// `MutatingWebhookConfiguration`s (see the crate docs, "Admission").
    pub fn enable_admission(&self) {
        self.shared.admission.enable();
    }

    /// From now on every request is authorized as kube-apiserver's RBAC authorizer
    /// does, from the stored Roles, ClusterRoles and their bindings (see
    /// `rbac.rs`); the bootstrap roles a cluster starts with are stored now. Requests
    /// of [`Self::client`] (the cluster admin, in `system:masters`) are always allowed.
    pub fn enable_rbac(&self) {
        self.store_bootstrap_roles();
        self.shared
            .rbac
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stores the bootstrap ClusterRoles and ClusterRoleBindings a cluster starts with
    /// (`cluster-admin`, `view`, `system:discovery`, ...: `rbac.rs`) where missing,
    /// without switching RBAC on, so that bindings to them can be made first.
    pub fn store_bootstrap_roles(&self) {
        let mut store = self.lock();
        for (plural, obj) in rbac::bootstrap_objects() {
            let key = key_for("rbac.authorization.k8s.io/v1", plural);
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if store.get(&key, "", &name).is_none() {
                let _ = store.create(&key, None, obj);
            }
        }
    }

    /// Every request RBAC refused so far, in order (see [`Self::enable_rbac`]).
    pub fn denials(&self) -> Vec<Denial> {
        self.shared
            .denials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Where the webhook service `namespace/name` on `port` (its `clientConfig.service`)
    /// really listens: the fake's stand-in for cluster DNS and the service proxy.
    pub fn register_service(&self, namespace: &str, name: &str, port: u16, addr: SocketAddr) {
        self.shared
            .admission
            .register_service(namespace, name, port, addr);
    }

    /// Every webhook call so far, in order.
    pub fn admission_log(&self) -> Vec<AdmissionRecord> {
        self.shared.admission.log()
    }

    fn lock(&self) -> MutexGuard<'_, store::Store> {
        self.shared.lock()
    }

    /// Creates or replaces a typed object as the API server would store it (uid,
    /// resource version, timestamps filled in; watches see ADDED or MODIFIED) and
    /// returns the stored version. Status included: this is the kubelet's pen.
    pub fn put<K>(&self, obj: &K) -> K
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
        value["apiVersion"] = Value::String(K::api_version(&()).into_owned());
        value["kind"] = Value::String(K::kind(&()).into_owned());
        let stored = self.put_at(key_of::<K>(), value);
        serde_json::from_value(stored)
            .unwrap_or_else(|e| panic!("fake: stored object does not read back: {e}"))
    }

    /// [`Self::put`] for a JSON object of resource `plural` (its `apiVersion` says the
    /// group and version). Panics on a malformed object: this is a test hook.
    pub fn put_value(&self, plural: &str, obj: Value) -> Value {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("fake: put_value needs an apiVersion"))
            .to_owned();
        self.put_at(key_for(&api_version, plural), obj)
    }

    fn put_at(&self, key: ResourceKey, mut obj: Value) -> Value {
        let ns = fields::meta_str(&obj, "namespace").map(str::to_owned);
        let name = fields::meta_str(&obj, "name")
            .unwrap_or_else(|| panic!("fake: put needs metadata.name"))
            .to_owned();
        let stored = {
            let mut store = self.lock();
            match store.get(&key, ns.as_deref().unwrap_or(""), &name) {
                Some(_) => {
                    if let Some(m) = obj["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    let ns = ns.clone().unwrap_or_default();
                    store.update(&key, &ns, &name, store::Write::Whole, obj)
                }
                None => store.create(&key, ns.as_deref(), obj),
            }
            .unwrap_or_else(|e| panic!("fake: put: {:?}", e.body))
        };
        self.shared.changed();
        (*stored).clone()
    }

    /// The stored object, if any (`ns` is `None` for cluster-scoped objects).
    pub fn get<K>(&self, ns: Option<&str>, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let value = self.lock().get(&key_of::<K>(), ns.unwrap_or(""), name)?;
        serde_json::from_value((*value).clone()).ok()
    }

    /// The stored JSON of an object of `apiVersion` and `plural`.
    pub fn get_value(
        &self,
        api_version: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let value = self
            .lock()
            .get(&key_for(api_version, plural), ns.unwrap_or(""), name)?;
        Some((*value).clone())
    }

    /// Every stored object of type `K` (in namespace `ns`, or all).
    pub fn list<K>(&self, ns: Option<&str>) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.lock()
            .list(&key_of::<K>(), ns, &Default::default())
            .into_iter()
            .filter_map(|v| serde_json::from_value((*v).clone()).ok())
            .collect()
    }

    /// Changes a stored object in place, status included (what a kubelet or scheduler
    /// does); watches see MODIFIED. Returns false when there is no such object.
    pub fn modify<K>(&self, ns: Option<&str>, name: &str, change: impl FnOnce(&mut Value)) -> bool
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let key = key_of::<K>();
        let ns = ns.unwrap_or("");
        let done = {
            let mut store = self.lock();
            let Some(old) = store.get(&key, ns, name) else {
                return false;
            };
            let mut new = (*old).clone();
            change(&mut new);
            if let Some(m) = new["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            store
                .update(&key, ns, name, store::Write::Whole, new)
                .is_ok()
        };
        self.shared.changed();
        done
    }

    /// Removes an object for good (DELETED), marked for deletion or not.
    pub fn remove<K>(&self, ns: Option<&str>, name: &str) -> bool
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let gone = self
            .lock()
            .remove(&key_of::<K>(), ns.unwrap_or(""), name)
            .is_some();
        self.shared.changed();
        gone
    }

    /// The kubelet confirms a pod is gone: it is removed (DELETED). False if absent.
    pub fn pod_gone(&self, ns: &str, name: &str) -> bool {
        self.remove::<k8s_openapi::api::core::v1::Pod>(Some(ns), name)
    }

    /// Removes every object that is marked for deletion and has no finalizers left
    /// (every terminating pod's kubelet confirms). Returns how many.
    pub fn finish_deletions(&self) -> usize {
        let n = {
            let mut store = self.lock();
            let doomed = store.terminating();
            for (key, ns, name) in &doomed {
                store.remove(key, ns, name);
            }
            doomed.len()
        };
        self.shared.changed();
        n
    }

    /// From now on pending pods are scheduled as kube-scheduler would (see the crate
    /// docs), after every change to pods or nodes, before the request that made it is
    /// answered: when a pod create returns, the pod is bound or marked unschedulable.
    pub fn enable_scheduler(&self) {
        {
            let mut store = self.lock();
            store.sim.scheduler = true;
            store.sim.dirty = true;
            store.sim.room = true;
        }
        self.shared.changed();
    }

    /// From now on a minimal kubelet runs every node: bound pods start (`Running`,
    /// ready) and graceful deletions end after the grace period on the tokio clock
    /// (see the crate docs). [`Self::pod_gone`] and [`Self::finish_deletions`] still
    /// end them early.
    pub fn enable_kubelet(&self) {
        {
            let mut store = self.lock();
            store.sim.kubelet = true;
            store.sim.dirty = true;
        }
        self.shared.changed();
    }

    /// The cluster's network plugin: `pick` gives each pod the kubelet starts its
    /// address (`status.podIP`), or `None` for the kubelet's own choice (the lowest
    /// free `127.0.0.N`). It runs while the fake is locked: it must not call the fake.
    pub fn set_pod_network(&self, pick: impl Fn(&Value) -> Option<String> + Send + Sync + 'static) {
        self.lock().sim.pod_network = Some(Arc::new(pick));
    }

    /// One scheduling pass now, whether or not [`Self::enable_scheduler`] was called.
    pub fn schedule_now(&self) {
        self.lock().sim.room = true;
        settle::settle(&self.shared, true);
        self.shared.notify.notify_waiters();
    }

    /// Stores a node made by a [`NodeBuilder`] (pending pods may now fit).
    pub fn add_node(&self, node: NodeBuilder) -> k8s_openapi::api::core::v1::Node {
        self.put(&node.build())
    }

    /// The node pod `ns/name` is bound to (`spec.nodeName`), if it exists and is bound.
    pub fn pod_node(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.lock().get(&snapshot::pods_key(), ns, name)?;
        scheduler::node_of(&pod)
    }

    /// Why pod `ns/name` is pending: the message of its `PodScheduled=False` condition
    /// (`0/3 nodes are available: ...`); `None` when it has none.
    pub fn unschedulable_reason(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.lock().get(&snapshot::pods_key(), ns, name)?;
        scheduler::unschedulable_message(&pod)
    }

    /// How pods bound to a node end when deleted.
    pub fn set_pod_deletion(&self, mode: PodDeletion) {
        self.lock().pod_deletion = mode;
    }

    /// Injects a failure (see [`Failure`]); the first matching one applies.
    pub fn fail(&self, failure: Failure) {
        self.lock().failures.push(failure);
    }

    pub fn clear_failures(&self) {
        self.lock().failures.clear();
    }

    /// Requests of `verb` to resource `plural` so far.
    pub fn count(&self, verb: Verb, plural: &str) -> u64 {
        self.lock()
            .counts
            .get(&(verb, plural.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests of `verb` to any resource so far.
    pub fn count_verb(&self, verb: Verb) -> u64 {
        self.lock()
            .counts
            .iter()
            .filter(|((v, _), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Every request so far, in order (empty when the log is off).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.lock().log.clone().unwrap_or_default()
    }

    /// Keeps (the default) or drops the request log; a benchmark of thousands of
    /// requests does not want it.
    pub fn keep_request_log(&self, keep: bool) {
        self.lock().log = keep.then(Vec::new);
    }

    /// Where `creationTimestamp` and deletion marks come from (default: `Utc::now`).
    pub fn set_clock(&self, clock: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) {
        self.lock().clock = Arc::new(clock);
    }

    /// The latest resource version.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Waits until `condition` holds, re-checking after every request and change.
    pub async fn wait_until(&self, mut condition: impl FnMut(&FakeApiServer) -> bool) {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition(self) {
                return;
            }
            notified.await;
        }
    }
}

/// The `tower::Service` a `kube::Client` sends its requests to.
#[derive(Clone)]
pub struct FakeService {
    shared: Arc<Shared>,
    /// Who the requests are from ([`FakeApiServer::client_as`]); `None`: the admin.
    user: Option<Arc<UserInfo>>,
}

impl tower::Service<http::Request<kube::client::Body>> for FakeService {
    type Response = http::Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<kube::client::Body>) -> Self::Future {
        if let Some(user) = &self.user {
            user.stamp(req.headers_mut());
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let user = UserInfo::from_headers(&parts.headers);
            match service::read_body(body).await {
                Ok(body) => Ok(service::handle(shared, parts, body, user).await),
                Err(response) => Ok(response),
            }
        })
    }
}

/// A value unique within the process (token ids).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}-{n:x}")
}
