// feedline — the loader: a data set, a transform, and the pipeline between them.
//
// The image built-in (an ImageFolder, list file or WebDataset shards, decoded and cropped):
//   absl::StatusOr<std::unique_ptr<feedline::Loader>> loader =
//       feedline::Loader::Create(feedline::LoaderOptions("data/train").batch_size(256));
//   if (!loader.ok()) return loader.status();
//   for (absl::StatusOr<feedline::Batch>& batch : **loader) {   // one epoch
//     if (!batch.ok()) return batch.status();   // the file and the cause, at its batch
//     Train(batch->images(), batch->labels());
//   }
//
// Any data set and transform (see dataset.h, transform.h):
//   auto loader = feedline::Loader::Create(std::make_shared<MyDataset>(),
//                                          std::make_shared<MyTransform>(),
//                                          feedline::LoaderOptions().batch_size(32));
//   ... batch->field("tokens") ...
//
// Each `begin()` (or `StartEpoch()`) starts the next epoch with a fresh permutation, as torch's
// DataLoader does; `set_epoch` chooses it explicitly. Starting an epoch cancels the previous one
// if it is still running (its batches that the user holds stay valid).
//
// Thread safety: a `Loader` is used by one consumer thread at a time (as a training loop does);
// `stats()` may be called from any thread concurrently. An `Epoch` belongs to one thread.
#ifndef FEEDLINE_LOADER_H_
#define FEEDLINE_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "feedline/batch.h"
#include "feedline/dataset.h"
#include "feedline/options.h"
#include "feedline/stats.h"
#include "feedline/transform.h"

namespace feedline {

class EpochRun;
class Mix;
class LoaderShared;
class Loader;
namespace internal {
struct EngineParts;  // src/engine/engine_parts.h
absl::StatusOr<std::unique_ptr<Loader>> BuildLoader(EngineParts parts, LoaderOptions options);
}  // namespace internal

// One pass over the data set. Destroying it stops its workers promptly (mid-epoch too).
class Epoch {
 public:
  ~Epoch();
  Epoch(const Epoch&) = delete;
  Epoch& operator=(const Epoch&) = delete;

  // The next batch, in order. At the end of the epoch: a status with code kOutOfRange.
  // A sample that failed under OnError::kRaise gives its error (kDataLoss, kNotFound, ...,
  // naming the file) at the batch it belongs to; the following call goes on with the next batch.
  absl::StatusOr<Batch> Next();
  // As Next(), calling `interrupted` every `poll` while waiting; a non-OK status from it is
  // returned at once (the batch stays queued). Bindings use it to let Ctrl-C through.
  absl::StatusOr<Batch> Next(const std::function<absl::Status()>& interrupted, absl::Duration poll);

  int64_t epoch() const noexcept;
  int64_t num_batches() const noexcept;
  // Stops the workers; later `Next()` calls return kCancelled. Safe to call more than once.
  void Cancel();

 private:
  friend class Loader;
  explicit Epoch(std::unique_ptr<EpochRun> run);
  std::unique_ptr<EpochRun> run_;
};

// An epoch's batch numbers handed out in order, each to whoever asks first: a loader's run
// (Loader::StartFromFeed(epoch, feed): its readers claim a batch as the prefetch bound admits it)
// and other makers of the same epoch (offload: a cluster's workers), so that each makes what it
// has room for and no batch is made twice. Thread-safe.
class BatchFeed {
 public:
  enum Owner : int8_t { kNone = 0, kLocal = 1, kRemote = 2 };
  // Batches [first, end) of an epoch; each a full batch (an epoch's short last batch is made
  // another way: StartBatches(epoch, {last})).
  BatchFeed(int64_t first, int64_t end);
  // The lowest batch not yet claimed, now `who`'s; -1 when none is left (or after Close).
  // With `lead` > 0: the first unclaimed batch at least `lead` past the lowest (else the last
  // unclaimed one): a maker whose batches take long to arrive takes them from further ahead,
  // and the lowest ones stay for the run, which claims them in order.
  int64_t Claim(Owner who, int64_t lead = 0);
  // Batch b, now `who`'s, if nobody has claimed it (false otherwise, or after Close): a maker
  // that started on it before the feed existed (offload: the next epoch's first batches).
  bool Take(int64_t b, Owner who);
  Owner owner(int64_t b) const;  // kNone outside [first, end) too
  int64_t first() const noexcept { return first_; }
  int64_t end() const noexcept { return end_; }
  // How many batches nobody has claimed yet.
  int64_t unclaimed() const;
  // No more claims: -1 from now on (a run whose feed closes makes what it claimed).
  void Close();

 private:
  const int64_t first_, end_;
  mutable std::mutex mu_;
  int64_t next_;  // no batch below it is unclaimed
  bool closed_ = false;
  int64_t claimed_ = 0;
  std::vector<int8_t> owners_;  // by batch - first_
};

class Loader {
 public:
  // The image built-in: scans `options.source()` (or `shards()`) and validates the options.
  // Errors: kInvalidArgument (an option, naming it), kNotFound (the source), kDataLoss (a
  // malformed shard), kResourceExhausted (fixed settings that cannot fit the budget).
  static absl::StatusOr<std::unique_ptr<Loader>> Create(LoaderOptions options);
  // The image built-in over a data set given (a Mix of FileDatasets, say: feedline/mix.h),
  // with every image option, the GPU conversion included; `options.source()` is not read.
  // Its records hold encoded images and labels, as a FileDataset's. Errors as Create(options).
  static absl::StatusOr<std::unique_ptr<Loader>> CreateImages(
      std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  // The image built-in over a mixture whose sources are augmented each their own way: source
  // s's images are made with per_source[s]'s augmentation options (transform, resize_size,
  // scale, ratio, flip, exif_transpose, accept_corrupt, max_image_pixels), every other option
  // is `options`' (kInvalidArgument naming an option that differs between a source's and the
  // loader's and shapes the samples: size, layout, dtype, mean, stddev; and for cache
  // "decoded", whose images would be shared across options).
  static absl::StatusOr<std::unique_ptr<Loader>> CreateImages(
      std::shared_ptr<const Mix> mix, const std::vector<LoaderOptions>& per_source,
      LoaderOptions options);
  // Any data set and transform. Only the engine's options apply (sampling, resources, caching
  // "bytes", robustness, device); an image option set to other than its default is refused,
  // named, never ignored, unless `transform` was made from it (SampleTransform::ReadsOptions:
  // image::MakeTransform). Errors: kInvalidArgument (a null data set or transform, an empty data
  // set, an invalid schema, an option), kResourceExhausted.
  static absl::StatusOr<std::unique_ptr<Loader>> Create(
      std::shared_ptr<const Dataset> dataset, std::shared_ptr<const SampleTransform> transform,
      LoaderOptions options = LoaderOptions());
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts the next epoch (or the one chosen by set_epoch).
  std::unique_ptr<Epoch> StartEpoch();
  // Makes only `batches` of epoch `epoch` (ascending batch numbers of this rank's epoch), each
  // with the bytes it has in a whole epoch (augmentations and replacements are chosen by the
  // sample's place in the epoch, not in this run): the returned Epoch hands them out in that
  // order, Batch::index() the epoch's batch number. For making an epoch's batches in several
  // places (offload: some here, some on other machines). It is not the loader's epoch: it moves
  // neither next_epoch() nor the resume state, and no head start follows it; like any epoch it
  // runs on the loader's workers, one at a time (drop or cancel it before starting another).
  // kInvalidArgument for an empty, unordered or out-of-range list, a negative epoch, or a loader
  // resumed on another layout whose first epoch this is.
  absl::StatusOr<std::unique_ptr<Epoch>> StartBatches(int64_t epoch, std::vector<int64_t> batches);
  // The same for the batches of `feed` this run claims (BatchFeed::kLocal), in the order it
  // claims them: the returned Epoch hands them out in that order until the feed is empty.
  // Drop or cancel it once the batches it claimed are taken. kInvalidArgument as above, or for
  // a feed beyond this rank's full batches.
  absl::StatusOr<std::unique_ptr<Epoch>> StartFromFeed(int64_t epoch,
                                                       std::shared_ptr<BatchFeed> feed);

  int64_t num_batches() const noexcept;     // batches per epoch for this rank: len(loader)
  int64_t num_samples() const noexcept;     // samples per epoch for this rank (padding included)
  const Dataset& dataset() const noexcept;  // as given (the image built-in's: a FileDataset)
  const Schema& schema() const noexcept;    // the transform's output: the batches' fields
  const LoaderOptions& options() const noexcept;  // with "auto" fields resolved
  void set_epoch(int64_t epoch);
  int64_t next_epoch() const noexcept;  // the epoch that StartEpoch() will start
  // The next epoch's head start (LoaderOptions::epoch_head_start) made from outside an epoch,
  // for a transform whose next epoch became known, or changed, after the last epoch's end
  // (feedline.DataLoader: its sampler order drawn again once another loader's draws moved
  // torch's RNG). DropAhead drops the head start started, if any; StartAhead(epoch) starts
  // one now, as an epoch's end would: false, nothing started, while an epoch runs or a head
  // start is there, when `epoch` is not next_epoch() from its first batch, when head starts
  // are off, or when the transform says not yet (SampleTransform::MayStartEpoch).
  void DropAhead();
  bool StartAhead(int64_t epoch);
  Stats stats() const;

  // Where the loader is, for checkpoints: the epoch in progress and the batches of it already
  // handed out (or the next epoch and 0), with what a restored run must agree on.
  struct State {
    int64_t epoch = 0;
    int64_t batches_done = 0;
    uint64_t seed = 0;
    int rank = 0;
    int world_size = 1;
    int64_t batch_size = 0;
    bool shuffle = true;
    bool drop_last = false;
    int64_t dataset_size = 0;
    uint64_t dataset_fingerprint = 0;
    // Positions of the epoch's order delivered before it was resumed on this layout (0 unless
    // the epoch was resplit); batches_done counts this layout's batches after them.
    int64_t skipped = 0;
  };
  State state() const;
  // The next StartEpoch() resumes exactly there: the same batches, indices and pixels as the
  // uninterrupted run, whatever the worker count or prefetch depth. Errors (kInvalidArgument)
  // for a state of another data set, seed, shuffle or drop_last setting, or of another world
  // size or batch size unless `resplit`. With `resplit` the epoch goes on exactly on this
  // layout: what the saved layout's ranks delivered is a prefix of the epoch's order, and the
  // rest of it is split over this layout's ranks as a whole epoch would be (each sample no rank
  // had delivered comes once, none that was delivered comes again, plus DistributedSampler's
  // padding when even_shards); the next epochs are this layout's own. A state saved by any
  // rank serves every rank (they all hold the same position).
  absl::Status LoadState(const State& state, bool resplit = false);
  // Writes what the pipeline did as Chrome trace-event JSON (Perfetto, chrome://tracing): one
  // track per reader and decoder thread, the consumer's waits, batch lifetimes, the tuner's
  // settings and decisions.
  absl::Status SaveTrace(const std::string& path) const;

  // Changes resources while running (the autotuner's hooks; values >= 1).
  void set_workers(int n);
  void set_prefetch(int n);
  void set_io_depth(int n);

  // Range-for support: one epoch per loop.
  class Iterator {
   public:
    using value_type = absl::StatusOr<Batch>;
    absl::StatusOr<Batch>& operator*() { return current_; }
    absl::StatusOr<Batch>* operator->() { return &current_; }
    Iterator& operator++();
    bool operator!=(const Iterator& other) const { return done_ != other.done_; }
    bool operator==(const Iterator& other) const { return done_ == other.done_; }

   private:
    friend class Loader;
    Iterator() = default;
    explicit Iterator(std::shared_ptr<Epoch> epoch);
    std::shared_ptr<Epoch> epoch_;
    absl::StatusOr<Batch> current_;
    bool done_ = true;
  };
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  friend absl::StatusOr<std::unique_ptr<Loader>> internal::BuildLoader(internal::EngineParts,
                                                                       LoaderOptions);
  explicit Loader(std::shared_ptr<LoaderShared> shared);
  std::shared_ptr<LoaderShared> shared_;
};

// Library version and compiled features.
struct BuildInfo {
  std::string version;
  bool cuda_compiled = false;
  std::vector<std::string> cuda_devices;  // "cuda:0 NVIDIA H200 (...)"
  std::string cuda_unavailable_reason;    // why the list is empty
  bool png = false;
  std::string jpeg;    // libjpeg-turbo version
  std::string resize;  // resampling library
};
BuildInfo GetBuildInfo();

}  // namespace feedline

#endif  // FEEDLINE_LOADER_H_
