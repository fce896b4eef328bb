//! One sampling round ([`Agent::tick`]): read the GPUs, attribute their processes to
//! pod containers, update idle times, metrics and the last-activity annotation, then
//! pick what to reclaim (idle pods, each warned first, [`crate::reclaim_warning`]) and
//! what to recycle (the VRAM watchdog), re-check it against a fresh sample, and hand
//! the plans ([`crate::action`]) to the actor ([`crate::actor`]), which carries them
//! out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use gpu_booking_core::admission::AdmissionConfig;
use gpu_booking_core::eviction::{under_vram_floor, watchdog_pick, OverBudget, VramTenant};

use crate::action::{warning_event, ActionKind, ActionPlan, ActionReport, PlanSettings};
use crate::actor::Actor;
use crate::audit::AuditSink;
use crate::cluster::Cluster;
use crate::gpu::{GpuSample, GpuSampler, MeteredSampler};
use crate::idle::{IdleTracker, Observation};
use crate::metrics::{GpuLabels, Metrics, PodGpuLabels, PodLabels, ReasonLabel};
use crate::pod_usage::{AttributedProcess, PodUsage};
use crate::pods::{PodIndex, PodInfo};
use crate::procfs::{ProcError, ProcFs, ProcessInfo};
use crate::reclaim_policy::Policy;
use crate::reclaim_warning::{Next, Warned, Warnings};
use crate::signal_policy::SignalSequence;
use crate::signals::Killer;

const MIB: u64 = 1024 * 1024;

/// The annotation that carries a pod's last GPU activity for the controller.
pub const DEFAULT_LAST_ACTIVITY_ANNOTATION: &str =
    gpu_booking_core::admission::LAST_GPU_ACTIVITY_ANNOTATION;

/// Every reason a GPU process can be left unattributed (the gauge's label values).
const UNATTRIBUTED_REASONS: [&str; 7] = [
    "not_in_pod",
    "no_container",
    "conflicting_cgroups",
    "unknown_pod",
    "unknown_container",
    "proc_unreadable",
    "pods_unavailable",
];

/// Everything the agent is told, checked by [`crate::config::AgentArgs`].
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    pub policy: Policy,
    /// A pod idle for its whole window is warned (an Event) this long before its
    /// GPU processes end; zero: no warning.
    pub reclaim_warning: TimeDelta,
    /// The signals that end GPU processes, in order.
    pub reclaim_signals: SignalSequence,
    /// After each signal but SIGKILL, before the next.
    pub term_grace: Duration,
    /// How long to wait for an exit after SIGKILL.
    pub kill_wait: Duration,
    pub max_reclaim_retry: u32,
    pub vram_watchdog: bool,
    pub vram_floor_mib: u64,
    pub vram_dry_run: bool,
    /// How pods are read: the VRAM budget resource and our priority classes (the
    /// rest of it is the webhook's and unused here).
    pub admission: AdmissionConfig,
    /// Empty: the annotation is not written.
    pub last_activity_annotation: String,
    /// The annotation is rewritten only when the time moved at least this much.
    pub annotation_min_change: TimeDelta,
    /// The pod list is re-read at least this often.
    pub pod_refresh: TimeDelta,
    /// ... and sooner, but not more often than this, when a GPU process names a pod
    /// or container the list does not have yet.
    pub pod_refresh_on_miss: TimeDelta,
}

impl AgentConfig {
    /// The PRD's and the ADR's defaults.
    pub fn defaults(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            policy: Policy::defaults(),
            reclaim_warning: TimeDelta::minutes(5),
            reclaim_signals: SignalSequence::default(),
            term_grace: Duration::from_secs(15),
            kill_wait: Duration::from_secs(5),
            max_reclaim_retry: 2,
            vram_watchdog: true,
            vram_floor_mib: 1536,
            vram_dry_run: true,
            admission: AdmissionConfig::default(),
            last_activity_annotation: DEFAULT_LAST_ACTIVITY_ANNOTATION.into(),
            annotation_min_change: TimeDelta::minutes(1),
            pod_refresh: TimeDelta::seconds(30),
            pod_refresh_on_miss: TimeDelta::seconds(10),
        }
    }
}

/// A GPU process left alone because it is not clearly a pod container's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unattributed {
    pub pid: u32,
    pub gpu_index: u32,
    pub reason: &'static str,
    pub cmdline: String,
}

/// What one tick saw and did (for tests, the benchmark and `--once`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TickReport {
    pub gpus: usize,
    /// `namespace/name` of every pod with GPU processes.
    pub pods: Vec<String>,
    pub unattributed: Vec<Unattributed>,
    /// System processes (process allowlist) left alone.
    pub allowlisted_processes: usize,
    pub idle_candidates: usize,
    /// Pods warned this round that their GPU processes end unless they use the GPU.
    pub warned: Vec<String>,
    /// Pods whose warning was withdrawn this round (they used the GPU, or are exempt
    /// or gone).
    pub withdrawn: Vec<String>,
    /// Pods picked for an action that the re-check found active again.
    pub rechecked_active: Vec<String>,
    pub actions: Vec<ActionReport>,
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
struct CachedProcess {
    info: Arc<ProcessInfo>,
}

#[derive(Default)]
struct State {
    pods: PodIndex,
    pods_loaded: bool,
    pods_attempted: Option<DateTime<Utc>>,
    processes: HashMap<u32, CachedProcess>,
    unattributed: HashSet<(u32, u64)>,
    tracker: IdleTracker,
    warnings: Warnings,
    under_floor: HashSet<String>,
    /// When the watchdog last reported a dry run for a pod, so that a pod that stays
    /// over budget under pressure is reported every [`VRAM_DRY_RUN_REPEAT`], not
    /// every round.
    vram_dry_runs: HashMap<String, DateTime<Utc>>,
}

/// How often a dry run of the watchdog reports the same pod again.
pub const VRAM_DRY_RUN_REPEAT: TimeDelta = TimeDelta::minutes(10);

/// The agent: its collaborators and what it remembers between ticks.
pub struct Agent {
    pub(crate) cfg: AgentConfig,
    sampler: MeteredSampler,
    /// The pods and their annotations (the actor has its own handle for Events).
    cluster: Arc<dyn Cluster>,
    proc: ProcFs,
    /// Carries out the plans (signals, Events, audit rows).
    actor: Arc<Actor>,
    pub(crate) metrics: Arc<Metrics>,
    state: tokio::sync::Mutex<State>,
}

impl Agent {
    pub fn new(
        cfg: AgentConfig,
        gpu: Arc<dyn GpuSampler>,
        cluster: Arc<dyn Cluster>,
        audit: Arc<dyn AuditSink>,
        proc: ProcFs,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let sampler = MeteredSampler::new(gpu, metrics.clone());
        let actor = Arc::new(Actor {
            settings: PlanSettings {
                node_name: cfg.node_name.clone(),
                vram_dry_run: cfg.vram_dry_run,
                vram_floor_mib: cfg.vram_floor_mib,
            },
            max_reclaim_retry: cfg.max_reclaim_retry,
            sampler: sampler.clone(),
            killer: Killer::new(
                proc.clone(),
                cfg.reclaim_signals.clone(),
                cfg.term_grace,
                cfg.kill_wait,
            ),
            cluster: cluster.clone(),
            audit,
            metrics: metrics.clone(),
        });
        Arc::new(Self {
            cfg,
            sampler,
            cluster,
            proc,
            actor,
            metrics,
            state: tokio::sync::Mutex::new(State::default()),
        })
    }

    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// One round at time `now`.
    pub async fn tick(self: &Arc<Self>, now: DateTime<Utc>) -> TickReport {
        let started = std::time::Instant::now();
        let report = self.tick_inner(now).await;
        self.metrics
            .tick_duration
            .observe(started.elapsed().as_secs_f64());
        report
    }

    async fn tick_inner(self: &Arc<Self>, now: DateTime<Utc>) -> TickReport {
        let mut report = TickReport::default();
        let samples = match self.sampler.sample(false).await {
            Ok(samples) => samples,
            Err(e) => {
                tracing::warn!(node = %self.cfg.node_name, error = %e, "GPU sample failed; nothing done this round");
                report.error = Some(e.to_string());
                return report;
            }
        };
        report.gpus = samples.len();
        let mut state = self.state.lock().await;
        self.refresh_pods(&mut state, now, false).await;
        let usage = self.attribute(&mut state, &samples, now, &mut report).await;
        report.pods = usage.values().map(|u| u.pod.key()).collect();
        self.observe(&mut state, &samples, &usage, now);
        self.write_last_activity(&mut state, &usage).await;

        let idle = self.idle_candidates(&state, &usage, now);
        report.idle_candidates = idle.len();
        self.metrics.idle_candidates.set(idle.len() as i64);
        let idle = self
            .warn_first(&mut state, &samples, &usage, idle, now, &mut report)
            .await;
        let vram = self.vram_choices(&mut state, &samples, &usage, &idle, now);
        if idle.is_empty() && vram.is_empty() {
            return report;
        }
        let plans = self
            .recheck(&mut state, &samples, &usage, idle, vram, now, &mut report)
            .await;
        drop(state);

        let mut running = tokio::task::JoinSet::new();
        for plan in plans {
            let actor = self.actor.clone();
            running.spawn(async move { actor.act(plan).await });
        }
        while let Some(done) = running.join_next().await {
            match done {
                Ok(action) => report.actions.push(action),
                Err(e) => tracing::error!(error = %e, "reclaim task failed"),
            }
        }
        report.actions.sort_by(|a, b| a.pod.cmp(&b.pod));
        let mut state = self.state.lock().await;
        for action in &report.actions {
            match action.kind {
                ActionKind::IdleReclaim => {
                    state.tracker.restart(&action.uid);
                    state.warnings.forget(&action.uid);
                }
                ActionKind::VramRecycle if action.result == "dry_run" => {
                    state.vram_dry_runs.insert(action.uid.clone(), now);
                }
                ActionKind::VramRecycle => {}
            }
        }
        report
    }

    async fn refresh_pods(&self, state: &mut State, now: DateTime<Utc>, on_miss: bool) -> bool {
        let every = if on_miss {
            self.cfg.pod_refresh_on_miss
        } else {
            self.cfg.pod_refresh
        };
        if state.pods_attempted.is_some_and(|t| now - t < every) {
            return false;
        }
        state.pods_attempted = Some(now);
        match self.cluster.node_pods().await {
            Ok(pods) => {
                self.metrics.call("pods", true);
                state.pods = PodIndex::new(
                    pods.iter()
                        .filter_map(|p| PodInfo::from_pod(p, &self.cfg.admission)),
                );
                state.pods_loaded = true;
                true
            }
            Err(e) => {
                self.metrics.call("pods", false);
                tracing::warn!(error = %e, "listing the node's pods failed; using the last list");
                false
            }
        }
    }

    /// The process behind a GPU PID, from the cache while its start time is unchanged.
    fn process(&self, state: &mut State, pid: u32) -> Result<Arc<ProcessInfo>, ProcError> {
        if let Some(cached) = state.processes.get(&pid) {
            if matches!(self.proc.stat(pid), Ok((start, _)) if start == cached.info.start_time) {
                return Ok(cached.info.clone());
            }
        }
        let info = Arc::new(self.proc.process(pid)?);
        state
            .processes
            .insert(pid, CachedProcess { info: info.clone() });
        Ok(info)
    }

    async fn attribute(
        &self,
        state: &mut State,
        samples: &[GpuSample],
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> BTreeMap<String, PodUsage> {
        let mut usage: BTreeMap<String, PodUsage> = BTreeMap::new();
        let mut seen = HashSet::new();
        let mut unattributed_now = HashSet::new();
        let mut refreshed = false;
        for (gi, gpu) in samples.iter().enumerate() {
            for p in &gpu.processes {
                let info = match self.process(state, p.pid) {
                    Ok(info) => info,
                    // Exited between NVML's answer and now.
                    Err(ProcError::Gone(_)) => continue,
                    Err(e) => {
                        tracing::debug!(pid = p.pid, error = %e, "process unreadable");
                        report.unattributed.push(Unattributed {
                            pid: p.pid,
                            gpu_index: gpu.index,
                            reason: "proc_unreadable",
                            cmdline: String::new(),
                        });
                        continue;
                    }
                };
                seen.insert(p.pid);
                if self.cfg.policy.process_allowlisted(&info) {
                    report.allowlisted_processes += 1;
                    continue;
                }
                let miss = |reason: &'static str| Unattributed {
                    pid: p.pid,
                    gpu_index: gpu.index,
                    reason,
                    cmdline: info.cmdline.clone(),
                };
                let cref = match &info.container {
                    Ok(c) => c.clone(),
                    Err(why) => {
                        report.unattributed.push(miss(why.as_str()));
                        unattributed_now.insert((p.pid, info.start_time));
                        continue;
                    }
                };
                let mut resolved = state.pods.resolve(&cref);
                if resolved.is_err() && !refreshed {
                    refreshed = self.refresh_pods(state, now, true).await;
                    resolved = state.pods.resolve(&cref);
                }
                let (pod, container) = match resolved {
                    Ok(found) => found,
                    Err(why) => {
                        let reason = if state.pods_loaded {
                            why.as_str()
                        } else {
                            "pods_unavailable"
                        };
                        report.unattributed.push(miss(reason));
                        unattributed_now.insert((p.pid, info.start_time));
                        continue;
                    }
                };
                let entry = usage.entry(pod.uid.clone()).or_insert_with(|| PodUsage {
                    pod: pod.clone(),
                    processes: Vec::new(),
                });
                entry.processes.push(AttributedProcess {
                    info: info.clone(),
                    container_ref: cref,
                    container,
                    gpu: gi,
                    used_bytes: p.used_bytes.unwrap_or(0),
                    util_percent: gpu.process_util(p.pid),
                });
            }
        }
        state.processes.retain(|pid, _| seen.contains(pid));
        self.count_unattributed(state, report, unattributed_now);
        usage
    }

    /// Counts each unattributed process once (and logs it once), and sets the gauge.
    fn count_unattributed(&self, state: &mut State, report: &TickReport, now: HashSet<(u32, u64)>) {
        for u in &report.unattributed {
            let start = state.processes.get(&u.pid).map_or(0, |c| c.info.start_time);
            if !state.unattributed.contains(&(u.pid, start)) {
                self.metrics.attribution_failures.inc();
                tracing::warn!(
                    node = %self.cfg.node_name,
                    gpu_index = u.gpu_index,
                    pid = u.pid,
                    cmdline = %u.cmdline,
                    reason = u.reason,
                    action = "none",
                    "GPU process not attributed to a pod container; left alone"
                );
            }
        }
        let mut by_reason: HashMap<&str, i64> = HashMap::new();
        for u in &report.unattributed {
            *by_reason.entry(u.reason).or_default() += 1;
        }
        for reason in UNATTRIBUTED_REASONS {
            self.metrics
                .unattributed
                .get_or_create(&ReasonLabel { reason })
                .set(by_reason.get(reason).copied().unwrap_or(0));
        }
        // Processes that could not even be read have no start time: key them by 0.
        let unreadable = report
            .unattributed
            .iter()
            .filter(|u| u.reason == "proc_unreadable")
            .map(|u| (u.pid, 0));
        state.unattributed = now.into_iter().chain(unreadable).collect();
    }

    fn last_activity_annotation(&self, pod: &PodInfo) -> Option<DateTime<Utc>> {
        pod.annotations
            .get(&self.cfg.last_activity_annotation)
            .and_then(|v| DateTime::parse_from_rfc3339(v.trim()).ok())
            .map(|t| t.with_timezone(&Utc))
    }

    /// Idle tracking and the gauges.
    fn observe(
        &self,
        state: &mut State,
        samples: &[GpuSample],
        usage: &BTreeMap<String, PodUsage>,
        now: DateTime<Utc>,
    ) {
        let mut gpus = HashSet::new();
        for g in samples {
            let labels = GpuLabels {
                gpu: g.index.to_string(),
                uuid: g.uuid.clone(),
            };
            self.metrics
                .gpu_memory_free
                .get_or_create(&labels)
                .set(clamp(g.memory_free_bytes));
            self.metrics
                .gpu_memory_total
                .get_or_create(&labels)
                .set(clamp(g.memory_total_bytes));
            self.metrics
                .gpu_utilization
                .get_or_create(&labels)
                .set(f64::from(g.utilization_percent.unwrap_or(0)) / 100.0);
            gpus.insert(labels);
        }
        let mut pod_gpus = HashSet::new();
        let mut pods = HashSet::new();
        for (uid, u) in usage {
            let rule = self.cfg.policy.idle_rule(&u.pod.namespace);
            let obs = Observation {
                util_percent: u
                    .processes
                    .iter()
                    .map(|p| p.util_percent)
                    .max()
                    .unwrap_or(0),
                used_bytes: u.used_bytes(),
                processes: u.pids(),
            };
            let annotated = self.last_activity_annotation(&u.pod);
            let track =
                state
                    .tracker
                    .observe(uid, now, obs, rule.util_threshold_percent, annotated);
            let labels = PodLabels {
                namespace: u.pod.namespace.clone(),
                pod: u.pod.name.clone(),
            };
            self.metrics
                .pod_last_activity
                .get_or_create(&labels)
                .set(track.last_activity.timestamp());
            self.metrics
                .pod_idle_seconds
                .get_or_create(&labels)
                .set(track.idle_for(now).num_seconds());
            if let Some(budget) = u.pod.gpumem_budget_mib {
                self.metrics
                    .pod_budget
                    .get_or_create(&labels)
                    .set(clamp(budget.saturating_mul(MIB)));
            }
            let mut per_gpu: BTreeMap<usize, u64> = BTreeMap::new();
            for p in &u.processes {
                *per_gpu.entry(p.gpu).or_default() += p.used_bytes;
            }
            for (gi, bytes) in per_gpu {
                let l = PodGpuLabels {
                    namespace: labels.namespace.clone(),
                    pod: labels.pod.clone(),
                    gpu: samples[gi].index.to_string(),
                };
                self.metrics.pod_memory.get_or_create(&l).set(clamp(bytes));
                pod_gpus.insert(l);
            }
            pods.insert(labels);
        }
        state.tracker.retain(|uid| usage.contains_key(uid));
        self.metrics.forget_stale(gpus, pod_gpus, pods);
    }

    /// Writes the last-activity annotation where it moved by at least a minute.
    async fn write_last_activity(&self, state: &mut State, usage: &BTreeMap<String, PodUsage>) {
        let key = self.cfg.last_activity_annotation.as_str();
        if key.is_empty() {
            return;
        }
        for (uid, u) in usage {
            let Some(track) = state.tracker.get(uid) else {
                continue;
            };
            let due = match track.annotated {
                None => true,
                Some(at) => (track.last_activity - at).abs() >= self.cfg.annotation_min_change,
            };
            if !due {
                continue;
            }
            let at = track.last_activity;
            let value = at.to_rfc3339_opts(SecondsFormat::Secs, true);
            match self.cluster.annotate_pod(&u.pod, key, &value).await {
                Ok(()) => {
                    self.metrics.call("annotate", true);
                    state.tracker.set_annotated(uid, at);
                }
                Err(e) => {
                    self.metrics.call("annotate", false);
                    tracing::warn!(pod = %u.pod.key(), error = %e, "writing the last-activity annotation failed; retried next round");
                }
            }
        }
    }

    fn idle_candidates(
        &self,
        state: &State,
        usage: &BTreeMap<String, PodUsage>,
        now: DateTime<Utc>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (uid, u) in usage {
            let rule = self.cfg.policy.idle_rule(&u.pod.namespace);
            let Some(track) = state.tracker.get(uid) else {
                continue;
            };
            if !rule.enabled || !track.reclaimable(&rule, now) {
                continue;
            }
            if let Some(why) = self.cfg.policy.idle_exemption(&u.pod) {
                tracing::debug!(pod = %u.pod.key(), exemption = why.as_str(), "idle, exempt from reclaim");
                continue;
            }
            out.push(uid.clone());
        }
        out
    }

    /// Of the pods idle for their whole window, those to reclaim now: warned at least
    /// `reclaim_warning` ago and idle since (or, without a warning period or in a dry
    /// run, all of them). The others are warned now (an Event, from which the period
    /// counts; if it cannot be recorded, again next round) or wait. The warnings of
    /// pods no longer idle are withdrawn.
    async fn warn_first(
        &self,
        state: &mut State,
        samples: &[GpuSample],
        usage: &BTreeMap<String, PodUsage>,
        idle: Vec<String>,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Vec<String> {
        for uid in state
            .warnings
            .withdraw_unless(|uid| idle.iter().any(|i| i == uid))
        {
            let pod = usage.get(&uid).map_or(uid, |u| u.pod.key());
            tracing::info!(pod = %pod, "idle reclaim warning withdrawn: the pod used the GPU again (or is exempt, or its GPU processes are gone)");
            report.withdrawn.push(pod);
        }
        let mut due = Vec::new();
        for uid in idle {
            let (Some(u), Some(track)) = (usage.get(&uid), state.tracker.get(&uid)) else {
                continue;
            };
            let rule = self.cfg.policy.idle_rule(&u.pod.namespace);
            // A dry run warns nobody of what will not happen: it reports at the end of
            // the window what would be done.
            let period = if rule.dry_run {
                TimeDelta::zero()
            } else {
                self.cfg.reclaim_warning
            };
            let idle_since = track.last_activity;
            let ends_at = match state.warnings.next(&uid, idle_since, now, period) {
                Next::Reclaim { .. } => {
                    due.push(uid);
                    continue;
                }
                Next::Wait { .. } => continue,
                Next::Warn { ends_at } => ends_at,
            };
            let event = warning_event(u, samples, idle_since, ends_at, now);
            let recorded = self.cluster.pod_event(&u.pod, &event).await;
            self.metrics.call("event", recorded.is_ok());
            match recorded {
                Ok(()) => {
                    tracing::warn!(
                        node = %self.cfg.node_name,
                        pod_ns = %u.pod.namespace,
                        pod_name = %u.pod.name,
                        pod_uid = %u.pod.uid,
                        idle_since = %idle_since.to_rfc3339_opts(SecondsFormat::Secs, true),
                        ends_at = %ends_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                        reason = "idle",
                        action = "agent.reclaim_warning",
                        "GPU processes idle for the whole window: warned, they end unless the pod uses the GPU"
                    );
                    state.warnings.warned(
                        &uid,
                        Warned {
                            idle_since,
                            at: now,
                            ends_at,
                        },
                    );
                    report.warned.push(u.pod.key());
                }
                Err(e) => {
                    tracing::warn!(pod = %u.pod.key(), error = %e, "recording the reclaim warning failed; no reclaim before a warning is recorded, tried again next round");
                }
            }
        }
        due
    }

    /// Per GPU under the floor, the tenant to recycle: `(gpu, uid, choice)`.
    fn vram_choices(
        &self,
        state: &mut State,
        samples: &[GpuSample],
        usage: &BTreeMap<String, PodUsage>,
        idle: &[String],
        now: DateTime<Utc>,
    ) -> Vec<(usize, OverBudget)> {
        let mut out: Vec<(usize, OverBudget)> = Vec::new();
        if !self.cfg.vram_watchdog {
            return out;
        }
        state
            .vram_dry_runs
            .retain(|_, at| now - *at < VRAM_DRY_RUN_REPEAT);
        for (gi, gpu) in samples.iter().enumerate() {
            let under = under_vram_floor(gpu.memory_free_bytes, self.cfg.vram_floor_mib);
            let was_under = state.under_floor.contains(&gpu.uuid);
            if !under {
                if was_under {
                    state.under_floor.remove(&gpu.uuid);
                    tracing::info!(
                        gpu_index = gpu.index,
                        free_mib = gpu.memory_free_bytes / MIB,
                        "GPU back above the VRAM floor"
                    );
                }
                continue;
            }
            if !was_under {
                state.under_floor.insert(gpu.uuid.clone());
                tracing::warn!(
                    node = %self.cfg.node_name,
                    gpu_index = gpu.index,
                    free_mib = gpu.memory_free_bytes / MIB,
                    floor_mib = self.cfg.vram_floor_mib,
                    "GPU free memory under the VRAM floor"
                );
            }
            let tenants: Vec<VramTenant> = usage
                .iter()
                .filter(|(uid, u)| {
                    u.processes.iter().any(|p| p.gpu == gi)
                        && !idle.contains(uid)
                        && !out.iter().any(|(_, c)| &c.id == *uid)
                        && self.cfg.policy.allowlisted(&u.pod).is_none()
                })
                .map(|(uid, u)| VramTenant {
                    id: uid.clone(),
                    used_bytes: u.used_bytes(),
                    budget_mib: u.pod.gpumem_budget_mib,
                })
                .collect();
            if let Some(choice) =
                watchdog_pick(gpu.memory_free_bytes, self.cfg.vram_floor_mib, &tenants)
            {
                if self.cfg.vram_dry_run && state.vram_dry_runs.contains_key(&choice.id) {
                    tracing::debug!(uid = %choice.id, "over budget under pressure; dry run reported recently");
                    continue;
                }
                out.push((gi, choice));
            }
        }
        out
    }

    /// FR-4: one more reading before acting; drops the pods that are no longer idle
    /// (or no longer over budget on a GPU under the floor) and plans the rest.
    #[allow(clippy::too_many_arguments)]
    async fn recheck(
        &self,
        state: &mut State,
        samples: &[GpuSample],
        usage: &BTreeMap<String, PodUsage>,
        idle: Vec<String>,
        vram: Vec<(usize, OverBudget)>,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Vec<ActionPlan> {
        let fresh = match self.sampler.sample(true).await {
            Ok(fresh) => fresh,
            Err(e) => {
                tracing::warn!(error = %e, "re-check sample failed; no action this round");
                report.error = Some(format!("re-check: {e}"));
                return Vec::new();
            }
        };
        // The fresh sample's processes per pod, from the cached attribution.
        let mut fresh_pids: HashMap<String, BTreeSet<(u32, u64)>> = HashMap::new();
        let mut fresh_used: HashMap<String, u64> = HashMap::new();
        let mut busy: HashMap<String, u32> = HashMap::new();
        for gpu in &fresh {
            for p in &gpu.processes {
                let Ok(info) = self.process(state, p.pid) else {
                    continue;
                };
                let Ok(cref) = &info.container else {
                    continue;
                };
                let Some(uid) = usage
                    .iter()
                    .find(|(_, u)| {
                        u.processes
                            .iter()
                            .any(|x| x.container_ref.pod_uid == cref.pod_uid)
                    })
                    .map(|(uid, _)| uid.clone())
                else {
                    continue;
                };
                if self.cfg.policy.process_allowlisted(&info) {
                    continue;
                }
                fresh_pids
                    .entry(uid.clone())
                    .or_default()
                    .insert((p.pid, info.start_time));
                *fresh_used.entry(uid.clone()).or_default() += p.used_bytes.unwrap_or(0);
                let util = busy.entry(uid).or_default();
                *util = (*util).max(gpu.process_util(p.pid));
            }
        }
        let mut plans = Vec::new();
        for uid in idle {
            let Some(u) = usage.get(&uid) else { continue };
            let rule = self.cfg.policy.idle_rule(&u.pod.namespace);
            let same = fresh_pids.get(&uid) == Some(&u.pids());
            let util = busy.get(&uid).copied().unwrap_or(0);
            if !same || util >= rule.util_threshold_percent {
                tracing::info!(pod = %u.pod.key(), util, processes_unchanged = same, "idle candidate active again at the re-check; left alone");
                report.rechecked_active.push(u.pod.key());
                continue;
            }
            let Some(track) = state.tracker.get(&uid) else {
                continue;
            };
            plans.push(ActionPlan::idle(
                &self.actor.settings,
                u,
                track,
                &rule,
                state.warnings.get(&uid),
                samples,
                now,
            ));
        }
        for (gi, choice) in vram {
            let Some(u) = usage.get(&choice.id) else {
                continue;
            };
            let free = fresh
                .iter()
                .find(|g| g.uuid == samples[gi].uuid)
                .map_or(u64::MAX, |g| g.memory_free_bytes);
            let used = fresh_used.get(&choice.id).copied().unwrap_or(0);
            let budget = choice.budget_mib.saturating_mul(MIB);
            if !under_vram_floor(free, self.cfg.vram_floor_mib) || used <= budget {
                tracing::info!(pod = %u.pod.key(), free_mib = free / MIB, used_mib = used / MIB, "VRAM pressure or overage gone at the re-check; left alone");
                report.rechecked_active.push(u.pod.key());
                continue;
            }
            plans.push(ActionPlan::vram(
                &self.actor.settings,
                u,
                &choice,
                gi,
                samples,
                free,
            ));
        }
        plans
    }
}

/// Gauges are i64; device memory never comes near.
fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
