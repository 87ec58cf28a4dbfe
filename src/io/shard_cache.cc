#include "io/shard_cache.h"

#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/env.h"
#include "core/file_io.h"
#include "core/fnv.h"

namespace feedline {
namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

// A LocalCopy's version (the object's ETag) is kept beside it in "<file>.ver".
constexpr const char* kVersionSuffix = ".ver";
// The processes of a node that share the cache (a job's ranks, or two jobs) fetch a file once:
// its fetch is done under "<file>.lock" (FileLock), and whoever waited finds it done. Lock files
// are a few bytes each and stay (removing one would race with a process about to take it).
constexpr const char* kLockSuffix = ".lock";

// A name feedline made in the cache folder: "<16 hex digits of the URL's hash>-..." (CachePathFor).
// Anything else there (a user's own files) is never counted, evicted or cleaned up.
bool IsFeedlineName(const std::string& name) {
  if (name.size() < 18 || name[16] != '-') return false;
  for (size_t i = 0; i < 16; ++i) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

// A cached shard file or local copy (not a catalog, a version or a download in progress).
bool IsShardFile(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return IsFeedlineName(name) && !absl::EndsWith(name, ".idx") && !absl::EndsWith(name, ".part") &&
         !absl::EndsWith(name, kVersionSuffix) && !absl::EndsWith(name, kLockSuffix);
}

// Bytes of the shard files and local copies the cache folder holds.
int64_t CachedBytes(const std::string& dir) {
  int64_t held = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code e2;
    if (e.is_regular_file(e2) && IsShardFile(e.path())) held += int64_t(e.file_size(e2));
  }
  return held;
}

// Runs fn(k) for every k in [0, n) on up to `threads` threads of its own (blocking transfers,
// a few at once), and returns when all are done.
void OnThreads(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t t = 0; t < std::min(threads, n); ++t) {
    pool.emplace_back([&] {
      for (size_t k; (k = next.fetch_add(1)) < n;) fn(k);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

std::string ShardCacheDir() {
  std::string dir = Env("FEEDLINE_CACHE_DIR");
  if (dir.empty()) {
    std::string home = Env("HOME");
    if (home.empty()) {  // containers and schedulers often leave HOME unset: the user's own
      struct passwd pw {};
      struct passwd* found = nullptr;
      std::vector<char> buf(16384);
      if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 &&
          found != nullptr && found->pw_dir != nullptr && found->pw_dir[0] == '/') {
        home = found->pw_dir;
      }
    }
    const std::string xdg = Env("XDG_CACHE_HOME");
    // Last, a folder of this user's own under /tmp (EnsurePrivateDir refuses one that someone
    // else made first).
    dir = !xdg.empty()    ? xdg + "/feedline"
          : !home.empty() ? home + "/.cache/feedline"
                          : absl::StrCat("/tmp/feedline-cache-", ::geteuid());
  }
  return dir + "/shards";
}

int64_t ShardCacheBudget(const std::string& dir) {
  const std::string v = std::string(absl::StripAsciiWhitespace(Env("FEEDLINE_SHARD_CACHE_BYTES")));
  if (!v.empty()) {
    int64_t scale = 1;
    std::string digits = v;
    const char last = char(std::toupper(static_cast<unsigned char>(v.back())));
    const std::string units = "KMGT";
    if (const size_t u = units.find(last); u != std::string::npos) {
      scale = int64_t{1} << (10 * (u + 1));
      digits.pop_back();
    }
    double n = 0;
    if (!absl::SimpleAtod(digits, &n) || n < 0 || n * double(scale) > 9e18) return -1;
    return int64_t(n * double(scale));
  }
  // Half the free space, plus what the cache holds already (it may be reused).
  const int64_t held = CachedBytes(dir);
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) != 0) return held;
  return held + int64_t(fs.f_bavail) * int64_t(fs.f_frsize) / 2;
}

namespace {

// The cache file for `url`: "<dir>/<hash of the URL>-<last path component>".
std::string CachePathFor(const std::string& dir, const std::string& url) {
  const std::string shown = ShownName(url);
  Fnv1a h;
  h.Mix(url.data(), url.size());
  return absl::StrCat(dir, "/", absl::Hex(h.value, absl::kZeroPad16), "-",
                      shown.substr(shown.rfind('/') + 1));
}

absl::StatusOr<int64_t> Budget(const std::string& dir) {
  const int64_t budget = ShardCacheBudget(dir);
  if (budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FEEDLINE_SHARD_CACHE_BYTES=\"", Env("FEEDLINE_SHARD_CACHE_BYTES"),
                     "\": expected a byte count, optionally with a K, M, G or T suffix"));
  }
  return budget;
}

// Marks `in_use` as the most recently used files, then removes the least recently used cached
// files until the cache holds at most `budget` bytes (catalogs and downloads in progress are
// not counted and stay).
void HoldBudget(const std::string& dir, const std::vector<std::string>& in_use, int64_t budget) {
  for (const std::string& path : in_use) {
    std::error_code e;
    if (Exists(path)) {
      std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now(), e);
    }
  }
  std::error_code ec;
  std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> files;
  int64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code e2;
    if (!e.is_regular_file(e2)) continue;
    if (!IsShardFile(e.path())) {
      // A download left by a process that died: every download runs under its file's lock
      // (kLockSuffix), so a part file whose lock is free has nobody to finish it.
      const std::string name = e.path().filename().string();
      if (IsFeedlineName(name) && absl::EndsWith(name, ".part")) {
        const std::string part = e.path().string();
        // "<file>.XXXXXX.part" (CreatePartFile)
        const std::string file = part.substr(0, part.size() - std::string(".XXXXXX.part").size());
        FileLock node(file + kLockSuffix, FileLock::Wait::kTry);
        if (node.held()) std::filesystem::remove(e.path(), e2);
      }
      continue;
    }
    total += int64_t(e.file_size(e2));
    files.emplace_back(e.last_write_time(e2), e.path());
  }
  std::sort(files.begin(), files.end());
  for (size_t k = 0; k < files.size() && total > budget; ++k) {
    std::error_code e;
    const int64_t size = int64_t(std::filesystem::file_size(files[k].second, e));
    if (std::filesystem::remove(files[k].second, e)) total -= size;
    std::filesystem::remove(files[k].second.string() + kVersionSuffix, e);
  }
}

// Whether the object at `url` is no longer the version cached: one HEAD, within the stall
// timeout (60 s at most). With a validator (an ETag, or a Last-Modified date), a different one;
// without (a server that sends neither), a length other than the cached `bytes` (a shard
// rewritten with the same length is caught when read: every member is checked against its
// content hash). No answer is "not changed": a cached copy opens offline.
bool ChangedOnServer(const std::string& url, const std::string& validator, int64_t bytes,
                     const HttpOptions& o) {
  HttpOptions head = o;
  head.timeout_s = std::min(o.stall_s > 0 ? o.stall_s : 60.0, 60.0);
  absl::StatusOr<HttpObject> now = HttpHead(url, head);
  if (!now.ok()) return false;
  if (!validator.empty()) return !now->validator.empty() && now->validator != validator;
  return now->length >= 0 && bytes >= 0 && now->length != bytes;
}

// The byte budget while shards are downloaded: each download that would take the cache past it
// first evicts the least recently used files of other data sets, then, if that is not enough,
// is not kept (its catalog is: its samples are read by range). The disk holds at most the budget
// plus the downloads in flight, never the whole data set first.
class Room {
 public:
  Room(const std::string& dir, const std::vector<ShardSource>& mine, int64_t budget)
      : budget_(budget) {
    std::vector<std::string> own;
    for (const ShardSource& s : mine) own.push_back(std::filesystem::path(s.path).filename());
    std::sort(own.begin(), own.end());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::error_code e2;
      if (!e.is_regular_file(e2) || !IsShardFile(e.path())) continue;
      const int64_t size = int64_t(e.file_size(e2));
      held_ += size;
      if (!std::binary_search(own.begin(), own.end(), e.path().filename().string())) {
        others_.push_back({e.last_write_time(e2), e.path(), size});
      }
    }
    std::sort(others_.begin(), others_.end(),
              [](const Other& a, const Other& b) { return a.time > b.time; });  // oldest last
  }

  // A download of `bytes` at `path` is complete: whether it stays (else it was removed).
  bool Keep(const std::string& path, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ += bytes;
    while (held_ > budget_ && !others_.empty()) {
      std::error_code e;
      if (std::filesystem::remove(others_.back().path, e)) held_ -= others_.back().size;
      std::filesystem::remove(others_.back().path.string() + kVersionSuffix, e);
      others_.pop_back();
    }
    if (held_ <= budget_) return true;
    std::error_code e;
    std::filesystem::remove(path, e);
    held_ -= bytes;
    return false;
  }

 private:
  struct Other {
    std::filesystem::file_time_type time;
    std::filesystem::path path;
    int64_t size = 0;
  };
  std::mutex mu_;
  const int64_t budget_;
  int64_t held_ = 0;
  std::vector<Other> others_;  // newest first
};

}  // namespace

absl::StatusOr<std::vector<ShardSource>> PrepareRemoteShards(const std::vector<std::string>& urls,
                                                             const HttpOptions& o) {
  const std::string dir = ShardCacheDir();
  if (absl::Status s = EnsurePrivateDir(dir); !s.ok()) return s;
  const absl::StatusOr<int64_t> budget = Budget(dir);
  if (!budget.ok()) return budget.status();
  std::vector<ShardSource> out(urls.size());
  std::vector<size_t> fetch;  // shards seen for the first time (no catalog yet)
  for (size_t i = 0; i < urls.size(); ++i) {
    ShardSource& s = out[i];
    s.url = urls[i];
    s.shown = ShownName(urls[i]);
    s.path = CachePathFor(dir, urls[i]);
    s.catalog = s.path + ".idx";
    if (!Exists(s.catalog)) fetch.push_back(i);
  }
  // Shards seen before: still the version catalogued? One HEAD each (a few at once); a changed
  // ETag drops the copy and its catalog, and the shard is fetched again. A server that does not
  // answer leaves the cache as it is (a cached data set opens offline).
  {
    std::vector<size_t> known;
    for (size_t i = 0; i < out.size(); ++i) {
      if (Exists(out[i].catalog)) known.push_back(i);
    }
    // 64 at once: the requests share the HTTP loop's connections, the threads only wait (1,000
    // shards at 20 ms a request open in ~0.3 s, not 2.5 s as 8 at once).
    std::mutex mu;
    OnThreads(known.size(), 64, [&](size_t k) {
      const ShardSource& s = out[known[k]];
      const TarCatalogSummary summary = SummarizeTarCatalog(s.catalog);
      // Fetched again, never served: a catalog that does not read (damaged, of an older
      // version: its checksum or its header) or that describes another source; a copy of
      // another size than catalogued (a crash between write and rename on a file system that
      // lost the tail, a disk-full copy, a user's cut: cut at a member boundary it gave half
      // its samples without a word); a shard changed on the server.
      struct stat st {};
      const bool stale =
          summary.bytes < 0 || summary.source != s.shown ||
          (::stat(s.path.c_str(), &st) == 0 && int64_t(st.st_size) != summary.bytes) ||
          ChangedOnServer(s.url, summary.etag, summary.bytes, o);
      if (!stale) return;
      {
        // Under the shard's lock, and only if no other process has fetched it again meanwhile
        // (its catalog would describe another version).
        FileLock node(s.path + kLockSuffix, FileLock::Wait::kBlock);
        const TarCatalogSummary now = SummarizeTarCatalog(s.catalog);
        if (now.bytes >= 0 && (now.etag != summary.etag || now.bytes != summary.bytes)) return;
        std::error_code e;
        std::filesystem::remove(s.path, e);
        std::filesystem::remove(s.catalog, e);
      }
      std::lock_guard<std::mutex> lock(mu);
      fetch.push_back(known[k]);
    });
  }
  // Catalogued shards whose files were removed to hold the budget (read by range meanwhile)
  // are fetched again when the budget has room for them now, in the data set's order.
  {
    int64_t held = CachedBytes(dir);
    std::vector<bool> fetching(out.size(), false);
    for (size_t i : fetch) fetching[i] = true;
    for (size_t i = 0; i < out.size(); ++i) {
      if (fetching[i] || Exists(out[i].path) || !Exists(out[i].catalog)) continue;
      const int64_t bytes = SummarizeTarCatalog(out[i].catalog).bytes;
      if (bytes < 0 || held + bytes > *budget) continue;
      held += bytes;
      fetch.push_back(i);
    }
  }
  // Downloads: a few at once (shards are large, the bandwidth is shared); each catalogued
  // as soon as it is complete. Each under its lock (kLockSuffix): a shard another process of
  // the node is fetching is left for later, and then waited for (it is usually done by then).
  std::mutex mu;
  absl::Status first;
  std::vector<size_t> busy;
  Room room(dir, out, *budget);
  const auto fetch_one = [&](size_t i, FileLock::Wait wait) {
    {
      // After a failure the open fails: the shards not started yet are not fetched (a silent
      // server would otherwise make every one of them wait out its retries).
      std::lock_guard<std::mutex> lock(mu);
      if (!first.ok()) return;
    }
    const ShardSource& s = out[i];
    FileLock node(s.path + kLockSuffix, wait);
    if (node.busy()) {
      std::lock_guard<std::mutex> lock(mu);
      busy.push_back(i);
      return;
    }
    // Fetched by another process while this one waited, or before this one looked.
    if (Exists(s.path) && SummarizeTarCatalog(s.catalog).bytes >= 0) return;
    // A file without its catalog is never adopted (a cut download of an older version, or a
    // file someone planted at the name): fetched again.
    std::error_code gone;
    std::filesystem::remove(s.path, gone);
    std::string etag;
    absl::Status st = HttpDownload(s.url, s.path, o, nullptr, &etag);
    if (st.ok()) {
      st = WriteTarCatalog(s.path, s.shown, s.catalog, etag);
      // A copy that cannot be catalogued (not a tar) is not kept: the next open fetches the
      // shard again (it may have been fixed on the server).
      if (!st.ok()) std::filesystem::remove(s.path, gone);
    }
    if (st.ok()) room.Keep(s.path, int64_t(std::filesystem::file_size(s.path, gone)));
    if (!st.ok()) {
      // Name the URL, not the cache file.
      st = absl::Status(st.code(), absl::StrReplaceAll(st.message(), {{s.path, s.shown}}));
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = st;
    }
  };
  OnThreads(fetch.size(), 4, [&](size_t k) { fetch_one(fetch[k], FileLock::Wait::kTry); });
  std::sort(busy.begin(), busy.end());
  OnThreads(busy.size(), 4, [&](size_t k) { fetch_one(busy[k], FileLock::Wait::kBlock); });
  if (!first.ok()) return first;
  // This data set's files are the most recently used; then the budget, oldest first.
  std::vector<std::string> in_use;
  for (const ShardSource& s : out) in_use.push_back(s.path);
  HoldBudget(dir, in_use, *budget);
  // Cached files are read from disk; the rest by range from their catalogs.
  for (ShardSource& s : out) {
    if (!Exists(s.path)) s.path.clear();
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> LocalCopies(const std::vector<std::string>& paths,
                                                     double read_timeout_ms) {
  std::vector<std::string> out = paths;
  std::vector<std::string> in_use;
  if (std::none_of(paths.begin(), paths.end(), IsHttpUrl)) return out;
  const std::string dir = ShardCacheDir();
  if (absl::Status s = EnsurePrivateDir(dir); !s.ok()) return s;
  const absl::StatusOr<int64_t> budget = Budget(dir);
  if (!budget.ok()) return budget.status();
  std::error_code ec;
  int64_t needed = 0;
  for (std::string& path : out) {
    if (!IsHttpUrl(path)) continue;
    const std::string url = path;
    path = CachePathFor(dir, url);
    const std::string version = path + kVersionSuffix;
    HttpOptions o;
    o.timeout_s = 24 * 3600;  // a whole file; a stalled transfer fails after read_timeout
    o.stall_s = read_timeout_ms > 0 ? read_timeout_ms / 1000 : 60;
    o.silent_s = 2 * o.stall_s;  // a server that never answers: see OpenShards
    o.connect_timeout_s = std::min(o.connect_timeout_s, o.stall_s);
    o.max_bytes = int64_t{1} << 42;
    if (IsS3Url(url)) o.s3 = std::make_shared<const S3Config>(LoadS3Config());
    // One fetch per node: the check and the download under the file's lock.
    FileLock node(path + kLockSuffix, FileLock::Wait::kBlock);
    if (Exists(path)) {
      // Still the version copied? A changed one is fetched again: the old copy is unlinked (a
      // process that has it open or mapped keeps reading it) and the new one renamed in.
      std::vector<uint8_t> cached;
      (void)ReadWholeFile(version, 4096, &cached);  // none: the server sent no validator
      const int64_t bytes = int64_t(std::filesystem::file_size(path, ec));
      if (ChangedOnServer(url, std::string(cached.begin(), cached.end()), ec ? -1 : bytes, o)) {
        std::filesystem::remove(path, ec);
      }
    }
    if (!Exists(path)) {
      std::string etag;
      if (absl::Status s = HttpDownload(url, path, o, nullptr, &etag); !s.ok()) return s;
      std::filesystem::remove(version, ec);
      // Best effort: without it the copy is simply not compared with the server again.
      if (!etag.empty()) (void)WriteFileWhole(version, etag);
    }
    in_use.push_back(path);
    needed += int64_t(std::filesystem::file_size(path, ec));
  }
  // The copies asked for are the most recent and stay, even past the budget (the caller is
  // about to open them; an open or mapped file outlives a later removal anyway).
  HoldBudget(dir, in_use, std::max(*budget, needed));
  return out;
}

absl::StatusOr<std::string> LocalCopy(const std::string& path_or_url, double read_timeout_ms) {
  absl::StatusOr<std::vector<std::string>> local = LocalCopies({path_or_url}, read_timeout_ms);
  if (!local.ok()) return local.status();
  return (*local)[0];
}

}  // namespace feedline
