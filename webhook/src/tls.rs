//! The serving certificate, re-read when its files change.
//!
//! Kubernetes updates a mounted Secret by writing a new timestamped directory and
//! swapping the `..data` symlink, so watching the files for writes sees nothing. Here
//! each new connection `stat`s both paths (following the symlinks); when the file
//! behind either changed (device, inode, size or mtime), both are read and parsed, and
//! the next handshake uses the new pair. A half-rotated pair (a key that does not match
//! the certificate yet) is refused and the old pair kept until the next connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

use crate::metrics::Metrics;

use gpu_booking_client::FileVersion;

struct Loaded {
    versions: (FileVersion, FileVersion),
    pem: (Vec<u8>, Vec<u8>),
    config: Arc<ServerConfig>,
}

/// The current TLS configuration of the webhook, kept in step with the files.
pub struct CertStore {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
    metrics: Arc<Metrics>,
}

impl CertStore {
    /// Loads the pair; fails if it cannot be read or does not match.
    pub fn load(cert: PathBuf, key: PathBuf, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let version = |path: &Path| {
            FileVersion::of(path).with_context(|| format!("reading {}", path.display()))
        };
        let versions = (version(&cert)?, version(&key)?);
        let pem = read_pair(&cert, &key)?;
        let config = server_config(&pem.0, &pem.1)
            .with_context(|| format!("loading {} and {}", cert.display(), key.display()))?;
        Metrics::outcome(&metrics.tls_reloads, "ok");
        metrics.tls_not_after.set(not_after(&pem.0).unwrap_or(0));
        Ok(Self {
            cert,
            key,
            loaded: Mutex::new(Loaded {
                versions,
                pem,
                config,
            }),
            metrics,
        })
    }

    /// The configuration for a new connection, reloaded first if the files changed.
    pub fn current(&self) -> Arc<ServerConfig> {
        let versions =
            FileVersion::of(&self.cert).and_then(|c| Ok((c, FileVersion::of(&self.key)?)));
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(versions) = versions else {
            // Mid-swap or gone: keep serving what we have.
            return loaded.config.clone();
        };
        if versions == loaded.versions {
            return loaded.config.clone();
        }
        match read_pair(&self.cert, &self.key) {
            Ok(pem) if pem == loaded.pem => loaded.versions = versions,
            Ok(pem) => match server_config(&pem.0, &pem.1) {
                Ok(config) => {
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                    Metrics::outcome(&self.metrics.tls_reloads, "ok");
                    self.metrics
                        .tls_not_after
                        .set(not_after(&pem.0).unwrap_or(0));
                    *loaded = Loaded {
                        versions,
                        pem,
                        config,
                    };
                }
                Err(e) => {
                    // Not recorded as seen: the next connection tries again.
                    tracing::warn!(error = %e, "new certificate files refused; keeping the old ones");
                    Metrics::outcome(&self.metrics.tls_reloads, "error");
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "certificate files unreadable; keeping the old ones");
                Metrics::outcome(&self.metrics.tls_reloads, "error");
            }
        }
        loaded.config.clone()
    }
}

fn read_pair(cert: &Path, key: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let c = std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
    let k = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    Ok((c, k))
}

/// When the first certificate of a PEM chain (the leaf) expires, in Unix seconds.
pub fn not_after(cert_pem: &[u8]) -> Option<i64> {
    use rustls::pki_types::pem::PemObject;
    let leaf = CertificateDer::pem_slice_iter(cert_pem).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// A rustls server configuration (ring provider, TLS 1.2 and 1.3, ALPN h2 and
/// http/1.1) from a PEM certificate chain and key, refusing a key that does not match.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> anyhow::Result<Arc<ServerConfig>> {
    use rustls::pki_types::pem::{self, PemObject};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .context("parsing the certificate PEM")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the certificate file");
    let key: PrivateKeyDer<'static> = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => anyhow::bail!("no private key in the key file"),
        Err(e) => return Err(anyhow::anyhow!(e).context("parsing the key PEM")),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key do not form a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_certificate_expiry_is_exported() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["webhook.test".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 17);
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile_dir();
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let metrics = Arc::new(Metrics::new());
        CertStore::load(cert_path, key_path, metrics.clone()).unwrap();
        // 2031-05-17T00:00:00Z
        assert_eq!(metrics.tls_not_after.get(), 1_936_742_400);
        assert!(metrics
            .encode()
            .contains("gpu_booking_webhook_tls_certificate_expiry_timestamp_seconds 1936742400"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let dir = tempfile_dir();
        let missing = dir.join("absent.crt");
        let err = CertStore::load(
            missing.clone(),
            dir.join("absent.key"),
            Arc::new(Metrics::new()),
        )
        .err()
        .expect("no certificate file");
        assert!(
            format!("{err:#}").contains(&missing.display().to_string()),
            "{err:#}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpu-booking-webhook-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
