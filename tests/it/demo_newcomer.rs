//! The demo a newcomer can follow, on the real binary and the
//! Postgres on 127.0.0.1:5432: `demo --fresh` starts from an empty database and says
//! so; each sample review reaches its outcome (booked, lent, stripped); a token for
//! any user can be minted with the printed command and through the page's user picker
//! (`/demo/sign-in`, which `gpu-booking api` does not serve); the piped log has no colour
//! codes. And `gpu-booking token` lists only options it honours, and its issuer and
//! audience satisfy an API that requires them.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

use crate::common::ports::free_addr;

const BIN: &str = env!("CARGO_BIN_EXE_gpu-booking");
const ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

async fn admin_pool() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(ADMIN_URL)
        .await
        .expect("the Postgres on 127.0.0.1:5432")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_starts_fresh_and_reaches_every_outcome() {
    let db = format!("gpu_booking_demo_test_{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("gpu-booking-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    // Data of an earlier run, which --fresh must drop.
    let admin = admin_pool().await;
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .expect("creating the old demo database");
    let old = sqlx::PgPool::connect(&format!("postgres://postgres@127.0.0.1:5432/{db}"))
        .await
        .expect("the old database");
    sqlx::query("CREATE TABLE left_from_an_earlier_run (x int)")
        .execute(&old)
        .await
        .expect("a marker");
    old.close().await;

    let (api, webhook, webhook_admin) = (free_addr(), free_addr(), free_addr());
    let apiserver = free_addr();
    let mut demo = Command::new(BIN)
        .args([
            "demo".to_string(),
            "--fresh".into(),
            format!("--listen={api}"),
            format!("--webhook-listen={webhook}"),
            format!("--webhook-admin-listen={webhook_admin}"),
            format!("--apiserver-listen={apiserver}"),
            format!("--cert-dir={}", dir.display()),
            format!("--demo-database={db}"),
        ])
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the demo");
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().expect("stdout")).lines();
    let mut printed = String::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("the demo did not finish starting")
            .expect("reading its output")
            .unwrap_or_else(|| panic!("the demo exited:\n{printed}"));
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("Ctrl-C stops it") {
            break;
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(
        !printed.contains('\u{1b}'),
        "colour codes in a piped log:\n{printed}"
    );
    assert!(
        printed.contains("dropped and recreated: --fresh"),
        "{printed}"
    );
    let demo_db = sqlx::PgPool::connect(&format!("postgres://postgres@127.0.0.1:5432/{db}"))
        .await
        .expect("the demo database");
    let marker: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('left_from_an_earlier_run')::text")
            .fetch_one(&demo_db)
            .await
            .expect("a query");
    assert_eq!(marker, None, "--fresh kept the earlier run's data");
    demo_db.close().await;
    // The lab's kubeconfig, as printed, for its API server (tests/it/kubectl.rs runs
    // kubectl with one).
    let kubeconfig = dir.join("kubeconfig");
    assert!(
        printed.contains(&format!("KUBECONFIG={}", kubeconfig.display())),
        "{printed}"
    );
    let config = std::fs::read_to_string(&kubeconfig).expect("the kubeconfig is written");
    assert!(config.contains(&format!("https://{apiserver}")), "{config}");

    // Each sample review gets its outcome, as printed.
    let ca = std::fs::read(dir.join("ca.crt")).expect("the demo CA");
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("a PEM CA"))
        .build()
        .expect("a client");
    for (file, warning) in [
        ("booked-user-gpu-pod.json", "booked a100 GPU until"),
        (
            "unbooked-user-gpu-pod.json",
            "a6000 GPU lent without a booking",
        ),
        // The demo's seeded notebooks (lent ones) hold both a100s before it says it
        // is ready.
        (
            "stripped-user-gpu-pod.json",
            "no free a100 GPU and no active booking",
        ),
    ] {
        assert!(printed.contains(file), "{file} is not offered:\n{printed}");
        let review = std::fs::read(format!("examples/admission/{file}")).expect("a sample");
        let answer: serde_json::Value = https
            .post(format!("https://{webhook}/mutate"))
            .header("content-type", "application/json")
            .body(review)
            .send()
            .await
            .expect("the webhook answers")
            .json()
            .await
            .expect("a review");
        let warnings = answer["response"]["warnings"].to_string();
        assert!(warnings.contains(warning), "{file}: {answer}");
    }

    // A token for any user, with the printed command.
    let command = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("any user:"))
        .expect("the any-user line");
    let secret_file = command
        .split_whitespace()
        .find_map(|w| w.strip_prefix("GPU_BOOKING_JWT_SECRET_FILE="))
        .expect("the secret file");
    let minted = Command::new(BIN)
        .args(["token", "--user", "dave@example.com"])
        .env("GPU_BOOKING_JWT_SECRET_FILE", secret_file)
        .env_remove("GPU_BOOKING_JWT_SECRET")
        .output()
        .await
        .expect("minting");
    assert!(minted.status.success(), "{minted:?}");
    let token = String::from_utf8(minted.stdout).expect("UTF-8");
    let status = reqwest::Client::new()
        .get(format!("http://{api}/api/v1/bookings"))
        .bearer_auth(token.trim())
        .send()
        .await
        .expect("the API answers")
        .status();
    assert_eq!(status, 200, "a minted token for a new user is refused");

    // The page's user picker: a token for any user, which the API accepts.
    let picked: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{api}/demo/sign-in"))
        .json(&serde_json::json!({"user": "frank@example.com"}))
        .send()
        .await
        .expect("the demo answers")
        .json()
        .await
        .expect("a token as JSON");
    let status = reqwest::Client::new()
        .get(format!("http://{api}/api/v1/bookings"))
        .bearer_auth(picked["token"].as_str().expect("a token"))
        .send()
        .await
        .expect("the API answers")
        .status();
    assert_eq!(status, 200, "the picker's token is refused: {picked}");

    // The demo's scene: judy's booked spawn marks a lent a100 notebook, whose grace
    // deadline the cluster view shows; once her short booking ends, the card is
    // offered to that notebook's user, now on CPU, in the view and on their card.
    let cluster = || async {
        reqwest::Client::new()
            .get(format!("http://{api}/demo/cluster"))
            .send()
            .await
            .expect("the demo answers")
            .json::<serde_json::Value>()
            .await
            .expect("the view as JSON")
    };
    let marked = |view: &serde_json::Value| {
        view["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| n["pods"].as_array().into_iter().flatten())
            .find(|p| p["kind"] == "lent" && p["taken_back_at"].is_string())
            .cloned()
    };
    let mut seen = serde_json::Value::Null;
    let mut victim = None;
    for _ in 0..600 {
        seen = cluster().await;
        victim = marked(&seen);
        if victim.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let victim = victim.unwrap_or_else(|| panic!("no lent pod marked with a deadline: {seen}"));
    let victim_user = victim["user"]
        .as_str()
        .expect("the victim's user")
        .to_owned();
    let deadline = chrono::DateTime::parse_from_rfc3339(victim["taken_back_at"].as_str().unwrap())
        .expect("an RFC 3339 deadline");
    assert!(
        deadline > chrono::Utc::now() - chrono::TimeDelta::seconds(2),
        "the deadline is already past when first seen: {victim}"
    );
    let offered = |view: &serde_json::Value| {
        view["cpu"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["user"] == victim_user.as_str() && p["offer"].is_object())
            .cloned()
    };
    let mut offer = None;
    for _ in 0..240 {
        seen = cluster().await;
        offer = offered(&seen);
        if offer.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let on_cpu = offer.unwrap_or_else(|| panic!("no offer to {victim_user} on CPU: {seen}"));
    assert_eq!(on_cpu["offer"]["model"], "a100", "{on_cpu}");
    assert_eq!(on_cpu["gpus"], 0, "{on_cpu}");
    assert!(
        seen["offers"]
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o["user"] == victim_user.as_str())),
        "{seen}"
    );
    // And on the victim's notebook card.
    let victim_token: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{api}/demo/sign-in"))
        .json(&serde_json::json!({"user": victim_user}))
        .send()
        .await
        .expect("the demo answers")
        .json()
        .await
        .expect("a token as JSON");
    let mut card = serde_json::Value::Null;
    for _ in 0..60 {
        card = reqwest::Client::new()
            .get(format!("http://{api}/api/v1/notebooks"))
            .bearer_auth(victim_token["token"].as_str().expect("a token"))
            .send()
            .await
            .expect("the API answers")
            .json()
            .await
            .expect("the notebooks as JSON");
        let has_offer = card["notebooks"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["offer"]["model"] == "a100"));
        if has_offer {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        card["notebooks"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["offer"]["model"] == "a100"
                && n["next"]
                    .as_array()
                    .is_some_and(|s| s.contains(&"restart".into())))),
        "no offer on {victim_user}'s notebook card: {card}"
    );

    let _ = demo.kill().await;
    let _ = demo.wait().await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&admin)
        .await
        .expect("dropping the test database");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn token_lists_only_what_it_honours_and_sets_issuer_and_audience() {
    let help = Command::new(BIN)
        .args(["token", "--help"])
        .output()
        .await
        .expect("token --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        !help.contains("jwks"),
        "token --help lists --jwks-url:\n{help}"
    );
    for option in ["--jwt-issuer", "--jwt-audience", "--jwt-secret-file"] {
        assert!(help.contains(option), "{option} missing:\n{help}");
    }
    let secret = "demo-token-test-secret-0123456789abcdef";
    let minted = Command::new(BIN)
        .args([
            "token",
            "--user",
            "erin@example.com",
            "--jwt-issuer",
            "https://sso.example/realms/lab",
            "--jwt-audience",
            "gpu-booking",
        ])
        .env("GPU_BOOKING_JWT_SECRET", secret)
        .output()
        .await
        .expect("minting");
    assert!(minted.status.success(), "{minted:?}");
    let token = String::from_utf8(minted.stdout).expect("UTF-8");
    // Verified as `gpu-booking api` verifies HS256 tokens (their `iss`/`aud` are ours).
    let strict = gpu_booking_api::auth::Authenticator::new(Some(secret.as_bytes()), None);
    let caller = strict
        .verify(token.trim())
        .await
        .expect("the API accepts it");
    assert_eq!(caller.user.as_str(), "erin@example.com");
}

/// The user picker mints tokens for anyone: only `gpu-booking demo` may serve it. The
/// real `gpu-booking api` answers its path as any unknown one (404) and mints nothing.
#[sqlx::test(migrations = "./migrations")]
async fn a_real_server_has_no_user_picker(pool: sqlx::PgPool) {
    let db = pool
        .connect_options()
        .get_database()
        .expect("a test database")
        .to_owned();
    let addr = free_addr();
    let mut api = Command::new(BIN)
        .args([
            "api".to_string(),
            format!("--listen={addr}"),
            format!("--database-url=postgres://postgres@127.0.0.1:5432/{db}"),
            "--jwt-secret=user-picker-test-secret-0123456789abcdef".into(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the API");
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(format!("http://{addr}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gpu-booking api never became ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let get = http
        .get(format!("http://{addr}/demo/sign-in"))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(
        get.status(),
        404,
        "a real server offers the demo's user picker"
    );
    let post = http
        .post(format!("http://{addr}/demo/sign-in"))
        .json(&serde_json::json!({"user": "mallory@example.com", "admin": true}))
        .send()
        .await
        .expect("the API answers");
    let status = post.status();
    let body = post.text().await.unwrap_or_default();
    assert_eq!(status, 404, "a real server mints tokens: {body}");
    assert!(!body.contains("token"), "{body}");
    // The page asks for the picker's script everywhere; without the route it stays hidden.
    let page = http
        .get(format!("http://{addr}/assets/demo-signin.js"))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(page.status(), 200);
    let _ = api.kill().await;
}
