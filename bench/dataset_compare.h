// feedline-bench --compare-dataset: a C++ user data set (torch::data::Dataset) through feedline
// (feedline::torch::make_data_loader) against the same data set through
// torch::data::make_data_loader with its best worker count, in the same run.
//
// Two variants of one data set whose samples are fixed-size float tensors computed from the
// index: "cheap" (64 floats, no arithmetic: the loaders' own per-sample and per-batch costs
// dominate — torch::data's queueing and Stack) and "costly" (1024 floats, 64 sin() per float:
// the sample's own compute dominates).
#ifndef FEEDLINE_BENCH_DATASET_COMPARE_H_
#define FEEDLINE_BENCH_DATASET_COMPARE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench_util.h"

namespace feedline::bench {

struct DatasetCompareOptions {
  int64_t batch_size = 64;
  int epochs = 3;                  // figures over epochs 2..epochs
  std::vector<int> torch_workers;  // DataLoaderOptions::workers to try (0: the main thread)
  bool quiet = false;
  std::string variant = "both";  // "cheap", "costly" or "both"
};

struct DatasetContender {
  std::string loader;  // "feedline" or "torch::data"
  int workers = 0;     // feedline: where auto ended
  double samples_per_s = 0;
  double cpu_ms_per_sample = 0;
  uint64_t checksum = 0;
};

struct DatasetVariantResult {
  std::string name;
  int64_t samples = 0, features = 0, ops_per_feature = 0;
  DatasetContender feedline;
  std::vector<DatasetContender> torch;  // one per worker count
  DatasetContender best_torch;
  double ratio = 0;  // feedline / best torch::data, samples/s
};

// Runs both variants; prints a table; returns the figures.
absl::StatusOr<std::vector<DatasetVariantResult>> RunDatasetComparison(
    const DatasetCompareOptions& options);
void WriteDatasetJson(const std::vector<DatasetVariantResult>& results, JsonWriter& json);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_DATASET_COMPARE_H_
