// The reader stage's view of storage: sample index -> encoded bytes.
//
// A `SampleSource` turns a sample index into the bytes of its encoded image. Implementations
// must be safe to call from many reader threads at once (the file source only uses pread on a
// descriptor it opens per call), and must name the file and the cause in every error.
#ifndef FEEDLINE_SRC_IO_READER_H_
#define FEEDLINE_SRC_IO_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "feedline/dataset.h"

namespace feedline {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // Replaces `*bytes` with the sample's encoded bytes (its capacity is reused).
  virtual absl::Status Read(int64_t index, std::vector<uint8_t>* bytes) const = 0;
  // The file (or shard member) behind a sample, for error messages.
  virtual std::string Describe(int64_t index) const = 0;
};

// Reads whole files with pread. Errors: kNotFound, kPermissionDenied, kDataLoss (EIO, a file
// that shrank while being read), kResourceExhausted (a file above `max_file_bytes`).
class FileSource final : public SampleSource {
 public:
  explicit FileSource(const Dataset* dataset, int64_t max_file_bytes = int64_t{1} << 30)
      : dataset_(dataset), max_file_bytes_(max_file_bytes) {}
  int64_t size() const override { return static_cast<int64_t>(dataset_->samples.size()); }
  absl::Status Read(int64_t index, std::vector<uint8_t>* bytes) const override;
  std::string Describe(int64_t index) const override;

 private:
  const Dataset* dataset_;  // not owned; outlives the source
  int64_t max_file_bytes_;
};

// Adds a fixed latency to every read of another source (benchmarks: remote storage).
class SimulatedLatencySource final : public SampleSource {
 public:
  SimulatedLatencySource(std::unique_ptr<SampleSource> inner, double latency_ms)
      : inner_(std::move(inner)), latency_ms_(latency_ms) {}
  int64_t size() const override { return inner_->size(); }
  absl::Status Read(int64_t index, std::vector<uint8_t>* bytes) const override;
  std::string Describe(int64_t index) const override { return inner_->Describe(index); }

 private:
  std::unique_ptr<SampleSource> inner_;
  double latency_ms_;
};

// Reads a whole file into `*bytes`.
absl::Status ReadWholeFile(const std::string& path, int64_t max_bytes, std::vector<uint8_t>* bytes);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_READER_H_
