//! `gpu-booking bootstrap` against the fake API server (the simulated cluster's): the
//! first run creates the Secret, a second run (`helm upgrade`) writes nothing and keeps
//! every value, an operator's values win, and a Secret missing one key gets only that.

use std::collections::BTreeMap;

use clap::Parser;
use gpu_booking_certs::bootstrap::{self, BootstrapArgs};
use gpu_booking_fake_apiserver::{FakeApiServer, Verb};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;

const NS: &str = "gpu-booking";
const SECRET: &str = "gpu-booking-secrets";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BootstrapArgs,
}

fn args(extra: &[&str]) -> BootstrapArgs {
    let all = ["bootstrap", "--secret", SECRET]
        .into_iter()
        .chain(extra.iter().copied());
    Cli::try_parse_from(all).unwrap().args
}

fn mint(key: &[u8]) -> anyhow::Result<String> {
    Ok(format!("minted-with-{}", key.len()))
}

fn data(server: &FakeApiServer) -> BTreeMap<String, String> {
    let secret: Secret = server.get(Some(NS), SECRET).expect("the Secret");
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

fn writes(server: &FakeApiServer) -> u64 {
    server.count_verb(Verb::Create)
        + server.count_verb(Verb::Update)
        + server.count_verb(Verb::Patch)
}

#[tokio::test]
async fn first_run_creates_everything_and_the_next_keeps_it() {
    let server = FakeApiServer::new();
    let args = args(&["--database-host", "rel-postgres"]);
    let report = bootstrap::run(server.client(), NS, &args, &mint)
        .await
        .unwrap();
    assert!(report.created);
    assert_eq!(
        report.written,
        [
            "database-url",
            "jwt-secret",
            "postgres-password",
            "service-token"
        ]
    );
    let first = data(&server);
    assert_eq!(first["jwt-secret"].len(), 64);
    assert_eq!(first["service-token"], "minted-with-64");
    let password = &first["postgres-password"];
    assert_eq!(password.len(), 32);
    assert!(password.chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(
        first["database-url"],
        format!("postgres://gpu_booking:{password}@rel-postgres:5432/gpu_booking")
    );

    // helm upgrade: the hook runs again.
    let before = writes(&server);
    let report = bootstrap::run(server.client(), NS, &args, &mint)
        .await
        .unwrap();
    assert!(!report.created && report.written.is_empty());
    assert_eq!(writes(&server), before, "nothing written");
    assert_eq!(data(&server), first);

    // A second release's run generates other values (nothing fixed in the code).
    let other = FakeApiServer::new();
    bootstrap::run(other.client(), NS, &args, &mint)
        .await
        .unwrap();
    assert_ne!(data(&other)["jwt-secret"], first["jwt-secret"]);
    assert_ne!(
        data(&other)["postgres-password"],
        first["postgres-password"]
    );
}

#[tokio::test]
async fn an_operators_values_win_and_only_the_missing_key_is_added() {
    let server = FakeApiServer::new();
    let mut secret = Secret {
        data: Some(BTreeMap::from([
            (
                "jwt-secret".to_owned(),
                ByteString(b"operator-chosen-key-of-at-least-32-bytes".to_vec()),
            ),
            (
                "service-token".to_owned(),
                ByteString(b"operator-token".to_vec()),
            ),
            ("other".to_owned(), ByteString(vec![0xff, 0x00])),
        ])),
        ..Secret::default()
    };
    secret.metadata.name = Some(SECRET.into());
    secret.metadata.namespace = Some(NS.into());
    server.put(&secret);
    let report = bootstrap::run(server.client(), NS, &args(&[]), &mint)
        .await
        .unwrap();
    assert!(!report.created);
    assert!(report.written.is_empty(), "{:?}", report.written);

    // The database keys asked for later (a switch to the embedded Postgres) are added,
    // and nothing else changes.
    let report = bootstrap::run(
        server.client(),
        NS,
        &args(&["--database-host", "db"]),
        &mint,
    )
    .await
    .unwrap();
    assert_eq!(report.written, ["database-url", "postgres-password"]);
    let stored: Secret = server.get(Some(NS), SECRET).unwrap();
    let stored = stored.data.unwrap();
    assert_eq!(
        stored["jwt-secret"].0,
        b"operator-chosen-key-of-at-least-32-bytes"
    );
    assert_eq!(stored["service-token"].0, b"operator-token");
    assert_eq!(stored["other"].0, vec![0xff, 0x00]);
}

#[tokio::test]
async fn bad_options_are_refused_before_anything_is_written() {
    let server = FakeApiServer::new();
    for bad in [
        args(&["--jwt-secret-key", "a/b"]),
        args(&["--service-token-key", "jwt-secret"]),
        args(&["--database-host", "db", "--database-user", "x;drop"]),
        args(&["--service-token-ttl", "3650days"]),
        args(&[
            "--service-token-ttl",
            "30days",
            "--service-token-renew-before",
            "30days",
        ]),
    ] {
        let err = bootstrap::run(server.client(), NS, &bad, &mint)
            .await
            .unwrap_err();
        assert!(!format!("{err:#}").is_empty());
    }
    assert_eq!(writes(&server), 0);
}

/// A service token as the bootstrap mints it: a JWT whose `exp` is `days` from now.
fn token_expiring_in(days: i64) -> String {
    use base64::Engine as _;
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let exp = (chrono::Utc::now() + chrono::TimeDelta::days(days)).timestamp();
    format!(
        "{}.{}.signature",
        b64(serde_json::json!({"alg": "HS256", "typ": "JWT"})),
        b64(serde_json::json!({"sub": "gpu-booking-service", "role": "service", "exp": exp}))
    )
}

/// The scheduled run (the chart's rotation CronJob): a service token that expires
/// within `--service-token-renew-before` is minted again with the same key; one that
/// does not, and every other value, stay as they are.
#[tokio::test]
async fn a_service_token_near_its_end_is_minted_again_and_nothing_else() {
    for (days, renewed) in [(10, true), (60, false), (-1, true)] {
        let server = FakeApiServer::new();
        let args = args(&["--service-token-renew-before", "30days"]);
        bootstrap::run(server.client(), NS, &args, &mint)
            .await
            .unwrap();
        let mut secret: Secret = server.get(Some(NS), SECRET).unwrap();
        let old = token_expiring_in(days);
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("service-token".into(), ByteString(old.clone().into_bytes()));
        server.put_value("secrets", serde_json::to_value(&secret).unwrap());
        let before = data(&server);

        let report = bootstrap::run(server.client(), NS, &args, &mint)
            .await
            .unwrap();
        let after = data(&server);
        assert_eq!(after["jwt-secret"], before["jwt-secret"], "the key stays");
        if renewed {
            assert_eq!(report.written, ["service-token"], "{days} days left");
            assert_eq!(after["service-token"], "minted-with-64");
        } else {
            assert!(report.written.is_empty(), "{days} days left: {report:?}");
            assert_eq!(after["service-token"], old);
        }
    }
}
