//! `PUT /api/v1/held-units`: the controller's count of the GPU units each booking's
//! high-priority pods hold (what the webhook needs to give high priority only up to
//! a booking's units), and their last GPU activity for the usage report.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The whole count: bookings left out hold none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeldReport {
    /// Booking id (a string key in JSON) -> GPU units its user's high-priority pods
    /// hold now (0 to 100 000; `i32`: see the module [`crate::wire`] on integers).
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, i32>))]
    pub bookings: BTreeMap<i64, i32>,
    /// Booking id (a string key in JSON) -> the last GPU activity of its pods, as the
    /// node agent annotated them (`gpu-booking.io/last-gpu-activity`). Optional;
    /// recorded for the usage report (`GET /api/v1/admin/usage`) and the idle nudge.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, DateTime<Utc>>))]
    pub active: BTreeMap<i64, DateTime<Utc>>,
}

/// The answer to a held-units report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldReported {
    /// Bookings the report named.
    pub bookings: usize,
}
