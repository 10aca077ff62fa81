#!/usr/bin/env bash
# bench/netbed_allreduce.sh — hierarchical all-reduce against flat Open MPI
# on the multi-node test bed (scripts/netbed.sh): 2 nodes x 2 ranks, links
# shaped to each --rate, float32 sum at --size.
#
#   bench/netbed_allreduce.sh [--rates "1gbit 10gbit"] [--size 64M] [--iters N]
#                             [--rounds R] [--slots 2] [--delay D]
#
# For each rate, on a fresh bed, under the bed's mpirun (Open MPI's TCP
# between nodes, vader shm inside a node), R rounds of:
#   ompi flat = build/bench/mpi_allreduce: MPI_Allreduce on all ranks (Open
#               MPI's tuned component picks the algorithm; 4 ranks, 64 MiB:
#               recursive-halving reduce-scatter + recursive-doubling
#               all-gather, which sends a node's share only, like hier);
#   dt flat   = dtrain bench coll --algo flat (the `mpi` backend:
#               MPI_Iallreduce, libnbc's algorithms);
#   dt hier   = dtrain bench coll --algo hier: per chunk, intra-node reduce-
#               scatter, ring all-reduce of each slice across nodes, intra-
#               node all-gather, pipelined.
# Each run is bracketed by the bed's byte counters ($NETBED_BYTES: tc's
# counters at both ends of every node's link), so besides busbw (GB/s,
# nccl-tests' convention: algbw x 2(W-1)/W) the table says how many bytes
# one all-reduce sent over the busiest link direction, as a multiple of the
# data size S (headers included: TCP over 1500-byte frames adds ~4.6%), and
# the busbw that this many bytes allows at the link's rate ("link-bound").
# The lower bound on a node's traffic is 2 (N-1)/N S per direction (N
# nodes: S at N = 2): an algorithm at 1.0 S moves the minimum; a ring over
# ranks numbered node by node moves 2 (W-1)/W S = 1.5 S. Medians over the
# rounds; the load average before and after each rate is printed (the
# figures mean little on a loaded machine).
# Needs root (namespaces); BUILD=dir for another build directory. Long at
# 1 Gbit/s and 64 MiB: about a second per all-reduce, 2 x (3 + iters) per
# run, 3 runs per round.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rates="1gbit 10gbit" size=64M iters=5 rounds=3 slots=2 delay=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --delay) delay=(--delay "$2"); shift 2 ;;
    *) echo "usage: $0 [--rates \"1gbit 10gbit\"] [--size 64M] [--iters N] [--rounds R] [--slots 2] [--delay D]" >&2; exit 2 ;;
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
  echo "# $rate: 2 nodes x $slots ranks, $size float32 sum, $iters iterations, $rounds rounds" >&2
  echo "$rate before $(cut -d' ' -f1-3 /proc/loadavg)" >> "$tmp/load"
  scripts/netbed.sh --nodes 2 --slots "$slots" --rate "$rate" "${delay[@]}" -- env T="$tmp" R="$rate" bash -c '
    set -e
    run() { # run NAME ROUND COMMAND...: JSON lines, then the bytes before/after
      local out=$T/$1.$R.$2; shift 2
      $NETBED_BYTES > $out.b0
      "$@" > $out
      $NETBED_BYTES > $out.b1
    }
    for ((k = 0; k < '"$rounds"'; k++)); do
      run ompi $k $NETBED_MPIRUN -np '"$np $mpi $args"'
      run flat $k $NETBED_MPIRUN -np '"$np $dt"' bench coll --algo flat --mem plain '"$args"'
      run hier $k $NETBED_MPIRUN -np '"$np $dt"' bench coll --algo hier --mem plain '"$args"'
    done'
  echo "$rate after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$tmp/load"
done
python3 - "$tmp" "$rates" "$np" "$iters" "$rounds" <<'PY'
import glob, json, os, re, statistics, sys
tmp, rates, np_, iters, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ops = 2 * (1 + max(2, iters // 10) + iters)   # per run: check, warm-up, iters; both placements
def gbit(rate):
    m = re.match(r"([0-9.]+)([kmg])bit$", rate)
    return float(m.group(1)) * {"k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)] if m else None
def counters(path):
    return {int(l.split()[0]): (int(l.split()[1] or 0), int(l.split()[2] or 0)) for l in open(path) if l.strip()}
def load(name, rate):
    runs = []
    for k in range(rounds):
        out = os.path.join(tmp, "%s.%s.%d" % (name, rate, k))
        rows = {}
        for line in open(out):
            if line.startswith("{"):
                r = json.loads(line)
                rows[r["inplace"]] = r
        b0, b1 = counters(out + ".b0"), counters(out + ".b1")
        busiest = max(max(b1[i][0] - b0[i][0], b1[i][1] - b0[i][1]) for i in b0)
        runs.append((rows, busiest))
    return runs
print("# %d ranks on 2 nodes; busbw in GB/s (nccl-tests' convention), medians of %d rounds" % (np_, rounds))
print("# bytes/S: bytes one all-reduce sent over the busiest link direction (tc counters,")
print("#   averaged over the %d all-reduces of a run), in units of the data size S" % ops)
print("# link-bound: the busbw those bytes allow at the link rate (time = bytes / rate)")
for l in open(os.path.join(tmp, "load")):
    print("# load average %s" % l.strip())
print("%-7s %-5s | %-9s | %7s %7s %7s | %7s | %10s" % ("link", "place", "impl", "busbw", "min", "max", "bytes/S", "link-bound"))
for rate in rates:
    g = gbit(rate)
    res = {}
    for name in ("ompi", "flat", "hier"):
        runs = load(name, rate)
        S = runs[0][0][False]["bytes"]
        bps = statistics.median(b for _, b in runs) / ops
        for ip in (False, True):
            bw = [r[ip]["busbw_gbs"] for r, _ in runs]
            ok = all(r[ip].get("correct", True) for r, _ in runs)
            bound = S * 2 * (np_ - 1) / np_ / (bps / (g * 1e9 / 8)) / 1e9 if g and bps else float("nan")
            res[(name, ip)] = statistics.median(bw)
            print("%-7s %-5s | %-9s | %7.4f %7.4f %7.4f | %7.3f | %10.4f%s" % (
                rate, "inpl" if ip else "oop", {"ompi": "ompi flat", "flat": "dt flat", "hier": "dt hier"}[name],
                statistics.median(bw), min(bw), max(bw), bps / S, bound, "" if ok else "  WRONG RESULTS"))
    for ip in (False, True):
        print("%-7s %-5s | hier / ompi flat = %.2f   hier / dt flat = %.2f" % (
            rate, "inpl" if ip else "oop", res[("hier", ip)] / res[("ompi", ip)], res[("hier", ip)] / res[("flat", ip)]))
PY
