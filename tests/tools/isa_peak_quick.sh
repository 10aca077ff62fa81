#!/bin/sh
# bench/isa_peak, briefly: it exits 0 and prints a line for every path, a
# rate on 1 and 2 threads or "not on this CPU"; on a CPU whose flags name
# AMX (amx_tile, amx_bf16) the AMX paths must run (their tiles configured,
# used and released on each thread), not be reported missing, unless the
# build says it cannot measure them (a compiler other than GCC); --json gives
# one object a line; a bad option exits 2. Rates are not checked.
# usage: isa_peak_quick.sh ISA_PEAK
set -u
prog=$1
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$prog" ] || { echo "no $prog: skipped"; exit 77; }
out=$("$prog" --threads 2 --reps 1 --ms 5) || fail "isa_peak exited $?"
echo "$out"
amx=0
grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null && grep -qw amx_tile /proc/cpuinfo && amx=1
for p in fma_ymm fma_zmm dpbf16_ymm dpbf16_zmm amx_tdpbf16ps amx_2x2_l1 amx_2x2_l2; do
    case $p in amx_*) echo "$out" | grep -Eq "^$p +not measured by this build" && continue ;; esac
    if echo "$out" | grep -Eq "^$p +not on this CPU"; then
        case $p in amx_*) [ $amx = 0 ] || fail "$p reported missing on a CPU with AMX" ;; esac
        continue
    fi
    for t in 1 2; do
        echo "$out" | grep -Eq "^$p +threads +$t: +[0-9.]+ GFLOP/s" || fail "no rate for $p on $t thread(s)"
    done
done
json=$("$prog" --threads 1 --reps 1 --ms 5 --json) || fail "isa_peak --json exited $?"
n=$(echo "$json" | grep -c '^{"bench":"isa_peak","path":"[a-z0-9_]*","available":\(true\|false\)')
[ "$n" -ge 7 ] || fail "--json: $n path objects, want at least 7"
"$prog" --bogus >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || fail "a bad option exited $rc, want 2"
echo "isa_peak_quick: ok"
