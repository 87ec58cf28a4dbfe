// EXIF orientation (tag 0x0112): read from JPEG (APP1 "Exif"), PNG (eXIf chunk) and WebP (EXIF
// chunk) files, and applied to decoded pixels as PIL's `ImageOps.exif_transpose` does
// (2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate
// 90 counter-clockwise). torchvision does not apply it; `exif_transpose=True` does.
//
// Thread safety: pure functions; call them from any thread.
#ifndef FEEDLINE_SRC_IMAGE_EXIF_H_
#define FEEDLINE_SRC_IMAGE_EXIF_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "image/decoder.h"
#include "image/formats.h"

namespace feedline {

// The orientation in `data` (1..8); 1 when there is none or it cannot be read. Reads only the
// metadata before the pixel data, bounds-checked (fuzzed with the decoders).
int ReadOrientation(ImageFormat format, const uint8_t* data, size_t size);

// The orientation tag of an EXIF block (a TIFF header and IFD0, after any "Exif\0\0" prefix).
int ExifOrientation(const uint8_t* exif, size_t size);

// Orientations 5..8 exchange width and height.
inline bool SwapsAxes(int orientation) { return orientation >= 5 && orientation <= 8; }

// `region` (a whole decoded image, origin 0) turned upright into `out`; the result's scales
// refer to the upright original (width and height exchanged for 5..8).
DecodedRegion ApplyOrientation(const DecodedRegion& region, int orientation,
                               std::vector<uint8_t>* out);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_EXIF_H_
