#include "image/pil_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// This file's floating-point arithmetic must round as Pillow's (plain IEEE double, no fused
// multiply-add): the weights decide which pixels come out one level apart.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace feedline {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS

double Triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t Clip8(int v) {
  v >>= kPrecisionBits;  // arithmetic shift: floor, as Pillow's lookup table index
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

void PilBilinearAxis(int64_t in_size, int64_t out_size, int64_t first, int count, PilAxis* axis) {
  // Pillow: scale = (in1 - in0) / outSize with the box edges as floats; the whole image here.
  const double scale = double(float(in_size) - float(0)) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle filter's support is 1
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  axis->ksize = ksize;
  axis->start.resize(size_t(count));
  axis->taps.resize(size_t(count));
  axis->weights.assign(size_t(count) * size_t(ksize), 0);
  std::vector<double> k(static_cast<size_t>(ksize));
  for (int i = 0; i < count; ++i) {
    const int64_t xx = first + i;
    const double center = 0.0 + (double(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);  // truncation, as Pillow's
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = Triangle((double(x + xmin) - center + 0.5) * ss);
      k[size_t(x)] = w;
      ww += w;
    }
    int32_t* out = axis->weights.data() + size_t(i) * size_t(ksize);
    for (int64_t x = 0; x < xmax; ++x) {
      double v = k[size_t(x)];
      if (ww != 0.0) v /= ww;
      out[x] = static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits)
                                          : 0.5 + v * (1 << kPrecisionBits));
    }
    axis->start[size_t(i)] = static_cast<int>(xmin);
    axis->taps[size_t(i)] = static_cast<int>(xmax);
  }
}

int PilRowsNeeded(int src_h, int64_t out_h, int64_t y0, int h) {
  if (h <= 0) return 0;
  if (out_h == src_h) return static_cast<int>(y0 + h);
  PilAxis axis;
  // Only the last row's window matters: the windows move down monotonically.
  PilBilinearAxis(src_h, out_h, y0 + h - 1, 1, &axis);
  return axis.end_input();
}

void PilResizeWindow(const uint8_t* src, int src_w, int src_h, size_t stride, int64_t out_w,
                     int64_t out_h, int64_t x0, int64_t y0, int w, int h, uint8_t* dst,
                     size_t dst_stride, PilScratch* scratch) {
  if (w <= 0 || h <= 0) return;
  const bool horizontal = out_w != src_w;
  const bool vertical = out_h != src_h;
  PilAxis& ax = scratch->x;
  PilAxis& ay = scratch->y;
  if (vertical) PilBilinearAxis(src_h, out_h, y0, h, &ay);
  // Source rows the vertical pass reads (or the window's own rows when there is none).
  const int row0 = vertical ? ay.first_input() : int(y0);
  const int row1 = vertical ? ay.end_input() : int(y0 + h);
  const int nrows = row1 - row0;

  // Horizontal pass: rows [row0, row1) to `w` output columns, 8-bit like Pillow's imTemp.
  const uint8_t* hsrc = src + size_t(row0) * stride;
  size_t hstride = stride;
  int hx0 = int(x0);  // column offset into the horizontal pass's result
  if (horizontal) {
    PilBilinearAxis(src_w, out_w, x0, w, &ax);
    scratch->rows.resize(size_t(nrows) * size_t(w) * 3);
    const int ks = ax.ksize;
    for (int r = 0; r < nrows; ++r) {
      const uint8_t* in = src + size_t(row0 + r) * stride;
      uint8_t* out = scratch->rows.data() + size_t(r) * size_t(w) * 3;
      for (int xx = 0; xx < w; ++xx) {
        const int xmin = ax.start[size_t(xx)], taps = ax.taps[size_t(xx)];
        const int32_t* k = ax.weights.data() + size_t(xx) * size_t(ks);
        const uint8_t* p = in + size_t(xmin) * 3;
        int s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int t = 0; t < taps; ++t) {
          s0 += p[3 * t] * k[t];
          s1 += p[3 * t + 1] * k[t];
          s2 += p[3 * t + 2] * k[t];
        }
        out[3 * xx] = Clip8(s0);
        out[3 * xx + 1] = Clip8(s1);
        out[3 * xx + 2] = Clip8(s2);
      }
    }
    hsrc = scratch->rows.data();
    hstride = size_t(w) * 3;
    hx0 = 0;
  }

  // Vertical pass (or a copy of the window's rows when the height does not change).
  const size_t row_bytes = size_t(w) * 3;
  if (!vertical) {
    for (int r = 0; r < h; ++r) {
      std::memcpy(dst + size_t(r) * dst_stride, hsrc + size_t(r) * hstride + size_t(hx0) * 3,
                  row_bytes);
    }
    return;
  }
  // Row by row, tap by tap: the inner loop runs along the row (vectorised), the sums stay
  // exact in 32 bits (|weights| sum to about 2^22, times 255).
  const int ks = ay.ksize;
  std::vector<int32_t>& acc = scratch->acc;
  acc.resize(row_bytes);
  const uint8_t* base = hsrc + size_t(hx0) * 3;
  for (int yy = 0; yy < h; ++yy) {
    const int ymin = ay.start[size_t(yy)] - row0, taps = ay.taps[size_t(yy)];
    const int32_t* k = ay.weights.data() + size_t(yy) * size_t(ks);
    std::fill(acc.begin(), acc.end(), int32_t{1} << (kPrecisionBits - 1));
    for (int t = 0; t < taps; ++t) {
      const uint8_t* in = base + size_t(ymin + t) * hstride;
      const int32_t kt = k[t];
      int32_t* a = acc.data();
      for (size_t c = 0; c < row_bytes; ++c) a[c] += in[c] * kt;
    }
    uint8_t* out = dst + size_t(yy) * dst_stride;
    for (size_t c = 0; c < row_bytes; ++c) out[c] = Clip8(acc[c]);
  }
}

}  // namespace feedline
