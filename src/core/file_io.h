// Reading local files: a whole file into memory, and errno turned into a status that names
// the file (NotFound, PermissionDenied, DataLoss for EIO, ...); writing a small file whole.
//
// Thread safety: pure functions of their arguments; call them from any thread.
#ifndef FEEDLINE_SRC_CORE_FILE_IO_H_
#define FEEDLINE_SRC_CORE_FILE_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace feedline {

// "<path>: <what>: <strerror>" with the canonical code for `err`.
absl::Status ErrnoStatus(int err, const std::string& path, absl::string_view what);

// Reads a whole file into `*bytes`: kResourceExhausted above `max_bytes`, kDataLoss when it
// shrinks while being read (one that grows is read whole).
absl::Status ReadWholeFile(const std::string& path, int64_t max_bytes, std::vector<uint8_t>* bytes);

// The memory the machine has available now (MemAvailable), else its physical memory.
int64_t AvailableMemoryBytes();

// Writes `bytes` to `path` whole: into a part file of its own (CreatePartFile), synced, then
// renamed, so a reader never sees half a file, even after a crash. kPermissionDenied when the
// part cannot be created, kDataLoss when it cannot be written or renamed (the part is removed).
absl::Status WriteFileWhole(const std::string& path, absl::string_view bytes);

// A new file beside `path` to write before renaming it to `path`, as mkstemp makes one:
// "<path>.<random>.part", created exclusively (O_CREAT | O_EXCL: never an existing file, never
// through a symbolic link someone planted at a name they guessed), mode 0600. Returns the
// descriptor and sets *part; errors name the file.
absl::StatusOr<int> CreatePartFile(const std::string& path, std::string* part);
// Syncs and closes `fd` (the part file), then renames `part` to `path`; on any error the part
// is removed. A crash after the rename leaves the whole file, never a cut one.
absl::Status CommitPartFile(int fd, const std::string& part, const std::string& path);

// A directory feedline keeps files in that others could plant or cut: created (with its
// missing parents) with mode 0700 where it does not exist; refused with kPermissionDenied,
// naming it and why, when it is a symbolic link, not a directory, not owned by this user, or
// writable by others.
absl::Status EnsurePrivateDir(const std::string& dir);

// An exclusive lock between processes (flock on "<file>"), for work that one process of a node
// does for all (a shard's download: the ranks of a node share the cache). The kernel drops it
// when the holder dies, so a crash mid-work never leaves it held. Best effort: a lock file that
// cannot be made (a read-only folder) gives an object that holds nothing (held() false) and the
// caller goes on unlocked.
class FileLock {
 public:
  enum class Wait { kBlock, kTry };
  FileLock(const std::string& file, Wait wait);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return held_; }
  // kTry only: another process holds it (this one does not).
  bool busy() const { return busy_; }

 private:
  int fd_ = -1;
  bool held_ = false, busy_ = false;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_FILE_IO_H_
