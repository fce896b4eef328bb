#!/usr/bin/env bash
# What each guarantee of a booking create costs (issue 17), measured with pgbench on
# the statements the service sends for a create (store::bookings::create_locked:
# `booking_lock_and_read`, then the one statement that writes the user, the booking
# and its audit row), taking one guarantee away at a time, against a bare one-row
# INSERT transaction in the same run. Not a test: it prints transactions/s, latency
# and the ratios.
#
#   scripts/create-cost.sh [seconds per variant, default 10] [clients, default 32]
#
# Each transaction books a new user (as the history bench does) on one of 40 models
# for 1 to 3 days starting at a random hour of the next year. The unit is new for
# each booking (a sequence), so no create is refused: what is measured is the cost
# of deciding and writing, not of refusing. The creates decide against a history of
# 100,000 bookings (scripts/load-history.sql; CREATE_COST_HISTORY to change it), to
# which each variant adds its own. The variants run in this order, and each
# keeps the guarantees the ones before it took away, except where it says:
#   bare        BEGIN; INSERT one row of three columns; COMMIT
#   create      the service's statements: every guarantee
#   async       the full create with synchronous_commit off (a created booking may be
#               lost in a crash of the database), beside `bare` with it off
#   no-audit    without the audit row (the audit trail of every create)
#   no-days     also without the units per model and day (booking_day_units: the
#               bound that /schedulability and /me/next-start read first)
#   no-changes  also without the change-log trigger (what the controller and the
#               webhook's replica follow)
#   no-locks    also without the locks and reads (the decision: user and capacity
#               rules under the user's lock and the window's day locks)
#   no-excl     also without the two exclusion constraints (the backstop)
#
# KEEP=1 keeps the pgbench scripts, outputs and logs in the folder it prints.
#
# Needs Postgres with trust auth and pgbench (Debian: postgresql-15, in
# /usr/lib/postgresql/15/bin). A scratch database is created and dropped from
# SQLX_ADMIN_URL, else DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-10}"
clients="${2:-32}"
history="${CREATE_COST_HISTORY:-100000}"
admin_url="${SQLX_ADMIN_URL:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}"
scratch_db="gpu_booking_create_cost_$$"
scratch_url="${admin_url%/*}/$scratch_db"
work="$(mktemp -d)"
if [ -n "${KEEP:-}" ]; then
  echo "pgbench scripts, outputs and logs: $work"
fi
pgbench="$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | sort -V | tail -1)"
if [ -z "$pgbench" ]; then
  echo "pgbench not found (Debian: apt-get install postgresql)" >&2
  exit 1
fi

cleanup() {
  psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $scratch_db WITH (FORCE)" >/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $scratch_db"
for migration in migrations/*.sql; do
  psql "$scratch_url" -q -v ON_ERROR_STOP=1 --single-transaction -f "$migration" >/dev/null
done
psql "$scratch_url" -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE TABLE bench_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v bigint NOT NULL, at timestamptz NOT NULL);
-- New bookings take units above the history's (35 per model).
CREATE SEQUENCE bench_slot START 1000;
INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
SELECT format('pg-%s', lpad(m::text, 2, '0')), m, 1000000000, '{}', 1024, now(), now()
FROM generate_series(0, 39) AS m;
SQL
# A history to decide against, with the planner's statistics of a running system:
# on a table whose statistics say it is empty, the generic plan of the capacity read
# took the user constraint's index for a search by period alone (4.4 against 0.2
# ms per read with 20,000 bookings), which a running system's autoanalyze corrects.
PGOPTIONS="-c gpu_booking_load.bookings=$history -c gpu_booking_load.users=$((history / 10)) -c gpu_booking_load.model_prefix=pg -c gpu_booking_load.user_prefix=q" \
  psql "$scratch_url" -q -v ON_ERROR_STOP=1 -f scripts/load-history.sql >/dev/null

cat >"$work/bare.sql" <<'SQL'
\set v random(1, 1000000)
BEGIN;
INSERT INTO bench_row (v, at) VALUES (:v, now());
END;
SQL

# The create's two statements, as in store::bookings::create_locked; the parameters
# are the ones the service would bind (the slugs and label keys of a plain name are
# the name itself).
create_script() { # $1: with the locks and reads (1/0), $2: with the audit row (1/0)
  cat <<'SQL'
\set u random(1, 4611686018427387903)
\set m random(0, 39)
\set h random(1, 8760)
\set d random(1, 3)
BEGIN;
SQL
  if [ "$1" = 1 ]; then
    cat <<'SQL'
SELECT * FROM booking_lock_and_read('pgb' || :u, 'pg-' || lpad(:m::text, 2, '0'), date_trunc('hour', now()) + make_interval(hours => :h), date_trunc('hour', now()) + make_interval(hours => :h, days => :d));
SQL
  fi
  local audited=""
  if [ "$2" = 1 ]; then
    audited=", audited AS (INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details) SELECT now(), 'pgb' || :u, 'booking.create', 'pg-' || lpad(:m::text, 2, '0'), 'pgb' || :u, id, jsonb_build_object('start', start_at, 'end', end_at, 'slot', slot, 'units', units, 'slots', slots) FROM created)"
  fi
  cat <<SQL
WITH known AS (INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ('pgb' || :u, 'pgb' || :u, 'pgb' || :u) ON CONFLICT (name) DO NOTHING RETURNING name), keys AS (INSERT INTO user_key (key, user_name) SELECT k, known.name FROM known, unnest(ARRAY['pgb' || :u]) AS k), created AS (INSERT INTO booking (user_name, model, slots, units, start_at, end_at, booked_end_at, override, created_by, created_at, updated_at) VALUES ('pgb' || :u, 'pg-' || lpad(:m::text, 2, '0'), ARRAY[nextval('bench_slot')::integer], 1, date_trunc('hour', now()) + make_interval(hours => :h), date_trunc('hour', now()) + make_interval(hours => :h, days => :d), date_trunc('hour', now()) + make_interval(hours => :h, days => :d), false, 'pgb' || :u, now(), now()) RETURNING *)$audited SELECT id, user_name, model, slot, units, slots, start_at, end_at, booked_end_at, cancelled_at, ended_early_at, override, created_at FROM created;
END;
SQL
}
create_script 1 1 >"$work/create.sql"
create_script 1 0 >"$work/no-audit.sql"
create_script 0 0 >"$work/no-locks.sql"

declare -A tps p50 p99
run() { # $1: name, $2: script, further: extra options for PGOPTIONS
  local name="$1" script="$2"
  shift 2
  rm -f "$work"/log.*
  psql "$scratch_url" -q -c "CHECKPOINT" >/dev/null
  PGOPTIONS="${*:-}" "$pgbench" -n -M prepared -c "$clients" -j 2 -T "$secs" \
    -f "$work/$script" -l --log-prefix="$work/log" "$scratch_url" >"$work/$name.out" 2>&1 || {
    cat "$work/$name.out" >&2
    exit 1
  }
  tps[$name]=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$work/$name.out" | head -1)
  # Per-transaction log: the third column is the latency in microseconds.
  read -r p50[$name] p99[$name] < <(cat "$work"/log.* | awk '{print $3}' | sort -n |
    awk '{a[NR]=$1} END {printf "%.2f %.2f\n", a[int(NR*0.5)+1]/1000, a[int(NR*0.99)+1]/1000}')
  printf '%-12s %9.0f tx/s  p50 %6.2f ms  p99 %6.2f ms\n' "$name" "${tps[$name]}" "${p50[$name]}" "${p99[$name]}"
}

echo "== $clients clients, ${secs}s each, $(psql "$scratch_url" -Atc 'SHOW server_version')"
# A first, unreported pass warms the caches (catalog, plans, the tables' pages), so
# that the first variant is not measured cold.
run warm-up create.sql >/dev/null
run bare bare.sql
run create create.sql
run bare-async bare.sql -c synchronous_commit=off
run async create.sql -c synchronous_commit=off
run no-audit no-audit.sql
psql "$scratch_url" -q -c "ALTER TABLE booking DISABLE TRIGGER booking_day_units_insert"
run no-days no-audit.sql
psql "$scratch_url" -q -c "ALTER TABLE booking DISABLE TRIGGER booking_change_after"
run no-changes no-audit.sql
run no-locks no-locks.sql
psql "$scratch_url" -q -c "ALTER TABLE booking DROP CONSTRAINT booking_slot_excl, DROP CONSTRAINT booking_user_excl"
run no-excl no-locks.sql
echo
echo "== ratios (x bare INSERT of the same run; the step is what the guarantee taken away cost)"
prev=""
for name in create no-audit no-days no-changes no-locks no-excl; do
  ratio=$(awk -v a="${tps[$name]}" -v b="${tps[bare]}" 'BEGIN {printf "%.2f", a / b}')
  if [ -n "$prev" ]; then
    step=$(awk -v a="${tps[$name]}" -v b="${tps[$prev]}" 'BEGIN {printf "%.2f", a / b}')
    echo "$name: $ratio x bare; $step x $prev"
  else
    echo "$name: $ratio x bare"
  fi
  prev="$name"
done
echo "async: $(awk -v a="${tps[async]}" -v b="${tps[bare-async]}" 'BEGIN {printf "%.2f", a / b}') x bare-async; $(awk -v a="${tps[async]}" -v b="${tps[create]}" 'BEGIN {printf "%.2f", a / b}') x create"
