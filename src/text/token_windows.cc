#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/file_io.h"
#include "core/fnv.h"
#include "feedline/schema.h"
#include "core/redact.h"
#include "feedline/text.h"

namespace feedline::text {
namespace {

int64_t TokenBytes(TokenDType t) { return t == TokenDType::kUint16 ? 2 : 4; }

// The read-only mapping of one token file, unmapped with the last holder. The file stays open:
// a file cut short under a running loader would turn the mapping's reads past its new end into
// SIGBUS, so every sample first checks that the file still holds the bytes it reads (one fstat).
struct Mapping {
  std::string path;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int fd = -1;
  ~Mapping() {
    if (data != nullptr) munmap(const_cast<uint8_t*>(data), bytes);
    if (fd >= 0) ::close(fd);
  }
  // OK when bytes [0, end) are still in the file; else a DataError naming it.
  absl::Status Holds(uint64_t end) const {
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && uint64_t(st.st_size) >= end) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        path, ": the token file was cut to ", fd >= 0 ? int64_t(st.st_size) : 0,
        " bytes while in use (it had ", bytes, "; this sample reads up to byte ", end,
        "): replace such files by renaming a new one into place, never by rewriting them"));
  }
};

class TokenFileDataset final : public Dataset {
 public:
  TokenFileDataset(std::shared_ptr<const Mapping> map, int64_t windows, int64_t window,
                   uint64_t fingerprint)
      : map_(std::move(map)), windows_(windows), window_(window), fingerprint_(fingerprint) {}
  int64_t size() const override { return windows_; }
  absl::Status Read(int64_t, Record* record) const override {
    record->bytes.clear();
    record->label = 0;
    record->members.clear();
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override {
    return absl::StrCat(map_->path, ": window ", index, " (tokens ", index * window_, "..",
                        (index + 1) * window_ - 1, ")");
  }
  uint64_t Fingerprint() const override { return fingerprint_; }
  bool empty_records() const override { return true; }

 private:
  std::shared_ptr<const Mapping> map_;
  int64_t windows_, window_;
  uint64_t fingerprint_;
};

class TokenWindowTransform final : public SampleTransform {
 public:
  TokenWindowTransform(std::shared_ptr<const Mapping> map, TokenFileOptions o)
      : map_(std::move(map)),
        o_(std::move(o)),
        schema_({Field("input_ids", DType::kInt64, {o_.seq_len}),
                 Field("labels", DType::kInt64, {o_.seq_len})}) {}
  const Schema& schema() const override { return schema_; }
  absl::Status Apply(const Record&, const SampleContext& ctx, WorkerState*,
                     SampleWriter& out) const override {
    const int64_t n = o_.seq_len;
    const int64_t start = ctx.index() * (n + 1);
    int64_t* ids = out.Fixed<int64_t>(0);
    int64_t* labels = out.Fixed<int64_t>(1);
    if (o_.dtype == TokenDType::kUint16) return Copy<uint16_t>(start, ids, labels);
    return Copy<uint32_t>(start, ids, labels);
  }

 private:
  template <typename T>
  absl::Status Copy(int64_t start, int64_t* ids, int64_t* labels) const {
    const int64_t n = o_.seq_len;
    if (absl::Status s = map_->Holds(uint64_t(start + n + 1) * sizeof(T)); !s.ok()) return s;
    const uint8_t* base = map_->data + size_t(start) * sizeof(T);
    T prev;
    std::memcpy(&prev, base, sizeof(T));  // unaligned-safe; little-endian hosts
    if (absl::Status s = Check(prev, start); !s.ok()) return s;
    for (int64_t j = 0; j < n; ++j) {
      T next;
      std::memcpy(&next, base + size_t(j + 1) * sizeof(T), sizeof(T));
      if (absl::Status s = Check(next, start + j + 1); !s.ok()) return s;
      ids[j] = int64_t(prev);
      labels[j] = int64_t(next);
      prev = next;
    }
    return absl::OkStatus();
  }
  absl::Status Check(uint64_t token, int64_t at) const {
    if (o_.vocab_size > 0 && token >= uint64_t(o_.vocab_size)) {
      return absl::DataLossError(absl::StrCat("token ", token, " at token offset ",
                                              at, " (byte ", at * TokenBytes(o_.dtype),
                                              ") is not below vocab_size ", o_.vocab_size));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<const Mapping> map_;
  const TokenFileOptions o_;
  const Schema schema_;
};

// Maps a token file read-only; its size and modification time in *st.
// `name` names it in messages.
absl::StatusOr<std::shared_ptr<const Mapping>> MapTokenFile(const std::string& path,
                                                            const std::string& name,
                                                            int64_t token_bytes, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, name, "open");
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, name, "stat");
  }
  const int64_t bytes = st->st_size;
  if (bytes % token_bytes != 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(name, ": ", bytes, " bytes is not a whole number of ",
                                            token_bytes, "-byte tokens (wrong dtype?)"));
  }
  auto map = std::make_shared<Mapping>();
  map->path = name;
  if (bytes == 0) {
    ::close(fd);
    return std::shared_ptr<const Mapping>(std::move(map));
  }
  void* p = mmap(nullptr, size_t(bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    ::close(fd);
    return ErrnoStatus(err, name, "mmap");
  }
  map->fd = fd;
  map->data = static_cast<const uint8_t*>(p);
  map->bytes = size_t(bytes);
  // Samples are read in a shuffled order: tell the kernel not to read ahead sequentially.
  madvise(p, size_t(bytes), MADV_RANDOM);
  return std::shared_ptr<const Mapping>(std::move(map));
}

template <typename T>
uint64_t TokenAt(const Mapping& m, int64_t i) {
  T v;
  std::memcpy(&v, m.data + size_t(i) * sizeof(T), sizeof(T));  // little-endian hosts
  return v;
}

class TokenDocumentDataset final : public Dataset {
 public:
  TokenDocumentDataset(std::shared_ptr<const Mapping> map, std::vector<uint64_t> offsets,
                       uint64_t fingerprint)
      : map_(std::move(map)), offsets_(std::move(offsets)), fingerprint_(fingerprint) {}
  int64_t size() const override { return int64_t(offsets_.size()) - 1; }
  absl::Status Read(int64_t, Record* record) const override {
    record->bytes.clear();
    record->label = 0;
    record->members.clear();
    return absl::OkStatus();
  }
  std::string Describe(int64_t i) const override {
    return absl::StrCat(map_->path, ": document ", i, " (tokens ", offsets_[size_t(i)], "..",
                        int64_t(offsets_[size_t(i) + 1]) - 1, ")");
  }
  uint64_t Fingerprint() const override { return fingerprint_; }
  bool empty_records() const override { return true; }
  uint64_t begin(int64_t i) const { return offsets_[size_t(i)]; }
  uint64_t end(int64_t i) const { return offsets_[size_t(i) + 1]; }

 private:
  std::shared_ptr<const Mapping> map_;
  std::vector<uint64_t> offsets_;
  uint64_t fingerprint_;
};

class TokenDocumentTransform final : public SampleTransform {
 public:
  TokenDocumentTransform(std::shared_ptr<const Mapping> map,
                         std::shared_ptr<const TokenDocumentDataset> docs, TokenDocumentOptions o)
      : map_(std::move(map)),
        docs_(std::move(docs)),
        o_(std::move(o)),
        schema_({Field("input_ids", DType::kInt32, {Dim::UpTo(o_.max_length)})
                     .collate(Collate::kRagged)}) {}
  const Schema& schema() const override { return schema_; }
  // Documents cut to max_length are counted as they are read (TokenDocumentOptions::cut): only
  // the documents of an epoch the consumer asked for.
  bool MayStartAhead() const override { return false; }
  absl::Status Apply(const Record&, const SampleContext& ctx, WorkerState*,
                     SampleWriter& out) const override {
    const int64_t a = int64_t(docs_->begin(ctx.index())), b = int64_t(docs_->end(ctx.index()));
    if (a == b) {  // an empty document: no tokens, and the packer skips and counts it
      absl::StatusOr<int32_t*> none = out.Shaped<int32_t>(0, {0});
      return none.ok() ? absl::OkStatus() : none.status();
    }
    if (absl::Status s = map_->Holds(uint64_t(b) * uint64_t(TokenBytes(o_.dtype))); !s.ok()) {
      return s;
    }
    const int64_t eos = o_.eos_id >= 0 ? 1 : 0;
    const int64_t n = std::min(b - a + eos, o_.max_length);
    absl::StatusOr<int32_t*> dst = out.Shaped<int32_t>(0, {n});
    if (!dst.ok()) return dst.status();
    const int64_t body = std::min(b - a, n);
    for (int64_t j = 0; j < body; ++j) {
      const uint64_t t = o_.dtype == TokenDType::kUint16 ? TokenAt<uint16_t>(*map_, a + j)
                                                         : TokenAt<uint32_t>(*map_, a + j);
      if (o_.vocab_size > 0 && t >= uint64_t(o_.vocab_size)) {
        return absl::DataLossError(absl::StrCat("token ", t, " at token offset ", a + j,
                                                " is not below vocab_size ", o_.vocab_size));
      }
      // Documents go to the packer as int32 ids: a uint32 id past INT32_MAX (a damaged file,
      // or one of another dtype) would come out negative, silently (found by fuzz_tokens).
      if (t > uint64_t(INT32_MAX)) {
        return absl::DataLossError(absl::StrCat("token ", t, " at token offset ", a + j,
                                                " does not fit an int32 id"));
      }
      (*dst)[j] = int32_t(t);
    }
    if (n > body) (*dst)[body] = int32_t(o_.eos_id);
    if (o_.cut) o_.cut->Add(b - a + eos - n);  // a document that failed is not counted as cut
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const Mapping> map_;
  std::shared_ptr<const TokenDocumentDataset> docs_;
  const TokenDocumentOptions o_;
  const Schema schema_;
};

}  // namespace

absl::StatusOr<TokenWindows> OpenTokenWindows(const TokenFileOptions& o) {
  if (o.seq_len < 1) return absl::InvalidArgumentError("seq_len: must be >= 1");
  if (o.vocab_size < 0) return absl::InvalidArgumentError("vocab_size: must be >= 0");
  const int64_t token_bytes = TokenBytes(o.dtype);
  struct stat st {};
  // Messages name the file as the user gave it, without credentials or control characters.
  const std::string name = ShownName(o.name.empty() ? o.path : o.name);
  absl::StatusOr<std::shared_ptr<const Mapping>> map = MapTokenFile(o.path, name, token_bytes, &st);
  if (!map.ok()) return map.status();
  const int64_t bytes = st.st_size;
  const int64_t tokens = bytes / token_bytes;
  const int64_t window = o.seq_len + 1;
  if (tokens < window) {
    return absl::DataLossError(absl::StrCat(name, ": ", tokens, " tokens, fewer than one window",
                                            " of seq_len + 1 = ", window));
  }
  // Identity: the name, size and modification time (a rewritten file is another data set).
  Fnv1a h;
  h.Mix(name.data(), name.size());
  h.Mix(&bytes, sizeof(bytes));
  h.Mix(&st.st_mtim, sizeof(st.st_mtim));
  h.Mix(&o.seq_len, sizeof(o.seq_len));
  TokenWindows out;
  out.tokens = tokens;
  out.dataset = std::make_shared<TokenFileDataset>(*map, tokens / window, window, h.value);
  out.transform = std::make_shared<TokenWindowTransform>(*map, o);
  return out;
}

absl::StatusOr<TokenDocuments> OpenTokenDocuments(const TokenDocumentOptions& o) {
  if (o.vocab_size < 0) return absl::InvalidArgumentError("vocab_size: must be >= 0");
  if (o.max_length < 1) return absl::InvalidArgumentError("max_length: must be >= 1");
  if (o.index_path.empty()) return absl::InvalidArgumentError("index: a document index is needed");
  const int64_t token_bytes = TokenBytes(o.dtype);
  struct stat st {};
  // Messages name the file as the user gave it, without credentials or control characters.
  const std::string name = ShownName(o.name.empty() ? o.path : o.name);
  const std::string index_name =
      ShownName(o.index_name.empty() ? o.index_path : o.index_name);
  absl::StatusOr<std::shared_ptr<const Mapping>> map = MapTokenFile(o.path, name, token_bytes, &st);
  if (!map.ok()) return map.status();
  const uint64_t tokens = uint64_t(st.st_size / token_bytes);
  std::vector<uint8_t> raw;
  if (absl::Status s = ReadWholeFile(o.index_path, int64_t{1} << 40, &raw); !s.ok()) {
    return absl::Status(s.code(), absl::StrReplaceAll(s.message(), {{o.index_path, index_name}}));
  }
  struct stat ist {};
  if (::stat(o.index_path.c_str(), &ist) != 0) return ErrnoStatus(errno, index_name, "stat");
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(index_name, ": not a document index of ", name,
                                            " (n + 1 uint64 token offsets): ", why));
  };
  if (raw.size() % 8 != 0) return bad(absl::StrCat(raw.size(), " bytes, not a multiple of 8"));
  if (raw.size() < 16) return bad("fewer than two offsets");
  std::vector<uint64_t> offsets(raw.size() / 8);
  std::memcpy(offsets.data(), raw.data(), raw.size());
  if (offsets.front() != 0) return bad(absl::StrCat("the first offset is ", offsets.front()));
  if (offsets.back() != tokens) {
    return bad(
        absl::StrCat("the last offset is ", offsets.back(), ", the file has ", tokens, " tokens"));
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return bad(absl::StrCat("offset ", i, " (", offsets[i], ") is below the one before it"));
    }
  }
  Fnv1a h;
  h.Mix(name.data(), name.size());
  const int64_t bytes = st.st_size, index_bytes = ist.st_size;
  h.Mix(&bytes, sizeof(bytes));
  h.Mix(&st.st_mtim, sizeof(st.st_mtim));
  h.Mix(&index_bytes, sizeof(index_bytes));
  h.Mix(&ist.st_mtim, sizeof(ist.st_mtim));
  auto docs = std::make_shared<const TokenDocumentDataset>(*map, std::move(offsets), h.value);
  TokenDocuments out;
  out.tokens = int64_t(tokens);
  out.dataset = docs;
  out.transform = std::make_shared<TokenDocumentTransform>(*map, docs, o);
  return out;
}

}  // namespace feedline::text
