//! The integration tests of the webhook, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod admin_access_log;
mod common;
mod e2e;
mod fixtures;
mod replica;
