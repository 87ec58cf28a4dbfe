// The generic factory (include/feedline/loader.h): any data set and transform. It reads the
// engine's options only, and refuses an image option set on it unless the transform was made
// from them (SampleTransform::ReadsOptions: image::MakeTransform's). It lives in the engine's
// library, so that a program with its own Dataset and SampleTransform links feedline::engine
// alone (no codec, tokenizer or HTTP client).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_parts.h"
#include "feedline/device.h"
#include "feedline/loader.h"
#include "feedline/options.h"

namespace feedline {

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(
    std::shared_ptr<const Dataset> dataset, std::shared_ptr<const SampleTransform> transform,
    LoaderOptions options) {
  // An image option would be silently ignored, unless the transform was made from them.
  if (std::vector<std::string> image = ChangedOptions(options, OptionGroup::kImage);
      !image.empty() && transform != nullptr && !transform->ReadsOptions(OptionGroup::kImage)) {
    return InvalidOption(image.front(),
                         "an image option, which this loader's transform does not read (the image "
                         "built-in's Loader::Create(options) and image::MakeTransform do)");
  }
  if (options.cache() == Cache::kDecoded) {
    return InvalidOption("cache", "\"decoded\" is the image built-in's; use \"bytes\"");
  }
  if (dataset == nullptr) return InvalidOption("dataset", "must not be null");
  if (transform == nullptr) return InvalidOption("transform", "must not be null");
  internal::EngineParts parts;
  absl::StatusOr<DeviceChoice> device = ChooseDevice(options.device());
  if (!device.ok()) return device.status();
  parts.device = *std::move(device);
  parts.dataset = std::move(dataset);
  parts.transform = std::move(transform);
  parts.read_bytes_hint = int64_t{64} << 10;
  return internal::BuildLoader(std::move(parts), std::move(options));
}

}  // namespace feedline
