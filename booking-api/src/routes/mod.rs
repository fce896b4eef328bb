//! HTTP handlers, one module per resource.

pub mod admission;
pub mod audit;
pub mod availability;
pub mod bookings;
pub mod changes;
pub mod feeds;
pub mod health;
pub mod me;
pub mod models;
pub mod notices;
pub mod schedulability;
pub mod units;
pub mod usage;
pub mod waitlist;
