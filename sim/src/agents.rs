//! The node agent on every GPU node of the lab: the real agent ([`gpu_booking_agent`])
//! with the real Kubernetes client (it lists its node's pods, writes the
//! `gpu-booking.io/last-gpu-activity` annotation and Events through the fake API
//! server) and the real audit client (rows land in the booking service's audit log),
//! sampling a scripted fake NVML ([`FakeGpu`]) and a fake `/proc` tree.
//!
//! What stands in for the node, in words: a **fake container runtime** that, for each
//! GPU pod the fake kubelet started on the node, starts one real process (a `sleep`:
//! the agent's SIGTERM and SIGKILL must reach a real process) as the notebook's
//! kernel, writes its `/proc/<pid>` entry with the kubelet's cgroup path for the pod's
//! container (the containerd shape, under the systemd driver) and puts it on the
//! node's fake cards, one card per GPU unit the pod holds (time-sliced units share a
//! card). Its GPU utilisation is what the scenario or the demo says
//! ([`SimCluster::set_gpu_util`](crate::SimCluster::set_gpu_util)); a pod that ends
//! takes its process with it, as the kubelet's stop would. The process exits when
//! the agent reclaims it, and the fake card frees its memory then, as the driver does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::TimeDelta;
use gpu_booking_agent::audit::{AuditSink, HttpAudit};
use gpu_booking_agent::cluster::KubeCluster;
use gpu_booking_agent::fake_gpu::FakeGpu;
use gpu_booking_agent::procfs::{write_fake_process, ProcFs};
use gpu_booking_agent::{Agent, AgentConfig, Metrics};

use crate::rendered::{LabEnvironment, RenderedChart, API_SERVICE_URL};
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

use crate::lab::GpuNode;
use crate::stack::Task;
use crate::BookingService;

/// Device memory a notebook kernel holds per card (a kernel that imported a deep
/// learning framework holds about this much before doing anything).
pub const KERNEL_MIB: u64 = 1024;

/// The command line the agent reads for a notebook's kernel (its evidence in Events
/// and audit rows); the real process behind it is a `sleep`.
const KERNEL_ARGV: [&str; 4] = [
    "/opt/conda/bin/python3",
    "-m",
    "ipykernel_launcher",
    "--gpu",
];

/// How the lab's agents run.
#[derive(Clone)]
pub struct AgentSettings {
    /// The agent's `--sample-interval`.
    pub sample_interval: Duration,
    /// The GPU utilisation (percent) of a new notebook's kernel: 0 is a kernel that
    /// waits for its user.
    pub notebook_util: u32,
    /// Adjusts each node's agent configuration (it starts at the agent's defaults
    /// with the lab's timings, see [`AgentSettings::config`]).
    pub configure: Arc<dyn Fn(&mut AgentConfig) + Send + Sync>,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            sample_interval: Duration::from_secs(1),
            notebook_util: 0,
            configure: Arc::new(|_| {}),
        }
    }
}

impl AgentSettings {
    /// The agent's defaults (the PRD's idle window, reclaim on, the watchdog a dry
    /// run) with the lab's timings: the API server is in this process, so the pod
    /// list is re-read every round and the last-activity annotation follows each
    /// second of activity; a short grace between SIGTERM and SIGKILL.
    pub fn config(&self, node: &str) -> AgentConfig {
        self.lab_config(AgentConfig::defaults(node))
    }

    /// `cfg` (the agent's defaults, or the chart's DaemonSet's options) with the
    /// lab's timings, then the scenario's adjustments.
    pub fn lab_config(&self, mut cfg: AgentConfig) -> AgentConfig {
        cfg.policy.sample_interval = self.sample_interval;
        cfg.term_grace = Duration::from_secs(2);
        cfg.kill_wait = Duration::from_secs(2);
        cfg.annotation_min_change = TimeDelta::seconds(1);
        let interval = TimeDelta::from_std(self.sample_interval).unwrap_or(TimeDelta::seconds(1));
        cfg.pod_refresh = interval;
        cfg.pod_refresh_on_miss = TimeDelta::zero();
        (self.configure)(&mut cfg);
        cfg
    }
}

/// The agent's configuration on `node` from the chart's DaemonSet's environment
/// ([`crate::rendered`]), its volumes under `volumes`.
fn chart_config(
    chart: &RenderedChart,
    node: &str,
    booking: &BookingService,
    token_file: &Path,
    volumes: &Path,
) -> anyhow::Result<AgentConfig> {
    #[derive(clap::Parser)]
    struct AgentCli {
        #[command(flatten)]
        args: gpu_booking_agent::AgentArgs,
    }
    let lab = LabEnvironment {
        pod_name: format!("{AGENT_DAEMONSET}-{node}"),
        node_name: Some(node.to_owned()),
        services: vec![(API_SERVICE_URL.to_owned(), booking.url.clone())],
        token_file: Some(token_file.to_owned()),
        ..LabEnvironment::default()
    };
    let workload = chart.workload("DaemonSet", AGENT_DAEMONSET)?;
    let cli: AgentCli = crate::rendered::options(&workload, &lab, volumes, &[])?;
    cli.args.agent_config()
}

/// The chart's node agent DaemonSet (release `gpu-booking`).
const AGENT_DAEMONSET: &str = "gpu-booking-agent";

/// A notebook kernel on the node's cards.
struct Workload {
    pid: u32,
    /// Units (card index times replicas plus replica) it holds.
    slots: Vec<u32>,
    kill: Option<oneshot::Sender<()>>,
}

/// One GPU node: its fake cards, its fake `/proc`, its runtime's processes and its
/// agent.
pub struct NodeGpus {
    pub node: String,
    pub gpu: Arc<FakeGpu>,
    pub agent: Arc<Agent>,
    proc_dir: tempfile::TempDir,
    /// Units on the node (cards times time-slicing replicas, or MIG slices).
    units: u32,
    /// Units per card.
    replicas: u32,
    notebook_util: u32,
    workloads: Mutex<HashMap<String, Workload>>,
}

/// Distinct fake start times (the agent tells processes apart by PID and start time).
static START_TIMES: AtomicU64 = AtomicU64::new(1_000);

impl NodeGpus {
    fn new(
        node: &GpuNode,
        agent_of: impl FnOnce(Arc<FakeGpu>, ProcFs) -> Arc<Agent>,
        notebook_util: u32,
    ) -> anyhow::Result<Self> {
        let (cards, units, replicas) = match &node.mig {
            // Each MIG slice is a device of its own to NVML.
            Some(mig) => (mig.count, mig.count, 1),
            None => (node.gpus, node.gpus * node.replicas, node.replicas.max(1)),
        };
        // Cards of the node's other models are devices too (each pod holds one).
        let others: u32 = node.own_resource_cards.iter().map(|c| c.count).sum();
        let (cards, units) = (cards + others, units + others);
        let card_mib = node.mig.as_ref().map_or(node.memory_mib, |m| m.memory_mib);
        let gpu = Arc::new(FakeGpu::new(cards as usize, card_mib));
        let proc_dir = tempfile::tempdir()?;
        let agent = agent_of(gpu.clone(), ProcFs::new(proc_dir.path()));
        Ok(Self {
            node: node.name.clone(),
            gpu,
            agent,
            proc_dir,
            units,
            replicas,
            notebook_util,
            workloads: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Workload>> {
        self.workloads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The PID of the kernel of pod `uid`, while it holds the GPU.
    pub fn kernel_pid(&self, uid: &str) -> Option<u32> {
        let pid = self.lock().get(uid).map(|w| w.pid)?;
        self.gpu.holds(pid).then_some(pid)
    }

    /// Starts a kernel for each running GPU pod of this node that has none, and
    /// stops the kernels of pods that are ending or gone.
    fn reconcile(&self, pods: &[Pod]) {
        let mut running: BTreeMap<String, (&Pod, String, u64)> = BTreeMap::new();
        for pod in pods {
            let bound_here =
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str());
            let started = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let units = crate::view::gpus_of(pod);
            if !bound_here || !started || pod.metadata.deletion_timestamp.is_some() || units == 0 {
                continue;
            }
            let (Some(uid), Some(container)) = (pod.metadata.uid.clone(), gpu_container_id(pod))
            else {
                continue;
            };
            running.insert(uid, (pod, container, units));
        }
        let mut workloads = self.lock();
        let gone: Vec<String> = workloads
            .keys()
            .filter(|uid| !running.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(mut w) = workloads.remove(&uid) {
                // The kubelet stops the containers of a pod that ends.
                self.gpu.remove_process(w.pid);
                if let Some(kill) = w.kill.take() {
                    let _ = kill.send(());
                }
            }
        }
        for (uid, (pod, container, units)) in running {
            if workloads.contains_key(&uid) {
                continue;
            }
            let held: BTreeSet<u32> = workloads
                .values()
                .flat_map(|w| w.slots.iter().copied())
                .collect();
            let slots: Vec<u32> = (0..self.units)
                .filter(|s| !held.contains(s))
                .take(usize::try_from(units).unwrap_or(usize::MAX))
                .collect();
            if slots.is_empty() {
                // The scheduler never binds past allocatable; nothing to put it on.
                tracing::warn!(node = %self.node, pod = ?pod.metadata.name, "no free GPU unit for the notebook's kernel");
                continue;
            }
            match self.start_kernel(&uid, &container, &slots) {
                Ok(w) => {
                    workloads.insert(uid, w);
                }
                Err(e) => {
                    tracing::error!(node = %self.node, pod = ?pod.metadata.name, error = %e, "starting the notebook's kernel failed")
                }
            }
        }
    }

    fn start_kernel(&self, uid: &str, container: &str, slots: &[u32]) -> anyhow::Result<Workload> {
        let mut child = tokio::process::Command::new("sleep")
            .arg("2147483647")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the kernel exited at once"))?;
        let start_time = START_TIMES.fetch_add(1, Ordering::Relaxed);
        let root = self.proc_dir.path().to_owned();
        write_fake_process(
            &root,
            pid,
            start_time,
            &KERNEL_ARGV,
            &cgroup(uid, container),
        )?;
        let cards: BTreeSet<usize> = slots.iter().map(|s| (s / self.replicas) as usize).collect();
        for card in cards {
            self.gpu.add_process(card, pid, KERNEL_MIB);
        }
        self.gpu.set_process_util(pid, self.notebook_util);
        // Its memory is freed once it has exited, whoever ended it.
        self.gpu.follow_real_process(pid);
        let (kill, killed) = oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::select! {
                _ = child.wait() => {}
                _ = killed => {
                    let _ = child.kill().await;
                }
            }
            remove_fake_process(&root, pid, start_time);
        });
        Ok(Workload {
            pid,
            slots: slots.to_vec(),
            kill: Some(kill),
        })
    }

    /// Stops every kernel (the node goes away with the lab).
    fn stop_all(&self) {
        for (_, mut w) in self.lock().drain() {
            if let Some(kill) = w.kill.take() {
                let _ = kill.send(());
            }
        }
    }
}

/// The cgroup file of a process in `container` of pod `uid`: cgroup v2, the systemd
/// driver, containerd (the agent's parser reads every shape the kubelet writes).
fn cgroup(uid: &str, container: &str) -> String {
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container}.scope\n",
        uid.replace('-', "_")
    )
}

/// The runtime ID of the pod's first container that asks for a GPU (the notebook),
/// without the `containerd://` prefix.
fn gpu_container_id(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let name = spec
        .containers
        .iter()
        .find(|c| crate::view::container_gpus(c) > 0)
        .or_else(|| spec.containers.first())?
        .name
        .clone();
    let id = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == name)?
        .container_id
        .clone()?;
    Some(
        id.split_once("://")
            .map_or(id.clone(), |(_, id)| id.to_owned()),
    )
}

/// Removes the fake `/proc/<pid>` of an exited kernel, unless the PID was reused and
/// the entry is another kernel's.
fn remove_fake_process(root: &Path, pid: u32, start_time: u64) {
    let dir: PathBuf = root.join(pid.to_string());
    let ours = ProcFs::new(root)
        .stat(pid)
        .is_ok_and(|(start, _)| start == start_time);
    if ours {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The agents of the lab's GPU nodes and the runtime that feeds them.
pub struct NodeAgents {
    pub nodes: Vec<Arc<NodeGpus>>,
    tasks: Vec<Task>,
}

impl NodeAgents {
    /// Starts an agent per GPU node of `nodes` on `server`, reporting to `booking`
    /// with the agent's ServiceAccount token in `token_file`.
    pub fn start(
        server: &FakeApiServer,
        nodes: &[GpuNode],
        booking: &BookingService,
        token_file: &Path,
        settings: &AgentSettings,
        chart: Option<(&RenderedChart, &Path)>,
    ) -> anyhow::Result<Self> {
        let mut gpus = Vec::new();
        let mut tasks = Vec::new();
        for node in nodes.iter().filter(|n| n.product.is_some()) {
            let cfg = match chart {
                Some((chart, volumes)) => settings.lab_config(chart_config(
                    chart, &node.name, booking, token_file, volumes,
                )?),
                None => settings.config(&node.name),
            };
            let audit: Arc<dyn AuditSink> = Arc::new(HttpAudit::new(
                &booking.url,
                gpu_booking_client::TokenSource::file(token_file.to_owned())?,
                Duration::from_secs(5),
            )?);
            // As the agent's ServiceAccount, which the chart's RBAC and admission
            // policy bound.
            let client = server.client_as(
                &crate::service_accounts::username(crate::service_accounts::AGENT),
                &crate::service_accounts::GROUPS,
            );
            let cluster = Arc::new(KubeCluster::new(client, node.name.clone()));
            let n = Arc::new(NodeGpus::new(
                node,
                |gpu, proc| Agent::new(cfg, gpu, cluster, audit, proc, Arc::new(Metrics::new())),
                settings.notebook_util,
            )?);
            let agent = n.agent.clone();
            let interval = settings.sample_interval;
            tasks.push(Task::spawn(|rx| async move {
                gpu_booking_agent::run_loop(agent, interval, crate::stack::stopped(rx)).await;
            }));
            gpus.push(n);
        }
        let runtime_nodes = gpus.clone();
        let server = server.clone();
        tasks.push(Task::spawn(|mut rx| async move {
            loop {
                let seen = server.resource_version();
                let pods = server.list::<Pod>(None);
                for n in &runtime_nodes {
                    n.reconcile(&pods);
                }
                tokio::select! {
                    _ = server.wait_until(|s| s.resource_version() != seen) => {}
                    _ = rx.wait_for(|stop| *stop) => break,
                }
            }
            for n in &runtime_nodes {
                n.stop_all();
            }
        }));
        Ok(Self { nodes: gpus, tasks })
    }

    /// The node `name`'s GPUs and agent.
    pub fn node(&self, name: &str) -> Option<&Arc<NodeGpus>> {
        self.nodes.iter().find(|n| n.node == name)
    }

    pub async fn stop(self) {
        for task in self.tasks {
            task.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_booking_agent::audit::RecordingAudit;
    use gpu_booking_agent::fake_cluster::FakeCluster;
    use gpu_booking_agent::gpu::GpuSampler;
    use serde_json::json;

    fn node(gpu: &GpuNode) -> NodeGpus {
        NodeGpus::new(
            gpu,
            |fake, proc| {
                Agent::new(
                    AgentSettings::default().config(&gpu.name),
                    fake,
                    Arc::new(FakeCluster::default()),
                    Arc::new(RecordingAudit::default()),
                    proc,
                    Arc::new(Metrics::new()),
                )
            },
            0,
        )
        .unwrap()
    }

    /// A notebook bound to `node` and started by the fake kubelet.
    fn running(n: u32, node: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("nb-{n}"), "namespace": "jhub",
                "uid": format!("00000000-0000-4000-8000-{n:012x}")},
            "spec": {"nodeName": node, "containers": [{"name": "notebook",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "notebook",
                "containerID": format!("containerd://{n:064x}"), "image": "", "imageID": "",
                "ready": true, "restartCount": 0}]}
        }))
        .unwrap()
    }

    fn card_pids(n: &NodeGpus) -> Vec<Vec<u32>> {
        n.gpu
            .sample()
            .unwrap()
            .iter()
            .map(|c| c.processes.iter().map(|p| p.pid).collect())
            .collect()
    }

    #[tokio::test]
    async fn time_sliced_units_share_a_card_and_kernels_end_with_their_pods() {
        // Two cards, each shared by two pods.
        let n = node(&GpuNode::gpu("ts", "NVIDIA-RTX-A6000", 2, 49152).time_sliced(2));
        let pods = vec![
            running(1, "ts", 1),
            running(2, "ts", 1),
            running(3, "ts", 1),
        ];
        n.reconcile(&pods);
        let cards = card_pids(&n);
        assert_eq!(cards.len(), 2, "one fake card per physical card");
        assert_eq!(
            cards[0].len(),
            2,
            "two time-sliced units on card 0: {cards:?}"
        );
        assert_eq!(cards[1].len(), 1, "{cards:?}");
        // Its /proc entry names the pod's container, as the agent reads it.
        let pid = n
            .kernel_pid("00000000-0000-4000-8000-000000000001")
            .unwrap();
        let info = ProcFs::new(n.proc_dir.path()).process(pid).unwrap();
        let container = info.container.expect("attributed to a container");
        assert_eq!(container.pod_uid, "00000000-0000-4000-8000-000000000001");
        assert_eq!(container.container_id, format!("{:064x}", 1));

        // The first pod ends: its kernel exits and leaves the card; its unit is free.
        n.reconcile(&pods[1..]);
        tokio::time::timeout(Duration::from_secs(10), async {
            while std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z"))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the ended pod's kernel exits");
        assert!(!card_pids(&n).iter().flatten().any(|p| *p == pid));
        n.reconcile(&[pods[1].clone(), pods[2].clone(), running(4, "ts", 1)]);
        assert_eq!(card_pids(&n)[0].len(), 2, "the freed unit is taken again");
        n.stop_all();
    }

    #[tokio::test]
    async fn mig_slices_are_cards_and_pods_elsewhere_or_without_gpus_get_no_kernel() {
        let n =
            node(&GpuNode::gpu("mig", "NVIDIA-A100-SXM4-40GB", 1, 40960).mig("1g.5gb", 7, 4864));
        assert_eq!(
            card_pids(&n).len(),
            7,
            "NVML lists each MIG slice as a device"
        );
        n.reconcile(&[running(1, "other-node", 1), running(2, "mig", 0)]);
        assert!(card_pids(&n).iter().all(Vec::is_empty));
        n.stop_all();
    }
}
