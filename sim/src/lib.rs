//! A simulated lab cluster with the whole gpu-booking system running on it, in one
//! process: the end-to-end tests (`tests/it/e2e_*.rs`) and `gpu-booking demo` both use it.
//!
//! - The **fake** Kubernetes API server ([`gpu_booking_fake_apiserver`]) with its
//!   kube-scheduler-like scheduling, its kubelet and its admission chain switched on.
//! - GPU nodes labelled as gpu-feature-discovery labels them ([`lab`]).
//! - The chart's PriorityClasses and MutatingWebhookConfiguration ([`chart`]), the
//!   latter with the `caBundle` of the webhook's fresh CA and its Service registered
//!   at the webhook's real address, so that pod creations reach it over HTTPS.
//! - The real webhook and the real controller ([`stack`]), and the real node agent on
//!   each GPU node with a fake NVML, a fake `/proc` and a fake container runtime whose
//!   notebook kernels are real processes ([`agents`]); the booking API is given
//!   ([`BookingService`]): the demo serves its own, tests start one with
//!   [`stack::ApiServer`].
//! - Service identity as in a cluster: the webhook, the controller and the agents
//!   authenticate to the booking API with their projected ServiceAccount tokens,
//!   which the API verifies by TokenReview against the fake ([`service_accounts`]).
//! - Notebook pods as KubeSpawner 7.1 writes them, created with the hub's
//!   ServiceAccount ([`spawner`]); what the cluster looks like ([`view`]); the demo's
//!   HTTP routes over both ([`routes`]).
#![forbid(unsafe_code)]

pub mod agents;
pub mod chart;
pub mod course_seed;
pub mod https_api;
pub mod hub;
pub mod jupyterhub;
pub mod lab;
pub mod models;
pub mod notebooks;
pub mod rendered;
pub mod routes;
pub mod scenes;
pub mod service_accounts;
pub mod spawner;
pub mod stack;
pub mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_booking_agent::AgentConfig;
use gpu_booking_controller::{Controller, ControllerArgs};
use gpu_booking_fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

pub use agents::AgentSettings;
pub use chart::{ChartValues, FailurePolicy};
pub use lab::GpuNode;
pub use rendered::RenderedChart;
pub use stack::{ApiServer, WebhookServer};
pub use view::ClusterView;

/// The pod name of the lab's first controller replica (its leader-election identity).
pub const FIRST_CONTROLLER_POD: &str = "gpu-booking-controller-0";

/// The booking API the webhook, the controller and the agents talk to. They
/// authenticate with their ServiceAccount tokens ([`service_accounts`]): the API must
/// verify them with [`SimBuilder::service_accounts`].
#[derive(Debug, Clone)]
pub struct BookingService {
    pub url: String,
}

/// How to build a [`SimCluster`]; [`SimCluster::builder`] starts at the demo lab.
pub struct SimBuilder {
    /// Made with the builder, so that the booking API can verify the lab's tokens
    /// ([`SimBuilder::service_accounts`]) before the lab starts.
    server: FakeApiServer,
    nodes: Vec<GpuNode>,
    chart: ChartValues,
    webhook_listen: SocketAddr,
    webhook_admin_listen: Option<SocketAddr>,
    /// Where the API server listens for clients outside the process (`kubectl`).
    apiserver_listen: SocketAddr,
    cert_dir: Option<PathBuf>,
    webhook_args: Vec<String>,
    controller: Box<dyn FnOnce(&mut ControllerArgs) + Send>,
    grace_period: Option<i64>,
    agents: AgentSettings,
    rendered: Option<RenderedChart>,
    /// Services and Secrets the lab gives the controller besides its own.
    controller_lab: rendered::LabEnvironment,
}

impl SimBuilder {
    /// A Service the chart's controller options name (`http://hub.jhub.svc:8081`),
    /// served in the lab at `local` (`http://127.0.0.1:<port>`).
    pub fn lab_service(mut self, chart_url: &str, local: &str) -> Self {
        self.controller_lab
            .services
            .push((chart_url.to_owned(), local.to_owned()));
        self
    }

    /// A Secret the chart's controller mounts, in the lab a folder with a file per
    /// key.
    pub fn lab_secret(mut self, name: &str, folder: PathBuf) -> Self {
        self.controller_lab.secrets.push((name.to_owned(), folder));
        self
    }

    /// Installs `chart` as the Helm chart renders it: the API server enforces its
    /// RBAC and admission policies, and the controller runs with its Deployment's
    /// environment ([`rendered`]). Without, the lab grants every request (the demo).
    pub fn rendered_chart(mut self, chart: RenderedChart) -> Self {
        self.rendered = Some(chart);
        self
    }

    /// Whether [`Self::rendered_chart`] was given.
    pub fn has_rendered_chart(&self) -> bool {
        self.rendered.is_some()
    }

    /// What the booking API verifies the lab's ServiceAccount tokens with (TokenReviews
    /// answered by this lab's API server): as the chart configures the API, when the
    /// lab installs it.
    pub fn service_accounts(
        &self,
    ) -> anyhow::Result<gpu_booking_api::service_accounts::ServiceAccounts> {
        match &self.rendered {
            Some(chart) => service_accounts::chart_verifier(&self.server, chart),
            None => Ok(service_accounts::verifier(&self.server)),
        }
    }

    /// The lab's nodes as configured so far.
    pub fn lab_nodes(&self) -> &[GpuNode] {
        &self.nodes
    }

    /// `spec.terminationGracePeriodSeconds` of spawned notebooks (what a hub admin sets
    /// with KubeSpawner's `extra_pod_config`); without it the API server's default of
    /// 30 s applies and a preempted or expired notebook takes that long to go.
    pub fn notebook_grace_period(mut self, seconds: i64) -> Self {
        self.grace_period = Some(seconds);
        self
    }

    /// The notebooks' grace period set so far.
    pub fn grace_period(&self) -> Option<i64> {
        self.grace_period
    }

    /// The lab's nodes (replacing the demo lab).
    pub fn nodes(mut self, nodes: Vec<GpuNode>) -> Self {
        self.nodes = nodes;
        self
    }

    /// The chart's `webhook.failurePolicy`, for a lab without a rendered chart (with
    /// one, `--set webhook.failurePolicy=...`).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.chart.failure_policy = policy;
        self
    }

    /// Other chart values.
    pub fn chart(mut self, chart: ChartValues) -> Self {
        self.chart = chart;
        self
    }

    /// Where the webhook listens (default: a free port on 127.0.0.1).
    pub fn webhook_listen(mut self, addr: SocketAddr) -> Self {
        self.webhook_listen = addr;
        self
    }

    /// Serve the webhook's `/healthz`, `/readyz` and `/metrics` at `addr`.
    pub fn webhook_admin_listen(mut self, addr: SocketAddr) -> Self {
        self.webhook_admin_listen = Some(addr);
        self
    }

    /// Where the API server serves HTTPS for `kubectl` and other clients outside the
    /// process (default: a free port on 127.0.0.1; [`https_api`]).
    pub fn apiserver_listen(mut self, addr: SocketAddr) -> Self {
        self.apiserver_listen = addr;
        self
    }

    /// Keep the webhook's CA and certificate in `dir` (default: a temporary folder),
    /// and the API server's CA, certificate and kubeconfig beside them.
    pub fn cert_dir(mut self, dir: PathBuf) -> Self {
        self.cert_dir = Some(dir);
        self
    }

    /// A `gpu-booking webhook` option, as the chart would pass it.
    pub fn webhook_arg(mut self, arg: impl Into<String>) -> Self {
        self.webhook_args.push(arg.into());
        self
    }

    /// Adjusts the controller's options, after the adjustments given before (so a
    /// harness's settings and a scenario's both apply).
    pub fn controller(
        mut self,
        configure: impl FnOnce(&mut ControllerArgs) + Send + 'static,
    ) -> Self {
        let before = self.controller;
        self.controller = Box::new(move |args| {
            before(args);
            configure(args);
        });
        self
    }

    /// The node agents' sample interval (default 1 s).
    pub fn agent_interval(mut self, interval: Duration) -> Self {
        self.agents.sample_interval = interval;
        self
    }

    /// Adjusts each node agent's configuration (idle window, dry run, ...), after
    /// the lab's defaults ([`AgentSettings::config`]).
    pub fn agent(mut self, configure: impl Fn(&mut AgentConfig) + Send + Sync + 'static) -> Self {
        self.agents.configure = Arc::new(configure);
        self
    }

    /// The GPU utilisation (percent) of each new notebook's kernel (default 0: idle,
    /// a kernel that waits for its user); [`SimCluster::set_gpu_util`] changes it.
    pub fn notebook_gpu_util(mut self, percent: u32) -> Self {
        self.agents.notebook_util = percent;
        self
    }

    /// Builds the cluster and starts the webhook, the controller and the node agents
    /// against `booking`.
    pub async fn start(self, booking: BookingService) -> anyhow::Result<SimCluster> {
        let server = self.server;
        server.keep_request_log(false);
        server.enable_scheduler();
        server.enable_kubelet();
        server.enable_admission();
        // Before any pod starts: each gets its address, each notebook its server.
        let notebooks = notebooks::NotebookServers::start(&server);

        for ns in [
            spawner::NOTEBOOK_NAMESPACE,
            &self.chart.namespace,
            "kube-system",
            "default",
        ] {
            let namespace: Namespace = serde_json::from_value(json!({
                "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}
            }))?;
            server.put(&namespace);
        }
        for node in &self.nodes {
            server.put(&node.to_node());
        }
        // The chart's PriorityClasses as it renders them, or as `ChartValues` builds
        // them (the demo, which has no helm).
        let classes = match &self.rendered {
            Some(chart) => chart.of_kind("PriorityClass"),
            None => self.chart.priority_classes(),
        };
        for class in classes {
            server.put_value("priorityclasses", class);
        }

        // Each component's projected token, a file as the kubelet mounts it.
        let tokens = service_accounts::ProjectedTokens::issue(&server)?;
        // The pods' volumes, as the lab's kubelet mounts them.
        let volumes = tempfile::tempdir()?;
        let webhook = WebhookServer::start(stack::WebhookOptions {
            booking_url: booking.url.clone(),
            service_token_file: tokens.path(service_accounts::WEBHOOK),
            listen: self.webhook_listen,
            admin_listen: self.webhook_admin_listen,
            dns_names: vec![
                format!("{}.{}.svc", self.chart.webhook_name, self.chart.namespace),
                format!(
                    "{}.{}.svc.cluster.local",
                    self.chart.webhook_name, self.chart.namespace
                ),
            ],
            cert_dir: match self.cert_dir.clone() {
                Some(dir) => stack::CertDir::Kept(dir),
                None => stack::CertDir::temporary()?,
            },
            extra_args: self.webhook_args,
            chart: self
                .rendered
                .clone()
                .map(|chart| (chart, volumes.path().to_owned())),
        })
        .await?;
        server.register_service(
            &self.chart.namespace,
            &self.chart.webhook_name,
            self.chart.service_port,
            webhook.addr,
        );
        // The webhook configuration with the CA injected, as `gpu-booking certs` does.
        let configuration = match &self.rendered {
            Some(chart) => chart.webhook_configuration(&webhook.ca_pem)?,
            None => self.chart.webhook_configuration(&webhook.ca_pem),
        };
        server.put_value("mutatingwebhookconfigurations", configuration);

        if let Some(chart) = &self.rendered {
            for (plural, object) in spawner::hub_rbac() {
                server.put_value(plural, object);
            }
            chart.enforce_on(&server);
        }
        let https = https_api::HttpsApiServer::start(
            &server,
            self.apiserver_listen,
            match self.cert_dir {
                Some(dir) => stack::CertDir::Kept(dir),
                None => stack::CertDir::temporary()?,
            },
        )
        .await?;
        let mut model_node_label = String::new();
        let configure = self.controller;
        let args = stack::controller_args(
            self.rendered.as_ref(),
            &booking.url,
            &tokens.path(service_accounts::CONTROLLER),
            FIRST_CONTROLLER_POD,
            volumes.path(),
            &self.controller_lab,
        )?;
        let controller =
            stack::start_controller(stack::controller_client(&server), args, |args| {
                configure(args);
                model_node_label = args.admission.model_node_label.clone();
            })?;
        let agents = agents::NodeAgents::start(
            &server,
            &self.nodes,
            &booking,
            &tokens.path(service_accounts::AGENT),
            &self.agents,
            self.rendered.as_ref().map(|chart| (chart, volumes.path())),
        )?;
        Ok(SimCluster {
            server,
            booking,
            tokens,
            rendered: self.rendered,
            volumes,
            controller_lab: self.controller_lab,
            grace_period: self.grace_period,
            model_node_label,
            chart: self.chart,
            nodes: self.nodes,
            webhook: tokio::sync::Mutex::new(Some(webhook)),
            https,
            notebooks,
            controller,
            agents,
        })
    }
}

/// Creates `user`'s notebook as KubeSpawner does, with `client` (the hub's identity).
pub async fn spawn_notebook(
    client: &kube::Client,
    user: &str,
    gpus: u32,
    grace_period: Option<i64>,
) -> Result<Pod, kube::Error> {
    create_notebook_as(client, spawner::notebook_pod(user, gpus), grace_period).await
}

/// Creates the notebook pod `body` through `client` (the hub's identity), with the
/// lab's grace period if it sets one.
pub async fn create_notebook_as(
    client: &kube::Client,
    mut body: serde_json::Value,
    grace_period: Option<i64>,
) -> Result<Pod, kube::Error> {
    if let Some(seconds) = grace_period {
        body["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
    }
    let raw: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        spawner::NOTEBOOK_NAMESPACE,
        &ApiResource::erase::<Pod>(&()),
    );
    let stored = api.create(&PostParams::default(), &raw).await?;
    serde_json::to_value(stored)
        .and_then(serde_json::from_value)
        .map_err(kube::Error::SerdeError)
}

/// The simulated lab with the webhook and the controller running on it.
pub struct SimCluster {
    pub server: FakeApiServer,
    /// The booking API the webhook and the controller use.
    pub booking: BookingService,
    /// The components' ServiceAccount tokens (a successor controller reads its own).
    tokens: service_accounts::ProjectedTokens,
    /// The chart as installed, when the lab enforces it.
    rendered: Option<RenderedChart>,
    /// The components' volumes (`rendered::Workload::mount`).
    volumes: tempfile::TempDir,
    /// What the lab gives the controller besides its own ([`SimBuilder::lab_service`]).
    controller_lab: rendered::LabEnvironment,
    pub chart: ChartValues,
    pub nodes: Vec<GpuNode>,
    grace_period: Option<i64>,
    /// The node label the controller writes the model into.
    model_node_label: String,
    webhook: tokio::sync::Mutex<Option<WebhookServer>>,
    /// The API server over HTTPS, with its kubeconfig.
    pub https: https_api::HttpsApiServer,
    /// The notebooks' stand-in single-user servers.
    notebooks: notebooks::NotebookServers,
    pub controller: Controller,
    /// The node agents, one per GPU node.
    pub agents: agents::NodeAgents,
}

impl SimCluster {
    /// The demo lab, the chart's defaults, a free webhook port.
    pub fn builder() -> SimBuilder {
        SimBuilder {
            server: FakeApiServer::new(),
            nodes: lab::demo_lab(),
            chart: ChartValues::default(),
            webhook_listen: ([127, 0, 0, 1], 0).into(),
            webhook_admin_listen: None,
            apiserver_listen: ([127, 0, 0, 1], 0).into(),
            cert_dir: None,
            webhook_args: Vec::new(),
            controller: Box::new(|_| {}),
            grace_period: None,
            agents: AgentSettings::default(),
            rendered: None,
            controller_lab: rendered::LabEnvironment::default(),
        }
    }

    /// A client acting as JupyterHub's ServiceAccount.
    pub fn hub(&self) -> Api<Pod> {
        Api::namespaced(self.hub_client(), spawner::NOTEBOOK_NAMESPACE)
    }

    /// A client with the hub's identity (what KubeSpawner's requests carry).
    pub fn hub_client(&self) -> kube::Client {
        self.server
            .client_as(spawner::HUB_USER, &spawner::HUB_GROUPS)
    }

    /// Spawns `user`'s notebook as JupyterHub does, asking for `gpus` GPUs; the pod as
    /// stored (admitted, and bound or marked unschedulable). The body goes out as
    /// KubeSpawner sends it, quantities as JSON numbers included (the API server
    /// stores them as canonical strings).
    pub async fn spawn(&self, user: &str, gpus: u32) -> Result<Pod, kube::Error> {
        spawn_notebook(&self.hub_client(), user, gpus, self.grace_period).await
    }

    /// The notebooks' grace period, if the lab sets one.
    pub fn notebook_grace(&self) -> Option<i64> {
        self.grace_period
    }

    /// Starts another controller replica on this cluster (its own pod `pod_name`,
    /// leader election on, the options the first one started from, then
    /// `configure`), e.g. the successor of a killed one.
    pub fn start_replica(
        &self,
        pod_name: &str,
        configure: impl FnOnce(&mut ControllerArgs),
    ) -> anyhow::Result<Controller> {
        let args = stack::controller_args(
            self.rendered.as_ref(),
            &self.booking.url,
            &self.tokens.path(service_accounts::CONTROLLER),
            pod_name,
            self.volumes.path(),
            &self.controller_lab,
        )?;
        stack::start_controller(stack::controller_client(&self.server), args, |args| {
            args.leader_elect = true;
            configure(args);
        })
    }

    /// The requests the API server refused (RBAC) so far: a lab that installs the
    /// chart ([`SimBuilder::rendered_chart`]) expects none.
    pub fn denials(&self) -> Vec<gpu_booking_fake_apiserver::Denial> {
        self.server.denials()
    }

    /// Creates a notebook pod from `body` (a [`spawner::notebook_pod`] the caller
    /// changed, e.g. with a profile's `nodeSelector`) as the hub does.
    pub async fn create_notebook(&self, body: serde_json::Value) -> Result<Pod, kube::Error> {
        create_notebook_as(&self.hub_client(), body, self.grace_period).await
    }

    /// Runs a pod of another workload in `namespace` (a training job's, as a cluster
    /// admin or a CI system creates it: no JupyterHub user), asking for `gpus` of
    /// the generic GPU resource; the pod as stored, admitted as the cluster admits it.
    pub async fn run_workload(
        &self,
        namespace: &str,
        name: &str,
        gpus: u32,
    ) -> Result<Pod, kube::Error> {
        let mut body = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "train",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
                }],
            },
        });
        if let Some(seconds) = self.grace_period {
            body["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
        }
        let api: Api<Pod> = Api::namespaced(self.server.client(), namespace);
        let pod: Pod = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
        api.create(&PostParams::default(), &pod).await
    }

    /// Stops `user`'s notebook as JupyterHub does (a graceful delete).
    pub async fn stop_notebook(&self, user: &str) -> Result<(), kube::Error> {
        self.hub()
            .delete(&spawner::pod_name(user), &DeleteParams::default())
            .await
            .map(|_| ())
    }

    /// `user`'s notebook pod, if there is one.
    pub fn notebook(&self, user: &str) -> Option<Pod> {
        self.server
            .get::<Pod>(Some(spawner::NOTEBOOK_NAMESPACE), &spawner::pod_name(user))
    }

    /// The warnings the admission webhooks gave on the latest admission of pod `name`
    /// in the notebook namespace (what `kubectl` prints as `Warning:`).
    pub fn admission_warnings(&self, name: &str) -> Vec<String> {
        self.server
            .admission_log()
            .into_iter()
            .rev()
            .find(|r| r.name == name && r.namespace.as_deref() == Some(spawner::NOTEBOOK_NAMESPACE))
            .map(|r| r.warnings)
            .unwrap_or_default()
    }

    /// What the cluster looks like now.
    pub fn view(&self) -> ClusterView {
        view::ClusterView::of(&self.server)
    }

    /// What the cluster looks like now, with the GPUs offered back as the booking
    /// service keeps them (asked as the controller, which sees every user's); the
    /// cluster alone when the service does not answer.
    pub async fn view_with_offers(&self) -> ClusterView {
        let view = self.view();
        let offers = async {
            let token = gpu_booking_client::TokenSource::file(
                self.tokens.path(service_accounts::CONTROLLER),
            )?;
            let client = gpu_booking_client::BookingClient::new(
                &self.booking.url,
                token,
                Duration::from_secs(2),
                "gpu-booking-sim-view",
            )?;
            anyhow::Ok(client.offers().await?.offers)
        };
        match offers.await {
            Ok(offers) => view.with_offers(offers),
            Err(e) => {
                tracing::debug!(error = %e, "the cluster view without offers");
                view
            }
        }
    }

    /// Waits until `condition` holds on the cluster, re-checking after every change;
    /// false when `timeout` passed first.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        condition: impl FnMut(&FakeApiServer) -> bool,
    ) -> bool {
        tokio::time::timeout(timeout, self.server.wait_until(condition))
            .await
            .is_ok()
    }

    /// Waits until the controller has labelled every GPU node with its model (so booked
    /// pods, which select nodes by that label, can be placed), as a running cluster
    /// would have long before anyone spawns. Fails after `timeout`, naming the nodes.
    pub async fn controller_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let unlabelled = |s: &FakeApiServer| -> Vec<String> {
            s.list::<k8s_openapi::api::core::v1::Node>(None)
                .into_iter()
                .filter(|n| {
                    // The model label, or (a node of models with resources of their
                    // own, which needs none) a label per model.
                    let labels = n.metadata.labels.clone().unwrap_or_default();
                    let per_model = labels.keys().any(|k| {
                        k.starts_with(gpu_booking_core::inventory::MODEL_PRESENT_LABEL_PREFIX)
                    });
                    labels.contains_key(gpu_booking_core::inventory::DEFAULT_PRODUCT_LABEL)
                        && !labels.contains_key(&self.model_node_label)
                        && !per_model
                })
                .filter_map(|n| n.metadata.name)
                .collect()
        };
        if self.wait_until(timeout, |s| unlabelled(s).is_empty()).await {
            return Ok(());
        }
        anyhow::bail!(
            "the controller did not label GPU nodes {:?} with {} or per model within {timeout:?} (is every product a declared model?)",
            unlabelled(&self.server),
            self.model_node_label
        )
    }

    /// Stops the webhook: its Service has no endpoint any more and the API server's
    /// calls fail (then `failurePolicy` decides).
    pub async fn stop_webhook(&self) {
        if let Some(webhook) = self.webhook.lock().await.take() {
            webhook.stop().await;
        }
    }

    /// The webhook's replica of the booking service, while the webhook runs (and
    /// decides from one).
    pub async fn webhook_replica(
        &self,
    ) -> Option<std::sync::Arc<gpu_booking_webhook::ReplicaHandle>> {
        self.webhook
            .lock()
            .await
            .as_ref()
            .and_then(|w| w.replica.clone())
    }

    /// The webhook's metrics (OpenMetrics text), while it runs.
    pub async fn webhook_metrics(&self) -> Option<String> {
        self.webhook
            .lock()
            .await
            .as_ref()
            .map(|w| w.metrics.encode())
    }

    /// The webhook's CA file, while it runs.
    pub async fn webhook_ca(&self) -> Option<PathBuf> {
        self.webhook
            .lock()
            .await
            .as_ref()
            .map(|w| w.ca_path.clone())
    }

    /// The PID of the GPU process (the notebook's kernel) of `user`'s notebook, while
    /// it is on the node's cards: `None` once it has exited (the agent reclaimed it,
    /// or the pod ended) or when the notebook holds no GPU.
    pub fn gpu_process(&self, user: &str) -> Option<u32> {
        let pod = self.notebook(user)?;
        let node = self.agents.node(pod.spec.as_ref()?.node_name.as_deref()?)?;
        node.kernel_pid(pod.metadata.uid.as_deref()?)
    }

    /// Sets how busy the GPU process of `user`'s notebook is (percent of the last
    /// sample period in which a kernel ran); false when it has none.
    pub fn set_gpu_util(&self, user: &str, percent: u32) -> bool {
        let Some(pod) = self.notebook(user) else {
            return false;
        };
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| self.agents.node(n));
        let Some((node, uid)) = node.zip(pod.metadata.uid.as_deref()) else {
            return false;
        };
        match node.kernel_pid(uid) {
            Some(pid) => {
                node.gpu.set_process_util(pid, percent);
                true
            }
            None => false,
        }
    }

    /// Stops the node agents, the controller and the webhook.
    pub async fn shutdown(self) {
        self.controller.stop();
        self.stop_webhook().await;
        self.agents.stop().await;
        self.https.stop().await;
        self.notebooks.stop().await;
    }

    /// The kubeconfig of the lab's API server over HTTPS (the cluster administrator's).
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.https.kubeconfig
    }
}
