//! The integration tests of the controller, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod admin_access_log;
mod booking_api;
mod common;
mod controller;
mod node_capacity;
mod scale;
