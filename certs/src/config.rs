//! Options of `gpu-booking certs`; `--help` is the documentation. Every option also
//! reads an environment variable (`GPU_BOOKING_CERTS_*`), which is how the chart's jobs
//! set them.

use std::path::PathBuf;
use std::time::Duration;

use chrono::TimeDelta;
use clap::{Args, Subcommand};

use crate::plan::Policy;

#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Mode {
    /// Keep a CA of our own and a serving certificate it signs in Secrets, and the CA
    /// in the webhook configuration's caBundle; renew what is due, nothing else.
    SelfSigned(SelfSignedArgs),
    /// Get the serving certificate from a certificates.k8s.io/v1 signer (a
    /// CertificateSigningRequest), store it, and inject the signer's CA.
    Csr(CsrArgs),
    /// Write a CA and a serving certificate to a folder, for local use (no cluster).
    Dev(DevArgs),
}

use gpu_booking_process::LogArgs;
pub use gpu_booking_process::LogFormat;

/// Where the certificate goes and whom it names.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// Namespace of the webhook Service and the Secrets (default: the pod's own, from
    /// the service account, or the kubeconfig's).
    #[arg(long, env = "GPU_BOOKING_CERTS_NAMESPACE")]
    pub namespace: Option<String>,

    /// Name of the webhook's Service; the certificate names
    /// `<service>`, `<service>.<ns>`, `<service>.<ns>.svc` and
    /// `<service>.<ns>.svc.<cluster domain>`.
    #[arg(long, env = "GPU_BOOKING_CERTS_SERVICE")]
    pub service: String,

    /// Secret of the serving certificate (`tls.crt`, `tls.key`, `ca.crt`). In
    /// self-signed mode the CA is kept in `<secret>-ca`.
    #[arg(long, env = "GPU_BOOKING_CERTS_SECRET")]
    pub secret: String,

    /// MutatingWebhookConfiguration whose webhooks get the CA as caBundle.
    #[arg(long, env = "GPU_BOOKING_CERTS_WEBHOOK_CONFIG")]
    pub webhook_config: String,

    /// Succeed when the webhook configuration does not exist yet (the run before
    /// `helm install` creates it; the run after patches it).
    #[arg(long, env = "GPU_BOOKING_CERTS_SKIP_MISSING_WEBHOOK_CONFIG")]
    pub skip_missing_webhook_config: bool,

    /// Cluster DNS domain.
    #[arg(
        long,
        env = "GPU_BOOKING_CERTS_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,

    /// More names for the certificate (DNS names or IP addresses); repeat or separate
    /// with commas.
    #[arg(long, env = "GPU_BOOKING_CERTS_DNS_NAME", value_delimiter = ',')]
    pub dns_name: Vec<String>,

    /// Renew a certificate this long before it expires.
    #[arg(long, env = "GPU_BOOKING_CERTS_RENEW_BEFORE", default_value = "30days", value_parser = parse_time_delta)]
    pub renew_before: TimeDelta,

    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

impl Target {
    /// Every name the serving certificate must carry, in a stable order.
    pub fn names(&self, namespace: &str) -> Vec<String> {
        let svc = &self.service;
        let mut names = vec![
            svc.clone(),
            format!("{svc}.{namespace}"),
            format!("{svc}.{namespace}.svc"),
            format!("{svc}.{namespace}.svc.{}", self.cluster_domain),
        ];
        for extra in &self.dns_name {
            let extra = extra.trim();
            if !extra.is_empty() && !names.iter().any(|n| n == extra) {
                names.push(extra.to_owned());
            }
        }
        names
    }

    /// The Secret that keeps the self-signed CA.
    pub fn ca_secret(&self) -> String {
        format!("{}-ca", self.secret)
    }
}

#[derive(Debug, Clone, Args)]
pub struct SelfSignedArgs {
    #[command(flatten)]
    pub target: Target,

    /// Lifetime of a new CA.
    #[arg(long, env = "GPU_BOOKING_CERTS_CA_VALIDITY", default_value = "3650days", value_parser = parse_time_delta)]
    pub ca_validity: TimeDelta,

    /// Lifetime of a new serving certificate.
    #[arg(long, env = "GPU_BOOKING_CERTS_CERT_VALIDITY", default_value = "365days", value_parser = parse_time_delta)]
    pub cert_validity: TimeDelta,
}

impl SelfSignedArgs {
    pub fn policy(&self) -> Policy {
        Policy {
            ca_validity: self.ca_validity,
            cert_validity: self.cert_validity,
            renew_before: self.target.renew_before,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CsrArgs {
    #[command(flatten)]
    pub target: Target,

    /// Signer of the CertificateSigningRequest, e.g. example.com/webhook-serving.
    #[arg(long, env = "GPU_BOOKING_CERTS_SIGNER_NAME")]
    pub signer_name: String,

    /// Approve the request ourselves (needs `approve` on the signer); without it, or
    /// when RBAC refuses, an external approver must.
    #[arg(long, env = "GPU_BOOKING_CERTS_APPROVE")]
    pub approve: bool,

    /// PEM CA bundle of the signer, injected as caBundle.
    #[arg(
        long,
        env = "GPU_BOOKING_CERTS_CA_BUNDLE",
        conflicts_with = "ca_bundle_file"
    )]
    pub ca_bundle: Option<String>,

    /// File holding the signer's PEM CA bundle (e.g. the cluster CA at
    /// /var/run/secrets/kubernetes.io/serviceaccount/ca.crt).
    #[arg(long, env = "GPU_BOOKING_CERTS_CA_BUNDLE_FILE")]
    pub ca_bundle_file: Option<PathBuf>,

    /// Requested lifetime in seconds (`spec.expirationSeconds`, 600 at least); the
    /// signer may shorten it.
    #[arg(long, env = "GPU_BOOKING_CERTS_EXPIRATION_SECONDS", value_parser = clap::value_parser!(i32).range(600..))]
    pub expiration_seconds: Option<i32>,

    /// Longest wait for the signer.
    #[arg(long, env = "GPU_BOOKING_CERTS_WAIT_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub wait_timeout: Duration,

    /// Time between two looks at the request while waiting.
    #[arg(long, env = "GPU_BOOKING_CERTS_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Folder for ca.crt, tls.crt and tls.key.
    #[arg(long, env = "GPU_BOOKING_CERTS_OUT_DIR")]
    pub out_dir: PathBuf,

    /// Names of the serving certificate (DNS names or IP addresses).
    #[arg(
        long,
        env = "GPU_BOOKING_CERTS_DNS_NAME",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1"
    )]
    pub name: Vec<String>,
}

/// The one duration parser of every component: humantime or bare seconds, range-guarded
/// (see `gpu_booking_process::duration`).
pub use gpu_booking_process::duration::parse_duration;

pub(crate) fn parse_time_delta(s: &str) -> Result<TimeDelta, String> {
    let d = parse_duration(s)?;
    let d = TimeDelta::from_std(d).map_err(|e| format!("{s:?}: {e}"))?;
    if d <= TimeDelta::zero() {
        return Err(format!("{s:?}: must be longer than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CertsArgs,
    }

    fn parse(args: &[&str]) -> Result<Mode, clap::Error> {
        Cli::try_parse_from(std::iter::once("certs").chain(args.iter().copied()))
            .map(|c| c.args.mode)
    }

    const TARGET: [&str; 3] = ["--service=wh", "--secret=wh-tls", "--webhook-config=wh"];

    #[test]
    fn self_signed_defaults() {
        let Ok(Mode::SelfSigned(a)) = parse(&[&["self-signed"][..], &TARGET].concat()) else {
            panic!("self-signed did not parse");
        };
        assert!(a.policy().validate().is_ok());
        assert_eq!(a.ca_validity, TimeDelta::days(3650));
        assert_eq!(a.target.renew_before, TimeDelta::days(30));
        assert!(!a.target.skip_missing_webhook_config);
        assert_eq!(
            a.target.names("gpu"),
            ["wh", "wh.gpu", "wh.gpu.svc", "wh.gpu.svc.cluster.local"]
        );
        assert_eq!(a.target.ca_secret(), "wh-tls-ca");
    }

    #[test]
    fn extra_names_are_added_once() {
        let Ok(Mode::SelfSigned(a)) = parse(
            &[
                &[
                    "self-signed",
                    "--dns-name=wh.gpu,hook.example.org, ,hook.example.org",
                ][..],
                &TARGET,
            ]
            .concat(),
        ) else {
            panic!("did not parse");
        };
        assert_eq!(a.target.names("gpu").len(), 5);
    }

    #[test]
    fn csr_options() {
        let Ok(Mode::Csr(a)) = parse(
            &[
                &[
                    "csr",
                    "--signer-name=example.com/x",
                    "--approve",
                    "--expiration-seconds=3600",
                    "--wait-timeout=30s",
                ][..],
                &TARGET,
            ]
            .concat(),
        ) else {
            panic!("csr did not parse");
        };
        assert!(a.approve);
        assert_eq!(a.expiration_seconds, Some(3600));
        assert_eq!(a.wait_timeout, Duration::from_secs(30));
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["self-signed", "--renew-before=soon"][..],
            &["self-signed", "--renew-before=0s"],
            &["csr", "--expiration-seconds=60"],
            &["csr", "--ca-bundle=x", "--ca-bundle-file=y"],
        ] {
            let mut args = bad.to_vec();
            args.extend(TARGET);
            if bad[0] == "csr" {
                args.push("--signer-name=example.com/x");
            }
            assert!(parse(&args).is_err(), "{bad:?}");
        }
        assert!(
            parse(&["self-signed", "--service=wh"]).is_err(),
            "secret and config are required"
        );
    }
}
