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
#    Fairness: both write the same bytes (dd copies dtrain's data file from
#    the page cache, not /dev/zero: a virtual disk may store zero blocks
#    more cheaply than data, and 400 MB of zeros wrote faster than random
#    bytes in 3 of 4 interleaved pairs here; dd's read of its cached source
#    costs it one memory copy);
#    both writes end with fsync (dtrain's files and directory are
#    fsynced before the rename); before each read the files' pages are
#    dropped from the page cache (posix_fadvise DONTNEED: dtrain's files by
#    ckpt_bench, dd's by `dd iflag=nocache count=0`), so both reads come
#    from the disk (through whatever cache the host keeps below the VM).
#    dtrain's load reads each file once, checking its CRC-32C as the bytes
#    arrive; the GB/s are bytes of checkpoint over wall time. REPS runs
#    each, alternating dtrain and dd; the medians and minima are printed,
#    and the CPU time per GB (process CPU, all threads, of dtrain's save and
#    load; user + system of dd), which a loaded machine disturbs less.
# 2. The asynchronous-save stall: the step loop without saves, with a
#    synchronous save every EVERY steps, with an asynchronous one.
# 3. Rank 0's peak extra memory: the trainer's synchronous and asynchronous
#    saves (one process: DDP's rank 0 holds the whole state), and the full
#    state dict (dt_ckpt_save_full) of GPT-2 124M and of the MLP sharded
#    over 2 ranks like ZeRO-3, against the largest tensor and the model.
#
# Environment: CKPT_DIR (default $TMPDIR or /tmp; needs 3x the checkpoint's
# size free), DIM/HIDDEN (default 2048/8192: 33.5M parameters, a 403 MB
# checkpoint), REPS (default 5), STEPS/EVERY (default 30/10), PARTS (the
# parts to run, default 123).
set -euo pipefail
B=${1:-build}
DT=$B/dtrain
CB=$B/bench/ckpt_bench
for f in "$DT" "$CB"; do
  [ -x "$f" ] || { echo "ckpt_bench: $f not built (cmake --build $B)" >&2; exit 2; }
done
DIM=${DIM:-2048} HIDDEN=${HIDDEN:-8192} REPS=${REPS:-5} STEPS=${STEPS:-30} EVERY=${EVERY:-10} PARTS=${PARTS:-123}
W=$(mktemp -d "${CKPT_DIR:-${TMPDIR:-/tmp}}/ckpt_bench.XXXXXX")
trap 'rm -rf "$W"' EXIT
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo);" \
     "$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2-only (no AVX-512)');" \
     "dir $W on $(df --output=source,fstype "$W" | tail -1 | tr -s ' ')"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
now() { date +%s.%N; }

if [[ $PARTS == *1* ]]; then
echo; echo "== 1. throughput: mlp $DIM x $HIDDEN, AdamW, $REPS runs each, interleaved dd / dtrain (median, min)"
: > "$W/ts"; : > "$W/tl"; : > "$W/ds"; : > "$W/dl"; : > "$W/cs"; : > "$W/cl"; : > "$W/dcs"; : > "$W/dcl"
# field NAME of a "name value name value" line (empty when absent)
field() { awk -v k="$1" '{for (i=1;i<NF;i++) if ($i==k) print $(i+1)}'; }
# "wall user+sys" of a command, seconds (wall from the clock, CPU from GNU time: 10 ms steps)
timed() {
  local t0 t1
  t0=$(now); /usr/bin/time -f "%U %S" -o "$W/time" "$@"; t1=$(now)
  awk -v a="$t0" -v b="$t1" '{printf "%.4f %.4f\n", b - a, $1 + $2}' "$W/time"
}
for r in $(seq "$REPS"); do
  out=$("$CB" io "$W/io" "$DIM" "$HIDDEN")
  echo "   dtrain: $out   (load $(cut -d' ' -f1-3 /proc/loadavg))"
  bytes=$(field bytes <<<"$out")
  field save_s <<<"$out" >> "$W/ts"
  field load_s <<<"$out" >> "$W/tl"
  field save_cpu_s <<<"$out" >> "$W/cs"
  field load_cpu_s <<<"$out" >> "$W/cl"
  # dd writes the same bytes (dtrain's data file, in the page cache after the
  # load: not /dev/zero, whose blocks the host's disk may store for nothing)
  src=$(ls "$W"/io/step-*/rank-00000.safetensors)
  cat "$src" > /dev/null
  w=$(timed dd if="$src" of="$W/dd.bin" bs=4M conv=fsync status=none)
  rm -rf "$W/io"
  dd if="$W/dd.bin" iflag=nocache count=0 status=none
  rd=$(timed dd if="$W/dd.bin" of=/dev/null bs=4M status=none)
  echo "${w% *}" >> "$W/ds"; echo "${w#* }" >> "$W/dcs"
  echo "${rd% *}" >> "$W/dl"; echo "${rd#* }" >> "$W/dcl"
  echo "   dd:     write $w (wall s, cpu s), read $rd"
  rm -f "$W/dd.bin"
done
minimum() { sort -g | head -1; }
ts=$(median < "$W/ts"); tl=$(median < "$W/tl"); ds=$(median < "$W/ds"); dl=$(median < "$W/dl")
mts=$(minimum < "$W/ts"); mtl=$(minimum < "$W/tl"); mds=$(minimum < "$W/ds"); mdl=$(minimum < "$W/dl")
cs=$(median < "$W/cs"); cl=$(median < "$W/cl"); dcs=$(median < "$W/dcs"); dcl=$(median < "$W/dcl")
awk -v b="$bytes" -v ts="$ts" -v tl="$tl" -v ds="$ds" -v dl="$dl" -v mts="$mts" -v mtl="$mtl" -v mds="$mds" \
    -v mdl="$mdl" -v cs="$cs" -v cl="$cl" -v dcs="$dcs" -v dcl="$dcl" 'BEGIN {
  g = b / 1e9
  printf "   %d bytes, medians: save %.3f GB/s vs dd write+fsync %.3f GB/s (%.0f%%); load %.3f GB/s vs dd read %.3f GB/s (%.0f%%)\n",
         b, g/ts, g/ds, 100*ds/ts, g/tl, g/dl, 100*dl/tl
  printf "   minima:  save %.3f GB/s vs dd %.3f GB/s (%.0f%%); load %.3f GB/s vs dd %.3f GB/s (%.0f%%)\n",
         g/mts, g/mds, 100*mds/mts, g/mtl, g/mdl, 100*mdl/mtl
  if (cs != "")
    printf "   CPU s per GB (median): save %.3f vs dd write %.3f; load %.3f vs dd read %.3f\n", cs/g, dcs/g, cl/g, dcl/g }'
fi

if [[ $PARTS == *2* ]]; then
echo; echo "== 2. asynchronous-save stall: mlp $DIM x $HIDDEN, $STEPS steps, a save every $EVERY"
"$CB" stall "$W/stall" "$DIM" "$HIDDEN" "$STEPS" "$EVERY" | sed 's/^/   /'
rm -rf "$W/stall"
fi

if [[ $PARTS == *3* ]]; then
echo; echo "== 3. peak extra memory of a save"
"$CB" rss "$W/rss" "$DIM" "$HIDDEN" | sed 's/^/   /'
rm -rf "$W/rss"
"$DT" run -n 2 -- "$CB" full "$W" mlp "$DIM" "$HIDDEN" | sed 's/^/   /'
"$DT" run -n 2 -- "$CB" full "$W" gpt2 0 0 | sed 's/^/   /'
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
