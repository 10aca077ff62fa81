#!/usr/bin/env bash
# bench/llama_vs_torch.sh — the ~100M Llama's bf16 training step, dtrain
# against transformers' LlamaForCausalLM (bench/torch_llama_step.py, with
# the peers' python from $PEER_PYTHON), eager and torch.compile, on the same
# batch, sequence length and threads. The three run interleaved, ROUNDS
# times (dtrain, compile, eager in each round); each prints its median step
# (wall) and its median process CPU time per step (cpu_ms: the steadier
# measure on a shared machine) and peak RSS. Prints every round, then the
# medians over the rounds and the ratios dtrain / torch (the target against
# torch.compile: at most 0.6). A peer that cannot run (no torch or
# transformers in PEER_PYTHON, a failed step) stops the script with its
# error. Threads default to 2, the whole of a 2-core
# machine, as the GPT-2 comparisons run; the peer runs on transparent huge
# pages (THP_MEM_ALLOC_ENABLE=1, bench/peer_huge_pages.py) as dtrain does.
#
#   PEER_PYTHON=... bench/llama_vs_torch.sh [--rounds 3] [--threads 2] [--batch 4] [--seq 64] [--steps 5]
#                                          [--hf-config FILE]
#
# --hf-config FILE: another Llama-family model in place of llama-100m, a
# transformers config.json (bench/configs/gemma3_100m.json: a Gemma 3 of
# 77M with sliding windows of 512; bench/configs/qwen3_moe_100m.json: a
# Qwen3-MoE of 98M, 16 experts, 4 a token); the peer's python draws its weights into
# a temporary Hugging Face directory that both sides read (dtrain's
# --model hf:DIR, the peer's from_pretrained). Give such a config no
# pad_token_id: the bench's random ids hit the padding row, which a fresh
# init leaves zero, and a zero row through ten layers of Gemma's norms
# overflows the gradient (1/sqrt(eps) a norm; transformers' too).
#
# torch.compile compiles in its warm-up steps (minutes on 2 cores the first
# time; the inductor cache keeps the kernels for later runs). Set BUILD=dir
# for another build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rounds=3 threads=2 batch=4 seq=64 steps=5 hfcfg=
while [ $# -gt 0 ]; do
  case "$1" in
    --hf-config) hfcfg=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--threads T] [--batch B] [--seq T] [--steps S] [--hf-config FILE]" >&2; exit 2 ;;
  esac
done
dt=$BUILD/dtrain
[ -x "$dt" ] || { echo "$0: $dt not built" >&2; exit 1; }
[ -n "${PEER_PYTHON:-}" ] || { echo "$0: set PEER_PYTHON to a python with torch and transformers" >&2; exit 1; }
"$PEER_PYTHON" -c 'import torch, transformers' 2>/dev/null ||
  { echo "$0: $PEER_PYTHON cannot import torch and transformers (install them in its environment)" >&2; exit 1; }
errf=$(mktemp "${TMPDIR:-/tmp}/dt_llama_peer_XXXXXX") dir=
trap 'rm -f "$errf"; [ -z "$dir" ] || rm -rf "$dir"' EXIT
py=("$PEER_PYTHON" bench/torch_llama_step.py --threads "$threads" --batch "$batch" --seq "$seq" --bf16 --steps "$steps")
model=llama-100m
if [ -n "$hfcfg" ]; then
  [ -f "$hfcfg" ] || { echo "$0: --hf-config $hfcfg: no such file" >&2; exit 2; }
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dt_hfbench_XXXXXX")
  cp "$hfcfg" "$dir/config.json"
  "$PEER_PYTHON" - "$dir" <<'PY' 2>/dev/null
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])
PY
  model=hf:$dir py+=(--hf-dir "$dir")
  echo "model: $hfcfg ($("$dt" bench step --model "$model" --batch 1 --seq 8 --steps 1 --warmup 0 --peak-reps 0 --json | sed -n 's/.*"params":\([0-9]*\).*/\1/p') parameters)"
fi
med() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
field() { sed -n "s/.*$1[\": ]*\([0-9.]*\).*/\1/p" | head -1; }
# the peer's step line; a failed run stops the script with the end of its error output
peer() {
  local o
  if ! o=$("${py[@]}" "$@" 2>"$errf"); then
    echo "$0: the peer failed: ${py[*]} $*" >&2
    tail -5 "$errf" >&2
    return 1
  fi
  echo "$o" | tail -1
}
declare -A wall cpu rss
for r in $(seq 1 "$rounds"); do
  out=$("$dt" bench step --model "$model" --precision bf16 --batch "$batch" --seq "$seq" --threads "$threads" \
        --steps "$steps" --peak-reps 0 --json)
  wall[dtrain]+="$(echo "$out" | field median_ms) " cpu[dtrain]+="$(echo "$out" | field '"cpu_ms') "
  rss[dtrain]+="$(echo "$out" | field peak_rss_mib) "
  out=$(peer --warmup 2 --compile)
  wall[compile]+="$(echo "$out" | field median_ms) " cpu[compile]+="$(echo "$out" | field cpu_ms) "
  rss[compile]+="$(echo "$out" | field peak_rss_mib) "
  out=$(peer --warmup 1)
  wall[eager]+="$(echo "$out" | field median_ms) " cpu[eager]+="$(echo "$out" | field cpu_ms) "
  rss[eager]+="$(echo "$out" | field peak_rss_mib) "
  last() { local a=($1); echo "${a[-1]}"; }
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg)): median_ms / cpu_ms  dtrain $(last "${wall[dtrain]}") /" \
       "$(last "${cpu[dtrain]}")  compile $(last "${wall[compile]}") / $(last "${cpu[compile]}")  eager" \
       "$(last "${wall[eager]}") / $(last "${cpu[eager]}")"
done
for k in dtrain compile eager; do
  w=$(echo "${wall[$k]}" | tr ' ' '\n' | grep . | med) c=$(echo "${cpu[$k]}" | tr ' ' '\n' | grep . | med)
  m=$(echo "${rss[$k]}" | tr ' ' '\n' | grep . | med)
  eval "W_$k=$w C_$k=$c"
  echo "$k: median over $rounds rounds: ${w} ms/step, ${c} CPU ms/step, peak RSS ${m} MiB"
done
awk -v dw="$W_dtrain" -v dc="$C_dtrain" -v cw="$W_compile" -v cc="$C_compile" -v ew="$W_eager" -v ec="$C_eager" \
  'BEGIN {printf "dtrain / torch.compile: %.2f (wall), %.2f (CPU); dtrain / eager: %.2f (wall), %.2f (CPU)\n", dw / cw, dc / cc, dw / ew, dc / ec}'
