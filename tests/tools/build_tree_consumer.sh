#!/bin/sh
# The library used straight from the build tree, as a user does before (or
# instead of) `make install`: examples/quickstart.c compiled and run against
# build/ through pkg-config (PKG_CONFIG_PATH=build) and through the CMake
# package (find_package(dtrain) with CMAKE_PREFIX_PATH=build).
# Usage: build_tree_consumer.sh BUILD_DIR SOURCE_DIR. Exit 77 (skip) when
# pkg-config, cmake or a C compiler is missing.
set -eu
build=$1
src=$2
for tool in pkg-config cmake cc; do
  command -v "$tool" > /dev/null 2>&1 || { echo "skip: $tool not found" >&2; exit 77; }
done
# In a sanitizer build libdtrain.so carries the ASan runtime, which the plain
# consumer program does not load first: tell ASan that is fine here. Its
# leak check is off too: with the runtime loaded after the program's other
# libraries, their earlier allocations (oneDNN's static tables) look leaked.
# This test is about the build tree's packaging; the library's own leak
# checks are the rest of the ASan pass.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0:detect_leaks=0"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "build tree: $*" >&2; exit 1; }

# pkg-config: the build tree's dtrain.pc names the source tree's include/
# and the folder libdtrain.so lies in.
export PKG_CONFIG_PATH="$build"
flags=$(pkg-config --cflags --libs dtrain) || fail "pkg-config --cflags --libs dtrain failed"
inc=$(pkg-config --variable=includedir dtrain)
[ -f "$inc/dtrain/dtrain.h" ] || fail "dtrain.pc's includedir $inc has no dtrain/dtrain.h"
libdir=$(pkg-config --variable=libdir dtrain)
[ -e "$libdir/libdtrain.so" ] || fail "dtrain.pc's libdir $libdir has no libdtrain.so"
# shellcheck disable=SC2086
cc -std=c11 "$src/examples/quickstart.c" -o "$tmp/qs_pc" $flags -Wl,-rpath,"$libdir" ||
  fail "examples/quickstart.c does not compile with pkg-config's flags: $flags"
"$tmp/qs_pc" > "$tmp/out_pc" 2>&1 || { cat "$tmp/out_pc" >&2; fail "the pkg-config build did not run"; }

# CMake: build/dtrainConfig.cmake and the build tree's dtrainTargets.cmake.
mkdir -p "$tmp/cm"
cat > "$tmp/cm/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.20)
project(consumer C)
find_package(dtrain REQUIRED)
add_executable(quickstart "$src/examples/quickstart.c")
target_link_libraries(quickstart PRIVATE dtrain::dtrain)
C
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$build" > "$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log" >&2; fail "find_package(dtrain) with CMAKE_PREFIX_PATH=build failed"; }
cmake --build "$tmp/cm/build" > "$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; fail "the CMake consumer did not build"; }
"$tmp/cm/build/quickstart" > "$tmp/out_cm" 2>&1 || { cat "$tmp/out_cm" >&2; fail "the CMake build did not run"; }
echo "build tree: examples/quickstart.c built and ran through pkg-config and find_package"
