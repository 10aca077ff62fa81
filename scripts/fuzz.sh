#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ with clang (ASan+UBSan) and runs
# each for a short bounded time over its committed corpus, fuzz/corpus/NAME/
# for fuzz/fuzz_NAME.c. New inputs go to build-fuzz/corpus-fuzz_NAME/ (not
# committed); a crasher is saved as build-fuzz/crash-* and fails the run.
#
# Each target names what it is built from in its first lines:
#   // fuzz-sources: src/base/*.c src/data/*.c   (globs, from the repo root)
#   // fuzz-libs: -lz                             (extra link flags)
# so a target compiles only the parser it tests and what that needs, not
# the whole library (oneDNN, MPI).
#
#   FUZZ_SECONDS  seconds per target (default 15; 5 targets: under 2 minutes
#                 with building, about 10 s a target)
#   FUZZ_TARGETS  names to run (default: every fuzz/fuzz_*.c), e.g. "idx env"
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
secs=${FUZZ_SECONDS:-15}
if [ -n "${FUZZ_TARGETS:-}" ]; then
  targets=()
  for n in $FUZZ_TARGETS; do targets+=("fuzz/fuzz_${n#fuzz_}.c"); done
else
  targets=(fuzz/fuzz_*.c)
fi
[ ${#targets[@]} -eq 0 ] && { echo "fuzz: no targets"; exit 0; }
command -v clang >/dev/null || { echo "fuzz: clang not found (scripts/deps.sh test installs it)"; exit 1; }
mkdir -p build-fuzz
for t in "${targets[@]}"; do
  [ -f "$t" ] || { echo "fuzz: no such target $t"; exit 1; }
  name=$(basename "$t" .c)
  srcs=$(sed -n 's|^// fuzz-sources: *||p' "$t" | head -1)
  libs=$(sed -n 's|^// fuzz-libs: *||p' "$t" | head -1)
  files=()
  for g in $srcs; do
    m=($g) # the globs are meant to expand
    [ ${#m[@]} -gt 0 ] && [ -e "${m[0]}" ] || { echo "fuzz: $t: '$g' matches no file"; exit 1; }
    files+=("${m[@]}")
  done
  bin="build-fuzz/$name"
  # Rebuild when the target, a source or a header is newer than the binary.
  stale=1
  if [ -x "$bin" ]; then
    stale=0
    for f in "$t" "${files[@]}" fuzz/*.h include/dtrain/*.h src/*/*.h src/*/*/*.h tools/*.h tools/*.c \
             scripts/fuzz.sh; do
      [ "$f" -nt "$bin" ] && { stale=1; break; }
    done
  fi
  if [ $stale = 1 ]; then
    # shellcheck disable=SC2086
    clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=all -Iinclude -Isrc -Itools \
      "$t" "${files[@]}" $libs -lm -lpthread -o "$bin"
  fi
  corpus="fuzz/corpus/${name#fuzz_}"
  [ -d "$corpus" ] || { echo "fuzz: $name has no committed corpus $corpus"; exit 1; }
  mkdir -p "build-fuzz/corpus-$name"
  echo "fuzz: $name for ${secs}s"
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -artifact_prefix=build-fuzz/ \
    "build-fuzz/corpus-$name" "$corpus" 2> "build-fuzz/$name.log" \
    || { tail -40 "build-fuzz/$name.log"; echo "fuzz: $name FAILED (crasher under build-fuzz/)"; exit 1; }
  tail -1 "build-fuzz/$name.log"
done
