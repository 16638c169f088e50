#!/usr/bin/env bash
# Sets up, builds, and runs the main job: quantizes the bundled MNIST example with
# the shipped "CNNs on NPU" recipe and shows the report's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# The command, its libraries, the plugins and the Python module: the tests are
# built by scripts/test.sh.
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target vaiq_product
vaiq=build/release/bin/vaiq
out=build/examples
mkdir -p "$out"
"$vaiq" --version
for recipe in recipes/*.yaml; do
  "$vaiq" validate "$recipe"
done
ex=examples/mnist
"$vaiq" run recipes/cnn_npu.yaml --model "$ex/mnist_cnn.onnx" --data "$ex/calibration.npy" \
  --set evaluation_data="$ex/test_images.npy" --set evaluation_labels="$ex/test_labels.npy" \
  --output "$out/mnist_cnn_npu.onnx"
echo "quantized model: $out/mnist_cnn_npu.onnx; report: $out/mnist_cnn_npu.report.json and .report.html"
# Installs vaiq (the command, the plugin SDK, and `import vaiq` for Debian's python3) into /usr/local.
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo cmake --install build/release >/dev/null
/usr/bin/python3 -c "import vaiq; print('import vaiq:', vaiq.__version__, vaiq.__file__)"
echo "quick start done in $((SECONDS / 60)) min $((SECONDS % 60)) s"
