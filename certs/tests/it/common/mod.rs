//! Shared set-up of the certs tests: a fake API server holding the webhook
//! configuration the chart renders, and options as the chart's jobs pass them.
#![allow(dead_code)]

use chrono::TimeDelta;
use clap::Parser;
use gpu_booking_certs::cluster::Cluster;
use gpu_booking_certs::config::{CertsArgs, CsrArgs, Mode, SelfSignedArgs};
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;

pub const NS: &str = "gpu-booking";
pub const SERVICE: &str = "gpu-booking-webhook";
pub const SECRET: &str = "gpu-booking-webhook-tls";
pub const CONFIG: &str = "gpu-booking-webhook";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: CertsArgs,
}

fn parse(args: &[&str]) -> Mode {
    let target = [
        "--namespace",
        NS,
        "--service",
        SERVICE,
        "--secret",
        SECRET,
        "--webhook-config",
        CONFIG,
    ];
    let all = std::iter::once("certs")
        .chain(args[..1].iter().copied())
        .chain(target)
        .chain(args[1..].iter().copied());
    match Cli::try_parse_from(all) {
        Ok(cli) => cli.args.mode,
        Err(e) => panic!("{e}"),
    }
}

pub fn self_signed(extra: &[&str]) -> SelfSignedArgs {
    match parse(&[&["self-signed"][..], extra].concat()) {
        Mode::SelfSigned(a) => a,
        other => panic!("{other:?}"),
    }
}

pub fn csr(extra: &[&str]) -> CsrArgs {
    match parse(
        &[
            &["csr", "--signer-name=example.com/webhook-serving"][..],
            extra,
        ]
        .concat(),
    ) {
        Mode::Csr(a) => a,
        other => panic!("{other:?}"),
    }
}

/// A webhook configuration as the chart renders it (no caBundle), with `webhooks`
/// entries.
pub fn webhook_config(webhooks: &[&str]) -> MutatingWebhookConfiguration {
    let hooks: Vec<serde_json::Value> = webhooks
        .iter()
        .map(|name| {
            serde_json::json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "clientConfig": {"service": {"name": SERVICE, "namespace": NS, "path": "/mutate", "port": 443}},
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": CONFIG},
        "webhooks": hooks,
    }))
    .expect("a valid configuration")
}

pub fn fake_with_config() -> (FakeApiServer, Cluster) {
    let server = FakeApiServer::new();
    server.put(&webhook_config(&["pods.gpu-booking.io"]));
    let cluster = Cluster::new(server.client(), NS);
    (server, cluster)
}

pub fn secret_entry(server: &FakeApiServer, name: &str, key: &str) -> String {
    let secret: Secret = server
        .get(Some(NS), name)
        .unwrap_or_else(|| panic!("no Secret {name}"));
    let data = secret.data.unwrap_or_default();
    let bytes = data
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {name}"));
    String::from_utf8(bytes.0.clone()).expect("PEM is UTF-8")
}

/// caBundle of each webhook of the configuration, decoded.
pub fn ca_bundles(server: &FakeApiServer) -> Vec<Option<String>> {
    let config: MutatingWebhookConfiguration =
        server.get(None, CONFIG).expect("the webhook configuration");
    config
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| {
            w.client_config
                .ca_bundle
                .map(|b| String::from_utf8(b.0).expect("PEM"))
        })
        .collect()
}

pub fn days(n: i64) -> TimeDelta {
    TimeDelta::days(n)
}
