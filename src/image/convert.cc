#include "image/convert.h"

#include <cstring>

namespace feedline {

namespace {

// The channel of element i: planes for NCHW, interleaved for NHWC.
template <typename Store>
void Convert(const uint8_t* src, int64_t pixels, Layout layout, const Normalization& n,
             Store store) {
  if (layout == Layout::kNCHW) {
    const int64_t plane = pixels / 3;
    for (int c = 0; c < 3; ++c) {
      const float s = n.scale[c], b = n.bias[c];
      const uint8_t* p = src + c * plane;
      const int64_t base = c * plane;
      for (int64_t i = 0; i < plane; ++i) store(base + i, float(p[i]) * s + b);
    }
  } else {
    for (int64_t i = 0; i < pixels; i += 3) {
      store(i, float(src[i]) * n.scale[0] + n.bias[0]);
      store(i + 1, float(src[i + 1]) * n.scale[1] + n.bias[1]);
      store(i + 2, float(src[i + 2]) * n.scale[2] + n.bias[2]);
    }
  }
}

}  // namespace

void ConvertSample(const uint8_t* src, int64_t pixels, Layout layout, DType dtype,
                   const Normalization& n, void* dst) {
  switch (dtype) {
    case DType::kUint8:
      std::memcpy(dst, src, size_t(pixels));
      return;
    case DType::kFloat32: {
      float* out = static_cast<float*>(dst);
      Convert(src, pixels, layout, n, [out](int64_t i, float v) { out[i] = v; });
      return;
    }
    case DType::kFloat16: {
#if defined(__FLT16_MANT_DIG__)
      _Float16* out = static_cast<_Float16*>(dst);
      Convert(src, pixels, layout, n, [out](int64_t i, float v) { out[i] = _Float16(v); });
#else
      uint16_t* out = static_cast<uint16_t*>(dst);
      Convert(src, pixels, layout, n, [out](int64_t i, float v) { out[i] = FloatToHalf(v); });
#endif
      return;
    }
    case DType::kBFloat16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      Convert(src, pixels, layout, n, [out](int64_t i, float v) { out[i] = FloatToBFloat16(v); });
      return;
    }
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBytes:
    case DType::kFloat64:
    case DType::kBool:
    case DType::kInt8:
    case DType::kInt16:
      break;  // not image types: refused by image::ValidateOptions
  }
}

}  // namespace feedline
