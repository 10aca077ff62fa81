#!/usr/bin/env bash
# bench/tp_step.sh — the tensor-parallel step against one process on the
# same cores: 2 ranks x 1 thread (dtrain run -n 2 -- dtrain bench step --tp 2
# --threads 1) vs 1 process x 2 threads (dtrain bench step --threads 2), the
# same model, batch and optimizer (the step of `dtrain train`: SGD for the
# MLP, AdamW for GPT models), each the median of --steps timed steps.
# Prints both medians and the ratio tp / one process (issue 16's target:
# at most 1.15).
#
#   bench/tp_step.sh [--models mlp,gpt-mini] [--batch N] [--seq T] [--steps S] [--warmup W]
#
# Set BUILD=dir for another build directory. The lead runs it for the
# figures; on a shared machine the ratio moves with the load (run it quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
models=mlp,gpt-mini batch=() seq=() steps=20 warmup=3
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --batch) batch=(--batch "$2"); shift 2 ;;
    --seq) seq=(--seq "$2"); shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    *) echo "usage: $0 [--models mlp,gpt-mini] [--batch N] [--seq T] [--steps S] [--warmup W]" >&2; exit 2 ;;
  esac
done
dt=$BUILD/dtrain
[ -x "$dt" ] || { echo "$0: $dt not built" >&2; exit 1; }
common=(--steps "$steps" --warmup "$warmup" --peak-reps 0 --json "${batch[@]}" "${seq[@]}")
IFS=, read -r -a list <<< "$models"
printf '%-10s %14s %14s %8s\n' model "1x2 ms/step" "tp2x1 ms/step" ratio
for m in "${list[@]}"; do
  one=$("$dt" bench step --model "$m" --threads 2 "${common[@]}")
  tp=$("$dt" run -n 2 -- "$dt" bench step --model "$m" --threads 1 --tp 2 "${common[@]}" | sed 's/^\[0\] //' | grep '"bench"' || true)
  a=$(sed -n 's/.*"median_ms":\([0-9.]*\).*/\1/p' <<< "$one")
  b=$(sed -n 's/.*"median_ms":\([0-9.]*\).*/\1/p' <<< "$tp")
  [ -n "$a" ] && [ -n "$b" ] || { echo "$0: $m: no result (one: '$one', tp: '$tp')" >&2; exit 1; }
  printf '%-10s %14.2f %14.2f %8.3f\n' "$m" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print b / a }')"
done
