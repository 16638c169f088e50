#!/usr/bin/env bash
# A whole quantization run against the inferences it stands in for, side by
# side in one run: `vaiq run RECIPE` on MODEL with the samples in DATA_DIR
# (calibration and evaluation), its phases from the report and its peak
# memory, then ONNX Runtime's median float inference of the same model on the
# first sample, times the number of samples. Ratio: vaiq's run time over those
# inferences (the goal is 1.5 or less).
#
#   bench/whole_run.sh DATA_DIR RECIPE:MODEL.onnx...
#
# ORT is a command with the interface `ORT --model M --inputs F --threads T
# --repeat N` printing JSON with latency_ms.median. `vaiq run` uses every core,
# so ONNX Runtime gets as many threads.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:?usage: bench/whole_run.sh DATA_DIR RECIPE:MODEL.onnx...}
shift
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
ort=${ORT:?set ORT to an ONNX Runtime runner (see the header of this script)}
threads=$(nproc)
samples=$(find "$data" -maxdepth 1 -name '*.npy' | wc -l)
first=$(find "$data" -maxdepth 1 -name '*.npy' | sort | head -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

phase() {  # seconds of phase $2 in report $1
  jq -r --arg n "$2" '[.phases[] | select(.name == $n) | .seconds] | add // 0' "$1"
}

printf '%-34s %-16s %7s %8s %8s %8s %8s %7s %9s\n' recipe model samples run_s calib_s eval_s ort_s ratio peak_MB
for pair in "$@"; do
  recipe=${pair%%:*}
  model=${pair#*:}
  name=$(basename "$model" .onnx)
  /usr/bin/time -f '%e %M' -o "$work/time" "$vaiq" -q run "$recipe" --model "$model" --data "$data" \
    --output "$work/$name.onnx" --report "$work/$name.json" --set report_html=false >/dev/null
  read -r seconds peak_kb <"$work/time"
  ort_ms=$("$ort" --model "$model" --inputs "$first" --threads "$threads" --repeat 30 |
    jq -r '.latency_ms.median')
  ort_s=$(echo "$ort_ms * $samples / 1000" | bc -l)
  printf '%-34s %-16s %7d %8.2f %8.2f %8.2f %8.2f %7.2f %9d\n' "$(basename "$recipe")" "$name" "$samples" \
    "$seconds" "$(phase "$work/$name.json" calibrate)" "$(phase "$work/$name.json" evaluate)" "$ort_s" "$(echo "$seconds / $ort_s" | bc -l)" \
    $((peak_kb / 1024))
done
