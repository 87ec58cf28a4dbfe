// WebDataset tar shards: samples grouped by key inside POSIX tar files.
//
// A shard holds members `key.ext`; a sample is a key with an image (`jpg`, `jpeg` or `png`) and
// a label (`cls`: the integer as text). Sample index = position in shard order (shards in the
// order given, samples in the order their first member appears). Each shard is indexed once,
// by walking its 512-byte headers (ustar, GNU long names, pax path records); reads are then
// single `pread`s of the member's byte range on a descriptor kept open per shard.
//
// Thread safety: after `Open`, `Read` may be called from any number of threads.
#ifndef FEEDLINE_SRC_IO_TAR_SOURCE_H_
#define FEEDLINE_SRC_IO_TAR_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/dataset.h"
#include "io/reader.h"

namespace feedline {

// Expands one brace range: "d/train-{000000..000009}.tar" -> 10 paths (zero padding kept).
// A pattern without braces is returned as is. kInvalidArgument for malformed ranges.
absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern);

// True when `source` names tar shards (a brace pattern or a path ending in ".tar").
bool LooksLikeShards(const std::string& source);

struct TarMember {
  std::string name;
  int64_t offset = 0;  // of the member's data in the file
  int64_t size = 0;
};

// Lists the members (regular files) of one tar file. kDataLoss names the file and the offset
// of a malformed header or a member that runs past the end.
absl::StatusOr<std::vector<TarMember>> IndexTar(const std::string& path);
// The same over a buffer (for the fuzzer).
absl::StatusOr<std::vector<TarMember>> IndexTarBytes(const uint8_t* data, size_t size,
                                                     const std::string& name);

class TarSource final : public SampleSource {
 public:
  // Indexes the shards; fills `dataset` (samples with "shard:key.ext" paths and labels).
  static absl::StatusOr<std::unique_ptr<TarSource>> Open(const std::vector<std::string>& shards,
                                                         Dataset* dataset);
  ~TarSource() override;
  int64_t size() const override { return int64_t(entries_.size()); }
  absl::Status Read(int64_t index, std::vector<uint8_t>* bytes) const override;
  std::string Describe(int64_t index) const override;

 private:
  struct Entry {
    int shard;
    int64_t offset, size;
    std::string name;
  };
  TarSource() = default;
  std::vector<std::string> shards_;
  std::vector<int> fds_;
  std::vector<Entry> entries_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_TAR_SOURCE_H_
