//! The integration tests of the node agent, in one binary: one link instead of one per
//! file, and the tests of every file run side by side.

mod acceptance;
mod admin_access_log;
mod audit_api;
mod common;
mod kube_cluster;
