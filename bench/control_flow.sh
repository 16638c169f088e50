#!/usr/bin/env bash
# Real models with control flow against ONNX Runtime: Silero VAD v5, v6 and the
# legacy model (an If whose branches hold the whole network, an If nested in a
# branch), run in vaiq and in ONNX Runtime on the same random audio chunk and
# zero state; prints each output's largest difference.
#
#   bench/control_flow.sh DIR
#
# DIR holds silero_vad_v5.onnx, silero_vad_v6.onnx and silero_vad_legacy.onnx
# (`npm pack @ricky0123/vad-web` then `tar xzf` the package: package/dist/).
# ORT as for bench/compare_ort.sh. Needs python3-numpy for the inputs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: bench/control_flow.sh DIR}
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
ort=${ORT:?set ORT to an ONNX Runtime runner (see bench/compare_ort.sh)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import sys, numpy as np
w = sys.argv[1]
rng = np.random.default_rng(0)
np.save(f"{w}/input.npy", (rng.standard_normal((1, 512)) * 0.1).astype(np.float32))
np.save(f"{w}/state.npy", np.zeros((2, 1, 128), np.float32))
np.save(f"{w}/sr.npy", np.array(16000, dtype=np.int64))
np.save(f"{w}/h.npy", np.zeros((2, 1, 64), np.float32))
np.save(f"{w}/c.npy", np.zeros((2, 1, 64), np.float32))
PY
for m in v5 v6 legacy; do
  model="$dir/silero_vad_$m.onnx"
  [ -f "$model" ] || { echo "silero_vad_$m: $model is missing"; continue; }
  inputs=("$work/input.npy" "$work/state.npy" "$work/sr.npy")
  [ "$m" = legacy ] && inputs=("$work/input.npy" "$work/sr.npy" "$work/h.npy" "$work/c.npy")
  rm -rf "$work/out"
  if ! "$vaiq" -q infer "$model" -i "${inputs[@]}" --output-dir "$work/out" >/dev/null 2>"$work/err"; then
    echo "silero_vad_$m: vaiq failed: $(head -n 1 "$work/err")"
    continue
  fi
  diffs=$("$ort" --model "$model" --inputs "${inputs[@]}" --compare "$work/out" 2>/dev/null |
          sed -n 's/.*"max_abs_diff": *\([0-9.e-]*\).*/\1/p' | tr '\n' ' ')
  echo "silero_vad_$m: max |vaiq - ORT| per output: $diffs"
done
