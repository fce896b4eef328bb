//! Half-open time windows `[start, end)` and the status of a booking at an instant.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

/// A non-empty half-open window `[start, end)`. It cannot hold `start >= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

/// Returned when `start >= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the window must end after it starts")]
pub struct EmptyWindow;

impl Window {
    pub fn new(start: DateTime<Utc>, end: DateTime<Utc>) -> Result<Window, EmptyWindow> {
        if start < end {
            Ok(Window { start, end })
        } else {
            Err(EmptyWindow)
        }
    }

    pub fn start(&self) -> DateTime<Utc> {
        self.start
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.end
    }

    pub fn duration(&self) -> TimeDelta {
        self.end - self.start
    }

    /// Half-open overlap: windows that only touch do not overlap.
    pub fn overlaps(&self, other: &Window) -> bool {
        self.start < other.end && other.start < self.end
    }

    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && t < self.end
    }
}

/// Where a booking stands at a given instant. Derived, never stored, so that it
/// cannot go stale: the database keeps the times and the cancellation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BookingStatus {
    Planned,
    Active,
    Ended,
    Cancelled,
}

impl BookingStatus {
    pub fn at(now: DateTime<Utc>, window: &Window, cancelled: bool) -> BookingStatus {
        if cancelled {
            BookingStatus::Cancelled
        } else if now < window.start {
            BookingStatus::Planned
        } else if now < window.end {
            BookingStatus::Active
        } else {
            BookingStatus::Ended
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            BookingStatus::Planned => "planned",
            BookingStatus::Active => "active",
            BookingStatus::Ended => "ended",
            BookingStatus::Cancelled => "cancelled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, 0, 0).unwrap()
    }

    #[test]
    fn empty_and_reversed_windows_are_refused() {
        assert_eq!(Window::new(t(1), t(1)), Err(EmptyWindow));
        assert_eq!(Window::new(t(2), t(1)), Err(EmptyWindow));
    }

    #[test]
    fn touching_windows_do_not_overlap() {
        let a = Window::new(t(1), t(2)).unwrap();
        let b = Window::new(t(2), t(3)).unwrap();
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&Window::new(t(1), t(3)).unwrap()));
    }

    #[test]
    fn status_follows_the_clock() {
        let w = Window::new(t(2), t(4)).unwrap();
        assert_eq!(BookingStatus::at(t(1), &w, false), BookingStatus::Planned);
        assert_eq!(BookingStatus::at(t(2), &w, false), BookingStatus::Active);
        assert_eq!(BookingStatus::at(t(4), &w, false), BookingStatus::Ended);
        assert_eq!(BookingStatus::at(t(3), &w, true), BookingStatus::Cancelled);
    }
}
