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
    // A consumer that spends (almost) no time outside Next() would take anything: infinite.
    const double busy = std::max(s.consumer_busy_s, 1e-6 * double(s.images_consumed));
    Ema(&demand_, double(s.images_consumed) / busy);
  }
  const double rate = double(s.images_consumed) / s.interval_s;
  const double wait_fraction = s.consumer_wait_s / s.interval_s;
  if (settle_ > 0) {
    --settle_;
    return settings_;
  }
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

void Autotuner::Fix(Knob knob, int value) {
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
