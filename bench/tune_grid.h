// feedline-bench --tune-grid: does the autotuner find what the best hand-set configuration
// gives, without burning CPU that buys nothing? (issue 4's targets)
//
// Three regimes, each run with auto settings and with every fixed setting of
// workers {1, 2, 4} x prefetch {2, 8} x io depth {1, 32}, one loader per setting (kept across
// its epochs), each measured over a time window after a short warm-up:
//   (a) decode-bound: local files, the consumer takes batches at once;
//   (b) slow storage: every read takes `io_latency_ms` more (simulated remote storage);
//   (c) slow consumer: a training step of `consumer_ms` per batch, by default twice the time
//       (a)'s best setting takes to deliver a batch, so the step clearly limits.
// For each regime: auto's images/s against the best fixed setting's (target >= 0.95x); CPU
// seconds per image (getrusage deltas: the loader's threads are in this process) against the
// leanest fixed setting within 5% of the best (target in (c): <= 1.15x); and when auto settled
// (its last tuning event; target: within 2 s or the first epoch).
//
// The sweep picks the best and the leanest setting, but the best of twelve noisy windows is
// biased upwards (the winner's curse: on a shared 2-core VM one window varies by 5-10%). So the
// ratios come from confirmation rounds run after the sweep: auto, the best and the leanest
// setting again, interleaved, `confirm_rounds` times, compared by their means. The settle time
// is the latest over all of auto's runs.
//
// Thread safety: runs on the calling thread, one loader at a time.
#ifndef FEEDLINE_BENCH_TUNE_GRID_H_
#define FEEDLINE_BENCH_TUNE_GRID_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench_util.h"
#include "feedline/options.h"
#include "feedline/stats.h"
#include "loader_run.h"
#include "svg_plot.h"

namespace feedline::bench {

struct GridOptions {
  std::string data;
  int64_t batch_size = 64;
  uint64_t seed = 0;
  feedline::Transform transform = feedline::Transform::kTrain;
  feedline::Layout layout = feedline::Layout::kNCHW;
  double io_latency_ms = 20;  // regime (b)
  double consumer_ms = 0;     // regime (c); 0: twice (a)'s best time per batch
  double seconds = 6;         // each setting's measurement window
  int warmup_batches = 2;
  int confirm_rounds = 2;  // auto, best and leanest again, interleaved, after the sweep
};

struct GridConfig {
  bool is_auto = false;
  int workers = 0, prefetch = 0, io_depth = 0;  // as requested (0 = auto)
  WindowResult run;
  std::string name() const;
};

struct GridRegime {
  std::string key;   // "a", "b", "c"
  std::string name;  // "decode-bound", ...
  double io_latency_ms = 0;
  double consumer_ms = 0;
  std::vector<GridConfig> configs;  // [0] is auto

  // Chosen once the sweep has run (Choose()).
  int best_fixed = -1;  // index into configs
  int leanest = -1;     // the least CPU per image among fixed settings within 5% of the best
  void Choose();
  // The confirmation rounds: runs of auto, the best and the leanest setting (Evaluate()).
  std::vector<WindowResult> auto_runs, best_runs, lean_runs;
  double auto_images_per_s = 0, best_images_per_s = 0;  // means over the rounds
  double auto_cpu_per_image = 0, lean_cpu_per_image = 0;
  double auto_vs_best = 0;
  double auto_cpu_vs_leanest = 0;
  double settle_s = 0;        // auto's last tuning event, the latest over its runs
  double settle_limit_s = 0;  // max(2 s, auto's first epoch)
  void Evaluate();
};

struct GridResult {
  GridOptions options;
  int cores = 1;
  std::vector<GridRegime> regimes;
  double seconds = 0;  // the whole grid
};

// Runs the grid, printing each setting's line as it completes.
absl::StatusOr<GridResult> RunTuneGrid(const GridOptions& options);

// The summary table and the verdicts against the targets.
void PrintGridSummary(const GridResult& grid);
// Writes `"tune_grid": {...}` into the JSON object being written.
void WriteGridJson(const GridResult& grid, JsonWriter& json);
// One bar panel of images/s per regime, and the CPU per image of regime (c).
void AddGridPlot(const GridResult& grid, SvgFigure& figure);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_TUNE_GRID_H_
