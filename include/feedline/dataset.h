// feedline — data sets: the read stage's seam, and the built-in file data sets.
//
// A `Dataset` turns a sample index into a `Record`: the bytes it stores (a file's contents, the
// members of a WebDataset key) and small metadata (a class label, and any typed metadata the
// data set and its transform agree on). What the bytes mean is the
// transform's business (see transform.h); a data set that computes its samples from the index
// may leave the record empty and let its transform do the work.
//
//   class Squares : public feedline::Dataset {            // a do-nothing read: all in the
//    public:                                              // transform
//     int64_t size() const override { return 1000; }
//     absl::Status Read(int64_t, feedline::Record*) const override { return absl::OkStatus(); }
//     uint64_t Fingerprint() const override { return 1000; }
//   };
//
// Contract: `size()` and `Fingerprint()` never change. `Read` is called by many reader threads
// at once, so it must be thread-safe (const and re-entrant); it replaces the record's contents
// (the record's buffers are reused across calls: assign, do not append). It returns an error
// naming the sample and the cause (kNotFound, kDataLoss, ...); an exception thrown from it is
// caught by the loader and becomes that sample's error too, never a crash. It may block (slow
// storage); the loader runs as many reads at once as the autotuner's I/O depth says, and fails a
// read that exceeds `read_timeout_ms`. A data set whose reads wait on a network can instead
// start them without blocking (`async_reads` / `ReadAsync`, below): then one reader thread
// keeps the I/O depth of reads in flight.
//
// The built-in file data sets (ImageFolder, list files, WebDataset shards, local copies of URLs)
// are io's, in files.h. `DatasetWrapper` forwards every call to another data set: derive from it
// to inject latency or faults, or to add metadata.
#ifndef FEEDLINE_DATASET_H_
#define FEEDLINE_DATASET_H_

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace feedline {

// One sample as stored. Reused by the loader from sample to sample (capacities are kept).
struct Record {
  struct Member {
    std::string name;  // WebDataset: the member's extension ("jpg", "cls", "json", ...)
    std::vector<uint8_t> bytes;
  };
  std::vector<uint8_t> bytes;   // the sample's main payload (a file: its contents)
  int64_t label = -1;           // class index (a sub-folder, a list file's, a .cls); else -1
  std::vector<Member> members;  // named members (WebDataset keys); empty for single files
  // Anything else a data set tells its transform about the sample, of a type the two agree on
  // (a caption, boxes, a video's frame index): the transform reads it with
  // `std::any_cast<const T>(&record.meta)` (null when absent or of another type). The bytes
  // cache keeps a copy with the record: keep it small.
  std::any meta;

  // The member called `name`, or null.
  const std::vector<uint8_t>* member(std::string_view name) const;
  // Empties the record (keeping the capacity of `bytes`).
  void Clear();
};

// A remote data set's requests (HTTP / S3), for Stats and the bottleneck verdict.
struct RemoteStats {
  bool remote = false;
  int64_t requests = 0;   // attempts made, retries included
  int64_t retries = 0;    // attempts repeated after a transient failure
  int64_t failures = 0;   // reads that failed after their retries
  int64_t bytes = 0;      // fetched
  int64_t in_flight = 0;  // requests running now
  double request_ms = 0;  // mean latency of a successful request
  // Cached copies (of remote shards) whose bytes differed from their catalog: removed, their
  // samples read from the source instead.
  int64_t damaged_copies = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual absl::Status Read(int64_t index, Record* record) const = 0;
  // What names sample `index` in errors: a file, a shard member, or (default) "sample <index>".
  virtual std::string Describe(int64_t index) const;
  // A hash of the data set's identity (its files and labels, say): a saved loader state is
  // refused by a loader whose data set has another fingerprint.
  virtual uint64_t Fingerprint() const = 0;
  // True when Read only clears the record (the samples are computed by the transform from the
  // index): then there is no read stage, and the workers claim positions themselves — no
  // reader threads, no hand-off between stages. Default false.
  virtual bool empty_records() const { return false; }
  // True when Read never blocks: the bytes are already in memory (a file read whole at open,
  // say) and a read is a copy of a few hundred bytes. Then, as for empty records, the workers
  // read their samples themselves: a read stage would cost a hand-off between threads per
  // chunk of samples, more than the read. Default false; a wrapper does not forward it (its own
  // Read may wait).
  virtual bool in_memory() const { return false; }
  // What a data set that fetches over a network did so far (default: nothing remote). Called
  // from any thread while reads run.
  virtual RemoteStats remote_stats() const { return {}; }

  // Reads that do not hold a thread while they wait (network storage). When async_reads() is
  // true the read stage starts reads with ReadAsync and goes on: one reader thread keeps the
  // autotuner's I/O depth of reads in flight, instead of one blocked thread per read. ReadAsync
  // returns at once; `done` is called exactly once with the read's outcome, on any thread
  // (possibly before ReadAsync returns), and must not block; `record` is the data set's until
  // then. The read must end by itself within its own deadline (the watchdog that fails hung
  // blocking reads cannot abandon these). Default: false, and ReadAsync calls Read.
  virtual bool async_reads() const { return false; }
  virtual void ReadAsync(int64_t index, Record* record,
                         std::function<void(absl::Status)> done) const {
    done(Read(index, record));
  }

  // A data set whose samples of an epoch are not simply its records (a mixture, mix.h: each
  // epoch's samples are drawn from its sources' records anew). size() is then the samples per
  // epoch (what the sampler shuffles and splits over the ranks), num_records() the records that
  // Read, Describe, the cache and the transform's index() address, and MapEpoch rewrites the
  // epoch's order in place, from sample indices in [0, size()) to the records to read. It must
  // be a pure function of (epoch, the indices): the same on every rank, for any worker count,
  // and again when the epoch is resumed. Defaults: size() records, the order unchanged.
  virtual int64_t num_records() const { return size(); }
  virtual void MapEpoch(int64_t epoch, std::vector<int64_t>* order) const {
    (void)epoch;
    (void)order;
  }
};

// Forwards every call to `target` (not owned unless given as a shared_ptr).
class DatasetWrapper : public Dataset {
 public:
  explicit DatasetWrapper(std::shared_ptr<const Dataset> target) : target_(std::move(target)) {}
  int64_t size() const override { return target_->size(); }
  absl::Status Read(int64_t index, Record* record) const override {
    return target_->Read(index, record);
  }
  std::string Describe(int64_t index) const override { return target_->Describe(index); }
  uint64_t Fingerprint() const override { return target_->Fingerprint(); }
  bool empty_records() const override { return target_->empty_records(); }
  RemoteStats remote_stats() const override { return target_->remote_stats(); }
  int64_t num_records() const override { return target_->num_records(); }
  void MapEpoch(int64_t epoch, std::vector<int64_t>* order) const override {
    target_->MapEpoch(epoch, order);
  }
  // async_reads() stays false: a wrapper's own Read (latency, faults) must see every read.
  const Dataset& target() const { return *target_; }

 private:
  std::shared_ptr<const Dataset> target_;
};

}  // namespace feedline

#endif  // FEEDLINE_DATASET_H_
