//! The append-only audit log.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgExecutor;
use utoipa::ToSchema;

/// One audit entry to write.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    pub at: DateTime<Utc>,
    pub actor: &'a str,
    pub action: &'a str,
    pub subject: Option<&'a str>,
    pub user: Option<&'a str>,
    pub booking_id: Option<i64>,
    pub details: Value,
}

pub async fn record(db: impl PgExecutor<'_>, e: NewEvent<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(e.at)
    .bind(e.actor)
    .bind(e.action)
    .bind(e.subject)
    .bind(e.user)
    .bind(e.booking_id)
    .bind(e.details)
    .fetch_one(db)
    .await
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, ToSchema)]
pub struct AuditEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub subject: Option<String>,
    #[sqlx(rename = "user_name")]
    #[serde(rename = "user")]
    pub user: Option<String>,
    pub booking_id: Option<i64>,
    pub details: Value,
}

/// Newest first; `before` pages back by id.
pub async fn list(
    db: impl PgExecutor<'_>,
    action: Option<&str>,
    user: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<AuditEvent>> {
    sqlx::query_as(
        "SELECT id, at, actor, action, subject, user_name, booking_id, details FROM audit_event
         WHERE ($1::text IS NULL OR action = $1) AND ($2::text IS NULL OR user_name = $2)
           AND ($3::bigint IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
    )
    .bind(action)
    .bind(user)
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await
}
