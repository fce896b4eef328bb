//! Requests to free a unit of a model for a booked user (webhook -> controller).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow, ToSchema)]
pub struct Preemption {
    pub id: i64,
    pub model: String,
    pub booking_id: Option<i64>,
    #[sqlx(rename = "user_name")]
    #[serde(rename = "user")]
    pub user: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    pub handled_at: Option<DateTime<Utc>>,
    pub outcome: Option<String>,
}

pub struct NewPreemption<'a> {
    pub model: &'a str,
    pub booking_id: Option<i64>,
    pub user: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub pod: Option<&'a str>,
    pub requested_by: &'a str,
    pub at: DateTime<Utc>,
}

pub async fn create(db: impl PgExecutor<'_>, p: NewPreemption<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO preemption_request (model, booking_id, user_name, namespace, pod, requested_by, requested_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(p.model)
    .bind(p.booking_id)
    .bind(p.user)
    .bind(p.namespace)
    .bind(p.pod)
    .bind(p.requested_by)
    .bind(p.at)
    .fetch_one(db)
    .await
}

const COLUMNS: &str =
    "id, model, booking_id, user_name, namespace, pod, requested_by, requested_at, handled_at, outcome";

pub async fn open(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Preemption>> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM preemption_request WHERE handled_at IS NULL ORDER BY requested_at, id LIMIT 500"
    ))
    .fetch_all(db)
    .await
}

/// Marks a request handled; `None` if it does not exist or was handled already.
pub async fn handle(
    db: impl PgExecutor<'_>,
    id: i64,
    outcome: &str,
    at: DateTime<Utc>,
) -> sqlx::Result<Option<Preemption>> {
    sqlx::query_as(&format!(
        "UPDATE preemption_request SET handled_at = $2, outcome = $3
         WHERE id = $1 AND handled_at IS NULL RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(at)
    .bind(outcome)
    .fetch_optional(db)
    .await
}
