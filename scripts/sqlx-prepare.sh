#!/usr/bin/env bash
# Regenerates `.sqlx/`, the offline data of sqlx's query macros (`query!`, `query_as!`,
# `query_scalar!`), so that the workspace builds with no database (.cargo/config.toml
# sets SQLX_OFFLINE=true). Run it after changing a checked query or a migration.
#
#   scripts/sqlx-prepare.sh           # rewrite .sqlx/
#   scripts/sqlx-prepare.sh --check   # fail if .sqlx/ is not what the queries and migrations give
#
# How: a scratch database with the migrations applied (by psql: building the
# `migrate` command would itself need `.sqlx/`), then `cargo check` of every package
# that uses the macros, online (SQLX_OFFLINE=false) with SQLX_OFFLINE_DIR set, which
# makes each macro write its query's description there. Those packages are cleaned
# first so that every macro runs again; the rest of target/ is reused (a target folder
# of its own would check every dependency a second time: minutes in CI). The
# packages' outputs are the same online and offline, so later builds reuse them.
# No sqlx-cli needed.
#
# Needs Postgres with trust auth: the scratch database is created and dropped from
# SQLX_ADMIN_URL, else DATABASE_URL (only to connect to: nothing is written in it),
# else postgres://postgres@127.0.0.1:5432/postgres.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

admin_url="${SQLX_ADMIN_URL:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}"
scratch_db="gpu_booking_sqlx_prepare_$$"
scratch_url="${admin_url%/*}/$scratch_db"
out="$(mktemp -d)"

cleanup() {
  psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $scratch_db WITH (FORCE)" >/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $scratch_db"
for migration in migrations/*.sql; do
  psql "$scratch_url" -q -v ON_ERROR_STOP=1 --single-transaction -f "$migration" >/dev/null
done

# The workspace's packages whose sources use a checked query macro.
packages=()
while IFS=$'\t' read -r name dir; do
  if grep -rqE --include='*.rs' 'sqlx::query(_as|_scalar)?!' "$dir/src" "$dir/tests" "$dir/benches" 2>/dev/null; then
    packages+=("$name")
  fi
done < <(cargo metadata --no-deps --format-version 1 --offline |
  python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], p["manifest_path"].removesuffix("/Cargo.toml"), sep="\t")')
if [ "${#packages[@]}" -eq 0 ]; then
  echo "no package uses sqlx's query macros" >&2
  exit 1
fi

package_args=()
for p in "${packages[@]}"; do
  package_args+=(-p "$p")
done
cargo clean --quiet "${package_args[@]}"
SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$out" DATABASE_URL="$scratch_url" \
  cargo check --quiet --all-targets "${package_args[@]}"

if [ "$mode" = check ]; then
  if ! diff -r .sqlx "$out" >/dev/null 2>&1; then
    diff -r .sqlx "$out" | head -40 >&2 || true
    echo ".sqlx/ is stale: run scripts/sqlx-prepare.sh and commit .sqlx/" >&2
    exit 1
  fi
  echo ".sqlx/ is up to date ($(ls "$out" | wc -l) queries, packages: ${packages[*]})"
else
  rm -rf .sqlx
  mkdir .sqlx
  cp "$out"/query-*.json .sqlx/
  echo ".sqlx/ written: $(ls .sqlx | wc -l) queries (packages: ${packages[*]})"
fi
