//! Prometheus metrics of the controller (`gpu_booking_controller_*`) and the admin
//! port that serves them with /healthz and /readyz.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use gpu_booking_process::metrics::ComponentRegistry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    /// `expire`, `preempt`, `scheduler_preempted`, `resume` (a recorded action
    /// finished, see `intent`), `label_node`, `report_usage`, `advertise_gpumem`.
    pub action: &'static str,
    /// `recreated`, `deleted`, `demoted`, `restarted`, `done`, `dry_run`, `skipped`,
    /// `error`; for `preempt` also `gave_up` (attempts spent for a booked pod) and
    /// `no_victim`; for `resume` also `gave_up` and `unreadable`.
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabel {
    /// A model the booking service declares (a closed set the admins keep).
    pub model: String,
    /// `booked_pod_pending`.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    /// `kubernetes` or `booking`.
    pub source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

/// A booked pod that waits with no pod that may give way.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabel {
    pub model: String,
    /// The namespaces (at most three, comma-separated, in order) whose pods hold
    /// the cards and may not give way; empty when bookings hold them. The series
    /// are the waiting pods of the last round only, so they stay few.
    pub held_by: String,
}

/// The inventory as gauges (every replica keeps them, from its own watches).
#[derive(Default)]
pub struct InventoryGauges {
    /// Physical cards (MIG devices) of each model on the nodes.
    pub cards: Family<ModelLabel, Gauge>,
    /// Units each model's admin declared.
    pub units: Family<ModelLabel, Gauge>,
    /// Cards with a pod on them.
    pub in_use: Family<ModelLabel, Gauge>,
    /// Cards other workloads (pods not admitted as booked or lent) use.
    pub others_in_use: Family<ModelLabel, Gauge>,
    /// 1 when a model's cards disagree with its declared units.
    pub mismatch: Family<ModelLabel, Gauge>,
    /// Nodes with GPUs.
    pub gpu_nodes: Gauge,
    /// GPU nodes whose GPU memory GFD does not describe (no budget can be advertised).
    pub gpu_nodes_without_telemetry: Gauge,
    /// GPU nodes with cards of several models behind the generic GPU resource (left
    /// without a model label; models with a resource of their own need none).
    pub nodes_with_several_models: Gauge,
    /// Pods Pending because no node has the VRAM budget they ask for.
    pub pods_pending_gpumem: Gauge,
}

pub struct Metrics {
    registry: ComponentRegistry,
    pub inventory: InventoryGauges,
    pub actions: Family<ActionLabel, Counter>,
    /// Lent pods ended to make room, by model and reason.
    pub evictions: Family<EvictionLabel, Counter>,
    /// Seconds from a pod's `terminate-at` to the controller's action on it.
    pub expiry_lag: Histogram,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub is_leader: Gauge,
    /// Expiry timers armed now.
    pub timers: Gauge,
    /// GPUs offered back to users on CPU and held for them now (the leader's).
    pub offers: Gauge,
    /// With `--on-expiry hub-restart`: 1 while JupyterHub takes the controller's token
    /// for restarts, 0 once it refused it (restarts fall back to CPU-only copies).
    pub hub_usable: Gauge,
    /// Booked pods Pending with no pod that may give way, by model and who holds
    /// the cards.
    pub booked_pods_waiting: Family<WaitingLabel, Gauge>,
    /// Lent pods the scheduler cannot place for want of a GPU (each is recreated
    /// CPU-only after `--lent-pending-grace`; many, or for long, means the webhook
    /// lends GPUs that are not free).
    pub lent_pods_pending: Gauge,
    /// How far the booking change stream lagged the booking database at its last
    /// answer: a long transaction there holds back every booking change made after
    /// it began, so cancellations and moves reach pods that much later. NaN before
    /// the first answer and while a backlog is read.
    pub booking_changes_behind: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = ComponentRegistry::new("controller");
        let mut r = registry.families();
        let m = Self {
            actions: r.add(
                "actions",
                "Actions on pods and nodes, by kind and result",
                Family::default(),
            ),
            evictions: r.add(
                "evictions",
                "Lent pods ended to make room for a booked pod, by model and reason",
                Family::default(),
            ),
            expiry_lag: r.add_with_unit(
                "expiry_lag",
                "Time from a booked pod's terminate-at to the action that ends it",
                Unit::Seconds,
                Histogram::new([
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
                ]),
            ),
            reconcile_errors: r.add(
                "reconcile_errors",
                "Failed calls to the Kubernetes API or the booking service",
                Family::default(),
            ),
            is_leader: r.add(
                "is_leader",
                "1 while this replica holds the Lease and acts",
                Gauge::default(),
            ),
            timers: r.add("expiry_timers", "Expiry timers armed", Gauge::default()),
            offers: r.add(
                "offers_outstanding",
                "GPUs offered back to users whose notebooks run on CPU, held for them now",
                Gauge::default(),
            ),
            hub_usable: r.add(
                "hub_token_usable",
                "With hub-restart: 1 while JupyterHub takes the controller's token, 0 once it refused it (restarts become CPU-only copies)",
                Gauge::default(),
            ),
            booked_pods_waiting: r.add(
                "booked_pods_waiting",
                "Booked pods Pending with no pod that may give way, by model and the namespaces whose pods hold the cards",
                Family::default(),
            ),
            lent_pods_pending: r.add(
                "lent_pods_pending",
                "Lent pods the scheduler cannot place for want of a GPU (each recreated CPU-only after --lent-pending-grace)",
                Gauge::default(),
            ),
            booking_changes_behind: r.add_with_unit(
                "booking_changes_behind",
                "How far the booking change stream lagged the booking database at its last answer (NaN before it and during a backlog)",
                Unit::Seconds,
                Gauge::default(),
            ),
            inventory: InventoryGauges {
                cards: r.add(
                    "model_cards",
                    "Physical cards (MIG devices for a MIG profile) of each model on the nodes",
                    Family::default(),
                ),
                units: r.add(
                    "model_units",
                    "Units of each model its admin declared (what bookings are checked against)",
                    Family::default(),
                ),
                in_use: r.add(
                    "model_in_use",
                    "Cards of each model with a pod on them",
                    Family::default(),
                ),
                others_in_use: r.add(
                    "model_others_in_use",
                    "Cards of each model that other workloads (pods not admitted as booked or lent) use",
                    Family::default(),
                ),
                mismatch: r.add(
                    "model_units_mismatch",
                    "1 when a model's cards on the nodes disagree with its declared units",
                    Family::default(),
                ),
                gpu_nodes: r.add("gpu_nodes", "Nodes with GPUs", Gauge::default()),
                gpu_nodes_without_telemetry: r.add(
                    "gpu_nodes_without_telemetry",
                    "GPU nodes whose GPU product or memory GPU feature discovery does not describe",
                    Gauge::default(),
                ),
                nodes_with_several_models: r.add(
                    "nodes_with_several_models",
                    "GPU nodes with cards of several models behind the generic GPU resource, left without a model label",
                    Gauge::default(),
                ),
                pods_pending_gpumem: r.add(
                    "pods_pending_gpumem",
                    "Pods the scheduler cannot place for want of the VRAM budget resource",
                    Gauge::default(),
                ),
            },
            registry,
        };
        m.booking_changes_behind.set(f64::NAN);
        m
    }

    pub fn action(&self, action: &'static str, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabel { action, result })
            .inc();
    }

    pub fn action_count(&self, action: &'static str, result: &'static str) -> u64 {
        self.actions
            .get_or_create(&ActionLabel { action, result })
            .get()
    }

    pub fn eviction(&self, model: &str, reason: &'static str) {
        self.evictions
            .get_or_create(&EvictionLabel {
                model: model.to_owned(),
                reason,
            })
            .inc();
    }

    pub fn eviction_count(&self, model: &str, reason: &'static str) -> u64 {
        self.evictions
            .get_or_create(&EvictionLabel {
                model: model.to_owned(),
                reason,
            })
            .get()
    }

    pub fn error(&self, source: &'static str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabel { source })
            .inc();
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        // With gpu_booking_build_info and the process metrics, then # EOF.
        self.registry.encode()
    }
}

/// `/healthz` (alive), `/readyz` (watches synced) and `/metrics`.
pub fn admin_router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    gpu_booking_process::admin_router(move || metrics.encode(), ready, "starting")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promtool_accepts_the_text_format() {
        let m = Metrics::new();
        m.action("preempt", "recreated");
        m.eviction("a100", "booked_pod_pending");
        m.error("kubernetes");
        m.expiry_lag.observe(0.2);
        m.inventory
            .cards
            .get_or_create(&ModelLabel {
                model: "a100".into(),
            })
            .set(4);
        let text = m.encode();
        assert!(
            text.contains("gpu_booking_build_info{component=\"controller\""),
            "{text}"
        );
        let text = gpu_booking_process::metrics::to_text(&text);
        match gpu_booking_process::metrics::promtool_check(&text) {
            None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
            Some(verdict) => verdict.unwrap(),
        }
    }
}
