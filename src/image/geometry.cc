#include "image/geometry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace feedline {
namespace {

// The decoder workers are the parallelism: OpenCV's own thread pool (TBB in Debian's build)
// would oversubscribe the cores and hide work from the stage counters.
void DisableOpenCvThreads() {
  static const bool done = [] {
    cv::setNumThreads(0);
    return true;
  }();
  (void)done;
}

// Resamples `src` to exactly `dst`'s size, one filter per axis direction:
//  * shrinking by more than kBilinearShrinkMax (bilinear.h): area averaging (antialiased, as
//    PIL's filters are);
//  * shrinking by less, or enlarging: bilinear, 5-7x faster than OpenCV's area averaging at
//    fractional ratios; ResampleInto (train) through BilinearResize (bilinear.h), 2.5x faster
//    than OpenCV's bilinear and writing the slot's layout directly. The decoder's DCT scaling
//    (eighths) leaves the crop less than 8/7 larger than the output; up to kBilinearShrinkMax
//    larger where it decodes at 8/8 instead of 6/8 or 7/8 (train: up to twice that, through
//    BilinearResize's 2:1 box); down to 0.8 of it where train decodes at 4/8 instead of 5/8
//    (decoder.h). There bilinear aliases no more than PIL's triangle filter blurs (measured
//    against torchvision in tests/python/test_eval.py and test_train_transform.py).
// When the axes disagree (one shrinks a lot, the other not), x then y in two passes.
int FilterFor(int from, int to) {
  return double(from) > kBilinearShrinkMax * double(to) ? cv::INTER_AREA : cv::INTER_LINEAR;
}

void Resample(const cv::Mat& src, cv::Mat& dst, std::vector<uint8_t>* tmp_storage) {
  const int sw = src.cols, sh = src.rows, dw = dst.cols, dh = dst.rows;
  if (sw == dw && sh == dh) {
    src.copyTo(dst);
    return;
  }
  const int fx = FilterFor(sw, dw), fy = FilterFor(sh, dh);
  if (fx != fy) {
    tmp_storage->resize(size_t(dw) * sh * 3);
    cv::Mat mid(sh, dw, CV_8UC3, tmp_storage->data());
    cv::resize(src, mid, mid.size(), 0, 0, fx);
    cv::resize(mid, dst, dst.size(), 0, 0, fy);
    return;
  }
  cv::resize(src, dst, dst.size(), 0, 0, fx);
}

// One row of `n` RGB pixels into three planes, mirrored: cv::flip then cv::split took 24 us for
// 224x224 (the flip 20 of them), this loop 7 with AVX2. Dispatched by hand, not with
// target_clones: an ifunc resolver runs while the executable is relocated, before a sanitizer's
// runtime is up (ThreadSanitizer crashed there).
__attribute__((always_inline)) inline void SplitMirroredRow(const uint8_t* src, uint8_t* d0,
                                                            uint8_t* d1, uint8_t* d2, int64_t n) {
  for (int64_t x = 0; x < n; ++x) {
    d0[n - 1 - x] = src[3 * x];
    d1[n - 1 - x] = src[3 * x + 1];
    d2[n - 1 - x] = src[3 * x + 2];
  }
}
__attribute__((target("avx2"))) void SplitMirroredAvx2(const uint8_t* src, uint8_t* d0, uint8_t* d1,
                                                       uint8_t* d2, int64_t n) {
  SplitMirroredRow(src, d0, d1, d2, n);
}
void SplitMirrored(const uint8_t* src, uint8_t* d0, uint8_t* d1, uint8_t* d2, int64_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    SplitMirroredAvx2(src, d0, d1, d2, n);
  } else {
    SplitMirroredRow(src, d0, d1, d2, n);
  }
}

// Writes an HWC image (possibly a non-contiguous window) to `dst` in `layout`, mirrored when
// `flip`.
void Store(const cv::Mat& hwc, bool flip, Layout layout, uint8_t* dst) {
  const int w = hwc.cols, h = hwc.rows;
  cv::Mat src = hwc;
  if (layout == Layout::kNHWC) {
    cv::Mat out(h, w, CV_8UC3, dst);
    if (flip) {
      cv::flip(src, out, 1);
    } else if (src.data != out.data) {
      src.copyTo(out);
    }
    return;
  }
  const size_t plane = size_t(w) * h;
  if (flip) {
    for (int y = 0; y < h; ++y) {
      SplitMirrored(src.ptr<uint8_t>(y), dst + size_t(y) * w, dst + plane + size_t(y) * w,
                    dst + 2 * plane + size_t(y) * w, w);
    }
    return;
  }
  cv::Mat planes[3] = {cv::Mat(h, w, CV_8UC1, dst), cv::Mat(h, w, CV_8UC1, dst + plane),
                       cv::Mat(h, w, CV_8UC1, dst + 2 * plane)};
  cv::split(src, planes);
}

cv::Mat RegionMat(const DecodedRegion& r) {
  return cv::Mat(r.height, r.width, CV_8UC3, const_cast<uint8_t*>(r.pixels), r.stride);
}

// The crop window's part inside the resized image, in resized coordinates.
struct Visible {
  int64_t x0, y0;
  int w, h;
  bool inside;  // the whole window is inside: no padding
};
Visible VisiblePart(const EvalGeometry& g, int out_w, int out_h) {
  const int64_t ix0 = std::max<int64_t>(g.crop_left, 0), iy0 = std::max<int64_t>(g.crop_top, 0);
  const int64_t ix1 = std::min<int64_t>(g.crop_left + out_w, g.resized_w);
  const int64_t iy1 = std::min<int64_t>(g.crop_top + out_h, g.resized_h);
  Visible v{ix0, iy0, int(std::max<int64_t>(ix1 - ix0, 0)), int(std::max<int64_t>(iy1 - iy0, 0)),
            false};
  v.inside = v.w == out_w && v.h == out_h;
  return v;
}

}  // namespace

void ResampleInto(const DecodedRegion& region, const Rect& src, int out_w, int out_h, bool flip,
                  Layout layout, uint8_t* dst, ResampleScratch* scratch) {
  DisableOpenCvThreads();
  // The rectangle in decoded coordinates, rounded to whole decoded pixels.
  int x0 = static_cast<int>(std::lround(src.x * region.scale_x - region.origin_x));
  int y0 = static_cast<int>(std::lround(src.y * region.scale_y - region.origin_y));
  int x1 = static_cast<int>(std::lround((src.x + src.w) * region.scale_x - region.origin_x));
  int y1 = static_cast<int>(std::lround((src.y + src.h) * region.scale_y - region.origin_y));
  x0 = std::clamp(x0, 0, region.width - 1);
  y0 = std::clamp(y0, 0, region.height - 1);
  x1 = std::clamp(x1, x0 + 1, region.width);
  y1 = std::clamp(y1, y0 + 1, region.height);
  cv::Mat roi = RegionMat(region)(cv::Rect(x0, y0, x1 - x0, y1 - y0));
  // Shrinks up to 2 x kBilinearShrinkMax (bilinear.h: 2:1 box averaging first beyond
  // kBilinearShrinkMax); OpenCV's area averaging beyond.
  if (BilinearResize(roi.data, roi.cols, roi.rows, roi.step, out_w, out_h, flip,
                     layout == Layout::kNCHW, dst, &scratch->bilinear)) {
    return;
  }
  const bool direct = layout == Layout::kNHWC && !flip;
  if (!direct) scratch->a.resize(size_t(out_w) * out_h * 3);
  cv::Mat resized(out_h, out_w, CV_8UC3, direct ? dst : scratch->a.data());
  Resample(roi, resized, &scratch->b);
  if (!direct) Store(resized, flip, layout, dst);
}

void ResizeWhole(const DecodedRegion& region, int w, int h, std::vector<uint8_t>* out) {
  DisableOpenCvThreads();
  out->resize(size_t(w) * size_t(h) * 3);
  cv::Mat dst(h, w, CV_8UC3, out->data());
  std::vector<uint8_t> tmp;
  Resample(RegionMat(region), dst, &tmp);
}

void ResizeThenCropInto(const DecodedRegion& region, const EvalGeometry& g, int width, int height,
                        int out_w, int out_h, Layout layout, uint8_t* dst,
                        ResampleScratch* scratch) {
  DisableOpenCvThreads();
  // The crop window's part inside the resized image; the rest (CenterCrop larger than the
  // resized image) is zero padding, as in torchvision.
  const Visible v = VisiblePart(g, out_w, out_h);
  const int64_t ix0 = v.x0, iy0 = v.y0;
  const bool inside = v.inside, empty = v.w == 0 || v.h == 0;
  const int within_w = v.w, within_h = v.h;
  const cv::Rect within(int(ix0 - g.crop_left), int(iy0 - g.crop_top), within_w, within_h);

  // Padding is rare (CenterCrop larger than the resized image); the window is assembled here.
  std::vector<uint8_t> padded;
  auto padded_window = [&]() {
    padded.assign(size_t(out_w) * out_h * 3, 0);
    return cv::Mat(out_h, out_w, CV_8UC3, padded.data());
  };
  if (empty) {
    padded_window();
  } else if (g.resized_w * g.resized_h > 16 * int64_t{out_w} * out_h) {
    // A resized image much larger than the window (extreme aspect ratios, or a crop far smaller
    // than the resize): map the visible part of the window back to the source and resample only
    // that, so memory and time follow the output, not the resized image.
    const double fx = double(width) / double(g.resized_w);
    const double fy = double(height) / double(g.resized_h);
    const Rect src{double(ix0) * fx, double(iy0) * fy, within_w * fx, within_h * fy};
    if (inside) {
      ResampleInto(region, src, out_w, out_h, /*flip=*/false, layout, dst, scratch);
      return;
    }
    std::vector<uint8_t> part(size_t(within_w) * within_h * 3);
    ResampleInto(region, src, within_w, within_h, /*flip=*/false, Layout::kNHWC, part.data(),
                 scratch);
    cv::Mat(within_h, within_w, CV_8UC3, part.data()).copyTo(padded_window()(within));
  } else {
    // Exact: resize the whole image as torchvision does, then crop (and pad).
    scratch->a.resize(size_t(g.resized_w) * size_t(g.resized_h) * 3);
    cv::Mat resized(int(g.resized_h), int(g.resized_w), CV_8UC3, scratch->a.data());
    Resample(RegionMat(region), resized, &scratch->b);
    const cv::Rect visible(int(ix0), int(iy0), within_w, within_h);
    if (inside) {
      Store(resized(visible), /*flip=*/false, layout, dst);
      return;
    }
    resized(visible).copyTo(padded_window()(within));
  }
  Store(cv::Mat(out_h, out_w, CV_8UC3, padded.data()), /*flip=*/false, layout, dst);
}

int EvalRowsNeeded(const EvalGeometry& g, int height, int out_h) {
  const Visible v = VisiblePart(g, out_h, out_h);  // rows only depend on the height
  return PilRowsNeeded(height, g.resized_h, v.y0, v.h);
}

void PilResizeThenCropInto(const DecodedRegion& region, const EvalGeometry& g, int width,
                           int height, int out_w, int out_h, Layout layout, uint8_t* dst,
                           ResampleScratch* scratch) {
  DisableOpenCvThreads();
  const Visible v = VisiblePart(g, out_w, out_h);
  const bool direct = v.inside && layout == Layout::kNHWC;
  std::vector<uint8_t>& window = scratch->a;
  if (!direct) window.assign(size_t(out_w) * out_h * 3, 0);  // zero padding around the part
  uint8_t* out = direct ? dst : window.data();
  const size_t out_stride = size_t(out_w) * 3;
  if (v.w > 0 && v.h > 0) {
    uint8_t* at = out + size_t(v.y0 - g.crop_top) * out_stride + size_t(v.x0 - g.crop_left) * 3;
    PilResizeWindow(region.pixels, width, height, region.stride, g.resized_w, g.resized_h, v.x0,
                    v.y0, v.w, v.h, at, out_stride, &scratch->pil);
  }
  if (!direct) {
    Store(cv::Mat(out_h, out_w, CV_8UC3, window.data()), /*flip=*/false, layout, dst);
  }
}

}  // namespace feedline
