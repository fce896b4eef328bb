"""`helm upgrade` from the chart before it installed with no manual step (commit
d911c8f, where the operator made the Secret `gpu-booking` and ran an external
database): rendering both and
comparing what the workloads read shows that the documented upgrade values keep the
certificates, the secrets and the data, and that upgrading on the new defaults alone
would not (docs/deploy.md, "Upgrading")."""

import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

import render
from test_chart import pod_spec
from test_install import references

PREVIOUS = "d911c8f"
UPGRADE_VALUES = ["secrets.existingSecret=gpu-booking", "database.mode=external",
                  "auth.serviceAccountTokens.enabled=false"]


def previous_chart(tmp: Path) -> Path:
    archive = tmp / "chart.tar"
    result = subprocess.run(["git", "-C", str(render.ROOT), "archive", "-o", str(archive), PREVIOUS, "charts/gpu-booking"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} not in this checkout: {result.stderr.strip()}")
    with tarfile.open(archive) as t:
        t.extractall(tmp)
    return tmp / "charts" / "gpu-booking"


def reads(rendered):
    """What each long-running workload reads: (workload, kind, name, key)."""
    out = set()
    for o in rendered:
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            for kind, name, key in references(pod_spec(o)):
                out.add((o["metadata"]["name"], kind, name, key))
    return out


def database_source(rendered):
    (api,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")]
    spec = pod_spec(api)
    for e in spec["containers"][0].get("env", []):
        if e["name"] == "DATABASE_URL":
            return tuple(e["valueFrom"]["secretKeyRef"].values())
    mount = [v for v in spec["volumes"] if v["name"] == "database-url"][0]["secret"]
    return (mount["secretName"], mount["items"][0]["key"])


def test_upgrading_with_the_documented_values_keeps_certificates_secrets_and_data():
    with tempfile.TemporaryDirectory() as tmp:
        chart = previous_chart(Path(tmp))
        before_text = subprocess.run([render.helm(), "template", render.RELEASE, str(chart), "-n", render.NAMESPACE],
                                     capture_output=True, text=True, check=True).stdout
    before = [d for d in yaml.safe_load_all(before_text) if d]
    after = render.render(set_values=UPGRADE_VALUES)
    # The same database, from the same Secret and key.
    assert database_source(after) == database_source(before) == ("gpu-booking", "database-url")
    # Everything the old workloads read, the new ones read too (certificates, the
    # JWT secret, the service token): nothing is re-generated or re-named.
    lost = {r for r in reads(before) if r not in reads(after)}
    assert lost == set(), lost
    assert not [o for o in after if o["kind"] in ("StatefulSet", "PersistentVolumeClaim")]
    # On the new defaults alone the API would read another database: hence the values.
    assert database_source(render.render()) != database_source(before)
