//! The options of the booking service's bearer tokens (with the `clap` feature),
//! declared once and flattened (`#[command(flatten)]`) wherever tokens are verified or
//! minted, so that a shell or a chart set up for one is set up for the others:
//!
//! - `gpu-booking api` verifies with both groups (`booking-api`'s `AuthArgs`);
//! - `gpu-booking token` mints with both;
//! - `gpu-booking bootstrap` mints the service token with [`JwtClaimArgs`] (the key
//!   is its own, generated).
//!
//! Only what the options are lives here; reading the secret file and signing are the
//! booking service's (`gpu_booking_api::server::hs256_secret`, `auth::mint_token_for`).

use std::path::PathBuf;

use clap::Args;

/// The HS256 key that signs and verifies bearer tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct JwtSecretArgs {
    /// HS256 secret for bearer tokens (small installs): the API verifies tokens with
    /// it, `gpu-booking token` signs them. Prefer --jwt-secret-file.
    #[arg(long, env = "GPU_BOOKING_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,

    /// File holding the HS256 secret (e.g. a mounted Secret).
    #[arg(long, env = "GPU_BOOKING_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
}

/// The `iss` and `aud` claims: required of OIDC tokens by the API, written into the
/// tokens we mint where the API requires them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct JwtClaimArgs {
    /// The `iss` claim, e.g. https://sso.example/realms/lab: the API requires it of
    /// OIDC tokens (and needs it with an OIDC provider's keys); `gpu-booking token` and
    /// `gpu-booking bootstrap` write it into the tokens they mint.
    #[arg(long, env = "GPU_BOOKING_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// The `aud` claim, the client id or API audience an OIDC provider puts in tokens
    /// meant for this service: the API requires it of OIDC tokens (and needs it with
    /// an OIDC provider's keys); `gpu-booking token` and `gpu-booking bootstrap` write
    /// it into the tokens they mint.
    #[arg(long, env = "GPU_BOOKING_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        secret: JwtSecretArgs,
        #[command(flatten)]
        claims: JwtClaimArgs,
    }

    #[test]
    fn every_option_is_optional_and_read_as_given() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.secret, JwtSecretArgs::default());
        assert_eq!(cli.claims, JwtClaimArgs::default());
        let cli = Cli::try_parse_from([
            "x",
            "--jwt-secret-file=/s",
            "--jwt-issuer=https://sso.example",
            "--jwt-audience=gpu-booking",
        ])
        .unwrap();
        assert_eq!(cli.secret.jwt_secret_file, Some(PathBuf::from("/s")));
        assert_eq!(
            cli.claims.jwt_issuer.as_deref(),
            Some("https://sso.example")
        );
        assert_eq!(cli.claims.jwt_audience.as_deref(), Some("gpu-booking"));
    }

    #[test]
    fn the_secret_is_never_shown_in_help() {
        let cmd = <Cli as clap::CommandFactory>::command();
        let secret = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some("jwt-secret"))
            .unwrap();
        assert!(secret.is_hide_env_values_set());
    }
}
