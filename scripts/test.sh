#!/usr/bin/env bash
# The whole test suite: Rust tests on the real Postgres, the Helm chart's checks, then
# the browser tests.
# Needs Postgres on 127.0.0.1:5432 with trust auth (DATABASE_URL to use another).
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

# The offline data of sqlx's checked queries (.sqlx/) against the queries and the
# migrations as they are: stale data fails here. (Builds never read DATABASE_URL's
# database: .cargo/config.toml sets SQLX_OFFLINE, so a query whose text changed
# without .sqlx/ fails to compile anywhere.)
./scripts/sqlx-prepare.sh --check

cargo test --workspace
# The API's tokens against a real OIDC provider (npm oidc-provider, installed into
# tests/oidc/node_modules on first use; skipped with a message without node).
./scripts/oidc-test.sh
# Benchmarks are not run here (they print figures, they do not pass or fail) but must compile.
cargo check --workspace --all-targets

# helm lint/template, kubernetes-validate, and the rendered-manifest tests (installs
# helm and kubernetes-validate under target/chart-tools on first use); the binary
# checks that every option the chart renders is one it accepts.
cargo build -p gpu-booking
GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" ./scripts/chart-test.sh
# The OpenAPI document validated, then schemathesis against a running API as a user,
# an admin and a service (installs schemathesis under target/ on first use).
GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" ./scripts/api-fuzz.sh

if [ -x tests/browser/run.sh ]; then
  cargo build -p gpu-booking
  GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" tests/browser/run.sh
fi
