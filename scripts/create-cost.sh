#!/usr/bin/env bash
# What each guarantee of a booking create costs, measured with pgbench on
# the statements the service sends for a create (store::bookings::create_locked:
# `booking_lock_and_read_batch`, then insert_created, the one statement that writes
# the users, the bookings and their audit rows), taking one guarantee away at a time,
# against a bare one-row INSERT transaction in the same run; and the same creates in
# the batches that the API's create queue makes of creates that meet. Not a test: it
# prints transactions/s, latency and the ratios.
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
#   batch4,     every guarantee, 4 (8) creates a transaction at a quarter (an
#   batch8      eighth) of the clients: as many creates in flight as `create`
#   no-audit    without the audit row (the audit trail of every create)
#   no-days     also without the units per model and day (booking_day_units: the
#               bound that /schedulability and /me/next-start read first)
#   no-changes  also without the change-log trigger (what the controller and the
#               webhook's replica follow)
#   no-locks    also without the locks and reads (the decision: user and capacity
#               rules under the user's lock and the window's day locks)
#   no-excl     also without the two exclusion constraints (the backstop) and the
#               trigger that writes the slot constraint's rows
#
# KEEP=1 keeps the pgbench scripts, outputs and logs in the folder it prints.
#
# CREATE_COST_AGAINST_EMPTY=1: what the history costs each guarantee. A second
# scratch database gets the same models and no history, and every variant runs on
# both in turn (the order swapped from one variant to the next), so that each
# variant's loaded / empty ratio is taken minutes, not a run, apart. Both have the
# ended bookings archived, as the API's job (`--archive-after`) leaves them, and the
# exclusion constraints' indexes rebuilt after that one large pass (docs/deploy.md).
#
# CREATE_COST_INDEX_IO=1 (with CREATE_COST_AGAINST_EMPTY=1): instead of the
# variants, where the history's cost lies. The full create runs on both databases
# in turn, each time from reset statistics, and for every table and index the
# buffer accesses (hits and reads, `pg_statio_user_*`) per create are printed,
# with the history's, the empty database's and their difference, largest first.
# Counts of pages touched do not depend on the machine's load, as rates do.
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
# The databases, each with its history: `history` always, `empty` to compare.
declare -A history_of=([history]="$history")
dbs=(history)
if [ "${CREATE_COST_AGAINST_EMPTY:-0}" = 1 ]; then
  history_of[empty]=0
  dbs+=(empty)
fi
declare -A url
for db in "${dbs[@]}"; do
  url[$db]="${admin_url%/*}/gpu_booking_create_cost_${db}_$$"
done
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
  for db in "${dbs[@]}"; do
    psql "$admin_url" -q -c "DROP DATABASE IF EXISTS ${url[$db]##*/} WITH (FORCE)" >/dev/null || true
  done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

setup() { # $1: database (a key of url)
  local db_url="${url[$1]}" n="${history_of[$1]}"
  psql "$admin_url" -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE ${db_url##*/}"
  for migration in migrations/*.sql; do
    psql "$db_url" -q -v ON_ERROR_STOP=1 --single-transaction -f "$migration" >/dev/null
  done
  psql "$db_url" -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE TABLE bench_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v bigint NOT NULL, at timestamptz NOT NULL);
-- New bookings take units above the history's (35 per model).
CREATE SEQUENCE bench_slot START 1000;
INSERT INTO gpu_model (name, position, units, patterns, gpumem_mib, created_at, updated_at)
SELECT format('pg-%s', lpad(m::text, 2, '0')), m, 1000000000, '{}', 1024, now(), now()
FROM generate_series(0, 39) AS m;
SQL
  # A history to decide against, with the planner's statistics of a running system:
  # on a table whose statistics say it is empty, the generic plan of the capacity
  # read took the user constraint's index for a search by period alone (4.4 against
  # 0.2 ms per read with 20,000 bookings), which a running system's autoanalyze
  # corrects.
  if [ "$n" -gt 0 ]; then
    PGOPTIONS="-c gpu_booking_load.bookings=$n -c gpu_booking_load.users=$((n / 10)) -c gpu_booking_load.model_prefix=pg -c gpu_booking_load.user_prefix=q" \
      psql "$db_url" -q -v ON_ERROR_STOP=1 -f scripts/load-history.sql >/dev/null
  fi
  if [ "${CREATE_COST_AGAINST_EMPTY:-0}" = 1 ]; then
    # As an upgrade with history leaves it after docs/deploy.md's VACUUM and REINDEX
    # (the history bench does the same): archived in one pass, the constraints'
    # indexes would otherwise keep the emptied pages of the archived bookings.
    psql "$db_url" -q -v ON_ERROR_STOP=1 -c "SELECT booking_archive_pass(now(), 2000000000)" >/dev/null
    psql "$db_url" -q -v ON_ERROR_STOP=1 -c "VACUUM ANALYZE" \
      -c "REINDEX INDEX booking_slot_excl" -c "REINDEX INDEX booking_user_excl" >/dev/null
  fi
}
for db in "${dbs[@]}"; do
  setup "$db"
done

cat >"$work/bare.sql" <<'SQL'
\set v random(1, 1000000)
BEGIN;
INSERT INTO bench_row (v, at) VALUES (:v, now());
END;
SQL

# The create's two statements, as in store::bookings::create_locked and
# insert_created (a batch of `k` creates: the API's create queue batches the creates
# that meet); the parameters are the ones the service would bind (the slugs and label
# keys of a plain name are the name itself).
create_script() { # $1: creates per transaction, $2: with the locks and reads (1/0), $3: with the audit row (1/0)
  local k="$1" i sep="" users="" models="" starts="" ends="" own_from=""
  for i in $(seq 1 "$k"); do
    cat <<SQL
\set u$i random(1, 4611686018427387903)
\set m$i random(0, 39)
\set h$i random(1, 8760)
\set d$i random(1, 3)
SQL
    users+="$sep'pgb' || :u$i"
    models+="$sep'pg-' || lpad(:m$i::text, 2, '0')"
    starts+="${sep}date_trunc('hour', now()) + make_interval(hours => :h$i)"
    ends+="${sep}date_trunc('hour', now()) + make_interval(hours => :h$i, days => :d$i)"
    # The user's bookings that can matter: from the start (later than now) less
    # the default cooldown (rules::own_bookings_from).
    own_from+="${sep}date_trunc('hour', now()) + make_interval(hours => :h$i, days => -14)"
    sep=", "
  done
  echo "BEGIN;"
  if [ "$2" = 1 ]; then
    echo "SELECT * FROM booking_lock_and_read_batch(ARRAY[$users], ARRAY[$models], ARRAY[$starts], ARRAY[$ends], ARRAY[$own_from]);"
  fi
  local audited=""
  if [ "$3" = 1 ]; then
    audited=", audited AS (INSERT INTO audit_event (at, actor, action, subject, user_name, booking_id, details) SELECT created_at, created_by, 'booking.create', model, user_name, id, jsonb_build_object('start', start_at, 'end', end_at, 'slot', slot, 'units', units, 'slots', slots) FROM created)"
  fi
  cat <<SQL
WITH r AS (SELECT * FROM unnest(ARRAY[$users], ARRAY[$models], ARRAY[$starts], ARRAY[$ends]) WITH ORDINALITY AS r(user_name, model, start_at, end_at, i)), known AS (INSERT INTO app_user (name, escape_slug, safe_slug) SELECT DISTINCT ON (user_name) user_name, user_name, user_name FROM r ORDER BY user_name, i ON CONFLICT (name) DO NOTHING RETURNING name, id), keys AS (INSERT INTO user_key (key, user_name) SELECT name, name FROM known), created AS (INSERT INTO booking (user_name, user_id, model, slots, units, start_at, end_at, booked_end_at, override, created_by, created_at, updated_at) SELECT r.user_name, COALESCE(known.id, (SELECT u.id FROM app_user u WHERE u.name = r.user_name)), model, ARRAY[nextval('bench_slot')::integer], 1, start_at, end_at, end_at, false, r.user_name, now(), now() FROM r LEFT JOIN known ON known.name = r.user_name ORDER BY i RETURNING *)$audited SELECT c.id, c.user_name, c.model, c.slot, c.units, c.slots, c.start_at, c.end_at, c.booked_end_at, c.cancelled_at, c.ended_early_at, c.override, c.created_at FROM created c JOIN r ON r.user_name = c.user_name AND r.start_at = c.start_at ORDER BY r.i;
END;
SQL
}
create_script 1 1 1 >"$work/create.sql"
create_script 1 1 0 >"$work/no-audit.sql"
create_script 1 0 0 >"$work/no-locks.sql"
create_script 4 1 1 >"$work/batch4.sql"
create_script 8 1 1 >"$work/batch8.sql"

declare -A tps p50 p99
# The figures of the first database (`history`) are tps[name]; those of `empty`,
# tps[empty/name].
turn=0
run() { # $1: name, $2: script, further: extra options for PGOPTIONS
  local name="$1" script="$2" order=("${dbs[@]}")
  shift 2
  # With two databases, which goes first alternates from one variant to the next.
  if [ $((turn++ % 2)) = 1 ] && [ "${#dbs[@]}" = 2 ]; then
    order=("${dbs[1]}" "${dbs[0]}")
  fi
  for db in "${order[@]}"; do
    local key="$name"
    [ "$db" = history ] || key="$db/$name"
    rm -f "$work"/log.*
    psql "${url[$db]}" -q -c "CHECKPOINT" >/dev/null
    PGOPTIONS="${*:-}" "$pgbench" -n -M prepared -c "${CLIENTS:-$clients}" -j 2 -T "$secs" \
      -f "$work/$script" -l --log-prefix="$work/log" "${url[$db]}" >"$work/$db-$name.out" 2>&1 || {
      cat "$work/$db-$name.out" >&2
      exit 1
    }
    tps[$key]=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$work/$db-$name.out" | head -1)
    # Per-transaction log: the third column is the latency in microseconds.
    read -r p50[$key] p99[$key] < <(cat "$work"/log.* | awk '{print $3}' | sort -n |
      awk '{a[NR]=$1} END {printf "%.2f %.2f\n", a[int(NR*0.5)+1]/1000, a[int(NR*0.99)+1]/1000}')
    printf '%-18s %9.0f tx/s  p50 %6.2f ms  p99 %6.2f ms\n' "$key" "${tps[$key]}" "${p50[$key]}" "${p99[$key]}"
  done
}
everywhere() { # $1: SQL, run in every database
  for db in "${dbs[@]}"; do
    psql "${url[$db]}" -q -v ON_ERROR_STOP=1 -c "$1"
  done
}

echo "== $clients clients, ${secs}s each, $(psql "${url[history]}" -Atc 'SHOW server_version')"
# A first, unreported pass warms the caches (catalog, plans, the tables' pages), so
# that the first variant is not measured cold.
run warm-up create.sql >/dev/null
if [ "${CREATE_COST_INDEX_IO:-0}" = 1 ]; then
  [ "${#dbs[@]}" = 2 ] || { echo "CREATE_COST_INDEX_IO needs CREATE_COST_AGAINST_EMPTY=1" >&2; exit 2; }
  declare -A pages creates
  for round in 1 2; do
    for db in "${dbs[@]}"; do
      # Creates counted by the units they took (one each, from a sequence): a
      # count(*) of the table would itself add its pages to the statistics.
      before=$(psql "${url[$db]}" -Atc "SELECT last_value FROM bench_slot")
      psql "${url[$db]}" -q -c "SELECT pg_stat_reset()" >/dev/null
      "$pgbench" -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$work/create.sql" "${url[$db]}" >"$work/$db-io.out" 2>&1 || {
        cat "$work/$db-io.out" >&2
        exit 1
      }
      # The backends flush their counters as they exit.
      sleep 2
      creates[$db]=$(( $(psql "${url[$db]}" -Atc "SELECT last_value FROM bench_slot") - before ))
      while IFS='|' read -r name n; do
        pages[$db/$name]=$(( ${pages[$db/$name]:-0} + n ))
      done < <(psql "${url[$db]}" -Atc "
        SELECT 'table:' || relname, heap_blks_hit + heap_blks_read FROM pg_statio_user_tables
        UNION ALL
        SELECT 'index:' || indexrelname, idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes")
      creates[$db/all]=$(( ${creates[$db/all]:-0} + ${creates[$db]} ))
    done
  done
  echo "== buffer accesses per create, 2 runs of ${secs}s on each database ($history bookings / empty): ${creates[history/all]} / ${creates[empty/all]} creates"
  for key in "${!pages[@]}"; do
    [ "${key%%/*}" = history ] || continue
    name="${key#*/}"
    awk -v n="$name" -v h="${pages[$key]}" -v e="${pages[empty/$name]:-0}" \
      -v ch="${creates[history/all]}" -v ce="${creates[empty/all]}" \
      'BEGIN { a = h / ch; b = e / ce; if (a > 0.005 || b > 0.005) printf "%-40s %8.2f %8.2f %+8.2f\n", n, a, b, a - b }'
  done | sort -k4 -g -r | { printf '%-40s %8s %8s %8s\n' "" history empty diff; cat; }
  exit 0
fi
run bare bare.sql
run create create.sql
run bare-async bare.sql -c synchronous_commit=off
run async create.sql -c synchronous_commit=off
# The same creates in batches: as many creates waiting at once as in `create`, in
# transactions of 4 and of 8 (the queue's workers take what waits).
CLIENTS=$((clients >= 4 ? clients / 4 : 1)) run batch4 batch4.sql
CLIENTS=$((clients >= 8 ? clients / 8 : 1)) run batch8 batch8.sql
for key in batch4 batch8 empty/batch4 empty/batch8; do
  [ -n "${tps[$key]:-}" ] && tps[$key]=$(awk -v t="${tps[$key]}" -v k="${key##*batch}" 'BEGIN {print t * k}')
done
run no-audit no-audit.sql
everywhere "ALTER TABLE booking DISABLE TRIGGER booking_day_units_insert"
run no-days no-audit.sql
everywhere "ALTER TABLE booking DISABLE TRIGGER booking_change_insert"
run no-changes no-audit.sql
run no-locks no-locks.sql
# The slot constraint is on booking_unit, whose rows a trigger writes (migration
# 20261205000100): the trigger goes too.
everywhere "ALTER TABLE booking DISABLE TRIGGER booking_unit_insert; ALTER TABLE booking DROP CONSTRAINT booking_user_excl"
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
for name in batch4 batch8; do
  echo "$name: $(awk -v a="${tps[$name]}" -v b="${tps[bare]}" 'BEGIN {printf "%.2f", a / b}') x bare ($(printf '%.0f' "${tps[$name]}") creates/s; its p50/p99 are of a transaction of ${name#batch} creates); $(awk -v a="${tps[$name]}" -v b="${tps[create]}" 'BEGIN {printf "%.2f", a / b}') x create"
done
echo "async: $(awk -v a="${tps[async]}" -v b="${tps[bare-async]}" 'BEGIN {printf "%.2f", a / b}') x bare-async; $(awk -v a="${tps[async]}" -v b="${tps[create]}" 'BEGIN {printf "%.2f", a / b}') x create"
if [ "${#dbs[@]}" = 2 ]; then
  echo
  echo "== with the history ($history bookings) / empty, each variant's creates/s"
  for name in create no-audit no-days no-changes no-locks no-excl batch4 batch8 async bare; do
    echo "$name: $(awk -v a="${tps[$name]}" -v b="${tps[empty/$name]}" 'BEGIN {printf "%.2f", a / b}')"
  done
fi
