#!/usr/bin/env bash
# The planner's accuracy (dtrain plan, dtrain train --plan auto): a
# benchmark, not a test; about 15-20 minutes on an idle 2-core machine. By hand:
#
#   bench/plan_accuracy.sh DTRAIN [OUTDIR]          # run, then compare
#   PHASE=2 bench/plan_accuracy.sh DTRAIN OUTDIR    # compare again (a new planner, same runs)
#
# Trains GPT-2 124M (seq 32, global batch 4, AdamW, STEPS steps, default 4)
# in 16 layouts on 2, 4 and 8 ranks (cp 2 ring and Ulysses, tp 2 with sequence
# parallelism among them), with --plan auto on 2
# and 4 ranks; gpt2-large (774M, STEPS_BIG steps, default 3) in 5 layouts (ZeRO-3
# on 2 and 4 ranks, 2 and 4 pipeline stages, 2-way tp) and --plan auto on 2
# ranks; llama-100m (seq 32, its own 32000-token data) with DDP, tp 2, cp 2 and
# --plan auto on 2 ranks, and one sequence of 1024 tokens a step split over 2
# ranks by tp (with and without sequence parallelism) or by cp (ring and
# Ulysses; 3 steps). BIG=0 leaves gpt2-large out (it needs about 14 GiB
# of memory). ZeRO-2/3 runs wrap each block as a unit (--wrap-min-params, as
# --plan auto does). Each run's --metrics end record gives the measured peak
# RSS (the largest rank's), the median step's wall time and step_cpu_ms: the
# CPU time of a step, every rank's process summed (the steps after the
# first). Phase 2 asks `DTRAIN plan --json` for each run's layout (world,
# global batch) and prints one Markdown row per run: measured and predicted
# memory, the measured wall step (median) and step_cpu_ms / cores, and the
# prediction's error against each. On an idle machine the wall step is what
# the planner predicts; on a shared one only step_cpu_ms / cores means
# anything (what the step takes when the job has the machine's cores to
# itself; but a rank waiting in a collective spins up to DT_SHM_SPIN_US
# before it sleeps, which adds CPU time that a loaded machine inflates).
# Then, per model and world with a --plan auto run, the planner's choice
# against the fastest layout measured, by wall and by CPU. Random tokens and
# the calibration cache (DT_CACHE_DIR) live in OUTDIR (default a temporary
# directory). Say whether the machine was shared when quoting figures.
# ONLY=REGEX runs (and compares) only the runs whose name matches (grep -E),
# e.g. ONLY='z3' for the ZeRO-3 rows; the calibrations of models no chosen
# run uses are skipped.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,35p "$0"; exit 2; }
DT=$(readlink -f "$1")
OUT=${2:-$(mktemp -d)}
STEPS=${STEPS:-4}
STEPS_BIG=${STEPS_BIG:-3}
BIG=${BIG:-1}
PY=${PYTHON:-python3}
PHASE=${PHASE:-1}
ONLY=${ONLY:-}
want() { [ -z "$ONLY" ] || grep -Eq -- "$ONLY" <<<"$1"; }
mkdir -p "$OUT/cache"
export DT_CACHE_DIR="$OUT/cache" DT_INIT_TIMEOUT=1800 DT_COMM_TIMEOUT=1800
if [ "$PHASE" = 1 ]; then
"$PY" - "$OUT" <<'PYEOF'
import random, struct, sys
for name, vocab in (("tok.bin", 50257), ("tok32k.bin", 32000)):
    random.seed(0)
    n = 200000
    h = [0] * 256
    h[0], h[1], h[2] = 20240520, 1, n
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", *h))
        f.write(struct.pack("<%dH" % n, *[random.randrange(vocab) for _ in range(n)]))
PYEOF
! want g2- || "$DT" plan --model gpt2 --seq 32 --world 2 --global-batch 4 >/dev/null
[ "$BIG" = 0 ] || ! want lg- || "$DT" plan --model gpt2-large --seq 32 --world 2 --global-batch 2 >/dev/null
! want l100- || "$DT" plan --model llama-100m --seq 32 --world 2 --global-batch 4 >/dev/null
! want l100L- || "$DT" plan --model llama-100m --seq 1024 --world 2 --global-batch 1 >/dev/null
: >>"$OUT/runs.txt"
run() { # NAME MODEL N BATCH STEPS FLAGS... (a run already in OUTDIR/runs.txt is kept: rerun to resume);
       # RUN_SEQ=T for another sequence length than 32
    local name=$1 model=$2 n=$3 batch=$4 steps=$5 seq=${RUN_SEQ:-32}
    shift 5
    want "$name" || return 0
    grep -q "^$name " "$OUT/runs.txt" && return 0
    local m="$OUT/$name.jsonl" tok=tok.bin
    [ "${model#llama}" = "$model" ] || tok=tok32k.bin
    rm -f "$m"
    if /usr/bin/time -f "%e %U %S" -o "$OUT/$name.time" "$DT" run -n "$n" -- "$DT" train --model "$model" --seq "$seq" \
        --data "tokens:$OUT/$tok" --batch "$batch" --optimizer adamw --lr 1e-4 --max-steps "$steps" --no-eval \
        --rng philox --mfu-peak 1 --metrics "$m" "$@" >"$OUT/$name.log" 2>&1; then
        echo "$name $model $n $batch --seq $seq $*" >>"$OUT/runs.txt"
        echo "$name: done"
    else
        echo "$name: failed (see $OUT/$name.log)"
    fi
}
run g2-dp2-z0 gpt2 2 2 "$STEPS"
run g2-tp2 gpt2 2 4 "$STEPS" --tp 2
run g2-auto2 gpt2 2 2 "$STEPS" --plan auto
run g2-dp2-z1 gpt2 2 2 "$STEPS" --zero 1
run g2-pp2 gpt2 2 4 "$STEPS" --pp 2 --micro-batches 2
run g2-dp2-z3 gpt2 2 2 "$STEPS" --zero 3 --wrap-min-params 7000000
run g2-dp2-ckpt gpt2 2 2 "$STEPS" --activation-checkpointing
run g2-dp2-z2 gpt2 2 2 "$STEPS" --zero 2 --wrap-min-params 7000000
run g2-dp4-z1 gpt2 4 1 "$STEPS" --zero 1
run g2-auto4 gpt2 4 1 "$STEPS" --plan auto
run g2-tp4 gpt2 4 4 "$STEPS" --tp 4
run g2-dp2-pp2 gpt2 4 2 "$STEPS" --pp 2 --micro-batches 2
run g2-dp8-z3 gpt2 8 1 "$STEPS" --zero 3 --wrap-min-params 7000000
run l100-dp2 llama-100m 2 2 "$STEPS"
run l100-auto2 llama-100m 2 2 "$STEPS" --plan auto
run l100-tp2 llama-100m 2 4 "$STEPS" --tp 2
run l100-cp2 llama-100m 2 4 "$STEPS" --cp 2
run g2-cp2 gpt2 2 4 "$STEPS" --cp 2
run g2-cp2u gpt2 2 4 "$STEPS" --cp 2 --cp-impl ulysses
run g2-tp2sp gpt2 2 4 "$STEPS" --tp 2 --sequence-parallel
# one sequence of 1024 tokens a step (global batch 1): split over 2 ranks by heads (tp, with and without sequence
# parallelism) or by positions (cp: ring and Ulysses)
RUN_SEQ=1024 run l100L-tp2 llama-100m 2 1 3 --tp 2
RUN_SEQ=1024 run l100L-tp2sp llama-100m 2 1 3 --tp 2 --sequence-parallel
RUN_SEQ=1024 run l100L-cp2 llama-100m 2 1 3 --cp 2
RUN_SEQ=1024 run l100L-cp2u llama-100m 2 1 3 --cp 2 --cp-impl ulysses
if [ "$BIG" != 0 ]; then
run lg-z3-2 gpt2-large 2 1 "$STEPS_BIG" --zero 3 --wrap-min-params 19000000
run lg-z3-4 gpt2-large 4 1 "$STEPS_BIG" --zero 3 --wrap-min-params 19000000
run lg-pp2 gpt2-large 2 2 "$STEPS_BIG" --pp 2 --micro-batches 2
run lg-pp4 gpt2-large 4 4 "$STEPS_BIG" --pp 4 --micro-batches 4
run lg-tp2 gpt2-large 2 2 "$STEPS_BIG" --tp 2
run lg-auto2 gpt2-large 2 1 "$STEPS_BIG" --plan auto
fi
fi
"$PY" - "$OUT" "$DT" "$(nproc)" "$ONLY" <<'PYEOF'
import json, re, subprocess, sys
out, dt, cores, only = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
print("| run | model | ranks | layout | peak RSS MiB | predicted | error | step ms (wall, median) | cores got |"
      " step ms at the machine's cores (cpu / cores) | predicted step ms | error vs wall | error vs cpu / cores |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
best = {}
plans = {}
for line in open(out + "/runs.txt"):
    name, model, n, batch, *flags = line.split()
    if only and not re.search(only, name):
        continue
    n, batch = int(n), int(batch)
    log = open("%s/%s.log" % (out, name)).read()
    f = " ".join(flags)
    g = lambda k, d: int(re.search(k + r" (\d+)", f).group(1)) if re.search(k + r" (\d+)", f) else d
    seq = g("--seq", 32)  # runs.txt of an older script: 32
    if "--plan auto" in f:  # the layout it chose
        m = re.search(r"--plan auto chose dp(\d+)(?: cp(\d+)( ulysses)?)? tp(\d+)( sp)? pp(\d+) zero(\d) "
                      r"(?:b(\d+)|mb(\d+)x(\d+)) ga(\d+)( ckpt)?", log)
        dp, tp, pp, z = map(int, m.group(1, 4, 6, 7))
        cp = int(m.group(2) or 1)
        uly, sp = bool(m.group(3)), bool(m.group(5))
        mbs = int(m.group(10) or 1)
        b = int(m.group(8)) if m.group(8) else int(m.group(9)) * mbs
        ga, ck = int(m.group(11)), bool(m.group(12))
    else:
        tp, pp, z, ga, cp = g("--tp", 1), g("--pp", 1), g("--zero", 0), g("--grad-accum", 1), g("--cp", 1)
        dp = n // tp // pp // cp
        mbs = g("--micro-batches", 4) if pp > 1 else 1
        b, ck = batch, "--activation-checkpointing" in f
        uly, sp = "--cp-impl ulysses" in f, "--sequence-parallel" in f
    impl = "none" if cp == 1 else "ulysses" if uly else "ring"
    gb = dp * b * ga
    end = [json.loads(l) for l in open("%s/%s.jsonl" % (out, name)) if '"end"' in l][-1]
    key = (model, n, gb, seq)
    if key not in plans:
        r = subprocess.run([dt, "plan", "--model", model, "--seq", str(seq), "--world", str(n), "--global-batch",
                            str(gb), "--mem-per-rank", "1T", "--json"], capture_output=True, text=True, check=True)
        plans[key] = [json.loads(l) for l in r.stdout.splitlines()]
    row = [r for r in plans[key] if (r["dp"], r.get("cp", 1), r.get("cp_impl", "none" if cp == 1 else "ring"),
           r["tp"], r.get("sequence_parallel", False), r["pp"], r["zero_stage"], r["batch"], r["micro_batches"],
           r["grad_accum"], r["act_ckpt"], r["offload"], r["hybrid"]) ==
           (dp, cp, impl, tp, sp, pp, z, b, mbs, ga, ck, False, False)]
    if not row:
        print("| %s | no planner row for dp%d cp%d tp%d pp%d zero%d b%d m%d ga%d |" % (name, dp, cp, tp, pp, z, b, mbs,
                                                                                    ga))
        continue
    r = row[0]
    pr, mr, pt, mt = r["mem_per_rank_bytes"], end["peak_rss_bytes"], r["step_ms"], end["step_ms"]
    cpu = end.get("step_cpu_ms", 0)
    norm = cpu / cores  # the step with the machine's cores to itself
    got = cpu / mt
    lay = "dp%d%s tp%d%s pp%d zero%d %s ga%d%s" % (dp, (" cp%d" % cp + (" ulysses" if uly else "")) if cp > 1 else "",
                                                  tp, " sp" if sp else "", pp, z,
                                                ("mb%dx%d" % (b // mbs, mbs)) if pp > 1 else "b%d" % b, ga,
                                                " ckpt" if ck else "")
    if seq != 32:
        lay += " (seq %d)" % seq
    print("| %s | %s | %d | %s | %.0f | %.0f | %+.1f%% | %.0f | %.2f | %.0f | %.0f | %+.1f%% | %+.1f%% |" % (
        name, model, n, lay, mr / 2**20, pr / 2**20, 100 * (pr / mr - 1), mt, got, norm, pt,
        100 * (pt / mt - 1), 100 * (pt / norm - 1) if norm > 0 else 0))
    best.setdefault((model, n, gb, seq), []).append((norm, mt, name, "--plan auto" in f))
print()
for (model, n, gb, seq), v in sorted(best.items()):
    auto = [x for x in v if x[3]]
    if not auto:
        continue
    for k, what in ((1, "wall step"), (0, "step_cpu_ms / cores")):
        fastest = min(v, key=lambda x: x[k])
        print("%s on %d ranks, global batch %d, by %s: --plan auto %s ran %.0f ms; the fastest measured, %s, "
              "%.0f ms; the choice is %+.1f%% off the fastest (%d layouts measured)" % (
                  model, n, gb, what, auto[0][2], auto[0][k], fastest[2], fastest[k],
                  100 * (auto[0][k] / fastest[k] - 1), len(v)))
PYEOF
