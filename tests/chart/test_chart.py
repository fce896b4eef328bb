"""Checks of the rendered chart: security defaults on every pod, no secret in the
defaults, the webhook configuration, the TLS modes, RBAC, and the values table.

Run by scripts/chart-test.sh (HELM names the helm binary)."""

import base64
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

import render
import values_table

FIXTURES = Path(__file__).resolve().parents[2] / "examples" / "admission"
SCENARIOS = render.scenarios()
RENDERED = {name: render.render(files) for name, files in SCENARIOS.items()}
POD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod"}
DEFAULT_VALUES = yaml.safe_load((render.CHART / "values.yaml").read_text())


def objects(scenario, kind=None):
    return [o for o in RENDERED[scenario] if kind is None or o["kind"] == kind]


def one(scenario, kind, name_suffix=""):
    found = [o for o in objects(scenario, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix} in {scenario}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(obj):
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if obj["kind"] == "Pod":
        return obj["spec"]
    return obj["spec"]["template"]["spec"]


def pods(scenario):
    return [(o, pod_spec(o)) for o in objects(scenario) if o["kind"] in POD_KINDS]


def containers(spec):
    return spec.get("containers", []) + spec.get("initContainers", [])


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def database_url_source(spec):
    """(Secret, key) the container's --database-url-file comes from."""
    (c,) = spec["containers"]
    path = env_of(c)["GPU_BOOKING_DATABASE_URL_FILE"]["value"]
    mount = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")][0]
    volume = [v for v in spec["volumes"] if v["name"] == mount["name"]][0]
    (item,) = volume["secret"]["items"]
    assert path == f"{mount['mountPath']}/{item['path']}"
    return {"name": volume["secret"]["secretName"], "key": item["key"]}


def component(obj):
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


# --- security defaults -------------------------------------------------------------

AGENT_EXCEPTIONS = "hostPID, UID 0 and CAP_KILL (docs/deploy.md)"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_has_the_security_defaults(scenario):
    seen = 0
    for obj, spec in pods(scenario):
        where = f"{scenario}: {obj['kind']} {obj['metadata']['name']}"
        pod_sc = spec.get("securityContext", {})
        agent = component(obj) == "agent"
        for flag in ("hostNetwork", "hostIPC"):
            assert not spec.get(flag), f"{where}: {flag}"
        if not agent:
            assert not spec.get("hostPID"), f"{where}: hostPID"
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, f"{where}: hostPath volume {volume['name']}"
        seccomp_pod = pod_sc.get("seccompProfile", {}).get("type")
        for c in containers(spec):
            sc = c.get("securityContext", {})
            cwhere = f"{where} container {c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, cwhere
            assert sc.get("allowPrivilegeEscalation") is False, cwhere
            assert sc.get("privileged", False) is False, cwhere
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), cwhere
            assert (sc.get("seccompProfile", {}).get("type") or seccomp_pod) == "RuntimeDefault", cwhere
            added = sc.get("capabilities", {}).get("add", [])
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            if agent:
                check_agent_exceptions(spec, pod_sc, sc, added, non_root, cwhere)
            else:
                assert non_root is True, cwhere
                assert added == [], cwhere
                uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
                assert isinstance(uid, int) and uid > 0, cwhere
            seen += 1
    assert seen >= 4


def check_agent_exceptions(spec, pod_sc, sc, added, non_root, where):
    """The agent's only exceptions: hostPID, and either UID 0 with exactly CAP_KILL or
    a non-root UID with nothing added."""
    assert spec.get("hostPID") is True, f"{where}: the agent needs hostPID ({AGENT_EXCEPTIONS})"
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if uid == 0:
        assert added == ["KILL"], f"{where}: only CAP_KILL may be added"
        assert non_root is False
    else:
        assert added == [], where
        assert non_root is True, where


def test_the_agent_is_on_by_default_in_dry_run_and_its_exceptions_are_explicit():
    """On by default on the GPU nodes: its activity annotations (preemption's least
    recently active order) and telemetry live, idle reclaim and the VRAM watchdog in
    dry run until the admin turns them on."""
    assert objects("minimal", "DaemonSet") == []
    default = pod_spec(one("defaults", "DaemonSet"))
    assert default["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {k: e.get("value") for k, e in env_of(default["containers"][0]).items()}
    assert env["GPU_BOOKING_AGENT_DRY_RUN"] == "true"
    assert env["GPU_BOOKING_AGENT_VRAM_DRY_RUN"] == "true"
    # Neither the annotation nor the watchdog nor idle reclaim is switched off.
    for off in ("GPU_BOOKING_AGENT_LAST_ACTIVITY_ANNOTATION", "GPU_BOOKING_AGENT_VRAM_WATCHDOG",
                "GPU_BOOKING_AGENT_IDLE_RECLAIM"):
        assert off not in env, off
    ds = one("everything", "DaemonSet")
    spec = pod_spec(ds)
    assert spec["hostPID"] is True
    assert spec["securityContext"]["runAsUser"] == 0
    (c,) = spec["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert spec["runtimeClassName"] == "nvidia"
    text = (render.CHART / "templates" / "agent.yaml").read_text()
    assert text.count("EXCEPTION") >= 3, "each exception says why where it is granted"
    unprivileged = pod_spec(one("agent-unprivileged", "DaemonSet"))
    assert unprivileged["securityContext"]["runAsUser"] == 1000
    assert "add" not in unprivileged["containers"][0]["securityContext"]["capabilities"]
    assert "runtimeClassName" not in unprivileged


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_only_pods_that_call_the_kubernetes_api_get_a_token(scenario):
    callers = {"controller", "agent", "certs", "bootstrap", "cleanup-nodes"}
    values = yaml.safe_load(SCENARIOS[scenario][0].read_text()) if SCENARIOS[scenario] else {}
    if values.get("auth", {}).get("serviceAccountTokens", {}).get("enabled", True):
        callers.add("api")  # TokenReviews
    for obj, spec in pods(scenario):
        mounted = spec.get("automountServiceAccountToken")
        if component(obj) in callers:
            assert mounted is True, obj["metadata"]["name"]
        else:
            assert mounted is False, obj["metadata"]["name"]


# --- secrets -------------------------------------------------------------------------

SECRET_LOOKING = [
    re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),  # a JWT
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"[a-z]+://[^/\s:@]+:[^/\s@]+@"),  # a URL with a password
    re.compile(r"^[A-Za-z0-9+/=_-]{32,}$"),  # a long random-looking token
]
# Options whose value is itself a secret (the components also read each from a file).
SECRET_VALUED_ENV = {
    "DATABASE_URL",
    "GPU_BOOKING_JWT_SECRET",
    # The webhook's, the controller's and the agent's (one shared option).
    "GPU_BOOKING_SERVICE_TOKEN",
}
SECRET_KEYS = re.compile(r"(password|passwd|secret|token|apikey|api_key|credential|private)", re.I)


def walk(data, path=""):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, data


def secret_findings(values):
    """Paths of values that hold, or look like they hold, a secret."""
    found = []
    for path, value in walk(values):
        if not isinstance(value, str):
            continue
        if any(p.search(value) for p in SECRET_LOOKING):
            found.append(path)
        elif SECRET_KEYS.search(path.split(".")[-1]):
            # Allowed: names of Secrets and of keys in them, never their contents.
            key = path.split(".")[-1]
            names_one = key in ("existingSecret", "secretName") or key.endswith(("SecretName", "Key"))
            if not (names_one and re.fullmatch(r"[a-z0-9.-]*", value)):
                found.append(path)
    return found


def test_no_secret_value_sits_in_the_defaults():
    assert secret_findings(DEFAULT_VALUES) == []


def test_the_secret_detector_would_catch_one():
    leaky = copy.deepcopy(DEFAULT_VALUES)
    leaky["auth"]["clientSecret"] = "s3cr3t"
    leaky["secrets"]["databaseUrlKey"] = "postgres://u:hunter2@db/x"
    leaky["webhook"]["serviceToken"] = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ3ZWJob29rIn0.sig"
    leaky["image"]["tag"] = "-----BEGIN PRIVATE KEY-----"
    assert sorted(secret_findings(leaky)) == [
        "auth.clientSecret", "image.tag", "secrets.databaseUrlKey", "webhook.serviceToken",
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_secrets_come_from_a_secret_only(scenario):
    assert objects(scenario, "Secret") == [], "the chart renders no Secret (the bootstrap Job generates one)"
    for obj, spec in pods(scenario):
        for c in containers(spec):
            for e in c.get("env", []):
                if e["name"] in SECRET_VALUED_ENV:
                    assert "valueFrom" in e, f"{obj['metadata']['name']}: {e['name']} must come from a Secret"
                for pattern in SECRET_LOOKING[:3]:
                    assert not pattern.search(str(e.get("value", ""))), e["name"]


def test_database_url_and_jwt_settings_come_from_the_named_secret():
    api = one("defaults", "Deployment", "-api")
    (c,) = pod_spec(api)["containers"]
    env = env_of(c)
    assert database_url_source(pod_spec(api)) == {"name": "gpu-booking-secrets", "key": "database-url"}
    assert "DATABASE_URL" not in env, "the URL is in no environment (--database-url-file)"
    assert env["GPU_BOOKING_JWT_SECRET_FILE"]["value"].startswith("/var/run/secrets/")
    jwt = [v for v in pod_spec(api)["volumes"] if v["name"] == "jwt"][0]
    assert jwt["secret"]["secretName"] == "gpu-booking-secrets"
    assert jwt["secret"]["items"] == [{"key": "jwt-secret", "path": "jwt-secret"}]
    # OIDC only: no HS256 secret mounted, the JWKS URL set.
    api = one("minimal", "Deployment", "-api")
    env = env_of(pod_spec(api)["containers"][0])
    assert database_url_source(pod_spec(api)) == {"name": "gpu-booking", "key": "database-url"}
    assert "GPU_BOOKING_JWT_SECRET_FILE" not in env
    assert env["GPU_BOOKING_JWKS_URL"]["value"].endswith("/certs")
    assert "GPU_BOOKING_OIDC_CLIENT_ID" not in env
    # The booking page's sign-in against the same issuer.
    env = env_of(pod_spec(one("everything", "Deployment", "-api"))["containers"][0])
    assert env["GPU_BOOKING_OIDC_ISSUER"]["value"] == "https://sso.example.org/realms/lab"
    assert env["GPU_BOOKING_OIDC_CLIENT_ID"]["value"] == "gpu-booking-page"
    assert env["GPU_BOOKING_OIDC_TOKEN"]["value"] == "access_token"


# --- components ----------------------------------------------------------------------


def test_replicas_disruption_budgets_and_leader_election():
    assert one("defaults", "Deployment", "-api")["spec"]["replicas"] == 2
    assert one("defaults", "Deployment", "-webhook")["spec"]["replicas"] == 2
    assert one("defaults", "Deployment", "-controller")["spec"]["replicas"] == 2
    pdbs = {o["metadata"]["name"] for o in objects("defaults", "PodDisruptionBudget")}
    assert pdbs == {"gpu-booking-api", "gpu-booking-webhook", "gpu-booking-controller"}
    lease = one("defaults", "Role", "-controller")
    # Leases for the election; ConfigMaps for the intents of two-step actions, in the
    # release namespace only.
    grants = {(g, res) for r in lease["rules"] for g in r["apiGroups"] for res in r["resources"]}
    assert grants == {("coordination.k8s.io", "leases"), ("", "configmaps")}
    assert not any("configmaps" in r["resources"]
                   for r in one("defaults", "ClusterRole", "-controller")["rules"])
    assert objects("minimal", "PodDisruptionBudget") == []
    assert not [o for o in objects("minimal", "Deployment") if o["metadata"]["name"].endswith("-controller")]


def test_every_component_is_configured_through_its_environment():
    webhook = pod_spec(one("everything", "Deployment", "-webhook"))["containers"][0]
    assert webhook["args"] == ["webhook"]
    env = env_of(webhook)
    assert env["GPU_BOOKING_BOOKING_URL"]["value"] == "http://gpu-booking-api.gpu-booking.svc:8080"
    assert env["GPU_BOOKING_WEBHOOK_MODEL_RESOURCE"]["value"] == "a100=nvidia.com/a100,mig-1g.5gb=nvidia.com/mig-1g.5gb"
    assert env["GPU_BOOKING_WEBHOOK_MODEL_GPUMEM"]["value"] == "a100=40960,a6000=49152"
    assert env["GPU_BOOKING_WEBHOOK_DEFAULT_GPUMEM_MIB"]["value"] == "8192"
    assert env["GPU_BOOKING_LOG_FORMAT"]["value"] == "json"
    for obj, spec in pods("everything"):
        for c in containers(spec):
            assert not any(a.startswith("--") for a in c.get("args", [])), "options go through env"


def test_the_admin_port_has_one_name_in_every_component():
    """--admin-listen reads GPU_BOOKING_ADMIN_LISTEN in the webhook, the controller and
    the agent alike (each runs in its own container, so one name cannot collide); the
    component-specific names are gone."""
    seen = set()
    for obj, spec in pods("everything"):
        for c in containers(spec):
            env = env_of(c)
            old = [k for k in env if k.endswith("_ADMIN_LISTEN") and k != "GPU_BOOKING_ADMIN_LISTEN"]
            assert not old, f"{obj['metadata']['name']} sets {old}"
            if "GPU_BOOKING_ADMIN_LISTEN" in env:
                assert env["GPU_BOOKING_ADMIN_LISTEN"]["value"] == "0.0.0.0:9090"
                seen.add(c["args"][0])
    assert seen == {"webhook", "controller", "agent"}


def test_controller_hub_restart_reads_its_token_from_a_secret_file():
    spec = pod_spec(one("controller-hub-restart", "Deployment", "-controller"))
    (c,) = spec["containers"]
    env = env_of(c)
    assert env["GPU_BOOKING_CONTROLLER_ON_EXPIRY"]["value"] == "hub-restart"
    assert env["GPU_BOOKING_CONTROLLER_HUB_API_URL"]["value"] == "http://hub.jhub.svc:8081/hub/api"
    path = env["GPU_BOOKING_CONTROLLER_HUB_TOKEN_FILE"]["value"]
    assert "GPU_BOOKING_CONTROLLER_HUB_TOKEN" not in env, "never in the environment"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "hub-token"]
    assert path.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "hub-token"]
    assert volume["secret"]["secretName"] == "gpu-booking-hub-token"
    assert volume["secret"]["items"] == [{"key": "token", "path": path.rsplit("/", 1)[1]}]
    defaults = env_of(pod_spec(one("defaults", "Deployment", "-controller"))["containers"][0])
    assert "GPU_BOOKING_CONTROLLER_HUB_API_URL" not in defaults


def test_hub_restart_without_the_hub_is_refused():
    for missing in (["controller.hub.tokenSecretName=s"], ["controller.hub.apiUrl=http://hub:8081/hub/api"]):
        out = render.template(set_values=["controller.onExpiry=hub-restart"] + missing, check=False)
        assert out.returncode != 0 and "controller.hub" in out.stderr


def test_priority_classes():
    high = one("defaults", "PriorityClass", "-high")
    low = one("defaults", "PriorityClass", "-low")
    assert high["value"] > 0 > low["value"]
    # One preemption mechanism: the controller's (least recently used lent pod);
    # kube-scheduler never preempts for our pods, it only queues booked pods first.
    assert high["preemptionPolicy"] == "Never"
    assert low["preemptionPolicy"] == "Never"
    env = env_of(pod_spec(one("defaults", "Deployment", "-webhook"))["containers"][0])
    assert env["GPU_BOOKING_HIGH_PRIORITY_CLASS"]["value"] == high["metadata"]["name"]
    assert env["GPU_BOOKING_LOW_PRIORITY_CLASS"]["value"] == low["metadata"]["name"]
    env = env_of(pod_spec(one("defaults", "Deployment", "-controller"))["containers"][0])
    assert env["GPU_BOOKING_CONTROLLER_PREEMPTION_ATTEMPTS"]["value"] == "3"
    assert env["GPU_BOOKING_CONTROLLER_PREEMPTION_RETRY"]["value"] == "60s"
    assert env["GPU_BOOKING_CONTROLLER_PREEMPTION_VRAM_CUSHION"]["value"] == "256"
    assert objects("minimal", "PriorityClass") == []


def test_the_agent_believes_a_pod_booked_by_the_webhooks_class():
    """The agent spares booked pods' idle kernels: booked by the same classes as the
    webhook's and the controller's (one option group, the same variables)."""
    webhook = env_of(pod_spec(one("everything", "Deployment", "-webhook"))["containers"][0])
    agent = env_of(pod_spec(one("everything", "DaemonSet", "-agent"))["containers"][0])
    for name in ("GPU_BOOKING_HIGH_PRIORITY_CLASS", "GPU_BOOKING_LOW_PRIORITY_CLASS"):
        assert agent[name] == webhook[name], name
    assert agent["GPU_BOOKING_AGENT_RECLAIM_BOOKED_PODS"]["value"] == "false"
    assert agent["GPU_BOOKING_AGENT_RECLAIM_WARNING"]["value"] == "5m"
    assert agent["GPU_BOOKING_AGENT_RECLAIM_SIGNALS"]["value"] == "INT,TERM,KILL"
    out = render.template(set_values=["agent.enabled=true", "agent.reclaimSignals=KILL\\,TERM"], check=False)
    assert out.returncode != 0 and "reclaimSignals" in out.stderr, "the schema wants KILL last"


def test_the_migration_job_runs_before_install_and_upgrade():
    job = one("defaults", "Job", "-migrate")
    # The embedded database appears with the release, after the pre-install hooks: on
    # install the API migrates before it serves, and the Job runs before upgrades.
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    external = render.render(set_values=["database.mode=external", "secrets.existingSecret=lab-db"])
    (job,) = [o for o in external if o["kind"] == "Job" and o["metadata"]["name"].endswith("-migrate")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (c,) = pod_spec(job)["containers"]
    assert c["args"] == ["migrate"]
    assert database_url_source(pod_spec(job)) == {"name": "lab-db", "key": "database-url"}
    assert not [o for o in objects("minimal", "Job") if o["metadata"]["name"].endswith("-migrate")]


# --- the webhook configuration -----------------------------------------------------


def mwc(scenario):
    return one(scenario, "MutatingWebhookConfiguration")["webhooks"][0]


def mwc_of(rendered):
    """The webhook of the configuration in `rendered` (objects render.render gives)."""
    (configuration,) = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
    return configuration["webhooks"][0]


def test_webhook_configuration_defaults():
    w = mwc("defaults")
    assert w["failurePolicy"] == "Ignore"
    assert w["timeoutSeconds"] == 5
    assert w["sideEffects"] == "NoneOnDryRun"
    assert w["admissionReviewVersions"] == ["v1"]
    assert w["rules"] == [{
        "operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
        "resources": ["pods"], "scope": "Namespaced",
    }]
    exprs = w["namespaceSelector"]["matchExpressions"]
    names = [e for e in exprs if e["key"] == "kubernetes.io/metadata.name"][0]
    assert names["operator"] == "NotIn"
    assert set(names["values"]) == {"kube-system", "gpu-operator", render.NAMESPACE}
    opt_out = [e for e in exprs if e["key"] == "gpu-booking.io/webhook"][0]
    assert opt_out == {"key": "gpu-booking.io/webhook", "operator": "NotIn", "values": ["disabled"]}
    assert w["clientConfig"]["service"]["name"] == "gpu-booking-webhook"
    assert w["clientConfig"]["service"]["path"] == "/mutate"
    assert "caBundle" not in w["clientConfig"], "self-signed: the certs job patches it in"
    assert mwc("everything")["failurePolicy"] == "Fail"


def cel_program(expression):
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    return lambda pod: bool(env.program(env.compile(expression)).evaluate({"object": celpy.json_to_cel(pod)}))


def fixture_pods():
    kubespawner = Path(__file__).resolve().parents[1] / "fixtures" / "kubespawner"
    files = sorted(FIXTURES.glob("*.json")) + sorted(kubespawner.glob("*.json"))
    for f in files:
        doc = json.loads(f.read_text())
        pod = doc.get("request", {}).get("object", doc)
        if "spec" in pod:
            yield f.name, pod


def with_resources(pod, where, field, resources):
    pod = copy.deepcopy(pod)
    for c in pod["spec"]["containers"]:
        c.pop("resources", None)
    if where == "init":
        pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {field: resources}}]
    else:
        pod["spec"]["containers"][0]["resources"] = {field: resources}
    return pod


def test_match_conditions_send_only_gpu_pods():
    match = cel_program(mwc("everything")["matchConditions"][0]["expression"])
    pods_seen = list(fixture_pods())
    assert len(pods_seen) >= 3
    assert len([n for n, _ in pods_seen if n.startswith(("6.2.0-", "7.1.0-"))]) == 12, "KubeSpawner fixtures"
    for name, pod in pods_seen:
        wants_gpu = not ("nogpu" in name or name.startswith("no-gpu"))
        assert match(pod) == wants_gpu, name
    base = [p for n, p in pods_seen if n == "no-gpu-pod.json"][0]
    for where in ("container", "init"):
        for field in ("requests", "limits"):
            assert match(with_resources(base, where, field, {"nvidia.com/gpu": "1"})), (where, field)
            assert match(with_resources(base, where, field, {"nvidia.com/mig-1g.5gb": "1"})), (where, field)
            assert not match(with_resources(base, where, field, {"cpu": "1"})), (where, field)
    bare = copy.deepcopy(base)
    for c in bare["spec"]["containers"]:
        c.pop("resources", None)
    assert not match(bare), "a pod without any resources map must not be an error"
    # The default configuration knows only nvidia.com/gpu.
    default = cel_program(mwc("defaults")["matchConditions"][0]["expression"])
    assert not default(with_resources(base, "container", "limits", {"nvidia.com/a100": "1"}))
    # A pod that sets the NVIDIA runtime's variable without a GPU reaches the webhook
    # too (visibleDevicesWithoutGpu: strip, the default), unless it hands no card.
    def with_visible(pod, value, where="container"):
        pod = copy.deepcopy(pod)
        entry = {"name": "NVIDIA_VISIBLE_DEVICES", "value": value}
        if where == "init":
            pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "env": [entry]}]
        else:
            pod["spec"]["containers"][0].setdefault("env", []).append(entry)
        return pod
    for value in ("all", "0", "GPU-0b9a"):
        assert default(with_visible(bare, value)), value
        assert default(with_visible(bare, value, "init")), value
    for value in ("none", "void", ""):
        assert not default(with_visible(bare, value)), value
    allowed = cel_program(mwc_of(render.render(set_values=["webhook.visibleDevicesWithoutGpu=allow"]))["matchConditions"][0]["expression"])
    assert not allowed(with_visible(bare, "all"))


# --- TLS modes ---------------------------------------------------------------------


def certs_jobs(scenario):
    return [o for o in objects(scenario, "Job") if component(o) == "certs"]


@pytest.mark.parametrize("scenario,mode", [("defaults", "self-signed"), ("tls-csr", "csr"), ("tls-csr-ca-bundle", "csr")])
def test_certs_jobs_run_before_and_after_install_and_daily(scenario, mode):
    jobs = {o["metadata"]["annotations"]["helm.sh/hook"]: o for o in certs_jobs(scenario)}
    assert set(jobs) == {"pre-install,pre-upgrade", "post-install,post-upgrade"}
    cron = one(scenario, "CronJob", "-certs")
    for hook, obj in list(jobs.items()) + [("cron", cron)]:
        (c,) = pod_spec(obj)["containers"]
        assert c["args"] == ["certs", mode]
        env = env_of(c)
        assert env["GPU_BOOKING_CERTS_SECRET"]["value"] == "gpu-booking-webhook-tls"
        assert env["GPU_BOOKING_CERTS_WEBHOOK_CONFIG"]["value"] == "gpu-booking-webhook"
        assert env["GPU_BOOKING_CERTS_SERVICE"]["value"] == "gpu-booking-webhook"
        skip = "GPU_BOOKING_CERTS_SKIP_MISSING_WEBHOOK_CONFIG" in env
        assert skip == hook.startswith("pre-"), "only the pre-install run may find no webhook configuration"
    hook_sa = pod_spec(jobs["pre-install,pre-upgrade"])["serviceAccountName"]
    sa = [o for o in objects(scenario, "ServiceAccount") if o["metadata"]["name"] == hook_sa][0]
    assert "pre-install" in sa["metadata"]["annotations"]["helm.sh/hook"], "the hook's RBAC exists before the hook"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert pod_spec(cron)["serviceAccountName"] == "gpu-booking-certs"
    webhook = pod_spec(one(scenario, "Deployment", "-webhook"))
    tls = [v for v in webhook["volumes"] if v["name"] == "tls"][0]
    assert tls["secret"]["secretName"] == "gpu-booking-webhook-tls"
    assert [i["key"] for i in tls["secret"]["items"]] == ["tls.crt", "tls.key"]


def test_certs_rbac_is_limited_to_its_own_objects():
    roles = [o for o in objects("defaults", "Role") if component(o) == "certs"]
    assert len(roles) == 2
    for role in roles:
        named = [r for r in role["rules"] if "resourceNames" in r]
        unnamed = [r for r in role["rules"] if "resourceNames" not in r]
        assert all(r["verbs"] == ["create"] for r in unnamed), "only create cannot be limited by name"
        assert set(named[0]["resourceNames"]) == {"gpu-booking-webhook-tls", "gpu-booking-webhook-tls-ca"}
    for role in [o for o in objects("defaults", "ClusterRole") if component(o) == "certs"]:
        (rule,) = role["rules"]
        assert rule["resourceNames"] == ["gpu-booking-webhook"]
        assert rule["verbs"] == ["get", "patch"]
    csr_rules = [r for o in objects("tls-csr", "ClusterRole") if component(o) == "certs" for r in o["rules"]]
    approve = [r for r in csr_rules if r["resources"] == ["signers"]]
    assert approve and all(r["resourceNames"] == ["example.com/webhook-serving"] for r in approve)
    no_approve = [r for o in objects("tls-csr-ca-bundle", "ClusterRole") if component(o) == "certs" for r in o["rules"]]
    assert not [r for r in no_approve if r["resources"] in (["signers"], ["certificatesigningrequests/approval"])]


def test_csr_mode_ca_bundle():
    pem = yaml.safe_load((render.VALUES / "tls-csr-ca-bundle.yaml").read_text())["tls"]["csr"]["caBundle"]
    w = mwc("tls-csr-ca-bundle")
    assert base64.b64decode(w["clientConfig"]["caBundle"]).decode() == pem
    env = env_of(pod_spec(one("tls-csr-ca-bundle", "CronJob", "-certs"))["containers"][0])
    assert env["GPU_BOOKING_CERTS_CA_BUNDLE"]["value"] == pem
    assert env["GPU_BOOKING_CERTS_APPROVE"]["value"] == "false"
    env = env_of(pod_spec(one("tls-csr", "CronJob", "-certs"))["containers"][0])
    assert env["GPU_BOOKING_CERTS_CA_BUNDLE_FILE"]["value"].endswith("serviceaccount/ca.crt")
    assert env["GPU_BOOKING_CERTS_SIGNER_NAME"]["value"] == "example.com/webhook-serving"


@pytest.mark.parametrize("scenario", ["tls-cert-manager", "tls-cert-manager-issuer"])
def test_cert_manager_mode(scenario):
    assert certs_jobs(scenario) == [] and [o for o in objects(scenario, "CronJob") if component(o) == "certs"] == []
    config = one(scenario, "MutatingWebhookConfiguration")
    cert = one(scenario, "Certificate", "-webhook")
    ns = render.NAMESPACE
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{ns}/{cert['metadata']['name']}"
    assert cert["spec"]["secretName"] == "gpu-booking-webhook-tls"
    assert f"gpu-booking-webhook.{ns}.svc" in cert["spec"]["dnsNames"]
    assert "server auth" in cert["spec"]["usages"]
    issuers = objects(scenario, "Issuer")
    if scenario == "tls-cert-manager":
        assert {i["metadata"]["name"] for i in issuers} == {"gpu-booking-selfsigned", "gpu-booking-ca"}
        assert cert["spec"]["issuerRef"] == {"name": "gpu-booking-ca", "kind": "Issuer", "group": "cert-manager.io"}
        ca = one(scenario, "Certificate", "-webhook-ca")
        assert ca["spec"]["isCA"] is True
    else:
        assert issuers == []
        assert cert["spec"]["issuerRef"] == {"name": "lab-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


# --- RBAC, monitoring, network -----------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_has_no_wildcards_and_no_cluster_wide_secrets(scenario):
    for role in objects(scenario, "Role") + objects(scenario, "ClusterRole"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: {field}"
            if role["kind"] == "ClusterRole":
                assert "secrets" not in rule["resources"], role["metadata"]["name"]
                assert "escalate" not in rule["verbs"] and "bind" not in rule["verbs"]


def test_monitoring():
    monitors = objects("everything", "ServiceMonitor")
    assert {component(m) for m in monitors} == {"api", "webhook", "controller", "agent"}
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "prometheus"
        (ep,) = m["spec"]["endpoints"]
        assert ep["path"] == "/metrics"
    rule = one("everything", "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    for alert in ("GpuBookingApiDown", "GpuBookingWebhookErrors", "GpuBookingControllerNotLeading", "GpuBookingExpiryLag", "GpuBookingPreemptionGaveUp"):
        assert alert in alerts
        assert alerts[alert]["labels"]["severity"] in ("warning", "critical")
    assert objects("defaults", "ServiceMonitor") == [] and objects("defaults", "PrometheusRule") == []


def test_inventory_alerts_use_metrics_the_controller_exports():
    rule = one("everything", "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    inventory = ("GpuBookingPodPendingOnGpumem", "GpuBookingGpuTelemetryMissing",
                 "GpuBookingModelUnitsMismatch", "GpuBookingUndeclaredModelCards",
                 "GpuBookingNodeWithSeveralModels")
    sources = {
        "controller": (render.ROOT / "controller/src/metrics.rs").read_text(),
        "agent": (render.ROOT / "agent/src/metrics.rs").read_text(),
    }
    for name in inventory:
        alert = alerts[name]
        assert alert["labels"]["severity"] == "warning"
        for metric in re.findall(r"gpu_booking_(controller|agent)_([a-z_]+)", alert["expr"]):
            assert f'"{metric[1]}"' in sources[metric[0]], f"{name}: {metric}"
    assert alerts["GpuBookingModelUnitsMismatch"]["for"] == "30m"
    assert "nvml_up" in alerts["GpuBookingGpuTelemetryMissing"]["expr"]


def test_controller_may_patch_node_status_only_when_it_advertises_gpumem():
    def node_status_rules(roles):
        return [r for o in roles if o["kind"] == "ClusterRole" and component(o) == "controller"
                for r in o["rules"] if "nodes/status" in r["resources"]]
    (rule,) = node_status_rules(objects("defaults", "ClusterRole"))
    assert rule["verbs"] == ["patch"]
    off = render.render(set_values=["controller.advertiseGpumem=false"])
    assert node_status_rules(off) == []
    (controller,) = [o for o in off if o["kind"] == "Deployment" and component(o) == "controller"]
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU_BOOKING_CONTROLLER_ADVERTISE_GPUMEM"] == "false"
    assert env["GPU_BOOKING_CONTROLLER_GPUMEM_RESERVE_MIB"] == "512"


def test_identity_is_trusted_from_the_hub_only():
    webhook = env_of(pod_spec(one("defaults", "Deployment", "-webhook"))["containers"][0])
    # zero-to-jupyterhub's hub ServiceAccount in its usual namespace.
    assert webhook["GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER"]["value"] == "system:serviceaccount:jhub:hub"
    assert webhook["GPU_BOOKING_WEBHOOK_SPAWNER_NAMESPACE"]["value"] == "jhub"
    assert "GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER_GROUP" not in webhook
    assert webhook["GPU_BOOKING_WEBHOOK_UNIDENTIFIED_GPU_PODS"]["value"] == "lent"
    assert webhook["GPU_BOOKING_CASE_SENSITIVE_NAMES"]["value"] == "false"
    # The controller's lent copies are its own: its ServiceAccount, as the chart names it.
    controller = pod_spec(one("defaults", "Deployment", "-controller"))
    assert webhook["GPU_BOOKING_WEBHOOK_TRUSTED_CONTROLLER"]["value"] == (
        f"system:serviceaccount:gpu-booking:{controller['serviceAccountName']}"
    )
    api = env_of(pod_spec(one("defaults", "Deployment", "-api"))["containers"][0])
    assert api["GPU_BOOKING_CASE_SENSITIVE_NAMES"]["value"] == "false"
    webhook = env_of(pod_spec(one("everything", "Deployment", "-webhook"))["containers"][0])
    assert webhook["GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER"]["value"] == "system:serviceaccount:jupyterhub:hub"
    assert webhook["GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER_GROUP"]["value"] == "jupyterhub-spawners"
    assert webhook["GPU_BOOKING_WEBHOOK_SPAWNER_NAMESPACE"]["value"] == "jupyterhub,jupyterhub-users"
    assert webhook["GPU_BOOKING_WEBHOOK_UNIDENTIFIED_GPU_PODS"]["value"] == "strip"
    assert webhook["GPU_BOOKING_WEBHOOK_AUDIT_BURST"]["value"] == "50"
    assert webhook["GPU_BOOKING_WEBHOOK_AUDIT_PER_SECOND"]["value"] == "0.5"
    assert webhook["GPU_BOOKING_CASE_SENSITIVE_NAMES"]["value"] == "true"


def test_the_webhook_lends_only_where_the_controller_can_take_a_card_back():
    """--lend-namespaces: the namespace the controller serves and those an admin made
    preemptible (it deletes there), or every namespace when it serves every one; a GPU
    pod without a user elsewhere is another workload, not lent."""
    def lend_namespaces(set_values):
        (webhook,) = [o for o in render.render(set_values=set_values)
                      if o["kind"] == "Deployment" and component(o) == "webhook"]
        return env_of(pod_spec(webhook)["containers"][0])["GPU_BOOKING_WEBHOOK_LEND_NAMESPACES"]["value"]
    assert lend_namespaces([]) == "jhub"
    assert lend_namespaces(["controller.namespace=jhub",
                            "controller.preemption.otherWorkloadNamespaces={research}"]) == "jhub,research"
    # Named twice: once.
    assert lend_namespaces(["controller.preemption.otherWorkloadNamespaces={research,jhub}"]) == "jhub,research"
    assert lend_namespaces(["controller.namespace=*"]) == "*"
    assert lend_namespaces(["controller.namespace=*",
                            "controller.preemption.otherWorkloadNamespaces={research}"]) == "*"
    # The controller's own options say the same.
    (controller,) = [o for o in render.render(set_values=["controller.preemption.otherWorkloadNamespaces={research}"])
                     if o["kind"] == "Deployment" and component(o) == "controller"]
    env = env_of(pod_spec(controller)["containers"][0])
    assert (env["GPU_BOOKING_CONTROLLER_NAMESPACE"]["value"],
            env["GPU_BOOKING_CONTROLLER_PREEMPTIBLE_NAMESPACES"]["value"]) == ("jhub", "research")


def test_the_webhook_limits_each_source_and_can_require_the_api_servers_certificate():
    webhook = pod_spec(one("defaults", "Deployment", "-webhook"))
    env = env_of(webhook["containers"][0])
    assert env["GPU_BOOKING_WEBHOOK_SOURCE_REVIEW_BURST"]["value"] == "1000"
    assert env["GPU_BOOKING_WEBHOOK_SOURCE_REVIEWS_PER_SECOND"]["value"] == "200"
    # No CA given: any client, and nothing to mount.
    assert "GPU_BOOKING_WEBHOOK_CLIENT_CA" not in env
    assert not [v for v in webhook["volumes"] if v["name"] == "client-ca"]
    assert not [o for o in objects("defaults", "ConfigMap") if o["metadata"]["name"].endswith("-client-ca")]

    webhook = pod_spec(one("everything", "Deployment", "-webhook"))
    container = webhook["containers"][0]
    env = env_of(container)
    assert env["GPU_BOOKING_WEBHOOK_SOURCE_REVIEW_BURST"]["value"] == "100"
    assert env["GPU_BOOKING_WEBHOOK_SOURCE_REVIEWS_PER_SECOND"]["value"] == "20"
    assert env["GPU_BOOKING_WEBHOOK_CLIENT_NAME"]["value"] == "kube-apiserver-webhook-client"
    ca_path = env["GPU_BOOKING_WEBHOOK_CLIENT_CA"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    assert ca_path == mount["mountPath"] + "/ca.crt" and mount["readOnly"]
    (volume,) = [v for v in webhook["volumes"] if v["name"] == "client-ca"]
    config_map = one("everything", "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"]["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")


# --- values, schema, documentation ---------------------------------------------------


@pytest.mark.parametrize("bad", [
    "webhook.failurePolicy=Sometimes",
    "webhook.timeoutSeconds=31",
    "tls.mode=manual",
    "secrets.existingSecret=Not_A_Name",
    "database.mode=sqlite",
    "database.embedded.user=x'); drop table bookings; --",
    "database.embedded.persistence.size=lots",
    "logFormat=xml",
    "webhook.onBookingError=deny",
    "policy.cooldown=two weeks",
    "webhook.gpuResources[0]=nvidia.com/gpu' || true || '",
    "webhook.unidentifiedGpuPods=budget",
    "webhook.trustedSpawners[0]=a\\,b",
    "webhook.spawnerNamespaces[0]=Not_A_Namespace",
    "webhook.networkPolicy.apiServerCIDRs[0]=kubernetes",
    "webhook.sourceReviewsPerSecond=-1",
    "webhook.clientAuth.caBundle=not a certificate",
    "webhook.clientAuth.names[0]=a\\,b",
])
def test_the_schema_refuses_bad_values(bad):
    result = render.template(set_values=[bad], check=False)
    assert result.returncode != 0, bad
    assert "schema" in result.stderr or "required" in result.stderr, result.stderr


def test_csr_mode_needs_a_signer():
    result = render.template(set_values=["tls.mode=csr"], check=False)
    assert result.returncode != 0
    assert "signerName" in result.stderr


def test_every_value_is_documented_and_the_readme_table_is_current():
    text = (render.CHART / "values.yaml").read_text()
    documented, missing = values_table.rows(text)
    assert missing == []
    assert len(documented) > 80
    readme = (render.CHART / "README.md").read_text()
    assert values_table.readme_with_table(readme, text) == readme, "run python tests/chart/values_table.py --write"


# --- the rendered options are the binary's options ------------------------------------

FIELD_VALUES = {"metadata.namespace": render.NAMESPACE, "metadata.name": "pod-0", "spec.nodeName": "node-0"}


def resolved_env(container):
    """The container's environment as the kubelet would set it, with stand-ins for
    Secret values and files."""
    env = {"PATH": "/usr/bin:/bin"}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = FIELD_VALUES[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            # Nothing listens on port 9: a connection fails at once.
            env[e["name"]] = "postgres://gpu_booking@127.0.0.1:9/gpu_booking"
    for key in list(env):
        if key.endswith("ADMIN_LISTEN") or key in ("GPU_BOOKING_LISTEN", "GPU_BOOKING_WEBHOOK_LISTEN"):
            env[key] = "127.0.0.1:0"
    env["GPU_BOOKING_AGENT_ONCE"] = "true"
    return env


@pytest.mark.parametrize("scenario", ["defaults", "everything", "tls-csr-ca-bundle", "minimal"])
def test_the_binary_accepts_every_rendered_option(scenario):
    """Each container's args and env parsed by the real `gpu-booking` (GPU_BOOKING_BIN):
    clap exits with 2 on an unknown value or a missing option; anything else (a
    connection error, still running after 3 s) means the options were accepted."""
    import os
    import subprocess

    binary = os.environ.get("GPU_BOOKING_BIN")
    if not binary:
        pytest.skip("GPU_BOOKING_BIN not set (scripts/test.sh sets it)")
    checked = set()
    for obj, spec in pods(scenario):
        for c in containers(spec):
            if "args" not in c or "command" in c:
                continue  # not our binary (the embedded Postgres, its backup)
            try:
                result = subprocess.run([binary, *c["args"]], env=resolved_env(c), capture_output=True, text=True, timeout=3)
            except subprocess.TimeoutExpired:
                checked.add(c["args"][0])
                continue
            assert result.returncode != 2, f"{obj['metadata']['name']}: {result.stderr}"
            checked.add(c["args"][0])
    assert {"api", "webhook", "certs"} <= checked or scenario == "minimal"


def test_notice_secrets_are_mounted_files():
    """The SMTP password and the webhook URL reach the API as files from the Secret,
    never as environment values; without them nothing is mounted."""
    for scenario, expect in (("everything", True), ("defaults", False)):
        api = [c for o, s in pods(scenario) for c in containers(s) if c.get("args", [None])[0] == "api"]
        assert api, scenario
        env = env_of(api[0])
        mounts = {m["name"]: m for m in api[0].get("volumeMounts", [])}
        assert ("notices" in mounts) is expect, scenario
        assert env["GPU_BOOKING_NOTICE_LEADS"]["value"] == ("48h,2h" if expect else "24h,1h")
        if expect:
            assert env["GPU_BOOKING_SMTP_PASSWORD_FILE"]["value"].startswith(mounts["notices"]["mountPath"])
            assert env["GPU_BOOKING_NOTICE_WEBHOOK_URL_FILE"]["value"].startswith(mounts["notices"]["mountPath"])
            assert env["GPU_BOOKING_NOTICE_WEBHOOK_FORMAT"]["value"] == "slack"
            assert env["GPU_BOOKING_SMTP_PORT"]["value"] == "465"
        else:
            assert not any(k.startswith("GPU_BOOKING_SMTP") or "WEBHOOK_URL" in k for k in env)
