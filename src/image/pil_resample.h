// Pillow's antialiased bilinear resize (`Image.resize(size, BILINEAR)`, what torchvision's
// `Resize` does to a PIL image), reproduced bit for bit, for a window of the output only.
//
// Pillow resizes in two separable passes, horizontal first, each through an 8-bit image:
// output position x takes the input pixels within `support` of its centre
// c = (x + 0.5) * in / out, where support = max(in / out, 1) (the triangle filter widened by
// the shrink factor, which makes it antialiased), weighted by the triangle filter at the
// pixel's distance / max(in / out, 1), normalised to sum 1, then rounded to 22-bit fixed point;
// each output is the rounded, clamped fixed-point sum. Every output pixel depends on its own
// coordinates only, so a window of the output (the centre crop) is computed exactly without
// the rest: a thin image whose resized form would be gigabytes costs only its window.
//
// Thread safety: pure functions; the scratch is the caller's (one per worker).
#ifndef FEEDLINE_SRC_IMAGE_PIL_RESAMPLE_H_
#define FEEDLINE_SRC_IMAGE_PIL_RESAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace feedline {

// Fixed-point weights for output positions [first, first + count) of a resize of `in_size`
// pixels to `out_size`: output i reads inputs [start[i], start[i] + taps[i]) with weights
// weights[i * ksize + t].
struct PilAxis {
  int ksize = 0;
  std::vector<int> start, taps;
  std::vector<int32_t> weights;
  int first_input() const { return start.empty() ? 0 : start.front(); }
  int end_input() const { return start.empty() ? 0 : start.back() + taps.back(); }
};
void PilBilinearAxis(int64_t in_size, int64_t out_size, int64_t first, int count, PilAxis* axis);

struct PilScratch {
  PilAxis x, y;
  std::vector<uint8_t> rows;  // the horizontal pass's output
  std::vector<int32_t> acc;   // the vertical pass's sums for one row
};

// Writes the window [x0, x0 + w) x [y0, y0 + h) of `src` (src_w x src_h RGB, `stride` bytes a
// row) resized to out_w x out_h, into `dst` (RGB, `dst_stride` bytes a row). Only the source
// rows the window needs are read: rows below `rows_available` must not be needed (the caller
// decoded up to PilRowsNeeded).
void PilResizeWindow(const uint8_t* src, int src_w, int src_h, size_t stride, int64_t out_w,
                     int64_t out_h, int64_t x0, int64_t y0, int w, int h, uint8_t* dst,
                     size_t dst_stride, PilScratch* scratch);

// Whether the passes use SSE4.1 where the CPU has it (default) or the plain loops (tests: both
// give the same bytes).
void SetPilResampleSimd(bool enabled);

// The number of source rows (from the top) a window of output rows [y0, y0 + h) reads.
int PilRowsNeeded(int src_h, int64_t out_h, int64_t y0, int h);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_PIL_RESAMPLE_H_
