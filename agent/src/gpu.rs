//! What the agent reads from the GPUs, behind [`GpuSampler`]: NVML on a node
//! ([`crate::nvml::NvmlSampler`]), a scripted fake in tests ([`crate::fake_gpu::FakeGpu`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::metrics::{Metrics, ResultLabel};

/// What [`GpuSample::process_util`] answers when the GPU reports no utilisation at
/// all: fully busy, so that such a GPU's processes are never reclaimed as idle.
pub const UNKNOWN_UTILIZATION: u32 = 100;

/// A compute process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// In the host PID namespace.
    pub pid: u32,
    /// Device memory it holds; `None` where the driver does not say.
    pub used_bytes: Option<u64>,
}

/// One GPU at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Percent of the last sample period in which a kernel ran (whole card).
    pub utilization_percent: Option<u32>,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub memory_free_bytes: u64,
    pub processes: Vec<GpuProcess>,
    /// Highest SM utilisation of each process since the previous sample, where the
    /// card reports it (absent PIDs were idle); `None` where it is not supported, and
    /// activity falls back to the whole card's utilisation.
    pub process_utilization: Option<HashMap<u32, u32>>,
}

/// Why a sample failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// The NVIDIA management library could not be loaded or initialised.
    #[error("no NVML: {0}")]
    NoNvml(String),
    #[error("NVML: {0}")]
    Nvml(String),
}

/// Reads every GPU of the node. Blocking (NVML calls take microseconds to a few
/// milliseconds); the agent calls it on a blocking thread.
pub trait GpuSampler: Send + Sync + 'static {
    /// The sample of a round: per-process utilisation covers the time since the
    /// previous round's sample.
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError>;

    /// A sample in between (the re-check before acting, the check after it) that
    /// leaves the per-process window of the next round alone.
    fn resample(&self) -> Result<Vec<GpuSample>, GpuError> {
        self.sample()
    }
}

impl GpuSample {
    /// Whether `pid` counts as active in this sample: its own utilisation when the
    /// card reports per-process figures, else the whole card's (the PRD's v1 rule).
    pub fn process_active(&self, pid: u32, threshold_percent: u32) -> bool {
        self.process_util(pid) >= threshold_percent
    }

    /// The utilisation that stands for `pid`'s activity (see [`Self::process_active`]).
    /// A GPU that reports neither figure (some MIG and vGPU set-ups) gives
    /// [`UNKNOWN_UTILIZATION`]: activity that cannot be seen is never taken for idleness.
    pub fn process_util(&self, pid: u32) -> u32 {
        match (&self.process_utilization, self.utilization_percent) {
            (Some(per_process), _) => per_process.get(&pid).copied().unwrap_or(0),
            (None, Some(card)) => card,
            (None, None) => UNKNOWN_UTILIZATION,
        }
    }
}

/// The agent's GPU sampler with its metrics: every read is timed and counted. The
/// agent's tick and the actor's check after an action share it.
#[derive(Clone)]
pub struct MeteredSampler {
    gpu: Arc<dyn GpuSampler>,
    metrics: Arc<Metrics>,
}

impl MeteredSampler {
    pub fn new(gpu: Arc<dyn GpuSampler>, metrics: Arc<Metrics>) -> Self {
        Self { gpu, metrics }
    }

    /// Reads every GPU on a blocking thread. `fresh`: a re-check or verification
    /// (NVML's per-process window is not advanced, so the next tick still sees what
    /// happened since the previous one).
    pub async fn sample(&self, fresh: bool) -> Result<Vec<GpuSample>, GpuError> {
        let gpu = self.gpu.clone();
        let started = std::time::Instant::now();
        let result =
            tokio::task::spawn_blocking(move || if fresh { gpu.resample() } else { gpu.sample() })
                .await
                .unwrap_or_else(|e| Err(GpuError::Nvml(format!("sampling task failed: {e}"))));
        self.metrics
            .sample_duration
            .observe(started.elapsed().as_secs_f64());
        let ok = result.is_ok();
        self.metrics
            .samples
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
        self.metrics.nvml_up.set(i64::from(ok));
        result
    }
}
