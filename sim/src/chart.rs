//! The cluster objects the Helm chart installs that the API server itself acts on:
//! the two PriorityClasses and the MutatingWebhookConfiguration, shaped as
//! `charts/gpu-booking/templates/{priorityclasses,mutatingwebhookconfiguration}.yaml`
//! render them with the release `gpu-booking` in namespace `gpu-booking`.
//!
//! Built in code (the container image is built without the chart), from a
//! [`ChartValues`] whose defaults are the chart's `values.yaml`; the test
//! `chart_defaults_match_values_yaml` reads the chart's files and fails when the two
//! drift apart.

use gpu_booking_core::admission::WEBHOOK_OPT_OUT_LABEL;
use serde_json::{json, Value};

/// What the API server does when the webhook cannot answer (`webhook.failurePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    Ignore,
    Fail,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Ignore => "Ignore",
            FailurePolicy::Fail => "Fail",
        }
    }
}

/// One PriorityClass (`priorityClasses.high` / `.low`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityClassValues {
    pub name: String,
    pub value: i32,
    /// `PreemptLowerPriority` or `Never`.
    pub preemption_policy: String,
}

/// The chart values the simulation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartValues {
    /// The release's namespace, where the webhook's Service lives.
    pub namespace: String,
    /// `<fullname>-webhook`: the Service and the configuration's name.
    pub webhook_name: String,
    pub service_port: u16,
    pub failure_policy: FailurePolicy,
    pub timeout_seconds: u32,
    /// `webhook.gpuResources` plus every `webhook.modelResources` value.
    pub gpu_resources: Vec<String>,
    pub exclude_namespaces: Vec<String>,
    /// `webhook.visibleDevicesWithoutGpu` is `strip`: pods that set
    /// `NVIDIA_VISIBLE_DEVICES` without a GPU reach the webhook too.
    pub strip_visible_devices: bool,
    pub opt_out_label: (String, String),
    pub high: PriorityClassValues,
    pub low: PriorityClassValues,
}

impl Default for ChartValues {
    fn default() -> Self {
        Self {
            namespace: "gpu-booking".into(),
            webhook_name: "gpu-booking-webhook".into(),
            service_port: 443,
            failure_policy: FailurePolicy::Ignore,
            timeout_seconds: 5,
            gpu_resources: vec!["nvidia.com/gpu".into()],
            exclude_namespaces: vec!["kube-system".into(), "gpu-operator".into()],
            opt_out_label: (WEBHOOK_OPT_OUT_LABEL.into(), "disabled".into()),
            strip_visible_devices: true,
            high: PriorityClassValues {
                name: "gpu-booking-high".into(),
                value: 1000,
                preemption_policy: "Never".into(),
            },
            low: PriorityClassValues {
                name: "gpu-booking-low".into(),
                value: -10,
                preemption_policy: "Never".into(),
            },
        }
    }
}

impl ChartValues {
    /// The PriorityClass objects (`scheduling.k8s.io/v1`).
    pub fn priority_classes(&self) -> Vec<Value> {
        [&self.high, &self.low]
            .into_iter()
            .map(|class| {
                json!({
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": class.name},
                    "value": class.value,
                    "globalDefault": false,
                    "preemptionPolicy": class.preemption_policy,
                })
            })
            .collect()
    }

    /// The chart's `matchConditions` expression: does any container or init container
    /// name one of the GPU resources in its requests or limits (or, with
    /// [`Self::strip_visible_devices`], set `NVIDIA_VISIBLE_DEVICES` to hand it cards)?
    pub fn match_condition(&self) -> String {
        let any_in = |field: &str| {
            self.gpu_resources
                .iter()
                .map(|r| format!("'{r}' in c.resources.{field}"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        let any = format!(
            "has(c.resources) && ((has(c.resources.requests) && ({})) || (has(c.resources.limits) && ({})))",
            any_in("requests"),
            any_in("limits")
        );
        let mut expression = format!(
            "object.spec.containers.exists(c, {any}) ||\n(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {any}))"
        );
        if self.strip_visible_devices {
            let visible = "has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES' && !(has(e.value) && e.value in ['none', 'void', '']))";
            expression.push_str(&format!(
                " ||\nobject.spec.containers.exists(c, {visible}) ||\n(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {visible}))"
            ));
        }
        expression
    }

    /// The MutatingWebhookConfiguration with `ca_bundle_pem` injected as
    /// `gpu-booking certs` injects it.
    pub fn webhook_configuration(&self, ca_bundle_pem: &str) -> Value {
        use base64::Engine as _;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_bundle_pem);
        let mut excluded = vec![self.namespace.clone()];
        for ns in &self.exclude_namespaces {
            if !excluded.contains(ns) {
                excluded.push(ns.clone());
            }
        }
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.webhook_name},
            "webhooks": [{
                "name": "pods.gpu-booking.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "service": {
                        "name": self.webhook_name,
                        "namespace": self.namespace,
                        "path": "/mutate",
                        "port": self.service_port,
                    },
                    "caBundle": ca_bundle,
                },
                "rules": [{
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }],
                "failurePolicy": self.failure_policy.as_str(),
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": self.timeout_seconds,
                "reinvocationPolicy": "Never",
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
                    {"key": self.opt_out_label.0, "operator": "NotIn", "values": [self.opt_out_label.1]},
                ]},
                "matchConditions": [{"name": "may-get-a-gpu", "expression": self.match_condition()}],
            }]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn chart_file(path: &str) -> String {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/gpu-booking")
            .join(path);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The `preemptionPolicy:` written in the PriorityClass template for `class`
    /// (`high` or `low`): a literal, or a reference to a value.
    fn template_policy(template: &str, values: &serde_yaml::Value, class: &str) -> String {
        let doc = template
            .split("---")
            .find(|d| d.contains(&format!("(list $ \"{class}\")")))
            .unwrap_or_else(|| panic!("no PriorityClass {class} in the template"));
        let line = doc
            .lines()
            .find_map(|l| l.trim().strip_prefix("preemptionPolicy:"))
            .unwrap_or_else(|| panic!("PriorityClass {class} sets no preemptionPolicy"))
            .trim()
            .to_owned();
        if line.contains("{{") {
            values["priorityClasses"][class]["preemptionPolicy"]
                .as_str()
                .unwrap_or_else(|| panic!("{line} names no value"))
                .to_owned()
        } else {
            line
        }
    }

    #[test]
    fn chart_defaults_match_values_yaml() {
        let values: serde_yaml::Value =
            serde_yaml::from_str(&chart_file("values.yaml")).expect("values.yaml is YAML");
        let ours = ChartValues::default();
        let w = &values["webhook"];
        assert_eq!(
            w["failurePolicy"].as_str(),
            Some(ours.failure_policy.as_str())
        );
        assert_eq!(
            w["timeoutSeconds"].as_u64(),
            Some(u64::from(ours.timeout_seconds))
        );
        assert_eq!(
            w["service"]["port"].as_u64(),
            Some(u64::from(ours.service_port))
        );
        let resources: Vec<String> = serde_yaml::from_value(w["gpuResources"].clone()).unwrap();
        assert_eq!(resources, ours.gpu_resources);
        let excluded: Vec<String> = serde_yaml::from_value(w["excludeNamespaces"].clone()).unwrap();
        assert_eq!(excluded, ours.exclude_namespaces);
        assert_eq!(
            w["optOutLabel"]["key"].as_str(),
            Some(&*ours.opt_out_label.0)
        );
        assert_eq!(
            w["optOutLabel"]["value"].as_str(),
            Some(&*ours.opt_out_label.1)
        );
        let template = chart_file("templates/priorityclasses.yaml");
        for (class, ours) in [("high", &ours.high), ("low", &ours.low)] {
            let v = &values["priorityClasses"][class];
            // Empty: the release's own, `<fullname>-<class>` (the lab's release is
            // `gpu-booking`, its fullname the same).
            let name = match v["name"].as_str() {
                Some("") | None => format!("{}-{class}", crate::rendered::RELEASE),
                Some(name) => name.to_owned(),
            };
            assert_eq!(name, ours.name, "{class} name");
            assert_eq!(
                v["value"].as_i64(),
                Some(i64::from(ours.value)),
                "{class} value"
            );
            assert_eq!(
                template_policy(&template, &values, class),
                ours.preemption_policy,
                "the chart's {class} PriorityClass has another preemptionPolicy than the simulation's"
            );
        }
    }

    #[test]
    fn match_condition_is_the_charts_expression() {
        // The expression as the chart's template writes it for the default values
        // (the two `celIn` helpers expanded), folded the way YAML's `>-` folds it.
        let template = chart_file("templates/mutatingwebhookconfiguration.yaml");
        assert!(template.contains("object.spec.containers.exists(c, {{ $any }}) ||"));
        assert!(template.contains(
            "(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $any }}))"
        ));
        assert!(template.contains("has(c.resources) && ((has(c.resources.requests) && (%s)) || (has(c.resources.limits) && (%s)))"));
        let ours = ChartValues::default().match_condition();
        assert!(ours.contains("'nvidia.com/gpu' in c.resources.requests"));
        assert!(ours.contains("'nvidia.com/gpu' in c.resources.limits"));
    }

    #[test]
    fn webhook_configuration_carries_the_ca_and_the_policy() {
        let values = ChartValues {
            failure_policy: FailurePolicy::Fail,
            ..ChartValues::default()
        };
        let mwc = values.webhook_configuration("PEM");
        let hook = &mwc["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(hook["clientConfig"]["service"]["namespace"], "gpu-booking");
        assert_eq!(
            hook["namespaceSelector"]["matchExpressions"][0]["values"],
            json!(["gpu-booking", "kube-system", "gpu-operator"])
        );
    }
}
