#!/usr/bin/env bash
# The fuzz targets' names, one line, as tests/fuzz/CMakeLists.txt declares them
# (_feedline_fuzz_targets): the one list that run_fuzzers.sh and run_all.sh build from.
set -euo pipefail
sed -n '/^set(_feedline_fuzz_targets/,/)/p' "$(dirname "$0")/CMakeLists.txt" |
  sed -e 's/set(_feedline_fuzz_targets//' -e 's/)//' | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'
