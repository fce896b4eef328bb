//! A scripted fake GPU for tests and the benchmark: the test says which processes hold
//! how much memory and how busy they are, and changes it between ticks.
//!
//! Like the driver, the fake frees a process's memory once the process has exited:
//! processes registered with [`FakeGpu::follow_real_process`] are real child processes
//! of the test, and the fake drops them from its list as soon as the kernel says they
//! have exited (gone, or a zombie that no longer holds a context).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use crate::gpu::{GpuError, GpuProcess, GpuSample, GpuSampler};
use crate::procfs::{ProcFs, RunState};

const MIB: u64 = 1024 * 1024;

#[derive(Debug, Clone)]
struct FakeProcess {
    used_mib: u64,
    util_percent: u32,
}

#[derive(Debug, Clone)]
struct FakeCard {
    total_mib: u64,
    /// Memory held by nothing we list (driver, other contexts).
    reserved_mib: u64,
    /// Whole-card utilisation; `None`: computed as the highest process utilisation.
    util_override: Option<u32>,
    processes: BTreeMap<u32, FakeProcess>,
}

/// A change the script applies when a given sample is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeStep {
    SetProcessUtil { pid: u32, percent: u32 },
    SetProcessMemory { pid: u32, used_mib: u64 },
    RemoveProcess { pid: u32 },
}

struct State {
    cards: Vec<FakeCard>,
    per_process_utilization: bool,
    card_utilization: bool,
    real: HashSet<u32>,
    failures: u32,
    samples: u64,
    script: Vec<(u64, FakeStep)>,
}

impl State {
    fn apply(&mut self, step: FakeStep) {
        for card in &mut self.cards {
            match step {
                FakeStep::SetProcessUtil { pid, percent } => {
                    if let Some(p) = card.processes.get_mut(&pid) {
                        p.util_percent = percent;
                    }
                }
                FakeStep::SetProcessMemory { pid, used_mib } => {
                    if let Some(p) = card.processes.get_mut(&pid) {
                        p.used_mib = used_mib;
                    }
                }
                FakeStep::RemoveProcess { pid } => {
                    card.processes.remove(&pid);
                }
            }
        }
    }
}

/// The fake. Every method takes `&self`, so a test keeps an `Arc` and changes the
/// script while the agent samples.
pub struct FakeGpu {
    state: Mutex<State>,
    real_proc: ProcFs,
}

impl FakeGpu {
    /// `cards` idle GPUs of `total_mib` each, reporting per-process utilisation.
    pub fn new(cards: usize, total_mib: u64) -> Self {
        let card = FakeCard {
            total_mib,
            reserved_mib: 0,
            util_override: None,
            processes: BTreeMap::new(),
        };
        Self {
            state: Mutex::new(State {
                cards: vec![card; cards],
                per_process_utilization: true,
                card_utilization: true,
                real: HashSet::new(),
                failures: 0,
                samples: 0,
                script: Vec::new(),
            }),
            real_proc: ProcFs::new("/proc"),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// Cards that report only whole-card utilisation (NVML's `NotSupported` for
    /// per-process figures).
    pub fn without_process_utilization(self) -> Self {
        self.with(|s| s.per_process_utilization = false);
        self
    }

    /// Cards that report no utilisation at all (neither per process nor whole card).
    pub fn without_utilization(self) -> Self {
        self.with(|s| {
            s.per_process_utilization = false;
            s.card_utilization = false;
        });
        self
    }

    /// Puts `pid` on GPU `gpu` holding `used_mib`, idle.
    pub fn add_process(&self, gpu: usize, pid: u32, used_mib: u64) {
        self.with(|s| {
            if let Some(card) = s.cards.get_mut(gpu) {
                card.processes.insert(
                    pid,
                    FakeProcess {
                        used_mib,
                        util_percent: 0,
                    },
                );
            }
        });
    }

    /// A real process: dropped from the card once it has exited.
    pub fn follow_real_process(&self, pid: u32) {
        self.with(|s| s.real.insert(pid));
    }

    /// Sets how busy `pid` is (on every card it is on).
    pub fn set_process_util(&self, pid: u32, percent: u32) {
        self.with(|s| s.apply(FakeStep::SetProcessUtil { pid, percent }));
    }

    /// Sets the memory `pid` holds (on every card it is on).
    pub fn set_process_memory(&self, pid: u32, used_mib: u64) {
        self.with(|s| s.apply(FakeStep::SetProcessMemory { pid, used_mib }));
    }

    /// Applies `step` just before the sample numbered `at` (the first sample is 1) is
    /// read: e.g. a process that wakes up between a round and its re-check.
    pub fn at_sample(&self, at: u64, step: FakeStep) {
        self.with(|s| s.script.push((at, step)));
    }

    /// Fixes the whole card's utilisation (else: the busiest process's).
    pub fn set_card_util(&self, gpu: usize, percent: Option<u32>) {
        self.with(|s| {
            if let Some(card) = s.cards.get_mut(gpu) {
                card.util_override = percent;
            }
        });
    }

    /// Memory in use by something the process list does not show.
    pub fn set_reserved(&self, gpu: usize, mib: u64) {
        self.with(|s| {
            if let Some(card) = s.cards.get_mut(gpu) {
                card.reserved_mib = mib;
            }
        });
    }

    pub fn remove_process(&self, pid: u32) {
        self.with(|s| s.apply(FakeStep::RemoveProcess { pid }));
    }

    /// The next `n` samples fail, as NVML does when a GPU falls off the bus.
    pub fn fail_next(&self, n: u32) {
        self.with(|s| s.failures = n);
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.with(|s| s.samples)
    }

    /// Whether `pid` is on any card now.
    pub fn holds(&self, pid: u32) -> bool {
        self.drop_exited();
        self.with(|s| s.cards.iter().any(|c| c.processes.contains_key(&pid)))
    }

    fn drop_exited(&self) {
        let real: Vec<u32> = self.with(|s| s.real.iter().copied().collect());
        let exited: Vec<u32> = real
            .into_iter()
            .filter(|&pid| !matches!(self.real_proc.stat(pid), Ok((_, RunState::Running))))
            .collect();
        if exited.is_empty() {
            return;
        }
        self.with(|s| {
            for pid in exited {
                s.real.remove(&pid);
                for card in &mut s.cards {
                    card.processes.remove(&pid);
                }
            }
        });
    }
}

impl GpuSampler for FakeGpu {
    fn sample(&self) -> Result<Vec<GpuSample>, GpuError> {
        self.drop_exited();
        self.with(|s| {
            s.samples += 1;
            let due: Vec<FakeStep> = s
                .script
                .iter()
                .filter(|(at, _)| *at == s.samples)
                .map(|(_, step)| *step)
                .collect();
            for step in due {
                s.apply(step);
            }
            if s.failures > 0 {
                s.failures -= 1;
                return Err(GpuError::Nvml("GPU 0: GPU is lost (fake)".into()));
            }
            Ok(s.cards
                .iter()
                .enumerate()
                .map(|(i, card)| {
                    let used_mib = card.reserved_mib
                        + card.processes.values().map(|p| p.used_mib).sum::<u64>();
                    let busiest = card.processes.values().map(|p| p.util_percent).max();
                    let per_process: HashMap<u32, u32> = card
                        .processes
                        .iter()
                        .filter(|(_, p)| p.util_percent > 0)
                        .map(|(&pid, p)| (pid, p.util_percent))
                        .collect();
                    GpuSample {
                        index: i as u32,
                        uuid: format!("GPU-fake-{i:04}"),
                        name: "Fake GPU".into(),
                        utilization_percent: s
                            .card_utilization
                            .then(|| card.util_override.or(busiest).unwrap_or(0)),
                        memory_total_bytes: card.total_mib * MIB,
                        memory_used_bytes: used_mib.min(card.total_mib) * MIB,
                        memory_free_bytes: card.total_mib.saturating_sub(used_mib) * MIB,
                        processes: card
                            .processes
                            .iter()
                            .map(|(&pid, p)| GpuProcess {
                                pid,
                                used_bytes: Some(p.used_mib * MIB),
                            })
                            .collect(),
                        process_utilization: s.per_process_utilization.then_some(per_process),
                    }
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripted_memory_and_util() {
        let gpu = FakeGpu::new(2, 16_000);
        gpu.add_process(0, 10, 2_000);
        gpu.add_process(0, 11, 1_000);
        gpu.set_process_util(11, 40);
        gpu.set_reserved(0, 500);
        let s = gpu.sample().unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].memory_free_bytes, 12_500 * MIB);
        assert_eq!(s[0].utilization_percent, Some(40));
        assert!(s[0].process_active(11, 1));
        assert!(!s[0].process_active(10, 1));
        assert!(s[1].processes.is_empty());
        gpu.fail_next(1);
        assert!(gpu.sample().is_err());
        assert!(gpu.sample().is_ok());
    }

    #[test]
    fn whole_card_rule_without_per_process_figures() {
        let gpu = FakeGpu::new(1, 16_000).without_process_utilization();
        gpu.add_process(0, 10, 2_000);
        gpu.add_process(0, 11, 1_000);
        gpu.set_process_util(11, 40);
        let s = gpu.sample().unwrap();
        // The idle process looks busy too: the card is.
        assert!(s[0].process_active(10, 1));
    }

    #[test]
    fn exited_real_processes_free_their_memory() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let gpu = FakeGpu::new(1, 16_000);
        gpu.add_process(0, pid, 4_000);
        gpu.follow_real_process(pid);
        child.wait().unwrap();
        assert!(!gpu.holds(pid));
        assert_eq!(gpu.sample().unwrap()[0].memory_free_bytes, 16_000 * MIB);
    }
}
