#include "io/file_dataset.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/env.h"
#include "core/file_io.h"
#include "feedline/error.h"
#include "io/http.h"
#include "io/list_file.h"
#include "io/shard_cache.h"
#include "io/tar_dataset.h"

namespace feedline {

absl::Status LocalFileDataset::Read(int64_t index, Record* record) const {
  const Sample& sample = files_.samples[size_t(index)];
  record->label = sample.label;
  record->members.clear();
  absl::Status st = ReadWholeFile(sample.path, max_file_bytes_, &record->bytes);
  if (absl::IsResourceExhausted(st)) {
    return absl::ResourceExhaustedError(absl::StrCat(st.message(), " (max_record_bytes)"));
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// FileDataset (include/feedline/dataset.h)

FileDataset::FileDataset(FileList files)
    : files_(std::move(files)), fingerprint_(files_.Fingerprint()) {}

std::string FileDataset::Describe(int64_t index) const {
  // A file or tar member name may hold control characters (a terminal escape, a newline that
  // forges a log line): messages and stats() show them escaped.
  return ShownName(files_.samples[size_t(index)].path);
}

namespace {

// The reads of a data set under `limits`: each within the read timeout, a body at most
// max_record_bytes, the bodies in flight together at most in_flight_bytes.
HttpOptions ReadOptions(const ReadLimits& limits) {
  HttpOptions http;
  http.timeout_s = limits.read_timeout_ms > 0 ? limits.read_timeout_ms / 1000 : 60;
  http.max_bytes = limits.max_record_bytes;
  http.max_held_bytes =
      limits.in_flight_bytes > 0 ? limits.in_flight_bytes : AvailableMemoryBytes() / 8;
  return http;
}

// Shards by path or URL: remote ones through the shard cache (io/shard_cache.h: a cached copy,
// or range reads from the shard's catalog), named by their URLs in samples and messages.
absl::StatusOr<std::shared_ptr<TarDataset>> OpenShards(const std::vector<std::string>& paths,
                                                       const std::string& source,
                                                       TarDataset::Mode mode,
                                                       const ReadLimits& limits) {
  const double read_timeout_ms = limits.read_timeout_ms;
  const bool remote = std::any_of(paths.begin(), paths.end(), IsHttpUrl);
  if (!remote) {
    std::vector<ShardSource> local;
    for (const std::string& p : paths) local.push_back(ShardSource{p, "", "", p});
    return TarDataset::Open(local, source, mode, ReadOptions(limits));
  }
  HttpOptions download;
  download.timeout_s = 3600;  // a whole shard; a stalled transfer fails after read_timeout
  download.stall_s = read_timeout_ms > 0 ? read_timeout_ms / 1000 : 60;
  // A server that never answers fails the open within ~2 read_timeouts (one shard: the others
  // are not started after a failure), not 6 attempts per shard, shard after shard (165 s).
  download.silent_s = 2 * download.stall_s;
  download.connect_timeout_s = std::min(download.connect_timeout_s, download.stall_s);
  download.max_bytes = int64_t{1} << 40;
  if (std::any_of(paths.begin(), paths.end(), IsS3Url)) {
    download.s3 = std::make_shared<const S3Config>(LoadS3Config());
  }
  std::vector<std::string> urls;
  for (const std::string& p : paths) {
    if (IsHttpUrl(p)) urls.push_back(p);
  }
  absl::StatusOr<std::vector<ShardSource>> fetched = PrepareRemoteShards(urls, download);
  if (!fetched.ok()) return fetched.status();
  std::vector<ShardSource> sources;
  for (size_t i = 0, u = 0; i < paths.size(); ++i) {
    if (IsHttpUrl(paths[i])) {
      sources.push_back((*fetched)[u++]);
    } else {
      sources.push_back(ShardSource{paths[i], "", "", paths[i]});
    }
  }
  HttpOptions reads = ReadOptions(limits);  // members by range: each read within read_timeout
  reads.s3 = download.s3;
  reads.connect_timeout_s = download.connect_timeout_s;
  absl::StatusOr<std::shared_ptr<TarDataset>> tar = TarDataset::Open(sources, source, mode, reads);
  if (!tar.ok()) {  // name the URL, not the cache file
    std::string message(tar.status().message());
    for (const ShardSource& s : sources) {
      if (!s.path.empty() && s.path != s.shown) {
        message = absl::StrReplaceAll(message, {{s.path, s.shown}});
      }
    }
    return absl::Status(tar.status().code(), message);
  }
  return tar;
}

// A URL's scheme and host (and port), lowercased, without user information: "https://host:8443".
std::string Origin(const std::string& url) {
  const std::string shown = ShownName(url);
  const size_t scheme = shown.find("://");
  if (scheme == std::string::npos) return "";
  return absl::AsciiStrToLower(shown.substr(0, shown.find('/', scheme + 3)));
}

// A remote list file names only its own server's files: relative paths (joined to its URL) or
// URLs with its scheme and host. Anything else would let whoever serves the list make the
// loader read local files (an absolute path such as /etc/hostname), reach other hosts, or sign
// requests for other S3 buckets with the user's credentials. FEEDLINE_LIST_ANY_HOST=1 allows
// entries elsewhere, for lists the user trusts.
absl::Status CheckOwnOrigin(const FileList& files, const std::string& list_url) {
  if (Env("FEEDLINE_LIST_ANY_HOST") == "1") return absl::OkStatus();
  const std::string origin = Origin(list_url);
  for (size_t i = 0; i < files.samples.size(); ++i) {
    const std::string& path = files.samples[i].path;
    if (IsHttpUrl(path) && Origin(path) == origin) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        ShownName(list_url), ": sample ", i + 1, " (", ShownName(path), ") is ",
        IsHttpUrl(path) ? absl::StrCat("on another host than the list file's (", origin, ")")
                        : std::string("a local path"),
        "; a remote list file may only name its own server's files (set "
        "FEEDLINE_LIST_ANY_HOST=1 to allow a list you trust to name others)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<FileDataset>> FileDataset::Open(
    const std::string& source, const std::vector<std::string>& shards, const ReadLimits& limits,
    const std::vector<std::string>& extensions) {
  HttpOptions http = ReadOptions(limits);
  if (shards.empty() && IsS3Url(source) && source.back() == '/') {  // an ImageFolder prefix
    http.s3 = std::make_shared<const S3Config>(LoadS3Config());
    absl::StatusOr<FileList> files = ScanS3ImageFolder(source, http);
    if (!files.ok()) return files.status();
    return std::shared_ptr<FileDataset>(
        std::make_shared<RemoteFileDataset>(*std::move(files), http));
  }
  if (shards.empty() && IsHttpUrl(source) && !LooksLikeShards(source)) {  // a remote list file
    if (IsS3Url(source)) http.s3 = std::make_shared<const S3Config>(LoadS3Config());
    std::vector<uint8_t> text;
    HttpOptions list = http;  // the list file itself: not a record
    list.max_bytes = int64_t{1} << 32;
    list.max_held_bytes = 0;
    if (absl::Status s = HttpFetch(source, 0, 0, list, &text); !s.ok()) {
      if (absl::IsNotFound(s) && IsS3Url(source)) {
        return absl::NotFoundError(absl::StrCat(
            s.message(), " (for an ImageFolder-like prefix, end the source with '/')"));
      }
      return s;
    }
    absl::StatusOr<FileList> files = ParseListFile(
        absl::string_view(reinterpret_cast<const char*>(text.data()), text.size()), source);
    if (!files.ok()) {  // named by its URL as shown (it is parsed with the real one: its base)
      return absl::Status(files.status().code(),
                          absl::StrReplaceAll(files.status().message(),
                                              {{source, ShownName(source)}}));
    }
    if (absl::Status s = CheckOwnOrigin(*files, source); !s.ok()) return s;
    return std::shared_ptr<FileDataset>(
        std::make_shared<RemoteFileDataset>(*std::move(files), http));
  }
  if (!shards.empty() || LooksLikeShards(source)) {
    std::vector<std::string> paths = shards;
    if (paths.empty()) {
      absl::StatusOr<std::vector<std::string>> expanded = ExpandBraces(source);
      if (!expanded.ok()) return expanded.status();
      paths = *std::move(expanded);
    }
    absl::StatusOr<std::shared_ptr<TarDataset>> tar =
        OpenShards(paths, source, TarDataset::Mode::kImages, limits);
    if (!tar.ok()) return tar.status();
    return std::shared_ptr<FileDataset>(*std::move(tar));
  }
  absl::StatusOr<FileList> files = ScanFileList(source, extensions);
  if (!files.ok()) return files.status();
  if (std::any_of(files->samples.begin(), files->samples.end(),
                  [](const Sample& s) { return IsS3Url(s.path); })) {
    http.s3 = std::make_shared<const S3Config>(LoadS3Config());  // once: it reads ~/.aws
  }
  for (const Sample& s : files->samples) {
    if (IsHttpUrl(s.path)) {
      return std::shared_ptr<FileDataset>(
          std::make_shared<RemoteFileDataset>(*std::move(files), http));
    }
  }
  return std::shared_ptr<FileDataset>(
      std::make_shared<LocalFileDataset>(*std::move(files), limits.max_record_bytes));
}

absl::StatusOr<std::shared_ptr<FileDataset>> OpenWebDataset(const std::string& source,
                                                            const std::vector<std::string>& shards,
                                                            const ReadLimits& limits) {
  std::vector<std::string> paths = shards;
  if (paths.empty()) {
    absl::StatusOr<std::vector<std::string>> expanded = ExpandBraces(source);
    if (!expanded.ok()) return expanded.status();
    paths = *std::move(expanded);
  }
  absl::StatusOr<std::shared_ptr<TarDataset>> tar =
      OpenShards(paths, source, TarDataset::Mode::kMembers, limits);
  if (!tar.ok()) return tar.status();
  return std::shared_ptr<FileDataset>(*std::move(tar));
}

}  // namespace feedline
