#!/usr/bin/env bash
# Context parallelism: per-rank peak memory and step time against one rank
# at the same global sequence (a benchmark, not a test; several minutes on
# the 2-core development machine; run it by hand):
#
#   bench/cp_memory.sh DTRAIN
#
# A GPT of 4 blocks, width 128, 4 heads, vocabulary 512 (its parameters and
# AdamW state are 21 MiB: the activations of a long sequence dominate) at
# SEQ tokens (default 4096), batch 1, STEPS steps (default 3), one thread a
# rank, trained on the repository's docs tokenized with a 512-token BPE (in
# a temporary directory): one rank with 1 thread and with 2, then --cp 2 and
# --cp 4 (CPS="2 4"; IMPL ring or ulysses, default ring, balanced), the
# whole set ROUNDS times (default 2), interleaved. Prints each rank's peak
# RSS (GNU time's maximum resident set) and rank 0's median step time (the
# --metrics end record's step_ms). The machine may be shared: compare
# within one run.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,17p "$0"; exit 2; }
bin=$1
SEQ=${SEQ:-4096}
STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-2}
IMPL=${IMPL:-ring}
CPS=${CPS:-2 4}
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$(dirname "$0")/.."
cat docs/*.md README.md > "$dir/text.txt"
"$bin" tokenize --train-vocab 512 "$dir/text.txt" -o "$dir/v.bpe" > /dev/null
"$bin" tokenize --vocab "$dir/v.bpe" "$dir/text.txt" -o "$dir/tok.bin" > /dev/null
args=(train --model gpt-micro --n-layer 4 --n-embd 128 --n-head 4 --vocab-size 512 --block-size "$SEQ" --seq "$SEQ"
      --data "tokens:$dir/tok.bin" --no-eval --batch 1 --optimizer adamw --max-steps "$STEPS" --progress none)
step() { sed -n 's/.*"step_ms":\([0-9.]*\).*/\1/p' "$1" | tail -1; }
for round in $(seq 1 "$ROUNDS"); do
    for threads in 1 2; do
        echo "== round $round, one rank, $threads thread(s), seq $SEQ ($(uptime | sed 's/.*load/load/'))"
        /usr/bin/time -f "peak RSS %M KiB" "$bin" "${args[@]}" --threads "$threads" --metrics "$dir/m.jsonl" 2>&1 |
            grep -E "peak RSS" || true
        echo "step_ms $(step "$dir/m.jsonl")"
    done
    for cp in $CPS; do
        echo "== round $round, --cp $cp --cp-impl $IMPL, 1 thread a rank ($(uptime | sed 's/.*load/load/'))"
        DT_INIT_TIMEOUT=120 "$bin" run -n "$cp" -- /usr/bin/time -f "peak RSS %M KiB" "$bin" "${args[@]}" \
            --threads 1 --cp "$cp" --cp-impl "$IMPL" --metrics "$dir/m.jsonl" 2>&1 | grep -E "peak RSS" || true
        echo "step_ms $(step "$dir/m.jsonl")"
    done
done
