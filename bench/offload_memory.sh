#!/usr/bin/env bash
# Memory headline of issue 13, offload part (a benchmark, not a test: a few
# minutes on the 2-core development machine; run it by hand).
#
#   bench/offload_memory.sh [BUILD_DIR]        (default: build)
#
# 1. The ZeRO formula: dtrain's per-rank model-state estimate (offload.h)
#    for N = 1, 2, 4 and stages 0-3, row by row against the paper's formula
#    written out independently (bench/offload_mem.c).
# 2. Measured: the bytes a trainer really holds (parameter and gradient
#    flats, optimizer state) equal the estimate, without and with NVMe
#    offload, and the peak RSS of each (an MLP of 2*DIM*HIDDEN parameters).
# 3. A model whose optimizer state does not fit under a memory limit trains
#    with offload: an address-space limit (ulimit -v, RLIMIT_AS: no cgroup
#    needed) of LIMIT_MB; the MLP of 2*BIG_DIM*BIG_HIDDEN parameters needs
#    16 bytes per parameter of model state with AdamW. Without offload,
#    dtrain train refuses at start (exit 1, naming the bytes); with
#    --offload nvme:DIR it trains (2 steps, loss printed).
# 4. The 1e9-parameter headline: DDP on 2 ranks with AdamW fails at start
#    with the bytes it needs (never the OOM killer); with --zero 3 (when the
#    ZeRO strategy is built in) it trains a few steps.
# 5. Stage 3 parameter offload (--offload-param nvme:DIR) on 2 ranks: a GPT
#    of P_LAYERS blocks (one unit each) on the Bible tokens, AdamW with the
#    optimizer state offloaded too, against the same without parameter
#    offload and against plain stage 3, interleaved REPS times (A B C A B C):
#    each rank's parameter bytes and peak RSS (the trainer's report) and the
#    seconds per step over the run (first step included).
#    P_LAYERS/P_EMBD/P_HEAD (default 12/768/12: GPT-2 124M's shape with a
#    4096-token vocabulary), P_STEPS (default 4), REPS (default 2); SKIP
#    (e.g. "1 2 3 4") runs only the other sections.
#
# Environment: OFFLOAD_DIR (default $TMPDIR or /tmp; needs free space of
# 8 bytes per parameter of the big model), DIM/HIDDEN (step 2; default
# 4096/16384), BIG_DIM/BIG_HIDDEN (step 3; default 4096/32768, 268M
# parameters, 4 GiB of model state of which 2 GiB optimizer state),
# LIMIT_MB (step 3; default 3584).
set -euo pipefail
B=${1:-build}
DIR=${OFFLOAD_DIR:-${TMPDIR:-/tmp}}
DT=$B/dtrain
MEM=$B/bench/offload_mem
for f in "$DT" "$MEM"; do
  [ -x "$f" ] || { echo "offload_memory: $f not built (cmake --build $B)" >&2; exit 2; }
done
DIM=${DIM:-4096} HIDDEN=${HIDDEN:-16384}
BIG_DIM=${BIG_DIM:-4096} BIG_HIDDEN=${BIG_HIDDEN:-32768} LIMIT_MB=${LIMIT_MB:-3584}
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo); offload dir $DIR"

skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }

if ! skip 1; then
echo; echo "== 1. ZeRO formula (estimator vs the paper's rows)"
"$MEM" formula
fi

if ! skip 2; then
echo; echo "== 2. held bytes vs the estimate, peak RSS; mlp $DIM x $HIDDEN, one AdamW step"
"$MEM" measure "$DIM" "$HIDDEN" "$DIR"
fi

if ! skip 3; then
echo; echo "== 3. under ulimit -v ${LIMIT_MB} MiB: mlp $BIG_DIM x $BIG_HIDDEN, AdamW"
train=("$DT" train --model mlp --mlp-dim "$BIG_DIM" --mlp-hidden "$BIG_HIDDEN" --optimizer adamw --lr 1e-4
       --batch 1 --random-items 2 --limit-test 1 --no-eval --progress plain --log-every 1 --threads "$(nproc)")
set +e
( ulimit -v $((LIMIT_MB * 1024)); "${train[@]}" ) > /tmp/offload_memory.$$ 2>&1
rc=$?
set -e
sed 's/^/   /' /tmp/offload_memory.$$
echo "   without offload: exit $rc (expected 1: refused at start)"
[ $rc -eq 1 ] && grep -q "needs .* bytes" /tmp/offload_memory.$$ || { echo "UNEXPECTED"; exit 1; }
set +e
( ulimit -v $((LIMIT_MB * 1024)); /usr/bin/time -f "   peak RSS %M KiB, %e s" "${train[@]}" --offload "nvme:$DIR" ) \
  > /tmp/offload_memory.$$ 2>&1
rc=$?
set -e
sed 's/^/   /' /tmp/offload_memory.$$
echo "   with --offload nvme:$DIR: exit $rc (expected 0: trained)"
rm -f /tmp/offload_memory.$$
[ $rc -eq 0 ] || { echo "UNEXPECTED"; exit 1; }
fi

if ! skip 4; then
echo; echo "== 4. 1e9 parameters (mlp 16384 x 32768), AdamW, 2 ranks"
big=(--model mlp --mlp-dim 16384 --mlp-hidden 32768 --optimizer adamw --lr 1e-4 --batch 1 --random-items 8
     --limit-test 2 --no-eval --progress plain --log-every 1)
set +e
"$DT" run -n 2 -- "$DT" train "${big[@]}" 2>&1 | sed 's/^/   /'
rc=${PIPESTATUS[0]}
set -e
echo "   DDP: exit $rc (expected 1: refused at start with the bytes needed)"
if "$DT" train --help | grep -q -- "--zero"; then
  set +e
  /usr/bin/time -f "   launcher: %e s" "$DT" run -n 2 -- "$DT" train "${big[@]}" --zero 3 2>&1 | sed 's/^/   /'
  echo "   --zero 3: exit ${PIPESTATUS[0]} (expected 0)"
  set -e
else
  echo "   (--zero is not in this build of dtrain train: the stage-3 run is skipped)"
fi
fi

if ! skip 5; then
L=${P_LAYERS:-12} E=${P_EMBD:-768} H=${P_HEAD:-12} STEPS=${P_STEPS:-4} REPS=${REPS:-2}
echo; echo "== 5. stage 3 parameter offload: gpt2 shape $L x $E, AdamW, 2 ranks, $STEPS steps; load: $(uptime | sed 's/.*load/load/')"
data=$(realpath -m "${DT_GPT_DATA_DIR:-$B/gpt-data}")
DT_CLI=$DT DT_GPT_DATA_DIR=$data scripts/gpt_data.sh >/dev/null
gpt=(--model gpt2 --n-layer "$L" --n-embd "$E" --n-head "$H" --vocab-size "$(cat "$data/vocab_size")" --block-size 64
     --data "tokens:$data/train.bin" --no-eval --zero 3 --wrap-min-params "${P_WRAP:-5000000}" --optimizer adamw --lr 1e-4
     --batch 2 --seq 64 --max-steps "$STEPS" --threads 1 --rng philox --progress plain --log-every 1)
declare -A extra=([plain]="" [optim]="--offload nvme:$DIR" [optim+param]="--offload nvme:$DIR --offload-param nvme:$DIR")
out=/tmp/offload_memory_p.$$
for r in $(seq "$REPS"); do
  for mode in plain optim optim+param; do
    # shellcheck disable=SC2086
    "$DT" run -n 2 -- "$DT" train "${gpt[@]}" ${extra[$mode]} > "$out" 2>&1 || { cat "$out"; echo "UNEXPECTED"; exit 1; }
    # seconds per step over the epoch (the "done: N steps, loss X, T s" line; the first step included)
    st=$(sed -n 's/.*done: \([0-9]*\) steps, loss [^,]*, \([0-9.]*\) s.*/\2 \1/p' "$out" | awk '{printf "%.2f", $1 / $2}')
    printf "   rep %d %-12s %s s/step;" "$r" "$mode" "$st"
    grep -o 'memory rank [01]: parameters [^,]*,.*peak RSS .*' "$out" | sed 's/, gradients.*peak RSS/; peak RSS/' |
      tr '\n' ' ' ; echo
  done
done
rm -f "$out"
echo "   (load after: $(uptime | sed 's/.*load/load/'))"
fi
