//! Prometheus metrics of the agent, all `gpu_booking_agent_*` like every component's
//! `gpu_booking_<component>_*`. The PRD's four were `gpu_booking_agent_*` until this
//! release (docs/agent.md lists the renames).

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Unit;

use gpu_booking_process::metrics::ComponentRegistry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReclaimLabels {
    /// `success`, `fail`, `dry_run`.
    pub result: &'static str,
    /// `idle`, `vram_over_budget`.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    /// `TERM`, `KILL`.
    pub signal: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `pods`, `annotate`, `event`, `audit`.
    pub call: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
    pub uuid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodGpuLabels {
    pub namespace: String,
    pub pod: String,
    pub gpu: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric, registered once.
pub struct Metrics {
    pub registry: ComponentRegistry,
    pub reclaims: Family<ReclaimLabels, Counter>,
    pub kills: Family<SignalLabel, Counter>,
    pub attribution_failures: Counter,
    pub idle_candidates: Gauge,
    pub unattributed: Family<ReasonLabel, Gauge>,
    pub freed_bytes: Family<ReasonLabel, Counter>,
    pub samples: Family<ResultLabel, Counter>,
    pub sample_duration: Histogram,
    pub tick_duration: Histogram,
    pub nvml_up: Gauge,
    pub calls: Family<CallLabels, Counter>,
    pub gpu_memory_free: Family<GpuLabels, Gauge>,
    pub gpu_memory_total: Family<GpuLabels, Gauge>,
    pub gpu_utilization: Family<GpuLabels, FloatGauge>,
    pub pod_memory: Family<PodGpuLabels, Gauge>,
    pub pod_budget: Family<PodLabels, Gauge>,
    pub pod_last_activity: Family<PodLabels, Gauge>,
    pub pod_idle_seconds: Family<PodLabels, Gauge>,
    /// Label sets written by the previous tick, so that gone pods and GPUs disappear.
    previous: Mutex<Previous>,
}

#[derive(Default)]
struct Previous {
    gpus: HashSet<GpuLabels>,
    pod_gpus: HashSet<PodGpuLabels>,
    pods: HashSet<PodLabels>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = ComponentRegistry::new("agent");
        let mut r = registry.families();
        Self {
            reclaims: r.add(
                "reclaim",
                "GPU reclaim actions on a pod, by result (success, fail, dry_run) and reason (idle, vram_over_budget)",
                Family::default(),
            ),
            kills: r.add("kill", "Signals sent to GPU processes", Family::default()),
            attribution_failures: r.add(
                "pid_attribution_fail",
                "GPU processes that could not be attributed to a pod container (each counted once)",
                Counter::default(),
            ),
            idle_candidates: r.add(
                "idle_candidates",
                "Pods whose GPU processes have been idle for their whole window",
                Gauge::default(),
            ),
            unattributed: r.add(
                "unattributed_processes",
                "GPU processes now on the node that are not attributed to a pod container, by reason",
                Family::default(),
            ),
            freed_bytes: r.add_with_unit(
                "freed_memory",
                "Device memory freed by ending GPU processes",
                Unit::Bytes,
                Family::default(),
            ),
            samples: r.add("samples", "NVML samples, by result", Family::default()),
            sample_duration: r.add_with_unit(
                "sample_duration",
                "Time to read every GPU",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            ),
            tick_duration: r.add_with_unit(
                "tick_duration",
                "Time of one sampling round, actions included",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            ),
            nvml_up: r.add(
                "nvml_up",
                "1 when NVML is loaded and answering",
                Gauge::default(),
            ),
            calls: r.add(
                "kubernetes_and_audit_calls",
                "Calls to the API server and the booking service, by outcome",
                Family::default(),
            ),
            gpu_memory_free: r.add_with_unit(
                "gpu_memory_free",
                "Free device memory of a GPU",
                Unit::Bytes,
                Family::default(),
            ),
            gpu_memory_total: r.add_with_unit(
                "gpu_memory_total",
                "Device memory of a GPU",
                Unit::Bytes,
                Family::default(),
            ),
            gpu_utilization: r.add_with_unit(
                "gpu_utilization",
                "Share of the last sample period in which a kernel ran (0 to 1)",
                Unit::Ratios,
                Family::default(),
            ),
            pod_memory: r.add_with_unit(
                "pod_gpu_memory_used",
                "Device memory used by a pod's GPU processes, per GPU",
                Unit::Bytes,
                Family::default(),
            ),
            pod_budget: r.add_with_unit(
                "pod_gpu_memory_budget",
                "A pod's declared VRAM budget (its gpumem resource)",
                Unit::Bytes,
                Family::default(),
            ),
            pod_last_activity: r.add_with_unit(
                "pod_last_gpu_activity_timestamp",
                "When a pod's GPU processes were last active (Unix time)",
                Unit::Seconds,
                Family::default(),
            ),
            pod_idle_seconds: r.add_with_unit(
                "pod_gpu_idle",
                "How long a pod's GPU processes have been idle",
                Unit::Seconds,
                Family::default(),
            ),
            previous: Mutex::new(Previous::default()),
            registry,
        }
    }

    pub fn reclaim(&self, result: &'static str, reason: &'static str) {
        self.reclaims
            .get_or_create(&ReclaimLabels { result, reason })
            .inc();
    }

    pub fn kill(&self, signal: &'static str) {
        self.kills.get_or_create(&SignalLabel { signal }).inc();
    }

    pub fn call(&self, call: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.calls
            .get_or_create(&CallLabels { call, outcome })
            .inc();
    }

    /// Drops the series of GPUs and pods that the latest tick did not write.
    pub fn forget_stale(
        &self,
        gpus: HashSet<GpuLabels>,
        pod_gpus: HashSet<PodGpuLabels>,
        pods: HashSet<PodLabels>,
    ) {
        let mut prev = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        for g in prev.gpus.difference(&gpus) {
            self.gpu_memory_free.remove(g);
            self.gpu_memory_total.remove(g);
            self.gpu_utilization.remove(g);
        }
        for p in prev.pod_gpus.difference(&pod_gpus) {
            self.pod_memory.remove(p);
        }
        for p in prev.pods.difference(&pods) {
            self.pod_budget.remove(p);
            self.pod_last_activity.remove(p);
            self.pod_idle_seconds.remove(p);
        }
        *prev = Previous {
            gpus,
            pod_gpus,
            pods,
        };
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        // With gpu_booking_build_info and the process metrics, then # EOF.
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promtool_accepts_the_text_format() {
        let m = Metrics::new();
        m.reclaim("success", "idle");
        m.kill("TERM");
        m.attribution_failures.inc();
        m.nvml_up.set(1);
        let gpu = GpuLabels {
            gpu: "0".into(),
            uuid: "GPU-1".into(),
        };
        m.gpu_memory_free.get_or_create(&gpu).set(1 << 30);
        m.gpu_utilization.get_or_create(&gpu).set(0.5);
        m.pod_budget
            .get_or_create(&PodLabels {
                namespace: "lab".into(),
                pod: "alice".into(),
            })
            .set(4 << 30);
        let text = m.encode();
        assert!(
            text.contains("gpu_booking_agent_reclaim_total{result=\"success\",reason=\"idle\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_booking_build_info{component=\"agent\""),
            "{text}"
        );
        let text = gpu_booking_process::metrics::to_text(&text);
        match gpu_booking_process::metrics::promtool_check(&text) {
            None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
            Some(verdict) => verdict.unwrap(),
        }
    }
}
