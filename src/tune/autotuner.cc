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
  if (s.decoded > 0) {
    const double busy = s.decode_cpu_s > 0 ? s.decode_cpu_s : s.decode_busy_s;
    Ema(&t_decode_, busy / double(s.decoded));
  }
  if (s.reads > 0) Ema(&t_read_, s.read_busy_s / double(s.reads));
  if (s.images_consumed > 0) {
    // Over a window of intervals, not per interval: an interval holds a few batches, and its
    // edges cut steps from the batches they belong to (+-30% per interval at 3 batches).
    // A consumer that spends (almost) no time outside Next() would take anything: infinite.
    demand_window_[demand_next_ % kDemandWindow] = {
        s.images_consumed, std::max(s.consumer_busy_s, 1e-6 * double(s.images_consumed))};
    ++demand_next_;
    int64_t images = 0;
    double busy = 0;
    for (const auto& [n, b] : demand_window_) {
      images += n;
      busy += b;
    }
    demand_ = double(images) / busy;
  }
  const double rate = double(s.images_consumed) / s.interval_s;
  const double wait_fraction = s.consumer_wait_s / s.interval_s;
  if (settle_ > 0) {
    --settle_;
    return settings_;
  }
  if (probe_.active && StepProbe(s, rate)) return settings_;
  if (t_decode_ <= 0 || demand_ <= 0) return settings_;

  TunerSettings next = settings_;
  std::string reason;
  const double capacity_per_worker = 1.0 / t_decode_;
  const double max_capacity = capacity_per_worker * limits_.max_workers;
  const double target_rate = std::min(demand_, max_capacity);

  // Lean mode: the consumer is the bottleneck and fewer workers cover its demand without
  // headroom; a deep ring absorbs the jitter instead of a spare worker (a worker costs CPU, a
  // ring slot only memory). Left for good if the consumer starts waiting.
  const double load = target_rate * t_decode_;
  bool lean = false;
  if (limits_.tune_workers && limits_.tune_prefetch && !lean_failed_ && demand_ < max_capacity &&
      limits_.max_prefetch >= kLeanPrefetch) {
    lean = std::ceil(load - 1e-9) < std::ceil(load * kHeadroom - 1e-9);
  }
  if (lean_ && wait_fraction > 0.05) {
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
    // A consumer that keeps waiting while decoders are all busy needs every core.
    if (wait_fraction > 0.05 && demand_ > max_capacity) want = limits_.max_workers;
    if (want > settings_.workers) {
      next.workers = want;
    } else if (want < settings_.workers) {
      next.workers = settings_.workers - 1;  // down one at a time
    }
    if (next.workers != settings_.workers) {
      reason +=
          absl::StrFormat("workers %d->%d (demand %.0f img/s, %.2f ms decode/img); ",
                          settings_.workers, next.workers, std::min(demand_, 1e9), t_decode_ * 1e3);
    }
  }
  if (limits_.tune_io_depth && t_read_ > 0) {
    const double rate_for_io = std::min(demand_, capacity_per_worker * next.workers);
    int want = static_cast<int>(std::ceil(rate_for_io * t_read_ * kHeadroom)) + 1;
    want = std::clamp(want, 1, limits_.max_io_depth);
    // Move halfway down (reads are cheap to keep in flight), straight up; never for less than
    // the dead band.
    if (want < settings_.io_depth) want = std::max(want, (settings_.io_depth + want + 1) / 2);
    const bool outside_band =
        std::abs(want - settings_.io_depth) > kIoDeadBand * settings_.io_depth ||
        (settings_.io_depth <= 2 && want > settings_.io_depth);
    if (want != settings_.io_depth && outside_band) {
      next.io_depth = want;
      reason += absl::StrFormat("io_depth %d->%d (%.2f ms/read); ", settings_.io_depth, want,
                                t_read_ * 1e3);
    }
  }
  if (limits_.tune_prefetch && wait_fraction > 0.02 &&
      capacity_per_worker * next.workers >= std::min(demand_, max_capacity) * 1.05 &&
      settings_.prefetch < limits_.max_prefetch) {
    // Production keeps up on average but the consumer still waits: absorb the jitter.
    next.prefetch = settings_.prefetch + 1;
    reason += absl::StrFormat("prefetch %d->%d (consumer waited %.0f%%); ", settings_.prefetch,
                              next.prefetch, wait_fraction * 100);
  }
  if (limits_.tune_prefetch && wait_fraction > 0.05 && demand_ > max_capacity) {
    // Decode-bound: every core decodes; a ring a few batches deep keeps them busy across batch
    // boundaries and the consumer's jitter (measured: 0.94x of the best fixed setting with 2).
    const int want = std::min(limits_.max_prefetch, 2 * next.workers + 2);
    if (want > settings_.prefetch) {
      next.prefetch = want;
      reason += absl::StrFormat("prefetch %d->%d (decode-bound: a deeper ring); ",
                                settings_.prefetch, want);
    }
  }
  if (next.prefetch > limits_.max_prefetch) next.prefetch = std::max(1, limits_.max_prefetch);

  // Probe one worker fewer (see the header): the consumer is the bottleneck and covered, the
  // model keeps w, and w - 1 is within reach at the cost measured with w.
  const bool probe_allowed = probe_failed_demand_ == 0 || demand_ < 0.85 * probe_failed_demand_;
  if (next == settings_ && limits_.tune_workers && limits_.tune_prefetch && !lean_failed_ &&
      probe_allowed && settings_.workers > 1 && demand_ < max_capacity && wait_fraction <= 0.02 &&
      load <= kProbeReach * (settings_.workers - 1) && limits_.max_prefetch >= kLeanPrefetch) {
    probe_ = Probe{};
    probe_.active = true;
    probe_.from_workers = settings_.workers;
    probe_.t_decode_from = t_decode_;
    next.workers = settings_.workers - 1;
    next.prefetch = std::max(settings_.prefetch, kLeanPrefetch);
    reason = absl::StrFormat(
        "probe: workers %d->%d%s (demand %.0f img/s needs %.2f workers at %.2f ms/img measured "
        "with %d; measuring with fewer); ",
        settings_.workers, next.workers,
        next.prefetch == settings_.prefetch
            ? ""
            : absl::StrFormat(", prefetch %d->%d", settings_.prefetch, next.prefetch),
        demand_, load, t_decode_ * 1e3, settings_.workers);
  }

  if (!(next == settings_)) {
    settings_ = next;
    settle_ = 1;
    if (!reason.empty()) reason.resize(reason.size() - 2);
    if (decisions_.size() < kMaxDecisions) {
      decisions_.push_back(TunerDecision{time_s_, settings_, rate, reason});
    }
  }
  return settings_;
}

bool Autotuner::StepProbe(const TunerSample& s, double rate) {
  Probe& p = probe_;
  ++p.measured;
  p.decoded += s.decoded;
  p.decode_s += s.decode_cpu_s > 0 ? s.decode_cpu_s : s.decode_busy_s;
  p.wait_s += s.consumer_wait_s;
  p.interval_s += s.interval_s;
  const double wait_fraction = p.wait_s / std::max(1e-9, p.interval_s);
  const bool starved = wait_fraction > kProbeTolerance;
  if (!starved && p.measured < kProbeIntervals) return true;
  p.active = false;
  const int fewer = settings_.workers;
  const double t = p.decoded > 0 ? p.decode_s / double(p.decoded) : 0;
  const double need = demand_ * t;  // workers needed at the cost measured with `fewer`
  std::string reason;
  if (!starved && t > 0 && need <= double(fewer) * (1 + kProbeTolerance)) {
    t_decode_ = t;  // the cost with fewer decoders
    reason = absl::StrFormat(
        "probe kept workers %d (%.2f ms/img with %d instead of %.2f with %d: demand %.0f img/s "
        "needs %.2f workers; the consumer waited %.1f%%)",
        fewer, t * 1e3, fewer, p.t_decode_from * 1e3, p.from_workers, demand_, need,
        100 * wait_fraction);
  } else {
    probe_failed_demand_ = demand_;
    t_decode_ = p.t_decode_from;
    settings_.workers = p.from_workers;
    settle_ = 2;  // the waits the probe caused are not jitter for the ring to absorb
    reason = absl::StrFormat(
        "probe undone: workers %d->%d (with %d: %.2f ms/img, demand %.0f img/s needs %.2f "
        "workers; the consumer waited %.1f%%)",
        fewer, p.from_workers, fewer, t * 1e3, demand_, need, 100 * wait_fraction);
  }
  settle_ = std::max(settle_, 1);
  if (decisions_.size() < kMaxDecisions) {
    decisions_.push_back(TunerDecision{time_s_, settings_, rate, reason});
  }
  return true;
}

void Autotuner::Fix(Knob knob, int value) {
  if (probe_.active) {
    settings_.workers = probe_.from_workers;
    t_decode_ = probe_.t_decode_from;
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
