#!/usr/bin/env bash
# vaiq's MatMulNBits kernel against ONNX Runtime's, side by side in one run: a
# decoder's gated MLP block (2048 -> 5632 -> 2048, random weights) quantized by
# recipes/int4_rtn.yaml (4 bits, blocks of 128), run on 1, 16 and 128 tokens
# (decoding, a short and a long prompt) at 1 and 2 threads; median latency and
# the ratio ORT/vaiq (above 1.0: vaiq is faster).
#
#   bench/int4/matmul_nbits.sh WORK_DIR
#
# ORT as for bench/compare_ort.sh. Needs python3-numpy and python3-onnx to
# write the float model (decoder_mlp.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: bench/int4/matmul_nbits.sh WORK_DIR}
vaiq=${VAIQ:-$here/../../build/release/bin/vaiq}
ort=${ORT:?set ORT to an ONNX Runtime runner (see bench/compare_ort.sh)}
repeat=${REPEAT:-50}
mkdir -p "$work"
[ -f "$work/decoder_mlp.onnx" ] || python3 "$here/decoder_mlp.py" "$work" --tokens 1 16 128
"$vaiq" -q run "$here/../../recipes/int4_rtn.yaml" --model "$work/decoder_mlp.onnx" \
  --output "$work/decoder_mlp_int4.onnx" --set 'random_data_reader_input_shape=[1,16,2048]'
model="$work/decoder_mlp_int4.onnx"

printf '%-8s %7s %12s %12s %8s\n' tokens threads vaiq_ms ort_ms ratio
for t in 1 16 128; do
  input="$work/decoder_mlp/input_0_t$t.npy"
  for th in 1 2; do
    v=$("$vaiq" -q infer "$model" -i "$input" --threads "$th" --repeat "$repeat" --json |
        tr ',' '\n' | sed -n 's/.*"median_ms": *\([0-9.]*\).*/\1/p' | head -n 1)
    o=$("$ort" --model "$model" --inputs "$input" --threads "$th" --repeat "$repeat" 2>/dev/null |
        tr -d '\n ' | sed 's/.*"latency_ms":{[^}]*"median":\([0-9.]*\).*/\1/')
    printf '%-8s %7s %12.3f %12.3f %8.2f\n' "$t" "$th" "$v" "$o" "$(echo "$o / $v" | bc -l)"
  done
done
