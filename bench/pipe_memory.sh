#!/usr/bin/env bash
# Peak resident memory per pipeline rank (a benchmark, not a test; a few
# minutes on the 2-core development machine; run it by hand):
#
#   bench/pipe_memory.sh DTRAIN [DTRAIN2 ...]
#
# GPT-2 124M (vocabulary 50257; MODEL=gpt2-medium ...) on the Bible tokens
# (scripts/gpt_data.sh: build/gpt-data), AdamW (OPTIMIZER=sgd: no state),
# batch 4 x 64 tokens, STEPS steps (default 2), one thread per rank, at
# pp 1 and pp 2 (PPS="2 4": those; 1F1B, 4 micro-batches; BALANCE
# compute or params, default compute), each binary given in turn and the
# whole set ROUNDS times (default 2): A1 A2 B1 B2 A1 A2 ... Prints each
# rank's peak RSS (/usr/bin/time's maximum resident set) and, where the
# binary reports it (--pp), the trainer's memory lines (parameters,
# gradients, optimizer states held by each rank). EVAL=FILE also evaluates
# on token file FILE at the end (default --no-eval). Compare binaries
# (e.g. before and after a change) within one run: the machine is shared.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
DATA=${DATA:-build/gpt-data/train.bin}
STEPS=${STEPS:-2}
ROUNDS=${ROUNDS:-2}
BALANCE=${BALANCE:-compute}
MODEL=${MODEL:-gpt2}
OPTIMIZER=${OPTIMIZER:-adamw}
PPS=${PPS:-1 2}
[ -f "$DATA" ] || { echo "no $DATA: run scripts/gpt_data.sh first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 1; }
evalargs=(--no-eval)
[ -n "${EVAL:-}" ] && evalargs=(--val-data "tokens:$EVAL")
args=(train --model "$MODEL" --data "tokens:$DATA" "${evalargs[@]}" --optimizer "$OPTIMIZER" --batch 4 --seq 64
      --max-steps "$STEPS" --threads 1 --rng philox)
for round in $(seq 1 "$ROUNDS"); do
    for bin in "$@"; do
        for pp in $PPS; do
            extra=()
            [ "$pp" -gt 1 ] && extra=(--pp "$pp" --micro-batches 4 --pp-balance "$BALANCE")
            echo "== round $round, $bin, pp $pp ($(uptime | sed 's/.*load/load/'))"
            # the lines that matter, or the whole output and exit 1 when the run failed
            rc=0
            out=$("$bin" run -n "$pp" -- /usr/bin/time -f "peak RSS %M KiB (wall %e s)" \
                "$bin" "${args[@]}" "${extra[@]}" 2>&1) || rc=$?
            if [ $rc != 0 ]; then
                printf '%s\n' "$out" >&2
                echo "pipe_memory.sh: $bin at pp $pp failed (exit $rc)" >&2
                exit 1
            fi
            grep -E "peak RSS|^(\[0\] )?memory rank|val loss|train loss" <<<"$out" || true
        done
    done
done
