//! Sign in with JupyterHub: the booking page as one of the hub's OAuth clients.
//!
//! Labs authenticate people in JupyterHub (LDAP, GitHub, native accounts ...), often
//! with no OIDC provider the page could use, and a booking only counts when the
//! page's name and KubeSpawner's agree. Registered as a service of the hub (client id
//! `service-<name>`, the service's `api_token` as the client secret, our callback as
//! its `oauth_redirect_uri`), the page sends the browser to the hub's
//! `/hub/api/oauth2/authorize`; the callback exchanges the code for a hub token
//! (here, not in the browser: the hub's token endpoint wants the secret and sends no
//! CORS headers), asks `/hub/api/user` whose it is, and hands the page a token of
//! ours for that name (HS256 with the API's secret, for at most
//! `--hub-login-lifetime` and `--max-token-lifetime`). The hub's token is dropped:
//! the page never holds it, so nothing on the page can act in the hub as the user.
//!
//! The name is the hub's, normalised as every token's name is, the same one
//! KubeSpawner writes on the user's pods.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{FromRef, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::TimeDelta;
use gpu_booking_core::jwt::JwtClaimArgs;
use gpu_booking_core::username::{NameCase, Username};
use rand::RngCore;
use serde::Deserialize;

use crate::auth::Role;
use crate::config::HubLoginArgs;

/// Where the browser starts signing in and where the hub sends it back.
pub const START_PATH: &str = "/login/hub";
pub const CALLBACK_PATH: &str = "/login/hub/callback";
/// The cookie that ties a callback to the browser that started it (the OAuth
/// `state`): without it, anyone could make a victim's browser finish a sign-in
/// they started, and book as them on the victim's page.
const STATE_COOKIE: &str = "gpu_booking_hub_state";
/// How long a started sign-in may take at the hub (logging in there included).
const STATE_MAX_AGE_SECS: u32 = 600;
/// One call to the hub; its token and user endpoints answer at once.
const HUB_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The page's JupyterHub sign-in, as configured.
pub struct HubLogin {
    /// `<hub>/hub/api/oauth2/authorize`, as the browser reaches the hub.
    authorize_url: String,
    /// `<hub api>/oauth2/token` and `<hub api>/user`, as this service reaches it.
    token_url: String,
    user_url: String,
    client_id: String,
    client_secret: String,
    /// `<page>/login/hub/callback`: registered at the hub as the service's
    /// `oauth_redirect_uri`, compared there exactly.
    redirect_url: String,
    /// Our page's address (where a finished sign-in lands).
    page_url: String,
    secure_cookie: bool,
    admin_group: Option<String>,
    lifetime: TimeDelta,
    secret: Vec<u8>,
    claims: JwtClaimArgs,
    names: NameCase,
    http: reqwest::Client,
}

impl std::fmt::Debug for HubLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the client secret or the signing secret.
        f.debug_struct("HubLogin")
            .field("authorize_url", &self.authorize_url)
            .field("client_id", &self.client_id)
            .field("redirect_url", &self.redirect_url)
            .finish_non_exhaustive()
    }
}

/// What the sign-in needs besides its own options.
pub struct HubLoginContext<'a> {
    /// The API's HS256 secret: the page's tokens are signed with it.
    pub hs256_secret: Option<&'a [u8]>,
    /// `--page-url`.
    pub page_url: Option<&'a str>,
    /// `--jwt-issuer` / `--jwt-audience`, written into the tokens minted here.
    pub claims: &'a JwtClaimArgs,
    /// `--max-token-lifetime`.
    pub max_token_lifetime: Duration,
    pub names: NameCase,
}

impl HubLogin {
    /// The sign-in the options describe, or `None` without `--hub-login-url`.
    /// Refuses incomplete settings with the option to set.
    pub fn from_args(args: &HubLoginArgs, cx: HubLoginContext<'_>) -> anyhow::Result<Option<Self>> {
        let Some(hub_url) = &args.hub_login_url else {
            return Ok(None);
        };
        let hub_url = with_slash(hub_url);
        let page_url = with_slash(cx.page_url.context(
            "--hub-login-url needs --page-url (the hub sends the browser back to <page-url>login/hub/callback)",
        )?);
        let secret = cx.hs256_secret.context(
            "--hub-login-url needs --jwt-secret(-file): the page's tokens are signed with it",
        )?;
        let client_secret = match (&args.hub_login_secret, &args.hub_login_secret_file) {
            (Some(s), _) => s.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
                .trim()
                .to_owned(),
            (None, None) => anyhow::bail!(
                "--hub-login-url needs --hub-login-secret-file: the service's api_token, which the hub takes as its OAuth client secret"
            ),
        };
        anyhow::ensure!(
            !client_secret.is_empty(),
            "the hub login's client secret is empty"
        );
        let api_url = match &args.hub_login_api_url {
            Some(url) => with_slash(url),
            None => format!("{hub_url}hub/api/"),
        };
        for (option, url) in [
            ("--hub-login-url", &hub_url),
            ("--hub-login-api-url", &api_url),
            ("--page-url", &page_url),
        ] {
            anyhow::ensure!(
                url.starts_with("https://") || url.starts_with("http://"),
                "{option} must be an http(s) URL, got {url:?}"
            );
        }
        let lifetime = args.hub_login_lifetime.min(cx.max_token_lifetime);
        Ok(Some(HubLogin {
            authorize_url: format!("{hub_url}hub/api/oauth2/authorize"),
            token_url: format!("{api_url}oauth2/token"),
            user_url: format!("{api_url}user"),
            client_id: args.hub_login_client_id.clone(),
            client_secret,
            redirect_url: format!("{page_url}{}", &CALLBACK_PATH[1..]),
            secure_cookie: page_url.starts_with("https://"),
            page_url,
            admin_group: args.hub_login_admin_group.clone(),
            lifetime: TimeDelta::from_std(lifetime).unwrap_or(TimeDelta::hours(8)),
            secret: secret.to_vec(),
            claims: cx.claims.clone(),
            names: cx.names,
            http: reqwest::Client::builder()
                .timeout(HUB_CALL_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        }))
    }

    /// The authorize address the browser is sent to, for `state`.
    fn authorize(&self, state: &str) -> String {
        let query = [
            ("client_id", self.client_id.as_str()),
            ("redirect_uri", self.redirect_url.as_str()),
            ("response_type", "code"),
            ("state", state),
        ];
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(query)
            .finish();
        format!("{}?{query}", self.authorize_url)
    }

    /// Code -> hub token -> the hub's user -> our token for that user.
    async fn finish(&self, code: &str) -> Result<String, SignInError> {
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("client_id", self.client_id.as_str()),
            ("client_secret", self.client_secret.as_str()),
            ("redirect_uri", self.redirect_url.as_str()),
        ];
        let resp = self
            .http
            .post(&self.token_url)
            .form(&form)
            .send()
            .await
            .map_err(|e| SignInError::hub("reaching JupyterHub's token endpoint", e))?;
        if !resp.status().is_success() {
            // The hub refuses a used, expired or forged code with 400; a wrong
            // secret or client id with 401/403 (the operator's to fix).
            tracing::warn!(status = %resp.status(), "JupyterHub refused the sign-in's code");
            return Err(SignInError::Refused(
                "JupyterHub did not accept this sign-in (it may have expired): start again",
            ));
        }
        let token: HubToken = resp
            .json()
            .await
            .map_err(|e| SignInError::hub("reading JupyterHub's token answer", e))?;
        let resp = self
            .http
            .get(&self.user_url)
            .header(
                header::AUTHORIZATION,
                format!("token {}", token.access_token),
            )
            .send()
            .await
            .map_err(|e| SignInError::hub("asking JupyterHub who signed in", e))?;
        if !resp.status().is_success() {
            tracing::warn!(status = %resp.status(), "JupyterHub would not say whose token the sign-in got");
            return Err(SignInError::Refused(
                "JupyterHub would not say who signed in: start again",
            ));
        }
        let user: HubUser = resp
            .json()
            .await
            .map_err(|e| SignInError::hub("reading JupyterHub's user", e))?;
        self.mint(&user)
    }

    /// Our token for the hub's `user`.
    fn mint(&self, user: &HubUser) -> Result<String, SignInError> {
        if user.kind.as_deref().is_some_and(|k| k != "user") {
            return Err(SignInError::Refused(
                "only people sign in here, not JupyterHub services",
            ));
        }
        let name = Username::normalised(&user.name, self.names).map_err(|e| {
            tracing::warn!(error = %e, "JupyterHub named a user this service cannot take");
            SignInError::Refused("JupyterHub's name for you is not one this service can book for")
        })?;
        let admin = self
            .admin_group
            .as_deref()
            .is_some_and(|g| user.groups.iter().any(|m| m == g));
        // The hub's groups go into the token: the service records them (source
        // `hub`) when the token is used (`routes::groups::seen`).
        let mut extra = serde_json::Map::new();
        extra.insert(
            crate::auth::HUB_GROUPS_CLAIM.into(),
            serde_json::json!(hub_groups(&user.groups)),
        );
        crate::auth::mint_token_with(
            &self.secret,
            name.as_str(),
            admin.then_some(Role::Admin),
            self.lifetime,
            self.claims.jwt_issuer.as_deref(),
            self.claims.jwt_audience.as_deref(),
            extra,
        )
        .map_err(|e| SignInError::Internal(e.context("signing the page's token")))
    }
}

/// The hub groups a sign-in token carries: those that can be groups here, at most
/// 256 (a token stays small).
fn hub_groups(groups: &[String]) -> Vec<&str> {
    groups
        .iter()
        .map(String::as_str)
        .filter(|g| gpu_booking_core::groups::name_problem(g).is_none())
        .take(256)
        .collect()
}

fn with_slash(url: &str) -> String {
    let url = url.trim();
    if url.ends_with('/') {
        url.to_owned()
    } else {
        format!("{url}/")
    }
}

#[derive(Deserialize)]
struct HubToken {
    access_token: String,
}

/// The part of JupyterHub's `GET /hub/api/user` model used here.
#[derive(Deserialize)]
struct HubUser {
    name: String,
    /// `user` or `service`.
    kind: Option<String>,
    /// Present when the token may read the user's groups (the `identify` scope
    /// JupyterHub grants every OAuth token includes them).
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Debug)]
enum SignInError {
    /// Said to the user as it is.
    Refused(&'static str),
    /// The hub could not be reached or answered nonsense.
    Hub(&'static str, reqwest::Error),
    Internal(anyhow::Error),
}

impl SignInError {
    fn hub(doing: &'static str, e: reqwest::Error) -> Self {
        Self::Hub(doing, e)
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Refused(why) => why,
            Self::Hub(..) => {
                "JupyterHub could not be reached to finish signing in: try again in a moment"
            }
            Self::Internal(_) => {
                "signing in failed on this server: try again, or tell the lab's admins"
            }
        }
    }
}

/// The sign-in as the routes take it from the state: `None` where it is not set up
/// (the page holds it; `crate::state` hands it over).
#[derive(Clone, Default)]
pub struct HubLoginState(pub Option<Arc<HubLogin>>);

/// The page's routes of the JupyterHub sign-in (404 where it is not set up).
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    HubLoginState: FromRef<S>,
{
    Router::new()
        .route(START_PATH, get(start))
        .route(CALLBACK_PATH, get(callback))
        // The hub's Services menu links to `/services/<name>/`, which its proxy
        // forwards here unchanged: send the browser to our own address.
        .route("/services/{name}", get(from_hub_menu))
        .route("/services/{name}/", get(from_hub_menu))
        .route("/services/{name}/{*rest}", get(from_hub_menu))
}

/// The answer of every sign-in route on a server without it.
fn not_set_up() -> Response {
    crate::error::ApiError::NotFound("JupyterHub sign-in is not set up on this server".into())
        .into_response()
}

async fn start(State(state): State<HubLoginState>) -> Response {
    let Some(login) = state.0 else {
        return not_set_up();
    };
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let state = hex::encode(bytes);
    let cookie = format!(
        "{STATE_COOKIE}={state}; Path={START_PATH}; Max-Age={STATE_MAX_AGE_SECS}; HttpOnly; SameSite=Lax{}",
        if login.secure_cookie { "; Secure" } else { "" }
    );
    redirect(&login.authorize(&state), Some(cookie))
}

#[derive(Deserialize)]
struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

async fn callback(
    State(state): State<HubLoginState>,
    headers: HeaderMap,
    Query(query): Query<CallbackQuery>,
) -> Response {
    let Some(login) = state.0 else {
        return not_set_up();
    };
    let expected = state_cookie(&headers);
    let outcome = match (&query.error, &query.code, &query.state) {
        (Some(_), _, _) => Err(SignInError::Refused(
            "JupyterHub did not let this page sign you in",
        )),
        (None, Some(code), Some(state))
            if expected.as_deref() == Some(state.as_str()) && !code.is_empty() =>
        {
            login.finish(code).await
        }
        _ => Err(SignInError::Refused(
            "this sign-in was not started from this browser, or took too long: start again",
        )),
    };
    let clear = format!(
        "{STATE_COOKIE}=; Path={START_PATH}; Max-Age=0; HttpOnly; SameSite=Lax{}",
        if login.secure_cookie { "; Secure" } else { "" }
    );
    // The page reads its token (or the problem) from the fragment, which the
    // browser never sends to a server, and removes it from the address at once.
    let fragment = match outcome {
        Ok(token) => format!("hub-token={token}"),
        Err(e) => {
            match &e {
                SignInError::Hub(doing, err) => {
                    tracing::warn!(error = %err, "JupyterHub sign-in: {doing}")
                }
                SignInError::Internal(err) => {
                    tracing::error!(error = %format!("{err:#}"), "JupyterHub sign-in failed")
                }
                SignInError::Refused(why) => tracing::info!(why, "JupyterHub sign-in refused"),
            }
            form_urlencoded::Serializer::new(String::new())
                .append_pair("signin-error", e.message())
                .finish()
        }
    };
    redirect(&format!("{}#{fragment}", login.page_url), Some(clear))
}

async fn from_hub_menu(State(state): State<HubLoginState>) -> Response {
    match state.0 {
        Some(login) => redirect(&format!("{}{}", login.page_url, &START_PATH[1..]), None),
        None => not_set_up(),
    }
}

/// The value of our state cookie in the request, if any.
fn state_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == STATE_COOKIE)
        .map(|(_, value)| value.to_owned())
}

fn redirect(location: &str, cookie: Option<String>) -> Response {
    let mut resp = StatusCode::FOUND.into_response();
    let headers = resp.headers_mut();
    match HeaderValue::from_str(location) {
        Ok(v) => {
            headers.insert(header::LOCATION, v);
        }
        // Built from validated options and hex or URL-encoded values.
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(admin_group: Option<&str>) -> HubLogin {
        let args = HubLoginArgs {
            hub_login_url: Some("https://hub.example/jupyter".into()),
            hub_login_api_url: Some("http://hub.jhub.svc:8081/jupyter/hub/api".into()),
            hub_login_secret: Some("s3cret".into()),
            hub_login_admin_group: admin_group.map(str::to_owned),
            ..HubLoginArgs::default()
        };
        HubLogin::from_args(
            &args,
            HubLoginContext {
                hs256_secret: Some(&[7u8; 32]),
                page_url: Some("https://gpu.example"),
                claims: &JwtClaimArgs::default(),
                max_token_lifetime: Duration::from_secs(3600),
                names: NameCase::Lowercase,
            },
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn addresses_are_built_from_the_hub_and_the_page() {
        let l = login(None);
        assert_eq!(
            l.authorize_url,
            "https://hub.example/jupyter/hub/api/oauth2/authorize"
        );
        assert_eq!(
            l.token_url,
            "http://hub.jhub.svc:8081/jupyter/hub/api/oauth2/token"
        );
        assert_eq!(l.user_url, "http://hub.jhub.svc:8081/jupyter/hub/api/user");
        assert_eq!(l.redirect_url, "https://gpu.example/login/hub/callback");
        assert!(l.secure_cookie);
        assert_eq!(
            l.lifetime,
            TimeDelta::hours(1),
            "capped by --max-token-lifetime"
        );
        assert_eq!(
            l.authorize("ab"),
            "https://hub.example/jupyter/hub/api/oauth2/authorize?client_id=service-gpu-booking\
             &redirect_uri=https%3A%2F%2Fgpu.example%2Flogin%2Fhub%2Fcallback&response_type=code&state=ab"
        );
    }

    #[test]
    fn incomplete_settings_name_the_missing_option() {
        let args = HubLoginArgs {
            hub_login_url: Some("https://hub.example".into()),
            ..HubLoginArgs::default()
        };
        let cx = |page: Option<&'static str>, secret: Option<&'static [u8]>| HubLoginContext {
            hs256_secret: secret,
            page_url: page,
            claims: Box::leak(Box::new(JwtClaimArgs::default())),
            max_token_lifetime: Duration::from_secs(3600),
            names: NameCase::Lowercase,
        };
        let err = |r: anyhow::Result<Option<HubLogin>>| format!("{:#}", r.unwrap_err());
        assert!(err(HubLogin::from_args(&args, cx(None, Some(&[1; 32])))).contains("--page-url"));
        assert!(
            err(HubLogin::from_args(&args, cx(Some("https://p"), None))).contains("--jwt-secret")
        );
        assert!(err(HubLogin::from_args(
            &args,
            cx(Some("https://p"), Some(&[1; 32]))
        ))
        .contains("--hub-login-secret-file"));
        assert!(
            HubLogin::from_args(&HubLoginArgs::default(), cx(None, None))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn services_and_unusable_names_are_refused() {
        let l = login(None);
        let user = |name: &str, kind: &str| HubUser {
            name: name.into(),
            kind: Some(kind.into()),
            groups: vec![],
        };
        assert!(matches!(
            l.mint(&user("gpu-booking", "service")),
            Err(SignInError::Refused(_))
        ));
        assert!(matches!(
            l.mint(&user("a\u{0}b", "user")),
            Err(SignInError::Refused(_))
        ));
        assert!(l.mint(&user("Alice", "user")).is_ok());
    }

    #[test]
    fn the_admin_group_makes_admins() {
        let l = login(Some("gpu-admins"));
        let decode = |token: String| {
            let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
            v.validate_aud = false;
            jsonwebtoken::decode::<serde_json::Value>(
                &token,
                &jsonwebtoken::DecodingKey::from_secret(&[7u8; 32]),
                &v,
            )
            .unwrap()
            .claims
        };
        let admin = decode(
            l.mint(&HubUser {
                name: "Bob".into(),
                kind: None,
                groups: vec!["gpu-admins".into()],
            })
            .unwrap(),
        );
        assert_eq!(admin["sub"], "bob", "normalised as KubeSpawner's name is");
        assert_eq!(admin["roles"], serde_json::json!(["admin"]));
        let user = decode(
            l.mint(&HubUser {
                name: "carol".into(),
                kind: None,
                groups: vec!["ml-lab".into()],
            })
            .unwrap(),
        );
        assert_eq!(user["roles"], serde_json::json!([]));
    }

    #[test]
    fn the_state_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; gpu_booking_hub_state=xyz; b=2"),
        );
        assert_eq!(state_cookie(&headers).as_deref(), Some("xyz"));
        assert_eq!(state_cookie(&HeaderMap::new()), None);
    }
}
