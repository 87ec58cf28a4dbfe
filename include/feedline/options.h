// feedline — loader options.
//
// One struct holds every option of a loader. Each field documents its default and meaning. The
// engine's options (sampling, resources, caching, robustness, device) apply to every loader;
// the groups marked "image built-in" only to `Loader::Create(LoaderOptions)`.
// Fields that say "auto" (0 for the counts and sizes) are resolved once, when the loader is
// created; `Loader::options()` returns them resolved, the autotuner then moves them.
//
// The fluent setters mirror `torch::data::DataLoaderOptions`:
//   feedline::LoaderOptions().batch_size(256).workers(4).transform(feedline::Transform::kEval)
//
// Thread safety: a plain value type; copy it freely, do not share a mutable one across threads.
#ifndef FEEDLINE_OPTIONS_H_
#define FEEDLINE_OPTIONS_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "feedline/schema.h"

namespace feedline {

enum class Transform {
  kTrain,  // RandomResizedCrop(size, scale, ratio) + horizontal flip (p = 0.5 when `flip`)
  kEval,   // Resize(resize_size, shorter side, antialiased) + CenterCrop(size)
};

enum class Layout { kNCHW, kNHWC };

enum class Cache {
  kNone,
  kBytes,    // file contents in RAM (slow storage: later epochs read from memory)
  kDecoded,  // decoded images, shorter side bounded by kDecodedCacheScale * size (later epochs
             // skip decode; crops then come from that bounded image)
};

// The decoded cache keeps images with their shorter side at most this many times `size`.
inline constexpr int kDecodedCacheScale = 2;

enum class OnError {
  kRaise,  // the consumer gets the error (with the file and the cause) at the batch it belongs to
  kSkip,   // the sample is replaced by another one of the same epoch; the error is counted
};

// Sentinel for "choose automatically" in the count options.
inline constexpr int kAuto = 0;

// Declares a field with a getter `name()` and a fluent setter `name(v)`, as torch's TORCH_ARG.
#define FEEDLINE_ARG(T, name, default_value)         \
 public:                                             \
  LoaderOptions& name(T v)& {                        \
    name##_ = std::move(v);                          \
    return *this;                                    \
  }                                                  \
  LoaderOptions&& name(T v)&& {                      \
    name##_ = std::move(v);                          \
    return std::move(*this);                         \
  }                                                  \
  const T& name() const noexcept { return name##_; } \
                                                     \
 private:                                            \
  T name##_ = default_value

class LoaderOptions {
 public:
  LoaderOptions() = default;
  explicit LoaderOptions(std::string source) : source_(std::move(source)) {}

  // --- Data (image built-in) ----------------------------------------------------------------
  // An ImageFolder directory (one sub-folder per class, torchvision's order), or a list file of
  // "path label" lines (paths relative to the list file's folder). Required.
  FEEDLINE_ARG(std::string, source, "");
  // WebDataset tar shards, given as paths (a brace pattern such as
  // "d/train-{000000..000099}.tar" may also be given as `source`). Takes precedence.
  FEEDLINE_ARG(std::vector<std::string>, shards, {});

  // --- Sampling -----------------------------------------------------------------------------
  FEEDLINE_ARG(int64_t, batch_size, 256);  // samples per batch, >= 1
  FEEDLINE_ARG(bool, shuffle, true);       // a fresh permutation per epoch, from (seed, epoch)
  FEEDLINE_ARG(uint64_t, seed, 0);         // the only source of randomness (order, crops, flips)
  FEEDLINE_ARG(bool, drop_last, false);    // drop the last, incomplete batch
  FEEDLINE_ARG(int, rank, 0);              // this process's shard (DistributedSampler semantics)
  FEEDLINE_ARG(int, world_size, 1);        // shards; every rank gets the same number of batches

  // --- Transform (image built-in) -----------------------------------------------------------
  FEEDLINE_ARG(Transform, transform, Transform::kTrain);
  FEEDLINE_ARG(int, size, 224);         // output height = width
  FEEDLINE_ARG(int, resize_size, 256);  // eval: shorter side before the centre crop
  using Range = std::pair<double, double>;
  FEEDLINE_ARG(Range, scale, Range(0.08, 1.0));             // train: crop area fraction
  FEEDLINE_ARG(Range, ratio, Range(3.0 / 4.0, 4.0 / 3.0));  // train: crop aspect ratio
  FEEDLINE_ARG(bool, flip, true);                           // train: horizontal flip, p = 0.5

  // --- Output (image built-in, except `device`) ---------------------------------------------
  FEEDLINE_ARG(Layout, layout, Layout::kNCHW);
  // uint8, or a float type (float32, float16, bfloat16): normalised, (x / 255 - mean) / std.
  FEEDLINE_ARG(DType, dtype, DType::kUint8);
  using Triple = std::array<double, 3>;
  FEEDLINE_ARG(Triple, mean, (Triple{0.485, 0.456, 0.406}));    // float dtypes: in 0..1 units
  FEEDLINE_ARG(Triple, stddev, (Triple{0.229, 0.224, 0.225}));  // float dtypes: in 0..1 units
  // "cpu", or "cuda" / "cuda:N": batches are copied to that GPU on a dedicated stream and
  // converted there (uint8 crosses PCIe, 4x fewer bytes than float32). Needs a CUDA build and a
  // GPU with a driver; otherwise Loader::Create fails with kFailedPrecondition, at once.
  FEEDLINE_ARG(std::string, device, "cpu");

  // --- Resources (kAuto = chosen by the loader) ---------------------------------------------
  FEEDLINE_ARG(int, workers, kAuto);   // decoder threads
  FEEDLINE_ARG(int, prefetch, kAuto);  // batches in flight: the prefetch ring's depth
  FEEDLINE_ARG(int, io_depth, kAuto);  // reads in flight: the reader threads
  // Bytes the loader may own (ring slots, reads in flight); 0 = auto, a quarter of the
  // available memory. Batches the user holds are the user's memory, not counted.
  FEEDLINE_ARG(int64_t, memory_budget, 0);

  // --- Caching ------------------------------------------------------------------------------
  FEEDLINE_ARG(Cache, cache, Cache::kNone);
  // Bytes the cache may hold; 0 = auto: what the memory budget leaves after the ring and the
  // reads in flight. Counted in the memory budget.
  FEEDLINE_ARG(int64_t, cache_budget, 0);

  // --- Robustness ---------------------------------------------------------------------------
  FEEDLINE_ARG(OnError, on_error, OnError::kRaise);
  // Under kSkip, more failed samples than this turn into an error at the next batch (a flood of
  // failures means a broken data set or mount, not a few bad files). 0 = no limit.
  FEEDLINE_ARG(int64_t, max_errors, 0);
  // A read that takes longer fails with kDeadlineExceeded (then follows on_error); the stuck
  // reader thread is abandoned and replaced, so hung storage cannot hang the loader. 0 = none.
  FEEDLINE_ARG(double, read_timeout_ms, 60000.0);
  // Images with more pixels are refused before any pixel memory is allocated (PIL's limit).
  FEEDLINE_ARG(int64_t, max_image_pixels, 178956970);

  // --- Benchmarking -------------------------------------------------------------------------
  // Adds this many milliseconds to every read, simulating remote storage (network file systems,
  // object stores). 0 = off.
  FEEDLINE_ARG(double, simulated_read_latency_ms, 0.0);
  // Pre-decoded samples: no read and no decode; each sample is filled with a constant derived
  // from its index. Measures what the pipeline itself costs (queues, slots, collation).
  FEEDLINE_ARG(bool, synthetic, false);

 public:
  LoaderOptions& scale(double lo, double hi) & { return scale(Range(lo, hi)); }
  LoaderOptions&& scale(double lo, double hi) && { return std::move(scale(Range(lo, hi))); }
  LoaderOptions& ratio(double lo, double hi) & { return ratio(Range(lo, hi)); }
  LoaderOptions&& ratio(double lo, double hi) && { return std::move(ratio(Range(lo, hi))); }

  // A copy of these options with `source` replaced.
  LoaderOptions with_source(std::string s) const {
    LoaderOptions o = *this;
    o.source_ = std::move(s);
    return o;
  }
};

#undef FEEDLINE_ARG

}  // namespace feedline

#endif  // FEEDLINE_OPTIONS_H_
