//! End to end: the webhook over real HTTPS (rcgen certificates, a test CA) in front of
//! the real booking API on the real Postgres; and certificate rotation the way a
//! Kubernetes Secret volume does it (a new directory, then the `..data` symlink swapped).

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use common::*;
use gpu_booking_api::testing::TestApi;
use gpu_booking_webhook::{ReviewOut, WebhookArgs, WebhookServer};
use k8s_openapi::api::core::v1::Pod;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// A test CA that issues serving certificates for localhost and 127.0.0.1.
pub(crate) struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "gpu-booking test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { ca }
    }

    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// (certificate PEM, key PEM, certificate DER) named `cn`.
    pub(crate) fn issue(&self, cn: &str) -> (String, String, Vec<u8>) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }
}

/// A directory laid out like a mounted Secret: `..<version>/tls.{crt,key}`, `..data`
/// pointing at the current version, and `tls.crt`/`tls.key` pointing through `..data`.
pub(crate) struct SecretDir {
    root: PathBuf,
    version: u32,
}

impl SecretDir {
    pub(crate) fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("gpu-booking-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Self { root, version: 0 }
    }

    pub(crate) fn cert(&self) -> PathBuf {
        self.root.join("tls.crt")
    }

    pub(crate) fn key(&self) -> PathBuf {
        self.root.join("tls.key")
    }

    /// Writes a new version and swaps `..data` atomically, as the kubelet does.
    pub(crate) fn write(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let dir = format!(
            "..2026_11_22_00_00_{:02}.{}",
            self.version,
            std::process::id()
        );
        std::fs::create_dir(self.root.join(&dir)).unwrap();
        std::fs::write(self.root.join(&dir).join("tls.crt"), cert).unwrap();
        std::fs::write(self.root.join(&dir).join("tls.key"), key).unwrap();
        let tmp = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&dir, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
        for file in ["tls.crt", "tls.key"] {
            let link = self.root.join(file);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(file), &link).unwrap();
            }
        }
    }
}

impl Drop for SecretDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The ServiceAccount that creates JupyterHub's pods in these reviews.
pub(crate) const HUB: &str = "system:serviceaccount:jhub:hub";

/// The webhook on 127.0.0.1 (TLS) with its admin port; stopped when dropped.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) server: Arc<WebhookServer>,
    _stop: oneshot::Sender<()>,
}

pub(crate) async fn start_webhook(args: WebhookArgs) -> Running {
    let server = Arc::new(WebhookServer::from_args(&args).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let admin_app = server.admin_router();
    tokio::spawn(async move {
        let _ = axum::serve(admin, admin_app).await;
    });
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    Running {
        addr,
        admin: admin_addr,
        server,
        _stop: stop,
    }
}

/// A client that trusts only the test CA, reaches `localhost` at the webhook's port,
/// and reports the peer certificate.
fn client(ca_pem: &str, addr: SocketAddr, keep_alive: bool) -> reqwest::Client {
    let mut builder = client_builder(ca_pem, addr);
    if !keep_alive {
        builder = builder.pool_max_idle_per_host(0);
    }
    builder.build().unwrap()
}

/// [`client`]'s settings, for a client that needs more (its own source address, a
/// client certificate).
pub(crate) fn client_builder(ca_pem: &str, addr: SocketAddr) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .resolve("localhost", addr)
        .tls_info(true)
        .timeout(Duration::from_secs(10))
}

pub(crate) async fn mutate(
    client: &reqwest::Client,
    addr: SocketAddr,
    review: &Value,
) -> (ReviewOut, Vec<u8>) {
    let response = client
        .post(format!(
            "https://localhost:{}/mutate?timeout=10s",
            addr.port()
        ))
        .json(review)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let peer = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    (response.json().await.unwrap(), peer)
}

pub(crate) fn ks(file: &str) -> Value {
    apiserver_view(kubespawner(file), "jhub")
}

pub(crate) fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub(crate) async fn api(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Value,
) -> Value {
    let response = client
        .request(method, url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{status}: {body}");
    body
}

/// Waits (bounded) for a row the webhook reports on its own task.
async fn eventually(pool: &sqlx::PgPool, sql: &str) -> i64 {
    for _ in 0..100 {
        let n: i64 = sqlx::query_scalar(sql).fetch_one(pool).await.unwrap();
        if n > 0 {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    0
}

#[sqlx::test(migrations = "../migrations")]
async fn e2e_booked_and_unbooked_users_on_a_full_and_a_free_model(pool: sqlx::PgPool) {
    let api_server = TestApi::start(pool.clone()).await.unwrap();
    let admin = api_server.token("admin@example.com", Some("admin"));
    let service = api_server.token("webhook", Some("service"));
    let http = reqwest::Client::new();
    let put = reqwest::Method::PUT;
    // a100: 2 units, both in use (full), its nodes advertise the VRAM budget (80 GB
    // cards). a6000: 4 units, none in use (free), its nodes advertise no budget.
    for (model, units, pattern, mib, in_use, unit_mib) in [
        ("a100", 2, "*A100*", 40960, 2, Some(81408)),
        ("a6000", 4, "*A6000*", 49152, 0, None),
    ] {
        let url = format!("{}/api/v1/models/{model}", api_server.url);
        api(
            &http,
            put.clone(),
            url.clone(),
            &admin,
            json!({"units": units, "patterns": [pattern], "gpumem_mib": mib}),
        )
        .await;
        api(
            &http,
            put.clone(),
            format!("{url}/usage"),
            &service,
            json!({"in_use": in_use, "cards": units,
                   "gpumem_advertised": unit_mib.is_some(), "gpumem_unit_mib": unit_mib}),
        )
        .await;
    }
    let now = Utc::now();
    let end = now + chrono::TimeDelta::days(2);
    let booking = api(
        &http,
        reqwest::Method::POST,
        format!("{}/api/v1/bookings", api_server.url),
        &admin,
        json!({"model": "a100", "start": (now - chrono::TimeDelta::hours(1)).to_rfc3339(),
               "end": end.to_rfc3339(), "user": "alice@example.com", "override": true}),
    )
    .await;
    let booking_id = booking["id"].as_i64().unwrap();
    // Bob's last booking ended yesterday: he is in cooldown, so the strip warning
    // names a date other than now, which must be /me/next-start's.
    api(
        &http,
        reqwest::Method::POST,
        format!("{}/api/v1/bookings", api_server.url),
        &admin,
        json!({"model": "a6000", "start": (now - chrono::TimeDelta::days(3)).to_rfc3339(),
               "end": (now - chrono::TimeDelta::days(1)).to_rfc3339(), "user": "Bob.Smith", "override": true}),
    )
    .await;
    let until = chrono::DateTime::parse_from_rfc3339(booking["end"].as_str().unwrap())
        .unwrap()
        .with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::Secs, true);

    let pki = Pki::new();
    let (cert, key, _) = pki.issue("webhook");
    let mut secret = SecretDir::new("e2e");
    secret.write(&cert, &key);
    let mut args = WebhookArgs::with_defaults(
        secret.cert(),
        secret.key(),
        api_server.url.clone(),
        service.clone(),
    );
    args.model_resource = vec![(
        gpu_booking_core::gpu_model::ModelName::parse("a100").unwrap(),
        "nvidia.com/a100".into(),
    )];
    args.trusted_spawner = vec![HUB.into()];
    args.spawner_namespace = vec!["jhub".into()];
    let webhook = start_webhook(args).await;
    let https = client(&pki.ca_pem(), webhook.addr, true);

    let check = |pod: &Value, out: &ReviewOut| -> Pod {
        assert!(out.response.allowed, "{:?}", out.response.status);
        patched(pod, out).unwrap().1
    };

    // Alice is booked on the full a100: high priority until the booking's end, and an
    // audit row; no preemption is asked for (the controller acts on Pending pods).
    let pod = ks("7.1.0-alice-at-example.com-gpu.json");
    let (out, _) = mutate(&https, webhook.addr, &review("e2e-1", pod.clone())).await;
    assert_eq!(out.response.uid, "e2e-1");
    let patched_pod = check(&pod, &out);
    assert_eq!(label(&patched_pod, "gpu-booking.io/priority"), Some("high"));
    assert_eq!(
        label(&patched_pod, "gpu-booking.io/booking"),
        Some(booking_id.to_string().as_str())
    );
    let annotations = patched_pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.get("terminate-at"), Some(&until));
    // The a100 has its own resource: the pod asks for it and selects no node.
    let spec = patched_pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get("gpu-booking.io/model")),
        None
    );
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .unwrap();
    assert!(limits.contains_key("nvidia.com/a100") && !limits.contains_key("nvidia.com/gpu"));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("gpu-booking-high")
    );
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap();
    // a100 has a resource of its own: its budget is under its own budget resource.
    assert_eq!(limits.get("gpu-booking.io/gpumem-a100").unwrap().0, "40960");
    let sql = "SELECT count(*) FROM audit_event WHERE action = 'webhook.booked' AND user_name = 'alice@example.com' AND actor = 'webhook'";
    assert!(eventually(&pool, sql).await >= 1, "no audit row");

    // The same user known only by the label: escape slug (6.2) and safe slug (7.1).
    for (uid, file) in [
        ("e2e-2", "6.2.0-alice-at-example.com-gpu.json"),
        ("e2e-3", "7.1.0-alice-at-example.com-gpu-named.json"),
    ] {
        let mut pod = ks(file);
        pod["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        let (out, _) = mutate(&https, webhook.addr, &review(uid, pod.clone())).await;
        let patched_pod = check(&pod, &out);
        assert_eq!(
            label(&patched_pod, "gpu-booking.io/priority"),
            Some("high"),
            "{file}"
        );
        assert_eq!(
            patched_pod
                .metadata
                .annotations
                .unwrap()
                .get("terminate-at"),
            Some(&until),
            "{file}"
        );
    }

    // Bob has no booking: a6000 is free, so he gets one at low priority.
    let pod = ks("7.1.0-Bob.Smith-gpu.json");
    let (out, _) = mutate(&https, webhook.addr, &review("e2e-4", pod.clone())).await;
    let patched_pod = check(&pod, &out);
    assert_eq!(label(&patched_pod, "gpu-booking.io/priority"), Some("low"));
    let spec = patched_pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector
            .as_ref()
            .unwrap()
            .get("gpu-booking.io/model")
            .map(String::as_str),
        Some("a6000")
    );
    assert_eq!(spec.priority_class_name.as_deref(), Some("gpu-booking-low"));
    // No a6000 node advertises the budget: none is asked for (the pod would stay
    // Pending on it).
    let resources = spec.containers[0].resources.as_ref().unwrap();
    for section in [&resources.limits, &resources.requests] {
        assert!(
            section
                .as_ref()
                .is_none_or(|m| !m.contains_key("gpu-booking.io/gpumem")),
            "{section:?}"
        );
    }

    // Bob asking for the full a100 by resource name: stripped, told when he can book.
    let mut pod = ks("6.2.0-Bob.Smith-gpu.json");
    for section in ["requests", "limits"] {
        let map = pod["spec"]["containers"][0]["resources"][section]
            .as_object_mut()
            .unwrap();
        map.remove("nvidia.com/gpu");
        map.insert("nvidia.com/a100".into(), json!("1"));
    }
    let (out, _) = mutate(&https, webhook.addr, &review("e2e-5", pod.clone())).await;
    let patched_pod = check(&pod, &out);
    let main = &patched_pod.spec.as_ref().unwrap().containers[0];
    assert!(!main
        .resources
        .as_ref()
        .unwrap()
        .limits
        .as_ref()
        .unwrap()
        .contains_key("nvidia.com/a100"));
    let env = main.env.as_ref().unwrap();
    assert!(env
        .iter()
        .any(|e| e.name == "NVIDIA_VISIBLE_DEVICES" && e.value.as_deref() == Some("none")));
    assert_eq!(out.response.warnings.len(), 1);
    assert!(
        out.response.warnings[0].contains("no free a100 GPU"),
        "{:?}",
        out.response.warnings
    );
    let next = api(
        &http,
        reqwest::Method::GET,
        format!("{}/api/v1/me/next-start?model=a100", api_server.url),
        &api_server.token("Bob.Smith", None),
        Value::Null,
    )
    .await;
    let next = chrono::DateTime::parse_from_rfc3339(next["earliest_start"].as_str().unwrap())
        .unwrap()
        .with_timezone(&Utc);
    assert!(next > now + chrono::TimeDelta::days(12), "{next}");
    let said = format!("you can book from {}", next.format("%Y-%m-%d %H:%M UTC"));
    assert!(
        out.response.warnings[0].contains(&said),
        "{:?}, want {said:?}",
        out.response.warnings
    );

    // Alice's pod, created by anyone but the hub's ServiceAccount in jhub,
    // gets no booking: it is lent (the a6000 is free), not high priority on the a100.
    for (uid, creator, namespace) in [
        ("e2e-7", "system:serviceaccount:jhub:default", "jhub"),
        ("e2e-8", "mallory@example.com", "jhub"),
        ("e2e-9", HUB, "research"),
    ] {
        let pod = ks("7.1.0-alice-at-example.com-gpu.json");
        let mut forged = review(uid, pod.clone());
        forged["request"]["userInfo"] =
            json!({"username": creator, "groups": ["system:authenticated"]});
        forged["request"]["namespace"] = json!(namespace);
        let (out, _) = mutate(&https, webhook.addr, &forged).await;
        let patched_pod = check(&pod, &out);
        assert_eq!(
            label(&patched_pod, "gpu-booking.io/priority"),
            Some("low"),
            "{creator} in {namespace}"
        );
        assert!(label(&patched_pod, "gpu-booking.io/booking").is_none());
        let annotations = patched_pod.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key("terminate-at"), "{creator}");
    }

    // A GPU pod without identity is treated like an unbooked user's pod: lent when
    // a unit is free. Here the four a6000 went to Bob and the three pods above,
    // within one usage report (it still says 4 free): the webhook's lend ledger
    // knows they are taken, so this one runs on CPU instead of waiting for a card.
    let pod = plain_pod("cuda-job", json!({"limits": {"nvidia.com/gpu": "1"}}));
    let (out, _) = mutate(&https, webhook.addr, &review("e2e-10", pod.clone())).await;
    let patched_pod = check(&pod, &out);
    assert_eq!(label(&patched_pod, "gpu-booking.io/priority"), None);
    assert!(
        out.response.warnings[0].contains("no free GPU"),
        "{:?}",
        out.response.warnings
    );

    // A pod without a GPU passes untouched.
    let pod = ks("7.1.0-alice-at-example.com-nogpu.json");
    let (out, _) = mutate(&https, webhook.addr, &review("e2e-6", pod)).await;
    assert!(out.response.allowed && out.response.patch.is_none());

    // Health and metrics on the plain admin port.
    let readyz = http
        .get(format!("http://{}/readyz", webhook.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status(), 200);
    let metrics = http
        .get(format!("http://{}/metrics", webhook.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gpu_booking_webhook_admissions_total{decision=\"booked\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_booking_webhook_admissions_total{decision=\"low_priority\"} 4"),
        "{metrics}"
    );
    // Decided from the replica: it listed once, and no admission made a call.
    assert!(
        metrics.contains("gpu_booking_webhook_replica_reads_total{call=\"full\",outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("gpu_booking_webhook_booking_requests_total{"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_booking_webhook_replica_staleness_seconds "),
        "{metrics}"
    );
    drop(webhook.server);

    // --unidentified-gpu-pods=strip: the same pod without identity runs on CPU.
    let mut args = WebhookArgs::with_defaults(
        secret.cert(),
        secret.key(),
        api_server.url.clone(),
        service.clone(),
    );
    args.trusted_spawner = vec![HUB.into()];
    args.unidentified_gpu_pods = gpu_booking_webhook::Unidentified::Strip;
    let strict = start_webhook(args).await;
    let https = client(&pki.ca_pem(), strict.addr, true);
    let pod = plain_pod("cuda-job", json!({"limits": {"nvidia.com/gpu": "1"}}));
    let (out, _) = mutate(&https, strict.addr, &review("e2e-11", pod.clone())).await;
    let stripped = check(&pod, &out);
    let main = &stripped.spec.as_ref().unwrap().containers[0];
    let limits = main
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert!(!limits.contains_key("nvidia.com/gpu"), "{limits:?}");
    assert!(
        out.response.warnings[0].contains("not created by JupyterHub"),
        "{:?}",
        out.response.warnings
    );
    // Alice's own pod through the same webhook is still hers.
    let pod = ks("7.1.0-alice-at-example.com-gpu.json");
    let (out, _) = mutate(&https, strict.addr, &review("e2e-12", pod.clone())).await;
    assert_eq!(
        label(&check(&pod, &out), "gpu-booking.io/priority"),
        Some("high")
    );
}

#[tokio::test]
async fn a_rotated_certificate_is_served_from_the_next_connection() {
    let pki = Pki::new();
    let (cert_a, key_a, der_a) = pki.issue("webhook-a");
    let (cert_b, key_b, der_b) = pki.issue("webhook-b");
    let (cert_c, _, _) = pki.issue("webhook-c");
    let mut secret = SecretDir::new("rotation");
    secret.write(&cert_a, &key_a);
    // No GPU pods here: the booking service is never called.
    let args = WebhookArgs::with_defaults(
        secret.cert(),
        secret.key(),
        "http://127.0.0.1:9".into(),
        "unused".into(),
    );
    let webhook = start_webhook(args).await;
    let nogpu = review("rot", ks("7.1.0-alice-at-example.com-nogpu.json"));

    let keep_alive = client(&pki.ca_pem(), webhook.addr, true);
    let (out, peer) = mutate(&keep_alive, webhook.addr, &nogpu).await;
    assert_eq!(out.response.uid, "rot");
    assert_eq!(peer, der_a, "serves A first");

    secret.write(&cert_b, &key_b);
    let fresh = client(&pki.ca_pem(), webhook.addr, false);
    let (_, peer) = mutate(&fresh, webhook.addr, &nogpu).await;
    assert_eq!(peer, der_b, "a new connection gets B");
    // The kept-alive connection goes on with what it negotiated.
    let (out, peer) = mutate(&keep_alive, webhook.addr, &nogpu).await;
    assert!(out.response.allowed);
    assert_eq!(peer, der_a, "the open connection keeps A");

    // A half-written rotation (C with B's key) is refused; B stays in service.
    secret.write(&cert_c, &key_b);
    let (_, peer) = mutate(&fresh, webhook.addr, &nogpu).await;
    assert_eq!(peer, der_b, "a mismatched pair is not served");
    let metrics = webhook.server.metrics.encode();
    assert!(
        metrics.contains("gpu_booking_webhook_tls_reloads_total{outcome=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_booking_webhook_tls_reloads_total{outcome=\"error\"}"),
        "{metrics}"
    );

    // Completed: the next connection picks up the fixed pair.
    let (cert_d, key_d, der_d) = pki.issue("webhook-d");
    secret.write(&cert_d, &key_d);
    let (_, peer) = mutate(&fresh, webhook.addr, &nogpu).await;
    assert_eq!(peer, der_d);
}

#[tokio::test]
async fn plain_http_and_garbage_on_the_tls_port_do_not_hurt_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let (cert, key, _) = pki.issue("webhook");
    let mut secret = SecretDir::new("garbage");
    secret.write(&cert, &key);
    let args = WebhookArgs::with_defaults(
        secret.cert(),
        secret.key(),
        "http://127.0.0.1:9".into(),
        "unused".into(),
    );
    let webhook = start_webhook(args).await;
    let mut raw = tokio::net::TcpStream::connect(webhook.addr).await.unwrap();
    raw.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut buf)).await;
    // Still serving TLS.
    let https = client(&pki.ca_pem(), webhook.addr, true);
    let (out, _) = mutate(&https, webhook.addr, &json!({"garbage": true})).await;
    assert!(!out.response.allowed);
    assert_eq!(out.response.status.unwrap().code, 400);
}
