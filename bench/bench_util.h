// feedline-bench: small utilities shared by its parts — clocks and resource figures, a progress
// line, a JSON writer and atomic file writes.
//
// Thread safety: the free functions may be called from any thread; `ProgressLine` and
// `JsonWriter` belong to one thread.
#ifndef FEEDLINE_BENCH_BENCH_UTIL_H_
#define FEEDLINE_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace feedline::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds (user + system) of this process, all threads (the loader's included).
double CpuSeconds();
// The largest resident set this process has had so far, in bytes.
int64_t PeakRssBytes();
// CPU seconds the whole machine has spent busy so far, over all cores (/proc/stat). Its delta
// over a measurement, minus this process's, is what other processes took meanwhile: on a
// shared machine that says how far a figure can be trusted. -1 when /proc/stat is unreadable.
double MachineBusySeconds();
// Cores this process may run on.
int Cores();

// The directory of the running executable.
std::filesystem::path ExecutableDir();

// One status line on stderr, redrawn in place; drawn only when stderr is a terminal (in a log
// file a carriage-return display is noise).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  // Redraws at most ~10 times per second unless `force`.
  void Show(const std::string& text, bool force = false);
  // Erases the line, so that what is printed next starts on a clean one.
  void Clear();

 private:
  bool enabled_;
  bool shown_ = false;
  Clock::time_point last_;
};

// A string as a JSON string literal; invalid UTF-8 becomes U+FFFD, so the output is valid.
std::string JsonString(absl::string_view s);
// A number as JSON: NaN and infinities (which JSON lacks) become null.
std::string JsonNumber(double v);

// Writes an indented JSON document. Containers opened with `compact` are written on one line
// (with everything inside them), which keeps long lists of small records readable.
//   JsonWriter w;
//   w.BeginObject().Key("images_per_s").Number(812.5).Key("epochs").BeginArray();
//   w.BeginObject(true).Key("epoch").Integer(0).EndObject();
//   w.EndArray().EndObject();
//   std::string text = w.Finish();
class JsonWriter {
 public:
  JsonWriter& BeginObject(bool compact = false);
  JsonWriter& EndObject();
  JsonWriter& BeginArray(bool compact = false);
  JsonWriter& EndArray();
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Number(double value);
  JsonWriter& Integer(int64_t value);
  JsonWriter& Boolean(bool value);
  JsonWriter& Null();
  // The document, ending with a newline. Every container must be closed.
  std::string Finish();

 private:
  struct Level {
    bool object = false;
    bool compact = false;
    int count = 0;
  };
  void BeforeValue();
  JsonWriter& Begin(bool object, bool compact);
  JsonWriter& End(bool object);

  std::vector<Level> stack_;
  std::string out_;
  bool after_key_ = false;
};

// Written to a temporary file and renamed, so that a reader never sees half a result.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_BENCH_UTIL_H_
