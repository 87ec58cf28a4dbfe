#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (library and targets under AddressSanitizer +
# UndefinedBehaviorSanitizer) in build-fuzz/, makes the seed corpora, replays the saved
# regressions, then fuzzes each target for a bounded time. Fails if any target crashes; the
# crashing input is left in build-fuzz/fuzz/artifacts/<target>/.
#
# Usage: bash tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET]   (default 60, or $FEEDLINE_FUZZ_SECONDS)
#        FEEDLINE_FUZZ_TARGETS="decode tar" to run some targets only.
# A crash: reproduce with build-fuzz/tests/fuzz/feedline_fuzz_<target> FILE, minimise with
# -minimize_crash=1 -exact_artifact_path=tests/fuzz/regressions/<target>/<name> FILE, and keep it
# there: every ctest build then replays it (fuzz.regressions.<target>).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-${FEEDLINE_FUZZ_SECONDS:-60}}
TARGETS=${FEEDLINE_FUZZ_TARGETS:-$(bash tests/fuzz/targets.sh)}  # every target CMake declares
JOBS=${JOBS:-$(nproc)}
B=build-fuzz
W=$B/fuzz   # seeds, working corpora, artifacts, logs

echo "== build (clang, libFuzzer + ASan + UBSan)"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DFEEDLINE_SANITIZE="fuzzer-no-link;address;undefined" -DFEEDLINE_FUZZ=ON \
  -DCMAKE_C_FLAGS="-fno-sanitize-recover=undefined" \
  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=undefined" \
  -DFEEDLINE_BUILD_PYTHON=OFF -DFEEDLINE_BUILD_BENCHMARKS=OFF -DFEEDLINE_BUILD_TORCH=OFF >/dev/null
targets=(feedline_fuzz_seeds)
for t in $TARGETS; do targets+=("feedline_fuzz_$t"); done
cmake --build "$B" -j"$JOBS" --target "${targets[@]}"

echo "== seed corpora"
rm -rf "$W/seeds"
mkdir -p "$W/seeds/decode" "$W/seeds/tar" "$W/seeds/list_file"
for t in $(bash tests/fuzz/targets.sh); do  # seeds: their regressions (decode, tar, list_file: made below too)
  mkdir -p "$W/seeds/$t"
  if compgen -G "tests/fuzz/regressions/$t/*" >/dev/null; then
    cp tests/fuzz/regressions/$t/* "$W/seeds/$t/"
  fi
done
"$B/tests/fuzz/feedline_fuzz_seeds" "$W/seeds/decode"
/usr/bin/python3 tests/fuzz/make_seeds.py "$W/seeds/decode" "$W/seeds/tar" "$W/seeds/list_file"
# The real-world files (read in place, copied only into this build folder): those under the
# fuzzers' input size.
REALWORLD=${FEEDLINE_REALWORLD:-/work/shared/testdata/realworld}
if [[ -d $REALWORLD ]]; then
  find "$REALWORLD" -mindepth 2 -type f -size -64k ! -name '*.md' ! -name '*.tsv' \
    -exec sh -c 'for f; do cp "$f" "$0/rw_$(basename "$f")"; done' "$W/seeds/decode" {} +
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in $TARGETS; do
  bin=$B/tests/fuzz/feedline_fuzz_$t
  dict=()
  [[ -f tests/fuzz/$t.dict ]] && dict=(-dict="tests/fuzz/$t.dict")
  regressions=(tests/fuzz/regressions/"$t"/*)
  if [[ -e ${regressions[0]} ]]; then
    echo "== $t: replaying ${#regressions[@]} regression input(s)"
    if ! "$bin" -rss_limit_mb=2048 -malloc_limit_mb=512 "${regressions[@]}" >"$W/$t.regressions.log" 2>&1; then
      tail -n 60 "$W/$t.regressions.log"
      failed+=("$t (regression)")
      continue
    fi
  fi
  echo "== $t: fuzzing for ${SECS}s"
  mkdir -p "$W/corpus/$t" "$W/artifacts/$t"
  start=$(date +%s)
  rc=0
  # The working corpus (first folder) keeps what coverage found, between local runs too; the
  # seeds are regenerated each time.
  "$bin" "$W/corpus/$t" "$W/seeds/$t" "${dict[@]}" \
    -max_total_time="$SECS" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=30 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$W/artifacts/$t/" >"$W/$t.log" 2>&1 || rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$W/$t.log" | grep -o '[0-9]*$' || true)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$W/$t.log" | grep -o '[0-9]*$' || true)
  cov=$(grep -E '^#[0-9]+' "$W/$t.log" | tail -n 1 | grep -o 'cov: [0-9]* ft: [0-9]*' || true)
  echo "   $t: ${runs:-?} executions in $(( $(date +%s) - start ))s (${speed:-?}/s), ${cov:-}," \
    "corpus $(ls "$W/corpus/$t" | wc -l) inputs, exit $rc"
  if (( rc != 0 )); then
    grep -E -A 40 'ERROR: |fuzz check failed|runtime error|SUMMARY' "$W/$t.log" | head -n 80 || true
    ls -l "$W/artifacts/$t/" || true
    failed+=("$t")
  fi
done
if (( ${#failed[@]} > 0 )); then
  echo "fuzzing FAILED: ${failed[*]} (logs in $W/)"
  exit 1
fi
echo "fuzzing: no crash"
