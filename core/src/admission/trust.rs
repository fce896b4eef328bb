//! Whose word counts: a pod's `hub.jupyter.org/username` annotation or label is only
//! believed when the spawner wrote it.
//!
//! Anyone who can create a pod can write any label or annotation, so the name in a pod
//! proves nothing by itself (a pod in any namespace with Alice's annotation would get
//! Alice's booking). The AdmissionReview says who asked the API server to create
//! the pod (`request.userInfo`, authenticated by the API server) and in which
//! namespace; JupyterHub's KubeSpawner creates pods as the hub's ServiceAccount
//! (`system:serviceaccount:<namespace>:hub` in zero-to-jupyterhub) in its own
//! namespace. Only such pods have an identity; every other GPU pod is an unidentified
//! pod, which [`super::UnidentifiedGpuPods`] lends (where the controller can take the
//! card back, [`super::LendNamespaces`]; elsewhere it is another workload, admitted
//! as written) or strips.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::identity::{identify, Identity};
use super::{pod_label, AdmissionConfig, Decision, GpuRequest, MODEL_LABEL, PRIORITY_LABEL};
use crate::gpu_model::ModelName;
use crate::username::NameCase;

/// Who may vouch for a pod's user name, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnerTrust {
    /// User names (as the API server authenticates them) of trusted spawners, e.g.
    /// `system:serviceaccount:jhub:hub`. Compared exactly.
    pub users: Vec<String>,
    /// Groups whose members are trusted spawners (e.g. a group that only the hub's
    /// identity is in). Compared exactly.
    pub groups: Vec<String>,
    /// Namespaces whose pods may have an identity; empty: any namespace.
    pub namespaces: Vec<String>,
}

/// The requester of an admission, as the review's `request.userInfo` names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: Option<String>,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// Reads `request.userInfo` leniently: a missing or odd field is simply absent
    /// (which trusts nobody), never an error.
    pub fn from_review(user_info: Option<&Value>) -> Self {
        let Some(info) = user_info else {
            return Self::default();
        };
        Self {
            username: info
                .get("username")
                .and_then(Value::as_str)
                .map(str::to_owned),
            groups: info
                .get("groups")
                .and_then(Value::as_array)
                .map(|groups| {
                    groups
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl SpawnerTrust {
    /// Whether a pod created by `requester` in `namespace` comes from a trusted spawner.
    /// Nobody is trusted when no spawner is configured, and a request without a
    /// namespace is trusted only when the namespaces are not restricted.
    pub fn trusts(&self, requester: &UserInfo, namespace: Option<&str>) -> bool {
        let by_name = requester
            .username
            .as_deref()
            .is_some_and(|name| self.users.iter().any(|u| u == name));
        let by_group = requester
            .groups
            .iter()
            .any(|g| self.groups.iter().any(|trusted| trusted == g));
        let namespace_ok = self.namespaces.is_empty()
            || namespace.is_some_and(|ns| self.namespaces.iter().any(|n| n == ns));
        (by_name || by_group) && namespace_ok
    }

    /// Whether any spawner is trusted at all (else no pod has an identity).
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.groups.is_empty()
    }
}

/// The identity of a pod that `requester` asks to create in `namespace`: what the pod
/// says ([`identify`]) when a trusted spawner created it, `None` otherwise.
pub fn trusted_identity(
    trust: &SpawnerTrust,
    requester: &UserInfo,
    namespace: Option<&str>,
    pod: &Value,
    case: NameCase,
) -> Option<Identity> {
    if trust.trusts(requester, namespace) {
        identify(pod, case)
    } else {
        None
    }
}

/// Whether the requester of an admission (`userInfo`, authenticated by the API
/// server) is the controller: one of `cfg.controllers`, compared exactly.
pub fn requested_by_controller(requester: &UserInfo, cfg: &AdmissionConfig) -> bool {
    requester
        .username
        .as_deref()
        .is_some_and(|name| cfg.controllers.iter().any(|c| c == name))
}

/// The decision for a GPU pod that the controller itself creates in place of one it
/// ended: its lent copy (`--on-expiry demote`, or a booked pod beyond its booking's
/// units), which carries `gpu-booking.io/priority=low` and `gpu-booking.io/model`. Such a
/// copy takes over the unit its original held, which the controller saw in the
/// cluster; the booking service's free count may still count the original (a usage
/// report not yet sent, e.g. while a new leader takes over), and the webhook's
/// ledger may count its admission too, so deciding the copy from them can strip it
/// ("no free GPU") though its card is about to be free. It is admitted as the
/// controller decided: lent, on its model.
///
/// Believed only when the requester (`userInfo`, authenticated by the API server) is
/// one of `cfg.controllers` ([`requested_by_controller`]): marks in a pod prove nothing by
/// themselves, since whoever creates a pod can write them. A copy is never
/// booked (`high` is not believed from anyone), and a pod that asks by resource for
/// another model than its label names goes the ordinary way. `None`: decide it as
/// any other pod.
pub fn controller_copy(
    requester: &UserInfo,
    pod: &Value,
    gpu: &GpuRequest,
    cfg: &AdmissionConfig,
) -> Option<Decision> {
    if !requested_by_controller(requester, cfg) {
        return None;
    }
    // A copy made by the controller of the last release carries the legacy keys.
    if pod_label(pod, PRIORITY_LABEL) != Some("low") {
        return None;
    }
    let model = ModelName::parse(pod_label(pod, MODEL_LABEL)?).ok()?;
    if gpu.models.iter().any(|asked| *asked != model) {
        return None;
    }
    Some(Decision::LowPriority {
        model,
        gpumem_mib: None,
        beyond_booking: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::USERNAME_KEY;
    use serde_json::json;

    const HUB: &str = "system:serviceaccount:jhub:hub";

    fn trust() -> SpawnerTrust {
        SpawnerTrust {
            users: vec![HUB.into()],
            groups: vec!["jupyterhub-spawners".into()],
            namespaces: vec!["jhub".into()],
        }
    }

    fn by(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo::from_review(Some(&json!({"username": name, "groups": groups})))
    }

    fn alice_pod() -> Value {
        json!({"metadata": {
            "annotations": {USERNAME_KEY: "alice@example.com"},
            "labels": {USERNAME_KEY: "alice-example-com---ff8d9819"},
        }})
    }

    #[test]
    fn trust_table() {
        let t = trust();
        let cases = [
            // (requester, groups, namespace, trusted?)
            (HUB, vec![], Some("jhub"), true),
            // Another ServiceAccount in the right namespace.
            (
                "system:serviceaccount:jhub:default",
                vec![],
                Some("jhub"),
                false,
            ),
            // The right ServiceAccount name, another namespace's account.
            (
                "system:serviceaccount:other:hub",
                vec![],
                Some("jhub"),
                false,
            ),
            // The right account, but the pod goes elsewhere.
            (HUB, vec![], Some("other"), false),
            (HUB, vec![], None, false),
            // A person, whatever groups they say they are in but the trusted one.
            (
                "alice@example.com",
                vec!["system:authenticated"],
                Some("jhub"),
                false,
            ),
            // Member of a trusted group.
            ("someone", vec!["jupyterhub-spawners"], Some("jhub"), true),
            // Names are exact: no prefix, no case folding.
            (
                "system:serviceaccount:jhub:hub2",
                vec![],
                Some("jhub"),
                false,
            ),
            (
                "SYSTEM:SERVICEACCOUNT:JHUB:HUB",
                vec![],
                Some("jhub"),
                false,
            ),
            ("", vec![], Some("jhub"), false),
        ];
        for (name, groups, ns, expected) in cases {
            assert_eq!(
                t.trusts(&by(name, &groups), ns),
                expected,
                "{name} {groups:?} in {ns:?}"
            );
        }
    }

    #[test]
    fn unrestricted_namespaces_and_nobody_configured() {
        let t = SpawnerTrust {
            namespaces: vec![],
            ..trust()
        };
        assert!(t.trusts(&by(HUB, &[]), Some("anywhere")));
        assert!(t.trusts(&by(HUB, &[]), None));
        let nobody = SpawnerTrust::default();
        assert!(nobody.is_empty());
        assert!(!nobody.trusts(&by(HUB, &[]), Some("jhub")));
    }

    #[test]
    fn odd_user_info_trusts_nobody() {
        let t = trust();
        for info in [
            json!(null),
            json!(7),
            json!({"username": 7}),
            json!({"groups": "jupyterhub-spawners"}),
            json!({"username": null, "groups": [1, null]}),
        ] {
            assert!(
                !t.trusts(&UserInfo::from_review(Some(&info)), Some("jhub")),
                "{info}"
            );
        }
        assert!(!t.trusts(&UserInfo::from_review(None), Some("jhub")));
    }

    #[test]
    fn identity_only_from_the_trusted_spawner() {
        let t = trust();
        let pod = alice_pod();
        let id = trusted_identity(&t, &by(HUB, &[]), Some("jhub"), &pod, NameCase::Lowercase);
        assert_eq!(
            id.map(|i| i.describe()),
            Some("user alice@example.com".into())
        );
        for (who, ns) in [
            ("system:serviceaccount:jhub:default", "jhub"),
            (HUB, "elsewhere"),
            ("mallory", "jhub"),
        ] {
            assert_eq!(
                trusted_identity(&t, &by(who, &[]), Some(ns), &pod, NameCase::Lowercase),
                None,
                "{who} in {ns}"
            );
        }
    }

    const CONTROLLER: &str = "system:serviceaccount:gpu-booking:gpu-booking-controller";

    fn copy_cfg() -> AdmissionConfig {
        AdmissionConfig {
            controllers: vec![CONTROLLER.into()],
            ..AdmissionConfig::default()
        }
    }

    fn copy_pod(priority: Option<&str>, model: Option<&str>) -> Value {
        let mut labels = serde_json::Map::new();
        if let Some(p) = priority {
            labels.insert(PRIORITY_LABEL.into(), json!(p));
        }
        if let Some(m) = model {
            labels.insert(MODEL_LABEL.into(), json!(m));
        }
        json!({"metadata": {"labels": labels, "annotations": {USERNAME_KEY: "ada@example.com"}}})
    }

    fn asks(models: &[&str]) -> GpuRequest {
        GpuRequest {
            units: 1,
            models: models
                .iter()
                .map(|m| ModelName::parse(m).unwrap())
                .collect(),
        }
    }

    #[test]
    fn the_controllers_lent_copy_is_admitted_as_decided() {
        let cfg = copy_cfg();
        let decision = controller_copy(
            &by(CONTROLLER, &[]),
            &copy_pod(Some("low"), Some("a100")),
            &asks(&[]),
            &cfg,
        );
        assert_eq!(
            decision,
            Some(Decision::LowPriority {
                model: ModelName::parse("a100").unwrap(),
                gpumem_mib: None,
                beyond_booking: None,
            })
        );
        // By resource name, the same model.
        assert!(controller_copy(
            &by(CONTROLLER, &[]),
            &copy_pod(Some("low"), Some("a100")),
            &asks(&["a100"]),
            &cfg
        )
        .is_some());
        // A copy made by the controller of the last release, under the legacy keys.
        let legacy = json!({"metadata": {"labels": {
            "gpu-booking/priority": "low", "gpu-booking/model": "a100"}}});
        assert_eq!(
            controller_copy(&by(CONTROLLER, &[]), &legacy, &asks(&[]), &cfg),
            decision
        );
    }

    #[test]
    fn only_the_controller_and_only_its_lent_copies() {
        let cfg = copy_cfg();
        let lent = copy_pod(Some("low"), Some("a100"));
        // Anyone else, whatever the pod says: the hub, a user, a look-alike name,
        // a group that the controller's account is in.
        for who in [
            HUB,
            "mallory",
            "system:serviceaccount:gpu-booking:gpu-booking-controller2",
            "SYSTEM:SERVICEACCOUNT:GPU-BOOKING:GPU-BOOKING-CONTROLLER",
            "",
        ] {
            assert_eq!(
                controller_copy(
                    &by(who, &["system:serviceaccounts"]),
                    &lent,
                    &asks(&[]),
                    &cfg
                ),
                None,
                "{who}"
            );
        }
        assert_eq!(
            controller_copy(&UserInfo::default(), &lent, &asks(&[]), &cfg),
            None
        );
        // No controller configured: nobody.
        assert_eq!(
            controller_copy(
                &by(CONTROLLER, &[]),
                &lent,
                &asks(&[]),
                &AdmissionConfig::default()
            ),
            None
        );
        // The controller's pods that are not lent copies go the ordinary way.
        for pod in [
            copy_pod(Some("high"), Some("a100")),
            copy_pod(None, Some("a100")),
            copy_pod(Some("low"), None),
            copy_pod(Some("low"), Some("Not A Model")),
            json!({}),
            json!([1]),
        ] {
            assert_eq!(
                controller_copy(&by(CONTROLLER, &[]), &pod, &asks(&[]), &cfg),
                None,
                "{pod}"
            );
        }
        // A pod asking by resource for another model than its label.
        assert_eq!(
            controller_copy(&by(CONTROLLER, &[]), &lent, &asks(&["a6000"]), &cfg),
            None
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever the pod says and whoever asks: a copy is only ever lent (never
            /// booked), only on the model its label names, and only when the
            /// requester is the configured controller, by exact name.
            #[test]
            fn copies_are_lent_and_only_the_controllers(
                who in prop_oneof![Just(CONTROLLER.to_owned()), Just(HUB.to_owned()), ".{0,40}"],
                priority in proptest::option::of(prop_oneof![Just("low".to_owned()), Just("high".to_owned()), ".{0,8}"]),
                model in proptest::option::of(prop_oneof![Just("a100".to_owned()), "[a-z0-9.-]{0,12}", ".{0,12}"]),
                asked in proptest::collection::vec(prop_oneof![Just("a100"), Just("a6000")], 0..3),
            ) {
                let cfg = copy_cfg();
                let pod = copy_pod(priority.as_deref(), model.as_deref());
                let decision = controller_copy(&by(&who, &[]), &pod, &asks(&asked), &cfg);
                if let Some(decision) = decision {
                    prop_assert_eq!(who.as_str(), CONTROLLER);
                    prop_assert_eq!(priority.as_deref(), Some("low"));
                    match decision {
                        Decision::LowPriority { model: m, beyond_booking: None, .. } => {
                            prop_assert_eq!(Some(m.as_str()), model.as_deref());
                            prop_assert!(asked.iter().all(|a| *a == m.as_str()));
                        }
                        other => prop_assert!(false, "not lent: {:?}", other),
                    }
                } else {
                    let valid = model.as_deref().is_some_and(|m| ModelName::parse(m).is_ok());
                    let same = asked.iter().all(|a| Some(*a) == model.as_deref());
                    prop_assert!(
                        who != CONTROLLER || priority.as_deref() != Some("low") || !valid || !same
                    );
                }
            }
        }
    }
}
