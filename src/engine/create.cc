// The generic factory (include/feedline/loader.h): any data set and transform; it reads the
// engine's options only (the image options are image::MakeTransform's). It lives in the engine's
// library, so that a program with its own Dataset and SampleTransform links feedline::engine
// alone (no codec, tokenizer or HTTP client).
#include <memory>
#include <utility>

#include "engine/device_stage.h"
#include "engine/engine_parts.h"
#include "feedline/loader.h"
#include "feedline/options.h"

namespace feedline {

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(
    std::shared_ptr<const Dataset> dataset, std::shared_ptr<const SampleTransform> transform,
    LoaderOptions options) {
  if (options.cache() == Cache::kDecoded) {
    return InvalidOption("cache", "\"decoded\" is the image built-in's; use \"bytes\"");
  }
  if (dataset == nullptr) return InvalidOption("dataset", "must not be null");
  if (transform == nullptr) return InvalidOption("transform", "must not be null");
  internal::EngineParts parts;
  absl::StatusOr<internal::DeviceChoice> device = internal::ChooseDevice(options.device(), {});
  if (!device.ok()) return device.status();
  parts.device = *std::move(device);
  parts.dataset = std::move(dataset);
  parts.transform = std::move(transform);
  parts.read_bytes_hint = int64_t{64} << 10;
  return internal::BuildLoader(std::move(parts), std::move(options));
}

}  // namespace feedline
