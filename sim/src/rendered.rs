//! The Helm chart of this repository as `helm template` renders it for the simulated
//! lab (release `gpu-booking` in namespace `gpu-booking`, the values of
//! `sim/chart-values.yaml` plus a scenario's `--set`s), so that the end-to-end
//! scenarios run each component as the chart installs it:
//!
//! - the chart's Roles, ClusterRoles, their bindings and its ValidatingAdmissionPolicies
//!   are stored in the fake API server, which then enforces them
//!   ([`RenderedChart::enforce_on`]): a verb the chart forgets fails a scenario;
//! - each component's options are its workload's environment
//!   ([`Workload::argv`]): what the chart sets, the component gets, through the same
//!   option parser as the binary. Only what belongs to the cluster and not to the
//!   chart is translated: Service DNS names into the lab's addresses, the projected
//!   ServiceAccount token's mount into the lab's token file, listen addresses into
//!   free loopback ports, and `fieldRef`s into the lab's pod.
//!
//! helm is found at `$HELM` or where `scripts/chart-tools.sh` installs it
//! (`target/chart-tools/helm/helm`); the test script runs that first.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use gpu_booking_fake_apiserver::FakeApiServer;
use serde_json::Value;

/// The release name and namespace the lab installs the chart as.
pub const RELEASE: &str = "gpu-booking";
pub const RELEASE_NAMESPACE: &str = "gpu-booking";

/// The booking API's Service as the chart writes its URL into the other components'
/// environment.
pub const API_SERVICE_URL: &str = "http://gpu-booking-api.gpu-booking.svc:8080";

/// Environment variables a workload sets that are not the component's to take in
/// the lab: the process's logging (the lab's one process sets it once, for every
/// component) and the NVIDIA container runtime's.
const PROCESS_WIDE: [&str; 4] = [
    "RUST_LOG",
    "GPU_BOOKING_LOG_FORMAT",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
];

/// The repository's root (the chart and the lab's values are found from it).
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_default()
}

/// The helm binary: `$HELM`, else the one `scripts/chart-tools.sh` installs.
fn helm() -> anyhow::Result<PathBuf> {
    if let Some(helm) = std::env::var_os("HELM") {
        return Ok(PathBuf::from(helm));
    }
    let installed = repository().join("target/chart-tools/helm/helm");
    if installed.is_file() {
        return Ok(installed);
    }
    bail!(
        "helm is not installed: run scripts/chart-tools.sh (it installs helm under target/chart-tools) or set HELM"
    )
}

/// Every object the chart renders.
#[derive(Debug, Clone)]
pub struct RenderedChart {
    objects: Vec<Value>,
}

/// The kinds the fake API server enforces, and the resources they are stored as.
const ENFORCED: [(&str, &str); 6] = [
    ("ClusterRole", "clusterroles"),
    ("ClusterRoleBinding", "clusterrolebindings"),
    ("Role", "roles"),
    ("RoleBinding", "rolebindings"),
    ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    (
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    ),
];

impl RenderedChart {
    /// `helm template` of the chart with the lab's values and `set_values`
    /// (`key=value`, as `--set` takes them).
    pub fn render(set_values: &[&str]) -> anyhow::Result<Self> {
        let root = repository();
        let mut command = Command::new(helm()?);
        command
            .current_dir(&root)
            .args(["template", RELEASE, "charts/gpu-booking"])
            .args(["--namespace", RELEASE_NAMESPACE])
            .args(["--values", "sim/chart-values.yaml"]);
        for set in set_values {
            command.args(["--set", set]);
        }
        let output = command.output().context("running helm template")?;
        if !output.status.success() {
            bail!(
                "helm template failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Self::from_yaml(&String::from_utf8_lossy(&output.stdout))
    }

    /// The objects of a multi-document YAML stream (helm's output).
    pub fn from_yaml(text: &str) -> anyhow::Result<Self> {
        let mut objects = Vec::new();
        for document in serde_yaml::Deserializer::from_str(text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .context("the chart renders YAML the lab cannot read")?;
            if value.is_object() {
                objects.push(value);
            }
        }
        Ok(Self { objects })
    }

    pub fn objects(&self) -> &[Value] {
        &self.objects
    }

    /// The object of `kind` named `name`.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The same, to change (a test that takes a verb away from a role).
    pub fn find_mut(&mut self, kind: &str, name: &str) -> Option<&mut Value> {
        self.objects
            .iter_mut()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// Every object of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect()
    }

    /// The chart's MutatingWebhookConfiguration with `ca_pem` as every webhook's
    /// `caBundle`, as `gpu-booking certs` injects it.
    pub fn webhook_configuration(&self, ca_pem: &str) -> anyhow::Result<Value> {
        use base64::Engine as _;
        let mut configuration = self
            .of_kind("MutatingWebhookConfiguration")
            .into_iter()
            .next()
            .context("the chart renders no MutatingWebhookConfiguration")?;
        let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        for webhook in configuration["webhooks"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            webhook["clientConfig"]["caBundle"] = Value::String(bundle.clone());
        }
        Ok(configuration)
    }

    /// Removes `verb` from every rule of role `kind`/`name` (a test of what the lab
    /// does when the chart forgets it); false when there was no such role.
    pub fn remove_verb(&mut self, kind: &str, name: &str, verb: &str) -> bool {
        let Some(rules) = self
            .find_mut(kind, name)
            .and_then(|r| r.get_mut("rules"))
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        for rule in rules {
            if let Some(verbs) = rule.get_mut("verbs").and_then(Value::as_array_mut) {
                verbs.retain(|v| v != verb);
            }
        }
        true
    }

    /// Stores the chart's roles, bindings and admission policies in `server` and has
    /// it enforce them from now on.
    pub fn enforce_on(&self, server: &FakeApiServer) {
        for object in &self.objects {
            let kind = object["kind"].as_str().unwrap_or("");
            if let Some((_, plural)) = ENFORCED.iter().find(|(k, _)| *k == kind) {
                server.put_value(plural, object.clone());
            }
        }
        server.enable_rbac();
    }

    /// The first container of the workload (`Deployment`, `DaemonSet`, `Job`,
    /// `CronJob`) named
    /// `name`, with its pod's spec.
    pub fn workload(&self, kind: &str, name: &str) -> anyhow::Result<Workload<'_>> {
        let object = self
            .find(kind, name)
            .with_context(|| format!("the chart renders no {kind} {name}"))?;
        // A CronJob's pod is one level deeper, in its Job template.
        let pod = match kind {
            "CronJob" => &object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            _ => &object["spec"]["template"]["spec"],
        };
        let container = pod
            .pointer("/containers/0")
            .with_context(|| format!("{kind} {name} has no container"))?;
        Ok(Workload { pod, container })
    }
}

/// What the lab gives a workload's pod that a cluster would.
#[derive(Debug, Clone, Default)]
pub struct LabEnvironment {
    /// The pod's name (`fieldRef: metadata.name`).
    pub pod_name: String,
    /// The node it runs on (`fieldRef: spec.nodeName`).
    pub node_name: Option<String>,
    /// Service base URLs as the chart writes them (`http://<svc>.<ns>.svc:<port>`),
    /// each with the lab's address that serves it.
    pub services: Vec<(String, String)>,
    /// Secrets the pod mounts, by name: a folder holding one file per key (what the
    /// chart's certificate and bootstrap Jobs would have written).
    pub secrets: Vec<(String, PathBuf)>,
    /// The pod's projected ServiceAccount token (a file the lab issued).
    pub token_file: Option<PathBuf>,
}

/// A workload's volumes as the lab's kubelet mounted them: each `mountPath` of the
/// container with the local folder behind it.
pub struct Mounts {
    paths: Vec<(String, PathBuf)>,
}

impl Mounts {
    /// `value` with a leading mount path replaced by its local folder.
    fn translate(&self, value: &str) -> String {
        for (mount, local) in &self.paths {
            if let Some(rest) = value.strip_prefix(mount.as_str()) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{}{rest}", local.display());
                }
            }
        }
        value.to_owned()
    }
}

/// One container of a rendered workload.
pub struct Workload<'a> {
    pod: &'a Value,
    container: &'a Value,
}

impl Workload<'_> {
    /// `system:serviceaccount:<ns>:<name>`: who the API server says the pod is.
    pub fn username(&self) -> String {
        let account = self.pod["serviceAccountName"].as_str().unwrap_or("default");
        format!("system:serviceaccount:{RELEASE_NAMESPACE}:{account}")
    }

    /// The plain `value` of the container's environment variable `name`.
    pub fn env_value(&self, name: &str) -> Option<String> {
        self.container["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    }

    /// The container's `args` (the subcommand, `["controller"]`).
    pub fn args(&self) -> Vec<String> {
        strings(&self.container["args"])
    }

    /// Mounts the container's volumes as a kubelet would: a projected
    /// ServiceAccount token (the lab's token file, at the projection's path), a Secret
    /// (the lab's folder for it), an emptyDir (a fresh folder). Any other volume, or
    /// a Secret the lab does not have, is an error. Folders it makes are under
    /// `root`/`<pod name>`.
    pub fn mount(&self, lab: &LabEnvironment, root: &Path) -> anyhow::Result<Mounts> {
        let dir = root.join(&lab.pod_name);
        let volumes = self.pod["volumes"].as_array().cloned().unwrap_or_default();
        let mut paths = Vec::new();
        for mount in self.container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = mount["name"].as_str().unwrap_or("");
            let at = mount["mountPath"].as_str().unwrap_or("").to_owned();
            let volume = volumes
                .iter()
                .find(|v| v["name"] == name)
                .with_context(|| format!("volume {name} is mounted but not declared"))?;
            let local = if let Some(secret) = volume.pointer("/secret/secretName") {
                let folder = lab
                    .secrets
                    .iter()
                    .find(|(n, _)| secret == n.as_str())
                    .map(|(_, path)| path.clone())
                    .with_context(|| format!("the lab has no Secret {secret}"))?;
                match volume.pointer("/secret/items").and_then(Value::as_array) {
                    // Only the listed keys, each at its path.
                    Some(items) => {
                        let local = dir.join(name);
                        std::fs::create_dir_all(&local)?;
                        for item in items {
                            let key = item["key"].as_str().unwrap_or("");
                            let path = item["path"].as_str().unwrap_or(key);
                            std::fs::copy(folder.join(key), local.join(path)).with_context(
                                || format!("Secret {secret} has no key {key} in the lab"),
                            )?;
                        }
                        local
                    }
                    None => folder,
                }
            } else if let Some(sources) = volume
                .pointer("/projected/sources")
                .and_then(Value::as_array)
            {
                let local = dir.join(name);
                std::fs::create_dir_all(&local)?;
                for source in sources {
                    let path = source
                        .pointer("/serviceAccountToken/path")
                        .and_then(Value::as_str)
                        .with_context(|| format!("volume {name} projects more than a token"))?;
                    let token = lab.token_file.as_ref().with_context(|| {
                        format!("volume {name}: the lab issued this pod no token")
                    })?;
                    std::fs::copy(token, local.join(path))
                        .with_context(|| format!("mounting the token of volume {name}"))?;
                }
                local
            } else if volume.get("emptyDir").is_some() {
                let local = dir.join(name);
                std::fs::create_dir_all(&local)?;
                local
            } else {
                bail!("the lab cannot mount volume {name}: {volume}");
            };
            paths.push((at, local));
        }
        Ok(Mounts { paths })
    }

    /// The command line that the container's environment amounts to for `command`
    /// (the component's option parser): `--<long>=<value>` for each variable one of
    /// its options reads, after the lab's translations (see the module's doc; paths
    /// under a mount through `mounts`). A variable that no option reads, or a value
    /// the lab cannot supply, is an error: the chart would set something the
    /// component ignores.
    pub fn argv(
        &self,
        command: &clap::Command,
        lab: &LabEnvironment,
        mounts: &Mounts,
    ) -> anyhow::Result<Vec<String>> {
        // `command` parses what follows the binary's subcommand (`args[0]`); the
        // rest of `args` names subcommands of its own (`certs self-signed`).
        let mut argv = vec![command.get_name().to_owned()];
        let mut commands = vec![command];
        for sub in self.args().iter().skip(1) {
            let inner = commands
                .last()
                .and_then(|c| c.find_subcommand(sub))
                .with_context(|| {
                    format!(
                        "`gpu-booking {}` has no subcommand {sub}",
                        self.args().join(" ")
                    )
                })?;
            commands.push(inner);
            argv.push(sub.clone());
        }
        let env = self.container["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for variable in &env {
            let name = variable["name"].as_str().unwrap_or("");
            if PROCESS_WIDE.contains(&name) {
                continue;
            }
            let Some(arg) = commands
                .iter()
                .rev()
                .flat_map(|c| c.get_arguments())
                .find(|a| a.get_env().is_some_and(|e| e == name))
            else {
                bail!(
                    "the chart sets {name}, which no option of `gpu-booking {}` reads",
                    self.args().join(" ")
                );
            };
            let long = arg
                .get_long()
                .with_context(|| format!("{name} has no long option"))?;
            let mut value = mounts.translate(&self.value_of(variable, lab)?);
            if long.ends_with("listen") {
                value = "127.0.0.1:0".to_owned();
            }
            for (chart, local) in &lab.services {
                if let Some(rest) = value.strip_prefix(chart.as_str()) {
                    value = format!("{local}{rest}");
                }
            }
            if arg.get_action().takes_values() {
                argv.push(format!("--{long}={value}"));
            } else if matches!(value.as_str(), "true" | "1" | "yes" | "on") {
                argv.push(format!("--{long}"));
            }
        }
        Ok(argv)
    }

    fn value_of(&self, variable: &Value, lab: &LabEnvironment) -> anyhow::Result<String> {
        let name = variable["name"].as_str().unwrap_or("");
        if let Some(value) = variable.get("value") {
            return Ok(value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned));
        }
        let field = variable
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str);
        match field {
            Some("metadata.namespace") => Ok(RELEASE_NAMESPACE.to_owned()),
            Some("metadata.name") => Ok(lab.pod_name.clone()),
            Some("spec.nodeName") => lab
                .node_name
                .clone()
                .with_context(|| format!("{name}: the lab gives this pod no node")),
            _ => bail!("{name}: the lab cannot supply {}", variable["valueFrom"]),
        }
    }
}

/// The options `T` parses from the container's environment in the lab: its volumes
/// mounted under `root` ([`Workload::mount`]), then its variables turned into
/// options ([`Workload::argv`]), then `extra` (a scenario's own, each replacing the
/// chart's value of the same option).
pub fn options<T: clap::Parser>(
    workload: &Workload<'_>,
    lab: &LabEnvironment,
    root: &Path,
    extra: &[String],
) -> anyhow::Result<T> {
    let mounts = workload.mount(lab, root)?;
    let command = T::command();
    let mut argv = workload.argv(&command, lab, &mounts)?;
    // A scenario's option replaces the chart's for the same option.
    let option = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
    let replaced: Vec<String> = extra.iter().map(|e| option(e)).collect();
    argv.retain(|a| !(a.starts_with("--") && replaced.contains(&option(a))));
    argv.extend(extra.iter().cloned());
    T::try_parse_from(&argv).with_context(|| {
        format!(
            "the chart's environment for `gpu-booking {}`",
            workload.args().join(" ")
        )
    })
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: demo
spec:
  template:
    spec:
      serviceAccountName: demo-sa
      containers:
        - name: demo
          args: ["demo"]
          env:
            - name: RUST_LOG
              value: info
            - name: DEMO_URL
              value: http://gpu-booking-api.gpu-booking.svc:8080/api
            - name: DEMO_TOKEN
              value: /var/run/token/service-token
            - name: DEMO_ADMIN_LISTEN
              value: 0.0.0.0:9090
            - name: DEMO_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: DEMO_DRY_RUN
              value: "true"
          volumeMounts:
            - name: token
              mountPath: /var/run/token
      volumes:
        - name: token
          projected:
            sources:
              - serviceAccountToken:
                  audience: gpu-booking
                  path: service-token
"#;

    #[derive(clap::Parser, Debug)]
    struct Demo {
        #[arg(long, env = "DEMO_URL")]
        url: String,
        #[arg(long, env = "DEMO_TOKEN")]
        token: PathBuf,
        #[arg(long, env = "DEMO_ADMIN_LISTEN")]
        admin_listen: String,
        #[arg(long, env = "DEMO_NAME")]
        name: String,
        #[arg(long, env = "DEMO_DRY_RUN")]
        dry_run: bool,
    }

    #[test]
    fn the_environment_becomes_options_with_the_labs_translations() {
        let chart = RenderedChart::from_yaml(DEPLOYMENT).unwrap();
        let workload = chart.workload("Deployment", "demo").unwrap();
        assert_eq!(
            workload.username(),
            "system:serviceaccount:gpu-booking:demo-sa"
        );
        let root = tempfile::tempdir().unwrap();
        let token = root.path().join("issued");
        std::fs::write(&token, "the token").unwrap();
        let lab = LabEnvironment {
            pod_name: "demo-0".into(),
            services: vec![(API_SERVICE_URL.into(), "http://127.0.0.1:4000".into())],
            token_file: Some(token),
            ..LabEnvironment::default()
        };
        let demo: Demo = options(&workload, &lab, root.path(), &[]).unwrap();
        assert_eq!(demo.url, "http://127.0.0.1:4000/api");
        assert_eq!(std::fs::read_to_string(&demo.token).unwrap(), "the token");
        assert!(demo.token.starts_with(root.path().join("demo-0")));
        assert_eq!(demo.admin_listen, "127.0.0.1:0");
        assert_eq!(demo.name, "demo-0");
        assert!(demo.dry_run);
    }

    #[test]
    fn a_variable_no_option_reads_is_an_error() {
        let chart =
            RenderedChart::from_yaml(&DEPLOYMENT.replace("DEMO_DRY_RUN", "DEMO_DRY_RUNS")).unwrap();
        let workload = chart.workload("Deployment", "demo").unwrap();
        let root = tempfile::tempdir().unwrap();
        let token = root.path().join("issued");
        std::fs::write(&token, "t").unwrap();
        let lab = LabEnvironment {
            pod_name: "demo-0".into(),
            token_file: Some(token),
            ..LabEnvironment::default()
        };
        let error = options::<Demo>(&workload, &lab, root.path(), &[]).unwrap_err();
        assert!(error.to_string().contains("DEMO_DRY_RUNS"), "{error:#}");
    }

    #[test]
    fn a_verb_can_be_taken_from_a_role() {
        let mut chart = RenderedChart::from_yaml(
            "kind: Role\nmetadata: {name: r}\nrules:\n  - {apiGroups: [''], resources: [pods], verbs: [get, patch]}\n",
        )
        .unwrap();
        assert!(chart.remove_verb("Role", "r", "patch"));
        assert_eq!(
            chart.find("Role", "r").unwrap()["rules"][0]["verbs"],
            serde_json::json!(["get"])
        );
        assert!(!chart.remove_verb("Role", "missing", "get"));
    }
}
