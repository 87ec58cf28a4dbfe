#include "io/http.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/env.h"
#include "core/file_io.h"
#include "io/http_multi.h"
#include "io/list_file.h"

namespace feedline {
namespace {

using Clock = std::chrono::steady_clock;

// Where a body goes: a buffer, or a file (downloads).
struct Sink {
  std::vector<uint8_t>* out;
  int fd = -1;
  int64_t max_bytes;
  CURL* curl = nullptr;  // for the body's length
  int64_t written = 0;
  bool too_big = false;
  int write_errno = 0;
  // A body in memory (not a download) counts toward the bytes all responses in flight hold
  // (`held`, null: not counted), at most `max_held`; past it, `over_held`.
  std::atomic<int64_t>* held = nullptr;
  int64_t max_held = 0;
  bool over_held = false;
};

// Gives back what `sink` counted toward the responses in flight (an attempt that ends: its
// bytes are then the caller's, or gone).
void Release(Sink* sink) {
  if (sink->held != nullptr && sink->written > 0) {
    sink->held->fetch_sub(sink->written, std::memory_order_relaxed);
  }
  sink->held = nullptr;
}

size_t Write(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t bytes = size * n;
  if (sink->written + int64_t(bytes) > sink->max_bytes) {
    sink->too_big = true;
    return 0;  // aborts the transfer
  }
  if (sink->held != nullptr &&
      sink->held->fetch_add(int64_t(bytes), std::memory_order_relaxed) + int64_t(bytes) >
          sink->max_held) {
    sink->held->fetch_sub(int64_t(bytes), std::memory_order_relaxed);
    sink->over_held = true;
    return 0;
  }
  if (sink->fd >= 0) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t w = ::write(sink->fd, data + done, bytes - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        sink->write_errno = w < 0 ? errno : EIO;
        return 0;
      }
      done += size_t(w);
    }
  } else {
    curl_off_t length = -1;
    if (sink->written == 0 && sink->curl != nullptr &&
        curl_easy_getinfo(sink->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK &&
        length > 0) {
      // The body's length from its header, once: no reallocations (and copies) as it arrives.
      // (Capped: a header is the server's word, not bytes received.)
      sink->out->reserve(size_t(std::min<int64_t>({length, sink->max_bytes, int64_t{64} << 20})));
    }
    // As bytes (a memmove: from char, the insert was an element-by-element loop).
    const auto* p = reinterpret_cast<const uint8_t*>(data);
    sink->out->insert(sink->out->end(), p, p + bytes);
  }
  sink->written += int64_t(bytes);
  return bytes;
}

bool Transient(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

double Jitter(double max_s) {
  thread_local std::minstd_rand rng(
      uint32_t(std::hash<std::thread::id>()(std::this_thread::get_id()) ^
               uint64_t(Clock::now().time_since_epoch().count())));
  return std::uniform_real_distribution<double>(0.0, max_s)(rng);
}

}  // namespace

bool IsHttpUrl(const std::string& path) {
  return absl::StartsWith(path, "http://") || absl::StartsWith(path, "https://") || IsS3Url(path);
}
bool IsS3Url(const std::string& path) { return absl::StartsWith(path, "s3://"); }

namespace {

// ParseIniSection of a file's text ("" when it cannot be read).
std::map<std::string, std::string> IniSection(const std::string& path, const std::string& section) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseIniSection(text, section);
}

std::string PercentEncode(absl::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(char(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

std::string XmlUnescape(absl::string_view s) {
  return absl::StrReplaceAll(
      s, {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}});
}

// The text of every <tag>...</tag> in `xml`, in order (S3's responses: flat, well-formed).
std::vector<std::string> XmlAll(absl::string_view xml, absl::string_view tag) {
  std::vector<std::string> out;
  const std::string open = absl::StrCat("<", tag, ">"), close = absl::StrCat("</", tag, ">");
  for (size_t at = xml.find(open); at != absl::string_view::npos; at = xml.find(open, at)) {
    const size_t a = at + open.size(), b = xml.find(close, a);
    if (b == absl::string_view::npos) break;
    out.push_back(XmlUnescape(xml.substr(a, b - a)));
    at = b + close.size();
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> ParseIniSection(absl::string_view text,
                                                   const std::string& section) {
  std::map<std::string, std::string> out;
  bool inside = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::string_view v = absl::StripAsciiWhitespace(line);
    if (v.empty() || v.front() == '#' || v.front() == ';') continue;
    if (v.front() == '[') {
      std::string name(absl::StripAsciiWhitespace(v.substr(1, v.find(']') - 1)));
      inside = name == section;
      continue;
    }
    const size_t eq = v.find('=');
    if (inside && eq != absl::string_view::npos) {
      out[std::string(absl::StripAsciiWhitespace(v.substr(0, eq)))] =
          std::string(absl::StripAsciiWhitespace(v.substr(eq + 1)));
    }
  }
  return out;
}

S3Config LoadS3Config() {
  S3Config c;
  const std::string home = Env("HOME");
  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::string config_file = Env("AWS_CONFIG_FILE");
  if (config_file.empty() && !home.empty()) config_file = home + "/.aws/config";
  std::string creds_file = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (creds_file.empty() && !home.empty()) creds_file = home + "/.aws/credentials";
  auto config = IniSection(config_file, profile == "default" ? "default" : "profile " + profile);
  c.region = Env("AWS_REGION");
  if (c.region.empty()) c.region = Env("AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = config["region"];
  if (c.region.empty()) c.region = "us-east-1";
  c.endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = Env("AWS_ENDPOINT_URL");
  if (c.endpoint.empty()) c.endpoint = config["endpoint_url"];
  if (c.endpoint.empty()) c.endpoint = absl::StrCat("https://s3.", c.region, ".amazonaws.com");
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  c.access_key = Env("AWS_ACCESS_KEY_ID");
  c.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  if (c.access_key.empty()) {
    auto creds = IniSection(creds_file, profile);
    c.access_key = creds["aws_access_key_id"];
    c.secret_key = creds["aws_secret_access_key"];
    c.session_token = creds["aws_session_token"];
  }
  return c;
}

bool S3ToHttp(const S3Config& config, const std::string& s3_url, std::string* http_url) {
  if (!IsS3Url(s3_url)) return false;
  absl::string_view rest = absl::string_view(s3_url).substr(5);
  absl::string_view query;  // a request's own query (ListObjectsV2's), kept as it is
  if (const size_t q = rest.find('?'); q != absl::string_view::npos) {
    query = rest.substr(q);
    rest = rest.substr(0, q);
  }
  const size_t slash = rest.find('/');
  const absl::string_view bucket = rest.substr(0, slash);
  if (bucket.empty()) return false;
  const absl::string_view key = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  *http_url = absl::StrCat(config.endpoint, "/", bucket, "/", PercentEncode(key, true), query);
  return true;
}

namespace {

// One fetch in progress: its request, its attempts, and what to call when it ends. Created by
// StartFetch, driven by the loop's callbacks (OnDone, the retry timer), freed by Finish.
struct FetchOp {
  std::string shown, target, range, sigv4, ca_bundle;  // shown: the URL for messages
  int64_t offset = 0, length = 0;
  HttpOptions o;
  std::shared_ptr<const S3Config> s3;
  std::vector<uint8_t>* out = nullptr;
  int fd = -1;
  HttpCounters* counters = nullptr;
  std::shared_ptr<HttpCounters> counters_owner;  // async fetches keep their counters alive
  HttpObject* meta = nullptr;                    // receives the response's validator and length
  bool head = false;                             // a HEAD request (headers only)
  std::function<void(absl::Status)> done;

  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  Sink sink{nullptr, -1, 0};
  char error[CURL_ERROR_SIZE] = {0};
  Clock::time_point deadline, t0, started;
  bool heard = false;  // a response (status line or bytes) came, in any attempt
  absl::Status last;
  double backoff_s = 0.1;
  int attempt = 0;
  double timeout_s = 60;

  ~FetchOp() {
    curl_slist_free_all(headers);
    if (curl != nullptr) HttpMulti::Get().GiveEasy(curl);
  }
};

// Response headers: keeps the object's validator and length, of the last response (each status
// line starts afresh: redirects and retries overwrite them). The validator is the ETag; from a
// server that sends none, "lm:" and its Last-Modified date, which range reads then send as
// If-Unmodified-Since (a shard changed on such a server read stale offsets: other samples'
// bytes, stale labels). The length is Content-Length's, -1 without a valid one.
size_t Header(char* data, size_t size, size_t n, void* user) {
  auto* meta = static_cast<HttpObject*>(user);
  const absl::string_view line(data, size * n);
  auto value = [&](size_t name) {
    return std::string(absl::StripAsciiWhitespace(line.substr(name)));
  };
  if (absl::StartsWith(line, "HTTP/")) {
    *meta = HttpObject();
  } else if (line.size() > 5 && absl::EqualsIgnoreCase(line.substr(0, 5), "etag:")) {
    meta->validator = value(5);
  } else if (line.size() > 14 && absl::EqualsIgnoreCase(line.substr(0, 14), "last-modified:") &&
             (meta->validator.empty() || absl::StartsWith(meta->validator, kModifiedPrefix))) {
    meta->validator = absl::StrCat(kModifiedPrefix, value(14));
  } else if (line.size() > 15 && absl::EqualsIgnoreCase(line.substr(0, 15), "content-length:")) {
    int64_t length = -1;
    meta->length = absl::SimpleAtoi(value(15), &length) && length >= 0 ? length : -1;
  }
  return size * n;
}

void Finish(FetchOp* op, absl::Status status) {
  Release(&op->sink);
  std::function<void(absl::Status)> done = std::move(op->done);
  delete op;
  done(std::move(status));
}

void OnDone(FetchOp* op, CURLcode rc);

// "<url>: no answer within <seconds> s (<attempts> attempts; the last: <cause>)", the URL named
// once (the last attempt's error starts with it too). For the read's deadline and for a server
// silent past HttpOptions::silent_s.
std::string NoAnswer(const FetchOp& op, absl::string_view seconds, int attempts) {
  absl::string_view last = op.last.message();
  absl::ConsumePrefix(&last, absl::StrCat(op.shown, ": "));
  return absl::StrCat(op.shown, ": no answer within ", seconds, " s (", attempts, " attempts",
                      op.last.ok() ? "" : absl::StrCat("; the last: ", last), ")");
}

// Starts the next attempt, or finishes when the deadline has passed.
void Attempt(FetchOp* op) {
  ++op->attempt;
  const double left_s = std::chrono::duration<double>(op->deadline - Clock::now()).count();
  if (left_s <= 0) {
    return Finish(op, absl::DeadlineExceededError(
                          NoAnswer(*op, absl::StrCat(op->timeout_s), op->attempt - 1)));
  }
  op->out->clear();
  Release(&op->sink);  // the last attempt's bytes (cleared above)
  // Every attempt on a handle of its own (connections are the loop's, kept across handles):
  // libcurl before 8.2 keeps a pointer to the last stored header through curl_easy_reset, and
  // a reply whose first header line is a folded continuation then reads that freed header
  // (found by fuzz_http; Debian 12 ships 7.88).
  if (op->attempt > 1) {
    HttpMulti::Get().GiveEasy(op->curl);
    op->curl = HttpMulti::Get().TakeEasy();
    if (op->curl == nullptr) {
      return Finish(op, absl::InternalError(absl::StrCat(op->shown, ": curl_easy_init failed")));
    }
  }
  op->sink = Sink{op->out, op->fd, op->o.max_bytes, op->curl};
  if (op->fd < 0 && op->counters != nullptr && op->o.max_held_bytes > 0) {
    op->sink.held = &op->counters->held;
    op->sink.max_held = op->o.max_held_bytes;
  }
  if (op->fd >= 0 && (::ftruncate(op->fd, 0) != 0 || ::lseek(op->fd, 0, SEEK_SET) != 0)) {
    return Finish(op, ErrnoStatus(errno, op->shown, "truncate the download"));
  }
  op->error[0] = '\0';
  CURL* curl = op->curl;
  curl_easy_setopt(curl, CURLOPT_URL, op->target.c_str());
  if (op->headers != nullptr) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, op->headers);
  if (op->head) curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (op->meta != nullptr) {
    *op->meta = HttpObject();
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, op->meta);
  }
  if (op->s3 != nullptr) {
    if (!op->s3->access_key.empty()) {
      op->sigv4 = absl::StrCat("aws:amz:", op->s3->region, ":s3");
      curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, op->sigv4.c_str());
      curl_easy_setopt(curl, CURLOPT_USERNAME, op->s3->access_key.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, op->s3->secret_key.c_str());
    }
  }
  if (!op->ca_bundle.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, op->ca_bundle.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  // Only http(s), for the request and for every redirect (libcurl would follow one to ftp:// or
  // file://). A signed request (S3) follows no redirect at all: its session token is a custom
  // header, which libcurl carries to whatever host a redirect names; S3 redirects only a request
  // sent to the wrong region or endpoint, which is the user's to fix (the error says so).
  // Credentials in the URL (user:password@) never go to another host (UNRESTRICTED_AUTH off).
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_UNRESTRICTED_AUTH, 0L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, op->s3 != nullptr ? 0L : 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &op->sink);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, op->error);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   long(std::min(op->o.connect_timeout_s, left_s) * 1000) + 1);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(left_s * 1000) + 1);
  if (op->o.stall_s > 0) {  // a transfer that stalls this long fails (and is retried)
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, long(std::ceil(op->o.stall_s)));
  }
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "feedline/" FEEDLINE_VERSION);
  // libcurl's receive buffer, per transfer. 64 KiB rather than 256: a 100 KB image then comes
  // in two socket reads into the same hot 64 KiB instead of one into 100 KB of a buffer that
  // the transfers in flight (tens, with a remote store's latency) have long evicted from the
  // caches. nginx on the same cores, in-process A/B: + 20 ms, 80-120 reads in flight: 3.6-4.1%
  // more images/s, the loop's CPU 0.091-0.095 ms per image against 0.118-0.133; no latency:
  // +1.4%; 32 KiB was level with 64.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 64L * 1024);
  if (op->length > 0) {
    op->range = absl::StrCat(op->offset, "-", op->offset + op->length - 1);
    curl_easy_setopt(curl, CURLOPT_RANGE, op->range.c_str());
  }
  if (op->counters != nullptr) {
    op->counters->requests.fetch_add(1, std::memory_order_relaxed);
    op->counters->in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  op->t0 = Clock::now();
  HttpMulti::Get().Start(curl, [op](CURLcode rc) { OnDone(op, rc); });
}

// An attempt ended (on the loop's thread): the result, a retry after a back-off, or the error.
void OnDone(FetchOp* op, CURLcode rc) {
  HttpCounters* counters = op->counters;
  if (counters != nullptr) counters->in_flight.fetch_sub(1, std::memory_order_relaxed);
  long status = 0;
  curl_easy_getinfo(op->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 0 || op->sink.written > 0) op->heard = true;
  const std::string& shown = op->shown;
  std::vector<uint8_t>* out = op->out;
  bool retry = false;
  if (op->sink.write_errno != 0) {
    return Finish(op, ErrnoStatus(op->sink.write_errno, shown, "write the download"));
  }
  if (op->sink.too_big) {
    return Finish(op, absl::ResourceExhaustedError(
                          absl::StrCat(shown, ": a body larger than ", op->o.max_bytes,
                                       " bytes (the record limit, max_record_bytes)")));
  }
  if (op->sink.over_held) {
    return Finish(
        op, absl::ResourceExhaustedError(absl::StrCat(
                shown, ": the responses in flight would hold more than ", op->o.max_held_bytes,
                " bytes (half the memory budget): bodies that do not end?")));
  }
  if (rc != CURLE_OK) {
    op->last = absl::UnavailableError(
        absl::StrCat(shown, ": ", op->error[0] != '\0' ? op->error : curl_easy_strerror(rc)));
    retry = Transient(rc);
    if (!retry) return Finish(op, op->last);
  } else if (status == 200 || status == 206) {
    const int64_t offset = op->offset, length = op->length;
    if (length > 0 && status == 200) {  // the server sent the whole object
      if (int64_t(out->size()) < offset + length) {
        return Finish(
            op, absl::DataLossError(absl::StrCat(shown, ": ", out->size(),
                                                 " bytes, the range ends at ", offset + length)));
      }
      out->erase(out->begin() + offset + length, out->end());
      out->erase(out->begin(), out->begin() + offset);
    }
    if (length > 0 && int64_t(out->size()) != length) {
      return Finish(op, absl::DataLossError(absl::StrCat(shown, ": ", out->size(),
                                                         " bytes for a range of ", length)));
    }
    if (counters != nullptr) {
      counters->bytes.fetch_add(op->sink.written, std::memory_order_relaxed);
      counters->latency_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - op->t0).count(),
          std::memory_order_relaxed);
    }
    return Finish(op, absl::OkStatus());
  } else if (status == 404 || status == 410) {
    return Finish(op, absl::NotFoundError(absl::StrCat(shown, ": HTTP ", status, " (not found)")));
  } else if (status == 412 && !op->o.if_match.empty()) {
    const bool modified = absl::StartsWith(op->o.if_match, kModifiedPrefix);
    return Finish(op, absl::DataLossError(absl::StrCat(
                          shown, ": HTTP 412: the object changed since it was catalogued (",
                          modified ? "Last-Modified " : "ETag ",
                          absl::string_view(op->o.if_match)
                              .substr(modified ? kModifiedPrefix.size() : 0),
                          ")")));
  } else if (status == 401 || status == 403) {
    // S3 says why in its error document (InvalidAccessKeyId, SignatureDoesNotMatch, ...).
    const std::vector<std::string> code =
        XmlAll(absl::string_view(reinterpret_cast<const char*>(out->data()), out->size()), "Code");
    return Finish(
        op, absl::PermissionDeniedError(absl::StrCat(shown, ": HTTP ", status, " (access denied",
                                                     code.empty() ? "" : ": " + code[0], ")")));
  } else if (status >= 300 && status < 400 && op->s3 != nullptr) {
    return Finish(op, absl::FailedPreconditionError(absl::StrCat(
                          shown, ": HTTP ", status,
                          ": a signed request is not followed to where S3 redirects it (the "
                          "bucket is in another region or behind another endpoint: set "
                          "AWS_REGION or AWS_ENDPOINT_URL_S3)")));
  } else if (status == 408 || status == 429 || status >= 500) {
    op->last = absl::UnavailableError(absl::StrCat(shown, ": HTTP ", status));
    retry = true;
  } else {
    return Finish(op, absl::DataLossError(absl::StrCat(shown, ": HTTP ", status)));
  }
  if (!retry || op->attempt >= op->o.max_attempts) {
    if (counters != nullptr) counters->failures.fetch_add(1, std::memory_order_relaxed);
    return Finish(op, absl::UnavailableError(
                          absl::StrCat(op->last.message(), " (after ", op->attempt, " attempts)")));
  }
  const double silent_for = std::chrono::duration<double>(Clock::now() - op->started).count();
  if (op->o.silent_s > 0 && !op->heard && silent_for >= op->o.silent_s) {
    if (counters != nullptr) counters->failures.fetch_add(1, std::memory_order_relaxed);
    return Finish(op, absl::UnavailableError(
                          NoAnswer(*op, absl::StrCat(std::lround(silent_for)), op->attempt)));
  }
  if (counters != nullptr) counters->retries.fetch_add(1, std::memory_order_relaxed);
  const double wait_s =
      std::min(Jitter(op->backoff_s),
               std::max(0.0, std::chrono::duration<double>(op->deadline - Clock::now()).count()));
  op->backoff_s = std::min(op->backoff_s * 2, 5.0);
  HttpMulti::Get().After(wait_s, [op] { Attempt(op); });
}

// Starts fetching `url` into `out` or (fd >= 0) the file `fd` (rewritten at each attempt);
// `done` runs once, on the loop's thread or (errors found before any request) this one.
void StartFetch(const std::string& url, int64_t offset, int64_t length, const HttpOptions& o,
                std::vector<uint8_t>* out, int fd, HttpCounters* counters,
                std::function<void(absl::Status)> done,
                std::shared_ptr<HttpCounters> counters_owner = nullptr, HttpObject* meta = nullptr,
                bool head = false) {
  auto* op = new FetchOp;
  op->counters_owner = std::move(counters_owner);
  op->meta = meta;
  op->head = head;
  op->shown = ShownName(url);
  op->target = url;
  op->offset = offset;
  op->length = length;
  op->o = o;
  op->out = out;
  op->fd = fd;
  op->counters = counters;
  op->done = std::move(done);
  if (IsS3Url(url)) {
    op->s3 = o.s3 != nullptr ? o.s3 : std::make_shared<const S3Config>(LoadS3Config());
    if (!S3ToHttp(*op->s3, url, &op->target)) {
      return Finish(
          op, absl::InvalidArgumentError(absl::StrCat(op->shown, ": not an s3://bucket/key URL")));
    }
    // S3 wants the payload's hash; GETs have none to sign.
    op->headers = curl_slist_append(op->headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!op->s3->session_token.empty()) {
      op->headers = curl_slist_append(
          op->headers, absl::StrCat("x-amz-security-token: ", op->s3->session_token).c_str());
    }
  }
  if (absl::StartsWith(o.if_match, kModifiedPrefix)) {
    op->headers = curl_slist_append(
        op->headers,
        absl::StrCat("If-Unmodified-Since: ",
                     absl::string_view(o.if_match).substr(kModifiedPrefix.size()))
            .c_str());
  } else if (!o.if_match.empty()) {
    op->headers = curl_slist_append(op->headers, absl::StrCat("If-Match: ", o.if_match).c_str());
  }
  op->curl = HttpMulti::Get().TakeEasy();  // the loop initialised libcurl
  if (op->curl == nullptr) {
    return Finish(op, absl::InternalError(absl::StrCat(op->shown, ": curl_easy_init failed")));
  }
  // A private CA (an in-house object store): the bundle named by the conventions of curl's
  // tool and Python's requests (CURL_CA_BUNDLE), OpenSSL (SSL_CERT_FILE) or, for S3, the AWS
  // SDKs (AWS_CA_BUNDLE); else the system's.
  for (const char* var : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    if (op->s3 == nullptr && std::string_view(var) == "AWS_CA_BUNDLE") continue;
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      op->ca_bundle = v;
      break;
    }
  }
  op->timeout_s = o.timeout_s > 0 ? o.timeout_s : 60.0;
  op->started = Clock::now();
  op->deadline = op->started + std::chrono::microseconds(int64_t(op->timeout_s * 1e6));
  Attempt(op);
}

// StartFetch, waited for.
absl::Status Fetch(const std::string& url, int64_t offset, int64_t length, const HttpOptions& o,
                   std::vector<uint8_t>* out, int fd, HttpCounters* counters,
                   HttpObject* meta = nullptr, bool head = false) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
  };
  auto wait = std::make_shared<Wait>();
  StartFetch(
      url, offset, length, o, out, fd, counters,
      [wait](absl::Status s) {
        std::lock_guard<std::mutex> lock(wait->mu);
        wait->status = std::move(s);
        wait->done = true;
        wait->cv.notify_one();
      },
      nullptr, meta, head);
  std::unique_lock<std::mutex> lock(wait->mu);
  wait->cv.wait(lock, [&] { return wait->done; });
  // Moved out, not copied: the HTTP thread may drop the last reference to `wait` after this
  // returns, and a copy would share the status's heap part with it (its reference count lives
  // in uninstrumented Abseil code, where ThreadSanitizer cannot see the hand-off).
  absl::Status status = std::move(wait->status);
  return status;
}

}  // namespace

absl::StatusOr<HttpObject> HttpHead(const std::string& url, const HttpOptions& o) {
  std::vector<uint8_t> none;
  HttpObject meta;
  absl::Status s = Fetch(url, 0, 0, o, &none, -1, nullptr, &meta, /*head=*/true);
  if (!s.ok()) return s;
  return meta;
}

absl::Status HttpFetch(const std::string& url, int64_t offset, int64_t length, const HttpOptions& o,
                       std::vector<uint8_t>* out, HttpCounters* counters) {
  return Fetch(url, offset, length, o, out, -1, counters);
}

void HttpFetchAsync(const std::string& url, int64_t offset, int64_t length, const HttpOptions& o,
                    std::vector<uint8_t>* out, std::shared_ptr<HttpCounters> counters,
                    std::function<void(absl::Status)> done) {
  HttpCounters* raw = counters.get();
  StartFetch(url, offset, length, o, out, -1, raw, std::move(done), std::move(counters));
}

absl::Status HttpDownload(const std::string& url, const std::string& path, const HttpOptions& o,
                          HttpCounters* counters, std::string* etag) {
  // A part file of its own (processes of other ranks, or other loaders, may fetch the same file
  // at once; nobody can plant a link at its name), synced and renamed into place when whole.
  std::string part;
  absl::StatusOr<int> fd = CreatePartFile(path, &part);
  if (!fd.ok()) return fd.status();
  std::vector<uint8_t> unused;
  HttpObject meta;
  absl::Status s = Fetch(url, 0, 0, o, &unused, *fd, counters, &meta);
  if (etag != nullptr) *etag = meta.validator;
  if (!s.ok()) {
    ::close(*fd);
    ::unlink(part.c_str());
    return s;
  }
  return CommitPartFile(*fd, part, path);
}

absl::StatusOr<S3Listing> S3ListPages(const S3PageFetch& fetch, bool delimiter,
                                      const std::string& shown) {
  S3Listing out;
  std::string token;
  std::vector<uint8_t> page;
  // A listing must make progress: a continuation token seen before (a server that loops sent
  // 817 requests in 40 s) or a long run of empty truncated pages ends it with an error.
  absl::flat_hash_set<std::string> tokens;
  int empty_pages = 0;
  constexpr int kMaxEmptyPages = 100;
  for (;;) {
    page.clear();
    if (absl::Status s = fetch(token, &page); !s.ok()) return s;
    const absl::string_view xml(reinterpret_cast<const char*>(page.data()), page.size());
    const size_t before = out.keys.size() + out.prefixes.size();
    for (std::string& k : XmlAll(xml, "Key")) out.keys.push_back(std::move(k));
    if (delimiter) {
      for (const std::string& block : XmlAll(xml, "CommonPrefixes")) {
        for (std::string& p : XmlAll(block, "Prefix")) out.prefixes.push_back(std::move(p));
      }
    }
    const std::vector<std::string> truncated = XmlAll(xml, "IsTruncated");
    const std::vector<std::string> next = XmlAll(xml, "NextContinuationToken");
    if (truncated.empty() || truncated[0] != "true" || next.empty()) break;
    if (!tokens.insert(next[0]).second) {
      return absl::DataLossError(absl::StrCat(
          shown, ": the S3 listing repeats a continuation token (the server loops); ",
          out.keys.size(), " keys listed before it"));
    }
    empty_pages = out.keys.size() + out.prefixes.size() == before ? empty_pages + 1 : 0;
    if (empty_pages >= kMaxEmptyPages) {
      return absl::DataLossError(absl::StrCat(shown, ": the S3 listing sent ", kMaxEmptyPages,
                                              " truncated pages in a row without a key"));
    }
    token = next[0];
  }
  return out;
}

absl::StatusOr<S3Listing> S3List(const std::string& bucket, const std::string& prefix,
                                 bool delimiter, const HttpOptions& o) {
  HttpOptions options = o;
  if (options.s3 == nullptr) options.s3 = std::make_shared<const S3Config>(LoadS3Config());
  return S3ListPages(
      [&](const std::string& token, std::vector<uint8_t>* page) {
        // Via s3://bucket/?... so that the request is signed; the query carries the listing.
        std::string url =
            absl::StrCat("s3://", bucket, "/?list-type=2&prefix=", PercentEncode(prefix, false));
        if (delimiter) url += "&delimiter=%2F";
        if (!token.empty()) url += "&continuation-token=" + PercentEncode(token, false);
        return HttpFetch(url, 0, 0, options, page);
      },
      delimiter, ShownName(absl::StrCat("s3://", bucket, "/", prefix)));
}

absl::StatusOr<FileList> ScanS3ImageFolder(const std::string& url, const HttpOptions& options) {
  const absl::string_view rest = absl::string_view(url).substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  std::string prefix(slash == absl::string_view::npos ? "" : rest.substr(slash + 1));
  if (!prefix.empty() && prefix.back() != '/') prefix += '/';
  absl::StatusOr<S3Listing> top = S3List(bucket, prefix, /*delimiter=*/true, options);
  if (!top.ok()) return top.status();
  FileList ds;
  ds.kind = FileList::Kind::kImageFolder;
  ds.source = url;
  std::vector<std::string> classes = top->prefixes;
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    return absl::NotFoundError(absl::StrCat(
        url, ": no class prefixes found (an ImageFolder has one sub-folder per class)"));
  }
  for (size_t c = 0; c < classes.size(); ++c) {
    absl::StatusOr<S3Listing> keys = S3List(bucket, classes[c], /*delimiter=*/false, options);
    if (!keys.ok()) return keys.status();
    // torchvision walks sorted folders, and each folder's files sorted: by (folder, name).
    std::vector<std::pair<std::string, std::string>> files;
    for (const std::string& k : keys->keys) {
      if (k.empty() || k.back() == '/' || !HasImageExtension(k)) continue;
      const size_t cut = k.rfind('/');
      files.emplace_back(k.substr(0, cut), k.substr(cut + 1));
    }
    std::sort(files.begin(), files.end());
    std::string name = classes[c].substr(prefix.size());
    if (!name.empty() && name.back() == '/') name.pop_back();
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat(url, ": class '", name, "' has no image files"));
    }
    ds.classes.push_back(name);
    for (const auto& [dir, file] : files) {
      ds.samples.push_back(Sample{absl::StrCat("s3://", bucket, "/", dir, "/", file), int64_t(c)});
    }
  }
  return ds;
}

absl::Status RemoteFileDataset::Read(int64_t index, Record* record) const {
  const Sample& sample = files_.samples[size_t(index)];
  record->label = sample.label;
  record->members.clear();
  if (!IsHttpUrl(sample.path))
    return ReadWholeFile(sample.path, options_.max_bytes, &record->bytes);
  return HttpFetch(sample.path, 0, 0, options_, &record->bytes, counters_.get());
}

void RemoteFileDataset::ReadAsync(int64_t index, Record* record,
                                  std::function<void(absl::Status)> done) const {
  const Sample& sample = files_.samples[size_t(index)];
  record->label = sample.label;
  record->members.clear();
  if (!IsHttpUrl(sample.path)) {
    return done(ReadWholeFile(sample.path, options_.max_bytes, &record->bytes));
  }
  HttpFetchAsync(sample.path, 0, 0, options_, &record->bytes, counters_, std::move(done));
}

RemoteStats ToRemoteStats(const HttpCounters& c) {
  RemoteStats s;
  s.remote = true;
  s.requests = c.requests.load(std::memory_order_relaxed);
  s.retries = c.retries.load(std::memory_order_relaxed);
  s.failures = c.failures.load(std::memory_order_relaxed);
  s.bytes = c.bytes.load(std::memory_order_relaxed);
  s.in_flight = c.in_flight.load(std::memory_order_relaxed);
  s.damaged_copies = c.damaged_copies.load(std::memory_order_relaxed);
  const int64_t ok = s.requests - s.retries - s.failures;
  s.request_ms =
      ok > 0 ? double(c.latency_ns.load(std::memory_order_relaxed)) * 1e-6 / double(ok) : 0.0;
  return s;
}

RemoteStats RemoteFileDataset::remote_stats() const { return ToRemoteStats(*counters_); }

std::string RemoteFileDataset::Describe(int64_t index) const {
  return ShownName(files_.samples[size_t(index)].path);
}

}  // namespace feedline
