// A bounded, low-overhead recorder of what the pipeline's threads did, exported as Chrome
// trace-event JSON (opens in Perfetto and chrome://tracing, as torch.profiler's traces do).
//
// Each thread records into its own track (found or created by name once per thread start,
// then appended to with an uncontended per-track mutex: ~20 ns, a few per sample). A track
// keeps at most `kMaxEventsPerTrack` events and counts the rest as dropped, so memory is bounded.
//
// Thread safety: all methods may be called from any thread.
#ifndef FEEDLINE_SRC_CORE_TRACE_H_
#define FEEDLINE_SRC_CORE_TRACE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace feedline {

class TraceTrack {
 public:
  enum class Kind : uint8_t { kRead, kDecode, kWait, kBatch, kTune };
  // A complete span [start_ns, end_ns) with one integer argument (sample or batch index).
  void Span(Kind kind, int64_t start_ns, int64_t end_ns, int64_t arg);
  static constexpr size_t kMaxEventsPerTrack = 200000;

 private:
  friend class TraceRecorder;
  struct Event {
    int64_t start_ns, end_ns, arg;
    Kind kind;
  };
  TraceTrack(std::string name, int tid) : name_(std::move(name)), tid_(tid) {}
  const std::string name_;
  const int tid_;
  std::mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

class TraceRecorder {
 public:
  explicit TraceRecorder(int64_t origin_ns) : origin_ns_(origin_ns) {}
  // The track with this name, created on first use. The pointer stays valid for the
  // recorder's life.
  TraceTrack* Track(const std::string& name);
  // A counter sample (Perfetto draws it as a graph): settings and rates over time.
  void Counter(const std::string& name, int64_t at_ns,
               std::vector<std::pair<std::string, double>> values);
  // An instant event with a message (tuner decisions).
  void Instant(const std::string& name, int64_t at_ns, std::string message);

  // Writes the trace as Chrome trace-event JSON.
  absl::Status Save(const std::string& path) const;
  std::string ToJson() const;

 private:
  struct CounterSample {
    std::string name;
    int64_t at_ns;
    std::vector<std::pair<std::string, double>> values;
  };
  struct InstantEvent {
    std::string name;
    int64_t at_ns;
    std::string message;
  };
  const int64_t origin_ns_;
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<TraceTrack>> tracks_ ABSL_GUARDED_BY(mu_);
  std::vector<CounterSample> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<InstantEvent> instants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_TRACE_H_
