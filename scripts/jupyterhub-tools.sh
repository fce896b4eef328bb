#!/usr/bin/env bash
# A real JupyterHub and KubeSpawner for the tests that put the hub in the loop
# (booking-api/tests/it/hub_login.rs: "Sign in with JupyterHub"), from PyPI, under
# target/jupyterhub/venv (kept between runs; reinstalled when the pins change).
# Exit 1, with a message, where Python cannot make a virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest releases on PyPI when pinned; z2jh's hub image runs the same.
HUB_REQUIREMENTS=(jupyterhub==6.1.1 jupyterhub-kubespawner==7.1.0)

dir=target/jupyterhub
if [ "$(cat "$dir/venv.stamp" 2>/dev/null)" != "${HUB_REQUIREMENTS[*]}" ] || [ ! -x "$dir/venv/bin/jupyterhub" ]; then
  if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "jupyterhub-tools: python3 with venv is needed for the real-JupyterHub tests" >&2
    exit 1
  fi
  echo "jupyterhub-tools: installing ${HUB_REQUIREMENTS[*]} into $dir/venv"
  rm -rf "$dir/venv"
  mkdir -p "$dir"
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "${HUB_REQUIREMENTS[@]}"
  echo "${HUB_REQUIREMENTS[*]}" > "$dir/venv.stamp"
fi
