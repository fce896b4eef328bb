//! What the self-signed mode keeps and what it renews, decided from what is stored
//! and the clock alone (no I/O), so that every renewal rule is tested here.
//!
//! - The CA is renewed when it is missing, unreadable, not a CA, not the pair of its
//!   key, or when a serving certificate issued now would outlive it by more than the
//!   renewal margin (`remaining < cert_validity + renew_before`).
//! - The serving certificate is renewed when it is missing, unreadable, not the pair of
//!   its key, not signed by the current CA, missing a wanted name, or within
//!   `renew_before` of its end.
//! - The trust bundle (the webhook's `caBundle`) is the current CA first, then every
//!   earlier CA that has not expired: after a CA rotation, clients trust both until the
//!   webhook serves the certificate of the new one.

use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};

use crate::pki::{self, CertInfo, Pair, PkiError};

/// Earlier CAs kept in the trust bundle, at most.
const MAX_PREVIOUS_CAS: usize = 2;

/// Lifetimes and the renewal margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub ca_validity: TimeDelta,
    pub cert_validity: TimeDelta,
    pub renew_before: TimeDelta,
}

impl Policy {
    /// Refuses lifetimes that would renew on every run.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_before <= TimeDelta::zero() {
            return Err("the renewal margin must be positive".into());
        }
        if self.cert_validity <= self.renew_before {
            return Err(format!(
                "the certificate lifetime ({}) must be longer than the renewal margin ({})",
                days(self.cert_validity),
                days(self.renew_before)
            ));
        }
        if self.ca_validity <= self.cert_validity + self.renew_before {
            return Err(format!(
                "the CA lifetime ({}) must be longer than the certificate lifetime plus the renewal margin ({})",
                days(self.ca_validity),
                days(self.cert_validity + self.renew_before)
            ));
        }
        Ok(())
    }
}

fn days(d: TimeDelta) -> String {
    let secs = d.num_seconds();
    if secs % 86_400 == 0 {
        format!("{} days", secs / 86_400)
    } else {
        format!("{secs} s")
    }
}

/// Why something is (re)issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    Missing,
    Unreadable(String),
    NotACa,
    KeyMismatch,
    OtherIssuer,
    MissingNames(Vec<String>),
    Expiring { not_after: DateTime<Utc> },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Missing => write!(f, "none stored"),
            Reason::Unreadable(e) => write!(f, "the stored one is unreadable ({e})"),
            Reason::NotACa => write!(f, "the stored one is not a CA"),
            Reason::KeyMismatch => write!(f, "the stored key does not match the certificate"),
            Reason::OtherIssuer => write!(f, "the stored one is not signed by the current CA"),
            Reason::MissingNames(n) => write!(f, "the stored one lacks {}", n.join(", ")),
            Reason::Expiring { not_after } => {
                write!(f, "the stored one expires at {}", not_after.to_rfc3339())
            }
        }
    }
}

/// What the Secrets hold now.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    pub ca: Option<Pair>,
    /// The trust bundle stored beside the CA (PEM, possibly several certificates).
    pub trust_bundle: Option<String>,
    pub serving: Option<Pair>,
}

/// What they must hold.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub ca: Pair,
    pub trust_bundle: String,
    pub serving: Pair,
    pub ca_renewed: Option<Reason>,
    pub serving_renewed: Option<Reason>,
}

impl Outcome {
    pub fn changed(&self) -> bool {
        self.ca_renewed.is_some() || self.serving_renewed.is_some()
    }
}

/// Decides, and generates what must be new.
pub fn self_signed(
    stored: &Stored,
    names: &[String],
    ca_common_name: &str,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Outcome, PkiError> {
    let ca_check = stored
        .ca
        .as_ref()
        .map(|ca| check_ca(ca, now, policy))
        .unwrap_or(Err(Reason::Missing));
    let (ca, ca_info, ca_renewed) = match ca_check {
        Ok(info) => (
            stored.ca.clone().ok_or(PkiError::NoCertificate)?,
            info,
            None,
        ),
        Err(reason) => {
            let ca = pki::new_ca(ca_common_name, now, policy.ca_validity)?;
            let info = pki::parse_leaf(&ca.cert_pem)?;
            (ca, info, Some(reason))
        }
    };
    let serving_check = stored
        .serving
        .as_ref()
        .map(|s| check_serving(s, &ca_info, names, now, policy))
        .unwrap_or(Err(Reason::Missing));
    let (serving, serving_renewed) = match serving_check {
        Ok(()) => (stored.serving.clone().ok_or(PkiError::NoCertificate)?, None),
        Err(reason) => (
            pki::issue_serving(&ca, names, now, policy.cert_validity)?,
            Some(reason),
        ),
    };
    let trust_bundle = trust_bundle(&ca, &ca_info, stored, now);
    Ok(Outcome {
        ca,
        trust_bundle,
        serving,
        ca_renewed,
        serving_renewed,
    })
}

fn check_ca(ca: &Pair, now: DateTime<Utc>, policy: &Policy) -> Result<CertInfo, Reason> {
    let info = pki::parse_leaf(&ca.cert_pem).map_err(|e| Reason::Unreadable(e.to_string()))?;
    if !info.is_ca {
        return Err(Reason::NotACa);
    }
    if !pki::key_matches(&info, &ca.key_pem) {
        return Err(Reason::KeyMismatch);
    }
    if info.remaining(now) < policy.cert_validity + policy.renew_before {
        return Err(Reason::Expiring {
            not_after: info.not_after,
        });
    }
    Ok(info)
}

fn check_serving(
    serving: &Pair,
    ca: &CertInfo,
    names: &[String],
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<(), Reason> {
    let info = pki::parse_leaf(&serving.cert_pem).map_err(|e| Reason::Unreadable(e.to_string()))?;
    if !pki::key_matches(&info, &serving.key_pem) {
        return Err(Reason::KeyMismatch);
    }
    if !info.signed_by(ca) {
        return Err(Reason::OtherIssuer);
    }
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !info.covers(std::slice::from_ref(n)))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(Reason::MissingNames(missing));
    }
    if info.remaining(now) < policy.renew_before {
        return Err(Reason::Expiring {
            not_after: info.not_after,
        });
    }
    Ok(())
}

/// The current CA, then the earlier ones (the stored bundle, and the stored CA when it
/// was just replaced) that are still valid CAs, newest first, without repeats.
fn trust_bundle(ca: &Pair, ca_info: &CertInfo, stored: &Stored, now: DateTime<Utc>) -> String {
    let mut earlier: Vec<CertInfo> = Vec::new();
    let old_ca = stored.ca.iter().map(|c| c.cert_pem.as_str());
    let old_bundle = stored.trust_bundle.iter().map(String::as_str);
    for pem in old_ca.chain(old_bundle) {
        for info in pki::parse_bundle(pem).unwrap_or_default() {
            let usable = info.is_ca && info.not_after > now && info.der != ca_info.der;
            if usable && !earlier.iter().any(|e| e.der == info.der) {
                earlier.push(info);
            }
        }
    }
    earlier.truncate(MAX_PREVIOUS_CAS);
    let mut bundle = ca.cert_pem.trim_end().to_string();
    bundle.push('\n');
    for info in earlier {
        bundle.push_str(&pem_of_der(&info.der));
    }
    bundle
}

fn pem_of_der(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            ca_validity: TimeDelta::days(3650),
            cert_validity: TimeDelta::days(365),
            renew_before: TimeDelta::days(30),
        }
    }

    fn names() -> Vec<String> {
        vec!["wh.ns.svc".into(), "wh.ns.svc.cluster.local".into()]
    }

    fn stored(o: &Outcome) -> Stored {
        Stored {
            ca: Some(o.ca.clone()),
            trust_bundle: Some(o.trust_bundle.clone()),
            serving: Some(o.serving.clone()),
        }
    }

    fn first(now: DateTime<Utc>) -> Outcome {
        self_signed(&Stored::default(), &names(), "CA", now, &policy()).unwrap()
    }

    #[test]
    fn nothing_stored_makes_everything() {
        let o = first(Utc::now());
        assert_eq!(o.ca_renewed, Some(Reason::Missing));
        assert_eq!(o.serving_renewed, Some(Reason::Missing));
        assert_eq!(pki::parse_bundle(&o.trust_bundle).unwrap().len(), 1);
        let leaf = pki::parse_leaf(&o.serving.cert_pem).unwrap();
        assert!(leaf.signed_by(&pki::parse_leaf(&o.ca.cert_pem).unwrap()));
    }

    #[test]
    fn a_second_run_changes_nothing() {
        let now = Utc::now();
        let o = first(now);
        let again = self_signed(
            &stored(&o),
            &names(),
            "CA",
            now + TimeDelta::hours(1),
            &policy(),
        )
        .unwrap();
        assert!(!again.changed());
        assert_eq!(again.ca, o.ca);
        assert_eq!(again.serving, o.serving);
        assert_eq!(again.trust_bundle, o.trust_bundle);
    }

    #[test]
    fn serving_certificate_renews_inside_the_margin_and_not_before() {
        let now = Utc::now();
        let o = first(now);
        let before = now + TimeDelta::days(365 - 31);
        let kept = self_signed(&stored(&o), &names(), "CA", before, &policy()).unwrap();
        assert!(!kept.changed());
        let inside = now + TimeDelta::days(365 - 29);
        let renewed = self_signed(&stored(&o), &names(), "CA", inside, &policy()).unwrap();
        assert!(matches!(
            renewed.serving_renewed,
            Some(Reason::Expiring { .. })
        ));
        assert_eq!(renewed.ca_renewed, None);
        assert_eq!(renewed.ca, o.ca);
        assert_ne!(renewed.serving, o.serving);
        assert_eq!(renewed.trust_bundle, o.trust_bundle);
    }

    #[test]
    fn ca_rotation_keeps_the_old_ca_trusted() {
        let now = Utc::now();
        let o = first(now);
        // A serving certificate issued now would outlive the CA by more than the margin.
        let late = now + TimeDelta::days(3650 - 365 - 29);
        let r = self_signed(&stored(&o), &names(), "CA", late, &policy()).unwrap();
        assert!(matches!(r.ca_renewed, Some(Reason::Expiring { .. })));
        assert_eq!(r.serving_renewed, Some(Reason::OtherIssuer));
        let bundle = pki::parse_bundle(&r.trust_bundle).unwrap();
        assert_eq!(bundle.len(), 2);
        assert_eq!(bundle[0], pki::parse_leaf(&r.ca.cert_pem).unwrap());
        assert_eq!(bundle[1], pki::parse_leaf(&o.ca.cert_pem).unwrap());
        // Once the old CA has expired it leaves the bundle.
        let much_later = now + TimeDelta::days(3651);
        let r2 = self_signed(&stored(&r), &names(), "CA", much_later, &policy()).unwrap();
        assert_eq!(r2.ca, r.ca);
        assert_eq!(pki::parse_bundle(&r2.trust_bundle).unwrap().len(), 1);
    }

    #[test]
    fn a_new_name_reissues_the_serving_certificate_only() {
        let now = Utc::now();
        let o = first(now);
        let mut more = names();
        more.push("webhook.example.org".into());
        let r = self_signed(&stored(&o), &more, "CA", now, &policy()).unwrap();
        assert_eq!(
            r.serving_renewed,
            Some(Reason::MissingNames(vec!["webhook.example.org".into()]))
        );
        assert_eq!(r.ca_renewed, None);
        assert!(pki::parse_leaf(&r.serving.cert_pem).unwrap().covers(&more));
    }

    #[test]
    fn damaged_secrets_are_replaced() {
        let now = Utc::now();
        let o = first(now);
        let other = first(now);
        let mut s = stored(&o);
        s.serving = Some(Pair {
            cert_pem: o.serving.cert_pem.clone(),
            key_pem: other.serving.key_pem.clone(),
        });
        let r = self_signed(&s, &names(), "CA", now, &policy()).unwrap();
        assert_eq!(r.serving_renewed, Some(Reason::KeyMismatch));

        let mut s = stored(&o);
        s.serving = Some(other.serving.clone());
        let r = self_signed(&s, &names(), "CA", now, &policy()).unwrap();
        assert_eq!(r.serving_renewed, Some(Reason::OtherIssuer));

        let mut s = stored(&o);
        s.ca = Some(Pair {
            cert_pem: "garbage".into(),
            key_pem: "garbage".into(),
        });
        let r = self_signed(&s, &names(), "CA", now, &policy()).unwrap();
        assert!(matches!(r.ca_renewed, Some(Reason::Unreadable(_))));
        assert_eq!(r.serving_renewed, Some(Reason::OtherIssuer));

        let mut s = stored(&o);
        s.ca = Some(o.serving.clone());
        let r = self_signed(&s, &names(), "CA", now, &policy()).unwrap();
        assert_eq!(r.ca_renewed, Some(Reason::NotACa));
    }

    #[test]
    fn the_bundle_is_bounded() {
        let now = Utc::now();
        let mut s = stored(&first(now));
        for _ in 0..5 {
            s.ca = None;
            let r = self_signed(&s, &names(), "CA", now, &policy()).unwrap();
            s = stored(&r);
        }
        let bundle = pki::parse_bundle(s.trust_bundle.as_deref().unwrap()).unwrap();
        assert_eq!(bundle.len(), 1 + MAX_PREVIOUS_CAS);
    }

    #[test]
    fn policies_that_would_renew_every_run_are_refused() {
        assert!(policy().validate().is_ok());
        let mut p = policy();
        p.cert_validity = TimeDelta::days(30);
        assert!(p.validate().is_err());
        let mut p = policy();
        p.ca_validity = TimeDelta::days(390);
        assert!(p.validate().unwrap_err().contains("CA lifetime"));
        let mut p = policy();
        p.renew_before = TimeDelta::zero();
        assert!(p.validate().is_err());
    }
}
