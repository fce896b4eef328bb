//! The integration tests of the booking service, in one binary: one link instead of one per
//! file, and the tests of every file run side by side. The access log's test has a
//! binary of its own (`tests/*access_log.rs`): it captures `tracing` output, whose
//! callsite interest is process-wide.

mod abuse;
mod archive;
mod audit_roundtrip;
mod authz;
mod backup_restore;
mod bad_input;
mod bench_rate_search;
mod changes;
mod common;
mod concurrency;
mod contract;
mod create_batch;
mod create_decisions;
mod day_functions;
mod day_locks;
mod db_unavailable;
mod declared_models;
mod derived_rows;
mod feeds;
mod groups;
mod hold_removal;
mod hub_login;
mod identity;
mod jwks;
mod lab_days;
mod loader;
mod maintenance;
mod metrics_bounded;
mod metrics_state;
mod notebooks;
mod notices;
mod offers;
mod oidc_provider;
mod other_workloads;
mod quota;
mod reservations;
mod reworded_migrations;
mod rules_api;
mod service_accounts;
mod units_api;
mod usage;
mod usage_time;
mod user_numbers;
mod waitlist;
