//! `demo --jupyterhub` on the real binary: the demo starts a real JupyterHub in front
//! of its lab and prints the hub's login page, the password and a user to log in as;
//! that user logs in at the hub's form, sees the availability in the spawn form,
//! starts a server from it, and the server runs in the demo's lab, booked.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

use crate::common::ports::{free_addr, free_port};
use crate::e2e_real_hub::jupyterhub::{self, HubSession};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-booking");

/// The text after `key` in `line`, to the next space or `)`.
fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split([' ', ')']).next()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_runs_a_real_jupyterhub_in_front_of_its_lab() {
    if jupyterhub::program().is_none() {
        return;
    }
    let db = format!("gpu_booking_demo_hub_test_{}", std::process::id());
    let dir = tempfile::tempdir().expect("a folder");
    let (api, webhook, webhook_admin, apiserver) =
        (free_addr(), free_addr(), free_addr(), free_addr());
    let hub_port = free_port();
    let mut demo = Command::new(BIN)
        .args([
            "demo".to_string(),
            "--fresh".into(),
            "--jupyterhub".into(),
            format!("--jupyterhub-port={hub_port}"),
            format!("--jupyterhub-dir={}", dir.path().join("hub").display()),
            format!("--listen={api}"),
            format!("--webhook-listen={webhook}"),
            format!("--webhook-admin-listen={webhook_admin}"),
            format!("--apiserver-listen={apiserver}"),
            format!("--cert-dir={}", dir.path().join("certs").display()),
            format!("--demo-database={db}"),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the demo");
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().expect("stdout")).lines();
    let mut printed = String::new();
    let (mut login, mut password, mut user) = (None, None, None);
    loop {
        let line = tokio::time::timeout(Duration::from_secs(180), lines.next_line())
            .await
            .expect("the demo did not finish starting")
            .expect("reading its output")
            .unwrap_or_else(|| panic!("the demo exited:\n{printed}"));
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("JupyterHub:") {
            login = after(&line, "JupyterHub:   ").map(str::to_owned);
            password = after(&line, "password: ").map(str::to_owned);
        }
        if let Some(name) = after(&line, "log in as ") {
            user = Some(name.to_owned());
        }
        if line.starts_with("Ctrl-C stops it") {
            break;
        }
    }
    let (Some(login), Some(password), Some(user)) = (login, password, user) else {
        panic!("the demo did not print the hub's login page, password and a user:\n{printed}");
    };
    let hub = login
        .strip_suffix("/hub/login")
        .unwrap_or_else(|| panic!("not the hub's login page: {login}"));
    let mut session = HubSession::login(hub, &user, &password).await;
    let (status, form) = session.get("/hub/spawn").await;
    assert_eq!(status, 200, "{user}'s spawn form: {form}");
    assert!(
        form.contains("Your booked a100 GPU (until"),
        "{user}'s spawn form does not show the booking:\n{form}"
    );
    // The form's first profile (the booked GPU), as a browser sends it.
    let slug = after(&form, "name=\"profile\"")
        .and_then(|_| form.split("value=\"").nth(1))
        .and_then(|v| v.split('"').next())
        .expect("a profile's value in the form")
        .to_owned();
    let xsrf = session.cookies.get("_xsrf").cloned().expect("_xsrf");
    let url = format!("{hub}/hub/spawn");
    let req = session
        .http
        .post(&url)
        .form(&[("profile", slug.as_str()), ("_xsrf", xsrf.as_str())]);
    let r = session.send(req).await;
    assert!(
        r.status().is_redirection() || r.status().is_success(),
        "starting {user}'s server from the form: {}",
        r.status()
    );
    // The demo's cluster view: the server's pod runs booked on an a100.
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let view: Value = http
            .get(format!("http://{api}/demo/cluster"))
            .send()
            .await
            .expect("the demo answers")
            .json()
            .await
            .expect("the cluster view");
        let booked = view["nodes"].as_array().into_iter().flatten().any(|node| {
            node["pods"].as_array().into_iter().flatten().any(|pod| {
                pod["user"] == user.as_str() && pod["kind"] == "booked" && pod["phase"] == "Running"
            })
        });
        if booked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{user}'s hub server never ran booked in the demo's lab: {view}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    demo.kill().await.ok();
    let admin = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .expect("the Postgres on 127.0.0.1:5432");
    sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&admin)
        .await
        .expect("dropping the demo's database");
}
