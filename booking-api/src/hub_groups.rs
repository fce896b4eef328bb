//! JupyterHub's groups, read through the hub's REST API with a read-only token
//! (`--hub-groups-token-file`, scopes `list:groups` and `read:groups`) every `--hub-groups-refresh`: the
//! members of each group an admin created here become its members with source `hub`
//! (`store::groups::sync_all`); hub groups without a group here are ignored. A read
//! that fails changes nothing (the last memberships stay until the hub answers).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use gpu_booking_core::groups::{name_problem, Source};
use gpu_booking_core::username::{NameCase, Username};
use serde::Deserialize;
use sqlx::PgPool;

use crate::config::HubLoginArgs;

/// One call to the hub.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Groups read per page, and pages at most (a bound on one refresh's memory).
const PAGE: usize = 200;
const MAX_PAGES: usize = 500;

/// The hub's groups API, as configured.
pub struct HubGroups {
    /// `<hub api>/groups`.
    url: String,
    token: String,
    names: NameCase,
    http: reqwest::Client,
}

impl std::fmt::Debug for HubGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("HubGroups")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// One page of `GET /groups` with JupyterHub's pagination
/// (`Accept: application/jupyterhub-pagination+json`).
#[derive(Deserialize)]
struct Page {
    items: Vec<HubGroup>,
    #[serde(rename = "_pagination", default)]
    pagination: Option<Pagination>,
}

#[derive(Deserialize)]
struct Pagination {
    next: Option<Next>,
}

#[derive(Deserialize)]
struct Next {
    offset: usize,
}

#[derive(Deserialize)]
struct HubGroup {
    name: String,
    #[serde(default)]
    users: Vec<String>,
}

impl HubGroups {
    /// The refresh the options describe, or `None` without `--hub-groups-token-file`.
    /// The API's address is `--hub-login-api-url`, else `<hub-login-url>hub/api/`.
    pub fn from_args(args: &HubLoginArgs, names: NameCase) -> anyhow::Result<Option<HubGroups>> {
        let Some(path) = &args.hub_groups_token_file else {
            return Ok(None);
        };
        let api = match (&args.hub_login_api_url, &args.hub_login_url) {
            (Some(api), _) => api.trim().trim_end_matches('/').to_owned(),
            (None, Some(hub)) => format!("{}/hub/api", hub.trim().trim_end_matches('/')),
            (None, None) => anyhow::bail!(
                "--hub-groups-token-file needs --hub-login-api-url or --hub-login-url (where the hub's API is)"
            ),
        };
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_owned();
        anyhow::ensure!(!token.is_empty(), "the hub groups token file is empty");
        Ok(Some(HubGroups::new(&api, &token, names)?))
    }

    /// Reads `<api>/groups` with `token`.
    pub fn new(api: &str, token: &str, names: NameCase) -> anyhow::Result<HubGroups> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .context("building the hub groups client")?;
        Ok(HubGroups {
            url: format!("{}/groups", api.trim_end_matches('/')),
            token: token.to_owned(),
            names,
            http,
        })
    }

    /// Every hub group that can be a group here, with its users as the service names
    /// them (normalised; names it cannot take are left out).
    pub async fn read(&self) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
        let mut out = BTreeMap::new();
        let mut offset = 0;
        for _ in 0..MAX_PAGES {
            let resp = self
                .http
                .get(&self.url)
                .query(&[("offset", offset), ("limit", PAGE)])
                .header(
                    reqwest::header::AUTHORIZATION,
                    format!("token {}", self.token),
                )
                .header(
                    reqwest::header::ACCEPT,
                    "application/jupyterhub-pagination+json",
                )
                .send()
                .await
                .context("reaching JupyterHub's groups API")?;
            anyhow::ensure!(
                resp.status().is_success(),
                "JupyterHub's groups API answered {} (the token needs the list:groups and read:groups scopes)",
                resp.status()
            );
            let page: Page = resp.json().await.context("reading JupyterHub's groups")?;
            for g in page.items {
                if name_problem(&g.name).is_some() {
                    continue;
                }
                let users: BTreeSet<String> = g
                    .users
                    .iter()
                    .filter_map(|u| Username::normalised(u, self.names).ok())
                    .map(String::from)
                    .collect();
                out.insert(g.name, users);
            }
            match page.pagination.and_then(|p| p.next) {
                Some(next) if next.offset > offset => offset = next.offset,
                _ => return Ok(out),
            }
        }
        anyhow::bail!("JupyterHub's groups did not end within {MAX_PAGES} pages")
    }

    /// One refresh: read, then make the `hub` memberships what the hub says.
    /// Returns the memberships added and removed.
    pub async fn refresh(&self, pool: &PgPool) -> anyhow::Result<(u64, u64)> {
        let groups = self.read().await?;
        let now = chrono::Utc::now();
        Ok(crate::store::groups::sync_all(pool, Source::Hub, &groups, now).await?)
    }

    /// Refreshes every `every` (the first at once) until the runtime ends.
    pub fn spawn(self, pool: PgPool, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_secs(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.refresh(&pool).await {
                    Ok((added, removed)) => {
                        tracing::debug!(added, removed, "hub groups refreshed")
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "hub groups not refreshed")
                    }
                }
            }
        })
    }
}
