#!/usr/bin/env bash
# bench/zeropp_gpt.sh — ZeRO++'s loss curve against ZeRO-3's: a small GPT on
# the King James Bible, 4 ranks as two simulated machines of 2
# (DT_SIM_LOCAL_SIZE=2, so hpZ's groups and qgZ's two hops are real
# groups), the same data, seed and steps for every mode:
#   zero3  --zero 3
#   hpz    --zero 3 --zero-hpz 2                       (bit-identical to zero3)
#   qwz    --zero 3 --zero-quantized-weights
#   qgz    --zero 3 --zero-quantized-gradients         (int4, blocks of 64)
#   zeropp --zero 3 --zero-quantized-weights --zero-quantized-gradients --zero-hpz 2
#
#   bench/zeropp_gpt.sh [--steps 300] [--every 25] [--modes "zero3 hpz qwz qgz zeropp"]
#                       [--png docs/zeropp_loss.png]
#
# gpt-mini with 2 layers, 4 heads, 128 wide, 64-token windows, batch 8 per
# rank, AdamW 2e-3 with 20 warm-up steps, seed 0, units by --wrap-min-params
# 20000 (one per block and the embeddings). The table: the training loss
# (mean of each --every steps) per mode, its largest relative distance from
# zero3's, and the final validation loss; `dtrain plot` draws the curves of
# every mode into --png. Data: scripts/gpt_data.sh (DT_GPT_DATA_DIR).
# BUILD=dir for another build directory; logs and metrics in $OUT (default
# $BUILD/bench-zeropp).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/bench-zeropp}
steps=300 every=25 modes="zero3 hpz qwz qgz zeropp" png=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --png) png=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
  esac
done
for v in "$steps" "$every"; do
  case $v in '' | *[!0-9]* | 0*) echo "$0: --steps and --every want positive counts, got '$v'" >&2; exit 2 ;; esac
done
[ "$every" -le "$steps" ] || { echo "$0: --every $every is more than --steps $steps (no mean to print)" >&2; exit 2; }
cli=$(realpath "$BUILD/dtrain" 2>/dev/null || echo "$BUILD/dtrain")
[ -x "$cli" ] || { echo "$0: $cli not built" >&2; exit 1; }
data=$(realpath -m "${DT_GPT_DATA_DIR:-$BUILD/gpt-data}")
DT_CLI=$cli DT_GPT_DATA_DIR=$data scripts/gpt_data.sh >/dev/null
vocab=$(cat "$data/vocab_size")
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
flags() {
  case "$1" in
    zero3) echo "" ;;
    hpz) echo "--zero-hpz 2" ;;
    qwz) echo "--zero-quantized-weights" ;;
    qgz) echo "--zero-quantized-gradients" ;;
    zeropp) echo "--zero-quantized-weights --zero-quantized-gradients --zero-hpz 2" ;;
    *) echo "$0: unknown mode $1" >&2; exit 2 ;;
  esac
}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for m in $modes; do
  # shellcheck disable=SC2207
  extra=($(flags "$m"))
  cmd=("$cli" run -n 4 -- "$cli" train --model gpt-mini --n-layer 2 --n-head 4 --n-embd 128 --block-size 64
       --vocab-size "$vocab" --seq 64 --batch 8 --optimizer adamw --lr 2e-3 --warmup 20 --seed 0
       --max-steps "$steps" --data "tokens:$data/train.bin" --val-data "tokens:$data/val.bin"
       --limit-test 256 --eval-every "$steps" --log-every 1 --progress none --threads 1
       --zero 3 --wrap-min-params 20000 --metrics "$OUT/$m.jsonl" "${extra[@]}")
  echo "+ DT_SIM_LOCAL_SIZE=2 ${cmd[*]}" >&2
  rm -f "$OUT/$m.jsonl"
  DT_SIM_LOCAL_SIZE=2 "${cmd[@]}" > "$OUT/$m.log" 2>&1 || { echo "$0: $m failed:" >&2; tail -5 "$OUT/$m.log" >&2; exit 1; }
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$OUT" "$every" "$load0" "$load1" $modes <<'PY'
import json, re, sys
out, every, load0, load1, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
curves = {}
for m in modes:
    curves[m] = [json.loads(l)["loss"] for l in open(f"{out}/{m}.jsonl") if '"event":"step"' in l]
n = min(len(c) for c in curves.values())
marks = list(range(every, n + 1, every))
mean = lambda c, s: sum(c[s - every:s]) / every
print(f"\n# gpt-mini on the Bible, 4 ranks (2 simulated machines x 2), loss = mean of the last {every} steps")
print(f"# load average (1, 5, 15 min) before: {load0}; after: {load1}")
print(f"{'mode':<8} " + " ".join(f"{'@' + str(s):>7}" for s in marks) + f" {'max rel':>8} {'val':>7}")
base = curves.get("zero3")
for m in modes:
    c = curves[m]
    rel = max(abs(mean(c, s) - mean(base, s)) / mean(base, s) for s in marks) if base else float("nan")
    val = re.findall(r"val loss: ([0-9.]+)", open(f"{out}/{m}.log").read())
    print(f"{m:<8} " + " ".join(f"{mean(c, s):7.4f}" for s in marks) + f" {100 * rel:7.2f}% {val[-1] if val else '?':>7}")
PY
if [ -n "$png" ]; then
  files=()
  for m in $modes; do files+=("$OUT/$m.jsonl"); done
  "$cli" plot "${files[@]}" -o "$png" --title "gpt-mini on the Bible: ZeRO-3 and ZeRO++ (4 ranks, 2 machines x 2)"
fi
