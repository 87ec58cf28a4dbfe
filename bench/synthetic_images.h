// feedline — synthetic, photo-like JPEG images for benchmarks and tests.
//
// A benchmark of a JPEG pipeline is only as honest as its images: flat colours and plain
// gradients decode several times faster than photographs, because almost all of their DCT
// coefficients are zero. The images made here have what makes photos expensive to decode:
// low-frequency colour structure at several scales, sharp object edges, and fine texture and
// grain, so that their file sizes and decode costs resemble ImageNet's.
//
//   std::vector<uint8_t> rgb = feedline::bench::MakePhotoLikeImage(500, 375, /*seed=*/7);
//   // At q90, 4:2:0: typically 40-230 KB, ~100 KB on average, as ImageNet's images.
//   absl::StatusOr<std::string> jpeg =
//       feedline::bench::EncodeJpeg(rgb.data(), 500, 375, /*quality=*/90, /*subsample444=*/false);
//
//   // An ImageFolder of 10 classes x 200 images, made once (a second call is a no-op):
//   absl::Status s = feedline::bench::MakeImageFolder("/tmp/data", 10, 200, /*seed=*/1);
//
// Everything is deterministic: with the same build, the same arguments give the same bytes on
// every run and at every thread count. The random numbers come from a fixed generator, never
// from <random>'s distributions (whose output differs between standard libraries); other
// platforms may still differ in a few pixels (libm rounding) and in the encoder's output
// (libjpeg-turbo versions), so tests should not hard-code hashes of these files.
//
// Thread safety: all functions are safe to call concurrently from any threads (they share no
// state). Concurrent `MakeImageFolder` calls for the same directory, from threads or processes,
// are safe too: one of them makes the folder, and the others return OK once it exists.
#ifndef FEEDLINE_BENCH_SYNTHETIC_IMAGES_H_
#define FEEDLINE_BENCH_SYNTHETIC_IMAGES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace feedline::bench {

// Encodes a packed RGB image (HWC, `w * h * 3` bytes, rows unpadded) as a JPEG (baseline
// Huffman unless `progressive`).
//   quality:      1..100 (libjpeg's scale).
//   subsample444: true: 4:4:4 (no chroma subsampling); false: 4:2:0, the usual camera setting.
//   progressive:  a progressive JPEG instead of a baseline one.
//   grayscale:    a one-component JPEG made from the image's luminance (`subsample444` is
//                 then irrelevant).
// Errors: kInvalidArgument (bad size or quality, null pixels), kInternal (libjpeg-turbo failed).
absl::StatusOr<std::string> EncodeJpeg(const uint8_t* rgb, int w, int h, int quality,
                                       bool subsample444, bool progressive = false,
                                       bool grayscale = false);

// A w x h photo-like RGB image (HWC, `w * h * 3` bytes), a pure function of (w, h, seed,
// grain). Content: a smooth colour field (coarse octaves of value noise), random shapes with
// soft edges, their own shading and their own texture strength painted over it, fine detail
// (octaves from 24 px down to 1.5 px, in brightness, as in photographs) and per-pixel grain.
// About 5-7 ms for 500 x 375 at -O2. `grain` scales the per-pixel noise: 1 is the amplitude
// tuned for ImageNet-like file sizes, 0 gives cleaner (smaller, faster to decode) images.
// Returns an empty vector unless 1 <= w, h <= 16384.
std::vector<uint8_t> MakePhotoLikeImage(int w, int h, uint64_t seed, double grain = 1.0);

// Called with (images written, images in total); see MakeImageFolder for when.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Writes an ImageNet-like ImageFolder: `dir/class_XX/img_XXXXX.JPEG` (XX zero-padded to at
// least 2 digits, XXXXX the image's index within its class, at least 5 digits), `per_class`
// images in each of `num_classes` classes. Like ImageNet's training set: mostly landscape
// 500 x 375 / 500 x 333 and other sizes with widths ~300-700, about a fifth portrait;
// quality 85..95; 4:2:0 with ~15% 4:4:4; about 100 KB per file on average.
//
// The folder appears atomically: images are written into a sibling temporary directory that is
// renamed to `dir` when complete, with a marker file `dir/.complete` that records the
// parameters. If `dir` already holds a complete folder made with the same parameters, nothing
// is done (so callers can call this unconditionally); if it holds anything else (other
// parameters, or files not made by this function), the result is kFailedPrecondition and
// nothing is touched. An empty `dir` is replaced. When two callers race, the first rename wins
// and the other discards its own copy and returns OK.
//
// The work is spread over the machine's cores. `progress`, if set, is called from the calling
// thread only (never concurrently), at least once at the end, with the images written so far.
// Errors: kInvalidArgument (counts < 1 or too large), kFailedPrecondition (see above), and the
// file system's errors (kPermissionDenied, kResourceExhausted for a full disk, ...) naming the
// path; on error the temporary directory is removed.
absl::Status MakeImageFolder(const std::string& dir, int num_classes, int per_class, uint64_t seed,
                             const ProgressFn& progress = nullptr);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_SYNTHETIC_IMAGES_H_
