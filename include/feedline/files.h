// feedline — io's built-in data sets: files with labels (an ImageFolder directory, a list file
// of "path label" lines, WebDataset tar shards, each local or over HTTP / S3) and local copies
// of files named by URLs. They implement the Dataset seam of dataset.h; their code is in src/io
// (the feedline::io library: libcurl).
//
// Thread safety: as dataset.h's: a data set is immutable after Open; Read from any number of
// threads.
#ifndef FEEDLINE_FILES_H_
#define FEEDLINE_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/dataset.h"
#include "feedline/options.h"

namespace feedline {

// A file named by a path or a URL, as a local path: an http(s):// or s3:// URL is downloaded
// once into feedline's cache (the shard cache's folder and byte budget: $FEEDLINE_CACHE_DIR,
// $FEEDLINE_SHARD_CACHE_BYTES) with retries, a stalled transfer failing after
// `read_timeout_ms`; a later call finds it there, after one HEAD request: a copy whose object
// changed on the server since (another ETag) is fetched again, and a server that does not
// answer leaves the copy as it is (it opens offline). Other paths are returned as they are. For
// sources that are read whole or memory-mapped: text files, token files and their indexes,
// tokenizer models. Errors name the URL (kNotFound for a 404, ...).
absl::StatusOr<std::string> LocalCopy(const std::string& path_or_url,
                                      double read_timeout_ms = 60000);
// The same for files opened together (a token file and its index): none of them is removed to
// make room for another.
absl::StatusOr<std::vector<std::string>> LocalCopies(const std::vector<std::string>& paths,
                                                     double read_timeout_ms = 60000);

// ---------------------------------------------------------------------------------------------
// Files with labels: ImageFolder, list files, WebDataset shards.

struct Sample {
  std::string path;  // as torchvision would give it: the source joined with the relative path
  int64_t label = 0;
};

// The scanned sample list of a file data set. Its `classes` are sorted, its `samples` are
// (path, class index) ordered as torchvision's `ImageFolder` (or the list file) orders them,
// so that sample indices mean the same thing in both.
struct FileList {
  enum class Kind { kImageFolder, kListFile, kShards };
  Kind kind = Kind::kImageFolder;
  std::string source;
  std::vector<std::string> classes;  // ImageFolder: sorted class folder names; else empty
  std::vector<Sample> samples;
  // A hash of the samples (paths and labels).
  uint64_t Fingerprint() const;
};

// The file name extensions that torchvision's ImageFolder accepts (compared case-insensitively).
const std::vector<std::string>& ImageExtensions();

// Scans `source`: a directory is an ImageFolder; a regular file is a list file of
// "path label" lines (blank lines and lines starting with '#' are ignored; a path may contain
// spaces: the label is the last field). Errors: kNotFound (no such source), kInvalidArgument
// (an empty data set, a class without images, a malformed list line: file and line named).
// `extensions` (lowercase, with the dot) are the files an ImageFolder-like folder holds.
absl::StatusOr<FileList> ScanFileList(
    const std::string& source, const std::vector<std::string>& extensions = ImageExtensions());

// How a data set's reads are bounded (the loader's read_timeout_ms, max_record_bytes and
// memory_budget options: ReadLimitsOf).
struct ReadLimits {
  double read_timeout_ms = 60000;                 // each read, retries included; 0: none
  int64_t max_record_bytes = int64_t{256} << 20;  // one record (a file, a body, a member)
  // The bodies of the remote reads in flight together; 0: half of a quarter of the available
  // memory (half the automatic memory budget).
  int64_t in_flight_bytes = 0;
};
inline ReadLimits ReadLimitsOf(const LoaderOptions& o) {
  return ReadLimits{o.read_timeout_ms(), o.max_record_bytes(), o.memory_budget() / 2};
}

// A data set of labelled files. Records: `bytes` = the file's contents, `label` = its class;
// for WebDataset shards also every member of the key in `members` (by extension).
// Thread safety: immutable after Open; Read from any number of threads.
class FileDataset : public Dataset {
 public:
  // `source`: an ImageFolder directory, a list file, or shards (a path ending in ".tar" or a
  // brace pattern such as "d/train-{000000..000099}.tar"); `shards`, when not empty, takes
  // precedence. Errors as ScanFileList, and kDataLoss for a malformed shard (file and offset).
  // A list file may name http:// and https:// URLs (or be one itself: its relative paths are
  // then relative to its URL); they are fetched with retries within the read timeout (see
  // src/io/http.h), an HTTP 404 is the sample's kNotFound naming the URL. A record above
  // `limits.max_record_bytes` is the sample's kResourceExhausted naming it. A folder's files
  // are those with one of `extensions` (ScanFileList).
  static absl::StatusOr<std::shared_ptr<FileDataset>> Open(
      const std::string& source, const std::vector<std::string>& shards = {},
      const ReadLimits& limits = {},
      const std::vector<std::string>& extensions = ImageExtensions());

  const FileList& files() const noexcept { return files_; }
  int64_t size() const override { return int64_t(files_.samples.size()); }
  std::string Describe(int64_t index) const override;
  uint64_t Fingerprint() const override { return fingerprint_; }

 protected:
  explicit FileDataset(FileList files);
  FileList files_;
  uint64_t fingerprint_;
};

// True when `source` names WebDataset shards (a brace pattern or a path ending in ".tar").
bool LooksLikeShards(const std::string& source);

// WebDataset shards with named members: a sample is a key and all of its members
// (`record.members`, named by extension, in shard order: "jpg", "cls", "json", "txt", "npy",
// ...); `record.label` is the `.cls` member's integer when the key has one, else -1;
// `record.bytes` is the image member's bytes when there is one. `source` is a ".tar" path or a
// brace pattern ("d/train-{000000..000099}.tar"); `shards`, when given, takes precedence. URLs
// go through the shard cache as ImageLoader's shards do; the read timeout bounds each read
// (and a server that never answers fails the open within ~2 of them).
absl::StatusOr<std::shared_ptr<FileDataset>> OpenWebDataset(
    const std::string& source, const std::vector<std::string>& shards = {},
    const ReadLimits& limits = {});

}  // namespace feedline

#endif  // FEEDLINE_FILES_H_
