#!/usr/bin/env bash
# Property-based tests of the booking API from its own OpenAPI document:
# openapi-spec-validator on the document, then schemathesis against a running
# `gpu-booking api` on a fresh database, as a user, an admin and a service. Checks:
# no 5xx, every status and content type is one the document lists for the
# operation, every body matches its schema.
#
# Installs schemathesis and openapi-spec-validator into target/schemathesis-venv on
# first use. Needs Postgres (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/postgres,
# a role that may create databases) and the gpu-booking binary (GPU_BOOKING_BIN,
# default target/debug/gpu-booking). Bounded: API_FUZZ_EXAMPLES cases per operation
# and role (default 40), API_FUZZ_MAX_TIME seconds per role (default 60).
# schemathesis's "coverage" phase is left out: in 4.32.5 it stops with an internal
# hypothesis error ("AST constructor recursion depth mismatch") on this document.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${GPU_BOOKING_BIN:-$PWD/target/debug/gpu-booking}"
BASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
EXAMPLES="${API_FUZZ_EXAMPLES:-40}"
MAX_TIME="${API_FUZZ_MAX_TIME:-60}"
VENV="$PWD/target/schemathesis-venv"
SCHEMATHESIS_VERSION=4.32.5
VALIDATOR_VERSION=0.9.0

if [ ! -x "$VENV/bin/st" ] || [ ! -x "$VENV/bin/openapi-spec-validator" ]; then
  echo "api-fuzz: installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION" \
    "openapi-spec-validator==$VALIDATOR_VERSION"
fi
[ -x "$BIN" ] || { echo "api-fuzz: no binary at $BIN (cargo build -p gpu-booking)" >&2; exit 1; }

# A database of its own, dropped on exit.
DB="gpu_booking_fuzz_$$"
ADMIN_URL="${BASE_URL%/*}/postgres"
DB_URL="${BASE_URL%/*}/$DB"
psql -q "$ADMIN_URL" -c "CREATE DATABASE $DB"
WORK="$(mktemp -d)"
API_PID=""
cleanup() {
  if [ -n "$API_PID" ]; then kill "$API_PID" 2>/dev/null || true; wait "$API_PID" 2>/dev/null || true; fi
  psql -q "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
  rm -rf "$WORK"
}
trap cleanup EXIT

export GPU_BOOKING_JWT_SECRET
GPU_BOOKING_JWT_SECRET="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
DATABASE_URL="$DB_URL" "$BIN" api --listen "127.0.0.1:$PORT" >"$WORK/api.log" 2>&1 &
API_PID=$!
for _ in $(seq 1 300); do
  if curl -fsS "$URL/readyz" >/dev/null 2>&1; then break; fi
  kill -0 "$API_PID" 2>/dev/null || { cat "$WORK/api.log"; exit 1; }
  sleep 0.1
done
curl -fsS "$URL/readyz" >/dev/null

USER_TOKEN="$("$BIN" token --user alice@example.com)"
ADMIN_TOKEN="$("$BIN" token --user root --role admin)"
SERVICE_TOKEN="$("$BIN" token --user webhook --role service)"

# Something to find: a model with units, and a booking of alice's.
curl -fsS -X PUT "$URL/api/v1/models/a100" -H "Authorization: Bearer $ADMIN_TOKEN" \
  -H 'Content-Type: application/json' -d '{"units": 4, "patterns": ["*A100*"]}' >/dev/null
START="$(date -u -d '+2 days' +%Y-%m-%dT00:00:00Z)"
END="$(date -u -d '+4 days' +%Y-%m-%dT00:00:00Z)"
curl -fsS -X POST "$URL/api/v1/bookings" -H "Authorization: Bearer $USER_TOKEN" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"a100\", \"start\": \"$START\", \"end\": \"$END\"}" >/dev/null

curl -fsS "$URL/api/openapi.json" >"$WORK/openapi.json"
"$VENV/bin/openapi-spec-validator" "$WORK/openapi.json"

status=0
for role in user admin service; do
  case "$role" in
    user) token="$USER_TOKEN" ;;
    admin) token="$ADMIN_TOKEN" ;;
    service) token="$SERVICE_TOKEN" ;;
  esac
  echo "api-fuzz: schemathesis as $role ($EXAMPLES cases per operation, at most ${MAX_TIME}s)"
  "$VENV/bin/st" run "$WORK/openapi.json" --url "$URL" \
    -H "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --phases examples,fuzzing \
    --max-examples "$EXAMPLES" --max-time "$MAX_TIME" --workers 2 \
    --seed 1 --no-color --suppress-health-check all \
    --report junit --report-dir "target/api-fuzz/$role" || status=1
done
if [ "$status" != 0 ]; then
  echo "api-fuzz: FAILED (reports under target/api-fuzz; API log follows)" >&2
  tail -50 "$WORK/api.log" >&2
fi
exit "$status"
