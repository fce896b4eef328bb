//! The integration tests of the webhook, in one binary: one link instead of one per
//! file, and the tests of every file run side by side. The access log's test has a
//! binary of its own (`tests/*access_log.rs`): it captures `tracing` output, whose
//! callsite interest is process-wide.

mod common;
mod e2e;
mod fixtures;
mod forged;
mod replica;
