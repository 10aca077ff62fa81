#!/usr/bin/env bash
# bench/compress_gpt.sh — gradient compression on a DDP step of a small GPT:
# plain all-reduce against fp16 compression and PowerSGD (rank 1 and 4), with
# the loss curve of each over the same steps, data and seed.
#
#   bench/compress_gpt.sh [--np 2] [--steps 300] [--start-iter 50] [--every 25]
#                         [--hooks "allreduce fp16 powersgd:1 powersgd:4"]
#                         [--args "extra dtrain train arguments"]
#                         [--launcher "COMMAND"]
#
# Each hook runs `dtrain train --model gpt-mini` (2 layers, 4 heads, 128
# wide, 64-token windows, batch 8 per rank, AdamW 2e-3, seed 0) for --steps
# optimizer steps on the King James Bible token files (scripts/gpt_data.sh;
# DT_GPT_DATA_DIR), PowerSGD switching from plain all-reduce to compression
# at --start-iter. The table gives per hook: samples/s over the run, the
# DDP wait per step, PowerSGD's compression of the elements all-reduced,
# the training loss (mean of the last --every steps) at every --every steps,
# and the final validation loss. The loss columns are the effect on
# convergence; the throughput columns matter only when the network, not the
# compute, limits the step (on one machine's shm they mostly show the
# compression's compute cost).
#
# Across machines: --launcher replaces `dtrain run -n NP --` by any command
# that starts the ranks and is followed by the dtrain command line, e.g.
#   --launcher "mpirun -np 4 --host node1:2,node2:2"
# (the ranks read their rank and size from Open MPI's environment).
# On the multi-node test bed (scripts/netbed.sh: namespaces joined by shaped
# links), --launcher netbed uses the bed's mpirun line with -np NP:
#   scripts/netbed.sh --nodes 2 --slots 2 --rate 1gbit -- bench/compress_gpt.sh --np 4 --launcher netbed
# Add --args --hierarchical-allreduce for the two-level all-reduce under the hooks.
# BUILD=dir picks another build directory. Writes into $OUT (default
# build/bench-compress): one log and one metrics file per hook.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/bench-compress}
np=2 steps=300 start=50 every=25 hooks="allreduce fp16 powersgd:1 powersgd:4" extra="" launcher=""
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --start-iter) start=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --hooks) hooks=$2; shift 2 ;;
    --args) extra=$2; shift 2 ;;
    --launcher) launcher=$2; shift 2 ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
cli=$(realpath "$BUILD/dtrain" 2>/dev/null || echo "$BUILD/dtrain")
[ -x "$cli" ] || { echo "$0: $cli not built" >&2; exit 1; }
data=$(realpath -m "${DT_GPT_DATA_DIR:-$BUILD/gpt-data}")
DT_CLI=$cli DT_GPT_DATA_DIR=$data scripts/gpt_data.sh >/dev/null
vocab=$(cat "$data/vocab_size")
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
# shellcheck disable=SC2206
if [ "$launcher" = netbed ]; then
  [ -n "${NETBED_MPIRUN:-}" ] || { echo "$0: --launcher netbed: run under scripts/netbed.sh (NETBED_MPIRUN unset)" >&2; exit 2; }
  launch=($NETBED_MPIRUN -np "$np")
elif [ -n "$launcher" ]; then launch=($launcher); else launch=("$cli" run -n "$np" --); fi

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for h in $hooks; do
  name=${h/:/-r}
  args=(--comm-hook "${h%%:*}")
  if [ "${h%%:*}" = powersgd ]; then
    args+=(--powersgd-rank "${h#*:}" --powersgd-start-iter "$start")
  fi
  # shellcheck disable=SC2206
  cmd=("${launch[@]}" "$cli" train --model gpt-mini --n-layer 2 --n-head 4 --n-embd 128 --block-size 64
       --vocab-size "$vocab" --seq 64 --batch 8 --optimizer adamw --lr 2e-3 --warmup 20 --seed 0
       --max-steps "$steps" --data "tokens:$data/train.bin" --val-data "tokens:$data/val.bin"
       --limit-test 256 --eval-every "$steps" --log-every "$every" --progress plain
       --metrics "$OUT/$name.jsonl" "${args[@]}" $extra)
  echo "+ ${cmd[*]}" >&2
  rm -f "$OUT/$name.jsonl"
  "${cmd[@]}" > "$OUT/$name.log" 2>&1 || { echo "$0: $name failed:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
done

load1=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$OUT" "$every" "$load0" "$load1" $hooks <<'PY'
import json, re, sys
out, every, load0, load1, hooks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
rows, steps = [], None
for h in hooks:
    name = h.replace(":", "-r")
    log = open(f"{out}/{name}.log").read()
    losses = {}
    for line in open(f"{out}/{name}.jsonl"):
        r = json.loads(line)
        if r.get("event") == "step":
            losses[r["step"]] = r["loss"]
    sps = re.findall(r"samples/s: ([0-9.]+)", log)
    wait = re.findall(r"([0-9.]+) ms/step waiting", log)
    comp = re.findall(r"([0-9.]+)x fewer elements", log)
    val = re.findall(r"val loss: ([0-9.]+)", log)
    steps = sorted(losses) if steps is None else steps
    rows.append((h, sps[-1] if sps else "?", wait[-1] if wait else "?", (comp[-1] + "x") if comp else "-",
                 [losses.get(s) for s in steps], val[-1] if val else "?"))
print(f"\n# DDP step of gpt-mini, loss = mean of the last {every} steps (logs in {out})")
print(f"# load average (1, 5, 15 min) before: {load0}; after: {load1}")
hdr = f"{'hook':<12} {'samples/s':>9} {'wait ms':>8} {'compress':>9}  " + " ".join(f"{'@'+str(s):>7}" for s in steps) + f" {'val':>7}"
print(hdr)
for h, sps, wait, comp, ls, val in rows:
    print(f"{h:<12} {sps:>9} {wait:>8} {comp:>9}  " + " ".join(f"{l:7.4f}" if l is not None else f"{'?':>7}" for l in ls) + f" {val:>7}")
PY
