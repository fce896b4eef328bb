//! The extended resources that carry a pod's VRAM budget (MiB), named here and nowhere
//! else: the webhook writes them on pods, the controller advertises them on nodes and
//! counts them in its victims' room, the node agent reads them as a pod's budget.
//!
//! - The plain `--gpumem-resource` (`gpu-booking.io/gpumem`) carries the budget of the
//!   cards that a node label selects (the generic `nvidia.com/gpu` ones).
//! - `<gpumem-resource>-<model>` (`gpu-booking.io/gpumem-t4`) carries the budget of the
//!   cards of a model under a resource of its own (`nvidia.com/t4`, a MIG profile's):
//!   kube-scheduler fits every extended resource per node on its own ("Managing
//!   Resources for Containers"), so on a node with cards of several models a model's
//!   pods can take only what that model's cards hold, never another model's memory.
//!
//! A model name is a lowercase RFC 1123 label of at most 63 characters
//! ([`ModelName`]), so `<gpumem-resource>-<model>` is a valid resource name but for
//! its length: a name part over 63 characters. Such a model gets no budget resource
//! ([`BudgetNameError`]): the controller advertises none and the webhook writes none,
//! and the webhook refuses to start with one configured ([`super::AdmissionConfig::validate`]).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{is_qualified_name, parse_quantity};
use crate::gpu_model::ModelName;

/// A model whose budget resource would not be a valid resource name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "model {model}: its VRAM budget resource {resource:?} is not a valid resource name \
     (the part after the '/' is longer than 63 characters); its pods get no VRAM budget"
)]
pub struct BudgetNameError {
    pub model: ModelName,
    pub resource: String,
}

/// The resource that carries the budget of `of`'s cards: the plain `gpumem` for the
/// cards a label selects (`None`), `<gpumem>-<model>` for a model's own resource.
pub fn budget_resource(gpumem: &str, of: Option<&ModelName>) -> Result<String, BudgetNameError> {
    let Some(model) = of else {
        return Ok(gpumem.to_owned());
    };
    let resource = format!("{gpumem}-{model}");
    if is_qualified_name(&resource) {
        Ok(resource)
    } else {
        Err(BudgetNameError {
            model: model.clone(),
            resource,
        })
    }
}

/// Whose budget `resource` carries ([`budget_resource`] read back): `Some(None)` the
/// plain one's, `Some(Some(model))` a model's; `None` for any other resource, and for a
/// `<gpumem>-<suffix>` whose suffix is no model name.
pub fn budget_of(gpumem: &str, resource: &str) -> Option<Option<ModelName>> {
    if resource == gpumem {
        return Some(None);
    }
    let suffix = resource.strip_prefix(gpumem)?.strip_prefix('-')?;
    ModelName::parse(suffix).ok().map(Some)
}

/// Whether `resource` is a budget resource: the plain one or any `<gpumem>-<suffix>`
/// (whatever the suffix, so that a budget nobody can name still goes with the GPU and
/// off a node).
pub fn is_budget_resource(gpumem: &str, resource: &str) -> bool {
    resource == gpumem
        || resource
            .strip_prefix(gpumem)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|suffix| !suffix.is_empty())
}

/// Budgets by whose they are, as resource names; the models whose budget cannot be
/// named are left out and returned apart.
pub fn budget_names(
    gpumem: &str,
    budgets: &BTreeMap<Option<ModelName>, u64>,
) -> (BTreeMap<String, u64>, Vec<BudgetNameError>) {
    let mut names = BTreeMap::new();
    let mut unnamed = Vec::new();
    for (of, &mib) in budgets {
        match budget_resource(gpumem, of.as_ref()) {
            Ok(name) => {
                names.insert(name, mib);
            }
            Err(e) => unnamed.push(e),
        }
    }
    (names, unnamed)
}

/// A container's budget in MiB from its `resources` (JSON): every budget resource it
/// names, each its limit, else its request (limits win, as the planner writes them
/// equal), summed and rounded up; `None` when it names none that reads as a quantity
/// of at least zero.
pub fn container_budget_mib(resources: &Value, gpumem: &str) -> Option<u64> {
    let section = |name: &str| resources.get(name).and_then(Value::as_object);
    let mut keys: Vec<&String> = ["limits", "requests"]
        .into_iter()
        .filter_map(section)
        .flat_map(|m| m.keys())
        .filter(|k| is_budget_resource(gpumem, k))
        .collect();
    keys.sort();
    keys.dedup();
    let mut total: Option<u64> = None;
    for key in keys {
        let value = section("limits")
            .and_then(|m| m.get(key))
            .filter(|v| !v.is_null())
            .or_else(|| section("requests").and_then(|m| m.get(key)));
        let Some(mib) = value
            .and_then(parse_quantity)
            .filter(|q| q.is_finite() && *q >= 0.0)
        else {
            continue;
        };
        let mib = mib.ceil().min(u64::MAX as f64) as u64;
        total = Some(total.unwrap_or(0).saturating_add(mib));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GPUMEM: &str = "gpu-booking.io/gpumem";

    fn model(name: &str) -> ModelName {
        ModelName::parse(name).unwrap()
    }

    #[test]
    fn names_and_their_reading_back() {
        assert_eq!(budget_resource(GPUMEM, None).unwrap(), GPUMEM);
        for name in ["t4", "mig-1g.5gb", "a100"] {
            let resource = budget_resource(GPUMEM, Some(&model(name))).unwrap();
            assert_eq!(resource, format!("{GPUMEM}-{name}"));
            assert!(is_qualified_name(&resource), "{resource}");
            assert_eq!(budget_of(GPUMEM, &resource), Some(Some(model(name))));
            assert!(is_budget_resource(GPUMEM, &resource));
        }
        assert_eq!(budget_of(GPUMEM, GPUMEM), Some(None));
        for other in [
            "nvidia.com/gpu",
            "gpu-booking.io/gpumemx",
            "gpu-booking.io/gpumem-",
            "gpu-booking.io/gpu",
        ] {
            assert_eq!(budget_of(GPUMEM, other), None, "{other}");
            assert!(!is_budget_resource(GPUMEM, other), "{other}");
        }
        // Not a model name, still a budget resource (stripped, removed from nodes).
        assert_eq!(budget_of(GPUMEM, "gpu-booking.io/gpumem-T4"), None);
        assert!(is_budget_resource(GPUMEM, "gpu-booking.io/gpumem-T4"));
    }

    #[test]
    fn a_model_too_long_for_a_resource_name_has_no_budget_resource() {
        // 56 characters fit beside `gpumem-` (63 in all), 57 do not.
        let fits = model(&"a".repeat(56));
        assert!(budget_resource(GPUMEM, Some(&fits)).is_ok());
        let long = model(&"a".repeat(57));
        let err = budget_resource(GPUMEM, Some(&long)).unwrap_err();
        assert_eq!(err.model, long);
        assert!(err.to_string().contains("longer than 63"), "{err}");
        let budgets = [(None, 100), (Some(model("t4")), 14848), (Some(long), 1)]
            .into_iter()
            .collect();
        let (names, unnamed) = budget_names(GPUMEM, &budgets);
        assert_eq!(
            names,
            [(GPUMEM.to_owned(), 100), (format!("{GPUMEM}-t4"), 14848)]
                .into_iter()
                .collect()
        );
        assert_eq!(unnamed.len(), 1);
    }

    #[test]
    fn a_containers_budget_sums_its_budget_resources_limits_first() {
        let res = json!({
            "limits": {"gpu-booking.io/gpumem": "8192", "nvidia.com/gpu": "1"},
            "requests": {"gpu-booking.io/gpumem": "4096", "gpu-booking.io/gpumem-t4": "1000.5",
                         "memory": "1Gi"}});
        assert_eq!(container_budget_mib(&res, GPUMEM), Some(8192 + 1001));
        assert_eq!(
            container_budget_mib(&json!({"limits": {"cpu": "1"}}), GPUMEM),
            None
        );
        assert_eq!(
            container_budget_mib(
                &json!({"limits": {"gpu-booking.io/gpumem-t4": "lots"}}),
                GPUMEM
            ),
            None,
            "not a quantity"
        );
        assert_eq!(container_budget_mib(&Value::Null, GPUMEM), None);
    }
}
