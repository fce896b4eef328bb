//! The write limits of `core::write_limits`, shared by every request of a replica,
//! and applied where the caller is known: the bearer-token extractor
//! ([`crate::auth::Caller`]), after the token is verified.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use gpu_booking_core::write_limits::{is_write, WriteLimits};

use crate::error::ApiError;

/// The replica's write limits. Cheap to clone (one lock, held for a lookup).
#[derive(Clone)]
pub struct WriteGate(Arc<Mutex<WriteLimits>>);

impl WriteGate {
    pub fn new(limits: WriteLimits) -> Self {
        Self(Arc::new(Mutex::new(limits)))
    }

    /// No limit (the tests' state; the service's options always set one).
    pub fn off() -> Self {
        Self::new(WriteLimits::off())
    }

    /// Takes a write of `user`, unless the request only reads or the caller has the
    /// `service` role; `RateLimited` (429) when their user or their address is over
    /// its limit. The address is the connection's peer (`ConnectInfo`, which the
    /// service's server sets).
    pub fn admit(&self, parts: &Parts, user: &str, service: bool) -> Result<(), ApiError> {
        if service || !is_write(parts.method.as_str()) {
            return Ok(());
        }
        let source = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip());
        let checked =
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .check(user, source, Instant::now());
        checked.map_err(|limited| {
            tracing::info!(
                scope = limited.scope.as_str(),
                "write refused: over the rate limit"
            );
            ApiError::RateLimited {
                message: limited.message(),
                retry_after: limited.retry_after_secs,
            }
        })
    }
}
