#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds a tiny consumer
# against it twice: through pkg-config and through the CMake package.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install build --prefix "$tmp/prefix" > /dev/null
cat > "$tmp/consumer.c" <<'C'
#include <dtrain/dtrain.h>
#include <stdio.h>
int main(void)
{
    dt_arena *a = dt_arena_init(0);
    void *p = dt_arena_alloc(a, 100);
    printf("dtrain %s %s\n", DT_VERSION_STRING, p ? "ok" : "fail");
    dt_arena_free(a);
    return p ? 0 : 1;
}
C
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -1)
PKG_CONFIG_PATH="$libdir/pkgconfig" cc -std=c11 "$tmp/consumer.c" -o "$tmp/c1" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs dtrain)
LD_LIBRARY_PATH="$libdir" "$tmp/c1"
mkdir -p "$tmp/cm"
cat > "$tmp/cm/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(dtrain REQUIRED)
add_executable(consumer ../consumer.c)
target_link_libraries(consumer PRIVATE dtrain::dtrain)
C
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/cm/build" > /dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cm/build/consumer"
echo "install: pkg-config and CMake consumers built and ran"
