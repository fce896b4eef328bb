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
    sqlx::query_scalar!(
        "INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        e.at,
        e.actor,
        e.action,
        e.subject,
        e.user,
        e.booking_id,
        e.details
    )
    .fetch_one(db)
    .await
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub subject: Option<String>,
    #[serde(rename = "user")]
    pub user: Option<String>,
    pub booking_id: Option<i64>,
    pub details: Value,
}

/// A row as Postgres gives it, `details` as jsonb's text rendering.
struct AuditRow {
    id: i64,
    at: DateTime<Utc>,
    actor: String,
    action: String,
    subject: Option<String>,
    user_name: Option<String>,
    booking_id: Option<i64>,
    details: String,
}

impl From<AuditRow> for AuditEvent {
    fn from(row: AuditRow) -> Self {
        let details = read_details(row.id, &row.details);
        AuditEvent {
            id: row.id,
            at: row.at,
            actor: row.actor,
            action: row.action,
            subject: row.subject,
            user: row.user_name,
            booking_id: row.booking_id,
            details,
        }
    }
}

/// The key under which [`read_details`] keeps the text of details it cannot parse.
pub const UNREADABLE_DETAILS: &str = "unreadable_details";

/// Parses jsonb's text of a row's details. Everything the API stores parses (serde_json
/// reads jsonb's full-length numbers with `float_roundtrip`), but a row written by
/// other means (SQL by hand: jsonb takes `1e400`, which no f64 holds) must not make
/// every page that holds it fail: such details come back as their text, under
/// [`UNREADABLE_DETAILS`], and the row is logged.
pub fn read_details(id: i64, text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            tracing::warn!(id, error = %e, "audit details are not readable as JSON numbers; answered as text");
            serde_json::json!({ UNREADABLE_DETAILS: text })
        }
    }
}

/// Newest first; `before` pages back by id.
pub async fn list(
    db: impl PgExecutor<'_>,
    action: Option<&str>,
    user: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<AuditEvent>> {
    let rows: Vec<AuditRow> = sqlx::query_as!(
        AuditRow,
        r#"SELECT id, at, actor, action, subject, user_name, booking_id, details::text AS "details!"
         FROM audit_event
         WHERE ($1::text IS NULL OR action = $1) AND ($2::text IS NULL OR user_name = $2)
           AND ($3::bigint IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4"#,
        action,
        user,
        before,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(AuditEvent::from).collect())
}
