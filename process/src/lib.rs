//! What every `gpu-booking` process shares, written once: the log set-up, the
//! shutdown signal, the plain-HTTP admin port (`/healthz`, `/readyz`, `/metrics`)
//! of the webhook, the controller and the node agent, the options they all take
//! (`options`: `--log-format`, `--admin-listen`) and the allocator's purge delay
//! (`allocator`).
// `deny`, not `forbid`: `allocator` sets one mimalloc option through its C API.
#![deny(unsafe_code)]

pub mod access;
pub mod allocator;
pub mod duration;
#[cfg(feature = "kube")]
pub mod kube_client;
pub mod metrics;
pub mod options;
pub mod serve;
pub mod testing;

/// For [`access_line!`]: the callers need not depend on `tracing` themselves.
#[doc(hidden)]
pub use tracing as __tracing;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use clap::ValueEnum;

/// Log line format (`--log-format`, `GPU_BOOKING_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object a line, for log collectors.
    Json,
    /// Human-readable lines.
    #[default]
    Plain,
}

/// Installs the global `tracing` subscriber (`RUST_LOG` filters, default `info`). A
/// second call is a no-op: tests, and the demo running several components in one
/// process, call it more than once.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let _ = LOGGING.set(format);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only for a terminal: in a file or a log collector they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Plain => builder.try_init(),
    };
}

/// The format the process logs in, once [`init_logging`] ran.
static LOGGING: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Reports the error that ends the process: a JSON log line (level ERROR) when the
/// process logs JSON, or was asked to (`--log-format json` or
/// `GPU_BOOKING_LOG_FORMAT=json`, for an error before logging started), so that a log
/// collector parses it like any other line; else `error: ...` on stderr.
pub fn report_fatal(error: &anyhow::Error) {
    let asked = || {
        requested_format(
            std::env::args().skip(1),
            std::env::var("GPU_BOOKING_LOG_FORMAT").ok(),
        )
    };
    match LOGGING.get().copied().or_else(asked) {
        Some(LogFormat::Json) => {
            init_logging(LogFormat::Json);
            tracing::error!(error = format!("{error:#}"), "fatal error, exiting");
        }
        _ => eprintln!("error: {error:#}"),
    }
}

/// The `--log-format` of a command line (as clap reads it: `--log-format json` or
/// `--log-format=json`), else that of the environment.
fn requested_format(args: impl Iterator<Item = String>, env: Option<String>) -> Option<LogFormat> {
    let parse = |v: &str| LogFormat::from_str(v, true).ok();
    let mut args = args;
    while let Some(arg) = args.next() {
        if arg == "--log-format" {
            return args.next().as_deref().and_then(parse);
        }
        if let Some(v) = arg.strip_prefix("--log-format=") {
            return parse(v);
        }
    }
    env.as_deref().and_then(parse)
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // No SIGTERM handler to be had: Ctrl-C alone ends the process.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

pub use metrics::OPENMETRICS;
pub use options::{AdminArgs, LogArgs};

/// The admin port: `/healthz` (the process runs), `/readyz` (200 once `ready` is
/// set, else 503 with `not_ready` as the body, which says what is awaited) and
/// `/metrics` (whatever `metrics` encodes as OpenMetrics text, in the text format when
/// the scraper asks for it: [`metrics::response`]); one access log line per request
/// ([`access::log_requests`]).
pub fn admin_router<M>(metrics: M, ready: Arc<AtomicBool>, not_ready: &'static str) -> Router
where
    M: Fn() -> String + Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.load(Ordering::Acquire);
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, not_ready)
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let body = metrics();
                async move { metrics::response(&headers, body) }
            }),
        )
        .layer(axum::middleware::from_fn(access::log_requests))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{header, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(app: &Router, path: &str) -> (StatusCode, String, Option<String>) {
        let res = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let content_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            String::from_utf8(body.to_vec()).unwrap(),
            content_type,
        )
    }

    #[test]
    fn the_log_format_asked_for_is_found_before_logging_starts() {
        let args = |a: &[&str]| {
            a.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert_eq!(
            requested_format(args(&["webhook", "--log-format", "json"]), None),
            Some(LogFormat::Json)
        );
        assert_eq!(
            requested_format(args(&["api", "--log-format=plain"]), Some("json".into())),
            Some(LogFormat::Plain)
        );
        assert_eq!(
            requested_format(args(&["api"]), Some("JSON".into())),
            Some(LogFormat::Json)
        );
        assert_eq!(requested_format(args(&["api", "--log-format"]), None), None);
        assert_eq!(requested_format(args(&["api"]), None), None);
    }

    #[tokio::test]
    async fn readiness_follows_the_flag_and_metrics_are_encoded_per_request() {
        let ready = Arc::new(AtomicBool::new(false));
        let scrapes = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = scrapes.clone();
        let app = admin_router(
            move || {
                format!(
                    "scrapes {}\n# EOF\n",
                    counter.fetch_add(1, Ordering::Relaxed) + 1
                )
            },
            ready.clone(),
            "waiting for the watches",
        );
        assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
        let (status, body, _) = get(&app, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "waiting for the watches")
        );
        ready.store(true, Ordering::Release);
        assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
        let (status, body, content_type) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "scrapes 1\n# EOF\n");
        assert_eq!(content_type.as_deref(), Some(OPENMETRICS));
        assert_eq!(get(&app, "/metrics").await.1, "scrapes 2\n# EOF\n");
        let res = app
            .clone()
            .oneshot(
                Request::get("/metrics")
                    .header(header::ACCEPT, "text/plain;version=0.0.4")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.headers()[header::CONTENT_TYPE], metrics::TEXT);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"scrapes 3\n");
        assert_eq!(get(&app, "/nope").await.0, StatusCode::NOT_FOUND);
    }
}
