#!/usr/bin/env bash
# Builds feedline and runs every test: the Catch2 unit tests and the pytest suite (ctest), the
# unit tests again under ThreadSanitizer and under AddressSanitizer + UndefinedBehaviorSanitizer,
# then each libFuzzer target for a bounded time (tests/fuzz/run_fuzzers.sh, clang).
# Installs what is missing first (Debian 12).
# Usage: bash tests/run_all.sh        (from anywhere; build trees go to build/, build-tsan/,
#                                      build-asan/ and build-fuzz/)
#        FEEDLINE_FUZZ_SECONDS=N      seconds per fuzz target (default 60; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on relative paths, so clones in other folders (CI) reuse earlier builds.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
JOBS=$(nproc)

bash cmake/install-deps.sh

echo "== build (Release)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
echo "== tests (Release)"
ctest --test-dir build --output-on-failure

# The copy stage's tests on the CUDA runtime stub exist when CMake found the CUDA toolkit.
stub_tests() { grep -q '^build feedline_cuda_stub_tests\b\|tests/feedline_cuda_stub_tests:' \
  "$1/build.ninja" 2>/dev/null && echo feedline_cuda_stub_tests || true; }

echo "== build (ThreadSanitizer)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFEEDLINE_SANITIZE=thread \
  -DFEEDLINE_BUILD_PYTHON=OFF -DFEEDLINE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-tsan -j"$JOBS" --target feedline_tests $(stub_tests build-tsan)
echo "== tests (ThreadSanitizer)"
ctest --test-dir build-tsan --output-on-failure

echo "== build (AddressSanitizer + UndefinedBehaviorSanitizer)"
# -fno-sanitize-recover: a UBSan finding aborts the test (UBSAN_OPTIONS=halt_on_error=1, set by
# tests/CMakeLists.txt, does the same under ctest; this also covers running the binary by hand).
# float-cast-overflow (double -> int out of range) is not in gcc's "undefined" group; clang's
# has it (the fuzz build).
ASAN_FLAGS="-fsanitize=float-cast-overflow -fno-sanitize-recover=all"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFEEDLINE_SANITIZE="address;undefined" \
  -DCMAKE_C_FLAGS="$ASAN_FLAGS" -DCMAKE_CXX_FLAGS="$ASAN_FLAGS" \
  -DFEEDLINE_BUILD_PYTHON=OFF -DFEEDLINE_BUILD_BENCHMARKS=OFF >/dev/null
# Every fuzz target, for ctest's replay of its regressions (the list: tests/fuzz/CMakeLists.txt).
fuzz_targets=$(for t in $(bash tests/fuzz/targets.sh); do printf 'feedline_fuzz_%s ' "$t"; done)
# shellcheck disable=SC2086
cmake --build build-asan -j"$JOBS" --target feedline_tests $(stub_tests build-asan) $fuzz_targets
echo "== tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
# LeakSanitizer's own tracer can crash at exit after every assertion passed ("Tracer caught
# signal 11", "LeakSanitizer has encountered a fatal error"): a failure of the tool, not a
# finding. Only then are the failed tests run once more; a leak, an ASan or UBSan report or a
# failed assertion fails the run at once.
if ! ctest --test-dir build-asan --output-on-failure 2>&1 | tee build-asan/ctest.log; then
  failed=$(grep -cE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*|Subprocess aborted|\*\*\*Timeout" \
    build-asan/ctest.log || true)
  tracer=$(grep -c "LeakSanitizer has encountered a fatal error" build-asan/ctest.log || true)
  if [[ $failed == "$tracer" ]] &&
     ! grep -qE "ERROR: (Leak|Address)Sanitizer:|runtime error:|:[0-9]+: FAILED:|test cases:.*failed" \
       build-asan/ctest.log; then
    echo "== LeakSanitizer's tracer failed (not a finding): the failed tests once more"
    ctest --test-dir build-asan --output-on-failure --rerun-failed
  else
    exit 1
  fi
fi

if [[ ${FEEDLINE_FUZZ_SECONDS:-60} != 0 ]]; then
  echo "== fuzzing (libFuzzer, ${FEEDLINE_FUZZ_SECONDS:-60}s per target)"
  JOBS=$JOBS bash tests/fuzz/run_fuzzers.sh "${FEEDLINE_FUZZ_SECONDS:-60}"
fi
