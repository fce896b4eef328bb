//! `PUT /api/v1/held-units`: the controller's count of the GPU units each booking's
//! high-priority pods hold (what the webhook needs to give high priority only up to
//! a booking's units), and their last GPU activity for the usage report.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most bookings one report may name, in `bookings` and in `active` each: far
/// above any cluster's GPUs.
pub const MAX_REPORTED_BOOKINGS: usize = 100_000;
/// The most units one booking's pods may be reported to hold.
pub const MAX_HELD_UNITS: i32 = 100_000;
/// The longest reason in `waiting`, in characters: a sentence, not a log.
pub const MAX_WAITING_LEN: usize = 512;

/// The whole count: bookings left out hold none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeldReport {
    /// Booking id (a string key in JSON) -> GPU units its user's high-priority pods
    /// hold now (0 to [`MAX_HELD_UNITS`], at most [`MAX_REPORTED_BOOKINGS`]
    /// bookings; `i32`: see the module [`crate::wire`] on integers). Its schema is
    /// built in `openapi::bookings` below, from the constants.
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::bookings))]
    pub bookings: BTreeMap<i64, i32>,
    /// Booking id (a string key in JSON) -> the last GPU activity of its pods, as the
    /// node agent annotated them (`gpu-booking.io/last-gpu-activity`). Optional;
    /// recorded for the usage report (`GET /api/v1/admin/usage`) and the idle nudge.
    /// At most [`MAX_REPORTED_BOOKINGS`] bookings; its schema is `openapi::active`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::active))]
    pub active: BTreeMap<i64, DateTime<Utc>>,
    /// Booking id (a string key in JSON) -> why that booking's pod waits for a card,
    /// a sentence for its user ("waiting: 3 of 3 a100 held, 1 by pods in namespace
    /// research that bookings do not preempt"). Optional; the whole list each time: a
    /// booking left out is not waiting. At most [`MAX_REPORTED_BOOKINGS`] bookings,
    /// each reason at most [`MAX_WAITING_LEN`] characters and no control character;
    /// its schema is `openapi::waiting`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::waiting))]
    pub waiting: BTreeMap<i64, String>,
    /// Every user's running notebooks as the controller sees them (booked, lent, or
    /// stripped to CPU; core's `notebooks` decides each), the whole list each time: a
    /// notebook left out is not running. Optional; at most
    /// [`super::notebooks::MAX_REPORTED_NOTEBOOKS`]. Served to each user by
    /// `GET /api/v1/notebooks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 2000))]
    pub notebooks: Vec<super::notebooks::Notebook>,
}

impl HeldReport {
    /// Why the report's `waiting` cannot be recorded, if it cannot: too many
    /// bookings, or a reason too long or with a control character (the page shows
    /// it as one line of text).
    pub fn waiting_problem(&self) -> Option<String> {
        if self.waiting.len() > MAX_REPORTED_BOOKINGS {
            return Some(format!(
                "waiting: at most {MAX_REPORTED_BOOKINGS} bookings per report"
            ));
        }
        self.waiting
            .iter()
            .find(|(_, why)| {
                why.chars().count() > MAX_WAITING_LEN || why.chars().any(char::is_control)
            })
            .map(|(id, _)| {
                format!(
                    "waiting: the reason of booking {id} is longer than {MAX_WAITING_LEN} \
                     characters or holds a control character"
                )
            })
    }
}

/// The schemas of [`HeldReport`]'s maps, built here because utoipa's attributes
/// cannot bound a map's size or its values: the bounds come from the constants the
/// service checks.
#[cfg(feature = "openapi")]
mod openapi {
    use utoipa::openapi::schema::{KnownFormat, Object, ObjectBuilder, SchemaFormat, Type};

    use super::{MAX_HELD_UNITS, MAX_REPORTED_BOOKINGS, MAX_WAITING_LEN};

    /// A booking id as a JSON object's key: the id in decimal, as it parses.
    fn booking_id() -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^-?(?:0|[1-9][0-9]*)$"))
    }

    pub fn bookings() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Booking id (a string key in JSON: the id in decimal) -> GPU units its \
                 user's high-priority pods hold now. Bookings left out hold none.",
            ))
            .property_names(Some(booking_id()))
            .additional_properties(Some(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
                    .minimum(Some(0))
                    .maximum(Some(MAX_HELD_UNITS)),
            ))
            .max_properties(Some(MAX_REPORTED_BOOKINGS))
            .build()
    }

    pub fn active() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Booking id (a string key in JSON: the id in decimal) -> the last GPU \
                 activity of its pods, as the node agent annotated them \
                 (`gpu-booking.io/last-gpu-activity`). Optional; recorded for the usage \
                 report (`GET /api/v1/admin/usage`) and the idle nudge.",
            ))
            .property_names(Some(booking_id()))
            .additional_properties(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
            ))
            .max_properties(Some(MAX_REPORTED_BOOKINGS))
            .build()
    }

    pub fn waiting() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Booking id (a string key in JSON: the id in decimal) -> why that \
                 booking's pod waits for a card, a sentence for its user. Optional; a \
                 booking left out is not waiting. Each reason has no control character.",
            ))
            .property_names(Some(booking_id()))
            .additional_properties(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .max_length(Some(MAX_WAITING_LEN))
                    .pattern(Some(r"^[^\u0000-\u001f\u007f-\u009f]*$")),
            ))
            .max_properties(Some(MAX_REPORTED_BOOKINGS))
            .build()
    }
}

/// The answer to a held-units report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldReported {
    /// Bookings the report named.
    pub bookings: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_waiting_reason_is_one_bounded_line() {
        let report = |why: &str| HeldReport {
            waiting: BTreeMap::from([(7, why.to_owned())]),
            ..HeldReport::default()
        };
        assert_eq!(report("waiting: 1 of 1 a100 held").waiting_problem(), None);
        assert_eq!(report(&"é".repeat(MAX_WAITING_LEN)).waiting_problem(), None);
        assert!(report(&"é".repeat(MAX_WAITING_LEN + 1))
            .waiting_problem()
            .is_some());
        assert!(report("two\nlines").waiting_problem().is_some());
        assert!(report("a \u{85} C1 control").waiting_problem().is_some());
    }

    #[test]
    fn waiting_is_optional_and_left_out_when_empty() {
        let r: HeldReport = serde_json::from_value(json!({"bookings": {"1": 1}})).unwrap();
        assert!(r.waiting.is_empty());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v, json!({"bookings": {"1": 1}}));
        let r: HeldReport =
            serde_json::from_value(json!({"bookings": {}, "waiting": {"3": "waiting"}})).unwrap();
        assert_eq!(r.waiting[&3], "waiting");
    }
}
