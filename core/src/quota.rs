//! A group's quotas: GPU-hours per period, and units its bookings may hold at once.
//!
//! - GPU-hours are unit-hours of the group's bookings (not cancelled; a booking
//!   ended early counts to its real end), planned ones included, since a booking
//!   holds its units whether or not its pods use them. A booking that spans periods
//!   counts in each period the hours that fall in it (a booking from 30 November
//!   to 3 December counts one day in November and two in December).
//! - A period is the calendar month in the lab's time zone ([`PeriodKind::Month`]),
//!   or one of the terms an admin defines ([`PeriodKind::Term`]); with terms, hours
//!   outside every term are not limited.
//! - Units at once: at no instant do the group's bookings hold more units than the
//!   quota (the peak over the new booking's window, as capacity counts a model's).
//! - A booking counts against the group whose policy applied when it was created
//!   (`crate::groups`); an admin's override books past a quota (and is audited).

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;

use crate::capacity;
use crate::lab_days;
use crate::rules::{rfc3339, Refusal, RuleCode};
use crate::window::Window;

/// What a group's quota periods are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeriodKind {
    /// Calendar months in the lab's time zone.
    #[default]
    Month,
    /// The admin's terms (`quota_term`).
    Term,
}

impl PeriodKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodKind::Month => "month",
            PeriodKind::Term => "term",
        }
    }

    pub fn parse(s: &str) -> Option<PeriodKind> {
        match s {
            "month" => Some(PeriodKind::Month),
            "term" => Some(PeriodKind::Term),
            _ => None,
        }
    }
}

/// A group's quota; `None` limits nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub gpu_hours: Option<u32>,
    pub period: PeriodKind,
    pub units: Option<u32>,
}

impl Quota {
    /// Whether anything is limited (a create of a group without quotas reads no
    /// bookings of the group).
    pub fn limits(&self) -> bool {
        self.gpu_hours.is_some() || self.units.is_some()
    }
}

/// A term an admin defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub name: String,
    pub window: Window,
}

/// One period of a quota: its name (`2026-12`, or the term's) and its window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    pub name: String,
    pub window: Window,
}

/// A booking of the group as the quota counts it: its window and its units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub window: Window,
    pub units: u32,
}

/// The instant a local date begins in `zone` (the lab day's start; where a
/// daylight-saving change skips midnight, the first local time that exists).
fn local_start(zone: Tz, date: NaiveDate) -> DateTime<Utc> {
    // Only outside chrono's range is there none; UTC's midnight is the fallback.
    lab_days::day_start(zone, date)
        .unwrap_or_else(|| Utc.from_utc_datetime(&date.and_time(NaiveTime::MIN)))
}

/// The calendar month of `t` in `zone`.
pub fn month_of(t: DateTime<Utc>, zone: Tz) -> Period {
    let local = t.with_timezone(&zone).date_naive();
    let first = local.with_day(1).unwrap_or(local);
    let next = first
        .checked_add_months(chrono::Months::new(1))
        .unwrap_or(first);
    let (start, end) = (local_start(zone, first), local_start(zone, next));
    let window = Window::new(start, end).unwrap_or_else(|_| unreachable_window());
    Period {
        name: format!("{:04}-{:02}", first.year(), first.month()),
        window,
    }
}

/// A window for a month that cannot be one (times near chrono's limits, which the
/// rules refuse before a quota is counted).
fn unreachable_window() -> Window {
    let epoch = DateTime::<Utc>::UNIX_EPOCH;
    // One day after the epoch is after it: the constructor cannot fail.
    Window::new(epoch, epoch + TimeDelta::days(1)).unwrap_or_else(|_| unreachable!())
}

/// The periods that `window` touches, in order.
pub fn periods(kind: PeriodKind, zone: Tz, terms: &[Term], window: &Window) -> Vec<Period> {
    match kind {
        PeriodKind::Month => {
            let mut out: Vec<Period> = Vec::new();
            let mut t = window.start();
            // A booking is bounded (the rules cap its length), so are its months;
            // the cap keeps an override's decade-long booking cheap too.
            while t < window.end() && out.len() < 1200 {
                let p = month_of(t, zone);
                t = p.window.end();
                out.push(p);
            }
            out
        }
        PeriodKind::Term => {
            let mut out: Vec<Period> = terms
                .iter()
                .filter(|term| term.window.overlaps(window))
                .map(|term| Period {
                    name: term.name.clone(),
                    window: term.window,
                })
                .collect();
            out.sort_by_key(|p| p.window.start());
            out
        }
    }
}

/// The period `t` falls in, if any (a month always; a term only inside one).
pub fn period_at(kind: PeriodKind, zone: Tz, terms: &[Term], t: DateTime<Utc>) -> Option<Period> {
    let instant = Window::new(t, t + TimeDelta::microseconds(1)).ok()?;
    periods(kind, zone, terms, &instant).into_iter().next()
}

/// The unit-seconds of `window` (held by `units`) that fall in `period`.
pub fn unit_seconds_in(window: &Window, units: u32, period: &Window) -> i64 {
    let start = window.start().max(period.start());
    let end = window.end().min(period.end());
    if end <= start {
        return 0;
    }
    (end - start).num_seconds().saturating_mul(i64::from(units))
}

/// The unit-seconds that `bookings` hold in `period`.
pub fn used_in(bookings: &[Counted], period: &Window) -> i64 {
    bookings
        .iter()
        .map(|b| unit_seconds_in(&b.window, b.units, period))
        .fold(0i64, i64::saturating_add)
}

/// The most units `bookings` hold at one instant inside `window`.
pub fn peak_units(bookings: &[Counted], window: &Window) -> u32 {
    let windows = capacity::unit_windows(bookings.iter().map(|b| (b.window, b.units)));
    u32::try_from(capacity::peak_in(&windows, window)).unwrap_or(u32::MAX)
}

/// GPU-hours as the messages show them: whole hours, or one decimal.
pub fn hours(unit_seconds: i64) -> String {
    let tenths = unit_seconds.max(0) / 360;
    if tenths % 10 == 0 {
        format!("{}", tenths / 10)
    } else {
        format!("{}.{}", tenths / 10, tenths % 10)
    }
}

/// What a group needs to decide a create or a change against its quota.
#[derive(Debug, Clone, Copy)]
pub struct QuotaCheck<'a> {
    pub group: &'a str,
    pub quota: &'a Quota,
    pub zone: Tz,
    pub terms: &'a [Term],
    /// The group's bookings (not cancelled) that can meet the new window's periods
    /// and the window itself, without the booking being changed.
    pub held: &'a [Counted],
}

/// Whether a booking of `need` units over `window` fits the group's quota, with
/// what is left when it does not. An admin's override is not checked here: the
/// caller skips the check (and audits that it did).
pub fn check(q: &QuotaCheck<'_>, window: &Window, need: u32) -> Result<(), Refusal> {
    if let Some(limit) = q.quota.gpu_hours {
        let limit_s = i64::from(limit).saturating_mul(3600);
        for period in periods(q.quota.period, q.zone, q.terms, window) {
            let used = used_in(q.held, &period.window);
            let wanted = unit_seconds_in(window, need, &period.window);
            if used.saturating_add(wanted) > limit_s {
                let left = (limit_s - used).max(0);
                return Err(Refusal::new(
                    RuleCode::QuotaHours,
                    format!(
                        "{} has {} of its {limit} GPU-hours left in {} ({} to {}); this booking needs {} there.",
                        q.group,
                        hours(left),
                        period.name,
                        rfc3339(period.window.start()),
                        rfc3339(period.window.end()),
                        hours(wanted)
                    ),
                ));
            }
        }
    }
    if let Some(limit) = q.quota.units {
        let peak = peak_units(q.held, window);
        if u64::from(peak) + u64::from(need) > u64::from(limit) {
            return Err(Refusal::new(
                RuleCode::QuotaUnits,
                format!(
                    "{}'s bookings may hold {limit} GPUs at once; they hold up to {peak} during this window, so {} {} left; this booking asks for {need}.",
                    q.group,
                    limit.saturating_sub(peak),
                    if limit.saturating_sub(peak) == 1 { "is" } else { "are" },
                ),
            ));
        }
    }
    Ok(())
}

/// The window over which a create or change of `window` must read the group's
/// bookings: the periods it touches and the window itself.
pub fn read_window(q: &Quota, zone: Tz, terms: &[Term], window: &Window) -> Window {
    let mut start = window.start();
    let mut end = window.end();
    if q.gpu_hours.is_some() {
        for p in periods(q.period, zone, terms, window) {
            start = start.min(p.window.start());
            end = end.max(p.window.end());
        }
    }
    Window::new(start, end).unwrap_or(*window)
}

/// A group's use against its quota at `now`, for the API and the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// The period `now` falls in (none: `term` quotas between terms, or no hours
    /// quota).
    pub period: Option<Period>,
    /// Unit-seconds the group's bookings hold in that period.
    pub used_seconds: i64,
    pub limit_seconds: Option<i64>,
    /// Units the group's bookings hold at `now`, and at most from `now` on.
    pub units_now: u32,
    pub units_peak_ahead: u32,
}

impl Use {
    /// Unit-seconds left in the period (`None`: no hours quota).
    pub fn left_seconds(&self) -> Option<i64> {
        self.limit_seconds.map(|l| (l - self.used_seconds).max(0))
    }
}

/// The group's use at `now` from its bookings (those over the period and from `now`
/// on).
pub fn use_at(
    quota: &Quota,
    zone: Tz,
    terms: &[Term],
    held: &[Counted],
    now: DateTime<Utc>,
) -> Use {
    let period = quota
        .gpu_hours
        .and_then(|_| period_at(quota.period, zone, terms, now));
    let used_seconds = period
        .as_ref()
        .map(|p| used_in(held, &p.window))
        .unwrap_or(0);
    let limit_seconds = match (&period, quota.gpu_hours) {
        (Some(_), Some(h)) => Some(i64::from(h) * 3600),
        _ => None,
    };
    let units_now = held
        .iter()
        .filter(|b| b.window.contains(now))
        .map(|b| b.units)
        .sum();
    let ahead = Window::new(now, DateTime::<Utc>::MAX_UTC).ok();
    let units_peak_ahead = ahead.map(|w| peak_units(held, &w)).unwrap_or(units_now);
    Use {
        period,
        used_seconds,
        limit_seconds,
        units_now,
        units_peak_ahead,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn w(a: &str, b: &str) -> Window {
        Window::new(t(a), t(b)).unwrap()
    }

    #[test]
    fn months_are_the_labs_calendar_months() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let p = month_of(t("2026-12-15T10:00:00Z"), berlin);
        assert_eq!(p.name, "2026-12");
        assert_eq!(p.window, w("2026-11-30T23:00:00Z", "2026-12-31T23:00:00Z"));
        // Daylight saving: March has 31 days less one hour in Berlin.
        let march = month_of(t("2027-03-10T00:00:00Z"), berlin);
        assert_eq!(
            march.window.duration(),
            TimeDelta::days(31) - TimeDelta::hours(1)
        );
        // Just after local midnight of 1 December is December, not November.
        assert_eq!(month_of(t("2026-11-30T23:30:00Z"), berlin).name, "2026-12");
        assert_eq!(month_of(t("2026-11-30T23:30:00Z"), Tz::UTC).name, "2026-11");
    }

    #[test]
    fn a_booking_over_two_months_counts_in_each() {
        let b = [Counted {
            window: w("2026-11-30T00:00:00Z", "2026-12-03T00:00:00Z"),
            units: 2,
        }];
        let nov = month_of(t("2026-11-10T00:00:00Z"), Tz::UTC).window;
        let dec = month_of(t("2026-12-10T00:00:00Z"), Tz::UTC).window;
        assert_eq!(used_in(&b, &nov), 2 * 24 * 3600);
        assert_eq!(used_in(&b, &dec), 2 * 48 * 3600);
    }

    #[test]
    fn refusals_say_what_is_left() {
        let quota = Quota {
            gpu_hours: Some(100),
            period: PeriodKind::Month,
            units: Some(4),
        };
        let held = [Counted {
            window: w("2026-12-01T00:00:00Z", "2026-12-04T00:00:00Z"),
            units: 1,
        }];
        let q = QuotaCheck {
            group: "ml-lab",
            quota: &quota,
            zone: Tz::UTC,
            terms: &[],
            held: &held,
        };
        // 72 used, 28 left; 48 asked.
        let r = check(&q, &w("2026-12-10T00:00:00Z", "2026-12-12T00:00:00Z"), 1).unwrap_err();
        assert_eq!(r.code, RuleCode::QuotaHours);
        assert!(
            r.message
                .contains("28 of its 100 GPU-hours left in 2026-12"),
            "{}",
            r.message
        );
        assert!(check(&q, &w("2026-12-10T00:00:00Z", "2026-12-11T00:00:00Z"), 1).is_ok());
        // Units: 1 held over the window, 4 allowed: 3 more fit, 4 do not.
        let window = w("2026-12-02T00:00:00Z", "2026-12-02T01:00:00Z");
        assert!(check(&q, &window, 3).is_ok());
        let r = check(&q, &window, 4).unwrap_err();
        assert_eq!(r.code, RuleCode::QuotaUnits);
        assert!(r.message.contains("so 3 are left"), "{}", r.message);
    }

    #[test]
    fn terms_limit_only_inside_terms() {
        let terms = [Term {
            name: "WS 2026".into(),
            window: w("2026-10-01T00:00:00Z", "2027-02-01T00:00:00Z"),
        }];
        let quota = Quota {
            gpu_hours: Some(10),
            period: PeriodKind::Term,
            units: None,
        };
        let q = QuotaCheck {
            group: "cs101",
            quota: &quota,
            zone: Tz::UTC,
            terms: &terms,
            held: &[],
        };
        assert_eq!(
            check(&q, &w("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"), 1)
                .unwrap_err()
                .code,
            RuleCode::QuotaHours
        );
        assert!(check(&q, &w("2027-03-01T00:00:00Z", "2027-03-05T00:00:00Z"), 1).is_ok());
        let u = use_at(&quota, Tz::UTC, &terms, &[], t("2027-03-01T00:00:00Z"));
        assert_eq!(u.period, None);
        assert_eq!(u.left_seconds(), None);
    }

    #[test]
    fn hours_read_like_text() {
        assert_eq!(hours(3600 * 12), "12");
        assert_eq!(hours(3600 * 12 + 1800), "12.5");
        assert_eq!(hours(-5), "0");
    }

    fn zone() -> impl Strategy<Value = Tz> {
        prop_oneof![
            Just(Tz::UTC),
            Just("Europe/Berlin".parse::<Tz>().unwrap()),
            Just("America/Santiago".parse::<Tz>().unwrap()),
            Just("Australia/Lord_Howe".parse::<Tz>().unwrap()),
        ]
    }

    proptest! {
        /// Against a reference model: requests (hour-aligned windows over three
        /// months, including daylight-saving changes) are accepted one after the
        /// other only when the check says so; afterwards no month holds more than
        /// the quota's hours, counted hour by hour, and no hour more than its units.
        #[test]
        fn quota_is_never_exceeded(
            zone in zone(),
            limit_h in 0u32..200,
            limit_u in 0u32..5,
            reqs in proptest::collection::vec((0i64..(24 * 95), 1i64..(24 * 10), 1u32..4), 1..30),
        ) {
            let base = t("2027-02-15T00:00:00Z");
            let quota = Quota { gpu_hours: Some(limit_h), period: PeriodKind::Month, units: Some(limit_u) };
            let mut held: Vec<Counted> = Vec::new();
            for (start_h, len_h, need) in reqs {
                let window = Window::new(
                    base + TimeDelta::hours(start_h),
                    base + TimeDelta::hours(start_h + len_h),
                ).unwrap();
                let q = QuotaCheck { group: "g", quota: &quota, zone, terms: &[], held: &held };
                if check(&q, &window, need).is_ok() {
                    held.push(Counted { window, units: need });
                }
            }
            // Half-hour by half-hour (zones change at half hours too): every
            // step's units, summed per month of the zone.
            let mut per_month: std::collections::BTreeMap<String, i64> = Default::default();
            for step in 0..(48 * 110) {
                let at = base + TimeDelta::minutes(30 * step);
                let units: u32 = held.iter().filter(|b| b.window.contains(at)).map(|b| b.units).sum();
                prop_assert!(units <= limit_u, "{units} units at {at}");
                *per_month.entry(month_of(at, zone).name).or_default() += i64::from(units);
            }
            for (month, half_hours) in per_month {
                prop_assert!(half_hours <= 2 * i64::from(limit_h), "{half_hours} GPU-half-hours in {month}");
            }
        }
    }
}
