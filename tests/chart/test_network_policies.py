"""The chart's NetworkPolicies (networkPolicy.enabled, on by default): every pod of the
release refuses ingress but what it needs, and what the chart itself wires together
still connects.

The connections are read from the rendered chart, not listed here: who is given the
booking API's URL, who reads the database URL, what the ServiceMonitors scrape, which
Service the API server calls for the webhook and the Ingress routes to. Each is then
decided by a small evaluator of the NetworkPolicy semantics (ingress only, as the
chart restricts no egress), so a policy that shuts out a caller the chart configures
fails here, not on a lab's first install.

Run by scripts/chart-test.sh (HELM names the helm binary)."""

import ipaddress
import subprocess
from urllib.parse import urlsplit

import pytest

import render
from test_chart import RENDERED, SCENARIOS, env_of, objects, pod_spec

NAMESPACE = render.NAMESPACE
POD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}
PROMETHEUS = {"namespace": "monitoring", "labels": {"app.kubernetes.io/name": "prometheus"}}
INGRESS_NGINX = {"namespace": "ingress-nginx", "labels": {"app.kubernetes.io/name": "ingress-nginx"}}
NOTEBOOK = {"namespace": "jhub", "labels": {"component": "singleuser-server"}}
API_SERVER = {"ip": "10.0.0.10"}


# --- a NetworkPolicy evaluator (ingress) ----------------------------------------------


def selects(selector, labels):
    """A LabelSelector against a label map (an empty selector selects everything)."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def namespace_labels(namespace):
    return {"kubernetes.io/metadata.name": namespace}


def peer_admits(peer, policy_namespace, source):
    if "ipBlock" in peer:
        if "ip" not in source:
            return False
        ip = ipaddress.ip_address(source["ip"])
        block = peer["ipBlock"]
        return (ip in ipaddress.ip_network(block["cidr"], strict=False)
                and not any(ip in ipaddress.ip_network(e, strict=False) for e in block.get("except", [])))
    if "namespace" not in source:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], namespace_labels(source["namespace"])):
            return False
    elif source["namespace"] != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), source["labels"])


def port_admits(rule_port, port):
    if rule_port.get("protocol", "TCP") != port.get("protocol", "TCP"):
        return False
    if "port" not in rule_port:
        return True
    wanted = rule_port["port"]
    return wanted == port.get("name") if isinstance(wanted, str) else wanted == port["containerPort"]


def applicable(policies, target):
    return [p for p in policies
            if p["metadata"]["namespace"] == target["namespace"]
            and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
            and selects(p["spec"]["podSelector"], target["labels"])]


def admits(policies, source, target, port):
    """Whether `source` (a pod: namespace and labels; or an address: ip) may open a
    connection to `port` (a container port) of the pod `target`."""
    chosen = applicable(policies, target)
    if not chosen:
        return True
    for policy in chosen:
        for rule in policy["spec"].get("ingress") or []:
            if rule.get("ports") and not any(port_admits(p, port) for p in rule["ports"]):
                continue
            peers = rule.get("from")
            if not peers or any(peer_admits(peer, policy["metadata"]["namespace"], source) for peer in peers):
                return True
    return False


# --- the rendered chart's pods and connections ----------------------------------------


def pods(rendered):
    """Every pod template of the release: name, namespace, labels, container ports, env."""
    out = []
    for o in rendered:
        if o["kind"] not in POD_KINDS:
            continue
        template = o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
        spec = pod_spec(o)
        out.append({
            "kind": o["kind"],
            "name": o["metadata"]["name"],
            "namespace": o["metadata"].get("namespace", NAMESPACE),
            "labels": template["metadata"].get("labels", {}),
            "ports": [p for c in spec["containers"] for p in c.get("ports", [])],
            "env": {k: e.get("value") for c in spec["containers"] for k, e in env_of(c).items()},
        })
    return out


def policies_of(rendered):
    return [o for o in rendered if o["kind"] == "NetworkPolicy"]


def service_targets(rendered, name, port):
    """The pods behind Service `name` and the container port its `port` (name or
    number) leads to: [(pod, container port)]."""
    (service,) = [o for o in rendered if o["kind"] == "Service" and o["metadata"]["name"] == name]
    (sp,) = [p for p in service["spec"]["ports"] if port in (p.get("name"), p["port"])]
    target = sp.get("targetPort", sp["port"])
    out = []
    for pod in pods(rendered):
        if pod["namespace"] == service["metadata"]["namespace"] and selects({"matchLabels": service["spec"]["selector"]}, pod["labels"]):
            (cp,) = [p for p in pod["ports"] if target in (p.get("name"), p["containerPort"])]
            out.append((pod, cp))
    assert out, f"Service {name} selects no pod of the release"
    return out


def service_host(host):
    """`name.namespace.svc` -> name."""
    name, namespace, *_ = host.split(".")
    assert namespace == NAMESPACE, host
    return name


def connections(rendered):
    """(what, source, target pod, container port) for every connection the chart sets
    up towards a pod of the release."""
    out = []
    everyone = pods(rendered)
    # The booking API's URL, given to the webhook, the controller and the agent.
    for pod in everyone:
        url = pod["env"].get("GPU_BOOKING_BOOKING_URL")
        if url:
            u = urlsplit(url)
            for target, port in service_targets(rendered, service_host(u.hostname), u.port):
                out.append((f"{pod['name']} calls the booking API", pod, target, port))
    # The embedded database, at the host the bootstrap Job writes into the URL, for
    # every pod that reads the URL.
    hosts = [p["env"]["GPU_BOOKING_BOOTSTRAP_DATABASE_HOST"] for p in everyone if p["env"].get("GPU_BOOKING_BOOTSTRAP_DATABASE_HOST")]
    for host in hosts:
        for pod in everyone:
            if "GPU_BOOKING_DATABASE_URL_FILE" in pod["env"]:
                for target, port in service_targets(rendered, service_host(host), "postgres"):
                    out.append((f"{pod['name']} connects to Postgres", pod, target, port))
    # Prometheus, through the ServiceMonitors.
    for monitor in (o for o in rendered if o["kind"] == "ServiceMonitor"):
        services = [o for o in rendered if o["kind"] == "Service" and selects(monitor["spec"]["selector"], o["metadata"]["labels"])]
        assert services, monitor["metadata"]["name"]
        for service in services:
            for endpoint in monitor["spec"]["endpoints"]:
                for target, port in service_targets(rendered, service["metadata"]["name"], endpoint["port"]):
                    out.append((f"Prometheus scrapes {service['metadata']['name']}", PROMETHEUS, target, port))
    # The API server's admission calls.
    for configuration in (o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"):
        for webhook in configuration["webhooks"]:
            service = webhook["clientConfig"]["service"]
            for target, port in service_targets(rendered, service["name"], service.get("port", 443)):
                out.append(("the API server calls the webhook", API_SERVER, target, port))
    # The ingress controller, for the page's users.
    for ingress in (o for o in rendered if o["kind"] == "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                port = backend["port"].get("name") or backend["port"]["number"]
                for target, cp in service_targets(rendered, backend["name"], port):
                    out.append((f"the ingress controller routes {path['path']}", INGRESS_NGINX, target, cp))
    return out


def one_pod(rendered, component):
    (pod,) = [p for p in pods(rendered) if p["labels"].get("app.kubernetes.io/component") == component
              and p["kind"] != "Job"]
    return pod


def port_named(pod, name):
    (port,) = [p for p in pod["ports"] if p.get("name") == name]
    return port


def by_name(rendered):
    return {p["metadata"]["name"]: p for p in policies_of(rendered)}


# Every part on, with the defaults' network values: the ServiceMonitors, the Ingress and
# the agent add connections.
EVERY_PART = ["agent.enabled=true", "metrics.serviceMonitor.enabled=true", "api.ingress.enabled=true"]


@pytest.fixture(scope="module")
def full():
    return render.render(set_values=EVERY_PART)


# --- tests -----------------------------------------------------------------------------


def test_the_default_install_has_the_policies():
    names = set(by_name(RENDERED["defaults"]))
    assert names == {"gpu-booking-default-deny", "gpu-booking-api", "gpu-booking-postgres",
                     "gpu-booking-webhook", "gpu-booking-controller", "gpu-booking-agent"}
    deny = by_name(RENDERED["defaults"])["gpu-booking-default-deny"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    # Ingress only: the components' calls out (DNS, the API server's TokenReviews, an
    # external database, the OIDC provider) are not restricted.
    for policy in policies_of(RENDERED["defaults"]):
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_pod_of_every_scenario_is_isolated(scenario):
    rendered = RENDERED[scenario]
    for pod in pods(rendered):
        assert applicable(policies_of(rendered), pod), f"{pod['kind']}/{pod['name']} in {scenario}: no NetworkPolicy selects it"


def test_every_connection_the_chart_sets_up_is_admitted(full):
    policies = policies_of(full)
    found = connections(full)
    # What the evaluation must cover, so that a renamed variable cannot empty it.
    whats = {what for what, *_ in found}
    assert {"gpu-booking-webhook calls the booking API", "gpu-booking-controller calls the booking API",
            "gpu-booking-agent calls the booking API", "gpu-booking-api connects to Postgres",
            "gpu-booking-migrate connects to Postgres", "the API server calls the webhook",
            "Prometheus scrapes gpu-booking-api", "Prometheus scrapes gpu-booking-webhook",
            "Prometheus scrapes gpu-booking-controller", "Prometheus scrapes gpu-booking-agent",
            "the ingress controller routes /api/"} <= whats
    refused = [f"{what} ({target['name']}:{port.get('name', port['containerPort'])})"
               for what, source, target, port in found if not admits(policies, source, target, port)]
    assert refused == []


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_connection_is_admitted_in_every_scenario(scenario):
    rendered = RENDERED[scenario]
    refused = [what for what, source, target, port in connections(rendered)
               if not admits(policies_of(rendered), source, target, port)]
    assert refused == []


def test_postgres_only_from_the_api_the_migration_job_and_the_backup(full):
    spec = by_name(full)["gpu-booking-postgres"]["spec"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "postgres", "protocol": "TCP"}]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]] == ["api", "migrate", "backup"]
    # Same namespace, this release only: no namespaceSelector, the instance label.
    assert all(set(p) == {"podSelector"} for p in rule["from"])
    assert all(p["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == render.RELEASE for p in rule["from"])
    postgres = one_pod(full, "postgres")
    port = port_named(postgres, "postgres")
    policies = policies_of(full)
    admitted = {p["name"] for p in pods(full) if admits(policies, p, postgres, port)}
    assert admitted == {"gpu-booking-api", "gpu-booking-migrate", "gpu-booking-backup"}
    for outsider in (PROMETHEUS, INGRESS_NGINX, NOTEBOOK, API_SERVER):
        assert not admits(policies, outsider, postgres, port), outsider


def test_the_api_from_the_components_the_ingress_controller_and_prometheus(full):
    (rule,) = by_name(full)["gpu-booking-api"]["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    components = [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"] if "podSelector" in p]
    assert components == ["webhook", "controller", "agent"]
    namespaces = [p["namespaceSelector"] for p in rule["from"] if "namespaceSelector" in p]
    assert namespaces == [{"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}},
                          {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}]
    api = one_pod(full, "api")
    port = port_named(api, "http")
    policies = policies_of(full)
    assert {p["name"] for p in pods(full) if admits(policies, p, api, port)} == {
        "gpu-booking-webhook", "gpu-booking-controller", "gpu-booking-agent"}
    assert admits(policies, INGRESS_NGINX, api, port) and admits(policies, PROMETHEUS, api, port)
    assert not admits(policies, NOTEBOOK, api, port)
    # Another release's webhook in this namespace is not ours.
    other = {"namespace": NAMESPACE, "labels": {**one_pod(full, "webhook")["labels"], "app.kubernetes.io/instance": "other"}}
    assert not admits(policies, other, api, port)


def test_metrics_ports_only_from_prometheus(full):
    policies = policies_of(full)
    for component in ("webhook", "controller", "agent"):
        (rule,) = [r for r in by_name(full)[f"gpu-booking-{component}"]["spec"]["ingress"]
                   if r["ports"] == [{"port": "metrics", "protocol": "TCP"}]]
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        pod = one_pod(full, component)
        port = port_named(pod, "metrics")
        assert admits(policies, PROMETHEUS, pod, port)
        for outsider in (NOTEBOOK, INGRESS_NGINX, API_SERVER, one_pod(full, "api")):
            assert not admits(policies, outsider, pod, port), (component, outsider.get("name", outsider))
    # The controller and the agent take no other connection.
    for component in ("controller", "agent"):
        assert len(by_name(full)[f"gpu-booking-{component}"]["spec"]["ingress"]) == 1


def test_prometheus_namespace_is_a_value():
    rendered = render.render(set_values=EVERY_PART + [
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=observability"])
    policies = policies_of(rendered)
    elsewhere = {"namespace": "observability", "labels": {}}
    controller = one_pod(rendered, "controller")
    assert admits(policies, elsewhere, controller, port_named(controller, "metrics"))
    assert not admits(policies, PROMETHEUS, controller, port_named(controller, "metrics"))
    api = one_pod(rendered, "api")
    assert admits(policies, elsewhere, api, port_named(api, "http"))


def test_an_empty_api_from_opens_the_api_port():
    rendered = render.render(set_values=["networkPolicy.apiFrom=null"])
    (rule,) = by_name(rendered)["gpu-booking-api"]["spec"]["ingress"]
    assert "from" not in rule
    api = one_pod(rendered, "api")
    assert admits(policies_of(rendered), NOTEBOOK, api, port_named(api, "http"))
    # Postgres stays closed.
    postgres = one_pod(rendered, "postgres")
    assert not admits(policies_of(rendered), NOTEBOOK, postgres, port_named(postgres, "postgres"))


def test_the_webhook_port_is_open_without_the_api_servers_addresses():
    rendered = RENDERED["defaults"]
    (https, metrics) = by_name(rendered)["gpu-booking-webhook"]["spec"]["ingress"]
    # No `from`: any source. An ipBlock of 0.0.0.0/0 would not select the nodes the API
    # server runs on under Cilium's default, and the API server would be shut out.
    assert https == {"ports": [{"port": "https", "protocol": "TCP"}]}
    webhook = one_pod(rendered, "webhook")
    port = port_named(webhook, "https")
    for source in (API_SERVER, {"ip": "192.0.2.7"}, NOTEBOOK):
        assert admits(policies_of(rendered), source, webhook, port)


def test_the_webhook_port_is_restricted_to_the_api_servers_addresses():
    rendered = render.render(set_values=[
        "webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32,fd00::10/128}"])
    (https, metrics) = by_name(rendered)["gpu-booking-webhook"]["spec"]["ingress"]
    assert https["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert https["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "fd00::10/128"}}]
    webhook = one_pod(rendered, "webhook")
    port = port_named(webhook, "https")
    policies = policies_of(rendered)
    assert admits(policies, API_SERVER, webhook, port)
    assert admits(policies, {"ip": "fd00::10"}, webhook, port)
    for source in ({"ip": "10.0.0.11"}, NOTEBOOK, one_pod(rendered, "controller")):
        assert not admits(policies, source, webhook, port), source
    # The metrics port keeps its own rule.
    assert admits(policies, PROMETHEUS, webhook, port_named(webhook, "metrics"))
    assert not admits(policies, API_SERVER, webhook, port_named(webhook, "metrics"))


def test_the_webhook_port_may_admit_peers_such_as_konnectivity():
    policies = by_name(RENDERED["everything"])
    (https, _) = policies["gpu-booking-webhook"]["spec"]["ingress"]
    assert https["from"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "fd00::10/128"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
         "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}},
    ]
    konnectivity = {"namespace": "kube-system", "labels": {"k8s-app": "konnectivity-agent"}}
    webhook = one_pod(RENDERED["everything"], "webhook")
    assert admits(policies_of(RENDERED["everything"]), konnectivity, webhook, port_named(webhook, "https"))
    # Without CIDRs or peers, networkPolicy.webhookFrom.
    rendered = render.render(set_values=["networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24"])
    (https, _) = by_name(rendered)["gpu-booking-webhook"]["spec"]["ingress"]
    assert https["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]


def test_turning_them_off_removes_every_policy():
    rendered = render.render(set_values=["networkPolicy.enabled=false"] + EVERY_PART)
    assert policies_of(rendered) == []
    # And nothing else goes with them.
    kinds = sorted(o["kind"] for o in render.render(set_values=EVERY_PART) if o["kind"] != "NetworkPolicy")
    assert sorted(o["kind"] for o in rendered) == kinds


def test_the_policies_name_ports_their_pods_declare(full):
    """A named port that the pod does not declare matches nothing: the traffic would
    be refused."""
    for policy in policies_of(full):
        selected = [p for p in pods(full) if selects(policy["spec"]["podSelector"], p["labels"])]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                for pod in selected:
                    assert any(port_admits(port, p) for p in pod["ports"]), (policy["metadata"]["name"], pod["name"], port)


def notes(*set_values):
    cmd = [render.helm(), "install", render.RELEASE, str(render.CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    for s in set_values:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return out[out.index("NOTES:"):]


def test_the_install_notes_say_whether_the_webhook_port_is_open():
    text = notes()
    assert "webhook port          OPEN to any source" in text
    assert "metrics ports         from namespace monitoring" in text
    assert "namespace ingress-nginx" in text
    text = notes("webhook.networkPolicy.apiServerCIDRs={10.0.0.10/32}")
    assert "webhook port          from the API server: 10.0.0.10/32" in text and "OPEN" not in text
    assert "NetworkPolicies: none" in notes("networkPolicy.enabled=false")
