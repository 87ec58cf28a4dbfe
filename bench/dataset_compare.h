// feedline-bench --compare-dataset: a C++ user data set (torch::data::Dataset) through feedline
// (feedline::torch::make_data_loader) against the same data set through
// torch::data::make_data_loader with its best worker count, in the same run.
//
// Variants of one data set whose samples are fixed-size float tensors computed from the index:
//   overhead  64 floats; get() hands out one of 64 stored samples (hot in the cache): what is
//             measured is the loaders' own per-sample and per-batch costs (queueing, Stack)
//   cheap     64 floats computed once per index, in memory (100,000 stored tensors, as an
//             in-memory TensorDataset): get() is a lookup with its cache misses
//   computed  the same 64 floats made by every get(): two tensor allocations per sample
//   costly    1024 floats, 64 sin() per float: the sample's compute dominates
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
  std::string variant = "all";  // "overhead", "cheap", "computed", "costly" or "all"
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
  int64_t stored = 0;  // distinct samples kept in memory (0: computed by every get())
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
