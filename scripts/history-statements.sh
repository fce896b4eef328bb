#!/usr/bin/env bash
# The history bench with Postgres's per-statement figures for its `plan` and `hist`
# phases: pg_stat_statements is reset when each phase starts and read when it ends,
# so that `plan.txt` and `hist.txt` compare the same statements with and without the
# past (calls, mean time, buffers a call). `hist.txt` starts after the rounds below:
# the paired reads and creates that alternate between the planned-only models and
# the history's (both kinds of call), then the history's phase.
# `rounds.txt` has the creates of the rounds that alternate the history's database
# and an empty one (loaded / empty at the same moments), per database:
# calls, mean time, rows, buffers and WAL a call (the history's database's figures
# include the rounds' third side, creates on the planned-only models beside it). With `pg_stat_statements.track =
# all` (ALTER SYSTEM and a reload) it has the statements inside the create's
# functions and triggers too, which says which part of a create grows. It needs
# pg_stat_statements in shared_preload_libraries (a restart of Postgres); it does not
# change that itself.
#
#     scripts/history-statements.sh target/release/deps/history-<hash> target/history-statements
#
# What it found is in the git history of docs/performance.md.
set -euo pipefail
bin=$(realpath "$1")
out=$(realpath -m "$2")
mkdir -p "$out"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
q() { psql "$DATABASE_URL" -Atqc "$1"; }
if ! q 'SHOW shared_preload_libraries' | grep -q pg_stat_statements; then
  echo "pg_stat_statements is not in shared_preload_libraries" >&2
  exit 1
fi
q "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
snapshot() {
  psql "$DATABASE_URL" -c "SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms,
      round(total_exec_time::numeric, 1) AS total_ms,
      shared_blks_hit / greatest(calls, 1) AS hit_per_call,
      shared_blks_read / greatest(calls, 1) AS read_per_call,
      left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS query
    FROM pg_stat_statements WHERE calls > 100 ORDER BY total_exec_time DESC LIMIT 25" \
    >"$out/$1.txt"
}
# The bench's two databases side by side, each statement's figures per call.
by_database() {
  psql "$DATABASE_URL" -c "SELECT d.datname, s.toplevel AS top, calls,
      round(mean_exec_time::numeric, 4) AS mean_ms, rows / greatest(calls, 1) AS rows_per_call,
      round(shared_blks_hit::numeric / greatest(calls, 1), 1) AS hit_per_call,
      wal_bytes / greatest(calls, 1) AS wal_bytes_per_call,
      left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
    WHERE d.datname LIKE 'gpu_booking_bench_history%' AND calls > 500
    ORDER BY query, d.datname" >"$out/$1.txt"
}
cd "$(dirname "$0")/../booking-api"
# The planned-only phase (in a database of its own) ends where the history's
# database's loads begin (the second "== loading").
"$bin" --bench 2>&1 | {
  in_plan=
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      "== planned bookings only"*) q "SELECT pg_stat_statements_reset()" >/dev/null; in_plan=1 ;;
      "== loading"*) if [ -n "$in_plan" ]; then snapshot plan; in_plan=; fi ;;
      # The rounds come first once the history is loaded (before the paired
      # reads and the history's phase), and end where the paired reads begin.
      "== creates with the history and in an empty database"*) q "SELECT pg_stat_statements_reset()" >/dev/null ;;
      "== the hot reads, planned only and with history"*)
        by_database rounds
        q "SELECT pg_stat_statements_reset()" >/dev/null
        ;;
      # The paired reads, the rounds of the history's models against the
      # planned-only ones and the history's phase end where the returning users'
      # rounds begin.
      "== creates by"*) snapshot hist ;;
    esac
  done
} | tee "$out/bench.log"
echo "per-statement figures: $out/plan.txt, $out/hist.txt, $out/rounds.txt"
