#!/usr/bin/env bash
# The booking API's tokens against a real OpenID Connect provider (the npm package
# oidc-provider, run by tests/oidc/provider.mjs): installs it into tests/oidc/node_modules
# on first use (npm ci; afterwards it runs offline), then runs
# booking-api/tests/oidc_provider.rs, which fails if the provider cannot start.
# Skipped, with a message, only where node or npm is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "oidc-test: SKIPPED: node and npm are needed to run the OIDC provider (tests/oidc)" >&2
  exit 0
fi
if [ ! -d tests/oidc/node_modules/oidc-provider ]; then
  echo "oidc-test: installing oidc-provider into tests/oidc/node_modules"
  (cd tests/oidc && npm ci --no-audit --no-fund)
fi
GPU_BOOKING_REQUIRE_OIDC_PROVIDER=1 cargo test -p gpu-booking-api --test it oidc_provider::
