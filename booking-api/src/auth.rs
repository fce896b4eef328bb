//! Bearer-token authentication: HS256 with a shared secret for small installs,
//! RS256/ES256 against an OIDC provider's JWKS for real ones.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use chrono::{TimeDelta, Utc};
use gpu_booking_core::username::Username;
use jsonwebtoken::{
    decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::AppState;
use crate::error::ApiError;
use crate::jwks::JwksCache;

/// What a caller may do. A token holds any number of roles; `user` is implied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    User,
    Service,
    Admin,
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: Username,
    pub admin: bool,
    pub service: bool,
}

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
    jwks: Option<Arc<JwksCache>>,
    issuer: Option<String>,
    audience: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: Option<String>,
    email: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    /// Keycloak puts realm roles here.
    realm_access: Option<RealmAccess>,
}

#[derive(Debug, Deserialize)]
struct RealmAccess {
    #[serde(default)]
    roles: Vec<String>,
}

impl Authenticator {
    pub fn new(
        hs256_secret: Option<&[u8]>,
        jwks: Option<JwksCache>,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Authenticator {
        Authenticator {
            hs256: hs256_secret.map(|s| Arc::new(DecodingKey::from_secret(s))),
            jwks: jwks.map(Arc::new),
            issuer,
            audience,
        }
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.set_required_spec_claims(&["exp"]);
        v.leeway = 30;
        match &self.audience {
            Some(aud) => v.set_audience(&[aud]),
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        v
    }

    /// Checks signature, algorithm and expiry, and reads the caller's identity.
    pub async fn verify(&self, token: &str) -> Result<Caller, ApiError> {
        let unauthorized = |why: &str| ApiError::Unauthorized(format!("invalid token: {why}"));
        // decode_header refuses `alg: none` (not an algorithm it knows).
        let header = decode_header(token).map_err(|_| unauthorized("malformed"))?;
        let claims = match header.alg {
            Algorithm::HS256 => {
                let key = self
                    .hs256
                    .as_ref()
                    .ok_or_else(|| unauthorized("HS256 tokens are not accepted"))?;
                decode::<Claims>(token, key, &self.validation(Algorithm::HS256))
            }
            alg @ (Algorithm::RS256 | Algorithm::ES256) => {
                let jwks = self
                    .jwks
                    .as_ref()
                    .ok_or_else(|| unauthorized("no JWKS configured"))?;
                let kid = header
                    .kid
                    .as_deref()
                    .ok_or_else(|| unauthorized("no key id"))?;
                let key = jwks
                    .key(kid, alg)
                    .await
                    .ok_or_else(|| unauthorized("unknown key"))?;
                decode::<Claims>(token, &key, &self.validation(alg))
            }
            _ => return Err(unauthorized("algorithm not accepted")),
        }
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => unauthorized("expired"),
            jsonwebtoken::errors::ErrorKind::InvalidSignature => unauthorized("bad signature"),
            jsonwebtoken::errors::ErrorKind::MissingRequiredClaim(c) => {
                ApiError::Unauthorized(format!("invalid token: missing claim {c}"))
            }
            _ => unauthorized("rejected"),
        })?
        .claims;
        let name = claims
            .email
            .or(claims.sub)
            .ok_or_else(|| unauthorized("no email or sub claim"))?;
        let user = Username::parse(&name)
            .map_err(|e| ApiError::Unauthorized(format!("invalid token: user name: {e}")))?;
        let roles = claims
            .roles
            .iter()
            .chain(claims.realm_access.iter().flat_map(|r| r.roles.iter()));
        let (mut admin, mut service) = (false, false);
        for role in roles {
            match role.as_str() {
                "admin" => admin = true,
                "service" => service = true,
                _ => {}
            }
        }
        Ok(Caller {
            user,
            admin,
            service,
        })
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
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
        state.auth.verify(token).await
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
    Ok(encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )?)
}
