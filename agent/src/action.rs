//! What is to be done to one pod and why (an idle reclaim or a watchdog recycle,
//! [`ActionPlan`], with its evidence), what was done ([`ActionReport`]), and the
//! warning that comes before an idle reclaim ([`warning_event`]). The agent plans;
//! the actor ([`crate::actor`]) carries the plans out.

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_booking_core::eviction::OverBudget;
use serde_json::{json, Value};

use crate::cluster::{EventKind, PodEvent};
use crate::gpu::GpuSample;
use crate::idle::Track;
use crate::pod_usage::PodUsage;
use crate::reclaim_policy::IdleRule;
use crate::reclaim_warning::Warned;
use crate::signals::{KillOutcome, Target};

pub(crate) const MIB: u64 = 1024 * 1024;
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

/// What the plans say of where and how they act (from the agent's configuration).
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub node_name: String,
    pub vram_dry_run: bool,
    pub vram_floor_mib: u64,
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

fn pod_json(settings: &PlanSettings, u: &PodUsage) -> Value {
    json!({
        "node": settings.node_name,
        "pod_ns": u.pod.namespace,
        "pod_name": u.pod.name,
        "pod_uid": u.pod.uid,
    })
}

/// `base` with the fields of `extra` added (both JSON objects).
pub(crate) fn merge(mut base: Value, extra: Value) -> Value {
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
        settings: &PlanSettings,
        u: &PodUsage,
        track: &Track,
        rule: &IdleRule,
        warned: Option<&Warned>,
        samples: &[GpuSample],
        now: DateTime<Utc>,
    ) -> Self {
        let processes = planned(u, samples);
        let idle_minutes = track.idle_for(now).num_seconds() as f64 / 60.0;
        let evidence = merge(
            pod_json(settings, u),
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
                "warned_at": warned.map(|w| w.at.to_rfc3339_opts(SecondsFormat::Secs, true)),
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
        settings: &PlanSettings,
        u: &PodUsage,
        choice: &OverBudget,
        gpu: usize,
        samples: &[GpuSample],
        free_bytes: u64,
    ) -> Self {
        let processes = planned(u, samples);
        let g = &samples[gpu];
        let evidence = merge(
            pod_json(settings, u),
            json!({
                "reason": "vram_over_budget",
                "dry_run": settings.vram_dry_run,
                "gpu_index": g.index,
                "gpu_uuid": g.uuid,
                "gpu_free_mib": free_bytes / MIB,
                "gpu_total_mib": g.memory_total_bytes / MIB,
                "floor_mib": settings.vram_floor_mib,
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
            settings.vram_floor_mib,
            choice.used_mib,
            choice.budget_mib,
            describe(&processes)
        );
        Self {
            kind: ActionKind::VramRecycle,
            dry_run: settings.vram_dry_run,
            pod: u.pod.clone(),
            processes,
            evidence,
            why,
        }
    }
}

/// The Warning Event before an idle reclaim: since when the pod is idle, and when its
/// GPU processes end unless it uses the GPU (times in UTC, to the minute, the end
/// rounded down so that the pod's owner is never told later than it happens).
pub(crate) fn warning_event(
    u: &PodUsage,
    samples: &[GpuSample],
    idle_since: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> PodEvent {
    let clock = |t: DateTime<Utc>| {
        if t.date_naive() == now.date_naive() {
            t.format("%H:%M UTC").to_string()
        } else {
            t.format("%Y-%m-%d %H:%M UTC").to_string()
        }
    };
    let minutes = (now - idle_since).num_minutes();
    PodEvent {
        kind: EventKind::Warning,
        reason: "GPUReclaimWarning".into(),
        action: "WarnIdleGPU".into(),
        note: format!(
            "Idle since {}: this pod's GPU processes ({}) have had no GPU activity for {minutes} minutes, and end at {} unless it uses the GPU. The pod itself keeps running.",
            clock(idle_since),
            describe(&planned(u, samples)),
            clock(ends_at),
        ),
    }
}

/// The audit row's action, and the log line's.
pub(crate) fn action_name(kind: ActionKind, dry_run: bool) -> &'static str {
    match (kind, dry_run) {
        (ActionKind::IdleReclaim, false) => "agent.reclaim",
        (ActionKind::IdleReclaim, true) => "agent.reclaim_dry_run",
        (ActionKind::VramRecycle, false) => "agent.vram_recycle",
        (ActionKind::VramRecycle, true) => "agent.vram_recycle_dry_run",
    }
}

impl ActionKind {
    pub fn reason(self) -> &'static str {
        match self {
            ActionKind::IdleReclaim => "idle",
            ActionKind::VramRecycle => "vram_over_budget",
        }
    }
}
