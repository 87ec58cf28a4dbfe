// Documents from text and JSON Lines files, tokenized in the workers (feedline/text.h).
#include <sys/stat.h>
#include <unistd.h>  // access

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/file_io.h"
#include "core/fnv.h"
#include "core/redact.h"
#include "feedline/schema.h"
#include "feedline/text.h"
#include "text/utf8.h"
#include "text/word_cache.h"

namespace feedline::text {
namespace {

// Lines of a file: where each non-blank line starts and ends, found once at open.
class TextLinesDataset final : public Dataset {
 public:
  TextLinesDataset(std::string path, std::vector<uint8_t> data, std::vector<int64_t> starts,
                   std::vector<int64_t> ends, std::vector<int64_t> line_numbers, uint64_t fp)
      : path_(std::move(path)),
        data_(std::move(data)),
        starts_(std::move(starts)),
        ends_(std::move(ends)),
        lines_(std::move(line_numbers)),
        fingerprint_(fp) {}
  int64_t size() const override { return int64_t(starts_.size()); }
  absl::Status Read(int64_t index, Record* record) const override {
    const auto a = size_t(starts_[size_t(index)]), b = size_t(ends_[size_t(index)]);
    record->bytes.assign(data_.begin() + long(a), data_.begin() + long(b));
    record->label = 0;
    record->members.clear();
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override {
    return absl::StrCat(path_, ":", lines_[size_t(index)]);
  }
  uint64_t Fingerprint() const override { return fingerprint_; }
  bool in_memory() const override { return true; }

 private:
  std::string path_;
  std::vector<uint8_t> data_;  // the file's bytes (documents are read from memory)
  std::vector<int64_t> starts_, ends_, lines_;
  uint64_t fingerprint_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::shared_ptr<const SentencePieceModel> m, bool word_cache)
      : encoder_(std::move(m), word_cache) {}
  absl::Status Encode(absl::string_view text, std::vector<int>* ids) const override {
    return encoder_.Encode(text, ids);
  }
  int vocab_size() const override { return encoder_.model().vocab_size(); }
  int bos_id() const override { return encoder_.model().bos_id(); }
  int eos_id() const override { return encoder_.model().eos_id(); }
  int pad_id() const override { return encoder_.model().pad_id(); }
  Counters counters() const override {
    const WordCacheCounters c = encoder_.counters();
    return {c.enabled, c.documents, c.words, c.cached_words};
  }

 private:
  WordCachedEncoder encoder_;
};

// Where a prefix of `text` of at most `limit` bytes may end: just before the last ASCII space,
// tab or newline in its second half (SentencePiece's pieces never cross whitespace, so the
// prefix's pieces are the whole text's), else at the last UTF-8 character boundary (text without
// spaces: CJK, base64, minified code; see EncodeKept for why that is still exact in practice).
size_t PrefixEnd(absl::string_view text, size_t limit) {
  for (size_t i = limit; i > limit / 2; --i) {
    const char c = text[i - 1];
    if (c == ' ' || c == '\t' || c == '\n') return i - 1;
  }
  size_t i = limit;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Encodes as much of `text` as its first `keep` tokens need. A long document is encoded a
// prefix at a time, twice as long each time, until the prefix gives `keep` tokens and a margin:
// the work and memory are bounded by what is kept, not by the document (a 16 MB line without
// spaces took 4 GB and 33 s before max_length threw almost all of it away). A prefix that ends
// at whitespace gives exactly the whole text's first pieces. One that ends inside a run without
// spaces can change the pieces next to its end: the margin (kMarginTokens, never kept) holds
// them. *partly: only a prefix was encoded (the tokens past it were not counted).
absl::Status EncodeKept(const Tokenizer& t, absl::string_view text, int64_t keep,
                        std::vector<int>* body, bool* partly) {
  constexpr int64_t kMarginTokens = 64;
  constexpr size_t kFirstBytesPerToken = 8;  // typical text: 3-5 bytes per token
  // Up to here a document is tokenized whole (~16 MB of SentencePiece's lattice at most), so
  // its cut tokens are counted exactly.
  constexpr size_t kWholeBytes = size_t{64} << 10;
  *partly = false;
  const int64_t want = std::max<int64_t>(keep, 0) + kMarginTokens;
  size_t limit = std::max(kWholeBytes, size_t(std::min<int64_t>(want, int64_t(1) << 40)) *
                                           kFirstBytesPerToken);
  while (text.size() > limit) {
    body->clear();
    if (absl::Status s = t.Encode(text.substr(0, PrefixEnd(text, limit)), body); !s.ok()) {
      return s;
    }
    if (int64_t(body->size()) >= want) {
      *partly = true;
      return absl::OkStatus();
    }
    limit = limit > text.size() / 2 ? text.size() : limit * 2;
  }
  body->clear();
  return t.Encode(text, body);
}

class TokenizeTransform final : public SampleTransform {
 public:
  TokenizeTransform(TokenizeOptions o, Schema schema)
      : o_(std::move(o)), schema_(std::move(schema)) {}
  const Schema& schema() const override { return schema_; }

  struct State : WorkerState {
    std::vector<int> ids, body;
  };
  std::unique_ptr<WorkerState> NewWorkerState() const override { return std::make_unique<State>(); }
  // Truncation cuts are counted as documents are tokenized (TokenizeOptions::cut): only the
  // documents of an epoch the consumer asked for.
  bool MayStartAhead() const override { return false; }

  absl::Status Apply(const Record& record, const SampleContext&, WorkerState* ws,
                     SampleWriter& out) const override {
    auto* state = static_cast<State*>(ws);
    // A WebDataset key: the document is its ".json" member (with `field`) or its ".txt".
    const std::vector<uint8_t>* payload = &record.bytes;
    if (!record.members.empty()) {
      const char* want = o_.field.empty() ? "txt" : "json";
      payload = record.member(want);
      if (payload == nullptr) {
        return absl::DataLossError(absl::StrCat("the key has no .", want, " member"));
      }
    }
    const auto* bytes = payload->data();
    size_t n = payload->size();
    if (n > 0 && bytes[n - 1] == '\r') --n;  // CRLF files
    size_t bad = 0;
    if (!ValidUtf8(bytes, n, &bad)) {
      return absl::DataLossError(absl::StrCat("invalid UTF-8 at byte ", bad, " of the line"));
    }
    absl::string_view text(reinterpret_cast<const char*>(bytes), n);
    std::string field_text;
    if (!o_.field.empty()) {
      const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                       /*allow_exceptions=*/false);
      if (doc.is_discarded()) return absl::DataLossError("not a JSON line");
      const auto it = doc.is_object() ? doc.find(o_.field) : doc.end();
      if (!doc.is_object() || it == doc.end()) {
        return absl::DataLossError(absl::StrCat("JSON line without the field \"", o_.field, "\""));
      }
      if (!it->is_string()) {
        return absl::DataLossError(absl::StrCat("field \"", o_.field, "\" is not a string"));
      }
      field_text = it->get<std::string>();
      text = field_text;
    }
    // A document whose text has no tokens (empty, or only characters the tokenizer drops: a
    // no-break or ideographic space, a zero-width space, a BOM, control characters) is empty.
    // Ragged (the packer's input): written with no tokens, and the packer skips and counts it.
    // Padded: a DataError naming the line (OnError::kSkip replaces it and counts it).
    std::vector<int>& body = state->body;
    body.clear();
    bool partly = false;  // only a prefix was encoded: the document is longer than max_length
    const bool bos = o_.add_bos && o_.tokenizer->bos_id() >= 0;
    if (!text.empty()) {
      absl::Status s = EncodeKept(*o_.tokenizer, text, o_.max_length - (bos ? 1 : 0), &body,
                                  &partly);
      if (!s.ok()) return s;
    }
    if (body.empty()) {
      if (o_.ragged) {
        absl::StatusOr<int32_t*> dst = out.Shaped<int32_t>(0, {0});
        return dst.ok() ? absl::OkStatus() : dst.status();
      }
      return absl::DataLossError(text.empty() ? "empty document"
                                              : "empty document (the text has no tokens)");
    }
    std::vector<int>& ids = state->ids;
    ids.clear();
    if (bos) ids.push_back(o_.tokenizer->bos_id());
    ids.insert(ids.end(), body.begin(), body.end());
    if (o_.add_eos && o_.tokenizer->eos_id() >= 0) ids.push_back(o_.tokenizer->eos_id());
    const int64_t len = std::min<int64_t>(int64_t(ids.size()), o_.max_length);
    if (o_.cut) o_.cut->Add(int64_t(ids.size()) - len, partly);
    if (o_.ragged) {
      absl::StatusOr<int32_t*> dst = out.Shaped<int32_t>(0, {len});
      if (!dst.ok()) return dst.status();
      std::copy(ids.begin(), ids.begin() + len, *dst);
      return absl::OkStatus();
    }
    absl::StatusOr<int64_t*> dst = out.Shaped<int64_t>(0, {len});
    if (!dst.ok()) return dst.status();
    std::copy(ids.begin(), ids.begin() + len, *dst);
    return absl::OkStatus();
  }

 private:
  const TokenizeOptions o_;
  const Schema schema_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Dataset>> OpenTextLines(const TextFileOptions& o) {
  // Messages name the file as the user gave it, without credentials or control characters.
  const std::string name = ShownName(o.name.empty() ? o.path : o.name);
  std::vector<uint8_t> data;
  if (absl::Status s = ReadWholeFile(o.path, std::numeric_limits<int64_t>::max(), &data); !s.ok()) {
    return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{o.path, name}}));
  }
  struct stat st {};
  if (::stat(o.path.c_str(), &st) != 0) return ErrnoStatus(errno, name, "stat");
  std::vector<int64_t> starts, ends, lines;
  int64_t line = 0;
  for (size_t a = 0; a < data.size();) {
    size_t b = size_t(std::find(data.begin() + long(a), data.end(), uint8_t('\n')) - data.begin());
    ++line;
    bool blank = true;
    for (size_t i = a; i < b; ++i) {
      if (!std::isspace(static_cast<unsigned char>(data[i]))) {
        blank = false;
        break;
      }
    }
    if (!blank) {
      starts.push_back(int64_t(a));
      ends.push_back(int64_t(b));
      lines.push_back(line);
    }
    a = b + 1;
  }
  if (starts.empty()) return absl::DataLossError(absl::StrCat(name, ": no documents"));
  Fnv1a h;
  h.Mix(name.data(), name.size());
  const uint64_t size = data.size();
  h.Mix(&size, sizeof(size));
  h.Mix(&st.st_mtim, sizeof(st.st_mtim));
  return std::shared_ptr<const Dataset>(std::make_shared<TextLinesDataset>(
      name, std::move(data), std::move(starts), std::move(ends), std::move(lines), h.value));
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadSentencePiece(
    const std::string& path, const SentencePieceOptions& options) {
  if (::access(path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such SentencePiece model"));
  }
  std::string error;
  std::unique_ptr<SentencePieceModel> m = SentencePieceModel::Load(path, &error);
  if (m == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": ", error));
  return std::shared_ptr<const Tokenizer>(
      std::make_shared<SentencePieceTokenizer>(std::move(m), options.word_cache));
}

absl::StatusOr<std::shared_ptr<SampleTransform>> MakeTokenizeTransform(const TokenizeOptions& o) {
  if (o.tokenizer == nullptr) return absl::InvalidArgumentError("tokenizer: required");
  if (o.max_length < 1) return absl::InvalidArgumentError("max_length: must be >= 1");
  const int pad = o.tokenizer->pad_id() >= 0 ? o.tokenizer->pad_id() : 0;
  Schema schema(
      {o.ragged
           ? Field("input_ids", DType::kInt32, {Dim::UpTo(o.max_length)}).collate(Collate::kRagged)
           : Field("input_ids", DType::kInt64, {Dim::UpTo(o.max_length)}).pad_value(pad)});
  if (absl::Status s = schema.Validate(); !s.ok()) return s;
  return std::shared_ptr<SampleTransform>(
      std::make_shared<TokenizeTransform>(o, std::move(schema)));
}

}  // namespace feedline::text
