//! OIDC tokens against a local JWKS server (axum on 127.0.0.1) that the tests make
//! slow, failing or rotating: the cache's single flight, negative cache and rate
//! limit (counted in fetches, never timed), and the claim checks on ES256 tokens:
//! issuer, audience, `nbf`, lifetime, verified email, the username claim.
//! The same checks against a real provider are in `oidc_provider.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use chrono::Utc;
use gpu_booking_api::auth::{Authenticator, Oidc};
use gpu_booking_api::config::{AuthArgs, JwtClaimArgs};
use gpu_booking_api::error::ApiError;
use gpu_booking_api::jwks::{JwksCache, JwksOptions};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

const ISSUER: &str = "https://sso.test/realms/lab";
const AUDIENCE: &str = "gpu-booking";

/// An ES256 key pair with its public JWK.
struct Signer {
    kid: String,
    key: EncodingKey,
    jwk: Value,
}

impl Signer {
    fn new(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw(); // 0x04 || x || y
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Signer {
            kid: kid.into(),
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
            jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                        "x": b64(&raw[1..33]), "y": b64(&raw[33..65])}),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        encode(&header, claims, &self.key).unwrap()
    }

    /// A token naming a key id the provider never published (signed with this key).
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        encode(&header, claims, &self.key).unwrap()
    }
}

/// Good claims for `email`, valid for an hour.
fn claims(email: &str) -> Value {
    let now = Utc::now().timestamp();
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "u-1", "email": email, "email_verified": true,
           "iat": now, "exp": now + 3600})
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Ok,
    Unavailable,
    /// Announce the request, then answer only when released.
    Gated,
}

/// The provider's JWKS endpoint, counting requests.
#[derive(Clone)]
struct Provider {
    keys: Arc<Mutex<Vec<Value>>>,
    mode: Arc<Mutex<Mode>>,
    requests: Arc<AtomicUsize>,
    started: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

async fn jwks(State(p): State<Provider>) -> Response {
    p.requests.fetch_add(1, Ordering::SeqCst);
    let mode = *p.mode.lock().unwrap();
    match mode {
        Mode::Unavailable => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Mode::Gated => {
            let _ = p.started.send(());
            p.release.notified().await;
        }
        Mode::Ok => {}
    }
    let keys = p.keys.lock().unwrap().clone();
    axum::Json(json!({ "keys": keys })).into_response()
}

struct Harness {
    provider: Provider,
    started: mpsc::UnboundedReceiver<()>,
    url: String,
}

impl Harness {
    async fn start(keys: Vec<Value>) -> Harness {
        let (tx, rx) = mpsc::unbounded_channel();
        let provider = Provider {
            keys: Arc::new(Mutex::new(keys)),
            mode: Arc::new(Mutex::new(Mode::Ok)),
            requests: Arc::new(AtomicUsize::new(0)),
            started: tx,
            release: Arc::new(Notify::new()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/certs", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/certs", get(jwks))
            .with_state(provider.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Harness {
            provider,
            started: rx,
            url,
        }
    }

    fn set_mode(&self, mode: Mode) {
        *self.provider.mode.lock().unwrap() = mode;
    }

    fn requests(&self) -> usize {
        self.provider.requests.load(Ordering::SeqCst)
    }

    fn auth(&self, options: JwksOptions) -> Authenticator {
        auth_with(&self.url, options, "email", Duration::from_secs(24 * 3600))
    }
}

fn auth_with(url: &str, options: JwksOptions, claim: &str, max: Duration) -> Authenticator {
    Authenticator::new(
        None,
        Some(Oidc {
            jwks: JwksCache::with_options(url.into(), options).unwrap(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            username_claim: claim.into(),
            max_lifetime: max,
        }),
    )
}

fn no_rate_limit() -> JwksOptions {
    JwksOptions {
        min_refetch: Duration::ZERO,
        negative_ttl: Duration::ZERO,
        ..JwksOptions::default()
    }
}

fn unauthorized_because(result: Result<impl std::fmt::Debug, ApiError>, why: &str) {
    match result {
        Err(ApiError::Unauthorized(msg)) => assert!(msg.contains(why), "{msg:?} lacks {why:?}"),
        other => panic!("expected 401 ({why}), got {other:?}"),
    }
}

#[tokio::test]
async fn a_flood_of_unknown_key_ids_against_a_failing_provider_fetches_once() {
    let signer = Signer::new("k1");
    let h = Harness::start(vec![signer.jwk.clone()]).await;
    h.set_mode(Mode::Unavailable);
    let auth = h.auth(JwksOptions::default());
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let auth = auth.clone();
            let token = signer.sign_as(&format!("bogus-{i}"), &claims("m@x.org"));
            tokio::spawn(async move { auth.verify(&token).await })
        })
        .collect();
    for t in tasks {
        unauthorized_because(t.await.unwrap(), "unknown key");
    }
    // And again, one by one.
    for i in 0..300 {
        let token = signer.sign_as(&format!("again-{i}"), &claims("m@x.org"));
        unauthorized_because(auth.verify(&token).await, "unknown key");
    }
    assert_eq!(
        h.requests(),
        1,
        "600 bogus tokens, one fetch (10 s rate limit)"
    );
}

#[tokio::test]
async fn unknown_key_ids_are_remembered_after_a_fetch_that_lacked_them() {
    let signer = Signer::new("k1");
    let h = Harness::start(vec![signer.jwk.clone()]).await;
    // No rate limit: only the negative cache stands between a repeated id and a fetch.
    let auth = h.auth(JwksOptions {
        min_refetch: Duration::ZERO,
        ..JwksOptions::default()
    });
    let token = signer.sign_as("bogus", &claims("m@x.org"));
    for _ in 0..50 {
        unauthorized_because(auth.verify(&token).await, "unknown key");
    }
    assert_eq!(h.requests(), 1);
}

#[tokio::test]
async fn concurrent_unknown_key_ids_share_the_fetch_in_flight() {
    let signer = Signer::new("k1");
    let mut h = Harness::start(vec![signer.jwk.clone()]).await;
    h.set_mode(Mode::Gated);
    // No rate limit and no negative cache: only the single flight bounds fetches.
    let auth = h.auth(no_rate_limit());
    let first = {
        let auth = auth.clone();
        let token = signer.sign_as("bogus-0", &claims("m@x.org"));
        tokio::spawn(async move { auth.verify(&token).await })
    };
    h.started.recv().await.unwrap();
    let waiting: Vec<_> = (1..100)
        .map(|i| {
            let auth = auth.clone();
            let token = signer.sign_as(&format!("bogus-{i}"), &claims("m@x.org"));
            tokio::spawn(async move { auth.verify(&token).await })
        })
        .collect();
    // Let every waiter reach the fetch lock before the fetch ends.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    h.provider.release.notify_waiters();
    unauthorized_because(first.await.unwrap(), "unknown key");
    h.set_mode(Mode::Ok);
    for t in waiting {
        unauthorized_because(t.await.unwrap(), "unknown key");
    }
    // Tasks that reached the lock during the fetch used its result; a task that
    // arrived after it (scheduling) may have fetched once more, never once each.
    assert!(h.requests() <= 3, "{} fetches for 100 tokens", h.requests());
}

#[tokio::test]
async fn known_keys_are_never_blocked_by_a_fetch_in_flight() {
    let signer = Signer::new("k1");
    let mut h = Harness::start(vec![signer.jwk.clone()]).await;
    let auth = h.auth(no_rate_limit());
    let good = signer.sign(&claims("alice@example.com"));
    assert_eq!(
        auth.verify(&good).await.unwrap().user.as_str(),
        "alice@example.com"
    );
    assert_eq!(h.requests(), 1);

    // A bogus key id starts a fetch that the provider holds until released.
    h.set_mode(Mode::Gated);
    let bogus = {
        let auth = auth.clone();
        let token = signer.sign_as("bogus", &claims("m@x.org"));
        tokio::spawn(async move { auth.verify(&token).await })
    };
    h.started.recv().await.unwrap();
    // While it is held, tokens with the known key id verify: if they waited for
    // the fetch they could never finish (the provider is only released below), so
    // the timeout is a hang guard, not a measurement.
    let known = async {
        for _ in 0..200 {
            assert!(auth.verify(&good).await.is_ok());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), known)
        .await
        .expect("a known key id waited for the fetch in flight");
    assert!(!bogus.is_finished(), "the fetch was still in flight");
    h.provider.release.notify_waiters();
    unauthorized_because(bogus.await.unwrap(), "unknown key");
    assert_eq!(h.requests(), 2);
}

#[tokio::test]
async fn known_keys_past_their_age_are_served_while_a_refetch_is_in_flight() {
    let signer = Signer::new("k1");
    let mut h = Harness::start(vec![signer.jwk.clone()]).await;
    // max_age zero: every use of a key wants a refetch.
    let auth = h.auth(JwksOptions {
        max_age: Duration::ZERO,
        ..no_rate_limit()
    });
    let good = signer.sign(&claims("alice@example.com"));
    assert!(auth.verify(&good).await.is_ok());
    h.set_mode(Mode::Gated);
    let refetch = {
        let auth = auth.clone();
        let good = good.clone();
        tokio::spawn(async move { auth.verify(&good).await })
    };
    h.started.recv().await.unwrap();
    let known = async {
        for _ in 0..50 {
            assert!(auth.verify(&good).await.is_ok());
        }
    };
    tokio::time::timeout(Duration::from_secs(30), known)
        .await
        .expect("a known key id waited for the refetch in flight");
    assert_eq!(
        h.requests(),
        2,
        "one refetch in flight, none started by the others"
    );
    h.provider.release.notify_waiters();
    assert!(refetch.await.unwrap().is_ok());
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_and_a_withdrawn_one_refused_after_refetch() {
    let old = Signer::new("k-old");
    let new = Signer::new("k-new");
    let h = Harness::start(vec![old.jwk.clone()]).await;
    let auth = h.auth(JwksOptions {
        min_refetch: Duration::ZERO,
        max_age: Duration::ZERO,
        ..JwksOptions::default()
    });
    assert!(auth.verify(&old.sign(&claims("a@x.org"))).await.is_ok());
    // The provider publishes the new key next to the old one, then signs with it.
    *h.provider.keys.lock().unwrap() = vec![new.jwk.clone(), old.jwk.clone()];
    assert!(auth.verify(&new.sign(&claims("a@x.org"))).await.is_ok());
    assert!(auth.verify(&old.sign(&claims("a@x.org"))).await.is_ok());
    // Then withdraws the old one: with max_age zero, every use refetches.
    *h.provider.keys.lock().unwrap() = vec![new.jwk.clone()];
    unauthorized_because(
        auth.verify(&old.sign(&claims("a@x.org"))).await,
        "unknown key",
    );
    assert!(auth.verify(&new.sign(&claims("a@x.org"))).await.is_ok());
}

#[tokio::test]
async fn claims_are_checked() {
    let signer = Signer::new("k1");
    let h = Harness::start(vec![signer.jwk.clone()]).await;
    let auth = auth_with(
        &h.url,
        JwksOptions::default(),
        "email",
        Duration::from_secs(24 * 3600),
    );
    let now = Utc::now().timestamp();
    let with = |patch: Value| {
        let mut c = claims("alice@example.com");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        signer.sign(&c)
    };
    let ok = auth.verify(&with(json!({}))).await.unwrap();
    assert_eq!(ok.user.as_str(), "alice@example.com");
    let ok = auth
        .verify(&with(json!({"email_verified": "true"})))
        .await
        .unwrap();
    assert_eq!(ok.user.as_str(), "alice@example.com");
    for (patch, why) in [
        (
            json!({"iss": "https://evil.test/realms/lab"}),
            "wrong issuer",
        ),
        (json!({"iss": null}), "missing claim iss"),
        (json!({"aud": "another-client"}), "wrong audience"),
        (json!({"aud": null}), "missing claim aud"),
        (json!({"exp": null}), "missing claim exp"),
        (json!({"exp": now - 3600, "iat": now - 7200}), "expired"),
        (json!({"nbf": now + 600}), "not valid yet"),
        (json!({"exp": now + 30 * 86_400}), "lifetime"),
        (json!({"iat": null, "exp": now + 30 * 86_400}), "lifetime"),
        (
            json!({"iat": now + 3600, "exp": now + 7200}),
            "issued in the future",
        ),
        (json!({"email_verified": false}), "not verified"),
        (json!({"email_verified": null}), "not verified"),
        (json!({"email_verified": "yes"}), "not verified"),
        (json!({"email": null}), "no email claim"),
    ] {
        unauthorized_because(auth.verify(&with(patch.clone())).await, why);
    }
    // A small clock skew is tolerated on nbf.
    assert!(auth.verify(&with(json!({"nbf": now + 5}))).await.is_ok());

    // Another username claim; email is then not looked at.
    let by_name = auth_with(
        &h.url,
        JwksOptions::default(),
        "preferred_username",
        Duration::from_secs(3600),
    );
    let c = with(json!({"preferred_username": "bob", "email_verified": false}));
    assert_eq!(by_name.verify(&c).await.unwrap().user.as_str(), "bob");
    unauthorized_because(
        by_name.verify(&with(json!({}))).await,
        "no preferred_username claim",
    );
}

#[tokio::test]
async fn oidc_settings_are_safe_by_default() {
    let args = |url: &str, issuer: Option<&str>, audience: Option<&str>, insecure: bool| AuthArgs {
        jwks_url: Some(url.into()),
        claims: JwtClaimArgs {
            jwt_issuer: issuer.map(Into::into),
            jwt_audience: audience.map(Into::into),
        },
        allow_insecure_jwks_url: insecure,
        ..AuthArgs::default()
    };
    let https = "https://sso.test/realms/lab/protocol/openid-connect/certs";
    let refused = |a: AuthArgs, why: &str| {
        let err = Authenticator::from_args(&a, None)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(why), "{err:?} lacks {why:?}");
    };
    refused(args(https, None, Some(AUDIENCE), false), "--jwt-issuer");
    refused(args(https, Some(ISSUER), None, false), "--jwt-audience");
    refused(
        args(https, Some(" "), Some(AUDIENCE), false),
        "--jwt-issuer",
    );
    refused(
        args("http://sso.test/certs", Some(ISSUER), Some(AUDIENCE), false),
        "https",
    );
    refused(
        args("file:///etc/passwd", Some(ISSUER), Some(AUDIENCE), true),
        "scheme",
    );
    refused(
        args("not a url", Some(ISSUER), Some(AUDIENCE), true),
        "not a URL",
    );
    assert!(
        Authenticator::from_args(&args(https, Some(ISSUER), Some(AUDIENCE), false), None).is_ok()
    );
    assert!(Authenticator::from_args(
        &args(
            "http://127.0.0.1:1/certs",
            Some(ISSUER),
            Some(AUDIENCE),
            true
        ),
        None
    )
    .is_ok());
}

#[tokio::test]
async fn hs256_tokens_honour_nbf() {
    let secret = b"jwks-test-secret-0123456789abcdefgh";
    let auth = Authenticator::new(Some(secret), None);
    let now = Utc::now().timestamp();
    let token = |c: Value| {
        encode(
            &Header::new(Algorithm::HS256),
            &c,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    };
    assert!(auth
        .verify(&token(json!({"sub": "a", "exp": now + 60})))
        .await
        .is_ok());
    unauthorized_because(
        auth.verify(&token(
            json!({"sub": "a", "exp": now + 7200, "nbf": now + 3600}),
        ))
        .await,
        "not valid yet",
    );
}
