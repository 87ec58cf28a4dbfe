#include "compare.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "feedline/files.h"
#include "process_tree.h"

namespace feedline::bench {
namespace {

constexpr double kPeerTarget = 3.3;     // feedline from Python (train) / the peer, images/s
constexpr double kDecodeTarget = 0.95;  // feedline / the all-cores full-decode limit
constexpr double kFloorTarget = 0.85;   // feedline from Python (train) / the 1/8-scale floor
constexpr double kMemoryTarget = 1.0;   // feedline's peak / the peer's total
constexpr int64_t kTinyCostSamples = 20000;
constexpr std::chrono::milliseconds kMemoryInterval(100);

constexpr double kMiB = 1024.0 * 1024.0;

const char* Verdict(bool met) { return met ? "met" : "NOT met"; }

double ChildrenCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  return double(ru.ru_utime.tv_sec) + double(ru.ru_utime.tv_usec) * 1e-6 +
         double(ru.ru_stime.tv_sec) + double(ru.ru_stime.tv_usec) * 1e-6;
}

// The steady-state figures of a contender's epochs: everything after the first epoch (when
// there is more than one), total images over total time.
void Summarize(Contender& c) {
  const size_t first = c.epochs.size() > 1 ? 1 : 0;
  int64_t images = 0;
  double seconds = 0, cpu = 0;
  for (size_t i = first; i < c.epochs.size(); ++i) {
    images += c.epochs[i].images;
    seconds += c.epochs[i].seconds;
    cpu += c.epochs[i].cpu_seconds;
  }
  c.images_per_s = seconds > 0 ? double(images) / seconds : 0;
  c.cpu_seconds_per_image = images > 0 ? cpu / double(images) : 0;
}

// "key=value key=value ..." after the line's first word.
std::map<std::string, std::string> Fields(absl::string_view line) {
  std::map<std::string, std::string> out;
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const size_t eq = word.find('=');
    if (eq != absl::string_view::npos) {
      out[std::string(word.substr(0, eq))] = std::string(word.substr(eq + 1));
    }
  }
  return out;
}

// Runs one of the Python helpers and reads its epochs back.
absl::StatusOr<Contender> RunPythonContender(const CompareOptions& o, const std::string& script,
                                             const std::vector<std::string>& extra_args,
                                             std::string name) {
  std::vector<std::string> argv = {
      o.python,       (std::filesystem::path(o.script_dir) / script).string(),
      "--data",       o.data,
      "--epochs",     absl::StrCat(o.epochs),
      "--batch-size", absl::StrCat(o.batch_size),
      "--seed",       absl::StrCat(o.seed)};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  std::vector<std::string> env = {"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"};
  if (!o.pythonpath.empty()) {
    const char* existing = std::getenv("PYTHONPATH");
    env.push_back(absl::StrCat("PYTHONPATH=", o.pythonpath,
                               existing != nullptr && *existing != '\0' ? ":" : "",
                               existing != nullptr ? existing : ""));
  }
  const double busy0 = MachineBusySeconds(), children0 = ChildrenCpuSeconds(), own0 = CpuSeconds();
  absl::StatusOr<ChildRun> run = RunChild(argv, env, kMemoryInterval);
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::InternalError(absl::StrCat(name, ": ", absl::StrJoin(argv, " "),
                                            " exited with status ", run->exit_code,
                                            " (its messages are above)"));
  }
  Contender c;
  c.name = std::move(name);
  for (const std::string& line : run->stdout_lines) {
    std::map<std::string, std::string> f = Fields(line);
    if (line.rfind("epoch ", 0) == 0) {
      EpochFigures e;
      if (!absl::SimpleAtoi(f["index"], &e.epoch) || !absl::SimpleAtoi(f["images"], &e.images) ||
          !absl::SimpleAtod(f["seconds"], &e.seconds) ||
          !absl::SimpleAtod(f["cpu_seconds"], &e.cpu_seconds)) {
        return absl::InternalError(absl::StrCat(c.name, ": unreadable line '", line, "'"));
      }
      c.epochs.push_back(e);
    } else if (line.rfind("info ", 0) == 0) {
      for (auto& [k, v] : f) c.info[k] = v;
    }
  }
  if (int(c.epochs.size()) != o.epochs) {
    return absl::InternalError(
        absl::StrCat(c.name, ": reported ", c.epochs.size(), " epochs instead of ", o.epochs));
  }
  Summarize(c);
  c.peak_bytes = run->memory.peak_bytes();
  c.pss_bytes = run->memory.pss_near_peak_bytes;
  c.processes = run->memory.max_processes;
  const double busy = MachineBusySeconds() - busy0;
  const double theirs = ChildrenCpuSeconds() - children0, ours = CpuSeconds() - own0;
  if (busy0 >= 0 && run->seconds > 0) {
    c.other_cores = std::max(0.0, busy - theirs - ours) / run->seconds;
  }
  return c;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", double(bytes) / kMiB); }

// Creates a loader (kept in *loader for the caller's figures) and runs the comparison's epochs.
absl::StatusOr<EpochRunResult> CreateAndRun(feedline::LoaderOptions options,
                                            const CompareOptions& o,
                                            std::unique_ptr<feedline::Loader>* loader) {
  absl::StatusOr<std::unique_ptr<feedline::Loader>> created =
      feedline::Loader::Create(std::move(options));
  if (!created.ok()) return created.status();
  *loader = *std::move(created);
  EpochRunOptions run_options;
  run_options.epochs = o.epochs;
  run_options.progress = o.progress;
  run_options.label = "  ";
  return RunEpochs(**loader, run_options);
}

std::string Others(double cores) {
  return cores < 0 ? std::string("n/a") : absl::StrFormat("%.2f", cores);
}

}  // namespace

double PipelineOverhead::pipeline_cpu_us_per_sample() const {
  return std::max(0.0, cpu_us_per_sample - read_decode_us_per_sample);
}

double PipelineOverhead::pipeline_only_samples_per_s() const {
  const double us = pipeline_cpu_us_per_sample();
  return us > 0 ? 1e6 * cores / us : 0;
}

absl::StatusOr<PipelineOverhead> EstimatePipelineOverhead(const feedline::Loader& loader,
                                                          const EpochRunResult& run) {
  PipelineOverhead o;
  // With LoaderOptions::synthetic nothing is read or decoded: all the CPU is the pipeline's.
  if (!loader.options().synthetic()) {
    std::vector<std::string> paths;
    const auto& files = dynamic_cast<const feedline::FileDataset&>(loader.dataset()).files();
    for (const feedline::Sample& s : files.samples) {
      paths.push_back(s.path);
      if (int64_t(paths.size()) >= kTinyCostSamples) break;
    }
    absl::StatusOr<TinyCost> tiny = MeasureReadAndDecode(paths, kTinyCostSamples);
    if (!tiny.ok()) return tiny.status();
    o.read_decode_us_per_sample = 1e6 * tiny->seconds_per_sample();
  }
  o.cores = Cores();
  o.samples_per_s = run.images_per_s;
  o.cpu_us_per_sample = 1e6 * run.cpu_seconds_per_image;
  o.other_cores = run.other_cores;
  return o;
}

void PrintPipelineOverhead(const PipelineOverhead& o) {
  std::printf(
      "pipeline overhead: %.0f samples/s of pre-decoded samples (no read, no decode): target >= "
      "%.0f samples/s: %s\n"
      "  CPU per sample %.2f us (all threads; reading + decoding: %.2f us), so the pipeline's "
      "own cost is %.2f us of CPU per sample: %.0f samples/s on %d cores\n",
      o.samples_per_s, kPipelineTarget, Verdict(o.samples_per_s >= kPipelineTarget),
      o.cpu_us_per_sample, o.read_decode_us_per_sample, o.pipeline_cpu_us_per_sample(),
      o.pipeline_only_samples_per_s(), o.cores);
}

void WritePipelineOverheadJson(const PipelineOverhead& o, JsonWriter& json) {
  json.Key("pipeline_overhead").BeginObject();
  json.Key("source").String("pre-decoded samples (LoaderOptions::synthetic), output size 1");
  json.Key("samples_per_s").Number(o.samples_per_s);
  json.Key("target_samples_per_s").Number(kPipelineTarget);
  json.Key("target_met").Boolean(o.samples_per_s >= kPipelineTarget);
  json.Key("cpu_us_per_sample").Number(o.cpu_us_per_sample);
  json.Key("read_decode_us_per_sample_one_thread").Number(o.read_decode_us_per_sample);
  json.Key("estimated_pipeline_cpu_us_per_sample").Number(o.pipeline_cpu_us_per_sample());
  json.Key("estimated_pipeline_only_samples_per_s").Number(o.pipeline_only_samples_per_s());
  json.Key("cores").Integer(o.cores);
  json.Key("other_cores").Number(o.other_cores);
  json.EndObject();
}

absl::StatusOr<CompareResult> RunComparison(const CompareOptions& o) {
  CompareResult r;
  r.options = o;
  r.cores = Cores();
  const Clock::time_point start = Clock::now();
  absl::StatusOr<feedline::FileList> dataset = feedline::ScanFileList(o.data);
  if (!dataset.ok()) return dataset.status();
  std::vector<std::string> files;
  for (const feedline::Sample& s : dataset->samples) files.push_back(s.path);
  r.files = int64_t(files.size());
  std::printf(
      "feedline-bench --compare-torch: %s: %lld images, batch size %lld, %d epochs per "
      "contender (figures over epochs 2..%d), %d cores\n",
      o.data.c_str(), static_cast<long long>(r.files), static_cast<long long>(o.batch_size),
      o.epochs, o.epochs, r.cores);

  std::printf("\n[0/5] warming the page cache\n");
  std::fflush(stdout);
  const Clock::time_point warm = Clock::now();
  absl::StatusOr<int64_t> bytes = WarmPageCache(files);
  if (!bytes.ok()) return bytes.status();
  r.bytes = *bytes;
  r.warm_cache_s = SecondsSince(warm);
  std::printf("  read %.1f MiB in %.2f s\n", double(r.bytes) / kMiB, r.warm_cache_s);

  // The floor around feedline's contenders (see CompareResult::floor_checks).
  auto check_floor = [&]() -> absl::Status {
    absl::StatusOr<DecodeLimit> f = MeasureDecodeLimit(files, r.cores, /*eighths=*/1);
    if (!f.ok()) return f.status();
    r.floor_checks.push_back(f->limit_images_per_s());
    std::printf("  (1/8-scale floor now: %.1f images/s on %d cores)\n", f->limit_images_per_s(),
                r.cores);
    return absl::OkStatus();
  };
  // (Not before the C++ contender: the files it holds in memory would count in that
  // contender's peak memory, the process' high-water mark.)

  std::printf("\n[1/5] feedline from C++ (this process), default settings\n");
  std::fflush(stdout);
  {
    feedline::LoaderOptions options(o.data);
    options.batch_size(o.batch_size)
        .seed(o.seed)
        .workers(o.workers)
        .prefetch(o.prefetch)
        .io_depth(o.io_depth);
    std::unique_ptr<feedline::Loader> loader;
    absl::StatusOr<EpochRunResult> run = CreateAndRun(std::move(options), o, &loader);
    if (!run.ok()) return run.status();
    Contender& c = r.feedline_cpp;
    c.name = "feedline from C++";
    c.epochs = run->epochs;
    Summarize(c);
    c.peak_bytes = PeakRssBytes();  // nothing big has been allocated before it
    c.other_cores = run->other_cores;
    r.feedline_cpp_stats = run->stats;
    if (!o.trace.empty()) {
      if (absl::Status s = loader->SaveTrace(o.trace); !s.ok()) return s;
    }
  }
  if (absl::Status s = check_floor(); !s.ok()) return s;

  std::printf("\n[2/5] feedline from Python (%s), default settings\n", o.python.c_str());
  std::fflush(stdout);
  {
    const auto setting = [](int v) {
      return v == feedline::kAuto ? std::string("auto") : absl::StrCat(v);
    };
    absl::StatusOr<Contender> c =
        RunPythonContender(o, "feedline_py.py",
                           {"--workers", setting(o.workers), "--prefetch", setting(o.prefetch),
                            "--io-depth", setting(o.io_depth)},
                           "feedline from Python");
    if (!c.ok()) return c.status();
    r.feedline_py = *std::move(c);
  }
  if (absl::Status s = check_floor(); !s.ok()) return s;

  std::printf("\n[3/5] the peer: torch DataLoader + torchvision ImageFolder, workers %s\n",
              absl::StrJoin(o.torch_workers, ", ").c_str());
  std::fflush(stdout);
  for (int w : o.torch_workers) {
    absl::StatusOr<Contender> c = RunPythonContender(
        o, "peer_torch.py", {"--workers", absl::StrCat(w)},
        absl::StrCat("torch DataLoader (", w, w == 1 ? " worker)" : " workers)"));
    if (!c.ok()) return c.status();
    c->torch_workers = w;
    std::printf("  %d worker%s: %.1f images/s, %.3f ms CPU/image, peak %s over %d processes\n", w,
                w == 1 ? "" : "s", c->images_per_s, 1e3 * c->cpu_seconds_per_image,
                Mib(c->peak_bytes).c_str(), c->processes);
    std::fflush(stdout);
    r.peer_trials.push_back(*std::move(c));
    if (r.peer_trials.back().images_per_s > r.peer_trials[r.peer_best].images_per_s) {
      r.peer_best = r.peer_trials.size() - 1;
    }
  }

  std::printf("\n[4/5] the full-decode limit: one thread, tjDecompress2 to RGB from memory\n");
  std::fflush(stdout);
  absl::StatusOr<DecodeLimit> decode = MeasureDecodeLimit(files, r.cores);
  if (!decode.ok()) return decode.status();
  r.decode = *decode;
  std::printf(
      "  %lld images (%.0f megapixels) in %.2f s: %.1f images/s on one thread, x %d "
      "cores = %.1f images/s\n",
      static_cast<long long>(r.decode.images), r.decode.megapixels, r.decode.seconds,
      r.decode.single_thread_images_per_s(), r.cores, r.decode.limit_images_per_s());
  absl::StatusOr<DecodeLimit> floor = MeasureDecodeLimit(files, r.cores, /*eighths=*/1);
  if (!floor.ok()) return floor.status();
  r.floor = *floor;
  r.floor_checks.push_back(r.floor.limit_images_per_s());
  double sum = 0;
  for (double f : r.floor_checks) sum += f;
  r.floor_mean = sum / double(r.floor_checks.size());
  std::printf(
      "  at 1/8 scale (DC-only IDCT, the entropy-decoding floor): %.1f images/s on one "
      "thread, x %d cores = %.1f images/s\n",
      r.floor.single_thread_images_per_s(), r.cores, r.floor.limit_images_per_s());
  absl::StatusOr<DecodeLimit> floor_all = MeasureDecodeAllCores(files, r.cores, /*eighths=*/1);
  if (!floor_all.ok()) return floor_all.status();
  r.floor_all_cores = *floor_all;
  std::printf(
      "  at 1/8 scale on %d threads at once: %.1f images/s (%.3f ms CPU per image, against "
      "%.3f on one thread alone)\n",
      r.cores, r.floor_all_cores.images_per_s(), 1e3 * r.floor_all_cores.cpu_seconds_per_image(),
      1e3 * r.floor.cpu_seconds_per_image());

  std::printf("\n[5/5] pipeline overhead: feedline on pre-decoded samples (%s)\n",
              o.tiny_list.c_str());
  std::fflush(stdout);
  {
    feedline::LoaderOptions options(o.tiny_list);
    // Pre-decoded samples (no read, no decode): what queues, slots and collation cost.
    options.batch_size(o.batch_size).seed(o.seed).size(1).synthetic(true);
    std::unique_ptr<feedline::Loader> loader;
    absl::StatusOr<EpochRunResult> run = CreateAndRun(std::move(options), o, &loader);
    if (!run.ok()) return run.status();
    absl::StatusOr<PipelineOverhead> overhead = EstimatePipelineOverhead(*loader, *run);
    if (!overhead.ok()) return overhead.status();
    r.overhead = *overhead;
  }
  r.seconds = SecondsSince(start);
  return r;
}

void PrintComparison(const CompareResult& r) {
  const Contender& peer = r.peer();
  const double base = peer.images_per_s;
  const auto plus = [&](double v) {
    return base > 0 ? absl::StrFormat("(%+.0f%%)", 100 * (v / base - 1)) : std::string();
  };
  std::vector<std::string> tried;
  for (const Contender& t : r.peer_trials) {
    tried.push_back(absl::StrFormat("%d: %.1f", t.torch_workers, t.images_per_s));
  }
  std::printf(
      "\nbaseline / optimized (epochs 2..%d of %d, %lld images each, batch %lld, "
      "%d cores; \"others\": cores other processes used meanwhile):\n",
      r.options.epochs, r.options.epochs, static_cast<long long>(r.files),
      static_cast<long long>(r.options.batch_size), r.cores);
  std::printf("  %-40s %18s %13s  %-40s %6s\n", "", "images/s", "CPU s/image", "peak memory",
              "others");
  std::printf("  %-40s %18.1f %13.6f  %-40s %6s\n",
              absl::StrFormat("torch DataLoader, best of {%s} workers",
                              absl::StrJoin(r.options.torch_workers, ","))
                  .c_str(),
              peer.images_per_s, peer.cpu_seconds_per_image,
              absl::StrFormat("%s (RSS sum of %d processes; PSS %s)", Mib(peer.peak_bytes),
                              peer.processes, Mib(peer.pss_bytes))
                  .c_str(),
              Others(peer.other_cores).c_str());
  std::printf("    (%d workers was best; images/s by workers: %s)\n", peer.torch_workers,
              absl::StrJoin(tried, ", ").c_str());
  for (const Contender* c : {&r.feedline_py, &r.feedline_cpp}) {
    std::printf(
        "  %-40s %18s %13.6f  %-40s %6s\n", (c->name + ", defaults").c_str(),
        absl::StrFormat("%.1f %s", c->images_per_s, plus(c->images_per_s)).c_str(),
        c->cpu_seconds_per_image,
        (Mib(c->peak_bytes) + (c == &r.feedline_py ? " (process tree)" : " (process)")).c_str(),
        Others(c->other_cores).c_str());
  }
  const double limit = r.decode.limit_images_per_s();
  std::printf("  %-40s %18s %13.6f  %-40s %6s\n",
              absl::StrFormat("full-decode limit (1 thread x %d cores)", r.cores).c_str(),
              absl::StrFormat("%.1f %s", limit, plus(limit)).c_str(),
              r.decode.cpu_seconds_per_image(), "(CPU: one full decode)", "");
  const double floor = r.floor.limit_images_per_s();
  std::printf("  %-40s %18s %13.6f  %-40s %6s\n",
              absl::StrFormat("1/8-scale floor (1 thread x %d cores)", r.cores).c_str(),
              absl::StrFormat("%.1f %s", floor, plus(floor)).c_str(),
              r.floor.cpu_seconds_per_image(), "(CPU: one 1/8-scale decode)", "");
  const double floor_all = r.floor_all_cores.images_per_s();
  std::printf("  %-40s %18s %13.6f  %-40s %6s\n",
              absl::StrFormat("1/8-scale floor (%d threads at once)", r.cores).c_str(),
              absl::StrFormat("%.1f %s", floor_all, plus(floor_all)).c_str(),
              r.floor_all_cores.cpu_seconds_per_image(),
              "(CPU: one 1/8-scale decode, all cores busy)", "");
  const feedline::Stats& st = r.feedline_cpp_stats;
  std::printf(
      "  feedline from C++ ended at workers %d, prefetch %d, io_depth %d; bottleneck: "
      "%s\n",
      st.workers, st.prefetch, st.io_depth, st.bottleneck.c_str());
  if (!r.feedline_py.info.empty()) {
    auto get = [&](const char* k) {
      auto it = r.feedline_py.info.find(k);
      return it == r.feedline_py.info.end() ? std::string("?") : it->second;
    };
    std::printf(
        "  feedline from Python ended at workers %s, prefetch %s, io_depth %s; "
        "bottleneck: %s\n",
        get("workers").c_str(), get("prefetch").c_str(), get("io_depth").c_str(),
        get("bottleneck").c_str());
  }
  std::printf("\n");
  PrintPipelineOverhead(r.overhead);

  const double py_vs_peer = base > 0 ? r.feedline_py.images_per_s / base : 0;
  const double cpp_vs_peer = base > 0 ? r.feedline_cpp.images_per_s / base : 0;
  const double cpp_vs_limit = limit > 0 ? r.feedline_cpp.images_per_s / limit : 0;
  const double py_vs_limit = limit > 0 ? r.feedline_py.images_per_s / limit : 0;
  const double py_vs_floor = r.floor_mean > 0 ? r.feedline_py.images_per_s / r.floor_mean : 0;
  const double cpp_vs_floor = r.floor_mean > 0 ? r.feedline_cpp.images_per_s / r.floor_mean : 0;
  const double peer_mem = double(peer.peak_bytes);
  const double cpp_mem = peer_mem > 0 ? double(r.feedline_cpp.peak_bytes) / peer_mem : 0;
  const double py_mem = peer_mem > 0 ? double(r.feedline_py.peak_bytes) / peer_mem : 0;
  std::printf("\ntargets:\n");
  std::printf(
      "  feedline from Python / peer, images/s:          %6.2fx (>= %.1f): %s  "
      "(from C++: %.2fx)\n",
      py_vs_peer, kPeerTarget, Verdict(py_vs_peer >= kPeerTarget), cpp_vs_peer);
  std::printf(
      "  feedline from C++ / full-decode limit:          %6.3fx (>= %.2f): %s  "
      "(from Python: %.3fx)\n",
      cpp_vs_limit, kDecodeTarget, Verdict(cpp_vs_limit >= kDecodeTarget), py_vs_limit);
  std::printf(
      "  feedline from Python / 1/8-scale floor:         %6.3fx (>= %.2f): %s  "
      "(from C++: %.3fx; against the run's mean floor, %.0f images/s, of its measurements after "
      "C++, after Python and at [4/5]: %s)\n",
      py_vs_floor, kFloorTarget, Verdict(py_vs_floor >= kFloorTarget), cpp_vs_floor, r.floor_mean,
      absl::StrJoin(r.floor_checks, ", ", [](std::string* out, double f) {
        absl::StrAppend(out, absl::StrFormat("%.0f", f));
      }).c_str());
  std::printf(
      "    against the floor measured on all %d cores at once (%.0f images/s): from Python "
      "%.3fx, from C++ %.3fx\n",
      r.cores, floor_all, floor_all > 0 ? r.feedline_py.images_per_s / floor_all : 0,
      floor_all > 0 ? r.feedline_cpp.images_per_s / floor_all : 0);
  std::printf(
      "  feedline peak memory / the peer's total:        %6.3fx (<= %.1f): %s  "
      "(from Python: %.3fx: %s)\n",
      cpp_mem, kMemoryTarget, Verdict(cpp_mem <= kMemoryTarget), py_mem,
      Verdict(py_mem <= kMemoryTarget));
  std::printf("  pipeline samples/s (pre-decoded samples):        %6.0f (>= %.0f): %s\n",
              r.overhead.samples_per_s, kPipelineTarget,
              Verdict(r.overhead.samples_per_s >= kPipelineTarget));
  std::printf("\n(%.0f s in all)\n", r.seconds);
  std::fflush(stdout);
}

namespace {

void WriteContender(const Contender& c, JsonWriter& json) {
  json.BeginObject();
  json.Key("name").String(c.name);
  json.Key("images_per_s").Number(c.images_per_s);
  json.Key("cpu_seconds_per_image").Number(c.cpu_seconds_per_image);
  json.Key("peak_memory_bytes").Integer(c.peak_bytes);
  if (c.pss_bytes >= 0) json.Key("pss_near_peak_bytes").Integer(c.pss_bytes);
  json.Key("processes").Integer(c.processes);
  json.Key("other_cores").Number(c.other_cores);
  if (c.torch_workers > 0) json.Key("num_workers").Integer(c.torch_workers);
  if (!c.info.empty()) {
    json.Key("info").BeginObject(true);
    for (const auto& [k, v] : c.info) json.Key(k).String(v);
    json.EndObject();
  }
  json.Key("epochs").BeginArray();
  for (const EpochFigures& e : c.epochs) {
    json.BeginObject(true);
    json.Key("epoch").Integer(e.epoch);
    json.Key("images").Integer(e.images);
    json.Key("seconds").Number(e.seconds);
    json.Key("cpu_seconds").Number(e.cpu_seconds);
    json.EndObject();
  }
  json.EndArray();
  json.EndObject();
}

void Ratio(JsonWriter& json, const char* key, double value, double target, bool at_least) {
  json.Key(key).BeginObject(true);
  json.Key("value").Number(value);
  json.Key(at_least ? "target_at_least" : "target_at_most").Number(target);
  json.Key("met").Boolean(at_least ? value >= target : value <= target);
  json.EndObject();
}

}  // namespace

void WriteCompareJson(const CompareResult& r, JsonWriter& json) {
  const Contender& peer = r.peer();
  const double limit = r.decode.limit_images_per_s();
  json.Key("compare_torch").BeginObject();
  json.Key("data").String(r.options.data);
  json.Key("images").Integer(r.files);
  json.Key("bytes").Integer(r.bytes);
  json.Key("batch_size").Integer(r.options.batch_size);
  json.Key("epochs").Integer(r.options.epochs);
  json.Key("summary_epochs").String(absl::StrCat("2..", r.options.epochs));
  json.Key("cores").Integer(r.cores);
  json.Key("seconds").Number(r.seconds);
  json.Key("peer").String(peer.name);
  json.Key("contenders").BeginObject();
  json.Key("feedline_cpp");
  WriteContender(r.feedline_cpp, json);
  json.Key("feedline_python");
  WriteContender(r.feedline_py, json);
  json.Key("torch_trials").BeginArray();
  for (const Contender& t : r.peer_trials) WriteContender(t, json);
  json.EndArray();
  json.EndObject();
  json.Key("feedline_cpp_stats").BeginObject();
  WriteStatsJson(r.feedline_cpp_stats, /*timeline=*/false, json);
  json.EndObject();
  json.Key("decode_limit").BeginObject();
  json.Key("images").Integer(r.decode.images);
  json.Key("megapixels").Number(r.decode.megapixels);
  json.Key("seconds").Number(r.decode.seconds);
  json.Key("thread_cpu_seconds").Number(r.decode.thread_cpu_seconds);
  json.Key("single_thread_images_per_s").Number(r.decode.single_thread_images_per_s());
  json.Key("cores").Integer(r.decode.cores);
  json.Key("images_per_s").Number(limit);
  json.EndObject();
  json.Key("eighth_scale_floor").BeginObject();
  json.Key("images").Integer(r.floor.images);
  json.Key("seconds").Number(r.floor.seconds);
  json.Key("thread_cpu_seconds").Number(r.floor.thread_cpu_seconds);
  json.Key("single_thread_images_per_s").Number(r.floor.single_thread_images_per_s());
  json.Key("images_per_s").Number(r.floor.limit_images_per_s());
  json.Key("all_cores_at_once").BeginObject();
  json.Key("images").Integer(r.floor_all_cores.images);
  json.Key("seconds").Number(r.floor_all_cores.seconds);
  json.Key("thread_cpu_seconds").Number(r.floor_all_cores.thread_cpu_seconds);
  json.Key("images_per_s").Number(r.floor_all_cores.images_per_s());
  json.EndObject();
  json.EndObject();
  WritePipelineOverheadJson(r.overhead, json);
  json.Key("ratios").BeginObject();
  const double base = peer.images_per_s;
  Ratio(json, "feedline_python_vs_peer", base > 0 ? r.feedline_py.images_per_s / base : 0,
        kPeerTarget, true);
  Ratio(json, "feedline_cpp_vs_peer", base > 0 ? r.feedline_cpp.images_per_s / base : 0,
        kPeerTarget, true);
  Ratio(json, "feedline_cpp_vs_decode_limit", limit > 0 ? r.feedline_cpp.images_per_s / limit : 0,
        kDecodeTarget, true);
  Ratio(json, "feedline_python_vs_decode_limit", limit > 0 ? r.feedline_py.images_per_s / limit : 0,
        kDecodeTarget, true);
  Ratio(json, "feedline_python_vs_eighth_scale_floor",
        r.floor_mean > 0 ? r.feedline_py.images_per_s / r.floor_mean : 0, kFloorTarget, true);
  Ratio(json, "feedline_cpp_vs_eighth_scale_floor",
        r.floor_mean > 0 ? r.feedline_cpp.images_per_s / r.floor_mean : 0, kFloorTarget, true);
  const double floor_all = r.floor_all_cores.images_per_s();
  json.Key("feedline_python_vs_eighth_scale_floor_all_cores_at_once")
      .Number(floor_all > 0 ? r.feedline_py.images_per_s / floor_all : 0);
  json.Key("eighth_scale_floor_checks_images_per_s").BeginArray();
  for (double f : r.floor_checks) json.Number(f);
  json.EndArray();
  const double peer_mem = double(peer.peak_bytes);
  Ratio(json, "feedline_cpp_memory_vs_peer",
        peer_mem > 0 ? double(r.feedline_cpp.peak_bytes) / peer_mem : 0, kMemoryTarget, false);
  Ratio(json, "feedline_python_memory_vs_peer",
        peer_mem > 0 ? double(r.feedline_py.peak_bytes) / peer_mem : 0, kMemoryTarget, false);
  json.EndObject();
  json.EndObject();
}

void AddComparePlot(const CompareResult& r, SvgFigure& figure) {
  constexpr char kPeer[] = "#d62728", kPeerTrial[] = "#f2a7a7", kPy[] = "#1f77b4",
                 kCpp[] = "#1f4e9c", kLimit[] = "#2ca02c";
  const Contender& peer = r.peer();
  const double limit = r.decode.limit_images_per_s();

  BarPanel rate;
  rate.title = absl::StrFormat("Images/s, %lld images x %d epochs, batch %lld (steady epochs)",
                               static_cast<long long>(r.files), r.options.epochs,
                               static_cast<long long>(r.options.batch_size));
  rate.y_label = "images/s";
  for (size_t i = 0; i < r.peer_trials.size(); ++i) {
    const Contender& t = r.peer_trials[i];
    rate.bars.push_back(BarItem{absl::StrCat("torch, ", t.torch_workers, " w"), t.images_per_s,
                                i == r.peer_best ? kPeer : kPeerTrial, "", ""});
  }
  rate.bars.push_back(BarItem{"feedline (Python)", r.feedline_py.images_per_s, kPy, "", ""});
  rate.bars.push_back(BarItem{"feedline (C++)", r.feedline_cpp.images_per_s, kCpp, "", ""});
  rate.bars.push_back(BarItem{absl::StrCat("full decode x", r.cores), limit, kLimit, "", ""});
  rate.bars.push_back(BarItem{absl::StrCat("1/8-scale decode x", r.cores),
                              r.floor.limit_images_per_s(), kLimit, "", ""});
  rate.levels.push_back(PlotLevel{kPeerTarget * peer.images_per_s, "3x the peer (target)", kPeer});
  rate.levels.push_back(PlotLevel{kDecodeTarget * limit, "0.95x decode limit (target)", kLimit});
  figure.Add(std::move(rate));

  BarPanel cpu;
  cpu.title = "CPU per image (all threads and processes of the contender)";
  cpu.y_label = "CPU ms per image";
  cpu.bars.push_back(BarItem{absl::StrCat("torch, ", peer.torch_workers, " w"),
                             1e3 * peer.cpu_seconds_per_image, kPeer, "", ""});
  cpu.bars.push_back(
      BarItem{"feedline (Python)", 1e3 * r.feedline_py.cpu_seconds_per_image, kPy, "", ""});
  cpu.bars.push_back(
      BarItem{"feedline (C++)", 1e3 * r.feedline_cpp.cpu_seconds_per_image, kCpp, "", ""});
  cpu.bars.push_back(
      BarItem{"one full decode", 1e3 * r.decode.cpu_seconds_per_image(), kLimit, "", ""});
  figure.Add(std::move(cpu));

  BarPanel memory;
  memory.title = "Peak memory (feedline C++: the process; others: summed over the process tree)";
  memory.y_label = "MiB";
  memory.bars.push_back(BarItem{absl::StrCat("torch, ", peer.torch_workers, " w: RSS sum"),
                                double(peer.peak_bytes) / kMiB, kPeer, "", ""});
  if (peer.pss_bytes >= 0) {
    memory.bars.push_back(BarItem{absl::StrCat("torch, ", peer.torch_workers, " w: PSS sum"),
                                  double(peer.pss_bytes) / kMiB, kPeerTrial, "", ""});
  }
  memory.bars.push_back(
      BarItem{"feedline (Python)", double(r.feedline_py.peak_bytes) / kMiB, kPy, "", ""});
  memory.bars.push_back(
      BarItem{"feedline (C++)", double(r.feedline_cpp.peak_bytes) / kMiB, kCpp, "", ""});
  memory.levels.push_back(
      PlotLevel{double(peer.peak_bytes) / kMiB, "the peer's total (at most)", kPeer});
  figure.Add(std::move(memory));

  BarPanel overhead;
  overhead.title = "Pipeline overhead: samples/s with (almost) free reads and decodes";
  overhead.y_label = "samples/s";
  overhead.bars.push_back(BarItem{"measured: tiny JPEGs", r.overhead.samples_per_s, kCpp, "", ""});
  overhead.bars.push_back(BarItem{"estimated pipeline-only",
                                  r.overhead.pipeline_only_samples_per_s(), kPeerTrial, "",
                                  "an estimate: measured CPU per sample minus one thread's "
                                  "read+decode of a tiny file"});
  overhead.levels.push_back(PlotLevel{kPipelineTarget, "target (at least)", kPeer});
  figure.Add(std::move(overhead));
}

}  // namespace feedline::bench
