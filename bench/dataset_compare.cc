#include "dataset_compare.h"

// clang-format off
#include "feedline/torch_data.h"
#undef CHECK
#include <torch/torch.h>
// clang-format on

#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_join.h"

namespace feedline::bench {
namespace {

// Sample i: `features` floats, each the result of `ops` sin() steps from (i, j); label i % 1000.
// In memory (`in_memory`): the tensors are computed once, at construction, and get() hands out
// the stored ones (as an in-memory TensorDataset does; copies of the data set share them).
class Features : public ::torch::data::datasets::Dataset<Features> {
 public:
  // `stored`: how many distinct samples are kept in memory (0: none, every get() computes its
  // sample); sample i is the stored i % stored.
  Features(size_t n, int64_t features, int ops, size_t stored)
      : n_(n), features_(features), ops_(ops) {
    if (stored > 0) {
      auto table = std::make_shared<std::vector<::torch::data::Example<>>>();
      table->reserve(stored);
      for (size_t i = 0; i < stored; ++i) table->push_back(Make(i));
      table_ = std::move(table);
    }
  }
  ::torch::data::Example<> get(size_t i) override {
    return table_ ? (*table_)[i % table_->size()] : Make(i);
  }
  ::torch::optional<size_t> size() const override { return n_; }

 private:
  ::torch::data::Example<> Make(size_t i) const {
    ::torch::Tensor x = ::torch::empty({features_}, ::torch::kFloat);
    float* p = x.data_ptr<float>();
    for (int64_t j = 0; j < features_; ++j) {
      float v = float(i) * 1e-3f + float(j);
      for (int k = 0; k < ops_; ++k) v = std::sin(v) * 1.0001f + 0.5f;
      p[j] = v;
    }
    return {x, ::torch::tensor(int64_t(i % 1000))};
  }
  size_t n_;
  int64_t features_;
  int ops_;
  std::shared_ptr<const std::vector<::torch::data::Example<>>> table_;
};

// What every consumer does with a batch: read it (a checksum of a few values), no more.
uint64_t Touch(const ::torch::Tensor& data, const ::torch::Tensor& target) {
  const float* d = data.data_ptr<float>();
  const int64_t* t = target.data_ptr<int64_t>();
  uint32_t bits = 0;
  std::memcpy(&bits, &d[data.numel() - 1], 4);
  return (uint64_t(bits) * 1099511628211ULL) ^ uint64_t(t[0]) ^ uint64_t(data.size(0));
}

// Runs `epochs` epochs of `run_epoch` (which returns samples and a checksum); figures over the
// epochs after the first.
template <typename RunEpoch>
DatasetContender Measure(const char* name, int epochs, RunEpoch run_epoch) {
  DatasetContender c;
  c.loader = name;
  (void)run_epoch();  // warm-up: threads start, the tuner settles
  const double cpu0 = CpuSeconds();
  const Clock::time_point t0 = Clock::now();
  int64_t samples = 0;
  for (int e = 1; e < epochs; ++e) {
    auto [n, sum] = run_epoch();
    samples += n;
    c.checksum += sum;
  }
  const double wall = SecondsSince(t0);
  c.samples_per_s = double(samples) / wall;
  c.cpu_ms_per_sample = (CpuSeconds() - cpu0) * 1e3 / double(samples);
  return c;
}

DatasetVariantResult RunVariant(const DatasetCompareOptions& o, const char* name, size_t n,
                                int64_t features, int ops, size_t stored) {
  DatasetVariantResult r;
  r.name = name;
  r.samples = int64_t(n);
  r.features = features;
  r.ops_per_feature = ops;
  r.stored = int64_t(stored);
  const Features dataset(n, features, ops, stored);
  {
    auto loader = feedline::torch::make_data_loader(
        dataset, feedline::LoaderOptions().batch_size(o.batch_size));
    r.feedline = Measure("feedline", o.epochs, [&] {
      int64_t samples = 0;
      uint64_t sum = 0;
      for (auto& batch : *loader) {
        samples += batch.data.size(0);
        sum += Touch(batch.data, batch.target);
      }
      return std::make_pair(samples, sum);
    });
    r.feedline.workers = loader->stats().workers;
  }
  for (int w : o.torch_workers) {
    auto loader = ::torch::data::make_data_loader(
        Features(dataset).map(::torch::data::transforms::Stack<>()),
        ::torch::data::DataLoaderOptions().batch_size(size_t(o.batch_size)).workers(size_t(w)));
    DatasetContender c = Measure("torch::data", o.epochs, [&] {
      int64_t samples = 0;
      uint64_t sum = 0;
      for (auto& batch : *loader) {
        samples += batch.data.size(0);
        sum += Touch(batch.data, batch.target);
      }
      return std::make_pair(samples, sum);
    });
    c.workers = w;
    if (c.samples_per_s > r.best_torch.samples_per_s) r.best_torch = c;
    r.torch.push_back(c);
  }
  r.ratio =
      r.best_torch.samples_per_s > 0 ? r.feedline.samples_per_s / r.best_torch.samples_per_s : 0;
  return r;
}

}  // namespace

absl::StatusOr<std::vector<DatasetVariantResult>> RunDatasetComparison(
    const DatasetCompareOptions& o) {
  std::printf(
      "feedline-bench --compare-dataset: a C++ torch::data::Dataset through feedline vs "
      "torch::data::make_data_loader (+ Stack<>), batch size %lld, %d epochs per contender "
      "(figures over epochs 2..%d), %d cores; torch::data workers tried: %s\n",
      static_cast<long long>(o.batch_size), o.epochs, o.epochs, Cores(),
      absl::StrJoin(o.torch_workers, ", ").c_str());
  std::vector<DatasetVariantResult> results;
  auto wanted = [&o](const char* v) { return o.variant == "all" || o.variant == v; };
  if (wanted("overhead")) results.push_back(RunVariant(o, "overhead", 200000, 64, 0, 64));
  if (wanted("cheap")) results.push_back(RunVariant(o, "cheap", 100000, 64, 0, 100000));
  if (wanted("computed")) results.push_back(RunVariant(o, "computed", 100000, 64, 0, 0));
  if (wanted("costly")) results.push_back(RunVariant(o, "costly", 3000, 1024, 64, 0));
  std::printf("\n  %-9s %-12s %8s %14s %14s\n", "variant", "loader", "workers", "samples/s",
              "CPU ms/sample");
  for (const DatasetVariantResult& r : results) {
    std::printf("  %-9s %-12s %8s %14.0f %14.4f\n", r.name.c_str(), "feedline",
                absl::StrCat("auto:", r.feedline.workers).c_str(), r.feedline.samples_per_s,
                r.feedline.cpu_ms_per_sample);
    for (const DatasetContender& c : r.torch) {
      std::printf("  %-9s %-12s %8d %14.0f %14.4f%s\n", r.name.c_str(), "torch::data", c.workers,
                  c.samples_per_s, c.cpu_ms_per_sample,
                  c.workers == r.best_torch.workers ? "  (best)" : "");
    }
    std::printf("  %-9s feedline / best torch::data: %.2fx samples/s, %.2fx CPU per sample\n",
                r.name.c_str(), r.ratio,
                r.best_torch.cpu_ms_per_sample > 0
                    ? r.feedline.cpu_ms_per_sample / r.best_torch.cpu_ms_per_sample
                    : 0.0);
  }
  return results;
}

void WriteDatasetJson(const std::vector<DatasetVariantResult>& results, JsonWriter& json) {
  auto contender = [&json](const DatasetContender& c) {
    json.BeginObject(true);
    json.Key("loader").String(c.loader);
    json.Key("workers").Integer(c.workers);
    json.Key("samples_per_s").Number(c.samples_per_s);
    json.Key("cpu_ms_per_sample").Number(c.cpu_ms_per_sample);
    json.EndObject();
  };
  json.Key("variants").BeginArray();
  for (const DatasetVariantResult& r : results) {
    json.BeginObject();
    json.Key("name").String(r.name);
    json.Key("samples").Integer(r.samples);
    json.Key("features").Integer(r.features);
    json.Key("ops_per_feature").Integer(r.ops_per_feature);
    json.Key("stored").Integer(r.stored);
    json.Key("feedline");
    contender(r.feedline);
    json.Key("torch_data").BeginArray();
    for (const DatasetContender& c : r.torch) contender(c);
    json.EndArray();
    json.Key("best_torch_data");
    contender(r.best_torch);
    json.Key("ratio_samples_per_s").Number(r.ratio);
    json.EndObject();
  }
  json.EndArray();
}

}  // namespace feedline::bench
