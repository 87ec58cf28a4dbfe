// libFuzzer target: the list file parser (ParseListFile). A parsed data set holds at least one
// sample, every label is non-negative and every path non-empty, relative ones joined to the
// list file's folder. The same bytes as a file must give the same result through ScanFileList
// (the file reading in front of the parser).
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "feedline/files.h"
#include "fuzz_util.h"
#include "io/list_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* file = new feedline::fuzz::MemFile();
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<feedline::FileList> parsed = feedline::ParseListFile(text, "lists/train.txt");
  if (parsed.ok()) {
    FUZZ_CHECK(!parsed->samples.empty(), "no samples");
    FUZZ_CHECK(parsed->kind == feedline::FileList::Kind::kListFile, "kind");
    for (const feedline::Sample& s : parsed->samples) {
      FUZZ_CHECK(s.label >= 0, s.path);
      FUZZ_CHECK(!s.path.empty(), "empty path");
      // Relative paths are joined to the list file's folder; absolute ones and URLs (only
      // these schemes) are kept as they are.
      const bool url = absl::StartsWith(s.path, "http://") ||
                       absl::StartsWith(s.path, "https://") || absl::StartsWith(s.path, "s3://");
      FUZZ_CHECK(s.path.front() == '/' || url || absl::StartsWith(s.path, "lists/"), s.path);
    }
  } else {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed.status()), parsed.status().ToString());
    FUZZ_CHECK(absl::StartsWith(parsed.status().message(), "lists/train.txt:"),
               parsed.status().ToString());
  }

  const std::string& path = file->Write(data, size);
  absl::StatusOr<feedline::FileList> scanned = feedline::ScanFileList(path);
  absl::StatusOr<feedline::FileList> expected = feedline::ParseListFile(text, path);
  FUZZ_CHECK(scanned.status() == expected.status(),
             absl::StrCat(scanned.status().ToString(), " vs ", expected.status().ToString()));
  if (scanned.ok()) {
    FUZZ_CHECK(scanned->source == path && scanned->samples.size() == expected->samples.size(),
               "scan differs");
    for (size_t i = 0; i < scanned->samples.size(); ++i) {
      FUZZ_CHECK(scanned->samples[i].path == expected->samples[i].path &&
                     scanned->samples[i].label == expected->samples[i].label,
                 scanned->samples[i].path);
    }
  }
  return 0;
}
