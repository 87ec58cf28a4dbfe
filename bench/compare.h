// feedline-bench --compare-torch: feedline against what users run today and against what the
// hardware allows, in one run, on the same files (issue 5's targets).
//
// In order, after reading every file once (the page cache then holds them all):
//   1. feedline from C++ (this process), default settings;
//   2. feedline from Python (bench/feedline_py.py in a child process), default settings;
//   3. the peer, torch.utils.data.DataLoader over torchvision's ImageFolder with
//      RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, persistent workers
//      (bench/peer_torch.py), once per worker count tried; the best count is the peer;
//   4. the full-decode limit: one thread decoding every file in full from memory, times the
//      cores;
//   5. the pipeline's own overhead: feedline on tiny JPEGs (see `PipelineOverhead`).
// Every contender runs the same number of epochs over the same images with the same batch
// size; images/s and CPU seconds per image are taken over the epochs after the first. CPU
// counts every thread and process of the contender; peak memory is the process's peak for
// feedline from C++, and the peak of the summed resident sets of the process tree, sampled
// from the outside, for the Python contenders.
//
// Thread safety: runs on the calling thread.
#ifndef FEEDLINE_BENCH_COMPARE_H_
#define FEEDLINE_BENCH_COMPARE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baselines.h"
#include "bench_util.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "loader_run.h"
#include "svg_plot.h"

namespace feedline::bench {

// The pipeline-overhead target: samples/s with reading and decoding (almost) free.
inline constexpr double kPipelineTarget = 50000;

// What feedline's pipeline costs per sample when the samples cost (almost) nothing to read and
// decode, as --compare-torch measures it: tiny 8 x 8 JPEGs delivered at 1 x 1 pixels, a lower
// bound on the pipeline's samples/s; subtracting what one thread spends reading and decoding a
// tiny file on its own estimates the pipeline's own CPU per sample. (`--source synthetic`,
// LoaderOptions::synthetic, measures the pipeline with no read or decode at all.)
struct PipelineOverhead {
  int cores = 1;
  double samples_per_s = 0;              // measured (steady epochs)
  double cpu_us_per_sample = 0;          // this process's CPU, all threads
  double read_decode_us_per_sample = 0;  // one thread, no pipeline
  double other_cores = -1;
  // Estimates from the two: the pipeline's CPU per sample, and the samples/s it would allow on
  // all cores if reading and decoding were free.
  double pipeline_cpu_us_per_sample() const;
  double pipeline_only_samples_per_s() const;
};

// Measures the read+decode cost of the samples `run` went through and derives the estimate.
absl::StatusOr<PipelineOverhead> EstimatePipelineOverhead(const feedline::Loader& loader,
                                                          const EpochRunResult& run);
void PrintPipelineOverhead(const PipelineOverhead& overhead);
// Writes `"pipeline_overhead": {...}` into the JSON object being written.
void WritePipelineOverheadJson(const PipelineOverhead& overhead, JsonWriter& json);

struct CompareOptions {
  std::string data;  // an ImageFolder directory
  int64_t batch_size = 256;
  int epochs = 3;
  uint64_t seed = 0;
  int workers = feedline::kAuto;  // feedline's settings (auto unless the user fixed them)
  int prefetch = feedline::kAuto;
  int io_depth = feedline::kAuto;
  std::vector<int> torch_workers;  // the peer's worker counts to try
  std::string python;              // the interpreter for the helpers
  std::string script_dir;          // where peer_torch.py and feedline_py.py are
  std::string pythonpath;          // prepended to PYTHONPATH ("" = leave it)
  std::string tiny_list;           // the pipeline-overhead data set's list file
  std::string trace;               // the C++ loader's trace goes here ("" = none)
  bool progress = true;
};

struct Contender {
  std::string name;
  std::vector<EpochFigures> epochs;
  double images_per_s = 0;           // steady epochs
  double cpu_seconds_per_image = 0;  // steady epochs, all threads and processes
  int64_t peak_bytes = 0;
  int64_t pss_bytes = -1;  // process trees: Pss near the peak (-1: not measured)
  int processes = 1;
  double other_cores = -1;
  int torch_workers = 0;                    // the peer's trials
  std::map<std::string, std::string> info;  // what a helper reported about itself
};

struct CompareResult {
  CompareOptions options;
  int cores = 1;
  int64_t files = 0;
  int64_t bytes = 0;
  double warm_cache_s = 0;
  Contender feedline_cpp;
  feedline::Stats feedline_cpp_stats;
  Contender feedline_py;
  std::vector<Contender> peer_trials;
  size_t peer_best = 0;
  DecodeLimit decode;
  DecodeLimit floor;  // the 1/8-scale decode: what a crop path cannot beat
  // The floor measured three times (images/s, x cores): right after each feedline contender
  // and at [4/5]. The floor ratios are to their mean: this shared machine's speed drifts by
  // 10-30% within a run, and the one measurement at [4/5] alone moved the ratio by 0.1.
  std::vector<double> floor_checks;
  double floor_mean = 0;
  // The floor with every core decoding at once (MeasureDecodeAllCores): the machine's own
  // limit, beside the target's cores x one thread.
  DecodeLimit floor_all_cores;
  PipelineOverhead overhead;
  double seconds = 0;
  const Contender& peer() const { return peer_trials[peer_best]; }
};

absl::StatusOr<CompareResult> RunComparison(const CompareOptions& options);
// The table ("baseline / optimized") and the ratios against the targets.
void PrintComparison(const CompareResult& result);
// Writes `"compare_torch": {...}` into the JSON object being written.
void WriteCompareJson(const CompareResult& result, JsonWriter& json);
// Bars: images/s, CPU per image, peak memory, pipeline samples/s.
void AddComparePlot(const CompareResult& result, SvgFigure& figure);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_COMPARE_H_
