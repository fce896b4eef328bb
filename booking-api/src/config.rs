//! Options of `gpu-booking api`: flags with environment fallbacks.

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono::TimeDelta;
use clap::{Args, ValueEnum};
use gpu_booking_core::booking_policy::Policy;
pub use gpu_booking_core::jwt::{JwtClaimArgs, JwtSecretArgs};

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Address the API and the booking page listen on.
    #[arg(long, env = "GPU_BOOKING_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub oidc: OidcArgs,

    #[command(flatten)]
    pub hub_login: HubLoginArgs,

    // `--case-sensitive-names`: shared with the webhook, which must agree.
    #[command(flatten)]
    pub names: gpu_booking_core::username::NameCaseArgs,

    /// How often every waitlist is looked at again, besides right after each change
    /// that frees a unit (a backstop; any replica may run it).
    #[arg(long, env = "GPU_BOOKING_WAITLIST_SWEEP", default_value = "1min", value_parser = parse_duration)]
    pub waitlist_sweep: TimeDelta,
    /// Notices: reminders, SMTP, the outgoing webhook.
    #[command(flatten)]
    pub notices: crate::notices::config::NoticeArgs,

    /// Timeouts and limits of the listening port.
    #[command(flatten)]
    pub limits: ApiLimits,

    /// Rate limits on writes, per user and per source address.
    #[command(flatten)]
    pub write_limits: WriteLimitArgs,

    /// Models declared in a file (the chart's values), written at start-up.
    #[command(flatten)]
    pub models: ModelsArgs,

    // `--log-format`.
    #[command(flatten)]
    pub log: gpu_booking_process::LogArgs,

    /// How long booking changes are kept for followers of
    /// `/api/v1/booking-changes`; one resuming from further back lists again (410).
    #[arg(long, env = "GPU_BOOKING_CHANGE_RETENTION", default_value = "7days", value_parser = gpu_booking_process::duration::parse_duration)]
    pub change_retention: std::time::Duration,

    /// Bookings that ended longer ago than this leave the exclusion constraints'
    /// indexes (archived, every 10 minutes), so that creates do not slow down as
    /// history grows; the database still refuses a booking that would overlap one of
    /// them (a trigger), and the rules still see them.
    #[arg(long, env = "GPU_BOOKING_ARCHIVE_AFTER", default_value = "1day", value_parser = parse_duration)]
    pub archive_after: TimeDelta,
}

impl DatabaseArgs {
    /// The URL from the option or its file.
    pub fn url(&self) -> anyhow::Result<String> {
        use anyhow::Context;
        match (&self.database_url, &self.database_url_file) {
            (Some(url), _) => Ok(url.clone()),
            (None, Some(path)) => Ok(std::fs::read_to_string(path)
                .with_context(|| format!("reading the database URL file {}", path.display()))?
                .trim()
                .to_owned()),
            (None, None) => anyhow::bail!("set DATABASE_URL or --database-url-file"),
        }
    }
}

#[derive(Debug, Clone, Default, Args)]
pub struct ModelsArgs {
    /// JSON list of models ({name, units, patterns, gpumemMib, resource}) written
    /// into the store at start-up, before serving (the chart's `models.declared`).
    #[arg(long, env = "GPU_BOOKING_MODELS_FILE")]
    pub models_file: Option<PathBuf>,

    /// Who wins for the declared models: `values` (the file; an admin's change to such
    /// a model is undone at the next start) or `api` (the file only creates missing
    /// models). Models the file does not name are never touched.
    #[arg(long, env = "GPU_BOOKING_MODELS_AUTHORITY", value_enum, default_value_t = ModelsAuthority::Values)]
    pub models_authority: ModelsAuthority,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ModelsAuthority {
    #[default]
    Values,
    Api,
}

impl ModelsAuthority {
    pub fn core(self) -> gpu_booking_core::declared_models::Authority {
        match self {
            Self::Values => gpu_booking_core::declared_models::Authority::Values,
            Self::Api => gpu_booking_core::declared_models::Authority::Api,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Postgres connection URL, e.g. postgres://gpu_booking@db:5432/gpu_booking. It may
    /// hold a password: prefer --database-url-file (its value is never shown in --help).
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        required_unless_present = "database_url_file",
        conflicts_with = "database_url_file"
    )]
    pub database_url: Option<String>,

    /// File holding the Postgres URL (e.g. a mounted Secret); surrounding whitespace
    /// is ignored.
    #[arg(long, env = "GPU_BOOKING_DATABASE_URL_FILE")]
    pub database_url_file: Option<PathBuf>,

    /// Largest number of database connections the service opens.
    #[arg(long, env = "GPU_BOOKING_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
}

#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    // `--jwt-secret`, `--jwt-secret-file`: shared with `gpu-booking token`.
    #[command(flatten)]
    pub secret: JwtSecretArgs,

    /// JWKS URL of an OIDC provider (RS256/ES256 tokens), e.g. Keycloak's
    /// https://sso.example/realms/lab/protocol/openid-connect/certs. Needs
    /// --jwt-issuer and --jwt-audience, and https (see --allow-insecure-jwks-url).
    #[arg(long, env = "GPU_BOOKING_JWKS_URL")]
    pub jwks_url: Option<String>,

    /// Development only: accept an http:// JWKS URL (anyone on the path could swap
    /// the keys and sign in as anyone).
    #[arg(long, env = "GPU_BOOKING_ALLOW_INSECURE_JWKS_URL")]
    pub allow_insecure_jwks_url: bool,

    // `--jwt-issuer`, `--jwt-audience`: shared with `gpu-booking token` and
    // `gpu-booking bootstrap`, which write them into the tokens they mint.
    #[command(flatten)]
    pub claims: JwtClaimArgs,

    /// The OIDC token claim that names the user: `email` (accepted only with
    /// `email_verified: true`), `preferred_username`, `sub`, or any string claim.
    #[arg(long, env = "GPU_BOOKING_JWT_USERNAME_CLAIM", default_value = "email")]
    pub jwt_username_claim: String,

    /// Longest lifetime accepted for a person's token (`exp - iat`): an OIDC token,
    /// or an HS256 token without the `service` role.
    #[arg(long, env = "GPU_BOOKING_MAX_TOKEN_LIFETIME", default_value = "24h", value_parser = gpu_booking_process::duration::parse_duration)]
    pub max_token_lifetime: std::time::Duration,

    /// Longest lifetime accepted for an HS256 token with the `service` role (the
    /// shared service token of the webhook, controller and agent where they do not
    /// use their ServiceAccounts' tokens).
    #[arg(long, env = "GPU_BOOKING_MAX_SERVICE_TOKEN_LIFETIME", default_value = "365days", value_parser = gpu_booking_process::duration::parse_duration)]
    pub max_service_token_lifetime: std::time::Duration,

    /// Accept Kubernetes ServiceAccount tokens bound to this audience (the webhook's,
    /// the controller's and the agent's projected tokens), verified by a TokenReview
    /// (the API's ServiceAccount needs `create` on tokenreviews).
    #[arg(long, env = "GPU_BOOKING_SERVICE_ACCOUNT_AUDIENCE")]
    pub service_account_audience: Option<String>,

    /// The role of a ServiceAccount, NAMESPACE/NAME=ROLE (service or admin); repeat or
    /// separate with commas. Other ServiceAccounts authenticate with no role.
    #[arg(long, env = "GPU_BOOKING_SERVICE_ACCOUNT", value_delimiter = ',', value_parser = parse_sa_binding)]
    pub service_account: Vec<((String, String), crate::role::Role)>,

    /// The OIDC token claim that lists the user's groups (a list of strings, or
    /// one string). A token's groups that an admin created as groups here make the
    /// user a member (source `oidc`) when the user is seen; a token never creates a
    /// group. Empty: tokens' groups are not read.
    #[arg(long, env = "GPU_BOOKING_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
}

impl Default for AuthArgs {
    fn default() -> Self {
        AuthArgs {
            secret: JwtSecretArgs::default(),
            jwks_url: None,
            allow_insecure_jwks_url: false,
            claims: JwtClaimArgs::default(),
            jwt_username_claim: "email".into(),
            max_token_lifetime: std::time::Duration::from_secs(24 * 3600),
            max_service_token_lifetime: std::time::Duration::from_secs(365 * 86_400),
            service_account_audience: None,
            service_account: Vec::new(),
            oidc_groups_claim: "groups".into(),
        }
    }
}

/// The booking page's OIDC login (authorization code with PKCE, in the browser). The
/// server only writes these into the page; the API checks the tokens it gets with
/// `--jwks-url`, `--jwt-issuer` and `--jwt-audience`.
#[derive(Debug, Clone, Args)]
pub struct OidcArgs {
    /// Issuer the booking page signs users in against, e.g. Keycloak's
    /// https://sso.example/realms/lab (https only: the page's CSP allows no other
    /// origin). Unset: the page offers no OIDC button.
    #[arg(long, env = "GPU_BOOKING_OIDC_ISSUER", requires = "oidc_client_id", value_parser = parse_oidc_issuer)]
    pub oidc_issuer: Option<String>,

    /// Client id of the page, a public client with `https://<host>/` as redirect URI.
    #[arg(long, env = "GPU_BOOKING_OIDC_CLIENT_ID", requires = "oidc_issuer", value_parser = parse_oidc_word)]
    pub oidc_client_id: Option<String>,

    /// Scopes the page asks for.
    #[arg(long, env = "GPU_BOOKING_OIDC_SCOPE", default_value = "openid email profile", value_parser = parse_oidc_word)]
    pub oidc_scope: String,

    /// Which token of the issuer's answer the page sends as its bearer token.
    #[arg(long, env = "GPU_BOOKING_OIDC_TOKEN", value_enum, default_value_t = OidcToken::AccessToken)]
    pub oidc_token: OidcToken,
}

impl Default for OidcArgs {
    fn default() -> Self {
        Self {
            oidc_issuer: None,
            oidc_client_id: None,
            oidc_scope: "openid email profile".into(),
            oidc_token: OidcToken::AccessToken,
        }
    }
}

/// The booking page's "Sign in with JupyterHub" (`crate::hub_login`): the page as an
/// OAuth client of the lab's hub, registered there as a service (docs/deploy.md,
/// "Sign in with JupyterHub"). Needs `--page-url` and the HS256 secret.
#[derive(Debug, Clone, Args)]
pub struct HubLoginArgs {
    /// The hub's address as users' browsers reach it, with its base URL (e.g.
    /// https://jupyter.lab.example/). Unset: the page offers no JupyterHub sign-in.
    #[arg(long, env = "GPU_BOOKING_HUB_LOGIN_URL")]
    pub hub_login_url: Option<String>,

    /// The hub's REST API as this service reaches it (e.g.
    /// http://hub.jhub.svc:8081/hub/api). Default: `<hub-login-url>hub/api`.
    #[arg(long, env = "GPU_BOOKING_HUB_LOGIN_API_URL")]
    pub hub_login_api_url: Option<String>,

    /// The OAuth client id of the hub's service entry (`service-<its name>`).
    #[arg(
        long,
        env = "GPU_BOOKING_HUB_LOGIN_CLIENT_ID",
        default_value = "service-gpu-booking"
    )]
    pub hub_login_client_id: String,

    /// The service's `api_token` in the hub, which JupyterHub takes as its OAuth
    /// client secret. Prefer --hub-login-secret-file.
    #[arg(
        long,
        env = "GPU_BOOKING_HUB_LOGIN_SECRET",
        hide_env_values = true,
        conflicts_with = "hub_login_secret_file"
    )]
    pub hub_login_secret: Option<String>,

    /// File holding that secret (a mounted Secret); surrounding whitespace ignored.
    #[arg(long, env = "GPU_BOOKING_HUB_LOGIN_SECRET_FILE")]
    pub hub_login_secret_file: Option<PathBuf>,

    /// Members of this hub group are admins of the booking service. Unset: nobody
    /// becomes an admin by signing in through the hub (a hub admin neither).
    #[arg(long, env = "GPU_BOOKING_HUB_LOGIN_ADMIN_GROUP")]
    pub hub_login_admin_group: Option<String>,

    /// How long the page's token from a hub sign-in lasts (at most
    /// --max-token-lifetime); the page then sends the user through the hub again,
    /// which asks nothing while the hub's own session lasts.
    #[arg(long, env = "GPU_BOOKING_HUB_LOGIN_LIFETIME", default_value = "8h", value_parser = gpu_booking_process::duration::parse_duration)]
    pub hub_login_lifetime: std::time::Duration,

    /// File holding a JupyterHub API token with the `list:groups` and `read:groups`
    /// scopes (only those): with it, the service reads the hub's groups (`GET <api>/groups`, the
    /// API of --hub-login-api-url) every --hub-groups-refresh, and makes the members
    /// of each group an admin created here its members (source `hub`). Unset: hub
    /// groups are recorded only when a user signs in through the hub.
    #[arg(long, env = "GPU_BOOKING_HUB_GROUPS_TOKEN_FILE")]
    pub hub_groups_token_file: Option<PathBuf>,

    /// How often the hub's groups are read (with --hub-groups-token-file).
    #[arg(long, env = "GPU_BOOKING_HUB_GROUPS_REFRESH", default_value = "5min", value_parser = gpu_booking_process::duration::parse_duration)]
    pub hub_groups_refresh: std::time::Duration,
}

impl Default for HubLoginArgs {
    fn default() -> Self {
        Self {
            hub_login_url: None,
            hub_login_api_url: None,
            hub_login_client_id: "service-gpu-booking".into(),
            hub_login_secret: None,
            hub_login_secret_file: None,
            hub_login_admin_group: None,
            hub_login_lifetime: std::time::Duration::from_secs(8 * 3600),
            hub_groups_token_file: None,
            hub_groups_refresh: std::time::Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OidcToken {
    #[value(name = "access_token", alias = "access-token")]
    AccessToken,
    #[value(name = "id_token", alias = "id-token")]
    IdToken,
}

impl OidcToken {
    pub fn as_str(self) -> &'static str {
        match self {
            OidcToken::AccessToken => "access_token",
            OidcToken::IdToken => "id_token",
        }
    }
}

/// An absolute https URL without query or fragment (the page appends
/// `/.well-known/openid-configuration` to it); a trailing slash is dropped.
pub fn parse_oidc_issuer(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if url.scheme() != "https" {
        return Err("the issuer must be an https:// URL".into());
    }
    if url.host_str().is_none() || url.query().is_some() || url.fragment().is_some() {
        return Err("the issuer must be https://host[/path], with no query or fragment".into());
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// A client id or scope list: printable, at most 256 bytes.
pub fn parse_oidc_word(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s.len() > 256 || s.chars().any(char::is_control) {
        return Err("must be 1 to 256 printable characters".into());
    }
    Ok(s.to_owned())
}

#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Shortest booking (e.g. 24h, 1day).
    #[arg(long, env = "GPU_BOOKING_MIN_DURATION", default_value = "24h", value_parser = parse_duration)]
    pub min_duration: TimeDelta,

    /// Longest booking.
    #[arg(long, env = "GPU_BOOKING_MAX_DURATION", default_value = "14days", value_parser = parse_duration)]
    pub max_duration: TimeDelta,

    /// Time between the end of a user's booking and the start of their next one.
    #[arg(long, env = "GPU_BOOKING_COOLDOWN", default_value = "14days", value_parser = parse_duration)]
    pub cooldown: TimeDelta,

    /// Planned (future) bookings a user may hold at once.
    #[arg(long, env = "GPU_BOOKING_MAX_PLANNED", default_value_t = 1)]
    pub max_planned: u32,

    /// Accept a new booking while the user has one running.
    #[arg(long, env = "GPU_BOOKING_ALLOW_BOOKING_WHILE_ACTIVE")]
    pub allow_booking_while_active: bool,

    /// GPUs (units of one model) a booking may be for (1 to 64).
    #[arg(long, env = "GPU_BOOKING_MAX_UNITS_PER_BOOKING", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=gpu_booking_core::booking_policy::MAX_UNITS_PER_BOOKING_LIMIT as i64))]
    pub max_units_per_booking: u32,

    /// How far ahead a booking may start (e.g. 365days, 120days for a term).
    #[arg(long, env = "GPU_BOOKING_MAX_AHEAD", default_value = "365days", value_parser = parse_duration)]
    pub max_ahead: TimeDelta,

    /// Calendar feeds of a model's occupancy name who booked each unit (default:
    /// only "booked", and the caller's own bookings by name).
    #[arg(long, env = "GPU_BOOKING_FEED_SHOW_NAMES")]
    pub feed_show_names: bool,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        let p = Policy::default();
        PolicyArgs {
            min_duration: p.min_duration,
            max_duration: p.max_duration,
            cooldown: p.cooldown,
            max_planned: p.max_planned,
            allow_booking_while_active: !p.no_booking_while_active,
            max_units_per_booking: p.max_units_per_booking,
            max_ahead: p.max_ahead,
            feed_show_names: p.feed_show_names,
        }
    }
}

impl PolicyArgs {
    pub fn policy(&self) -> Policy {
        Policy {
            min_duration: self.min_duration,
            max_duration: self.max_duration,
            cooldown: self.cooldown,
            no_booking_while_active: !self.allow_booking_while_active,
            max_planned: self.max_planned,
            max_units_per_booking: self.max_units_per_booking,
            max_ahead: self.max_ahead,
            feed_show_names: self.feed_show_names,
            // The lab's time zone is the notices' `--time-zone`: [`ApiArgs::lab_policy`].
            zone: gpu_booking_core::notice_text::Tz::UTC,
        }
    }
}

impl ApiArgs {
    /// The lab's policy: the rules' settings, in the lab's time zone (`--time-zone`),
    /// where a group's quota months begin.
    pub fn lab_policy(&self) -> Policy {
        Policy {
            zone: self.notices.time_zone,
            ..self.policy.policy()
        }
    }
}

pub use gpu_booking_process::{init_logging, LogFormat};

/// Policy durations as `TimeDelta`s, parsed by the one range-guarded parser of every
/// component (see `gpu_booking_process::duration`).
pub use gpu_booking_process::duration::parse_time_delta as parse_duration;

/// Rate limits on writes (`POST`, `PUT`, `PATCH`, `DELETE`) of callers without the
/// `service` role, per replica: beyond them a write is answered 429 with
/// `Retry-After` (`gpu_booking_core::write_limits`).
#[derive(Debug, Clone, Args)]
pub struct WriteLimitArgs {
    /// Writes one user may make at once before --user-write-rate applies (0: no
    /// per-user limit).
    #[arg(long, env = "GPU_BOOKING_USER_WRITE_BURST", default_value_t = 20)]
    pub user_write_burst: u32,

    /// Writes per second one user may make on average.
    #[arg(long, env = "GPU_BOOKING_USER_WRITE_RATE", default_value = "1", value_parser = parse_rate)]
    pub user_write_rate: f64,

    /// Writes one source address (an IPv6 /64) may make at once before
    /// --source-write-rate applies (0: no per-source limit). Behind an ingress or
    /// proxy every request comes from its address: this then bounds all users
    /// together.
    #[arg(long, env = "GPU_BOOKING_SOURCE_WRITE_BURST", default_value_t = 200)]
    pub source_write_burst: u32,

    /// Writes per second one source address may make on average.
    #[arg(long, env = "GPU_BOOKING_SOURCE_WRITE_RATE", default_value = "20", value_parser = parse_rate)]
    pub source_write_rate: f64,

    /// Users and addresses whose limits are tracked at once (bounds the memory);
    /// while that many are all busy, further ones share one limit.
    #[arg(long, env = "GPU_BOOKING_WRITE_LIMIT_KEYS", default_value_t = 10_000)]
    pub write_limit_keys: usize,
}

impl Default for WriteLimitArgs {
    fn default() -> Self {
        Self {
            user_write_burst: 20,
            user_write_rate: 1.0,
            source_write_burst: 200,
            source_write_rate: 20.0,
            write_limit_keys: 10_000,
        }
    }
}

impl WriteLimitArgs {
    /// The limits these options set.
    pub fn limits(&self) -> gpu_booking_core::write_limits::WriteLimits {
        use gpu_booking_core::write_limits::{Limit, WriteLimits};
        WriteLimits::new(
            Limit {
                burst: self.user_write_burst,
                per_second: self.user_write_rate,
            },
            Limit {
                burst: self.source_write_burst,
                per_second: self.source_write_rate,
            },
            self.write_limit_keys,
        )
    }
}

/// A rate per second: a finite number above 0.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err("must be a number of writes per second above 0, e.g. 0.5 or 20".into()),
    }
}

/// The API's port limits: bodies up to 1 MiB by default (its requests are small JSON).
pub type ApiLimits = gpu_booking_process::serve::ServerLimits<{ 1024 * 1024 }>;

fn parse_sa_binding(s: &str) -> Result<((String, String), crate::role::Role), String> {
    crate::service_accounts::parse_binding(s)
}

#[cfg(test)]
mod oidc_tests {
    use super::*;

    #[test]
    fn issuer_must_be_plain_https() {
        assert_eq!(
            parse_oidc_issuer("https://sso.example/realms/lab/").unwrap(),
            "https://sso.example/realms/lab"
        );
        for bad in [
            "http://sso.example/realms/lab",
            "javascript:alert(1)",
            "https://sso.example/?x=1",
            "https://sso.example/#a",
            "sso.example",
            "",
        ] {
            assert!(parse_oidc_issuer(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn client_id_and_scope_are_printable_and_short() {
        assert_eq!(parse_oidc_word(" gpu-booking ").unwrap(), "gpu-booking");
        assert!(parse_oidc_word("").is_err());
        assert!(parse_oidc_word("a\nb").is_err());
        assert!(parse_oidc_word(&"a".repeat(257)).is_err());
    }

    #[test]
    fn issuer_and_client_id_come_together() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            oidc: OidcArgs,
        }
        assert!(Cli::try_parse_from(["x", "--oidc-issuer", "https://sso.example"]).is_err());
        assert!(Cli::try_parse_from(["x", "--oidc-client-id", "c"]).is_err());
        let cli = Cli::try_parse_from([
            "x",
            "--oidc-issuer",
            "https://sso.example",
            "--oidc-client-id",
            "c",
            "--oidc-token",
            "id_token",
        ])
        .unwrap();
        assert_eq!(cli.oidc.oidc_token, OidcToken::IdToken);
    }
}
