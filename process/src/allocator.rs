//! mimalloc's purge delay: how long freed memory stays with the process before
//! mimalloc gives it back to the OS.
//!
//! With mimalloc 3's default (1 s) the webhook gives back pages between bursts of
//! reviews and faults them in zeroed on the next, so a warm review pays the kernel
//! zeroing pages; a 10 s delay keeps them across the gaps between bursts
//! (docs/webhook.md, "Performance": the allocator). The cost: memory freed after a
//! burst goes back to the OS after 10 s instead of 1 s (memory in mimalloc's arenas,
//! ten times the delay: 100 s instead of 10).
//!
//! The only `unsafe` in the workspace's own code: two calls into the mimalloc library
//! the binary already links (`mi_option_set` ignores an index out of range; mimalloc
//! reads the delay each time it purges, so setting it after start-up takes effect).
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_long};

// Links the mimalloc C library that `mi_option_*` below live in, for binaries whose
// global allocator is another (this crate's tests).
use libmimalloc_sys as _;

/// What [`delay_purges`] sets, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 10_000;

/// The environment variable through which an operator sets the delay (mimalloc reads
/// it itself at start-up); where it is set, [`delay_purges`] leaves the option alone.
pub const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (include/mimalloc.h of
/// libmimalloc-sys 0.1.49): the crate names no constant for it, so the index is
/// written here, and `the_index_is_the_purge_delay` checks it against the option's
/// documented default.
const MI_OPTION_PURGE_DELAY: c_int = 15;

extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// Where the purge delay came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeDelay {
    /// Set to [`PURGE_DELAY_MS`] by [`delay_purges`].
    Set(i64),
    /// Left as the operator's `MIMALLOC_PURGE_DELAY` made it.
    FromEnvironment(i64),
}

/// The line a bench prints so that its figures say which allocator setting they
/// measured: "mimalloc, purge delay 10000 ms (set at start-up)".
impl std::fmt::Display for PurgeDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PurgeDelay::Set(ms) => write!(f, "mimalloc, purge delay {ms} ms (set at start-up)"),
            PurgeDelay::FromEnvironment(ms) => {
                write!(f, "mimalloc, purge delay {ms} ms (from {PURGE_DELAY_ENV})")
            }
        }
    }
}

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`] unless `MIMALLOC_PURGE_DELAY` is
/// set. Called first thing by the `gpu-booking` binary and the benches, whose global
/// allocator is mimalloc; harmless where it is not (the option is only read).
pub fn delay_purges() -> PurgeDelay {
    if std::env::var_os(PURGE_DELAY_ENV).is_some() {
        return PurgeDelay::FromEnvironment(purge_delay_ms());
    }
    // SAFETY: `mi_option_set` takes an option index and a value by value and stores
    // the value in mimalloc's option table; any index below `_mi_option_last` is
    // valid, and 15 is (the test below).
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as c_long) };
    PurgeDelay::Set(purge_delay_ms())
}

/// mimalloc's purge delay now, in milliseconds (-1: never purge).
// `c_long` is `i64` here, `i32` on other targets.
#[allow(clippy::useless_conversion)]
pub fn purge_delay_ms() -> i64 {
    // SAFETY: as in `delay_purges`; reading an option initialises it from the
    // environment once and returns it.
    i64::from(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one test that touches the option (tests run in threads of one process).
    #[test]
    fn the_index_is_the_purge_delay() {
        if let Some(set) = std::env::var_os(PURGE_DELAY_ENV) {
            let expected = set.to_str().and_then(|s| s.parse().ok());
            let PurgeDelay::FromEnvironment(delay) = delay_purges() else {
                panic!("the operator's {PURGE_DELAY_ENV} was overridden");
            };
            assert!(expected.is_none_or(|ms: i64| ms == delay));
            return;
        }
        // mimalloc 3's default purge delay (src/options.c); the options next to it
        // default to 1 (`deprecated_eager_commit_delay`) and 0 (`use_numa_nodes`),
        // so an enum shifted either way fails here.
        assert_eq!(purge_delay_ms(), 1_000);
        assert_eq!(delay_purges(), PurgeDelay::Set(PURGE_DELAY_MS));
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        assert_eq!(
            PurgeDelay::Set(PURGE_DELAY_MS).to_string(),
            "mimalloc, purge delay 10000 ms (set at start-up)"
        );
    }
}
