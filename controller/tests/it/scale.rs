//! Scale, measured and reported (not pass/fail): 10,000 pods in the fake API server,
//! 1,000 booked pods ending within the same minute, in real time. Prints the worst
//! expiry lag and the process's memory (fake API server included).
//!
//! cargo test --release -p gpu-booking-controller --test it scale:: -- --ignored --nocapture

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_controller::{Controller, ControllerArgs, SystemClock};
use gpu_booking_fake_apiserver::{FakeApiServer, PodDeletion, Verb};

/// `VmRSS` and `VmHWM` (peak) of this process, MiB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture (about 90 s)"]
async fn ten_thousand_pods_a_thousand_expiring_in_one_minute() {
    const PODS: usize = 10_000;
    const EXPIRING: usize = 1_000;
    const LENT: usize = 1_000;
    let (rss0, _) = memory();
    let server = FakeApiServer::new();
    server.keep_request_log(false);
    server.set_pod_deletion(PodDeletion::Immediate);
    for n in 0..250 {
        node(
            &server,
            &format!("gpu-{n}"),
            Some("NVIDIA-A100-SXM4-40GB"),
            &[("nvidia.com/gpu", 8)],
        );
    }
    let start = Utc::now() + TimeDelta::seconds(20);
    for i in 0..PODS {
        let name = format!("jupyter-user{i}");
        let spec = if i < EXPIRING {
            // Spread evenly over one minute.
            let end = start + TimeDelta::milliseconds((i as i64) * 60_000 / EXPIRING as i64);
            pod(&name)
                .gpu(1)
                .on(&format!("gpu-{}", i % 250))
                .booked_until(end)
        } else if i < EXPIRING + LENT {
            pod(&name)
                .gpu(1)
                .on(&format!("gpu-{}", i % 250))
                .low_priority("a100")
        } else {
            pod(&name).on(&format!("cpu-{}", i % 100))
        };
        spec.put(&server);
    }
    let (rss_loaded, _) = memory();
    let booking = FakeBooking::with_models(models());
    let mut args = ControllerArgs::with_defaults("http://booking.invalid");
    args.identity = Some("controller-0".into());
    let began = Instant::now();
    let controller = Controller::start(
        server.client(),
        booking.clone(),
        Arc::new(SystemClock),
        &args,
    )
    .unwrap();
    while !controller.ready.load(std::sync::atomic::Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced_in = began.elapsed();
    let (rss_synced, _) = memory();
    let deadline = Instant::now() + Duration::from_secs(240);
    while server.count(Verb::Create, "pods") < EXPIRING as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (rss_end, peak) = memory();
    let state = booking.state();
    let lags: Vec<f64> = state
        .audits
        .iter()
        .filter(|a| a.action == "controller.expire")
        .filter_map(|a| a.details["lag_seconds"].as_f64())
        .collect();
    let worst = lags.iter().copied().fold(0.0, f64::max);
    let mean = lags.iter().sum::<f64>() / lags.len().max(1) as f64;
    println!("pods in the fake API server: {PODS} ({EXPIRING} booked ending within one minute, {LENT} lent GPU pods, rest CPU)");
    println!("controller: initial list and watch synced in {synced_in:?}");
    println!(
        "recreated: {} of {EXPIRING}; expiry actions audited: {}",
        server.count(Verb::Create, "pods"),
        lags.len()
    );
    println!("expiry lag (terminate-at to delete): worst {worst:.3} s, mean {mean:.3} s");
    println!(
        "memory (MiB): start {rss0:.1}, 10,000 pods in the fake {rss_loaded:.1}, controller synced {rss_synced:.1}, end {rss_end:.1}, peak {peak:.1}"
    );
    println!(
        "controller share at sync: {:.1} MiB",
        rss_synced - rss_loaded
    );
    assert_eq!(lags.len(), EXPIRING, "every expiry acted on");
}
