#!/usr/bin/env bash
# Browser tests of the booking page: Debian's Chromium, driven by playwright-core,
# against `gpu-booking demo` (the real API) on a fresh database of the Postgres at
# ${PGHOST:-127.0.0.1}:5432. Builds nothing: expects target/debug/gpu-booking
# (cargo build -p gpu-booking) or GPU_BOOKING_BIN. The files run one after the other
# (they share the demo). Screenshots go to
# artifacts/screenshots/, the server's log to artifacts/browser-demo.log.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${GPU_BOOKING_BIN:-$root/target/debug/gpu-booking}"
pghost="${PGHOST:-127.0.0.1}"
artifacts="$root/artifacts"

if [ ! -x "$bin" ]; then
  echo "run.sh: no $bin; build it first (cargo build -p gpu-booking) or set GPU_BOOKING_BIN" >&2
  exit 2
fi

# Debian's Chromium, never a browser a tool downloads.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "run.sh: installing Debian's chromium" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends chromium >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; }
  else
    echo "run.sh: /usr/bin/chromium is missing (apt-get install chromium, as root)" >&2
    exit 2
  fi
fi

if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

psql_admin() { psql -h "$pghost" -p 5432 -U postgres -d postgres -v ON_ERROR_STOP=1 -qAtc "$1"; }

db="gpu_booking_browser_$$_$(date +%s)"
psql_admin "CREATE DATABASE $db" >/dev/null
# Free ports for everything the demo listens on, so that runs can overlap.
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
port="$(free_port)"
demo_args=(--listen "127.0.0.1:$port")
scratch="$(mktemp -d)"
if "$bin" demo --help | grep -q -- '--webhook-listen'; then
  demo_args+=(--webhook-listen "127.0.0.1:$(free_port)" --webhook-admin-listen "127.0.0.1:$(free_port)" --cert-dir "$scratch/certs")
fi
# The page's tests drive a lab that stays as seeded; the demo's scene (a booking that
# takes a lent A100 back, then an offer) is tested by tests/it/demo_newcomer.rs.
if "$bin" demo --help | grep -q -- '--no-scene'; then
  demo_args+=(--no-scene)
fi
if "$bin" demo --help | grep -q -- '--apiserver-listen'; then
  demo_args+=(--apiserver-listen "127.0.0.1:$(free_port)")
fi

mkdir -p "$artifacts/screenshots"
log="$artifacts/browser-demo.log"
DATABASE_URL="postgres://postgres@$pghost:5432/$db" "$bin" demo "${demo_args[@]}" >"$log" 2>&1 &
server=$!

cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$scratch"
  if [ -z "${KEEP_DB:-}" ]; then
    psql_admin "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# The demo prints its tokens once it has migrated, seeded and started listening.
for _ in $(seq 1 300); do
  grep -q 'Ctrl-C stops it' "$log" && break
  if ! kill -0 "$server" 2>/dev/null; then
    echo "run.sh: gpu-booking demo exited:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
token() { sed -n "s/^ *$1 token *([^)]*): *\([^ ]*\)$/\1/p" "$log" | head -n1; }
user_token="$(token user)"
admin_token="$(token admin)"
if [ -z "$user_token" ] || [ -z "$admin_token" ]; then
  echo "run.sh: gpu-booking demo printed no tokens within 30 s; its output:" >&2
  cat "$log" >&2
  exit 1
fi

cd "$here"
BASE_URL="http://127.0.0.1:$port" USER_TOKEN="$user_token" ADMIN_TOKEN="$admin_token" \
  REPO_ROOT="$root" GPU_BOOKING_BIN="$bin" PGHOST="$pghost" \
  SCREENSHOT_DIR="$artifacts/screenshots" CHROMIUM=/usr/bin/chromium \
  node --test --test-concurrency=1 --test-reporter=spec --test-timeout=120000 ${BROWSER_TESTS:-*.test.mjs}
