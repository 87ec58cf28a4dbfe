#include "io/file_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "io/tar_dataset.h"

namespace feedline {
namespace {

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

}  // namespace

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

absl::Status LocalFileDataset::Read(int64_t index, Record* record) const {
  const Sample& sample = files_.samples[size_t(index)];
  record->label = sample.label;
  record->members.clear();
  return ReadWholeFile(sample.path, max_file_bytes_, &record->bytes);
}

// ---------------------------------------------------------------------------------------------
// FileDataset (include/feedline/dataset.h)

FileDataset::FileDataset(FileList files)
    : files_(std::move(files)), fingerprint_(files_.Fingerprint()) {}

std::string FileDataset::Describe(int64_t index) const {
  return files_.samples[size_t(index)].path;
}

absl::StatusOr<std::shared_ptr<FileDataset>> FileDataset::Open(
    const std::string& source, const std::vector<std::string>& shards) {
  if (!shards.empty() || LooksLikeShards(source)) {
    std::vector<std::string> paths = shards;
    if (paths.empty()) {
      absl::StatusOr<std::vector<std::string>> expanded = ExpandBraces(source);
      if (!expanded.ok()) return expanded.status();
      paths = *std::move(expanded);
    }
    absl::StatusOr<std::shared_ptr<TarDataset>> tar =
        TarDataset::Open(paths, source, TarDataset::Mode::kImages);
    if (!tar.ok()) return tar.status();
    return std::shared_ptr<FileDataset>(*std::move(tar));
  }
  absl::StatusOr<FileList> files = ScanFileList(source);
  if (!files.ok()) return files.status();
  return std::shared_ptr<FileDataset>(std::make_shared<LocalFileDataset>(*std::move(files)));
}

absl::StatusOr<std::shared_ptr<FileDataset>> OpenWebDataset(
    const std::string& source, const std::vector<std::string>& shards) {
  std::vector<std::string> paths = shards;
  if (paths.empty()) {
    absl::StatusOr<std::vector<std::string>> expanded = ExpandBraces(source);
    if (!expanded.ok()) return expanded.status();
    paths = *std::move(expanded);
  }
  absl::StatusOr<std::shared_ptr<TarDataset>> tar =
      TarDataset::Open(paths, source, TarDataset::Mode::kMembers);
  if (!tar.ok()) return tar.status();
  return std::shared_ptr<FileDataset>(*std::move(tar));
}

}  // namespace feedline
