//! `gpu-booking demo --jupyterhub`: a real JupyterHub in front of the demo's lab.
//! JupyterHub and KubeSpawner from PyPI, installed under `target/jupyterhub` on first
//! use by `scripts/jupyterhub-tools.sh` (as the end-to-end tests install them), run
//! with the tests' configuration (`tests/jupyterhub/jupyterhub_config.py`): KubeSpawner
//! spawns into namespace `jhub` over the lab's HTTPS API server as the hub's
//! ServiceAccount, the webhook admits its pods, and the spawn form offers the
//! profiles of `docs/jupyterhub/gpu_booking_profiles.py`, from the demo's booking
//! API. Any user name logs in with the one shared password.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use gpu_booking_sim::SimCluster;
use tokio::process::{Child, Command};

/// Every user's password in the demo's hub (SharedPasswordAuthenticator: 8 or more
/// characters).
pub const PASSWORD: &str = "gpu-booking-demo";

/// How often the hub polls each server: a notebook the controller ended shows as
/// stopped within this (JupyterHub's default is 30 s).
const POLL_SECONDS: &str = "5";

/// How long a server takes to answer once its pod runs, as `jupyterhub-singleuser`
/// does (the lab's stand-in answers at once): the spawn's progress, and the pod's
/// Events in it (a GPU removed, and why), stay on screen that long.
const START_SECONDS: &str = "2";

/// How long the hub may take to answer once started.
const START_WAIT: Duration = Duration::from_secs(60);

/// A running hub, stopped with the demo.
pub struct DemoHub {
    /// Its login page.
    pub login_url: String,
    _child: Child,
}

/// What the hub is told about the demo.
pub struct HubSettings<'a> {
    /// The hub's port on 127.0.0.1.
    pub port: u16,
    /// The booking API, for the spawn form's availability.
    pub booking_url: &'a str,
    /// A token with the `service` role: the form asks about any user.
    pub service_token: &'a str,
    /// The booking page's address, shown in the form.
    pub page_url: &'a str,
    /// Where its database, cookie secret and kubeconfig go (emptied first: the
    /// lab's pods are new each run).
    pub dir: &'a Path,
}

/// Installs the hub if needed and starts it against `sim`.
pub async fn start(sim: &SimCluster, settings: &HubSettings<'_>) -> anyhow::Result<DemoHub> {
    let repo = repository()?;
    let installed = std::process::Command::new("bash")
        .arg(repo.join("scripts/jupyterhub-tools.sh"))
        .status()
        .context("running scripts/jupyterhub-tools.sh")?;
    if !installed.success() {
        bail!("scripts/jupyterhub-tools.sh could not install JupyterHub (see above)");
    }
    let dir = std::path::absolute(settings.dir)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let kubeconfig = dir.join("kubeconfig");
    sim.write_hub_kubeconfig(&kubeconfig)?;
    // The config's services need tokens; nothing in the demo calls them.
    // (JupyterHub takes tokens of up to 64 characters.)
    let mut unused = String::from_utf8(gpu_booking_api::testing::random_secret())?;
    unused.truncate(40);
    let mut command = Command::new(repo.join("target/jupyterhub/venv/bin/jupyterhub"));
    if let Some(grace) = sim.notebook_grace() {
        // The lab's notebooks' grace period, the hub's pods too.
        command.env("HUB_POD_GRACE_SECONDS", grace.to_string());
    }
    let mut child = command
        .arg("-f")
        .arg(repo.join("tests/jupyterhub/jupyterhub_config.py"))
        .current_dir(&dir)
        .env("HUB_PORT", settings.port.to_string())
        .env("HUB_DIR", &dir)
        .env("HUB_PASSWORD", PASSWORD)
        .env("HUB_BOOKING_SECRET", &unused)
        .env("HUB_CONTROLLER_TOKEN", format!("{unused}-controller"))
        .env("HUB_READ_ONLY_TOKEN", format!("{unused}-read-only"))
        .env("HUB_ADMIN_TOKEN", format!("{unused}-admin"))
        .env("HUB_SPAWNER", "kube")
        .env("HUB_POLL_SECONDS", POLL_SECONDS)
        .env("HUB_START_SECONDS", START_SECONDS)
        .env("KUBECONFIG", &kubeconfig)
        .env("GPU_BOOKING_URL", settings.booking_url)
        .env("GPU_BOOKING_TOKEN", settings.service_token)
        .env("GPU_BOOKING_PAGE", settings.page_url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting jupyterhub")?;
    let url = format!("http://127.0.0.1:{}", settings.port);
    let deadline = tokio::time::Instant::now() + START_WAIT;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("jupyterhub exited ({status}) before it answered: see its log above");
        }
        if answers(settings.port).await {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("JupyterHub did not answer on {url} within {START_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(DemoHub {
        login_url: format!("{url}/hub/login"),
        _child: child,
    })
}

/// Whether the hub on `port` answers `GET /hub/api/` with 200 (its version).
async fn answers(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = format!("GET /hub/api/ HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head)).await,
        Ok(Ok(_))
    ) && head.starts_with(b"HTTP/1.")
        && head.ends_with(b" 200")
}

/// The repository the demo runs from: the hub's installer and configuration are
/// there, not in the binary.
fn repository() -> anyhow::Result<PathBuf> {
    let here = std::env::current_dir()?;
    here.ancestors()
        .find(|dir| dir.join("scripts/jupyterhub-tools.sh").is_file())
        .map(Path::to_path_buf)
        .context(
            "--jupyterhub runs from the repository (its scripts/jupyterhub-tools.sh installs \
             the hub): cd into it, e.g. `cargo run -- demo --jupyterhub`",
        )
}
