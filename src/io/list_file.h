// List files ("path label" lines) parsed from memory: the parser behind ScanFileList's list-file
// branch, separate from the file reading so that it can be fuzzed and tested on buffers.
//
// Thread safety: a pure function of its arguments; call it from any thread.
#ifndef FEEDLINE_SRC_IO_LIST_FILE_H_
#define FEEDLINE_SRC_IO_LIST_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "feedline/files.h"

namespace feedline {

// Parses the text of a list file as ScanFileList documents it: one "path label" per line
// ('\n'-separated; blank lines and lines starting with '#' ignored; the label is the last
// whitespace-separated field, so paths may contain spaces). Relative paths are joined to the
// folder of `source_name`, which also names the file in errors and becomes `FileList::source`.
// Errors: kInvalidArgument for a malformed line (file and line number named) or no samples.
absl::StatusOr<FileList> ParseListFile(absl::string_view text, const std::string& source_name);

// True when `name` ends with one of `extensions` (lowercase, with the dot), compared
// case-insensitively.
bool HasExtension(const std::string& name, const std::vector<std::string>& extensions);
// True when `name` ends with one of ImageExtensions(), compared case-insensitively.
bool HasImageExtension(const std::string& name);

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_LIST_FILE_H_
