//! Ending GPU processes: each signal of the sequence ([`SignalSequence`], by default
//! SIGINT, SIGTERM, SIGKILL) to the processes still running, then up to the grace
//! period for them to exit before the next. PIDs are in the host PID namespace (the
//! DaemonSet runs with `hostPID`).
//!
//! Each process is opened as a pidfd first and then checked against what the agent
//! saw (start time and container): a PID that was reused in between is never
//! signalled, and the pidfd keeps naming the checked process until it is closed. A
//! pidfd becomes readable when its process exits, so the wait for the grace period
//! is one `poll(2)` over all of them (on a blocking thread) that ends as soon as the
//! last one is gone. Kernels older than 5.3 (no `pidfd_open`) fall back to `kill(2)`
//! after the same check and look at `/proc` every 50 ms.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, PidfdFlags, Signal};

use crate::cgroup::ContainerRef;
use crate::procfs::{ProcError, ProcFs, RunState};
use crate::signal_policy::{ReclaimSignal, SignalSequence};

/// How often the fallback looks at `/proc` for an exit.
const POLL: Duration = Duration::from_millis(50);

/// A process to end, as the agent saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    pub start_time: u64,
    pub container: ContainerRef,
}

/// What happened to one process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KillOutcome {
    pub pid: u32,
    /// Signals sent, in order: `INT`, `TERM`, `KILL` ...
    pub signals: Vec<&'static str>,
    /// It has exited (or was already gone).
    pub exited: bool,
    /// Why it was left alone or could not be signalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone)]
enum Handle {
    Pidfd(Arc<OwnedFd>),
    Pid(u32),
}

struct Live {
    index: usize,
    handle: Handle,
}

/// Sends the signals.
#[derive(Debug, Clone)]
pub struct Killer {
    proc: ProcFs,
    /// The signals, in order.
    pub sequence: SignalSequence,
    /// After each signal but SIGKILL, before the next.
    pub grace: Duration,
    /// How long to wait for an exit after SIGKILL.
    pub kill_wait: Duration,
}

impl Killer {
    pub fn new(
        proc: ProcFs,
        sequence: SignalSequence,
        grace: Duration,
        kill_wait: Duration,
    ) -> Self {
        Self {
            proc,
            sequence,
            grace,
            kill_wait,
        }
    }

    /// Ends every target: each signal of the sequence to those still running, then
    /// the grace period (after SIGKILL, the kill wait).
    pub async fn terminate(&self, targets: &[Target]) -> Vec<KillOutcome> {
        let mut outcomes: Vec<KillOutcome> = targets
            .iter()
            .map(|t| KillOutcome {
                pid: t.pid,
                signals: Vec::new(),
                exited: false,
                error: None,
            })
            .collect();
        let mut live = Vec::new();
        for (index, target) in targets.iter().enumerate() {
            match self.open(target) {
                Ok(Some(handle)) => live.push(Live { index, handle }),
                Ok(None) => outcomes[index].exited = true,
                Err(e) => outcomes[index].error = Some(e),
            }
        }
        for &step in self.sequence.signals() {
            if live.is_empty() {
                break;
            }
            let (signal, name) = (step.signal(), step.name());
            let wait = if step == ReclaimSignal::Kill {
                self.kill_wait
            } else {
                self.grace
            };
            let mut sent = Vec::new();
            for l in live.drain(..) {
                let outcome = &mut outcomes[l.index];
                match send(&l.handle, signal) {
                    Ok(()) => {
                        outcome.signals.push(name);
                        sent.push(l);
                    }
                    Err(Errno::SRCH) => outcome.exited = true,
                    Err(e) => outcome.error = Some(format!("SIG{name}: {e}")),
                }
            }
            let exited = self.wait_exits(&sent, Instant::now() + wait).await;
            for (i, l) in sent.into_iter().enumerate() {
                if exited.contains(&i) {
                    outcomes[l.index].exited = true;
                } else {
                    live.push(l);
                }
            }
        }
        for l in live {
            let outcome = &mut outcomes[l.index];
            if outcome.error.is_none() {
                outcome.error = Some("still running after SIGKILL".into());
            }
        }
        outcomes
    }

    /// A handle on the process if it is still the one we saw; `None` if it is gone.
    fn open(&self, target: &Target) -> Result<Option<Handle>, String> {
        let Ok(raw) = i32::try_from(target.pid) else {
            return Err(format!("PID {} out of range", target.pid));
        };
        let pid = rustix::process::Pid::from_raw(raw)
            .ok_or_else(|| format!("PID {} is not a process", target.pid))?;
        let handle = match pidfd_open(pid, PidfdFlags::empty()) {
            Ok(fd) => Handle::Pidfd(Arc::new(fd)),
            Err(Errno::SRCH) => return Ok(None),
            Err(Errno::NOSYS) => Handle::Pid(target.pid),
            Err(e) => return Err(format!("pidfd_open({}): {e}", target.pid)),
        };
        // Checked after opening: the pidfd now names this process for good.
        match self.proc.stat(target.pid) {
            Ok((start, _)) if start != target.start_time => {
                return Err(format!(
                    "PID {} was reused (start time {start}, expected {}); left alone",
                    target.pid, target.start_time
                ))
            }
            Ok((_, RunState::Zombie)) | Err(ProcError::Gone(_)) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        match self.proc.container(target.pid) {
            Ok(Ok(c)) if c == target.container => Ok(Some(handle)),
            Ok(_) => Err(format!(
                "PID {} is no longer in container {}; left alone",
                target.pid, target.container.container_id
            )),
            Err(ProcError::Gone(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Which of `sent` (by position) exited before `deadline`.
    async fn wait_exits(&self, sent: &[Live], deadline: Instant) -> HashSet<usize> {
        let handles: Vec<Handle> = sent.iter().map(|l| l.handle.clone()).collect();
        let proc = self.proc.clone();
        tokio::task::spawn_blocking(move || wait_blocking(&proc, &handles, deadline))
            .await
            .unwrap_or_default()
    }
}

fn wait_blocking(proc: &ProcFs, handles: &[Handle], deadline: Instant) -> HashSet<usize> {
    let mut exited = HashSet::new();
    loop {
        let mut pidfds = Vec::new();
        let mut any_pid = false;
        for (i, h) in handles.iter().enumerate() {
            if exited.contains(&i) {
                continue;
            }
            match h {
                Handle::Pidfd(fd) => pidfds.push((i, fd.clone())),
                Handle::Pid(pid) => {
                    if matches!(proc.stat(*pid), Ok((_, RunState::Running))) {
                        any_pid = true;
                    } else {
                        exited.insert(i);
                    }
                }
            }
        }
        let now = Instant::now();
        if (pidfds.is_empty() && !any_pid) || now >= deadline {
            return exited;
        }
        let mut wait = deadline - now;
        if any_pid {
            wait = wait.min(POLL);
        }
        let timeout = Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut fds: Vec<PollFd<'_>> = pidfds
            .iter()
            .map(|(_, fd)| PollFd::new(fd.as_ref(), PollFlags::IN))
            .collect();
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(Errno::INTR) => {}
            // Cannot wait: give up on the grace period rather than spin.
            Err(_) => return exited,
        }
        for (fd, (i, _)) in fds.iter().zip(&pidfds) {
            if !fd.revents().is_empty() {
                exited.insert(*i);
            }
        }
    }
}

fn send(handle: &Handle, signal: Signal) -> Result<(), Errno> {
    match handle {
        Handle::Pidfd(fd) => pidfd_send_signal(fd.as_ref(), signal),
        Handle::Pid(pid) => {
            let raw = i32::try_from(*pid).map_err(|_| Errno::SRCH)?;
            let pid = rustix::process::Pid::from_raw(raw).ok_or(Errno::SRCH)?;
            rustix::process::kill_process(pid, signal)
        }
    }
}
