//! `gpu-booking cleanup-nodes`: what the controller wrote on nodes, taken off them
//! when the release goes (the chart's post-delete hook Job), so that an uninstall leaves
//! no model label that no controller keeps true and no VRAM budget that no webhook
//! asks for.
//!
//! The controller puts back what it finds missing (it is level-triggered), so the
//! cleanup runs after it is gone: with `--wait-for-pods`, it first waits until no pod
//! of that label selector is left in its namespace (a terminating one still counts:
//! it may still write), and gives up, writing nothing, after `--wait-timeout`.
//!
//! Removed from every node: the labels under our key domain (`gpu-booking.io/...`,
//! among them the model label), the per-model presence labels
//! (`model.gpu-booking.io/...`), the configured model label when it lies outside
//! them, and the VRAM budget resource from `status.capacity` and
//! `status.allocatable` ("Advertise Extended Resources for a Node": removed with a
//! JSON patch of `nodes/status`). Nothing else on a node is touched, and a node that
//! carries none of it is not written to. A node deleted meanwhile is skipped; any
//! other failure fails the run after every node was tried, so that the hook fails
//! and says which nodes are left.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gpu_booking_core::admission::{plan_node_resource, AdmissionArgs, KEY_DOMAIN};
use gpu_booking_core::inventory::MODEL_PRESENT_LABEL_PREFIX;
use gpu_booking_process::LogArgs;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

/// The field manager named in our writes.
pub const MANAGER: &str = "gpu-booking-cleanup-nodes";

/// Options of `gpu-booking cleanup-nodes`: the controller's admission options (the
/// model label and the VRAM budget resource it writes) under the same names.
#[derive(Debug, Clone, Args)]
pub struct CleanupNodesArgs {
    // `--model-node-label`, `--gpumem-resource` (and the other admission options,
    // unused here, so that the controller's environment serves as is).
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// Wait until no pod of this label selector (the controller's) is left in
    /// `--namespace` before touching a node.
    #[arg(long, env = "GPU_BOOKING_CLEANUP_WAIT_FOR_PODS")]
    pub wait_for_pods: Option<String>,
    /// Namespace of those pods (default: the pod's own, or the kubeconfig's).
    #[arg(long, env = "GPU_BOOKING_CLEANUP_NAMESPACE")]
    pub namespace: Option<String>,
    /// How long to wait for them.
    #[arg(long, env = "GPU_BOOKING_CLEANUP_WAIT_TIMEOUT", default_value = "90s", value_parser = crate::config::parse_duration)]
    pub wait_timeout: Duration,
    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

/// Whether a node label is one the controller writes.
pub fn is_our_node_label(key: &str, model_node_label: &str) -> bool {
    key.starts_with(KEY_DOMAIN)
        || key.starts_with(MODEL_PRESENT_LABEL_PREFIX)
        || key == model_node_label
}

/// The merge patch that removes our labels from a node with `labels`; `None` when it
/// carries none.
pub fn plan_labels(labels: &BTreeMap<String, String>, model_node_label: &str) -> Option<Value> {
    let ours: serde_json::Map<String, Value> = labels
        .keys()
        .filter(|k| is_our_node_label(k, model_node_label))
        .map(|k| (k.clone(), Value::Null))
        .collect();
    (!ours.is_empty()).then(|| json!({"metadata": {"labels": ours}}))
}

/// What [`run`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Nodes whose labels were removed.
    pub unlabelled: Vec<String>,
    /// Nodes whose VRAM budget was removed.
    pub unadvertised: Vec<String>,
}

/// Waits until no pod of `selector` is left in `namespace`; an error naming those
/// left after `timeout`.
pub async fn wait_for_pods_gone(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = api
            .list(&ListParams::default().labels(selector))
            .await
            .with_context(|| format!("listing the pods {selector} in {namespace}"))?;
        if left.items.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let names: Vec<String> = left
                .items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            anyhow::bail!(
                "pods {selector} still run in {namespace} after {timeout:?} ({}): they would put back what is removed; nothing was changed",
                names.join(", ")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How often [`wait_for_pods_gone`] looks again: a terminating pod is gone within
/// its grace period (30 s by default), so a second is plenty.
const POLL: Duration = Duration::from_secs(1);

/// Removes our labels and the VRAM budget from every node (after the controller's
/// pods are gone, with `--wait-for-pods`).
pub async fn run(
    client: kube::Client,
    namespace: &str,
    args: &CleanupNodesArgs,
) -> anyhow::Result<Report> {
    if let Some(selector) = &args.wait_for_pods {
        wait_for_pods_gone(client.clone(), namespace, selector, args.wait_timeout).await?;
    }
    let api: Api<Node> = Api::all(client);
    let pp = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    let label = &args.admission.model_node_label;
    let resource = &args.admission.gpumem_resource;
    let nodes = api
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    let mut report = Report::default();
    let mut failed = Vec::new();
    for node in nodes {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        if let Some(patch) = plan_labels(&labels, label) {
            match api.patch(&name, &pp, &Patch::Merge(&patch)).await {
                Ok(_) => report.unlabelled.push(name.clone()),
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(e) => failed.push(format!("{name} (labels): {e}")),
            }
        }
        let value = serde_json::to_value(&node).context("a node as JSON")?;
        let patch = plan_node_resource(&value, resource, None);
        if patch.0.is_empty() {
            continue;
        }
        match api
            .patch_status(&name, &pp, &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => report.unadvertised.push(name),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => failed.push(format!("{name} ({resource}): {e}")),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("could not clean up every node: {}", failed.join("; "));
    }
    Ok(report)
}

/// `gpu-booking cleanup-nodes`: connect (in-cluster or kubeconfig), then [`run`].
pub async fn main(args: CleanupNodesArgs) -> anyhow::Result<()> {
    args.log.init();
    let (client, namespace) =
        gpu_booking_process::kube_client::connect(args.namespace.as_deref()).await?;
    let report = run(client, &namespace, &args).await?;
    tracing::info!(
        unlabelled = ?report.unlabelled,
        unadvertised = ?report.unadvertised,
        "our labels and VRAM budget removed from the nodes"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_labels_are_removed() {
        let labels: BTreeMap<String, String> = [
            ("gpu-booking.io/model", "a100"),
            ("gpu-booking.io/gpu-memory-mib", "40960"),
            ("model.gpu-booking.io/a100", "true"),
            ("lab.example/model", "a100"),
            ("nvidia.com/gpu.product", "A100-SXM4-40GB"),
            ("kubernetes.io/hostname", "gpu-1"),
            ("gpu-booking.example/other", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let patch = plan_labels(&labels, "lab.example/model").unwrap();
        let removed: Vec<&String> = patch["metadata"]["labels"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            removed,
            [
                "gpu-booking.io/gpu-memory-mib",
                "gpu-booking.io/model",
                "lab.example/model",
                "model.gpu-booking.io/a100"
            ]
        );
        assert!(patch["metadata"]["labels"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_null));
        let theirs: BTreeMap<String, String> =
            [("nvidia.com/gpu.product".to_owned(), "A100".to_owned())].into();
        assert_eq!(plan_labels(&theirs, "gpu-booking.io/model"), None);
    }
}
