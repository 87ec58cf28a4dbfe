#!/usr/bin/env bash
# Builds feedline and runs every test: the Catch2 unit tests and the pytest suite (ctest), then
# the unit tests again under ThreadSanitizer. Installs what is missing first (Debian 12).
# Usage: bash tests/run_all.sh        (from anywhere; build trees go to build/ and build-tsan/)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

bash cmake/install-deps.sh

echo "== build (Release)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
echo "== tests (Release)"
ctest --test-dir build --output-on-failure

echo "== build (ThreadSanitizer)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFEEDLINE_SANITIZE=thread \
  -DFEEDLINE_BUILD_PYTHON=OFF -DFEEDLINE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-tsan -j"$JOBS" --target feedline_tests
echo "== tests (ThreadSanitizer)"
ctest --test-dir build-tsan --output-on-failure
