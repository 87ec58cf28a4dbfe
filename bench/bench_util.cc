#include "bench_util.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"

namespace feedline::bench {
namespace {

double Seconds(const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) * 1e-6; }

}  // namespace

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return Seconds(ru.ru_utime) + Seconds(ru.ru_stime);
}

int64_t PeakRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports kibibytes
}

double MachineBusySeconds() {
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice", in clock ticks;
  // guest time is already counted in user.
  std::ifstream in("/proc/stat");
  std::string label;
  int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(in >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      label != "cpu") {
    return -1;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  return double(user + nice + system + irq + softirq + steal) / double(ticks > 0 ? ticks : 100);
}

int Cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::filesystem::path ExecutableDir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return std::filesystem::current_path(ec);
  return exe.parent_path();
}

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO)) {}

void ProgressLine::Show(const std::string& text, bool force) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  shown_ = true;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
}

void ProgressLine::Clear() {
  if (!enabled_ || !shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        }
      }
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else {
      // The length of a well-formed UTF-8 sequence (RFC 3629: no overlongs, no surrogates,
      // nothing above U+10FFFF); 0 if malformed.
      size_t len = 0;
      if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
      } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
      }
      bool ok = len > 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) {
        ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      }
      if (ok && len >= 3) {
        const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
        if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
            (c == 0xF4 && c1 > 0x8F)) {
          ok = false;
        }
      }
      if (ok) {
        out.append(s.data() + i, len);
        i += len;
      } else {
        out += "\\ufffd";
        ++i;
      }
    }
  }
  out += '"';
  return out;
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (stack_.empty()) return;
  Level& level = stack_.back();
  assert(!level.object && "a value in an object needs a Key() first");
  if (level.count++ > 0) out_ += level.compact ? ", " : ",";
  if (!level.compact) absl::StrAppend(&out_, "\n", std::string(2 * stack_.size(), ' '));
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  assert(!stack_.empty() && stack_.back().object && !after_key_);
  Level& level = stack_.back();
  if (level.count++ > 0) out_ += level.compact ? ", " : ",";
  if (!level.compact) absl::StrAppend(&out_, "\n", std::string(2 * stack_.size(), ' '));
  absl::StrAppend(&out_, JsonString(key), ": ");
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::Begin(bool object, bool compact) {
  BeforeValue();
  out_ += object ? '{' : '[';
  // Everything inside a compact container is compact too.
  stack_.push_back(Level{object, compact || (!stack_.empty() && stack_.back().compact), 0});
  return *this;
}

JsonWriter& JsonWriter::End(bool object) {
  assert(!stack_.empty() && stack_.back().object == object && !after_key_);
  const Level level = stack_.back();
  stack_.pop_back();
  if (!level.compact && level.count > 0) {
    absl::StrAppend(&out_, "\n", std::string(2 * stack_.size(), ' '));
  }
  out_ += object ? '}' : ']';
  return *this;
}

JsonWriter& JsonWriter::BeginObject(bool compact) { return Begin(true, compact); }
JsonWriter& JsonWriter::EndObject() { return End(true); }
JsonWriter& JsonWriter::BeginArray(bool compact) { return Begin(false, compact); }
JsonWriter& JsonWriter::EndArray() { return End(false); }

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_ += JsonString(value);
  return *this;
}

JsonWriter& JsonWriter::Number(double value) {
  BeforeValue();
  out_ += JsonNumber(value);
  return *this;
}

JsonWriter& JsonWriter::Integer(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Boolean(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

std::string JsonWriter::Finish() {
  assert(stack_.empty() && !after_key_);
  out_ += '\n';
  return std::move(out_);
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
    out << text;
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace feedline::bench
