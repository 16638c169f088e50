#!/usr/bin/env bash
# Box recall and precision of the PP-OCRv4 text detector quantized with each
# recipe given, against the float model's boxes, on 20 rendered pages; 16 other
# pages are the calibration data.
#   bench/accuracy/ocr_det.sh VAIQ DET.onnx [RECIPE...]
# With ORT=/path/to/ort (a runner taking --model --inputs --out, as the shared
# tools' ort) the models are run there instead of in vaiq's executor.
set -euo pipefail
python="${PYTHON:-/usr/bin/python3}"  # Debian's, with python3-numpy and python3-pil
cd "$(dirname "$0")/../.."
vaiq="${1:?usage: bench/accuracy/ocr_det.sh VAIQ DET.onnx [RECIPE...]}"
model="$2"
shift 2
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(recipes/cpu.yaml recipes/cpu_accurate.yaml recipes/cnn_npu.yaml recipes/cnn_npu_accurate.yaml)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pages=bench/accuracy/ocr_pages.py
"$python" "$pages" render "$work/calib" 16 1
"$python" "$pages" render "$work/eval" 20 2

maps() {  # maps MODEL TAG: one output folder a page, printed
  for f in "$work"/eval/page_*.npy; do
    local o="$work/out/$2/$(basename "$f" .npy)"
    mkdir -p "$o"
    if [[ -n "${ORT:-}" ]]; then "$ORT" --model "$1" --inputs "$f" --out "$o" >/dev/null
    else "$vaiq" -q infer "$1" -i "$f" --output-dir "$o" >/dev/null; fi
    echo "$o"
  done
}

mapfile -t reference < <(maps "$model" float)
for recipe in "${recipes[@]}"; do
  name="$(basename "$recipe" .yaml)"
  start=$(date +%s.%N)
  "$vaiq" -q run "$recipe" --model "$model" --data "$work/calib" --output "$work/$name.onnx" --report "$work/$name.json"
  echo "$name quantized in $(echo "$(date +%s.%N) - $start" | bc) s"
  mapfile -t quantized < <(maps "$work/$name.onnx" "$name")
  echo "$name $(cd bench/accuracy && "$python" ocr_pages.py score "${reference[@]}" -- "${quantized[@]}")"
done
