//! TLS bootstrap of the admission webhook (`gpu-booking certs`), so that `helm install`
//! needs no manual step:
//!
//! - `self-signed`: a CA of our own and a serving certificate for the webhook
//!   Service's names, kept in Secrets and renewed before they expire; the CA goes into
//!   the webhook configuration's `caBundle` ([`self_signed`], decisions in [`plan`]);
//! - `csr`: the serving certificate from a `certificates.k8s.io/v1` signer ([`csr`]);
//! - `dev`: a CA and a serving certificate in a folder, for the demo and tests
//!   ([`pki::DevCerts`]).
//!
//! Every run is idempotent: it reads what is stored, changes only what is due, and
//! writes with optimistic concurrency (a concurrent run makes it start over).
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod cluster;
pub mod config;
pub mod csr;
pub mod error;
pub mod pki;
pub mod plan;
pub mod self_signed;

use std::future::Future;

use chrono::Utc;

pub use config::{CertsArgs, Mode};
pub use error::Error;

use cluster::{Cluster, Injection};
use config::Target;

/// Attempts of one run when other writers keep getting in first.
const ATTEMPTS: u32 = 5;

/// Runs `step` again while it ends in [`Error::Conflict`], at most [`ATTEMPTS`] times.
pub(crate) async fn retry_on_conflict<T, F, Fut>(mut step: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut attempt = 1;
    loop {
        match step().await {
            Err(Error::Conflict(why)) if attempt < ATTEMPTS => {
                tracing::info!(attempt, %why, "a concurrent change; reading again");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Puts the bundle into the webhook configuration; a missing configuration is an error
/// unless the target allows it (the run before install).
pub(crate) async fn inject(
    cluster: &Cluster,
    target: &Target,
    bundle_pem: &str,
) -> Result<Injection, Error> {
    let injection = cluster
        .inject_ca_bundle(&target.webhook_config, bundle_pem)
        .await?;
    if injection == Injection::Missing && !target.skip_missing_webhook_config {
        return Err(Error::MissingWebhookConfig(target.webhook_config.clone()));
    }
    Ok(injection)
}

/// `gpu-booking certs ...`.
pub async fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.mode {
        Mode::Dev(dev) => {
            let certs = pki::DevCerts::generate("gpu-booking dev CA", &dev.name)?;
            let paths = certs.write_to(&dev.out_dir)?;
            println!("CA: {}", paths.ca.display());
            println!("certificate: {}", paths.cert.display());
            println!("key: {}", paths.key.display());
            Ok(())
        }
        Mode::SelfSigned(args) => {
            args.target.log.init();
            let cluster = connect(&args.target).await?;
            let report = self_signed::run(&cluster, &args, Utc::now()).await?;
            tracing::info!(
                namespace = %cluster.namespace,
                secret = %args.target.secret,
                ca = %describe(&report.ca_renewed),
                serving = %describe(&report.serving_renewed),
                ca_bundle = ?report.injection,
                secrets_written = report.secrets_written,
                "self-signed certificates in place"
            );
            Ok(())
        }
        Mode::Csr(args) => {
            args.target.log.init();
            let cluster = connect(&args.target).await?;
            let report = csr::run(&cluster, &args, Utc::now()).await?;
            tracing::info!(
                namespace = %cluster.namespace,
                secret = %args.target.secret,
                serving = %describe(&report.requested),
                request = report.request_name.as_deref().unwrap_or("-"),
                approved_by_us = report.approved_by_us,
                ca_bundle = ?report.injection,
                secret_written = report.secret_written,
                "serving certificate in place"
            );
            Ok(())
        }
    }
}

fn describe(reason: &Option<plan::Reason>) -> String {
    match reason {
        None => "kept".into(),
        Some(r) => format!("renewed: {r}"),
    }
}

async fn connect(target: &Target) -> anyhow::Result<Cluster> {
    let (client, namespace) =
        gpu_booking_process::kube_client::connect(target.namespace.as_deref()).await?;
    Ok(Cluster::new(client, namespace))
}
