// Shaped like pytorch/examples' cpp/custom-dataset: a torch::data dataset, .map(Normalize<>),
// .map(Stack<>()), make_data_loader<SequentialSampler>(dataset, batch_size), a loop over
// torch::data::Example<>& batches. The program is written once against torch's API; FEEDLINE
// (set by CMake for one of its two builds) changes only the namespace of the make_data_loader
// call. Each build prints its batches' checksum; the test compares torch's with feedline's.
#include <torch/torch.h>
#ifdef FEEDLINE
#include <feedline/torch_data.h>
#define LOADER_NS feedline::torch
#else
#define LOADER_NS torch::data
#endif

#include <cstdint>
#include <cstdio>

namespace {

// Sample i: a 3x8x8 "image" whose pixels depend on i, and the label i % 5.
class CustomDataset : public torch::data::datasets::Dataset<CustomDataset> {
 public:
  explicit CustomDataset(int64_t n) : n_(n) {}
  torch::data::Example<> get(size_t index) override {
    torch::Tensor img = torch::arange(3 * 8 * 8, torch::kFloat).reshape({3, 8, 8});
    img = (img * float(index + 1)).fmod(255.0f);
    return {img, torch::tensor(int64_t(index % 5))};
  }
  torch::optional<size_t> size() const override { return size_t(n_); }

 private:
  int64_t n_;
};

}  // namespace

int main() {
  const int64_t kBatchSize = 4;
  auto data_set = CustomDataset(22)
                      .map(torch::data::transforms::Normalize<>(0.5, 0.25))
                      .map(torch::data::transforms::Stack<>());
  auto data_loader = LOADER_NS::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(data_set), kBatchSize);
  // Order-sensitive checksum of every batch's values and shapes.
  double sum = 0;
  int64_t batches = 0, samples = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (torch::data::Example<>& batch : *data_loader) {
      const double w = double(batches + 1);
      sum += w * batch.data.sum().item<double>() + 7 * w * batch.target.sum().item<double>();
      sum += 1000.0 * w * double(batch.data.size(0));
      samples += batch.data.size(0);
      ++batches;
    }
  }
  std::printf("batches %lld samples %lld checksum %.6f\n", (long long)batches,
              (long long)samples, sum);
  return 0;
}
