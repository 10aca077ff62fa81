#!/usr/bin/env bash
# Installs the Debian packages a Makefile target needs, only those that are
# missing, on a fresh Debian bookworm (proven by `make fresh-check`, which runs
# the README's commands in a minimal bookworm root).
# Usage: scripts/deps.sh [build|test|fuzz|demo|bench|fresh-check]...
#   build        compilers, CMake, oneDNN (+ OpenCL headers, which oneDNN's
#                CMake package looks for), zlib, cJSON, liburing, libzstd
#                (ZSTD-compressed Parquet data), Open MPI,
#                and netbase (its /etc/hosts names localhost, where a minimal
#                root has none: without it every mpirun waits about 5 s)
#   test         build + gnuplot, the data sets the tests train on,
#                iproute2 (ip, tc: the multi-node test bed, scripts/netbed.sh)
#                and python3-numpy (data/test_arrays reads numpy's own files);
#                the Makefile's TEST_REQUIRE names them, and a test that
#                finds one missing under `make test` fails, never skips
#   fuzz         build + clang and its libFuzzer/sanitizer runtimes
#   demo         build + gnuplot and the Fashion-MNIST data set
#   bench        build (the PyTorch comparisons under bench/ are run by hand)
#   fresh-check  debootstrap and git (scripts/fresh_check.sh)
# Packages are installed with --no-install-recommends: everything needed is
# named here, nothing arrives through a Recommends.
set -euo pipefail
[ $# -gt 0 ] || set -- build
build=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev zlib1g-dev libcjson-dev
       liburing-dev libzstd-dev libopenmpi-dev openmpi-bin netbase)
data=(dataset-fashion-mnist bible-kjv bible-kjv-text)
pkgs=()
for what in "$@"; do
  case "$what" in
    build)       pkgs+=("${build[@]}") ;;
    bench)       pkgs+=("${build[@]}" iproute2) ;;
    test)        pkgs+=("${build[@]}" "${data[@]}" gnuplot-nox iproute2 python3-numpy) ;;
    fuzz)        pkgs+=("${build[@]}" clang libclang-rt-dev) ;;
    demo)        pkgs+=("${build[@]}" "${data[@]}" gnuplot-nox) ;;
    fresh-check) pkgs+=(debootstrap git ca-certificates) ;;
    *) echo "deps: unknown target '$what' (build, test, fuzz, demo, bench, fresh-check)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  case " ${missing[*]} " in *" $p "*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "deps: apt-get update failed: the package registry in /etc/apt/sources.list* cannot be reached" >&2
  exit 1
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
