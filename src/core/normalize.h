// Per-channel normalisation of uint8 pixels, (x / 255 - mean) / std, as x * scale[c] + bias[c]
// in float: the form both the CPU conversion (src/image/convert.h) and the device's
// (src/cuda/convert.cu) compute, so that the two agree to within rounding.
#ifndef FEEDLINE_SRC_CORE_NORMALIZE_H_
#define FEEDLINE_SRC_CORE_NORMALIZE_H_

#include <array>

namespace feedline {

struct Normalization {
  float scale[3];  // 1 / (255 * std)
  float bias[3];   // -mean / std
  static Normalization From(const std::array<double, 3>& mean, const std::array<double, 3>& std) {
    Normalization n;
    for (int c = 0; c < 3; ++c) {
      n.scale[c] = float(1.0 / (255.0 * std[c]));
      n.bias[c] = float(-mean[c] / std[c]);
    }
    return n;
  }
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_NORMALIZE_H_
