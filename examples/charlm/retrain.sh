#!/usr/bin/env bash
# Remakes the language-model example: installs the trainer's packages, then
# trains on /usr/share/common-licenses and writes charlm.onnx and its data beside
# this script (about 13 minutes on two cores).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../scripts/install-example-deps.sh"
rm -rf "$here/calibration" "$here/evaluation"
/usr/bin/python3 "$here/train.py" "$here"
