//! `gpu-booking bootstrap`: the release's generated secrets, made once and kept, so that
//! `helm install` needs no Secret made by hand.
//!
//! The chart runs it as a pre-install/pre-upgrade hook Job when no existing Secret is
//! named. It reads the Secret, adds only what is missing and writes with optimistic
//! concurrency (create, or replace at the version read), like the TLS bootstrap; a
//! value it finds is never re-rolled, so an upgrade keeps the JWT key and the database
//! password (a template's `randAlphaNum` would change them on every render). Keys the
//! operator added stay as they are.
//!
//! What it keeps ([`plan`] decides, without I/O):
//!
//! - the HS256 JWT key (random);
//! - the service token, an HS256 JWT with the `service` role minted with that key
//!   (minted again when the key itself is new, the token is missing, or it expires
//!   within `--service-token-renew-before`: the chart runs this command on a schedule
//!   too, so that the token is rotated well before it expires; the components re-read
//!   it from its file when the Secret changes);
//! - with `--database-host` (the embedded Postgres): its password (random) and the
//!   URL the API connects with, derived from the password and the options, so that
//!   changed options (port, user) give a matching URL on the next upgrade.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;
use rand::distr::{Alphanumeric, SampleString};

use crate::error::Error;
use gpu_booking_core::jwt::JwtClaimArgs;
use gpu_booking_process::LogArgs;

/// The field manager named in our writes.
pub const MANAGER: &str = "gpu-booking-bootstrap";

/// The longest life of the service token: a leaked one is refused within this, and
/// the scheduled run mints the next before it ends.
pub const MAX_SERVICE_TOKEN_TTL: chrono::TimeDelta = chrono::TimeDelta::days(90);

/// Length of the generated JWT key and database password: alphanumeric, so about 5.95
/// bits a character (381 and 190 bits), and nothing to escape in a URL.
pub const JWT_SECRET_LEN: usize = 64;
pub const PASSWORD_LEN: usize = 32;

/// Options of `gpu-booking bootstrap`; each also reads `GPU_BOOKING_BOOTSTRAP_*`.
#[derive(Debug, Clone, Args)]
pub struct BootstrapArgs {
    /// Namespace of the Secret (default: the pod's own, or the kubeconfig's).
    #[arg(long, env = "GPU_BOOKING_BOOTSTRAP_NAMESPACE")]
    pub namespace: Option<String>,
    /// The Secret to create or complete.
    #[arg(long, env = "GPU_BOOKING_BOOTSTRAP_SECRET")]
    pub secret: String,
    /// Key of the HS256 JWT key.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_JWT_SECRET_KEY",
        default_value = "jwt-secret"
    )]
    pub jwt_secret_key: String,
    /// Key of the service token (empty: none is minted).
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_KEY",
        default_value = "service-token"
    )]
    pub service_token_key: String,
    /// The user (`sub`) the service token names.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_SERVICE_USER",
        default_value = "gpu-booking-service"
    )]
    pub service_user: String,
    /// Lifetime of the service token (ServiceAccount tokens are the way to avoid a
    /// long-lived one; see docs/deploy.md).
    #[arg(long, env = "GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_TTL", default_value = "90days", value_parser = crate::config::parse_time_delta)]
    pub service_token_ttl: chrono::TimeDelta,
    /// Mint the service token again when it expires within this (a token that is not
    /// a JWT with an `exp`, e.g. one an operator put there, is kept as it is).
    #[arg(long, env = "GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_RENEW_BEFORE", default_value = "30days", value_parser = crate::config::parse_time_delta)]
    pub service_token_renew_before: chrono::TimeDelta,
    // `--jwt-issuer`, `--jwt-audience`: the service token's `iss` and `aud`, where
    // the API requires them (the API's own options).
    #[command(flatten)]
    pub claims: JwtClaimArgs,
    /// Host of the embedded Postgres; set, the password and URL keys are kept too.
    #[arg(long, env = "GPU_BOOKING_BOOTSTRAP_DATABASE_HOST")]
    pub database_host: Option<String>,
    /// Port of the embedded Postgres.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_DATABASE_PORT",
        default_value_t = 5432
    )]
    pub database_port: u16,
    /// Database user of the embedded Postgres.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_DATABASE_USER",
        default_value = "gpu_booking"
    )]
    pub database_user: String,
    /// Database name of the embedded Postgres.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_DATABASE_NAME",
        default_value = "gpu_booking"
    )]
    pub database_name: String,
    /// Key of the database password.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_PASSWORD_KEY",
        default_value = "postgres-password"
    )]
    pub password_key: String,
    /// Key of the database URL.
    #[arg(
        long,
        env = "GPU_BOOKING_BOOTSTRAP_DATABASE_URL_KEY",
        default_value = "database-url"
    )]
    pub database_url_key: String,
    // `--log-format`.
    #[command(flatten)]
    pub log: LogArgs,
}

/// What the Secret must hold, as [`plan`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub jwt_secret_key: String,
    /// Empty: no service token.
    pub service_token_key: String,
    pub database: Option<Database>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Database {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub name: String,
    pub password_key: String,
    pub url_key: String,
}

impl Database {
    pub fn url(&self, password: &str) -> String {
        format!(
            "postgres://{}:{password}@{}:{}/{}",
            self.user, self.host, self.port, self.name
        )
    }
}

impl BootstrapArgs {
    pub fn spec(&self) -> Result<Spec, Error> {
        if self.service_token_ttl <= chrono::TimeDelta::zero()
            || self.service_token_ttl > MAX_SERVICE_TOKEN_TTL
        {
            return Err(Error::Config(format!(
                "the service token's lifetime must be more than 0 and at most {} days",
                MAX_SERVICE_TOKEN_TTL.num_days()
            )));
        }
        if self.service_token_renew_before <= chrono::TimeDelta::zero()
            || self.service_token_renew_before >= self.service_token_ttl
        {
            return Err(Error::Config(
                "--service-token-renew-before must be more than 0 and less than the token's lifetime (else every run mints it again)".into(),
            ));
        }
        let key_ok = |k: &str| {
            !k.is_empty()
                && k.len() <= 253
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        let mut keys = vec![self.jwt_secret_key.as_str()];
        if !self.service_token_key.is_empty() {
            keys.push(&self.service_token_key);
        }
        let database = self.database_host.as_ref().map(|host| Database {
            host: host.clone(),
            port: self.database_port,
            user: self.database_user.clone(),
            name: self.database_name.clone(),
            password_key: self.password_key.clone(),
            url_key: self.database_url_key.clone(),
        });
        if let Some(db) = &database {
            keys.push(&db.password_key);
            keys.push(&db.url_key);
            let ident_ok =
                |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ident_ok(&db.user) || !ident_ok(&db.name) || db.host.is_empty() {
                return Err(Error::Config(
                    "the database host must be set, and its user and name be letters, digits and _"
                        .into(),
                ));
            }
        }
        if let Some(bad) = keys.iter().find(|k| !key_ok(k)) {
            return Err(Error::Config(format!(
                "{bad:?} is not a valid Secret key (letters, digits, -, _ and .)"
            )));
        }
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        if unique.len() != keys.len() {
            return Err(Error::Config(format!("Secret keys must differ: {keys:?}")));
        }
        Ok(Spec {
            jwt_secret_key: self.jwt_secret_key.clone(),
            service_token_key: self.service_token_key.clone(),
            database,
        })
    }
}

/// The entries to write (new or changed) so that the Secret holding `existing` meets
/// `spec`; empty when it does. `random(n)` gives n random alphanumeric characters;
/// `mint(key)` mints the service token with the JWT key.
pub fn plan(
    existing: &BTreeMap<String, Vec<u8>>,
    spec: &Spec,
    random: &mut dyn FnMut(usize) -> String,
    mint: &dyn Fn(&[u8]) -> anyhow::Result<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    // A key shorter than the API accepts (32 bytes) is as good as missing.
    let jwt = match existing.get(&spec.jwt_secret_key) {
        Some(v) if v.len() >= 32 => v.clone(),
        _ => {
            let new = random(JWT_SECRET_LEN);
            out.insert(spec.jwt_secret_key.clone(), new.clone());
            new.into_bytes()
        }
    };
    let jwt_is_new = out.contains_key(&spec.jwt_secret_key);
    if !spec.service_token_key.is_empty()
        && (jwt_is_new || !existing.contains_key(&spec.service_token_key))
    {
        // A token minted with a key that is gone would be refused: mint it again.
        let token = mint(&jwt).context("minting the service token")?;
        out.insert(spec.service_token_key.clone(), token);
    }
    if let Some(db) = &spec.database {
        let password = match existing
            .get(&db.password_key)
            .and_then(|v| String::from_utf8(v.clone()).ok())
        {
            // Postgres took this password at initdb: it is never changed here.
            Some(p) if !p.is_empty() => p,
            _ => {
                let new = random(PASSWORD_LEN);
                out.insert(db.password_key.clone(), new.clone());
                new
            }
        };
        let url = db.url(&password);
        if existing.get(&db.url_key).map(Vec::as_slice) != Some(url.as_bytes()) {
            out.insert(db.url_key.clone(), url);
        }
    }
    Ok(out)
}

/// Whether `token` is a JWT whose `exp` falls before `now + renew_before` (expired
/// ones included). The payload is read, not verified: the key that signed it is ours,
/// and a token we cannot read is not ours to rotate.
pub fn token_due(
    token: &[u8],
    now: chrono::DateTime<chrono::Utc>,
    renew_before: chrono::TimeDelta,
) -> bool {
    use base64::Engine as _;
    let exp = std::str::from_utf8(token)
        .ok()
        .and_then(|t| t.trim().split('.').nth(1))
        .and_then(|payload| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload.trim_end_matches('='))
                .ok()
        })
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
        .and_then(|claims| claims.get("exp").and_then(serde_json::Value::as_i64));
    exp.and_then(|exp| chrono::DateTime::from_timestamp(exp, 0))
        .is_some_and(|exp| exp < now + renew_before)
}

/// What [`run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Keys written (names only: never their values).
    pub written: Vec<String>,
    pub created: bool,
}

/// Creates or completes the Secret; retried on a concurrent write.
pub async fn run(
    client: kube::Client,
    namespace: &str,
    args: &BootstrapArgs,
    mint: &dyn Fn(&[u8]) -> anyhow::Result<String>,
) -> anyhow::Result<Report> {
    let spec = args.spec()?;
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let report = crate::retry_on_conflict(|| async {
        let current = api.get_opt(&args.secret).await?;
        let mut existing: BTreeMap<String, Vec<u8>> = current
            .as_ref()
            .and_then(|s| s.data.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        // A token due for renewal is minted again as if it were missing.
        if existing.get(&spec.service_token_key).is_some_and(|token| {
            token_due(token, chrono::Utc::now(), args.service_token_renew_before)
        }) {
            existing.remove(&spec.service_token_key);
        }
        let mut random = |n: usize| Alphanumeric.sample_string(&mut rand::rng(), n);
        let additions = plan(&existing, &spec, &mut random, mint)
            .map_err(|e| Error::Internal(format!("{e:#}")))?;
        let written: Vec<String> = additions.keys().cloned().collect();
        if additions.is_empty() {
            return Ok(Report {
                written,
                created: false,
            });
        }
        let pp = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        let result = match current {
            Some(mut secret) => {
                // Replace at the version read (kept in metadata): a concurrent
                // writer makes this a 409, and we read again.
                let data = secret.data.get_or_insert_with(BTreeMap::new);
                for (k, v) in additions {
                    data.insert(k, ByteString(v.into_bytes()));
                }
                secret.metadata.managed_fields = None;
                api.replace(&args.secret, &pp, &secret).await.map(|_| false)
            }
            None => {
                let mut secret = Secret {
                    type_: Some("Opaque".into()),
                    data: Some(
                        additions
                            .into_iter()
                            .map(|(k, v)| (k, ByteString(v.into_bytes())))
                            .collect(),
                    ),
                    ..Secret::default()
                };
                secret.metadata.name = Some(args.secret.clone());
                secret.metadata.namespace = Some(namespace.to_owned());
                secret.metadata.labels = Some(BTreeMap::from([
                    (
                        "app.kubernetes.io/managed-by".to_owned(),
                        MANAGER.to_owned(),
                    ),
                    (
                        "app.kubernetes.io/part-of".to_owned(),
                        "gpu-booking".to_owned(),
                    ),
                ]));
                api.create(&pp, &secret).await.map(|_| true)
            }
        };
        match result {
            Ok(created) => Ok(Report { written, created }),
            Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Conflict(format!(
                "Secret {namespace}/{} changed while we wrote it ({})",
                args.secret, e.reason
            ))),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    Ok(report)
}

/// `gpu-booking bootstrap`: connect (in-cluster or kubeconfig), then [`run`].
pub async fn main(
    args: BootstrapArgs,
    mint: &dyn Fn(&[u8]) -> anyhow::Result<String>,
) -> anyhow::Result<()> {
    args.log.init();
    let (client, namespace) =
        gpu_booking_process::kube_client::connect(args.namespace.as_deref()).await?;
    let report = run(client, &namespace, &args, mint).await?;
    tracing::info!(
        namespace = %namespace,
        secret = %args.secret,
        created = report.created,
        written = ?report.written,
        "generated secrets in place"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(db: bool) -> Spec {
        Spec {
            jwt_secret_key: "jwt-secret".into(),
            service_token_key: "service-token".into(),
            database: db.then(|| Database {
                host: "rel-postgres".into(),
                port: 5432,
                user: "gpu_booking".into(),
                name: "gpu_booking".into(),
                password_key: "postgres-password".into(),
                url_key: "database-url".into(),
            }),
        }
    }

    fn counter() -> impl FnMut(usize) -> String {
        let mut n = 0;
        move |len| {
            n += 1;
            format!("{n}").repeat(len)
        }
    }

    fn mint(key: &[u8]) -> anyhow::Result<String> {
        Ok(format!("token-of-{}", String::from_utf8_lossy(&key[..3])))
    }

    fn bytes(m: &BTreeMap<String, String>) -> BTreeMap<String, Vec<u8>> {
        m.iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect()
    }

    #[test]
    fn an_empty_secret_gets_everything() {
        let out = plan(&BTreeMap::new(), &spec(true), &mut counter(), &mint).unwrap();
        assert_eq!(out["jwt-secret"], "1".repeat(64));
        assert_eq!(out["service-token"], "token-of-111");
        assert_eq!(out["postgres-password"], "2".repeat(32));
        assert_eq!(
            out["database-url"],
            format!(
                "postgres://gpu_booking:{}@rel-postgres:5432/gpu_booking",
                "2".repeat(32)
            )
        );
    }

    #[test]
    fn a_second_run_changes_nothing() {
        let first = plan(&BTreeMap::new(), &spec(true), &mut counter(), &mint).unwrap();
        let again = plan(&bytes(&first), &spec(true), &mut counter(), &mint).unwrap();
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn values_found_are_kept_and_only_the_missing_ones_made() {
        let mut existing =
            bytes(&plan(&BTreeMap::new(), &spec(true), &mut counter(), &mint).unwrap());
        existing.remove("service-token");
        existing.remove("database-url");
        existing.insert("operator-extra".into(), vec![0xff]);
        let out = plan(
            &existing,
            &spec(true),
            &mut |_| panic!("nothing random"),
            &mint,
        )
        .unwrap();
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["database-url", "service-token"]
        );
        assert!(out["database-url"].contains(&"2".repeat(32)));
    }

    #[test]
    fn a_new_jwt_key_gets_a_new_service_token_and_a_moved_database_a_new_url() {
        let mut existing =
            bytes(&plan(&BTreeMap::new(), &spec(true), &mut counter(), &mint).unwrap());
        existing.insert("jwt-secret".into(), b"short".to_vec());
        let mut moved = spec(true);
        moved.database.as_mut().unwrap().port = 6432;
        let out = plan(&existing, &moved, &mut |n| "9".repeat(n), &mint).unwrap();
        assert_eq!(out["jwt-secret"], "9".repeat(64));
        assert_eq!(out["service-token"], "token-of-999");
        assert!(out["database-url"].contains(":6432/"));
        assert!(
            !out.contains_key("postgres-password"),
            "the password is never re-rolled"
        );
    }

    #[test]
    fn a_token_is_due_when_it_expires_within_the_renewal_window() {
        use base64::Engine as _;
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let jwt = |claims: serde_json::Value| {
            let b64 = |v: &serde_json::Value| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
            };
            format!(
                "{}.{}.sig",
                b64(&serde_json::json!({"alg": "HS256"})),
                b64(&claims)
            )
        };
        let days = chrono::TimeDelta::days;
        let exp_in =
            |d: i64| jwt(serde_json::json!({"sub": "svc", "exp": (now + days(d)).timestamp()}));
        assert!(!token_due(exp_in(31).as_bytes(), now, days(30)));
        assert!(token_due(exp_in(29).as_bytes(), now, days(30)));
        assert!(token_due(exp_in(-1).as_bytes(), now, days(30)), "expired");
        // Not ours to rotate: no JWT, no `exp`.
        assert!(!token_due(b"an-operators-opaque-token", now, days(30)));
        assert!(!token_due(
            jwt(serde_json::json!({"sub": "svc"})).as_bytes(),
            now,
            days(30)
        ));
    }

    #[test]
    fn without_a_database_only_the_jwt_keys() {
        let out = plan(&BTreeMap::new(), &spec(false), &mut counter(), &mint).unwrap();
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["jwt-secret", "service-token"]
        );
    }
}
