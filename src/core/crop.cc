#include "core/crop.h"

#include <algorithm>
#include <cmath>

namespace feedline {
namespace {

int PyRound(double v) { return static_cast<int>(PyRound64(v)); }

}  // namespace

// std::nearbyint uses the current rounding mode, which is round-to-nearest-even unless someone
// changed it; stated explicitly here so as not to depend on that.
int64_t PyRound64(double v) {
  double r = std::round(v);
  if (std::fabs(v - std::trunc(v)) == 0.5) r = 2.0 * std::round(v / 2.0);
  return static_cast<int64_t>(r);
}

CropBox RandomResizedCropBox(int width, int height, std::pair<double, double> scale,
                             std::pair<double, double> ratio, SampleRng& rng) {
  const double area = double(height) * double(width);
  const double log_r0 = std::log(ratio.first), log_r1 = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(scale.first, scale.second);
    const double aspect = std::exp(rng.Uniform(log_r0, log_r1));
    const int w = PyRound(std::sqrt(target_area * aspect));
    const int h = PyRound(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      CropBox box;
      box.top = static_cast<int>(rng.Below(uint64_t(height - h + 1)));
      box.left = static_cast<int>(rng.Below(uint64_t(width - w + 1)));
      box.height = h;
      box.width = w;
      return box;
    }
  }
  // torchvision's fallback: the central crop with the ratio clamped to the allowed range.
  const double in_ratio = double(width) / double(height);
  const double rmin = std::min(ratio.first, ratio.second),
               rmax = std::max(ratio.first, ratio.second);
  int w = width, h = height;
  if (in_ratio < rmin) {
    h = PyRound(w / rmin);
  } else if (in_ratio > rmax) {
    w = PyRound(h * rmax);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

EvalGeometry ComputeEvalGeometry(int width, int height, int resize_size, int size) {
  EvalGeometry g;
  const bool portrait = width <= height;
  const int64_t s = portrait ? width : height, l = portrait ? height : width;
  const int64_t new_long = static_cast<int64_t>(double(resize_size) * double(l) / double(s));
  g.resized_w = portrait ? resize_size : new_long;
  g.resized_h = portrait ? new_long : resize_size;
  // torchvision's CenterCrop: a side shorter than the crop is first zero-padded by
  // (crop - side) // 2 before (the rest after), then the window is taken at round((side -
  // crop) / 2), half to even.
  auto offset = [size](int64_t side) {
    return side < size ? -((size - side) / 2) : PyRound64((double(side) - size) / 2.0);
  };
  g.crop_top = offset(g.resized_h);
  g.crop_left = offset(g.resized_w);
  return g;
}

}  // namespace feedline
