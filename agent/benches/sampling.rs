//! The agent's own cost while sampling 8 fake GPUs with 50 processes each once a
//! second: CPU time and memory of this process (the agent loop, the fake GPU, the fake
//! /proc tree on tmpfs or disk, the fake cluster), measured from /proc/self.
//!
//! `cargo bench -p gpu-booking-agent --bench sampling` (BENCH_SECONDS=30 by default;
//! BENCH_GPUS, BENCH_PROCS_PER_GPU change the load).
//!
//! Not included: the NVML calls themselves (microseconds per GPU on a real driver)
//! and the real API server round trips (one pod list per 30 s, a PATCH per busy pod
//! per minute).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use gpu_booking_agent::agent::{Agent, AgentConfig};
use gpu_booking_agent::audit::RecordingAudit;
use gpu_booking_agent::fake_cluster::FakeCluster;
use gpu_booking_agent::fake_gpu::FakeGpu;
use gpu_booking_agent::procfs::{write_fake_process, ProcFs};
use gpu_booking_agent::Metrics;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user + system) of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3. USER_HZ is 100.
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / 100.0
}

/// (VmRSS, VmHWM) in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

fn pod(n: u64) -> Pod {
    let uid = format!("{n:08x}-0000-4000-8000-{n:012x}");
    serde_json::from_value(json!({
        "metadata": {"name": format!("jupyter-{n}"), "namespace": "jhub", "uid": uid,
            "annotations": {"hub.jupyter.org/username": format!("user{n}")}},
        "spec": {"containers": [{"name": "notebook", "resources": {"limits": {
            "nvidia.com/gpu": "1", "gpu-booking.io/gpumem": "4096"}}}]},
        "status": {"containerStatuses": [{"name": "notebook",
            "containerID": format!("containerd://{n:064x}"),
            "image": "x", "imageID": "", "ready": true, "restartCount": 0}]}
    }))
    .expect("pod")
}

#[tokio::main]
async fn main() {
    let seconds = env("BENCH_SECONDS", 30);
    let gpus = env("BENCH_GPUS", 8) as usize;
    let per_gpu = env("BENCH_PROCS_PER_GPU", 50);
    let proc_dir = tempfile::tempdir().expect("temp dir");
    let gpu = Arc::new(FakeGpu::new(gpus, 81_920));
    let mut pods = Vec::new();
    for g in 0..gpus {
        for i in 0..per_gpu {
            // One pod per process; PIDs well above any real one on this machine.
            let n = (g as u64) * per_gpu + i + 1;
            let pid = 3_000_000 + n as u32;
            let uid = format!("{n:08x}_0000_4000_8000_{n:012x}");
            let cgroup = format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{n:064x}.scope\n"
            );
            write_fake_process(
                proc_dir.path(),
                pid,
                n,
                &[
                    "python3",
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "/tmp/kernel.json",
                ],
                &cgroup,
            )
            .expect("fake proc");
            gpu.add_process(g, pid, 100 + n % 1500);
            // A tenth of the processes are busy.
            if n % 10 == 0 {
                gpu.set_process_util(pid, 40);
            }
            pods.push(pod(n));
        }
    }
    let cluster = Arc::new(FakeCluster::new(pods));
    let metrics = Arc::new(Metrics::new());
    let mut cfg = AgentConfig::defaults("bench-node");
    cfg.policy.idle.dry_run = true;
    let agent = Agent::new(
        cfg,
        gpu.clone(),
        cluster,
        Arc::new(RecordingAudit::default()),
        ProcFs::new(proc_dir.path()),
        metrics.clone(),
    );

    // Warm-up: the first round reads every process from /proc and lists the pods.
    let first = agent.tick(Utc::now()).await;
    assert_eq!(
        first.pods.len(),
        gpus * per_gpu as usize,
        "every process attributed"
    );
    let (rss_start, _) = memory_kib();
    let cpu_start = cpu_seconds();
    let wall_start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds = 0u64;
    let mut busiest = Duration::ZERO;
    let mut total = Duration::ZERO;
    while wall_start.elapsed() < Duration::from_secs(seconds) {
        ticks.tick().await;
        let t = Instant::now();
        let report = agent.tick(Utc::now()).await;
        let took = t.elapsed();
        assert!(report.error.is_none());
        busiest = busiest.max(took);
        total += took;
        rounds += 1;
    }
    let wall = wall_start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_start;
    let (rss, hwm) = memory_kib();
    let scrape = metrics.encode().len();
    println!(
        "agent sampling {gpus} fake GPUs x {per_gpu} processes ({} pods) every 1 s, {rounds} rounds in {wall:.1} s",
        gpus * per_gpu as usize
    );
    println!(
        "  CPU: {:.2}% of one core ({cpu:.3} s CPU); round: mean {:.2} ms, max {:.2} ms",
        100.0 * cpu / wall,
        total.as_secs_f64() * 1000.0 / rounds.max(1) as f64,
        busiest.as_secs_f64() * 1000.0
    );
    println!(
        "  memory: RSS {:.1} MiB at the start of the run, {:.1} MiB at the end, peak {:.1} MiB; /metrics body {} KiB",
        rss_start as f64 / 1024.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        scrape / 1024
    );
}
