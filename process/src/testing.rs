//! For tests of every crate: the JSON log lines a piece of code writes.
//!
//! A test that captures `tracing` output belongs alone in its test binary: the
//! subscriber set here is thread-local, and tracing's callsite interest, which is
//! process-wide, can be settled by a test running beside it on another thread (no
//! line captured).

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Collects the JSON lines of a `tracing` subscriber, for the test to read.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    /// Captures this thread's DEBUG-and-above events (as `--log-format json` writes
    /// them) until the guard drops.
    pub fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let capture = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(capture.clone())
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (capture, guard)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The lines written under `target`, parsed.
    pub fn lines_of(&self, target: &str) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["target"] == target)
            .collect()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

/// Sends `/healthz`, `/metrics` and an unknown path with a query to `admin` (a
/// component's admin router) and checks the access log: one line each under
/// [`crate::access::ACCESS_LOG`], with the route template, the status and the
/// latency, and never the raw path or query. Panics (for the test) otherwise.
pub async fn assert_admin_access_log(admin: axum::Router) {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (capture, _guard) = LogCapture::start();
    for uri in [
        "/healthz",
        "/metrics",
        "/no/such/place/31337?token=secret-42",
    ] {
        let request = Request::get(uri)
            .body(Body::empty())
            .expect("a valid request");
        let response = admin
            .clone()
            .oneshot(request)
            .await
            .expect("the router answers");
        let _ = response.into_body().collect().await;
    }
    let text = capture.text();
    let access = capture.lines_of(crate::access::ACCESS_LOG);
    assert_eq!(access.len(), 3, "one access line per request:\n{text}");
    let fields = |i: usize, key: &str| access[i]["fields"][key].clone();
    let routes: Vec<Value> = (0..3).map(|i| fields(i, "route")).collect();
    assert_eq!(routes, ["/healthz", "/metrics", "unmatched"], "{text}");
    let statuses: Vec<Value> = (0..3).map(|i| fields(i, "status")).collect();
    assert_eq!(statuses, [200, 200, 404], "{text}");
    // The probe and the scrape are routine (debug); the miss is at info.
    let levels: Vec<Value> = access.iter().map(|l| l["level"].clone()).collect();
    assert_eq!(levels, ["DEBUG", "DEBUG", "INFO"], "{text}");
    assert!(
        (0..3).all(|i| fields(i, "method") == "GET" && fields(i, "latency_ms").is_f64()),
        "{text}"
    );
    assert!(access.iter().all(|l| l["fields"]["message"] == "request"));
    for secret in ["31337", "secret-42"] {
        assert!(!text.contains(secret), "{secret} reached the logs:\n{text}");
    }
}
