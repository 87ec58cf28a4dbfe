// HTTP(S) reads with libcurl: whole objects or byte ranges, retried on what is transient.
//
// Every transfer runs on the process's libcurl multi loop (io/http_multi.h): one thread polls
// all sockets on a shared connection cache (keep-alive, TLS sessions, HTTP/2 multiplexing).
// HttpFetchAsync returns at once (the read stage keeps io_depth of them in flight from one
// reader thread: the autotuner's I/O depth is the request concurrency); HttpFetch waits.
//
// Retries: connection failures (refused, reset, DNS), timeouts, 5xx and 429 are retried with
// exponential backoff and full jitter (100 ms doubling, at most 5 s per wait) while the
// deadline allows; 403, 404 and other 4xx are not (a DataError naming the URL and the status).
// The error of the last attempt is reported, with the attempt count. URLs in messages have
// their user information and query string removed (credentials and signatures never appear).
//
// HTTPS: certificates are verified against the system's CA bundle, or the one named by
// CURL_CA_BUNDLE or SSL_CERT_FILE (AWS_CA_BUNDLE first for s3://): a failed verification is
// kUnavailable naming the URL, never retried.
//
// Thread safety: Fetch may be called from any number of threads at once.
#ifndef FEEDLINE_SRC_IO_HTTP_H_
#define FEEDLINE_SRC_IO_HTTP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/redact.h"
#include "feedline/files.h"

namespace feedline {

// http://, https:// or s3://.
bool IsHttpUrl(const std::string& path);
bool IsS3Url(const std::string& path);

// Where s3:// URLs go and how requests are signed, from the standard environment variables
// and files: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (an S3-compatible store; default
// https://s3.<region>.amazonaws.com, path-style), AWS_REGION / AWS_DEFAULT_REGION / the
// profile's region in AWS_CONFIG_FILE (~/.aws/config; default us-east-1), AWS_ACCESS_KEY_ID +
// AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) or the profile (AWS_PROFILE, default "default")
// in AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials). No credentials: unsigned requests.
// Requests are signed with libcurl's AWS SigV4.
struct S3Config {
  std::string endpoint;  // "http://127.0.0.1:4568", no trailing slash
  std::string region;
  std::string access_key, secret_key, session_token;
};
S3Config LoadS3Config();

// An s3://bucket/key URL as its endpoint URL (key percent-encoded). False if it is not one.
bool S3ToHttp(const S3Config& config, const std::string& s3_url, std::string* http_url);

// Lists the keys under s3://bucket/prefix (ListObjectsV2, every page): with a delimiter "/",
// the keys directly under it and the common prefixes one level down; without, every key below.
struct S3Listing {
  std::vector<std::string> keys, prefixes;  // full keys / prefixes (with the prefix given)
};

// A validator from a server that sends no ETag: "lm:" + its Last-Modified date.
inline constexpr absl::string_view kModifiedPrefix = "lm:";

struct HttpOptions {
  std::shared_ptr<const S3Config> s3;  // for s3:// URLs
  double timeout_s = 60;               // the whole read, retries included (0: 60 s)
  double connect_timeout_s = 10;       // one connection attempt
  int max_attempts = 6;
  double stall_s = 0;  // > 0: a transfer without a byte for this long fails
  // > 0: the read fails, retries included, once this long has passed without any response (a
  // server that accepts connections and never answers, or nobody there): a whole-file download
  // has a long deadline for its bytes, but a silent server must not hold it for all of it.
  double silent_s = 0;
  int64_t max_bytes = int64_t{1} << 30;  // a body above: kResourceExhausted
  // > 0: the bodies of all reads in flight that share the HttpCounters given (a data set's),
  // held in memory, together at most this many bytes; past it a read fails, kResourceExhausted.
  int64_t max_held_bytes = 0;
  // Non-empty: the object must still be this version, a validator as HttpEtag returns it: an
  // ETag (an If-Match request) or kModifiedPrefix + a Last-Modified date (If-Unmodified-Since);
  // if it changed, the read is kDataLoss (HTTP 412), never retried.
  std::string if_match;
};

// What the client did, for stats (the data set's counters).
struct HttpCounters {
  std::atomic<int64_t> requests{0}, retries{0}, bytes{0}, failures{0};
  std::atomic<int64_t> latency_ns{0};  // summed over successful requests
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> damaged_copies{0};  // RemoteStats::damaged_copies
  std::atomic<int64_t> held{0};            // body bytes of the reads in flight (max_held_bytes)
};

// GETs `url` into *out (replacing it); `length` > 0 asks for bytes [offset, offset + length).
// Errors: kNotFound (404), kPermissionDenied (401, 403), kDataLoss (another 4xx, a short
// range), kResourceExhausted (a body above max_bytes, or past max_held_bytes), kUnavailable (the
// retries ran out: the last cause), kDeadlineExceeded (the deadline passed).
absl::Status HttpFetch(const std::string& url, int64_t offset, int64_t length,
                       const HttpOptions& options, std::vector<uint8_t>* out,
                       HttpCounters* counters = nullptr);

// The counters as stats.
RemoteStats ToRemoteStats(const HttpCounters& counters);

// HttpFetch without waiting: returns at once; `done` runs once with the outcome, on the HTTP
// loop's thread (or on this one, for an error found before any request). `out` must stay
// valid and untouched until then. The fetch keeps `counters` alive (it may end after the data
// set that started it is gone).
void HttpFetchAsync(const std::string& url, int64_t offset, int64_t length,
                    const HttpOptions& options, std::vector<uint8_t>* out,
                    std::shared_ptr<HttpCounters> counters, std::function<void(absl::Status)> done);

absl::StatusOr<S3Listing> S3List(const std::string& bucket, const std::string& prefix,
                                 bool delimiter, const HttpOptions& options);
// S3List's loop over ListObjectsV2 pages, each fetched by `fetch(continuation_token, &page)`
// ("" for the first): the keys (and with `delimiter` the common prefixes) of every page, in
// order. A page's error is returned as it is; a server that loops (a continuation token seen
// before, or 100 truncated pages in a row without a key) is kDataLoss naming `shown`.
using S3PageFetch = std::function<absl::Status(const std::string& token, std::vector<uint8_t>* page)>;
absl::StatusOr<S3Listing> S3ListPages(const S3PageFetch& fetch, bool delimiter,
                                      const std::string& shown);

// The `key = value` lines of section `section` of INI text (~/.aws/credentials, ~/.aws/config;
// `[profile name]` headers, `#` and `;` comments), keys and values without surrounding blanks.
std::map<std::string, std::string> ParseIniSection(absl::string_view text,
                                                   const std::string& section);

// An ImageFolder under s3://bucket/prefix/: classes are the common prefixes one level down
// (sorted), samples the keys below each with an image extension, in torchvision's order (by
// folder, then by name). Errors: kNotFound (no class prefix, or a class without images).
absl::StatusOr<FileList> ScanS3ImageFolder(const std::string& url, const HttpOptions& options);

// What a HEAD request says of an object (with HttpFetch's retries): its validator — its ETag,
// else kModifiedPrefix + its Last-Modified date; empty if the server sends neither — and its
// length (Content-Length; -1 without one).
struct HttpObject {
  std::string validator;
  int64_t length = -1;
};
absl::StatusOr<HttpObject> HttpHead(const std::string& url, const HttpOptions& options);

// Downloads `url` into the file `path` (written under a name of its own, renamed when
// complete), with HttpFetch's retries; `etag`, when given, receives the object's ETag (empty if
// the server sent none).
absl::Status HttpDownload(const std::string& url, const std::string& path,
                          const HttpOptions& options, HttpCounters* counters = nullptr,
                          std::string* etag = nullptr);

// Local files and URLs in one list: each sample's path is read from disk or fetched.
class RemoteFileDataset final : public FileDataset {
 public:
  RemoteFileDataset(FileList files, HttpOptions options)
      : FileDataset(std::move(files)),
        options_(options),
        counters_(std::make_shared<HttpCounters>()) {}
  absl::Status Read(int64_t index, Record* record) const override;
  // URLs are fetched without a thread waiting for each (HttpFetchAsync); local paths in the
  // same list are read at once.
  bool async_reads() const override { return true; }
  void ReadAsync(int64_t index, Record* record,
                 std::function<void(absl::Status)> done) const override;
  std::string Describe(int64_t index) const override;
  const HttpCounters& counters() const { return *counters_; }
  RemoteStats remote_stats() const override;

 private:
  HttpOptions options_;
  std::shared_ptr<HttpCounters> counters_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_HTTP_H_
