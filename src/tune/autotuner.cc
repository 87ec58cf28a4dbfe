#include "tune/autotuner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace feedline {
namespace {

// Exponential moving average that starts at the first value.
void Ema(double* avg, double value, double alpha = 0.4) {
  *avg = *avg == 0 ? value : (1 - alpha) * *avg + alpha * value;
}

}  // namespace

Autotuner::Autotuner(TunerLimits limits, TunerSettings initial)
    : limits_(limits), settings_(initial) {}

TunerSettings Autotuner::Update(const TunerSample& s) {
  time_s_ = s.at_s > 0 ? s.at_s : time_s_ + s.interval_s;
  if (s.interval_s <= 0) return settings_;
  // Estimates; an interval without the events leaves an estimate unchanged.
  if (s.mapped > 0) {
    const double busy = s.map_cpu_s > 0 ? s.map_cpu_s : s.map_busy_s;
    Ema(&t_map_, busy / double(s.mapped));
  }
  if (s.reads > 0) Ema(&t_read_, s.read_busy_s / double(s.reads));
  if (s.consumer_cpu_s > 0) Ema(&trainer_, std::min(s.consumer_cpu_s / s.interval_s, 64.0));
  if (const int64_t stepped = s.stepped_samples; stepped > 0) {
    // Over a window of intervals: an interval holds a few steps, and the last one is still
    // running when it ends. A consumer that spends (almost) no time outside Next() would take
    // anything: infinite.
    demand_window_[demand_next_ % kDemandWindow] = {
        stepped, std::max(s.consumer_busy_s, 1e-6 * double(stepped))};
    ++demand_next_;
    int64_t samples = 0;
    double busy = 0;
    for (const auto& [n, b] : demand_window_) {
      samples += n;
      busy += b;
    }
    demand_ = double(samples) / busy;
  }
  const double rate = double(s.samples_consumed) / s.interval_s;
  const double wait_fraction = s.consumer_wait_s / s.interval_s;
  // Smoothed for the decisions a single batch's wait should not make (an interval holds a few
  // batches: one short wait is several % of it).
  wait_ema_ = 0.7 * wait_ema_ + 0.3 * wait_fraction;
  if (settle_ > 0) {
    --settle_;
    return settings_;
  }
  if (probe_.active && StepProbe(s, rate)) return settings_;
  ++steady_;
  if (t_map_ <= 0) return settings_;
  if (demand_ <= 0) {
    // No batch consumed yet (slow storage delays the first one): reads in flight for what the
    // workers could take, with a wide margin (the first samples are the slowest: cold caches,
    // first touches, so the rate is underestimated); the rest waits for the consumer's figures.
    if (limits_.tune_io_depth && t_read_ > 0) {
      const int want = IoDepthFor(double(settings_.workers) / t_map_, kIoStartMargin);
      if (want != settings_.io_depth) {
        TunerSettings next = settings_;
        next.io_depth = want;
        Decide(next, /*settle=*/1, rate,
               absl::StrFormat("io_depth %d->%d (%.2f ms/read, before the first batch)",
                               settings_.io_depth, want, t_read_ * 1e3));
      }
    }
    return settings_;
  }

  TunerSettings next = settings_;
  std::string reason;
  const double capacity_per_worker = 1.0 / t_map_;
  const double max_capacity = capacity_per_worker * limits_.max_workers;
  const double target_rate = std::min(demand_, max_capacity);

  // Lean mode: the consumer is the bottleneck and fewer workers cover its demand without
  // headroom; a deep ring absorbs the jitter instead of a spare worker (a worker costs CPU, a
  // ring slot only memory). Left for good if the consumer starts waiting.
  const double load = target_rate * t_map_;
  bool lean = false;
  if (limits_.tune_workers && limits_.tune_prefetch && !lean_failed_ && demand_ < max_capacity &&
      limits_.max_prefetch >= kLeanPrefetch) {
    lean = std::ceil(load - 1e-9) < std::ceil(load * kHeadroom - 1e-9);
  }
  if (lean_ && wait_ema_ > kStarvedWait) {
    lean_failed_ = true;  // the lean setting starved the consumer: back to headroom
    lean = false;
    reason += "lean mode off (the consumer waited); ";
  }
  lean_ = lean;
  if (lean && settings_.prefetch < kLeanPrefetch) {
    next.prefetch = kLeanPrefetch;
    reason += absl::StrFormat("prefetch %d->%d (lean: a deep ring instead of a spare worker); ",
                              settings_.prefetch, next.prefetch);
  }
  if (limits_.tune_workers) {
    int want = static_cast<int>(std::ceil(load * (lean ? 1.0 : kHeadroom) - 1e-9));
    want = std::clamp(want, 1, limits_.max_workers);
    // A consumer that keeps waiting while workers are all busy needs every core.
    if (wait_fraction > 0.05 && demand_ > max_capacity) want = limits_.max_workers;
    // The trainer's cores (see the header): not given to a worker while the others cover the
    // load; given when they cannot (the loader is the bottleneck), or once the cap starved it.
    const int trainer = TrainerCoresNeeded();
    const int leave = limits_.max_workers - trainer;
    if (capped_for_trainer_ && settings_.workers <= leave && wait_ema_ > kStarvedWait) {
      trainer_cap_failed_ = true;
      reason += "the trainer's core given to a worker (the consumer waited); ";
    }
    capped_for_trainer_ = false;
    trainer_reason_.clear();
    if (trainer > 0 && want <= leave) {
      trainer_reason_ = absl::StrFormat(
          "the trainer's thread uses %.2f cores; the demand needs %d workers (%.2f cores of "
          "work)", trainer_, want, load);
    } else if (trainer > 0 && leave >= 1) {
      if (!trainer_cap_failed_ && load <= double(leave)) {
        want = leave;
        capped_for_trainer_ = true;
        trainer_reason_ = absl::StrFormat(
            "the trainer's thread uses %.2f cores; %d workers cover the demand (%.2f cores of "
            "work)", trainer_, leave, load);
      } else if (trainer_cap_failed_) {
        trainer_reason_ = absl::StrFormat(
            "none: the trainer's thread uses %.2f cores, but with %d workers it waited: the "
            "loader takes what is left",
            trainer_, leave);
      } else {
        trainer_reason_ = absl::StrFormat(
            "none: the trainer's thread uses %.2f cores, but %d workers cannot feed it (%.2f "
            "cores of work): the loader is the bottleneck and takes what is left",
            trainer_, leave, load);
      }
    }
    // Up only for a real shortfall: when the model is at most kUpDeadBand short and the
    // consumer does not wait, the ring covers it (the estimates move by a few % from interval
    // to interval, and a controller that follows them flips a worker on and off).
    const bool waiting = wait_ema_ > kStarvedWait;
    if (want > settings_.workers && !waiting &&
        load <= double(settings_.workers) * (1 + kUpDeadBand)) {
      want = settings_.workers;
    }
    if (want > settings_.workers) {
      next.workers = want;
      if (waiting && demand_ < max_capacity) {
        // Fewer workers than the headroom asks for starved the consumer: headroom from now on,
        // no more probes at this demand.
        lean_failed_ = true;
        lean = lean_ = false;
        probe_failed_demand_ = demand_;
      }
    } else if (want < settings_.workers) {
      next.workers = settings_.workers - 1;  // down one at a time
    }
    if (next.workers != settings_.workers) {
      reason +=
          absl::StrFormat("workers %d->%d (demand %.0f samples/s, %.2f ms per sample); ",
                          settings_.workers, next.workers, std::min(demand_, 1e9), t_map_ * 1e3);
    }
  }
  if (limits_.tune_io_depth && t_read_ > 0) {
    int want = IoDepthFor(std::min(demand_, capacity_per_worker * next.workers), kIoRaiseMargin);
    // Up only when reads hold the workers back. Workers busy (nearly) all the time have their
    // reads: more in flight would only wait, and lengthen the measured latency, and so ask for
    // more again (Little's law on a latency that holds its own queueing; with capacity from the
    // workers' CPU time, above what they deliver on shared cores, each step asked for more:
    // 48 -> 94 -> 171 -> 256 over nginx + 20 ms).
    const double workers_busy = s.map_busy_s / (double(settings_.workers) * s.interval_s);
    if (want > settings_.io_depth && workers_busy >= kWorkersFed) want = settings_.io_depth;
    if (want != settings_.io_depth) {
      next.io_depth = want;
      reason += absl::StrFormat("io_depth %d->%d (%.2f ms/read); ", settings_.io_depth, want,
                                t_read_ * 1e3);
    }
  }
  if (limits_.tune_prefetch && wait_ema_ > 0.02 &&
      capacity_per_worker * next.workers >= std::min(demand_, max_capacity) * 1.05 &&
      settings_.prefetch < limits_.max_prefetch) {
    // Production keeps up on average but the consumer still waits: absorb the jitter.
    next.prefetch = settings_.prefetch + 1;
    reason += absl::StrFormat("prefetch %d->%d (consumer waited %.0f%%, smoothed); ",
                              settings_.prefetch, next.prefetch, wait_ema_ * 100);
  }
  if (limits_.tune_prefetch && wait_fraction > 0.05 && demand_ > max_capacity) {
    // Map-bound: every core maps; a ring a few batches deep keeps them busy across batch
    // boundaries and the consumer's jitter (measured: 0.94x of the best fixed setting with 2).
    const int want = std::min(limits_.max_prefetch, 2 * next.workers + 2);
    if (want > settings_.prefetch) {
      next.prefetch = want;
      reason +=
          absl::StrFormat("prefetch %d->%d (map-bound: a deeper ring); ", settings_.prefetch, want);
    }
  }
  if (next.prefetch > limits_.max_prefetch) next.prefetch = std::max(1, limits_.max_prefetch);

  // Probe one worker fewer (see the header): the consumer is the bottleneck and covered, the
  // model keeps w, and w - 1 is within reach at the cost measured with w.
  const bool probe_allowed = probe_failed_demand_ == 0 || demand_ < 0.85 * probe_failed_demand_;
  // Not before the estimates have had kProbeAfter intervals at the current settings (the first
  // ones carry the start: threads, first touches of ring slots).
  if (next == settings_ && limits_.tune_workers && limits_.tune_prefetch && !lean_failed_ &&
      probe_allowed && steady_ >= kProbeAfter && settings_.workers > 1 && demand_ < max_capacity &&
      wait_fraction <= 0.02 && load <= kProbeReach * (settings_.workers - 1) &&
      limits_.max_prefetch >= kLeanPrefetch) {
    probe_ = Probe{};
    probe_.active = true;
    probe_.from_workers = settings_.workers;
    probe_.t_map_from = t_map_;
    next.workers = settings_.workers - 1;
    next.prefetch = std::max(settings_.prefetch, kLeanPrefetch);
    reason = absl::StrFormat(
        "probe: workers %d->%d%s (demand %.0f samples/s needs %.2f workers at %.2f ms/img measured "
        "with %d; measuring with fewer); ",
        settings_.workers, next.workers,
        next.prefetch == settings_.prefetch
            ? ""
            : absl::StrFormat(", prefetch %d->%d", settings_.prefetch, next.prefetch),
        demand_, load, t_map_ * 1e3, settings_.workers);
  }

  if (!(next == settings_)) {
    if (!reason.empty()) reason.resize(reason.size() - 2);
    Decide(next, /*settle=*/1, rate, std::move(reason));
  }
  return settings_;
}

int Autotuner::IoDepthFor(double rate, double raise_margin) const {
  // Little's law: reads in flight = rate x read time, with headroom, plus one.
  int want = static_cast<int>(std::ceil(rate * t_read_ * kHeadroom)) + 1;
  want = std::clamp(want, 1, limits_.max_io_depth);
  // Straight up and past the estimate (kIoRaiseMargin: the estimate grows as the workers warm
  // up, so one raise covers it rather than a step every few seconds); halfway down; never for
  // less than the dead band. Down is not skipped: reads in flight are not free (over HTTP each
  // is a connection, a buffer and the client's CPU: nginx + 20 ms on 2 cores, 112 in flight
  // gave 2% fewer samples/s than 64-80), and the first estimates run high (cold connections,
  // queueing behind the raise itself), which left the depth stuck at the raise (a halved
  // decrease was inside the dead band unless the model asked for under half).
  const int now = settings_.io_depth;
  if (want < now) {
    if (now - want <= kIoDeadBand * now) return now;
    return (now + want + 1) / 2;
  }
  const bool outside_band = want - now > kIoDeadBand * now || (now <= 2 && want > now);
  if (!outside_band) return now;
  return std::min(limits_.max_io_depth, static_cast<int>(std::ceil(want * raise_margin)));
}

bool Autotuner::StepProbe(const TunerSample& s, double rate) {
  Probe& p = probe_;
  ++p.measured;
  p.mapped += s.mapped;
  p.map_s += s.map_cpu_s > 0 ? s.map_cpu_s : s.map_busy_s;
  p.wait_s += s.consumer_wait_s;
  p.interval_s += s.interval_s;
  const double wait_fraction = p.wait_s / std::max(1e-9, p.interval_s);
  const bool starved = wait_fraction > kStarvedWait;
  if (!starved && p.measured < kProbeIntervals) return true;
  p.active = false;
  const int fewer = settings_.workers;
  TunerSettings next = settings_;
  int settle = 1;
  const double t = p.mapped > 0 ? p.map_s / double(p.mapped) : 0;
  const double need = demand_ * t;  // workers needed at the cost measured with `fewer`
  std::string reason;
  if (!starved && t > 0 && need <= double(fewer) * (1 + kProbeTolerance)) {
    t_map_ = t;  // the cost with fewer workers
    reason = absl::StrFormat(
        "probe kept workers %d (%.2f ms/img with %d instead of %.2f with %d: demand %.0f samples/s "
        "needs %.2f workers; the consumer waited %.1f%%)",
        fewer, t * 1e3, fewer, p.t_map_from * 1e3, p.from_workers, demand_, need,
        100 * wait_fraction);
  } else {
    probe_failed_demand_ = demand_;
    lean_failed_ = true;  // w - 1 without headroom is what just failed
    t_map_ = p.t_map_from;
    next.workers = p.from_workers;
    settle = 3;  // the ring refills: the waits the probe caused are not jitter to absorb
    reason = absl::StrFormat(
        "probe undone: workers %d->%d (with %d: %.2f ms/img, demand %.0f samples/s needs %.2f "
        "workers; the consumer waited %.1f%%)",
        fewer, p.from_workers, fewer, t * 1e3, demand_, need, 100 * wait_fraction);
  }
  wait_ema_ = 0;  // the probe's waits say nothing about the setting now
  Decide(next, settle, rate, std::move(reason));
  return true;
}

void Autotuner::Decide(const TunerSettings& next, int settle, double rate, std::string reason) {
  settings_ = next;
  settle_ = settle;
  steady_ = 0;
  if (decisions_.size() < kMaxDecisions) {
    decisions_.push_back(TunerDecision{time_s_, settings_, rate, std::move(reason)});
  }
}

void Autotuner::Fix(Knob knob, int value) {
  if (probe_.active) {
    settings_.workers = probe_.from_workers;
    t_map_ = probe_.t_map_from;
    probe_.active = false;
  }
  switch (knob) {
    case Knob::kWorkers:
      limits_.tune_workers = false;
      settings_.workers = value;
      break;
    case Knob::kIoDepth:
      limits_.tune_io_depth = false;
      settings_.io_depth = value;
      break;
    case Knob::kPrefetch:
      limits_.tune_prefetch = false;
      settings_.prefetch = value;
      break;
  }
}

}  // namespace feedline
