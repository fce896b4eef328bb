//! The one parser for every duration option of every component (`--booking-timeout`,
//! `--cooldown`, `--term-grace`, ...): humantime syntax (`2s`, `500ms`, `14days`,
//! `1day 12h`) or a bare number of seconds (`2`, `1.5`), never negative, and never
//! longer than [`MAX`]. The guard is what keeps `1e30` or `9999999999years` a clear
//! clap error instead of a panic in `Duration::from_secs_f64` or an overflow later in
//! `Instant + d` / `DateTime + d`.

use std::time::Duration;

use chrono::TimeDelta;

/// The longest duration any option accepts: 100 years (of 365 days). Far beyond any
/// sensible timeout or policy, and far inside what `Instant`, `TimeDelta` and
/// `DateTime<Utc>` arithmetic can hold.
pub const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses a duration option; see the module documentation for the syntax.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let out_of_range = || format!("{s:?}: must be between 0s and 100 years");
    // A bare number is seconds. Check the range before `from_secs_f64`, which
    // panics on values it cannot hold.
    if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 || secs > MAX.as_secs_f64() {
            return Err(out_of_range());
        }
        return Ok(Duration::from_secs_f64(secs));
    }
    // humantime reports its own overflow as an error (never a panic).
    let d = humantime::parse_duration(t).map_err(|e| format!("{s:?}: {e}"))?;
    if d > MAX {
        return Err(out_of_range());
    }
    Ok(d)
}

/// [`parse_duration`] as a `chrono::TimeDelta`, for options used in date arithmetic.
pub fn parse_time_delta(s: &str) -> Result<TimeDelta, String> {
    let d = parse_duration(s)?;
    // Cannot fail under MAX; mapped rather than unwrapped all the same.
    TimeDelta::from_std(d).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humantime_and_bare_seconds() {
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_duration("1day 12h"),
            Ok(Duration::from_secs(36 * 3600))
        );
        assert_eq!(parse_time_delta("14days"), Ok(TimeDelta::days(14)));
    }

    #[test]
    fn out_of_range_and_nonsense_are_errors_not_panics() {
        for bad in [
            "1e30",
            "-1",
            "-0.5",
            "NaN",
            "inf",
            "-inf",
            "1e10",
            "3153600001",
            "101years",
            "9999999999years",
            "99999999999999999999999999s",
            "",
            "soon",
            "5 parsecs",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
            assert!(parse_time_delta(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_duration("3153600000"), Ok(MAX));
    }

    #[test]
    fn clap_reports_a_bad_duration_as_a_usage_error() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[arg(long, value_parser = parse_duration)]
            timeout: Duration,
        }
        let err = Cli::try_parse_from(["x", "--timeout=1e30"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            err.to_string().contains("between 0s and 100 years"),
            "{err}"
        );
    }
}
