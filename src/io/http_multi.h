// One libcurl multi handle per process, driven by one event-loop thread: every HTTP transfer of
// the process runs there, on one shared connection cache (keep-alive connections and TLS
// sessions reused by whichever thread asks next; HTTP/2 streams multiplexed on one connection
// where the server offers it).
//
// Transfers are started from any thread (Start) and end with a callback on the loop's thread:
// no thread waits per request, so the read stage keeps the autotuner's I/O depth of requests
// in flight from one reader thread (Dataset::ReadAsync); blocking callers (the shard
// downloader, listings) wait for the callback. Retries wait on the loop's timers (After), not
// in a sleeping thread. The loop is libcurl's event-driven form (curl_multi_socket_action over
// epoll): a wake-up serves only the sockets that are ready.
//
// Lifetime: created on first use and never destroyed (transfers may still be running at exit);
// a forked child makes its own on first use.
//
// Thread safety: every member from any number of threads.
#ifndef FEEDLINE_SRC_IO_HTTP_MULTI_H_
#define FEEDLINE_SRC_IO_HTTP_MULTI_H_

#include <curl/curl.h>

#include <functional>

namespace feedline {

class HttpMulti {
 public:
  // The process's loop (started on first use).
  static HttpMulti& Get();

  // Starts the configured `easy` handle and returns at once; `done` runs on the loop's thread
  // with the transfer's result (as curl_easy_perform would return it) and must not block. The
  // handle's own callbacks (write) run on the loop's thread too. The handle is the caller's
  // again when `done` runs (it is removed from the loop first).
  void Start(CURL* easy, std::function<void(CURLcode)> done);

  // Runs `fn` on the loop's thread after `seconds` (retry back-offs: no thread sleeps).
  void After(double seconds, std::function<void()> fn);

  // A new easy handle for one attempt, null if libcurl cannot make one; GiveEasy frees it.
  // Handles are never reused: libcurl before 8.2 (Debian 12 has 7.88) keeps a pointer to the
  // last response's stored header through curl_easy_reset, and a reply that starts its headers
  // with a folded line then reads freed memory. Connections and the DNS cache belong to the
  // loop's multi handle, so a fresh handle still reuses them.
  CURL* TakeEasy();
  void GiveEasy(CURL* easy);

  HttpMulti(const HttpMulti&) = delete;
  HttpMulti& operator=(const HttpMulti&) = delete;

 private:
  struct State;
  HttpMulti();
  ~HttpMulti() = delete;  // never destroyed; see above
  State* const state_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_IO_HTTP_MULTI_H_
