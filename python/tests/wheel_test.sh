#!/usr/bin/env bash
# The wheel, end to end: built from this build tree with Debian's python3-build
# (no download), installed into a fresh venv, then `import vaiq` quantizes the
# bundled example and the `vaiq` entry point does the same, identically.
#
#   wheel_test.sh SOURCE_DIR BUILD_DIR        (ctest: python_wheel, label wheel)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
python=/usr/bin/python3
for module in build setuptools wheel ensurepip; do
  if ! $python -c "import $module" 2>/dev/null; then
    echo "skipped: Debian's python3 has no '$module' module; scripts/install-deps.sh installs python3-build," \
      "python3-setuptools, python3-wheel and python3-venv"
    exit 77
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH

(cd "$src" && VAIQ_BUILD_DIR=$build VAIQ_WHEEL_WORK=$work/setuptools \
  $python -m build --wheel --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1) ||
  { tail -n 40 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/vaiq-*-linux_*.whl)
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KB)"
listing=$($python -m zipfile -l "$wheel")
for member in vaiq/__init__.py vaiq/__main__.py vaiq/distributed.py vaiq/bin/vaiq vaiq/lib/vaiq/plugins/vaiq-format-qdq.so \
  vaiq/share/vaiq/recipes/cnn_npu.yaml vaiq/include/vaiq/plugin.hpp vaiq/lib/cmake/vaiq/vaiqConfig.cmake; do
  grep -q "^$member " <<<"$listing" || { echo "the wheel lacks $member"; exit 1; }
done

$python -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index --no-deps "$wheel"
site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# Every library and program finds what it links relative to itself.
find "$site/vaiq" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 | while IFS= read -r -d '' f; do
  runpath=$(readelf -d "$f" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  case ":$runpath" in *:/*) echo "$f has an absolute RUNPATH: $runpath"; exit 1 ;; esac
done

ex=$src/examples/mnist
cd "$work"  # nothing of the source or build tree on the path
"$work/venv/bin/python" - "$ex" <<'PY'
import os, sys
import vaiq
ex = sys.argv[1]
assert os.path.realpath(vaiq.__file__).startswith(os.path.realpath(sys.prefix)), vaiq.__file__
assert vaiq.cmake_dir() and os.path.isfile(os.path.join(vaiq.cmake_dir(), "vaiqConfig.cmake"))
report = vaiq.run_recipe("cnn_npu.yaml", os.path.join(ex, "calibration.npy"), model_input=os.path.join(ex, "mnist_cnn.onnx"),
                         model_output="from_python.onnx")
assert report["quantized"] and report["plan"]["tensors"] > 0, report["plan"]
print("import vaiq", vaiq.__version__, "quantized", report["plan"]["tensors"], "tensors")
PY
"$work/venv/bin/vaiq" --version
"$work/venv/bin/vaiq" -q run cnn_npu.yaml --model "$ex/mnist_cnn.onnx" --data "$ex/calibration.npy" --output from_cli.onnx
cmp from_python.onnx from_cli.onnx
"$work/venv/bin/python" -m vaiq validate cnn_npu.yaml >/dev/null
echo "the venv's vaiq and import vaiq wrote the same model"
