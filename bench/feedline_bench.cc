// feedline-bench: how many images per second a feedline loader delivers on this machine, at what
// CPU cost, and what limits it.
//
//   feedline-bench                         # the bundled ImageNet-like set (made once), 3 epochs
//   feedline-bench --data ~/imagenet/train --workers 8 --json result.json
//
// The loop consumes batches as fast as the loader delivers them (no simulated training step),
// so the figures are the loader's ceiling. The first epoch includes warm-up (page cache, the
// autotuner's first moves), so the summary is taken over the epochs after it; every epoch is
// reported too.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "feedline/batch.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/stats.h"
#include "synthetic_images.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The bundled data set: ImageNet-like images, 10 classes x 200. Its folder name carries a
// version so that a change here never reuses a set made by an older bench.
constexpr char kBundledName[] = "imagenet-like-v1";
constexpr int kBundledClasses = 10;
constexpr int kBundledPerClass = 200;
constexpr uint64_t kBundledSeed = 1;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    R"(usage: feedline-bench [options]

Measures the throughput of a feedline image loader: images/s, CPU seconds per image, peak
memory, the resources it chose and the stage that limits it.

options:
  --data DIR            ImageFolder directory or list file (default: a bundled ImageNet-like
                        set of 2000 images in 10 classes, made once next to the executable
                        in data/imagenet-like-v1, or in ~/.cache/feedline when that folder
                        is not writable)
  --batch-size N        samples per batch (default 256)
  --epochs N            epochs to run; the summary leaves out the first (default 3)
  --workers N|auto      decoder threads (default auto)
  --prefetch N|auto     batches in flight (default auto)
  --io-depth N|auto     reads in flight (default auto)
  --transform train|eval
                        RandomResizedCrop + flip, or Resize + CenterCrop (default train)
  --layout nchw|nhwc    batch layout (default nchw)
  --device cpu          where batches are delivered (default cpu)
  --seed N              shuffling and augmentation seed (default 0)
  --json FILE           also write the results as JSON to FILE
  --quiet               no progress display, no messages about making the data set
  --help                this text
)";

struct BenchFlags {
  std::string data;  // empty: the bundled set
  int64_t batch_size = 256;
  int epochs = 3;
  int workers = feedline::kAuto;
  int prefetch = feedline::kAuto;
  int io_depth = feedline::kAuto;
  feedline::Transform transform = feedline::Transform::kTrain;
  feedline::Layout layout = feedline::Layout::kNCHW;
  std::string device = "cpu";
  uint64_t seed = 0;
  std::string json;
  bool quiet = false;
  bool help = false;
};

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": expected ", expected, ", got '", value, "'"));
}

absl::StatusOr<int64_t> ParsePositive(absl::string_view flag, absl::string_view value) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1) return BadValue(flag, value, "an integer >= 1");
  return n;
}

// "auto" is feedline::kAuto; otherwise a count >= 1 that fits an int.
absl::StatusOr<int> ParseCountOrAuto(absl::string_view flag, absl::string_view value) {
  if (value == "auto") return feedline::kAuto;
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1)
    return BadValue(flag, value, "an integer >= 1 or auto");
  return n;
}

// The options that take a value (all but --quiet and --help).
constexpr absl::string_view kValueFlags[] = {
    "--data",      "--batch-size", "--epochs", "--workers", "--prefetch", "--io-depth",
    "--transform", "--layout",     "--device", "--seed",    "--json"};

// Accepts "--flag value" and "--flag=value".
absl::StatusOr<BenchFlags> ParseFlags(int argc, char** argv) {
  BenchFlags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      return flags;
    }
    if (arg == "--quiet") {
      flags.quiet = true;
      continue;
    }
    if (arg.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    absl::string_view name = arg;
    absl::string_view value;
    const size_t eq = arg.find('=');
    if (eq != absl::string_view::npos) name = arg.substr(0, eq);
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), name) == std::end(kValueFlags)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", name));
    }
    if (eq != absl::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, ": missing value"));
    }

    if (name == "--data") {
      if (value.empty()) return BadValue(name, value, "a directory or list file");
      flags.data = std::string(value);
    } else if (name == "--batch-size") {
      absl::StatusOr<int64_t> n = ParsePositive(name, value);
      if (!n.ok()) return n.status();
      flags.batch_size = *n;
    } else if (name == "--epochs") {
      absl::StatusOr<int64_t> n = ParsePositive(name, value);
      if (!n.ok()) return n.status();
      if (*n > 1000000) return BadValue(name, value, "at most 1000000");
      flags.epochs = static_cast<int>(*n);
    } else if (name == "--workers" || name == "--prefetch" || name == "--io-depth") {
      absl::StatusOr<int> n = ParseCountOrAuto(name, value);
      if (!n.ok()) return n.status();
      int* target = name == "--workers"    ? &flags.workers
                    : name == "--prefetch" ? &flags.prefetch
                                           : &flags.io_depth;
      *target = *n;
    } else if (name == "--transform") {
      if (value == "train") {
        flags.transform = feedline::Transform::kTrain;
      } else if (value == "eval") {
        flags.transform = feedline::Transform::kEval;
      } else {
        return BadValue(name, value, "train or eval");
      }
    } else if (name == "--layout") {
      if (value == "nchw" || value == "NCHW") {
        flags.layout = feedline::Layout::kNCHW;
      } else if (value == "nhwc" || value == "NHWC") {
        flags.layout = feedline::Layout::kNHWC;
      } else {
        return BadValue(name, value, "nchw or nhwc");
      }
    } else if (name == "--device") {
      if (value != "cpu") {
        // The loader's CUDA path (pinned slots, copy stage) is not exposed in LoaderOptions yet.
        return absl::UnimplementedError(
            absl::StrCat("--device ", value, ": only cpu is supported by this build"));
      }
      flags.device = std::string(value);
    } else if (name == "--seed") {
      if (!absl::SimpleAtoi(value, &flags.seed)) {
        return BadValue(name, value, "an unsigned integer");
      }
    } else if (name == "--json") {
      if (value.empty()) return BadValue(name, value, "a file name");
      flags.json = std::string(value);
    } else {  // in kValueFlags but not handled above: a bug here, not in the command line
      return absl::InternalError(absl::StrCat("option ", name, " is not implemented"));
    }
  }
  return flags;
}

// The directory of the running executable, so that the bundled set lives in the build tree
// whatever the current directory is.
fs::path ExecutableDir(const char* argv0) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) exe = fs::absolute(argv0, ec);
  return exe.parent_path();
}

// One status line on stderr, redrawn in place. Drawn only on a terminal: in a log file, a
// carriage-return display is noise.
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}

  // Redraws at most ~10 times per second unless `force`.
  void Show(const std::string& text, bool force = false) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
  }

  // Erases the line, so that what is printed next starts on a clean one.
  void Clear() {
    if (!enabled_ || !shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  Clock::time_point last_;
};

// Whether `path` exists or could be created: its nearest existing ancestor is writable.
bool CanCreate(fs::path path) {
  std::error_code ec;
  while (!path.empty() && !fs::exists(path, ec)) {
    const fs::path parent = path.parent_path();
    if (parent == path) break;
    path = parent;
  }
  return ::access(path.empty() ? "." : path.c_str(), W_OK) == 0;
}

// Where the bundled set lives: next to the executable (the build tree), or, for an installed
// bench whose folder is not writable, in the user's cache folder.
fs::path BundledDataDir(const char* argv0) {
  const fs::path beside = ExecutableDir(argv0) / "data" / kBundledName;
  std::error_code ec;
  if (fs::is_directory(beside, ec) || CanCreate(beside)) return beside;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = xdg != nullptr && *xdg != '\0'     ? fs::path(xdg)
                         : home != nullptr && *home != '\0' ? fs::path(home) / ".cache"
                                                            : fs::temp_directory_path(ec);
  return cache / "feedline" / kBundledName;
}

// Makes the bundled set if it is not there yet; returns its path.
absl::StatusOr<std::string> EnsureBundledData(const char* argv0, bool quiet) {
  const fs::path dir = BundledDataDir(argv0);
  const int64_t total = int64_t{kBundledClasses} * kBundledPerClass;
  ProgressLine line(!quiet && isatty(STDERR_FILENO));
  const Clock::time_point start = Clock::now();
  bool announced = false;
  // The callback's first call tells whether there is work to do: a finished set reports
  // (total, total) at once, and then there is nothing to announce.
  absl::Status s = feedline::bench::MakeImageFolder(
      dir.string(), kBundledClasses, kBundledPerClass, kBundledSeed, [&](int64_t done, int64_t n) {
        if (quiet) return;
        if (!announced && done < n) {
          announced = true;
          std::fprintf(stderr, "feedline-bench: making the bundled data set (%lld images) in %s\n",
                       static_cast<long long>(total), dir.c_str());
        }
        if (announced) {
          line.Show(absl::StrCat("  ", done, "/", n, " images"), done == n);
        }
      });
  line.Clear();
  if (!s.ok()) return s;
  if (announced) {
    std::fprintf(stderr, "feedline-bench: made %lld images in %.1f s\n",
                 static_cast<long long>(total),
                 std::chrono::duration<double>(Clock::now() - start).count());
  }
  return dir.string();
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec * 1e-6; };
  return seconds(ru.ru_utime) + seconds(ru.ru_stime);
}

int64_t PeakRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports kibibytes
}

// FNV-1a over a few bytes of every batch: enough that the loop cannot be optimised away and
// that two runs with the same seed can be compared, without reading whole batches (which would
// make the consumer, not the loader, the thing measured).
class BatchChecksum {
 public:
  void Add(const feedline::Batch& batch) {
    const int64_t bytes = batch.image_bytes();
    const uint8_t* images = batch.images();
    if (bytes > 0 && images != nullptr) {
      constexpr int kProbes = 16;
      for (int i = 0; i < kProbes; ++i) Mix(images[(bytes - 1) * i / (kProbes - 1)]);
    }
    if (batch.size() > 0 && batch.labels() != nullptr) {
      Mix(static_cast<uint64_t>(batch.labels()[0]));
      Mix(static_cast<uint64_t>(batch.labels()[batch.size() - 1]));
    }
    if (batch.size() > 0 && batch.indices() != nullptr) {
      Mix(static_cast<uint64_t>(batch.indices()[0]));
    }
  }
  uint64_t value() const { return hash_; }

 private:
  void Mix(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ = (hash_ ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001B3ULL;
    }
  }
  uint64_t hash_ = 0xCBF29CE484222325ULL;
};

struct EpochResult {
  int64_t epoch = 0;
  int64_t images = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  double images_per_s() const { return seconds > 0 ? images / seconds : 0; }
};

struct Summary {
  double images_per_s = 0;
  double cpu_seconds_per_image = 0;
  int64_t peak_rss_bytes = 0;
  int first_steady_epoch = 0;  // index into the epoch list where the summary starts
  feedline::Stats stats;
  uint64_t checksum = 0;
};

// A string as a JSON string literal. Invalid UTF-8 (possible in file names) becomes U+FFFD, so
// that the output is always valid JSON.
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
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
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

// JSON has no NaN or infinity; a figure that could not be measured is null.
std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string TransformName(feedline::Transform t) {
  return t == feedline::Transform::kTrain ? "train" : "eval";
}

std::string LayoutName(feedline::Layout l) {
  return l == feedline::Layout::kNCHW ? "nchw" : "nhwc";
}

std::string ResultsJson(const BenchFlags& flags, const std::string& data,
                        const std::vector<EpochResult>& epochs, const Summary& summary) {
  const feedline::Stats& st = summary.stats;
  char checksum[24];
  std::snprintf(checksum, sizeof(checksum), "%016llx",
                static_cast<unsigned long long>(summary.checksum));
  std::string j = "{\n";
  absl::StrAppend(&j, "  \"data\": ", JsonString(data), ",\n");
  absl::StrAppend(&j, "  \"batch_size\": ", flags.batch_size, ",\n");
  absl::StrAppend(&j, "  \"transform\": ", JsonString(TransformName(flags.transform)), ",\n");
  absl::StrAppend(&j, "  \"layout\": ", JsonString(LayoutName(flags.layout)), ",\n");
  absl::StrAppend(&j, "  \"device\": ", JsonString(flags.device), ",\n");
  absl::StrAppend(&j, "  \"seed\": ", flags.seed, ",\n");
  absl::StrAppend(&j, "  \"images_per_s\": ", JsonNumber(summary.images_per_s), ",\n");
  absl::StrAppend(&j, "  \"cpu_seconds_per_image\": ", JsonNumber(summary.cpu_seconds_per_image),
                  ",\n");
  absl::StrAppend(&j, "  \"peak_rss_bytes\": ", summary.peak_rss_bytes, ",\n");
  absl::StrAppend(&j, "  \"workers\": ", st.workers, ",\n");
  absl::StrAppend(&j, "  \"prefetch\": ", st.prefetch, ",\n");
  absl::StrAppend(&j, "  \"io_depth\": ", st.io_depth, ",\n");
  absl::StrAppend(&j, "  \"bottleneck\": ", JsonString(st.bottleneck), ",\n");
  absl::StrAppend(&j, "  \"bottleneck_reason\": ", JsonString(st.bottleneck_reason), ",\n");
  absl::StrAppend(&j, "  \"consumer_wait_fraction\": ", JsonNumber(st.consumer_wait_fraction),
                  ",\n");
  absl::StrAppend(&j, "  \"errors\": ", st.error_count, ",\n");
  absl::StrAppend(&j, "  \"checksum\": ", JsonString(checksum), ",\n");
  absl::StrAppend(&j, "  \"summary_first_epoch\": ", summary.first_steady_epoch, ",\n");
  j += "  \"epochs\": [";
  for (size_t i = 0; i < epochs.size(); ++i) {
    const EpochResult& e = epochs[i];
    absl::StrAppend(&j, i == 0 ? "\n" : ",\n", "    {\"epoch\": ", e.epoch,
                    ", \"images\": ", e.images, ", \"seconds\": ", JsonNumber(e.seconds),
                    ", \"images_per_s\": ", JsonNumber(e.images_per_s()),
                    ", \"cpu_seconds\": ", JsonNumber(e.cpu_seconds), "}");
  }
  j += epochs.empty() ? "]\n" : "\n  ]\n";
  j += "}\n";
  return j;
}

// Written to a temporary file and renamed, so that a reader never sees half a result.
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

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "feedline-bench: %s\n", status.ToString().c_str());
  return kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<BenchFlags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "feedline-bench: %s\n(--help lists the options)\n",
                 std::string(parsed.status().message()).c_str());
    return kExitUsage;
  }
  const BenchFlags& flags = *parsed;
  if (flags.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }

  std::string data = flags.data;
  if (data.empty()) {
    absl::StatusOr<std::string> bundled = EnsureBundledData(argv[0], flags.quiet);
    if (!bundled.ok()) return Fail(bundled.status());
    data = *bundled;
  }

  feedline::LoaderOptions options(data);
  options.batch_size(flags.batch_size)
      .seed(flags.seed)
      .transform(flags.transform)
      .layout(flags.layout)
      .workers(flags.workers)
      .prefetch(flags.prefetch)
      .io_depth(flags.io_depth);
  absl::StatusOr<std::unique_ptr<feedline::Loader>> created =
      feedline::Loader::Create(std::move(options));
  if (!created.ok()) return Fail(created.status());
  feedline::Loader& loader = **created;

  std::printf(
      "feedline-bench: %s: %zu images, batch size %lld (%lld batches/epoch), transform %s, "
      "layout %s, device %s\n",
      data.c_str(), loader.dataset().samples.size(), static_cast<long long>(flags.batch_size),
      static_cast<long long>(loader.num_batches()), TransformName(flags.transform).c_str(),
      LayoutName(flags.layout).c_str(), flags.device.c_str());
  std::fflush(stdout);

  ProgressLine progress(!flags.quiet && isatty(STDERR_FILENO));
  BatchChecksum checksum;
  std::vector<EpochResult> epochs;
  for (int e = 0; e < flags.epochs; ++e) {
    const double cpu_start = CpuSeconds();
    const Clock::time_point start = Clock::now();
    std::unique_ptr<feedline::Epoch> epoch = loader.StartEpoch();
    EpochResult result;
    result.epoch = epoch->epoch();
    int64_t batches = 0;
    while (true) {
      absl::StatusOr<feedline::Batch> batch = epoch->Next();
      if (absl::IsOutOfRange(batch.status())) break;
      if (!batch.ok()) {
        progress.Clear();
        return Fail(batch.status());
      }
      checksum.Add(*batch);
      result.images += batch->size();
      ++batches;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      progress.Show(absl::StrCat(
          "epoch ", e + 1, "/", flags.epochs, "  batch ", batches, "/", epoch->num_batches(), "  ",
          static_cast<int64_t>(elapsed > 0 ? result.images / elapsed : 0), " images/s"));
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.cpu_seconds = CpuSeconds() - cpu_start;
    progress.Clear();
    std::printf("epoch %lld: %lld images in %.2f s: %.1f images/s, %.2f ms CPU/image\n",
                static_cast<long long>(result.epoch), static_cast<long long>(result.images),
                result.seconds, result.images_per_s(),
                result.images > 0 ? 1e3 * result.cpu_seconds / result.images : 0.0);
    std::fflush(stdout);
    epochs.push_back(result);
  }

  Summary summary;
  summary.first_steady_epoch = epochs.size() > 1 ? 1 : 0;
  int64_t images = 0;
  double seconds = 0, cpu_seconds = 0;
  for (size_t i = summary.first_steady_epoch; i < epochs.size(); ++i) {
    images += epochs[i].images;
    seconds += epochs[i].seconds;
    cpu_seconds += epochs[i].cpu_seconds;
  }
  // Total images over total time (not the mean of the epochs' rates, which would overweight
  // short epochs).
  summary.images_per_s = seconds > 0 ? images / seconds : 0;
  summary.cpu_seconds_per_image = images > 0 ? cpu_seconds / images : 0;
  summary.peak_rss_bytes = PeakRssBytes();
  summary.stats = loader.stats();
  summary.checksum = checksum.value();

  const feedline::Stats& st = summary.stats;
  const std::string over = epochs.size() > 1
                               ? absl::StrCat("epochs ", summary.first_steady_epoch + 1, "..",
                                              epochs.size(), " of ", epochs.size())
                               : std::string("1 epoch");
  std::printf("images/s:        %.1f (%s)\n", summary.images_per_s, over.c_str());
  std::printf("CPU s/image:     %.6f (%.2f ms)\n", summary.cpu_seconds_per_image,
              1e3 * summary.cpu_seconds_per_image);
  std::printf("peak RSS:        %.1f MiB\n", summary.peak_rss_bytes / (1024.0 * 1024.0));
  std::printf("workers:         %d\n", st.workers);
  std::printf("prefetch:        %d\n", st.prefetch);
  std::printf("io_depth:        %d\n", st.io_depth);
  std::printf("consumer waited: %.1f%% of the time\n", 100.0 * st.consumer_wait_fraction);
  std::printf("bottleneck:      %s%s%s\n", st.bottleneck.c_str(),
              st.bottleneck_reason.empty() ? "" : ": ", st.bottleneck_reason.c_str());
  if (st.error_count > 0) {
    std::printf("errors:          %lld\n", static_cast<long long>(st.error_count));
  }
  std::printf("checksum:        %016llx\n", static_cast<unsigned long long>(summary.checksum));
  std::fflush(stdout);

  if (!flags.json.empty()) {
    absl::Status s = WriteTextFile(flags.json, ResultsJson(flags, data, epochs, summary));
    if (!s.ok()) return Fail(s);
  }
  return 0;
}
