//! `GET /api/v1/schedulability?user=|slug=`: the one question the webhook asks about
//! a GPU pod's owner (or, with neither, only the free units). The replica answers
//! the same type from memory ([`crate::admission::Replica::answer`]); what the
//! webhook decides from it is [`crate::admission::decide`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::gpu_model::ModelName;

/// The booking service's answer. Every field but `schedulable` may be absent from a
/// service that predates it: a client reads the answer leniently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedulability {
    /// The user has an active booking now.
    pub schedulable: bool,
    /// End of the active booking.
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
    /// Model of the active booking.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub model: Option<ModelName>,
    /// Id of the active booking.
    #[serde(default)]
    pub booking_id: Option<i64>,
    /// The user the query resolved to (from a name or a slug), if any.
    #[serde(default)]
    pub user: Option<String>,
    /// Units of each model not in use right now.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, u64>))]
    pub free: BTreeMap<ModelName, u64>,
    /// Declared VRAM budget per unit of each model, MiB.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, u64>))]
    pub gpumem_mib: BTreeMap<ModelName, u64>,
    /// When not booked: the earliest start of a new booking on any model (the
    /// earliest of `earliest_booking_by_model`).
    #[serde(default)]
    pub earliest_booking: Option<DateTime<Utc>>,
    /// The VRAM budget (MiB) one unit can hold, for each model whose every node
    /// advertises the budget resource (the controller's inventory report); other
    /// models' pods get no budget, since a pod asking for a resource no node has
    /// would stay Pending (seed 000's apply order). Absent altogether (a service that
    /// predates the report): budgets are not checked against the nodes.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<BTreeMap<String, u64>>))]
    pub gpumem_advertised_mib: Option<BTreeMap<ModelName, u64>>,
    /// When not booked: the earliest start of a new booking of each model, exactly as
    /// `GET /me/next-start?model=` answers it for this user (rules and capacity, the
    /// default length). Empty for a pod without identity or an ambiguous slug.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, DateTime<Utc>>))]
    pub earliest_booking_by_model: BTreeMap<ModelName, DateTime<Utc>>,
    /// With an active booking: the GPUs it is for. The user's pods get high priority
    /// for this many units at once, no more. Absent (a service that predates
    /// multi-GPU bookings): the booking covers whatever the pod asks.
    #[serde(default)]
    pub units: Option<u64>,
    /// With an active booking: the units its user's high-priority pods held at the
    /// controller's last count (reported within about a second of a pod change; a
    /// pod admitted since is not in it, and the controller demotes what goes past
    /// `units`). Absent: none.
    #[serde(default)]
    pub units_held: Option<u64>,
    /// Per model, when the controller's usage report that `free` comes from was
    /// received (absent before the first report). The webhook subtracts the GPU pods
    /// it admitted that a report this old cannot count yet (its `LendLedger`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, DateTime<Utc>>))]
    pub usage_reported_at: BTreeMap<ModelName, DateTime<Utc>>,
}
