//! The OIDC provider's signing keys (JWKS), cached.
//!
//! A token naming a key id we do not know may mean the provider rotated its keys, so
//! it may trigger a refetch; but anyone can send tokens with made-up key ids, and a
//! slow or failing provider must not turn them into a stall or a flood. So:
//!
//! - tokens whose key id is in the cache are verified from a snapshot taken under a
//!   short, synchronous read lock: nothing they touch is ever held across a fetch
//!   (keys past `max_age` are refetched, but while that fetch is in flight they are
//!   still served, never waited for);
//! - one fetch at a time (single-flight): callers that arrive while a fetch is in
//!   flight wait for it and use its result instead of starting their own;
//! - at most one fetch per `min_refetch` (successful or not), and
//! - a negative cache: a key id that a fetch did not bring is refused without any
//!   fetch for `negative_ttl`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};

/// How the cache refreshes; [`JwksOptions::default`] is what the service uses.
#[derive(Debug, Clone)]
pub struct JwksOptions {
    /// Keys older than this are fetched again before use (keys the provider
    /// withdrew stop being accepted).
    pub max_age: Duration,
    /// Fetches (for unknown key ids or stale keys) happen at most this often.
    pub min_refetch: Duration,
    /// An unknown key id is refused without a fetch for this long.
    pub negative_ttl: Duration,
    /// Timeout of one fetch.
    pub timeout: Duration,
}

impl Default for JwksOptions {
    fn default() -> Self {
        JwksOptions {
            max_age: Duration::from_secs(3600),
            min_refetch: Duration::from_secs(10),
            negative_ttl: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Most unknown key ids remembered; beyond that the oldest half is dropped, so that
/// a stream of made-up ids cannot grow memory.
const NEGATIVE_CACHE_MAX: usize = 4096;

pub struct JwksCache {
    url: String,
    client: reqwest::Client,
    options: JwksOptions,
    /// The keys as last fetched. A std lock, held only to clone the `Arc`.
    keys: RwLock<Option<Arc<Snapshot>>>,
    /// Held by the one fetch in flight.
    fetching: tokio::sync::Mutex<()>,
    /// Completed fetch attempts, so that a caller that waited for the lock can tell
    /// that a fetch happened meanwhile and use it instead of fetching again.
    attempts: AtomicU64,
    /// When the last fetch attempt started (successful or not), for the rate limit.
    last_attempt: Mutex<Option<Instant>>,
    /// Key ids a fetch did not bring, and when.
    unknown: Mutex<HashMap<String, Instant>>,
}

struct Snapshot {
    set: JwkSet,
    fetched: Instant,
}

impl JwksCache {
    pub fn new(url: String) -> anyhow::Result<JwksCache> {
        JwksCache::with_options(url, JwksOptions::default())
    }

    pub fn with_options(url: String, options: JwksOptions) -> anyhow::Result<JwksCache> {
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .build()?;
        Ok(JwksCache {
            url,
            client,
            options,
            keys: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
            attempts: AtomicU64::new(0),
            last_attempt: Mutex::new(None),
            unknown: Mutex::new(HashMap::new()),
        })
    }

    /// The key with this id, usable for `alg`, fetching the set again if allowed.
    pub async fn key(&self, kid: &str, alg: Algorithm) -> Option<DecodingKey> {
        if let Some(found) = self.cached(kid, alg, false) {
            return found;
        }
        if self.known_unknown(kid) {
            return None;
        }
        let started = Instant::now();
        // Single flight: wait for the fetch in flight, if any. Only callers that
        // need a fetch get here; cached keys never wait on this lock.
        let seen = self.attempts.load(Ordering::Acquire);
        let guard = match self.fetching.try_lock() {
            Ok(guard) => guard,
            // A fetch is in flight. A key id we hold, if only in keys past their
            // age, is served as it is rather than waiting for it.
            Err(_) => match self.cached(kid, alg, true) {
                Some(stale) => return stale,
                None => self.fetching.lock().await,
            },
        };
        if self.attempts.load(Ordering::Acquire) == seen && self.may_fetch() {
            self.refresh().await;
            self.attempts.fetch_add(1, Ordering::Release);
        }
        drop(guard);
        // Stale keys are still served when no fresh set could be had: refusing
        // every sign-in while the provider is down would not be safer.
        let found = self.cached(kid, alg, true).flatten();
        // Remembered as unknown only if a set fetched since this call began lacks
        // it: an id refused by the rate limit alone was never checked.
        if found.is_none() && self.fetched_since(started) {
            self.remember_unknown(kid);
        }
        found
    }

    /// `Some(key or None)` when the cache can answer without a fetch: the key id is
    /// in fresh keys (or in any keys, with `stale_ok`), usable for `alg` or not.
    /// `None` when a fetch could help.
    fn cached(&self, kid: &str, alg: Algorithm, stale_ok: bool) -> Option<Option<DecodingKey>> {
        let snapshot = self.keys.read().ok()?.clone()?;
        let jwk = snapshot.set.find(kid)?;
        if !stale_ok && snapshot.fetched.elapsed() >= self.options.max_age {
            return None;
        }
        Some(usable(jwk, alg))
    }

    fn fetched_since(&self, t: Instant) -> bool {
        self.keys
            .read()
            .ok()
            .and_then(|k| k.as_ref().map(|s| s.fetched >= t))
            .unwrap_or(false)
    }

    fn known_unknown(&self, kid: &str) -> bool {
        let Ok(unknown) = self.unknown.lock() else {
            return false;
        };
        unknown
            .get(kid)
            .is_some_and(|at| at.elapsed() < self.options.negative_ttl)
    }

    fn remember_unknown(&self, kid: &str) {
        let Ok(mut unknown) = self.unknown.lock() else {
            return;
        };
        if unknown.len() >= NEGATIVE_CACHE_MAX {
            let ttl = self.options.negative_ttl;
            unknown.retain(|_, at| at.elapsed() < ttl);
            if unknown.len() >= NEGATIVE_CACHE_MAX {
                unknown.clear();
            }
        }
        unknown.insert(kid.to_owned(), Instant::now());
    }

    /// The rate limit: claims the next attempt if the last one is old enough.
    fn may_fetch(&self) -> bool {
        let Ok(mut last) = self.last_attempt.lock() else {
            return false;
        };
        if last.is_some_and(|at| at.elapsed() < self.options.min_refetch) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    async fn refresh(&self) {
        match self.fetch().await {
            Ok(set) => {
                let snapshot = Arc::new(Snapshot {
                    set,
                    fetched: Instant::now(),
                });
                if let Ok(mut keys) = self.keys.write() {
                    *keys = Some(snapshot);
                }
                // Ids refused before may be in the new set.
                if let Ok(mut unknown) = self.unknown.lock() {
                    unknown.clear();
                }
            }
            Err(e) => tracing::warn!(url = %self.url, error = %e, "fetching the JWKS failed"),
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

fn usable(jwk: &jsonwebtoken::jwk::Jwk, alg: Algorithm) -> Option<DecodingKey> {
    // A key published for one algorithm family must not verify another.
    let family_ok = matches!(
        (&jwk.algorithm, alg),
        (AlgorithmParameters::RSA(_), Algorithm::RS256)
            | (AlgorithmParameters::EllipticCurve(_), Algorithm::ES256)
    );
    if !family_ok {
        return None;
    }
    DecodingKey::from_jwk(jwk).ok()
}
