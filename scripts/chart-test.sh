#!/usr/bin/env bash
# The Helm chart's checks, with real helm:
#   1. helm lint --strict, with the default values and with every file in tests/chart/values/;
#   2. helm template of each of those (every TLS mode, every optional part on), and a
#      client-side dry-run install of each (NOTES.txt);
#   3. kubernetes-validate --strict of every rendered object for Kubernetes 1.30 and for
#      the newest version it knows (objects of CRDs it has no schema for are listed;
#      tests/chart checks their fields);
#   4. checkov on each rendered scenario in a directory of its own (its graph checks
#      join the objects of a whole directory: one scenario's NetworkPolicies would hide
#      another's pods without one), the checks it fails on purpose skipped with their
#      reasons in charts/gpu-booking/checkov-skips.yaml (tests/chart/checkov.py);
#   5. pytest tests/chart (promtool check rules / test rules in test_alerts.py): security defaults of every pod, no secret in the defaults,
#      every rendered option accepted by the real binary (when GPU_BOOKING_BIN is set),
#      the webhook configuration (its CEL matchConditions evaluated on real pods), the
#      TLS modes, RBAC, the values schema, and the README's values table.
# Tools are installed under target/chart-tools by scripts/chart-tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/chart-tools.sh
tools="$PWD/target/chart-tools"
export HELM="$tools/helm/helm"
py="$tools/venv/bin/python"
chart=charts/gpu-booking
out=target/chart-test
rm -rf "$out" && mkdir -p "$out"

"$HELM" version --short
"$HELM" lint --strict --quiet "$chart"
for values in tests/chart/values/*.yaml examples/jupyterhub/gpu-booking-values.yaml; do
  "$HELM" lint --strict --quiet "$chart" -f "$values"
done

"$py" tests/chart/render.py "$out"

# NOTES.txt is rendered only by install: a client-side dry run of each scenario.
"$HELM" install gpu-booking "$chart" -n gpu-booking --dry-run=client > /dev/null
for values in tests/chart/values/*.yaml examples/jupyterhub/gpu-booking-values.yaml; do
  "$HELM" install gpu-booking "$chart" -n gpu-booking --dry-run=client -f "$values" > /dev/null
done
echo "NOTES.txt renders in every scenario"

newest=$("$py" -c 'import kubernetes_validate.utils as u; print(u.latest_version())')
for version in 1.30.0 "$newest"; do
  echo "kubernetes-validate --strict -k $version"
  if ! "$tools/venv/bin/kubernetes-validate" --strict -k "$version" "$out"/*.yaml > "$out/validate-$version.log" 2>&1; then
    grep -v "^INFO" "$out/validate-$version.log" | grep -v "Couldn't find schema" || true
    echo "kubernetes-validate failed for $version"
    exit 1
  fi
  valid=$(grep -c "^INFO" "$out/validate-$version.log" || true)
  skipped=$(grep -o "for kind [A-Za-z]* with api version [^ ]*" "$out/validate-$version.log" | sort -u | sed 's/for kind \([A-Za-z]*\) with api version /\1 (/; s/$/)/' | paste -sd, - || true)
  echo "  $valid objects valid; no schema (CRDs): ${skipped:-none}"
done

"$py" tests/chart/checkov.py "$tools/checkov-venv/bin/checkov" "$out"

"$py" -m pytest -q -p no:cacheprovider tests/chart
