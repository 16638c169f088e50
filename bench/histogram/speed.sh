#!/usr/bin/env bash
# Histogram::add's cost a value (speed.cpp) on one thread and on every core.
# Against another build of libvaiq (before a change), side by side:
#   bench/histogram/speed.sh [BUILD_DIR]          (default build/release)
#   LD_LIBRARY_PATH=OTHER/lib bench/histogram/speed.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build/release}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
c++ -O2 -std=c++20 -I"$here/../../framework/include" "$here/speed.cpp" -L"$build/lib" -lvaiq \
  -Wl,-rpath,"$build/lib" -o "$work/speed"
for threads in 1 "$(nproc)"; do
  echo "threads $threads"
  OMP_NUM_THREADS=$threads "$work/speed"
done
