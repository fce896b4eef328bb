//! Bearer-token authentication: HS256 with a shared secret for small installs,
//! RS256/ES256 against an OIDC provider's JWKS for real ones.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use chrono::{TimeDelta, Utc};
use gpu_booking_core::username::{NameCase, Username};
use jsonwebtoken::{
    decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::AuthArgs;
use crate::error::ApiError;
use crate::jwks::JwksCache;
use crate::write_limits::WriteGate;

// Its own module, so that the options (`config`) and the TokenReview bindings
// (`service_accounts`) name roles without depending on auth, which depends on them.
pub use crate::role::Role;

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: Username,
    pub admin: bool,
    pub service: bool,
    /// The groups the token names: its groups claim (`--oidc-groups-claim`), or
    /// for a token of the page's JupyterHub sign-in the hub's groups at sign-in;
    /// `None` when the token names none (or the claim is not read). Only groups an
    /// admin created count (`routes::groups::seen` records them).
    pub groups: Option<TokenGroups>,
}

/// A token's groups and where they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGroups {
    pub source: gpu_booking_core::groups::Source,
    /// Sorted, without repeats, only names that can be groups.
    pub names: Vec<String>,
}

/// The claim of the page's JupyterHub sign-in tokens (HS256, ours) that lists the
/// user's hub groups.
pub const HUB_GROUPS_CLAIM: &str = "hub_groups";

impl Caller {
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden("this needs the admin role".into()))
        }
    }

    pub fn require_service(&self) -> Result<(), ApiError> {
        if self.service || self.admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this needs the service or admin role".into(),
            ))
        }
    }

    /// Users act on their own bookings only; admins on anyone's.
    pub fn require_self_or_admin(&self, owner: &str) -> Result<(), ApiError> {
        if self.admin || self.user.as_str() == owner {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this booking belongs to another user".into(),
            ))
        }
    }
}

/// Verifies tokens. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    hs256: Option<Arc<DecodingKey>>,
    oidc: Option<Arc<Oidc>>,
    service_accounts: Option<Arc<crate::service_accounts::ServiceAccounts>>,
    /// Longest accepted lifetime of an HS256 token, by what it grants.
    hs256_lifetimes: Lifetimes,
    /// The claim that lists a person's groups (`--oidc-groups-claim`); `None`: not
    /// read.
    groups_claim: Option<Arc<str>>,
    /// Which users' token groups this process has recorded lately, so that a
    /// request records them only when they change (`groups_changed`).
    groups_seen: Arc<std::sync::Mutex<GroupsSeen>>,
}

/// Users whose token groups were recorded, with a digest of the groups and when:
/// bounded (emptied when full), and an entry older than [`GROUPS_SEEN_FOR`] counts
/// as not seen, so that a group an admin creates later is picked up.
#[derive(Default)]
struct GroupsSeen {
    users: std::collections::HashMap<String, (u64, std::time::Instant)>,
}

/// Most users [`GroupsSeen`] keeps.
const GROUPS_SEEN_MAX: usize = 10_000;
/// How long a recorded set of token groups is trusted before it is recorded again.
const GROUPS_SEEN_FOR: Duration = Duration::from_secs(300);

/// Most groups read from one token's claim (and bytes of one name): a claim is
/// the provider's, but bounded all the same.
const MAX_TOKEN_GROUPS: usize = 256;

/// Ceilings on a token's lifetime (`exp - iat`, or `exp - now` without `iat`): a
/// stolen long-lived token is worth more. A person's token (no role, or `admin`)
/// lives as long as an OIDC provider's would (`--max-token-lifetime`); the shared
/// service token of the webhook, controller and agent, where they use one, is
/// minted once and mounted, so it gets its own ceiling
/// (`--max-service-token-lifetime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    pub person: Duration,
    pub service: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        let args = AuthArgs::default();
        Lifetimes {
            person: args.max_token_lifetime,
            service: args.max_service_token_lifetime,
        }
    }
}

/// How tokens of an OIDC provider are checked. Issuer and audience are required: a
/// provider's keys sign tokens of every client and realm it serves, and without
/// both checks a token minted for any of them would be accepted here.
pub struct Oidc {
    pub jwks: JwksCache,
    /// Required `iss`.
    pub issuer: String,
    /// Required in `aud`.
    pub audience: String,
    /// The claim that names the user. `email` counts only with
    /// `email_verified: true` (anyone can put any address in an unverified one).
    pub username_claim: String,
    /// Longest accepted lifetime (`exp - iat`, or `exp - now` without `iat`).
    pub max_lifetime: Duration,
}

/// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
const LEEWAY_SECS: u64 = 30;

#[derive(Debug, Deserialize)]
struct Claims {
    sub: Option<String>,
    email: Option<String>,
    /// Some providers (e.g. AWS Cognito) send `"true"` as a string.
    #[serde(default)]
    email_verified: Option<Value>,
    exp: Option<i64>,
    iat: Option<i64>,
    #[serde(default)]
    roles: Vec<String>,
    /// Keycloak puts realm roles here.
    realm_access: Option<RealmAccess>,
    /// Every other claim, for a configured username claim.
    #[serde(flatten)]
    other: serde_json::Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct RealmAccess {
    #[serde(default)]
    roles: Vec<String>,
}

impl Authenticator {
    pub fn new(hs256_secret: Option<&[u8]>, oidc: Option<Oidc>) -> Authenticator {
        Authenticator {
            hs256: hs256_secret.map(|s| Arc::new(DecodingKey::from_secret(s))),
            oidc: oidc.map(Arc::new),
            service_accounts: None,
            hs256_lifetimes: Lifetimes::default(),
            groups_claim: None,
            groups_seen: Arc::default(),
        }
    }

    /// Reads a person's groups from this claim (empty: from none).
    pub fn with_groups_claim(mut self, claim: &str) -> Authenticator {
        let claim = claim.trim();
        self.groups_claim = (!claim.is_empty()).then(|| Arc::from(claim));
        self
    }

    /// Whether `user`'s token groups differ from those this process recorded
    /// lately (and records them as recorded): `false` means there is nothing to
    /// write.
    pub fn groups_changed(&self, user: &str, groups: &[String]) -> bool {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        groups.hash(&mut h);
        let digest = h.finish();
        let now = std::time::Instant::now();
        let Ok(mut seen) = self.groups_seen.lock() else {
            return true;
        };
        if let Some((d, at)) = seen.users.get(user) {
            if *d == digest && now.duration_since(*at) < GROUPS_SEEN_FOR {
                return false;
            }
        }
        if seen.users.len() >= GROUPS_SEEN_MAX {
            seen.users.clear();
        }
        seen.users.insert(user.to_owned(), (digest, now));
        true
    }

    /// Forgets what [`Self::groups_changed`] recorded for `user` (their write
    /// failed: the next request tries again).
    pub fn forget_groups(&self, user: &str) {
        if let Ok(mut seen) = self.groups_seen.lock() {
            seen.users.remove(user);
        }
    }

    /// With these ceilings on HS256 tokens' lifetimes.
    pub fn with_hs256_lifetimes(mut self, lifetimes: Lifetimes) -> Authenticator {
        self.hs256_lifetimes = lifetimes;
        self
    }

    /// Also accepts Kubernetes ServiceAccount tokens, verified by TokenReview.
    pub fn with_service_accounts(
        mut self,
        service_accounts: crate::service_accounts::ServiceAccounts,
    ) -> Authenticator {
        self.service_accounts = Some(Arc::new(service_accounts));
        self
    }

    /// A ServiceAccount token, as the cluster judges it.
    async fn verify_service_account(
        sa: &crate::service_accounts::ServiceAccounts,
        token: &str,
    ) -> Result<Caller, ApiError> {
        match sa.review(token).await {
            Ok(Some(reviewed)) => Ok(Caller {
                user: Username::parse(&reviewed.username).map_err(|e| {
                    ApiError::Unauthorized(format!("invalid token: user name: {e}"))
                })?,
                admin: reviewed.role == Some(Role::Admin),
                service: reviewed.role == Some(Role::Service),
                groups: None,
            }),
            Ok(None) => Err(unauthorized(
                "not a ServiceAccount token the cluster accepts for this audience",
            )),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "TokenReview failed");
                Err(ApiError::Internal(e.context(
                    "the cluster could not verify the ServiceAccount token (TokenReview)",
                )))
            }
        }
    }

    /// The authenticator that the options describe; refuses unsafe OIDC settings
    /// (see [`AuthArgs`]) with a message that names the option to set.
    pub fn from_args(
        auth: &AuthArgs,
        hs256_secret: Option<&[u8]>,
    ) -> anyhow::Result<Authenticator> {
        anyhow::ensure!(
            hs256_secret.is_some()
                || auth.jwks_url.is_some()
                || auth.service_account_audience.is_some(),
            "configure --jwt-secret(-file), --jwks-url or --service-account-audience: no token could be verified"
        );
        let oidc = match &auth.jwks_url {
            None => None,
            Some(url) => Some(Oidc {
                jwks: JwksCache::new(checked_jwks_url(url, auth.allow_insecure_jwks_url)?)?,
                issuer: required(
                    &auth.claims.jwt_issuer,
                    "--jwt-issuer (GPU_BOOKING_JWT_ISSUER)",
                )?,
                audience: required(
                    &auth.claims.jwt_audience,
                    "--jwt-audience (GPU_BOOKING_JWT_AUDIENCE)",
                )?,
                username_claim: auth.jwt_username_claim.clone(),
                max_lifetime: auth.max_token_lifetime,
            }),
        };
        Ok(Authenticator::new(hs256_secret, oidc)
            .with_hs256_lifetimes(Lifetimes {
                person: auth.max_token_lifetime,
                service: auth.max_service_token_lifetime,
            })
            .with_groups_claim(&auth.oidc_groups_claim))
    }

    /// Checks signature, algorithm, expiry, not-before and (for OIDC tokens) issuer,
    /// audience and lifetime, and reads the caller's identity.
    pub async fn verify(&self, token: &str) -> Result<Caller, ApiError> {
        // decode_header refuses `alg: none` (not an algorithm it knows).
        let header = decode_header(token).map_err(|_| unauthorized("malformed"))?;
        let (claims, oidc) = match header.alg {
            Algorithm::HS256 => {
                let key = self
                    .hs256
                    .as_ref()
                    .ok_or_else(|| unauthorized("HS256 tokens are not accepted"))?;
                (decode::<Claims>(token, key, &hs256_validation()), None)
            }
            alg @ (Algorithm::RS256 | Algorithm::ES256) => {
                // ServiceAccount tokens are RS256 too: everything not issued by the
                // OIDC provider goes to the cluster (the signature is checked there).
                if let Some(sa) = &self.service_accounts {
                    let oidc_issuer = self.oidc.as_ref().map(|o| o.issuer.as_str());
                    if crate::service_accounts::unverified_issuer(token).as_deref() != oidc_issuer
                        || oidc_issuer.is_none()
                    {
                        return Self::verify_service_account(sa, token).await;
                    }
                }
                let oidc = self
                    .oidc
                    .as_ref()
                    .ok_or_else(|| unauthorized("no JWKS configured"))?;
                let kid = header
                    .kid
                    .as_deref()
                    .ok_or_else(|| unauthorized("no key id"))?;
                let key = oidc
                    .jwks
                    .key(kid, alg)
                    .await
                    .ok_or_else(|| unauthorized("unknown key"))?;
                (
                    decode::<Claims>(token, &key, &oidc.validation(alg)),
                    Some(oidc),
                )
            }
            _ => return Err(unauthorized("algorithm not accepted")),
        };
        let claims = claims.map_err(rejected)?.claims;
        let name = match oidc {
            // HS256 tokens are signed with our own secret: whoever holds it is
            // trusted to name the user, by `email` or else `sub`.
            None => {
                let service = claims.roles().any(|r| r == "service");
                let lifetimes = self.hs256_lifetimes;
                let (max, flag) = if service {
                    (lifetimes.service, "--max-service-token-lifetime")
                } else {
                    (lifetimes.person, "--max-token-lifetime")
                };
                check_lifetime(&claims, max, flag)?;
                claims.email.clone().or_else(|| claims.sub.clone())
            }
            Some(oidc) => {
                check_lifetime(&claims, oidc.max_lifetime, "--max-token-lifetime")?;
                Some(oidc.username(&claims)?)
            }
        }
        .ok_or_else(|| unauthorized("no email or sub claim"))?;
        let user = Username::parse(&name)
            .map_err(|e| ApiError::Unauthorized(format!("invalid token: user name: {e}")))?;
        let (mut admin, mut service) = (false, false);
        for role in claims.roles() {
            match role.as_str() {
                "admin" => admin = true,
                "service" => service = true,
                _ => {}
            }
        }
        let groups = if service {
            None
        } else if let (None, Some(names)) = (oidc, token_groups(&claims, HUB_GROUPS_CLAIM)) {
            Some(TokenGroups {
                source: gpu_booking_core::groups::Source::Hub,
                names,
            })
        } else {
            self.groups_claim
                .as_deref()
                .and_then(|claim| token_groups(&claims, claim))
                .map(|names| TokenGroups {
                    source: gpu_booking_core::groups::Source::Oidc,
                    names,
                })
        };
        Ok(Caller {
            user,
            admin,
            service,
            groups,
        })
    }
}

/// The groups a token's `claim` lists: a list of strings or one string (some
/// providers send one group so), without names that cannot be groups here; at most
/// [`MAX_TOKEN_GROUPS`]. `None` without the claim.
fn token_groups(claims: &Claims, claim: &str) -> Option<Vec<String>> {
    let value = claims.other.get(claim)?;
    let names: Vec<&str> = match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    let mut groups: Vec<String> = names
        .into_iter()
        // Keycloak's full group paths (`/ml-lab`) name the group `ml-lab`.
        .map(|n| n.trim().trim_start_matches('/'))
        .filter(|n| gpu_booking_core::groups::name_problem(n).is_none())
        .take(MAX_TOKEN_GROUPS)
        .map(str::to_owned)
        .collect();
    groups.sort();
    groups.dedup();
    Some(groups)
}

impl Oidc {
    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.leeway = LEEWAY_SECS;
        v.validate_nbf = true;
        v.set_audience(&[&self.audience]);
        v.set_issuer(&[&self.issuer]);
        v
    }

    /// The user the token names, from the configured claim.
    fn username(&self, claims: &Claims) -> Result<String, ApiError> {
        let claim = self.username_claim.as_str();
        let value = match claim {
            "sub" => claims.sub.clone(),
            "email" => {
                let verified = matches!(&claims.email_verified, Some(Value::Bool(true)))
                    || matches!(&claims.email_verified, Some(Value::String(s)) if s == "true");
                if claims.email.is_some() && !verified {
                    return Err(unauthorized(
                        "the email claim is not verified (email_verified is not true)",
                    ));
                }
                claims.email.clone()
            }
            other => claims
                .other
                .get(other)
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        value.ok_or_else(|| {
            ApiError::Unauthorized(format!(
                "invalid token: no {claim} claim (the user name claim, --jwt-username-claim)"
            ))
        })
    }
}

impl Claims {
    /// The roles it grants: `roles`, and Keycloak's realm roles.
    fn roles(&self) -> impl Iterator<Item = &String> {
        self.roles
            .iter()
            .chain(self.realm_access.iter().flat_map(|r| r.roles.iter()))
    }
}

/// A ceiling on `exp - iat` (`exp - now` without `iat`): a stolen long-lived token is
/// worth more, and providers issue minutes to hours. `iat` in the future is refused
/// too. `flag` names the option that sets `max`.
fn check_lifetime(claims: &Claims, max: Duration, flag: &str) -> Result<(), ApiError> {
    let now = Utc::now().timestamp();
    let exp = claims
        .exp
        .ok_or_else(|| unauthorized("missing claim exp"))?;
    let leeway = LEEWAY_SECS as i64;
    if claims.iat.is_some_and(|iat| iat > now + leeway) {
        return Err(unauthorized("issued in the future (iat)"));
    }
    let from = claims.iat.unwrap_or(now);
    let max_secs = i64::try_from(max.as_secs()).unwrap_or(i64::MAX);
    if exp.saturating_sub(from) > max_secs.saturating_add(leeway) {
        return Err(ApiError::Unauthorized(format!(
            "invalid token: it lives longer (exp - iat) than the {} this service accepts ({flag}); use a shorter-lived one",
            lifetime_words(max_secs)
        )));
    }
    Ok(())
}

/// `secs` in the largest whole unit: `24 h`, `90 days`, `90 s`.
fn lifetime_words(secs: i64) -> String {
    match secs {
        s if s > 0 && s % 86_400 == 0 => format!("{} days", s / 86_400),
        s if s > 0 && s % 3600 == 0 => format!("{} h", s / 3600),
        s => format!("{s} s"),
    }
}

fn hs256_validation() -> Validation {
    let mut v = Validation::new(Algorithm::HS256);
    v.set_required_spec_claims(&["exp"]);
    v.leeway = LEEWAY_SECS;
    v.validate_nbf = true;
    v.validate_aud = false;
    v
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::Unauthorized(format!("invalid token: {why}"))
}

fn rejected(e: jsonwebtoken::errors::Error) -> ApiError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => unauthorized("expired"),
        ErrorKind::ImmatureSignature => unauthorized("not valid yet (nbf)"),
        ErrorKind::InvalidSignature => unauthorized("bad signature"),
        ErrorKind::InvalidIssuer => unauthorized("wrong issuer"),
        ErrorKind::InvalidAudience => unauthorized("wrong audience"),
        ErrorKind::MissingRequiredClaim(c) => {
            ApiError::Unauthorized(format!("invalid token: missing claim {c}"))
        }
        _ => unauthorized("rejected"),
    }
}

fn required(value: &Option<String>, flag: &str) -> anyhow::Result<String> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Ok(v.to_owned()),
        _ => anyhow::bail!(
            "--jwks-url needs {flag}: without it, tokens that the provider signs for any \
             other issuer or client would be accepted"
        ),
    }
}

/// The JWKS URL, https unless `allow_insecure` (development only: over http anyone
/// on the path can swap the keys and sign in as anyone).
pub fn checked_jwks_url(url: &str, allow_insecure: bool) -> anyhow::Result<String> {
    let parsed = reqwest::Url::parse(url.trim())
        .map_err(|e| anyhow::anyhow!("--jwks-url {url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_insecure => {
            tracing::warn!(
                url,
                "fetching the JWKS over plain http (--allow-insecure-jwks-url)"
            )
        }
        "http" => anyhow::bail!(
            "--jwks-url must be https:// (a key set fetched over http can be replaced by \
             anyone on the path); --allow-insecure-jwks-url allows http for development"
        ),
        other => anyhow::bail!("--jwks-url: unsupported scheme {other:?}"),
    }
    Ok(parsed.to_string())
}

/// For any state that holds the [`Authenticator`], the [`NameCase`] and the
/// [`WriteGate`] (the service's `AppState`), so that auth does not depend on the
/// state that holds it. A write is also counted against its caller's rate limits
/// here, where the caller is known.
impl<S> FromRequestParts<S> for Caller
where
    S: Send + Sync,
    Authenticator: FromRef<S>,
    NameCase: FromRef<S>,
    WriteGate: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Caller, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| ApiError::Unauthorized("missing Authorization: Bearer token".into()))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be `Bearer <token>`".into())
            })?;
        let mut caller = Authenticator::from_ref(state).verify(token).await?;
        // One user, however the token spells the name (JupyterHub's normalisation).
        caller.user = Username::normalised(caller.user.as_str(), NameCase::from_ref(state))
            .map_err(|e| ApiError::Unauthorized(format!("invalid token: user name: {e}")))?;
        WriteGate::from_ref(state).admit(parts, caller.user.as_str(), caller.service)?;
        Ok(caller)
    }
}

/// Mints an HS256 token for `user` with the given role, valid for `ttl`.
pub fn mint_token(
    secret: &[u8],
    user: &str,
    role: Option<Role>,
    ttl: TimeDelta,
) -> anyhow::Result<String> {
    mint_token_for(secret, user, role, ttl, None, None)
}

/// [`mint_token_for`] with further claims (`extra`'s fields), e.g. the hub groups
/// of the page's JupyterHub sign-in ([`HUB_GROUPS_CLAIM`]).
pub fn mint_token_with(
    secret: &[u8],
    user: &str,
    role: Option<Role>,
    ttl: TimeDelta,
    issuer: Option<&str>,
    audience: Option<&str>,
    extra: serde_json::Map<String, Value>,
) -> anyhow::Result<String> {
    mint(secret, user, role, ttl, issuer, audience, extra)
}

/// [`mint_token`] with the `iss` and `aud` claims an API run with `--jwt-issuer` /
/// `--jwt-audience` requires.
pub fn mint_token_for(
    secret: &[u8],
    user: &str,
    role: Option<Role>,
    ttl: TimeDelta,
    issuer: Option<&str>,
    audience: Option<&str>,
) -> anyhow::Result<String> {
    mint(
        secret,
        user,
        role,
        ttl,
        issuer,
        audience,
        serde_json::Map::new(),
    )
}

fn mint(
    secret: &[u8],
    user: &str,
    role: Option<Role>,
    ttl: TimeDelta,
    issuer: Option<&str>,
    audience: Option<&str>,
    extra: serde_json::Map<String, Value>,
) -> anyhow::Result<String> {
    let roles: Vec<&str> = match role {
        Some(Role::Admin) => vec!["admin"],
        Some(Role::Service) => vec!["service"],
        Some(Role::User) | None => vec![],
    };
    let now = Utc::now();
    let mut claims: Value = json!({
        "sub": user,
        "roles": roles,
        "iat": now.timestamp(),
        "exp": (now + ttl).timestamp(),
    });
    if let Some(iss) = issuer {
        claims["iss"] = json!(iss);
    }
    if let Some(aud) = audience {
        claims["aud"] = json!(aud);
    }
    for (k, v) in extra {
        claims[k] = v;
    }
    Ok(encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )?)
}
