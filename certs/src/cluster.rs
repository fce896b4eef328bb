//! The Kubernetes objects the bootstrap reads and writes: its Secrets and the webhook
//! configuration's `caBundle`. Writes are conditional (create, or replace at the
//! resourceVersion that was read), so two runs at once (the hook Job and the CronJob)
//! cannot overwrite each other: the loser gets [`Error::Conflict`] and starts over.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

use crate::error::Error;
use crate::pki::Pair;

/// The field manager named in our writes (shows in `managedFields`).
pub const MANAGER: &str = "gpu-booking-certs";

/// Keys of a TLS Secret, as cert-manager and `kubectl create secret tls` write them.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";

/// A Secret as read: its PEM entries and the version to write against.
#[derive(Debug, Clone, Default)]
pub struct StoredSecret {
    pub exists: bool,
    pub resource_version: Option<String>,
    pub data: BTreeMap<String, String>,
}

impl StoredSecret {
    /// The certificate and key, when both are there.
    pub fn pair(&self) -> Option<Pair> {
        Some(Pair {
            cert_pem: self.data.get(TLS_CRT)?.clone(),
            key_pem: self.data.get(TLS_KEY)?.clone(),
        })
    }
}

/// What [`Cluster::inject_ca_bundle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injection {
    /// This many webhooks got the new bundle.
    Patched(usize),
    /// Every webhook had it already.
    Unchanged,
    /// The configuration does not exist (yet).
    Missing,
}

/// The namespace the Secrets live in, and a client.
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    pub namespace: String,
}

impl Cluster {
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Reads a Secret; a missing one reads as empty. Entries that are not UTF-8 are
    /// left out (they cannot be PEM), so they read as missing and get rewritten.
    pub async fn read_secret(&self, name: &str) -> Result<StoredSecret, Error> {
        let Some(secret) = self.secrets().get_opt(name).await? else {
            return Ok(StoredSecret::default());
        };
        let data = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| String::from_utf8(v.0).ok().map(|v| (k, v)))
            .collect();
        Ok(StoredSecret {
            exists: true,
            resource_version: secret.metadata.resource_version,
            data,
        })
    }

    /// Makes the Secret hold exactly `data` (type `kubernetes.io/tls`), unless it does
    /// already. Returns whether it wrote.
    pub async fn write_secret(
        &self,
        name: &str,
        read: &StoredSecret,
        data: BTreeMap<String, String>,
    ) -> Result<bool, Error> {
        if read.exists && read.data == data {
            return Ok(false);
        }
        let mut secret = Secret {
            type_: Some("kubernetes.io/tls".into()),
            data: Some(
                data.into_iter()
                    .map(|(k, v)| (k, ByteString(v.into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        };
        secret.metadata.name = Some(name.to_owned());
        secret.metadata.namespace = Some(self.namespace.clone());
        secret.metadata.labels = Some(BTreeMap::from([
            (
                "app.kubernetes.io/managed-by".to_owned(),
                MANAGER.to_owned(),
            ),
            (
                "app.kubernetes.io/part-of".to_owned(),
                "gpu-booking".to_owned(),
            ),
        ]));
        let pp = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        let result = if read.exists {
            // Replace at the version we read: a concurrent writer makes this a 409.
            secret.metadata.resource_version = read.resource_version.clone();
            self.secrets().replace(name, &pp, &secret).await
        } else {
            self.secrets().create(&pp, &secret).await
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Conflict(format!(
                "Secret {}/{name} changed while we wrote it ({})",
                self.namespace, e.reason
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Sets `caBundle` of every webhook in the configuration to `bundle_pem`, in one
    /// JSON Patch that also tests each webhook's name (so a configuration rewritten in
    /// between is not patched at the wrong index). No request when nothing changes.
    pub async fn inject_ca_bundle(
        &self,
        config: &str,
        bundle_pem: &str,
    ) -> Result<Injection, Error> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let Some(current) = api.get_opt(config).await? else {
            return Ok(Injection::Missing);
        };
        let wanted = bundle_pem.as_bytes();
        let mut ops = Vec::new();
        for (i, webhook) in current.webhooks.iter().flatten().enumerate() {
            let has = webhook
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.as_slice());
            if has == Some(wanted) {
                continue;
            }
            ops.push(serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name}));
            ops.push(serde_json::json!({
                "op": "add",
                "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                "value": ByteString(wanted.to_vec()),
            }));
        }
        if ops.is_empty() {
            return Ok(Injection::Unchanged);
        }
        let patched = ops.len() / 2;
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(|e| Error::Internal(format!("building the caBundle patch: {e}")))?;
        let pp = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..PatchParams::default()
        };
        match api.patch(config, &pp, &Patch::Json::<()>(patch)).await {
            Ok(_) => Ok(Injection::Patched(patched)),
            // A failed `test` (422) or a concurrent change: start over.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                Err(Error::Conflict(format!(
                    "MutatingWebhookConfiguration {config} changed while we patched it ({})",
                    e.reason
                )))
            }
            Err(e) => Err(e.into()),
        }
    }
}
