#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ with clang and runs each for a
# short bounded time over its corpus (FUZZ_SECONDS, default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
targets=(fuzz/fuzz_*.c)
[ ${#targets[@]} -eq 0 ] && { echo "fuzz: no targets"; exit 0; }
secs=${FUZZ_SECONDS:-20}
mkdir -p build-fuzz
srcs=$(ls src/base/*.c src/data/*.c 2>/dev/null | tr '\n' ' ')
for t in "${targets[@]}"; do
  name=$(basename "$t" .c)
  clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
    "$t" $srcs -lz -lm -lpthread -o "build-fuzz/$name"
  corpus="fuzz/corpus/${name#fuzz_}"
  mkdir -p "build-fuzz/corpus-$name"
  echo "fuzz: $name for ${secs}s"
  "build-fuzz/$name" -max_total_time="$secs" -rss_limit_mb=2048 "build-fuzz/corpus-$name" "$corpus" \
    2> "build-fuzz/$name.log" || { tail -40 "build-fuzz/$name.log"; exit 1; }
  tail -1 "build-fuzz/$name.log"
done
