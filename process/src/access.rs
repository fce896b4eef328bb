//! The access log: one line per request on every port of every
//! component, with the same message (`request`) and fields (`method`, `route`,
//! `status`, `latency_ms`) everywhere, so that one log query reads them all.
//!
//! A line names the route *template* (`/api/v1/bookings/{id}`, or [`UNMATCHED`]),
//! never the path, the query or a header: no id, feed token or bearer token reaches
//! the logs.
//!
//! The admin ports (`/healthz`, `/readyz`, `/metrics` of the webhook, the controller
//! and the agent) log through [`log_requests`], which [`crate::admin_router`] layers
//! on; their target is [`ACCESS_LOG`]. The booking API writes the same line with its
//! own target from its metrics middleware ([`access_line!`] with [`Access`]): a
//! `tracing` target is part of a callsite's static metadata, so one function cannot
//! log under a target its caller picks.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

/// The `tracing` target of the admin ports' access log lines (at debug unless a
/// request failed: `RUST_LOG=info,gpu_booking_process::access=debug` shows them all).
pub const ACCESS_LOG: &str = "gpu_booking_process::access";

/// The route of requests no route matched (a fallback's 404s, whatever the path).
pub const UNMATCHED: &str = "unmatched";

/// What an access log line says of a request, read before the handler takes it.
#[derive(Debug, Clone)]
pub struct Access {
    /// [`method_label`] of the request's method.
    pub method: &'static str,
    /// The matched route's template, or [`UNMATCHED`].
    pub route: String,
    /// A request that machines make on a timer (a probe, a scrape, a component's
    /// poll): its line is at debug when it succeeds, so that the info log holds what
    /// a person may act on; a failure (4xx, 5xx) is at info whatever the route.
    pub routine: bool,
    started: Instant,
}

impl Access {
    /// Reads `req` as it reaches a route (inside the router, where axum has set the
    /// [`MatchedPath`]); the latency counts from here.
    pub fn of(req: &Request) -> Self {
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| UNMATCHED.to_string(), |m| m.as_str().to_string());
        Self {
            method: method_label(req.method()),
            route,
            routine: false,
            started: Instant::now(),
        }
    }

    /// The same, marked [`Access::routine`] when `routine` says so.
    pub fn routine(mut self, routine: bool) -> Self {
        self.routine = routine;
        self
    }

    /// Whether this request's line goes at debug rather than info: routine, and
    /// answered without an error.
    pub fn quiet(&self, status: u16) -> bool {
        self.routine && status < 400
    }

    /// Time since [`Access::of`].
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Writes one access log line under `target` (a constant: `tracing` needs it at
/// compile time): `access_line!(TARGET, access: &Access, status: StatusCode,
/// took: Duration)`.
#[macro_export]
macro_rules! access_line {
    ($target:expr, $access:expr, $status:expr, $took:expr) => {
        if $access.quiet($status.as_u16()) {
            $crate::__tracing::debug!(
                target: $target,
                method = $access.method,
                route = %$access.route,
                status = $status.as_u16(),
                latency_ms = $took.as_secs_f64() * 1000.0,
                "request"
            )
        } else {
            $crate::__tracing::info!(
                target: $target,
                method = $access.method,
                route = %$access.route,
                status = $status.as_u16(),
                latency_ms = $took.as_secs_f64() * 1000.0,
                "request"
            )
        }
    };
}

/// The middleware of the admin ports (`axum::middleware::from_fn`): the request's
/// access log line under [`ACCESS_LOG`], at debug when it succeeds (the kubelet's
/// probes and Prometheus' scrapes, on a timer).
pub async fn log_requests(req: Request, next: Next) -> Response {
    let access = Access::of(&req).routine(true);
    let response = next.run(req).await;
    access_line!(ACCESS_LOG, access, response.status(), access.elapsed());
    response
}

/// The request method if it is one of HTTP's standard nine (RFC 9110 and PATCH),
/// else `other`: any token is a valid method on the wire, and a log field or metric
/// label must come from a closed set.
pub fn method_label(method: &Method) -> &'static str {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    STANDARD
        .iter()
        .find(|m| *m == method)
        .map_or("other", Method::as_str)
}
