// libFuzzer target: the image decode path exactly as a decoder worker runs it
// (ImageTransform::Apply): ReadHeader (every format), the EXIF orientation, the transform's
// geometry from the header, the region decode (ROI + DCT scaling; or the exact eval's
// full-resolution rows read to the end) under a small pixel limit, with or without
// accept_corrupt, then resampling (or Pillow's filter) into a small output.
// The options (transform, output size, flip, layout, sample index) come from a hash of the
// input, so every seed image stays a valid image.
//
// Checked beyond "no crash, no sanitizer report": a header that reads fine gives the same
// dimensions to Decode's limit check; a decoded region is non-empty, covers the requested
// rectangle, and its buffer is fully readable; resampling writes exactly its output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "feedline/random.h"
#include "fuzz_util.h"
#include "image/decoder.h"
#include "image/exif.h"
#include "image/geometry.h"

namespace {

using feedline::fuzz::InputHash;

// Small limits keep each run fast and well under libFuzzer's RSS limit; the code paths are the
// same as with the default (LoaderOptions::max_image_pixels).
constexpr int64_t kMaxPixels = int64_t{1} << 22;  // 4 Mpixel
constexpr uint8_t kCanary = 0xA5;
constexpr size_t kCanaryBytes = 64;

// Reads every byte of the region so that AddressSanitizer sees any part of it that is not
// owned memory, and checks its geometry against the request.
void CheckRegion(const feedline::DecodedRegion& r, const feedline::Rect& rect, int64_t W,
                 int64_t H) {
  const std::string where =
      absl::StrCat("region ", r.width, "x", r.height, " origin ", r.origin_x, ",", r.origin_y,
                   " scale ", r.scale_x, ",", r.scale_y, " for rect ", rect.x, ",", rect.y, " ",
                   rect.w, "x", rect.h, " of ", W, "x", H);
  FUZZ_CHECK(r.pixels != nullptr && r.width >= 1 && r.height >= 1, where);
  FUZZ_CHECK(r.stride >= size_t(r.width) * 3, where);
  FUZZ_CHECK(r.scale_x > 0 && r.scale_x <= 1 && r.scale_y > 0 && r.scale_y <= 1, where);
  volatile uint8_t sink = 0;
  uint8_t acc = 0;
  for (int y = 0; y < r.height; ++y) {
    const uint8_t* row = r.pixels + size_t(y) * r.stride;
    for (size_t x = 0; x < size_t(r.width) * 3; ++x) acc ^= row[x];
  }
  sink = acc;
  (void)sink;
  // "Covering at least the requested region" (clamped to the image), to a pixel of rounding.
  const double rx = std::clamp(rect.x, 0.0, double(W)), ry = std::clamp(rect.y, 0.0, double(H));
  const double rx1 = std::min(rect.x + rect.w, double(W)),
               ry1 = std::min(rect.y + rect.h, double(H));
  if (rx1 > rx && ry1 > ry) {
    FUZZ_CHECK(r.origin_x <= rx * r.scale_x + 1e-6, where);
    FUZZ_CHECK(r.origin_y <= ry * r.scale_y + 1e-6, where);
    FUZZ_CHECK(r.origin_x + r.width >= rx1 * r.scale_x - 1.0, where);
    FUZZ_CHECK(r.origin_y + r.height >= ry1 * r.scale_y - 1.0, where);
  }
}

// Output buffer with a guard zone after it: OpenCV is not instrumented, so an overrun by the
// resampler would not be seen by AddressSanitizer.
struct GuardedOutput {
  explicit GuardedOutput(size_t n) : bytes(n + kCanaryBytes, kCanary), size(n) {}
  uint8_t* data() { return bytes.data(); }
  void Check() const {
    for (size_t i = size; i < bytes.size(); ++i) FUZZ_CHECK(bytes[i] == kCanary, "output overrun");
  }
  std::vector<uint8_t> bytes;
  size_t size;
};

void DecodeOnce(feedline::ImageDecoder& decoder, const uint8_t* data, size_t size, InputHash& p) {
  absl::StatusOr<feedline::ImageHeader> header = decoder.ReadHeader(data, size);
  if (!header.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(header.status()) || absl::IsInvalidArgument(header.status()),
               header.status().ToString());
    return;
  }
  FUZZ_CHECK(header->width >= 1 && header->height >= 1, "header dimensions");
  const int W = header->width, H = header->height;
  // As the loader does: sizes above the pixel limit are refused before any geometry.
  if (int64_t{W} * H > kMaxPixels) return;

  // EXIF orientation: read from every input (it must never read out of bounds); applied to
  // whole decodes below.
  const int orientation = feedline::ReadOrientation(header->format, data, size);
  FUZZ_CHECK(orientation >= 1 && orientation <= 8, "orientation");

  // Options as LoaderOptions validates them, small.
  decoder.set_accept_corrupt(p.Bit());
  const bool train = p.Bit();
  const int out = p.Range(1, 64);
  const int resize_size = p.Range(1, 96);
  const bool flip = p.Bit();
  const feedline::Layout layout = p.Bit() ? feedline::Layout::kNHWC : feedline::Layout::kNCHW;
  const uint64_t seed = p.Next() % 4, index = p.Next() % 1024;

  GuardedOutput dst(size_t(out) * out * 3);
  feedline::ResampleScratch scratch;
  if (train) {
    feedline::SampleRng crop_rng(seed, 0, index, feedline::kRngCrop);
    const feedline::CropBox box =
        feedline::RandomResizedCropBox(W, H, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, crop_rng);
    const feedline::Rect rect{double(box.left), double(box.top), double(box.width),
                              double(box.height)};
    absl::StatusOr<feedline::DecodedRegion> region =
        decoder.Decode(data, size, rect, out, out, kMaxPixels);
    if (!region.ok()) {
      FUZZ_CHECK(!absl::IsResourceExhausted(region.status()) || int64_t{W} * H > kMaxPixels,
                 region.status().ToString());
      return;
    }
    FUZZ_CHECK(int64_t{W} * H <= kMaxPixels, "decoded an image above the pixel limit");
    CheckRegion(*region, rect, W, H);
    feedline::ResampleInto(*region, rect, out, out, flip, layout, dst.data(), &scratch);
  } else if (p.Bit()) {
    // The exact eval: full-resolution rows, read to the end, turned upright, Pillow's filter.
    const bool swap = feedline::SwapsAxes(orientation);
    const int UW = swap ? H : W, UH = swap ? W : H;
    const feedline::EvalGeometry g = feedline::ComputeEvalGeometry(UW, UH, resize_size, out);
    const int rows = orientation != 1 ? H : std::max(1, feedline::EvalRowsNeeded(g, H, out));
    const feedline::Rect top{0, 0, double(W), double(rows)};
    absl::StatusOr<feedline::DecodedRegion> region =
        decoder.Decode(data, size, top, W, rows, kMaxPixels, /*allow_dct_scaling=*/false,
                       /*read_to_end=*/true);
    if (!region.ok()) return;
    FUZZ_CHECK(region->width == W && region->height >= rows, "exact eval: rows missing");
    CheckRegion(*region, top, W, H);
    std::vector<uint8_t> upright;
    feedline::DecodedRegion u = *region;
    if (orientation != 1) {
      FUZZ_CHECK(region->height == H, "a whole decode for an orientation");
      u = feedline::ApplyOrientation(*region, orientation, &upright);
      FUZZ_CHECK(u.width == UW && u.height == UH, "upright size");
    }
    feedline::PilResizeThenCropInto(u, g, UW, UH, out, out, layout, dst.data(), &scratch);
  } else {
    const feedline::EvalGeometry g = feedline::ComputeEvalGeometry(W, H, resize_size, out);
    const feedline::Rect whole{0, 0, double(W), double(H)};
    absl::StatusOr<feedline::DecodedRegion> region =
        decoder.Decode(data, size, whole, int(std::min<int64_t>(g.resized_w, W)),
                       int(std::min<int64_t>(g.resized_h, H)), kMaxPixels);
    if (!region.ok()) {
      FUZZ_CHECK(!absl::IsResourceExhausted(region.status()) || int64_t{W} * H > kMaxPixels,
                 region.status().ToString());
      return;
    }
    FUZZ_CHECK(int64_t{W} * H <= kMaxPixels, "decoded an image above the pixel limit");
    CheckRegion(*region, whole, W, H);
    feedline::ResizeThenCropInto(*region, g, W, H, out, out, layout, dst.data(), &scratch);
  }
  dst.Check();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  InputHash p(data, size);
  // A fresh decoder per input keeps every crash reproducible from its input alone. A worker
  // reuses its decoder across files, bad ones included: half of the inputs are first fed
  // truncated (an error part-way through the scan), then whole, to the same decoder.
  feedline::ImageDecoder decoder;
  if (p.Bit() && size > 1) {
    InputHash q = p;
    DecodeOnce(decoder, data, size_t(p.Next() % size), q);
  }
  DecodeOnce(decoder, data, size, p);
  return 0;
}
