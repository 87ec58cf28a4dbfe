// libFuzzer target: a text or JSON Lines file as a downloaded corpus hands it in (the input's
// bytes), through OpenTextLines (line splitting: CRLF, blank lines, no final newline) and a
// loader of MakeTokenizeTransform (UTF-8 validation, JSON parsing of the text field, documents
// with no tokens, documents far longer than max_length tokenized in prefixes), padded or
// ragged, under on_error raise and skip. The tokenizer is a toy one (ids from the words between
// ASCII spaces), so the properties can be checked exactly:
//  - the file opens, or fails with kDataLoss naming it ("no documents");
//  - the documents are the lines with a character other than whitespace, in order;
//  - every sample is its document's first max_length ids (with BOS / EOS as asked), in padded
//    and in ragged batches alike, or the document's kDataLoss error naming the file and line;
//  - a failed batch (raise, or skip when every replacement failed too) is kDataLoss naming the
//    file.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/redact.h"
#include "feedline/feedline.h"
#include "feedline/text.h"
#include "fuzz_util.h"

namespace {

// Ids from the words between ASCII spaces: 3 + (FNV-1a of the word) mod 997; BOS 1, EOS 2,
// pad 0. A prefix's ids are the whole text's, except its last word's (a cut word), which the
// loader never keeps (the Tokenizer seam's contract).
class WordTokenizer final : public feedline::text::Tokenizer {
 public:
  absl::Status Encode(absl::string_view text, std::vector<int>* ids) const override {
    ids->clear();
    size_t a = 0;
    while (a < text.size()) {
      while (a < text.size() && text[a] == ' ') ++a;
      size_t b = a;
      while (b < text.size() && text[b] != ' ') ++b;
      if (b > a) {
        uint64_t h = 1469598103934665603ULL;
        for (size_t i = a; i < b; ++i) h = (h ^ uint8_t(text[i])) * 1099511628211ULL;
        ids->push_back(3 + int(h % 997));
      }
      a = b;
    }
    return absl::OkStatus();
  }
  int vocab_size() const override { return 1000; }
  int bos_id() const override { return 1; }
  int eos_id() const override { return 2; }
  int pad_id() const override { return 0; }
};

bool Blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](unsigned char c) { return std::isspace(c) != 0; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* file = new feedline::fuzz::MemFile();
  static auto* tokenizer = new std::shared_ptr<const feedline::text::Tokenizer>(
      std::make_shared<WordTokenizer>());
  if (size > 65536) return 0;
  feedline::fuzz::InputHash h(data, size);
  const std::string& path = file->Write(data, size);
  const std::string shown = feedline::ShownName(path);

  // The documents, as the file format defines them.
  std::vector<std::string> lines;
  {
    std::string cur;
    for (size_t i = 0; i < size; ++i) {
      if (data[i] == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(char(data[i]));
      }
    }
    if (!cur.empty()) lines.push_back(cur);
  }
  std::vector<std::string> docs;
  for (const std::string& l : lines) {
    if (!Blank(l)) docs.push_back(l);
  }

  feedline::text::TextFileOptions t;
  t.path = path;
  const bool json = h.Bit();
  if (json) t.field = "text";
  absl::StatusOr<std::shared_ptr<const feedline::Dataset>> ds = feedline::text::OpenTextLines(t);
  if (!ds.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(ds.status()) && docs.empty(), ds.status().ToString());
    FUZZ_CHECK(absl::StrContains(ds.status().message(), shown), ds.status().ToString());
    return 0;
  }
  FUZZ_CHECK(int64_t(docs.size()) == (*ds)->size(),
             absl::StrCat((*ds)->size(), " documents, want ", docs.size()));

  feedline::text::TokenizeOptions o;
  o.tokenizer = *tokenizer;
  o.max_length = h.Range(1, 48);
  o.add_bos = h.Bit();
  o.add_eos = h.Bit();
  o.field = t.field;
  o.ragged = h.Bit();
  absl::StatusOr<std::shared_ptr<feedline::SampleTransform>> transform =
      feedline::text::MakeTokenizeTransform(o);
  FUZZ_CHECK(transform.ok(), transform.status().ToString());
  const bool skip = h.Bit();
  feedline::LoaderOptions lo;
  lo.batch_size(h.Range(1, 5))
      .shuffle(h.Bit())
      .seed(h.Next())
      .workers(1)
      .io_depth(1)
      .prefetch(1)
      .worker_nice(0)
      .epoch_head_start(false)
      .on_error(skip ? feedline::OnError::kSkip : feedline::OnError::kRaise);
  absl::StatusOr<std::unique_ptr<feedline::Loader>> loader =
      feedline::Loader::Create(*ds, *transform, lo);
  FUZZ_CHECK(loader.ok(), loader.status().ToString());

  // What each document gives: its ids, or why it fails.
  WordTokenizer words;
  auto expected = [&](int64_t i, std::vector<int64_t>* ids) -> bool {
    std::string text = docs[size_t(i)];
    if (!text.empty() && text.back() == '\r') text.pop_back();
    // (The loader's own checks decide UTF-8 and JSON; a document that passes them must give
    // these ids. JSON documents are checked only for the ids' count bound.)
    std::vector<int> body;
    if (!json) (void)words.Encode(text, &body);
    ids->clear();
    if (body.empty()) return false;  // no tokens: none, not even BOS / EOS (ragged: 0 of them)
    if (o.add_bos) ids->push_back(1);
    for (int id : body) ids->push_back(id);
    if (o.add_eos) ids->push_back(2);
    if (int64_t(ids->size()) > o.max_length) ids->resize(size_t(o.max_length));
    return true;
  };

  int64_t delivered = 0;
  std::unique_ptr<feedline::Epoch> epoch = (*loader)->StartEpoch();
  for (int guard = 0; guard < 100000; ++guard) {
    absl::StatusOr<feedline::Batch> b = epoch->Next();
    if (absl::IsOutOfRange(b.status())) break;
    if (!b.ok()) {
      // Under skip too, when every replacement tried failed as well.
      FUZZ_CHECK(absl::IsDataLoss(b.status()), b.status().ToString());
      FUZZ_CHECK(absl::StartsWith(b.status().message(), shown), b.status().ToString());
      continue;
    }
    const feedline::TensorView v = b->field("input_ids");
    for (int64_t k = 0; k < b->size(); ++k) {
      const int64_t doc = b->indices()[k];
      FUZZ_CHECK(doc >= 0 && doc < int64_t(docs.size()), absl::StrCat(doc));
      const int64_t n = v.lengths[k];
      // A document without tokens is an error when padded; ragged (the packer's input), it is
      // written with no tokens (the packer skips and counts it).
      FUZZ_CHECK(n >= (o.ragged ? 0 : 1) && n <= o.max_length, absl::StrCat(n));
      std::vector<int64_t> got(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        got[size_t(j)] = o.ragged ? static_cast<const int32_t*>(v.data)[v.offsets[k] + j]
                                  : static_cast<const int64_t*>(v.data)[k * v.shape[1] + j];
        FUZZ_CHECK(got[size_t(j)] >= 0 && got[size_t(j)] < 1000, absl::StrCat(got[size_t(j)]));
      }
      if (!o.ragged) {  // padding holds the pad id
        for (int64_t j = n; j < v.shape[1]; ++j) {
          FUZZ_CHECK(static_cast<const int64_t*>(v.data)[k * v.shape[1] + j] == 0, "padding");
        }
      }
      std::vector<int64_t> want;
      const bool has_words = expected(doc, &want);
      if (!json) {
        FUZZ_CHECK(has_words || o.ragged, absl::StrCat("document ", doc, " has no words"));
        // A document whose tokens were cut: only its first ids are the whole text's when the
        // text was tokenized in prefixes, and all of them are.
        FUZZ_CHECK(got == want, absl::StrCat("document ", doc, ": ids differ"));
      }
      ++delivered;
    }
  }
  FUZZ_CHECK(delivered <= (*loader)->num_samples(), absl::StrCat(delivered));
  // Under raise, a batch without a failed document delivers all of its samples; the documents
  // that fail are the lines the loader's checks refuse, never a good one (checked above).
  return 0;
}
