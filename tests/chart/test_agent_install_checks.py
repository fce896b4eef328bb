"""The node agent's install checks against a cluster: `helm template --dry-run=server`
(Helm's `lookup` answers there, as in `helm install`) against the simulated lab's
Kubernetes API, which `gpu-booking demo` serves over HTTPS with a kubeconfig. A
namespace whose Pod Security level refuses hostPID, or a RuntimeClass the cluster does
not have, stops the install with the reason instead of a DaemonSet whose pods are
refused one by one.

Needs GPU_BOOKING_BIN (the `gpu-booking` binary), kubectl from scripts/chart-tools.sh
psql and Postgres (DATABASE_URL's server: a database of the test's own); skipped without
them."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import render

BIN = os.environ.get("GPU_BOOKING_BIN")
KUBECTL = render.ROOT / "target" / "chart-tools" / "kubectl" / "kubectl"
ADMIN_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
AGENT_FAILURE = "execution error at (gpu-booking/templates/agent.yaml"

pytestmark = pytest.mark.skipif(
    not BIN or not KUBECTL.exists() or shutil.which("psql") is None,
    reason="GPU_BOOKING_BIN, kubectl (scripts/chart-tools.sh) and psql are needed",
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The demo's lab; yields the environment that points kubectl and helm at it."""
    tmp = tmp_path_factory.mktemp("lab")
    database = f"gpu_booking_chart_lab_{os.getpid()}"
    subprocess.run(["psql", ADMIN_URL, "-q", "-c", f"CREATE DATABASE {database}"], check=True)
    args = [BIN, "demo", "--cert-dir", str(tmp / "certs"),
            "--database-url", f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}"]
    for flag in ("--listen", "--webhook-listen", "--webhook-admin-listen", "--apiserver-listen"):
        args += [flag, f"127.0.0.1:{free_port()}"]
    log = (tmp / "demo.log").open("w")
    demo = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    kube_env = {**os.environ, "KUBECONFIG": str(tmp / "certs" / "kubeconfig"), "HOME": str(tmp)}
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([str(KUBECTL), "get", "namespace", render.NAMESPACE], env=kube_env,
                             capture_output=True).returncode != 0:
            assert demo.poll() is None, (tmp / "demo.log").read_text()
            assert time.monotonic() < deadline, "the demo's API server did not come up"
            time.sleep(1)
        yield kube_env
    finally:
        demo.terminate()
        try:
            demo.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # Not stopped within 10 s: killed (nothing of it is kept).
            demo.kill()
            demo.wait()
        log.close()
        subprocess.run(["psql", ADMIN_URL, "-q", "-c", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"],
                       check=False)


def label_namespace(env, level):
    subprocess.run([str(KUBECTL), "label", "namespace", render.NAMESPACE, "--overwrite",
                    f"pod-security.kubernetes.io/enforce={level}"], env=env, check=True, capture_output=True)


def server_render(env, *set_values):
    # The demo's lab has the PriorityClasses of its own install.
    cmd = [render.helm(), "template", render.RELEASE, str(render.CHART), "--namespace", render.NAMESPACE,
           "--dry-run=server", "--disable-openapi-validation", "--set", "priorityClasses.create=false"]
    for s in set_values:
        cmd += ["--set", s]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def test_a_pod_security_level_that_refuses_hostpid_stops_the_install(cluster):
    for level in ("baseline", "restricted"):
        label_namespace(cluster, level)
        result = server_render(cluster, "agent.runtimeClassName=")
        assert result.returncode != 0
        assert f'enforces Pod Security level "{level}", which refuses the node agent' in result.stderr
        assert "pod-security.kubernetes.io/enforce=privileged" in result.stderr
    # The agent off: nothing to refuse.
    assert AGENT_FAILURE not in server_render(cluster, "agent.enabled=false").stderr


def test_a_missing_runtime_class_stops_the_install(cluster):
    label_namespace(cluster, "privileged")
    result = server_render(cluster)
    assert result.returncode != 0
    assert 'this cluster has no RuntimeClass "nvidia"' in result.stderr, result.stderr
    # The node's default runtime (no class) and a privileged namespace: the agent's
    # checks pass (whatever else the simulated cluster cannot take).
    assert AGENT_FAILURE not in server_render(cluster, "agent.runtimeClassName=").stderr
