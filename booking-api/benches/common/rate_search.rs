//! The search of the open-loop benches for the highest rate a bound holds at: pure
//! logic, apart from the trials it is fed, so that `tests/it/bench_rate_search.rs`
//! checks it against machines whose capacity it knows.

/// One trial of `sustained_rate`: the rate offered and the p50 / p99 it got.
#[derive(Debug, Clone, Copy)]
pub struct Trial {
    pub rate: f64,
    pub p50: f64,
    pub p99: f64,
    /// Operations refused in that trial (not in its latencies).
    pub refused: u64,
}

/// A search for the highest rate (per second) whose open-loop p99 stays within a
/// bound: offered rates double from the first until one misses, then the gap is
/// bisected (geometric mean) a given number of times. Where the first rate already
/// misses, rates halve until one meets (a few times at most), and the gap above it
/// is bisected the same way: a machine slower than the first rate still gets a
/// figure, not 0. It only says which rate to try next and takes each result, so that
/// two searches can run in lockstep (`sustained_rates_alternating`).
pub struct RateSearch {
    p99_ms: f64,
    next: Option<f64>,
    /// Doublings and halvings left (bounded, so that a machine where everything
    /// meets, or misses, the bound still ends), then the bisections' gap and how
    /// many are left.
    doublings_left: usize,
    halvings_left: usize,
    gap: Option<(f64, f64)>,
    steps_left: usize,
    met: Option<Trial>,
    /// The lowest rate that missed the bound so far.
    missed: Option<f64>,
    tried: Vec<Trial>,
}

impl RateSearch {
    pub fn new(p99_ms: f64, first: f64, steps: usize) -> Self {
        RateSearch {
            p99_ms,
            next: Some(first),
            doublings_left: 16,
            halvings_left: 4,
            gap: None,
            steps_left: steps,
            met: None,
            missed: None,
            tried: Vec::new(),
        }
    }

    /// The rate to try next; `None` once the search is over.
    pub fn next_rate(&self) -> Option<f64> {
        self.next
    }

    /// Takes the result of a trial at `next_rate()`.
    pub fn record(&mut self, t: Trial) {
        self.tried.push(t);
        let ok = t.p99 <= self.p99_ms;
        if ok {
            self.met = Some(t);
        } else {
            self.missed = Some(self.missed.map_or(t.rate, |m| m.min(t.rate)));
        }
        let gap = match (self.gap, self.met, self.missed) {
            (Some((low, high)), _, _) => {
                self.steps_left = self.steps_left.saturating_sub(1);
                if ok {
                    (t.rate, high)
                } else {
                    (low, t.rate)
                }
            }
            (None, Some(met), None) if self.doublings_left > 1 => {
                self.doublings_left -= 1;
                self.next = Some(met.rate * 2.0);
                return;
            }
            (None, None, Some(_)) if self.halvings_left > 0 => {
                self.halvings_left -= 1;
                self.next = Some(t.rate / 2.0);
                return;
            }
            // A rate met and a higher one missed: the gap to bisect.
            (None, Some(met), Some(missed)) => (met.rate, missed),
            _ => {
                self.next = None;
                return;
            }
        };
        self.gap = Some(gap);
        self.next = (self.steps_left > 0).then(|| (gap.0 * gap.1).sqrt());
    }

    /// The best trial that met the bound (`None` if every rate tried missed) and every
    /// trial, in order, for the record.
    pub fn outcome(self) -> (Option<Trial>, Vec<Trial>) {
        (self.met, self.tried)
    }
}
