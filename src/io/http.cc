#include "io/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_io.h"

namespace feedline {
namespace {

using Clock = std::chrono::steady_clock;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One easy handle per thread: its connection cache keeps connections (and TLS sessions) open
// from one request to the next.
struct Handle {
  CURL* curl = nullptr;
  Handle() {
    GlobalInit();
    curl = curl_easy_init();
  }
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

struct Sink {
  std::vector<uint8_t>* out;
  int64_t max_bytes;
  bool too_big = false;
};

size_t Write(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t bytes = size * n;
  if (int64_t(sink->out->size() + bytes) > sink->max_bytes) {
    sink->too_big = true;
    return 0;  // aborts the transfer
  }
  sink->out->insert(sink->out->end(), data, data + bytes);
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
  return absl::StartsWith(path, "http://") || absl::StartsWith(path, "https://");
}

std::string RedactUrl(const std::string& url) {
  std::string u = url.substr(0, url.find_first_of("?#"));
  const size_t scheme = u.find("://");
  if (scheme == std::string::npos) return u;
  const size_t host = scheme + 3;
  const size_t slash = u.find('/', host);
  const size_t at = u.rfind('@', slash == std::string::npos ? u.size() : slash);
  if (at != std::string::npos && at >= host) u.erase(host, at + 1 - host);
  return u;
}

absl::Status HttpFetch(const std::string& url, int64_t offset, int64_t length, const HttpOptions& o,
                       std::vector<uint8_t>* out, HttpCounters* counters) {
  thread_local Handle handle;
  CURL* curl = handle.curl;
  const std::string shown = RedactUrl(url);
  if (curl == nullptr) return absl::InternalError(absl::StrCat(shown, ": curl_easy_init failed"));
  const double timeout_s = o.timeout_s > 0 ? o.timeout_s : 60.0;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(int64_t(timeout_s * 1e6));
  absl::Status last;
  double backoff_s = 0.1;
  for (int attempt = 1;; ++attempt) {
    const double left_s = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left_s <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(shown, ": no answer within ", timeout_s, " s (", attempt - 1, " attempts",
                       last.ok() ? "" : absl::StrCat("; the last: ", last.message()), ")"));
    }
    out->clear();
    Sink sink{out, o.max_bytes};
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     long(std::min(o.connect_timeout_s, left_s) * 1000) + 1);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, long(left_s * 1000) + 1);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "feedline/" FEEDLINE_VERSION);
    std::string range;
    if (length > 0) {
      range = absl::StrCat(offset, "-", offset + length - 1);
      curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
    }
    if (counters != nullptr) {
      counters->requests.fetch_add(1, std::memory_order_relaxed);
      counters->in_flight.fetch_add(1, std::memory_order_relaxed);
    }
    const Clock::time_point t0 = Clock::now();
    const CURLcode rc = curl_easy_perform(curl);
    if (counters != nullptr) counters->in_flight.fetch_sub(1, std::memory_order_relaxed);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    bool retry = false;
    if (sink.too_big) {
      return absl::DataLossError(absl::StrCat(shown, ": larger than ", o.max_bytes, " bytes"));
    }
    if (rc != CURLE_OK) {
      last = absl::UnavailableError(
          absl::StrCat(shown, ": ", error[0] != '\0' ? error : curl_easy_strerror(rc)));
      retry = Transient(rc);
      if (!retry) return last;
    } else if (status == 200 || status == 206) {
      if (length > 0 && status == 200) {  // the server sent the whole object
        if (int64_t(out->size()) < offset + length) {
          return absl::DataLossError(absl::StrCat(shown, ": ", out->size(),
                                                  " bytes, the range ends at ", offset + length));
        }
        out->erase(out->begin() + offset + length, out->end());
        out->erase(out->begin(), out->begin() + offset);
      }
      if (length > 0 && int64_t(out->size()) != length) {
        return absl::DataLossError(
            absl::StrCat(shown, ": ", out->size(), " bytes for a range of ", length));
      }
      if (counters != nullptr) {
        counters->bytes.fetch_add(int64_t(out->size()), std::memory_order_relaxed);
        counters->latency_ns.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
            std::memory_order_relaxed);
      }
      return absl::OkStatus();
    } else if (status == 404 || status == 410) {
      return absl::NotFoundError(absl::StrCat(shown, ": HTTP ", status, " (not found)"));
    } else if (status == 401 || status == 403) {
      return absl::PermissionDeniedError(
          absl::StrCat(shown, ": HTTP ", status, " (access denied)"));
    } else if (status == 408 || status == 429 || status >= 500) {
      last = absl::UnavailableError(absl::StrCat(shown, ": HTTP ", status));
      retry = true;
    } else {
      return absl::DataLossError(absl::StrCat(shown, ": HTTP ", status));
    }
    if (!retry || attempt >= o.max_attempts) {
      if (counters != nullptr) counters->failures.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat(last.message(), " (after ", attempt, " attempts)"));
    }
    if (counters != nullptr) counters->retries.fetch_add(1, std::memory_order_relaxed);
    const double wait_s =
        std::min(Jitter(backoff_s),
                 std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count()));
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(wait_s * 1e6)));
    backoff_s = std::min(backoff_s * 2, 5.0);
  }
}

absl::Status RemoteFileDataset::Read(int64_t index, Record* record) const {
  const Sample& sample = files_.samples[size_t(index)];
  record->label = sample.label;
  record->members.clear();
  if (!IsHttpUrl(sample.path))
    return ReadWholeFile(sample.path, options_.max_bytes, &record->bytes);
  return HttpFetch(sample.path, 0, 0, options_, &record->bytes, counters_.get());
}

RemoteStats RemoteFileDataset::remote_stats() const {
  const HttpCounters& c = *counters_;
  RemoteStats s;
  s.remote = true;
  s.requests = c.requests.load(std::memory_order_relaxed);
  s.retries = c.retries.load(std::memory_order_relaxed);
  s.failures = c.failures.load(std::memory_order_relaxed);
  s.bytes = c.bytes.load(std::memory_order_relaxed);
  s.in_flight = c.in_flight.load(std::memory_order_relaxed);
  const int64_t ok = s.requests - s.retries - s.failures;
  s.request_ms =
      ok > 0 ? double(c.latency_ns.load(std::memory_order_relaxed)) * 1e-6 / double(ok) : 0.0;
  return s;
}

std::string RemoteFileDataset::Describe(int64_t index) const {
  return RedactUrl(files_.samples[size_t(index)].path);
}

}  // namespace feedline
