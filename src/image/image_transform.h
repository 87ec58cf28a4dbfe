// The image classification built-in as a SampleTransform: decode only the pixels the crop
// needs (libjpeg-turbo ROI + DCT scaling; PNG by libspng), RandomResizedCrop + flip or
// Resize + CenterCrop with torchvision's semantics, straight into the sample's place in the
// batch slot, then the dtype/layout conversion on the CPU (or uint8 NHWC for a GPU to convert).
//
// Fields: "image" (uint8 or a float dtype; [3, S, S] NCHW or [S, S, 3] NHWC) and "label"
// (int64 []). With a decoded cache attached, images are kept at a bounded resolution (shorter
// side <= kDecodedCacheScale * size) and later epochs crop from them without reading or
// decoding.
//
// Thread safety: const after AttachCache (called once, before the loader runs); Apply from any
// number of workers, each with its own WorkerState.
#ifndef FEEDLINE_SRC_IMAGE_IMAGE_TRANSFORM_H_
#define FEEDLINE_SRC_IMAGE_IMAGE_TRANSFORM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/sample_cache.h"
#include "feedline/options.h"
#include "feedline/transform.h"
#include "image/convert.h"

namespace feedline {

struct ImageTransformConfig {
  Transform kind = Transform::kTrain;
  int size = 224;
  int resize_size = 256;
  std::pair<double, double> scale{0.08, 1.0};
  std::pair<double, double> ratio{3.0 / 4.0, 4.0 / 3.0};
  bool flip = true;
  Layout layout = Layout::kNCHW;  // what is written into the slot
  DType dtype = DType::kUint8;    // idem (normalised when a float type)
  Normalization norm{};
  int64_t max_image_pixels = 178956970;
  bool accept_corrupt = false;
  bool exif_transpose = false;  // turn images upright by their EXIF orientation first
  bool synthetic = false;       // benchmarks: fill each sample with a constant from its index
  // A GPU loader's: what the device makes of the uint8 NHWC image (the options' dtype, layout
  // and normalisation).
  std::optional<DeviceConversion> device_conversion;

  // The image built-in's options, for a host (CPU) slot or, when `for_device`, for a GPU that
  // converts uint8 NHWC itself.
  static ImageTransformConfig From(const LoaderOptions& o, bool for_device);
};

class ImageTransform final : public SampleTransform {
 public:
  static constexpr int kImage = 0;  // field indices
  static constexpr int kLabel = 1;

  explicit ImageTransform(ImageTransformConfig config);
  const Schema& schema() const override { return schema_; }
  std::unique_ptr<WorkerState> NewWorkerState() const override;
  absl::Status Apply(const Record& record, const SampleContext& context, WorkerState* state,
                     SampleWriter& out) const override;
  bool SkipsRead(int64_t index) const override;
  bool ReadsOptions(OptionGroup group) const override { return group == OptionGroup::kImage; }
  // "large_images": images decoded with more than half of max_image_pixels (PIL's
  // DecompressionBombWarning band below its error), and the data set index of the first.
  std::vector<std::pair<std::string, int64_t>> Counters() const override {
    return {{"large_images", large_images_.load(std::memory_order_relaxed)},
            {"first_large_image", first_large_.load(std::memory_order_relaxed)}};
  }
  std::vector<DeviceConversion> DeviceConversions() const override {
    if (!config_.device_conversion) return {};
    return {*config_.device_conversion};
  }

  // The decoded cache (options.cache() == kDecoded); before the loader runs.
  void AttachCache(std::shared_ptr<SampleCache> cache) { cache_ = std::move(cache); }
  const ImageTransformConfig& config() const { return config_; }

 private:
  struct State;
  absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> DecodeForCache(const Record& record,
                                                                           int64_t index,
                                                                           State* state) const;
  const ImageTransformConfig config_;
  const Schema schema_;
  const int64_t sample_bytes_;
  std::shared_ptr<SampleCache> cache_;
  // Counts an image of `pixels` in the warning band (more than half of max_image_pixels).
  void NoteSize(int64_t pixels, int64_t index) const;
  mutable std::atomic<int64_t> large_images_{0};
  mutable std::atomic<int64_t> first_large_{-1};
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_IMAGE_TRANSFORM_H_
