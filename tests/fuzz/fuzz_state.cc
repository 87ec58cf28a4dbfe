// libFuzzer target: Loader::LoadState, the parser of a checkpoint's loader state (a dict a user
// hands back, from a file anyone who can write the checkpoint controls), and the resumed epoch
// it leads to. The input's bytes are the state's fields, raw (so that mutations reach every
// edge value: negative, zero, huge, overflowing products); the loader's own layout comes from
// a hash of the input. Properties: no crash, hang or overflow; a refused state is
// kInvalidArgument and changes nothing (the next epoch is the whole one the loader would have
// started); an accepted state resumes a suffix of that epoch's batches, exactly the batches
// after `batches_done` when the layout is the same; a state resplit onto another layout (or
// one that skipped a prefix) resumes no sample of the prefix its ranks had delivered.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "feedline/feedline.h"
#include "fuzz_util.h"

namespace {

using feedline::Loader;

class Computed final : public feedline::Dataset {
 public:
  explicit Computed(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  absl::Status Read(int64_t, feedline::Record* record) const override {
    record->Clear();
    return absl::OkStatus();
  }
  uint64_t Fingerprint() const override { return uint64_t(n_) * 2654435761u; }
  bool empty_records() const override { return true; }

 private:
  int64_t n_;
};

class IndexOnly final : public feedline::SampleTransform {
 public:
  const feedline::Schema& schema() const override { return schema_; }
  absl::Status Apply(const feedline::Record&, const feedline::SampleContext& ctx, WorkerState*,
                     feedline::SampleWriter& out) const override {
    *out.Fixed<int64_t>(0) = ctx.index();
    return absl::OkStatus();
  }

 private:
  feedline::Schema schema_{feedline::Field("i", feedline::DType::kInt64, {})};
};

std::unique_ptr<Loader> Make(int64_t n, const feedline::LoaderOptions& o) {
  auto loader = Loader::Create(std::make_shared<Computed>(n), std::make_shared<IndexOnly>(), o);
  if (!loader.ok()) feedline::fuzz::Fail("Create", loader.status().ToString());
  return std::move(*loader);
}

// The epoch's batches, each as its sample indices.
std::vector<std::vector<int64_t>> Drain(Loader& loader) {
  std::vector<std::vector<int64_t>> out;
  std::unique_ptr<feedline::Epoch> epoch = loader.StartEpoch();
  for (;;) {
    absl::StatusOr<feedline::Batch> b = epoch->Next();
    if (absl::IsOutOfRange(b.status())) break;
    if (!b.ok()) feedline::fuzz::Fail("Next", b.status().ToString());
    out.emplace_back(b->indices(), b->indices() + b->size());
  }
  return out;
}

class Bytes {  // the input read as fields; zeros past its end
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  int64_t I64() {
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = (v << 8) | (pos_ < n_ ? d_[pos_++] : 0);
    return int64_t(v);
  }
  uint8_t U8() { return pos_ < n_ ? d_[pos_++] : 0; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  feedline::fuzz::InputHash h(data, size);
  const int64_t n = h.Range(1, 40);
  const int world = h.Range(1, 4);
  feedline::LoaderOptions o = feedline::LoaderOptions()
                                  .batch_size(h.Range(1, 7))
                                  .shuffle(h.Bit())
                                  .drop_last(h.Bit())
                                  .seed(h.Next() % 1000)
                                  .world_size(world)
                                  .rank(h.Range(0, world - 1))
                                  .workers(1)
                                  .prefetch(2);
  if (o.drop_last() && n < o.batch_size() * world) o.drop_last(false);
  std::unique_ptr<Loader> loader = Make(n, o);
  const Loader::State mine = loader->state();

  // The state: a flag byte, then the fields it marks as raw, 8 bytes each (big-endian); the
  // others are the loader's own (so that the checks after them are reached) or, for the
  // position, small values from the hash.
  Bytes in(data, size);
  const uint8_t raw = in.U8();
  Loader::State st = mine;
  auto pick = [&](int bit, int64_t own) { return (raw >> bit) & 1 ? in.I64() : own; };
  st.epoch = pick(0, h.Range(0, 3));
  st.batches_done = pick(1, h.Range(0, 12));
  st.batch_size = pick(2, mine.batch_size);
  st.world_size = int(pick(3, mine.world_size));
  st.rank = int(pick(4, mine.rank));
  st.dataset_size = pick(5, mine.dataset_size);
  if ((raw >> 6) & 1) st.seed = uint64_t(in.I64());
  const bool resplit = (raw >> 7) & 1;
  const uint8_t raw2 = in.U8();
  st.skipped = raw2 & 1 ? in.I64() : (raw2 & 2 ? h.Range(0, n) : 0);

  const absl::Status s = loader->LoadState(st, resplit);
  if (!s.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(s), s.ToString());
    FUZZ_CHECK(loader->state().epoch == mine.epoch && loader->state().batches_done == 0,
               "a refused state moved the loader");
    return 0;
  }
  FUZZ_CHECK(st.epoch >= 0 && st.batches_done >= 0, "accepted a negative position");
  FUZZ_CHECK(st.skipped >= 0 && st.skipped <= n, "accepted a skipped prefix out of range");
  // Epochs far ahead are as good as any: keep the work per input small.
  if (st.epoch > (int64_t{1} << 40)) return 0;
  const Loader::State at = loader->state();  // where the next epoch starts
  std::vector<std::vector<int64_t>> resumed = Drain(*loader);
  if (at.skipped > 0) {
    // The prefix of the epoch's order delivered before: none of it again.
    feedline::LoaderOptions one = o;
    one.world_size(1).rank(0).batch_size(1).drop_last(false);
    std::unique_ptr<Loader> order_loader = Make(n, one);
    order_loader->set_epoch(at.epoch);
    std::vector<std::vector<int64_t>> order = Drain(*order_loader);
    std::vector<bool> delivered(size_t(n), false);
    for (int64_t p = 0; p < at.skipped; ++p) delivered[size_t(order[size_t(p)][0])] = true;
    for (const std::vector<int64_t>& b : resumed) {
      for (int64_t i : b) FUZZ_CHECK(!delivered[size_t(i)], absl::StrCat("sample ", i, " again"));
    }
    return 0;
  }
  std::unique_ptr<Loader> whole_loader = Make(n, o);
  whole_loader->set_epoch(at.epoch);
  std::vector<std::vector<int64_t>> whole = Drain(*whole_loader);
  FUZZ_CHECK(resumed.size() <= whole.size(), absl::StrCat(resumed.size(), " > ", whole.size()));
  const size_t start = whole.size() - resumed.size();
  for (size_t k = 0; k < resumed.size(); ++k) {
    FUZZ_CHECK(resumed[k] == whole[start + k], absl::StrCat("batch ", start + k));
  }
  if (st.batch_size == mine.batch_size && st.world_size == mine.world_size && st.skipped == 0) {
    FUZZ_CHECK(int64_t(start) == std::min<int64_t>(st.batches_done, int64_t(whole.size())),
               absl::StrCat("resumed at ", start, ", saved ", st.batches_done));
  }
  return 0;
}
