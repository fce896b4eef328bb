//! What every handler shares: the database, the policy, the clock, auth, metrics.
//!
//! Its own module, below the routes: the routes, the auth extractor, the metrics
//! middleware and the page depend on it (or, through `FromRef`, on the parts of it
//! they use), and it depends on none of them but the types it holds, so that the
//! modules form layers (`app` -> `routes` -> `state` -> `store`, `core`) and no
//! circle (docs/architecture.md, "The booking service's modules").

use std::sync::{Arc, Mutex};

use axum::extract::FromRef;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::rate::TokenBucket;
use gpu_booking_core::username::NameCase;
use sqlx::PgPool;

use crate::auth::Authenticator;
use crate::clock::Clock;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub policy: Arc<Policy>,
    pub clock: Arc<dyn Clock>,
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    /// The booking page as served (with the OIDC settings in it).
    pub page: crate::page::Page,
    /// How user names compare (JupyterHub lowercases by default).
    pub names: NameCase,
    /// Bounds the audit rows that ambiguous slug lookups write (anyone with the
    /// service role can ask about any slug).
    pub ambiguity_audit: Arc<Mutex<TokenBucket>>,
    /// The channels notices go out on (`crate::notices::enqueue` takes them).
    pub notices: crate::notices::Channels,
    /// Wakes long polls of `/api/v1/booking-changes` (one watch per process).
    pub changes: crate::store::changes::ChangeFeed,
    /// Booking creates wait here to be written in batches (`crate::create_queue`).
    pub creates: crate::create_queue::CreateQueue,
    /// Rate limits on writes, per user and per source (`--user-write-*`,
    /// `--source-write-*`).
    pub writes: crate::write_limits::WriteGate,
}

/// Audit rows for ambiguous slugs at once, and per second after that.
const AMBIGUITY_AUDIT_BURST: u32 = 10;
const AMBIGUITY_AUDIT_PER_SECOND: f64 = 0.2;

/// A fresh bucket for [`AppState::ambiguity_audit`].
pub fn ambiguity_audit_bucket() -> Arc<Mutex<TokenBucket>> {
    Arc::new(Mutex::new(TokenBucket::new(
        AMBIGUITY_AUDIT_BURST,
        AMBIGUITY_AUDIT_PER_SECOND,
    )))
}

// The parts that the extractors of lower modules take (`auth::Caller`, the page).
impl FromRef<AppState> for Authenticator {
    fn from_ref(state: &AppState) -> Authenticator {
        state.auth.clone()
    }
}

impl FromRef<AppState> for NameCase {
    fn from_ref(state: &AppState) -> NameCase {
        state.names
    }
}

impl FromRef<AppState> for crate::write_limits::WriteGate {
    fn from_ref(state: &AppState) -> crate::write_limits::WriteGate {
        state.writes.clone()
    }
}

impl FromRef<AppState> for crate::page::Page {
    fn from_ref(state: &AppState) -> crate::page::Page {
        state.page.clone()
    }
}

impl FromRef<AppState> for crate::hub_login::HubLoginState {
    fn from_ref(state: &AppState) -> crate::hub_login::HubLoginState {
        state.page.hub_login()
    }
}
