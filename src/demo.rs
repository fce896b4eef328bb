//! `gpu-booking demo`: the system on a local Postgres with no set-up: the API and the
//! booking page, and a simulated lab cluster with the webhook and the controller on
//! it ([`crate::demo_cluster`]).
//!
//! Database, in order: `DATABASE_URL`; else a server on 127.0.0.1:5432, else a
//! private cluster started with the system's `initdb`/`pg_ctl` under
//! `target/demo-postgres`; on either of these the demo's own database
//! `gpu_booking_demo` (created, or dropped and recreated with `--fresh`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use chrono::TimeDelta;
use gpu_booking_api::auth::{mint_token, Authenticator, Role};
use gpu_booking_api::config::{
    ApiArgs, AuthArgs, DatabaseArgs, JwtSecretArgs, LogFormat, OidcArgs, PolicyArgs,
};
use gpu_booking_api::server;
use gpu_booking_api::store::bookings::{self, NewBooking};
use gpu_booking_core::username::Username;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::demo_args::DemoArgs;

/// The sample users, one for each outcome of the webhook, with the review to try it.
const SAMPLES: [(&str, &str, &str); 3] = [
    (
        "zoë@uni.example",
        "booked: a running booking of an a100 (seeded)",
        "examples/admission/booked-user-gpu-pod.json",
    ),
    (
        "Bob.Smith",
        "lent: no booking, a free a6000 is lent",
        "examples/admission/unbooked-user-gpu-pod.json",
    ),
    (
        "carol@example.com",
        "stripped: no booking, asks for an a100, and both are in use (lent to the seeded notebooks)",
        "examples/admission/stripped-user-gpu-pod.json",
    ),
];

const PRIVATE_PORT: u16 = 55432;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    gpu_booking_api::config::init_logging(LogFormat::Plain);
    let url = match &args.database_url {
        Some(_) if args.fresh => {
            bail!("--fresh drops the demo's own database; with DATABASE_URL, reset that database yourself")
        }
        Some(url) => url.clone(),
        None => {
            let admin = match local_server().await {
                Some(url) => url,
                None => private_cluster(&args.data_dir)?,
            };
            demo_database(&admin, &args.demo_database, args.fresh).await?
        }
    };
    let database = DatabaseArgs {
        database_url: Some(url.clone()),
        database_url_file: None,
        db_max_connections: 8,
    };
    let pool = server::connect(&database).await?;
    server::migrate(&pool).await?;

    // A fresh secret every run: demo tokens die with the demo.
    let secret = gpu_booking_api::testing::random_secret();
    let api_args = ApiArgs {
        listen: args.listen,
        database,
        auth: AuthArgs {
            secret: JwtSecretArgs {
                jwt_secret: Some(String::from_utf8(secret.clone())?),
                jwt_secret_file: None,
            },
            ..AuthArgs::default()
        },
        // Bookings of up to 2 GPUs, so that the page shows multi-GPU booking (the
        // lab's A100 node has 2 cards).
        policy: PolicyArgs {
            max_units_per_booking: 2,
            ..PolicyArgs::default()
        },
        oidc: OidcArgs::default(),
        hub_login: Default::default(),
        names: Default::default(),
        waitlist_sweep: TimeDelta::minutes(1),
        limits: Default::default(),
        write_limits: Default::default(),
        // No SMTP or webhook: notices are listed on the page only, soon after.
        notices: gpu_booking_api::notices::config::NoticeArgs {
            notice_interval: std::time::Duration::from_secs(2),
            ..Default::default()
        },
        models: Default::default(),
        log: Default::default(),
        change_retention: std::time::Duration::from_secs(7 * 86_400),
        archive_after: TimeDelta::days(1),
    };
    // The lab's webhook, controller and agents authenticate with their ServiceAccount
    // tokens (TokenReview against the lab's API server); the HS256 secret signs the
    // people's tokens and the service token printed below for curl.
    let lab = crate::demo_cluster::builder(&args);
    let auth =
        Authenticator::new(Some(&secret), None).with_service_accounts(lab.service_accounts()?);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let token = |user: &str, role| mint_token(&secret, user, role, TimeDelta::days(1));
    let service_token = token("demo-service", Some(Role::Service))?;
    // The API is reached at its listening address (0.0.0.0 is not a destination).
    let api_url = format!(
        "http://{}",
        gpu_booking_sim::https_api::reachable(args.listen)
    );
    let sim = crate::demo_cluster::start(lab, &pool, api_url.clone()).await?;
    // After the lab's models are declared.
    seed(&pool).await?;
    gpu_booking_sim::course_seed::seed(
        &pool,
        api_args.notices.time_zone,
        "alice@example.com",
        chrono::Utc::now(),
    )
    .await?;
    let mut pickable: Vec<String> = SAMPLES
        .iter()
        .map(|(user, _, _)| (*user).to_owned())
        .collect();
    pickable.extend(["alice@example.com", "admin@example.com"].map(String::from));
    pickable.extend(["dave@uni.example", "erin@uni.example"].map(String::from));
    let state = server::state(pool.clone(), &api_args, auth);
    let _sweep = server::spawn_waitlist_sweep(state.clone(), server::sweep_interval(&api_args));
    let notices = tokio::spawn(server::notice_worker(&state, &api_args.notices)?.run());
    let changes = state.changes.clone();
    let app = gpu_booking_api::app::router(state)
        .merge(crate::demo_cluster::routes(sim.clone()))
        .merge(crate::demo_signin::routes(secret.clone(), pickable));
    // Served from here on: the lab's controller and webhook call it while the seeded
    // notebooks start.
    let limits = api_args.limits.clone();
    let served =
        tokio::spawn(async move { server::serve_router(listener, app, &limits, &changes).await });
    // The page's address first; the seeded notebooks start while a newcomer reads.
    let ca = sim.webhook_ca().await.unwrap_or_default();
    println!("gpu-booking demo");
    let kept = if args.fresh {
        "dropped and recreated: --fresh"
    } else {
        "kept from earlier runs; --fresh starts over"
    };
    println!("  database:     {} ({kept})", redact(&url));
    println!("  booking page: http://{}/", args.listen);
    println!("  OpenAPI:      http://{}/api/openapi.json", args.listen);
    println!(
        "  user token  (alice@example.com):  {}",
        token("alice@example.com", None)?
    );
    println!(
        "  admin token (admin@example.com):  {}",
        token("admin@example.com", Some(Role::Admin))?
    );
    println!("  service token (for curl):         {service_token}");
    println!(
        "  webhook:      https://{}/mutate (CA: {})",
        args.webhook_listen,
        ca.display()
    );
    println!(
        "  try: curl -H \"Authorization: Bearer <user token>\" http://{}/api/v1/models",
        args.listen
    );
    println!(
        "  kubectl:      KUBECONFIG={} kubectl get pods -A (the lab's API server: {})",
        sim.kubeconfig().display(),
        sim.https.url
    );
    let secret_file = write_secret(&args.cert_dir, &secret)?;
    println!(
        "  any user:     GPU_BOOKING_JWT_SECRET_FILE={} gpu-booking token --user NAME [--role admin]",
        secret_file.display()
    );
    for (user, outcome, review) in SAMPLES {
        println!("  sample {user:<18} {outcome}");
        println!(
            "    curl --cacert {} -H 'Content-Type: application/json' --data @{review} https://{}/mutate",
            ca.display(),
            args.webhook_listen
        );
    }
    println!(
        "  cluster view: http://{}/#cluster (a simulated lab: spawn notebooks as any user)",
        args.listen
    );
    println!(
        "  sign in as any user: on the page's sign-in view (the demo's user picker, POST /demo/sign-in)"
    );
    // After the lab and the API are up: its spawn form asks the API at once.
    let _hub = if args.jupyterhub {
        let page = format!("http://{}/", args.listen);
        let hub = crate::demo_jupyterhub::start(
            &sim,
            &crate::demo_jupyterhub::HubSettings {
                port: args.jupyterhub_port,
                booking_url: &api_url,
                service_token: &service_token,
                page_url: &page,
                dir: &args.jupyterhub_dir,
            },
        )
        .await?;
        println!(
            "  JupyterHub:   {} (KubeSpawner spawns into the lab; any user name, password: {})",
            hub.login_url,
            crate::demo_jupyterhub::PASSWORD
        );
        println!(
            "    log in as {} (a booked a100) or any other name (a lent GPU, or CPU when none is free)",
            SAMPLES[0].0
        );
        Some(hub)
    } else {
        None
    };
    println!("starting the seeded notebooks (lent A100s) ...");
    crate::demo_cluster::seed_notebooks(&sim, &pool, args.scene).await;
    println!("Ctrl-C stops it.");
    let served = served
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!("the API task failed: {e}")));
    notices.abort();
    if let Ok(sim) = std::sync::Arc::try_unwrap(sim) {
        sim.shutdown().await;
    }
    served
}

/// Writes the demo's JWT secret where `gpu-booking token` can read it (owner only),
/// so that a token can be minted for any user while this demo runs.
fn write_secret(dir: &Path, secret: &[u8]) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("jwt-secret");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(secret)?;
    Ok(path)
}

/// Seeds, once: a running a100 booking of the "booked" sample user (the models are
/// the simulated lab's, declared by [`crate::demo_cluster::start`]).
async fn seed(pool: &PgPool) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    // Through the booking rules like any booking: it starts now, for the shortest
    // duration the policy allows.
    let policy = gpu_booking_core::booking_policy::Policy::default();
    let user = Username::parse(SAMPLES[0].0)?;
    let booking = NewBooking {
        user: &user,
        model: "a100",
        units: 1,
        start: now,
        end: now + policy.min_duration,
        override_rules: false,
        created_by: "demo",
    };
    if let Err(e) = bookings::create(pool, &policy, now, booking).await {
        // A restart within the sample user's cooldown: the page says why.
        tracing::info!(error = %e, "the sample booking was not made again");
    }
    Ok(())
}

/// The demo's own database on the server of `admin_url` (created if missing; dropped
/// first with `fresh`); its URL.
async fn demo_database(admin_url: &str, name: &str, fresh: bool) -> anyhow::Result<String> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(admin_url)
        .await
        .with_context(|| format!("connecting to {}", redact(admin_url)))?;
    if fresh {
        // FORCE: a demo still running elsewhere must not keep the old data alive.
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&pool)
            .await
            .context("dropping the demo database (--fresh)")?;
    }
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(&pool)
        .await?;
    if exists.is_none() {
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await
            .context("creating the demo database")?;
    }
    pool.close().await;
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url, |(base, _)| base);
    Ok(format!("{base}/{name}"))
}

/// A server on 127.0.0.1:5432 with trust auth: the URL of its `postgres` database.
async fn local_server() -> Option<String> {
    for user in ["postgres", "root"] {
        let admin = format!("postgres://{user}@127.0.0.1:5432/postgres");
        if let Ok(pool) = PgPoolOptions::new()
            .max_connections(1)
            .connect(&admin)
            .await
        {
            pool.close().await;
            return Some(admin);
        }
    }
    None
}

/// Starts (creating if needed) a private cluster with the system's tools.
fn private_cluster(dir: &Path) -> anyhow::Result<String> {
    let bin = postgres_bin_dir()
        .context("no Postgres server on 127.0.0.1:5432 and no initdb/pg_ctl found")?;
    if is_root() {
        bail!("no Postgres on 127.0.0.1:5432, and initdb refuses to run as root: set DATABASE_URL or run as a normal user");
    }
    let dir = std::path::absolute(dir)?;
    if !dir.join("PG_VERSION").exists() {
        std::fs::create_dir_all(&dir)?;
        let ok = Command::new(bin.join("initdb"))
            .args(["-D"])
            .arg(&dir)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"])
            .status()?
            .success();
        anyhow::ensure!(ok, "initdb failed");
    }
    let options = format!(
        "-p {PRIVATE_PORT} -c listen_addresses=127.0.0.1 -k {}",
        dir.display()
    );
    let _ = Command::new(bin.join("pg_ctl"))
        .arg("-D")
        .arg(&dir)
        .args(["-o", &options, "-l"])
        .arg(dir.join("log"))
        .args(["-w", "start"])
        .status()?;
    Ok(format!(
        "postgres://postgres@127.0.0.1:{PRIVATE_PORT}/postgres"
    ))
}

fn postgres_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
    });
    on_path.or_else(|| {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .collect();
        versions.sort();
        versions.pop()
    })
}

fn is_root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0\n"))
            .unwrap_or(false)
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if url[scheme + 3..at].contains(':') => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}
