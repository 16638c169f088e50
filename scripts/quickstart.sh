#!/usr/bin/env bash
# Sets up, builds, and runs the main job: lists the plugins and validates and
# explains every shipped recipe. (Quantizing the bundled example needs the
# calibration and emission phases, which this build does not have yet.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
vaiq=build/release/bin/vaiq
"$vaiq" --version
"$vaiq" plugins
for recipe in recipes/*.yaml; do
  "$vaiq" validate "$recipe"
done
"$vaiq" explain recipes/cpu.yaml
