//! The options of every process that calls the booking service (the webhook, the
//! controller and the node agent): defined once here and flattened into each command
//! (`#[command(flatten)]`), so that a flag, its environment variable and its help read
//! the same everywhere. The environment variables carry no component name
//! (`GPU_BOOKING_BOOKING_URL`, ...): each component runs in its own container.
//!
//! A command that differs adjusts an option with `mut_arg` on its own struct: the
//! webhook and the controller require `--booking-url` (the agent runs without, its
//! audit rows then only logged), the webhook waits 2 s instead of 5 s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpu_booking_process::duration::parse_duration;

use crate::TokenSource;

/// `--booking-timeout` unless a command says otherwise.
pub const DEFAULT_BOOKING_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the booking service.
#[derive(Debug, Clone, Args)]
pub struct BookingServiceArgs {
    /// Base URL of the booking service, e.g. http://gpu-booking-api:8080.
    #[arg(long, env = "GPU_BOOKING_BOOKING_URL")]
    pub booking_url: Option<String>,

    /// Service token (a JWT with the `service` role) for the booking service.
    #[arg(
        long,
        env = "GPU_BOOKING_SERVICE_TOKEN",
        hide_env_values = true,
        conflicts_with = "service_token_file"
    )]
    pub service_token: Option<String>,

    /// File holding the service token (a mounted Secret); re-read when it changes.
    #[arg(long, env = "GPU_BOOKING_SERVICE_TOKEN_FILE")]
    pub service_token_file: Option<PathBuf>,

    /// Longest wait for one call to the booking service.
    #[arg(long, env = "GPU_BOOKING_BOOKING_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub booking_timeout: Duration,
}

impl BookingServiceArgs {
    /// The service at `url` with the token `token`, the default timeout (tests, the
    /// demo).
    pub fn new(url: &str, token: Option<&str>) -> Self {
        Self {
            booking_url: Some(url.to_owned()),
            service_token: token.map(str::to_owned),
            service_token_file: None,
            booking_timeout: DEFAULT_BOOKING_TIMEOUT,
        }
    }

    /// The base URL, when one is given (an empty value counts as none).
    pub fn url(&self) -> Option<&str> {
        self.booking_url.as_deref().filter(|u| !u.trim().is_empty())
    }

    /// The base URL of a command that cannot run without the booking service.
    pub fn required_url(&self) -> anyhow::Result<&str> {
        self.url()
            .ok_or_else(|| anyhow::anyhow!("give --booking-url (the booking service)"))
    }

    /// The service token, from `--service-token` or `--service-token-file`.
    pub fn token_source(&self) -> anyhow::Result<TokenSource> {
        TokenSource::from_options(
            self.service_token.as_deref(),
            self.service_token_file.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        booking: BookingServiceArgs,
    }

    /// A command that needs the service and waits less, as the webhook does.
    #[derive(Parser)]
    #[command(mut_arg("booking_url", |a| a.required(true)))]
    #[command(mut_arg("booking_timeout", |a| a.default_value("2s")))]
    struct Strict {
        #[command(flatten)]
        booking: BookingServiceArgs,
    }

    #[test]
    fn one_set_of_options() {
        let cli = Cli::try_parse_from([
            "x",
            "--booking-url=http://api:8080",
            "--service-token= t ",
            "--booking-timeout=500ms",
        ])
        .unwrap();
        assert_eq!(cli.booking.url(), Some("http://api:8080"));
        assert_eq!(cli.booking.booking_timeout, Duration::from_millis(500));
        assert!(matches!(
            cli.booking.token_source().unwrap(),
            TokenSource::Static(t) if t == "t"
        ));
        let none = Cli::try_parse_from(["x", "--booking-url="]).unwrap();
        assert_eq!(none.booking.url(), None);
        assert!(none.booking.required_url().is_err());
        assert!(none.booking.token_source().is_err());
        assert_eq!(none.booking.booking_timeout, DEFAULT_BOOKING_TIMEOUT);
        for bad in [
            &["x", "--service-token=t", "--service-token-file=/f"][..],
            &["x", "--booking-timeout=soon"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_command_may_require_the_url_and_change_the_default() {
        assert!(Strict::try_parse_from(["x"]).is_err());
        let strict = Strict::try_parse_from(["x", "--booking-url=u"]).unwrap();
        assert_eq!(strict.booking.booking_timeout, Duration::from_secs(2));
    }
}
