#!/usr/bin/env bash
# The executor's memory must not grow with the number of batches: peak resident
# memory of 1000 runs against 10 runs of the same model (GNU time's max RSS).
#   bench/streaming_memory.sh MODEL.onnx INPUT.npy
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
model=${1:?usage: bench/streaming_memory.sh MODEL.onnx INPUT.npy}
input=${2:?usage: bench/streaming_memory.sh MODEL.onnx INPUT.npy}
peak() { /usr/bin/time -f '%M' "$vaiq" -q infer "$model" -i "$input" --repeat "$1" 2>&1 >/dev/null | tail -n 1; }
small=$(peak 10)
large=$(peak 1000)
echo "peak RSS: 10 runs ${small} KiB, 1000 runs ${large} KiB, ratio $(echo "$large / $small" | bc -l | cut -c1-5)"
