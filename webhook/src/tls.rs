//! The serving certificate, re-read when its files change; and, with `--client-ca`,
//! the client certificate the API server must present.
//!
//! Kubernetes updates a mounted Secret by writing a new timestamped directory and
//! swapping the `..data` symlink, so watching the files for writes sees nothing. Here
//! each new connection `stat`s the paths (following the symlinks); when the file
//! behind any changed (device, inode, size or mtime), all are read and parsed, and
//! the next handshake uses the new set. A half-rotated pair (a key that does not match
//! the certificate yet) is refused and the old set kept until the next connection.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

use crate::metrics::Metrics;

use gpu_booking_client::FileVersion;

struct Loaded {
    versions: Vec<FileVersion>,
    pem: Vec<Vec<u8>>,
    config: Arc<ServerConfig>,
}

/// Which clients the port serves: any, or those whose certificate `ca` signed (and,
/// when `names` is not empty, that carry one of them).
#[derive(Debug, Clone, Default)]
pub struct ClientAuth {
    pub ca: Option<PathBuf>,
    pub names: Vec<String>,
}

/// The current TLS configuration of the webhook, kept in step with the files.
pub struct CertStore {
    /// The certificate, the key, and the client CA when there is one.
    files: Vec<PathBuf>,
    client_names: Vec<String>,
    loaded: Mutex<Loaded>,
    metrics: Arc<Metrics>,
}

impl CertStore {
    /// Loads the pair; fails if it cannot be read or does not match.
    pub fn load(cert: PathBuf, key: PathBuf, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        Self::load_with(cert, key, ClientAuth::default(), metrics)
    }

    /// Loads the pair and the client CA of `client`; fails if any cannot be read,
    /// the pair does not match, or the CA holds no certificate.
    pub fn load_with(
        cert: PathBuf,
        key: PathBuf,
        client: ClientAuth,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            client.ca.is_some() || client.names.is_empty(),
            "--client-name needs --client-ca"
        );
        let files: Vec<PathBuf> = [Some(cert), Some(key), client.ca]
            .into_iter()
            .flatten()
            .collect();
        let versions = versions(&files)?;
        let pem = read_all(&files)?;
        let config = config_of(&pem).with_context(|| {
            let names: Vec<_> = files.iter().map(|f| f.display().to_string()).collect();
            format!("loading {}", names.join(", "))
        })?;
        Metrics::outcome(&metrics.tls_reloads, "ok");
        metrics.tls_not_after.set(not_after(&pem[0]).unwrap_or(0));
        Ok(Self {
            files,
            client_names: client.names,
            loaded: Mutex::new(Loaded {
                versions,
                pem,
                config,
            }),
            metrics,
        })
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificate(&self) -> bool {
        self.files.len() > 2
    }

    /// Whether the certificates a client presented (the leaf first) carry a name of
    /// `--client-name` (any do when none is given). The CA's signature was checked
    /// in the handshake.
    pub fn client_allowed(&self, presented: Option<&[CertificateDer<'_>]>) -> bool {
        if !self.requires_client_certificate() {
            return true;
        }
        let Some(leaf) = presented.and_then(<[_]>::first) else {
            return false;
        };
        self.client_names.is_empty() || names_of(leaf).iter().any(|n| self.client_names.contains(n))
    }

    /// A client refused at the handshake (counted).
    pub fn client_refused(&self) {
        self.metrics.client_certificates_refused.inc();
    }

    /// The configuration for a new connection, reloaded first if the files changed.
    pub fn current(&self) -> Arc<ServerConfig> {
        let versions = versions(&self.files);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(versions) = versions else {
            // Mid-swap or gone: keep serving what we have.
            return loaded.config.clone();
        };
        if versions == loaded.versions {
            return loaded.config.clone();
        }
        match read_all(&self.files) {
            Ok(pem) if pem == loaded.pem => loaded.versions = versions,
            Ok(pem) => match config_of(&pem) {
                Ok(config) => {
                    tracing::info!(cert = %self.files[0].display(), "serving certificate reloaded");
                    Metrics::outcome(&self.metrics.tls_reloads, "ok");
                    self.metrics
                        .tls_not_after
                        .set(not_after(&pem[0]).unwrap_or(0));
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

fn versions(files: &[PathBuf]) -> anyhow::Result<Vec<FileVersion>> {
    files
        .iter()
        .map(|path| FileVersion::of(path).with_context(|| format!("reading {}", path.display())))
        .collect()
}

fn read_all(files: &[PathBuf]) -> anyhow::Result<Vec<Vec<u8>>> {
    files
        .iter()
        .map(|path| std::fs::read(path).with_context(|| format!("reading {}", path.display())))
        .collect()
}

/// The configuration of the files' contents: certificate, key, client CA if any.
fn config_of(pem: &[Vec<u8>]) -> anyhow::Result<Arc<ServerConfig>> {
    server_config_for(&pem[0], &pem[1], pem.get(2).map(Vec::as_slice))
}

/// The subject's common names and the DNS names of a certificate.
fn names_of(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push((*dns).to_owned());
            }
        }
    }
    names
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
    server_config_for(cert_pem, key_pem, None)
}

/// [`server_config`] that, given the PEM of a client CA, requires every client to
/// present a certificate it signed.
pub fn server_config_for(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> anyhow::Result<Arc<ServerConfig>> {
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
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(ca_pem) {
                roots
                    .add(ca.context("parsing the client CA PEM")?)
                    .context("a client CA certificate is not usable")?;
            }
            anyhow::ensure!(!roots.is_empty(), "no certificate in the client CA file");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .context("building the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
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
