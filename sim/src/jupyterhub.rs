//! The lab as a real JupyterHub reaches it: KubeSpawner, in the hub, talks to the
//! lab's HTTPS API server as the hub's ServiceAccount (`jhub/hub`, the webhook's
//! trusted spawner), as zero-to-jupyterhub runs it. Used by the demo's
//! `--jupyterhub` and by the end-to-end scenarios with a real hub.

use std::path::Path;

use gpu_booking_fake_apiserver::API_AUDIENCE;

use crate::spawner::{HUB_USER, NOTEBOOK_NAMESPACE};
use crate::SimCluster;

impl SimCluster {
    /// Writes to `path` (owner-only) a kubeconfig for the lab's API server that
    /// authenticates as the hub's ServiceAccount, with a token the server issued for
    /// its own audience, in namespace `jhub`.
    pub fn write_hub_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        let token = self
            .server
            .service_account_token(NOTEBOOK_NAMESPACE, "hub", &[API_AUDIENCE]);
        self.https.write_kubeconfig(path, HUB_USER, &token)
    }
}
