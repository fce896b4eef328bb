//! The booking service behind a trait, so that tests can put an in-process fake in
//! its place (no sockets: tests run on tokio's paused clock, which a real socket wait
//! would let jump past every timeout).

use futures::future::BoxFuture;
use gpu_booking_client::{
    AuditReport, BookingClient, ChangeSource, ClientError, CourseTitle, HeldReport, Model, Offers,
    OffersReport, UsageReport,
};
use gpu_booking_core::admission::AdmissionState;

pub type Answer<'a, T> = BoxFuture<'a, Result<T, ClientError>>;

/// What the controller asks of the booking service.
pub trait Booking: Send + Sync + 'static {
    fn models(&self) -> Answer<'_, Vec<Model>>;
    fn put_usage<'a>(&'a self, model: &'a str, report: &'a UsageReport) -> Answer<'a, ()>;
    fn audit<'a>(&'a self, report: &'a AuditReport) -> Answer<'a, i64>;
    /// The units each booking's high-priority pods hold (the whole count) and their
    /// last GPU activity. The default takes it and keeps nothing: for fakes of tests
    /// that do not read it.
    fn put_held<'a>(&'a self, held: &'a HeldReport) -> Answer<'a, ()> {
        let _ = held;
        Box::pin(async { Ok(()) })
    }

    /// The GPUs offered back (the whole list, [`crate::offers`]); the service
    /// answers those it keeps. The default keeps them all: for fakes of tests that
    /// do not read them.
    fn put_offers<'a>(&'a self, report: &'a OffersReport) -> Answer<'a, Offers> {
        let kept = Offers {
            offers: report.offers.clone(),
            booked: Vec::new(),
        };
        Box::pin(async { Ok(kept) })
    }

    /// The offers as last reported (a new leader takes them back). The default:
    /// none.
    fn offers(&self) -> Answer<'_, Offers> {
        Box::pin(async { Ok(Offers::default()) })
    }

    /// The booking change stream, where this service has one (the controller
    /// follows it: [`crate::follow`]).
    fn changes(&self) -> Option<&dyn ChangeSource> {
        None
    }

    /// The admission state's figures (`?full=false`): the members of each group with
    /// a course occurrence running, for the course notices ([`crate::follow`]). The
    /// default refuses: fakes of tests that have no courses.
    fn admission_figures(&self) -> Answer<'_, AdmissionState> {
        Box::pin(async { Err(not_faked("admission-state")) })
    }

    /// A course reservation's title and group (the course notices name it). The
    /// default refuses, as [`Booking::admission_figures`]'s.
    fn course_title(&self, id: i64) -> Answer<'_, CourseTitle> {
        let _ = id;
        Box::pin(async { Err(not_faked("reservations")) })
    }
}

/// A fake's answer to a call it does not serve.
fn not_faked(route: &str) -> ClientError {
    ClientError::Status {
        status: 404,
        body: format!("this fake serves no {route}"),
    }
}

impl Booking for BookingClient {
    fn models(&self) -> Answer<'_, Vec<Model>> {
        Box::pin(BookingClient::models(self))
    }
    fn put_usage<'a>(&'a self, model: &'a str, report: &'a UsageReport) -> Answer<'a, ()> {
        Box::pin(BookingClient::put_usage(self, model, report))
    }
    fn audit<'a>(&'a self, report: &'a AuditReport) -> Answer<'a, i64> {
        Box::pin(BookingClient::audit(self, report))
    }
    fn put_held<'a>(&'a self, held: &'a HeldReport) -> Answer<'a, ()> {
        Box::pin(BookingClient::put_held(self, held))
    }
    fn put_offers<'a>(&'a self, report: &'a OffersReport) -> Answer<'a, Offers> {
        Box::pin(BookingClient::put_offers(self, report))
    }
    fn offers(&self) -> Answer<'_, Offers> {
        Box::pin(BookingClient::offers(self))
    }

    fn changes(&self) -> Option<&dyn ChangeSource> {
        Some(self)
    }
    fn admission_figures(&self) -> Answer<'_, AdmissionState> {
        Box::pin(BookingClient::admission_state(self, false))
    }
    fn course_title(&self, id: i64) -> Answer<'_, CourseTitle> {
        Box::pin(BookingClient::course_title(self, id))
    }
}
