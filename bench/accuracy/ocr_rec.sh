#!/usr/bin/env bash
# Exact-line accuracy (also with spaces ignored, as PaddleOCR's recognition
# metric compares lines) and character error rate of the PP-OCRv4 text
# recognizer, float and quantized with each recipe given, on 60 rendered lines;
# 32 other lines are the calibration data.
#   bench/accuracy/ocr_rec.sh VAIQ REC.onnx KEYS.txt [RECIPE...]
# REC.onnx: the recognizer at opset >= 10 (`vaiq convert-opset IN OUT --opset 11`
# on the packaged opset-9 file); KEYS.txt: its character list, one a line.
# With ORT=/path/to/ort (a runner taking --model --inputs --out, as the shared
# tools' ort) the quantized models are run there instead of in vaiq's executor.
# EVAL_LINES=240 EVAL_SEED=3 evaluates on 240 other lines (each line 0.4 points).
# LINES=other renders the calibration and the evaluation lines in faces, words and
# colours the recipes were never tuned on (`ocr_lines.py render ... other`): a user's
# own lines, calibrated on their own.
set -euo pipefail
python="${PYTHON:-/usr/bin/python3}"  # Debian's, with python3-numpy and python3-pil
cd "$(dirname "$0")/../.."
vaiq="${1:?usage: bench/accuracy/ocr_rec.sh VAIQ REC.onnx KEYS.txt [RECIPE...]}"
model="$2"
keys="$3"
shift 3
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(recipes/cpu.yaml recipes/cpu_accurate.yaml recipes/cnn_npu.yaml recipes/cnn_npu_accurate.yaml)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
lines=bench/accuracy/ocr_lines.py
[[ "${EVAL_SEED:-2}" != 1 ]] || { echo "EVAL_SEED 1 renders the calibration lines" >&2; exit 2; }
style=()
[[ "${LINES:-}" != other ]] || style=(other)
"$python" "$lines" render "$work/calib" 32 1 "${style[@]}"
"$python" "$lines" render "$work/eval" "${EVAL_LINES:-60}" "${EVAL_SEED:-2}" "${style[@]}"

score() {  # score MODEL TAG
  local outs=()
  for f in "$work"/eval/line_*.npy; do
    local o="$work/out/$2/$(basename "$f" .npy)"
    mkdir -p "$o"
    if [[ -n "${ORT:-}" ]]; then "$ORT" --model "$1" --inputs "$f" --out "$o" >/dev/null
    else "$vaiq" -q infer "$1" -i "$f" --output-dir "$o" >/dev/null; fi
    outs+=("$o")
  done
  echo "$2 $("$python" "$lines" score "$keys" "$work/eval/labels.txt" "${outs[@]}")"
}

score "$model" float
for recipe in "${recipes[@]}"; do
  name="$(basename "$recipe" .yaml)"
  start=$(date +%s.%N)
  "$vaiq" -q run "$recipe" --model "$model" --data "$work/calib" --output "$work/$name.onnx" --report "$work/$name.json"
  echo "$name quantized in $(echo "$(date +%s.%N) - $start" | bc) s"
  score "$work/$name.onnx" "$name"
done
