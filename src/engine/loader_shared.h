// State shared by a loader and its epochs: what it was made with (the resolved options, the data
// set and transform, the slot layout, the device stage) and its named parts — the settings the
// stages run at, the tuner, the counters behind `stats()`, the memory budget, the failed
// samples and the epochs — each with one owner.
//
// Thread safety: what it was made with is immutable after BuildLoader; the parts are atomics
// (relaxed: settings and statistics, read as a snapshot) or guarded by their own mutex.
#ifndef FEEDLINE_SRC_ENGINE_LOADER_SHARED_H_
#define FEEDLINE_SRC_ENGINE_LOADER_SHARED_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/clock.h"
#include "core/fork_generation.h"
#include "core/sample_cache.h"
#include "core/trace.h"
#include "engine/batch_slot.h"
#include "engine/device_stage.h"
#include "engine/sampler.h"
#include "engine/worker_pool.h"
#include "feedline/dataset.h"
#include "feedline/options.h"
#include "feedline/stats.h"
#include "feedline/transform.h"
#include "tune/autotuner.h"

namespace feedline {

class EpochRun;

// Busy/wait nanoseconds and item counts for one stage, summed over its threads.
struct StageCounters {
  std::atomic<int64_t> busy_ns{0};
  std::atomic<int64_t> wait_ns{0};
  std::atomic<int64_t> items{0};
  std::atomic<int64_t> cpu_ns{0};  // CPU time of the busy part (decode: the tuner's cost model)
  void AddCpu(int64_t ns) { cpu_ns.fetch_add(ns, std::memory_order_relaxed); }
  void AddBusy(int64_t ns) { busy_ns.fetch_add(ns, std::memory_order_relaxed); }
  void AddWait(int64_t ns) { wait_ns.fetch_add(ns, std::memory_order_relaxed); }
  void AddItem() { items.fetch_add(1, std::memory_order_relaxed); }
};

// What the stages counted, for stats() and the tuner. Written by the stages and the consumer
// (relaxed atomics: statistics, read as a snapshot); the tuning loop and Snapshot read them.
struct PipelineCounters {
  StageCounters read, map, consumer;        // map: the transform (decode, tokenize, user code)
  std::atomic<int64_t> samples{0};          // delivered to the consumer
  std::atomic<int64_t> stepped_samples{0};  // samples of the consumer steps in consumer.busy_ns
  std::atomic<int64_t> batches{0};
  // The consumer's wait for the first batch of each epoch (the pipeline filling: a deeper ring
  // cannot shorten it, so the tuner's wait signal, steady_wait_ns, leaves it out).
  std::atomic<int64_t> epoch_start_wait_ns{0};
  std::atomic<int64_t> steady_wait_ns{0};
  void AddConsumerWait(int64_t batch, int64_t ns) {
    consumer.AddWait(ns);
    (batch == 0 ? epoch_start_wait_ns : steady_wait_ns).fetch_add(ns, std::memory_order_relaxed);
  }
  // The consumer thread between batches (its steps): CPU time, and time it was ready to run
  // but waited for a core (other threads on the cores: the loader's, other processes').
  std::atomic<int64_t> consumer_cpu_ns{0}, consumer_run_delay_ns{0};
  std::atomic<int64_t> start_ns{0};           // first epoch's start; 0 before
  std::atomic<int64_t> read_buffer_bytes{0};  // capacity of read buffers alive now
  // Queue occupancy, summed over tuning ticks (fixed point, 1e-3 units).
  std::atomic<int64_t> ring_fill_milli{0}, read_fill_milli{0}, fill_samples{0};
};

// The settings the stages run at: set when the loader is made (the user's, or the starting
// point of "auto"), then by the tuning loop alone; read by the stages at every step.
struct TuningTargets {
  std::atomic<int> workers{1};
  std::atomic<int> prefetch{2};
  std::atomic<int> io_depth{1};
  // Samples per hand-off between the stages (a chunk; see ReadItem): 1 until the workers have
  // measured what a sample costs, then enough for ~kChunkWorkNs of work, at most a share of a
  // batch such that every worker gets two chunks of it. Epochs of cheap samples may last less
  // than a tuning interval, so the workers set it themselves, after every item
  // (LoaderShared::UpdateChunk). 3 ms: train decodes (~0.9 ms) go three at a time. At 0.25 ms
  // (one at a time) every image woke the reader and put it to sleep again; 3 ms gave 2.7% less
  // CPU per image and 2.8% more images/s (feedline-bench, 4 alternating pairs, 2 workers). A
  // chunk's latency (its read time per sample is in sample_ns) keeps slow-storage chunks small
  // when a reader thread waits for each read; asynchronous reads (URLs) count only the map time:
  // over HTTP from nginx on the same cores, 0.89-0.92x of local files against 0.87-0.89x with
  // one-sample chunks (bench/remote_compare.py, 3 alternating pairs; level with 20 ms added per
  // request).
  std::atomic<int> chunk{1};
  bool whole_batches = false;  // transform->WholeBatches(): chunk is the batch size, always
  static constexpr int64_t kChunkWorkNs = 3'000'000;
  static constexpr int kMaxChunk = 64;
  // Which settings the autotuner controls (the others are the user's).
  bool auto_workers = false, auto_io_depth = false, auto_prefetch = false;
};

// The autotuner (null when every setting is fixed) and the sampled timeline; the tuning loop
// feeds it, Snapshot reads it.
struct TunerState {
  std::mutex mu;
  std::unique_ptr<Autotuner> model ABSL_GUARDED_BY(mu);
  std::vector<TimelinePoint> timeline ABSL_GUARDED_BY(mu);
  static constexpr size_t kMaxTimeline = 20000;
};

// The loader's memory: the ring's slots and the cache, within the budget.
struct MemoryBudget {
  int64_t budget = 0;  // == options.memory_budget(), resolved
  std::shared_ptr<SlotPool> pool;
  // Null when options.cache() == kNone. `cache_holds_bytes`: the read stage stores and serves
  // records' bytes; otherwise the transform keeps its own entries there (counted in the budget
  // here).
  std::shared_ptr<SampleCache> cache;
  bool cache_holds_bytes = false;
  int64_t read_bytes_reserved = 0;  // reads in flight at the settings the loader starts with

  // Whole ring slots the budget holds after the cache and `read_bytes` of reads in flight.
  int64_t SlotsWithinBudget(int64_t read_bytes) const {
    const int64_t left = budget - (cache ? cache->budget() : 0) - read_bytes;
    return std::max<int64_t>(0, left / int64_t(pool->slot_bytes()));
  }
  // The deepest ring the autotuner may set: the slots within the budget less the ones kept for
  // recycling (KeepSlots), within [1, kMaxAutoPrefetch].
  static constexpr int kMaxAutoPrefetch = 16;
  int AutoPrefetchLimit(int64_t read_bytes) const {
    return int(
        std::clamp<int64_t>(SlotsWithinBudget(read_bytes) - kRecycledSlots, 1, kMaxAutoPrefetch));
  }
  // The pool keeps the ring's slots plus two, within the budget: the batch the consumer works
  // on and the one before it (Python's `for x, y in loader` holds it until the next is handed
  // out). Given back, their slots are reused for the next batches instead of being freed and
  // allocated again: a 9.6 MB batch of 64 x 3 x 224 x 224 is ~2,400 fresh pages, ~36 page
  // faults per image (measured: 20% of the CPU of a consumer-bound run).
  static constexpr int kRecycledSlots = 2;
  void KeepSlots(int prefetch) {
    pool->set_keep(int(
        std::min<int64_t>(prefetch + kRecycledSlots,
                          std::max<int64_t>(prefetch, SlotsWithinBudget(read_bytes_reserved)))));
  }
  // Slots the ring owns, `read_buffer_bytes` of reads and the cache.
  int64_t BytesInUse(int64_t read_buffer_bytes) const {
    return (pool->cached() + pool->in_ring()) * int64_t(pool->slot_bytes()) + read_buffer_bytes +
           (cache ? cache->bytes() : 0);
  }
};

// The samples that failed: counted, and the first few hundred kept (stats()).
class ErrorLog {
 public:
  static constexpr size_t kMaxKept = 256;
  void Record(SampleError e);
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  std::string FirstText();  // "path: cause" of the first, or ""
  std::vector<SampleError> Kept();

 private:
  std::atomic<int64_t> count_{0};
  std::mutex mu_;
  std::vector<SampleError> kept_ ABSL_GUARDED_BY(mu_);
};

// The loader's epochs: the one running now, the next one started ahead of the consumer, and
// where the next StartEpoch begins. EpochRun and the Loader's epoch calls own it.
struct EpochHandoff {
  std::mutex mu;
  // The epoch running now (for stats and live tuning); set/cleared by EpochRun.
  EpochRun* active ABSL_GUARDED_BY(mu) = nullptr;
  // The next epoch, started by `active` once all of its batches were made
  // (options.epoch_head_start); StartEpoch adopts it when it is the epoch asked for, and
  // set_epoch, LoadState or a mismatch drop it. Never made once the loader is gone.
  struct RunDeleter {
    void operator()(EpochRun* run) const;  // epoch_run.cc
  };
  std::unique_ptr<EpochRun, RunDeleter> head_start ABSL_GUARDED_BY(mu);
  bool loader_gone ABSL_GUARDED_BY(mu) = false;
  // Batches of the epoch before the head start that hold slots and are not yet taken: the head
  // start's ring admits only prefetch - lent (the ring and the memory budget stay as they are).
  std::atomic<int> lent{0};
  int64_t next_epoch ABSL_GUARDED_BY(mu) = 0;
  int64_t next_start_batch ABSL_GUARDED_BY(mu) = 0;  // set by LoadState, used once
  int64_t next_skip ABSL_GUARDED_BY(mu) = 0;         // the same (a resplit: EpochOrder's skip)
  // The position of the last epoch that stopped before its end (for state()).
  bool has_partial ABSL_GUARDED_BY(mu) = false;
  int64_t partial_epoch ABSL_GUARDED_BY(mu) = 0;
  int64_t partial_batches ABSL_GUARDED_BY(mu) = 0;
  int64_t partial_skip ABSL_GUARDED_BY(mu) = 0;
};

// The record orders of the epochs that runs of some of an epoch's batches were last made for
// (Loader::StartBatches: offload's leases, a few batches each): the order is the whole epoch's
// (O(samples) to draw, 10 MB for ImageNet), shared by those runs instead of drawn for each.
class OrderCache {
 public:
  // The order of (epoch, skip): the one kept, or make()'s (kept, the oldest dropped).
  template <typename Make>
  std::shared_ptr<const std::vector<int64_t>> Get(int64_t epoch, int64_t skip, Make make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Entry& e : entries_) {
        if (e.epoch == epoch && e.skip == skip) return e.order;
      }
    }
    auto order = std::make_shared<const std::vector<int64_t>>(make());  // outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= kKeep) entries_.erase(entries_.begin());
    entries_.push_back(Entry{epoch, skip, order});
    return order;
  }

 private:
  static constexpr size_t kKeep = 2;  // an epoch's and the next one's (leased ahead)
  struct Entry {
    int64_t epoch, skip;
    std::shared_ptr<const std::vector<int64_t>> order;
  };
  std::mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// A loader's state shared with its epochs: what it was made with (set once by BuildLoader, then
// read-only), and its parts, each with one owner: the settings the stages run at (`tuning`,
// the tuning loop's), the tuner (`tuner`), the counters (`counters`, the stages'), the memory
// (`memory`), the failed samples (`errors`) and the epochs (`epochs`).
class LoaderShared {
 public:
  LoaderOptions options;  // resolved: no "auto" left
  // What the user gave (dataset()) and what the read stage reads (wrapped: simulated latency).
  std::shared_ptr<const Dataset> user_dataset;
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<const SampleTransform> transform;
  // From transform->schema(); shared with every slot (batches may outlive the loader).
  std::shared_ptr<const internal::SlotLayout> layout;
  SamplerConfig sampler;
  int device = -1;  // -1: CPU; N: cuda:N
  std::unique_ptr<DeviceStage> device_stage;
  // dataset->empty_records(): no read stage; the workers claim positions themselves.
  bool inline_reads = false;
  uint64_t dataset_fingerprint = 0;
  int cores = 1;
  // The map workers' nice levels below the process (0: a transform that shares the consumer's
  // locks, or options.worker_nice() = 0).
  int worker_nice = 0;
  std::unique_ptr<TraceRecorder> trace;

  TuningTargets tuning;
  TunerState tuner;
  PipelineCounters counters;
  MemoryBudget memory;
  ErrorLog errors;
  EpochHandoff epochs;
  OrderCache orders;

  // The chunk for a worker's smoothed map time per sample, `map_ns`; the read time per sample
  // (latency included) is the read stage's average so far.
  void UpdateChunk(double map_ns) {
    if (tuning.whole_batches) return;  // chunk == batch_size, set once
    // Asynchronous reads (URLs, remote shards) overlap: a chunk's reads are all in flight at
    // once, no thread waits for them, so their latency does not lengthen a chunk's work.
    const int64_t reads =
        dataset->async_reads() ? 0 : counters.read.items.load(std::memory_order_relaxed);
    const double read_ns =
        reads > 0 ? double(counters.read.busy_ns.load(std::memory_order_relaxed)) / double(reads)
                  : 0.0;
    const double sample_ns = map_ns + read_ns;
    const int64_t most = std::max<int64_t>(
        1, std::min<int64_t>(TuningTargets::kMaxChunk,
                             options.batch_size() / (2 * int64_t(tuning.workers.load()))));
    const int next = sample_ns > 0
                         ? int(std::clamp<double>(double(TuningTargets::kChunkWorkNs) / sample_ns,
                                                  1.0, double(most)))
                         : 1;
    if (tuning.chunk.load(std::memory_order_relaxed) != next) {
      tuning.chunk.store(next, std::memory_order_relaxed);
    }
  }
  int64_t BytesInUse() const {
    return memory.BytesInUse(counters.read_buffer_bytes.load(std::memory_order_relaxed));
  }

  Stats Snapshot();

  // The map stage's threads, kept from epoch to epoch (made at the first use; in a forked
  // child, made anew: the parent's threads are not there, and its pool is leaked, since the
  // parent's threads may have held its locks at the fork).
  WorkerPool& Workers() {
    std::lock_guard<std::mutex> lock(workers_mu_);
    if (workers_ == nullptr || workers_generation_ != ForkGeneration()) {
      if (workers_ != nullptr) (void)workers_.release();
      workers_ = std::make_unique<WorkerPool>(transform, worker_nice);
      workers_generation_ = ForkGeneration();
    }
    return *workers_;
  }
  // The workers stop first (each deletes its WorkerState on its own thread), while what their
  // states may refer to is still there.
  ~LoaderShared() {
    std::lock_guard<std::mutex> lock(workers_mu_);
    if (workers_ != nullptr && workers_generation_ != ForkGeneration()) {
      (void)workers_.release();  // a forked copy: see Workers()
    }
    workers_.reset();
  }

 private:
  std::mutex workers_mu_;
  std::unique_ptr<WorkerPool> workers_ ABSL_GUARDED_BY(workers_mu_);
  uint64_t workers_generation_ ABSL_GUARDED_BY(workers_mu_) = 0;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_LOADER_SHARED_H_
