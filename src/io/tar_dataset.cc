#include "io/tar_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_io.h"
#include "xxhash.h"

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
      b - a >= kMaxExpandedNames) {
    return absl::InvalidArgumentError(
        absl::StrCat(pattern, ": bad brace range {", lo, "..", hi, "}"));
  }
  const size_t width = lo.size();
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> rest = ExpandBraces(pattern.substr(close + 1));
  if (!rest.ok()) return rest.status();
  // The product of the ranges is bounded, and so are the bytes it makes, before anything is
  // made (two ranges of 3,000 each made 9M names, 3.7 GB, in 30 s).
  const int64_t names = (b - a + 1) * int64_t(rest->size());  // each factor < kMaxExpandedNames
  size_t rest_bytes = 0;
  for (const std::string& r : *rest) rest_bytes += r.size() + sizeof(std::string);
  const double bytes = double(b - a + 1) * (double(rest_bytes) +
                                            double(rest->size()) * double(open + 24));
  if (names > kMaxExpandedNames || bytes > double(kMaxExpandedBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ShownName(pattern), ": the brace ranges make ", names, " names (at most ",
        kMaxExpandedNames, " and ", kMaxExpandedBytes >> 20, " MiB of them)"));
  }
  out.reserve(size_t(names));
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

namespace {

// The .cls members' text (at most 64 bytes each: a label), by member index.
using ClsText = std::unordered_map<size_t, std::string>;

absl::Status ReadClsTexts(int fd, const std::vector<TarMember>& members, const std::string& name,
                          ClsText* out) {
  for (size_t i = 0; i < members.size(); ++i) {
    const TarMember& m = members[i];
    if (SplitKey(m.name).second != "cls") continue;
    std::vector<uint8_t> text;
    absl::Status st = PreadAll(fd, m.offset, std::min<int64_t>(m.size, 64), &text,
                               absl::StrCat(name, ":", m.name));
    if (!st.ok()) return st;
    (*out)[i] = std::string(text.begin(), text.end());
  }
  return absl::OkStatus();
}

// Version 3: the entry records what it was made from and what it holds, so that the cache can
// verify it before (and while) serving it:
//   feedline-tar-catalog 3
//   source <the URL as shown: no user information, no query>
//   etag <the object's validator: its ETag, or "lm:" + its Last-Modified date; may be empty>
//   size <bytes of the whole shard>
//   <member count>
//   <offset> <size> <name length> <.cls length or -1> <XXH3-64 of the member's data, 16 hex>
//   <name><.cls text>
//   ...
//   sum <XXH3-64 of every byte above, 16 hex>
// Older versions (without content hashes) are not read: the shard is fetched again.
constexpr absl::string_view kCatalogMagic = "feedline-tar-catalog 3\n";

// XXH3-64 of bytes [offset, offset + size) of `fd`, read in 1 MiB pieces.
absl::StatusOr<uint64_t> HashRange(int fd, int64_t offset, int64_t size, const std::string& what) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<uint8_t> piece;
  absl::Status st;
  for (int64_t done = 0; done < size && st.ok();) {
    const int64_t n = std::min<int64_t>(size - done, int64_t{1} << 20);
    st = PreadAll(fd, offset + done, n, &piece, what);
    if (st.ok()) XXH3_64bits_update(state, piece.data(), piece.size());
    done += n;
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!st.ok()) return st;
  return h;
}

std::string Hex16(uint64_t v) { return absl::StrCat(absl::Hex(v, absl::kZeroPad16)); }

}  // namespace

absl::Status WriteTarCatalog(const std::string& shard, const std::string& shown,
                             const std::string& catalog, const std::string& etag) {
  absl::StatusOr<std::vector<TarMember>> members = IndexTar(shard);
  if (!members.ok()) return members.status();
  const int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(shard, ": ", std::strerror(errno)));
  struct stat st {};
  ClsText cls;
  absl::Status status = ::fstat(fd, &st) == 0
                            ? ReadClsTexts(fd, *members, shown, &cls)
                            : absl::DataLossError(absl::StrCat(shown, ": ", std::strerror(errno)));
  std::string out(kCatalogMagic);
  absl::StrAppend(&out, "source ", shown, "\netag ", etag, "\nsize ", int64_t(st.st_size), "\n",
                  members->size(), "\n");
  for (size_t i = 0; i < members->size() && status.ok(); ++i) {
    const TarMember& m = (*members)[i];
    absl::StatusOr<uint64_t> hash =
        HashRange(fd, m.offset, m.size, absl::StrCat(shown, ":", m.name));
    if (!hash.ok()) {
      status = hash.status();
      break;
    }
    auto it = cls.find(i);
    const std::string& text = it == cls.end() ? std::string() : it->second;
    absl::StrAppend(&out, m.offset, " ", m.size, " ", m.name.size(), " ",
                    it == cls.end() ? -1 : int64_t(text.size()), " ", Hex16(*hash), "\n", m.name,
                    text, "\n");
  }
  ::close(fd);
  if (!status.ok()) return status;
  absl::StrAppend(&out, "sum ", Hex16(XXH3_64bits(out.data(), out.size())), "\n");
  return WriteFileWhole(catalog, out);  // a reader never sees half a catalog
}

namespace {

absl::Status ReadTarCatalog(const std::string& catalog, std::vector<TarMember>* members,
                            ClsText* cls, TarCatalogSummary* header) {
  std::vector<uint8_t> raw;
  if (absl::Status s = ReadWholeFile(catalog, int64_t{1} << 32, &raw); !s.ok()) return s;
  absl::string_view all(reinterpret_cast<const char*>(raw.data()), raw.size());
  auto bad = [&catalog](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(catalog, ": damaged shard catalog (", why,
                                            "); remove it to index the shard again"));
  };
  if (!absl::StartsWith(all, kCatalogMagic)) return bad("no header of this version");
  // The checksum first: a catalog cut or changed anywhere is not read at all.
  const size_t sum_at = all.rfind("sum ");
  uint64_t sum = 0;
  if (sum_at == absl::string_view::npos || (sum_at > 0 && all[sum_at - 1] != '\n') ||
      all.size() != sum_at + 4 + 16 + 1 || all.back() != '\n' ||
      !absl::SimpleHexAtoi(all.substr(sum_at + 4, 16), &sum) ||
      XXH3_64bits(all.data(), sum_at) != sum) {
    return bad("checksum");
  }
  all = all.substr(0, sum_at);
  size_t pos = kCatalogMagic.size();
  auto line = [&](absl::string_view* out) {
    const size_t nl = all.find('\n', pos);
    if (nl == absl::string_view::npos) return false;
    *out = all.substr(pos, nl - pos);
    pos = nl + 1;
    return true;
  };
  absl::string_view l;
  *header = TarCatalogSummary();
  if (!line(&l) || !absl::ConsumePrefix(&l, "source ")) return bad("no source line");
  header->source = std::string(l);
  if (!line(&l) || !absl::ConsumePrefix(&l, "etag ")) return bad("no etag line");
  header->etag = std::string(l);
  int64_t bytes = 0;
  if (!line(&l) || !absl::ConsumePrefix(&l, "size ") || !absl::SimpleAtoi(l, &bytes) || bytes < 0) {
    return bad("no size line");
  }
  int64_t n = 0;
  if (!line(&l) || !absl::SimpleAtoi(l, &n) || n < 0) return bad("no member count");
  members->clear();
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0, size = 0, name_len = 0, cls_len = 0;
    uint64_t hash = 0;
    std::vector<absl::string_view> f;
    if (!line(&l)) return bad("truncated");
    f = absl::StrSplit(l, ' ');
    // Each length against what is left of the file, one at a time: their sum could wrap (a
    // name length near 2^64 passed a summed check and read past the end). Every member within
    // the shard's size.
    const uint64_t left = all.size() - pos;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &offset) || !absl::SimpleAtoi(f[1], &size) ||
        !absl::SimpleAtoi(f[2], &name_len) || !absl::SimpleAtoi(f[3], &cls_len) ||
        f[4].size() != 16 || !absl::SimpleHexAtoi(f[4], &hash) || offset < 0 || size < 0 ||
        offset > bytes || size > bytes - offset || name_len < 0 || cls_len < -1 ||
        uint64_t(name_len) >= left ||
        uint64_t(std::max<int64_t>(cls_len, 0)) >= left - uint64_t(name_len)) {
      return bad(absl::StrCat("member ", i));
    }
    members->push_back(
        TarMember{std::string(all.substr(pos, size_t(name_len))), offset, size, hash, true});
    pos += size_t(name_len);
    if (cls_len >= 0) {
      (*cls)[size_t(i)] = std::string(all.substr(pos, size_t(cls_len)));
      pos += size_t(cls_len);
    }
    if (all[pos] != '\n') return bad(absl::StrCat("member ", i));
    ++pos;
  }
  if (pos != all.size()) return bad("bytes after the last member");
  header->bytes = bytes;
  return absl::OkStatus();
}

}  // namespace

TarCatalogSummary SummarizeTarCatalog(const std::string& catalog) {
  std::vector<TarMember> members;
  ClsText cls;
  TarCatalogSummary s;
  if (!ReadTarCatalog(catalog, &members, &cls, &s).ok()) return TarCatalogSummary();
  return s;
}

absl::StatusOr<std::shared_ptr<TarDataset>> TarDataset::Open(
    const std::vector<std::string>& shards, const std::string& source, Mode mode,
    const std::vector<std::string>* shown) {
  std::vector<ShardSource> sources;
  for (size_t s = 0; s < shards.size(); ++s) {
    ShardSource src;
    src.path = shards[s];
    src.shown = shown != nullptr ? (*shown)[s] : shards[s];
    sources.push_back(std::move(src));
  }
  return Open(sources, source, mode, HttpOptions());
}

absl::StatusOr<std::shared_ptr<TarDataset>> TarDataset::Open(const std::vector<ShardSource>& shards,
                                                             const std::string& source, Mode mode,
                                                             const HttpOptions& http) {
  FileList files;
  files.kind = FileList::Kind::kShards;
  files.source = source.empty() && !shards.empty() ? shards.front().shown : source;
  std::vector<int> fds;
  std::vector<HttpOptions> shard_http;
  std::vector<Entry> entries;
  auto close_all = [&fds] {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  };
  for (size_t s = 0; s < shards.size(); ++s) {
    const ShardSource& src = shards[s];
    const std::string& name = src.shown;
    std::vector<TarMember> members;
    ClsText cls;
    TarCatalogSummary catalog;
    int fd = -1;
    if (!src.catalog.empty()) {  // a remote shard: its catalog (then read by range or from
                                 // its cached copy)
      if (absl::Status st = ReadTarCatalog(src.catalog, &members, &cls, &catalog); !st.ok()) {
        close_all();
        return st;
      }
    } else {  // a file on disk: indexed here
      absl::StatusOr<std::vector<TarMember>> m = IndexTar(src.path);
      if (!m.ok()) {
        close_all();
        return m.status();
      }
      members = *std::move(m);
    }
    if (!src.path.empty()) {
      fd = ::open(src.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        close_all();
        return absl::NotFoundError(absl::StrCat(src.path, ": ", std::strerror(errno)));
      }
      struct stat st {};
      if (!src.catalog.empty() && (::fstat(fd, &st) != 0 || int64_t(st.st_size) != catalog.bytes)) {
        ::close(fd);  // a cached copy of another size than catalogued: read by range instead
        fd = -1;
      } else if (src.catalog.empty()) {
        if (absl::Status st = ReadClsTexts(fd, members, name, &cls); !st.ok()) {
          ::close(fd);
          close_all();
          return st;
        }
      }
    }
    fds.push_back(fd);
    shard_http.push_back(http);
    shard_http.back().if_match = catalog.etag;  // range reads fail clearly if the object changed
    // Group by key, in order of first appearance.
    struct Group {
      std::vector<size_t> members;
      std::vector<std::string> exts;
      int image = -1;  // in members
      int cls = -1;    // member index in the shard
    };
    std::vector<std::string> order;
    std::unordered_map<std::string, Group> groups;
    for (size_t i = 0; i < members.size(); ++i) {
      auto [key, ext] = SplitKey(members[i].name);
      auto [it, inserted] = groups.try_emplace(key);
      if (inserted) order.push_back(key);
      Group& g = it->second;
      if (IsImageExt(ext)) g.image = int(g.members.size());
      if (ext == "cls") g.cls = int(i);
      g.members.push_back(i);
      g.exts.push_back(ext);
    }
    for (const std::string& key : order) {
      const Group& g = groups[key];
      if (mode == Mode::kImages && g.image < 0) continue;  // metadata only: skipped
      int64_t label = -1;
      if (g.cls >= 0) {
        const std::string& text = cls[size_t(g.cls)];
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &label) || label < 0) {
          close_all();
          return absl::InvalidArgumentError(absl::StrCat(name, ": ", members[size_t(g.cls)].name,
                                                         ": label is not a non-negative integer"));
        }
      } else if (mode == Mode::kImages) {
        close_all();
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": sample \"", key, "\" has an image but no .cls label"));
      }
      Entry e;
      e.shard = int(s);
      e.key = key;
      for (size_t i = 0; i < g.members.size(); ++i) {
        const TarMember& m = members[g.members[i]];
        e.members.push_back(Span{g.exts[i], m.offset, m.size, m.hash, m.hashed});
      }
      e.image = g.image;
      const std::string sample_name = g.image >= 0 ? members[g.members[size_t(g.image)]].name : key;
      files.samples.push_back(Sample{absl::StrCat(name, ":", sample_name), label});
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
  for (size_t s = 0; s < shards.size(); ++s) {
    const ShardSource& src = shards[s];
    const bool remote = !src.catalog.empty();
    d->shards_.push_back(src.shown);
    d->urls_.push_back(remote ? src.url : std::string());
    d->copies_.push_back(remote ? src.path : std::string());
    d->catalogs_.push_back(src.catalog);
    d->any_remote_ = d->any_remote_ || fds[s] < 0;
  }
  d->dropped_ = std::make_unique<std::atomic<bool>[]>(shards.size());
  d->fds_ = std::move(fds);
  d->entries_ = std::move(entries);
  d->http_ = std::move(shard_http);
  return d;
}

TarDataset::~TarDataset() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::pair<int64_t, int64_t> TarDataset::RangeOf(const Entry& e) const {
  if (mode_ == Mode::kImages) {
    const Span& m = e.members[size_t(e.image)];
    return {m.offset, m.offset + m.size};
  }
  int64_t lo = INT64_MAX, hi = 0;
  for (const Span& m : e.members) {
    lo = std::min(lo, m.offset);
    hi = std::max(hi, m.offset + m.size);
  }
  return {lo, hi};
}

void TarDataset::Slice(Mode mode, const Entry& e, int64_t base, const std::vector<uint8_t>& span,
                       Record* record) {
  if (mode == Mode::kImages) {
    const Span& m = e.members[size_t(e.image)];
    if (base == m.offset && int64_t(span.size()) == m.size) return;  // already the image
    record->bytes.assign(span.begin() + (m.offset - base),
                         span.begin() + (m.offset - base + m.size));
    return;
  }
  record->bytes.clear();
  record->members.resize(e.members.size());
  for (size_t i = 0; i < e.members.size(); ++i) {
    const Span& m = e.members[i];
    record->members[i].name = m.ext;
    record->members[i].bytes.assign(span.begin() + (m.offset - base),
                                    span.begin() + (m.offset - base + m.size));
    if (int(i) == e.image) record->bytes = record->members[i].bytes;
  }
}

bool TarDataset::Intact(Mode mode, const Entry& e, const Record& record, std::string* which) {
  auto same = [](const Span& m, const std::vector<uint8_t>& bytes) {
    return !m.hashed ||
           (int64_t(bytes.size()) == m.size && XXH3_64bits(bytes.data(), bytes.size()) == m.hash);
  };
  if (mode == Mode::kImages) {
    const Span& m = e.members[size_t(e.image)];
    if (same(m, record.bytes)) return true;
    *which = absl::StrCat(e.key, ".", m.ext);
    return false;
  }
  for (size_t i = 0; i < e.members.size() && i < record.members.size(); ++i) {
    if (!same(e.members[i], record.members[i].bytes)) {
      *which = absl::StrCat(e.key, ".", e.members[i].ext);
      return false;
    }
  }
  return true;
}

namespace {

// A member read by range differs from its catalog: the shard changed on the server (one that
// sends no validator, or changed it without a new one). The catalog (and a cached copy) goes,
// so that the next open fetches the shard again; this read fails, naming the member.
absl::Status ChangedShard(const std::string& shown, const std::string& which,
                          const std::string& catalog, const std::string& copy) {
  ::unlink(catalog.c_str());
  if (!copy.empty()) ::unlink(copy.c_str());
  return absl::DataLossError(
      absl::StrCat(shown, ":", ShownName(which),
                   ": the bytes read differ from the ones catalogued when the shard was "
                   "downloaded (it changed on the server since it was catalogued); the next "
                   "open fetches it again"));
}

}  // namespace

void TarDataset::DropCopy(int s) const {
  if (dropped_[size_t(s)].exchange(true)) return;
  // Never served again: removed (an open descriptor keeps reading the old bytes, so this one
  // stops using it), so that the next open fetches the shard again.
  ::unlink(copies_[size_t(s)].c_str());
  counters_->damaged_copies.fetch_add(1, std::memory_order_relaxed);
}

absl::Status TarDataset::TooLarge(const Entry& e) const {
  const auto [lo, hi] = RangeOf(e);
  const int64_t limit = http_[size_t(e.shard)].max_bytes;
  if (hi - lo <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(shards_[size_t(e.shard)], ":", ShownName(e.key),
                                                   ": a record of ", hi - lo, " bytes, above ",
                                                   limit, " (max_record_bytes)"));
}

absl::Status TarDataset::ReadByRange(const Entry& e, Record* record) const {
  const size_t s = size_t(e.shard);
  const auto [lo, hi] = RangeOf(e);
  record->members.clear();
  std::vector<uint8_t> members_span;
  std::vector<uint8_t>& span = mode_ == Mode::kImages ? record->bytes : members_span;
  span.clear();
  if (hi > lo) {  // else nothing to fetch (empty members)
    absl::Status st = HttpFetch(urls_[s], lo, hi - lo, http_[s], &span, counters_.get());
    if (!st.ok()) return st;
  }
  Slice(mode_, e, lo, span, record);
  std::string which;
  if (!Intact(mode_, e, *record, &which)) {
    return ChangedShard(shards_[s], which, catalogs_[s], copies_[s]);
  }
  return absl::OkStatus();
}

absl::Status TarDataset::Read(int64_t index, Record* record) const {
  const Entry& e = entries_[size_t(index)];
  const size_t s = size_t(e.shard);
  const int fd = fds_[s];
  record->label = files_.samples[size_t(index)].label;
  if (absl::Status st = TooLarge(e); !st.ok()) return st;
  // A remote shard without a copy (or whose copy was damaged): one range request for the
  // entry's members.
  if (fd < 0 || dropped_[s].load(std::memory_order_relaxed)) return ReadByRange(e, record);
  absl::Status read;
  if (mode_ == Mode::kImages) {
    // The image built-in needs the image only (the label was read once, at Open).
    record->members.clear();
    const Span& m = e.members[size_t(e.image)];
    read = PreadAll(fd, m.offset, m.size, &record->bytes, Describe(index));
  } else {
    record->bytes.clear();
    record->members.resize(e.members.size());
    for (size_t i = 0; i < e.members.size() && read.ok(); ++i) {
      const Span& m = e.members[i];
      record->members[i].name = m.ext;
      read = PreadAll(fd, m.offset, m.size, &record->members[i].bytes,
                      absl::StrCat(shards_[s], ":", e.key, ".", m.ext));
      if (int(i) == e.image) record->bytes = record->members[i].bytes;
    }
  }
  if (copies_[s].empty()) return read;
  std::string which;
  if (read.ok() && Intact(mode_, e, *record, &which)) return absl::OkStatus();
  DropCopy(int(s));  // a cached copy cut or not what was catalogued: from the source instead
  return ReadByRange(e, record);
}

void TarDataset::ReadAsync(int64_t index, Record* record,
                           std::function<void(absl::Status)> done) const {
  const Entry& e = entries_[size_t(index)];
  const size_t s = size_t(e.shard);
  if (fds_[s] >= 0 && !dropped_[s].load(std::memory_order_relaxed)) {
    return done(Read(index, record));
  }
  record->label = files_.samples[size_t(index)].label;
  record->members.clear();
  if (absl::Status st = TooLarge(e); !st.ok()) return done(st);
  const auto [lo, hi] = RangeOf(e);
  if (hi == lo) {           // nothing to fetch (empty members)
    record->bytes.clear();  // Slice leaves an image's bytes that are already in place
    Slice(mode_, e, lo, {}, record);
    return done(absl::OkStatus());
  }
  // The callback may run after this data set is gone (a loader stopped mid-read): it keeps
  // what it needs, and checks the bytes against the catalog.
  auto check = [mode = mode_, e, shown = shards_[s], catalog = catalogs_[s], copy = copies_[s],
                record](absl::Status st) {
    std::string which;
    if (st.ok() && !Intact(mode, e, *record, &which)) {
      return ChangedShard(shown, which, catalog, copy);
    }
    return st;
  };
  if (mode_ == Mode::kImages) {  // straight into the record
    return HttpFetchAsync(urls_[s], lo, hi - lo, http_[s], &record->bytes, counters_,
                          [check = std::move(check), done = std::move(done)](absl::Status st) {
                            done(check(std::move(st)));
                          });
  }
  auto span = std::make_shared<std::vector<uint8_t>>();
  HttpFetchAsync(urls_[s], lo, hi - lo, http_[s], span.get(), counters_,
                 [mode = mode_, e, lo = lo, span, record, check = std::move(check),
                  done = std::move(done)](absl::Status st) {
                   if (st.ok()) Slice(mode, e, lo, *span, record);
                   done(check(std::move(st)));
                 });
}

RemoteStats TarDataset::remote_stats() const {
  return any_remote_ || counters_->damaged_copies.load(std::memory_order_relaxed) > 0
             ? ToRemoteStats(*counters_)
             : RemoteStats{};
}

}  // namespace feedline
