// feedline-bench: reference measurements that do not involve the loader.
//
//  * The full-decode limit (--compare-torch): one thread decodes every file of the data set in
//    full with libjpeg-turbo (tjDecompress2 to RGB, from memory, the files read beforehand),
//    the plain decode every JPEG loader does at least once per image unless it decodes less.
//    Times the number of cores, it is what a loader that decodes whole images cannot beat.
//  * The 1/8-scale floor: the same with tjDecompress2 at 1/8 scale (DC-only IDCT): close to the
//    entropy decoding that no JPEG decoder can skip, so the fastest any crop path can go.
//  * The pipeline-overhead data set (--source synthetic): tiny JPEGs, so that reading and
//    decoding cost next to nothing and what is measured is the pipeline itself (queues, slots,
//    threads); and what reading and decoding one of them costs on its own, to subtract.
//
// Thread safety: the functions may run concurrently; each uses its own decoder.
#ifndef FEEDLINE_BENCH_BASELINES_H_
#define FEEDLINE_BENCH_BASELINES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace feedline::bench {

struct DecodeLimit {
  int64_t images = 0;             // decoded in the timed loop, by all its threads
  int64_t bytes = 0;              // compressed bytes held in memory
  double seconds = 0;             // wall time of the loop
  double thread_cpu_seconds = 0;  // summed over the threads
  double megapixels = 0;          // decoded
  int cores = 1;
  int threads = 1;  // decoding at once
  double images_per_s() const { return seconds > 0 ? double(images) / seconds : 0; }
  double single_thread_images_per_s() const { return images_per_s() / threads; }
  double limit_images_per_s() const { return cores * single_thread_images_per_s(); }
  double cpu_seconds_per_image() const {
    return images > 0 ? thread_cpu_seconds / double(images) : 0;
  }
};

// Reads every file once (into a small reused buffer), so that the page cache holds them before
// anything is timed. Returns the bytes read.
absl::StatusOr<int64_t> WarmPageCache(const std::vector<std::string>& files);

// Reads `files` into memory, decodes a few untimed (warm-up), then times one full decode of
// each on this thread. Files that are not JPEGs, or that fail to decode, are an error (the
// limit would be meaningless without them). `cores` multiplies the single-thread rate.
// `eighths` < 8 decodes at that scale (1 = 1/8: the floor).
absl::StatusOr<DecodeLimit> MeasureDecodeLimit(const std::vector<std::string>& files, int cores,
                                               int eighths = 8);

// The same decodes on `cores` threads at once, each decoding every file (after its own warm-up):
// what the machine gives when all its cores decode, as a loader's workers do. On a VM whose
// cores slow each other down (shared caches, memory bandwidth, a host's sibling threads) this is
// below cores x one thread.
absl::StatusOr<DecodeLimit> MeasureDecodeAllCores(const std::vector<std::string>& files, int cores,
                                                  int eighths = 8);

// The pipeline-overhead data set: `distinct` 8 x 8 JPEGs and a list file naming them over and
// over, `samples` lines in all, in `dir` (made once; a complete set there is reused). Returns
// the list file's path.
absl::StatusOr<std::string> EnsureTinyDataset(const std::string& dir, int distinct,
                                              int64_t samples);

struct TinyCost {
  int64_t samples = 0;
  double seconds = 0;  // wall, one thread
  double seconds_per_sample() const { return samples > 0 ? seconds / double(samples) : 0; }
};

// What one thread spends per sample to open, read and close the file and decode it fully
// (tjDecompress2), without any pipeline, over the first `samples` entries of `files` (cycled).
absl::StatusOr<TinyCost> MeasureReadAndDecode(const std::vector<std::string>& files,
                                              int64_t samples);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_BASELINES_H_
