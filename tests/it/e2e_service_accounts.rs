//! End to end, on the simulated lab: service identity without a shared token, and
//! each component as the chart runs it. The webhook, the controller and the node
//! agent authenticate to the booking API with their own projected ServiceAccount
//! tokens, verified by TokenReview against the lab's API server:
//!
//! - every audit row a component writes names that component's ServiceAccount (a
//!   lent admission by the webhook, the agent's idle reclaim, the controller's
//!   preemption for a booked user), so each authenticated as itself;
//! - a genuine token for another audience is refused (401), and a genuine token of a
//!   ServiceAccount with no role is authenticated but not a service (403);
//! - the chart's Jobs (bootstrap, certificates) run as their own ServiceAccounts
//!   under the chart's RBAC, and its admission policy bounds the node agent.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use std::time::Duration;

use chrono::TimeDelta;
use common::*;
use gpu_booking_sim::service_accounts::{self, AGENT, CONTROLLER, NAMESPACE, WEBHOOK};
use gpu_booking_sim::{GpuNode, SimCluster};
use reqwest::StatusCode;
use sqlx::PgPool;

const BOB: &str = "bob@example.com";
const ALICE: &str = "alice@example.com";

/// The actors of the audit rows whose action starts with `prefix`, once there is one
/// (rows are posted on the components' own tasks).
async fn actors_of(pool: &PgPool, prefix: &str) -> Vec<String> {
    eventually(|| async {
        let actors: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT actor FROM audit_event WHERE action LIKE $1 || '%' ORDER BY actor",
        )
        .bind(prefix)
        .fetch_all(pool)
        .await
        .expect("the audit log answers");
        if !actors.is_empty() {
            return Ok(actors);
        }
        Err(format!("no audit row {prefix}* within {SETTLE:?}"))
    })
    .await
}

#[sqlx::test(migrations = "./migrations")]
async fn each_component_authenticates_as_its_own_service_account(pool: PgPool) {
    // One A100, so that alice's booking takes it back from bob's lent notebook; an
    // idle window of five samples and no warning, so that the agent reclaims bob's
    // idle kernel at once.
    let builder = SimCluster::builder()
        .nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 1, 40960),
            GpuNode::cpu_only("cpu-0"),
        ])
        .agent_interval(Duration::from_millis(200))
        .agent(|cfg| {
            cfg.policy.idle.idle_minutes = 0;
            cfg.policy.idle.idle_samples = 5;
            cfg.reclaim_warning = TimeDelta::zero();
        });
    let lab = Lab::start_with(pool.clone(), builder).await;

    lab.sim
        .spawn(BOB, 1)
        .await
        .expect("bob's notebook is admitted");
    lab.expect("bob's lent notebook never ran on the A100", |s| {
        running(s, BOB).is_some_and(|p| gpus(&p) > 0)
    })
    .await;
    // The agent ends bob's idle kernel (the pod keeps the card) ...
    let agent_actors = actors_of(&pool, "agent.").await;
    // ... and alice's booking takes the card back: the controller preempts bob.
    lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    lab.sim
        .spawn(ALICE, 1)
        .await
        .expect("alice's notebook is admitted");
    lab.expect("alice's booked notebook never got the A100 back", |s| {
        running(s, ALICE).is_some_and(|p| gpus(&p) > 0)
    })
    .await;

    assert_eq!(
        agent_actors,
        [service_accounts::username(AGENT)],
        "the agent's audit rows were not written as its ServiceAccount"
    );
    for (prefix, component) in [("webhook.", WEBHOOK), ("controller.", CONTROLLER)] {
        assert_eq!(
            actors_of(&pool, prefix).await,
            [service_accounts::username(component)],
            "the {prefix}* audit rows were not written as the {component} ServiceAccount"
        );
    }

    let http = reqwest::Client::new();
    let ask = |token: String| {
        http.get(format!("{}/api/v1/schedulability?user={BOB}", lab.api.url))
            .bearer_auth(token)
            .send()
    };
    let server = &lab.sim.server;
    let status = |res: reqwest::Result<reqwest::Response>| res.expect("the API answers").status();
    assert_eq!(
        status(
            ask(server.service_account_token(NAMESPACE, CONTROLLER, &[service_accounts::AUDIENCE]))
                .await
        ),
        StatusCode::OK,
        "the controller's own token is a service's"
    );
    assert_eq!(
        status(ask(server.service_account_token(NAMESPACE, CONTROLLER, &["someone-else"])).await),
        StatusCode::UNAUTHORIZED,
        "a token bound to another audience must be refused"
    );
    assert_eq!(
        status(
            ask(server.service_account_token("jupyterhub", "hub", &[service_accounts::AUDIENCE]))
                .await
        ),
        StatusCode::FORBIDDEN,
        "a ServiceAccount the chart gives no role is no service"
    );
    lab.shutdown().await;
}

/// `T`'s options from the environment of the chart's `kind`/`name` workload, and the
/// client its ServiceAccount would have on `server`.
fn job<T: clap::Parser>(
    chart: &gpu_booking_sim::RenderedChart,
    server: &gpu_booking_fake_apiserver::FakeApiServer,
    kind: &str,
    name: &str,
    volumes: &std::path::Path,
) -> (T, kube::Client) {
    let workload = chart
        .workload(kind, name)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let lab = gpu_booking_sim::rendered::LabEnvironment {
        pod_name: format!("{name}-0"),
        ..Default::default()
    };
    let options = gpu_booking_sim::rendered::options(&workload, &lab, volumes, &[])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let client = server.client_as(&workload.username(), &service_accounts::GROUPS);
    (options, client)
}

#[derive(clap::Parser)]
struct BootstrapCli {
    #[command(flatten)]
    args: gpu_booking_certs::bootstrap::BootstrapArgs,
}

#[derive(clap::Parser)]
struct CertsCli {
    #[command(flatten)]
    args: gpu_booking_certs::config::CertsArgs,
}

/// A certificate Job's run as its ServiceAccount, with its Job's options.
async fn certs_job(
    chart: &gpu_booking_sim::RenderedChart,
    server: &gpu_booking_fake_apiserver::FakeApiServer,
    kind: &str,
    name: &str,
    volumes: &std::path::Path,
) -> gpu_booking_certs::self_signed::Report {
    let (cli, client): (CertsCli, _) = job(chart, server, kind, name, volumes);
    let gpu_booking_certs::config::Mode::SelfSigned(args) = cli.args.mode else {
        panic!("{name} does not run `certs self-signed`");
    };
    let cluster = gpu_booking_certs::cluster::Cluster::new(client, NAMESPACE);
    gpu_booking_certs::self_signed::run(&cluster, &args, chrono::Utc::now())
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The chart's Jobs as an install runs them, each as its own ServiceAccount under the
/// chart's RBAC and with its Job's environment: the bootstrap Job writes its Secret;
/// the pre-install certificate Job its Secrets (no webhook configuration yet), the
/// post-install one the CA into the configuration helm created, and the CronJob
/// finds nothing due. No request is refused.
#[tokio::test]
async fn the_charts_jobs_run_as_their_service_accounts_under_its_rbac() {
    use gpu_booking_fake_apiserver::FakeApiServer;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;

    let chart = chart(&[]);
    let server = FakeApiServer::new();
    chart.enforce_on(&server);
    let volumes = tempfile::tempdir().unwrap();

    let (bootstrap, client): (BootstrapCli, _) = job(
        &chart,
        &server,
        "Job",
        "gpu-booking-bootstrap",
        volumes.path(),
    );
    let mint = |key: &[u8]| Ok(format!("minted-with-{}", key.len()));
    let report = gpu_booking_certs::bootstrap::run(client, NAMESPACE, &bootstrap.args, &mint)
        .await
        .unwrap_or_else(|e| panic!("the bootstrap Job: {e:#}"));
    assert!(report.created);
    assert!(server
        .get::<Secret>(Some(NAMESPACE), "gpu-booking-secrets")
        .is_some());

    certs_job(
        &chart,
        &server,
        "Job",
        "gpu-booking-certs-pre",
        volumes.path(),
    )
    .await;
    let tls = server.get::<Secret>(Some(NAMESPACE), "gpu-booking-webhook-tls");
    assert!(
        tls.is_some(),
        "the pre-install Job wrote no serving certificate"
    );

    // helm creates the chart's objects between the hooks.
    let configuration = chart
        .objects()
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .expect("the chart renders its webhook configuration")
        .clone();
    server.put_value("mutatingwebhookconfigurations", configuration);
    let post = certs_job(
        &chart,
        &server,
        "Job",
        "gpu-booking-certs-post",
        volumes.path(),
    )
    .await;
    assert_eq!(
        post.injection,
        gpu_booking_certs::cluster::Injection::Patched(1)
    );
    let stored = server
        .get::<MutatingWebhookConfiguration>(None, "gpu-booking-webhook")
        .unwrap();
    let bundle = stored.webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("the CA is in the configuration");
    assert!(!bundle.0.is_empty());

    let renewal = certs_job(
        &chart,
        &server,
        "CronJob",
        "gpu-booking-certs",
        volumes.path(),
    )
    .await;
    assert_eq!(renewal.secrets_written, 0, "nothing was due");
    assert_eq!(server.denials(), Vec::new(), "a Job was refused a request");
}

/// The chart's admission policy bounds the node agent as the chart says: its
/// ServiceAccount may move the last-GPU-activity annotation of any pod, and the API
/// server refuses it anything else (a label, another annotation).
#[tokio::test]
async fn the_charts_policy_lets_the_agent_change_only_its_annotation() {
    use gpu_booking_fake_apiserver::FakeApiServer;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};

    let chart = chart(&[]);
    let server = FakeApiServer::new();
    server.enable_admission();
    chart.enforce_on(&server);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "jupyter-bob", "namespace": "jhub", "labels": {"app": "jupyterhub"}},
        "spec": {"containers": [{"name": "notebook", "image": "jupyter"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(server.client(), "jhub")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let agent: Api<Pod> = Api::namespaced(
        server.client_as(
            &service_accounts::username(AGENT),
            &service_accounts::GROUPS,
        ),
        "jhub",
    );
    let patch =
        |metadata: serde_json::Value| Patch::Merge(serde_json::json!({"metadata": metadata}));
    agent
        .patch(
            "jupyter-bob",
            &PatchParams::default(),
            &patch(serde_json::json!({"annotations": {"gpu-booking.io/last-gpu-activity": "2026-11-29T08:00:00Z"}})),
        )
        .await
        .expect("the agent moves its annotation");
    for forbidden in [
        serde_json::json!({"labels": {"app": "other"}}),
        serde_json::json!({"annotations": {"terminate-at": "2026-11-29T09:00:00Z"}}),
    ] {
        let refused = agent
            .patch(
                "jupyter-bob",
                &PatchParams::default(),
                &patch(forbidden.clone()),
            )
            .await
            .expect_err("the policy refuses it");
        let kube::Error::Api(status) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(status.code, 422, "{forbidden}: {}", status.message);
        assert!(
            status
                .message
                .contains("ValidatingAdmissionPolicy 'gpu-booking-agent-pod-patch'"),
            "{}",
            status.message
        );
    }
    assert_eq!(server.denials(), Vec::new());
}
