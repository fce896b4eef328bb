//! The node agent against a real GPU: real NVML, the real `/proc`, real signals, with
//! the node's pods on the in-process fake API server (no cluster needed). For a machine
//! with an NVIDIA GPU and root; CI never runs it (`scripts/agent-real-gpu.sh` does, on
//! a lent GPU machine).
//!
//!     real_gpu <pid> [rounds] [budget MiB]
//!
//! `<pid>` is a CUDA process that holds GPU memory (idle, or computing). The example
//! puts a JupyterHub notebook pod on node `gpu-node`, moves the process into a cgroup
//! whose path names that pod and container as the kubelet's would (cgroup v2, systemd
//! driver, containerd), and runs the agent's rounds with the PRD's policy: idle for 30
//! minutes and 30 samples under 1 % utilisation reclaims, SIGTERM then SIGKILL after
//! the grace. A process that computes is left alone.
//! Rounds carry times a minute apart (as the agent's tests do) and are a second apart
//! in real time, so NVML's utilisation is real. Each round's report is printed as
//! JSON; after the last, whether the process still runs, the pod's annotations, the
//! Events and the audit rows. With a budget, the pod has that VRAM budget (the
//! `gpu-booking.io/gpumem` the webhook sets) and the watchdog acts (not a dry run):
//! when the card has less than 1,536 MiB free, a pod over its budget loses its GPU
//! processes.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use gpu_booking_agent::agent::{Agent, AgentConfig};
use gpu_booking_agent::audit::RecordingAudit;
use gpu_booking_agent::cluster::KubeCluster;
use gpu_booking_agent::nvml::NvmlSampler;
use gpu_booking_agent::procfs::ProcFs;
use gpu_booking_agent::signal_policy::SignalSequence;
use gpu_booking_agent::Metrics;
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const NODE: &str = "gpu-node";
const CONTAINER: &str = "5f1c2a9e8b7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170695e4d3";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let pid: u32 = args
        .next()
        .ok_or_else(|| {
            anyhow::anyhow!("usage: real_gpu <pid of a CUDA process> [rounds] [budget MiB]")
        })?
        .parse()?;
    let rounds: i64 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(40);
    let budget_mib: Option<u64> = args.next().map(|b| b.parse()).transpose()?;

    let server = FakeApiServer::new();
    // With a budget, the notebook container carries it as the webhook sets it.
    let resources = match budget_mib {
        Some(mib) => json!({
            "limits": {"nvidia.com/gpu": "1", "gpu-booking.io/gpumem": mib.to_string()},
            "requests": {"gpu-booking.io/gpumem": mib.to_string()}}),
        None => json!({"limits": {"nvidia.com/gpu": "1"}}),
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "jupyter-alice", "namespace": "jhub",
            "annotations": {"hub.jupyter.org/username": "alice"},
            "labels": {"component": "singleuser-server"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "notebook", "resources": resources}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "notebook",
            "containerID": format!("containerd://{CONTAINER}"),
            "image": "jupyter", "imageID": "", "ready": true, "restartCount": 0}]}
    }))?;
    let pod = server.put(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();

    // The kubelet's cgroup for the container (systemd driver: dashes in the UID become
    // underscores), the process moved into it.
    let scope = format!(
        "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CONTAINER}.scope",
        uid.replace('-', "_")
    );
    match std::fs::create_dir_all(&scope)
        .and_then(|()| std::fs::write(format!("{scope}/cgroup.procs"), pid.to_string()))
    {
        Ok(()) => println!("moved {pid} into {scope}"),
        Err(e) => {
            println!("could not move {pid} into {scope}: {e} (the agent will not attribute it)")
        }
    }
    println!(
        "/proc/{pid}/cgroup: {}",
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?.trim()
    );

    let nvml = NvmlSampler::init(None)?;
    println!("NVML driver {:?}", nvml.driver_version());
    let mut cfg = AgentConfig::defaults(NODE);
    // The PRD's policy, which the recorded runs in docs/agent.md followed: no warning
    // before the reclaim, SIGTERM first.
    cfg.reclaim_warning = TimeDelta::zero();
    cfg.reclaim_signals = SignalSequence::term_kill();
    cfg.term_grace = Duration::from_secs(5);
    cfg.vram_dry_run = budget_mib.is_none();
    let audit = Arc::new(RecordingAudit::default());
    let metrics = Arc::new(Metrics::new());
    let agent = Agent::new(
        cfg,
        Arc::new(nvml),
        Arc::new(KubeCluster::new(server.client(), NODE.into())),
        audit.clone(),
        ProcFs::new("/proc"),
        metrics,
    );

    let t0 = Utc::now();
    for round in 0..=rounds {
        let report = agent.tick(t0 + TimeDelta::minutes(round)).await;
        println!(
            "round {round} (+{round} min): {}",
            serde_json::to_string(&report)?
        );
        if !report.actions.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    println!(
        "process {pid} after the rounds: {}",
        if alive { "still running" } else { "gone" }
    );
    let stored: Option<Pod> = server.get(Some("jhub"), "jupyter-alice");
    println!(
        "pod annotations: {}",
        serde_json::to_string(&stored.and_then(|p| p.metadata.annotations))?
    );
    let events: Vec<k8s_openapi::api::events::v1::Event> = server.list(Some("jhub"));
    for e in events {
        println!(
            "event: {} {}",
            e.reason.unwrap_or_default(),
            e.note.unwrap_or_default()
        );
    }
    for record in audit.records() {
        println!("audit: {}", serde_json::to_string(&record)?);
    }
    Ok(())
}
