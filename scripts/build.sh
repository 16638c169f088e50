#!/usr/bin/env bash
# Installs the dependencies and builds vaiq with a CMake preset (default: release).
#   scripts/build.sh [debug|release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
scripts/install-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset"
