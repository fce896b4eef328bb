//! What one tick found of a pod on the GPUs: its processes, attributed to its
//! containers. The agent builds it; the action plans read it.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::cgroup::ContainerRef;
use crate::pods::PodInfo;
use crate::procfs::ProcessInfo;

/// A GPU process attributed to a pod container.
#[derive(Debug, Clone)]
pub struct AttributedProcess {
    pub info: Arc<ProcessInfo>,
    pub container_ref: ContainerRef,
    pub container: String,
    /// Index into the tick's samples.
    pub gpu: usize,
    pub used_bytes: u64,
    pub util_percent: u32,
}

/// A pod's GPU processes in one tick.
#[derive(Debug, Clone)]
pub struct PodUsage {
    pub pod: Arc<PodInfo>,
    pub processes: Vec<AttributedProcess>,
}

impl PodUsage {
    pub fn used_bytes(&self) -> u64 {
        self.processes.iter().map(|p| p.used_bytes).sum()
    }

    /// Its processes as (PID, start time): the same only while none was replaced.
    pub(crate) fn pids(&self) -> BTreeSet<(u32, u64)> {
        self.processes
            .iter()
            .map(|p| (p.info.pid, p.info.start_time))
            .collect()
    }
}
