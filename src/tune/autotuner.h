// The autotuner: sets map workers, reads in flight and ring depth from what the pipeline
// measured, so that the consumer does not wait and no CPU is burnt beyond what achieves that.
//
// It is a model, not a blind hill-climb (tf.data's AUTOTUNE models its pipeline the same way):
// every interval it estimates
//   demand   samples/s the consumer would take if it never waited (samples / consumer busy time),
//   t_map seconds of one map worker per sample,
//   t_read   seconds one read takes (latency included),
// and sets
//   workers  = ceil(min(demand, cores / t_map) * t_map * headroom), within [1, cores]:
//              all cores when the map stage is the bottleneck, fewer when the consumer is;
//   io_depth = ceil(rate * t_read * headroom) + 1 (Little's law): many reads in flight when
//              storage is slow, without adding map workers; up only while the workers
//              wait for reads (t_read includes the reads' own queueing), down halfway;
//   prefetch + 1 when the consumer still waits although production keeps up on average (the
//              waits are jitter), within the memory budget.
// Workers go down one at a time, and every change is followed by a settling interval, so the
// controller does not oscillate.
//
// The trainer's cores: the consumer's own thread needs CPU too (a training step's Python, its
// kernel launches). The tuner measures it (trainer = the consumer thread's CPU time per second,
// smoothed) and does not give a worker the core it needs: when cores - ceil(trainer) workers
// cover the demand, workers stop there, a deep ring absorbing the jitter instead of a spare
// worker; when they cannot, the loader is the bottleneck and takes what is left (its workers
// run below the trainer's priority: LoaderOptions::worker_nice). A capped setting that starves
// the consumer is left for good.
//
// The cost of a sample depends on how many workers run at once (shared caches, memory
// bandwidth, SMT siblings): measured with w workers, the model can ask for w when w - 1, each
// faster alone, would cover the consumer. So when the consumer is the bottleneck and w - 1 is
// within reach, the tuner probes: w - 1 workers and a deep ring for a second, measuring the cost
// there. It keeps w - 1 if that covers the demand to within kProbeTolerance (no headroom: the
// ring absorbs jitter) and the consumer did not wait; otherwise it goes back to w and does not
// probe again (unless the demand falls well below what it was).
//
// The class is pure (no clock, no threads): `Update` takes one interval's measured deltas, so
// tests drive it with simulated timings. Thread safety: not thread-safe; one owner.
#ifndef FEEDLINE_SRC_TUNE_AUTOTUNER_H_
#define FEEDLINE_SRC_TUNE_AUTOTUNER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace feedline {

// What the stages did during one interval (deltas of the counters).
struct TunerSample {
  double interval_s = 0;
  int64_t samples_consumed = 0;
  double consumer_busy_s = 0;  // time the consumer spent outside Next()
  int64_t stepped_samples = 0;  // the samples of the steps in consumer_busy_s (counted when a
                                // step ends, not at the hand-out): the demand's numerator
  double consumer_wait_s = 0;  // time the consumer spent blocked in Next()
  int64_t mapped = 0;
  double map_busy_s = 0;  // summed over map workers (wall clock)
  double map_cpu_s = 0;   // the same work in CPU time (0: unknown, use map_busy_s); under
                          // contention wall time inflates and would ask for too few reads
  int64_t reads = 0;
  double read_busy_s = 0;  // summed over reader threads (the read latency included)
  double consumer_cpu_s = 0;  // CPU time of the consumer's thread (0: not measured)
  double at_s = 0;         // when the interval ended, since tuning began (0: sum of intervals)
};

struct TunerSettings {
  int workers = 1;
  int io_depth = 1;
  int prefetch = 2;
  bool operator==(const TunerSettings&) const = default;
};

struct TunerLimits {
  int max_workers = 1;  // cores
  int max_io_depth = 256;
  int max_prefetch = 8;  // what the memory budget allows
  bool tune_workers = true;
  bool tune_io_depth = true;
  bool tune_prefetch = true;
};

struct TunerDecision {
  double time_s = 0;  // since tuning started
  TunerSettings settings;
  double samples_per_s = 0;  // measured over the interval that led to the decision
  std::string reason;
};

class Autotuner {
 public:
  Autotuner(TunerLimits limits, TunerSettings initial);

  // Feeds one interval; returns the settings to apply now (possibly unchanged).
  TunerSettings Update(const TunerSample& sample);

  // The user fixed a setting: the tuner stops changing it.
  enum class Knob { kWorkers, kIoDepth, kPrefetch };
  void Fix(Knob knob, int value);

  const TunerSettings& settings() const { return settings_; }
  const std::vector<TunerDecision>& decisions() const { return decisions_; }
  void set_max_prefetch(int n) { limits_.max_prefetch = n; }
  // Estimates (EMA), for stats and tests; 0 before enough data.
  double demand_samples_per_s() const { return demand_; }
  double map_s_per_sample() const { return t_map_; }
  double read_s() const { return t_read_; }
  // The cores the consumer's thread uses (smoothed; 0 before it is measured), and how many of
  // the whole cores it needs the workers leave it now, with why.
  double trainer_cores() const { return trainer_; }
  int cores_left_to_trainer() const {
    return std::max(0, std::min(TrainerCoresNeeded(), limits_.max_workers - settings_.workers));
  }
  const std::string& trainer_reason() const { return trainer_reason_; }

  static constexpr double kHeadroom = 1.15;
  // io_depth changes only when the model asks for this much more or less (a dead band: reads in
  // flight are cheap, and a controller that chases noise never settles).
  static constexpr double kIoDeadBand = 0.25;
  static constexpr double kIoRaiseMargin = 1.4;
  static constexpr double kIoStartMargin = 2.0;  // before the first batch
  // Workers busy at least this fraction of an interval are fed: io_depth does not go up.
  static constexpr double kWorkersFed = 0.9;
  static constexpr size_t kMaxDecisions = 1000;
  static constexpr int kLeanPrefetch = 8;
  // A probe for one worker fewer starts when the model, at the current cost, needs at most this
  // many times w - 1 workers, and lasts this many measured intervals.
  static constexpr double kProbeReach = 1.35;
  static constexpr int kProbeIntervals = 4;
  // Fewer workers are kept when they cover all but this fraction of the demand (and the
  // consumer was not starved meanwhile): a whole map worker saved for at most a 3% slower
  // feed (the deep ring absorbs most of it), and a borderline measurement does not flip.
  static constexpr double kProbeTolerance = 0.03;
  static constexpr int kDemandWindow = 6;  // intervals (1.2 s) over which demand is measured
  // Workers go up without the consumer waiting only when the model is more than this short.
  static constexpr double kUpDeadBand = 0.08;
  // The consumer is starved when it waits more than this fraction of the time (smoothed).
  static constexpr double kStarvedWait = 0.04;
  static constexpr int kProbeAfter = 3;  // intervals at the current settings before a probe
  // A consumer thread using less than this fraction of a core needs none kept back.
  static constexpr double kTrainerMinCore = 0.05;

 private:
  // Whole cores the consumer's thread needs: ceil(trainer), 0 below kTrainerMinCore.
  int TrainerCoresNeeded() const {
    return trainer_ > kTrainerMinCore ? int(std::ceil(trainer_ - kTrainerMinCore)) : 0;
  }
  TunerLimits limits_;
  TunerSettings settings_;
  std::vector<TunerDecision> decisions_;
  double time_s_ = 0;
  double demand_ = 0, t_map_ = 0, t_read_ = 0;
  double trainer_ = 0;               // cores of the consumer's thread (EMA)
  bool capped_for_trainer_ = false;  // workers held at cores - ceil(trainer) for it
  bool trainer_cap_failed_ = false;  // the cap starved the consumer once: not applied again
  std::string trainer_reason_;
  std::pair<int64_t, double> demand_window_[kDemandWindow] = {};  // samples, consumer busy s
  int64_t demand_next_ = 0;
  int settle_ = 0;            // intervals to wait after a change
  int steady_ = 0;            // intervals measured since the last change
  double wait_ema_ = 0;       // the consumer's wait fraction, smoothed
  bool lean_ = false;         // fewer workers + a deep ring (consumer-bound)
  bool lean_failed_ = false;  // lean mode starved the consumer once: not tried again
  struct Probe {
    bool active = false;
    int from_workers = 0;      // the setting to go back to
    double t_map_from = 0;     // the cost measured there
    int measured = 0;          // intervals measured so far (after the settling one)
    int64_t mapped = 0;
    double map_s = 0, wait_s = 0, interval_s = 0;
  } probe_;
  double probe_failed_demand_ = 0;  // demand when a probe last failed (0: none failed)

  // Runs the probe for one interval; returns true while it goes on (or just ended with a
  // decision), in which case Update changes nothing else this interval.
  bool StepProbe(const TunerSample& s, double rate);
  // Applies `next` and records the decision; the next `settle` intervals change nothing.
  void Decide(const TunerSettings& next, int settle, double rate, std::string reason);
  // The reads in flight for `rate` samples/s (Little's law, dead band; a raise goes
  // `raise_margin` past the estimate).
  int IoDepthFor(double rate, double raise_margin) const;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_TUNE_AUTOTUNER_H_
