//! Prometheus metrics of the API (`gpu_booking_api_*`).

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::app::AppState;

/// Every value comes from a closed set (see [`method_label`], [`status_label`]; the
/// route is a template of the router or `unmatched`), so that no client can grow the
/// metrics by sending made-up methods, paths or statuses.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    pub route: String,
    pub status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<RouteLabels, Histogram>,
    /// Booking create attempts by result: `created` or the refusing rule's code.
    pub booking_creates: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpu_booking_api");
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        });
        let booking_creates = Family::<ResultLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request duration by route",
            duration.clone(),
        );
        registry.register(
            "booking_creates",
            "Booking create attempts by result",
            booking_creates.clone(),
        );
        Metrics {
            registry,
            requests,
            duration,
            booking_creates,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The request method if it is one of HTTP's standard nine (RFC 9110 and PATCH),
/// else `other`: any token is a valid method on the wire.
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

/// The status code for the ones the API answers (the OpenAPI document's and the
/// server's own), else its class (`2xx` .. `5xx`, `other`).
pub fn status_label(status: StatusCode) -> &'static str {
    const KNOWN: [(u16, &str); 18] = [
        (200, "200"),
        (201, "201"),
        (204, "204"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (405, "405"),
        (408, "408"),
        (409, "409"),
        (413, "413"),
        (415, "415"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (503, "503"),
        (504, "504"),
    ];
    let code = status.as_u16();
    if let Some((_, label)) = KNOWN.iter().find(|(c, _)| *c == code) {
        return label;
    }
    match code / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        5 => "5xx",
        _ => "other",
    }
}

/// The label of requests no route matched (the fallback's 404s, whatever the path).
pub const UNMATCHED: &str = "unmatched";

/// Counts and times every request by its route template (not its raw path, so
/// that ids do not explode the label set).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED.to_string(), |m| m.as_str().to_string());
    let method = method_label(req.method());
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let m = &state.metrics;
    m.duration
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status: status_label(response.status()),
        })
        .inc();
    response
}
