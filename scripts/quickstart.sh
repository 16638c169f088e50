#!/usr/bin/env bash
# Sets up, builds, and runs the main job: quantizes the bundled MNIST example with
# the shipped CPU recipe and shows the report's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
vaiq=build/release/bin/vaiq
out=build/examples
mkdir -p "$out"
"$vaiq" --version
for recipe in recipes/*.yaml; do
  "$vaiq" validate "$recipe"
done
"$vaiq" run examples/mnist/mnist_cpu.yaml --output "$out/mnist_cnn_int8.onnx"
echo "quantized model: $out/mnist_cnn_int8.onnx; report: $out/mnist_cnn_int8.report.json"
