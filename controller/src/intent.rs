//! Intents: a two-step action (end a pod, then put its replacement in its place) is
//! recorded in the cluster before its first step, so that whichever replica leads next
//! finishes it if this one dies in between (SIGKILL, a lost node, a lost Lease).
//!
//! An intent is a ConfigMap labelled `gpu-booking.io/intent` in the controller's own
//! namespace (`--lease-namespace`), named after the original pod's uid, holding that
//! uid, the pod's namespace and name, and the replacement: the copy's manifest
//! (CPU-only or lent) or the JupyterHub server to start again. It lives in the
//! controller's namespace, not the pod's, because the controller creates the copy with
//! its own rights: in the pod's namespace anyone allowed to write ConfigMaps there
//! could forge an intent that ends someone's pod and creates a pod of their choosing.
//!
//! A finalizer on the pod would not do: a same-name copy cannot be created while the
//! original still exists, so the copy's manifest must be kept somewhere else anyway.
//! The steps themselves are `core::intent::next_step`; they are idempotent, and the
//! replacement is made exactly once (same name: AlreadyExists means done).

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::Value;

/// The label every intent carries (its value: the replacement's kind), defined in
/// core with every key of ours.
pub use gpu_booking_core::admission::INTENT_LABEL;
/// Intent names: this prefix and the original pod's uid.
const NAME_PREFIX: &str = "gpu-booking-intent-";
/// At most this many intents are read per sweep (the rest on the next one).
pub const MAX_PER_SWEEP: u32 = 500;

/// What takes the original pod's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replacement {
    /// The controller creates this pod (the CPU-only or the lent copy); `demoted`:
    /// the lent copy.
    Copy { pod: Value, demoted: bool },
    /// JupyterHub starts the user's server again (`--on-expiry hub-restart`).
    Hub { user: String, server: String },
}

/// One recorded two-step action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub namespace: String,
    pub pod: String,
    /// The original pod's uid: the only pod the first step may end.
    pub uid: String,
    /// The action that started it (`expire`, `preempt`, `scheduler_preempted`).
    pub action: String,
    /// Why, in words (Events and the audit log).
    pub reason: String,
    pub replacement: Replacement,
    /// When it was recorded (set on reading; `None` for one not stored yet).
    pub created: Option<DateTime<Utc>>,
}

impl Intent {
    fn object_name(&self) -> String {
        format!("{NAME_PREFIX}{}", self.uid)
    }

    /// The ConfigMap that records it, in `namespace`.
    pub fn to_config_map(&self, namespace: &str) -> ConfigMap {
        let kind = match &self.replacement {
            Replacement::Copy { .. } => "copy",
            Replacement::Hub { .. } => "hub",
        };
        let mut data = BTreeMap::from([
            ("namespace".to_owned(), self.namespace.clone()),
            ("pod".to_owned(), self.pod.clone()),
            ("uid".to_owned(), self.uid.clone()),
            ("action".to_owned(), self.action.clone()),
            ("reason".to_owned(), self.reason.clone()),
        ]);
        match &self.replacement {
            Replacement::Copy { pod, demoted } => {
                data.insert("copy".into(), pod.to_string());
                data.insert("demoted".into(), demoted.to_string());
            }
            Replacement::Hub { user, server } => {
                data.insert("user".into(), user.clone());
                data.insert("server".into(), server.clone());
            }
        }
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.object_name()),
                namespace: Some(namespace.to_owned()),
                labels: Some(BTreeMap::from([
                    (INTENT_LABEL.to_owned(), kind.to_owned()),
                    (
                        "app.kubernetes.io/managed-by".to_owned(),
                        "gpu-booking-controller".to_owned(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        }
    }

    /// Reads an intent back; an error names what is wrong with it.
    pub fn from_config_map(cm: &ConfigMap) -> Result<Self, String> {
        let empty = BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&empty);
        let field = |k: &str| {
            data.get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| format!("no {k}"))
        };
        let (namespace, pod, uid) = (field("namespace")?, field("pod")?, field("uid")?);
        let kind = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(INTENT_LABEL))
            .map(String::as_str);
        let replacement = match kind {
            Some("copy") => {
                let copy: Value = serde_json::from_str(&field("copy")?)
                    .map_err(|e| format!("the copy is not JSON: {e}"))?;
                // The copy replaces this pod and no other.
                let names = (
                    copy.pointer("/metadata/name").and_then(Value::as_str),
                    copy.pointer("/metadata/namespace").and_then(Value::as_str),
                );
                if names != (Some(pod.as_str()), Some(namespace.as_str())) || !copy.is_object() {
                    return Err("the copy is not the pod's namesake".into());
                }
                Replacement::Copy {
                    pod: copy,
                    demoted: data.get("demoted").is_some_and(|d| d == "true"),
                }
            }
            Some("hub") => Replacement::Hub {
                user: field("user")?,
                server: data.get("server").cloned().unwrap_or_default(),
            },
            other => return Err(format!("unknown kind {other:?}")),
        };
        Ok(Self {
            namespace,
            pod,
            uid,
            action: data.get("action").cloned().unwrap_or_default(),
            reason: data.get("reason").cloned().unwrap_or_default(),
            replacement,
            created: cm.metadata.creation_timestamp.as_ref().map(|t| t.0),
        })
    }

    /// `namespace/pod`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }

    /// When it was recorded, for logs.
    pub fn created_text(&self) -> String {
        self.created
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
            .unwrap_or_default()
    }
}

/// What went wrong writing or reading the recorded intents.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    #[error("recording the intent: {0}")]
    Record(kube::Error),
    #[error("removing the intent: {0}")]
    Forget(kube::Error),
    #[error("listing intents: {0}")]
    List(kube::Error),
    #[error("removing the intent {0}: {1}")]
    DropUnreadable(String, kube::Error),
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Records `intent` in `namespace`. Already recorded (a retry, or a previous leader):
/// fine, it is the same action on the same pod.
pub async fn record(
    client: &kube::Client,
    namespace: &str,
    intent: &Intent,
) -> Result<(), IntentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api
        .create(&PostParams::default(), &intent.to_config_map(namespace))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 409) => Ok(()),
        Err(e) => Err(IntentError::Record(e)),
    }
}

/// Removes the intent of the pod with `uid` (done, or given up).
pub async fn forget(client: &kube::Client, namespace: &str, uid: &str) -> Result<(), IntentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api
        .delete(&format!("{NAME_PREFIX}{uid}"), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 404) => Ok(()),
        Err(e) => Err(IntentError::Forget(e)),
    }
}

/// The recorded intents in `namespace` (at most [`MAX_PER_SWEEP`]); unreadable ones
/// as their name and what is wrong.
pub async fn list(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<Result<Intent, (String, String)>>, IntentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(INTENT_LABEL)
        .limit(MAX_PER_SWEEP);
    let found = api.list(&params).await.map_err(IntentError::List)?;
    Ok(found
        .items
        .iter()
        .map(|cm| {
            Intent::from_config_map(cm)
                .map_err(|why| (cm.metadata.name.clone().unwrap_or_default(), why))
        })
        .collect())
}

/// Removes an unreadable intent by its object name (nothing can finish it).
pub async fn drop_unreadable(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(), IntentError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 404) => Ok(()),
        Err(e) => Err(IntentError::DropUnreadable(name.to_owned(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn copy_intent() -> Intent {
        Intent {
            namespace: "jhub".into(),
            pod: "jupyter-a".into(),
            uid: "u-1".into(),
            action: "expire".into(),
            reason: "the booking ended".into(),
            replacement: Replacement::Copy {
                pod: json!({"metadata": {"name": "jupyter-a", "namespace": "jhub"}, "spec": {}}),
                demoted: true,
            },
            created: None,
        }
    }

    #[test]
    fn reads_back_what_it_writes() {
        for intent in [
            copy_intent(),
            Intent {
                replacement: Replacement::Hub {
                    user: "zoë@uni.example".into(),
                    server: String::new(),
                },
                ..copy_intent()
            },
        ] {
            let cm = intent.to_config_map("gpu-booking");
            assert_eq!(cm.metadata.name.as_deref(), Some("gpu-booking-intent-u-1"));
            assert_eq!(Intent::from_config_map(&cm), Ok(intent));
        }
    }

    #[test]
    fn refuses_a_copy_of_another_pod_and_bad_data() {
        let mut cm = copy_intent().to_config_map("gpu-booking");
        let mut refused = |change: &dyn Fn(&mut BTreeMap<String, String>)| {
            change(cm.data.as_mut().unwrap());
            assert!(Intent::from_config_map(&cm).is_err());
        };
        refused(&|d| {
            d.insert(
                "copy".into(),
                json!({"metadata": {"name": "other", "namespace": "jhub"}}).to_string(),
            );
        });
        refused(&|d| {
            d.insert("copy".into(), "{not json".into());
        });
        refused(&|d| {
            d.remove("uid");
        });
        let mut cm = copy_intent().to_config_map("gpu-booking");
        cm.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(INTENT_LABEL.into(), "other".into());
        assert!(Intent::from_config_map(&cm).is_err());
    }
}
