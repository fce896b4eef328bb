//! kube-scheduler's filters that do not count resources, in its order: NodeUnschedulable,
//! TaintToleration, NodeAffinity ("Assigning Pods to Nodes": `nodeSelector` and
//! required node affinity; "Taints and Tolerations"). Each failure is one reason with
//! kube-scheduler's wording; all three are "unresolvable" (preemption cannot help).

use serde_json::Value;

use crate::fields::str_at;

/// Why a node that is not resource-related cannot take the pod; `None`: it can.
pub(crate) fn reject(pod: &Value, node: &Value) -> Option<String> {
    unschedulable(pod, node)
        .or_else(|| untolerated_taint(pod, node))
        .or_else(|| {
            (!node_affinity_matches(pod, node))
                .then(|| "node(s) didn't match Pod's node affinity/selector".to_owned())
        })
}

/// kube-scheduler's `FitError` message: `0/N nodes are available: ` and every node's
/// reasons as a histogram (`<count> <reason>`), sorted as strings, joined by `, `,
/// ending with a period.
pub(crate) fn fit_error(nodes: usize, statuses: &[Vec<String>]) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for reason in statuses.iter().flatten() {
        *counts.entry(reason).or_default() += 1;
    }
    let mut histogram: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    histogram.sort();
    let mut message = format!("0/{nodes} nodes are available:");
    if !histogram.is_empty() {
        message.push_str(&format!(" {}.", histogram.join(", ")));
    }
    message
}

fn tolerations(pod: &Value) -> &[Value] {
    pod.pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `Toleration.ToleratesTaint`: an empty effect tolerates every effect, an empty key
/// with `Exists` every key; `Equal` (the default operator) compares values.
fn tolerates(toleration: &Value, key: &str, value: &str, effect: &str) -> bool {
    let t_effect = str_at(toleration, "/effect");
    let t_key = str_at(toleration, "/key");
    if !t_effect.is_empty() && t_effect != effect {
        return false;
    }
    if !t_key.is_empty() && t_key != key {
        return false;
    }
    match str_at(toleration, "/operator") {
        "" | "Equal" => str_at(toleration, "/value") == value,
        "Exists" => true,
        _ => false,
    }
}

/// NodeUnschedulable: a cordoned node takes only pods that tolerate
/// `node.kubernetes.io/unschedulable:NoSchedule`.
fn unschedulable(pod: &Value, node: &Value) -> Option<String> {
    let cordoned = node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true);
    let tolerated = tolerations(pod)
        .iter()
        .any(|t| tolerates(t, "node.kubernetes.io/unschedulable", "", "NoSchedule"));
    (cordoned && !tolerated).then(|| "node(s) were unschedulable".to_owned())
}

/// TaintToleration: every `NoSchedule` and `NoExecute` taint must be tolerated
/// (`PreferNoSchedule` only scores, which the fake does not).
fn untolerated_taint(pod: &Value, node: &Value) -> Option<String> {
    let taints = node.pointer("/spec/taints").and_then(Value::as_array)?;
    taints
        .iter()
        .filter(|t| matches!(str_at(t, "/effect"), "NoSchedule" | "NoExecute"))
        .find(|t| {
            let (key, value, effect) =
                (str_at(t, "/key"), str_at(t, "/value"), str_at(t, "/effect"));
            !tolerations(pod)
                .iter()
                .any(|tol| tolerates(tol, key, value, effect))
        })
        .map(|t| {
            format!(
                "node(s) had untolerated taint {{{}: {}}}",
                str_at(t, "/key"),
                str_at(t, "/value")
            )
        })
}

/// NodeAffinity: every `nodeSelector` label, and one of the required
/// `nodeSelectorTerms` (terms are ORed, the expressions of a term ANDed; a term with no
/// expressions matches nothing).
pub(crate) fn node_affinity_matches(pod: &Value, node: &Value) -> bool {
    let labels = node.pointer("/metadata/labels").and_then(Value::as_object);
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let selector_ok = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k).is_some() && label(k) == v.as_str());
    if !selector_ok {
        return false;
    }
    let Some(terms) = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    let name = str_at(node, "/metadata/name");
    terms.iter().any(|term| {
        let exprs = term.get("matchExpressions").and_then(Value::as_array);
        let fields = term.get("matchFields").and_then(Value::as_array);
        let n = exprs.map_or(0, Vec::len) + fields.map_or(0, Vec::len);
        n > 0
            && exprs
                .into_iter()
                .flatten()
                .all(|e| requirement(e, label(str_at(e, "/key"))))
            && fields.into_iter().flatten().all(|e| {
                let field = (str_at(e, "/key") == "metadata.name").then_some(name);
                requirement(e, field)
            })
    })
}

/// One `NodeSelectorRequirement` against the node's value for its key (`None`: the
/// node has no such label). `Gt`/`Lt` compare integers; a value that is not one fails.
fn requirement(expr: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = expr
        .get("values")
        .and_then(Value::as_array)
        .map(|vs| vs.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let int = |s: &str| s.trim().parse::<i64>().ok();
    let compare = |wanted: std::cmp::Ordering| match (
        value.and_then(int),
        values.first().and_then(|v| int(v)),
    ) {
        (Some(have), Some(bound)) if values.len() == 1 => have.cmp(&bound) == wanted,
        _ => false,
    };
    match str_at(expr, "/operator") {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Value {
        json!({"metadata": {"name": "n1", "labels": {"gpu": "a100", "count": "4"}}})
    }

    fn with_terms(terms: Value) -> Value {
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}})
    }

    #[test]
    fn operators() {
        let yes = [
            json!({"key": "gpu", "operator": "In", "values": ["a100", "h100"]}),
            json!({"key": "gpu", "operator": "NotIn", "values": ["t4"]}),
            json!({"key": "other", "operator": "NotIn", "values": ["t4"]}),
            json!({"key": "gpu", "operator": "Exists"}),
            json!({"key": "other", "operator": "DoesNotExist"}),
            json!({"key": "count", "operator": "Gt", "values": ["3"]}),
            json!({"key": "count", "operator": "Lt", "values": ["5"]}),
        ];
        for e in yes {
            let pod = with_terms(json!([{"matchExpressions": [e.clone()]}]));
            assert!(node_affinity_matches(&pod, &node()), "{e}");
        }
        let no = [
            json!({"key": "gpu", "operator": "In", "values": ["t4"]}),
            json!({"key": "gpu", "operator": "NotIn", "values": ["a100"]}),
            json!({"key": "other", "operator": "Exists"}),
            json!({"key": "gpu", "operator": "DoesNotExist"}),
            json!({"key": "count", "operator": "Gt", "values": ["4"]}),
            json!({"key": "gpu", "operator": "Lt", "values": ["5"]}),
            json!({"key": "gpu", "operator": "Bogus"}),
        ];
        for e in no {
            let pod = with_terms(json!([{"matchExpressions": [e.clone()]}]));
            assert!(!node_affinity_matches(&pod, &node()), "{e}");
        }
    }

    #[test]
    fn terms_are_ored_and_empty_terms_match_nothing() {
        let pod = with_terms(json!([
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["t4"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]));
        assert!(node_affinity_matches(&pod, &node()));
        assert!(!node_affinity_matches(&with_terms(json!([{}])), &node()));
    }

    #[test]
    fn taints_and_cordons() {
        let tainted = json!({"spec": {"taints": [
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"}
        ]}});
        let plain = json!({"spec": {}});
        assert_eq!(
            reject(&plain, &tainted).as_deref(),
            Some("node(s) had untolerated taint {gpu: yes}")
        );
        let tolerant = json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}});
        assert_eq!(reject(&tolerant, &tainted), None);
        let wrong_value = json!({"spec": {"tolerations": [{"key": "gpu", "value": "no", "effect": "NoSchedule"}]}});
        assert!(reject(&wrong_value, &tainted).is_some());
        let cordoned = json!({"spec": {"unschedulable": true}});
        assert_eq!(
            reject(&plain, &cordoned).as_deref(),
            Some("node(s) were unschedulable")
        );
        let everything = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        assert_eq!(reject(&everything, &cordoned), None);
    }
}
