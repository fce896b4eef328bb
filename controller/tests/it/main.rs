//! The integration tests of the controller, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod common;
mod admin_access_log;
mod booking_api;
mod controller;
mod node_capacity;
mod scale;
