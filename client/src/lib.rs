//! The booking service's one HTTP client, as the webhook, the controller and the node
//! agent call it with a service token: the schedulability answer and the replica's
//! snapshot, the model catalog, usage and held-units reports, audit reports and the
//! booking change stream, and a course reservation's title. The messages are
//! `core`'s wire types ([`gpu_booking_core::wire`]), the same ones the service
//! serialises, but for [`CourseTitle`] (the two fields read of the service's own
//! reservation answer).
//! Also the service token itself ([`TokenSource`]).
//!
//! Every call has a timeout; every failure is an error (a failed call never reads as
//! an empty answer).
#![forbid(unsafe_code)]

mod follow;
pub mod options;
mod token;

use std::time::Duration;

use gpu_booking_core::admission::{AdmissionState, Ask};
use gpu_booking_core::wire::{AuditBatch, HeldReported, Recorded, RecordedBatch};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use follow::{ChangeSource, Followed, Follower};
pub use gpu_booking_core::wire::{
    AuditReport, Booking, BookingChange, BookingChanges, HeldReport, Model, NextStep, Notebook,
    NotebookStanding, Notebooks, Offer, Offers, OffersReport, Schedulability, UsageReport,
};
pub use options::BookingServiceArgs;
pub use token::{FileVersion, TokenError, TokenSource};

/// What the controller reads of a course reservation (`GET
/// /api/v1/reservations/{id}`, the service's `Reservation`; its other fields are
/// not read).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct CourseTitle {
    /// What the page and the feeds call it ("ML101 lab").
    pub title: String,
    /// Its group's name (`None` once the group is gone).
    #[serde(default)]
    pub group: Option<String>,
}

/// Why a call gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("booking service answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("booking service did not answer in time")]
    Timeout,
    #[error("booking service unreachable: {0}")]
    Transport(String),
    #[error("booking service sent an unreadable answer: {0}")]
    Body(String),
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// The client. Cheap to share behind an `Arc`; connections are kept alive.
pub struct BookingClient {
    http: reqwest::Client,
    base: String,
    token: TokenSource,
    timeout: Duration,
}

impl BookingClient {
    /// `base` is the service's URL (`http://gpu-booking-api:8080`); `user_agent` names
    /// the caller in the service's logs.
    pub fn new(
        base: &str,
        token: TokenSource,
        timeout: Duration,
        user_agent: &str,
    ) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&base).map_err(|e| anyhow::anyhow!("booking URL {base:?}: {e}"))?;
        // Connections kept alive for the admission path's bursts (the webhook's
        // schedulability lookups); no Nagle delay on small requests.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(32)
            .tcp_nodelay(true)
            .user_agent(user_agent)
            .build()?;
        Ok(Self {
            http,
            base,
            token,
            timeout,
        })
    }

    /// The models, in matching order.
    pub async fn models(&self) -> Result<Vec<Model>, ClientError> {
        let mut models: Vec<Model> = self
            .call(reqwest::Method::GET, "/api/v1/models", None::<&()>)
            .await?;
        models.sort_by_key(|m| m.position);
        Ok(models)
    }

    /// Reports what the controller counted of a model.
    pub async fn put_usage(&self, model: &str, report: &UsageReport) -> Result<(), ClientError> {
        let path = format!("/api/v1/models/{model}/usage");
        self.call::<Model>(reqwest::Method::PUT, &path, Some(report))
            .await?;
        Ok(())
    }

    /// Reports the units each booking's high-priority pods hold (the whole count:
    /// bookings left out hold none) and their last GPU activity.
    pub async fn put_held(&self, held: &HeldReport) -> Result<(), ClientError> {
        self.call::<HeldReported>(reqwest::Method::PUT, "/api/v1/held-units", Some(held))
            .await?;
        Ok(())
    }

    /// The controller's offers of GPUs given back (`PUT /api/v1/offers`, the whole
    /// list): the offers the service keeps, and the users it left out for a booking.
    pub async fn put_offers(&self, report: &OffersReport) -> Result<Offers, ClientError> {
        self.call(reqwest::Method::PUT, "/api/v1/offers", Some(report))
            .await
    }

    /// Every offer as last reported (`GET /api/v1/offers`): a new leader takes them
    /// back.
    pub async fn offers(&self) -> Result<Offers, ClientError> {
        self.call(reqwest::Method::GET, "/api/v1/offers", None::<&()>)
            .await
    }

    /// The webhook's one question about a GPU pod (`GET /api/v1/schedulability`):
    /// the owner's active booking and the free units (`?user=` or `?slug=`), or the
    /// free units alone (no query).
    pub async fn schedulability(&self, ask: Ask<'_>) -> Result<Schedulability, ClientError> {
        let query = match ask {
            Ask::Owner(who) => Some(who.query()),
            Ask::FreeUnits => None,
        };
        self.call_within(
            reqwest::Method::GET,
            "/api/v1/schedulability",
            query.as_slice(),
            None::<&()>,
            None,
        )
        .await
    }

    /// One answer of the booking change stream: `after: None` lists the current
    /// bookings; otherwise the changes after `after`, waiting up to `wait` (at most
    /// 30 s) for one. The call's timeout is the client's plus `wait`.
    pub async fn booking_changes(
        &self,
        after: Option<i64>,
        wait: Duration,
    ) -> Result<BookingChanges, ClientError> {
        let path = match after {
            Some(after) => format!(
                "/api/v1/booking-changes?after={after}&wait={}",
                wait.as_secs().min(30)
            ),
            None => "/api/v1/booking-changes".to_owned(),
        };
        self.call_within(reqwest::Method::GET, &path, &[], None::<&()>, Some(wait))
            .await
    }

    /// What the webhook's replica decides from (`GET /api/v1/admission-state`): with
    /// `full`, also the bookings, users and the change stream position.
    pub async fn admission_state(&self, full: bool) -> Result<AdmissionState, ClientError> {
        let path = format!("/api/v1/admission-state?full={full}");
        self.call(reqwest::Method::GET, &path, None::<&()>).await
    }

    /// A course reservation's title and group (`GET /api/v1/reservations/{id}`), to
    /// name the course in a notice to its members.
    pub async fn course_title(&self, id: i64) -> Result<CourseTitle, ClientError> {
        let path = format!("/api/v1/reservations/{id}");
        self.call(reqwest::Method::GET, &path, None::<&()>).await
    }

    /// Records many actions in one call (`POST /api/v1/audit/batch`, at most 500):
    /// all or none; returns the rows' ids.
    pub async fn audit_batch(&self, batch: &AuditBatch) -> Result<Vec<i64>, ClientError> {
        let recorded: RecordedBatch = self
            .call(reqwest::Method::POST, "/api/v1/audit/batch", Some(batch))
            .await?;
        Ok(recorded.ids)
    }

    /// Records an action in the audit log; returns the row's id.
    pub async fn audit(&self, report: &AuditReport) -> Result<i64, ClientError> {
        let recorded: Recorded = self
            .call(reqwest::Method::POST, "/api/v1/audit", Some(report))
            .await?;
        Ok(recorded.id)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        self.call_within(method, path, &[], body, None).await
    }

    /// A call with `query` pairs (encoded here); `longer` is added to the client's
    /// timeout (a long poll's wait).
    async fn call_within<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&impl Serialize>,
        longer: Option<Duration>,
    ) -> Result<T, ClientError> {
        let token = self.token.token()?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(longer) = longer {
            request = request.timeout(self.timeout + longer);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport_error)?;
        if !status.is_success() {
            let body = String::from_utf8_lossy(&bytes).chars().take(512).collect();
            return Err(ClientError::Status {
                status: status.as_u16(),
                body,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Body(e.to_string()))
    }
}

fn transport_error(e: reqwest::Error) -> ClientError {
    if e.is_timeout() {
        return ClientError::Timeout;
    }
    // The chain names the cause (connection refused, reset, ...).
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    ClientError::Transport(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    /// A tiny fake of the booking service: one route answering `status`.
    async fn fake_service(status: u16, body: &'static str) -> String {
        let app = axum::Router::new().route(
            "/api/v1/models",
            get(move || async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn client(url: &str) -> BookingClient {
        BookingClient::new(
            url,
            TokenSource::Static("t".into()),
            Duration::from_secs(5),
            "test",
        )
        .unwrap()
    }

    #[tokio::test]
    async fn errors_are_errors_not_empty_answers() {
        let url = fake_service(500, "boom").await;
        let e = client(&url).models().await.unwrap_err();
        assert_eq!(
            e,
            ClientError::Status {
                status: 500,
                body: "boom".into()
            }
        );
        let url = fake_service(200, "not json").await;
        assert!(matches!(
            client(&url).models().await,
            Err(ClientError::Body(_))
        ));
        let url = fake_service(200, r#"[{"name":"b","position":1},{"name":"a","position":0,"patterns":["*A100*"],"units":2,"extra":1}]"#).await;
        let models = client(&url).models().await.unwrap();
        assert_eq!(models[0].name, "a");
        assert_eq!(models[0].patterns, ["*A100*"]);
    }

    #[test]
    fn token_file_is_reread_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("gpu-booking-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "one\n").unwrap();
        let source = TokenSource::file(path.clone()).unwrap();
        assert_eq!(source.token().unwrap(), "one");
        std::fs::write(&path, "second").unwrap();
        assert_eq!(source.token().unwrap(), "second");
        std::fs::write(&path, "").unwrap();
        assert!(source.token().is_err());
        assert!(TokenSource::from_options(Some("  "), None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
