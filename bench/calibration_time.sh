#!/usr/bin/env bash
# Calibration time of each method on the same data, side by side in one run:
# the calibrate phase of `vaiq run` (from the report) with MinMSE, NonOverflow
# and MinMax under recipes/cnn_npu.yaml, SAMPLES samples (links to INPUT.npy).
#   bench/calibration_time.sh SAMPLES MODEL.onnx:INPUT.npy...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
samples=${1:?usage: bench/calibration_time.sh SAMPLES MODEL.onnx:INPUT.npy...}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
phase() {  # seconds of a phase in a report
  jq -r --arg name "$2" '.phases[] | select(.name == $name) | .seconds' "$1"
}
printf '%-22s %8s %12s %12s %10s %14s\n' model samples MinMSE_s NonOverflow_s MinMax_s MinMSE/MinMax
for pair in "$@"; do
  model=${pair%%:*}
  input=$(realpath "${pair#*:}")
  name=$(basename "$model" .onnx)
  mkdir -p "$work/$name"
  for i in $(seq 1 "$samples"); do ln -sf "$input" "$work/$name/sample_$i.npy"; done
  declare -A t=()
  for method in MinMSE NonOverflow MinMax; do
    "$vaiq" -q run "$here/../recipes/cnn_npu.yaml" --model "$model" --data "$work/$name" \
      --output "$work/$name.$method.onnx" --set calibrate_method=$method --stop-after parameters >/dev/null
    t[$method]=$(phase "$work/$name.$method.report.json" calibrate)
  done
  printf '%-22s %8d %12.3f %12.3f %10.3f %14.2f\n' "$name" "$samples" "${t[MinMSE]}" "${t[NonOverflow]}" \
    "${t[MinMax]}" "$(echo "${t[MinMSE]} / ${t[MinMax]}" | bc -l)"
done
