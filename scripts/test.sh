#!/usr/bin/env bash
# The whole test suite: Rust tests on the real Postgres, the Helm chart's checks, then
# the browser tests.
# Needs Postgres on 127.0.0.1:5432 with trust auth (DATABASE_URL to use another).
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
# A one-off build gains nothing from the incremental cache, which is several GB of
# target/ (CI ran out of disk with it); a developer's own cargo commands keep it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# What each step took, so that a slow run says where its time went (CI stops at 40
# minutes).
began=$(date +%s)
last=$began
took() { # $1: the step just finished
  local now
  now=$(date +%s)
  echo "== $1: $((now - last)) s (all so far: $((now - began)) s)"
  last=$now
}

# The offline data of sqlx's checked queries (.sqlx/) against the queries and the
# migrations as they are: stale data fails here. (Builds never read DATABASE_URL's
# database: .cargo/config.toml sets SQLX_OFFLINE, so a query whose text changed
# without .sqlx/ fails to compile anywhere.)
./scripts/sqlx-prepare.sh --check
took "sqlx offline data checked"

# helm (and the chart checks' other tools) under target/chart-tools: the end-to-end
# scenarios install the chart as `helm template` renders it.
./scripts/chart-tools.sh
took "chart tools"

# The API's tokens against a real OIDC provider (npm oidc-provider, installed into
# tests/oidc/node_modules on first use), in the same run as every other test; without
# node the OIDC tests say they were skipped.
if ./scripts/oidc-test.sh --install; then
  export GPU_BOOKING_REQUIRE_OIDC_PROVIDER=1
fi
took "OIDC provider installed"

# A real JupyterHub (PyPI) for the tests that put the hub in the loop ("Sign in with
# JupyterHub"), installed under target/jupyterhub on first use.
if ./scripts/jupyterhub-tools.sh; then
  export GPU_BOOKING_REQUIRE_JUPYTERHUB=1
fi
took "JupyterHub installed"

started="$(date -u +'%Y-%m-%d %H:%M:%S+00')"
cargo test --workspace
took "cargo test --workspace"
# Every test passed (set -e), so sqlx should have dropped every test database. Its
# Pool::close can return while a connection is still on its way back to the pool
# (launchbadge/sqlx#3217); DROP DATABASE then fails and the database stays (seen:
# one in some runs, from tests whose last query ends as they return). Drop what this
# run left; a failed run keeps its databases for a look, as sqlx intends.
left_behind=$(psql "$DATABASE_URL" -Atqc \
  "SELECT db_name FROM _sqlx_test.databases WHERE created_at >= '$started'" 2>/dev/null || true)
for db in $left_behind; do
  echo "dropping the test database sqlx left: $db"
  psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" \
    -c "DELETE FROM _sqlx_test.databases WHERE db_name = '$db'" ||
    echo "could not drop $db" >&2
done
# Benchmarks are not run here (they print figures, they do not pass or fail) but must compile.
cargo check --workspace --all-targets
took "benchmarks compiled (cargo check)"

# helm lint/template, kubernetes-validate, and the rendered-manifest tests (installs
# helm and kubernetes-validate under target/chart-tools on first use); the binary
# checks that every option the chart renders is one it accepts.
cargo build -p gpu-booking
GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" ./scripts/chart-test.sh
took "chart checks"
# The OpenAPI document validated, then schemathesis against a running API as a user,
# an admin and a service (installs schemathesis under target/ on first use).
GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" ./scripts/api-fuzz.sh
took "API fuzzing (schemathesis)"

if [ -x tests/browser/run.sh ]; then
  cargo build -p gpu-booking
  GPU_BOOKING_BIN="$PWD/target/debug/gpu-booking" tests/browser/run.sh
  took "browser tests"
fi
