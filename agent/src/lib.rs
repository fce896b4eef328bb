//! `gpu-booking agent`: the node agent (a DaemonSet on GPU nodes).
//!
//! Every `--sample-interval` it reads the GPUs through NVML, attributes each GPU
//! process to a pod container through `/proc/<pid>/cgroup` and the node's pods, and
//!
//! - **reclaims idle GPUs** (the idle-reclaim PRD): a pod whose GPU processes were
//!   idle for the whole window is warned (an Event), and if still idle after the
//!   warning period re-checked once more, then its GPU processes get SIGINT, SIGTERM
//!   and SIGKILL, the grace after each; the pod itself is never deleted, and booked
//!   pods are spared;
//! - **keeps VRAM within budget** (the VRAM-budget ADR): only when a GPU's free memory
//!   is under the floor, the biggest tenant over its declared `gpumem` budget has its
//!   GPU processes recycled (dry run by default);
//! - **reports**: metrics, one structured log line per process acted on, an Event on
//!   the pod, an audit row with the evidence, and each pod's last GPU activity as the
//!   annotation `gpu-booking.io/last-gpu-activity` for the controller.
//!
//! Anything not clearly attributed is counted and logged, never touched.
//!
//! NVML ([`gpu::GpuSampler`]), Kubernetes ([`cluster::Cluster`]) and the audit log
//! ([`audit::AuditSink`]) sit behind traits with fakes, and `/proc` is a configurable
//! root, so the tests drive the whole agent without a GPU or a cluster.
#![forbid(unsafe_code)]

pub mod action;
pub mod actor;
pub mod agent;
pub mod audit;
pub mod cgroup;
pub mod cluster;
pub mod config;
pub mod fake_cluster;
pub mod fake_gpu;
pub mod gpu;
pub mod idle;
pub mod metrics;
pub mod nvml;
pub mod pod_usage;
pub mod pods;
pub mod procfs;
pub mod reclaim_policy;
pub mod reclaim_warning;
pub mod server;
pub mod signal_policy;
pub mod signals;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpu_booking_process::shutdown_signal;

pub use agent::{Agent, AgentConfig, TickReport};
pub use config::AgentArgs;
pub use metrics::Metrics;

use crate::audit::{AuditSink, HttpAudit, LogOnlyAudit};
use crate::gpu::GpuSampler;
use crate::nvml::NvmlSampler;
use crate::procfs::ProcFs;

/// Runs the agent until SIGTERM or Ctrl-C (or one round with `--once`).
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    args.log.init();
    let mut cfg = args.agent_config()?;
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let admin = if args.once {
        None
    } else {
        let listener = args.admin.bind().await?;
        let router = server::admin_router(metrics.clone(), ready.clone());
        Some(tokio::spawn(server::serve(
            listener,
            router,
            stopped(stop_rx.clone()),
        )))
    };

    let Some(nvml) = load_nvml(&args, &metrics, stop_rx.clone()).await? else {
        return Ok(());
    };
    let gpu: Arc<dyn GpuSampler> = Arc::new(nvml);
    if !in_host_pid_namespace() {
        // NVML's PIDs are host PIDs: here they would name other processes, or none.
        tracing::error!(
            "not in the host PID namespace (the DaemonSet needs hostPID: true): \
             the agent only observes; reclaim and watchdog are dry runs"
        );
        cfg.policy.idle.dry_run = true;
        for p in &mut cfg.policy.namespace_policies {
            p.rule.dry_run = Some(true);
        }
        cfg.vram_dry_run = true;
    }
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster service account or KUBECONFIG)")?;
    let cluster = Arc::new(cluster::KubeCluster::new(client, cfg.node_name.clone()));
    let audit = audit_sink(&args)?;
    tracing::info!(
        node = %cfg.node_name,
        interval = ?args.sample_interval,
        idle_minutes = cfg.policy.idle.idle_minutes,
        idle_samples = cfg.policy.idle.idle_samples,
        dry_run = cfg.policy.idle.dry_run,
        reclaim_warning_s = cfg.reclaim_warning.num_seconds(),
        reclaim_signals = %cfg.reclaim_signals,
        reclaim_booked_pods = cfg.policy.reclaim_booked_pods,
        vram_floor_mib = cfg.vram_floor_mib,
        vram_dry_run = cfg.vram_dry_run,
        admin = %args.admin.admin_listen,
        "agent sampling"
    );
    let agent = Agent::new(
        cfg,
        gpu,
        cluster,
        audit,
        ProcFs::new(args.proc_root.clone()),
        metrics,
    );
    if args.once {
        let report = agent.tick(chrono::Utc::now()).await;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    ready.store(true, Ordering::Release);
    run_loop(agent, args.sample_interval, stopped(stop_rx)).await;
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    Ok(())
}

/// One round every `interval` until `shutdown`; a slow round (a grace period) delays
/// the next one rather than bunching rounds up.
pub async fn run_loop(
    agent: Arc<Agent>,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticks.tick() => {
                agent.tick(chrono::Utc::now()).await;
            }
        }
    }
}

/// NVML, or `None` when asked to stop while waiting for it. Without a driver it says
/// so ("no NVML") and tries again every `--nvml-retry`, serving health and metrics
/// (`nvml_up 0`) meanwhile; with `--once` it fails at once.
async fn load_nvml(
    args: &AgentArgs,
    metrics: &Metrics,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<NvmlSampler>> {
    loop {
        match NvmlSampler::init(args.nvml_library.as_ref()) {
            Ok(nvml) => {
                metrics.nvml_up.set(1);
                tracing::info!(driver = ?nvml.driver_version(), "NVML loaded");
                return Ok(Some(nvml));
            }
            Err(e) if args.once => return Err(e.into()),
            Err(e) => {
                metrics.nvml_up.set(0);
                tracing::error!(error = %e, retry_in = ?args.nvml_retry, "no NVML: the agent cannot see any GPU on this node; waiting");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(args.nvml_retry) => {}
            _ = stop.wait_for(|s| *s) => return Ok(None),
        }
    }
}

/// Kernel threads are visible only in the host PID namespace: `kthreadd` is PID 2
/// there. Checked in this process's own `/proc` (signals go to PIDs of the namespace
/// the agent runs in, whatever `--proc-root` says).
fn in_host_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/2/comm").is_ok_and(|comm| comm.trim() == "kthreadd")
}

fn audit_sink(args: &AgentArgs) -> anyhow::Result<Arc<dyn AuditSink>> {
    let Some(url) = args.booking.url() else {
        tracing::warn!(
            "no --booking-url: actions are recorded in the log only, not in the audit log"
        );
        return Ok(Arc::new(LogOnlyAudit));
    };
    let token = args.booking.token_source()?;
    Ok(Arc::new(HttpAudit::new(
        url,
        token,
        args.booking.booking_timeout,
    )?))
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
