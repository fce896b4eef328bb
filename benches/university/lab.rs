//! The lab at the university's size: the simulated cluster with the chart as helm
//! renders it, the booking API on a database of its own, and the controller and the
//! webhook started on runtimes of their own in place of the lab's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpu_booking_api::auth::Role;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_fake_apiserver::FakeApiServer;
use gpu_booking_sim::rendered::LabEnvironment;
use gpu_booking_sim::service_accounts::{self, ProjectedTokens};
use gpu_booking_sim::stack::{self, CertDir, WebhookOptions, WebhookServer};
use gpu_booking_sim::{ApiServer, BookingService, RenderedChart, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::runtime::Handle;

use crate::booking::Booking;
use crate::cluster::{self, MODELS};
use crate::figures::per_model;
use crate::hop;
use crate::Config;

/// The bench's database, created and dropped.
const DATABASE: &str = "gpu_booking_bench_university";

/// The lab with its controller and webhook on runtimes of their own.
pub struct University {
    pub sim: SimCluster,
    pub booking: Booking,
    pub webhook: WebhookServer,
    pub controller: gpu_booking_controller::Controller,
    /// The components' token files and volumes.
    _tokens: ProjectedTokens,
    _volumes: tempfile::TempDir,
}

impl University {
    pub fn server(&self) -> &FakeApiServer {
        &self.sim.server
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.server().list::<Pod>(None)
    }

    /// Waits until the booking service shows what the cluster holds, as the
    /// controller reports it (cards in use, and those held by other workloads, per
    /// model), and the webhook's replica has read it.
    pub async fn reported(&self, within: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + within;
        loop {
            let held = cluster::held(&self.pods());
            let models = self.booking.models().await?;
            let agrees = MODELS.iter().enumerate().all(|(i, m)| {
                models.iter().any(|r| {
                    r["name"] == m.name
                        && r["in_use"].as_u64() == Some(held.all[i])
                        && r["others_in_use"].as_u64() == Some(held.others[i])
                })
            });
            if agrees {
                if let Some(replica) = &self.webhook.replica {
                    replica.refreshed(Duration::from_secs(5)).await;
                }
                return Ok(true);
            }
            if Instant::now() > deadline {
                let theirs: Vec<String> = models
                    .iter()
                    .map(|r| format!("{} {}/{}", r["name"], r["in_use"], r["others_in_use"]))
                    .collect();
                println!(
                    "  the controller reports (in use / by others) {}; the cluster holds {} / {}",
                    theirs.join(", "),
                    per_model(&held.all),
                    per_model(&held.others)
                );
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the webhook's replica holds every booking of `ids` as `holds`
    /// says.
    pub async fn webhook_sees(
        &self,
        ids: &[i64],
        holds: impl Fn(Option<&gpu_booking_core::admission::replica::BookingState>) -> bool,
    ) -> anyhow::Result<Duration> {
        let began = Instant::now();
        let Some(replica) = &self.webhook.replica else {
            return Ok(Duration::ZERO);
        };
        let deadline = began + Duration::from_secs(30);
        while !ids.iter().all(|id| holds(replica.booking(*id).as_ref())) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the webhook's replica did not see the bookings within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(began.elapsed())
    }
}

/// Starts the lab, then the controller and the webhook on their runtimes in place of
/// the lab's.
pub async fn start(
    config: &Config,
    pool: PgPool,
    controller_rt: Handle,
    webhook_rt: Handle,
) -> anyhow::Result<University> {
    let mut sets = cluster::chart_values();
    // The lab's values end victims at once (its older scenarios expect it): the
    // university has the warning.
    sets.push(format!("controller.preemption.grace={}s", config.warning));
    // Further chart values for an experiment (`UNIVERSITY_CHART_SET=a=1,b=2`).
    if let Ok(more) = std::env::var("UNIVERSITY_CHART_SET") {
        sets.extend(more.split(',').filter(|s| !s.is_empty()).map(str::to_owned));
    }
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let chart = RenderedChart::render(&sets)
        .context("the chart renders (helm: run scripts/chart-tools.sh once)")?;
    let builder = SimCluster::builder()
        .rendered_chart(chart.clone())
        .nodes(config.shape.nodes())
        .notebook_grace_period(config.grace);
    let api = ApiServer::start(
        pool.clone(),
        Policy::default(),
        Arc::new(gpu_booking_api::clock::SystemClock),
        Some(builder.service_accounts()?),
    )
    .await?;
    // Migrated by now.
    cluster::declare(&pool, &config.shape).await?;
    let sim = builder
        .start(BookingService {
            url: api.url.clone(),
        })
        .await?;
    // The lab's own controller and webhook make way for ours.
    sim.controller.stop();
    let tokens = ProjectedTokens::issue(&sim.server)?;
    let volumes = tempfile::tempdir()?;
    let args = stack::controller_args(
        Some(&chart),
        &api.url,
        &tokens.path(service_accounts::CONTROLLER),
        "gpu-booking-controller-university",
        volumes.path(),
        &LabEnvironment::default(),
    )?;
    let inner = stack::controller_client(&sim.server);
    let lab_rt = Handle::current();
    let controller = {
        let _on = controller_rt.enter();
        let client = hop::client(inner, lab_rt);
        // One replica: no election to wait for.
        stack::start_controller(client, args, |args| args.leader_elect = false)?
    };
    let options = WebhookOptions {
        booking_url: api.url.clone(),
        service_token_file: tokens.path(service_accounts::WEBHOOK),
        listen: ([127, 0, 0, 1], 0).into(),
        admin_listen: None,
        dns_names: vec![
            format!("{}.{}.svc", sim.chart.webhook_name, sim.chart.namespace),
            format!(
                "{}.{}.svc.cluster.local",
                sim.chart.webhook_name, sim.chart.namespace
            ),
        ],
        cert_dir: CertDir::temporary()?,
        extra_args: Vec::new(),
        chart: Some((chart.clone(), volumes.path().to_owned())),
    };
    let webhook = webhook_rt.spawn(WebhookServer::start(options)).await??;
    sim.server.register_service(
        &sim.chart.namespace,
        &sim.chart.webhook_name,
        sim.chart.service_port,
        webhook.addr,
    );
    sim.server.put_value(
        "mutatingwebhookconfigurations",
        chart.webhook_configuration(&webhook.ca_pem)?,
    );
    sim.stop_webhook().await;
    sim.controller_ready(Duration::from_secs(60)).await?;
    let admin = api.token("admin@uni.example", Some(Role::Admin))?;
    let university = University {
        sim,
        booking: Booking {
            api,
            admin,
            http: reqwest::Client::new(),
        },
        webhook,
        controller,
        _tokens: tokens,
        _volumes: volumes,
    };
    // Every model reported with its VRAM budget advertised, as on a cluster that has
    // run for a while.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let models = university.booking.models().await?;
        let reported = models.iter().all(|m| {
            !m["usage_reported_at"].is_null() && (m["cards"] == 0 || m["gpumem_advertised"] == true)
        });
        if reported {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller never reported the models: {models:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if let Some(replica) = &university.webhook.replica {
        replica.refreshed(Duration::from_secs(10)).await;
    }
    Ok(university)
}

/// A database of its own, dropped at the end.
pub async fn fresh_database(base: &str) -> anyhow::Result<PgPool> {
    let mut admin = PgConnection::connect(base).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
        .execute(&mut admin)
        .await?;
    let url = match base.rfind('/') {
        Some(i) => format!("{}/{DATABASE}", &base[..i]),
        None => anyhow::bail!("DATABASE_URL has no database part"),
    };
    Ok(gpu_booking_api::server::pool_options(16)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&url)
        .await?)
}

pub async fn drop_database(base: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(base).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// The API server's webhook calls from `from` on that failed (the chart's
/// `failurePolicy: Ignore` then admitted the pod unchanged): how many, by error.
fn admission_failures(server: &FakeApiServer, from: usize) -> (usize, BTreeMap<String, usize>) {
    let log = server.admission_log();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut calls = 0;
    for record in log.iter().skip(from) {
        calls += 1;
        if let Some(error) = &record.error {
            // Why, without the URL: alike errors count together.
            let why = error
                .rsplit_once("\": ")
                .map_or(error.as_str(), |(_, why)| why);
            let short: String = why.chars().take(160).collect();
            *errors.entry(short).or_default() += 1;
        }
    }
    (calls, errors)
}

/// Prints them; how many failed.
pub fn print_admission_failures(what: &str, server: &FakeApiServer, from: usize) -> usize {
    let (calls, errors) = admission_failures(server, from);
    let failed: usize = errors.values().sum();
    println!(
        "  {what}: webhook calls {calls}, failed {failed} (the chart's failurePolicy Ignore admitted those pods unchanged: GPU pods no booking can preempt)"
    );
    for (error, n) in errors {
        println!("    {n} x {error}");
    }
    failed
}

impl University {
    /// Stops the components and the lab; ends the fake notebook kernels the lab left.
    pub async fn shutdown(self) {
        let University {
            sim,
            booking,
            webhook,
            controller,
            _tokens,
            _volumes,
        } = self;
        controller.stop();
        webhook.stop().await;
        sim.shutdown().await;
        booking.api.stop().await;
        let left = end_kernels_left();
        if left > 0 {
            println!(
                "the lab left {left} notebook kernels (sleep processes) running after its shutdown: ended"
            );
        }
    }
}

/// Ends the lab's fake notebook kernels (`sleep` processes, this process's
/// children) still running after its shutdown; how many there were.
fn end_kernels_left() -> usize {
    let me = std::process::id().to_string();
    let mut left = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let parent = rest.split_whitespace().nth(1);
        if head.ends_with("(sleep") && parent == Some(me.as_str()) {
            let pid = entry.file_name().to_string_lossy().into_owned();
            let _ = std::process::Command::new("kill").arg(&pid).status();
            left += 1;
        }
    }
    left
}
