//! Connecting a one-shot command to the cluster (`bootstrap`, `cleanup-nodes`,
//! `certs`): the in-cluster service account or a kubeconfig, and the namespace the
//! command acts in when none is given (the service account's, or the kubeconfig
//! context's), with one error message for every command.

use anyhow::Context;

/// A client and the namespace to act in: `namespace`, else the client's default.
pub async fn connect(namespace: Option<&str>) -> anyhow::Result<(kube::Client, String)> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster service account or kubeconfig)")?;
    let namespace = namespace.map_or_else(|| client.default_namespace().to_owned(), str::to_owned);
    Ok((client, namespace))
}
