//! How the bench writes its figures: durations, sizes, spreads and per-model counts.

use std::time::Duration;

use crate::cluster::MODELS;

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

pub fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `name count` for each model, in the models' order.
pub fn per_model<T: std::fmt::Display>(values: &[T; MODELS.len()]) -> String {
    MODELS
        .iter()
        .zip(values)
        .map(|(m, v)| format!("{} {v}", m.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `q` quantile of `sorted` (nearest rank: with fewer than 100 values, p99 is
/// the slowest).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p50, p99 and max of a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub n: usize,
}

pub fn spread(times: &[Duration]) -> Spread {
    let mut times = times.to_vec();
    times.sort();
    Spread {
        p50: quantile(&times, 0.5),
        p99: quantile(&times, 0.99),
        max: times.last().copied().unwrap_or_default(),
        n: times.len(),
    }
}

impl Spread {
    /// This spread over `base`, quantile by quantile.
    pub fn ratios(&self, base: &Spread) -> String {
        let ratio = |a: Duration, b: Duration| {
            if b.is_zero() {
                f64::NAN
            } else {
                a.as_secs_f64() / b.as_secs_f64()
            }
        };
        format!(
            "p50 {:.1}, p99 {:.1}, max {:.1}",
            ratio(self.p50, base.p50),
            ratio(self.p99, base.p99),
            ratio(self.max, base.max)
        )
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {}, p99 {}, max {} (of {})",
            secs(self.p50),
            secs(self.p99),
            secs(self.max),
            self.n
        )
    }
}
