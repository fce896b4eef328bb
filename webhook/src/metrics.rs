//! Prometheus metrics of the webhook: `gpu_booking_webhook_*`, counters end in
//! `_total`, durations are histograms in seconds.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Unit;

use gpu_booking_process::metrics::ComponentRegistry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `no_gpu`, `booked`, `low_priority`, `strip`, `no_identity_strip`,
    /// `booking_error_allow`, `booking_error_strip`, `ignored`, `invalid`, `internal_error`,
    /// `controller_copy`, `devices_hidden`, `rate_limited` (refused: its source is over
    /// `--source-reviews-per-second`).
    pub decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabel {
    /// `audit` (the only call besides the lookup).
    pub call: &'static str,
    /// `ok`, `error`, `dropped` (queue full) or `rate_limited` (over the audit rate).
    pub outcome: &'static str,
}

fn duration_histogram() -> Histogram {
    // 50 µs .. ~6.5 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

/// Every decision label the webhook uses; their series exist from the start (at 0),
/// and their handles are looked up without a lock on the hot path.
pub const DECISIONS: [&str; 13] = [
    "no_gpu",
    "devices_hidden",
    "ignored",
    "invalid",
    "internal_error",
    "booked",
    "low_priority",
    "strip",
    "no_identity_strip",
    "other_workload",
    "booking_error_allow",
    "booking_error_strip",
    "rate_limited",
];

/// Every metric of the webhook, registered once in [`Metrics::new`].
pub struct Metrics {
    pub registry: ComponentRegistry,
    decision_handles: Vec<(&'static str, Counter, Histogram)>,
    pub admissions: Family<DecisionLabel, Counter>,
    pub admission_duration: Family<DecisionLabel, Histogram, fn() -> Histogram>,
    pub booking_requests: Family<OutcomeLabel, Counter>,
    pub booking_duration: Histogram,
    pub cache_lookups: Family<OutcomeLabel, Counter>,
    pub side_calls: Family<CallLabel, Counter>,
    pub tls_reloads: Family<OutcomeLabel, Counter>,
    /// When the certificate served now expires (Unix seconds; 0 until one is loaded).
    pub tls_not_after: Gauge,
    /// Connections refused at the handshake under `--client-ca`: no client
    /// certificate, one the CA did not sign, or none of `--client-name`.
    pub client_certificates_refused: Counter,
    /// GPU pods admitted without their VRAM budget: their model's nodes do not
    /// advertise the budget resource.
    pub budgets_withheld: Counter,
    /// Age of the replica's data: time since the older of its last confirmed
    /// change stream read and its last figures refresh (NaN before the first sync).
    pub replica_staleness: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Replica reads from the booking service, by call (`full`, `figures`,
    /// `changes`) and outcome (`ok`, `error`, `gone`).
    pub replica_reads: Family<CallLabel, Counter>,
    /// Audit reports sent in batches, by outcome.
    pub audit_batches: Family<OutcomeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = ComponentRegistry::new("webhook");
        let mut r = registry.families();
        let mut m = Self {
            decision_handles: Vec::new(),
            admissions: r.add(
                "admissions",
                "Admission reviews answered, by decision",
                Family::default(),
            ),
            admission_duration: r.add_with_unit(
                "admission_duration",
                "Time to answer an admission review, by decision",
                Unit::Seconds,
                Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            ),
            booking_requests: r.add(
                "booking_requests",
                "Schedulability calls to the booking service, by outcome (ok, error, timeout)",
                Family::default(),
            ),
            booking_duration: r.add_with_unit(
                "booking_request_duration",
                "Duration of schedulability calls to the booking service",
                Unit::Seconds,
                duration_histogram(),
            ),
            cache_lookups: r.add(
                "schedulability_cache",
                "Schedulability lookups, by outcome (hit, miss)",
                Family::default(),
            ),
            side_calls: r.add(
                "side_calls",
                "Preemption requests and audit reports sent, by call and outcome",
                Family::default(),
            ),
            tls_reloads: r.add(
                "tls_reloads",
                "Serving certificate (re)loads, by outcome",
                Family::default(),
            ),
            tls_not_after: r.add_with_unit(
                "tls_certificate_expiry_timestamp",
                "When the serving certificate in use expires (Unix time)",
                Unit::Seconds,
                Gauge::default(),
            ),
            client_certificates_refused: r.add(
                "client_certificates_refused",
                "Connections refused at the TLS handshake for want of an accepted client certificate",
                Counter::default(),
            ),
            budgets_withheld: r.add(
                "budgets_withheld",
                "GPU pods admitted without a VRAM budget because their model's nodes do not advertise it",
                Counter::default(),
            ),
            replica_staleness: r.add_with_unit(
                "replica_staleness",
                "Age of the admission replica's data (NaN before its first sync)",
                Unit::Seconds,
                Gauge::default(),
            ),
            replica_reads: r.add(
                "replica_reads",
                "Reads of the booking service that feed the admission replica, by call and outcome",
                Family::default(),
            ),
            audit_batches: r.add(
                "audit_batches",
                "Batches of audit reports sent to the booking service, by outcome",
                Family::default(),
            ),
            registry,
        };
        m.replica_staleness.set(f64::NAN);
        m.decision_handles = DECISIONS
            .iter()
            .map(|&decision| {
                let label = DecisionLabel { decision };
                (
                    decision,
                    m.admissions.get_or_create_owned(&label),
                    m.admission_duration.get_or_create_owned(&label),
                )
            })
            .collect();
        m
    }

    pub fn admitted(&self, decision: &'static str, took: Duration) {
        if let Some((_, count, duration)) = self.decision_handles.iter().find(|h| h.0 == decision) {
            count.inc();
            duration.observe(took.as_secs_f64());
            return;
        }
        let label = DecisionLabel { decision };
        self.admissions.get_or_create(&label).inc();
        self.admission_duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    pub fn outcome(family: &Family<OutcomeLabel, Counter>, outcome: &'static str) {
        family.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        // With gpu_booking_build_info and the process metrics, then # EOF.
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_convention() {
        let m = Metrics::new();
        m.admitted("booked", Duration::from_millis(1));
        Metrics::outcome(&m.booking_requests, "ok");
        let text = m.encode();
        assert!(
            text.contains("gpu_booking_webhook_admissions_total{decision=\"booked\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gpu_booking_webhook_admission_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("gpu_booking_webhook_booking_requests_total{outcome=\"ok\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn promtool_accepts_the_text_format() {
        let m = Metrics::new();
        m.admitted("booked", Duration::from_millis(1));
        Metrics::outcome(&m.tls_reloads, "ok");
        m.tls_not_after.set(1_900_000_000);
        let text = gpu_booking_process::metrics::to_text(&m.encode());
        match gpu_booking_process::metrics::promtool_check(&text) {
            None => eprintln!("promtool not installed: `promtool check metrics` skipped"),
            Some(verdict) => verdict.unwrap(),
        }
    }
}
