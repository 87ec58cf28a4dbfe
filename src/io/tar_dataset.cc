#include "io/tar_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace feedline {
namespace {

constexpr int64_t kBlock = 512;

absl::Status Malformed(const std::string& name, int64_t offset, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(name, ": malformed tar at offset ", offset, ": ", why));
}

// Numeric header field: octal text, or GNU base-256 (high bit set) for large values.
bool ParseNumber(const uint8_t* field, size_t len, int64_t* out) {
  if (len > 0 && (field[0] & 0x80)) {
    uint64_t v = field[0] & 0x7F;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 55) return false;
      v = (v << 8) | field[i];
    }
    *out = int64_t(v);
    return true;
  }
  int64_t v = 0;
  size_t i = 0;
  while (i < len && (field[i] == ' ' || field[i] == 0)) ++i;
  bool any = false;
  for (; i < len && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v > (int64_t{1} << 58)) return false;
    v = v * 8 + (field[i] - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (field[i] != ' ' && field[i] != 0) return false;
  }
  *out = any ? v : 0;
  return true;
}

std::string FieldString(const uint8_t* field, size_t len) {
  size_t n = 0;
  while (n < len && field[n] != 0) ++n;
  return std::string(reinterpret_cast<const char*>(field), n);
}

bool ChecksumOk(const uint8_t* h) {
  int64_t stored = 0;
  if (!ParseNumber(h + 148, 8, &stored)) return false;
  int64_t sum = 0;
  for (int i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return sum == stored;
}

// Reads `len` bytes at `offset` of a buffer or a file (the indexer works on either).
struct Input {
  const uint8_t* data = nullptr;  // whole buffer, or null for a file
  int fd = -1;
  int64_t size = 0;
  std::vector<uint8_t> scratch;
  const uint8_t* At(int64_t offset, int64_t len) {
    if (offset < 0 || len < 0 || offset + len > size) return nullptr;
    if (data != nullptr) return data + offset;
    scratch.resize(size_t(len));
    int64_t done = 0;
    while (done < len) {
      ssize_t n = ::pread(fd, scratch.data() + done, size_t(len - done), off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return nullptr;
      done += n;
    }
    return scratch.data();
  }
};

absl::StatusOr<std::vector<TarMember>> IndexInput(Input& in, const std::string& name) {
  std::vector<TarMember> members;
  std::string long_name;  // from a GNU 'L' record or a pax 'path', for the next member
  int64_t offset = 0;
  while (true) {
    if (offset + kBlock > in.size) {
      if (offset == in.size) break;  // no end-of-archive blocks: tolerated (some writers)
      return Malformed(name, offset, "truncated header");
    }
    const uint8_t* h = in.At(offset, kBlock);
    if (h == nullptr)
      return absl::DataLossError(absl::StrCat(name, ": read error at offset ", offset));
    bool zero = true;
    for (int i = 0; i < kBlock && zero; ++i) zero = h[i] == 0;
    if (zero) break;  // end of archive
    if (!ChecksumOk(h)) return Malformed(name, offset, "header checksum mismatch");
    int64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size) || size < 0) {
      return Malformed(name, offset, "bad member size field");
    }
    const char type = char(h[156]);
    const int64_t data_offset = offset + kBlock;
    if (data_offset + size > in.size) {
      return Malformed(
          name, offset,
          absl::StrCat("member of ", size, " bytes runs past the end (", in.size, " bytes)"));
    }
    std::string member_name = FieldString(h, 100);
    if (std::memcmp(h + 257, "ustar", 5) == 0) {
      const std::string prefix = FieldString(h + 345, 155);
      if (!prefix.empty()) member_name = prefix + "/" + member_name;
    }
    if (type == 'L') {  // GNU long name: the next member's name is this record's data
      const uint8_t* d = in.At(data_offset, std::min<int64_t>(size, 1 << 16));
      if (d == nullptr) return Malformed(name, offset, "unreadable long name");
      long_name = FieldString(d, size_t(std::min<int64_t>(size, 1 << 16)));
    } else if (type == 'x') {  // pax extended header: "len key=value\n" records
      const uint8_t* d = in.At(data_offset, std::min<int64_t>(size, 1 << 16));
      if (d == nullptr) return Malformed(name, offset, "unreadable pax header");
      std::string records(reinterpret_cast<const char*>(d),
                          size_t(std::min<int64_t>(size, 1 << 16)));
      size_t pos = 0;
      while (pos < records.size()) {
        size_t sp = records.find(' ', pos);
        int64_t len = 0;
        if (sp == std::string::npos ||
            !absl::SimpleAtoi(absl::string_view(records).substr(pos, sp - pos), &len) || len <= 0 ||
            pos + size_t(len) > records.size()) {
          break;
        }
        std::string kv = records.substr(sp + 1, size_t(len) - (sp + 1 - pos) - 1);
        if (absl::StartsWith(kv, "path=")) long_name = kv.substr(5);
        pos += size_t(len);
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      if (!long_name.empty()) member_name = std::move(long_name);
      long_name.clear();
      members.push_back(TarMember{std::move(member_name), data_offset, size});
    } else {
      long_name.clear();  // directories, links, global headers: skipped
    }
    offset = data_offset + (size + kBlock - 1) / kBlock * kBlock;
  }
  return members;
}

// WebDataset's split of a member name into (key, extension): the extension starts at the
// first dot of the last path component.
std::pair<std::string, std::string> SplitKey(const std::string& name) {
  size_t slash = name.rfind('/');
  size_t start = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = name.find('.', start);
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), absl::AsciiStrToLower(name.substr(dot + 1))};
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern) {
  size_t open = pattern.find('{');
  if (open == std::string::npos) return std::vector<std::string>{pattern};
  size_t close = pattern.find('}', open);
  size_t dots = pattern.find("..", open);
  if (close == std::string::npos || dots == std::string::npos || dots > close) {
    return absl::InvalidArgumentError(
        absl::StrCat(pattern, ": expected a brace range such as {000000..000099}"));
  }
  const std::string lo = pattern.substr(open + 1, dots - open - 1);
  const std::string hi = pattern.substr(dots + 2, close - dots - 2);
  int64_t a = 0, b = 0;
  if (!absl::SimpleAtoi(lo, &a) || !absl::SimpleAtoi(hi, &b) || a < 0 || b < a ||
      b - a > 10'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat(pattern, ": bad brace range {", lo, "..", hi, "}"));
  }
  const size_t width = lo.size();
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> rest = ExpandBraces(pattern.substr(close + 1));
  if (!rest.ok()) return rest.status();
  for (int64_t i = a; i <= b; ++i) {
    std::string num = std::to_string(i);
    if (num.size() < width) num.insert(0, width - num.size(), '0');
    for (const std::string& r : *rest) out.push_back(pattern.substr(0, open) + num + r);
  }
  return out;
}

bool LooksLikeShards(const std::string& source) {
  return source.find('{') != std::string::npos || absl::EndsWith(source, ".tar");
}

absl::StatusOr<std::vector<TarMember>> IndexTarBytes(const uint8_t* data, size_t size,
                                                     const std::string& name) {
  Input in;
  in.data = data;
  in.size = int64_t(size);
  return IndexInput(in, name);
}

absl::StatusOr<std::vector<TarMember>> IndexTar(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat(path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  fstat(fd, &st);
  Input in;
  in.fd = fd;
  in.size = st.st_size;
  auto result = IndexInput(in, path);
  ::close(fd);
  return result;
}

namespace {

absl::Status PreadAll(int fd, int64_t offset, int64_t size, std::vector<uint8_t>* out,
                      const std::string& what) {
  out->resize(size_t(size));
  int64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out->data() + done, size_t(size - done), off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(what, ": read: ", std::strerror(errno)));
    if (n == 0) return absl::DataLossError(absl::StrCat(what, ": shard shrank while being read"));
    done += n;
  }
  return absl::OkStatus();
}

// The member extensions that hold a sample's image (the decoder tells the format by content).
bool IsImageExt(const std::string& ext) {
  static const char* const kImage[] = {"jpg", "jpeg", "png", "webp", "bmp",  "ppm",
                                       "pgm", "pbm",  "pnm", "tif",  "tiff", "gif"};
  for (const char* e : kImage) {
    if (ext == e) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TarDataset>> TarDataset::Open(
    const std::vector<std::string>& shards, const std::string& source, Mode mode,
    const std::vector<std::string>* shown) {
  const std::vector<std::string>& names = shown != nullptr ? *shown : shards;
  FileList files;
  files.kind = FileList::Kind::kShards;
  files.source = source.empty() && !shards.empty() ? shards.front() : source;
  std::vector<std::string> paths;
  std::vector<int> fds;
  std::vector<Entry> entries;
  auto close_all = [&fds] {
    for (int fd : fds) ::close(fd);
  };
  for (size_t s = 0; s < shards.size(); ++s) {
    absl::StatusOr<std::vector<TarMember>> members = IndexTar(shards[s]);
    if (!members.ok()) {
      close_all();
      return members.status();
    }
    int fd = ::open(shards[s].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      close_all();
      return absl::NotFoundError(absl::StrCat(shards[s], ": ", std::strerror(errno)));
    }
    paths.push_back(shards[s]);
    fds.push_back(fd);
    // Group by key, in order of first appearance.
    struct Group {
      std::vector<const TarMember*> members;
      std::vector<std::string> exts;
      const TarMember* image = nullptr;
      const TarMember* cls = nullptr;
    };
    std::vector<std::string> order;
    std::unordered_map<std::string, Group> groups;
    for (const TarMember& m : *members) {
      auto [key, ext] = SplitKey(m.name);
      auto [it, inserted] = groups.try_emplace(key);
      if (inserted) order.push_back(key);
      it->second.members.push_back(&m);
      it->second.exts.push_back(ext);
      if (IsImageExt(ext)) it->second.image = &m;
      if (ext == "cls") it->second.cls = &m;
    }
    for (const std::string& key : order) {
      const Group& g = groups[key];
      if (mode == Mode::kImages && g.image == nullptr) continue;  // metadata only: skipped
      int64_t label = -1;
      if (g.cls != nullptr) {
        std::vector<uint8_t> text;
        absl::Status st = PreadAll(fd, g.cls->offset, std::min<int64_t>(g.cls->size, 64), &text,
                                   absl::StrCat(names[s], ":", g.cls->name));
        absl::string_view sv(reinterpret_cast<const char*>(text.data()), text.size());
        if (st.ok() && (!absl::SimpleAtoi(absl::StripAsciiWhitespace(sv), &label) || label < 0)) {
          st = absl::InvalidArgumentError(
              absl::StrCat(names[s], ": ", g.cls->name, ": label is not a non-negative integer"));
        }
        if (!st.ok()) {
          close_all();
          return st;
        }
      } else if (mode == Mode::kImages) {
        close_all();
        return absl::InvalidArgumentError(
            absl::StrCat(names[s], ": sample \"", key, "\" has an image but no .cls label"));
      }
      Entry e;
      e.shard = int(s);
      e.key = key;
      for (size_t i = 0; i < g.members.size(); ++i) {
        e.members.push_back(Span{g.exts[i], g.members[i]->offset, g.members[i]->size});
        if (g.members[i] == g.image) e.image = int(i);
      }
      const std::string name = g.image != nullptr ? g.image->name : key;
      files.samples.push_back(Sample{absl::StrCat(names[s], ":", name), label});
      entries.push_back(std::move(e));
    }
  }
  if (files.samples.empty()) {
    close_all();
    return absl::InvalidArgumentError(
        absl::StrCat(files.source, mode == Mode::kImages
                                       ? ": the shards hold no samples with an image and a .cls"
                                       : ": the shards hold no samples"));
  }
  std::shared_ptr<TarDataset> d(new TarDataset(std::move(files), mode));
  d->shards_ = std::move(paths);
  d->fds_ = std::move(fds);
  d->entries_ = std::move(entries);
  return d;
}

TarDataset::~TarDataset() {
  for (int fd : fds_) ::close(fd);
}

absl::Status TarDataset::Read(int64_t index, Record* record) const {
  const Entry& e = entries_[size_t(index)];
  const int fd = fds_[size_t(e.shard)];
  record->label = files_.samples[size_t(index)].label;
  if (mode_ == Mode::kImages) {
    // The image built-in needs the image only (the label was read once, at Open).
    record->members.clear();
    const Span& m = e.members[size_t(e.image)];
    return PreadAll(fd, m.offset, m.size, &record->bytes, Describe(index));
  }
  record->bytes.clear();
  record->members.resize(e.members.size());
  for (size_t i = 0; i < e.members.size(); ++i) {
    const Span& m = e.members[i];
    record->members[i].name = m.ext;
    absl::Status st = PreadAll(fd, m.offset, m.size, &record->members[i].bytes,
                               absl::StrCat(shards_[size_t(e.shard)], ":", e.key, ".", m.ext));
    if (!st.ok()) return st;
    if (int(i) == e.image) record->bytes = record->members[i].bytes;
  }
  return absl::OkStatus();
}

}  // namespace feedline
