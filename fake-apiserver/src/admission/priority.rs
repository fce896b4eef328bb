//! The `Priority` admission plugin ("Admission Controllers" page, Priority; "Pod
//! Priority and Preemption"): on pod creation it resolves `priorityClassName` (or the
//! `globalDefault` class, or none) to `spec.priority` and `spec.preemptionPolicy`, and
//! refuses a pod that names a class that does not exist or gives a priority or
//! preemption policy that disagrees with its class.

use serde_json::{json, Value};

use crate::status::ApiError;

/// Priority of pods without a class when no class is the global default.
const DEFAULT_PRIORITY: i64 = 0;
const PREEMPT_LOWER: &str = "PreemptLowerPriority";
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One `scheduling.k8s.io/v1` PriorityClass, as far as admission needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityClass {
    pub name: String,
    pub value: i64,
    pub global_default: bool,
    /// Defaulted by the API to `PreemptLowerPriority` when the class leaves it out.
    pub preemption_policy: String,
}

impl PriorityClass {
    pub fn from_value(obj: &Value) -> Option<Self> {
        Some(Self {
            name: obj.pointer("/metadata/name")?.as_str()?.to_owned(),
            value: obj.get("value")?.as_i64()?,
            global_default: obj
                .get("globalDefault")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            preemption_policy: obj
                .get("preemptionPolicy")
                .and_then(Value::as_str)
                .unwrap_or(PREEMPT_LOWER)
                .to_owned(),
        })
    }

    /// The two classes every API server creates at start-up.
    fn system() -> [Self; 2] {
        let class = |name: &str, value| Self {
            name: name.to_owned(),
            value,
            global_default: false,
            preemption_policy: PREEMPT_LOWER.to_owned(),
        };
        [
            class("system-node-critical", 2_000_001_000),
            class("system-cluster-critical", 2_000_000_000),
        ]
    }
}

/// The classes to resolve against: the stored ones, and the system classes unless a
/// stored one has the same name.
pub fn with_system_classes(mut stored: Vec<PriorityClass>) -> Vec<PriorityClass> {
    for class in PriorityClass::system() {
        if !stored.iter().any(|c| c.name == class.name) {
            stored.push(class);
        }
    }
    stored
}

/// Runs the plugin on a pod being created; changes `pod` in place. Run again after a
/// webhook changed the pod (reinvocation), it re-checks what the pod then says.
pub fn admit(pod: &mut Value, classes: &[PriorityClass]) -> Result<(), ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some()
    {
        return Ok(());
    }
    if !pod.get("spec").is_some_and(Value::is_object) {
        return Ok(());
    }
    let spec = &mut pod["spec"];
    let class_name = spec
        .get("priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let (priority, policy) = if class_name.is_empty() {
        // With several global defaults (a race the API allows), the lowest value wins.
        match classes
            .iter()
            .filter(|c| c.global_default)
            .min_by_key(|c| c.value)
        {
            Some(default) => {
                spec["priorityClassName"] = json!(default.name);
                (default.value, default.preemption_policy.clone())
            }
            None => (DEFAULT_PRIORITY, PREEMPT_LOWER.to_owned()),
        }
    } else {
        let class = classes
            .iter()
            .find(|c| c.name == class_name)
            .ok_or_else(|| {
                ApiError::forbidden(
                    "pods",
                    &name,
                    &format!("no PriorityClass with name {class_name} was found"),
                )
            })?;
        (class.value, class.preemption_policy.clone())
    };
    if let Some(given) = spec.get("priority").filter(|p| !p.is_null()) {
        if given.as_i64() != Some(priority) {
            return Err(ApiError::forbidden(
                "pods",
                &name,
                &format!(
                    "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
                ),
            ));
        }
    }
    spec["priority"] = json!(priority);
    if let Some(given) = spec.get("preemptionPolicy").and_then(Value::as_str) {
        if given != policy {
            return Err(ApiError::forbidden(
                "pods",
                &name,
                &format!(
                    "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
                ),
            ));
        }
    }
    spec["preemptionPolicy"] = json!(policy);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Vec<PriorityClass> {
        let high = json!({"metadata": {"name": "high"}, "value": 1000});
        let low = json!({"metadata": {"name": "low"}, "value": 10, "preemptionPolicy": "Never"});
        with_system_classes(vec![
            PriorityClass::from_value(&high).unwrap(),
            PriorityClass::from_value(&low).unwrap(),
        ])
    }

    #[test]
    fn resolves_the_class_or_zero() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "low"}});
        admit(&mut pod, &classes()).unwrap();
        assert_eq!(pod["spec"]["priority"], 10);
        assert_eq!(pod["spec"]["preemptionPolicy"], "Never");
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {}});
        admit(&mut pod, &classes()).unwrap();
        assert_eq!(pod["spec"]["priority"], 0);
        assert_eq!(pod["spec"]["preemptionPolicy"], PREEMPT_LOWER);
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "system-node-critical"}});
        admit(&mut pod, &classes()).unwrap();
        assert_eq!(pod["spec"]["priority"], 2_000_001_000);
    }

    #[test]
    fn the_lowest_global_default_wins() {
        let mut all = classes();
        for (name, value) in [("d1", 7), ("d2", 5)] {
            all.push(
                PriorityClass::from_value(
                    &json!({"metadata": {"name": name}, "value": value, "globalDefault": true}),
                )
                .unwrap(),
            );
        }
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {}});
        admit(&mut pod, &all).unwrap();
        assert_eq!(pod["spec"]["priorityClassName"], "d2");
        assert_eq!(pod["spec"]["priority"], 5);
    }

    #[test]
    fn refuses_disagreement_and_unknown_classes() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "high", "priority": 0}});
        let e = admit(&mut pod, &classes()).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(e.body["message"], "pods \"p\" is forbidden: the integer value of priority (0) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name");
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "low", "preemptionPolicy": "PreemptLowerPriority"}});
        let e = admit(&mut pod, &classes()).unwrap_err();
        assert!(e.body["message"]
            .as_str()
            .unwrap()
            .contains("the string value of PreemptionPolicy (PreemptLowerPriority)"));
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "nope"}});
        let e = admit(&mut pod, &classes()).unwrap_err();
        assert_eq!(e.body["reason"], "Forbidden");
        assert_eq!(
            e.body["message"],
            "pods \"p\" is forbidden: no PriorityClass with name nope was found"
        );
    }
}
