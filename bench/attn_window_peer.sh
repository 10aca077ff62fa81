#!/usr/bin/env bash
# bench/attn_window_peer.sh — Gemma 2's soft-capped causal attention, or
# a sliding window without a cap (Mistral's, Qwen2's, Gemma 3's), forward
# and backward, f32 or bf16: dtrain's dt_attention_window (build/bench/
# attn_window) against PyTorch as transformers computes it, with the
# peer's python from $PEER_PYTHON, interleaved ROUNDS times on the same
# sizes and threads. With a cap: eager (matmul, scale, tanh cap, the causal
# and window mask, softmax in f32, matmul: Gemma 2's eager attention, SDPA
# having no soft cap); without one: SDPA with the sliding window's boolean
# mask (transformers' sdpa attention for Mistral and Qwen2). Prints each
# round and the medians of the rounds' medians.
#
#   PEER_PYTHON=... bench/attn_window_peer.sh [--rounds 3] [--seq 1024] [--heads 8] [--hdim 64] [--cap 50]
#                                             [--window 0] [--dtype f32] [--threads 2]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rounds=3 seq=1024 heads=8 hdim=64 cap=50 window=0 dtype=f32 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --hdim) hdim=$2; shift 2 ;;
    --cap) cap=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--seq T] [--heads H] [--hdim D] [--cap C] [--window W] [--dtype f32|bf16] [--threads N]" >&2; exit 2 ;;
  esac
done
: "${PEER_PYTHON:?set PEER_PYTHON to a python with torch}"
[ -x "$BUILD/bench/attn_window" ] || cmake --build "$BUILD" --target bench_attn_window >/dev/null
peer() {
  "$PEER_PYTHON" - "$seq" "$heads" "$hdim" "$cap" "$threads" "$window" "$dtype" <<'PY'
import sys, time, torch
T, H, D, cap, th = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
W, dt = int(sys.argv[6]), torch.bfloat16 if sys.argv[7] == "bf16" else torch.float32
torch.set_num_threads(th)
g = torch.Generator().manual_seed(1)
q, k, v = (torch.randn(1, H, T, D, generator=g).to(dt).requires_grad_() for _ in range(3))
i = torch.arange(T)
seen = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] < W) if W > 0 else True)  # [query, key]
mask = torch.zeros(T, T, dtype=dt).masked_fill(~seen, float("-inf"))
def att():
    if cap == 0:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen)
    s = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
    s = torch.tanh(s / cap) * cap
    return torch.matmul(torch.softmax(s + mask, -1, dtype=torch.float32).to(dt), v)
fw, bw = [], []
for r in range(8):
    t0 = time.perf_counter(); y = att(); t1 = time.perf_counter(); y.sum().backward(); t2 = time.perf_counter()
    if r:
        fw.append((t1 - t0) * 1e3); bw.append((t2 - t1) * 1e3)
fw.sort(); bw.sort()
print("torch %s (cap %g, window %d): forward %.2f ms, backward %.2f ms"
      % ("eager" if cap else "sdpa", cap, W, fw[len(fw) // 2], bw[len(bw) // 2]))
PY
}
df=() db=() tf=() tb=()
for r in $(seq "$rounds"); do
  d=$("$BUILD/bench/attn_window" --seq "$seq" --heads "$heads" --hdim "$hdim" --cap "$cap" --window "$window" \
      --dtype "$dtype" --threads "$threads" | head -1)
  t=$(peer)
  echo "round $r: $d | $t"
  df+=("$(sed -E 's/.*forward ([0-9.]+) ms.*/\1/' <<<"$d")"); db+=("$(sed -E 's/.*backward ([0-9.]+) ms.*/\1/' <<<"$d")")
  tf+=("$(sed -E 's/.*forward ([0-9.]+) ms.*/\1/' <<<"$t")"); tb+=("$(sed -E 's/.*backward ([0-9.]+) ms.*/\1/' <<<"$t")")
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mdf=$(med "${df[@]}") mdb=$(med "${db[@]}") mtf=$(med "${tf[@]}") mtb=$(med "${tb[@]}")
awk -v a="$mdf" -v b="$mdb" -v c="$mtf" -v d="$mtb" 'BEGIN {
  printf "median: dtrain forward %.2f ms, backward %.2f ms; torch forward %.2f ms, backward %.2f ms\n", a, b, c, d
  printf "ratio dtrain / torch: forward %.2f, backward %.2f, both %.2f\n", a / c, b / d, (a + b) / (c + d) }'
