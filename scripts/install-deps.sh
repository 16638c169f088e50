#!/usr/bin/env bash
# Installs every Debian package vaiq needs to build, test and install.
# Idempotent and non-interactive; the only place the project downloads anything.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libonnx-dev libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev
  libboost-dev libboost-filesystem-dev
  libeigen3-dev
  libdnnl-dev
  libspdlog-dev libfmt-dev
  libcli11-dev
  libjpeg62-turbo-dev libpng-dev
  nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev
  libonnx-testdata
  bc time jq
  # The Python module (import vaiq) and its tests, with Debian's own python3.
  python3-dev python3-numpy python3-pytest pybind11-dev
  # The wheel (python3 -m build --wheel --no-isolation; pip into a venv) and sharded calibration on Dask.
  python3-build python3-setuptools python3-wheel python3-venv python3-distributed
  # The HTML report's test renders it in a real browser.
  chromium
  # The fuzz targets (scripts/fuzz.sh): clang with libFuzzer and its OpenMP runtime.
  clang libclang-rt-14-dev libomp-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
