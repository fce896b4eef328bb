//! A fake node for the agent's tests: a scripted fake GPU, a fake `/proc` tree in a
//! temp dir, a fake cluster with the node's pods, and a recording audit sink. GPU
//! processes that may be signalled are real child processes of the test.
#![allow(dead_code)]

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_agent::agent::{Agent, AgentConfig, TickReport};
use gpu_booking_agent::audit::RecordingAudit;
use gpu_booking_agent::fake_cluster::FakeCluster;
use gpu_booking_agent::fake_gpu::FakeGpu;
use gpu_booking_agent::procfs::{write_fake_process, ProcFs};
use gpu_booking_agent::signal_policy::SignalSequence;
use gpu_booking_agent::Metrics;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

pub const GPU_MIB: u64 = 16_000;

pub fn uid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

pub fn cid(n: u32) -> String {
    format!("{n:064x}")
}

/// The cgroup shapes a node can have, by number: containerd (systemd, v2), cgroupfs
/// (v1), CRI-O (systemd, v2), docker (systemd, v1 + hybrid).
pub fn cgroup(shape: usize, pod_uid: &str, container_id: &str) -> String {
    let u = pod_uid.replace('-', "_");
    match shape % 4 {
        0 => format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{container_id}.scope\n"
        ),
        1 => format!(
            "12:pids:/kubepods/besteffort/pod{pod_uid}/{container_id}\n11:memory:/kubepods/besteffort/pod{pod_uid}/{container_id}\n1:name=systemd:/kubepods/besteffort/pod{pod_uid}/{container_id}\n"
        ),
        2 => format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{container_id}.scope\n"
        ),
        _ => format!(
            "4:devices:/kubepods.slice/kubepods-pod{u}.slice/docker-{container_id}.scope\n0::/\n"
        ),
    }
}

/// A pod as the API server returns it.
pub struct PodSpec {
    value: Value,
}

pub fn pod(ns: &str, name: &str, n: u32) -> PodSpec {
    PodSpec {
        value: json!({
            "metadata": {"name": name, "namespace": ns, "uid": uid(n),
                "annotations": {"hub.jupyter.org/username": format!("user-{name}")}, "labels": {}},
            "spec": {"nodeName": "gpu-node-1", "containers": [
                {"name": "notebook", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]},
            "status": {"containerStatuses": [{"name": "notebook",
                "containerID": format!("containerd://{}", cid(n)),
                "image": "jupyter", "imageID": "", "ready": true, "restartCount": 0}]}
        }),
    }
}

impl PodSpec {
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.value["metadata"]["annotations"][k] = json!(v);
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.value["metadata"]["labels"][k] = json!(v);
        self
    }

    /// Booked, as the webhook admits a booked pod: our priority label and our high
    /// priority class, which the API server resolved into `spec.priority`.
    pub fn booked(mut self) -> Self {
        self.value["spec"]["priorityClassName"] = json!("gpu-booking-high");
        self.value["spec"]["priority"] = json!(1000);
        self.label("gpu-booking.io/priority", "high")
    }

    /// Lent, as the webhook admits a pod lent a free GPU.
    pub fn lent(mut self) -> Self {
        self.value["spec"]["priorityClassName"] = json!("gpu-booking-low");
        self.value["spec"]["priority"] = json!(-10);
        self.label("gpu-booking.io/priority", "low")
    }

    /// A VRAM budget of `mib` on the notebook container (as the webhook sets it).
    pub fn budget(mut self, mib: u64) -> Self {
        let r = &mut self.value["spec"]["containers"][0]["resources"];
        r["limits"]["gpu-booking.io/gpumem"] = json!(mib.to_string());
        r["requests"] = json!({"gpu-booking.io/gpumem": mib.to_string()});
        self
    }

    pub fn build(self) -> Pod {
        serde_json::from_value(self.value).expect("pod fixture")
    }
}

pub struct Node {
    pub proc_dir: tempfile::TempDir,
    pub gpu: Arc<FakeGpu>,
    pub cluster: Arc<FakeCluster>,
    pub audit: Arc<RecordingAudit>,
    pub metrics: Arc<Metrics>,
    pub agent: Arc<Agent>,
    pub t0: DateTime<Utc>,
    pub children: Vec<Child>,
}

/// The PRD's settings (reclaim at the end of the window, unwarned; SIGTERM, then
/// SIGKILL), with a short grace so that the signal tests stay quick. What we add to
/// the PRD (the warning, the interrupt first) is tested with [`our_defaults`].
pub fn config() -> AgentConfig {
    let mut cfg = our_defaults();
    cfg.reclaim_warning = TimeDelta::zero();
    cfg.reclaim_signals = SignalSequence::term_kill();
    cfg
}

/// The agent's defaults, with a short grace so that the signal tests stay quick.
pub fn our_defaults() -> AgentConfig {
    let mut cfg = AgentConfig::defaults("gpu-node-1");
    cfg.term_grace = Duration::from_millis(300);
    cfg.kill_wait = Duration::from_secs(5);
    cfg
}

impl Node {
    pub fn new(cfg: AgentConfig, pods: Vec<Pod>) -> Self {
        Self::with_gpu(cfg, pods, FakeGpu::new(2, GPU_MIB))
    }

    pub fn with_gpu(cfg: AgentConfig, pods: Vec<Pod>, gpu: FakeGpu) -> Self {
        let proc_dir = tempfile::tempdir().expect("temp dir");
        let gpu = Arc::new(gpu);
        let cluster = Arc::new(FakeCluster::new(pods));
        let audit = Arc::new(RecordingAudit::default());
        let metrics = Arc::new(Metrics::new());
        let agent = Agent::new(
            cfg,
            gpu.clone(),
            cluster.clone(),
            audit.clone(),
            ProcFs::new(proc_dir.path()),
            metrics.clone(),
        );
        Self {
            proc_dir,
            gpu,
            cluster,
            audit,
            metrics,
            agent,
            t0: DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
            children: Vec::new(),
        }
    }

    /// A real child process (`argv`), placed in the fake /proc under the pod's
    /// container cgroup, holding `used_mib` on GPU `gpu`. Returns its PID.
    pub fn spawn_in(&mut self, argv: &[&str], gpu: usize, cgroup_text: &str, used_mib: u64) -> u32 {
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let pid = child.id().expect("pid");
        self.children.push(child);
        write_fake_process(
            self.proc_dir.path(),
            pid,
            u64::from(pid) * 7 + 11,
            argv,
            cgroup_text,
        )
        .expect("fake proc");
        self.gpu.add_process(gpu, pid, used_mib);
        self.gpu.follow_real_process(pid);
        pid
    }

    /// `sleep 60` in pod number `n`'s notebook container (cgroup shape `shape`).
    pub fn sleeper(&mut self, n: u32, shape: usize, gpu: usize, used_mib: u64) -> u32 {
        let cg = cgroup(shape, &uid(n), &cid(n));
        self.spawn_in(&["sleep", "60"], gpu, &cg, used_mib)
    }

    /// A fake (not running) process in the fake /proc only.
    pub fn fake_process(
        &self,
        pid: u32,
        argv: &[&str],
        gpu: usize,
        cgroup_text: &str,
        used_mib: u64,
    ) {
        write_fake_process(self.proc_dir.path(), pid, 5, argv, cgroup_text).expect("fake proc");
        self.gpu.add_process(gpu, pid, used_mib);
    }

    pub fn at(&self, minute: i64) -> DateTime<Utc> {
        self.t0 + TimeDelta::minutes(minute)
    }

    pub async fn tick(&self, minute: i64) -> TickReport {
        self.agent.tick(self.at(minute)).await
    }

    /// Ticks once a minute from `from` to `to` (inclusive); returns every report.
    pub async fn ticks(&self, from: i64, to: i64) -> Vec<TickReport> {
        let mut out = Vec::new();
        for m in from..=to {
            out.push(self.tick(m).await);
        }
        out
    }

    /// How the child with `pid` ended: `Some(signal)`, or `None` while it runs.
    pub async fn ended_by(&mut self, pid: u32) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let child = self.children.iter_mut().find(|c| c.id() == Some(pid))?;
        match child.try_wait().expect("try_wait") {
            Some(status) => status.signal(),
            None => None,
        }
    }

    pub fn running(&mut self, pid: u32) -> bool {
        self.children
            .iter_mut()
            .find(|c| c.id() == Some(pid))
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn metrics_text(&self) -> String {
        self.metrics.encode()
    }
}

/// The value of one series in the exposition text, e.g.
/// `gpu_booking_agent_kill_total{signal="TERM"}`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// Waits until `pid` has exec'd into `comm` (so its signal dispositions are set).
pub async fn wait_for_exec(pid: u32, comm: &str) {
    for _ in 0..500 {
        let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if now.trim() == comm {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{pid} did not exec {comm}");
}
