#!/bin/sh
# bench/trace_overhead.sh — what `dtrain train --trace` costs: GPT-2 small
# (124M) on 2 ranks, the same short run with the trace off and on (every
# timed step inside --trace-steps), interleaved, ROUNDS rounds.
#
#   bench/trace_overhead.sh [ROUNDS]          (DT_CLI: the dtrain program, default build/dtrain)
#
# A run is 10 optimizer steps (--seq 32, --batch 1 per rank, random tokens,
# 1 compute thread per rank); a step's time is the difference between two
# consecutive step records of --metrics (--log-every 1), and a run's figure
# is the median of steps 4 to 10 (the trace records steps 3 to 10); beside
# it the CPU seconds the whole job used (user + system, both ranks, start-up
# included: less sensitive to other processes than the wall clock) and, for
# the traced runs, the spans recorded per step and rank. Prints each run's
# figures and, at the end, the medians over the rounds and their ratios. On
# a shared machine run it when it is quiet, or take more rounds: a ratio is
# only as good as the spread around it.
set -eu
cli=${DT_CLI:-build/dtrain}
rounds=${1:-3}
case $rounds in '' | *[!0-9]* | 0*)
    echo "trace_overhead.sh: ROUNDS wants a positive count, got '$rounds' (usage: bench/trace_overhead.sh [ROUNDS])" >&2
    exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 200000 random tokens below 50257 in an llm.c token file: a header of 256
# int32 (magic 20240520, version 1, count), then the uint16 tokens
tokens() {
    perl -e 'srand(1); my $n = 200000; print pack("l<256", 20240520, 1, $n, (0) x 253);
             print pack("S<*", map { int(rand(50257)) } 1 .. $n);' > "$1"
}
tokens "$tmp/tok.bin"
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
run() { # $1 = off|on, $2 = round: prints the run's median step ms
    m="$tmp/m-$1-$2.jsonl"
    extra=""
    [ "$1" = on ] && extra="--trace $tmp/trace-$2 --trace-steps 3:11"
    # shellcheck disable=SC2086
    /usr/bin/time -f "%U %S" -o "$tmp/cpu-$1-$2" "$cli" run -n 2 -- "$cli" train --model gpt2 --data "tokens:$tmp/tok.bin" --seq 32 --batch 1 --max-steps 10 \
        --threads 1 --progress none --no-eval --log-every 1 --metrics "$m" $extra > "$tmp/out-$1-$2.txt" 2>&1 || {
        cat "$tmp/out-$1-$2.txt" >&2
        echo "trace_overhead.sh: the run with the trace $1 failed (round $2)" >&2
        exit 1
    }
    grep '"event":"step"' "$m" | sed 's/.*"step":\([0-9]*\).*"time":\([0-9.]*\).*/\1 \2/' |
        awk 'NR > 1 && $1 >= 4 { printf "%.3f\n", ($2 - t) * 1000 } { t = $2 }' | median
}
cpu() { awk '{ printf "%.2f", $1 + $2 }' "$tmp/cpu-$1-$2"; }
spans() { # X events per step and rank in round $1's trace
    tr ',' '\n' < "$tmp/trace-$1/trace.json" | grep -c '"ph":"X"' | awk '{ printf "%.0f", $1 / 8 / 2 }'
}
: > "$tmp/off"
: > "$tmp/on"
: > "$tmp/coff"
: > "$tmp/con"
r=1
while [ "$r" -le "$rounds" ]; do
    off=$(run off "$r")
    on=$(run on "$r")
    echo "round $r: trace off $off ms/step ($(cpu off "$r") CPU s), on $on ms/step ($(cpu on "$r") CPU s, $(spans "$r") spans per step and rank)"
    echo "$off" >> "$tmp/off"
    echo "$on" >> "$tmp/on"
    cpu off "$r" >> "$tmp/coff" && echo >> "$tmp/coff"
    cpu on "$r" >> "$tmp/con" && echo >> "$tmp/con"
    r=$((r + 1))
done
moff=$(median < "$tmp/off")
mon=$(median < "$tmp/on")
coff=$(median < "$tmp/coff")
con=$(median < "$tmp/con")
echo "median over $rounds rounds: off $moff ms/step, on $mon ms/step, on/off $(awk -v a="$mon" -v b="$moff" 'BEGIN { printf "%.4f", a / b }');" \
    "CPU off $coff s, on $con s, on/off $(awk -v a="$con" -v b="$coff" 'BEGIN { printf "%.4f", a / b }')"
