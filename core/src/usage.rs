//! Booked versus used: what a booking's use makes of it, the idle
//! nudge's rule and text, and CSV fields that a spreadsheet reads as text.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;

use crate::booking_policy::human_duration;
use crate::notice::Message;
use crate::notice_text::Style;

/// How long one observation of GPU activity counts as active: the node agent writes
/// a pod's last-activity annotation when it moved by a minute or more, the controller
/// passes it on when it moved by [`ACTIVITY_REPORT_STEP`] or more, so a pod busy all
/// along is seen at least this often and its observations merge into one span (the
/// end of a burst is counted up to this much long).
pub const ACTIVITY_RESOLUTION: TimeDelta = TimeDelta::minutes(10);

/// How far a booking's last activity must move before the controller reports it
/// again (half the resolution, so that steady use leaves no gaps).
pub const ACTIVITY_REPORT_STEP: TimeDelta = TimeDelta::minutes(5);

/// Whether the activity seen now (`seen`: booking id -> last activity) is news to the
/// booking service, which was last told `reported`: a booking with activity it was
/// not told of, or whose activity moved by [`ACTIVITY_REPORT_STEP`] or more.
pub fn activity_moved(
    reported: &BTreeMap<i64, DateTime<Utc>>,
    seen: &BTreeMap<i64, DateTime<Utc>>,
) -> bool {
    seen.iter().any(|(id, at)| match reported.get(id) {
        None => true,
        Some(was) => *at - *was >= ACTIVITY_REPORT_STEP,
    })
}

/// How long a running booking may go without GPU activity before it counts as idle,
/// and one no pod ever held as a no-show: the usage report's default and the API's
/// no-show gauge.
pub const DEFAULT_IDLE_AFTER: TimeDelta = TimeDelta::hours(4);

/// What became of a booking, as the usage report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UseStatus {
    /// Not started yet.
    Planned,
    /// Started, and no pod of it ever held a GPU: ended so, or running so for the idle
    /// threshold or longer.
    NoShow,
    /// Running, and its GPUs idle (or unused) for the idle threshold or longer.
    Idle,
    /// Running and in use.
    Running,
    /// Ended, and it was used.
    Ended,
}

impl UseStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UseStatus::Planned => "planned",
            UseStatus::NoShow => "no_show",
            UseStatus::Idle => "idle",
            UseStatus::Running => "running",
            UseStatus::Ended => "ended",
        }
    }
}

/// What is known of one booking's use.
#[derive(Debug, Clone, Copy)]
pub struct Use {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// A pod of it ever held a GPU.
    pub ever_held: bool,
    /// Its last GPU activity.
    pub last_active: Option<DateTime<Utc>>,
}

impl Use {
    /// Since when a running booking counts as idle: its last activity, or its start.
    pub fn idle_since(&self) -> DateTime<Utc> {
        self.last_active.unwrap_or(self.start).max(self.start)
    }

    /// The booking's status at `now`, with `idle_after` the idle threshold.
    pub fn status(&self, now: DateTime<Utc>, idle_after: TimeDelta) -> UseStatus {
        if now < self.start {
            return UseStatus::Planned;
        }
        let running = now < self.end;
        if !self.ever_held && (!running || now - self.start >= idle_after) {
            return UseStatus::NoShow;
        }
        match running {
            true if now - self.idle_since() >= idle_after => UseStatus::Idle,
            true => UseStatus::Running,
            false => UseStatus::Ended,
        }
    }
}

/// Whether a running booking is due the idle nudge (once per booking; the caller
/// keeps it once): idle for `after` or longer, and not ending within `after` (asking
/// to release a booking that ends soon anyway helps nobody).
pub fn nudge_due(u: &Use, now: DateTime<Utc>, after: TimeDelta) -> bool {
    after > TimeDelta::zero()
        && u.start <= now
        && now < u.end
        && now - u.idle_since() >= after
        && u.end - now > after
}

/// The once-only key of a booking's idle nudge.
pub fn nudge_key(booking_id: i64) -> String {
    format!("idle:{booking_id}")
}

/// The idle nudge's text: the booking's end in the lab's zone, and the page's link
/// (My bookings, where the user can end it early) last, when the page is known.
pub fn nudge_message(
    booking_id: i64,
    model: &str,
    idle_for: TimeDelta,
    end: DateTime<Utc>,
    now: DateTime<Utc>,
    style: &Style,
) -> Message {
    let hours = idle_for.num_hours().max(1);
    let unit = if hours == 1 { "hour" } else { "hours" };
    Message {
        title: format!("Your booking of {model} has been idle for {hours} {unit}"),
        text: style.with_link(format!(
            "Your booking of {model} (booking {booking_id}) has been idle for {hours} {unit}; \
             release it early? It would still hold the GPU for {} more (until {}), and \
             someone on the waitlist may need it. End it on the booking page (My bookings, \
             \"End now\"), or ignore this if you still need it: this is asked once per \
             booking.",
            human_duration(end - now),
            style.time(end)
        )),
    }
}

/// One CSV field (RFC 4180): quoted when it holds a comma, a quote, CR or LF (quotes
/// doubled). Text that a spreadsheet would run as a formula (starting with `=`, `+`,
/// `-`, `@`, a tab or CR) is prefixed with `'`, and then always quoted.
pub fn csv_field(s: &str) -> String {
    let formula = s.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let text = if formula {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    if formula || text.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// One CSV record of fields already made with [`csv_field`] (or numbers), CRLF ended.
pub fn csv_record<I, S>(fields: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut line = fields
        .into_iter()
        .map(|f| f.as_ref().to_owned())
        .collect::<Vec<_>>()
        .join(",");
    line.push_str("\r\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + TimeDelta::hours(h)
    }

    fn used(ever_held: bool, last_active: Option<i64>) -> Use {
        Use {
            start: t(0),
            end: t(48),
            ever_held,
            last_active: last_active.map(t),
        }
    }

    #[test]
    fn activity_is_reported_again_after_a_step() {
        let m = |v: &[(i64, i64)]| -> BTreeMap<i64, DateTime<Utc>> {
            v.iter()
                .map(|(id, min)| (*id, t(0) + TimeDelta::minutes(*min)))
                .collect()
        };
        assert!(!activity_moved(&m(&[(1, 0)]), &m(&[(1, 4)])));
        assert!(activity_moved(&m(&[(1, 0)]), &m(&[(1, 5)])));
        assert!(
            activity_moved(&m(&[(1, 0)]), &m(&[(1, 0), (2, 0)])),
            "new booking"
        );
        assert!(
            !activity_moved(&m(&[(1, 0), (2, 0)]), &m(&[(1, 1)])),
            "gone: held says it"
        );
        assert!(
            !activity_moved(&m(&[(1, 9)]), &m(&[(1, 3)])),
            "older: an old annotation"
        );
    }

    #[test]
    fn statuses() {
        let four = TimeDelta::hours(4);
        assert_eq!(used(false, None).status(t(-1), four), UseStatus::Planned);
        assert_eq!(used(false, None).status(t(1), four), UseStatus::Running);
        assert_eq!(used(false, None).status(t(4), four), UseStatus::NoShow);
        assert_eq!(used(false, None).status(t(50), four), UseStatus::NoShow);
        assert_eq!(used(true, None).status(t(3), four), UseStatus::Running);
        assert_eq!(used(true, None).status(t(5), four), UseStatus::Idle);
        assert_eq!(used(true, Some(10)).status(t(13), four), UseStatus::Running);
        assert_eq!(used(true, Some(10)).status(t(14), four), UseStatus::Idle);
        assert_eq!(used(true, Some(10)).status(t(48), four), UseStatus::Ended);
    }

    #[test]
    fn nudge_once_idle_and_not_near_the_end() {
        let four = TimeDelta::hours(4);
        assert!(!nudge_due(&used(true, Some(10)), t(13), four));
        assert!(nudge_due(&used(true, Some(10)), t(14), four));
        assert!(
            !nudge_due(&used(true, Some(10)), t(45), four),
            "ends within 4 h"
        );
        assert!(
            !nudge_due(&used(true, Some(10)), t(14), TimeDelta::zero()),
            "off"
        );
        assert!(nudge_due(&used(false, None), t(4), four), "never used");
        assert_eq!(nudge_key(7), "idle:7");
    }

    #[test]
    fn nudge_text_names_model_hours_and_link() {
        let page = Style {
            zone: chrono_tz::Europe::Berlin,
            page_url: Some("https://x/".into()),
        };
        let m = nudge_message(7, "A100", TimeDelta::hours(5), t(48), t(10), &page);
        assert!(m.text.contains(
            "Your booking of A100 (booking 7) has been idle for 5 hours; release it early?"
        ));
        assert!(m.text.contains(&format!("(until {})", page.time(t(48)))));
        assert!(
            m.text.ends_with("\n\nYour bookings: https://x/#mine"),
            "{}",
            m.text
        );
        assert_eq!(m.title, "Your booking of A100 has been idle for 5 hours");
        // No page address: no link, the page named in words.
        let m = nudge_message(
            7,
            "A100",
            TimeDelta::hours(5),
            t(48),
            t(10),
            &Style::default(),
        );
        assert!(!m.text.contains("http") && m.text.contains("booking page"));
    }

    #[test]
    fn csv_fields_quote_and_defuse() {
        assert_eq!(csv_field("alice"), "alice");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("line\nbreak"), "\"line\nbreak\"");
        assert_eq!(csv_field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_field("+1"), "\"'+1\"");
        assert_eq!(csv_field("-2"), "\"'-2\"");
        assert_eq!(csv_field("@sum"), "\"'@sum\"");
        assert_eq!(csv_field("\tx"), "\"'\tx\"");
        assert_eq!(csv_record(["a", "\"b,c\""]), "a,\"b,c\"\r\n");
    }
}
