//! The admin port's access log: one line per request, as every
//! component writes it (`gpu_booking_process::access`). Alone in its test binary: it
//! captures `tracing` output (see `gpu_booking_process::testing`).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use gpu_booking_webhook::Metrics;

#[tokio::test]
async fn the_admin_port_writes_one_access_line_per_request() {
    let admin = gpu_booking_webhook::admin_router(
        Arc::new(Metrics::new()),
        Arc::new(AtomicBool::new(true)),
    );
    gpu_booking_process::testing::assert_admin_access_log(admin).await;
}
