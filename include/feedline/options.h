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
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "feedline/schema.h"

namespace feedline {

enum class Transform {
  kTrain,     // RandomResizedCrop(size, scale, ratio) + horizontal flip (p = 0.5 when `flip`)
  kEval,      // Resize(resize_size, shorter side, antialiased) + CenterCrop(size), bit for bit as
              // torchvision on PIL: full-resolution decode, Pillow's bilinear filter
  kEvalFast,  // the same geometry from a reduced (DCT-scaled) decode with an approximate
              // filter: ~2x faster, within a few levels of kEval (docs/guide.md: figures)
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

// Largest ring depth (batches in flight); the memory budget usually bounds it far lower.
inline constexpr int kMaxPrefetch = 64;

// Which loaders an option applies to: every loader (the engine), or the image built-in.
enum class OptionGroup { kEngine, kImage };

// A range an option's value must be in (numbers only); checked by ValidateOptions, with the
// message given or one made from the range.
struct OptionCheck {
  enum Kind { kNone, kAtLeast, kIn, kAutoOrIn };
  Kind kind = kNone;
  double lo = 0, hi = 0;
  const char* message = nullptr;  // null: "must be >= lo", "must be in [lo, hi]", ...
};
inline constexpr OptionCheck NoCheck() { return {}; }
inline constexpr OptionCheck AtLeast(double lo, const char* message = nullptr) {
  return {OptionCheck::kAtLeast, lo, 0, message};
}
inline constexpr OptionCheck In(double lo, double hi, const char* message = nullptr) {
  return {OptionCheck::kIn, lo, hi, message};
}
inline constexpr OptionCheck AutoOrIn(double lo, double hi) {  // kAuto (0) or [lo, hi]
  return {OptionCheck::kAutoOrIn, lo, hi, nullptr};
}

// What ForEachOption tells a visitor about an option besides its value.
struct OptionInfo {
  const char* name;
  OptionGroup group;
  OptionCheck check;
  const char* doc;  // one line for users (the bindings' docstrings, help())
};

// Declares an option once: its field, getter `name()` and fluent setter `name(v)` (as torch's
// TORCH_ARG), and its entry in the list that ForEachOption walks — which validation
// (ValidateOptions), the bindings' keyword arguments and their docstrings (python/py_options.h)
// and the declarations Python checks its faces and help() against
// (_feedline.option_declarations) come from. `doc` is the option's line for users.
// Each option gets the index __COUNTER__ - kFirstOption, so the list is the declarations'
// order.
#define FEEDLINE_ARG(group, T, name, default_value, check, doc)                          \
 public:                                                                                 \
  LoaderOptions& name(T v)& {                                                            \
    name##_ = std::move(v);                                                              \
    return *this;                                                                        \
  }                                                                                      \
  LoaderOptions&& name(T v)&& {                                                          \
    name##_ = std::move(v);                                                              \
    return std::move(*this);                                                             \
  }                                                                                      \
  const T& name() const noexcept { return name##_; }                                     \
                                                                                         \
 private:                                                                                \
  template <typename O, typename V>                                                      \
  static void VisitOption(std::integral_constant<int, __COUNTER__ - kFirstOption>, O& o, \
                          V& visit) {                                                    \
    visit(OptionInfo{#name, OptionGroup::group, check, doc}, o.name##_);                 \
  }                                                                                      \
  T name##_ = default_value

class LoaderOptions {
  static constexpr int kFirstOption = __COUNTER__ + 1;

 public:
  LoaderOptions() = default;
  explicit LoaderOptions(std::string source) : source_(std::move(source)) {}

  // --- Data (image built-in) ----------------------------------------------------------------
  FEEDLINE_ARG(kImage, std::string, source, "", NoCheck(),
               "an ImageFolder directory (a sub-folder per class), a list file of \"path label\" "
               "lines, or WebDataset shards as a brace pattern; paths may be http(s):// or s3:// "
               "URLs. Required");
  FEEDLINE_ARG(kImage, std::vector<std::string>, shards, {}, NoCheck(),
               "WebDataset tar shards, as paths or URLs; takes precedence over source");

  // --- Sampling -----------------------------------------------------------------------------
  FEEDLINE_ARG(kEngine, int64_t, batch_size, 256, AtLeast(1), "samples per batch");
  FEEDLINE_ARG(kEngine, bool, shuffle, true, NoCheck(),
               "a fresh permutation per epoch, from (seed, epoch)");
  FEEDLINE_ARG(kEngine, uint64_t, seed, 0, NoCheck(),
               "the only source of randomness: order, crops, flips");
  FEEDLINE_ARG(kEngine, bool, drop_last, false, NoCheck(), "drop the last, incomplete batch");
  FEEDLINE_ARG(kEngine, int, rank, 0, NoCheck(),
               "this process's shard (DistributedSampler's semantics)");
  FEEDLINE_ARG(kEngine, int, world_size, 1, AtLeast(1),
               "shards; every rank gets the same number of batches");
  FEEDLINE_ARG(kEngine, bool, even_shards, true, NoCheck(),
               "pad the order to equal shards; false (evaluation): each sample once over all "
               "ranks, which may then differ by one sample, and so by one batch");

  // --- Transform (image built-in) -----------------------------------------------------------
  FEEDLINE_ARG(kImage, Transform, transform, Transform::kTrain, NoCheck(),
               "train: RandomResizedCrop + flip; eval: Resize + CenterCrop (torchvision's pixels); "
               "eval_fast: eval from a reduced decode");
  FEEDLINE_ARG(kImage, int, size, 224, In(1, 16384), "output height = width");
  FEEDLINE_ARG(kImage, int, resize_size, 256, In(1, 16384),
               "eval: the shorter side before the centre crop");
  using Range = std::pair<double, double>;
  FEEDLINE_ARG(kImage, Range, scale, Range(0.08, 1.0), NoCheck(), "train: crop area fraction");
  FEEDLINE_ARG(kImage, Range, ratio, Range(3.0 / 4.0, 4.0 / 3.0), NoCheck(),
               "train: crop aspect ratio");
  FEEDLINE_ARG(kImage, bool, flip, true, NoCheck(), "train: horizontal flip, p = 0.5");

  // --- Output (image built-in, except `device`) ---------------------------------------------
  FEEDLINE_ARG(kImage, Layout, layout, Layout::kNCHW, NoCheck(), "NCHW or NHWC");
  FEEDLINE_ARG(kImage, DType, dtype, DType::kUint8, NoCheck(),
               "uint8, or float32 / float16 / bfloat16: normalised, (x / 255 - mean) / std");
  using Triple = std::array<double, 3>;
  FEEDLINE_ARG(kImage, Triple, mean, (Triple{0.485, 0.456, 0.406}), NoCheck(),
               "float dtypes: per channel, in 0..1 units");
  FEEDLINE_ARG(kImage, Triple, stddev, (Triple{0.229, 0.224, 0.225}), NoCheck(),
               "float dtypes: per channel, in 0..1 units (Python: std)");
  // A GPU gets uint8 over PCIe (4x fewer bytes than float32) and converts there. Needs a CUDA
  // build and a GPU with a driver; otherwise Loader::Create fails with kFailedPrecondition.
  FEEDLINE_ARG(kEngine, std::string, device, "cpu", NoCheck(),
               "cpu, or cuda / cuda:N: batches are copied to that GPU on a stream of their own "
               "and converted there");

  // --- Resources (kAuto = chosen by the loader) ---------------------------------------------
  FEEDLINE_ARG(kEngine, int, workers, kAuto, AutoOrIn(1, 1024),
               "map workers: the threads that run the transform (decode, tokenize); auto: tuned");
  FEEDLINE_ARG(kEngine, int, prefetch, kAuto, AutoOrIn(1, kMaxPrefetch),
               "batches in flight: the prefetch ring's depth; auto: tuned");
  FEEDLINE_ARG(kEngine, int, io_depth, kAuto, AutoOrIn(1, 1024), "reads in flight; auto: tuned");
  // Without it a training step's CPU part stretched 1.6x beside two decoding workers on two
  // cores (feedline-bench --e2e). Not applied to a transform whose workers hold the consumer's
  // locks (SampleTransform::SharesConsumerLocks: Python code under the GIL).
  FEEDLINE_ARG(kEngine, int, worker_nice, 19, In(0, 19),
               "nice levels the map workers run below the process, so that the training thread "
               "gets a core first (FEEDLINE_WORKER_NICE overrides it)");
  // Once every batch of an epoch is made, the workers go on with epoch + 1 (within the prefetch
  // bound, counting the batches not yet taken). Iterating another epoch (set_epoch, LoadState)
  // drops that head start. Off for a transform that says it may not start ahead
  // (SampleTransform::MayStartAhead: the tokenizers, which count cuts), and until the transform
  // says it may start that epoch (SampleTransform::MayStartEpoch: feedline.DataLoader, once the
  // next sampler order is drawn ahead). stats() counts the head start's work (reads, errors,
  // cache hits) when it is done.
  FEEDLINE_ARG(kEngine, bool, epoch_head_start, true, NoCheck(),
               "start the next epoch's first batches before it is asked for, so that iterating "
               "it does not wait (FEEDLINE_EPOCH_HEAD_START=0 turns it off)");
  FEEDLINE_ARG(kEngine, int64_t, memory_budget, 0, AtLeast(0, "must be auto (0) or a byte count"),
               "bytes the loader may own (ring slots, reads in flight, the cache); 0: auto, a "
               "quarter of the available memory. Batches the user holds are the user's");

  // --- Caching ------------------------------------------------------------------------------
  FEEDLINE_ARG(kEngine, Cache, cache, Cache::kNone, NoCheck(),
               "none; bytes: records in RAM (slow storage); decoded (images): decoded images, "
               "so later epochs skip the decode");
  FEEDLINE_ARG(kEngine, int64_t, cache_budget, 0, AtLeast(0, "must be auto (0) or a byte count"),
               "bytes the cache may hold, within the memory budget; 0: auto, what the budget "
               "leaves after the ring and the reads");

  // --- Robustness ---------------------------------------------------------------------------
  FEEDLINE_ARG(kEngine, OnError, on_error, OnError::kRaise, NoCheck(),
               "raise: a bad sample fails its batch, naming the file; skip: it is replaced by "
               "another sample of the epoch, and counted");
  FEEDLINE_ARG(kEngine, int64_t, max_errors, 0, AtLeast(0, "must be >= 0 (0: no limit)"),
               "under skip, more failed samples than this fail the next batch (a broken data "
               "set or mount); 0: no limit");
  // The stuck reader thread is abandoned and replaced, so hung storage cannot hang the loader.
  FEEDLINE_ARG(kEngine, double, read_timeout_ms, 60000.0, AtLeast(0, "must be >= 0 (0: none)"),
               "a read that takes longer fails (then follows on_error); 0: none (Python: "
               "read_timeout, in seconds)");
  FEEDLINE_ARG(kEngine, int64_t, max_record_bytes, int64_t{256} << 20,
               AtLeast(1, "must be a byte count >= 1"),
               "a record (a file, a URL's body, a shard member) larger than this fails (then "
               "follows on_error) before more of it is read: a body that never ends, a wrong "
               "file; the responses in flight together hold at most half the memory budget");
  FEEDLINE_ARG(kImage, int64_t, max_image_pixels, 178956970, AtLeast(1),
               "images with more pixels are refused before any pixel memory is allocated "
               "(PIL's limit)");
  FEEDLINE_ARG(kImage, bool, accept_corrupt, false, NoCheck(),
               "decode images with corrupt data (JPEG entropy damage, PNG CRC errors, truncated "
               "JPEGs) as PIL does, instead of failing them");
  FEEDLINE_ARG(kImage, bool, exif_transpose, false, NoCheck(),
               "turn each image upright by its EXIF orientation first, as PIL's "
               "ImageOps.exif_transpose");

  // --- Benchmarking -------------------------------------------------------------------------
  FEEDLINE_ARG(kEngine, double, simulated_read_latency_ms, 0.0, In(0, 60000),
               "benchmarks: add this many milliseconds to every read (remote storage)");
  FEEDLINE_ARG(kImage, bool, synthetic, false, NoCheck(),
               "benchmarks: no read and no decode, each sample a constant from its index (the "
               "pipeline's own cost)");

 public:
  LoaderOptions& scale(double lo, double hi) & { return scale(Range(lo, hi)); }
  LoaderOptions&& scale(double lo, double hi) && { return std::move(scale(Range(lo, hi))); }
  LoaderOptions& ratio(double lo, double hi) & { return ratio(Range(lo, hi)); }
  LoaderOptions&& ratio(double lo, double hi) && { return std::move(ratio(Range(lo, hi))); }

  // Calls visit(OptionInfo, field&) for every option, in declaration order.
  template <typename V>
  void ForEachOption(V&& visit) {
    ForEach(*this, visit, std::make_integer_sequence<int, kOptionCount>());
  }
  template <typename V>
  void ForEachOption(V&& visit) const {
    ForEach(*this, visit, std::make_integer_sequence<int, kOptionCount>());
  }

  // A copy of these options with `source` replaced.
  LoaderOptions with_source(std::string s) const {
    LoaderOptions o = *this;
    o.source_ = std::move(s);
    return o;
  }

 private:
  static constexpr int kOptionCount = __COUNTER__ - kFirstOption;
  template <typename O, typename V, int... I>
  static void ForEach(O& o, V& visit, std::integer_sequence<int, I...>) {
    (VisitOption(std::integral_constant<int, I>(), o, visit), ...);
  }
};

// kInvalidArgument naming the first option of `group` outside its range ("batch_size: must be
// >= 1"). Options that depend on each other (rank < world_size, scale's bounds) are checked by
// the loaders themselves.
absl::Status ValidateOptions(const LoaderOptions& options, OptionGroup group);
// The error for an option `option` that is wrong for the reason `why`: "option: why".
absl::Status InvalidOption(absl::string_view option, absl::string_view why);
// The names of the options of `group` whose values differ from their declared defaults, in
// declaration order (the generic factory refuses image options set on it with these).
std::vector<std::string> ChangedOptions(const LoaderOptions& options, OptionGroup group);
// The nice level the map workers (and feedline.DataLoader's worker processes) run at below the
// loading process: options.worker_nice(), or the environment's FEEDLINE_WORKER_NICE when set
// (kInvalidArgument naming it when it is not in [0, 19]).
absl::StatusOr<int> ResolvedWorkerNice(const LoaderOptions& options);

// The names of each enum's values, as the Python keyword arguments take them.
template <typename E>
struct EnumNames;
template <>
struct EnumNames<Transform> {
  static constexpr std::pair<const char*, Transform> kValues[] = {
      {"train", Transform::kTrain},
      {"eval", Transform::kEval},
      {"eval_fast", Transform::kEvalFast}};
};
template <>
struct EnumNames<Layout> {
  static constexpr std::pair<const char*, Layout> kValues[] = {{"NCHW", Layout::kNCHW},
                                                               {"NHWC", Layout::kNHWC}};
};
template <>
struct EnumNames<DType> {
  static constexpr std::pair<const char*, DType> kValues[] = {
      {"uint8", DType::kUint8},       {"float32", DType::kFloat32}, {"float16", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"int32", DType::kInt32},     {"int64", DType::kInt64},
      {"bytes", DType::kBytes},       {"float64", DType::kFloat64}, {"bool", DType::kBool},
      {"int8", DType::kInt8},         {"int16", DType::kInt16}};
};
template <>
struct EnumNames<Cache> {
  static constexpr std::pair<const char*, Cache> kValues[] = {
      {"none", Cache::kNone}, {"bytes", Cache::kBytes}, {"decoded", Cache::kDecoded}};
};
template <>
struct EnumNames<OnError> {
  static constexpr std::pair<const char*, OnError> kValues[] = {{"raise", OnError::kRaise},
                                                                {"skip", OnError::kSkip}};
};

#undef FEEDLINE_ARG

}  // namespace feedline

#endif  // FEEDLINE_OPTIONS_H_
