#!/usr/bin/env bash
# bench/coll_vs_mpi.sh — dtrain collectives against Open MPI, size by size.
#
#   bench/coll_vs_mpi.sh [--op allreduce] [--min 8] [--max 256M] [--np 2] [--iters N]
#
# Runs Open MPI (build/bench/mpi_allreduce under mpirun) and dtrain
# (dtrain run -n NP -- dtrain bench coll) on the same sizes, float32 sum,
# and prints busbw of each with the ratio dtrain / Open MPI, for plain and
# group-allocated (dt_pg_alloc) dtrain buffers, out of place and in place.
# Set BUILD=dir for another build directory. Needs python3 for the join.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
op=allreduce min=8 max=256M np=2 iters=()
while [ $# -gt 0 ]; do
  case "$1" in
    --op) op=$2; shift 2 ;;
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --iters) iters=(--iters "$2"); shift 2 ;;
    *) echo "usage: $0 [--op OP] [--min 8] [--max 256M] [--np 2] [--iters N]" >&2; exit 2 ;;
  esac
done
mpi=$BUILD/bench/mpi_allreduce
dt=$BUILD/dtrain
[ -x "$mpi" ] || { echo "$0: $mpi not built (MPI not found?)" >&2; exit 1; }
[ -x "$dt" ] || { echo "$0: $dt not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--op "$op" --min "$min" --max "$max" --json "${iters[@]}")
echo "# Open MPI: mpirun -np $np $mpi ${args[*]}" >&2
mpirun --allow-run-as-root --oversubscribe -np "$np" "$mpi" "${args[@]}" > "$tmp/mpi.jsonl"
echo "# dtrain:   $dt run -n $np -- $dt bench coll ${args[*]}" >&2
"$dt" run -n "$np" -- "$dt" bench coll "${args[@]}" | sed -n 's/^\[0\] //p' > "$tmp/dt.jsonl"
python3 - "$tmp/mpi.jsonl" "$tmp/dt.jsonl" <<'PY'
import json, sys
def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[(r["bytes"], r.get("mem", "plain"), r["inplace"])] = r
    return rows
mpi, dt = load(sys.argv[1]), load(sys.argv[2])
sizes = sorted({k[0] for k in mpi} | {k[0] for k in dt})
any_r = next(iter(dt.values()), None) or next(iter(mpi.values()))
print(f"# {any_r['op']}, float32, {any_r['ranks']} ranks; busbw in GB/s; ratio = dtrain / Open MPI")
hdr = ("size(B)", "place", "ompi", "plain", "x", "group", "x", "ompi us", "plain us", "group us", "ok")
print("%12s %5s | %7s | %7s %6s | %7s %6s | %9s %9s %9s | %s" % hdr)
def g(d, k, f):
    r = d.get(k)
    return r[f] if r else None
def fmt(v, w=7, p=3):
    return ("%*.*f" % (w, p, v)) if v is not None else "%*s" % (w, "-")
def ratio(a, b):
    return "%6.2f" % (a / b) if a and b else "%6s" % "-"
for s in sizes:
    for ip in (False, True):
        m = g(mpi, (s, "plain", ip), "busbw_gbs")
        p = g(dt, (s, "plain", ip), "busbw_gbs")
        q = g(dt, (s, "group", ip), "busbw_gbs")
        ok = all(r.get("correct", True) for r in (mpi.get((s, "plain", ip)), dt.get((s, "plain", ip)),
                                                   dt.get((s, "group", ip))) if r)
        print("%12d %5s | %s | %s %s | %s %s | %s %s %s | %s" % (
            s, "inpl" if ip else "oop", fmt(m), fmt(p), ratio(p, m), fmt(q), ratio(q, m),
            fmt(g(mpi, (s, "plain", ip), "time_us"), 9, 2), fmt(g(dt, (s, "plain", ip), "time_us"), 9, 2),
            fmt(g(dt, (s, "group", ip), "time_us"), 9, 2), "ok" if ok else "WRONG"))
PY
