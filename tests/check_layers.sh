#!/usr/bin/env bash
# The dependency rule of ../shared/DESIGN.md, checked on the sources: the engine and the core
# include nothing from the workloads (image/, io/, text/, video/), the device (cuda/) or the adapters
# (torch/, python/); core/ does not include engine/ either; the copy stage (cuda/) includes no
# engine internals and no workload (the public device seam only); the public headers include only
# public headers (and Abseil / the standard library). Prints each offending line; exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
check() {  # check <folder> <regex of forbidden include prefixes> <why>
  local hits
  hits=$(grep -rnP "#include \"($2)" "$1" || true)
  if [[ -n $hits ]]; then
    echo "layer rule broken: $3" >&2
    echo "$hits" >&2
    status=1
  fi
}
check src/engine 'image/|io/|text/|video/|cuda/|torch/|loaders/' "src/engine must not include workloads or devices"
check src/core 'engine/|image/|io/|text/|video/|cuda/|torch/|loaders/|tune/' "src/core is generic utilities"
check src/tune 'engine/|image/|io/|text/|cuda/|torch/|loaders/' "src/tune is a pure model"
check src/image 'engine/|io/|cuda/|torch/|loaders/' "src/image depends on the public API and core only"
check src/io 'engine/|image/|cuda/|torch/|loaders/' "src/io depends on the public API and core only"
check src/text 'engine/|image/|io/|video/|cuda/|torch/|loaders/' "src/text depends on the public API and core only"
check src/video 'engine/|image/|io/|text/|cuda/|torch/|loaders/' "src/video depends on the public API and core only"
# The copy stage implements the public device seam (feedline/device.h): nothing of the engine's
# internals, no workload (a field's conversion is declared by its transform, through the seam).
check src/cuda 'engine/|image/|io/|text/|video/|tune/|torch/|loaders/' \
  "src/cuda reaches batches and conversions only through feedline/device.h"
check include/feedline 'core/|engine/|image/|io/|cuda/|tune/|loaders/' "public headers include public headers only"
if ((status == 0)); then echo "layers: ok"; fi
exit $status
