//! The integration tests of the controller, in one binary: one link instead of one per
//! file, and the tests of every file run side by side. The access log's test has a
//! binary of its own (`tests/*access_log.rs`): it captures `tracing` output, whose
//! callsite interest is process-wide.

mod booking_api;
mod common;
mod controller;
mod node_capacity;
mod notebooks;
mod real_hub;
mod scale;
