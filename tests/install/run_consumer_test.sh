#!/usr/bin/env bash
# ctest install.consumer: installs feedline from a build tree into a temporary prefix, builds
# tests/install/consumer against it with find_package(feedline), runs it on a small ImageFolder
# made here and checks the image counts it prints; builds and runs a custom data set +
# transform (several fields, one of variable length) linked with feedline::engine alone, and
# checks its link line and what it prints.
#
# Usage: run_consumer_test.sh BUILD_DIR WITH_TORCH(ON|OFF) [CONFIG]
#   Environment (optional): CMAKE, CMAKE_GENERATOR, CXX, PYTHON (one with PIL), TMPDIR.
# The build tree must be built (the installed targets at least).
set -euo pipefail

build_dir=$(cd "$1" && pwd)
with_torch=${2:-OFF}
config=${3:-Release}
here=$(cd "$(dirname "$0")" && pwd)
cmake=${CMAKE:-cmake}
python=${PYTHON:-}
if [ -z "$python" ]; then
  # Debian's interpreter has PIL (python3-pil); the first python3 on PATH may be another one.
  if [ -x /usr/bin/python3 ]; then python=/usr/bin/python3; else python=python3; fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/feedline-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== install into $prefix"
"$cmake" --install "$build_dir" --config "$config" --prefix "$prefix" --component feedline >/dev/null

echo "== configure and build the consumer (WITH_TORCH=$with_torch)"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# The consumer must find the installed package, not the build tree or the system; and work as on
# a machine without the CUDA toolkit (the package brings the runtime it was built with).
"$cmake" -S "$here/consumer" -B "$work/build" -DCMAKE_BUILD_TYPE="$config" \
  -DCMAKE_PREFIX_PATH="$prefix" -DWITH_TORCH="$with_torch" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "${launcher[@]}" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log"
  exit 1
}
found=$(sed -n 's/^feedline_DIR:PATH=//p' "$work/build/CMakeCache.txt")
case "$found" in
  "$prefix"/*) ;;
  *) echo "FAIL: the consumer found feedline in '$found', not under $prefix"; exit 1 ;;
esac
"$cmake" --build "$work/build" -j1
cudart=$(find "$prefix" -name libcudart_static.a)
if [ -n "$cudart" ] && ! grep -q "$cudart" "$work/build/build.ninja" "$work/build"/CMakeFiles/*.dir/link.txt 2>/dev/null; then
  echo "FAIL: the consumer did not link the CUDA runtime installed with feedline ($cudart)"
  exit 1
fi

# custom_dataset links feedline::engine alone: none of the other layers' libraries, nor a codec,
# the HTTP client or OpenCV, may be on its link line.
link_line=$(grep -h -A3 "build custom_dataset:" "$work/build/build.ninja" 2>/dev/null ||
  cat "$work/build/CMakeFiles/custom_dataset.dir/link.txt")
case "$link_line" in *libfeedline_engine.a*) ;; *)
  echo "FAIL: custom_dataset is not linked with libfeedline_engine.a: $link_line"; exit 1 ;; esac
for lib in libfeedline.a libfeedline_io libfeedline_image libfeedline_text libfeedline_video libjpeg libturbojpeg \
  libspng libwebp libgif libtiff libcurl libopencv libsentencepiece libavcodec libavformat; do
  case "$link_line" in *"$lib"*)
    echo "FAIL: custom_dataset (feedline::engine only) links $lib: $link_line"; exit 1 ;; esac
done

echo "== make a small ImageFolder"
data=$work/data
"$python" - "$data" <<'PY'
import os, sys
from PIL import Image
root = sys.argv[1]
for c, n in (("cat", 4), ("dog", 3)):   # 7 images
    os.makedirs(os.path.join(root, c))
    for i in range(n):
        w, h = 40 + 9 * i, 36 + 5 * i
        img = Image.new("RGB", (w, h))
        img.putdata([((x * 7 + i * 40) % 256, (y * 5) % 256, (x * y) % 256)
                     for y in range(h) for x in range(w)])
        img.save(os.path.join(root, c, "%d.jpg" % i), quality=90)
PY

expect="images 7 batches 2"
check() {
  local out
  out=$("$@")
  echo "$1: $out"
  case "$out" in
    "$expect"*) ;;
    *) echo "FAIL: $1 printed '$out', expected '$expect...'"; exit 1 ;;
  esac
}
check "$work/build/count_images" "$data"
out=$("$work/build/custom_dataset")
echo "custom_dataset: $out"
[ "$out" = "samples 50 batches 7 ok" ] || { echo "FAIL: custom_dataset printed '$out'"; exit 1; }
if [ "$with_torch" = ON ]; then
  check "$work/build/count_images_torch" "$data"
  out=$("$work/build/torch_dataset")
  echo "torch_dataset: $out"
  [ "$out" = "samples 30 batches 4 ok" ] || { echo "FAIL: torch_dataset printed '$out'"; exit 1; }
  # pytorch/examples' custom-dataset shape: feedline's batches are torch's, in torch's order,
  # with LibTorch's libraries before feedline's on the link line and after.
  want=$("$work/build/custom_dataset_torch")
  echo "custom_dataset_torch (torch::data): $want"
  case "$want" in "batches 12 samples 44 "*) ;; *) echo "FAIL: torch printed '$want'"; exit 1 ;; esac
  for order in torch_first feedline_first; do
    out=$("$work/build/custom_dataset_feedline_$order")
    echo "custom_dataset_feedline_$order: $out"
    [ "$out" = "$want" ] || { echo "FAIL: feedline ($order) printed '$out', torch '$want'"; exit 1; }
  done
  # The text API (SentencePiece, through feedline's plugin) beside LibTorch, in both orders.
  if command -v spm_train >/dev/null; then
    "$python" - "$work/corpus.txt" <<'PY'
import random, sys
rng = random.Random(5)
words = ["data", "loader", "token", "piece", "model", "train", "batch", "epoch", "shard",
         "queue", "thread", "worker", "tensor", "seed", "rank"]
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(" ".join(rng.choice(words) + rng.choice(["", "s", "ed", "ing"])
                         for _ in range(rng.randint(1, 20))) + "\n")
PY
    spm_train --input="$work/corpus.txt" --model_prefix="$work/spm" --vocab_size=60 \
      --model_type=unigram --minloglevel=2 >/dev/null 2>&1
    for order in torch_first feedline_first; do
      out=$("$work/build/text_torch_$order" "$work/corpus.txt" "$work/spm.model")
      echo "text_torch_$order: $out"
      # The plugin must come from the installed package (its RUNPATH), not from the build tree.
      loaded=$(LD_DEBUG=files "$work/build/text_torch_$order" "$work/corpus.txt" "$work/spm.model" 2>&1 \
        >/dev/null | sed -n 's/.*calling init: \(.*libfeedline_sentencepiece.so\).*/\1/p' | head -1)
      case "$loaded" in "$prefix"/*) ;;
        *) echo "FAIL: text_torch_$order loaded the SentencePiece plugin from '$loaded'"; exit 1 ;; esac
      case "$out" in "documents 300 tokens "*" ok") ;;
        *) echo "FAIL: text_torch_$order printed '$out'"; exit 1 ;; esac
    done
  else
    echo "FAIL: spm_train (Debian's sentencepiece) is missing: cmake/install-deps.sh installs it"
    exit 1
  fi
fi
echo "PASS"
