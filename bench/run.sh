#!/usr/bin/env bash
# Builds feedline (Release) and runs feedline-bench; arguments are passed to the benchmark.
# With no --data it makes (once) and uses the bundled ImageNet-like data set.
# Usage: bash bench/run.sh [--compare-torch] [--epochs N] [--json FILE] ...
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on relative paths, so clones in other folders (CI) reuse earlier builds.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
bash cmake/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target feedline-bench
exec build/bench/feedline-bench "$@"
