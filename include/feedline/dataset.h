// feedline — data sets: the read stage's seam, and the built-in file data sets.
//
// A `Dataset` turns a sample index into a `Record`: the bytes it stores (a file's contents, the
// members of a WebDataset key) and small metadata (a class label, and any typed metadata the
// data set and its transform agree on). What the bytes mean is the
// transform's business (see transform.h); a data set that computes its samples from the index
// may leave the record empty and let its transform do the work.
//
//   class Squares : public feedline::Dataset {            // a do-nothing read: all in the
//    public:                                              // transform
//     int64_t size() const override { return 1000; }
//     absl::Status Read(int64_t, feedline::Record*) const override { return absl::OkStatus(); }
//     uint64_t Fingerprint() const override { return 1000; }
//   };
//
// Contract: `size()` and `Fingerprint()` never change. `Read` is called by many reader threads
// at once, so it must be thread-safe (const and re-entrant); it replaces the record's contents
// (the record's buffers are reused across calls: assign, do not append). It returns an error
// naming the sample and the cause (kNotFound, kDataLoss, ...); an exception thrown from it is
// caught by the loader and becomes that sample's error too, never a crash. It may block (slow
// storage); the loader runs as many reads at once as the autotuner's I/O depth says, and fails a
// read that exceeds `read_timeout_ms`. A data set whose reads wait on a network can instead
// start them without blocking (`async_reads` / `ReadAsync`, below): then one reader thread
// keeps the I/O depth of reads in flight.
//
// The built-ins: `FileDataset::Open` (an ImageFolder directory, a list file of "path label"
// lines, or WebDataset tar shards). `DatasetWrapper` forwards every call to another data set:
// derive from it to inject latency or faults, or to add metadata.
#ifndef FEEDLINE_DATASET_H_
#define FEEDLINE_DATASET_H_

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace feedline {

// One sample as stored. Reused by the loader from sample to sample (capacities are kept).
struct Record {
  struct Member {
    std::string name;  // WebDataset: the member's extension ("jpg", "cls", "json", ...)
    std::vector<uint8_t> bytes;
  };
  std::vector<uint8_t> bytes;   // the sample's main payload (a file: its contents)
  int64_t label = -1;           // class index (a sub-folder, a list file's, a .cls); else -1
  std::vector<Member> members;  // named members (WebDataset keys); empty for single files
  // Anything else a data set tells its transform about the sample, of a type the two agree on
  // (a caption, boxes, a video's frame index): the transform reads it with
  // `std::any_cast<const T>(&record.meta)` (null when absent or of another type). The bytes
  // cache keeps a copy with the record: keep it small.
  std::any meta;

  // The member called `name`, or null.
  const std::vector<uint8_t>* member(std::string_view name) const;
  // Empties the record (keeping the capacity of `bytes`).
  void Clear();
};

// A remote data set's requests (HTTP / S3), for Stats and the bottleneck verdict.
struct RemoteStats {
  bool remote = false;
  int64_t requests = 0;   // attempts made, retries included
  int64_t retries = 0;    // attempts repeated after a transient failure
  int64_t failures = 0;   // reads that failed after their retries
  int64_t bytes = 0;      // fetched
  int64_t in_flight = 0;  // requests running now
  double request_ms = 0;  // mean latency of a successful request
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual absl::Status Read(int64_t index, Record* record) const = 0;
  // What names sample `index` in errors: a file, a shard member, or (default) "sample <index>".
  virtual std::string Describe(int64_t index) const;
  // A hash of the data set's identity (its files and labels, say): a saved loader state is
  // refused by a loader whose data set has another fingerprint.
  virtual uint64_t Fingerprint() const = 0;
  // True when Read only clears the record (the samples are computed by the transform from the
  // index): then there is no read stage, and the workers claim positions themselves — no
  // reader threads, no hand-off between stages. Default false.
  virtual bool empty_records() const { return false; }
  // True when Read never blocks: the bytes are already in memory (a file read whole at open,
  // say) and a read is a copy of a few hundred bytes. Then, as for empty records, the workers
  // read their samples themselves: a read stage would cost a hand-off between threads per
  // chunk of samples, more than the read. Default false; a wrapper does not forward it (its own
  // Read may wait).
  virtual bool in_memory() const { return false; }
  // What a data set that fetches over a network did so far (default: nothing remote). Called
  // from any thread while reads run.
  virtual RemoteStats remote_stats() const { return {}; }

  // Reads that do not hold a thread while they wait (network storage). When async_reads() is
  // true the read stage starts reads with ReadAsync and goes on: one reader thread keeps the
  // autotuner's I/O depth of reads in flight, instead of one blocked thread per read. ReadAsync
  // returns at once; `done` is called exactly once with the read's outcome, on any thread
  // (possibly before ReadAsync returns), and must not block; `record` is the data set's until
  // then. The read must end by itself within its own deadline (the watchdog that fails hung
  // blocking reads cannot abandon these). Default: false, and ReadAsync calls Read.
  virtual bool async_reads() const { return false; }
  virtual void ReadAsync(int64_t index, Record* record,
                         std::function<void(absl::Status)> done) const {
    done(Read(index, record));
  }
};

// Forwards every call to `target` (not owned unless given as a shared_ptr).
class DatasetWrapper : public Dataset {
 public:
  explicit DatasetWrapper(std::shared_ptr<const Dataset> target) : target_(std::move(target)) {}
  int64_t size() const override { return target_->size(); }
  absl::Status Read(int64_t index, Record* record) const override {
    return target_->Read(index, record);
  }
  std::string Describe(int64_t index) const override { return target_->Describe(index); }
  uint64_t Fingerprint() const override { return target_->Fingerprint(); }
  bool empty_records() const override { return target_->empty_records(); }
  RemoteStats remote_stats() const override { return target_->remote_stats(); }
  // async_reads() stays false: a wrapper's own Read (latency, faults) must see every read.
  const Dataset& target() const { return *target_; }

 private:
  std::shared_ptr<const Dataset> target_;
};

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
absl::StatusOr<FileList> ScanFileList(const std::string& source);

// A data set of labelled files. Records: `bytes` = the file's contents, `label` = its class;
// for WebDataset shards also every member of the key in `members` (by extension).
// Thread safety: immutable after Open; Read from any number of threads.
class FileDataset : public Dataset {
 public:
  // `source`: an ImageFolder directory, a list file, or shards (a path ending in ".tar" or a
  // brace pattern such as "d/train-{000000..000099}.tar"); `shards`, when not empty, takes
  // precedence. Errors as ScanFileList, and kDataLoss for a malformed shard (file and offset).
  // A list file may name http:// and https:// URLs (or be one itself: its relative paths are
  // then relative to its URL); they are fetched with retries within `read_timeout_ms` (see
  // src/io/http.h), an HTTP 404 is the sample's kNotFound naming the URL.
  static absl::StatusOr<std::shared_ptr<FileDataset>> Open(
      const std::string& source, const std::vector<std::string>& shards = {},
      double read_timeout_ms = 60000);

  const FileList& files() const noexcept { return files_; }
  int64_t size() const override { return int64_t(files_.samples.size()); }
  std::string Describe(int64_t index) const override;
  uint64_t Fingerprint() const override { return fingerprint_; }

 protected:
  explicit FileDataset(FileList files);
  FileList files_;
  uint64_t fingerprint_;
};

// WebDataset shards with named members: a sample is a key and all of its members
// (`record.members`, named by extension, in shard order: "jpg", "cls", "json", "txt", "npy",
// ...); `record.label` is the `.cls` member's integer when the key has one, else -1;
// `record.bytes` is the image member's bytes when there is one. `source` is a ".tar" path or a
// brace pattern ("d/train-{000000..000099}.tar"); `shards`, when given, takes precedence. URLs
// go through the shard cache as ImageLoader's shards do; `read_timeout_ms` bounds each read
// (and a server that never answers fails the open within ~2 of them).
absl::StatusOr<std::shared_ptr<FileDataset>> OpenWebDataset(
    const std::string& source, const std::vector<std::string>& shards = {},
    double read_timeout_ms = 60000);

}  // namespace feedline

#endif  // FEEDLINE_DATASET_H_
