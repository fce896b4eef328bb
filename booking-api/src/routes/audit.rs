//! `/api/v1/audit`: enforcement actions reported by the webhook, controller and
//! agent; the whole log for admins.

use axum::extract::State;
use axum::http::StatusCode;
use gpu_booking_core::wire::{
    AuditBatch, AuditReport, Recorded, RecordedBatch, MAX_ACTION_LEN, MAX_AUDIT_BATCH,
    MAX_AUDIT_USER_LEN, MAX_DETAILS_BYTES, MAX_SUBJECT_LEN,
};
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Query};
use crate::routes::MAX_PAGE_LIMIT;
use crate::state::AppState;
use crate::store::audit::{self, AuditEvent};

fn bounded(name: &str, value: Option<&str>, max: usize) -> Result<(), ApiError> {
    match value {
        Some(v) if v.is_empty() || v.len() > max || v.chars().any(char::is_control) => Err(
            ApiError::Invalid(format!("{name} must be 1 to {max} printable characters")),
        ),
        _ => Ok(()),
    }
}

/// Deepest nesting of `details`. A listing wraps details two levels deeper (the array
/// of events, the event), and serde_json-based readers stop at 128 levels: this keeps
/// every page readable by them, with room to spare.
pub const MAX_DETAILS_DEPTH: usize = 64;

/// Nesting depth of arrays and objects (a scalar is 0). Iterative: the value may be
/// as deep as the JSON parser allowed.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(d + 1);
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

#[utoipa::path(post, path = "/api/v1/audit", tag = "audit", request_body = AuditReport,
    responses((status = 201, body = Recorded), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn report(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<AuditReport>,
) -> Result<(StatusCode, axum::Json<Recorded>), ApiError> {
    caller.require_service()?;
    let body = checked(body)?;
    let id = audit::record(&state.pool, new_event(&state, &caller, &body)).await?;
    Ok((StatusCode::CREATED, axum::Json(Recorded { id })))
}

/// A report checked, its `details` an object (absent or null: an empty one; an
/// array, a string or a number is refused, as the document says).
fn checked(mut body: AuditReport) -> Result<AuditReport, ApiError> {
    bounded("action", Some(&body.action), MAX_ACTION_LEN)?;
    bounded("subject", body.subject.as_deref(), MAX_SUBJECT_LEN)?;
    bounded("user", body.user.as_deref(), MAX_AUDIT_USER_LEN)?;
    if body.details.to_string().len() > MAX_DETAILS_BYTES {
        return Err(ApiError::Invalid("details must be under 64 KiB".into()));
    }
    if depth(&body.details) > MAX_DETAILS_DEPTH {
        return Err(ApiError::Invalid(format!(
            "details must nest at most {MAX_DETAILS_DEPTH} arrays or objects deep"
        )));
    }
    match &body.details {
        Value::Null => body.details = Value::Object(Default::default()),
        Value::Object(_) => {}
        _ => {
            return Err(ApiError::Invalid(
                "details must be a JSON object (or absent)".into(),
            ))
        }
    }
    Ok(body)
}

fn new_event<'a>(
    state: &AppState,
    caller: &'a Caller,
    body: &'a AuditReport,
) -> audit::NewEvent<'a> {
    audit::NewEvent {
        at: state.clock.now(),
        actor: caller.user.as_str(),
        action: &body.action,
        subject: body.subject.as_deref(),
        user: body.user.as_deref(),
        booking_id: body.booking_id,
        details: body.details.clone(),
    }
}

#[utoipa::path(post, path = "/api/v1/audit/batch", tag = "audit", request_body = AuditBatch,
    description = "Many reports in one call and one transaction (the webhook batches its admissions' reports): \
                   all are written or, when one is invalid, none.",
    responses((status = 201, body = RecordedBatch), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn report_batch(
    State(state): State<AppState>,
    caller: Caller,
    Json(batch): Json<AuditBatch>,
) -> Result<(StatusCode, axum::Json<RecordedBatch>), ApiError> {
    caller.require_service()?;
    if batch.reports.len() > MAX_AUDIT_BATCH {
        return Err(ApiError::Invalid(format!(
            "at most {MAX_AUDIT_BATCH} reports in one batch"
        )));
    }
    let reports = batch
        .reports
        .into_iter()
        .map(checked)
        .collect::<Result<Vec<_>, _>>()?;
    let mut tx = state.pool.begin().await?;
    let mut ids = Vec::with_capacity(reports.len());
    for body in &reports {
        ids.push(audit::record(&mut *tx, new_event(&state, &caller, body)).await?);
    }
    tx.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(RecordedBatch { ids })))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub action: Option<String>,
    pub user: Option<String>,
    /// Entries with a smaller id (paging back).
    pub before: Option<i64>,
    /// Default 100, at most 1000.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = [AuditEvent]), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> Result<axum::Json<Vec<AuditEvent>>, ApiError> {
    caller.require_admin()?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(ApiError::Invalid("limit must be between 1 and 1000".into()));
    }
    let events = audit::list(
        &state.pool,
        q.action.as_deref(),
        q.user.as_deref(),
        q.before,
        limit,
    )
    .await?;
    Ok(axum::Json(events))
}
