//! `GET /api/v1/schedulability?user=|slug=`: the one question the webhook asks about
//! a GPU pod's owner (or, with neither, only the free units). The replica answers
//! the same type from memory ([`crate::admission::Replica::answer`]); what the
//! webhook decides from it is [`crate::admission::decide`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::admission_state::ModelState;
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
    /// GPUs offered back to users on CPU and held for them until each offer's
    /// `until` (`PUT /api/v1/offers`): a lend to anyone but the offer's user leaves
    /// its units free. Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<super::offers::Offer>,
    /// The active booking is a course's session (`booking_id` names its row), which
    /// the user has as a member of the course's group: its units are shared by all
    /// its members' pods. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub course: bool,
}

/// The active booking an answer names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBooking {
    pub id: i64,
    pub until: DateTime<Utc>,
    /// `None` for a model name the webhook could not read.
    pub model: Option<ModelName>,
    pub user: String,
    pub units: u64,
    pub units_held: u64,
}

impl Schedulability {
    /// The answer for a user with `booking` active now. Built here, once, so that the
    /// service and the webhook's replica cannot answer the same state two ways.
    pub fn booked<'a>(
        models: impl IntoIterator<Item = &'a ModelState>,
        booking: ActiveBooking,
    ) -> Self {
        Self {
            schedulable: true,
            until: Some(booking.until),
            model: booking.model,
            booking_id: Some(booking.id),
            user: Some(booking.user),
            units: Some(booking.units),
            units_held: Some(booking.units_held),
            ..Self::of_models(models)
        }
    }

    /// The answer without an active booking: for `user` when the query resolved to
    /// one, with the earliest start of a new booking of each model.
    pub fn unbooked<'a>(
        models: impl IntoIterator<Item = &'a ModelState>,
        user: Option<String>,
        earliest_booking_by_model: BTreeMap<ModelName, DateTime<Utc>>,
    ) -> Self {
        Self {
            user,
            earliest_booking: earliest_booking_by_model.values().min().copied(),
            earliest_booking_by_model,
            ..Self::of_models(models)
        }
    }

    /// What every answer says: the models (as the service reads them from its store
    /// and the webhook's replica keeps them), nothing about a user.
    fn of_models<'a>(models: impl IntoIterator<Item = &'a ModelState>) -> Self {
        let mut free = BTreeMap::new();
        let mut gpumem_mib = BTreeMap::new();
        let mut usage_reported_at = BTreeMap::new();
        let mut gpumem_advertised_mib = BTreeMap::new();
        for m in models {
            free.insert(m.name.clone(), m.free);
            gpumem_mib.insert(m.name.clone(), m.gpumem_mib);
            if let Some(at) = m.usage_reported_at {
                usage_reported_at.insert(m.name.clone(), at);
            }
            if let Some(mib) = m.gpumem_advertised_mib {
                gpumem_advertised_mib.insert(m.name.clone(), mib);
            }
        }
        Self {
            schedulable: false,
            until: None,
            model: None,
            booking_id: None,
            user: None,
            free,
            gpumem_mib,
            earliest_booking: None,
            // Present even when empty: an absent map means a service that predates
            // the inventory report, whose budgets are not checked against the nodes.
            gpumem_advertised_mib: Some(gpumem_advertised_mib),
            earliest_booking_by_model: BTreeMap::new(),
            units: None,
            units_held: None,
            usage_reported_at,
            offers: Vec::new(),
            course: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, advertised: Option<u64>) -> ModelState {
        ModelState {
            name: ModelName::parse(name).unwrap(),
            units: 4,
            free: 2,
            gpumem_mib: 4096,
            usage_reported_at: None,
            gpumem_advertised_mib: advertised,
        }
    }

    #[test]
    fn an_unbooked_answer_names_the_earliest_start_of_any_model() {
        let soon = DateTime::from_timestamp(1_000, 0).unwrap();
        let later = DateTime::from_timestamp(2_000, 0).unwrap();
        let starts = BTreeMap::from([
            (ModelName::parse("a100").unwrap(), later),
            (ModelName::parse("h100").unwrap(), soon),
        ]);
        let answer = Schedulability::unbooked(
            &[model("a100", Some(4096)), model("h100", None)],
            Some("alice".into()),
            starts,
        );
        assert!(!answer.schedulable);
        assert_eq!(answer.earliest_booking, Some(soon));
        assert_eq!(answer.free.len(), 2);
        // Only models whose every node advertises the budget are in the map, and the
        // map itself is there (an absent one means "not checked against the nodes").
        assert_eq!(
            answer.gpumem_advertised_mib.as_ref().map(BTreeMap::len),
            Some(1)
        );
    }

    #[test]
    fn a_booked_answer_carries_the_booking() {
        let until = DateTime::from_timestamp(5_000, 0).unwrap();
        let answer = Schedulability::booked(
            &[model("a100", None)],
            ActiveBooking {
                id: 7,
                until,
                model: ModelName::parse("a100").ok(),
                user: "alice".into(),
                units: 2,
                units_held: 1,
            },
        );
        assert!(answer.schedulable);
        assert_eq!((answer.booking_id, answer.until), (Some(7), Some(until)));
        assert_eq!((answer.units, answer.units_held), (Some(2), Some(1)));
        assert!(answer.earliest_booking.is_none() && answer.earliest_booking_by_model.is_empty());
        assert_eq!(answer.gpumem_advertised_mib, Some(BTreeMap::new()));
    }
}
