//! `POST /api/v1/audit` and `POST /api/v1/audit/batch`: the enforcement actions the
//! webhook, the controller and the node agent report to the audit log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Reports in one batch at most.
pub const MAX_AUDIT_BATCH: usize = 500;

/// One action for the audit log. The service checks the bounds below (422 past
/// them) and records who reported it from the caller's token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AuditReport {
    /// What was done, e.g. `webhook.strip`, `controller.expire`, `agent.reclaim`.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 64))]
    pub action: String,
    /// What it was done to, e.g. `jhub/jupyter-alice`.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 512))]
    pub subject: Option<String>,
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub user: Option<String>,
    pub booking_id: Option<i64>,
    /// Evidence: samples, reasons, PIDs ... (a JSON object; free-form because each
    /// action has its own).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: Value,
}

/// The answer to one report: the row written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Recorded {
    pub id: i64,
}

/// Many reports in one call (the webhook batches its admissions' reports).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AuditBatch {
    /// At most [`MAX_AUDIT_BATCH`] reports, each checked as `POST /api/v1/audit`
    /// checks one.
    pub reports: Vec<AuditReport>,
}

/// The answer to a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecordedBatch {
    /// The rows written, in the order of the reports.
    pub ids: Vec<i64>,
}
