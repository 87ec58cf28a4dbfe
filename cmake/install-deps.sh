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
  libcurl4-openssl-dev nginx-light
  catch2 pybind11-dev
  python3 python3-dev python3-numpy python3-pytest python3-pil
  python3-torch python3-torchvision libtorch-dev
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "feedline: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
