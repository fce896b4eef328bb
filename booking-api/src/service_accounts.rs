//! Kubernetes ServiceAccount tokens as bearer tokens: the webhook,
//! the controller and the agent present the projected token the kubelet mounts
//! (audience-bound, short-lived, rotated), and the API asks the cluster whether it is
//! genuine with a `TokenReview` for its own audience. No shared secret to mint, leak or
//! rotate. The role comes from the ServiceAccount (`--service-account
//! NAMESPACE/NAME=ROLE`); an authenticated ServiceAccount not listed gets no role.
//!
//! Answers are cached for a short while (bounded) so that a busy webhook costs one
//! TokenReview per token and minute, not one per admission; the cache is keyed by the
//! token's SHA-256, so it holds no token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use sha2::{Digest, Sha256};

use crate::role::Role;

/// How long a review's answer is reused (a revoked token works this long at most).
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// How long a refusal is reused (a flood of bad tokens costs the cluster little).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// Most answers kept.
pub const CACHE_MAX: usize = 1024;
/// Longest wait for the API server.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Parses `NAMESPACE/NAME=ROLE` (role `service` or `admin`).
pub fn parse_binding(s: &str) -> Result<((String, String), Role), String> {
    let (sa, role) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME=ROLE"))?;
    let (ns, name) = sa
        .trim()
        .split_once('/')
        .ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME=ROLE"))?;
    let dns = |v: &str| {
        !v.is_empty()
            && v.len() <= 253
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !dns(ns) || !dns(name) {
        return Err(format!(
            "{s:?}: namespace and name must be Kubernetes names"
        ));
    }
    let role = match role.trim() {
        "service" => Role::Service,
        "admin" => Role::Admin,
        other => return Err(format!("{s:?}: role {other:?} is not service or admin")),
    };
    Ok(((ns.to_owned(), name.to_owned()), role))
}

/// What a genuine token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewed {
    /// `system:serviceaccount:<ns>:<name>`.
    pub username: String,
    pub role: Option<Role>,
}

/// Verifies ServiceAccount tokens with TokenReviews.
pub struct ServiceAccounts {
    client: kube::Client,
    audience: String,
    roles: BTreeMap<(String, String), Role>,
    cache: Mutex<ReviewCache>,
}

/// Token digest -> when it was reviewed, and what the review said (`None`: refused).
type ReviewCache = HashMap<[u8; 32], (Instant, Option<Reviewed>)>;

impl ServiceAccounts {
    pub fn new(
        client: kube::Client,
        audience: String,
        roles: BTreeMap<(String, String), Role>,
    ) -> Self {
        Self {
            client,
            audience,
            roles,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// `Ok(None)`: the cluster says the token is not genuine (or not for us).
    /// `Err`: the cluster could not be asked.
    pub async fn review(&self, token: &str) -> anyhow::Result<Option<Reviewed>> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((until, answer)) = self.lock().get(&key) {
            if *until > now {
                return Ok(answer.clone());
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| anyhow::anyhow!("TokenReview: no answer in {REVIEW_TIMEOUT:?}"))??;
        let status = answer.status.unwrap_or_default();
        let audience_ok = status
            .audiences
            .as_ref()
            .is_none_or(|a| a.iter().any(|a| a == &self.audience));
        let reviewed = match (status.authenticated, status.user.and_then(|u| u.username)) {
            (Some(true), Some(username)) if audience_ok => {
                let role = username
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|rest| rest.split_once(':'))
                    .and_then(|(ns, name)| self.roles.get(&(ns.to_owned(), name.to_owned())))
                    .copied();
                Some(Reviewed { username, role })
            }
            _ => None,
        };
        let ttl = if reviewed.is_some() {
            CACHE_TTL
        } else {
            NEGATIVE_TTL
        };
        let mut cache = self.lock();
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, (until, _)| *until > now);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(key, (now + ttl, reviewed.clone()));
        Ok(reviewed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReviewCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn cached(&self) -> usize {
        self.lock().len()
    }
}

/// The `iss` claim of a JWT, unverified: only to route a token to the check that can
/// verify it (the signature is checked there, or by the cluster).
pub fn unverified_issuer(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings() {
        assert_eq!(
            parse_binding("gpu-booking/gpu-booking-webhook=service").unwrap(),
            (
                ("gpu-booking".into(), "gpu-booking-webhook".into()),
                Role::Service
            )
        );
        assert!(parse_binding("gpu-booking-webhook=service").is_err());
        assert!(parse_binding("ns/Name=service").is_err());
        assert!(parse_binding("ns/name=root").is_err());
    }
}
