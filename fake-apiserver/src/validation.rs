//! What kube-apiserver's validation refuses on an update that the fake's callers can
//! make: a pod's spec is immutable but for a few fields (`ValidatePodUpdate` in
//! `pkg/apis/core/validation`, Kubernetes 1.30; "Pod Lifecycle": "most of the pod's
//! spec is immutable").

use serde_json::Value;

/// The message kube-apiserver gives, before the difference it found.
pub(crate) const POD_UPDATE_FORBIDDEN: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Checks an update of a pod's main resource: `Err` with the field error
/// (`spec: Forbidden: ...`) when `new` changes its spec beyond what may change.
pub(crate) fn pod_update(old: &Value, new: &Value) -> Result<(), String> {
    let empty = Value::Object(Default::default());
    let old_spec = old.get("spec").unwrap_or(&empty);
    let new_spec = new.get("spec").unwrap_or(&empty);
    if old_spec == new_spec {
        return Ok(());
    }
    let mut munged = new_spec.clone();
    // Images may change, container by container.
    for field in ["containers", "initContainers"] {
        let old_containers = old_spec.get(field).and_then(Value::as_array);
        if let (Some(new_containers), Some(old_containers)) = (
            munged.get_mut(field).and_then(Value::as_array_mut),
            old_containers,
        ) {
            if new_containers.len() == old_containers.len() {
                for (c, o) in new_containers.iter_mut().zip(old_containers) {
                    copy_field(c, o, "image");
                }
            }
        }
    }
    copy_field(&mut munged, old_spec, "activeDeadlineSeconds");
    // Scheduling gates may be removed (their own validation; nothing else here).
    copy_field(&mut munged, old_spec, "schedulingGates");
    // Tolerations may only be added to.
    let tolerations = |spec: &Value| {
        spec.get("tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (old_tolerations, new_tolerations) = (tolerations(old_spec), tolerations(&munged));
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        copy_field(&mut munged, old_spec, "tolerations");
    }
    // A negative grace period may be set to 1.
    let old_grace = old_spec
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    let new_grace = munged
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    if old_grace.is_some_and(|g| g < 0) && new_grace == Some(1) {
        copy_field(&mut munged, old_spec, "terminationGracePeriodSeconds");
    }
    if munged == *old_spec {
        return Ok(());
    }
    Err(format!(
        "spec: Forbidden: {POD_UPDATE_FORBIDDEN}\n{}",
        difference(old_spec, &munged)
    ))
}

/// Sets `to[key]` to `from[key]`, or removes it where `from` has none.
fn copy_field(to: &mut Value, from: &Value, key: &str) {
    let Some(map) = to.as_object_mut() else {
        return;
    };
    match from.get(key) {
        Some(v) => {
            map.insert(key.to_owned(), v.clone());
        }
        None => {
            map.remove(key);
        }
    }
}

/// The spec fields that differ, one per line (`  spec.nodeSelector: a -> b`), as a
/// short stand-in for the real server's object diff.
fn difference(old: &Value, new: &Value) -> String {
    let empty = serde_json::Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or_else(|| "<none>".to_owned(), Value::to_string);
            format!("  spec.{k}: {} -> {}", show(old.get(k)), show(new.get(k)))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"spec": {
            "containers": [{"name": "nb", "image": "jupyter:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 30,
        }})
    }

    #[test]
    fn mutable_fields_may_change() {
        let mut new = pod();
        new["spec"]["containers"][0]["image"] = json!("jupyter:2");
        new["spec"]["activeDeadlineSeconds"] = json!(60);
        new["spec"]["tolerations"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "b", "operator": "Exists"}));
        assert_eq!(pod_update(&pod(), &new), Ok(()));
    }

    #[test]
    fn everything_else_is_refused_naming_the_field() {
        let mut new = pod();
        new["spec"]["containers"][0]["resources"] = json!({});
        let refused = pod_update(&pod(), &new).unwrap_err();
        assert!(refused.starts_with("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"));
        assert!(refused.contains("spec.containers:"), "{refused}");

        let mut new = pod();
        new["spec"]["nodeSelector"] = json!({"gpu-booking.io/model": "a100"});
        assert!(pod_update(&pod(), &new)
            .unwrap_err()
            .contains("spec.nodeSelector"));

        let mut new = pod();
        new["spec"]["tolerations"] = json!([]);
        assert!(pod_update(&pod(), &new).is_err(), "a toleration removed");

        let mut new = pod();
        new["spec"]["terminationGracePeriodSeconds"] = json!(1);
        assert!(pod_update(&pod(), &new).is_err());
        let mut negative = pod();
        negative["spec"]["terminationGracePeriodSeconds"] = json!(-1);
        assert_eq!(pod_update(&negative, &new), Ok(()));
    }
}
