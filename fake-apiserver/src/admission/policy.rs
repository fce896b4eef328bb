//! ValidatingAdmissionPolicies ("Validating Admission Policy", GA in 1.30): the
//! stored `admissionregistration.k8s.io/v1` policies and their bindings, checked on
//! creates and updates after mutation, with the CEL interpreter of the webhooks'
//! matchConditions.
//!
//! - A policy applies when a binding names it (`policyName`) and its
//!   `matchConstraints.resourceRules` cover the request (operation, group, version,
//!   resource and subresource, as webhook rules match), and every `matchConditions`
//!   expression is true (a false one skips the policy; an error fails the request
//!   under `failurePolicy: Fail`, the default, and skips the policy under `Ignore`).
//! - `variables` are evaluated in order, each seeing those before it as
//!   `variables.<name>`; `validations` see `object`, `oldObject` (null on a create),
//!   `request` and `variables`.
//! - A validation that is false, with the binding's `validationActions` holding
//!   `Deny`, refuses the request as kube-apiserver does: 422 `Invalid`, `<resource>
//!   "<name>" is invalid: : ValidatingAdmissionPolicy '<policy>' with binding
//!   '<binding>' denied request: <message>` (the message, else `failed expression:
//!   <expression>`); with `Warn` it becomes a warning; `Audit` is not kept.
//!
//! Simplified: no `paramKind`/`paramRef`, no `namespaceSelector`/`objectSelector`
//! and no binding `matchResources` (a policy with any of them is applied as if they
//! matched everything), no `messageExpression` and no `authorizer` variable; deletes
//! and connects are not checked.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use serde_json::Value;

use super::matching::{execute, rule_matches, Programs};
use super::Attributes;
use crate::path::ResourceKey;
use crate::select::Selector;
use crate::status::ApiError;
use crate::store::Store;

const ADMISSION: &str = "/apis/admissionregistration.k8s.io/v1";

/// The policies that some binding names, with those bindings, read from the store.
#[derive(Default)]
pub(crate) struct Policies {
    bound: Vec<(Arc<Value>, Vec<Arc<Value>>)>,
}

impl Policies {
    pub fn of(store: &Store) -> Self {
        let all = Selector::default();
        let bindings = store.list(
            &ResourceKey::new(ADMISSION, "validatingadmissionpolicybindings"),
            None,
            &all,
        );
        let bound = store
            .list(
                &ResourceKey::new(ADMISSION, "validatingadmissionpolicies"),
                None,
                &all,
            )
            .into_iter()
            .map(|policy| {
                let named: Vec<Arc<Value>> = bindings
                    .iter()
                    .filter(|b| b.pointer("/spec/policyName") == policy.pointer("/metadata/name"))
                    .cloned()
                    .collect();
                (policy, named)
            })
            .filter(|(_, bindings)| !bindings.is_empty())
            .collect();
        Self { bound }
    }

    /// Checks `object` (and `old`, on an update) against every policy that applies;
    /// the warnings of `Warn` bindings, or the refusal.
    pub fn validate(
        &self,
        programs: &Programs,
        attrs: &Attributes,
        old: Option<&Value>,
        object: &Value,
    ) -> Result<Vec<String>, ApiError> {
        let mut warnings = Vec::new();
        for (policy, bindings) in &self.bound {
            let spec = &policy["spec"];
            if !matches_constraints(spec, attrs) {
                continue;
            }
            let fail = spec["failurePolicy"].as_str() != Some("Ignore");
            let mut context = cel::Context::default();
            context.add_variable_from_value("object", super::matching::to_cel(object));
            context.add_variable_from_value(
                "oldObject",
                old.map_or(cel::Value::Null, super::matching::to_cel),
            );
            context.add_variable_from_value(
                "request",
                super::matching::to_cel(&attrs.request(&super::review_uid())),
            );
            let outcome = evaluate(programs, spec, &mut context);
            let failed = match outcome {
                Ok(None) => continue,
                Ok(Some(failed)) => failed,
                Err(e) if fail => Some(e),
                Err(_) => continue,
            };
            let Some(message) = failed else { continue };
            let name = policy["metadata"]["name"].as_str().unwrap_or("");
            for binding in bindings {
                let text = format!(
                    "ValidatingAdmissionPolicy '{name}' with binding '{}' denied request: {message}",
                    binding["metadata"]["name"].as_str().unwrap_or("")
                );
                let actions = binding["spec"]["validationActions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if actions.iter().any(|a| a == "Deny") {
                    return Err(ApiError::invalid(
                        &attrs.resource,
                        &attrs.name,
                        format!(
                            "{} {:?} is invalid: : {text}",
                            attrs.group_resource(),
                            attrs.name
                        ),
                    ));
                }
                if actions.iter().any(|a| a == "Warn") {
                    warnings.push(text);
                }
            }
        }
        Ok(warnings)
    }
}

/// Whether the policy's `matchConstraints.resourceRules` cover the request.
fn matches_constraints(spec: &Value, attrs: &Attributes) -> bool {
    spec.pointer("/matchConstraints/resourceRules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|rule| serde_json::from_value::<RuleWithOperations>(rule.clone()).ok())
        .any(|rule| rule_matches(&rule, attrs))
}

/// Runs the policy's matchConditions, variables and validations: `Ok(None)` when a
/// condition is false (the policy does not apply), `Ok(Some(None))` when every
/// validation holds, `Ok(Some(Some(message)))` for the first that does not, `Err`
/// when an expression could not be evaluated.
fn evaluate(
    programs: &Programs,
    spec: &Value,
    context: &mut cel::Context<'_, '_>,
) -> Result<Option<Option<String>>, String> {
    let list = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
    for condition in list("matchConditions") {
        let expression = condition["expression"].as_str().unwrap_or("");
        match execute(programs, expression, context)? {
            cel::Value::Bool(true) => {}
            cel::Value::Bool(false) => return Ok(None),
            other => {
                return Err(format!(
                    "matchCondition {expression:?} evaluated to {other:?}"
                ))
            }
        }
    }
    let mut variables = std::collections::HashMap::new();
    for variable in list("variables") {
        let name = variable["name"].as_str().unwrap_or("").to_owned();
        let expression = variable["expression"].as_str().unwrap_or("");
        let value = execute(programs, expression, context)?;
        variables.insert(cel::objects::Key::String(Arc::new(name)), value);
        context.add_variable_from_value(
            "variables",
            cel::Value::Map(cel::objects::Map {
                map: Arc::new(variables.clone()),
            }),
        );
    }
    for validation in list("validations") {
        let expression = validation["expression"].as_str().unwrap_or("");
        match execute(programs, expression, context)? {
            cel::Value::Bool(true) => {}
            cel::Value::Bool(false) => {
                let message = validation["message"]
                    .as_str()
                    .map_or_else(|| format!("failed expression: {expression}"), str::to_owned);
                return Ok(Some(Some(message)));
            }
            other => return Err(format!("validation {expression:?} evaluated to {other:?}")),
        }
    }
    Ok(Some(None))
}
