// libFuzzer target: token files and their document index (OpenTokenDocuments), and the text
// packer over them (PackedLoader: concat, best fit, bucket), with documents of zero tokens, of
// one, and longer than a row or than max_length. Both files come from the input (the index is
// its tail, its length and the token width in its first byte); a token file and an index are
// bytes a downloaded data set hands in. Properties: no crash or overflow; a refused index is
// kDataLoss or kInvalidArgument naming the index; over an epoch every batch keeps its invariants
// (attention_mask 1 exactly at the row's tokens; padding holds pad_id, label -100 and position 0;
// cu_seqlens increasing, ending at B * seq_len), and the tokens packed are the documents' tokens
// (cut to max_length, eos added) less any that errored — for kConcat, in order.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "feedline/feedline.h"
#include "feedline/text.h"
#include "fuzz_util.h"

namespace {

using feedline::text::PackMode;

const int64_t* I64(const feedline::TensorView& v) { return static_cast<const int64_t*>(v.data); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* tokens_file = new feedline::fuzz::MemFile();
  static feedline::fuzz::MemFile* index_file = new feedline::fuzz::MemFile();
  if (size < 1 || size > 16384) return 0;
  feedline::fuzz::InputHash h(data, size);
  // The first byte: the index's length in uint64 words (bits 0-4) and the token width (bit 5);
  // the index is the input's last 8 * k bytes, the tokens the bytes between (whole tokens).
  const bool wide = (data[0] >> 5) & 1;
  const size_t width = wide ? 4 : 2;
  const size_t index_bytes = std::min(size - 1, size_t(data[0] & 31) * 8);
  const uint8_t* tokens = data + 1;
  const size_t token_bytes = (size - 1 - index_bytes) / width * width;
  const uint8_t* index = data + size - index_bytes;
  const std::string& tokens_path = tokens_file->Write(tokens, token_bytes);
  const std::string& index_path = index_file->Write(index, index_bytes);

  feedline::text::TokenDocumentOptions d;
  d.path = tokens_path;
  d.index_path = index_path;
  d.dtype = wide ? feedline::text::TokenDType::kUint32 : feedline::text::TokenDType::kUint16;
  d.vocab_size = h.Bit() ? 0 : h.Range(1, 70000);
  d.max_length = h.Range(1, 40);
  d.eos_id = h.Bit() ? -1 : h.Range(0, 9);
  d.cut = std::make_shared<feedline::text::CutCounter>();
  absl::StatusOr<feedline::text::TokenDocuments> docs = feedline::text::OpenTokenDocuments(d);
  if (!docs.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(docs.status()) || absl::IsInvalidArgument(docs.status()),
               docs.status().ToString());
    FUZZ_CHECK(absl::StrContains(docs.status().message(), tokens_path) ||
                   absl::StrContains(docs.status().message(), index_path),
               docs.status().ToString());
    return 0;
  }
  // The documents as the index says (every offset checked by the open).
  std::vector<uint64_t> offsets(index_bytes / 8);
  std::memcpy(offsets.data(), index, offsets.size() * 8);
  const int64_t n_docs = int64_t(offsets.size()) - 1;
  FUZZ_CHECK(n_docs >= 1 && docs->dataset->size() == n_docs, absl::StrCat(n_docs));
  FUZZ_CHECK(offsets.front() == 0 && int64_t(offsets.back()) == int64_t(token_bytes / width),
             "index bounds");

  const bool skip = h.Bit();
  feedline::LoaderOptions lo = feedline::LoaderOptions()
                                   .batch_size(h.Range(1, 4))
                                   .shuffle(false)
                                   .workers(1)
                                   .prefetch(2)
                                   .on_error(skip ? feedline::OnError::kSkip
                                                  : feedline::OnError::kRaise);
  auto loader = feedline::Loader::Create(docs->dataset, docs->transform, lo);
  FUZZ_CHECK(loader.ok(), loader.status().ToString());
  feedline::text::PackOptions po;
  const int mode = h.Range(0, 2);
  po.mode = mode == 0 ? PackMode::kConcat : mode == 1 ? PackMode::kBestFit : PackMode::kBucket;
  po.seq_len = h.Range(1, 16);
  po.batch_size = h.Range(1, 3);
  po.window_rows = h.Range(1, 4);
  po.split_long = h.Bit();
  po.mask_boundaries = h.Bit();
  po.pad_id = h.Range(0, 3);
  po.cut = d.cut;
  auto packed = feedline::text::PackedLoader::Create(*std::move(loader), po);
  FUZZ_CHECK(packed.ok(), packed.status().ToString());

  std::vector<int64_t> got;  // real tokens, in batch order
  int64_t errors = 0;
  std::unique_ptr<feedline::text::PackedEpoch> epoch = (*packed)->StartEpoch();
  for (int guard = 0; guard < 100000; ++guard) {
    absl::StatusOr<feedline::Batch> b = epoch->Next();
    if (absl::IsOutOfRange(b.status())) break;
    if (!b.ok()) {  // a document's error (raise, or skip with no good one left): named
      FUZZ_CHECK(absl::StrContains(b.status().message(), tokens_path), b.status().ToString());
      ++errors;
      continue;
    }
    const feedline::TensorView ids = b->field("input_ids");
    if (po.mode == PackMode::kBucket) {  // padded rows, lengths beside
      const int64_t rows = ids.shape[0], width_now = ids.shape[1];
      FUZZ_CHECK(width_now <= po.seq_len, "bucket wider than seq_len");
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t len = ids.lengths[r];
        for (int64_t k = 0; k < width_now; ++k) {
          const int64_t t = I64(ids)[r * width_now + k];
          if (k < len) got.push_back(t);
          else FUZZ_CHECK(t == po.pad_id, "bucket padding");
        }
      }
      continue;
    }
    const feedline::TensorView mask = b->field("attention_mask");
    const feedline::TensorView labels = b->field("labels");
    const feedline::TensorView pos = b->field("position_ids");
    const feedline::TensorView cu = b->field("cu_seqlens");
    const int64_t rows = ids.shape[0];
    FUZZ_CHECK(ids.shape.size() == 2 && ids.shape[1] == po.seq_len, "row shape");
    for (int64_t i = 0; i < rows * po.seq_len; ++i) {
      const int64_t m = I64(mask)[i];
      FUZZ_CHECK(m == 0 || m == 1, "mask value");
      if (m == 1) {
        got.push_back(I64(ids)[i]);
      } else {
        FUZZ_CHECK(I64(ids)[i] == po.pad_id && I64(labels)[i] == -100 && I64(pos)[i] == 0,
                   absl::StrCat("padding at ", i));
      }
    }
    FUZZ_CHECK(cu.ragged() && cu.dtype == feedline::DType::kInt32, "cu_seqlens");
    const auto* c = static_cast<const int32_t*>(cu.data);
    const int64_t nc = cu.shape[0];
    FUZZ_CHECK(nc >= 2 && c[0] == 0 && c[nc - 1] == rows * po.seq_len, "cu_seqlens ends");
    for (int64_t k = 1; k < nc; ++k) FUZZ_CHECK(c[k] > c[k - 1], "cu_seqlens increasing");
  }
  const feedline::text::PackStats st = (*packed)->pack_stats();
  FUZZ_CHECK(st.tokens == int64_t(got.size()),
             absl::StrCat(st.tokens, " tokens counted, ", got.size(), " in the batches"));
  // What the documents hold, in order: each cut to max_length, eos added (an empty one: none).
  std::vector<int64_t> want;
  bool bad_ids = false;  // a token at or past vocab_size: that document is an error
  int64_t longest = 0;
  for (int64_t i = 0; i < n_docs; ++i) {
    std::vector<int64_t> doc;
    for (uint64_t k = offsets[size_t(i)]; k < offsets[size_t(i) + 1]; ++k) {
      uint32_t t = 0;
      std::memcpy(&t, tokens + k * width, width);
      doc.push_back(int64_t(t));
      bad_ids = bad_ids || (d.vocab_size > 0 && int64_t(t) >= d.vocab_size) ||
                t > uint32_t(INT32_MAX);
    }
    if (doc.empty()) continue;
    if (d.eos_id >= 0) doc.push_back(d.eos_id);
    doc.resize(std::min<size_t>(doc.size(), size_t(d.max_length)));
    longest = std::max<int64_t>(longest, int64_t(doc.size()));
    want.insert(want.end(), doc.begin(), doc.end());
  }
  if (errors > 0 || bad_ids) return 0;
  if (po.mode == PackMode::kConcat) {
    size_t k = 0;
    while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
    FUZZ_CHECK(got == want,
               absl::StrCat(got.size(), " tokens packed, ", want.size(), " in the documents; ",
                            "first difference at ", k, ": ", k < got.size() ? got[k] : -1,
                            " packed, ", k < want.size() ? want[k] : -1, " in the documents"));
  } else if (po.mode == PackMode::kBucket && longest <= po.seq_len) {
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    FUZZ_CHECK(got == want, "bucket: another multiset of tokens");
  }
  return 0;
}
