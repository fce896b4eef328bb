//! GPU models declared in the Helm values: which of them the booking
//! service writes when it starts, so that `helm install`/`helm upgrade` reconcile them
//! (GitOps) while the admin API keeps working. The values say who wins:
//!
//! - [`Authority::Values`]: the values are the truth for the models they name: a model
//!   that differs (units, patterns, budget, resource, order) is written back to the
//!   values' version at the next start (an upgrade), whatever an admin changed;
//! - [`Authority::Api`]: the values only seed: a declared model is created when
//!   missing and never changed afterwards (the admin API owns it).
//!
//! Models the values do not name are never touched, in either mode: deleting is an
//! admin's act, not a side effect of a values file.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::gpu_model::{ModelName, ModelPattern};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Authority {
    Values,
    Api,
}

/// A model as the values declare it and as the service stores it (the fields the
/// values own).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeclaredModel {
    pub name: String,
    pub units: i32,
    #[serde(default)]
    pub patterns: Vec<String>,
    #[serde(default)]
    pub gpumem_mib: i32,
    #[serde(default)]
    pub resource: Option<String>,
    /// Matching order; the values' list order (set by [`parse`]).
    #[serde(skip)]
    pub position: i32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeclaredModelsError {
    #[error("models file: {0}")]
    Syntax(String),
    #[error("model {0:?} is declared twice")]
    Duplicate(String),
    #[error("model {name:?}: {why}")]
    Invalid { name: String, why: String },
}

/// Largest values the admin API accepts too.
pub const MAX_UNITS: i32 = 100_000;
pub const MAX_PATTERNS: usize = 64;

/// Checks one model's fields as the admin API does (one rule for both).
pub fn check_model(
    name: &str,
    units: i32,
    patterns: &[String],
    gpumem_mib: i32,
    resource: Option<&str>,
) -> Result<ModelName, String> {
    let name = ModelName::parse(name).map_err(|e| e.to_string())?;
    if !(0..=MAX_UNITS).contains(&units) {
        return Err(format!("units must be between 0 and {MAX_UNITS}"));
    }
    if gpumem_mib < 0 {
        return Err("gpumem_mib must not be negative".into());
    }
    if patterns.len() > MAX_PATTERNS {
        return Err(format!("at most {MAX_PATTERNS} patterns"));
    }
    for p in patterns {
        ModelPattern::parse(p).map_err(|e| format!("pattern {p:?}: {e}"))?;
    }
    if let Some(r) = resource {
        if r.is_empty() || r.len() > 253 || r.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err("resource must be an extended resource name".into());
        }
    }
    Ok(name)
}

/// Parses the chart's models file (a JSON list), checking every model and giving each
/// its list position.
pub fn parse(json: &str) -> Result<Vec<DeclaredModel>, DeclaredModelsError> {
    let mut models: Vec<DeclaredModel> =
        serde_json::from_str(json).map_err(|e| DeclaredModelsError::Syntax(e.to_string()))?;
    let mut seen = BTreeSet::new();
    for (i, m) in models.iter_mut().enumerate() {
        check_model(
            &m.name,
            m.units,
            &m.patterns,
            m.gpumem_mib,
            m.resource.as_deref(),
        )
        .map_err(|why| DeclaredModelsError::Invalid {
            name: m.name.clone(),
            why,
        })?;
        if !seen.insert(m.name.clone()) {
            return Err(DeclaredModelsError::Duplicate(m.name.clone()));
        }
        m.position = i32::try_from(i).unwrap_or(i32::MAX);
    }
    Ok(models)
}

/// The declared models to write, given what is stored (by name).
pub fn to_write<'a>(
    declared: &'a [DeclaredModel],
    stored: &BTreeMap<String, DeclaredModel>,
    authority: Authority,
) -> Vec<&'a DeclaredModel> {
    declared
        .iter()
        .filter(|d| match (stored.get(&d.name), authority) {
            (None, _) => true,
            (Some(_), Authority::Api) => false,
            (Some(s), Authority::Values) => s != *d,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"[
        {"name": "a100", "units": 2, "patterns": ["*A100*"], "gpumemMib": 40960},
        {"name": "a6000", "units": 4, "patterns": ["NVIDIA-RTX-A6000"], "resource": "nvidia.com/a6000"}
    ]"#;

    fn stored(models: &[DeclaredModel]) -> BTreeMap<String, DeclaredModel> {
        models.iter().map(|m| (m.name.clone(), m.clone())).collect()
    }

    #[test]
    fn parses_in_order() {
        let models = parse(FILE).unwrap();
        assert_eq!(models[0].name, "a100");
        assert_eq!(models[0].gpumem_mib, 40960);
        assert_eq!((models[0].position, models[1].position), (0, 1));
        assert_eq!(models[1].resource.as_deref(), Some("nvidia.com/a6000"));
    }

    #[test]
    fn refuses_bad_files() {
        assert!(matches!(parse("{"), Err(DeclaredModelsError::Syntax(_))));
        assert!(matches!(
            parse(r#"[{"name": "a", "units": 1, "colour": "red"}]"#),
            Err(DeclaredModelsError::Syntax(_))
        ));
        assert!(matches!(
            parse(r#"[{"name": "a", "units": -1}]"#),
            Err(DeclaredModelsError::Invalid { .. })
        ));
        assert!(matches!(
            parse(r#"[{"name": "A B", "units": 1}]"#),
            Err(DeclaredModelsError::Invalid { .. })
        ));
        assert_eq!(
            parse(r#"[{"name": "a", "units": 1}, {"name": "a", "units": 2}]"#),
            Err(DeclaredModelsError::Duplicate("a".into()))
        );
    }

    #[test]
    fn values_win_over_an_admins_change_and_api_keeps_it() {
        let declared = parse(FILE).unwrap();
        assert_eq!(
            to_write(&declared, &BTreeMap::new(), Authority::Api).len(),
            2
        );
        assert!(to_write(&declared, &stored(&declared), Authority::Values).is_empty());
        let mut edited = declared.clone();
        edited[0].units = 3;
        let stored = stored(&edited);
        let written: Vec<_> = to_write(&declared, &stored, Authority::Values)
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(written, ["a100"]);
        assert!(to_write(&declared, &stored, Authority::Api).is_empty());
    }
}
