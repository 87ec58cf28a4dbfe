#include "tune_grid.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "feedline/loader.h"

namespace feedline::bench {
namespace {

constexpr int kWorkers[] = {1, 2, 4};
constexpr int kPrefetch[] = {2, 8};
constexpr int kIoDepth[] = {1, 32};
constexpr double kAutoTarget = 0.95;     // auto's images/s / best fixed
constexpr double kWithinBest = 0.95;     // "within 5% of the best"
constexpr double kCpuTarget = 1.15;      // auto's CPU/image / leanest's, regime (c)
constexpr double kSettleSeconds = 2.0;   // or the first epoch, whichever is longer
constexpr double kConsumerFactor = 2.0;  // (c)'s step: this many times (a)'s best batch time

const char* Verdict(bool met) { return met ? "met" : "NOT met"; }

std::string FormatCores(double c) {
  return c < 0 ? std::string("  n/a") : absl::StrFormat("%5.2f", c);
}

void PrintHeader(const GridRegime& r, const GridOptions& o) {
  std::string what = "local files, the consumer takes each batch at once";
  if (r.key == "b") what = absl::StrFormat("every read takes %.1f ms more", r.io_latency_ms);
  if (r.key == "c") {
    what = absl::StrFormat("a %.1f ms training step per batch of %d", r.consumer_ms, o.batch_size);
  }
  std::printf("\n(%s) %s: %s\n", r.key.c_str(), r.name.c_str(), what.c_str());
  std::printf("  %-14s %10s %11s %7s  %-13s %s\n", "setting", "images/s", "CPU ms/img", "others",
              "ended at", "bottleneck");
  std::fflush(stdout);
}

void PrintConfig(const GridConfig& c, const std::string& label = "") {
  const feedline::Stats& st = c.run.stats;
  std::printf("  %-14s %10.1f %11.3f %7s  %-13s %s\n",
              label.empty() ? c.name().c_str() : label.c_str(), c.run.images_per_s(),
              1e3 * c.run.cpu_seconds_per_image(), FormatCores(c.run.other_cores).c_str(),
              SettingName(st.workers, st.prefetch, st.io_depth).c_str(), st.bottleneck.c_str());
  std::fflush(stdout);
}

absl::StatusOr<WindowResult> RunOne(const GridOptions& o, const GridRegime& r,
                                    const GridConfig& c) {
  feedline::LoaderOptions options(o.data);
  options.batch_size(o.batch_size)
      .seed(o.seed)
      .transform(o.transform)
      .layout(o.layout)
      .workers(c.workers)
      .prefetch(c.prefetch)
      .io_depth(c.io_depth)
      .simulated_read_latency_ms(r.io_latency_ms);
  absl::StatusOr<std::unique_ptr<feedline::Loader>> loader =
      feedline::Loader::Create(std::move(options));
  if (!loader.ok()) return loader.status();
  WindowOptions window;
  window.warmup_batches = o.warmup_batches;
  window.seconds = o.seconds;
  window.consumer_ms = r.consumer_ms;
  return RunWindow(**loader, window);
}

}  // namespace

std::string GridConfig::name() const {
  return is_auto ? "auto" : SettingName(workers, prefetch, io_depth);
}

void GridRegime::Choose() {
  best_fixed = leanest = -1;
  for (size_t i = 1; i < configs.size(); ++i) {
    if (best_fixed < 0 ||
        configs[i].run.images_per_s() > configs[size_t(best_fixed)].run.images_per_s()) {
      best_fixed = int(i);
    }
  }
  if (best_fixed < 0) return;
  const double best = configs[size_t(best_fixed)].run.images_per_s();
  for (size_t i = 1; i < configs.size(); ++i) {
    const WindowResult& run = configs[i].run;
    if (run.images_per_s() < kWithinBest * best) continue;
    if (leanest < 0 ||
        run.cpu_seconds_per_image() < configs[size_t(leanest)].run.cpu_seconds_per_image()) {
      leanest = int(i);
    }
  }
}

namespace {

double Mean(const std::vector<WindowResult>& runs, double (WindowResult::*figure)() const) {
  double sum = 0;
  for (const WindowResult& r : runs) sum += (r.*figure)();
  return runs.empty() ? 0.0 : sum / double(runs.size());
}

}  // namespace

void GridRegime::Evaluate() {
  // Without confirmation rounds, the sweep's own runs.
  if (auto_runs.empty()) auto_runs.push_back(configs[0].run);
  if (best_runs.empty()) best_runs.push_back(configs[size_t(best_fixed)].run);
  if (lean_runs.empty()) lean_runs.push_back(configs[size_t(leanest)].run);
  auto_images_per_s = Mean(auto_runs, &WindowResult::images_per_s);
  best_images_per_s = Mean(best_runs, &WindowResult::images_per_s);
  auto_cpu_per_image = Mean(auto_runs, &WindowResult::cpu_seconds_per_image);
  lean_cpu_per_image = Mean(lean_runs, &WindowResult::cpu_seconds_per_image);
  auto_vs_best = best_images_per_s > 0 ? auto_images_per_s / best_images_per_s : 0;
  auto_cpu_vs_leanest = lean_cpu_per_image > 0 ? auto_cpu_per_image / lean_cpu_per_image : 0;
  // The latest settle against the shortest first epoch: the strictest reading.
  settle_s = 0;
  double first_epoch = -1;
  std::vector<const WindowResult*> all = {&configs[0].run};
  for (const WindowResult& r : auto_runs) all.push_back(&r);
  for (const WindowResult* r : all) {
    if (!r->stats.tuning.empty()) settle_s = std::max(settle_s, r->stats.tuning.back().time_s);
    if (r->first_epoch_s >= 0 && (first_epoch < 0 || r->first_epoch_s < first_epoch)) {
      first_epoch = r->first_epoch_s;
    }
  }
  settle_limit_s = std::max(kSettleSeconds, first_epoch);
}

absl::StatusOr<GridResult> RunTuneGrid(const GridOptions& options) {
  GridResult grid;
  grid.options = options;
  grid.cores = Cores();
  const Clock::time_point start = Clock::now();
  std::printf(
      "feedline-bench --tune-grid: %s, batch size %lld, %d cores; each setting: %d warm-up "
      "batches, then a %.1f s window (\"others\": cores other processes used meanwhile)\n",
      options.data.c_str(), static_cast<long long>(options.batch_size), grid.cores,
      options.warmup_batches, options.seconds);

  const struct {
    const char* key;
    const char* name;
  } kRegimes[] = {{"a", "decode-bound"}, {"b", "slow storage"}, {"c", "slow consumer"}};
  for (const auto& spec : kRegimes) {
    GridRegime r;
    r.key = spec.key;
    r.name = spec.name;
    if (r.key == "b") r.io_latency_ms = options.io_latency_ms;
    if (r.key == "c") {
      r.consumer_ms = options.consumer_ms;
      if (r.consumer_ms <= 0) {
        const GridRegime& a = grid.regimes.front();
        const double best = a.best_images_per_s;
        if (best <= 0) return absl::InternalError("regime (a) delivered nothing");
        const double batch_ms = 1e3 * double(options.batch_size) / best;
        r.consumer_ms = kConsumerFactor * batch_ms;
        std::printf(
            "\nThe training step of (c): %.1f ms per batch, %.0fx the %.1f ms that (a)'s best "
            "setting (%s) takes to deliver one.\n",
            r.consumer_ms, kConsumerFactor, batch_ms,
            a.configs[size_t(a.best_fixed)].name().c_str());
      }
    }
    r.configs.push_back(GridConfig{true, 0, 0, 0, {}});
    for (int w : kWorkers) {
      for (int p : kPrefetch) {
        for (int d : kIoDepth) r.configs.push_back(GridConfig{false, w, p, d, {}});
      }
    }
    PrintHeader(r, options);
    for (GridConfig& c : r.configs) {
      absl::StatusOr<WindowResult> run = RunOne(options, r, c);
      if (!run.ok()) {
        return absl::Status(run.status().code(),
                            absl::StrCat("(", r.key, ") ", c.name(), ": ", run.status().message()));
      }
      c.run = *std::move(run);
      PrintConfig(c);
    }
    r.Choose();
    if (r.best_fixed < 0) return absl::InternalError("no fixed setting ran");
    // Confirmation rounds (see the header): auto, the best, the leanest, interleaved.
    for (int round = 0; round < options.confirm_rounds; ++round) {
      const GridConfig& best = r.configs[size_t(r.best_fixed)];
      const GridConfig& lean = r.configs[size_t(r.leanest)];
      std::vector<std::pair<const GridConfig*, std::vector<WindowResult>*>> order = {
          {&r.configs[0], &r.auto_runs}, {&best, &r.best_runs}};
      if (r.leanest != r.best_fixed) order.push_back({&lean, &r.lean_runs});
      for (auto& [config, runs] : order) {
        absl::StatusOr<WindowResult> run = RunOne(options, r, *config);
        if (!run.ok()) return run.status();
        runs->push_back(*std::move(run));
        GridConfig shown = *config;
        shown.run = runs->back();
        PrintConfig(shown, absl::StrCat(config->name(), " #", round + 2));
      }
    }
    if (r.leanest == r.best_fixed) r.lean_runs = r.best_runs;
    r.Evaluate();
    grid.regimes.push_back(std::move(r));
  }
  grid.seconds = SecondsSince(start);
  return grid;
}

void PrintGridSummary(const GridResult& grid) {
  std::printf(
      "\nSummary (%.0f s in all; means over %d confirmation round(s) after the sweep, which "
      "chose the best and the leanest setting):\n",
      grid.seconds, std::max(1, grid.options.confirm_rounds));
  std::printf("  %-16s %9s %-24s %6s %11s %-26s %8s %7s\n", "regime", "auto i/s",
              "best fixed (i/s)", "ratio", "auto ms/img", "leanest within 5% (ms/img)", "CPU rat",
              "settle");
  for (const GridRegime& r : grid.regimes) {
    const GridConfig& best = r.configs[size_t(r.best_fixed)];
    const GridConfig& lean = r.configs[size_t(r.leanest)];
    std::printf("  %-16s %9.1f %-24s %6.3f %11.3f %-26s %8.3f %6.2fs\n",
                absl::StrCat("(", r.key, ") ", r.name).c_str(), r.auto_images_per_s,
                absl::StrFormat("%s (%.1f)", best.name(), r.best_images_per_s).c_str(),
                r.auto_vs_best, 1e3 * r.auto_cpu_per_image,
                absl::StrFormat("%s (%.3f)", lean.name(), 1e3 * r.lean_cpu_per_image).c_str(),
                r.auto_cpu_vs_leanest, r.settle_s);
  }
  std::printf("\nTargets:\n");
  for (const GridRegime& r : grid.regimes) {
    std::printf("  (%s) auto / best fixed images/s = %.3f (>= %.2f): %s\n", r.key.c_str(),
                r.auto_vs_best, kAutoTarget, Verdict(r.auto_vs_best >= kAutoTarget));
  }
  for (const GridRegime& r : grid.regimes) {
    if (r.key != "c") continue;
    std::printf("  (c) auto / leanest CPU per image = %.3f (<= %.2f): %s\n", r.auto_cpu_vs_leanest,
                kCpuTarget, Verdict(r.auto_cpu_vs_leanest <= kCpuTarget));
  }
  for (const GridRegime& r : grid.regimes) {
    const GridConfig& a = r.configs.front();
    std::printf(
        "  (%s) auto settled at %.2f s (%zu changes; within max(2 s, first epoch %s) = "
        "%.2f s): %s\n",
        r.key.c_str(), r.settle_s, a.run.stats.tuning.size(),
        a.run.first_epoch_s < 0 ? "not finished"
                                : absl::StrFormat("%.2f s", a.run.first_epoch_s).c_str(),
        r.settle_limit_s, Verdict(r.settle_s <= r.settle_limit_s));
  }
  std::fflush(stdout);
}

void WriteGridJson(const GridResult& grid, JsonWriter& json) {
  const GridOptions& o = grid.options;
  json.Key("tune_grid").BeginObject();
  json.Key("batch_size").Integer(o.batch_size);
  json.Key("window_s").Number(o.seconds);
  json.Key("warmup_batches").Integer(o.warmup_batches);
  json.Key("cores").Integer(grid.cores);
  json.Key("seconds").Number(grid.seconds);
  json.Key("regimes").BeginArray();
  for (const GridRegime& r : grid.regimes) {
    const GridConfig& a = r.configs.front();
    const GridConfig& best = r.configs[size_t(r.best_fixed)];
    const GridConfig& lean = r.configs[size_t(r.leanest)];
    json.BeginObject();
    json.Key("regime").String(r.key);
    json.Key("name").String(r.name);
    json.Key("io_latency_ms").Number(r.io_latency_ms);
    json.Key("consumer_ms").Number(r.consumer_ms);
    json.Key("configs").BeginArray();
    for (const GridConfig& c : r.configs) {
      const feedline::Stats& st = c.run.stats;
      json.BeginObject(true);
      json.Key("setting").String(c.name());
      json.Key("auto").Boolean(c.is_auto);
      json.Key("images_per_s").Number(c.run.images_per_s());
      json.Key("cpu_seconds_per_image").Number(c.run.cpu_seconds_per_image());
      json.Key("images").Integer(c.run.images);
      json.Key("decoded").Integer(c.run.decoded);
      json.Key("seconds").Number(c.run.seconds);
      json.Key("other_cores").Number(c.run.other_cores);
      json.Key("workers").Integer(st.workers);
      json.Key("prefetch").Integer(st.prefetch);
      json.Key("io_depth").Integer(st.io_depth);
      json.Key("bottleneck").String(st.bottleneck);
      json.EndObject();
    }
    json.EndArray();
    json.Key("best_fixed").String(best.name());
    json.Key("confirm_rounds").Integer(int64_t(r.auto_runs.size()));
    json.Key("best_fixed_images_per_s").Number(r.best_images_per_s);
    json.Key("auto_images_per_s").Number(r.auto_images_per_s);
    json.Key("auto_vs_best_fixed").Number(r.auto_vs_best);
    json.Key("auto_vs_best_fixed_met").Boolean(r.auto_vs_best >= kAutoTarget);
    json.Key("leanest_within_5pct").String(lean.name());
    json.Key("leanest_cpu_seconds_per_image").Number(r.lean_cpu_per_image);
    json.Key("auto_cpu_seconds_per_image").Number(r.auto_cpu_per_image);
    json.Key("auto_cpu_vs_leanest").Number(r.auto_cpu_vs_leanest);
    if (r.key == "c")
      json.Key("auto_cpu_vs_leanest_met").Boolean(r.auto_cpu_vs_leanest <= kCpuTarget);
    json.Key("auto_first_epoch_s").Number(a.run.first_epoch_s < 0 ? -1 : a.run.first_epoch_s);
    json.Key("auto_settle_s").Number(r.settle_s);
    json.Key("auto_settled_in_time").Boolean(r.settle_s <= r.settle_limit_s);
    json.Key("auto_stats").BeginObject();
    WriteStatsJson(a.run.stats, /*timeline=*/false, json);
    json.EndObject();
    json.Key("auto_confirmation_runs").BeginArray();
    for (const WindowResult& run : r.auto_runs) {
      json.BeginObject();
      json.Key("images_per_s").Number(run.images_per_s());
      json.Key("cpu_seconds_per_image").Number(run.cpu_seconds_per_image());
      json.Key("first_epoch_s").Number(run.first_epoch_s);
      WriteStatsJson(run.stats, /*timeline=*/false, json);
      json.EndObject();
    }
    json.EndArray();
    json.EndObject();
  }
  json.EndArray();
  json.EndObject();
}

void AddGridPlot(const GridResult& grid, SvgFigure& figure) {
  for (const GridRegime& r : grid.regimes) {
    const GridConfig& best = r.configs[size_t(r.best_fixed)];
    BarPanel panel;
    panel.title = absl::StrFormat("(%s) %s: auto %.0f images/s = %.2fx the best fixed (%s)", r.key,
                                  r.name, r.auto_images_per_s, r.auto_vs_best, best.name());
    panel.y_label = "images/s";
    for (size_t i = 0; i < r.configs.size(); ++i) {
      const GridConfig& c = r.configs[i];
      const feedline::Stats& st = c.run.stats;
      BarItem bar;
      bar.label =
          c.is_auto ? absl::StrCat("auto (", SettingName(st.workers, st.prefetch, st.io_depth), ")")
                    : c.name();
      bar.value = c.run.images_per_s();
      bar.color = c.is_auto ? "#ff7f0e" : int(i) == r.best_fixed ? "#1f4e9c" : "#8fb3e0";
      bar.tooltip =
          absl::StrFormat("%s: %.1f images/s, %.3f ms CPU/image, bottleneck %s", bar.label,
                          bar.value, 1e3 * c.run.cpu_seconds_per_image(), st.bottleneck);
      panel.bars.push_back(std::move(bar));
    }
    panel.levels.push_back(
        PlotLevel{kAutoTarget * r.best_images_per_s, "0.95x best fixed (target)", "#d62728"});
    figure.Add(std::move(panel));
  }
  for (const GridRegime& r : grid.regimes) {
    if (r.key != "c") continue;
    const GridConfig& lean = r.configs[size_t(r.leanest)];
    BarPanel panel;
    panel.title = absl::StrFormat(
        "(c) CPU per image: auto = %.2fx the leanest fixed setting within 5%% of the best (%s)",
        r.auto_cpu_vs_leanest, lean.name());
    panel.y_label = "CPU ms per image";
    for (size_t i = 0; i < r.configs.size(); ++i) {
      const GridConfig& c = r.configs[i];
      BarItem bar;
      bar.label = c.name();
      bar.value = 1e3 * c.run.cpu_seconds_per_image();
      bar.color = c.is_auto ? "#ff7f0e" : int(i) == r.leanest ? "#2ca02c" : "#a9d6a0";
      bar.text = absl::StrFormat("%.2f", bar.value);
      panel.bars.push_back(std::move(bar));
    }
    panel.levels.push_back(
        PlotLevel{kCpuTarget * 1e3 * r.lean_cpu_per_image, "1.15x leanest (target)", "#d62728"});
    figure.Add(std::move(panel));
  }
}

}  // namespace feedline::bench
