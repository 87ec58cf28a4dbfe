// The LibTorch adapter: tensor shapes and types, zero-copy views of the ring's slots, tensors
// that outlive their loader, errors as feedline::Error, and range-for over epochs.
// Built into feedline_torch_tests (only when LibTorch is found); ctest: unit.torch.
// clang-format off
// First, then Catch2: Debian's LibTorch is built with glog, whose CHECK macro (pulled in by the
// tensor header) would otherwise replace Catch2's.
#include "feedline/torch.h"
#undef CHECK
#include <catch2/catch.hpp>
// clang-format on

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "feedline/feedline.h"
#include "test_util.h"

namespace t = feedline::testing;
using feedline::LoaderOptions;

namespace {

constexpr int kClasses = 2;
constexpr int kPerClass = 7;  // 14 images: batches of 4 give 3 full ones and a last one of 2

// One data set for the whole file.
const std::string& DataDir() {
  // Static, so removed at exit.
  static const struct DataSet {
    DataSet() { t::MakeSmallImageFolder(dir.path(), kClasses, kPerClass, 3); }
    t::TempDir dir;
  } data;
  return data.dir.path();
}

LoaderOptions Small() {
  return LoaderOptions().batch_size(4).size(32).resize_size(36).seed(7).workers(2);
}

std::vector<int64_t> Values(const at::Tensor& t) {
  REQUIRE(t.scalar_type() == at::kLong);
  REQUIRE(t.is_contiguous());
  const int64_t* p = t.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("tensors have the loader's shapes and types", "[torch]") {
  auto loader = feedline::torch::make_data_loader(DataDir(), Small());
  REQUIRE(loader->size() == 4);  // ceil(14 / 4)
  const feedline::FileList& dataset = t::Files(loader->loader());
  REQUIRE(dataset.samples.size() == size_t{kClasses * kPerClass});

  std::vector<int64_t> sizes;
  for (auto& batch : *loader) {
    const int64_t n = batch.data.size(0);
    sizes.push_back(n);
    CHECK(batch.data.sizes() == at::IntArrayRef({n, 3, 32, 32}));
    CHECK(batch.data.scalar_type() == at::kByte);
    CHECK(batch.data.is_contiguous());
    CHECK(batch.data.device().is_cpu());
    CHECK(batch.target.sizes() == at::IntArrayRef({n}));
    CHECK(batch.target.scalar_type() == at::kLong);
    CHECK(batch.index.sizes() == at::IntArrayRef({n}));
    CHECK(batch.index.scalar_type() == at::kLong);
    CHECK(batch.position == int64_t(sizes.size()) - 1);
    // The labels are the data set's labels of the indexed samples.
    const std::vector<int64_t> index = Values(batch.index), target = Values(batch.target);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(target[i] == dataset.samples.at(size_t(index[i])).label);
    }
  }
  CHECK(sizes == std::vector<int64_t>{4, 4, 4, 2});

  // NHWC.
  auto nhwc = feedline::torch::make_data_loader(
      DataDir(), Small().layout(feedline::Layout::kNHWC).drop_last(true));
  REQUIRE(nhwc->size() == 3);
  int batches = 0;
  for (auto& batch : *nhwc) {
    CHECK(batch.data.sizes() == at::IntArrayRef({4, 32, 32, 3}));
    ++batches;
  }
  CHECK(batches == 3);
}

TEST_CASE("tensors are zero-copy views of the batch slot", "[torch]") {
  auto loader = feedline::Loader::Create(Small().source(DataDir()));
  REQUIRE(loader.ok());
  std::unique_ptr<feedline::Epoch> epoch = (*loader)->StartEpoch();
  absl::StatusOr<feedline::Batch> batch = epoch->Next();
  REQUIRE(batch.ok());

  feedline::torch::Batch views = feedline::torch::to_torch(*batch);
  CHECK(views.data.data_ptr() == static_cast<const void*>(batch->images()));
  CHECK(views.target.data_ptr() == static_cast<const void*>(batch->labels()));
  CHECK(views.index.data_ptr() == static_cast<const void*>(batch->indices()));
  CHECK(int64_t(views.data.nbytes()) == batch->image_bytes());
  CHECK(std::memcmp(views.data.data_ptr(), batch->images(), size_t(batch->image_bytes())) == 0);
  CHECK(views.epoch == batch->epoch());
  CHECK(views.position == batch->index());

  // Writing through the tensor writes the slot.
  views.data.data_ptr<uint8_t>()[0] ^= 0xFF;
  CHECK(views.data.data_ptr<uint8_t>()[0] == batch->images()[0]);

  // The views keep the slot: it is released when the last of them is gone, not before.
  std::weak_ptr<const void> slot = batch->keep_alive();
  batch = absl::CancelledError("dropped");
  CHECK_FALSE(slot.expired());
  views.data = at::Tensor();
  views.target = at::Tensor();
  CHECK_FALSE(slot.expired());
  views.index = at::Tensor();
  CHECK(slot.expired());

  CHECK_THROWS_AS(feedline::torch::to_torch(feedline::Batch()), feedline::Error);
}

TEST_CASE("tensors outlive their loader", "[torch]") {
  std::vector<feedline::torch::Batch> kept;
  std::vector<std::vector<uint8_t>> copies;
  {
    auto loader = feedline::torch::make_data_loader(DataDir(), Small());
    auto it = loader->begin();
    for (int i = 0; i < 2 && it != loader->end(); ++i, ++it) {
      const uint8_t* p = it->data.data_ptr<uint8_t>();
      copies.emplace_back(p, p + it->data.nbytes());
      kept.push_back(*it);
    }
    // The loader (its ring included) and the running epoch are destroyed here.
  }
  REQUIRE(kept.size() == 2);
  for (size_t i = 0; i < kept.size(); ++i) {
    const at::Tensor& data = kept[i].data;
    REQUIRE(data.nbytes() == copies[i].size());
    CHECK(std::memcmp(data.data_ptr(), copies[i].data(), copies[i].size()) == 0);
    std::memset(data.data_ptr(), 0, data.nbytes());  // still the holder's memory
    CHECK(Values(kept[i].index).size() == 4);
  }
}

TEST_CASE("failures throw feedline::Error naming the file", "[torch]") {
  SECTION("a missing source") {
    try {
      feedline::torch::make_data_loader(DataDir() + "/no-such-folder", Small());
      FAIL("no exception");
    } catch (const feedline::Error& e) {
      CHECK(e.code() == absl::StatusCode::kNotFound);
      CHECK_THAT(e.what(), Catch::Contains("no-such-folder"));
    }
  }
  SECTION("an invalid option") {
    CHECK_THROWS_AS(feedline::torch::make_data_loader(DataDir(), Small().batch_size(0)),
                    feedline::Error);
  }
  SECTION("a sample that cannot be decoded, at its batch; the epoch goes on") {
    t::TempDir dir;
    t::MakeSmallImageFolder(dir.path(), 1, 5, 9);  // class0/img000.jpg .. img004.jpg
    // Sorted after img002.jpg: sample 3, in the second of three batches of 2.
    t::WriteFile(dir.path() + "/class0/img002_broken.jpg", "\xFF\xD8\xFF not a JPEG at all");
    auto loader =
        feedline::torch::make_data_loader(dir.path(), Small().batch_size(2).shuffle(false));
    REQUIRE(loader->size() == 3);

    int good = 0;
    try {
      for (auto& batch : *loader) good += int(batch.data.size(0));
      FAIL("no exception");
    } catch (const feedline::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("img002_broken.jpg"));
      CHECK(e.code() == absl::StatusCode::kDataLoss);
    }
    CHECK(good == 2);

    // By hand: after the throw, incrementing again gives the batch after the failed one.
    std::vector<int64_t> seen;
    int errors = 0;
    for (auto it = loader->begin(); it != loader->end();) {
      const std::vector<int64_t> idx = Values(it->index);
      seen.insert(seen.end(), idx.begin(), idx.end());
      try {
        ++it;
      } catch (const feedline::Error& e) {
        ++errors;
        CHECK_THAT(e.what(), Catch::Contains("img002_broken.jpg"));
        ++it;
      }
    }
    CHECK(errors == 1);
    CHECK(seen == std::vector<int64_t>{0, 1, 4, 5});
  }
}

TEST_CASE("range-for gives every sample once per epoch", "[torch]") {
  auto loader = feedline::torch::make_data_loader(DataDir(), Small().shuffle(true));
  const int64_t n = kClasses * kPerClass;
  std::vector<std::vector<int64_t>> orders;
  for (int64_t e = 0; e < 2; ++e) {
    CHECK(loader->next_epoch() == e);
    std::vector<int64_t> order;
    size_t batches = 0;
    for (auto& batch : *loader) {
      CHECK(batch.epoch == e);
      const std::vector<int64_t> idx = Values(batch.index);
      order.insert(order.end(), idx.begin(), idx.end());
      ++batches;
    }
    CHECK(batches == loader->size());
    std::vector<int64_t> sorted = order, all(size_t(n), 0);
    std::sort(sorted.begin(), sorted.end());
    std::iota(all.begin(), all.end(), 0);
    CHECK(sorted == all);
    orders.push_back(order);
  }
  CHECK(orders[0] != orders[1]);  // a fresh permutation per epoch (14! orders: no accident)
  CHECK(loader->stats().samples >= 2 * n);

  // set_epoch chooses the epoch: the same permutation again.
  loader->set_epoch(1);
  std::vector<int64_t> again;
  for (auto& batch : *loader) {
    const std::vector<int64_t> idx = Values(batch.index);
    again.insert(again.end(), idx.begin(), idx.end());
  }
  CHECK(again == orders[1]);
}
