// Decoders for the image formats beside JPEG and PNG that torchvision's ImageFolder accepts:
// WebP (libwebp), GIF (giflib, first frame), TIFF (libtiff, first page), BMP and PPM/PGM/PBM
// (parsed here: both are uncompressed or run-length coded rows). Each gives what PIL's
// `Image.open(f).convert("RGB")` gives: alpha dropped (not composited), palettes looked up,
// transparency ignored, other bit depths scaled to 8 bits as PIL scales them.
//
// The format is told by the content (magic bytes), never by the file name. Headers are read
// first and the size checked against `max_pixels` before any pixel memory is allocated.
//
// Thread safety: pure functions of their arguments (libtiff's messages go to a per-call
// handler, never to the process-wide one); call them from any thread.
#ifndef FEEDLINE_SRC_IMAGE_FORMATS_H_
#define FEEDLINE_SRC_IMAGE_FORMATS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace feedline {

enum class ImageFormat { kJpeg, kPng, kWebp, kGif, kTiff, kBmp, kPnm };

// The format's name in messages ("JPEG", "PNG", "WebP", ...).
const char* FormatName(ImageFormat format);

// kResourceExhausted for a w x h image above `max_pixels` (max_image_pixels), before decoding.
absl::Status ImageTooLarge(int64_t w, int64_t h, int64_t max_pixels);

// The format of `data` by its magic bytes; false when it is none of the above.
bool SniffFormat(const uint8_t* data, size_t size, ImageFormat* format);

struct ImageSize {
  int width = 0;
  int height = 0;
};

// Dimensions of a WebP, GIF, TIFF, BMP or PNM image from its header. kDataLoss for a damaged
// or truncated header, kInvalidArgument for a variant this decoder does not read.
absl::StatusOr<ImageSize> ReadOtherHeader(ImageFormat format, const uint8_t* data, size_t size);

// Decodes the image to packed RGB (width * 3 bytes a row) in `rgb`. Refuses images above
// `max_pixels` (kResourceExhausted) before allocating their pixels; kDataLoss for corrupt or
// truncated data.
absl::StatusOr<ImageSize> DecodeOther(ImageFormat format, const uint8_t* data, size_t size,
                                      int64_t max_pixels, std::vector<uint8_t>* rgb);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_FORMATS_H_
