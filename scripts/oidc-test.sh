#!/usr/bin/env bash
# The booking API's tokens against a real OpenID Connect provider (the npm package
# oidc-provider, run by tests/oidc/provider.mjs): installs it into tests/oidc/node_modules
# on first use (npm ci; afterwards it runs offline), then runs
# booking-api/tests/it/oidc_provider.rs, which fails if the provider cannot start.
# Skipped, with a message, only where node or npm is missing.
#   --install   only install the provider; exit 1 where node or npm is missing
#               (scripts/test.sh then runs the tests with the rest of the suite)
set -euo pipefail
cd "$(dirname "$0")/.."

install_only=false
[ "${1:-}" = --install ] && install_only=true
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "oidc-test: SKIPPED: node and npm are needed to run the OIDC provider (tests/oidc)" >&2
  if $install_only; then exit 1; fi
  exit 0
fi
if [ ! -d tests/oidc/node_modules/oidc-provider ]; then
  echo "oidc-test: installing oidc-provider into tests/oidc/node_modules"
  (cd tests/oidc && npm ci --no-audit --no-fund)
fi
if $install_only; then exit 0; fi
GPU_BOOKING_REQUIRE_OIDC_PROVIDER=1 cargo test -p gpu-booking-api --test it oidc_provider::
