// One epoch of the pipeline: the orchestration of its stages.
//
//   ReadStage (readers: records by position, admitted by the ring's bound)
//     -> MapStage (workers: the transform writes each sample into its slot)
//     -> BatchRing (in-flight batches; the completing worker assembles the batch)
//     -> Next() (the consumer, strictly in order; the device stage's copy when there is one)
//   TuningLoop (watchdog + autotuner, every 200 ms) moves the workers, reads in flight and ring
//   depth while the epoch runs: threads beyond a target park; new ones start on demand.
//
// Locks are std::mutex (pthread) rather than absl::Mutex: Debian's prebuilt Abseil is not
// instrumented, so ThreadSanitizer could not see absl::Mutex's ordering. They are taken once per
// batch, never per sample; per-sample hand-offs are lock-free (atomics and the TBB queue).
//
// Thread safety: `Next()` is called by one consumer thread; `Cancel()` and the setters may be
// called from any thread. The destructor cancels and joins every thread it started.
#ifndef FEEDLINE_SRC_ENGINE_EPOCH_RUN_H_
#define FEEDLINE_SRC_ENGINE_EPOCH_RUN_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/batch_ring.h"
#include "engine/epoch_core.h"
#include "engine/loader_shared.h"
#include "engine/map_stage.h"
#include "engine/read_stage.h"
#include "engine/replacement.h"
#include "engine/tuning_loop.h"
#include "feedline/batch.h"

namespace feedline {

class EpochRun {
 public:
  // `head_start`: the next epoch, started before it is asked for (LoaderShared::head_start):
  // not the loader's active epoch, and no device copies, until Adopt().
  // `skip`: a resumed epoch's positions delivered on another layout (EpochOrder).
  // `selection`: only these batches of the epoch, or `feed`: those it hands this run
  // (Loader::StartBatches): not the loader's active epoch either (no resume position, no head
  // start after it).
  EpochRun(std::shared_ptr<LoaderShared> shared, int64_t epoch, int64_t start_batch,
           bool head_start = false, int64_t skip = 0, std::vector<int64_t> selection = {},
           std::shared_ptr<BatchFeed> feed = nullptr);
  ~EpochRun();
  // Batches whose device copy is queued before the consumer asks for them: the worker that
  // assembles batch j queues its copy at once when j <= consumed + kDeviceLookahead, and the
  // consumer queues the ready ones that were beyond that window when it takes a batch (the
  // copy of b+1 runs during the consumer's step on b, also when that step synchronises the
  // device).
  static constexpr int kDeviceLookahead = 2;

  EpochRun(const EpochRun&) = delete;
  EpochRun& operator=(const EpochRun&) = delete;

  // The next batch; kOutOfRange at the end; kCancelled after Cancel(). While waiting it calls
  // `interrupted` every `poll` (if given): a non-OK status from it is returned (the batch
  // stays queued, so the call can be repeated).
  absl::StatusOr<Batch> Next(const std::function<absl::Status()>& interrupted = nullptr,
                             absl::Duration poll = absl::Milliseconds(100));
  // Stops the stages and the hand-out: later Next() calls return kCancelled.
  void Cancel();
  // A head start becomes the loader's epoch (under LoaderShared::epochs.mu, by StartEpoch, on
  // the consumer's thread): its device copies and its tuning loop start now.
  void Adopt();

  void SetWorkers(int n);
  void SetIoDepth(int n);
  void SetPrefetch(int n);

  int64_t epoch() const { return core_.epoch; }
  int64_t num_batches() const { return core_.num_batches; }
  int64_t skip() const { return core_.skip; }
  int64_t consumed() const { return ring_.consumed(); }
  // True in a child of fork() made after this run started: its threads are the parent's, and
  // its locks and condition variables may be held or waited on by them. Such a run must be
  // leaked, never touched or destroyed (glibc's pthread_cond_destroy would wait forever).
  bool forked() const;
  // True on one of this run's reader or worker threads.
  bool on_own_thread() const { return internal::worker_of == &core_; }
  // After Cancel(): true once the workers have left this epoch (within `wait`), false if one is
  // still inside a sample (user code that does not return: a hung Python __getitem__).
  bool WorkersDone(std::chrono::milliseconds wait) {
    return map_.WaitUntilDone(std::chrono::steady_clock::now() + wait);
  }

 private:
  // Ends the stages (their threads joined, read buffers freed); the assembled batches stay in
  // the ring for Next(). Shutdown() also gives back the slots of batches never handed out.
  void StopStages();
  void Shutdown();
  // Wakes and stops the stages' threads (without joining them).
  void StopStageThreads();
  // Once every batch of this epoch is made: the loader's next epoch starts as a head start
  // (options.epoch_head_start), unless the loader was told another one. Consumer thread.
  void MaybeStartNext();
  // Gives back the slots lent to the head start's admission (LoaderShared::lent): one as a
  // batch is taken (`all`: false), the rest when the hand-out ends.
  void ReturnLent(bool all);
  absl::Status TooManyErrors();  // max_errors exceeded: the error to give the consumer
  // The device batch of b: the one submitted early, else submitted now.
  absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> OnDevice(
      int64_t b, std::shared_ptr<internal::BatchSlot> slot, int64_t n);
  // Queues the copies of the ready batches after b, up to kDeviceLookahead.
  void SubmitAhead(int64_t b);
  // Submits batch j's copy and keeps it in early_; false when the submission failed.
  bool QueueCopy(int64_t j, const std::shared_ptr<internal::BatchSlot>& slot, int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(early_mu_);
  // The ring's hook: a worker assembled batch j; its copy is queued when j is near enough.
  void OnAssembled(int64_t j, const std::shared_ptr<internal::BatchSlot>& slot, int64_t n);

  EpochCore core_;
  BatchRing ring_;
  ItemQueues queues_;
  Replacement replacement_;
  ReadStage read_;
  MapStage map_;
  TuningLoop tuning_;
  const uint64_t fork_generation_;  // the process generation that started the threads

  // When Next() returned, and the scheduler's figures of the thread it returned to (-1: none).
  void MarkReturn();
  int64_t last_return_ns_ = 0;  // consumer thread only
  pid_t returned_to_ = -1;
  int64_t returned_cpu_ns_ = 0, returned_delay_ns_ = 0;
  int64_t held_samples_ = 0;  // the last returned batch's samples; consumer thread only
  // Device copies queued ahead, by batch (by workers and the consumer; each batch's copy is
  // queued once: the submission happens under the lock).
  std::mutex early_mu_;
  std::map<int64_t, std::shared_ptr<internal::DeviceBatch>> early_ ABSL_GUARDED_BY(early_mu_);
  TraceTrack* consumer_track_ = nullptr;
  TraceTrack* batch_track_ = nullptr;
  std::mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  bool stages_stopped_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  std::atomic<bool> handout_cancelled_{false};  // Cancel(): Next() returns kCancelled
  std::atomic<bool> adopted_;                   // false while a head start (no device copies)
  bool next_tried_ = false;                     // MaybeStartNext ran; consumer thread only
  std::atomic<int> lent_{0};                    // this run's share of LoaderShared::lent
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_EPOCH_RUN_H_
