//! The options of `gpu-booking demo`, in a module of their own: the demo
//! ([`crate::demo`]) and its lab ([`crate::demo_cluster`]) both read them.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address of the API and the booking page.
    #[arg(long, env = "GPU_BOOKING_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Postgres to use instead of looking for one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Address of the admission webhook (HTTPS, a demo certificate).
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub webhook_listen: std::net::SocketAddr,
    /// Address of the webhook's health and metrics.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub webhook_admin_listen: std::net::SocketAddr,
    /// Address of the simulated lab's Kubernetes API (HTTPS), for kubectl.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub apiserver_listen: std::net::SocketAddr,
    /// Where the demo's CAs, the webhook's certificate and the lab's kubeconfig are
    /// written.
    #[arg(long, default_value = "target/demo-certs")]
    pub cert_dir: PathBuf,
    /// Where a private Postgres cluster goes if none is running.
    #[arg(long, default_value = "target/demo-postgres")]
    pub data_dir: PathBuf,
    /// Drop the demo's database and start over (bookings and cooldowns of earlier runs
    /// are kept otherwise). Not with DATABASE_URL: that database is not the demo's.
    #[arg(long)]
    pub fresh: bool,
    /// Also run a real JupyterHub with KubeSpawner spawning into the lab (installed
    /// under target/jupyterhub on first use; Python 3 with venv needed; run from the
    /// repository).
    #[arg(long)]
    pub jupyterhub: bool,
    /// The JupyterHub's port on 127.0.0.1 (with --jupyterhub).
    #[arg(long, default_value_t = 8000)]
    pub jupyterhub_port: u16,
    /// Where the JupyterHub keeps its database (emptied at each start).
    #[arg(long, default_value = "target/demo-jupyterhub")]
    pub jupyterhub_dir: PathBuf,
    /// Do not play the demo's scene (a short booking that takes a lent A100 back and,
    /// when it ends, offers the card to that notebook's user): a lab that stays as
    /// seeded, for tests that drive the page against it.
    #[arg(long = "no-scene", action = clap::ArgAction::SetFalse)]
    pub scene: bool,
    /// Name of the demo's own database (lowercase letters, digits, `_`).
    #[arg(long, default_value = "gpu_booking_demo", value_parser = parse_database_name)]
    pub demo_database: String,
}

/// A database name that needs no quoting in `CREATE DATABASE`.
fn parse_database_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("1 to 63 of a-z, 0-9 and _, starting with a letter".into())
    }
}
