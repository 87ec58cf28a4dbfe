// The batches in flight: opened when their first sample is admitted, filled by the workers,
// assembled by the worker that completes them, and taken by the consumer strictly in order.
//
// Admission is the prefetch bound: batch b may be opened while b < consumed + prefetch (less the
// previous epoch's batches not yet taken, for a head start: LoaderShared::lent). A
// failure travels with its batch (the first failed position's error), so the consumer gets it
// at the batch where the sample belongs, after every earlier batch.
//
// Thread safety: readers call WaitAdmitted/EnsureOpen, workers Fail/CompleteSample, the
// consumer WaitReady/Take; the tuner reads ReadyBatches. One mutex is taken per batch opened
// (open_mu_) and per batch completed (done_mu_); per sample only atomics.
#ifndef FEEDLINE_SRC_ENGINE_BATCH_RING_H_
#define FEEDLINE_SRC_ENGINE_BATCH_RING_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "engine/batch_slot.h"
#include "engine/epoch_core.h"

namespace feedline {

class BatchRing {
 public:
  struct InFlight {
    std::atomic<int64_t> batch{-1};     // published (release) after the fields below are set
    std::atomic<int64_t> remaining{0};  // samples still to be written
    std::atomic<bool> ready{false};     // complete and assembled (release)
    std::shared_ptr<internal::BatchSlot> slot;  // null when it could not be allocated
    int64_t count = 0;
    int64_t open_ns = 0;
    std::mutex mu;  // guards the error (rare path)
    absl::Status error ABSL_GUARDED_BY(mu);
    int64_t error_pos ABSL_GUARDED_BY(mu) = -1;
  };

  BatchRing(EpochCore* core, int64_t start_batch);

  // Waits until batch b is admitted or the epoch is cancelled; false when cancelled.
  bool WaitAdmitted(int64_t b);
  // Opens batches up to and including b (their slots and counts). b must be admitted.
  // False when batch `b` will never open: a fed run (EpochCore::feed) whose feed ran out.
  bool EnsureOpen(int64_t b);
  InFlight& at(int64_t b) { return inflight_[size_t(b % kMaxPrefetch)]; }

  // Records a failed sample (the first failed position's error is the batch's).
  void Fail(InFlight& e, int64_t pos, const absl::Status& st);
  // `n` samples of `e` are done; the last ones assemble the batch and wake the consumer.
  void CompleteSamples(InFlight& e, int64_t n, std::vector<uint8_t>* scratch);
  // Called by the worker that assembled batch b (without a failed sample), before the batch is
  // published to the consumer: nobody else reads or takes it meanwhile. Set before the workers
  // start (the device copy stage queues the copy there).
  using AssembledHook =
      std::function<void(int64_t b, const std::shared_ptr<internal::BatchSlot>& slot, int64_t n)>;
  void set_on_assembled(AssembledHook hook) { on_assembled_ = std::move(hook); }

  bool Ready(int64_t b) {
    const InFlight& e = at(b);
    return e.batch.load(std::memory_order_acquire) == b && e.ready.load(std::memory_order_acquire);
  }
  // A ready batch's slot and count, left in the ring (the copy stage reads it early; nothing
  // writes an assembled slot); null slot when the batch failed or has no slot. Consumer only.
  struct Peeked {
    std::shared_ptr<internal::BatchSlot> slot;
    int64_t count = 0;
  };
  Peeked Peek(int64_t b);
  // Waits up to `poll` for batch b; true when it is ready.
  bool WaitReady(int64_t b, std::chrono::nanoseconds poll);
  struct Taken {
    std::shared_ptr<internal::BatchSlot> slot;
    int64_t count = 0;
    int64_t open_ns = 0;
    absl::Status error;
  };
  // Hands batch b (ready) to the consumer and admits the next one.
  Taken Take(int64_t b);

  int64_t consumed() const { return consumed_.load(std::memory_order_acquire); }
  // Every batch of the epoch (from the start batch on) is complete and assembled.
  bool AllAssembled() const {
    return assembled_.load(std::memory_order_acquire) >= core_->num_batches - start_batch_;
  }
  // Complete batches waiting for the consumer (the ring's occupancy).
  int64_t ReadyBatches();
  // Wakes a waiting consumer (cancellation).
  void NotifyConsumer();
  // Drops the slots of batches opened but never handed out (after the threads are joined).
  void ReleaseSlots();

 private:
  AssembledHook on_assembled_;
  EpochCore* const core_;
  std::atomic<int64_t> consumed_;  // batches handed out (the next to hand out)
  const int64_t start_batch_;
  std::atomic<int64_t> assembled_{0};  // batches complete
  std::mutex open_mu_;
  int64_t opened_ ABSL_GUARDED_BY(open_mu_);
  bool fed_out_ ABSL_GUARDED_BY(open_mu_) = false;  // the feed had no batch for `opened_`
  std::unique_ptr<InFlight[]> inflight_;  // kMaxPrefetch entries, batch b at b % kMaxPrefetch
  std::mutex done_mu_;  // the consumer waits here for its batch; workers signal per batch
  std::condition_variable done_cv_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_BATCH_RING_H_
