//! Prometheus metrics of the API (`gpu_booking_api_*`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use gpu_booking_core::usage::DEFAULT_IDLE_AFTER;
use gpu_booking_process::access::Access;
use gpu_booking_process::metrics::ComponentRegistry;

/// Every value comes from a closed set (see [`method_label`], [`status_label`]; the
/// route is a template of the router or `unmatched`), so that no client can grow the
/// metrics by sending made-up methods, paths or statuses.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    pub route: String,
    pub status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// `active` or `planned`.
    pub status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    /// A declared model (a set the admins keep).
    pub model: String,
}

/// How often the service probes the database for `gpu_booking_database_up`.
pub const DATABASE_PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a scrape waits for the booking state before answering without it.
pub const REFRESH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The booking state as gauges, read from the database at each scrape
/// ([`Metrics::refresh`]).
#[derive(Default)]
pub struct StateGauges {
    /// Bookings not cancelled that run now (`active`) or start later (`planned`).
    pub bookings: Family<StatusLabel, Gauge>,
    /// Declared units per model.
    pub units: Family<ModelLabel, Gauge>,
    /// Units with no pod on them (as the controller last reported).
    pub free: Family<ModelLabel, Gauge>,
    /// Units held by bookings active now.
    pub booked: Family<ModelLabel, Gauge>,
    /// Units in use beyond those booked now: lent to unbooked pods.
    pub lent: Family<ModelLabel, Gauge>,
    /// Running bookings that no pod has held a GPU for since they started, started
    /// at least [`DEFAULT_IDLE_AFTER`] ago: no-shows, as the usage report counts them.
    pub no_shows: Family<ModelLabel, Gauge>,
    /// Failed reads of the booking state (the gauges keep their last values).
    pub refresh_errors: Counter,
}

pub struct Metrics {
    pub registry: ComponentRegistry,
    /// `gpu_booking_database_up`: 1 while the database answers, 0 from a probe or a
    /// request that found it unreachable until one that reaches it (see
    /// [`Metrics::probe_database`]).
    pub database_up: Gauge,
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Family<RouteLabels, Histogram>,
    /// Booking create attempts by result: `created` or the refusing rule's code.
    pub booking_creates: Family<ResultLabels, Counter>,
    /// Creates written together (`crate::create_queue`): 1 when a worker was idle.
    pub create_batch_size: Histogram,
    pub state: StateGauges,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = ComponentRegistry::new("api");
        let database_up = registry.unprefixed().add(
            "database_up",
            "1 while the booking database answers the API, 0 while it cannot be reached",
            Gauge::default(),
        );
        let mut r = registry.families();
        Metrics {
            database_up,
            requests: r.add(
                "http_requests",
                "HTTP requests by route and status",
                Family::default(),
            ),
            duration: r.add(
                "http_request_duration_seconds",
                "HTTP request duration by route",
                Family::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
                }),
            ),
            booking_creates: r.add(
                "booking_creates",
                "Booking create attempts by result",
                Family::default(),
            ),
            create_batch_size: r.add(
                "booking_create_batch_size",
                "Booking creates decided and written in one transaction",
                Histogram::new(exponential_buckets(1.0, 2.0, 5)),
            ),
            state: StateGauges {
                bookings: r.add(
                    "bookings",
                    "Bookings not cancelled, by status (active now, planned)",
                    Family::default(),
                ),
                units: r.add(
                    "model_units",
                    "Units of each model its admin declared",
                    Family::default(),
                ),
                free: r.add(
                    "model_units_free",
                    "Units of each model with no pod on them, as the controller last reported",
                    Family::default(),
                ),
                booked: r.add(
                    "model_units_booked",
                    "Units of each model held by bookings active now",
                    Family::default(),
                ),
                lent: r.add(
                    "model_units_lent",
                    "Units of each model in use beyond those booked now (lent to unbooked pods)",
                    Family::default(),
                ),
                no_shows: r.add(
                    "bookings_no_show",
                    "Running bookings of each model that no pod has held a GPU for, started at least 4 hours ago (no-shows)",
                    Family::default(),
                ),
                refresh_errors: r.add(
                    "state_refresh_errors",
                    "Failed reads of the booking state for the gauges above",
                    Counter::default(),
                ),
            },
            registry,
        }
    }
}

impl Metrics {
    /// Reads the booking state into the gauges (at each scrape). On a database
    /// error the gauges keep their last values and `state_refresh_errors` counts it.
    /// Bounded by [`REFRESH_TIMEOUT`], so that a scrape answers (and the API's `up`
    /// stays 1) while the database does not.
    pub async fn refresh(&self, db: &sqlx::PgPool, now: chrono::DateTime<chrono::Utc>) {
        let error = match tokio::time::timeout(REFRESH_TIMEOUT, self.try_refresh(db, now)).await {
            Ok(Ok(())) => {
                self.database_up.set(1);
                return;
            }
            Ok(Err(e)) => {
                self.database_seen(Err(&e));
                e.to_string()
            }
            Err(_) => {
                self.database_up.set(0);
                format!("no answer within {REFRESH_TIMEOUT:?}")
            }
        };
        tracing::warn!(error = %error, "metrics: reading the booking state failed");
        self.state.refresh_errors.inc();
    }

    /// Keeps `database_up` by what a statement's result says: an error that says the
    /// database cannot be reached sets 0; an answer (even a refusal) sets 1.
    pub fn database_seen(&self, result: Result<(), &sqlx::Error>) {
        let up = match result {
            Ok(()) => true,
            Err(e) => !crate::error::database_unreachable(e),
        };
        self.database_up.set(i64::from(up));
    }

    /// A cheap round trip (`SELECT 1`, at most [`REFRESH_TIMEOUT`]) that sets
    /// `database_up`; the service runs it every [`DATABASE_PROBE_EVERY`], so that the
    /// gauge falls with the database even when no request and no scrape comes.
    pub async fn probe_database(&self, db: &sqlx::PgPool) {
        match tokio::time::timeout(REFRESH_TIMEOUT, sqlx::query("SELECT 1").execute(db)).await {
            Ok(result) => self.database_seen(result.as_ref().map(drop)),
            Err(_) => {
                self.database_up.set(0);
            }
        }
    }

    async fn try_refresh(
        &self,
        db: &sqlx::PgPool,
        now: chrono::DateTime<chrono::Utc>,
    ) -> sqlx::Result<()> {
        let counts = sqlx::query!(
            r#"SELECT count(*) FILTER (WHERE start_at <= $1) AS "active!",
                      count(*) FILTER (WHERE start_at > $1) AS "planned!"
             FROM booking WHERE cancelled_at IS NULL AND end_at > $1"#,
            now
        )
        .fetch_one(db)
        .await?;
        let (active, planned) = (counts.active, counts.planned);
        let models: Vec<(String, i32, i32, i64)> = sqlx::query!(
            r#"SELECT m.name, m.units, m.in_use, COALESCE(sum(b.units), 0)::bigint AS "booked!"
             FROM gpu_model m
             LEFT JOIN booking b ON b.model = m.name AND b.cancelled_at IS NULL
                  AND b.start_at <= $1 AND b.end_at > $1
             GROUP BY m.name, m.units, m.in_use"#,
            now
        )
        .map(|m| (m.name, m.units, m.in_use, m.booked))
        .fetch_all(db)
        .await?;
        let no_shows: HashMap<String, i64> = sqlx::query!(
            r#"SELECT b.model, count(*) AS "count!" FROM booking b
             WHERE b.cancelled_at IS NULL AND b.start_at <= $2 AND b.end_at > $1
               AND b.hold_id IS NULL -- maintenance and courses: nobody to show up
               AND NOT EXISTS (SELECT 1 FROM booking_use u WHERE u.booking_id = b.id AND u.kind = 'held')
             GROUP BY b.model"#,
            now,
            now - DEFAULT_IDLE_AFTER
        )
        .map(|r| (r.model, r.count))
        .fetch_all(db)
        .await?
        .into_iter()
        .collect();
        let s = &self.state;
        s.bookings
            .get_or_create(&StatusLabel { status: "active" })
            .set(active);
        s.bookings
            .get_or_create(&StatusLabel { status: "planned" })
            .set(planned);
        // A model deleted since the last scrape loses its series.
        for family in [&s.units, &s.free, &s.booked, &s.lent, &s.no_shows] {
            family.clear();
        }
        for (model, units, in_use, booked) in models {
            let label = ModelLabel { model };
            let (units, in_use) = (i64::from(units), i64::from(in_use));
            s.units.get_or_create(&label).set(units);
            s.free.get_or_create(&label).set((units - in_use).max(0));
            s.booked.get_or_create(&label).set(booked);
            s.lent.get_or_create(&label).set((in_use - booked).max(0));
            s.no_shows
                .get_or_create(&label)
                .set(no_shows.get(&label.model).copied().unwrap_or(0));
        }
        Ok(())
    }

    pub fn encode(&self) -> String {
        // With gpu_booking_build_info and the process metrics, then # EOF.
        self.registry.encode()
    }
}

/// The request method as a label (the standard nine, else `other`): the access
/// log's own ([`gpu_booking_process::access`]).
pub use gpu_booking_process::access::method_label;

/// The status code for the ones the API answers (the OpenAPI document's and the
/// server's own), else its class (`2xx` .. `5xx`, `other`).
pub fn status_label(status: StatusCode) -> &'static str {
    const KNOWN: [(u16, &str); 19] = [
        (200, "200"),
        (201, "201"),
        (204, "204"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (405, "405"),
        (408, "408"),
        (409, "409"),
        (412, "412"),
        (413, "413"),
        (415, "415"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (503, "503"),
        (504, "504"),
    ];
    let code = status.as_u16();
    if let Some((_, label)) = KNOWN.iter().find(|(c, _)| *c == code) {
        return label;
    }
    match code / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        5 => "5xx",
        _ => "other",
    }
}

/// The `tracing` target of the access log lines (`RUST_LOG=gpu_booking_api::access=warn`
/// silences them; `=debug` shows the routine ones too).
pub const ACCESS_LOG: &str = "gpu_booking_api::access";

/// The requests the components and the cluster make on a timer: the webhook's
/// replica (admission state, the change stream's long poll), the controller's
/// catalog and reports, the components' audit rows (each action is logged where it
/// is taken), the kubelet's probes, Prometheus' scrapes. Their access log lines are
/// at debug when they succeed; everything a person does is at info.
const ROUTINE: [(&str, &str); 9] = [
    ("GET", "/api/v1/admission-state"),
    ("GET", "/api/v1/booking-changes"),
    ("GET", "/api/v1/models"),
    ("PUT", "/api/v1/models/{name}/usage"),
    ("PUT", "/api/v1/held-units"),
    ("POST", "/api/v1/audit/batch"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

/// The label of requests no route matched (the fallback's 404s, whatever the path).
pub use gpu_booking_process::access::UNMATCHED;

/// Counts and times every request by its route template (not its raw path, so
/// that ids do not explode the label set), and writes its access log line: method,
/// route template, status, latency (never the path, the query or a header, so no
/// id, feed token or bearer token reaches the logs).
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    // The same line as every admin port's (`gpu_booking_process::access`), under the
    // API's own target.
    let access = Access::of(&req);
    let routine = ROUTINE.contains(&(access.method, access.route.as_str()));
    let access = access.routine(routine);
    let response = next.run(req).await;
    if response
        .extensions()
        .get::<crate::error::DatabaseUnreachable>()
        .is_some()
    {
        m.database_up.set(0);
    }
    let took = access.elapsed();
    gpu_booking_process::access_line!(ACCESS_LOG, access, response.status(), took);
    let Access { method, route, .. } = access;
    m.duration
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(took.as_secs_f64());
    m.requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status: status_label(response.status()),
        })
        .inc();
    response
}
