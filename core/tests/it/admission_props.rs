//! Property tests of the admission planner: every planned patch applies to every
//! generated pod, the result is a valid `k8s_openapi` Pod, the decision is visible in
//! it, and planning again on the result changes nothing.

use std::collections::BTreeSet;

use gpu_booking_core::admission::{
    decide, detect_gpu, identify, is_harmless_key, is_our_key, plan, plan_cpu_only,
    AdmissionConfig, BeyondBooking, Decision, Identity, Lookup, Schedulability, StripReason,
    BOOKING_LABEL, GPU_REMOVED_ANNOTATION, MODEL_LABEL, NVIDIA_VISIBLE_DEVICES, PRIORITY_LABEL,
    USERNAME_KEY,
};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::username::{escape_encode, NameCase, Username};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const GPU_KEYS: [&str; 3] = ["nvidia.com/gpu", "nvidia.com/a100", "nvidia.com/mig-1g.5gb"];
const BUDGET: &str = "gpu-booking.io/gpumem";

fn cfg(with_classes: bool) -> AdmissionConfig {
    let mut cfg = AdmissionConfig::default();
    for (res, model) in [
        ("nvidia.com/a100", "a100"),
        ("nvidia.com/mig-1g.5gb", "mig-1g.5gb"),
    ] {
        cfg.model_resources
            .insert(res.into(), ModelName::parse(model).unwrap());
    }
    cfg.default_gpumem_mib = Some(4096);
    if !with_classes {
        cfg.high_priority_class = None;
        cfg.low_priority_class = None;
    }
    cfg
}

fn model(name: &str) -> ModelName {
    ModelName::parse(name).unwrap()
}

/// `Some(None)`: the key is present with `null`; `None`: absent.
fn optional<T: std::fmt::Debug + Clone + 'static>(
    inner: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<Option<T>>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(None)),
        4 => inner.prop_map(|v| Some(Some(v))),
    ]
}

fn put(map: &mut Map<String, Value>, key: &str, value: Option<Option<Value>>) {
    match value {
        None => {}
        Some(None) => {
            map.insert(key.into(), Value::Null);
        }
        Some(Some(v)) => {
            map.insert(key.into(), v);
        }
    }
}

fn string_map(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(keys), "[a-z0-9]{0,6}", 0..4)
        .prop_map(|m| json!(m))
}

fn quantities() -> impl Strategy<Value = Value> {
    let keys: &'static [&'static str] = &[
        "nvidia.com/gpu",
        "nvidia.com/a100",
        "nvidia.com/mig-1g.5gb",
        BUDGET,
        "cpu",
        "memory",
    ];
    prop::collection::btree_map(
        prop::sample::select(keys),
        prop::sample::select(&["0", "1", "2", "500m", "4Gi"][..]),
        0..4,
    )
    .prop_map(|m| json!(m))
}

fn env() -> impl Strategy<Value = Value> {
    let entry = (
        prop::sample::select(&[NVIDIA_VISIBLE_DEVICES, "PATH", "X"][..]),
        any::<bool>(),
    )
        .prop_map(|(name, literal)| {
            if literal {
                json!({"name": name, "value": "all"})
            } else {
                json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
            }
        });
    prop::collection::vec(entry, 0..4).prop_map(Value::Array)
}

fn container() -> impl Strategy<Value = Value> {
    (
        "[a-z]{1,8}",
        optional(env()),
        optional((optional(quantities()), optional(quantities()))),
    )
        .prop_map(|(name, env, resources)| {
            let mut c = Map::new();
            c.insert("name".into(), json!(name));
            c.insert("image".into(), json!("busybox"));
            put(&mut c, "env", env);
            let resources = resources.map(|r| {
                r.map(|(requests, limits)| {
                    let mut m = Map::new();
                    put(&mut m, "requests", requests);
                    put(&mut m, "limits", limits);
                    Value::Object(m)
                })
            });
            put(&mut c, "resources", resources);
            Value::Object(c)
        })
}

fn pod() -> impl Strategy<Value = Value> {
    let annotation_keys: &'static [&'static str] = &[
        USERNAME_KEY,
        "terminate-at",
        GPU_REMOVED_ANNOTATION,
        "a~b/c",
        "x",
    ];
    let label_keys: &'static [&'static str] = &[
        USERNAME_KEY,
        PRIORITY_LABEL,
        BOOKING_LABEL,
        MODEL_LABEL,
        "app",
    ];
    let selector_keys: &'static [&'static str] = &["gpu-booking.io/model", "disk"];
    (
        optional(string_map(annotation_keys)),
        optional(string_map(label_keys)),
        optional(string_map(selector_keys)),
        prop::collection::vec(container(), 1..4),
        optional(prop::collection::vec(container(), 0..3).prop_map(Value::Array)),
        optional(prop::sample::select(
            &["gpu-booking-high", "gpu-booking-low", "other"][..],
        )),
        any::<Option<i32>>(),
        any::<bool>(),
    )
        .prop_map(
            |(annotations, labels, selector, containers, init, class, priority, policy)| {
                let mut meta = Map::new();
                meta.insert("name".into(), json!("p"));
                meta.insert("namespace".into(), json!("jhub"));
                put(&mut meta, "annotations", annotations);
                put(&mut meta, "labels", labels);
                let mut spec = Map::new();
                spec.insert("containers".into(), Value::Array(containers));
                put(&mut spec, "initContainers", init);
                put(&mut spec, "nodeSelector", selector);
                put(
                    &mut spec,
                    "priorityClassName",
                    class.map(|c| c.map(|c| json!(c))),
                );
                if let Some(p) = priority {
                    spec.insert("priority".into(), json!(p));
                }
                if policy {
                    spec.insert("preemptionPolicy".into(), json!("PreemptLowerPriority"));
                }
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
            },
        )
}

fn decision() -> impl Strategy<Value = Decision> {
    let models = prop::sample::select(&["a100", "a6000", "mig-1g.5gb"][..]).prop_map(model);
    prop_oneof![
        (
            1i64..1_000_000,
            models.clone(),
            0i64..4_000_000_000,
            any::<Option<u32>>(),
            any::<bool>(),
            any::<Option<u8>>()
        )
            .prop_map(
                |(booking_id, model, secs, mib, preempt, units)| Decision::Booked {
                    booking_id,
                    model,
                    until: chrono::DateTime::from_timestamp(secs, 0).unwrap(),
                    gpumem_mib: mib.map(u64::from),
                    preempt,
                    booking_units: units.map(u64::from),
                }
            ),
        (
            models.clone(),
            any::<Option<u32>>(),
            any::<Option<(u8, u8, u8, bool)>>()
        )
            .prop_map(|(model, mib, beyond)| Decision::LowPriority {
                model,
                gpumem_mib: mib.map(u64::from),
                beyond_booking: beyond.map(|(units, held, asked, course)| BeyondBooking {
                    booking_id: 3,
                    units: units.into(),
                    held: held.into(),
                    asked: asked.into(),
                    course,
                }),
            }),
        prop_oneof![
            models.prop_map(|m| StripReason::NothingFree { model: Some(m) }),
            Just(StripReason::NothingFree { model: None }),
            Just(StripReason::SeveralModels),
            Just(StripReason::BookingServiceError),
            Just(StripReason::NoIdentity),
            Just(StripReason::BeyondBooking {
                model: model("a100"),
                beyond: BeyondBooking {
                    booking_id: 3,
                    units: 64,
                    held: 64,
                    asked: 64,
                    course: false,
                }
            }),
            Just(StripReason::BeyondBooking {
                model: model("a100"),
                beyond: BeyondBooking {
                    booking_id: 3,
                    units: 64,
                    held: 64,
                    asked: 64,
                    course: true,
                }
            }),
        ]
        .prop_map(|reason| Decision::Strip {
            reason,
            earliest_booking: None
        }),
        Just(Decision::Unchecked {
            message: "down".into()
        }),
        Just(Decision::OtherWorkload),
    ]
}

fn apply(pod: &Value, patch: &json_patch::Patch) -> Result<Value, TestCaseError> {
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch.0)
        .map_err(|e| TestCaseError::fail(format!("patch does not apply: {e}\n{patch:?}")))?;
    serde_json::from_value::<Pod>(out.clone())
        .map_err(|e| TestCaseError::fail(format!("not a Pod any more: {e}")))?;
    Ok(out)
}

fn containers(pod: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|l| pod["spec"][l].as_array().into_iter().flatten())
        .collect()
}

fn label<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["labels"].get(key).and_then(Value::as_str)
}

fn check_cpu_only(out: &Value, cfg: &AdmissionConfig) -> Result<(), TestCaseError> {
    for c in containers(out) {
        for section in ["requests", "limits"] {
            if let Some(map) = c["resources"][section].as_object() {
                for key in GPU_KEYS.iter().chain([&BUDGET]) {
                    prop_assert!(!map.contains_key(*key), "{key} left in {c}");
                }
            }
        }
        let env = c["env"].as_array().expect("env exists");
        let hits: Vec<_> = env
            .iter()
            .filter(|e| e["name"] == NVIDIA_VISIBLE_DEVICES)
            .collect();
        prop_assert!(!hits.is_empty());
        for hit in hits {
            prop_assert_eq!(
                hit,
                &json!({"name": NVIDIA_VISIBLE_DEVICES, "value": "none"})
            );
        }
    }
    prop_assert_eq!(detect_gpu(out, cfg), None);
    prop_assert!(label(out, PRIORITY_LABEL).is_none());
    prop_assert!(out["spec"]["nodeSelector"]
        .get(&cfg.model_node_label)
        .is_none());
    Ok(())
}

/// A pod booked or lent on `model`: a model with its own resource is that resource
/// (no generic GPU request left, as many units of the model's resource as the pod
/// asked for, no model node selector); any other is selected by its node label.
fn check_placed_on(
    pod: &Value,
    out: &Value,
    model: &ModelName,
    cfg: &AdmissionConfig,
) -> Result<(), TestCaseError> {
    let selector = out["spec"]["nodeSelector"].get(&cfg.model_node_label);
    match cfg.resource_of(model) {
        None => prop_assert_eq!(selector, Some(&json!(model.as_str()))),
        Some(resource) => {
            prop_assert!(selector.is_none());
            let generic_left = ["containers", "initContainers"].iter().any(|list| {
                out["spec"][list].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        ["requests", "limits"].iter().any(|s| {
                            c["resources"][s].as_object().is_some_and(|m| {
                                cfg.gpu_resources.iter().any(|g| m.contains_key(g))
                            })
                        })
                    })
                })
            });
            prop_assert!(!generic_left, "a generic GPU request is left");
            // The units it asked for, generic or the model's own, are the model's now.
            let asked = detect_gpu(pod, cfg).map_or(0, |g| g.units);
            let placed = detect_gpu(out, cfg).map_or(0, |g| g.units);
            prop_assert_eq!(
                asked,
                placed,
                "{} units became {} of {}",
                asked,
                placed,
                resource
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_planned_patch_applies(pod in pod(), decision in decision(), classes in any::<bool>()) {
        let cfg = cfg(classes);
        let patch = plan(&pod, &decision, &cfg);
        let out = apply(&pod, &patch)?;

        // Labels that are not ours are never touched.
        prop_assert_eq!(label(&out, "app"), label(&pod, "app"));
        prop_assert_eq!(
            out["metadata"]["annotations"].get("a~b/c"),
            pod["metadata"]["annotations"].get("a~b/c")
        );

        match &decision {
            Decision::Booked { booking_id, model, until, .. } => {
                prop_assert_eq!(label(&out, PRIORITY_LABEL), Some("high"));
                let id = booking_id.to_string();
                prop_assert_eq!(label(&out, BOOKING_LABEL), Some(id.as_str()));
                prop_assert_eq!(label(&out, MODEL_LABEL), Some(model.as_str()));
                let end = until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                prop_assert_eq!(&out["metadata"]["annotations"]["terminate-at"], &json!(end));
                check_placed_on(&pod, &out, model, &cfg)?;
                if classes {
                    prop_assert_eq!(&out["spec"]["priorityClassName"], "gpu-booking-high");
                    let changed = pod["spec"]["priorityClassName"] != "gpu-booking-high";
                    if changed {
                        prop_assert!(out["spec"].get("priority").is_none());
                        prop_assert!(out["spec"].get("preemptionPolicy").is_none());
                    }
                }
            }
            Decision::LowPriority { model, .. } => {
                prop_assert_eq!(label(&out, PRIORITY_LABEL), Some("low"));
                prop_assert!(label(&out, BOOKING_LABEL).is_none());
                prop_assert_eq!(label(&out, MODEL_LABEL), Some(model.as_str()));
                prop_assert!(out["metadata"]["annotations"].get("terminate-at").is_none());
                check_placed_on(&pod, &out, model, &cfg)?;
            }
            Decision::Strip { .. } => {
                check_cpu_only(&out, &cfg)?;
                prop_assert!(out["metadata"]["annotations"][GPU_REMOVED_ANNOTATION].is_string());
            }
            Decision::Unchecked { .. } => {
                // Nothing decided, so nothing of ours may stay that the creator wrote
                // (our marks are the webhook's alone); a pod without our marks or
                // class passes unchanged.
                let ours = |v: &Value| {
                    ["labels", "annotations"].iter().any(|map| {
                        v["metadata"][map].as_object().is_some_and(|m| {
                            m.keys().any(|k| is_our_key(k, &cfg) && !is_harmless_key(k))
                        })
                    })
                };
                prop_assert!(!ours(&out));
                if !ours(&pod) && pod["spec"].get("priorityClassName").is_none() {
                    prop_assert!(patch.0.is_empty());
                }
            }
            Decision::OtherWorkload => {
                // Admitted as its creator wrote it: every container as written, no
                // key of ours at all (not even a note of a removed GPU), not our
                // high class; a pod without them passes unchanged.
                prop_assert_eq!(containers(&out), containers(&pod));
                let ours = |v: &Value| {
                    ["labels", "annotations"].iter().any(|map| {
                        v["metadata"][map]
                            .as_object()
                            .is_some_and(|m| m.keys().any(|k| is_our_key(k, &cfg)))
                    })
                };
                let high = |v: &Value| {
                    cfg.high_priority_class.is_some()
                        && v["spec"]["priorityClassName"].as_str() == cfg.high_priority_class.as_deref()
                };
                prop_assert!(!ours(&out) && !high(&out));
                if !ours(&pod) && !high(&pod) {
                    prop_assert!(patch.0.is_empty());
                }
            }
        }

        // The VRAM budget is equal on both sides wherever a GPU remains (and is ours
        // to set).
        if !matches!(
            decision,
            Decision::Strip { .. } | Decision::Unchecked { .. } | Decision::OtherWorkload
        ) {
            for c in containers(&out) {
                let mut one = Value::Object(Map::new());
                one["spec"] = json!({"containers": [c]});
                if detect_gpu(&one, &cfg).is_some() {
                    let (req, lim) = (&c["resources"]["requests"][BUDGET], &c["resources"]["limits"][BUDGET]);
                    prop_assert_eq!(req, lim, "budget differs in {}", c);
                }
            }
        }

        // Planning the same decision again on the result changes nothing.
        let again = plan(&out, &decision, &cfg);
        prop_assert!(again.0.is_empty(), "not idempotent: {:?}", again);
    }

    #[test]
    fn cpu_only_applies_and_removes_every_gpu(pod in pod(), classes in any::<bool>()) {
        let cfg = cfg(classes);
        let out = apply(&pod, &plan_cpu_only(&pod, &cfg))?;
        check_cpu_only(&out, &cfg)?;
        prop_assert!(plan_cpu_only(&out, &cfg).0.is_empty());
    }

    /// The pipeline as the webhook runs it, on any pod and any answer.
    #[test]
    fn decide_then_plan(pod in pod(), free_a100 in 0u64..3, free_a6000 in 0u64..3, booked in any::<bool>(),
                        units in any::<Option<(u8, u8)>>()) {
        let cfg = cfg(true);
        let Some(gpu) = detect_gpu(&pod, &cfg) else { return Ok(()) };
        let answer = Schedulability {
            schedulable: booked,
            until: booked.then(|| "2030-01-01T00:00:00Z".parse().unwrap()),
            model: booked.then(|| model("a100")),
            booking_id: booked.then_some(3),
            user: None,
            free: [(model("a100"), free_a100), (model("a6000"), free_a6000)].into_iter().collect(),
            gpumem_mib: Default::default(),
            earliest_booking: None,
            gpumem_advertised_mib: None,
            earliest_booking_by_model: Default::default(),
            units: units.map(|(u, _)| u.into()),
            units_held: units.map(|(_, h)| h.into()),
            usage_reported_at: Default::default(),
            offers: Vec::new(),
            course: false,
        };
        let now = "2029-01-01T00:00:00Z".parse().unwrap();
        let d = decide(&gpu, Lookup::Answer(&answer), &cfg, now);
        apply(&pod, &plan(&pod, &d, &cfg))?;
        if let Some(w) = d.warning() {
            prop_assert!(w.chars().count() <= 120);
        }
    }

    /// An escape-scheme label alone identifies its user (decoded in one pass).
    #[test]
    fn escape_label_identifies_its_user(name in "\\PC{1,40}") {
        let Ok(user) = Username::parse(&name) else { return Ok(()) };
        let slug = escape_encode(&name);
        prop_assume!(slug.len() <= 256);
        let pod = json!({"metadata": {"labels": {USERNAME_KEY: slug}}});
        match identify(&pod, NameCase::Sensitive) {
            Some(Identity::Slug { slug: s, decoded }) => {
                prop_assert_eq!(s, slug);
                prop_assert_eq!(decoded, Some(user));
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}

#[test]
fn generated_pods_cover_the_interesting_shapes() {
    // A sanity check of the generator itself: it does produce pods without maps.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = BTreeSet::new();
    for _ in 0..500 {
        let p = pod().new_tree(&mut runner).unwrap().current();
        if p["metadata"].get("annotations").is_none() {
            seen.insert("no annotations");
        }
        if p["spec"]["containers"][0].get("env").is_none() {
            seen.insert("no env");
        }
        if p["spec"]["initContainers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            seen.insert("init containers");
        }
        if detect_gpu(&p, &cfg(true)).is_some() {
            seen.insert("gpu");
        }
        if p["metadata"]["annotations"].is_null() && p["metadata"].get("annotations").is_some() {
            seen.insert("null annotations");
        }
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
}
