"""JupyterHub in one place: the zero-to-jupyterhub values in
examples/jupyterhub/ checked against the gpu-booking chart rendered with its pair:
the hub's ServiceAccount is the trusted spawner in the user namespace the controller
serves, every GPU profile's pod reaches the webhook (its CEL matchConditions evaluated
on a KubeSpawner pod with the profile's limits), the CPU profile's never does, and a
profile's VRAM budget names the chart's gpumem resource."""

import copy
import json
from pathlib import Path

import yaml

import render
from test_chart import RENDERED, cel_program, env_of, one, pod_spec

JHUB = yaml.safe_load((render.JUPYTERHUB / "jupyterhub-values.yaml").read_text())
OURS = yaml.safe_load((render.JUPYTERHUB / "gpu-booking-values.yaml").read_text())
# The namespace the example installs zero-to-jupyterhub in (its header says so).
JHUB_NAMESPACE = "jhub"
KUBESPAWNER_POD = Path(__file__).resolve().parents[1] / "fixtures" / "kubespawner" / "6.2.0-alice-at-example.com-nogpu.json"


def spawned_pod(profile):
    """The pod KubeSpawner makes for `profile`: its extra_resource_limits become the
    container's limits (Kubernetes defaults an extended resource's request to it)."""
    doc = json.loads(KUBESPAWNER_POD.read_text())
    pod = copy.deepcopy(doc.get("request", {}).get("object", doc))
    limits = profile.get("kubespawner_override", {}).get("extra_resource_limits", {})
    pod["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {}).update(limits)
    return pod


def test_the_hub_is_the_trusted_spawner_in_the_namespace_the_controller_serves():
    webhook = env_of(pod_spec(one("jupyterhub", "Deployment", "-webhook"))["containers"][0])
    assert webhook["GPU_BOOKING_WEBHOOK_TRUSTED_SPAWNER"]["value"] == f"system:serviceaccount:{JHUB_NAMESPACE}:hub"
    assert webhook["GPU_BOOKING_WEBHOOK_SPAWNER_NAMESPACE"]["value"] == JHUB_NAMESPACE
    controller = env_of(pod_spec(one("jupyterhub", "Deployment", "-controller"))["containers"][0])
    assert controller["GPU_BOOKING_CONTROLLER_NAMESPACE"]["value"] == JHUB_NAMESPACE
    # The user namespace is not excluded from the webhook.
    w = one("jupyterhub", "MutatingWebhookConfiguration")["webhooks"][0]
    excluded = [e for e in w["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"][0]
    assert JHUB_NAMESPACE not in excluded["values"]


def test_every_gpu_profile_reaches_the_webhook_and_the_cpu_profile_never_does():
    w = one("jupyterhub", "MutatingWebhookConfiguration")["webhooks"][0]
    match = cel_program(w["matchConditions"][0]["expression"])
    profiles = JHUB["singleuser"]["profileList"]
    assert len(profiles) >= 2
    for profile in profiles:
        pod = spawned_pod(profile)
        assert pod["metadata"]["annotations"]["hub.jupyter.org/username"], "KubeSpawner names the user"
        wants_gpu = profile["slug"] != "cpu"
        assert match(pod) == wants_gpu, profile["slug"]


def test_a_profiles_vram_budget_names_the_charts_resource():
    webhook = env_of(pod_spec(one("jupyterhub", "Deployment", "-webhook"))["containers"][0])
    gpumem = webhook["GPU_BOOKING_GPUMEM_RESOURCE"]["value"]
    budgets = [p for p in JHUB["singleuser"]["profileList"]
               if any("gpumem" in k for k in p.get("kubespawner_override", {}).get("extra_resource_limits", {}))]
    assert budgets
    for p in budgets:
        limits = p["kubespawner_override"]["extra_resource_limits"]
        assert gpumem in limits, p["slug"]
        assert int(limits[gpumem]) <= max(m["gpumemMib"] for m in OURS["models"]["declared"])


def test_the_deploy_guide_shows_these_files():
    guide = (render.ROOT / "docs" / "deploy.md").read_text()
    assert "examples/jupyterhub/jupyterhub-values.yaml" in guide
    assert "examples/jupyterhub/gpu-booking-values.yaml" in guide
    assert "jupyterhub" in RENDERED


def test_the_page_signs_in_through_the_hub_that_registers_it():
    """"Sign in with JupyterHub": the hub's service entry and the API's options agree
    (client id, redirect URI, the secret's file), every user may use the service, and
    the hub's proxy may reach the API for the Services menu's link."""
    service = JHUB["hub"]["services"]["gpu-booking"]
    api = one("jupyterhub", "Deployment", "-api")
    env = env_of(pod_spec(api)["containers"][0])
    page = OURS["notices"]["pageUrl"]
    assert service["oauth_redirect_uri"] == page + "login/hub/callback"
    assert env["GPU_BOOKING_HUB_LOGIN_CLIENT_ID"]["value"] == "service-gpu-booking"
    assert env["GPU_BOOKING_HUB_LOGIN_URL"]["value"] == OURS["auth"]["hubLogin"]["url"]
    assert env["GPU_BOOKING_PAGE_URL"]["value"] == page
    secret_file = env["GPU_BOOKING_HUB_LOGIN_SECRET_FILE"]["value"]
    mount = [m for m in pod_spec(api)["containers"][0]["volumeMounts"] if secret_file.startswith(m["mountPath"] + "/")]
    assert len(mount) == 1, "the client secret's file is mounted"
    volume = [v for v in pod_spec(api)["volumes"] if v["name"] == mount[0]["name"]][0]
    assert volume["secret"]["secretName"] == OURS["auth"]["hubLogin"]["secretName"]
    assert volume["secret"]["items"] == [{"key": "client-secret", "path": secret_file.rsplit("/", 1)[1]}]
    # The menu's link reaches our API Service (the release's, port included).
    svc = one("jupyterhub", "Service", "-api")
    assert service["url"] == f"http://{svc['metadata']['name']}.gpu-booking.svc:{svc['spec']['ports'][0]['port']}"
    assert "access:services!service=gpu-booking" in JHUB["hub"]["loadRoles"]["user"]["scopes"]
    policy = one("jupyterhub", "NetworkPolicy", "-api")
    peers = policy["spec"]["ingress"][0]["from"]
    assert any(p.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == JHUB_NAMESPACE
               for p in peers), "the hub's proxy may reach the API"


def test_hub_sign_in_without_the_page_address_is_refused_at_install():
    out = render.template(set_values=["auth.hubLogin.url=https://hub.example/",
                                      "auth.hubLogin.secretName=s"], check=False)
    assert out.returncode != 0
    assert "auth.hubLogin.url needs notices.pageUrl" in out.stderr
