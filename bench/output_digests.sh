#!/usr/bin/env bash
# Quantizes a set of models with every shipped recipe and prints one line per
# run: model, recipe, sha256 of the written model (or the error's first line).
# Refactorings that must not change outputs compare two runs of it:
#   bench/output_digests.sh build/release/bin/vaiq [model.onnx...] > before.txt
# Without models it uses the bundled example; real models (e.g. the PP-OCR ones
# from the shared tools) can be added. Data is the random reader (seeded), at
# a small fixed shape for models with free dimensions.
set -uo pipefail
cd "$(dirname "$0")/.."
vaiq="${1:?usage: bench/output_digests.sh VAIQ [MODEL...]}"
shift
models=("examples/mnist/mnist_cnn.onnx" "$@")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for model in "${models[@]}"; do
  name="$(basename "$model" .onnx)"
  shape_args=()
  # Models whose first input has fixed dimensions (python3-onnx tells, when installed) need no shape.
  fixed="$(python3 -c "import onnx,sys; d=onnx.load(sys.argv[1]).graph.input[0].type.tensor_type.shape.dim; print(all(x.HasField('dim_value') for x in d))" "$model" 2>/dev/null || echo False)"
  if [[ "$name" != mnist_cnn && "$fixed" != True ]]; then
    # The first input's name from python3-onnx when installed (else "x", as the PP-OCR
    # models name it); a text line (1 x 3 x 48 x 160) for the PP-OCR recognizer and classifier,
    # a page of 96 x 96 (a multiple of 32) for models named *det*.
    input="$(python3 -c "import onnx,sys; print(onnx.load(sys.argv[1]).graph.input[0].name)" "$model" 2>/dev/null || echo x)"
    shape="[1, 3, 48, 160]"
    [[ "$name" == *det* ]] && shape="[1, 3, 96, 96]"
    shape_args=(--set "random_data_reader_input_shape={\"$input\": $shape}")
  fi
  for recipe in recipes/*.yaml; do
    out="$work/$name.$(basename "$recipe" .yaml).onnx"
    if err="$("$vaiq" -q run "$recipe" --model "$model" --output "$out" "${shape_args[@]}" 2>&1)"; then
      # The model and its external data file, when it has one.
      echo "$name $(basename "$recipe") $(cat "$out" "$out"_data 2>/dev/null | sha256sum | cut -c1-16)"
    else
      echo "$name $(basename "$recipe") error: $(echo "$err" | head -1 | cut -c1-120)"
    fi
  done
done
