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
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    /// `expire`, `preempt`, `scheduler_preempted`, `label_node`, `report_usage`.
    pub action: &'static str,
    /// `recreated`, `deleted`, `demoted`, `done`, `dry_run`, `skipped`, `error`;
    /// for `preempt` also `gave_up` (attempts spent for a booked pod) and `no_victim`.
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

pub struct Metrics {
    registry: Registry,
    pub actions: Family<ActionLabel, Counter>,
    /// Lent pods ended to make room, by model and reason.
    pub evictions: Family<EvictionLabel, Counter>,
    /// Seconds from a pod's `terminate-at` to the controller's action on it.
    pub expiry_lag: Histogram,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub is_leader: Gauge,
    /// Expiry timers armed now.
    pub timers: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpu_booking_controller");
        let actions = Family::<ActionLabel, Counter>::default();
        registry.register(
            "actions",
            "Actions on pods and nodes, by kind and result",
            actions.clone(),
        );
        let evictions = Family::<EvictionLabel, Counter>::default();
        registry.register(
            "evictions",
            "Lent pods ended to make room for a booked pod, by model and reason",
            evictions.clone(),
        );
        let expiry_lag = Histogram::new([
            0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
        ]);
        registry.register_with_unit(
            "expiry_lag",
            "Time from a booked pod's terminate-at to the action that ends it",
            Unit::Seconds,
            expiry_lag.clone(),
        );
        let reconcile_errors = Family::<ErrorLabel, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed calls to the Kubernetes API or the booking service",
            reconcile_errors.clone(),
        );
        let is_leader = Gauge::default();
        registry.register(
            "is_leader",
            "1 while this replica holds the Lease and acts",
            is_leader.clone(),
        );
        let timers = Gauge::default();
        registry.register("expiry_timers", "Expiry timers armed", timers.clone());
        Self {
            registry,
            actions,
            evictions,
            expiry_lag,
            reconcile_errors,
            is_leader,
            timers,
        }
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
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `/healthz` (alive), `/readyz` (watches synced) and `/metrics`.
pub fn admin_router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    gpu_booking_ops::admin_router(move || metrics.encode(), ready, "starting")
}
