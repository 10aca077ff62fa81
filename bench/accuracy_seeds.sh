#!/usr/bin/env bash
# Test accuracy after one epoch of the ConvNet on Fashion-MNIST, dtrain and
# PyTorch side by side, seed by seed (PyTorch only as a reference; skipped when
# /usr/bin/python3 has no torch).
#
#   bash bench/accuracy_seeds.sh [--ranks 2] [--batch 100] [--rng torch] [--threads 1]
#                                [--precision fp32|bf16|fp16] [--no-torch] SEED...
#
# --ranks 2: `dtrain run -n 2 -- dtrain train ...` against
#            bench/train_convnet_ddp_pytorch.py (DDP gloo, DistributedSampler(seed=SEED));
# --ranks 1: `dtrain train ...` against bench/train_convnet_pytorch.py.
# With --rng torch (the default) both start from the same weights and see the
# batches in the same order, so the two columns differ only by float rounding.
# --precision fp16 trains dtrain with dynamic loss scaling (the torch column
# stays f32: the band it gives is what fp16 must land in); --no-torch leaves
# the PyTorch column out.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=2 batch=100 rng=torch threads=1 precision=fp32 notorch=0 seeds=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --rng) rng=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --no-torch) notorch=1; shift ;;
    *) seeds+=("$1"); shift ;;
  esac
done
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
cli=${DT_CLI:-build/dtrain}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
have_torch=0
[ $notorch = 1 ] || { /usr/bin/python3 -c 'import torch' 2>/dev/null && have_torch=1; }
printf '%-6s %-14s %-14s %-10s %-10s\n' seed dtrain_acc% torch_acc% dtrain_s torch_s
for s in "${seeds[@]}"; do
  args=(train --model convnet --data fashion-mnist --epochs 1 --batch "$batch" --lr 0.01 --momentum 0.9
        --seed "$s" --rng "$rng" --progress none --precision "$precision")
  # a failed run stops the table with its own message (set -e alone would end it silently)
  rc=0
  if [ "$ranks" -gt 1 ]; then
    out=$("$cli" run -n "$ranks" -- "$cli" "${args[@]}" 2>&1) || rc=$?
  else
    out=$("$cli" "${args[@]}" --threads "$threads" 2>&1) || rc=$?
  fi
  if [ $rc != 0 ]; then # its output, then the first line that is not the launcher's, as the reason
    why=$(grep -v -e '^dtrain run:' -e '^[[:space:]]*$' <<<"$out" | head -n 1 | sed 's/^\[[0-9]*\] //')
    printf '%s\n' "$out" >&2
    echo "accuracy_seeds.sh: dtrain failed (exit $rc, seed $s): ${why:-no message}" >&2
    exit $rc
  fi
  da=$(sed -n 's/^\(\[0\] \)\{0,1\}test accuracy: \([0-9.]*\)%.*/\2/p' <<<"$out")
  dw=$(sed -n 's/^\(\[0\] \)\{0,1\}epoch wall time: \([0-9.]*\) s.*/\2/p' <<<"$out")
  ta=- tw=-
  if [ $have_torch = 1 ]; then
    if [ "$ranks" -gt 1 ]; then
      tout=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/train_convnet_ddp_pytorch.py --world "$ranks" \
             --batch "$batch" --seed "$s" 2>&1) || rc=$?
    else
      tout=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/train_convnet_pytorch.py --batch "$batch" \
             --seed "$s" --threads "$threads" 2>&1) || rc=$?
    fi
    [ $rc = 0 ] || { printf '%s\n' "$tout" >&2; echo "accuracy_seeds.sh: PyTorch failed (exit $rc, seed $s)" >&2; exit $rc; }
    ta=$(sed -n 's/^test accuracy: \([0-9.]*\)%.*/\1/p' <<<"$tout")
    tw=$(sed -n 's/^epoch wall time: \([0-9.]*\) s.*/\1/p' <<<"$tout")
  fi
  printf '%-6s %-14s %-14s %-10s %-10s\n' "$s" "${da:-?}" "${ta:-?}" "${dw:-?}" "${tw:-?}"
done
