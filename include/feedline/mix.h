// feedline — a weighted mixture of data sets: a Dataset over Datasets.
//
// Each epoch's samples are drawn from the sources in the given proportions, exactly: over an
// epoch of N samples source s gives round(N * w_s) of them (within one sample), in an order that
// spreads them evenly (sample j of the epoch goes to the source furthest behind its share); the
// loader's shuffle then mixes them, so every batch holds each source's share in expectation.
// Each source is read in an order of its own — a permutation of its records from the mixture's
// seed, a new one each time the source has been read whole ("restarted", its own epochs
// counted) — and its reads continue from epoch to epoch where the last one stopped, so every
// record of every source comes in turn, whatever the epoch length. Everything is a pure
// function of (seed, epoch): the same samples for any worker count and rank, and a resumed
// epoch (the loader's state: epoch and batches done) reads what the uninterrupted run would.
//
//   std::vector<feedline::MixSource> sources = {{photos, 0.7}, {drawings, 0.3}};
//   auto mix = feedline::Mix::Create(std::move(sources), {.seed = 7});
//   auto loader = feedline::Loader::Create(*mix, transform, options);
//
// The epoch ends (MixOptions::end) when the first source has been read whole (kFirstSource:
// the other sources go on next epoch, where a new pass over a source may begin mid-epoch), when
// every source has (kLastSource: the sources that run out restart within the epoch), or after
// `samples_per_epoch`. Within one pass over a source no record comes twice. Records are addressed
// as the sources' records one after the other (record r of source s is s's offset + r: index() in
// the transform and in batches), labels and metadata as the source gives them; source(record) says
// whose a record is.
//
// Thread safety: as every Dataset (Read from many threads); the counters are atomics.
#ifndef FEEDLINE_MIX_H_
#define FEEDLINE_MIX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/dataset.h"
#include "feedline/transform.h"

namespace feedline {

struct MixSource {
  std::shared_ptr<const Dataset> dataset;
  double weight = 1.0;  // > 0; the weights are normalised to sum to 1
};

struct MixOptions {
  uint64_t seed = 0;
  enum class End { kFirstSource, kLastSource };
  End end = End::kFirstSource;
  int64_t samples_per_epoch = 0;  // > 0: the epoch's length, overriding `end`
  bool shuffle = true;            // each source's records in a permutation (else in order)
};

class Mix final : public Dataset {
 public:
  // kInvalidArgument: no source, an empty one, a weight that is not > 0 and finite, or an epoch
  // of more than 2^40 samples.
  static absl::StatusOr<std::shared_ptr<Mix>> Create(std::vector<MixSource> sources,
                                                     MixOptions options);

  int64_t size() const override { return epoch_samples_; }
  int64_t num_records() const override { return offsets_.back(); }
  void MapEpoch(int64_t epoch, std::vector<int64_t>* order) const override;
  absl::Status Read(int64_t record, Record* out) const override;
  std::string Describe(int64_t record) const override;
  uint64_t Fingerprint() const override { return fingerprint_; }
  RemoteStats remote_stats() const override;
  // Asynchronous when a source is (its reads go through ReadAsync; the others' block).
  bool async_reads() const override;
  void ReadAsync(int64_t record, Record* out,
                 std::function<void(absl::Status)> done) const override;

  int num_sources() const { return int(sources_.size()); }
  const Dataset& dataset(int s) const { return *sources_[size_t(s)]; }
  int source(int64_t record) const;  // whose record it is
  int64_t offset(int s) const { return offsets_[size_t(s)]; }
  double weight(int s) const { return weights_[size_t(s)]; }  // normalised
  int64_t per_epoch(int s) const { return per_epoch_[size_t(s)]; }
  // Records read from source s so far (every read: prefetch and head starts included).
  int64_t reads(int s) const { return reads_[size_t(s)].load(std::memory_order_relaxed); }

 private:
  Mix() = default;
  std::vector<std::shared_ptr<const Dataset>> sources_;
  std::vector<double> weights_;
  std::vector<int64_t> offsets_;    // sources_.size() + 1
  std::vector<int64_t> per_epoch_;  // samples of each source in an epoch
  std::vector<uint16_t> schedule_;  // sample j of an epoch -> its source
  std::vector<uint32_t> slot_;      // and how many of that source's samples come before it
  MixOptions options_;
  int64_t epoch_samples_ = 0;
  uint64_t fingerprint_ = 0;
  mutable std::unique_ptr<std::atomic<int64_t>[]> reads_;
};

// A transform that gives each record of `mix` to its own source's transform: a record of
// source s is made by transforms[s] with SampleContext::index() the source's own record index
// (a token file's window, say) and, for s > 0, a seed of its own (so that two sources' records
// of the same index draw apart). Sources may then differ in how their records become samples
// — a token file each, images at other options — as long as every schema is the same field
// for field (kInvalidArgument naming the first that differs; also for a count of transforms
// other than the sources'). Worker states, counters and the other properties are the sources'
// transforms' together.
absl::StatusOr<std::shared_ptr<SampleTransform>> PerSourceTransform(
    std::shared_ptr<const Mix> mix, std::vector<std::shared_ptr<const SampleTransform>> transforms);

}  // namespace feedline

#endif  // FEEDLINE_MIX_H_
