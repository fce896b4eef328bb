//! Carrying out a reclaim or a watchdog recycle on one pod: the signals (or, in dry
//! run, none), the check that the GPU no longer lists the processes (FR-9, with
//! retries), and the trail: a structured log line per process, a Kubernetes Event on
//! the pod, an audit row with the evidence, and the metrics.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use crate::agent::{Agent, PodUsage};
use crate::audit::AuditRecord;
use crate::cluster::{EventKind, PodEvent};
use crate::gpu::GpuSample;
use crate::idle::Track;
use crate::metrics::ReasonLabel;
use crate::policy::IdleRule;
use crate::signals::{KillOutcome, Target};
use crate::watchdog::Choice;

const MIB: u64 = 1024 * 1024;
/// Processes listed in one audit row at most (the row must stay under 64 KiB).
const MAX_EVIDENCE_PROCESSES: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Idle for the whole window (PRD).
    IdleReclaim,
    /// Over its VRAM budget while the GPU is under the floor (ADR).
    VramRecycle,
}

/// A process to end, with what the evidence says about it.
#[derive(Debug, Clone)]
pub struct PlannedProcess {
    pub target: Target,
    pub used_bytes: u64,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub name: String,
    pub cmdline: String,
    pub container: String,
}

/// What will be done to one pod, and why.
#[derive(Debug, Clone)]
pub struct ActionPlan {
    pub kind: ActionKind,
    pub dry_run: bool,
    pub pod: Arc<crate::pods::PodInfo>,
    pub processes: Vec<PlannedProcess>,
    /// The evidence (samples, idle minutes, budget ...), without the outcome.
    pub evidence: Value,
    /// One line for the Event: why.
    pub why: String,
}

/// What was done to one pod.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionReport {
    pub kind: ActionKind,
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    /// `success`, `fail`, `dry_run`.
    pub result: &'static str,
    pub pids: Vec<u32>,
    pub kills: Vec<KillOutcome>,
    pub attempts: u32,
    /// Device memory of the processes the GPU no longer lists.
    pub freed_bytes: u64,
    pub error: Option<String>,
    /// The audit row's details: the evidence and the outcome.
    pub details: Value,
}

/// Every GPU process of the pod (a recycle ends the tenant's processes on every GPU:
/// its budget is the pod's, not a GPU's).
fn planned(u: &PodUsage, samples: &[GpuSample]) -> Vec<PlannedProcess> {
    u.processes
        .iter()
        .map(|p| PlannedProcess {
            target: Target {
                pid: p.info.pid,
                start_time: p.info.start_time,
                container: p.container_ref.clone(),
            },
            used_bytes: p.used_bytes,
            gpu_index: samples[p.gpu].index,
            gpu_uuid: samples[p.gpu].uuid.clone(),
            name: p.info.name.clone(),
            cmdline: p.info.cmdline.clone(),
            container: p.container.clone(),
        })
        .collect()
}

fn processes_json(processes: &[PlannedProcess]) -> Value {
    Value::Array(
        processes
            .iter()
            .take(MAX_EVIDENCE_PROCESSES)
            .map(|p| {
                json!({
                    "pid": p.target.pid,
                    "gpu_index": p.gpu_index,
                    "gpu_uuid": p.gpu_uuid,
                    "name": p.name,
                    "cmdline": p.cmdline,
                    "container": p.container,
                    "container_id": p.target.container.container_id,
                    "runtime": p.target.container.runtime,
                    "used_mib": p.used_bytes / MIB,
                })
            })
            .collect(),
    )
}

fn pod_json(agent: &Agent, u: &PodUsage) -> Value {
    json!({
        "node": agent.cfg.node_name,
        "pod_ns": u.pod.namespace,
        "pod_name": u.pod.name,
        "pod_uid": u.pod.uid,
    })
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
        b.extend(e);
    }
    base
}

fn describe(processes: &[PlannedProcess]) -> String {
    let mut names: Vec<String> = processes
        .iter()
        .take(5)
        .map(|p| format!("{} {} in {}", p.target.pid, p.name, p.container))
        .collect();
    if processes.len() > 5 {
        names.push(format!("and {} more", processes.len() - 5));
    }
    names.join(", ")
}

impl ActionPlan {
    pub(crate) fn idle(
        agent: &Agent,
        u: &PodUsage,
        track: &Track,
        rule: &IdleRule,
        samples: &[GpuSample],
        now: DateTime<Utc>,
    ) -> Self {
        let processes = planned(u, samples);
        let idle_minutes = track.idle_for(now).num_seconds() as f64 / 60.0;
        let evidence = merge(
            pod_json(agent, u),
            json!({
                "reason": "idle",
                "dry_run": rule.dry_run,
                "idle_minutes": (idle_minutes * 10.0).round() / 10.0,
                "last_activity": track.last_activity.to_rfc3339_opts(SecondsFormat::Secs, true),
                "idle_samples": track.idle_samples,
                "util_samples": track.idle_run(),
                "util_threshold_percent": rule.util_threshold_percent,
                "window_minutes": rule.idle_minutes,
                "window_samples": rule.idle_samples,
                "used_mib": u.used_bytes() / MIB,
                "processes": processes_json(&processes),
            }),
        );
        let why = format!(
            "its GPU processes ({}) had no GPU activity for {:.0} minutes ({} samples under {}% utilisation)",
            describe(&processes),
            idle_minutes,
            track.idle_samples,
            rule.util_threshold_percent
        );
        Self {
            kind: ActionKind::IdleReclaim,
            dry_run: rule.dry_run,
            pod: u.pod.clone(),
            processes,
            evidence,
            why,
        }
    }

    pub(crate) fn vram(
        agent: &Agent,
        u: &PodUsage,
        choice: &Choice,
        gpu: usize,
        samples: &[GpuSample],
        free_bytes: u64,
    ) -> Self {
        let processes = planned(u, samples);
        let g = &samples[gpu];
        let evidence = merge(
            pod_json(agent, u),
            json!({
                "reason": "vram_over_budget",
                "dry_run": agent.cfg.vram_dry_run,
                "gpu_index": g.index,
                "gpu_uuid": g.uuid,
                "gpu_free_mib": free_bytes / MIB,
                "gpu_total_mib": g.memory_total_bytes / MIB,
                "floor_mib": agent.cfg.vram_floor_mib,
                "used_mib": choice.used_mib,
                "budget_mib": choice.budget_mib,
                "over_mib": choice.over_mib,
                "processes": processes_json(&processes),
            }),
        );
        let why = format!(
            "GPU {} had {} MiB free (floor {} MiB) and this pod used {} MiB of GPU memory against a budget of {} MiB ({})",
            g.index,
            free_bytes / MIB,
            agent.cfg.vram_floor_mib,
            choice.used_mib,
            choice.budget_mib,
            describe(&processes)
        );
        Self {
            kind: ActionKind::VramRecycle,
            dry_run: agent.cfg.vram_dry_run,
            pod: u.pod.clone(),
            processes,
            evidence,
            why,
        }
    }
}

impl Agent {
    /// Carries out one plan and leaves its trail.
    pub(crate) async fn act(self: Arc<Self>, plan: ActionPlan) -> ActionReport {
        let reason = plan.kind.reason();
        let mut report = ActionReport {
            kind: plan.kind,
            pod: plan.pod.key(),
            uid: plan.pod.uid.clone(),
            result: "dry_run",
            pids: plan.processes.iter().map(|p| p.target.pid).collect(),
            kills: Vec::new(),
            attempts: 0,
            freed_bytes: 0,
            error: None,
            details: Value::Null,
        };
        if !plan.dry_run {
            self.end_processes(&plan, &mut report).await;
        }
        self.metrics.reclaim(report.result, reason);
        if report.freed_bytes > 0 {
            self.metrics
                .freed_bytes
                .get_or_create(&ReasonLabel { reason })
                .inc_by(report.freed_bytes);
        }
        report.details = merge(
            plan.evidence.clone(),
            json!({
                "action": action_name(plan.kind, plan.dry_run),
                "result": report.result,
                "attempts": report.attempts,
                "signals": report.kills,
                "freed_mib": report.freed_bytes / MIB,
                "error": report.error,
            }),
        );
        self.log(&plan, &report);
        self.event(&plan, &report).await;
        self.audit(&plan, &report).await;
        report
    }

    /// SIGTERM, grace, SIGKILL; then NVML must no longer list the processes, else
    /// again, up to `max_reclaim_retry` more times.
    async fn end_processes(&self, plan: &ActionPlan, report: &mut ActionReport) {
        let mut remaining: Vec<Target> = plan.processes.iter().map(|p| p.target.clone()).collect();
        loop {
            report.attempts += 1;
            let outcomes = self.killer.terminate(&remaining).await;
            for o in &outcomes {
                for s in &o.signals {
                    self.metrics.kill(s);
                }
            }
            let errors: Vec<String> = outcomes.iter().filter_map(|o| o.error.clone()).collect();
            report.kills.extend(outcomes);
            match self.sample(true).await {
                Ok(fresh) => {
                    let listed: HashSet<u32> = fresh
                        .iter()
                        .flat_map(|g| g.processes.iter().map(|p| p.pid))
                        .collect();
                    remaining.retain(|t| listed.contains(&t.pid));
                    report.error = (!remaining.is_empty()).then(|| {
                        let pids: Vec<String> =
                            remaining.iter().map(|t| t.pid.to_string()).collect();
                        let mut text = format!("still on the GPU: PID {}", pids.join(", "));
                        if !errors.is_empty() {
                            text.push_str(&format!(" ({})", errors.join("; ")));
                        }
                        text
                    });
                }
                Err(e) => {
                    report.error = Some(format!("could not check the GPU afterwards: {e}"));
                }
            }
            if report.error.is_none() || report.attempts > self.cfg.max_reclaim_retry {
                break;
            }
            tracing::info!(pod = %plan.pod.key(), attempt = report.attempts, error = ?report.error, "reclaim incomplete; retrying");
        }
        let gone: HashSet<u32> = plan
            .processes
            .iter()
            .map(|p| p.target.pid)
            .filter(|pid| !remaining.iter().any(|t| t.pid == *pid))
            .collect();
        report.freed_bytes = plan
            .processes
            .iter()
            .filter(|p| gone.contains(&p.target.pid))
            .map(|p| p.used_bytes)
            .sum();
        report.result = if report.error.is_none() {
            "success"
        } else {
            "fail"
        };
    }

    /// One structured line per process, with the PRD's fields.
    fn log(&self, plan: &ActionPlan, report: &ActionReport) {
        let e = &plan.evidence;
        for p in &plan.processes {
            let signals: Vec<&str> = report
                .kills
                .iter()
                .filter(|k| k.pid == p.target.pid)
                .flat_map(|k| k.signals.iter().copied())
                .collect();
            tracing::warn!(
                node = %self.cfg.node_name,
                gpu_index = p.gpu_index,
                pid = p.target.pid,
                cmdline = %p.cmdline,
                pod_ns = %plan.pod.namespace,
                pod_name = %plan.pod.name,
                pod_uid = %plan.pod.uid,
                container = %p.container,
                container_id = %p.target.container.container_id,
                used_mib = p.used_bytes / MIB,
                idle_minutes = e.get("idle_minutes").and_then(|v| v.as_f64()),
                util_samples = %e.get("util_samples").map(|v| v.to_string()).unwrap_or_default(),
                budget_mib = e.get("budget_mib").and_then(|v| v.as_u64()),
                reason = plan.kind.reason(),
                action = action_name(plan.kind, plan.dry_run),
                signals = ?signals,
                result = report.result,
                error = report.error.as_deref().unwrap_or(""),
                "GPU process {}",
                match report.result {
                    "dry_run" => "would be ended (dry run)",
                    "success" => "ended",
                    _ => "could not be ended",
                }
            );
        }
    }

    async fn event(&self, plan: &ActionPlan, report: &ActionReport) {
        let freed = report.freed_bytes / MIB;
        let signals: Vec<&str> = {
            let mut s: Vec<&str> = report
                .kills
                .iter()
                .flat_map(|k| k.signals.iter().copied())
                .collect();
            s.sort_unstable();
            s.dedup();
            s.iter()
                .map(|x| if *x == "KILL" { "SIGKILL" } else { "SIGTERM" })
                .collect()
        };
        let (kind, reason, note) = match (plan.kind, report.result) {
            (ActionKind::IdleReclaim, "dry_run") => (
                EventKind::Normal,
                "GPUReclaimDryRun",
                format!("Dry run: the agent would end this pod's GPU processes because {}. Nothing was done.", plan.why),
            ),
            (ActionKind::IdleReclaim, "success") => (
                EventKind::Warning,
                "GPUProcessesReclaimed",
                format!(
                    "This pod's GPU processes were ended ({}) because {}; {freed} MiB of GPU memory was freed for others. The pod keeps running: start the process (or restart the kernel) again to use the GPU.",
                    signals.join(", "),
                    plan.why
                ),
            ),
            (ActionKind::VramRecycle, "dry_run") => (
                EventKind::Warning,
                "VRAMOverBudgetDryRun",
                format!("Dry run: the agent would end this pod's GPU processes because {}. Nothing was done.", plan.why),
            ),
            (ActionKind::VramRecycle, "success") => (
                EventKind::Warning,
                "VRAMOverBudgetRecycled",
                format!(
                    "This pod's GPU processes were ended ({}) because {}; {freed} MiB of GPU memory was freed. Keep GPU memory within the pod's gpumem budget.",
                    signals.join(", "),
                    plan.why
                ),
            ),
            (_, _) => (
                EventKind::Warning,
                "GPUReclaimFailed",
                format!(
                    "The agent tried to end this pod's GPU processes because {}, but: {}",
                    plan.why,
                    report.error.as_deref().unwrap_or("unknown error")
                ),
            ),
        };
        let event = PodEvent {
            kind,
            reason: reason.into(),
            action: match plan.kind {
                ActionKind::IdleReclaim => "ReclaimIdleGPU".into(),
                ActionKind::VramRecycle => "RecycleOverBudget".into(),
            },
            note,
        };
        let ok = self.cluster.pod_event(&plan.pod, &event).await;
        self.metrics.call("event", ok.is_ok());
        if let Err(e) = ok {
            tracing::warn!(pod = %plan.pod.key(), error = %e, "recording the Event failed");
        }
    }

    async fn audit(&self, plan: &ActionPlan, report: &ActionReport) {
        let record = AuditRecord {
            action: action_name(plan.kind, plan.dry_run).into(),
            subject: Some(plan.pod.key()),
            user: plan.pod.username().map(str::to_owned),
            details: report.details.clone(),
        };
        let sent = self.audit.report(record).await;
        self.metrics.call("audit", sent.is_ok());
        if let Err(e) = sent {
            tracing::warn!(pod = %plan.pod.key(), error = %e, "audit report failed (the log line above is the record)");
        }
    }
}

fn action_name(kind: ActionKind, dry_run: bool) -> &'static str {
    match (kind, dry_run) {
        (ActionKind::IdleReclaim, false) => "agent.reclaim",
        (ActionKind::IdleReclaim, true) => "agent.reclaim_dry_run",
        (ActionKind::VramRecycle, false) => "agent.vram_recycle",
        (ActionKind::VramRecycle, true) => "agent.vram_recycle_dry_run",
    }
}
