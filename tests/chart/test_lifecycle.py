"""Upgrades, uninstall and the lab's data, on the rendered chart (docs/deploy.md,
"Upgrading", "Uninstalling", "Backups and restore"):

- every hook Job helm waits for fits helm's default 5-minute `--timeout`, and every
  helm command the docs show that waits longer says so;
- the PriorityClasses are the release's own, and the components name them;
- the post-delete hook that takes our labels and resource off the nodes once the
  controller's pods are gone, with RBAC for that alone;
- the controller's admission policies;
- the fallback service token: 90 days at most, rotated by a CronJob that may only
  read and update its Secret;
- the embedded database's pg_dump CronJob, CloudNativePG's ScheduledBackup and
  disruption budgets.

The policies' behaviour (what they let through and refuse) is tested on the fake API
server: tests/it/e2e_controller_bounds.rs."""

import re

import pytest

import render
from test_chart import env_of, objects, one, pod_spec

HELM_DEFAULT_TIMEOUT = 300
DOCS = [render.ROOT / "README.md", render.ROOT / "docs" / "deploy.md",
        render.CHART / "README.md", render.CHART / "templates" / "NOTES.txt"]
CNPG = ["--api-versions", "postgresql.cnpg.io/v1/Cluster"]


def named(rendered, kind, name):
    (found,) = [o for o in rendered if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def duration_seconds(text):
    total = 0
    for amount, unit in re.findall(r"(\d+)([hms])", text):
        total += int(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


@pytest.mark.parametrize("scenario", ["defaults", "everything"])
def test_every_hook_job_fits_helms_default_timeout(scenario):
    hooks = [o for o in objects(scenario, "Job") if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert {o["metadata"]["name"] for o in hooks} >= {"gpu-booking-cleanup-nodes"}
    for job in hooks:
        deadline = job["spec"]["activeDeadlineSeconds"]
        assert deadline < HELM_DEFAULT_TIMEOUT, f"{job['metadata']['name']}: {deadline}s"
    external = render.render(set_values=["database.mode=external", "secrets.existingSecret=lab-db"])
    migrate = [o for o in external if o["kind"] == "Job" and o["metadata"]["name"].endswith("-migrate")]
    assert migrate and migrate[0]["spec"]["activeDeadlineSeconds"] < HELM_DEFAULT_TIMEOUT


def documented_helm_commands():
    """Each `helm install|upgrade|uninstall` the docs show, continuation lines joined."""
    out = []
    for path in DOCS:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if re.match(r"\s*helm (install|upgrade|uninstall)\b", line):
                out.append((path.name, line.strip()))
    return out


def test_documented_helm_commands_wait_long_enough():
    commands = documented_helm_commands()
    assert len(commands) >= 5, commands
    for where, command in commands:
        timeout = re.search(r"--timeout[ =](\S+)", command)
        if timeout:
            assert duration_seconds(timeout.group(1)) >= HELM_DEFAULT_TIMEOUT, f"{where}: {command}"


def test_priority_classes_are_the_releases_own():
    for release in ("gpu-booking", "lab2"):
        rendered = render.render(release=release)
        fullname = "gpu-booking" if release == "gpu-booking" else f"{release}-gpu-booking"
        names = sorted(o["metadata"]["name"] for o in rendered if o["kind"] == "PriorityClass")
        assert names == [f"{fullname}-high", f"{fullname}-low"]
        for o in rendered:
            if o["kind"] not in ("Deployment", "DaemonSet"):
                continue
            env = env_of(pod_spec(o)["containers"][0])
            for cls in ("high", "low"):
                name = f"GPU_BOOKING_{cls.upper()}_PRIORITY_CLASS"
                if name in env:
                    assert env[name]["value"] == f"{fullname}-{cls}", o["metadata"]["name"]
    chosen = render.render(set_values=["priorityClasses.high.name=lab-booked"])
    assert "lab-booked" in [o["metadata"]["name"] for o in chosen if o["kind"] == "PriorityClass"]
    template = (render.CHART / "templates" / "priorityclasses.yaml").read_text()
    # A class another release owns is refused with its owner (lookup: a live cluster only).
    assert 'lookup "scheduling.k8s.io/v1" "PriorityClass"' in template
    assert "meta.helm.sh/release-name" in template and "fail" in template


def test_the_uninstall_hook_removes_only_our_node_marks():
    rendered = render.render()
    job = named(rendered, "Job", "gpu-booking-cleanup-nodes")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    spec = pod_spec(job)
    (c,) = spec["containers"]
    assert c["args"] == ["cleanup-nodes"]
    assert spec["serviceAccountName"] == "gpu-booking-cleanup-nodes"
    env = env_of(c)
    assert env["GPU_BOOKING_MODEL_NODE_LABEL"]["value"] == "gpu-booking.io/model"
    assert env["GPU_BOOKING_GPUMEM_RESOURCE"]["value"] == "gpu-booking.io/gpumem"
    # It waits for the controller's pods to be gone (they would put everything back),
    # within its deadline.
    controller = named(rendered, "Deployment", "gpu-booking-controller")
    labels = controller["spec"]["selector"]["matchLabels"]
    assert env["GPU_BOOKING_CLEANUP_WAIT_FOR_PODS"]["value"] == ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    assert env["GPU_BOOKING_CLEANUP_NAMESPACE"]["value"] == "gpu-booking"
    assert duration_seconds(env["GPU_BOOKING_CLEANUP_WAIT_TIMEOUT"]["value"]) < job["spec"]["activeDeadlineSeconds"]
    role = named(rendered, "ClusterRole", "gpu-booking-cleanup-nodes")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    pods = named(rendered, "Role", "gpu-booking-cleanup-nodes")
    assert pods["metadata"]["namespace"] == "gpu-booking"
    assert pods["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    # Its RBAC exists before the Job and goes with it.
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        annotations = named(rendered, kind, "gpu-booking-cleanup-nodes")["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "post-delete"
        assert int(annotations["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    off = render.render(set_values=["nodeCleanup.enabled=false"])
    assert not [o for o in off if o["metadata"]["name"] == "gpu-booking-cleanup-nodes"]


def test_the_controllers_policies_bound_nodes_status_and_pods():
    rendered = render.render()
    user = "system:serviceaccount:gpu-booking:gpu-booking-controller"
    for name, operation, resource in [("nodes", "UPDATE", "nodes"), ("node-status", "UPDATE", "nodes/status"),
                                      ("pod-create", "CREATE", "pods")]:
        policy = named(rendered, "ValidatingAdmissionPolicy", f"gpu-booking-controller-{name}")
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["operations"] == [operation] and rule["resources"] == [resource]
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert user in policy["spec"]["matchConditions"][0]["expression"]
        binding = named(rendered, "ValidatingAdmissionPolicyBinding", f"gpu-booking-controller-{name}")
        assert binding["spec"] == {"policyName": f"gpu-booking-controller-{name}", "validationActions": ["Deny"]}
    # A model label outside our domain is one of ours too.
    custom = render.render(set_values=["webhook.modelNodeLabel=lab.example/gpu-model"])
    nodes = named(custom, "ValidatingAdmissionPolicy", "gpu-booking-controller-nodes")
    assert "k == 'lab.example/gpu-model'" in nodes["spec"]["validations"][0]["expression"]
    copies = named(render.render(set_values=["controller.copyPolicy.secretNames={git-credentials}"]),
                   "ValidatingAdmissionPolicy", "gpu-booking-controller-pod-create")
    secrets = [v for v in copies["spec"]["variables"] if v["name"] == "secrets"]
    assert secrets == [{"name": "secrets", "expression": '["git-credentials"]'}]
    assert not [o for o in render.render(set_values=["controller.enabled=false"])
                if o["kind"] == "ValidatingAdmissionPolicy" and "-controller-" in o["metadata"]["name"]]


def test_the_fallback_service_token_lives_90_days_and_is_rotated():
    defaults = render.render()
    job = named(defaults, "Job", "gpu-booking-bootstrap")
    env = env_of(pod_spec(job)["containers"][0])
    assert env["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_TTL"]["value"] == "90days"
    assert env["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_RENEW_BEFORE"]["value"] == "30days"
    # ServiceAccount tokens (the default): no shared token, nothing to rotate.
    assert env["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_KEY"]["value"] == ""
    assert not [o for o in defaults if o["metadata"]["name"] == "gpu-booking-token"]

    fallback = render.render(set_values=["auth.serviceAccountTokens.enabled=false"])
    cron = named(fallback, "CronJob", "gpu-booking-token")
    spec = pod_spec(cron)
    (c,) = spec["containers"]
    assert c["args"] == ["bootstrap"]
    assert spec["serviceAccountName"] == "gpu-booking-token"
    # The same options as the hook Job's.
    hook = pod_spec(named(fallback, "Job", "gpu-booking-bootstrap"))["containers"][0]
    assert c["env"] == hook["env"]
    assert env_of(c)["GPU_BOOKING_BOOTSTRAP_SERVICE_TOKEN_KEY"]["value"] == "service-token"
    role = named(fallback, "Role", "gpu-booking-token")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["gpu-booking-secrets"], "verbs": ["get", "update"]}]
    out = render.template(set_values=["bootstrap.serviceJwtLifetime=forever"], check=False)
    assert out.returncode != 0


def test_the_embedded_database_is_dumped_daily_to_a_volume_it_keeps():
    rendered = render.render()
    cron = named(rendered, "CronJob", "gpu-booking-backup")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod_spec(cron)
    (c,) = spec["containers"]
    statefulset = named(rendered, "StatefulSet", "gpu-booking-postgres")
    # pg_dump of the server's own version.
    assert c["image"] == pod_spec(statefulset)["containers"][0]["image"]
    script = c["args"][0]
    assert "pg_dump --format=custom --no-owner" in script
    assert 'mv "$file.partial" "$file"' in script
    env = env_of(c)
    assert env["PGHOST"]["value"] == "gpu-booking-postgres.gpu-booking.svc"
    assert env["KEEP"]["value"] == "7"
    assert "PGPASSWORD" not in env, "the password is read from its file"
    claim = named(rendered, "PersistentVolumeClaim", "gpu-booking-backup")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["backup"]["persistentVolumeClaim"]["claimName"] == "gpu-booking-backup"
    assert spec["automountServiceAccountToken"] is False

    existing = render.render(set_values=["database.embedded.backup.persistence.existingClaim=lab-nfs"])
    assert not [o for o in existing if o["kind"] == "PersistentVolumeClaim"]
    cron = named(existing, "CronJob", "gpu-booking-backup")
    assert {v["name"]: v for v in pod_spec(cron)["volumes"]}["backup"]["persistentVolumeClaim"]["claimName"] == "lab-nfs"
    off = render.render(set_values=["database.embedded.backup.enabled=false"])
    assert not [o for o in off if o["metadata"]["name"] == "gpu-booking-backup"]
    external = render.render(set_values=["database.mode=external", "secrets.existingSecret=lab-db"])
    assert not [o for o in external if o["metadata"]["name"] == "gpu-booking-backup"]


def test_cloudnativepg_backups_and_disruption_budgets():
    base = ["database.mode=cloudnativepg"]
    rendered = render.render(set_values=base, extra=CNPG)
    cluster = named(rendered, "Cluster", "gpu-booking-db")
    # The operator's PodDisruptionBudgets where there are replicas (3 by default).
    assert cluster["spec"]["enablePDB"] is True
    assert "backup" not in cluster["spec"]
    assert not [o for o in rendered if o["kind"] == "ScheduledBackup"]
    single = named(render.render(set_values=base + ["database.cloudnativepg.instances=1"], extra=CNPG),
                   "Cluster", "gpu-booking-db")
    assert single["spec"]["enablePDB"] is False, "a budget over one instance would block every drain"

    scheduled = base + ["database.cloudnativepg.backup.schedule=0 30 2 * * *",
                        "database.cloudnativepg.backup.method=volumeSnapshot",
                        "database.cloudnativepg.backup.configuration.volumeSnapshot.className=csi-snapshots"]
    rendered = render.render(set_values=scheduled, extra=CNPG)
    cluster = named(rendered, "Cluster", "gpu-booking-db")
    assert cluster["spec"]["backup"] == {"volumeSnapshot": {"className": "csi-snapshots"}}
    backup = named(rendered, "ScheduledBackup", "gpu-booking-db")
    assert backup["spec"] == {"schedule": "0 30 2 * * *", "method": "volumeSnapshot",
                              "backupOwnerReference": "none", "cluster": {"name": "gpu-booking-db"}}
    out = render.template(set_values=base + ["database.cloudnativepg.backup.schedule=0 30 2 * * *"],
                          extra=CNPG, check=False)
    assert out.returncode != 0 and "backup.configuration" in out.stderr


def policy_verdict(policy):
    """The policy's validations evaluated with cel-python: (old, new) -> the messages of
    those that fail."""
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()

    def run(expression, activation):
        return env.program(env.compile(expression)).evaluate(activation)

    def failed(old, new):
        act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
        variables = {}
        for v in policy["spec"].get("variables", []):
            act["variables"] = celpy.celtypes.MapType(variables)
            variables[celpy.celtypes.StringType(v["name"])] = run(v["expression"], act)
        act["variables"] = celpy.celtypes.MapType(variables)
        return [v["message"] for v in policy["spec"]["validations"] if not bool(run(v["expression"], act))]
    return failed


def node(labels=None, resources=None, conditions=None, taints=None):
    resources = {"cpu": "32", "nvidia.com/gpu": "4", **(resources or {})}
    return {"metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1", **(labels or {})}},
            "spec": {"taints": taints or [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": conditions or [{"type": "Ready", "status": "True"}]}}


def test_the_controllers_policies_evaluated():
    rendered = render.render()
    nodes = policy_verdict(named(rendered, "ValidatingAdmissionPolicy", "gpu-booking-controller-nodes"))
    status = policy_verdict(named(rendered, "ValidatingAdmissionPolicy", "gpu-booking-controller-node-status"))
    pods = policy_verdict(named(rendered, "ValidatingAdmissionPolicy", "gpu-booking-controller-pod-create"))
    old = node(labels={"model.gpu-booking.io/t4": "true"})
    ours = {"gpu-booking.io/model": "a100", "model.gpu-booking.io/a100": "true"}
    assert nodes(old, node(labels=ours)) == []
    assert nodes(node(labels=ours), node()) == [], "removing ours (the uninstall's cleanup)"
    assert nodes(old, node(labels={"node-role.kubernetes.io/control-plane": ""})) != []
    assert nodes(old, node(labels={"model.gpu-booking.io/t4": "true"}, taints=[{"key": "x", "effect": "NoSchedule"}])) != []
    budget = {"gpu-booking.io/gpumem": "160000"}
    assert status(node(), node(resources=budget)) == []
    assert status(node(resources=budget), node()) == []
    assert status(node(), node(resources={"nvidia.com/gpu": "8"})) != []
    # A node of several models: a budget per model with a resource of its own.
    per_model = {"gpu-booking.io/gpumem": "80896", "gpu-booking.io/gpumem-t4": "14848"}
    assert status(node(resources=budget), node(resources=per_model)) == []
    assert status(node(resources=per_model), node(resources=budget)) == []
    assert status(node(), node(resources={"gpu-booking.io/gpumemx": "1"})) != []
    assert status(node(), node(conditions=[{"type": "Ready", "status": "False"}])) != []

    def pod(**spec):
        return {"metadata": {"name": "jupyter-bob", "namespace": "jhub",
                             "annotations": {"gpu-booking.io/gpu-removed": "booking ended"}},
                "spec": {"containers": [{"name": "notebook", "image": "jupyter/base"}], **spec}}
    assert pods(None, pod()) == []
    assert pods(None, pod(priorityClassName="jhub-default-priority")) == [], "a lab's own class stays"
    lent = pod()
    lent["metadata"] = {"name": "jupyter-bob", "labels": {"gpu-booking.io/priority": "low", "gpu-booking.io/model": "a100"}}
    assert pods(None, lent) == []
    unmarked = pod()
    unmarked["metadata"]["annotations"] = {}
    assert len(pods(None, unmarked)) == 1
    for bad in [pod(hostPID=True), pod(volumes=[{"name": "r", "hostPath": {"path": "/"}}]),
                pod(volumes=[{"name": "s", "secret": {"secretName": "hub"}}]),
                pod(volumes=[{"name": "p", "projected": {"sources": [{"secret": {"name": "hub"}}]}}]),
                pod(serviceAccountName="hub"), pod(priorityClassName="gpu-booking-high"),
                pod(priorityClassName="system-node-critical"),
                pod(initContainers=[{"name": "x", "image": "y", "securityContext": {"privileged": True}}]),
                pod(containers=[{"name": "n", "image": "i", "envFrom": [{"secretRef": {"name": "hub"}}]}])]:
        assert len(pods(None, bad)) == 1, bad


def test_the_backup_script_dumps_and_keeps_the_newest(tmp_path):
    """The CronJob's script itself, run here against the local Postgres (the test
    database server, DATABASE_URL's): a whole custom-format dump appears under its
    final name, no partial file stays, and only the newest `keep` dumps remain."""
    import os
    import shutil
    import subprocess
    import urllib.parse

    if not shutil.which("pg_dump") or not shutil.which("pg_restore"):
        pytest.skip("pg_dump and pg_restore are not installed")
    url = urllib.parse.urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    cron = named(render.render(set_values=["database.embedded.backup.keep=2"]), "CronJob", "gpu-booking-backup")
    (c,) = pod_spec(cron)["containers"]
    backup, secrets = tmp_path / "backup", tmp_path / "secrets"
    backup.mkdir()
    secrets.mkdir()
    (secrets / "password").write_text(url.password or "")
    script = c["args"][0].replace("/var/run/secrets/gpu-booking/postgres", str(secrets)).replace("/backup", str(backup))
    env = {**os.environ, **{e["name"]: e["value"] for e in c["env"]},
           "PGHOST": url.hostname or "127.0.0.1", "PGPORT": str(url.port or 5432),
           "PGUSER": url.username or "postgres", "PGDATABASE": url.path.lstrip("/") or "postgres"}
    database = env["PGDATABASE"]
    for stale in (f"{database}-20260101T000000Z.dump", f"{database}-20260102T000000Z.dump",
                  f"{database}-20260103T000000Z.dump.partial"):
        (backup / stale).write_text("an older run's")
    result = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
    if result.returncode != 0 and ("connection to server" in result.stderr or "could not connect" in result.stderr):
        pytest.skip(f"no Postgres at {url.hostname}: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    left = sorted(p.name for p in backup.iterdir())
    assert len(left) == 2 and not any(n.endswith(".partial") for n in left), left
    assert left[0] == f"{database}-20260102T000000Z.dump", "the newest older dump stays, the oldest goes"
    fresh = backup / left[1]
    assert re.fullmatch(rf"{database}-\d{{8}}T\d{{6}}Z\.dump", fresh.name), fresh.name
    listing = subprocess.run(["pg_restore", "--list", str(fresh)], capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
