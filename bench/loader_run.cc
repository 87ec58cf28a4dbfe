#include "loader_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace feedline::bench {
namespace {

// The simulated training step: the consumer holds the batch and sleeps (a GPU step mostly
// waits for the device, leaving the CPU to the loader).
void TrainingStep(double consumer_ms) {
  if (consumer_ms > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(consumer_ms));
  }
}

// Cores other processes used over a span: machine busy time minus ours, per second.
double OtherCores(double machine_busy_delta, double cpu_delta, double seconds) {
  if (machine_busy_delta < 0 || seconds <= 0) return -1;
  return std::max(0.0, machine_busy_delta - cpu_delta) / seconds;
}

// Images the decoders have finished so far.
int64_t DecodedImages(const feedline::Stats& stats) {
  for (const feedline::StageStats& s : stats.stages) {
    if (s.name == "map") return s.items;
  }
  return 0;
}

}  // namespace

void BatchChecksum::Add(const feedline::Batch& batch) {
  // Only host memory is read: with --device cuda the image and label fields are device
  // pointers (dereferencing them crashes), so those batches mix their host-side indices only.
  const feedline::TensorView image = batch.field("image");
  const int64_t bytes = image.bytes();
  const auto* images = static_cast<const uint8_t*>(image.data);
  if (bytes > 0 && images != nullptr && image.device < 0) {
    constexpr int kProbes = 16;
    for (int i = 0; i < kProbes; ++i) Mix(images[(bytes - 1) * i / (kProbes - 1)]);
  }
  const feedline::TensorView label = batch.field("label");
  const auto* labels = static_cast<const int64_t*>(label.data);
  if (batch.size() > 0 && labels != nullptr && label.device < 0) {
    Mix(static_cast<uint64_t>(labels[0]));
    Mix(static_cast<uint64_t>(labels[batch.size() - 1]));
  }
  if (batch.size() > 0 && batch.indices() != nullptr) {
    Mix(static_cast<uint64_t>(batch.indices()[0]));
  }
}

void BatchChecksum::Mix(uint64_t v) {
  for (int i = 0; i < 8; ++i) hash_ = (hash_ ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001B3ULL;
}

absl::StatusOr<EpochRunResult> RunEpochs(feedline::Loader& loader, const EpochRunOptions& options) {
  EpochRunResult result;
  ProgressLine progress(options.progress);
  BatchChecksum checksum;
  const Clock::time_point run_start = Clock::now();
  std::vector<double> machine_busy;  // at each epoch's start, and at the end
  for (int e = 0; e < options.epochs; ++e) {
    machine_busy.push_back(MachineBusySeconds());
    const double cpu_start = CpuSeconds();
    const Clock::time_point start = Clock::now();
    std::unique_ptr<feedline::Epoch> epoch = loader.StartEpoch();
    EpochFigures figures;
    figures.epoch = epoch->epoch();
    figures.start_s = std::chrono::duration<double>(start - run_start).count();
    int64_t batches = 0;
    while (true) {
      absl::StatusOr<feedline::Batch> batch = epoch->Next();
      if (absl::IsOutOfRange(batch.status())) break;
      if (!batch.ok()) {
        progress.Clear();
        return batch.status();
      }
      checksum.Add(*batch);
      figures.images += batch->size();
      ++batches;
      TrainingStep(options.consumer_ms);
      const double elapsed = SecondsSince(start);
      progress.Show(absl::StrCat(options.label, "epoch ", e + 1, "/", options.epochs, "  batch ",
                                 batches, "/", epoch->num_batches(), "  ",
                                 int64_t(elapsed > 0 ? double(figures.images) / elapsed : 0),
                                 " images/s"));
    }
    figures.seconds = SecondsSince(start);
    figures.cpu_seconds = CpuSeconds() - cpu_start;
    progress.Clear();
    if (options.print_epochs) {
      std::printf("%sepoch %lld: %lld images in %.2f s: %.1f images/s, %.3f ms CPU/image\n",
                  options.label.c_str(), static_cast<long long>(figures.epoch),
                  static_cast<long long>(figures.images), figures.seconds, figures.images_per_s(),
                  figures.images > 0 ? 1e3 * figures.cpu_seconds / double(figures.images) : 0.0);
      std::fflush(stdout);
    }
    result.epochs.push_back(figures);
  }
  machine_busy.push_back(MachineBusySeconds());

  result.first_steady_epoch = result.epochs.size() > 1 ? 1 : 0;
  int64_t images = 0;
  double seconds = 0, cpu_seconds = 0;
  for (size_t i = size_t(result.first_steady_epoch); i < result.epochs.size(); ++i) {
    images += result.epochs[i].images;
    seconds += result.epochs[i].seconds;
    cpu_seconds += result.epochs[i].cpu_seconds;
  }
  // Total images over total time (not the mean of the epochs' rates, which would overweight
  // short epochs).
  result.images_per_s = seconds > 0 ? double(images) / seconds : 0;
  result.cpu_seconds_per_image = images > 0 ? cpu_seconds / double(images) : 0;
  const double first = machine_busy[size_t(result.first_steady_epoch)];
  result.other_cores =
      first < 0 ? -1 : OtherCores(machine_busy.back() - first, cpu_seconds, seconds);
  result.checksum = checksum.value();
  result.stats = loader.stats();
  return result;
}

absl::StatusOr<WindowResult> RunWindow(feedline::Loader& loader, const WindowOptions& options) {
  WindowResult result;
  const Clock::time_point start = Clock::now();
  Clock::time_point window_start, last;
  double cpu_start = 0, cpu_last = 0, busy_start = 0, busy_last = 0;
  int64_t batches = 0;
  bool open = options.warmup_batches <= 0;
  if (open) {
    window_start = last = start;
    cpu_start = cpu_last = CpuSeconds();
    busy_start = busy_last = MachineBusySeconds();
  }
  int64_t decoded_start = 0;
  bool done = false;
  for (int e = 0; !done; ++e) {
    std::unique_ptr<feedline::Epoch> epoch = loader.StartEpoch();
    while (!done) {
      absl::StatusOr<feedline::Batch> batch = epoch->Next();
      if (absl::IsOutOfRange(batch.status())) break;
      if (!batch.ok()) return batch.status();
      const Clock::time_point now = Clock::now();
      ++batches;
      if (open) {
        result.images += batch->size();
        last = now;
        cpu_last = CpuSeconds();
        busy_last = MachineBusySeconds();
        done = std::chrono::duration<double>(now - window_start).count() >= options.seconds;
        if (done) result.stats = loader.stats();
      } else if (batches == options.warmup_batches) {
        open = true;
        window_start = last = now;
        cpu_start = cpu_last = CpuSeconds();
        busy_start = busy_last = MachineBusySeconds();
        decoded_start = DecodedImages(loader.stats());
        result.warmup_s = std::chrono::duration<double>(now - start).count();
      }
      if (!done) TrainingStep(options.consumer_ms);
    }
    if (e == 0 && !done) result.first_epoch_s = SecondsSince(start);
  }
  result.seconds = std::chrono::duration<double>(last - window_start).count();
  result.cpu_seconds = cpu_last - cpu_start;
  result.other_cores =
      busy_start < 0 ? -1 : OtherCores(busy_last - busy_start, result.cpu_seconds, result.seconds);
  result.decoded = DecodedImages(result.stats) - decoded_start;
  return result;
}

std::string SettingName(int workers, int prefetch, int io_depth) {
  return absl::StrCat("w", workers, " p", prefetch, " d", io_depth);
}

void WriteStatsJson(const feedline::Stats& st, bool timeline, JsonWriter& json) {
  json.Key("workers").Integer(st.workers);
  json.Key("prefetch").Integer(st.prefetch);
  json.Key("io_depth").Integer(st.io_depth);
  json.Key("auto").BeginObject(true);
  json.Key("workers").Boolean(st.auto_workers);
  json.Key("prefetch").Boolean(st.auto_prefetch);
  json.Key("io_depth").Boolean(st.auto_io_depth);
  json.EndObject();
  json.Key("bottleneck").String(st.bottleneck);
  json.Key("bottleneck_reason").String(st.bottleneck_reason);
  json.Key("consumer_wait_fraction").Number(st.consumer_wait_fraction);
  json.Key("epoch_start_wait_s").Number(st.epoch_start_wait_s);
  json.Key("decode_ms_per_image").Number(st.map_ms_per_sample);
  json.Key("read_ms").Number(st.read_ms);
  json.Key("bytes_in_use").Integer(st.bytes_in_use);
  json.Key("memory_budget").Integer(st.memory_budget);
  json.Key("errors").Integer(st.error_count);
  json.Key("stages").BeginArray();
  for (const feedline::StageStats& s : st.stages) {
    json.BeginObject(true);
    json.Key("name").String(s.name);
    json.Key("busy_s").Number(s.busy_s);
    json.Key("wait_s").Number(s.wait_s);
    json.Key("items").Integer(s.items);
    json.Key("threads").Integer(s.threads);
    json.Key("occupancy").Number(s.occupancy);
    json.EndObject();
  }
  json.EndArray();
  // The tuner has settled when it made its last change.
  json.Key("settle_s").Number(st.tuning.empty() ? 0.0 : st.tuning.back().time_s);
  json.Key("tuning").BeginArray();
  for (const feedline::TuningEvent& t : st.tuning) {
    json.BeginObject(true);
    json.Key("time_s").Number(t.time_s);
    json.Key("workers").Integer(t.workers);
    json.Key("io_depth").Integer(t.io_depth);
    json.Key("prefetch").Integer(t.prefetch);
    json.Key("images_per_s").Number(t.samples_per_s);
    json.Key("reason").String(t.reason);
    json.EndObject();
  }
  json.EndArray();
  if (timeline) {
    json.Key("timeline").BeginArray();
    for (const feedline::TimelinePoint& p : st.timeline) {
      json.BeginObject(true);
      json.Key("time_s").Number(p.time_s);
      json.Key("images_per_s").Number(p.samples_per_s);
      json.Key("consumer_wait_fraction").Number(p.consumer_wait_fraction);
      json.Key("workers").Integer(p.workers);
      json.Key("io_depth").Integer(p.io_depth);
      json.Key("prefetch").Integer(p.prefetch);
      json.Key("bytes_in_use").Integer(p.bytes_in_use);
      json.EndObject();
    }
    json.EndArray();
  }
}

void PrintTuning(const feedline::Stats& st, size_t max_lines) {
  if (st.tuning.empty()) {
    std::printf("tuning:          no changes%s\n",
                st.auto_workers || st.auto_prefetch || st.auto_io_depth
                    ? " (the starting settings held)"
                    : " (every setting fixed)");
    return;
  }
  std::printf("tuning:          %zu changes, the last at %.2f s\n", st.tuning.size(),
              st.tuning.back().time_s);
  const size_t first = st.tuning.size() > max_lines ? st.tuning.size() - max_lines : 0;
  if (first > 0) std::printf("  (%zu earlier changes left out)\n", first);
  for (size_t i = first; i < st.tuning.size(); ++i) {
    const feedline::TuningEvent& t = st.tuning[i];
    std::printf("  %7.2f s  %-12s at %7.1f images/s: %s\n", t.time_s,
                SettingName(t.workers, t.prefetch, t.io_depth).c_str(), t.samples_per_s,
                t.reason.c_str());
  }
}

void AddTimelinePlot(const feedline::Stats& st, const std::vector<EpochFigures>& epochs,
                     SvgFigure& figure) {
  constexpr char kTuneColor[] = "#ff7f0e";
  constexpr char kEpochColor[] = "#9a9a9a";
  std::vector<PlotMarker> markers;
  for (const EpochFigures& e : epochs) {
    markers.push_back(PlotMarker{e.start_s,
                                 absl::StrFormat("epoch %d starts at %.2f s", e.epoch, e.start_s),
                                 kEpochColor, true, absl::StrCat("epoch ", e.epoch)});
  }
  for (const feedline::TuningEvent& t : st.tuning) {
    markers.push_back(PlotMarker{
        t.time_s,
        absl::StrFormat("%.2f s: %s (at %.0f images/s): %s", t.time_s,
                        SettingName(t.workers, t.prefetch, t.io_depth), t.samples_per_s, t.reason),
        kTuneColor, false, ""});
  }
  const std::vector<std::pair<std::string, std::string>> marker_legend = {
      {kEpochColor, "epoch start"}, {kTuneColor, "tuning event (hover)"}};

  std::vector<double> t, rate, wait, workers, prefetch, io_depth;
  for (const feedline::TimelinePoint& p : st.timeline) {
    t.push_back(p.time_s);
    rate.push_back(p.samples_per_s);
    wait.push_back(100 * p.consumer_wait_fraction);
    workers.push_back(p.workers);
    prefetch.push_back(p.prefetch);
    io_depth.push_back(p.io_depth);
  }
  const std::string x_label = "time since the first epoch started (s)";
  LinePanel throughput;
  throughput.title = "Throughput (sampled every tuning interval)";
  throughput.x_label = x_label;
  throughput.y_label = "images/s";
  throughput.series.push_back(PlotSeries{"images/s delivered", "#1f77b4", t, rate});
  throughput.markers = markers;
  throughput.marker_legend = marker_legend;
  figure.Add(std::move(throughput));

  LinePanel starved;
  starved.title = "Consumer starved (time it waited for a batch)";
  starved.x_label = x_label;
  starved.y_label = "% of the interval";
  starved.series.push_back(PlotSeries{"consumer waiting", "#d62728", t, wait});
  starved.markers = markers;
  starved.marker_legend = marker_legend;
  figure.Add(std::move(starved));

  LinePanel settings;
  settings.title = "Tuner's settings: decoder threads and ring depth";
  settings.x_label = x_label;
  settings.y_label = "count";
  settings.integer_y = true;
  settings.series.push_back(PlotSeries{"workers (decoders)", "#2ca02c", t, workers, true});
  settings.series.push_back(
      PlotSeries{"prefetch (batches)", "#9467bd", t, prefetch, true, /*dashed=*/true});
  settings.markers = markers;
  settings.marker_legend = marker_legend;
  figure.Add(std::move(settings));

  LinePanel reads;
  reads.title = "Tuner's settings: reads in flight";
  reads.x_label = x_label;
  reads.y_label = "count";
  reads.integer_y = true;
  reads.series.push_back(PlotSeries{"io_depth (reads)", "#8c564b", t, io_depth, true});
  reads.markers = std::move(markers);
  reads.marker_legend = marker_legend;
  figure.Add(std::move(reads));
}

}  // namespace feedline::bench
