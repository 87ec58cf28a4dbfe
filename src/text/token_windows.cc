#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/file_io.h"
#include "core/fnv.h"
#include "feedline/schema.h"
#include "feedline/text.h"

namespace feedline::text {
namespace {

// The read-only mapping of one token file, unmapped with the last holder.
struct Mapping {
  std::string path;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (data != nullptr) munmap(const_cast<uint8_t*>(data), bytes);
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
      return absl::DataLossError(absl::StrCat(map_->path, ": token ", token, " at token offset ",
                                              at, " (byte ", at * TokenBytes(o_.dtype),
                                              ") is not below vocab_size ", o_.vocab_size));
    }
    return absl::OkStatus();
  }
  static int64_t TokenBytes(TokenDType t) { return t == TokenDType::kUint16 ? 2 : 4; }

  std::shared_ptr<const Mapping> map_;
  const TokenFileOptions o_;
  const Schema schema_;
};

}  // namespace

absl::StatusOr<TokenWindows> OpenTokenWindows(const TokenFileOptions& o) {
  if (o.seq_len < 1) return absl::InvalidArgumentError("seq_len: must be >= 1");
  if (o.vocab_size < 0) return absl::InvalidArgumentError("vocab_size: must be >= 0");
  const int64_t token_bytes = o.dtype == TokenDType::kUint16 ? 2 : 4;
  const int fd = ::open(o.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, o.path, "open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, o.path, "stat");
  }
  const int64_t bytes = st.st_size;
  if (bytes % token_bytes != 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(o.path, ": ", bytes, " bytes is not a whole number of ",
                                            token_bytes, "-byte tokens (wrong dtype?)"));
  }
  const int64_t tokens = bytes / token_bytes;
  const int64_t window = o.seq_len + 1;
  if (tokens < window) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(o.path, ": ", tokens, " tokens, fewer than one window",
                                            " of seq_len + 1 = ", window));
  }
  auto map = std::make_shared<Mapping>();
  map->path = o.path;
  void* p = mmap(nullptr, size_t(bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(err, o.path, "mmap");
  map->data = static_cast<const uint8_t*>(p);
  map->bytes = size_t(bytes);
  // Windows are read in a shuffled order: tell the kernel not to read ahead sequentially.
  madvise(p, size_t(bytes), MADV_RANDOM);
  // Identity: the path, size and modification time (a rewritten file is another data set).
  Fnv1a h;
  h.Mix(o.path.data(), o.path.size());
  h.Mix(&bytes, sizeof(bytes));
  h.Mix(&st.st_mtim, sizeof(st.st_mtim));
  h.Mix(&o.seq_len, sizeof(o.seq_len));
  TokenWindows out;
  out.tokens = tokens;
  out.dataset = std::make_shared<TokenFileDataset>(map, tokens / window, window, h.value);
  out.transform = std::make_shared<TokenWindowTransform>(map, o);
  return out;
}

}  // namespace feedline::text
