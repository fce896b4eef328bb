//! The integration tests of the fake API server, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod admission;
mod fake;
mod over_http;
mod scheduler;
