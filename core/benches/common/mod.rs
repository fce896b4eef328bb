//! What the core benches share: how long to time each measure, and the timing.

use std::time::{Duration, Instant};

/// How long each measure runs: 3 s under `cargo bench`; run as a test (`cargo test
/// --all-targets`, no `--bench` argument) each runs once.
pub fn run_for() -> Duration {
    if std::env::args().any(|a| a == "--bench") {
        Duration::from_secs(3)
    } else {
        Duration::ZERO
    }
}

/// The mean time of `f` over at least `run_for` (once when it is zero).
pub fn time(run_for: Duration, mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut n = 0u32;
    while n == 0 || started.elapsed() < run_for {
        f();
        n += 1;
    }
    started.elapsed() / n
}

/// A generator of numbers in `0..n` from `seed` (xorshift): the same bookings in
/// every run, with no dependency for it.
pub fn numbers(mut seed: u64) -> impl FnMut(i64) -> i64 {
    move |n: i64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as i64
    }
}
