//! The options every process shares, declared once and flattened
//! (`#[command(flatten)]`) into each component's options, so that a name, an
//! environment variable or a default cannot drift between components:
//!
//! - [`LogArgs`]: `--log-format` (`GPU_BOOKING_LOG_FORMAT`), in every subcommand that
//!   runs a component;
//! - [`AdminArgs`]: `--admin-listen` (`GPU_BOOKING_ADMIN_LISTEN`), the plain admin
//!   port of the webhook, the controller and the node agent. One environment name for
//!   all three: each runs in its own container, so the name cannot collide.
//!
//! The HTTP server limits of the booking API and the webhook are the third such group,
//! [`crate::serve::ServerLimits`].

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;

use crate::LogFormat;

/// How the process logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "GPU_BOOKING_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

impl LogArgs {
    /// Installs the process's logging in this format ([`crate::init_logging`]).
    pub fn init(&self) {
        crate::init_logging(self.log_format);
    }
}

/// The default of `--admin-listen`.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9090);

/// Where the admin port (`/healthz`, `/readyz`, `/metrics`: [`crate::admin_router`])
/// listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct AdminArgs {
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "GPU_BOOKING_ADMIN_LISTEN", default_value_t = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,
}

impl Default for AdminArgs {
    fn default() -> Self {
        Self {
            admin_listen: DEFAULT_ADMIN_LISTEN,
        }
    }
}

impl AdminArgs {
    /// Binds the admin port; the error names the option.
    pub async fn bind(&self) -> anyhow::Result<TcpListener> {
        TcpListener::bind(self.admin_listen)
            .await
            .with_context(|| format!("binding --admin-listen {}", self.admin_listen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
        #[command(flatten)]
        admin: AdminArgs,
    }

    #[test]
    fn defaults_and_values() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.log, LogArgs::default());
        assert_eq!(cli.admin, AdminArgs::default());
        assert_eq!(cli.admin.admin_listen.to_string(), "0.0.0.0:9090");
        let cli =
            Cli::try_parse_from(["x", "--log-format=json", "--admin-listen=127.0.0.1:1"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        assert_eq!(cli.admin.admin_listen.to_string(), "127.0.0.1:1");
    }

    #[test]
    fn each_option_reads_one_environment_variable() {
        let cmd = <Cli as clap::CommandFactory>::command();
        let env = |long: &str| {
            cmd.get_arguments()
                .find(|a| a.get_long() == Some(long))
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(env("log-format").as_deref(), Some("GPU_BOOKING_LOG_FORMAT"));
        assert_eq!(
            env("admin-listen").as_deref(),
            Some("GPU_BOOKING_ADMIN_LISTEN")
        );
    }
}
