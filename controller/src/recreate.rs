//! The copies of a pod that the controller creates in its place: CPU-only when its GPU
//! time is up ([`cpu_only_copy`]), lent when `--on-expiry demote` ([`lent_copy`]).
//!
//! The GPU part is `core`'s patch planner ([`plan_cpu_only_because`], the same step the
//! webhook uses to strip a pod): GPU resources and the VRAM budget gone from every
//! container and init container, `NVIDIA_VISIBLE_DEVICES=none`, our labels,
//! `terminate-at`, model node selector and our priority classes dropped. Here the
//! copy is then made creatable: no status, no `nodeName`, no server-set metadata, and
//! none of our other `gpu-booking` labels and annotations (but the one that says why
//! the GPU was removed).

use gpu_booking_core::admission::{
    is_harmless_key, is_our_key, plan_cpu_only_because, plan_demoted, AdmissionConfig, MODEL_LABEL,
    PRIORITY_LABEL,
};
use serde_json::{json, Value};

/// Metadata the API server sets, which a create must not carry.
const SERVER_METADATA: [&str; 10] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "generation",
    "selfLink",
    "ownerReferences",
    "finalizers",
];

/// Why a copy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the pod is not a JSON object")]
    NotAPod,
    #[error("the CPU-only patch does not apply: {0}")]
    Patch(#[from] json_patch::PatchError),
}

/// The pod to create in place of `pod`: same name, namespace, labels and annotations
/// (minus ours), spec without GPU, annotated with `reason`.
pub fn cpu_only_copy(pod: &Value, cfg: &AdmissionConfig, reason: &str) -> Result<Value, CopyError> {
    if !pod.is_object() {
        return Err(CopyError::NotAPod);
    }
    let patch = plan_cpu_only_because(pod, cfg, reason);
    let mut copy = pod.clone();
    json_patch::patch(&mut copy, &patch.0)?;
    // The note why it runs without its GPU and, for a lent pod, what it asked for
    // (so that its user is offered a GPU when one frees).
    creatable(&mut copy, cfg, is_harmless_key)?;
    Ok(copy)
}

/// The lent copy of a booked pod (`--on-expiry demote`): a pod's priority cannot
/// change once it exists, so the pod is created again as the webhook admits a lent
/// pod (core's [`plan_demoted`]): the low priority class, the labels
/// `gpu-booking.io/priority=low` and `gpu-booking.io/model`, no booking label, no
/// `terminate-at`, and its GPU, VRAM budget and model node selector kept. `None` when
/// the pod names no valid model (the caller then makes a CPU-only copy). A pod
/// admitted before the upgrade names its model under the legacy key; its copy carries
/// only the new keys.
pub fn lent_copy(pod: &Value, cfg: &AdmissionConfig) -> Result<Option<Value>, CopyError> {
    if !pod.is_object() {
        return Err(CopyError::NotAPod);
    }
    let Some(patch) = plan_demoted(pod, cfg) else {
        return Ok(None);
    };
    let mut copy = pod.clone();
    json_patch::patch(&mut copy, &patch.0)?;
    creatable(&mut copy, cfg, |k| k == PRIORITY_LABEL || k == MODEL_LABEL)?;
    Ok(Some(copy))
}

/// Makes `copy` creatable: no status, no server-set metadata, no `nodeName`, and none
/// of our labels and annotations but those `keep` names.
fn creatable(
    copy: &mut Value,
    cfg: &AdmissionConfig,
    keep: impl Fn(&str) -> bool,
) -> Result<(), CopyError> {
    let Some(root) = copy.as_object_mut() else {
        return Err(CopyError::NotAPod);
    };
    root.remove("status");
    root.insert("apiVersion".into(), json!("v1"));
    root.insert("kind".into(), json!("Pod"));
    if let Some(meta) = root.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in SERVER_METADATA {
            meta.remove(key);
        }
        for map in ["labels", "annotations"] {
            if let Some(entries) = meta.get_mut(map).and_then(Value::as_object_mut) {
                entries.retain(|k, _| keep(k) || !is_our_key(k, cfg));
            }
        }
    }
    if let Some(spec) = root.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("nodeName");
        // Only the API server's ephemeral-container subresource may add these.
        spec.remove("ephemeralContainers");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_booking_core::admission::{detect_gpu, GPU_REMOVED_ANNOTATION, OUR_PREFIXES};
    use gpu_booking_core::offers::GPU_WANTED_ANNOTATION;

    fn fixtures() -> Vec<(String, Value)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/kubespawner");
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap();
                (
                    e.path().display().to_string(),
                    serde_json::from_str(&text).unwrap(),
                )
            })
            .collect()
    }

    /// A pod as the API server holds it after the webhook booked it, its labels under
    /// `prefix` (one of [`OUR_PREFIXES`]: since the upgrade, or before it).
    fn booked(mut pod: Value, prefix: &str) -> Value {
        pod["metadata"]["uid"] = json!("u-1");
        pod["metadata"]["resourceVersion"] = json!("42");
        pod["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        pod["metadata"]["labels"][format!("{prefix}priority")] = json!("high");
        pod["metadata"]["labels"][format!("{prefix}booking")] = json!("7");
        pod["metadata"]["annotations"]["terminate-at"] = json!("2026-01-02T00:00:00Z");
        pod["metadata"]["annotations"]["gpu-booking.io/last-gpu-activity"] =
            json!("2026-01-01T01:00:00Z");
        pod["spec"]["nodeName"] = json!("gpu-1");
        pod["spec"]["nodeSelector"] = json!({"gpu-booking.io/model": "a100"});
        pod["spec"]["priorityClassName"] = json!("gpu-booking-high");
        pod["spec"]["priority"] = json!(1000);
        pod["spec"]["initContainers"] = json!([{"name": "init", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "1024"}}}]);
        pod["status"] = json!({"phase": "Running", "podIP": "10.0.0.1"});
        pod
    }

    #[test]
    fn kubespawner_pods_lose_every_gpu() {
        let cfg = AdmissionConfig::default();
        let pods = fixtures();
        let mut gpu_pods = 0;
        for ((file, pod), prefix) in pods
            .into_iter()
            .flat_map(|fixture| OUR_PREFIXES.map(|prefix| (fixture.clone(), prefix)))
        {
            let pod = booked(pod, prefix);
            assert!(detect_gpu(&pod, &cfg).is_some(), "{file}");
            gpu_pods += 1;
            let copy = cpu_only_copy(&pod, &cfg, "booking ended").unwrap();
            assert!(detect_gpu(&copy, &cfg).is_none(), "{file}: GPU left");
            assert!(copy.get("status").is_none(), "{file}");
            let meta = &copy["metadata"];
            assert_eq!(meta["name"], pod["metadata"]["name"], "{file}");
            for gone in ["uid", "resourceVersion", "creationTimestamp"] {
                assert!(meta.get(gone).is_none(), "{file}: {gone}");
            }
            let labels = meta["labels"].as_object().unwrap();
            assert!(
                labels.keys().all(|k| !k.starts_with("gpu-booking")),
                "{file}"
            );
            assert_eq!(
                labels["hub.jupyter.org/username"],
                pod["metadata"]["labels"]["hub.jupyter.org/username"]
            );
            let annotations = meta["annotations"].as_object().unwrap();
            assert_eq!(annotations[GPU_REMOVED_ANNOTATION], "booking ended");
            assert!(annotations.get("terminate-at").is_none());
            assert!(annotations
                .get("gpu-booking.io/last-gpu-activity")
                .is_none());
            let spec = &copy["spec"];
            assert!(spec.get("nodeName").is_none() && spec.get("priority").is_none());
            assert!(spec.get("priorityClassName").is_none());
            assert!(spec["nodeSelector"].get("gpu-booking.io/model").is_none());
            for list in ["containers", "initContainers"] {
                for c in spec[list].as_array().unwrap() {
                    let env = c["env"].as_array().unwrap();
                    assert!(
                        env.contains(&json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"})),
                        "{file}"
                    );
                    let text = c.get("resources").map(Value::to_string).unwrap_or_default();
                    assert!(
                        !text.contains("nvidia.com/gpu") && !text.contains("gpumem"),
                        "{file}: {text}"
                    );
                }
            }
        }
        assert!(gpu_pods == 0 || gpu_pods >= 8, "fixtures: {gpu_pods}");
    }

    #[test]
    fn lent_copy_keeps_the_gpu_with_low_priority() {
        let cfg = AdmissionConfig {
            high_priority_class: Some("gpu-booking-high".into()),
            low_priority_class: Some("gpu-booking-low".into()),
            ..AdmissionConfig::default()
        };
        for ((file, pod), prefix) in fixtures()
            .into_iter()
            .flat_map(|fixture| OUR_PREFIXES.map(|prefix| (fixture.clone(), prefix)))
        {
            let mut pod = booked(pod, prefix);
            pod["metadata"]["labels"][format!("{prefix}model")] = json!("a100");
            let copy = lent_copy(&pod, &cfg).unwrap().unwrap();
            let meta = &copy["metadata"];
            // Written under the current keys only, whatever the original carried.
            let mut ours: Vec<_> = meta["labels"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| k.starts_with("gpu-booking"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            ours.sort();
            assert_eq!(
                ours,
                [
                    "gpu-booking.io/model=\"a100\"",
                    "gpu-booking.io/priority=\"low\""
                ],
                "{file}"
            );
            assert!(meta["annotations"].get("terminate-at").is_none(), "{file}");
            assert!(meta.get("uid").is_none() && copy.get("status").is_none());
            let spec = &copy["spec"];
            assert_eq!(spec["priorityClassName"], "gpu-booking-low", "{file}");
            assert!(spec.get("priority").is_none() && spec.get("nodeName").is_none());
            assert_eq!(spec["nodeSelector"]["gpu-booking.io/model"], "a100");
            assert_eq!(
                detect_gpu(&copy, &cfg).map(|g| g.units),
                detect_gpu(&pod, &cfg).map(|g| g.units),
                "{file}: keeps its GPU"
            );
            assert!(copy.to_string().contains("gpu-booking.io/gpumem"), "{file}");
        }
        // Without a model there is no lent copy to make.
        let pod = booked(fixtures().remove(0).1, OUR_PREFIXES[0]);
        assert!(lent_copy(&pod, &cfg).unwrap().is_none());
    }

    /// A lent pod whose GPU was taken back keeps in its copy what it asked for, so
    /// that its user is offered a GPU when one frees; a booked pod's copy does not
    /// (its GPU time is over).
    #[test]
    fn a_lent_pods_copy_says_what_it_wanted() {
        let cfg = AdmissionConfig::default();
        for (file, pod) in fixtures() {
            let mut lent = booked(pod, OUR_PREFIXES[0]);
            lent["metadata"]["labels"][format!("{}priority", OUR_PREFIXES[0])] = json!("low");
            let copy = cpu_only_copy(&lent, &cfg, "taken back for a booking").unwrap();
            let annotations = &copy["metadata"]["annotations"];
            // The fixtures ask for the generic resource: any model.
            assert_eq!(annotations[GPU_WANTED_ANNOTATION], "1 any", "{file}");
            assert_eq!(
                annotations[GPU_REMOVED_ANNOTATION],
                "taken back for a booking"
            );
            let booked_copy = cpu_only_copy(
                &booked(lent.clone(), OUR_PREFIXES[0]),
                &cfg,
                "booking ended",
            )
            .unwrap();
            assert!(
                booked_copy["metadata"]["annotations"]
                    .get(GPU_WANTED_ANNOTATION)
                    .is_none(),
                "{file}"
            );
        }
    }

    #[test]
    fn not_a_pod() {
        assert!(cpu_only_copy(&json!([1]), &AdmissionConfig::default(), "x").is_err());
    }
}
