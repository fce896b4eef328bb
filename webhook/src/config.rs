//! Options of `gpu-booking webhook`; `--help` is the documentation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use gpu_booking_client::BookingServiceArgs;
use gpu_booking_core::admission::{
    AdmissionArgs, AdmissionConfig, BookingErrorPolicy, LendNamespaces, SpawnerTrust,
    UnidentifiedGpuPods, VisibleDevicesWithoutGpu,
};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::username::NameCaseArgs;

pub use gpu_booking_process::LogFormat;
use gpu_booking_process::{AdminArgs, LogArgs};

/// `--on-booking-error`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OnBookingError {
    /// Admit the pod unchanged, with a warning.
    #[default]
    Allow,
    /// Remove the pod's GPU, with a warning.
    Strip,
}

impl From<OnBookingError> for BookingErrorPolicy {
    fn from(value: OnBookingError) -> Self {
        match value {
            OnBookingError::Allow => BookingErrorPolicy::Allow,
            OnBookingError::Strip => BookingErrorPolicy::Strip,
        }
    }
}

/// `--unidentified-gpu-pods`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Unidentified {
    /// As an unbooked user's pod: a free unit at low priority (preemptible), else no
    /// GPU; outside --lend-namespaces admitted as its creator wrote it.
    #[default]
    Lent,
    /// Always without its GPU, with a warning.
    Strip,
}

impl From<Unidentified> for UnidentifiedGpuPods {
    fn from(value: Unidentified) -> Self {
        match value {
            Unidentified::Lent => UnidentifiedGpuPods::Lent,
            Unidentified::Strip => UnidentifiedGpuPods::Strip,
        }
    }
}

/// `--decide-from`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum DecideFrom {
    /// A live replica of the booking service's state, fed by its change stream and a
    /// refresh of the per-model figures: no call on the admission path.
    #[default]
    Replica,
    /// One schedulability lookup per GPU pod (cached for --cache-ttl).
    Lookup,
}

/// Everything the webhook can be told; every option also reads an environment variable.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("booking_url", |a| a.required(true)))]
#[command(mut_arg("booking_timeout", |a| a.default_value("2s").help(
    "Longest wait for the booking service before --on-booking-error applies \
     (keep it well under the webhook timeout of the API server, 10 s at most)"
)))]
pub struct WebhookArgs {
    /// HTTPS address of `POST /mutate`.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_LISTEN",
        default_value = "0.0.0.0:8443"
    )]
    pub listen: SocketAddr,

    // `--admin-listen`: /healthz, /readyz and /metrics.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// PEM certificate chain of the serving certificate; re-read when the file changes
    /// (a rotated Secret is picked up by the next connection, no restart).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_TLS_CERT")]
    pub tls_cert: PathBuf,

    /// PEM private key of the serving certificate; re-read with the certificate.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_TLS_KEY")]
    pub tls_key: PathBuf,

    /// PEM bundle of the CA that signs the API server's client certificate: with it,
    /// the HTTPS port serves only clients that present a certificate it signed, so
    /// that no pod can post a review (the API server presents one when an
    /// AdmissionConfiguration tells it to, docs/webhook.md). Re-read with the serving
    /// pair.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,

    /// With --client-ca: a name the client certificate must carry (its subject's
    /// common name or one of its DNS names), e.g. kube-apiserver-webhook-client;
    /// any other is refused at the handshake. None given: any certificate the CA
    /// signed. Repeat or separate with commas.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_CLIENT_NAME", value_delimiter = ',')]
    pub client_name: Vec<String>,

    // The booking service: `--booking-url` (required here), `--service-token` or
    // `--service-token-file`, `--booking-timeout` (2 s here, see the struct).
    #[command(flatten)]
    pub booking: BookingServiceArgs,

    /// How long an answer of the booking service is reused for the same user or slug,
    /// so that a burst of spawns makes one call (0s: no reuse).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_CACHE_TTL", default_value = "3s", value_parser = parse_duration)]
    pub cache_ttl: Duration,

    /// How long after admitting a GPU pod a usage report of the controller can count
    /// it (created, scheduled, seen, reported): until a report that much newer
    /// arrives, the pod's units are subtracted from the booking service's free count,
    /// so that a storm of spawns is not lent more GPUs than are free. Clocks of the
    /// webhook and the booking service must agree to well within it (NTP).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_LEND_SETTLE", default_value = "3s", value_parser = parse_duration)]
    pub lend_settle: Duration,

    /// Longest time an admitted GPU pod's units are subtracted when no report counts
    /// them (the controller re-reports every few seconds; this bounds a stopped one).
    /// 0s turns the ledger off (the free count is taken as the service answers it).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_LEND_TTL", default_value = "60s", value_parser = parse_duration)]
    pub lend_ttl: Duration,

    /// Where GPU pods are decided from: `replica` (an in-memory copy of the active and
    /// planned bookings, users and per-model figures, kept current by the booking
    /// service's change stream; no call on the admission path) or `lookup` (one call
    /// per GPU pod, cached for --cache-ttl).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_DECIDE_FROM", value_enum, default_value_t = DecideFrom::Replica)]
    pub decide_from: DecideFrom,

    /// Oldest replica data the webhook decides from; past it (the booking service
    /// unreachable that long) --on-booking-error applies. Within it, decisions stay
    /// as the service would make them while it is down.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_REPLICA_MAX_STALENESS", default_value = "5m", value_parser = parse_duration)]
    pub replica_max_staleness: Duration,

    /// How often the replica reads the figures that do not come through the change
    /// stream (free units from the controller's usage reports, units held, budgets).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_REPLICA_REFRESH", default_value = "1s", value_parser = parse_duration)]
    pub replica_refresh: Duration,

    /// Each long poll of the change stream (at most 30s); while all is well the
    /// replica's staleness stays under about this.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_REPLICA_WAIT", default_value = "5s", value_parser = parse_duration)]
    pub replica_wait: Duration,

    /// While a long transaction in the booking database holds the change stream back
    /// (the stream says so), the replica lists the bookings again once its own are
    /// this old: a listing reads them directly, which the hold does not delay, so
    /// decisions stay about this current instead of growing stale. 0s: never (the
    /// replica then grows stale until the transaction ends).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_REPLICA_RELIST_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub replica_relist_after: Duration,

    /// What to do with a GPU pod when the booking service fails or is too slow.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_ON_BOOKING_ERROR", value_enum, default_value_t = OnBookingError::Allow)]
    pub on_booking_error: OnBookingError,

    // The GPU resources, the keys written on pods and the priority classes, shared
    // with the controller.
    #[command(flatten)]
    pub admission: AdmissionArgs,

    /// VRAM budget (MiB per GPU) for models without one of their own.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_DEFAULT_GPUMEM_MIB")]
    pub default_gpumem_mib: Option<u64>,

    /// VRAM budget of a model, MODEL=MIB (e.g. a100=40960); the booking service's
    /// declared budget wins when it has one. Repeat or separate with commas.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_MODEL_GPUMEM", value_delimiter = ',', value_parser = parse_model_gpumem)]
    pub model_gpumem: Vec<(ModelName, u64)>,

    /// A per-model resource, MODEL=RESOURCE (e.g. a100=nvidia.com/a100,
    /// mig-1g.5gb=nvidia.com/mig-1g.5gb). Repeat or separate with commas.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_MODEL_RESOURCE", value_delimiter = ',', value_parser = parse_model_resource)]
    pub model_resource: Vec<(ModelName, String)>,

    /// Who creates JupyterHub's pods, as the API server names the requester of an
    /// admission (`userInfo.username`), e.g. system:serviceaccount:jhub:hub. Only pods
    /// created by a trusted spawner have a user (anyone who can create a pod can write
    /// any user name into it). None given: no pod has a user. Repeat or separate with
    /// commas.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER",
        value_delimiter = ','
    )]
    pub trusted_spawner: Vec<String>,

    /// A group whose members are trusted spawners (`userInfo.groups`). Repeat or
    /// separate with commas.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER_GROUP",
        value_delimiter = ','
    )]
    pub trusted_spawner_group: Vec<String>,

    /// Namespace in which trusted spawners create user pods (e.g. jhub); pods
    /// elsewhere have no user. None given: any namespace. Repeat or separate with
    /// commas.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_SPAWNER_NAMESPACE",
        value_delimiter = ','
    )]
    pub spawner_namespace: Vec<String>,

    /// The controller, as the API server names the requester of an admission
    /// (`userInfo.username`), e.g. system:serviceaccount:gpu-booking:gpu-booking-controller
    /// (the chart sets it). The lent copies it creates in place of pods it ended
    /// (`--on-expiry demote`, pods beyond a booking's units) are admitted as it decided,
    /// not from a free count that may still count the original. None given: its copies
    /// are decided as any other pod. Repeat or separate with commas.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_TRUSTED_CONTROLLER",
        value_delimiter = ','
    )]
    pub trusted_controller: Vec<String>,

    /// What a GPU pod without a trusted user gets: `lent` (as an unbooked user's pod:
    /// a free unit at low priority, preemptible, else no GPU) or `strip` (never a GPU).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_UNIDENTIFIED_GPU_PODS", value_enum, default_value_t = Unidentified::Lent)]
    pub unidentified_gpu_pods: Unidentified,

    /// Namespaces in which the controller can take a lent card back (its --namespace
    /// and --preemptible-namespaces; the chart sets them): with
    /// --unidentified-gpu-pods lent, a GPU pod without a trusted user is lent a card
    /// only there; elsewhere it is another workload, admitted as its creator wrote it
    /// (its GPU kept, not lent, our marks removed). `*`: every namespace, as the
    /// controller acts by default (the default here too). Repeat or separate with
    /// commas.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_LEND_NAMESPACES",
        value_delimiter = ','
    )]
    pub lend_namespaces: Option<Vec<String>>,

    /// What a pod that asks for no GPU resource but sets `NVIDIA_VISIBLE_DEVICES`
    /// (which the NVIDIA container runtime reads: `all` hands it every card of its
    /// node) gets: `strip` (the variable set to `none`, with a warning) or `allow`.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_VISIBLE_DEVICES_WITHOUT_GPU", value_enum, default_value_t = VisibleDevicesWithoutGpu::Strip)]
    pub visible_devices_without_gpu: VisibleDevicesWithoutGpu,

    // `--case-sensitive-names`: shared with the booking service, which must agree.
    #[command(flatten)]
    pub names: NameCaseArgs,

    /// Audit reports of one kind (booked, low-priority, strip, ...) sent at once at most;
    /// beyond, they are sent at --audit-per-second and the rest are dropped (counted in
    /// gpu_booking_webhook_side_calls_total{call="audit",outcome="rate_limited"}).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_AUDIT_BURST", default_value_t = 20)]
    pub audit_burst: u32,

    /// Audit reports of one kind per second on average (see --audit-burst).
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_AUDIT_PER_SECOND", default_value_t = 2.0, value_parser = parse_rate)]
    pub audit_per_second: f64,

    /// Reviews one source (a client's IP address) may send at once of pods that may
    /// get a GPU or carry our marks (pods without either are answered as always);
    /// beyond, --source-reviews-per-second, and the pods of the rest are refused
    /// (code 429 in the answer; their creator retries). The API server is one source
    /// per instance; a pod that forges reviews is another.
    #[arg(
        long,
        env = "GPU_BOOKING_WEBHOOK_SOURCE_REVIEW_BURST",
        default_value_t = 1000
    )]
    pub source_review_burst: u32,

    /// Reviews per second one source may send on average (see --source-review-burst);
    /// 0: no limit.
    #[arg(long, env = "GPU_BOOKING_WEBHOOK_SOURCE_REVIEWS_PER_SECOND", default_value_t = 200.0, value_parser = parse_rate)]
    pub source_reviews_per_second: f64,
    /// Timeouts and limits of the HTTPS port.
    #[command(flatten)]
    pub limits: crate::server::WebhookLimits,

    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

impl WebhookArgs {
    /// Arguments for tests and the demo: everything at its default.
    pub fn with_defaults(
        tls_cert: PathBuf,
        tls_key: PathBuf,
        booking_url: String,
        service_token: String,
    ) -> Self {
        Self {
            listen: ([0, 0, 0, 0], 8443).into(),
            admin: AdminArgs::default(),
            tls_cert,
            tls_key,
            client_ca: None,
            client_name: Vec::new(),
            booking: BookingServiceArgs {
                booking_timeout: Duration::from_secs(2),
                ..BookingServiceArgs::new(&booking_url, Some(&service_token))
            },
            cache_ttl: Duration::from_secs(3),
            lend_settle: Duration::from_secs(3),
            lend_ttl: Duration::from_secs(60),
            decide_from: DecideFrom::Replica,
            replica_max_staleness: Duration::from_secs(300),
            replica_refresh: Duration::from_secs(1),
            replica_wait: Duration::from_secs(5),
            replica_relist_after: Duration::from_secs(30),
            on_booking_error: OnBookingError::Allow,
            admission: AdmissionArgs::default(),
            default_gpumem_mib: None,
            model_gpumem: Vec::new(),
            model_resource: Vec::new(),
            trusted_spawner: Vec::new(),
            trusted_spawner_group: Vec::new(),
            spawner_namespace: Vec::new(),
            trusted_controller: Vec::new(),
            unidentified_gpu_pods: Unidentified::Lent,
            lend_namespaces: None,
            visible_devices_without_gpu: VisibleDevicesWithoutGpu::Strip,
            names: NameCaseArgs::default(),
            audit_burst: 20,
            audit_per_second: 2.0,
            source_review_burst: 1000,
            source_reviews_per_second: 200.0,
            limits: Default::default(),
            log: LogArgs::default(),
        }
    }

    /// `--client-name`, trimmed, without empty entries.
    pub fn client_names(&self) -> Vec<String> {
        non_empty(&self.client_name)
    }

    /// The pure admission configuration these options describe, checked.
    pub fn admission_config(&self) -> anyhow::Result<AdmissionConfig> {
        let mut model_resources = BTreeMap::new();
        for (model, resource) in &self.model_resource {
            if let Some(other) = model_resources.insert(resource.clone(), model.clone()) {
                bail!("--model-resource: {resource} is given for both {other} and {model}");
            }
        }
        let lend_namespaces = match &self.lend_namespaces {
            None => LendNamespaces::Everywhere,
            Some(names) => LendNamespaces::from_names(names)
                .context("--lend-namespaces names no namespace (`*` for every namespace)")?,
        };
        let cfg = AdmissionConfig {
            model_resources,
            default_gpumem_mib: self.default_gpumem_mib,
            model_gpumem_mib: self.model_gpumem.iter().cloned().collect(),
            on_booking_error: self.on_booking_error.into(),
            spawners: SpawnerTrust {
                users: non_empty(&self.trusted_spawner),
                groups: non_empty(&self.trusted_spawner_group),
                namespaces: non_empty(&self.spawner_namespace),
            },
            name_case: self.names.name_case(),
            unidentified_gpu_pods: self.unidentified_gpu_pods.into(),
            lend_namespaces,
            visible_devices_without_gpu: self.visible_devices_without_gpu,
            controllers: non_empty(&self.trusted_controller),
            ..self.admission.admission_config()
        };
        cfg.validate().context("invalid webhook options")?;
        Ok(cfg)
    }
}

/// The one duration parser of every component: humantime or bare seconds, range-guarded
/// (see `gpu_booking_process::duration`).
pub use gpu_booking_process::duration::parse_duration;

/// The trimmed, non-empty entries of a list option (an empty environment variable
/// gives one empty entry).
fn non_empty(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A finite rate of at least zero.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "{s:?}: expected a number of events per second, 0 or more"
        )),
    }
}

fn split_pair(s: &str) -> Result<(ModelName, &str), String> {
    let (model, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected MODEL=VALUE"))?;
    let model = ModelName::parse(model.trim()).map_err(|e| e.to_string())?;
    Ok((model, value.trim()))
}

fn parse_model_gpumem(s: &str) -> Result<(ModelName, u64), String> {
    let (model, mib) = split_pair(s)?;
    let mib = mib
        .parse()
        .map_err(|_| format!("{s:?}: the budget must be a whole number of MiB"))?;
    Ok((model, mib))
}

fn parse_model_resource(s: &str) -> Result<(ModelName, String), String> {
    let (model, resource) = split_pair(s)?;
    Ok((model, resource.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use gpu_booking_core::username::NameCase;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WebhookArgs,
    }

    #[test]
    fn parses_every_option() {
        let cli = Cli::try_parse_from([
            "x",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--booking-url=http://api:8080",
            "--service-token=t",
            "--booking-timeout=500ms",
            "--on-booking-error=strip",
            "--model-gpumem=a100=40960,a6000=12288",
            "--model-resource",
            "a100=nvidia.com/a100",
            "--model-resource",
            "mig-1g.5gb=nvidia.com/mig-1g.5gb",
            "--default-gpumem-mib=8192",
            "--low-priority-class=",
            "--log-format=json",
            "--trusted-spawner=system:serviceaccount:jhub:hub",
            "--trusted-spawner",
            "system:serviceaccount:other:hub, ",
            "--trusted-spawner-group=spawners",
            "--spawner-namespace=jhub,other",
            "--trusted-controller=system:serviceaccount:gpu-booking:gpu-booking-controller, ",
            "--unidentified-gpu-pods=strip",
            "--lend-namespaces=jhub, research",
            "--case-sensitive-names",
            "--audit-burst=5",
            "--audit-per-second=0.5",
            "--source-review-burst=10",
            "--source-reviews-per-second=0",
            "--client-ca=ca.pem",
            "--client-name=kube-apiserver-webhook-client, ",
        ])
        .unwrap();
        let args = cli.args;
        assert_eq!(args.booking.booking_timeout, Duration::from_millis(500));
        let cfg = args.admission_config().unwrap();
        assert_eq!(cfg.on_booking_error, BookingErrorPolicy::Strip);
        assert_eq!(cfg.model_resources.len(), 2);
        assert_eq!(cfg.model_gpumem_mib.len(), 2);
        assert_eq!(cfg.low_priority_class, None);
        assert_eq!(
            cfg.controllers,
            ["system:serviceaccount:gpu-booking:gpu-booking-controller"]
        );
        assert_eq!(cfg.high_priority_class.as_deref(), Some("gpu-booking-high"));
        assert_eq!(
            cfg.spawners.users,
            [
                "system:serviceaccount:jhub:hub",
                "system:serviceaccount:other:hub"
            ]
        );
        assert_eq!(cfg.spawners.groups, ["spawners"]);
        assert_eq!(cfg.spawners.namespaces, ["jhub", "other"]);
        assert_eq!(cfg.unidentified_gpu_pods, UnidentifiedGpuPods::Strip);
        assert_eq!(
            cfg.lend_namespaces,
            LendNamespaces::from_names(["jhub", "research"]).unwrap()
        );
        assert_eq!(cfg.name_case, NameCase::Sensitive);
        assert_eq!((args.audit_burst, args.audit_per_second), (5, 0.5));
        assert_eq!(
            (args.source_review_burst, args.source_reviews_per_second),
            (10, 0.0)
        );
        assert_eq!(args.client_ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(args.client_names(), ["kube-apiserver-webhook-client"]);
    }

    #[test]
    fn identity_defaults_trust_nobody_and_lend() {
        let cli =
            Cli::try_parse_from(["x", "--tls-cert=c", "--tls-key=k", "--booking-url=u"]).unwrap();
        assert_eq!(cli.args.booking.booking_timeout, Duration::from_secs(2));
        let cfg = cli.args.admission_config().unwrap();
        assert!(cfg.spawners.is_empty());
        assert_eq!(cfg.unidentified_gpu_pods, UnidentifiedGpuPods::Lent);
        assert_eq!(cfg.lend_namespaces, LendNamespaces::Everywhere);
        assert_eq!(cfg.name_case, NameCase::Lowercase);
    }

    /// `*` (the chart's `controller.namespace: "*"`) lends everywhere; a list that
    /// names nothing, or a name no namespace can have, refuses to start.
    #[test]
    fn lend_namespaces() {
        let base = ["x", "--tls-cert=c", "--tls-key=k", "--booking-url=u"];
        let cfg = |arg: &str| {
            Cli::try_parse_from(base.iter().copied().chain([arg]))
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.args.admission_config().map_err(|e| e.to_string()))
        };
        assert_eq!(
            cfg("--lend-namespaces=*").unwrap().lend_namespaces,
            LendNamespaces::Everywhere
        );
        assert!(cfg("--lend-namespaces=jhub")
            .unwrap()
            .lend_namespaces
            .contains(Some("jhub")));
        for bad in [
            "--lend-namespaces=",
            "--lend-namespaces= ,",
            "--lend-namespaces=Research",
        ] {
            assert!(cfg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_bad_values() {
        assert!(
            Cli::try_parse_from(["x", "--tls-cert=c", "--tls-key=k"]).is_err(),
            "--booking-url is required"
        );
        let base = ["x", "--tls-cert=c", "--tls-key=k", "--booking-url=u"];
        for bad in [
            "--model-gpumem=A100=1",
            "--model-gpumem=a100=lots",
            "--model-resource=a100",
            "--booking-timeout=soon",
            "--unidentified-gpu-pods=budget",
            "--audit-per-second=-1",
            "--audit-per-second=inf",
            "--source-reviews-per-second=-5",
            "--booking-timeout=1e30",
            "--cache-ttl=9999999999years",
        ] {
            assert!(
                Cli::try_parse_from(base.iter().copied().chain([bad])).is_err(),
                "{bad}"
            );
        }
        let cli =
            Cli::try_parse_from(base.iter().copied().chain(["--gpumem-resource=bad key"])).unwrap();
        assert!(cli.args.admission_config().is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("-1").is_err());
    }
}
