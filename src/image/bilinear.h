// The train transform's resampler: bilinear interpolation of an RGB window straight into a
// batch slot, as three planes (NCHW) or interleaved (NHWC), mirrored or not.
//
// It samples where OpenCV's INTER_LINEAR samples (half-pixel centres, edges clamped), in two
// passes: vertical first, on the interleaved rows (contiguous bytes), then, after splitting the
// row into planes, horizontal on each plane, writing the output plane's row directly (a mirrored
// row is the same row with its sample positions reversed, so the flip costs nothing). Weights are
// 7-bit fixed point (1/128), each pass rounded to 8 bits: within two levels of OpenCV's 11-bit
// result (mean < 0.35 on noise, its worst case), at a third of its time (OpenCV took 85 us for
// 224x224 from 336x336 on this project's machine, the AVX2 passes here 25-35 us), which replaces
// the split-and-mirror copy after it too (NHWC interleaves each output row again: the same values
// in either layout).
//
// The horizontal pass gathers the two inputs of 8 outputs with one byte shuffle from 16
// consecutive input bytes, so it takes shrinks up to kBilinearShrinkMax. An axis that shrinks
// more (up to twice that) is first averaged 2:1 (a box filter: rows with pavgb, a plane's
// neighbours with pmaddubsw): train's crops whose long side would shrink 1.75-2.3x at 8/8
// decode there instead of at 6/8 with C IDCTs (1.06 ms against 1.29 ms for those crops, decode
// and resample). Larger shrinks (and windows narrower than 8 outputs) are left to the caller
// (`BilinearResize` returns false). The 2:1 pass averages pairs, so an odd window's last row
// or column has no pair and is left out; the sample positions stay those of the whole window
// (scale src / out), clamped to the averaged image's last pixel there: the output moves by at
// most half a source pixel at that edge.
//
// Thread safety: pure functions; the scratch is the caller's (one per worker).
#ifndef FEEDLINE_SRC_IMAGE_BILINEAR_H_
#define FEEDLINE_SRC_IMAGE_BILINEAR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace feedline {

struct BilinearScratch {
  std::vector<uint8_t> row;     // the vertical pass's output, interleaved (and the 2:1 rows)
  std::vector<uint8_t> planes;  // that row split into planes; NHWC: an output row's planes
  std::vector<int32_t> base;    // per block of 8 outputs: its first input
  std::vector<uint8_t> shuffle, weights;  // per block: 16 byte indices, 16 weights
};

// The largest shrink (input / output size, either axis) done bilinearly, here and by
// geometry.cc's OpenCV resampler; above it, area averaging (OpenCV) or BilinearResize's 2:1 box
// first (up to twice it). The bilinear pass could take up to ~1.9 (8 outputs must read at most
// 16 consecutive inputs); the limit is one of quality: bilinear without antialiasing skips
// detail beyond ~1.5x. At 1.75 rather than 1.5, train's mean difference from torchvision rose
// from 0.53 to 0.57 levels (224) and eval_fast's from 0.88 to 0.92 (64/72, real-world files),
// for ~4% of train's CPU.
inline constexpr double kBilinearShrinkMax = 1.75;

// The largest shrink BilinearResize takes: twice kBilinearShrinkMax, through its 2:1 box pass.
inline constexpr double kBilinearResizeShrinkMax = 2 * kBilinearShrinkMax;

// Resizes `src` (src_w x src_h RGB pixels, `stride` bytes a row) to out_w x out_h, mirrored
// left-right when `flip`, into `dst`: `planar`, plane c (R, G, B) at dst + c * out_w * out_h in
// rows of out_w bytes (NCHW); otherwise out_h rows of out_w RGB pixels (NHWC), the same values.
// Returns false, writing nothing, when either shrink exceeds kBilinearResizeShrinkMax or out_w
// is below 8.
bool BilinearResize(const uint8_t* src, int src_w, int src_h, size_t stride, int out_w, int out_h,
                    bool flip, bool planar, uint8_t* dst, BilinearScratch* scratch);

// Whether the passes use SSSE3/AVX2 where the CPU has them (default) or the plain loops (tests:
// both give the same bytes).
void SetBilinearSimd(bool enabled);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_BILINEAR_H_
