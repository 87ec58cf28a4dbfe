// feedline-bench: running a feedline loader and measuring it — whole epochs (the plain run and
// --compare-torch) or a time window after a warm-up (--tune-grid) — with an optional simulated
// training step; plus the JSON and SVG views of the loader's own statistics.
//
// Thread safety: the functions drive the loader from the calling thread (its one consumer).
#ifndef FEEDLINE_BENCH_LOADER_RUN_H_
#define FEEDLINE_BENCH_LOADER_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench_util.h"
#include "feedline/batch.h"
#include "feedline/loader.h"
#include "feedline/stats.h"
#include "svg_plot.h"

namespace feedline::bench {

// FNV-1a over a few bytes of every batch: enough that the loop cannot be optimised away and
// that two runs with the same seed can be compared, without reading whole batches (which would
// make the consumer, not the loader, the thing measured).
class BatchChecksum {
 public:
  void Add(const feedline::Batch& batch);
  uint64_t value() const { return hash_; }

 private:
  void Mix(uint64_t v);
  uint64_t hash_ = 0xCBF29CE484222325ULL;
};

struct EpochFigures {
  int64_t epoch = 0;
  int64_t images = 0;
  double start_s = 0;  // since the first epoch of the run started
  double seconds = 0;
  double cpu_seconds = 0;
  double images_per_s() const { return seconds > 0 ? double(images) / seconds : 0; }
};

struct EpochRunOptions {
  int epochs = 3;
  double consumer_ms = 0;  // the simulated training step, per batch (0: none)
  bool progress = true;    // a progress line on a terminal
  bool print_epochs = true;
  std::string label;  // printed before each epoch's line
};

struct EpochRunResult {
  std::vector<EpochFigures> epochs;
  // The summary leaves out the first epoch (warm-up: page cache, thread start, the tuner's
  // first moves) when there is more than one.
  int first_steady_epoch = 0;
  double images_per_s = 0;  // total images over total time of the steady epochs
  double cpu_seconds_per_image = 0;
  double other_cores = -1;  // mean cores other processes took during the steady epochs
  uint64_t checksum = 0;
  feedline::Stats stats;  // at the end
};

// Runs `options.epochs` epochs, consuming every batch (sleeping `consumer_ms` per batch).
absl::StatusOr<EpochRunResult> RunEpochs(feedline::Loader& loader, const EpochRunOptions& options);

struct WindowOptions {
  int warmup_batches = 2;  // batches consumed before the window opens
  double seconds = 6;      // the window closes at the first batch after this long
  double consumer_ms = 0;
};

// The window's CPU is divided by the images decoded in it, not by those delivered: the two
// differ by what the ring holds, which a short window would otherwise charge to one setting
// (a deep ring still filling) or the other.
struct WindowResult {
  int64_t images = 0;         // delivered in the window
  int64_t decoded = 0;        // decoded in the window
  double seconds = 0;         // from the last warm-up batch to the last batch counted
  double cpu_seconds = 0;     // this process's CPU over the same span
  double other_cores = -1;    // mean cores other processes used meanwhile (-1: unknown)
  double warmup_s = 0;        // from the first StartEpoch to the window's opening
  double first_epoch_s = -1;  // how long the loader's first epoch took (-1: it did not end)
  feedline::Stats stats;
  double images_per_s() const { return seconds > 0 ? double(images) / seconds : 0; }
  double cpu_seconds_per_image() const { return decoded > 0 ? cpu_seconds / double(decoded) : 0; }
};

// Runs epochs one after another on the same loader until the window has lasted `seconds`,
// counting what is delivered after the warm-up.
absl::StatusOr<WindowResult> RunWindow(feedline::Loader& loader, const WindowOptions& options);

// "w2 p8 d32": a setting as the tables print it.
std::string SettingName(int workers, int prefetch, int io_depth);

// Writes the loader's settings, verdict, stages and tuning events as members of the JSON
// object being written; with `timeline`, the sampled timeline too.
void WriteStatsJson(const feedline::Stats& stats, bool timeline, JsonWriter& json);

// Prints the tuning events (at most `max_lines`, the last ones) to stdout.
void PrintTuning(const feedline::Stats& stats, size_t max_lines);

// Adds the run's timeline to `figure`: images/s over time (epoch starts and tuning events
// marked), then the tuner's settings over time.
void AddTimelinePlot(const feedline::Stats& stats, const std::vector<EpochFigures>& epochs,
                     SvgFigure& figure);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_LOADER_RUN_H_
