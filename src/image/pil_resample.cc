#include "image/pil_resample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// One row of the horizontal pass: output column i from inputs [start[i], start[i] + taps[i]).
void HorizontalRowScalar(const uint8_t* in, uint8_t* out, const PilAxis& ax, int w) {
  const int ks = ax.ksize;
  for (int xx = 0; xx < w; ++xx) {
    const int taps = ax.taps[size_t(xx)];
    const int32_t* k = ax.weights.data() + size_t(xx) * size_t(ks);
    const uint8_t* p = in + size_t(ax.start[size_t(xx)]) * 3;
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same sums with the three channels in one SSE4.1 register (32-bit lanes: exact, the
// same integers as the scalar loop), saturated to 8 bits as Clip8 does (pack with signed, then
// unsigned saturation after the arithmetic shift).
__attribute__((target("sse4.1"))) void HorizontalRowSse41(const uint8_t* in, uint8_t* out,
                                                          const PilAxis& ax, int w) {
  const int ks = ax.ksize;
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
  for (int xx = 0; xx < w; ++xx) {
    const int taps = ax.taps[size_t(xx)];
    const int32_t* k = ax.weights.data() + size_t(xx) * size_t(ks);
    const uint8_t* p = in + size_t(ax.start[size_t(xx)]) * 3;
    __m128i acc = half;
    for (int t = 0; t < taps; ++t) {
      // Three bytes (the last pixel may end the buffer), put together in a register: through
      // memory, two narrow stores and a wide load stall on store forwarding.
      const uint8_t* q = p + 3 * t;
      const int rgb = int(uint32_t{q[0]} | (uint32_t{q[1]} << 8) | (uint32_t{q[2]} << 16));
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(rgb));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[t])));
    }
    acc = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const uint32_t v = uint32_t(_mm_cvtsi128_si32(bytes));
    out[3 * xx] = uint8_t(v);
    out[3 * xx + 1] = uint8_t(v >> 8);
    out[3 * xx + 2] = uint8_t(v >> 16);
  }
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// One pixel's three bytes as 32-bit lanes, and back (shift, then saturate as Clip8 does).
// Functions, not lambdas: clang does not give a lambda its enclosing function's target.
__attribute__((target("sse4.1"))) inline __m128i LoadRgb(const uint8_t* q) {
  return _mm_cvtepu8_epi32(
      _mm_cvtsi32_si128(int(uint32_t{q[0]} | (uint32_t{q[1]} << 8) | (uint32_t{q[2]} << 16))));
}
__attribute__((target("sse4.1"))) inline void StoreRgb(__m128i acc, uint8_t* o) {
  acc = _mm_srai_epi32(acc, kPrecisionBits);
  const uint32_t v = uint32_t(_mm_cvtsi128_si32(_mm_packus_epi16(_mm_packs_epi32(acc, acc), acc)));
  o[0] = uint8_t(v), o[1] = uint8_t(v >> 8), o[2] = uint8_t(v >> 16);
}

// Four rows at once: the same weights for each, four independent sums per tap (the one-row
// loop waits on each multiply-add in turn).
__attribute__((target("sse4.1"))) void HorizontalRows4Sse41(const uint8_t* const in[4],
                                                            uint8_t* const out[4],
                                                            const PilAxis& ax, int w) {
  const int ks = ax.ksize;
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
  for (int xx = 0; xx < w; ++xx) {
    const int taps = ax.taps[size_t(xx)];
    const int32_t* k = ax.weights.data() + size_t(xx) * size_t(ks);
    const size_t at = size_t(ax.start[size_t(xx)]) * 3;
    __m128i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int t = 0; t < taps; ++t) {
      const __m128i kt = _mm_set1_epi32(k[t]);
      const size_t o = at + 3 * size_t(t);
      a0 = _mm_add_epi32(a0, _mm_mullo_epi32(LoadRgb(in[0] + o), kt));
      a1 = _mm_add_epi32(a1, _mm_mullo_epi32(LoadRgb(in[1] + o), kt));
      a2 = _mm_add_epi32(a2, _mm_mullo_epi32(LoadRgb(in[2] + o), kt));
      a3 = _mm_add_epi32(a3, _mm_mullo_epi32(LoadRgb(in[3] + o), kt));
    }
    StoreRgb(a0, out[0] + 3 * size_t(xx));
    StoreRgb(a1, out[1] + 3 * size_t(xx));
    StoreRgb(a2, out[2] + 3 * size_t(xx));
    StoreRgb(a3, out[3] + 3 * size_t(xx));
  }
}
#endif

// One output row of the vertical pass: taps rows from `in` (`stride` apart), weights `k`.
// Row by row, tap by tap, so that the inner loop runs along the row.
void VerticalRowScalar(const uint8_t* in, size_t stride, int taps, const int32_t* k, size_t n,
                       uint8_t* out, std::vector<int32_t>* acc_storage) {
  acc_storage->assign(n, int32_t{1} << (kPrecisionBits - 1));
  int32_t* a = acc_storage->data();
  for (int t = 0; t < taps; ++t) {
    const uint8_t* row = in + size_t(t) * stride;
    const int32_t kt = k[t];
    for (size_t c = 0; c < n; ++c) a[c] += row[c] * kt;
  }
  for (size_t c = 0; c < n; ++c) out[c] = Clip8(a[c]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// 16 bytes of the row at a time, their sums in four registers across the taps.
__attribute__((target("sse4.1"))) void VerticalRowSse41(const uint8_t* in, size_t stride, int taps,
                                                        const int32_t* k, size_t n, uint8_t* out,
                                                        std::vector<int32_t>* acc_storage) {
  const __m128i half = _mm_set1_epi32(1 << (kPrecisionBits - 1));
  size_t c = 0;
  for (; c + 16 <= n; c += 16) {
    __m128i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int t = 0; t < taps; ++t) {
      const __m128i v =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + size_t(t) * stride + c));
      const __m128i kt = _mm_set1_epi32(k[t]);
      a0 = _mm_add_epi32(a0, _mm_mullo_epi32(_mm_cvtepu8_epi32(v), kt));
      a1 = _mm_add_epi32(a1, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4)), kt));
      a2 = _mm_add_epi32(a2, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8)), kt));
      a3 = _mm_add_epi32(a3, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12)), kt));
    }
    a0 = _mm_srai_epi32(a0, kPrecisionBits);
    a1 = _mm_srai_epi32(a1, kPrecisionBits);
    a2 = _mm_srai_epi32(a2, kPrecisionBits);
    a3 = _mm_srai_epi32(a3, kPrecisionBits);
    const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), bytes);
  }
  if (c < n) VerticalRowScalar(in + c, stride, taps, k, n - c, out + c, acc_storage);
}
#endif

using VerticalFn = void (*)(const uint8_t*, size_t, int, const int32_t*, size_t, uint8_t*,
                            std::vector<int32_t>*);
VerticalFn PickVerticalRow() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("sse4.1")) return &VerticalRowSse41;
#endif
  return &VerticalRowScalar;
}

std::atomic<bool> g_simd{true};

void VerticalRow(const uint8_t* in, size_t stride, int taps, const int32_t* k, size_t n,
                 uint8_t* out, std::vector<int32_t>* acc) {
  static const VerticalFn fn = PickVerticalRow();
  (g_simd.load(std::memory_order_relaxed) ? fn : &VerticalRowScalar)(in, stride, taps, k, n, out,
                                                                     acc);
}

using RowFn = void (*)(const uint8_t*, uint8_t*, const PilAxis&, int);
RowFn PickHorizontalRow() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("sse4.1")) return &HorizontalRowSse41;
#endif
  return &HorizontalRowScalar;
}

void HorizontalRow(const uint8_t* in, uint8_t* out, const PilAxis& ax, int w) {
  static const RowFn fn = PickHorizontalRow();
  (g_simd.load(std::memory_order_relaxed) ? fn : &HorizontalRowScalar)(in, out, ax, w);
}

// The horizontal pass over `nrows` rows: four at a time where SSE4.1 is there.
void HorizontalRows(const uint8_t* src, size_t stride, int nrows, uint8_t* out, size_t out_stride,
                    const PilAxis& ax, int w) {
  int r = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool sse41 = __builtin_cpu_supports("sse4.1");
  if (sse41 && g_simd.load(std::memory_order_relaxed)) {
    for (; r + 4 <= nrows; r += 4) {
      const uint8_t* in[4] = {src + size_t(r) * stride, src + size_t(r + 1) * stride,
                              src + size_t(r + 2) * stride, src + size_t(r + 3) * stride};
      uint8_t* o[4] = {out + size_t(r) * out_stride, out + size_t(r + 1) * out_stride,
                       out + size_t(r + 2) * out_stride, out + size_t(r + 3) * out_stride};
      HorizontalRows4Sse41(in, o, ax, w);
    }
  }
#endif
  for (; r < nrows; ++r)
    HorizontalRow(src + size_t(r) * stride, out + size_t(r) * out_stride, ax, w);
}

}  // namespace

void SetPilResampleSimd(bool enabled) { g_simd.store(enabled, std::memory_order_relaxed); }

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
    HorizontalRows(src + size_t(row0) * stride, stride, nrows, scratch->rows.data(), size_t(w) * 3,
                   ax, w);
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
  const int ks = ay.ksize;
  const uint8_t* base = hsrc + size_t(hx0) * 3;
  for (int yy = 0; yy < h; ++yy) {
    const int ymin = ay.start[size_t(yy)] - row0, taps = ay.taps[size_t(yy)];
    VerticalRow(base + size_t(ymin) * hstride, hstride, taps,
                ay.weights.data() + size_t(yy) * size_t(ks), row_bytes,
                dst + size_t(yy) * dst_stride, &scratch->acc);
  }
}

}  // namespace feedline
