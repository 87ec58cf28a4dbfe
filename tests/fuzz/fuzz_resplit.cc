// libFuzzer target: exact elastic resume of packed rows (PackedLoader::Resplit, and LoadState
// of the state it leads to). The states of a saved layout's ranks are a checkpoint anyone who
// can write it controls. A token file of documents with distinct ids (0 to 12 tokens each: some
// without any) is packed (concat) on W ranks, each taking a number of batches the input chooses;
// their states, some of their fields replaced by raw values from the input, resume on W' ranks.
// Properties: no crash, hang or overflow; a refused set of states is kInvalidArgument; genuine
// states are accepted, and then every token of the epoch comes exactly once over the W ranks'
// batches before and the W' ranks' after, also when a W' rank's state saved mid-epoch is loaded
// by a fresh loader of its layout (which must give the rest of that rank's batches unchanged).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "feedline/feedline.h"
#include "feedline/text.h"
#include "fuzz_util.h"

namespace {

using feedline::text::PackedLoader;

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

struct Setup {
  feedline::text::TokenDocumentOptions docs;
  feedline::text::PackOptions pack;
  feedline::LoaderOptions options;
};

std::unique_ptr<PackedLoader> Make(const Setup& s, int rank, int world) {
  feedline::LoaderOptions o = s.options;
  o.rank(rank).world_size(world);
  auto l = feedline::text::MakePackedTokenLoader(s.docs, s.pack, o);
  if (!l.ok()) feedline::fuzz::Fail("MakePackedTokenLoader", l.status().ToString());
  return std::move(*l);
}

// Real tokens (attention_mask 1) of the next batch into `out`; false at the epoch's end. A
// planted offset past its document (`planted`) may end the epoch with kFailedPrecondition.
bool NextTokens(feedline::text::PackedEpoch& e, std::vector<int64_t>* out, bool planted = false) {
  absl::StatusOr<feedline::Batch> b = e.Next();
  if (absl::IsOutOfRange(b.status())) return false;
  if (planted && absl::IsFailedPrecondition(b.status())) return false;
  if (!b.ok()) feedline::fuzz::Fail("Next", b.status().ToString());
  const feedline::TensorView ids = b->field("input_ids"), mask = b->field("attention_mask");
  const int64_t n = ids.shape[0] * ids.shape[1];
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<const int64_t*>(mask.data)[i] == 1) {
      out->push_back(static_cast<const int64_t*>(ids.data)[i]);
    }
  }
  return true;
}

std::vector<int64_t> Drain(feedline::text::PackedEpoch& e, bool planted) {
  std::vector<int64_t> out;
  for (int guard = 0; guard < 100000 && NextTokens(e, &out, planted);) ++guard;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* tokens_file = new feedline::fuzz::MemFile();
  static feedline::fuzz::MemFile* index_file = new feedline::fuzz::MemFile();
  if (size > 4096) return 0;
  feedline::fuzz::InputHash h(data, size);
  // Documents of distinct ids 1, 2, ...: a token's id says which it is.
  const int n_docs = h.Range(1, 40);
  std::vector<uint16_t> tokens;
  std::vector<uint64_t> index{0};
  for (int d = 0; d < n_docs; ++d) {
    const int len = h.Range(0, 12);
    for (int k = 0; k < len; ++k) tokens.push_back(uint16_t(tokens.size() + 1));
    index.push_back(tokens.size());
  }
  Setup s;
  s.docs.path = tokens_file->Write(reinterpret_cast<const uint8_t*>(tokens.data()),
                                   tokens.size() * sizeof(uint16_t));
  s.docs.index_path = index_file->Write(reinterpret_cast<const uint8_t*>(index.data()),
                                        index.size() * sizeof(uint64_t));
  s.pack.mode = feedline::text::PackMode::kConcat;
  s.pack.seq_len = h.Range(1, 8);
  s.pack.batch_size = h.Range(1, 3);
  s.pack.mask_boundaries = h.Bit();
  s.options.batch_size(h.Range(1, 4)).shuffle(h.Bit()).seed(h.Next() % 1000).workers(1).prefetch(2);
  const int world = h.Range(1, 4), new_world = h.Range(1, 4);

  // The saved layout: rank r takes the number of batches the input's r-th byte says.
  Bytes in(data, size);
  std::vector<int64_t> seen;
  std::vector<PackedLoader::State> states;
  for (int r = 0; r < world; ++r) {
    std::unique_ptr<PackedLoader> l = Make(s, r, world);
    std::unique_ptr<feedline::text::PackedEpoch> e = l->StartEpoch();
    const int take = in.U8() % 12;
    for (int k = 0; k < take && NextTokens(*e, &seen); ++k) {
    }
    states.push_back(l->state());
  }
  // Fields replaced by raw values: a flag byte, then 8 bytes per field it marks.
  const uint8_t raw = in.U8();
  const bool genuine = (raw & 0x7f) == 0;
  PackedLoader::State& st = states[size_t(in.U8()) % states.size()];
  if (raw & 1) st.document = in.I64();
  if (raw & 2) st.offset = in.I64();
  if (raw & 4) st.documents.batches_done = in.I64();
  if (raw & 8) st.documents.skipped = in.I64();
  if (raw & 16) st.documents.rank = int(in.I64());
  if (raw & 32) st.documents.world_size = int(in.I64());
  if (raw & 64) st.documents.epoch = in.I64();
  const bool reload = raw & 128;

  std::vector<int64_t> resumed;  // what the new layout's ranks delivered
  // The saved epoch: the earliest (a rank whose rows ran out saved the next one's start).
  int64_t saved_epoch = states[0].documents.epoch;
  for (const PackedLoader::State& x : states)
    saved_epoch = std::min(saved_epoch, x.documents.epoch);
  for (int r = 0; r < new_world; ++r) {
    std::unique_ptr<PackedLoader> l = Make(s, r, new_world);
    const absl::Status rs = l->Resplit(states);
    if (!rs.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(rs), rs.ToString());
      FUZZ_CHECK(!genuine, "genuine states refused: " + rs.ToString());
      return 0;
    }
    std::unique_ptr<feedline::text::PackedEpoch> e = l->StartEpoch();
    if (e->epoch() != saved_epoch) {  // the epoch was over: nothing resumes
      FUZZ_CHECK(!genuine || e->epoch() == saved_epoch + 1, "resumed epoch");
      if (genuine) continue;
      return 0;
    }
    std::vector<int64_t> after;
    NextTokens(*e, &after, !genuine);
    if (reload) {  // the rest again from a state saved here, by a fresh loader of this layout
      const PackedLoader::State mid = l->state();
      std::vector<int64_t> rest = Drain(*e, !genuine);
      std::unique_ptr<PackedLoader> again = Make(s, r, new_world);
      const absl::Status ls = again->LoadState(mid);
      FUZZ_CHECK(ls.ok() || !genuine, ls.ToString());
      if (!ls.ok()) return 0;
      std::unique_ptr<feedline::text::PackedEpoch> e2 = again->StartEpoch();
      const std::vector<int64_t> rest2 = Drain(*e2, !genuine);
      if (std::getenv("FEEDLINE_FUZZ_DEBUG") != nullptr && rest2 != rest) {
        std::fprintf(stderr, "docs %d seq_len %d rows %d doc_batch %d shuffle %d W %d W' %d r %d\n",
                     n_docs, int(s.pack.seq_len), int(s.pack.batch_size),
                     int(s.options.batch_size()), int(s.options.shuffle()), world, new_world, r);
        for (const PackedLoader::State& x : states) {
          std::fprintf(stderr, "  rank %d epoch %ld doc %ld off %ld\n", x.documents.rank,
                       long(x.documents.epoch), long(x.document), long(x.offset));
        }
        std::fprintf(stderr, "mid: epoch %ld doc %ld off %ld skipped %ld holes %ld\n",
                     long(mid.documents.epoch), long(mid.document), long(mid.offset),
                     long(mid.documents.skipped), long(mid.holes_world));
        for (int64_t t : after) std::fprintf(stderr, "%ld ", long(t));
        std::fprintf(stderr, "| ");
        for (int64_t t : rest) std::fprintf(stderr, "%ld ", long(t));
        std::fprintf(stderr, "\n2: ");
        for (int64_t t : rest2) std::fprintf(stderr, "%ld ", long(t));
        std::fprintf(stderr, "\n");
      }
      // (A rank whose rows ran out with that batch saved the next epoch's start.)
      FUZZ_CHECK(rest2 == rest || !genuine || mid.documents.epoch != saved_epoch,
                 "a state saved after a resplit resumed other rows");
      after.insert(after.end(), rest.begin(), rest.end());
    } else {
      const std::vector<int64_t> rest = Drain(*e, !genuine);
      after.insert(after.end(), rest.begin(), rest.end());
    }
    resumed.insert(resumed.end(), after.begin(), after.end());
  }
  // Every token of the epoch once: over both layouts, or (every saved rank had finished epoch
  // 0 and saved epoch 1's start) in each.
  auto once = [&](std::vector<int64_t> got) {
    std::sort(got.begin(), got.end());
    std::vector<int64_t> want(tokens.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = int64_t(i + 1);
    FUZZ_CHECK(got == want, absl::StrCat(got.size(), " tokens delivered of ", want.size()));
  };
  if (genuine && saved_epoch == 1) {
    once(seen);
    once(resumed);
  } else if (genuine) {
    seen.insert(seen.end(), resumed.begin(), resumed.end());
    if (std::getenv("FEEDLINE_FUZZ_DEBUG") != nullptr) {
      std::fprintf(stderr, "docs %d seq_len %d rows %d doc_batch %d shuffle %d W %d W' %d\n",
                   n_docs, int(s.pack.seq_len), int(s.pack.batch_size), int(s.options.batch_size()),
                   int(s.options.shuffle()), world, new_world);
      for (const PackedLoader::State& x : states) {
        std::fprintf(stderr, "  rank %d epoch %ld doc %ld off %ld\n", x.documents.rank,
                     long(x.documents.epoch), long(x.document), long(x.offset));
      }
      for (int64_t t : seen) std::fprintf(stderr, "%ld ", long(t));
      std::fprintf(stderr, "\n");
    }
    once(seen);
  }
  return 0;
}
