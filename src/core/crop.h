// torchvision's crop geometry, shared by the image and video built-ins: RandomResizedCrop's
// box (`RandomResizedCrop.get_params`: 10 attempts, then the centre-crop fallback) with
// feedline's counter-based generator, and `Resize(resize_size)` (shorter side) +
// `CenterCrop(size)`.
#ifndef FEEDLINE_SRC_CORE_CROP_H_
#define FEEDLINE_SRC_CORE_CROP_H_

#include <cstdint>
#include <utility>

#include "feedline/random.h"

namespace feedline {

// Python's round(): half to even. 64-bit: the eval geometry of thin images exceeds int.
int64_t PyRound64(double v);

struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;  // torchvision's (i, j, h, w)
};

CropBox RandomResizedCropBox(int width, int height, std::pair<double, double> scale,
                             std::pair<double, double> ratio, SampleRng& rng);

// Resize(resize_size) output size (torchvision: the shorter side becomes resize_size, the
// other is int(resize_size * long / short)), and the CenterCrop offsets into it.
// 64-bit: a thin image's resized long side can exceed what an int holds.
struct EvalGeometry {
  int64_t resized_w = 0, resized_h = 0;
  int64_t crop_top = 0, crop_left = 0;
};
EvalGeometry ComputeEvalGeometry(int width, int height, int resize_size, int size);

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_CROP_H_
