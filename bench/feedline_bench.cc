// feedline-bench: how many images per second a feedline loader delivers on this machine, at what
// CPU cost, what limits it, and how it compares with torch's DataLoader and with the hardware.
//
//   feedline-bench                         # the bundled ImageNet-like set (made once), 3 epochs
//   feedline-bench --data ~/imagenet/train --workers 8 --json result.json
//   feedline-bench --io-latency-ms 20 --plot run.svg --trace run.trace.json
//   feedline-bench --tune-grid --json grid.json --plot grid.svg      # issue 4's table
//   feedline-bench --compare-torch --json cmp.json --plot cmp.svg    # issue 5's table
//   feedline-bench --compare-text --json text.json                   # text workloads
//   feedline-bench --compare-video --json video.json                 # video clips
//
// A plain run consumes batches as fast as the loader delivers them (or with a simulated
// training step, --consumer-ms), so the figures are the loader's ceiling. The first epoch
// includes warm-up (page cache, the autotuner's first moves), so the summary is taken over the
// epochs after it; every epoch is reported too.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bench_util.h"
#include "compare.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/stats.h"
#include "loader_run.h"
#include "process_tree.h"
#include "svg_plot.h"
#include "synthetic_images.h"
#include "tune_grid.h"
#ifdef FEEDLINE_BENCH_TORCH
#include "dataset_compare.h"
#endif

namespace {

namespace fs = std::filesystem;
using feedline::bench::Clock;

// The bundled data set: ImageNet-like images, 10 classes x 200. Its folder name carries a
// version so that a change here never reuses a set made by an older bench.
constexpr char kBundledName[] = "imagenet-like-v1";
constexpr int kBundledClasses = 10;
constexpr int kBundledPerClass = 200;
constexpr uint64_t kBundledSeed = 1;
// The pipeline-overhead set (--source synthetic): tiny JPEGs, named over and over in a list.
constexpr char kTinyName[] = "tiny-8x8-v1";
constexpr int kTinyDistinct = 256;
constexpr int64_t kTinySamples = 100000;

constexpr int64_t kDefaultBatch = 256;
constexpr int64_t kGridDefaultBatch = 64;
constexpr double kGridDefaultLatencyMs = 20;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    R"(usage: feedline-bench [options]

Measures the throughput of a feedline image loader: images/s, CPU seconds per image, peak
memory, the resources it chose and the stage that limits it.

data and loader:
  --data DIR            ImageFolder directory or list file (default: a bundled ImageNet-like
                        set of 2000 images in 10 classes, made once next to the executable
                        in data/imagenet-like-v1, or in ~/.cache/feedline when that folder
                        is not writable)
  --source files|synthetic
                        synthetic: measure the pipeline's own overhead in samples/s:
                        pre-decoded 1x1 samples (LoaderOptions::synthetic: no read, no
                        decode) over a list of tiny files made once in data/tiny-8x8-v1
                        (default files)
  --batch-size N        samples per batch (default 256; 64 with --tune-grid)
  --epochs N            epochs to run; the summary leaves out the first (default 3)
  --workers N|auto      decoder threads (default auto)
  --prefetch N|auto     batches in flight (default auto)
  --io-depth N|auto     reads in flight (default auto)
  --transform train|eval|eval_fast
                        RandomResizedCrop + flip, or Resize + CenterCrop (eval: torchvision's
                        pixels exactly; eval_fast: from a reduced decode) (default train)
  --layout nchw|nhwc    batch layout (default nchw)
  --device cpu          where batches are delivered (default cpu)
  --seed N              shuffling and augmentation seed (default 0)

simulation:
  --io-latency-ms X     adds X ms to every read, simulating remote storage (default 0;
                        with --tune-grid: regime (b)'s latency, default 20)
  --consumer-ms Y       the consumer spends Y ms per batch, simulating a training step
                        (default 0; with --tune-grid: regime (c)'s step, default twice the
                        time regime (a)'s best setting takes per batch)

modes:
  --tune-grid           auto against every fixed setting of workers {1,2,4} x prefetch
                        {2,8} x io depth {1,32} in three regimes: decode-bound, slow
                        storage, slow consumer; then auto, the best and the leanest setting
                        twice more, interleaved, for the ratios (about 57 x
                        (--grid-seconds + 1) seconds)
  --grid-seconds S      each setting's measurement window (default 6)
  --compare-torch       feedline (from C++ and from Python) against torch's DataLoader and
                        the all-cores full-decode limit, on the same files
  --compare-dataset     a C++ user data set (torch::data::Dataset: float tensors computed
                        from the index; overhead: 64 stored samples, the loaders' own
                        costs; cheap: all in memory; computed: made by each get();
                        costly: 64 sin() per float) through feedline vs
                        torch::data::make_data_loader with its best worker count (needs
                        the LibTorch adapter; batch 64 unless --batch-size)
  --compare-text        the text workloads on a bundled corpus (20,000 long-tailed
                        documents, a SentencePiece model from spm_train): feedline padded,
                        packed concat and bestfit rows against torch's DataLoader with
                        Python sentencepiece in its workers, and the tokenizer limit
                        (single-thread C++ encode x cores): tokens/s, CPU per token,
                        packing efficiency, peak memory
  --python-dataset      user Python datasets (pil: torchvision ImageFolder + transforms on
                        the bundled images; numpy: work that releases the GIL; python:
                        pure-Python parsing that holds it) through feedline.DataLoader,
                        automatic and with each executor forced, against torch's
                        DataLoader at each --torch-workers count (default 0,1,2,4), in two
                        interleaved rounds (means): images/s, CPU per image, first epoch,
                        peak RSS and PSS of the process tree
  --e2e                 the loaders inside a training loop (bench/e2e_compare.py): a Python
                        step that holds the GIL for C ms of CPU, then waits G ms for the
                        "GPU", at a GPU-bound, a launch-bound and a loader-bound (C, G);
                        feedline.ImageLoader, feedline.DataLoader (PIL ImageFolder),
                        feedline.TextLoader (padded; packed) and feedline.VideoLoader
                        (--compare-video's set, made once) against the same loop fed
                        ready batches (the ideal) and torch's
                        DataLoader at each --torch-workers count (default 1,2,3), two
                        interleaved rounds: samples/s end to end, the step's CPU stretch,
                        waits per step and at epoch starts, loader CPU, peak PSS
  --hog                 with --e2e: another process keeps one core busy throughout
  --compare-video       video clips (bench/video_compare.py) on a generated set (made once
                        with FFmpeg: 120 short H.264 files panning over real photos, two
                        resolutions, constant and variable frame rates): feedline.VideoLoader
                        against torch's DataLoader with a PyAV dataset at each
                        --torch-workers count (default 1,2,3) and the decode limit (FFmpeg
                        decoding the clips' frames on one thread x cores): clips/s
  --offload             offload to a Dask worker (bench/offload_compare.py): this process
                        pinned to one core (a node whose CPUs are taken) and one `dask
                        worker` on the other (the remote pool); ImageLoader (train) alone,
                        hybrid (offload=) and every batch from the worker, interleaved
                        turns of --epochs epochs (default 3): images/s, the trainer's CPU
                        per batch made and per batch received
  --offload-workload image|pil
                        with --offload: ImageLoader (default), or feedline.DataLoader over a
                        torchvision ImageFolder (PIL decodes: the dataset goes to the worker)
  --dataset-variant overhead|cheap|computed|costly|all
                        which of --compare-dataset's variants to run (default all)
  --torch-workers LIST  the DataLoader worker counts to try, e.g. 1,2,4 (default: 1, 2,
                        4, ... up to twice the cores; with --compare-dataset also 0, the
                        main thread)
  --python PATH         the interpreter for the Python contenders (default: the one CMake
                        found, else /usr/bin/python3)

output:
  --json FILE           also write the results as JSON to FILE
  --plot FILE.svg       draw the results: images/s and the tuner's settings over time (a
                        plain run), the grid's bars, or the comparison's bars
  --trace FILE.json     the loader's Chrome trace (Perfetto, chrome://tracing); a plain run
                        or --compare-torch (feedline from C++)
  --quiet               no progress display, no messages about making data sets
  --help                this text
)";

struct BenchFlags {
  std::string data;  // empty: the bundled set
  bool synthetic = false;
  int64_t batch_size = kDefaultBatch;
  int epochs = 3;
  int workers = feedline::kAuto;
  int prefetch = feedline::kAuto;
  int io_depth = feedline::kAuto;
  feedline::Transform transform = feedline::Transform::kTrain;
  feedline::Layout layout = feedline::Layout::kNCHW;
  std::string device = "cpu";
  uint64_t seed = 0;
  double io_latency_ms = 0;
  double consumer_ms = 0;
  bool tune_grid = false;
  double grid_seconds = 6;
  bool compare_torch = false;
  bool compare_dataset = false;
  bool compare_text = false;
  bool python_dataset = false;
  bool e2e = false;  // --e2e: the loaders inside a simulated training loop (e2e_compare.py)
  bool hog = false;  // --e2e --hog: another process busy on one core
  bool compare_video = false;  // --compare-video: bench/video_compare.py
  bool offload = false;        // --offload: bench/offload_compare.py
  std::string offload_workload = "image";  // --offload-workload image|pil
  std::string dataset_variant = "all";
  std::vector<int> torch_workers;  // empty: the default list
  std::string python;
  std::string json;
  std::string plot;
  std::string trace;
  bool quiet = false;
  bool help = false;
  std::set<std::string> given;  // the options on the command line
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
  if (!absl::SimpleAtoi(value, &n) || n < 1) {
    return BadValue(flag, value, "an integer >= 1 or auto");
  }
  return n;
}

absl::StatusOr<double> ParseMilliseconds(absl::string_view flag, absl::string_view value,
                                         double max) {
  double v = 0;
  if (!absl::SimpleAtod(value, &v) || !(v >= 0 && v <= max)) {
    return BadValue(flag, value, absl::StrCat("a number of milliseconds in [0, ", max, "]"));
  }
  return v;
}

// The options that take a value (all but the switches).
constexpr absl::string_view kValueFlags[] = {"--data",
                                             "--batch-size",
                                             "--epochs",
                                             "--workers",
                                             "--prefetch",
                                             "--io-depth",
                                             "--transform",
                                             "--layout",
                                             "--device",
                                             "--seed",
                                             "--json",
                                             "--io-latency-ms",
                                             "--consumer-ms",
                                             "--plot",
                                             "--trace",
                                             "--source",
                                             "--grid-seconds",
                                             "--torch-workers",
                                             "--python",
                                             "--dataset-variant",
                                             "--offload-workload"};
constexpr absl::string_view kSwitches[] = {
    "--quiet",          "--tune-grid", "--compare-torch", "--compare-dataset", "--compare-text",
    "--python-dataset", "--e2e",       "--hog",           "--compare-video",   "--offload"};

// Accepts "--flag value" and "--flag=value".
absl::StatusOr<BenchFlags> ParseFlags(int argc, char** argv) {
  BenchFlags flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      return flags;
    }
    if (std::find(std::begin(kSwitches), std::end(kSwitches), arg) != std::end(kSwitches)) {
      flags.given.insert(std::string(arg));
      if (arg == "--quiet") flags.quiet = true;
      if (arg == "--tune-grid") flags.tune_grid = true;
      if (arg == "--compare-torch") flags.compare_torch = true;
      if (arg == "--compare-dataset") flags.compare_dataset = true;
      if (arg == "--compare-text") flags.compare_text = true;
      if (arg == "--python-dataset") flags.python_dataset = true;
      if (arg == "--e2e") flags.e2e = true;
      if (arg == "--hog") flags.hog = true;
      if (arg == "--compare-video") flags.compare_video = true;
      if (arg == "--offload") flags.offload = true;
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
    flags.given.insert(std::string(name));

    if (name == "--data") {
      if (value.empty()) return BadValue(name, value, "a directory or list file");
      flags.data = std::string(value);
    } else if (name == "--offload-workload") {
      if (value != "image" && value != "pil") return BadValue(name, value, "image or pil");
      flags.offload_workload = std::string(value);
    } else if (name == "--dataset-variant") {
      if (value != "overhead" && value != "cheap" && value != "computed" && value != "costly" &&
          value != "all")
        return BadValue(name, value, "overhead, cheap, computed, costly or all");
      flags.dataset_variant = std::string(value);
    } else if (name == "--source") {
      if (value != "files" && value != "synthetic")
        return BadValue(name, value, "files or synthetic");
      flags.synthetic = value == "synthetic";
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
      } else if (value == "eval_fast") {
        flags.transform = feedline::Transform::kEvalFast;
      } else {
        return BadValue(name, value, "train, eval or eval_fast");
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
      // cpu, cuda or cuda:N; the loader says at once if this machine cannot use it.
      flags.device = std::string(value);
    } else if (name == "--seed") {
      if (!absl::SimpleAtoi(value, &flags.seed)) {
        return BadValue(name, value, "an unsigned integer");
      }
    } else if (name == "--io-latency-ms") {
      absl::StatusOr<double> ms = ParseMilliseconds(name, value, 60000);
      if (!ms.ok()) return ms.status();
      flags.io_latency_ms = *ms;
    } else if (name == "--consumer-ms") {
      absl::StatusOr<double> ms = ParseMilliseconds(name, value, 600000);
      if (!ms.ok()) return ms.status();
      flags.consumer_ms = *ms;
    } else if (name == "--grid-seconds") {
      if (!absl::SimpleAtod(value, &flags.grid_seconds) ||
          !(flags.grid_seconds > 0 && flags.grid_seconds <= 3600)) {
        return BadValue(name, value, "a number of seconds in (0, 3600]");
      }
    } else if (name == "--torch-workers") {
      flags.torch_workers.clear();
      for (absl::string_view item : absl::StrSplit(value, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(item, &n) || n < 0 || n > 256) {
          return BadValue(name, value,
                          "a comma-separated list of counts in [0, 256] (0: the main thread)");
        }
        flags.torch_workers.push_back(n);
      }
    } else if (name == "--python") {
      if (value.empty()) return BadValue(name, value, "an interpreter path");
      flags.python = std::string(value);
    } else if (name == "--json" || name == "--plot" || name == "--trace") {
      if (value.empty()) return BadValue(name, value, "a file name");
      std::string& target = name == "--json"   ? flags.json
                            : name == "--plot" ? flags.plot
                                               : flags.trace;
      target = std::string(value);
    } else {  // in kValueFlags but not handled above: a bug here, not in the command line
      return absl::InternalError(absl::StrCat("option ", name, " is not implemented"));
    }
  }
  return flags;
}

// The options that make no sense together; the message names them.
absl::Status CheckCombinations(const BenchFlags& f) {
  auto refuse = [&](absl::string_view mode, std::initializer_list<const char*> options,
                    absl::string_view why) -> absl::Status {
    for (const char* o : options) {
      if (f.given.count(o) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(o, " does not apply to ", mode, ": ", why));
      }
    }
    return absl::OkStatus();
  };
  if (int(f.tune_grid) + int(f.compare_torch) + int(f.compare_dataset) + int(f.compare_text) +
          int(f.python_dataset) + int(f.e2e) + int(f.compare_video) + int(f.offload) >
      1) {
    return absl::InvalidArgumentError(
        "--tune-grid, --compare-torch, --compare-dataset, --compare-text, --python-dataset, "
        "--e2e, --compare-video and --offload are separate runs");
  }
  if (f.hog && !f.e2e) return absl::InvalidArgumentError("--hog applies to --e2e only");
  if (f.given.count("--offload-workload") && !f.offload)
    return absl::InvalidArgumentError("--offload-workload applies to --offload only");
  if (f.compare_text || f.python_dataset || f.e2e || f.compare_video || f.offload) {
    const char* mode = f.compare_text     ? "--compare-text: "
                       : f.python_dataset ? "--python-dataset: "
                       : f.compare_video  ? "--compare-video: "
                       : f.offload        ? "--offload: "
                                          : "--e2e: ";
    for (const char* flag :
         {"--data", "--source", "--workers", "--prefetch", "--io-depth", "--transform", "--layout",
          "--device", "--io-latency-ms", "--consumer-ms", "--plot", "--trace", "--seed",
          "--batch-size", "--dataset-variant", "--grid-seconds"}) {
      if (f.given.count(flag) > 0) {
        if ((f.python_dataset || f.e2e || f.offload) && std::string_view(flag) == "--batch-size") {
          continue;
        }
        return absl::InvalidArgumentError(absl::StrCat(
            mode, flag,
            " does not apply (the bundled data, feedline with its automatic settings)"));
      }
    }
    return absl::OkStatus();
  }
  if (f.compare_dataset) {
    for (const char* flag : {"--data", "--source", "--workers", "--prefetch", "--io-depth",
                             "--transform", "--layout", "--device", "--io-latency-ms",
                             "--consumer-ms", "--plot", "--trace", "--python", "--seed"}) {
      if (f.given.count(flag) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--compare-dataset: ", flag,
            " does not apply (the data set is computed; feedline runs with its defaults)"));
      }
    }
    return absl::OkStatus();
  }
  if (f.tune_grid) {
    if (absl::Status s =
            refuse("--tune-grid", {"--workers", "--prefetch", "--io-depth"}, "the grid sets them");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = refuse("--tune-grid", {"--epochs"},
                                "each setting runs for --grid-seconds after a warm-up");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = refuse("--tune-grid", {"--trace", "--source"},
                                "the grid runs 39 loaders on the data set's files");
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = refuse("a run without --compare-dataset", {"--dataset-variant"},
                                     "it chooses the data set's variant");
             !f.compare_dataset && !s.ok()) {
    return s;
  } else if (absl::Status s = refuse("a run without --tune-grid", {"--grid-seconds"},
                                     "it sets the grid's window");
             !s.ok()) {
    return s;
  }
  if (f.compare_torch) {
    if (absl::Status s = refuse("--compare-torch", {"--io-latency-ms", "--consumer-ms"},
                                "the comparison measures the loaders' ceilings on local files");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = refuse("--compare-torch", {"--transform", "--layout", "--source"},
                                "the peer runs the standard training transform into NCHW "
                                "tensors, and the pipeline overhead is measured anyway");
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = refuse("a run without --compare-torch or --compare-dataset",
                                     {"--torch-workers", "--python"},
                                     "only the comparison "
                                     "runs Python");
             !s.ok()) {
    return s;
  }
  if (f.synthetic && f.given.count("--data") > 0) {
    return absl::InvalidArgumentError("--source synthetic uses its own tiny data set: no --data");
  }
  return absl::OkStatus();
}

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

// Where the bench's data sets live: next to the executable (the build tree), or, for an
// installed bench whose folder is not writable, in the user's cache folder.
fs::path DataSetDir(const char* name) {
  const fs::path beside = feedline::bench::ExecutableDir() / "data" / name;
  std::error_code ec;
  if (fs::is_directory(beside, ec) || CanCreate(beside)) return beside;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = xdg != nullptr && *xdg != '\0'     ? fs::path(xdg)
                         : home != nullptr && *home != '\0' ? fs::path(home) / ".cache"
                                                            : fs::temp_directory_path(ec);
  return cache / "feedline" / name;
}

// Makes the bundled set if it is not there yet; returns its path.
absl::StatusOr<std::string> EnsureBundledData(bool quiet) {
  const fs::path dir = DataSetDir(kBundledName);
  const int64_t total = int64_t{kBundledClasses} * kBundledPerClass;
  feedline::bench::ProgressLine line(!quiet);
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
        if (announced) line.Show(absl::StrCat("  ", done, "/", n, " images"), done == n);
      });
  line.Clear();
  if (!s.ok()) return s;
  if (announced) {
    std::fprintf(stderr, "feedline-bench: made %lld images in %.1f s\n",
                 static_cast<long long>(total), feedline::bench::SecondsSince(start));
  }
  return dir.string();
}

absl::StatusOr<std::string> EnsureTinyData() {
  return feedline::bench::EnsureTinyDataset(DataSetDir(kTinyName).string(), kTinyDistinct,
                                            kTinySamples);
}

bool IsExecutable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The interpreter for the Python contenders: --python, else the one CMake found (Debian's owns
// torch and torchvision here; the first python3 on PATH may be another), else /usr/bin/python3.
absl::StatusOr<std::string> FindPython(const BenchFlags& f) {
  if (!f.python.empty()) {
    if (!IsExecutable(f.python)) {
      return absl::NotFoundError(absl::StrCat("--python ", f.python, ": not an executable file"));
    }
    return f.python;
  }
  std::vector<std::string> candidates;
#ifdef FEEDLINE_BENCH_PYTHON
  candidates.push_back(FEEDLINE_BENCH_PYTHON);
#endif
  candidates.push_back("/usr/bin/python3");
  for (const std::string& c : candidates) {
    if (!c.empty() && IsExecutable(c)) return c;
  }
  return absl::NotFoundError("no Python interpreter found: pass --python PATH");
}

// The folder of the Python helpers: beside the executable (the build copies them there), else
// the source tree.
absl::StatusOr<std::string> FindScriptDir() {
  std::vector<fs::path> candidates = {feedline::bench::ExecutableDir()};
#ifdef FEEDLINE_BENCH_SOURCE_DIR
  candidates.emplace_back(FEEDLINE_BENCH_SOURCE_DIR);
#endif
  std::error_code ec;
  for (const fs::path& dir : candidates) {
    if (fs::exists(dir / "peer_torch.py", ec) && fs::exists(dir / "feedline_py.py", ec) &&
        fs::exists(dir / "bench_proc.py", ec)) {
      return dir.string();
    }
  }
  return absl::NotFoundError(
      "the bench's Python helpers (peer_torch.py, feedline_py.py) are "
      "neither beside the executable nor in the source tree");
}

// The build tree's Python package, if there is one (an installed bench relies on PYTHONPATH).
std::string FeedlinePythonPath() {
#ifdef FEEDLINE_BENCH_PYTHONPATH
  std::error_code ec;
  if (fs::exists(fs::path(FEEDLINE_BENCH_PYTHONPATH) / "feedline" / "__init__.py", ec)) {
    return FEEDLINE_BENCH_PYTHONPATH;
  }
#endif
  return "";
}

// 1, 2, 4, ... up to twice the cores (torch users often oversubscribe).
std::vector<int> DefaultTorchWorkers() {
  std::vector<int> out;
  for (int w = 1; w <= 2 * feedline::bench::Cores(); w *= 2) out.push_back(w);
  return out;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "feedline-bench: %s\n", status.ToString().c_str());
  return kExitFailure;
}

// Writes what the caller put into `json` (after opening the top-level object), closing it.
absl::Status FinishJson(const BenchFlags& flags, feedline::bench::JsonWriter& json) {
  json.EndObject();
  return feedline::bench::WriteTextFile(flags.json, json.Finish());
}

absl::Status WritePlot(const BenchFlags& flags, const feedline::bench::SvgFigure& figure) {
  if (flags.plot.empty()) return absl::OkStatus();
  return feedline::bench::WriteTextFile(flags.plot, figure.Render());
}

void BeginJson(const BenchFlags& flags, const std::string& mode, const std::string& data,
               feedline::bench::JsonWriter& json) {
  json.BeginObject();
  json.Key("mode").String(mode);
  json.Key("data").String(data);
  json.Key("batch_size").Integer(flags.batch_size);
  json.Key("seed").Integer(int64_t(flags.seed));
  json.Key("cores").Integer(feedline::bench::Cores());
}

int RunGrid(const BenchFlags& flags, const std::string& data) {
  feedline::bench::GridOptions options;
  options.data = data;
  options.batch_size = flags.batch_size;
  options.seed = flags.seed;
  options.transform = flags.transform;
  options.layout = flags.layout;
  options.io_latency_ms =
      flags.given.count("--io-latency-ms") > 0 ? flags.io_latency_ms : kGridDefaultLatencyMs;
  options.consumer_ms = flags.consumer_ms;
  options.seconds = flags.grid_seconds;
  absl::StatusOr<feedline::bench::GridResult> grid = feedline::bench::RunTuneGrid(options);
  if (!grid.ok()) return Fail(grid.status());
  feedline::bench::PrintGridSummary(*grid);
  if (!flags.json.empty()) {
    feedline::bench::JsonWriter json;
    BeginJson(flags, "tune_grid", data, json);
    feedline::bench::WriteGridJson(*grid, json);
    if (absl::Status s = FinishJson(flags, json); !s.ok()) return Fail(s);
  }
  feedline::bench::SvgFigure figure(
      absl::StrCat("feedline-bench --tune-grid: auto vs fixed "
                   "settings, batch ",
                   flags.batch_size));
  feedline::bench::AddGridPlot(*grid, figure);
  if (absl::Status s = WritePlot(flags, figure); !s.ok()) return Fail(s);
  return 0;
}

int RunDatasetCompare(const BenchFlags& flags) {
#ifdef FEEDLINE_BENCH_TORCH
  feedline::bench::DatasetCompareOptions options;
  options.batch_size = flags.given.count("--batch-size") ? flags.batch_size : 64;
  options.epochs = flags.epochs;
  options.quiet = flags.quiet;
  options.variant = flags.dataset_variant;
  if (flags.torch_workers.empty()) {
    options.torch_workers.push_back(0);
    for (int w : DefaultTorchWorkers()) options.torch_workers.push_back(w);
  } else {
    options.torch_workers = flags.torch_workers;
  }
  absl::StatusOr<std::vector<feedline::bench::DatasetVariantResult>> results =
      feedline::bench::RunDatasetComparison(options);
  if (!results.ok()) return Fail(results.status());
  if (!flags.json.empty()) {
    feedline::bench::JsonWriter json;
    json.BeginObject();
    json.Key("mode").String("compare_dataset");
    json.Key("batch_size").Integer(options.batch_size);
    json.Key("epochs").Integer(options.epochs);
    json.Key("cores").Integer(feedline::bench::Cores());
    feedline::bench::WriteDatasetJson(*results, json);
    if (absl::Status s = FinishJson(flags, json); !s.ok()) return Fail(s);
  }
  return 0;
#else
  (void)flags;
  return Fail(absl::FailedPreconditionError(
      "--compare-dataset: this feedline-bench was built without the LibTorch adapter"));
#endif
}

// --compare-text runs feedline-bench-text (beside this program): see feedline_bench_text.cc.
int RunTextCompare(const BenchFlags& flags) {
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  const std::vector<int> workers =
      flags.torch_workers.empty() ? DefaultTorchWorkers() : flags.torch_workers;
  std::vector<std::string> args = {
      (feedline::bench::ExecutableDir() / "feedline-bench-text").string(),
      "--data-dir",
      DataSetDir("text-v2").string(),
      "--python",
      *python,
      "--script-dir",
      *scripts,
      "--epochs",
      absl::StrCat(flags.epochs),
      "--torch-workers",
      absl::StrJoin(workers, ",")};
  if (!flags.json.empty()) args.insert(args.end(), {"--json", flags.json});
  if (flags.quiet) args.push_back("--quiet");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(argv[0], argv.data());
  return Fail(absl::ErrnoToStatus(errno, absl::StrCat("cannot run ", args[0])));
}

// Replaces this process with the bench script `args` (python, script, its arguments), the
// feedline build on its PYTHONPATH; returns only if it cannot.
int ExecPython(std::vector<std::string> args) {
  const std::string path = FeedlinePythonPath();
  if (!path.empty()) ::setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(argv[0], argv.data());
  return Fail(absl::ErrnoToStatus(errno, absl::StrCat("cannot run ", args[0])));
}

// --python-dataset runs bench/python_compare.py on the bundled images (see its docstring).
int RunPythonDatasetCompare(const BenchFlags& flags) {
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  absl::StatusOr<std::string> data = EnsureBundledData(flags.quiet);
  if (!data.ok()) return Fail(data.status());
  std::vector<std::string> args = {
      *python,
      (fs::path(*scripts) / "python_compare.py").string(),
      "--data",
      *data,
      "--epochs",
      absl::StrCat(flags.epochs),
      "--batch-size",
      absl::StrCat(flags.given.count("--batch-size") ? flags.batch_size : 64),
      "--torch-workers",
      flags.torch_workers.empty() ? std::string("0,1,2,4")
                                  : absl::StrJoin(flags.torch_workers, ",")};
  if (!flags.json.empty()) args.insert(args.end(), {"--json", flags.json});
  if (flags.quiet) args.push_back("--quiet");
  return ExecPython(std::move(args));
}

// --compare-video runs bench/video_compare.py on the generated videos (see its docstring).
// --offload runs bench/offload_compare.py on the bundled images (see its docstring).
int RunOffloadCompare(const BenchFlags& flags) {
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  absl::StatusOr<std::string> data = EnsureBundledData(flags.quiet);
  if (!data.ok()) return Fail(data.status());
  std::vector<std::string> args = {*python, (fs::path(*scripts) / "offload_compare.py").string(),
                                   *data};
  if (flags.given.count("--epochs")) {
    args.insert(args.end(), {"--epochs", absl::StrCat(flags.epochs)});
  }
  if (flags.given.count("--batch-size")) {
    args.insert(args.end(), {"--batch-size", absl::StrCat(flags.batch_size)});
  }
  args.insert(args.end(), {"--workload", flags.offload_workload});
  if (!flags.json.empty()) args.insert(args.end(), {"--json", flags.json});
  return ExecPython(std::move(args));
}

int RunVideoCompare(const BenchFlags& flags) {
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  std::vector<std::string> args = {*python, (fs::path(*scripts) / "video_compare.py").string(),
                                   "--data", DataSetDir("video-v1").string()};
  if (flags.given.count("--epochs"))
    args.insert(args.end(), {"--epochs", absl::StrCat(flags.epochs)});
  if (!flags.torch_workers.empty()) {
    args.insert(args.end(), {"--torch-workers", absl::StrJoin(flags.torch_workers, ",")});
  }
  if (!flags.json.empty()) args.insert(args.end(), {"--json", flags.json});
  if (flags.quiet) args.push_back("--quiet");
  return ExecPython(std::move(args));
}

// --e2e runs bench/e2e_compare.py on the bundled images (see its docstring).
int RunEndToEnd(const BenchFlags& flags) {
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  absl::StatusOr<std::string> data = EnsureBundledData(flags.quiet);
  if (!data.ok()) return Fail(data.status());
  // The text workloads' corpus and model, made by feedline-bench-text (it links SentencePiece).
  const std::string text_dir = DataSetDir("text-v2").string();
  absl::StatusOr<feedline::bench::ChildRun> prepared = feedline::bench::RunChild(
      {(feedline::bench::ExecutableDir() / "feedline-bench-text").string(), "--data-dir", text_dir,
       "--prepare"},
      {}, std::chrono::milliseconds(1000));
  if (!prepared.ok()) return Fail(prepared.status());
  if (prepared->exit_code != 0) {
    return Fail(absl::InternalError("--e2e: feedline-bench-text could not make the text corpus"));
  }
  std::vector<std::string> args = {*python,       (fs::path(*scripts) / "e2e_compare.py").string(),
                                   "--data",      *data,
                                   "--text-dir",  text_dir,
                                   "--video-dir", DataSetDir("video-v1").string()};
  if (flags.given.count("--epochs")) args.insert(args.end(), {"--epochs", absl::StrCat(flags.epochs)});
  if (flags.given.count("--batch-size")) {
    args.insert(args.end(), {"--batch-size", absl::StrCat(flags.batch_size)});
  }
  if (!flags.torch_workers.empty()) {
    args.insert(args.end(), {"--torch-workers", absl::StrJoin(flags.torch_workers, ",")});
  }
  if (flags.hog) args.push_back("--hog");
  if (!flags.json.empty()) args.insert(args.end(), {"--json", flags.json});
  if (flags.quiet) args.push_back("--quiet");
  return ExecPython(std::move(args));
}

int RunCompare(const BenchFlags& flags, const std::string& data) {
  std::error_code ec;
  if (!fs::is_directory(data, ec)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--compare-torch: ", data,
                     " is not an ImageFolder directory (the peer "
                     "reads it with torchvision.datasets.ImageFolder)")));
  }
  feedline::bench::CompareOptions options;
  options.data = data;
  options.batch_size = flags.batch_size;
  options.epochs = flags.epochs;
  options.seed = flags.seed;
  options.workers = flags.workers;
  options.prefetch = flags.prefetch;
  options.io_depth = flags.io_depth;
  options.torch_workers = flags.torch_workers.empty() ? DefaultTorchWorkers() : flags.torch_workers;
  options.trace = flags.trace;
  options.progress = !flags.quiet;
  absl::StatusOr<std::string> python = FindPython(flags);
  if (!python.ok()) return Fail(python.status());
  options.python = *python;
  absl::StatusOr<std::string> scripts = FindScriptDir();
  if (!scripts.ok()) return Fail(scripts.status());
  options.script_dir = *scripts;
  options.pythonpath = FeedlinePythonPath();
  absl::StatusOr<std::string> tiny = EnsureTinyData();
  if (!tiny.ok()) return Fail(tiny.status());
  options.tiny_list = *tiny;

  absl::StatusOr<feedline::bench::CompareResult> result = feedline::bench::RunComparison(options);
  if (!result.ok()) return Fail(result.status());
  feedline::bench::PrintComparison(*result);
  if (!flags.json.empty()) {
    feedline::bench::JsonWriter json;
    BeginJson(flags, "compare_torch", data, json);
    feedline::bench::WriteCompareJson(*result, json);
    if (absl::Status s = FinishJson(flags, json); !s.ok()) return Fail(s);
  }
  feedline::bench::SvgFigure figure(
      "feedline-bench --compare-torch: feedline vs torch's "
      "DataLoader vs the full-decode limit");
  feedline::bench::AddComparePlot(*result, figure);
  if (absl::Status s = WritePlot(flags, figure); !s.ok()) return Fail(s);
  return 0;
}

int RunPlain(const BenchFlags& flags, const std::string& data) {
  feedline::LoaderOptions options(data);
  options.batch_size(flags.batch_size)
      .seed(flags.seed)
      .transform(flags.transform)
      .layout(flags.layout)
      .workers(flags.workers)
      .prefetch(flags.prefetch)
      .io_depth(flags.io_depth)
      .simulated_read_latency_ms(flags.io_latency_ms)
      .device(flags.device);
  if (flags.synthetic) options.size(1).synthetic(true);
  absl::StatusOr<std::unique_ptr<feedline::Loader>> created =
      feedline::Loader::Create(std::move(options));
  if (!created.ok()) return Fail(created.status());
  feedline::Loader& loader = **created;

  const char* transform = flags.transform == feedline::Transform::kTrain  ? "train"
                          : flags.transform == feedline::Transform::kEval ? "eval"
                                                                          : "eval_fast";
  const char* layout = flags.layout == feedline::Layout::kNCHW ? "nchw" : "nhwc";
  std::printf(
      "feedline-bench: %s: %zu %s, batch size %lld (%lld batches/epoch), transform %s, "
      "layout %s, device %s, %d cores\n",
      data.c_str(), size_t(loader.dataset().size()), flags.synthetic ? "samples" : "images",
      static_cast<long long>(flags.batch_size), static_cast<long long>(loader.num_batches()),
      transform, layout, flags.device.c_str(), feedline::bench::Cores());
  if (flags.synthetic) {
    std::printf("pipeline overhead: pre-decoded samples (no read, no decode), 1x1 pixels\n");
  }
  if (flags.io_latency_ms > 0 || flags.consumer_ms > 0) {
    std::printf("simulated: +%.1f ms per read, a %.1f ms training step per batch\n",
                flags.io_latency_ms, flags.consumer_ms);
  }
  std::fflush(stdout);

  feedline::bench::EpochRunOptions run_options;
  run_options.epochs = flags.epochs;
  run_options.consumer_ms = flags.consumer_ms;
  run_options.progress = !flags.quiet;
  absl::StatusOr<feedline::bench::EpochRunResult> run =
      feedline::bench::RunEpochs(loader, run_options);
  if (!run.ok()) return Fail(run.status());
  const int64_t peak_rss = feedline::bench::PeakRssBytes();

  const feedline::Stats& st = run->stats;
  const size_t n = run->epochs.size();
  const std::string over =
      n > 1 ? absl::StrCat("epochs ", run->first_steady_epoch + 1, "..", n, " of ", n) : "1 epoch";
  const char* unit = flags.synthetic ? "samples" : "images";
  std::printf("%s/s:%*s%.1f (%s)\n", unit, flags.synthetic ? 7 : 8, "", run->images_per_s,
              over.c_str());
  std::printf("CPU s/%s:%*s%.6f (%.3f ms)\n", flags.synthetic ? "sample" : "image",
              flags.synthetic ? 4 : 5, "", run->cpu_seconds_per_image,
              1e3 * run->cpu_seconds_per_image);
  std::printf("peak RSS:        %.1f MiB\n", double(peak_rss) / (1024.0 * 1024.0));
  if (run->other_cores >= 0) {
    std::printf("other processes: %.2f cores busy meanwhile\n", run->other_cores);
  }
  std::printf("workers:         %d%s\n", st.workers, st.auto_workers ? " (auto)" : "");
  std::printf("prefetch:        %d%s\n", st.prefetch, st.auto_prefetch ? " (auto)" : "");
  std::printf("io_depth:        %d%s\n", st.io_depth, st.auto_io_depth ? " (auto)" : "");
  std::printf(
      "consumer waited: %.1f%% of the time (%.2f s, %.2f s of it for epochs' first batches)\n",
      100.0 * st.consumer_wait_fraction, st.consumer_wait_s, st.epoch_start_wait_s);
  std::printf("bottleneck:      %s%s%s\n", st.bottleneck.c_str(),
              st.bottleneck_reason.empty() ? "" : ": ", st.bottleneck_reason.c_str());
  feedline::bench::PrintTuning(st, 12);
  if (st.error_count > 0) {
    std::printf("errors:          %lld\n", static_cast<long long>(st.error_count));
  }
  std::printf("checksum:        %016llx\n", static_cast<unsigned long long>(run->checksum));

  feedline::bench::PipelineOverhead overhead;
  if (flags.synthetic) {
    absl::StatusOr<feedline::bench::PipelineOverhead> o =
        feedline::bench::EstimatePipelineOverhead(loader, *run);
    if (!o.ok()) return Fail(o.status());
    overhead = *o;
    feedline::bench::PrintPipelineOverhead(overhead);
  }
  std::fflush(stdout);

  if (!flags.trace.empty()) {
    if (absl::Status s = loader.SaveTrace(flags.trace); !s.ok()) return Fail(s);
  }
  if (!flags.json.empty()) {
    feedline::bench::JsonWriter json;
    BeginJson(flags, "run", data, json);
    char checksum[24];
    std::snprintf(checksum, sizeof(checksum), "%016llx",
                  static_cast<unsigned long long>(run->checksum));
    json.Key("source").String(flags.synthetic ? "synthetic" : "files");
    json.Key("transform").String(transform);
    json.Key("layout").String(layout);
    json.Key("device").String(flags.device);
    json.Key("io_latency_ms").Number(flags.io_latency_ms);
    json.Key("consumer_ms").Number(flags.consumer_ms);
    json.Key("images_per_s").Number(run->images_per_s);
    json.Key("cpu_seconds_per_image").Number(run->cpu_seconds_per_image);
    json.Key("peak_rss_bytes").Integer(peak_rss);
    json.Key("other_cores").Number(run->other_cores);
    json.Key("checksum").String(checksum);
    json.Key("summary_first_epoch").Integer(run->first_steady_epoch);
    json.Key("epochs").BeginArray();
    for (const feedline::bench::EpochFigures& e : run->epochs) {
      json.BeginObject(true);
      json.Key("epoch").Integer(e.epoch);
      json.Key("images").Integer(e.images);
      json.Key("start_s").Number(e.start_s);
      json.Key("seconds").Number(e.seconds);
      json.Key("images_per_s").Number(e.images_per_s());
      json.Key("cpu_seconds").Number(e.cpu_seconds);
      json.EndObject();
    }
    json.EndArray();
    feedline::bench::WriteStatsJson(st, /*timeline=*/true, json);
    if (flags.synthetic) feedline::bench::WritePipelineOverheadJson(overhead, json);
    if (absl::Status s = FinishJson(flags, json); !s.ok()) return Fail(s);
  }
  feedline::bench::SvgFigure figure(absl::StrFormat(
      "feedline-bench: %s, batch %d%s", fs::path(data).filename().string(), flags.batch_size,
      flags.io_latency_ms > 0 || flags.consumer_ms > 0
          ? absl::StrFormat(", +%.1f ms/read, %.1f ms step", flags.io_latency_ms, flags.consumer_ms)
          : std::string()));
  feedline::bench::AddTimelinePlot(st, run->epochs, figure);
  if (absl::Status s = WritePlot(flags, figure); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<BenchFlags> parsed = ParseFlags(argc, argv);
  if (parsed.ok()) {
    if (absl::Status s = CheckCombinations(*parsed); !s.ok()) parsed = s;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "feedline-bench: %s\n(--help lists the options)\n",
                 std::string(parsed.status().message()).c_str());
    return kExitUsage;
  }
  BenchFlags& flags = *parsed;
  if (flags.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.tune_grid && flags.given.count("--batch-size") == 0) {
    flags.batch_size = kGridDefaultBatch;
  }

  if (flags.compare_dataset) return RunDatasetCompare(flags);
  if (flags.compare_text) return RunTextCompare(flags);
  if (flags.python_dataset) return RunPythonDatasetCompare(flags);
  if (flags.e2e) return RunEndToEnd(flags);
  if (flags.compare_video) return RunVideoCompare(flags);
  if (flags.offload) return RunOffloadCompare(flags);
  std::string data = flags.data;
  if (flags.synthetic) {
    absl::StatusOr<std::string> tiny = EnsureTinyData();
    if (!tiny.ok()) return Fail(tiny.status());
    data = *tiny;
  } else if (data.empty()) {
    absl::StatusOr<std::string> bundled = EnsureBundledData(flags.quiet);
    if (!bundled.ok()) return Fail(bundled.status());
    data = *bundled;
  }
  if (flags.tune_grid) return RunGrid(flags, data);
  if (flags.compare_torch) return RunCompare(flags, data);
  return RunPlain(flags, data);
}
