// Geometry of torchvision's transforms, and resampling into a batch slot.
//
// `PilResizeThenCropInto` is the exact eval path (Pillow's filter, bit for bit); the rest
// resample approximately for speed (train, `eval_fast`, the decoded cache). The crop boxes
// themselves are core/crop.h's (shared with the video built-in).
//
// Resampling uses OpenCV's imgproc: area averaging when shrinking by more than
// kBilinearShrinkMax (antialiased, as PIL's bilinear filter is in torchvision), bilinear below
// that and when enlarging (train: bilinear.h's, straight into the slot), one axis at a time
// when the two axes go different ways.
#ifndef FEEDLINE_SRC_IMAGE_GEOMETRY_H_
#define FEEDLINE_SRC_IMAGE_GEOMETRY_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "core/crop.h"
#include "feedline/options.h"
#include "feedline/random.h"
#include "image/bilinear.h"
#include "image/decoder.h"
#include "image/pil_resample.h"

namespace feedline {

// Per-thread scratch for resampling, reused across samples.
struct ResampleScratch {
  std::vector<uint8_t> a, b;
  PilScratch pil;
  BilinearScratch bilinear;
};

// Resamples the original-image rectangle `src` (as covered by `region`) to out_w x out_h and
// writes it to `dst` in `layout` (NHWC: out_h rows of out_w*3 bytes; NCHW: three planes of
// out_h*out_w), mirrored horizontally when `flip`.
void ResampleInto(const DecodedRegion& region, const Rect& src, int out_w, int out_h, bool flip,
                  Layout layout, uint8_t* dst, ResampleScratch* scratch);

// Resamples the whole decoded region to w x h (area averaging) into `out` (RGB HWC).
void ResizeWhole(const DecodedRegion& region, int w, int h, std::vector<uint8_t>* out);

// Resizes the whole decoded image (of an original width x height) to resized_w x resized_h,
// then writes the out_w x out_h window at (crop_left, crop_top) to `dst` (Resize + CenterCrop
// with torchvision's rounding). Crop windows that reach past the resized image are
// zero-padded, as torchvision pads. When the resized image would be much larger than the window
// (thin images: 1 x 65500 resizes to 256 x 16.7M), only the window's source region is
// resampled, so memory stays bounded by the output.
void ResizeThenCropInto(const DecodedRegion& region, const EvalGeometry& g, int width, int height,
                        int out_w, int out_h, Layout layout, uint8_t* dst,
                        ResampleScratch* scratch);

// Resize + CenterCrop bit for bit as torchvision on a PIL image (Pillow's antialiased
// bilinear filter, pil_resample.h): `region` is a full-resolution decode of the width x height
// image (all columns, rows from the top, at least EvalRowsNeeded of them). Only the crop
// window is computed; the part of it outside the resized image is zero padding.
void PilResizeThenCropInto(const DecodedRegion& region, const EvalGeometry& g, int width,
                           int height, int out_w, int out_h, Layout layout, uint8_t* dst,
                           ResampleScratch* scratch);

// Source rows (from the top) that PilResizeThenCropInto reads: decoding can stop there.
int EvalRowsNeeded(const EvalGeometry& g, int height, int out_h);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_GEOMETRY_H_
