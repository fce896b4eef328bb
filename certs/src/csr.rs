//! `gpu-booking certs csr`: a serving certificate from a Kubernetes signer.
//!
//! When the stored certificate is missing, unusable or due for renewal, a new key is
//! made here and a `certificates.k8s.io/v1` CertificateSigningRequest names the
//! signer; with `--approve` we approve it ourselves (a 403 means RBAC leaves that to
//! someone else, and we wait), then wait for `status.certificate`, check that it is the
//! pair of our key, names the Service and chains to the CA bundle, and store it. The
//! request is deleted afterwards either way: its key never left this process, so a
//! request that outlives the run is of no use to anyone.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;

use crate::cluster::{Cluster, Injection, CA_CRT, MANAGER, TLS_CRT, TLS_KEY};
use crate::config::CsrArgs;
use crate::error::Error;
use crate::pki::{self, CertInfo, Pair};
use crate::plan::Reason;
use crate::{inject, retry_on_conflict};

/// What one run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Why a certificate was requested (None: the stored one was kept).
    pub requested: Option<Reason>,
    /// The request's name, when one was made.
    pub request_name: Option<String>,
    /// Whether we approved it (false: someone else did, or it was not needed).
    pub approved_by_us: bool,
    pub injection: Injection,
    pub secret_written: bool,
}

pub async fn run(cluster: &Cluster, args: &CsrArgs, now: DateTime<Utc>) -> Result<Report, Error> {
    let bundle_pem = ca_bundle(args)?;
    let bundle =
        pki::parse_bundle(&bundle_pem).map_err(|e| Error::Config(format!("the CA bundle: {e}")))?;
    let names = args.target.names(&cluster.namespace);
    let stored = cluster.read_secret(&args.target.secret).await?;
    let check = match stored.pair() {
        Some(pair) => check(&pair, &bundle, &names, now, args),
        None => Err(Reason::Missing),
    };
    let (pair, requested, request_name, approved_by_us) = match (check, stored.pair()) {
        (Ok(()), Some(pair)) => (pair, None, None, false),
        (reason, _) => {
            let reason = reason.err().unwrap_or(Reason::Missing);
            tracing::info!(secret = %args.target.secret, %reason, signer = %args.signer_name, "requesting a serving certificate");
            let (pair, name, approved) = request(cluster, args, &names, &bundle).await?;
            (pair, Some(reason), Some(name), approved)
        }
    };
    let data = BTreeMap::from([
        (TLS_CRT.to_owned(), pair.cert_pem.clone()),
        (TLS_KEY.to_owned(), pair.key_pem.clone()),
        (CA_CRT.to_owned(), bundle_pem.clone()),
    ]);
    let (injection, secret_written) = retry_on_conflict(|| async {
        let injection = inject(cluster, &args.target, &bundle_pem).await?;
        let current = cluster.read_secret(&args.target.secret).await?;
        let written = cluster
            .write_secret(&args.target.secret, &current, data.clone())
            .await?;
        Ok((injection, written))
    })
    .await?;
    Ok(Report {
        requested,
        request_name,
        approved_by_us,
        injection,
        secret_written,
    })
}

/// The signer's CA bundle: given inline, or read from a file.
fn ca_bundle(args: &CsrArgs) -> Result<String, Error> {
    match (&args.ca_bundle, &args.ca_bundle_file) {
        (Some(pem), _) => Ok(pem.clone()),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading the CA bundle {}: {e}", path.display()))),
        (None, None) => Err(Error::Config(
            "give the signer's CA as --ca-bundle or --ca-bundle-file".into(),
        )),
    }
}

fn check(
    pair: &Pair,
    bundle: &[CertInfo],
    names: &[String],
    now: DateTime<Utc>,
    args: &CsrArgs,
) -> Result<(), Reason> {
    let chain = pki::parse_bundle(&pair.cert_pem).map_err(|e| Reason::Unreadable(e.to_string()))?;
    let leaf = &chain[0];
    if !pki::key_matches(leaf, &pair.key_pem) {
        return Err(Reason::KeyMismatch);
    }
    if !pki::chains_to(&chain, bundle) {
        return Err(Reason::OtherIssuer);
    }
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !leaf.covers(std::slice::from_ref(n)))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(Reason::MissingNames(missing));
    }
    if leaf.remaining(now) < args.target.renew_before {
        return Err(Reason::Expiring {
            not_after: leaf.not_after,
        });
    }
    Ok(())
}

/// Submits, approves if asked, waits, checks; deletes the request in every case.
async fn request(
    cluster: &Cluster,
    args: &CsrArgs,
    names: &[String],
    bundle: &[CertInfo],
) -> Result<(Pair, String, bool), Error> {
    let api: Api<CertificateSigningRequest> = Api::all(cluster.client.clone());
    let (csr_pem, key_pem) = pki::serving_request(names)?;
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: args.signer_name.clone(),
            expiration_seconds: args.expiration_seconds,
            usages: Some(vec![
                "digital signature".into(),
                "key encipherment".into(),
                "server auth".into(),
            ]),
            ..CertificateSigningRequestSpec::default()
        },
        ..CertificateSigningRequest::default()
    };
    csr.metadata.generate_name = Some(format!("{}-", args.target.secret));
    csr.metadata.labels = Some(BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            MANAGER.to_owned(),
        ),
        (
            "gpu-booking.io/namespace".to_owned(),
            cluster.namespace.clone(),
        ),
    ]));
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    let created = api.create(&pp, &csr).await?;
    let name = created
        .metadata
        .name
        .ok_or_else(|| Error::Internal("the created request has no name".into()))?;
    let result = approve_and_wait(&api, &name, args).await;
    if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
        tracing::warn!(request = %name, error = %e, "could not delete the CertificateSigningRequest");
    }
    let (chain_pem, approved) = result?;
    let chain = pki::parse_bundle(&chain_pem)
        .map_err(|e| Error::Csr(format!("{name}: the issued certificate: {e}")))?;
    let leaf = &chain[0];
    if !pki::key_matches(leaf, &key_pem) {
        return Err(Error::Csr(format!(
            "{name}: the issued certificate is not for our key"
        )));
    }
    if !leaf.covers(names) {
        return Err(Error::Csr(format!(
            "{name}: signer {} left out some of {} (it has {:?})",
            args.signer_name,
            names.join(", "),
            leaf.dns_names
        )));
    }
    if !pki::chains_to(&chain, bundle) {
        return Err(Error::Csr(format!(
            "{name}: the certificate from signer {} is not signed by the CA bundle; give the signer's CA (tls.csr.caBundle)",
            args.signer_name
        )));
    }
    Ok((
        Pair {
            cert_pem: chain_pem,
            key_pem,
        },
        name,
        approved,
    ))
}

async fn approve_and_wait(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    args: &CsrArgs,
) -> Result<(String, bool), Error> {
    let mut approved = false;
    if args.approve {
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Approved",
            "status": "True",
            "reason": "GpuBookingCerts",
            "message": "serving certificate of the gpu-booking admission webhook",
        }]}});
        let pp = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..PatchParams::default()
        };
        match api.patch_approval(name, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => approved = true,
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::warn!(request = %name, "not allowed to approve (RBAC); waiting for an approver");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let wait = async {
        loop {
            if let Some(cert) = issued(api, name).await? {
                return Ok::<_, Error>(cert);
            }
            tokio::time::sleep(args.poll_interval).await;
        }
    };
    match tokio::time::timeout(args.wait_timeout, wait).await {
        Ok(cert) => Ok((cert?, approved)),
        Err(_) => Err(Error::Timeout {
            signer: args.signer_name.clone(),
            waited: args.wait_timeout,
        }),
    }
}

/// The certificate once issued; an error once denied or failed.
async fn issued(api: &Api<CertificateSigningRequest>, name: &str) -> Result<Option<String>, Error> {
    let csr = api.get(name).await?;
    let status = csr.status.unwrap_or_default();
    for c in status.conditions.iter().flatten() {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
            return Err(Error::Csr(format!(
                "{name}: {} ({}): {}",
                c.type_,
                c.reason.as_deref().unwrap_or("no reason"),
                c.message.as_deref().unwrap_or("")
            )));
        }
    }
    match status.certificate {
        Some(cert) if !cert.0.is_empty() => String::from_utf8(cert.0)
            .map(Some)
            .map_err(|_| Error::Csr(format!("{name}: the certificate is not PEM"))),
        _ => Ok(None),
    }
}
