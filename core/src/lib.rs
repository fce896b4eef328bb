//! The pure domain of gpu-booking: no I/O, no async.
//!
//! Every rule, decision and patch step lives here exactly once; the booking API,
//! the webhook and the controller call into it.
#![forbid(unsafe_code)]

pub mod admission;
pub mod booking_end;
pub mod booking_policy;
pub mod booking_units;
pub mod cancel;
pub mod capacity;
pub mod create_batch;
pub mod declared_models;
pub mod eviction;
pub mod feed;
pub mod gpu_model;
pub mod groups;
pub mod holds;
pub mod input;
pub mod intent;
pub mod inventory;
#[cfg(feature = "clap")]
pub mod jwt;
pub mod lab_days;
pub mod model_units;
pub mod next_start;
pub mod notebooks;
pub mod notice;
pub mod notice_text;
pub mod offers;
pub mod pod_action;
pub mod precondition;
pub mod preemption_policy;
pub mod quota;
pub mod rate;
pub mod recurrence;
pub mod rules;
pub mod usage;
pub mod username;
pub mod waitlist;
pub mod window;
pub mod wire;
pub mod write_limits;
