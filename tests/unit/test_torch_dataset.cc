// feedline::torch::make_data_loader over `torch::data` datasets, against torch's own
// `torch::data::make_data_loader` on the same dataset: the same batches with shuffle(false),
// the same bytes for any worker count, variable lengths padded with lengths, `.map(...)`ed
// datasets, and exceptions from get() as feedline::Error at their batch.
// Built into feedline_torch_tests; ctest: unit.torch.
// clang-format off
#include "feedline/torch_data.h"
#undef CHECK
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>
// clang-format on

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Fixed shapes: data float [3, 4] computed from the index, target int64 [].
class Grid : public torch::data::datasets::Dataset<Grid> {
 public:
  explicit Grid(size_t n) : n_(n) {}
  torch::data::Example<> get(size_t i) override {
    torch::Tensor data = torch::arange(12, torch::kFloat).reshape({3, 4}) * float(i) + 0.5f;
    return {data, torch::tensor(int64_t(i % 10))};
  }
  torch::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
};

// Variable lengths: data int64 [1 + i % 6], target float [2].
class Sequences : public torch::data::datasets::Dataset<Sequences> {
 public:
  explicit Sequences(size_t n, int64_t throw_at = -1) : n_(n), throw_at_(throw_at) {}
  torch::data::Example<> get(size_t i) override {
    if (int64_t(i) == throw_at_) throw std::runtime_error("corrupt row " + std::to_string(i));
    const int64_t len = 1 + int64_t(i) % 6;
    return {torch::arange(len, torch::kLong) + int64_t(i) * 100,
            torch::tensor({float(i), -float(i)})};
  }
  torch::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
  int64_t throw_at_;
};

// torch's own loader: SequentialSampler, stacked.
std::vector<torch::data::Example<>> TorchBatches(Grid d, size_t batch_size) {
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(d).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(batch_size).workers(2));
  std::vector<torch::data::Example<>> out;
  for (auto& b : *loader) out.push_back(b);
  return out;
}

}  // namespace

TEST_CASE("a torch::data Dataset gives exactly the batches torch::data gives", "[torch]") {
  const std::vector<torch::data::Example<>> reference = TorchBatches(Grid(23), 5);
  for (int workers : {1, 2, 3}) {
    auto loader = feedline::torch::make_data_loader(
        Grid(23), feedline::LoaderOptions().batch_size(5).shuffle(false).workers(workers));
    REQUIRE(loader->size() == 5);
    REQUIRE(loader->dataset().size().value() == 23);
    size_t b = 0;
    for (auto& batch : *loader) {
      REQUIRE(b < reference.size());
      CHECK(batch.data.sizes() == reference[b].data.sizes());
      CHECK(batch.data.scalar_type() == at::kFloat);
      CHECK(torch::equal(batch.data, reference[b].data));
      CHECK(torch::equal(batch.target, reference[b].target));
      CHECK(!batch.lengths.defined());
      ++b;
    }
    CHECK(b == reference.size());
  }
}

TEST_CASE("DataLoaderOptions map over; shuffled epochs are the same for any worker count",
          "[torch]") {
  auto run = [](size_t workers) {
    auto loader = feedline::torch::make_data_loader(
        Grid(40), torch::data::DataLoaderOptions().batch_size(8).workers(workers).drop_last(true));
    REQUIRE(loader->options().batch_size() == 8);
    REQUIRE(loader->options().drop_last());
    std::vector<torch::Tensor> epoch;
    std::multiset<int64_t> seen;
    for (auto& batch : *loader) {
      epoch.push_back(batch.data.clone());
      const int64_t* idx = batch.index.data_ptr<int64_t>();
      for (int64_t i = 0; i < batch.index.numel(); ++i) {
        seen.insert(idx[i]);
        // Each row is the dataset's get(index), whatever the order.
        CHECK(torch::equal(batch.data[i], Grid(40).get(size_t(idx[i])).data));
      }
    }
    REQUIRE(seen.size() == 40);
    REQUIRE(std::set<int64_t>(seen.begin(), seen.end()).size() == 40);
    return epoch;
  };
  const std::vector<torch::Tensor> one = run(1), three = run(3);
  REQUIRE(one.size() == 5);
  bool shuffled = false;
  for (size_t b = 0; b < one.size(); ++b) {
    CHECK(torch::equal(one[b], three[b]));
    if (!torch::equal(one[b], TorchBatches(Grid(40), 8)[b].data)) shuffled = true;
  }
  CHECK(shuffled);
}

TEST_CASE("variable-length samples come out padded, with lengths", "[torch]") {
  feedline::torch::ExampleSpec spec;
  spec.data_shape = {feedline::Dim::UpTo(8)};
  spec.data_pad_value = -1;
  auto loader = feedline::torch::make_data_loader(
      Sequences(17), feedline::LoaderOptions().batch_size(4).shuffle(false).workers(2), spec);
  int64_t next = 0;
  for (auto& batch : *loader) {
    const int64_t n = batch.data.size(0);
    REQUIRE(batch.lengths.defined());
    REQUIRE(batch.data.scalar_type() == at::kLong);
    REQUIRE(batch.target.sizes() == at::IntArrayRef({n, 2}));
    int64_t longest = 0;
    for (int64_t i = 0; i < n; ++i) longest = std::max(longest, 1 + (next + i) % 6);
    REQUIRE(batch.data.sizes() == at::IntArrayRef({n, longest}));
    for (int64_t i = 0; i < n; ++i, ++next) {
      const torch::data::Example<> want = Sequences(17).get(size_t(next));
      const int64_t len = want.data.size(0);
      CHECK(batch.lengths[i].item<int64_t>() == len);
      CHECK(torch::equal(batch.data[i].slice(0, 0, len), want.data));
      if (len < longest) {
        CHECK(torch::all(batch.data[i].slice(0, len) == -1).item<bool>());
      }
      CHECK(torch::equal(batch.target[i], want.target));
    }
  }
  REQUIRE(next == 17);
}

TEST_CASE("a shape that does not fit, and exceptions from get(), fail their batch only",
          "[torch]") {
  SECTION("fixed shapes from get(0): a longer sample is an error, not a truncation") {
    auto loader = feedline::torch::make_data_loader(
        Sequences(8), feedline::LoaderOptions().batch_size(2).shuffle(false).workers(1));
    std::string message;
    try {
      auto it = loader->begin();  // batch 0: samples 0 (length 1) and 1 (length 2)
    } catch (const feedline::Error& e) {
      message = e.what();
    }
    CHECK(message.find("sample 1: field 'data': a sample of shape [2] does not fit data: int64 "
                       "[1]") != std::string::npos);
  }
  feedline::torch::ExampleSpec spec;
  spec.data_shape = {feedline::Dim::UpTo(6)};
  SECTION("raise: the batch of the sample throws, the epoch goes on") {
    auto loader = feedline::torch::make_data_loader(
        Sequences(12, /*throw_at=*/5),
        feedline::LoaderOptions().batch_size(4).shuffle(false).workers(2), spec);
    auto it = loader->begin();
    CHECK(it->data.size(0) == 4);
    std::string message;
    try {
      ++it;
    } catch (const feedline::Error& e) {
      message = e.what();
    }
    CHECK(message.find("sample 5: the transform threw: corrupt row 5") != std::string::npos);
    ++it;  // batch 2 (samples 8..11)
    REQUIRE(it != loader->end());
    CHECK(it->index[0].item<int64_t>() == 8);
    ++it;
    CHECK(it == loader->end());
  }
  SECTION("skip: replaced") {
    auto loader = feedline::torch::make_data_loader(
        Sequences(12, 5),
        // (No epoch head start: the next epoch's failure of sample 5 would be counted too.)
        feedline::LoaderOptions().batch_size(4).workers(2).on_error(feedline::OnError::kSkip)
            .epoch_head_start(false),
        spec);
    int64_t n = 0;
    for (auto& batch : *loader) {
      for (int64_t i = 0; i < batch.index.numel(); ++i) {
        CHECK(batch.index[i].item<int64_t>() != 5);
      }
      n += batch.index.numel();
    }
    CHECK(n == 12);
    CHECK(loader->stats().error_count == 1);
  }
}

TEST_CASE("a .map()ed dataset: the transform runs on feedline's workers", "[torch]") {
  auto mapped = Grid(9).map(torch::data::transforms::Normalize<>(0.5, 2.0));
  auto loader = feedline::torch::make_data_loader(
      mapped, feedline::LoaderOptions().batch_size(3).shuffle(false).workers(2));
  int64_t next = 0;
  for (auto& batch : *loader) {
    for (int64_t i = 0; i < batch.data.size(0); ++i, ++next) {
      const torch::Tensor want = (Grid(9).get(size_t(next)).data - 0.5) / 2.0;
      CHECK(torch::allclose(batch.data[i], want));
    }
  }
  CHECK(next == 9);
}
