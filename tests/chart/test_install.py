"""`helm install` and nothing else: with default values every Secret,
ConfigMap and PVC a workload reads is rendered by the chart or made by one of its
Jobs; the bootstrap Job; the embedded Postgres; CloudNativePG and external databases.

Run by scripts/chart-test.sh (HELM names the helm binary)."""

from pathlib import Path

import pytest
import yaml

import render
from test_chart import RENDERED, SCENARIOS, containers, database_url_source, env_of, objects, one, pod_spec, pods

CNPG = ["--api-versions", "postgresql.cnpg.io/v1/Cluster"]
# Secrets Kubernetes itself provides to every namespace.
BUILTIN_CONFIGMAPS = {"kube-root-ca.crt"}


def produced(rendered):
    """name -> set of keys (None: any key) of every Secret and ConfigMap the release
    renders or makes with its Jobs, and the PVC names it claims."""
    secrets, configmaps, pvcs = {}, {n: None for n in BUILTIN_CONFIGMAPS}, set()
    for o in rendered:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Secret":
            secrets[name] = set(o.get("data", {})) | set(o.get("stringData", {}))
        elif kind == "ConfigMap":
            configmaps[name] = set(o.get("data", {}))
        elif kind == "PersistentVolumeClaim":
            pvcs.add(name)
        elif kind == "Certificate":  # cert-manager writes it
            secrets[o["spec"]["secretName"]] = {"tls.crt", "tls.key", "ca.crt"}
        elif kind == "Cluster":  # CloudNativePG's application Secret
            secrets[f"{name}-app"] = {"uri", "username", "password", "host", "port", "dbname"}
    for obj, spec in [(o, pod_spec(o)) for o in rendered if o["kind"] in ("Job", "CronJob", "StatefulSet", "Deployment")]:
        if obj["kind"] == "StatefulSet":
            for t in obj["spec"].get("volumeClaimTemplates", []):
                pvcs.add(t["metadata"]["name"])
        for c in containers(spec):
            env = {k: e.get("value") for k, e in env_of(c).items()}
            if c.get("args", [None])[0] == "bootstrap":
                keys = {env["GPU_BOOKING_BOOTSTRAP_JWT_SECRET_KEY"], env["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_KEY"]}
                if "GPU_BOOKING_BOOTSTRAP_DATABASE_HOST" in env:
                    keys |= {env["GPU_BOOKING_BOOTSTRAP_PASSWORD_KEY"], env["GPU_BOOKING_BOOTSTRAP_DATABASE_URL_KEY"]}
                secrets.setdefault(env["GPU_BOOKING_BOOTSTRAP_SECRET"], set()).update(keys)
            if c.get("args", [None])[0] == "certs":
                secrets[env["GPU_BOOKING_CERTS_SECRET"]] = {"tls.crt", "tls.key", "ca.crt"}
    return secrets, configmaps, pvcs


def references(spec):
    """(kind, name, key or None) of everything a pod reads."""
    for c in containers(spec):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "secretKeyRef" in ref:
                yield "Secret", ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]
            if "configMapKeyRef" in ref:
                yield "ConfigMap", ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"]
        for e in c.get("envFrom", []):
            if "secretRef" in e:
                yield "Secret", e["secretRef"]["name"], None
            if "configMapRef" in e:
                yield "ConfigMap", e["configMapRef"]["name"], None
    for v in spec.get("volumes", []):
        sources = [v] + v.get("projected", {}).get("sources", [])
        for s in sources:
            if "secret" in s:
                name = s["secret"].get("secretName") or s["secret"].get("name")
                for item in s["secret"].get("items") or [{"key": None}]:
                    yield "Secret", name, item["key"]
            if "configMap" in s:
                for item in s["configMap"].get("items") or [{"key": None}]:
                    yield "ConfigMap", s["configMap"]["name"], item["key"]
        if "persistentVolumeClaim" in v:
            yield "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], None


def unmet(rendered):
    secrets, configmaps, pvcs = produced(rendered)
    missing = []
    for obj in rendered:
        if obj["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"):
            continue
        for kind, name, key in references(pod_spec(obj)):
            have = {"Secret": secrets, "ConfigMap": configmaps}.get(kind)
            if kind == "PersistentVolumeClaim":
                ok = name in pvcs
            else:
                ok = name in have and (key is None or have[name] is None or key in have[name])
            if not ok:
                missing.append(f"{obj['metadata']['name']} reads {kind} {name} key {key}")
    return missing


def test_the_default_install_is_complete():
    """No value set: everything a workload reads is the release's own."""
    assert unmet(RENDERED["defaults"]) == []
    # ... and the check would see a missing one.
    broken = [o for o in RENDERED["defaults"] if not (o["kind"] == "Job" and o["metadata"]["name"].endswith("-bootstrap"))]
    assert any("gpu-booking-secrets" in m for m in unmet(broken))


def operator_inputs(scenario):
    """What a scenario's values name as the operator's own, which no chart can make:
    the JupyterHub service tokens' Secrets (the controller's, and the page's OAuth
    client secret for "Sign in with JupyterHub", made by the hub's side), and the SMTP
    password and notice webhook URL, which the operator adds to the release's Secret
    (the bootstrap Job keeps keys it did not write)."""
    values = {}
    for path in render.scenarios()[scenario]:
        values.update(yaml.safe_load(Path(path).read_text()) or {})
    hub = ((values or {}).get("controller") or {}).get("hub") or {}
    hub_login = ((values or {}).get("auth") or {}).get("hubLogin") or {}
    notices = (values or {}).get("notices") or {}
    secrets = {hub["tokenSecretName"]} if hub.get("tokenSecretName") else set()
    if hub_login.get("secretName"):
        secrets.add(hub_login["secretName"])
    if notices.get("secretName"):
        secrets.add(notices["secretName"])
    keys = {k for k in [(notices.get("smtp") or {}).get("passwordKey"), (notices.get("webhook") or {}).get("urlKey")] if k}
    return secrets, keys


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "minimal"])
def test_every_scenario_without_an_existing_secret_is_complete(scenario):
    secrets, keys = operator_inputs(scenario)
    # The references to those inputs are the only ones allowed to be unmet.
    allowed = [f"reads Secret {name} key" for name in secrets] + [f" key {key}" for key in keys]
    unmet_here = unmet(RENDERED[scenario])
    assert [m for m in unmet_here if not any(a in m if a.startswith("reads") else m.endswith(a) for a in allowed)] == []


def test_an_existing_secret_wins_and_nothing_is_generated():
    assert [o for o in objects("minimal", "Job") if o["metadata"]["name"].endswith("-bootstrap")] == []
    for obj, spec in pods("minimal"):
        for kind, name, key in references(spec):
            if kind == "Secret" and not name.endswith("-tls"):
                assert name == "gpu-booking", (obj["metadata"]["name"], name)


def test_the_bootstrap_job_runs_first_and_may_touch_only_its_secret():
    job = one("defaults", "Job", "-bootstrap")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    weights = {o["metadata"]["name"]: int(o["metadata"]["annotations"].get("helm.sh/hook-weight", 0))
               for o in RENDERED["defaults"] if "helm.sh/hook" in o["metadata"].get("annotations", {})}
    assert weights["gpu-booking-bootstrap"] < min(w for n, w in weights.items() if "certs" in n or "migrate" in n)
    (c,) = pod_spec(job)["containers"]
    env = {k: e.get("value") for k, e in env_of(c).items()}
    assert c["args"] == ["bootstrap"]
    assert env["GPU_BOOKING_BOOTSTRAP_SECRET"] == "gpu-booking-secrets"
    assert env["GPU_BOOKING_BOOTSTRAP_DATABASE_HOST"] == "gpu-booking-postgres.gpu-booking.svc"
    role = one("defaults", "Role", "-bootstrap")
    assert role["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpu-booking-secrets"], "verbs": ["get", "update"]},
    ]
    # A service token for OIDC-only tokens cannot be HS256: refused, not rendered broken.
    result = render.template(set_values=["secrets.jwtSecretKey="], check=False)
    assert result.returncode != 0 and "jwtSecretKey" in result.stderr


def test_the_embedded_postgres():
    sts = one("defaults", "StatefulSet", "-postgres")
    spec = pod_spec(sts)
    assert sts["spec"]["replicas"] == 1
    (c,) = spec["containers"]
    assert c["image"].startswith("docker.io/library/postgres:17")
    assert spec["securityContext"]["runAsUser"] == 999 and spec["securityContext"]["fsGroup"] == 999
    env = env_of(c)
    assert env["POSTGRES_PASSWORD_FILE"]["value"].startswith("/var/run/secrets/")
    assert "POSTGRES_PASSWORD" not in env
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"} <= mounts
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/")
    svc = one("defaults", "Service", "-postgres")
    assert svc["spec"]["ports"][0]["port"] == 5432
    assert database_url_source(pod_spec(one("defaults", "Deployment", "-api")))["name"] == "gpu-booking-secrets"


def test_cloudnativepg_needs_its_crds_and_replaces_the_embedded_database():
    refused = render.template(set_values=["database.mode=cloudnativepg"], check=False)
    assert refused.returncode != 0 and "CloudNativePG" in refused.stderr
    rendered = render.render(set_values=["database.mode=cloudnativepg"], extra=CNPG)
    (cluster,) = [o for o in rendered if o["kind"] == "Cluster"]
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["spec"]["instances"] == 3
    assert cluster["spec"]["bootstrap"]["initdb"] == {"database": "gpu_booking", "owner": "gpu_booking"}
    assert not [o for o in rendered if o["kind"] == "StatefulSet"]
    for o in rendered:
        if o["kind"] in ("Deployment", "Job") and o["metadata"]["name"].endswith(("-api", "-migrate")):
            assert database_url_source(pod_spec(o)) == {"name": "gpu-booking-db-app", "key": "uri"}
    (job,) = [o for o in rendered if o["kind"] == "Job" and o["metadata"]["name"].endswith("-bootstrap")]
    assert "GPU_BOOKING_BOOTSTRAP_DATABASE_HOST" not in env_of(pod_spec(job)["containers"][0])
    assert unmet(rendered) == []


def test_an_external_database_comes_from_a_named_secret():
    refused = render.template(set_values=["database.mode=external"], check=False)
    assert refused.returncode != 0 and "database.external.secretName" in refused.stderr
    rendered = render.render(set_values=["database.mode=external", "database.external.secretName=lab-postgres", "database.external.urlKey=url"])
    assert not [o for o in rendered if o["kind"] == "StatefulSet"]
    api = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")][0]
    assert database_url_source(pod_spec(api)) == {"name": "lab-postgres", "key": "url"}
    # The JWT key and service token are still generated.
    (job,) = [o for o in rendered if o["kind"] == "Job" and o["metadata"]["name"].endswith("-bootstrap")]
    assert "GPU_BOOKING_BOOTSTRAP_DATABASE_HOST" not in env_of(pod_spec(job)["containers"][0])


def test_with_network_policies_only_the_api_migrations_and_backups_reach_postgres():
    (policy,) = [p for p in objects("everything", "NetworkPolicy") if p["metadata"]["name"] == "gpu-booking-postgres"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "postgres", "protocol": "TCP"}]
    assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]} == {"api", "migrate", "backup"}


def test_models_declared_in_values_reach_the_api_and_roll_it_when_changed():
    import json
    api = one("everything", "Deployment", "-api")
    (c,) = pod_spec(api)["containers"]
    env = {k: e.get("value") for k, e in env_of(c).items()}
    assert env["GPU_BOOKING_MODELS_AUTHORITY"] == "api"
    cm = one("everything", "ConfigMap", "-api-models")
    models = json.loads(cm["data"]["models.json"])
    assert [m["name"] for m in models] == ["a100", "mig-1g.5gb"], "list order is matching order"
    assert models[0] == {"name": "a100", "units": 2, "patterns": ["*A100*"], "gpumemMib": 40960}
    mount = [m for m in c["volumeMounts"] if m["name"] == "models"][0]
    assert env["GPU_BOOKING_MODELS_FILE"].startswith(mount["mountPath"] + "/")
    checksum = api["spec"]["template"]["metadata"]["annotations"]["checksum/models"]
    changed = render.render(["tests/chart/values/everything.yaml"], set_values=["models.declared[0].units=3"])
    (api2,) = [o for o in changed if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")]
    assert api2["spec"]["template"]["metadata"]["annotations"]["checksum/models"] != checksum
    # None declared: no file, nothing written at start.
    assert "GPU_BOOKING_MODELS_FILE" not in env_of(pod_spec(one("defaults", "Deployment", "-api"))["containers"][0])
    assert objects("defaults", "ConfigMap") == []


@pytest.mark.parametrize("bad", [
    'models.declared=[{"name":"a100","units":1},{"name":"a100","units":2}]',
    'models.declared=[{"name":"A100","units":1}]',
    'models.declared=[{"name":"a100"}]',
    'models.declared=[{"name":"a100","units":-1}]',
    'models.declared=[{"name":"a100","units":1,"colour":"red"}]',
])
def test_bad_models_are_refused_at_render(bad):
    result = render.template(check=False, extra=["--set-json", bad])
    assert result.returncode != 0, bad


def test_components_authenticate_with_their_service_account_tokens():
    api = one("defaults", "Deployment", "-api")
    env = {k: e.get("value") for k, e in env_of(pod_spec(api)["containers"][0]).items()}
    assert env["GPU_BOOKING_SERVICE_ACCOUNT_AUDIENCE"] == "gpu-booking"
    assert env["GPU_BOOKING_SERVICE_ACCOUNT"] == (
        "gpu-booking/gpu-booking-webhook=service,gpu-booking/gpu-booking-controller=service,"
        "gpu-booking/gpu-booking-agent=service")
    review = one("defaults", "ClusterRole", "-api-tokenreview")
    assert review["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    for suffix in ("-webhook", "-controller"):
        spec = pod_spec(one("defaults", "Deployment", suffix))
        (volume,) = [v for v in spec["volumes"] if v["name"] == "service-token"]
        (source,) = volume["projected"]["sources"]
        assert source["serviceAccountToken"]["audience"] == "gpu-booking"
        assert source["serviceAccountToken"]["expirationSeconds"] == 3600
        assert spec["serviceAccountName"].endswith(suffix)
    # The agent too when on; no shared service token is generated.
    env = {k: e.get("value") for k, e in env_of(pod_spec(one("everything", "Deployment", "-api"))["containers"][0]).items()}
    assert "gpu-booking/gpu-booking-agent=service" in env["GPU_BOOKING_SERVICE_ACCOUNT"]
    job = one("defaults", "Job", "-bootstrap")
    assert env_of(pod_spec(job)["containers"][0])["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_KEY"]["value"] == ""
    # Off: the HS256 service token from the Secret, minted by the bootstrap Job.
    off = render.render(set_values=["auth.serviceAccountTokens.enabled=false"])
    (webhook,) = [o for o in off if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-webhook")]
    (volume,) = [v for v in pod_spec(webhook)["volumes"] if v["name"] == "service-token"]
    assert volume["secret"]["secretName"] == "gpu-booking-secrets"
    assert not [o for o in off if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-tokenreview")]
    assert unmet(off) == []


def test_notice_secrets_may_come_from_their_own_secret():
    """`notices.secretName`: the SMTP password and the webhook URL from a Secret the
    operator keeps (a secret manager's), the rest from the release's."""
    values = ["tests/chart/values/everything.yaml"]
    rendered = render.render(values, set_values=["notices.secretName=lab-notices"])
    (api,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")]
    volumes = {v["name"]: v for v in pod_spec(api)["volumes"]}
    assert volumes["notices"]["secret"]["secretName"] == "lab-notices"
    assert {i["key"] for i in volumes["notices"]["secret"]["items"]} == {"smtp-password", "notice-webhook-url"}
    hub_token, _ = operator_inputs("everything")
    assert [m for m in unmet(rendered) if "lab-notices" not in m and not any(s in m for s in hub_token)] == []
    # Unset: the release's Secret, as before.
    (api,) = [o for o in RENDERED["everything"] if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")]
    volumes = {v["name"]: v for v in pod_spec(api)["volumes"]}
    assert volumes["notices"]["secret"]["secretName"] != "lab-notices"
