#!/usr/bin/env bash
# Debian packages that retraining the bundled example and the accuracy benchmarks
# (bench/accuracy) need; not the build or tests.
set -euo pipefail
# libopenblas0-pthread: torch and numpy through the reference BLAS train 20x slower.
packages=(python3 python3-numpy python3-onnx python3-torch libopenblas0-pthread python3-pil fonts-dejavu-core)
# npm: Debian's, unless one is already there (NodeSource's nodejs carries its own and
# conflicts with Debian's npm package).
command -v npm >/dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update
$sudo apt-get install -y --no-install-recommends "${missing[@]}"
