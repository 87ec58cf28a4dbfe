#include "core/trace.h"

#include <string>

#include "absl/strings/str_format.h"
#include "core/file_io.h"

namespace feedline {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

const char* KindName(TraceTrack::Kind k) {
  switch (k) {
    case TraceTrack::Kind::kRead:
      return "read";
    case TraceTrack::Kind::kDecode:
      return "decode";
    case TraceTrack::Kind::kWait:
      return "wait for batch";
    case TraceTrack::Kind::kBatch:
      return "batch";
    case TraceTrack::Kind::kTune:
      return "tune";
  }
  return "?";
}

const char* ArgName(TraceTrack::Kind k) {
  return (k == TraceTrack::Kind::kRead || k == TraceTrack::Kind::kDecode) ? "sample" : "batch";
}

}  // namespace

void TraceTrack::Span(Kind kind, int64_t start_ns, int64_t end_ns, int64_t arg) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEventsPerTrack) {
    ++dropped_;
    return;
  }
  events_.push_back(Event{start_ns, end_ns, arg, kind});
}

TraceTrack* TraceRecorder::Track(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : tracks_) {
    if (t->name_ == name) return t.get();
  }
  tracks_.push_back(std::unique_ptr<TraceTrack>(new TraceTrack(name, int(tracks_.size()) + 1)));
  return tracks_.back().get();
}

void TraceRecorder::Counter(const std::string& name, int64_t at_ns,
                            std::vector<std::pair<std::string, double>> values) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counters_.size() < TraceTrack::kMaxEventsPerTrack) {
    counters_.push_back(CounterSample{name, at_ns, std::move(values)});
  }
}

void TraceRecorder::Instant(const std::string& name, int64_t at_ns, std::string message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (instants_.size() < TraceTrack::kMaxEventsPerTrack) {
    instants_.push_back(InstantEvent{name, at_ns, std::move(message)});
  }
}

std::string TraceRecorder::ToJson() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const std::string& e) {
    if (!first) out += ",\n";
    first = false;
    out += e;
  };
  auto us = [this](int64_t ns) { return double(ns - origin_ns_) / 1e3; };
  add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"feedline\"}}");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& t : tracks_) {
    add(absl::StrFormat(
        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
        t->tid_, JsonEscape(t->name_)));
    std::lock_guard<std::mutex> tlock(t->mu_);
    for (const auto& e : t->events_) {
      add(absl::StrFormat(
          "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,"
          "\"tid\":%d,\"args\":{\"%s\":%d}}",
          KindName(e.kind), KindName(e.kind), us(e.start_ns), double(e.end_ns - e.start_ns) / 1e3,
          t->tid_, ArgName(e.kind), e.arg));
    }
    if (t->dropped_ > 0) {
      add(absl::StrFormat(
          "{\"name\":\"events dropped\",\"ph\":\"i\",\"s\":\"t\",\"ts\":0,\"pid\":1,\"tid\":%d,"
          "\"args\":{\"dropped\":%d}}",
          t->tid_, t->dropped_));
    }
  }
  for (const auto& c : counters_) {
    std::string args;
    for (const auto& [k, v] : c.values) {
      absl::StrAppend(&args, args.empty() ? "" : ",", "\"", JsonEscape(k),
                      "\":", absl::StrFormat("%.6g", v));
    }
    add(absl::StrFormat("{\"name\":\"%s\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,\"args\":{%s}}",
                        JsonEscape(c.name), us(c.at_ns), args));
  }
  for (const auto& i : instants_) {
    add(
        absl::StrFormat("{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":1,\"tid\":0,"
                        "\"args\":{\"message\":\"%s\"}}",
                        JsonEscape(i.name), us(i.at_ns), JsonEscape(i.message)));
  }
  out += "\n]}\n";
  return out;
}

absl::Status TraceRecorder::Save(const std::string& path) const {
  // Whole or not at all (a part file renamed into place; core/file_io.h).
  return WriteFileWhole(path, ToJson());
}

}  // namespace feedline
