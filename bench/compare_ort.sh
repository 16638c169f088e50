#!/usr/bin/env bash
# vaiq's executor against ONNX Runtime, side by side in one run: the same model,
# input and thread count, median latency over REPEAT runs, and the throughput
# ratio (ORT time / vaiq time; above 1.0 means vaiq is faster).
#
#   bench/compare_ort.sh MODELS_DIR [MODEL...]
#
# MODELS_DIR holds <name>.onnx and <name>/input_0.npy; for each batch B > 1 in
# BATCHES (default "1 8") also <name>/input_0_b<B>.npy, run only when the file
# exists (the model needs a dynamic batch dimension). ORT is a command with
# the interface `ORT --model M --inputs F --threads T --repeat N` printing JSON
# with latency_ms.median (set ORT=...); VAIQ defaults to the release build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
models_dir=${1:?usage: bench/compare_ort.sh MODELS_DIR [MODEL...]}
shift
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 mobilenet_v2 vit_small bert_tiny)
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
ort=${ORT:?set ORT to an ONNX Runtime runner (see the header of this script)}
repeat=${REPEAT:-20}
json() { sed -n 's/.*"'"$1"'": *\([0-9.]*\).*/\1/p' | head -n 1; }

printf '%-16s %6s %7s %12s %12s %8s\n' model batch threads vaiq_ms ort_ms ratio
for m in "${models[@]}"; do
  for b in ${BATCHES:-1 8}; do
    input="$models_dir/$m/input_0.npy"
    [ "$b" = 1 ] || input="$models_dir/$m/input_0_b$b.npy"
    [ -f "$input" ] || continue
    for t in 1 2; do
      v=$("$vaiq" -q infer "$models_dir/$m.onnx" -i "$input" --threads "$t" --repeat "$repeat" --json |
          tr ',' '\n' | json median_ms)
      o=$("$ort" --model "$models_dir/$m.onnx" --inputs "$input" --threads "$t" --repeat "$repeat" 2>/dev/null |
          tr -d '\n ' | sed 's/.*"latency_ms":{[^}]*"median":\([0-9.]*\).*/\1/')
      printf '%-16s %6s %7s %12.3f %12.3f %8.2f\n' "$m" "$b" "$t" "$v" "$o" "$(echo "$o / $v" | bc -l)"
    done
  done
done
