//! Forged reviews: a pod that can reach the webhook's port posts reviews of lent GPU
//! pods. They cannot keep a real user's spawn from being lent once they stop (the
//! units they took leave the lend ledger at the next usage report after the settle
//! time), one source is held to its rate, and with `--client-ca` only the API
//! server's certificate is served at all.

use crate::common;
use crate::e2e::{api, client_builder, ks, label, mutate, start_webhook, Pki, SecretDir, HUB};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use gpu_booking_api::testing::TestApi;
use gpu_booking_core::admission::AdmissionConfig;
use gpu_booking_webhook::{BookingSource, Metrics, ReviewOut, TokenSource, Webhook, WebhookArgs};
use serde_json::{json, Value};

/// Where the forger's reviews come from, and where the API server's do.
const FORGER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A booking service nothing answers at.
const UNREACHABLE: &str = "http://127.0.0.1:9";

/// A test CA, a serving pair it signed (in a directory named after `name`, removed
/// when dropped) and the webhook's options to serve it, the rest at their defaults.
fn serving(name: &str, booking_url: &str, token: &str) -> (Pki, SecretDir, WebhookArgs) {
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("webhook");
    let mut secret = SecretDir::new(name);
    secret.write(&cert, &key);
    let args = WebhookArgs::with_defaults(
        secret.cert(),
        secret.key(),
        booking_url.to_owned(),
        token.to_owned(),
    );
    (pki, secret, args)
}

/// A review of a GPU pod without a trusted creator (lent when a unit is free), as a
/// pod in another namespace would forge it.
fn forged(i: usize) -> Value {
    let pod = plain_pod(
        &format!("forged-{i}"),
        json!({"limits": {"nvidia.com/gpu": "1"}}),
    );
    let mut review = review(&format!("forged-{i}"), pod);
    review["request"]["userInfo"] = json!({"username": "system:serviceaccount:evil:default"});
    review["request"]["namespace"] = json!("evil");
    review
}

/// The value of a metric line `name` in the OpenMetrics text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[sqlx::test(migrations = "../migrations")]
async fn e2e_ten_thousand_forged_lent_reviews_then_a_real_spawn_is_lent_after_one_report(
    pool: sqlx::PgPool,
) {
    let booking_api = TestApi::start(pool.clone()).await.unwrap();
    let admin = booking_api.token("admin@example.com", Some("admin"));
    let service = booking_api.token("controller", Some("service"));
    let http = reqwest::Client::new();
    let model_url = format!("{}/api/v1/models/a6000", booking_api.url);
    api(
        &http,
        reqwest::Method::PUT,
        model_url.clone(),
        &admin,
        json!({"units": 2, "patterns": ["*A6000*"], "gpumem_mib": 49152}),
    )
    .await;
    // The controller's usage report: no pod holds an a6000 (none of the forged ones
    // was ever created). It sends one every few seconds even when nothing changed.
    let report = {
        let (http, url, token) = (http.clone(), format!("{model_url}/usage"), service.clone());
        move || {
            let (http, url, token) = (http.clone(), url.clone(), token.clone());
            async move {
                api(
                    &http,
                    reqwest::Method::PUT,
                    url,
                    &token,
                    json!({"in_use": 0, "cards": 2}),
                )
                .await;
            }
        }
    };
    report().await;

    let (pki, _secret, mut args) = serving("forged", &booking_api.url, &service);
    args.trusted_spawner = vec![HUB.into()];
    args.spawner_namespace = vec!["jhub".into()];
    args.replica_refresh = Duration::from_millis(200);
    // Only a report can release the forged units: the time to live is out of reach.
    args.lend_ttl = Duration::from_secs(3600);
    let settle = args.lend_settle;
    args.source_review_burst = 20;
    args.source_reviews_per_second = 5.0;
    let webhook = start_webhook(args).await;
    let replica = webhook.server.webhook.booking().replica().unwrap().clone();
    let from = |source: IpAddr| {
        client_builder(&pki.ca_pem(), webhook.addr)
            .local_address(source)
            .build()
            .unwrap()
    };
    let (forger, apiserver) = (from(FORGER), from(API_SERVER));

    // The controller keeps reporting while the forger posts 10,000 reviews, 1,000 a
    // second (at most: each second's share is sent, then the rest of the second
    // waited).
    let reporter = tokio::spawn({
        let report = report.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                report().await;
            }
        }
    });
    let (mut refused, mut lent, mut stripped) = (0, 0, 0);
    let mut real_during_flood = None;
    for second in 0..10 {
        let started = tokio::time::Instant::now();
        let answers: Vec<(Value, ReviewOut)> = futures::stream::iter(0..1000)
            .map(|i| {
                let forger = &forger;
                let addr = webhook.addr;
                async move {
                    let review = forged(second * 1000 + i);
                    let out = mutate(forger, addr, &review).await.0;
                    (review, out)
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for (review, out) in answers {
            if !out.response.allowed {
                assert_eq!(out.response.status.map(|s| s.code), Some(429));
                refused += 1;
                continue;
            }
            let (_, pod) = patched(&review["request"]["object"], &out).unwrap();
            match label(&pod, "gpu-booking.io/priority") {
                Some("low") => lent += 1,
                _ => stripped += 1,
            }
        }
        if second == 4 {
            // The API server is another source: its reviews are answered as always.
            let pod = ks("7.1.0-Bob.Smith-gpu.json");
            real_during_flood = Some(
                mutate(&apiserver, webhook.addr, &review("bob-0", pod))
                    .await
                    .0,
            );
        }
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    }
    reporter.abort();
    let flood = lent + stripped + refused;
    assert_eq!(flood, 10_000);
    // Over 10 s and more, at 20 at once and 5 a second: most were refused, and the
    // rest took every unit as often as a report gave them back.
    assert!(
        refused > 9_000,
        "refused {refused}, lent {lent}, stripped {stripped}"
    );
    assert!(
        lent >= 4,
        "lent {lent}: the forged reviews retake what reports release"
    );
    let real = real_during_flood.unwrap();
    assert!(real.response.allowed, "{:?}", real.response.status);

    // The flood is over. After the settle time, one usage report (and the replica's
    // next read of it) leaves no forged unit in the ledger: a real user's spawn is
    // lent.
    tokio::time::sleep(settle).await;
    report().await;
    assert!(replica.refreshed(Duration::from_secs(10)).await);
    let pod = ks("7.1.0-Bob.Smith-gpu.json");
    let (out, _) = mutate(&apiserver, webhook.addr, &review("bob-1", pod.clone())).await;
    let (_, spawned) = patched(&pod, &out).unwrap();
    assert_eq!(
        label(&spawned, "gpu-booking.io/priority"),
        Some("low"),
        "{:?}",
        out.response.warnings
    );

    let metrics = webhook.server.metrics.encode();
    assert_eq!(
        metric(
            &metrics,
            "gpu_booking_webhook_admissions_total{decision=\"rate_limited\"}"
        ),
        f64::from(refused),
        "{metrics}"
    );
}

/// A webhook whose booking service is out of reach (every GPU pod is decided by
/// `--on-booking-error`), with a per-source limit of `burst` and no refill to speak of.
fn limited(burst: u32) -> Webhook {
    let metrics = Arc::new(Metrics::new());
    let booking = BookingSource::new(
        UNREACHABLE,
        TokenSource::Static(SERVICE_TOKEN.into()),
        Duration::from_millis(100),
        Duration::ZERO,
        metrics.clone(),
    )
    .unwrap();
    Webhook::new(AdmissionConfig::default(), Arc::new(booking), metrics)
        .with_source_limit(burst, 0.001)
}

#[tokio::test]
async fn a_source_over_its_limit_has_its_gpu_pods_refused_and_nothing_else_changes() {
    let webhook = limited(1);
    let gpu = || {
        review(
            "gpu",
            plain_pod("job", json!({"limits": {"nvidia.com/gpu": "1"}})),
        )
    };
    let body = |review: Value| serde_json::to_vec(&review).unwrap();
    // The first GPU review of a source is decided; the next is refused with 429.
    let first = webhook.review_from(&body(gpu()), Some(FORGER)).await;
    assert!(first.response.allowed);
    let refused = webhook.review_from(&body(gpu()), Some(FORGER)).await;
    assert!(!refused.response.allowed);
    let status = refused.response.status.unwrap();
    assert_eq!(
        (status.code, status.reason.as_deref()),
        (429, Some("TooManyRequests"))
    );
    assert_eq!(refused.response.uid, "gpu");
    assert!(status.message.contains("127.0.0.3"), "{}", status.message);
    // An IPv4 address written as IPv6 is the same source.
    let mapped = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 3).to_ipv6_mapped());
    assert!(
        !webhook
            .review_from(&body(gpu()), Some(mapped))
            .await
            .response
            .allowed
    );
    // Pods without a GPU are answered as always: they take nothing.
    let plain = review("plain", plain_pod("web", json!({})));
    let out = webhook.review_from(&body(plain), Some(FORGER)).await;
    assert!(out.response.allowed && out.response.patch.is_none());
    // What is not a pod creation is not refused either, nor is a malformed review
    // read as one.
    let mut update = gpu();
    update["request"]["operation"] = json!("UPDATE");
    assert!(
        webhook
            .review_from(&body(update), Some(FORGER))
            .await
            .response
            .allowed
    );
    let garbage = webhook
        .review_from(b"[\"nvidia.com/gpu\"]", Some(FORGER))
        .await;
    assert_eq!(garbage.response.status.unwrap().code, 400);
    // Another source has its own bucket; a review of no known source (in-process
    // callers) is not limited.
    assert!(
        webhook
            .review_from(&body(gpu()), Some(API_SERVER))
            .await
            .response
            .allowed
    );
    assert!(
        webhook
            .review_from(&body(gpu()), None)
            .await
            .response
            .allowed
    );
    let metrics = webhook.metrics().encode();
    assert_eq!(
        metric(
            &metrics,
            "gpu_booking_webhook_admissions_total{decision=\"rate_limited\"}"
        ),
        2.0,
        "{metrics}"
    );
}

/// Sends one review of a pod without a GPU with `client`; the error when the
/// connection is refused.
async fn post(client: &reqwest::Client, addr: SocketAddr) -> Result<ReviewOut, reqwest::Error> {
    let review = review("mtls", plain_pod("web", json!({})));
    client
        .post(format!("https://localhost:{}/mutate", addr.port()))
        .json(&review)
        .send()
        .await?
        .json()
        .await
}

#[tokio::test]
async fn with_a_client_ca_only_a_certificate_it_signed_with_an_allowed_name_is_served() {
    let (pki, _secret, mut args) = serving("mtls", UNREACHABLE, "unused");
    // The API server's client certificates come from a CA of their own.
    let clients = Pki::new();
    let ca_file = std::env::temp_dir().join(format!("gpu-booking-mtls-ca-{}", std::process::id()));
    std::fs::write(&ca_file, clients.ca_pem()).unwrap();
    args.client_ca = Some(ca_file.clone());
    args.client_name = vec!["kube-apiserver-webhook-client".into()];
    let webhook = start_webhook(args).await;
    let with_identity = |issuer: &Pki, cn: &str| {
        let (cert, key, _) = issuer.issue(cn);
        let identity = reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap();
        client_builder(&pki.ca_pem(), webhook.addr)
            .identity(identity)
            .build()
            .unwrap()
    };

    let apiserver = with_identity(&clients, "kube-apiserver-webhook-client");
    let out = post(&apiserver, webhook.addr).await.unwrap();
    assert!(out.response.allowed);
    assert_eq!(out.response.uid, "mtls");
    for (who, client) in [
        (
            "no certificate",
            client_builder(&pki.ca_pem(), webhook.addr).build().unwrap(),
        ),
        (
            "another CA",
            with_identity(&pki, "kube-apiserver-webhook-client"),
        ),
        ("another name", with_identity(&clients, "system:node:gpu-1")),
    ] {
        assert!(
            post(&client, webhook.addr).await.is_err(),
            "{who} is served"
        );
    }
    let metrics = webhook.server.metrics.encode();
    assert_eq!(
        metric(
            &metrics,
            "gpu_booking_webhook_client_certificates_refused_total"
        ),
        3.0,
        "{metrics}"
    );
    std::fs::remove_file(ca_file).unwrap();
}

#[test]
fn a_client_name_without_a_client_ca_is_refused_at_start() {
    let (_, _secret, mut args) = serving("mtls-options", UNREACHABLE, "unused");
    args.decide_from = gpu_booking_webhook::DecideFrom::Lookup;
    args.client_name = vec!["kube-apiserver-webhook-client".into()];
    let err = gpu_booking_webhook::WebhookServer::from_args(&args)
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("--client-ca"), "{err:#}");
}
