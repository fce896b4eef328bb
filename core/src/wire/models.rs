//! `GET /api/v1/models` (the catalog the controller and the agent read) and
//! `PUT /api/v1/models/{name}/usage` (what the controller counted of one model).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A bookable model as the service shows it. Read leniently (every field but the
/// name may be absent) so that a client keeps working beside an older service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Model {
    pub name: String,
    /// Order among models when matching product names (first match wins; an
    /// admin's choice, which may be negative).
    #[serde(default)]
    pub position: i32,
    /// Units (GPUs) of this model the admin declared: the bookable capacity.
    #[serde(default)]
    pub units: u64,
    /// Ordered wildcard patterns over `nvidia.com/gpu.product` values.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Extended resource naming this model, when the device plugin exposes one
    /// (e.g. `nvidia.com/a100`); `nvidia.com/gpu` otherwise.
    #[serde(default)]
    pub resource: Option<String>,
    /// Default VRAM budget of a pod on this model, MiB.
    #[serde(default)]
    pub gpumem_mib: u64,
    /// Units in use right now, as last reported by the controller.
    #[serde(default)]
    pub in_use: u64,
    /// When the controller's last usage report was received.
    #[serde(default)]
    pub usage_reported_at: Option<DateTime<Utc>>,
    /// Physical cards (MIG devices for a MIG profile) the controller counts on the
    /// nodes; informational, beside the declared `units` and never in their place.
    #[serde(default)]
    pub cards: Option<u64>,
    /// Whether every node with cards of this model advertises the VRAM budget
    /// resource (the webhook budgets pods of the model only then).
    #[serde(default)]
    pub gpumem_advertised: bool,
    /// The VRAM budget one unit can hold, MiB, when advertised.
    #[serde(default)]
    pub gpumem_unit_mib: Option<u64>,
    /// Units not in use right now.
    #[serde(default)]
    pub free: u64,
    /// The cards counted on the nodes disagree with the declared units (a card
    /// missing or added, or units declared per time-slicing replica).
    #[serde(default)]
    pub mismatch: bool,
}

/// The most cards a [`UsageReport`] may count (`cards`).
pub const MAX_REPORTED_CARDS: i32 = 100_000;

/// What the controller counted of one model: recorded beside the admin's declared
/// units, never in their place. `i32`: see the module [`crate::wire`] on integers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UsageReport {
    /// Units (cards) in use now.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub in_use: i32,
    /// Physical cards the cluster has, when the reporter counts them (the controller
    /// does). `units` is read as its old name.
    #[serde(alias = "units", default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100000))]
    pub cards: Option<i32>,
    /// Whether every node with cards of the model advertises the VRAM budget resource.
    #[serde(default)]
    pub gpumem_advertised: Option<bool>,
    /// The VRAM budget one unit can hold, MiB (with `gpumem_advertised`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub gpumem_unit_mib: Option<i32>,
}
