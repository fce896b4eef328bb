//! [`GpuSampler`] on NVML. `libnvidia-ml.so.1` is loaded when the agent starts, not
//! linked, so the binary runs on a machine without a GPU and says "no NVML" there.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::Mutex;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use crate::gpu::{GpuError, GpuProcess, GpuSample, GpuSampler};

/// NVML, initialised once.
pub struct NvmlSampler {
    nvml: Nvml,
    /// Per GPU, the newest per-process utilisation timestamp seen, so that each
    /// sample asks only for what happened since the previous one.
    last_seen: Mutex<HashMap<u32, u64>>,
}

impl NvmlSampler {
    /// Loads the library (`library`, or the driver's `libnvidia-ml.so.1`) and
    /// initialises it; [`GpuError::NoNvml`] says why not.
    pub fn init(library: Option<&OsString>) -> Result<Self, GpuError> {
        let nvml = match library {
            Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| GpuError::NoNvml(describe_init_error(&e)))?;
        Ok(Self {
            nvml,
            last_seen: Mutex::new(HashMap::new()),
        })
    }

    /// The driver version, for the start-up log line.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn sample_all(&self, advance: bool) -> Result<Vec<GpuSample>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| GpuError::Nvml(format!("counting devices: {e}")))?;
        (0..count)
            .map(|i| {
                self.sample_device(i, advance)
                    .map_err(|e| GpuError::Nvml(format!("GPU {i}: {e}")))
            })
            .collect()
    }

    fn sample_device(&self, index: u32, advance: bool) -> Result<GpuSample, NvmlError> {
        let device = self.nvml.device_by_index(index)?;
        let memory = device.memory_info()?;
        let utilization_percent = device.utilization_rates().ok().map(|u| u.gpu);
        let processes = device
            .running_compute_processes()?
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        let process_utilization = self.process_utilization(&device, index, advance);
        Ok(GpuSample {
            index,
            uuid: device.uuid().unwrap_or_default(),
            name: device.name().unwrap_or_default(),
            utilization_percent,
            memory_total_bytes: memory.total,
            memory_used_bytes: memory.used,
            memory_free_bytes: memory.free,
            processes,
            process_utilization,
        })
    }

    fn process_utilization(
        &self,
        device: &nvml_wrapper::Device<'_>,
        index: u32,
        advance: bool,
    ) -> Option<HashMap<u32, u32>> {
        let since = self
            .last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied();
        let samples = match device.process_utilization_stats(since) {
            Ok(samples) => samples,
            // No process had a sample since `since`: the driver answers NotFound.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(_) => return None,
        };
        let mut per_pid: HashMap<u32, u32> = HashMap::new();
        let mut newest = since.unwrap_or(0);
        for s in samples {
            newest = newest.max(s.timestamp);
            let util = per_pid.entry(s.pid).or_default();
            *util = (*util).max(s.sm_util);
        }
        if advance {
            self.last_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(index, newest);
        }
        Some(per_pid)
    }
}

impl GpuSampler for NvmlSampler {
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        self.sample_all(true)
    }

    fn resample(&self) -> Result<Vec<GpuSample>, GpuError> {
        self.sample_all(false)
    }
}

fn describe_init_error(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!(
            "the NVIDIA management library (libnvidia-ml.so.1) could not be loaded ({inner}); \
             this node has no NVIDIA driver, or the container does not get it \
             (NVIDIA container toolkit, runtimeClassName: nvidia)"
        ),
        NvmlError::DriverNotLoaded => {
            "the NVIDIA kernel driver is not loaded on this node".to_owned()
        }
        NvmlError::NoPermission => {
            "no permission to talk to the NVIDIA driver (device nodes not mounted?)".to_owned()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_no_nvml_when_the_library_is_missing() {
        let missing = OsString::from("/nonexistent/libnvidia-ml.so.1");
        let Err(e) = NvmlSampler::init(Some(&missing)) else {
            panic!("loaded a library that does not exist");
        };
        let text = e.to_string();
        assert!(text.starts_with("no NVML: "), "{text}");
        assert!(text.contains("libnvidia-ml.so.1"), "{text}");
    }

    #[test]
    fn the_default_library_loads_or_says_why_not() {
        // On a GPU node this samples the real GPUs; elsewhere it must fail cleanly.
        match NvmlSampler::init(None) {
            Ok(nvml) => {
                let gpus = nvml.sample().expect("NVML sample");
                assert!(gpus.iter().all(|g| g.memory_total_bytes > 0));
            }
            Err(e) => assert!(e.to_string().starts_with("no NVML: "), "{e}"),
        }
    }
}
