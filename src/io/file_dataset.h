// Local files as a data set: each sample is one file (its contents) with its class label.
//
// Reads are whole-file preads on a descriptor opened per call, so any number of reader threads
// may read at once; every error names the file and the cause.
#ifndef FEEDLINE_SRC_IO_FILE_DATASET_H_
#define FEEDLINE_SRC_IO_FILE_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "feedline/files.h"

namespace feedline {

// Errors: kNotFound, kPermissionDenied, kDataLoss (EIO, a file that shrank while being read),
// kResourceExhausted (a file above `max_file_bytes`).
class LocalFileDataset final : public FileDataset {
 public:
  explicit LocalFileDataset(FileList files, int64_t max_file_bytes = int64_t{1} << 30)
      : FileDataset(std::move(files)), max_file_bytes_(max_file_bytes) {}
  absl::Status Read(int64_t index, Record* record) const override;

 private:
  int64_t max_file_bytes_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_FILE_DATASET_H_
