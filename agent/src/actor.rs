//! Carrying out a reclaim or a watchdog recycle on one pod: the signals (or, in dry
//! run, none), the check that the GPU no longer lists the processes (FR-9, with
//! retries), and the trail: a structured log line per process, a Kubernetes Event on
//! the pod, an audit row with the evidence, and the metrics. The actor owns what
//! acting needs (the killer, the cluster for Events, the audit sink); the agent only
//! hands it plans.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::action::{action_name, merge, ActionKind, ActionPlan, ActionReport, PlanSettings, MIB};
use crate::audit::{AuditRecord, AuditSink};
use crate::cluster::{Cluster, EventKind, PodEvent};
use crate::gpu::MeteredSampler;
use crate::metrics::{Metrics, ReasonLabel};
use crate::signals::{Killer, Target};

/// Carries out action plans, one task per plan.
pub struct Actor {
    pub(crate) settings: PlanSettings,
    /// Further rounds of signals when the GPU still lists a process.
    pub(crate) max_reclaim_retry: u32,
    /// For the check that the GPU no longer lists the processes.
    pub(crate) sampler: MeteredSampler,
    pub(crate) killer: Killer,
    /// For the Event on the pod.
    pub(crate) cluster: Arc<dyn Cluster>,
    pub(crate) audit: Arc<dyn AuditSink>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Actor {
    /// Carries out one plan and leaves its trail.
    pub(crate) async fn act(&self, plan: ActionPlan) -> ActionReport {
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

    /// The signal sequence (by default SIGINT, SIGTERM, SIGKILL, the grace after
    /// each); then NVML must no longer list the processes, else again, up to
    /// `max_reclaim_retry` more times.
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
            match self.sampler.sample(true).await {
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
            if report.error.is_none() || report.attempts > self.max_reclaim_retry {
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
                node = %self.settings.node_name,
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
        // The signals sent, in the sequence's order.
        let signals: Vec<String> = self
            .killer
            .sequence
            .signals()
            .iter()
            .filter(|s| report.kills.iter().any(|k| k.signals.contains(&s.name())))
            .map(|s| format!("SIG{}", s.name()))
            .collect();
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
