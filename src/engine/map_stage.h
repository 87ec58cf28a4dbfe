// The map stage: worker threads that run the transform on each record and write the sample
// straight into its place in its batch slot. For data sets with empty records (computed from
// the index) there is no read stage: the workers claim chunks of positions themselves.
//
// A failure (the read's, the transform's status, an exception from user code, a sample that
// does not fit its field) becomes the sample's error, named by the data set's Describe(); under
// on_error = skip the position is given a replacement sample (read by the retry reader), under
// raise the error is the batch's. The worker that completes a batch assembles it (variable
// fields packed in place) and wakes the consumer.
//
// The workers are the loader's (LoaderShared::Workers): each id's loop runs on the same thread,
// with the same WorkerState, epoch after epoch.
//
// Thread safety: SetThreads, Stop and WaitUntilDone from any thread.
#ifndef FEEDLINE_SRC_ENGINE_MAP_STAGE_H_
#define FEEDLINE_SRC_ENGINE_MAP_STAGE_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/clock.h"
#include "core/trace.h"
#include "engine/batch_ring.h"
#include "engine/epoch_core.h"
#include "engine/read_stage.h"
#include "engine/replacement.h"
#include "engine/worker_pool.h"
#include "feedline/transform.h"

namespace feedline {

class MapStage {
 public:
  MapStage(EpochCore* core, BatchRing* ring, ItemQueues* queues, ReadStage* read,
           Replacement* replacement)
      : core_(core), ring_(ring), queues_(queues), read_(read), replacement_(replacement) {}

  // Starts workers up to `n` (surplus ones park).
  void SetThreads(int n);
  int threads();
  // After cancellation: starts no more workers, and waits until every started one is done.
  void Stop();
  // After cancellation: true once every started worker is done, false at `deadline` if one is
  // still in a sample (user code that does not return).
  bool WaitUntilDone(std::chrono::steady_clock::time_point deadline);

 private:
  // A worker's CPU time, read at most every kEveryNs of wall time and added to the stage's
  // counter: the thread CPU clock is a system call (not in the vDSO), and read twice per chunk
  // it took 2.4% of a tokenizing worker's time (perf, feedline-bench --compare-text). The CPU
  // spent between chunks (the hand-off) is the worker's too, so it is counted.
  // CPU a transform reported as spent elsewhere for the worker (ReportOffThreadCpu) is added too.
  // The destructor adds the last interval's, however the worker's loop ends.
  class CpuMeter {
   public:
    explicit CpuMeter(StageCounters* to) : to_(to) {}
    ~CpuMeter() { Read(NowNs(), /*force=*/true); }
    // Adds the CPU used since the last reading when kEveryNs passed since (or `force`).
    void Read(int64_t now, bool force = false);

   private:
    static constexpr int64_t kEveryNs = 2000000;
    StageCounters* const to_;
    int64_t cpu_ = ThreadCpuNs(), wall_ = NowNs();
  };
  void WorkerLoop(int id, SampleTransform::WorkerState* state);
  // After an item of `n` samples (the first: `first`) mapped from t1 (wall): the stage's
  // counters, the trace, and the chunk size from the smoothed time per sample.
  void Account(int n, int64_t first, int64_t t1, CpuMeter* cpu, double* map_ns, TraceTrack* track);
  // Without a read stage: claim a chunk, read and map it in this thread.
  void InlineLoop(int id, SampleTransform::WorkerState* state, std::vector<uint8_t>* scratch,
                  TraceTrack* track);
  // Maps every entry of an item into its slot, sends failed ones for a replacement read (skip)
  // and gives the item back (to the free queue, or the retry pool).
  void ProcessItem(ReadItem* item, SampleTransform::WorkerState* state,
                   std::vector<uint8_t>* scratch);

  EpochCore* const core_;
  BatchRing* const ring_;
  ItemQueues* const queues_;
  ReadStage* const read_;
  Replacement* const replacement_;
  std::mutex mu_;
  std::vector<WorkerPool::Ticket> workers_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_MAP_STAGE_H_
