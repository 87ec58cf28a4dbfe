// libFuzzer target: what an HTTP server hands the client (io/http.h). The input is the raw bytes
// a server on loopback sends back to every request it gets (status line, headers — ETag,
// Last-Modified, Content-Length, Content-Range, Location, Transfer-Encoding — and body), then
// it closes the connection: a fake transport below libcurl, so that the response parsing,
// redirects, retries, range checks, validators and body bounds all run as in production.
// The server is also every request's proxy, so a redirect to any host comes back to it.
// Which call is made comes from a hash of the input: a whole GET, a range read, the same
// asynchronously, a HEAD (HttpHead), a download to a file (HttpDownload), or a signed s3://
// read. Properties: no crash, no hang; no error message carries a byte of the URL's password,
// its signature or the S3 secrets; no request that a redirect sent to another host carries the
// URL's credentials, and a signed request follows no redirect at all; nothing from another
// scheme (file://) is read; a range read returns exactly its length; a body is at most the
// record limit; the bytes counted in flight return to 0; a failed download leaves no file.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuzz_util.h"
#include "io/http.h"

namespace {

// Serves the current response to every request, one per connection, on 127.0.0.1.
class FakeServer {
 public:
  FakeServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(fd_, 64) != 0) {
      feedline::fuzz::Fail("the fake server cannot listen");
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    std::thread([this] { Loop(); }).detach();  // lives as long as the process
  }
  int port() const { return port_; }
  void Set(std::string response) {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = std::move(response);
    requests_.clear();
  }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Loop() {
    for (;;) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      timeval tv{2, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        head.append(buf, size_t(n));
      }
      std::string response;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(head);
        response = response_;
      }
      for (size_t done = 0; done < response.size();) {
        const ssize_t n = ::send(c, response.data() + done, response.size() - done, MSG_NOSIGNAL);
        if (n <= 0) break;
        done += size_t(n);
      }
      ::shutdown(c, SHUT_WR);
      // Until the client closes (or 2 s): a reset before it has read would lose the bytes.
      while (::recv(c, buf, sizeof(buf), 0) > 0) {
      }
      ::close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::mutex mu_;
  std::string response_;
  std::vector<std::string> requests_;
};

constexpr const char* kPassword = "Pw-SECRET-q7";
constexpr const char* kSignature = "Sig-SECRET-z9";
constexpr int64_t kMaxBody = 256 << 10;

// The host a request was sent to, lowercased, without the port: from the request line (every
// request comes through the proxy, so it names an absolute URL, and the line comes first: a
// request cut at 64 KiB by the server still has it), else from the Host header.
std::string HostOf(const std::string& head) {
  const absl::string_view line = absl::string_view(head).substr(0, head.find("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() >= 2) {
    absl::string_view target = parts[1];
    const size_t scheme = target.find("://");
    if (scheme != absl::string_view::npos) {
      target.remove_prefix(scheme + 3);
      absl::string_view authority = target.substr(0, target.find_first_of("/?#"));
      const size_t at = authority.rfind('@');
      if (at != absl::string_view::npos) authority.remove_prefix(at + 1);
      if (absl::StartsWith(authority, "[")) {
        authority = authority.substr(0, authority.find(']') + 1);
      } else {
        authority = authority.substr(0, authority.find(':'));
      }
      return absl::AsciiStrToLower(authority);
    }
  }
  for (absl::string_view h : absl::StrSplit(head, "\r\n")) {
    if (h.size() > 5 && absl::EqualsIgnoreCase(h.substr(0, 5), "host:")) {
      std::string host(absl::StripAsciiWhitespace(h.substr(5)));
      return absl::AsciiStrToLower(host.substr(0, host.rfind(':')));
    }
  }
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;
  static FakeServer* server = [] {
    auto* s = new FakeServer();
    // Every request goes to the fake server, whatever host a redirect names (it is the proxy):
    // nothing leaves the machine, and each request's Host header is what it was sent to.
    const std::string proxy = absl::StrCat("http://127.0.0.1:", s->port());
    for (const char* name : {"http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"}) {
      ::setenv(name, proxy.c_str(), 1);
    }
    ::unsetenv("no_proxy");
    ::unsetenv("NO_PROXY");
    return s;
  }();
  static const std::string dir = [] {
    char tmpl[] = "/tmp/feedline-fuzz-http-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) feedline::fuzz::Fail("mkdtemp");
    return std::string(tmpl);
  }();
  const std::string response(reinterpret_cast<const char*>(data), size);
  server->Set(response);
  feedline::fuzz::InputHash hash(data, size);
  const int mode = hash.Range(0, 5);

  feedline::HttpOptions o;
  o.timeout_s = 3;
  o.connect_timeout_s = 1;
  o.max_attempts = hash.Range(1, 2);
  o.max_bytes = kMaxBody;
  o.max_held_bytes = hash.Bit() ? kMaxBody / 2 : 0;
  if (hash.Bit()) o.if_match = "\"v1\"";
  std::string url = absl::StrCat("http://fuzzuser:", kPassword, "@127.0.0.1:", server->port(),
                                 "/data/shard-0001.tar?X-Amz-Signature=", kSignature);
  if (mode == 5) {  // signed: an S3 endpoint on loopback, with a session token
    auto s3 = std::make_shared<feedline::S3Config>();
    s3->endpoint = absl::StrCat("http://127.0.0.1:", server->port());
    s3->region = "us-east-1";
    s3->access_key = "AKIDFUZZ";
    s3->secret_key = "Key-SECRET-k3";
    s3->session_token = "Token-SECRET-t5";
    o.s3 = s3;
    url = "s3://bucket/data/shard-0001.tar";
  }
  auto counters = std::make_shared<feedline::HttpCounters>();
  std::vector<uint8_t> out;
  absl::Status st;
  const int64_t offset = hash.Range(0, 4096), length = hash.Range(1, 8192);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = absl::StrCat(dir, "/download.tar");
  switch (mode) {
    case 0:
    case 5:
      st = feedline::HttpFetch(url, 0, 0, o, &out, counters.get());
      break;
    case 1:
      st = feedline::HttpFetch(url, offset, length, o, &out, counters.get());
      break;
    case 2: {
      std::promise<absl::Status> done;
      feedline::HttpFetchAsync(url, offset, length, o, &out, counters,
                               [&done](absl::Status s) { done.set_value(std::move(s)); });
      st = done.get_future().get();
      break;
    }
    case 3: {
      absl::StatusOr<feedline::HttpObject> head = feedline::HttpHead(url, o);
      st = head.status();
      if (head.ok()) FUZZ_CHECK(head->length >= -1, absl::StrCat(head->length));
      if (head.ok()) FUZZ_CHECK(head->validator.find('\n') == std::string::npos, head->validator);
      break;
    }
    case 4: {
      std::error_code ec;
      std::filesystem::remove(path, ec);
      std::string etag;
      st = feedline::HttpDownload(url, path, o, counters.get(), &etag);
      if (st.ok()) {
        const int64_t bytes = int64_t(std::filesystem::file_size(path, ec));
        FUZZ_CHECK(!ec && bytes <= kMaxBody, absl::StrCat(bytes));
      }
      // Whether it failed or not: no part file stays behind.
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        FUZZ_CHECK(!absl::EndsWith(e.path().string(), ".part"), e.path().string());
      }
      break;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (std::getenv("FEEDLINE_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "mode %d, %zu bytes, %zu request(s), %.3f s: %s\n", mode, out.size(),
                 server->requests().size(), seconds, st.ToString().c_str());
  }
  FUZZ_CHECK(seconds < 30, absl::StrCat(seconds, " s"));  // the deadline is 3 s
  FUZZ_CHECK(counters->held.load() == 0, absl::StrCat(counters->held.load(), " bytes held"));
  FUZZ_CHECK(counters->in_flight.load() == 0, "a request still counted in flight");
  if (st.ok() && (mode == 1 || mode == 2)) {
    FUZZ_CHECK(int64_t(out.size()) == length, absl::StrCat(out.size(), " for ", length));
  }
  if (st.ok() && (mode == 0 || mode == 5)) {
    FUZZ_CHECK(int64_t(out.size()) <= kMaxBody, absl::StrCat(out.size()));
  }
  // Nothing read from a redirect to another scheme (file:///etc/passwd), unless the server
  // itself sent those bytes.
  const std::string body(out.begin(), out.end());
  if (!absl::StrContains(response, "root:x:0:0")) {
    FUZZ_CHECK(!absl::StrContains(body, "root:x:0:0"), "a file:// redirect was followed");
  }
  // No secret in the message (unless the server itself wrote it into its reply).
  if (!absl::StrContains(response, "SECRET")) {
    FUZZ_CHECK(!absl::StrContains(st.message(), "SECRET"), std::string(st.message()));
  }
  // Credentials go only to the URL's own host; a signed request follows no redirect.
  for (const std::string& head : server->requests()) {
    const std::string host = HostOf(head);
    if (mode == 5) {
      FUZZ_CHECK(host == "127.0.0.1", head);
    } else if (host != "127.0.0.1") {
      FUZZ_CHECK(!absl::StrContains(absl::AsciiStrToLower(head), "authorization:"), head);
    }
    // Each of our secrets, unless the server's reply holds it itself (a redirect to a path that
    // spells it is the server's bytes, not ours).
    if (host != "127.0.0.1") {
      for (const char* secret : {kPassword, kSignature, "Key-SECRET-k3", "Token-SECRET-t5"}) {
        if (absl::StrContains(response, secret)) continue;
        FUZZ_CHECK(!absl::StrContains(head, secret), head);
      }
    }
  }
  return 0;
}
