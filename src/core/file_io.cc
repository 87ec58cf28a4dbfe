#include "core/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/redact.h"

namespace feedline {

absl::Status ErrnoStatus(int err, const std::string& path, absl::string_view what) {
  // Paths as messages show them (control characters escaped; see core/redact.h).
  std::string msg = absl::StrCat(ShownName(path), ": ", what, ": ", std::strerror(err));
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

int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
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
        absl::StrCat(ShownName(path), ": file of ", st.st_size, " bytes exceeds the limit of ", max_bytes));
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
        absl::StrCat(ShownName(path), ": file shrank while being read (", done, " of ", expected, " bytes)"));
  }
  bytes->resize(done);
  return absl::OkStatus();
}

absl::StatusOr<int> CreatePartFile(const std::string& path, std::string* part) {
  std::string name = path + ".XXXXXX.part";
  const int fd = ::mkostemps(name.data(), 5, O_CLOEXEC);  // O_CREAT | O_EXCL, mode 0600
  if (fd < 0) return ErrnoStatus(errno, path + ".*.part", "create");
  *part = std::move(name);
  return fd;
}

absl::Status CommitPartFile(int fd, const std::string& part, const std::string& path) {
  absl::Status s;
  if (::fsync(fd) != 0) s = ErrnoStatus(errno, part, "sync");
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus(errno, part, "close");
  if (s.ok() && ::rename(part.c_str(), path.c_str()) != 0) s = ErrnoStatus(errno, path, "rename");
  if (!s.ok()) ::unlink(part.c_str());
  return s;
}

absl::Status WriteFileWhole(const std::string& path, absl::string_view bytes) {
  std::string part;
  absl::StatusOr<int> fd = CreatePartFile(path, &part);
  if (!fd.ok()) return absl::PermissionDeniedError(fd.status().message());
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(*fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(*fd);
      ::unlink(part.c_str());
      return absl::DataLossError(absl::StrCat(part, ": cannot write: ", std::strerror(err)));
    }
    done += size_t(n);
  }
  absl::Status s = CommitPartFile(*fd, part, path);
  if (!s.ok()) return absl::DataLossError(s.message());
  return absl::OkStatus();
}

FileLock::FileLock(const std::string& file, Wait wait) {
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0) return;
  const int op = LOCK_EX | (wait == Wait::kTry ? LOCK_NB : 0);
  int r;
  while ((r = ::flock(fd_, op)) != 0 && errno == EINTR) {
  }
  if (r == 0) {
    held_ = true;
  } else if (errno == EWOULDBLOCK) {
    busy_ = true;
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

absl::Status EnsurePrivateDir(const std::string& dir) {
  // Missing parents first (mode 0700 for what is made here; existing ones are left alone).
  for (size_t slash = dir.find('/', 1); slash != std::string::npos;
       slash = dir.find('/', slash + 1)) {
    const std::string parent = dir.substr(0, slash);
    if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, parent, "create the directory");
    }
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, dir, "create the directory");
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, dir, "stat");
  auto refuse = [&dir](absl::string_view why) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, ": ", why, "; feedline keeps no files there (others could plant or cut them): set "
        "FEEDLINE_CACHE_DIR to a directory of your own"));
  };
  if (S_ISLNK(st.st_mode)) return refuse("a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("not a directory");
  if (st.st_uid != ::geteuid()) {
    return refuse(absl::StrCat("owned by uid ", st.st_uid, ", not by this user (uid ",
                               ::geteuid(), ")"));
  }
  if ((st.st_mode & S_IWOTH) != 0) return refuse("writable by others");
  return absl::OkStatus();
}

}  // namespace feedline
