//! Audit rows for the booking service's append-only log (`POST /api/v1/audit`, service
//! token), behind [`AuditSink`]: [`HttpAudit`] sends them, [`RecordingAudit`] keeps
//! them for tests, [`LogOnlyAudit`] stands in when no booking service is configured.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::BoxFuture;

/// One row: what was done, to whom, and the evidence.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AuditRecord {
    /// `agent.reclaim`, `agent.reclaim_dry_run`, `agent.vram_recycle`,
    /// `agent.vram_recycle_dry_run`.
    pub action: String,
    /// `namespace/pod`.
    pub subject: Option<String>,
    /// The JupyterHub user, when the pod names one.
    pub user: Option<String>,
    pub details: Value,
}

pub trait AuditSink: Send + Sync + 'static {
    fn report(&self, record: AuditRecord) -> BoxFuture<'_, Result<(), String>>;
}

/// The booking service's audit endpoint, through the shared client.
pub struct HttpAudit {
    client: gpu_booking_client::BookingClient,
}

impl HttpAudit {
    pub fn new(
        base_url: &str,
        token: gpu_booking_client::TokenSource,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let client = gpu_booking_client::BookingClient::new(
            base_url,
            token,
            timeout,
            concat!("gpu-booking-agent/", env!("CARGO_PKG_VERSION")),
        )?;
        Ok(Self { client })
    }
}

impl AuditSink for HttpAudit {
    fn report(&self, record: AuditRecord) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let report = gpu_booking_client::AuditReport {
                action: record.action,
                subject: record.subject,
                user: record.user,
                booking_id: None,
                details: record.details,
            };
            self.client
                .audit(&report)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

/// Keeps every record (tests).
#[derive(Default)]
pub struct RecordingAudit {
    records: Mutex<Vec<AuditRecord>>,
}

impl RecordingAudit {
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl AuditSink for RecordingAudit {
    fn report(&self, record: AuditRecord) -> BoxFuture<'_, Result<(), String>> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
        Box::pin(async { Ok(()) })
    }
}

/// No booking service: the structured log line is the only record.
pub struct LogOnlyAudit;

impl AuditSink for LogOnlyAudit {
    fn report(&self, _record: AuditRecord) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}
