// feedline — data sets: which files, in which order, with which labels.
//
// A data set is scanned once, when a loader is created. Its sample list is what torchvision's
// `ImageFolder` (or a list file) gives: `classes` sorted, `samples` as (path, class index),
// ordered as torchvision orders them, so that sample indices mean the same thing in both.
//
// Thread safety: `Dataset` is an immutable value after `ScanDataset` returns; share it freely.
#ifndef FEEDLINE_DATASET_H_
#define FEEDLINE_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace feedline {

struct Sample {
  std::string path;  // as torchvision would give it: the source joined with the relative path
  int64_t label = 0;
};

struct Dataset {
  enum class Kind { kImageFolder, kListFile, kShards };
  Kind kind = Kind::kImageFolder;
  std::string source;
  std::vector<std::string> classes;  // ImageFolder: sorted class folder names; list file: empty
  std::vector<Sample> samples;
  // A hash of the samples (paths and labels): tells whether a saved state fits this data set.
  uint64_t Fingerprint() const;
};

// The file name extensions that torchvision's ImageFolder accepts (compared case-insensitively).
const std::vector<std::string>& ImageExtensions();

// Scans `source`: a directory is an ImageFolder; a regular file is a list file of
// "path label" lines (blank lines and lines starting with '#' are ignored; a path may contain
// spaces: the label is the last field). Errors: kNotFound (no such source), kInvalidArgument
// (an empty data set, a class without images, a malformed list line: file and line named).
absl::StatusOr<Dataset> ScanDataset(const std::string& source);

}  // namespace feedline

#endif  // FEEDLINE_DATASET_H_
