// A weighted mixture of data sets (feedline/mix.h) under the engine: exact shares, every record
// in turn, the same samples for any worker count, exact resume.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "feedline/feedline.h"

namespace {

using feedline::Field;
using feedline::Loader;
using feedline::LoaderOptions;
using feedline::Mix;
using feedline::MixOptions;
using feedline::Record;
using feedline::SampleContext;
using feedline::SampleTransform;
using feedline::SampleWriter;
using feedline::Schema;

// Source `tag`'s record i reads as label tag * 10000 + i (a real read: bytes and a label).
class Tagged final : public feedline::Dataset {
 public:
  Tagged(int64_t tag, int64_t n) : tag_(tag), n_(n) {}
  int64_t size() const override { return n_; }
  absl::Status Read(int64_t index, Record* record) const override {
    if (index < 0 || index >= n_) return absl::OutOfRangeError(absl::StrCat("index ", index));
    record->Clear();
    record->bytes.assign(3, uint8_t(tag_));
    record->label = tag_ * 10000 + index;
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override {
    return absl::StrCat("source", tag_, "/", index);
  }
  uint64_t Fingerprint() const override { return uint64_t(tag_ * 1000003 + n_); }

 private:
  int64_t tag_, n_;
};

// "label": the record's label; "tag": its first byte.
class Labels final : public SampleTransform {
 public:
  const Schema& schema() const override { return schema_; }
  absl::Status Apply(const Record& record, const SampleContext&, WorkerState*,
                     SampleWriter& out) const override {
    *out.Fixed<int64_t>(0) = record.label;
    return absl::OkStatus();
  }

 private:
  Schema schema_{Field("label", feedline::DType::kInt64, {})};
};

std::shared_ptr<Mix> MakeMix(std::vector<std::pair<int64_t, double>> sizes, MixOptions o) {
  std::vector<feedline::MixSource> sources;
  for (size_t s = 0; s < sizes.size(); ++s) {
    sources.push_back({std::make_shared<Tagged>(int64_t(s), sizes[s].first), sizes[s].second});
  }
  absl::StatusOr<std::shared_ptr<Mix>> mix = Mix::Create(std::move(sources), o);
  REQUIRE(mix.ok());
  return *mix;
}

std::unique_ptr<Loader> MakeLoader(std::shared_ptr<Mix> mix, LoaderOptions o) {
  auto loader = Loader::Create(std::move(mix), std::make_shared<Labels>(), o);
  REQUIRE(loader.ok());
  return std::move(*loader);
}

// One epoch's labels, batch by batch.
std::vector<std::vector<int64_t>> Epoch(Loader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto& b : loader) {
    REQUIRE(b.ok());
    const int64_t* v = static_cast<const int64_t*>(b->field(0).data);
    out.emplace_back(v, v + b->size());
  }
  return out;
}

std::vector<int64_t> Flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

}  // namespace

TEST_CASE("mix: exact shares, no repeat within an epoch, every record in turn", "[engine]") {
  // 500 and 200 records at 0.7 / 0.3: the epoch ends with the first source read whole (B).
  auto mix = MakeMix({{500, 0.7}, {200, 0.3}}, MixOptions{.seed = 3});
  REQUIRE(mix->size() == 666);  // floor(200 / 0.3)
  REQUIRE(mix->per_epoch(0) + mix->per_epoch(1) == 666);
  REQUIRE(std::abs(double(mix->per_epoch(0)) / 666 - 0.7) < 0.01);
  REQUIRE(mix->num_records() == 700);
  auto loader = MakeLoader(mix, LoaderOptions().batch_size(32).seed(1).workers(2));
  std::map<int64_t, int> a_seen;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> labels = Flat(Epoch(*loader));
    REQUIRE(labels.size() == 666);
    std::map<int64_t, int> per_source;
    std::set<int64_t> b;
    for (int64_t l : labels) {
      ++per_source[l / 10000];
      if (l / 10000 == 0) ++a_seen[l];
      if (l / 10000 == 1) b.insert(l);
    }
    if (epoch == 0) {  // one pass of each source: no record twice
      REQUIRE(std::set<int64_t>(labels.begin(), labels.end()).size() == labels.size());
    }
    REQUIRE(per_source[0] == mix->per_epoch(0));
    REQUIRE(b.size() == 200);  // B whole, every epoch
  }
  // A's reads go on from epoch to epoch (its second pass starts in epoch 1): after two epochs
  // (2 x 466 draws of 500 records) every A record came, none more than twice.
  REQUIRE(a_seen.size() == 500);
  for (const auto& [record, n] : a_seen) REQUIRE(n <= 2);
}

TEST_CASE("mix: the last source's end reads every record each epoch", "[engine]") {
  MixOptions o{.seed = 9};
  o.end = MixOptions::End::kLastSource;
  auto mix = MakeMix({{50, 0.5}, {300, 0.25}, {20, 0.25}}, o);
  REQUIRE(mix->size() == 1200);  // ceil(300 / 0.25): the largest source read whole
  auto loader = MakeLoader(mix, LoaderOptions().batch_size(16).seed(2).workers(1));
  const std::vector<int64_t> labels = Flat(Epoch(*loader));
  std::map<int64_t, std::set<int64_t>> per_source;
  std::map<int64_t, int> count;
  for (int64_t l : labels) {
    per_source[l / 10000].insert(l);
    ++count[l / 10000];
  }
  REQUIRE(count[0] == 600);
  REQUIRE(count[1] == 300);
  REQUIRE(count[2] == 300);
  REQUIRE(per_source[0].size() == 50);  // restarted 12 times, each record every pass
  REQUIRE(per_source[1].size() == 300);
  REQUIRE(per_source[2].size() == 20);
}

TEST_CASE("mix: the same samples for any worker count and rank split; exact resume", "[engine]") {
  auto mix = MakeMix({{90, 0.6}, {40, 0.3}, {33, 0.1}}, MixOptions{.seed = 4});
  const LoaderOptions base = LoaderOptions().batch_size(8).seed(5).epoch_head_start(false);
  auto one = MakeLoader(mix, LoaderOptions(base).workers(1));
  auto two = MakeLoader(mix, LoaderOptions(base).workers(2));
  std::vector<std::vector<int64_t>> e0 = Epoch(*one), e1 = Epoch(*one);
  REQUIRE(Epoch(*two) == e0);
  REQUIRE(Epoch(*two) == e1);
  REQUIRE(e0 != e1);
  // Two ranks: together the single rank's epoch, each sample once.
  std::multiset<int64_t> ranks;
  for (int r = 0; r < 2; ++r) {
    auto ld =
        MakeLoader(mix, LoaderOptions(base).workers(1).world_size(2).rank(r).even_shards(false));
    for (int64_t l : Flat(Epoch(*ld))) ranks.insert(l);
  }
  const std::vector<int64_t> whole = Flat(e0);
  REQUIRE(ranks == std::multiset<int64_t>(whole.begin(), whole.end()));
  // Resumed after 3 batches of epoch 1: the rest of it, as the uninterrupted run.
  auto first = MakeLoader(mix, LoaderOptions(base).workers(2));
  (void)Epoch(*first);
  Loader::State state;
  {
    auto epoch = first->StartEpoch();
    for (int k = 0; k < 3; ++k) REQUIRE(epoch->Next().ok());
    state = first->state();
  }
  auto resumed = MakeLoader(mix, LoaderOptions(base).workers(1));
  REQUIRE(resumed->LoadState(state).ok());
  const std::vector<std::vector<int64_t>> rest = Epoch(*resumed);
  REQUIRE(rest == std::vector<std::vector<int64_t>>(e1.begin() + 3, e1.end()));
  REQUIRE(Epoch(*resumed) == Epoch(*one));  // epoch 2 on both
  // A state of another mixture (other weights) is refused.
  auto other = MakeLoader(MakeMix({{90, 0.5}, {40, 0.4}, {33, 0.1}}, MixOptions{.seed = 4}),
                          LoaderOptions(base));
  REQUIRE(absl::IsInvalidArgument(other->LoadState(state)));
}

TEST_CASE("mix: one source at weight 1 is a permutation of it each epoch; bad mixtures",
          "[engine]") {
  auto mix = MakeMix({{1000, 1.0}}, MixOptions{.seed = 1});
  std::vector<int64_t> order(1000);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t j = 0; j < 1000; ++j) order[size_t(j)] = j;
    mix->MapEpoch(epoch, &order);
    REQUIRE(std::set<int64_t>(order.begin(), order.end()).size() == 1000);
    REQUIRE(*std::max_element(order.begin(), order.end()) == 999);
  }
  MixOptions unshuffled{.seed = 1};
  unshuffled.shuffle = false;
  auto plain = MakeMix({{10, 1.0}}, unshuffled);
  order.assign({0, 1, 2, 3});
  plain->MapEpoch(1, &order);  // epoch 1 of a 10-record source: draws 10.. = records 0..
  REQUIRE(order == std::vector<int64_t>{0, 1, 2, 3});
  REQUIRE(plain->Describe(3) == "source0/3");

  using Sources = std::vector<feedline::MixSource>;
  REQUIRE(absl::IsInvalidArgument(Mix::Create({}, {}).status()));
  REQUIRE(absl::IsInvalidArgument(
      Mix::Create(Sources{{std::make_shared<Tagged>(0, 5), 0.0}}, {}).status()));
  REQUIRE(absl::IsInvalidArgument(
      Mix::Create(Sources{{std::make_shared<Tagged>(0, 0), 1.0}}, {}).status()));
  REQUIRE(absl::IsInvalidArgument(
      Mix::Create(Sources{{std::make_shared<Tagged>(0, 5), -1.0}}, {}).status()));
  MixOptions huge;
  huge.samples_per_epoch = int64_t{1} << 40;
  REQUIRE(absl::IsInvalidArgument(
      Mix::Create(Sources{{std::make_shared<Tagged>(0, 5), 1.0}}, huge).status()));
}

namespace {

// Source `tag`'s transform: "label" = tag * 10000 + the index it is given, "draw" = a draw of
// its context's generator (whose seed differs by source).
class IndexOf final : public SampleTransform {
 public:
  explicit IndexOf(int64_t tag, int64_t length = 1)
      : tag_(tag),
        schema_({Field("label", feedline::DType::kInt64, {}),
                 Field("draw", feedline::DType::kInt64, {length})}) {}
  const Schema& schema() const override { return schema_; }
  absl::Status Apply(const Record& record, const SampleContext& ctx, WorkerState* state,
                     SampleWriter& out) const override {
    if (state == nullptr || static_cast<State*>(state)->tag != tag_) {
      return absl::InternalError("another source's worker state");
    }
    if (record.label != tag_ * 10000 + ctx.index()) {
      return absl::InternalError(absl::StrCat("record ", record.label, " at index ", ctx.index()));
    }
    *out.Fixed<int64_t>(0) = tag_ * 10000 + ctx.index();
    *out.Fixed<int64_t>(1) = int64_t(ctx.rng(1).Below(1000000));
    return absl::OkStatus();
  }
  struct State : WorkerState {
    int64_t tag = -1;
  };
  std::unique_ptr<WorkerState> NewWorkerState() const override {
    auto s = std::make_unique<State>();
    s->tag = tag_;
    return s;
  }

 private:
  int64_t tag_;
  Schema schema_;
};

}  // namespace

TEST_CASE("mix: each source's records made by its own transform (PerSourceTransform)", "[engine]") {
  MixOptions mo;
  mo.seed = 5;
  std::shared_ptr<Mix> mix = MakeMix({{40, 0.5}, {30, 0.3}, {20, 0.2}}, mo);
  std::vector<std::shared_ptr<const SampleTransform>> per = {
      std::make_shared<IndexOf>(0), std::make_shared<IndexOf>(1), std::make_shared<IndexOf>(2)};
  absl::StatusOr<std::shared_ptr<SampleTransform>> t = feedline::PerSourceTransform(mix, per);
  REQUIRE(t.ok());
  for (int workers : {1, 3}) {
    auto loader = Loader::Create(mix, *t, LoaderOptions().batch_size(7).seed(5).workers(workers));
    REQUIRE(loader.ok());
    std::map<int64_t, int64_t> draw_of;  // source 0's index 3 and source 1's index 3 draw apart
    int64_t n = 0;
    for (auto& b : **loader) {
      REQUIRE(b.ok());
      const int64_t* label = static_cast<const int64_t*>(b->field(0).data);
      const int64_t* draw = static_cast<const int64_t*>(b->field(1).data);
      for (int64_t i = 0; i < b->size(); ++i, ++n) {
        // The record's own source, at its own index (the transform checked the record too).
        CHECK(label[i] / 10000 == mix->source(b->indices()[i]));
        CHECK(label[i] % 10000 == b->indices()[i] - mix->offset(int(label[i] / 10000)));
        draw_of[label[i]] = draw[i];
      }
    }
    CHECK(n == mix->size());
    int same = 0, pairs = 0;
    for (int64_t i = 0; i < 20; ++i) {
      if (draw_of.count(i) && draw_of.count(10000 + i)) {
        ++pairs;
        same += draw_of[i] == draw_of[10000 + i];
      }
    }
    CHECK(pairs > 0);
    CHECK(same == 0);
  }
  // Schemas must agree, one transform per source.
  absl::StatusOr<std::shared_ptr<SampleTransform>> bad = feedline::PerSourceTransform(
      mix, {per[0], per[1], std::make_shared<IndexOf>(2, /*length=*/2)});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("transforms[2]") && Catch::Contains("draw"));
  CHECK_FALSE(feedline::PerSourceTransform(mix, {per[0], per[1]}).ok());
}
