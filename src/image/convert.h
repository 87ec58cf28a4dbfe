// uint8 -> normalised float32 / float16 / bfloat16, per channel: (x / 255 - mean) / std.
// The CPU twin of the CUDA conversion kernel (src/cuda/convert.cu); both compute
// x * scale[c] + bias[c] in float and round to nearest even, so they agree to within rounding.
#ifndef FEEDLINE_SRC_IMAGE_CONVERT_H_
#define FEEDLINE_SRC_IMAGE_CONVERT_H_

#include <array>
#include <cstdint>

#include "core/float16.h"
#include "core/normalize.h"
#include "feedline/options.h"

namespace feedline {

// Converts one sample of `pixels` = 3 * h * w values laid out as `layout` into `dst` (dtype
// elements, same layout).
void ConvertSample(const uint8_t* src, int64_t pixels, Layout layout, DType dtype,
                   const Normalization& n, void* dst);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_CONVERT_H_
