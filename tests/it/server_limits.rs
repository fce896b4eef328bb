//! Slow and hostile clients cannot exhaust the servers: the real
//! `gpu-booking api` (plain HTTP) and `gpu-booking webhook` (TLS) binaries, on
//! 127.0.0.1, under 600 idle or trickling connections and then 600 stalled 3 MB
//! bodies. Every such connection is ended by the server (header, body and idle
//! timeouts), the server still answers afterwards, and its peak memory (VmHWM)
//! stays within a generous bound of its own baseline (VmRSS after start-up), both
//! printed. Over-limit bodies get the webhook's AdmissionReview on HTTP/1.1 and
//! HTTP/2.
//!
//! Short timeouts (2-3 s) keep the test bounded; nothing asserts on elapsed time.
//! `LIMITS_DEBUG=<RUST_LOG filter>` shows the servers' logs.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::common::ports::free_addr;

const CONNECTIONS: usize = 600;
const BODY_DECLARED: usize = 3_000_000;
const BODY_SENT: usize = 2_900_000;
/// Safety net only: a server that keeps connections open fails the test here.
const SCENARIO_LIMIT: Duration = Duration::from_secs(180);
/// Most the peak may exceed the baseline: without the limits a server reaches
/// hundreds of MB under this load, past the chart's 256 Mi limit.
const GROWTH_BOUND_MIB: u64 = 160;

const SHORT_LIMITS: [&str; 3] = [
    "--header-read-timeout=2s",
    "--body-read-timeout=3s",
    "--idle-timeout=3s",
];

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
type BoxStream = Box<dyn Stream>;

/// How to reach the server under test.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    /// TLS client configuration (the webhook), None for plain HTTP (the API).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The path bodies are posted to.
    post_path: &'static str,
}

impl Target {
    async fn connect(&self) -> std::io::Result<BoxStream> {
        let tcp = small_buffered(self.addr).await?;
        self.wrap(tcp).await
    }

    /// TLS on a connected socket for the webhook, nothing for the API.
    async fn wrap(&self, tcp: TcpStream) -> std::io::Result<BoxStream> {
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("localhost")
                    .map_err(std::io::Error::other)?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await?;
                Ok(Box::new(tls))
            }
        }
    }
}

/// A client socket with a small send buffer, so that 600 stalled bodies do not park
/// gigabytes in the kernel.
async fn small_buffered(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_send_buffer_size(64 * 1024)?;
    socket.connect(addr).await
}

struct Server {
    child: Child,
    pid: u32,
    name: &'static str,
}

impl Server {
    /// Starts the binary and waits for the log line that says it listens.
    async fn start(name: &'static str, args: &[String], ready: &str) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-booking"))
            .args(args)
            .env(
                "RUST_LOG",
                "warn,gpu_booking_api=info,gpu_booking_webhook=info",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning gpu-booking");
        let pid = child.id().expect("a pid");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("{name} did not start"))
                .expect("reading its log")
                .unwrap_or_else(|| panic!("{name} exited before listening"));
            assert!(
                !line.contains("\u{1b}["),
                "colour codes in a piped log: {line:?}"
            );
            if line.contains(ready) {
                break;
            }
        }
        // Keep reading its log so that it never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if std::env::var_os("LIMITS_DEBUG").is_some() {
                    eprintln!("{line}");
                }
            }
        });
        Server { child, pid, name }
    }

    /// (VmRSS, VmHWM) in KiB.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("reading /proc/<pid>/status");
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {key} in {status}"))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Sends `request` on a fresh connection and reads until the server closes it.
async fn exchange(target: &Target, request: &[u8]) -> String {
    let mut stream = target.connect().await.expect("connecting");
    stream.write_all(request).await.expect("writing");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// How a hostile connection ended.
#[derive(Debug, Default)]
struct Ended {
    /// The server answered (first line of the answer, counted by status).
    answered: std::collections::BTreeMap<String, usize>,
    /// The server closed it without an answer.
    closed: usize,
    /// The client could not connect or write at all.
    refused: usize,
}

/// Connections that connect and send nothing (half) or trickle a request head one
/// byte at a time (half), each until the server closes it.
async fn idle_and_trickling(target: &Target) -> Ended {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CONNECTIONS {
        let target = target.clone();
        // One connect at a time, as clients arrive: a burst of 600 SYNs overflows the
        // kernel's accept queue, whose dropped handshakes leave idle clients waiting on
        // connections the server never had.
        let tcp = small_buffered(target.addr).await;
        tasks.spawn(async move {
            let Ok(tcp) = tcp else {
                return None;
            };
            // Idle ones never start TLS either: the handshake is part of the wait.
            let stream: BoxStream = if i % 2 == 0 {
                Box::new(tcp)
            } else {
                match target.wrap(tcp).await {
                    Ok(s) => s,
                    Err(_) => return Some(false),
                }
            };
            let (mut read, mut write) = tokio::io::split(stream);
            let head = format!("POST {} HTTP/1.1\r\nHost: localhost\r\n", target.post_path);
            let mut head = head.bytes().chain(std::iter::repeat(b'x'));
            let mut buf = [0u8; 512];
            loop {
                tokio::select! {
                    n = read.read(&mut buf) => return Some(matches!(n, Ok(n) if n > 0)),
                    () = tokio::time::sleep(Duration::from_millis(200)), if i % 2 == 1 => {
                        let byte = [head.next().unwrap_or(b'x')];
                        if write.write_all(&byte).await.is_err() {
                            return Some(false);
                        }
                    }
                }
            }
        });
    }
    let mut ended = Ended::default();
    let all = async {
        while let Some(result) = tasks.join_next().await {
            match result.expect("a client task") {
                None => ended.refused += 1,
                Some(true) => *ended.answered.entry("some answer".into()).or_default() += 1,
                Some(false) => ended.closed += 1,
            }
        }
    };
    if tokio::time::timeout(SCENARIO_LIMIT, all).await.is_err() {
        panic!(
            "the server kept {} idle or trickling connections open",
            tasks.len()
        );
    }
    ended
}

/// Connections that declare a 3 MB body, send 2.9 MB of it and stall, each until the
/// server answers or closes it.
async fn stalled_bodies(target: &Target) -> Ended {
    static BODY: [u8; 64 * 1024] = [b' '; 64 * 1024];
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        let target = target.clone();
        let tcp = small_buffered(target.addr).await;
        tasks.spawn(async move {
            let Ok(tcp) = tcp else {
                return None;
            };
            let Ok(stream) = target.wrap(tcp).await else {
                return Some(None);
            };
            let (mut read, mut write) = tokio::io::split(stream);
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {BODY_DECLARED}\r\n\r\n",
                target.post_path
            );
            let send = async move {
                write.write_all(head.as_bytes()).await?;
                let mut sent = 0;
                while sent < BODY_SENT {
                    let n = BODY.len().min(BODY_SENT - sent);
                    write.write_all(&BODY[..n]).await?;
                    sent += n;
                }
                std::future::pending::<()>().await;
                Ok::<_, std::io::Error>(write)
            };
            let receive = async move {
                let mut answer = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match read.read(&mut buf).await {
                        Ok(n) if n > 0 => {
                            answer.extend_from_slice(&buf[..n]);
                            if let Some(end) = answer.windows(2).position(|w| w == b"\r\n") {
                                return Some(String::from_utf8_lossy(&answer[..end]).into_owned());
                            }
                        }
                        _ => return (!answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned()),
                    }
                }
            };
            tokio::select! {
                line = receive => Some(line),
                // The send side only ends by failing: the server closed the connection.
                _ = send => Some(None),
            }
        });
    }
    let mut ended = Ended::default();
    let all = async {
        while let Some(result) = tasks.join_next().await {
            match result.expect("a client task") {
                None => ended.refused += 1,
                Some(Some(line)) => *ended.answered.entry(line).or_default() += 1,
                Some(None) => ended.closed += 1,
            }
        }
    };
    if tokio::time::timeout(SCENARIO_LIMIT, all).await.is_err() {
        panic!("the server kept {} stalled bodies open", tasks.len());
    }
    ended
}

/// Runs both scenarios against `server`, checks it still answers `healthy`, and
/// asserts on its peak memory.
async fn under_load(server: &Server, target: &Target, healthy: &[u8], expect: &str) {
    let check = |answer: String, when: &str| {
        assert!(
            answer.starts_with(expect),
            "{}: {when}: {answer:?}",
            server.name
        );
    };
    check(exchange(target, healthy).await, "first request");
    let (baseline, _) = server.memory();

    let ended = idle_and_trickling(target).await;
    let (_, after_idle) = server.memory();
    println!(
        "{}: {CONNECTIONS} idle/trickling connections: {ended:?}; VmHWM {} KiB",
        server.name, after_idle
    );
    check(exchange(target, healthy).await, "after idle connections");

    let ended = stalled_bodies(target).await;
    let (rss, peak) = server.memory();
    println!(
        "{}: {CONNECTIONS} stalled {BODY_DECLARED}-byte bodies: {ended:?}; VmHWM {peak} KiB, VmRSS after {rss} KiB",
        server.name
    );
    check(exchange(target, healthy).await, "after stalled bodies");
    println!(
        "{}: peak memory {} MiB over a baseline of {} MiB (bound: baseline + {GROWTH_BOUND_MIB} MiB)",
        server.name,
        (peak.saturating_sub(baseline)) / 1024,
        baseline / 1024
    );
    assert!(
        peak <= baseline + GROWTH_BOUND_MIB * 1024,
        "{}: peak {peak} KiB, baseline {baseline} KiB",
        server.name
    );
}

#[sqlx::test]
async fn the_api_survives_slow_clients_in_bounded_memory(pool: PgPool) {
    let db = pool
        .connect_options()
        .get_database()
        .expect("a test database")
        .to_owned();
    let addr = free_addr();
    let mut args: Vec<String> = vec![
        "api".into(),
        format!("--listen={addr}"),
        format!("--database-url=postgres://postgres@127.0.0.1:5432/{db}"),
        "--jwt-secret=server-limits-test-secret-0123456789abcdef".into(),
        // 3 MB bodies are within the limit, so that they are read, not refused at once.
        "--max-body-bytes=4000000".into(),
    ];
    args.extend(SHORT_LIMITS.iter().map(|s| s.to_string()));
    let server = Server::start("api", &args, "booking API listening").await;
    let target = Target {
        addr,
        tls: None,
        post_path: "/api/v1/audit",
    };
    let healthy = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    under_load(&server, &target, healthy, "HTTP/1.1 200").await;
    server.stop().await;
    pool.close().await;
}

/// The webhook's TLS client configuration trusting the demo CA, with `alpn`.
fn tls_client(ca_pem: &str, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.expect("a CA certificate"))
            .expect("adding the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Starts the webhook binary with a fresh demo CA in `dir`; returns it, its address
/// and the CA.
async fn start_webhook(dir: &Path, extra: &[&str]) -> (Server, SocketAddr, String) {
    let names = ["localhost".to_string(), "127.0.0.1".to_string()];
    let certs = gpu_booking_certs::pki::DevCerts::generate("server-limits test CA", &names)
        .expect("certificates");
    let paths = certs.write_to(dir).expect("writing certificates");
    let (addr, admin) = (free_addr(), free_addr());
    let mut args: Vec<String> = vec![
        "webhook".into(),
        format!("--listen={addr}"),
        format!("--admin-listen={admin}"),
        format!("--tls-cert={}", paths.cert.display()),
        format!("--tls-key={}", paths.key.display()),
        // Nothing listens there: the reviews here never get as far as asking.
        "--booking-url=http://127.0.0.1:9".into(),
        "--service-token=unused".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let server = Server::start("webhook", &args, "webhook serving").await;
    (server, addr, certs.ca_pem)
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-booking-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_survives_slow_clients_in_bounded_memory() {
    let dir = temp_dir("limits-webhook");
    let (server, addr, ca) = start_webhook(&dir, &SHORT_LIMITS).await;
    let target = Target {
        addr,
        tls: Some(tls_client(&ca, &[b"http/1.1"])),
        post_path: "/mutate",
    };
    let review =
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1"}}"#;
    let mut healthy = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        review.len()
    )
    .into_bytes();
    healthy.extend_from_slice(review);
    under_load(&server, &target, &healthy, "HTTP/1.1 200").await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An over-limit body is answered with the documented AdmissionReview (not a reset
/// stream or a bare 413), on HTTP/2 and HTTP/1.1, whether its length is declared or
/// only discovered as it streams in.
#[tokio::test(flavor = "multi_thread")]
async fn over_limit_bodies_get_the_review_on_http2_and_http1() {
    let dir = temp_dir("limits-h2");
    let (server, addr, ca) = start_webhook(&dir, &["--max-body-bytes=1000000"]).await;
    for (alpn, h2) in [(&b"h2"[..], true), (&b"http/1.1"[..], false)] {
        for declared in [true, false] {
            let target = Target {
                addr,
                tls: Some(tls_client(&ca, &[alpn])),
                post_path: "/mutate",
            };
            let stream = target.connect().await.expect("connecting");
            let io = hyper_util::rt::TokioIo::new(stream);
            let body: Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = std::io::Error> + Send>> =
                if declared {
                    Box::pin(Full::new(Bytes::from(vec![b' '; 2_000_000])).map_err(|e| match e {}))
                } else {
                    let chunks = (0..32).map(|_| {
                        Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(
                            vec![b' '; 64 * 1024],
                        )))
                    });
                    Box::pin(StreamBody::new(futures::stream::iter(chunks)))
                };
            let request = hyper::Request::post("https://localhost/mutate")
                .header("content-type", "application/json")
                .body(body)
                .expect("a request");
            // HTTP/1.1: the same connection then carries a healthy review, which
            // shows the server read the refused body to its end instead of closing.
            let (response, next) = if h2 {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await
                        .expect("an HTTP/2 connection");
                tokio::spawn(conn);
                (sender.send_request(request).await, None)
            } else {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                    .await
                    .expect("an HTTP/1.1 connection");
                tokio::spawn(conn);
                (sender.send_request(request).await, Some(sender))
            };
            let case = format!("h2={h2} declared={declared}");
            let response = response.unwrap_or_else(|e| panic!("{case}: no answer: {e}"));
            assert_eq!(response.status(), 200, "{case}");
            let body = response
                .into_body()
                .collect()
                .await
                .unwrap_or_else(|e| panic!("{case}: answer cut off: {e}"))
                .to_bytes();
            let review: serde_json::Value = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{case}: not JSON ({e}): {body:?}"));
            assert_eq!(review["kind"], "AdmissionReview", "{case}: {review}");
            assert_eq!(review["response"]["allowed"], false, "{case}: {review}");
            let message = review["response"]["status"]["message"]
                .as_str()
                .unwrap_or("");
            assert!(
                message.contains("over the limit of 1000000 bytes"),
                "{case}: {review}"
            );
            if let Some(mut sender) = next {
                sender
                    .ready()
                    .await
                    .unwrap_or_else(|e| panic!("{case}: connection not kept: {e}"));
                let healthy: Pin<Box<dyn hyper::body::Body<Data = Bytes, Error = std::io::Error> + Send>> =
                    Box::pin(Full::new(Bytes::from_static(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2"}}"#)).map_err(|e| match e {}));
                let again = hyper::Request::post("https://localhost/mutate")
                    .header("content-type", "application/json")
                    .body(healthy)
                    .expect("a request");
                let again = sender
                    .send_request(again)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: no second answer: {e}"));
                assert_eq!(again.status(), 200, "{case}: second request");
            }
        }
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
