//! JupyterHub's REST API, for `--on-expiry hub-restart`: the controller asks the hub
//! to stop a user's server and start it again, instead of deleting and re-creating the
//! pod behind the hub's back.
//!
//! Why (KubeSpawner's `spawner.py`, jupyterhub/kubespawner): `poll()` answers from
//! the hub's pod reflector and returns 1, "pod doesn't exist or has been deleted",
//! whenever no pod of the server's name is there; the hub then takes the server for
//! stopped and calls `stop()`, which deletes the pod *by name*
//! (`delete_namespaced_pod(name=pod_name, ...)`, no uid precondition) and waits for it
//! to disappear. A poll that falls between the controller's delete and its re-create
//! therefore deletes the re-created pod, and the hub shows the server stopped. Also,
//! KubeSpawner's start treats a pod already under the name (409) as stale and deletes
//! it. Stopping and starting through the hub keeps the hub's state and the pod in step,
//! and the new pod passes the admission webhook like any spawn.
//!
//! The API (JupyterHub's REST API): `DELETE /users/{name}/server` (or
//! `/servers/{server}` for a named server) stops it: 204 stopped, 202 stop pending;
//! `POST` starts it: 201 started, 202 spawn pending, 400 when it is already running or
//! still pending; `GET /users/{name}` lists the user's `servers` with `ready` and
//! `pending` (`"spawn"`, `"stop"`, or null). The token (a hub service with a role
//! granting the `servers` scope) goes in `Authorization: token ...`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_booking_client::{TokenError, TokenSource};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

/// How often the hub is asked whether a stop finished.
/// KubeSpawner's annotation (and label) with the server's name ("" or absent: the
/// default server). The annotation keeps the exact name; KubeSpawner 7 cleans the
/// label's (`GPU run` -> `gpu-run---64409e31`).
pub const SERVER_NAME_KEY: &str = "hub.jupyter.org/servername";
const STATE_POLL: Duration = Duration::from_millis(500);

/// A server's state as the hub reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// The hub knows no such user (404): the pod is not the hub's to restart.
    NoSuchUser,
    Stopped,
    Running,
    /// Spawning or stopping (`"spawn"`, `"stop"`).
    Pending(String),
}

/// The hub's API.
pub struct Hub {
    http: reqwest::Client,
    /// `.../hub/api/` (always ending in `/`).
    base: Url,
    token: TokenSource,
    /// One call's bound (`--hub-timeout`).
    timeout: Duration,
    /// False once the hub refused the token (403) or its scopes lack `servers`: a
    /// booked pod must still leave its GPU on time, so restarts fall back to the
    /// CPU-only copy until the controller restarts with a better token.
    usable: AtomicBool,
}

impl Hub {
    /// `api_url` is the hub's API URL (`http://hub:8081/hub/api`, what JupyterHub
    /// gives its services as `JUPYTERHUB_API_URL`).
    pub fn new(api_url: &str, token: TokenSource, timeout: Duration) -> anyhow::Result<Self> {
        let mut base = Url::parse(api_url.trim_end_matches('/'))
            .map_err(|e| anyhow::anyhow!("--hub-api-url {api_url:?}: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            anyhow::bail!("--hub-api-url {api_url:?} is not an http(s) URL");
        }
        base.set_path(&format!("{}/", base.path().trim_end_matches('/')));
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!(
                "gpu-booking-controller/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()?;
        Ok(Self {
            http,
            base,
            token,
            timeout,
            usable: AtomicBool::new(true),
        })
    }

    /// Whether restarts go through the hub (its token was not refused).
    pub fn usable(&self) -> bool {
        self.usable.load(Ordering::Relaxed)
    }

    /// The hub refused the token: restarts fall back to CPU-only copies.
    pub fn set_unusable(&self) {
        self.usable.store(false, Ordering::Relaxed);
    }

    /// `users/{user}` or `users/{user}/server` / `users/{user}/servers/{server}`, each
    /// segment percent-encoded.
    fn url(&self, user: &str, server: Option<&str>) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("users").push(user);
            match server {
                None => {}
                Some("") => {
                    path.push("server");
                }
                Some(name) => {
                    path.push("servers").push(name);
                }
            }
        }
        url
    }

    async fn call(&self, method: Method, url: Url) -> Result<(StatusCode, Value), HubError> {
        let token = self.token.token().map_err(HubError::Token)?;
        let resp = self
            .http
            .request(method, url)
            .header(reqwest::header::AUTHORIZATION, format!("token {token}"))
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    HubError::TimedOut(self.timeout)
                } else {
                    HubError::Call(e.without_url())
                }
            })?;
        let status = resp.status();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// The state of `user`'s server `server` ("" for the default one).
    pub async fn state(&self, user: &str, server: &str) -> Result<ServerState, HubError> {
        let (status, body) = self.call(Method::GET, self.url(user, None)).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(ServerState::NoSuchUser);
        }
        if status == StatusCode::FORBIDDEN {
            return Err(HubError::Forbidden(message(&body)));
        }
        if !status.is_success() {
            return Err(HubError::User(status));
        }
        let Some(entry) = body.get("servers").and_then(|s| s.get(server)) else {
            return Ok(ServerState::Stopped);
        };
        Ok(match entry.get("pending").and_then(Value::as_str) {
            Some(pending) => ServerState::Pending(pending.to_owned()),
            None => ServerState::Running,
        })
    }

    /// When the hub last saw activity of `user`'s server `server` (its
    /// `last_activity`: the proxy's traffic and the single-user server's own activity
    /// reports, every few minutes); `Ok(None)` when the server is not running or the
    /// hub does not say. What a restart on an offered GPU waits for: a CPU notebook
    /// has no GPU activity to judge it by.
    pub async fn last_activity(
        &self,
        user: &str,
        server: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, HubError> {
        let (status, body) = self.call(Method::GET, self.url(user, None)).await?;
        if status == StatusCode::NOT_FOUND {
            return Err(HubError::UnknownUser);
        }
        if status == StatusCode::FORBIDDEN {
            return Err(HubError::Forbidden(message(&body)));
        }
        if !status.is_success() {
            return Err(HubError::User(status));
        }
        let Some(entry) = body.get("servers").and_then(|s| s.get(server)) else {
            return Ok(None);
        };
        Ok(entry
            .get("last_activity")
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok()))
    }

    /// Asks the hub to stop the server (KubeSpawner deletes the pod); returns once the
    /// hub accepted (the pod may still be terminating).
    pub async fn stop(&self, user: &str, server: &str) -> Result<(), HubError> {
        let (status, body) = self
            .call(Method::DELETE, self.url(user, Some(server)))
            .await?;
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::FORBIDDEN {
            return Err(HubError::Forbidden(message(&body)));
        }
        // Already stopped, or stopping: as good. A user the hub does not know is not:
        // the pod would then be ended with nothing to start it again.
        match self.state(user, server).await? {
            ServerState::NoSuchUser => Err(HubError::UnknownUser),
            ServerState::Stopped => Ok(()),
            ServerState::Pending(p) if p == "stop" => Ok(()),
            _ => Err(HubError::RefusedStop(status, message(&body))),
        }
    }

    /// Asks the hub to start the server again once its stop has finished (waiting at
    /// most `wait`); a server already running or spawning counts as started.
    pub async fn start(&self, user: &str, server: &str, wait: Duration) -> Result<(), HubError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.state(user, server).await? {
                ServerState::NoSuchUser => return Err(HubError::UnknownUser),
                ServerState::Stopped => break,
                ServerState::Running => return Ok(()),
                ServerState::Pending(p) if p != "stop" => return Ok(()),
                ServerState::Pending(_) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HubError::StillStopping(wait));
            }
            tokio::time::sleep(STATE_POLL).await;
        }
        let (status, body) = self
            .call(Method::POST, self.url(user, Some(server)))
            .await?;
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::FORBIDDEN {
            return Err(HubError::Forbidden(message(&body)));
        }
        match self.state(user, server).await? {
            ServerState::Running | ServerState::Pending(_) => Ok(()),
            ServerState::NoSuchUser => Err(HubError::UnknownUser),
            ServerState::Stopped => Err(HubError::RefusedStart(status, message(&body))),
        }
    }

    /// Whether the token may stop and start other users' servers: its scopes, as the
    /// hub lists them for the token's owner (`GET /user`), include `servers` or
    /// `admin:servers` (JupyterHub's scopes; a filtered `servers!group=...` covers
    /// only some users, which a lab's service role rarely means, so it counts as
    /// not enough). `Ok(None)`: the hub lists no scopes (older than JupyterHub 2).
    pub async fn may_restart_servers(&self) -> Result<Option<bool>, HubError> {
        let mut url = self.base.clone();
        url.set_path(&format!("{}user", self.base.path()));
        let (status, body) = self.call(Method::GET, url).await?;
        if !status.is_success() {
            return Err(HubError::User(status));
        }
        Ok(body.get("scopes").and_then(Value::as_array).map(|scopes| {
            scopes
                .iter()
                .filter_map(Value::as_str)
                .any(|s| s == "servers" || s == "admin:servers")
        }))
    }
}

/// The hub's error message, bounded.
/// What went wrong asking JupyterHub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    Token(TokenError),
    #[error("calling JupyterHub: {0}")]
    Call(reqwest::Error),
    #[error("JupyterHub did not answer within {0:?} (--hub-timeout)")]
    TimedOut(Duration),
    #[error("JupyterHub answered {0} for the user")]
    User(StatusCode),
    #[error("JupyterHub refused to stop the server: {0} {1}")]
    RefusedStop(StatusCode, String),
    #[error("JupyterHub did not finish stopping the server within {0:?}")]
    StillStopping(Duration),
    #[error("JupyterHub refused to start the server: {0} {1}")]
    RefusedStart(StatusCode, String),
    #[error("JupyterHub refused the token (403 {0}): it lacks the `servers` scope")]
    Forbidden(String),
    #[error("JupyterHub knows no such user")]
    UnknownUser,
}

fn message(body: &Value) -> String {
    body.get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_each_segment() {
        let hub = Hub::new(
            "http://hub:8081/hub/api",
            TokenSource::Static("t".into()),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            hub.url("zoë@uni.example", Some("")).as_str(),
            "http://hub:8081/hub/api/users/zo%C3%AB@uni.example/server"
        );
        assert_eq!(
            hub.url("a/b", Some("gpu run")).as_str(),
            "http://hub:8081/hub/api/users/a%2Fb/servers/gpu%20run"
        );
        assert_eq!(
            hub.url("bob", None).as_str(),
            "http://hub:8081/hub/api/users/bob"
        );
        assert!(Hub::new(
            "ftp://x",
            TokenSource::Static("t".into()),
            Duration::from_secs(1)
        )
        .is_err());
        assert!(Hub::new(
            "not a url",
            TokenSource::Static("t".into()),
            Duration::from_secs(1)
        )
        .is_err());
    }
}
