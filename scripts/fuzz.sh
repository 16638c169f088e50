#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/: clang's libFuzzer with ASan and UBSan) and runs
# each on its seed corpus for a bounded time. Fails if any target finds a crash,
# a sanitizer report, a hang or an exception other than vaiq's InputError.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s; all targets)
# With FUZZ_RUNS=N each target instead runs its seeds and then N fuzzed inputs with
# a fixed random seed: the same inputs on every machine (what CI runs).
# Corpora grow in build/fuzz/work/corpus/<target> across runs; findings are
# written to build/fuzz/work/findings/<target>-*, each to become a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(model tensor_file recipe executor custom_ops)

scripts/install-deps.sh
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

work=build/fuzz/work
testdata=/usr/share/libonnx-testdata/data
mkdir -p "$work/findings" "$work/logs"

# Seeds: the ONNX backend test models and their tensors, the bundled examples, the recipes.
seed() {
  local target="$1" corpus="$work/corpus/$1"
  mkdir -p "$corpus"
  [ -n "$(ls -A "$corpus")" ] && return 0
  case "$target" in
    model|executor)
      find "$testdata/node" "$testdata/simple" -name model.onnx | sort | while read -r m; do
        cp "$m" "$corpus/$(echo "$m" | md5sum | cut -c1-16).onnx"
      done
      cp examples/mnist/mnist_cnn.onnx "$corpus/" ;;
    tensor_file)  # first byte: 0 = .pb, 1 = .npy
      find "$testdata/node" -name 'input_0.pb' | sort | sed -n '1,300p' | while read -r p; do
        { printf '\x00'; cat "$p"; } > "$corpus/$(echo "$p" | md5sum | cut -c1-16).pb"
      done
      for n in examples/mnist/test_labels.npy examples/charlm/evaluation_labels.npy; do
        [ -f "$n" ] && { printf '\x01'; cat "$n"; } > "$corpus/$(basename "$n")"
      done ;;
    recipe)
      find recipes examples tests/recipes -name '*.yaml' | sort | while read -r r; do
        cp "$r" "$corpus/$(echo "$r" | tr '/' '_')"
      done ;;
    custom_ops)
      # 32 bytes each, the same on every machine: the first bytes pick the op and types.
      for i in $(seq 1 16); do
        printf "$(printf '%s' "seed $i" | sha256sum | cut -c1-64 | sed 's/../\\x&/g')" > "$corpus/seed_$i"
      done ;;
  esac
}

if [ -n "${FUZZ_RUNS:-}" ]; then
  budget=(-runs="$FUZZ_RUNS" -seed=1)
  spent="$FUZZ_RUNS fuzzed inputs (seed 1)"
else
  budget=(-max_total_time="$seconds")
  spent="${seconds} s"
fi
failed=0
for t in "${targets[@]}"; do
  seed "$t"
  log="$work/logs/$t.log"
  # Tensors over 1 GB are refused (InputError), so that a model asking for terabytes is a
  # clear error here too rather than the fuzzer's out-of-memory report.
  if VAIQ_MAX_TENSOR_BYTES=1073741824 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     "build/fuzz/bin/${t}_fuzzer" "$work/corpus/$t" "${budget[@]}" -timeout=20 -rss_limit_mb=4096 \
       -malloc_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/findings/$t-" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(ls "$work/corpus/$t" | wc -l)
  echo "fuzz $t: $status, $runs executions ($spent), corpus $corpus inputs"
  if [ "$status" = FAILED ]; then
    grep -E 'ERROR|not an input error|SUMMARY|Test unit written' "$log" | head -20 || tail -30 "$log"
  fi
done
exit $failed
