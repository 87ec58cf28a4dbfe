// The HTTP client (src/io/http.h) against a small HTTP/1.1 server in this process (real
// sockets on loopback, keep-alive), and a loader reading URLs with several reader threads:
// the part of remote storage that runs under ThreadSanitizer and AddressSanitizer. (The
// Python tests run nginx, s3rver and a fault proxy.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_io.h"
#include "feedline/files.h"
#include "feedline/loader.h"
#include "io/http.h"
#include "io/shard_cache.h"
#include "io/tar_dataset.h"
#include "test_util.h"

namespace feedline {
namespace {

// The body of /ok/<n>: n bytes of a pattern of n.
std::string Body(int n) {
  std::string b;
  for (int i = 0; i < n; ++i) b.push_back(char('a' + (i * 7 + n) % 26));
  return b;
}

// Serves /slow/<n> (200 after 20 ms), /ok/<n> (200), /flaky/<n> (503 the first time each, then
// 200), /reset/<n> (the connection closed without an answer the first time, then 200), /forbidden
// (403), /file/<name> (bytes given to serve_file), .../redirect-to/<port>/<path> (302 to
// http://127.0.0.1:<port>/<path>), .../redirect-ftp (302 to an ftp:// URL), anything else 404.
// Honours Range: bytes=a-b on /ok and /file. Keeps every request's head (heads()).
class TestServer {
 public:
  TestServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    REQUIRE(::listen(fd_, 64) == 0);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~TestServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accept_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    for (std::thread& t : workers_) t.join();
  }
  std::string url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  int requests() const { return requests_.load(); }
  // Serves `bytes` at /file/<name>, each whole-file GET after `delay_ms`; with neither an ETag
  // nor a Last-Modified date (a server without validators).
  void serve_file(const std::string& name, std::string bytes, int delay_ms = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    files_["/file/" + name] = std::move(bytes);
    delays_["/file/" + name] = delay_ms;
  }
  // The most /slow/ requests served at once.
  int max_concurrent() const { return max_concurrent_.load(); }
  std::vector<std::string> heads() {
    std::lock_guard<std::mutex> lock(mu_);
    return heads_;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.push_back(c);
      workers_.emplace_back([this, c] { Serve(c); });
    }
  }
  void Serve(int c) {
    std::string buf;
    char chunk[4096];
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(c, chunk, sizeof(chunk), 0);
        if (n <= 0) {
          ::close(c);
          return;
        }
        buf.append(chunk, size_t(n));
      }
      const std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      requests_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu_);
        heads_.push_back(head);
      }
      const size_t sp = head.find(' '), sp2 = head.find(' ', sp + 1);
      const std::string path = head.substr(sp + 1, sp2 - sp - 1);
      int64_t from = -1, to = -1;
      if (size_t r = head.find("Range: bytes="); r != std::string::npos) {
        std::sscanf(head.c_str() + r + 13, "%ld-%ld", &from, &to);
      }
      int first_time;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first_time = seen_[path]++ == 0;
      }
      auto reply = [&](int status, const std::string& body) {
        const std::string msg = absl::StrCat(
            "HTTP/1.1 ", status, " X\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
        ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
      };
      const auto slash = path.rfind('/');
      const int n = slash != std::string::npos ? std::atoi(path.c_str() + slash + 1) : 0;
      std::string file;
      bool is_file = false;
      int delay_ms = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = files_.find(path);
        if (it != files_.end()) file = it->second, is_file = true, delay_ms = delays_[path];
      }
      if (is_file) {
        if (head.rfind("HEAD ", 0) == 0) {  // the headers alone
          const std::string msg =
              absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", file.size(), "\r\n\r\n");
          ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
        } else if (from < 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          reply(200, file);
        } else {
          const std::string body = file.substr(size_t(from), size_t(to - from + 1));
          const std::string msg =
              absl::StrCat("HTTP/1.1 206 Partial\r\nContent-Range: bytes ", from, "-", to, "/",
                           file.size(), "\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
          ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
        }
        continue;
      }
      if (const size_t r = path.find("/redirect-to/"); r != std::string::npos) {
        const std::string rest = path.substr(r + 13);  // <port>/<path>
        const std::string msg = absl::StrCat(
            "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:", rest.substr(0, rest.find('/')),
            rest.substr(rest.find('/')), "\r\nContent-Length: 0\r\n\r\n");
        ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
        continue;
      }
      if (path.find("list-type=2") != std::string::npos) {  // an S3 listing that loops
        const std::string body =
            path.find("empty") != std::string::npos
                ? absl::StrCat("<ListBucketResult><IsTruncated>true</IsTruncated>"
                               "<NextContinuationToken>t", requests_.load(),
                               "</NextContinuationToken></ListBucketResult>")
                : std::string("<ListBucketResult><Contents><Key>a.jpg</Key></Contents>"
                              "<IsTruncated>true</IsTruncated><NextContinuationToken>same"
                              "</NextContinuationToken></ListBucketResult>");
        reply(200, body);
        continue;
      }
      if (path.find("/redirect-ftp") != std::string::npos) {
        const std::string msg = absl::StrCat("HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1:",
                                             port_, "/x\r\nContent-Length: 0\r\n\r\n");
        ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
        continue;
      }
      if (path.rfind("/endless", 0) == 0) {  // a body that never ends, until the client leaves
        const std::string start = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        ::send(c, start.data(), start.size(), MSG_NOSIGNAL);
        const std::string chunk = absl::StrCat("10000\r\n", std::string(65536, 'e'), "\r\n");
        while (!stop_ && ::send(c, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) {
        }
        ::close(c);
        return;
      }
      if (path.rfind("/slow/", 0) == 0) {  // 20 ms per request, as a remote store
        const int now = ++concurrent_;
        for (int m = max_concurrent_.load();
             now > m && !max_concurrent_.compare_exchange_weak(m, now);) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        --concurrent_;
        reply(200, Body(n));
        continue;
      }
      if (path.rfind("/ok/", 0) == 0 ||
          (!first_time && (path.rfind("/flaky/", 0) == 0 || path.rfind("/reset/", 0) == 0))) {
        std::string body = Body(n);
        if (from >= 0) {
          body = body.substr(size_t(from), size_t(to - from + 1));
          const std::string msg =
              absl::StrCat("HTTP/1.1 206 Partial\r\nContent-Range: bytes ", from, "-", to, "/", n,
                           "\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
          ::send(c, msg.data(), msg.size(), MSG_NOSIGNAL);
        } else {
          reply(200, body);
        }
      } else if (path.rfind("/flaky/", 0) == 0) {
        reply(503, "");
      } else if (path.rfind("/reset/", 0) == 0) {
        ::close(c);
        return;
      } else if (path == "/forbidden") {
        reply(403, "");
      } else {
        reply(404, "");
      }
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::atomic<int> concurrent_{0}, max_concurrent_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> workers_;
  std::map<std::string, int> seen_;
  std::map<std::string, std::string> files_;
  std::map<std::string, int> delays_;
  std::vector<std::string> heads_;
};

HttpOptions Fast() {
  HttpOptions o;
  o.timeout_s = 10;
  return o;
}

TEST_CASE("http: bodies, ranges, retries and the errors that are not retried", "[io]") {
  TestServer server;
  HttpCounters counters;
  std::vector<uint8_t> out;
  REQUIRE(HttpFetch(server.url("/ok/1000"), 0, 0, Fast(), &out, &counters).ok());
  CHECK(std::string(out.begin(), out.end()) == Body(1000));
  REQUIRE(HttpFetch(server.url("/ok/1000"), 100, 50, Fast(), &out, &counters).ok());
  CHECK(std::string(out.begin(), out.end()) == Body(1000).substr(100, 50));
  REQUIRE(HttpFetch(server.url("/flaky/300"), 0, 0, Fast(), &out, &counters).ok());
  CHECK(std::string(out.begin(), out.end()) == Body(300));
  REQUIRE(HttpFetch(server.url("/reset/200"), 0, 0, Fast(), &out, &counters).ok());
  CHECK(counters.retries.load() >= 1);
  const absl::Status missing = HttpFetch(server.url("/missing"), 0, 0, Fast(), &out, &counters);
  CHECK(absl::IsNotFound(missing));
  CHECK_THAT(std::string(missing.message()), Catch::Contains("/missing: HTTP 404"));
  CHECK(absl::IsPermissionDenied(HttpFetch(server.url("/forbidden"), 0, 0, Fast(), &out)));
  CHECK(counters.failures.load() == 0);
  CHECK(counters.in_flight.load() == 0);
  // Credentials and query strings never reach a message.
  const std::string secret = absl::StrCat("http://me:hunter2@127.0.0.1:", 1, "/x?sig=s3cr3t");
  CHECK(RedactUrl(secret) == "http://127.0.0.1:1/x");
  HttpOptions quick = Fast();
  quick.timeout_s = 3;
  const absl::Status dead = HttpFetch(secret, 0, 0, quick, &out);
  CHECK(!dead.ok());
  CHECK(std::string(dead.message()).find("hunter2") == std::string::npos);
  CHECK(std::string(dead.message()).find("s3cr3t") == std::string::npos);
}

// Writes each record's bytes (up to 4 KiB) as the sample.
class BytesTransform final : public SampleTransform {
 public:
  const Schema& schema() const override { return schema_; }
  absl::Status Apply(const Record& r, const SampleContext&, WorkerState*,
                     SampleWriter& out) const override {
    return out.Write(0, {int64_t(r.bytes.size())}, r.bytes.data());
  }

 private:
  Schema schema_{Field("bytes", DType::kUint8, {Dim::UpTo(4096)}).collate(Collate::kRagged)};
};

TEST_CASE("http: a loader reads every URL once with many requests in flight", "[io]") {
  TestServer server;
  testing::TempDir dir;
  std::string list;
  const int n = 120;
  for (int i = 0; i < n; ++i) {
    // Every third sample fails once (503 or a reset) before it is served.
    const char* kind = i % 3 == 0 ? "flaky" : i % 3 == 1 ? "reset" : "ok";
    list +=
        absl::StrCat(server.url(absl::StrCat("/", kind, "/", i, "/", 100 + i)), " ", i % 4, "\n");
  }
  testing::WriteFile(dir.path() + "/urls.txt", list);
  auto files = FileDataset::Open(dir.path() + "/urls.txt");
  REQUIRE(files.ok());
  CHECK((*files)->Describe(0).find("http://127.0.0.1:") == 0);
  // (No epoch head start: its reads would be in flight at the end.)
  auto loader = Loader::Create(
      *files, std::make_shared<BytesTransform>(),
      LoaderOptions().batch_size(8).io_depth(6).workers(2).seed(4).epoch_head_start(false));
  REQUIRE(loader.ok());
  std::vector<int> seen(size_t(n), 0);
  for (auto& b : **loader) {
    REQUIRE(b.ok());
    const TensorView v = b->field("bytes");
    for (int64_t k = 0; k < b->size(); ++k) {
      const int64_t i = b->indices()[k];
      const std::string got(static_cast<const char*>(v.data) + v.offsets[k],
                            static_cast<const char*>(v.data) + v.offsets[k + 1]);
      REQUIRE(got == Body(100 + int(i)));
      ++seen[size_t(i)];
    }
  }
  for (int s : seen) REQUIRE(s == 1);
  const RemoteStats r = (*loader)->stats().remote;
  CHECK(r.remote);
  CHECK(r.failures == 0);
  CHECK(r.retries >= 1);
  CHECK(r.in_flight == 0);
}

// The reader threads of this process (named feedline-read).
int ReaderThreads() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    n += name == "feedline-read";
  }
  return n;
}

TEST_CASE("http: requests in flight are the I/O depth, without a thread per request", "[io]") {
  TestServer server;
  testing::TempDir dir;
  std::string list;
  const int n = 160;
  for (int i = 0; i < n; ++i) {
    list += absl::StrCat(server.url(absl::StrCat("/slow/", i, "/", 50 + i)), " 0\n");
  }
  testing::WriteFile(dir.path() + "/urls.txt", list);
  auto files = FileDataset::Open(dir.path() + "/urls.txt");
  REQUIRE(files.ok());
  REQUIRE((*files)->async_reads());
  // (No epoch head start: its reads would be in flight at the end.)
  auto loader = Loader::Create(
      *files, std::make_shared<BytesTransform>(),
      LoaderOptions().batch_size(16).io_depth(16).workers(1).epoch_head_start(false));
  REQUIRE(loader.ok());
  int64_t seen = 0;
  int readers = 0;
  for (auto& b : **loader) {
    REQUIRE(b.ok());
    const TensorView v = b->field("bytes");
    for (int64_t k = 0; k < b->size(); ++k) {
      const int64_t i = b->indices()[k];
      REQUIRE(std::string(static_cast<const char*>(v.data) + v.offsets[k],
                          static_cast<const char*>(v.data) + v.offsets[k + 1]) ==
              Body(50 + int(i)));
    }
    seen += b->size();
    readers = std::max(readers, ReaderThreads());
  }
  CHECK(seen == n);
  CHECK(server.max_concurrent() <= 16);
  CHECK(server.max_concurrent() >= 8);  // many at once (the bound, less the ring's admission)
  CHECK(readers == 1);
  CHECK((*loader)->stats().remote.in_flight == 0);
}

}  // namespace

TEST_CASE("http: a shard read by range gives the local shard's records, blocking and async",
          "[io]") {
  // The blocking read is what the retry reader uses under on_error="skip"; the asynchronous one
  // is the read stage's. Both against the same shard read from disk.
  TestServer server;
  feedline::testing::TempDir dir;
  std::vector<std::pair<std::string, std::string>> members;
  for (int k = 0; k < 12; ++k) {
    const std::string key = absl::StrCat("s", k);
    members.push_back({key + ".jpg", Body(100 + 37 * k)});
    members.push_back({key + ".cls", std::to_string(k % 3)});
    if (k % 4 == 0) members.push_back({key + ".json", absl::StrCat("{\"k\": ", k, "}")});
  }
  members.push_back({"empty.jpg", ""});
  members.push_back({"empty.cls", "1"});
  const std::string tar = feedline::testing::Tar(members);
  const std::string local = dir.path() + "/train.tar";
  feedline::testing::WriteFile(local, tar);
  server.serve_file("train.tar", tar);
  const std::string catalog = dir.path() + "/train.tar.idx";
  REQUIRE(feedline::WriteTarCatalog(local, local, catalog).ok());
  using feedline::TarDataset;
  for (TarDataset::Mode mode : {TarDataset::Mode::kImages, TarDataset::Mode::kMembers}) {
    auto on_disk = TarDataset::Open({local}, local, mode);
    REQUIRE(on_disk.ok());
    feedline::ShardSource remote;
    remote.url = server.url("/file/train.tar");
    remote.catalog = catalog;
    remote.shown = remote.url;
    auto by_range = TarDataset::Open({remote}, remote.url, mode, Fast());
    REQUIRE(by_range.ok());
    REQUIRE((*by_range)->async_reads());
    REQUIRE((*by_range)->size() == (*on_disk)->size());
    REQUIRE((*on_disk)->size() == 13);
    for (int64_t i = 0; i < (*on_disk)->size(); ++i) {
      INFO("sample " << i);
      feedline::Record want, blocking, async;
      REQUIRE((*on_disk)->Read(i, &want).ok());
      REQUIRE((*by_range)->Read(i, &blocking).ok());
      std::promise<absl::Status> done;
      (*by_range)->ReadAsync(i, &async, [&done](absl::Status s) { done.set_value(s); });
      REQUIRE(done.get_future().get().ok());
      for (const feedline::Record* got : {&blocking, &async}) {
        REQUIRE(got->bytes == want.bytes);
        REQUIRE(got->label == want.label);
        REQUIRE(got->members.size() == want.members.size());
        for (size_t m = 0; m < want.members.size(); ++m) {
          REQUIRE(got->members[m].name == want.members[m].name);
          REQUIRE(got->members[m].bytes == want.members[m].bytes);
        }
      }
    }
  }
}

}  // namespace feedline

namespace feedline {
namespace {

TEST_CASE("http: redirects stay on http(s); signed requests and their token never leave",
          "[io]") {
  TestServer a, b;
  std::vector<uint8_t> out;
  // A plain redirect to another host is followed.
  const std::string other = absl::StrCat("/redirect-to/", b.url("").substr(17), "/ok/30");
  REQUIRE(HttpFetch(a.url(other), 0, 0, Fast(), &out).ok());
  CHECK(std::string(out.begin(), out.end()) == Body(30));
  // A redirect to ftp:// is refused (libcurl would follow it by default).
  const absl::Status ftp = HttpFetch(a.url("/redirect-ftp"), 0, 0, Fast(), &out);
  CHECK(!ftp.ok());
  // A signed S3 request that is redirected to another host: an error, and that host never sees
  // the session token (a custom header, which libcurl would carry to any host).
  auto s3 = std::make_shared<S3Config>();
  s3->endpoint = a.url("");
  s3->region = "us-east-1";
  s3->access_key = "AKIDEXAMPLE";
  s3->secret_key = "SECRETKEYSECRET";
  s3->session_token = "TOKSECRET";
  HttpOptions o = Fast();
  o.s3 = s3;
  const int before = b.requests();
  const absl::Status st = HttpFetch(
      absl::StrCat("s3://bucket/redirect-to/", b.url("").substr(17), "/ok/30"), 0, 0, o, &out);
  CHECK(!st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("redirect"));
  CHECK(b.requests() == before);
  for (const std::string& head : b.heads()) {
    CHECK(head.find("TOKSECRET") == std::string::npos);
    CHECK(head.find("AKIDEXAMPLE") == std::string::npos);
  }
  // The signed request did go to the endpoint, with its token.
  bool signed_sent = false;
  for (const std::string& head : a.heads()) signed_sent |= head.find("TOKSECRET") != std::string::npos;
  CHECK(signed_sent);
}

// Sets (or, with nullptr, unsets) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST_CASE("cache: a folder others can write or plant is refused; user files are never evicted",
          "[io]") {
  TestServer server;
  testing::TempDir tmp;
  namespace fs = std::filesystem;
  {  // HOME and XDG_CACHE_HOME unset: the user's home from the password database, not /tmp
    ScopedEnv a("FEEDLINE_CACHE_DIR", nullptr), b("HOME", nullptr), c("XDG_CACHE_HOME", nullptr);
    const std::string dir = ShardCacheDir();
    CHECK(dir.rfind("/tmp", 0) != 0);
    CHECK_THAT(dir, Catch::EndsWith("/.cache/feedline/shards"));
  }
  {  // writable by others (a shared folder): refused, naming why
    const std::string shared = tmp.path() + "/shared";
    fs::create_directories(shared + "/shards");
    fs::permissions(shared + "/shards", fs::perms::all);
    ScopedEnv env("FEEDLINE_CACHE_DIR", shared.c_str());
    const absl::StatusOr<std::string> copy = LocalCopy(server.url("/ok/100"));
    REQUIRE(absl::IsPermissionDenied(copy.status()));
    CHECK_THAT(std::string(copy.status().message()), Catch::Contains("writable by others"));
  }
  {  // a symbolic link planted where the cache folder goes: refused, nothing written through it
    const std::string target = tmp.path() + "/elsewhere";
    fs::create_directories(target);
    fs::create_directories(tmp.path() + "/planted");
    fs::create_symlink(target, tmp.path() + "/planted/shards");
    ScopedEnv env("FEEDLINE_CACHE_DIR", (tmp.path() + "/planted").c_str());
    const absl::StatusOr<std::string> copy = LocalCopy(server.url("/ok/100"));
    REQUIRE(absl::IsPermissionDenied(copy.status()));
    CHECK_THAT(std::string(copy.status().message()), Catch::Contains("symbolic link"));
    CHECK(fs::is_empty(target));
  }
  {  // a private folder: made 0700; the copy is whole, 0600, no part file left; a user's own
     // file in the folder survives a budget of 0
    const std::string mine = tmp.path() + "/mine";
    ScopedEnv env("FEEDLINE_CACHE_DIR", mine.c_str());
    ScopedEnv budget("FEEDLINE_SHARD_CACHE_BYTES", "0");
    REQUIRE(EnsurePrivateDir(mine + "/shards").ok());
    CHECK((fs::status(mine + "/shards").permissions() & fs::perms::all) == fs::perms::owner_all);
    testing::WriteFile(mine + "/shards/notes.txt", "the user's own");
    testing::WriteFile(mine + "/shards/old.part", "the user's own too");
    for (int k = 0; k < 2; ++k) {
      const absl::StatusOr<std::string> copy = LocalCopy(server.url(absl::StrCat("/ok/", 100 + k)));
      REQUIRE(copy.ok());
      CHECK(testing::ReadFile(*copy) == Body(100 + k));
      CHECK((fs::status(*copy).permissions() & fs::perms::all) ==
            (fs::perms::owner_read | fs::perms::owner_write));
    }
    CHECK(testing::ReadFile(mine + "/shards/notes.txt") == "the user's own");
    CHECK(fs::exists(mine + "/shards/old.part"));
    for (const auto& e : fs::directory_iterator(mine + "/shards")) {
      const std::string name = e.path().filename().string();
      CHECK((name == "old.part" || name.find(".part") == std::string::npos));
    }
  }
}

TEST_CASE("cache: a cached shard shorter than its catalog is fetched again, never served",
          "[io]") {
  TestServer server;
  testing::TempDir tmp;
  ScopedEnv env("FEEDLINE_CACHE_DIR", tmp.path().c_str());
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 8; ++i) {
    members.emplace_back(absl::StrCat("k", i, ".txt"), std::string(1000 + i, char('a' + i)));
  }
  const std::string tar = testing::Tar(members);
  server.serve_file("s.tar", tar);
  const std::string url = server.url("/file/s.tar");
  auto first = PrepareRemoteShards({url}, Fast());
  REQUIRE(first.ok());
  const std::string cached = (*first)[0].path;
  REQUIRE(!cached.empty());
  REQUIRE(testing::ReadFile(cached) == tar);
  // Cut at a member boundary (what a crash can leave), then in the middle of a member.
  for (size_t cut : {size_t(512 + 1024) * 4, size_t(3000)}) {
    INFO("cut to " << cut);
    std::filesystem::resize_file(cached, cut);
    auto again = PrepareRemoteShards({url}, Fast());
    REQUIRE(again.ok());
    CHECK(testing::ReadFile((*again)[0].path) == tar);
    auto ds = TarDataset::Open(*again, url, TarDataset::Mode::kMembers, Fast());
    REQUIRE(ds.ok());
    CHECK((*ds)->size() == 8);
  }
}

// Eight members of distinct bytes ("k<i>.txt"), as one tar; `fill` varies the content, not the
// layout.
std::string EightMembers(char fill = 'a') {
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 8; ++i) {
    members.emplace_back(absl::StrCat("k", i, ".txt"), std::string(1000 + i, char(fill + i)));
  }
  return testing::Tar(members);
}

// Every sample of `ds` read whole (kMembers), its members' bytes joined.
std::vector<std::string> ReadAll(const TarDataset& ds) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < ds.size(); ++i) {
    Record r;
    const absl::Status st = ds.Read(i, &r);
    INFO(st.ToString());
    REQUIRE(st.ok());
    std::string joined;
    for (const auto& m : r.members) joined += std::string(m.bytes.begin(), m.bytes.end());
    out.push_back(joined);
  }
  return out;
}

TEST_CASE("cache: a planted file, a changed copy and a damaged catalog are never served", "[io]") {
  TestServer server;
  testing::TempDir tmp;
  ScopedEnv env("FEEDLINE_CACHE_DIR", tmp.path().c_str());
  const std::string tar = EightMembers();
  server.serve_file("s.tar", tar);
  const std::string url = server.url("/file/s.tar");
  auto first = PrepareRemoteShards({url}, Fast());
  REQUIRE(first.ok());
  const ShardSource src = (*first)[0];
  REQUIRE(testing::ReadFile(src.path) == tar);
  auto reference = TarDataset::Open(*first, url, TarDataset::Mode::kMembers, Fast());
  REQUIRE(reference.ok());
  const std::vector<std::string> want = ReadAll(**reference);
  REQUIRE(want.size() == 8);

  SECTION("a file planted at the shard's name, without its catalog, is fetched again") {
    std::filesystem::remove(src.catalog);
    testing::WriteFile(src.path, EightMembers('A'));  // same names, other bytes
    auto again = PrepareRemoteShards({url}, Fast());
    REQUIRE(again.ok());
    CHECK(testing::ReadFile((*again)[0].path) == tar);
  }
  SECTION("a copy changed after it was catalogued is dropped, its samples read from the source") {
    std::string changed = tar;
    changed.replace(512 + 10, 5, "ZZZZZ");  // inside k0.txt's data, the size unchanged
    testing::WriteFile(src.path, changed);
    auto again = PrepareRemoteShards({url}, Fast());
    REQUIRE(again.ok());
    REQUIRE((*again)[0].path == src.path);  // same size, same source: it looks fine
    auto ds = TarDataset::Open(*again, url, TarDataset::Mode::kMembers, Fast());
    REQUIRE(ds.ok());
    CHECK(ReadAll(**ds) == want);
    CHECK((*ds)->remote_stats().damaged_copies == 1);
    CHECK(!std::filesystem::exists(src.path));  // removed: never read again
    auto refetched = PrepareRemoteShards({url}, Fast());
    REQUIRE(refetched.ok());
    CHECK(testing::ReadFile((*refetched)[0].path) == tar);
    // In image mode too, through the asynchronous path of a shard read by range.
  }
  SECTION("a catalog cut, changed, of an older version or of another source is fetched again") {
    const std::string good = testing::ReadFile(src.catalog);
    std::string flipped = good;
    flipped[flipped.size() / 2] ^= 0x20;
    // A whole catalog of the same bytes, made for another URL (an entry copied over this one).
    const std::string elsewhere = tmp.path() + "/elsewhere.idx";
    REQUIRE(WriteTarCatalog(src.path, "http://elsewhere/s.tar", elsewhere).ok());
    const std::string other_source = testing::ReadFile(elsewhere);
    for (const std::string& bad :
         {good.substr(0, good.size() - 10), flipped, other_source,
          std::string("feedline-tar-catalog 2\netag \n1\n0 1000 6 -1\nk0.txt\n")}) {
      testing::WriteFile(src.catalog, bad);
      CHECK(SummarizeTarCatalog(src.catalog).bytes ==
            (bad == other_source ? int64_t(tar.size()) : int64_t(-1)));
      const int before = server.requests();
      auto again = PrepareRemoteShards({url}, Fast());
      REQUIRE(again.ok());
      CHECK(server.requests() >= before + 1);
      CHECK(testing::ReadFile(src.catalog) == good);
      CHECK(testing::ReadFile((*again)[0].path) == tar);
    }
  }
}

TEST_CASE("cache: a shard changed on a server without validators is noticed", "[io]") {
  TestServer server;
  testing::TempDir tmp;
  ScopedEnv env("FEEDLINE_CACHE_DIR", tmp.path().c_str());
  ScopedEnv budget("FEEDLINE_SHARD_CACHE_BYTES", "0");  // no copies: every read by range
  server.serve_file("s.tar", EightMembers());
  const std::string url = server.url("/file/s.tar");
  auto first = PrepareRemoteShards({url}, Fast());
  REQUIRE(first.ok());
  REQUIRE((*first)[0].path.empty());
  for (TarDataset::Mode mode : {TarDataset::Mode::kMembers, TarDataset::Mode::kImages}) {
    if (mode == TarDataset::Mode::kImages) {
      // Images: one sample per key with a .jpg and a .cls; read asynchronously.
      server.serve_file("i.tar", testing::Tar({{"a.jpg", std::string(3000, 'j')}, {"a.cls", "1"}}));
      const std::string iurl = server.url("/file/i.tar");
      auto sources = PrepareRemoteShards({iurl}, Fast());
      REQUIRE(sources.ok());
      auto ds = TarDataset::Open(*sources, iurl, mode, Fast());
      REQUIRE(ds.ok());
      REQUIRE((*ds)->async_reads());
      server.serve_file("i.tar", testing::Tar({{"a.jpg", std::string(3000, 'k')}, {"a.cls", "1"}}));
      Record r;
      std::promise<absl::Status> done;
      (*ds)->ReadAsync(0, &r, [&done](absl::Status s) { done.set_value(s); });
      const absl::Status st = done.get_future().get();
      CHECK(absl::IsDataLoss(st));
      CHECK_THAT(std::string(st.message()),
                 Catch::Contains("a.jpg") && Catch::Contains("changed on the server"));
      continue;
    }
    auto ds = TarDataset::Open(*first, url, mode, Fast());
    REQUIRE(ds.ok());
    // Rewritten with the same layout and size: before, range reads returned the new bytes as
    // if they were the catalogued ones (other samples' bytes, stale labels).
    server.serve_file("s.tar", EightMembers('A'));
    Record r;
    const absl::Status st = (*ds)->Read(3, &r);
    CHECK(absl::IsDataLoss(st));
    CHECK_THAT(std::string(st.message()),
               Catch::Contains("k3.txt") && Catch::Contains("changed on the server"));
    CHECK(!std::filesystem::exists((*first)[0].catalog));  // the next open fetches it again
  }
  // Another size: the open's HEAD notices it (no validator to compare), and fetches it again.
  auto again = PrepareRemoteShards({url}, Fast());
  REQUIRE(again.ok());
  const std::string longer = testing::Tar({{"x.txt", std::string(5000, 'x')}});
  server.serve_file("s.tar", longer);
  auto third = PrepareRemoteShards({url}, Fast());
  REQUIRE(third.ok());
  CHECK(SummarizeTarCatalog((*third)[0].catalog).bytes == int64_t(longer.size()));
}

TEST_CASE("cache: downloads hold the byte budget as they go, other data sets' files first",
          "[io]") {
  TestServer server;
  testing::TempDir tmp;
  ScopedEnv env("FEEDLINE_CACHE_DIR", tmp.path().c_str());
  const std::string tar = EightMembers();
  const int64_t shard = int64_t(tar.size());
  // Another data set's two shards, cached first.
  std::vector<std::string> old_urls, urls;
  for (int k = 0; k < 2; ++k) {
    server.serve_file(absl::StrCat("old", k, ".tar"), tar);
    old_urls.push_back(server.url(absl::StrCat("/file/old", k, ".tar")));
  }
  auto old = PrepareRemoteShards(old_urls, Fast());
  REQUIRE(old.ok());
  // Twelve shards, each served after 150 ms, within a budget of two and a half.
  for (int k = 0; k < 12; ++k) {
    server.serve_file(absl::StrCat("s", k, ".tar"), tar, 150);
    urls.push_back(server.url(absl::StrCat("/file/s", k, ".tar")));
  }
  const std::string bytes = std::to_string(shard * 5 / 2);
  ScopedEnv budget("FEEDLINE_SHARD_CACHE_BYTES", bytes.c_str());
  const std::string dir = tmp.path() + "/shards";
  std::atomic<bool> done{false};
  int64_t peak = 0;  // the shard bytes on disk (downloads in progress included), at most
  std::thread watch([&] {
    while (!done) {
      int64_t now = 0;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (absl::EndsWith(name, ".idx") || absl::EndsWith(name, ".lock")) continue;
        std::error_code e2;
        now += int64_t(e.file_size(e2));
      }
      peak = std::max(peak, now);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto opened = PrepareRemoteShards(urls, Fast());
  done = true;
  watch.join();
  REQUIRE(opened.ok());
  // The budget plus the four downloads in flight, never the whole data set (12 shards).
  CHECK(peak <= shard * 5 / 2 + 4 * shard);
  int kept = 0;
  for (const ShardSource& s : *opened) {
    kept += !s.path.empty();
    CHECK(SummarizeTarCatalog(s.catalog).bytes == shard);  // every shard catalogued
  }
  CHECK(kept == 2);
  for (const ShardSource& s : *old) CHECK(!std::filesystem::exists(s.path));  // evicted first
  auto ds = TarDataset::Open(*opened, "", TarDataset::Mode::kMembers, Fast());
  REQUIRE(ds.ok());
  CHECK((*ds)->size() == 12 * 8);
}

TEST_CASE(
    "records: a body, a file or a member above max_record_bytes fails before it is read "
    "whole; bodies in flight share a bound",
    "[io]") {
  TestServer server;
  testing::TempDir dir;
  ReadLimits limits;
  limits.read_timeout_ms = 20000;
  limits.max_record_bytes = 1 << 20;
  limits.in_flight_bytes = int64_t{64} << 20;
  // An endless body: a record error naming the URL and the limit, not 1 GiB per read.
  testing::WriteFile(dir.path() + "/urls.txt", absl::StrCat(server.url("/endless/a"), " 0\n",
                                                            server.url("/ok/5000"), " 1\n"));
  auto files = FileDataset::Open(dir.path() + "/urls.txt", {}, limits);
  REQUIRE(files.ok());
  Record r;
  const absl::Status endless = (*files)->Read(0, &r);
  CHECK(absl::IsResourceExhausted(endless));
  CHECK_THAT(std::string(endless.message()),
             Catch::Contains("/endless/a") && Catch::Contains("max_record_bytes"));
  REQUIRE((*files)->Read(1, &r).ok());
  CHECK(r.bytes.size() == 5000);
  // Three endless bodies at once, each allowed 16 MiB, all three within 4 MiB together.
  limits.max_record_bytes = 16 << 20;
  limits.in_flight_bytes = 4 << 20;
  testing::WriteFile(dir.path() + "/three.txt",
                     absl::StrCat(server.url("/endless/1"), " 0\n", server.url("/endless/2"),
                                  " 0\n", server.url("/endless/3"), " 0\n"));
  auto three = FileDataset::Open(dir.path() + "/three.txt", {}, limits);
  REQUIRE(three.ok());
  std::vector<Record> records(3);
  std::vector<std::promise<absl::Status>> done(3);
  for (int i = 0; i < 3; ++i) {
    (*three)->ReadAsync(i, &records[size_t(i)],
                        [&done, i](absl::Status s) { done[size_t(i)].set_value(s); });
  }
  int over_flight = 0;
  for (int i = 0; i < 3; ++i) {
    const absl::Status s = done[size_t(i)].get_future().get();
    INFO(s.ToString());
    CHECK(absl::IsResourceExhausted(s));
    over_flight += absl::StrContains(s.message(), "in flight");
  }
  CHECK(over_flight >= 1);  // the shared bound, not each record's
  // A local file and a shard member above the limit: named, and nothing allocated for them.
  limits.max_record_bytes = 1 << 20;
  testing::WriteFile(dir.path() + "/big.bin", std::string((1 << 20) + 1, 'b'));
  testing::WriteFile(dir.path() + "/list.txt", dir.path() + "/big.bin 0\n");
  auto local = FileDataset::Open(dir.path() + "/list.txt", {}, limits);
  REQUIRE(local.ok());
  const absl::Status big = (*local)->Read(0, &r);
  CHECK(absl::IsResourceExhausted(big));
  CHECK_THAT(std::string(big.message()),
             Catch::Contains("big.bin") && Catch::Contains("max_record_bytes"));
  testing::WriteFile(dir.path() + "/s.tar",
                     testing::Tar({{"a.jpg", std::string((1 << 20) + 1, 'j')},
                                   {"a.cls", "0"},
                                   {"b.jpg", "small"},
                                   {"b.cls", "1"}}));
  auto shard = FileDataset::Open(dir.path() + "/s.tar", {}, limits);
  REQUIRE(shard.ok());
  const absl::Status member = (*shard)->Read(0, &r);
  CHECK(absl::IsResourceExhausted(member));
  CHECK_THAT(std::string(member.message()),
             Catch::Contains("s.tar:a") && Catch::Contains("max_record_bytes"));
  REQUIRE((*shard)->Read(1, &r).ok());
  CHECK(std::string(r.bytes.begin(), r.bytes.end()) == "small");
}

TEST_CASE("s3 listing: a server that repeats a token or never lists a key is an error",
          "[io]") {
  TestServer server;
  HttpOptions o = Fast();
  auto s3 = std::make_shared<S3Config>();
  s3->endpoint = server.url("");
  s3->region = "us-east-1";
  o.s3 = s3;
  const absl::StatusOr<S3Listing> loop = S3List("bucket", "train/", false, o);
  REQUIRE(absl::IsDataLoss(loop.status()));
  CHECK_THAT(std::string(loop.status().message()), Catch::Contains("repeats a continuation"));
  CHECK(server.requests() == 2);
  const absl::StatusOr<S3Listing> empty = S3List("bucket", "empty/", false, o);
  REQUIRE(absl::IsDataLoss(empty.status()));
  CHECK(server.requests() <= 2 + 100);
}

TEST_CASE("brace ranges: the product is bounded before anything is made", "[io]") {
  auto two = ExpandBraces("s3://b/x-{0000..0002}-{00..01}.tar");
  REQUIRE(two.ok());
  CHECK(*two == std::vector<std::string>{"s3://b/x-0000-00.tar", "s3://b/x-0000-01.tar",
                                         "s3://b/x-0001-00.tar", "s3://b/x-0001-01.tar",
                                         "s3://b/x-0002-00.tar", "s3://b/x-0002-01.tar"});
  CHECK(ExpandBraces("d/train-{000000..999999}.tar").ok());  // a million: the bound itself
  const auto t0 = std::chrono::steady_clock::now();
  // Two ranges of 3,000 (9M names) and three of 200: refused at once, naming the count.
  const auto product = ExpandBraces("https://u:pw@h/{0000..2999}/{0000..2999}.tar?sig=S");
  REQUIRE(absl::IsInvalidArgument(product.status()));
  CHECK_THAT(std::string(product.status().message()), Catch::Contains("9000000 names"));
  CHECK(std::string(product.status().message()).find("pw") == std::string::npos);
  CHECK(absl::IsInvalidArgument(ExpandBraces("{000..199}{000..199}{000..199}").status()));
  // A long pattern: bounded in bytes as well.
  const std::string long_name(4096, 'x');
  CHECK(absl::IsInvalidArgument(ExpandBraces(long_name + "{000000..099999}").status()));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(absl::IsInvalidArgument(ExpandBraces("d/{5..3}.tar").status()));
  CHECK(absl::IsInvalidArgument(ExpandBraces("d/{0..99999999999999999999}.tar").status()));
}

TEST_CASE("ShownName: no byte of a password or a signature survives", "[io]") {
  // Passwords with every delimiter a URL parser could stop at, unencoded as users write them.
  const std::vector<std::string> passwords = {
      "s3cr3tPW",       "pa/ssQQ",    "pa?ssQQ",      "pa#ssQQ",     "pa@ssQQ",
      "p:a:sQQ",        "QQ/?#@:x",   "//QQzz",       "QQ@@host",    "QQ1234",
      "QQ%2Fenc",       "QQ\x1b[31m", "QQ word sp",   "@QQ/a?b#c@d"};
  const std::vector<std::string> paths = {"", "/", "/a/b.jpg", "/a@2x/b.png", "/x?q=1",
                                          "/s#frag"};
  for (const std::string& scheme : {std::string("http"), std::string("https"),
                                    std::string("s3")}) {
    for (const std::string& pw : passwords) {
      for (const std::string& host : {std::string("host"), std::string("10.0.0.1:8080")}) {
        for (const std::string& path : paths) {
          const std::string url = scheme + "://alice:" + pw + "@" + host + path +
                                  "?X-Amz-Signature=SIGSIGSIG&X-Amz-Security-Token=TOKTOK";
          const std::string shown = ShownName(url);
          INFO(url << " -> " << shown);
          CHECK(shown.find("QQ") == std::string::npos);
          CHECK(shown.find("alice") == std::string::npos);
          CHECK(shown.find("SIG") == std::string::npos);
          CHECK(shown.find("TOK") == std::string::npos);
          CHECK(shown.find('\x1b') == std::string::npos);
          CHECK(shown.rfind(scheme + "://", 0) == 0);
        }
      }
    }
  }
  // What is not a credential stays, so that the message still names the file.
  CHECK(ShownName("https://host:8443/a/b.jpg") == "https://host:8443/a/b.jpg");
  CHECK(ShownName("https://host/img@2x.png?sig=1") == "https://host/img@2x.png");
  CHECK(ShownName("https://bob@host/a") == "https://host/a");
  CHECK(ShownName("https://bob:pw@host/a#x") == "https://host/a");
  CHECK(ShownName("/data/train/cat/1.jpg") == "/data/train/cat/1.jpg");
  CHECK(ShownName("/data/dir?/1.jpg") == "/data/dir?/1.jpg");  // a path, not a URL
  CHECK(ShownName("shard-\x1b[2J\n.tar") == "shard-\\x1b[2J\\x0a.tar");
  CHECK(ShownName("caf\xc3\xa9.jpg") == "caf\xc3\xa9.jpg");  // UTF-8 kept
}

}  // namespace
}  // namespace feedline
