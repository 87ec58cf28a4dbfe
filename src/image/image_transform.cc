#include "image/image_transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "feedline/image.h"
#include "feedline/random.h"
#include "image/decoder.h"
#include "image/exif.h"
#include "image/geometry.h"

namespace feedline {
namespace {

Schema MakeSchema(const ImageTransformConfig& c) {
  const int64_t s = c.size;
  std::vector<Dim> shape =
      c.layout == Layout::kNCHW ? std::vector<Dim>{3, s, s} : std::vector<Dim>{s, s, 3};
  return Schema({Field("image", c.dtype, std::move(shape)), Field("label", DType::kInt64, {})});
}

// Train decodes at 4/8 (2/8) rather than 5/8, 6/8 or 7/8 (3/8) when that leaves at least this
// much of the output size, then enlarges by up to 1.25x: 22% less decode time for those crops
// (7.5% of the bundled set's draws: -285 us each, ~2.5% of train's CPU), and closer to
// torchvision, whose antialiased shrink keeps little more detail than the DCT's own reduction
// (mean |difference| on the whole-image boxes 0.57 -> 0.54 levels at 224).
constexpr double kTrainSimdScaleMinFraction = 0.8;

}  // namespace

ImageTransformConfig ImageTransformConfig::From(const LoaderOptions& o, bool for_device) {
  ImageTransformConfig c;
  c.kind = o.transform();
  c.size = o.size();
  c.resize_size = o.resize_size();
  c.scale = o.scale();
  c.ratio = o.ratio();
  c.flip = o.flip();
  // A GPU converts itself: uint8 NHWC crosses PCIe (4x fewer bytes than float32).
  c.layout = for_device ? Layout::kNHWC : o.layout();
  c.dtype = for_device ? DType::kUint8 : o.dtype();
  c.norm = Normalization::From(o.mean(), o.stddev());
  c.max_image_pixels = o.max_image_pixels();
  c.accept_corrupt = o.accept_corrupt();
  c.exif_transpose = o.exif_transpose();
  c.synthetic = o.synthetic();
  if (for_device) {
    c.device_conversion = DeviceConversion{
        ImageTransform::kImage, o.size(), o.dtype(), o.layout(), o.mean(), o.stddev()};
  }
  return c;
}

struct ImageTransform::State : SampleTransform::WorkerState {
  ImageDecoder decoder;
  ResampleScratch scratch;
  std::vector<uint8_t> u8;       // one uint8 sample, before conversion to a float dtype
  std::vector<uint8_t> upright;  // exif_transpose: the decoded image turned upright
};

ImageTransform::ImageTransform(ImageTransformConfig config)
    : config_(config),
      schema_(MakeSchema(config)),
      sample_bytes_(3 * int64_t{config.size} * config.size * ElementSize(config.dtype)) {}

std::unique_ptr<SampleTransform::WorkerState> ImageTransform::NewWorkerState() const {
  auto state = std::make_unique<State>();
  if (config_.kind == Transform::kTrain) {
    state->decoder.set_simd_scale_min_fraction(kTrainSimdScaleMinFraction);
    state->decoder.set_cheap_shrink_max(kBilinearResizeShrinkMax);  // ResampleInto's resampler
  }
  return state;
}

bool ImageTransform::SkipsRead(int64_t index) const {
  if (cache_ == nullptr) return false;
  const bool hit = cache_->Get(index) != nullptr;
  if (hit) {
    cache_->CountHit();
  } else {
    cache_->CountMiss();
  }
  return hit;
}

void ImageTransform::NoteSize(int64_t pixels, int64_t index) const {
  if (pixels <= config_.max_image_pixels / 2) return;
  large_images_.fetch_add(1, std::memory_order_relaxed);
  // The lowest index seen (the first in the data set's order), not the first decoded: which
  // worker finishes first is the scheduler's, and the warning names this one.
  int64_t seen = first_large_.load(std::memory_order_relaxed);
  while ((seen < 0 || index < seen) &&
         !first_large_.compare_exchange_weak(seen, index, std::memory_order_relaxed)) {
  }
}

absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> ImageTransform::DecodeForCache(
    const Record& record, int64_t index, State* state) const {
  const std::vector<uint8_t>& bytes = record.bytes;
  absl::StatusOr<ImageHeader> header = state->decoder.ReadHeader(bytes.data(), bytes.size());
  if (!header.ok()) return header.status();
  const int orientation =
      config_.exif_transpose ? ReadOrientation(header->format, bytes.data(), bytes.size()) : 1;
  const bool swap = SwapsAxes(orientation);
  const int W = swap ? header->height : header->width, H = swap ? header->width : header->height;
  if (int64_t{W} * H > config_.max_image_pixels) {
    return ImageTooLarge(W, H, config_.max_image_pixels);
  }
  NoteSize(int64_t{W} * H, index);
  const int shorter = std::min(W, H);
  const int target = std::min(shorter, kDecodedCacheScale * config_.size);
  const int want_w = int(std::ceil(double(target) * W / shorter));
  const int want_h = int(std::ceil(double(target) * H / shorter));
  absl::StatusOr<DecodedRegion> region = state->decoder.Decode(
      bytes.data(), bytes.size(), Rect{0, 0, double(header->width), double(header->height)},
      swap ? want_h : want_w, swap ? want_w : want_h, config_.max_image_pixels);
  if (!region.ok()) return region.status();
  if (orientation != 1) region = ApplyOrientation(*region, orientation, &state->upright);
  auto entry = std::make_shared<SampleCache::Entry>();
  entry->orig_width = W;
  entry->orig_height = H;
  entry->label = record.label;
  if (region->width > want_w || region->height > want_h) {
    ResizeWhole(*region, want_w, want_h, &entry->data);
    entry->width = want_w;
    entry->height = want_h;
  } else {
    entry->width = region->width;
    entry->height = region->height;
    entry->data.resize(size_t(region->width) * region->height * 3);
    for (int y = 0; y < region->height; ++y) {
      std::memcpy(entry->data.data() + size_t(y) * region->width * 3,
                  region->pixels + size_t(y) * region->stride, size_t(region->width) * 3);
    }
  }
  if (!cache_->full()) cache_->Put(index, entry);
  return std::shared_ptr<const SampleCache::Entry>(std::move(entry));
}

absl::Status ImageTransform::Apply(const Record& record, const SampleContext& ctx,
                                   WorkerState* worker_state, SampleWriter& out) const {
  uint8_t* dst = out.Fixed<uint8_t>(kImage);
  int64_t* label = out.Fixed<int64_t>(kLabel);
  *label = record.label;
  if (config_.synthetic) {  // benchmarks: a pre-decoded sample, no decode
    std::memset(dst, int(ctx.index() & 0xFF), size_t(sample_bytes_));
    return absl::OkStatus();
  }
  auto* state = static_cast<State*>(worker_state);
  if (state == nullptr) return absl::InternalError("image transform without worker state");
  state->decoder.set_accept_corrupt(config_.accept_corrupt);
  const std::vector<uint8_t>& bytes = record.bytes;
  const int64_t index = ctx.index();
  std::shared_ptr<const SampleCache::Entry> cached;
  if (cache_ != nullptr) {
    cached = cache_->Get(index);
    if (cached == nullptr) {
      absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> made =
          DecodeForCache(record, index, state);
      if (!made.ok()) return made.status();
      cached = *std::move(made);
    }
    *label = cached->label;
  }
  ImageHeader header_value;
  DecodedRegion cached_region;
  int orientation = 1;  // exif_transpose: the file's EXIF orientation (the cache keeps upright)
  if (cached != nullptr) {
    header_value = ImageHeader{ImageFormat::kJpeg, cached->orig_width, cached->orig_height};
    cached_region.pixels = cached->data.data();
    cached_region.width = cached->width;
    cached_region.height = cached->height;
    cached_region.stride = size_t(cached->width) * 3;
    cached_region.scale_x = double(cached->width) / cached->orig_width;
    cached_region.scale_y = double(cached->height) / cached->orig_height;
  } else {
    absl::StatusOr<ImageHeader> h = state->decoder.ReadHeader(bytes.data(), bytes.size());
    if (!h.ok()) return h.status();
    // Refuse absurd sizes before any geometry is computed from them (nor memory allocated).
    if (int64_t{h->width} * h->height > config_.max_image_pixels) {
      return ImageTooLarge(h->width, h->height, config_.max_image_pixels);
    }
    NoteSize(int64_t{h->width} * h->height, ctx.index());
    header_value = *h;
    if (config_.exif_transpose) {
      orientation = ReadOrientation(h->format, bytes.data(), bytes.size());
      if (SwapsAxes(orientation)) std::swap(header_value.width, header_value.height);
    }
  }
  const ImageHeader* header = &header_value;
  auto decode = [&](const Rect& rect, int min_w, int min_h) -> absl::StatusOr<DecodedRegion> {
    if (cached != nullptr) return cached_region;
    return state->decoder.Decode(bytes.data(), bytes.size(), rect, min_w, min_h,
                                 config_.max_image_pixels);
  };
  // An image with an EXIF orientation to apply is decoded whole, at least `scale` times its
  // size (1: full resolution, read to the end as the exact eval does), and turned upright.
  auto decode_upright = [&](double scale, bool exact) -> absl::StatusOr<DecodedRegion> {
    const bool swap = SwapsAxes(orientation);
    const int sw = swap ? header->height : header->width;
    const int sh = swap ? header->width : header->height;
    scale = std::min(scale, 1.0);
    const int min_w = std::min(sw, int(std::ceil(sw * scale)));
    const int min_h = std::min(sh, int(std::ceil(sh * scale)));
    absl::StatusOr<DecodedRegion> r =
        state->decoder.Decode(bytes.data(), bytes.size(), Rect{0, 0, double(sw), double(sh)}, min_w,
                              min_h, config_.max_image_pixels, !exact, exact);
    if (!r.ok()) return r.status();
    return ApplyOrientation(*r, orientation, &state->upright);
  };
  const bool oriented = orientation != 1;
  const int size = config_.size;
  const uint64_t seed = ctx.seed(), epoch = uint64_t(ctx.epoch()), idx = uint64_t(index);
  // Float dtypes on the CPU: resample into uint8 scratch, then normalise into the slot.
  uint8_t* image = dst;
  if (config_.dtype != DType::kUint8) {
    state->u8.resize(size_t(3) * size * size);
    image = state->u8.data();
  }
  if (config_.kind == Transform::kTrain) {
    SampleRng crop_rng(seed, epoch, idx, kRngCrop);
    const CropBox box =
        RandomResizedCropBox(header->width, header->height, config_.scale, config_.ratio, crop_rng);
    const bool flip = config_.flip && SampleRng(seed, epoch, idx, kRngFlip).Uniform() < 0.5;
    const Rect rect{double(box.left), double(box.top), double(box.width), double(box.height)};
    absl::StatusOr<DecodedRegion> region =
        oriented ? decode_upright(std::max(double(size) / box.width, double(size) / box.height),
                                  /*exact=*/false)
                 : decode(rect, size, size);
    if (!region.ok()) return region.status();
    ResampleInto(*region, rect, size, size, flip, config_.layout, image, &state->scratch);
  } else {
    const EvalGeometry g =
        ComputeEvalGeometry(header->width, header->height, config_.resize_size, size);
    const Rect whole{0, 0, double(header->width), double(header->height)};
    if (config_.kind == Transform::kEval && cached == nullptr) {
      // torchvision's pixels: a full-resolution decode (as PIL's) of the rows the window reads,
      // the rest of the file read for damage (as PIL would), then Pillow's filter for the
      // window only.
      const int rows = std::max(1, EvalRowsNeeded(g, header->height, size));
      absl::StatusOr<DecodedRegion> region =
          oriented
              ? decode_upright(1.0, /*exact=*/true)
              : state->decoder.Decode(bytes.data(), bytes.size(), Rect{0, 0, whole.w, double(rows)},
                                      header->width, rows, config_.max_image_pixels,
                                      /*allow_dct_scaling=*/false, /*read_to_end=*/true);
      if (!region.ok()) return region.status();
      if (region->width != header->width || region->height < rows) {
        return absl::DataLossError(absl::StrCat("image data of ", region->width, "x",
                                                region->height, " does not match its header (",
                                                header->width, "x", header->height, ")"));
      }
      PilResizeThenCropInto(*region, g, header->width, header->height, size, size, config_.layout,
                            image, &state->scratch);
    } else {
      // eval_fast (or the decoded cache): the smallest DCT scale that keeps the resized size
      // (at most the image's own), then an approximate filter.
      const int64_t min_w = std::min<int64_t>(g.resized_w, header->width);
      const int64_t min_h = std::min<int64_t>(g.resized_h, header->height);
      absl::StatusOr<DecodedRegion> region =
          oriented ? decode_upright(
                         std::max(double(min_w) / header->width, double(min_h) / header->height),
                         /*exact=*/false)
                   : decode(whole, int(min_w), int(min_h));
      if (!region.ok()) return region.status();
      ResizeThenCropInto(*region, g, header->width, header->height, size, size, config_.layout,
                         image, &state->scratch);
    }
  }
  if (image != dst) {
    ConvertSample(image, 3 * int64_t{size} * size, config_.layout, config_.dtype, config_.norm,
                  dst);
  }
  return absl::OkStatus();
}

namespace image {

absl::Status ValidateOptions(const LoaderOptions& o) {
  // Ranges from the options' declarations; then what one number cannot say.
  if (absl::Status s = feedline::ValidateOptions(o, OptionGroup::kImage); !s.ok()) return s;
  if (!(o.scale().first > 0 && o.scale().first <= o.scale().second && o.scale().second <= 1.0))
    return InvalidOption("scale", "must satisfy 0 < min <= max <= 1");
  if (!(o.ratio().first > 0 && o.ratio().first <= o.ratio().second))
    return InvalidOption("ratio", "must satisfy 0 < min <= max");
  for (int c = 0; c < 3; ++c) {
    if (!(o.stddev()[size_t(c)] > 0))
      return InvalidOption("std", "every channel's std must be > 0");
    if (!std::isfinite(o.mean()[size_t(c)])) return InvalidOption("mean", "must be finite");
  }
  const DType t = o.dtype();
  if (t != DType::kUint8 && t != DType::kFloat32 && t != DType::kFloat16 && t != DType::kBFloat16) {
    return InvalidOption("dtype", "images are uint8, float32, float16 or bfloat16");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SampleTransform>> MakeTransform(const LoaderOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::shared_ptr<SampleTransform>(
      std::make_shared<ImageTransform>(ImageTransformConfig::From(options, /*for_device=*/false)));
}

}  // namespace image
}  // namespace feedline
