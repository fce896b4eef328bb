//! Tokens from a real OpenID Connect provider: the npm package `oidc-provider`,
//! run by `tests/oidc/provider.mjs` on 127.0.0.1 (over http, with
//! `--allow-insecure-jwks-url`). Tokens are minted with the client_credentials grant
//! (JWT access tokens, RS256 and ES256), then the provider rotates its keys.
//!
//! Needs node and `npm ci` in tests/oidc (`./scripts/oidc-test.sh` does both, and
//! `./scripts/test.sh` runs it). Without them this test says so and passes, unless
//! GPU_BOOKING_REQUIRE_OIDC_PROVIDER=1 (set by the script) makes it fail.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gpu_booking_api::auth::{Authenticator, Oidc};
use gpu_booking_api::config::{AuthArgs, JwtClaimArgs};
use gpu_booking_api::error::ApiError;
use gpu_booking_api::jwks::{JwksCache, JwksOptions};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SECRET: &str = "test-secret-that-is-long-enough-0123456789";
const AUDIENCE: &str = "gpu-booking";

struct OidcProvider {
    issuer: String,
    jwks_uri: String,
    token_endpoint: String,
    http: reqwest::Client,
    _child: Child,
}

impl OidcProvider {
    /// The provider, or `None` (with the reason printed) where it cannot run.
    async fn start() -> Option<OidcProvider> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/oidc");
        let required = std::env::var("GPU_BOOKING_REQUIRE_OIDC_PROVIDER").as_deref() == Ok("1");
        if !dir.join("node_modules/oidc-provider").is_dir() {
            let why = "tests/oidc/node_modules is missing (run ./scripts/oidc-test.sh)";
            assert!(!required, "{why}");
            eprintln!("SKIPPED: the real OIDC provider test: {why}");
            return None;
        }
        let mut child = match Command::new("node")
            .arg("provider.mjs")
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                assert!(!required, "cannot run node: {e}");
                eprintln!("SKIPPED: the real OIDC provider test: cannot run node: {e}");
                return None;
            }
        };
        let stdout = child.stdout.take().expect("piped");
        let line = BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .expect("reading the provider's first line")
            .expect("the provider printed its issuer");
        let issuer = serde_json::from_str::<Value>(&line).unwrap()["issuer"]
            .as_str()
            .unwrap()
            .to_owned();
        let http = reqwest::Client::new();
        let discovery: Value = http
            .get(format!("{issuer}/.well-known/openid-configuration"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        Some(OidcProvider {
            jwks_uri: discovery["jwks_uri"].as_str().unwrap().to_owned(),
            token_endpoint: discovery["token_endpoint"].as_str().unwrap().to_owned(),
            issuer,
            http,
            _child: child,
        })
    }

    /// A JWT access token for `client`, for `resource` (which picks the algorithm,
    /// lifetime and audience; see provider.mjs).
    async fn token(&self, client: &str, resource: &str) -> String {
        let resp: Value = self
            .http
            .post(&self.token_endpoint)
            .basic_auth(client, Some(SECRET))
            .form(&[
                ("grant_type", "client_credentials"),
                ("scope", "api"),
                ("resource", resource),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        resp["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token: {resp}"))
            .to_owned()
    }

    async fn rotate(&self) {
        let resp = self
            .http
            .post(format!("{}/test/rotate", self.issuer))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }

    fn args(&self, insecure: bool) -> AuthArgs {
        AuthArgs {
            jwks_url: Some(self.jwks_uri.clone()),
            allow_insecure_jwks_url: insecure,
            claims: JwtClaimArgs {
                jwt_issuer: Some(self.issuer.clone()),
                jwt_audience: Some(AUDIENCE.into()),
            },
            ..AuthArgs::default()
        }
    }
}

fn kid(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.unwrap()
}

fn refused(result: Result<impl std::fmt::Debug, ApiError>, why: &str) {
    match result {
        Err(ApiError::Unauthorized(msg)) => assert!(msg.contains(why), "{msg:?} lacks {why:?}"),
        other => panic!("expected 401 ({why}), got {other:?}"),
    }
}

#[tokio::test]
async fn tokens_of_a_real_oidc_provider() {
    let Some(idp) = OidcProvider::start().await else {
        return;
    };
    // Its JWKS is served over http: refused unless allowed (development).
    let err = Authenticator::from_args(&idp.args(false), None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("https"), "{err}");
    let auth = Authenticator::from_args(&idp.args(true), None).unwrap();

    // RS256 and ES256 access tokens, with a verified email.
    for alg in ["RS256", "ES256"] {
        let token = idp.token("alice", &format!("urn:gpu-booking:{alg}")).await;
        assert!(kid(&token).starts_with(alg));
        let caller = auth.verify(&token).await.unwrap();
        assert_eq!(caller.user.as_str(), "alice@example.com");
        assert!(!caller.admin && !caller.service);
    }
    // Roles from the token.
    let root = auth
        .verify(&idp.token("root", "urn:gpu-booking:ES256").await)
        .await;
    assert!(root.unwrap().admin);
    // An unverified address is no identity: mallory is not alice.
    refused(
        auth.verify(&idp.token("mallory", "urn:gpu-booking:RS256").await)
            .await,
        "not verified",
    );
    // A token the same provider signed for another API.
    refused(
        auth.verify(&idp.token("alice", "urn:other-api:RS256").await)
            .await,
        "wrong audience",
    );
    // A 30-day token is past --max-token-lifetime (24 h by default).
    refused(
        auth.verify(&idp.token("alice", "urn:gpu-booking:long").await)
            .await,
        "lifetime",
    );
    // Another issuer with the same keys (a second realm, say).
    let mut other_issuer = idp.args(true);
    other_issuer.claims.jwt_issuer = Some(format!("{}/other-realm", idp.issuer));
    let other = Authenticator::from_args(&other_issuer, None).unwrap();
    refused(
        other
            .verify(&idp.token("alice", "urn:gpu-booking:RS256").await)
            .await,
        "wrong issuer",
    );
    // preferred_username as the user name claim.
    let mut by_name = idp.args(true);
    by_name.jwt_username_claim = "preferred_username".into();
    let by_name = Authenticator::from_args(&by_name, None).unwrap();
    let bob = by_name
        .verify(&idp.token("bob", "urn:gpu-booking:ES256").await)
        .await;
    assert_eq!(bob.unwrap().user.as_str(), "bob");
}

#[tokio::test]
async fn keys_rotated_by_a_real_oidc_provider_are_picked_up() {
    let Some(idp) = OidcProvider::start().await else {
        return;
    };
    // No rate limit on refetches here: that the new key id is fetched is the point
    // (the rate limit has its own tests in jwks.rs).
    let auth = Authenticator::new(
        None,
        Some(Oidc {
            jwks: JwksCache::with_options(
                idp.jwks_uri.clone(),
                JwksOptions {
                    min_refetch: Duration::ZERO,
                    ..JwksOptions::default()
                },
            )
            .unwrap(),
            issuer: idp.issuer.clone(),
            audience: AUDIENCE.into(),
            username_claim: "email".into(),
            max_lifetime: Duration::from_secs(3600),
        }),
    );
    let mut before = Vec::new();
    for alg in ["RS256", "ES256"] {
        let token = idp.token("alice", &format!("urn:gpu-booking:{alg}")).await;
        assert!(auth.verify(&token).await.is_ok());
        before.push(token);
    }
    idp.rotate().await;
    for (alg, old) in ["RS256", "ES256"].into_iter().zip(&before) {
        let token = idp.token("alice", &format!("urn:gpu-booking:{alg}")).await;
        assert_ne!(kid(&token), kid(old), "the provider signs with the new key");
        let caller = auth.verify(&token).await.unwrap();
        assert_eq!(caller.user.as_str(), "alice@example.com");
        // Tokens signed before the rotation stay valid while their key is published.
        assert!(auth.verify(old).await.is_ok());
    }
}
