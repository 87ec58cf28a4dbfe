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
#include "absl/strings/string_view.h"

namespace feedline {

// "<path>: <what>: <strerror>" with the canonical code for `err`.
absl::Status ErrnoStatus(int err, const std::string& path, absl::string_view what);

// Reads a whole file into `*bytes`: kResourceExhausted above `max_bytes`, kDataLoss when it
// shrinks while being read (one that grows is read whole).
absl::Status ReadWholeFile(const std::string& path, int64_t max_bytes, std::vector<uint8_t>* bytes);

// Writes `bytes` to `path` whole: under a name of its own ("<path>.<pid>-<n>.part", so that
// processes writing the same file at once do not mix), then renamed, so a reader never sees
// half a file. kPermissionDenied when the part cannot be created, kDataLoss when it cannot be
// written or renamed (the part is removed).
absl::Status WriteFileWhole(const std::string& path, absl::string_view bytes);

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_FILE_IO_H_
