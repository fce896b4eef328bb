//! The subcommands and their options (each component's options live in its crate).

use chrono::TimeDelta;
use clap::{Args, Parser, Subcommand, ValueEnum};
use gpu_booking_api::auth::{mint_token_for, Role};
use gpu_booking_api::config::{parse_duration, ApiArgs, DatabaseArgs, JwtClaimArgs, JwtSecretArgs};
use gpu_booking_api::server;

#[derive(Debug, Parser)]
#[command(
    name = "gpu-booking",
    version,
    about = "GPU booking and enforcement for JupyterHub on Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the booking REST API and the booking page (migrates first).
    Api(Box<ApiArgs>),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Mint an HS256 bearer token with the configured secret.
    Token(TokenArgs),
    /// Serve the mutating admission webhook (HTTPS) and its health/metrics port.
    Webhook(gpu_booking_webhook::WebhookArgs),
    /// Run the controller: end booked pods at their terminate-at, preempt lent GPUs for
    /// booked users, report the GPU inventory, label GPU nodes with their model.
    Controller(gpu_booking_controller::ControllerArgs),
    /// Run the node agent (DaemonSet): NVML sampling, idle GPU reclaim, VRAM watchdog.
    Agent(gpu_booking_agent::AgentArgs),
    /// Remove the controller's node labels and VRAM budget resource from every node
    /// once the controller's pods are gone (the chart's post-delete hook Job).
    CleanupNodes(gpu_booking_controller::cleanup::CleanupNodesArgs),
    /// The webhook's TLS: keep a self-signed CA and serving certificate (or get one
    /// from a Kubernetes signer) in Secrets and inject the CA bundle; or write dev
    /// certificates to a folder.
    Certs(gpu_booking_certs::CertsArgs),
    /// Create or complete the release's generated Secret (JWT key, service token, the
    /// embedded Postgres's password and URL): made once, never re-rolled (the chart's
    /// hook Job).
    Bootstrap(gpu_booking_certs::bootstrap::BootstrapArgs),
    /// Run the API and the booking page on a local Postgres, and the webhook and the
    /// controller on a simulated lab cluster (the page's Cluster view spawns notebooks
    /// on it); print the URLs and tokens to try them.
    Demo(crate::demo_args::DemoArgs),
}

/// Only what minting an HS256 token uses; the secret, issuer and audience are the
/// options of `gpu-booking api` (`core::jwt`), so that a shell set up for the API
/// mints tokens it accepts.
#[derive(Debug, Args)]
#[command(mut_arg("jwt_issuer", |a| a.alias("issuer")))]
#[command(mut_arg("jwt_audience", |a| a.alias("audience")))]
pub struct TokenArgs {
    /// The user the token names (claim `sub`).
    #[arg(long)]
    pub user: String,
    /// A role to grant.
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    /// Lifetime, e.g. 1h, 30days.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub ttl: TimeDelta,
    // `--jwt-secret`, `--jwt-secret-file`.
    #[command(flatten)]
    pub secret: JwtSecretArgs,
    // `--jwt-issuer` (or `--issuer`), `--jwt-audience` (or `--audience`).
    #[command(flatten)]
    pub claims: JwtClaimArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Admin,
    Service,
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Api(args) => server::run(*args).await,
        Command::Migrate(db) => {
            let pool = server::connect(&db).await?;
            server::migrate(&pool).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Token(args) => {
            let secret = server::hs256_secret(&args.secret)?.ok_or_else(|| {
                anyhow::anyhow!("set GPU_BOOKING_JWT_SECRET or --jwt-secret-file")
            })?;
            let role = args.role.map(|r| match r {
                RoleArg::Admin => Role::Admin,
                RoleArg::Service => Role::Service,
            });
            gpu_booking_core::username::Username::parse(&args.user)?;
            let token = mint_token_for(
                &secret,
                &args.user,
                role,
                args.ttl,
                args.claims.jwt_issuer.as_deref(),
                args.claims.jwt_audience.as_deref(),
            )?;
            println!("{token}");
            Ok(())
        }
        Command::Webhook(args) => gpu_booking_webhook::run(args).await,
        Command::Controller(args) => gpu_booking_controller::run(args).await,
        Command::Agent(args) => gpu_booking_agent::run(args).await,
        Command::CleanupNodes(args) => gpu_booking_controller::cleanup::main(args).await,
        Command::Certs(args) => gpu_booking_certs::run(args).await,
        Command::Bootstrap(args) => {
            let (user, ttl) = (args.service_user.clone(), args.service_token_ttl);
            gpu_booking_core::username::Username::parse(&user)?;
            let (iss, aud) = (
                args.claims.jwt_issuer.clone(),
                args.claims.jwt_audience.clone(),
            );
            let mint = move |key: &[u8]| {
                mint_token_for(
                    key,
                    &user,
                    Some(Role::Service),
                    ttl,
                    iss.as_deref(),
                    aud.as_deref(),
                )
            };
            gpu_booking_certs::bootstrap::main(args, &mint).await
        }
        Command::Demo(args) => crate::demo::run(args).await,
    }
}
