//! Admission of GPU pods: what the webhook decides for a pod at creation, and the one
//! JSON Patch planner that writes the decision into the pod.
//!
//! The steps, each in exactly one place:
//!
//! 1. [`detect_gpu`] (`detect.rs`): does any container or init container ask for a GPU
//!    resource (`nvidia.com/gpu` or a configured per-model resource) above zero?
//!    Pods that do not are allowed unchanged, without asking anyone.
//! 2. [`trusted_identity`] (`trust.rs`, `identity.rs`): whose pod is it? Only pods
//!    that a trusted spawner created (the review's `userInfo`) in its namespaces have
//!    an identity: the raw `hub.jupyter.org/username` annotation when present, else
//!    the label of the same name (escape-decoded when it decodes, and looked up as a
//!    slug so that safe-scheme labels resolve too).
//! 3. [`what_to_ask`] says what the webhook asks the booking service (I/O, not here):
//!    the owner's bookings, only the free units (a pod without identity that may be
//!    lent: where the controller can take the card back, [`LendNamespaces`]), or
//!    nothing (a pod without identity that is stripped, or another workload); it
//!    hands the answer, the failure, or why nobody was asked to [`decide`]
//!    (`decision.rs`), which returns a [`Decision`].
//! 4. [`plan`] (`patch.rs`) turns the decision into a [`json_patch::Patch`] over the pod
//!    as it was sent. [`plan_cpu_only`] is the CPU-only step on its own, which the
//!    controller reuses to recreate a pod without its GPU.
//!
//! Everything here works on the pod as a `serde_json::Value`, because a webhook must
//! cope with every pod it is sent (including fields newer than our Kubernetes types),
//! and a patch must address the JSON the API server holds, not a re-serialisation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gpu_model::ModelName;
use crate::username::NameCase;

mod budget;
mod decision;
mod detect;
mod identity;
mod ledger;
mod lend_namespaces;
mod marks;
#[cfg(feature = "clap")]
mod options;
mod patch;
mod quantity;
pub mod replica;
mod trust;

pub use budget::{
    budget_names, budget_of, budget_resource, container_budget_mib, is_budget_resource,
    BudgetNameError,
};
pub use decision::{
    decide, what_to_ask, Ask, BeyondBooking, BookingErrorPolicy, Decision, Lookup, Schedulability,
    StripReason, UnidentifiedGpuPods, VisibleDevicesWithoutGpu, VISIBLE_DEVICES_STRIPPED,
};
pub use detect::{detect_gpu, GpuRequest};
pub use identity::{identify, named_user, Identity};
pub use ledger::LendLedger;
pub use lend_namespaces::{LendNamespaces, EVERY_NAMESPACE};
pub use marks::{
    is_harmless_key, is_our_key, pending_lent, trusted_priority, PendingLent, PodStanding,
    OUR_KEY_STEM, OUR_PREFIXES,
};
#[cfg(feature = "clap")]
pub use options::{AdmissionArgs, PriorityClassArgs};
pub use patch::{
    plan, plan_cpu_only, plan_cpu_only_because, plan_demoted, plan_no_gpu, plan_node_budgets,
    plan_node_resource, plan_owned,
};
pub use quantity::parse_quantity;
pub use replica::{AdmissionState, Replica};
pub use trust::{
    controller_copy, requested_by_controller, trusted_identity, SpawnerTrust, UserInfo,
};

/// Every label and annotation key of ours is `gpu-booking.io/<name>`, written here
/// and nowhere else (a literal elsewhere would drift from it).
macro_rules! our_key {
    ($name:literal) => {
        concat!("gpu-booking.io/", $name)
    };
}

/// The one domain of our label and annotation keys.
pub const KEY_DOMAIN: &str = our_key!("");
/// The prefix our labels had before they moved under [`KEY_DOMAIN`]. Pods created
/// before the upgrade carry it: readers accept it for one release
/// ([`LEGACY_LABELS`], [`our_label`]), nothing writes it, and the webhook strips it
/// from what a creator wrote like any key of ours ([`OUR_PREFIXES`]).
pub const LEGACY_LABEL_PREFIX: &str = "gpu-booking/";

/// Label: `high` for a pod of a booked user, `low` for a pod that got a free GPU without
/// a booking (the controller may preempt it for a booked user).
pub const PRIORITY_LABEL: &str = our_key!("priority");
/// Label: the id of the booking a high-priority pod runs under.
pub const BOOKING_LABEL: &str = our_key!("booking");
/// Label: the model a GPU pod was admitted on (so the controller can find low-priority
/// pods on the model a booked user needs without reading nodes).
pub const MODEL_LABEL: &str = our_key!("model");
/// Our labels and the key each had before the move to [`KEY_DOMAIN`]
/// (`gpu-booking/priority` and so on). Read for one release, never written.
pub const LEGACY_LABELS: [(&str, &str); 3] = [
    (PRIORITY_LABEL, "gpu-booking/priority"),
    (BOOKING_LABEL, "gpu-booking/booking"),
    (MODEL_LABEL, "gpu-booking/model"),
];
/// Annotation: the GPUs the booking of a high-priority pod is for; the controller
/// demotes a booking's pods beyond them (newest first).
pub const BOOKING_UNITS_ANNOTATION: &str = our_key!("booking-units");
/// Annotation: why the GPU was removed from a pod.
pub const GPU_REMOVED_ANNOTATION: &str = our_key!("gpu-removed");
/// Annotation: a pod's last GPU activity (RFC 3339), written by the node agent (its
/// `--last-activity-annotation` default) and read by the controller (least recently
/// used lent pods are preempted first).
pub const LAST_GPU_ACTIVITY_ANNOTATION: &str = our_key!("last-gpu-activity");
/// Annotation: how many preemption rounds the controller has run for a booked pod
/// that is still Pending (it gives up after its limit).
pub const PREEMPTION_ROUNDS_ANNOTATION: &str = our_key!("preemption-rounds");
/// Annotation on a lent pod chosen to give way to a booked one after a warning
/// (`--preemption-grace`): when it ends (RFC 3339). Written by the controller when it
/// chooses the pod, so that whichever replica leads ends it then, not before.
pub const PREEMPT_AT_ANNOTATION: &str = our_key!("preempt-at");
/// Annotation beside [`PREEMPT_AT_ANNOTATION`]: the booked pod (`namespace/name`) it
/// gives way to; the mark goes when that pod no longer waits.
pub const PREEMPT_FOR_ANNOTATION: &str = our_key!("preempt-for");
/// Annotation on a lent pod: the bookings (ids, comma-separated, newest last, at
/// most [`RESTART_TOLD_KEPT`]) whose start its user was told of, with the advice to
/// restart. Written by the controller before it tells, so that whichever replica
/// leads next neither tells again nor forgets that a course member told holds a
/// place on the course's session.
pub const RESTART_TOLD_ANNOTATION: &str = our_key!("restart-told");
/// The most bookings [`RESTART_TOLD_ANNOTATION`] names.
pub const RESTART_TOLD_KEPT: usize = 8;
/// Label of the controller's intent ConfigMaps (`copy` or `hub`): what it was about to
/// do when it deleted a pod, so that a successor finishes it.
pub const INTENT_LABEL: &str = our_key!("intent");
/// Namespace label: `disabled` opts a namespace out of the webhook (the chart's
/// default `webhook.optOutLabel`).
pub const WEBHOOK_OPT_OUT_LABEL: &str = our_key!("webhook");
/// Node label: memory per whole card in MiB as NVML reports it, when the node carries
/// it (written by a node agent, or by an admin on a node without GFD); preferred over
/// GFD's `nvidia.com/gpu.memory` for whole cards ([`crate::inventory`]).
pub const NVML_MEMORY_LABEL: &str = our_key!("gpu-memory-mib");

/// Our label `key` as `get` reads it from a pod's labels, else (pods created before
/// the upgrade) its legacy key in [`LEGACY_LABELS`]. Every reader of our labels goes
/// through here, so dropping the legacy keys is one change.
pub fn our_label<'a>(get: impl Fn(&str) -> Option<&'a str>, key: &str) -> Option<&'a str> {
    get(key).or_else(|| {
        LEGACY_LABELS
            .iter()
            .find(|(current, _)| *current == key)
            .and_then(|(_, legacy)| get(legacy))
    })
}

/// [`our_label`] of a pod as JSON (`/metadata/labels`).
pub fn pod_label<'a>(pod: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    let labels = pod.pointer("/metadata/labels");
    our_label(
        |k| {
            labels
                .and_then(|l| l.get(k))
                .and_then(serde_json::Value::as_str)
        },
        key,
    )
}

/// KubeSpawner's key, used both as an annotation (raw name) and as a label (slug).
pub const USERNAME_KEY: &str = "hub.jupyter.org/username";
/// The variable the NVIDIA container runtime reads; `none` hides every device.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// The default generic GPU resource of the NVIDIA device plugin.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The default extended resource that carries a pod's VRAM budget, in MiB.
pub const DEFAULT_GPUMEM_RESOURCE: &str = our_key!("gpumem");
/// The default annotation that tells the controller when to end a booked pod.
pub const DEFAULT_TERMINATE_AT_ANNOTATION: &str = "terminate-at";
/// The default node label that selects a model: the controller labels every GPU node
/// with the model its product name maps to.
pub const DEFAULT_MODEL_NODE_LABEL: &str = our_key!("model");
/// The default priority class of booked pods.
pub const DEFAULT_HIGH_PRIORITY_CLASS: &str = "gpu-booking-high";
/// The default priority class of pods that got a GPU without a booking.
pub const DEFAULT_LOW_PRIORITY_CLASS: &str = "gpu-booking-low";

/// How the webhook reads and writes pods; one value for the whole process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionConfig {
    /// Generic GPU resources (any model), e.g. `nvidia.com/gpu`.
    pub gpu_resources: Vec<String>,
    /// Per-model resources: resource name -> the model it names
    /// (`nvidia.com/a100` -> `a100`, `nvidia.com/mig-1g.5gb` -> `mig-1g.5gb`).
    pub model_resources: BTreeMap<String, ModelName>,
    /// The extended resource that carries the VRAM budget (MiB).
    pub gpumem_resource: String,
    /// VRAM budget per GPU unit when neither the booking service nor
    /// [`Self::model_gpumem_mib`] names one for the model; `None`: no budget.
    pub default_gpumem_mib: Option<u64>,
    /// VRAM budget per GPU unit for a model, used when the booking service does not
    /// declare one (and for pods that are not looked up).
    pub model_gpumem_mib: BTreeMap<ModelName, u64>,
    /// The annotation that carries a booked pod's end (RFC 3339, UTC).
    pub terminate_at_annotation: String,
    /// The node label whose value is a model name; used as the node selector.
    pub model_node_label: String,
    /// Priority class of booked pods; `None`: leave the class alone.
    pub high_priority_class: Option<String>,
    /// Priority class of lent (low-priority) pods; `None`: leave the class alone.
    pub low_priority_class: Option<String>,
    /// What to do when the booking service cannot answer.
    pub on_booking_error: BookingErrorPolicy,
    /// Who may vouch for a pod's user name (default: nobody).
    pub spawners: SpawnerTrust,
    /// How user names compare (JupyterHub lowercases by default).
    pub name_case: NameCase,
    /// What a GPU pod without a trusted identity gets.
    pub unidentified_gpu_pods: UnidentifiedGpuPods,
    /// Where such a pod may be lent a card (with [`UnidentifiedGpuPods::Lent`]): the
    /// namespaces in which the controller can take it back. Elsewhere it is another
    /// workload, admitted as its creator wrote it.
    #[serde(default)]
    pub lend_namespaces: LendNamespaces,
    /// User names (as the API server authenticates them) of the controller, e.g.
    /// `system:serviceaccount:gpu-booking:gpu-booking-controller`: its lent copies
    /// are admitted as it decided ([`controller_copy`]). Compared exactly.
    #[serde(default)]
    pub controllers: Vec<String>,
    /// What a pod that sets `NVIDIA_VISIBLE_DEVICES` without asking for a GPU gets.
    #[serde(default)]
    pub visible_devices_without_gpu: VisibleDevicesWithoutGpu,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            gpu_resources: vec![DEFAULT_GPU_RESOURCE.to_owned()],
            model_resources: BTreeMap::new(),
            gpumem_resource: DEFAULT_GPUMEM_RESOURCE.to_owned(),
            default_gpumem_mib: None,
            model_gpumem_mib: BTreeMap::new(),
            terminate_at_annotation: DEFAULT_TERMINATE_AT_ANNOTATION.to_owned(),
            model_node_label: DEFAULT_MODEL_NODE_LABEL.to_owned(),
            high_priority_class: Some(DEFAULT_HIGH_PRIORITY_CLASS.to_owned()),
            low_priority_class: Some(DEFAULT_LOW_PRIORITY_CLASS.to_owned()),
            on_booking_error: BookingErrorPolicy::Allow,
            spawners: SpawnerTrust::default(),
            name_case: NameCase::default(),
            unidentified_gpu_pods: UnidentifiedGpuPods::default(),
            lend_namespaces: LendNamespaces::default(),
            controllers: Vec::new(),
            visible_devices_without_gpu: VisibleDevicesWithoutGpu::default(),
        }
    }
}

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{what} {value:?} is not a qualified Kubernetes name ([prefix/]name)")]
    NotAQualifiedName { what: &'static str, value: String },
    #[error("the priority class {0:?} is not a valid object name")]
    BadPriorityClass(String),
    #[error("no GPU resource is configured")]
    NoGpuResource,
    #[error(transparent)]
    BudgetName(#[from] BudgetNameError),
    #[error("the lend namespace {0:?} is not a namespace name (nor * for every namespace)")]
    BadNamespace(String),
}

impl AdmissionConfig {
    /// Checks every key the planner writes, so that a typo fails at start-up instead of
    /// making every GPU pod invalid.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gpu_resources.is_empty() && self.model_resources.is_empty() {
            return Err(ConfigError::NoGpuResource);
        }
        let names = self
            .gpu_resources
            .iter()
            .map(|r| ("GPU resource", r))
            .chain(self.model_resources.keys().map(|r| ("model resource", r)))
            .chain([
                ("VRAM budget resource", &self.gpumem_resource),
                ("terminate-at annotation", &self.terminate_at_annotation),
                ("model node label", &self.model_node_label),
            ]);
        for (what, value) in names {
            if !is_qualified_name(value) {
                return Err(ConfigError::NotAQualifiedName {
                    what,
                    value: value.clone(),
                });
            }
        }
        for model in self.model_resources.values() {
            self.budget_resource_of(model)?;
        }
        if let Some(bad) = self.lend_namespaces.names().find(|ns| !is_dns_label(ns)) {
            return Err(ConfigError::BadNamespace(bad.to_owned()));
        }
        for class in [&self.high_priority_class, &self.low_priority_class]
            .into_iter()
            .flatten()
        {
            if !is_dns_subdomain(class) {
                return Err(ConfigError::BadPriorityClass(class.clone()));
            }
        }
        Ok(())
    }

    /// Every configured GPU resource name, generic then per-model: the names whose
    /// requests [`detect_gpu`] counts, for whoever must look for them elsewhere (the
    /// webhook's byte pre-filter, the controller's unschedulable pods).
    pub fn gpu_resource_names(&self) -> impl Iterator<Item = &String> {
        self.gpu_resources.iter().chain(self.model_resources.keys())
    }

    /// Whether `resource` is one of the configured GPU resources, and for a per-model
    /// resource, which model it names.
    pub fn gpu_resource_model(&self, resource: &str) -> Option<Option<&ModelName>> {
        if let Some(model) = self.model_resources.get(resource) {
            Some(Some(model))
        } else if self.gpu_resources.iter().any(|r| r == resource) {
            Some(None)
        } else {
            None
        }
    }

    /// The resource that names `model`, when it has one of its own (the first by
    /// name, should two name it): pods of the model then ask for it instead of a
    /// generic GPU, and need no node selector.
    pub fn resource_of(&self, model: &ModelName) -> Option<&str> {
        self.model_resources
            .iter()
            .find(|(_, m)| *m == model)
            .map(|(r, _)| r.as_str())
    }

    /// The resource that carries the VRAM budget of a pod on `model`:
    /// `<gpumem_resource>-<model>` when the model has a resource of its own (its
    /// pods ask for that resource, and may share a node with other models' cards),
    /// else the plain [`Self::gpumem_resource`] ([`budget_resource`]).
    pub fn budget_resource_of(&self, model: &ModelName) -> Result<String, BudgetNameError> {
        budget_resource(
            &self.gpumem_resource,
            self.resource_of(model).map(|_| model),
        )
    }

    /// The configured VRAM budget per unit of `model` (or the default).
    pub fn gpumem_for(&self, model: Option<&ModelName>) -> Option<u64> {
        model
            .and_then(|m| self.model_gpumem_mib.get(m).copied())
            .or(self.default_gpumem_mib)
    }
}

/// `[prefix/]name` as Kubernetes checks label, annotation and resource keys: the name
/// is 1..=63 of `[A-Za-z0-9._-]` starting and ending alphanumeric; the prefix a DNS
/// subdomain.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

/// A lowercase RFC 1123 label (a namespace's name): at most 63 characters, no dot.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(AdmissionConfig::default().validate(), Ok(()));
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "terminate-at",
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.5gb",
            "gpu-booking.io/gpumem",
        ] {
            assert!(is_qualified_name(ok), "{ok}");
        }
        for bad in ["", "a/", "/a", "Nvidia.com/gpu", "a b", "-x", "x/y/z"] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }

    #[test]
    fn bad_keys_are_refused() {
        let cfg = AdmissionConfig {
            terminate_at_annotation: "terminate at".into(),
            ..AdmissionConfig::default()
        };
        assert!(cfg.validate().is_err());
        let cfg = AdmissionConfig {
            high_priority_class: Some("High".into()),
            ..AdmissionConfig::default()
        };
        assert!(cfg.validate().is_err());
        for bad in ["Research", "a.b", "research team", &"n".repeat(64)] {
            let cfg = AdmissionConfig {
                lend_namespaces: LendNamespaces::from_names(["jhub", bad]).unwrap(),
                ..AdmissionConfig::default()
            };
            assert_eq!(
                cfg.validate(),
                Err(ConfigError::BadNamespace(bad.to_owned())),
                "{bad}"
            );
        }
        let cfg = AdmissionConfig {
            lend_namespaces: LendNamespaces::from_names(["jhub", "research-2"]).unwrap(),
            ..AdmissionConfig::default()
        };
        assert_eq!(cfg.validate(), Ok(()));
    }

    /// A model with a resource of its own has its budget under a resource of its own;
    /// one whose name makes that resource name too long refuses the configuration.
    #[test]
    fn a_model_with_its_own_resource_has_its_own_budget_resource() {
        let mut cfg = AdmissionConfig::default();
        let t4 = ModelName::parse("t4").unwrap();
        let a100 = ModelName::parse("a100").unwrap();
        cfg.model_resources
            .insert("nvidia.com/t4".into(), t4.clone());
        assert_eq!(
            cfg.budget_resource_of(&t4).unwrap(),
            "gpu-booking.io/gpumem-t4"
        );
        assert_eq!(
            cfg.budget_resource_of(&a100).unwrap(),
            "gpu-booking.io/gpumem"
        );
        assert_eq!(cfg.validate(), Ok(()));
        let long = ModelName::parse(&"m".repeat(60)).unwrap();
        cfg.model_resources.insert("example.com/long".into(), long);
        let err = cfg.validate().unwrap_err();
        assert!(matches!(err, ConfigError::BudgetName(_)), "{err}");
    }
}
