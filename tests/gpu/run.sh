#!/usr/bin/env bash
# The GPU check, for a lent machine with an NVIDIA GPU (H200 here): builds feedline with its CUDA
# path against the dependency kit (tests/gpu/prepare_kit.sh, carried as build-gpukit), then runs
# every check of tests/gpu/gpu_check.py (copy + conversion against the CPU path, stream ordering,
# every DLPack stream value, cuda:N refusal, no leak over many epochs, a batch after its loader,
# exit with a live tensor, fork with a live loader, copy hidden behind a training step and H2D
# against a plain pinned copy: each a pass/fail), compute-sanitizer (memcheck, synccheck) on a
# small run, a short `feedline-bench --device cuda`, `cuobjdump` (sm_90 code present), and last the
# LibTorch adapter built against the machine's CUDA LibTorch and checked on the GPU
# (tests/gpu/torch_cuda_check.cc). Each
# step has a time limit; a failed step does not stop the others; everything is logged unbuffered to
# $OUT/gpu_check.log and the figures to $OUT/gpu_check.json as they come. Under 8 minutes.
# Exit status: 0 only if every step passed.
# Usage (device tool): carry ["build-gpukit"], command "bash tests/gpu/run.sh"
# Without a GPU: `bash tests/gpu/run.sh --dry-run` (CPU-side parts only; also a ctest test).
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
failed=()
step() {  # step NAME SECONDS COMMAND...: runs it under a time limit, records a failure
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $(( $(date +%s) - START ))s)"
  timeout "$limit" "$@"
  local rc=$?
  if (( rc != 0 )); then
    echo "!! $name failed (exit $rc)"
    failed+=("$name")
  fi
  return 0
}
if [[ ${1:-} == --dry-run ]]; then
  step "gpu_check (dry run)" 300 env PYTHONPATH="$PWD/build/python" /usr/bin/python3 \
    tests/gpu/gpu_check.py --dry-run --out "$OUT/gpu_check.json"
  if [[ -x build/tests/gpu/feedline_torch_cuda_check ]]; then  # built with the LibTorch adapter
    step "LibTorch check (dry run)" 120 build/tests/gpu/feedline_torch_cuda_check \
      --out "$OUT/torch_cuda_check.json"
  fi
  (( ${#failed[@]} == 0 )) || { echo "FAILED: ${failed[*]}"; exit 1; }
  echo "dry run passed"; exit 0
fi
KIT=$PWD/build-gpukit
[[ -f $KIT/kit.cmake ]] || { echo "run tests/gpu/prepare_kit.sh first and carry build-gpukit" >&2; exit 2; }
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
ldd --version | head -1
nproc
export PATH=/usr/local/cuda/bin:$PATH
PYBIND11_DIR=$($PY -m pybind11 --cmakedir)
step configure 60 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFEEDLINE_KIT="$KIT" \
  -DPython_EXECUTABLE="$(command -v $PY)" -Dpybind11_DIR="$PYBIND11_DIR" \
  -DFEEDLINE_BUILD_TESTS=OFF -DFEEDLINE_BUILD_TORCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90
step build 200 cmake --build build-gpu -j"$(nproc)" --target _feedline feedline_python feedline-bench
export LD_LIBRARY_PATH=$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/build-gpu/python
step "cuobjdump sm_90" 30 bash -c \
  "cuobjdump --list-elf build-gpu/python/feedline/_feedline*.so | grep -q sm_90"
step "gpu_check" 300 $PY tests/gpu/gpu_check.py --out "$OUT/gpu_check.json" --step-timeout 60
# compute-sanitizer on a small run: memory errors, and synchronisation hazards in the kernels.
for tool in memcheck synccheck; do
  step "compute-sanitizer $tool" 75 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    $PY tests/gpu/gpu_check.py --small --out "$OUT/gpu_small_$tool.json" --step-timeout 70
done
step "feedline-bench --device cuda" 90 build-gpu/bench/feedline-bench --device cuda --epochs 2 \
  --quiet --json "$OUT/bench_cuda.json"
# The LibTorch adapter against this machine's CUDA LibTorch (torch's own CMake package), run on
# the GPU: its batches against the CPU path's, the current c10 stream, the current device, cuda:1.
TORCH_PREFIX=$($PY -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
step "configure with LibTorch" 120 cmake -S . -B build-gpu -DFEEDLINE_BUILD_TORCH=ON \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX"
step "build LibTorch check" 240 cmake --build build-gpu -j"$(nproc)" --target feedline_torch_cuda_check
step "LibTorch GPU check" 120 build-gpu/tests/gpu/feedline_torch_cuda_check --expect-gpu \
  --out "$OUT/torch_cuda_check.json"
echo "total $(( $(date +%s) - START )) s"
(( ${#failed[@]} == 0 )) || { echo "FAILED: ${failed[*]}"; exit 1; }
echo "all GPU steps passed"
