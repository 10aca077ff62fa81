#!/usr/bin/env bash
# bench/netbed_allreduce.sh — hierarchical all-reduce against flat Open MPI
# on the multi-node test bed (scripts/netbed.sh): 2 nodes x 2 ranks, links
# shaped to each --rate, float32 sum at --size.
#
#   bench/netbed_allreduce.sh [--rates "1gbit 10gbit"] [--size 64M] [--iters N]
#                             [--slots 2] [--delay D]
#
# For each rate, on a fresh bed, under the bed's mpirun (Open MPI's TCP
# between nodes, shm inside a node):
#   flat  = build/bench/mpi_allreduce: MPI_Allreduce on all 4 ranks;
#   dtrain flat = dtrain bench coll --algo flat (the `mpi` backend, the same
#         MPI all-reduce through dtrain's group layer);
#   hier  = dtrain bench coll --algo hier: intra-node reduce-scatter, all-
#         reduce of each shard across nodes, intra-node all-gather.
# Prints busbw (GB/s, nccl-tests' convention: algbw x 2(W-1)/W) out of place
# and in place, and hier / flat (the issue's target: >= 1.8 at 1 Gbit/s for
# 64 MiB). Also the link rate as a busbw: a flat ring's busbw cannot beat
# it, the hierarchical one can (each node sends a node's share only). Needs
# root (namespaces); BUILD=dir for another build directory. Long at 1 Gbit/s
# and 64 MiB: about a second per all-reduce.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rates="1gbit 10gbit" size=64M iters=5 slots=2 delay=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --delay) delay=(--delay "$2"); shift 2 ;;
    *) echo "usage: $0 [--rates \"1gbit 10gbit\"] [--size 64M] [--iters N] [--slots 2] [--delay D]" >&2; exit 2 ;;
  esac
done
mpi=$PWD/$BUILD/bench/mpi_allreduce
dt=$PWD/$BUILD/dtrain
[ -x "$mpi" ] || { echo "$0: $mpi not built (MPI not found?)" >&2; exit 1; }
[ -x "$dt" ] || { echo "$0: $dt not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
np=$((2 * slots))
args="--op allreduce --min $size --max $size --iters $iters --json"
for rate in $rates; do
  echo "# $rate: 2 nodes x $slots ranks, $size float32 sum, $iters iterations" >&2
  scripts/netbed.sh --nodes 2 --slots "$slots" --rate "$rate" "${delay[@]}" -- sh -c "
    \$NETBED_MPIRUN -np $np $mpi $args > $tmp/mpi.$rate &&
    \$NETBED_MPIRUN -np $np $dt bench coll --algo flat --mem plain $args > $tmp/flat.$rate &&
    \$NETBED_MPIRUN -np $np $dt bench coll --algo hier --mem plain $args > $tmp/hier.$rate"
done
python3 - "$tmp" "$rates" "$np" <<'PY'
import json, os, re, sys
tmp, rates, np_ = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["inplace"]] = r
    return rows
def gbit(rate):
    m = re.match(r"([0-9.]+)([kmg])bit", rate)
    return float(m.group(1)) * {"k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)] if m else None
print("# busbw in GB/s (nccl-tests' convention); %d ranks on 2 nodes" % np_)
print("%-8s %5s | %9s | %9s | %9s | %8s | %s" % ("link", "place", "ompi flat", "dt flat", "dt hier",
                                               "hier/ompi", "link rate as GB/s"))
for rate in rates:
    m, f, h = (load(os.path.join(tmp, "%s.%s" % (k, rate))) for k in ("mpi", "flat", "hier"))
    for ip in (False, True):
        a, b, c = m.get(ip), f.get(ip), h.get(ip)
        ok = all(r.get("correct", True) for r in (a, b, c) if r)
        g = gbit(rate)
        print("%-8s %5s | %9.4f | %9.4f | %9.4f | %8.2f | %s%s" % (
            rate, "inpl" if ip else "oop", a["busbw_gbs"], b["busbw_gbs"], c["busbw_gbs"],
            c["busbw_gbs"] / a["busbw_gbs"], "%.3f" % (g / 8) if g else "?", "" if ok else "  WRONG RESULTS"))
PY
