// A torch::data::Dataset through an installed feedline::torch (feedline/torch_data.h), the
// drop-in for torch::data::make_data_loader: prints "samples <N> batches <M> ok".
#include <feedline/torch_data.h>
#include <torch/torch.h>

#include <cstdio>

namespace {

class Squares : public torch::data::datasets::Dataset<Squares> {
 public:
  torch::data::Example<> get(size_t i) override {
    return {torch::full({4}, float(i * i)), torch::tensor(int64_t(i))};
  }
  torch::optional<size_t> size() const override { return 30; }
};

}  // namespace

int main() {
  try {
    auto loader = feedline::torch::make_data_loader(
        Squares(), torch::data::DataLoaderOptions().batch_size(8).workers(2));
    long samples = 0, batches = 0;
    for (auto& batch : *loader) {
      const torch::Tensor i = batch.target.to(torch::kFloat);
      if (!torch::equal(batch.data, (i * i).unsqueeze(1).expand({-1, 4}).contiguous())) {
        std::fprintf(stderr, "wrong values\n");
        return 1;
      }
      samples += long(batch.data.size(0));
      ++batches;
    }
    std::printf("samples %ld batches %ld ok\n", samples, batches);
  } catch (const feedline::Error& e) {
    std::fprintf(stderr, "feedline::Error: %s\n", e.what());
    return 1;
  }
  return 0;
}
