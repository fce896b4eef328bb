//! Which signals end a pod's GPU processes, in order (the PRD's FR-8: the signal
//! policy is a setting). Pure.
//!
//! The default is SIGINT, then SIGTERM, then SIGKILL. SIGINT is what Jupyter's
//! "interrupt" sends: a Python program gets a `KeyboardInterrupt` and runs its
//! `finally` and `with` blocks (a checkpoint written, a file closed), where SIGTERM's
//! default action ends it on the spot. A Jupyter kernel that runs no cell ignores
//! SIGINT, so an idle kernel goes on to SIGTERM after the wait. The sequence always
//! ends with SIGKILL: a reclaim that may leave the process on the GPU frees nothing.

use std::fmt;

use rustix::process::Signal;

/// The default sequence of `--reclaim-signals`.
pub const DEFAULT_RECLAIM_SIGNALS: &str = "INT,TERM,KILL";

/// A signal the agent may send to a GPU process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReclaimSignal {
    Int,
    Hup,
    /// Some training frameworks checkpoint and exit on SIGUSR1.
    Usr1,
    Usr2,
    Term,
    Kill,
}

const ALL: [ReclaimSignal; 6] = [
    ReclaimSignal::Int,
    ReclaimSignal::Hup,
    ReclaimSignal::Usr1,
    ReclaimSignal::Usr2,
    ReclaimSignal::Term,
    ReclaimSignal::Kill,
];

impl ReclaimSignal {
    /// The name without `SIG`, as metrics, logs and audit rows carry it.
    pub fn name(self) -> &'static str {
        match self {
            ReclaimSignal::Int => "INT",
            ReclaimSignal::Hup => "HUP",
            ReclaimSignal::Usr1 => "USR1",
            ReclaimSignal::Usr2 => "USR2",
            ReclaimSignal::Term => "TERM",
            ReclaimSignal::Kill => "KILL",
        }
    }

    pub(crate) fn signal(self) -> Signal {
        match self {
            ReclaimSignal::Int => Signal::INT,
            ReclaimSignal::Hup => Signal::HUP,
            ReclaimSignal::Usr1 => Signal::USR1,
            ReclaimSignal::Usr2 => Signal::USR2,
            ReclaimSignal::Term => Signal::TERM,
            ReclaimSignal::Kill => Signal::KILL,
        }
    }

    /// `INT`, `SIGINT` or `sigint`.
    fn parse(s: &str) -> Result<Self, String> {
        let upper = s.trim().to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        ALL.into_iter()
            .find(|sig| sig.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ALL.iter().map(|s| s.name()).collect();
                format!("{s:?}: not a signal the agent sends ({})", names.join(", "))
            })
    }
}

/// The signals of a reclaim, in order: each goes to the processes still running,
/// after the wait that followed the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSequence(Vec<ReclaimSignal>);

impl SignalSequence {
    /// `INT,TERM,KILL`: comma-separated, no signal twice, KILL last.
    pub fn parse(s: &str) -> Result<Self, String> {
        let signals = s
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(ReclaimSignal::parse)
            .collect::<Result<Vec<_>, _>>()?;
        for (i, sig) in signals.iter().enumerate() {
            if signals[..i].contains(sig) {
                return Err(format!("{s:?}: {} is listed twice", sig.name()));
            }
        }
        if signals.last() != Some(&ReclaimSignal::Kill) {
            return Err(format!(
                "{s:?}: the last signal must be KILL (a process may ignore any other)"
            ));
        }
        Ok(Self(signals))
    }

    /// SIGTERM, then SIGKILL: the PRD's sequence.
    pub fn term_kill() -> Self {
        Self(vec![ReclaimSignal::Term, ReclaimSignal::Kill])
    }

    pub fn signals(&self) -> &[ReclaimSignal] {
        &self.0
    }
}

impl Default for SignalSequence {
    fn default() -> Self {
        Self(vec![
            ReclaimSignal::Int,
            ReclaimSignal::Term,
            ReclaimSignal::Kill,
        ])
    }
}

impl fmt::Display for SignalSequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.name()).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_interrupts_first_and_kills_last() {
        let default = SignalSequence::parse(DEFAULT_RECLAIM_SIGNALS).unwrap();
        assert_eq!(default, SignalSequence::default());
        assert_eq!(default.to_string(), "INT,TERM,KILL");
        assert_eq!(
            SignalSequence::parse("sigterm, SIGKILL").unwrap(),
            SignalSequence::term_kill()
        );
        assert_eq!(
            SignalSequence::parse("KILL").unwrap().signals(),
            [ReclaimSignal::Kill]
        );
        assert_eq!(
            SignalSequence::parse("USR1,INT,HUP,TERM,KILL")
                .unwrap()
                .signals()
                .len(),
            5
        );
    }

    #[test]
    fn kill_must_be_last_and_nothing_twice() {
        for bad in [
            "",
            "INT,TERM",
            "KILL,TERM",
            "TERM,KILL,KILL",
            "INT,INT,KILL",
            "STOP,KILL",
            "9,KILL",
            "TERM;KILL",
        ] {
            assert!(SignalSequence::parse(bad).is_err(), "{bad:?}");
        }
        let err = SignalSequence::parse("TERM,TERM,KILL").unwrap_err();
        assert!(err.contains("TERM is listed twice"), "{err}");
    }

    #[test]
    fn names_are_the_kernels() {
        for sig in ALL {
            assert_eq!(ReclaimSignal::parse(sig.name()), Ok(sig));
        }
        assert_eq!(ReclaimSignal::Int.signal(), Signal::INT);
        assert_eq!(ReclaimSignal::Kill.signal(), Signal::KILL);
    }
}
