//! Options of `gpu-booking agent`; `--help` is the documentation. Every option also
//! reads an environment variable `GPU_BOOKING_AGENT_*`; the PRD's knobs keep their
//! names there (`..._IDLE_MINUTES`, `..._CONSECUTIVE_IDLE_SAMPLES`, ...). The booking
//! service's options are every component's (`client::BookingServiceArgs`,
//! `GPU_BOOKING_BOOKING_URL`, ...), and so are `--admin-listen` and `--log-format`
//! (`process::options`, `GPU_BOOKING_ADMIN_LISTEN`, `GPU_BOOKING_LOG_FORMAT`), and the
//! priority classes are the webhook's and the controller's (`--high-priority-class`,
//! `GPU_BOOKING_HIGH_PRIORITY_CLASS`, core's `PriorityClassArgs`): the agent believes a
//! pod booked as the controller does.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::TimeDelta;
use clap::{ArgAction, Args};
use gpu_booking_client::BookingServiceArgs;
use gpu_booking_core::admission::{AdmissionConfig, PriorityClassArgs, DEFAULT_GPUMEM_RESOURCE};
use gpu_booking_process::{AdminArgs, LogArgs};
use regex::Regex;

use crate::agent::{AgentConfig, DEFAULT_LAST_ACTIVITY_ANNOTATION};
use crate::reclaim_policy::{
    parse_opt_out, samples_for, IdleRule, LabelMatch, NamePattern, NamespacePolicy, Policy,
    DEFAULT_IDLE_MINUTES, DEFAULT_OPT_OUT_ANNOTATION, DEFAULT_PROCESS_ALLOWLIST,
    DEFAULT_UTIL_THRESHOLD_PERCENT,
};
use crate::signal_policy::{SignalSequence, DEFAULT_RECLAIM_SIGNALS};

#[derive(Debug, Clone, Args)]
#[command(mut_arg("booking_url", |a| a.help(
    "Base URL of the booking service for audit rows, e.g. http://gpu-booking-api:8080; \
     without it the log lines are the only record"
)))]
#[command(mut_arg("booking_timeout", |a| a.alias("audit-timeout")))]
pub struct AgentArgs {
    /// This node's name (the DaemonSet sets it from `spec.nodeName`); only pods bound
    /// to it are listed.
    #[arg(long, env = "GPU_BOOKING_AGENT_NODE_NAME")]
    pub node_name: String,

    /// Where the host's /proc is. With `hostPID: true` the container's /proc is the
    /// host's; a host /proc mounted elsewhere (e.g. /host/proc) works too. NVML's
    /// PIDs are host PIDs, and signals need the host PID namespace either way.
    #[arg(long, env = "GPU_BOOKING_AGENT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Time between two samples (PRD: SAMPLE_INTERVAL_SECONDS=60). A bare number is
    /// seconds.
    #[arg(long, env = "GPU_BOOKING_AGENT_SAMPLE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub sample_interval: Duration,

    /// Idle time before a pod's GPU processes are reclaimed (PRD: IDLE_MINUTES).
    #[arg(long, env = "GPU_BOOKING_AGENT_IDLE_MINUTES", default_value_t = DEFAULT_IDLE_MINUTES)]
    pub idle_minutes: u32,

    /// Consecutive idle samples required as well (PRD: CONSECUTIVE_IDLE_SAMPLES);
    /// default: the samples that fill the idle minutes (30 at 60 s).
    #[arg(long, env = "GPU_BOOKING_AGENT_CONSECUTIVE_IDLE_SAMPLES")]
    pub consecutive_idle_samples: Option<u32>,

    /// A process at or above this utilisation is active (PRD:
    /// GPU_UTIL_THRESHOLD_PERCENT).
    #[arg(long, env = "GPU_BOOKING_AGENT_GPU_UTIL_THRESHOLD_PERCENT", default_value_t = DEFAULT_UTIL_THRESHOLD_PERCENT)]
    pub gpu_util_threshold_percent: u32,

    /// Wait after each signal of --reclaim-signals but KILL for the processes to
    /// exit before the next (PRD: TERM_GRACE_SECONDS). A bare number is seconds.
    #[arg(long, env = "GPU_BOOKING_AGENT_TERM_GRACE", default_value = "15s", value_parser = parse_duration)]
    pub term_grace: Duration,

    /// Signals that end a pod's GPU processes (idle reclaim and the VRAM watchdog),
    /// in order, each to the processes still running after the wait that followed
    /// the one before: comma-separated of INT, HUP, USR1, USR2, TERM, KILL, none
    /// twice, KILL last. INT first is an interrupt: a Python program runs its
    /// cleanup.
    #[arg(long, env = "GPU_BOOKING_AGENT_RECLAIM_SIGNALS", default_value = DEFAULT_RECLAIM_SIGNALS, value_parser = SignalSequence::parse)]
    pub reclaim_signals: SignalSequence,

    /// A pod idle for its whole window first gets a Warning Event that says when its
    /// GPU processes end; they end this long after, if it is still idle then. 0s
    /// ends them at the window's end, unwarned. A bare number is seconds.
    #[arg(long, env = "GPU_BOOKING_AGENT_RECLAIM_WARNING", default_value = "5m", value_parser = parse_time_delta)]
    pub reclaim_warning: TimeDelta,

    /// Idle reclaim also ends the GPU processes of booked pods (our high priority
    /// class with our priority label, as the controller believes them). Off: a
    /// booking's card is its user's for the booking's time, used or idle.
    #[arg(long, env = "GPU_BOOKING_AGENT_RECLAIM_BOOKED_PODS", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub reclaim_booked_pods: bool,

    // `--high-priority-class`, `--low-priority-class`: the webhook's and the
    // controller's, with the same variables.
    #[command(flatten)]
    pub priority_classes: PriorityClassArgs,

    /// Further attempts when the GPU still lists a process after SIGKILL (PRD:
    /// MAX_RECLAIM_RETRY).
    #[arg(long, env = "GPU_BOOKING_AGENT_MAX_RECLAIM_RETRY", default_value_t = 2)]
    pub max_reclaim_retry: u32,

    /// Report what idle reclaim would do, send no signal (PRD: DRY_RUN).
    #[arg(long, env = "GPU_BOOKING_AGENT_DRY_RUN", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub dry_run: bool,

    /// Idle reclaim on this node at all (the global switch; nodes can also be
    /// chosen with the DaemonSet's node selector).
    #[arg(long, env = "GPU_BOOKING_AGENT_IDLE_RECLAIM", default_value_t = true, action = ArgAction::Set)]
    pub idle_reclaim: bool,

    /// The pod annotation KEY=VALUE that opts a pod out of idle reclaim (PRD:
    /// POD_OPT_OUT_ANNOTATION).
    #[arg(long, env = "GPU_BOOKING_AGENT_OPT_OUT_ANNOTATION", default_value = DEFAULT_OPT_OUT_ANNOTATION, value_parser = parse_opt_out)]
    pub opt_out_annotation: (String, String),

    /// Namespaces whose pods are never touched (idle reclaim and watchdog): names or
    /// prefixes ending in `*`, comma-separated.
    #[arg(long, env = "GPU_BOOKING_AGENT_NAMESPACE_ALLOWLIST", value_delimiter = ',', default_value = "kube-system", value_parser = NamePattern::parse)]
    pub namespace_allowlist: Vec<NamePattern>,

    /// Pod labels whose pods are never touched: KEY or KEY=VALUE, comma-separated.
    #[arg(long, env = "GPU_BOOKING_AGENT_LABEL_ALLOWLIST", value_delimiter = ',', value_parser = LabelMatch::parse)]
    pub label_allowlist: Vec<LabelMatch>,

    /// Processes never ended, matched against the process name, its comm and its
    /// command line (PRD: PROCESS_ALLOWLIST_REGEX; default: NVIDIA system daemons).
    /// An empty value allows nothing.
    #[arg(long, env = "GPU_BOOKING_AGENT_PROCESS_ALLOWLIST_REGEX", default_value = DEFAULT_PROCESS_ALLOWLIST)]
    pub process_allowlist_regex: String,

    /// Idle settings for some namespaces, first match wins:
    /// `PATTERN:key=value,...` with keys enabled, dry-run, idle-minutes, idle-samples,
    /// util-threshold; e.g. `dev-*:idle-minutes=120,idle-samples=120`. Repeat, or
    /// separate with `;`.
    #[arg(long, env = "GPU_BOOKING_AGENT_NAMESPACE_POLICY", value_delimiter = ';', value_parser = NamespacePolicy::parse)]
    pub namespace_policy: Vec<NamespacePolicy>,

    /// The VRAM watchdog at all.
    #[arg(long, env = "GPU_BOOKING_AGENT_VRAM_WATCHDOG", default_value_t = true, action = ArgAction::Set)]
    pub vram_watchdog: bool,

    /// The watchdog acts only on a GPU whose free memory is under this many MiB.
    #[arg(long, env = "GPU_BOOKING_AGENT_VRAM_FLOOR_MIB", default_value_t = 1536)]
    pub vram_floor_mib: u64,

    /// The watchdog reports what it would do and sends no signal (the ADR ships it
    /// so: observe, then enforce).
    #[arg(long, env = "GPU_BOOKING_AGENT_VRAM_DRY_RUN", default_value_t = true, action = ArgAction::Set)]
    pub vram_dry_run: bool,

    /// The extended resource that carries a pod's VRAM budget in MiB (the webhook's
    /// `--gpumem-resource`).
    #[arg(long, env = "GPU_BOOKING_AGENT_GPUMEM_RESOURCE", default_value = DEFAULT_GPUMEM_RESOURCE)]
    pub gpumem_resource: String,

    /// Pod annotation that gets the last GPU activity (RFC 3339) for the controller's
    /// least-recently-active order; "" writes none.
    #[arg(long, env = "GPU_BOOKING_AGENT_LAST_ACTIVITY_ANNOTATION", default_value = DEFAULT_LAST_ACTIVITY_ANNOTATION)]
    pub last_activity_annotation: String,

    /// The node's pod list is re-read at least this often (and sooner when a GPU
    /// process names a pod it does not have yet).
    #[arg(long, env = "GPU_BOOKING_AGENT_POD_REFRESH", default_value = "30s", value_parser = parse_duration)]
    pub pod_refresh: Duration,

    // The booking service, for audit rows: `--booking-url` (optional here),
    // `--service-token` or `--service-token-file`, `--booking-timeout` per audit row
    // (`--audit-timeout` before the options were shared, still accepted).
    #[command(flatten)]
    pub booking: BookingServiceArgs,

    // `--admin-listen`: /healthz, /readyz and /metrics.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// Path of libnvidia-ml (default: the driver's libnvidia-ml.so.1 from the
    /// library path).
    #[arg(long, env = "GPU_BOOKING_AGENT_NVML_LIBRARY")]
    pub nvml_library: Option<OsString>,

    /// Without NVML, try loading it again this often (the agent keeps serving its
    /// health and metrics meanwhile).
    #[arg(long, env = "GPU_BOOKING_AGENT_NVML_RETRY", default_value = "5m", value_parser = parse_duration)]
    pub nvml_retry: Duration,

    /// Run one round, print what it saw and did as JSON, and exit.
    #[arg(long, env = "GPU_BOOKING_AGENT_ONCE", default_value_t = false)]
    pub once: bool,

    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

impl AgentArgs {
    /// The agent's configuration, checked.
    pub fn agent_config(&self) -> anyhow::Result<AgentConfig> {
        let node = self.node_name.trim();
        if node.is_empty() || node.len() > 253 {
            anyhow::bail!("--node-name must be this node's name (GPU_BOOKING_AGENT_NODE_NAME)");
        }
        let idle = IdleRule {
            enabled: self.idle_reclaim,
            idle_minutes: self.idle_minutes,
            idle_samples: self
                .consecutive_idle_samples
                .unwrap_or_else(|| samples_for(self.idle_minutes, self.sample_interval)),
            util_threshold_percent: self.gpu_util_threshold_percent,
            dry_run: self.dry_run,
        };
        idle.validate().map_err(anyhow::Error::msg)?;
        let process_allowlist = match self.process_allowlist_regex.trim() {
            "" => None,
            re => Some(Regex::new(re).context("--process-allowlist-regex")?),
        };
        if self.sample_interval < Duration::from_millis(100) {
            anyhow::bail!("--sample-interval must be at least 100ms");
        }
        if self.max_reclaim_retry > 10 {
            anyhow::bail!("--max-reclaim-retry must be at most 10");
        }
        if self.gpumem_resource.trim().is_empty() {
            anyhow::bail!("--gpumem-resource must name a resource");
        }
        let delta = |d: Duration, name: &str| {
            TimeDelta::from_std(d).with_context(|| format!("{name} is too long"))
        };
        Ok(AgentConfig {
            node_name: node.to_owned(),
            policy: Policy {
                idle,
                namespace_policies: self.namespace_policy.clone(),
                namespace_allowlist: self.namespace_allowlist.clone(),
                label_allowlist: self.label_allowlist.clone(),
                process_allowlist,
                opt_out: self.opt_out_annotation.clone(),
                sample_interval: self.sample_interval,
                reclaim_booked_pods: self.reclaim_booked_pods,
            },
            reclaim_warning: self.reclaim_warning,
            reclaim_signals: self.reclaim_signals.clone(),
            term_grace: self.term_grace,
            kill_wait: Duration::from_secs(5),
            max_reclaim_retry: self.max_reclaim_retry,
            vram_watchdog: self.vram_watchdog,
            vram_floor_mib: self.vram_floor_mib,
            vram_dry_run: self.vram_dry_run,
            admission: self.priority_classes.apply(AdmissionConfig {
                gpumem_resource: self.gpumem_resource.trim().to_owned(),
                ..AdmissionConfig::default()
            }),
            last_activity_annotation: self.last_activity_annotation.trim().to_owned(),
            annotation_min_change: TimeDelta::minutes(1),
            pod_refresh: delta(self.pod_refresh, "--pod-refresh")?,
            pod_refresh_on_miss: TimeDelta::seconds(10),
        })
    }
}

/// The one duration parser of every component: humantime or bare seconds, range-guarded
/// (see `gpu_booking_process::duration`).
pub use gpu_booking_process::duration::{parse_duration, parse_time_delta};

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn parse(extra: &[&str]) -> Result<AgentArgs, clap::Error> {
        let base = ["x", "--node-name=gpu-1"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.args)
    }

    #[test]
    fn prd_defaults() {
        let cfg = parse(&[]).unwrap().agent_config().unwrap();
        let idle = cfg.policy.idle;
        assert_eq!(
            (
                idle.idle_minutes,
                idle.idle_samples,
                idle.util_threshold_percent
            ),
            (30, 30, 1)
        );
        assert!(!idle.dry_run && idle.enabled);
        assert_eq!(cfg.term_grace, Duration::from_secs(15));
        // Ours beyond the PRD: a warning first, an interrupt first, booked pods spared.
        assert_eq!(cfg.reclaim_warning, TimeDelta::minutes(5));
        assert_eq!(cfg.reclaim_signals.to_string(), "INT,TERM,KILL");
        assert!(!cfg.policy.reclaim_booked_pods);
        assert_eq!(
            cfg.admission.high_priority_class.as_deref(),
            Some("gpu-booking-high")
        );
        assert_eq!(cfg.max_reclaim_retry, 2);
        assert_eq!(cfg.vram_floor_mib, 1536);
        assert!(cfg.vram_dry_run && cfg.vram_watchdog);
        assert_eq!(cfg.admission.gpumem_resource, "gpu-booking.io/gpumem");
        assert_eq!(
            cfg.policy.opt_out,
            ("gpu-reclaimer/enabled".to_owned(), "false".to_owned())
        );
        assert_eq!(
            cfg.last_activity_annotation,
            "gpu-booking.io/last-gpu-activity"
        );
    }

    #[test]
    fn every_option() {
        let args = parse(&[
            "--sample-interval=1",
            "--idle-minutes=5",
            "--consecutive-idle-samples=300",
            "--gpu-util-threshold-percent=3",
            "--term-grace=2s",
            "--max-reclaim-retry=0",
            "--dry-run",
            "--opt-out-annotation=lab/keep=yes",
            "--namespace-allowlist=kube-system,infer-*",
            "--label-allowlist=tier=critical,keep",
            "--process-allowlist-regex=^Xorg$",
            "--namespace-policy=dev-*:idle-minutes=120;inference:idle-minutes=10",
            "--vram-floor-mib=2048",
            "--vram-dry-run=false",
            "--idle-reclaim=false",
            "--reclaim-signals=TERM,KILL",
            "--reclaim-warning=0s",
            "--reclaim-booked-pods",
            "--high-priority-class=lab-booked",
            "--booking-url=http://api:8080",
            "--service-token=t",
            "--log-format=json",
        ])
        .unwrap();
        assert_eq!(args.sample_interval, Duration::from_secs(1));
        let cfg = args.agent_config().unwrap();
        assert!(cfg.policy.idle.dry_run);
        assert!(!cfg.policy.idle.enabled);
        assert_eq!(cfg.policy.namespace_policies.len(), 2);
        assert_eq!(cfg.policy.idle_rule("dev-x").idle_minutes, 120);
        assert_eq!(cfg.policy.label_allowlist.len(), 2);
        assert_eq!(cfg.term_grace, Duration::from_secs(2));
        assert!(!cfg.vram_dry_run);
        assert_eq!(cfg.policy.opt_out.1, "yes");
        assert_eq!(cfg.policy.idle.idle_samples, 300, "given explicitly");
        assert_eq!(cfg.reclaim_signals, SignalSequence::term_kill());
        assert_eq!(cfg.reclaim_warning, TimeDelta::zero());
        assert!(cfg.policy.reclaim_booked_pods);
        assert_eq!(
            cfg.admission.high_priority_class.as_deref(),
            Some("lab-booked")
        );
    }

    #[test]
    fn the_booking_service_is_optional_and_the_old_timeout_flag_works() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.booking.url(), None);
        assert_eq!(args.booking.booking_timeout, Duration::from_secs(5));
        let args = parse(&["--audit-timeout=2s"]).unwrap();
        assert_eq!(args.booking.booking_timeout, Duration::from_secs(2));
    }

    #[test]
    fn the_sample_count_follows_the_idle_minutes_unless_given() {
        let idle = |extra: &[&str]| parse(extra).unwrap().agent_config().unwrap().policy.idle;
        assert_eq!(idle(&["--idle-minutes=10"]).idle_samples, 10);
        assert_eq!(
            idle(&["--idle-minutes=10", "--sample-interval=30s"]).idle_samples,
            20
        );
        assert_eq!(
            idle(&["--idle-minutes=10", "--consecutive-idle-samples=3"]).idle_samples,
            3
        );
    }

    #[test]
    fn refuses_bad_values() {
        for bad in [
            vec!["--sample-interval=soon"],
            vec!["--idle-minutes=-1"],
            vec!["--opt-out-annotation=novalue"],
            vec!["--namespace-allowlist=Bad_NS"],
            vec!["--namespace-policy=dev:speed=1"],
            vec!["--dry-run=maybe"],
            vec!["--reclaim-signals=TERM"],
            vec!["--reclaim-signals=KILL,TERM"],
            vec!["--reclaim-signals=INT,INT,KILL"],
            vec!["--reclaim-warning=-1s"],
            vec!["--reclaim-booked-pods=sometimes"],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
        for bad in [
            vec!["--idle-minutes=0"],
            vec!["--gpu-util-threshold-percent=0"],
            vec!["--process-allowlist-regex=("],
            vec!["--sample-interval=1ms"],
        ] {
            assert!(parse(&bad).unwrap().agent_config().is_err(), "{bad:?}");
        }
        assert!(
            Cli::try_parse_from(["x"]).is_err(),
            "the node name is required"
        );
    }
}
