//! Which webhooks a request reaches ("Dynamic Admission Control": Matching requests:
//! rules, namespaceSelector, objectSelector, matchConditions).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, RuleWithOperations};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as LabelSelectorSpec;
use serde_json::{json, Value};

use super::Attributes;
use crate::select::LabelSelector;

/// Whether one rule covers the request: operation, group, version, resource (with
/// `*`, `*/*`, `pods/*` and `*/status` as the docs define them) and scope.
pub(super) fn rule_matches(rule: &RuleWithOperations, attrs: &Attributes) -> bool {
    let any = |list: &Option<Vec<String>>, value: &str| {
        list.iter()
            .flatten()
            .any(|item| item == "*" || item == value)
    };
    let resource_matches = rule.resources.iter().flatten().any(|pattern| {
        let (res, sub) = pattern.split_once('/').unwrap_or((pattern, ""));
        let res_ok = res == "*" || res == attrs.resource;
        let sub_ok = match attrs.subresource.as_deref() {
            None => sub.is_empty(),
            Some(actual) => sub == "*" || sub == actual,
        };
        res_ok && sub_ok
    });
    let scope_ok = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => attrs.namespace.is_none(),
        "Namespaced" => attrs.namespace.is_some(),
        _ => true,
    };
    any(&rule.operations, &attrs.operation)
        && any(&rule.api_groups, &attrs.group)
        && any(&rule.api_versions, &attrs.version)
        && resource_matches
        && scope_ok
}

pub fn rules_match(hook: &MutatingWebhook, attrs: &Attributes) -> bool {
    hook.rules
        .iter()
        .flatten()
        .any(|rule| rule_matches(rule, attrs))
}

/// A `metav1.LabelSelector` against a label map; no selector matches everything.
/// The selector is turned into its string form and read by the one label selector
/// parser the fake has (the list `labelSelector` parameter's).
pub fn selector_matches(spec: Option<&LabelSelectorSpec>, labels: &Value) -> Result<bool, String> {
    let Some(spec) = spec else {
        return Ok(true);
    };
    let mut parts = Vec::new();
    for (k, v) in spec.match_labels.iter().flatten() {
        parts.push(format!("{k}={v}"));
    }
    for expr in spec.match_expressions.iter().flatten() {
        let values = expr.values.clone().unwrap_or_default().join(",");
        let key = &expr.key;
        parts.push(match expr.operator.as_str() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        });
    }
    let selector = LabelSelector::parse(&parts.join(","))?;
    Ok(selector.matches(&json!({"metadata": {"labels": labels}})))
}

/// What matchConditions decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditions {
    /// Every condition is true (or there are none): call the webhook.
    Call,
    /// A condition is false: skip the webhook, whatever the others said.
    Skip,
    /// No condition is false but one failed to evaluate: failurePolicy decides.
    Error(String),
}

/// JSON as CEL sees it: integers as `int`, other numbers as `double`.
pub(super) fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let map: HashMap<cel::objects::Key, cel::Value> = map
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
    }
}

/// Compiled CEL expressions by source: a spawn storm evaluates the same condition for
/// every pod, and parsing costs more than evaluating.
#[derive(Default)]
pub struct Programs(Mutex<HashMap<String, Arc<Result<cel::Program, String>>>>);

impl Programs {
    fn get(&self, source: &str) -> Arc<Result<cel::Program, String>> {
        let mut programs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        programs
            .entry(source.to_owned())
            .or_insert_with(|| {
                Arc::new(
                    cel::Program::compile(source).map_err(|e| format!("compilation failed: {e}")),
                )
            })
            .clone()
    }
}

/// Runs the expression `source` in `context`.
pub(super) fn execute(
    programs: &Programs,
    source: &str,
    context: &cel::Context<'_, '_>,
) -> Result<cel::Value, String> {
    match &*programs.get(source) {
        Ok(program) => program
            .execute(context)
            .map_err(|e| format!("expression {source:?} resulted in error: {e}")),
        Err(e) => Err(format!("expression {source:?}: {e}")),
    }
}

/// Evaluates a webhook's matchConditions with the variables `object`, `oldObject` and
/// `request` (the AdmissionRequest without its objects). Simplification: `authorizer`
/// is not provided (an expression that uses it fails to evaluate), and expressions are
/// compiled here rather than checked when the configuration is written.
pub fn evaluate_conditions(
    programs: &Programs,
    hook: &MutatingWebhook,
    object: &Value,
    request: &Value,
) -> Conditions {
    let conditions = hook.match_conditions.as_deref().unwrap_or_default();
    if conditions.is_empty() {
        return Conditions::Call;
    }
    let mut context = cel::Context::default();
    context.add_variable_from_value("object", to_cel(object));
    context.add_variable_from_value("oldObject", cel::Value::Null);
    context.add_variable_from_value("request", to_cel(request));
    let mut first_error = None;
    for condition in conditions {
        let outcome = match &*programs.get(&condition.expression) {
            Ok(program) => program.execute(&context).map_err(|e| e.to_string()),
            Err(e) => Err(e.clone()),
        };
        match outcome {
            Ok(cel::Value::Bool(false)) => return Conditions::Skip,
            Ok(cel::Value::Bool(true)) => {}
            Ok(other) => {
                first_error.get_or_insert_with(|| {
                    format!(
                        "matchCondition {:?} evaluated to {other:?}, not a bool",
                        condition.name
                    )
                });
            }
            Err(e) => {
                first_error.get_or_insert_with(|| {
                    format!("matchCondition {:?} failed: {e}", condition.name)
                });
            }
        }
    }
    match first_error {
        Some(e) => Conditions::Error(e),
        None => Conditions::Call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(value: Value) -> MutatingWebhook {
        serde_json::from_value(value).unwrap()
    }

    fn attrs(resource: &str, sub: Option<&str>, ns: Option<&str>) -> Attributes {
        Attributes {
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.map(str::to_owned),
            namespace: ns.map(str::to_owned),
            name: "p".into(),
            kind: "Pod".into(),
            operation: "CREATE".into(),
            dry_run: false,
            user: super::super::UserInfo::admin(),
        }
    }

    #[test]
    fn rules_follow_the_documented_wildcards() {
        let rule = |resources: Value, scope: &str| {
            hook(
                json!({"name": "h", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {}, "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                "apiVersions": ["v1"], "resources": resources, "scope": scope}]}),
            )
        };
        let pod = attrs("pods", None, Some("jhub"));
        let binding = attrs("pods", Some("binding"), Some("jhub"));
        assert!(rules_match(&rule(json!(["pods"]), "*"), &pod));
        assert!(!rules_match(&rule(json!(["pods"]), "*"), &binding));
        assert!(rules_match(&rule(json!(["pods/*"]), "*"), &binding));
        assert!(!rules_match(&rule(json!(["pods/*"]), "*"), &pod));
        assert!(rules_match(&rule(json!(["*"]), "*"), &pod));
        assert!(rules_match(&rule(json!(["*/*"]), "*"), &binding));
        assert!(rules_match(&rule(json!(["*/binding"]), "*"), &binding));
        assert!(!rules_match(&rule(json!(["configmaps"]), "*"), &pod));
        assert!(rules_match(&rule(json!(["pods"]), "Namespaced"), &pod));
        assert!(!rules_match(&rule(json!(["pods"]), "Cluster"), &pod));
    }

    #[test]
    fn selectors() {
        let labels = json!({"kubernetes.io/metadata.name": "jhub", "team": "a"});
        let sel: LabelSelectorSpec = serde_json::from_value(json!({
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "gpu-booking"]},
                {"key": "opt-out", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert_eq!(selector_matches(Some(&sel), &labels), Ok(true));
        assert_eq!(
            selector_matches(
                Some(&sel),
                &json!({"kubernetes.io/metadata.name": "kube-system", "team": "a"})
            ),
            Ok(false)
        );
        assert_eq!(selector_matches(None, &json!({})), Ok(true));
        let bad: LabelSelectorSpec =
            serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "Near"}]}))
                .unwrap();
        assert!(selector_matches(Some(&bad), &labels).is_err());
    }

    #[test]
    fn conditions_false_wins_over_errors() {
        let with = |exprs: &[&str]| {
            let conditions: Vec<Value> = exprs
                .iter()
                .enumerate()
                .map(|(i, e)| json!({"name": format!("c{i}"), "expression": e}))
                .collect();
            hook(
                json!({"name": "h", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {}, "matchConditions": conditions}),
            )
        };
        let obj = json!({"metadata": {"name": "p"}, "spec": {"priority": 0}});
        let req = json!({"operation": "CREATE", "userInfo": {"username": "u"}});
        let programs = Programs::default();
        let eval = |exprs: &[&str]| evaluate_conditions(&programs, &with(exprs), &obj, &req);
        assert_eq!(eval(&[]), Conditions::Call);
        assert_eq!(
            eval(&[
                "object.spec.priority == 0",
                "request.userInfo.username == 'u'"
            ]),
            Conditions::Call
        );
        assert_eq!(eval(&["object.nope.x", "false"]), Conditions::Skip);
        assert!(matches!(
            eval(&["object.nope.x", "true"]),
            Conditions::Error(_)
        ));
        assert!(matches!(
            eval(&["authorizer.group('').check('x')"]),
            Conditions::Error(_)
        ));
        assert!(matches!(eval(&["1 + 1"]), Conditions::Error(_)));
    }
}
