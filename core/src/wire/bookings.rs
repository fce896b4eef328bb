//! A booking as the booking service shows it: the answer of `/api/v1/bookings` (and
//! its `{id}` routes), of a model's availability, and the `booking` of each change of
//! the change stream ([`crate::wire::changes`]), which the controller and the
//! webhook's replica follow (without `waiting`: see the field).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::window::BookingStatus;

/// A booking as the API shows it. Every field but `waiting` is always sent; the unit
/// counts and indices are `u32` (see the module [`crate::wire`] on integers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Booking {
    pub id: i64,
    pub user: String,
    pub model: String,
    /// The first unit of the model this booking holds (planned bookings may move).
    pub slot: u32,
    /// GPUs (units of the model) the booking is for: its user's pods get high
    /// priority for this many at once, and no more.
    #[cfg_attr(feature = "openapi", schema(example = 1))]
    pub units: u32,
    /// The units of the model it holds, one per GPU (planned bookings may move).
    pub slots: Vec<u32>,
    pub start: DateTime<Utc>,
    /// Effective end: earlier than `booked_end` when ended early.
    pub end: DateTime<Utc>,
    pub booked_end: DateTime<Utc>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "planned"))]
    pub status: BookingStatus,
    pub created_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub ended_early_at: Option<DateTime<Utc>>,
    /// Created by an admin with the rules overridden.
    #[serde(rename = "override")]
    pub override_rules: bool,
    /// Why the booking's pod waits for a card, as the controller last reported it (a
    /// sentence for its user, e.g. other workloads hold the model's cards); only
    /// while the booking is active, absent when it is not waiting. Never in the
    /// change stream: it changes with the cluster, not with the booking, and
    /// followers need only the booking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl Booking {
    /// Whether the booking no longer holds its GPUs (cancelled or over).
    pub fn is_over(&self) -> bool {
        matches!(self.status, BookingStatus::Ended | BookingStatus::Cancelled)
    }

    /// When its pods must end: the effective end, or when it was cancelled.
    pub fn pods_end(&self) -> DateTime<Utc> {
        match self.cancelled_at {
            Some(at) => at.min(self.end),
            None => self.end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use serde_json::json;

    fn booking(id: i64, status: BookingStatus) -> Booking {
        let start = DateTime::UNIX_EPOCH;
        Booking {
            id,
            user: "alice".into(),
            model: "a100".into(),
            slot: 0,
            units: 1,
            slots: vec![0],
            start,
            end: start + TimeDelta::days(1),
            booked_end: start + TimeDelta::days(1),
            status,
            created_at: start,
            cancelled_at: None,
            ended_early_at: None,
            override_rules: false,
            waiting: None,
        }
    }

    #[test]
    fn a_cancelled_booking_ends_its_pods_when_it_was_cancelled() {
        let mut b = booking(1, BookingStatus::Cancelled);
        let at = b.start + TimeDelta::hours(2);
        b.cancelled_at = Some(at);
        assert!(b.is_over());
        assert_eq!(b.pods_end(), at);
        assert!(!booking(2, BookingStatus::Planned).is_over());
    }

    #[test]
    fn the_json_keeps_its_names() {
        let v = serde_json::to_value(booking(7, BookingStatus::Active)).unwrap();
        assert_eq!(
            v,
            json!({"id": 7, "user": "alice", "model": "a100", "slot": 0, "units": 1,
                "slots": [0], "start": "1970-01-01T00:00:00Z", "end": "1970-01-02T00:00:00Z",
                "booked_end": "1970-01-02T00:00:00Z", "status": "active",
                "created_at": "1970-01-01T00:00:00Z", "cancelled_at": null,
                "ended_early_at": null, "override": false})
        );
        assert_eq!(serde_json::from_value::<Booking>(v).unwrap().id, 7);
    }
}
