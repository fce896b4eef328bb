//! What the agent reads about a process under a configurable `/proc` root (the host's
//! `/proc` in the DaemonSet, a temp dir in tests).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::cgroup::{parse_cgroup, ContainerRef, Unattributed};

/// Longest command line kept as evidence; the rest is cut (with `...`).
pub const MAX_CMDLINE: usize = 1024;
/// Largest file read from `/proc/<pid>` (cgroup files are a few hundred bytes).
const MAX_READ: u64 = 64 * 1024;

/// A `/proc` tree.
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

/// One process, as read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// Start time in clock ticks since boot (`stat` field 22): with the PID it names
    /// one process, so a reused PID is never mistaken for the one we saw.
    pub start_time: u64,
    /// `comm` (at most 15 bytes, set by the process).
    pub comm: String,
    /// The base name of `argv[0]`, or `comm` when the command line is empty.
    pub name: String,
    /// Arguments joined by spaces, at most [`MAX_CMDLINE`] bytes.
    pub cmdline: String,
    /// The pod and container, or why not.
    pub container: Result<ContainerRef, Unattributed>,
}

/// Why a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("process {0} is gone")]
    Gone(u32),
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unreadable stat line")]
    BadStat { path: PathBuf },
}

/// Run state from `stat` field 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Running,
    /// Exited, not yet reaped: it holds no GPU context any more.
    Zombie,
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, pid: u32, file: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(file)
    }

    fn read(&self, pid: u32, file: &str) -> Result<Vec<u8>, ProcError> {
        let path = self.path(pid, file);
        let mut buf = Vec::new();
        let opened =
            std::fs::File::open(&path).and_then(|f| f.take(MAX_READ).read_to_end(&mut buf));
        match opened {
            Ok(_) => Ok(buf),
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::NotFound)
                    || e.raw_os_error() == Some(3) =>
            {
                Err(ProcError::Gone(pid))
            }
            Err(source) => Err(ProcError::Io { path, source }),
        }
    }

    /// Start time and run state from `/proc/<pid>/stat`.
    pub fn stat(&self, pid: u32) -> Result<(u64, RunState), ProcError> {
        let raw = self.read(pid, "stat")?;
        let text = String::from_utf8_lossy(&raw);
        parse_stat(&text).ok_or_else(|| ProcError::BadStat {
            path: self.path(pid, "stat"),
        })
    }

    /// The pod and container of a process, from its cgroup file.
    pub fn container(&self, pid: u32) -> Result<Result<ContainerRef, Unattributed>, ProcError> {
        let raw = self.read(pid, "cgroup")?;
        Ok(parse_cgroup(&String::from_utf8_lossy(&raw)))
    }

    /// Everything the agent wants to know about a process.
    pub fn process(&self, pid: u32) -> Result<ProcessInfo, ProcError> {
        let (start_time, _) = self.stat(pid)?;
        let container = self.container(pid)?;
        let comm = String::from_utf8_lossy(&self.read(pid, "comm").unwrap_or_default())
            .trim_end()
            .to_owned();
        let raw = self.read(pid, "cmdline").unwrap_or_default();
        let args: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let name = args
            .first()
            .and_then(|a0| a0.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .map_or_else(|| comm.clone(), str::to_owned);
        Ok(ProcessInfo {
            pid,
            start_time,
            comm,
            name,
            cmdline: truncate(args.join(" ")),
            container,
        })
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_CMDLINE {
        let mut cut = MAX_CMDLINE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// `pid (comm) S ppid ... starttime ...`: the comm may hold spaces and parentheses, so
/// the fields are counted after the last `)`.
fn parse_stat(text: &str) -> Option<(u64, RunState)> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); starttime is field 22.
    let state = match *fields.first()? {
        "Z" | "X" | "x" => RunState::Zombie,
        _ => RunState::Running,
    };
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((start, state))
}

/// A `stat` line for a fake `/proc` tree (tests and the benchmark).
pub fn fake_stat_line(pid: u32, comm: &str, start_time: u64) -> String {
    let mut fields = vec!["S".to_owned()];
    fields.extend((4..22).map(|_| "0".to_owned()));
    fields.push(start_time.to_string());
    fields.extend((23..=52).map(|_| "0".to_owned()));
    format!("{pid} ({comm}) {}\n", fields.join(" "))
}

/// Writes a fake `/proc/<pid>` (stat, comm, cmdline, cgroup) under `root`.
pub fn write_fake_process(
    root: &Path,
    pid: u32,
    start_time: u64,
    argv: &[&str],
    cgroup: &str,
) -> std::io::Result<()> {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir)?;
    let comm: String = argv
        .first()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or("")
        .chars()
        .take(15)
        .collect();
    std::fs::write(dir.join("stat"), fake_stat_line(pid, &comm, start_time))?;
    std::fs::write(dir.join("comm"), format!("{comm}\n"))?;
    let mut cmdline = Vec::new();
    for a in argv {
        cmdline.extend_from_slice(a.as_bytes());
        cmdline.push(0);
    }
    std::fs::write(dir.join("cmdline"), cmdline)?;
    std::fs::write(dir.join("cgroup"), cgroup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let line = fake_stat_line(42, "a) (b c", 12345);
        assert_eq!(parse_stat(&line), Some((12345, RunState::Running)));
        let zombie = line.replacen(") S ", ") Z ", 1);
        assert_eq!(parse_stat(&zombie), Some((12345, RunState::Zombie)));
        assert_eq!(parse_stat("42 (x) S 1 2"), None);
        assert_eq!(parse_stat("no paren"), None);
    }

    #[test]
    fn reads_the_real_proc_for_this_process() {
        let me = std::process::id();
        let proc = ProcFs::new("/proc");
        let info = proc.process(me).unwrap();
        assert!(info.start_time > 0);
        assert!(!info.name.is_empty());
        // The test runner is not in a pod (or, in CI inside Kubernetes, it is; either
        // way the answer is a value, not an error).
        let _ = info.container;
    }

    #[test]
    fn fake_tree() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(3000);
        write_fake_process(
            dir.path(),
            7,
            99,
            &["/usr/bin/python3", "-m", &long],
            "0::/init.scope",
        )
        .unwrap();
        let proc = ProcFs::new(dir.path());
        let info = proc.process(7).unwrap();
        assert_eq!(info.start_time, 99);
        assert_eq!(info.name, "python3");
        assert_eq!(info.comm, "python3");
        assert!(info.cmdline.starts_with("/usr/bin/python3 -m xxx"));
        assert!(info.cmdline.len() <= MAX_CMDLINE + 3);
        assert!(matches!(proc.process(8), Err(ProcError::Gone(8))));
    }
}
