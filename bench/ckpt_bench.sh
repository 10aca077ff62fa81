#!/usr/bin/env bash
# Checkpoint benchmarks of issue 14 (a benchmark, not a test; run it by hand
# on a quiet machine).
#
#   bench/ckpt_bench.sh [BUILD_DIR]            (default: build)
#
# 1. Throughput: a synchronous dt_trainer_save of an MLP (2*DIM*HIDDEN
#    parameters, AdamW: weights + two moments, 12 bytes a parameter) and a
#    dt_trainer_load of it, against dd writing the same number of bytes with
#    conv=fsync and reading them back, on the same filesystem (CKPT_DIR).
#    Fairness: both writes end with fsync (dtrain's files and directory are
#    fsynced before the rename); before each read the files' pages are
#    dropped from the page cache (posix_fadvise DONTNEED: dtrain's files by
#    ckpt_bench, dd's by `dd iflag=nocache count=0`), so both reads come
#    from the disk (through whatever cache the host keeps below the VM).
#    dtrain's load checks every file's CRC-32 first, so it reads each file
#    twice (the second time from the page cache the first read filled);
#    the GB/s are bytes of checkpoint over wall time. REPS runs each,
#    alternating dtrain and dd; the median is printed.
# 2. The asynchronous-save stall: the step loop without saves, with a
#    synchronous save every EVERY steps, with an asynchronous one.
# 3. Rank 0's peak extra memory: the trainer's synchronous and asynchronous
#    saves (one process: DDP's rank 0 holds the whole state), and the full
#    state dict (dt_ckpt_save_full) of GPT-2 124M and of the MLP sharded
#    over 2 ranks like ZeRO-3, against the largest tensor and the model.
#
# Environment: CKPT_DIR (default $TMPDIR or /tmp; needs 3x the checkpoint's
# size free), DIM/HIDDEN (default 2048/8192: 33.5M parameters, a 403 MB
# checkpoint), REPS (default 3), STEPS/EVERY (default 30/10).
set -euo pipefail
B=${1:-build}
DT=$B/dtrain
CB=$B/bench/ckpt_bench
for f in "$DT" "$CB"; do
  [ -x "$f" ] || { echo "ckpt_bench: $f not built (cmake --build $B)" >&2; exit 2; }
done
DIM=${DIM:-2048} HIDDEN=${HIDDEN:-8192} REPS=${REPS:-3} STEPS=${STEPS:-30} EVERY=${EVERY:-10}
W=$(mktemp -d "${CKPT_DIR:-${TMPDIR:-/tmp}}/ckpt_bench.XXXXXX")
trap 'rm -rf "$W"' EXIT
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo);" \
     "$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2-only (no AVX-512)');" \
     "dir $W on $(df --output=source,fstype "$W" | tail -1 | tr -s ' ')"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
now() { date +%s.%N; }

echo; echo "== 1. throughput: mlp $DIM x $HIDDEN, AdamW, $REPS runs each (median)"
: > "$W/ts"; : > "$W/tl"; : > "$W/ds"; : > "$W/dl"
for r in $(seq "$REPS"); do
  out=$("$CB" io "$W/io" "$DIM" "$HIDDEN")
  echo "   dtrain: $out"
  bytes=$(awk '{for (i=1;i<NF;i++) if ($i=="bytes") print $(i+1)}' <<<"$out")
  awk '{for (i=1;i<NF;i++) if ($i=="save_s") print $(i+1)}' <<<"$out" >> "$W/ts"
  awk '{for (i=1;i<NF;i++) if ($i=="load_s") print $(i+1)}' <<<"$out" >> "$W/tl"
  rm -rf "$W/io"
  t0=$(now)
  dd if=/dev/zero of="$W/dd.bin" bs=4M count="$bytes" iflag=count_bytes conv=fsync status=none
  t1=$(now)
  dd if="$W/dd.bin" iflag=nocache count=0 status=none
  t2=$(now)
  dd if="$W/dd.bin" of=/dev/null bs=4M status=none
  t3=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f\n", b - a}' >> "$W/ds"
  awk -v a="$t2" -v b="$t3" 'BEGIN {printf "%.4f\n", b - a}' >> "$W/dl"
  echo "   dd:     write $(tail -1 "$W/ds") s, read $(tail -1 "$W/dl") s"
  rm -f "$W/dd.bin"
done
ts=$(median < "$W/ts"); tl=$(median < "$W/tl"); ds=$(median < "$W/ds"); dl=$(median < "$W/dl")
awk -v b="$bytes" -v ts="$ts" -v tl="$tl" -v ds="$ds" -v dl="$dl" 'BEGIN {
  printf "   %d bytes: save %.3f GB/s vs dd write+fsync %.3f GB/s (%.0f%%); load %.3f GB/s vs dd read %.3f GB/s (%.0f%%)\n",
         b, b/ts/1e9, b/ds/1e9, 100*ds/ts, b/tl/1e9, b/dl/1e9, 100*dl/tl }'

echo; echo "== 2. asynchronous-save stall: mlp $DIM x $HIDDEN, $STEPS steps, a save every $EVERY"
"$CB" stall "$W/stall" "$DIM" "$HIDDEN" "$STEPS" "$EVERY" | sed 's/^/   /'
rm -rf "$W/stall"

echo; echo "== 3. peak extra memory of a save"
"$CB" rss "$W/rss" "$DIM" "$HIDDEN" | sed 's/^/   /'
rm -rf "$W/rss"
"$DT" run -n 2 -- "$CB" full "$W" mlp "$DIM" "$HIDDEN" | sed 's/^/   /'
"$DT" run -n 2 -- "$CB" full "$W" gpt2 0 0 | sed 's/^/   /'
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
