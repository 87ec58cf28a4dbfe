#include "image/bilinear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FEEDLINE_BILINEAR_X86 1
#endif

namespace feedline {
namespace {

constexpr int kWeightBits = 7;  // weights are 0..128: pmaddubsw's signed byte operand
constexpr int kOne = 1 << kWeightBits;
constexpr int kHalf = 1 << (kWeightBits - 1);

std::atomic<bool> g_simd{true};

// OpenCV INTER_LINEAR's sample of output position d: the input at k and k + 1 with weights
// (128 - w1, w1). Edges clamp (w1 = 0); a weight that rounds to a whole input moves to it.
struct Tap {
  int k, w1;
};
Tap SampleAt(int d, double scale, int in_size) {
  const double f = (d + 0.5) * scale - 0.5;
  int k = static_cast<int>(std::floor(f));
  double t = f - k;
  if (k < 0) k = 0, t = 0;
  if (k >= in_size - 1) k = in_size - 1, t = 0;
  int w1 = static_cast<int>(std::lround(t * kOne));
  if (w1 == kOne) ++k, w1 = 0;  // t > 0 implies k + 1 <= in_size - 1
  return Tap{k, w1};
}

// Per block of 8 outputs: 16 byte indices (relative to `base`) and 16 weights such that output i
// is (p[s[2i]] * w[2i] + p[s[2i+1]] * w[2i+1] + 64) >> 7. A whole input gets (64, 64) on itself:
// pmaddubsw's weight byte is signed, so 128 does not fit. False when a block needs more than 16
// inputs.
bool HorizontalTables(int in_w, double scale, int out_w, bool flip, BilinearScratch* s) {
  const int blocks = (out_w + 7) / 8;
  s->base.resize(size_t(blocks));
  s->shuffle.resize(size_t(blocks) * 16);
  s->weights.resize(size_t(blocks) * 16);
  for (int b = 0; b < blocks; ++b) {
    const int pos = std::min(8 * b, out_w - 8);  // the last block overlaps the one before
    Tap taps[8];
    int lo = in_w, hi = 0;
    for (int i = 0; i < 8; ++i) {
      const int x = pos + i;
      taps[i] = SampleAt(flip ? out_w - 1 - x : x, scale, in_w);
      lo = std::min(lo, taps[i].k);
      hi = std::max(hi, taps[i].k + (taps[i].w1 > 0 ? 1 : 0));
    }
    if (hi - lo > 15) return false;
    s->base[size_t(b)] = lo;
    uint8_t* sh = &s->shuffle[size_t(b) * 16];
    uint8_t* wt = &s->weights[size_t(b) * 16];
    for (int i = 0; i < 8; ++i) {
      const int k = taps[i].k - lo, w1 = taps[i].w1;
      sh[2 * i] = uint8_t(k);
      sh[2 * i + 1] = uint8_t(w1 > 0 ? k + 1 : k);
      wt[2 * i] = uint8_t(w1 > 0 ? kOne - w1 : kHalf);
      wt[2 * i + 1] = uint8_t(w1 > 0 ? w1 : kHalf);
    }
  }
  return true;
}

// --- plain loops (the reference; the SIMD versions give the same bytes) ---

void VerticalScalar(const uint8_t* r0, const uint8_t* r1, int w1, size_t n, uint8_t* out) {
  const int w0 = kOne - w1;
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t((r0[i] * w0 + r1[i] * w1 + kHalf) >> kWeightBits);
}

// The 2:1 box pre-average of an axis that shrinks more than kBilinearShrinkMax: rounded up, as
// pavgb rounds.
void AverageRowsScalar(const uint8_t* r0, const uint8_t* r1, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t((r0[i] + r1[i] + 1) >> 1);
}

// p[j] = average of p[2j] and p[2j + 1], from <= j < w / 2, in place.
void HalvePlaneFrom(uint8_t* p, int from, int w) {
  for (int j = from; j < w / 2; ++j) p[j] = uint8_t((p[2 * j] + p[2 * j + 1] + 1) >> 1);
}

void HalvePlaneScalar(uint8_t* p, int w) { HalvePlaneFrom(p, 0, w); }

void SplitScalar(const uint8_t* rgb, int w, uint8_t* p0, uint8_t* p1, uint8_t* p2) {
  for (int x = 0; x < w; ++x) {
    p0[x] = rgb[3 * x];
    p1[x] = rgb[3 * x + 1];
    p2[x] = rgb[3 * x + 2];
  }
}

void MergeScalar(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, int w, uint8_t* rgb) {
  for (int x = 0; x < w; ++x) {
    rgb[3 * x] = p0[x];
    rgb[3 * x + 1] = p1[x];
    rgb[3 * x + 2] = p2[x];
  }
}

void HorizontalScalar(const uint8_t* plane, int out_w, const BilinearScratch& s, uint8_t* out) {
  const int blocks = int(s.base.size());
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* p = plane + s.base[size_t(b)];
    const uint8_t* sh = &s.shuffle[size_t(b) * 16];
    const uint8_t* wt = &s.weights[size_t(b) * 16];
    uint8_t* o = out + std::min(8 * b, out_w - 8);
    for (int i = 0; i < 8; ++i) {
      const int v = p[sh[2 * i]] * wt[2 * i] + p[sh[2 * i + 1]] * wt[2 * i + 1];
      o[i] = uint8_t((v + kHalf) >> kWeightBits);
    }
  }
}

#ifdef FEEDLINE_BILINEAR_X86
// Dispatched by hand (as SplitMirrored in geometry.cc), not with target_clones: an ifunc
// resolver runs before a sanitizer's runtime is up.

__attribute__((target("avx2"))) void VerticalAvx2(const uint8_t* r0, const uint8_t* r1, int w1,
                                                  size_t n, uint8_t* out) {
  const __m256i w = _mm256_set1_epi16(int16_t((w1 << 8) | (kOne - w1)));
  const __m256i half = _mm256_set1_epi16(kHalf);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + i));
    // Unpack and pack both work within 128-bit lanes, so the bytes come back in order.
    __m256i lo = _mm256_maddubs_epi16(_mm256_unpacklo_epi8(a, b), w);
    __m256i hi = _mm256_maddubs_epi16(_mm256_unpackhi_epi8(a, b), w);
    lo = _mm256_srli_epi16(_mm256_add_epi16(lo, half), kWeightBits);
    hi = _mm256_srli_epi16(_mm256_add_epi16(hi, half), kWeightBits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_packus_epi16(lo, hi));
  }
  VerticalScalar(r0 + i, r1 + i, w1, n - i, out + i);
}

// Byte-shuffle masks (0x80: a zero byte) between 16 RGB pixels in three 16-byte vectors and
// their three 16-byte planes.
struct ShuffleMasks {
  alignas(16) uint8_t split[3][3][16];  // [channel][vector][plane byte]: that byte's source
  alignas(16) uint8_t merge[3][3][16];  // [channel][vector][vector byte]: its plane byte
  ShuffleMasks() {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 3; ++v) {
        for (int i = 0; i < 16; ++i) {
          const int at = 3 * i + c;  // plane byte i of channel c, in the interleaved bytes
          split[c][v][i] = at / 16 == v ? uint8_t(at % 16) : uint8_t(0x80);
          const int b = 16 * v + i;  // interleaved byte i of vector v
          merge[c][v][i] = b % 3 == c ? uint8_t(b / 3) : uint8_t(0x80);
        }
      }
    }
  }
};
const ShuffleMasks& Masks() {
  static const ShuffleMasks masks;
  return masks;
}

__attribute__((target("avx2"))) void SplitAvx2(const uint8_t* rgb, int w, uint8_t* p0, uint8_t* p1,
                                               uint8_t* p2) {
  const ShuffleMasks& sm = Masks();
  __m128i m[3][3];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 3; ++v) {
      m[c][v] = _mm_load_si128(reinterpret_cast<const __m128i*>(sm.split[c][v]));
    }
  }
  uint8_t* planes[3] = {p0, p1, p2};
  int x = 0;
  for (; x + 16 <= w; x += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgb + 3 * x + 32));
    for (int ch = 0; ch < 3; ++ch) {
      const __m128i v =
          _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m[ch][0]), _mm_shuffle_epi8(b, m[ch][1])),
                       _mm_shuffle_epi8(c, m[ch][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[ch] + x), v);
    }
  }
  SplitScalar(rgb + 3 * x, w - x, p0 + x, p1 + x, p2 + x);
}

__attribute__((target("avx2"))) void MergeAvx2(const uint8_t* p0, const uint8_t* p1,
                                               const uint8_t* p2, int w, uint8_t* rgb) {
  const ShuffleMasks& sm = Masks();
  __m128i m[3][3];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 3; ++v) {
      m[c][v] = _mm_load_si128(reinterpret_cast<const __m128i*>(sm.merge[c][v]));
    }
  }
  int x = 0;
  for (; x + 16 <= w; x += 16) {
    const __m128i r = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + x));
    const __m128i g = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + x));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + x));
    for (int v = 0; v < 3; ++v) {
      const __m128i out =
          _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(r, m[0][v]), _mm_shuffle_epi8(g, m[1][v])),
                       _mm_shuffle_epi8(b, m[2][v]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(rgb + 3 * x + 16 * v), out);
    }
  }
  MergeScalar(p0 + x, p1 + x, p2 + x, w - x, rgb + 3 * x);
}

__attribute__((target("avx2"))) void AverageRowsAvx2(const uint8_t* r0, const uint8_t* r1, size_t n,
                                                     uint8_t* out) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_avg_epu8(a, b));
  }
  AverageRowsScalar(r0 + i, r1 + i, n - i, out + i);
}

__attribute__((target("avx2"))) void HalvePlaneAvx2(uint8_t* p, int w) {
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i one16 = _mm256_set1_epi16(1);
  int j = 0;
  // 32 inputs -> 16 outputs; the outputs land at or before the inputs already read.
  for (; 2 * j + 32 <= w; j += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * j));
    __m256i sums = _mm256_maddubs_epi16(v, ones);  // p[2j] + p[2j+1], 16-bit
    sums = _mm256_srli_epi16(_mm256_add_epi16(sums, one16), 1);
    const __m128i packed =
        _mm_packus_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + j), packed);
  }
  HalvePlaneFrom(p, j, w);
}

__attribute__((target("avx2"))) void HorizontalAvx2(const uint8_t* plane, int out_w,
                                                    const BilinearScratch& s, uint8_t* out) {
  const int blocks = int(s.base.size());
  const __m128i half = _mm_set1_epi16(kHalf);
  for (int b = 0; b < blocks; ++b) {
    const __m128i in = _mm_loadu_si128(reinterpret_cast<const __m128i*>(plane + s.base[size_t(b)]));
    const __m128i sh =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(&s.shuffle[size_t(b) * 16]));
    const __m128i wt =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(&s.weights[size_t(b) * 16]));
    __m128i v = _mm_maddubs_epi16(_mm_shuffle_epi8(in, sh), wt);
    v = _mm_srli_epi16(_mm_add_epi16(v, half), kWeightBits);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + std::min(8 * b, out_w - 8)),
                     _mm_packus_epi16(v, v));
  }
}

bool UseAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && g_simd.load(std::memory_order_relaxed);
}
#else
bool UseAvx2() { return false; }
#endif

// The passes, plain or SIMD, chosen once per call.
struct Passes {
  void (*vertical)(const uint8_t*, const uint8_t*, int, size_t, uint8_t*);
  void (*average_rows)(const uint8_t*, const uint8_t*, size_t, uint8_t*);
  void (*split)(const uint8_t*, int, uint8_t*, uint8_t*, uint8_t*);
  void (*halve)(uint8_t*, int);
  void (*horizontal)(const uint8_t*, int, const BilinearScratch&, uint8_t*);
  void (*merge)(const uint8_t*, const uint8_t*, const uint8_t*, int, uint8_t*);
};
Passes PickPasses() {
#ifdef FEEDLINE_BILINEAR_X86
  if (UseAvx2()) {
    return Passes{&VerticalAvx2,   &AverageRowsAvx2, &SplitAvx2,
                  &HalvePlaneAvx2, &HorizontalAvx2,  &MergeAvx2};
  }
#endif
  return Passes{&VerticalScalar,   &AverageRowsScalar, &SplitScalar,
                &HalvePlaneScalar, &HorizontalScalar,  &MergeScalar};
}

}  // namespace

void SetBilinearSimd(bool enabled) { g_simd.store(enabled, std::memory_order_relaxed); }

bool BilinearResize(const uint8_t* src, int src_w, int src_h, size_t stride, int out_w, int out_h,
                    bool flip, bool planar, uint8_t* dst, BilinearScratch* s) {
  if (out_w < 8 || out_h < 1 || src_w < 1 || src_h < 1) return false;
  const double shrink_x = double(src_w) / out_w, shrink_y = double(src_h) / out_h;
  if (shrink_x > kBilinearResizeShrinkMax || shrink_y > kBilinearResizeShrinkMax) return false;
  // An axis that shrinks more than kBilinearShrinkMax is first averaged 2:1 (a box filter):
  // bilinear alone would skip inputs there.
  const bool halve_x = shrink_x > kBilinearShrinkMax, halve_y = shrink_y > kBilinearShrinkMax;
  const int in_w = halve_x ? src_w / 2 : src_w, in_h = halve_y ? src_h / 2 : src_h;
  if (!HorizontalTables(in_w, double(src_w) / (halve_x ? 2.0 : 1.0) / out_w, out_w, flip, s)) {
    return false;
  }
  const Passes passes = PickPasses();
  const size_t n = size_t(src_w) * 3;
  // Each input plane row is padded so that a block's 16-byte load past its inputs stays inside.
  const size_t in_stride = size_t(src_w) + 16;
  s->row.resize(n * (halve_y ? 3 : 1));
  s->planes.resize(3 * in_stride + (planar ? 0 : 3 * size_t(out_w)));
  uint8_t* in[3] = {s->planes.data(), s->planes.data() + in_stride,
                    s->planes.data() + 2 * in_stride};
  uint8_t* blend = s->row.data();
  uint8_t* half0 = halve_y ? blend + n : nullptr;
  uint8_t* half1 = halve_y ? blend + 2 * n : nullptr;
  // Output rows: planar, straight into dst's planes; interleaved, through three plane rows.
  const size_t plane_size = planar ? size_t(out_w) * size_t(out_h) : 0;
  uint8_t* merge_from = s->planes.data() + 3 * in_stride;
  const double scale_y = double(src_h) / (halve_y ? 2.0 : 1.0) / out_h;
  for (int y = 0; y < out_h; ++y) {
    const Tap t = SampleAt(y, scale_y, in_h);
    // The two input rows (of the 2:1 averaged image when halve_y).
    const uint8_t* r0 = src + size_t(t.k) * stride;
    const uint8_t* r1 = t.w1 > 0 ? r0 + stride : nullptr;
    if (halve_y) {
      const uint8_t* top = src + size_t(2 * t.k) * stride;
      passes.average_rows(top, top + stride, n, half0);
      r0 = half0;
      if (t.w1 > 0) {
        passes.average_rows(top + 2 * stride, top + 3 * stride, n, half1);
        r1 = half1;
      }
    }
    const uint8_t* rgb = r0;  // a whole row needs no blend
    if (t.w1 > 0) {
      passes.vertical(r0, r1, t.w1, n, blend);
      rgb = blend;
    }
    passes.split(rgb, src_w, in[0], in[1], in[2]);
    uint8_t* out[3];
    for (int c = 0; c < 3; ++c) {
      out[c] = planar ? dst + c * plane_size + size_t(y) * size_t(out_w)
                      : merge_from + size_t(c) * size_t(out_w);
      if (halve_x) passes.halve(in[c], src_w);
      passes.horizontal(in[c], out_w, *s, out[c]);
    }
    if (!planar) passes.merge(out[0], out[1], out[2], out_w, dst + size_t(y) * out_w * 3);
  }
  return true;
}

}  // namespace feedline
