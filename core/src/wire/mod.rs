//! The messages between our processes, typed once: the booking service's routes
//! serialise these and every client (`gpu-booking-client`, and through it the
//! webhook, controller, agent and the simulated lab) deserialises the same types. The
//! OpenAPI document is derived from them too (feature `openapi`, which only the
//! booking service enables, so that the edges do not link utoipa).
//!
//! One file per message family:
//!
//! - [`schedulability`]: `GET /api/v1/schedulability`, the webhook's one question;
//! - [`admission_state`]: `GET /api/v1/admission-state`, the webhook replica's snapshot;
//! - [`bookings`]: a booking as the API shows it (`/api/v1/bookings`, the change stream);
//! - [`changes`]: `GET /api/v1/booking-changes`, the stream the controller and the
//!   webhook's replica follow;
//! - [`audit`]: `POST /api/v1/audit` and `/audit/batch`, every enforcement action;
//! - [`models`]: `GET /api/v1/models` and the controller's usage report;
//! - [`held`]: `PUT /api/v1/held-units`, the units each booking's pods hold (and
//!   every user's running [`notebooks`]);
//! - [`notebooks`]: `GET /api/v1/notebooks`, a user's running notebook pods;
//! - [`offers`]: `PUT` and `GET /api/v1/offers`, GPUs offered back to users on CPU.
//!
//! Integer types, chosen once:
//!
//! - Ids (bookings, audit rows, the change stream's position) are `i64`: Postgres'
//!   `bigint`, carried as the database hands them so that they round-trip unchanged.
//! - Counts of GPUs and MiB that the service *answers* are unsigned: none can be
//!   negative (free units are clamped at zero), so no client has to handle a negative
//!   and the OpenAPI document says `minimum: 0`. `u64` where core's admission
//!   arithmetic uses them beside a pod's request (a Kubernetes quantity, read as
//!   `u64`); `u32` for a model's declared units and a booking's units in the replica
//!   snapshot, the width of core's capacity computation and of the policy's
//!   `max_units_per_booking`. A booking's units and the indices of the units it
//!   holds (`slot`, `slots`) are `u32` too, converted from the store with [`unit`].
//! - Counts a client *reports* (the usage and held-units reports) are `i32`: the
//!   service's published contract answers a negative count with a 422 naming the
//!   field (the store keeps them in `integer` columns), which an unsigned field would
//!   turn into a 400 parse error. A reporter counting in `u64` converts with
//!   [`reported`].
//! - Durations are whole seconds, `i64` (chrono's `TimeDelta::num_seconds`).

pub mod admission_state;
pub mod audit;
pub mod bookings;
pub mod changes;
pub mod held;
pub mod models;
pub mod notebooks;
pub mod offers;
pub mod schedulability;

pub use admission_state::{AdmissionState, BookingState, KnownUser, ModelState, PolicyState};
pub use audit::{
    AuditBatch, AuditReport, Recorded, RecordedBatch, MAX_ACTION_LEN, MAX_AUDIT_BATCH,
    MAX_AUDIT_USER_LEN, MAX_DETAILS_BYTES, MAX_SUBJECT_LEN,
};
pub use bookings::Booking;
pub use changes::{BookingChange, BookingChanges};
pub use held::{HeldReport, HeldReported, MAX_HELD_UNITS, MAX_REPORTED_BOOKINGS, MAX_WAITING_LEN};
pub use models::{Model, UsageReport, MAX_OTHER_NAMESPACES, MAX_REPORTED_CARDS};
pub use notebooks::{NextStep, Notebook, NotebookStanding, Notebooks, MAX_REPORTED_NOTEBOOKS};
pub use offers::{Offer, Offers, OffersReport, MAX_OFFERS};
pub use schedulability::{ActiveBooking, Schedulability};

/// A count that a store keeps signed (a Postgres `integer` column checked `>= 0`) as
/// the wire's unsigned count; a negative one, which the check rules out, reads as 0.
pub fn count(n: i32) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A booking's units, or the index of a unit it holds, as the store keeps it (an
/// `integer` column checked `>= 0`) as the wire's `u32`; a negative one reads as 0.
pub fn unit(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// A count as a report carries it (`i32`), saturating: past `i32::MAX` the service
/// refuses the report anyway.
pub fn reported(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
