//! Certificates without I/O: a CA, serving certificates it signs, certificate requests,
//! and reading back what a stored certificate says (validity, names, issuer, key).
//!
//! Keys are ECDSA P-256 (rcgen's default), which every supported Kubernetes API
//! server accepts for webhook serving certificates.

use std::net::IpAddr;

use chrono::{DateTime, TimeDelta, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

/// Backdating of `notBefore`, so that a node whose clock runs a little behind
/// accepts a certificate issued a moment ago.
const BACKDATE: TimeDelta = TimeDelta::minutes(5);

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("no certificate in the PEM data")]
    NoCertificate,
    #[error("unreadable certificate: {0}")]
    Parse(String),
    #[error("time out of range: {0}")]
    Time(String),
    #[error("{0:?} is neither a DNS name nor an IP address")]
    BadName(String),
}

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Pair {
    // Never print a private key, not even in a test failure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a certificate says about itself, as far as renewal decisions need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub subject: String,
    pub issuer: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub is_ca: bool,
    /// The raw subject public key (compared with a private key's public half).
    pub public_key: Vec<u8>,
    pub der: Vec<u8>,
}

impl CertInfo {
    /// Whether every name (DNS or IP) is among the certificate's subject alternative names.
    pub fn covers(&self, names: &[String]) -> bool {
        names.iter().all(|n| match n.parse::<IpAddr>() {
            Ok(ip) => self.ip_addresses.contains(&ip),
            Err(_) => self.dns_names.iter().any(|d| d.eq_ignore_ascii_case(n)),
        })
    }

    /// Time left before `notAfter` (negative once expired).
    pub fn remaining(&self, now: DateTime<Utc>) -> TimeDelta {
        self.not_after - now
    }

    /// Whether `self` carries a valid signature by `issuer`'s key.
    pub fn signed_by(&self, issuer: &CertInfo) -> bool {
        let (Ok((_, leaf)), Ok((_, ca))) = (
            x509_parser::parse_x509_certificate(&self.der),
            x509_parser::parse_x509_certificate(&issuer.der),
        ) else {
            return false;
        };
        leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok()
    }
}

/// Every certificate in a PEM bundle, in order; fails on a bundle with none.
pub fn parse_bundle(pem: &str) -> Result<Vec<CertInfo>, PkiError> {
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| PkiError::Parse(e.to_string()))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        out.push(info_of_der(&block.contents)?);
    }
    if out.is_empty() {
        return Err(PkiError::NoCertificate);
    }
    Ok(out)
}

/// The first certificate of a PEM chain (the leaf).
pub fn parse_leaf(pem: &str) -> Result<CertInfo, PkiError> {
    parse_bundle(pem)?
        .into_iter()
        .next()
        .ok_or(PkiError::NoCertificate)
}

fn info_of_der(der: &[u8]) -> Result<CertInfo, PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::Parse(e.to_string()))?;
    let (dns_names, ip_addresses) = alt_names(&cert);
    let time = |t: x509_parser::time::ASN1Time| {
        DateTime::from_timestamp(t.timestamp(), 0)
            .ok_or_else(|| PkiError::Time(t.timestamp().to_string()))
    };
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_before: time(cert.validity().not_before)?,
        not_after: time(cert.validity().not_after)?,
        dns_names,
        ip_addresses,
        is_ca: cert.is_ca(),
        public_key: cert.public_key().subject_public_key.data.to_vec(),
        der: der.to_vec(),
    })
}

fn alt_names(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                GeneralName::IPAddress(raw) => match raw.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap_or_default())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap_or_default())),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    (dns, ips)
}

/// Whether a chain (leaf first, then intermediates) leads to a CA of `bundle`: the
/// leaf is signed by a bundle CA, or by an intermediate of the chain that is.
pub fn chains_to(chain: &[CertInfo], bundle: &[CertInfo]) -> bool {
    let Some(leaf) = chain.first() else {
        return false;
    };
    let by_bundle = |c: &CertInfo| bundle.iter().any(|ca| c.signed_by(ca));
    by_bundle(leaf) || chain[1..].iter().any(|i| leaf.signed_by(i) && by_bundle(i))
}

/// Whether `key_pem` is the private key of the certificate `cert`.
pub fn key_matches(cert: &CertInfo, key_pem: &str) -> bool {
    KeyPair::from_pem(key_pem)
        .map(|k| k.public_key_raw() == cert.public_key.as_slice())
        .unwrap_or(false)
}

fn offset(t: DateTime<Utc>) -> Result<time::OffsetDateTime, PkiError> {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .map_err(|e| PkiError::Time(e.to_string()))
}

/// A new self-signed CA that may sign serving certificates only (path length 0).
pub fn new_ca(
    common_name: &str,
    now: DateTime<Utc>,
    validity: TimeDelta,
) -> Result<Pair, PkiError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = offset(now - BACKDATE)?;
    params.not_after = offset(now + validity)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A host name as RFC 1123 allows it: dot-separated labels of letters, digits and
/// inner hyphens, 63 bytes a label, 253 in all.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn serving_params(names: &[String]) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) if is_dns_name(name) => SanType::DnsName(
                name.clone()
                    .try_into()
                    .map_err(|_| PkiError::BadName(name.clone()))?,
            ),
            Err(_) => return Err(PkiError::BadName(name.clone())),
        };
        params.subject_alt_names.push(san);
    }
    if let Some(first) = names.first() {
        params.distinguished_name.push(DnType::CommonName, first);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// A serving certificate for `names` (DNS names or IP addresses) signed by `ca`. It
/// never outlives the CA: `notAfter` is the earlier of `now + validity` and the CA's.
pub fn issue_serving(
    ca: &Pair,
    names: &[String],
    now: DateTime<Utc>,
    validity: TimeDelta,
) -> Result<Pair, PkiError> {
    let ca_info = parse_leaf(&ca.cert_pem)?;
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let mut params = serving_params(names)?;
    // Lets clients pick the right CA while two are trusted (CA rotation). A CSR
    // cannot carry it; the signer adds its own.
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - BACKDATE)?;
    params.not_after = offset((now + validity).min(ca_info.not_after))?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A PKCS #10 request for a serving certificate for `names`, and its new key.
pub fn serving_request(names: &[String]) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let csr = serving_params(names)?.serialize_request(&key)?;
    Ok((csr.pem()?, key.serialize_pem()))
}

/// A CA and a serving certificate for local use (the demo, tests): files a client
/// can trust with `--cacert`.
pub struct DevCerts {
    pub ca_pem: String,
    pub serving: Pair,
}

/// Where [`DevCerts::write_to`] put the files.
pub struct DevPaths {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl DevCerts {
    /// Writes `ca.crt`, `tls.crt` and `tls.key` (the key readable by its owner only).
    pub fn write_to(&self, dir: &std::path::Path) -> std::io::Result<DevPaths> {
        std::fs::create_dir_all(dir)?;
        let paths = DevPaths {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&paths.ca, &self.ca_pem)?;
        std::fs::write(&paths.cert, &self.serving.cert_pem)?;
        write_private(&paths.key, &self.serving.key_pem)?;
        Ok(paths)
    }

    pub fn generate(common_name: &str, names: &[String]) -> Result<Self, PkiError> {
        let now = Utc::now();
        let ca = new_ca(common_name, now, TimeDelta::days(365))?;
        let serving = issue_serving(&ca, names, now, TimeDelta::days(30))?;
        Ok(Self {
            ca_pem: ca.cert_pem,
            serving,
        })
    }
}

/// Writes `contents` to `path`, readable by its owner only (a key, a kubeconfig).
#[cfg(unix)]
pub fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())
}

#[cfg(not(unix))]
pub fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    std::fs::write(path, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec![
            "gpu-booking-webhook.gpu.svc".to_string(),
            "gpu-booking-webhook.gpu.svc.cluster.local".to_string(),
            "127.0.0.1".to_string(),
        ]
    }

    #[test]
    fn serving_certificate_is_signed_by_its_ca_and_covers_its_names() {
        let now = Utc::now();
        let ca = new_ca("test CA", now, TimeDelta::days(3650)).unwrap();
        let leaf = issue_serving(&ca, &names(), now, TimeDelta::days(365)).unwrap();
        let (ca_info, info) = (
            parse_leaf(&ca.cert_pem).unwrap(),
            parse_leaf(&leaf.cert_pem).unwrap(),
        );
        assert!(ca_info.is_ca);
        assert!(!info.is_ca);
        assert!(info.signed_by(&ca_info));
        assert!(!ca_info.signed_by(&info));
        assert!(info.covers(&names()));
        assert!(!info.covers(&["other.svc".to_string()]));
        assert!(key_matches(&info, &leaf.key_pem));
        assert!(!key_matches(&info, &ca.key_pem));
        assert!(info.remaining(now) > TimeDelta::days(364));
        assert!(info.not_before < now);
    }

    #[test]
    fn serving_certificate_never_outlives_its_ca() {
        let now = Utc::now();
        let ca = new_ca("short CA", now, TimeDelta::days(10)).unwrap();
        let leaf = issue_serving(&ca, &names(), now, TimeDelta::days(365)).unwrap();
        let (ca_info, info) = (
            parse_leaf(&ca.cert_pem).unwrap(),
            parse_leaf(&leaf.cert_pem).unwrap(),
        );
        assert_eq!(info.not_after, ca_info.not_after);
    }

    #[test]
    fn a_certificate_of_another_ca_is_not_signed_by_this_one() {
        let now = Utc::now();
        let a = new_ca("a", now, TimeDelta::days(30)).unwrap();
        let b = new_ca("b", now, TimeDelta::days(30)).unwrap();
        let leaf = issue_serving(&a, &names(), now, TimeDelta::days(1)).unwrap();
        let leaf = parse_leaf(&leaf.cert_pem).unwrap();
        assert!(!leaf.signed_by(&parse_leaf(&b.cert_pem).unwrap()));
    }

    #[test]
    fn bundles_and_garbage() {
        let now = Utc::now();
        let a = new_ca("a", now, TimeDelta::days(30)).unwrap();
        let b = new_ca("b", now, TimeDelta::days(30)).unwrap();
        let both = format!("{}{}", a.cert_pem, b.cert_pem);
        assert_eq!(parse_bundle(&both).unwrap().len(), 2);
        assert!(matches!(parse_bundle(""), Err(PkiError::NoCertificate)));
        assert!(parse_bundle(&a.key_pem).is_err());
        assert!(
            parse_bundle("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err()
        );
        assert!(!key_matches(&parse_leaf(&a.cert_pem).unwrap(), "not a key"));
    }

    #[test]
    fn bad_names_are_refused() {
        let now = Utc::now();
        let ca = new_ca("a", now, TimeDelta::days(30)).unwrap();
        for bad in [
            "bad name", "a..b", "-a.svc", "a-.svc", "", "x\u{0}", "ä.svc",
        ] {
            let err = issue_serving(&ca, &[bad.to_string()], now, TimeDelta::days(1));
            assert!(matches!(err, Err(PkiError::BadName(_))), "{bad:?}");
        }
        assert!(is_dns_name(
            "gpu-booking-webhook.gpu-booking.svc.cluster.local"
        ));
        assert!(!is_dns_name(&"a".repeat(64)));
    }

    #[test]
    fn request_carries_the_names() {
        let (csr, key) = serving_request(&names()).unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(KeyPair::from_pem(&key).is_ok());
        let params = rcgen::CertificateSigningRequestParams::from_pem(&csr).unwrap();
        assert_eq!(params.params.subject_alt_names.len(), 3);
    }

    #[test]
    fn debug_hides_the_key() {
        let pair = Pair {
            cert_pem: "c".into(),
            key_pem: "secret".into(),
        };
        assert!(!format!("{pair:?}").contains("secret"));
    }
}
