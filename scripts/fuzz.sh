#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ with clang (ASan+UBSan) and runs
# each for a short bounded time over its committed corpus, fuzz/corpus/NAME/
# for fuzz/fuzz_NAME.c. New inputs go to build-fuzz/corpus-fuzz_NAME/ (not
# committed); a crasher is saved as build-fuzz/crash-* and fails the run.
#
# Each target names what it is built from in its first lines:
#   // fuzz-sources: src/base/*.c src/data/*.c   (globs, from the repo root;
#                                                 several such lines add up)
#   // fuzz-libs: -lz                             (extra link flags)
# so a target compiles only the parser it tests and what that needs, not
# the whole library (oneDNN, MPI). A source several targets name is
# compiled once (build-fuzz/obj/, instrumented with fuzzer-no-link) before
# any target is linked: compiling src/base/*.c again for each target took
# most of the two minutes the targets' builds took in CI.
#
#   FUZZ_SECONDS  seconds per target (default 15)
#   FUZZ_TARGETS  names to run (default: every fuzz/fuzz_*.c), e.g. "idx env"
#   FUZZ_JOBS     targets built and fuzzed at once (default: the cores, nproc;
#                 libFuzzer runs one process per target, so on an otherwise
#                 idle machine each target still gets a core for its
#                 FUZZ_SECONDS: 15 targets x 15 s take about 2 minutes on 2
#                 cores instead of 4). Each target's output is printed once it
#                 is done, in the targets' order; the first failure fails the
#                 run after every started target has finished.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
secs=${FUZZ_SECONDS:-15}
jobs_max=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
case "$secs" in ''|*[!0-9]*) echo "fuzz: FUZZ_SECONDS must be a whole number of seconds, not '$secs'"; exit 2;; esac
case "$jobs_max" in ''|*[!0-9]*|0) echo "fuzz: FUZZ_JOBS must be a positive whole number, not '$jobs_max'"; exit 2;; esac
if [ -n "${FUZZ_TARGETS:-}" ]; then
  targets=()
  for n in $FUZZ_TARGETS; do targets+=("fuzz/fuzz_${n#fuzz_}.c"); done
else
  targets=(fuzz/fuzz_*.c)
fi
[ ${#targets[@]} -eq 0 ] && { echo "fuzz: no targets"; exit 0; }
command -v clang >/dev/null || { echo "fuzz: clang not found (scripts/deps.sh test installs it)"; exit 1; }
mkdir -p build-fuzz

CFLAGS=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-sanitize-recover=all -Iinclude -Isrc -Itools)
# Newer than an object or a binary: it is rebuilt.
HEADERS=(fuzz/*.h include/dtrain/*.h src/*/*.h src/*/*/*.h tools/*.h scripts/fuzz.sh)

# A target's sources (its globs expanded), one a line; 1 when a glob matches nothing.
target_sources() {
  local t=$1 g m
  for g in $(sed -n 's|^// fuzz-sources: *||p' "$t"); do
    m=($g) # the globs are meant to expand
    [ ${#m[@]} -gt 0 ] && [ -e "${m[0]}" ] || { echo "fuzz: $t: '$g' matches no file" >&2; return 1; }
    printf '%s\n' "${m[@]}"
  done
}
obj_of() { local o=${1//\//_}; echo "build-fuzz/obj/${o%.c}.o"; }

# Whether $1 is missing or older than any of the other arguments.
stale() {
  local out=$1 f
  shift
  [ -e "$out" ] || return 0
  for f in "$@"; do [ "$f" -nt "$out" ] && return 0; done
  return 1
}

# One source into its object, when stale (into a temporary name: an
# interrupted build leaves no object that looks fresh).
compile_one() {
  local src=$1 obj
  obj=$(obj_of "$src")
  stale "$obj" "$src" "${HEADERS[@]}" || return 0
  clang "${CFLAGS[@]}" -fsanitize=fuzzer-no-link,address,undefined -c "$src" -o "$obj.tmp" &&
    mv -f "$obj.tmp" "$obj" || { echo "fuzz: $src: build FAILED"; return 1; }
}

# One target: link it when stale, then fuzz it. Prints its lines; returns
# non-zero (after the log's tail) on a build failure or a crasher.
fuzz_one() {
  local t=$1 name libs bin corpus f objs=()
  name=$(basename "$t" .c)
  libs=$(sed -n 's|^// fuzz-libs: *||p' "$t" | head -1)
  while IFS= read -r f; do objs+=("$(obj_of "$f")"); done < <(target_sources "$t")
  bin="build-fuzz/$name"
  if stale "$bin" "$t" "${objs[@]}" "${HEADERS[@]}"; then
    # shellcheck disable=SC2086
    clang "${CFLAGS[@]}" -fsanitize=fuzzer,address,undefined "$t" "${objs[@]}" $libs -lm -lpthread \
      -o "$bin.tmp" || { echo "fuzz: $name: build FAILED"; return 1; }
    mv -f "$bin.tmp" "$bin"
  fi
  corpus="fuzz/corpus/${name#fuzz_}"
  mkdir -p "build-fuzz/corpus-$name"
  echo "fuzz: $name for ${secs}s"
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ \
    "build-fuzz/corpus-$name" "$corpus" 2> "build-fuzz/$name.log" \
    || { tail -40 "build-fuzz/$name.log"; echo "fuzz: $name FAILED (crasher under build-fuzz/)"; return 1; }
  tail -1 "build-fuzz/$name.log"
}

# Checked before anything starts: every target exists and has its corpus.
for t in "${targets[@]}"; do
  [ -f "$t" ] || { echo "fuzz: no such target $t"; exit 1; }
  name=$(basename "$t" .c)
  [ -d "fuzz/corpus/${name#fuzz_}" ] || { echo "fuzz: $name has no committed corpus fuzz/corpus/${name#fuzz_}"; exit 1; }
done

# Every source the targets name, compiled once, jobs_max at a time.
mkdir -p build-fuzz/obj
srcs=$(for t in "${targets[@]}"; do target_sources "$t" || echo "!"; done | sort -u)
case "$srcs" in *'!'*) exit 1;; esac
export -f compile_one obj_of stale
export HEADERS_LIST="${HEADERS[*]}" CFLAGS_LIST="${CFLAGS[*]}"
printf '%s\n' $srcs | xargs -P "$jobs_max" -I{} bash -c \
  'HEADERS=($HEADERS_LIST); CFLAGS=($CFLAGS_LIST); compile_one "$1"' _ {} ||
  { echo "fuzz: FAILED (a source did not compile)"; exit 1; }

pids=()
names=()
status=0
report() { # report I: waits for target I and prints its output
  local i=$1 rc=0
  wait "${pids[i]}" || rc=$?
  cat "build-fuzz/${names[i]}.out"
  [ $rc -eq 0 ] || status=1
}
done_upto=0
for t in "${targets[@]}"; do
  # at most jobs_max at once: wait for the oldest still running
  while [ $(( ${#pids[@]} - done_upto )) -ge "$jobs_max" ]; do
    report "$done_upto"
    done_upto=$((done_upto + 1))
  done
  name=$(basename "$t" .c)
  fuzz_one "$t" > "build-fuzz/$name.out" 2>&1 &
  pids+=($!)
  names+=("$name")
done
while [ "$done_upto" -lt ${#pids[@]} ]; do
  report "$done_upto"
  done_upto=$((done_upto + 1))
done
[ $status -eq 0 ] || echo "fuzz: FAILED (see the lines above)"
exit $status
