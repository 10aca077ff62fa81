#!/usr/bin/env bash
# bench/netbed_zeropp.sh — cross-machine bytes and step time of ZeRO++
# against ZeRO-3 and DDP, on the multi-node test bed (scripts/netbed.sh:
# 2 nodes x 2 ranks, links shaped to each --rate, Open MPI's TCP between
# the nodes, shared memory inside one).
#
#   bench/netbed_zeropp.sh [--rates "1gbit 10gbit"] [--model gpt2] [--steps 3]
#                          [--seq 64] [--modes "ddp zero3 zeropp"]
#
# Each mode trains --model (GPT-2 124M by default: vocabulary 50257, the
# Bible token files of scripts/gpt_data.sh fit it) for 1 and for --steps
# SGD steps, batch 1 per rank, --seq tokens, philox initial values (each
# rank draws only its shards: torch's stream would make every ZeRO-3 rank
# draw the whole model's values at start), on a fresh bed per rate:
#   ddp     --zero 0
#   zero3   --zero 3 --wrap-min-params 5000000 (a unit per block)
#   zeropp  zero3 + --zero-quantized-weights --zero-quantized-gradients --zero-hpz 2
# The bytes are counted twice. dtrain's own count (the backend's byte
# counters, dt_pg_traffic_read): the end record of the --steps run carries
# the bytes all ranks sent to another node from the end of step 1 to the
# end of the run (comm_bytes_cross_node / comm_steps per step); the mpi
# backend counts them per peer with Open MPI's monitoring layer (asked for
# with --mca pml_monitoring_enable 1) or, where that layer does not load
# (Debian's Open MPI 4.1.4), as TCP's bytes_sent on each rank's connections
# to the other machine (payload, no headers). The cross-check: the bed's tc
# counters at both ends of every node's link ($NETBED_BYTES: frames with
# their Ethernet/IP/TCP headers), read before and after each run: bytes per
# step = (bytes of the --steps run - bytes of the 1-step run) / (--steps -
# 1), so start-up (rendezvous, the initial shards) cancels. Step time = the median of the times between
# consecutive step records of rank 0's metrics (steps 2..--steps). Needs root (namespaces) and mpirun;
# BUILD=dir for another build directory; logs in $OUT (default
# $BUILD/bench-netbed-zeropp).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/bench-netbed-zeropp}
rates="1gbit 10gbit" model=gpt2 steps=3 seq=64 modes="ddp zero3 zeropp"
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
[ "$steps" -ge 2 ] || { echo "$0: --steps must be >= 2" >&2; exit 2; }
cli=$(realpath "$BUILD/dtrain" 2>/dev/null || echo "$BUILD/dtrain")
[ -x "$cli" ] || { echo "$0: $cli not built" >&2; exit 1; }
data=$(realpath -m "${DT_GPT_DATA_DIR:-$BUILD/gpt-data}")
DT_CLI=$cli DT_GPT_DATA_DIR=$data scripts/gpt_data.sh >/dev/null
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
for rate in $rates; do
  echo "# $rate: 2 nodes x 2 ranks, $model, seq $seq, 1 and $steps steps per mode" >&2
  echo "$rate before $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load"
  scripts/netbed.sh --nodes 2 --slots 2 --rate "$rate" -- env O="$OUT" R="$rate" bash -c '
    set -e
    for m in '"$modes"'; do
      case $m in
        ddp) f="--zero 0" ;;
        zero3) f="--zero 3 --wrap-min-params 5000000" ;;
        zeropp) f="--zero 3 --wrap-min-params 5000000 --zero-quantized-weights --zero-quantized-gradients --zero-hpz 2" ;;
      esac
      for s in 1 '"$steps"'; do
        out=$O/$m.$R.$s
        $NETBED_BYTES > $out.b0
        $NETBED_MPIRUN --mca pml_monitoring_enable 1 -np 4 -x DT_COMM_TIMEOUT=600 -x DT_INIT_TIMEOUT=600 '"$cli"' train --model '"$model"' \
          --seq '"$seq"' --batch 1 --optimizer sgd --lr 1e-4 --seed 0 --rng philox --max-steps $s --threads 1 \
          --data tokens:'"$data"'/train.bin --no-eval --progress none --log-every 1 --metrics $out.jsonl $f \
          > $out.log 2>&1 || { echo "$m $s failed"; tail -5 $out.log; exit 1; }
        $NETBED_BYTES > $out.b1
      done
    done'
  echo "$rate after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load"
done
python3 - "$OUT" "$rates" "$steps" "$modes" <<'PY'
import json, statistics, sys
out, rates, steps, modes = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
def link_bytes(p):  # max over nodes of max(out, in), after - before
    b0 = {l.split()[0]: list(map(int, l.split()[1:3])) for l in open(p + ".b0") if l.strip()}
    b1 = {l.split()[0]: list(map(int, l.split()[1:3])) for l in open(p + ".b1") if l.strip()}
    return sum(b1[k][0] - b0[k][0] for k in b1), max(max(b1[k][0] - b0[k][0], b1[k][1] - b0[k][1]) for k in b1)
def backend(p):  # the end record: all ranks' cross-node bytes per step (steps 2..n), and how counted
    for l in open(p + ".jsonl"):
        if '"event":"end"' in l:
            e = json.loads(l)
            if e.get("comm_steps") and "comm_bytes_cross_node" in e:
                return e["comm_bytes_cross_node"] / e["comm_steps"]
    return float("nan")
def step_s(p):
    t = [json.loads(l)["time"] for l in open(p + ".jsonl") if '"event":"step"' in l]
    v = [b - a for a, b in zip(t, t[1:])]  # steps 2..n: each step's record minus the one before
    return statistics.median(v) if v else float("nan")
print("# bytes per step that left the nodes: dtrain's count (the backend's counters, all ranks), tc's")
print("# (sum over the 2 nodes' links, headers included) and tc's busiest link direction; the median step")
print("# time; load: " + " | ".join(open(out + "/load").read().split("\n")))
print(f"{'rate':<7} {'mode':<7} {'dtrain MB/step':>14} {'vs zero3':>8} {'tc MB/step':>10} {'busiest MB':>10} "
      f"{'step s':>7} {'vs zero3':>8}")
for r in rates:
    res = {}
    for m in modes:
        a1, b1 = link_bytes(f"{out}/{m}.{r}.1")
        an, bn = link_bytes(f"{out}/{m}.{r}.{steps}")
        res[m] = ((an - a1) / (steps - 1), (bn - b1) / (steps - 1), step_s(f"{out}/{m}.{r}.{steps}"),
                  backend(f"{out}/{m}.{r}.{steps}"))
    z = res.get("zero3")
    for m in modes:
        s, b, t, d = res[m]
        print(f"{r:<7} {m:<7} {d / 1e6:14.1f} {d / z[3] if z else float('nan'):8.3f} {s / 1e6:10.1f} {b / 1e6:10.1f} "
              f"{t:7.2f} {t / z[2] if z else float('nan'):8.3f}")
PY
