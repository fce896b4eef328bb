"""Renders the chart with real helm, once per scenario (default values and each file
in tests/chart/values/), and writes or returns the manifests.

    python tests/chart/render.py OUT_DIR     # OUT_DIR/<scenario>.yaml for kubernetes-validate

HELM names the helm binary (default: helm on PATH).
"""

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-booking"
VALUES = Path(__file__).resolve().parent / "values"
JUPYTERHUB = ROOT / "examples" / "jupyterhub"
RELEASE = "gpu-booking"
NAMESPACE = "gpu-booking"
# The scenarios model a cluster with the Prometheus Operator's CRDs (the chart renders
# its PrometheusRule and ServiceMonitors only where they are served); `apis=()` models
# one without.
MONITORING_APIS = ("monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor")


def helm() -> str:
    return os.environ.get("HELM", "helm")


def scenarios() -> dict:
    """Scenario name -> list of values files (empty: the defaults)."""
    out = {"defaults": []}
    for f in sorted(VALUES.glob("*.yaml")):
        out[f.stem] = [f]
    # The documented JupyterHub pairing (examples/jupyterhub) is a scenario too.
    out["jupyterhub"] = [JUPYTERHUB / "gpu-booking-values.yaml"]
    return out


def template(values_files=(), set_values=(), check=True, extra=(), release=RELEASE,
             apis=MONITORING_APIS) -> subprocess.CompletedProcess:
    cmd = [helm(), "template", release, str(CHART), "--namespace", NAMESPACE, *extra]
    for api in apis:
        cmd += ["--api-versions", api]
    for f in values_files:
        cmd += ["-f", str(f)]
    for s in set_values:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def render(values_files=(), set_values=(), extra=(), release=RELEASE, apis=MONITORING_APIS) -> list:
    """The rendered objects, hooks included."""
    text = template(values_files, set_values, extra=extra, release=release, apis=apis).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, files in scenarios().items():
        result = template(files, check=False)
        if result.returncode != 0:
            sys.stderr.write(f"helm template failed for {name}:\n{result.stderr}")
            return 1
        (out / f"{name}.yaml").write_text(result.stdout)
        print(f"rendered {name}: {sum(1 for d in yaml.safe_load_all(result.stdout) if d)} objects")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
