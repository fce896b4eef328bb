"""Safe defaults an operator would check: disruption budgets that
never block a drain, names within Kubernetes' limits for every release name Helm
accepts, and values that contradict each other refused at render time."""

import pytest

import render
from test_chart import pod_spec


def kinds(rendered, kind):
    return [o for o in rendered if o["kind"] == kind]


def test_disruption_budgets_never_block_a_drain():
    default = render.render()
    assert {p["metadata"]["name"] for p in kinds(default, "PodDisruptionBudget")} == {
        "gpu-booking-api", "gpu-booking-webhook", "gpu-booking-controller"}
    # One replica: minAvailable 1 would refuse every eviction, so no budget at all.
    single = render.render(set_values=["api.replicaCount=1", "webhook.replicaCount=1", "controller.replicaCount=1"])
    assert kinds(single, "PodDisruptionBudget") == []
    for bad in ["api.podDisruptionBudget.minAvailable=2", "controller.podDisruptionBudget.minAvailable=100%"]:
        result = render.template(set_values=[bad], check=False)
        assert result.returncode != 0 and "drained" in result.stderr, bad


@pytest.mark.parametrize("release", ["g", "gpu-booking", "a" * 53, "lab-gpu-booking-" + "x" * 37])
def test_every_name_fits_for_every_release_name_helm_accepts(release):
    """Helm accepts release names of up to 53 characters; the CronJob's name must fit
    52 (its Jobs append 11), and every object's name 253 (63 for Services and labels)."""
    rendered = render.render(release=release)
    for cron in kinds(rendered, "CronJob"):
        assert len(cron["metadata"]["name"]) <= 52, cron["metadata"]["name"]
    for o in rendered:
        name = o["metadata"]["name"]
        limit = 63 if o["kind"] in ("Service", "Job", "StatefulSet") else 253
        assert len(name) <= limit, (o["kind"], name)
        for value in o["metadata"].get("labels", {}).values():
            assert len(value) <= 63, (o["kind"], name, value)


@pytest.mark.parametrize("bad, why", [
    (["webhook.bookingTimeout=5s"], "webhook.bookingTimeout"),
    (["webhook.bookingTimeout=1min", "webhook.timeoutSeconds=30"], "webhook.bookingTimeout"),
    (["webhook.gpuResources=null"], "gpuResources"),
    (["tls.renewBefore=400days"], "tls.renewBefore"),
    (["tls.mode=csr", "tls.csr.signerName=example.com/serving", "tls.csr.expirationSeconds=3600"], "tls.renewBefore"),
    (["tls.mode=cert-manager", "tls.certManager.renewBefore=9000h"], "tls.certManager.renewBefore"),
])
def test_values_that_contradict_each_other_are_refused(bad, why):
    result = render.template(set_values=bad, check=False)
    assert result.returncode != 0, bad
    assert why in result.stderr, result.stderr


def test_the_same_values_within_bounds_render():
    render.render(set_values=["webhook.bookingTimeout=4999ms", "tls.renewBefore=364days"])
    render.render(set_values=["webhook.gpuResources=null", "webhook.modelResources.a100=nvidia.com/a100"])


def test_the_webhook_matches_only_through_its_resources_even_with_model_ones_only():
    rendered = render.render(set_values=["webhook.gpuResources=null", "webhook.modelResources.a100=nvidia.com/a100"])
    (mwc,) = kinds(rendered, "MutatingWebhookConfiguration")
    exprs = " ".join(c["expression"] for c in mwc["webhooks"][0]["matchConditions"])
    assert "'nvidia.com/a100'" in exprs and "'nvidia.com/gpu'" not in exprs


SENTINEL = "s3cr3t-sentinel-value"
SECRET_ENV = ["DATABASE_URL", "GPU_BOOKING_JWT_SECRET", "GPU_BOOKING_SERVICE_TOKEN"]


def test_help_never_prints_a_secret_from_the_environment():
    """`--help` of every subcommand with every secret-valued variable set
    (GPU_BOOKING_BIN, the real binary)."""
    import os
    import subprocess

    binary = os.environ.get("GPU_BOOKING_BIN")
    if not binary:
        pytest.skip("GPU_BOOKING_BIN not set (scripts/test.sh sets it)")
    env = {"PATH": "/usr/bin:/bin", **{k: f"postgres://u:{SENTINEL}@h/x" for k in SECRET_ENV}}
    for sub in ["api", "migrate", "token", "webhook", "controller", "agent", "bootstrap", "demo",
                "certs self-signed", "certs csr"]:
        out = subprocess.run([binary, *sub.split(), "--help"], env=env, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, (sub, out.stderr)
        assert SENTINEL not in out.stdout + out.stderr, sub


def test_the_ingress_publishes_the_page_and_the_api_but_not_metrics_or_probes():
    import test_chart
    (ingress,) = test_chart.objects("everything", "Ingress")
    paths = [(p["path"], p["pathType"]) for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]

    def routed(url):
        return any(url == p if t == "Exact" else url.startswith(p) for p, t in paths)

    for public in ["/", "/assets/app.js", "/favicon.ico", "/api/v1/bookings", "/api/openapi.json"]:
        assert routed(public), public
    for private in ["/metrics", "/healthz", "/readyz"]:
        assert not routed(private), private


def controller_pod_rules(rendered):
    out = {}
    for o in rendered:
        if o["kind"] in ("Role", "ClusterRole") and o["metadata"]["labels"]["app.kubernetes.io/component"] == "controller":
            for r in o["rules"]:
                if "pods" in r["resources"]:
                    out.setdefault((o["kind"], o["metadata"].get("namespace")), []).extend(r["verbs"])
    return {k: sorted(v) for k, v in out.items()}


def test_the_controller_reads_pods_everywhere_and_changes_them_only_where_it_serves():
    # What its code does to pods, in every on-expiry mode: watch them all (every GPU
    # pod counts), and where it serves read one, delete, create a replacement, patch an
    # annotation (the end-to-end suite runs with these rules).
    read = ["list", "watch"]
    verbs = sorted(["get", "create", "delete", "patch"])
    rendered = render.render()
    assert controller_pod_rules(rendered) == {("ClusterRole", None): read, ("Role", "jhub"): verbs}
    (binding,) = [o for o in rendered if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "gpu-booking-controller-pods"]
    assert binding["metadata"]["namespace"] == "jhub"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-booking-controller", "namespace": "gpu-booking"}]
    (deployment,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")]
    env = {e["name"]: e.get("value") for e in pod_spec(deployment)["containers"][0]["env"]}
    assert env["GPU_BOOKING_CONTROLLER_NAMESPACE"] == "jhub"
    # Events about nodes go to `default`: a Role there for events only.
    (events,) = [o for o in rendered if o["kind"] == "Role" and o["metadata"]["name"] == "gpu-booking-controller-node-events"]
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    # `delete` mode still finishes a two-step action begun under another mode.
    assert controller_pod_rules(render.render(set_values=["controller.onExpiry=delete"])) == {
        ("ClusterRole", None): read, ("Role", "jhub"): verbs}
    # Other workloads an admin made preemptible: deleted there, nothing else.
    opted = render.render(set_values=["controller.preemption.otherWorkloadNamespaces={research,batch}"])
    assert controller_pod_rules(opted) == {
        ("ClusterRole", None): read, ("Role", "jhub"): verbs,
        ("Role", "research"): ["delete", "get"], ("Role", "batch"): ["delete", "get"]}
    (deployment,) = [o for o in opted if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")]
    env = {e["name"]: e.get("value") for e in pod_spec(deployment)["containers"][0]["env"]}
    assert env["GPU_BOOKING_CONTROLLER_PREEMPTIBLE_NAMESPACES"] == "research,batch"
    # Every namespace: an explicit choice, a ClusterRole, no namespace option.
    everywhere = render.render(set_values=["controller.namespace=*"])
    assert controller_pod_rules(everywhere) == {("ClusterRole", None): sorted(read + verbs)}
    assert not [o for o in everywhere if o["metadata"]["name"].endswith("-node-events")]
    (deployment,) = [o for o in everywhere if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")]
    assert "GPU_BOOKING_CONTROLLER_NAMESPACE" not in {e["name"] for e in pod_spec(deployment)["containers"][0]["env"]}
    assert render.template(set_values=["controller.namespace=Not A Namespace"], check=False).returncode != 0


def test_every_alert_links_its_runbook_paragraph():
    import re
    import test_chart
    (rule,) = test_chart.objects("everything", "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 12
    runbooks = (render.ROOT / "docs" / "runbooks.md").read_text()
    headings = {h.lower() for h in re.findall(r"^## (\w+)$", runbooks, re.M)}
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url == f"docs/runbooks.md#{alert['alert'].lower()}", url
        assert alert["alert"].lower() in headings, f"docs/runbooks.md has no paragraph for {alert['alert']}"
    custom = render.render(["tests/chart/values/everything.yaml"], set_values=["metrics.prometheusRule.runbookBaseUrl=https://git.example.org/runbooks.md/"])
    (rule,) = [o for o in custom if o["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"] == "https://git.example.org/runbooks.md#gpubookingapidown"


def test_the_agent_may_change_only_its_annotation_on_a_pod():
    """The ValidatingAdmissionPolicy's CEL, evaluated (cel-python) on updates the agent
    could send: its annotation passes, anything else is denied."""
    import copy
    import json
    import test_chart
    celpy = pytest.importorskip("celpy")
    (policy,) = [o for o in test_chart.objects("everything", "ValidatingAdmissionPolicy")
                 if o["metadata"]["name"].endswith("-agent-pod-patch")]
    (binding,) = [o for o in test_chart.objects("everything", "ValidatingAdmissionPolicyBinding")
                  if o["metadata"]["name"] == policy["metadata"]["name"]]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["matchConditions"][0]["expression"] == \
        "request.userInfo.username == 'system:serviceaccount:gpu-booking:gpu-booking-agent'"
    env = celpy.Environment()

    def run(expr, activation):
        return env.program(env.compile(expr)).evaluate(activation)

    def allowed(old, new):
        act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
        variables = {v["name"]: run(v["expression"], act) for v in policy["spec"]["variables"]}
        act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
        return all(bool(run(v["expression"], act)) for v in policy["spec"]["validations"])

    fixture = render.ROOT / "tests" / "fixtures" / "kubespawner" / "6.2.0-alice-at-example.com-gpu.json"
    doc = json.loads(fixture.read_text())
    pod = doc.get("request", {}).get("object", doc)
    marked = copy.deepcopy(pod)
    marked["metadata"]["annotations"]["gpu-booking.io/last-gpu-activity"] = "2026-11-23T10:00:00Z"
    assert allowed(pod, marked)
    for change in ("label", "annotation", "spec", "drop"):
        bad = copy.deepcopy(marked)
        if change == "label":
            bad["metadata"].setdefault("labels", {})["gpu-booking.io/priority"] = "high"
        elif change == "annotation":
            bad["metadata"]["annotations"]["terminate-at"] = "2099-01-01T00:00:00Z"
        elif change == "spec":
            bad["spec"]["priorityClassName"] = "gpu-booking-high"
        else:
            bad["metadata"]["annotations"].pop("hub.jupyter.org/username")
        assert not allowed(pod, bad), change


def test_a_model_declared_with_its_resource_reaches_the_webhook():
    """`models.declared[].resource` is the one place to give a model its resource: the
    webhook's option and its match conditions take it as they take
    webhook.modelResources; the two must agree."""
    declared = ["models.declared[0].name=t4", "models.declared[0].units=1",
                "models.declared[0].patterns[0]=Tesla T4", "models.declared[0].resource=nvidia.com/t4"]
    rendered = render.render(set_values=declared + ["webhook.modelResources.a100=nvidia.com/a100"])
    (deployment,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-webhook")]
    env = {e["name"]: e.get("value") for e in pod_spec(deployment)["containers"][0]["env"]}
    assert env["GPU_BOOKING_WEBHOOK_MODEL_RESOURCE"] == "a100=nvidia.com/a100,t4=nvidia.com/t4"
    (config,) = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
    expression = config["webhooks"][0]["matchConditions"][0]["expression"]
    assert "'nvidia.com/t4' in c.resources.limits" in expression
    clash = render.template(set_values=declared + ["webhook.modelResources.t4=nvidia.com/tesla-t4"], check=False)
    assert clash.returncode != 0
    assert "models.declared gives the resource nvidia.com/t4" in clash.stderr
