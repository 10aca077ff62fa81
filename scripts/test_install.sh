#!/usr/bin/env bash
# Installs the build into a temporary (non-default) prefix, then checks:
# the installed dtrain program and libdtrain.so find everything they link
# without LD_LIBRARY_PATH (install RPATH); dtrain.pc's static flags list what
# libdtrain links, MPI included when built with it; and a tiny consumer builds
# and runs through pkg-config (with LD_LIBRARY_PATH, then with the rpath the
# README shows) and through the CMake package.
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
libdir=${libdir%/}
fail() { echo "install: $*" >&2; exit 1; }

# The installed program runs from a non-default prefix without LD_LIBRARY_PATH.
for f in "$tmp/prefix/bin/dtrain" "$libdir/libdtrain.so"; do
  if env -u LD_LIBRARY_PATH ldd "$f" | grep -q "not found"; then
    env -u LD_LIBRARY_PATH ldd "$f" | grep "not found" >&2
    fail "$f does not find its libraries without LD_LIBRARY_PATH"
  fi
done
info=$(env -u LD_LIBRARY_PATH "$tmp/prefix/bin/dtrain" info) || fail "installed 'dtrain info' failed"
grep -q "^dtrain " <<< "$info" || fail "installed 'dtrain info' printed: $info"

# pkg-config --static lists what libdtrain links, MPI when it was built with it.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
static=$(pkg-config --static --libs dtrain)
for want in -ldtrain -ldnnl -lz -lcjson; do
  grep -qw -- "$want" <<< "$static" || fail "pkg-config --static --libs dtrain lacks $want: $static"
done
if grep -q "mpi backend yes" <<< "$info"; then
  grep -qw -- "-lmpi" <<< "$static" || fail "built with MPI but pkg-config --static --libs dtrain lacks -lmpi: $static"
fi

cc -std=c11 "$tmp/consumer.c" -o "$tmp/c1" $(pkg-config --cflags --libs dtrain)
LD_LIBRARY_PATH="$libdir" "$tmp/c1"
cc -std=c11 "$tmp/consumer.c" -o "$tmp/c2" $(pkg-config --cflags --libs dtrain) \
  -Wl,-rpath,"$(pkg-config --variable=libdir dtrain)"
env -u LD_LIBRARY_PATH "$tmp/c2"
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
env -u LD_LIBRARY_PATH "$tmp/cm/build/consumer"
mpi=$(grep -ow -- -lmpi <<< "$static" || echo "no MPI: built without")
echo "install: installed dtrain runs without LD_LIBRARY_PATH; pkg-config --static lists $mpi;" \
  "pkg-config and CMake consumers built and ran"
