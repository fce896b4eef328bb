//! A real JupyterHub (PyPI `jupyterhub`, under target/jupyterhub: run
//! `./scripts/jupyterhub-tools.sh`) for the tests that put the hub in the loop, run
//! with tests/jupyterhub/jupyterhub_config.py on 127.0.0.1. Included by path into
//! each test binary that needs it (`#[path]`), one copy of the code.
//!
//! Without the hub a test says so and passes, unless GPU_BOOKING_REQUIRE_JUPYTERHUB=1
//! (`./scripts/test.sh` sets it once it installed the hub) makes it fail.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// Every user's password (SharedPasswordAuthenticator).
pub const PASSWORD: &str = "a-shared-test-password";
/// The `gpu-booking` service's api_token: the page's OAuth client secret.
pub const BOOKING_SECRET: &str = "hub-login-test-client-secret";
/// The token of the service `gpu-booking-controller`, with the role
/// docs/controller.md documents for `--on-expiry hub-restart` (scope `servers`).
pub const CONTROLLER_TOKEN: &str = "controller-test-token-with-servers";
/// The token of the service `no-servers-scope`, which may read users only.
pub const READ_ONLY_TOKEN: &str = "controller-test-token-read-only";
/// The token of the service `lab-admin`: the hub's admin, who creates users.
pub const ADMIN_TOKEN: &str = "hub-test-admin-token";

/// The hub's program, or `None` (with the reason printed) where it is not installed.
pub fn program() -> Option<PathBuf> {
    let program = repo().join("target/jupyterhub/venv/bin/jupyterhub");
    let required = std::env::var("GPU_BOOKING_REQUIRE_JUPYTERHUB").as_deref() == Ok("1");
    if program.is_file() {
        return Some(program);
    }
    let why = "target/jupyterhub is missing (run ./scripts/jupyterhub-tools.sh)";
    assert!(!required, "{why}");
    eprintln!("SKIPPED: a real-JupyterHub test: {why}");
    None
}

/// The repository's root: the crate's folder (the root crate) or the one above it
/// (a member crate), whichever holds this file's folder.
fn repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("tests/support/jupyterhub.rs").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

#[path = "ports.rs"]
mod ports;
pub use ports::free_port;

/// A running hub, stopped when dropped.
pub struct RealHub {
    /// `http://127.0.0.1:<port>`: its pages under `/hub/`, its API under `/hub/api/`.
    pub url: String,
    /// Its database, cookie secret and servers: kept across [`RealHub::restart`].
    dir: tempfile::TempDir,
    child: Child,
    /// How it was started, to start it again.
    command: Command,
}

impl RealHub {
    /// Starts the hub; with `booking_url`, the booking page is registered as its
    /// service `gpu-booking` (the sign-in's OAuth client).
    pub async fn start(program: &Path, booking_url: Option<&str>) -> RealHub {
        Self::start_with(program, booking_url, &[]).await
    }

    /// [`RealHub::start`] with more of the config's environment (`HUB_STOP_SECONDS`,
    /// `HUB_START_SECONDS`).
    pub async fn start_with(
        program: &Path,
        booking_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> RealHub {
        Self::start_on(program, free_port(), booking_url, env).await
    }

    /// [`RealHub::start_with`] on `port` (one a lab's Service already points at).
    pub async fn start_on(
        program: &Path,
        port: u16,
        booking_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> RealHub {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(program);
        command
            .arg("-f")
            .arg(repo().join("tests/jupyterhub/jupyterhub_config.py"))
            .current_dir(dir.path())
            .env("HUB_PORT", port.to_string())
            .env("HUB_DIR", dir.path())
            .env("HUB_PASSWORD", PASSWORD)
            .env("HUB_BOOKING_SECRET", BOOKING_SECRET)
            .env("HUB_CONTROLLER_TOKEN", CONTROLLER_TOKEN)
            .env("HUB_READ_ONLY_TOKEN", READ_ONLY_TOKEN)
            .env("HUB_ADMIN_TOKEN", ADMIN_TOKEN)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(url) = booking_url {
            command.env("BOOKING_URL", url);
        }
        let url = format!("http://127.0.0.1:{port}");
        let child = Self::run(&mut command, &url).await;
        RealHub {
            url,
            dir,
            child,
            command,
        }
    }

    /// Starts `command` and waits until the hub answers at `url`.
    async fn run(command: &mut Command, url: &str) -> Child {
        let mut child = command.spawn().expect("starting jupyterhub");
        let http = reqwest::Client::new();
        for _ in 0..600 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("jupyterhub exited ({status}) before it answered: see its log above");
            }
            if let Ok(r) = http.get(format!("{url}/hub/api/")).send().await {
                if r.status().is_success() {
                    return child;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("JupyterHub did not answer on {url} within a minute");
    }

    /// Stops the hub as Kubernetes stops its pod (SIGTERM: it shuts down in order,
    /// leaving the servers to run where `cleanup_servers` is off, as z2jh has it)
    /// and starts it again on the same database, as a new hub pod would.
    pub async fn restart(&mut self) {
        let pid = self.child.id().expect("the hub runs");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM to the hub");
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                status.expect("the hub's exit");
            }
            Err(_) => panic!("the hub did not stop within 30 s of SIGTERM"),
        }
        self.child = Self::run(&mut self.command, &self.url).await;
    }

    /// `/hub/api` of this hub.
    pub fn api_url(&self) -> String {
        format!("{}/hub/api", self.url)
    }
}

/// A browser's session in the hub: logged in at its form as a user.
pub struct HubSession {
    pub url: String,
    pub http: reqwest::Client,
    pub cookies: std::collections::BTreeMap<String, String>,
}

impl HubSession {
    /// Logs `user` in at the login form of the hub at `url` (`http://host:port`).
    pub async fn login(url: &str, user: &str, password: &str) -> HubSession {
        let mut session = HubSession {
            url: url.to_owned(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a client"),
            cookies: Default::default(),
        };
        session.get("/hub/login").await;
        let xsrf = session
            .cookies
            .get("_xsrf")
            .cloned()
            .expect("the login form sets _xsrf");
        let r = session
            .send(
                session
                    .http
                    .post(format!("{}/hub/login", session.url))
                    .form(&[("username", user), ("password", password), ("_xsrf", &xsrf)]),
            )
            .await;
        assert_eq!(r.status(), 302, "the hub's login of {user}");
        session
    }

    pub async fn send(&mut self, req: reqwest::RequestBuilder) -> reqwest::Response {
        let cookies: Vec<String> = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let r = req
            .header(reqwest::header::COOKIE, cookies.join("; "))
            .send()
            .await
            .expect("the hub answers");
        for c in r.headers().get_all(reqwest::header::SET_COOKIE) {
            let pair = c
                .to_str()
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default();
            if let Some((k, v)) = pair.split_once('=') {
                self.cookies.insert(k.to_owned(), v.to_owned());
            }
        }
        r
    }

    /// `GET <path>` of the hub: its status and page.
    pub async fn get(&mut self, path: &str) -> (u16, String) {
        let req = self.http.get(format!("{}{path}", self.url));
        let r = self.send(req).await;
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}
