//! The open-loop benches' rate search (`benches/common/rate_search.rs`) against
//! simulated machines whose capacity is known: a trial's p99 is within the bound at
//! or below the capacity and over it above. The benches report what this search
//! finds, so a search that stopped early or bisected the wrong gap would misreport
//! every open-loop figure (as it once reported a pause as a rate of 0).

#[path = "../../benches/common/rate_search.rs"]
mod rate_search;

use proptest::prelude::*;
use rate_search::{RateSearch, Trial};

const BOUND_MS: f64 = 25.0;
const FIRST: f64 = 400.0;
const STEPS: usize = 4;

/// Runs a search to its end on a machine that meets the bound up to `capacity` a
/// second; returns the best rate that met and every rate tried.
fn search(capacity: f64) -> (Option<f64>, Vec<f64>) {
    let mut s = RateSearch::new(BOUND_MS, FIRST, STEPS);
    let mut tried = Vec::new();
    while let Some(rate) = s.next_rate() {
        assert!(tried.len() < 100, "the search does not end: {tried:?}");
        tried.push(rate);
        let p99 = if rate <= capacity { 5.0 } else { 80.0 };
        s.record(Trial {
            rate,
            p50: 1.0,
            p99,
            refused: 0,
        });
    }
    let (met, trials) = s.outcome();
    // Every trial kept, in order, as it was given (the benches print them).
    let kept: Vec<f64> = trials.iter().map(|t| t.rate).collect();
    assert_eq!(kept, tried);
    assert!(trials.iter().all(|t| t.p50 == 1.0 && t.refused == 0));
    (met.map(|t| t.rate), tried)
}

/// After `STEPS` bisections of a gap whose ends are a factor 2 apart, the rate found
/// is within 2^(1/2^STEPS) of the capacity (and a rounding error).
fn precision() -> f64 {
    2f64.powf(1.0 / (1u32 << STEPS) as f64) * (1.0 + 1e-9)
}

#[test]
fn doubles_from_the_first_rate_then_bisects() {
    let (met, tried) = search(2_000.0);
    assert_eq!(&tried[..4], &[400.0, 800.0, 1_600.0, 3_200.0]);
    let met = met.expect("1,600 a second met");
    assert!(
        met <= 2_000.0 && met * precision() >= 2_000.0,
        "{met}: {tried:?}"
    );
    assert_eq!(tried.len(), 4 + STEPS);
}

#[test]
fn halves_where_the_first_rate_misses() {
    // The case that once ended the search at 0: the first rate missed.
    let (met, tried) = search(130.0);
    assert_eq!(
        &tried[..4],
        &[400.0, 200.0, 100.0, (100.0f64 * 200.0).sqrt()]
    );
    let met = met.expect("100 a second met");
    assert!(
        met <= 130.0 && met * precision() >= 130.0,
        "{met}: {tried:?}"
    );
}

#[test]
fn reports_nothing_where_even_the_lowest_rate_misses() {
    // Four halvings: 400, 200, 100, 50, 25; below that the search gives up.
    let (met, tried) = search(10.0);
    assert_eq!(met, None);
    assert_eq!(tried, vec![400.0, 200.0, 100.0, 50.0, 25.0]);
}

#[test]
fn ends_where_every_rate_meets() {
    let (met, tried) = search(f64::INFINITY);
    assert_eq!(tried.len(), 16, "doublings are bounded");
    assert_eq!(met, tried.last().copied());
}

#[test]
fn a_miss_at_the_first_rate_after_a_meet_is_not_a_bisection_of_nothing() {
    // Capacity exactly at the first rate: it meets, 800 misses, the gap is 400..800.
    let (met, tried) = search(FIRST);
    assert_eq!(met, Some(FIRST), "{tried:?}");
    assert!(
        tried[2..].iter().all(|&r| r > FIRST && r < 2.0 * FIRST),
        "{tried:?}"
    );
}

proptest! {
    /// Any capacity the search can reach is found to within its precision, never
    /// over it. Capacities spread evenly over each factor of 2, so that the halvings'
    /// range (25 to 400 a second) is drawn as often as the doublings'.
    #[test]
    fn finds_the_capacity(log2_capacity in 25f64.log2()..100_000f64.log2()) {
        let capacity = log2_capacity.exp2();
        let (met, tried) = search(capacity);
        let met = met.expect("a capacity of 25 a second or more is found");
        prop_assert!(met <= capacity, "{met} over {capacity}: {tried:?}");
        prop_assert!(met * precision() >= capacity, "{met} short of {capacity}: {tried:?}");
    }
}
