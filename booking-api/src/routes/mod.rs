//! HTTP handlers, one module per resource.

pub mod audit;
pub mod bookings;
pub mod changes;
pub mod health;
pub mod me;
pub mod models;
pub mod schedulability;
