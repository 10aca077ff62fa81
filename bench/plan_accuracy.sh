#!/usr/bin/env bash
# The planner's accuracy (dtrain plan, dtrain train --plan auto): a
# benchmark, not a test; ~10-20 minutes on a 2-core machine. Run by hand:
#
#   bench/plan_accuracy.sh DTRAIN [OUTDIR]
#
# Trains GPT-2 124M (seq 32, global batch 4, AdamW, STEPS steps, default 3)
# in 11 layouts on 2, 4 and 8 ranks, and a ~1B-class model (gpt2-large,
# 774M parameters, seq 32, global batch 2, STEPS_BIG steps, default 2) in 3
# layouts that fit 24 GiB (ZeRO-3 on 2 and 4 ranks, 2 pipeline stages), plus
# --plan auto on 2 and 4 ranks of GPT-2; each run's --metrics end record
# carries the measured peak RSS (the largest rank's) and median step time
# beside the planner's prediction for that layout. Prints one Markdown row
# per run: the measured and predicted memory, the measured step and the
# prediction (which assumes the machine's cores to itself), and, since the
# machine may be shared, the cores the run's processes got on average
# ((user + system CPU seconds) / wall, /usr/bin/time) and the prediction
# scaled to that share. The --plan auto runs' choice lines follow. Random tokens (vocabulary 50257) in
# OUTDIR (default a temporary directory); the calibration is cached in
# OUTDIR/cache (DT_CACHE_DIR), measured once before the runs (dtrain plan).
# The machine may be shared: say so when quoting figures.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,19p "$0"; exit 2; }
DT=$(readlink -f "$1")
OUT=${2:-$(mktemp -d)}
STEPS=${STEPS:-3}
STEPS_BIG=${STEPS_BIG:-2}
PY=${PYTHON:-python3}
mkdir -p "$OUT/cache"
export DT_CACHE_DIR="$OUT/cache" DT_INIT_TIMEOUT=600
"$PY" - "$OUT/tok.bin" <<'PYEOF'
import random, struct, sys
random.seed(0)
n = 200000
h = [0] * 256
h[0], h[1], h[2] = 20240520, 1, n
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *h))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PYEOF
"$DT" plan --model gpt2 --seq 32 --world 2 --global-batch 4 >/dev/null
"$DT" plan --model gpt2-large --seq 32 --world 2 --global-batch 2 >/dev/null
run() { # NAME MODEL N BATCH STEPS FLAGS...
    local name=$1 model=$2 n=$3 batch=$4 steps=$5
    shift 5
    local m="$OUT/$name.jsonl"
    rm -f "$m"
    if /usr/bin/time -f "%e %U %S" -o "$OUT/$name.time" "$DT" run -n "$n" -- "$DT" train --model "$model" --seq 32 \
        --data "tokens:$OUT/tok.bin" --batch "$batch" --optimizer adamw --lr 1e-4 --max-steps "$steps" --no-eval \
        --mfu-peak 1 --metrics "$m" "$@" >"$OUT/$name.log" 2>&1; then
        "$PY" - "$m" "$name" "$model" "$n" "$*" "$OUT/$name.time" "$(nproc)" <<'PYEOF'
import json, sys
end = [json.loads(l) for l in open(sys.argv[1]) if '"end"' in l][-1]
pr, mr = end.get("predicted_peak_rss_bytes", 0), end.get("peak_rss_bytes", 0)
pt, mt = end.get("predicted_step_ms", 0), end.get("step_ms", 0)
e, u, s = map(float, open(sys.argv[6]).read().split()[-3:])
cores = int(sys.argv[7])
got = (u + s) / e if e > 0 else cores  # cores the run's processes had on average
pl = pt * max(1.0, cores / got) if got > 0 else pt  # the prediction at the share the run got
e1 = 100 * (pr / mr - 1) if mr else float("nan")
e2 = 100 * (pt / mt - 1) if mt else float("nan")
e3 = 100 * (pl / mt - 1) if mt else float("nan")
print("| %s | %s | %d | %s | %.0f | %.0f | %+.1f%% | %.0f | %.0f | %+.1f%% | %.2f | %.0f | %+.1f%% |" % (
    sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] or "(DDP)", mr / 2**20, pr / 2**20, e1, mt, pt, e2,
    got, pl, e3), flush=True)
PYEOF
    else
        echo "$name: failed (see $OUT/$name.log)"
    fi
}
echo "| run | model | ranks | flags | peak RSS MiB | predicted | error | step ms | predicted (idle) | error | cores got | predicted at that share | error |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
run g2-dp2-z0 gpt2 2 2 "$STEPS"
run g2-dp2-z1 gpt2 2 2 "$STEPS" --zero 1
run g2-dp2-z2 gpt2 2 2 "$STEPS" --zero 2
run g2-dp2-z3 gpt2 2 2 "$STEPS" --zero 3
run g2-dp2-ga2 gpt2 2 1 "$STEPS" --grad-accum 2
run g2-dp2-ckpt gpt2 2 2 "$STEPS" --activation-checkpointing
run g2-pp2 gpt2 2 4 "$STEPS" --pp 2 --micro-batches 2
run g2-tp2 gpt2 2 4 "$STEPS" --tp 2
run g2-auto2 gpt2 2 2 "$STEPS" --plan auto
run g2-dp4-z1 gpt2 4 1 "$STEPS" --zero 1
run g2-dp2-pp2 gpt2 4 2 "$STEPS" --pp 2 --micro-batches 2
run g2-auto4 gpt2 4 1 "$STEPS" --plan auto
run g2-dp8-z3 gpt2 8 1 "$STEPS" --zero 3 --dp 8
run big-z3-2 gpt2-large 2 1 "$STEPS_BIG" --zero 3
run big-pp2 gpt2-large 2 2 "$STEPS_BIG" --pp 2 --micro-batches 2
run big-z3-4 gpt2-large 4 1 "$STEPS_BIG" --zero 3 --grad-accum 1
grep -h 'plan auto chose' "$OUT"/g2-auto*.log || true
