//! A cached JWKS: keys fetched once, fetched again when a token names a key id
//! the cache does not know (the provider rotated its keys), at most every few
//! seconds so that forged key ids cannot make us hammer the provider.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::Mutex;

const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(10);
const MAX_AGE: Duration = Duration::from_secs(3600);

pub struct JwksCache {
    url: String,
    client: reqwest::Client,
    state: Mutex<Option<(JwkSet, Instant)>>,
}

impl JwksCache {
    pub fn new(url: String) -> JwksCache {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        JwksCache {
            url,
            client,
            state: Mutex::new(None),
        }
    }

    /// The key with this id, usable for `alg`, fetching the set again if needed.
    pub async fn key(&self, kid: &str, alg: Algorithm) -> Option<DecodingKey> {
        let mut state = self.state.lock().await;
        let fresh_enough = |fetched: &Instant, age: Duration| fetched.elapsed() < age;
        if let Some((set, fetched)) = state.as_ref() {
            if fresh_enough(fetched, MAX_AGE) {
                if let Some(key) = usable(set, kid, alg) {
                    return Some(key);
                }
            }
            if fresh_enough(fetched, REFETCH_AT_MOST_EVERY) {
                return None;
            }
        }
        match self.fetch().await {
            Ok(set) => {
                let key = usable(&set, kid, alg);
                *state = Some((set, Instant::now()));
                key
            }
            Err(e) => {
                tracing::warn!(url = %self.url, error = %e, "fetching the JWKS failed");
                // Keep serving the keys we had.
                state.as_ref().and_then(|(set, _)| usable(set, kid, alg))
            }
        }
    }

    async fn fetch(&self) -> anyhow::Result<JwkSet> {
        Ok(self
            .client
            .get(&self.url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }
}

fn usable(set: &JwkSet, kid: &str, alg: Algorithm) -> Option<DecodingKey> {
    let jwk = set.find(kid)?;
    // A key published for one algorithm family must not verify another.
    let family_ok = matches!(
        (&jwk.algorithm, alg),
        (
            jsonwebtoken::jwk::AlgorithmParameters::RSA(_),
            Algorithm::RS256
        ) | (
            jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_),
            Algorithm::ES256
        )
    );
    if !family_ok {
        return None;
    }
    DecodingKey::from_jwk(jwk).ok()
}
