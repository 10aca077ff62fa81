#!/usr/bin/env bash
# bench/first_step.sh — the time to the first training step of a GPT-2 from
# scratch, as a user waits for it: `dtrain train --model gpt2` (its own
# "first step done N s after start" line: process start to the first
# optimizer step done, the model's initial values drawn as transformers
# draws them, --rng torch, the default) against transformers'
# GPT2LMHeadModel(config) with AdamW (bench/torch_first_step.py, with the
# peer's python from $PEER_PYTHON: the imports, the model, the first step),
# and optionally another dtrain build ($DT_BASE_CLI: its dtrain program) on
# the same command. The runs alternate ROUNDS times, the order reversed
# every other round (on a VM a run after a pause or after another program
# pays seconds for memory the host has not backed lately); prints every
# round, then the medians and the ratios.
#
#   [PEER_PYTHON=...] [DT_BASE_CLI=...] bench/first_step.sh [--rounds 3] [--model gpt2|gpt2-medium|gpt-micro]
#                     [--batch 4] [--seq 64] [--threads 2]
#
# dtrain trains on a token file of random tokens the script writes (llm.c's
# format; deleted at the end). Set DT_CLI for another dtrain than build/dtrain.
# gpt-micro (2 layers, 64 wide, vocabulary 512) is for checking the script.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 model=gpt2 batch=4 seq=64 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds|--model|--batch|--seq|--threads)
      [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
      case "$1" in --rounds) rounds=$2 ;; --model) model=$2 ;; --batch) batch=$2 ;; --seq) seq=$2 ;;
                   --threads) threads=$2 ;; esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--rounds N] [--model gpt2|gpt2-medium|gpt-micro] [--batch B] [--seq T] [--threads N]" >&2
       exit 2 ;;
  esac
done
case "$model" in gpt2|gpt2-medium) vocab=50257 ;; gpt-micro) vocab=512 ;;
  *) echo "$0: --model gpt2, gpt2-medium or gpt-micro" >&2; exit 2 ;; esac
for v in "$rounds" "$batch" "$seq" "$threads"; do
  case $v in ''|*[!0-9]*|0) echo "$0: '$v' is not a positive count" >&2; exit 2 ;; esac
done
dt=${DT_CLI:-build/dtrain}
[ -x "$dt" ] || { echo "$0: $dt not built (make build)" >&2; exit 1; }
[ -z "${DT_BASE_CLI:-}" ] || [ -x "$DT_BASE_CLI" ] ||
  { echo "$0: DT_BASE_CLI=$DT_BASE_CLI is not a program" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-first-step.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
# llm.c's token file: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens
python3 - "$tmp/tok.bin" "$((batch * seq * 8 + 1))" "$vocab" <<'PY'
import array, random, sys
n, vocab = int(sys.argv[2]), int(sys.argv[3]); random.seed(0)
h = array.array("i", [0] * 256); h[0], h[1], h[2] = 20240520, 1, n
t = array.array("H", (random.randrange(vocab) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    h.tofile(f); t.tofile(f)
PY
dtrain_run() { # prints "total_s step_s", or fails with the run's output
  "$1" train --model "$model" --data "tokens:$tmp/tok.bin" --batch "$batch" --seq "$seq" --threads "$threads" \
      --optimizer adamw --max-steps 1 --no-eval >"$tmp/run.log" 2>&1 || true
  local v
  v=$(sed -n 's/^first step done \([0-9.]*\) s after start (the step, data loading included: \([0-9.]*\) s).*/\1 \2/p' \
      "$tmp/run.log")
  [ -n "$v" ] || { echo "$0: $1 train printed no 'first step done' line:" >&2; tail -n 5 "$tmp/run.log" >&2; return 1; }
  echo "$v"
}
med() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
: >"$tmp/dt"; : >"$tmp/base"; : >"$tmp/peer"
echo "# bench/first_step.sh: $model B=$batch T=$seq threads $threads, $rounds round(s)," \
  "$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
# One case of a round: its figures appended to its file, its part of the round's line in $tmp/line.<case>.
case_dt() {
  d=$(dtrain_run "$dt") || return 1
  echo "$d" >>"$tmp/dt"
  echo "dtrain ${d% *} s (step ${d#* } s)" >"$tmp/line.dt"
}
case_base() {
  b=$(dtrain_run "$DT_BASE_CLI") || return 1
  echo "$b" >>"$tmp/base"
  echo "; base ${b% *} s (step ${b#* } s)" >"$tmp/line.base"
}
case_peer() {
  j=$("$PEER_PYTHON" bench/torch_first_step.py --model "$model" --batch "$batch" --seq "$seq" \
        --threads "$threads" 2>/dev/null | tail -n 1)
  p=$(echo "$j" |
      sed -n 's/.*"import_s": \([0-9.]*\).*"model_s": \([0-9.]*\).*"first_step_s": \([0-9.]*\).*/\3 \1 \2/p')
  [ -n "$p" ] || { echo "$0: bench/torch_first_step.py printed no figures (torch and transformers?)" >&2; return 1; }
  echo "$p" >>"$tmp/peer"
  set -- $p
  echo "; transformers ${1:-?} s (imports done at ${2:-?} s, model and optimizer at ${3:-?} s)" >"$tmp/line.peer"
}
cases=dt
[ -z "${DT_BASE_CLI:-}" ] || cases="$cases base"
[ -z "${PEER_PYTHON:-}" ] || cases="$cases peer"
n=$(echo $cases | wc -w)
for r in $(seq 1 "$rounds"); do
  # the order is reversed every other round (as bench/compare.sh's A B, B A): a run pays for memory the
  # host has not backed lately (on a VM several seconds after a pause or after another program; little
  # right after a run that freed the same memory), so no case may always run first or after the same one
  rm -f "$tmp"/line.*
  for k in $(seq 1 "$n"); do
    i=$(( r % 2 ? k : n + 1 - k ))
    c=$(echo $cases | cut -d' ' -f"$i")
    "case_$c" || exit 1
  done
  echo "round $r: $(cat "$tmp/line.dt" "$tmp"/line.base "$tmp"/line.peer 2>/dev/null | tr -d '\n')"
done
dm=$(cut -d' ' -f1 "$tmp/dt" | med)
echo "median: dtrain $dm s to the first step done"
if [ -s "$tmp/base" ]; then
  bm=$(cut -d' ' -f1 "$tmp/base" | med)
  echo "median: base $bm s; dtrain / base $(awk -v a="$dm" -v b="$bm" 'BEGIN {printf "%.3f", a / b}')"
fi
if [ -s "$tmp/peer" ]; then
  pm=$(cut -d' ' -f1 "$tmp/peer" | med)
  echo "median: transformers $pm s; dtrain / transformers $(awk -v a="$dm" -v b="$pm" 'BEGIN {printf "%.3f", a / b}')"
fi
