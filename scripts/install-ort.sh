#!/usr/bin/env bash
# Installs the npm packages the tests use, pinned by tests/ort/package-lock.json: ONNX Runtime
# for Node.js (onnxruntime-node) for the integration tests, and playwright-core, which drives
# Debian's Chromium in the HTML report's test; into VAIQ_ORT_HOME (default ~/.cache/vaiq/onnxruntime-node).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
home="${VAIQ_ORT_HOME:-$HOME/.cache/vaiq/onnxruntime-node}"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends nodejs npm
fi
if [ -f "$home/node_modules/onnxruntime-node/package.json" ] &&
   cmp -s "$root/tests/ort/package-lock.json" "$home/package-lock.json"; then
  exit 0
fi
mkdir -p "$home"
cp "$root/tests/ort/package.json" "$root/tests/ort/package-lock.json" "$root/tests/ort/.npmrc" "$home/"
(cd "$home" && npm ci --no-audit --no-fund)
