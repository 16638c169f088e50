#!/usr/bin/env bash
# Calibration must not keep batches: peak resident memory of `vaiq run` with 1000
# calibration samples against 100 (GNU time's max RSS). Each sample is its own
# file (links to INPUT.npy), as a data folder holds them.
#   bench/calibration_memory.sh MODEL.onnx INPUT.npy [RECIPE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
model=${1:?usage: bench/calibration_memory.sh MODEL.onnx INPUT.npy [RECIPE]}
input=$(realpath "${2:?usage: bench/calibration_memory.sh MODEL.onnx INPUT.npy [RECIPE]}")
recipe=${3:-$here/../recipes/cpu.yaml}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {
  mkdir -p "$work/data$1"
  for i in $(seq 1 "$1"); do ln -s "$input" "$work/data$1/sample_$i.npy"; done
  local start end rss
  start=$(date +%s.%N)
  rss=$(/usr/bin/time -f '%M' "$vaiq" -q run "$recipe" --model "$model" --data "$work/data$1" \
          --output "$work/out$1.onnx" --set evaluation_batches=10 2>&1 >/dev/null | tail -n 1)
  end=$(date +%s.%N)
  echo "$rss $(echo "$end - $start" | bc)"
}
read -r small small_s <<<"$(run 100)"
read -r large large_s <<<"$(run 1000)"
echo "peak RSS: 100 samples ${small} KiB (${small_s} s), 1000 samples ${large} KiB (${large_s} s), ratio $(echo "$large / $small" | bc -l | cut -c1-5)"
