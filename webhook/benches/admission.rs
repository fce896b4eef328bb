//! Admissions per second and latency over TLS with keep-alive, against a baseline in the
//! same run: a minimal rustls + hyper server that answers a fixed AdmissionReview.
//!
//! `cargo bench -p gpu-booking-webhook` runs the full benchmark (about 30 s); run as a
//! test (`cargo test --all-targets`), it only checks that every target answers, briefly.
//!
//! Targets:
//! - baseline: reads the body, answers a fixed `allowed` review;
//! - (a) the webhook, a KubeSpawner pod without GPU (no call to anyone);
//! - (b) the webhook, a booked user's GPU pod, decided from its replica of the
//!   booking service (a local stub that serves the admission state, an idle change
//!   stream and the audit batch endpoint): the warm path, one user; the same with
//!   `dryRun` (no audit report); and the same user with a new uid each time;
//! - (c) the cold path from the replica: every review a different booked user
//!   (`COLD_USERS` of them);
//! - (d), (e) the same warm and cold paths with `--decide-from lookup` (one
//!   schedulability call per user, cached 3 s), for comparison.
//!
//! Besides: 300 distinct users spawning within one second (open loop at 300/s,
//! every review a new user) against the replica and the lookup webhook, and the
//! ratios of its goals (cold/warm throughput, warm p99 / baseline p99).
//!
//! - our TLS + axum stack answering a fixed review (no admission logic), for scale.
//!
//! Two measurements per target: closed loop (16 connections sending back to back:
//! throughput; three rounds in which the targets take turns, the median round is
//! reported) and open loop at a fixed rate (2,000 requests/s over 16 connections:
//! latency; the targets take turns over three rounds too). Each round takes the
//! targets in another order, so that none always follows the same one (`order`
//! below). Latency runs from the moment a request is
//! written to its full response.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use gpu_booking_core::gpu_model::ModelName;
use gpu_booking_core::username::NameCase;
use gpu_booking_core::wire;
use gpu_booking_webhook::{DecideFrom, WebhookArgs, WebhookServer};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The `gpu-booking` binary's allocator (src/main.rs), so that the webhook is measured
/// as it runs; the baseline in the same process gets it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONNECTIONS: usize = 16;
/// Distinct booked users of the cold path (each review another one).
const COLD_USERS: usize = 20_000;
/// The spawn storm: distinct users within one second.
const STORM_USERS: usize = 300;

#[derive(Clone, Copy)]
struct Settings {
    rounds: usize,
    closed_for: Duration,
    rate: f64,
    rate_for: Duration,
    warmup: Duration,
}

fn main() {
    // As the `gpu-booking` binary does (src/main.rs).
    println!(
        "allocator: {}",
        gpu_booking_process::allocator::delay_purges()
    );
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            rounds: 3,
            closed_for: Duration::from_secs(2),
            rate: 2000.0,
            rate_for: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
        }
    } else {
        Settings {
            rounds: 1,
            closed_for: Duration::from_millis(300),
            rate: 200.0,
            rate_for: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
        }
    };

    // The servers get their own runtime (two workers, like the webhook's pod on two
    // cores); the load generator another. Everything shares this machine's cores.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("client")
        .enable_all()
        .build()
        .unwrap();

    let pki = Pki::new();
    let dir = std::env::temp_dir().join(format!("gpu-booking-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &pki.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &pki.key_pem).unwrap();

    let stub = server_rt.block_on(start_stub());
    let baseline = server_rt.block_on(start_baseline(&pki));
    let webhook = server_rt.block_on(start_webhook(&dir, &stub, "replica"));
    let lookup = server_rt.block_on(start_webhook(&dir, &stub, "lookup"));
    let framework = server_rt.block_on(start_framework(&dir));

    let nogpu = vec![review(
        "bench-nogpu",
        "7.1.0-alice-at-example.com-nogpu.json",
    )];
    let gpu = vec![review("bench-gpu", "7.1.0-alice-at-example.com-gpu.json")];
    let gpu_dry = {
        let mut v: Value = serde_json::from_slice(&gpu[0]).unwrap();
        v["request"]["dryRun"] = json!(true);
        vec![Bytes::from(serde_json::to_vec(&v).unwrap())]
    };
    let cold: Vec<Bytes> = (0..COLD_USERS).map(|i| review_for(&gpu[0], i)).collect();
    // The warm path's user with a new uid each time: whether the warm path's tail
    // comes from sending the very same review again and again.
    let warm_uids: Vec<Bytes> = (0..2_000)
        .map(|i| {
            let mut v: Value = serde_json::from_slice(&gpu[0]).unwrap();
            v["request"]["uid"] = json!(format!("bench-warm-{i}"));
            Bytes::from(serde_json::to_vec(&v).unwrap())
        })
        .collect();
    // The storm's users are none of the cold path's (a lookup cache never saw them).
    let storm_bodies: Vec<Bytes> = (COLD_USERS..COLD_USERS + STORM_USERS)
        .map(|i| review_for(&gpu[0], i))
        .collect();
    let storm_lookup: Vec<Bytes> = (COLD_USERS + STORM_USERS..COLD_USERS + 2 * STORM_USERS)
        .map(|i| review_for(&gpu[0], i))
        .collect();
    let client = Client::new(&pki.ca_pem);

    // The answers are what they should be before anything is timed. The replica lists
    // its state first; under a profiler that can take longer than the webhook waits
    // for it (--booking-timeout), so wait until it answers booked.
    client_rt.block_on(async {
        let mut conn = client.connect(webhook).await;
        let listed = Instant::now();
        while !conn.post(&gpu[0]).await.contains("booked a6000")
            && listed.elapsed() < Duration::from_secs(120)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    client_rt.block_on(async {
        let mut conn = client.connect(webhook).await;
        let a = conn.post(&nogpu[0]).await;
        assert!(
            a.contains("\"allowed\":true") && !a.contains("patch"),
            "{a}"
        );
        for target in [webhook, lookup] {
            let mut conn = client.connect(target).await;
            for body in [&gpu[0], &cold[7], &storm_bodies[0]] {
                let b = conn.post(body).await;
                assert!(
                    b.contains("\"allowed\":true") && b.contains("\"patch\""),
                    "{b}"
                );
                assert!(b.contains("booked a6000"), "{b}");
            }
        }
        let mut conn = client.connect(baseline).await;
        assert!(conn.post(&nogpu[0]).await.contains("\"allowed\":true"));
    });

    let targets = [
        ("baseline (fixed answer)", baseline, &nogpu),
        ("our TLS + axum stack, fixed answer", framework, &nogpu),
        ("(a) webhook, pod without GPU", webhook, &nogpu),
        ("(b) webhook, booked GPU pod (warm)", webhook, &gpu),
        ("(b) same, dryRun (no audit report)", webhook, &gpu_dry),
        ("(b) same user, a new uid each time", webhook, &warm_uids),
        ("(c) webhook, cold: each a new user", webhook, &cold),
        ("(d) lookup webhook, warm", lookup, &gpu),
        ("(e) lookup webhook, cold", lookup, &cold),
    ];
    // BENCH_ONLY=<part of a target name> runs one target (for profiling).
    let only = std::env::var("BENCH_ONLY").ok();
    let targets: Vec<_> = targets
        .into_iter()
        .filter(|(name, _, _)| only.as_deref().is_none_or(|o| name.contains(o)))
        .collect();
    // BENCH_SEQUENTIAL=<n>: instead of timing, send n requests one after the other on
    // one connection to each target and stop. For instruction counts, which do not
    // depend on the machine's load: run it under `valgrind --tool=callgrind` with two
    // values of n; the difference of the totals over the difference of n is what one
    // request costs (client and server; the client's share is the same for every
    // target). See docs/performance.md, "The webhook bench".
    if let Some(n) = std::env::var("BENCH_SEQUENTIAL")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        client_rt.block_on(async {
            for (name, addr, bodies) in &targets {
                let mut conn = client.connect(*addr).await;
                for i in 0..n {
                    conn.post_bytes(&bodies[i % bodies.len()]).await;
                }
                println!("{name}: {n} sequential requests");
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // Throughput: the targets take turns, round after round, so that a drift of the
    // machine's speed hits them alike; each target's rate is its median round.
    // Each round takes the targets in another order: round r starts at target r and
    // steps by the r-th number prime to the count (1, 3, 5 for 8 targets), so that the
    // target before each one differs from round to round (rotating one order would
    // keep every target behind the same one, and a target's tail would be its
    // predecessor's leftovers) and none is always first.
    let count = targets.len();
    let order = move |round: usize| {
        let step = (1..)
            .filter(|m| gcd(*m, count) == 1)
            .nth(round)
            .unwrap_or(1);
        (0..count).map(move |j| (j * step + round) % count)
    };
    let mut rounds: Vec<Vec<Measured>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..settings.rounds {
        for i in order(round) {
            let (_, addr, body) = &targets[i];
            rounds[i].push(client_rt.block_on(closed_loop(&client, *addr, body, &settings)));
        }
    }
    // Latency at a fixed rate: the targets take turns too, each round a share of the
    // time, so that what the machine does meanwhile (other processes, the webhooks'
    // own background work such as the audit batches left by the closed loops) falls
    // on every target alike instead of on whichever runs first; each target's
    // latencies are those of all its rounds.
    let open_settings = Settings {
        rate_for: settings.rate_for / settings.rounds as u32,
        ..settings
    };
    let mut open_rounds: Vec<Vec<Measured>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..settings.rounds {
        for i in order(round) {
            let (_, addr, body) = &targets[i];
            let open = client_rt.block_on(open_loop(&client, *addr, body, &open_settings));
            open_rounds[i].push(open);
        }
    }
    let results: Vec<_> = targets
        .iter()
        .zip(rounds)
        .zip(open_rounds)
        .map(|(((name, _, _), closed), open)| {
            (*name, Measured::merge(closed), Measured::merge(open))
        })
        .collect();
    // The spawn storm: 300 new users within one second.
    let storm_settings = Settings {
        rate: STORM_USERS as f64,
        rate_for: Duration::from_secs(1),
        warmup: Duration::ZERO,
        ..settings
    };
    let storms = if only.is_none() {
        vec![
            (
                "replica",
                client_rt.block_on(open_loop(&client, webhook, &storm_bodies, &storm_settings)),
            ),
            (
                "lookup",
                client_rt.block_on(open_loop(&client, lookup, &storm_lookup, &storm_settings)),
            ),
        ]
    } else {
        Vec::new()
    };

    println!();
    println!(
        "admission benchmark: TLS 1.3, HTTP/1.1 keep-alive, {CONNECTIONS} connections, {} body bytes (a), {} (b)",
        nogpu[0].len(),
        gpu[0].len()
    );
    println!(
        "{:<36} {:>12} {:>9} {:>9}   {:>12} {:>9} {:>9} {:>9}",
        "target", "closed req/s", "p50 ms", "p99 ms", "open req/s", "p50 ms", "p99 ms", "max ms"
    );
    for (name, closed, open) in &results {
        println!(
            "{:<36} {:>12.0} {:>9.3} {:>9.3}   {:>12.0} {:>9.3} {:>9.3} {:>9.3}",
            name,
            closed.rate,
            closed.p(0.50),
            closed.p(0.99),
            open.rate,
            open.p(0.50),
            open.p(0.99),
            open.p(1.0)
        );
    }
    for (name, m) in &storms {
        println!(
            "storm, {STORM_USERS} new users within 1 s, {name}: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            m.p(0.5),
            m.p(0.99),
            m.p(1.0)
        );
    }
    let find = |prefix: &str| results.iter().find(|r| r.0.starts_with(prefix));
    if let (Some(warm), Some(cold)) = (find("(b) webhook"), find("(c)")) {
        println!(
            "replica: cold/warm throughput {:.2}",
            cold.1.rate / warm.1.rate
        );
    }
    if let (Some(warm), Some(cold)) = (find("(d)"), find("(e)")) {
        println!(
            "lookup: cold/warm throughput {:.2}",
            cold.1.rate / warm.1.rate
        );
    }
    let Some((base, base_p99)) = find("baseline").map(|r| (r.1.rate, r.2.p(0.99))) else {
        return;
    };
    for prefix in ["(b) webhook", "(b) same user", "(c)", "(d)", "(e)"] {
        if let Some((name, _, open)) = find(prefix) {
            println!(
                "{name}: p99 at {:.0} req/s is {:.2} x the baseline's ({:.3} ms)",
                settings.rate,
                open.p(0.99) / base_p99,
                base_p99
            );
        }
    }
    for (name, closed, open) in results.iter().filter(|r| !r.0.starts_with("baseline")) {
        println!(
            "{name}: {:.2} of the baseline's throughput; p99 at {:.0} req/s: {:.3} ms",
            closed.rate / base,
            settings.rate,
            open.p(0.99)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    drop(server_rt);
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "bench CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "webhook");
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

fn review(uid: &str, file: &str) -> Bytes {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/kubespawner")
        .join(file);
    let mut pod: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    pod["metadata"]["namespace"] = json!("jhub");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "jhub",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:jhub:hub"},
            "object": pod,
            "dryRun": false
        }
    });
    Bytes::from(serde_json::to_vec(&review).unwrap())
}

/// The cold path's user `i`'s review: the booked review with another user's name.
fn review_for(template: &Bytes, i: usize) -> Bytes {
    let mut v: Value = serde_json::from_slice(template).unwrap();
    v["request"]["uid"] = json!(format!("bench-cold-{i}"));
    v["request"]["object"]["metadata"]["annotations"]["hub.jupyter.org/username"] =
        json!(cold_user(i));
    Bytes::from(serde_json::to_vec(&v).unwrap())
}

fn cold_user(i: usize) -> String {
    format!("user{i:05}@example.com")
}

/// The booking service: alice and every cold user are booked on a6000 (units free).
/// Lookups, the admission state (full and figures), an idle change stream (each
/// long poll waits, then answers no change), single and batched audit reports.
async fn start_stub() -> SocketAddr {
    let at = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
    let until = at("2099-11-30T00:00:00Z");
    let start = at("2026-01-01T00:00:00Z");
    let model = |name: &str, units: u32, free: u64, gpumem_mib: u64| wire::ModelState {
        name: ModelName::parse(name).unwrap(),
        units,
        free,
        gpumem_mib,
        gpumem_advertised_mib: None,
        usage_reported_at: None,
    };
    let models = vec![
        model("a100", 2, 0, 40960),
        model("a6000", 100_000, 2, 49152),
    ];
    let answer_models = models.clone();
    let answer = move |user: &str, id: i64| {
        let mut answer = wire::Schedulability::booked(
            &answer_models,
            wire::ActiveBooking {
                id,
                until,
                model: ModelName::parse("a6000").ok(),
                user: user.to_owned(),
                units: 1,
                units_held: 0,
            },
        );
        // As a service that predates the inventory report answers: budgets are
        // not checked against the nodes, and units are whatever the pod asks.
        answer.gpumem_advertised_mib = None;
        answer.units = None;
        answer.units_held = None;
        answer
    };
    let state = |full: bool| {
        let booking = |id: usize, user: &str| wire::BookingState {
            id: i64::try_from(id).unwrap(),
            user: user.to_owned(),
            model: "a6000".into(),
            units: 1,
            start,
            end: until,
        };
        let mut bookings = vec![booking(18, "alice@example.com")];
        bookings
            .extend((0..COLD_USERS + 2 * STORM_USERS).map(|i| booking(1000 + i, &cold_user(i))));
        wire::AdmissionState {
            at: start,
            names: NameCase::Lowercase,
            policy: wire::PolicyState {
                min_duration_secs: 86400,
                max_duration_secs: 1_209_600,
                cooldown_secs: 1_209_600,
                no_booking_while_active: true,
                max_planned: 1,
                max_units_per_booking: 1,
            },
            models: models.clone(),
            held: BTreeMap::new(),
            offers: Vec::new(),
            groups: Vec::new(),
            position: full.then_some(1),
            bookings: full.then_some(bookings),
            users: full.then(Vec::new),
        }
    };
    let full = state(true);
    let figures = state(false);
    let app = axum::Router::new()
        .route(
            "/api/v1/schedulability",
            get(
                move |q: axum::extract::Query<std::collections::BTreeMap<String, String>>| {
                    let user = q.get("user").cloned().unwrap_or_default();
                    let id = if user == "alice@example.com" {
                        18
                    } else {
                        1000
                    };
                    let answer = answer(&user, id);
                    async move { axum::Json(answer) }
                },
            ),
        )
        .route(
            "/api/v1/admission-state",
            get(
                move |q: axum::extract::Query<std::collections::BTreeMap<String, String>>| {
                    let answer = if q.get("full").map(String::as_str) == Some("false") {
                        figures.clone()
                    } else {
                        full.clone()
                    };
                    async move { axum::Json(answer) }
                },
            ),
        )
        .route(
            "/api/v1/booking-changes",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                axum::Json(wire::BookingChanges {
                    changes: Vec::new(),
                    next: 1,
                    behind_ms: 0,
                    more: false,
                })
            }),
        )
        .route(
            "/api/v1/audit",
            post(|| async { (axum::http::StatusCode::CREATED, "{\"id\":1}") }),
        )
        .route(
            "/api/v1/audit/batch",
            post(|| async { (axum::http::StatusCode::CREATED, "{\"ids\":[]}") }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

async fn start_webhook(dir: &std::path::Path, stub: &SocketAddr, from: &str) -> SocketAddr {
    let mut args = WebhookArgs::with_defaults(
        dir.join("tls.crt"),
        dir.join("tls.key"),
        format!("http://{stub}"),
        "bench-token".into(),
    );
    // The reviews come from JupyterHub's ServiceAccount, as in a real cluster.
    args.trusted_spawner = vec!["system:serviceaccount:jhub:hub".into()];
    args.spawner_namespace = vec!["jhub".into()];
    args.decide_from = match from {
        "lookup" => DecideFrom::Lookup,
        _ => DecideFrom::Replica,
    };
    let server = Arc::new(WebhookServer::from_args(&args).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = server.serve(listener, std::future::pending()).await;
    });
    addr
}

/// The baseline: TLS, HTTP/1.1, read the body, answer fixed bytes.
async fn start_baseline(pki: &Pki) -> SocketAddr {
    let config =
        gpu_booking_webhook::tls::server_config(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes())
            .unwrap();
    let acceptor = TlsAcceptor::from(config);
    let answer = Bytes::from_static(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"bench","allowed":true}}"#,
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let answer = answer.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(answer))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

struct Client {
    connector: TlsConnector,
}

struct Conn {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Client {
    fn new(ca_pem: &str) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            connector: TlsConnector::from(Arc::new(config)),
        }
    }

    async fn connect(&self, addr: SocketAddr) -> Conn {
        let tcp = TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = self.connector.connect(name, tcp).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        Conn { send }
    }
}

impl Conn {
    async fn post(&mut self, body: &Bytes) -> String {
        let bytes = self.post_bytes(body).await;
        String::from_utf8_lossy(&bytes).into_owned()
    }

    async fn post_bytes(&mut self, body: &Bytes) -> Bytes {
        self.send.ready().await.unwrap();
        let request = Request::post("/mutate?timeout=10s")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let response = self.send.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap().to_bytes()
    }
}

struct Measured {
    rate: f64,
    /// Sorted latencies, seconds.
    latencies: Vec<f64>,
}

impl Measured {
    /// Quantile `q` in milliseconds.
    fn p(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i] * 1000.0
    }

    /// Rounds of one target: the median rate, all latencies.
    fn merge(rounds: Vec<Measured>) -> Self {
        let mut rates: Vec<f64> = rounds.iter().map(|m| m.rate).collect();
        rates.sort_by(f64::total_cmp);
        let rate = rates[rates.len() / 2];
        let mut latencies: Vec<f64> = rounds.into_iter().flat_map(|m| m.latencies).collect();
        latencies.sort_by(f64::total_cmp);
        Self { rate, latencies }
    }

    fn from(mut latencies: Vec<f64>, took: Duration) -> Self {
        latencies.sort_by(f64::total_cmp);
        Self {
            rate: latencies.len() as f64 / took.as_secs_f64(),
            latencies,
        }
    }
}

/// Every connection sends back to back for the duration (after a warm-up).
async fn closed_loop(
    client: &Client,
    addr: SocketAddr,
    bodies: &[Bytes],
    s: &Settings,
) -> Measured {
    let bodies: Arc<Vec<Bytes>> = Arc::new(bodies.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(client.connect(addr).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let (stop, measuring) = (stop.clone(), measuring.clone());
        let (bodies, next) = (bodies.clone(), next.clone());
        tasks.spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let body = &bodies[next.fetch_add(1, Ordering::Relaxed) % bodies.len()];
                let t = Instant::now();
                conn.post_bytes(body).await;
                if measuring.load(Ordering::Relaxed) {
                    lat.push(t.elapsed().as_secs_f64());
                }
            }
            lat
        });
    }
    tokio::time::sleep(s.warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(s.closed_for).await;
    measuring.store(false, Ordering::Relaxed);
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    while let Some(lat) = tasks.join_next().await {
        all.extend(lat.unwrap());
    }
    Measured::from(all, took)
}

/// Requests at a fixed rate, spread over the connections (request i goes out at
/// start + i/rate on connection i mod N).
async fn open_loop(client: &Client, addr: SocketAddr, bodies: &[Bytes], s: &Settings) -> Measured {
    let bodies: Arc<Vec<Bytes>> = Arc::new(bodies.to_vec());
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(client.connect(addr).await);
    }
    let warm = (s.rate * s.warmup.as_secs_f64()) as usize;
    let total = warm + (s.rate * s.rate_for.as_secs_f64()) as usize;
    let interval = Duration::from_secs_f64(1.0 / s.rate);
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let mut tasks = tokio::task::JoinSet::new();
    for (j, mut conn) in conns.into_iter().enumerate() {
        let bodies = bodies.clone();
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let mut i = j;
            while i < total {
                tokio::time::sleep_until(start + interval * i as u32).await;
                let body = &bodies[i % bodies.len()];
                let t = Instant::now();
                conn.post_bytes(body).await;
                if i >= warm {
                    lat.push(t.elapsed().as_secs_f64());
                }
                i += CONNECTIONS;
            }
            lat
        });
    }
    let mut all = Vec::new();
    while let Some(lat) = tasks.join_next().await {
        all.extend(lat.unwrap());
    }
    let measured_for = interval * (total - warm) as u32;
    let mut m = Measured::from(all, measured_for);
    // The rate offered; a server that cannot keep up shows in the latencies.
    m.rate = m.latencies.len() as f64 / measured_for.as_secs_f64();
    m
}

/// The webhook's own serving stack (`serve_tls`: certificate store, hyper-util auto,
/// axum) answering a fixed review: what the stack costs before any admission logic.
async fn start_framework(dir: &std::path::Path) -> SocketAddr {
    let metrics = Arc::new(gpu_booking_webhook::Metrics::new());
    let certs =
        gpu_booking_webhook::CertStore::load(dir.join("tls.crt"), dir.join("tls.key"), metrics);
    let certs = Arc::new(certs.unwrap());
    let app = axum::Router::new().route("/mutate", post(|body: axum::body::Body| async move {
        let b = axum::body::to_bytes(body, 3 << 20).await.unwrap();
        std::hint::black_box(b);
        ([("content-type", "application/json")], r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"bench","allowed":true}}"#)
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let limits = gpu_booking_webhook::WebhookLimits::default();
        let _ =
            gpu_booking_webhook::serve_tls(listener, certs, app, &limits, std::future::pending())
                .await;
    });
    addr
}
