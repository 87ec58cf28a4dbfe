#!/usr/bin/env bash
# Installs feedline's build and test dependencies from Debian 12's archive.
# Idempotent: packages already present are skipped, so the README's commands
# can call it every time. Runs apt-get through sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtbb-dev libturbojpeg0-dev libjpeg62-turbo-dev libabsl-dev
  libopencv-imgproc-dev libopencv-core-dev libspng-dev libwebp-dev libgif-dev libtiff-dev
  libsentencepiece-dev sentencepiece python3-sentencepiece nlohmann-json3-dev
  libcurl4-openssl-dev libxxhash-dev nginx-light
  libavformat-dev libavcodec-dev libswscale-dev libswresample-dev libavutil-dev ffmpeg python3-av libnginx-mod-http-echo curl openssl
  catch2 pybind11-dev
  python3 python3-dev python3-numpy python3-pytest python3-pil
  python3-venv python3-pip python3-setuptools python3-wheel
  python3-torch python3-torchvision libtorch-dev python3-distributed
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js and npm for the S3-compatible test server (tests/s3): Debian's, unless a node is
# already there (another vendor's nodejs would conflict with Debian's npm package).
if ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if ((${#missing[@]} > 0)); then
  echo "feedline: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# s3rver, pinned by tests/s3/package-lock.json, into tests/s3/node_modules.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -x "$here/tests/s3/node_modules/.bin/s3rver" ]]; then
  echo "feedline: installing the S3 test server (npm ci in tests/s3)" >&2
  (cd "$here/tests/s3" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
