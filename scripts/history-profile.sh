#!/usr/bin/env bash
# Where each database's Postgres time goes during the history bench's creates in
# alternating rounds (loaded / empty at the same moments): `perf record -a
# -g` while the rounds run, the samples split by the database of the backend that took
# them (pids from pg_stat_activity), and for each side the share of its samples
# spent in (below) each part of a create: executor start-up, index inserts, GiST
# searches (exclusion checks and reads), triggers, the commit. Equal shares on both
# sides mean the loaded side is slower everywhere alike (a larger working set), not in
# one place. Not a test; needs perf and the rights to sample every process (root).
#
#     scripts/history-profile.sh target/release/deps/history-<hash> target/history-profile
#
# With GPU_BOOKING_HISTORY_PLANNED_ONLY=1 the rounds are those of the planned-only
# run (about 5 minutes: planned models, empty models, an empty database); without,
# the full run's (about 15 minutes: the history's models against an empty database,
# with a third side on the planned-only models in the history's database, counted
# with it). What it found is in the git history of docs/performance.md.
set -euo pipefail
bin=$(realpath "$1")
out=$(realpath -m "$2")
mkdir -p "$out"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
command -v perf >/dev/null || { echo "perf not found (Debian: linux-perf)" >&2; exit 1; }
if [ "${GPU_BOOKING_HISTORY_PLANNED_ONLY:-0}" = 1 ]; then
  begins="creates, 32 clients:"
else
  begins="== creates with the history and in an empty database"
fi
# The rounds take 6 s a side and round; the first seconds create the empty database
# and warm each side up (3 s each, not measured).
backends() {
  psql "$DATABASE_URL" -Atc "SELECT pid, datname FROM pg_stat_activity
    WHERE datname LIKE 'gpu_booking_bench_history%'" >>"$out/pids.txt"
}
record() {
  sleep 10
  : >"$out/pids.txt"
  backends
  perf record -a -g -F 299 -o "$out/perf.data" -- sleep 45 >"$out/perf.log" 2>&1
  # A pool may have opened connections while perf ran.
  backends
}
cd "$(dirname "$0")/../booking-api"
"$bin" --bench 2>&1 | {
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      "$begins"*) record & ;;
    esac
  done
  wait
} | tee "$out/bench.log"
perf script -i "$out/perf.data" -F pid,ip,sym 2>/dev/null >"$out/chains.txt"
python3 - "$out" <<'EOF' | tee "$out/shares.txt"
import collections, sys
out = sys.argv[1]
database = {}
for line in open(f"{out}/pids.txt"):
    pid, _, name = line.strip().partition("|")
    if name:
        database[pid] = name
below = collections.defaultdict(collections.Counter)
samples = collections.Counter()
# An exclusion constraint's check is an index search while the row's index entries
# are inserted.
CHECKS = "exclusion checks"
def count(side, seen):
    if side is None:
        return
    samples[side] += 1
    for symbol in seen:
        below[side][symbol] += 1
    if {"ExecInsertIndexTuples", "index_getnext_slot"} <= seen:
        below[side][CHECKS] += 1
side, seen = None, set()
for line in open(f"{out}/chains.txt"):
    if not line.strip():
        count(side, seen)
        side, seen = None, set()
    elif not line[0].isspace():
        side, seen = database.get(line.split()[0]), set()
    elif len(line.split()) >= 2:
        seen.add(line.split()[1].split("+0x")[0])
count(side, seen)
parts = [CHECKS] + """standard_ExecutorStart ExecInsertIndexTuples gistinsert gistchoose btinsert
index_getnext_slot gistgettuple range_gist_consistent detoast_attr heap_insert
index_fetch_heap AfterTriggerEndQuery plpgsql_exec_function
SPI_execute_plan_with_paramlist CommitTransactionCommand XLogInsert ReadBufferExtended
hash_search_with_hash_value mdread mdwrite""".split()
sides = sorted(samples)
print("share of each database's Postgres samples spent in (below) each function")
print(f"{'':34s}" + "".join(f"{s.removeprefix('gpu_booking_bench_'):>16s}" for s in sides))
print(f"{'samples':34s}" + "".join(f"{samples[s]:>16d}" for s in sides))
for part in parts:
    print(f"{part:34s}" + "".join(f"{100 * below[s][part] / max(samples[s], 1):>15.1f}%" for s in sides))
EOF
