// feedline — what the loader measured about itself.
//
// Every stage counts the time it spends working (busy) and waiting for its input or for room
// downstream (wait). The consumer's wait is the figure that matters: time the training loop
// spent blocked in `Next()`. `bottleneck` names the stage that limits throughput. The words are
// the engine's, for any workload: samples, the map stage (the transform: decode, tokenize, a
// user's code) and its workers.
//
// Thread safety: a plain value (a snapshot); `Loader::stats()` may be called from any thread.
#ifndef FEEDLINE_STATS_H_
#define FEEDLINE_STATS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "feedline/dataset.h"  // RemoteStats

namespace feedline {

struct StageStats {
  std::string name;       // "read", "map", "consumer", "copy"
  double busy_s = 0;      // summed over the stage's threads
  double wait_s = 0;      // summed over the stage's threads
  int64_t items = 0;      // samples (read, map) or batches (consumer, copy)
  int threads = 0;        // threads currently active in the stage
  double occupancy = -1;  // mean fill of the stage's output queue, 0..1 (-1: not measured)
};

struct SampleError {
  std::string path;   // the sample, as the data set names it
  std::string cause;  // what went wrong (without the name)
  int64_t sample = -1;  // index in the data set
  int64_t epoch = -1;
};

// One change the autotuner made, and why.
struct TuningEvent {
  double time_s = 0;  // since the loader's first epoch started
  int workers = 0;
  int io_depth = 0;
  int prefetch = 0;
  double samples_per_s = 0;  // measured over the interval that led to it
  std::string reason;
};

// The pipeline sampled every tuning interval (for plots).
struct TimelinePoint {
  double time_s = 0;
  double samples_per_s = 0;
  double consumer_wait_fraction = 0;
  int workers = 0;
  int io_depth = 0;
  int prefetch = 0;
  int64_t bytes_in_use = 0;
};

struct Stats {
  double elapsed_s = 0;               // since the loader's first epoch started
  int64_t samples = 0;                // samples delivered to the consumer
  int64_t batches = 0;                // batches delivered to the consumer
  double samples_per_s = 0;           // samples / elapsed_s
  double consumer_wait_s = 0;         // time the consumer spent blocked waiting for a batch
  double consumer_wait_fraction = 0;  // consumer_wait_s / elapsed_s: "starved x% of the time"
  double epoch_start_wait_s = 0;      // the part of consumer_wait_s spent waiting for the first
                                      // batch of an epoch (the pipeline filling up)
  // The consumer's steps (its thread between batches, from the kernel's scheduler figures;
  // 0 where it keeps none): CPU time, and time it was ready to run but waited for a core.
  // A run delay above a few % of the CPU time: the trainer is slowed by other threads.
  double consumer_cpu_s = 0;
  double consumer_run_delay_s = 0;
  std::vector<StageStats> stages;
  int worker_nice = 0;       // the map workers run this many nice levels below the process
  int workers = 0;           // map workers now (the threads that run the transform)
  int prefetch = 0;          // ring depth now (batches in flight)
  int io_depth = 0;          // reads in flight now
  int chunk = 1;             // samples per hand-off between the read and map stages now
  int64_t bytes_in_use = 0;  // ring slots + read buffers the loader owns now
  int64_t memory_budget = 0;
  int64_t slots_allocated = 0;    // ring slots alive now (batches the user holds included)
  int64_t slots_created = 0;      // ring slots ever allocated: stays near prefetch + 2 when
                                  // slots are recycled; grows when held batches outlive them
  std::string bottleneck;         // "storage", "map", "consumer", "copy" ("unknown" before data)
  std::string bottleneck_reason;  // the figures behind the verdict, one line
  bool auto_workers = false;      // which settings the autotuner controls
  bool auto_io_depth = false;
  bool auto_prefetch = false;
  double demand_samples_per_s = 0;  // the consumer's appetite (0: unknown; huge: unlimited)
  double map_ms_per_sample = 0;     // one map worker's time per sample (decode, tokenize, ...)
  double read_ms = 0;               // one read, latency included
  // The trainer: the cores the consumer's thread used (smoothed; measured by the autotuner when
  // it sizes the workers), how many of them the workers leave to it now, and why.
  double trainer_cores = 0;
  int cores_left_to_trainer = 0;
  std::string trainer_reason;
  std::vector<TuningEvent> tuning;  // the tuner's decisions, in order
  std::vector<TimelinePoint> timeline;
  std::string cache;  // "none", "bytes", "decoded"
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t cache_bytes = 0;
  int64_t cache_budget = 0;
  RemoteStats remote;  // the data set's requests when it reads over a network
  // The transform's own figures (SampleTransform::Counters), over the loader's life.
  std::vector<std::pair<std::string, int64_t>> transform_counters;
  int64_t error_count = 0;
  std::vector<SampleError> errors;  // the first few hundred, in the order they happened
};

}  // namespace feedline

#endif  // FEEDLINE_STATS_H_
