//! The lab's API server over HTTPS, for `kubectl` and any other Kubernetes client
//! outside the process: the fake API server ([`FakeApiServer::http_service`]) served
//! on a local port with a certificate of the lab's own cluster CA, and a kubeconfig
//! that trusts that CA and authenticates as the cluster's administrator.
//!
//! HTTPS rather than plain HTTP on loopback: the kubeconfig's bearer token, as every
//! client's, only travels encrypted, and in-cluster clients (KubeSpawner's, which load
//! the ServiceAccount's `ca.crt` and speak HTTPS to `kubernetes.default.svc`) connect
//! as they would to a real cluster. The CA is the cluster's, not the webhook's, as in
//! a real cluster.
//!
//! The administrator is kubeadm's: user `kubernetes-admin` in group
//! `kubeadm:cluster-admins`, which a ClusterRoleBinding of that name binds to the
//! bootstrap `cluster-admin` ClusterRole, so that its requests go through RBAC where
//! the lab enforces it (the end-to-end harness) like everyone else's.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use gpu_booking_fake_apiserver::FakeApiServer;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::stack::{stopped, CertDir, Task};

/// The kubeconfig's user and the group that makes it the cluster's administrator.
pub const ADMIN_USER: &str = "kubernetes-admin";
pub const ADMIN_GROUP: &str = "kubeadm:cluster-admins";
/// The kubeconfig's cluster, user and context name.
const CONTEXT: &str = "gpu-booking-lab";
/// kube-apiserver's default limit on a request body (3 MiB).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
type Limits = gpu_booking_process::serve::ServerLimits<MAX_BODY_BYTES>;

/// The fake API server, served over HTTPS until stopped.
pub struct HttpsApiServer {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The kubeconfig (owner-only: it holds the administrator's token).
    pub kubeconfig: PathBuf,
    /// The cluster CA's certificate.
    pub ca_path: PathBuf,
    _dir: CertDir,
    task: Task,
}

impl HttpsApiServer {
    /// Serves `server` on `listen` (port 0: a free one), the cluster CA, the serving
    /// certificate and key under `dir/apiserver/`, the kubeconfig at `dir/kubeconfig`.
    pub async fn start(
        server: &FakeApiServer,
        listen: SocketAddr,
        dir: CertDir,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the API server's address {listen}"))?;
        let addr = reachable(listener.local_addr()?);
        let mut names: Vec<String> = [
            "localhost",
            "127.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from)
        .to_vec();
        if !names.contains(&addr.ip().to_string()) {
            names.push(addr.ip().to_string());
        }
        let certs =
            gpu_booking_certs::pki::DevCerts::generate("gpu-booking lab cluster CA", &names)?;
        let paths = certs
            .write_to(&dir.path().join("apiserver"))
            .context("writing the API server's certificates")?;
        let tls = gpu_booking_webhook::tls::server_config(
            certs.serving.cert_pem.as_bytes(),
            certs.serving.key_pem.as_bytes(),
        )?;

        server.store_bootstrap_roles();
        server.put_value(
            "clusterrolebindings",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": ADMIN_GROUP},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ADMIN_GROUP}],
            }),
        );
        let token = server.user_token(ADMIN_USER, &[ADMIN_GROUP]);
        let url = format!("https://{addr}");
        let kubeconfig = dir.path().join("kubeconfig");
        gpu_booking_certs::pki::write_private(
            &kubeconfig,
            &kubeconfig_yaml(&url, &certs.ca_pem, ADMIN_USER, &token)?,
        )
        .with_context(|| format!("writing {}", kubeconfig.display()))?;

        let app = axum::Router::new().fallback_service(server.http_service());
        let handshake = move |tcp| {
            let acceptor = TlsAcceptor::from(tls.clone());
            async move { acceptor.accept(tcp).await }
        };
        let task = Task::spawn(|rx| async move {
            let served = gpu_booking_process::serve::serve(
                listener,
                &Limits::default(),
                app,
                too_large,
                handshake,
                stopped(rx),
            )
            .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the simulated lab's API server stopped serving HTTPS");
            }
        });
        Ok(Self {
            url,
            kubeconfig,
            ca_path: paths.ca,
            _dir: dir,
            task,
        })
    }

    pub async fn stop(self) {
        self.task.stop().await;
    }

    /// Writes to `path` (owner-only) a kubeconfig for this server that authenticates
    /// as `user` with `token` (a ServiceAccount's, say), in namespace `jhub`.
    pub fn write_kubeconfig(
        &self,
        path: &std::path::Path,
        user: &str,
        token: &str,
    ) -> anyhow::Result<()> {
        let ca_pem = std::fs::read_to_string(&self.ca_path)
            .with_context(|| format!("reading {}", self.ca_path.display()))?;
        gpu_booking_certs::pki::write_private(
            path,
            &kubeconfig_yaml(&self.url, &ca_pem, user, token)?,
        )
        .with_context(|| format!("writing {}", path.display()))
    }
}

/// A body the server did not read, answered as kube-apiserver answers one over its
/// limit: a `Status`.
fn too_large(refusal: &gpu_booking_process::serve::BodyRefusal) -> axum::response::Response {
    use gpu_booking_process::serve::BodyRefusal;
    let (code, reason) = match refusal {
        BodyRefusal::TooLarge { .. } => (413, "RequestEntityTooLarge"),
        BodyRefusal::TimedOut { .. } => (408, "Timeout"),
        BodyRefusal::Unreadable(_) => (400, "BadRequest"),
    };
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": refusal.to_string(), "reason": reason, "code": code,
    });
    let mut response = axum::response::IntoResponse::into_response(axum::Json(status));
    *response.status_mut() =
        axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::BAD_REQUEST);
    response
}

/// A kubeconfig for the server at `url` whose CA is `ca_pem`, authenticating as
/// `user` with `token`, in namespace `jhub` (where the notebooks are).
fn kubeconfig_yaml(url: &str, ca_pem: &str, user: &str, token: &str) -> anyhow::Result<String> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {
            "cluster": CONTEXT, "user": user, "namespace": crate::spawner::NOTEBOOK_NAMESPACE,
        }}],
        "current-context": CONTEXT,
    });
    Ok(serde_yaml::to_string(&config)?)
}

/// `addr` as a destination: an unspecified address (0.0.0.0, ::) becomes loopback.
pub fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => ([127, 0, 0, 1], addr.port()).into(),
        ip if ip.is_unspecified() => (std::net::Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}
