// What the stages of one epoch share: the plan (order, batch count), the cancel flag and wake
// word, and the read items that circulate between the read and map stages.
//
// Thread safety: the plan is immutable; `cancelled` and `wake` are atomics; `ItemQueues` is
// safe from any thread.
#ifndef FEEDLINE_SRC_ENGINE_EPOCH_CORE_H_
#define FEEDLINE_SRC_ENGINE_EPOCH_CORE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "core/handoff_queue.h"
#include "core/sleep.h"
#include "engine/loader_shared.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"

namespace feedline {

struct EpochCore;

namespace internal {
// The epoch whose reader or worker thread this is (null on every other thread). User code runs
// on those threads (a transform, a data set's Read, a Python data set and its garbage
// collections), and may drop the Epoch there: it must not then be joined by itself (~Epoch).
inline thread_local const EpochCore* worker_of = nullptr;
}  // namespace internal

// The records an epoch reads, in order: the sampler's sample order as the data set maps it
// (Dataset::MapEpoch; unchanged but for mixtures).
inline std::vector<int64_t> RecordOrder(const Dataset& dataset, int64_t epoch,
                                        std::vector<int64_t> order) {
  dataset.MapEpoch(epoch, &order);
  return order;
}

struct EpochCore {
 private:
  static std::shared_ptr<const std::vector<int64_t>> OrderOf(LoaderShared& shared, int64_t e,
                                                             int64_t skip, bool kept) {
    auto make = [&] {
      return RecordOrder(*shared.dataset, e, EpochOrder(shared.sampler, e, skip));
    };
    if (kept) return shared.orders.Get(e, skip, make);
    return std::make_shared<const std::vector<int64_t>>(make());
  }

 public:
  // `skip`: the positions of the epoch's order delivered before a resume on another layout
  // (EpochOrder). `selection`: only these batches of the epoch (ascending, checked by
  // Loader::StartBatches), as batches 0, 1, ... of this run; empty: all of them.
  // `feed`: the batches this run claims from it, as batches 0, 1, ... of this run (each full).
  EpochCore(std::shared_ptr<LoaderShared> s, int64_t e, bool head_start = false, int64_t skip = 0,
            std::vector<int64_t> selection = {}, std::shared_ptr<BatchFeed> feed = nullptr)
      : shared(std::move(s)),
        held(head_start),
        epoch(e),
        skip(skip),
        order_held(OrderOf(*shared, e, skip, /*kept=*/!selection.empty())),
        order(*order_held),
        batch_size(shared->options.batch_size()),
        selection(std::move(selection)),
        feed(std::move(feed)),
        claimed(this->feed != nullptr ? size_t(this->feed->end() - this->feed->first()) : 0, -1),
        num_batches(this->feed != nullptr     ? int64_t(claimed.size())
                    : this->selection.empty() ? BatchesPerRank(AfterSkip(shared->sampler, skip))
                                              : int64_t(this->selection.size())),
        total_seq(static_cast<int64_t>(order.size())),
        run_seq(this->feed != nullptr ? num_batches * batch_size
                : this->selection.empty()
                    ? total_seq
                    : std::min(total_seq, (this->selection.back() + 1) * batch_size) -
                          (this->selection.back() - (num_batches - 1)) * batch_size) {}

  const std::shared_ptr<LoaderShared> shared;
  // A sample's error, in the loader's stats() at once; a head start's are held until it is
  // adopted (Release), so that stats() and the per-epoch warnings count the epochs iterated
  // (a head start dropped takes its errors with it: its epoch, if iterated later, finds them).
  void RecordError(SampleError e) {
    {
      std::lock_guard<std::mutex> lock(held_mu);
      if (held) {
        held_errors.push_back(std::move(e));
        return;
      }
    }
    shared->errors.Record(std::move(e));
  }
  void ReleaseErrors() {
    std::vector<SampleError> errors;
    {
      std::lock_guard<std::mutex> lock(held_mu);
      held = false;
      errors.swap(held_errors);
    }
    for (SampleError& e : errors) shared->errors.Record(std::move(e));
  }

 private:
  std::mutex held_mu;
  bool held ABSL_GUARDED_BY(held_mu);
  std::vector<SampleError> held_errors ABSL_GUARDED_BY(held_mu);

 public:
  const int64_t epoch;
  const int64_t skip;
  // Position in the epoch -> data set index: the epoch's own, or for a run of some batches the
  // loader's kept one (OrderCache), shared by the epoch's runs.
  const std::shared_ptr<const std::vector<int64_t>> order_held;
  const std::vector<int64_t>& order;
  const int64_t batch_size;
  const std::vector<int64_t> selection;  // this run's batches of the epoch; empty: all
  // A run fed by a BatchFeed: the epoch's batch each of its batches claimed (written by
  // BatchRing::EnsureOpen under its lock before any reader fills it; -1 before).
  const std::shared_ptr<BatchFeed> feed;
  std::vector<int64_t> claimed;
  const int64_t num_batches;             // batches this run makes
  const int64_t total_seq;               // samples in the epoch (after drop_last)
  const int64_t run_seq;                 // samples this run makes: its positions 0..run_seq-1

  // The epoch's batch for this run's batch `b`, and its position for this run's position `seq`
  // (a selection's batches are this run's 0, 1, ...; only the epoch's last batch can be short,
  // and it comes last). Sample choices (augmentations, replacements) use the epoch's position,
  // so that a batch has the same bytes whichever run makes it.
  int64_t Batch(int64_t b) const {
    return feed != nullptr ? claimed[size_t(b)] : selection.empty() ? b : selection[size_t(b)];
  }
  int64_t Position(int64_t seq) const {
    return feed == nullptr && selection.empty()
               ? seq
               : Batch(seq / batch_size) * batch_size + seq % batch_size;
  }

  std::atomic<bool> cancelled{false};
  WakeWord wake;  // a new generation on any change readers/parked threads wait for

  bool is_cancelled() const { return cancelled.load(std::memory_order_acquire); }
  void Wake() { wake.WakeAll(); }
  // Parks thread `id` while id >= target; false when cancelled.
  bool ParkWhileSurplus(int id, const std::atomic<int>& target) {
    while (true) {
      const uint32_t gen = wake.Load();
      if (is_cancelled()) return false;
      if (id < target.load(std::memory_order_acquire)) return true;
      wake.Wait(gen);
    }
  }
};

// One sample on its way from the read stage to the map stage.
struct ReadEntry {
  int64_t seq = 0;      // position in the epoch
  int64_t sample = 0;   // data set index
  int attempt = 0;      // replacements tried for this position (on_error = skip)
  absl::Status status;  // the read's outcome
  Record record;
};

// The unit of hand-off: a run of consecutive positions of one batch (a chunk), read by one
// reader and mapped by one worker. Chunks are one sample long when samples are costly or reads
// slow (every read in flight on its own), and longer when samples are cheap, so that the
// per-hand-off costs (a queue push and pop, a wake-up, clock reads) are paid once per chunk;
// see LoaderShared::chunk. Entries keep their buffers from chunk to chunk.
struct ReadItem {
  std::vector<ReadEntry> entries;  // the first `count` are in use
  int count = 0;
  bool retry = false;  // a single replacement read (on_error = skip), from the retry pool
  int pending = 0;     // asynchronous reads not yet ended (under ReadStage's async mutex)
  ReadEntry& first() { return entries[0]; }
  void Resize(int n) {
    if (int(entries.size()) < n) entries.resize(size_t(n));
    count = n;
  }
  // The chunk of positions [seq, end) of `core`'s epoch, first attempts.
  void Fill(const struct EpochCore& core, int64_t seq, int64_t end);
};

inline void ReadItem::Fill(const EpochCore& core, int64_t seq, int64_t end) {
  Resize(int(end - seq));
  for (int k = 0; k < count; ++k) {
    ReadEntry& e = entries[size_t(k)];
    e.seq = seq + k;
    e.sample = core.order[size_t(core.Position(seq + k))];
    e.attempt = 0;
  }
}

// Readers hand filled items to the workers through `ready`; workers hand them back through
// `free`; replacement reads go through `retry`. All unbounded (never block on push): the number
// of items bounds them. A null item is the stop sentinel (pushed once per thread on cancel).
struct ItemQueues {
  HandoffQueue<ReadItem*> ready;
  // Readers wait here for an item while the map stage holds them all: with slow storage tens
  // of readers at once, so they sleep without spinning.
  HandoffQueue<ReadItem*, SleepingSemaphore> free;
  HandoffQueue<ReadItem*> retry;
  std::atomic<int> created{0};

  // A free item, a new one while fewer than `cap` exist, or (blocking) the next one returned.
  // Null: the stop sentinel.
  ReadItem* Acquire(int cap) {
    ReadItem* item = nullptr;
    if (free.try_pop(item)) return item;
    if (created.load() < cap) {
      created.fetch_add(1);
      auto owned = std::make_unique<ReadItem>();
      item = owned.get();
      std::lock_guard<std::mutex> lock(mu);
      all.push_back(std::move(owned));
      return item;
    }
    free.pop(item);
    return item;
  }
  // A single-entry item for a replacement read; from the retry pool (failures are rare: the
  // pool holds as many as were ever in flight at once).
  ReadItem* AcquireRetry() {
    std::lock_guard<std::mutex> lock(mu);
    if (!retry_free.empty()) {
      ReadItem* item = retry_free.back();
      retry_free.pop_back();
      return item;
    }
    auto owned = std::make_unique<ReadItem>();
    owned->retry = true;
    ReadItem* item = owned.get();
    all.push_back(std::move(owned));
    return item;
  }
  void ReleaseRetry(ReadItem* item) {
    std::lock_guard<std::mutex> lock(mu);
    retry_free.push_back(item);
  }
  // Frees every item's buffers (after the threads are joined).
  void DropBuffers() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& item : all) item->entries = std::vector<ReadEntry>();
  }

 private:
  std::mutex mu;
  std::vector<std::unique_ptr<ReadItem>> all ABSL_GUARDED_BY(mu);
  std::vector<ReadItem*> retry_free ABSL_GUARDED_BY(mu);
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_EPOCH_CORE_H_
