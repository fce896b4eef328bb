//! The booking service behind a trait, so that tests can put an in-process fake in
//! its place (no sockets: tests run on tokio's paused clock, which a real socket wait
//! would let jump past every timeout).

use futures::future::BoxFuture;
use gpu_booking_client::{
    AuditReport, BookingClient, ClientError, Model, PreemptionRequest, UsageReport,
};

pub type Answer<'a, T> = BoxFuture<'a, Result<T, ClientError>>;

/// What the controller asks of the booking service.
pub trait Booking: Send + Sync + 'static {
    fn models(&self) -> Answer<'_, Vec<Model>>;
    fn put_usage<'a>(&'a self, model: &'a str, report: &'a UsageReport) -> Answer<'a, ()>;
    fn open_preemptions(&self) -> Answer<'_, Vec<PreemptionRequest>>;
    fn handle_preemption<'a>(&'a self, id: i64, outcome: &'a str) -> Answer<'a, ()>;
    fn audit<'a>(&'a self, report: &'a AuditReport) -> Answer<'a, i64>;
}

impl Booking for BookingClient {
    fn models(&self) -> Answer<'_, Vec<Model>> {
        Box::pin(BookingClient::models(self))
    }
    fn put_usage<'a>(&'a self, model: &'a str, report: &'a UsageReport) -> Answer<'a, ()> {
        Box::pin(BookingClient::put_usage(self, model, report))
    }
    fn open_preemptions(&self) -> Answer<'_, Vec<PreemptionRequest>> {
        Box::pin(BookingClient::open_preemptions(self))
    }
    fn handle_preemption<'a>(&'a self, id: i64, outcome: &'a str) -> Answer<'a, ()> {
        Box::pin(BookingClient::handle_preemption(self, id, outcome))
    }
    fn audit<'a>(&'a self, report: &'a AuditReport) -> Answer<'a, i64> {
        Box::pin(BookingClient::audit(self, report))
    }
}
