//! Options of `gpu-booking controller`; `--help` is the documentation. Every option
//! also reads an environment variable: `GPU_BOOKING_CONTROLLER_*` for the
//! controller's own, `GPU_BOOKING_*` for those shared with other components (the
//! booking service's, `client::BookingServiceArgs`, the admission options,
//! `core::admission::AdmissionArgs`, and the process's, `process::options`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gpu_booking_client::BookingServiceArgs;
use gpu_booking_core::admission::{AdmissionArgs, AdmissionConfig};
use gpu_booking_core::preemption_policy::PreemptionPolicy;
pub use gpu_booking_process::LogFormat;
use gpu_booking_process::{AdminArgs, LogArgs};

/// The node label GPU feature discovery writes with the product name.
pub use gpu_booking_core::inventory::DEFAULT_PRODUCT_LABEL;

/// What happens to a booked pod at its `terminate-at` (decided in `core`).
pub use gpu_booking_core::pod_action::OnExpiry;

#[derive(Debug, Clone, Args)]
#[command(mut_arg("booking_url", |a| a.required(true)))]
pub struct ControllerArgs {
    // The booking service: `--booking-url` (required here), `--service-token` or
    // `--service-token-file`, `--booking-timeout` (also JupyterHub's, with
    // `--on-expiry hub-restart`).
    #[command(flatten)]
    pub booking: BookingServiceArgs,

    /// What happens to a booked pod at its `terminate-at`.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_ON_EXPIRY", value_enum, default_value_t = OnExpiry::RecreateCpu)]
    pub on_expiry: OnExpiry,

    /// JupyterHub's API URL (as `JUPYTERHUB_API_URL`, e.g.
    /// http://hub.jhub.svc:8081/hub/api), for `--on-expiry hub-restart`.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_HUB_API_URL")]
    pub hub_api_url: Option<String>,

    /// A JupyterHub service token allowed to stop and start users' servers (a role
    /// with the `servers` scope).
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_HUB_TOKEN",
        hide_env_values = true,
        conflicts_with = "hub_token_file"
    )]
    pub hub_token: Option<String>,

    /// File holding the JupyterHub service token (a mounted Secret); re-read when it
    /// changes.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_HUB_TOKEN_FILE")]
    pub hub_token_file: Option<PathBuf>,

    /// How long one call to JupyterHub may take: the hub holds a stop or a start open
    /// up to 10 s before it answers 202 (its `slow_stop_timeout` and
    /// `slow_spawn_timeout`), so less would count its ordinary answers as failures.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_HUB_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub hub_timeout: Duration,

    /// Log and count what would be done; change nothing (no deletes, creates, patches,
    /// node labels or status, events, usage reports or audit rows).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_DRY_RUN", default_value_t = false)]
    pub dry_run: bool,

    /// Act on pods in this namespace only: end booked pods, take lent cards back,
    /// re-create and annotate pods (default, or `*` as the chart's
    /// `controller.namespace` writes it: every namespace). GPU pods are counted in
    /// every namespace whatever this says.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_NAMESPACE")]
    pub namespace: Option<String>,

    /// Namespaces whose other workloads (GPU pods our webhook did not admit as
    /// booked or lent) may be deleted to make room for a booked pod, where lent pods
    /// cannot make room; comma-separated. Empty (default): other workloads are never
    /// preempted.
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_PREEMPTIBLE_NAMESPACES",
        value_delimiter = ',',
        num_args = 0..
    )]
    pub preemptible_namespaces: Vec<String>,

    /// Node label holding the GPU product name (matched against the models' patterns).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_PRODUCT_LABEL", default_value = DEFAULT_PRODUCT_LABEL)]
    pub product_label: String,

    // The GPU resources, the keys on pods and the priority classes, shared with the
    // webhook (they must be the same in both).
    #[command(flatten)]
    pub admission: AdmissionArgs,

    /// Advertise the VRAM budget resource (`--gpumem-resource`, MiB) on every GPU node
    /// in status.capacity and status.allocatable: cards x (memory per card from GFD's
    /// `nvidia.com/gpu.memory`, per MIG device from its profile's) minus the reserve.
    /// Off when something else advertises it.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_ADVERTISE_GPUMEM", default_value_t = true, action = clap::ArgAction::Set)]
    pub advertise_gpumem: bool,

    /// VRAM per card (per MIG device) kept out of the advertised budget, MiB: the
    /// driver, the CUDA context, the exporter.
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_GPUMEM_RESERVE_MIB",
        default_value_t = 512
    )]
    pub gpumem_reserve_mib: u64,

    /// Model of cards (and single-strategy MIG devices) that no model's pattern names,
    /// as seed 001's implicit `*` entry; empty: such cards belong to no model.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_FALLBACK_MODEL", default_value = gpu_booking_core::inventory::DEFAULT_FALLBACK_MODEL)]
    pub fallback_model: String,

    /// Mixed-strategy MIG devices that no pattern names become model `mig-<profile>`.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_MIG_FALLBACK", default_value_t = true, action = clap::ArgAction::Set)]
    pub mig_fallback: bool,

    /// Take part in leader election (a Lease); off only for a single replica.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the Lease.
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_LEASE_NAME",
        default_value = "gpu-booking-controller"
    )]
    pub lease_name: String,

    /// Namespace of the Lease (in a cluster: the controller's own namespace).
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_LEASE_NAMESPACE",
        default_value = "default"
    )]
    pub lease_namespace: String,

    /// How long a Lease holds without renewal.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How often the leader renews (and a follower tries to acquire) the Lease. The
    /// leader stops acting when no renewal succeeded for two thirds of the duration.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_LEASE_RENEW", default_value = "3s", value_parser = parse_duration)]
    pub lease_renew: Duration,

    /// This replica's name in the Lease (default: $POD_NAME, else the host name).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_IDENTITY")]
    pub identity: Option<String>,

    /// While a long transaction in the booking database holds the booking change
    /// stream back (the stream says so), the leader lists the bookings again this
    /// often (a listing reads them directly; every booked pod is then checked
    /// against them), so that a cancellation or a move reaches its pods at most about
    /// this late. 0s: never (they wait for the transaction to end).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_BOOKING_RELIST_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub booking_relist_after: Duration,

    /// How often Pending booked pods are looked at.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_PREEMPTION_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub preemption_interval: Duration,

    /// After preempting for a Pending booked pod, how long to let the scheduler place
    /// it before another round for it; doubled after each round (at most 32 times).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_PREEMPTION_RETRY", default_value = "60s", value_parser = parse_duration)]
    pub preemption_retry: Duration,

    /// How long the user of a lent notebook chosen to give way to a booked one has
    /// before it ends: the controller marks it (an annotation with the deadline, a
    /// Warning Event), ends it then if the booked pod still waits, and unmarks it when
    /// the booked pod no longer does. `0s`: ended at once.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_PREEMPTION_GRACE", default_value = "2m", value_parser = parse_duration)]
    pub preemption_grace: Duration,

    /// How long a lent pod may wait for a GPU the scheduler cannot give it before it
    /// is recreated CPU-only (the backstop of the webhook's lend ledger: several
    /// webhook replicas, or a late usage report, may lend more units than exist).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_LENT_PENDING_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub lent_pending_grace: Duration,

    /// How long after its notebook went to CPU (stripped at spawn, or its lent GPU
    /// taken back) a user is offered a GPU that frees, in order of waiting. `0s`:
    /// nobody is offered one.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_OFFER_WINDOW", default_value = "8h", value_parser = parse_duration)]
    pub offer_window: Duration,

    /// How long an offered GPU is held for its user (the webhook lends it to nobody
    /// else) before it is offered to the next in line.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_OFFER_HOLD", default_value = "5m", value_parser = parse_duration)]
    pub offer_hold: Duration,

    /// A model's free GPUs are offered only once none of them was taken for this
    /// long: while spawns are being lent a model's cards, the free count runs ahead
    /// of what the webhook may still lend, and the cards are the spawns', not
    /// offers'.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_OFFER_QUIET", default_value = "30s", value_parser = parse_duration)]
    pub offer_quiet: Duration,

    /// With `--on-expiry hub-restart`: a user who opted in on the notices page has
    /// their server restarted on an offered GPU through JupyterHub once the hub has
    /// seen no activity of the server (its `last_activity`) for this long. `0s`: at
    /// once.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_OFFER_RESTART_IDLE", default_value = "10m", value_parser = parse_duration)]
    pub offer_restart_idle: Duration,

    /// Rounds of preemption for one Pending booked pod before the controller gives up
    /// on it (an Event on the pod says so).
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_PREEMPTION_ATTEMPTS", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub preemption_attempts: u32,

    /// VRAM (MiB) kept spare beside a booked pod's budget when choosing victims on a
    /// node that advertises the VRAM budget (seed 004's cushion).
    #[arg(
        long,
        env = "GPU_BOOKING_CONTROLLER_PREEMPTION_VRAM_CUSHION",
        default_value_t = 256
    )]
    pub preemption_vram_cushion: u64,

    /// How often the models are re-read from the booking service.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_MODELS_REFRESH", default_value = "60s", value_parser = parse_duration)]
    pub models_refresh: Duration,

    /// Longest wait for a deleted pod to be gone before its CPU-only copy is given up.
    #[arg(long, env = "GPU_BOOKING_CONTROLLER_GONE_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub gone_timeout: Duration,

    // `--admin-listen`: /healthz, /readyz and /metrics.
    #[command(flatten)]
    pub admin: AdminArgs,

    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

impl ControllerArgs {
    /// Every option at its default (for tests and embedding).
    /// The one namespace whose pods it serves; `None`: every namespace.
    pub fn served_namespace(&self) -> Option<&str> {
        self.namespace
            .as_deref()
            .filter(|ns| !ns.is_empty() && *ns != "*")
    }

    /// Where it acts and which pods give way to booked ones (core decides).
    pub fn preemption_policy(&self) -> PreemptionPolicy {
        PreemptionPolicy::new(
            self.served_namespace(),
            self.preemptible_namespaces.iter().cloned(),
        )
    }

    pub fn with_defaults(booking_url: &str) -> Self {
        Self {
            booking: BookingServiceArgs::new(booking_url, None),
            on_expiry: OnExpiry::RecreateCpu,
            hub_api_url: None,
            hub_token: None,
            hub_token_file: None,
            hub_timeout: Duration::from_secs(30),
            dry_run: false,
            namespace: None,
            preemptible_namespaces: Vec::new(),
            product_label: DEFAULT_PRODUCT_LABEL.into(),
            admission: AdmissionArgs::default(),
            advertise_gpumem: true,
            gpumem_reserve_mib: 512,
            fallback_model: gpu_booking_core::inventory::DEFAULT_FALLBACK_MODEL.into(),
            mig_fallback: true,
            leader_elect: true,
            lease_name: "gpu-booking-controller".into(),
            lease_namespace: "default".into(),
            lease_duration: Duration::from_secs(15),
            lease_renew: Duration::from_secs(3),
            identity: None,
            booking_relist_after: Duration::from_secs(30),
            preemption_interval: Duration::from_secs(2),
            preemption_retry: Duration::from_secs(60),
            preemption_grace: Duration::from_secs(120),
            lent_pending_grace: Duration::from_secs(30),
            offer_window: Duration::from_secs(8 * 3600),
            offer_hold: Duration::from_secs(300),
            offer_quiet: Duration::from_secs(30),
            offer_restart_idle: Duration::from_secs(600),
            preemption_attempts: 3,
            preemption_vram_cushion: 256,
            models_refresh: Duration::from_secs(60),
            gone_timeout: Duration::from_secs(600),
            admin: AdminArgs::default(),
            log: LogArgs::default(),
        }
    }

    /// The patch planner's configuration: the keys the controller reads and strips.
    pub fn admission_config(&self) -> anyhow::Result<AdmissionConfig> {
        let cfg = self.admission.admission_config();
        cfg.validate().context("invalid controller options")?;
        if !gpu_booking_core::admission::is_qualified_name(&self.product_label) {
            anyhow::bail!(
                "--product-label {:?} is not a label key",
                self.product_label
            );
        }
        self.inventory_options()?;
        if self.lease_renew.is_zero() || self.lease_renew * 3 > self.lease_duration * 2 {
            anyhow::bail!(
                "--lease-renew must be above zero and at most two thirds of --lease-duration"
            );
        }
        Ok(cfg)
    }

    /// The JupyterHub client of `--on-expiry hub-restart` (none in other modes); an
    /// error when that mode lacks its URL or token.
    pub fn hub(&self) -> anyhow::Result<Option<crate::hub::Hub>> {
        if self.on_expiry != OnExpiry::HubRestart {
            return Ok(None);
        }
        let url = self
            .hub_api_url
            .as_deref()
            .filter(|u| !u.is_empty())
            .context("--on-expiry hub-restart needs --hub-api-url")?;
        let token = gpu_booking_client::TokenSource::from_options(
            self.hub_token.as_deref(),
            self.hub_token_file.as_deref(),
        )
        .map_err(|e| anyhow::anyhow!("--on-expiry hub-restart needs --hub-token-file: {e}"))?;
        crate::hub::Hub::new(url, token, self.hub_timeout).map(Some)
    }

    /// How the inventory names cards no pattern names, and the VRAM reserve.
    pub fn inventory_options(&self) -> anyhow::Result<crate::inventory::InventoryOptions> {
        let fallback_model = match self.fallback_model.as_str() {
            "" => None,
            name => Some(
                gpu_booking_core::gpu_model::ModelName::parse(name).context("--fallback-model")?,
            ),
        };
        Ok(crate::inventory::InventoryOptions {
            product_label: self.product_label.clone(),
            fallback_model,
            mig_fallback: self.mig_fallback,
            reserve_mib: self.gpumem_reserve_mib,
        })
    }

    /// This replica's name in the Lease.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("gpu-booking-controller-{}", std::process::id()))
    }
}

/// The one duration parser of every component: humantime or bare seconds, range-guarded
/// (see `gpu_booking_process::duration`).
pub use gpu_booking_process::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    #[test]
    fn parses_options() {
        let cli = Cli::try_parse_from([
            "x",
            "--booking-url=http://api:8080",
            "--on-expiry=demote",
            "--dry-run",
            "--leader-elect=false",
            "--gpu-resource=nvidia.com/gpu,example.com/gpu",
            "--lease-duration=30s",
        ])
        .unwrap();
        assert_eq!(cli.args.on_expiry, OnExpiry::Demote);
        assert!(cli.args.dry_run && !cli.args.leader_elect);
        assert_eq!(cli.args.admission.gpu_resource.len(), 2);
        assert!(cli.args.admission_config().is_ok());
        assert!(cli.args.hub().unwrap().is_none());
    }

    #[test]
    fn a_star_serves_every_namespace() {
        let served = |extra: &[&str]| {
            let mut argv = vec!["x", "--booking-url=http://api:8080"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
                .unwrap()
                .args
                .served_namespace()
                .map(str::to_owned)
        };
        assert_eq!(served(&["--namespace=jhub"]).as_deref(), Some("jhub"));
        assert_eq!(served(&["--namespace=*"]), None);
        assert_eq!(served(&[]), None);
    }

    #[test]
    fn hub_restart_needs_the_hub() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["x", "--booking-url=u", "--on-expiry=hub-restart"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args
        };
        assert!(parse(&[]).hub().is_err());
        assert!(parse(&["--hub-api-url=http://hub:8081/hub/api"])
            .hub()
            .is_err());
        let missing = parse(&[
            "--hub-api-url=http://hub:8081/hub/api",
            "--hub-token-file=/nonexistent/token",
        ]);
        assert!(missing.hub().is_err());
        let ok = parse(&["--hub-api-url=http://hub:8081/hub/api", "--hub-token=t"]);
        assert!(ok.hub().unwrap().is_some());
        let bad = parse(&["--hub-api-url=ftp://hub", "--hub-token=t"]);
        assert!(bad.hub().is_err());
    }

    #[test]
    fn refuses_bad_values() {
        assert!(Cli::try_parse_from(["x", "--booking-url=u", "--on-expiry=later"]).is_err());
        assert!(
            Cli::try_parse_from(["x"]).is_err(),
            "--booking-url is required"
        );
        let mut args = ControllerArgs::with_defaults("http://x");
        args.lease_renew = Duration::from_secs(14);
        assert!(args.admission_config().is_err());
        let mut args = ControllerArgs::with_defaults("http://x");
        args.admission.terminate_at_annotation = "no spaces allowed".into();
        assert!(args.admission_config().is_err());
        let mut args = ControllerArgs::with_defaults("http://x");
        args.fallback_model = "Not A Model".into();
        assert!(args.admission_config().is_err());
        args.fallback_model = String::new();
        let opts = args.inventory_options().unwrap();
        assert_eq!(opts.fallback_model, None);
        let cli =
            Cli::try_parse_from(["x", "--booking-url=u", "--gpumem-reserve-mib=1024"]).unwrap();
        let opts = cli.args.inventory_options().unwrap();
        assert_eq!(opts.reserve_mib, 1024);
        assert_eq!(
            opts.fallback_model.map(String::from).as_deref(),
            Some("gpu")
        );
    }
}
