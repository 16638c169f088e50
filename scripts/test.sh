#!/usr/bin/env bash
# Sets up, builds and runs every test with a CMake preset (default: release).
#   scripts/test.sh [debug|release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
scripts/install-ort.sh
scripts/build.sh "$preset"
ctest --preset "$preset" -j "$(nproc)"
