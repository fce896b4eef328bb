//! Service identity in the simulated lab, as in a cluster: the
//! webhook, the controller and each node agent present the projected token of their
//! own ServiceAccount (audience-bound, a file the kubelet would mount), and the booking
//! API verifies it with a TokenReview that the fake API server answers. No component
//! of the lab holds the long-lived HS256 service token; that stays an option outside
//! Kubernetes (the demo prints one for curl, and tests that test it mint their own).
//!
//! The names are the chart's for release `gpu-booking` in namespace `gpu-booking`,
//! and the API's roles are the chart's `GPU_BOOKING_SERVICE_ACCOUNT`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use gpu_booking_api::auth::Role;
use gpu_booking_api::service_accounts::ServiceAccounts;
use gpu_booking_fake_apiserver::FakeApiServer;

/// The release's namespace.
pub const NAMESPACE: &str = "gpu-booking";
/// The audience the components' tokens are bound to and the API accepts
/// (`auth.serviceAccountTokens.audience`).
pub const AUDIENCE: &str = "gpu-booking";
/// The API's own ServiceAccount: it asks for the TokenReviews.
pub const API: &str = "gpu-booking-api";
/// The components that call the booking API, each with its own ServiceAccount.
pub const WEBHOOK: &str = "gpu-booking-webhook";
pub const CONTROLLER: &str = "gpu-booking-controller";
pub const AGENT: &str = "gpu-booking-agent";
/// Those three: the chart gives each the `service` role.
pub const COMPONENTS: [&str; 3] = [WEBHOOK, CONTROLLER, AGENT];

/// How the API server names ServiceAccount `name` of the release's namespace (what
/// a TokenReview answers, and so the actor of the audit rows the component writes).
pub fn username(name: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{name}")
}

/// The groups the API server gives a ServiceAccount of the release's namespace.
pub const GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:gpu-booking",
    "system:authenticated",
];

/// The booking API's verifier of the lab's tokens: TokenReviews for [`AUDIENCE`] sent
/// to `server` as the API's ServiceAccount, the components' roles as the chart sets
/// them.
pub fn verifier(server: &FakeApiServer) -> ServiceAccounts {
    let client = server.client_as(&username(API), &GROUPS);
    let roles: BTreeMap<(String, String), Role> = COMPONENTS
        .iter()
        .map(|name| ((NAMESPACE.to_owned(), (*name).to_owned()), Role::Service))
        .collect();
    ServiceAccounts::new(client, AUDIENCE.to_owned(), roles)
}

/// The verifier as the chart configures the booking API: the audience and the
/// ServiceAccounts' roles from its Deployment's environment
/// (`GPU_BOOKING_SERVICE_ACCOUNT_AUDIENCE`, `GPU_BOOKING_SERVICE_ACCOUNT`, read by
/// the API's own parser), the TokenReviews made as the API's ServiceAccount.
pub fn chart_verifier(
    server: &FakeApiServer,
    chart: &crate::rendered::RenderedChart,
) -> anyhow::Result<ServiceAccounts> {
    let workload = chart.workload("Deployment", API)?;
    let audience = workload
        .env_value("GPU_BOOKING_SERVICE_ACCOUNT_AUDIENCE")
        .context("the chart's API accepts no ServiceAccount tokens")?;
    let roles = workload
        .env_value("GPU_BOOKING_SERVICE_ACCOUNT")
        .unwrap_or_default()
        .split(',')
        .filter(|b| !b.is_empty())
        .map(gpu_booking_api::service_accounts::parse_binding)
        .collect::<Result<BTreeMap<_, _>, String>>()
        .map_err(anyhow::Error::msg)?;
    let client = server.client_as(&workload.username(), &GROUPS);
    Ok(ServiceAccounts::new(client, audience, roles))
}

/// The components' projected tokens, one file each, as the kubelet mounts them
/// (removed with this value).
pub struct ProjectedTokens {
    dir: tempfile::TempDir,
}

impl ProjectedTokens {
    /// Has `server` issue each component's token for [`AUDIENCE`] and writes it.
    pub fn issue(server: &FakeApiServer) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("a folder for the projected tokens")?;
        for name in COMPONENTS {
            let token = server.service_account_token(NAMESPACE, name, &[AUDIENCE]);
            let path = dir.path().join(name);
            std::fs::write(&path, token).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(Self { dir })
    }

    /// The token file of `component` (one of [`COMPONENTS`]).
    pub fn path(&self, component: &str) -> PathBuf {
        self.dir.path().join(component)
    }
}
