//! CPU time and memory: the whole process's, read from /proc/self, and each
//! component's, by the threads of its runtime (named after it) and the heap its
//! threads allocated (`alloc.rs`).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::alloc::{self, Component};
use crate::figures::mib;

/// The threads of each component's runtime are named after it.
pub const CONTROLLER_THREADS: &str = "gb-controller";
pub const WEBHOOK_THREADS: &str = "gb-webhook";
pub const LAB_THREADS: &str = "gb-lab";
const THREADS: [&str; 3] = [CONTROLLER_THREADS, WEBHOOK_THREADS, LAB_THREADS];

/// Clock ticks a second (`getconf CLK_TCK`; 100 on Linux).
const TICKS: f64 = 100.0;

/// utime + stime of a `stat` line, in seconds.
fn stat_cpu(stat: &str) -> Option<f64> {
    // Fields after the command's closing parenthesis start at field 3; utime and
    // stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: f64 = fields.get(15 - 3)?.parse().ok()?;
    Some((utime + stime) / TICKS)
}

/// CPU seconds so far: the process, and the threads whose name starts with each of
/// `prefixes`.
#[derive(Debug, Clone, Default)]
struct Cpu {
    process: f64,
    by_prefix: BTreeMap<&'static str, f64>,
}

impl Cpu {
    fn now(prefixes: &[&'static str]) -> Cpu {
        let process = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| stat_cpu(&s))
            .unwrap_or(0.0);
        let mut by_prefix: BTreeMap<&'static str, f64> =
            prefixes.iter().map(|p| (*p, 0.0)).collect();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let path = task.path();
                let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
                let Some(prefix) = prefixes.iter().find(|p| comm.starts_with(**p)) else {
                    continue;
                };
                let cpu = std::fs::read_to_string(path.join("stat"))
                    .ok()
                    .and_then(|s| stat_cpu(&s))
                    .unwrap_or(0.0);
                *by_prefix.entry(prefix).or_default() += cpu;
            }
        }
        Cpu { process, by_prefix }
    }

    /// What was spent since `before`.
    fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            process: self.process - before.process,
            by_prefix: self
                .by_prefix
                .iter()
                .map(|(k, v)| (*k, v - before.by_prefix.get(k).copied().unwrap_or(0.0)))
                .collect(),
        }
    }

    fn of(&self, prefix: &str) -> f64 {
        self.by_prefix.get(prefix).copied().unwrap_or(0.0)
    }
}

/// (VmRSS, VmHWM) of the process, MiB.
pub fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

/// The machine's load average (1, 5, 15 minutes): how busy it was besides.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a component spent over a span: CPU seconds and its peak live heap, bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spent {
    pub cpu: f64,
    pub heap: i64,
}

/// What the controller, the webhook and the whole process spent from a moment on.
pub struct Spending {
    pub controller: Spent,
    pub webhook: Spent,
    /// The whole process's CPU seconds.
    pub process: f64,
    /// The lab's (everything else's) peak heap.
    pub lab_heap: i64,
    pub seconds: f64,
}

impl std::fmt::Display for Spending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU s controller {:.2}, webhook {:.2}, the rest of the process {:.2} (of {:.2} in {:.0} s: {:.2} cores busy); peak heap controller {}, webhook {}, lab {}",
            self.controller.cpu,
            self.webhook.cpu,
            self.process - self.controller.cpu - self.webhook.cpu,
            self.process,
            self.seconds,
            self.process / self.seconds.max(0.001),
            mib(self.controller.heap),
            mib(self.webhook.heap),
            mib(self.lab_heap),
        )
    }
}

/// CPU and heap from a moment on: a phase's (its peak heap starts anew) or the
/// whole run's (the heap's peak since the process started).
pub struct Meter {
    cpu: Cpu,
    began: Instant,
    whole_run: bool,
}

impl Meter {
    pub fn phase() -> Meter {
        for c in [Component::Lab, Component::Controller, Component::Webhook] {
            alloc::reset_peak(c);
        }
        Meter {
            cpu: Cpu::now(&THREADS),
            began: Instant::now(),
            whole_run: false,
        }
    }

    pub fn whole_run() -> Meter {
        Meter {
            cpu: Cpu::now(&THREADS),
            began: Instant::now(),
            whole_run: true,
        }
    }

    pub fn spent(&self) -> Spending {
        let cpu = Cpu::now(&THREADS).since(&self.cpu);
        let heap = |c| {
            if self.whole_run {
                alloc::top(c)
            } else {
                alloc::peak(c)
            }
        };
        Spending {
            controller: Spent {
                cpu: cpu.of(CONTROLLER_THREADS),
                heap: heap(Component::Controller),
            },
            webhook: Spent {
                cpu: cpu.of(WEBHOOK_THREADS),
                heap: heap(Component::Webhook),
            },
            process: cpu.process,
            lab_heap: heap(Component::Lab),
            seconds: self.began.elapsed().as_secs_f64(),
        }
    }
}
