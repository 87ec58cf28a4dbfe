#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace feedline {

absl::Status ErrnoStatus(int err, const std::string& path, absl::string_view what) {
  std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EIO:
      return absl::DataLossError(msg);
    case EISDIR:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

absl::Status ReadWholeFile(const std::string& path, int64_t max_bytes,
                           std::vector<uint8_t>* bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path, "open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, path, "stat");
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return ErrnoStatus(EISDIR, path, "read");
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": file of ", st.st_size, " bytes exceeds the limit of ", max_bytes));
  }
  // Read one byte past the size that stat reported: a file that grew is read whole; one that
  // shrank is detected.
  const size_t expected = static_cast<size_t>(st.st_size);
  bytes->resize(expected + 1);
  size_t done = 0;
  while (done < bytes->size()) {
    ssize_t n = ::pread(fd, bytes->data() + done, bytes->size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, path, "read");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
    if (done == bytes->size() && static_cast<int64_t>(done) < max_bytes) {
      bytes->resize(bytes->size() * 2);  // the file grew while we read it
    }
  }
  ::close(fd);
  if (done < expected) {
    return absl::DataLossError(
        absl::StrCat(path, ": file shrank while being read (", done, " of ", expected, " bytes)"));
  }
  bytes->resize(done);
  return absl::OkStatus();
}

absl::Status WriteFileWhole(const std::string& path, absl::string_view bytes) {
  static std::atomic<uint64_t> serial{0};
  const std::string part = absl::StrCat(path, ".", ::getpid(), "-", serial++, ".part");
  {
    std::FILE* f = std::fopen(part.c_str(), "wb");
    if (f == nullptr) {
      return absl::PermissionDeniedError(absl::StrCat(part, ": ", std::strerror(errno)));
    }
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok) {
      ::unlink(part.c_str());
      return absl::DataLossError(absl::StrCat(part, ": cannot write"));
    }
  }
  if (::rename(part.c_str(), path.c_str()) != 0) {
    ::unlink(part.c_str());
    return absl::DataLossError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace feedline
