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
}

/// The schemas of [`HeldReport`]'s maps, built here because utoipa's attributes
/// cannot bound a map's size or its values: the bounds come from the constants the
/// service checks.
#[cfg(feature = "openapi")]
mod openapi {
    use utoipa::openapi::schema::{KnownFormat, Object, ObjectBuilder, SchemaFormat, Type};

    use super::{MAX_HELD_UNITS, MAX_REPORTED_BOOKINGS};

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
}

/// The answer to a held-units report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldReported {
    /// Bookings the report named.
    pub bookings: usize,
}
