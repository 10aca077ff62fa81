#!/usr/bin/env bash
# Installs the Debian packages dtrain needs, only those that are missing.
# Usage: scripts/deps.sh [build|test|demo]   (test and demo add their extras)
set -euo pipefail
what=${1:-build}
pkgs=(build-essential cmake pkg-config libdnnl-dev zlib1g-dev libcjson-dev libopenmpi-dev openmpi-bin)
case "$what" in
  test) pkgs+=(clang libclang-rt-dev valgrind gnuplot-nox dataset-fashion-mnist) ;;
  demo) pkgs+=(dataset-fashion-mnist gnuplot-nox) ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
