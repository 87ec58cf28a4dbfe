// WebDataset tar shards: samples grouped by key inside POSIX tar files.
//
// A shard holds members `key.ext`; a sample is a key and its members (named by extension: `jpg`,
// `cls`, `json`, `txt`, `npy`, ...). For the image built-in a sample is a key with an image
// (`jpg`, `jpeg` or `png`) and a label (`cls`: the integer as text). Sample index = position in
// shard order (shards in the order given, samples in the order their first member appears).
// Each shard is indexed once, by walking its 512-byte headers (ustar, GNU long names, pax path
// records); reads are then `pread`s of the members' byte ranges on a descriptor kept open per
// shard.
//
// Thread safety: after `Open`, `Read` may be called from any number of threads.
#ifndef FEEDLINE_SRC_IO_TAR_DATASET_H_
#define FEEDLINE_SRC_IO_TAR_DATASET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/files.h"
#include "io/file_dataset.h"
#include "io/http.h"

namespace feedline {

// Expands one brace range: "d/train-{000000..000009}.tar" -> 10 paths (zero padding kept).
// A pattern without braces is returned as is. kInvalidArgument for malformed ranges.
absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern);
// ExpandBraces' bounds on what all the ranges of a pattern make together (a million shards is
// beyond any data set's; the bytes bound a long pattern).
inline constexpr int64_t kMaxExpandedNames = 1'000'000;
inline constexpr int64_t kMaxExpandedBytes = int64_t{256} << 20;

struct TarMember {
  std::string name;
  int64_t offset = 0;  // of the member's data in the file
  int64_t size = 0;
  uint64_t hash = 0;  // XXH3-64 of the member's data, when `hashed` (from a catalog)
  bool hashed = false;
};

// Lists the members (regular files) of one tar file. kDataLoss names the file and the offset
// of a malformed header or a member that runs past the end.
absl::StatusOr<std::vector<TarMember>> IndexTar(const std::string& path);
// The same over a buffer (for the fuzzer).
absl::StatusOr<std::vector<TarMember>> IndexTarBytes(const uint8_t* data, size_t size,
                                                     const std::string& name);

// Where a shard's bytes are: a file on disk (`path`), or a URL read member by member with HTTP
// range requests (`path` empty), whose members and labels come from its `catalog` (written by
// WriteTarCatalog when the shard was downloaded once). A remote shard with a cached copy has
// all three: its members come from the catalog, and every read is checked against it.
struct ShardSource {
  std::string path;     // a local tar file (or a remote shard's cached copy); empty: by range
  std::string url;      // a remote shard's
  std::string catalog;  // a remote shard's
  std::string shown;    // names the shard in samples and messages (the URL of a remote one)
};

// Indexes the tar file `shard` and writes its catalog (whole or not at all): the shard's source
// (`shown`, which also names it in errors), its validator (`etag`: the object's ETag, or
// kModifiedPrefix + its Last-Modified date; empty when the server sent neither), its size, and
// its members with their .cls labels and a content hash (XXH3-64) of each member's data. The
// catalog carries a checksum of itself.
//
// Reads through a catalog are verified: a member whose bytes differ from its hash is a
// DataError (read by range: the shard changed on the server; the catalog is removed so that the
// next open fetches the shard again), or, from a cached copy, read by range instead (the copy
// is damaged: it is removed, never served). Range reads also ask for the catalogued version
// (If-Match, or If-Unmodified-Since), so that a changed shard fails before any byte is sliced.
absl::Status WriteTarCatalog(const std::string& shard, const std::string& shown,
                             const std::string& catalog, const std::string& etag = "");

// What the shard cache needs of a catalog: the source and validator it was written with, and
// the bytes of the whole shard. bytes = -1 (and the rest empty) when it is not a readable
// catalog of this version with an intact checksum.
struct TarCatalogSummary {
  std::string source;
  std::string etag;
  int64_t bytes = -1;
};
TarCatalogSummary SummarizeTarCatalog(const std::string& catalog);

class TarDataset final : public FileDataset {
 public:
  enum class Mode {
    kImages,   // the image built-in: keys with an image (jpg/jpeg/png) and a .cls label; a
               // record's bytes are the image (keys without an image are skipped)
    kMembers,  // every key; a record's members are all of the key's, by extension; label from
               // .cls when present (else -1); bytes = the image member when there is one
  };
  // Indexes the shards (`source` names the data set in errors; `shown`, when given, names each
  // shard in samples and messages instead of its path: a remote shard's URL for its local
  // copy). Errors: kDataLoss (a malformed shard: file and offset), kNotFound,
  // kInvalidArgument (a bad .cls, no samples).
  static absl::StatusOr<std::shared_ptr<TarDataset>> Open(
      const std::vector<std::string>& shards, const std::string& source, Mode mode,
      const std::vector<std::string>* shown = nullptr);
  // Shards from where they are (files, or URLs read by range); `http` for the URLs.
  static absl::StatusOr<std::shared_ptr<TarDataset>> Open(const std::vector<ShardSource>& shards,
                                                          const std::string& source, Mode mode,
                                                          const HttpOptions& http);
  ~TarDataset() override;
  absl::Status Read(int64_t index, Record* record) const override;
  // Shards read by range are fetched without a thread waiting for each read.
  bool async_reads() const override { return any_remote_; }
  void ReadAsync(int64_t index, Record* record,
                 std::function<void(absl::Status)> done) const override;
  RemoteStats remote_stats() const override;

 private:
  struct Span {
    std::string ext;
    int64_t offset = 0, size = 0;
    uint64_t hash = 0;  // of the member's data, when `hashed` (from the shard's catalog)
    bool hashed = false;
  };
  struct Entry {
    int shard = 0;
    std::string key;
    std::vector<Span> members;
    int image = -1;  // index in members
  };
  TarDataset(FileList files, Mode mode) : FileDataset(std::move(files)), mode_(mode) {}
  // The byte range [first, second) that holds what a read of entry `e` needs: the image
  // (kImages), or every member (members of a key are adjacent in a WebDataset shard: one range
  // request fetches them).
  std::pair<int64_t, int64_t> RangeOf(const Entry& e) const;
  // The record of entry `e` from `span`, the bytes of the shard from offset `base` on.
  static void Slice(Mode mode, const Entry& e, int64_t base, const std::vector<uint8_t>& span,
                    Record* record);
  // Whether the members a read of `e` returned in `record` have their catalogued hashes
  // (members without one pass); else the name of the first that does not.
  static bool Intact(Mode mode, const Entry& e, const Record& record, std::string* which);
  // kResourceExhausted naming `e` when its bytes are above the record limit (max_bytes).
  absl::Status TooLarge(const Entry& e) const;
  // A read of entry `e` by range from its shard's URL, verified against the catalog.
  absl::Status ReadByRange(const Entry& e, Record* record) const;
  // The cached copy of shard `s` returned other bytes than its catalog's: it is not read again
  // (removed; the next open fetches it again) and reads go by range.
  void DropCopy(int s) const;
  const Mode mode_;
  std::vector<std::string> shards_;  // as shown
  std::vector<std::string> urls_;    // per shard: the URL of a remote one, else empty
  std::vector<std::string> copies_;  // per shard: the cached copy of a remote one, else empty
  std::vector<std::string> catalogs_;  // per shard: the catalog of a remote one, else empty
  std::vector<int> fds_;               // per shard: -1 when read by range
  // Per shard: its cached copy was found damaged; reads go by range.
  std::unique_ptr<std::atomic<bool>[]> dropped_;
  std::vector<Entry> entries_;
  bool any_remote_ = false;
  std::vector<HttpOptions> http_;  // per shard (the If-Match ETag of one read by range)
  std::shared_ptr<HttpCounters> counters_ = std::make_shared<HttpCounters>();
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_TAR_DATASET_H_
