//! `gpu-booking certs csr` against the fake API server, with a test signer that
//! plays the cluster's signing controller (and, where the test says so, an approver).

use crate::common;

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_certs::cluster::Injection;
use gpu_booking_certs::plan::Reason;
use gpu_booking_certs::{csr, pki, Error};
use gpu_booking_fake_apiserver::{Failure, FakeApiServer, Verb};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use rcgen::{CertificateSigningRequestParams, Issuer, KeyPair};

/// A signer with its own CA; `signs` decides what it does with an approved request.
#[derive(Clone)]
struct Signer {
    ca: pki::Pair,
}

#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Issues once the request is approved.
    Sign,
    /// Approves (as an external approver would), then issues.
    ApproveAndSign,
    /// Denies the request.
    Deny,
    /// Issues a certificate from another CA.
    SignWithOtherCa,
}

impl Signer {
    fn new() -> Self {
        Self {
            ca: pki::new_ca("test signer CA", Utc::now(), TimeDelta::days(3650)).unwrap(),
        }
    }

    fn sign(ca: &pki::Pair, request_pem: &str) -> String {
        let mut params = CertificateSigningRequestParams::from_pem(request_pem).unwrap();
        // A signer decides the validity, here 90 days.
        let now = time::OffsetDateTime::now_utc();
        params.params.not_before = now - time::Duration::hours(1);
        params.params.not_after = now + time::Duration::days(90);
        let issuer =
            Issuer::from_ca_cert_pem(&ca.cert_pem, KeyPair::from_pem(&ca.key_pem).unwrap())
                .unwrap();
        params.signed_by(&issuer).unwrap().pem()
    }

    /// Serves requests for the signer name until the test ends.
    fn run(&self, server: &FakeApiServer, behaviour: Behaviour) {
        let server = server.clone();
        let ca = match behaviour {
            Behaviour::SignWithOtherCa => {
                pki::new_ca("other CA", Utc::now(), TimeDelta::days(10)).unwrap()
            }
            _ => self.ca.clone(),
        };
        tokio::spawn(async move {
            loop {
                let mut pending = None;
                server
                    .wait_until(|s| {
                        pending = s
                            .list::<CertificateSigningRequest>(None)
                            .into_iter()
                            .find(|c| {
                                c.status
                                    .as_ref()
                                    .and_then(|st| st.certificate.as_ref())
                                    .is_none()
                                    && !is_denied(c)
                            });
                        pending
                            .as_ref()
                            .is_some_and(|c| behaviour != Behaviour::Sign || is_approved(c))
                    })
                    .await;
                let Some(csr) = pending else { continue };
                let name = csr.metadata.name.clone().unwrap();
                assert_eq!(csr.spec.signer_name, "example.com/webhook-serving");
                assert!(csr
                    .spec
                    .usages
                    .clone()
                    .unwrap()
                    .contains(&"server auth".to_string()));
                let request = String::from_utf8(csr.spec.request.0.clone()).unwrap();
                server.modify::<CertificateSigningRequest>(None, &name, |v| match behaviour {
                    Behaviour::Deny => {
                        v["status"]["conditions"] = serde_json::json!([{"type": "Denied", "status": "True", "reason": "PolicyRefused", "message": "not for webhooks"}]);
                    }
                    _ => {
                        if behaviour == Behaviour::ApproveAndSign {
                            v["status"]["conditions"] = serde_json::json!([{"type": "Approved", "status": "True", "reason": "ExternalApprover"}]);
                        }
                        let cert = Signer::sign(&ca, &request);
                        v["status"]["certificate"] = serde_json::to_value(k8s_openapi::ByteString(cert.into_bytes())).unwrap();
                    }
                });
            }
        });
    }
}

fn is_approved(c: &CertificateSigningRequest) -> bool {
    c.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Approved")
}

fn is_denied(c: &CertificateSigningRequest) -> bool {
    c.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Denied")
}

fn args_for(signer: &Signer, extra: &[&str]) -> gpu_booking_certs::config::CsrArgs {
    let bundle = format!("--ca-bundle={}", signer.ca.cert_pem);
    let mut all = vec![bundle.as_str()];
    all.extend_from_slice(extra);
    csr(&all)
}

#[tokio::test]
async fn approves_waits_stores_and_injects() {
    let (server, cluster) = fake_with_config();
    let signer = Signer::new();
    signer.run(&server, Behaviour::Sign);
    let report = csr::run(&cluster, &args_for(&signer, &["--approve"]), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.requested, Some(Reason::Missing));
    assert!(report.approved_by_us);
    assert!(report.secret_written);
    assert_eq!(report.injection, Injection::Patched(1));
    let name = report.request_name.unwrap();
    assert!(name.starts_with(&format!("{SECRET}-")));

    let leaf = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(leaf.signed_by(&pki::parse_leaf(&signer.ca.cert_pem).unwrap()));
    assert!(pki::key_matches(
        &leaf,
        &secret_entry(&server, SECRET, "tls.key")
    ));
    assert_eq!(ca_bundles(&server), vec![Some(signer.ca.cert_pem.clone())]);
    assert!(
        server
            .get::<CertificateSigningRequest>(None, &name)
            .is_none(),
        "the request is deleted once used"
    );
    // The approval went to the approval subresource.
    let approval = server
        .requests()
        .into_iter()
        .find(|r| r.subresource.as_deref() == Some("approval"))
        .unwrap();
    assert_eq!(approval.verb, Verb::Patch);

    // Idempotent: a valid stored certificate means no new request.
    let creates = server.count(Verb::Create, "certificatesigningrequests");
    let report = csr::run(&cluster, &args_for(&signer, &["--approve"]), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.requested, None);
    assert!(!report.secret_written);
    assert_eq!(report.injection, Injection::Unchanged);
    assert_eq!(
        server.count(Verb::Create, "certificatesigningrequests"),
        creates
    );

    // Inside the renewal margin (30 days before the end) it is requested again.
    let later = Utc::now() + TimeDelta::days(70);
    let report = csr::run(&cluster, &args_for(&signer, &["--approve"]), later).await;
    assert!(matches!(report, Ok(r) if matches!(r.requested, Some(Reason::Expiring { .. }))));
}

#[tokio::test]
async fn without_the_right_to_approve_it_waits_for_an_approver() {
    let (server, cluster) = fake_with_config();
    let signer = Signer::new();
    server.fail(
        Failure::on(Verb::Patch, "certificatesigningrequests")
            .code(403)
            .always(),
    );
    signer.run(&server, Behaviour::ApproveAndSign);
    let report = csr::run(&cluster, &args_for(&signer, &["--approve"]), Utc::now())
        .await
        .unwrap();
    assert!(!report.approved_by_us);
    assert!(report.secret_written);
}

#[tokio::test]
async fn a_denied_request_is_an_error_and_nothing_is_stored() {
    let (server, cluster) = fake_with_config();
    let signer = Signer::new();
    signer.run(&server, Behaviour::Deny);
    let err = csr::run(&cluster, &args_for(&signer, &[]), Utc::now())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Denied (PolicyRefused)"), "{err}");
    assert!(server
        .get::<k8s_openapi::api::core::v1::Secret>(Some(NS), SECRET)
        .is_none());
    assert!(server.list::<CertificateSigningRequest>(None).is_empty());
}

#[tokio::test]
async fn a_certificate_the_bundle_does_not_trust_is_refused() {
    let (server, cluster) = fake_with_config();
    let signer = Signer::new();
    signer.run(&server, Behaviour::SignWithOtherCa);
    let err = csr::run(&cluster, &args_for(&signer, &["--approve"]), Utc::now())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not signed by the CA bundle"),
        "{err}"
    );
    assert!(server
        .get::<k8s_openapi::api::core::v1::Secret>(Some(NS), SECRET)
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn no_signer_times_out() {
    let (server, cluster) = fake_with_config();
    let signer = Signer::new();
    let err = csr::run(
        &cluster,
        &args_for(&signer, &["--approve", "--wait-timeout=2m"]),
        Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        server.list::<CertificateSigningRequest>(None).is_empty(),
        "cleaned up"
    );
}

#[tokio::test]
async fn a_missing_or_bad_ca_bundle_is_a_configuration_error() {
    let (_server, cluster) = fake_with_config();
    let err = csr::run(&cluster, &csr(&[]), Utc::now()).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = csr::run(
        &cluster,
        &csr(&["--ca-bundle=not a certificate"]),
        Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("CA bundle"), "{err}");
    let err = csr::run(
        &cluster,
        &csr(&["--ca-bundle-file=/nonexistent/ca.crt"]),
        Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
}
