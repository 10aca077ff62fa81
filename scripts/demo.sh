#!/usr/bin/env bash
# make demo: train the ConvNet on Fashion-MNIST for one epoch with dtrain on
# two data-parallel ranks (DDP, batch 100 per rank; DT_DEMO_RANKS=1 for one
# process), then print the test accuracy (and draw the curves when gnuplot
# is there). DT_DEMO_LIMIT=N (make demo DEMO_LIMIT=N) trains on only the
# first N training images: a short demo (make fresh-check uses it).
# `make demo` has already installed what was missing and built build/dtrain.
set -euo pipefail
cd "$(dirname "$0")/.."
cli=${DT_CLI:-build/dtrain}
out=${DT_DEMO_DIR:-build/demo}
mkdir -p "$out"
[ -x "$cli" ] || { echo "demo: $cli is not built (run make)" >&2; exit 1; }

ranks=${DT_DEMO_RANKS:-2}
limit=${DT_DEMO_LIMIT:-0}
cmd=("$cli" train --model convnet --data fashion-mnist --epochs 1 --batch 100
     --optimizer sgd --lr 0.01 --momentum 0.9 --seed 0 --metrics "$out/metrics.jsonl"
     --log-every 20 --eval-every 50)
if [ "$limit" -gt 0 ]; then
  cmd+=(--limit-train "$limit")
fi
if [ "$ranks" -gt 1 ]; then
  cmd=("$cli" run -n "$ranks" -- "${cmd[@]}")
fi
echo "+ ${cmd[*]}"
"${cmd[@]}" | tee "$out/train.log"

if command -v gnuplot >/dev/null 2>&1; then
  "$cli" plot "$out/metrics.jsonl" -o "$out/loss.png" --title "dtrain: ConvNet on Fashion-MNIST"
fi
acc=$(sed -n 's/^\(\[0\] \)\{0,1\}test accuracy: \([0-9.]*\)%.*/\2/p' "$out/train.log")
[ -n "$acc" ] || { echo "demo: no accuracy in the output" >&2; exit 1; }
echo
if [ "$limit" -gt 0 ]; then
  echo "Fashion-MNIST test accuracy after one epoch over the first $limit training images on $ranks rank(s): ${acc}%"
elif [ "$ranks" -gt 1 ]; then
  echo "Fashion-MNIST test accuracy after one epoch on $ranks ranks: ${acc}% (PyTorch DDP, two ranks of batch 100: 85.4-88.0%)"
else
  echo "Fashion-MNIST test accuracy after one epoch: ${acc}% (PyTorch 1.13 reaches 85.4-88.4%)"
fi
