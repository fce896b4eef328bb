//! The fake API server's admission chain against the documented behaviour of
//! kube-apiserver: "Dynamic Admission Control" (matching, failurePolicy, timeouts,
//! responses, warnings, side effects, reinvocation), "Admission Controllers" (the
//! Priority plugin and its place before the webhooks) and "Pod Priority and
//! Preemption". Each webhook is a real HTTPS server with its own CA, scripted per test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use gpu_booking_certs::pki::DevCerts;
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value};
use tower::ServiceExt;

const HOOK_NS: &str = "gpu-booking";
const HOOK_SVC: &str = "hook";

/// What a scripted webhook answers to one review.
enum Reply {
    /// `response` of an AdmissionReview (its uid is filled in from the request).
    Review(Value),
    /// A whole body, sent as it is.
    Raw(Value),
    /// Never answers.
    Hang,
}

type Script = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Clone)]
struct HookState {
    script: Script,
    seen: Arc<Mutex<Vec<Value>>>,
}

async fn mutate(State(state): State<HookState>, Json(review): Json<Value>) -> Response {
    state.seen.lock().unwrap().push(review.clone());
    match (state.script)(&review) {
        Reply::Review(mut response) => {
            response["uid"] = review["request"]["uid"].clone();
            Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
                .into_response()
        }
        Reply::Raw(body) => Json(body).into_response(),
        Reply::Hang => std::future::pending().await,
    }
}

/// A scripted HTTPS webhook serving `/mutate` with a certificate for `names`.
struct Hook {
    addr: SocketAddr,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Value>>>,
    _dir: tempfile::TempDir,
}

impl Hook {
    async fn start(
        names: &[&str],
        script: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let certs = DevCerts::generate("test webhook CA", &names).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let paths = certs.write_to(dir.path()).unwrap();
        let metrics = Arc::new(gpu_booking_webhook::Metrics::new());
        let store = gpu_booking_webhook::CertStore::load(paths.cert, paths.key, metrics).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/mutate", post(mutate))
            .with_state(HookState {
                script: Arc::new(script),
                seen: seen.clone(),
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(gpu_booking_webhook::serve_tls(
            listener,
            Arc::new(store),
            app,
            // A test server lives as long as the test process.
            Box::leak(Box::default()),
            std::future::pending(),
        ));
        Self {
            addr,
            ca_pem: certs.ca_pem,
            seen,
            _dir: dir,
        }
    }

    /// A webhook behind the service `gpu-booking/hook`, registered with `server`.
    async fn service(
        server: &FakeApiServer,
        script: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let hook = Self::start(&["hook.gpu-booking.svc"], script).await;
        server.register_service(HOOK_NS, HOOK_SVC, 443, hook.addr);
        hook
    }

    fn reviews(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

fn allow() -> Reply {
    Reply::Review(json!({"allowed": true}))
}

fn patch(ops: Value) -> Reply {
    let encoded = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
    Reply::Review(json!({"allowed": true, "patchType": "JSONPatch", "patch": encoded}))
}

fn b64(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// One mutating webhook for pod creations behind the test service, trusting `ca_pem`;
/// `extra` overrides or adds fields.
fn webhook(name: &str, ca_pem: &str, extra: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": HOOK_SVC, "namespace": HOOK_NS, "path": "/mutate", "port": 443},
            "caBundle": b64(ca_pem)
        },
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "reinvocationPolicy": "Never"
    });
    for (k, v) in extra.as_object().unwrap() {
        hook[k] = v.clone();
    }
    hook
}

fn configure(server: &FakeApiServer, name: &str, hooks: Vec<Value>) {
    server.put_value(
        "mutatingwebhookconfigurations",
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": hooks
        }),
    );
}

/// A fake API server with its admission chain on, and a webhook behind its test
/// service answering with `script`.
async fn admitting(
    script: impl Fn(&Value) -> Reply + Send + Sync + 'static,
) -> (FakeApiServer, Hook) {
    let server = FakeApiServer::new();
    server.enable_admission();
    let hook = Hook::service(&server, script).await;
    (server, hook)
}

/// The configuration `c` with one webhook, `h.example.com`, trusting `hook`'s CA
/// (`extra` as in [`webhook`]).
fn configure_one(server: &FakeApiServer, hook: &Hook, extra: Value) {
    configure(
        server,
        "c",
        vec![webhook("h.example.com", &hook.ca_pem, extra)],
    );
}

fn priority_class(
    server: &FakeApiServer,
    name: &str,
    value: i64,
    policy: &str,
    global_default: bool,
) {
    server.put_value(
        "priorityclasses",
        json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
            "preemptionPolicy": policy, "globalDefault": global_default
        }),
    );
}

fn pod(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "nb", "image": "jupyter"}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "jupyterhub"}},
        "spec": spec
    }))
    .unwrap()
}

fn gpu_pod(name: &str) -> Pod {
    pod(
        name,
        json!({"containers": [{"name": "nb", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
    )
}

async fn create(
    server: &FakeApiServer,
    ns: &str,
    pod: &Pod,
) -> Result<Pod, kube::core::ErrorResponse> {
    let pods: Api<Pod> = Api::namespaced(server.client(), ns);
    pods.create(&PostParams::default(), pod)
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) => status,
            other => panic!("expected an API error, got {other:?}"),
        })
}

/// The chart's matchConditions expression as `helm template` renders it with the
/// default values (templates/mutatingwebhookconfiguration.yaml, gpuResources
/// `[nvidia.com/gpu]`, no modelResources).
const CHART_CONDITION: &str = "object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.requests) && ('nvidia.com/gpu' in c.resources.requests)) || (has(c.resources.limits) && ('nvidia.com/gpu' in c.resources.limits)))) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.requests) && ('nvidia.com/gpu' in c.resources.requests)) || (has(c.resources.limits) && ('nvidia.com/gpu' in c.resources.limits)))))";

/// The chart's webhook fields (default values, release namespace `gpu-booking`).
fn chart_shaped(ca_pem: &str, failure_policy: &str) -> Value {
    webhook(
        "pods.gpu-booking.io",
        ca_pem,
        json!({
            "failurePolicy": failure_policy,
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gpu-booking", "kube-system"]},
                {"key": "gpu-booking.io/webhook", "operator": "NotIn", "values": ["disabled"]}
            ]},
            "matchConditions": [{"name": "requests-a-gpu", "expression": CHART_CONDITION}]
        }),
    )
}

#[tokio::test]
async fn match_conditions_of_the_chart_send_only_gpu_pods_to_the_webhook() {
    // "Dynamic Admission Control": Matching requests: matchConditions (CEL).
    let (server, hook) = admitting(|_| allow()).await;
    configure(
        &server,
        "gpu-booking",
        vec![chart_shaped(&hook.ca_pem, "Fail")],
    );

    create(&server, "jhub", &pod("cpu-only", json!({})))
        .await
        .unwrap();
    let requests_only = pod(
        "requests-other",
        json!({"containers": [{"name": "nb", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}),
    );
    create(&server, "jhub", &requests_only).await.unwrap();
    assert!(
        hook.reviews().is_empty(),
        "pods without a GPU must never reach the webhook"
    );
    assert!(server.admission_log().is_empty());

    create(&server, "jhub", &gpu_pod("gpu")).await.unwrap();
    let init_gpu = pod(
        "init-gpu",
        json!({"initContainers": [{"name": "warm", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
    );
    create(&server, "jhub", &init_gpu).await.unwrap();
    let names: Vec<String> = hook
        .reviews()
        .iter()
        .map(|r| r["request"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["gpu", "init-gpu"]);
}

#[tokio::test]
async fn namespace_selector_sees_the_metadata_name_label_and_namespace_labels() {
    // "Dynamic Admission Control": namespaceSelector; every namespace carries
    // kubernetes.io/metadata.name, stored or not.
    let (server, hook) = admitting(|_| allow()).await;
    configure(
        &server,
        "gpu-booking",
        vec![chart_shaped(&hook.ca_pem, "Fail")],
    );
    server.put_value(
        "namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "opted-out", "labels": {"gpu-booking.io/webhook": "disabled"}}}),
    );
    for ns in ["kube-system", "gpu-booking", "opted-out"] {
        create(&server, ns, &gpu_pod("p")).await.unwrap();
    }
    assert!(
        hook.reviews().is_empty(),
        "excluded namespaces reached the webhook"
    );
    create(&server, "jhub", &gpu_pod("p")).await.unwrap();
    assert_eq!(hook.reviews().len(), 1);
}

#[tokio::test]
async fn object_selector_matches_the_pods_labels() {
    let (server, hook) = admitting(|_| allow()).await;
    let selector = json!({"objectSelector": {"matchLabels": {"component": "singleuser-server"}}});
    configure_one(&server, &hook, selector);
    create(&server, "jhub", &pod("plain", json!({})))
        .await
        .unwrap();
    assert!(hook.reviews().is_empty());
    let mut labelled = pod("notebook", json!({}));
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("component".into(), "singleuser-server".into());
    create(&server, "jhub", &labelled).await.unwrap();
    assert_eq!(hook.reviews().len(), 1);
}

#[tokio::test]
async fn a_match_condition_that_fails_to_evaluate_follows_the_failure_policy() {
    // "Dynamic Admission Control": matchConditions error handling: Fail refuses the
    // request (403), Ignore skips the webhook; a false condition always skips.
    let (server, hook) = admitting(|_| allow()).await;
    let broken = |policy: &str, exprs: &[&str]| {
        let conditions: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| json!({"name": format!("c{i}"), "expression": e}))
            .collect();
        webhook(
            "h.example.com",
            &hook.ca_pem,
            json!({"failurePolicy": policy, "matchConditions": conditions}),
        )
    };
    configure(
        &server,
        "c",
        vec![broken("Fail", &["object.spec.nodeName == 'n1'"])],
    );
    let e = create(&server, "jhub", &pod("a", json!({})))
        .await
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(
        e.message.starts_with("pods \"a\" is forbidden: "),
        "{}",
        e.message
    );
    assert!(server.get::<Pod>(Some("jhub"), "a").is_none());

    configure(
        &server,
        "c",
        vec![broken("Fail", &["object.spec.nodeName == 'n1'", "false"])],
    );
    create(&server, "jhub", &pod("b", json!({}))).await.unwrap();
    configure(
        &server,
        "c",
        vec![broken("Ignore", &["object.spec.nodeName == 'n1'"])],
    );
    create(&server, "jhub", &pod("c", json!({}))).await.unwrap();
    assert!(hook.reviews().is_empty());
}

#[tokio::test]
async fn a_wrong_ca_bundle_fails_tls_fail_refuses_and_ignore_admits_unchanged() {
    let (server, hook) = admitting(|_| {
        patch(json!([{"op": "add", "path": "/metadata/labels/touched", "value": "yes"}]))
    })
    .await;
    let other_ca = DevCerts::generate("another CA", &["hook.gpu-booking.svc".into()])
        .unwrap()
        .ca_pem;
    configure(
        &server,
        "c",
        vec![webhook(
            "h.example.com",
            &other_ca,
            json!({"failurePolicy": "Fail"}),
        )],
    );
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    let prefix = "Internal error occurred: failed calling webhook \"h.example.com\": failed to call webhook: Post \"https://hook.gpu-booking.svc:443/mutate?timeout=5s\": ";
    assert!(e.message.starts_with(prefix), "{}", e.message);
    assert!(server.get::<Pod>(Some("jhub"), "a").is_none());

    configure(
        &server,
        "c",
        vec![webhook(
            "h.example.com",
            &other_ca,
            json!({"failurePolicy": "Ignore"}),
        )],
    );
    let created = create(&server, "jhub", &gpu_pod("b")).await.unwrap();
    assert!(!created.metadata.labels.unwrap().contains_key("touched"));
    assert!(
        hook.reviews().is_empty(),
        "no TLS session may reach a webhook the CA does not vouch for"
    );
    let log = server.admission_log();
    assert_eq!(log.len(), 2);
    assert!(
        log.iter().all(|r| !r.allowed
            && r.error
                .as_deref()
                .is_some_and(|e| e.contains("certificate"))),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_webhook_past_its_timeout_follows_the_failure_policy() {
    // "Dynamic Admission Control": Timeouts.
    let (server, hook) = admitting(|_| Reply::Hang).await;
    configure(
        &server,
        "c",
        vec![webhook(
            "slow.example.com",
            &hook.ca_pem,
            json!({"timeoutSeconds": 1}),
        )],
    );
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!(e.code, 500);
    assert!(
        e.message
            .ends_with("?timeout=1s\": context deadline exceeded"),
        "{}",
        e.message
    );
    configure(
        &server,
        "c",
        vec![webhook(
            "slow.example.com",
            &hook.ca_pem,
            json!({"timeoutSeconds": 1, "failurePolicy": "Ignore"}),
        )],
    );
    create(&server, "jhub", &gpu_pod("b")).await.unwrap();
    assert_eq!(hook.reviews().len(), 2);
}

#[tokio::test]
async fn a_refusal_carries_the_webhooks_code_and_message() {
    let (server, hook) = admitting(|_| {
        Reply::Review(json!({"allowed": false, "status": {"code": 403, "message": "no GPU without a booking"}}))
    })
    .await;
    configure_one(&server, &hook, json!({"failurePolicy": "Ignore"}));
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "admission webhook \"h.example.com\" denied the request: no GPU without a booking"
    );
    assert!(server.get::<Pod>(Some("jhub"), "a").is_none());
}

#[tokio::test]
async fn the_patch_is_applied_to_the_stored_pod_and_logged() {
    let server = FakeApiServer::new();
    server.enable_admission();
    let ops = json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"terminate-at": "2099-01-01T00:00:00Z"}},
        {"op": "add", "path": "/metadata/labels/gpu-booking.io~1priority", "value": "high"}
    ]);
    let hook = Hook::service(&server, {
        let ops = ops.clone();
        move |_| patch(ops.clone())
    })
    .await;
    configure_one(&server, &hook, json!({}));
    let created = create(&server, "jhub", &gpu_pod("a")).await.unwrap();
    let stored = server.get::<Pod>(Some("jhub"), "a").unwrap();
    for p in [&created, &stored] {
        assert_eq!(
            p.metadata.labels.as_ref().unwrap()["gpu-booking.io/priority"],
            "high"
        );
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()["terminate-at"],
            "2099-01-01T00:00:00Z"
        );
    }
    let log = server.admission_log();
    assert_eq!(log.len(), 1);
    assert!(log[0].allowed);
    assert_eq!(log[0].patch.as_ref(), Some(&ops));
    // The review carried the pod as the Priority plugin left it, namespace filled in.
    let review = &hook.reviews()[0];
    assert_eq!(review["request"]["object"]["spec"]["priority"], 0);
    assert_eq!(review["request"]["object"]["metadata"]["namespace"], "jhub");
    assert_eq!(review["request"]["namespace"], "jhub");
    assert_eq!(review["request"]["operation"], "CREATE");
    assert_eq!(
        review["request"]["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
}

#[tokio::test]
async fn a_patch_that_does_not_apply_is_an_internal_error_even_with_ignore() {
    // The API server's dispatcher answers a patch it cannot apply with an internal
    // error; failurePolicy covers calling the webhook, not what it answered.
    let (server, hook) = admitting(|_| {
        patch(json!([{"op": "add", "path": "/metadata/annotations/x", "value": "1"}]))
    })
    .await;
    configure_one(&server, &hook, json!({"failurePolicy": "Ignore"}));
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
}

#[tokio::test]
async fn a_response_with_another_uid_is_a_call_failure() {
    let (server, hook) = admitting(|_| {
        Reply::Raw(
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "response": {"uid": "someone-else", "allowed": true}}),
        )
    })
    .await;
    configure_one(&server, &hook, json!({}));
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!(e.code, 500);
    assert!(
        e.message
            .contains("received invalid webhook response: expected response.uid="),
        "{}",
        e.message
    );
    configure_one(&server, &hook, json!({"failurePolicy": "Ignore"}));
    create(&server, "jhub", &gpu_pod("b")).await.unwrap();
}

#[tokio::test]
async fn warnings_come_back_as_warning_headers() {
    // "Dynamic Admission Control": Response, warnings: `Warning: 299 - "text"`.
    let (server, hook) = admitting(|_| {
        Reply::Review(
            json!({"allowed": true, "warnings": ["no GPU free: runs on CPU", "say \"hi\""]}),
        )
    })
    .await;
    configure_one(&server, &hook, json!({}));
    let body = serde_json::to_vec(&gpu_pod("a")).unwrap();
    let request = http::Request::post("/api/v1/namespaces/jhub/pods")
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body))
        .unwrap();
    let response = server.service().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 201);
    let warnings: Vec<&str> = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(
        warnings,
        [
            "299 - \"no GPU free: runs on CPU\"",
            "299 - \"say \\\"hi\\\"\""
        ]
    );
    assert_eq!(server.admission_log()[0].warnings.len(), 2);
}

#[tokio::test]
async fn priority_plugin_resolves_classes_and_refuses_disagreement() {
    // "Admission Controllers": Priority; "Pod Priority and Preemption".
    let server = FakeApiServer::new();
    server.enable_admission();
    priority_class(
        &server,
        "gpu-booking-high",
        1000,
        "PreemptLowerPriority",
        false,
    );
    priority_class(&server, "gpu-booking-low", -10, "Never", false);
    let with_class = |name: &str, class: &str| pod(name, json!({"priorityClassName": class}));

    let p = create(&server, "jhub", &with_class("low", "gpu-booking-low"))
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.priority, spec.preemption_policy.as_deref()),
        (Some(-10), Some("Never"))
    );
    let p = create(&server, "jhub", &pod("none", json!({})))
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.priority, spec.preemption_policy.as_deref()),
        (Some(0), Some("PreemptLowerPriority"))
    );

    let e = create(&server, "jhub", &with_class("ghost", "no-such-class"))
        .await
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"ghost\" is forbidden: no PriorityClass with name no-such-class was found"
    );
    let e = create(
        &server,
        "jhub",
        &pod(
            "liar",
            json!({"priorityClassName": "gpu-booking-high", "priority": 5}),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 403);
    assert!(
        e.message
            .contains("the integer value of priority (5) must not be provided"),
        "{}",
        e.message
    );
    // A given priority that agrees with the class is accepted.
    create(
        &server,
        "jhub",
        &pod(
            "honest",
            json!({"priorityClassName": "gpu-booking-high", "priority": 1000}),
        ),
    )
    .await
    .unwrap();

    priority_class(&server, "everyone", 7, "PreemptLowerPriority", true);
    let p = create(&server, "jhub", &pod("defaulted", json!({})))
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.priority_class_name.as_deref(), spec.priority),
        (Some("everyone"), Some(7))
    );
}

#[tokio::test]
async fn a_webhook_that_sets_a_class_must_remove_priority_or_the_pod_is_refused() {
    // The API server re-runs the built-in plugins after a webhook changed the object
    // (its reinvoker: "built-in mutating admission plugins are re-run"), so Priority
    // sees the new class beside the priority it computed for the old one.
    let server = FakeApiServer::new();
    server.enable_admission();
    priority_class(
        &server,
        "gpu-booking-high",
        1000,
        "PreemptLowerPriority",
        false,
    );
    priority_class(&server, "gpu-booking-low", -10, "Never", false);
    let set_class = |remove: bool| {
        let mut ops = vec![
            json!({"op": "add", "path": "/spec/priorityClassName", "value": "gpu-booking-low"}),
        ];
        if remove {
            ops.push(json!({"op": "remove", "path": "/spec/priority"}));
            ops.push(json!({"op": "remove", "path": "/spec/preemptionPolicy"}));
        }
        json!(ops)
    };
    let hook = Hook::service(&server, move |review| {
        let remove = review["request"]["name"] == "careful";
        patch(set_class(remove))
    })
    .await;
    configure_one(&server, &hook, json!({}));
    let e = create(&server, "jhub", &gpu_pod("careless"))
        .await
        .unwrap_err();
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "pods \"careless\" is forbidden: the integer value of priority (0) must not be provided in pod spec; priority admission controller computed -10 from the given PriorityClass name"
    );
    let p = create(&server, "jhub", &gpu_pod("careful")).await.unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        (spec.priority, spec.preemption_policy.as_deref()),
        (Some(-10), Some("Never"))
    );
    // A Never webhook is not called again in the reinvocation round.
    assert!(server.admission_log().iter().all(|r| r.round == 0));
}

#[tokio::test]
async fn configurations_run_in_name_order_and_if_needed_webhooks_run_again() {
    // "Dynamic Admission Control": Reinvocation policy. Configurations are sorted by
    // name; `first` (IfNeeded) ran before `second` changed the pod, so it runs again.
    let (server, hook) = admitting(|review| {
        let labels = &review["request"]["object"]["metadata"]["labels"];
        if labels.get("second").is_none() && labels.get("first").is_some() {
            patch(json!([{"op": "add", "path": "/metadata/labels/second", "value": "1"}]))
        } else if labels.get("first").is_none() {
            patch(json!([{"op": "add", "path": "/metadata/labels/first", "value": "1"}]))
        } else {
            allow()
        }
    })
    .await;
    configure(
        &server,
        "b-second",
        vec![webhook("second.example.com", &hook.ca_pem, json!({}))],
    );
    configure(
        &server,
        "a-first",
        vec![webhook(
            "first.example.com",
            &hook.ca_pem,
            json!({"reinvocationPolicy": "IfNeeded"}),
        )],
    );
    create(&server, "jhub", &pod("p", json!({}))).await.unwrap();
    let calls: Vec<(String, u8)> = server
        .admission_log()
        .into_iter()
        .map(|r| (r.webhook, r.round))
        .collect();
    assert_eq!(
        calls,
        [
            ("first.example.com".to_owned(), 0),
            ("second.example.com".to_owned(), 0),
            ("first.example.com".to_owned(), 1)
        ]
    );
}

#[tokio::test]
async fn a_dry_run_stores_nothing_and_skips_webhooks_with_side_effects() {
    // "Dynamic Admission Control": Side effects.
    let (server, hook) =
        admitting(|_| patch(json!([{"op": "add", "path": "/metadata/labels/seen", "value": "1"}])))
            .await;
    configure_one(&server, &hook, json!({"sideEffects": "NoneOnDryRun"}));
    let pods: Api<Pod> = Api::namespaced(server.client(), "jhub");
    let version = server.resource_version();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = pods.create(&dry, &gpu_pod("a")).await.unwrap();
    assert_eq!(
        answered.metadata.labels.unwrap()["seen"],
        "1",
        "the answer shows what would be stored"
    );
    assert!(server.get::<Pod>(Some("jhub"), "a").is_none());
    assert_eq!(
        server.resource_version(),
        version,
        "a dry run changed the store"
    );
    assert_eq!(hook.reviews()[0]["request"]["dryRun"], true);
    assert!(server.admission_log()[0].dry_run);

    configure_one(&server, &hook, json!({"sideEffects": "Some"}));
    let e = pods.create(&dry, &gpu_pod("a")).await.unwrap_err();
    let kube::Error::Api(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            400,
            "admission webhook \"h.example.com\" does not support dry run"
        )
    );
    assert_eq!(
        hook.reviews().len(),
        1,
        "a webhook with side effects was called on a dry run"
    );
    // Without dry run the same webhook is called.
    pods.create(&PostParams::default(), &gpu_pod("a"))
        .await
        .unwrap();
    assert_eq!(hook.reviews().len(), 2);
}

#[tokio::test]
async fn the_webhook_sees_who_made_the_request() {
    let (server, hook) = admitting(|_| allow()).await;
    configure_one(&server, &hook, json!({}));
    let hub = server.client_as(
        "system:serviceaccount:jhub:hub",
        &["system:serviceaccounts", "system:serviceaccounts:jhub"],
    );
    Api::<Pod>::namespaced(hub, "jhub")
        .create(&PostParams::default(), &gpu_pod("a"))
        .await
        .unwrap();
    create(&server, "jhub", &gpu_pod("b")).await.unwrap();
    let users: Vec<Value> = hook
        .reviews()
        .iter()
        .map(|r| r["request"]["userInfo"].clone())
        .collect();
    assert_eq!(
        users,
        [
            json!({"username": "system:serviceaccount:jhub:hub",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:jhub", "system:authenticated"]}),
            json!({"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}),
        ]
    );
    assert_eq!(
        server.admission_log()[0].user,
        "system:serviceaccount:jhub:hub"
    );
}

#[tokio::test]
async fn a_url_webhook_is_verified_against_its_own_name() {
    // clientConfig.url: the certificate must name the URL's host.
    let server = FakeApiServer::new();
    server.enable_admission();
    let hook = Hook::start(&["127.0.0.1"], |_| allow()).await;
    let mut config = webhook("url.example.com", &hook.ca_pem, json!({}));
    config["clientConfig"] = json!({"url": format!("https://127.0.0.1:{}/mutate", hook.addr.port()), "caBundle": b64(&hook.ca_pem)});
    configure(&server, "c", vec![config]);
    create(&server, "jhub", &gpu_pod("a")).await.unwrap();
    assert_eq!(hook.reviews().len(), 1);
}

#[tokio::test]
async fn without_enable_admission_nothing_is_called() {
    let server = FakeApiServer::new();
    let hook = Hook::service(&server, |_| Reply::Review(json!({"allowed": false}))).await;
    configure_one(&server, &hook, json!({}));
    let p = create(&server, "jhub", &gpu_pod("a")).await.unwrap();
    assert_eq!(
        p.spec.unwrap().priority,
        None,
        "the Priority plugin ran without admission"
    );
    assert!(hook.reviews().is_empty());
}

/// A KubeSpawner request body from the repository's `tests/fixtures/kubespawner/`, as
/// JupyterHub sends it (quantities as JSON numbers: `4.0`, `17179869184`).
fn kubespawner(file: &str) -> DynamicObject {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/kubespawner")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A booking service that knows one user, Bob.Smith (not booked, a6000 free); everyone
/// else is not booked and finds nothing free.
async fn stub_booking() -> String {
    async fn schedulability(
        axum::extract::Query(q): axum::extract::Query<std::collections::BTreeMap<String, String>>,
    ) -> Json<Value> {
        let gpumem = json!({"a100": 40960, "a6000": 49152});
        // Names arrive normalised as JupyterHub does (lowercase).
        let bob = q.values().any(|v| v.eq_ignore_ascii_case("Bob.Smith"));
        Json(json!({
            "schedulable": false, "until": null, "model": null, "booking_id": null,
            "user": if bob { json!("Bob.Smith") } else { Value::Null },
            "free": {"a100": 0, "a6000": if bob { 3 } else { 0 }},
            "gpumem_mib": gpumem, "earliest_booking": "2099-12-14T00:00:00Z"
        }))
    }
    let app = Router::new()
        .route("/api/v1/schedulability", axum::routing::get(schedulability))
        .route(
            "/api/v1/audit",
            post(|| async { axum::http::StatusCode::CREATED }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn the_real_webhook_behind_the_charts_configuration() {
    // This repository's webhook over HTTPS, configured as the chart renders it, with
    // the chart's PriorityClasses: its low-priority patch must survive the Priority
    // plugin's second look, and a pod stripped of its GPU comes back with the warning.
    let server = FakeApiServer::new();
    server.enable_admission();
    priority_class(
        &server,
        "gpu-booking-high",
        1000,
        "PreemptLowerPriority",
        false,
    );
    priority_class(&server, "gpu-booking-low", -10, "Never", false);
    let service_name = "gpu-booking-webhook.gpu-booking.svc";
    let certs = DevCerts::generate("gpu-booking webhook CA", &[service_name.into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = certs.write_to(dir.path()).unwrap();
    let mut args = gpu_booking_webhook::WebhookArgs::with_defaults(
        paths.cert,
        paths.key,
        stub_booking().await,
        "service-token".into(),
    );
    // As the chart configures it: only the hub's pods in jhub carry a user.
    args.trusted_spawner = vec!["system:serviceaccount:jhub:hub".into()];
    args.spawner_namespace = vec!["jhub".into()];
    // The stub answers schedulability lookups only (no change stream to follow).
    args.decide_from = gpu_booking_webhook::DecideFrom::Lookup;
    let webhook = Arc::new(gpu_booking_webhook::WebhookServer::from_args(&args).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    server.register_service(
        "gpu-booking",
        "gpu-booking-webhook",
        443,
        listener.local_addr().unwrap(),
    );
    tokio::spawn({
        let webhook = webhook.clone();
        async move { webhook.serve(listener, std::future::pending()).await }
    });
    let mut config = chart_shaped(&certs.ca_pem, "Fail");
    config["clientConfig"]["service"]["name"] = json!("gpu-booking-webhook");
    configure(&server, "gpu-booking", vec![config]);
    let hub = server.client_as(
        "system:serviceaccount:jhub:hub",
        &["system:serviceaccounts"],
    );
    // Raw KubeSpawner bodies: the stored pods read back as typed Pods because the fake
    // stores their numeric quantities as canonical strings, as the API server does.
    let pods: Api<DynamicObject> =
        Api::namespaced_with(hub, "jhub", &ApiResource::erase::<Pod>(&()));

    let bob = pods
        .create(
            &PostParams::default(),
            &kubespawner("7.1.0-Bob.Smith-gpu.json"),
        )
        .await
        .unwrap();
    let stored = server
        .get::<Pod>(Some("jhub"), &bob.metadata.name.unwrap())
        .unwrap();
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["gpu-booking.io/priority"],
        "low"
    );
    let spec = stored.spec.unwrap();
    let limits = spec.containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(
        (limits["cpu"].0.as_str(), limits["memory"].0.as_str()),
        ("4", "17179869184")
    );
    assert_eq!(spec.priority_class_name.as_deref(), Some("gpu-booking-low"));
    assert_eq!(
        (spec.priority, spec.preemption_policy.as_deref()),
        (Some(-10), Some("Never"))
    );

    let nobody = pods
        .create(&PostParams::default(), &kubespawner("7.1.0-a-b-gpu.json"))
        .await
        .unwrap();
    let nobody = server
        .get::<Pod>(Some("jhub"), &nobody.metadata.name.unwrap())
        .unwrap();
    let limits = nobody.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap_or_default();
    assert!(!limits.contains_key("nvidia.com/gpu"), "{limits:?}");
    let log = server.admission_log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(
        log.iter().all(|r| r.allowed && r.error.is_none()),
        "{log:?}"
    );
    assert_eq!(log[1].warnings.len(), 1, "{log:?}");

    // The fixtures without a GPU never reach it.
    pods.create(
        &PostParams::default(),
        &kubespawner("7.1.0-alice-at-example.com-nogpu.json"),
    )
    .await
    .unwrap();
    assert_eq!(server.admission_log().len(), 2);
}

/// What admission costs a create: 200 GPU pods through the chart-shaped configuration
/// (CEL condition, HTTPS call, patch, Priority twice). Prints; asserts nothing about
/// time. `cargo test -p gpu-booking-fake-apiserver --test it admission:: -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_creates_through_admission() {
    let server = FakeApiServer::new();
    server.enable_admission();
    priority_class(&server, "gpu-booking-low", -10, "Never", false);
    let hook = Hook::service(&server, |_| {
        patch(json!([
            {"op": "add", "path": "/spec/priorityClassName", "value": "gpu-booking-low"},
            {"op": "remove", "path": "/spec/priority"},
            {"op": "remove", "path": "/spec/preemptionPolicy"}
        ]))
    })
    .await;
    configure(
        &server,
        "gpu-booking",
        vec![chart_shaped(&hook.ca_pem, "Fail")],
    );
    let n = 200;
    for (label, admission) in [("with admission", true), ("without (cpu pods)", false)] {
        let started = std::time::Instant::now();
        for i in 0..n {
            let p = if admission {
                gpu_pod(&format!("gpu-{i}"))
            } else {
                pod(&format!("cpu-{i}"), json!({}))
            };
            create(&server, "jhub", &p).await.unwrap();
        }
        let per = started.elapsed() / n;
        println!("{label}: {n} sequential creates, {per:?} each");
    }
    assert_eq!(hook.reviews().len(), n as usize);
}

#[tokio::test]
async fn kubespawner_quantities_are_stored_canonical_with_or_without_admission() {
    // JupyterHub sends `cpu: 4.0`; the API server stores "4" (and a typed client could
    // not read the number back).
    for admission in [false, true] {
        let server = FakeApiServer::new();
        if admission {
            server.enable_admission();
        }
        let pods: Api<DynamicObject> =
            Api::namespaced_with(server.client(), "jhub", &ApiResource::erase::<Pod>(&()));
        let created = pods
            .create(
                &PostParams::default(),
                &kubespawner("6.2.0-Bob.Smith-gpu.json"),
            )
            .await
            .unwrap();
        let name = created.metadata.name.unwrap();
        let stored = server
            .get::<Pod>(Some("jhub"), &name)
            .expect("the stored pod reads back as a Pod");
        let requests = stored.spec.unwrap().containers[0]
            .resources
            .clone()
            .unwrap()
            .requests
            .unwrap();
        assert_eq!(
            (requests["cpu"].0.as_str(), requests["memory"].0.as_str()),
            ("1", "4294967296")
        );
    }
}

#[tokio::test]
async fn a_webhook_that_is_down_follows_the_failure_policy() {
    // Nothing listens behind the service: Fail refuses, Ignore admits unchanged.
    let server = FakeApiServer::new();
    server.enable_admission();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    server.register_service(HOOK_NS, HOOK_SVC, 443, closed);
    let ca = DevCerts::generate("CA", &["hook.gpu-booking.svc".into()])
        .unwrap()
        .ca_pem;
    configure(&server, "c", vec![chart_shaped(&ca, "Fail")]);
    let e = create(&server, "jhub", &gpu_pod("a")).await.unwrap_err();
    assert_eq!(e.code, 500);
    assert!(e.message.starts_with("Internal error occurred: failed calling webhook \"pods.gpu-booking.io\": failed to call webhook: Post"), "{}", e.message);
    configure(&server, "c", vec![chart_shaped(&ca, "Ignore")]);
    let created = create(&server, "jhub", &gpu_pod("b")).await.unwrap();
    assert_eq!(created.spec.unwrap().priority, Some(0));
    assert_eq!(server.admission_log().len(), 2);
}
