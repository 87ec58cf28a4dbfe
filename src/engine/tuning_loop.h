// The tuning loop: one thread per epoch that, every 200 ms, fails reads past the read timeout
// (the watchdog), samples the pipeline's counters, feeds them to the autotuner (src/tune/, a
// pure model) and applies the settings it returns; it also records the timeline and the
// queues' occupancy behind stats().
//
// Thread safety: Start once; Stop from any thread (after the epoch is cancelled).
#ifndef FEEDLINE_SRC_ENGINE_TUNING_LOOP_H_
#define FEEDLINE_SRC_ENGINE_TUNING_LOOP_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/batch_ring.h"
#include "engine/epoch_core.h"
#include "engine/read_stage.h"
#include "tune/autotuner.h"

namespace feedline {

class TuningLoop {
 public:
  using Apply = std::function<void(const TunerSettings& from, const TunerSettings& to)>;
  TuningLoop(EpochCore* core, BatchRing* ring, ItemQueues* queues, ReadStage* read, Apply apply)
      : core_(core), ring_(ring), queues_(queues), read_(read), apply_(std::move(apply)) {}

  void Start();
  // Wakes the thread (cancellation) and moves it to `join`.
  void Stop(std::vector<std::thread>* join);

 private:
  // Counter values at the previous tick.
  struct Counters {
    int64_t samples = 0, consumer_busy = 0, stepped_samples = 0, consumer_wait = 0, steady_wait = 0,
            mapped = 0, map_busy = 0, reads = 0, read_busy = 0, map_cpu = 0, consumer_cpu = 0;
  };
  Counters ReadCounters() const;
  void Loop();
  void Tick(double interval_s);

  EpochCore* const core_;
  BatchRing* const ring_;
  ItemQueues* const queues_;
  ReadStage* const read_;
  const Apply apply_;
  Counters last_;  // the tuning thread's
  std::mutex mu_;  // the thread sleeps here between ticks
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_TUNING_LOOP_H_
