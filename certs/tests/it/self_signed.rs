//! `gpu-booking certs self-signed` against the fake API server: bootstrap, idempotence,
//! renewal, CA rotation, the run before install, and concurrent writers.

use crate::common;

use chrono::Utc;
use common::*;
use gpu_booking_certs::cluster::Injection;
use gpu_booking_certs::plan::Reason;
use gpu_booking_certs::{pki, self_signed, Error};
use gpu_booking_fake_apiserver::{Failure, Verb};

#[tokio::test]
async fn first_run_creates_both_secrets_and_injects_the_ca() {
    let (server, cluster) = fake_with_config();
    let report = self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.ca_renewed, Some(Reason::Missing));
    assert_eq!(report.serving_renewed, Some(Reason::Missing));
    assert_eq!(report.injection, Injection::Patched(1));
    assert_eq!(report.secrets_written, 2);

    let bundle = secret_entry(&server, SECRET, "ca.crt");
    assert_eq!(ca_bundles(&server), vec![Some(bundle.clone())]);
    let ca = pki::parse_leaf(&secret_entry(&server, &format!("{SECRET}-ca"), "tls.crt")).unwrap();
    let leaf = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(leaf.signed_by(&ca));
    assert!(leaf.covers(&[
        format!("{SERVICE}.{NS}.svc"),
        format!("{SERVICE}.{NS}.svc.cluster.local"),
    ]));
    assert!(pki::key_matches(
        &leaf,
        &secret_entry(&server, SECRET, "tls.key")
    ));
    assert_eq!(pki::parse_bundle(&bundle).unwrap(), vec![ca]);
    // The CA's key is only in the CA Secret, which no pod mounts.
    assert!(
        !secret_entry(&server, SECRET, "tls.key").contains(&secret_entry(
            &server,
            &format!("{SECRET}-ca"),
            "tls.key"
        ))
    );
}

#[tokio::test]
async fn a_second_run_writes_nothing() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&[]);
    let now = Utc::now();
    self_signed::run(&cluster, &args, now).await.unwrap();
    let writes = |s: &gpu_booking_fake_apiserver::FakeApiServer| {
        s.count_verb(Verb::Create) + s.count_verb(Verb::Update) + s.count_verb(Verb::Patch)
    };
    let before = writes(&server);
    let version = server.resource_version();
    let report = self_signed::run(&cluster, &args, now + days(1))
        .await
        .unwrap();
    assert_eq!(report.ca_renewed, None);
    assert_eq!(report.serving_renewed, None);
    assert_eq!(report.injection, Injection::Unchanged);
    assert_eq!(report.secrets_written, 0);
    assert_eq!(writes(&server), before, "an idempotent run sends no write");
    assert_eq!(server.resource_version(), version);
}

#[tokio::test]
async fn the_serving_certificate_is_renewed_inside_the_margin_only() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&["--cert-validity=90days", "--renew-before=30days"]);
    let now = Utc::now();
    self_signed::run(&cluster, &args, now).await.unwrap();
    let first = secret_entry(&server, SECRET, "tls.crt");
    let bundle = ca_bundles(&server);

    let report = self_signed::run(&cluster, &args, now + days(59))
        .await
        .unwrap();
    assert_eq!(report.serving_renewed, None);
    assert_eq!(secret_entry(&server, SECRET, "tls.crt"), first);

    let report = self_signed::run(&cluster, &args, now + days(61))
        .await
        .unwrap();
    assert!(matches!(
        report.serving_renewed,
        Some(Reason::Expiring { .. })
    ));
    assert_eq!(report.ca_renewed, None);
    assert_eq!(
        report.injection,
        Injection::Unchanged,
        "same CA: caBundle untouched"
    );
    assert_eq!(report.secrets_written, 1);
    let renewed = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(renewed.not_after > now + days(61 + 89));
    assert_eq!(ca_bundles(&server), bundle);
}

#[tokio::test]
async fn a_ca_rotation_trusts_both_cas_before_the_webhook_serves_the_new_one() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&[
        "--ca-validity=400days",
        "--cert-validity=90days",
        "--renew-before=30days",
    ]);
    let now = Utc::now();
    self_signed::run(&cluster, &args, now).await.unwrap();
    let old_ca =
        pki::parse_leaf(&secret_entry(&server, &format!("{SECRET}-ca"), "tls.crt")).unwrap();
    let requests_before = server.requests().len();

    // 400 - 90 - 30 = 280 days in, a new serving certificate would outlive the CA.
    let report = self_signed::run(&cluster, &args, now + days(285))
        .await
        .unwrap();
    assert!(matches!(report.ca_renewed, Some(Reason::Expiring { .. })));
    assert_eq!(report.serving_renewed, Some(Reason::OtherIssuer));
    let bundle = ca_bundles(&server)[0].clone().unwrap();
    let trusted = pki::parse_bundle(&bundle).unwrap();
    assert_eq!(trusted.len(), 2);
    assert_eq!(trusted[1], old_ca);
    let leaf = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(leaf.signed_by(&trusted[0]));

    // The order of the writes: CA Secret, caBundle, serving Secret.
    let writes: Vec<String> = server.requests()[requests_before..]
        .iter()
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update | Verb::Patch))
        .map(|r| {
            format!(
                "{:?} {} {}",
                r.verb,
                r.plural,
                r.name.clone().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        writes,
        vec![
            format!("Update secrets {SECRET}-ca"),
            format!("Patch mutatingwebhookconfigurations {CONFIG}"),
            format!("Update secrets {SECRET}"),
        ]
    );
}

#[tokio::test]
async fn before_install_the_missing_configuration_is_skipped_only_when_asked() {
    let server = gpu_booking_fake_apiserver::FakeApiServer::new();
    let cluster = gpu_booking_certs::cluster::Cluster::new(server.client(), NS);
    let err = self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MissingWebhookConfig(_)), "{err}");

    let report = self_signed::run(
        &cluster,
        &self_signed(&["--skip-missing-webhook-config"]),
        Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(report.injection, Injection::Missing);
    // The Secrets exist, so the webhook pods can start; the run after install patches.
    server.put(&webhook_config(&["pods.gpu-booking.io"]));
    let report = self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.injection, Injection::Patched(1));
    assert_eq!(report.secrets_written, 0);
}

#[tokio::test]
async fn only_webhooks_without_the_bundle_are_patched() {
    let server = gpu_booking_fake_apiserver::FakeApiServer::new();
    server.put(&webhook_config(&["a.gpu-booking.io", "b.gpu-booking.io"]));
    let cluster = gpu_booking_certs::cluster::Cluster::new(server.client(), NS);
    self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap();
    let bundles = ca_bundles(&server);
    assert_eq!(bundles.len(), 2);
    assert_eq!(bundles[0], bundles[1]);
    // Someone blanks the second one (e.g. a `kubectl apply` of the chart's manifest).
    server.modify::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>(
        None,
        CONFIG,
        |v| {
            v["webhooks"][1]["clientConfig"]
                .as_object_mut()
                .map(|c| c.remove("caBundle"));
        },
    );
    let report = self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.injection, Injection::Patched(1));
    assert_eq!(ca_bundles(&server)[1], bundles[0]);
}

#[tokio::test]
async fn a_concurrent_writer_makes_the_run_start_over() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&[]);
    let now = Utc::now();
    // Another run got in first: our create of the CA Secret answers 409 AlreadyExists.
    server.fail(Failure::on(Verb::Create, "secrets").code(409).times(1));
    let report = self_signed::run(&cluster, &args, now).await.unwrap();
    assert_eq!(report.secrets_written, 2);
    // A stale update (409 Conflict) of the serving Secret during a renewal.
    server.fail(
        Failure::on(Verb::Update, "secrets")
            .named(SECRET)
            .code(409)
            .times(2),
    );
    let report = self_signed::run(&cluster, &args, now + days(340))
        .await
        .unwrap();
    assert!(report.serving_renewed.is_some());
    // Conflicts that never end give up with the conflict, not a loop.
    server.fail(
        Failure::on(Verb::Update, "secrets")
            .named(SECRET)
            .code(409)
            .always(),
    );
    let err = self_signed::run(&cluster, &args, now + days(700))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
}

#[tokio::test]
async fn api_errors_and_bad_options_are_reported() {
    let (server, cluster) = fake_with_config();
    server.fail(Failure::on(Verb::Get, "secrets").code(403).always());
    let err = self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Kube(_)), "{err}");
    let err = self_signed::run(
        &cluster,
        &self_signed(&["--cert-validity=10days"]),
        Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("renewal margin"), "{err}");
}

#[tokio::test]
async fn a_damaged_secret_is_repaired() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&[]);
    self_signed::run(&cluster, &args, Utc::now()).await.unwrap();
    server.modify::<k8s_openapi::api::core::v1::Secret>(Some(NS), SECRET, |v| {
        v["data"]["tls.key"] = serde_json::json!("bm90IGEga2V5");
    });
    let report = self_signed::run(&cluster, &args, Utc::now()).await.unwrap();
    assert_eq!(report.serving_renewed, Some(Reason::KeyMismatch));
    let leaf = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(pki::key_matches(
        &leaf,
        &secret_entry(&server, SECRET, "tls.key")
    ));
}
