//! `GET /api/v1/admission-state`: what the booking service sends the webhook's
//! replica ([`crate::admission::Replica`]), so that an admission is answered from
//! memory: the whole of it at the start and after a lost resume point, its figures
//! alone every second or so.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::booking_policy::Policy;
use crate::gpu_model::ModelName;
use crate::username::NameCase;
use crate::window::Window;

/// The booking rules that the earliest-start warning depends on, as the service
/// applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyState {
    pub min_duration_secs: i64,
    pub max_duration_secs: i64,
    pub cooldown_secs: i64,
    pub no_booking_while_active: bool,
    pub max_planned: u32,
    pub max_units_per_booking: u32,
}

impl From<&Policy> for PolicyState {
    fn from(p: &Policy) -> Self {
        Self {
            min_duration_secs: p.min_duration.num_seconds(),
            max_duration_secs: p.max_duration.num_seconds(),
            cooldown_secs: p.cooldown.num_seconds(),
            no_booking_while_active: p.no_booking_while_active,
            max_planned: p.max_planned,
            max_units_per_booking: p.max_units_per_booking,
        }
    }
}

impl PolicyState {
    pub fn policy(&self) -> Policy {
        Policy {
            min_duration: TimeDelta::seconds(self.min_duration_secs),
            max_duration: TimeDelta::seconds(self.max_duration_secs),
            cooldown: TimeDelta::seconds(self.cooldown_secs),
            no_booking_while_active: self.no_booking_while_active,
            max_planned: self.max_planned,
            max_units_per_booking: self.max_units_per_booking,
            ..Policy::default()
        }
    }
}

/// One model's figures, as the schedulability answer carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelState {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub name: ModelName,
    /// Units the admin declared (the capacity of the earliest-start computation).
    pub units: u32,
    /// Units not in use right now (the controller's last usage report).
    pub free: u64,
    /// Declared VRAM budget per unit, MiB.
    pub gpumem_mib: u64,
    /// The budget one unit can hold, when every node of the model advertises it.
    #[serde(default)]
    pub gpumem_advertised_mib: Option<u64>,
    /// When the usage report behind `free` was received.
    #[serde(default)]
    pub usage_reported_at: Option<DateTime<Utc>>,
}

/// A booking as the replica keeps it (cancelled ones are not kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BookingState {
    pub id: i64,
    pub user: String,
    pub model: String,
    pub units: u32,
    pub start: DateTime<Utc>,
    /// Effective end (earlier than booked when ended early).
    pub end: DateTime<Utc>,
}

impl BookingState {
    pub(crate) fn window(&self) -> Option<Window> {
        Window::new(self.start, self.end).ok()
    }

    pub(crate) fn hold_row(&self) -> crate::holds::HoldRow<'_> {
        crate::holds::HoldRow {
            user: &self.user,
            model: &self.model,
            units: self.units,
            start: self.start,
            end: self.end,
        }
    }
}

/// A user the service knows, with the label slugs that name them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KnownUser {
    pub name: String,
    pub escape_slug: String,
    pub safe_slug: String,
}

/// The members of a group that a course occurrence running now holds units for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupMembers {
    /// `lab_group.id`, as the course's user names it (`" course 3 group 2"`).
    pub group: i64,
    /// Normalised user names.
    pub members: Vec<String>,
}

/// The most course members an answer carries, all groups together: the figures
/// are read every second or so.
pub const MAX_COURSE_MEMBERS: i64 = 10_000;

/// What the booking service sends for the replica (`GET /api/v1/admission-state`).
/// `bookings`, `users` and `position` come only in a full answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdmissionState {
    /// The service's time of the answer.
    pub at: DateTime<Utc>,
    /// How the service compares user names.
    pub names: NameCase,
    pub policy: PolicyState,
    /// In the service's order.
    pub models: Vec<ModelState>,
    /// Units each active booking's high-priority pods hold (the controller's count).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, u64>))]
    pub held: BTreeMap<i64, u64>,
    /// GPUs offered back to users on CPU, each held for its user until its `until`
    /// (`PUT /api/v1/offers`, the controller's whole list): the replica answers them
    /// in [`crate::wire::Schedulability::offers`].
    #[serde(default)]
    pub offers: Vec<super::offers::Offer>,
    /// The members of each group with a course occurrence running at `at` (at most
    /// 10,000 names in all; a group without members with none): a member without a
    /// booking of their own is answered as booked against the occurrence.
    #[serde(default)]
    pub groups: Vec<GroupMembers>,
    /// Full answers only: the change stream's position from which to follow, so that
    /// no change is missed or applied twice.
    #[serde(default)]
    pub position: Option<i64>,
    /// Full answers only: bookings not cancelled that end after `at`, and each
    /// user's last ended one if it ended less than the cooldown before `at` (the
    /// cooldown counts from it; no rule looks at one that ended earlier).
    #[serde(default)]
    pub bookings: Option<Vec<BookingState>>,
    /// Full answers only: every known user with their slugs.
    #[serde(default)]
    pub users: Option<Vec<KnownUser>>,
}
