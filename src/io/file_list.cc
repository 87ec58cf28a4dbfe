// File lists: torchvision ImageFolder order, and list files ("path label" lines).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/fnv.h"
#include "feedline/files.h"
#include "io/list_file.h"

namespace feedline {
namespace {

// os.path.join for the two-part case: torchvision builds paths with it.
std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

struct DirEntries {
  std::vector<std::string> dirs;
  std::vector<std::string> files;
};

// One level of os.scandir; `follow_links` as os.walk(followlinks=True): entries that are links
// to directories count as directories.
absl::StatusOr<DirEntries> ListDir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  DirEntries out;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (stat(JoinPath(path, name).c_str(), &st) != 0) continue;  // dangling link: skipped
    if (S_ISDIR(st.st_mode)) {
      out.dirs.push_back(std::move(name));
    } else {
      out.files.push_back(std::move(name));
    }
  }
  closedir(dir);
  return out;
}

// sorted(os.walk(root, followlinks=True)): (dirpath, files) pairs, sorted by dirpath.
absl::Status Walk(const std::string& root, int depth,
                  std::vector<std::pair<std::string, std::vector<std::string>>>* out) {
  if (depth > 64) return absl::InvalidArgumentError(absl::StrCat(root, ": directory cycle"));
  absl::StatusOr<DirEntries> entries = ListDir(root);
  if (!entries.ok()) return entries.status();
  out->emplace_back(root, std::move(entries->files));
  for (const std::string& d : entries->dirs) {
    absl::Status s = Walk(JoinPath(root, d), depth + 1, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<FileList> ScanImageFolder(const std::string& source,
                                         const std::vector<std::string>& extensions) {
  absl::StatusOr<DirEntries> top = ListDir(source);
  if (!top.ok()) return top.status();
  FileList ds;
  ds.kind = FileList::Kind::kImageFolder;
  ds.source = source;
  ds.classes = std::move(top->dirs);
  std::sort(ds.classes.begin(), ds.classes.end());
  if (ds.classes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": no class folders found (an ImageFolder has one sub-folder per class)"));
  }
  std::vector<std::string> empty_classes;
  for (size_t c = 0; c < ds.classes.size(); ++c) {
    std::vector<std::pair<std::string, std::vector<std::string>>> walk;
    absl::Status s = Walk(JoinPath(source, ds.classes[c]), 0, &walk);
    if (!s.ok()) return s;
    std::sort(walk.begin(), walk.end());
    size_t before = ds.samples.size();
    for (auto& [dirpath, files] : walk) {
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) {
        if (HasExtension(f, extensions)) {
          ds.samples.push_back(Sample{JoinPath(dirpath, f), static_cast<int64_t>(c)});
        }
      }
    }
    if (ds.samples.size() == before) empty_classes.push_back(ds.classes[c]);
  }
  if (!empty_classes.empty()) {
    // torchvision raises FileNotFoundError here too: a class without images is a broken layout.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": found no valid ", &extensions == &ImageExtensions() ? "image " : "",
                     "file for the classes ", absl::StrJoin(empty_classes, ", "),
                     ". Supported extensions are: ", absl::StrJoin(extensions, ", ")));
  }
  return ds;
}

absl::StatusOr<FileList> ScanListFile(const std::string& source) {
  std::ifstream in(source);
  if (!in) return absl::NotFoundError(absl::StrCat(source, ": cannot open list file"));
  // istream::read turns a read error (libstdc++'s filebuf throws from underflow) into badbit,
  // as getline did when the lines were parsed straight from the stream.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) text.append(chunk, size_t(in.gcount()));
  if (in.bad()) return absl::DataLossError(absl::StrCat(source, ": read error"));
  return ParseListFile(text, source);
}

}  // namespace

bool HasImageExtension(const std::string& name) { return HasExtension(name, ImageExtensions()); }

bool HasExtension(const std::string& name, const std::vector<std::string>& extensions) {
  std::string lower = absl::AsciiStrToLower(name);
  for (const std::string& ext : extensions) {
    if (lower.size() >= ext.size() &&
        lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0)
      return true;
  }
  return false;
}

absl::StatusOr<FileList> ParseListFile(absl::string_view text, const std::string& source_name) {
  std::string base;
  size_t slash = source_name.rfind('/');
  if (slash != std::string::npos) base = source_name.substr(0, slash);
  FileList ds;
  ds.kind = FileList::Kind::kListFile;
  ds.source = source_name;
  int64_t line_no = 0;
  // Lines as std::getline splits them: at '\n'; a last line without one still counts.
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    absl::string_view view = absl::StripAsciiWhitespace(line);
    if (view.empty() || view.front() == '#') continue;
    size_t sep = view.find_last_of(" \t");
    int64_t label = 0;
    if (sep == absl::string_view::npos || !absl::SimpleAtoi(view.substr(sep + 1), &label) ||
        label < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ":", line_no,
                       ": expected \"path label\" with a non-negative integer label, got \"",
                       view.substr(0, 200), "\""));
    }
    std::string path(absl::StripTrailingAsciiWhitespace(view.substr(0, sep)));
    // Relative paths are the list file's; absolute ones and URLs (http, https, s3) are kept.
    const bool url = absl::StartsWith(path, "http://") || absl::StartsWith(path, "https://") ||
                     absl::StartsWith(path, "s3://");
    if (path.front() != '/' && !url && !base.empty()) {
      path = JoinPath(base, path);
    }
    ds.samples.push_back(Sample{std::move(path), label});
  }
  if (ds.samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": the list file holds no samples"));
  }
  return ds;
}

const std::vector<std::string>& ImageExtensions() {
  // torchvision.datasets.folder.IMG_EXTENSIONS, in its order.
  static const std::vector<std::string> kExtensions = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                       ".pgm", ".tif",  ".tiff", ".webp"};
  return kExtensions;
}

uint64_t FileList::Fingerprint() const {
  // FNV-1a over "path\0label\0" of every sample.
  Fnv1a h;
  for (const Sample& s : samples) {
    h.Mix(s.path.data(), s.path.size() + 1);
    h.Mix(&s.label, sizeof(s.label));
  }
  return h.value;
}

absl::StatusOr<FileList> ScanFileList(const std::string& source,
                                      const std::vector<std::string>& extensions) {
  if (source.empty()) return absl::InvalidArgumentError("source: must not be empty");
  struct stat st;
  if (stat(source.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(source, ": no such file or directory"));
  }
  if (S_ISDIR(st.st_mode)) return ScanImageFolder(source, extensions);
  return ScanListFile(source);
}

}  // namespace feedline
