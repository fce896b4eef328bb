//! The booking service: REST API, booking page, auth, audit log and metrics on
//! Postgres.
#![forbid(unsafe_code)]

pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
pub mod create_queue;
pub mod declared;
pub mod error;
pub mod extract;
pub mod hub_groups;
pub mod hub_login;
pub mod jwks;
pub mod metrics;
pub mod notices;
pub mod openapi;
pub mod page;
pub mod role;
pub mod routes;
pub mod server;
pub mod service_accounts;
pub mod state;
pub mod store;
pub mod testing;
pub mod write_limits;

/// The migrations, embedded: run at start-up and by `gpu-booking migrate`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
