#!/usr/bin/env bash
# The GPU check, for a lent machine with an NVIDIA GPU (H200 here): builds feedline with its CUDA
# path against the dependency kit (tests/gpu/prepare_kit.sh, carried as build-gpukit), runs the
# GPU tests (copy + conversion against the CPU path, stream ordering with torch work, no leak over
# many epochs), measures host-to-device GB/s against a plain pinned cudaMemcpy of the same size,
# the fraction of copy time hidden behind the consumer, and images/s, then a short
# `feedline-bench --device cuda`. Must finish in under 5 minutes. Figures go to stdout and to
# $OUT (when set) as gpu_check.json.
# Usage (device tool): carry ["build-gpukit"], command "bash tests/gpu/run.sh"
set -euo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
KIT=$PWD/build-gpukit
[[ -f $KIT/kit.cmake ]] || { echo "run tests/gpu/prepare_kit.sh first and carry build-gpukit" >&2; exit 2; }
PY=${PYTHON:-python3}
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
ldd --version | head -1
nproc
export PATH=/usr/local/cuda/bin:$PATH
PYBIND11_DIR=$($PY -m pybind11 --cmakedir)
echo "== build"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFEEDLINE_KIT="$KIT" \
  -DPython_EXECUTABLE="$(command -v $PY)" -Dpybind11_DIR="$PYBIND11_DIR" \
  -DFEEDLINE_BUILD_TESTS=OFF -DFEEDLINE_BUILD_TORCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j"$(nproc)" --target _feedline feedline_python feedline-bench 2>&1 | tail -3
export LD_LIBRARY_PATH=$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/build-gpu/python
echo "build took $(( $(date +%s) - START )) s"
echo "== GPU tests and figures"
$PY tests/gpu/gpu_check.py --out "${OUT:-/tmp}/gpu_check.json"
echo "== feedline-bench --device cuda (short)"
timeout 120 build-gpu/bench/feedline-bench --device cuda --epochs 2 --quiet \
  --json "${OUT:-/tmp}/bench_cuda.json" || echo "feedline-bench --device cuda failed: $?"
echo "total $(( $(date +%s) - START )) s"
