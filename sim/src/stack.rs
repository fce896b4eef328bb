//! Starting the real services in this process: the booking API on Postgres, the
//! admission webhook over HTTPS with a fresh CA, and the controller. Each returns a
//! handle whose `stop` (or drop) ends it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use chrono::TimeDelta;
use gpu_booking_api::auth::{mint_token, Role};
use gpu_booking_api::clock::Clock;
use gpu_booking_api::service_accounts::ServiceAccounts;
use gpu_booking_client::BookingClient;
use gpu_booking_controller::{Controller, ControllerArgs, SystemClock};
use gpu_booking_core::booking_policy::Policy;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::rendered::{LabEnvironment, RenderedChart, API_SERVICE_URL};

/// A background task and the switch that stops it.
pub(crate) struct Task {
    stop: watch::Sender<bool>,
    handle: Option<JoinHandle<()>>,
}

impl Task {
    pub(crate) fn spawn<F>(run: impl FnOnce(watch::Receiver<bool>) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, rx) = watch::channel(false);
        let handle = Some(tokio::spawn(run(rx)));
        Self { stop, handle }
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

pub(crate) async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The booking API on `127.0.0.1` (a free port), with its own HS256 secret.
pub struct ApiServer {
    pub url: String,
    pub addr: SocketAddr,
    pub pool: PgPool,
    secret: Vec<u8>,
    task: Task,
}

impl ApiServer {
    /// Migrates `pool` and serves the real API (the router the binary serves) on it,
    /// with `policy` and `clock`; ServiceAccount tokens are verified by
    /// `service_accounts` (the lab's: [`crate::SimBuilder::service_accounts`]), if given.
    pub async fn start(
        pool: PgPool,
        policy: Policy,
        clock: Arc<dyn Clock>,
        service_accounts: Option<ServiceAccounts>,
    ) -> anyhow::Result<Self> {
        gpu_booking_api::server::migrate(&pool).await?;
        let secret = gpu_booking_api::testing::random_secret();
        let mut state = gpu_booking_api::testing::test_state(pool.clone(), policy, clock, &secret);
        if let Some(service_accounts) = service_accounts {
            state.auth = state.auth.with_service_accounts(service_accounts);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let changes = state.changes.clone();
        let app = gpu_booking_api::app::router(state);
        let task = Task::spawn(|rx| async move {
            let shutdown = gpu_booking_api::server::closing(changes, stopped(rx));
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "the simulated lab's booking API stopped");
            }
        });
        Ok(Self {
            url: format!("http://{addr}"),
            addr,
            pool,
            secret,
            task,
        })
    }

    /// A bearer token for `user` with `role`, valid a day.
    pub fn token(&self, user: &str, role: Option<Role>) -> anyhow::Result<String> {
        mint_token(&self.secret, user, role, TimeDelta::days(1))
    }

    pub async fn stop(self) {
        self.task.stop().await;
    }
}

/// Where the webhook's certificates are written.
pub enum CertDir {
    /// A temporary folder removed with the webhook.
    Temporary(tempfile::TempDir),
    /// A folder that stays (the demo prints the CA's path).
    Kept(PathBuf),
}

impl CertDir {
    pub fn temporary() -> anyhow::Result<Self> {
        Ok(Self::Temporary(tempfile::tempdir()?))
    }

    pub(crate) fn path(&self) -> &Path {
        match self {
            CertDir::Temporary(dir) => dir.path(),
            CertDir::Kept(path) => path,
        }
    }
}

/// How to start the webhook.
pub struct WebhookOptions {
    /// The booking API it asks.
    pub booking_url: String,
    /// The webhook's projected ServiceAccount token
    /// ([`crate::service_accounts::ProjectedTokens`]).
    pub service_token_file: PathBuf,
    /// Where it listens (`127.0.0.1:0`: a free port).
    pub listen: SocketAddr,
    /// Where `/healthz`, `/readyz` and `/metrics` are served, if anywhere.
    pub admin_listen: Option<SocketAddr>,
    /// Names the serving certificate covers besides `localhost` and `127.0.0.1`
    /// (the Service's DNS names, which the API server checks).
    pub dns_names: Vec<String>,
    pub cert_dir: CertDir,
    /// Further `gpu-booking webhook` options, as on its command line.
    pub extra_args: Vec<String>,
    /// The chart, when the lab installs it: the webhook's options are then its
    /// Deployment's environment (its volumes mounted under `volumes`).
    pub chart: Option<(RenderedChart, PathBuf)>,
}

/// The chart's webhook Deployment and the Secret of its serving certificate.
const WEBHOOK_DEPLOYMENT: &str = "gpu-booking-webhook";
const WEBHOOK_TLS_SECRET: &str = "gpu-booking-webhook-tls";

/// The real webhook, serving `/mutate` over TLS.
pub struct WebhookServer {
    pub addr: SocketAddr,
    /// The CA that signed its certificate (the configuration's `caBundle`).
    pub ca_pem: String,
    pub ca_path: PathBuf,
    pub metrics: Arc<gpu_booking_webhook::Metrics>,
    /// The webhook's replica of the booking service (`--decide-from replica`).
    pub replica: Option<Arc<gpu_booking_webhook::ReplicaHandle>>,
    _certs: CertDir,
    task: Task,
}

impl WebhookServer {
    pub async fn start(options: WebhookOptions) -> anyhow::Result<Self> {
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        names.extend(options.dns_names.iter().cloned());
        // The same generator as `gpu-booking certs dev` (crate certs).
        let certs = gpu_booking_certs::pki::DevCerts::generate("gpu-booking sim CA", &names)?;
        let dir = options.cert_dir.path();
        let paths = certs
            .write_to(dir)
            .with_context(|| format!("writing the webhook's certificates to {}", dir.display()))?;

        // The webhook's own option parser fills in every default.
        #[derive(clap::Parser)]
        struct WebhookCli {
            #[command(flatten)]
            args: gpu_booking_webhook::WebhookArgs,
        }
        // The lab's controller reports usage within a fraction of a second; the
        // replica follows as closely (the chart's default is 1s).
        let mut extra = vec!["--replica-refresh=100ms".to_string()];
        extra.extend(options.extra_args.iter().cloned());
        let args = match &options.chart {
            Some((chart, volumes)) => {
                let lab = LabEnvironment {
                    pod_name: format!("{WEBHOOK_DEPLOYMENT}-0"),
                    services: vec![(API_SERVICE_URL.to_owned(), options.booking_url.clone())],
                    secrets: vec![(WEBHOOK_TLS_SECRET.to_owned(), dir.to_owned())],
                    token_file: Some(options.service_token_file.clone()),
                    ..LabEnvironment::default()
                };
                let workload = chart.workload("Deployment", WEBHOOK_DEPLOYMENT)?;
                crate::rendered::options::<WebhookCli>(&workload, &lab, volumes, &extra)?.args
            }
            None => {
                let mut argv = vec![
                    "webhook".to_string(),
                    format!("--tls-cert={}", paths.cert.display()),
                    format!("--tls-key={}", paths.key.display()),
                    format!("--booking-url={}", options.booking_url),
                    format!(
                        "--service-token-file={}",
                        options.service_token_file.display()
                    ),
                    // As the chart configures it: only the hub's pods carry a user.
                    format!("--trusted-spawner={}", crate::spawner::HUB_USER),
                    format!("--spawner-namespace={}", crate::spawner::NOTEBOOK_NAMESPACE),
                    // As the chart configures it: the controller's lent copies are its own.
                    format!("--trusted-controller={CONTROLLER_USER}"),
                ];
                argv.extend(extra);
                <WebhookCli as clap::Parser>::try_parse_from(argv)?.args
            }
        };
        let server = gpu_booking_webhook::WebhookServer::from_args(&args)?;
        let listener = TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("binding {}", options.listen))?;
        let addr = listener.local_addr()?;
        let admin = match options.admin_listen {
            Some(at) => Some(
                TcpListener::bind(at)
                    .await
                    .with_context(|| format!("binding {at}"))?,
            ),
            None => None,
        };
        let metrics = server.metrics.clone();
        let replica = server.webhook.booking().replica().cloned();
        let task = Task::spawn(|rx| async move {
            let admin = admin.map(|admin| {
                tokio::spawn(gpu_booking_webhook::serve_plain(
                    admin,
                    server.admin_router(),
                    stopped(rx.clone()),
                ))
            });
            if let Err(e) = server.serve(listener, stopped(rx)).await {
                tracing::error!(error = %e, "the simulated lab's webhook stopped");
            }
            if let Some(admin) = admin {
                let _ = admin.await;
            }
        });
        Ok(Self {
            addr,
            ca_pem: certs.ca_pem,
            ca_path: paths.ca,
            metrics,
            replica,
            _certs: options.cert_dir,
            task,
        })
    }

    pub async fn stop(self) {
        self.task.stop().await;
    }
}

/// The controller's ServiceAccount as the chart names it (release `gpu-booking` in
/// namespace `gpu-booking`): the requester of every request the controller makes.
pub const CONTROLLER_USER: &str = "system:serviceaccount:gpu-booking:gpu-booking-controller";
/// The groups the API server gives that ServiceAccount.
pub const CONTROLLER_GROUPS: [&str; 3] = crate::service_accounts::GROUPS;

/// The controller's options: with the chart, its Deployment's environment as the
/// lab translates it ([`crate::rendered`]: the booking API at `booking_url`, the
/// projected token `token_file`, `pod_name` as the pod's name, its volumes under
/// `volumes`, `more`'s Services and Secrets); without, the binary's defaults, serving every namespace without
/// leader election (the demo).
pub fn controller_args(
    chart: Option<&RenderedChart>,
    booking_url: &str,
    token_file: &Path,
    pod_name: &str,
    volumes: &Path,
    more: &LabEnvironment,
) -> anyhow::Result<ControllerArgs> {
    let Some(chart) = chart else {
        let mut args = ControllerArgs::with_defaults(booking_url);
        args.leader_elect = false;
        args.identity = Some(pod_name.into());
        args.booking.service_token_file = Some(token_file.to_owned());
        return Ok(args);
    };
    #[derive(clap::Parser)]
    struct ControllerCli {
        #[command(flatten)]
        args: ControllerArgs,
    }
    let mut services = vec![(API_SERVICE_URL.to_owned(), booking_url.to_owned())];
    services.extend(more.services.iter().cloned());
    let lab = LabEnvironment {
        pod_name: pod_name.to_owned(),
        services,
        secrets: more.secrets.clone(),
        token_file: Some(token_file.to_owned()),
        ..LabEnvironment::default()
    };
    let workload = chart.workload("Deployment", CONTROLLER_DEPLOYMENT)?;
    let cli: ControllerCli = crate::rendered::options(&workload, &lab, volumes, &[])?;
    Ok(cli.args)
}

/// The chart's controller Deployment (release `gpu-booking`).
const CONTROLLER_DEPLOYMENT: &str = "gpu-booking-controller";

/// Starts the real controller on `client` (see [`controller_client`]) with `args`
/// ([`controller_args`]) after `configure` adjusted them.
pub fn start_controller(
    client: kube::Client,
    mut args: ControllerArgs,
    configure: impl FnOnce(&mut ControllerArgs),
) -> anyhow::Result<Controller> {
    configure(&mut args);
    let booking = BookingClient::new(
        args.booking.required_url()?,
        args.booking.token_source()?,
        args.booking.booking_timeout,
        "gpu-booking-sim/controller",
    )?;
    Controller::start(client, Arc::new(booking), Arc::new(SystemClock), &args)
}

/// A client of `server` with the controller's identity ([`CONTROLLER_USER`]).
pub fn controller_client(server: &gpu_booking_fake_apiserver::FakeApiServer) -> kube::Client {
    server.client_as(CONTROLLER_USER, &CONTROLLER_GROUPS)
}
