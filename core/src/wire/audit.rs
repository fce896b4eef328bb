//! `POST /api/v1/audit` and `POST /api/v1/audit/batch`: the enforcement actions the
//! webhook, the controller and the node agent report to the audit log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Reports in one batch at most.
pub const MAX_AUDIT_BATCH: usize = 500;
/// Longest [`AuditReport::action`], in bytes.
pub const MAX_ACTION_LEN: usize = 64;
/// Longest [`AuditReport::subject`], in bytes.
pub const MAX_SUBJECT_LEN: usize = 512;
/// Longest [`AuditReport::user`], in bytes.
pub const MAX_AUDIT_USER_LEN: usize = 256;
/// Largest [`AuditReport::details`]: the bytes of its compact JSON.
pub const MAX_DETAILS_BYTES: usize = 64 * 1024;

/// One action for the audit log. The service checks the bounds below (422 past
/// them) and records who reported it from the caller's token. The lengths of
/// `action`, `subject` and `user` are counted in UTF-8 bytes (`maxLength` is that
/// count; a character outside ASCII takes 2 to 4), and none may hold a control
/// character (Unicode `Cc`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AuditReport {
    /// What was done, e.g. `webhook.strip`, `controller.expire`, `agent.reclaim`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 64,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
        )
    )]
    pub action: String,
    /// What it was done to, e.g. `jhub/jupyter-alice`.
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 512,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
        )
    )]
    pub subject: Option<String>,
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$"
        )
    )]
    pub user: Option<String>,
    pub booking_id: Option<i64>,
    /// Evidence: samples, reasons, PIDs ... (a JSON object; free-form because each
    /// action has its own). At most 65536 bytes (64 KiB) written as compact JSON,
    /// and at most 64 arrays or objects deep; `null` or absent is recorded as `{}`.
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
    /// The reports, each checked as `POST /api/v1/audit` checks one; at most
    /// `maxItems` ([`MAX_AUDIT_BATCH`]) in one batch.
    #[cfg_attr(feature = "openapi", schema(max_items = 500))]
    pub reports: Vec<AuditReport>,
}

/// The answer to a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RecordedBatch {
    /// The rows written, in the order of the reports.
    pub ids: Vec<i64>,
}
