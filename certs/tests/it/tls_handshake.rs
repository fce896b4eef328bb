//! Real TLS handshakes (tokio-rustls over loopback) with what the bootstrap stored:
//! the serving Secret loaded by the webhook's own TLS loader on one side, a client
//! that trusts exactly the caBundle of the webhook configuration (as the API server
//! does) on the other.

use crate::common;

use std::sync::Arc;

use chrono::Utc;
use common::*;
use gpu_booking_certs::{pki, self_signed};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves one TLS connection with the pair and says "ok".
async fn serve_once(cert_pem: String, key_pem: String) -> std::net::SocketAddr {
    let config = gpu_booking_webhook::tls::server_config(cert_pem.as_bytes(), key_pem.as_bytes())
        .expect("the webhook accepts the stored pair");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        if let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await {
            let _ = tls.write_all(b"ok").await;
            let _ = tls.shutdown().await;
        }
    });
    addr
}

/// Connects trusting only `bundle_pem`; the bytes read, or the handshake error.
async fn connect(
    addr: std::net::SocketAddr,
    bundle_pem: &str,
    name: &str,
) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(bundle_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    Ok(out)
}

fn service_name() -> String {
    format!("{SERVICE}.{NS}.svc")
}

#[tokio::test]
async fn the_api_server_view_trusts_the_webhook() {
    let (server, cluster) = fake_with_config();
    self_signed::run(&cluster, &self_signed(&[]), Utc::now())
        .await
        .unwrap();
    let bundle = ca_bundles(&server)[0].clone().unwrap();
    let (cert, key) = (
        secret_entry(&server, SECRET, "tls.crt"),
        secret_entry(&server, SECRET, "tls.key"),
    );

    for name in [service_name(), format!("{SERVICE}.{NS}.svc.cluster.local")] {
        let addr = serve_once(cert.clone(), key.clone()).await;
        assert_eq!(
            connect(addr, &bundle, &name).await,
            Ok(b"ok".to_vec()),
            "{name}"
        );
    }
    // A name the certificate does not carry, and a client that trusts another CA.
    let addr = serve_once(cert.clone(), key.clone()).await;
    let err = connect(addr, &bundle, "evil.example.org")
        .await
        .unwrap_err();
    assert!(
        err.contains("NotValidForName") || err.contains("not valid for name"),
        "{err}"
    );
    let other = pki::new_ca("other", Utc::now(), chrono::TimeDelta::days(1)).unwrap();
    let addr = serve_once(cert, key).await;
    let err = connect(addr, &other.cert_pem, &service_name())
        .await
        .unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.contains("invalid peer certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn during_a_ca_rotation_old_and_new_certificates_are_both_trusted() {
    let (server, cluster) = fake_with_config();
    let args = self_signed(&[
        "--ca-validity=400days",
        "--cert-validity=90days",
        "--renew-before=30days",
    ]);
    let now = Utc::now();
    self_signed::run(&cluster, &args, now).await.unwrap();
    let old = (
        secret_entry(&server, SECRET, "tls.crt"),
        secret_entry(&server, SECRET, "tls.key"),
    );
    // Rotation time: the certificates are issued with notBefore = that day, so the
    // handshake below checks trust at the real clock only for the old pair; the new
    // pair is checked by signature against the bundle.
    self_signed::run(&cluster, &args, now + days(285))
        .await
        .unwrap();
    let bundle = ca_bundles(&server)[0].clone().unwrap();
    assert_eq!(pki::parse_bundle(&bundle).unwrap().len(), 2);

    // A webhook replica that has not picked up the new Secret yet still works.
    let addr = serve_once(old.0, old.1).await;
    assert_eq!(
        connect(addr, &bundle, &service_name()).await,
        Ok(b"ok".to_vec())
    );
    let new_leaf = pki::parse_leaf(&secret_entry(&server, SECRET, "tls.crt")).unwrap();
    assert!(pki::chains_to(
        &[new_leaf],
        &pki::parse_bundle(&bundle).unwrap()
    ));
}

#[tokio::test]
async fn dev_certificates_handshake_too() {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let dev = pki::DevCerts::generate("dev CA", &names).unwrap();
    let dir = std::env::temp_dir().join(format!("gpu-booking-certs-dev-{}", std::process::id()));
    let paths = dev.write_to(&dir).unwrap();
    let cert = std::fs::read_to_string(&paths.cert).unwrap();
    let key = std::fs::read_to_string(&paths.key).unwrap();
    let ca = std::fs::read_to_string(&paths.ca).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&paths.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key is private");
    }
    for name in ["localhost", "127.0.0.1"] {
        let addr = serve_once(cert.clone(), key.clone()).await;
        assert_eq!(connect(addr, &ca, name).await, Ok(b"ok".to_vec()), "{name}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
