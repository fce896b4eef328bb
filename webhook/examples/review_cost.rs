//! What an AdmissionReview costs to read and answer with our own types
//! (`gpu_booking_webhook::review`) and with `kube::core::admission`'s, and how the two
//! behave where they differ (the figures are in docs/webhook.md, "Why our own
//! AdmissionReview types").
//!
//! The review is a real KubeSpawner pod creation (a fixture of
//! `tests/fixtures/kubespawner/`) inside the review the API server sends; the answer
//! allows it with a JSON Patch of the size ours usually has.
//!
//! ```text
//! cargo run -p gpu-booking-webhook --example review_cost             # both, timed, and the behaviours
//! cargo run -p gpu-booking-webhook --example review_cost -- time 20000
//! valgrind --tool=callgrind target/debug/examples/review_cost ours 1000
//! valgrind --tool=callgrind target/debug/examples/review_cost kube 1000
//! ```
//!
//! `ours`, `lenient` and `kube` run one variant only (for callgrind: subtract a run with 0
//! iterations, which counts the start and the fixture's reading).

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_booking_webhook::review::{read_lenient, read_typed, RequestIn, ReviewIn};
use gpu_booking_webhook::ReviewOut;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use serde_json::{json, Value};

const FIXTURE: &str = "7.1.0-alice-at-example.com-gpu.json";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("time", String::as_str);
    let n: u32 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let body = review_body(&pod());
    let patch = patch();
    match mode {
        "ours" => repeat(n, || ours(&body, &patch)),
        "lenient" => repeat(n, || ours_lenient(&body, &patch)),
        "kube" => repeat(n, || kube(&body, &patch)),
        "time" => {
            // Both answers must be the same review before their costs compare.
            same_answer(&ours(&body, &patch), &kube(&body, &patch));
            println!(
                "review: {} bytes (pod {FIXTURE}); {n} iterations each, interleaved",
                body.len()
            );
            let (mut t_ours, mut t_lenient, mut t_kube, mut t_value) = (
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
            );
            // Interleaved rounds, so that a slower moment of the machine hits all three.
            for _ in 0..10 {
                t_ours += timed(n / 10, || ours(&body, &patch));
                t_lenient += timed(n / 10, || ours_lenient(&body, &patch));
                t_kube += timed(n / 10, || kube(&body, &patch));
                t_value += timed(n / 10, || kube_as_value(&body, &patch));
            }
            let per = |t: Duration| t.as_secs_f64() * 1e6 / f64::from(n);
            println!("ours:               {:8.2} us/review", per(t_ours));
            println!(
                "ours, lenient:      {:8.2} us/review  ({:.2}x ours)",
                per(t_lenient),
                per(t_lenient) / per(t_ours)
            );
            println!(
                "kube:               {:8.2} us/review  ({:.2}x ours)",
                per(t_kube),
                per(t_kube) / per(t_ours)
            );
            println!(
                "kube + pod as Value:{:8.2} us/review  ({:.2}x ours)",
                per(t_value),
                per(t_value) / per(t_ours)
            );
            behaviours(&body, &patch);
        }
        other => {
            eprintln!("usage: review_cost [time|ours|kube] [iterations] (not {other:?})");
            std::process::exit(2);
        }
    }
}

fn repeat(n: u32, mut f: impl FnMut() -> Vec<u8>) {
    for _ in 0..n {
        black_box(f());
    }
}

fn timed(n: u32, f: impl FnMut() -> Vec<u8>) -> Duration {
    let started = Instant::now();
    repeat(n, f);
    started.elapsed()
}

/// The webhook's full path for a GPU pod, without the decision: the review read in
/// one typed pass (the pod built as a `Value`), the answer encoded.
fn ours(body: &[u8], patch: &json_patch::Patch) -> Vec<u8> {
    let review = read_typed::<Value>(body).expect("a review");
    black_box(&review.request.object);
    // A fresh patch per review, as the planner makes one.
    let out = ReviewOut::allow(review.version, &review.request.uid).with_patch(&patch.clone());
    serde_json::to_vec(&out).expect("an answer")
}

/// The same with the review read leniently, every field any JSON (what the webhook
/// falls back to for a review the typed pass cannot read), to show what the typed
/// pass saves.
fn ours_lenient(body: &[u8], patch: &json_patch::Patch) -> Vec<u8> {
    let review = read_lenient(body).expect("a review");
    black_box(&review.request.object);
    let out = ReviewOut::allow(review.version, &review.request.uid).with_patch(&patch.clone());
    serde_json::to_vec(&out).expect("an answer")
}

/// The same with kube's typed review (the pod as a `DynamicObject`, as a webhook that
/// decides on JSON would read it).
fn kube(body: &[u8], patch: &json_patch::Patch) -> Vec<u8> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).expect("a review");
    let request: AdmissionRequest<DynamicObject> = review.try_into().expect("a request");
    black_box(&request.object);
    let out = AdmissionResponse::from(&request)
        .with_patch(patch.clone())
        .expect("a patch")
        .into_review();
    serde_json::to_vec(&out).expect("an answer")
}

/// kube's, plus turning the pod back into the `serde_json::Value` that our decision
/// (`core::admission`) reads: what switching would cost without rewriting it.
fn kube_as_value(body: &[u8], patch: &json_patch::Patch) -> Vec<u8> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).expect("a review");
    let request: AdmissionRequest<DynamicObject> = review.try_into().expect("a request");
    black_box(serde_json::to_value(&request.object).expect("a pod"));
    let out = AdmissionResponse::from(&request)
        .with_patch(patch.clone())
        .expect("a patch")
        .into_review();
    serde_json::to_vec(&out).expect("an answer")
}

/// The two answers say the same once the patch is decoded from each encoding.
fn same_answer(ours: &[u8], kube: &[u8]) {
    let ours: Value = serde_json::from_slice(ours).unwrap();
    let kube: Value = serde_json::from_slice(kube).unwrap();
    assert_eq!(ours["response"]["uid"], kube["response"]["uid"]);
    assert_eq!(ours["response"]["allowed"], kube["response"]["allowed"]);
    assert_eq!(ours["apiVersion"], kube["apiVersion"]);
    let ours_patch = ReviewOut::decoded_patch(&serde_json::from_value(ours).unwrap());
    let kube_bytes: Vec<u8> = match &kube["response"]["patch"] {
        Value::Array(bytes) => bytes.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
        Value::String(b64) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        }
        other => panic!("kube's patch is {other}"),
    };
    let kube_patch: json_patch::Patch = serde_json::from_slice(&kube_bytes).unwrap();
    assert_eq!(ours_patch, Some(kube_patch));
}

/// Where the two differ, shown by running them.
fn behaviours(body: &[u8], patch: &json_patch::Patch) {
    println!("\n-- the patch, as each encodes it (first 60 bytes of the response):");
    let kube_answer = String::from_utf8(kube(body, patch)).unwrap();
    let ours_answer = String::from_utf8(ours(body, patch)).unwrap();
    let patch_of = |answer: &str| {
        let at = answer.find("\"patch\"").unwrap();
        answer[at..].chars().take(60).collect::<String>()
    };
    println!(
        "ours: {} ... ({} bytes in all)",
        patch_of(&ours_answer),
        ours_answer.len()
    );
    println!(
        "kube: {} ... ({} bytes in all)",
        patch_of(&kube_answer),
        kube_answer.len()
    );

    println!("\n-- an allowed review without a patch:");
    let request: AdmissionRequest<DynamicObject> =
        serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
            .unwrap()
            .try_into()
            .unwrap();
    let plain = AdmissionResponse::from(&request).into_review();
    println!(
        "ours: {}",
        serde_json::to_string(&ReviewOut::allow("admission.k8s.io/v1", "u-1")).unwrap()
    );
    println!("kube: {}", serde_json::to_string(&plain).unwrap());

    // A review the API server would never send, but a proxy or an older server might:
    // each with the request's uid, which the API server needs echoed to take the answer.
    let mut review: Value = serde_json::from_slice(body).unwrap();
    let malformed = [
        ("no operation", {
            let mut r = review.clone();
            r["request"].as_object_mut().unwrap().remove("operation");
            r
        }),
        ("no userInfo", {
            let mut r = review.clone();
            r["request"].as_object_mut().unwrap().remove("userInfo");
            r
        }),
        ("resource as a string", {
            let mut r = review.clone();
            r["request"]["resource"] = json!("pods");
            r
        }),
        ("no request", {
            review.as_object_mut().unwrap().remove("request");
            review
        }),
    ];
    println!("\n-- malformed reviews (uid u-1 where there is a request):");
    for (what, review) in malformed {
        let bytes = serde_json::to_vec(&review).unwrap();
        let kube_answer = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(&bytes) {
            Err(e) => format!(
                "parse error ({e}); the only answer: {}",
                serde_json::to_string(&AdmissionResponse::invalid(&e).into_review()).unwrap()
            ),
            Ok(r) => match TryInto::<AdmissionRequest<DynamicObject>>::try_into(r) {
                Err(e) => format!(
                    "no request ({e}); the only answer: {}",
                    serde_json::to_string(&AdmissionResponse::invalid(&e).into_review()).unwrap()
                ),
                Ok(req) => format!("read, uid {:?}", req.uid),
            },
        };
        let ours: ReviewIn = serde_json::from_slice(&bytes).unwrap();
        let request = RequestIn::from_value(ours.request.unwrap_or(Value::Null));
        println!(
            "{what}:\n  ours: read, uid {:?}\n  kube: {kube_answer}",
            request.uid
        );
    }
}

/// The fixture's pod, as KubeSpawner sends it (no namespace yet: the API server adds
/// it to the review).
fn pod() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/kubespawner")
        .join(FIXTURE);
    serde_json::from_slice(&std::fs::read(&path).expect("the fixture")).expect("a pod")
}

/// The review the API server sends for the pod's creation by JupyterHub.
fn review_body(pod: &Value) -> Vec<u8> {
    let pods = json!({"group": "", "version": "v1", "resource": "pods"});
    let kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": kind, "resource": pods,
            "requestKind": kind, "requestResource": pods,
            "name": pod["metadata"]["name"],
            "namespace": "jhub",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:jhub:hub",
                "uid": "2f2c6a1e-0d5e-4c39-9a68-3f1d8f5b7c11",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:jhub",
                    "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .unwrap()
}

/// A patch of the size ours has for a booked GPU pod: priority, booking and model
/// labels, the end annotation, the priority class and a node selector.
fn patch() -> json_patch::Patch {
    serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels/gpu-booking.io~1priority", "value": "high"},
        {"op": "add", "path": "/metadata/labels/gpu-booking.io~1booking", "value": "18"},
        {"op": "add", "path": "/metadata/labels/gpu-booking.io~1model", "value": "a100"},
        {"op": "add", "path": "/metadata/annotations/gpu-booking.io~1terminate-at",
            "value": "2026-03-02T18:00:00Z"},
        {"op": "add", "path": "/spec/priorityClassName", "value": "gpu-booking-high"},
        {"op": "add", "path": "/spec/nodeSelector",
            "value": {"gpu-booking.io/model": "a100"}}
    ]))
    .unwrap()
}
