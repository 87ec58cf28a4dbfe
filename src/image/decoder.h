// Image decoding for the decoder workers: JPEG (libjpeg-turbo), PNG (libspng), and WebP, GIF,
// TIFF, BMP and PPM (formats.h), detected by content, not by file name.
//
// JPEGs are decoded only as far as the caller needs: the region of interest
// (`jpeg_crop_scanline` for columns, `jpeg_skip_scanlines` for rows above it, stopping after
// its last row) at the smallest DCT scale (n/8) that still leaves at least the requested pixels
// for that region, with exceptions for the scales libjpeg-turbo has no SIMD IDCTs for (below).
// Output is always RGB (grayscale and CMYK/YCCK converted).
//
// Thread safety: an `ImageDecoder` is used by one thread at a time (each decoder worker owns
// one); it keeps its buffers between calls so that the hot path does not allocate.
#ifndef FEEDLINE_SRC_IMAGE_DECODER_H_
#define FEEDLINE_SRC_IMAGE_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "image/bilinear.h"  // kBilinearShrinkMax
#include "image/formats.h"

namespace feedline {

struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;
  int height = 0;
};

// A rectangle in the original image's pixel coordinates (fractional edges allowed).
struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

// Decoded RGB pixels (HWC, `stride` bytes per row) covering at least the requested region.
// Original coordinate x maps to decoded column `x * scale_x - origin_x` (likewise for y).
struct DecodedRegion {
  const uint8_t* pixels = nullptr;  // owned by the decoder, valid until its next call
  int width = 0;
  int height = 0;
  size_t stride = 0;
  double scale_x = 1, scale_y = 1;
  double origin_x = 0, origin_y = 0;
};

// Which reduced DCT scales a JPEG decode may use. libjpeg-turbo has SIMD IDCTs for 1/2, 1/4
// and 1/8 only; the other eighths (3/8 ... 7/8) use C IDCTs but leave fewer pixels to colour-
// convert and resample.
enum class DctScaling { kNone, kPowersOfTwo, kEighths };

class ImageDecoder {
 public:
  ImageDecoder();
  void set_dct_scaling(DctScaling s) { dct_scaling_ = s; }
  // With kEighths: a decode at 4/8 or 2/8 (SIMD IDCTs) may leave the region down to `fraction`
  // of min_w x min_h rather than take 3/8, 5/8, 6/8 or 7/8 (C IDCTs, chroma scaled up in the
  // IDCT: a 358-448 pixel crop of the bundled photos decoded at 5/8 in 1.30 ms, at 4/8 in
  // 1.02 ms); the resampler then enlarges by up to 1 / fraction. 1 (the default): never below
  // the request.
  void set_simd_scale_min_fraction(double fraction) { simd_scale_min_fraction_ = fraction; }
  // The largest shrink the caller's resampler does cheaply (default kBilinearShrinkMax): a
  // region that would decode at 6/8 or 7/8 decodes at 8/8 when it shrinks no more than this
  // from there (train's resampler takes 3.5x: its 2:1 box pass first).
  void set_cheap_shrink_max(double shrink) { cheap_shrink_max_ = shrink; }
  // Decode despite corrupt data (libjpeg's corrupt-data warnings, PNG CRC errors) and JPEGs that
  // end early (the rest grey, as PIL's LOAD_TRUNCATED_IMAGES) instead of failing: off by
  // default.
  void set_accept_corrupt(bool accept) { accept_corrupt_ = accept; }
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Format and dimensions, read from the header only. kInvalidArgument for data in none of the
  // formats above; kDataLoss for a damaged header.
  absl::StatusOr<ImageHeader> ReadHeader(const uint8_t* data, size_t size);

  // Decodes `roi` (clamped to the image) so that it spans at least `min_w` x `min_h` decoded
  // pixels where the full resolution allows. Images above `max_pixels` are refused
  // (kResourceExhausted) before any pixel memory is allocated. `allow_dct_scaling` = false
  // decodes at full resolution (the reference path in tests and the benchmark).
  absl::StatusOr<DecodedRegion> Decode(
      const uint8_t* data, size_t size, const Rect& roi, int min_w, int min_h, int64_t max_pixels,
      // `read_to_end` also reads the entropy-coded data past the region to the end-of-image marker
      // (without reconstructing pixels), so that damage anywhere in the file is reported as it
      // would be by a full decode (PIL's); otherwise decoding stops after the region's last row.
      bool allow_dct_scaling = true, bool read_to_end = false);

 private:
  struct Jpeg;
  absl::StatusOr<DecodedRegion> DecodePng(const uint8_t* data, size_t size, int64_t max_pixels);
  absl::StatusOr<DecodedRegion> DecodeWhole(ImageFormat format, const uint8_t* data, size_t size,
                                            int64_t max_pixels);
  std::unique_ptr<Jpeg> jpeg_;
  // Eighths (with 8/8 for 6/8 and 7/8, see Decode): powers of two only took 1.05-1.10 ms
  // CPU/image against 1.02-1.04 (feedline-bench, 3 runs each): larger regions for the resize.
  DctScaling dct_scaling_ = DctScaling::kEighths;
  double simd_scale_min_fraction_ = 1.0;
  double cheap_shrink_max_ = kBilinearShrinkMax;
  bool accept_corrupt_ = false;
  std::vector<uint8_t> pixels_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_DECODER_H_
