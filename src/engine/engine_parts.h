// What a factory hands the engine to build a loader: the data set and transform, and the pieces
// only the factory knows (the device with its per-field conversions, who uses the cache). The
// generic factory (engine/create.cc) fills them for any data set; the image built-in's
// (src/loaders/) adds the decoded cache. The engine
// itself includes nothing of image/, io/, text/ or cuda/.
#ifndef FEEDLINE_SRC_ENGINE_ENGINE_PARTS_H_
#define FEEDLINE_SRC_ENGINE_ENGINE_PARTS_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "core/host_allocator.h"
#include "core/sample_cache.h"
#include "engine/batch_slot.h"
#include "engine/device_stage.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/transform.h"

namespace feedline::internal {

struct EngineParts {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const SampleTransform> transform;
  // options.device() resolved (ChooseDevice, feedline/device.h): for a GPU, the copy stage
  // (made for the slot layout and the transform's DeviceConversions) and pinned memory.
  DeviceChoice device;
  // With options.cache() != kNone the engine sizes a cache from the budget. When
  // `cache_holds_bytes`, the read stage stores records there; otherwise it is handed to
  // `attach_cache` (the transform's own cache, such as decoded images) and only counted.
  bool cache_holds_bytes = true;
  std::function<void(std::shared_ptr<SampleCache>)> attach_cache;
  // Bytes one read typically holds: the budget's reservation per read in flight.
  int64_t read_bytes_hint = int64_t{1} << 20;
};

// Validates the engine's options, resolves "auto", sizes slots from the transform's schema
// within the memory budget, and makes the loader.
absl::StatusOr<std::unique_ptr<Loader>> BuildLoader(EngineParts parts, LoaderOptions options);

}  // namespace feedline::internal

#endif  // FEEDLINE_SRC_ENGINE_ENGINE_PARTS_H_
