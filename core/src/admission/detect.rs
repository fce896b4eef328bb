//! GPU detection: which containers of a pod ask for which GPU resources.

use std::collections::BTreeSet;

use serde_json::Value;

use super::quantity::gpu_units;
use super::AdmissionConfig;
use crate::gpu_model::ModelName;

/// The two container lists of a pod spec; GPU resources count in both.
pub(crate) const CONTAINER_LISTS: [&str; 2] = ["containers", "initContainers"];

/// What a pod asks for, found by [`detect_gpu`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequest {
    /// GPU units the pod needs at once: the larger of the sum over its containers and
    /// the largest init container (init containers run one at a time, before them).
    pub units: u64,
    /// The models named by per-model resources (`nvidia.com/a100` -> `a100`); empty
    /// when the pod only asks for generic GPUs.
    pub models: BTreeSet<ModelName>,
}

impl GpuRequest {
    /// The one model the pod asks for by resource name, if it names exactly one.
    pub fn model(&self) -> Option<&ModelName> {
        let mut models = self.models.iter();
        match (models.next(), models.next()) {
            (Some(model), None) => Some(model),
            _ => None,
        }
    }
}

/// Values of `NVIDIA_VISIBLE_DEVICES` that hand a container no GPU: `none` (no card,
/// the driver's tools only), `void` and the empty string (the runtime does nothing).
const NO_DEVICES: [&str; 3] = ["none", "void", ""];

/// Whether `container` sets `NVIDIA_VISIBLE_DEVICES` to something that can hand it
/// cards: a value other than [`NO_DEVICES`], or one from elsewhere (`valueFrom`,
/// which the webhook cannot read).
pub(crate) fn sets_visible_devices(container: &Value) -> bool {
    container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("name").and_then(Value::as_str) == Some(super::NVIDIA_VISIBLE_DEVICES))
        .any(|e| match e.get("value") {
            Some(Value::String(v)) => !NO_DEVICES.contains(&v.trim()),
            Some(_) => true,
            None => e.get("valueFrom").is_some(),
        })
}

/// The GPU request of `pod`, or `None` when no container or init container asks for a
/// configured GPU resource above zero in its requests or limits.
pub fn detect_gpu(pod: &Value, cfg: &AdmissionConfig) -> Option<GpuRequest> {
    let mut models = BTreeSet::new();
    let mut sum = 0u64;
    let mut init_max = 0u64;
    for (list, container) in containers(pod) {
        let units = container_gpu_units(container, cfg, &mut models);
        if list == "initContainers" {
            init_max = init_max.max(units);
        } else {
            sum = sum.saturating_add(units);
        }
    }
    let units = sum.max(init_max);
    (units > 0).then_some(GpuRequest { units, models })
}

/// GPU units `container` asks for, over all configured GPU resources (per resource the
/// larger of request and limit: an extended resource's request defaults to its limit).
/// Adds the models its per-model resources name to `models`.
pub(crate) fn container_gpu_units(
    container: &Value,
    cfg: &AdmissionConfig,
    models: &mut BTreeSet<ModelName>,
) -> u64 {
    let Some(resources) = container.get("resources") else {
        return 0;
    };
    let mut total = 0u64;
    let requests = resources.get("requests").and_then(Value::as_object);
    let limits = resources.get("limits").and_then(Value::as_object);
    let keys = requests
        .into_iter()
        .chain(limits)
        .flat_map(|map| map.keys())
        .collect::<BTreeSet<_>>();
    for key in keys {
        let Some(model) = cfg.gpu_resource_model(key) else {
            continue;
        };
        let of = |map: Option<&serde_json::Map<String, Value>>| {
            map.and_then(|m| m.get(key)).map_or(0, gpu_units)
        };
        let units = of(requests).max(of(limits));
        if units > 0 {
            total = total.saturating_add(units);
            if let Some(model) = model {
                models.insert(model.clone());
            }
        }
    }
    total
}

/// Every container and init container of `pod`, with the name of its list.
pub(crate) fn containers(pod: &Value) -> impl Iterator<Item = (&'static str, &Value)> {
    CONTAINER_LISTS.into_iter().flat_map(move |list| {
        pod.get("spec")
            .and_then(|spec| spec.get(list))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(move |c| (list, c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> AdmissionConfig {
        let mut cfg = AdmissionConfig::default();
        cfg.model_resources
            .insert("nvidia.com/a100".into(), ModelName::parse("a100").unwrap());
        cfg.model_resources.insert(
            "nvidia.com/mig-1g.5gb".into(),
            ModelName::parse("mig-1g.5gb").unwrap(),
        );
        cfg
    }

    fn pod(containers: Value, init: Value) -> Value {
        json!({"spec": {"containers": containers, "initContainers": init}})
    }

    #[test]
    fn no_gpu() {
        let p = pod(
            json!([{"name": "a", "resources": {"limits": {"cpu": "1"}}}]),
            json!(null),
        );
        assert_eq!(detect_gpu(&p, &cfg()), None);
        assert_eq!(detect_gpu(&json!({}), &cfg()), None);
        assert_eq!(detect_gpu(&json!("pod"), &cfg()), None);
        let zero = pod(
            json!([{"resources": {"limits": {"nvidia.com/gpu": "0"}}}]),
            json!([]),
        );
        assert_eq!(detect_gpu(&zero, &cfg()), None);
    }

    #[test]
    fn limits_only_requests_only_and_init() {
        let limits = pod(
            json!([{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
            json!([]),
        );
        assert_eq!(detect_gpu(&limits, &cfg()).unwrap().units, 1);
        let requests = pod(
            json!([{"resources": {"requests": {"nvidia.com/gpu": 2}}}]),
            json!([]),
        );
        assert_eq!(detect_gpu(&requests, &cfg()).unwrap().units, 2);
        let init = pod(
            json!([{"name": "main"}]),
            json!([{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        );
        assert_eq!(detect_gpu(&init, &cfg()).unwrap().units, 1);
    }

    #[test]
    fn per_model_and_mig() {
        let p = pod(
            json!([
                {"resources": {"limits": {"nvidia.com/a100": "1"}}},
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]),
            json!([]),
        );
        let req = detect_gpu(&p, &cfg()).unwrap();
        assert_eq!(req.units, 2);
        assert_eq!(req.model().map(ModelName::as_str), Some("a100"));
        let mig = pod(
            json!([{"resources": {"requests": {"nvidia.com/mig-1g.5gb": "1"}}}]),
            json!([]),
        );
        assert_eq!(
            detect_gpu(&mig, &cfg())
                .unwrap()
                .model()
                .map(ModelName::as_str),
            Some("mig-1g.5gb")
        );
        let two = pod(
            json!([{"resources": {"limits": {"nvidia.com/a100": "1", "nvidia.com/mig-1g.5gb": "1"}}}]),
            json!([]),
        );
        assert_eq!(detect_gpu(&two, &cfg()).unwrap().model(), None);
        // An unconfigured vendor resource is not ours to judge.
        let other = pod(
            json!([{"resources": {"limits": {"amd.com/gpu": "1"}}}]),
            json!([]),
        );
        assert_eq!(detect_gpu(&other, &cfg()), None);
    }
}
