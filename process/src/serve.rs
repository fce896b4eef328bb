//! Serving HTTP (plain or TLS) so that slow or hostile clients cannot exhaust the
//! process: written once for the booking API and the webhook.
//!
//! - at most `--max-connections` connections are served at once; further ones wait
//!   in the kernel's listen backlog;
//! - a connection must deliver its first request (TLS handshake included) within
//!   `--header-read-timeout`, and HTTP/1.1 headers must arrive within it (slowloris);
//! - a connection with no request in flight is closed after `--idle-timeout`
//!   (HTTP/2; an idle HTTP/1.1 keep-alive connection waits for its next headers at
//!   most `--header-read-timeout`);
//! - a request body must arrive within `--body-read-timeout` of its headers, is at
//!   most `--max-body-bytes` (answered by the server's own refusal, e.g. an
//!   AdmissionReview for the webhook), and is buffered from a memory budget shared by
//!   all connections (`--body-buffer-bytes`): a body waits for its share, so that many
//!   stalled large bodies cannot add up.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use bytes::{Bytes, BytesMut};
use clap::Args;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// Longest open connections get to finish their requests at shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest HTTP/1.1 read buffer of a connection: the longest request head (the
/// request line and headers) is a little under it.
const H1_MAX_BUF: usize = 64 * 1024;
/// HTTP/2 flow-control windows: what a client may send ahead of what the handler has
/// read, per stream and per connection.
const H2_STREAM_WINDOW: u32 = 64 * 1024;
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// Concurrent HTTP/2 streams per connection.
const H2_MAX_STREAMS: u32 = 32;
/// Largest HTTP/2 header list.
const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// The limits of a served port. `MAX_BODY` is the server's default body limit (the
/// webhook's reviews are larger than the API's requests).
#[derive(Debug, Clone, Args)]
pub struct ServerLimits<const MAX_BODY: usize> {
    /// Longest a client may take to send a request's headers; a new connection's
    /// first request (TLS handshake included) must arrive within it, and an idle
    /// HTTP/1.1 keep-alive connection waits this long for its next request.
    #[arg(long, env = "GPU_BOOKING_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    pub header_read_timeout: Duration,

    /// Longest a client may take to send a request's body, counted from its headers.
    #[arg(long, env = "GPU_BOOKING_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    pub body_read_timeout: Duration,

    /// How long an HTTP/2 connection may stay open with no request in flight.
    #[arg(long, env = "GPU_BOOKING_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_timeout)]
    pub idle_timeout: Duration,

    /// Most connections served at once; more wait in the listen backlog.
    #[arg(long, env = "GPU_BOOKING_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections: u32,

    /// Largest request body, in bytes; a larger one gets the server's documented
    /// refusal (the API: 413; the webhook: an AdmissionReview that refuses the pod).
    #[arg(long, env = "GPU_BOOKING_MAX_BODY_BYTES", default_value_t = MAX_BODY)]
    pub max_body_bytes: usize,

    /// Memory for request bodies being read, all connections together, in bytes; a
    /// body waits (within --body-read-timeout) until its share is free. At least
    /// --max-body-bytes.
    #[arg(long, env = "GPU_BOOKING_BODY_BUFFER_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub body_buffer_bytes: usize,
}

impl<const MAX_BODY: usize> Default for ServerLimits<MAX_BODY> {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_body_bytes: MAX_BODY,
            body_buffer_bytes: 32 * 1024 * 1024,
        }
    }
}

/// A timeout option: the one duration parser ([`crate::duration::parse_duration`]:
/// humantime syntax such as `10s` or `1m`, or bare seconds), between 1 ms and 1 day.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(86_400) {
        return Err(format!("{s:?}: must be between 1ms and 1day"));
    }
    Ok(d)
}

/// Why a request body was not read to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Over `--max-body-bytes` (by its Content-Length or as it arrived).
    TooLarge { limit: usize },
    /// Not complete within `--body-read-timeout` (including the wait for memory).
    TimedOut { after: Duration },
    /// The connection failed mid-body.
    Unreadable(String),
}

impl std::fmt::Display for BodyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyRefusal::TooLarge { limit } => {
                write!(f, "the request body is over the limit of {limit} bytes")
            }
            BodyRefusal::TimedOut { after } => {
                write!(f, "the request body did not arrive within {after:?}")
            }
            BodyRefusal::Unreadable(e) => write!(f, "the request body could not be read: {e}"),
        }
    }
}

/// How the server answers a body it refused (the API's JSON error, the webhook's
/// AdmissionReview).
pub type Refuse = fn(&BodyRefusal) -> Response;

/// The per-server state the connections share.
struct Shared {
    app: Router,
    refuse: Refuse,
    max_body: usize,
    body_timeout: Duration,
    header_timeout: Duration,
    idle_timeout: Duration,
    budget: Arc<Semaphore>,
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections
/// finish (at most [`DRAIN_TIMEOUT`]). Each accepted TCP stream goes through
/// `handshake` (TLS, or nothing for plain HTTP) before HTTP/1.1 or HTTP/2 is served
/// on it.
pub async fn serve<const MAX_BODY: usize, H, F, IO>(
    listener: TcpListener,
    limits: &ServerLimits<MAX_BODY>,
    app: Router,
    refuse: Refuse,
    handshake: H,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()>
where
    H: Fn(TcpStream) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    anyhow::ensure!(
        limits.body_buffer_bytes >= limits.max_body_bytes,
        "--body-buffer-bytes ({}) must be at least --max-body-bytes ({})",
        limits.body_buffer_bytes,
        limits.max_body_bytes
    );
    let budget = limits.body_buffer_bytes.min(Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        app,
        refuse,
        max_body: limits.max_body_bytes,
        body_timeout: limits.body_read_timeout,
        header_timeout: limits.header_read_timeout,
        idle_timeout: limits.idle_timeout,
        budget: Arc::new(Semaphore::new(budget)),
    });
    let max_connections = limits.max_connections;
    let connections = Arc::new(Semaphore::new(max_connections as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit?,
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off, do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(
            tcp,
            peer,
            handshake.clone(),
            shared.clone(),
            stop_rx.clone(),
            permit,
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = connections.acquire_many(max_connections);
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
    Ok(())
}

/// Requests in flight on one connection and when the last one ended.
struct Activity {
    in_flight: AtomicUsize,
    /// When the connection last had no request in flight after one (None: no request
    /// yet).
    idle_since: Mutex<Option<Instant>>,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// When the connection is to be closed if nothing is in flight then.
    fn deadline(&self, opened: Instant, shared: &Shared) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        Some(match idle_since {
            None => opened + shared.header_timeout,
            Some(at) => at + shared.idle_timeout,
        })
    }
}

/// A request in flight; its drop marks the connection idle when it was the last.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut idle_since = self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *idle_since = Some(Instant::now());
        }
    }
}

async fn connection<H, F, IO>(
    tcp: TcpStream,
    peer: SocketAddr,
    handshake: H,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) where
    H: Fn(TcpStream) -> F,
    F: Future<Output = std::io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let opened = Instant::now();
    let io = match tokio::time::timeout(shared.header_timeout, handshake(tcp)).await {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "handshake timed out");
            return;
        }
    };
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        idle_since: Mutex::new(None),
    });
    let service = {
        let shared = shared.clone();
        let activity = activity.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let in_flight = activity.begin();
            let shared = shared.clone();
            // The client's address, as axum's `ConnectInfo` extractor reads it (a
            // per-source limit keys on it).
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            async move {
                let response = handle(req.map(Body::new), &shared).await;
                drop(in_flight);
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.header_timeout)
        .max_buf_size(H1_MAX_BUF);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let ended = loop {
        let deadline = activity.deadline(opened, &shared);
        // With a request in flight, look again after a while (the body and the
        // handler have their own limits).
        let wake = deadline.unwrap_or_else(|| Instant::now() + shared.idle_timeout);
        tokio::select! {
            result = conn.as_mut() => break Some(result),
            () = tokio::time::sleep_until(wake) => {
                if activity.deadline(opened, &shared).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(%peer, "closing an idle connection");
                    break None;
                }
            }
            _ = stop.wait_for(|stop| *stop) => break None,
        }
    };
    if let Some(result) = ended {
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
        return;
    }
    // Idle or shutting down: finish what is in flight, then close.
    conn.as_mut().graceful_shutdown();
    if tokio::time::timeout(DRAIN_TIMEOUT, conn).await.is_err() {
        tracing::debug!(%peer, "connection did not finish in time; closed");
    }
}

/// Reads the body within the limits, then runs the app; a refused body gets the
/// server's refusal. The body's share of the budget is held until the answer.
async fn handle(req: Request, shared: &Shared) -> Response {
    let headers_at = Instant::now();
    let (parts, mut body) = req.into_parts();
    match buffer_body(&parts, &mut body, shared).await {
        Ok((bytes, share)) => {
            let req = Request::from_parts(parts, Body::from(bytes));
            let response = shared.app.clone().oneshot(req).await;
            drop(share);
            match response {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
        Err(refusal) => {
            tracing::debug!(%refusal, "request body refused");
            if matches!(refusal, BodyRefusal::TooLarge { .. })
                && parts.version < http::Version::HTTP_2
            {
                discard_rest(&mut body, headers_at + shared.body_timeout).await;
            }
            (shared.refuse)(&refusal)
        }
    }
}

/// Most of a refused HTTP/1.1 body that is read and dropped before the refusal is
/// sent.
const DISCARD_LIMIT: usize = 64 * 1024 * 1024;

/// Reads and drops what is left of a body that is over the limit, at most
/// [`DISCARD_LIMIT`] bytes and until `until`, holding no more than one frame.
///
/// Why: an HTTP/1.1 client writes its whole body before it reads the answer. Answer
/// mid-body and close, and the client's next write meets a reset, which most clients
/// (hyper's, and the test that caught it) report as "error writing a body" instead of
/// the refusal we sent, and the kernel may drop the unread answer with the reset.
/// Reading the rest lets the client finish, read the refusal and keep the
/// connection. HTTP/2 needs none of this: the stream is reset after the answer, which
/// RFC 9113 §8.1 tells clients to accept.
async fn discard_rest(body: &mut Body, until: Instant) {
    let discard = async {
        let mut discarded = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            discarded += frame.data_ref().map_or(0, Bytes::len);
            if discarded > DISCARD_LIMIT {
                return;
            }
        }
    };
    let _ = tokio::time::timeout_at(until, discard).await;
}

/// The request's body read into memory, and the budget share that holds it.
async fn buffer_body(
    parts: &http::request::Parts,
    body: &mut Body,
    shared: &Shared,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyRefusal> {
    use http_body::Body as _;
    if body.is_end_stream() {
        return Ok((Bytes::new(), None));
    }
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > shared.max_body as u64) {
        return Err(BodyRefusal::TooLarge {
            limit: shared.max_body,
        });
    }
    let read = read_within_budget(body, declared, shared);
    match tokio::time::timeout(shared.body_timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(BodyRefusal::TimedOut {
            after: shared.body_timeout,
        }),
    }
}

/// Reads `body` to its end, taking its bytes from the shared budget first: all at
/// once when the length is declared (so that two bodies never hold half a share each
/// and wait for the other), else frame by frame.
async fn read_within_budget(
    body: &mut Body,
    declared: Option<u64>,
    shared: &Shared,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyRefusal> {
    let too_large = || BodyRefusal::TooLarge {
        limit: shared.max_body,
    };
    let take = |n: usize| {
        let budget = shared.budget.clone();
        async move {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            budget
                .acquire_many_owned(n)
                .await
                .map_err(|e| BodyRefusal::Unreadable(e.to_string()))
        }
    };
    let mut share: Option<OwnedSemaphorePermit> = None;
    let mut reserved = 0usize;
    if let Some(n) = declared {
        // Checked against max_body above, which fits in usize.
        reserved = usize::try_from(n).map_err(|_| too_large())?;
        if reserved > 0 {
            share = Some(take(reserved).await?);
        }
    }
    let mut buf = BytesMut::with_capacity(reserved);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyRefusal::Unreadable(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing of ours reads them
        };
        let len = buf.len() + data.len();
        if len > shared.max_body {
            return Err(too_large());
        }
        if len > reserved {
            let more = take(len - reserved).await?;
            match &mut share {
                Some(s) => s.merge(more),
                None => share = Some(more),
            }
            reserved = len;
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf.freeze(), share))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn timeouts_are_humane_durations_within_bounds() {
        assert_eq!(parse_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout(" 1m "), Ok(Duration::from_secs(60)));
        for bad in ["0s", "1e30", "2days", "", "soon", "-1s"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn each_server_has_its_body_default_and_help_shows_every_default() {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            limits: ServerLimits<1234>,
        }
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(cli.limits.max_body_bytes, 1234);
        let defaults = ServerLimits::<1234>::default();
        assert_eq!(cli.limits.header_read_timeout, defaults.header_read_timeout);
        assert_eq!(cli.limits.idle_timeout, defaults.idle_timeout);
        assert_eq!(cli.limits.max_connections, defaults.max_connections);
        assert_eq!(cli.limits.body_buffer_bytes, defaults.body_buffer_bytes);
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for shown in [
            "[default: 10s]",
            "[default: 60s]",
            "[default: 256]",
            "[default: 1234]",
        ] {
            assert!(help.contains(shown), "{shown} not in --help:\n{help}");
        }
        assert!(Cli::try_parse_from(["x", "--max-connections=0"]).is_err());
    }
}
